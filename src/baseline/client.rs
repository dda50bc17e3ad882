//! One client of the mutex engine: its rules, and each rule's part of its
//! state, with the steps that decide on them.

use std::collections::VecDeque;

use super::policies::{
    counter_at, counter_check, counter_remaining, drip, fixed_window_check, gcra_check,
    gcra_remaining, in_window, lacking_before_origin, sliding_window_check, token_bucket_check,
};
use crate::decision::NEVER;
use crate::{Decision, PolicyKind, RuleSet};

/// The policy and its parameters, fixed at construction.
#[derive(Clone, Copy, Debug)]
pub(super) struct Rules {
    pub(super) policy: PolicyKind,
    /// `L`.
    pub(super) limit: u64,
    /// `W`, in ticks.
    pub(super) window: u64,
    /// `I = ⌊W / L⌋`; at least 1 for the drip policies (checked by
    /// `Config::check_for`), unused by the others.
    pub(super) interval: u64,
}

impl Rules {
    /// How long after its last call any client is idle, at most: the
    /// `retry_after` of [`Overflow::Reject`]. One window for every policy
    /// (a log entry leaves, the bucket refills in `L·I ≤ W`, the TAT is at
    /// most `τ + I = L·I ≤ W` ahead), but two for the counter policy: a
    /// count weighs on the whole window after its own.
    pub(super) fn idle_within(&self) -> u64 {
        match self.policy {
            PolicyKind::SlidingWindowCounter => self.window.saturating_mul(2),
            _ => self.window,
        }
    }
}

/// One client: each rule's part of it.
#[derive(Clone, Debug)]
pub(super) struct Client {
    pub(super) parts: Vec<Part>,
    /// Set (under this client's lock) by the sweep that removed it from the
    /// map; a call that locks it afterwards must look its key up again.
    pub(super) retired: bool,
}

impl Client {
    /// A client created at `origin`, a part for each rule.
    pub(super) fn new(origin: u64, rules: &[Rules]) -> Self {
        Self {
            parts: rules.iter().map(|rules| Part::new(origin, rules)).collect(),
            retired: false,
        }
    }

    /// Decides one request of cost `cost` at `now` (absolute): with one
    /// rule, that rule's answer; with several, the contract's "Several
    /// limits on one client": every rule decides a copy of its part, and
    /// the copies are kept only if every rule admitted.
    pub(super) fn check(&mut self, rules: &[Rules], now: u64, cost: u64) -> Decision {
        if let [part] = &mut self.parts[..] {
            return part.check(&rules[0], now, cost);
        }
        let remaining = self.remaining(rules, now);
        if cost == 0 {
            return Decision::admit(remaining);
        }
        if let Some(by) = rules.iter().position(|r| cost > r.limit) {
            return Decision::reject(remaining, NEVER).by_rule(by);
        }
        let mut after = self.parts.clone();
        let decisions: Vec<Decision> = after
            .iter_mut()
            .zip(rules)
            .map(|(part, rules)| part.check(rules, now, cost))
            .collect();
        if decisions.iter().all(|d| d.allowed) {
            self.parts = after;
            return Decision {
                remaining: decisions.iter().map(|d| d.remaining).min().unwrap_or(0),
                delay: decisions.iter().map(|d| d.delay).max().unwrap_or(0),
                ..Decision::admit(0)
            };
        }
        // Refused: nothing kept. The longest wait, by the first rule that
        // waits it; `remaining` as each rule would answer it now.
        let wait = decisions
            .iter()
            .filter(|d| !d.allowed)
            .map(|d| d.retry_after)
            .max()
            .unwrap_or(NEVER);
        let by = decisions
            .iter()
            .position(|d| !d.allowed && d.retry_after == wait)
            .unwrap_or(0);
        Decision::reject(remaining, wait).by_rule(by)
    }

    /// `remaining` at `now` (absolute): the smallest of the rules'.
    pub(super) fn remaining(&self, rules: &[Rules], now: u64) -> u64 {
        self.parts
            .iter()
            .zip(rules)
            .map(|(part, rules)| part.remaining(rules, now))
            .min()
            .unwrap_or(0)
    }

