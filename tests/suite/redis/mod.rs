//! The Redis store against a real `redis-server` (never a mock).
//!
//! - every policy gives the in-memory engine's answers, field by field, on
//!   seeded random traces and on the spec's two example sessions;
//! - with times that step back, every policy keeps the contract's bound
//!   (never more lenient than at the latest reflected time);
//! - several processes share one limit through one Redis;
//! - each fault rule answers as documented while Redis is down or stalled,
//!   and traffic resumes after a restart without rebuilding the limiter;
//! - keys expire exactly when their state answers as an empty one;
//! - `peek_at` creates nothing and agrees with `remaining_at`, and `forget`
//!   starts a client afresh, on both APIs;
//! - the async limiter's batched checks give the answers of checks sent one
//!   by one, and a check whose caller gave up before it went out is never
//!   sent;
//! - several rules on one client give the mutex engine's answers, the
//!   refusing rule included, through one server, a cluster (a client's keys
//!   in one slot) and the async limiter's batches.
//!
//! The shared server is found through `FLOODGATE_REDIS_URL` (`.ci/run`
//! starts one and sets it); the fault tests start their own `redis-server`
//! on a free loopback port, so they can stop it. The tests that need a
//! server are `#[ignore]`d, so a plain `cargo test` lists them as ignored,
//! with the reason, rather than passing them untried; `.ci/run` runs them
//! with `--include-ignored`, and then a missing variable or `redis-server`
//! fails the test:
//!
//! ```sh
//! FLOODGATE_REDIS_URL=redis://127.0.0.1:6379 \
//!     cargo test -p floodgate --test suite redis:: -- --include-ignored
//! ```

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate::redis::{
    AsyncRedisLimiter, OnFailure, RedisError, RedisLimiter, RedisOptions, TimeSource, MAX_NOW,
};
use floodgate::{
    build_rules, build_with, Bounds, Config, Decision, Engine, ManualClock, PolicyKind,
    RateLimiter, Rule, RuleSet,
};

/// The variable that names the shared server.
const URL_VARIABLE: &str = "FLOODGATE_REDIS_URL";

/// Set in the child processes of `several_processes_share_one_limit`.
const CHILD_VARIABLE: &str = "FLOODGATE_REDIS_TEST_CHILD";

/// The shared server's URL.
///
/// # Panics
///
/// When the variable is not set: a test that asked for a server and has
/// none fails rather than passes untried.
fn shared_url() -> String {
    match std::env::var(URL_VARIABLE) {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "{URL_VARIABLE} is not set (e.g. redis://127.0.0.1:6379; .ci/run starts a \
             server and sets it)"
        ),
    }
}

/// A prefix no other test or run shares.
fn prefix(test: &str) -> String {
    format!("floodgate-test:{}:{test}", std::process::id())
}

/// Options for exact comparisons: times passed in milliseconds, and keys
/// kept an hour, so that no key expires in real time while a trace whose
/// times run far faster than real time is replayed. The rejection cache is
/// off: every answer is then Redis's own, field by field (a cached weighted
/// rejection keeps the `remaining` of its time); the cache has tests of its
/// own ([`cache_differential`]).
fn exact_options(prefix: &str) -> RedisOptions {
    RedisOptions::new()
        .prefix(prefix)
        .time(TimeSource::MILLIS)
        .timeout(Duration::from_secs(5))
        .min_ttl(Duration::from_secs(3_600))
        .rejection_cache(0)
}

fn in_memory(policy: PolicyKind, config: Config) -> Arc<dyn RateLimiter<str>> {
    build_with::<str, _>(
        policy,
        config,
        Engine::LockFree,
        ManualClock::with_tick(0, floodgate::Tick::MILLISECOND),
    )
    .unwrap_or_else(|e| panic!("{policy} {config:?}: {e}"))
}

/// A connection of the test's own, to read keys and TTLs.
fn inspect(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|client| client.get_connection())
        .expect("connect to the test server")
}

/// Clears a prefix when dropped, so a failed test leaves nothing behind.
struct Cleanup<'a> {
    limiter: &'a RedisLimiter,
    prefix: String,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = self.limiter.clear_prefix(&self.prefix);
    }
}

mod batches;
mod cache;
mod cluster;
mod expiry;
mod faults;
mod leases;
mod peek;
mod processes;
mod several_rules;
mod stats;
mod traces;
