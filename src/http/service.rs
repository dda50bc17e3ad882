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
                            "the rate limiter cannot key requests: see the server's log",
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

        let limiter = Arc::clone(&self.limiter);
        Box::pin(async move {
            let cost = options.cost.as_ref().map_or(1, |cost| cost(&parts));
            let ruled = limiter.check_ruled_n(key.query(), cost).await;
            let headers =
                RateLimitHeaders::new(&ruled, &options.name, options.unit, options.legacy);
            let decision = ruled.decision;
            if !decision.allowed {
                let response = match &options.on_rejected {
                    Some(handler) => {
                        let mut response = handler(&parts, &decision);
                        headers.apply(response.headers_mut());
                        response
                    }
                    None => refusal(&options, &ruled, &headers, cost),
                };
                return Ok(response.map(ResponseBody::full));
            }
            if options.shape && decision.delay > 0 {
                tokio::time::sleep(decision.delay()).await;
            }
            parts.extensions.insert(decision);
            let mut response = inner.call(Request::from_parts(parts, body)).await?;
            headers.apply(response.headers_mut());
            Ok(response.map(ResponseBody::inner))
        })
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

/// The layer's own answer to a refused request, by what the refusal means
/// for the client:
///
/// * a request that waiting would admit: `429 Too Many Requests` with
///   `Retry-After` (RFC 6585 §4) and the `RateLimit` headers;
/// * a body larger than the limit, when the cost is the body's length
///   (`cost_in_content_bytes`): `413 Content Too Large` (RFC 9110
///   §15.5.14), with no `Retry-After`, since no wait would admit it;
/// * a tier the registry lacks, refused by `reject_unknown_tiers`: `500`,
///   the server's configuration at fault (a resolver naming a tier that
///   was never added), with no rate-limit headers, which would describe a
///   tier the request does not belong to;
/// * any other request that can never be admitted (a cost above the
///   limit): `429` without `Retry-After`, which RFC 6585 makes optional,
///   rather than a time the limiter could not honour.
fn refusal(
    options: &Options,
    ruled: &RuledDecision<'_>,
    headers: &RateLimitHeaders,
    cost: u64,
) -> Response<Bytes> {
    if ruled.refused_unknown_tier {
        return answer(
            options.format,
            StatusCode::INTERNAL_SERVER_ERROR,
            "the rate limiter has no tier for this request: see the server's log",
            None,
        );
    }
    let limit = ruled.config.limit();
    let mut response = match headers.retry_after() {
        Some(seconds) => answer(
            options.format,
            StatusCode::TOO_MANY_REQUESTS,
            &format!("retry after {seconds} s"),
            Some(seconds),
        ),
        None if options.cost_in_bytes => answer(
            options.format,
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("the body's {cost} bytes are more than the limit of {limit}"),
            None,
        ),
        None => answer(
            options.format,
            StatusCode::TOO_MANY_REQUESTS,
            &format!("this request costs {cost}, more than the limit of {limit}: it can never be admitted"),
            None,
        ),
    };
    headers.apply(response.headers_mut());
    response
}
