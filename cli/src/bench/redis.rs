//! `floodgate bench --backend redis://HOST:PORT` (or
//! `redis-cluster://HOST:PORT[,HOST:PORT…]`): decisions per second through
//! Redis with 1, 4 and 16 connections (one calling thread each), with p50
//! and p99 latency per decision, beside three floors measured in the same
//! run with as many clients:
//!
//! - `INCR`: `redis-benchmark -t incr`, the server's plain command rate;
//! - the Lua floor: `redis-benchmark` sending `EVALSHA` of an empty script
//!   (Redis runs scripts one at a time, so no script runs faster);
//! - the client floor: the `redis` crate's own blocking client (the one the
//!   limiter uses) doing `INCR`, one thread and connection each.
//!
//! At the largest connection count, the async limiter as well: as many
//! calls in flight on its one multiplexed connection, which pipelines them,
//! with its checks batched (the default: checks that wait together go out
//! as one script call) and with batching off, each check a call of its own.
//!
//! Every decision is one `EVALSHA` on Redis's clock (the script reads
//! `TIME`; a batched async row's decisions share calls), for 10,000
//! clients drawn uniformly, so the rows measure the round trip and the
//! script, not one hot key. For each connection count
//! the floors and every policy take turns in three rounds, and each figure
//! is the median of its rounds: a ratio compares figures that shared the
//! machine's noise.
//!
//! Then one flood row per policy: one client checked as fast as one thread
//! can (yielding the CPU between decisions to every thread that is ready,
//! so that the flood is not a core taken from Redis and the other clients
//! on a small machine), beside 1,000 clients checked by three threads
//! within their limits
//! ([`FLOOD_LIMIT`] per second each), first without the flood and then
//! with it. The flooding client has a limiter of its own (an instance of
//! its own, as the buggy app would), so its Redis calls are the server's
//! `EVALSHA` count from `INFO commandstats` (summed over the primaries of a
//! cluster) less the other instance's. Keys go under the prefix
//! `floodgate-bench`, cleared before and after.
//!
//! With a cluster, `redis-benchmark` runs against the first node named
//! (the floors of one node); the decisions spread over every node.

use std::fmt::Write as _;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use floodgate::redis::{AsyncRedisLimiter, RedisError, RedisLimiter, RedisOptions, CLUSTER_SCHEME};
use floodgate::{Config, PolicyKind};

const PREFIX: &str = "floodgate-bench";
const CLIENTS: u64 = 10_000;

/// The flood row's other clients, and their limit: checks per second each.
/// Three threads checking 1,000 clients stay well within 100 per second
/// each (they would need 100,000 decisions a second to reach it).
const FLOOD_OTHERS: u64 = 1_000;
const FLOOD_LIMIT: u64 = 100;
const FLOOD_THREADS: usize = 3;

/// One measured row.
struct Row {
    policy: PolicyKind,
    /// The blocking limiter with one thread per connection, or the async
    /// one with `connections` calls in flight on its one connection.
    pipelined: bool,
    /// For an async row: whether its checks were batched
    /// (`RedisOptions::batching`, the default) or each sent alone.
    batched: bool,
    connections: usize,
    decisions_per_sec: f64,
    admitted: f64,
    p50_us: f64,
    p99_us: f64,
    floors: Floors,
}

/// Rounds per row: the floors and every policy take turns.
const ROUNDS: usize = 3;

/// The element whose `key` is the median (the upper one of an even count).
fn median_by<T: Copy>(items: &[T], key: impl Fn(&T) -> f64) -> T {
    let mut sorted: Vec<T> = items.to_vec();
    sorted.sort_by(|a, b| key(a).total_cmp(&key(b)));
    sorted[sorted.len() / 2]
}

/// The floors at one client count.
#[derive(Clone, Copy, Default)]
struct Floors {
    /// `redis-benchmark -t incr`.
    incr: Option<Benchmark>,
    /// `redis-benchmark` `EVALSHA` of an empty script.
    script: Option<Benchmark>,
    /// The crate's own client doing `INCR`, per second.
    client_incr: Option<f64>,
}

