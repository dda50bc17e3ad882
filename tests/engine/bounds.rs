//! Bounded memory (`Bounds`): idle eviction, the cap and the overflow rules.
//!
//! The two engines must agree on every call with bounds on, exactly as they
//! do without: the same answers, the same clients removed by the same
//! sweeps, the same number of clients tracked after every call. And a
//! removed client must have been idle: the answers it gets once re-created
//! are the ones the kept state would have given (exactly for the policies
//! without a grid; up to the grid, which a re-created client starts afresh,
//! for the others).
//!
//! Time here is one clock shared by all clients and never decreases: a sweep
//! treats its `now` as a time every client has reached, which is so on a real
//! clock and must be so in a trace for the answers to be the exact ones.

use super::support;

use floodgate::{
    build_bounded, Bounds, Config, Engine, ManualClock, Overflow, PolicyKind, RateLimiter,
};
use proptest::prelude::*;
use proptest::sample::select;
use std::sync::Arc;
use support::{ask, Answer, Op, ENGINES};

/// A limiter for `policy` on `engine` with `bounds`, on a manual clock.
fn bounded(
    policy: PolicyKind,
    limit: u64,
    window: u64,
    engine: Engine,
    bounds: Bounds,
) -> Arc<dyn RateLimiter<u64>> {
    let config = Config::per_ticks(limit, window)
        .unwrap_or_else(|e| panic!("{policy} L={limit} W={window}: {e}"));
    build_bounded(policy, config, engine, ManualClock::new(0), bounds)
        .unwrap_or_else(|e| panic!("{policy} L={limit} W={window}: {e}"))
}

/// `I = ⌊W / L⌋`, the drip policies' interval (1 for the others, so that it
/// can serve as a step everywhere).
fn interval(limit: u64, window: u64) -> u64 {
    (window / limit).max(1)
}

/// Small limits and windows, so that traces reach the limit, and clients go
/// idle and come back within a few steps.
fn config(policy: PolicyKind) -> impl Strategy<Value = (u64, u64)> {
    (1..=4u64).prop_flat_map(move |limit| {
        let least = if policy.drips() { limit } else { 1 };
        (Just(limit), least..=least + 20)
    })
}

/// Every combination that matters: eviction on or off; no cap (more often,
/// so that the amortised sweep runs on its own), a cap of 0 (every client
/// overflows), 1, 3 or 10; each overflow rule — but a cap of 0 that rejects,
/// which refuses everyone and is refused when the limiter is built.
fn bounds() -> impl Strategy<Value = Bounds> {
    (
        any::<bool>(),
        prop_oneof![
            3 => Just(None),
            2 => select(vec![Some(0), Some(1), Some(3), Some(10)]),
        ],
        select(vec![Overflow::Reject, Overflow::Admit, Overflow::Shared]),
    )
        .prop_map(|(evict, cap, overflow)| {
            let overflow = match (cap, overflow) {
                (Some(0), Overflow::Reject) => Overflow::Shared,
                _ => overflow,
            };
            let bounds = Bounds::new().on_overflow(overflow);
            let bounds = if evict { bounds.evict_idle() } else { bounds };
            match cap {
                Some(cap) => bounds.max_clients(cap),
                None => bounds,
            }
        })
}

/// How far the shared clock moves before a step: mostly not at all or a
/// little, often onto a window or interval edge, sometimes several windows.
fn advance(window: u64, interval: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        8 => Just(0u64),
        4 => 1..=2u64,
        2 => select(vec![interval - 1, interval, interval + 1, window - 1, window, window + 1]),
        1 => 0..=3 * window,
    ]
}

/// One step of a bounded trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// A call of a client at an absolute time.
    Call { op: Op, client: u64, at: u64 },
    /// An explicit `sweep_at`.
    Sweep { at: u64 },
}

/// A configuration, bounds and a trace over a pool of 3, 20 or 200 client
/// ids (200, so that the amortised sweep every 64 arrivals really runs). In
/// half the traces explicit sweeps are mixed in, one step in 40 (each resets
/// the arrivals the amortised sweep counts, so not more often).
fn case(policy: PolicyKind) -> impl Strategy<Value = (u64, u64, Bounds, Vec<Step>)> {
    let pool = prop_oneof![1 => Just(3u64), 1 => Just(20), 2 => Just(200)];
    (config(policy), bounds(), pool, any::<bool>()).prop_flat_map(
        move |((limit, window), bounds, pool, sweeps)| {
            let step = (
                prop_oneof![3 => Just(Op::Allow), 1 => Just(Op::Remaining)],
                0..pool,
                advance(window, interval(limit, window)),
                0..40u8,
            );
            (
                Just(limit),
                Just(window),
                Just(bounds),
                prop::collection::vec(step, 1..300).prop_map(move |steps| {
                    let mut at = 0;
                    steps
                        .into_iter()
                        .map(|(op, client, advance, roll)| {
                            at += advance;
                            if sweeps && roll == 0 {
                                Step::Sweep { at }
                            } else {
                                Step::Call { op, client, at }
                            }
                        })
                        .collect()
                }),
            )
        },
    )
}

