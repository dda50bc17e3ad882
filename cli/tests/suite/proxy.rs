//! `floodgate proxy` end to end: the binary between a hyper client and a
//! hyper upstream of the test's own, over 127.0.0.1 only.
//!
//! Nothing here depends on timing. Limits are per hour, so a run never
//! sees a window end; what must happen before what is made to happen by
//! waiting for it (the upstream says a request arrived, the proxy says it
//! is stopping). Every wait is bounded by [`PATIENCE`] so that a broken
//! proxy fails the test instead of hanging it.

use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc as async_mpsc, oneshot};

/// How long any one step may take before the test gives up.
const PATIENCE: Duration = Duration::from_secs(30);

async fn patiently<F: std::future::Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: no progress in {PATIENCE:?}"))
}

// ---------------------------------------------------------------- upstream

/// What the test upstream shares with the test.
#[derive(Default)]
struct Hold {
    /// Told when a request for `/hold` arrives.
    arrived: Option<async_mpsc::UnboundedSender<()>>,
    /// Released to answer it.
    release: Option<oneshot::Receiver<()>>,
}

/// The upstream: `/echo` streams the request's body back as it arrives,
/// `/hold` answers when the test releases it, anything else says `hello`
/// and what `X-Forwarded-For` it was sent.
struct Upstream {
    address: SocketAddr,
    hold: Arc<Mutex<Hold>>,
}

type UpstreamBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

impl Upstream {
    async fn start() -> Upstream {
        Self::on(TcpListener::bind("127.0.0.1:0").await.unwrap())
    }

    fn on(listener: TcpListener) -> Upstream {
        let address = listener.local_addr().unwrap();
        let hold = Arc::new(Mutex::new(Hold::default()));
        let shared = Arc::clone(&hold);
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let hold = Arc::clone(&shared);
                let service = service_fn(move |request| answer(request, Arc::clone(&hold)));
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Upstream { address, hold }
    }

    fn url(&self) -> String {
        format!("http://{}", self.address)
    }
}

async fn answer(
    request: Request<Incoming>,
    hold: Arc<Mutex<Hold>>,
) -> Result<Response<UpstreamBody>, Infallible> {
    match request.uri().path() {
        "/echo" => Ok(Response::new(request.into_body().boxed())),
        "/fail" => {
            let mut response = Response::new(full("unavailable"));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            Ok(response)
        }
        "/hold" => {
            let (arrived, release) = {
                let mut hold = hold.lock().unwrap();
                (hold.arrived.take(), hold.release.take())
            };
            arrived.expect("one /hold at a time").send(()).unwrap();
            release.unwrap().await.unwrap();
            Ok(Response::new(full("held")))
        }
        _ => {
            let forwarded = request
                .headers()
                .get("x-forwarded-for")
                .map(|value| value.to_str().unwrap().to_owned());
            let mut response = Response::new(full("hello"));
            if let Some(forwarded) = forwarded {
                response
                    .headers_mut()
                    .insert("x-seen-forwarded-for", forwarded.parse().unwrap());
            }
            Ok(response)
        }
    }
}

fn full(text: &'static str) -> UpstreamBody {
    Full::new(Bytes::from_static(text.as_bytes()))
        .map_err(|never| match never {})
        .boxed()
}

// ------------------------------------------------------------------- proxy

/// A running `floodgate proxy`, killed if the test ends without stopping it.
struct Proxy {
    child: Child,
    address: SocketAddr,
    stderr: mpsc::Receiver<String>,
}

