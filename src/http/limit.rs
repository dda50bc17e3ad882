//! What the layer asks a limiter: one decision and the rule that made it,
//! from a limiter in memory or from the Redis store, without blocking.

use std::future::{ready, Future};

use crate::{Decision, RateLimiter, RuledDecision};

/// A limiter the layer can ask without blocking its runtime: one decision
/// for one request, with the rule that made it (for the headers).
///
/// Every [`RateLimiter`] is one: its check is a few hundred nanoseconds of
/// lock-free work, answered at once (a ready future). Under the cargo
/// feature `redis`,
#[cfg_attr(
    feature = "redis",
    doc = "[`AsyncRedisLimiter`](crate::redis::AsyncRedisLimiter)"
)]
#[cfg_attr(not(feature = "redis"), doc = "`redis::AsyncRedisLimiter`")]
/// is one for `str` and `IpAddr` keys: its check is one script call on the
/// shared connection, awaited, and its fault rule answers when Redis fails,
/// so a request never waits longer than the store's timeout.
pub trait AsyncLimiter<Q: ?Sized>: Send + Sync {
    /// Decides one request of `key` of cost `cost` (1 for a plain request;
    /// the contract's "Weighted requests" otherwise) now, by the limiter's
    /// clock.
    fn check_ruled_n(&self, key: &Q, cost: u64) -> impl Future<Output = RuledDecision<'_>> + Send;

    /// [`check_ruled_n`](Self::check_ruled_n) in the tier named `tier`,
    /// known from the request
    /// ([`RateLimiter::check_ruled_in_n_at`](crate::RateLimiter::check_ruled_in_n_at)).
    fn check_ruled_in_n(
        &self,
        tier: &str,
        key: &Q,
        cost: u64,
    ) -> impl Future<Output = RuledDecision<'_>> + Send;

    /// Gives back up to `cost` units of the admission `admitted` of `key`
    /// (made in the tier named `tier`, when the request named one), now by
    /// the limiter's clock: the units given back. It trusts its caller, as
    /// [`RateLimiter::refund_at`](crate::RateLimiter::refund_at) does: the
    /// layer holds each admission once and asks at most its cost
    /// ([`RateLimiter::refund`](crate::RateLimiter::refund) takes the
    /// handle that makes sure of it).
    fn refund_in(
        &self,
        tier: Option<&str>,
        key: &Q,
        admitted: &Decision,
        cost: u64,
    ) -> impl Future<Output = u64> + Send;

    /// Releases up to `cost` units `key` holds under its `in-flight` rules
    /// (held by an admission in the tier named `tier`, when the request
    /// named one), now by the limiter's clock: the units released
    /// ([`RateLimiter::release`](crate::RateLimiter::release)). The layer
    /// calls it when a response body that such an admission let through
    /// ends or is dropped.
    fn release_in(
        &self,
        tier: Option<&str>,
        key: &Q,
        cost: u64,
    ) -> impl Future<Output = u64> + Send;

    /// Whether the admission `ruled` holds units until they are released
    /// (an `in-flight` rule decided it): the layer then releases them when
    /// the response body ends. The decision says so
    /// ([`RuledDecision::holds`]) when it names each rule; a limiter whose
    /// decisions name only the strictest rule says so itself.
    fn holds(&self, ruled: &RuledDecision<'_>) -> bool {
        ruled.holds()
    }

    /// The `in-flight` rule that refused `ruled`, if one did
    /// ([`RuledDecision::refused_in_flight`], or the limiter's own rules
    /// for a limiter whose decisions name only the strictest rule).
    fn refused_in_flight(&self, ruled: &RuledDecision<'_>) -> Option<crate::Rule> {
        ruled.refused_in_flight()
    }
}

impl<Q, L> AsyncLimiter<Q> for L
where
    Q: ?Sized + Sync,
    L: RateLimiter<Q> + ?Sized,
{
    #[inline]
    fn check_ruled_n(&self, key: &Q, cost: u64) -> impl Future<Output = RuledDecision<'_>> + Send {
        ready(self.check_ruled_n_at(key, self.now(), cost))
    }

    #[inline]
    fn check_ruled_in_n(
        &self,
        tier: &str,
        key: &Q,
        cost: u64,
    ) -> impl Future<Output = RuledDecision<'_>> + Send {
        ready(self.check_ruled_in_n_at(tier, key, self.now(), cost))
    }

    #[inline]
    fn refund_in(
        &self,
        tier: Option<&str>,
        key: &Q,
        admitted: &Decision,
        cost: u64,
    ) -> impl Future<Output = u64> + Send {
        ready(match tier {
            None => self.refund_admitted(key, admitted, cost),
            Some(_) if !admitted.allowed => 0,
            Some(tier) => {
                let now = self.now().max(admitted.at);
                self.refund_in_at(tier, key, now, admitted.at, cost)
            }
        })
    }

    #[inline]
    fn release_in(
        &self,
        tier: Option<&str>,
        key: &Q,
        cost: u64,
    ) -> impl Future<Output = u64> + Send {
        ready(match tier {
            None => self.release(key, cost),
            Some(tier) => self.release_in_at(tier, key, self.now(), cost),
        })
    }
}

