//! Removing clients under traffic: an idle sweep racing a check of the
//! client it judges (the sweep's count exact, told by what the check
//! observed), and a tier reload carried over by racing checks. The
//! limiter runs its real retire, remove and replace protocols over the
//! library's loom-visible map and pointer.
#![cfg(floodgate_loom)]

use floodgate::policy::{FixedWindow, Gcra, LeakyBucket, Policy, SlidingWindow, TokenBucket};
use floodgate::tiers::{TierSpec, Tiers};
use floodgate::{Config, Limiter, ManualClock, PolicyKind, RateLimiter};
use loom::sync::Arc;
use loom::thread;

const KEY: u64 = 7;

/// A registry of one tier, `free`, applying `spec` to every client.
fn one_tier(spec: TierSpec) -> Tiers<u64, fn(&u64) -> &'static str, ManualClock> {
    let resolver: fn(&u64) -> &'static str = |_| "free";
    Tiers::with_clock("free", spec, resolver, ManualClock::new(0)).unwrap()
}

/// `L = 1`, `W = 100`: the client's one admission at 0 makes it idle from
/// 100 on. A sweep at 150 races a check at 150: either the sweep retires and
/// removes the idle state and the check creates a fresh one (origin 150), or
/// the check lands first and the sweep finds the client busy. For the
/// policies whose grid starts at the client's origin, what a second check
/// is told says which: the next drip or window is 50 ticks away on the old
/// grid, 100 on a fresh one. So the sweep's count is exact: 1 iff the check
/// met a fresh client. Either way exactly one admission at 150.
fn sweep_races_check<P: Policy>() {
    floodgate_loom_tests::model(|| {
        let policy = P::new(Config::per_ticks(1, 100).unwrap()).unwrap();
        let limiter =
            Arc::new(Limiter::<u64, P, _>::with_clock(policy, ManualClock::new(0)).unwrap());
        assert!(limiter.check_at(&KEY, 0).allowed());
        let sweeper = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.sweep_at(150))
        };
        let admitted = limiter.check_at(&KEY, 150).allowed();
        let removed = sweeper.join().unwrap();
        assert!(admitted, "the client was idle at 150 either way");
        let probe = limiter.check_at(&KEY, 150);
        assert!(!probe.allowed(), "one admission at 150");
        let fresh = match probe.retry_after_ticks().unwrap_or(u64::MAX) {
            50 => false,
            100 => true,
            other => panic!("retry_after {other}: neither grid"),
        };
        assert_eq!(removed, usize::from(fresh), "the sweep's count");
        assert_eq!(limiter.tracked_clients(), 1);
        assert_eq!(limiter.stored_clients(), 1);
    });
}

/// The same client, idle from 100, and a sweep at 100 racing a check that
/// carries an older `now`, 90 (threads racing on a real clock). At 90 the
/// client is spent, so the check stores nothing and cannot keep it: the
/// sweep removes exactly one client, whatever the order. If the check
/// reads the old state it is refused with 10 ticks to wait. If it comes
/// after the sweep it re-creates the client, no earlier than the sweep's
/// 100: the drip policies (no origin kept) start their state there
/// (`TAT = 100`, the bucket full from 100) and judge the call at its own
/// 90, refused the same way; the sliding log, which keeps its origin,
/// judges it at 100 and admits it, stamped 100. Either way one admission
/// in [90, 100]: a check at 100 is admitted iff the first was not. (The
/// check runs on the spawned thread: a rejection only reads, and on the
/// main thread loom ran this model's first schedule alone.)
fn sweep_races_an_older_check<P: Policy>() {
    floodgate_loom_tests::model(|| {
        let policy = P::new(Config::per_ticks(1, 100).unwrap()).unwrap();
        let limiter =
            Arc::new(Limiter::<u64, P, _>::with_clock(policy, ManualClock::new(0)).unwrap());
        assert!(limiter.check_at(&KEY, 0).allowed());
        let early = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check_at(&KEY, 90))
        };
        let removed = limiter.sweep_at(100);
        let early = early.join().unwrap();
        assert_eq!(removed, 1, "a rejection cannot keep an idle client");
        if P::KIND.drips() {
            assert!(!early.allowed(), "admitted at 90: {early:?}");
        }
        if !early.allowed() {
            assert_eq!(
                early.retry_after_ticks().unwrap_or(u64::MAX),
                10,
                "{early:?}"
            );
        }
        let later = limiter.check_at(&KEY, 100).allowed();
        assert_eq!(later, !early.allowed(), "one admission in [90, 100]");
        assert_eq!(limiter.tracked_clients(), 1);
        assert_eq!(limiter.stored_clients(), 1);
    });
}