impl Proxy {
    /// `floodgate proxy --listen 127.0.0.1:0 ARGS…`, once it says where it
    /// listens.
    fn start(args: &[&str]) -> Proxy {
        let mut child = Command::new(env!("CARGO_BIN_EXE_floodgate"))
            .args(["proxy", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run floodgate");
        let stdout = child.stdout.take().unwrap();
        let (line_tx, line_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = line_tx.send(line);
        });
        let (stderr_tx, stderr) = mpsc::channel();
        let child_stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(child_stderr).lines() {
                let Ok(line) = line else { break };
                if stderr_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let line = line_rx
            .recv_timeout(PATIENCE)
            .expect("the proxy says where it listens");
        let address = line
            .trim_end()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("not a listening line: {line:?}"))
            .parse()
            .unwrap();
        Proxy {
            child,
            address,
            stderr,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    /// Sends SIGTERM.
    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// The next line on standard error that contains `needle`.
    fn stderr_line(&self, needle: &str) -> String {
        loop {
            let line = self
                .stderr
                .recv_timeout(PATIENCE)
                .unwrap_or_else(|_| panic!("no line with {needle:?} on standard error"));
            if line.contains(needle) {
                return line;
            }
        }
    }

    /// Stops it with SIGTERM: its exit status and its last counts.
    fn stop(mut self) -> (ExitStatus, String) {
        self.terminate();
        let status = wait(&mut self.child);
        // The last counts are the final ones, printed as it exits: read to
        // the end of its standard error.
        let counts = self
            .stderr
            .iter()
            .filter(|line| line.contains("admitted "))
            .last()
            .expect("the proxy prints its counts as it exits");
        (status, counts)
    }
}

fn wait(child: &mut Child) -> ExitStatus {
    for _ in 0..PATIENCE.as_millis() / 10 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the proxy did not exit within {PATIENCE:?}");
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ------------------------------------------------------------------ client

/// A request on a connection of its own: the status, the headers, and the
/// response's body (whose frames are read by the caller).
async fn send<B>(request: Request<B>) -> Response<Incoming>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let authority = request.uri().authority().unwrap().as_str().to_owned();
    let stream = patiently("connect", TcpStream::connect(&authority))
        .await
        .unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    patiently("the response's head", sender.send_request(request))
        .await
        .unwrap()
}

/// A GET with `headers`: the response and its whole body as text.
async fn get(url: &str, headers: &[(&str, &str)]) -> (Response<()>, String) {
    let mut request = Request::get(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = send(request.body(Full::new(Bytes::new())).unwrap()).await;
    let (parts, body) = response.into_parts();
    let body = patiently("the response's body", body.collect())
        .await
        .unwrap()
        .to_bytes();
    (
        Response::from_parts(parts, ()),
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

fn header<'a>(response: &'a Response<()>, name: &str) -> &'a str {
    response
        .headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

/// A request body the test feeds chunk by chunk.
struct Chunks(async_mpsc::Receiver<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|data| Ok(Frame::data(data))))
    }
}

// ------------------------------------------------------------------- tests

#[tokio::test]
async fn a_fixed_window_admits_exactly_its_limit_with_the_headers() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&[
        "--upstream",
        &upstream.url(),
        "--policy",
        "fixed-window",
        "--limit",
        "3",
        "--window",
        "1h",
        "--legacy-headers",
    ]);
    for remaining in [2, 1, 0] {
        let (response, body) = get(&proxy.url("/"), &[]).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(body, "hello");
        assert_eq!(
            header(&response, "ratelimit-policy"),
            "\"default\";q=3;w=3600"
        );
        // Once none remain, `t` bounds the wait: a fixed window's length.
        let t = if remaining > 0 { 0 } else { 3600 };
        assert_eq!(
            header(&response, "ratelimit"),
            format!("\"default\";r={remaining};t={t}")
        );
        assert_eq!(header(&response, "x-ratelimit-limit"), "3");
        assert_eq!(
            header(&response, "x-ratelimit-remaining"),
            remaining.to_string()
        );
        assert!(response.headers().get("retry-after").is_none());
    }
    for _ in 0..2 {
        let (response, body) = get(&proxy.url("/"), &[]).await;
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_ne!(body, "hello", "a rejection never reaches the upstream");
        let retry: u64 = header(&response, "retry-after").parse().unwrap();
        // The window ends within the hour, rounded up to whole seconds.
        assert!((1..=3600).contains(&retry), "Retry-After: {retry}");
        assert_eq!(
            header(&response, "ratelimit"),
            format!("\"default\";r=0;t={retry}")
        );
        assert_eq!(
            header(&response, "ratelimit-policy"),
            "\"default\";q=3;w=3600"
        );
        assert_eq!(header(&response, "x-ratelimit-remaining"), "0");
        assert_eq!(header(&response, "x-ratelimit-reset"), retry.to_string());
    }
    let (status, counts) = proxy.stop();
    assert!(status.success(), "{status}");
    assert!(
        counts.ends_with("admitted 3, shaped 0, rejected 2, units given back 0, units released 0, upstream errors 0"),
        "{counts}"
    );
}

#[tokio::test]
async fn header_keys_each_get_a_limit_and_a_request_without_one_is_400() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&[
        "--upstream",
        &upstream.url(),
        "--policy",
        "gcra",
        "--limit",
        "1",
        "--window",
        "1h",
        "--key",
        "header:X-Api-Key",
        "--policy-name",
        "per-key",
    ]);
    let status = |key| {
        let url = proxy.url("/");
        async move { get(&url, &[("x-api-key", key)]).await.0 }
    };
    let first = status("alpha").await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(header(&first, "ratelimit-policy"), "\"per-key\";q=1;w=3600");
    assert_eq!(
        status("alpha").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status("beta").await.status(), StatusCode::OK);
    let (response, body) = get(&proxy.url("/"), &[]).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(body.contains("x-api-key"), "{body}");
    let (status, counts) = proxy.stop();
    assert!(status.success(), "{status}");
    assert!(counts.ends_with(
        "admitted 2, shaped 0, rejected 1, units given back 0, units released 0, upstream errors 0"
    ));
}

