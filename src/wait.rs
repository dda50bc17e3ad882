//! Waiting instead of refusing (cargo feature `tokio`): an async call that
//! returns once a request is admitted, and the shaper's call that sleeps
//! the leaky bucket's `delay`.
//!
//! # What a call site gets, by policy
//!
//! [`RateLimiter::check`] never waits: it answers at once, and a rejection
//! says in `retry_after` when to come back. What waiting adds:
//!
//! | policy | [`until_ready`] | [`shaped`] |
//! | --- | --- | --- |
//! | `leaky-bucket` | waits for room in the queue, then sleeps the admission's `delay`: requests leave one per `W / L`, as from a shaper | sleeps the `delay` of an admitted request; a full queue is refused at once |
//! | every other policy | sleeps each rejection's `retry_after` and asks again, until admitted | as [`RateLimiter::check`]: their `delay` is always 0 |
//!
//! A generic call site that only calls `check` and ignores `delay` gets the
//! leaky bucket's admissions *without* its shaping: the same requests pass,
//! but in bursts, as `gcra` would let them.
//!
//! # Cancellation
//!
//! Both are cancellation-safe: a future dropped while it waits for a
//! rejection's `retry_after` has admitted nothing and counted nothing. A
//! future dropped while it sleeps an admitted request's `delay` leaves that
//! admission counted (its place in the queue is spent, as a request that
//! gave up in a shaper's queue would have spent it): nothing more.
//!
//! # Waiting on a limiter's own clock
//!
//! The sleeps are `tokio::time::sleep`s of the decision's durations, so the
//! limiter's clock must move with real time (the default TSC clock does, a
//! manual clock does not).

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use crate::{Decision, RateLimiter};

/// A request that no wait could admit: its rejection says `retry_after`
/// `u64::MAX` ticks (a tier the registry lacks and refuses, say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NeverAdmitted {
    /// The rejection.
    pub decision: Decision,
}

impl fmt::Display for NeverAdmitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the request can never be admitted: waiting would not end")
    }
}

impl std::error::Error for NeverAdmitted {}

/// Waits until one request of `key` is admitted, and answers that
/// admission; for the leaky bucket, also sleeps the admission's `delay`.
///
/// # Errors
///
/// [`NeverAdmitted`] at once for a request no wait could admit.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use floodgate::{wait, Builder, PolicyKind};
/// use std::time::{Duration, Instant};
///
/// let limiter = Builder::new(PolicyKind::Gcra, 1, Duration::from_millis(20)).build::<str>()?;
/// let start = Instant::now();
/// for _ in 0..3 {
///     assert!(wait::until_ready(&*limiter, "job").await?.allowed());
/// }
/// assert!(start.elapsed() >= Duration::from_millis(40)); // one per 20 ms
/// # Ok(())
/// # }
/// ```
pub async fn until_ready<Q, L>(limiter: &L, key: &Q) -> Result<Decision, NeverAdmitted>
where
    Q: ?Sized,
    L: RateLimiter<Q> + ?Sized,
{
    wait(limiter, key, 1, Duration::ZERO).await
}

/// As [`until_ready`] for one request of cost `cost` (the contract's
/// "Weighted requests"): waits until all of it is admitted at once, never
/// part of it. A cost of 0 is admitted at once.
///
/// # Errors
///
/// [`NeverAdmitted`] at once for a cost above the limit — no wait could
/// admit it, so none is tried — and for any other request no wait could
/// admit.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use floodgate::{wait, Builder, PolicyKind};
/// use std::time::Duration;
///
/// let limiter =
///     Builder::new(PolicyKind::TokenBucket, 4, Duration::from_millis(40)).build::<str>()?;
/// assert_eq!(wait::until_ready_n(&*limiter, "job", 3).await?.remaining(), 1);
/// assert!(wait::until_ready_n(&*limiter, "job", 5).await.is_err()); // more than the bucket
/// # Ok(())
/// # }
/// ```
pub async fn until_ready_n<Q, L>(limiter: &L, key: &Q, cost: u64) -> Result<Decision, NeverAdmitted>
where
    Q: ?Sized,
    L: RateLimiter<Q> + ?Sized,
{
    wait(limiter, key, cost, Duration::ZERO).await
}

/// As [`until_ready`], adding to each wait for a rejection a random extra
/// of up to `jitter`, so that clients refused at the same instant do not
/// all come back at the same instant.
///
/// # Errors
///
/// [`NeverAdmitted`] at once for a request no wait could admit.
pub async fn until_ready_jittered<Q, L>(
    limiter: &L,
    key: &Q,
    jitter: Duration,
) -> Result<Decision, NeverAdmitted>
where
    Q: ?Sized,
    L: RateLimiter<Q> + ?Sized,
{
    wait(limiter, key, 1, jitter).await
}

/// One check; if it is admitted with a `delay` (the leaky bucket), sleeps
/// that delay before answering. A rejection is answered at once, as nginx
/// `limit_req` without `nodelay` answers a request beyond its burst.
pub async fn shaped<Q, L>(limiter: &L, key: &Q) -> Decision
where
    Q: ?Sized,
    L: RateLimiter<Q> + ?Sized,
{
    let decision = limiter.check(key);
    if decision.allowed && decision.delay > 0 {
        tokio::time::sleep(decision.delay()).await;
    }
    decision
}

