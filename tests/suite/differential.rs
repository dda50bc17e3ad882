//! The lock-free engine against the mutex baseline: on random configurations
//! and random traces, every answer of every call must be the same.
//!
//! Times never decrease per client here (the spec's exact setting); they
//! range up to the contract's 2 × 10^12 ticks past the origin, with jumps of
//! 2^k windows for k up to 40. A last property lets time go backwards and
//! checks the one thing the spec asks then: never more lenient. Requests
//! carry costs (the contract's "Weighted requests"): 0, 1, anything up to
//! `L`, `L` itself, `L + 1` and 2^64 − 1.

use super::support;

use floodgate::{Engine, PolicyKind, MAX_LIMIT};
use proptest::prelude::*;
use proptest::sample::select;
use support::{call, limiter, run, Call, Op};

/// The contract's horizon: times up to 2 × 10^12 ticks past the origin.
const HORIZON: u64 = 2_000_000_000_000;

/// Mostly small limits, so that traces reach them; sometimes large ones, up
/// to the maximum, so that counts and packed fields are exercised near their
/// widths. The sliding log keeps a slot per unit of limit in every client, so
/// for it the largest is 2^16 (enough to be past any small-field width and
/// cheap to allocate); `tests/suite/policies.rs` covers it at the maximum.
fn limit(policy: PolicyKind) -> impl Strategy<Value = u64> {
    let largest = match policy {
        PolicyKind::SlidingWindow => 1 << 16,
        _ => MAX_LIMIT,
    };
    prop_oneof![
        12 => 1..=8u64,
        2 => 9..=1_000u64,
        1 => Just(largest),
    ]
}

/// The longest window `policy` accepts: the drip policies hold one time
/// that runs up to one window ahead of `now` (a schedule's `TAT`, the drip
/// from which a bucket is full) in one `u64`, so their windows stop at
/// `MAX_SCHEDULE_WINDOW`; the others take any `u64`.
fn longest_window(policy: PolicyKind) -> u64 {
    if policy.drips() {
        floodgate::MAX_SCHEDULE_WINDOW
    } else {
        u64::MAX
    }
}

/// A window for `policy` with `limit`: mostly 1..=50 ticks (L..=L+49 for the
/// drip policies, which need W ≥ L), sometimes a multiple of L plus a
/// remainder (so that W / L rounds down), and sometimes huge.
fn window(policy: PolicyKind, limit: u64) -> impl Strategy<Value = u64> {
    let least = if policy.drips() { limit } else { 1 };
    let longest = longest_window(policy);
    prop_oneof![
        10 => least..=least + 49,
        3 => (1..=20u64, 0..limit).prop_map(move |(k, r)| (limit * k + r).max(least)),
        1 => select(vec![1_000_000_000, 1 << 40, u64::MAX / 3, longest - 1, longest])
            .prop_map(move |w: u64| w.min(longest).max(least)),
        1 => least..=longest,
    ]
}

/// How far time moves before a step: often not at all, often a little or
/// right onto a window or interval boundary, sometimes 2^k windows or an
/// arbitrary stretch of the horizon.
fn advance(window: u64, interval: u64) -> impl Strategy<Value = u64> {
    let edges = vec![
        window - 1,
        window,
        window.saturating_add(1),
        interval - 1,
        interval,
        interval.saturating_add(1),
    ];
    prop_oneof![
        6 => Just(0u64),
        3 => 1..=3u64,
        3 => 1..=window.min(HORIZON),
        3 => select(edges),
        1 => (0..=40u32).prop_map(move |k| window.saturating_mul(1 << k)),
        1 => 0..=HORIZON,
    ]
}

/// A call: a single check, a weighted one (every cost the contract singles
/// out, and any up to `L`), `remaining`, or a refund (of any of those
/// costs, for an admission at the call's time, a tick or a few before it,
/// `W − 1` and `W` ticks before it, or anywhere in the last two windows:
/// times that were admissions and times that were not).
fn op(limit: u64, window: u64) -> impl Strategy<Value = Op> {
    let cost = move || {
        prop_oneof![
            2 => Just(0u64),
            6 => 1..=limit,
            2 => Just(limit),
            1 => Just(limit + 1),
            1 => Just(u64::MAX),
            2 => 1..=limit.min(4),
        ]
    };
    let back = prop_oneof![
        3 => Just(0u64),
        2 => 1..=3u64,
        1 => Just(window - 1),
        1 => Just(window),
        1 => 0..=window.saturating_mul(2),
    ];
    prop_oneof![
        3 => Just(Op::Allow),
        3 => cost().prop_map(Op::AllowN),
        1 => Just(Op::Remaining),
        2 => (cost(), back).prop_map(|(cost, back)| Op::Refund { cost, back }),
    ]
}

/// One step of a trace before it is laid out in time: which client, which
/// call, how far time moves first, and how many times the call is repeated
/// at that instant (bursts reach the limit quickly).
fn step(limit: u64, window: u64, interval: u64) -> impl Strategy<Value = (u64, Op, u64, usize)> {
    (
        0..3u64,
        op(limit, window),
        advance(window, interval),
        prop_oneof![4 => Just(1usize), 1 => 2..=12usize],
    )
}

