//! `in-flight` rules under loom: a release racing a check on one client's
//! word (alone and in a frame of several rules), and a release racing a
//! sweep or a rebuild's move: a release is one CAS step, so a check
//! decided before it sees the units still held and one after sees them
//! back, a held client is never swept, and a release that meets a moved
//! client looks again where it went.
#![cfg(floodgate_loom)]

use floodgate::policy::{Compound, InFlight, Pair, Policy};
use floodgate::{Bounds, Config, Limiter, ManualClock, RateLimiter, RuleSet};
use loom::sync::Arc;
use loom::thread;

const KEY: u64 = 7;

/// `in-flight:1`, held at 0: a release races a check. The release always
/// gives back 1 (nothing else takes the unit away), the check is admitted
/// exactly when the release came first, and what is held at the end is
/// what the check took. A lost update (a step from a stale word) would
/// leave 0 held after an admission, or 1 after a refusal.
fn a_release_races_a_check<P: Policy>(limiter: Limiter<u64, P, ManualClock>) {
    let limiter = Arc::new(limiter);
    assert!(limiter.check_at(&KEY, 0).allowed());
    let checker = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.check_at(&KEY, 1).allowed())
    };
    let released = limiter.release_at(&KEY, 1, 1);
    let admitted = checker.join().unwrap();
    assert_eq!(released, 1);
    let held_now = u64::from(limiter.remaining_at(&KEY, 1) == 0);
    assert_eq!(held_now, u64::from(admitted), "admitted {admitted}");
}

/// `in-flight:2`, one unit held at 0: a release of it races a check that
/// takes another. Both land in every order: the release gives back 1, the
/// check is admitted, and one unit is held at the end. A release computed
/// from a word the CAS did not expect (a load then a store) overwrites
/// the admission and leaves none held.
fn a_release_and_an_admission_both_land<P: Policy>(limiter: Limiter<u64, P, ManualClock>) {
    let limiter = Arc::new(limiter);
    assert!(limiter.check_at(&KEY, 0).allowed());
    let checker = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.check_at(&KEY, 1).allowed())
    };
    let released = limiter.release_at(&KEY, 1, 1);
    assert!(checker.join().unwrap(), "room for one more in every order");
    assert_eq!(released, 1);
    assert_eq!(
        limiter.remaining_at(&KEY, 1),
        1,
        "the admission's unit held"
    );
}

#[test]
fn a_release_and_an_admission_both_land_alone() {
    floodgate_loom_tests::model(|| {
        let policy = InFlight::new(Config::in_flight(2).unwrap()).unwrap();
        a_release_and_an_admission_both_land(
            Limiter::with_clock(policy, ManualClock::new(0)).unwrap(),
        );
    });
}

#[test]
fn a_release_and_an_admission_both_land_in_a_frame() {
    floodgate_loom_tests::model(|| {
        let rules: RuleSet = "fixed-window:5/100ticks,in-flight:2".parse().unwrap();
        let policy = Compound::from_rules(&rules).unwrap();
        a_release_and_an_admission_both_land(
            Limiter::with_clock(policy, ManualClock::new(0)).unwrap(),
        );
    });
}

#[test]
fn a_release_and_an_admission_both_land_in_a_pair() {
    floodgate_loom_tests::model(|| {
        let rules: RuleSet = "gcra:5/100ticks,in-flight:2".parse().unwrap();
        let policy = Pair::from_rules(&rules).unwrap();
        a_release_and_an_admission_both_land(
            Limiter::with_clock(policy, ManualClock::new(0)).unwrap(),
        );
    });
}

#[test]
fn a_release_races_a_check_in_a_pair() {
    floodgate_loom_tests::model(|| {
        let rules: RuleSet = "in-flight:1,token-bucket:5/100ticks".parse().unwrap();
        let policy = Pair::from_rules(&rules).unwrap();
        a_release_races_a_check(Limiter::with_clock(policy, ManualClock::new(0)).unwrap());
    });
}

/// `in-flight:2` (with `rules`), client 1 holding 2 at 0: a release of
/// one races a new client whose insertion moves client 1 into a larger
/// table (the guard dropped during a rebuild). The release gives back 1
/// in every order, client 1 has 1 left, and its next check takes it. A
/// release that wrote a frozen state, or gave up on one instead of
/// looking again, leaves client 1 with nothing.
fn a_release_races_a_move<P: Policy>(policy: P) {
    let limiter = Arc::new(Limiter::<u64, P, _>::with_clock(policy, ManualClock::new(0)).unwrap());
    assert!(limiter.check_n_at(&1, 0, 2).allowed());
    let inserter = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.check_at(&2, 10))
    };
    let released = limiter.release_at(&1, 10, 1);
    assert!(inserter.join().unwrap().allowed());
    assert_eq!(released, 1, "client 1 held its units throughout");
    assert_eq!(limiter.peek_at(&1, 10), Some(1), "the release moved");
    assert!(limiter.check_at(&1, 10).allowed());
    assert!(!limiter.check_at(&1, 10).allowed());
    assert_eq!(limiter.tracked_clients(), 2);
}

#[test]
fn a_release_races_a_move_alone() {
    floodgate_loom_tests::model(|| {
        a_release_races_a_move(InFlight::new(Config::in_flight(2).unwrap()).unwrap());
    });
}

#[test]
fn a_release_races_a_move_in_a_pair() {
    floodgate_loom_tests::model(|| {
        let rules: RuleSet = "gcra:5/100ticks,in-flight:2".parse().unwrap();
        a_release_races_a_move(Pair::from_rules(&rules).unwrap());
    });
}

#[test]
fn a_release_races_a_check_alone() {
    floodgate_loom_tests::model(|| {
        let policy = InFlight::new(Config::in_flight(1).unwrap()).unwrap();
        a_release_races_a_check(Limiter::with_clock(policy, ManualClock::new(0)).unwrap());
    });
}

#[test]
fn a_release_races_a_check_in_a_frame() {
    floodgate_loom_tests::model(|| {
        let rules: RuleSet = "fixed-window:5/100ticks,in-flight:1".parse().unwrap();
        let policy = Compound::from_rules(&rules).unwrap();
        a_release_races_a_check(Limiter::with_clock(policy, ManualClock::new(0)).unwrap());
    });
}

/// `in-flight:2`, one unit held at 0: a sweep races the release of it. The
/// client is not idle until the release lands, so the sweep removes it
/// only after: the release gives back 1 in every order, and the sweep's
/// count says whether the client is still there (holding nothing, if it
/// is). A sweep that ignored what is held would remove it first, and the
/// release would find no client.
#[test]
fn a_release_races_a_sweep() {
    floodgate_loom_tests::model(|| {
        let policy = InFlight::new(Config::in_flight(2).unwrap()).unwrap();
        let limiter = Arc::new(
            Limiter::<u64, InFlight, _>::with_bounds(
                policy,
                ManualClock::new(0),
                Bounds::new().evict_idle(),
            )
            .unwrap(),
        );
        assert!(limiter.check_at(&KEY, 0).allowed());
        let sweeper = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.sweep_at(50))
        };
        let released = limiter.release_at(&KEY, 50, 1);
        let removed = sweeper.join().unwrap();
        assert_eq!(released, 1, "held until the release");
        assert_eq!(limiter.tracked_clients(), 1 - removed);
        let kept = RateLimiter::peek_at(&*limiter, &KEY, 50);
        assert_eq!(kept, (removed == 0).then_some(2), "removed {removed}");
    });
}
