//! The Redis store: the same six policies and the same answers, with each
//! client's state in Redis, so that any number of instances share one limit.
//! Compiled with the cargo feature `redis`.
//!
//! # From one instance to many
//!
//! The in-memory [`build`](crate::build) becomes [`RedisLimiter::new`]; the
//! call sites do not change, as both are a [`RateLimiter<str>`]:
//!
//! ```no_run
//! use floodgate::redis::{RedisLimiter, RedisOptions};
//! use floodgate::{Config, PolicyKind, RateLimiter};
//!
//! // 100 requests per second. The default clock is Redis's own, in
//! // microseconds, so the window is in microseconds too.
//! let config = Config::per_ticks(100, 1_000_000)?;
//! let limiter = RedisLimiter::new(
//!     "redis://127.0.0.1:6379",
//!     PolicyKind::Gcra,
//!     config,
//!     RedisOptions::new().prefix("api"),
//! )?;
//! let decision = limiter.check("client-42");
//! if !decision.allowed() {
//!     // answer 429 with `Retry-After: decision.retry_after_secs()`
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Tokio services use [`AsyncRedisLimiter`], whose methods are `async` and
//! share one multiplexed connection that reconnects on its own.
//!
//! # One round trip per decision
//!
//! Each decision that reaches Redis is one round trip (the rejection
//! cache, below, answers some without any). Each policy's step is one Lua
//! script (`src/redis/scripts/`), loaded once and called by its SHA1 with
//! `EVALSHA`; Redis runs a script alone, so the read, the step and the write
//! are atomic with no `WATCH`/`MULTI` and no retry. A limiter's constants
//! (limit, window, tick, least TTL) are written into its script, so a call
//! carries only its operation, `now` and cost: limiters of one policy and
//! quota share a script, and each quota adds one to Redis's script cache.
//! The scripts are the contract of `SPEC.md` written out in integer
//! arithmetic, field by field, and the tests compare every answer with the
//! in-memory engine's.
//!
//! # Batches
//!
//! On one server, the async limiter sends checks that wait at the same
//! time as one script call, which decides each in turn
//! ([`RedisOptions::batching`], on by default). While fewer than four calls
//! are in flight a check goes out at once and alone (batching never waits
//! for a batch to fill); under load, Redis reads one request and starts one script for many
//! decisions instead of one each, about a third of a decision's cost there.
//! A batch is its decisions run one after another with nothing between
//! them, so the answers are those of the same checks sent one by one; on
//! Redis's clock a batch's decisions are judged at one instant, its
//! `TIME`. A failed batch fails each of its checks, whose callers answer by
//! the fault rule; a caller that gave up before its check went out (its
//! timeout, or its future dropped) is left out of the batch. A cluster
//! cannot run one script across slots: there every check goes alone, as do
//! the blocking limiter's (each thread waits on its own connection).
//!
//! # Several rules on one client
//!
//! [`RedisLimiter::with_rules`] and [`AsyncRedisLimiter::with_rules`]
//! apply a [`RuleSet`] (a burst limit and a daily quota, say) to every
//! client, with the answers of the contract's "Several limits on one
//! client" and of [`build_rules`] in memory:
//!
//! ```no_run
//! use floodgate::redis::{RedisLimiter, RedisOptions};
//! use floodgate::{RateLimiter, RuleSet};
//!
//! let rules: RuleSet = "gcra:10/1s,fixed-window:10000/1d".parse()?;
//! let limiter = RedisLimiter::with_rules("redis://127.0.0.1:6379", &rules, RedisOptions::new())?;
//! let decision = limiter.check("client-42");
//! if let Some(rule) = decision.refused_by() {
//!     // `retry_after` is the longest wait of the rules that refused.
//!     eprintln!("over {}", limiter.rules()[rule]);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Each rule keeps its own key per client (below), and a decision is still
//! one script call: the script runs every rule's step with its writes held,
//! and writes them only if every rule admitted, so a request one rule
//! refuses spends nothing of the others. The rejection cache keeps the
//! compound `retry_after` (the longest wait) and the rule that refused.
//! [`check_ruled_n_at`](RateLimiter::check_ruled_n_at) adds each rule's
//! own answer ([`RuledDecision::each`](crate::RuledDecision::each)) with a
//! second call that reads the states after the decision and writes
//! nothing.
//!
//! # A flood is answered locally
//!
//! A rejected request changes nothing, and other instances' admissions can
//! only make a client's state stricter; so a client that Redis rejected
//! with `retry_after = d` is rejected by every instance until `now + d`,
//! whatever happens elsewhere. Each limiter remembers such rejections in a
//! bounded local cache ([`RedisOptions::rejection_cache`], default
//! [`DEFAULT_REJECTION_CACHE`] clients, 0 turns it off; entries whose
//! deadline passed are dropped) and answers from it without a round trip.
//! The one app that floods then costs Redis one call per `d`, not one per
//! request.
//!
//! - **The decision is Redis's**: `allowed` is false exactly when Redis
//!   would answer false, and `delay` is 0, as in every rejection.
//! - **`retry_after` is a lower bound** of Redis's own: the part of `d` that
//!   is left. Admissions by other instances since may have moved Redis's
//!   answer later.
//! - **`remaining`** is Redis's at the rejection. For a request of cost 1
//!   that is 0, exact until the deadline; a rejection of a larger cost `n`
//!   leaves up to `n − 1`, which drips may raise and other instances lower
//!   meanwhile.
//! - **Costs.** A rejection of cost `n` says nothing about a smaller cost.
//!   The cache keeps, per client, the smallest rejected cost and its
//!   deadline, and answers a request of cost `m ≥ n` before that deadline;
//!   a smaller cost goes to Redis. Costs of 0 and above the limit are never
//!   cached (the first is always admitted, the second never, and both
//!   carry Redis's `remaining`).
//! - **Times.** A call that passes its `now` (every call with
//!   [`TimeSource::Caller`]) is rejected until `now + d` on the caller's
//!   time line; one on Redis's clock until the instant it was sent, on the
//!   local monotonic clock, plus `d` (Redis read `TIME` after that, so its
//!   deadline is no earlier, unless its clock jumps forward). A call whose
//!   time is before the rejection's goes to Redis.
//! - **What it does not see**: a [`forget`](RedisLimiter::try_forget) on
//!   another instance (the one on this instance drops the entry), or a key
//!   deleted behind the limiter's back. Either makes Redis more lenient
//!   than the cache until the deadline.
//!
//! # Leases
//!
//! With [`RedisOptions::leasing`], a limiter takes a client's units out of
//! Redis a batch at a time (a *lease*: one script call, as one admission
//! of that many) and admits that client's requests from them with no round
//! trip until they are spent or the lease ends, never over the limit
//! summed over every instance (the contract's "A limit shared by many
//! instances"). Each instance keeps its clients' leases in the engine's
//! keyed store, two lease slots per client, spent by one compare-and-swap;
//! a client seen rarely leases one unit at a time, a hot one's leases grow
//! while they are spent within the term and shrink as Redis's remainder
//! falls. `docs/leases.md` gives each policy's bound and what the term
//! costs and buys.
//!
//! ```no_run
//! use floodgate::redis::{Leasing, RedisLimiter, RedisOptions};
//! use floodgate::{Config, PolicyKind, RateLimiter};
//! use std::time::Duration;
//!
//! let limiter = RedisLimiter::new(
//!     "redis://127.0.0.1:6379",
//!     PolicyKind::Gcra,
//!     Config::per(100, Duration::from_secs(1))?,
//!     RedisOptions::new().leasing(Some(Leasing::new(Duration::from_millis(500)))),
//! )?;
//! assert!(limiter.check("client-42").allowed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Keys
//!
//! One hash per client:
//!
//! ```text
//! {prefix}:{policy}:{limit}:{window}:{clock}:{<client>}
//! floodgate:gcra:100:1000000:server:{client-42}
//! replay:sliding-window:3:1000:1ms:{rahul}
//! ```
//!
//! - the policy and its configuration are part of the key, so a changed
//!   configuration starts from fresh state instead of misreading the old;
//! - `{clock}` is `server` (Redis `TIME`, microseconds) or the caller's tick
//!   (`1ms`, `10us`, `2ms`, …): times in different units never share state;
//! - the client is a hash tag: every key of one client (whatever the policy
//!   or configuration) maps to the same cluster slot. A client name that is
//!   empty or starts with `}` has an empty tag, and Redis then hashes the
//!   whole key; a name containing `}` is tagged by its part before it.
//!
//! With several rules, the rules' `{policy}:{limit}:{window}` are joined by
//! `+`, and each rule has its own key, its index after the tag (so all of a
//! client's keys share its slot):
//!
//! ```text
//! api:gcra:10:1000000+fixed-window:10000:86400000000:server:{client-42}:0
//! api:gcra:10:1000000+fixed-window:10000:86400000000:server:{client-42}:1
//! ```
//!
//! Field `o` of the hash is the client's origin (the `now` of its first
//! call): token-bucket drips and the window grids are measured from it, as
//! in memory. The other fields are the policy's state, in ticks since the
//! origin; `sliding-window` keeps its last `L` admissions in a ring of `L`
//! fields (never more).
//!
//! # Expiry: idle clients cost nothing
//!
//! Every write sets the key's TTL to the time until the state answers as an
//! empty one would (rounded up to whole milliseconds):
//!
//! | policy | TTL after a write at `now` (times since the origin) |
//! | --- | --- |
//! | `gcra`, `leaky-bucket` | `TAT − now` (then `max(TAT, now) = now`) |
//! | `sliding-window` | `newest admission + W − now` |
//! | `token-bucket` | `(d + L − t)·I − now`: the bucket is full again |
//! | `fixed-window` | `(i + 1)·W − now`: the window with admissions ends |
//! | `sliding-window-counter` | `(i + 2)·W − now`: no counted window weighs any more |
//!
//! For `gcra`, `leaky-bucket` and `sliding-window` an expired state is
//! exactly a new client's, so answers never change. The other three keep a
//! grid (drips, windows) anchored at the origin; a client whose key expired
//! comes back as a new client with its next call as its origin, so its drips
//! or windows restart from there. Until its key expires, every answer is the
//! in-memory engine's. A `remaining` call of a new client stores nothing for
//! the same reason (its state would be empty). [`RedisOptions::min_ttl`]
//! keeps every written state at least that long, which makes the grid
//! policies exact for clients that return within it.
//!
//! # Time
//!
//! [`TimeSource::Server`] (the default): a script without a `now` reads
//! Redis `TIME` in microseconds, so instances with skewed clocks agree; the
//! configuration's window is then in microseconds. [`TimeSource::Caller`]:
//! every call passes its `now` (the `*_at` methods; `check` uses the local
//! Unix time in ticks) in ticks of the given length, exactly as the
//! in-memory engine takes it; that tick converts TTLs to real time, which
//! assumes the caller's ticks advance no slower than real time (a trace
//! replayed faster than real time is exact; one replayed slower may see a
//! key expire early: use [`RedisOptions::min_ttl`]). Either way stored time
//! never moves backwards: an earlier `now` is judged at the latest time the
//! state reflects, as in memory.
//!
//! The scripts compute in Lua's doubles, exact below 2^53: `now` is refused
//! above [`MAX_NOW`] (2^52), the window above [`MAX_WINDOW`] (2^50), and
//! `L × W` above [`MAX_COUNTER_PRODUCT`] (2^52) for
//! `sliding-window-counter`; within those every value a script computes is
//! an exact integer.
//!
//! # Redis Cluster
//!
//! A URL `redis-cluster://HOST:PORT[,HOST:PORT…]` ([`CLUSTER_SCHEME`])
//! names some nodes of a Redis Cluster (one is enough; the client learns
//! the others and the slot map). Both limiters then use the `redis`
//! crate's cluster clients: the blocking one keeps a pool of cluster
//! connections, the async one shares the multiplexed cluster connection.
//! Every key of a client lives in one slot (the client is the hash tag,
//! above), so each decision is still one script call, on the node that
//! serves the client, and the answers are those of a single Redis. The
//! client follows `MOVED` and `ASK`, so slots can be moved while traffic
//! flows; `tracked_clients` and `clear_prefix` scan every primary.
//!
//! A cluster call is sent again up to [`CLUSTER_RETRIES`] times: after a
//! redirection, `TRYAGAIN` or `CLUSTERDOWN` the script did not run, so that
//! is safe; but the cluster client also resends after a connection that
//! broke or timed out mid-call, when the script may have run, so on a
//! cluster such a fault may count a request twice (the single-server
//! client never resends; see Faults). A node that is down fails the calls
//! of the clients it serves, by the fault rule, while the other nodes
//! serve theirs; when it returns the calls resume, without rebuilding the
//! limiter. The blocking limiter's timeout then applies to each attempt.
//!
//! # Faults
//!
//! The inherent `try_*` methods return [`RedisError`] when Redis cannot be
//! reached, fails, or does not answer within [`RedisOptions::timeout`]. The
//! [`RateLimiter`] methods cannot fail, so [`OnFailure`] decides for them:
//! [`FailClosed`](OnFailure::FailClosed) (the default: reject),
//! [`FailOpen`](OnFailure::FailOpen) (admit) or [`Local`](OnFailure::Local)
//! (decide with an in-memory limiter of the same policy in this process,
//! bounded by [`RedisOptions::local_bounds`]: by default idle clients are
//! evicted and at most [`DEFAULT_LOCAL_MAX_CLIENTS`] are tracked, newcomers
//! past that rejected).
//!
//! A call is sent at most once: an answer that did not arrive is an error,
//! never a resend, because the script may have run and counted the request.
//! Only `NOSCRIPT` (the script is not loaded, so it did not run; after a
//! restart or `SCRIPT FLUSH`) loads the script and sends the call again. A
//! broken or timed-out connection is dropped and replaced on a later call,
//! so traffic resumes by itself when Redis comes back.

