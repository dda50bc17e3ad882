//! Refunds racing checks while the table grows under them: three threads
//! admit and give back on the same new clients at a frozen clock, so each
//! refund lands on whichever copy of its client is live (the one it
//! probed, or the one a rebuild moved it to) and the totals are exact.
#![cfg(floodgate_shuttle)]

use floodgate::policy::{
    FixedWindow, Gcra, LeakyBucket, Policy, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use floodgate::{Bounds, Config, Limiter, ManualClock, RateLimiter};
use floodgate_shuttle_tests::explore;
use shuttle::sync::Arc;
use shuttle::thread;

const NOW: u64 = 0;
const WINDOW: u64 = 1_000;
const LIMIT: u64 = 2;

/// Each thread's clients, in the order it calls them: four new clients in
/// three orders, so a table of two slots is rebuilt while they arrive.
const ORDERS: [[u64; 4]; 3] = [[1, 2, 3, 4], [4, 3, 2, 1], [3, 4, 1, 2]];

/// What one thread did to one client: admissions, and units given back.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    admitted: u64,
    given: u64,
}

/// Per client, each thread checks it, gives its admission back when the
/// thread's and the client's numbers say so (half the pairs), then checks
/// it again. At a frozen clock a refund of an admission still spent gives
/// back exactly its unit (nothing of it has dripped or expired), whichever
/// other thread's check or refund lands between, so under every schedule:
/// every refund answers 1, and each client's `remaining` at the end is
/// `LIMIT` less its admissions plus what was given back (nothing lost to a
/// move, nothing given twice).
fn refunds_during_growth<P: Policy>(name: &str) {
    refunds_during_growth_of(name, || {
        P::new(Config::per_ticks(LIMIT, WINDOW).unwrap()).unwrap()
    });
}

/// `refunds_during_growth` on the policy `make` makes (whose strictest
/// limit is `LIMIT`, and which neither drips nor expires at `NOW`).
fn refunds_during_growth_of<P: Policy>(name: &str, make: fn() -> P) {
    explore(name, move || {
        let policy = make();
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
                            let mut tally = Tally::default();
                            let first = limiter.check_at(&key, NOW);
                            if first.allowed() {
                                tally.admitted += 1;
                                if (t as u64 + key).is_multiple_of(2) {
                                    let given = limiter.refund_at(&key, NOW, first.at_ticks(), 1);
                                    assert_eq!(given, 1, "client {key}, thread {t}");
                                    tally.given += given;
                                }
                            }
                            tally.admitted += u64::from(limiter.check_at(&key, NOW).allowed());
                            (key, tally)
                        })
                        .collect::<Vec<(u64, Tally)>>()
                })
            })
            .collect();
        let tallies: Vec<(u64, Tally)> = threads
            .into_iter()
            .flat_map(|thread| thread.join().unwrap())
            .collect();
        for key in 1..=4 {
            let (admitted, given) = tallies
                .iter()
                .filter(|(k, _)| *k == key)
                .fold((0, 0), |(a, g), (_, t)| (a + t.admitted, g + t.given));
            let spent = admitted - given;
            assert!(spent <= LIMIT, "client {key}: {tallies:?}");
            assert_eq!(
                limiter.peek_at(&key, NOW),
                Some(LIMIT - spent),
                "client {key}: {tallies:?}"
            );
        }
        assert_eq!(limiter.tracked_clients(), 4);
    });
}

#[test]
fn refunds_token_bucket() {
    refunds_during_growth::<TokenBucket>("refunds_token_bucket");
}

#[test]
fn refunds_fixed_window() {
    refunds_during_growth::<FixedWindow>("refunds_fixed_window");
}

#[test]
fn refunds_sliding_window_counter() {
    refunds_during_growth::<SlidingWindowCounter>("refunds_sliding_window_counter");
}

/// The log's refunds replace its ring: each through whichever copy of
/// the client is live, both copies sharing one link.
#[test]
fn refunds_sliding_window() {
    refunds_during_growth::<SlidingWindow>("refunds_sliding_window");
}

#[test]
fn refunds_gcra() {
    refunds_during_growth::<Gcra>("refunds_gcra");
}

#[test]
fn refunds_leaky_bucket() {
    refunds_during_growth::<LeakyBucket>("refunds_leaky_bucket");
}

/// A log among several rules: each refund publishes a frame that names
/// the log's new ring, through whichever copy of the client is live (the
/// copies share the frame's ring until a refund replaces it on one).
#[test]
fn refunds_with_a_log_among_rules() {
    refunds_during_growth_of("refunds_with_a_log_among_rules", || {
        let rules: floodgate::RuleSet = "sliding-window:2/1000ticks,gcra:3/3000ticks"
            .parse()
            .unwrap();
        floodgate::policy::Compound::from_rules(&rules).unwrap()
    });
}
