//! Tiers: named rules (free, premium, …) in one registry, each replaceable
//! at run time without forgetting what any client has spent.
//!
//! A [`Tiers`] registry maps tier names to a policy and its limits
//! ([`TierSpec`]) and asks a [`Resolver`] which tier a client is in. It is a
//! [`RateLimiter`], so a call site does not know it is talking to tiers.
//!
//! # Reload
//!
//! [`Tiers::reload`] swaps a tier's rule with one atomic pointer store
//! (`arc-swap`): a check reads the pointer without a lock. Each client's
//! state remembers the rule it was made by; a client's next call after a
//! reload finds its state made by an older rule and *carries it over*: it
//! retires the old state (one CAS that freezes it, see the state words'
//! "Retirement" docs) and puts in its place a state of the new rule that has
//! spent what the old one had spent at that instant:
//! `spent = old limit − old remaining(at)`, and the new state answers
//! `remaining(at) = new limit − spent` (0 if the new limit is lower).
//! A request racing with the carry-over either landed in the old state
//! before it froze — and is in what is carried — or finds it frozen and
//! is decided on the new state: none is lost or counted twice.
//!
//! The instant `at` is the later of the call's `now`, the latest `now` any
//! check of the client presented, and the latest time the old state itself
//! reflects ([`Policy::retire_spent`](crate::policy::Policy::retire_spent)). On a real clock a thread's `now` can
//! be a little older than the client's latest; a carry-over at the older
//! time would move the client back in time — a fixed window carried into
//! the window before its own resets one window early, a schedule rebuilt
//! from an older `now` gives back the difference — and a tier reloaded
//! without pause would hand out quota on every reload. A state word alone
//! cannot say when its latest admission was (a schedule may run up to a
//! window past it), so each client's state keeps that time beside it, and
//! every check is judged no earlier than it: a tier's check is one atomic
//! maximum more than a plain limiter's. A stale check is thus judged at the
//! client's latest time, never earlier: it counts where a carry-over made
//! just before it left the client.
//!
//! A reload with the rule a tier already has changes nothing. A carry-over
//! (a client's first call after its tier's rule changed) takes the map
//! bucket's lock once, to put the new state in the entry; every other call
//! takes no lock.
//!
//! What the carried state remembers, by the new rule's policy:
//!
//! | new policy | the spent requests count as |
//! | --- | --- |
//! | `gcra`, `leaky-bucket` | a schedule `spent` intervals ahead of now: they drain at the new rate |
//! | `token-bucket` | tokens taken now; drips refill them at the new rate |
//! | `fixed-window` | admitted in the current window of the client's grid (same origin) |
//! | `sliding-window-counter` | admitted in the current window, none in the previous one |
//! | `sliding-window` | admitted now: they leave the window one window from now |
//!
//! The spent count is the old policy's own (`sliding-window-counter`'s is
//! its weighted estimate), so a change of policy keeps *how much* was spent,
//! not *when*; the table says when it is given back. A client's origin (its
//! grid) is kept.
//!
//! # Bounded memory
//!
//! [`Tiers::with_bounds`] applies [`Bounds`] to each tier: idle clients are
//! judged by the rule that made their state, each tier tracks at most the
//! cap, and its newcomers without room get the overflow rule.
//!
//! # A process-wide registry
//!
//! Pass a `Tiers` around (or share it in an `Arc`) — or, if the service
//! prefers one registry for the whole process, [`install`] one once at
//! start-up and reach it anywhere with [`installed`].

use std::borrow::{Borrow, Cow};
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, OnceLock};

use crate::decision::NEVER;
use crate::stats::Stats;
use crate::sync::{AtomicU64, Ordering};
use crate::{
    Bounds, Clock, Config, ConfigError, Decision, Overflow, PolicyKind, QuantaClock, RateLimiter,
    Rule, RuleSet, RuledDecision, Tick,
};

mod named;
mod tier;

#[cfg(feature = "http")]
pub(crate) use self::named::named_by;
use self::tier::{Generation, Tier};

/// One tier's rule: a policy and its limits (the same as a [`Rule`]). A
/// tier may apply several rules to each client: the `_rules` methods
/// ([`with_tier_rules`](Tiers::with_tier_rules),
/// [`reload_rules`](Tiers::reload_rules),
/// [`with_clock_rules`](Tiers::with_clock_rules)) take a [`RuleSet`].
pub type TierSpec = Rule;

/// A tier's name as a resolver gives it: borrowed from the resolver, or
/// made for the call.
pub type TierName<'a> = Cow<'a, str>;

/// Which tier a client is in, by name.
///
/// A name the registry does not know is counted
/// ([`Tiers::unknown_tier_calls`]) and then answered by the default tier,
/// or refused if the registry was made with
/// [`reject_unknown_tiers`](Tiers::reject_unknown_tiers); a resolver that
/// can list the names it gives ([`Resolver::names`]) is checked when the
/// registry is built instead.
///
/// Any `Fn(&Q) -> T` where `T` is a `&'static str` or a `String` is a
/// resolver, so a closure may read state it captured:
///
/// ```
/// use floodgate::tiers::Resolver;
/// use std::collections::HashMap;
///
/// let by_prefix = |client: &str| if client.starts_with("pro-") { "premium" } else { "free" };
/// assert_eq!(by_prefix.tier("pro-7"), "premium");
///
/// let plans: HashMap<String, String> = [("acme".into(), "premium".into())].into();
/// let by_plan = move |client: &str| plans.get(client).cloned().unwrap_or_else(|| "free".into());
/// assert_eq!(by_plan.tier("acme"), "premium");
/// assert_eq!(by_plan.tier("someone"), "free");
/// ```
pub trait Resolver<Q: ?Sized>: Send + Sync {
    /// `client`'s tier.
    fn tier<'a>(&'a self, client: &Q) -> TierName<'a>;

    /// Every name this resolver can answer, if it knows them: then a name
    /// the registry lacks is an error when the registry is built. `None`
    /// (the default) for resolvers that cannot tell, such as closures.
    fn names(&self) -> Option<Vec<String>> {
        None
    }
}