mod aio;
mod batch;
mod blocking;
mod held;
mod lease;
mod options;
mod rejections;
mod script;
mod stats;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use aio::AsyncRedisLimiter;
pub use blocking::RedisLimiter;
pub use options::{
    Leasing, OnFailure, RedisOptions, TimeSource, DEFAULT_LEASE, DEFAULT_LEASE_TERM,
    DEFAULT_LEASE_UNITS, DEFAULT_LOCAL_BOUNDS, DEFAULT_LOCAL_MAX_CLIENTS,
};
pub use rejections::DEFAULT_REJECTION_CACHE;
pub use script::{MAX_COUNTER_PRODUCT, MAX_NOW, MAX_WINDOW};
pub use stats::{RedisStats, LATENCY_BUCKETS};

use crate::decision::NEVER;
use crate::{
    build_bounded, build_rules, Clock, Config, ConfigError, Decision, Engine, PolicyKind,
    RateLimiter, Rule, RuleSet, Tick,
};
use rejections::{Rejections, Stamp};

/// A Redis limiter that cannot be built as asked.
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisConfigError {
    /// The policy refuses the limit and window (as in memory).
    Config(ConfigError),
    /// The window is longer than the scripts compute exactly.
    WindowTooLong {
        /// The window, in ticks.
        window: u64,
        /// [`MAX_WINDOW`].
        max: u64,
    },
    /// `sliding-window-counter` with `L × W` past [`MAX_COUNTER_PRODUCT`].
    CounterTooLarge {
        /// The limit.
        limit: u64,
        /// The window, in ticks.
        window: u64,
    },
    /// A lease of `in-flight` holders under 1 ms or longer than the
    /// scripts compute exactly ([`MAX_WINDOW`] ticks).
    Lease(Duration),
    /// A leases' term ([`Leasing`]) under 1 ms or longer than the scripts
    /// compute exactly ([`MAX_WINDOW`] ticks), or a most of units out of
    /// 1 ..= 2^20 − 1.
    Leasing(Leasing),
    /// A caller tick shorter than 1 µs, or neither a whole number of
    /// milliseconds nor a divisor of one.
    Tick(Duration),
    /// A prefix containing `{` or `}`.
    Prefix(String),
    /// A timeout under 1 ms, or zero connections.
    Options(&'static str),
    /// The URL is not a Redis URL.
    Url(::redis::RedisError),
}

impl fmt::Display for RedisConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisConfigError::Config(error) => error.fmt(f),
            RedisConfigError::WindowTooLong { window, max } => write!(
                f,
                "window {window} is too long for the Redis store: at most {max} ticks"
            ),
            RedisConfigError::CounterTooLarge { limit, window } => write!(
                f,
                "limit {limit} times window {window} is too large for sliding-window-counter \
                 in Redis: the product must be at most {MAX_COUNTER_PRODUCT}"
            ),
            RedisConfigError::Lease(lease) => write!(
                f,
                "lease {lease:?} is invalid: it must be at least 1 ms and at most {MAX_WINDOW} \
                 ticks"
            ),
            RedisConfigError::Leasing(leasing) => write!(
                f,
                "leases of term {:?} and at most {} units are invalid: the term must be at \
                 least 1 ms and at most {MAX_WINDOW} ticks, the units 1 to {}",
                leasing.term(),
                leasing.get_max_units(),
                crate::lease::MAX_UNITS
            ),
            RedisConfigError::Tick(tick) => write!(
                f,
                "tick {tick:?} is invalid: it must be at least 1 µs and a whole number of \
                 milliseconds or a divisor of one millisecond"
            ),
            RedisConfigError::Prefix(prefix) => write!(
                f,
                "prefix {prefix:?} is invalid: it must not contain '{{' or '}}'"
            ),
            RedisConfigError::Options(what) => f.write_str(what),
            RedisConfigError::Url(error) => write!(f, "invalid Redis URL: {error}"),
        }
    }
}

