//! The answer a policy gives for one request.

use std::time::Duration;

use crate::Tick;

/// What a limiter answers for one request of one client at one instant.
///
/// Being limited is a normal answer, not an error: `allowed == false` with
/// `retry_after` saying when the same request would get through. The times
/// are in ticks of the limiter's clock, and the decision carries that tick,
/// so it turns itself into durations:
///
/// ```
/// use floodgate::{Config, Decision, ManualClock, PolicyKind, RateLimiter, Tick};
/// use std::time::Duration;
///
/// let limiter = floodgate::Builder::new(PolicyKind::FixedWindow, 1, Duration::from_secs(60))
///     .clock(ManualClock::new(0))
///     .build::<str>()?;
/// assert!(limiter.check_at("app", 0).allowed);
/// let refused = limiter.check_at("app", 1_500_000_000); // 1.5 s later
/// assert!(!refused.allowed);
/// assert_eq!(refused.retry_after_duration(), Duration::from_millis(58_500));
/// assert_eq!(refused.retry_after_secs(), 59); // for `Retry-After`: rounded up
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Whether the request is admitted.
    pub allowed: bool,
    /// What `remaining` would answer right after this call: how many
    /// requests arriving one after another at this same instant would be
    /// admitted. While other threads decide for the same client, it may
    /// already count their later admissions (the sliding log reads it just
    /// after its own): it never promises more than later checks honour.
    pub remaining: u64,
    /// For a rejected request, the smallest `d >= 1` tick such that the
    /// same request at `now + d` would be admitted if nothing else happened
    /// in between; 0 for an admitted one. In seconds for an HTTP
    /// `Retry-After`: [`retry_after_secs`](Self::retry_after_secs).
    pub retry_after: u64,
    /// Leaky bucket only: how many ticks an admitted request must wait
    /// before it proceeds (its place in the queue). 0 for every other
    /// policy and for rejected requests.
    pub delay: u64,
    /// The length of the ticks above: the limiter's clock's.
    pub tick: Tick,
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
        }
    }

    /// A rejected request. `remaining` is what a `remaining` call would
    /// answer at this instant (the policies that reject at full capacity
    /// always answer 0, but the counter policy may not).
    pub(crate) const fn reject(remaining: u64, retry_after: u64) -> Self {
        Self {
            allowed: false,
            remaining,
            retry_after,
            delay: 0,
            tick: Tick::NANOSECOND,
        }
    }

    /// The decision with its times in ticks of `tick`.
    #[inline]
    pub(crate) const fn in_ticks(mut self, tick: Tick) -> Self {
        self.tick = tick;
        self
    }

    /// [`retry_after`](Self::retry_after) as a duration (saturating at
    /// [`Duration::MAX`], which a request that can never be admitted gets).
    pub fn retry_after_duration(&self) -> Duration {
        self.tick.times(self.retry_after)
    }

    /// [`delay`](Self::delay) as a duration.
    pub fn delay_duration(&self) -> Duration {
        self.tick.times(self.delay)
    }

    /// [`retry_after`](Self::retry_after) in whole seconds, rounded up, as
    /// an HTTP `Retry-After` wants it: never 0 for a rejection (a client
    /// told 0 would retry at once and be refused again), 0 for an
    /// admission.
    pub fn retry_after_secs(&self) -> u64 {
        if self.allowed {
            return 0;
        }
        let wait = self.retry_after_duration();
        let whole = wait.as_secs();
        let secs = if wait.subsec_nanos() > 0 {
            whole.saturating_add(1)
        } else {
            whole
        };
        secs.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_follow_the_tick_and_seconds_round_up() {
        let refused = |retry_after, tick| Decision {
            tick,
            ..Decision::reject(0, retry_after)
        };
        assert_eq!(refused(1, Tick::NANOSECOND).retry_after_secs(), 1);
        assert_eq!(refused(1_500, Tick::MILLISECOND).retry_after_secs(), 2);
        assert_eq!(refused(2_000, Tick::MILLISECOND).retry_after_secs(), 2);
        assert_eq!(
            refused(1_500, Tick::MICROSECOND).retry_after_duration(),
            Duration::from_micros(1_500)
        );
        assert_eq!(
            refused(u64::MAX, Tick::SECOND)
                .retry_after_duration()
                .as_secs(),
            u64::MAX
        );
        assert_eq!(refused(u64::MAX, Tick::SECOND).retry_after_secs(), u64::MAX);
        let admitted = Decision {
            delay: 250,
            ..Decision::admit(3).in_ticks(Tick::MILLISECOND)
        };
        assert_eq!(admitted.retry_after_secs(), 0);
        assert_eq!(admitted.delay_duration(), Duration::from_millis(250));
    }
}