    /// Gives back up to `cost` units of the admission made at `at` (both
    /// absolute, `at <= now`), the contract's "Giving units back": every
    /// rule gives back on its own, and the answer is the smallest of what
    /// they gave, leaving out `in-flight` rules (0 if every rule is one).
    pub(super) fn refund(&mut self, rules: &[Rules], now: u64, at: u64, cost: u64) -> u64 {
        self.parts
            .iter_mut()
            .zip(rules)
            // An `in-flight` rule is left out: a release gives its units
            // back, never a refund.
            .filter(|(_, rules)| rules.policy.has_window())
            .map(|(part, rules)| part.refund(rules, now, at, cost))
            .min()
            .unwrap_or(0)
    }

    /// Gives back up to `cost` of the units its `in-flight` rules hold
    /// (the contract's "Requests in flight"): each gives back on its own,
    /// the answer is the smallest; 0 without such a rule.
    pub(super) fn release(&mut self, rules: &[Rules], cost: u64) -> u64 {
        self.parts
            .iter_mut()
            .zip(rules)
            .filter(|(_, rules)| rules.policy == PolicyKind::InFlight)
            .map(|(part, _)| part.state.release(cost))
            .min()
            .unwrap_or(0)
    }

    /// Whether a sweep at `now` may forget this client: every rule's part
    /// is idle.
    pub(super) fn idle_at(&self, rules: &[Rules], now: u64) -> bool {
        self.parts
            .iter()
            .zip(rules)
            .all(|(part, rules)| part.idle_at(rules, now))
    }

    /// Each rule's own answer to a request decided `decided`
    /// (`RuledDecision::each`), from the parts as they are now.
    pub(super) fn each(
        &self,
        set: &RuleSet,
        rules: &[Rules],
        now: u64,
        cost: u64,
        decided: &Decision,
    ) -> crate::RuleAnswers {
        let mut answers = crate::RuleAnswers::default();
        for ((part, rules), rule) in self.parts.iter().zip(rules).zip(set.iter()) {
            let remaining = part.remaining(rules, now);
            let decision = if cost == 0 {
                Decision::admit(remaining)
            } else if cost > rules.limit {
                Decision::reject(remaining, NEVER)
            } else if decided.allowed {
                Decision::admit(remaining)
            } else {
                let own = part.clone().check(rules, now, cost);
                if own.allowed {
                    Decision { remaining, ..own }
                } else {
                    own
                }
            };
            answers.push(crate::RuleAnswer {
                rule: *rule,
                decision,
            });
        }
        answers
    }
}

/// One rule's part of a client: when it was created, and its policy's
/// state.
#[derive(Clone, Debug)]
pub(super) struct Part {
    pub(super) origin: u64,
    pub(super) state: State,
}

impl Part {
    /// A client created at `origin`. A schedule (`gcra`, `leaky-bucket`)
    /// counts from tick 0 and starts at `TAT = origin`, as the lock-free
    /// engine's does (it keeps no origin for them): the origin decides
    /// nothing else there, and a call before it is judged at its own time.
    /// A bucket keeps its origin (its drips fall on the origin's grid) and
    /// answers such a call as that engine does (`bucket_before_origin`).
    pub(super) fn new(origin: u64, rules: &Rules) -> Self {
        let (origin, state) = match rules.policy {
            PolicyKind::Gcra | PolicyKind::LeakyBucket => (0, State::Tat(u128::from(origin))),
            _ => (origin, State::new(rules)),
        };
        Self { origin, state }
    }