impl std::error::Error for RedisConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RedisConfigError::Config(error) => Some(error),
            RedisConfigError::Url(error) => Some(error),
            _ => None,
        }
    }
}

impl From<ConfigError> for RedisConfigError {
    fn from(error: ConfigError) -> Self {
        RedisConfigError::Config(error)
    }
}

/// The URL scheme of a Redis Cluster: `redis-cluster://HOST:PORT[,HOST:PORT…]`
/// names some of its nodes (any will do; the client finds the others).
pub const CLUSTER_SCHEME: &str = "redis-cluster://";

/// How many times a cluster call is sent again after a redirection
/// (`MOVED`, `ASK`), a `TRYAGAIN` or `CLUSTERDOWN`, or a broken connection;
/// see the module's "Redis Cluster".
pub const CLUSTER_RETRIES: u32 = 3;

/// Where a limiter's state lives: one server, or a cluster.
#[derive(Clone, Debug)]
enum Target {
    /// `redis://…`
    Single(::redis::Client),
    /// `redis-cluster://…` (boxed: several times a single client's size).
    Cluster(Box<::redis::cluster::ClusterClient>),
}

impl Target {
    /// Reads `url`: a cluster's for [`CLUSTER_SCHEME`], one server's
    /// otherwise. Connects to nothing.
    fn open(url: &str, timeout: Duration) -> Result<Self, RedisConfigError> {
        let Some(nodes) = url.strip_prefix(CLUSTER_SCHEME) else {
            return ::redis::Client::open(url)
                .map(Target::Single)
                .map_err(RedisConfigError::Url);
        };
        let nodes: Vec<String> = nodes
            .split(',')
            .map(str::trim)
            .filter(|node| !node.is_empty())
            .map(|node| format!("redis://{node}"))
            .collect();
        if nodes.is_empty() {
            return Err(RedisConfigError::Url(::redis::RedisError::from((
                ::redis::ErrorKind::InvalidClientConfig,
                "a redis-cluster:// URL names no node (redis-cluster://HOST:PORT[,HOST:PORT…])",
            ))));
        }
        ::redis::cluster::ClusterClient::builder(nodes)
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(CLUSTER_RETRIES)
            .min_retry_wait(2)
            .max_retry_wait(timeout.as_millis().try_into().unwrap_or(u64::MAX).max(2))
            .build()
            .map(|client| Target::Cluster(Box::new(client)))
            .map_err(RedisConfigError::Url)
    }
}

/// The primaries of a cluster, as `CLUSTER SLOTS` lists them: each slot
/// range's first node.
fn cluster_primaries(slots: &::redis::Value) -> Vec<(String, u16)> {
    use ::redis::Value;
    let mut primaries = Vec::new();
    let Value::Array(ranges) = slots else {
        return primaries;
    };
    for range in ranges {
        let Value::Array(fields) = range else {
            continue;
        };
        let Some(Value::Array(node)) = fields.get(2) else {
            continue;
        };
        let host = match node.first() {
            Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
            Some(Value::SimpleString(host)) => host.clone(),
            _ => continue,
        };
        let Some(Value::Int(port)) = node.get(1) else {
            continue;
        };
        if let Ok(port) = u16::try_from(*port)
            && !primaries.contains(&(host.clone(), port))
        {
            primaries.push((host, port));
        }
    }
    primaries
}

/// Why one call got no answer from Redis.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum RedisError {
    /// Redis could not be reached, or the connection broke during the call.
    /// A request whose connection broke after it was sent may have been
    /// counted.
    Unavailable(::redis::RedisError),
    /// No answer within [`RedisOptions::timeout`]. The request may have
    /// been counted; it is not sent again.
    Timeout,
    /// Redis answered with an error: the key holds another type, the server
    /// is out of memory or read-only, a script failed.
    Server(::redis::RedisError),
    /// A reply that is not what the scripts return.
    Reply(String),
    /// A `now` past what the scripts compute exactly.
    TimeOutOfRange {
        /// The time given, in ticks.
        now: u64,
        /// [`MAX_NOW`].
        max: u64,
    },
}

impl RedisError {
    /// Sorts an error of the client library.
    fn from_client(error: ::redis::RedisError) -> Self {
        if error.is_timeout() {
            RedisError::Timeout
        } else if matches!(error.kind(), ::redis::ErrorKind::Server(_)) {
            RedisError::Server(error)
        } else if error.kind() == ::redis::ErrorKind::UnexpectedReturnType {
            RedisError::Reply(error.to_string())
        } else {
            RedisError::Unavailable(error)
        }
    }
}

impl fmt::Display for RedisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisError::Unavailable(error) => write!(f, "Redis is unavailable: {error}"),
            RedisError::Timeout => f.write_str("Redis did not answer within the timeout"),
            RedisError::Server(error) => write!(f, "Redis answered with an error: {error}"),
            RedisError::Reply(what) => write!(f, "unexpected reply from Redis: {what}"),
            RedisError::TimeOutOfRange { now, max } => {
                write!(f, "time {now} is out of range: at most {max} ticks")
            }
        }
    }
}

impl std::error::Error for RedisError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RedisError::Unavailable(error) | RedisError::Server(error) => Some(error),
            _ => None,
        }
    }
}

/// The Unix time in ticks of `tick_ns` nanoseconds: the local clock of a
/// Redis limiter (what `now()` answers, and the time `check` passes with
/// caller-supplied times). A clock set before 1970 reads 0.
#[derive(Clone, Copy, Debug)]
struct UnixClock {
    tick_ns: u128,
}

impl Clock for UnixClock {
    fn now(&self) -> u64 {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        u64::try_from(nanos / self.tick_ns).unwrap_or(u64::MAX)
    }

    fn tick(&self) -> Tick {
        // `Core::new` checked that the tick is a whole number of
        // microseconds that fits a u64 of nanoseconds.
        Tick::from_duration(Duration::from_nanos(
            u64::try_from(self.tick_ns).unwrap_or(u64::MAX),
        ))
        .unwrap_or(Tick::NANOSECOND)
    }
}

