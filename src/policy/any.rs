//! The policies chosen at run time, and their states: what a tier's
//! rule and each rule of several ([`Compound`](super::Compound)) hold.

use super::{
    Compound, CompoundState, FixedWindow, FixedWindowState, Gcra, GcraState, InFlight,
    InFlightState, LeakyBucket, Policy, Retired, SlidingWindow, SlidingWindowCounter,
    SlidingWindowCounterState, SlidingWindowState, Spent, TokenBucket, TokenBucketState,
};
use crate::{ConfigError, Decision, PolicyKind, Rule, RuleSet};

/// One of the seven rule kinds, or several.
#[derive(Clone, Debug)]
pub(crate) enum AnyPolicy {
    SlidingWindow(SlidingWindow),
    TokenBucket(TokenBucket),
    FixedWindow(FixedWindow),
    SlidingWindowCounter(SlidingWindowCounter),
    Gcra(Gcra),
    LeakyBucket(LeakyBucket),
    InFlight(InFlight),
    /// Several rules (a tier's rule may be several): never one of a
    /// [`Compound`]'s own rules.
    Several(Compound),
}

/// Their states (`gcra` and `leaky-bucket` share one).
#[derive(Debug)]
pub(crate) enum AnyState {
    SlidingWindow(SlidingWindowState),
    TokenBucket(TokenBucketState),
    FixedWindow(FixedWindowState),
    SlidingWindowCounter(SlidingWindowCounterState),
    Schedule(GcraState),
    Held(InFlightState),
    Several(CompoundState),
}

/// Runs `$body` with the policy and the state of the same kind, and wraps
/// a state it answers back in its kind with `$wrap`. A state is only ever
/// made by its own policy, so the kinds match.
macro_rules! with_pair {
    ($policy:expr, $state:expr, |$p:ident, $s:ident| $body:expr) => {
        match ($policy, $state) {
            (AnyPolicy::SlidingWindow($p), AnyState::SlidingWindow($s)) => $body,
            (AnyPolicy::TokenBucket($p), AnyState::TokenBucket($s)) => $body,
            (AnyPolicy::FixedWindow($p), AnyState::FixedWindow($s)) => $body,
            (AnyPolicy::SlidingWindowCounter($p), AnyState::SlidingWindowCounter($s)) => $body,
            (AnyPolicy::Gcra($p), AnyState::Schedule($s)) => $body,
            (AnyPolicy::LeakyBucket($p), AnyState::Schedule($s)) => $body,
            (AnyPolicy::InFlight($p), AnyState::Held($s)) => $body,
            (AnyPolicy::Several($p), AnyState::Several($s)) => $body,
            _ => unreachable!("a state is made by its own policy"),
        }
    };
}

/// Runs `$body` with the policy, whatever its kind.
macro_rules! with_policy {
    ($policy:expr, |$p:ident| $body:expr) => {
        match $policy {
            AnyPolicy::SlidingWindow($p) => $body,
            AnyPolicy::TokenBucket($p) => $body,
            AnyPolicy::FixedWindow($p) => $body,
            AnyPolicy::SlidingWindowCounter($p) => $body,
            AnyPolicy::Gcra($p) => $body,
            AnyPolicy::LeakyBucket($p) => $body,
            AnyPolicy::InFlight($p) => $body,
            AnyPolicy::Several($p) => $body,
        }
    };
}

/// Runs `$make` with the policy, and puts the state it makes in its kind.
macro_rules! making {
    ($policy:expr, |$p:ident| $make:expr) => {
        match $policy {
            AnyPolicy::SlidingWindow($p) => AnyState::SlidingWindow($make),
            AnyPolicy::TokenBucket($p) => AnyState::TokenBucket($make),
            AnyPolicy::FixedWindow($p) => AnyState::FixedWindow($make),
            AnyPolicy::SlidingWindowCounter($p) => AnyState::SlidingWindowCounter($make),
            AnyPolicy::Gcra($p) => AnyState::Schedule($make),
            AnyPolicy::LeakyBucket($p) => AnyState::Schedule($make),
            AnyPolicy::InFlight($p) => AnyState::Held($make),
            AnyPolicy::Several($p) => AnyState::Several($make),
        }
    };
}

impl AnyPolicy {
    /// The policy of `rule`.
    ///
    /// # Errors
    ///
    /// What the policy's `new` refuses (nothing, for a checked [`Rule`]).
    pub(crate) fn new(rule: Rule) -> Result<Self, ConfigError> {
        let config = rule.config();
        Ok(match rule.policy() {
            PolicyKind::SlidingWindow => Self::SlidingWindow(SlidingWindow::new(config)?),
            PolicyKind::TokenBucket => Self::TokenBucket(TokenBucket::new(config)?),
            PolicyKind::FixedWindow => Self::FixedWindow(FixedWindow::new(config)?),
            PolicyKind::SlidingWindowCounter => {
                Self::SlidingWindowCounter(SlidingWindowCounter::new(config)?)
            }
            PolicyKind::Gcra => Self::Gcra(Gcra::new(config)?),
            PolicyKind::LeakyBucket => Self::LeakyBucket(LeakyBucket::new(config)?),
            PolicyKind::InFlight => Self::InFlight(InFlight::new(config)?),
        })
    }

