//! The HTTP layer over real HTTP on 127.0.0.1: an axum (or plain hyper)
//! server the test starts, a hyper client, and a manual clock, so every
//! count and header value is exact. No assertion depends on timing; the
//! shaper's sleeps are measured on tokio's paused clock.
//!
//! ```sh
//! cargo test -p floodgate --test suite http::
//! FLOODGATE_REDIS_URL=redis://127.0.0.1:6379 \
//!     cargo test -p floodgate --test suite http:: -- --include-ignored
//! ```

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Extension;
use axum::routing;
use axum::Router;
use bytes::Bytes;
use floodgate::http::{
    from_fn, ForwardedIp, Global, Header, KeyExtractor, Parts, PeerIp, RateLimitLayer,
};
use floodgate::tiers::Tiers;
use floodgate::{
    build_with, Builder, Config, Decision, Engine, ManualClock, PolicyKind, RateLimiter,
};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tower::{Layer, ServiceExt};

/// What the client got.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|value| value.to_str().unwrap())
    }
}

/// Serves `app` on a free loopback port, with the peer's address as
/// axum's `ConnectInfo`.
async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    address
}

/// One GET of `path` on a connection of its own, with `headers`.
async fn get_with(address: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut request = Request::get(path).header("host", "127.0.0.1");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    send(address, request.body(Empty::<Bytes>::new()).unwrap()).await
}

/// Sends `request` on a connection of its own.
async fn send<B>(address: SocketAddr, request: Request<B>) -> Answer
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(address).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let response = sender.send_request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

async fn get(address: SocketAddr, path: &str) -> Answer {
    get_with(address, path, &[]).await
}

