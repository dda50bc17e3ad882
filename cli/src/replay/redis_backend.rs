//! `floodgate replay --backend redis://HOST:PORT` (or
//! `redis-cluster://HOST:PORT[,HOST:PORT…]` for a Redis Cluster): the same
//! trace answered from Redis, through the scripts of `floodgate::redis`.
//!
//! The trace's times are passed to Redis as they are, in milliseconds, so
//! the answers are the in-memory engine's. Before the trace, every key under
//! the replay's prefix is deleted (`SCAN` and `UNLINK`; never `FLUSHDB`), so
//! a replay starts from new clients, and nothing outside that prefix is ever
//! touched. Without `--prefix` the prefix is the run's own,
//! `floodgate-replay-PID-RANDOM`, and its keys are deleted again when the
//! replay ends, so replays sharing one Redis never see or delete each
//! other's keys. An explicit `--prefix` is cleared before the trace only:
//! its keys stay for a look afterwards.
//!
//! Every answer is Redis's own: the local rejection cache is off (a cached
//! weighted rejection keeps the `remaining` of its time, and the replay
//! prints `remaining`).
//!
//! Written keys live at least a day, whatever the policy's own expiry: a
//! trace's times need not follow real time (a person typing calls is slower
//! than the trace says), and the answers must not depend on how fast it is
//! fed.
//!
//! A call that Redis fails to answer ends the replay: a message on standard
//! error, every earlier answer written, and exit status 101. It is never
//! answered by a fault rule, which would print an answer the trace does not
//! determine. The run's own keys are then left to expire.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use floodgate::redis::{RedisLimiter, RedisOptions, TimeSource};
use floodgate::{Config, Decision, PolicyKind, RateLimiter, RuleSet};

use super::Backend;

/// A prefix no other replay takes: the process id, to tell whose keys they
/// are, and 64 random bits, since process ids repeat across hosts sharing
/// one Redis and a process may run several replays. `-`, not `:`, after
/// `floodgate-replay`, so that clearing an explicit `--prefix
/// floodgate-replay` (the name's old default) does not reach them.
fn run_prefix() -> String {
    // Every `RandomState` has keys of its own, from the system's randomness.
    let random = RandomState::new().build_hasher().finish();
    format!("floodgate-replay-{}-{random:016x}", std::process::id())
}

/// How long a replay waits for one answer before it gives up.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The least life of a written key: a day.
const KEEP: Duration = Duration::from_secs(24 * 60 * 60);

/// The Redis limiter `backend` asks for, its prefix cleared, or `None` when
/// the replay answers from memory.
///
/// # Errors
///
/// A message for a configuration Redis refuses, a bad URL, or a Redis that
/// cannot be reached to clear the prefix.
pub fn limiter(
    rules: &RuleSet,
    backend: &Backend,
) -> Result<Option<Arc<dyn RateLimiter<str>>>, String> {
    let Some(url) = &backend.url else {
        return Ok(None);
    };
    let prefix = backend.prefix.clone().unwrap_or_else(run_prefix);
    let options = RedisOptions::new()
        .prefix(prefix.clone())
        .time(TimeSource::MILLIS)
        .timeout(TIMEOUT)
        .min_ttl(KEEP)
        .connections(1)
        .rejection_cache(0)
        // A trace's times are not the wall clock's: held units stay held
        // until a release line, as the contract holds them.
        .lease(None);
    let limiter =
        RedisLimiter::with_rules(url, rules, options).map_err(|e| format!("--backend: {e}"))?;
    limiter
        .clear_prefix(&prefix)
        .map_err(|e| format!("--backend {url}: {e}"))?;
    Ok(Some(Arc::new(Strict {
        limiter,
        own: backend.prefix.is_none().then_some(prefix),
        failed: AtomicBool::new(false),
    })))
}

/// The Redis limiter with errors ending the replay instead of answering.
struct Strict {
    limiter: RedisLimiter,
    /// The run's own prefix, whose keys go when the replay ends.
    own: Option<String>,
    /// Whether a call failed: then the keys are left to expire rather than
    /// wait for a Redis that just failed.
    failed: AtomicBool,
}

