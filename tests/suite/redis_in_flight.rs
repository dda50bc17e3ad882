//! `in-flight` rules on Redis: held units answer as the in-memory engine's
//! on random traces (without leases, as the contract holds them), a holder
//! that dies gives its units back when its lease ends, and a renewal keeps
//! them held. Times are the caller's (milliseconds), so every answer is
//! exact and nothing waits on the wall clock.
//!
//! ```sh
//! FLOODGATE_REDIS_URL=redis://127.0.0.1:6379 \
//!     cargo test -p floodgate --test suite redis_in_flight:: -- --include-ignored
//! ```

use std::sync::Arc;
use std::time::Duration;

use floodgate::redis::{RedisLimiter, RedisOptions, TimeSource};
use floodgate::{build_rules, Bounds, Engine, ManualClock, RateLimiter, RuleSet, Tick};

const URL_VARIABLE: &str = "FLOODGATE_REDIS_URL";

fn url() -> String {
    match std::env::var(URL_VARIABLE) {
        Ok(url) if !url.is_empty() => url,
        _ => panic!("{URL_VARIABLE} is not set (.ci/run starts a server and sets it)"),
    }
}

/// Times in milliseconds from the caller, keys kept an hour, every answer
/// Redis's own (no rejection cache), under a prefix of the test's own.
fn options(test: &str) -> RedisOptions {
    RedisOptions::new()
        .prefix(format!("floodgate-test:{}:{test}", std::process::id()))
        .time(TimeSource::MILLIS)
        .timeout(Duration::from_secs(5))
        .min_ttl(Duration::from_secs(3_600))
        .rejection_cache(0)
}

/// Deletes the test's keys when dropped, so a failed test leaves nothing.
struct Cleanup<'a>(&'a RedisLimiter, String);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = self.0.clear_prefix(&self.1);
    }
}

/// Rule sets with an `in-flight` rule: alone, twice, beside a drip rule,
/// a window rule and a log.
const RULES: [&str; 5] = [
    "in-flight:2",
    "in-flight:2,in-flight:3",
    "gcra:3/21ms,in-flight:2",
    "fixed-window:4/30ms,in-flight:3",
    "in-flight:3,sliding-window:4/25ms",
];

/// Random traces of checks (costs 0 to L + 1), releases, refunds and
/// `remaining` of three clients, through Redis without leases and through
/// the mutex engine: every answer alike, field by field.
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn in_flight_answers_as_the_in_memory_engine() {
    let url = url();
    let mut rng = fastrand::Rng::with_seed(0x1F11);
    let (mut compared, mut released) = (0, 0);
    for (number, text) in RULES.iter().enumerate() {
        let rules: RuleSet = text.parse().unwrap();
        let test = format!("differential{number}");
        let redis = RedisLimiter::with_rules(&url, &rules, options(&test).lease(None)).unwrap();
        let _cleanup = Cleanup(&redis, options(&test).get_prefix().to_owned());
        let memory: Arc<dyn RateLimiter<str>> = build_rules::<str, _>(
            &rules,
            Engine::Mutex,
            ManualClock::with_tick(0, Tick::MILLISECOND),
            Bounds::new(),
        )
        .unwrap();
        let mut now = 0u64;
        for call in 0..400 {
            now += rng.u64(..4);
            let key = format!("c{}", rng.u64(..3));
            let context = format!("{text}, call {call}: {key} at {now}");
            match rng.u8(..10) {
                0..=4 => {
                    let cost = rng.u64(..=4);
                    let expected = memory.check_n_at(&key, now, cost);
                    let got = redis.try_check_n_at(&key, now, cost).unwrap();
                    assert_eq!(got, expected, "{context}: check {cost}");
                }
                5..=7 => {
                    let cost = rng.u64(1..=3);
                    let expected = memory.release_at(&key, now, cost);
                    let got = redis.try_release_at(&key, now, cost).unwrap();
                    assert_eq!(got, expected, "{context}: release {cost}");
                    released += usize::from(expected > 0);
                }
                8 => {
                    let (at, cost) = (now.saturating_sub(rng.u64(..10)), rng.u64(1..=2));
                    let expected = memory.refund_at(&key, now, at, cost);
                    let got = redis.try_refund_at(&key, now, at, cost).unwrap();
                    assert_eq!(got, expected, "{context}: refund {cost} of {at}");
                }
                _ => {
                    let expected = memory.remaining_at(&key, now);
                    assert_eq!(
                        redis.try_remaining_at(&key, now).unwrap(),
                        expected,
                        "{context}"
                    );
                }
            }
            compared += 1;
        }
    }
    eprintln!("{compared} answers alike, {released} releases that gave units back");
    assert!(released > 100, "the traces released too little: {released}");
}

