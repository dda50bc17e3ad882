//! A refund racing a check on one client's word: the refund is one CAS step
//! (SPEC.md, "Giving units back"), so a check decided before it sees none of
//! the units it gives back and one decided after sees all of them, and no
//! interleaving loses either's write. And a refund racing the store's
//! removals, a sweep and `forget`, over the limiter's real retire and
//! remove protocols: a refund never creates a client, never lands on a
//! removed one, and never gives back what a removal already forgot. And a
//! refund racing the move of a rebuild: it lands once, on the state before
//! its freeze (and moves with it) or on the moved one. The sliding log's
//! refund replaces its ring (`policy::sliding_window`, "Giving units
//! back"): the same models run on it, and two refunds of one admission
//! race each other's rings. (Many threads refunding across moves:
//! `shuttle-tests/tests/refunds.rs`.)
#![cfg(floodgate_loom)]

use floodgate::policy::{
    FixedWindow, Gcra, LeakyBucket, Policy, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use floodgate::{Bounds, Config, Limiter, ManualClock, RateLimiter};
use floodgate_loom_tests::{explore, Answer, Bare, Call, Run, Scenario};
use loom::sync::Arc;
use loom::thread;

const KEY: u64 = 7;

use Call::{CheckN, Refund, Remaining};

/// `L = 3`, spent whole at tick 0; the drip policies get `W = 30`
/// (`I = 10`), the windows `W = 10`: tick 1 is inside every first period.
fn config<P: Policy>() -> Config {
    let window = if P::KIND.drips() { 30 } else { 10 };
    Config::per_ticks(3, window).expect("a valid config")
}

/// A refund of 2 of the 3 units admitted at tick 0 races a request of
/// cost 2 at tick 1: the refund always gives back 2 (nothing else moves
/// the state), and the request is admitted exactly when the refund came
/// first; the units left and the units admitted sum to the 2 given back.
fn a_refund_races_a_check<P: Policy>() {
    let threads = vec![vec![Refund(1, 0, 2)], vec![CheckN(1, 2)]];
    explore::<Bare<P>, _>(
        Scenario {
            config: config::<P>(),
            before: vec![CheckN(0, 3)],
            threads: threads.clone(),
            probes: vec![Remaining(1)],
            real_time: false,
        },
        move |_, run: &Run| {
            assert_eq!(run.threads[0][0], Answer::Refunded(2), "{run:?}");
            let Answer::Remaining(left) = run.probes[0] else {
                panic!("{run:?}")
            };
            assert_eq!(run.admitted_units(&threads) + left, 2, "{run:?}");
        },
    );
}

/// Both write whichever comes first: 2 of the 3 units spent at tick 0,
/// a refund of 1 of them races a request of cost 1 at tick 1. The refund
/// gives back 1, the request is admitted, and 1 unit is left, in every
/// order. A step computed from a word the CAS did not expect (a lost
/// update) leaves 2: the request's admission overwritten.
fn a_refund_and_an_admission_both_land<P: Policy>() {
    let threads = vec![vec![Refund(1, 0, 1)], vec![CheckN(1, 1)]];
    explore::<Bare<P>, _>(
        Scenario {
            config: config::<P>(),
            before: vec![CheckN(0, 2)],
            threads,
            probes: vec![Remaining(1)],
            real_time: false,
        },
        |_, run: &Run| {
            assert_eq!(run.threads[0][0], Answer::Refunded(1), "{run:?}");
            assert!(run.threads[1][0].admitted(), "{run:?}");
            assert_eq!(run.probes[0], Answer::Remaining(1), "{run:?}");
        },
    );
}

/// `L = 1`, `W = 100`, spent at 0. A refund at 50 of that admission races
/// a sweep at 50. The client is busy until the refund lands, so the sweep
/// removes it only after it: the refund gives back its 1 in every order,
/// and the sweep's count says whether the client is still there (full, if
/// it is). A refund that followed a client the sweep retired, instead of
/// looking again, would give nothing back.
fn a_refund_races_a_sweep<P: Policy>() {
    floodgate_loom_tests::model(|| {
        let policy = P::new(Config::per_ticks(1, 100).unwrap()).unwrap();
        let limiter =
            Arc::new(Limiter::<u64, P, _>::with_clock(policy, ManualClock::new(0)).unwrap());
        assert!(limiter.check_at(&KEY, 0).allowed());
        let sweeper = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.sweep_at(50))
        };
        let given = limiter.refund_at(&KEY, 50, 0, 1);
        let removed = sweeper.join().unwrap();
        assert_eq!(given, 1, "the client was busy until the refund");
        assert_eq!(limiter.tracked_clients(), 1 - removed);
        let kept = limiter.peek_at(&KEY, 50);
        assert_eq!(kept, (removed == 0).then_some(1), "removed {removed}");
    });
}

/// `L = 2`, `W = 100`, one unit spent at 0. A refund at 10 of it races
/// `forget`: the refund gives back 1 if it came first and 0 after (it
/// finds no client, and creates none); `forget` removes the client either
/// way, and nothing is left.
fn a_refund_races_forget<P: Policy>() {
    floodgate_loom_tests::model(|| {
        let policy = P::new(Config::per_ticks(2, 100).unwrap()).unwrap();
        let limiter =
            Arc::new(Limiter::<u64, P, _>::with_clock(policy, ManualClock::new(0)).unwrap());
        assert!(limiter.check_at(&KEY, 0).allowed());
        let forgetter = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || RateLimiter::forget(&*limiter, &KEY))
        };
        let given = limiter.refund_at(&KEY, 10, 0, 1);
        let forgot = forgetter.join().unwrap();
        assert!(forgot, "the client had state until forget");
        assert!(given <= 1);
        assert_eq!(
            limiter.peek_at(&KEY, 10),
            None,
            "given {given}: nothing left"
        );
        assert_eq!(limiter.tracked_clients(), 0);
    });
}