impl Drop for Strict {
    fn drop(&mut self) {
        let Some(prefix) = &self.own else {
            return;
        };
        if self.failed.load(Ordering::Relaxed) {
            return;
        }
        if let Err(error) = self.limiter.clear_prefix(prefix) {
            eprintln!(
                "warning: could not delete the replay's keys under {prefix} ({error}); \
                 they are left to expire"
            );
        }
    }
}

/// What ends a replay whose backend failed, after the message is printed.
#[derive(Debug)]
pub struct BackendFailed;

impl Strict {
    /// Says why and unwinds: the replay's output buffer is dropped on the
    /// way, which writes every earlier answer, and `resume_unwind` skips the
    /// panic hook, so the message below is the only one.
    fn fail(&self, error: floodgate::redis::RedisError) -> ! {
        // Read by `drop` on this thread, during the unwinding below.
        self.failed.store(true, Ordering::Relaxed);
        eprintln!("error: Redis failed, the replay stops: {error}");
        std::panic::resume_unwind(Box::new(BackendFailed))
    }
}

impl RateLimiter<str> for Strict {
    fn refund_at(&self, key: &str, now: u64, at: u64, cost: u64) -> u64 {
        self.limiter
            .try_refund_at(key, now, at, cost)
            .unwrap_or_else(|e| self.fail(e))
    }

    fn release_at(&self, key: &str, now: u64, cost: u64) -> u64 {
        self.limiter
            .try_release_at(key, now, cost)
            .unwrap_or_else(|e| self.fail(e))
    }

    fn check_at(&self, key: &str, now: u64) -> Decision {
        self.limiter
            .try_check_at(key, now)
            .unwrap_or_else(|e| self.fail(e))
    }

    fn check_n_at(&self, key: &str, now: u64, cost: u64) -> Decision {
        self.limiter
            .try_check_n_at(key, now, cost)
            .unwrap_or_else(|e| self.fail(e))
    }

    fn remaining_at(&self, key: &str, now: u64) -> u64 {
        self.limiter
            .try_remaining_at(key, now)
            .unwrap_or_else(|e| self.fail(e))
    }

    fn now(&self) -> u64 {
        self.limiter.now()
    }

    fn policy(&self) -> PolicyKind {
        RateLimiter::policy(&self.limiter)
    }

    fn config(&self) -> Config {
        RateLimiter::config(&self.limiter)
    }

    fn rules(&self) -> RuleSet {
        RateLimiter::rules(&self.limiter)
    }

    fn tracked_clients(&self) -> usize {
        self.limiter.tracked_clients()
    }

    fn peek_at(&self, key: &str, now: u64) -> Option<u64> {
        self.limiter
            .try_peek_at(key, now)
            .unwrap_or_else(|e| self.fail(e))
    }

    fn forget(&self, key: &str) -> bool {
        self.limiter
            .try_forget(key)
            .unwrap_or_else(|e| self.fail(e))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;
    use std::thread;

    use clap::Parser;

    use super::super::{replay_with, Args};
    use floodgate::PolicyKind;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        args: Args,
    }

    /// `floodgate replay` with `options` on `trace`: (status, stdout, stderr).
    fn replay(options: &[&str], trace: &str) -> (u8, String, String) {
        let command =
            Command::try_parse_from(std::iter::once("replay").chain(options.iter().copied()))
                .unwrap_or_else(|e| panic!("{options:?}: {e}"));
        let (mut output, mut errors) = (Vec::new(), Vec::new());
        let status = replay_with(&command.args, trace.as_bytes(), &mut output, &mut errors);
        (
            status,
            String::from_utf8(output).unwrap(),
            String::from_utf8(errors).unwrap(),
        )
    }

