//! Decisions through Redis: one script call per decision, from 1, 4 and 16
//! threads with a connection each, for every policy.
//!
//! Needs a server: `FLOODGATE_REDIS_URL=redis://127.0.0.1:6379 cargo bench
//! --features redis --bench redis`. Without the variable it says so and
//! measures nothing. Keys go under the prefix `floodgate-criterion`, cleared
//! before and after. `floodgate bench --backend redis://…` gives the same
//! figures in one table with p50/p99 latency and `redis-benchmark`'s `INCR`
//! rate beside them.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use floodgate::redis::{RedisLimiter, RedisOptions};
use floodgate::{Config, PolicyKind};

const PREFIX: &str = "floodgate-criterion";
const CLIENTS: u64 = 10_000;

fn limiter(url: &str, policy: PolicyKind, connections: usize) -> RedisLimiter {
    // 100 per millisecond per client on Redis's clock (microseconds): the
    // uniform clients below stay under it, so every check writes.
    let config = Config::per_ticks(100, 1_000).expect("a valid quota");
    let options = RedisOptions::new()
        .prefix(PREFIX)
        .timeout(Duration::from_secs(2))
        .connections(connections);
    RedisLimiter::new(url, policy, config, options).expect("a valid configuration")
}

/// `iters` checks spread over `threads` threads, each drawing its own
/// clients; the wall time of the whole.
fn run(limiter: &RedisLimiter, threads: usize, iters: u64) -> Duration {
    let per_thread = iters.div_ceil(threads as u64);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..threads {
            scope.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(thread as u64);
                for _ in 0..per_thread {
                    let key = format!("c{}", rng.u64(..CLIENTS));
                    limiter.try_check(&key).expect("Redis answers");
                }
            });
        }
    });
    start.elapsed()
}

fn decisions(c: &mut Criterion) {
    let Ok(url) = std::env::var("FLOODGATE_REDIS_URL") else {
        eprintln!("benches/redis.rs: FLOODGATE_REDIS_URL is not set; nothing measured");
        return;
    };
    for policy in PolicyKind::ALL {
        let mut group = c.benchmark_group(format!("redis/{}", policy.name()));
        group.throughput(Throughput::Elements(1));
        group.measurement_time(Duration::from_secs(3));
        for threads in [1, 4, 16] {
            let limiter = limiter(&url, policy, threads);
            limiter.clear_prefix(PREFIX).expect("Redis answers");
            group.bench_with_input(
                BenchmarkId::new("connections", threads),
                &threads,
                |b, &threads| b.iter_custom(|iters| run(&limiter, threads, iters)),
            );
            limiter.clear_prefix(PREFIX).expect("Redis answers");
        }
        group.finish();
    }
}

criterion_group!(benches, decisions);
criterion_main!(benches);
