//! How a Redis limiter is built: where its time comes from, what it
//! answers when Redis fails, and the options that hold both.

#[cfg(doc)]
use super::{RedisError, RedisLimiter};
#[cfg(doc)]
use crate::{build_bounded, RateLimiter};
use std::time::Duration;

use super::rejections::DEFAULT_REJECTION_CACHE;
use crate::{Bounds, Overflow};

/// Where a decision's `now` comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TimeSource {
    /// Redis's clock (`TIME`), in microseconds since the Unix epoch: one
    /// clock for every instance. The window is in microseconds. The `*_at`
    /// methods may still pass a time, in the same unit.
    #[default]
    Server,
    /// The caller's time, in ticks of `tick`. `tick` is a whole number of
    /// milliseconds or divides one millisecond (1 µs, 10 µs, 250 µs, 1 ms,
    /// 1 s, …), and is at least 1 µs; it converts TTLs to real time and
    /// scales the Unix time that `check` and `remaining` pass.
    Caller {
        /// The real duration of one tick.
        tick: Duration,
    },
}

impl TimeSource {
    /// Caller-supplied times in milliseconds, as `floodgate replay` uses.
    pub const MILLIS: TimeSource = TimeSource::Caller {
        tick: Duration::from_millis(1),
    };

    /// The tick's length in nanoseconds.
    pub(super) fn tick_ns(self) -> u128 {
        match self {
            TimeSource::Server => 1_000,
            TimeSource::Caller { tick } => tick.as_nanos(),
        }
    }
}

/// What the [`RateLimiter`] methods answer when Redis fails (the `try_*`
/// methods return the error instead).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OnFailure {
    /// Reject: `allowed` false, `remaining` 0, `retry_after` the timeout in
    /// ticks (at least 1). The default, as with the in-memory engine's caps:
    /// an outage of the limiter must not become an outage of what it
    /// protects.
    #[default]
    FailClosed,
    /// Admit: `allowed` true, `remaining` the limit, no delay.
    FailOpen,
    /// Decide with an in-memory limiter of the same policy and
    /// configuration, local to this process: each instance then limits on
    /// its own until Redis is back, so the total admitted may reach the
    /// limit times the number of instances. Its state is not merged into
    /// Redis afterwards.
    ///
    /// That limiter is [`build_bounded`] with [`RedisOptions::local_bounds`],
    /// by default [`DEFAULT_LOCAL_BOUNDS`]: idle clients are evicted and at
    /// most [`DEFAULT_LOCAL_MAX_CLIENTS`] are tracked, and a new client that
    /// finds no room is rejected ([`Overflow::Reject`]), so an outage under
    /// a flood of new ids costs bounded memory and fails closed for the
    /// newcomers only.
    Local,
}

/// The cap of [`DEFAULT_LOCAL_BOUNDS`]: how many clients the
/// [`OnFailure::Local`] fallback tracks at most unless told otherwise.
///
/// With idle eviction only the clients that called within about a window
/// count, so one instance rarely holds that many while Redis is down; a
/// flood of new ids reaches it, and then costs about 10 MB (56 to 72 bytes
/// per client for the fixed-size policies, plus the `String` key's 24
/// bytes and its length, for ids of about 20 bytes). `sliding-window`
/// keeps `L` times per client (72 + 16·`L` bytes): with a large limit,
/// give a smaller cap.
pub const DEFAULT_LOCAL_MAX_CLIENTS: usize = 100_000;

/// The default [`RedisOptions::local_bounds`]: idle eviction, at most
/// [`DEFAULT_LOCAL_MAX_CLIENTS`] clients, and [`Overflow::Reject`] at the
/// cap. Failing closed for newcomers matches [`OnFailure`]'s own default:
/// an outage must not become a way around the limit, and the clients the
/// fallback already tracks (the ones that keep calling) never feel the cap.
pub const DEFAULT_LOCAL_BOUNDS: Bounds = Bounds::new()
    .evict_idle()
    .max_clients(DEFAULT_LOCAL_MAX_CLIENTS)
    .on_overflow(Overflow::Reject);