    /// The test server's URL. The tests that need one are `#[ignore]`d, so
    /// a plain `cargo test` lists them as ignored; `.ci/run` runs them with
    /// `--include-ignored` and the variable set.
    ///
    /// # Panics
    ///
    /// When the variable is not set: a test that asked for a server and has
    /// none fails rather than passes untried.
    fn url() -> String {
        std::env::var("FLOODGATE_REDIS_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .expect("FLOODGATE_REDIS_URL is not set (.ci/run starts a server and sets it)")
    }

    /// A seeded trace: three clients, times never decreasing per client,
    /// `allow` lines with no cost, or a cost of 0, 1 to 5 (the tests' limit
    /// is 4) or 2^64 − 1.
    fn trace(seed: u64, window: u64) -> String {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut now = [0u64; 3];
        let mut text = String::from("# a seeded trace\n\n");
        for _ in 0..300 {
            let client = rng.usize(..3);
            now[client] += match rng.u8(..8) {
                0..=3 => 0,
                4 | 5 => rng.u64(1..=window),
                6 => window,
                _ => window * rng.u64(2..=5),
            };
            let verb = if rng.u8(..3) == 0 {
                "remaining"
            } else {
                "allow"
            };
            let cost = match (verb, rng.u8(..6)) {
                ("remaining", _) | (_, 0..=2) => String::new(),
                (_, 3) => format!(" {}", rng.u64(0..=5)),
                (_, 4) => format!(" {}", rng.u64(1..=2)),
                _ => format!(" {}", u64::MAX),
            };
            text.push_str(&format!(
                "{verb}\tclient#{client}  {}{cost}\r\n",
                now[client]
            ));
        }
        text
    }

    #[test]
    #[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
    fn redis_answers_every_trace_line_as_memory_does() {
        let url = url();
        let prefix = format!("floodgate-replay-test-{}", std::process::id());
        for (number, policy) in PolicyKind::ALL.into_iter().enumerate() {
            let trace = trace(number as u64, 40);
            for detail in [false, true] {
                let mut options = vec![
                    "--policy",
                    policy.name(),
                    "--limit",
                    "4",
                    "--window-ms",
                    "40",
                ];
                if detail {
                    options.push("--detail");
                }
                let memory = replay(&options, &trace);
                options.extend(["--backend", &url, "--prefix", &prefix]);
                let redis = replay(&options, &trace);
                assert_eq!(memory.0, 0, "{policy}: {}", memory.2);
                assert_eq!(redis, memory, "{policy}");
                assert_eq!(redis.1.lines().count(), 300);
            }
        }
        // The spec's first example session, with the replay's own prefix
        // cleared first: a second run answers the same.
        let example = "allow rahul 0\nallow rahul 100\nallow rahul 200\nallow rahul 300\n\
                       allow priya 300\nremaining rahul 999\nallow rahul 1000\nremaining rahul 1150\n";
        for _ in 0..2 {
            let options = [
                "--policy",
                "sliding-window",
                "--limit",
                "3",
                "--window-ms",
                "1000",
                "--backend",
                &url,
                "--prefix",
                &prefix,
            ];
            let (status, output, _) = replay(&options, example);
            assert_eq!(status, 0);
            assert_eq!(output, "true\ntrue\ntrue\nfalse\ntrue\n0\ntrue\n1\n");
        }
        let cleaner = floodgate::redis::RedisLimiter::new(
            &url,
            PolicyKind::Gcra,
            floodgate::Config::per_ticks(1, 1).unwrap(),
            floodgate::redis::RedisOptions::new(),
        )
        .unwrap();
        assert!(cleaner.clear_prefix(&prefix).unwrap() > 0);
    }

    /// `--rule`, once and several times: Redis answers every line as memory
    /// does, on both engines, plain and `--detail`.
    #[test]
    #[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
    fn redis_answers_several_rules_as_memory_does() {
        let url = url();
        let prefix = format!("floodgate-replay-rules-test-{}", std::process::id());
        let sets: [&[&str]; 4] = [
            &["gcra:4/40ms"],
            &["gcra:2/40ms", "fixed-window:5/200ms"],
            &["leaky-bucket:3/60ms", "sliding-window:4/100ms"],
            &[
                "token-bucket:4/80ms",
                "sliding-window-counter:3/40ms",
                "sliding-window:5/1s",
            ],
        ];
        for (number, rules) in sets.into_iter().enumerate() {
            let trace = trace(100 + number as u64, 40);
            for detail in [false, true] {
                let mut options: Vec<&str> =
                    rules.iter().flat_map(|rule| ["--rule", rule]).collect();
                if detail {
                    options.push("--detail");
                }
                let memory = replay(&options, &trace);
                assert_eq!(memory.0, 0, "{rules:?}: {}", memory.2);
                let mutex = replay(&[&options[..], &["--engine", "mutex"]].concat(), &trace);
                assert_eq!(mutex, memory, "{rules:?}");
                options.extend(["--backend", &url, "--prefix", &prefix]);
                let redis = replay(&options, &trace);
                assert_eq!(redis, memory, "{rules:?}");
                assert_eq!(redis.1.lines().count(), 300);
            }
        }
        let cleaner = floodgate::redis::RedisLimiter::new(
            &url,
            PolicyKind::Gcra,
            floodgate::Config::per_ticks(1, 1).unwrap(),
            floodgate::redis::RedisOptions::new(),
        )
        .unwrap();
        assert!(cleaner.clear_prefix(&prefix).unwrap() > 0);
    }

    #[test]
    #[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
    fn concurrent_replays_on_one_redis_each_answer_as_memory_does() {
        let url = url();
        let mut redis = redis::Client::open(url.as_str())
            .and_then(|client| client.get_connection())
            .expect("connect to the test server");
        // Someone else's key, where clearing the old default prefix reached.
        let outside = format!("floodgate-replay:{}:not-a-replay", std::process::id());
        redis::cmd("SET")
            .arg(&outside)
            .arg("kept")
            .exec(&mut redis)
            .unwrap();
        let replays = 4;
        let start = Barrier::new(replays);
        thread::scope(|scope| {
            for replay_number in 0..replays {
                let (url, start) = (&url, &start);
                scope.spawn(move || {
                    start.wait();
                    for (number, policy) in PolicyKind::ALL.into_iter().enumerate() {
                        let trace = trace((replay_number * 10 + number) as u64, 40);
                        let mut options = vec![
                            "--policy",
                            policy.name(),
                            "--limit",
                            "4",
                            "--window-ms",
                            "40",
                            "--detail",
                        ];
                        let memory = replay(&options, &trace);
                        assert_eq!(memory.0, 0, "{policy}: {}", memory.2);
                        options.extend(["--backend", url]);
                        let redis = replay(&options, &trace);
                        assert_eq!(redis, memory, "{policy}, replay {replay_number}");
                    }
                });
            }
        });
        // Each run deleted its own keys at its end, and nothing else.
        let left: Vec<String> = redis::cmd("KEYS")
            .arg(format!("floodgate-replay-{}-*", std::process::id()))
            .query(&mut redis)
            .unwrap();
        assert_eq!(left, Vec::<String>::new());
        let kept: Option<String> = redis::cmd("GET").arg(&outside).query(&mut redis).unwrap();
        assert_eq!(kept.as_deref(), Some("kept"));
        redis::cmd("DEL").arg(&outside).exec(&mut redis).unwrap();
    }

    #[test]
    fn run_prefixes_differ_within_a_process() {
        let (first, second) = (super::run_prefix(), super::run_prefix());
        assert_ne!(first, second);
        let head = format!("floodgate-replay-{}-", std::process::id());
        assert!(first.starts_with(&head), "{first}");
        assert!(!first.contains(['{', '}', ':']), "{first}");
    }

    #[test]
    fn an_unreachable_backend_is_refused_before_any_answer() {
        let (status, output, errors) = replay(
            &[
                "--policy",
                "gcra",
                "--limit",
                "1",
                "--window-ms",
                "10",
                "--backend",
                "redis://127.0.0.1:1",
            ],
            "allow a 0\n",
        );
        assert_eq!((status, output.as_str()), (2, ""));
        assert!(errors.contains("--backend redis://127.0.0.1:1"), "{errors}");
    }
}