/// Everything the blocking and the async limiter share: the validated
/// configuration, the key layout, the script and the fault rule.
struct Core {
    /// The strictest rule's policy and configuration (for one rule, the
    /// rule's): what `policy` and `config` answer.
    policy: PolicyKind,
    config: Config,
    /// Every rule, in ticks, in order.
    rules: RuleSet,
    /// `{prefix}:{policy}:{limit}:{window}:{clock}:{` (each rule's three
    /// joined by `+` for several); a client's key is this, the client, and
    /// `}`, then each rule's `:0`, `:1`, … for several.
    key_head: String,
    /// The rules' script, with this limiter's constants in it.
    script: script::RuleScript,
    time: TimeSource,
    clock: UnixClock,
    timeout: Duration,
    on_failure: OnFailure,
    /// The in-memory limiter of [`OnFailure::Local`].
    local: Option<Arc<dyn RateLimiter<str>>>,
    /// How many trait calls the fault rule answered. Relaxed: a statistic,
    /// publishing nothing.
    faults: AtomicU64,
    /// The local rejection cache, unless turned off.
    rejections: Option<Rejections>,
    /// The round trips to Redis, counted and timed.
    round_trips: stats::RoundTrips,
    /// Every decision answered, Redis's, the cache's or the fault rule's:
    /// beside a round trip, an add costs nothing, so it is always kept.
    decisions: Box<crate::stats::Counters>,
    /// With `in-flight` rules: this process's holders ([`held`]).
    holdings: Option<held::Holdings>,
    /// With `in-flight` rules and a lease: how often the holders' leases
    /// are renewed (a third of the lease).
    renew_every: Option<Duration>,
    /// A leasing limiter's leases ([`RedisOptions::leasing`], unless its
    /// rules do not lease).
    leases: Option<lease::Leases>,
}

/// What a call that reaches Redis needs to remember its rejection: when it
/// was sent, and the cache's generation then.
#[derive(Clone, Copy, Debug)]
struct Ticket {
    stamp: Stamp,
    generation: u64,
}

impl Core {
    /// One rule.
    #[cfg(test)]
    fn new(
        policy: PolicyKind,
        config: Config,
        options: &RedisOptions,
    ) -> Result<Self, RedisConfigError> {
        Self::with_rules(&[(policy, config)], options)
    }

    /// Every rule of `rules`, each `(policy, config)` as the caller gave it
    /// (at least one, at most [`MAX_RULES`](crate::MAX_RULES)).
    /// [`with_rules`](Self::with_rules) for a [`RuleSet`](crate::RuleSet).
    fn with_rule_set(
        rules: &crate::RuleSet,
        options: &RedisOptions,
    ) -> Result<Self, RedisConfigError> {
        let rules: Vec<_> = rules
            .iter()
            .map(|rule| (rule.policy(), rule.config()))
            .collect();
        Self::with_rules(&rules, options)
    }

    fn with_rules(
        rules: &[(PolicyKind, Config)],
        options: &RedisOptions,
    ) -> Result<Self, RedisConfigError> {
        // A window given as a duration is turned into the clock's ticks:
        // microseconds with the server's clock, the caller's tick otherwise.
        let tick = match options.time {
            TimeSource::Server => Tick::MICROSECOND,
            TimeSource::Caller { tick } => {
                Tick::from_duration(tick).ok_or(RedisConfigError::Tick(tick))?
            }
        };
        let mut resolved = Vec::with_capacity(rules.len());
        for &(policy, config) in rules {
            let config = config.resolve(policy, tick)?;
            if config.window() > MAX_WINDOW {
                return Err(RedisConfigError::WindowTooLong {
                    window: config.window(),
                    max: MAX_WINDOW,
                });
            }
            if policy == PolicyKind::SlidingWindowCounter
                && u128::from(config.limit()) * u128::from(config.window())
                    > u128::from(MAX_COUNTER_PRODUCT)
            {
                return Err(RedisConfigError::CounterTooLarge {
                    limit: config.limit(),
                    window: config.window(),
                });
            }
            resolved.push((policy, config));
        }
        let rule_set = RuleSet::new(
            resolved
                .iter()
                .map(|&(policy, config)| Rule::from_parts(policy, config)),
        )?;
        let strictest = rule_set.strictest();
        let (policy, config) = (strictest.policy(), strictest.config());
        const MS: u128 = 1_000_000;
        let tick_ns = options.time.tick_ns();
        let clock_name = match options.time {
            TimeSource::Server => "server".to_owned(),
            TimeSource::Caller { tick } => {
                let valid = tick_ns >= 1_000
                    && (tick_ns.is_multiple_of(MS) || MS.is_multiple_of(tick_ns))
                    && u64::try_from(tick_ns).is_ok();
                if !valid {
                    return Err(RedisConfigError::Tick(tick));
                }
                if tick_ns.is_multiple_of(MS) {
                    format!("{}ms", tick_ns / MS)
                } else {
                    format!("{}us", tick_ns / 1_000)
                }
            }
        };
        if options.prefix.contains(['{', '}']) {
            return Err(RedisConfigError::Prefix(options.prefix.clone()));
        }
        if options.timeout < Duration::from_millis(1) {
            return Err(RedisConfigError::Options(
                "the timeout must be at least 1 ms",
            ));
        }
        if options.connections == 0 {
            return Err(RedisConfigError::Options(
                "the limiter needs at least 1 connection",
            ));
        }
        let clock = UnixClock { tick_ns };
        let local = match (options.on_failure, rules) {
            (OnFailure::Local, &[(policy, config)]) => Some(build_bounded::<str, _>(
                policy,
                config,
                Engine::LockFree,
                clock,
                options.local_bounds,
            )?),
            (OnFailure::Local, _) => Some(build_rules::<str, _>(
                &RuleSet::new(
                    rules
                        .iter()
                        .map(|&(policy, config)| Rule::from_parts(policy, config)),
                )?,
                Engine::LockFree,
                clock,
                options.local_bounds,
            )?),
            _ => None,
        };
        let min_ttl_ms = u64::try_from(options.min_ttl.as_millis()).unwrap_or(u64::MAX);
        // The lease in ticks (0: none), checked whether or not a rule
        // holds, so that a bad option is an error wherever it is given.
        let lease = match options.lease {
            None => 0,
            Some(lease) => u64::try_from(lease.as_nanos() / tick_ns)
                .ok()
                .filter(|&ticks| {
                    lease >= Duration::from_millis(1) && (1..=MAX_WINDOW).contains(&ticks)
                })
                .ok_or(RedisConfigError::Lease(lease))?,
        };
        let holds = resolved
            .iter()
            .any(|&(policy, _)| policy == PolicyKind::InFlight);
        // The leases' term in ticks, checked whether or not the rules
        // lease, so that a bad option is an error wherever it is given.
        let term = match options.leasing {
            None => 0,
            Some(leasing) => u64::try_from(leasing.term().as_nanos() / tick_ns)
                .ok()
                .filter(|&ticks| {
                    leasing.term() >= Duration::from_millis(1)
                        && (1..=MAX_WINDOW).contains(&ticks)
                        && (1..=crate::lease::MAX_UNITS).contains(&leasing.get_max_units())
                })
                .ok_or(RedisConfigError::Leasing(leasing))?,
        };
        // `in-flight` units are held per request, a shaper's delays are per
        // request: such rule sets ask Redis for every decision.
        let leases = options.leasing.filter(|_| {
            !resolved.iter().any(|&(policy, _)| {
                matches!(policy, PolicyKind::InFlight | PolicyKind::LeakyBucket)
            })
        });
        let term = if leases.is_some() { term } else { 0 };
        // A leasing limiter's `sliding-window` admissions enter the log
        // `term` later: its keys are its own, so that a limiter that does
        // not lease never reads those times as its own.
        let lease_mark = if term > 0
            && resolved
                .iter()
                .any(|&(policy, _)| policy == PolicyKind::SlidingWindow)
        {
            format!(":lease{term}")
        } else {
            String::new()
        };
        let rule_names: Vec<String> = resolved
            .iter()
            .map(|(policy, config)| {
                format!("{}:{}:{}", policy.name(), config.limit(), config.window())
            })
            .collect();
        Ok(Self {
            policy,
            config,
            rules: rule_set,
            key_head: format!(
                "{}:{}:{clock_name}{lease_mark}:{{",
                options.prefix,
                rule_names.join("+")
            ),
            script: script::script(
                &resolved,
                u64::try_from(tick_ns).expect("checked above"),
                min_ttl_ms,
                lease,
                term,
            ),
            leases: leases.map(|leasing| {
                let least_limit = resolved
                    .iter()
                    .map(|(_, config)| config.limit())
                    .min()
                    .unwrap_or(1);
                let script_tick_ns = u64::try_from(tick_ns).expect("checked above");
                lease::Leases::new(
                    leasing.term(),
                    match options.time {
                        TimeSource::Server => None,
                        TimeSource::Caller { .. } => Some(script_tick_ns),
                    },
                    script_tick_ns,
                    leasing.get_max_units().min(least_limit),
                    options.local_bounds,
                )
            }),
            holdings: holds.then(held::Holdings::new),
            renew_every: options.lease.filter(|_| holds).map(|lease| lease / 3),
            time: options.time,
            clock,
            timeout: options.timeout,
            on_failure: options.on_failure,
            local,
            faults: AtomicU64::new(0),
            round_trips: stats::RoundTrips::default(),
            decisions: crate::stats::Counters::new(),
            rejections: (options.rejection_cache > 0).then(|| {
                Rejections::new(
                    options.rejection_cache,
                    u64::try_from(tick_ns).expect("checked above"),
                )
            }),
        })
    }