/// What one step answered, and how many clients were tracked after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Call(Answer),
    Swept(usize),
}

fn take(limiter: &dyn RateLimiter<u64>, step: Step) -> (Outcome, usize) {
    let outcome = match step {
        Step::Call { op, client, at } => Outcome::Call(ask(limiter, &client, op, at)),
        Step::Sweep { at } => Outcome::Swept(limiter.sweep_at(at)),
    };
    (outcome, limiter.tracked_clients())
}

/// Runs `trace` on both engines in step, comparing every answer, every
/// sweep's count and the tracked clients after every step.
fn engines_agree(
    policy: PolicyKind,
    limit: u64,
    window: u64,
    bounds: Bounds,
    trace: &[Step],
) -> Result<(), TestCaseError> {
    let lock_free = bounded(policy, limit, window, Engine::LockFree, bounds);
    let mutex = bounded(policy, limit, window, Engine::Mutex, bounds);
    for (i, &step) in trace.iter().enumerate() {
        let fast = take(&*lock_free, step);
        let slow = take(&*mutex, step);
        prop_assert_eq!(
            fast,
            slow,
            "{} L={} W={} {:?}: step {} {:?} (lock-free left, mutex right)",
            policy,
            limit,
            window,
            bounds,
            i,
            step
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn sliding_window_engines_agree_with_bounds(
        (limit, window, bounds, trace) in case(PolicyKind::SlidingWindow)
    ) {
        engines_agree(PolicyKind::SlidingWindow, limit, window, bounds, &trace)?;
    }

    #[test]
    fn token_bucket_engines_agree_with_bounds(
        (limit, window, bounds, trace) in case(PolicyKind::TokenBucket)
    ) {
        engines_agree(PolicyKind::TokenBucket, limit, window, bounds, &trace)?;
    }

    #[test]
    fn fixed_window_engines_agree_with_bounds(
        (limit, window, bounds, trace) in case(PolicyKind::FixedWindow)
    ) {
        engines_agree(PolicyKind::FixedWindow, limit, window, bounds, &trace)?;
    }

    #[test]
    fn sliding_window_counter_engines_agree_with_bounds(
        (limit, window, bounds, trace) in case(PolicyKind::SlidingWindowCounter)
    ) {
        engines_agree(PolicyKind::SlidingWindowCounter, limit, window, bounds, &trace)?;
    }

    #[test]
    fn gcra_engines_agree_with_bounds(
        (limit, window, bounds, trace) in case(PolicyKind::Gcra)
    ) {
        engines_agree(PolicyKind::Gcra, limit, window, bounds, &trace)?;
    }

    #[test]
    fn leaky_bucket_engines_agree_with_bounds(
        (limit, window, bounds, trace) in case(PolicyKind::LeakyBucket)
    ) {
        engines_agree(PolicyKind::LeakyBucket, limit, window, bounds, &trace)?;
    }
}

/// One client's history, a sweep, and what the client does afterwards.
#[derive(Clone, Debug)]
struct Afterlife {
    policy: PolicyKind,
    limit: u64,
    window: u64,
    /// Calls before the sweep, times never decreasing, the first being the
    /// client's origin.
    history: Vec<(Op, u64)>,
    /// The sweep's time, no earlier than the history's last call.
    sweep: u64,
    /// Calls after the sweep, times never decreasing from the sweep's.
    after: Vec<(Op, u64)>,
}

/// Times laid out from `start` by `steps` of (call, advance).
fn lay_out(start: u64, steps: Vec<(Op, u64)>) -> Vec<(Op, u64)> {
    let mut at = start;
    steps
        .into_iter()
        .map(|(op, advance)| {
            at += advance;
            (op, at)
        })
        .collect()
}

/// A random state (any history), swept at a time near where it turns idle
/// (an edge of the window or interval after the last call, or anywhere in
/// the next few windows), then called again.
fn afterlife() -> impl Strategy<Value = Afterlife> {
    select(PolicyKind::ALL.to_vec())
        .prop_flat_map(|policy| (Just(policy), config(policy)))
        .prop_flat_map(|(policy, (limit, window))| {
            let interval = interval(limit, window);
            let op = prop_oneof![3 => Just(Op::Allow), 1 => Just(Op::Remaining)];
            let edges = vec![
                0,
                interval - 1,
                interval,
                window - 1,
                window,
                window + 1,
                2 * window - 1,
                2 * window,
            ];
            (
                Just((policy, limit, window)),
                0..1_000u64,
                prop::collection::vec((op.clone(), advance(window, interval)), 1..12),
                prop_oneof![2 => select(edges), 1 => 0..=3 * window],
                prop::collection::vec((op, advance(window, interval)), 1..12),
            )
        })
        .prop_map(|((policy, limit, window), origin, history, gap, after)| {
            let history = lay_out(origin, history);
            let sweep = history.last().map_or(origin, |&(_, at)| at) + gap;
            Afterlife {
                policy,
                limit,
                window,
                history,
                sweep,
                after: lay_out(sweep, after),
            }
        })
}

/// Whether `policy`'s answers depend on where a client's origin lies: drips
/// or windows start there.
fn has_grid(policy: PolicyKind) -> bool {
    matches!(
        policy,
        PolicyKind::TokenBucket | PolicyKind::FixedWindow | PolicyKind::SlidingWindowCounter
    )
}

/// The last point at or before `at` of the grid of a client created at
/// `origin`: a new client created there is the kept state's equal from `at`
/// on, if that state is idle at `at`. Without a grid, `at` itself.
fn grid_point(policy: PolicyKind, limit: u64, window: u64, origin: u64, at: u64) -> u64 {
    let step = match policy {
        PolicyKind::TokenBucket => interval(limit, window),
        PolicyKind::FixedWindow | PolicyKind::SlidingWindowCounter => window,
        _ => return at,
    };
    origin + (at - origin) / step * step
}

fn run_calls(limiter: &dyn RateLimiter<u64>, client: u64, calls: &[(Op, u64)]) -> Vec<Answer> {
    calls
        .iter()
        .map(|&(op, at)| ask(limiter, &client, op, at))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A client a sweep removes was idle: on two limiters given the same
    /// history, one sweeping and one not,
    /// - without a grid (sliding-window, gcra, leaky-bucket), the re-created
    ///   client answers every later call exactly as the kept one does;
    /// - with one, the kept state answers as a new client on its own grid
    ///   would (so only the grid was lost), at the re-creation instant the
    ///   re-created client admits what the kept one admits, and afterwards it
    ///   answers as a new client created at that instant.
    #[test]
    fn removed_clients_were_fresh_equivalent(case in afterlife()) {
        let Afterlife { policy, limit, window, ref history, sweep, ref after } = case;
        let origin = history[0].1;
        for engine in ENGINES {
            let sweeping = bounded(policy, limit, window, engine, Bounds::new().evict_idle());
            let keeping = bounded(policy, limit, window, engine, Bounds::new());
            prop_assert_eq!(
                run_calls(&*sweeping, 0, history),
                run_calls(&*keeping, 0, history)
            );
            if sweeping.sweep_at(sweep) == 0 {
                prop_assert_eq!(sweeping.tracked_clients(), 1);
                continue;
            }
            prop_assert_eq!(sweeping.tracked_clients(), 0);

            // The kept state against a new client on its grid (client 1).
            keeping.remaining_at(&1, grid_point(policy, limit, window, origin, sweep));
            let kept = run_calls(&*keeping, 0, after);
            prop_assert_eq!(
                &kept,
                &run_calls(&*keeping, 1, after),
                "{} {}: kept state differs from a new client on its grid",
                engine,
                policy
            );
            // The re-created client against a new client created with it
            // (client 2).
            let recreated = run_calls(&*sweeping, 0, after);
            prop_assert_eq!(&recreated, &run_calls(&*keeping, 2, after));
            if !has_grid(policy) {
                prop_assert_eq!(&recreated, &kept, "{} {}", engine, policy);
            } else {
                let recreated_at = after[0].1;
                for (i, &(_, at)) in after.iter().enumerate() {
                    if at != recreated_at {
                        break;
                    }
                    prop_assert_eq!(
                        admits_and_remaining(recreated[i]),
                        admits_and_remaining(kept[i]),
                        "{} {}: call {} at {}",
                        engine,
                        policy,
                        i,
                        at
                    );
                }
            }
        }
    }
}

/// What is the same for a re-created client of a grid policy and the kept
/// one at the instant of re-creation: whether a call is admitted, and how
/// many more would be (`retry_after` depends on where the grid starts).
fn admits_and_remaining(answer: Answer) -> (bool, u64) {
    match answer {
        Answer::Decision(decision) => (decision.allowed(), decision.remaining()),
        Answer::Remaining(remaining) => (remaining > 0, remaining),
        Answer::Refunded(given) => (given > 0, given),
    }
}

/// A flood of refunds for keys that never called creates nothing: under a
/// cap of 10, 100,000 invented keys' refunds answer 0, leave no client
/// tracked, and the cap's 10 places are all still there for real clients.
#[test]
fn refunds_for_invented_keys_create_nothing_under_a_cap() {
    for engine in ENGINES {
        for policy in PolicyKind::ALL {
            let config = Config::per_ticks(5, 1_000).unwrap();
            let bounds = Bounds::new().evict_idle().max_clients(10);
            let limiter =
                build_bounded::<u64, _>(policy, config, engine, ManualClock::new(0), bounds)
                    .unwrap();
            for key in 0..100_000u64 {
                assert_eq!(limiter.refund_at(&key, 10, 5, 3), 0, "{engine} {policy}");
            }
            assert_eq!(limiter.tracked_clients(), 0, "{engine} {policy}");
            for key in 0..10u64 {
                assert!(limiter.check_at(&key, 10).allowed(), "{engine} {policy}");
            }
            assert_eq!(limiter.tracked_clients(), 10, "{engine} {policy}");
        }
    }
}
