//! The async limiter's batches: the answers of checks sent one by one, and
//! exactly the limit for one client.

use super::faults::Server;
use super::traces::{trace, Trace};
use super::*;

/// Eight tasks share one async limiter (so their checks that wait at the
/// same time go out as batches), each replaying a trace of its own clients;
/// every answer must be the in-memory engine's, as if each call had been
/// sent alone. Whether those checks met in flight depends on the machine's
/// timing, so each policy then forces batches on a server of the test's
/// own ([`forced_batches`]), whose `INFO commandstats` must show them.
#[test]
#[ignore = "needs redis-server on the PATH: run with --include-ignored"]
fn batched_checks_answer_as_checks_sent_one_by_one() {
    const TASKS: usize = 8;
    let server = Server::start();
    let url = server.url();
    let runtime = two_workers();
    let mut rng = fastrand::Rng::with_seed(0xBA7C4);
    for policy in PolicyKind::ALL {
        // One quota for the shared limiter: a trace's, with a limit small
        // enough that the sliding log stays short.
        let config = loop {
            let trace = trace(policy, &mut rng);
            if trace.limit <= 1_000 {
                break Config::per_ticks(trace.limit, trace.window).unwrap();
            }
        };
        let traces: Vec<Trace> = (0..TASKS).map(|_| trace(policy, &mut rng)).collect();
        let memory: Arc<dyn RateLimiter<str>> = in_memory(policy, config);
        runtime.block_on(async {
            let redis = AsyncRedisLimiter::new(&url, policy, config, exact_options("batched"))
                .await
                .unwrap();
            let tasks: Vec<_> = traces
                .into_iter()
                .enumerate()
                .map(|(task, trace)| {
                    let (redis, memory) = (redis.clone(), Arc::clone(&memory));
                    tokio::spawn(async move {
                        for (index, &(allow, client, now)) in trace.calls.iter().enumerate() {
                            let key = format!("{policy}-{task}-{client}");
                            // The costs of the trace, within this quota.
                            let cost = trace.costs[index].min(config.limit() + 1);
                            let context =
                                format!("{policy} {config:?} {key} call {index} at {now}");
                            if allow {
                                let got = redis.try_check_n_at(&key, now, cost).await.unwrap();
                                assert_eq!(
                                    got,
                                    memory.check_n_at(&key, now, cost),
                                    "{context}, cost {cost}"
                                );
                            } else {
                                let got = redis.try_remaining_at(&key, now).await.unwrap();
                                assert_eq!(got, memory.remaining_at(&key, now), "{context}");
                            }
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
            forced_batches(&server, &redis, memory.as_ref(), policy).await;
        });
    }
}

/// Checks of new clients while the server is stopped: the first ones go out
/// and hold every in-flight place (four), the rest wait in the queue, and
/// once the server runs again the queue goes out as one batch. So however
/// the machine schedules the tasks, the server runs at most five script
/// calls for the 24 checks, and each answer is the in-memory engine's.
pub(super) async fn forced_batches(
    server: &Server,
    redis: &AsyncRedisLimiter,
    memory: &dyn RateLimiter<str>,
    policy: PolicyKind,
) {
    const CHECKS: usize = 24;
    const NOW: u64 = 5_000;
    let url = server.url();
    let before = script_calls(&url);
    server.signal("-STOP");
    let queued = Arc::new(tokio::sync::Semaphore::new(0));
    let checks: Vec<_> = (0..CHECKS)
        .map(|check| {
            let (redis, queued) = (redis.clone(), Arc::clone(&queued));
            tokio::spawn(async move {
                let key = format!("{policy}-forced-{check}");
                let decision = after_first_poll(redis.try_check_at(&key, NOW), || {
                    queued.add_permits(1);
                })
                .await;
                (key, decision)
            })
        })
        .collect();
    // A check whose first poll is pending has been queued (or sent): none
    // can be answered while the server is stopped.
    let all = u32::try_from(CHECKS).unwrap();
    drop(queued.acquire_many(all).await.unwrap());
    server.signal("-CONT");
    for check in checks {
        let (key, decision) = check.await.unwrap();
        assert_eq!(
            decision.unwrap(),
            memory.check_at(&key, NOW),
            "{policy} {key} at {NOW}"
        );
    }
    let calls = script_calls(&url) - before;
    assert!(
        calls <= 5,
        "{policy}: {calls} script calls for {CHECKS} checks queued behind a stopped server"
    );
}

/// `future`, calling `first` once its first poll has returned.
pub(super) async fn after_first_poll<F: std::future::Future>(
    future: F,
    first: impl FnOnce(),
) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut first = Some(first);
    std::future::poll_fn(|context| {
        let poll = future.as_mut().poll(context);
        if let Some(first) = first.take() {
            first();
        }
        poll
    })
    .await
}

/// Sixteen tasks check one client 10 times each at one frozen time, through
/// one async limiter whose checks go out in batches: exactly the limit is
/// admitted, under every policy, and nothing is left after.
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn batched_checks_of_one_client_admit_exactly_the_limit() {
    let url = shared_url();
    let prefix = prefix("batched_one_client");
    let runtime = two_workers();
    for policy in PolicyKind::ALL {
        let config = Config::per_ticks(50, 1_000_000).unwrap();
        let (admitted, remaining) = runtime.block_on(async {
            let redis = AsyncRedisLimiter::new(&url, policy, config, exact_options(&prefix))
                .await
                .unwrap();
            let tasks: Vec<_> = (0..16)
                .map(|_| {
                    let redis = redis.clone();
                    tokio::spawn(async move {
                        let mut admitted = 0;
                        for _ in 0..10 {
                            admitted += u64::from(
                                redis.try_check_at("one", 1_000).await.unwrap().allowed(),
                            );
                        }
                        admitted
                    })
                })
                .collect();
            let mut admitted = 0;
            for task in tasks {
                admitted += task.await.unwrap();
            }
            (
                admitted,
                redis.try_remaining_at("one", 1_000).await.unwrap(),
            )
        });
        assert_eq!((admitted, remaining), (50, 0), "{policy}");
    }
    clear(&url, &prefix);
}

/// Deletes every key under `prefix` on the server at `url`.
pub(super) fn clear(url: &str, prefix: &str) {
    RedisLimiter::new(
        url,
        PolicyKind::Gcra,
        Config::per_ticks(1, 1).unwrap(),
        exact_options(prefix),
    )
    .unwrap()
    .clear_prefix(prefix)
    .unwrap();
}

/// A runtime of two worker threads, so that tasks run at once and their
/// calls meet in flight.
pub(super) fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// How many script calls (`EVALSHA`, and `EVAL` after a `NOSCRIPT`) the
/// server at `url` ran since it started.
pub(super) fn script_calls(url: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut inspect(url))
        .unwrap();
    info.lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:"))
        .map(|line| {
            let calls = line.split_once("calls=").expect("a calls= field").1;
            calls[..calls.find(',').unwrap_or(calls.len())]
                .parse::<u64>()
                .unwrap()
        })
        .sum()
}