    /// The rejection cache's answer to a request of cost `cost` of `client`
    /// at `now` (`None`: now on Redis's clock), or the ticket with which
    /// Redis's answer is remembered. Costs of 0 and above the limit are
    /// never cached (their answers are not rejections that end).
    fn cached(
        &self,
        client: &str,
        cost: u64,
        now: Option<u64>,
    ) -> Result<Decision, Option<Ticket>> {
        let Some(cache) = &self.rejections else {
            return Err(None);
        };
        if cost == 0 || cost > self.config.limit() {
            return Err(None);
        }
        // The stamp is taken before the call is sent (a later send only
        // makes the remembered deadline earlier than Redis's).
        let ticket = Ticket {
            stamp: cache.stamp(now),
            generation: cache.generation(),
        };
        match cache.lookup(client, cost, ticket.stamp) {
            Some(decision) => Ok(decision.in_ticks(self.tick())),
            None => Err(Some(ticket)),
        }
    }

    /// Remembers Redis's `decision` for a request of cost `cost` of
    /// `client`, if it is a rejection that ends.
    fn remember(&self, client: &str, cost: u64, ticket: Option<Ticket>, decision: &Decision) {
        if let (Some(cache), Some(ticket)) = (&self.rejections, ticket) {
            // A refusal no wait ends (an `in-flight` rule's) is not one the
            // cache can answer until a time: only a release ends it.
            if !decision.allowed && decision.retry_after != NEVER {
                cache.insert(client, cost, ticket.stamp, ticket.generation, decision);
            }
        }
    }

    /// After Redis deleted `client`'s state (or every client's, for
    /// `None`): no rejection remembered from before is used again.
    fn invalidate(&self, client: Option<&str>) {
        if let Some(cache) = &self.rejections {
            cache.invalidate(client);
        }
    }

    /// Counts `decision`, of a request of `cost`, and answers it.
    fn counted(&self, decision: Decision, cost: u64) -> Decision {
        if let Some(leases) = &self.leases {
            leases.counts.elsewhere.fetch_add(1, Ordering::Relaxed);
        }
        self.decisions.decided(&decision, cost, 0);
        decision
    }

    /// [`counted`](Self::counted) for a decision answered from a lease:
    /// on the striped counters alone (`lease::LeaseCounts::elsewhere`).
    fn counted_from_lease(&self, decision: Decision, cost: u64) -> Decision {
        self.decisions.decided(&decision, cost, 0);
        decision
    }

    /// The decisions answered ([`Stats`](crate::Stats): the store's own
    /// counts, clients and sweeps, are Redis's and stay 0 here).
    fn stats(&self) -> crate::Stats {
        let mut stats = crate::Stats::default();
        self.decisions.fill(&mut stats);
        stats
    }

    /// What the store did ([`RedisStats`]).
    fn redis_stats(&self) -> RedisStats {
        let mut stats = self
            .round_trips
            .snapshot(self.faults.load(Ordering::Relaxed), self.answered_locally());
        if let Some(leases) = &self.leases {
            let counts = &leases.counts;
            let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
            stats.leases = read(&counts.taken);
            stats.leases_ahead = read(&counts.ahead);
            stats.units_leased = read(&counts.units);
            let mut decided = crate::Stats::default();
            self.decisions.fill(&mut decided);
            stats.answered_from_leases = decided.decided().saturating_sub(read(&counts.elsewhere));
            stats.units_given_back = read(&counts.given_back);
            stats.units_lapsed = read(&counts.lapsed);
            stats.units_returned = read(&counts.returned);
        }
        stats
    }

    /// The leases, for a request of cost `cost`: a cost of 0 or above the
    /// limit is answered from `remaining`, never from a lease.
    fn leasing(&self, cost: u64) -> Option<&lease::Leases> {
        self.leases
            .as_ref()
            .filter(|_| cost >= 1 && cost <= self.config.limit())
    }

    /// Now on the time line the leases are measured on, for a call at
    /// `now` (`None`: the local Unix time in ticks); see `lease::Leases`.
    fn local_now(&self, now: Option<u64>) -> u64 {
        match &self.leases {
            Some(leases) => leases.now(|| now.unwrap_or_else(|| self.clock.now())),
            None => now.unwrap_or_else(|| self.clock.now()),
        }
    }

    /// Redis's `remaining` for `key` at `now` (`None`: the local clock's),
    /// with the units this instance holds on lease added: both are
    /// requests this instance would admit.
    fn with_held(&self, key: &str, now: Option<u64>, remaining: u64) -> u64 {
        match &self.leases {
            Some(leases) => remaining.saturating_add(leases.held(key, self.local_now(now))),
            None => remaining,
        }
    }

    /// The decision a lease's `reply` carries for the request of cost
    /// `taken` (0 for a lease taken ahead) asked at `asked` on the local
    /// time line; what it granted beyond `taken` stays here.
    fn leased(
        &self,
        key: &str,
        asked: u64,
        taken: u64,
        reply: &script::LeaseReply,
    ) -> Result<(Decision, Option<lease::GiveBack>), RedisError> {
        let decision = self.decision(reply.reply)?;
        Ok(match &self.leases {
            Some(leases) => leases.landed(key, asked, taken, reply, decision),
            None => (decision, None),
        })
    }

    /// How many decisions the rejection cache answered.
    fn answered_locally(&self) -> u64 {
        self.rejections.as_ref().map_or(0, Rejections::hits)
    }

    /// How many clients the rejection cache remembers.
    fn cached_rejections(&self) -> usize {
        self.rejections.as_ref().map_or(0, Rejections::len)
    }

    /// The key of `client`'s state: for several rules, the stem that each
    /// rule's key extends ([`keys`](Self::keys)), which is what a script
    /// call is given.
    fn key(&self, client: &str) -> String {
        let mut key = String::with_capacity(self.key_head.len() + client.len() + 1);
        key.push_str(&self.key_head);
        key.push_str(client);
        key.push('}');
        key
    }

