//! Permits of `in-flight` rules taken and dropped while the table grows
//! and a sweep runs: three threads hold and release units of the same new
//! clients at a frozen clock, a fourth sweeps for idle clients, so each
//! release lands on whichever copy of its client is live (the one it
//! probed, or the one a rebuild moved it to) and a holder is never swept.
#![cfg(floodgate_shuttle)]

use floodgate::permit::Permit;
use floodgate::policy::{Compound, InFlight, Pair, Policy};
use floodgate::{Bounds, Config, Limiter, ManualClock, RateLimiter, RuleSet};
use floodgate_shuttle_tests::explore;
use shuttle::sync::atomic::{AtomicU64, Ordering};
use shuttle::sync::Arc;
use shuttle::thread;

const NOW: u64 = 0;
const LIMIT: u64 = 2;

/// Each thread's clients, in the order it calls them: four new clients in
/// three orders, so a table of two slots is rebuilt while they arrive.
const ORDERS: [[u64; 4]; 3] = [[1, 2, 3, 4], [4, 3, 2, 1], [3, 4, 1, 2]];

/// Per client, each thread takes a permit and, while it holds it, tries a
/// second; then drops the second (if it had one) and releases the first.
/// Each thread counts the permits it holds per client in `alive` (raised
/// after an admission, lowered before its release), so under every
/// schedule:
///
/// * at most `LIMIT` permits of a client are alive at once (the count is
///   never above what the limiter holds, which an exact step keeps at or
///   below the limit);
/// * every release answers 1: only its own permit gives its unit back,
///   and a client that holds units is never idle, so the sweep cannot
///   take it (and with it the units) before the release;
/// * at the end no unit is held: each client is gone (swept once idle) or
///   answers `LIMIT` left, and a release finds nothing.
fn permits_during_growth_and_a_sweep<P: Policy + Clone + 'static>(name: &str, policy: P) {
    explore(name, move || {
        let bounds = Bounds::new().evict_idle();
        let limiter: Arc<Limiter<u64, P, ManualClock>> =
            Arc::new(Limiter::with_bounds(policy.clone(), ManualClock::new(NOW), bounds).unwrap());
        let alive: Arc<[AtomicU64; 5]> = Arc::new(std::array::from_fn(|_| AtomicU64::new(0)));
        let mut threads: Vec<_> = ORDERS
            .iter()
            .map(|keys| {
                let (limiter, alive) = (Arc::clone(&limiter), Arc::clone(&alive));
                thread::spawn(move || {
                    for &key in keys {
                        let count = &alive[key as usize];
                        let hold = |count: &AtomicU64| {
                            let now = count.fetch_add(1, Ordering::SeqCst) + 1;
                            assert!(now <= LIMIT, "client {key}: {now} permits alive");
                        };
                        let Ok(first) = Permit::acquire(&*limiter, &key, 1) else {
                            continue;
                        };
                        hold(count);
                        if let Ok(second) = Permit::acquire(&*limiter, &key, 1) {
                            hold(count);
                            count.fetch_sub(1, Ordering::SeqCst);
                            drop(second);
                        }
                        count.fetch_sub(1, Ordering::SeqCst);
                        assert_eq!(first.release(), 1, "client {key}");
                    }
                })
            })
            .collect();
        threads.push({
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                limiter.sweep_at(NOW);
            })
        });
        for thread in threads {
            thread.join().unwrap();
        }
        for key in 1..=4 {
            assert_eq!(limiter.release_at(&key, NOW, LIMIT), 0, "client {key}");
            let left = RateLimiter::peek_at(&*limiter, &key, NOW);
            assert!(
                left.is_none_or(|left| left == LIMIT),
                "client {key}: {left:?}"
            );
        }
    });
}

#[test]
fn permits_in_flight_alone() {
    let policy = InFlight::new(Config::in_flight(LIMIT).unwrap()).unwrap();
    permits_during_growth_and_a_sweep("permits_in_flight_alone", policy);
}

