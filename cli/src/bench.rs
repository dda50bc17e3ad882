//! `floodgate bench`: checks per second of every policy on the lock-free
//! engine, the mutex baseline and (for `gcra`) `governor`, on one hot
//! client, 10,000 uniform clients and 100,000 Zipf-distributed clients, from
//! 1, 2 and 4 threads — the criterion benches' grid in about thirty seconds.
//! For `gcra` it adds weighted rows: requests of cost `--cost` through the
//! lock-free and mutex engines' `check_n` and governor's `check_key_n`.
//!
//! # How it measures
//!
//! For each key distribution every engine is built and given all its
//! clients first, so the timed loops check known clients. Then every
//! (thread count, engine) cell takes one turn per round — a slice in which
//! every thread checks as fast as it can until told to stop — and each round
//! starts one engine further along. So every ratio in the table, engine to
//! engine or two threads to one, compares measurements that shared the
//! machine's noise; a row is the median of its rounds. The timed loop reads
//! a key from a precomputed sequence (no random number generator in it),
//! calls the engine's own clock-reading check and counts admissions; nothing
//! else.
//!
//! Between rounds a pure compute loop is timed on one thread and on every
//! core: the ratio says how much parallelism the machine actually gave
//! during the run, which on a shared machine is often less than its core
//! count, and is printed under the table.

use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use floodgate::policy::{
    FixedWindow, Gcra, LeakyBucket, Policy, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use floodgate::{Config, Limiter, MutexLimiter, PolicyKind, QuantaClock, RateLimiter, MAX_LIMIT};
use governor::{DefaultKeyedRateLimiter, Quota};

#[cfg(feature = "redis")]
#[path = "bench_redis.rs"]
mod redis;

/// The default limit. Small because a `sliding-window` client keeps
/// its last `L` admission times (16 bytes each) and the Zipf grid tracks
/// 100,000 clients.
const LIMIT: u64 = 100;

/// The default window: 100 checks per millisecond per client. A hot loop on
/// one client (tens of millions of checks a second) is then rejected on all
/// but about one call in a thousand — a flood is mostly rejections — while
/// 10,000 clients sharing the loop stay under their limit, so every check
/// is admitted and writes its client's state. The `admitted` column shows
/// which regime each row measured; `--limit` and `--window-ns` pick another
/// (`--window-ns 100` admits every check even on one hot client;
/// `--limit 1 --window-ns 1000000000` rejects nearly every check even on
/// 10,000 clients).
const WINDOW_NS: u64 = 1_000_000;

/// How long each step of the parallel-capacity probe runs.
const PROBE: Duration = Duration::from_millis(10);

/// The most threads `--threads` accepts.
const MAX_THREADS: usize = 256;

const UNIFORM_CLIENTS: u64 = 10_000;
const ZIPF_CLIENTS: u64 = 100_000;

/// The default cost of the weighted rows: a tenth of the default limit, so
/// that a client of the uniform grid stays under its limit there too.
const COST: u32 = 10;

/// Checks between two looks at the stop flag: often enough to stop within
/// a microsecond or so, rarely enough to cost nothing measurable.
const BATCH: usize = 64;

/// Options of `floodgate bench`.
#[derive(clap::Args)]
pub struct Args {
    /// A few seconds instead of about thirty: fewer, shorter rounds.
    #[arg(long)]
    quick: bool,

    /// Print the rows as a JSON array of objects instead of a table.
    #[arg(long)]
    json: bool,

    /// Only these policies (comma-separated names; default: all six).
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    policy: Vec<PolicyKind>,

    /// Thread counts to measure (comma-separated).
    #[arg(long, value_name = "N", value_delimiter = ',', default_values_t = [1, 2, 4])]
    threads: Vec<usize>,

    /// Key distributions to measure (comma-separated): hot (one client),
    /// uniform (10,000 clients), zipf (100,000 clients, s = 1).
    #[arg(long, value_name = "KEYS", value_delimiter = ',', value_enum,
          default_values_t = [Keys::Hot, Keys::Uniform, Keys::Zipf])]
    keys: Vec<Keys>,

    /// The quota's limit: checks per window per client (a `sliding-window`
    /// client keeps 16 bytes per unit of limit).
    #[arg(long, value_name = "L", default_value_t = LIMIT,
          value_parser = clap::value_parser!(u64).range(1..=MAX_LIMIT))]
    limit: u64,

    /// The quota's window in nanoseconds (at least the limit). The default
    /// admits every check on 10,000 clients and about one in a thousand on
    /// one hot client; 100 admits every check even on one hot client.
    #[arg(long, value_name = "NS", default_value_t = WINDOW_NS)]
    window_ns: u64,

    /// The cost of each request of the weighted `gcra` rows (1 to the
    /// limit), measured beside governor's `check_key_n`.
    #[arg(long, value_name = "N", default_value_t = COST,
          value_parser = clap::value_parser!(u32).range(1..))]
    cost: u32,

    /// Measure through Redis (redis://HOST:PORT) or a Redis Cluster
    /// (redis-cluster://HOST:PORT[,HOST:PORT...]) instead: decisions per
    /// second and latency with --connections connections, beside
    /// redis-benchmark's INCR and empty-script rates and the client's own
    /// INCR rate, then a flood row per policy. The window is --window-ns in
    /// microseconds of Redis's clock.
    #[cfg(feature = "redis")]
    #[arg(long, value_name = "URL")]
    backend: Option<String>,

    /// Connection (and calling thread) counts for --backend.
    #[cfg(feature = "redis")]
    #[arg(long, value_name = "N", value_delimiter = ',', default_values_t = [1, 4, 16])]
    connections: Vec<usize>,
}

