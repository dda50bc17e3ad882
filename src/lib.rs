//! Lock-free per-client rate limiting: six exact policies behind one trait.
//!
//! ```
//! use floodgate::{Bounds, Builder, PolicyKind, RateLimiter, Rule};
//! use std::net::IpAddr;
//! use std::time::Duration;
//!
//! // 100 requests per second per client IP, forgetting idle clients and
//! // tracking at most 100,000 of them.
//! let limiter = Builder::new(PolicyKind::SlidingWindow, 100, Duration::from_secs(1))
//!     .bounds(Bounds::new().evict_idle().max_clients(100_000))
//!     .build::<IpAddr>()?;
//!
//! let decision = limiter.check(&"198.51.100.4".parse()?);
//! if decision.allowed() {
//!     // serve the request; `decision.remaining()` more fit in this window
//! } else {
//!     // answer 429 with `Retry-After: {decision.retry_after_secs()}`: whole
//!     // seconds, rounded up, never 0
//! }
//!
//! // The same rule, from a configuration file or an environment variable:
//! let rule: Rule = "sliding-window:100/1s".parse()?;
//! let from_config = Builder::from_rule(rule).build::<str>()?;
//! # let _ = from_config;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Durations
//!
//! Give rates as durations ([`Config::per`], [`Builder::new`], the text
//! `"gcra:100/1s"`): each limiter turns them into its clock's ticks
//! (nanoseconds in memory, microseconds with Redis `TIME`, whatever a
//! [`ManualClock`] is made with), so the same rule is the same rate
//! everywhere. A [`Decision`] answers in [`Duration`](std::time::Duration)s
//! whatever its clock counts in ([`Decision::retry_after`],
//! [`Decision::delay`], [`Decision::retry_after_secs`]), and says in its
//! type when a request can never be admitted (`retry_after` is `None`).
//! [`Config::per_ticks`] takes a raw count of ticks, for exact work where
//! the unit is yours (the decision's `_ticks` accessors).
//!
//! # In an HTTP service
//!
//! The cargo feature `http` gives `floodgate::http::RateLimitLayer`, a
//! tower layer (axum, hyper, tonic) that keys each request (the peer's
//! address, a header, an extension), asks the limiter once, and answers a
//! refusal itself: `429 Too Many Requests` with `Retry-After` and the IETF
//! `RateLimit` headers, a per-route cost where a route costs more
//! (`README.md`, "In an axum service"). Without it: build one limiter at
//! start-up, share it (the `Arc` that `build` gives: clone it, or a
//! `static`) with every handler, key it by what identifies a client, and
//! answer a rejection with `429` and `Retry-After: retry_after_secs()`.
//! With `tokio` (which `http` brings), `floodgate::wait` waits for an
//! admission instead of refusing, and sleeps the leaky bucket's delay.
//!
//! # Policies
//!
//! | name | admits | state per client |
//! | --- | --- | --- |
//! | `sliding-window` | fewer than `L` admissions in `(now − W, now]` | ring of `L` × 16 bytes |
//! | `token-bucket` | a token is left; one drips in every `W / L` | one `u64` |
//! | `fixed-window` | fewer than `L` in the client's current window | one `u128` |
//! | `sliding-window-counter` | previous window weighted by overlap + current `< L` | one `u128` |
//! | `gcra` | a burst of `L`, then one per `W / L` | one `u64` |
//! | `leaky-bucket` | as `gcra`, answered as a queueing [`Decision::delay`] | one `u64` |
//!
//! The exact answers, field by field, are the contract in `SPEC.md`; the
//! lock-free engine ([`Limiter`]), the mutex baseline ([`MutexLimiter`]) and
//! `floodgate replay` all give them.
//!
//! # Time
//!
//! Time is a `u64` count of ticks: nanoseconds for the default
//! [`QuantaClock`] and for [`CoarseClock`] (one load per read, up to one
//! resolution behind real time), whatever you pass with a [`ManualClock`]
//! or the `*_at` methods. Each client's state is measured from its first call (its
//! origin), so grids (fixed windows, drips) are per client and stored times
//! stay small. Threads racing on a real clock can present a `now` older than
//! the state already reflects: such a call never moves stored time back, never
//! panics or overflows, and is judged no more leniently than at the latest
//! time the state reflects (a tier's carry-over and an evicted client's
//! re-creation included). The contract lets such a call be judged more
//! strictly, and the engines differ there, so the lock-free engine, the mutex
//! baseline and the Redis store give the same answers whenever a client's
//! times do not decrease, and each keeps the contract's bound where they
//! step back.
//!
//! [`RateLimiter::remaining`] is the contract's and creates the client;
//! [`RateLimiter::peek`] asks without creating anything, and
//! [`RateLimiter::forget`] drops one client's state.
//!
//! # Concurrency
//!
//! A [`Limiter`]'s check for a known client reads one slot of an
//! open-addressing table, where the client's key and state words lie side by
//! side, and runs a compare-and-swap loop on those words: no lock, no
//! pointer to follow, no allocation. A new client claims an empty slot with
//! one compare-and-swap (racing first calls end up sharing one state); the
//! table grows by moving each client, one frozen slot at a time, into a
//! larger one while checks go on, in steps of 64 slots that new clients'
//! arrivals take, so no call moves the whole table; outgrown tables are
//! freed by epoch-based reclamation whose pin is two plain stores (the rare
//! collect pays the barrier, with Linux's `membarrier`). A known client's
//! check never waits for a move; a new client's arrival during one waits at
//! most for another arrival's step before it takes its own. [`Tiers`](tiers::Tiers)
//! keep their clients in an
//! [`scc::HashIndex`](https://docs.rs/scc/3/scc/hash_index/struct.HashIndex.html)
//! (lock-free look-ups; one
//! bucket lock to create a client, to carry one over after its tier's rule
//! changed, and for [`RateLimiter::forget`]). The policies on 128-bit
//! words are lock-free where the machine has a 16-byte compare-and-swap
//! ([`wide_cas_is_lock_free`]).
// Unsafe code is denied but where a module allows it for itself, each
// block with its reason beside it: the inline store's table
// (`store::inline`) and the cell that holds its current table (`sync`, the
// epoch-reclaimed one and its loom stand-in; the epoch collector's tests
// stand in for that cell too), the frames of several rules and the log's
// rings they point to (`frame`, `policy::compound`,
// `policy::sliding_window`), and the default clock's read of the
// time-stamp counter (`clock`).
#![deny(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admission;
mod baseline;
pub mod bounds;
mod cell;
mod clock;
mod config;
mod decision;
pub mod export;
mod factory;
mod frame;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
// The local side of leases: used by the Redis store's leasing limiter, and
// by its loom models (`__loom`) and fuzz target (`__fuzz`) without it.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
mod lease;
mod limiter;
pub mod offenders;
pub mod permit;
pub mod policy;
mod rate_limiter;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
pub mod reservation;
mod rule;
pub mod state;
mod stats;
mod store;
mod sync;
pub mod tiers;
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub mod wait;

