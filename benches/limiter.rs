//! Criterion benches: one group per question, every policy, three engines.
//!
//! * `check/flood`, `check/admit` — one known client, one thread: the hot
//!   path's floor, once under a quota that rejects nearly every call of a
//!   hot loop (a flood is mostly rejections) and once under one that
//!   admits every call (every check writes).
//! * `throughput/hot-flood`, `throughput/hot-admit`, `throughput/uniform`,
//!   `throughput/zipf` — 1, 2 and 4 threads on one hot client (both quotas),
//!   on 10,000 clients drawn uniformly and on 100,000 drawn by a Zipf law.
//! * `insert` — the first call of a new client; `gcra/lockfree-sized` on a
//!   limiter whose table is sized once for them (`max_clients`), so the
//!   difference to `gcra/lockfree` is what the table's growth costs.
//! * `clock` — one read of the default clock (and of `Instant`, for scale).
//! * `sweep/keep`, `sweep/remove` — one sweep of 100,000 `gcra` clients on
//!   the lock-free engine, none of them idle (every one kept) and all of
//!   them idle (every one removed): the cost an arrival pays when it runs
//!   a sweep (`src/bounds.rs`), per client visited.
//!
//! The engines are the lock-free `Limiter<u64, P>` (monomorphised per policy),
//! the `MutexLimiter` baseline and, for `gcra`, `governor`'s keyed limiter
//! at the same quota. Every check reads the engine's own clock, as a caller's
//! would. `benches/README.md` has the results and how to read them.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{
    criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use floodgate::policy::{
    Compound, FixedWindow, Gcra, LeakyBucket, Pair, Policy, SlidingWindow, SlidingWindowCounter,
    TokenBucket, WindowPair,
};
use floodgate::{
    Bounds, Clock, Config, Limiter, MutexLimiter, PolicyKind, QuantaClock, RateLimiter,
};
use governor::{DefaultKeyedRateLimiter, Quota};

/// The limit of both quotas. Small, because a `sliding-window` client keeps
/// `L` admission times (16 bytes each) and the Zipf group tracks 100,000.
const LIMIT: u64 = 100;
/// 100 per millisecond: a hot loop on one client (tens of millions of checks
/// a second) is rejected on all but about one call in a thousand, while
/// 10,000 clients sharing that loop stay well under their limit.
const FLOOD_WINDOW_NS: u64 = 1_000_000;
/// 100 per 100 ns: no loop calls that fast, so every check is admitted and
/// writes its client's state.
const ADMIT_WINDOW_NS: u64 = 100;

const UNIFORM_CLIENTS: u64 = 10_000;
const ZIPF_CLIENTS: u64 = 100_000;
const THREADS: [usize; 3] = [1, 2, 4];

/// One engine at one quota, as the timed loops see it.
trait Subject: Sync {
    fn check(&self, key: u64) -> bool;
}

impl<P: Policy> Subject for Limiter<u64, P, QuantaClock> {
    #[inline]
    fn check(&self, key: u64) -> bool {
        Limiter::check(self, &key).allowed()
    }
}

impl Subject for MutexLimiter<u64, QuantaClock> {
    #[inline]
    fn check(&self, key: u64) -> bool {
        RateLimiter::<u64>::check(self, &key).allowed()
    }
}

impl Subject for DefaultKeyedRateLimiter<u64> {
    #[inline]
    fn check(&self, key: u64) -> bool {
        self.check_key(&key).is_ok()
    }
}

/// The timed work, behind one dynamic call per sample (never per check), so
/// engines of different types sit in one list.
trait Runner {
    /// `iters` checks on each of `threads` threads, cycling through that
    /// thread's key sequence; the wall time from a common start to the last
    /// thread's finish.
    fn run(&self, keys: &[Vec<u32>], threads: usize, iters: u64) -> Duration;
    /// `iters` checks, each of a client never seen before.
    fn insert(&self, iters: u64) -> Duration;
    /// Creates clients `0..clients`, so the timed loops see known clients.
    fn prefill(&self, clients: u64);
}

/// Builds one engine at a time, so `insert` can start from an empty map.
struct Engine<S, F> {
    subject: S,
    fresh: F,
}

impl<S: Subject, F: Fn() -> S> Runner for Engine<S, F> {
    fn run(&self, keys: &[Vec<u32>], threads: usize, iters: u64) -> Duration {
        run_threads(&self.subject, keys, threads, iters)
    }

    fn insert(&self, iters: u64) -> Duration {
        // A fresh map per sample: the dropped one is not timed, and memory
        // stays bounded (a `sliding-window` client holds 1.6 KB).
        let subject = (self.fresh)();
        let start = Instant::now();
        for key in 0..iters {
            black_box(subject.check(key));
        }
        start.elapsed()
    }

