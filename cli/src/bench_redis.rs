//! `floodgate bench --backend redis://HOST:PORT`: decisions per second
//! through Redis with 1, 4 and 16 connections (one calling thread each),
//! with p50 and p99 latency per decision, beside `redis-benchmark`'s raw
//! `INCR` rate on the same server with the same client counts.
//!
//! Every decision is one `EVALSHA` on Redis's clock (the script reads
//! `TIME`), for 10,000 clients drawn uniformly, so the rows measure the
//! round trip and the script, not one hot key. Keys go under the prefix
//! `floodgate-bench`, cleared before and after.

use std::fmt::Write as _;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use floodgate::redis::{RedisLimiter, RedisOptions};
use floodgate::{Config, PolicyKind};

const PREFIX: &str = "floodgate-bench";
const CLIENTS: u64 = 10_000;

/// One measured row.
struct Row {
    policy: PolicyKind,
    connections: usize,
    decisions_per_sec: f64,
    admitted: f64,
    p50_us: f64,
    p99_us: f64,
    incr: Option<Incr>,
}

/// `redis-benchmark -t incr` at one client count.
#[derive(Clone, Copy)]
struct Incr {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// Runs the Redis rows: `limit` per `window_us` microseconds per client.
pub fn run(
    url: &str,
    policies: &[PolicyKind],
    connections: &[usize],
    limit: u64,
    window_us: u64,
    quick: bool,
    json: bool,
) -> ExitCode {
    let slice = if quick {
        Duration::from_millis(300)
    } else {
        Duration::from_millis(1_500)
    };
    let config = match Config::per_ticks(limit, window_us.max(limit)) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("floodgate bench: {error}");
            return ExitCode::from(2);
        }
    };
    let incr: Vec<Option<Incr>> = connections
        .iter()
        .map(|&clients| redis_benchmark(url, clients, slice))
        .collect();
    let mut rows = Vec::new();
    for &policy in policies {
        for (index, &threads) in connections.iter().enumerate() {
            let options = RedisOptions::new()
                .prefix(PREFIX)
                .timeout(Duration::from_secs(2))
                .connections(threads);
            let limiter = match RedisLimiter::new(url, policy, config, options) {
                Ok(limiter) => limiter,
                Err(error) => {
                    eprintln!("floodgate bench: --backend: {error}");
                    return ExitCode::from(2);
                }
            };
            if let Err(error) = limiter.clear_prefix(PREFIX) {
                eprintln!("floodgate bench: --backend {url}: {error}");
                return ExitCode::from(1);
            }
            match measure(&limiter, threads, slice) {
                Ok(mut row) => {
                    row.policy = policy;
                    row.incr = incr[index];
                    rows.push(row);
                }
                Err(error) => {
                    eprintln!("floodgate bench: --backend {url}: {error}");
                    return ExitCode::from(1);
                }
            }
            let _ = limiter.clear_prefix(PREFIX);
        }
    }
    if json {
        println!("{}", to_json(&rows));
    } else {
        println!(
            "floodgate bench --backend {url}: {} checks per {} us per client on Redis's clock, \
             {CLIENTS} uniform clients, {} ms per row, one thread per connection",
            config.limit(),
            config.window(),
            slice.as_millis()
        );
        print!("{}", table(&rows));
    }
    ExitCode::SUCCESS
}

/// `threads` threads, each with its own connection, checking uniformly
/// drawn clients for `slice`.
fn measure(
    limiter: &RedisLimiter,
    threads: usize,
    slice: Duration,
) -> Result<Row, floodgate::redis::RedisError> {
    let start = Instant::now();
    let results: Vec<Result<(Vec<u32>, u64), _>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(0x5EED ^ thread as u64);
                    let mut latencies = Vec::with_capacity(1 << 16);
                    let mut admitted = 0;
                    let mut key = String::new();
                    while start.elapsed() < slice {
                        key.clear();
                        let _ = write!(key, "client-{}", rng.u64(..CLIENTS));
                        let before = Instant::now();
                        let decision = limiter.try_check(&key)?;
                        let nanos = before.elapsed().as_nanos();
                        latencies.push(u32::try_from(nanos).unwrap_or(u32::MAX));
                        admitted += u64::from(decision.allowed);
                    }
                    Ok((latencies, admitted))
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a bench thread panicked"))
            .collect()
    });
    let elapsed = start.elapsed();
    let mut latencies = Vec::new();
    let mut admitted = 0;
    for result in results {
        let (mut own, own_admitted) = result?;
        latencies.append(&mut own);
        admitted += own_admitted;
    }
    latencies.sort_unstable();
    let quantile = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q) as usize)
            .map_or(0.0, |&ns| f64::from(ns) / 1e3)
    };
    Ok(Row {
        policy: PolicyKind::Gcra,
        connections: threads,
        decisions_per_sec: latencies.len() as f64 / elapsed.as_secs_f64(),
        admitted: admitted as f64 / latencies.len().max(1) as f64,
        p50_us: quantile(0.50),
        p99_us: quantile(0.99),
        incr: None,
    })
}

