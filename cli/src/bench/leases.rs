//! `floodgate bench --backend URL --lease`: decisions per second through
//! Redis when the limiter spends leases (`RedisOptions::leasing`), beside
//! the same limiter asking Redis for every decision (the round-trip rows)
//! and, for the hot client, the in-memory lock-free engine, each measured
//! in turn in the same run. Per row: one instance (one limiter) with 1 or
//! 4 calling threads, one hot client, 10,000 uniform or 100,000 Zipf
//! clients, at a limit the run never reaches and at one it does; and the
//! Redis calls per decision, from the limiter's own count of round trips.
//! Each subject is measured after a warm-up as long as its measure.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use floodgate::redis::{Leasing, RedisLimiter, RedisOptions};
use floodgate::{Config, PolicyKind, RateLimiter};

const PREFIX: &str = "floodgate-bench-lease";

/// Which clients a row checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mix {
    Hot,
    Uniform,
    Zipf,
}

impl Mix {
    fn name(self) -> &'static str {
        match self {
            Mix::Hot => "hot",
            Mix::Uniform => "uniform",
            Mix::Zipf => "zipf",
        }
    }

    fn clients(self) -> usize {
        match self {
            Mix::Hot => 1,
            Mix::Uniform => 10_000,
            Mix::Zipf => 100_000,
        }
    }
}

/// The clients of a mix, and how they are drawn.
struct Keys {
    names: Vec<String>,
    /// Zipf(1)'s cumulative weights, for Zipf; empty otherwise.
    cumulative: Vec<f64>,
}

impl Keys {
    fn new(mix: Mix) -> Self {
        let names = (0..mix.clients())
            .map(|id| format!("client-{id}"))
            .collect();
        let mut total = 0.0;
        let cumulative = if mix == Mix::Zipf {
            (1..=mix.clients())
                .map(|rank| {
                    total += 1.0 / rank as f64;
                    total
                })
                .collect()
        } else {
            Vec::new()
        };
        Keys { names, cumulative }
    }

    fn draw(&self, rng: &mut fastrand::Rng) -> &str {
        let index = match self.cumulative.last() {
            Some(&total) => {
                let x = rng.f64() * total;
                self.cumulative
                    .partition_point(|&c| c < x)
                    .min(self.names.len() - 1)
            }
            None => rng.usize(..self.names.len()),
        };
        &self.names[index]
    }
}

/// What one subject did in one row.
#[derive(Clone, Copy, Default)]
struct Measured {
    per_sec: f64,
    calls_per_decision: f64,
    admitted: f64,
}

/// One row: a policy, a limit, a mix, a thread count.
struct Row {
    policy: PolicyKind,
    reached: bool,
    mix: Mix,
    threads: usize,
    leased: Measured,
    round_trip: Measured,
    in_memory: Option<Measured>,
}

/// `threads` threads checking `keys` on `limiter` for `slice` after as
/// long a warm-up (a service runs on: its busy clients' leases have grown,
/// and the rows measure that steady state; the round-trip rows and the
/// in-memory engine warm up alike): decisions per second, and the Redis
/// calls per decision when `calls` reads them.
fn measure(
    limiter: &dyn RateLimiter<str>,
    calls: &dyn Fn() -> u64,
    threads: usize,
    keys: &Keys,
    slice: Duration,
) -> Measured {
    let run = |slice: Duration| -> (Vec<(u64, u64)>, f64) {
        let start = Instant::now();
        let counts = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|thread| {
                    scope.spawn(move || {
                        let mut rng = fastrand::Rng::with_seed(0x1EA5E ^ thread as u64);
                        let (mut decisions, mut admitted) = (0u64, 0u64);
                        // The clock is read once per 64 decisions: the hot
                        // rows decide in tens of nanoseconds.
                        while decisions % 64 != 0 || start.elapsed() < slice {
                            admitted += u64::from(limiter.check(keys.draw(&mut rng)).allowed());
                            decisions += 1;
                        }
                        (decisions, admitted)
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|worker| worker.join().expect("a bench thread panicked"))
                .collect()
        });
        (counts, start.elapsed().as_secs_f64())
    };
    let _ = run(slice);
    let calls_before = calls();
    let (counts, elapsed) = run(slice);
    let decisions: u64 = counts.iter().map(|c| c.0).sum();
    let admitted: u64 = counts.iter().map(|c| c.1).sum();
    Measured {
        per_sec: decisions as f64 / elapsed,
        calls_per_decision: (calls() - calls_before) as f64 / decisions.max(1) as f64,
        admitted: admitted as f64 / decisions.max(1) as f64,
    }
}

