//! The gRPC service: `ShouldRateLimit` routed to [`Limits::decide`] by
//! tonic's unary handler and its prost codec, on the current limits (a
//! reload swaps them whole, so a request is decided on one configuration).
//!
//! What `tonic-build` would generate for the service's one method, written
//! out: the build needs no `protoc` and no generated crate.

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use tonic::body::Body;
use tonic::server::{Grpc, NamedService};
use tonic::Status;
use tonic_prost::ProstCodec;

use super::decide::Limits;
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

/// The method: one message in, one decision out, decided on the calling
/// task (a decision is a few lock-free steps, nothing to wait for).
struct ShouldRateLimit {
    limits: Arc<ArcSwap<Limits>>,
    calls: Arc<CallStats>,
}

impl tower::Service<tonic::Request<RateLimitRequest>> for ShouldRateLimit {
    type Response = tonic::Response<RateLimitResponse>;
    type Error = Status;
    type Future = Ready<Result<Self::Response, Status>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let limits = self.limits.load();
        let answer = limits.decide(request.get_ref());
        CallStats::add(match &answer {
            Ok(response) if response.overall_code == Code::Ok as i32 => &self.calls.ok,
            Ok(_) => &self.calls.over_limit,
            Err(_) => &self.calls.invalid,
        });
        ready(
            answer
                .map(tonic::Response::new)
                .map_err(|invalid| Status::invalid_argument(invalid.0)),
        )
    }
}