    /// Decides one request of cost `cost` at `now` (absolute, not since the
    /// origin).
    pub(super) fn check(&mut self, rules: &Rules, now: u64, cost: u64) -> Decision {
        match now.checked_sub(self.origin) {
            Some(since) => self.state.check(rules, since, cost),
            // A bucket answers a call before its origin at the call's time
            // (`bucket_before_origin`).
            None if matches!(self.state, State::Bucket { .. }) => {
                self.state
                    .bucket_before_origin(rules, self.origin - now, cost)
            }
            // A call that raced with the one creating the client, carrying an
            // earlier time: judged at the origin, it waits that much longer.
            None => {
                let lag = self.origin - now;
                let mut decision = self.state.check(rules, 0, cost);
                if cost == 0 {
                    // Changes nothing, so it waits for nothing either.
                } else if !decision.allowed {
                    decision.retry_after = decision.retry_after.saturating_add(lag);
                } else if rules.policy == PolicyKind::LeakyBucket {
                    decision.delay = decision.delay.saturating_add(lag);
                }
                decision
            }
        }
    }

    /// Gives back up to `cost` units of the admission at `at` (absolute),
    /// judged at `now` (absolute, raised to `at`; before the origin, at
    /// the origin, as a check). The drip policies give back whatever `at`
    /// is within a window; a window policy has nothing of an admission
    /// before its origin (its windows begin there).
    pub(super) fn refund(&mut self, rules: &Rules, now: u64, at: u64, cost: u64) -> u64 {
        let now = now.max(at);
        let ago = now - at;
        if cost == 0 || ago >= rules.window {
            return 0;
        }
        let since = now.saturating_sub(self.origin);
        self.state
            .refund(rules, since, since.checked_sub(ago), cost)
    }

    /// `remaining` at `now` (absolute); a `now` before the origin is read at
    /// the origin (a bucket's, at its own time: `bucket_before_origin`).
    pub(super) fn remaining(&self, rules: &Rules, now: u64) -> u64 {
        match now.checked_sub(self.origin) {
            Some(since) => self.state.remaining(rules, since),
            None => match self.state {
                State::Bucket { schedule, .. } => rules
                    .limit
                    .saturating_sub(lacking_before_origin(schedule, rules, self.origin - now)),
                _ => self.state.remaining(rules, 0),
            },
        }
    }

    /// A part created at `now` that has spent `spent` (at most the limit)
    /// as if that many units had just been admitted, as the lock-free
    /// engine's `spent_state`: a schedule that far ahead, a bucket that
    /// many tokens short, a window's count, a log's entries at `now`; an
    /// `in-flight` rule holding nothing.
    pub(super) fn spent(rules: &Rules, spent: u64, now: u64) -> Part {
        let spent = spent.min(rules.limit);
        let (origin, state) = match rules.policy {
            PolicyKind::Gcra | PolicyKind::LeakyBucket => (
                0,
                State::Tat(u128::from(now) + u128::from(spent) * u128::from(rules.interval)),
            ),
            PolicyKind::TokenBucket => (
                now,
                State::Bucket {
                    tokens: rules.limit - spent,
                    drips: 0,
                    schedule: spent,
                },
            ),
            PolicyKind::FixedWindow => (
                now,
                State::Fixed {
                    index: 0,
                    count: spent,
                },
            ),
            PolicyKind::SlidingWindowCounter => (
                now,
                State::Counter {
                    index: 0,
                    previous: 0,
                    current: spent,
                },
            ),
            // At most `L` entries, each of one unit, at the origin.
            PolicyKind::SlidingWindow => (
                now,
                State::Log(std::iter::repeat_n(0, spent as usize).collect()),
            ),
            PolicyKind::InFlight => (now, State::Held(0)),
        };
        Part { origin, state }
    }

    /// Keeps the part for a save: its origin, then its state's fields
    /// (`Part::load` reads them back); an `in-flight` part keeps nothing,
    /// as it loads holding nothing.
    pub(super) fn save(&self, out: &mut Vec<u64>) {
        out.push(self.origin);
        match &self.state {
            State::Log(times) => {
                out.push(times.len() as u64);
                out.extend(times);
            }
            &State::Bucket {
                tokens,
                drips,
                schedule,
            } => out.extend([tokens, drips, schedule]),
            &State::Fixed { index, count } => out.extend([index, count]),
            &State::Counter {
                index,
                previous,
                current,
            } => out.extend([index, previous, current]),
            // Both halves, each cast exactly.
            &State::Tat(tat) => out.extend([tat as u64, (tat >> 64) as u64]),
            State::Held(_) => {}
        }
    }