    fn prefill(&self, clients: u64) {
        for key in 0..clients {
            self.subject.check(key);
        }
    }
}

fn run_threads<S: Subject>(subject: &S, keys: &[Vec<u32>], threads: usize, iters: u64) -> Duration {
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|scope| {
        for sequence in keys.iter().cycle().take(threads) {
            let barrier = &barrier;
            scope.spawn(move || {
                // Sequence lengths are powers of two: a mask, not a division.
                let mask = sequence.len() - 1;
                barrier.wait();
                for i in 0..iters as usize {
                    black_box(subject.check(u64::from(sequence[i & mask])));
                }
            });
        }
        barrier.wait();
        Instant::now()
    })
    .elapsed()
}

/// Every engine at one quota: the six lock-free policies, the mutex
/// baseline for each, and governor for `gcra`.
fn engines(window: u64) -> Vec<(PolicyKind, &'static str, Box<dyn Runner>)> {
    fn lockfree<P: Policy>(config: Config) -> Box<dyn Runner> {
        let fresh = move || Limiter::<u64, P>::new(P::new(config).expect("valid quota"));
        Box::new(Engine {
            subject: fresh(),
            fresh,
        })
    }
    let config = Config::per_ticks(LIMIT, window).expect("valid quota");
    let mut all: Vec<(PolicyKind, &'static str, Box<dyn Runner>)> = Vec::new();
    for kind in PolicyKind::ALL {
        let fast = match kind {
            PolicyKind::SlidingWindow => lockfree::<SlidingWindow>(config),
            PolicyKind::TokenBucket => lockfree::<TokenBucket>(config),
            PolicyKind::FixedWindow => lockfree::<FixedWindow>(config),
            PolicyKind::SlidingWindowCounter => lockfree::<SlidingWindowCounter>(config),
            PolicyKind::Gcra => lockfree::<Gcra>(config),
            PolicyKind::LeakyBucket => lockfree::<LeakyBucket>(config),
            PolicyKind::InFlight => unreachable!("not a rate policy (PolicyKind::ALL)"),
        };
        all.push((kind, "lockfree", fast));
        let fresh = move || {
            MutexLimiter::<u64>::with_clock(kind, config, QuantaClock::new()).expect("valid quota")
        };
        all.push((
            kind,
            "mutex",
            Box::new(Engine {
                subject: fresh(),
                fresh,
            }),
        ));
        if kind == PolicyKind::Gcra {
            let fresh = move || DefaultKeyedRateLimiter::<u64>::keyed(governor_quota(config));
            all.push((
                kind,
                "governor",
                Box::new(Engine {
                    subject: fresh(),
                    fresh,
                }),
            ));
        }
    }
    all
}

/// `gcra`'s quota in governor's terms: a burst of `L`, one cell per `I`
/// (the contract's equivalence; `Quota::new` would round differently).
fn governor_quota(config: Config) -> Quota {
    let limit = u32::try_from(config.limit()).expect("limits fit 20 bits");
    Quota::with_period(Duration::from_nanos(config.interval()))
        .expect("interval is at least 1 ns")
        .allow_burst(NonZeroU32::new(limit).expect("limits are at least 1"))
}

/// How the timed loop picks its clients.
#[derive(Clone, Copy)]
enum Keys {
    Hot,
    Uniform,
    Zipf,
}

impl Keys {
    /// How many clients the engines track before timing starts.
    fn clients(self) -> u64 {
        match self {
            Keys::Hot => 1,
            Keys::Uniform => UNIFORM_CLIENTS,
            Keys::Zipf => ZIPF_CLIENTS,
        }
    }

    /// One precomputed key sequence per thread (no generator in the timed
    /// loop), a power of two long. Each thread has its own fixed seed, so
    /// every run draws the same keys and the threads do not share a stream.
    fn sequences(self, threads: usize) -> Vec<Vec<u32>> {
        let zipf = matches!(self, Keys::Zipf).then(|| Zipf::new(ZIPF_CLIENTS));
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

/// Ranks `0..n` with `P(k) ∝ 1 / (k + 1)`: a Zipf law with s = 1, sampled
/// by inverting its cumulative distribution.
///
/// The same sampler as `floodgate bench`'s (`cli/src/bench/mod.rs`), where a
/// unit test checks its first ranks' shares: a bench target cannot import
/// the CLI's private code, so the two copies are kept in step by hand.
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

/// Short runs, so the whole default `cargo bench` takes a few minutes:
/// 10 samples over `measurement`, and 5,000 bootstrap resamples (plenty for
/// 10 samples; the default 100,000 costs a second per bench).
fn configure(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    measurement: Duration,
) {
    group
        .warm_up_time(Duration::from_millis(150))
        .measurement_time(measurement)
        .sample_size(10)
        .nresamples(5_000);
}

fn check(c: &mut Criterion) {
    for (name, window) in [("flood", FLOOD_WINDOW_NS), ("admit", ADMIT_WINDOW_NS)] {
        let mut group = c.benchmark_group(format!("check/{name}"));
        configure(&mut group, Duration::from_millis(600));
        group.throughput(Throughput::Elements(1));
        let keys = Keys::Hot.sequences(1);
        for (policy, engine, runner) in engines(window) {
            group.bench_function(BenchmarkId::new(policy.name(), engine), |b| {
                b.iter_custom(|iters| runner.run(&keys, 1, iters));
            });
        }
        group.finish();
    }
}

fn throughput(c: &mut Criterion) {
    let cases = [
        ("hot-flood", Keys::Hot, FLOOD_WINDOW_NS),
        ("hot-admit", Keys::Hot, ADMIT_WINDOW_NS),
        ("uniform", Keys::Uniform, FLOOD_WINDOW_NS),
        ("zipf", Keys::Zipf, FLOOD_WINDOW_NS),
    ];
    for (name, keys, window) in cases {
        let mut group = c.benchmark_group(format!("throughput/{name}"));
        configure(&mut group, Duration::from_millis(400));
        let engines = engines(window);
        for (_, _, runner) in &engines {
            runner.prefill(keys.clients());
        }
        for threads in THREADS {
            let sequences = keys.sequences(threads);
            // Elements per iteration = threads: each thread does `iters`.
            group.throughput(Throughput::Elements(threads as u64));
            for (policy, engine, runner) in &engines {
                let id = BenchmarkId::new(format!("{}/{engine}", policy.name()), threads);
                group.bench_function(id, |b| {
                    b.iter_custom(|iters| runner.run(&sequences, threads, iters));
                });
            }
        }
        group.finish();
    }
}

fn insert(c: &mut Criterion) {
    let mut group = c.benchmark_group("insert");
    configure(&mut group, Duration::from_millis(300));
    // Equal sample sizes bound the largest map (and its memory).
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(1));
    for (policy, engine, runner) in engines(FLOOD_WINDOW_NS) {
        group.bench_function(BenchmarkId::new(policy.name(), engine), |b| {
            b.iter_custom(|iters| runner.insert(iters));
        });
    }
    // A table sized for the sample's clients up front never grows, so no
    // client is moved; capped, each arrival also counts against the cap.
    let config = Config::per_ticks(LIMIT, FLOOD_WINDOW_NS).expect("valid quota");
    group.bench_function(BenchmarkId::new("gcra", "lockfree-sized"), |b| {
        b.iter_custom(|iters| {
            let clients = usize::try_from(iters).expect("a sample fits in memory");
            let limiter = Limiter::<u64, Gcra, _>::with_bounds(
                Gcra::new(config).expect("valid quota"),
                QuantaClock::new(),
                Bounds::new().max_clients(clients),
            )
            .expect("valid bounds");
            let start = Instant::now();
            for key in 0..iters {
                black_box(limiter.check(&key));
            }
            start.elapsed()
        });
    });
    group.finish();
}

/// Clients each sample of the growth group creates.
const GROWN: u64 = 1_000_000;

/// A table grown from empty to a million clients, `gcra`, each engine: the
/// whole growth's time per client, moves included. The slowest single call
/// of a growth (what the stepped moves bound) is `floodgate bench --tail`'s:
/// criterion measures sums.
fn growth(c: &mut Criterion) {
    let mut group = c.benchmark_group("growth");
    configure(&mut group, Duration::from_secs(3));
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(10);
    group.throughput(Throughput::Elements(GROWN));
    for (policy, engine, runner) in engines(FLOOD_WINDOW_NS) {
        if policy != PolicyKind::Gcra {
            continue;
        }
        group.bench_function(BenchmarkId::new("to 1M", engine), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| runner.insert(GROWN)).sum());
        });
    }
    group.finish();
}