/// `L = 2`, `W = 1000`: client 1 has spent both units at 0 and fills the
/// table (under loom a new table has room for one client). A refund of one
/// of them at 10 races the insert of client 2, which moves client 1 into a
/// larger table. The refund lands on the state before the freeze (and the
/// move carries it) or on the moved state, never on neither: it gives back
/// 1 in every order, client 1 has 1 left, and its next check takes it. A
/// refund that wrote a frozen state, or gave up on one instead of looking
/// again, leaves client 1 with nothing.
fn a_refund_races_a_move<P: Policy>() {
    floodgate_loom_tests::model(|| {
        let policy = P::new(Config::per_ticks(2, 1_000).unwrap()).unwrap();
        let limiter = Arc::new(
            Limiter::<u64, P, _>::with_bounds(policy, ManualClock::new(0), Bounds::new()).unwrap(),
        );
        assert!(limiter.check_n_at(&1, 0, 2).allowed());
        let inserter = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check_at(&2, 10))
        };
        let given = limiter.refund_at(&1, 10, 0, 1);
        assert!(inserter.join().unwrap().allowed());
        assert_eq!(given, 1, "client 1 had state throughout");
        assert_eq!(limiter.peek_at(&1, 10), Some(1), "the refund moved");
        assert!(limiter.check_at(&1, 10).allowed());
        assert!(!limiter.check_at(&1, 10).allowed());
        assert_eq!(limiter.tracked_clients(), 2);
    });
}

#[test]
fn refunds_race_a_move() {
    a_refund_races_a_move::<Gcra>();
    a_refund_races_a_move::<TokenBucket>();
    a_refund_races_a_move::<FixedWindow>();
    a_refund_races_a_move::<SlidingWindowCounter>();
    a_refund_races_a_move::<SlidingWindow>();
}

#[test]
fn refunds_race_removals() {
    a_refund_races_a_sweep::<Gcra>();
    a_refund_races_a_sweep::<TokenBucket>();
    a_refund_races_a_sweep::<FixedWindow>();
    a_refund_races_a_sweep::<SlidingWindowCounter>();
    a_refund_races_a_sweep::<LeakyBucket>();
    a_refund_races_forget::<Gcra>();
    a_refund_races_forget::<FixedWindow>();
    a_refund_races_a_sweep::<SlidingWindow>();
    a_refund_races_forget::<SlidingWindow>();
}

#[test]
fn gcra_refund_races_a_check() {
    a_refund_races_a_check::<Gcra>();
    a_refund_and_an_admission_both_land::<Gcra>();
}

#[test]
fn leaky_bucket_refund_races_a_check() {
    a_refund_races_a_check::<LeakyBucket>();
    a_refund_and_an_admission_both_land::<LeakyBucket>();
}

#[test]
fn token_bucket_refund_races_a_check() {
    a_refund_races_a_check::<TokenBucket>();
    a_refund_and_an_admission_both_land::<TokenBucket>();
}

#[test]
fn fixed_window_refund_races_a_check() {
    a_refund_races_a_check::<FixedWindow>();
    a_refund_and_an_admission_both_land::<FixedWindow>();
}

#[test]
fn sliding_window_counter_refund_races_a_check() {
    a_refund_races_a_check::<SlidingWindowCounter>();
    a_refund_and_an_admission_both_land::<SlidingWindowCounter>();
}

#[test]
fn sliding_window_refund_races_a_check() {
    a_refund_races_a_check::<SlidingWindow>();
    a_refund_and_an_admission_both_land::<SlidingWindow>();
}

/// The log, `L = 3`, `W = 10`: 2 units admitted at tick 1 as one entry.
/// Two refunds of that admission race, of 1 and of 2 units: each builds a
/// ring without what it gives back, and only the one whose mark lands on
/// the ring it read counts; the other reads the new ring and gives back
/// what is left. So the two give back 2 in all, every unit once, and 3 are
/// left. A refund that built on a ring it had read before another's mark
/// (its mark's CAS expecting a word it loaded again), or a link stored
/// rather than moved by CAS (a late helper putting back the older ring),
/// gives back 3 or leaves 2.
#[test]
fn two_refunds_of_one_admission_give_each_unit_back_once() {
    let threads = vec![vec![Refund(3, 1, 1)], vec![Refund(3, 1, 2)]];
    explore::<Bare<SlidingWindow>, _>(
        Scenario {
            config: Config::per_ticks(3, 10).unwrap(),
            before: vec![CheckN(1, 2)],
            threads,
            probes: vec![Remaining(3), CheckN(3, 3)],
            real_time: false,
        },
        |_, run: &Run| {
            let given: u64 = run
                .threads
                .iter()
                .map(|answers| match answers[0] {
                    Answer::Refunded(given) => given,
                    ref other => panic!("{other:?} in {run:?}"),
                })
                .sum();
            assert_eq!(given, 2, "{run:?}");
            assert_eq!(run.probes[0], Answer::Remaining(3), "{run:?}");
            assert!(run.probes[1].admitted(), "{run:?}");
        },
    );
}
