//! The gRPC service: `ShouldRateLimit` routed to [`Limits::decide`] by
//! tonic's unary handler and its prost codec, on the current limits (a
//! reload swaps them whole, so a request is decided on one configuration).
//!
//! What `tonic-build` would generate for the service's one method, written
//! out: the build needs no `protoc` and no generated crate.

use std::convert::Infallible;
use std::future::{ready, Future};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use arc_swap::ArcSwap;
use tonic::body::Body;
use tonic::server::{Grpc, NamedService};
use tonic::Status;
use tonic_prost::ProstCodec;

use super::decide::{Invalid, Limits};
use super::metrics::CallStats;
use super::proto::{Code, RateLimitRequest, RateLimitResponse};

/// The method's path.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `envoy.service.ratelimit.v3.RateLimitService` over the limits it holds.
#[derive(Clone)]
pub struct RateLimitService {
    limits: Arc<ArcSwap<Limits>>,
    calls: Arc<CallStats>,
}

impl RateLimitService {
    /// The service over `limits`, which a reload may replace, counting its
    /// calls in `calls`.
    pub fn new(limits: Arc<ArcSwap<Limits>>, calls: Arc<CallStats>) -> Self {
        Self { limits, calls }
    }
}

impl NamedService for RateLimitService {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

type Answer = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

impl tower::Service<http::Request<Body>> for RateLimitService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Answer {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            let path = request.uri().path().to_owned();
            return Box::pin(ready(Ok(Status::unimplemented(format!(
                "no method {path} in this service"
            ))
            .into_http())));
        }
        let method = ShouldRateLimit {
            limits: Arc::clone(&self.limits),
            calls: Arc::clone(&self.calls),
        };
        Box::pin(async move {
            let mut grpc = Grpc::new(ProstCodec::<RateLimitResponse, RateLimitRequest>::default());
            Ok(grpc.unary(method, request).await)
        })
    }
}

/// The method: one message in, one decision out. With every store in
/// memory it is decided on the calling task, at once (a decision is a few
/// lock-free steps, nothing to wait for, no future boxed); with Redis, on
/// a future of its own that awaits Redis's answers.
struct ShouldRateLimit {
    limits: Arc<ArcSwap<Limits>>,
    calls: Arc<CallStats>,
}

type Response = tonic::Response<RateLimitResponse>;

/// The method's answer: ready, or awaited from Redis.
enum Decided {
    Now(Option<Result<Response, Status>>),
    Later(Pin<Box<dyn Future<Output = Result<Response, Status>> + Send>>),
}

impl Future for Decided {
    type Output = Result<Response, Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Both arms are `Unpin`: a box, and an answer moved out once.
        match self.get_mut() {
            Decided::Now(answer) => Poll::Ready(
                answer
                    .take()
                    .unwrap_or_else(|| Err(Status::internal("the answer was taken already"))),
            ),
            Decided::Later(future) => future.as_mut().poll(cx),
        }
    }
}

impl tower::Service<tonic::Request<RateLimitRequest>> for ShouldRateLimit {
    type Response = Response;
    type Error = Status;
    type Future = Decided;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let limits = self.limits.load();
        if limits.all_in_memory() {
            let answer = decided_now(&limits, request.get_ref());
            return Decided::Now(Some(answered(&self.calls, answer)));
        }
        let limits = arc_swap::Guard::into_inner(limits);
        let calls = Arc::clone(&self.calls);
        Decided::Later(Box::pin(async move {
            let answer = limits.decide(request.get_ref()).await;
            answered(&calls, answer)
        }))
    }
}

/// `limits.decide(request)` with every store in memory, where it awaits
/// nothing: its first poll answers.
fn decided_now(limits: &Limits, request: &RateLimitRequest) -> Result<RateLimitResponse, Invalid> {
    let mut decision = pin!(limits.decide(request));
    match decision
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(answer) => answer,
        Poll::Pending => unreachable!("an in-memory decision awaits nothing"),
    }
}

/// The answer counted by its kind, as gRPC sends it.
fn answered(
    calls: &CallStats,
    answer: Result<RateLimitResponse, Invalid>,
) -> Result<Response, Status> {
    CallStats::add(match &answer {
        Ok(response) if response.overall_code == Code::Ok as i32 => &calls.ok,
        Ok(_) => &calls.over_limit,
        Err(_) => &calls.invalid,
    });
    answer
        .map(tonic::Response::new)
        .map_err(|invalid| Status::invalid_argument(invalid.0))
}
