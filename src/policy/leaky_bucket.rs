//! `leaky-bucket`: the bucket as a queue (a shaper). Admissions are exactly
//! `gcra`'s; an admitted request is told how long to wait, `t − now`, its
//! place in a queue that drains one request every `I`.

use super::gcra::{Gcra, GcraState};
use super::{sealed, Policy, Retired, Spent};
use crate::{Config, ConfigError, Decision, PolicyKind};

/// A leaky bucket used as a shaper: at most `limit` queued, drained one per
/// `window / limit` ticks; [`Decision::delay`] says how long to wait.
#[derive(Clone, Copy, Debug)]
pub struct LeakyBucket {
    schedule: Gcra,
}

impl LeakyBucket {
    /// The schedule it shapes by (`gcra`'s, with the wait answered).
    pub(super) fn schedule(&self) -> &Gcra {
        &self.schedule
    }
}

impl sealed::Sealed for LeakyBucket {}

impl Policy for LeakyBucket {
    type State = GcraState;
    type Origin = ();
    const KIND: PolicyKind = PolicyKind::LeakyBucket;

    fn new(config: Config) -> Result<Self, ConfigError> {
        Ok(Self {
            schedule: Gcra::validated(config, Self::KIND)?,
        })
    }

    fn config(&self) -> Config {
        self.schedule.config
    }

    fn new_state(&self) -> GcraState {
        Gcra::fresh_state()
    }

    /// `TAT = origin`: the limiter keeps no origin for this policy and
    /// hands it times since tick 0.
    fn begin(&self, origin: u64) -> GcraState {
        self.schedule.spent_state_at(0, origin)
    }

    #[inline]
    fn check_within(&self, state: &GcraState, now: u64, cost: u64) -> Result<Decision, Retired> {
        self.schedule.check_state(state, now, cost, true)
    }

    #[inline]
    fn check_unshared(&self, state: GcraState, now: u64, cost: u64) -> (GcraState, Decision) {
        self.schedule.check_unshared_state(state, now, cost, true)
    }

    #[inline]
    fn remaining(&self, state: &GcraState, now: u64) -> Result<u64, Retired> {
        self.schedule.remaining_state(state, now)
    }

    fn refund(&self, state: &GcraState, now: u64, ago: u64, cost: u64) -> Result<u64, Retired> {
        self.schedule.refund_state(state, now, ago, cost)
    }

    fn retire_if_idle(&self, state: &GcraState, now: u64) -> bool {
        self.schedule.retire_if_idle_state(state, now)
    }

    fn retire_spent(&self, state: &GcraState, now: u64) -> Spent {
        self.schedule.retire_spent_state(state, now)
    }

    fn spent_state(&self, spent: u64, now: u64) -> GcraState {
        self.schedule.spent_state_at(spent, now)
    }

    fn save_words(&self, state: &GcraState, out: &mut Vec<u64>) -> Result<(), Retired> {
        self.schedule.save_words(state, out)
    }

    fn load_words(&self, words: &[u64]) -> Option<GcraState> {
        self.schedule.load_words(words)
    }

    fn is_retired(&self, state: &GcraState) -> bool {
        Gcra::is_retired_state(state)
    }

    fn relocate(&self, state: &GcraState) -> Option<GcraState> {
        Gcra::relocate_state(state)
    }

    fn measured_from_earlier(&self, mut decision: Decision, lag: u64) -> Decision {
        if decision.allowed {
            decision.delay = decision.delay.saturating_add(lag);
        } else {
            decision.retry_after = decision.retry_after.saturating_add(lag);
        }
        decision
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_spread_out() {
        let policy = LeakyBucket::new(Config::per_ticks(3, 300).unwrap()).unwrap();
        let state = policy.new_state();
        let delays: Vec<_> = (0..3)
            .map(|_| policy.check(&state, 0).unwrap().delay)
            .collect();
        assert_eq!(delays, [0, 100, 200]);
        let rejected = policy.check(&state, 0).unwrap();
        assert_eq!(
            (rejected.allowed, rejected.delay, rejected.retry_after),
            (false, 0, 100)
        );
        assert_eq!(policy.check(&state, 150).unwrap().delay, 150);
    }
}