    /// The part `save` kept at the front of `words` (which then hold what
    /// follows it), if its fields are a state of `rules`: counts and
    /// tokens at most the limit, a log of at most `L` times that never
    /// fall.
    pub(super) fn load(rules: &Rules, words: &mut &[u64]) -> Option<Part> {
        let mut take = |n: usize| {
            let (taken, rest) = words.split_at_checked(n)?;
            *words = rest;
            Some(taken)
        };
        let origin = take(1)?[0];
        let limit = rules.limit;
        let state = match rules.policy {
            PolicyKind::SlidingWindow => {
                let n = take(1)?[0];
                if n > limit {
                    return None;
                }
                let times = take(usize::try_from(n).ok()?)?;
                if !times.windows(2).all(|pair| pair[0] <= pair[1]) {
                    return None;
                }
                State::Log(times.iter().copied().collect())
            }
            PolicyKind::TokenBucket => match *take(3)? {
                [tokens, drips, schedule] if tokens <= limit => State::Bucket {
                    tokens,
                    drips,
                    schedule,
                },
                _ => return None,
            },
            PolicyKind::FixedWindow => match *take(2)? {
                [index, count] if count <= limit => State::Fixed { index, count },
                _ => return None,
            },
            PolicyKind::SlidingWindowCounter => match *take(3)? {
                [index, previous, current] if previous <= limit && current <= limit => {
                    State::Counter {
                        index,
                        previous,
                        current,
                    }
                }
                _ => return None,
            },
            PolicyKind::Gcra | PolicyKind::LeakyBucket => match *take(2)? {
                [low, high] => State::Tat(u128::from(low) | (u128::from(high) << 64)),
                _ => return None,
            },
            PolicyKind::InFlight => State::Held(0),
        };
        Some(Part { origin, state })
    }

    /// Whether a sweep at `now` may forget this client. Never before its
    /// origin: a sweep whose `now` the client has not reached knows nothing
    /// of its future.
    pub(super) fn idle_at(&self, rules: &Rules, now: u64) -> bool {
        now.checked_sub(self.origin)
            .is_some_and(|since| self.state.is_idle(rules, since))
    }
}

/// One client's state, for whichever policy the limiter applies. Every time
/// in it is in ticks since the client's origin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// `sliding-window`: the times of the last (at most `L`) admissions,
    /// oldest first; older admissions can no longer decide anything.
    Log(VecDeque<u64>),
    /// `token-bucket`: the tokens in the bucket once the drips up to index
    /// `drips` (at `drips · I`) are counted; starts full at drip 0. And
    /// `schedule`, the drip from which it is full again if nothing more is
    /// taken (`max(schedule, d) + n` after an admission of `n` at drip
    /// `d`): what is left of it is `L − (max(schedule, d) − d)` from drip
    /// `d` on, as the lock-free engine stores it. Used only to answer a call
    /// before the origin as that engine does (`bucket_before_origin`).
    Bucket {
        tokens: u64,
        drips: u64,
        schedule: u64,
    },
    /// `fixed-window`: the admissions counted in window `index`, which spans
    /// `[index · W, (index + 1) · W)`.
    Fixed { index: u64, count: u64 },
    /// `sliding-window-counter`: window `index`'s count and the count of the
    /// window just before it.
    Counter {
        index: u64,
        previous: u64,
        current: u64,
    },
    /// `gcra` and `leaky-bucket`: the theoretical arrival time. A `u128`
    /// because `TAT ≤ now + W`, and both may be close to `u64::MAX`.
    Tat(u128),
    /// `in-flight`: the units held.
    Held(u64),
}

