//! HTTP services (cargo feature `http`): a tower layer over any floodgate
//! limiter, key extractors, the IETF rate-limit headers, and the leaky
//! bucket as a shaper.
//!
//! ```no_run
//! use axum::{routing::get, Router};
//! use floodgate::http::{PeerIp, RateLimitLayer};
//! use floodgate::{Builder, PolicyKind};
//! use std::{net::{IpAddr, SocketAddr}, time::Duration};
//!
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! let per_ip = Builder::new(PolicyKind::Gcra, 100, Duration::from_secs(1)).build::<IpAddr>()?;
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(per_ip, PeerIp::new()));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(())
//! # }
//! ```
//!
//! (The README's example; the peer's address comes from axum's
//! `ConnectInfo`, which the feature `http` alone reads: it brings axum
//! without its default features, and `axum` is an alias of it.)
//!
//! # What a request meets
//!
//! 1. A request the [bypass](RateLimitLayer::bypass) predicate picks goes
//!    through untouched: not keyed, not counted, no headers.
//! 2. The [extractor](KeyExtractor) keys it: [`PeerIp`], [`ForwardedIp`],
//!    [`Header`], [`Global`], or a closure ([`from_fn`]). A request without
//!    a key is answered `400 Bad Request` (or by
//!    [`on_missing_key`](RateLimitLayer::on_missing_key)), never a 500 or a
//!    panic, and counts against nobody.
//! 3. The limiter decides, once: a [`RateLimiter`](crate::RateLimiter)
//!    answers at once, the Redis store
#![cfg_attr(
    feature = "redis",
    doc = "   ([`AsyncRedisLimiter`](crate::redis::AsyncRedisLimiter), feature"
)]
#![cfg_attr(
    not(feature = "redis"),
    doc = "   (`redis::AsyncRedisLimiter`, feature"
)]
//!    `redis`) is awaited on its async connection, never blocking the
//!    runtime ([`AsyncLimiter`]).
//! 4. A rejection is answered `429 Too Many Requests` with `Retry-After`;
//!    an admission with a leaky-bucket `delay` sleeps it first (as nginx
//!    `limit_req` without `nodelay`; [`nodelay`](RateLimitLayer::nodelay)
//!    turns it off), then goes to the inner service with its
//!    [`Decision`](crate::Decision) in the request's extensions.
//! 5. Both carry the headers of draft-ietf-httpapi-ratelimit-headers-10.
//!
//! One limiter is shared, through an `Arc`, by every clone of the service:
//! servers clone a service per connection, and a layer that gave each
//! clone its own state (as `tower::limit::RateLimitLayer` does) would not
//! limit a client that opens a new connection.
//!
//! # The headers, and what is rounded
//!
//! ```text
//! RateLimit-Policy: "default";q=100;w=60
//! RateLimit: "default";r=42;t=0
//! Retry-After: 2                      (rejections only)
//! ```
//!
//! - `q` is the rule's limit; `w` its window in seconds, sent only when the
//!   window is a whole number of seconds (a 1.5 s window has no `w`: the
//!   field is an integer, and a rounded one would misstate the rule). The
//!   window is the duration the rule was given as
//!   ([`Config::span`](crate::Config::span)), or its ticks times the
//!   decision's tick.
//! - `r` is the decision's `remaining`.
//! - `t` and `Retry-After` are whole seconds **rounded up**, so a client
//!   that waits them is never early: a rejection that clears in 1 ns says 1,
//!   one that clears in 1.5 s says 2
//!   ([`Decision::retry_after_secs`](crate::Decision::retry_after_secs)).
//!   Truncating, as `as_secs()` does, tells a client `Retry-After: 0` and
//!   invites it straight back. For an admission `t` is 0 while requests
//!   remain; after the last one it is an upper bound on the wait for the
//!   next (a decision says exactly when only for a rejection): the drip
//!   interval `W / L` for `token-bucket`, `gcra` and `leaky-bucket`, the
//!   window for `sliding-window` and `fixed-window`, the window and one
//!   tick for `sliding-window-counter`.
//! - The policy is named `"default"`, or as
//!   [`policy_name`](RateLimitLayer::policy_name) says; a decision of
//!   [`Tiers`](crate::tiers::Tiers) is named by its tier, with that tier's
//!   limit and window (a tier of several rules: one member per rule, below).
//! - `X-RateLimit-Limit`, `-Remaining` and `-Reset` (as `q`, `r`, `t`) are
//!   opt-in: [`legacy_headers`](RateLimitLayer::legacy_headers).
//!
//! A limiter with several rules ([`Builder::and`](crate::Builder::and))
//! sends one member per rule in each list, in the limiter's order, each
//! with that rule's `q`, `w`, `r` and `t` from its own answer
//! ([`RuledDecision::each`](crate::RuledDecision::each)), named by the
//! policy's name and the rule's 1-based position (a tier's name likewise):
//!
//! ```text
//! RateLimit-Policy: "default-1";q=10;w=1, "default-2";q=10000;w=86400
//! RateLimit: "default-1";r=0;t=1, "default-2";r=9990;t=0
//! Retry-After: 1                      (the longest wait of the refusing rules)
//! ```
//!
//! A tier of several rules (`"pro"`: `gcra:5/1h,fixed-window:3/1d`) sends
//! `"pro-1";q=5;w=3600, "pro-2";q=3;w=86400`; a tier of one rule, as a
//! limiter of one rule, its plain name.
//!
//! The legacy headers hold one number each, so they describe one rule: the
//! one that refused the request ([`Decision::refused_by`](crate::Decision::refused_by),
//! the one `Retry-After` comes from), else the one with the fewest requests
//! left (the first of them). A decision no rule made — a client the
//! [`Overflow`](crate::Overflow) rule answered, having no state of its own
//! — has no answer per rule: it gets one member under the plain name, with
//! the strictest rule's limit and window.
//!
//! # What is trusted
//!
//! The client's address is the TCP peer's ([`PeerIp`]). Forwarding
//! headers are honoured only from peers in a trusted-proxy list, and then
//! only up to the first address that is not a trusted proxy
//! ([`ForwardedIp`]); a client cannot pick its own key by sending
//! `X-Forwarded-For`. IPv6 clients are keyed by their /56 (configurable),
//! since one subscriber holds a whole prefix. A [`Header`] key is whatever
//! the client sends: bound the limiter ([`Bounds`](crate::Bounds)) or
//! check the key against those you issued.
#![cfg_attr(docsrs, doc(cfg(feature = "http")))]

mod body;
mod extract;
mod forwarded;
mod headers;
mod layer;
mod limit;
mod refund;
mod release;
mod service;
mod units;

pub use body::ResponseBody;
pub use extract::{
    from_fn, FromFn, Global, Header, Key, KeyExtractor, MissingKey, PeerIp, DEFAULT_IPV6_PREFIX,
};
pub use forwarded::{ForwardedIp, InvalidCidr};
pub use headers::RateLimitHeaders;
pub use layer::RateLimitLayer;
pub use limit::AsyncLimiter;
pub use service::{insert_headers, too_many_requests, RateLimitService, ResponseFuture};

/// The head of a request, which extractors and predicates read.
pub use ::http::request::Parts;
/// The head of a response, which [`settle_with`](RateLimitLayer::settle_with)
/// reads.
pub use ::http::response::Parts as ResponseParts;
/// CIDR blocks, for [`ForwardedIp::new`].
pub use ipnet::IpNet;