impl Floors {
    /// Each floor's median over `rounds` (a floor missing from a round is
    /// left out; missing from all, it stays `None`).
    fn median(rounds: &[Floors]) -> Floors {
        let median = |values: Vec<Benchmark>| {
            (!values.is_empty()).then(|| median_by(&values, |b| b.per_sec))
        };
        Floors {
            incr: median(rounds.iter().filter_map(|f| f.incr).collect()),
            script: median(rounds.iter().filter_map(|f| f.script).collect()),
            client_incr: {
                let values: Vec<f64> = rounds.iter().filter_map(|f| f.client_incr).collect();
                (!values.is_empty()).then(|| median_by(&values, |&v| v))
            },
        }
    }
}

/// One `redis-benchmark` result.
#[derive(Clone, Copy)]
struct Benchmark {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// The flood row of one policy.
struct Flood {
    policy: PolicyKind,
    /// The flooding client.
    flooder: Measured,
    /// Its Redis calls per decision, from `INFO commandstats`.
    calls_per_decision: Option<f64>,
    /// The other clients beside the flood, and alone before it.
    others: Measured,
    others_alone: Measured,
    floors: Floors,
}

/// What one group of threads measured.
#[derive(Clone, Copy, Default)]
struct Measured {
    decisions: u64,
    decisions_per_sec: f64,
    admitted: f64,
    p50_us: f64,
    p99_us: f64,
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
    let flood_config = Config::per_ticks(FLOOD_LIMIT, 1_000_000).expect("a valid quota");
    let fail = |error: &dyn std::fmt::Display| {
        eprintln!("floodgate bench: --backend {url}: {error}");
        ExitCode::from(1)
    };
    let server = match Server::open(url) {
        Ok(server) => server,
        Err(error) => return fail(&error),
    };
    let build = |policy, config, threads| {
        let options = RedisOptions::new()
            .prefix(PREFIX)
            .timeout(Duration::from_secs(2))
            .connections(threads);
        RedisLimiter::new(url, policy, config, options)
    };
    let keys: Vec<String> = (0..CLIENTS).map(|id| format!("client-{id}")).collect();
    let round = slice / ROUNDS as u32;
    let mut rows = Vec::new();
    let mut floors_by_count = Vec::new();
    for &threads in connections {
        let mut limiters = Vec::new();
        for &policy in policies {
            match build(policy, config, threads) {
                Ok(limiter) => limiters.push((policy, limiter)),
                Err(error) => {
                    eprintln!("floodgate bench: --backend: {error}");
                    return ExitCode::from(2);
                }
            }
        }
        if let Err(error) = limiters[0].1.clear_prefix(PREFIX) {
            return fail(&error);
        }
        // Rounds: the floors, then every policy, then again; each figure
        // is the median of its rounds, so a ratio compares figures that
        // shared the machine's noise.
        // At the largest count, the async limiter too: as many calls in
        // flight, pipelined on its one multiplexed connection.
        let pipelined = threads == connections.iter().copied().max().unwrap_or(0);
        let mut floors = Vec::new();
        let mut measured: Vec<Vec<Measured>> = limiters.iter().map(|_| Vec::new()).collect();
        let mut measured_async: Vec<Vec<Measured>> = limiters.iter().map(|_| Vec::new()).collect();
        let mut measured_unbatched: Vec<Vec<Measured>> =
            limiters.iter().map(|_| Vec::new()).collect();
        for _ in 0..ROUNDS {
            floors.push(server.floors(threads, round));
            for ((_, limiter), rounds) in limiters.iter().zip(&mut measured) {
                match measure(limiter, threads, &keys, round, None) {
                    Ok(one) => rounds.push(one),
                    Err(error) => return fail(&error),
                }
            }
            if pipelined {
                for (batching, measured) in [
                    (true, &mut measured_async),
                    (false, &mut measured_unbatched),
                ] {
                    for ((policy, _), rounds) in limiters.iter().zip(measured.iter_mut()) {
                        match measure_async(url, *policy, config, batching, threads, &keys, round) {
                            Ok(one) => rounds.push(one),
                            Err(error) => return fail(&error),
                        }
                    }
                }
            }
        }
        let floors = Floors::median(&floors);
        floors_by_count.push((threads, floors));
        for (async_rows, batched, measured) in [
            (false, false, &measured),
            (true, true, &measured_async),
            (true, false, &measured_unbatched),
        ] {
            for ((policy, _), rounds) in limiters.iter().zip(measured) {
                if rounds.is_empty() {
                    continue;
                }
                let median = median_by(rounds, |m| m.decisions_per_sec);
                rows.push(Row {
                    policy: *policy,
                    pipelined: async_rows,
                    batched,
                    connections: threads,
                    decisions_per_sec: median.decisions_per_sec,
                    admitted: median.admitted,
                    p50_us: median.p50_us,
                    p99_us: median.p99_us,
                    floors,
                });
            }
        }
        let _ = limiters[0].1.clear_prefix(PREFIX);
    }
    rows.sort_by_key(|row| {
        let policy = policies.iter().position(|&p| p == row.policy);
        (policy, row.pipelined, !row.batched, row.connections)
    });
    let flood_floors = floors_by_count
        .iter()
        .find(|(count, _)| *count == FLOOD_THREADS + 1)
        .map_or_else(
            || server.floors(FLOOD_THREADS + 1, slice),
            |(_, floors)| *floors,
        );
    let mut floods = Vec::new();
    for &policy in policies {
        let (others, flooder) = match (
            build(policy, flood_config, FLOOD_THREADS),
            build(policy, flood_config, 1),
        ) {
            (Ok(others), Ok(flooder)) => (others, flooder),
            (Err(error), _) | (_, Err(error)) => {
                eprintln!("floodgate bench: --backend: {error}");
                return ExitCode::from(2);
            }
        };
        match flood(&server, policy, &others, &flooder, slice) {
            Ok(mut row) => {
                row.floors = flood_floors;
                floods.push(row);
            }
            Err(error) => return fail(&error),
        }
        let _ = others.clear_prefix(PREFIX);
    }
    if json {
        println!("{}", to_json(&rows, &floods));
    } else {
        println!(
            "floodgate bench --backend {url}: {} checks per {} us per client on Redis's clock, \
             {CLIENTS} uniform clients, {} ms per row, one thread per connection",
            config.limit(),
            config.window(),
            slice.as_millis()
        );
        print!("{}", table(&rows, &floods));
    }
    ExitCode::SUCCESS
}

/// `threads` threads checking `keys` drawn uniformly for `slice` (or until
/// `stop` is set, if given), each thread with its own connection.
fn measure(
    limiter: &RedisLimiter,
    threads: usize,
    keys: &[String],
    slice: Duration,
    stop: Option<&AtomicBool>,
) -> Result<Measured, RedisError> {
    let start = Instant::now();
    let results: Vec<Result<(Vec<u32>, u64), RedisError>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(0x5EED ^ thread as u64);
                    let mut latencies = Vec::with_capacity(1 << 16);
                    let mut admitted = 0;
                    // Relaxed: a flag polled between decisions, publishing
                    // nothing; the scope's join orders everything after.
                    while stop.map_or(start.elapsed() < slice, |stop| {
                        !stop.load(Ordering::Relaxed)
                    }) {
                        let key = &keys[rng.usize(..keys.len())];
                        let before = Instant::now();
                        let decision = limiter.try_check(key)?;
                        let nanos = before.elapsed().as_nanos();
                        latencies.push(u32::try_from(nanos).unwrap_or(u32::MAX));
                        admitted += u64::from(decision.allowed());
                        if stop.is_some() {
                            // The flooder: as fast as it can, but giving
                            // way to every thread that is ready (Redis's and
                            // the other clients'), so that it measures what
                            // the flood costs them through Redis, not a
                            // core taken from them.
                            std::thread::yield_now();
                        }
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
    Ok(summarise(latencies, admitted, elapsed))
}

/// `in_flight` tasks on one [`AsyncRedisLimiter`] (its one multiplexed
/// connection, which pipelines them; with `batching`, checks that wait
/// together go out as one call), on two tokio worker threads, checking
/// `keys` drawn uniformly for `slice`.
fn measure_async(
    url: &str,
    policy: PolicyKind,
    config: Config,
    batching: bool,
    in_flight: usize,
    keys: &[String],
    slice: Duration,
) -> Result<Measured, Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let keys: std::sync::Arc<[String]> = keys.into();
    runtime.block_on(async {
        let options = RedisOptions::new()
            .prefix(PREFIX)
            .timeout(Duration::from_secs(2))
            .batching(batching);
        let limiter = AsyncRedisLimiter::new(url, policy, config, options).await?;
        let start = Instant::now();
        let tasks: Vec<_> = (0..in_flight)
            .map(|task| {
                let (limiter, keys) = (limiter.clone(), std::sync::Arc::clone(&keys));
                tokio::spawn(async move {
                    let mut rng = fastrand::Rng::with_seed(0xA5EED ^ task as u64);
                    let mut latencies = Vec::with_capacity(1 << 14);
                    let mut admitted = 0;
                    while start.elapsed() < slice {
                        let key = &keys[rng.usize(..keys.len())];
                        let before = Instant::now();
                        let decision = limiter.try_check(key).await?;
                        let nanos = before.elapsed().as_nanos();
                        latencies.push(u32::try_from(nanos).unwrap_or(u32::MAX));
                        admitted += u64::from(decision.allowed());
                    }
                    Ok::<_, RedisError>((latencies, admitted))
                })
            })
            .collect();
        let mut latencies = Vec::new();
        let mut admitted = 0;
        for task in tasks {
            let (mut own, own_admitted) = task.await??;
            latencies.append(&mut own);
            admitted += own_admitted;
        }
        Ok(summarise(latencies, admitted, start.elapsed()))
    })
}

fn summarise(mut latencies: Vec<u32>, admitted: u64, elapsed: Duration) -> Measured {
    latencies.sort_unstable();
    let quantile = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q) as usize)
            .map_or(0.0, |&ns| f64::from(ns) / 1e3)
    };
    Measured {
        decisions: latencies.len() as u64,
        decisions_per_sec: latencies.len() as f64 / elapsed.as_secs_f64(),
        admitted: admitted as f64 / latencies.len().max(1) as f64,
        p50_us: quantile(0.50),
        p99_us: quantile(0.99),
    }
}