/// Which clients the timed loop checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Keys {
    /// One client, checked by every thread.
    Hot,
    /// 10,000 clients, drawn uniformly.
    Uniform,
    /// 100,000 clients, drawn by a Zipf law with s = 1.
    Zipf,
}

impl Keys {
    fn name(self) -> &'static str {
        match self {
            Keys::Hot => "hot",
            Keys::Uniform => "uniform",
            Keys::Zipf => "zipf",
        }
    }

    fn clients(self) -> u64 {
        match self {
            Keys::Hot => 1,
            Keys::Uniform => UNIFORM_CLIENTS,
            Keys::Zipf => ZIPF_CLIENTS,
        }
    }

    /// One key sequence per thread, each a power of two long (the loop
    /// indexes it with a mask) and drawn with its own fixed seed, so every
    /// run draws the same keys and the threads do not share a stream.
    fn sequences(self, threads: usize) -> Vec<Vec<u32>> {
        let zipf = (self == Keys::Zipf).then(|| Zipf::new(ZIPF_CLIENTS));
        (0..threads as u64)
            .map(|thread| {
                let mut rng = fastrand::Rng::with_seed(0x5EED ^ thread);
                match self {
                    Keys::Hot => vec![0],
                    // 10,000 clients: the key fits a u32.
                    Keys::Uniform => (0..1 << 16)
                        .map(|_| rng.u64(..UNIFORM_CLIENTS) as u32)
                        .collect(),
                    Keys::Zipf => {
                        let zipf = zipf.as_ref().expect("built above for zipf");
                        (0..1 << 18).map(|_| zipf.sample(&mut rng)).collect()
                    }
                }
            })
            .collect()
    }
}

/// Which implementation a row measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EngineName {
    LockFree,
    Mutex,
    Governor,
}

impl EngineName {
    fn name(self) -> &'static str {
        match self {
            EngineName::LockFree => "lockfree",
            EngineName::Mutex => "mutex",
            EngineName::Governor => "governor",
        }
    }
}

/// One engine at one quota, as the timed loop sees it: a check of a `u64`
/// client that reads the engine's own clock.
trait Subject: Sync {
    fn check(&self, key: u64) -> bool;
}

impl<P: Policy> Subject for Limiter<u64, P, QuantaClock> {
    #[inline]
    fn check(&self, key: u64) -> bool {
        Limiter::check(self, &key).allowed
    }
}

