//! What the layer asks a limiter: one decision and the rule that made it,
//! from a limiter in memory or from the Redis store, without blocking.

use std::future::{ready, Future};

use crate::{RateLimiter, RuledDecision};

/// A limiter the layer can ask without blocking its runtime: one decision
/// for one request, with the rule that made it (for the headers).
///
/// Every [`RateLimiter`] is one: its check is a few hundred nanoseconds of
/// lock-free work, answered at once (a ready future). Under the cargo
/// feature `redis`, [`AsyncRedisLimiter`](crate::redis::AsyncRedisLimiter)
/// is one for `str` and `IpAddr` keys: its check is one script call on the
/// shared connection, awaited, and its fault rule answers when Redis fails,
/// so a request never waits longer than the store's timeout.
pub trait AsyncLimiter<Q: ?Sized>: Send + Sync {
    /// Decides one request of `key` now, by the limiter's clock.
    fn check_ruled(&self, key: &Q) -> impl Future<Output = RuledDecision<'_>> + Send;
}

impl<Q, L> AsyncLimiter<Q> for L
where
    Q: ?Sized + Sync,
    L: RateLimiter<Q> + ?Sized,
{
    #[inline]
    fn check_ruled(&self, key: &Q) -> impl Future<Output = RuledDecision<'_>> + Send {
        ready(self.check_ruled_at(key, self.now()))
    }
}

#[cfg(feature = "redis")]
mod redis {
    use std::future::Future;
    use std::net::IpAddr;

    use super::AsyncLimiter;
    use crate::redis::AsyncRedisLimiter;
    use crate::RuledDecision;

    impl AsyncLimiter<str> for AsyncRedisLimiter {
        async fn check_ruled(&self, key: &str) -> RuledDecision<'_> {
            let decision = self.check(key).await;
            RuledDecision {
                decision,
                tier: None,
                policy: self.policy(),
                config: self.config(),
            }
        }
    }

    /// An address is stored under its text (`203.0.113.7`, `2001:db8::`).
    impl AsyncLimiter<IpAddr> for AsyncRedisLimiter {
        fn check_ruled(&self, key: &IpAddr) -> impl Future<Output = RuledDecision<'_>> + Send {
            let key = key.to_string();
            async move { AsyncLimiter::<str>::check_ruled(self, &key).await }
        }
    }
}
