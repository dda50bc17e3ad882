//! The factory: the one place that turns a policy name into a limiter.

use std::fmt;
use std::hash::Hash;
use std::str::FromStr;

use crate::policy::{
    FixedWindow, Gcra, LeakyBucket, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use crate::{
    Clock, Config, ConfigError, Limiter, MutexLimiter, PolicyKind, QuantaClock, RateLimiter,
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
    fn boxed<Q, P, C>(config: Config, clock: C) -> Result<Box<dyn RateLimiter<Q>>, ConfigError>
    where
        Q: ?Sized + Hash + Eq + ToOwned + 'static,
        Q::Owned: Hash + Eq + Clone + Send + Sync + 'static,
        P: crate::policy::Policy,
        C: Clock + 'static,
    {
        Ok(Box::new(Limiter::<Q::Owned, P, C>::with_clock(
            P::new(config)?,
            clock,
        )))
    }
    match engine {
        Engine::Mutex => Ok(Box::new(MutexLimiter::<Q::Owned, C>::with_clock(
            policy, config, clock,
        )?)),
        Engine::LockFree => match policy {
            PolicyKind::SlidingWindow => boxed::<Q, SlidingWindow, C>(config, clock),
            PolicyKind::TokenBucket => boxed::<Q, TokenBucket, C>(config, clock),
            PolicyKind::FixedWindow => boxed::<Q, FixedWindow, C>(config, clock),
            PolicyKind::SlidingWindowCounter => boxed::<Q, SlidingWindowCounter, C>(config, clock),
            PolicyKind::Gcra => boxed::<Q, Gcra, C>(config, clock),
            PolicyKind::LeakyBucket => boxed::<Q, LeakyBucket, C>(config, clock),
        },
    }
}