impl Subject for MutexLimiter<u64, QuantaClock> {
    #[inline]
    fn check(&self, key: u64) -> bool {
        RateLimiter::<u64>::check(self, &key).allowed
    }
}

impl Subject for DefaultKeyedRateLimiter<u64> {
    #[inline]
    fn check(&self, key: u64) -> bool {
        self.check_key(&key).is_ok()
    }
}

/// An engine's weighted check: one request of cost `cost`, all or nothing.
trait WeightedCheck: Sync {
    fn check_n(&self, key: u64, cost: NonZeroU32) -> bool;
}

impl WeightedCheck for Limiter<u64, Gcra, QuantaClock> {
    #[inline]
    fn check_n(&self, key: u64, cost: NonZeroU32) -> bool {
        Limiter::check_n(self, &key, u64::from(cost.get())).allowed
    }
}

impl WeightedCheck for MutexLimiter<u64, QuantaClock> {
    #[inline]
    fn check_n(&self, key: u64, cost: NonZeroU32) -> bool {
        RateLimiter::<u64>::check_n(self, &key, u64::from(cost.get())).allowed
    }
}

impl WeightedCheck for DefaultKeyedRateLimiter<u64> {
    /// Admitted iff `Ok(Ok(()))`; `Err(InsufficientCapacity)` (a cost above
    /// the burst) counts as a refusal, as our `retry_after == u64::MAX` does.
    #[inline]
    fn check_n(&self, key: u64, cost: NonZeroU32) -> bool {
        matches!(self.check_key_n(&key, cost), Ok(Ok(())))
    }
}

/// An engine whose every check costs `cost`.
struct Weighted<E> {
    engine: E,
    cost: NonZeroU32,
}

impl<E: WeightedCheck> Subject for Weighted<E> {
    #[inline]
    fn check(&self, key: u64) -> bool {
        self.engine.check_n(key, self.cost)
    }
}

/// What one slice measured.
#[derive(Clone, Copy, Debug, Default)]
struct Slice {
    checks: u64,
    admitted: u64,
    elapsed: Duration,
}

/// The timed work behind one dynamic call per slice (never per check), so
/// engines of different types sit in one list while each loop is compiled
/// for its engine.
trait Runner {
    fn prefill(&self, clients: u64);
    fn run(&self, sequences: &[Vec<u32>], threads: usize, slice: Duration) -> Slice;
}

impl<S: Subject> Runner for S {
    fn prefill(&self, clients: u64) {
        for key in 0..clients {
            self.check(key);
        }
    }

    fn run(&self, sequences: &[Vec<u32>], threads: usize, slice: Duration) -> Slice {
        let barrier = Barrier::new(threads + 1);
        // Written once by this thread, read by the workers between batches;
        // Relaxed suffices, as it carries no data: each worker's counts come
        // back through `join`.
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let workers: Vec<_> = sequences
                .iter()
                .take(threads)
                .map(|sequence| {
                    let (barrier, stop) = (&barrier, &stop);
                    scope.spawn(move || {
                        let mask = sequence.len() - 1;
                        let (mut checks, mut admitted) = (0usize, 0u64);
                        barrier.wait();
                        while !stop.load(Ordering::Relaxed) {
                            for _ in 0..BATCH {
                                let key = u64::from(sequence[checks & mask]);
                                admitted += u64::from(self.check(key));
                                checks += 1;
                            }
                        }
                        (checks as u64, admitted, Instant::now())
                    })
                })
                .collect();
            barrier.wait();
            let start = Instant::now();
            std::thread::sleep(slice);
            stop.store(true, Ordering::Relaxed);
            workers
                .into_iter()
                .map(|worker| worker.join().expect("a bench thread panicked"))
                .fold(Slice::default(), |total, (checks, admitted, end)| Slice {
                    checks: total.checks + checks,
                    admitted: total.admitted + admitted,
                    elapsed: total.elapsed.max(end - start),
                })
        })
    }
}

