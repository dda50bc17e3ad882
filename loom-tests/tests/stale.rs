//! Stale times and resets under traffic: a sweep racing a call whose `now`
//! is older than the sweep's, a carry-over made by a stale call, and
//! `forget` racing a check. The limiter runs its real sweep, create, carry
//! and forget protocols over the library's loom-visible map.
#![cfg(floodgate_loom)]

use floodgate::policy::{Gcra, Policy, SlidingWindow};
use floodgate::tiers::{TierSpec, Tiers};
use floodgate::{Config, Limiter, ManualClock, PolicyKind, RateLimiter};
use loom::sync::Arc;
use loom::thread;

const KEY: u64 = 7;

/// `sliding-window`, `L = 1`, `W = 100`: admitted at 0, so idle from 100. A
/// sweep at 100 races a call read at 99. Either the call comes first (and
/// is rejected: 0 is still inside its window), or the sweep evicts the
/// client first and the call re-creates it — no earlier than the sweep's
/// time, so its admission is stamped at 100 and a call at 199 is still
/// inside that window. Without the floor the re-created client would start
/// at 99, and 199 would be admitted: two admissions 100 ticks apart, the
/// first of them read at 99.
#[test]
fn a_stale_call_never_meets_a_client_younger_than_its_sweep() {
    floodgate_loom_tests::model(|| {
        let policy = SlidingWindow::new(Config::per_ticks(1, 100).unwrap()).unwrap();
        let limiter = Arc::new(
            Limiter::<u64, SlidingWindow, _>::with_clock(policy, ManualClock::new(0)).unwrap(),
        );
        assert!(limiter.check_at(&KEY, 0).allowed());
        let sweeper = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.sweep_at(100))
        };
        let stale = limiter.check_at(&KEY, 99);
        let removed = sweeper.join().unwrap();
        let probe = limiter.check_at(&KEY, 199);
        if stale.allowed() {
            assert_eq!(removed, 1, "admitted at 99 only on a re-created client");
            assert!(!probe.allowed(), "the stale admission is stamped at 100");
            assert_eq!(probe.retry_after_ticks().unwrap_or(u64::MAX), 1);
        } else {
            // Rejected on the old state; the sweep may still have found it
            // idle at 100 (the rejection changed nothing).
            assert_eq!(stale.retry_after_ticks().unwrap_or(u64::MAX), 1);
            assert!(probe.allowed());
        }
        assert_eq!(limiter.tracked_clients(), 1);
    });
}

/// `forget` racing a check of the same client (`L = 2`, one spent): the
/// check lands on the old state (and is forgotten with it) or on a fresh
/// one, never on both and never lost in between. Afterwards the client has
/// state iff the check came after the forget, and then it has spent one.
fn forget_races_check<P: Policy>() {
    floodgate_loom_tests::model(|| {
        let policy = P::new(Config::per_ticks(2, 100).unwrap()).unwrap();
        let limiter =
            Arc::new(Limiter::<u64, P, _>::with_clock(policy, ManualClock::new(0)).unwrap());
        assert!(limiter.check_at(&KEY, 0).allowed());
        let forgetter = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.forget(&KEY))
        };
        let checked = limiter.check_at(&KEY, 0);
        assert!(forgetter.join().unwrap(), "the client had state");
        assert!(checked.allowed());
        match limiter.peek_at(&KEY, 0) {
            // The check ran first, on the old state, which is gone.
            None => assert_eq!(checked.remaining(), 0),
            // The check re-created the client after the forget.
            Some(left) => {
                assert_eq!(checked.remaining(), 1);
                assert_eq!(left, 1);
            }
        }
        assert_eq!(
            limiter.tracked_clients(),
            usize::from(limiter.peek_at(&KEY, 0).is_some())
        );
    });
}

#[test]
fn gcra_forget_races_check() {
    forget_races_check::<Gcra>();
}

#[test]
fn sliding_window_forget_races_check() {
    forget_races_check::<SlidingWindow>();
}

/// A tier of `fixed-window`, `L = 2`, `W = 100`, drained at 100 (window 1),
/// reloaded to `L = 3`; two calls race to carry it over, one of them read
/// at 99 (window 0). Whoever carries, the spend lands in window 1, where
/// the new rule leaves exactly one: the two calls admit one between them.
/// Carried at 99, the spend would land in window 0 and window 1 would open
/// afresh at 100 with three more.
#[test]
fn a_stale_carry_over_lands_in_the_latest_window() {
    floodgate_loom_tests::model(|| {
        let spec = |limit| {
            TierSpec::new(
                PolicyKind::FixedWindow,
                Config::per_ticks(limit, 100).unwrap(),
            )
        };
        let tiers = Arc::new(
            Tiers::with_clock(
                "free",
                spec(2).unwrap(),
                |_: &u64| "free",
                ManualClock::new(0),
            )
            .unwrap(),
        );
        assert!(tiers.check_at(&KEY, 0).allowed()); // the origin: windows from 0
        assert!(tiers.check_at(&KEY, 100).allowed());
        assert!(tiers.check_at(&KEY, 100).allowed());
        tiers.reload("free", spec(3).unwrap()).unwrap();
        let stale = {
            let tiers = Arc::clone(&tiers);
            thread::spawn(move || tiers.check_at(&KEY, 99).allowed())
        };
        let current = tiers.check_at(&KEY, 100).allowed();
        let stale = stale.join().unwrap();
        assert_eq!(
            u8::from(stale) + u8::from(current),
            1,
            "3 − 2 spent in window 1"
        );
        assert_eq!(tiers.remaining_at(&KEY, 100), 0);
        assert_eq!(tiers.remaining_at(&KEY, 200), 3);
    });
}