/// The flood row: the other clients alone for `slice`, then beside one
/// thread checking one client of its own instance as fast as it can.
fn flood(
    server: &Server,
    policy: PolicyKind,
    others: &RedisLimiter,
    flooder: &RedisLimiter,
    slice: Duration,
) -> Result<Flood, Box<dyn std::error::Error>> {
    others.clear_prefix(PREFIX)?;
    let keys: Vec<String> = (0..FLOOD_OTHERS).map(|id| format!("other-{id}")).collect();
    let others_alone = measure(others, FLOOD_THREADS, &keys, slice, None)?;
    let flooding = vec!["flooder".to_owned()];
    let stop = AtomicBool::new(false);
    let calls_before = server.evalsha_calls();
    let others_local_before = others.answered_locally();
    let (others_beside, flooded) = std::thread::scope(|scope| {
        let flood = scope.spawn(|| measure(flooder, 1, &flooding, slice, Some(&stop)));
        let beside = measure(others, FLOOD_THREADS, &keys, slice, None);
        // Relaxed: the flooder's join below orders everything.
        stop.store(true, Ordering::Relaxed);
        (beside, flood.join().expect("the flood thread panicked"))
    });
    let (others_beside, flooded) = (others_beside?, flooded?);
    let calls_after = server.evalsha_calls();
    let others_calls = others_beside.decisions - (others.answered_locally() - others_local_before);
    let calls_per_decision = calls_before.zip(calls_after).map(|(before, after)| {
        after.saturating_sub(before).saturating_sub(others_calls) as f64
            / flooded.decisions.max(1) as f64
    });
    Ok(Flood {
        policy,
        flooder: flooded,
        calls_per_decision,
        others: others_beside,
        others_alone,
        floors: Floors::default(),
    })
}