/// One engine to measure: its policy, name and the cost of each of its
/// checks.
type Entry = (PolicyKind, EngineName, u64, Box<dyn Runner>);

/// Every engine for the chosen policies at one quota: lock-free, mutex
/// and, for `gcra`, governor; then, for `gcra`, the three again with every
/// check of cost `cost`.
fn engines(policies: &[PolicyKind], config: Config, cost: NonZeroU32) -> Vec<Entry> {
    fn lockfree<P: Policy>(config: Config) -> Limiter<u64, P, QuantaClock> {
        Limiter::<u64, P>::new(P::new(config).expect("valid quota"))
    }
    let mut all: Vec<Entry> = Vec::new();
    for &kind in policies {
        let fast: Box<dyn Runner> = match kind {
            PolicyKind::SlidingWindow => Box::new(lockfree::<SlidingWindow>(config)),
            PolicyKind::TokenBucket => Box::new(lockfree::<TokenBucket>(config)),
            PolicyKind::FixedWindow => Box::new(lockfree::<FixedWindow>(config)),
            PolicyKind::SlidingWindowCounter => Box::new(lockfree::<SlidingWindowCounter>(config)),
            PolicyKind::Gcra => Box::new(lockfree::<Gcra>(config)),
            PolicyKind::LeakyBucket => Box::new(lockfree::<LeakyBucket>(config)),
        };
        all.push((kind, EngineName::LockFree, 1, fast));
        let mutex = MutexLimiter::<u64>::new(kind, config).expect("valid quota");
        all.push((kind, EngineName::Mutex, 1, Box::new(mutex)));
        if kind == PolicyKind::Gcra {
            let governor = DefaultKeyedRateLimiter::<u64>::keyed(governor_quota(config));
            all.push((kind, EngineName::Governor, 1, Box::new(governor)));
        }
    }
    if policies.contains(&PolicyKind::Gcra) {
        let kind = PolicyKind::Gcra;
        let weight = u64::from(cost.get());
        let mutex = MutexLimiter::<u64>::new(kind, config).expect("valid quota");
        let governor = DefaultKeyedRateLimiter::<u64>::keyed(governor_quota(config));
        all.push((
            kind,
            EngineName::LockFree,
            weight,
            Box::new(Weighted {
                engine: lockfree::<Gcra>(config),
                cost,
            }),
        ));
        all.push((
            kind,
            EngineName::Mutex,
            weight,
            Box::new(Weighted {
                engine: mutex,
                cost,
            }),
        ));
        all.push((
            kind,
            EngineName::Governor,
            weight,
            Box::new(Weighted {
                engine: governor,
                cost,
            }),
        ));
    }
    all
}

/// `gcra`'s quota in governor's terms: a burst of `L`, then one cell per
/// `I` — the same admissions (`Quota::new` would round differently).
fn governor_quota(config: Config) -> Quota {
    let limit = u32::try_from(config.limit()).expect("limits fit in 20 bits");
    Quota::with_period(Duration::from_nanos(config.interval()))
        .expect("the interval is at least 1 ns")
        .allow_burst(NonZeroU32::new(limit).expect("limits are at least 1"))
}

/// One row of the results.
struct Row {
    policy: PolicyKind,
    limit: u64,
    window_ns: u64,
    engine: EngineName,
    /// The cost of each check (1 but in the weighted rows).
    cost: u64,
    threads: usize,
    keys: Keys,
    /// Median over the rounds.
    ops_per_sec: f64,
    min: f64,
    max: f64,
    /// Share of the checks admitted, over all rounds.
    admitted: f64,
    vs_mutex: Option<f64>,
    vs_governor: Option<f64>,
}

impl Row {
    fn ns_per_op(&self) -> f64 {
        1e9 / self.ops_per_sec
    }
}

