//! `in-flight`: at most `L` units held at once (the contract's "Requests
//! in flight"). A request of cost `n` is admitted iff `h + n <= L`, and
//! holds its units until they are released; time alone changes nothing,
//! so a refused request waits for a release (`retry_after` is
//! [`NEVER`](crate::decision::NEVER)).
//!
//! The state is one word, `h`, the units held, updated by one CAS per
//! admission or release: a `u64` whose top bit is the retirement mark
//! (`cell`'s one-word layout) and whose other 63 bits hold `h`. `h` never
//! passes `L <= 2^32 − 1`, so 31 of them are never set. A client that
//! holds units is never idle: `retire_if_idle` retires only `h = 0`, so a
//! sweep or a cap never removes held units (the contract's "Bounded memory
//! must not forget held units").

use super::{sealed, Policy, Retired, Spent};
use crate::cell::{self, transition, AtomicWord, Step};
use crate::decision::NEVER;
use crate::sync::AtomicU64;
use crate::{Config, ConfigError, Decision, PolicyKind};

/// At most `limit` units held at once by each client.
#[derive(Clone, Copy, Debug)]
pub struct InFlight {
    config: Config,
}

/// One client's `in-flight` state: the units it holds (layout above).
#[derive(Debug)]
pub struct InFlightState {
    held: AtomicU64,
}

impl InFlight {
    /// The pure step for a cost `1 <= cost <= L` on `h` held.
    #[inline]
    pub(super) fn step(&self, held: u64, cost: u64) -> Step<u64> {
        let limit = self.config.limit();
        // h <= L < 2^32 and n <= L: the sum fits.
        let after = held + cost;
        if after <= limit {
            Step {
                decision: Decision::admit(limit - after),
                next: Some(after),
            }
        } else {
            Step {
                decision: Decision::reject(limit.saturating_sub(held), NEVER),
                next: None,
            }
        }
    }

    /// `L − h` (0 if a carry-over to a lower limit left `h` above it).
    #[inline]
    pub(super) fn remaining_of(&self, held: u64) -> u64 {
        self.config.limit().saturating_sub(held)
    }

    /// The pure release step: `r = min(n, h)` back. The word to store, if
    /// any.
    #[inline]
    pub(super) fn let_go(held: u64, cost: u64) -> (u64, Option<u64>) {
        let released = cost.min(held);
        if released == 0 {
            return (0, None);
        }
        (released, Some(held - released))
    }

    /// The units `state` holds, whether retired or not.
    fn held_of(state: &InFlightState) -> u64 {
        AtomicU64::unmarked(state.held.load_word())
    }
}

impl sealed::Sealed for InFlight {}

impl Policy for InFlight {
    type State = InFlightState;
    type Origin = ();
    const KIND: PolicyKind = PolicyKind::InFlight;

    fn new(config: Config) -> Result<Self, ConfigError> {
        Ok(Self {
            config: config.check_for(Self::KIND)?,
        })
    }

    fn config(&self) -> Config {
        self.config
    }

    fn new_state(&self) -> InFlightState {
        InFlightState {
            held: AtomicU64::new(0),
        }
    }

    #[inline]
    fn check_within(
        &self,
        state: &InFlightState,
        _now: u64,
        cost: u64,
    ) -> Result<Decision, Retired> {
        transition(&state.held, |held| self.step(held, cost))
    }

    #[inline]
    fn check_unshared(
        &self,
        state: InFlightState,
        _now: u64,
        cost: u64,
    ) -> (InFlightState, Decision) {
        let (held, decision) = cell::transition_unshared(state.held, |held| self.step(held, cost));
        (InFlightState { held }, decision)
    }

    #[inline]
    fn remaining(&self, state: &InFlightState, _now: u64) -> Result<u64, Retired> {
        Ok(self.remaining_of(cell::read(&state.held)?))
    }

    /// A refund gives nothing back to an `in-flight` rule: a release does
    /// (the contract), so a failed request's units never come back twice.
    fn refund(&self, state: &InFlightState, _: u64, _: u64, _: u64) -> Result<u64, Retired> {
        cell::read(&state.held).map(|_| 0)
    }

