//! `floodgate proxy --metrics-listen`: a scrape taken while the proxy
//! serves, read with a parser of the Prometheus text format, says what the
//! client saw. Over 127.0.0.1 only; limits are per hour, so no window ends
//! during a run, and every wait is bounded by [`PATIENCE`].

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use openmetrics_parser::prometheus::parse_prometheus;
use openmetrics_parser::{PrometheusType, PrometheusValue};
use tokio::net::{TcpListener, TcpStream};

/// How long any one step may take before the test gives up.
const PATIENCE: Duration = Duration::from_secs(30);

async fn patiently<F: std::future::Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: no progress in {PATIENCE:?}"))
}

/// An upstream that answers `hello` to everything.
async fn upstream() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let service = service_fn(|_| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    format!("http://{address}")
}

/// A running `floodgate proxy --listen 127.0.0.1:0 --metrics-listen
/// 127.0.0.1:0`, killed if the test ends without stopping it.
struct Proxy {
    child: Child,
    address: SocketAddr,
    metrics: String,
    stderr: mpsc::Receiver<String>,
}

impl Proxy {
    /// Started with `args`, once it says where it listens: the metrics
    /// line first, then `listening on`.
    fn start(args: &[&str]) -> Proxy {
        let mut child = Command::new(env!("CARGO_BIN_EXE_floodgate"))
            .args([
                "proxy",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run floodgate");
        let stdout = child.stdout.take().unwrap();
        let (line_tx, line_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            for _ in 0..2 {
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                let _ = line_tx.send(line);
            }
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
        let line = || line_rx.recv_timeout(PATIENCE).expect("a line on stdout");
        let metrics = line();
        let metrics = metrics
            .trim_end()
            .strip_prefix("metrics on ")
            .unwrap_or_else(|| panic!("not a metrics line: {metrics:?}"))
            .to_owned();
        let listening = line();
        let address = listening
            .trim_end()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("not a listening line: {listening:?}"))
            .parse()
            .unwrap();
        Proxy {
            child,
            address,
            metrics,
            stderr,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    /// Stops it with SIGTERM: whether it exited 0, and its last counts.
    fn stop(self) -> (bool, String) {
        let (exited, stderr) = self.stop_with_stderr();
        let counts = stderr
            .into_iter()
            .rfind(|line| line.contains("admitted "))
            .expect("the proxy prints its counts as it exits");
        (exited, counts)
    }

    /// Stops it with SIGTERM: whether it exited 0, and every line it wrote
    /// on standard error.
    fn stop_with_stderr(mut self) -> (bool, Vec<String>) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let mut exited = None;
        for _ in 0..PATIENCE.as_millis() / 10 {
            if let Some(status) = self.child.try_wait().unwrap() {
                exited = Some(status);
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let exited = exited.expect("the proxy exits on SIGTERM");
        // To the pipe's end: the reader stops there, once the proxy exited.
        (exited.success(), self.stderr.iter().collect())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A request on a connection of its own: its status, content type and body.
async fn send(method: Method, url: &str, headers: &[(&str, &str)]) -> (StatusCode, String, String) {
    let mut request = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(Bytes::new())).unwrap();
    let authority = request.uri().authority().unwrap().as_str().to_owned();
    let stream = patiently("connect", TcpStream::connect(&authority))
        .await
        .unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let response = patiently("the response", sender.send_request(request))
        .await
        .unwrap();
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map_or(String::new(), |value| value.to_str().unwrap().to_owned());
    let body = patiently("the body", response.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    (
        status,
        content_type,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

/// A scrape, parsed.
struct Scrape {
    text: String,
    /// Counters and gauges: family, labels → value.
    values: BTreeMap<(String, BTreeMap<String, String>), f64>,
    /// The added-time histogram: cumulative buckets, sum, count.
    histogram: (Vec<(f64, f64)>, f64, u64),
}

impl Scrape {
    async fn take(proxy: &Proxy) -> Scrape {
        let (status, content_type, text) = send(Method::GET, &proxy.metrics, &[]).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert!(
            content_type.starts_with("text/plain; version=0.0.4"),
            "{content_type}"
        );
        let exposition = parse_prometheus(&text).unwrap_or_else(|e| panic!("{e:?} in\n{text}"));
        let mut values = BTreeMap::new();
        let mut histogram = None;
        for (name, family) in &exposition.families {
            assert!(!family.help.is_empty(), "{name} has no HELP");
            for sample in family.iter_samples() {
                let labels: BTreeMap<String, String> = sample
                    .get_labelset()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let value = match (&family.family_type, &sample.value) {
                    (PrometheusType::Counter, PrometheusValue::Counter(c)) => c.value.as_f64(),
                    (PrometheusType::Gauge, PrometheusValue::Gauge(g)) => g.as_f64(),
                    (PrometheusType::Histogram, PrometheusValue::Histogram(h)) => {
                        let buckets = h
                            .buckets
                            .iter()
                            .map(|b| (b.upper_bound, b.count.as_f64()))
                            .collect();
                        histogram = Some((
                            buckets,
                            h.sum.expect("a _sum").as_f64(),
                            h.count.expect("a _count"),
                        ));
                        continue;
                    }
                    other => panic!("{name}: {other:?}"),
                };
                values.insert((name.clone(), labels), value);
            }
        }
        Scrape {
            histogram: histogram.expect("the added-time histogram"),
            text,
            values,
        }
    }

    /// The value of `name` with `labels`, 0 if there is no such sample (a
    /// status never sent).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let labels = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.values
            .get(&(name.to_owned(), labels))
            .copied()
            .unwrap_or(0.0)
    }

    fn status(&self, status: u16) -> f64 {
        self.get(
            "floodgate_proxy_requests_total",
            &[("status", &status.to_string())],
        )
    }

    fn limiter(&self, name: &str, outcome: Option<&str>) -> f64 {
        let mut labels = vec![("limiter", "per-key"), ("tier", "")];
        if let Some(outcome) = outcome {
            labels.push(("outcome", outcome));
        }
        self.get(name, &labels)
    }

    /// The histogram's count, checked against its buckets.
    fn added_count(&self) -> u64 {
        let (buckets, sum, count) = &self.histogram;
        assert!(buckets
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
        let last = buckets.last().unwrap();
        assert!(last.0.is_infinite(), "{buckets:?}");
        assert_eq!(last.1, *count as f64, "+Inf is the count");
        assert!(*sum >= 0.0);
        *count
    }
}

#[tokio::test]
async fn a_scrape_while_serving_counts_what_the_client_saw() {
    let upstream = upstream().await;
    let proxy = Proxy::start(&[
        "--upstream",
        &upstream,
        "--policy",
        "fixed-window",
        "--limit",
        "3",
        "--window",
        "1h",
        "--key",
        "header:X-Api-Key",
        "--policy-name",
        "per-key",
    ]);
    let mut seen: BTreeMap<u16, u64> = BTreeMap::new();
    // Six of one client (three refused), two of another, one without a key.
    let keys = ["a", "a", "b", "a", "a", "a", "b", ""];
    for (sent, key) in keys.into_iter().enumerate() {
        let headers: &[(&str, &str)] = if key.is_empty() {
            &[]
        } else {
            &[("x-api-key", key)]
        };
        let (status, _, _) = send(Method::GET, &proxy.url("/"), headers).await;
        *seen.entry(status.as_u16()).or_default() += 1;
        if sent == 3 {
            // Midway, the scrape already says what was answered so far.
            let scrape = Scrape::take(&proxy).await;
            assert_eq!(scrape.status(200), 4.0, "{}", scrape.text);
            assert_eq!(scrape.added_count(), 4);
        }
    }
    assert_eq!(seen, BTreeMap::from([(200, 5), (400, 1), (429, 2)]));

    let scrape = Scrape::take(&proxy).await;
    for (status, count) in &seen {
        assert_eq!(scrape.status(*status), *count as f64, "{}", scrape.text);
    }
    assert_eq!(scrape.status(502), 0.0);
    let decisions = "floodgate_decisions_total";
    let admitted = scrape.limiter(decisions, Some("admitted"));
    let rejected = scrape.limiter(decisions, Some("rejected"));
    assert_eq!((admitted, rejected), (5.0, 2.0), "{}", scrape.text);
    // Every request with a key was decided once: the 200s and the 429s.
    assert_eq!(admitted + rejected, (seen[&200] + seen[&429]) as f64);
    let units = "floodgate_decision_units_total";
    assert_eq!(scrape.limiter(units, Some("admitted")), admitted);
    assert_eq!(scrape.limiter(units, Some("rejected")), rejected);
    assert_eq!(scrape.limiter("floodgate_clients_created_total", None), 2.0);
    assert_eq!(scrape.limiter("floodgate_tracked_clients", None), 2.0);
    assert_eq!(
        scrape.get("floodgate_proxy_upstream_errors_total", &[]),
        0.0
    );
    assert_eq!(scrape.added_count(), keys.len() as u64);

    // The metrics listener serves `/metrics` only.
    let (status, _, _) = send(Method::GET, &format!("{}x", proxy.metrics), &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let root = proxy.metrics.trim_end_matches("/metrics").to_owned() + "/";
    assert_eq!(send(Method::GET, &root, &[]).await.0, StatusCode::NOT_FOUND);
    let (status, _, _) = send(Method::POST, &proxy.metrics, &[]).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    // Scrapes are not requests of the proxy.
    assert_eq!(Scrape::take(&proxy).await.added_count(), keys.len() as u64);

    // `/offenders`: the one client refused (twice), then a new
    // interval with nobody in it.
    let offenders = proxy.metrics.replace("/metrics", "/offenders");
    let (status, content_type, body) = send(Method::GET, &offenders, &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(content_type, "application/json");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["offenders"][0]["client"], "a", "{body}");
    assert_eq!(report["offenders"][0]["refused"], 2, "{body}");
    assert_eq!(report["offenders"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(report["recorded"], 2, "{body}");
    let (_, _, body) = send(Method::GET, &offenders, &[]).await;
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report["offenders"].as_array().unwrap().len(), 0, "{body}");
    assert_eq!(
        send(Method::POST, &offenders, &[]).await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );

    // The stderr line stays.
    let (exited, counts) = proxy.stop();
    assert!(exited);
    assert!(
        counts.ends_with("admitted 5, shaped 0, rejected 2, units given back 0, units released 0, upstream errors 0"),
        "{counts}"
    );
}

#[tokio::test]
async fn an_upstream_that_does_not_answer_is_counted_as_errors_and_502s() {
    // A port that was free a moment ago: connections to it are refused.
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    };
    let proxy = Proxy::start(&[
        "--upstream",
        &format!("http://{closed}"),
        "--policy",
        "gcra",
        "--limit",
        "2",
        "--window",
        "1h",
        "--key",
        "global",
        "--policy-name",
        "per-key",
    ]);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(send(Method::GET, &proxy.url("/"), &[]).await.0);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::BAD_GATEWAY,
            StatusCode::BAD_GATEWAY,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let scrape = Scrape::take(&proxy).await;
    assert_eq!(scrape.status(502), 2.0, "{}", scrape.text);
    assert_eq!(scrape.status(429), 1.0);
    assert_eq!(
        scrape.get("floodgate_proxy_upstream_errors_total", &[]),
        2.0
    );
    let decisions = "floodgate_decisions_total";
    assert_eq!(scrape.limiter(decisions, Some("admitted")), 2.0);
    assert_eq!(scrape.limiter(decisions, Some("rejected")), 1.0);
    assert_eq!(scrape.added_count(), 3);
    let (exited, counts) = proxy.stop();
    assert!(exited);
    assert!(counts.ends_with("upstream errors 2"), "{counts}");
}

/// What an operator must see once is said once, on standard error: here,
/// the cap reached (two newcomers refused by it, one line).
#[tokio::test]
async fn the_cap_reached_is_logged_once() {
    let upstream = upstream().await;
    let proxy = Proxy::start(&[
        "--upstream",
        &upstream,
        "--policy",
        "gcra",
        "--limit",
        "10",
        "--window",
        "1h",
        "--key",
        "header:X-Api-Key",
        "--max-clients",
        "1",
    ]);
    for key in ["a", "b", "c", "a"] {
        let (status, _, _) = send(Method::GET, &proxy.url("/"), &[("x-api-key", key)]).await;
        let expected = if key == "a" { 200 } else { 429 };
        assert_eq!(status.as_u16(), expected, "{key}");
    }
    let (exited, stderr) = proxy.stop_with_stderr();
    assert!(exited);
    let cap: Vec<&String> = stderr
        .iter()
        .filter(|line| line.contains("the cap of 1 clients is reached"))
        .collect();
    assert_eq!(cap.len(), 1, "{stderr:#?}");
    assert!(cap[0].contains("WARN"), "{cap:?}");
}

/// `--state-every` to a directory that went away while the proxy ran:
/// each failed save is logged and counted in `/metrics`, and the saves
/// start again once the directory is back; the stop's save then succeeds.
#[tokio::test]
async fn failed_periodic_saves_are_logged_counted_and_tried_again() {
    let upstream = upstream().await;
    let dir = std::env::temp_dir().join(format!("floodgate-proxy-saves-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("x.state");
    let path = path.to_str().unwrap();
    let proxy = Proxy::start(&[
        "--upstream",
        &upstream,
        "--rule",
        "fixed-window:10/1d",
        "--key",
        "header:x-key",
        "--state",
        path,
        "--state-every",
        "20ms",
    ]);
    let (status, _, _) = send(Method::GET, &proxy.url("/"), &[("x-key", "a")]).await;
    assert_eq!(status, StatusCode::OK);
    // Moved away in one step, so no save under way can put a file back.
    let gone = dir.with_extension("gone");
    std::fs::rename(&dir, &gone).unwrap();
    std::fs::remove_dir_all(&gone).unwrap();
    let saves = |scrape: &Scrape| {
        (
            scrape.get("floodgate_proxy_state_saves_total", &[]),
            scrape.get("floodgate_proxy_state_save_failures_total", &[]),
        )
    };
    let patience = std::time::Instant::now();
    // Ends once two saves failed, or fails the test past PATIENCE.
    loop {
        let scrape = Scrape::take(&proxy).await;
        assert!(
            scrape
                .text
                .contains("# TYPE floodgate_proxy_state_save_failures_total counter"),
            "{}",
            scrape.text
        );
        if saves(&scrape).1 >= 2.0 {
            break;
        }
        assert!(patience.elapsed() < PATIENCE, "no failed save counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::create_dir(&dir).unwrap();
    let before = saves(&Scrape::take(&proxy).await).0;
    // Ends once a save after the directory came back was made, or fails
    // the test past PATIENCE.
    loop {
        if saves(&Scrape::take(&proxy).await).0 > before && std::fs::metadata(path).is_ok() {
            break;
        }
        assert!(
            patience.elapsed() < PATIENCE,
            "no save once the directory is back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (exited, stderr) = proxy.stop_with_stderr();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(exited, "{stderr:#?}");
    let failed = stderr
        .iter()
        .find(|line| line.contains("cannot save to"))
        .expect("a failed save logged");
    assert!(failed.contains("WARN"), "{failed}");
    assert!(
        failed.contains(&format!(
            "floodgate: cannot save to {path}: No such file or directory (os error 2); trying \
             again in 20ms (1 failed so far)"
        )),
        "{failed}"
    );
    assert!(
        stderr
            .iter()
            .any(|line| *line == format!("floodgate proxy: saved 1 client to {path}")),
        "{stderr:#?}"
    );
}