/// Runs `floodgate bench`.
pub fn run(args: Args) -> ExitCode {
    let policies = if args.policy.is_empty() {
        PolicyKind::ALL.to_vec()
    } else {
        args.policy.clone()
    };
    #[cfg(feature = "redis")]
    if let Some(url) = &args.backend {
        if args.connections.iter().any(|&c| c == 0 || c > MAX_THREADS) {
            eprintln!("floodgate bench: connection counts must be between 1 and {MAX_THREADS}");
            return ExitCode::from(2);
        }
        return redis::run(
            url,
            &policies,
            &args.connections,
            args.limit,
            args.window_ns / 1_000,
            args.quick,
            args.json,
        );
    }
    if args.threads.iter().any(|&t| t == 0 || t > MAX_THREADS) {
        eprintln!("floodgate bench: thread counts must be between 1 and {MAX_THREADS}");
        return ExitCode::from(2);
    }
    let (rounds, slice) = if args.quick {
        (3, Duration::from_millis(8))
    } else {
        (5, Duration::from_millis(40))
    };
    let config = match Config::per_ticks(args.limit, args.window_ns)
        .and_then(|config| config.check_for(PolicyKind::Gcra))
    {
        Ok(config) => config,
        Err(error) => {
            eprintln!("floodgate bench: {error}");
            return ExitCode::from(2);
        }
    };
    let cost = match NonZeroU32::new(args.cost) {
        Some(cost) if u64::from(cost.get()) <= config.limit() => cost,
        _ => {
            eprintln!(
                "floodgate bench: --cost must be between 1 and the limit, {}",
                config.limit()
            );
            return ExitCode::from(2);
        }
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if !args.json {
        println!(
            "floodgate bench: {} checks per {} ns per client; {rounds} rounds x {} ms \
             per row, engines interleaved, medians; {cores} cores{}",
            config.limit(),
            config.window(),
            slice.as_millis(),
            if args.threads.iter().any(|&t| t > cores) {
                " (more threads than cores: oversubscribed)"
            } else {
                ""
            }
        );
    }
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut capacities = Vec::new();
    for &keys in &args.keys {
        let engines = engines(&policies, config, cost);
        for (_, _, _, engine) in &engines {
            engine.prefill(keys.clients());
        }
        let sequences: Vec<_> = args
            .threads
            .iter()
            .map(|&threads| keys.sequences(threads))
            .collect();
        // Every (thread count, engine) cell takes one turn per round, so
        // every ratio in the table — engine to engine, and 2 threads to 1 —
        // compares measurements that shared the machine's noise.
        let cells: Vec<(usize, usize)> = (0..args.threads.len())
            .flat_map(|t| (0..engines.len()).map(move |e| (t, e)))
            .collect();
        let mut samples = vec![Vec::with_capacity(rounds); cells.len()];
        let mut admitted = vec![(0u64, 0u64); cells.len()];
        for round in 0..rounds {
            capacities.push(parallel_capacity(cores, PROBE));
            for offset in 0..cells.len() {
                let cell = (round * engines.len() + offset) % cells.len();
                let (t, e) = cells[cell];
                let measured = engines[e].3.run(&sequences[t], args.threads[t], slice);
                samples[cell].push(measured.checks as f64 / measured.elapsed.as_secs_f64());
                admitted[cell].0 += measured.admitted;
                admitted[cell].1 += measured.checks;
            }
        }
        for (cell, &(t, e)) in cells.iter().enumerate() {
            let rates = &mut samples[cell];
            rates.sort_by(f64::total_cmp);
            let (policy, engine, cost, _) = &engines[e];
            rows.push(Row {
                policy: *policy,
                limit: config.limit(),
                window_ns: config.window(),
                engine: *engine,
                cost: *cost,
                threads: args.threads[t],
                keys,
                ops_per_sec: rates[rates.len() / 2],
                min: rates[0],
                max: rates[rates.len() - 1],
                admitted: admitted[cell].0 as f64 / admitted[cell].1.max(1) as f64,
                vs_mutex: None,
                vs_governor: None,
            });
        }
    }
    add_ratios(&mut rows);
    capacities.sort_by(f64::total_cmp);
    let capacity = format!(
        "machine check: a pure compute loop on {cores} threads ran at {:.2}x its one-thread \
         speed (median of {} probes between rounds; lowest {:.2}x). Below {cores}x, other \
         work shared the cores and the multi-thread rows are depressed.",
        capacities[capacities.len() / 2],
        capacities.len(),
        capacities[0],
    );
    if args.json {
        println!("{}", json(&rows));
        eprintln!("{capacity}");
    } else {
        print!("{}", table(&rows));
        print!("{}", targets(&rows, cores));
        println!("{capacity}");
        println!("measured in {:.1} s", started.elapsed().as_secs_f64());
    }
    ExitCode::SUCCESS
}

/// How many cores' worth of work the machine gives a pure compute loop
/// right now: its throughput on `threads` threads over its throughput on
/// one. On a quiet machine this is the core count; on a shared one it shows
/// how much of the multi-thread rows' scaling the machine allowed.
fn parallel_capacity(threads: usize, slice: Duration) -> f64 {
    /// Xorshift steps in a dependent chain: no memory, no sharing.
    fn spin(stop: &AtomicBool) -> u64 {
        let (mut x, mut steps) = (0x9E37_79B9_7F4A_7C15u64, 0u64);
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..1024 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
            }
            steps += 1024;
        }
        std::hint::black_box(x);
        steps
    }
    let rate = |threads: usize| {
        let stop = AtomicBool::new(false);
        let start = Instant::now();
        let steps: u64 = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads).map(|_| scope.spawn(|| spin(&stop))).collect();
            std::thread::sleep(slice);
            stop.store(true, Ordering::Relaxed);
            workers
                .into_iter()
                .map(|worker| worker.join().expect("a probe thread panicked"))
                .sum()
        });
        steps as f64 / start.elapsed().as_secs_f64()
    };
    // One thread before and after, so a change of conditions during the
    // probe does not bias it either way.
    let before = rate(1);
    let many = rate(threads);
    let after = rate(1);
    many * 2.0 / (before + after)
}