/// The epoch collector of the inline store's tables and the local side of
/// leases, for their loom models (`loom-tests/tests/epoch.rs`,
/// `loom-tests/tests/leases.rs`); not part of the API.
#[cfg(floodgate_loom)]
#[doc(hidden)]
pub mod __loom {
    pub use crate::lease::{Landing, LeaseSlots, Spent};
    pub use crate::store::epoch::{Collector, Pin, Record};
}

/// The local side of leases, for the `leases` fuzz target and its kept
/// inputs' replay (`fuzz/src/leases.rs`), which build without the loom
/// cfg; not part of the API.
#[doc(hidden)]
pub mod __fuzz {
    pub use crate::lease::{Landing, LeaseSlots, Spent};
}

/// The store's pin, for `benches/pin.rs` only (timed beside other
/// collectors' pins); not part of the API.
#[doc(hidden)]
pub mod __bench {
    /// Runs `f` pinned as a check's table read is: the process's collector,
    /// the thread's record.
    #[inline]
    pub fn pinned<R>(f: impl FnOnce() -> R) -> R {
        let _guard = crate::sync::Guard::new();
        f()
    }
}

pub use admission::Admission;
pub use baseline::MutexLimiter;
pub use bounds::{Bounds, Overflow, UnknownOverflow};
pub use cell::wide_cas_is_lock_free;
pub use clock::{Clock, CoarseClock, CoarseClockError, ManualClock, QuantaClock, Tick};
pub use config::{
    Config, ConfigError, PolicyKind, UnknownPolicy, MAX_LIMIT, MAX_LOG_LIMIT, MAX_SCHEDULE_WINDOW,
};
pub use decision::{Decision, RuleAnswer, RuleAnswers};
pub use factory::{build, build_bounded, build_rules, build_with, Builder, Engine, UnknownEngine};
pub use limiter::Limiter;
pub use rate_limiter::{InsufficientCapacity, RateLimiter, RuledDecision};
pub use rule::{Rule, RuleError, RuleProblem, RuleSet, MAX_RULES};
pub use stats::Stats;

