//! How several rules' own answers make one (the contract's "Several
//! limits on one client"), shared by every design that applies them
//! ([`Pair`](super::Pair), [`WindowPair`](super::WindowPair),
//! [`Compound`](super::Compound)).

use crate::cell::Step;
use crate::decision::NEVER;
use crate::{Decision, Rule, RuleAnswer, RuleSet};

/// Combines the rules' own decisions on one request (the contract):
/// admitted iff all admit, with the smallest `remaining` and the largest
/// `delay`; else refused, with the smallest `remaining(now)` and the
/// largest `retry_after`, by the first rule that waits that long. A
/// refusing rule's decision carries its `remaining(now)`; a rule that would
/// admit counted the request in its decision, so its `remaining(now)` comes
/// from `remaining_now`, asked only while the smallest is above 0.
#[inline]
pub(super) fn combine(decisions: &[Decision], remaining_now: impl Fn(usize) -> u64) -> Decision {
    if decisions.iter().all(|d| d.allowed) {
        let mut admitted = decisions[0];
        for d in &decisions[1..] {
            admitted.remaining = admitted.remaining.min(d.remaining);
            admitted.delay = admitted.delay.max(d.delay);
        }
        return admitted;
    }
    let mut remaining = u64::MAX;
    let mut by = 0;
    let mut retry_after = 0;
    for (i, d) in decisions.iter().enumerate() {
        if !d.allowed {
            remaining = remaining.min(d.remaining);
            if d.retry_after > retry_after {
                retry_after = d.retry_after;
                by = i;
            }
        }
    }
    for (i, d) in decisions.iter().enumerate() {
        if d.allowed && remaining > 0 {
            remaining = remaining.min(remaining_now(i));
        }
    }
    Decision::reject(remaining, retry_after).by_rule(by)
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