/// Fills each row's ratios to the mutex baseline and to governor measured
/// at the same policy, cost, thread count and keys.
fn add_ratios(rows: &mut [Row]) {
    let rate_of = |rows: &[Row], row: &Row, engine: EngineName| {
        rows.iter()
            .find(|other| {
                other.engine == engine
                    && other.policy == row.policy
                    && other.cost == row.cost
                    && other.threads == row.threads
                    && other.keys == row.keys
            })
            .map(|other| other.ops_per_sec)
    };
    for index in 0..rows.len() {
        let row = &rows[index];
        let vs_mutex = rate_of(rows, row, EngineName::Mutex).map(|rate| row.ops_per_sec / rate);
        let vs_governor =
            rate_of(rows, row, EngineName::Governor).map(|rate| row.ops_per_sec / rate);
        rows[index].vs_mutex = vs_mutex;
        rows[index].vs_governor = vs_governor;
    }
}

fn ratio(value: Option<f64>) -> String {
    value.map_or_else(String::new, |r| format!("{r:.2}x"))
}

fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let header = format!(
        "{:<24} {:<9} {:>4} {:>7} {:<8} {:>9} {:>8} {:>8} {:>8} {:>11}",
        "policy",
        "engine",
        "cost",
        "threads",
        "keys",
        "Mchecks/s",
        "ns/check",
        "admitted",
        "vs mutex",
        "vs governor"
    );
    let _ = writeln!(out, "\n{header}");
    let _ = writeln!(out, "{}", "-".repeat(header.len()));
    let mut previous = None;
    for row in rows {
        if previous.is_some_and(|(keys, threads)| (keys, threads) != (row.keys, row.threads)) {
            out.push('\n');
        }
        previous = Some((row.keys, row.threads));
        let _ = writeln!(
            out,
            "{:<24} {:<9} {:>4} {:>7} {:<8} {:>9.2} {:>8.1} {:>7.1}% {:>8} {:>11}",
            row.policy.name(),
            row.engine.name(),
            row.cost,
            row.threads,
            row.keys.name(),
            row.ops_per_sec / 1e6,
            row.ns_per_op(),
            row.admitted * 100.0,
            ratio(row.vs_mutex),
            ratio(row.vs_governor),
        );
    }
    out.push_str(
        "\nns/check is 1 / throughput (wall time per check, all threads together); \
         a check of cost n decides one request of n units.\n",
    );
    out
}

