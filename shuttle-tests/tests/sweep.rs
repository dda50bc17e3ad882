//! A table growth, a sweep and a `forget` in one run, racing checks and
//! inserts. Under the cfg a new table has two slots, so the three clients
//! made before the threads start have it rebuilt to eight slots (room for
//! four), and the ones the threads add have it rebuilt at least twice
//! more (eleven or twelve clients end in 32 slots), while the sweep and
//! `forget` remove clients from it.
#![cfg(floodgate_shuttle)]

use floodgate::policy::{
    FixedWindow, Gcra, LeakyBucket, Policy, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use floodgate::{Bounds, Config, Limiter, ManualClock};
use floodgate_shuttle_tests::explore;
use shuttle::sync::Arc;
use shuttle::thread;

/// The limit (over `WINDOW` ticks) and the time of the sweep and of every
/// call the threads make: ten windows after the first three clients'
/// admissions at 0, so those clients are idle then under every policy.
const LIMIT: u64 = 3;
const WINDOW: u64 = 1_000;
const LATER: u64 = 10 * WINDOW;

/// Checked by every thread but the sweeper.
const HOT: u64 = 0;

fn limiter<P: Policy>() -> Arc<Limiter<u64, P, ManualClock>> {
    let policy = P::new(Config::per_ticks(LIMIT, WINDOW).unwrap()).unwrap();
    Arc::new(Limiter::with_bounds(policy, ManualClock::new(0), Bounds::new()).unwrap())
}

/// Clients 1, 2 and 3 are admitted at 0. Then, all at `LATER`:
///
/// * the sweeper sweeps once;
/// * the forgetter forgets client 1, checks it again, and inserts clients
///   30 and 31;
/// * checker A checks client 2 and inserts 10, 11, 12;
/// * checker B asks client 3's `remaining_at` and inserts 20, 21, 22 with
///   `check_n_at` of cost 2;
/// * A, B and the forgetter each check the hot client twice.
///
/// Every client a thread creates or checks at `LATER` is published with
/// an admission at `LATER` already decided, so it is never idle at
/// `LATER`, and the sweep can only remove the three old clients, each at
/// most once. Under every schedule:
///
/// * client 1 is removed exactly once, by the sweep or by `forget`, so
///   `forget` answers true exactly when the sweep did not take it; its
///   later check then admits it afresh, with `LIMIT - 1` left;
/// * client 3 is always swept (a `remaining_at` changes no state, so it is
///   idle whenever the sweep looks) and answers `LIMIT`: from the old idle
///   state, or from a new one that call made after the sweep, which is
///   then the only way client 3 is still tracked at the end;
/// * client 2's check admits it with `LIMIT - 1` left, from its old state
///   (which is then not idle and stays) or a new one (the sweep came first
///   and took it): so the sweep removes 2 or 3 clients besides the one
///   `forget` did, `removed + forgot` is 2 or 3, and the two cases are
///   the same to every call (an idle client is as good as none);
/// * exactly `LIMIT` of the six hot checks are admitted;
/// * at the end, `tracked_clients` and `stored_clients` are both
///   11 + (1 if client 3 was made again): clients 1, 2, the hot one and
///   the eight new ones; every new client has `LIMIT - 1` left (cost 1) or
///   `LIMIT - 2` (cost 2).
fn growth_sweep_and_forget<P: Policy>(name: &str) {
    explore(name, || {
        let limiter = limiter::<P>();
        for key in 1..=3 {
            assert!(limiter.check_at(&key, 0).allowed());
        }
        let sweeper = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.sweep_at(LATER))
        };
        let forgetter = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                let forgot = limiter.forget(&1);
                let first_hot = limiter.check_at(&HOT, LATER).allowed();
                let again = limiter.check_at(&1, LATER);
                let hot = [first_hot, limiter.check_at(&HOT, LATER).allowed()];
                for key in [30, 31] {
                    assert!(limiter.check_at(&key, LATER).allowed(), "client {key}");
                }
                (forgot, again, hot)
            })
        };
        let checker_a = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                let two = limiter.check_at(&2, LATER);
                let mut hot = [false; 2];
                for (i, key) in [10, 11, 12].into_iter().enumerate() {
                    if i < 2 {
                        hot[i] = limiter.check_at(&HOT, LATER).allowed();
                    }
                    let first = limiter.check_at(&key, LATER);
                    assert!(first.allowed(), "client {key}: {first:?}");
                    assert_eq!(first.remaining(), LIMIT - 1, "client {key}: {first:?}");
                }
                (two, hot)
            })
        };
        let checker_b = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                let three = limiter.remaining_at(&3, LATER);
                let mut hot = [false; 2];
                for (i, key) in [20, 21, 22].into_iter().enumerate() {
                    let first = limiter.check_n_at(&key, LATER, 2);
                    assert!(first.allowed(), "client {key}: {first:?}");
                    assert_eq!(first.remaining(), LIMIT - 2, "client {key}: {first:?}");
                    if i < 2 {
                        hot[i] = limiter.check_at(&HOT, LATER).allowed();
                    }
                }
                (three, hot)
            })
        };
        let removed = sweeper.join().unwrap();
        let (forgot, again, hot_f) = forgetter.join().unwrap();
        let (two, hot_a) = checker_a.join().unwrap();
        let (three, hot_b) = checker_b.join().unwrap();

        assert!(again.allowed(), "client 1 afresh: {again:?}");
        assert_eq!(again.remaining(), LIMIT - 1, "client 1 afresh: {again:?}");
        assert!(two.allowed(), "client 2: {two:?}");
        assert_eq!(two.remaining(), LIMIT - 1, "client 2: {two:?}");
        assert_eq!(three, LIMIT, "client 3's remaining");
        let old_removed = removed + usize::from(forgot);
        assert!(
            (2..=3).contains(&old_removed),
            "swept {removed}, forgot client 1: {forgot}"
        );
        let admitted = [hot_f, hot_a, hot_b]
            .iter()
            .flatten()
            .filter(|&&allowed| allowed)
            .count();
        assert_eq!(admitted, LIMIT as usize, "hot admissions");

        assert_eq!(limiter.peek_at(&HOT, LATER), Some(0));
        assert_eq!(limiter.peek_at(&1, LATER), Some(LIMIT - 1));
        assert_eq!(limiter.peek_at(&2, LATER), Some(LIMIT - 1));
        let three_again = limiter.peek_at(&3, LATER);
        assert!(
            matches!(three_again, None | Some(LIMIT)),
            "client 3: {three_again:?}"
        );
        for key in [10, 11, 12, 30, 31] {
            assert_eq!(
                limiter.peek_at(&key, LATER),
                Some(LIMIT - 1),
                "client {key}"
            );
        }
        for key in [20, 21, 22] {
            assert_eq!(
                limiter.peek_at(&key, LATER),
                Some(LIMIT - 2),
                "client {key}"
            );
        }
        let clients = 11 + usize::from(three_again.is_some());
        assert_eq!(limiter.tracked_clients(), clients);
        assert_eq!(limiter.stored_clients(), clients);
    });
}

#[test]
fn sweep_token_bucket() {
    growth_sweep_and_forget::<TokenBucket>("sweep_token_bucket");
}

#[test]
fn sweep_fixed_window() {
    growth_sweep_and_forget::<FixedWindow>("sweep_fixed_window");
}

#[test]
fn sweep_sliding_window_counter() {
    growth_sweep_and_forget::<SlidingWindowCounter>("sweep_sliding_window_counter");
}

#[test]
fn sweep_gcra() {
    growth_sweep_and_forget::<Gcra>("sweep_gcra");
}

#[test]
fn sweep_leaky_bucket() {
    growth_sweep_and_forget::<LeakyBucket>("sweep_leaky_bucket");
}

#[test]
fn sweep_sliding_window() {
    growth_sweep_and_forget::<SlidingWindow>("sweep_sliding_window");
}
