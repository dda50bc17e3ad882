//! `floodgate bench --rls`: a `ShouldRateLimit` call to `floodgate rls`
//! beside the same work through `floodgate proxy`, a refused request (one
//! request in, one decision out, no upstream), measured in one run.
//!
//! Both servers are this binary, started as child processes on loopback
//! ports, and are stopped at the end. One client thread (a current-thread
//! runtime) drives 1, 4 and 16 connections (`--connections`), each a
//! closed loop of calls: the proxy over HTTP/1.1 with keep-alive, the
//! service over gRPC on HTTP/2 (h2's client, one stream at a time per
//! connection, a call's headers and message in one TCP segment as Envoy
//! sends them). Four subjects take turns in three rounds:
//!
//! - `proxy 429`: `floodgate proxy` under `fixed-window:1/1h`, every
//!   request refused after the first;
//! - `rls refused`: one descriptor under `requests_per_unit: 1` an hour;
//! - `rls admitted`: one descriptor under a limit the run never reaches;
//! - `h2 floor`: hyper's HTTP/2 server (the one tonic serves on) answering
//!   every call with the same encoded refusal, with no decoding, no
//!   routing and no decision, on a runtime of one thread in this process:
//!   what any service on this stack pays for a call.
//!
//! Each row is the median of its rounds by calls per second: calls per
//! second, the p50, p99, p99.99 and max of a call as the client saw it,
//! and the server's CPU time per call (the sum over its threads'
//! `/proc/PID/task/*/schedstat`), which does not count the client's own
//! work. The ratio is the proxy's calls per second over the subject's: a
//! call's cost against the proxy's refusal, 1.0x being the same.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use floodgate_cli::rls::proto::{
    Code, Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse,
};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message as _;

/// Rounds per row: the subjects take turns.
const ROUNDS: usize = 3;

/// The service's path.
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// What is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Subject {
    Proxy,
    RlsRefused,
    RlsAdmitted,
    Floor,
}

impl Subject {
    const ALL: [Subject; 4] = [
        Subject::Proxy,
        Subject::RlsRefused,
        Subject::RlsAdmitted,
        Subject::Floor,
    ];

    fn name(self) -> &'static str {
        match self {
            Subject::Proxy => "proxy 429",
            Subject::RlsRefused => "rls refused",
            Subject::RlsAdmitted => "rls admitted",
            Subject::Floor => "h2 floor",
        }
    }
}

/// One measured round or row.
#[derive(Clone, Copy, Debug)]
struct Measured {
    calls: usize,
    calls_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    p9999_us: f64,
    max_us: f64,
    /// The server's CPU time per call.
    server_us: f64,
}

/// What is called: a server started as a child process (killed when
/// dropped), or the floor's runtime in this process.
struct Server {
    address: SocketAddr,
    kind: Kind,
}

enum Kind {
    Child(Child),
    /// Its worker thread is named [`FLOOR_THREAD`].
    Floor(#[allow(dead_code)] tokio::runtime::Runtime),
}

/// The floor's worker thread, whose CPU time is the floor's.
const FLOOR_THREAD: &str = "bench-h2-floor";

impl Server {
    /// Starts this binary with `args` and waits for its `listening on`
    /// line.
    fn start(args: &[&str]) -> Result<Server, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start `floodgate {}`: {e}", args[0]))?;
        let stdout = child.stdout.take().expect("piped");
        let mut server = Server {
            address: SocketAddr::from(([127, 0, 0, 1], 0)),
            kind: Kind::Child(child),
        };
        // Ends at the line, or at the end of the output when the server
        // exits (its pipe closes).
        for line in BufReader::new(stdout).lines() {
            let line = line.map_err(|e| format!("`floodgate {}`'s output: {e}", args[0]))?;
            if let Some(address) = line.strip_prefix("listening on http://") {
                server.address = address
                    .parse()
                    .map_err(|e| format!("`floodgate {}` printed {line:?}: {e}", args[0]))?;
                return Ok(server);
            }
        }
        Err(format!(
            "`floodgate {}` exited before listening",
            args.join(" ")
        ))
    }