/// The three targets, each as a ratio from this run.
fn targets(rows: &[Row], cores: usize) -> String {
    let find = |policy: PolicyKind, engine: EngineName, threads: usize, keys: Keys| {
        rows.iter().find(|row| {
            row.policy == policy
                && row.engine == engine
                && row.cost == 1
                && row.threads == threads
                && row.keys == keys
        })
    };
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let mut out = String::from("\ntargets:\n");
    for keys in [Keys::Hot, Keys::Uniform] {
        if let Some(ratio) =
            find(PolicyKind::Gcra, EngineName::LockFree, 1, keys).and_then(|row| row.vs_governor)
        {
            let _ = writeln!(
                out,
                "  gcra, 1 thread, {:<7} lockfree / governor  {ratio:>5.2}x  (>= 1.3x: {})",
                keys.name(),
                verdict(ratio >= 1.3)
            );
        }
    }
    for threads in [2, 4] {
        let worst = rows
            .iter()
            .filter(|row| {
                row.engine == EngineName::LockFree
                    && row.cost == 1
                    && row.keys == Keys::Hot
                    && row.threads == threads
            })
            .filter_map(|row| row.vs_mutex.map(|ratio| (ratio, row.policy)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((ratio, policy)) = worst {
            let _ = writeln!(
                out,
                "  hot client, {threads} threads, lockfree / mutex, worst policy {:<22} {ratio:>5.2}x  (>= 3x: {}){}",
                policy.name(),
                verdict(ratio >= 3.0),
                if threads > cores { " [oversubscribed]" } else { "" }
            );
        }
    }
    let scaling = rows
        .iter()
        .filter(|row| {
            row.engine == EngineName::LockFree
                && row.cost == 1
                && row.keys == Keys::Uniform
                && row.threads == 2
        })
        .filter_map(|two| {
            find(two.policy, EngineName::LockFree, 1, Keys::Uniform)
                .map(|one| (two.ops_per_sec / one.ops_per_sec, two.policy))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((ratio, policy)) = scaling {
        let _ = writeln!(
            out,
            "  uniform, lockfree 2 threads / 1 thread, worst policy {:<22} {ratio:>5.2}x  (>= 1.6x: {})",
            policy.name(),
            verdict(ratio >= 1.6)
        );
    }
    out
}

fn json(rows: &[Row]) -> String {
    json_rows(rows.iter().map(|row| {
        serde_json::json!({
            "policy": row.policy.name(),
            "engine": row.engine.name(),
            "cost": row.cost,
            "threads": row.threads,
            "keys": row.keys.name(),
            "ops_per_sec": row.ops_per_sec.round(),
            "ns_per_op": row.ns_per_op(),
            "ops_per_sec_min": row.min.round(),
            "ops_per_sec_max": row.max.round(),
            "admitted": row.admitted,
            "vs_mutex": row.vs_mutex,
            "vs_governor": row.vs_governor,
            "limit": row.limit,
            "window_ns": row.window_ns,
        })
    }))
}

/// `--json` output: a JSON array with one row object per line.
pub(crate) fn json_rows(rows: impl Iterator<Item = serde_json::Value>) -> String {
    let rows: Vec<String> = rows.map(|row| format!("  {row}")).collect();
    format!("[\n{}\n]", rows.join(",\n"))
}

/// Ranks `0..n` with `P(k) ∝ 1 / (k + 1)`: a Zipf law with s = 1, sampled
/// by inverting its cumulative distribution.
///
/// `benches/limiter.rs` has a copy (a bench target cannot import the CLI's
/// private code); the two are kept in step by hand, and the test below
/// checks this one.
struct Zipf {
    /// `cumulative[k]` is the weight of ranks `0..=k`, the harmonic number
    /// `H(k + 1)`; increasing, so it can be searched.
    cumulative: Vec<f64>,
}

impl Zipf {
    /// The sampler over ranks `0..n`; `n` must be at least 1.
    fn new(n: u64) -> Self {
        let mut total = 0.0;
        let cumulative = (1..=n)
            .map(|rank| {
                total += 1.0 / rank as f64;
                total
            })
            .collect();
        Self { cumulative }
    }

    /// One rank: a uniform `target` in `[0, H(n))` falls in rank `k`'s
    /// interval `[H(k), H(k + 1))`, whose width is `k`'s weight `1 / (k + 1)`.
    fn sample(&self, rng: &mut fastrand::Rng) -> u32 {
        let last = self.cumulative.len() - 1;
        let target = rng.f64() * self.cumulative[last];
        // The product can round up to the total itself, past every interval:
        // that draw goes to the last rank. n is at most 100,000: the rank
        // fits a u32.
        self.cumulative.partition_point(|&c| c <= target).min(last) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_puts_the_harmonic_shares_on_the_first_ranks() {
        let zipf = Zipf::new(ZIPF_CLIENTS);
        let mut rng = fastrand::Rng::with_seed(1);
        let draws = 200_000;
        let mut counts = [0u32; 2];
        for _ in 0..draws {
            let rank = zipf.sample(&mut rng);
            assert!(u64::from(rank) < ZIPF_CLIENTS, "{rank}");
            if let Some(count) = counts.get_mut(rank as usize) {
                *count += 1;
            }
        }
        // P(rank 0) = 1 / H(100,000) ≈ 0.0827 and P(rank 1) is half that.
        // Over 200,000 draws a share's standard deviation is at most 0.0007,
        // so ±0.0035 (five of them) fails a correct sampler with
        // negligible probability, and the seed is fixed anyway.
        let first = 1.0 / zipf.cumulative[zipf.cumulative.len() - 1];
        for (rank, count) in counts.into_iter().enumerate() {
            let share = f64::from(count) / f64::from(draws);
            let expected = first / (rank + 1) as f64;
            assert!((share - expected).abs() < 0.0035, "rank {rank}: {share}");
        }
    }

    #[test]
    fn ratios_compare_rows_of_the_same_cell_only() {
        let row = |engine, threads, rate| Row {
            policy: PolicyKind::Gcra,
            limit: LIMIT,
            window_ns: WINDOW_NS,
            engine,
            cost: 1,
            threads,
            keys: Keys::Hot,
            ops_per_sec: rate,
            min: rate,
            max: rate,
            admitted: 0.0,
            vs_mutex: None,
            vs_governor: None,
        };
        let mut rows = vec![
            row(EngineName::LockFree, 1, 30.0),
            row(EngineName::Mutex, 1, 10.0),
            row(EngineName::Governor, 1, 20.0),
            row(EngineName::LockFree, 2, 60.0),
            row(EngineName::Mutex, 2, 6.0),
            Row {
                cost: 10,
                ..row(EngineName::LockFree, 1, 12.0)
            },
            Row {
                cost: 10,
                ..row(EngineName::Governor, 1, 8.0)
            },
        ];
        add_ratios(&mut rows);
        assert_eq!(rows[0].vs_mutex, Some(3.0));
        assert_eq!(rows[0].vs_governor, Some(1.5));
        assert_eq!(rows[3].vs_mutex, Some(10.0));
        assert_eq!(rows[3].vs_governor, None);
        // Weighted rows compare with weighted rows only.
        assert_eq!(rows[5].vs_governor, Some(1.5));
        assert_eq!(rows[5].vs_mutex, None);
        let parsed = json(&rows);
        assert!(parsed.starts_with('[') && parsed.ends_with(']'));
        assert_eq!(parsed.matches("\"ops_per_sec\":").count(), rows.len());
        assert!(parsed.contains("\"engine\":\"governor\""));
        assert_eq!(parsed.matches("\"cost\":10").count(), 2);
    }
}