impl State {
    /// The state of a client that has made no call yet.
    pub(super) fn new(rules: &Rules) -> Self {
        match rules.policy {
            PolicyKind::SlidingWindow => State::Log(VecDeque::new()),
            PolicyKind::TokenBucket => State::Bucket {
                tokens: rules.limit,
                drips: 0,
                schedule: 0,
            },
            PolicyKind::FixedWindow => State::Fixed { index: 0, count: 0 },
            PolicyKind::SlidingWindowCounter => State::Counter {
                index: 0,
                previous: 0,
                current: 0,
            },
            PolicyKind::Gcra | PolicyKind::LeakyBucket => State::Tat(0),
            PolicyKind::InFlight => State::Held(0),
        }
    }

    /// Decides one request of cost `cost` at `now` ticks past the origin,
    /// recording it if admitted. The contract's "Weighted requests": a cost
    /// of 0 is admitted and changes nothing, a cost above `L` is never
    /// admitted, and any other is the last of `cost` single requests at
    /// `now`, admitted only if they all would be.
    pub(super) fn check(&mut self, rules: &Rules, now: u64, cost: u64) -> Decision {
        if cost == 0 {
            return Decision::admit(self.remaining(rules, now));
        }
        if cost > rules.limit {
            return Decision::reject(self.remaining(rules, now), u64::MAX);
        }
        match self {
            State::Log(times) => sliding_window_check(times, rules, now, cost),
            State::Bucket {
                tokens,
                drips,
                schedule,
            } => token_bucket_check(tokens, drips, schedule, rules, now, cost),
            State::Fixed { index, count } => fixed_window_check(index, count, rules, now, cost),
            State::Counter {
                index,
                previous,
                current,
            } => counter_check(index, previous, current, rules, now, cost),
            State::Tat(tat) => gcra_check(tat, rules, now, cost),
            State::Held(held) => {
                let after = *held + cost;
                if after <= rules.limit {
                    *held = after;
                    Decision::admit(rules.limit - after)
                } else {
                    Decision::reject(rules.limit.saturating_sub(*held), u64::MAX)
                }
            }
        }
    }

    /// Gives back up to `cost >= 1` units of the admission at `at` (past
    /// the origin; `None` before it), at `now` (`now - at < W`): the
    /// contract's table in "Giving units back", each policy's state read at
    /// `now` as its check reads it.
    pub(super) fn refund(&mut self, rules: &Rules, now: u64, at: Option<u64>, cost: u64) -> u64 {
        let at = match (&*self, at) {
            (State::Bucket { .. } | State::Tat(_), _) => at.unwrap_or(0),
            (_, Some(at)) => at,
            // Before a window policy's first window: nothing counted there.
            (_, None) => return 0,
        };
        match self {
            State::Log(times) => {
                // Judged no earlier than the newest admission, as a check is.
                let now = now.max(times.back().copied().unwrap_or(0));
                if u128::from(at) + u128::from(rules.window) <= u128::from(now) {
                    return 0;
                }
                // The admissions at `at`: one time per unit, side by side.
                let first = times.partition_point(|&t| t < at);
                let here = (times.partition_point(|&t| t <= at) - first) as u64;
                let given = cost.min(here);
                // `given <= here`, so the range is within the deque; a
                // drain moves the shorter side over the gap once.
                times.drain(first..first + given as usize);
                given
            }
            State::Bucket {
                tokens,
                drips,
                schedule,
            } => {
                let (available, counted) = drip(*tokens, *drips, rules, now);
                let given = cost.min(rules.limit - available);
                if given > 0 {
                    *tokens = available + given;
                    *drips = counted;
                    // `L − (max(B, d) − d)` tokens from drip `d`: `given`
                    // more (it is at most `max(B, d) − d`).
                    *schedule = (*schedule).max(counted) - given;
                }
                given
            }
            State::Fixed { index, count } => {
                // The window a check at `now` counts in (a `now` before the
                // stored window is judged in it).
                let window = (now / rules.window).max(*index);
                if at / rules.window != window || window != *index {
                    return 0;
                }
                let given = cost.min(*count);
                *count -= given;
                given
            }
            State::Counter {
                index,
                previous,
                current,
            } => {
                let seen = counter_at(*index, *previous, *current, rules, now);
                let (mut p, mut c) = (seen.previous, seen.current);
                let admitted = at / rules.window;
                let given = if admitted == seen.index {
                    let given = cost.min(c);
                    c -= given;
                    given
                } else if admitted + 1 == seen.index {
                    let given = cost.min(p);
                    p -= given;
                    given
                } else {
                    0
                };
                if given > 0 {
                    (*index, *previous, *current) = (seen.index, p, c);
                }
                given
            }
            State::Tat(tat) => {
                let now_wide = u128::from(now);
                let given = cost.min(rules.limit - gcra_remaining(*tat, rules, now));
                if given > 0 {
                    let t = (*tat).max(now_wide);
                    let back = u128::from(given) * u128::from(rules.interval);
                    *tat = t.saturating_sub(back).max(now_wide);
                }
                given
            }
            // A release gives held units back, never a refund (the
            // contract: a failed request is refunded and released, each
            // once).
            State::Held(_) => 0,
        }
    }