#[test]
fn permits_in_flight_in_a_pair() {
    let rules: RuleSet = "gcra:100/1000ticks,in-flight:2".parse().unwrap();
    let policy = Pair::from_rules(&rules).unwrap();
    permits_during_growth_and_a_sweep("permits_in_flight_in_a_pair", policy);
}

#[test]
fn permits_in_flight_in_a_frame() {
    let rules: RuleSet = "fixed-window:100/1000ticks,in-flight:2".parse().unwrap();
    let policy = Compound::from_rules(&rules).unwrap();
    permits_during_growth_and_a_sweep("permits_in_flight_in_a_frame", policy);
}

/// Reservations under an `in-flight` rule settling, kept and dropped while
/// other threads check the same clients, the table grows and a sweep runs:
/// a reservation's end is its request's end, so it releases its unit there
/// whatever else it gives back. Per client, each thread reserves one unit
/// and, while it holds it, tries a second, dropped unsettled; the first
/// then settles at 0 or is kept, by the thread's and the client's numbers.
/// Each thread counts the reservations it holds per client in `alive`
/// (raised after an admission, lowered before the end), so under every
/// schedule at most `LIMIT` are alive at once, and at the end no unit is
/// held: a release finds nothing, and every client is gone (swept once
/// idle) or answers `LIMIT` left.
fn reservations_during_growth_and_a_sweep<P: Policy + Clone + 'static>(name: &str, policy: P) {
    use floodgate::reservation::Reservation;

    explore(name, move || {
        let bounds = Bounds::new().evict_idle();
        let limiter: Arc<Limiter<u64, P, ManualClock>> =
            Arc::new(Limiter::with_bounds(policy.clone(), ManualClock::new(NOW), bounds).unwrap());
        let alive: Arc<[AtomicU64; 5]> = Arc::new(std::array::from_fn(|_| AtomicU64::new(0)));
        let mut threads: Vec<_> = ORDERS
            .iter()
            .enumerate()
            .map(|(t, keys)| {
                let (limiter, alive) = (Arc::clone(&limiter), Arc::clone(&alive));
                thread::spawn(move || {
                    for &key in keys {
                        let count = &alive[key as usize];
                        let hold = |count: &AtomicU64| {
                            let now = count.fetch_add(1, Ordering::SeqCst) + 1;
                            assert!(now <= LIMIT, "client {key}: {now} reservations alive");
                        };
                        let Ok(first) = Reservation::new(&*limiter, &key, 1) else {
                            continue;
                        };
                        hold(count);
                        if let Ok(second) = Reservation::new(&*limiter, &key, 1) {
                            hold(count);
                            count.fetch_sub(1, Ordering::SeqCst);
                            drop(second);
                        }
                        count.fetch_sub(1, Ordering::SeqCst);
                        if (t as u64 + key).is_multiple_of(2) {
                            first.settle(0);
                        } else {
                            first.keep();
                        }
                    }
                })
            })
            .collect();
        threads.push({
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                limiter.sweep_at(NOW);
            })
        });
        for thread in threads {
            thread.join().unwrap();
        }
        for key in 1..=4 {
            assert_eq!(limiter.release_at(&key, NOW, LIMIT), 0, "client {key}");
            let left = RateLimiter::peek_at(&*limiter, &key, NOW);
            assert!(
                left.is_none_or(|left| left == LIMIT),
                "client {key}: {left:?}"
            );
        }
    });
}

#[test]
fn reservations_in_flight_alone() {
    let policy = InFlight::new(Config::in_flight(LIMIT).unwrap()).unwrap();
    reservations_during_growth_and_a_sweep("reservations_in_flight_alone", policy);
}

#[test]
fn reservations_in_flight_in_a_frame() {
    let rules: RuleSet = "fixed-window:100/1000ticks,in-flight:2".parse().unwrap();
    let policy = Compound::from_rules(&rules).unwrap();
    reservations_during_growth_and_a_sweep("reservations_in_flight_in_a_frame", policy);
}
