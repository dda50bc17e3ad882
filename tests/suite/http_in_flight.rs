//! `in-flight` rules behind the HTTP layer: a streamed response holds its
//! client's slot until its body ends or is dropped, never longer and never
//! shorter; a refusal is a 429 (or 503) without `Retry-After`. The bodies
//! here end when the test says so, so every count is exact and nothing
//! depends on timing.
//!
//! ```sh
//! cargo test -p floodgate --test suite http_in_flight::
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use floodgate::http::{Header, RateLimitLayer, ResponseBody};
use floodgate::tiers::Tiers;
use floodgate::{build_rules, Bounds, Engine, ManualClock, RateLimiter, RuleSet};
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty};
use tower::{Layer, Service, ServiceExt};

/// Where a test ends a streamed body, and how many are open per client.
#[derive(Default)]
struct Streams {
    /// Per client: the bodies open now, and the most ever open at once.
    open: [AtomicU64; 3],
    most: [AtomicU64; 3],
    /// Bodies told to end, and the wakers of those waiting to be told.
    ended: Mutex<(Vec<usize>, Vec<Waker>)>,
    made: AtomicU64,
}

impl Streams {
    /// Ends body `id`: its next poll after the first frame is its end.
    fn end(&self, id: usize) {
        let mut ended = self.ended.lock().unwrap();
        ended.0.push(id);
        for waker in ended.1.drain(..) {
            waker.wake();
        }
    }
}

/// A streamed body: one frame at once, its end when the test says so.
/// Counted open from its making to its end or drop.
struct Slow {
    streams: Arc<Streams>,
    client: usize,
    id: usize,
    sent: bool,
    open: bool,
}

impl Slow {
    fn new(streams: &Arc<Streams>, client: usize) -> Self {
        let now = streams.open[client].fetch_add(1, Ordering::SeqCst) + 1;
        streams.most[client].fetch_max(now, Ordering::SeqCst);
        let id = streams.made.fetch_add(1, Ordering::SeqCst) as usize;
        Self {
            streams: Arc::clone(streams),
            client,
            id,
            sent: false,
            open: true,
        }
    }

    fn close(&mut self) {
        if std::mem::take(&mut self.open) {
            self.streams.open[self.client].fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Slow {
    fn drop(&mut self) {
        self.close();
    }
}

impl Body for Slow {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if !self.sent {
            self.sent = true;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"token ")))));
        }
        let mut ended = self.streams.ended.lock().unwrap();
        if ended.0.contains(&self.id) {
            drop(ended);
            self.close();
            return Poll::Ready(None);
        }
        ended.1.push(cx.waker().clone());
        Poll::Pending
    }
}

fn limiter(rules: &str) -> Arc<dyn RateLimiter<str>> {
    let rules: RuleSet = rules.parse().unwrap();
    build_rules::<str, _>(&rules, Engine::LockFree, ManualClock::new(0), Bounds::new()).unwrap()
}

/// A request of client `client` (`x-key: c0`, `c1`...).
fn request(client: usize) -> Request<Empty<Bytes>> {
    Request::get("/")
        .header("x-key", format!("c{client}"))
        .body(Empty::new())
        .unwrap()
}

type Answer = Response<ResponseBody<Slow>>;

/// The layer over a service that streams a `Slow` body for each request.
fn streaming<L>(
    layer: RateLimitLayer<L, Header>,
    streams: &Arc<Streams>,
) -> impl Service<Request<Empty<Bytes>>, Response = Answer, Error = Infallible, Future: Send>
       + Clone
       + Send
       + 'static
where
    L: floodgate::http::AsyncLimiter<str> + 'static,
{
    let streams = Arc::clone(streams);
    layer.layer(tower::service_fn(move |request: Request<Empty<Bytes>>| {
        let streams = Arc::clone(&streams);
        async move {
            let key = request.headers()["x-key"].to_str().unwrap();
            let client = key[1..].parse().unwrap();
            Ok::<_, Infallible>(Response::new(Slow::new(&streams, client)))
        }
    }))
}

/// What a body's poll gives when it is ready.
type Polled<B> = Option<Result<Frame<<B as Body>::Data>, <B as Body>::Error>>;

/// Polls `body` once, with a waker that does nothing: its next frame, its
/// end, or `None` for pending.
fn poll_once<B: Body + Unpin>(body: &mut B) -> Option<Polled<B>> {
    let mut context = Context::from_waker(Waker::noop());
    match Pin::new(body).poll_frame(&mut context) {
        Poll::Ready(frame) => Some(frame),
        Poll::Pending => None,
    }
}

