//! The layer: a limiter, a key extractor and how to answer, shared by every
//! service it makes.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{Response, StatusCode};
use tower::Layer;

use super::body::Format;
use super::extract::{Key, KeyExtractor, MissingKey};
use super::limit::AsyncLimiter;
use super::refund::{RefundOn, Used};
use super::service::RateLimitService;
use super::units;
use crate::Decision;

/// A handler for one of the layer's own answers.
type Handler<T> = Arc<dyn Fn(&Parts, &T) -> Response<Bytes> + Send + Sync>;

/// A predicate on a request's head.
type Predicate = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;

/// How a layer answers: shared, read-only, by every service it makes.
#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) name: Arc<str>,
    pub(crate) legacy: bool,
    pub(crate) format: Format,
    pub(crate) on_rejected: Option<Handler<Decision>>,
    pub(crate) on_missing_key: Option<Handler<MissingKey>>,
    pub(crate) bypass: Option<Predicate>,
    pub(crate) shape: bool,
    /// What a request costs (1 each unless set), and the unit of the cost
    /// for `RateLimit-Policy`'s `qu`.
    pub(crate) cost: Option<Cost>,
    pub(crate) unit: Option<&'static str>,
    /// The cost is the body's length (`cost_in_content_bytes`): a request
    /// that can never be admitted is then too large, `413`.
    pub(crate) cost_in_bytes: bool,
    /// The request's tier, when it names one (`tier_from`).
    pub(crate) tier: Option<TierOf>,
    /// Give the whole cost back for a response whose status this picks
    /// (`refund_on`).
    pub(crate) refund_on: Option<RefundOn>,
    /// Give the whole cost back for a request cancelled before its
    /// response (`refund_cancelled`).
    pub(crate) refund_cancelled: bool,
    /// Give back what the response did not use, at the end of its body
    /// (`settle_with`).
    pub(crate) used: Option<Used>,
    /// Answer a refusal by an `in-flight` rule `503 Service Unavailable`
    /// rather than `429` (`in_flight_unavailable`).
    pub(crate) in_flight_unavailable: bool,
}

impl Options {
    /// Whether an admission may still be given back after the check.
    pub(crate) fn refunds(&self) -> bool {
        self.refund_on.is_some() || self.refund_cancelled || self.used.is_some()
    }
}

impl Options {
    /// The defaults (`RateLimitLayer::new`'s), the policy named `name`.
    pub(crate) fn new(name: &str) -> Self {
        Self {
            name: Arc::from(name),
            legacy: false,
            format: Format::Text,
            on_rejected: None,
            on_missing_key: None,
            bypass: None,
            shape: true,
            cost: None,
            unit: None,
            cost_in_bytes: false,
            tier: None,
            refund_on: None,
            refund_cancelled: false,
            used: None,
            in_flight_unavailable: false,
        }
    }
}

/// The tier a request names, from its head.
type ReadTier = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// The tier a request names, and what names it (for the messages about a
/// name the limiter lacks).
#[derive(Clone)]
pub(crate) struct TierOf {
    pub(crate) read: ReadTier,
    /// "the request's header x-plan", "the layer's tier_from".
    pub(crate) source: Arc<str>,
}

/// What a request costs, from its head, or why its head says no cost
/// (`cost_from_header`: the layer answers `400`, having spent nothing).
type Cost = Arc<dyn Fn(&Parts) -> Result<u64, String> + Send + Sync>;

/// A tower [`Layer`] that limits each client of the service it wraps.
///
/// It holds one limiter in an [`Arc`]: every service it makes, and every
/// clone of those (axum and hyper clone the service per connection), asks
/// that same limiter, so no connection starts with a fresh limit.
///
/// ```
/// use floodgate::http::{PeerIp, RateLimitLayer};
/// use floodgate::{Builder, PolicyKind};
/// use std::net::IpAddr;
/// use std::time::Duration;
///
/// let per_ip = Builder::new(PolicyKind::Gcra, 100, Duration::from_secs(1)).build::<IpAddr>()?;
/// let layer = RateLimitLayer::new(per_ip, PeerIp::new())
///     .policy_name("per-ip")
///     .bypass(|request| request.uri.path() == "/health");
/// # let _ = layer;
/// # Ok::<(), floodgate::ConfigError>(())
/// ```
pub struct RateLimitLayer<L, E> {
    pub(crate) limiter: Arc<L>,
    pub(crate) extractor: Arc<E>,
    pub(crate) options: Arc<Options>,
}

