//! The same new clients' first calls from three threads while the table
//! grows under them: six clients, so a table of two slots is rebuilt
//! three times or more, each rebuild started by whichever insert finds no
//! room, while the other threads' inserts of the same keys race it.
#![cfg(floodgate_shuttle)]

use floodgate::policy::{
    FixedWindow, Gcra, LeakyBucket, Policy, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use floodgate::{Bounds, Config, Decision, Limiter, ManualClock};
use floodgate_shuttle_tests::explore;
use shuttle::sync::Arc;
use shuttle::thread;

const NOW: u64 = 0;
const WINDOW: u64 = 1_000;

/// Each thread's keys, in the order it checks them: every key by every
/// thread, in three different orders so that each key's first touch can
/// come from any of them.
const ORDERS: [[u64; 6]; 3] = [[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1], [4, 5, 6, 1, 2, 3]];

/// Three threads each check keys 1 to 6 once at `NOW` (the second by
/// `check_n_at` of cost 1), none of them known before. Under every
/// schedule each key ends with exactly one state, created by one of the
/// racing inserts, which the others find (in the table they probe or the
/// one it moved to); so each key is admitted exactly `limit` times out of
/// 3 (`limit` is at most 3), leaving `limit - 1`, ..., 0, and once every
/// thread has finished, `tracked_clients` and `stored_clients` are 6 and
/// every key has 0 left.
fn first_touch_during_growth<P: Policy>(name: &str, limit: u64) {
    assert!(limit <= 3, "every admission is one of the 3 threads'");
    explore(name, move || {
        let policy = P::new(Config::per_ticks(limit, WINDOW).unwrap()).unwrap();
        let limiter: Arc<Limiter<u64, P, ManualClock>> =
            Arc::new(Limiter::with_bounds(policy, ManualClock::new(0), Bounds::new()).unwrap());
        let threads: Vec<_> = ORDERS
            .iter()
            .enumerate()
            .map(|(t, keys)| {
                let limiter = Arc::clone(&limiter);
                thread::spawn(move || {
                    keys.iter()
                        .map(|&key| {
                            let decision = if t == 1 {
                                limiter.check_n_at(&key, NOW, 1)
                            } else {
                                limiter.check_at(&key, NOW)
                            };
                            (key, decision)
                        })
                        .collect::<Vec<(u64, Decision)>>()
                })
            })
            .collect();
        let decided: Vec<(u64, Decision)> = threads
            .into_iter()
            .flat_map(|thread| thread.join().unwrap())
            .collect();
        for key in 1..=6 {
            let mut left: Vec<u64> = decided
                .iter()
                .filter(|(k, d)| *k == key && d.allowed())
                .map(|(_, d)| d.remaining())
                .collect();
            left.sort_unstable();
            assert_eq!(
                left,
                (0..limit).collect::<Vec<_>>(),
                "client {key}: {decided:?}"
            );
            assert_eq!(limiter.peek_at(&key, NOW), Some(0), "client {key}");
        }
        assert_eq!(limiter.tracked_clients(), 6);
        assert_eq!(limiter.stored_clients(), 6);
    });
}

#[test]
fn first_touch_token_bucket() {
    first_touch_during_growth::<TokenBucket>("first_touch_token_bucket", 2);
}

#[test]
fn first_touch_fixed_window() {
    first_touch_during_growth::<FixedWindow>("first_touch_fixed_window", 2);
}

#[test]
fn first_touch_sliding_window_counter() {
    first_touch_during_growth::<SlidingWindowCounter>("first_touch_sliding_window_counter", 2);
}

#[test]
fn first_touch_gcra() {
    first_touch_during_growth::<Gcra>("first_touch_gcra", 2);
}

#[test]
fn first_touch_leaky_bucket() {
    first_touch_during_growth::<LeakyBucket>("first_touch_leaky_bucket", 2);
}

#[test]
fn first_touch_sliding_window_1() {
    first_touch_during_growth::<SlidingWindow>("first_touch_sliding_window_1", 1);
}

#[test]
fn first_touch_sliding_window_2() {
    first_touch_during_growth::<SlidingWindow>("first_touch_sliding_window_2", 2);
}