/// Three clients each open four streamed responses under `in-flight:2`:
/// two of each are admitted and two refused (429, no `Retry-After`), so the
/// most bodies a client ever has open at once is exactly 2. A slot comes
/// back when a body ends (read to its end), when it is dropped unread,
/// and when it is dropped half read (the client went away), and only then.
#[tokio::test]
async fn streamed_responses_hold_their_slot_until_their_body_ends() {
    let limiter = limiter("in-flight:2");
    let streams = Arc::new(Streams::default());
    let service = streaming(
        RateLimitLayer::new(Arc::clone(&limiter), Header::new("x-key")),
        &streams,
    );
    let mut held: Vec<Vec<Answer>> = vec![Vec::new(), Vec::new(), Vec::new()];
    for round in 0..4 {
        for (client, held) in held.iter_mut().enumerate() {
            let answer = service.clone().oneshot(request(client)).await.unwrap();
            if round < 2 {
                assert_eq!(answer.status(), StatusCode::OK);
                assert_eq!(answer.headers()["ratelimit-policy"], r#""default";q=2"#);
                held.push(answer);
            } else {
                assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
                assert!(answer.headers().get("retry-after").is_none());
                assert_eq!(answer.headers()["ratelimit"], r#""default";r=0"#);
            }
        }
    }
    for client in 0..3 {
        assert_eq!(streams.open[client].load(Ordering::SeqCst), 2);
        assert_eq!(streams.most[client].load(Ordering::SeqCst), 2);
        assert_eq!(limiter.remaining(&format!("c{client}")), 0);
    }

    // c0 reads one body: its first frame keeps the slot, its end frees it.
    let mut body = held[0].remove(0).into_body();
    assert!(poll_once(&mut body).unwrap().unwrap().is_ok());
    assert!(poll_once(&mut body).is_none(), "still streaming");
    assert_eq!(
        limiter.remaining("c0"),
        0,
        "a body still streaming holds its slot"
    );
    streams.end(0);
    assert!(poll_once(&mut body).unwrap().is_none(), "the end");
    assert_eq!(limiter.remaining("c0"), 1, "released at the body's end");
    drop(body);
    assert_eq!(limiter.remaining("c0"), 1, "not twice");

    // c1's client goes away before reading; c2's after the first frame.
    drop(held[1].remove(0));
    assert_eq!(limiter.remaining("c1"), 1);
    let mut body = held[2].remove(0).into_body();
    assert!(poll_once(&mut body).is_some());
    drop(body);
    assert_eq!(limiter.remaining("c2"), 1);

    // Each freed slot admits one more, and no more.
    for (client, held) in held.iter_mut().enumerate() {
        let answer = service.clone().oneshot(request(client)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK, "c{client}");
        held.push(answer);
        let refused = service.clone().oneshot(request(client)).await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS, "c{client}");
        assert_eq!(streams.most[client].load(Ordering::SeqCst), 2, "c{client}");
    }
    drop(held);
    for client in 0..3 {
        assert_eq!(streams.open[client].load(Ordering::SeqCst), 0);
        assert_eq!(
            limiter.remaining(&format!("c{client}")),
            2,
            "c{client}: none leaked"
        );
    }
}

/// `in_flight_unavailable` answers the refusal 503, also without
/// `Retry-After`; beside a rate rule, each rule has its own member and the
/// body says which limit was met.
#[tokio::test]
async fn an_in_flight_refusal_can_be_a_503_and_names_its_rule() {
    let limiter = limiter("gcra:10/1s,in-flight:1");
    let streams = Arc::new(Streams::default());
    let layer =
        RateLimitLayer::new(Arc::clone(&limiter), Header::new("x-key")).in_flight_unavailable();
    let service = streaming(layer, &streams);
    let first = service.clone().oneshot(request(0)).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        first.headers()["ratelimit-policy"],
        r#""default-1";q=10;w=1, "default-2";q=1"#
    );
    assert_eq!(
        first.headers()["ratelimit"],
        r#""default-1";r=9;t=0, "default-2";r=0"#
    );
    let refused = service.clone().oneshot(request(0)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.headers().get("retry-after").is_none());
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8(body.to_vec()).unwrap();
    assert!(body.contains("in-flight:1"), "{body}");
    drop(first);
    let again = service.clone().oneshot(request(0)).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
}

/// A request that never gets its response releases at once: the inner
/// service failed, or the request's future was dropped (the client went
/// away while the service worked).
#[tokio::test]
async fn a_failed_or_cancelled_request_releases_at_once() {
    let limiter = limiter("in-flight:1");
    let layer = RateLimitLayer::new(Arc::clone(&limiter), Header::new("x-key"));
    let failing = layer
        .clone()
        .layer(tower::service_fn(|_: Request<Empty<Bytes>>| async {
            Err::<Response<Empty<Bytes>>, &str>("the upstream is down")
        }));
    assert!(failing.oneshot(request(0)).await.is_err());
    assert_eq!(limiter.remaining("c0"), 1, "released with the error");

    let never = layer.layer(tower::service_fn(|_: Request<Empty<Bytes>>| {
        std::future::pending::<Result<Response<Empty<Bytes>>, Infallible>>()
    }));
    let mut call = Box::pin(never.oneshot(request(0)));
    let mut context = Context::from_waker(Waker::noop());
    assert!(call.as_mut().poll(&mut context).is_pending());
    assert_eq!(limiter.remaining("c0"), 0, "held while the service works");
    drop(call);
    assert_eq!(limiter.remaining("c0"), 1, "released when cancelled");
}