/// The README's examples, compiled and run as doctests (its HTTP examples
/// need the feature `http`).
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "http"))]
pub struct ReadmeDoctests;

/// `docs/limiters.md`'s examples, compiled and run as doctests.
#[doc = include_str!("../docs/limiters.md")]
#[cfg(doctest)]
pub struct LimitersDoctests;

/// `docs/policies.md`'s examples, compiled and run as doctests.
#[doc = include_str!("../docs/policies.md")]
#[cfg(doctest)]
pub struct PoliciesDoctests;

/// `docs/http.md`'s examples, compiled and run as doctests.
#[doc = include_str!("../docs/http.md")]
#[cfg(all(doctest, feature = "http"))]
pub struct HttpDoctests;

/// `docs/refunds.md`'s examples, compiled and run as doctests.
#[doc = include_str!("../docs/refunds.md")]
#[cfg(doctest)]
pub struct RefundsDoctests;

/// `docs/in-flight.md`'s examples, compiled and run as doctests.
#[doc = include_str!("../docs/in-flight.md")]
#[cfg(doctest)]
pub struct InFlightDoctests;

/// `docs/bounds.md`'s examples, compiled and run as doctests.
#[doc = include_str!("../docs/bounds.md")]
#[cfg(doctest)]
pub struct BoundsDoctests;

/// `docs/tiers.md`'s examples, compiled and run as doctests.
#[doc = include_str!("../docs/tiers.md")]
#[cfg(doctest)]
pub struct TiersDoctests;

/// `docs/metrics.md`'s examples, compiled and run as doctests.
#[doc = include_str!("../docs/metrics.md")]
#[cfg(doctest)]
pub struct MetricsDoctests;

/// `docs/redis.md`'s examples, compiled and run as doctests.
#[doc = include_str!("../docs/redis.md")]
#[cfg(all(doctest, feature = "redis"))]
pub struct RedisDoctests;

/// `docs/leases.md`'s examples, compiled and run as doctests.
#[doc = include_str!("../docs/leases.md")]
#[cfg(all(doctest, feature = "redis"))]
pub struct LeasesDoctests;

/// `docs/state.md`'s examples, compiled and run as doctests.
#[doc = include_str!("../docs/state.md")]
#[cfg(all(doctest, feature = "state"))]
pub struct StateDoctests;

/// `docs/cli.md`'s examples, compiled and run as doctests.
#[doc = include_str!("../docs/cli.md")]
#[cfg(doctest)]
pub struct CliDoctests;

/// `docs/how-it-works.md`'s examples, compiled and run as doctests.
#[doc = include_str!("../docs/how-it-works.md")]
#[cfg(doctest)]
pub struct HowItWorksDoctests;

/// `docs/performance.md`'s examples, compiled and run as doctests.
#[doc = include_str!("../docs/performance.md")]
#[cfg(doctest)]
pub struct PerformanceDoctests;

/// `docs/checks.md`'s examples, compiled and run as doctests.
#[doc = include_str!("../docs/checks.md")]
#[cfg(doctest)]
pub struct ChecksDoctests;