impl<Q: ?Sized, F, T> Resolver<Q> for F
where
    F: Fn(&Q) -> T + Send + Sync,
    T: Into<Cow<'static, str>>,
{
    fn tier<'a>(&'a self, client: &Q) -> TierName<'a> {
        self(client).into()
    }
}

impl<Q: ?Sized> Resolver<Q> for Box<dyn Resolver<Q>> {
    fn tier<'a>(&'a self, client: &Q) -> TierName<'a> {
        (**self).tier(client)
    }

    fn names(&self) -> Option<Vec<String>> {
        (**self).names()
    }
}

/// A resolver that looks clients up in a table, with a tier for the
/// clients it does not list. It knows every name it can answer, so
/// [`Tiers`] checks them all when it is built.
///
/// ```
/// use floodgate::tiers::{ByTable, Resolver};
///
/// let resolver = ByTable::new([("acme".to_owned(), "premium")], "free");
/// assert_eq!(resolver.tier("acme"), "premium");
/// assert_eq!(resolver.tier("anyone"), "free");
/// ```
#[derive(Clone, Debug)]
pub struct ByTable<K> {
    table: HashMap<K, String, ahash::RandomState>,
    otherwise: String,
}

impl<K: Hash + Eq> ByTable<K> {
    /// Clients of `table` in their tier, everyone else in `otherwise`.
    pub fn new<N: Into<String>>(table: impl IntoIterator<Item = (K, N)>, otherwise: &str) -> Self {
        Self {
            table: table
                .into_iter()
                .map(|(key, tier)| (key, tier.into()))
                .collect(),
            otherwise: otherwise.to_owned(),
        }
    }
}

impl<K, Q> Resolver<Q> for ByTable<K>
where
    K: Borrow<Q> + Hash + Eq + Send + Sync,
    Q: ?Sized + Hash + Eq,
{
    fn tier<'a>(&'a self, client: &Q) -> TierName<'a> {
        Cow::Borrowed(self.table.get(client).unwrap_or(&self.otherwise))
    }

    fn names(&self) -> Option<Vec<String>> {
        Some(self.listed())
    }
}

impl<K> ByTable<K> {
    /// Every tier this table can answer, sorted, once each.
    fn listed(&self) -> Vec<String> {
        let mut names: Vec<String> = self.table.values().cloned().collect();
        names.push(self.otherwise.clone());
        names.sort();
        names.dedup();
        names
    }
}

/// The registry was asked about a tier it does not have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownTier {
    /// The name asked for.
    pub name: String,
    /// The tiers it has.
    pub known: Vec<String>,
}

impl fmt::Display for UnknownTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no tier named `{}` (the tiers are: {})",
            self.name,
            self.known.join(", ")
        )
    }
}

impl std::error::Error for UnknownTier {}

/// Why a registry could not be built or reloaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TierError {
    /// No tier of that name (a reload), or a resolver that names one the
    /// registry lacks (a build).
    Unknown(UnknownTier),
    /// The rule does not fit the registry's clock, or its bounds can only
    /// refuse everyone.
    Config(ConfigError),
}

impl fmt::Display for TierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TierError::Unknown(error) => write!(f, "{error}"),
            TierError::Config(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for TierError {}

impl From<UnknownTier> for TierError {
    fn from(error: UnknownTier) -> Self {
        TierError::Unknown(error)
    }
}

impl From<ConfigError> for TierError {
    fn from(error: ConfigError) -> Self {
        TierError::Config(error)
    }
}

/// A decision with the tier and rule that made it: what
/// [`Tiers::check_tiered_at`] answers, for logs and response headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TieredDecision<'a> {
    /// The decision.
    pub decision: Decision,
    /// The tier whose rule applied.
    pub tier: &'a str,
    /// That tier's rule, as the call found it.
    pub rule: Rule,
    /// The name the resolver gave, when the registry does not have it (the
    /// default tier then applied, or the call was refused).
    pub unknown: Option<String>,
}

/// A registry of tiers: the rule of each, and every client's state.
///
/// ```
/// use floodgate::tiers::{TierSpec, Tiers};
/// use floodgate::{ManualClock, RateLimiter};
///
/// let tiers = Tiers::with_clock(
///     "free",
///     "fixed-window:100/1m".parse()?,
///     |client: &str| if client.starts_with("pro-") { "premium" } else { "free" },
///     ManualClock::new(0),
/// )?
/// .with_tier("premium", "gcra:1000/1m".parse()?)?;
///
/// for _ in 0..80 {
///     assert!(tiers.allow("alice"));
/// }
/// assert_eq!(tiers.remaining("alice"), 20);
///
/// // Live, under traffic: the free tier now allows 200 per minute.
/// tiers.reload("free", "fixed-window:200/1m".parse()?)?;
/// assert_eq!(tiers.remaining("alice"), 120); // the 80 she spent still count
/// assert_eq!(tiers.remaining("pro-bob"), 1_000);
///
/// // Which tier answered, and by which rule:
/// let tiered = tiers.check_tiered_at("pro-bob", 0);
/// assert_eq!((tiered.tier, tiered.rule.to_string().as_str()), ("premium", "gcra:1000/1m"));
/// // A tier known from the request itself (an API key's plan):
/// assert!(tiers.check_in("premium", "alice")?.allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Tiers<K, R, C = QuantaClock> {
    tiers: HashMap<String, Tier<K>, ahash::RandomState>,
    default_tier: String,
    resolver: R,
    bounds: Bounds,
    reject_unknown: bool,
    /// Whether each tier counts its decisions (`counting`).
    counting: bool,
    /// Calls whose resolver named a tier the registry lacks. Relaxed: a
    /// lone counter, read for monitoring only.
    unknown_calls: AtomicU64,
    /// The unknown names already logged, up to [`LOGGED_NAMES`]: a
    /// misspelt tier is loud the first time it is seen, and a flood of
    /// invented names cannot grow the set.
    logged: scc::HashSet<String, ahash::RandomState>,
    /// How many names `logged` took: its own `len` scans the table.
    /// Relaxed: a count that only bounds the set, publishing nothing.
    logged_names: crate::sync::counter::AtomicUsize,
    tick: Tick,
    clock: C,
}