    /// The rules of `rules`: one policy, or several.
    ///
    /// # Errors
    ///
    /// What a rule's policy refuses (nothing, for checked rules).
    pub(crate) fn from_rules(rules: &RuleSet) -> Result<Self, ConfigError> {
        match rules.rules() {
            [rule] => Self::new(*rule),
            _ => Ok(Self::Several(Compound::from_rules(rules)?)),
        }
    }

    /// What each rule had spent, retiring the state (a tier's carry-over
    /// keeps each rule's spend: `Compound::retire_spent_each`).
    pub(crate) fn retire_spent_each(&self, state: &AnyState, now: u64) -> Vec<Spent> {
        match (self, state) {
            (Self::Several(p), AnyState::Several(s)) => p.retire_spent_each(s, now),
            _ => vec![self.retire_spent(state, now)],
        }
    }

    /// A state whose rule `i` has spent `spent[i]` (the last one's for a
    /// rule beyond them).
    pub(crate) fn spent_state_each(&self, spent: &[Spent]) -> AnyState {
        match self {
            Self::Several(p) => AnyState::Several(p.spent_state_each(spent)),
            _ => self.spent_state(spent[0].count, spent[0].at),
        }
    }

    pub(crate) fn spent_state(&self, spent: u64, now: u64) -> AnyState {
        making!(self, |p| p.spent_state(spent, now))
    }

    #[inline]
    pub(crate) fn check_n(
        &self,
        state: &AnyState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, Retired> {
        with_pair!(self, state, |p, s| p.check_n(s, now, cost))
    }

    #[inline]
    pub(crate) fn remaining(&self, state: &AnyState, now: u64) -> Result<u64, Retired> {
        with_pair!(self, state, |p, s| p.remaining(s, now))
    }

    pub(crate) fn peek_each(
        &self,
        state: &AnyState,
        now: u64,
    ) -> Result<crate::RuleAnswers, Retired> {
        with_pair!(self, state, |p, s| p.peek_each(s, now))
    }

    pub(crate) fn refund(
        &self,
        state: &AnyState,
        now: u64,
        ago: u64,
        cost: u64,
    ) -> Result<u64, Retired> {
        with_pair!(self, state, |p, s| p.refund(s, now, ago, cost))
    }

    pub(crate) fn release(&self, state: &AnyState, now: u64, cost: u64) -> Result<u64, Retired> {
        with_pair!(self, state, |p, s| p.release(s, now, cost))
    }

    /// Each rule's own answer to a request of cost `cost` at `now` that
    /// was `decided` (`Policy::each`: empty for one rule).
    pub(crate) fn each(
        &self,
        state: &AnyState,
        now: u64,
        cost: u64,
        decided: &Decision,
    ) -> Result<crate::RuleAnswers, Retired> {
        with_pair!(self, state, |p, s| p.each(s, now, cost, decided))
    }

    pub(crate) fn retire_if_idle(&self, state: &AnyState, now: u64) -> bool {
        with_pair!(self, state, |p, s| p.retire_if_idle(s, now))
    }

    pub(crate) fn retire_spent(&self, state: &AnyState, now: u64) -> Spent {
        with_pair!(self, state, |p, s| p.retire_spent(s, now))
    }

    pub(crate) fn save_words(&self, state: &AnyState, out: &mut Vec<u64>) -> Result<(), Retired> {
        with_pair!(self, state, |p, s| p.save_words(s, out))
    }

    pub(crate) fn load_words(&self, words: &[u64]) -> Option<AnyState> {
        Some(match self {
            Self::SlidingWindow(p) => AnyState::SlidingWindow(p.load_words(words)?),
            Self::TokenBucket(p) => AnyState::TokenBucket(p.load_words(words)?),
            Self::FixedWindow(p) => AnyState::FixedWindow(p.load_words(words)?),
            Self::SlidingWindowCounter(p) => AnyState::SlidingWindowCounter(p.load_words(words)?),
            Self::Gcra(p) => AnyState::Schedule(p.load_words(words)?),
            Self::LeakyBucket(p) => AnyState::Schedule(p.load_words(words)?),
            Self::InFlight(p) => AnyState::Held(p.load_words(words)?),
            Self::Several(p) => AnyState::Several(p.load_words(words)?),
        })
    }

    pub(crate) fn is_retired(&self, state: &AnyState) -> bool {
        with_pair!(self, state, |p, s| p.is_retired(s))
    }

    pub(crate) fn forgets_after(&self) -> u64 {
        with_policy!(self, |p| p.forgets_after())
    }

    pub(crate) fn measured_from_earlier(&self, decision: Decision, lag: u64) -> Decision {
        with_policy!(self, |p| p.measured_from_earlier(decision, lag))
    }
}