/// The server (or cluster) the bench runs against, for its floors and its
/// `INFO commandstats`.
struct Server {
    /// `host:port` of every node to read commandstats from (a cluster's
    /// primaries), the first also the one `redis-benchmark` runs against.
    nodes: Vec<(String, u16)>,
    /// Whether `redis-benchmark` may run (it is not given passwords).
    benchmark: bool,
    url: String,
}

impl Server {
    fn open(url: &str) -> Result<Self, String> {
        let (nodes, benchmark) = match url.strip_prefix(CLUSTER_SCHEME) {
            Some(list) => {
                let seeds: Vec<(String, u16)> = list
                    .split(',')
                    .filter_map(|node| host_port(&format!("redis://{}", node.trim())))
                    .collect();
                let seed = seeds
                    .first()
                    .ok_or_else(|| "a redis-cluster:// URL names no node".to_owned())?;
                (
                    cluster_primaries(seed).unwrap_or(seeds),
                    !list.contains('@'),
                )
            }
            None => (
                vec![host_port(url).ok_or_else(|| format!("not a Redis URL: {url}"))?],
                !url.contains('@'),
            ),
        };
        Ok(Self {
            nodes,
            benchmark,
            url: url.to_owned(),
        })
    }

    fn floors(&self, clients: usize, slice: Duration) -> Floors {
        let (host, port) = &self.nodes[0];
        let (incr, script) = if self.benchmark {
            let sha = connection(host, *port).and_then(|mut connection| {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg("")
                    .query::<String>(&mut connection)
                    .ok()
            });
            (
                redis_benchmark(host, *port, clients, slice, &["-t", "incr"], "\"INCR\""),
                sha.and_then(|sha| {
                    redis_benchmark(
                        host,
                        *port,
                        clients,
                        slice,
                        &["EVALSHA", &sha, "0"],
                        "\"EVALSHA",
                    )
                }),
            )
        } else {
            (None, None)
        };
        Floors {
            incr,
            script,
            client_incr: client_incr(&self.url, clients, slice),
        }
    }

