//! The factory: the one place that turns a policy name into a limiter.

use std::fmt;
use std::hash::Hash;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use crate::policy::{
    Compound, FixedWindow, Gcra, InFlight, LeakyBucket, Pair, SlidingWindow, SlidingWindowCounter,
    TokenBucket, WideWindowPair, WindowPair,
};
use crate::{
    Bounds, Clock, Config, ConfigError, Limiter, MutexLimiter, PolicyKind, QuantaClock,
    RateLimiter, Rule, RuleSet,
};

/// A limiter, step by step: the rule (a policy, a limit and a window as a
/// duration), then whatever differs from the defaults — no bounds, the
/// lock-free engine, the TSC clock ([`QuantaClock`]) — then
/// [`build`](Builder::build) for a key type.
///
/// ```
/// use floodgate::{Bounds, Builder, PolicyKind, RateLimiter};
/// use std::net::IpAddr;
/// use std::time::Duration;
///
/// let per_ip = Builder::new(PolicyKind::TokenBucket, 100, Duration::from_secs(1))
///     .bounds(Bounds::new().evict_idle().max_clients(100_000))
///     .build::<IpAddr>()?;
/// let decision = per_ip.check(&"203.0.113.7".parse()?);
/// assert!(decision.allowed());
///
/// // Or from configuration text:
/// let api = Builder::from_rule("sliding-window:1000/1h".parse()?).build::<str>()?;
/// assert_eq!(api.check("key-1").remaining(), 999);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build`"]
pub struct Builder<C = QuantaClock> {
    policy: PolicyKind,
    config: Result<Config, ConfigError>,
    /// Rules after the first ([`and`](Builder::and)), each as given.
    more: Vec<(PolicyKind, Result<Config, ConfigError>)>,
    bounds: Bounds,
    engine: Engine,
    clock: C,
    counting: bool,
    offenders: Option<usize>,
}

impl Builder<QuantaClock> {
    /// `policy` admitting `limit` requests per `window`.
    pub fn new(policy: PolicyKind, limit: u64, window: Duration) -> Self {
        Self {
            policy,
            config: Config::per(limit, window),
            more: Vec::new(),
            bounds: Bounds::new(),
            engine: Engine::LockFree,
            clock: QuantaClock::new(),
            counting: false,
            offenders: None,
        }
    }

    /// The policy and limits of `rule` (`"gcra:100/1s"`, see [`Rule`]).
    pub fn from_rule(rule: Rule) -> Self {
        Self {
            policy: rule.policy(),
            config: Ok(rule.config()),
            more: Vec::new(),
            bounds: Bounds::new(),
            engine: Engine::LockFree,
            clock: QuantaClock::new(),
            counting: false,
            offenders: None,
        }
    }

    /// Every rule of `rules` (`"gcra:10/1s,fixed-window:10000/1d"`, see
    /// [`RuleSet`]), applied to each client at once.
    pub fn from_rules(rules: &RuleSet) -> Self {
        let mut builder = Self::from_rule(rules[0]);
        builder.more = rules[1..]
            .iter()
            .map(|rule| (rule.policy(), Ok(rule.config())))
            .collect();
        builder
    }
}