    /// hyper's HTTP/2 server on one thread, answering every call with
    /// `answer` (a gRPC message, framed) and `grpc-status: 0`.
    fn floor(answer: Bytes) -> Result<Server, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(FLOOR_THREAD)
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the floor's runtime: {e}"))?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .map_err(|e| format!("the floor cannot listen: {e}"))?;
        let address = listener
            .local_addr()
            .map_err(|e| format!("the floor's address: {e}"))?;
        runtime.spawn(async move {
            // Ends with the runtime, dropped with the server.
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let answer = answer.clone();
                let service = hyper::service::service_fn(
                    move |request: hyper::Request<hyper::body::Incoming>| {
                        let answer = answer.clone();
                        async move {
                            request.into_body().collect().await?;
                            let mut trailers = hyper::HeaderMap::new();
                            trailers.insert(
                                "grpc-status",
                                hyper::header::HeaderValue::from_static("0"),
                            );
                            let body =
                                Full::new(answer).with_trailers(async { Some(Ok(trailers)) });
                            Ok::<_, hyper::Error>(
                                hyper::Response::builder()
                                    .header(hyper::header::CONTENT_TYPE, "application/grpc")
                                    .body(body)
                                    .expect("a valid response"),
                            )
                        }
                    },
                );
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        Ok(Server {
            address,
            kind: Kind::Floor(runtime),
        })
    }

    /// The CPU time its threads have run, from the kernel's scheduler.
    fn cpu(&self) -> Duration {
        let (dir, floor) = match &self.kind {
            Kind::Child(child) => (format!("/proc/{}/task", child.id()), false),
            Kind::Floor(_) => ("/proc/self/task".to_owned(), true),
        };
        let Ok(tasks) = std::fs::read_dir(dir) else {
            return Duration::ZERO;
        };
        let nanos: u64 = tasks
            .filter_map(Result::ok)
            .filter(|task| {
                !floor
                    || std::fs::read_to_string(task.path().join("comm"))
                        .is_ok_and(|name| name.trim_end() == FLOOR_THREAD)
            })
            .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
            .filter_map(|text| text.split_whitespace().next()?.parse::<u64>().ok())
            .sum();
        Duration::from_nanos(nanos)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Kind::Child(child) = &mut self.kind {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The service's configuration: one descriptor always refused after its
/// first call, one never refused.
const CONFIG: &str = "domain: bench\n\
                      descriptors:\n\
                      \x20 - key: refused\n\
                      \x20   rate_limit: {unit: hour, requests_per_unit: 1}\n\
                      \x20 - key: admitted\n\
                      \x20   rate_limit: {unit: second, requests_per_unit: 4000000000}\n";

/// Runs the bench.
pub fn run(connections: &[usize], quick: bool, json: bool) -> ExitCode {
    match measure_all(connections, quick) {
        Ok(rows) => {
            if json {
                println!("{}", to_json(&rows));
            } else {
                print!("{}", table(&rows));
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("floodgate bench --rls: {error}");
            ExitCode::FAILURE
        }
    }
}

type Row = (usize, Subject, Measured);

fn measure_all(connections: &[usize], quick: bool) -> Result<Vec<Row>, String> {
    let config =
        std::env::temp_dir().join(format!("floodgate-bench-rls-{}.yaml", std::process::id()));
    std::fs::write(&config, CONFIG)
        .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
    let removed = Removed(&config);
    let config_path = config
        .to_str()
        .ok_or("the temporary directory's path is not UTF-8")?;
    let rls = Server::start(&["rls", "--listen", "127.0.0.1:0", "--config", config_path])?;
    // The upstream is a closed port: the first request is answered 502,
    // every other is refused before it would be forwarded.
    let proxy = Server::start(&[
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        "http://127.0.0.1:9",
        "--rule",
        "fixed-window:1/1h",
    ])?;
    let floor = Server::floor(grpc_message(&RateLimitResponse {
        overall_code: Code::OverLimit as i32,
        ..Default::default()
    }))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the client's runtime: {e}"))?;
    let slice = if quick {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(2)
    };
    eprintln!(
        "floodgate bench --rls: {} connection counts x {} subjects x {ROUNDS} rounds of {:?}",
        connections.len(),
        Subject::ALL.len(),
        slice
    );
    let mut rows = Vec::new();
    for &count in connections {
        let mut rounds: Vec<Vec<Measured>> = vec![Vec::new(); Subject::ALL.len()];
        for _ in 0..ROUNDS {
            for (index, subject) in Subject::ALL.into_iter().enumerate() {
                let server = match subject {
                    Subject::Proxy => &proxy,
                    Subject::Floor => &floor,
                    Subject::RlsRefused | Subject::RlsAdmitted => &rls,
                };
                let local = tokio::task::LocalSet::new();
                let measured = local.block_on(&runtime, round(server, subject, count, slice))?;
                rounds[index].push(measured);
            }
        }
        for (index, subject) in Subject::ALL.into_iter().enumerate() {
            let mut measured = rounds[index].clone();
            measured.sort_by(|a, b| a.calls_per_sec.total_cmp(&b.calls_per_sec));
            rows.push((count, subject, measured[measured.len() / 2]));
        }
        eprintln!("  {count} connection(s) done");
    }
    drop(removed);
    Ok(rows)
}

/// Removes the configuration file when dropped.
struct Removed<'a>(&'a std::path::Path);

impl Drop for Removed<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// One round: `count` connections calling `server` for `slice`.
async fn round(
    server: &Server,
    subject: Subject,
    count: usize,
    slice: Duration,
) -> Result<Measured, String> {
    let mut callers = Vec::with_capacity(count);
    for _ in 0..count {
        callers.push(Caller::connect(server.address, subject).await?);
    }
    // One call each before the clock starts: the connections are up and
    // the proxy's one admission is spent.
    for caller in &mut callers {
        caller.call(true).await?;
    }
    let cpu_before = server.cpu();
    let start = Instant::now();
    let deadline = start + slice;
    // Each caller a task of this thread, so that the connections' calls
    // interleave as a server's clients' would.
    let loops: Vec<_> = callers
        .into_iter()
        .map(|mut caller| {
            tokio::task::spawn_local(async move {
                let mut latencies: Vec<u32> = Vec::with_capacity(1 << 16);
                while Instant::now() < deadline {
                    let began = Instant::now();
                    caller.call(false).await?;
                    latencies.push(u32::try_from(began.elapsed().as_nanos()).unwrap_or(u32::MAX));
                }
                Ok::<_, String>(latencies)
            })
        })
        .collect();
    let mut all = Vec::new();
    for caller in loops {
        all.extend(
            caller
                .await
                .map_err(|e| format!("a caller failed: {e}"))??,
        );
    }
    let elapsed = start.elapsed();
    let cpu = server.cpu().saturating_sub(cpu_before);
    if all.is_empty() {
        return Err(format!("no call to {} was answered", subject.name()));
    }
    all.sort_unstable();
    let at = |q: f64| {
        let index = ((all.len() as f64 * q) as usize).min(all.len() - 1);
        f64::from(all[index]) / 1e3
    };
    let calls = all.len() as f64;
    Ok(Measured {
        calls: all.len(),
        calls_per_sec: calls / elapsed.as_secs_f64(),
        p50_us: at(0.5),
        p99_us: at(0.99),
        p9999_us: at(0.9999),
        max_us: f64::from(*all.last().expect("not empty")) / 1e3,
        server_us: cpu.as_secs_f64() * 1e6 / calls,
    })
}

/// A gRPC message as it goes on the wire: not compressed (0), its length,
/// the message.
fn grpc_message(message: &impl prost::Message) -> Bytes {
    let encoded = message.encode_to_vec();
    let mut framed = Vec::with_capacity(5 + encoded.len());
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(encoded.len()).expect("small").to_be_bytes());
    framed.extend_from_slice(&encoded);
    Bytes::from(framed)
}

/// One connection and what it sends.
enum Caller {
    Http1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
    Grpc {
        sender: h2::client::SendRequest<Bytes>,
        uri: hyper::Uri,
        body: Bytes,
        expected: Code,
    },
}

impl Caller {
    async fn connect(address: SocketAddr, subject: Subject) -> Result<Caller, String> {
        let stream = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|e| format!("cannot connect to {address}: {e}"))?;
        stream
            .set_nodelay(true)
            .map_err(|e| format!("TCP_NODELAY on {address}: {e}"))?;
        if subject == Subject::Proxy {
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| format!("HTTP/1.1 to {address}: {e}"))?;
            tokio::task::spawn_local(connection);
            return Ok(Caller::Http1(sender));
        }
        // h2's client rather than hyper's: hyper sends a request's body
        // from a task of its own, after its headers, so each call would be
        // two TCP segments where Envoy sends one.
        let (sender, connection) = h2::client::handshake(stream)
            .await
            .map_err(|e| format!("HTTP/2 to {address}: {e}"))?;
        tokio::task::spawn_local(connection);
        let (key, expected) = match subject {
            Subject::RlsAdmitted => ("admitted", Code::Ok),
            _ => ("refused", Code::OverLimit),
        };
        let request = RateLimitRequest {
            domain: "bench".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.into(),
                    value: "10.0.0.1".into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        Ok(Caller::Grpc {
            sender,
            uri: format!("http://{address}{PATH}")
                .parse()
                .expect("a valid URI"),
            body: grpc_message(&request),
            expected,
        })
    }

    /// One call, its answer read whole and checked; a `warming` call may
    /// be the one admission of a limit that refuses the others.
    async fn call(&mut self, warming: bool) -> Result<(), String> {
        match self {
            Caller::Http1(sender) => {
                sender
                    .ready()
                    .await
                    .map_err(|e| format!("the proxy: {e}"))?;
                let request = hyper::Request::get("/")
                    .header(hyper::header::HOST, "bench")
                    .body(Empty::new())
                    .expect("a valid request");
                let response = sender
                    .send_request(request)
                    .await
                    .map_err(|e| format!("the proxy: {e}"))?;
                let status = response.status().as_u16();
                response
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| format!("the proxy's body: {e}"))?;
                // The first call of the run is the one admission, answered
                // 502 by the closed upstream.
                if status != 429 && !(warming && status == 502) {
                    return Err(format!("the proxy answered {status}, not 429"));
                }
                Ok(())
            }
            Caller::Grpc {
                sender,
                uri,
                body,
                expected,
            } => {
                let mut ready = sender
                    .clone()
                    .ready()
                    .await
                    .map_err(|e| format!("rls: {e}"))?;
                let request = hyper::Request::post(uri.clone())
                    .header(hyper::header::CONTENT_TYPE, "application/grpc")
                    .header(hyper::header::TE, "trailers")
                    .body(())
                    .expect("a valid request");
                // Both frames queued before the connection's task runs
                // (this thread's next await): one write.
                let (response, mut stream) = ready
                    .send_request(request, false)
                    .map_err(|e| format!("rls: {e}"))?;
                stream
                    .send_data(body.clone(), true)
                    .map_err(|e| format!("rls: {e}"))?;
                let response = response.await.map_err(|e| format!("rls: {e}"))?;
                let mut answer = response.into_body();
                let mut bytes = Vec::new();
                // Ends at the stream's end: the server's last DATA frame or
                // its trailers.
                while let Some(chunk) = answer.data().await {
                    let chunk = chunk.map_err(|e| format!("rls's answer: {e}"))?;
                    let _ = answer.flow_control().release_capacity(chunk.len());
                    bytes.extend_from_slice(&chunk);
                }
                let trailers = answer
                    .trailers()
                    .await
                    .map_err(|e| format!("rls's trailers: {e}"))?;
                let status = trailers
                    .as_ref()
                    .and_then(|trailers| trailers.get("grpc-status"))
                    .map(|value| value.as_bytes().to_vec());
                if status.as_deref() != Some(b"0") {
                    return Err(format!("rls answered grpc-status {status:?}"));
                }
                let message = bytes.get(5..).ok_or("rls's answer has no message")?;
                let answer = RateLimitResponse::decode(message)
                    .map_err(|e| format!("rls's answer does not decode: {e}"))?;
                if answer.overall_code != *expected as i32 && !warming {
                    return Err(format!(
                        "rls answered overall_code {}, not {}",
                        answer.overall_code, *expected as i32
                    ));
                }
                Ok(())
            }
        }
    }
}

fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| connections | subject | calls/s | p50 (us) | p99 (us) | p99.99 (us) | max (us) | server CPU per call (us) | proxy 429 / this |"
    );
    let _ = writeln!(
        out,
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for (count, subject, measured) in rows {
        let proxy = rows
            .iter()
            .find(|(c, s, _)| c == count && *s == Subject::Proxy)
            .map(|(_, _, m)| m.calls_per_sec);
        let ratio = proxy.map_or(String::new(), |proxy| {
            format!("{:.2}x", proxy / measured.calls_per_sec)
        });
        let _ = writeln!(
            out,
            "| {count} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {ratio} |",
            subject.name(),
            measured.calls_per_sec,
            measured.p50_us,
            measured.p99_us,
            measured.p9999_us,
            measured.max_us,
            measured.server_us,
        );
    }
    out
}

fn to_json(rows: &[Row]) -> String {
    let rows: Vec<_> = rows
        .iter()
        .map(|(count, subject, m)| {
            serde_json::json!({
                "connections": count,
                "subject": subject.name(),
                "calls": m.calls,
                "calls_per_sec": m.calls_per_sec,
                "p50_us": m.p50_us,
                "p99_us": m.p99_us,
                "p99_99_us": m.p9999_us,
                "max_us": m.max_us,
                "server_cpu_us_per_call": m.server_us,
            })
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}