    /// Every key of `client`'s state, one per rule in order.
    fn keys(&self, client: &str) -> Vec<String> {
        let key = self.key(client);
        if self.rules.len() == 1 {
            return vec![key];
        }
        (0..self.rules.len())
            .map(|rule| script::rule_key(&key, rule))
            .collect()
    }

    /// The key that holds `client`'s state, for one rule; the first rule's
    /// for several.
    fn first_key(&self, client: &str) -> String {
        self.keys(client).swap_remove(0)
    }

    /// The `SCAN` pattern of every key of this limiter: the head with the
    /// glob's special characters escaped, then `*}` (and `:*` for the
    /// rules' suffixes when there are several).
    fn pattern(&self) -> String {
        let rules = if self.rules.len() == 1 { "" } else { ":*" };
        glob_escape(&self.key_head) + "*}" + rules
    }

    /// How many clients own `keys` (matches of [`pattern`](Self::pattern)):
    /// with several rules a client has up to one key per rule, each
    /// expiring on its own, so keys are counted by their stem.
    fn clients_of(&self, keys: &[String]) -> usize {
        if self.rules.len() == 1 {
            return keys.len();
        }
        keys.iter()
            .map(|key| key.rsplit_once(':').map_or(key.as_str(), |(stem, _)| stem))
            .collect::<std::collections::HashSet<_>>()
            .len()
    }

    /// The rules, in this limiter's ticks.
    fn rules(&self) -> RuleSet {
        self.rules.clone()
    }

    /// Each rule's own answer to a request of cost `cost` that was decided
    /// `decided`, from the reply to [`script::answers`], as the in-memory
    /// engine gives them ([`RuledDecision::each`](crate::RuledDecision::each)).
    fn answers(
        &self,
        reply: &[i64],
        cost: u64,
        decided: &Decision,
    ) -> Result<crate::RuleAnswers, RedisError> {
        if reply.len() != 4 * self.rules.len() {
            return Err(RedisError::Reply(format!(
                "{} fields for the answers of {} rules",
                reply.len(),
                self.rules.len()
            )));
        }
        let field = |value: i64| {
            u64::try_from(value)
                .map_err(|_| RedisError::Reply(format!("negative field in {reply:?}")))
        };
        let mut answers = crate::RuleAnswers::default();
        for (rule, own) in self.rules.iter().zip(reply.chunks_exact(4)) {
            let remaining = field(own[0])?;
            let decision = if cost == 0 {
                Decision::admit(remaining)
            } else if cost > rule.config().limit() {
                Decision::reject(remaining, NEVER)
            } else if decided.allowed {
                Decision::admit(remaining)
            } else if own[1] == 1 {
                Decision {
                    delay: field(own[3])?,
                    ..Decision::admit(remaining)
                }
            } else {
                let wait = script::wait(own[2])
                    .ok_or_else(|| RedisError::Reply(format!("negative wait in {reply:?}")))?;
                Decision::reject(remaining, wait)
            };
            answers.push(crate::RuleAnswer {
                rule: *rule,
                decision: decision.in_ticks(self.tick()),
            });
        }
        Ok(answers)
    }

    /// `now` for a call that passes none: `None` (the script reads `TIME`)
    /// on the server's clock, the local Unix time in ticks otherwise.
    fn implicit_now(&self) -> Option<u64> {
        match self.time {
            TimeSource::Server => None,
            TimeSource::Caller { .. } => Some(self.clock.now()),
        }
    }

    /// The fault rule's decision for a check of `key` at `now` (the local
    /// clock's time when the call had none).
    fn check_on_failure(&self, key: &str, now: Option<u64>) -> Decision {
        let decision = self.fail(key, now);
        self.held_on_failure(key, &decision, 1);
        decision
    }

    /// The fault rule's decision for one request, without recording what
    /// it holds.
    fn fail(&self, key: &str, now: Option<u64>) -> Decision {
        self.faults.fetch_add(1, Ordering::Relaxed);
        match (self.on_failure, &self.local) {
            (OnFailure::Local, Some(local)) => {
                local.check_at(key, now.unwrap_or_else(|| self.clock.now()))
            }
            (OnFailure::FailOpen, _) => Decision::admit(self.config.limit()).in_ticks(self.tick()),
            _ => Decision::reject(0, self.timeout_ticks()).in_ticks(self.tick()),
        }
    }

    /// Records what a fault rule's admission of `cost` holds: units held by
    /// the in-memory fallback, or none (failing open), so that its release
    /// takes back nothing of another admission's.
    fn held_on_failure(&self, key: &str, decision: &Decision, cost: u64) {
        if let (Some(holdings), true) = (&self.holdings, decision.allowed && cost > 0) {
            let held = match self.on_failure {
                OnFailure::Local => held::Held::Local(cost),
                _ => held::Held::Unheld(cost),
            };
            holdings.add(key, held);
        }
    }

    /// What a release of `cost` units of `key` at `now` takes from this
    /// process's holdings, the in-memory fallback's part released: the
    /// plan for the script and the units released already. `None` without
    /// an `in-flight` rule (nothing is ever held).
    fn plan_release(&self, key: &str, now: Option<u64>, cost: u64) -> Option<(held::Plan, u64)> {
        let plan = self.holdings.as_ref()?.take(key, cost);
        let mut released = plan.unheld;
        if let (Some(local), true) = (&self.local, plan.local > 0) {
            let now = now.unwrap_or_else(|| self.clock.now());
            released += local.release_at(key, now, plan.local);
        }
        Some((plan, released))
    }

