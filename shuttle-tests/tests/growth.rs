//! Table growth racing checks. Under the cfg a new table has two slots
//! (room for one client), so the ten clients of a model rebuild it four
//! times or more while three threads check one hot client at a frozen
//! instant and insert new ones, and a fourth reads the hot client.
#![cfg(floodgate_shuttle)]

use floodgate::policy::{
    FixedWindow, Gcra, LeakyBucket, Policy, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use floodgate::{Bounds, Config, Decision, Limiter, ManualClock};
use floodgate_shuttle_tests::explore;
use shuttle::sync::Arc;
use shuttle::thread;

/// The frozen instant every call is made at, and the window.
const NOW: u64 = 5_000;
const WINDOW: u64 = 1_000;

/// The hot client's key; each checker's new clients are `100 * (t + 1) + i`.
const HOT: u64 = 0;
const CHECKERS: u64 = 3;
const NEW_PER_CHECKER: u64 = 3;

fn limiter<P: Policy>(limit: u64) -> Arc<Limiter<u64, P, ManualClock>> {
    let policy = P::new(Config::per_ticks(limit, WINDOW).unwrap()).unwrap();
    Arc::new(Limiter::with_bounds(policy, ManualClock::new(0), Bounds::new()).unwrap())
}

/// What one checker saw: its hot checks' decisions, and each new client's
/// key with its first check's decision.
struct Checked {
    hot: Vec<Decision>,
    new: Vec<(u64, Decision)>,
}

/// Three checkers each check the hot client `limit + 1` times at `NOW`
/// and insert three new clients of their own between those checks (the
/// new clients' first calls alternate `check_at` and `check_n_at` of
/// cost 1); a reader meanwhile asks the hot client's `remaining_at` and
/// `peek_at`, and `tracked_clients`. The hot client may be created by any
/// of them. Under every schedule:
///
/// * exactly `limit` hot checks are admitted, leaving `limit - 1`, ...,
///   `0` (time is frozen, so each admission spends one of the burst and
///   none comes back), and every rejected one says 0 remain;
/// * each new client's first check is admitted with `limit - 1` left (its
///   key is checked by no one else);
/// * the reader's `remaining_at` never rises, never exceeds `limit`, and
///   its `peek_at` is `None` only until some call created the client,
///   then never rises either (nothing is removed, and a rebuild moves the
///   state with every admission in it);
/// * `tracked_clients` mid-run counts at most the ten clients plus one
///   claim per checker in flight (a claim that lost its slot's race is
///   given back), and once every thread has finished, `tracked_clients`
///   and `stored_clients` are exactly ten, the hot client has 0 left and
///   each new client `limit - 1`.
fn growth_races_checks<P: Policy>(name: &str, limit: u64) {
    explore(name, move || {
        let limiter = limiter::<P>(limit);
        let checkers: Vec<_> = (0..CHECKERS)
            .map(|t| {
                let limiter = Arc::clone(&limiter);
                thread::spawn(move || {
                    let mut checked = Checked {
                        hot: Vec::new(),
                        new: Vec::new(),
                    };
                    for i in 0..NEW_PER_CHECKER.max(limit + 1) {
                        if i <= limit {
                            checked.hot.push(limiter.check_at(&HOT, NOW));
                        }
                        if i < NEW_PER_CHECKER {
                            let key = 100 * (t + 1) + i;
                            let first = if (t + i) % 2 == 0 {
                                limiter.check_at(&key, NOW)
                            } else {
                                limiter.check_n_at(&key, NOW, 1)
                            };
                            checked.new.push((key, first));
                        }
                    }
                    checked
                })
            })
            .collect();
        let reader = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                let clients = 1 + CHECKERS * NEW_PER_CHECKER;
                let mut last_remaining = limit;
                let mut last_peek: Option<u64> = None;
                for _ in 0..4 {
                    let peek = limiter.peek_at(&HOT, NOW);
                    match (last_peek, peek) {
                        (Some(_), None) => panic!("the hot client vanished"),
                        (Some(before), Some(now)) => assert!(now <= before, "{before} then {now}"),
                        _ => {}
                    }
                    last_peek = peek.or(last_peek);
                    let remaining = limiter.remaining_at(&HOT, NOW);
                    assert!(
                        remaining <= last_remaining,
                        "remaining rose: {last_remaining} then {remaining}"
                    );
                    last_remaining = remaining;
                    let tracked = limiter.tracked_clients() as u64;
                    assert!(tracked <= clients + CHECKERS, "{tracked} tracked mid-run");
                }
            })
        };
        let checked: Vec<Checked> = checkers
            .into_iter()
            .map(|checker| checker.join().unwrap())
            .collect();
        reader.join().unwrap();

        let hot: Vec<&Decision> = checked.iter().flat_map(|c| &c.hot).collect();
        let mut left: Vec<u64> = hot
            .iter()
            .filter(|d| d.allowed())
            .map(|d| d.remaining())
            .collect();
        left.sort_unstable();
        assert_eq!(
            left,
            (0..limit).collect::<Vec<_>>(),
            "the hot client's admissions: {hot:?}"
        );
        for rejected in hot.iter().filter(|d| !d.allowed()) {
            assert_eq!(rejected.remaining(), 0, "{rejected:?}");
        }
        for &(key, first) in checked.iter().flat_map(|c| &c.new) {
            assert!(first.allowed(), "client {key}: {first:?}");
            assert_eq!(first.remaining(), limit - 1, "client {key}: {first:?}");
            assert_eq!(limiter.peek_at(&key, NOW), Some(limit - 1), "client {key}");
        }
        assert_eq!(limiter.peek_at(&HOT, NOW), Some(0));
        assert!(!limiter.check_at(&HOT, NOW).allowed());
        let clients = 1 + (CHECKERS * NEW_PER_CHECKER) as usize;
        assert_eq!(limiter.tracked_clients(), clients);
        assert_eq!(limiter.stored_clients(), clients);
    });
}

#[test]
fn growth_token_bucket() {
    growth_races_checks::<TokenBucket>("growth_token_bucket", 3);
}

#[test]
fn growth_fixed_window() {
    growth_races_checks::<FixedWindow>("growth_fixed_window", 3);
}

#[test]
fn growth_sliding_window_counter() {
    growth_races_checks::<SlidingWindowCounter>("growth_sliding_window_counter", 3);
}

#[test]
fn growth_gcra() {
    growth_races_checks::<Gcra>("growth_gcra", 3);
}

#[test]
fn growth_leaky_bucket() {
    growth_races_checks::<LeakyBucket>("growth_leaky_bucket", 3);
}

#[test]
fn growth_sliding_window_1() {
    growth_races_checks::<SlidingWindow>("growth_sliding_window_1", 1);
}

#[test]
fn growth_sliding_window_2() {
    growth_races_checks::<SlidingWindow>("growth_sliding_window_2", 2);
}

#[test]
fn growth_sliding_window_3() {
    growth_races_checks::<SlidingWindow>("growth_sliding_window_3", 3);
}