/// How many unknown tier names a registry logs one by one; past that, it
/// logs once that it stopped.
const LOGGED_NAMES: usize = 64;

/// What named a tier for a call: the registry's resolver, or the caller
/// (`check_ruled_in_n_at`, which the HTTP layer calls with the tier a
/// request names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum By {
    Resolver,
    Caller,
}

impl<K, T, C> Tiers<K, ByTable<T>, C>
where
    K: Hash + Eq + Clone + 'static,
{
    /// Checks that every tier the table names is a tier here: call it once
    /// the tiers are added, so that a misspelt plan fails at start-up.
    ///
    /// ```
    /// use floodgate::tiers::{ByTable, Tiers};
    ///
    /// let plans = ByTable::new([("acme".to_owned(), "premuim")], "free");
    /// // Never asked about a client here: the key type is named.
    /// let tiers: Tiers<String, _> = Tiers::new("free", "gcra:10/1s".parse()?, plans)
    ///     .with_tier("premium", "gcra:100/1s".parse()?)?;
    /// let refused = tiers.checked().unwrap_err();
    /// assert_eq!(refused.name, "premuim");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`UnknownTier`] for the first name the registry lacks.
    pub fn checked(self) -> Result<Self, UnknownTier> {
        let names = self.resolver.listed();
        self.with_names(Some(names))
    }
}

impl<K, R> Tiers<K, R, QuantaClock>
where
    K: Hash + Eq + Clone + 'static,
{
    /// A registry whose tier `default_tier` applies `spec`, on the default
    /// clock (nanoseconds). Add tiers with [`with_tier`](Self::with_tier).
    ///
    /// The key type `K` is the owned form of the keys the registry is
    /// asked about, inferred from its use: checked by `&str`, its clients
    /// are `String`s; by `&IpAddr` (the HTTP layer's `PeerIp` key), `IpAddr`s;
    /// by `&u64`, `u64`s. A registry that is never asked about a key
    /// names it: `let tiers: Tiers<String, _> = Tiers::new(..)`.
    ///
    /// ```
    /// use floodgate::tiers::Tiers;
    /// use floodgate::RateLimiter;
    /// use std::net::IpAddr;
    ///
    /// let by_ip = Tiers::new("anonymous", "gcra:2/1m".parse()?, |_: &IpAddr| "anonymous");
    /// let client: IpAddr = "203.0.113.7".parse()?;
    /// assert!(by_ip.allow(&client));
    /// assert_eq!(by_ip.remaining(&client), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(default_tier: &str, spec: TierSpec, resolver: R) -> Self {
        Self::empty(default_tier, resolver, QuantaClock::new()).with_default(spec.into())
    }
}

