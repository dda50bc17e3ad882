//! Keys expire exactly when their state answers as an empty one.

use super::batches::clear;
use super::*;

/// Checks that `key` expires in `expected` ms: PTTL is read after the call
/// returned, so it is at most `expected` and at least `expected` less the
/// whole milliseconds that passed since just before the call.
pub(super) fn assert_ttl(
    connection: &mut redis::Connection,
    key: &str,
    expected: i64,
    since: Instant,
) {
    let ttl: i64 = redis::cmd("PTTL").arg(key).query(connection).unwrap();
    let passed = since.elapsed().as_millis() as i64 + 1;
    assert!(
        ttl <= expected && ttl >= expected - passed,
        "{key}: PTTL {ttl}, expected {expected} (less at most {passed} ms that passed)"
    );
}

/// A policy, its limit and window, the calls as (allow?, now), and the TTL
/// in milliseconds after the last one.
pub(super) type TtlCase = (PolicyKind, u64, u64, &'static [(bool, u64)], i64);

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn keys_expire_exactly_when_the_state_answers_as_an_empty_one() {
    let url = shared_url();
    let prefix = prefix("ttl");
    let options = RedisOptions::new().prefix(&prefix).time(TimeSource::MILLIS);
    let mut connection = inspect(&url);
    #[rustfmt::skip]
    let cases: [TtlCase; 12] = [
        // TAT − now: one interval after one admission, then the whole
        // window after a burst of L, then TAT 1250 at 600.
        (PolicyKind::Gcra, 4, 1_000, &[(true, 0)], 250),
        (PolicyKind::Gcra, 4, 1_000, &[(true, 0), (true, 0), (true, 0), (true, 0)], 1_000),
        (PolicyKind::Gcra, 4, 1_000, &[(true, 0), (true, 0), (true, 0), (true, 0), (true, 600)], 650),
        (PolicyKind::LeakyBucket, 4, 1_000, &[(true, 0), (true, 0), (true, 300)], 450),
        // newest + W − now.
        (PolicyKind::SlidingWindow, 2, 10_000, &[(true, 0), (true, 4_000)], 10_000),
        // full again at drip d + L − t: 1 × 250 after one token; after
        // three tokens by 100, (0 + 4 − 1) × 250 − 100.
        (PolicyKind::TokenBucket, 4, 1_000, &[(true, 0)], 250),
        (PolicyKind::TokenBucket, 4, 1_000, &[(true, 0), (true, 100), (true, 100)], 650),
        // the window with admissions ends: window 0 at 2500, window 1 at 12000.
        (PolicyKind::FixedWindow, 5, 10_000, &[(true, 0), (true, 2_500)], 7_500),
        (PolicyKind::FixedWindow, 5, 10_000, &[(true, 0), (true, 12_000)], 8_000),
        // two windows after the one with admissions starts.
        (PolicyKind::SlidingWindowCounter, 5, 10_000, &[(true, 0)], 20_000),
        (PolicyKind::SlidingWindowCounter, 5, 10_000, &[(true, 0), (true, 12_000)], 18_000),
        // remaining creates no key for a new client, and then the first
        // allow (at a later time) is the origin.
        (PolicyKind::FixedWindow, 5, 10_000, &[(false, 0), (true, 3_000)], 10_000),
    ];
    for (number, (policy, limit, window, calls, expected)) in cases.into_iter().enumerate() {
        let limiter = RedisLimiter::new(
            &url,
            policy,
            Config::per_ticks(limit, window).unwrap(),
            options.clone(),
        )
        .unwrap();
        let client = format!("case-{number}");
        let key = limiter.key(&client);
        let mut started = Instant::now();
        for &(allow, now) in calls {
            started = Instant::now();
            if allow {
                limiter.try_check_at(&client, now).unwrap();
            } else {
                limiter.try_remaining_at(&client, now).unwrap();
                let exists: bool = redis::cmd("EXISTS")
                    .arg(&key)
                    .query(&mut connection)
                    .unwrap();
                assert!(
                    !exists,
                    "{policy}: remaining stored the state of a new client"
                );
            }
        }
        assert_ttl(&mut connection, &key, expected, started);
    }
    // A rejection writes nothing, so the TTL of the last admission stands.
    let limiter = RedisLimiter::new(
        &url,
        PolicyKind::SlidingWindow,
        Config::per_ticks(1, 10_000).unwrap(),
        options.clone(),
    )
    .unwrap();
    let started = Instant::now();
    assert!(limiter.try_check_at("rejected", 0).unwrap().allowed());
    assert!(!limiter.try_check_at("rejected", 3_000).unwrap().allowed());
    assert_ttl(&mut connection, &limiter.key("rejected"), 10_000, started);
    // The least TTL raises short ones, and makes `remaining` store a new
    // client (so its origin holds).
    let kept = RedisLimiter::new(
        &url,
        PolicyKind::FixedWindow,
        Config::per_ticks(5, 1_000).unwrap(),
        options.clone().min_ttl(Duration::from_secs(60)),
    )
    .unwrap();
    let started = Instant::now();
    assert_eq!(kept.try_remaining_at("kept", 0).unwrap(), 5);
    assert_ttl(&mut connection, &kept.key("kept"), 60_000, started);
    // Ticks of 10 µs: TTLs round up to whole milliseconds.
    let micro = RedisLimiter::new(
        &url,
        PolicyKind::Gcra,
        Config::per_ticks(1, 12_345).unwrap(),
        options.clone().time(TimeSource::Caller {
            tick: Duration::from_micros(10),
        }),
    )
    .unwrap();
    let started = Instant::now();
    micro.try_check_at("micro", 0).unwrap();
    assert_ttl(&mut connection, &micro.key("micro"), 124, started);
    limiter.clear_prefix(&prefix).unwrap();
}

/// A least TTL longer than any a script sets is the longest (2^46 ms),
/// under every policy: the state is kept, so the limit holds. (Passed to
/// Redis as it was, it made PEXPIRE delete the key it had just written, and
/// every call was a new client's.)
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn a_least_ttl_past_the_longest_is_the_longest() {
    const LONGEST_MS: i64 = 1 << 46;
    let url = shared_url();
    let prefix = prefix("longest_ttl");
    let mut connection = inspect(&url);
    let options = exact_options(&prefix).min_ttl(Duration::MAX);
    for policy in PolicyKind::ALL {
        let limiter = RedisLimiter::new(
            &url,
            policy,
            Config::per_ticks(2, 1_000).unwrap(),
            options.clone(),
        )
        .unwrap();
        let since = Instant::now();
        let admitted: Vec<bool> = (0..3)
            .map(|_| limiter.try_check_at("c", 10).unwrap().allowed())
            .collect();
        assert_eq!(admitted, [true, true, false], "{policy}");
        assert_ttl(&mut connection, &limiter.key("c"), LONGEST_MS, since);
    }
    clear(&url, &prefix);
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn an_idle_client_expires_and_comes_back_as_a_new_one() {
    let url = shared_url();
    let prefix = prefix("expiry");
    // Redis's own clock: a window of 50 ms, in microseconds.
    let limiter = RedisLimiter::new(
        &url,
        PolicyKind::Gcra,
        Config::per_ticks(1, 50_000).unwrap(),
        RedisOptions::new().prefix(&prefix),
    )
    .unwrap();
    let _cleanup = Cleanup {
        limiter: &limiter,
        prefix: prefix.clone(),
    };
    let mut connection = inspect(&url);
    let key = limiter.key("idle");
    assert!(limiter.try_check("idle").unwrap().allowed());
    let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut connection).unwrap();
    assert!((1..=50).contains(&ttl), "PTTL {ttl}");
    // Poll until Redis drops the key; the deadline only turns a hang into a
    // failure.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let exists: bool = redis::cmd("EXISTS")
            .arg(&key)
            .query(&mut connection)
            .unwrap();
        if !exists {
            break;
        }
        assert!(Instant::now() < deadline, "{key} never expired");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(limiter.try_tracked_clients().unwrap(), 0);
    let back = limiter.try_check("idle").unwrap();
    assert_eq!(
        back,
        Decision::admitted(0).with_tick(floodgate::Tick::MICROSECOND)
    );
    assert_eq!(limiter.try_tracked_clients().unwrap(), 1);
}