    /// `EVALSHA` calls so far, summed over the nodes; `None` if a node
    /// did not say.
    fn evalsha_calls(&self) -> Option<u64> {
        self.nodes
            .iter()
            .map(|(host, port)| {
                let mut connection = connection(host, *port)?;
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query(&mut connection)
                    .ok()?;
                Some(commandstat_calls(&info, "evalsha"))
            })
            .sum()
    }
}

/// A plain connection to one node.
fn connection(host: &str, port: u16) -> Option<redis::Connection> {
    redis::Client::open(format!("redis://{host}:{port}"))
        .ok()?
        .get_connection_with_timeout(Duration::from_secs(2))
        .ok()
}

/// The primaries `CLUSTER NODES` lists on `seed`.
fn cluster_primaries((host, port): &(String, u16)) -> Option<Vec<(String, u16)>> {
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut connection(host, *port)?)
        .ok()?;
    let primaries: Vec<(String, u16)> = nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let flags = fields.get(2)?;
            if !flags.contains("master") || flags.contains("fail") {
                return None;
            }
            let address = fields.get(1)?.split('@').next()?;
            host_port(&format!("redis://{address}"))
        })
        .collect();
    (!primaries.is_empty()).then_some(primaries)
}

/// `calls` of `cmdstat_<command>` in `INFO commandstats`, 0 if absent.
fn commandstat_calls(info: &str, command: &str) -> u64 {
    let head = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.trim().strip_prefix(&head))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

