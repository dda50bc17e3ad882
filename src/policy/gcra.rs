//! `gcra`: the generic cell rate algorithm, virtual-scheduling form.
//!
//! State: the theoretical arrival time `TAT`, initially the origin (0). With
//! `t = max(TAT, now)`, a request is admitted iff `t − now <= τ`, where
//! `τ = I·(L − 1)`, and then `TAT = t + I`. A burst of `L` gets through at
//! once, then one per `I`.
//!
//! Horizon: `TAT` is at most `now + W` (`τ + I = I·L <= W`). Windows are
//! capped at 2^63 ticks ([`MAX_SCHEDULE_WINDOW`](crate::MAX_SCHEDULE_WINDOW)),
//! so for any `now` below 2^63 ticks past the client's origin (292 years of
//! nanoseconds) the `u64` is exact; past that it saturates, which only makes
//! the policy stricter.

use super::{sealed, Policy};
use crate::cell::{transition, Step};
use crate::sync::AtomicU64;
use crate::{Config, ConfigError, Decision, PolicyKind};

/// The generic cell rate algorithm: a burst of `limit`, then one request per
/// `window / limit` ticks. The same admissions as `governor` built with
/// `Quota::with_period(window / limit).allow_burst(limit)`.
#[derive(Clone, Copy, Debug)]
pub struct Gcra {
    pub(super) config: Config,
    /// `I`: ticks between two requests at the sustained rate.
    pub(super) interval: u64,
    /// `τ = I·(L − 1)`: how far ahead of `now` the schedule may run.
    pub(super) tolerance: u64,
}

/// One client's `gcra` or `leaky-bucket` state: `TAT`, ticks past the origin.
#[derive(Debug)]
pub struct GcraState {
    tat: AtomicU64,
}

/// The schedule's answer for one request: admitted with `wait = t − now`,
/// or rejected with its retry-after.
pub(super) enum Slot {
    Admitted { wait: u64, next_tat: u64 },
    Rejected { retry_after: u64 },
}

impl Gcra {
    /// Where a request at `now` falls in the schedule `tat`.
    #[inline]
    pub(super) fn slot(&self, tat: u64, now: u64) -> Slot {
        let t = tat.max(now);
        let wait = t - now;
        if wait <= self.tolerance {
            Slot::Admitted {
                wait,
                // Exact below the horizon in the module docs.
                next_tat: t.saturating_add(self.interval),
            }
        } else {
            Slot::Rejected {
                retry_after: wait - self.tolerance,
            }
        }
    }

    /// `⌊(τ − (t − now)) / I⌋ + 1` when `t − now <= τ`, else 0.
    #[inline]
    pub(super) fn remaining_of(&self, tat: u64, now: u64) -> u64 {
        let wait = tat.max(now) - now;
        match self.tolerance.checked_sub(wait) {
            Some(slack) => slack / self.interval + 1,
            None => 0,
        }
    }

    /// The pure step; `shaped` answers with the queueing delay.
    #[inline]
    pub(super) fn step(&self, tat: u64, now: u64, shaped: bool) -> Step<u64> {
        match self.slot(tat, now) {
            Slot::Admitted { wait, next_tat } => {
                // A client within its rate (`TAT <= now`) is now scheduled
                // one interval ahead, which leaves `L − 1`: the common
                // admission, answered without `remaining_of`'s division.
                let remaining = if wait == 0 && next_tat - now == self.interval {
                    self.config.limit() - 1
                } else {
                    self.remaining_of(next_tat, now)
                };
                Step {
                    decision: Decision {
                        delay: if shaped { wait } else { 0 },
                        ..Decision::admit(remaining)
                    },
                    next: Some(next_tat),
                }
            }
            Slot::Rejected { retry_after } => Step {
                decision: Decision::reject(0, retry_after),
                next: None,
            },
        }
    }

    pub(super) fn validated(config: Config, kind: PolicyKind) -> Result<Self, ConfigError> {
        let config = config.check_for(kind)?;
        let interval = config.interval();
        Ok(Self {
            config,
            interval,
            // I·(L − 1) <= W, so it cannot overflow.
            tolerance: interval * (config.limit() - 1),
        })
    }

    pub(super) fn check_state(&self, state: &GcraState, now: u64, shaped: bool) -> Decision {
        transition(&state.tat, |tat| self.step(tat, now, shaped))
    }

    pub(super) fn remaining_state(&self, state: &GcraState, now: u64) -> u64 {
        self.remaining_of(crate::cell::AtomicWord::load_word(&state.tat), now)
    }

    pub(super) fn fresh_state() -> GcraState {
        GcraState {
            tat: AtomicU64::new(0),
        }
    }
}

impl sealed::Sealed for Gcra {}

impl Policy for Gcra {
    type State = GcraState;
    const KIND: PolicyKind = PolicyKind::Gcra;

    fn new(config: Config) -> Result<Self, ConfigError> {
        Self::validated(config, Self::KIND)
    }

    fn config(&self) -> Config {
        self.config
    }

    fn new_state(&self) -> GcraState {
        Self::fresh_state()
    }

    #[inline]
    fn check(&self, state: &GcraState, now: u64) -> Decision {
        self.check_state(state, now, false)
    }

    #[inline]
    fn remaining(&self, state: &GcraState, now: u64) -> u64 {
        self.remaining_state(state, now)
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;

    fn gcra(limit: u64, window: u64) -> Gcra {
        Gcra::new(Config::new(limit, window).unwrap()).unwrap()
    }

    #[test]
    fn burst_then_one_per_interval() {
        let policy = gcra(3, 300); // I = 100, τ = 200
        let state = policy.new_state();
        assert_eq!(policy.remaining(&state, 0), 3);
        for left in [2, 1, 0] {
            assert_eq!(policy.check(&state, 0), Decision::admit(left));
        }
        assert_eq!(policy.check(&state, 0), Decision::reject(0, 100));
        assert_eq!(policy.check(&state, 99), Decision::reject(0, 1));
        assert_eq!(policy.check(&state, 100), Decision::admit(0));
    }

    #[test]
    fn an_older_now_is_never_more_lenient() {
        let policy = gcra(2, 200);
        let state = policy.new_state();
        policy.check(&state, 1_000);
        policy.check(&state, 1_000);
        assert!(!policy.check(&state, 1_050).allowed);
        assert!(!policy.check(&state, 10).allowed);
        assert!(policy.check(&state, 1_100).allowed);
    }
}
