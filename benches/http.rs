//! What the tower layer adds to a request: the same in-process axum handler
//! called through `tower::ServiceExt::oneshot` with and without
//! `RateLimitLayer` in front (a per-IP `gcra` limiter that admits every
//! request, keyed by the peer address a server would put in the request's
//! extensions). No network: the difference is the layer's own cost — key
//! extraction, the check, the headers, the boxed future.
//!
//! `cargo bench --bench http`; figures in `benches/README.md`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use axum::routing::get;
use axum::Router;
use criterion::{criterion_group, criterion_main, Criterion};
use floodgate::http::{PeerIp, RateLimitLayer};
use floodgate::{Builder, PolicyKind};
use tower::ServiceExt;

fn request(peer: u32) -> Request<Body> {
    let mut request = Request::builder().uri("/").body(Body::empty()).unwrap();
    let ip = IpAddr::V4(Ipv4Addr::from(peer));
    request.extensions_mut().insert(SocketAddr::new(ip, 40_000));
    request
}

fn layer_cost(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let handler = || Router::new().route("/", get(|| async { "hello" }));
    // Far above what the bench sends: every request is admitted, as on a
    // service within its limits.
    let limiter = Builder::new(PolicyKind::Gcra, 1_000_000_000, Duration::from_secs(1))
        .build::<IpAddr>()
        .unwrap();
    let limited = handler().layer(RateLimitLayer::new(limiter, PeerIp::new()));
    let plain = handler();

    let mut group = c.benchmark_group("http");
    let mut peer = 0u32;
    group.bench_function("axum handler", |b| {
        b.iter(|| {
            peer = peer.wrapping_add(1) % 10_000;
            runtime
                .block_on(plain.clone().oneshot(request(peer)))
                .unwrap()
        })
    });
    group.bench_function("axum handler + RateLimitLayer", |b| {
        b.iter(|| {
            peer = peer.wrapping_add(1) % 10_000;
            runtime
                .block_on(limited.clone().oneshot(request(peer)))
                .unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, layer_cost);
criterion_main!(benches);
