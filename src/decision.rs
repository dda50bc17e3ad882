//! The answer a policy gives for one request.

use std::time::Duration;

use crate::Tick;

/// What a limiter answers for one request of one client at one instant.
///
/// Being limited is a normal answer, not an error: [`allowed`](Self::allowed)
/// is false and [`retry_after`](Self::retry_after) says when the same
/// request would get through — or `None`, when it never can (its cost is
/// above the limit, or a registry refused its unknown tier). The times come
/// out as [`Duration`]s, whatever the limiter's clock counts in, so no
/// caller has to know that unit:
///
/// ```
/// use floodgate::{ManualClock, PolicyKind};
/// use std::time::Duration;
///
/// fn main() -> Result<(), Box<dyn std::error::Error>> {
///     let limiter = floodgate::Builder::new(PolicyKind::FixedWindow, 1, Duration::from_secs(60))
///         .clock(ManualClock::new(0))
///         .build::<str>()?;
///     assert!(limiter.check_at("app", 0).allowed());
///     let refused = limiter.check_at("app", 1_500_000_000); // 1.5 s later
///     assert!(!refused.allowed());
///     assert_eq!(refused.retry_after(), Some(Duration::from_millis(58_500)));
///     assert_eq!(refused.retry_after_secs(), Some(59)); // for `Retry-After`: rounded up
///     // A request that costs more than the limit is never admitted.
///     let too_big = limiter.check_n_at("app", 1_500_000_000, 2);
///     assert_eq!(too_big.retry_after(), None);
///     Ok(())
/// }
/// ```
#[derive(Clone, Copy, Default)]
pub struct Decision {
    /// Whether the request is admitted.
    pub(crate) allowed: bool,
    /// What `remaining` would answer right after this call.
    pub(crate) remaining: u64,
    /// In ticks of `tick`: 0 for an admitted request, [`NEVER`] for one
    /// that can never be admitted, else the smallest `d >= 1`.
    pub(crate) retry_after: u64,
    /// In ticks of `tick`: the shaper's wait.
    pub(crate) delay: u64,
    /// The length of the ticks above: the limiter's clock's.
    pub(crate) tick: Tick,
    /// For a rejection, which of the limiter's rules refused (its index;
    /// the one with the longest wait when several did). Beside `allowed`
    /// in the struct's padding: the decision is no larger for it.
    pub(crate) refused_by: u8,
    /// The limiter's time of the call, in ticks of `tick`: what a refund
    /// names the admission by ([`RateLimiter::refund`](crate::RateLimiter::refund)).
    pub(crate) at: u64,
}

/// The `retry_after` of a request that can never be admitted, in the
/// engines' arithmetic (`Decision::retry_after` answers `None` for it): a
/// wait of `u64::MAX` ticks is at least 584 years, which no client can be
/// told to honour.
pub(crate) const NEVER: u64 = u64::MAX;

/// Two decisions are equal when they answer alike: admitted or not, what
/// remains, the waits, the rule that refused, in the same tick. When they
/// were made ([`at_ticks`](Decision::at_ticks)) is not part of the answer.
impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        self.answer() == other.answer()
    }
}

impl Eq for Decision {}

impl std::hash::Hash for Decision {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.answer().hash(state);
    }
}

impl Decision {
    /// Every field but the time it was made at.
    fn answer(&self) -> (bool, u64, u64, u64, Tick, u8) {
        (
            self.allowed,
            self.remaining,
            self.retry_after,
            self.delay,
            self.tick,
            self.refused_by,
        )
    }
}

/// What the accessors answer, not the engine's words: a request that is
/// never admitted shows `retry_after: None`, not 2^64 − 1 ticks.
impl std::fmt::Debug for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut debug = f.debug_struct("Decision");
        debug
            .field("allowed", &self.allowed())
            .field("remaining", &self.remaining());
        if !self.allowed() {
            debug
                .field("retry_after", &self.retry_after())
                .field("refused_by", &self.refused_by());
        }
        if self.delay_ticks() != 0 {
            debug.field("delay", &self.delay());
        }
        debug.field("tick", &self.tick()).finish()
    }
}