    /// The script call of a release `plan` of `cost` units of `key` at
    /// `now` (from [`script::encode_now`]), if it has a Redis part.
    fn release_call<'s>(
        &'s self,
        key: &str,
        now: &str,
        cost: u64,
        plan: &held::Plan,
    ) -> Option<::redis::ScriptInvocation<'s>> {
        let wanted = if plan.by_key { cost } else { plan.redis };
        (wanted > 0)
            .then(|| script::release(&self.script, &self.key(key), now, wanted, &plan.holders))
    }

    /// After a release of `key` was answered (`result`): counted, the
    /// client's cached refusal dropped; on a failure the Redis holders go
    /// back to the holdings (still held there).
    fn released(
        &self,
        key: &str,
        plan: held::Plan,
        local: u64,
        result: Result<u64, RedisError>,
    ) -> Result<u64, RedisError> {
        match result {
            Ok(redis) => {
                self.invalidate(Some(key));
                self.decisions.released(local + redis);
                Ok(local + redis)
            }
            Err(error) => {
                if let Some(holdings) = &self.holdings {
                    holdings.restore(key, plan);
                }
                Err(error)
            }
        }
    }

    /// Every client with holders of this process in Redis, and the
    /// renewal call of each at `now` (from [`script::encode_now`]).
    fn renewals<'s>(&'s self, now: &str) -> Vec<::redis::ScriptInvocation<'s>> {
        let Some(holdings) = &self.holdings else {
            return Vec::new();
        };
        holdings
            .in_redis()
            .into_iter()
            .map(|(client, holders)| script::renew(&self.script, &self.key(&client), now, &holders))
            .collect()
    }

    /// Drops this process's holdings of `key`, whose state was deleted:
    /// its `in-flight` holders, and its leases (their units lapse).
    fn forget_holdings(&self, key: &str) {
        if let Some(holdings) = &self.holdings {
            holdings.forget(key);
        }
        if let Some(leases) = &self.leases {
            leases.forget(key);
        }
    }

    /// The operation of a check of cost `cost` ([`weighed`](Self::weighed)),
    /// with a new holder id when the limiter holds and the check may admit.
    fn holding(&self, cost: u64) -> (script::Op, Option<u64>) {
        match (self.weighed(cost), &self.holdings) {
            (script::Op::CheckN(cost), Some(holdings)) => {
                let id = holdings.next_id();
                (script::Op::Hold { cost, id }, Some(id))
            }
            (op, _) => (op, None),
        }
    }

    /// Records the holder `id` of an admission of `cost` of `key`, if the
    /// script admitted it.
    fn held(&self, key: &str, id: Option<u64>, cost: u64, decision: &Decision) {
        if let (Some(holdings), Some(id), true) = (&self.holdings, id, decision.allowed) {
            holdings.add(key, held::Held::Redis { units: cost, id });
        }
    }

    /// The ticks every decision of this limiter is in.
    fn tick(&self) -> Tick {
        self.clock.tick()
    }

    /// A script's reply as a decision in this limiter's ticks.
    fn decision(&self, reply: script::Reply) -> Result<Decision, RedisError> {
        script::decision(reply).map(|decision| decision.in_ticks(self.tick()))
    }

    /// The script operation for a request of cost `cost`: a cost of 0 or
    /// above the limit is answered from `remaining` (one call still), so
    /// the scripts only ever compute with `1 <= cost <= L < 2^53`.
    fn weighed(&self, cost: u64) -> script::Op {
        if cost == 0 || cost > self.config.limit() {
            script::Op::Remaining
        } else {
            script::Op::CheckN(cost)
        }
    }

    /// The decision for a request of cost `cost` from the reply to
    /// [`weighed`](Self::weighed)'s operation (the contract's "Weighted
    /// requests" for a cost of 0 and for one above the limit).
    fn weighed_decision(&self, reply: script::Reply, cost: u64) -> Result<Decision, RedisError> {
        let decision = self.decision(reply)?;
        Ok(if cost == 0 {
            Decision::admit(decision.remaining).in_ticks(self.tick())
        } else if cost > self.config.limit() {
            self.never(decision.remaining, cost)
        } else {
            decision
        })
    }

    /// The rejection of a cost above the strictest limit: never admitted,
    /// refused by the first rule whose limit it exceeds.
    fn never(&self, remaining: u64, cost: u64) -> Decision {
        let by = self
            .rules
            .iter()
            .position(|rule| cost > rule.config().limit())
            .unwrap_or(0);
        Decision::reject(remaining, NEVER)
            .by_rule(by)
            .in_ticks(self.tick())
    }

    /// The fault rule's decision for a request of cost `cost`.
    fn check_n_on_failure(&self, key: &str, now: Option<u64>, cost: u64) -> Decision {
        match (self.on_failure, &self.local) {
            (OnFailure::Local, Some(local)) => {
                self.faults.fetch_add(1, Ordering::Relaxed);
                let decision = local.check_n_at(key, now.unwrap_or_else(|| self.clock.now()), cost);
                self.held_on_failure(key, &decision, cost);
                decision
            }
            _ if cost > self.config.limit() => {
                self.faults.fetch_add(1, Ordering::Relaxed);
                self.never(0, cost)
            }
            _ => {
                let decision = self.fail(key, now);
                self.held_on_failure(key, &decision, cost);
                decision
            }
        }
    }

    /// The fault rule's answer to `remaining`.
    fn remaining_on_failure(&self, key: &str, now: Option<u64>) -> u64 {
        self.faults.fetch_add(1, Ordering::Relaxed);
        match (self.on_failure, &self.local) {
            (OnFailure::Local, Some(local)) => {
                local.remaining_at(key, now.unwrap_or_else(|| self.clock.now()))
            }
            (OnFailure::FailOpen, _) => self.config.limit(),
            _ => 0,
        }
    }

    /// The timeout in ticks, at least 1: a rejected request's `retry_after`
    /// when failing closed (by then a new connection may have been made).
    fn timeout_ticks(&self) -> u64 {
        u64::try_from(self.timeout.as_nanos() / self.clock.tick_ns)
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("policy", &self.policy)
            .field("config", &self.config)
            .field("keys", &format_args!("{}…}}", self.key_head))
            .field("time", &self.time)
            .field("timeout", &self.timeout)
            .field("on_failure", &self.on_failure)
            .finish_non_exhaustive()
    }
}