    fn release(&self, state: &InFlightState, _now: u64, cost: u64) -> Result<u64, Retired> {
        if cost == 0 {
            return cell::read(&state.held).map(|_| 0);
        }
        cell::update(&state.held, |held| Self::let_go(held, cost))
    }

    /// Idle only when it holds nothing: time never gives held units back.
    fn retire_if_idle(&self, state: &InFlightState, _now: u64) -> bool {
        cell::retire_if(&state.held, |held| held == 0)
    }

    fn retire_spent(&self, state: &InFlightState, now: u64) -> Spent {
        let (held, _) = cell::retire(&state.held);
        Spent {
            count: held,
            at: now,
        }
    }

    /// Holding `spent` units (all of them, even above the limit: a
    /// carry-over to a lower limit keeps what is held, and refuses until
    /// enough is released).
    fn spent_state(&self, spent: u64, _now: u64) -> InFlightState {
        InFlightState {
            // At most a former limit, below 2^32: under the mark.
            held: AtomicU64::new(spent.min(crate::MAX_LIMIT)),
        }
    }

    /// Nothing: a loaded state holds nothing (trait docs).
    fn save_words(&self, state: &InFlightState, _: &mut Vec<u64>) -> Result<(), Retired> {
        cell::read(&state.held).map(drop)
    }

    fn load_words(&self, words: &[u64]) -> Option<InFlightState> {
        words.is_empty().then(|| self.new_state())
    }

    fn is_retired(&self, state: &InFlightState) -> bool {
        AtomicU64::is_retired(state.held.load_word())
    }

    fn relocate(&self, state: &InFlightState) -> Option<InFlightState> {
        let (held, retired_now) = cell::retire(&state.held);
        retired_now.then(|| InFlightState {
            held: AtomicU64::new(held),
        })
    }

    /// Never by time alone.
    fn forgets_after(&self) -> u64 {
        u64::MAX
    }
}

impl InFlightState {
    /// The units held (for tests and the engines' own reads).
    #[allow(dead_code)]
    pub(crate) fn held(&self) -> u64 {
        InFlight::held_of(self)
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;

    fn policy(limit: u64) -> InFlight {
        InFlight::new(Config::in_flight(limit).unwrap()).unwrap()
    }

    #[test]
    fn holds_until_released_and_never_by_time() {
        let p = policy(3);
        let state = p.new_state();
        assert!(p.check_n(&state, 0, 2).unwrap().allowed());
        let refused = p.check_n(&state, 1_000_000, 2).unwrap();
        assert!(!refused.allowed());
        assert_eq!(refused.remaining(), 1);
        assert_eq!(refused.retry_after, NEVER);
        assert!(
            !p.retire_if_idle(&state, u64::MAX),
            "held units are never idle"
        );
        assert_eq!(
            p.refund(&state, 5, 0, 2).unwrap(),
            0,
            "a refund gives back nothing"
        );
        assert_eq!(p.release(&state, 5, 5).unwrap(), 2, "min(n, h)");
        assert_eq!(p.release(&state, 5, 1).unwrap(), 0);
        assert_eq!(p.remaining(&state, 5).unwrap(), 3);
        assert!(p.check_n(&state, 5, 3).unwrap().allowed());
        assert!(!p.check_n(&state, 5, 4).unwrap().allowed(), "n > L");
        assert_eq!(p.release(&state, 6, 3).unwrap(), 3);
        assert!(p.retire_if_idle(&state, 6));
        assert_eq!(p.release(&state, 6, 1), Err(Retired));
    }

    #[test]
    fn a_carry_over_keeps_what_is_held() {
        let p = policy(2);
        let state = p.spent_state(5, 0);
        assert_eq!(p.remaining(&state, 0).unwrap(), 0);
        assert!(!p.check(&state, 0).unwrap().allowed());
        assert_eq!(p.release(&state, 0, 4).unwrap(), 4);
        assert_eq!(p.remaining(&state, 0).unwrap(), 1);
        assert_eq!(p.retire_spent(&state, 7), Spent { count: 1, at: 7 });
    }
}