impl Decision {
    /// An admitted request.
    pub(crate) const fn admit(remaining: u64) -> Self {
        Self {
            allowed: true,
            remaining,
            retry_after: 0,
            delay: 0,
            tick: Tick::NANOSECOND,
            refused_by: 0,
            at: 0,
        }
    }

    /// A rejected request. `remaining` is what a `remaining` call would
    /// answer at this instant (the policies that reject at full capacity
    /// always answer 0, but the counter policy may not); `retry_after` is
    /// [`NEVER`] for a request that can never be admitted.
    pub(crate) const fn reject(remaining: u64, retry_after: u64) -> Self {
        Self {
            allowed: false,
            remaining,
            retry_after,
            delay: 0,
            tick: Tick::NANOSECOND,
            refused_by: 0,
            at: 0,
        }
    }

    /// The decision, refused by rule `index` (a limiter with several
    /// rules; at most [`MAX_RULES`](crate::MAX_RULES), so it fits a byte).
    #[inline]
    pub(crate) const fn by_rule(mut self, index: usize) -> Self {
        self.refused_by = index as u8;
        self
    }

    /// The decision with its times in ticks of `tick`.
    #[inline]
    pub(crate) const fn in_ticks(mut self, tick: Tick) -> Self {
        self.tick = tick;
        self
    }

    /// The decision, made by a call at `now` (the limiter's ticks).
    #[inline]
    pub(crate) const fn made_at(mut self, now: u64) -> Self {
        self.at = now;
        self
    }

    /// The limiter's time of the call that made this decision, in ticks of
    /// its clock ([`tick`](Self::tick)): the `now` a
    /// [`refund`](crate::RateLimiter::refund) names the admission by, so
    /// that a caller never computes ticks.
    #[inline]
    pub const fn at_ticks(&self) -> u64 {
        self.at
    }

    /// An admitted request with `remaining` left, no delay, in
    /// nanoseconds: for a [`RateLimiter`](crate::RateLimiter) of your own
    /// (a wrapper, a test double).
    pub const fn admitted(remaining: u64) -> Self {
        Self::admit(remaining)
    }

    /// A rejected request, which the same request `retry_after_ticks`
    /// ticks later would pass (at least 1; `u64::MAX` is
    /// [`never_admitted`](Self::never_admitted)).
    pub const fn rejected(remaining: u64, retry_after_ticks: u64) -> Self {
        Self::reject(
            remaining,
            if retry_after_ticks == 0 {
                1
            } else {
                retry_after_ticks
            },
        )
    }

    /// A rejected request that no wait would admit.
    pub const fn never_admitted(remaining: u64) -> Self {
        Self::reject(remaining, NEVER)
    }

    /// The decision with a shaper's delay of `ticks`.
    pub const fn with_delay(mut self, ticks: u64) -> Self {
        self.delay = ticks;
        self
    }

    /// The decision with its times in ticks of `tick` (a nanosecond
    /// unless set).
    pub const fn with_tick(self, tick: Tick) -> Self {
        self.in_ticks(tick)
    }

    /// Whether the request is admitted.
    #[inline]
    pub const fn allowed(&self) -> bool {
        self.allowed
    }

    /// What [`remaining`](crate::RateLimiter::remaining) would answer right
    /// after this call: how many requests arriving one after another at
    /// this same instant would be admitted. While other threads decide for
    /// the same client, it may already count their later admissions (the
    /// sliding log reads it just after its own): it never promises more
    /// than later checks honour.
    #[inline]
    pub const fn remaining(&self) -> u64 {
        self.remaining
    }