/// A configuration and a trace whose times never decrease, starting at 0 or
/// anywhere in the horizon, and capped at the horizon.
fn case(policy: PolicyKind) -> impl Strategy<Value = (u64, u64, Vec<Call>)> {
    limit(policy)
        .prop_flat_map(move |limit| (Just(limit), window(policy, limit)))
        .prop_flat_map(move |(limit, window)| {
            let interval = (window / limit).max(1);
            (
                Just(limit),
                Just(window),
                prop_oneof![Just(0u64), 0..=HORIZON],
                prop::collection::vec(step(limit, window, interval), 1..40),
            )
        })
        .prop_map(move |(limit, window, start, steps)| {
            let mut at = start;
            let mut trace = Vec::new();
            for (client, op, advance, repeat) in steps {
                at = at.saturating_add(advance).min(HORIZON);
                trace.extend((0..repeat).map(|_| Call { op, client, at }));
            }
            (limit, window, trace)
        })
}

/// Runs `trace` through both engines and compares every answer.
fn engines_agree(
    policy: PolicyKind,
    limit: u64,
    window: u64,
    trace: &[Call],
) -> Result<(), TestCaseError> {
    let lock_free = run(
        &*limiter::<u64>(policy, limit, window, Engine::LockFree),
        trace,
    );
    let mutex = run(
        &*limiter::<u64>(policy, limit, window, Engine::Mutex),
        trace,
    );
    for (i, (fast, slow)) in lock_free.iter().zip(&mutex).enumerate() {
        prop_assert_eq!(
            fast,
            slow,
            "{} L={} W={}: call {} {:?} (lock-free left, mutex right)",
            policy,
            limit,
            window,
            i,
            trace[i]
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    #[test]
    fn sliding_window_engines_agree((limit, window, trace) in case(PolicyKind::SlidingWindow)) {
        engines_agree(PolicyKind::SlidingWindow, limit, window, &trace)?;
    }

    #[test]
    fn token_bucket_engines_agree((limit, window, trace) in case(PolicyKind::TokenBucket)) {
        engines_agree(PolicyKind::TokenBucket, limit, window, &trace)?;
    }

    #[test]
    fn fixed_window_engines_agree((limit, window, trace) in case(PolicyKind::FixedWindow)) {
        engines_agree(PolicyKind::FixedWindow, limit, window, &trace)?;
    }

    #[test]
    fn sliding_window_counter_engines_agree(
        (limit, window, trace) in case(PolicyKind::SlidingWindowCounter)
    ) {
        engines_agree(PolicyKind::SlidingWindowCounter, limit, window, &trace)?;
    }

    #[test]
    fn gcra_engines_agree((limit, window, trace) in case(PolicyKind::Gcra)) {
        engines_agree(PolicyKind::Gcra, limit, window, &trace)?;
    }

    #[test]
    fn leaky_bucket_engines_agree((limit, window, trace) in case(PolicyKind::LeakyBucket)) {
        engines_agree(PolicyKind::LeakyBucket, limit, window, &trace)?;
    }
}

/// A trace whose times jump back and forth, on small configurations.
fn shaky_case() -> impl Strategy<Value = (PolicyKind, u64, u64, Vec<Call>)> {
    (select(PolicyKind::ALL.to_vec()), 1..=4u64, 1..=20u64)
        .prop_map(|(policy, limit, window)| {
            let window = if policy.drips() {
                window.max(limit)
            } else {
                window
            };
            (policy, limit, window)
        })
        .prop_flat_map(|(policy, limit, window)| {
            let step = (
                0..2u64,
                op(limit, window),
                -2 * window as i64..=2 * window as i64,
            );
            (
                Just(policy),
                Just(limit),
                Just(window),
                prop::collection::vec(step, 1..30),
            )
        })
        .prop_map(|(policy, limit, window, steps)| {
            // Start well above 0 so that steps back can land before a
            // client's origin.
            let mut at: u64 = 100;
            let trace = steps
                .into_iter()
                .map(|(client, op, delta)| {
                    at = at.saturating_add_signed(delta);
                    Call { op, client, at }
                })
                .collect();
            (policy, limit, window, trace)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// SPEC "Time going backwards": a call whose `now` is older than what the
    /// client's state reflects may be stricter, never more lenient. Checked
    /// against the latest time the client has been called at (at least the
    /// time its state reflects; every policy only gets more lenient as time
    /// passes), by replaying the same history on a fresh limiter.
    #[test]
    fn time_going_backwards_is_never_more_lenient((policy, limit, window, trace) in shaky_case()) {
        for engine in support::ENGINES {
            let answers = run(&*limiter::<u64>(policy, limit, window, engine), &trace);
            for (i, now) in trace.iter().enumerate() {
                let latest = trace[..i]
                    .iter()
                    .filter(|earlier| earlier.client == now.client)
                    .map(|earlier| earlier.at)
                    .max();
                let Some(latest) = latest.filter(|&latest| latest > now.at) else {
                    continue;
                };
                if !answers[i].admitted() {
                    continue;
                }
                let replay = limiter::<u64>(policy, limit, window, engine);
                run(&*replay, &trace[..i]);
                let then = call(&*replay, Call { at: latest, ..*now });
                prop_assert!(
                    then.admitted(),
                    "{} {} L={} W={}: call {} {:?} admitted, but not at {}",
                    engine,
                    policy,
                    limit,
                    window,
                    i,
                    now,
                    latest
                );
            }
        }
    }
}