#[tokio::test]
async fn a_global_key_is_one_limit_for_everyone() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&[
        "--upstream",
        &upstream.url(),
        "--policy",
        "sliding-window",
        "--limit",
        "2",
        "--window",
        "1h",
        "--key",
        "global",
    ]);
    let mut statuses = Vec::new();
    for key in ["a", "b", "c"] {
        statuses.push(get(&proxy.url("/"), &[("x-api-key", key)]).await.0.status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

#[tokio::test]
async fn forwarded_clients_are_read_only_from_trusted_proxies() {
    let upstream = Upstream::start().await;
    let rule = [
        "--upstream",
        &upstream.url(),
        "--policy",
        "token-bucket",
        "--limit",
        "1",
        "--window",
        "1h",
    ];
    let spoofed = |ip: &'static str| [("x-forwarded-for", ip)];

    // The test's own address, 127.0.0.1, is not trusted: a client that
    // names another client shares its own limit.
    let proxy = Proxy::start(&rule);
    let (response, _) = get(&proxy.url("/"), &spoofed("192.0.2.1")).await;
    assert_eq!(response.status(), StatusCode::OK);
    // The upstream learns the peer after what the client claimed.
    assert_eq!(
        header(&response, "x-seen-forwarded-for"),
        "192.0.2.1, 127.0.0.1"
    );
    let (response, _) = get(&proxy.url("/"), &spoofed("192.0.2.2")).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(proxy);

    // Trusted, the forwarded client is the key.
    let mut trusted = rule.to_vec();
    trusted.extend(["--trusted-proxy", "127.0.0.0/8", "--trusted-proxy", "::1"]);
    let proxy = Proxy::start(&trusted);
    let mut statuses = Vec::new();
    for ip in ["192.0.2.1", "192.0.2.2", "192.0.2.1"] {
        statuses.push(get(&proxy.url("/"), &spoofed(ip)).await.0.status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // With no forwarding header the trusted peer is its own client.
    assert_eq!(get(&proxy.url("/"), &[]).await.0.status(), StatusCode::OK);
}

#[tokio::test]
async fn large_bodies_stream_through_both_ways() {
    const CHUNK: usize = 256 * 1024;
    const CHUNKS: usize = 32; // 8 MiB each way
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&[
        "--upstream",
        &upstream.url(),
        "--policy",
        "gcra",
        "--limit",
        "10",
        "--window",
        "1m",
    ]);
    let (chunks, body) = async_mpsc::channel(1);
    let request = Request::post(proxy.url("/echo"))
        .body(Chunks(body))
        .unwrap();
    // Sending one chunk, then reading it back before sending the next, is
    // possible only if neither the request nor the response is buffered
    // whole anywhere on the way: a proxy that waited for either body's end
    // would never answer the first chunk.
    let chunk = |i: usize| Bytes::from(vec![(i % 251) as u8; CHUNK]);
    chunks.send(chunk(0)).await.unwrap();
    let response = send(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut received = 0;
    for i in 0..CHUNKS {
        let mut got = 0;
        while got < CHUNK {
            let frame = patiently("an echoed chunk", body.frame())
                .await
                .expect("the body goes on")
                .unwrap();
            let data = frame.into_data().unwrap();
            assert!(data.iter().all(|&b| b == (i % 251) as u8), "chunk {i}");
            got += data.len();
        }
        assert_eq!(got, CHUNK, "chunk {i} came back whole and alone");
        received += got;
        if i + 1 < CHUNKS {
            chunks.send(chunk(i + 1)).await.unwrap();
        }
    }
    drop(chunks);
    assert!(patiently("the body's end", body.frame()).await.is_none());
    assert_eq!(received, CHUNK * CHUNKS);
}

#[tokio::test]
async fn a_dead_upstream_is_a_502_and_the_proxy_keeps_serving() {
    // A port nobody listens on, until the upstream starts on it below.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{address}"),
        "--policy",
        "gcra",
        "--limit",
        "100",
        "--window",
        "1h",
    ]);
    for _ in 0..2 {
        let (response, body) = get(&proxy.url("/"), &[]).await;
        assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
        assert!(body.contains(&address.to_string()), "{body}");
        // It was admitted, and says so.
        assert!(header(&response, "ratelimit").starts_with("\"default\";r="));
    }
    let _upstream = Upstream::on(TcpListener::bind(address).await.unwrap());
    let (response, body) = get(&proxy.url("/"), &[]).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body, "hello");
    let (status, counts) = proxy.stop();
    assert!(status.success(), "{status}");
    assert!(counts.ends_with(
        "admitted 3, shaped 0, rejected 0, units given back 0, units released 0, upstream errors 2"
    ));
}

#[tokio::test]
async fn sigterm_finishes_the_request_in_flight_then_exits_0() {
    let upstream = Upstream::start().await;
    let (arrived_tx, mut arrived) = async_mpsc::unbounded_channel();
    let (release, release_rx) = oneshot::channel();
    *upstream.hold.lock().unwrap() = Hold {
        arrived: Some(arrived_tx),
        release: Some(release_rx),
    };
    let mut proxy = Proxy::start(&[
        "--upstream",
        &upstream.url(),
        "--policy",
        "gcra",
        "--limit",
        "10",
        "--window",
        "1h",
    ]);
    let url = proxy.url("/hold");
    let in_flight = tokio::spawn(async move { get(&url, &[]).await });
    patiently("the request reaches the upstream", arrived.recv())
        .await
        .unwrap();

    proxy.terminate();
    // Once it says so, it no longer listens...
    let stopping = proxy.stderr_line("stopping");
    assert!(stopping.contains("in flight"), "{stopping}");
    assert!(TcpStream::connect(proxy.address).await.is_err());
    // ...but the request it holds is still answered, in full.
    release.send(()).unwrap();
    let (response, body) = patiently("the answer in flight", in_flight).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body, "held");
    let status = wait(&mut proxy.child);
    assert_eq!(status.code(), Some(0), "{status}");
}

