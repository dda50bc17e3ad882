//! The counters equal the decisions: on random traces of every policy, on
//! both engines, with and without bounds, what `stats` reports is what the
//! calls answered — and from several threads at once, nothing is lost.

use std::time::Duration;

use floodgate::{Bounds, Builder, Engine, ManualClock, Overflow, PolicyKind, RateLimiter, Stats};

const ENGINES: [Engine; 2] = [Engine::LockFree, Engine::Mutex];

/// What the calls answered, counted by the caller.
#[derive(Default, Debug, PartialEq, Eq)]
struct Tally {
    admitted: u64,
    rejected: u64,
    admitted_units: u64,
    rejected_units: u64,
}

fn decided(stats: Stats) -> Tally {
    Tally {
        admitted: stats.admitted,
        rejected: stats.rejected,
        admitted_units: stats.admitted_units,
        rejected_units: stats.rejected_units,
    }
}

#[test]
fn the_counters_equal_the_answers_on_random_traces() {
    for policy in PolicyKind::ALL {
        for engine in ENGINES {
            for (name, bounds) in [
                ("unbounded", Bounds::new()),
                ("evicting", Bounds::new().evict_idle()),
                ("capped", Bounds::new().max_clients(8)),
                (
                    "capped, shared",
                    Bounds::new().max_clients(8).on_overflow(Overflow::Shared),
                ),
            ] {
                let context = format!("{policy}, {engine}, {name}");
                let clock = ManualClock::new(0);
                let limiter = Builder::new(policy, 5, Duration::from_micros(10))
                    .clock(clock.clone())
                    .engine(engine)
                    .bounds(bounds)
                    .counting(true)
                    .build::<u64>()
                    .unwrap();
                let mut rng = fastrand::Rng::with_seed(7);
                let mut tally = Tally::default();
                let mut forgotten = 0;
                for _ in 0..20_000 {
                    clock.advance(rng.u64(..2_000));
                    let key = rng.u64(..40);
                    if rng.u8(..100) == 0 {
                        forgotten += u64::from(limiter.forget(&key));
                        continue;
                    }
                    let cost = rng.u64(..=6);
                    let decision = limiter.check_n(&key, cost);
                    if decision.allowed() {
                        tally.admitted += 1;
                        tally.admitted_units += cost;
                    } else {
                        tally.rejected += 1;
                        tally.rejected_units += cost;
                    }
                    // `remaining` is a question, not a decision.
                    limiter.remaining(&key);
                }
                let stats = limiter.stats().unwrap();
                assert_eq!(decided(stats), tally, "{context}");
                assert_eq!(stats.forgotten, forgotten, "{context}");
                // Every client ever created is tracked, or went.
                assert_eq!(
                    stats.created - stats.evicted - stats.forgotten,
                    limiter.tracked_clients() as u64,
                    "{context}: {stats:?}"
                );
                if bounds.cap().is_some() {
                    assert!(stats.overflowed > 0, "{context}: {stats:?}");
                    assert!(stats.sweeps > 0, "{context}: {stats:?}");
                } else {
                    assert_eq!(stats.overflowed, 0, "{context}");
                }
            }
        }
    }
}

#[test]
fn a_limiter_that_does_not_count_decisions_still_counts_its_store() {
    let limiter = Builder::new(PolicyKind::Gcra, 5, Duration::from_secs(1))
        .clock(ManualClock::new(0))
        .build::<u64>()
        .unwrap();
    for key in 0..1_000 {
        limiter.check(&key);
    }
    let stats = limiter.stats().unwrap();
    assert_eq!(stats.decided(), 0);
    // ...and says so: 0 because nothing counted, not because nothing came.
    assert!(!stats.decisions_counted);
    assert_eq!(stats.created, 1_000);
    // Growing from 64 slots to hold 1,000 clients takes rebuilds.
    assert!(stats.rebuilds >= 4, "{stats:?}");
    let counting = Builder::new(PolicyKind::Gcra, 5, Duration::from_secs(1))
        .clock(ManualClock::new(0))
        .counting(true)
        .build::<u64>()
        .unwrap();
    assert!(
        counting.stats().unwrap().decisions_counted,
        "before any decision too"
    );
    let mutex = Builder::new(PolicyKind::Gcra, 5, Duration::from_secs(1))
        .engine(Engine::Mutex)
        .clock(ManualClock::new(0))
        .build::<u64>()
        .unwrap();
    assert!(!mutex.stats().unwrap().decisions_counted);

    // What it shows says so too: no zeros that read as nothing decided.
    let shown = format!("{stats:?}");
    assert!(shown.contains("decisions: not counted"), "{shown}");
    assert!(!shown.contains("admitted"), "{shown}");
    let text = floodgate::export::Prometheus::new()
        .limiter("api", None, &stats, 1_000)
        .clone()
        .finish();
    assert!(!text.contains("floodgate_decisions_total{"), "{text}");
    assert!(
        text.contains("floodgate_clients_created_total{limiter=\"api\",tier=\"\"} 1000"),
        "{text}"
    );
    let counted = counting.stats().unwrap();
    assert!(format!("{counted:?}").contains("admitted: 0"));
    let text = floodgate::export::Prometheus::new()
        .limiter("api", None, &counted, 0)
        .clone()
        .finish();
    assert!(
        text.contains(
            "floodgate_decisions_total{limiter=\"api\",tier=\"\",outcome=\"admitted\"} 0"
        ),
        "{text}"
    );
}