    /// How long until the same request would be admitted, if nothing else
    /// happened in between: zero for an admitted request, at least one
    /// tick of the clock for a rejected one, and `None` for a request that
    /// can never be admitted (its cost is above the limit, or a registry
    /// refused its unknown tier), which no wait would change.
    #[inline]
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after_ticks().map(|ticks| self.tick.times(ticks))
    }

    /// [`retry_after`](Self::retry_after) in whole seconds, rounded up, as
    /// an HTTP `Retry-After` wants it: never 0 for a rejection (a client
    /// told 0 would retry at once and be refused again), 0 for an
    /// admission, `None` for a request that can never be admitted.
    pub fn retry_after_secs(&self) -> Option<u64> {
        if self.allowed {
            return Some(0);
        }
        let wait = self.retry_after()?;
        let whole = wait.as_secs();
        let secs = if wait.subsec_nanos() > 0 {
            whole.saturating_add(1)
        } else {
            whole
        };
        Some(secs.max(1))
    }

    /// [`retry_after`](Self::retry_after) in ticks of the limiter's clock
    /// ([`tick`](Self::tick)), for exact arithmetic on a manual clock's
    /// instants; `None` for a request that can never be admitted.
    #[inline]
    pub const fn retry_after_ticks(&self) -> Option<u64> {
        if self.retry_after == NEVER {
            None
        } else {
            Some(self.retry_after)
        }
    }

    /// Leaky bucket only: how long an admitted request must wait before it
    /// proceeds (its place in the queue). Zero for every other policy and
    /// for rejected requests.
    #[inline]
    pub fn delay(&self) -> Duration {
        self.tick.times(self.delay)
    }

    /// [`delay`](Self::delay) in ticks of the limiter's clock.
    #[inline]
    pub const fn delay_ticks(&self) -> u64 {
        self.delay
    }

    /// For a rejection, the index of the rule that refused it, in the
    /// limiter's rules ([`RateLimiter::rules`](crate::RateLimiter::rules)):
    /// the one whose wait is the longest when several refused, so the one
    /// that [`retry_after`](Self::retry_after) comes from. Always 0 for a
    /// limiter with one rule; `None` for an admission.
    ///
    /// ```
    /// use floodgate::{Builder, ManualClock, PolicyKind, RateLimiter};
    /// use std::time::Duration;
    ///
    /// // 2 a second, and 3 a minute.
    /// let limiter = Builder::new(PolicyKind::Gcra, 2, Duration::from_secs(1))
    ///     .and(PolicyKind::FixedWindow, 3, Duration::from_secs(60))
    ///     .clock(ManualClock::new(0))
    ///     .build::<str>()?;
    /// assert!(limiter.check_at("app", 0).allowed());
    /// assert!(limiter.check_at("app", 0).allowed());
    /// assert_eq!(limiter.check_at("app", 0).refused_by(), Some(0)); // the burst
    /// assert!(limiter.check_at("app", 1_000_000_000).allowed());
    /// let quota = limiter.check_at("app", 2_000_000_000);
    /// assert_eq!(quota.refused_by(), Some(1)); // the minute's quota
    /// assert_eq!(quota.retry_after(), Some(Duration::from_secs(58)));
    /// # Ok::<(), floodgate::ConfigError>(())
    /// ```
    #[inline]
    pub const fn refused_by(&self) -> Option<usize> {
        if self.allowed {
            None
        } else {
            Some(self.refused_by as usize)
        }
    }

    /// The length of the limiter's clock's tick, which the `_ticks`
    /// accessors count in: a nanosecond in memory, a microsecond on Redis,
    /// a millisecond in `floodgate replay`.
    #[inline]
    pub const fn tick(&self) -> Tick {
        self.tick
    }
}

/// One rule's own answer to a request that a limiter with several rules
/// decided ([`RuledDecision::each`](crate::RuledDecision::each)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleAnswer {
    /// The rule.
    pub rule: crate::Rule,
    /// What this rule says, in the limiter's ticks: `allowed` whether it
    /// would admit the request on its own; `remaining` its own
    /// `remaining` after the decision (after the request, when the
    /// limiter admitted it); for a rule that refuses, its own
    /// `retry_after`.
    pub decision: Decision,
}

