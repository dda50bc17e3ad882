//! Every policy's state update, raced by 2–3 threads on one bare state: the
//! CAS loops of `cell::transition` (five policies) and the sliding log's slot
//! protocol, under loom's atomics.
#![cfg(floodgate_loom)]

use floodgate::policy::{
    FixedWindow, Gcra, LeakyBucket, Policy, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use floodgate::Config;
use floodgate_loom_tests::{explore, Answer, Bare, Call, Run, Scenario};

use Call::{Check, Remaining};

/// `L = 2` everywhere: the smallest limit where two admissions must
/// serialise and a third must see both. The drip policies get `W = 20`
/// (`I = 10`), the others `W = 10`; every model's times sit inside the first
/// period unless it is about time moving.
fn config<P: Policy>() -> Config {
    let window = if P::KIND.drips() { 20 } else { 10 };
    Config::per_ticks(2, window).expect("a valid config")
}

/// Checks at `now` until one is rejected: after it, nothing is left at `now`.
fn drain(now: u64) -> Vec<Call> {
    vec![Check(now); 3]
}

/// Three threads each check once at one frozen instant: exactly
/// `min(L, 3) = 2` are admitted, and the state then has nothing left (no
/// lost update: a lost admission would leave one behind).
fn frozen_instant<P: Policy>() {
    let probes = [vec![Remaining(5)], drain(5)].concat();
    explore::<Bare<P>, _>(
        Scenario {
            config: config::<P>(),
            before: vec![],
            threads: vec![vec![Check(5)], vec![Check(5)], vec![Check(5)]],
            probes,
            real_time: false,
        },
        |_, run: &Run| {
            assert_eq!(run.admitted(), 2, "{run:?}");
            assert_eq!(run.probes[0], Answer::Remaining(0), "{run:?}");
            assert!(run.probes[1..].iter().all(|a| !a.admitted()), "{run:?}");
        },
    );
}

/// A thread reads `remaining` and then checks twice while another thread
/// checks once, all at one instant: the reader's admissions never exceed what
/// it was told, the two threads together get exactly `L`, and once the
/// reader has seen the other thread finish, what it was told is exactly what
/// it gets.
fn remaining_is_honoured<P: Policy>() {
    explore::<Bare<P>, _>(
        Scenario {
            config: config::<P>(),
            before: vec![],
            threads: vec![vec![Remaining(5), Check(5), Check(5)], vec![Check(5)]],
            probes: vec![Remaining(5)],
            real_time: true,
        },
        |_, run: &Run| {
            let Answer::Remaining(told) = run.threads[0][0] else {
                unreachable!()
            };
            let reader_got = run.threads[0][1..].iter().filter(|a| a.admitted()).count();
            assert!(reader_got as u64 <= told, "{run:?}");
            assert_eq!(run.admitted(), 2, "{run:?}");
            assert_eq!(run.probes[0], Answer::Remaining(0), "{run:?}");
        },
    );
}

/// One thread checks at a later time than another (`late` > `early`, both
/// after `before`): whatever the order, the state ends at the later time (the
/// probes see it), the older call is judged no more leniently than at the
/// latest time already reflected, and nothing over-admits. `early`
/// alone would be admitted and, after `late`'s admission, is rejected or
/// admitted as at `late`, so both paths are exercised.
fn older_now<P: Policy>(before: Vec<Call>, late: u64, early: u64) {
    let probes = [vec![Remaining(early), Remaining(late)], drain(late)].concat();
    explore::<Bare<P>, _>(
        Scenario {
            config: config::<P>(),
            before,
            threads: vec![vec![Check(late)], vec![Check(early)]],
            probes,
            real_time: false,
        },
        move |_, run: &Run| {
            let [Answer::Remaining(at_early), Answer::Remaining(at_late), ..] = run.probes[..]
            else {
                unreachable!()
            };
            // Stored time never moves back: an older `now` sees no more room
            // than the latest time.
            assert!(at_early <= at_late, "{run:?}");
            // The later check always finds room (nothing before it can take
            // what `late` frees), so the race never costs it its admission.
            assert!(run.threads[0][0].admitted(), "{run:?}");
        },
    );
}

/// The sliding log's boundary hint, raced: `L = 6`, `W = 10`, four
/// admissions at 0 and one at 5. A check at 12 finds the four at 0 gone and
/// leaves the hint at entry 4. A check of cost 6 at 8 is refused whatever
/// it sees, and says what is left: 1 if it did not see the one at 12 (all
/// five inside at 8), 4 if it did (judged at 12: two inside). An
/// admission made after a call's snapshot fails that call's CAS, but a
/// refusal is answered from the snapshot alone: a hint read after the other
/// thread's admission and trusted without the read that checks it would
/// count one entry inside at 8 and answer 5.
#[test]
fn the_logs_boundary_hint_is_checked_before_it_is_trusted() {
    use floodgate_loom_tests::Call::CheckN;
    explore::<Bare<SlidingWindow>, _>(
        Scenario {
            config: Config::per_ticks(6, 10).expect("a valid config"),
            before: vec![Check(0), Check(0), Check(0), Check(0), Check(5)],
            threads: vec![vec![Check(12)], vec![CheckN(8, 6)]],
            probes: vec![Remaining(12)],
            real_time: false,
        },
        |_, run: &Run| {
            assert!(run.threads[0][0].admitted(), "{run:?}");
            let Answer::Check(weighted) = run.threads[1][0] else {
                unreachable!()
            };
            assert!(!weighted.allowed(), "{run:?}");
            assert!([1, 4].contains(&weighted.remaining()), "{run:?}");
            assert_eq!(run.probes[0], Answer::Remaining(4), "{run:?}");
        },
    );
}

macro_rules! policy_models {
    ($($module:ident: $policy:ty, older_now($before:expr, $late:expr, $early:expr);)*) => {$(
        mod $module {
            use super::*;

            #[test]
            fn frozen_instant_admits_exactly_the_limit() {
                frozen_instant::<$policy>();
            }

            #[test]
            fn remaining_is_honoured_by_later_checks() {
                remaining_is_honoured::<$policy>();
            }

            #[test]
            fn an_older_now_never_moves_time_back() {
                older_now::<$policy>($before, $late, $early);
            }
        }
    )*};
}

// The older-now scenarios, each with L = 2 and one earlier admission:
// * sliding-window (W = 10): before 0; late 10 and early 3. Early first:
//   the log is [3, 10]; late first: early is judged at 10 and stored as 10.
// * fixed-window (W = 10): before 0; late 10 (window 1), early 5 (window 0,
//   one left). Late first: early counts in window 1.
// * sliding-window-counter (W = 10): before 0; late 15, early 5. Late first:
//   early is judged at the start of window 1 with p = 1, c = 1: rejected
//   (stricter than at 15, which the contract allows).
// * gcra, leaky-bucket (I = 10, τ = 10): before 0 (TAT 10); late 30, early 5.
//   Late first: TAT 40, early waits 35 > τ: rejected.
// * token-bucket (I = 10): before 0 (one token left); late 30, early 5. Late
//   first: early finds the bucket empty at its own drip count.
policy_models! {
    sliding_window: SlidingWindow, older_now(vec![Check(0)], 10, 3);
    fixed_window: FixedWindow, older_now(vec![Check(0)], 10, 5);
    sliding_window_counter: SlidingWindowCounter, older_now(vec![Check(0)], 15, 5);
    gcra: Gcra, older_now(vec![Check(0)], 30, 5);
    leaky_bucket: LeakyBucket, older_now(vec![Check(0)], 30, 5);
    token_bucket: TokenBucket, older_now(vec![Check(0)], 30, 5);
}