/// The crate's own blocking client doing `INCR`, `clients` threads with a
/// connection each, for `slice`: INCRs per second.
fn client_incr(url: &str, clients: usize, slice: Duration) -> Option<f64> {
    let cluster = url.strip_prefix(CLUSTER_SCHEME).map(|list| {
        list.split(',')
            .map(|node| format!("redis://{}", node.trim()))
            .collect::<Vec<_>>()
    });
    let start = Instant::now();
    let counts: Vec<Option<u64>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..clients)
            .map(|thread| {
                let cluster = cluster.clone();
                scope.spawn(move || {
                    let mut connection: Box<dyn redis::ConnectionLike> = match cluster {
                        Some(nodes) => Box::new(
                            redis::cluster::ClusterClient::new(nodes)
                                .ok()?
                                .get_connection()
                                .ok()?,
                        ),
                        None => Box::new(redis::Client::open(url).ok()?.get_connection().ok()?),
                    };
                    let key = format!("{PREFIX}:incr:{{{thread}}}");
                    let mut incr = redis::cmd("INCR");
                    incr.arg(&key);
                    let mut count = 0;
                    while start.elapsed() < slice {
                        incr.query::<i64>(&mut *connection).ok()?;
                        count += 1;
                    }
                    redis::cmd("DEL").arg(&key).exec(&mut *connection).ok()?;
                    Some(count)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("an INCR thread panicked"))
            .collect()
    });
    let total: u64 = counts.into_iter().sum::<Option<u64>>()?;
    Some(total as f64 / start.elapsed().as_secs_f64())
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

/// `redis-benchmark` with `clients` clients for about `slice`, running
/// `test` (`-t incr`, or a command of its own); `None` if it is not on the
/// PATH or says nothing. `line` starts its result line in `--csv`.
fn redis_benchmark(
    host: &str,
    port: u16,
    clients: usize,
    slice: Duration,
    test: &[&str],
    line: &str,
) -> Option<Benchmark> {
    // About 40,000 calls per second per client, capped: enough requests to
    // run for roughly the slice.
    let requests = (40_000.0 * slice.as_secs_f64() * clients as f64).clamp(10_000.0, 2e6) as u64;
    let output = Command::new("redis-benchmark")
        .args(["-h", host, "-p", &port.to_string(), "--csv"])
        .args(["-c", &clients.to_string(), "-n", &requests.to_string()])
        .args(test)
        .output()
        .ok()?;
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",
    // "p95_latency_ms","p99_latency_ms","max_latency_ms"
    let text = String::from_utf8_lossy(&output.stdout);
    let found = text
        .lines()
        .find(|candidate| candidate.to_ascii_uppercase().starts_with(line))?;
    let fields: Vec<f64> = found
        .rsplit(',')
        .take(7)
        .map(|field| field.trim_matches('"').parse().ok())
        .collect::<Option<Vec<f64>>>()?
        .into_iter()
        .rev()
        .collect();
    Some(Benchmark {
        per_sec: *fields.first()?,
        p50_ms: *fields.get(3)?,
        p99_ms: *fields.get(5)?,
    })
}

fn rate(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".into(), |value| format!("{value:.0}"))
}

fn ratio(decisions: f64, floor: Option<f64>) -> String {
    floor.map_or_else(String::new, |floor| format!("{:.2}x", decisions / floor))
}

fn table(rows: &[Row], floods: &[Flood]) -> String {
    let mut out = String::new();
    let header = format!(
        "{:<38} {:>5} {:>11} {:>7} {:>7} {:>8} {:>9} {:>8} {:>10} {:>10} {:>9} {:>9} {:>9}",
        "policy",
        "conns",
        "decisions/s",
        "p50 us",
        "p99 us",
        "admitted",
        "INCR/s",
        "INCR p50",
        "EVALSHA/s",
        "client/s",
        "vs INCR",
        "vs client",
        "vs Lua"
    );
    let _ = writeln!(out, "\n{header}");
    let _ = writeln!(out, "{}", "-".repeat(header.len()));
    for row in rows {
        let floors = row.floors;
        let _ = writeln!(
            out,
            "{:<38} {:>5} {:>11.0} {:>7.1} {:>7.1} {:>7.1}% {:>9} {:>8} {:>10} {:>10} {:>9} {:>9} {:>9}",
            if row.pipelined && row.batched {
                format!("{} (async)", row.policy.name())
            } else if row.pipelined {
                format!("{} (async, alone)", row.policy.name())
            } else {
                row.policy.name().to_owned()
            },
            row.connections,
            row.decisions_per_sec,
            row.p50_us,
            row.p99_us,
            row.admitted * 100.0,
            rate(floors.incr.map(|i| i.per_sec)),
            floors
                .incr
                .map_or_else(|| "n/a".into(), |i| format!("{:.0}", i.p50_ms * 1e3)),
            rate(floors.script.map(|s| s.per_sec)),
            rate(floors.client_incr),
            ratio(row.decisions_per_sec, floors.incr.map(|i| i.per_sec)),
            ratio(row.decisions_per_sec, floors.client_incr),
            ratio(row.decisions_per_sec, floors.script.map(|s| s.per_sec)),
        );
    }
    out.push_str(
        "\n(async): the async limiter, as many calls in flight on its one multiplexed \
         connection (pipelined, checks waiting together sent as one batch call), two tokio \
         worker threads; conns is the calls in flight. (async, alone): the same with \
         batching off, every check a call of its own.\n\
         INCR: redis-benchmark -t incr; EVALSHA: redis-benchmark EVALSHA of an empty script \
         (the Lua floor); client: the redis crate's blocking client doing INCR (the client \
         floor). Each with as many clients, same server, same run (latencies in us; n/a \
         without redis-benchmark on the PATH).\n",
    );
    if floods.is_empty() {
        return out;
    }
    let header = format!(
        "{:<24} {:>12} {:>9} {:>10} {:>13} {:>13} {:>9} {:>9} {:>9}",
        "flood: policy",
        "flooder/s",
        "admitted",
        "calls/dec",
        "others/s",
        "alone/s",
        "p50 us",
        "alone p50",
        "admitted"
    );
    let _ = writeln!(out, "\n{header}");
    let _ = writeln!(out, "{}", "-".repeat(header.len()));
    for flood in floods {
        let _ = writeln!(
            out,
            "{:<24} {:>12.0} {:>8.2}% {:>10} {:>13.0} {:>13.0} {:>9.1} {:>9.1} {:>8.1}%",
            flood.policy.name(),
            flood.flooder.decisions_per_sec,
            flood.flooder.admitted * 100.0,
            flood
                .calls_per_decision
                .map_or_else(|| "n/a".into(), |calls| format!("{calls:.4}")),
            flood.others.decisions_per_sec,
            flood.others_alone.decisions_per_sec,
            flood.others.p50_us,
            flood.others_alone.p50_us,
            flood.others.admitted * 100.0,
        );
    }
    let _ = writeln!(
        out,
        "\nflood: one thread checks one client of its own limiter instance as fast as it can \
         (yielding between decisions), \
         beside {FLOOD_THREADS} threads checking {FLOOD_OTHERS} clients of another ({FLOOD_LIMIT} \
         per second each, which they stay within); alone: those {FLOOD_THREADS} threads before \
         the flood. calls/dec: the flooder's Redis calls per decision, from INFO commandstats."
    );
    out
}

fn to_json(rows: &[Row], floods: &[Flood]) -> String {
    let floor_fields = |floors: &Floors| {
        serde_json::json!({
            "incr_per_sec": floors.incr.map(|i| i.per_sec),
            "incr_p50_us": floors.incr.map(|i| i.p50_ms * 1e3),
            "incr_p99_us": floors.incr.map(|i| i.p99_ms * 1e3),
            "script_floor_per_sec": floors.script.map(|s| s.per_sec),
            "script_floor_p50_us": floors.script.map(|s| s.p50_ms * 1e3),
            "client_incr_per_sec": floors.client_incr,
        })
    };
    let merge = |mut row: serde_json::Value, floors: &Floors| {
        if let (Some(row), serde_json::Value::Object(floors)) =
            (row.as_object_mut(), floor_fields(floors))
        {
            row.extend(floors);
        }
        row
    };
    let plain = rows.iter().map(|row| {
        merge(
            serde_json::json!({
                "policy": row.policy.name(),
                "engine": if row.pipelined { "redis-async" } else { "redis" },
                "keys": "uniform",
                "connections": if row.pipelined { 1 } else { row.connections },
                "in_flight": row.connections,
                "batched": row.pipelined && row.batched,
                "ops_per_sec": row.decisions_per_sec.round(),
                "p50_us": row.p50_us,
                "p99_us": row.p99_us,
                "admitted": row.admitted,
            }),
            &row.floors,
        )
    });
    let flooded = floods.iter().map(|flood| {
        merge(
            serde_json::json!({
                "policy": flood.policy.name(),
                "engine": "redis",
                "keys": "flood",
                "connections": FLOOD_THREADS + 1,
                "ops_per_sec": flood.flooder.decisions_per_sec.round(),
                "p50_us": flood.flooder.p50_us,
                "p99_us": flood.flooder.p99_us,
                "admitted": flood.flooder.admitted,
                "redis_calls_per_decision": flood.calls_per_decision,
                "limit": FLOOD_LIMIT,
                "window_us": 1_000_000,
                "others_clients": FLOOD_OTHERS,
                "others_ops_per_sec": flood.others.decisions_per_sec.round(),
                "others_p50_us": flood.others.p50_us,
                "others_p99_us": flood.others.p99_us,
                "others_admitted": flood.others.admitted,
                "others_alone_ops_per_sec": flood.others_alone.decisions_per_sec.round(),
                "others_alone_p50_us": flood.others_alone.p50_us,
                "others_alone_p99_us": flood.others_alone.p99_us,
                "others_alone_admitted": flood.others_alone.admitted,
            }),
            &flood.floors,
        )
    });
    super::json_rows(plain.chain(flooded))
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

    #[test]
    fn commandstats_give_the_calls() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=1234,usec=99,usec_per_call=0.08,\
                    rejected_calls=0,failed_calls=0\r\ncmdstat_incr:calls=7,usec=1\r\n";
        assert_eq!(commandstat_calls(info, "evalsha"), 1234);
        assert_eq!(commandstat_calls(info, "incr"), 7);
        assert_eq!(commandstat_calls(info, "get"), 0);
    }
}