/// Each rule's own answer, in the limiter's order: empty for a limiter
/// with one rule, whose answer is the decision itself. Held inline (at
/// most [`MAX_RULES`](crate::MAX_RULES)): no allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleAnswers {
    answers: [Option<RuleAnswer>; crate::MAX_RULES],
    len: u8,
}

impl RuleAnswers {
    /// Adds the next rule's answer.
    pub(crate) fn push(&mut self, answer: RuleAnswer) {
        self.answers[usize::from(self.len)] = Some(answer);
        self.len += 1;
    }

    /// The answers with their times in ticks of `tick`.
    pub(crate) fn in_ticks(mut self, tick: Tick) -> Self {
        for answer in self.answers.iter_mut().flatten() {
            answer.decision = answer.decision.in_ticks(tick);
        }
        self
    }

    /// The answers, in the order of the limiter's rules.
    pub fn iter(&self) -> impl Iterator<Item = &RuleAnswer> + '_ {
        self.answers[..usize::from(self.len)].iter().flatten()
    }

    /// How many rules answered.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether there are none (a limiter with one rule).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Debug says what the accessors say: a request never admitted waits
    /// `None`, not 2^64 − 1 ticks; an admission shows no wait at all.
    #[test]
    fn debug_says_never_as_none() {
        let never = format!("{:?}", Decision::never_admitted(3));
        assert!(never.contains("retry_after: None"), "{never}");
        assert!(!never.contains(&u64::MAX.to_string()), "{never}");
        let refused = format!(
            "{:?}",
            Decision::reject(0, 1_500).in_ticks(Tick::MILLISECOND)
        );
        assert!(refused.contains("retry_after: Some(1.5s)"), "{refused}");
        let admitted = format!("{:?}", Decision::admit(7));
        assert!(
            admitted.contains("remaining: 7") && !admitted.contains("retry_after"),
            "{admitted}"
        );
    }

    #[test]
    fn durations_follow_the_tick_and_seconds_round_up() {
        let refused = |retry_after, tick| Decision::reject(0, retry_after).in_ticks(tick);
        assert_eq!(refused(1, Tick::NANOSECOND).retry_after_secs(), Some(1));
        assert_eq!(
            refused(1_500, Tick::MILLISECOND).retry_after_secs(),
            Some(2)
        );
        assert_eq!(
            refused(2_000, Tick::MILLISECOND).retry_after_secs(),
            Some(2)
        );
        assert_eq!(
            refused(1_500, Tick::MICROSECOND).retry_after(),
            Some(Duration::from_micros(1_500))
        );
        assert_eq!(
            refused(1_500, Tick::MICROSECOND).retry_after_ticks(),
            Some(1_500)
        );
        // The longest wait that is not "never" still converts, saturating.
        assert_eq!(
            refused(NEVER - 1, Tick::SECOND).retry_after(),
            Some(Tick::SECOND.times(NEVER - 1))
        );
        let admitted = Decision {
            delay: 250,
            ..Decision::admit(3).in_ticks(Tick::MILLISECOND)
        };
        assert_eq!(admitted.retry_after_secs(), Some(0));
        assert_eq!(admitted.retry_after(), Some(Duration::ZERO));
        assert_eq!(admitted.delay(), Duration::from_millis(250));
        assert_eq!(admitted.delay_ticks(), 250);
        assert_eq!(admitted.remaining(), 3);
    }

    /// A request that can never be admitted has no wait to give, in any
    /// unit: no sentinel reaches the caller.
    #[test]
    fn a_request_never_admitted_has_no_retry_after() {
        for tick in [Tick::NANOSECOND, Tick::MICROSECOND, Tick::SECOND] {
            let never = Decision::reject(0, NEVER).in_ticks(tick);
            assert!(!never.allowed());
            assert_eq!(never.retry_after(), None);
            assert_eq!(never.retry_after_ticks(), None);
            assert_eq!(never.retry_after_secs(), None);
        }
    }
}