/// `host` and `port` of a `redis://[user[:password]@]host[:port][/db]` URL.
fn host_port(url: &str) -> Option<(String, u16)> {
    let rest = url.strip_prefix("redis://")?;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let authority = rest.split('/').next()?;
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host.to_owned(), port.parse().ok()?)),
        None => Some((authority.to_owned(), 6379)),
    }
}

/// `redis-benchmark -t incr` with `clients` clients for about `slice`, if it
/// is on the PATH and the URL has no password (it is not passed on).
fn redis_benchmark(url: &str, clients: usize, slice: Duration) -> Option<Incr> {
    let (host, port) = host_port(url)?;
    if url.contains('@') {
        return None;
    }
    // About 40,000 INCR per second per client, capped: enough requests to
    // run for roughly the slice.
    let requests = (40_000.0 * slice.as_secs_f64() * clients as f64).clamp(10_000.0, 2e6) as u64;
    let output = Command::new("redis-benchmark")
        .args(["-h", &host, "-p", &port.to_string(), "-t", "incr", "--csv"])
        .args(["-c", &clients.to_string(), "-n", &requests.to_string()])
        .output()
        .ok()?;
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",
    // "p95_latency_ms","p99_latency_ms","max_latency_ms"
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().find(|line| line.starts_with("\"INCR\""))?;
    let fields: Vec<f64> = line
        .split(',')
        .skip(1)
        .map(|field| field.trim_matches('"').parse().ok())
        .collect::<Option<_>>()?;
    Some(Incr {
        per_sec: *fields.first()?,
        p50_ms: *fields.get(3)?,
        p99_ms: *fields.get(5)?,
    })
}

fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let header = format!(
        "{:<24} {:>5} {:>12} {:>8} {:>8} {:>8} {:>12} {:>9} {:>9} {:>8}",
        "policy",
        "conns",
        "decisions/s",
        "p50 us",
        "p99 us",
        "admitted",
        "INCR/s",
        "INCR p50",
        "INCR p99",
        "vs INCR"
    );
    let _ = writeln!(out, "\n{header}");
    let _ = writeln!(out, "{}", "-".repeat(header.len()));
    for row in rows {
        let (incr, p50, p99, ratio) = match row.incr {
            Some(incr) => (
                format!("{:.0}", incr.per_sec),
                format!("{:.0}", incr.p50_ms * 1e3),
                format!("{:.0}", incr.p99_ms * 1e3),
                format!("{:.2}x", row.decisions_per_sec / incr.per_sec),
            ),
            None => ("n/a".into(), "n/a".into(), "n/a".into(), String::new()),
        };
        let _ = writeln!(
            out,
            "{:<24} {:>5} {:>12.0} {:>8.1} {:>8.1} {:>7.1}% {:>12} {:>9} {:>9} {:>8}",
            row.policy.name(),
            row.connections,
            row.decisions_per_sec,
            row.p50_us,
            row.p99_us,
            row.admitted * 100.0,
            incr,
            p50,
            p99,
            ratio
        );
    }
    out.push_str(
        "\nINCR: redis-benchmark -t incr with as many clients, same server, same run \
         (latencies in us; n/a without redis-benchmark on the PATH).\n",
    );
    out
}

fn to_json(rows: &[Row]) -> String {
    super::json_rows(rows.iter().map(|row| {
        serde_json::json!({
            "policy": row.policy.name(),
            "engine": "redis",
            "connections": row.connections,
            "ops_per_sec": row.decisions_per_sec.round(),
            "p50_us": row.p50_us,
            "p99_us": row.p99_us,
            "admitted": row.admitted,
            "incr_per_sec": row.incr.map(|i| i.per_sec),
            "incr_p50_us": row.incr.map(|i| i.p50_ms * 1e3),
            "incr_p99_us": row.incr.map(|i| i.p99_ms * 1e3),
        })
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_host_and_port() {
        assert_eq!(
            host_port("redis://127.0.0.1:6399"),
            Some(("127.0.0.1".into(), 6399))
        );
        assert_eq!(host_port("redis://cache/2"), Some(("cache".into(), 6379)));
        assert_eq!(host_port("redis://u:p@h:1/0"), Some(("h".into(), 1)));
        assert_eq!(host_port("http://h:1"), None);
    }
}