/// A tier named by the request holds and releases in that tier, not the
/// resolver's.
#[tokio::test]
async fn a_named_tier_releases_where_it_held() {
    let tiers = Tiers::<String, _, _>::with_clock_rules(
        "free",
        "in-flight:1".parse().unwrap(),
        |_: &str| "free",
        ManualClock::new(0),
    )
    .unwrap()
    .with_tier_rules("pro", "in-flight:2".parse().unwrap())
    .unwrap();
    let tiers = Arc::new(tiers);
    let streams = Arc::new(Streams::default());
    let layer = RateLimitLayer::new(Arc::clone(&tiers), Header::new("x-key"))
        .tier_from(|parts| Some(parts.headers.get("x-plan")?.to_str().ok()?.to_owned()));
    let service = streaming(layer, &streams);
    let pro = || {
        let mut request = request(0);
        request
            .headers_mut()
            .insert("x-plan", "pro".parse().unwrap());
        request
    };
    let first = service.clone().oneshot(pro()).await.unwrap();
    let second = service.clone().oneshot(pro()).await.unwrap();
    assert_eq!(
        (first.status(), second.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    let third = service.clone().oneshot(pro()).await.unwrap();
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(first);
    let fourth = service.clone().oneshot(pro()).await.unwrap();
    assert_eq!(fourth.status(), StatusCode::OK, "released in the pro tier");
}

/// A tier whose `in-flight` rule is not its strictest (`gcra:1/1s` has the
/// smaller limit) still holds and releases: the layer sees the rule in
/// the tier's answer for each rule, not in the strictest rule alone.
#[tokio::test]
async fn a_tiers_in_flight_rule_beside_a_stricter_rule_is_released() {
    let clock = ManualClock::new(0);
    let tiers = Tiers::<String, _, _>::with_clock_rules(
        "free",
        "gcra:1/1s,in-flight:2".parse().unwrap(),
        |_: &str| "free",
        clock.clone(),
    )
    .unwrap();
    let tiers = Arc::new(tiers);
    let streams = Arc::new(Streams::default());
    let service = streaming(
        RateLimitLayer::new(Arc::clone(&tiers), Header::new("x-key")),
        &streams,
    );
    let first = service.clone().oneshot(request(0)).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    clock.advance(1_000_000_000);
    let second = service.clone().oneshot(request(0)).await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    clock.advance(1_000_000_000);
    // The rate rule would admit; both slots are held.
    let third = service.clone().oneshot(request(0)).await.unwrap();
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(first);
    let fourth = service.clone().oneshot(request(0)).await.unwrap();
    assert_eq!(fourth.status(), StatusCode::OK, "the first's slot released");
    drop((second, fourth));
    clock.advance(1_000_000_000);
    assert_eq!(
        tiers
            .check_ruled_at("c0", tiers.now())
            .each
            .iter()
            .nth(1)
            .map(|answer| answer.decision.remaining()),
        Some(1),
        "both released; this check holds one"
    );
}

/// Over real HTTP: a streamed (chunked) response holds its slot while the
/// client reads it, and the client has its last byte only once the slot is
/// free, so the next request is admitted at once.
#[tokio::test]
async fn over_http_a_read_body_frees_its_slot_before_the_client_has_it() {
    let limiter = limiter("in-flight:1");
    let streams = Arc::new(Streams::default());
    let layer = RateLimitLayer::new(Arc::clone(&limiter), Header::new("x-key"));
    let service = streaming(layer, &streams);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let service = service.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                        let (parts, _) = request.into_parts();
                        service
                            .clone()
                            .oneshot(Request::from_parts(parts, Empty::<Bytes>::new()))
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let send = || async {
        let stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(connection);
        sender.send_request(request(0)).await.unwrap()
    };
    let first = send().await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(send().await.status(), StatusCode::TOO_MANY_REQUESTS);
    let mut body = first.into_body();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"token "));
    assert_eq!(limiter.remaining("c0"), 0, "streaming");
    streams.end(0);
    assert!(body.frame().await.is_none(), "the last chunk");
    assert_eq!(limiter.remaining("c0"), 1);
    assert_eq!(send().await.status(), StatusCode::OK);
}
