//! `gcra` with costs against the two implementations SPEC.md names as its
//! model ("Weighted requests"): Go's `golang.org/x/time/rate` (`AllowN`
//! with `Limit = 1/I`, `burst = L`) and `governor`'s `check_key_n`.

use super::support;

use std::num::NonZeroU32;
use std::time::Duration;

use floodgate::PolicyKind;
use governor::clock::{Clock, FakeRelativeClock};
use governor::{Quota, RateLimiter as Governor};
use support::on_both;

/// One `AllowN(t, n)` of a Go table: its time in intervals of the limiter,
/// the count, and whether Go admits it.
type Allow = (u64, u64, bool);

/// Plays a Go table on `gcra` with `L = burst` and `I = 100` ticks (Go's
/// tables use `rate.Limit(10)`, one token per `d = 100 ms`, and times
/// `t0 + k·d`), on both engines.
fn go_table(burst: u64, table: &[Allow]) {
    const I: u64 = 100;
    on_both::<str>(PolicyKind::Gcra, burst, burst * I, |limiter, engine| {
        for (step, &(k, n, ok)) in table.iter().enumerate() {
            let decision = limiter.check_n_at("go", k * I, n);
            assert_eq!(
                decision.allowed(),
                ok,
                "{engine}, burst {burst}, step {step}: AllowN(t{k}, {n}): {decision:?}"
            );
        }
    });
}

// The tables of `TestLimiterBurst1` and `TestLimiterBurst3` in
// x/time/rate's `rate_test.go`, as (t_k, n, ok). They are written out from
// those tests and each row was checked against the SPEC's gcra rule
// (admitted iff `t + (n − 1)·I − now <= τ`, `τ = (L − 1)·I`; then
// `TAT = t + n·I`); the TAT after each admission is noted.

#[test]
fn go_x_time_rate_burst_1() {
    go_table(
        1, // τ = 0
        &[
            (0, 1, true), // TAT 1
            (0, 1, false),
            (0, 1, false),
            (1, 1, true), // TAT 2
            (1, 1, false),
            (1, 1, false),
            (2, 2, false), // burst 1: n = 2 never fits
            (2, 1, true),  // TAT 3
            (2, 1, false),
        ],
    );
}

#[test]
fn go_x_time_rate_burst_3() {
    go_table(
        3, // τ = 2
        &[
            (0, 2, true), // TAT 2
            (0, 2, false),
            (0, 1, true), // TAT 3
            (0, 1, false),
            (1, 4, false), // more than the burst: never
            (2, 1, true),  // TAT 4
            (3, 1, true),  // TAT 5
            (4, 1, true),  // TAT 6
            (4, 1, true),  // TAT 7: 7 − 4 − 1 = 2 <= τ
            (4, 1, false),
            (4, 1, false),
            (9, 3, true), // TAT 12
            (9, 0, true),
        ],
    );
}

/// What governor says of one request: admitted, refused with a wait (in
/// ticks), or never (`InsufficientCapacity`).
fn governor_answer(
    governor: &Governor<
        u64,
        governor::state::keyed::DashMapStateStore<u64>,
        FakeRelativeClock,
        governor::middleware::NoOpMiddleware<<FakeRelativeClock as Clock>::Instant>,
    >,
    clock: &FakeRelativeClock,
    key: u64,
    cost: u64,
) -> Option<Result<(), u64>> {
    let n = NonZeroU32::new(u32::try_from(cost).ok()?)?;
    match governor.check_key_n(&key, n) {
        Err(_insufficient) => Some(Err(u64::MAX)),
        Ok(Ok(())) => Some(Ok(())),
        Ok(Err(not_until)) => {
            let wait = not_until.wait_time_from(clock.now());
            Some(Err(u64::try_from(wait.as_nanos()).unwrap()))
        }
    }
}

/// Seeded random weighted traces on three clients, with limits, intervals
/// and gaps of several sizes: every admission, and every wait, is
/// governor's. Costs run 1 to `L + 1` (and 0, which governor does not take:
/// ours is always admitted). The fake clock counts nanoseconds and the
/// limiter ticks, one each.
#[test]
fn weighted_traces_admit_exactly_as_governor_check_key_n() {
    for trace in 0..60 {
        let limit = [1, 2, 3, 10, 50][trace % 5];
        let interval = [1, 7, 100, 1_000][(trace / 5) % 4];
        on_both::<u64>(
            PolicyKind::Gcra,
            limit,
            limit * interval,
            |limiter, engine| {
                // The same trace for both engines.
                let mut rng = fastrand::Rng::with_seed(trace as u64);
                let clock = FakeRelativeClock::default();
                let quota = Quota::with_period(Duration::from_nanos(interval))
                    .unwrap()
                    .allow_burst(NonZeroU32::new(u32::try_from(limit).unwrap()).unwrap());
                let governor = Governor::dashmap_with_clock(quota, clock.clone());
                let mut now = 0;
                let (mut admitted, mut refused) = (0, 0);
                for step in 0..400 {
                    let gap = match rng.u8(..4) {
                        0 | 1 => 0,
                        2 => rng.u64(..=interval),
                        _ => rng.u64(..=limit * interval * 2),
                    };
                    now += gap;
                    clock.advance(Duration::from_nanos(gap));
                    let key = rng.u64(..3);
                    let cost = rng.u64(0..=limit + 1);
                    let ours = limiter.check_n_at(&key, now, cost);
                    let context = format!(
                        "{engine} L={limit} I={interval}, trace {trace} step {step}: \
                         client {key} cost {cost} at {now}: {ours:?}"
                    );
                    match governor_answer(&governor, &clock, key, cost) {
                        None => assert_eq!(cost, 0, "{context}"),
                        Some(Ok(())) => assert!(ours.allowed(), "{context}"),
                        Some(Err(wait)) => {
                            assert_eq!(
                                (ours.allowed(), ours.retry_after_ticks()),
                                // Governor's "insufficient capacity" is
                                // our "never".
                                (false, (wait != u64::MAX).then_some(wait)),
                                "{context}: governor waits {wait}"
                            );
                        }
                    }
                    if cost > 0 {
                        if ours.allowed() {
                            admitted += 1;
                        } else {
                            refused += 1;
                        }
                    }
                }
                // A trace that never refused (or never admitted) tests half
                // the rule.
                assert!(admitted > 0 && refused > 0, "trace {trace}");
            },
        );
    }
}