impl<C: Clock + 'static> Builder<C> {
    /// Another rule, applied to every client together with the others
    /// (the contract's "Several limits on one client"): a request is
    /// admitted only if every rule admits it, and then every rule counts
    /// it; a request any rule refuses counts in none, so a burst refused
    /// by the per-second rule never drains a daily quota. At most
    /// [`MAX_RULES`](crate::MAX_RULES) rules (`build` refuses more,
    /// [`ConfigError::RuleCount`]).
    ///
    /// ```
    /// use floodgate::{Builder, ManualClock, PolicyKind, RateLimiter};
    /// use std::time::Duration;
    ///
    /// const DAY: Duration = Duration::from_secs(86_400);
    /// let api = Builder::new(PolicyKind::Gcra, 10, Duration::from_secs(1))
    ///     .and(PolicyKind::FixedWindow, 10_000, DAY)
    ///     .clock(ManualClock::new(0))
    ///     .build::<str>()?;
    /// for _ in 0..10 {
    ///     assert!(api.check_at("alice", 0).allowed());
    /// }
    /// let burst = api.check_at("alice", 0); // the eleventh in one second
    /// assert_eq!(burst.refused_by(), Some(0));
    /// assert_eq!(api.rules()[1].policy(), PolicyKind::FixedWindow);
    /// // The refused request spent nothing of the day's quota:
    /// assert_eq!(api.check_at("alice", 100_000_000).remaining(), 0); // gcra: none left yet
    /// # Ok::<(), floodgate::ConfigError>(())
    /// ```
    pub fn and(mut self, policy: PolicyKind, limit: u64, window: Duration) -> Self {
        self.more.push((policy, Config::per(limit, window)));
        self
    }

    /// Idle eviction, a cap on tracked clients and the overflow rule
    /// ([`crate::bounds`]); none by default.
    pub fn bounds(mut self, bounds: Bounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// Counts every decision for [`RateLimiter::stats`] (admitted,
    /// rejected, their units, the overflow rule's answers), in counters
    /// each thread writes alone; off by default, since even an add to a
    /// line no other thread writes costs a check a few nanoseconds (the
    /// `"metrics": true` rows of `floodgate bench`). The store's own work
    /// (clients created, evicted, forgotten, rebuilds, sweeps) is counted
    /// either way.
    pub fn counting(mut self, on: bool) -> Self {
        self.counting = on;
        self
    }

    /// Keeps the clients the limiter refuses most, in a summary of
    /// `capacity` entries ([`crate::offenders`]; 1,024 names a client with
    /// 1 % of the rejections, its count within about 0.1 % of them), read
    /// with [`RateLimiter::take_offenders`]. None by default. `build`
    /// refuses a capacity of 0 or above 2^31
    /// ([`ConfigError::OffendersOutOfRange`]).
    pub fn offenders(mut self, capacity: usize) -> Self {
        self.offenders = Some(capacity);
        self
    }

    /// The engine; [`Engine::LockFree`] by default.
    pub fn engine(mut self, engine: Engine) -> Self {
        self.engine = engine;
        self
    }

    /// The clock; [`QuantaClock`] (nanoseconds) by default. The window is
    /// turned into its ticks.
    pub fn clock<D: Clock + 'static>(self, clock: D) -> Builder<D> {
        Builder {
            policy: self.policy,
            config: self.config,
            more: self.more,
            bounds: self.bounds,
            engine: self.engine,
            clock,
            counting: self.counting,
            offenders: self.offenders,
        }
    }

    /// The limiter, for clients looked up by `&Q` (it stores `Q::Owned`:
    /// `build::<str>()` stores `String`s).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`]: a limit out of range, a window the policy or the
    /// clock's tick cannot hold ([`Config::resolve`]), bounds that refuse
    /// everyone ([`Bounds::validate`]).
    pub fn build<Q>(self) -> Result<Arc<dyn RateLimiter<Q>>, ConfigError>
    where
        Q: ?Sized + Hash + Eq + ToOwned + 'static,
        Q::Owned: Hash + Eq + Clone + Send + Sync + 'static,
    {
        let extras = Extras {
            counting: self.counting,
            offenders: self.offenders,
        };
        if self.more.is_empty() {
            return assemble(
                self.policy,
                self.config?,
                self.engine,
                self.clock,
                self.bounds,
                extras,
            );
        }
        let rules = std::iter::once((self.policy, self.config))
            .chain(self.more)
            .map(|(policy, config)| Rule::new(policy, config?))
            .collect::<Result<Vec<_>, _>>()?;
        assemble_rules(
            RuleSet::new(rules)?,
            self.engine,
            self.clock,
            self.bounds,
            extras,
        )
    }
}

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
/// A [`ConfigError`]: [`ConfigError::WindowShorterThanLimit`] when `policy`
/// drips and the window is shorter than the limit, or a rate given as a
/// duration that the clock's tick cannot hold ([`Config::resolve`]); for
/// [`build_bounded`], bounds that refuse everyone ([`Bounds::validate`]).
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
pub fn build<Q>(policy: PolicyKind, config: Config) -> Result<Arc<dyn RateLimiter<Q>>, ConfigError>
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
///     Config::per_ticks(1, 1_000)?,
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
) -> Result<Arc<dyn RateLimiter<Q>>, ConfigError>
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
///     Config::per_ticks(5, 1_000)?,
///     Engine::LockFree,
///     clock.clone(),
///     Bounds::new().evict_idle().max_clients(1).on_overflow(Overflow::Admit),
/// )?;
/// assert_eq!(limiter.check("alice").remaining(), 4);
/// assert_eq!(limiter.check("bob").remaining(), 4); // admitted untracked
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
) -> Result<Arc<dyn RateLimiter<Q>>, ConfigError>
where
    Q: ?Sized + Hash + Eq + ToOwned + 'static,
    Q::Owned: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock + 'static,
{
    assemble(policy, config, engine, clock, bounds, Extras::default())
}