/// Options of a Redis limiter; [`RedisOptions::new`] gives the defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisOptions {
    pub(super) prefix: String,
    pub(super) time: TimeSource,
    pub(super) timeout: Duration,
    pub(super) on_failure: OnFailure,
    pub(super) local_bounds: Bounds,
    pub(super) min_ttl: Duration,
    pub(super) connections: usize,
    pub(super) rejection_cache: usize,
    pub(super) batching: bool,
    pub(super) lease: Option<Duration>,
    pub(super) leasing: Option<Leasing>,
}

/// Leases of a shared limit (the contract's "A limit shared by many
/// instances", [`RedisOptions::leasing`]): the term δ, and the most units
/// one lease takes.
///
/// ```
/// use std::time::Duration;
/// use floodgate::redis::{Leasing, RedisOptions};
///
/// let options = RedisOptions::new().leasing(Some(Leasing::new(Duration::from_millis(500))));
/// assert_eq!(options.get_leasing().map(|leasing| leasing.term()), Some(Duration::from_millis(500)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leasing {
    term: Duration,
    max_units: u64,
}

/// The term of [`Leasing::default`]: one second.
pub const DEFAULT_LEASE_TERM: Duration = Duration::from_secs(1);

/// The most units one lease takes, by default: [`Leasing::max_units`].
pub const DEFAULT_LEASE_UNITS: u64 = 1 << 16;

impl Default for Leasing {
    fn default() -> Self {
        Self::new(DEFAULT_LEASE_TERM)
    }
}

impl Leasing {
    /// Leases of term `term` (δ, at least 1 ms), each of at most
    /// [`DEFAULT_LEASE_UNITS`] units.
    ///
    /// `term` is how long a lease of a drip rule (`token-bucket`, `gcra`)
    /// is spent, and how much later than its lease a `sliding-window`
    /// rule's admissions enter the log: the drip rules may admit, over any
    /// span D, what one limiter would admit over D + δ; the windows and
    /// the log never more than one limiter would. A longer term lets a
    /// client's leases grow larger (fewer round trips) and, for the drip
    /// rules, costs that much more slack; a window rule's lease ends with
    /// its window whatever the term.
    pub const fn new(term: Duration) -> Self {
        Self {
            term,
            max_units: DEFAULT_LEASE_UNITS,
        }
    }

    /// The most units one lease takes (1 ..= 2^20 − 1; a rule's limit, and
    /// what the store has left, cut it further).
    pub const fn max_units(mut self, units: u64) -> Self {
        self.max_units = units;
        self
    }

    /// The term δ.
    pub const fn term(&self) -> Duration {
        self.term
    }

    /// The most units one lease takes.
    pub const fn get_max_units(&self) -> u64 {
        self.max_units
    }
}

/// How long an `in-flight` rule's holder holds its units in Redis unless
/// renewed, by default: [`RedisOptions::lease`].
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

impl Default for RedisOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl RedisOptions {
    /// Prefix `floodgate`, Redis's clock, a 100 ms timeout, fail closed
    /// (with [`DEFAULT_LOCAL_BOUNDS`] should the rule become
    /// [`OnFailure::Local`]), no least TTL, 8 blocking connections, a
    /// rejection cache of [`DEFAULT_REJECTION_CACHE`] clients, and the async
    /// limiter's checks batched.
    pub fn new() -> Self {
        Self {
            prefix: "floodgate".to_owned(),
            time: TimeSource::Server,
            timeout: Duration::from_millis(100),
            on_failure: OnFailure::FailClosed,
            local_bounds: DEFAULT_LOCAL_BOUNDS,
            min_ttl: Duration::ZERO,
            connections: 8,
            rejection_cache: DEFAULT_REJECTION_CACHE,
            batching: true,
            lease: Some(DEFAULT_LEASE),
            leasing: None,
        }
    }

    /// Spends a shared limit locally, from leases (the contract's "A limit
    /// shared by many instances"; `None`, the default, asks Redis for every
    /// decision). A lease takes units of a client's rules out of Redis in
    /// one script call, as one admission of that many would, and this
    /// limiter admits that client's requests from them with no round trip
    /// until the lease ends. See the module's "Leases".
    ///
    /// Not every rule set leases: one with an `in-flight` rule (whose
    /// units are held per request) or a `leaky-bucket` (a shaper, whose
    /// delays are per request) asks Redis for every decision, as without
    /// leases.
    pub fn leasing(mut self, leasing: Option<Leasing>) -> Self {
        self.leasing = leasing;
        self
    }

