//! How several rules' own answers make one (the contract's "Several
//! limits on one client"), shared by every design that applies them
//! ([`Pair`](super::Pair), [`WindowPair`](super::WindowPair),
//! [`Compound`](super::Compound)).

use crate::cell::Step;
use crate::decision::NEVER;
use crate::{Decision, Rule, RuleAnswer, RuleSet};

/// The rules' own decisions on one request combined as the contract
/// combines them, one rule at a time (no array of decisions on the hot
/// path): admitted iff all admit, with the smallest `remaining` and the
/// largest `delay`; else refused, with the smallest `remaining(now)` and
/// the largest `retry_after`, by the first rule that waits that long. A
/// refusing rule's decision carries its `remaining(now)`; a rule that would
/// admit counted the request in its decision, so its `remaining(now)` is
/// asked for (`Verdict::decision`), only while the smallest is above 0.
#[derive(Clone, Copy, Debug)]
pub(super) struct Verdict {
    /// The first rule's decision, with the smallest `remaining` and the
    /// largest `delay` of the admissions: the answer if every rule admits.
    admitted: Decision,
    /// The refusals so far: the smallest `remaining`, the longest wait and
    /// the first rule that waits it.
    refused: Option<(u64, u64, usize)>,
    /// The rules that admitted, one bit each (`MAX_RULES` fits).
    admitting: u32,
}

impl Verdict {
    /// The first rule's decision.
    #[inline(always)]
    pub(super) fn new(first: Decision) -> Self {
        let mut verdict = Self {
            admitted: first,
            refused: None,
            admitting: 0,
        };
        verdict.add(0, first);
        verdict
    }

    /// Rule `i`'s decision (in the set's order, after rule 0's).
    #[inline(always)]
    pub(super) fn add(&mut self, i: usize, decision: Decision) {
        if decision.allowed {
            self.admitted.remaining = self.admitted.remaining.min(decision.remaining);
            self.admitted.delay = self.admitted.delay.max(decision.delay);
            self.admitting |= 1 << i;
            return;
        }
        self.refused = Some(match self.refused {
            None => (decision.remaining, decision.retry_after, i),
            Some((remaining, wait, by)) => {
                let remaining = remaining.min(decision.remaining);
                if decision.retry_after > wait {
                    (remaining, decision.retry_after, i)
                } else {
                    (remaining, wait, by)
                }
            }
        });
    }

    /// Whether every rule so far admitted.
    #[inline(always)]
    pub(super) fn admits(&self) -> bool {
        self.refused.is_none()
    }

    /// The combined decision; `remaining_now(i)` is asked of the rules that
    /// admitted a refused request, in order, while the answer is above 0.
    #[inline(always)]
    pub(super) fn decision<E>(
        self,
        mut remaining_now: impl FnMut(usize) -> Result<u64, E>,
    ) -> Result<Decision, E> {
        let Some((mut remaining, wait, by)) = self.refused else {
            return Ok(self.admitted);
        };
        let mut admitting = self.admitting;
        while admitting != 0 && remaining > 0 {
            let i = admitting.trailing_zeros() as usize;
            admitting &= admitting - 1;
            remaining = remaining.min(remaining_now(i)?);
        }
        Ok(Decision::reject(remaining, wait).by_rule(by))
    }
}

/// The answer for a cost no step decides: 0 (admitted, nothing changes),
/// or above some rule's limit (never admitted, by the first such rule).
pub(super) fn beyond(rules: &RuleSet, cost: u64, remaining: u64) -> Option<Decision> {
    if cost == 0 {
        return Some(Decision::admit(remaining));
    }
    let by = rules.iter().position(|r| cost > r.config().limit())?;
    Some(Decision::reject(remaining, NEVER).by_rule(by))
}

/// A rule's own answer for `RuleAnswers`: `own` is its step's decision
/// for `cost` on the state as it is (ignored for a cost of 0 or above its
/// limit), `remaining` its `remaining` now.
pub(super) fn own_answer(
    rule: Rule,
    cost: u64,
    own: Option<Decision>,
    remaining: u64,
) -> RuleAnswer {
    let decision = match own {
        _ if cost == 0 => Decision::admit(remaining),
        _ if cost > rule.config().limit() => Decision::reject(remaining, NEVER),
        Some(d) if !d.allowed => d,
        Some(d) => Decision { remaining, ..d },
        None => Decision::admit(remaining),
    };
    RuleAnswer { rule, decision }
}

/// `combine` written out for two rules' steps, in the rule set's order:
/// this is a hot path, and a refusal by one rule (a client at its burst)
/// reads the other's `remaining` only when it can matter. Answers the
/// decision, and both next words when both admit (a word step stores
/// exactly when it admits).
#[inline(always)]
pub(super) fn two<A, B>(
    first: Step<A>,
    second: Step<B>,
    first_remaining: impl FnOnce() -> u64,
    second_remaining: impl FnOnce() -> u64,
) -> (Decision, Option<(A, B)>) {
    let (one, two) = (first.decision, second.decision);
    match (first.next, second.next) {
        (Some(a), Some(b)) => (
            Decision {
                remaining: one.remaining.min(two.remaining),
                delay: one.delay.max(two.delay),
                ..one
            },
            Some((a, b)),
        ),
        _ => {
            // The longest wait, by the first rule that waits it; a rule
            // that admits waits 0 and answers `remaining` from its word.
            let (wait, by) = match (one.allowed, two.allowed) {
                (false, false) if two.retry_after > one.retry_after => (two.retry_after, 1),
                (false, _) => (one.retry_after, 0),
                _ => (two.retry_after, 1),
            };
            let remaining = match (one.allowed, two.allowed) {
                (false, false) => one.remaining.min(two.remaining),
                (false, true) if one.remaining == 0 => 0,
                (false, true) => one.remaining.min(second_remaining()),
                _ if two.remaining == 0 => 0,
                _ => two.remaining.min(first_remaining()),
            };
            (Decision::reject(remaining, wait).by_rule(by), None)
        }
    }
}