/// Two limiters called in turn, as an application writes it without
/// several rules: the quota only when the burst admits.
struct TwoLimiters {
    burst: Limiter<u64, Gcra, QuantaClock>,
    quota: Limiter<u64, TokenBucket, QuantaClock>,
}

impl Subject for TwoLimiters {
    #[inline]
    fn check(&self, key: u64) -> bool {
        self.burst.check(&key).allowed() && self.quota.check(&key).allowed()
    }
}

/// Several rules on one client (a `gcra` burst and a quota 60 times its
/// size over 60 windows) beside the burst alone and two limiters in turn,
/// hot and keyed, on 1 and 2 threads: `floodgate bench`'s several-rules
/// rows, under criterion.
fn rules(c: &mut Criterion) {
    let burst = Config::per_ticks(LIMIT, FLOOD_WINDOW_NS).unwrap();
    let quota = |policy: PolicyKind| {
        let limit = LIMIT * 60;
        let rule = floodgate::Rule::new(
            policy,
            Config::per_ticks(limit, FLOOD_WINDOW_NS * 60).unwrap(),
        );
        floodgate::RuleSet::new([
            floodgate::Rule::new(PolicyKind::Gcra, burst).unwrap(),
            rule.unwrap(),
        ])
        .unwrap()
    };
    fn engine<S: Subject + 'static>(fresh: impl Fn() -> S + 'static) -> Box<dyn Runner> {
        Box::new(Engine {
            subject: fresh(),
            fresh,
        })
    }
    let token_bucket = quota(PolicyKind::TokenBucket);
    let fixed_window = quota(PolicyKind::FixedWindow);
    let counter = quota(PolicyKind::SlidingWindowCounter);
    let sliding_window = quota(PolicyKind::SlidingWindow);
    let setups: Vec<(&str, Box<dyn Runner>)> = vec![
        (
            "gcra-alone",
            engine(move || Limiter::<u64, Gcra>::new(Gcra::new(burst).unwrap())),
        ),
        ("gcra+token-bucket", {
            let rules = token_bucket.clone();
            engine(move || Limiter::<u64, Pair>::new(Pair::from_rules(&rules).unwrap()))
        }),
        (
            "gcra+fixed-window",
            engine(move || {
                Limiter::<u64, WindowPair>::new(WindowPair::from_rules(&fixed_window).unwrap())
            }),
        ),
        (
            "gcra+sliding-window-counter",
            engine(move || {
                Limiter::<u64, WindowPair>::new(WindowPair::from_rules(&counter).unwrap())
            }),
        ),
        (
            "gcra+sliding-window",
            engine(move || {
                Limiter::<u64, Compound>::new(Compound::from_rules(&sliding_window).unwrap())
            }),
        ),
        ("two-limiters", {
            let quota = token_bucket[1].config();
            engine(move || TwoLimiters {
                burst: Limiter::new(Gcra::new(burst).unwrap()),
                quota: Limiter::new(TokenBucket::new(quota).unwrap()),
            })
        }),
    ];
    for keys in [Keys::Hot, Keys::Uniform] {
        let name = match keys {
            Keys::Hot => "hot",
            _ => "uniform",
        };
        let mut group = c.benchmark_group(format!("rules/{name}"));
        configure(&mut group, Duration::from_millis(400));
        for (_, runner) in &setups {
            runner.prefill(keys.clients());
        }
        for threads in [1, 2] {
            let sequences = keys.sequences(threads);
            group.throughput(Throughput::Elements(threads as u64));
            for (name, runner) in &setups {
                group.bench_function(BenchmarkId::new(*name, threads), |b| {
                    b.iter_custom(|iters| runner.run(&sequences, threads, iters));
                });
            }
        }
        group.finish();
    }
}