    /// The leases' options ([`leasing`](Self::leasing)).
    pub fn get_leasing(&self) -> Option<Leasing> {
        self.leasing
    }

    /// How long the units an `in-flight` rule holds for one admission stay
    /// held in Redis without a renewal (default [`DEFAULT_LEASE`], at
    /// least 1 ms): the limiter renews its own holders' leases every third
    /// of it while their requests run, so a process that dies holding
    /// units gives them back within one lease after its last renewal (and
    /// a release that never comes, within one lease of the process's end).
    /// `None` holds them until they are released, as the contract does,
    /// and a holder that dies holds them for ever: for `floodgate replay`
    /// and tests, whose times are not the wall clock's.
    pub fn lease(mut self, lease: Option<Duration>) -> Self {
        self.lease = lease;
        self
    }

    /// The lease of `in-flight` holders ([`lease`](Self::lease)).
    pub fn get_lease(&self) -> Option<Duration> {
        self.lease
    }

    /// The first part of every key (no `{` or `}`, which would move the
    /// client's hash tag).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Where `now` comes from.
    pub fn time(mut self, time: TimeSource) -> Self {
        self.time = time;
        self
    }

    /// How long Redis may keep a call waiting before it fails with
    /// [`RedisError::Timeout`] (at least 1 ms; default 100 ms). The async
    /// limiter bounds the whole call, reconnection included; the blocking
    /// one bounds each wait on its socket (connecting, sending, the reply),
    /// so a call that must also load its script may wait up to three times
    /// as long.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What the [`RateLimiter`] methods answer when Redis fails.
    pub fn on_failure(mut self, rule: OnFailure) -> Self {
        self.on_failure = rule;
        self
    }

    /// How the in-memory limiter of [`OnFailure::Local`] bounds its memory
    /// (default [`DEFAULT_LOCAL_BOUNDS`]; see [`crate::bounds`]). Ignored by
    /// the other rules. [`Bounds::new`] alone tracks every client until the
    /// process ends, however many new ids an outage brings.
    pub fn local_bounds(mut self, bounds: Bounds) -> Self {
        self.local_bounds = bounds;
        self
    }

    /// The least TTL of a written state (whole milliseconds count; default
    /// zero). States normally expire as soon as they answer as an empty one;
    /// a longer life keeps the grid policies' origins (and so their answers
    /// exact) for clients that come back within it, and protects
    /// caller-supplied times that run slower than real time. At most 2^46
    /// ms (2,230 years), the longest TTL the scripts set: a longer one is
    /// that.
    pub fn min_ttl(mut self, min_ttl: Duration) -> Self {
        self.min_ttl = min_ttl;
        self
    }

    /// How many connections the blocking [`RedisLimiter`] keeps (at least
    /// 1): that many calls can be in flight at once; more wait for one.
    /// The async limiter multiplexes one connection and ignores this.
    pub fn connections(mut self, connections: usize) -> Self {
        self.connections = connections;
        self
    }

    /// How many rejected clients the local rejection cache remembers at
    /// most (default [`DEFAULT_REJECTION_CACHE`]); 0 turns the cache off,
    /// and every decision is then a round trip. See the module's
    /// "A flood is answered locally".
    pub fn rejection_cache(mut self, max_clients: usize) -> Self {
        self.rejection_cache = max_clients;
        self
    }

    /// Whether the async limiter sends checks that wait at the same time as
    /// one script call (default on, one server only): see the module's
    /// "Batches". Off, every check is a script call of its own.
    pub fn batching(mut self, enabled: bool) -> Self {
        self.batching = enabled;
        self
    }

    /// Whether the async limiter batches checks.
    pub fn get_batching(&self) -> bool {
        self.batching
    }

    /// The rejection cache's cap (0: off).
    pub fn get_rejection_cache(&self) -> usize {
        self.rejection_cache
    }

    /// The key prefix.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// The time source.
    pub fn get_time(&self) -> TimeSource {
        self.time
    }

    /// The bounds of the [`OnFailure::Local`] fallback.
    pub fn get_local_bounds(&self) -> Bounds {
        self.local_bounds
    }
}