impl<L, E> Clone for RateLimitLayer<L, E> {
    fn clone(&self) -> Self {
        Self {
            limiter: Arc::clone(&self.limiter),
            extractor: Arc::clone(&self.extractor),
            options: Arc::clone(&self.options),
        }
    }
}

impl<L, E> fmt::Debug for RateLimitLayer<L, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("policy_name", &self.options.name)
            .field("legacy_headers", &self.options.legacy)
            .field("shape", &self.options.shape)
            .finish_non_exhaustive()
    }
}

impl<L, E> RateLimitLayer<L, E>
where
    E: KeyExtractor,
    L: AsyncLimiter<<E::Key as Key>::Query> + 'static,
{
    /// Limits each client, as `extractor` keys it, by `limiter`: any
    /// [`RateLimiter`](crate::RateLimiter) (a policy limiter, a boxed one,
    /// an `Arc` you keep to reload [`Tiers`](crate::tiers::Tiers)), or
    /// under the feature `redis` an
    #[cfg_attr(
        feature = "redis",
        doc = "[`AsyncRedisLimiter`](crate::redis::AsyncRedisLimiter)."
    )]
    #[cfg_attr(not(feature = "redis"), doc = "`redis::AsyncRedisLimiter`.")]
    ///
    /// The defaults: rejections are `429` with a plain-text body, the
    /// policy is named `"default"` in the headers, no legacy headers, no
    /// bypass, a missing key is `400`, and the leaky bucket's admissions
    /// are delayed by their `delay`.
    pub fn new(limiter: L, extractor: E) -> Self {
        Self {
            limiter: Arc::new(limiter),
            extractor: Arc::new(extractor),
            options: Arc::new(Options::new("default")),
        }
    }
}

impl<L, E> RateLimitLayer<L, E> {
    fn options(&mut self) -> &mut Options {
        Arc::make_mut(&mut self.options)
    }

    /// What each request costs, from its head (1 each by default): a
    /// request of cost `n` spends `n` of the limit at once, all or nothing
    /// (the contract's "Weighted requests"), for limits counted in rows,
    /// tokens or bytes.
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u64 + Send + Sync + 'static,
    {
        self.options().cost = Some(Arc::new(move |parts: &Parts| Ok(cost(parts))));
        self
    }