    /// Gives back `min(cost, h)` of an `in-flight` rule's held units; 0
    /// for every other policy.
    pub(super) fn release(&mut self, cost: u64) -> u64 {
        match self {
            State::Held(held) => {
                let released = cost.min(*held);
                *held -= released;
                released
            }
            _ => 0,
        }
    }

    /// How many requests would be admitted one after another at `now`.
    pub(super) fn remaining(&self, rules: &Rules, now: u64) -> u64 {
        // Each policy's check on a copy would give the same answer (the unit
        // tests confirm it); the formulas below are the spec's.
        match self {
            State::Log(times) => {
                let now = now.max(times.back().copied().unwrap_or(0));
                rules.limit - in_window(times, rules.window, now)
            }
            State::Bucket { tokens, drips, .. } => drip(*tokens, *drips, rules, now).0,
            State::Fixed { index, count } => {
                if now / rules.window > *index {
                    rules.limit
                } else {
                    rules.limit - count
                }
            }
            State::Counter {
                index,
                previous,
                current,
            } => {
                let at = counter_at(*index, *previous, *current, rules, now);
                counter_remaining(at.previous, at.current, at.elapsed, rules)
            }
            State::Tat(tat) => gcra_remaining(*tat, rules, now),
            State::Held(held) => rules.limit.saturating_sub(*held),
        }
    }
}

impl State {
    /// Whether this state answers every call at `now` ticks past the origin
    /// or later as a new client's state would (the grid policies: a new
    /// client on this client's grid). See the module docs for why each test
    /// is exactly that.
    pub(super) fn is_idle(&self, rules: &Rules, now: u64) -> bool {
        match self {
            // Every kept time has left the window ending at `now`, so it is
            // out of every later window too; and it can never decide a
            // rejection again (that needs L times inside the window, all of
            // which would then be newer).
            State::Log(times) => times.back().is_none_or(|&newest| {
                u128::from(newest) + u128::from(rules.window) <= u128::from(now)
            }),
            // Full at `now`, and nothing drains a bucket but an admission.
            State::Bucket { tokens, drips, .. } => {
                drip(*tokens, *drips, rules, now).0 == rules.limit
            }
            // Count 0 is only the new state (every admission counts); a past
            // window's count never decides anything again.
            State::Fixed { index, count } => *count == 0 || now / rules.window > *index,
            // Both counts that could weigh at `now` are 0, and later windows
            // only roll zeros in.
            State::Counter {
                index,
                previous,
                current,
            } => {
                let at = counter_at(*index, *previous, *current, rules, now);
                at.previous == 0 && at.current == 0
            }
            // `max(TAT, t) = t` for every `t ≥ now`, as for a new client's
            // `TAT = origin`.
            State::Tat(tat) => *tat <= u128::from(now),
            // Held units come back only by a release, never by time.
            State::Held(held) => *held == 0,
        }
    }
}