fn app<L, E>(layer: RateLimitLayer<L, E>) -> Router
where
    RateLimitLayer<L, E>: Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    <RateLimitLayer<L, E> as Layer<axum::routing::Route>>::Service: tower::Service<
            axum::extract::Request,
            Response = Response<floodgate::http::ResponseBody<axum::body::Body>>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static,
{
    Router::new()
        .route("/", routing::get(|| async { "hello" }))
        .route("/health", routing::get(|| async { "ok" }))
        .route(
            "/decision",
            routing::get(|Extension(decision): Extension<Decision>| async move {
                format!(
                    "remaining={} delay={}",
                    decision.remaining(),
                    decision.delay_ticks()
                )
            }),
        )
        .layer(layer)
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

const SECOND: u64 = 1_000_000_000;

#[tokio::test]
async fn counts_are_exact_and_every_connection_shares_the_limit() {
    let clock = ManualClock::new(0);
    let limiter = Builder::new(PolicyKind::FixedWindow, 5, Duration::from_secs(60))
        .clock(clock.clone())
        .build::<IpAddr>()
        .unwrap();
    let address = serve(app(RateLimitLayer::new(limiter, PeerIp::new()))).await;

    // Each request on a new connection, so on a new clone of the service.
    let mut answers = Vec::new();
    for _ in 0..8 {
        answers.push(get(address, "/").await);
    }
    let statuses: Vec<u16> = answers.iter().map(|a| a.status.as_u16()).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);

    let first = &answers[0];
    assert_eq!(first.body, "hello");
    assert_eq!(
        first.header("ratelimit-policy"),
        Some(r#""default";q=5;w=60"#)
    );
    assert_eq!(first.header("ratelimit"), Some(r#""default";r=4;t=0"#));
    assert_eq!(first.header("retry-after"), None);
    assert_eq!(first.header("x-ratelimit-limit"), None);
    // The last admission: the window says when more comes, at most.
    assert_eq!(
        answers[4].header("ratelimit"),
        Some(r#""default";r=0;t=60"#)
    );

    let refused = &answers[5];
    assert_eq!(refused.header("retry-after"), Some("60"));
    assert_eq!(refused.header("ratelimit"), Some(r#""default";r=0;t=60"#));
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some(r#""default";q=5;w=60"#)
    );
    assert_eq!(
        refused.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(refused.body, "Too Many Requests: retry after 60 s\n");

    clock.advance(60 * SECOND);
    assert_eq!(get(address, "/").await.status, StatusCode::OK);
}

#[tokio::test]
async fn retry_after_rounds_up_from_one_nanosecond_and_from_one_and_a_half_seconds() {
    // 1 per 2 ns: refused 1 ns before the next window.
    let clock = ManualClock::new(0);
    let limiter = build_with::<IpAddr, _>(
        PolicyKind::FixedWindow,
        Config::per_ticks(1, 2).unwrap(),
        Engine::LockFree,
        clock.clone(),
    )
    .unwrap();
    let address = serve(app(RateLimitLayer::new(limiter, PeerIp::new()))).await;
    assert_eq!(get(address, "/").await.status, StatusCode::OK);
    clock.advance(1);
    let refused = get(address, "/").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.header("ratelimit"), Some(r#""default";r=0;t=1"#));
    // A 2 ns window is not a whole number of seconds: no `w`.
    assert_eq!(refused.header("ratelimit-policy"), Some(r#""default";q=1"#));

    // 1 per 3 s, refused 1.5 s in.
    let clock = ManualClock::new(0);
    let limiter = Builder::new(PolicyKind::FixedWindow, 1, Duration::from_secs(3))
        .clock(clock.clone())
        .build::<IpAddr>()
        .unwrap();
    let layer = RateLimitLayer::new(limiter, PeerIp::new())
        .policy_name("slow")
        .legacy_headers();
    let address = serve(app(layer)).await;
    let admitted = get(address, "/").await;
    assert_eq!(admitted.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(admitted.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(admitted.header("x-ratelimit-reset"), Some("3"));
    clock.advance(SECOND + SECOND / 2);
    let refused = get(address, "/").await;
    assert_eq!(refused.header("retry-after"), Some("2"));
    assert_eq!(refused.header("ratelimit"), Some(r#""slow";r=0;t=2"#));
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some(r#""slow";q=1;w=3"#)
    );
    assert_eq!(refused.header("x-ratelimit-reset"), Some("2"));
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));
}

#[tokio::test]
async fn rejections_can_be_problem_documents_or_the_users_own() {
    let limiter = || {
        Builder::new(PolicyKind::Gcra, 1, Duration::from_secs(10))
            .clock(ManualClock::new(0))
            .build::<IpAddr>()
            .unwrap()
    };
    let address = serve(app(
        RateLimitLayer::new(limiter(), PeerIp::new()).problem_json()
    ))
    .await;
    get(address, "/").await;
    let refused = get(address, "/").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        refused.body,
        r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"retry after 10 s","retry_after":10}"#
    );

    let layer = RateLimitLayer::new(limiter(), PeerIp::new()).on_rejected(|_: &Parts, decision| {
        Response::builder()
            .status(StatusCode::SERVICE_UNAVAILABLE)
            .body(Bytes::from(format!("busy, {} left", decision.remaining())))
            .unwrap()
    });
    let address = serve(app(layer)).await;
    get(address, "/").await;
    let refused = get(address, "/").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.body, "busy, 0 left");
    assert_eq!(refused.header("retry-after"), Some("10"));
    assert_eq!(refused.header("ratelimit"), Some(r#""default";r=0;t=10"#));
}

#[tokio::test]
async fn forwarded_headers_from_untrusted_peers_are_ignored() {
    let limiter = Arc::new(
        Builder::new(PolicyKind::FixedWindow, 2, Duration::from_secs(60))
            .clock(ManualClock::new(0))
            .build::<IpAddr>()
            .unwrap(),
    );
    // The test's peer, 127.0.0.1, is not a trusted proxy.
    let extractor = ForwardedIp::trusting(["10.0.0.0/8"]).unwrap();
    let address = serve(app(RateLimitLayer::new(Arc::clone(&limiter), extractor))).await;
    let spoofs = [
        ("x-forwarded-for", "198.51.100.1"),
        ("forwarded", "for=198.51.100.2"),
        ("x-real-ip", "198.51.100.3"),
    ];
    let mut statuses = Vec::new();
    for spoof in spoofs {
        statuses.push(get_with(address, "/", &[spoof]).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(limiter.tracked_clients(), 1);
    assert_eq!(limiter.peek(&ip("127.0.0.1")), Some(0));
}

#[tokio::test]
async fn trusted_chains_give_the_rightmost_untrusted_address_and_group_ipv6() {
    let limiter = Arc::new(
        Builder::new(PolicyKind::FixedWindow, 10, Duration::from_secs(60))
            .clock(ManualClock::new(0))
            .build::<IpAddr>()
            .unwrap(),
    );
    let extractor = ForwardedIp::trusting(["127.0.0.1", "10.0.0.0/8"]).unwrap();
    let address = serve(app(RateLimitLayer::new(Arc::clone(&limiter), extractor))).await;

    // The client claims 1.2.3.4; the first trusted proxy saw 203.0.113.5.
    get_with(
        address,
        "/",
        &[("x-forwarded-for", "1.2.3.4, 203.0.113.5, 10.0.0.2")],
    )
    .await;
    assert_eq!(limiter.peek(&ip("203.0.113.5")), Some(9));
    assert_eq!(limiter.peek(&ip("1.2.3.4")), None);

    // `Forwarded` wins over `X-Forwarded-For`; IPv6 grouped by /56.
    let forwarded = r#"for="[2001:db8:1:2ff::17]:4711";proto=https, for=10.0.0.3"#;
    get_with(
        address,
        "/",
        &[
            ("forwarded", forwarded),
            ("x-forwarded-for", "198.51.100.9"),
        ],
    )
    .await;
    get_with(address, "/", &[("x-forwarded-for", "2001:db8:1:200::1")]).await;
    assert_eq!(limiter.peek(&ip("2001:db8:1:200::")), Some(8));
    assert_eq!(limiter.peek(&ip("198.51.100.9")), None);

    // X-Real-IP when neither list is there; the peer when nothing is.
    get_with(address, "/", &[("x-real-ip", "192.0.2.44")]).await;
    assert_eq!(limiter.peek(&ip("192.0.2.44")), Some(9));
    get(address, "/").await;
    assert_eq!(limiter.peek(&ip("127.0.0.1")), Some(9));
    // An all-trusted chain: its leftmost address.
    get_with(address, "/", &[("x-forwarded-for", "10.9.9.9, 10.0.0.2")]).await;
    assert_eq!(limiter.peek(&ip("10.9.9.9")), Some(9));
    // A node that is not an address: the proxy that reported it.
    get_with(address, "/", &[("forwarded", "for=_hidden, for=10.0.0.7")]).await;
    assert_eq!(limiter.peek(&ip("10.0.0.7")), Some(9));
}

#[tokio::test]
async fn the_ipv6_prefix_is_configurable() {
    let limiter = Arc::new(
        Builder::new(PolicyKind::FixedWindow, 10, Duration::from_secs(60))
            .clock(ManualClock::new(0))
            .build::<IpAddr>()
            .unwrap(),
    );
    let extractor = ForwardedIp::trusting(["127.0.0.1"])
        .unwrap()
        .ipv6_prefix(64);
    let address = serve(app(RateLimitLayer::new(Arc::clone(&limiter), extractor))).await;
    get_with(address, "/", &[("x-forwarded-for", "2001:db8:1:2ff::17")]).await;
    get_with(address, "/", &[("x-forwarded-for", "2001:db8:1:200::1")]).await;
    assert_eq!(limiter.peek(&ip("2001:db8:1:2ff::")), Some(9));
    assert_eq!(limiter.peek(&ip("2001:db8:1:200::")), Some(9));
}

#[tokio::test]
async fn a_request_without_a_key_is_a_clear_400() {
    let limiter = Arc::new(
        Builder::new(PolicyKind::Gcra, 5, Duration::from_secs(1))
            .clock(ManualClock::new(0))
            .build::<str>()
            .unwrap(),
    );
    let address = serve(app(RateLimitLayer::new(
        Arc::clone(&limiter),
        Header::new("x-api-key"),
    )))
    .await;
    let missing = get(address, "/").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.body,
        "Bad Request: no client key: no header x-api-key\n"
    );
    assert_eq!(missing.header("ratelimit"), None);
    let empty = get_with(address, "/", &[("x-api-key", "")]).await;
    assert_eq!(empty.status, StatusCode::BAD_REQUEST);
    assert_eq!(limiter.tracked_clients(), 0);
    let keyed = get_with(address, "/", &[("x-api-key", "k-1")]).await;
    assert_eq!(keyed.status, StatusCode::OK);
    assert_eq!(keyed.header("ratelimit"), Some(r#""default";r=4;t=0"#));

    // Configurable; and a closure that finds nothing is a missing key too.
    let layer = RateLimitLayer::new(Arc::clone(&limiter), from_fn(|_: &Parts| None::<String>))
        .on_missing_key(|_: &Parts, missing| {
            Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .body(Bytes::from(missing.to_string()))
                .unwrap()
        });
    let address = serve(app(layer)).await;
    let missing = get(address, "/").await;
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    assert_eq!(missing.body, "the request carries no client key");
}

#[tokio::test]
async fn bypassed_requests_are_not_counted_and_get_no_headers() {
    let limiter = Arc::new(
        Builder::new(PolicyKind::FixedWindow, 1, Duration::from_secs(60))
            .clock(ManualClock::new(0))
            .build::<str>()
            .unwrap(),
    );
    let layer = RateLimitLayer::new(Arc::clone(&limiter), Global::new())
        .bypass(|parts: &Parts| parts.uri.path() == "/health");
    let address = serve(app(layer)).await;
    for _ in 0..5 {
        let health = get(address, "/health").await;
        assert_eq!(
            (health.status, health.body.as_str()),
            (StatusCode::OK, "ok")
        );
        assert_eq!(health.header("ratelimit"), None);
        assert_eq!(health.header("ratelimit-policy"), None);
    }
    assert_eq!(limiter.tracked_clients(), 0);
    assert_eq!(get(address, "/").await.status, StatusCode::OK);
    assert_eq!(
        get(address, "/").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(get(address, "/health").await.status, StatusCode::OK);
}

#[tokio::test]
async fn tiers_name_the_policy_by_the_tier() {
    let tiers = Tiers::with_clock(
        "free",
        "fixed-window:2/1m".parse().unwrap(),
        |key: &str| {
            if key.starts_with("pro-") {
                "premium"
            } else {
                "free"
            }
        },
        ManualClock::new(0),
    )
    .unwrap()
    .with_tier("premium", "gcra:100/10s".parse().unwrap())
    .unwrap();
    let address = serve(app(RateLimitLayer::new(tiers, Header::new("x-api-key")))).await;
    let pro = get_with(address, "/", &[("x-api-key", "pro-1")]).await;
    assert_eq!(
        pro.header("ratelimit-policy"),
        Some(r#""premium";q=100;w=10"#)
    );
    assert_eq!(pro.header("ratelimit"), Some(r#""premium";r=99;t=0"#));
    let free = get_with(address, "/", &[("x-api-key", "anon")]).await;
    assert_eq!(free.header("ratelimit-policy"), Some(r#""free";q=2;w=60"#));
    assert_eq!(free.header("ratelimit"), Some(r#""free";r=1;t=0"#));
}

#[tokio::test]
async fn several_rules_send_one_member_each_and_the_refusing_rules_wait() {
    for engine in [Engine::LockFree, Engine::Mutex] {
        several_rules_on(engine).await;
    }
}

async fn several_rules_on(engine: Engine) {
    // 2 a second, and 3 a minute.
    let clock = ManualClock::new(0);
    let limiter = Builder::new(PolicyKind::Gcra, 2, Duration::from_secs(1))
        .and(PolicyKind::FixedWindow, 3, Duration::from_secs(60))
        .engine(engine)
        .clock(clock.clone())
        .build::<IpAddr>()
        .unwrap();
    let layer = RateLimitLayer::new(limiter, PeerIp::new())
        .policy_name("api")
        .legacy_headers();
    let address = serve(app(layer)).await;
    let policy = r#""api-1";q=2;w=1, "api-2";q=3;w=60"#;

    let first = get(address, "/").await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.header("ratelimit-policy"), Some(policy));
    assert_eq!(
        first.header("ratelimit"),
        Some(r#""api-1";r=1;t=0, "api-2";r=2;t=0"#)
    );
    assert_eq!(first.header("retry-after"), None);
    // The legacy headers: the rule with the fewest left.
    assert_eq!(first.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("1"));
    assert_eq!(first.header("x-ratelimit-reset"), Some("0"));

    // The burst's last: its `t` is one interval, 0.5 s rounded up.
    let second = get(address, "/").await;
    assert_eq!(
        second.header("ratelimit"),
        Some(r#""api-1";r=0;t=1, "api-2";r=1;t=0"#)
    );

    // Refused by the burst: the minute's quota is not spent.
    let burst = get(address, "/").await;
    assert_eq!(burst.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(burst.header("retry-after"), Some("1"));
    assert_eq!(
        burst.header("ratelimit"),
        Some(r#""api-1";r=0;t=1, "api-2";r=1;t=0"#)
    );
    assert_eq!(burst.header("x-ratelimit-limit"), Some("2"));

    clock.advance(SECOND);
    let last = get(address, "/").await;
    assert_eq!(last.status, StatusCode::OK);
    assert_eq!(
        last.header("ratelimit"),
        Some(r#""api-1";r=1;t=0, "api-2";r=0;t=60"#)
    );
    assert_eq!(last.header("x-ratelimit-limit"), Some("3"));
    assert_eq!(last.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(last.header("x-ratelimit-reset"), Some("60"));

    // Refused by the minute's quota, which ends 58 s from now; the burst
    // rule alone would admit.
    clock.advance(SECOND);
    let quota = get(address, "/").await;
    assert_eq!(quota.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(quota.body, "Too Many Requests: retry after 58 s\n");
    assert_eq!(quota.header("retry-after"), Some("58"));
    assert_eq!(quota.header("ratelimit-policy"), Some(policy));
    assert_eq!(
        quota.header("ratelimit"),
        Some(r#""api-1";r=2;t=0, "api-2";r=0;t=58"#)
    );
    assert_eq!(quota.header("x-ratelimit-limit"), Some("3"));
    assert_eq!(quota.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(quota.header("x-ratelimit-reset"), Some("58"));
}

/// A plain hyper server that puts the peer's `SocketAddr` in the
/// extensions, as `floodgate proxy` does: no axum in the path.
#[tokio::test]
async fn a_hyper_server_gives_the_peer_as_a_socket_address() {
    let limiter = Builder::new(PolicyKind::FixedWindow, 1, Duration::from_secs(60))
        .clock(ManualClock::new(0))
        .build::<IpAddr>()
        .unwrap();
    let layer = RateLimitLayer::new(limiter, PeerIp::new());
    let service = layer.layer(tower::service_fn(
        |_: Request<hyper::body::Incoming>| async {
            Ok::<_, Infallible>(Response::new(http_body_util::Full::new(Bytes::from(
                "plain",
            ))))
        },
    ));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            let service = service.clone();
            let hyper_service = hyper::service::service_fn(move |mut request| {
                request.extensions_mut().insert(peer);
                service.clone().oneshot(request)
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper_service),
            );
        }
    });
    let first = get(address, "/").await;
    assert_eq!(
        (first.status, first.body.as_str()),
        (StatusCode::OK, "plain")
    );
    assert_eq!(
        get(address, "/").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn the_shaper_reports_each_admissions_delay() {
    // 3 per 3 ms: a queue of 3, one leaving every millisecond. With
    // `nodelay` the layer does not sleep, so the delays it computed are
    // exactly what the handler sees.
    let limiter = Builder::new(PolicyKind::LeakyBucket, 3, Duration::from_millis(3))
        .clock(ManualClock::new(0))
        .build::<IpAddr>()
        .unwrap();
    let address = serve(app(RateLimitLayer::new(limiter, PeerIp::new()).nodelay())).await;
    let mut bodies = Vec::new();
    for _ in 0..4 {
        let answer = get(address, "/decision").await;
        bodies.push(format!("{} {}", answer.status.as_u16(), answer.body));
    }
    assert_eq!(
        bodies,
        [
            "200 remaining=2 delay=0",
            "200 remaining=1 delay=1000000",
            "200 remaining=0 delay=2000000",
            "429 Too Many Requests: retry after 1 s\n",
        ]
    );
}

/// The shaper's sleeps, on tokio's paused clock: each admission waits
/// exactly its delay; beyond the queue, a rejection waits for nothing.
#[tokio::test(start_paused = true)]
async fn the_shaper_sleeps_each_admissions_delay() {
    let limiter = Builder::new(PolicyKind::LeakyBucket, 3, Duration::from_secs(3))
        .clock(ManualClock::new(0))
        .build::<IpAddr>()
        .unwrap();
    let service = RateLimitLayer::new(limiter, PeerIp::new()).layer(tower::service_fn(
        |request: Request<()>| async move {
            let decision = *request.extensions().get::<Decision>().unwrap();
            Ok::<_, Infallible>(Response::new(http_body_util::Full::new(Bytes::from(
                decision.delay_ticks().to_string(),
            ))))
        },
    ));
    let mut waits = Vec::new();
    for _ in 0..4 {
        let mut request = Request::new(());
        request
            .extensions_mut()
            .insert(SocketAddr::from(([192, 0, 2, 1], 4711)));
        let started = tokio::time::Instant::now();
        let response = service.clone().oneshot(request).await.unwrap();
        waits.push((response.status().as_u16(), started.elapsed()));
    }
    assert_eq!(
        waits,
        [
            (200, Duration::ZERO),
            (200, Duration::from_secs(1)),
            (200, Duration::from_secs(2)),
            (429, Duration::ZERO),
        ]
    );
}

/// Every extractor keys from the head alone, so it can be unit-tested on
/// `Parts` without a server.
#[test]
fn extractors_read_the_head() {
    let (mut parts, ()) = Request::get("/").body(()).unwrap().into_parts();
    assert!(PeerIp::new().extract(&parts).is_err());
    parts
        .extensions
        .insert(SocketAddr::from((ip("2001:db8:1:2ff::1"), 1)));
    assert_eq!(PeerIp::new().extract(&parts), Ok(ip("2001:db8:1:200::")));
    assert_eq!(
        PeerIp::new().ipv6_prefix(128).extract(&parts),
        Ok(ip("2001:db8:1:2ff::1"))
    );
    assert_eq!(Global::new().extract(&parts), Ok("global"));
}

#[cfg(feature = "redis")]
#[tokio::test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
async fn the_redis_store_behind_the_layer() {
    use floodgate::redis::{AsyncRedisLimiter, RedisOptions};

    let url = std::env::var("FLOODGATE_REDIS_URL").expect(
        "FLOODGATE_REDIS_URL is not set (e.g. redis://127.0.0.1:6379; .ci/run starts a server)",
    );
    // A prefix of this run's own, so earlier runs' keys do not count.
    let prefix = format!(
        "floodgate-http-test:{}:{}:",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let limiter = AsyncRedisLimiter::new(
        &url,
        PolicyKind::FixedWindow,
        Config::per(3, Duration::from_secs(3600)).unwrap(),
        RedisOptions::new().prefix(prefix),
    )
    .await
    .unwrap();
    let address = serve(app(RateLimitLayer::new(limiter.clone(), PeerIp::new()))).await;
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(get(address, "/").await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    assert_eq!(limiter.faults(), 0, "every decision came from Redis");
    let refused = get(address, "/").await;
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some(r#""default";q=3;w=3600"#)
    );
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&retry), "Retry-After {retry}");

    // `str` keys through a closure, on the same store.
    let layer = RateLimitLayer::new(limiter.clone(), Header::new("x-api-key"));
    let address = serve(app(layer)).await;
    let keyed = get_with(address, "/", &[("x-api-key", "k")]).await;
    assert_eq!(keyed.header("ratelimit"), Some(r#""default";r=2;t=0"#));
}

/// A cost per request, all or nothing: the token bucket holds 10 units; a
/// request of 4 leaves 6, one of 7 is refused whole (nothing is spent), one
/// of 6 takes the rest. Costs in bytes say so in `RateLimit-Policy`.
#[tokio::test]
async fn weighted_requests_spend_their_cost_at_once() {
    let clock = ManualClock::new(0);
    let limiter = Builder::new(PolicyKind::TokenBucket, 10, Duration::from_secs(3_600))
        .clock(clock.clone())
        .build::<IpAddr>()
        .unwrap();
    let layer = RateLimitLayer::new(limiter, PeerIp::new()).cost(|parts| {
        parts
            .headers
            .get("x-units")
            .and_then(|units| units.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    });
    let address = serve(app(layer)).await;
    let first = get_with(address, "/decision", &[("x-units", "4")]).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.header("ratelimit"), Some(r#""default";r=6;t=0"#));
    let refused = get_with(address, "/decision", &[("x-units", "7")]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused
            .header("ratelimit")
            .map(|h| h.starts_with(r#""default";r=6;"#)),
        Some(true)
    );
    let rest = get_with(address, "/decision", &[("x-units", "6")]).await;
    assert_eq!(rest.status, StatusCode::OK);
    assert_eq!(rest.body, "remaining=0 delay=0");

    let bytes = Builder::new(PolicyKind::TokenBucket, 1_000_000, Duration::from_secs(1))
        .clock(clock)
        .build::<IpAddr>()
        .unwrap();
    let address = serve(app(
        RateLimitLayer::new(bytes, PeerIp::new()).cost_in_content_bytes()
    ))
    .await;
    let answer = get(address, "/").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        answer.header("ratelimit-policy"),
        Some(r#""default";q=1000000;qu="content-bytes";w=1"#)
    );
}

/// One GET of `path` carrying a body of `length` bytes (with its
/// `Content-Length`), on a connection of its own.
async fn get_with_body(address: SocketAddr, path: &str, length: usize) -> Answer {
    let request = Request::get(path)
        .header("host", "127.0.0.1")
        .header("content-length", length)
        .body(http_body_util::Full::new(Bytes::from(vec![b'x'; length])))
        .unwrap();
    send(address, request).await
}

/// A body larger than a bytes limit can never pass: `413`, and no
/// `Retry-After` or reset the limiter could not honour. A body that fits
/// the limit but not what is left waits, as any request.
#[tokio::test]
async fn a_body_over_the_bytes_limit_is_413_without_a_retry_after() {
    let limiter = Builder::new(PolicyKind::TokenBucket, 1_000, Duration::from_secs(1))
        .clock(ManualClock::new(0))
        .build::<IpAddr>()
        .unwrap();
    let address = serve(app(
        RateLimitLayer::new(limiter, PeerIp::new()).cost_in_content_bytes()
    ))
    .await;
    let too_large = get_with_body(address, "/", 5_000).await;
    assert_eq!(too_large.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(too_large.header("retry-after"), None);
    assert_eq!(
        too_large.body,
        "Payload Too Large: the body's 5000 bytes are more than the limit of 1000\n"
    );
    assert_eq!(too_large.header("ratelimit"), Some(r#""default";r=1000"#));
    let fits = get_with_body(address, "/", 600).await;
    assert_eq!(fits.status, StatusCode::OK);
    let later = get_with_body(address, "/", 600).await;
    assert_eq!(later.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(later.header("retry-after"), Some("1"));
}

/// Any other cost above the limit: `429` with no `Retry-After`.
#[tokio::test]
async fn a_cost_above_the_limit_is_429_without_a_retry_after() {
    let limiter = Builder::new(PolicyKind::Gcra, 10, Duration::from_secs(1))
        .clock(ManualClock::new(0))
        .build::<IpAddr>()
        .unwrap();
    let layer = RateLimitLayer::new(limiter, PeerIp::new()).cost(|parts| {
        parts
            .headers
            .get("x-units")
            .and_then(|units| units.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    });
    let address = serve(app(layer)).await;
    let never = get_with(address, "/", &[("x-units", "11")]).await;
    assert_eq!(never.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(never.header("retry-after"), None);
    assert_eq!(
        never.body,
        "Too Many Requests: this request costs 11, more than the limit of 10: \
         it can never be admitted\n"
    );
    assert_eq!(
        get_with(address, "/", &[("x-units", "10")]).await.status,
        StatusCode::OK
    );
}

/// A registry that refuses unknown tiers answers a resolver's misspelt tier
/// as the server's fault, with no rate-limit headers naming another tier.
#[tokio::test]
async fn an_unknown_tier_refused_is_the_servers_500() {
    let tiers = Tiers::with_clock(
        "free",
        "fixed-window:2/1m".parse().unwrap(),
        |key: &str| {
            if key.starts_with("pro-") {
                "premuim"
            } else {
                "free"
            }
        },
        ManualClock::new(0),
    )
    .unwrap()
    .with_tier("premium", "gcra:100/10s".parse().unwrap())
    .unwrap()
    .reject_unknown_tiers();
    let address = serve(app(RateLimitLayer::new(tiers, Header::new("x-api-key")))).await;
    let misspelt = get_with(address, "/", &[("x-api-key", "pro-1")]).await;
    assert_eq!(misspelt.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(misspelt.header("retry-after"), None);
    assert_eq!(misspelt.header("ratelimit"), None);
    assert_eq!(misspelt.header("ratelimit-policy"), None);
    assert_eq!(
        misspelt.body,
        "Internal Server Error: the rate limiter's resolver named a tier the registry lacks \
         (the server's log names it): add the tier to the registry (Tiers::with_tier), or \
         leave out Tiers::reject_unknown_tiers to answer unknown tiers by the default tier\n"
    );
    let free = get_with(address, "/", &[("x-api-key", "anon")]).await;
    assert_eq!(free.status, StatusCode::OK);
}

/// The registry of the issue's proxy example: `free` 2 an hour, `premium`
/// 5, the tier named by the request.
fn plans() -> Tiers<String, impl floodgate::tiers::Resolver<str>, ManualClock> {
    Tiers::with_clock(
        "free",
        "gcra:2/1h".parse().unwrap(),
        |_: &str| "free",
        ManualClock::new(0),
    )
    .unwrap()
    .with_tier("premium", "gcra:5/1h".parse().unwrap())
    .unwrap()
}

/// How many of `tries` requests of `key` naming `plan` (if any) get
/// through, and the last answer's `RateLimit-Policy`.
async fn admitted_of(
    address: SocketAddr,
    key: &str,
    plan: Option<&str>,
    tries: usize,
) -> (usize, Option<String>) {
    let mut admitted = 0;
    let mut policy = None;
    for _ in 0..tries {
        let mut headers = vec![("x-key", key)];
        headers.extend(plan.map(|plan| ("x-plan", plan)));
        let answer = get_with(address, "/", &headers).await;
        admitted += usize::from(answer.status == StatusCode::OK);
        policy = answer.header("ratelimit-policy").map(str::to_owned);
    }
    (admitted, policy)
}

/// The request names its tier: each plan gets its own limit and its
/// headers name it; a misspelt plan is counted and answered by the default
/// tier, which its headers then name; no plan at all is the resolver's
/// choice.
#[tokio::test]
async fn the_request_chooses_its_tier() {
    let tiers = std::sync::Arc::new(plans());
    let layer = RateLimitLayer::new(tiers.clone(), Header::new("x-key")).tier_header("x-plan");
    let address = serve(app(layer)).await;
    let free = admitted_of(address, "a", Some("free"), 4).await;
    assert_eq!(free, (2, Some(r#""free";q=2;w=3600"#.to_owned())));
    let premium = admitted_of(address, "b", Some("premium"), 7).await;
    assert_eq!(premium, (5, Some(r#""premium";q=5;w=3600"#.to_owned())));
    let misspelt = admitted_of(address, "c", Some("premum"), 4).await;
    assert_eq!(misspelt, (2, Some(r#""free";q=2;w=3600"#.to_owned())));
    assert_eq!(tiers.unknown_tier_calls(), 4);
    let unnamed = admitted_of(address, "d", None, 3).await;
    assert_eq!(unnamed.0, 2);
    // The tier named is the state's: client "b" has none in "free" yet.
    assert_eq!(admitted_of(address, "b", Some("free"), 3).await.0, 2);
}

/// A tier named for a registry that refuses unknown ones, or for a
/// limiter without tiers, is the server's 500, saying what to fix.
#[tokio::test]
async fn a_named_tier_that_cannot_apply_is_a_500_saying_what_to_fix() {
    let strict = plans().reject_unknown_tiers();
    let address = serve(app(
        RateLimitLayer::new(strict, Header::new("x-key")).tier_header("x-plan")
    ))
    .await;
    let misspelt = get_with(address, "/", &[("x-key", "a"), ("x-plan", "premum")]).await;
    assert_eq!(misspelt.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        misspelt.body.contains(r#"no tier "premum""#),
        "{}",
        misspelt.body
    );
    assert_eq!(misspelt.header("ratelimit"), None);
    let known = get_with(address, "/", &[("x-key", "a"), ("x-plan", "premium")]).await;
    assert_eq!(known.status, StatusCode::OK);

    let untiered = Builder::new(PolicyKind::Gcra, 10, Duration::from_secs(1))
        .clock(ManualClock::new(0))
        .build::<str>()
        .unwrap();
    let address = serve(app(
        RateLimitLayer::new(untiered, Header::new("x-key")).tier_header("x-plan")
    ))
    .await;
    let named = get_with(address, "/", &[("x-key", "a"), ("x-plan", "free")]).await;
    assert_eq!(named.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(named.body.contains("has no tiers"), "{}", named.body);
    let unnamed = get_with(address, "/", &[("x-key", "a")]).await;
    assert_eq!(unnamed.status, StatusCode::OK);
}

/// A server that gives no peer address is misconfigured, whatever the
/// client sends: `500`, never a `400` that blames the client, and every
/// request is answered so (the log names the fix, once).
#[tokio::test]
async fn a_server_without_peer_addresses_is_a_500() {
    let limiter = Builder::new(PolicyKind::Gcra, 10, Duration::from_secs(1))
        .clock(ManualClock::new(0))
        .build::<IpAddr>()
        .unwrap();
    let app = app(RateLimitLayer::new(limiter.clone(), PeerIp::new()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    // Served without `into_make_service_with_connect_info`.
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    for _ in 0..2 {
        let answer = get(address, "/").await;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            answer.body,
            "Internal Server Error: the rate limiter cannot key requests: the server did not \
             give the peer's address: with axum, serve \
             `app.into_make_service_with_connect_info::<SocketAddr>()`; with hyper, insert the \
             connection's `SocketAddr` in each request's extensions\n"
        );
    }
    assert_eq!(limiter.tracked_clients(), 0);
}

/// The `http` feature brings `floodgate::wait` with it: a service that
/// limits requests may also wait for an admission, with no second feature
/// to find.
#[tokio::test]
async fn the_http_feature_brings_waiting() {
    use floodgate::policy::Policy as _;
    let limiter = floodgate::Limiter::with_clock(
        floodgate::policy::Gcra::new(floodgate::Config::per_ticks(1, 1_000).unwrap()).unwrap(),
        floodgate::ManualClock::new(0),
    )
    .unwrap();
    let admitted = floodgate::wait::until_ready(&limiter, &1u64).await;
    assert!(admitted.is_ok_and(|decision| decision.allowed()));
}

// Giving units back -------------------------------------------------------------

/// A token bucket of 10 units an hour on a manual clock, keyed by `str`.
fn bucket_of_ten() -> Arc<dyn RateLimiter<str>> {
    build_with::<str, _>(
        PolicyKind::TokenBucket,
        Config::per_ticks(10, 3_600).unwrap(),
        Engine::LockFree,
        ManualClock::new(0),
    )
    .unwrap()
}

/// A request of client `a` costing `units`, answered `status`, whose
/// service says it used `used` units.
fn request(units: u64, status: u16, used: u64) -> Request<Empty<Bytes>> {
    Request::get("/")
        .header("x-key", "a")
        .header("x-units", units.to_string())
        .header("x-status", status.to_string())
        .header("x-used", used.to_string())
        .body(Empty::new())
        .unwrap()
}

/// The layer over a service that answers each request's `x-status` with
/// its `x-used` echoed and a body, each request costing its `x-units`.
fn echo_service(
    layer: RateLimitLayer<Arc<dyn RateLimiter<str>>, Header>,
) -> impl tower::Service<
    Request<Empty<Bytes>>,
    Response = Response<floodgate::http::ResponseBody<http_body_util::Full<Bytes>>>,
    Error = Infallible,
> {
    let number = |parts: &Parts, name: &str| -> u64 {
        parts.headers[name].to_str().unwrap().parse().unwrap()
    };
    let layer = layer.cost(move |parts| number(parts, "x-units"));
    layer.layer(tower::service_fn(
        move |request: Request<Empty<Bytes>>| async move {
            let (parts, _) = request.into_parts();
            let status = StatusCode::from_u16(number(&parts, "x-status") as u16).unwrap();
            let response = Response::builder()
                .status(status)
                .header("x-used", parts.headers["x-used"].clone())
                .body(http_body_util::Full::new(Bytes::from_static(b"streamed")))
                .unwrap();
            Ok::<_, Infallible>(response)
        },
    ))
}

/// A 5xx gives its units back whole; a 4xx or a 200 keeps them. The
/// response's headers are the admitting check's; the next request sees
/// the units back.
#[tokio::test]
async fn a_failed_responses_units_come_back() {
    let limiter = bucket_of_ten();
    let layer = RateLimitLayer::new(Arc::clone(&limiter), Header::new("x-key"))
        .refund_on(|status| status.is_server_error());
    let service = echo_service(layer);
    let failed = service.oneshot(request(4, 503, 0)).await.unwrap();
    assert_eq!(failed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(failed.headers()["ratelimit"], r#""default";r=6;t=0"#);
    assert_eq!(limiter.remaining_at("a", 0), 10);
    let layer = RateLimitLayer::new(Arc::clone(&limiter), Header::new("x-key"))
        .refund_on(|status| status.is_server_error());
    let service = echo_service(layer);
    let not_found = service.oneshot(request(3, 404, 0)).await.unwrap();
    assert_eq!(not_found.status(), StatusCode::NOT_FOUND);
    assert_eq!(limiter.remaining_at("a", 0), 7);
}

/// A request whose future is dropped before its response gives its units
/// back with `refund_cancelled`, and keeps them without it.
#[tokio::test]
async fn a_cancelled_request_gives_back_only_when_asked() {
    for cancelled in [false, true] {
        let limiter = bucket_of_ten();
        let mut layer = RateLimitLayer::new(Arc::clone(&limiter), Header::new("x-key")).cost(|_| 4);
        if cancelled {
            layer = layer.refund_cancelled();
        }
        let never = tower::service_fn(|_: Request<Empty<Bytes>>| {
            std::future::pending::<Result<Response<Empty<Bytes>>, Infallible>>()
        });
        let mut call = Box::pin(layer.layer(never).oneshot(request(4, 200, 0)));
        // One poll: the check runs and the request reaches the service,
        // which never answers; then the client goes away.
        std::future::poll_fn(|cx| {
            assert!(std::future::Future::poll(call.as_mut(), cx).is_pending());
            std::task::Poll::Ready(())
        })
        .await;
        assert_eq!(limiter.remaining_at("a", 0), 6);
        drop(call);
        let expected = if cancelled { 10 } else { 6 };
        assert_eq!(
            limiter.remaining_at("a", 0),
            expected,
            "cancelled {cancelled}"
        );
    }
}

/// A reservation settles at the end of the body, not when its headers go
/// out: admitted at 8, the response says it used 3, and the 5 come back
/// once the body is read (or dropped unread, the client gone). A response
/// that says it used more gives nothing back.
#[tokio::test]
async fn a_reservation_gives_back_what_the_body_did_not_use() {
    let limiter = bucket_of_ten();
    let used = |response: &http::response::Parts| -> Option<u64> {
        response.headers.get("x-used")?.to_str().ok()?.parse().ok()
    };
    let layer = RateLimitLayer::new(Arc::clone(&limiter), Header::new("x-key")).settle_with(used);
    let response = echo_service(layer)
        .oneshot(request(8, 200, 3))
        .await
        .unwrap();
    assert_eq!(
        limiter.remaining_at("a", 0),
        2,
        "not yet: the body is unread"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, Bytes::from_static(b"streamed"));
    assert_eq!(limiter.remaining_at("a", 0), 7);

    let layer = RateLimitLayer::new(Arc::clone(&limiter), Header::new("x-key")).settle_with(used);
    let response = echo_service(layer)
        .oneshot(request(6, 200, 2))
        .await
        .unwrap();
    assert_eq!(limiter.remaining_at("a", 0), 1);
    drop(response);
    assert_eq!(limiter.remaining_at("a", 0), 5, "settled when dropped");

    let layer = RateLimitLayer::new(Arc::clone(&limiter), Header::new("x-key")).settle_with(used);
    let response = echo_service(layer)
        .oneshot(request(2, 200, 9))
        .await
        .unwrap();
    drop(response);
    assert_eq!(limiter.remaining_at("a", 0), 3, "used more than reserved");
}

/// The Redis store gives units back through the layer as the in-memory
/// engines do: a 5xx's units inline, before its response is handed on; a
/// reservation's unused units and a cancelled request's units from the
/// body's end and the future's drop, where nothing can await, so the layer
/// sends those refunds on a task of their own (awaited here by reading the
/// client's count until it shows them).
#[cfg(feature = "redis")]
#[tokio::test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
async fn the_redis_store_gives_units_back_behind_the_layer() {
    use floodgate::redis::{AsyncRedisLimiter, RedisOptions};

    let url = std::env::var("FLOODGATE_REDIS_URL").expect(
        "FLOODGATE_REDIS_URL is not set (e.g. redis://127.0.0.1:6379; .ci/run starts a server)",
    );
    let prefix = format!("floodgate-http-refund-test:{}:", std::process::id());
    // Ten units an hour: one drips back every six minutes, none while the
    // test runs.
    let limiter = AsyncRedisLimiter::new(
        &url,
        PolicyKind::TokenBucket,
        Config::per(10, Duration::from_secs(3600)).unwrap(),
        RedisOptions::new().prefix(prefix.clone()),
    )
    .await
    .unwrap();
    let _ = limiter.try_forget("a").await;
    let number = |parts: &Parts, name: &str| -> u64 {
        parts.headers[name].to_str().unwrap().parse().unwrap()
    };
    let used = |response: &http::response::Parts| -> Option<u64> {
        response.headers.get("x-used")?.to_str().ok()?.parse().ok()
    };
    let layer = RateLimitLayer::new(limiter.clone(), Header::new("x-key"))
        .cost(move |parts| number(parts, "x-units"))
        .refund_on(|status| status.is_server_error())
        .refund_cancelled()
        .settle_with(used);
    // Answers `x-status` with `x-used` echoed, or never when `x-status` is
    // 0 (and then says it has the request).
    let reached = Arc::new(tokio::sync::Notify::new());
    let reaching = Arc::clone(&reached);
    let service = layer.layer(tower::service_fn(move |request: Request<Empty<Bytes>>| {
        let reaching = Arc::clone(&reaching);
        async move {
            let (parts, _) = request.into_parts();
            let status = number(&parts, "x-status") as u16;
            if status == 0 {
                reaching.notify_one();
                std::future::pending::<()>().await;
            }
            let response = Response::builder()
                .status(StatusCode::from_u16(status).unwrap())
                .header("x-used", parts.headers["x-used"].clone())
                .body(http_body_util::Full::new(Bytes::from_static(b"streamed")))
                .unwrap();
            Ok::<_, Infallible>(response)
        }
    }));
    // Reads the client's count until it is `expected` (a refund on a task
    // of its own lands a moment after the event that sent it).
    let settles_at = |expected: u64, what: &'static str| {
        let limiter = limiter.clone();
        async move {
            let mut last = None;
            for _ in 0..500 {
                let now = limiter.try_remaining("a").await.unwrap();
                if now == expected {
                    return;
                }
                last = Some(now);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("{what}: the client's count stayed {last:?}, not {expected}");
        }
    };

    let failed = service.clone().oneshot(request(4, 503, 0)).await.unwrap();
    assert_eq!(failed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        limiter.try_remaining("a").await.unwrap(),
        10,
        "a 5xx gives back before its response is handed on"
    );

    let reserved = service.clone().oneshot(request(8, 200, 3)).await.unwrap();
    assert_eq!(limiter.try_remaining("a").await.unwrap(), 2);
    let body = reserved.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, Bytes::from_static(b"streamed"));
    settles_at(7, "a reservation that used 3 of 8").await;

    // Driven until the service has it (the check went to Redis and
    // admitted), then dropped: the client went away.
    let mut call = Box::pin(service.clone().oneshot(request(4, 0, 0)));
    tokio::select! {
        _ = &mut call => panic!("the service never answers"),
        () = reached.notified() => {}
    }
    assert_eq!(limiter.try_remaining("a").await.unwrap(), 3);
    drop(call);
    settles_at(7, "a request cancelled before its response").await;
    assert_eq!(limiter.faults(), 0, "every call reached Redis");
    let _ = limiter.try_forget("a").await;
}

// Tiers of several rules, keys of any type, and who named a tier ----------------

/// A tier of several rules sends one member per rule, `TIER-1`, `TIER-2`,
/// each from that rule's own answer, as a limiter's rules do; a tier of
/// one rule keeps its plain name, as a limiter of one rule does. The same
/// when the request names the tier (`tier_header`).
#[tokio::test]
async fn a_tier_of_several_rules_sends_one_member_per_rule() {
    let clock = ManualClock::new(0);
    // 2 a second and 3 a minute for free; 100 in 10 s for pro.
    let tiers = Tiers::with_clock_rules(
        "free",
        "gcra:2/1s,fixed-window:3/1m".parse().unwrap(),
        |key: &str| {
            if key.starts_with("pro-") {
                "pro"
            } else {
                "free"
            }
        },
        clock.clone(),
    )
    .unwrap()
    .with_tier("pro", "gcra:100/10s".parse().unwrap())
    .unwrap();
    let layer = RateLimitLayer::new(tiers, Header::new("x-api-key"))
        .tier_header("x-plan")
        .legacy_headers();
    let address = serve(app(layer)).await;
    let policy = r#""free-1";q=2;w=1, "free-2";q=3;w=60"#;

    let first = get_with(address, "/", &[("x-api-key", "a")]).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.header("ratelimit-policy"), Some(policy));
    assert_eq!(
        first.header("ratelimit"),
        Some(r#""free-1";r=1;t=0, "free-2";r=2;t=0"#)
    );
    // The legacy headers: the rule with the fewest left.
    assert_eq!(first.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("1"));

    // Named by the request: the same members.
    let named = get_with(address, "/", &[("x-api-key", "a"), ("x-plan", "free")]).await;
    assert_eq!(named.header("ratelimit-policy"), Some(policy));
    assert_eq!(
        named.header("ratelimit"),
        Some(r#""free-1";r=0;t=1, "free-2";r=1;t=0"#)
    );

    // Refused by the burst, whose member says when; the minute's quota
    // is not spent.
    let burst = get_with(address, "/", &[("x-api-key", "a")]).await;
    assert_eq!(burst.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(burst.header("retry-after"), Some("1"));
    assert_eq!(
        burst.header("ratelimit"),
        Some(r#""free-1";r=0;t=1, "free-2";r=1;t=0"#)
    );

    // The minute's last, then its refusal 58 s before the window ends.
    clock.advance(SECOND);
    let last = get_with(address, "/", &[("x-api-key", "a")]).await;
    assert_eq!(
        last.header("ratelimit"),
        Some(r#""free-1";r=1;t=0, "free-2";r=0;t=60"#)
    );
    clock.advance(SECOND);
    let quota = get_with(address, "/", &[("x-api-key", "a")]).await;
    assert_eq!(quota.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(quota.header("retry-after"), Some("58"));
    assert_eq!(
        quota.header("ratelimit"),
        Some(r#""free-1";r=2;t=0, "free-2";r=0;t=58"#)
    );
    assert_eq!(quota.header("x-ratelimit-limit"), Some("3"));

    // One rule: the tier's plain name, by resolver or by request.
    for headers in [
        &[("x-api-key", "pro-1")][..],
        &[("x-api-key", "b"), ("x-plan", "pro")],
    ] {
        let pro = get_with(address, "/", headers).await;
        assert_eq!(
            pro.header("ratelimit-policy"),
            Some(r#""pro";q=100;w=10"#),
            "{headers:?}"
        );
        assert_eq!(
            pro.header("ratelimit"),
            Some(r#""pro";r=99;t=0"#),
            "{headers:?}"
        );
    }
}

/// A registry of `IpAddr` clients built with `Tiers::new`, no key type or
/// clock named, goes behind `PeerIp` (the key type comes from the
/// layer's use of it).
#[tokio::test]
async fn tiers_new_keys_by_address_behind_peer_ip() {
    let loopback: IpAddr = "127.0.0.1".parse().unwrap();
    // 2 an hour: no drip while the test runs, so the counts are exact on
    // the default clock.
    let tiers = Tiers::new(
        "anonymous",
        "gcra:2/1h".parse().unwrap(),
        move |ip: &IpAddr| {
            if ip.is_loopback() {
                "local"
            } else {
                "anonymous"
            }
        },
    )
    .with_tier("local", "gcra:3/1h".parse().unwrap())
    .unwrap();
    let tiers = Arc::new(tiers);
    let address = serve(app(RateLimitLayer::new(Arc::clone(&tiers), PeerIp::new()))).await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let answer = get(address, "/").await;
        assert_eq!(
            answer.header("ratelimit-policy"),
            Some(r#""local";q=3;w=3600"#)
        );
        statuses.push(answer.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(tiers.peek_at(&loopback, tiers.now()), Some(0));
    assert_eq!(tiers.tracked_clients(), 1);
}

/// A service that answers each request with a body, and `x-used-tokens`
/// as the request's `x-used` asks (none when it has none).
fn tokens_service(
    layer: RateLimitLayer<Arc<dyn RateLimiter<str>>, Header>,
) -> impl tower::Service<
    Request<Empty<Bytes>>,
    Response = Response<floodgate::http::ResponseBody<http_body_util::Full<Bytes>>>,
    Error = Infallible,
> {
    layer.layer(tower::service_fn(
        move |request: Request<Empty<Bytes>>| async move {
            let mut response = Response::builder();
            for used in request.headers().get_all("x-used") {
                response = response.header("x-used-tokens", used.clone());
            }
            let body = http_body_util::Full::new(Bytes::from_static(b"streamed"));
            Ok::<_, Infallible>(response.body(body).unwrap())
        },
    ))
}

/// A request of client `a` with the headers `headers`.
fn tokens_request(headers: &[(&str, &str)]) -> Request<Empty<Bytes>> {
    let mut request = Request::get("/").header("x-key", "a");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Empty::new()).unwrap()
}

/// `cost_from_header`: the header's whole number is the cost; a request
/// whose header is missing, repeated or not a whole number is a 400 that
/// names the header and what was wrong, answered before the check: the
/// limiter has no state of the client, and nothing is spent.
#[tokio::test]
async fn a_cost_header_missing_or_bad_is_a_400_before_anything_is_spent() {
    let limiter = bucket_of_ten();
    let layer = || {
        RateLimitLayer::new(Arc::clone(&limiter), Header::new("x-key"))
            .cost_from_header("x-max-tokens")
    };
    let cases: [(&[(&str, &str)], &str); 5] = [
        (&[], "which it lacks"),
        (
            &[("x-max-tokens", "12.5")],
            r#"whose value "12.5" is not a whole number"#,
        ),
        (
            &[("x-max-tokens", "-3")],
            r#"whose value "-3" is not a whole number"#,
        ),
        (
            &[("x-max-tokens", "99999999999999999999")],
            r#"whose value "99999999999999999999" is more than 18446744073709551615"#,
        ),
        (
            &[("x-max-tokens", "2"), ("x-max-tokens", "3")],
            "which it sends 2 times",
        ),
    ];
    for (headers, why) in cases {
        let response = tokens_service(layer())
            .oneshot(tokens_request(headers))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{headers:?}");
        assert_eq!(response.headers().get("ratelimit"), None);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            body,
            format!("Bad Request: the request's cost is its header x-max-tokens, {why}\n"),
            "{headers:?}"
        );
        assert_eq!(limiter.tracked_clients(), 0, "{headers:?}: no state made");
        assert_eq!(limiter.peek_at("a", 0), None, "{headers:?}");
    }

    // As a problem document too.
    let response = tokens_service(layer().problem_json())
        .oneshot(tokens_request(&[("x-max-tokens", "lots")]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        body,
        r#"{"type":"about:blank","title":"Bad Request","status":400,"detail":"the request's cost is its header x-max-tokens, whose value \"lots\" is not a whole number"}"#
    );
    assert_eq!(limiter.tracked_clients(), 0);

    // A whole number is the cost, spent all at once.
    let response = tokens_service(layer())
        .oneshot(tokens_request(&[("x-max-tokens", "7")]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["ratelimit"], r#""default";r=3;t=0"#);
    assert_eq!(limiter.remaining_at("a", 0), 3);
    // A cost above what is left is refused, and spends nothing.
    let response = tokens_service(layer())
        .oneshot(tokens_request(&[("x-max-tokens", "4")]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limiter.remaining_at("a", 0), 3);
}

/// `settle_from_header`: admitted at `x-max-tokens`, the request gets back
/// what the response's `x-used-tokens` says it did not use, once the body
/// has ended. A response without the header keeps the whole cost, as
/// `settle_with`'s `None` does; so does one whose header is bad (the
/// service's fault, logged); a figure above the cost gives nothing back.
#[tokio::test]
async fn the_units_used_header_settles_a_reservation_at_the_end_of_the_body() {
    let limiter = bucket_of_ten();
    let layer = || {
        RateLimitLayer::new(Arc::clone(&limiter), Header::new("x-key"))
            .cost_from_header("x-max-tokens")
            .settle_from_header("x-used-tokens")
    };
    let reserve = |max: &'static str, used: Option<&'static str>| {
        let mut headers = vec![("x-max-tokens", max)];
        headers.extend(used.map(|used| ("x-used", used)));
        tokens_service(layer()).oneshot(tokens_request(&headers))
    };

    let response = reserve("8", Some("3")).await.unwrap();
    assert_eq!(
        limiter.remaining_at("a", 0),
        2,
        "not yet: the body is unread"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, Bytes::from_static(b"streamed"));
    assert_eq!(limiter.remaining_at("a", 0), 7, "5 of 8 unused came back");

    // Said nothing: the whole cost kept.
    drop(reserve("2", None).await.unwrap());
    assert_eq!(limiter.remaining_at("a", 0), 5);
    // A bad figure: the whole cost kept (and logged once).
    drop(reserve("2", Some("one")).await.unwrap());
    assert_eq!(limiter.remaining_at("a", 0), 3);
    // Used more than reserved: nothing back.
    drop(reserve("1", Some("9")).await.unwrap());
    assert_eq!(limiter.remaining_at("a", 0), 2);
    // Used none: all back, when dropped unread (the client gone).
    drop(reserve("2", Some("0")).await.unwrap());
    assert_eq!(limiter.remaining_at("a", 0), 2);
}

/// What a subscriber printed, for the warnings' wording.
#[derive(Clone, Default)]
struct Printed(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Printed {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Printed {
    /// A subscriber for this thread that prints here.
    fn subscribe(&self) -> tracing::subscriber::DefaultGuard {
        let printed = self.clone();
        tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_writer(move || printed.clone())
                .with_ansi(false)
                .finish(),
        )
    }

    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// A tier name the registry lacks is said to come from where it came
/// from: the header `tier_header` reads, in the warning and in the 500;
/// the layer's `tier_from`; the registry's resolver.
#[tokio::test]
async fn an_unknown_tiers_warning_and_500_say_what_named_it() {
    let printed = Printed::default();
    let _subscribed = printed.subscribe();

    let layer = RateLimitLayer::new(plans(), Header::new("x-key")).tier_header("x-plan");
    let response = echo_of(layer, &[("x-key", "a"), ("x-plan", "premum")]).await;
    assert_eq!(response.0, StatusCode::OK, "answered by the default tier");
    assert!(
        printed.text().contains(
            r#"floodgate: the request's header x-plan named a tier the registry lacks, "premum": its calls are answered by the default tier "free""#
        ),
        "{}",
        printed.text()
    );

    let layer =
        RateLimitLayer::new(plans(), Header::new("x-key")).tier_from(|_| Some("gold".into()));
    echo_of(layer, &[("x-key", "a")]).await;
    assert!(
        printed.text().contains(
            r#"floodgate: the layer's tier_from named a tier the registry lacks, "gold""#
        ),
        "{}",
        printed.text()
    );

    let resolved = Tiers::with_clock(
        "free",
        "gcra:2/1h".parse().unwrap(),
        |_: &str| "silver",
        ManualClock::new(0),
    )
    .unwrap();
    echo_of(
        RateLimitLayer::new(resolved, Header::new("x-key")),
        &[("x-key", "a")],
    )
    .await;
    assert!(
        printed
            .text()
            .contains(r#"floodgate: the resolver named a tier the registry lacks, "silver""#),
        "{}",
        printed.text()
    );

    // Refused: the 500 says the header, and what to change.
    let strict = RateLimitLayer::new(plans().reject_unknown_tiers(), Header::new("x-key"))
        .tier_header("x-plan");
    let (status, body) = echo_of(strict, &[("x-key", "a"), ("x-plan", "premum")]).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        body,
        "Internal Server Error: the rate limiter has no tier \"premum\", which the request's \
         header x-plan named for this request: add the tier to the registry \
         (Tiers::with_tier), or leave out Tiers::reject_unknown_tiers to answer unknown \
         tiers by the default tier\n"
    );
    let untiered = Builder::new(PolicyKind::Gcra, 10, Duration::from_secs(1))
        .clock(ManualClock::new(0))
        .build::<str>()
        .unwrap();
    let (status, body) = echo_of(
        RateLimitLayer::new(untiered, Header::new("x-key")).tier_header("x-plan"),
        &[("x-key", "a"), ("x-plan", "free")],
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        body,
        "Internal Server Error: the request's header x-plan named the tier \"free\" for this \
         request, but the layer's limiter has no tiers: give the layer a Tiers registry\n"
    );
}

/// The status and body `layer` answers a request with `headers`, over a
/// service that answers "ok".
async fn echo_of<L, E>(
    layer: RateLimitLayer<L, E>,
    headers: &[(&str, &str)],
) -> (StatusCode, String)
where
    E: KeyExtractor,
    L: floodgate::http::AsyncLimiter<<E::Key as floodgate::http::Key>::Query> + 'static,
{
    let ok = tower::service_fn(|_: Request<Empty<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
    });
    let mut request = Request::get("/");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = layer
        .layer(ok)
        .oneshot(request.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// One admission, one refund at most its cost, whatever the layer is asked:
/// with a refund on 5xx, on cancellation and a settle all on, a 503 that
/// says it used nothing gives its 4 back once (not again when its body
/// ends), and a settled response never more than it was admitted for,
/// while another request's units stay spent.
#[tokio::test]
async fn an_admission_gives_back_at_most_its_cost_once_through_the_layer() {
    let limiter = bucket_of_ten();
    let used = |response: &http::response::Parts| -> Option<u64> {
        response.headers.get("x-used")?.to_str().ok()?.parse().ok()
    };
    let everything = || {
        RateLimitLayer::new(Arc::clone(&limiter), Header::new("x-key"))
            .refund_on(|status| status.is_server_error())
            .refund_cancelled()
            .settle_with(used)
    };
    // Another request's 5 units, kept (it used them all).
    let kept = echo_service(everything())
        .oneshot(request(5, 200, 5))
        .await
        .unwrap();
    drop(kept.into_body().collect().await.unwrap());
    assert_eq!(limiter.remaining_at("a", 0), 5);
    // A failed one: its 4 come back once, its body's end gives no more.
    let failed = echo_service(everything())
        .oneshot(request(4, 503, 0))
        .await
        .unwrap();
    assert_eq!(limiter.remaining_at("a", 0), 5, "its own 4, at once");
    drop(failed.into_body().collect().await.unwrap());
    assert_eq!(limiter.remaining_at("a", 0), 5, "not twice");
    // A settled one that says it used none: its own 3, not the others'.
    let settled = echo_service(everything())
        .oneshot(request(3, 200, 0))
        .await
        .unwrap();
    assert_eq!(limiter.remaining_at("a", 0), 2);
    drop(settled);
    assert_eq!(limiter.remaining_at("a", 0), 5, "its own 3, once");
}