#[test]
fn bad_flags_are_refused_by_name_with_status_2() {
    let good = [
        ("--upstream", "http://127.0.0.1:9"),
        ("--policy", "gcra"),
        ("--limit", "10"),
        ("--window", "1s"),
    ];
    let cases: [(&[(&str, &str)], &str); 13] = [
        (&[("--refund-on", "6xx")], "--refund-on"),
        (&[("--refund-on", "50")], "--refund-on"),
        (&[("--window", "1fortnight")], "--window"),
        (&[("--window", "10ticks")], "--window"),
        (&[("--window", "soon")], "--window"),
        (&[("--limit", "0")], "--limit"),
        (&[("--policy", "fastest")], "--policy"),
        (&[("--upstream", "https://127.0.0.1:9")], "--upstream"),
        (&[("--key", "cookie")], "--key"),
        (&[("--trusted-proxy", "10.0.0.0/33")], "--trusted-proxy"),
        (&[("--ipv6-prefix", "129")], "--ipv6-prefix"),
        (
            &[("--key", "global"), ("--trusted-proxy", "10.0.0.1")],
            "--trusted-proxy",
        ),
        (
            &[("--key", "global"), ("--ipv6-prefix", "56")],
            "--ipv6-prefix",
        ),
    ];
    for (bad, flag) in cases {
        let mut command = Command::new(env!("CARGO_BIN_EXE_floodgate"));
        command.args(["proxy", "--listen", "127.0.0.1:0"]);
        for (name, value) in good {
            if !bad.iter().any(|(bad, _)| *bad == name) {
                command.args([name, value]);
            }
        }
        for (name, value) in bad {
            command.args([name, value]);
        }
        let output = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{bad:?}: {stderr}");
        assert!(stderr.contains(flag), "{bad:?} names {flag}: {stderr}");
        assert!(output.stdout.is_empty(), "{bad:?} never listens");
    }
}

#[tokio::test]
async fn several_rules_send_one_item_each_and_the_stricter_refuses() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&[
        "--upstream",
        &upstream.url(),
        "--rule",
        "gcra:5/1h",
        "--rule",
        "fixed-window:2/1h",
        "--policy-name",
        "api",
        "--legacy-headers",
    ]);
    let policy = "\"api-1\";q=5;w=3600, \"api-2\";q=2;w=3600";
    // The burst rule's `t` is 0 while it has some left; the window's, once
    // spent, its length.
    for (burst, quota, t) in [(4, 1, 0), (3, 0, 3600)] {
        let (response, body) = get(&proxy.url("/"), &[]).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(body, "hello");
        assert_eq!(header(&response, "ratelimit-policy"), policy);
        assert_eq!(
            header(&response, "ratelimit"),
            format!("\"api-1\";r={burst};t=0, \"api-2\";r={quota};t={t}")
        );
        // The legacy headers describe the rule with the fewest left.
        assert_eq!(header(&response, "x-ratelimit-limit"), "2");
        assert_eq!(
            header(&response, "x-ratelimit-remaining"),
            quota.to_string()
        );
    }
    let (response, body) = get(&proxy.url("/"), &[]).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_ne!(body, "hello", "a rejection never reaches the upstream");
    let retry: u64 = header(&response, "retry-after").parse().unwrap();
    assert!((1..=3600).contains(&retry), "Retry-After: {retry}");
    assert_eq!(header(&response, "ratelimit-policy"), policy);
    // The burst rule alone would admit it: its own answer, no wait.
    assert_eq!(
        header(&response, "ratelimit"),
        format!("\"api-1\";r=3;t=0, \"api-2\";r=0;t={retry}")
    );
    // The legacy headers describe the rule that refused.
    assert_eq!(header(&response, "x-ratelimit-limit"), "2");
    assert_eq!(header(&response, "x-ratelimit-remaining"), "0");
    assert_eq!(header(&response, "x-ratelimit-reset"), retry.to_string());

    let (status, counts) = proxy.stop();
    assert!(status.success(), "{status}");
    assert!(
        counts.ends_with("admitted 2, shaped 0, rejected 1, units given back 0, units released 0, upstream errors 0"),
        "{counts}"
    );
}