/// A holder that dies mid-request (its limiter dropped: no release, no
/// renewal) holds its units until its lease ends, then they are back: a
/// newcomer is refused a tick before, admitted at the lease's end.
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn a_dead_holders_units_come_back_when_its_lease_ends() {
    let url = url();
    let rules: RuleSet = "in-flight:2".parse().unwrap();
    let lease = options("dead").lease(Some(Duration::from_secs(1)));
    let survivor = RedisLimiter::with_rules(&url, &rules, lease.clone()).unwrap();
    let _cleanup = Cleanup(&survivor, lease.get_prefix().to_owned());
    {
        let dying = RedisLimiter::with_rules(&url, &rules, lease.clone()).unwrap();
        assert!(dying.try_check_n_at("a", 0, 2).unwrap().allowed());
        // The process dies here: nothing releases or renews.
    }
    let held = survivor.try_check_at("a", 999).unwrap();
    assert!(!held.allowed(), "held until the lease ends");
    assert_eq!(
        held.retry_after(),
        None,
        "only a release, or the lease's end"
    );
    assert_eq!(
        survivor.try_remaining_at("a", 1_000).unwrap(),
        2,
        "back at 1 s"
    );
    assert!(survivor.try_check_n_at("a", 1_000, 2).unwrap().allowed());
    // A release of the dead holder's units finds none: its lease ended.
    assert_eq!(
        survivor.try_release_at("a", 1_000, 2).unwrap(),
        2,
        "the survivor's own"
    );
    assert_eq!(survivor.try_release_at("a", 1_001, 2).unwrap(), 0);
}

/// A renewal moves the lease of this process's holders: held past the
/// first lease, back one lease after the renewal; a release after its
/// lease ended gives nothing (the units came back then).
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn a_renewal_keeps_units_held_until_a_lease_after_it() {
    let url = url();
    let rules: RuleSet = "gcra:100/1s,in-flight:1".parse().unwrap();
    let lease = options("renewal").lease(Some(Duration::from_secs(1)));
    let holder = RedisLimiter::with_rules(&url, &rules, lease.clone()).unwrap();
    let other = RedisLimiter::with_rules(&url, &rules, lease.clone()).unwrap();
    let _cleanup = Cleanup(&holder, lease.get_prefix().to_owned());
    assert!(holder.try_check_at("a", 0).unwrap().allowed());
    assert_eq!(holder.try_renew_at(700).unwrap(), 1, "one holder renewed");
    assert!(
        !other.try_check_at("a", 1_500).unwrap().allowed(),
        "renewed at 700"
    );
    assert!(
        other.try_check_at("a", 1_700).unwrap().allowed(),
        "one lease after it"
    );
    assert_eq!(
        holder.try_renew_at(1_800).unwrap(),
        0,
        "its lease had ended"
    );
    assert_eq!(
        holder.try_release_at("a", 1_800, 1).unwrap(),
        0,
        "came back at 1,700"
    );
    assert_eq!(
        other.try_release_at("a", 1_800, 1).unwrap(),
        1,
        "the other's own"
    );
}