    /// Each request costs the whole number its header `name` says (an LLM
    /// call's `x-max-tokens`, a batch's `x-rows`): [`cost`](Self::cost)
    /// without a parser to write. With
    /// [`settle_from_header`](Self::settle_from_header) it is the most the
    /// request may use, and what the response did not use comes back.
    ///
    /// A request whose header is missing, sent more than once, or not a
    /// whole number (digits only, at most `u64::MAX`) is answered `400 Bad
    /// Request` before the check: nothing is spent and no client state is
    /// made. Its body names the header and what was wrong:
    ///
    /// ```text
    /// Bad Request: the request's cost is its header x-max-tokens, which it lacks
    /// Bad Request: the request's cost is its header x-max-tokens, whose value "12.5" is not a whole number
    /// ```
    ///
    /// The value is the client's word: a client that sends `0` spends
    /// nothing. Take the cost from a header only where the units are the
    /// client's to declare and the service holds it to them (a reservation
    /// settled by what the response reports), or from a gateway in front
    /// that sets it.
    ///
    /// ```
    /// use floodgate::http::{Header, RateLimitLayer};
    /// use floodgate::{Builder, PolicyKind};
    /// use std::time::Duration;
    ///
    /// // 100,000 tokens a minute per API key; a request reserves its
    /// // `x-max-tokens`, and the service says in `x-used-tokens` what it used.
    /// let tokens = Builder::new(PolicyKind::TokenBucket, 100_000, Duration::from_secs(60))
    ///     .build::<str>()?;
    /// let layer = RateLimitLayer::new(tokens, Header::new("x-api-key"))
    ///     .cost_from_header("x-max-tokens")
    ///     .settle_from_header("x-used-tokens");
    /// # let _ = layer;
    /// # Ok::<(), floodgate::ConfigError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    pub fn cost_from_header(mut self, name: &str) -> Self {
        let name = header_name(name);
        self.options().cost = Some(Arc::new(move |parts: &Parts| {
            units::request_cost(&name, &parts.headers)
        }));
        self
    }

    /// Each request costs its `Content-Length` in bytes, and
    /// `RateLimit-Policy` says `qu="content-bytes"`: a limit on uploaded
    /// bytes. A request without a `Content-Length` (a body sent in chunks,
    /// or none) costs 0 here: refuse those before the layer, or give your
    /// own [`cost`](Self::cost), if they matter.
    pub fn cost_in_content_bytes(mut self) -> Self {
        self.options().unit = Some("content-bytes");
        self.options().cost_in_bytes = true;
        self.cost(|parts| {
            parts
                .headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.parse().ok())
                .unwrap_or(0)
        })
    }

    /// Chooses each request's tier from its head: the name `tier` answers
    /// (a plan header a trusted gateway sets, an extension an
    /// authentication layer inserted, the path), or, for `None`, the
    /// limiter's own choice by key (a [`Tiers`](crate::tiers::Tiers)
    /// registry's resolver). The request is then checked in that tier
    /// ([`RateLimiter::check_ruled_in_n_at`](crate::RateLimiter::check_ruled_in_n_at)),
    /// and its headers name the tier that answered.
    ///
    /// A name the registry lacks is never silent: it is counted
    /// ([`Tiers::unknown_tier_calls`](crate::tiers::Tiers::unknown_tier_calls)),
    /// logged once per name as a `tracing` warning (install a subscriber to
    /// see it), and answered by the default tier, whose name the headers
    /// then carry; with
    /// [`reject_unknown_tiers`](crate::tiers::Tiers::reject_unknown_tiers)
    /// it is refused instead, `500` with a body naming the tier. A limiter
    /// without tiers refuses every name so (the layer was given the wrong
    /// limiter).
    ///
    /// Take the name only from what the client cannot choose for itself,
    /// or from a header a gateway in front of the service overwrites: a
    /// client that may name its own tier names the largest.
    ///
    /// ```
    /// use floodgate::http::{Header, RateLimitLayer};
    /// use floodgate::tiers::Tiers;
    ///
    /// let tiers = Tiers::new("free", "gcra:2/1h".parse()?, |_: &str| "free")
    ///     .with_tier("premium", "gcra:5/1h".parse()?)?;
    /// let layer = RateLimitLayer::new(tiers, Header::new("x-key")).tier_from(|request| {
    ///     let plan = request.headers.get("x-plan")?.to_str().ok()?;
    ///     Some(plan.to_owned())
    /// });
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tier_from<F>(self, tier: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.tier_named_by(tier, "the layer's tier_from")
    }

    /// [`tier_from`](Self::tier_from) the value of the header `name` (a
    /// request without it, or with a value that is not text, is left to
    /// the limiter's own choice). The warning and the `500` about a name
    /// the limiter lacks say it came from this header.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    pub fn tier_header(self, name: &str) -> Self {
        let name = header_name(name);
        let source = format!("the request's header {name}");
        self.tier_named_by(
            move |request| {
                let value = request.headers.get(&name)?.to_str().ok()?;
                Some(value.to_owned())
            },
            &source,
        )
    }

    fn tier_named_by<F>(mut self, tier: F, source: &str) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.options().tier = Some(TierOf {
            read: Arc::new(tier),
            source: Arc::from(source),
        });
        self
    }

    /// Gives an admitted request's whole cost back when its response's
    /// status is one `refund` picks: a request that failed upstream (every
    /// `5xx`, a `503`, a `429` from a service behind) should not count
    /// against its client
    /// ([`RateLimiter::refund`](crate::RateLimiter::refund)). The response's
    /// headers still describe the check that admitted it; the next
    /// request sees the units back.
    ///
    /// ```
    /// use floodgate::http::{Header, RateLimitLayer};
    /// use floodgate::{Builder, PolicyKind};
    /// use std::time::Duration;
    ///
    /// let limiter = Builder::new(PolicyKind::Gcra, 100, Duration::from_secs(60)).build::<str>()?;
    /// let layer = RateLimitLayer::new(limiter, Header::new("x-api-key"))
    ///     .refund_on(|status| status.is_server_error());
    /// # let _ = layer;
    /// # Ok::<(), floodgate::ConfigError>(())
    /// ```
    pub fn refund_on<F>(mut self, refund: F) -> Self
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        self.options().refund_on = Some(Arc::new(refund));
        self
    }

    /// Gives an admitted request's whole cost back when it is cancelled
    /// before its response: the client went away and the server dropped
    /// the request's future. A response that arrived counts (or is given
    /// back by [`refund_on`](Self::refund_on) and
    /// [`settle_with`](Self::settle_with)).
    pub fn refund_cancelled(mut self) -> Self {
        self.options().refund_cancelled = true;
        self
    }

    /// Answers a request refused by an `in-flight` rule (its client has
    /// as many requests running as the rule allows) `503 Service
    /// Unavailable` rather than the default `429 Too Many Requests`: for
    /// clients that treat a 429 as "slow down" and a 503 as "busy, try
    /// another replica". Neither carries `Retry-After`: only the end of
    /// one of the client's own requests admits it, at no time the layer
    /// knows.
    ///
    /// Under an `in-flight` rule the layer holds each admitted request's
    /// units until its response body ends (its last byte was read) or is
    /// dropped (the client went away), so a streamed response keeps its
    /// slot to the end; an error of the service, or a request cancelled
    /// before its response, releases them at once.
    ///
    /// ```
    /// use floodgate::http::{Header, RateLimitLayer};
    /// use floodgate::{Bounds, Engine, QuantaClock};
    ///
    /// let streams = floodgate::build_rules::<str, _>(
    ///     &"gcra:10/1s,in-flight:4".parse()?,
    ///     Engine::LockFree,
    ///     QuantaClock::new(),
    ///     Bounds::new(),
    /// )?;
    /// let layer = RateLimitLayer::new(streams, Header::new("x-api-key")).in_flight_unavailable();
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_flight_unavailable(mut self) -> Self {
        self.options().in_flight_unavailable = true;
        self
    }

    /// Admits each request at its [`cost`](Self::cost) as the most it may
    /// use (a reservation: an LLM call's `max_tokens`, an upload's declared
    /// size), and gives back what the response did not use once its body
    /// has ended, or was dropped with the client gone: `used` reads the
    /// units used from the response's head then (a header the service
    /// sets, or an extension it keeps counting in while the body streams,
    /// so a streamed body is charged what it streamed). `None` keeps the
    /// whole cost; a figure above it gives nothing back.
    ///
    /// Its units used in a header: [`settle_from_header`](Self::settle_from_header).
    /// Here, what a streamed response counts while it streams, in an
    /// extension it shares with its body (`Arc<AtomicU64>`), read when the
    /// body ends:
    ///
    /// ```
    /// use floodgate::http::{Header, RateLimitLayer};
    /// use floodgate::{Builder, PolicyKind};
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// /// The tokens a response streamed, counted by its body as it goes.
    /// #[derive(Clone, Default)]
    /// struct Streamed(Arc<AtomicU64>);
    ///
    /// let tokens = Builder::new(PolicyKind::TokenBucket, 100_000, Duration::from_secs(60))
    ///     .build::<str>()?;
    /// let layer = RateLimitLayer::new(tokens, Header::new("x-api-key"))
    ///     .cost_from_header("x-max-tokens")
    ///     .settle_with(|response| {
    ///         let streamed = response.extensions.get::<Streamed>()?;
    ///         Some(streamed.0.load(Ordering::Relaxed))
    ///     });
    /// # let _ = layer;
    /// # Ok::<(), floodgate::ConfigError>(())
    /// ```
    pub fn settle_with<F>(mut self, used: F) -> Self
    where
        F: Fn(&http::response::Parts) -> Option<u64> + Send + Sync + 'static,
    {
        self.options().used = Some(Arc::new(used));
        self
    }

    /// [`settle_with`](Self::settle_with) the whole number in the
    /// response's header `name` (`x-used-tokens`): each request is admitted
    /// at its cost ([`cost_from_header`](Self::cost_from_header) has an
    /// example) as the most it may use, and what the header says it did
    /// not use comes back when the body ends, or is dropped with the
    /// client gone. The header is read from the response's head, as the
    /// service sent it.
    ///
    /// A response without the header keeps the whole cost (the service
    /// did not say: an error path, a handler that does not count), as
    /// `settle_with`'s `None` does; so does one whose header is sent more
    /// than once or is not a whole number, which the service wrote and the
    /// layer cannot trust, logged once (a `tracing` warning) so that the
    /// fault is seen. A figure above the cost gives nothing back. Nothing
    /// is ever given back that was not admitted.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name.
    pub fn settle_from_header(self, name: &str) -> Self {
        let name = header_name(name);
        let logged = std::sync::atomic::AtomicBool::new(false);
        self.settle_with(move |response| units::units_used(&name, &response.headers, &logged))
    }

    /// The policy's name in `RateLimit-Policy` and `RateLimit` (`"default"`
    /// unless set). A decision of [`Tiers`](crate::tiers::Tiers) is named
    /// by its tier instead, since each tier is a policy of its own. With
    /// several rules, each rule's member is the name and its 1-based
    /// position (`"default-1"`, `"default-2"`), so the members differ. A
    /// character outside printable ASCII, which a structured-field string
    /// cannot hold, is sent as `?`.
    pub fn policy_name(mut self, name: impl Into<String>) -> Self {
        self.options().name = Arc::from(name.into());
        self
    }

    /// Also sends `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (seconds from now, as `RateLimit`'s `t`), for
    /// clients that read only those. With several rules they describe the
    /// rule that refused the request, else the one with the fewest left.
    pub fn legacy_headers(mut self) -> Self {
        self.options().legacy = true;
        self
    }

    /// Writes the layer's own answers (429, 400) as RFC 9457
    /// `application/problem+json` documents instead of plain text; a
    /// rejection's has a `retry_after` member in seconds.
    pub fn problem_json(mut self) -> Self {
        self.options().format = Format::Problem;
        self
    }

    /// Answers rejections with `handler`'s response (status included). The
    /// layer still adds `Retry-After` and the rate-limit headers.
    pub fn on_rejected<F>(mut self, handler: F) -> Self
    where
        F: Fn(&Parts, &Decision) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.options().on_rejected = Some(Arc::new(handler));
        self
    }

    /// Answers a request without a key with `handler`'s response instead of
    /// `400 Bad Request`.
    pub fn on_missing_key<F>(mut self, handler: F) -> Self
    where
        F: Fn(&Parts, &MissingKey) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.options().on_missing_key = Some(Arc::new(handler));
        self
    }

    /// Lets every request for which `bypass` answers true through
    /// unchanged: not keyed, not counted, no headers (health checks,
    /// `OPTIONS`).
    pub fn bypass<F>(mut self, bypass: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.options().bypass = Some(Arc::new(bypass));
        self
    }

    /// Lets the leaky bucket's admissions through at once instead of after
    /// their `delay` (nginx's `nodelay`): it then admits as `gcra` would.
    pub fn nodelay(mut self) -> Self {
        self.options().shape = false;
        self
    }

    /// The shared limiter.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }
}

/// The header `name`, for a builder method.
///
/// # Panics
///
/// If `name` is not a valid header name.
fn header_name(name: &str) -> http::HeaderName {
    http::HeaderName::from_bytes(name.as_bytes())
        .unwrap_or_else(|_| panic!("{name:?} is not a header name"))
}

impl<S, L, E> Layer<S> for RateLimitLayer<L, E> {
    type Service = RateLimitService<S, L, E>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService::new(inner, self.clone())
    }
}
