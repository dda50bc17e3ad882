//! `floodgate replay --backend redis://HOST:PORT`: the same trace answered
//! from Redis, through the scripts of `floodgate::redis`.
//!
//! The trace's times are passed to Redis as they are, in milliseconds, so
//! the answers are the in-memory engine's. Before the trace, every key under
//! `--prefix` is deleted (`SCAN` and `UNLINK`; never `FLUSHDB`), so a replay
//! starts from new clients. Written keys live at least a day, whatever the
//! policy's own expiry: a trace's times need not follow real time (a person
//! typing calls is slower than the trace says), and the answers must not
//! depend on how fast it is fed.
//!
//! A call that Redis fails to answer ends the replay: a message on standard
//! error, every earlier answer written, and exit status 101. It is never
//! answered by a fault rule, which would print an answer the trace does not
//! determine.

use std::time::Duration;

use floodgate::redis::{RedisLimiter, RedisOptions, TimeSource};
use floodgate::{Config, Decision, PolicyKind, RateLimiter};

/// The Redis options of `floodgate replay`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Backend {
    /// Answer from Redis instead of memory: redis://HOST:PORT[/DB]. Only
    /// keys under --prefix are touched; they are deleted before the trace.
    /// Redis forgets idle clients by itself (keys expire), so the in-memory
    /// options --engine, --evict-idle and --max-clients do not go with it.
    #[arg(
        long = "backend",
        value_name = "redis://HOST:PORT",
        conflicts_with_all = ["engine", "evict_idle", "max_clients"]
    )]
    pub url: Option<String>,

    /// The prefix of the replay's keys in Redis.
    #[arg(
        long,
        value_name = "PREFIX",
        default_value = "floodgate-replay",
        requires = "url"
    )]
    pub prefix: String,
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
    policy: PolicyKind,
    config: Config,
    backend: &Backend,
) -> Result<Option<Box<dyn RateLimiter<str>>>, String> {
    let Some(url) = &backend.url else {
        return Ok(None);
    };
    let options = RedisOptions::new()
        .prefix(backend.prefix.clone())
        .time(TimeSource::MILLIS)
        .timeout(TIMEOUT)
        .min_ttl(KEEP)
        .connections(1);
    let limiter =
        RedisLimiter::new(url, policy, config, options).map_err(|e| format!("--backend: {e}"))?;
    limiter
        .clear_prefix(&backend.prefix)
        .map_err(|e| format!("--backend {url}: {e}"))?;
    Ok(Some(Box::new(Strict(limiter))))
}

/// The Redis limiter with errors ending the replay instead of answering.
struct Strict(RedisLimiter);

/// What ends a replay whose backend failed, after the message is printed.
#[derive(Debug)]
pub struct BackendFailed;

impl Strict {
    /// Says why and unwinds: the replay's output buffer is dropped on the
    /// way, which writes every earlier answer, and `resume_unwind` skips the
    /// panic hook, so the message below is the only one.
    fn fail(&self, error: floodgate::redis::RedisError) -> ! {
        eprintln!("error: Redis failed, the replay stops: {error}");
        std::panic::resume_unwind(Box::new(BackendFailed))
    }
}

impl RateLimiter<str> for Strict {
    fn check_at(&self, key: &str, now: u64) -> Decision {
        self.0
            .try_check_at(key, now)
            .unwrap_or_else(|e| self.fail(e))
    }

    fn remaining_at(&self, key: &str, now: u64) -> u64 {
        self.0
            .try_remaining_at(key, now)
            .unwrap_or_else(|e| self.fail(e))
    }

    fn now(&self) -> u64 {
        self.0.now()
    }

    fn policy(&self) -> PolicyKind {
        RateLimiter::policy(&self.0)
    }

    fn config(&self) -> Config {
        RateLimiter::config(&self.0)
    }

    fn tracked_clients(&self) -> usize {
        self.0.tracked_clients()
    }

    fn peek_at(&self, key: &str, now: u64) -> Option<u64> {
        self.0
            .try_peek_at(key, now)
            .unwrap_or_else(|e| self.fail(e))
    }

    fn forget(&self, key: &str) -> bool {
        self.0.try_forget(key).unwrap_or_else(|e| self.fail(e))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

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

    fn url() -> Option<String> {
        let url = std::env::var("FLOODGATE_REDIS_URL")
            .ok()
            .filter(|u| !u.is_empty());
        if url.is_none() {
            // The process's standard error itself: the test harness
            // captures `eprintln!` of passing tests, not this handle.
            let _ = writeln!(
                std::io::stderr(),
                "skipped the replay's Redis test: FLOODGATE_REDIS_URL is not set (.ci/run \
                 starts a server and sets it)"
            );
        }
        url
    }

    /// A seeded trace: three clients, times never decreasing per client.
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
            text.push_str(&format!("{verb}\tclient#{client}  {}\r\n", now[client]));
        }
        text
    }

    #[test]
    fn redis_answers_every_trace_line_as_memory_does() {
        let Some(url) = url() else {
            return;
        };
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