async fn wait<Q, L>(
    limiter: &L,
    key: &Q,
    cost: u64,
    jitter: Duration,
) -> Result<Decision, NeverAdmitted>
where
    Q: ?Sized,
    L: RateLimiter<Q> + ?Sized,
{
    // Progress: each refusal sleeps until the policy's `retry_after`, when
    // the request would be admitted but for other callers; a request that
    // can never be admitted ends at once (`NeverAdmitted`).
    loop {
        // A cost above the limit is refused with no `retry_after` (the
        // contract), so it ends below without a sleep.
        let decision = limiter.check_n(key, cost);
        if decision.allowed {
            if decision.delay > 0 {
                tokio::time::sleep(decision.delay()).await;
            }
            return Ok(decision);
        }
        let Some(wait) = decision.retry_after() else {
            return Err(NeverAdmitted { decision });
        };
        let pause = wait + random_up_to(jitter);
        tokio::time::sleep(pause).await;
    }
}

/// A pseudo-random duration in `[0, most)`: each call hashes a fresh
/// randomly seeded hasher's state, which is all jitter needs.
fn random_up_to(most: Duration) -> Duration {
    let nanos = u64::try_from(most.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(nanos);
    Duration::from_nanos(hasher.finish() % nanos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Builder, Clock, PolicyKind, Tick};
    use std::sync::Arc;
    use tokio::time::Instant;

    /// Nanoseconds of tokio's clock, which a paused runtime moves only
    /// through sleeps: the waits are then exact and instant.
    struct TokioClock(Instant);

    impl Clock for TokioClock {
        fn now(&self) -> u64 {
            u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
        }

        fn tick(&self) -> Tick {
            Tick::NANOSECOND
        }
    }

    fn limiter(policy: PolicyKind) -> Arc<dyn RateLimiter<str>> {
        Builder::new(policy, 2, Duration::from_secs(1))
            .clock(TokioClock(Instant::now()))
            .build::<str>()
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn until_ready_waits_exactly_the_retry_after() {
        let limiter = limiter(PolicyKind::Gcra); // 2 at once, then one per 500 ms
        let start = Instant::now();
        for _ in 0..4 {
            assert!(until_ready(&*limiter, "a").await.unwrap().allowed);
        }
        assert_eq!(start.elapsed(), Duration::from_millis(1_000));
    }

    #[tokio::test(start_paused = true)]
    async fn the_shaper_sleeps_its_delay_and_refuses_beyond_the_queue() {
        let limiter = limiter(PolicyKind::LeakyBucket);
        let start = Instant::now();
        assert_eq!(shaped(&*limiter, "a").await.delay, 0);
        let second = shaped(&*limiter, "a").await;
        assert_eq!(second.delay(), Duration::from_millis(500));
        assert_eq!(start.elapsed(), Duration::from_millis(500));
        // The queue holds 2; at 500 ms one has left: a third is admitted
        // (500 ms to wait), a fourth refused at once, with no sleep.
        assert_eq!(limiter.check("a").delay(), Duration::from_millis(500));
        let refused = shaped(&*limiter, "a").await;
        assert!(!refused.allowed);
        assert_eq!(start.elapsed(), Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_wait_counts_nothing() {
        let limiter = limiter(PolicyKind::FixedWindow);
        assert!(limiter.allow("a") && limiter.allow("a"));
        // Waiting for the next window, then given up after 100 ms.
        let gave_up =
            tokio::time::timeout(Duration::from_millis(100), until_ready(&*limiter, "a")).await;
        assert!(gave_up.is_err());
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert_eq!(limiter.remaining("a"), 2, "the dropped wait took nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn until_ready_n_waits_for_the_whole_cost_and_refuses_more_than_the_limit() {
        // Token bucket, L = 2 per second: a token every 500 ms.
        let limiter = limiter(PolicyKind::TokenBucket);
        let start = Instant::now();
        assert_eq!(until_ready_n(&*limiter, "a", 2).await.unwrap().remaining, 0);
        // Two tokens short: both drips, at 500 and 1000 ms, and no
        // admission of the first one alone.
        assert_eq!(until_ready_n(&*limiter, "a", 2).await.unwrap().remaining, 0);
        assert_eq!(start.elapsed(), Duration::from_millis(1_000));
        let never = until_ready_n(&*limiter, "a", 3).await.unwrap_err();
        assert_eq!(never.decision.retry_after, u64::MAX);
        assert_eq!(start.elapsed(), Duration::from_millis(1_000), "no wait");
        assert!(until_ready_n(&*limiter, "a", 0).await.unwrap().allowed);
        assert_eq!(limiter.remaining("a"), 0);
    }

    /// Each of 32 clients waits out its window plus a jitter below 50 ms.
    /// Tokio's timer rounds a deadline up to its next whole millisecond, so
    /// a jitter just under the bound wakes exactly at it (one wait in 50).
    #[tokio::test(start_paused = true)]
    async fn jitter_stays_within_its_bound() {
        let limiter = limiter(PolicyKind::FixedWindow);
        let jitter = Duration::from_millis(50);
        for client in 0..32 {
            let key = format!("client-{client}");
            assert!(limiter.allow(&key) && limiter.allow(&key));
            let start = Instant::now();
            until_ready_jittered(&*limiter, &key, jitter).await.unwrap();
            let waited = start.elapsed();
            assert!(
                waited >= Duration::from_secs(1) && waited <= Duration::from_secs(1) + jitter,
                "client {client} waited {waited:?}"
            );
        }
    }
}
