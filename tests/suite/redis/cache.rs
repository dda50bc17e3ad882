//! The local rejection cache: the answers Redis gives, a wait no longer than
//! Redis's, refunds, its cap under a flood, `forget`.

use super::*;

/// Several instances with the rejection cache (prefix `cached`) and one
/// without (prefix `plain`) on the same Redis see the same requests in the
/// same order, one of the instances flooding one client. A rejection
/// changes nothing, so the two prefixes hold the same states throughout,
/// and the uncached answer is Redis's own. Every cached instance's answer
/// is then Redis's: the same `allowed` and `delay`, and when it was
/// answered locally, a `retry_after` of at least 1 and at most Redis's
/// (other instances' admissions may have moved Redis's later) and a
/// `remaining` below the cost; otherwise the very same decision.
pub(super) fn cache_differential(policy: PolicyKind, traces: usize) {
    let url = shared_url();
    let prefix = prefix(&format!("cache_{}", policy.name()));
    let cached_prefix = format!("{prefix}:cached");
    let plain_prefix = format!("{prefix}:plain");
    let mut rng = fastrand::Rng::with_seed(0xCAC4E ^ policy as u64);
    let (mut local, mut compared) = (0, 0);
    for number in 0..traces {
        let limit = match rng.u8(..4) {
            0 => rng.u64(9..=100),
            _ => rng.u64(1..=6),
        };
        let least = if policy.drips() { limit } else { 1 };
        let window = match rng.u8(..3) {
            0 => rng.u64(least..=least + 10),
            1 => least * rng.u64(1..=20),
            _ => rng.u64(least..=least.max(10_000)),
        };
        let window = if policy == PolicyKind::SlidingWindowCounter {
            window.min(floodgate::redis::MAX_COUNTER_PRODUCT / limit)
        } else {
            window
        };
        let config = Config::per_ticks(limit, window).unwrap();
        let instances: Vec<RedisLimiter> = (0..3)
            .map(|_| {
                RedisLimiter::new(&url, policy, config, cached_options(&cached_prefix)).unwrap()
            })
            .collect();
        let plain = RedisLimiter::new(&url, policy, config, exact_options(&plain_prefix)).unwrap();
        let mut now = rng.u64(0..=1_000);
        for call in 0..rng.usize(50..=300) {
            // Instance 0 floods client 0; the others call any client.
            let (instance, client) = if rng.u8(..10) < 6 {
                (0, 0)
            } else {
                (rng.usize(1..3), rng.usize(..3))
            };
            now += match rng.u8(..10) {
                0..=5 => 0,
                6 | 7 => rng.u64(1..=3),
                8 => rng.u64(0..=window),
                _ => window / 2,
            };
            let cost = match rng.u8(..10) {
                0 => rng.u64(1..=limit),
                1 => limit,
                2 => limit + 1,
                3 => 0,
                _ => 1,
            };
            let key = format!("t{number}c{client}");
            let before = instances[instance].answered_locally();
            let got = instances[instance].try_check_n_at(&key, now, cost).unwrap();
            let answered_locally = instances[instance].answered_locally() > before;
            let expected = plain.try_check_n_at(&key, now, cost).unwrap();
            let context = format!(
                "{policy} L={limit} W={window} trace {number} call {call}: instance {instance} \
                 {key} at {now} cost {cost}, locally: {answered_locally}"
            );
            if answered_locally {
                local += 1;
                assert!(!expected.allowed(), "admitted by Redis: {context}");
                assert!(!got.allowed(), "{context}");
                assert_eq!(got.delay_ticks(), 0, "{context}");
                assert!(
                    (1..=expected.retry_after_ticks().unwrap_or(u64::MAX))
                        .contains(&got.retry_after_ticks().unwrap_or(u64::MAX)),
                    "retry_after {} past Redis's {}: {context}",
                    got.retry_after_ticks().unwrap_or(u64::MAX),
                    expected.retry_after_ticks().unwrap_or(u64::MAX)
                );
                assert!(got.remaining() < cost, "{context}");
                if cost == 1 {
                    assert_eq!(got.remaining(), expected.remaining(), "{context}");
                }
            } else {
                assert_eq!(got, expected, "{context}");
            }
            compared += 1;
        }
    }
    let cleaner = RedisLimiter::new(
        &url,
        policy,
        Config::per_ticks(1, 1).unwrap(),
        exact_options(&prefix),
    )
    .unwrap();
    cleaner.clear_prefix(&prefix).unwrap();
    assert!(
        local * 20 > compared,
        "{policy}: only {local} of {compared} answered locally"
    );
    eprintln!("{policy}: {compared} answers, {local} of them from the cache, all Redis's");
}