#[test]
fn rules_go_without_the_single_rule_flags_and_a_bad_rule_is_named() {
    let nine_rules: Vec<&str> = ["--rule", "gcra:10/1s"].repeat(9);
    let cases: [(&[&str], &[&str]); 9] = [
        (
            &["--rule", "gcra:10/1s", "--policy", "gcra"],
            &["--rule", "--policy"],
        ),
        (
            &["--rule", "gcra:10/1s", "--limit", "10"],
            &["--rule", "--limit"],
        ),
        (
            &["--rule", "gcra:10/1s", "--window", "1s"],
            &["--rule", "--window"],
        ),
        (
            &["--rule", "gcra:10/1s", "--rule", "gcra:10/1fortnight"],
            &["--rule gcra:10/1fortnight", "unknown unit \"fortnight\""],
        ),
        (&["--rule", "fastest:10/1s"], &["--rule fastest:10/1s"]),
        (&["--rule", "gcra:100/10ns"], &["--rule gcra:100/10ns"]),
        (
            &["--rule", "gcra:10/1000ticks"],
            &["--rule gcra:10/1000ticks", "give it with a unit"],
        ),
        (&nine_rules, &["9 --rule flags", "at most 8"]),
        (
            &["--rule", "gcra:10/1s", "--max-clients", "0"],
            &["error: --max-clients 0: with --overflow reject"],
        ),
    ];
    for (args, named) in cases {
        let output = Command::new(env!("CARGO_BIN_EXE_floodgate"))
            .args(["proxy", "--listen", "127.0.0.1:0"])
            .args(["--upstream", "http://127.0.0.1:9"])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        for name in named {
            assert!(stderr.contains(name), "{args:?} names {name}: {stderr}");
        }
        assert!(output.stdout.is_empty(), "{args:?} never listens");
    }
    // Neither --rule nor the three: clap asks for either.
    let output = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(["proxy", "--listen", "127.0.0.1:0"])
        .args(["--upstream", "http://127.0.0.1:9"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("<--policy <NAME>|--rule"), "{stderr}");
}

#[test]
fn help_documents_rule() {
    let output = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(["proxy", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success());
    assert!(help.contains("--rule <POLICY:LIMIT/WINDOW>"), "{help}");
    assert!(
        help.contains("--rule gcra:10/1s --rule fixed-window:10000/1d"),
        "{help}"
    );
}

#[tokio::test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
async fn the_redis_backend_limits_behind_the_layer() {
    let url = std::env::var("FLOODGATE_REDIS_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .expect("FLOODGATE_REDIS_URL is not set (.ci/run starts a server and sets it)");
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&[
        "--upstream",
        &upstream.url(),
        "--policy",
        "fixed-window",
        "--limit",
        "2",
        "--window",
        "1h",
        "--key",
        "header:x-api-key",
        "--backend",
        &url,
    ]);
    // A client of this run's own: the keys of an earlier run live an hour.
    let client = format!(
        "proxy-test-{}-{:?}",
        std::process::id(),
        std::time::SystemTime::now()
    );
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let (response, _) = get(&proxy.url("/"), &[("x-api-key", &client)]).await;
        assert_eq!(
            header(&response, "ratelimit-policy"),
            "\"default\";q=2;w=3600"
        );
        statuses.push(response.status());
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            let retry: u64 = header(&response, "retry-after").parse().unwrap();
            assert!((1..=3600).contains(&retry), "Retry-After: {retry}");
        }
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let (status, counts) = proxy.stop();
    assert!(status.success(), "{status}");
    assert!(counts.ends_with(
        "admitted 2, shaped 0, rejected 1, units given back 0, units released 0, upstream errors 0"
    ));
}

/// Four proxies share one key's limit on one Redis, each spending from
/// leases (`--lease`): with demand far above the limit (200 requests in
/// turn across the four for a limit of 50), the admitted total is within
/// the limit and at least 90% of it.
#[tokio::test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
async fn four_proxies_on_leases_admit_within_the_shared_limit_and_near_it() {
    let url = std::env::var("FLOODGATE_REDIS_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .expect("FLOODGATE_REDIS_URL is not set (.ci/run starts a server and sets it)");
    let upstream = Upstream::start().await;
    let proxies: Vec<Proxy> = (0..4)
        .map(|_| {
            Proxy::start(&[
                "--upstream",
                &upstream.url(),
                "--rule",
                "fixed-window:50/1h",
                "--key",
                "header:x-api-key",
                "--backend",
                &url,
                "--lease",
                "--lease-term",
                "2s",
            ])
        })
        .collect();
    let banner = proxies[0].stderr_line("per client");
    assert!(
        banner.contains(&format!("in {url}, spent from leases of term 2s")),
        "{banner}"
    );
    // A client of this run's own: the keys of an earlier run live an hour.
    let client = format!(
        "proxy-lease-test-{}-{:?}",
        std::process::id(),
        std::time::SystemTime::now()
    );
    let mut admitted = 0;
    for request in 0..200 {
        let proxy = &proxies[request % 4];
        let (response, _) = get(&proxy.url("/"), &[("x-api-key", &client)]).await;
        admitted += usize::from(response.status() == StatusCode::OK);
    }
    assert!(
        (45..=50).contains(&admitted),
        "{admitted} admitted of a shared limit of 50"
    );
    for proxy in proxies {
        let (status, _) = proxy.stop();
        assert!(status.success(), "{status}");
    }
}

/// The issue's example: each request's tier from `x-plan`, 2 an hour for
/// free, 5 for premium, and a misspelt plan the default tier's 2, named
/// once on standard error.
#[tokio::test]
async fn the_tier_header_chooses_each_requests_tier() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&[
        "--upstream",
        &upstream.url(),
        "--key",
        "header:x-key",
        "--tier",
        "free=gcra:2/1h",
        "--tier",
        "premium=gcra:5/1h",
        "--tier-header",
        "x-plan",
    ]);
    // The banner names every tier's rules and the tier header.
    let banner = proxy.stderr_line("per client");
    assert_eq!(
        banner,
        format!(
            "floodgate proxy: tiers free=gcra:2/1h, premium=gcra:5/1h (each request's tier \
             named by header x-plan; free when it names none or no tier) per client (by header \
             x-key) in memory, to {}",
            upstream.url()
        )
    );
    let admitted = |key: &'static str, plan: &'static str, tries: usize| {
        let url = proxy.url("/");
        async move {
            let mut admitted = 0;
            let mut policy = String::new();
            for _ in 0..tries {
                let (response, _) = get(&url, &[("x-key", key), ("x-plan", plan)]).await;
                admitted += usize::from(response.status() == StatusCode::OK);
                policy = header(&response, "ratelimit-policy").to_owned();
            }
            (admitted, policy)
        }
    };
    let free = admitted("a", "free", 4).await;
    assert_eq!(free, (2, r#""free";q=2;w=3600"#.to_owned()));
    let premium = admitted("b", "premium", 7).await;
    assert_eq!(premium, (5, r#""premium";q=5;w=3600"#.to_owned()));
    let misspelt = admitted("c", "premum", 4).await;
    assert_eq!(misspelt, (2, r#""free";q=2;w=3600"#.to_owned()));
    let line = proxy.stderr_line("premum");
    assert!(line.contains("default tier"), "{line}");
    assert!(
        line.contains(r#"the request's header x-plan named a tier the registry lacks, "premum""#),
        "{line}"
    );
    let (status, counts) = proxy.stop();
    assert!(status.success(), "{status}");
    assert!(
        counts.ends_with("admitted 9, shaped 0, rejected 6, units given back 0, units released 0, upstream errors 0"),
        "{counts}"
    );
}

/// A tier of several rules sends one member per rule, `pro-1` and
/// `pro-2`, so the daily quota is as visible as the hourly rate; a tier
/// of one rule keeps its plain name.
#[tokio::test]
async fn a_tier_of_several_rules_sends_one_member_per_rule() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&[
        "--upstream",
        &upstream.url(),
        "--key",
        "header:x-key",
        "--tier",
        "free=gcra:2/1h",
        "--tier",
        "pro=gcra:5/1h,fixed-window:3/1d",
        "--tier-header",
        "x-plan",
    ]);
    let url = proxy.url("/");
    let pro = [("x-key", "a"), ("x-plan", "pro")];
    let policy = r#""pro-1";q=5;w=3600, "pro-2";q=3;w=86400"#;
    let (first, _) = get(&url, &pro).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(header(&first, "ratelimit-policy"), policy);
    assert_eq!(
        header(&first, "ratelimit"),
        r#""pro-1";r=4;t=0, "pro-2";r=2;t=0"#
    );
    get(&url, &pro).await;
    let (third, _) = get(&url, &pro).await;
    assert_eq!(third.status(), StatusCode::OK);
    // The day's last: its member says when the next comes at most.
    assert_eq!(
        header(&third, "ratelimit"),
        r#""pro-1";r=2;t=0, "pro-2";r=0;t=86400"#
    );
    // Refused by the daily quota while the hourly rate has 2 left.
    let (fourth, _) = get(&url, &pro).await;
    assert_eq!(fourth.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&fourth, "ratelimit-policy"), policy);
    assert!(
        header(&fourth, "ratelimit").starts_with(r#""pro-1";r=2;t=0, "pro-2";r=0;t="#),
        "{}",
        header(&fourth, "ratelimit")
    );
    let (free, _) = get(&url, &[("x-key", "a")]).await;
    assert_eq!(header(&free, "ratelimit-policy"), r#""free";q=2;w=3600"#);
    let (status, _) = proxy.stop();
    assert!(status.success(), "{status}");
}

/// `--refund-on 5xx`: a request the upstream failed does not count, so
/// three 503s leave the client its whole limit of 2; the proxy's count
/// line says how many units came back.
#[tokio::test]
async fn a_failed_upstream_answer_gives_its_units_back() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&[
        "--upstream",
        &upstream.url(),
        "--key",
        "header:x-key",
        "--rule",
        "gcra:2/1h",
        "--refund-on",
        "5xx",
        "--refund-on",
        "429",
    ]);
    for _ in 0..3 {
        let (response, body) = get(&proxy.url("/fail"), &[("x-key", "a")]).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{body}");
    }
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let (response, _) = get(&proxy.url("/"), &[("x-key", "a")]).await;
        statuses.push(response.status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let (status, counts) = proxy.stop();
    assert!(status.success(), "{status}");
    assert!(
        counts.ends_with("admitted 5, shaped 0, rejected 1, units given back 3, units released 0, upstream errors 0"),
        "{counts}"
    );
}

/// `--rule in-flight:2`: a client streams two responses at once and its
/// third request is a 429 without `Retry-After`; a stream's slot comes back
/// when the upstream's body ends, before the client has its last byte, so
/// the next request is admitted. The count line says how many units were
/// released.
#[tokio::test]
async fn in_flight_streams_hold_their_slot_until_the_upstream_body_ends() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&[
        "--upstream",
        &upstream.url(),
        "--key",
        "header:x-key",
        "--rule",
        "in-flight:2",
    ]);
    let mut streams = Vec::new();
    for i in 0..2u8 {
        let (chunks, body) = async_mpsc::channel(1);
        let request = Request::post(proxy.url("/echo"))
            .header("x-key", "a")
            .body(Chunks(body))
            .unwrap();
        chunks.send(Bytes::from(vec![i; 16])).await.unwrap();
        let response = send(request).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["ratelimit-policy"], r#""default";q=2"#);
        let mut body = response.into_body();
        let frame = patiently("the first chunk", body.frame())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(frame.into_data().unwrap(), Bytes::from(vec![i; 16]));
        streams.push((chunks, body));
    }
    let (refused, text) = get(&proxy.url("/"), &[("x-key", "a")]).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS, "{text}");
    assert!(refused.headers().get("retry-after").is_none());
    assert!(text.contains("in-flight:2"), "{text}");
    let (other, _) = get(&proxy.url("/"), &[("x-key", "b")]).await;
    assert_eq!(other.status(), StatusCode::OK, "another client's slots");

    for (chunks, mut body) in streams {
        drop(chunks);
        assert!(patiently("the stream's end", body.frame()).await.is_none());
        let (next, text) = get(&proxy.url("/"), &[("x-key", "a")]).await;
        assert_eq!(next.status(), StatusCode::OK, "{text}");
    }
    let (status, counts) = proxy.stop();
    assert!(status.success(), "{status}");
    assert!(
        counts.ends_with(
            "admitted 5, shaped 0, rejected 1, units given back 0, units released 5, upstream errors 0"
        ),
        "{counts}"
    );
}

/// Bad tiers are refused by flag, with status 2.
#[test]
fn bad_tiers_are_refused_by_name_with_status_2() {
    let cases: [(&[&str], &str); 5] = [
        (&["--tier", "free"], "NAME=RULE"),
        (&["--tier", "free=gcra:2"], "tier free"),
        (&["--tier", "=gcra:2/1h"], "tier name"),
        (
            &["--tier", "free=gcra:2/1h", "--tier", "free=gcra:5/1h"],
            "--tier free is given twice",
        ),
        (
            &["--tier", "free=gcra:2/1h", "--rule", "gcra:1/1s"],
            "--rule",
        ),
    ];
    for (bad, says) in cases {
        let output = Command::new(env!("CARGO_BIN_EXE_floodgate"))
            .args([
                "proxy",
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                "http://127.0.0.1:9",
            ])
            .args(bad)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{bad:?}: {stderr}");
        assert!(stderr.contains(says), "{bad:?} says {says}: {stderr}");
        assert!(output.stdout.is_empty(), "{bad:?} never listens");
    }
    let output = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args([
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:9",
        ])
        .args(["--tier-header", "x-plan", "--rule", "gcra:1/1s"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--tier"));
}

/// A `--state` file of this test's own, removed when dropped.
struct StateFile(std::path::PathBuf);

impl StateFile {
    fn new(name: &str) -> Self {
        Self(std::env::temp_dir().join(format!(
            "floodgate-proxy-state-{}-{name}",
            std::process::id()
        )))
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for StateFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        // A test's directory, with what it holds.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The statuses of `tries` requests of client `key`.
async fn statuses(proxy: &Proxy, key: &'static str, tries: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..tries {
        let (response, _) = get(&proxy.url("/"), &[("x-key", key)]).await;
        statuses.push(response.status().as_u16());
    }
    statuses
}

/// `--state`: saved at SIGTERM and loaded at the next start, so a client
/// that spent its daily quota is still refused after the restart and one
/// that spent part of it keeps the rest; the same for a registry of tiers.
#[tokio::test]
async fn a_client_refused_before_a_restart_is_refused_after_it() {
    let upstream = Upstream::start().await;
    let url = upstream.url();
    for (name, rules) in [
        (
            "rules",
            &["--rule", "gcra:10/1s", "--rule", "fixed-window:3/1d"][..],
        ),
        (
            "tiers",
            &[
                "--tier",
                "free=gcra:10/1s,fixed-window:3/1d",
                "--tier",
                "pro=gcra:5/1h",
            ][..],
        ),
    ] {
        let file = StateFile::new(name);
        let mut args = vec![
            "--upstream",
            &url,
            "--key",
            "header:x-key",
            "--state",
            file.path(),
        ];
        args.extend(rules);
        // A first start: no file yet, which is fine.
        let proxy = Proxy::start(&args);
        // The banner: every rule, every tier (here without --tier-header).
        let banner = proxy.stderr_line("per client");
        let limits = match name {
            "rules" => "gcra:10/1s,fixed-window:3/1d",
            _ => {
                "tiers free=gcra:10/1s,fixed-window:3/1d, pro=gcra:5/1h (no --tier-header: \
                 every request in the default tier, free)"
            }
        };
        assert_eq!(
            banner,
            format!("floodgate proxy: {limits} per client (by header x-key) in memory, to {url}"),
            "{name}"
        );
        assert_eq!(
            statuses(&proxy, "a", 4).await,
            [200, 200, 200, 429],
            "{name}"
        );
        assert_eq!(statuses(&proxy, "b", 1).await, [200], "{name}");
        let (status, _) = proxy.stop();
        assert!(status.success(), "{name}: {status}");
        let proxy = Proxy::start(&args);
        let loaded = proxy.stderr_line("loaded");
        assert!(loaded.contains("loaded 2 clients"), "{name}: {loaded}");
        assert_eq!(statuses(&proxy, "a", 2).await, [429, 429], "{name}");
        assert_eq!(statuses(&proxy, "b", 3).await, [200, 200, 429], "{name}");
        assert_eq!(statuses(&proxy, "c", 1).await, [200], "{name}");
        let (status, _) = proxy.stop();
        assert!(status.success(), "{name}: {status}");
    }
}

/// `--state-every`: a proxy killed without a chance to save loses at most
/// that much; what it saved before is loaded at the next start.
#[tokio::test]
async fn state_every_saves_while_running_so_a_crash_keeps_what_was_saved() {
    let upstream = Upstream::start().await;
    let file = StateFile::new("every");
    let url = upstream.url();
    let args = [
        "--upstream",
        &url,
        "--key",
        "header:x-key",
        "--rule",
        "fixed-window:2/1d",
        "--state",
        file.path(),
        "--state-every",
        "50ms",
    ];
    let mut proxy = Proxy::start(&args);
    assert_eq!(statuses(&proxy, "a", 3).await, [200, 200, 429]);
    // Saved within a few periods; then killed, as a crash would.
    let saved = std::time::Instant::now();
    loop {
        let bytes = std::fs::read(&file.0).unwrap_or_default();
        if !bytes.is_empty()
            && floodgate::state::Saved::read(&file.0).is_ok_and(|saved| saved.clients() == 1)
        {
            break;
        }
        assert!(saved.elapsed() < PATIENCE, "no save within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.child.kill().unwrap();
    wait(&mut proxy.child);
    let proxy = Proxy::start(&args);
    assert_eq!(statuses(&proxy, "a", 1).await, [429]);
    let (status, _) = proxy.stop();
    assert!(status.success(), "{status}");
}

/// A `--state` file that cannot be read whole stops the start: status 2,
/// the file and what is wrong with it named, nothing served. Under other
/// rules too, and `--state-every` needs `--state`.
#[test]
fn a_bad_state_file_stops_the_start_with_status_2() {
    let file = StateFile::new("bad");
    std::fs::write(&file.0, b"not a state file").unwrap();
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_floodgate"))
            .args([
                "proxy",
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                "http://127.0.0.1:9",
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    let output = run(&["--rule", "gcra:1/1s", "--state", file.path()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(file.path()) && stderr.contains("not a floodgate state file"),
        "{stderr}"
    );
    let output = run(&["--rule", "gcra:1/1s", "--state-every", "1s"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--state"));
}

/// A `--state` path that cannot be written is found at the start, not at
/// the stop with the state lost: status 2, before anything is served, the
/// path and the system's error named. A path that is a directory too.
#[test]
fn an_unwritable_state_path_stops_the_start_with_status_2() {
    let run = |state: &str| {
        Command::new(env!("CARGO_BIN_EXE_floodgate"))
            .args([
                "proxy",
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                "http://127.0.0.1:9",
                "--rule",
                "gcra:1/1s",
                "--state",
                state,
            ])
            .output()
            .unwrap()
    };
    let output = run("/nonexistent-dir/x.state");
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty(), "nothing served");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr,
        "error: --state: cannot save to /nonexistent-dir/x.state: a file cannot be created in \
         /nonexistent-dir: No such file or directory (os error 2)\n"
    );
    let dir = std::env::temp_dir();
    let output = run(dir.to_str().unwrap());
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty(), "nothing served");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr,
        format!(
            "error: --state: cannot save to {}: it is a directory\n",
            dir.display()
        )
    );
}

/// The stop's save fails when `--state`'s directory went away while the
/// proxy ran: it is tried three times, each failure logged, then the
/// proxy says the state was not saved and exits 1.
#[tokio::test]
async fn a_stop_whose_save_fails_says_so_and_exits_1() {
    let upstream = Upstream::start().await;
    let url = upstream.url();
    let dir = StateFile::new("gone.dir");
    std::fs::create_dir(&dir.0).unwrap();
    let path = dir.0.join("x.state");
    let path = path.to_str().unwrap();
    let mut proxy = Proxy::start(&[
        "--upstream",
        &url,
        "--key",
        "header:x-key",
        "--rule",
        "fixed-window:3/1d",
        "--state",
        path,
    ]);
    assert_eq!(statuses(&proxy, "a", 1).await, [200]);
    std::fs::remove_dir(&dir.0).unwrap();
    proxy.terminate();
    let status = wait(&mut proxy.child);
    assert_eq!(status.code(), Some(1));
    // Its standard error to the end (the reader stops at the pipe's end).
    let stderr: Vec<String> = proxy.stderr.iter().collect();
    let attempts = stderr
        .iter()
        .filter(|line| line.contains(&format!("cannot save to {path}: No such file")))
        .count();
    // Three attempts logged, and the proxy's own last line.
    assert_eq!(attempts, 4, "{stderr:#?}");
    let last = stderr.last().unwrap();
    assert_eq!(
        *last,
        format!(
            "floodgate proxy: the state was not saved: cannot save to {path}: No such file or \
             directory (os error 2)"
        )
    );
}

/// A deploy that changed a tier's limit: the file saved under the old
/// rules stops the start, saying what to do, unless --state-carry-over
/// carries each client over to the new rules (8 spent of a new 5: none
/// left).
#[tokio::test]
async fn changed_tiers_stop_the_start_unless_carried_over() {
    let upstream = Upstream::start().await;
    let url = upstream.url();
    let file = StateFile::new("changed");
    let mut args = vec![
        "--upstream",
        &url,
        "--key",
        "header:x-key",
        "--state",
        file.path(),
    ];
    let proxy = Proxy::start(&[&args[..], &["--tier", "free=fixed-window:10/1d"]].concat());
    assert_eq!(statuses(&proxy, "a", 8).await, [200; 8]);
    assert!(proxy.stop().0.success());
    args.extend(["--tier", "free=fixed-window:5/1d"]);
    let refused = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(["proxy", "--listen", "127.0.0.1:0"])
        .args(&args)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--state-carry-over"), "{stderr}");
    args.push("--state-carry-over");
    let proxy = Proxy::start(&args);
    assert_eq!(statuses(&proxy, "a", 1).await, [429]);
    assert_eq!(statuses(&proxy, "b", 1).await, [200]);
    assert!(proxy.stop().0.success());
}