/// Behind the layer, on the async store with several rules (whose
/// decisions name the strictest rule only, here the rate rule): a
/// streamed response holds its slot until its body is dropped, then the
/// release (a script call, finished on the runtime) gives it back.
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn behind_the_layer_a_response_holds_its_slot_in_redis() {
    use bytes::Bytes;
    use floodgate::http::{Header, RateLimitLayer};
    use floodgate::redis::AsyncRedisLimiter;
    use http::{Request, Response, StatusCode};
    use http_body_util::{Empty, Full};
    use tower::{Layer, ServiceExt};

    let rules: RuleSet = "gcra:1/1s,in-flight:2".parse().unwrap();
    let cleaner = RedisLimiter::with_rules(&url(), &rules, options("layer")).unwrap();
    let _cleanup = Cleanup(&cleaner, options("layer").get_prefix().to_owned());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let limiter = AsyncRedisLimiter::with_rules(
            &url(),
            &rules,
            options("layer").time(TimeSource::Server),
        )
        .await
        .unwrap();
        assert!(limiter.holds_units());
        let service = RateLimitLayer::new(limiter.clone(), Header::new("x-key")).layer(
            tower::service_fn(|_: Request<Empty<Bytes>>| async {
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(
                    b"streamed",
                ))))
            }),
        );
        let request = |key: &str| {
            Request::get("/")
                .header("x-key", key)
                .body(Empty::new())
                .unwrap()
        };
        // The rate rule's limit is 1: the strictest, named by the decision.
        let first = service.clone().oneshot(request("a")).await.unwrap();
        assert_eq!(first.status(), StatusCode::OK);
        assert_eq!(limiter.try_remaining("a").await.unwrap(), 0);
        // The in-flight rule's holders: one while the response lives.
        let held = limiter.keys("a").swap_remove(1);
        let connection = redis::Client::open(url().as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let holders = || {
            let (held, mut connection) = (held.clone(), connection.clone());
            async move {
                redis::cmd("ZCARD")
                    .arg(&held)
                    .query_async::<u64>(&mut connection)
                    .await
                    .unwrap()
            }
        };
        assert_eq!(holders().await, 1, "held while the response lives");
        drop(first);
        // The release is a round trip, finished on the runtime: waited for
        // (at most a second), not timed.
        let mut left = holders().await;
        for _ in 0..200 {
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            left = holders().await;
        }
        assert_eq!(left, 0, "the dropped response's slot came back");
    });
}

/// A reservation's end releases what its `in-flight` rules hold in Redis,
/// once, however it ends (settled, kept, dropped unsettled either way,
/// unwound), beside rate rules too: the client that reserved and finished
/// can always reserve again.
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn a_reservation_releases_its_in_flight_units_however_it_ends() {
    use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

    use floodgate::reservation::{Reservation, Unsettled};

    let url = url();
    for (number, text) in [
        "in-flight:2",
        "in-flight:2,gcra:100/1s",
        "in-flight:2,fixed-window:100/1h,sliding-window:50/1s",
    ]
    .iter()
    .enumerate()
    {
        let rules: RuleSet = text.parse().unwrap();
        let test = format!("reservation{number}");
        let redis = RedisLimiter::with_rules(&url, &rules, options(&test)).unwrap();
        let _cleanup = Cleanup(&redis, options(&test).get_prefix().to_owned());
        let held = || 2 - redis.try_remaining("app").unwrap().min(2);

        drop(Reservation::new(&redis, "app", 1).unwrap());
        assert_eq!(held(), 0, "{text}: dropped");
        Reservation::new(&redis, "app", 1).unwrap().settle(0);
        assert_eq!(held(), 0, "{text}: settled at 0");
        let both = Reservation::new(&redis, "app", 2).unwrap();
        assert_eq!(held(), 2, "{text}: two held");
        let refused = Reservation::new(&redis, "app", 1).unwrap_err();
        assert_eq!(refused.retry_after(), None, "{text}: only a release");
        both.settle(1);
        assert_eq!(held(), 0, "{text}: settled at 1");
        Reservation::new(&redis, "app", 1).unwrap().keep();
        assert_eq!(held(), 0, "{text}: kept");
        drop(Reservation::with(&redis, "app", 2, Unsettled::Keep).unwrap());
        assert_eq!(held(), 0, "{text}: dropped, kept");
        let unwound = catch_unwind(AssertUnwindSafe(|| {
            let _call = Reservation::new(&redis, "app", 2).unwrap();
            resume_unwind(Box::new("the handler failed"));
        }));
        assert!(unwound.is_err());
        assert_eq!(held(), 0, "{text}: unwound");
        for round in 0..10 {
            let call = Reservation::new(&redis, "app", 1)
                .unwrap_or_else(|refused| panic!("{text}, round {round}: {refused:?}"));
            call.settle(round % 2);
            assert_eq!(held(), 0, "{text}: round {round}");
        }
    }
}
