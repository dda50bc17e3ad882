//! The service: keys a request, asks the limiter, answers or passes it on.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tower::Service;

use super::body::{answer, ResponseBody};
use super::extract::{Key, KeyExtractor};
use super::headers::RateLimitHeaders;
use super::layer::{Options, RateLimitLayer};
use super::limit::AsyncLimiter;
use super::refund::{Admission, OnEnd};
use super::release::Holding;
use crate::RuledDecision;

/// The future of a [`RateLimitService`] call.
pub type ResponseFuture<B, Error> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, Error>> + Send>>;

/// The service a [`RateLimitLayer`] makes: it keys each request, asks the
/// shared limiter, and answers a rejection itself or passes the request on.
///
/// Cloning it clones the inner service and shares the limiter.
pub struct RateLimitService<S, L, E> {
    inner: S,
    limiter: Arc<L>,
    extractor: Arc<E>,
    options: Arc<Options>,
}

impl<S, L, E> RateLimitService<S, L, E> {
    pub(crate) fn new(inner: S, layer: RateLimitLayer<L, E>) -> Self {
        Self {
            inner,
            limiter: layer.limiter,
            extractor: layer.extractor,
            options: layer.options,
        }
    }

    /// The shared limiter.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }
}

impl<S: Clone, L, E> Clone for RateLimitService<S, L, E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limiter: Arc::clone(&self.limiter),
            extractor: Arc::clone(&self.extractor),
            options: Arc::clone(&self.options),
        }
    }
}

impl<S: fmt::Debug, L, E> fmt::Debug for RateLimitService<S, L, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, L, E, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<S, L, E>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
    E: KeyExtractor,
    L: AsyncLimiter<<E::Key as Key>::Query> + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service that was driven ready goes with this call; a clone
        // stays for the next `poll_ready`.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (mut parts, body) = request.into_parts();
        let options = Arc::clone(&self.options);

        if options.bypass.as_ref().is_some_and(|bypass| bypass(&parts)) {
            let response = inner.call(Request::from_parts(parts, body));
            return Box::pin(async move { Ok(response.await?.map(ResponseBody::inner)) });
        }

        let key = match self.extractor.extract(&parts) {
            Ok(key) => key,
            Err(missing) => {
                let response = match &options.on_missing_key {
                    Some(handler) => handler(&parts, &missing),
                    None if missing.is_server_side() => {
                        log_once(&SERVER_KEY_LOGGED, || {
                            tracing::error!(
                                "floodgate's layer answers 500 to every request: {missing}"
                            );
                        });
                        answer(
                            options.format,
                            StatusCode::INTERNAL_SERVER_ERROR,
                            &format!("the rate limiter cannot key requests: {missing}"),
                            None,
                        )
                    }
                    None => answer(
                        options.format,
                        StatusCode::BAD_REQUEST,
                        &format!("no client key: {missing}"),
                        None,
                    ),
                };
                return Box::pin(async move { Ok(response.map(ResponseBody::full)) });
            }
        };

        // A cost the head cannot give (`cost_from_header`) is the client's
        // bad request, answered before the check: nothing spent, no state.
        let cost = match options.cost.as_ref().map_or(Ok(1), |cost| cost(&parts)) {
            Ok(cost) => cost,
            Err(detail) => {
                let response = answer(options.format, StatusCode::BAD_REQUEST, &detail, None);
                return Box::pin(async move { Ok(response.map(ResponseBody::full)) });
            }
        };

        let limiter = Arc::clone(&self.limiter);
        Box::pin(async move {
            let tier = options
                .tier
                .as_ref()
                .and_then(|tier| Some(((tier.read)(&parts)?, Arc::clone(&tier.source))));
            let ruled = match &tier {
                Some((tier, source)) => {
                    // A registry that lacks the tier says in its warning
                    // where the name came from.
                    let check = || limiter.check_ruled_in_n(tier, key.query(), cost);
                    crate::tiers::named_by(source, check).await
                }
                None => limiter.check_ruled_n(key.query(), cost).await,
            };
            let headers =
                RateLimitHeaders::for_layer(&ruled, &options.name, options.unit, options.legacy);
            let decision = ruled.decision;
            if !decision.allowed {
                let response = match &options.on_rejected {
                    Some(handler) => {
                        let mut response = handler(&parts, &decision);
                        headers.apply(response.headers_mut());
                        response
                    }
                    None => {
                        let busy = limiter.refused_in_flight(&ruled);
                        let named = match &tier {
                            Some((tier, source)) => Named::By(tier, source),
                            None => Named::Resolver,
                        };
                        refusal(&options, &ruled, busy, &headers, Some(cost), named)
                    }
                };
                return Ok(response.map(ResponseBody::full));
            }
            // Made before the wait, so that a request dropped while it
            // waits for its delay is cancelled too (and releases what it
            // holds: the holding drops with the future).
            let tier = tier.map(|(tier, _)| tier);
            let (holds, refunds) = (limiter.holds(&ruled), options.refunds());
            let key = (holds || refunds).then(|| Shared(Arc::new(key)));
            let holding = key
                .as_ref()
                .filter(|_| holds)
                .map(|key| Holding::new(Arc::clone(&limiter), key.clone(), tier.clone(), cost));
            let admission = key.filter(|_| refunds).map(|key| {
                let on_drop = options.refund_cancelled;
                Admission::new(limiter, key, tier, decision, cost, on_drop)
            });
            if options.shape && decision.delay > 0 {
                tokio::time::sleep(decision.delay()).await;
            }
            parts.extensions.insert(decision);
            // An error of the inner service drops the holding here: the
            // request is over, its units released.
            let mut response = inner.call(Request::from_parts(parts, body)).await?;
            headers.apply(response.headers_mut());
            let release: Option<OnEnd> =
                holding.map(|holding| Box::new(move || drop(holding)) as OnEnd);
            let Some(mut admission) = admission else {
                return Ok(response.map(|body| ResponseBody::inner_then(body, release)));
            };
            // The response arrived: it is no longer cancelled.
            admission.arrived();
            if let Some(refund) = &options.refund_on
                && refund(response.status())
            {
                admission.give_back().await;
                return Ok(response.map(|body| ResponseBody::inner_then(body, release)));
            }
            match &options.used {
                Some(used) => {
                    let (head, body) = response.into_parts();
                    let settle = admission.settle_at_end(Arc::clone(used), head.clone());
                    let end: OnEnd = match release {
                        Some(release) => Box::new(move || {
                            settle();
                            release();
                        }),
                        None => settle,
                    };
                    Ok(Response::from_parts(
                        head,
                        ResponseBody::inner_then(body, Some(end)),
                    ))
                }
                None => Ok(response.map(|body| ResponseBody::inner_then(body, release))),
            }
        })
    }
}