impl<K, R, C> Tiers<K, R, C>
where
    K: Hash + Eq + Clone + 'static,
{
    /// As [`new`](Tiers::new), reading `clock`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] if `spec` does not fit the clock's tick.
    pub fn with_clock(
        default_tier: &str,
        spec: TierSpec,
        resolver: R,
        clock: C,
    ) -> Result<Self, ConfigError>
    where
        C: Clock,
    {
        Self::with_clock_rules(default_tier, spec.into(), resolver, clock)
    }

    /// As [`with_clock`](Tiers::with_clock), the default tier applying
    /// every rule of `rules` to each client (the contract's "Several limits
    /// on one client").
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] if a rule does not fit the clock's tick.
    ///
    /// ```
    /// use floodgate::tiers::Tiers;
    /// use floodgate::{ManualClock, RateLimiter};
    ///
    /// let tiers = Tiers::with_clock_rules(
    ///     "free",
    ///     "gcra:2/1s,fixed-window:3/1h".parse()?,
    ///     |_: &str| "free",
    ///     ManualClock::new(0),
    /// )?
    /// .with_tier_rules("pro", "gcra:20/1s,fixed-window:3000/1h".parse()?)?;
    /// assert_eq!(tiers.rules("free")?.len(), 2);
    /// assert!(tiers.check_at("alice", 0).allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_clock_rules(
        default_tier: &str,
        rules: RuleSet,
        resolver: R,
        clock: C,
    ) -> Result<Self, ConfigError>
    where
        C: Clock,
    {
        let tick = clock.tick();
        Ok(Self::empty(default_tier, resolver, clock).with_default(rules.in_ticks_of(tick)?))
    }

    fn empty(default_tier: &str, resolver: R, clock: C) -> Self
    where
        C: Clock,
    {
        Self {
            tiers: HashMap::default(),
            default_tier: default_tier.to_owned(),
            resolver,
            bounds: Bounds::new(),
            reject_unknown: false,
            counting: false,
            unknown_calls: AtomicU64::new(0),
            logged: scc::HashSet::with_hasher(ahash::RandomState::new()),
            logged_names: crate::sync::counter::AtomicUsize::new(0),
            tick: clock.tick(),
            clock,
        }
    }

    fn with_default(mut self, spec: RuleSet) -> Self {
        self.tiers.insert(
            self.default_tier.clone(),
            Tier::new(spec, self.bounds, self.counting),
        );
        self
    }

    /// Adds tier `name`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] if `spec` does not fit the clock's tick, or
    /// [`ConfigError::DuplicateTier`] if the registry has a tier of that
    /// name already (the default tier included): a second would silently
    /// replace the first. Rules change at run time through
    /// [`reload`](Self::reload).
    pub fn with_tier(self, name: &str, spec: TierSpec) -> Result<Self, ConfigError> {
        self.with_tier_rules(name, spec.into())
    }

    /// Adds tier `name` applying every rule of `rules` to each client.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] if a rule does not fit the clock's tick, or
    /// [`ConfigError::DuplicateTier`] as [`with_tier`](Self::with_tier).
    pub fn with_tier_rules(mut self, name: &str, rules: RuleSet) -> Result<Self, ConfigError> {
        if self.tiers.contains_key(name) {
            return Err(ConfigError::DuplicateTier {
                name: name.to_owned(),
            });
        }
        let spec = rules.in_ticks_of(self.tick)?;
        self.bounds.validate_for(&spec)?;
        self.tiers
            .insert(name.to_owned(), Tier::new(spec, self.bounds, self.counting));
        Ok(self)
    }

    /// Bounds every tier's memory as [`Bounds`] does one limiter's: idle
    /// clients swept on arrivals, at most `max_clients` clients per tier,
    /// and the overflow rule for a tier's newcomers without room (a shared
    /// overflow state belongs to a tier's current rule and starts afresh on
    /// a reload). Set it before any traffic: it rebuilds the tiers.
    ///
    /// # Errors
    ///
    /// What [`Bounds::validate`] refuses.
    pub fn with_bounds(mut self, bounds: Bounds) -> Result<Self, ConfigError> {
        self.bounds = bounds.validate()?;
        for tier in self.tiers.values() {
            self.bounds.validate_for(&tier.rules())?;
        }
        for tier in self.tiers.values_mut() {
            *tier = Tier::new(tier.rules(), bounds, self.counting);
        }
        Ok(self)
    }

    /// Counts every tier's decisions for [`tier_stats`](Self::tier_stats)
    /// and [`RateLimiter::stats`] (the sum over the tiers), as
    /// [`Builder::counting`](crate::Builder::counting) does for one limiter;
    /// off by default. Set it before any traffic: it rebuilds the tiers.
    #[must_use]
    pub fn counting(mut self, on: bool) -> Self {
        self.counting = on;
        for tier in self.tiers.values_mut() {
            *tier = Tier::new(tier.rules(), self.bounds, on);
        }
        self
    }

    /// What tier `name` decided and did (its clients created, evicted,
    /// forgotten; its sweeps; its decisions if the registry counts them).
    ///
    /// # Errors
    ///
    /// [`UnknownTier`] if there is no such tier.
    pub fn tier_stats(&self, name: &str) -> Result<Stats, UnknownTier> {
        let tier = self.tiers.get(name).ok_or_else(|| self.unknown(name))?;
        Ok(tier.stats())
    }

    /// The sum of every tier's [`tier_stats`](Self::tier_stats).
    pub fn stats(&self) -> Stats {
        let mut sum = Stats::default();
        for tier in self.tiers.values() {
            sum += tier.stats();
        }
        sum
    }

    /// Refuses the calls whose resolver (or the request, through
    /// [`RateLimiter::check_ruled_in_n_at`]) names a tier the registry
    /// lacks (`retry_after` `u64::MAX`: they can never be admitted; the
    /// HTTP layer answers `500` naming the tier), instead of answering them
    /// by the default tier.
    ///
    /// Either way they are counted
    /// ([`unknown_tier_calls`](Self::unknown_tier_calls)) and each name is
    /// logged the first time it is seen, as a `tracing` warning, for the
    /// first 64 names: a log only a subscriber prints
    /// (`tracing_subscriber::fmt().init()`). Without one, a misspelt tier
    /// answered by the default tier is silent but for the count and the
    /// headers, which name the default tier: refuse unknown tiers here to
    /// make it loud.
    #[must_use]
    pub fn reject_unknown_tiers(mut self) -> Self {
        self.reject_unknown = true;
        self
    }

    /// Checks that every name the resolver can give (if it can list them,
    /// [`Resolver::names`]) is a tier here, for a resolver of clients
    /// looked up by `&Q`: call it once the tiers are added. A [`ByTable`]
    /// resolver has [`checked`](Tiers::checked), which needs no `Q`.
    ///
    /// # Errors
    ///
    /// [`UnknownTier`] for the first name the registry lacks.
    pub fn checked_for<Q: ?Sized>(self) -> Result<Self, UnknownTier>
    where
        R: Resolver<Q>,
    {
        let names = self.resolver.names();
        self.with_names(names)
    }

    /// `self`, if every one of `names` is a tier here.
    fn with_names(self, names: Option<Vec<String>>) -> Result<Self, UnknownTier> {
        if let Some(names) = names
            && let Some(missing) = names.iter().find(|name| !self.tiers.contains_key(*name))
        {
            return Err(self.unknown(missing));
        }
        Ok(self)
    }

    /// Replaces tier `name`'s rule. Each of its clients moves to the new
    /// rule on its next call, keeping what it has spent (module docs). A
    /// rule equal to the current one changes nothing: no client is carried
    /// over, and each keeps its state exactly.
    ///
    /// # Errors
    ///
    /// [`TierError::Unknown`] if there is no such tier;
    /// [`TierError::Config`] if `spec` does not fit the clock's tick.
    pub fn reload(&self, name: &str, spec: TierSpec) -> Result<(), TierError> {
        // The rule a tier already has is answered without building a rule
        // set: a configuration poller's reload of an unchanged rule
        // allocates nothing.
        let tier = self.tiers.get(name).ok_or_else(|| self.unknown(name))?;
        if tier.current.load().spec.rules() == [spec.in_ticks_of(self.tick)?] {
            return Ok(());
        }
        self.reload_rules(name, spec.into())
    }

    /// [`reload`](Self::reload) with several rules. Each client carries
    /// over rule by rule: the new rule at each position keeps what the old
    /// rule there had spent (a rule beyond the old ones, what the old last
    /// one had), so a reload that changes one rule of several keeps what
    /// every rule had spent.
    ///
    /// # Errors
    ///
    /// As [`reload`](Self::reload).
    pub fn reload_rules(&self, name: &str, rules: RuleSet) -> Result<(), TierError> {
        let tier = self.tiers.get(name).ok_or_else(|| self.unknown(name))?;
        let spec = rules.in_ticks_of(self.tick)?;
        self.bounds.validate_for(&spec)?;
        // Reloads of one tier may race; two that both see an old rule both
        // store, and the later store wins, as if they had run in turn.
        let before = tier.current.load_full();
        if before.spec != spec {
            tracing::info!(
                tier = name,
                "floodgate: tier {name:?} reloaded: {} to {spec}",
                before.spec
            );
            tier.current.store(Arc::new(Generation::new(spec)));
        }
        Ok(())
    }

    /// Tier `name`'s rule now: for several rules, the one with the
    /// smallest limit ([`RuleSet::strictest`]; [`rules`](Self::rules) has
    /// them all).
    ///
    /// # Errors
    ///
    /// [`UnknownTier`] if there is no such tier.
    pub fn rule(&self, name: &str) -> Result<Rule, UnknownTier> {
        self.tiers
            .get(name)
            .map(Tier::spec)
            .ok_or_else(|| self.unknown(name))
    }

    /// Tier `name`'s rules now.
    ///
    /// # Errors
    ///
    /// [`UnknownTier`] if there is no such tier.
    pub fn rules(&self, name: &str) -> Result<RuleSet, UnknownTier> {
        self.tiers
            .get(name)
            .map(Tier::rules)
            .ok_or_else(|| self.unknown(name))
    }

    /// The tiers' names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tiers.keys().cloned().collect();
        names.sort();
        names
    }

    /// How many calls found their resolver naming a tier the registry does
    /// not have (each answered by the default tier, or refused).
    pub fn unknown_tier_calls(&self) -> u64 {
        self.unknown_calls.load(Ordering::Relaxed)
    }

    /// Logs an unknown tier's name the first time it is seen (a `tracing`
    /// warning), for the first [`LOGGED_NAMES`] names, saying what named
    /// it: the resolver, or the caller that named the tier (`by`).
    fn log_unknown(&self, name: &str, by: By) {
        use crate::sync::counter::Ordering::Relaxed;
        if self.logged_names.load(Relaxed) > LOGGED_NAMES || self.logged.contains_sync(name) {
            return;
        }
        // One place per name, taken before the insert: the set never holds
        // more than `LOGGED_NAMES` names, and the place past the last says
        // that the logging stopped.
        let place = self.logged_names.fetch_add(1, Relaxed);
        if place >= LOGGED_NAMES {
            if place == LOGGED_NAMES {
                tracing::warn!(
                    "floodgate: more than {LOGGED_NAMES} unknown tier names; \
                     not logging more (see Tiers::unknown_tier_calls)"
                );
            }
            return;
        }
        if self.logged.insert_sync(name.to_owned()).is_ok() {
            let answer = if self.reject_unknown {
                "refused".to_owned()
            } else {
                format!("answered by the default tier {:?}", self.default_tier)
            };
            let by = match by {
                By::Resolver => "the resolver".to_owned(),
                By::Caller => named::caller(),
            };
            tracing::warn!(
                tier = name,
                "floodgate: {by} named a tier the registry lacks, {:?}: \
                 its calls are {answer} (tiers: {:?})",
                name,
                self.names()
            );
        }
    }

    fn unknown(&self, name: &str) -> UnknownTier {
        UnknownTier {
            name: name.to_owned(),
            known: self.names(),
        }
    }

    /// `key`'s tier and its name: the resolver's answer, or (counted) the
    /// default tier; `Err` with the unknown name for a registry that
    /// refuses unknown tiers.
    #[inline]
    fn tier_of<'a, Q: ?Sized>(
        &'a self,
        key: &Q,
    ) -> Result<(&'a str, &'a Tier<K>, Option<String>), String>
    where
        R: Resolver<Q>,
    {
        let name = self.resolver.tier(key);
        self.tier_named(name, By::Resolver)
    }

    /// The tier named `name` (by `by`) and its name, as `tier_of` answers
    /// a resolver's name: an unknown one counted, logged once, and
    /// answered by the default tier or refused.
    #[inline]
    fn tier_named(
        &self,
        name: TierName<'_>,
        by: By,
    ) -> Result<(&str, &Tier<K>, Option<String>), String> {
        match self.tiers.get_key_value(&*name) {
            Some((name, tier)) => Ok((name, tier, None)),
            None => self.unknown_tier_of(name.into_owned(), by),
        }
    }

    #[cold]
    #[inline(never)]
    fn unknown_tier_of(
        &self,
        name: String,
        by: By,
    ) -> Result<(&str, &Tier<K>, Option<String>), String> {
        self.unknown_calls.fetch_add(1, Ordering::Relaxed);
        self.log_unknown(&name, by);
        if self.reject_unknown {
            return Err(name);
        }
        let (default, tier) = self
            .tiers
            .get_key_value(&self.default_tier)
            .expect("the default tier is always present");
        Ok((default, tier, Some(name)))
    }

    /// `check_n_at` on tier `tier`'s state of `key`, whatever the resolver
    /// says: for a tier known from the request itself. The cost is in units
    /// of the client's current rule; what a carry-over keeps is counted in
    /// units too (`limit − remaining`).
    fn check_on<Q>(&self, tier: &Tier<K>, key: &Q, now: u64, cost: u64) -> Decision
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        let decision = tier
            .call(
                key,
                now,
                |generation, origin, state, latest, now| {
                    // Judged no earlier than the latest time a check presented
                    // or a carry-over was made at, nor than the origin (a call
                    // racing the one that created the client); waits measured
                    // from the call's own `now`. A cost of 0 asks nothing and
                    // raises nothing.
                    let before = match latest {
                        Some(latest) if cost > 0 => latest.fetch_max(now, Ordering::Relaxed),
                        Some(latest) => latest.load(Ordering::Relaxed),
                        None => 0,
                    };
                    let judged = now.max(before).max(origin);
                    let decision = generation.check_n(state, judged - origin, cost)?;
                    Ok(if judged > now && cost > 0 {
                        generation.measured_from_earlier(decision, judged - now)
                    } else {
                        decision
                    })
                },
                |generation, rule| {
                    let limit = generation.strictest.config().limit();
                    let remaining = if rule == Overflow::Admit { limit } else { 0 };
                    if cost == 0 {
                        Decision::admit(remaining)
                    } else if cost > limit {
                        Decision::reject(remaining, NEVER)
                    } else if rule == Overflow::Admit {
                        Decision::admit(limit - cost)
                    } else {
                        Decision::reject(0, generation.forgets_after())
                    }
                },
                true,
            )
            .in_ticks(self.tick)
            .made_at(now);
        if let Some(counters) = &tier.counters {
            // Only a refusal reads it: the rules of the tier now (a reload
            // racing this call may have changed them; a count, not a
            // decision).
            let in_flight = if decision.allowed {
                0
            } else {
                crate::stats::in_flight_mask(&tier.current.load().spec)
            };
            counters.decided(&decision, cost, in_flight);
        }
        decision
    }

    /// A refused call of a tier the registry lacks.
    fn refused(&self) -> Decision {
        Decision::reject(0, NEVER).in_ticks(self.tick)
    }

    /// Decides one request of `key` at `now` in tier `tier`, whatever the
    /// resolver says (the tier is known from the request: an API key's
    /// plan). The client's state is that tier's.
    ///
    /// # Errors
    ///
    /// [`UnknownTier`] if there is no such tier.
    pub fn check_in_at<Q>(&self, tier: &str, key: &Q, now: u64) -> Result<Decision, UnknownTier>
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        let found = self.tiers.get(tier).ok_or_else(|| self.unknown(tier))?;
        Ok(self.check_on(found, key, now, 1))
    }

    /// Gives back up to `cost` units of `key`'s admission at `at` in tier
    /// `tier` (one checked with [`check_in_at`](Self::check_in_at)), judged
    /// at `now`: [`RateLimiter::refund_at`] in a named tier.
    ///
    /// # Errors
    ///
    /// [`UnknownTier`] if there is no such tier.
    pub fn refund_in_at<Q>(
        &self,
        tier: &str,
        key: &Q,
        now: u64,
        at: u64,
        cost: u64,
    ) -> Result<u64, UnknownTier>
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        let found = self.tiers.get(tier).ok_or_else(|| self.unknown(tier))?;
        Ok(found.refund(key, now, at, cost))
    }

    /// [`check_in_at`](Self::check_in_at) now, by the registry's clock.
    ///
    /// # Errors
    ///
    /// [`UnknownTier`] if there is no such tier.
    pub fn check_in<Q>(&self, tier: &str, key: &Q) -> Result<Decision, UnknownTier>
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
        C: Clock,
    {
        self.check_in_at(tier, key, self.clock.now())
    }

    /// Decides one request of `key` at `now`, and says which tier and rule
    /// decided it.
    pub fn check_tiered_at<Q>(&self, key: &Q, now: u64) -> TieredDecision<'_>
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
        R: Resolver<Q>,
    {
        self.check_tiered_n_at(key, now, 1)
    }

    /// [`check_tiered_at`](Self::check_tiered_at) for a request of cost
    /// `cost`.
    pub fn check_tiered_n_at<Q>(&self, key: &Q, now: u64, cost: u64) -> TieredDecision<'_>
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
        R: Resolver<Q>,
    {
        self.tiered_on(self.tier_of(key), key, now, cost)
    }

    /// A tiered decision as the headers describe it.
    fn ruled<'a>(&self, tiered: TieredDecision<'a>) -> RuledDecision<'a> {
        RuledDecision {
            decision: tiered.decision,
            tier: Some(tiered.tier),
            policy: tiered.rule.policy(),
            config: tiered.rule.config(),
            // An unknown name is refused exactly when the registry rejects
            // unknown tiers (else the default tier answered).
            refused_unknown_tier: tiered.unknown.is_some() && self.reject_unknown,
            each: crate::RuleAnswers::default(),
        }
    }

    /// The decision in the tier `found` (`tier_of`'s answer, or
    /// `tier_named`'s) as the headers describe it: with each rule's own
    /// answer when the tier has several, so that each has its member
    /// (`TIER-1`, `TIER-2`, ...), as a limiter's rules have theirs.
    fn ruled_on<'a, Q>(
        &'a self,
        found: Result<(&'a str, &'a Tier<K>, Option<String>), String>,
        key: &Q,
        now: u64,
        cost: u64,
    ) -> RuledDecision<'a>
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        let tier = found.as_ref().ok().map(|(_, tier, _)| *tier);
        let mut ruled = self.ruled(self.tiered_on(found, key, now, cost));
        if let Some(tier) = tier {
            ruled.each = tier
                .each(key, now, cost, &ruled.decision)
                .in_ticks(self.tick);
        }
        ruled
    }

    /// The decision in the tier `found` (`tier_of`'s answer, or
    /// `tier_named`'s).
    fn tiered_on<'a, Q>(
        &'a self,
        found: Result<(&'a str, &'a Tier<K>, Option<String>), String>,
        key: &Q,
        now: u64,
        cost: u64,
    ) -> TieredDecision<'a>
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        match found {
            Ok((name, tier, unknown)) => {
                // The rule the call meets: read before the call, so a reload
                // in between shows the older one.
                let rule = tier.spec();
                TieredDecision {
                    decision: self.check_on(tier, key, now, cost),
                    tier: name,
                    rule,
                    unknown,
                }
            }
            Err(unknown) => {
                let (name, tier) = self
                    .tiers
                    .get_key_value(&self.default_tier)
                    .expect("the default tier is always present");
                TieredDecision {
                    decision: self.refused(),
                    tier: name,
                    rule: tier.spec(),
                    unknown: Some(unknown),
                }
            }
        }
    }
}