fn clock(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock");
    configure(&mut group, Duration::from_millis(300));
    let quanta = QuantaClock::new();
    group.bench_function("QuantaClock::now", |b| b.iter(|| quanta.now()));
    group.bench_function("Instant::now", |b| b.iter(Instant::now));
    group.finish();
}

/// Clients in each sweep.
const SWEPT: u64 = 100_000;

fn sweep(c: &mut Criterion) {
    let mut group = c.benchmark_group("sweep");
    configure(&mut group, Duration::from_secs(1));
    group.throughput(Throughput::Elements(SWEPT));
    // Every client checked once at 0: its schedule runs one interval (10
    // µs) ahead, so a sweep at 0 keeps it and one a second later removes it.
    let filled = || {
        let config = Config::per_ticks(LIMIT, FLOOD_WINDOW_NS).expect("valid quota");
        let limiter = Limiter::new(Gcra::new(config).expect("valid quota"));
        for key in 0..SWEPT {
            assert!(limiter.check_at(&key, 0).allowed());
        }
        limiter
    };
    let kept = filled();
    group.bench_function("keep", |b| {
        b.iter(|| assert_eq!(kept.sweep_at(black_box(0)), 0));
    });
    group.bench_function("remove", |b| {
        b.iter_batched_ref(
            filled,
            |limiter| assert_eq!(limiter.sweep_at(black_box(1_000_000_000)), SWEPT as usize),
            BatchSize::PerIteration,
        );
    });
    group.finish();
}

criterion_group!(benches, check, throughput, insert, growth, rules, clock, sweep);
criterion_main!(benches);