/// The lock-free engine on `policy`, with what a builder adds.
fn lock_free<Q, P, C>(
    policy: P,
    clock: C,
    bounds: Bounds,
    extras: Extras,
) -> Result<Arc<dyn RateLimiter<Q>>, ConfigError>
where
    Q: ?Sized + Hash + Eq + ToOwned + 'static,
    Q::Owned: Hash + Eq + Clone + Send + Sync + 'static,
    P: crate::policy::Policy,
    C: Clock + 'static,
{
    let limiter =
        Limiter::<Q::Owned, P, C>::with_bounds(policy, clock, bounds)?.counting(extras.counting);
    Ok(Arc::new(match extras.offenders {
        Some(capacity) => limiter.offenders(capacity),
        None => limiter,
    }))
}

/// A limiter applying every rule of `rules` to each client, on `engine`
/// (one rule: as [`build_bounded`]). On the lock-free engine two one-word
/// rules (`gcra`, `token-bucket`, `leaky-bucket`) share one 16-byte word
/// ([`Pair`](crate::policy::Pair)), and so does one of them beside a
/// `fixed-window` or `sliding-window-counter` rule
/// ([`WindowPair`](crate::policy::WindowPair), or with the origin beside
/// the word, [`WideWindowPair`](crate::policy::WideWindowPair)); any
/// others, a frame of words swapped by one 16-byte CAS
/// ([`Compound`](crate::policy::Compound)).
///
/// # Errors
///
/// As [`build`], for each rule.
///
/// ```
/// use floodgate::{build_rules, Bounds, Engine, ManualClock, RateLimiter};
///
/// let limiter = build_rules::<str, _>(
///     &"sliding-window:3/1s,fixed-window:5/1h".parse()?,
///     Engine::LockFree,
///     ManualClock::new(0),
///     Bounds::new(),
/// )?;
/// assert_eq!(limiter.check_at("app", 0).remaining(), 2);
/// assert_eq!(limiter.rules().to_string(), "sliding-window:3/1s,fixed-window:5/1h");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn build_rules<Q, C>(
    rules: &RuleSet,
    engine: Engine,
    clock: C,
    bounds: Bounds,
) -> Result<Arc<dyn RateLimiter<Q>>, ConfigError>
where
    Q: ?Sized + Hash + Eq + ToOwned + 'static,
    Q::Owned: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock + 'static,
{
    assemble_rules(rules.clone(), engine, clock, bounds, Extras::default())
}