impl<K, R, C> fmt::Debug for Tiers<K, R, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut tiers: Vec<_> = self.tiers.iter().collect();
        tiers.sort_by(|a, b| a.0.cmp(b.0));
        f.debug_struct("Tiers")
            .field("default_tier", &self.default_tier)
            .field(
                "tiers",
                &tiers
                    .iter()
                    .map(|(name, tier)| (name, tier.rules().to_string()))
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl<K, Q, R, C> RateLimiter<Q> for Tiers<K, R, C>
where
    K: Borrow<Q> + Hash + Eq + Clone + Send + Sync + 'static,
    Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    R: Resolver<Q>,
    C: Clock,
{
    fn saved_by(&self) -> Option<(&'static str, Tick)> {
        Some((crate::state::TIERS, self.tick))
    }

    /// The default tier first, then the others by name.
    fn saved_groups(&self) -> Vec<(String, RuleSet)> {
        self.ordered()
            .map(|(name, tier)| (name.to_owned(), tier.rules()))
            .collect()
    }

    fn save_clients(&self, visit: &mut dyn FnMut(&str, &Q, &[u64])) {
        let now = self.clock.now();
        for (name, tier) in self.ordered() {
            tier.save_clients(now, |key, words| visit(name, key.borrow(), words));
        }
    }

    /// Every tier's clients read first, so that a refusal puts none; past
    /// a tier's cap, its clients with the least left are kept
    /// (`state::keep_at_cap`).
    fn load_clients(
        &self,
        groups: Vec<crate::state::Group<'_, K>>,
    ) -> Result<usize, crate::state::ClientsRefused> {
        use crate::state::ClientsRefused;
        if self.tiers.values().any(|tier| tier.clients.len() != 0) {
            return Err(ClientsRefused::NotEmpty);
        }
        let now = self.clock.now();
        let mut built = Vec::with_capacity(groups.len());
        for group in groups {
            let Some(tier) = self.tiers.get(&group.name) else {
                return Err(ClientsRefused::UnknownGroup(group.name));
            };
            let (generation, clients) = tier
                .loaded(group, self.tick)
                .map_err(ClientsRefused::Client)?;
            if let Some(i) = crate::state::first_duplicate(clients.iter().map(|(key, _)| key)) {
                return Err(ClientsRefused::Duplicate(i));
            }
            let clients =
                crate::state::keep_at_cap(clients, tier.clients.bounds().cap(), |(_, client)| {
                    generation
                        .remaining(&client.state.state, now.saturating_sub(client.origin))
                        .unwrap_or(0)
                });
            built.push((tier, clients));
        }
        Ok(built
            .into_iter()
            .map(|(tier, clients)| tier.put(clients, now))
            .sum())
    }

    #[inline]
    fn check_at(&self, key: &Q, now: u64) -> Decision {
        self.check_n_at(key, now, 1)
    }

    #[inline]
    fn check_n_at(&self, key: &Q, now: u64, cost: u64) -> Decision {
        match self.tier_of(key) {
            Ok((_, tier, _)) => self.check_on(tier, key, now, cost),
            Err(_) => self.refused(),
        }
    }

    /// Against the limit of the client's own tier (a client of an unknown
    /// tier that is refused gets its refusal, not this error).
    fn try_check_n_at(
        &self,
        key: &Q,
        now: u64,
        cost: u64,
    ) -> Result<Decision, crate::InsufficientCapacity> {
        let Ok((_, tier, _)) = self.tier_of(key) else {
            return Ok(self.refused());
        };
        let decision = self.check_on(tier, key, now, cost);
        let limit = tier.spec().config().limit();
        if cost > limit {
            return Err(crate::InsufficientCapacity { cost, limit });
        }
        Ok(decision)
    }

    #[inline]
    fn remaining_at(&self, key: &Q, now: u64) -> u64 {
        let Ok((_, tier, _)) = self.tier_of(key) else {
            return 0;
        };
        tier.call(
            key,
            now,
            |generation, origin, state, _, now| {
                generation.remaining(state, now.saturating_sub(origin))
            },
            |generation, rule| match rule {
                Overflow::Admit => generation.strictest.config().limit(),
                _ => 0,
            },
            false,
        )
    }

    fn now(&self) -> u64 {
        self.clock.now()
    }

    /// The default tier's policy (a client's own: [`Tiers::check_tiered_at`]).
    fn policy(&self) -> PolicyKind {
        self.tiers[&self.default_tier].spec().policy()
    }

    /// The default tier's limits (a client's own: [`Tiers::check_tiered_at`]).
    fn config(&self) -> Config {
        self.tiers[&self.default_tier].spec().config()
    }

    fn stats(&self) -> Option<Stats> {
        Some(Tiers::stats(self))
    }

    fn tracked_clients(&self) -> usize {
        self.tiers.values().map(|tier| tier.clients.len()).sum()
    }

    /// Carries the client over first if its tier's rule changed (that
    /// creates no client), so the answer is what its next call would see.
    fn peek_at(&self, key: &Q, now: u64) -> Option<u64> {
        let (_, tier, _) = self.tier_of(key).ok()?;
        tier.peek(key, now)
    }

    /// In the client's tier, as [`peek_at`](Self::peek_at): that tier's
    /// rules, each answering on its own.
    fn peek_each_at(&self, key: &Q, now: u64) -> Option<crate::RuleAnswers> {
        let (_, tier, _) = self.tier_of(key).ok()?;
        Some(tier.peek_each(key, now)?.in_ticks(self.tick))
    }

    /// In the tier the resolver names now, as [`forget`](Self::forget):
    /// an admission checked in another tier with [`Tiers::check_in`] is
    /// given back there with [`Tiers::refund_in_at`].
    fn refund_at(&self, key: &Q, now: u64, at: u64, cost: u64) -> u64 {
        match self.tier_of(key) {
            Ok((_, tier, _)) => tier.refund(key, now, at, cost),
            Err(_) => 0,
        }
    }

    /// In the tier the resolver names now, as [`refund_at`](Self::refund_at).
    fn release_at(&self, key: &Q, now: u64, cost: u64) -> u64 {
        match self.tier_of(key) {
            Ok((_, tier, _)) => tier.release(key, now, cost),
            Err(_) => 0,
        }
    }

    /// Forgets the client in the tier the resolver names now (a client
    /// checked in other tiers with [`Tiers::check_in`] has state in each).
    fn forget(&self, key: &Q) -> bool {
        self.tier_of(key).is_ok_and(|(_, tier, _)| tier.forget(key))
    }

    fn sweep_at(&self, now: u64) -> usize {
        self.tiers.values().map(|tier| tier.sweep_at(now)).sum()
    }

    /// The client's tier and its rule, as [`Tiers::check_tiered_at`] finds
    /// them.
    fn check_ruled_at(&self, key: &Q, now: u64) -> RuledDecision<'_> {
        self.check_ruled_n_at(key, now, 1)
    }

    /// The tier named, not the resolver's: see
    /// [`RateLimiter::check_ruled_in_n_at`]. An unknown name is counted in
    /// [`unknown_tier_calls`](Tiers::unknown_tier_calls) and logged once,
    /// as a resolver's is.
    fn check_ruled_in_n_at(&self, tier: &str, key: &Q, now: u64, cost: u64) -> RuledDecision<'_> {
        self.ruled_on(
            self.tier_named(TierName::Borrowed(tier), By::Caller),
            key,
            now,
            cost,
        )
    }

    /// Where `check_ruled_in_n_at` spent: the named tier, or the default
    /// one for a name the registry lacks (counted and logged by that
    /// check, not again here); nothing when such names are refused.
    fn refund_in_at(&self, tier: &str, key: &Q, now: u64, at: u64, cost: u64) -> u64 {
        let found = match self.tiers.get(tier) {
            Some(found) => found,
            None if self.reject_unknown => return 0,
            None => &self.tiers[&self.default_tier],
        };
        found.refund(key, now, at, cost)
    }

    /// Where `check_ruled_in_n_at` held units, as
    /// [`refund_in_at`](RateLimiter::refund_in_at) finds it.
    fn release_in_at(&self, tier: &str, key: &Q, now: u64, cost: u64) -> u64 {
        let found = match self.tiers.get(tier) {
            Some(found) => found,
            None if self.reject_unknown => return 0,
            None => &self.tiers[&self.default_tier],
        };
        found.release(key, now, cost)
    }

    fn check_ruled_n_at(&self, key: &Q, now: u64, cost: u64) -> RuledDecision<'_> {
        self.ruled_on(self.tier_of(key), key, now, cost)
    }
}

