//! Weighted requests raced on one client: a cost-`n` admission is one
//! atomic step (SPEC.md, "Weighted requests"), so two of them together never
//! admit more than `L` units and a racing thread never sees, or leaves, part
//! of one. Then a weighted request racing an idle sweep and a tier reload,
//! through the limiter's real retire, remove and replace protocols.
#![cfg(floodgate_loom)]

use floodgate::policy::{
    FixedWindow, Gcra, LeakyBucket, Policy, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use floodgate::tiers::{TierSpec, Tiers};
use floodgate::{Config, Limiter, ManualClock, PolicyKind, RateLimiter};
use floodgate_loom_tests::{explore, Answer, Bare, Call, Run, Scenario};
use loom::sync::Arc;
use loom::thread;

use Call::{Check, CheckN, Remaining};

const KEY: u64 = 7;

/// `L = 3`: the smallest limit where two requests of cost 2 cannot both
/// pass but a half of one could still fit beside the other. The drip
/// policies get `W = 30` (`I = 10`), the others `W = 10`; every time below
/// sits inside the first period.
fn config<P: Policy>() -> Config {
    let window = if P::KIND.drips() { 30 } else { 10 };
    Config::per_ticks(3, window).expect("a valid config")
}

/// Two requests of cost 2 at one instant, `L = 3`: exactly one is admitted
/// (2 units), and exactly 1 unit is left. A request admitted in two steps
/// could leave its racer's first unit spent and itself refused: then the
/// probes find 0 left, or 3 units admitted in all.
fn two_of_cost_two<P: Policy>() {
    let threads = vec![vec![CheckN(5, 2)], vec![CheckN(5, 2)]];
    explore::<Bare<P>, _>(
        Scenario {
            config: config::<P>(),
            before: vec![],
            threads: threads.clone(),
            probes: vec![Remaining(5), Check(5), Check(5)],
            real_time: false,
        },
        move |_, run: &Run| {
            assert_eq!(run.admitted(), 1, "{run:?}");
            assert_eq!(run.admitted_units(&threads), 2, "{run:?}");
            assert_eq!(run.probes[0], Answer::Remaining(1), "{run:?}");
            assert!(run.probes[1].admitted() && !run.probes[2].admitted());
        },
    );
}

/// A request of cost 2 and one of cost 1, racing after one unit was spent
/// (`L = 3`, 2 left): whichever wins, the other is refused iff it no longer
/// fits, never half-admitted; units admitted plus units left is always 2.
fn cost_two_beside_cost_one<P: Policy>() {
    let threads = vec![vec![CheckN(5, 2)], vec![CheckN(5, 1)]];
    explore::<Bare<P>, _>(
        Scenario {
            config: config::<P>(),
            before: vec![Check(5)],
            threads: threads.clone(),
            probes: vec![Remaining(5)],
            real_time: true,
        },
        move |_, run: &Run| {
            let Answer::Remaining(left) = run.probes[0] else {
                unreachable!()
            };
            assert_eq!(run.admitted_units(&threads) + left, 2, "{run:?}");
            assert!(run.admitted() >= 1, "one of them always fits: {run:?}");
        },
    );
}

macro_rules! weighted_models {
    ($($module:ident: $policy:ty;)*) => {$(
        mod $module {
            use super::*;

            #[test]
            fn two_of_cost_two_admit_one_whole() {
                two_of_cost_two::<$policy>();
            }

            #[test]
            fn cost_two_beside_cost_one_is_never_split() {
                cost_two_beside_cost_one::<$policy>();
            }

            #[test]
            fn a_weighted_check_racing_a_sweep() {
                sweep_races_weighted_check::<$policy>();
            }
        }
    )*};
}

weighted_models! {
    sliding_window: SlidingWindow;
    fixed_window: FixedWindow;
    sliding_window_counter: SlidingWindowCounter;
    gcra: Gcra;
    leaky_bucket: LeakyBucket;
    token_bucket: TokenBucket;
}

/// `L = 2`, `W = 100`, one admission of cost 2 at 0: the client is idle
/// from 200 on (`sliding-window-counter`'s previous window still counts
/// until then). A sweep at 250 races a check of cost 2 at 250: it is
/// admitted whether it met the old state or a fresh one, all of it, so
/// nothing is left at 250, exactly one client is tracked, and the sweep
/// removed at most the one client.
fn sweep_races_weighted_check<P: Policy>() {
    floodgate_loom_tests::model(|| {
        let policy = P::new(Config::per_ticks(2, 100).unwrap()).unwrap();
        let limiter =
            Arc::new(Limiter::<u64, P, _>::with_clock(policy, ManualClock::new(0)).unwrap());
        assert!(limiter.check_n_at(&KEY, 0, 2).allowed());
        let sweeper = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.sweep_at(250))
        };
        let decision = limiter.check_n_at(&KEY, 250, 2);
        let removed = sweeper.join().unwrap();
        assert!(decision.allowed(), "idle at 250 either way: {decision:?}");
        assert_eq!(decision.remaining(), 0, "{decision:?}");
        assert!(removed <= 1);
        assert_eq!(limiter.remaining_at(&KEY, 250), 0);
        assert!(!limiter.check_at(&KEY, 250).allowed());
        assert_eq!(limiter.tracked_clients(), 1);
        assert_eq!(limiter.stored_clients(), 1);
    });
}

