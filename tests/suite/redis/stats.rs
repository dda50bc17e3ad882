//! The store's own statistics: unreachable servers and round trips counted.

use super::*;

/// With nothing listening, every check is a failed round trip answered by
/// the fault rule, and each is counted: calls, errors, faults.
#[test]
fn an_unreachable_server_is_counted_call_by_call() {
    let limiter = RedisLimiter::new(
        "redis://127.0.0.1:1",
        PolicyKind::Gcra,
        Config::per_ticks(1, 1_000).unwrap(),
        RedisOptions::new()
            .time(TimeSource::MILLIS)
            .timeout(Duration::from_millis(200)),
    )
    .unwrap();
    for now in 0..3 {
        assert!(!limiter.check_at("a", now).allowed());
    }
    let stats = limiter.redis_stats();
    assert_eq!(
        (stats.calls, stats.errors, stats.faults),
        (3, 3, 3),
        "{stats:?}"
    );
    assert_eq!(
        stats.latency_buckets.len(),
        floodgate::redis::LATENCY_BUCKETS.len()
    );
    // Cumulative buckets never fall, and never pass the calls.
    assert!(stats
        .latency_buckets
        .windows(2)
        .all(|pair| pair[0].1 <= pair[1].1));
    assert!(stats.latency_buckets.last().unwrap().1 <= stats.latency_count);
    assert_eq!(stats.latency_count, stats.calls);
    // The fault rule's answers are decisions too.
    let decided = limiter.stats().unwrap();
    assert_eq!((decided.admitted, decided.rejected), (0, 3));
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn the_store_counts_its_round_trips_and_the_caches_answers() {
    let url = shared_url();
    let prefix = prefix("stats");
    let limiter = RedisLimiter::new(
        &url,
        PolicyKind::FixedWindow,
        Config::per_ticks(2, 1_000).unwrap(),
        RedisOptions::new()
            .prefix(&prefix)
            .time(TimeSource::MILLIS)
            .timeout(Duration::from_secs(5)),
    )
    .unwrap();
    limiter.clear_prefix(&prefix).unwrap();
    let before = limiter.redis_stats();
    let answers: Vec<bool> = (0..5)
        .map(|_| limiter.check_at("a", 10).allowed())
        .collect();
    assert_eq!(answers, [true, true, false, false, false]);
    let stats = limiter.redis_stats();
    // Two admissions and one rejection from Redis; the rejection cache
    // answers the other two.
    assert_eq!(stats.calls - before.calls, 3, "{stats:?}");
    assert_eq!(stats.answered_locally - before.answered_locally, 2);
    assert_eq!((stats.errors, stats.faults), (0, 0));
    assert_eq!(stats.latency_count, stats.calls);
    assert!(stats.latency_sum > Duration::ZERO);
    // Every answer is counted, Redis's and the cache's alike.
    let decided = limiter.stats().unwrap();
    assert_eq!((decided.admitted, decided.rejected), (2, 3), "{decided:?}");
    limiter.clear_prefix(&prefix).unwrap();
}