/// [`build_rules`], with what a builder adds: the one place that checks
/// the bounds and the extras and picks the engine's type for the rules.
fn assemble_rules<Q, C>(
    rules: RuleSet,
    engine: Engine,
    clock: C,
    bounds: Bounds,
    extras: Extras,
) -> Result<Arc<dyn RateLimiter<Q>>, ConfigError>
where
    Q: ?Sized + Hash + Eq + ToOwned + 'static,
    Q::Owned: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock + 'static,
{
    fn boxed<Q, P, C>(
        config: Config,
        clock: C,
        bounds: Bounds,
        extras: Extras,
    ) -> Result<Arc<dyn RateLimiter<Q>>, ConfigError>
    where
        Q: ?Sized + Hash + Eq + ToOwned + 'static,
        Q::Owned: Hash + Eq + Clone + Send + Sync + 'static,
        P: crate::policy::Policy,
        C: Clock + 'static,
    {
        lock_free(P::new(config)?, clock, bounds, extras)
    }
    // Resolved here for the clock's tick; `Limiter::with_bounds` then finds
    // nothing left to convert.
    let rules = rules.in_ticks_of(clock.tick())?;
    let bounds = bounds.validate_for(&rules)?;
    if let Some(capacity) = extras.offenders
        && !(1..=crate::offenders::MAX_CAPACITY).contains(&capacity)
    {
        return Err(ConfigError::OffendersOutOfRange { capacity });
    }
    match (engine, rules.rules()) {
        (Engine::Mutex, _) => {
            let limiter = MutexLimiter::<Q::Owned, C>::with_rules(rules, clock, bounds)?
                .counting(extras.counting);
            Ok(Arc::new(match extras.offenders {
                Some(capacity) => limiter.offenders(capacity),
                None => limiter,
            }))
        }
        (Engine::LockFree, [rule]) => {
            let config = rule.config();
            match rule.policy() {
                PolicyKind::SlidingWindow => {
                    boxed::<Q, SlidingWindow, C>(config, clock, bounds, extras)
                }
                PolicyKind::TokenBucket => {
                    boxed::<Q, TokenBucket, C>(config, clock, bounds, extras)
                }
                PolicyKind::FixedWindow => {
                    boxed::<Q, FixedWindow, C>(config, clock, bounds, extras)
                }
                PolicyKind::SlidingWindowCounter => {
                    boxed::<Q, SlidingWindowCounter, C>(config, clock, bounds, extras)
                }
                PolicyKind::Gcra => boxed::<Q, Gcra, C>(config, clock, bounds, extras),
                PolicyKind::LeakyBucket => {
                    boxed::<Q, LeakyBucket, C>(config, clock, bounds, extras)
                }
                PolicyKind::InFlight => boxed::<Q, InFlight, C>(config, clock, bounds, extras),
            }
        }
        (Engine::LockFree, _) if Pair::fits(&rules) => {
            lock_free(Pair::from_rules(&rules)?, clock, bounds, extras)
        }
        (Engine::LockFree, _) if WindowPair::fits(&rules) => {
            lock_free(WindowPair::from_rules(&rules)?, clock, bounds, extras)
        }
        (Engine::LockFree, _) if WideWindowPair::fits(&rules) => {
            lock_free(WideWindowPair::from_rules(&rules)?, clock, bounds, extras)
        }
        (Engine::LockFree, _) => lock_free(Compound::from_rules(&rules)?, clock, bounds, extras),
    }
}

/// What a [`Builder`] adds to a limiter beyond its rule, clock and bounds.
#[derive(Clone, Copy, Default)]
struct Extras {
    counting: bool,
    offenders: Option<usize>,
}

/// [`build_bounded`], with what a builder adds (`extras`).
fn assemble<Q, C>(
    policy: PolicyKind,
    config: Config,
    engine: Engine,
    clock: C,
    bounds: Bounds,
    extras: Extras,
) -> Result<Arc<dyn RateLimiter<Q>>, ConfigError>
where
    Q: ?Sized + Hash + Eq + ToOwned + 'static,
    Q::Owned: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock + 'static,
{
    let rule = Rule::from_parts(policy, config.resolve(policy, clock.tick())?);
    assemble_rules(RuleSet::from(rule), engine, clock, bounds, extras)
}
