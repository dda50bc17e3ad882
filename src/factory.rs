//! The factory: the one place that turns a policy name into a limiter.

use std::fmt;
use std::hash::Hash;
use std::str::FromStr;

use crate::policy::{
    FixedWindow, Gcra, LeakyBucket, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use crate::{
    Bounds, Clock, Config, ConfigError, Limiter, MutexLimiter, PolicyKind, QuantaClock, RateLimiter,
};

/// Which implementation of the policies a factory-built limiter uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Engine {
    /// Per-client state in packed atomic words, updated by CAS loops; no lock
    /// on the path of a known client. The default.
    #[default]
    LockFree,
    /// The plain reference: a locked map, then a lock per client.
    Mutex,
}

impl Engine {
    /// The engine's name on the command line: `lockfree` or `mutex`.
    pub const fn name(self) -> &'static str {
        match self {
            Engine::LockFree => "lockfree",
            Engine::Mutex => "mutex",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An engine name other than `lockfree` or `mutex`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownEngine {
    /// The name that was asked for.
    pub name: String,
}

impl fmt::Display for UnknownEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown engine {:?}; the engines are lockfree, mutex",
            self.name
        )
    }
}

impl std::error::Error for UnknownEngine {}

impl FromStr for Engine {
    type Err = UnknownEngine;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "lockfree" => Ok(Engine::LockFree),
            "mutex" => Ok(Engine::Mutex),
            _ => Err(UnknownEngine {
                name: name.to_owned(),
            }),
        }
    }
}

/// Builds the lock-free limiter for `policy` with the default clock
/// (nanosecond ticks).
///
/// `Q` is the type clients are looked up by; the limiter stores `Q::Owned`
/// (so `build::<str>` stores `String`s and is queried with `&str`).
///
/// # Errors
///
/// [`ConfigError::WindowShorterThanLimit`] when `policy` drips and the window
/// is shorter than the limit.
///
/// # Examples
///
/// ```
/// use floodgate::{build, Config, PolicyKind, RateLimiter};
/// use std::time::Duration;
///
/// let policy: PolicyKind = "gcra".parse()?;
/// let limiter = build::<str>(policy, Config::per(100, Duration::from_secs(1))?)?;
/// assert!(limiter.allow("client-42"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn build<Q>(policy: PolicyKind, config: Config) -> Result<Box<dyn RateLimiter<Q>>, ConfigError>
where
    Q: ?Sized + Hash + Eq + ToOwned + 'static,
    Q::Owned: Hash + Eq + Clone + Send + Sync + 'static,
{
    build_with(policy, config, Engine::LockFree, QuantaClock::new())
}

/// Builds a limiter for `policy` on `engine`, reading `clock`.
///
/// # Errors
///
/// As [`build`].
///
/// # Examples
///
/// ```
/// use floodgate::{build_with, Config, Engine, ManualClock, PolicyKind, RateLimiter};
///
/// let clock = ManualClock::new(0);
/// let limiter = build_with::<u64, _>(
///     PolicyKind::FixedWindow,
///     Config::new(1, 1_000)?,
///     Engine::Mutex,
///     clock.clone(),
/// )?;
/// assert!(limiter.allow(&7));
/// assert!(!limiter.allow(&7));
/// clock.advance(1_000);
/// assert!(limiter.allow(&7));
/// # Ok::<(), floodgate::ConfigError>(())
/// ```
pub fn build_with<Q, C>(
    policy: PolicyKind,
    config: Config,
    engine: Engine,
    clock: C,
) -> Result<Box<dyn RateLimiter<Q>>, ConfigError>
where
    Q: ?Sized + Hash + Eq + ToOwned + 'static,
    Q::Owned: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock + 'static,
{
    build_bounded(policy, config, engine, clock, Bounds::new())
}

/// Builds a limiter for `policy` on `engine`, reading `clock`, within
/// `bounds` (idle eviction, a cap on tracked clients: see [`crate::bounds`]).
/// Both engines sweep and overflow alike, so they still give the same
/// answers on the same calls.
///
/// # Errors
///
/// As [`build`].
///
/// # Examples
///
/// ```
/// use floodgate::{build_bounded, Bounds, Config, Engine, ManualClock, Overflow, PolicyKind};
///
/// let clock = ManualClock::new(0);
/// let limiter = build_bounded::<str, _>(
///     PolicyKind::SlidingWindow,
///     Config::new(5, 1_000)?,
///     Engine::LockFree,
///     clock.clone(),
///     Bounds::new().evict_idle().max_clients(1).on_overflow(Overflow::Admit),
/// )?;
/// assert_eq!(limiter.check("alice").remaining, 4);
/// assert_eq!(limiter.check("bob").remaining, 4); // admitted untracked
/// assert_eq!(limiter.tracked_clients(), 1);
/// clock.advance(1_000);
/// assert_eq!(limiter.sweep(), 1); // alice's admission left the window
/// assert_eq!(limiter.tracked_clients(), 0);
/// # Ok::<(), floodgate::ConfigError>(())
/// ```
pub fn build_bounded<Q, C>(
    policy: PolicyKind,
    config: Config,
    engine: Engine,
    clock: C,
    bounds: Bounds,
) -> Result<Box<dyn RateLimiter<Q>>, ConfigError>
where
    Q: ?Sized + Hash + Eq + ToOwned + 'static,
    Q::Owned: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock + 'static,
{
    fn boxed<Q, P, C>(
        config: Config,
        clock: C,
        bounds: Bounds,
    ) -> Result<Box<dyn RateLimiter<Q>>, ConfigError>
    where
        Q: ?Sized + Hash + Eq + ToOwned + 'static,
        Q::Owned: Hash + Eq + Clone + Send + Sync + 'static,
        P: crate::policy::Policy,
        C: Clock + 'static,
    {
        Ok(Box::new(Limiter::<Q::Owned, P, C>::with_bounds(
            P::new(config)?,
            clock,
            bounds,
        )))
    }
    match engine {
        Engine::Mutex => Ok(Box::new(MutexLimiter::<Q::Owned, C>::with_bounds(
            policy, config, clock, bounds,
        )?)),
        Engine::LockFree => match policy {
            PolicyKind::SlidingWindow => boxed::<Q, SlidingWindow, C>(config, clock, bounds),
            PolicyKind::TokenBucket => boxed::<Q, TokenBucket, C>(config, clock, bounds),
            PolicyKind::FixedWindow => boxed::<Q, FixedWindow, C>(config, clock, bounds),
            PolicyKind::SlidingWindowCounter => {
                boxed::<Q, SlidingWindowCounter, C>(config, clock, bounds)
            }
            PolicyKind::Gcra => boxed::<Q, Gcra, C>(config, clock, bounds),
            PolicyKind::LeakyBucket => boxed::<Q, LeakyBucket, C>(config, clock, bounds),
        },
    }
}