/// A registry of one tier, `free`, applying `spec` to every client.
fn one_tier(spec: TierSpec) -> Tiers<u64, fn(&u64) -> &'static str, ManualClock> {
    let resolver: fn(&u64) -> &'static str = |_| "free";
    Tiers::with_clock("free", spec, resolver, ManualClock::new(0)).unwrap()
}

/// A reload from `L = 2` to `L = 4` racing a check of cost 2, after one
/// unit was spent: under the old rule it does not fit (1 left), under the
/// new one it does (3 left, the spent unit carried over). Either way what
/// is left afterwards is `4 − 1 −` what it was admitted, never a part.
fn reload_races_weighted_check(policy: PolicyKind) {
    floodgate_loom_tests::model(move || {
        let spec =
            move |limit| TierSpec::new(policy, Config::per_ticks(limit, 400).unwrap()).unwrap();
        let tiers = Arc::new(one_tier(spec(2)));
        assert!(tiers.check_at(&KEY, 0).allowed());
        let reloader = {
            let tiers = Arc::clone(&tiers);
            thread::spawn(move || tiers.reload("free", spec(4)).unwrap())
        };
        let decision = tiers.check_n_at(&KEY, 0, 2);
        reloader.join().unwrap();
        let admitted = if decision.allowed() { 2 } else { 0 };
        assert_eq!(
            tiers.remaining_at(&KEY, 0),
            4 - 1 - admitted,
            "{decision:?}"
        );
    });
}

/// A reload from `L = 3` to `L = 5` after 2 units were spent, then two
/// racing first calls of cost 2 carry the client over: the spend is carried
/// exactly once, so exactly one of them fits (5 − 2 = 3 left) and 1 unit is
/// left.
fn weighted_carry_over(policy: PolicyKind) {
    floodgate_loom_tests::model(move || {
        let spec =
            move |limit| TierSpec::new(policy, Config::per_ticks(limit, 500).unwrap()).unwrap();
        let tiers = Arc::new(one_tier(spec(3)));
        assert!(tiers.check_n_at(&KEY, 0, 2).allowed());
        tiers.reload("free", spec(5)).unwrap();
        let other = {
            let tiers = Arc::clone(&tiers);
            thread::spawn(move || tiers.check_n_at(&KEY, 0, 2).allowed())
        };
        let mine = tiers.check_n_at(&KEY, 0, 2).allowed();
        let theirs = other.join().unwrap();
        assert!(mine != theirs, "exactly one of two fits: {mine} {theirs}");
        assert_eq!(tiers.remaining_at(&KEY, 0), 1);
    });
}

macro_rules! tier_models {
    ($($module:ident: $kind:expr;)*) => {$(
        mod $module {
            use super::*;

            #[test]
            fn a_reload_races_a_weighted_check() {
                reload_races_weighted_check($kind);
            }

            #[test]
            fn weighted_first_calls_carry_over_once() {
                weighted_carry_over($kind);
            }
        }
    )*};
}

tier_models! {
    tier_sliding_window: PolicyKind::SlidingWindow;
    tier_fixed_window: PolicyKind::FixedWindow;
    tier_sliding_window_counter: PolicyKind::SlidingWindowCounter;
    tier_gcra: PolicyKind::Gcra;
    tier_leaky_bucket: PolicyKind::LeakyBucket;
    tier_token_bucket: PolicyKind::TokenBucket;
}