/// Runs the lease rows for every policy of `policies` that leases.
pub fn run(
    url: &str,
    policies: &[PolicyKind],
    threads: &[usize],
    term: Duration,
    quick: bool,
    json: bool,
) -> ExitCode {
    let slice = if quick {
        Duration::from_millis(300)
    } else {
        Duration::from_millis(1_000)
    };
    // Never reached: a billion a thousand seconds (a million a second, a
    // burst of a billion). Reached: 1,000 a second per client, which a
    // hot client passes at once.
    let never = Config::per(1_000_000_000, Duration::from_secs(1_000)).expect("a valid quota");
    let reached = Config::per(1_000, Duration::from_secs(1)).expect("a valid quota");
    let leased_policies: Vec<PolicyKind> = policies
        .iter()
        .copied()
        .filter(|policy| !matches!(policy, PolicyKind::InFlight | PolicyKind::LeakyBucket))
        .collect();
    let mut rows = Vec::new();
    for &policy in &leased_policies {
        for (is_reached, config) in [(false, never), (true, reached)] {
            // A log of a billion entries is not a bench of leases.
            if policy == PolicyKind::SlidingWindow && !is_reached {
                continue;
            }
            for mix in [Mix::Hot, Mix::Uniform, Mix::Zipf] {
                let keys = Keys::new(mix);
                for &count in threads {
                    let build = |leasing: Option<Leasing>| {
                        RedisLimiter::new(
                            url,
                            policy,
                            config,
                            RedisOptions::new()
                                .prefix(PREFIX)
                                .timeout(Duration::from_secs(2))
                                .connections(count)
                                .leasing(leasing),
                        )
                    };
                    let (leasing, plain) = match (build(Some(Leasing::new(term))), build(None)) {
                        (Ok(leasing), Ok(plain)) => (leasing, plain),
                        (Err(error), _) | (_, Err(error)) => {
                            eprintln!("floodgate bench: --backend {url}: {error}");
                            return ExitCode::from(2);
                        }
                    };
                    if let Err(error) = plain.clear_prefix(PREFIX) {
                        eprintln!("floodgate bench: --backend {url}: {error}");
                        return ExitCode::from(1);
                    }
                    let leased = measure(
                        &leasing,
                        &|| leasing.redis_stats().calls,
                        count,
                        &keys,
                        slice,
                    );
                    let _ = plain.clear_prefix(PREFIX);
                    let round_trip =
                        measure(&plain, &|| plain.redis_stats().calls, count, &keys, slice);
                    let in_memory = (mix == Mix::Hot).then(|| {
                        let memory = floodgate::build::<str>(policy, config)
                            .expect("the same quota in memory");
                        measure(&*memory, &|| 0, count, &keys, slice)
                    });
                    let _ = plain.clear_prefix(PREFIX);
                    let row = Row {
                        policy,
                        reached: is_reached,
                        mix,
                        threads: count,
                        leased,
                        round_trip,
                        in_memory,
                    };
                    if !json {
                        eprintln!("{}", line(&row));
                    }
                    rows.push(row);
                }
            }
        }
    }
    if json {
        println!("{}", to_json(&rows, term));
    } else {
        println!(
            "floodgate bench --backend {url} --lease: leases of term {} ms, {} ms per subject \
             and row after as long a warm-up, in turn; calls = Redis round trips per decision",
            term.as_millis(),
            slice.as_millis()
        );
        println!("{HEADER}");
        for row in &rows {
            println!("{}", line(row));
        }
    }
    ExitCode::SUCCESS
}

const HEADER: &str = "policy                  limit   keys     threads  leased/s      calls    \
                      round trip/s  calls    x round trip  in memory/s   x in memory";

fn line(row: &Row) -> String {
    let (memory, of_memory) = match row.in_memory {
        Some(memory) => (
            format!("{:.0}", memory.per_sec),
            format!("{:.2}x", row.leased.per_sec / memory.per_sec),
        ),
        None => ("-".to_owned(), "-".to_owned()),
    };
    format!(
        "{:<23} {:<7} {:<8} {:<8} {:<13.0} {:<8.4} {:<13.0} {:<8.4} {:<13} {:<13} {}",
        row.policy.name(),
        if row.reached { "reached" } else { "never" },
        row.mix.name(),
        row.threads,
        row.leased.per_sec,
        row.leased.calls_per_decision,
        row.round_trip.per_sec,
        row.round_trip.calls_per_decision,
        format!("{:.2}x", row.leased.per_sec / row.round_trip.per_sec),
        memory,
        of_memory,
    )
}

fn to_json(rows: &[Row], term: Duration) -> String {
    let measured = |m: &Measured| {
        format!(
            "{{\"per_sec\":{:.1},\"calls_per_decision\":{:.6},\"admitted\":{:.4}}}",
            m.per_sec, m.calls_per_decision, m.admitted
        )
    };
    let rows: Vec<String> = rows
        .iter()
        .map(|row| {
            format!(
                "{{\"policy\":\"{}\",\"limit\":\"{}\",\"keys\":\"{}\",\"threads\":{},\
                 \"leased\":{},\"round_trip\":{},\"in_memory\":{}}}",
                row.policy.name(),
                if row.reached { "reached" } else { "never" },
                row.mix.name(),
                row.threads,
                measured(&row.leased),
                measured(&row.round_trip),
                row.in_memory.as_ref().map_or("null".to_owned(), measured),
            )
        })
        .collect();
    format!(
        "{{\"lease_term_ms\":{},\"rows\":[{}]}}",
        term.as_millis(),
        rows.join(",")
    )
}