/// The same race with a client that is *not* idle (one of two spent, and
/// the sweep at the same instant): the sweep must never remove it, so the
/// racing check takes the last one and a third is rejected.
fn sweep_never_removes_a_busy_client<P: Policy>() {
    floodgate_loom_tests::model(|| {
        let policy = P::new(Config::per_ticks(2, 100).unwrap()).unwrap();
        let limiter =
            Arc::new(Limiter::<u64, P, _>::with_clock(policy, ManualClock::new(0)).unwrap());
        assert!(limiter.check_at(&KEY, 50).allowed());
        let sweeper = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.sweep_at(60))
        };
        assert!(limiter.check_at(&KEY, 60).allowed());
        assert_eq!(sweeper.join().unwrap(), 0);
        assert!(!limiter.check_at(&KEY, 60).allowed());
    });
}

/// A tier reloaded from `L = 2` to `L = 3` after one admission, then two
/// threads' first calls after the reload race to carry the client over (and
/// each makes one check): the spent one is carried exactly once, so exactly
/// two more are admitted at the frozen instant and nothing is left.
fn racing_carry_over(policy: PolicyKind) {
    floodgate_loom_tests::model(move || {
        let spec =
            move |limit| TierSpec::new(policy, Config::per_ticks(limit, 300).unwrap()).unwrap();
        let tiers = Arc::new(one_tier(spec(2)));
        assert!(tiers.check_at(&KEY, 0).allowed());
        tiers.reload("free", spec(3)).unwrap();
        let other = {
            let tiers = Arc::clone(&tiers);
            thread::spawn(move || tiers.check_at(&KEY, 0).allowed())
        };
        let mine = tiers.check_at(&KEY, 0).allowed();
        let theirs = other.join().unwrap();
        assert!(mine && theirs, "3 − 1 spent = 2 left for the two racers");
        assert_eq!(tiers.remaining_at(&KEY, 0), 0);
        assert!(!tiers.check_at(&KEY, 0).allowed());
    });
}

/// A reload racing a client's checks: whichever rule each check meets, the
/// total is exact. Two checks under `L = 2` after one admission: the old
/// rule leaves one, the new rule (`L = 4`) three minus what was spent.
/// Whatever the order, what is left afterwards is `4 − everything admitted`.
fn reload_races_checks(policy: PolicyKind) {
    floodgate_loom_tests::model(move || {
        let spec =
            move |limit| TierSpec::new(policy, Config::per_ticks(limit, 400).unwrap()).unwrap();
        let tiers = Arc::new(one_tier(spec(2)));
        assert!(tiers.check_at(&KEY, 0).allowed());
        let reloader = {
            let tiers = Arc::clone(&tiers);
            thread::spawn(move || tiers.reload("free", spec(4)).unwrap())
        };
        let admitted = 1 + (0..2).filter(|_| tiers.check_at(&KEY, 0).allowed()).count() as u64;
        reloader.join().unwrap();
        assert_eq!(tiers.remaining_at(&KEY, 0), 4 - admitted);
    });
}

#[test]
fn token_bucket_sweep_races_check() {
    sweep_races_check::<TokenBucket>();
}

#[test]
fn fixed_window_sweep_races_check() {
    sweep_races_check::<FixedWindow>();
}

#[test]
fn gcra_sweep_races_an_older_check() {
    sweep_races_an_older_check::<Gcra>();
}

#[test]
fn token_bucket_sweep_races_an_older_check() {
    sweep_races_an_older_check::<TokenBucket>();
}

#[test]
fn leaky_bucket_sweep_races_an_older_check() {
    sweep_races_an_older_check::<LeakyBucket>();
}

#[test]
fn sliding_window_sweep_races_an_older_check() {
    sweep_races_an_older_check::<SlidingWindow>();
}

#[test]
fn gcra_sweep_never_removes_a_busy_client() {
    sweep_never_removes_a_busy_client::<Gcra>();
}

#[test]
fn sliding_window_sweep_never_removes_a_busy_client() {
    sweep_never_removes_a_busy_client::<SlidingWindow>();
}

#[test]
fn gcra_racing_carry_over() {
    racing_carry_over(PolicyKind::Gcra);
}

#[test]
fn sliding_window_racing_carry_over() {
    racing_carry_over(PolicyKind::SlidingWindow);
}

#[test]
fn fixed_window_racing_carry_over() {
    racing_carry_over(PolicyKind::FixedWindow);
}

#[test]
fn gcra_reload_races_checks() {
    reload_races_checks(PolicyKind::Gcra);
}

#[test]
fn token_bucket_reload_races_checks() {
    reload_races_checks(PolicyKind::TokenBucket);
}