/// [`exact_options`] with the rejection cache on (its default).
pub(super) fn cached_options(prefix: &str) -> RedisOptions {
    exact_options(prefix).rejection_cache(floodgate::redis::DEFAULT_REJECTION_CACHE)
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn the_rejection_cache_answers_as_redis_with_instances_sharing_one_redis() {
    for policy in PolicyKind::ALL {
        cache_differential(policy, 25);
    }
}

/// On Redis's clock the cache keeps its deadlines on the local monotonic
/// clock, from before the call that Redis rejected. A cached answer's
/// `retry_after` is then at least 1 and never reaches past that rejection's
/// `d` counted from when its answer arrived (a bound that holds whatever
/// the machine's speed): the cache never rejects past `now + d`. The
/// flood ends with an admission from Redis once the deadline has passed.
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn on_redis_clock_the_cache_rejects_no_longer_than_redis() {
    let url = shared_url();
    let prefix = prefix("cache_server_clock");
    let config = Config::per_ticks(2, 200_000).unwrap();
    let options = RedisOptions::new()
        .prefix(&prefix)
        .timeout(Duration::from_secs(5));
    for policy in PolicyKind::ALL {
        let cached = RedisLimiter::new(&url, policy, config, options.clone()).unwrap();
        let key = format!("flooder-{policy}");
        let mut admitted = 0;
        // When the last rejection from Redis arrived, and its retry_after.
        let mut last: Option<(Instant, u64)> = None;
        let deadline = Instant::now() + Duration::from_secs(30);
        while admitted < 3 || cached.answered_locally() == 0 {
            assert!(Instant::now() < deadline, "{policy}: the flood never ended");
            let locally = cached.answered_locally();
            let before = Instant::now();
            let decision = cached.try_check(&key).unwrap();
            if cached.answered_locally() > locally {
                let (arrived, d) = last.expect("a cached rejection follows one from Redis");
                let since =
                    i128::try_from(before.saturating_duration_since(arrived).as_micros()).unwrap();
                assert!(!decision.allowed());
                assert!(
                    decision.retry_after_ticks().unwrap_or(u64::MAX) >= 1,
                    "{policy}: {decision:?}"
                );
                assert!(
                    i128::from(decision.retry_after_ticks().unwrap_or(u64::MAX))
                        <= i128::from(d) - since,
                    "{policy}: {decision:?} past Redis's {d} µs, {since} µs after it"
                );
            } else if decision.allowed() {
                admitted += 1;
            } else {
                last = Some((
                    Instant::now(),
                    decision.retry_after_ticks().unwrap_or(u64::MAX),
                ));
            }
        }
        cached.clear_prefix(&prefix).unwrap();
    }
}

/// On Redis's clock a decision carries the server's time it was judged
/// at, so a refund of its admission gives its units back, at most its cost;
/// and a refund that gives anything back clears the client's cached
/// refusal, so the next check is Redis's own.
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn on_redis_clock_a_refund_by_the_decision_gives_back_and_clears_the_cache() {
    let url = shared_url();
    let prefix = prefix("refund_server_clock");
    // One request a minute: nothing drips back while the test runs.
    let config = Config::per_ticks(1, 60_000_000).unwrap();
    let options = RedisOptions::new()
        .prefix(&prefix)
        .timeout(Duration::from_secs(5));
    for policy in PolicyKind::ALL {
        let limiter = RedisLimiter::new(&url, policy, config, options.clone()).unwrap();
        let key = format!("refunded-{policy}");
        let admitted = limiter
            .admit(&key)
            .unwrap_or_else(|refused| panic!("{policy}: {refused:?}"));
        let refused = limiter.try_check(&key).unwrap();
        assert!(!refused.allowed(), "{policy}");
        let locally = limiter.answered_locally();
        assert!(!limiter.try_check(&key).unwrap().allowed(), "{policy}");
        assert_eq!(limiter.answered_locally(), locally + 1, "{policy}: cached");
        // At most the admission's own unit, and once: the refund takes it.
        assert_eq!(limiter.try_refund(admitted, 5).unwrap(), 1, "{policy}");
        assert!(limiter.try_check(&key).unwrap().allowed(), "{policy}");
        assert_eq!(limiter.answered_locally(), locally + 1, "{policy}");
    }
    let cleaner = RedisLimiter::new(&url, PolicyKind::Gcra, config, options).unwrap();
    cleaner.clear_prefix(&prefix).unwrap();
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn the_rejection_cache_stays_under_its_cap_while_100000_flooders_pass() {
    let url = shared_url();
    let prefix = prefix("cache_cap");
    let cap = floodgate::redis::DEFAULT_REJECTION_CACHE;
    let limiter = RedisLimiter::new(
        &url,
        PolicyKind::Gcra,
        Config::per_ticks(1, 40).unwrap(),
        exact_options(&prefix).rejection_cache(cap).connections(4),
    )
    .unwrap();
    let _cleanup = Cleanup {
        limiter: &limiter,
        prefix: prefix.clone(),
    };
    const FLOODERS: u64 = 100_000;
    const THREADS: u64 = 4;
    // Flooder `i` calls at time `i`: admitted, then rejected until `i + 40`,
    // so the live rejections are about the last 40 clients, and the rest
    // die and are swept as time passes. Each thread floods its own share.
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let limiter = &limiter;
            scope.spawn(move || {
                for id in (thread..FLOODERS).step_by(THREADS as usize) {
                    let key = format!("flooder-{id}");
                    assert!(limiter.try_check_at(&key, id).unwrap().allowed());
                    assert!(!limiter.try_check_at(&key, id).unwrap().allowed());
                    assert!(!limiter.try_check_at(&key, id + 1).unwrap().allowed());
                    assert!(limiter.cached_rejections() <= cap);
                }
            });
        }
    });
    assert!(limiter.cached_rejections() <= cap);
    // The third call of every flooder met its cached rejection.
    assert!(
        limiter.answered_locally() >= FLOODERS * 9 / 10,
        "{}",
        limiter.answered_locally()
    );

    // Frozen time: nothing dies, so the cache fills and then refuses
    // newcomers, which are asked of Redis and still rejected.
    let small = RedisLimiter::new(
        &url,
        PolicyKind::FixedWindow,
        Config::per_ticks(1, 1_000).unwrap(),
        exact_options(&prefix).rejection_cache(100),
    )
    .unwrap();
    for id in 0..1_000 {
        let key = format!("frozen-{id}");
        assert!(small.try_check_at(&key, 5).unwrap().allowed());
        assert!(!small.try_check_at(&key, 5).unwrap().allowed());
        assert!(small.cached_rejections() <= 100);
    }
    assert_eq!(small.cached_rejections(), 100);
    assert!(!small.try_check_at("frozen-999", 6).unwrap().allowed());
    assert!(!small.try_check_at("frozen-0", 6).unwrap().allowed());
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn forget_drops_the_cached_rejection_and_the_cache_can_be_turned_off() {
    let url = shared_url();
    let prefix = prefix("cache_forget");
    let config = Config::per_ticks(1, 1_000).unwrap();
    let limiter =
        RedisLimiter::new(&url, PolicyKind::Gcra, config, cached_options(&prefix)).unwrap();
    let _cleanup = Cleanup {
        limiter: &limiter,
        prefix: prefix.clone(),
    };
    assert!(limiter.try_check_at("f", 0).unwrap().allowed());
    assert!(!limiter.try_check_at("f", 1).unwrap().allowed());
    assert_eq!(limiter.answered_locally(), 0);
    let cached = limiter.try_check_at("f", 2).unwrap();
    assert_eq!(limiter.answered_locally(), 1);
    assert_eq!(
        (
            cached.allowed(),
            cached.retry_after_ticks().unwrap_or(u64::MAX)
        ),
        (false, 998)
    );
    // Weighted: a rejection of cost 1 covers every larger cost.
    assert!(!limiter.try_check_n_at("f", 3, 1).unwrap().allowed());
    assert_eq!(limiter.answered_locally(), 2);
    // Time that steps back goes to Redis.
    assert!(!limiter.try_check_at("f", 0).unwrap().allowed());
    assert_eq!(limiter.answered_locally(), 2);
    assert!(limiter.try_forget("f").unwrap());
    assert!(limiter.try_check_at("f", 4).unwrap().allowed());
    assert_eq!(limiter.cached_rejections(), 0);

    let off = RedisLimiter::new(
        &url,
        PolicyKind::Gcra,
        config,
        cached_options(&prefix).rejection_cache(0),
    )
    .unwrap();
    for now in 0..5 {
        assert_eq!(off.try_check_at("g", now).unwrap().allowed(), now == 0);
    }
    assert_eq!((off.answered_locally(), off.cached_rejections()), (0, 0));

    // The async limiter shares the rule.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let limiter = AsyncRedisLimiter::new(
            &url,
            PolicyKind::SlidingWindow,
            config,
            cached_options(&prefix),
        )
        .await
        .unwrap();
        assert!(limiter.try_check_at("a", 0).await.unwrap().allowed());
        assert!(!limiter.try_check_at("a", 10).await.unwrap().allowed());
        let cached = limiter.try_check_at("a", 20).await.unwrap();
        assert_eq!(
            (
                cached.allowed(),
                cached.retry_after_ticks().unwrap_or(u64::MAX)
            ),
            (false, 980)
        );
        assert_eq!(limiter.answered_locally(), 1);
        assert!(limiter.try_forget("a").await.unwrap());
        assert!(limiter.try_check_at("a", 30).await.unwrap().allowed());
    });
}

#[test]
fn times_past_exact_arithmetic_are_refused_before_any_round_trip() {
    // Nothing listens on port 1: a round trip would fail with Unavailable.
    let limiter = RedisLimiter::new(
        "redis://127.0.0.1:1",
        PolicyKind::Gcra,
        Config::per_ticks(1, 1_000).unwrap(),
        RedisOptions::new().time(TimeSource::MILLIS),
    )
    .unwrap();
    assert!(matches!(
        limiter.try_check_at("a", MAX_NOW + 1),
        Err(RedisError::TimeOutOfRange { now, max }) if now == MAX_NOW + 1 && max == MAX_NOW
    ));
    assert!(matches!(
        limiter.try_check_at("a", MAX_NOW),
        Err(RedisError::Unavailable(_))
    ));
    assert!(matches!(
        limiter.try_peek_at("a", MAX_NOW + 1),
        Err(RedisError::TimeOutOfRange { .. })
    ));
}