/// The registry [`install`] sets up for the whole process: `String` keys,
/// a boxed resolver, the default clock.
pub type ProcessTiers = Tiers<String, Box<dyn Resolver<str>>>;

static INSTALLED: OnceLock<ProcessTiers> = OnceLock::new();

/// Makes `tiers` the process-wide registry, once.
///
/// # Errors
///
/// Gives `tiers` back if a registry is already installed.
///
/// ```
/// use floodgate::tiers::{self, TierSpec, Tiers};
/// use floodgate::{Config, PolicyKind, RateLimiter};
///
/// let spec = TierSpec::new(PolicyKind::Gcra, Config::per_ticks(100, 1_000_000_000)?)?;
/// let registry = Tiers::new("free", spec, Box::new(|_: &str| "free") as Box<_>);
/// assert!(tiers::install(registry).is_ok());
///
/// // Anywhere else in the process:
/// let limiter = tiers::installed().expect("installed at start-up");
/// assert!(limiter.allow("client-42"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[allow(clippy::result_large_err)] // the registry itself is handed back
pub fn install(tiers: ProcessTiers) -> Result<&'static ProcessTiers, ProcessTiers> {
    let mut offered = Some(tiers);
    let installed = INSTALLED.get_or_init(|| offered.take().expect("taken once"));
    match offered {
        None => Ok(installed),
        Some(refused) => Err(refused),
    }
}

/// The process-wide registry, if one was [`install`]ed.
pub fn installed() -> Option<&'static ProcessTiers> {
    INSTALLED.get()
}

impl<K, R, C> Tiers<K, R, C> {
    /// The tiers, the default one first, then the others by name: the
    /// order a save keeps them in.
    fn ordered(&self) -> impl Iterator<Item = (&str, &Tier<K>)> {
        let mut others: Vec<(&str, &Tier<K>)> = self
            .tiers
            .iter()
            .filter(|(name, _)| **name != self.default_tier)
            .map(|(name, tier)| (name.as_str(), tier))
            .collect();
        others.sort_unstable_by_key(|(name, _)| *name);
        let default = self
            .tiers
            .get(&self.default_tier)
            .map(|tier| (self.default_tier.as_str(), tier));
        default.into_iter().chain(others)
    }
}