/// Four threads deciding at a frozen clock: every decision is counted once.
#[test]
fn racing_threads_lose_no_count() {
    for engine in ENGINES {
        let limiter = Builder::new(PolicyKind::TokenBucket, 1_000, Duration::from_secs(1))
            .clock(ManualClock::new(0))
            .engine(engine)
            .counting(true)
            .build::<u64>()
            .unwrap();
        let admitted: u64 = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4)
                .map(|thread| {
                    let limiter = &limiter;
                    scope.spawn(move || {
                        (0..10_000u64)
                            .filter(|i| limiter.check(&((i + thread) % 7)).allowed())
                            .count() as u64
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        let stats = limiter.stats().unwrap();
        assert_eq!(stats.admitted, admitted, "{engine}");
        assert_eq!(stats.decided(), 40_000, "{engine}");
        assert_eq!(
            stats.admitted,
            7 * 1_000,
            "{engine}: each of 7 clients, its burst"
        );
    }
}

/// A registry counts per tier, and its `stats` is their sum; a reload
/// keeps the counts (the tier's store and counters stay).
#[test]
fn tiers_count_per_tier() {
    use floodgate::tiers::Tiers;
    let clock = ManualClock::new(0);
    let tiers = Tiers::with_clock(
        "free",
        "fixed-window:3/1s".parse().unwrap(),
        |key: &u64| {
            if key.is_multiple_of(2) {
                "premium"
            } else {
                "free"
            }
        },
        clock.clone(),
    )
    .unwrap()
    .with_tier("premium", "gcra:10/1s".parse().unwrap())
    .unwrap()
    .counting(true);
    let mut rng = fastrand::Rng::with_seed(3);
    let (mut free, mut premium) = (Tally::default(), Tally::default());
    for step in 0..5_000 {
        if step == 2_500 {
            tiers
                .reload("free", "fixed-window:5/1s".parse().unwrap())
                .unwrap();
        }
        clock.advance(rng.u64(..50_000_000));
        let key = rng.u64(..20);
        let tally = if key.is_multiple_of(2) {
            &mut premium
        } else {
            &mut free
        };
        if tiers.check(&key).allowed() {
            tally.admitted += 1;
            tally.admitted_units += 1;
        } else {
            tally.rejected += 1;
            tally.rejected_units += 1;
        }
    }
    assert_eq!(decided(tiers.tier_stats("free").unwrap()), free);
    assert_eq!(decided(tiers.tier_stats("premium").unwrap()), premium);
    let sum = RateLimiter::<u64>::stats(&tiers).unwrap();
    assert_eq!(sum.decided(), 5_000);
    assert_eq!(sum.created, 20);
    assert!(tiers.tier_stats("gold").is_err());
}

/// The offenders' summary names the flooder, on both engines, and is fed
/// by rejections only: a limiter whose clients are all admitted has none.
#[test]
fn the_offenders_name_the_flooder() {
    for engine in ENGINES {
        let clock = ManualClock::new(0);
        let limiter = Builder::new(PolicyKind::Gcra, 10, Duration::from_secs(1))
            .clock(clock.clone())
            .engine(engine)
            .offenders(64)
            .build::<str>()
            .unwrap();
        let mut refused = 0;
        for step in 0..10_000u64 {
            clock.advance(1_000_000); // 1 ms: each polite client stays within 10/s
            refused += u64::from(!limiter.check("flooder").allowed());
            assert!(limiter.check(&format!("polite-{}", step % 500)).allowed());
        }
        let report = limiter.take_offenders().unwrap();
        let first = &report.offenders[0];
        assert_eq!(first.key, "flooder", "{engine}");
        // 1,000/s for 10 s against 10/s: about 9,890 refused, each
        // recorded (one thread: no shard is ever busy).
        assert_eq!(first.refused, refused, "{engine}");
        assert_eq!((first.error, report.unattributed), (0, 0), "{engine}");
        assert!(refused > 9_800, "{engine}: {refused}");
        assert_eq!(report.offenders.len(), 1, "{engine}: nobody else refused");
        // A new interval.
        assert!(limiter.take_offenders().unwrap().offenders.is_empty());
    }
    let without = Builder::new(PolicyKind::Gcra, 1, Duration::from_secs(1))
        .build::<str>()
        .unwrap();
    without.check("a");
    without.check("a");
    assert!(without.take_offenders().is_none());
}

/// A summary of no entries is a configuration error, not a panic.
#[test]
fn an_offenders_summary_of_nothing_is_refused() {
    for capacity in [0, floodgate::offenders::MAX_CAPACITY + 1] {
        let built = Builder::new(PolicyKind::Gcra, 1, Duration::from_secs(1))
            .offenders(capacity)
            .build::<str>();
        assert_eq!(
            built.err(),
            Some(floodgate::ConfigError::OffendersOutOfRange { capacity })
        );
    }
}
