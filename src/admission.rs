//! An admitted request's units, to be given back at most once and never
//! more than it took: the contract's "Giving units back" made hard to get
//! wrong.
//!
//! A refund by time
//! ([`RateLimiter::refund_at`](crate::RateLimiter::refund_at)) trusts its
//! caller: the limiter cannot tell one admission's units from another's in
//! the same window, so a refund of units never admitted, or of the same
//! admission twice, takes another admission's units. An [`Admission`]
//! carries its key, time, tier and cost, is not `Clone`, and is consumed by
//! its refund ([`RateLimiter::refund`](crate::RateLimiter::refund)): at
//! most its cost, at most once.

use std::fmt;

use crate::Decision;

/// The units one admitted request took, held by the caller so that they
/// can be given back once, and never more than were taken.
///
/// Made by [`RateLimiter::admit`](crate::RateLimiter::admit) (or
/// [`admit_n`](crate::RateLimiter::admit_n),
/// [`admit_in_n`](crate::RateLimiter::admit_in_n) in a named tier) and
/// consumed by [`RateLimiter::refund`](crate::RateLimiter::refund).
/// Dropping it keeps its units spent.
///
/// ```
/// use floodgate::{build_with, Config, Engine, ManualClock, PolicyKind, RateLimiter};
///
/// let clock = ManualClock::new(0);
/// let quota = build_with::<str, _>(
///     PolicyKind::FixedWindow,
///     Config::per_ticks(10, 60_000)?,
///     Engine::LockFree,
///     clock.clone(),
/// )?;
/// let upload = quota.admit_n("app", 1).expect("10 left");
/// assert!(quota.admit_n("app", 5).is_ok()); // another request's units
/// clock.advance(6);
/// // At most the admission's own cost comes back, whatever is asked...
/// assert_eq!(quota.refund(upload, 6), 1);
/// assert_eq!(quota.remaining("app"), 5);
/// // ...and once: the refund took the admission.
/// # Ok::<(), floodgate::ConfigError>(())
/// ```
#[must_use = "dropping an admission keeps its units spent; give them back with `refund`"]
pub struct Admission<K> {
    key: K,
    tier: Option<Box<str>>,
    decision: Decision,
    cost: u64,
}

impl<K> Admission<K> {
    /// An admission of `cost` units of `key`, decided by `decision` (an
    /// allowed one), in the tier named `tier` when the request named one.
    /// Only a limiter makes one: a caller cannot name a larger cost.
    pub(crate) fn new(key: K, tier: Option<&str>, decision: Decision, cost: u64) -> Self {
        debug_assert!(decision.allowed(), "an admission is an allowed decision");
        Self {
            key,
            tier: tier.map(Box::from),
            decision,
            cost,
        }
    }

    /// The client's key.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The tier the request named, when it named one
    /// ([`admit_in_n`](crate::RateLimiter::admit_in_n)).
    pub fn tier(&self) -> Option<&str> {
        self.tier.as_deref()
    }

    /// The admission's decision (remaining, the rule that decided).
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The units it took: the most a refund of it gives back.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// When it was admitted, in the limiter's ticks.
    pub fn at_ticks(&self) -> u64 {
        self.decision.at
    }

    /// Keeps its units spent: the same as dropping it, said aloud.
    pub fn keep(self) {}

    /// Takes it apart for its refund: the key, the tier, the decision and
    /// `min(units, cost)`, the most a refund of `units` may give back.
    pub(crate) fn into_refund(self, units: u64) -> (K, Option<Box<str>>, Decision, u64) {
        let units = units.min(self.cost);
        (self.key, self.tier, self.decision, units)
    }
}

impl<K: fmt::Debug> fmt::Debug for Admission<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("key", &self.key)
            .field("tier", &self.tier)
            .field("cost", &self.cost)
            .field("at", &self.decision.at)
            .finish_non_exhaustive()
    }
}