#[cfg(feature = "redis")]
mod redis {
    use std::future::Future;
    use std::net::IpAddr;

    use super::AsyncLimiter;
    use crate::redis::AsyncRedisLimiter;
    use crate::{Decision, RuledDecision};

    impl AsyncLimiter<str> for AsyncRedisLimiter {
        async fn check_ruled_n(&self, key: &str, cost: u64) -> RuledDecision<'_> {
            let decision = if cost == 1 {
                self.check(key).await
            } else {
                self.check_n(key, cost).await
            };
            RuledDecision {
                decision,
                tier: None,
                policy: self.policy(),
                config: self.config(),
                refused_unknown_tier: false,
                each: crate::RuleAnswers::default(),
            }
        }

        async fn check_ruled_in_n(&self, _tier: &str, _key: &str, _cost: u64) -> RuledDecision<'_> {
            no_tier(self)
        }

        /// No tiers: an admission in a named tier was never made.
        async fn refund_in(
            &self,
            tier: Option<&str>,
            key: &str,
            admitted: &Decision,
            cost: u64,
        ) -> u64 {
            match tier {
                Some(_) => 0,
                None => self.refund_decision(key, admitted, cost).await.unwrap_or(0),
            }
        }

        /// No tiers: an admission in a named tier held nothing.
        async fn release_in(&self, tier: Option<&str>, key: &str, cost: u64) -> u64 {
            match tier {
                Some(_) => 0,
                None => self.release(key, cost).await,
            }
        }

        /// Its decisions name the strictest rule only: it holds when any
        /// of its rules is an `in-flight` rule.
        fn holds(&self, ruled: &RuledDecision<'_>) -> bool {
            ruled.decision.allowed() && self.holds_units()
        }

        /// The rule its decision's `refused_by` names, among all of its
        /// rules.
        fn refused_in_flight(&self, ruled: &RuledDecision<'_>) -> Option<crate::Rule> {
            let rule = *self.rules().get(ruled.decision.refused_by()?)?;
            (rule.policy() == crate::PolicyKind::InFlight).then_some(rule)
        }
    }

    /// The Redis store has no tiers: every name is one it lacks, refused
    /// as [`RateLimiter::check_ruled_in_n_at`](crate::RateLimiter::check_ruled_in_n_at)'s
    /// default refuses it.
    fn no_tier(redis: &AsyncRedisLimiter) -> RuledDecision<'_> {
        RuledDecision {
            decision: crate::Decision::never_admitted(0),
            tier: None,
            policy: redis.policy(),
            config: redis.config(),
            refused_unknown_tier: true,
            each: crate::RuleAnswers::default(),
        }
    }

    /// An address is stored under its text (`203.0.113.7`, `2001:db8::`).
    impl AsyncLimiter<IpAddr> for AsyncRedisLimiter {
        fn check_ruled_n(
            &self,
            key: &IpAddr,
            cost: u64,
        ) -> impl Future<Output = RuledDecision<'_>> + Send {
            let key = key.to_string();
            async move { AsyncLimiter::<str>::check_ruled_n(self, &key, cost).await }
        }

        fn check_ruled_in_n(
            &self,
            _tier: &str,
            _key: &IpAddr,
            _cost: u64,
        ) -> impl Future<Output = RuledDecision<'_>> + Send {
            std::future::ready(no_tier(self))
        }

        fn refund_in(
            &self,
            tier: Option<&str>,
            key: &IpAddr,
            admitted: &Decision,
            cost: u64,
        ) -> impl Future<Output = u64> + Send {
            let key = key.to_string();
            let admitted = *admitted;
            async move { AsyncLimiter::<str>::refund_in(self, tier, &key, &admitted, cost).await }
        }

        fn release_in(
            &self,
            tier: Option<&str>,
            key: &IpAddr,
            cost: u64,
        ) -> impl Future<Output = u64> + Send {
            let key = key.to_string();
            async move { AsyncLimiter::<str>::release_in(self, tier, &key, cost).await }
        }

        fn holds(&self, ruled: &RuledDecision<'_>) -> bool {
            AsyncLimiter::<str>::holds(self, ruled)
        }

        fn refused_in_flight(&self, ruled: &RuledDecision<'_>) -> Option<crate::Rule> {
            AsyncLimiter::<str>::refused_in_flight(self, ruled)
        }
    }
}