/// `text` with the characters Redis's glob gives a meaning escaped.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len() + 4);
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// The `SCAN` pattern of every key under `prefix`, any policy.
fn prefix_pattern(prefix: &str) -> String {
    glob_escape(prefix) + ":*"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Bounds, Overflow};

    fn core(
        policy: PolicyKind,
        limit: u64,
        window: u64,
        options: &RedisOptions,
    ) -> Result<Core, RedisConfigError> {
        Core::new(policy, Config::per_ticks(limit, window)?, options)
    }

    /// Leases: a term under 1 ms, a most of 0 units or past a slot's are
    /// refused, naming both bounds; rule sets with a shaper or an
    /// `in-flight` rule do not lease; a leasing `sliding-window` has keys
    /// of its own, the other policies share theirs with limiters that do
    /// not lease.
    #[test]
    fn leases_are_checked_and_only_the_rules_that_lease_lease() {
        let leasing = |term: Duration, units: u64| {
            RedisOptions::new().leasing(Some(Leasing::new(term).max_units(units)))
        };
        for (term, units) in [
            (Duration::from_micros(999), 10),
            (Duration::from_secs(1), 0),
            (Duration::from_secs(1), crate::lease::MAX_UNITS + 1),
        ] {
            let error =
                core(PolicyKind::Gcra, 10, 1_000_000, &leasing(term, units)).expect_err("refused");
            assert!(matches!(error, RedisConfigError::Leasing(_)), "{error}");
            assert!(
                error.to_string().contains("at least 1 ms")
                    && error.to_string().contains("1048575"),
                "{error}"
            );
        }
        let options = leasing(Duration::from_millis(5), 100);
        for policy in [PolicyKind::LeakyBucket, PolicyKind::InFlight] {
            let window = if policy == PolicyKind::InFlight {
                1
            } else {
                1_000_000
            };
            assert!(core(policy, 10, window, &options).unwrap().leases.is_none());
        }
        let gcra = core(PolicyKind::Gcra, 10, 1_000_000, &options).unwrap();
        assert!(gcra.leases.is_some());
        assert_eq!(gcra.key("a"), "floodgate:gcra:10:1000000:server:{a}");
        let log = core(PolicyKind::SlidingWindow, 10, 1_000_000, &options).unwrap();
        assert_eq!(
            log.key("a"),
            "floodgate:sliding-window:10:1000000:server:lease5000:{a}"
        );
    }

    #[test]
    fn keys_name_the_policy_configuration_clock_and_tag_the_client() {
        let options = RedisOptions::new().prefix("api").time(TimeSource::MILLIS);
        let gcra = core(PolicyKind::Gcra, 100, 1_000, &options).unwrap();
        assert_eq!(gcra.key("client-42"), "api:gcra:100:1000:1ms:{client-42}");
        let server = core(
            PolicyKind::SlidingWindow,
            3,
            1_000_000,
            &RedisOptions::new(),
        )
        .unwrap();
        assert_eq!(
            server.key("a"),
            "floodgate:sliding-window:3:1000000:server:{a}"
        );
        let micros = RedisOptions::new().time(TimeSource::Caller {
            tick: Duration::from_micros(10),
        });
        let fixed = core(PolicyKind::FixedWindow, 1, 5, &micros).unwrap();
        assert_eq!(fixed.key("x"), "floodgate:fixed-window:1:5:10us:{x}");
        let glob = core(PolicyKind::Gcra, 1, 1, &RedisOptions::new().prefix("a*b")).unwrap();
        assert_eq!(glob.pattern(), "a\\*b:gcra:1:1:server:{*}");
        assert_eq!(prefix_pattern("r[1]"), "r\\[1\\]:*");
    }

    #[test]
    fn several_rules_key_each_rule_under_the_clients_tag() {
        let options = RedisOptions::new().prefix("api").time(TimeSource::MILLIS);
        let rules = [
            (PolicyKind::Gcra, Config::per_ticks(10, 1_000).unwrap()),
            (
                PolicyKind::FixedWindow,
                Config::per_ticks(5, 60_000).unwrap(),
            ),
        ];
        let core = Core::with_rules(&rules, &options).unwrap();
        let head = "api:gcra:10:1000+fixed-window:5:60000:1ms:";
        assert_eq!(
            core.keys("c"),
            [format!("{head}{{c}}:0"), format!("{head}{{c}}:1")]
        );
        assert_eq!(core.first_key("c"), format!("{head}{{c}}:0"));
        assert_eq!(core.pattern(), format!("{head}{{*}}:*"));
        let keys = [
            format!("{head}{{c}}:0"),
            format!("{head}{{c}}:1"),
            format!("{head}{{d:e}}:1"),
        ];
        assert_eq!(core.clients_of(&keys), 2);
        // The strictest rule answers `policy` and `config`.
        assert_eq!(
            (core.policy, core.config.limit()),
            (PolicyKind::FixedWindow, 5)
        );
        assert_eq!(core.rules().len(), 2);
        // A cost past a limit is refused by the first rule it exceeds.
        assert_eq!(core.never(0, 6).refused_by(), Some(1));
        assert_eq!(core.never(0, 11).refused_by(), Some(0));
        assert_eq!(
            core.check_n_on_failure("c", Some(0), 6).refused_by(),
            Some(1)
        );
        // The local fallback applies every rule.
        let local =
            Core::with_rules(&rules, &options.clone().on_failure(OnFailure::Local)).unwrap();
        assert_eq!(local.local.as_ref().unwrap().rules().len(), 2);
        for _ in 0..5 {
            assert!(local.check_on_failure("c", Some(0)).allowed);
        }
        let quota = local.check_on_failure("c", Some(5_000));
        assert_eq!((quota.allowed, quota.refused_by()), (false, Some(1)));
        // One rule keeps the layout of a single rule's limiter.
        let one = Core::with_rules(&rules[..1], &options).unwrap();
        assert_eq!(one.keys("c"), ["api:gcra:10:1000:1ms:{c}"]);
    }

    #[test]
    fn configurations_past_exact_double_arithmetic_are_refused() {
        let options = RedisOptions::new();
        assert!(matches!(
            core(PolicyKind::FixedWindow, 1, MAX_WINDOW + 1, &options),
            Err(RedisConfigError::WindowTooLong { .. })
        ));
        assert!(core(PolicyKind::FixedWindow, 1, MAX_WINDOW, &options).is_ok());
        // L·W at the bound is taken, one window tick more is not.
        let limit = 1 << 10;
        let window = MAX_COUNTER_PRODUCT / limit;
        assert!(core(PolicyKind::SlidingWindowCounter, limit, window, &options).is_ok());
        assert!(matches!(
            core(
                PolicyKind::SlidingWindowCounter,
                limit,
                window + 1,
                &options
            ),
            Err(RedisConfigError::CounterTooLarge { .. })
        ));
        assert!(matches!(
            core(PolicyKind::Gcra, 10, 9, &options),
            Err(RedisConfigError::Config(
                ConfigError::WindowShorterThanLimit { .. }
            ))
        ));
    }

    #[test]
    fn ticks_prefixes_and_options_are_validated() {
        let tick = |tick| RedisOptions::new().time(TimeSource::Caller { tick });
        for bad in [
            Duration::from_nanos(999),
            Duration::from_micros(3),
            Duration::from_micros(1_500),
        ] {
            assert!(
                matches!(
                    core(PolicyKind::Gcra, 1, 1, &tick(bad)),
                    Err(RedisConfigError::Tick(_))
                ),
                "{bad:?}"
            );
        }
        for good in [
            Duration::from_micros(1),
            Duration::from_micros(250),
            Duration::from_secs(1),
        ] {
            assert!(
                core(PolicyKind::Gcra, 1, 1, &tick(good)).is_ok(),
                "{good:?}"
            );
        }
        assert!(matches!(
            core(PolicyKind::Gcra, 1, 1, &RedisOptions::new().prefix("a{b")),
            Err(RedisConfigError::Prefix(_))
        ));
        assert!(matches!(
            core(PolicyKind::Gcra, 1, 1, &RedisOptions::new().connections(0)),
            Err(RedisConfigError::Options(_))
        ));
        assert!(matches!(
            core(
                PolicyKind::Gcra,
                1,
                1,
                &RedisOptions::new().timeout(Duration::ZERO)
            ),
            Err(RedisConfigError::Options(_))
        ));
    }

    #[test]
    fn the_fault_rules_answer_as_documented() {
        let options = |rule| {
            RedisOptions::new()
                .time(TimeSource::MILLIS)
                .timeout(Duration::from_millis(250))
                .on_failure(rule)
        };
        let closed = core(PolicyKind::Gcra, 2, 1_000, &options(OnFailure::FailClosed)).unwrap();
        let decision = closed.check_on_failure("a", Some(5));
        assert_eq!((decision.allowed, decision.retry_after), (false, 250));
        assert_eq!(closed.remaining_on_failure("a", Some(5)), 0);
        let open = core(PolicyKind::Gcra, 2, 1_000, &options(OnFailure::FailOpen)).unwrap();
        assert!(open.check_on_failure("a", Some(5)).allowed);
        assert_eq!(open.remaining_on_failure("a", Some(5)), 2);
        let local = core(PolicyKind::Gcra, 2, 1_000, &options(OnFailure::Local)).unwrap();
        assert!(local.check_on_failure("a", Some(5)).allowed);
        assert!(local.check_on_failure("a", Some(5)).allowed);
        assert!(!local.check_on_failure("a", Some(5)).allowed);
        assert_eq!(local.faults.load(Ordering::Relaxed), 3);
    }

    /// A flood of new ids during an outage: the fallback never tracks more
    /// than its cap, and the newcomers past it get the overflow rule.
    #[test]
    fn the_local_fallback_is_bounded() {
        let options = RedisOptions::new()
            .time(TimeSource::MILLIS)
            .on_failure(OnFailure::Local);
        assert_eq!(options.get_local_bounds(), DEFAULT_LOCAL_BOUNDS);
        let tracked = |core: &Core| core.local.as_ref().unwrap().tracked_clients();

        let capped = core(
            PolicyKind::Gcra,
            2,
            1_000,
            &options
                .clone()
                .local_bounds(Bounds::new().evict_idle().max_clients(50)),
        )
        .unwrap();
        // One instant: no client can turn idle, so eviction frees nothing.
        for id in 0..1_000 {
            let decision = capped.check_on_failure(&format!("flood-{id}"), Some(7));
            assert_eq!(decision.allowed, id < 50, "id {id}");
            assert!(tracked(&capped) <= 50, "id {id}: {}", tracked(&capped));
        }
        assert_eq!(tracked(&capped), 50);
        // The clients inside keep their own state.
        assert!(capped.check_on_failure("flood-0", Some(7)).allowed);
        assert!(!capped.check_on_failure("flood-0", Some(7)).allowed);

        // Admit at the cap: newcomers pass untracked.
        let open = core(
            PolicyKind::FixedWindow,
            3,
            1_000,
            &options.clone().local_bounds(
                DEFAULT_LOCAL_BOUNDS
                    .max_clients(10)
                    .on_overflow(Overflow::Admit),
            ),
        )
        .unwrap();
        for id in 0..100 {
            assert!(
                open.check_on_failure(&format!("open-{id}"), Some(0))
                    .allowed
            );
        }
        assert_eq!(tracked(&open), 10);

        // The default cap, reached and held.
        let default = core(PolicyKind::TokenBucket, 4, 1_000, &options).unwrap();
        let flood = DEFAULT_LOCAL_MAX_CLIENTS + 1_000;
        let admitted = (0..flood)
            .filter(|id| default.check_on_failure(&id.to_string(), Some(3)).allowed)
            .count();
        assert_eq!(admitted, DEFAULT_LOCAL_MAX_CLIENTS);
        assert_eq!(tracked(&default), DEFAULT_LOCAL_MAX_CLIENTS);
    }
}
