//! The first-touch race, where it is decided: threads whose first calls for
//! one new key arrive together each build a candidate state, exactly one
//! insert wins, and every thread must then decide on the winner's state. The
//! limiter runs its real create protocol (`store::keyed`) over the library's
//! loom-visible map, and the policies' CAS loops on the state it hands out.
#![cfg(floodgate_loom)]

use floodgate::policy::{
    FixedWindow, Gcra, LeakyBucket, Policy, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use floodgate::Config;
use floodgate_loom_tests::{explore, Answer, Call, Keyed, Run, Scenario};

use Call::{Check, Clients, Remaining};

/// `L = 1`: two states instead of one would admit both racers, which no
/// order allows. The window is long enough for every time here to be in the
/// first window or period.
fn config() -> Config {
    Config::per_ticks(1, 100).expect("a valid config")
}

/// Two first calls at one instant: one state, one admission.
fn same_instant<P: Policy>() {
    explore::<Keyed<P>, _>(
        Scenario {
            config: config(),
            before: vec![],
            threads: vec![vec![Check(10)], vec![Check(10)]],
            probes: vec![Clients, Remaining(10), Check(10)],
            real_time: false,
        },
        |_, run: &Run| {
            assert_eq!(run.admitted(), 1, "{run:?}");
            assert_eq!(run.probes[0], Answer::Clients(1), "{run:?}");
            assert_eq!(run.probes[1], Answer::Remaining(0), "{run:?}");
        },
    );
}

/// Two first calls carrying different times, and a `remaining` that may be
/// the creating call: whichever creates the client sets its origin, a call
/// older than that origin is judged at it, and still exactly one is admitted
/// on exactly one state.
///
/// Two threads, not three: a thread that meets the client's slot being
/// written waits for its writer with loom's yield (`sync::spin`), and two
/// threads waiting at once on a third are a schedule loom cannot end (its
/// scheduler hands the turn from one waiter to the other, never to the
/// writer, until the model runs out of branches). The `remaining` comes
/// first in its thread, so it still races the other thread's check to
/// create the client.
fn racing_origins<P: Policy>() {
    explore::<Keyed<P>, _>(
        Scenario {
            config: config(),
            before: vec![],
            threads: vec![vec![Remaining(7), Check(10)], vec![Check(4)]],
            probes: vec![Clients, Remaining(10), Check(10)],
            real_time: false,
        },
        |_, run: &Run| {
            assert_eq!(run.admitted(), 1, "{run:?}");
            assert_eq!(run.probes[0], Answer::Clients(1), "{run:?}");
            assert!(!run.probes[2].admitted(), "{run:?}");
        },
    );
}

macro_rules! first_touch_models {
    ($($module:ident: $policy:ty;)*) => {$(
        mod $module {
            use super::*;

            #[test]
            fn racing_creators_share_one_state() {
                same_instant::<$policy>();
            }

            #[test]
            fn a_creator_with_a_later_time_sets_the_origin() {
                racing_origins::<$policy>();
            }
        }
    )*};
}

first_touch_models! {
    sliding_window: SlidingWindow;
    fixed_window: FixedWindow;
    sliding_window_counter: SlidingWindowCounter;
    gcra: Gcra;
    leaky_bucket: LeakyBucket;
    token_bucket: TokenBucket;
}