/// The request's key, shared by what gives its units back at the end of
/// the response (a refund, a release): one allocation for an admission
/// the layer may still give back, none otherwise.
struct Shared<K>(Arc<K>);

impl<K> Clone for Shared<K> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<K: Key> Key for Shared<K> {
    type Query = K::Query;

    fn query(&self) -> &K::Query {
        self.0.query()
    }
}

/// Whether the layer logged a server that gives it no keys (once a process:
/// the operator needs the fix once, not a line per request).
static SERVER_KEY_LOGGED: AtomicBool = AtomicBool::new(false);

/// Runs `log` the first time `flag` is seen unset.
fn log_once(flag: &AtomicBool, log: impl FnOnce()) {
    // Relaxed: the flag orders nothing; two threads that race may both log.
    if !flag.swap(true, Ordering::Relaxed) {
        log();
    }
}

/// Who named the tier a refused request was checked in.
#[derive(Clone, Copy)]
enum Named<'a> {
    /// The limiter's resolver: the layer named none.
    Resolver,
    /// The layer: the tier, and what named it ("the request's header
    /// x-plan").
    By(&'a str, &'a str),
    /// Not known (`too_many_requests`: the handler checked).
    Unknown,
}

/// The layer's own answer to a refused request, by what the refusal means
/// for the client:
///
/// * a request that waiting would admit: `429 Too Many Requests` with
///   `Retry-After` (RFC 6585 §4) and the `RateLimit` headers;
/// * a body larger than the limit, when the cost is the body's length
///   (`cost_in_content_bytes`): `413 Content Too Large` (RFC 9110
///   §15.5.14), with no `Retry-After`, since no wait would admit it;
/// * a tier the registry lacks, refused by `reject_unknown_tiers` (or a
///   tier named for a limiter without tiers): `500`, the server's
///   configuration at fault, with a body saying what to fix and no
///   rate-limit headers, which would describe a tier the request does not
///   belong to;
/// * a request refused by an `in-flight` rule, its client's requests
///   running as many as the rule allows: `429` without `Retry-After`
///   (only the end of one of them admits it, at no time known), or `503`
///   with `in_flight_unavailable`;
/// * any other request that can never be admitted (a cost above the
///   limit): `429` without `Retry-After`, which RFC 6585 makes optional,
///   rather than a time the limiter could not honour.
fn refusal(
    options: &Options,
    ruled: &RuledDecision<'_>,
    in_flight: Option<crate::Rule>,
    headers: &RateLimitHeaders,
    cost: Option<u64>,
    named: Named<'_>,
) -> Response<Bytes> {
    if ruled.refused_unknown_tier {
        const FIX: &str = "add the tier to the registry (Tiers::with_tier), or leave out \
                           Tiers::reject_unknown_tiers to answer unknown tiers by the default \
                           tier";
        let detail = match named {
            Named::By(tier, source) if ruled.tier.is_none() => format!(
                "{source} named the tier {tier:?} for this request, but the layer's limiter \
                 has no tiers: give the layer a Tiers registry"
            ),
            Named::By(tier, source) => format!(
                "the rate limiter has no tier {tier:?}, which {source} named for this \
                 request: {FIX}"
            ),
            Named::Resolver => format!(
                "the rate limiter's resolver named a tier the registry lacks (the server's \
                 log names it): {FIX}"
            ),
            Named::Unknown => format!(
                "the rate limiter was asked for a tier the registry lacks (the server's log \
                 names it and what named it): {FIX}"
            ),
        };
        return answer(
            options.format,
            StatusCode::INTERNAL_SERVER_ERROR,
            &detail,
            None,
        );
    }
    let limit = ruled.config.limit();
    let busy = in_flight.filter(|rule| cost.is_none_or(|cost| cost <= rule.config().limit()));
    let mut response = match (busy, headers.retry_after()) {
        (Some(rule), _) => {
            let status = if options.in_flight_unavailable {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            answer(
                options.format,
                status,
                &format!(
                    "this client has its most requests in flight (in-flight:{}): \
                     retry when one of them has ended",
                    rule.config().limit()
                ),
                None,
            )
        }
        (None, Some(seconds)) => answer(
            options.format,
            StatusCode::TOO_MANY_REQUESTS,
            &format!("retry after {seconds} s"),
            Some(seconds),
        ),
        (None, None) => {
            // "11, more than" when the cost is known (the layer's), "more
            // than" when it is not (`too_many_requests`).
            let costs = cost.map_or_else(String::new, |cost| format!(" {cost},"));
            if options.cost_in_bytes {
                answer(
                    options.format,
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!(
                        "the body's {} bytes are more than the limit of {limit}",
                        cost.unwrap_or_default()
                    ),
                    None,
                )
            } else {
                answer(
                    options.format,
                    StatusCode::TOO_MANY_REQUESTS,
                    &format!(
                        "this request costs{costs} more than the limit of {limit}: \
                         it can never be admitted"
                    ),
                    None,
                )
            }
        }
    };
    headers.apply(response.headers_mut());
    response
}

/// The response the layer sends for a refused request, for a handler that
/// checks a limiter itself (a limit shared by several routes, a cost known
/// only inside the handler): `429 Too Many Requests` with `Retry-After`
/// and the rate-limit headers ([`insert_headers`]), or `429` without
/// `Retry-After` for a request no wait admits, or `500` for a tier the
/// limiter lacks. The policy is named `policy_name` in the headers (a
/// tier's decision is named by its tier). The body is plain text.
///
/// Check with [`RateLimiter::check_ruled_n_at`](crate::RateLimiter::check_ruled_n_at),
/// which says the rule that decided, for the headers:
///
/// ```
/// use floodgate::http::{insert_headers, too_many_requests};
/// use floodgate::{Builder, RateLimiter};
/// use http::StatusCode;
///
/// let exports = Builder::from_rule("token-bucket:100/1m".parse()?).build::<str>()?;
/// let export = |rows| {
///     // The cost, known once the query is planned.
///     let ruled = exports.check_ruled_n_at("alice", exports.now(), rows);
///     if ruled.decision.allowed() {
///         let mut ok = http::Response::new(bytes::Bytes::from("the rows"));
///         insert_headers(ok.headers_mut(), &ruled, "exports");
///         ok
///     } else {
///         too_many_requests(&ruled, "exports")
///     }
/// };
/// let first = export(60);
/// assert_eq!(first.headers()["ratelimit"], r#""exports";r=40;t=0"#);
/// let second = export(60); // 20 tokens short: 20 drips of 0.6 s
/// assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(second.headers()["retry-after"], "12");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Panics
///
/// If `ruled` was admitted: there is nothing to refuse.
pub fn too_many_requests(ruled: &RuledDecision<'_>, policy_name: &str) -> Response<Bytes> {
    assert!(
        !ruled.decision.allowed(),
        "too_many_requests: the decision admitted the request"
    );
    let options = Options::new(policy_name);
    let headers = RateLimitHeaders::for_layer(ruled, policy_name, None, false);
    refusal(
        &options,
        ruled,
        ruled.refused_in_flight(),
        &headers,
        None,
        Named::Unknown,
    )
}

/// Adds to `headers` what the layer sends with `ruled`: `RateLimit-Policy`
/// and `RateLimit` (the policy named `policy_name`, or by its tier; one
/// member per rule for several rules), and `Retry-After` for a refusal a
/// wait would admit. For the handler that checks itself
/// ([`too_many_requests`] has an example); a response that passed the
/// layer has the layer's already.
pub fn insert_headers(headers: &mut http::HeaderMap, ruled: &RuledDecision<'_>, policy_name: &str) {
    RateLimitHeaders::for_layer(ruled, policy_name, None, false).apply(headers);
}
