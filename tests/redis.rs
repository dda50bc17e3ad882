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
//!     cargo test -p floodgate --features redis --test redis -- --include-ignored
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

// The spec's examples and random traces ---------------------------------------

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn the_spec_example_sessions_replay_exactly() {
    spec_examples(&shared_url());
}

/// The spec's two example sessions through the Redis (or cluster) at `url`.
fn spec_examples(url: &str) {
    let url = url.to_owned();
    let prefix = prefix("examples");
    let sliding = RedisLimiter::new(
        &url,
        PolicyKind::SlidingWindow,
        Config::per_ticks(3, 1_000).unwrap(),
        exact_options(&prefix),
    )
    .unwrap();
    let _cleanup = Cleanup {
        limiter: &sliding,
        prefix: prefix.clone(),
    };
    assert!(sliding.try_check_at("rahul", 0).unwrap().allowed());
    assert!(sliding.try_check_at("rahul", 100).unwrap().allowed());
    assert!(sliding.try_check_at("rahul", 200).unwrap().allowed());
    let fourth = sliding.try_check_at("rahul", 300).unwrap();
    assert_eq!(
        (
            fourth.allowed(),
            fourth.retry_after_ticks().unwrap_or(u64::MAX)
        ),
        (false, 700)
    );
    assert!(sliding.try_check_at("priya", 300).unwrap().allowed());
    assert_eq!(sliding.try_remaining_at("rahul", 999).unwrap(), 0);
    assert!(sliding.try_check_at("rahul", 1_000).unwrap().allowed());
    assert_eq!(sliding.try_remaining_at("rahul", 1_150).unwrap(), 1);

    let bucket = RedisLimiter::new(
        &url,
        PolicyKind::TokenBucket,
        Config::per_ticks(2, 1_000).unwrap(),
        exact_options(&prefix),
    )
    .unwrap();
    assert!(bucket.try_check_at("app", 0).unwrap().allowed());
    assert!(bucket.try_check_at("app", 10).unwrap().allowed());
    let third = bucket.try_check_at("app", 20).unwrap();
    assert_eq!(
        (
            third.allowed(),
            third.retry_after_ticks().unwrap_or(u64::MAX)
        ),
        (false, 480)
    );
    assert_eq!(bucket.try_remaining_at("app", 499).unwrap(), 0);
    assert!(bucket.try_check_at("app", 500).unwrap().allowed());
    assert_eq!(bucket.try_remaining_at("app", 2_000).unwrap(), 2);
}

/// Seeded traces: a few clients, each one's time never decreasing, steps
/// from 0 to many windows (up to the contract's 2 × 10^12), half `allow`
/// and half `remaining`; an `allow` carries a cost (`costs`, aligned with
/// `calls`): mostly 1, else 0, up to `L`, `L`, `L + 1` or 2^64 − 1. A
/// `remaining` with `refunds[i]` set is a refund of that cost instead, of
/// the admission that many ticks before its time (at once, within the
/// window, at `W − 1` and `W` ticks, or at a time that was no admission).
struct Trace {
    limit: u64,
    window: u64,
    calls: Vec<(bool, usize, u64)>,
    costs: Vec<u64>,
    refunds: Vec<Option<u64>>,
}

fn trace(policy: PolicyKind, rng: &mut fastrand::Rng) -> Trace {
    // The sliding log takes limits up to 2^20 − 1 (its state is O(L)).
    let largest = match policy {
        PolicyKind::SlidingWindow => floodgate::MAX_LOG_LIMIT,
        _ => floodgate::MAX_LIMIT,
    };
    let limit = match rng.u8(..20) {
        0 => rng.u64(9..=1_000),
        1 => largest,
        _ => rng.u64(1..=8),
    };
    let least = if policy.drips() { limit } else { 1 };
    let mut window = match rng.u8(..10) {
        0 => rng.u64(least..=least.max(1_000_000_000)),
        1 => (limit * rng.u64(1..=20) + rng.u64(0..limit)).max(least),
        _ => rng.u64(least..=least + 49),
    };
    if policy == PolicyKind::SlidingWindowCounter {
        // Its exactness guard: L × W at most 2^52.
        window = window.min(floodgate::redis::MAX_COUNTER_PRODUCT / limit);
    }
    let clients = rng.usize(1..=3);
    let mut times = vec![rng.u64(0..=1_000); clients];
    let mut calls = Vec::new();
    for _ in 0..rng.usize(10..=60) {
        let client = rng.usize(..clients);
        let step = match rng.u8(..16) {
            0..=5 => 0,
            6..=8 => rng.u64(1..=3),
            9..=11 => rng.u64(0..=window),
            12 | 13 => window / 2 + rng.u64(0..=1),
            14 => window.saturating_mul(rng.u64(1..=3)),
            _ => window.saturating_mul(1 << rng.u32(0..=40)),
        };
        times[client] = times[client].saturating_add(step).min(2_000_000_000_000);
        calls.push((rng.bool(), client, times[client]));
    }
    let costs = calls
        .iter()
        .map(|_| match rng.u8(..12) {
            0 => 0,
            1 => rng.u64(1..=limit),
            2 => limit,
            3 => limit + 1,
            4 => u64::MAX,
            5 | 6 => rng.u64(1..=limit.min(4)),
            _ => 1,
        })
        .collect();
    let refunds = calls
        .iter()
        .map(|&(allow, _, now)| {
            let ago = match rng.u8(..10) {
                _ if allow => return None,
                0 => 0,
                1 => rng.u64(0..=window),
                2 => window - 1,
                3 => window,
                4 => rng.u64(0..=now),
                _ => return None,
            };
            Some(ago.min(now))
        })
        .collect();
    Trace {
        limit,
        window,
        calls,
        costs,
        refunds,
    }
}

/// Runs `traces` seeded traces of `policy` on Redis and in memory and
/// compares every answer. Each client's times never decrease ([`trace`]):
/// the contract promises identical answers only then. Backward times are
/// held to the contract's bound instead, by [`time_backwards`].
fn differential(policy: PolicyKind, traces: usize) {
    differential_through(&[&shared_url()], policy, traces);
}

/// [`differential`] through each Redis (or cluster) of `urls` at once:
/// every call goes to each of them and to the in-memory engine, and every
/// answer must be the engine's, so the backends agree with each other too.
fn differential_through(urls: &[&str], policy: PolicyKind, traces: usize) {
    let prefix = prefix(&format!("differential_{}", policy.name()));
    let mut rng = fastrand::Rng::with_seed(0xF100D ^ policy as u64);
    let (mut compared, mut refunds_giving) = (0, 0);
    for number in 0..traces {
        let trace = trace(policy, &mut rng);
        let config = Config::per_ticks(trace.limit, trace.window).unwrap();
        let memory = in_memory(policy, config);
        // A fresh client name per trace: configurations repeat across
        // traces, and each trace starts from new clients.
        // A long timeout: a trace may write a million-field log, and a
        // cluster test sends every trace to two backends at once.
        let backends: Vec<RedisLimiter> = urls
            .iter()
            .map(|url| {
                let options = exact_options(&prefix).timeout(Duration::from_secs(60));
                RedisLimiter::new(url, policy, config, options).unwrap()
            })
            .collect();
        // What the trace's checks answered, to hold each backend's own
        // count of its decisions to.
        let mut tally = [(0u64, 0u64); 2];
        for (index, &(allow, client, now)) in trace.calls.iter().enumerate() {
            let key = format!("t{number}c{client}");
            let cost = trace.costs[index];
            let context = |url: &str| {
                format!(
                    "{url}: {policy} L={} W={} trace {number} call {index}: {} {key} {now} \
                     {cost}\n{:?}",
                    trace.limit,
                    trace.window,
                    if allow { "allow" } else { "remaining" },
                    &trace.calls[..=index]
                )
            };
            if allow {
                let expected = if cost == 1 {
                    memory.check_at(&key, now)
                } else {
                    memory.check_n_at(&key, now, cost)
                };
                for (redis, url) in backends.iter().zip(urls) {
                    let got = if cost == 1 {
                        redis.try_check_at(&key, now)
                    } else {
                        redis.try_check_n_at(&key, now, cost)
                    };
                    let got = got.unwrap_or_else(|e| panic!("{e}: {}", context(url)));
                    assert_eq!(got, expected, "{}", context(url));
                }
                let counted = &mut tally[usize::from(expected.allowed())];
                counted.0 += 1;
                // Costs run up to 2^64 - 1: the units wrap, as `Stats`'s do.
                counted.1 = counted.1.wrapping_add(cost);
            } else if let Some(ago) = trace.refunds[index] {
                let at = now - ago;
                let expected = memory.refund_at(&key, now, at, cost);
                refunds_giving += usize::from(expected > 0);
                for (redis, url) in backends.iter().zip(urls) {
                    let got = redis
                        .try_refund_at(&key, now, at, cost)
                        .unwrap_or_else(|e| panic!("{e}: refund at {at}: {}", context(url)));
                    assert_eq!(got, expected, "refund at {at}: {}", context(url));
                }
            } else {
                let expected = memory.remaining_at(&key, now);
                for (redis, url) in backends.iter().zip(urls) {
                    let got = redis
                        .try_remaining_at(&key, now)
                        .unwrap_or_else(|e| panic!("{e}: {}", context(url)));
                    assert_eq!(got, expected, "{}", context(url));
                }
            }
            compared += 1;
        }
        for (redis, url) in backends.iter().zip(urls) {
            let stats = redis.stats().unwrap();
            assert_eq!(
                [
                    (stats.rejected, stats.rejected_units),
                    (stats.admitted, stats.admitted_units)
                ],
                tally,
                "{url}: {policy} trace {number}: the decisions counted"
            );
        }
        if number + 1 == traces {
            for redis in &backends {
                redis.clear_prefix(&prefix).unwrap();
            }
        }
    }
    eprintln!(
        "{policy}: {compared} answers of {traces} traces ({refunds_giving} refunds that gave \
         units back) through {} backends identical to the in-memory engine",
        urls.len()
    );
    assert!(refunds_giving > 0, "{policy}: no refund gave anything back");
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn differential_sliding_window() {
    differential(PolicyKind::SlidingWindow, 300);
}

/// One call on the mutex engine and on Redis, which must answer alike: a
/// refund of `cost` of the admission at `refund` if set, else a check of
/// `cost` (an admission's time kept in `admitted`); then `remaining`.
/// Whether a refund gave anything back.
#[allow(clippy::too_many_arguments)]
fn log_call(
    memory: &dyn RateLimiter<str>,
    redis: &RedisLimiter,
    key: &str,
    now: u64,
    cost: u64,
    refund: Option<u64>,
    admitted: &mut Vec<u64>,
    context: &str,
) -> bool {
    let mut gave = false;
    if let Some(at) = refund {
        let expected = memory.refund_at(key, now, at, cost);
        let got = redis.try_refund_at(key, now, at, cost).unwrap();
        assert_eq!(got, expected, "refund {cost} at {at}: {context}");
        gave = expected > 0;
    } else {
        let expected = memory.check_n_at(key, now, cost);
        let got = redis.try_check_n_at(key, now, cost).unwrap();
        assert_eq!(got, expected, "check {cost}: {context}");
        if expected.allowed() {
            admitted.push(expected.at_ticks());
        }
    }
    let expected = memory.remaining_at(key, now);
    assert_eq!(
        redis.try_remaining_at(key, now).unwrap(),
        expected,
        "{context}"
    );
    gave
}

/// The log's refund removes a block of entries from the middle of its
/// ring by moving only the shorter side over the gap (the older live
/// entries or the newer ones). Refunds here name times that were
/// admissions, at every depth of small rings that wrap, so both sides move
/// and entries that have left the window are dropped on the way; then on
/// a log of thousands of entries, which moves a chunk of a thousand at a
/// time. Every answer is the lock-free engine's.
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn a_log_refund_at_any_depth_answers_as_the_engine() {
    let url = shared_url();
    let prefix = prefix("log_refund_depths");
    let mut rng = fastrand::Rng::with_seed(0x10C);
    let limiters = |limit, window| {
        let config = Config::per_ticks(limit, window).unwrap();
        let memory = in_memory(PolicyKind::SlidingWindow, config);
        let options = exact_options(&prefix);
        let redis = RedisLimiter::new(&url, PolicyKind::SlidingWindow, config, options).unwrap();
        (memory, redis)
    };
    let mut moved = 0;
    for number in 0..200 {
        let (limit, window) = (rng.u64(1..=8), rng.u64(5..=30));
        let (memory, redis) = limiters(limit, window);
        let key = format!("t{number}");
        let (mut now, mut admitted) = (rng.u64(0..=100), Vec::new());
        for call in 0..40 {
            now += rng.u64(0..=3);
            let refund = (rng.u8(..3) == 0 && !admitted.is_empty())
                .then(|| admitted[rng.usize(..admitted.len())]);
            let context = format!("L={limit} W={window} trace {number} call {call} at {now}");
            let cost = rng.u64(1..=3);
            let gave = log_call(
                &*memory,
                &redis,
                &key,
                now,
                cost,
                refund,
                &mut admitted,
                &context,
            );
            moved += usize::from(gave);
        }
    }
    // A log of up to 3,000 entries that wraps its ring.
    let (memory, redis) = limiters(3_000, 500);
    let (mut admitted, mut long_moves) = (Vec::new(), 0);
    for now in 1..=1_500 {
        let refund =
            (now % 5 == 0 && !admitted.is_empty()).then(|| admitted[rng.usize(..admitted.len())]);
        let cost = if refund.is_some() { rng.u64(1..=9) } else { 7 };
        let context = format!("the long log at {now}");
        let gave = log_call(
            &*memory,
            &redis,
            "long",
            now,
            cost,
            refund,
            &mut admitted,
            &context,
        );
        long_moves += usize::from(gave);
    }
    clear(&url, &prefix);
    eprintln!("{moved} refunds gave back on small logs, {long_moves} on the long one");
    assert!(moved > 500, "only {moved} refunds gave anything back");
    assert!(
        long_moves > 100,
        "only {long_moves} refunds on the long log gave back"
    );
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn differential_token_bucket() {
    differential(PolicyKind::TokenBucket, 300);
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn differential_fixed_window() {
    differential(PolicyKind::FixedWindow, 300);
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn differential_sliding_window_counter() {
    differential(PolicyKind::SlidingWindowCounter, 300);
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn differential_gcra() {
    differential(PolicyKind::Gcra, 300);
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn differential_leaky_bucket() {
    differential(PolicyKind::LeakyBucket, 300);
}

/// Seeded traces whose clients' times mostly move forward but step back
/// now and then: by a few ticks, or by about a window (before the origin,
/// sometimes). Small limits and windows, so that backward calls meet full
/// states, window edges and drips.
fn backwards_trace(policy: PolicyKind, rng: &mut fastrand::Rng) -> Trace {
    let limit = [1, 2, 3, 5][rng.usize(..4)];
    let least = if policy.drips() { limit } else { 1 };
    let window = match rng.u8(..4) {
        0 => least,
        1 => (limit * rng.u64(1..=4) + rng.u64(0..limit)).max(least),
        _ => rng.u64(least.max(2)..=least + 30),
    };
    let clients = rng.usize(1..=3);
    let mut times: Vec<u64> = (0..clients).map(|_| rng.u64(0..=40)).collect();
    let mut calls = Vec::new();
    for _ in 0..rng.usize(10..=40) {
        let client = rng.usize(..clients);
        let now = times[client];
        times[client] = match rng.u8(..16) {
            0..=3 => now,
            4..=6 => now + rng.u64(1..=3),
            7 | 8 => now + rng.u64(0..=window),
            9 => now + window * rng.u64(1..=3),
            10..=12 => now.saturating_sub(rng.u64(1..=3)),
            13 => now.saturating_sub(rng.u64(0..=window)),
            _ => (now + rng.u64(0..=1)).saturating_sub(window),
        };
        calls.push((rng.u8(..3) != 0, client, times[client]));
    }
    let costs = vec![1; calls.len()];
    let refunds = vec![None; calls.len()];
    Trace {
        limit,
        window,
        calls,
        costs,
        refunds,
    }
}

/// The contract's rule for time going backwards, on Redis, by the method
/// of `fuzz/src/lib.rs`'s `check_time_backwards`: for each call whose `now`
/// is older than `m`, the latest time its client's state reflects (its
/// origin and the times of its admitted checks), a twin limiter on a
/// prefix of its own replays every earlier call, and makes the same call
/// at `m`. Then an admitted call must be admitted by the twin too and leave
/// the same state (equal `remaining` at m, m + 1, m + W − 1, m + W and
/// m + 2W); a rejected call must change nothing (the twin's `remaining`
/// there before its call); and an older `remaining` never exceeds the
/// twin's at `m`.
fn time_backwards(policy: PolicyKind, traces: usize) {
    let test = format!("time_backwards_{}", policy.name());
    let url = shared_url();
    let prefix = prefix(&test);
    let mut rng = fastrand::Rng::with_seed(0xBAC4 ^ policy as u64);
    let (mut checked, mut backwards) = (0, 0);
    for number in 0..traces {
        let trace = backwards_trace(policy, &mut rng);
        let config = Config::per_ticks(trace.limit, trace.window).unwrap();
        let limiter = |name: String| {
            RedisLimiter::new(
                &url,
                policy,
                config,
                exact_options(&format!("{prefix}:{name}")),
            )
            .unwrap()
        };
        let redis = limiter(format!("t{number}"));
        let _cleanup = Cleanup {
            limiter: &redis,
            prefix: prefix.clone(),
        };
        let run = |limiter: &RedisLimiter, (allow, client, now): (bool, usize, u64)| {
            let key = format!("c{client}");
            if allow {
                (Some(limiter.try_check_at(&key, now).unwrap()), 0)
            } else {
                (None, limiter.try_remaining_at(&key, now).unwrap())
            }
        };
        // Per client: its origin and the latest reflected time.
        let mut clients: Vec<Option<(u64, u64)>> = vec![None; 3];
        for (k, &call) in trace.calls.iter().enumerate() {
            let (allow, client, now) = call;
            let context = || {
                format!(
                    "{policy} L={} W={} trace {number} call {k}: {} c{client} {now}\n{:?}",
                    trace.limit,
                    trace.window,
                    if allow { "allow" } else { "remaining" },
                    &trace.calls[..=k]
                )
            };
            checked += 1;
            let Some((origin, m)) = clients[client] else {
                clients[client] = Some((now, now));
                if let (Some(decision), _) = run(&redis, call) {
                    assert!(decision.allowed(), "first call rejected; {}", context());
                }
                continue;
            };
            if now >= m {
                if let (Some(decision), _) = run(&redis, call) {
                    if decision.allowed() {
                        clients[client] = Some((origin, now));
                    }
                }
                continue;
            }
            backwards += 1;
            let twin = limiter(format!("t{number}-twin{k}"));
            for &earlier in &trace.calls[..k] {
                run(&twin, earlier);
            }
            let key = format!("c{client}");
            let window = trace.window;
            let probes = [m, m + 1, m + window - 1, m + window, m + 2 * window];
            let remaining = |limiter: &RedisLimiter| {
                probes.map(|at| limiter.try_remaining_at(&key, at).unwrap())
            };
            match run(&redis, call) {
                (None, older) => {
                    let at_latest = twin.try_remaining_at(&key, m).unwrap();
                    assert!(
                        older <= at_latest,
                        "remaining {older} > {at_latest} at the latest time {m}; {}",
                        context()
                    );
                }
                (Some(decision), _) if decision.allowed() => {
                    let at_latest = twin.try_check_at(&key, m).unwrap();
                    assert!(
                        at_latest.allowed(),
                        "admitted ({decision:?}), but rejected at the latest time {m} \
                         ({at_latest:?}); {}",
                        context()
                    );
                    assert_eq!(
                        remaining(&redis),
                        remaining(&twin),
                        "the admission left another state than one at the latest time {m} \
                         (remaining at {probes:?}); {}",
                        context()
                    );
                }
                (Some(decision), _) => {
                    let before = remaining(&twin);
                    assert_eq!(
                        remaining(&redis),
                        before,
                        "a rejection ({decision:?}) changed the state (remaining at \
                         {probes:?}, latest time {m}); {}",
                        context()
                    );
                }
            }
        }
    }
    eprintln!("{policy}: {checked} calls of {traces} traces, {backwards} of them backwards, within the contract's bound");
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn time_backwards_sliding_window() {
    time_backwards(PolicyKind::SlidingWindow, 40);
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn time_backwards_token_bucket() {
    time_backwards(PolicyKind::TokenBucket, 40);
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn time_backwards_fixed_window() {
    time_backwards(PolicyKind::FixedWindow, 40);
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn time_backwards_sliding_window_counter() {
    time_backwards(PolicyKind::SlidingWindowCounter, 40);
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn time_backwards_gcra() {
    time_backwards(PolicyKind::Gcra, 40);
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn time_backwards_leaky_bucket() {
    time_backwards(PolicyKind::LeakyBucket, 40);
}

/// The async API runs the same scripts; a smaller sample of traces checks
/// its plumbing, for every policy.
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn the_async_api_answers_as_the_blocking_one() {
    let url = shared_url();
    let prefix = prefix("async");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut rng = fastrand::Rng::with_seed(0xA5);
        for policy in PolicyKind::ALL {
            for number in 0..20 {
                let trace = trace(policy, &mut rng);
                let config = Config::per_ticks(trace.limit, trace.window).unwrap();
                let memory = in_memory(policy, config);
                let redis = AsyncRedisLimiter::new(&url, policy, config, exact_options(&prefix))
                    .await
                    .unwrap();
                for (index, &(allow, client, now)) in trace.calls.iter().enumerate() {
                    let key = format!("{policy}-{number}-{client}");
                    if allow {
                        assert_eq!(
                            redis.try_check_at(&key, now).await.unwrap(),
                            memory.check_at(&key, now),
                            "{policy} {key} at {now}"
                        );
                    } else if let Some(ago) = trace.refunds[index] {
                        let (at, cost) = (now - ago, trace.costs[index]);
                        assert_eq!(
                            redis.try_refund_at(&key, now, at, cost).await.unwrap(),
                            memory.refund_at(&key, now, at, cost),
                            "{policy} {key} at {now}: refund {cost} at {at}"
                        );
                    } else {
                        assert_eq!(
                            redis.try_remaining_at(&key, now).await.unwrap(),
                            memory.remaining_at(&key, now),
                            "{policy} {key} at {now}"
                        );
                    }
                }
            }
        }
    });
    let cleaner = RedisLimiter::new(
        &url,
        PolicyKind::Gcra,
        Config::per_ticks(1, 1).unwrap(),
        exact_options(&prefix),
    )
    .unwrap();
    cleaner.clear_prefix(&prefix).unwrap();
}

// The async limiter's batches ---------------------------------------------------

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
async fn forced_batches(
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
async fn after_first_poll<F: std::future::Future>(future: F, first: impl FnOnce()) -> F::Output {
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
fn clear(url: &str, prefix: &str) {
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
fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// How many script calls (`EVALSHA`, and `EVAL` after a `NOSCRIPT`) the
/// server at `url` ran since it started.
fn script_calls(url: &str) -> u64 {
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

// The local rejection cache ------------------------------------------------------

/// Several instances with the rejection cache (prefix `cached`) and one
/// without (prefix `plain`) on the same Redis see the same requests in the
/// same order, one of the instances flooding one client. A rejection
/// changes nothing, so the two prefixes hold the same states throughout,
/// and the uncached answer is Redis's own. Every cached instance's answer
/// is then Redis's: the same `allowed` and `delay`, and when it was
/// answered locally, a `retry_after` of at least 1 and at most Redis's
/// (other instances' admissions may have moved Redis's later) and a
/// `remaining` below the cost; otherwise the very same decision.
fn cache_differential(policy: PolicyKind, traces: usize) {
    let url = shared_url();
    let prefix = prefix(&format!("cache_{}", policy.name()));
    let cached_prefix = format!("{prefix}:cached");
    let plain_prefix = format!("{prefix}:plain");
    let mut rng = fastrand::Rng::with_seed(0xCAC4E ^ policy as u64);
    let (mut local, mut compared) = (0, 0);
    for number in 0..traces {
        let limit = match rng.u8(..4) {
            0 => rng.u64(9..=100),
            _ => rng.u64(1..=6),
        };
        let least = if policy.drips() { limit } else { 1 };
        let window = match rng.u8(..3) {
            0 => rng.u64(least..=least + 10),
            1 => least * rng.u64(1..=20),
            _ => rng.u64(least..=least.max(10_000)),
        };
        let window = if policy == PolicyKind::SlidingWindowCounter {
            window.min(floodgate::redis::MAX_COUNTER_PRODUCT / limit)
        } else {
            window
        };
        let config = Config::per_ticks(limit, window).unwrap();
        let instances: Vec<RedisLimiter> = (0..3)
            .map(|_| {
                RedisLimiter::new(&url, policy, config, cached_options(&cached_prefix)).unwrap()
            })
            .collect();
        let plain = RedisLimiter::new(&url, policy, config, exact_options(&plain_prefix)).unwrap();
        let mut now = rng.u64(0..=1_000);
        for call in 0..rng.usize(50..=300) {
            // Instance 0 floods client 0; the others call any client.
            let (instance, client) = if rng.u8(..10) < 6 {
                (0, 0)
            } else {
                (rng.usize(1..3), rng.usize(..3))
            };
            now += match rng.u8(..10) {
                0..=5 => 0,
                6 | 7 => rng.u64(1..=3),
                8 => rng.u64(0..=window),
                _ => window / 2,
            };
            let cost = match rng.u8(..10) {
                0 => rng.u64(1..=limit),
                1 => limit,
                2 => limit + 1,
                3 => 0,
                _ => 1,
            };
            let key = format!("t{number}c{client}");
            let before = instances[instance].answered_locally();
            let got = instances[instance].try_check_n_at(&key, now, cost).unwrap();
            let answered_locally = instances[instance].answered_locally() > before;
            let expected = plain.try_check_n_at(&key, now, cost).unwrap();
            let context = format!(
                "{policy} L={limit} W={window} trace {number} call {call}: instance {instance} \
                 {key} at {now} cost {cost}, locally: {answered_locally}"
            );
            if answered_locally {
                local += 1;
                assert!(!expected.allowed(), "admitted by Redis: {context}");
                assert!(!got.allowed(), "{context}");
                assert_eq!(got.delay_ticks(), 0, "{context}");
                assert!(
                    (1..=expected.retry_after_ticks().unwrap_or(u64::MAX))
                        .contains(&got.retry_after_ticks().unwrap_or(u64::MAX)),
                    "retry_after {} past Redis's {}: {context}",
                    got.retry_after_ticks().unwrap_or(u64::MAX),
                    expected.retry_after_ticks().unwrap_or(u64::MAX)
                );
                assert!(got.remaining() < cost, "{context}");
                if cost == 1 {
                    assert_eq!(got.remaining(), expected.remaining(), "{context}");
                }
            } else {
                assert_eq!(got, expected, "{context}");
            }
            compared += 1;
        }
    }
    let cleaner = RedisLimiter::new(
        &url,
        policy,
        Config::per_ticks(1, 1).unwrap(),
        exact_options(&prefix),
    )
    .unwrap();
    cleaner.clear_prefix(&prefix).unwrap();
    assert!(
        local * 20 > compared,
        "{policy}: only {local} of {compared} answered locally"
    );
    eprintln!("{policy}: {compared} answers, {local} of them from the cache, all Redis's");
}

/// [`exact_options`] with the rejection cache on (its default).
fn cached_options(prefix: &str) -> RedisOptions {
    exact_options(prefix).rejection_cache(floodgate::redis::DEFAULT_REJECTION_CACHE)
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn the_rejection_cache_answers_as_redis_with_instances_sharing_one_redis() {
    for policy in PolicyKind::ALL {
        cache_differential(policy, 25);
    }
}

/// On Redis's clock the cache keeps its deadlines on the local monotonic
/// clock, from before the call that Redis rejected. A cached answer's
/// `retry_after` is then at least 1 and never reaches past that rejection's
/// `d` counted from when its answer arrived (a bound that holds whatever
/// the machine's speed): the cache never rejects past `now + d`. The
/// flood ends with an admission from Redis once the deadline has passed.
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn on_redis_clock_the_cache_rejects_no_longer_than_redis() {
    let url = shared_url();
    let prefix = prefix("cache_server_clock");
    let config = Config::per_ticks(2, 200_000).unwrap();
    let options = RedisOptions::new()
        .prefix(&prefix)
        .timeout(Duration::from_secs(5));
    for policy in PolicyKind::ALL {
        let cached = RedisLimiter::new(&url, policy, config, options.clone()).unwrap();
        let key = format!("flooder-{policy}");
        let mut admitted = 0;
        // When the last rejection from Redis arrived, and its retry_after.
        let mut last: Option<(Instant, u64)> = None;
        let deadline = Instant::now() + Duration::from_secs(30);
        while admitted < 3 || cached.answered_locally() == 0 {
            assert!(Instant::now() < deadline, "{policy}: the flood never ended");
            let locally = cached.answered_locally();
            let before = Instant::now();
            let decision = cached.try_check(&key).unwrap();
            if cached.answered_locally() > locally {
                let (arrived, d) = last.expect("a cached rejection follows one from Redis");
                let since =
                    i128::try_from(before.saturating_duration_since(arrived).as_micros()).unwrap();
                assert!(!decision.allowed());
                assert!(
                    decision.retry_after_ticks().unwrap_or(u64::MAX) >= 1,
                    "{policy}: {decision:?}"
                );
                assert!(
                    i128::from(decision.retry_after_ticks().unwrap_or(u64::MAX))
                        <= i128::from(d) - since,
                    "{policy}: {decision:?} past Redis's {d} µs, {since} µs after it"
                );
            } else if decision.allowed() {
                admitted += 1;
            } else {
                last = Some((
                    Instant::now(),
                    decision.retry_after_ticks().unwrap_or(u64::MAX),
                ));
            }
        }
        cached.clear_prefix(&prefix).unwrap();
    }
}

/// On Redis's clock a decision carries the server's time it was judged
/// at, so a refund by the decision gives its units back; a refusal gives
/// nothing back; and a refund that gives anything back clears the
/// client's cached refusal, so the next check is Redis's own.
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn on_redis_clock_a_refund_by_the_decision_gives_back_and_clears_the_cache() {
    let url = shared_url();
    let prefix = prefix("refund_server_clock");
    // One request a minute: nothing drips back while the test runs.
    let config = Config::per_ticks(1, 60_000_000).unwrap();
    let options = RedisOptions::new()
        .prefix(&prefix)
        .timeout(Duration::from_secs(5));
    for policy in PolicyKind::ALL {
        let limiter = RedisLimiter::new(&url, policy, config, options.clone()).unwrap();
        let key = format!("refunded-{policy}");
        let admitted = limiter.try_check(&key).unwrap();
        assert!(admitted.allowed(), "{policy}");
        let refused = limiter.try_check(&key).unwrap();
        assert!(!refused.allowed(), "{policy}");
        let locally = limiter.answered_locally();
        assert!(!limiter.try_check(&key).unwrap().allowed(), "{policy}");
        assert_eq!(limiter.answered_locally(), locally + 1, "{policy}: cached");
        assert_eq!(
            limiter.try_refund(&key, &refused, 1).unwrap(),
            0,
            "{policy}"
        );
        assert_eq!(
            limiter.try_refund(&key, &admitted, 1).unwrap(),
            1,
            "{policy}"
        );
        // Given back once only.
        assert_eq!(
            limiter.try_refund(&key, &admitted, 1).unwrap(),
            0,
            "{policy}"
        );
        assert!(limiter.try_check(&key).unwrap().allowed(), "{policy}");
        assert_eq!(limiter.answered_locally(), locally + 1, "{policy}");
    }
    let cleaner = RedisLimiter::new(&url, PolicyKind::Gcra, config, options).unwrap();
    cleaner.clear_prefix(&prefix).unwrap();
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn the_rejection_cache_stays_under_its_cap_while_100000_flooders_pass() {
    let url = shared_url();
    let prefix = prefix("cache_cap");
    let cap = floodgate::redis::DEFAULT_REJECTION_CACHE;
    let limiter = RedisLimiter::new(
        &url,
        PolicyKind::Gcra,
        Config::per_ticks(1, 40).unwrap(),
        exact_options(&prefix).rejection_cache(cap).connections(4),
    )
    .unwrap();
    let _cleanup = Cleanup {
        limiter: &limiter,
        prefix: prefix.clone(),
    };
    const FLOODERS: u64 = 100_000;
    const THREADS: u64 = 4;
    // Flooder `i` calls at time `i`: admitted, then rejected until `i + 40`,
    // so the live rejections are about the last 40 clients, and the rest
    // die and are swept as time passes. Each thread floods its own share.
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let limiter = &limiter;
            scope.spawn(move || {
                for id in (thread..FLOODERS).step_by(THREADS as usize) {
                    let key = format!("flooder-{id}");
                    assert!(limiter.try_check_at(&key, id).unwrap().allowed());
                    assert!(!limiter.try_check_at(&key, id).unwrap().allowed());
                    assert!(!limiter.try_check_at(&key, id + 1).unwrap().allowed());
                    assert!(limiter.cached_rejections() <= cap);
                }
            });
        }
    });
    assert!(limiter.cached_rejections() <= cap);
    // The third call of every flooder met its cached rejection.
    assert!(
        limiter.answered_locally() >= FLOODERS * 9 / 10,
        "{}",
        limiter.answered_locally()
    );

    // Frozen time: nothing dies, so the cache fills and then refuses
    // newcomers, which are asked of Redis and still rejected.
    let small = RedisLimiter::new(
        &url,
        PolicyKind::FixedWindow,
        Config::per_ticks(1, 1_000).unwrap(),
        exact_options(&prefix).rejection_cache(100),
    )
    .unwrap();
    for id in 0..1_000 {
        let key = format!("frozen-{id}");
        assert!(small.try_check_at(&key, 5).unwrap().allowed());
        assert!(!small.try_check_at(&key, 5).unwrap().allowed());
        assert!(small.cached_rejections() <= 100);
    }
    assert_eq!(small.cached_rejections(), 100);
    assert!(!small.try_check_at("frozen-999", 6).unwrap().allowed());
    assert!(!small.try_check_at("frozen-0", 6).unwrap().allowed());
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn forget_drops_the_cached_rejection_and_the_cache_can_be_turned_off() {
    let url = shared_url();
    let prefix = prefix("cache_forget");
    let config = Config::per_ticks(1, 1_000).unwrap();
    let limiter =
        RedisLimiter::new(&url, PolicyKind::Gcra, config, cached_options(&prefix)).unwrap();
    let _cleanup = Cleanup {
        limiter: &limiter,
        prefix: prefix.clone(),
    };
    assert!(limiter.try_check_at("f", 0).unwrap().allowed());
    assert!(!limiter.try_check_at("f", 1).unwrap().allowed());
    assert_eq!(limiter.answered_locally(), 0);
    let cached = limiter.try_check_at("f", 2).unwrap();
    assert_eq!(limiter.answered_locally(), 1);
    assert_eq!(
        (
            cached.allowed(),
            cached.retry_after_ticks().unwrap_or(u64::MAX)
        ),
        (false, 998)
    );
    // Weighted: a rejection of cost 1 covers every larger cost.
    assert!(!limiter.try_check_n_at("f", 3, 1).unwrap().allowed());
    assert_eq!(limiter.answered_locally(), 2);
    // Time that steps back goes to Redis.
    assert!(!limiter.try_check_at("f", 0).unwrap().allowed());
    assert_eq!(limiter.answered_locally(), 2);
    assert!(limiter.try_forget("f").unwrap());
    assert!(limiter.try_check_at("f", 4).unwrap().allowed());
    assert_eq!(limiter.cached_rejections(), 0);

    let off = RedisLimiter::new(
        &url,
        PolicyKind::Gcra,
        config,
        cached_options(&prefix).rejection_cache(0),
    )
    .unwrap();
    for now in 0..5 {
        assert_eq!(off.try_check_at("g", now).unwrap().allowed(), now == 0);
    }
    assert_eq!((off.answered_locally(), off.cached_rejections()), (0, 0));

    // The async limiter shares the rule.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let limiter = AsyncRedisLimiter::new(
            &url,
            PolicyKind::SlidingWindow,
            config,
            cached_options(&prefix),
        )
        .await
        .unwrap();
        assert!(limiter.try_check_at("a", 0).await.unwrap().allowed());
        assert!(!limiter.try_check_at("a", 10).await.unwrap().allowed());
        let cached = limiter.try_check_at("a", 20).await.unwrap();
        assert_eq!(
            (
                cached.allowed(),
                cached.retry_after_ticks().unwrap_or(u64::MAX)
            ),
            (false, 980)
        );
        assert_eq!(limiter.answered_locally(), 1);
        assert!(limiter.try_forget("a").await.unwrap());
        assert!(limiter.try_check_at("a", 30).await.unwrap().allowed());
    });
}

#[test]
fn times_past_exact_arithmetic_are_refused_before_any_round_trip() {
    // Nothing listens on port 1: a round trip would fail with Unavailable.
    let limiter = RedisLimiter::new(
        "redis://127.0.0.1:1",
        PolicyKind::Gcra,
        Config::per_ticks(1, 1_000).unwrap(),
        RedisOptions::new().time(TimeSource::MILLIS),
    )
    .unwrap();
    assert!(matches!(
        limiter.try_check_at("a", MAX_NOW + 1),
        Err(RedisError::TimeOutOfRange { now, max }) if now == MAX_NOW + 1 && max == MAX_NOW
    ));
    assert!(matches!(
        limiter.try_check_at("a", MAX_NOW),
        Err(RedisError::Unavailable(_))
    ));
    assert!(matches!(
        limiter.try_peek_at("a", MAX_NOW + 1),
        Err(RedisError::TimeOutOfRange { .. })
    ));
}

// Several rules on one client ---------------------------------------------------

/// A trace for a limiter of several rules: 2 or 3 rules of any policies,
/// with small limits and windows of different lengths so that each of them
/// gets to refuse, and costs up to past the largest limit.
struct RulesTrace {
    rules: RuleSet,
    /// `(call, client, now)`: 0 allow, 1 remaining, 2 peek, 3 refund.
    calls: Vec<(u8, usize, u64)>,
    costs: Vec<u64>,
    /// A refund's admission, that many ticks before its `now`.
    agos: Vec<u64>,
}

fn rules_trace(rng: &mut fastrand::Rng) -> RulesTrace {
    let count = rng.usize(2..=3);
    let mut rules = Vec::new();
    let mut longest = 1;
    let mut largest = 1;
    for _ in 0..count {
        let policy = PolicyKind::ALL[rng.usize(..PolicyKind::ALL.len())];
        let limit = match rng.u8(..6) {
            0 => rng.u64(9..=60),
            _ => rng.u64(1..=8),
        };
        let least = if policy.drips() { limit } else { 1 };
        let window = match rng.u8(..4) {
            0 => rng.u64(least..=least.max(100_000)),
            1 => limit * rng.u64(1..=20) + rng.u64(0..limit),
            _ => rng.u64(least..=least + 49),
        }
        .max(least);
        longest = longest.max(window);
        largest = largest.max(limit);
        let config = Config::per_ticks(limit, window).unwrap();
        rules
            .push(Rule::new(policy, config).unwrap_or_else(|e| panic!("{policy} {config:?}: {e}")));
    }
    let rules = RuleSet::new(rules).unwrap();
    let clients = rng.usize(1..=2);
    let mut times = vec![rng.u64(0..=1_000); clients];
    let mut calls = Vec::new();
    for _ in 0..rng.usize(20..=80) {
        let client = rng.usize(..clients);
        // A step that is short against one rule may be long against another.
        let window = rules[rng.usize(..rules.len())].config().window();
        let step = match rng.u8(..16) {
            0..=5 => 0,
            6..=8 => rng.u64(1..=3),
            9..=11 => rng.u64(0..=window),
            12 | 13 => window / 2 + rng.u64(0..=1),
            14 => window.saturating_mul(rng.u64(1..=3)),
            _ => longest.saturating_mul(rng.u64(1..=2)),
        };
        times[client] = times[client].saturating_add(step);
        let call = match rng.u8(..10) {
            0 => 1,
            1 => 2,
            2 => 3,
            _ => 0,
        };
        calls.push((call, client, times[client]));
    }
    let costs = calls
        .iter()
        .map(|_| match rng.u8(..12) {
            0 => 0,
            1 => rng.u64(1..=largest),
            2 => largest,
            3 => largest + 1,
            4 => u64::MAX,
            5 | 6 => rng.u64(1..=4),
            _ => 1,
        })
        .collect();
    let agos = calls
        .iter()
        .map(|&(_, _, now)| {
            let window = rules[rng.usize(..rules.len())].config().window();
            match rng.u8(..4) {
                0 => 0,
                1 => window - 1,
                2 => window,
                _ => rng.u64(0..=window),
            }
            .min(now)
        })
        .collect();
    RulesTrace {
        rules,
        calls,
        costs,
        agos,
    }
}

/// The mutex engine applying `rules`, on a manual clock in milliseconds,
/// the Redis limiters' tick with [`TimeSource::MILLIS`].
fn in_memory_rules(rules: &RuleSet) -> Arc<dyn RateLimiter<str>> {
    build_rules::<str, _>(
        rules,
        Engine::Mutex,
        ManualClock::with_tick(0, floodgate::Tick::MILLISECOND),
        Bounds::new(),
    )
    .unwrap_or_else(|e| panic!("{rules}: {e}"))
}

/// Runs `traces` seeded traces of several rules on each Redis (or cluster)
/// of `urls` and on the mutex engine, and compares every answer field by
/// field, the refusing rule and each rule's own answer included.
fn rules_differential_through(urls: &[&str], seed: u64, traces: usize) {
    let prefix = prefix("rules_differential");
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut compared, mut refunds_giving) = (0, 0);
    let mut refused_by = [0usize; 3];
    for number in 0..traces {
        let trace = rules_trace(&mut rng);
        let memory = in_memory_rules(&trace.rules);
        let backends: Vec<RedisLimiter> = urls
            .iter()
            .map(|url| RedisLimiter::with_rules(url, &trace.rules, exact_options(&prefix)).unwrap())
            .collect();
        for redis in &backends {
            assert_eq!(redis.rules(), memory.rules(), "{}", trace.rules);
            assert_eq!(redis.config(), memory.config(), "{}", trace.rules);
            assert_eq!(redis.policy(), memory.policy(), "{}", trace.rules);
        }
        for (index, &(call, client, now)) in trace.calls.iter().enumerate() {
            let key = format!("t{number}c{client}");
            let cost = trace.costs[index];
            let context = |url: &str| {
                format!(
                    "{url}: {} trace {number} call {index}: {call} {key} {now} {cost}\n{:?}\n{:?}",
                    trace.rules,
                    &trace.calls[..=index],
                    &trace.costs[..=index],
                )
            };
            match call {
                // Every third check with each rule's own answer too.
                0 if index % 3 == 0 => {
                    let expected = memory.check_ruled_n_at(&key, now, cost);
                    assert_eq!(expected.each.len(), trace.rules.len());
                    for (redis, url) in backends.iter().zip(urls) {
                        let got = redis.check_ruled_n_at(&key, now, cost);
                        assert_eq!(got, expected, "{}", context(url));
                    }
                }
                0 => {
                    let expected = memory.check_n_at(&key, now, cost);
                    if let Some(rule) = expected.refused_by() {
                        refused_by[rule] += 1;
                    }
                    for (redis, url) in backends.iter().zip(urls) {
                        let got = redis
                            .try_check_n_at(&key, now, cost)
                            .unwrap_or_else(|e| panic!("{e}: {}", context(url)));
                        assert_eq!(got, expected, "{}", context(url));
                        assert_eq!(got.refused_by(), expected.refused_by(), "{}", context(url));
                    }
                }
                1 => {
                    let expected = memory.remaining_at(&key, now);
                    for (redis, url) in backends.iter().zip(urls) {
                        let got = redis
                            .try_remaining_at(&key, now)
                            .unwrap_or_else(|e| panic!("{e}: {}", context(url)));
                        assert_eq!(got, expected, "{}", context(url));
                    }
                }
                3 => {
                    let at = now - trace.agos[index];
                    let expected = memory.refund_at(&key, now, at, cost);
                    refunds_giving += usize::from(expected > 0);
                    for (redis, url) in backends.iter().zip(urls) {
                        let got = redis
                            .try_refund_at(&key, now, at, cost)
                            .unwrap_or_else(|e| panic!("{e}: refund at {at}: {}", context(url)));
                        assert_eq!(got, expected, "refund at {at}: {}", context(url));
                    }
                }
                _ => {
                    let expected = memory.peek_at(&key, now);
                    for (redis, url) in backends.iter().zip(urls) {
                        let got = redis
                            .try_peek_at(&key, now)
                            .unwrap_or_else(|e| panic!("{e}: {}", context(url)));
                        assert_eq!(got, expected, "{}", context(url));
                    }
                }
            }
            compared += 1;
        }
    }
    for url in urls {
        let cleaner = RedisLimiter::new(
            url,
            PolicyKind::Gcra,
            Config::per_ticks(1, 1).unwrap(),
            exact_options(&prefix),
        )
        .unwrap();
        cleaner.clear_prefix(&prefix).unwrap();
    }
    assert!(
        refused_by[0] > 0 && refused_by[1] > 0,
        "every rule refuses somewhere: {refused_by:?}"
    );
    assert!(refunds_giving > 0, "no refund gave anything back");
    eprintln!(
        "several rules: {compared} answers of {traces} traces through {} backends identical to \
         the mutex engine's (refused by rule 0, 1, 2: {refused_by:?}; {refunds_giving} refunds \
         gave units back)",
        urls.len()
    );
}

/// Random traces of 2 or 3 rules of mixed policies, with costs: every
/// answer of the Redis limiter is the mutex engine's.
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn several_rules_answer_as_the_mutex_engine() {
    rules_differential_through(&[&shared_url()], 0x05E7_E4A1, 400);
}

/// The contract's example of several rules, by hand: 2 a second and 3 a
/// minute. A request the burst refuses spends nothing of the minute's
/// quota, and each refusal names its rule and waits that rule's wait.
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn a_refused_request_spends_no_rule_and_names_the_rule_that_refused() {
    let url = shared_url();
    let prefix = prefix("rules_by_hand");
    let rules: RuleSet = "gcra:2/1s,fixed-window:3/1m".parse().unwrap();
    let redis = RedisLimiter::with_rules(&url, &rules, exact_options(&prefix)).unwrap();
    let _cleanup = Cleanup {
        limiter: &redis,
        prefix: prefix.clone(),
    };
    assert_eq!(
        redis.rules(),
        rules.in_ticks_of(floodgate::Tick::MILLISECOND).unwrap()
    );
    assert_eq!(redis.config().limit(), 2);
    let check = |now| redis.try_check_at("app", now).unwrap();
    assert!(check(0).allowed());
    assert_eq!(check(0).remaining(), 0);
    // Refused by the burst: the minute's quota still holds 1.
    let burst = check(0);
    assert_eq!(
        (
            burst.allowed(),
            burst.refused_by(),
            burst.retry_after_ticks()
        ),
        (false, Some(0), Some(500))
    );
    assert_eq!(redis.try_remaining_at("app", 1_000).unwrap(), 1);
    assert!(check(1_000).allowed());
    let quota = check(2_000);
    assert_eq!(
        (
            quota.allowed(),
            quota.refused_by(),
            quota.retry_after_ticks()
        ),
        (false, Some(1), Some(58_000))
    );
    // A cost above the burst's limit is never admitted, by the burst.
    let never = redis.try_check_n_at("app", 60_000, 3).unwrap();
    assert_eq!(
        (
            never.allowed(),
            never.refused_by(),
            never.retry_after_ticks()
        ),
        (false, Some(0), None)
    );
    // One key per rule, all under the client's hash tag.
    let keys = redis.keys("app");
    assert_eq!(keys.len(), 2);
    assert_eq!(redis.key("app"), keys[0]);
    for (rule, key) in keys.iter().enumerate() {
        assert!(key.ends_with(&format!("{{app}}:{rule}")), "{key}");
    }
    let mut connection = inspect(&url);
    assert!(keys.iter().all(|key| exists(&mut connection, key)));
    assert_eq!(redis.try_tracked_clients().unwrap(), 1);
    assert!(redis.try_forget("app").unwrap());
    assert!(!keys.iter().any(|key| exists(&mut connection, key)));
    assert_eq!(redis.try_peek_at("app", 60_000).unwrap(), None);
}

/// A flooded client of several rules is answered by the rejection cache
/// until the compound `retry_after`, with the rule that refused; every
/// answer is Redis's as [`cache_differential`] holds them.
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn the_rejection_cache_keeps_the_compound_wait_and_the_rule() {
    let url = shared_url();
    let prefix = prefix("rules_cache");
    let rules: RuleSet = "sliding-window:3/1s,token-bucket:5/1h".parse().unwrap();
    let cached =
        RedisLimiter::with_rules(&url, &rules, cached_options(&format!("{prefix}:cached")))
            .unwrap();
    let plain =
        RedisLimiter::with_rules(&url, &rules, exact_options(&format!("{prefix}:plain"))).unwrap();
    let _cleanup = Cleanup {
        limiter: &cached,
        prefix: prefix.clone(),
    };
    let mut local = 0;
    for now in (0..20_000).step_by(50) {
        let before = cached.answered_locally();
        let got = cached.try_check_at("flood", now).unwrap();
        let expected = plain.try_check_at("flood", now).unwrap();
        if cached.answered_locally() > before {
            local += 1;
            assert!(!expected.allowed(), "at {now}");
            assert_eq!(got.refused_by(), expected.refused_by(), "at {now}");
            assert_eq!(got.remaining(), expected.remaining(), "at {now}");
            assert!(
                (1..=expected.retry_after_ticks().unwrap())
                    .contains(&got.retry_after_ticks().unwrap()),
                "at {now}: {got:?} against {expected:?}"
            );
        } else {
            assert_eq!(got, expected, "at {now}");
        }
    }
    // After 5 admissions the hour's bucket refuses for 720 s: every later
    // call is the cache's.
    assert!(local > 350, "{local} answered locally");
}

/// Several rules through the async limiter: eight tasks share it, so their
/// checks go out in batches (each client's keys after one another in one
/// call), and batches are forced on a server of the test's own; every
/// answer is the mutex engine's.
#[test]
#[ignore = "needs redis-server on the PATH: run with --include-ignored"]
fn several_rules_in_batches_answer_as_the_mutex_engine() {
    const TASKS: usize = 8;
    let server = Server::start();
    let url = server.url();
    let runtime = two_workers();
    let mut rng = fastrand::Rng::with_seed(0x5E7B);
    for round in 0..6 {
        let rules = rules_trace(&mut rng).rules;
        let traces: Vec<RulesTrace> = (0..TASKS).map(|_| rules_trace(&mut rng)).collect();
        let memory = in_memory_rules(&rules);
        runtime.block_on(async {
            let prefix = format!("rules-batched-{round}");
            let redis = AsyncRedisLimiter::with_rules(&url, &rules, exact_options(&prefix))
                .await
                .unwrap();
            assert_eq!(redis.rules(), memory.rules());
            let tasks: Vec<_> = traces
                .into_iter()
                .enumerate()
                .map(|(task, trace)| {
                    let (redis, memory, rules) =
                        (redis.clone(), Arc::clone(&memory), rules.clone());
                    tokio::spawn(async move {
                        for (index, &(call, client, now)) in trace.calls.iter().enumerate() {
                            let key = format!("{task}-{client}");
                            let cost = trace.costs[index];
                            let context = format!("{rules} {key} call {index} at {now}");
                            if call == 0 {
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
            let policy = rules[0].policy();
            forced_batches(&server, &redis, memory.as_ref(), policy).await;
        });
    }
}

// Peek and forget ---------------------------------------------------------------

fn exists(connection: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query(connection).unwrap()
}

fn fields(connection: &mut redis::Connection, key: &str) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> =
        redis::cmd("HGETALL").arg(key).query(connection).unwrap();
    fields.sort();
    fields
}

/// A few calls, then the times at which `peek_at` is compared with
/// `remaining_at`: before the origin, at it, at the latest call, and past
/// one and several windows (W = 1000).
const PEEK_CALLS: [(bool, u64); 5] = [
    (true, 10),
    (true, 10),
    (false, 200),
    (true, 400),
    (false, 450),
];
const PEEK_TIMES: [u64; 8] = [0, 10, 400, 401, 999, 1_410, 2_010, 50_000];

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn peek_creates_nothing_and_forget_starts_the_client_afresh() {
    let url = shared_url();
    let prefix = prefix("peek");
    let mut connection = inspect(&url);
    let config = Config::per_ticks(3, 1_000).unwrap();
    for policy in PolicyKind::ALL {
        // The least TTL of `exact_options` makes `remaining` store a new
        // client; a peek must still store nothing.
        let limiter = RedisLimiter::new(&url, policy, config, exact_options(&prefix)).unwrap();
        let _cleanup = Cleanup {
            limiter: &limiter,
            prefix: prefix.clone(),
        };
        let key = limiter.key("p");
        assert_eq!(limiter.try_peek_at("p", 10).unwrap(), None, "{policy}");
        assert_eq!(limiter.peek_at("p", 10), None, "{policy}");
        assert!(
            !exists(&mut connection, &key),
            "{policy}: peek stored a key"
        );
        assert_eq!(limiter.try_tracked_clients().unwrap(), 0, "{policy}");

        let memory = in_memory(policy, config);
        for (allow, now) in PEEK_CALLS {
            if allow {
                assert_eq!(
                    limiter.try_check_at("p", now).unwrap(),
                    memory.check_at("p", now)
                );
            } else {
                assert_eq!(
                    limiter.try_remaining_at("p", now).unwrap(),
                    memory.remaining_at("p", now)
                );
            }
        }
        let stored = fields(&mut connection, &key);
        for at in PEEK_TIMES {
            let peeked = limiter.try_peek_at("p", at).unwrap();
            assert_eq!(
                peeked,
                Some(limiter.try_remaining_at("p", at).unwrap()),
                "{policy} at {at}"
            );
            // Before the latest reflected time (400) the engines may
            // differ: SPEC, time going backwards.
            if at >= 400 {
                assert_eq!(peeked, memory.peek_at("p", at), "{policy} at {at}");
            }
        }
        assert_eq!(
            fields(&mut connection, &key),
            stored,
            "{policy}: peek wrote"
        );

        assert!(limiter.try_forget("p").unwrap(), "{policy}");
        assert!(
            !exists(&mut connection, &key),
            "{policy}: forget left the key"
        );
        assert!(!limiter.try_forget("p").unwrap(), "{policy}");
        assert!(!limiter.forget("p"), "{policy}");
        assert_eq!(limiter.try_peek_at("p", 500).unwrap(), None, "{policy}");
        // The next calls are a new client's, whose origin is 500: the grid
        // policies' windows and drips move with it.
        let fresh = in_memory(policy, config);
        for now in [500, 500, 1_400, 1_499, 1_500] {
            assert_eq!(
                limiter.try_check_at("p", now).unwrap(),
                fresh.check_at("p", now),
                "{policy}: after forget, at {now}"
            );
        }
        assert!(limiter.forget("p"), "{policy}");
        assert_eq!(limiter.peek_at("p", 1_500), None, "{policy}");
    }
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn the_async_limiter_peeks_and_forgets_as_the_blocking_one() {
    let url = shared_url();
    let prefix = prefix("async-peek");
    let mut connection = inspect(&url);
    let cleaner = RedisLimiter::new(
        &url,
        PolicyKind::Gcra,
        Config::per_ticks(1, 1).unwrap(),
        exact_options(&prefix),
    )
    .unwrap();
    let _cleanup = Cleanup {
        limiter: &cleaner,
        prefix: prefix.clone(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = Config::per_ticks(3, 1_000).unwrap();
    runtime.block_on(async {
        for policy in PolicyKind::ALL {
            let limiter = AsyncRedisLimiter::new(&url, policy, config, exact_options(&prefix))
                .await
                .unwrap();
            let key = limiter.key("p");
            assert_eq!(
                limiter.try_peek_at("p", 10).await.unwrap(),
                None,
                "{policy}"
            );
            assert_eq!(limiter.peek_at("p", 10).await, None, "{policy}");
            assert!(
                !exists(&mut connection, &key),
                "{policy}: peek stored a key"
            );

            let memory = in_memory(policy, config);
            for (allow, now) in PEEK_CALLS {
                if allow {
                    assert_eq!(
                        limiter.try_check_at("p", now).await.unwrap(),
                        memory.check_at("p", now)
                    );
                } else {
                    assert_eq!(
                        limiter.try_remaining_at("p", now).await.unwrap(),
                        memory.remaining_at("p", now)
                    );
                }
            }
            let stored = fields(&mut connection, &key);
            for at in PEEK_TIMES {
                let peeked = limiter.try_peek_at("p", at).await.unwrap();
                assert_eq!(
                    peeked,
                    Some(limiter.try_remaining_at("p", at).await.unwrap()),
                    "{policy} at {at}"
                );
                if at >= 400 {
                    assert_eq!(peeked, memory.peek_at("p", at), "{policy} at {at}");
                }
            }
            assert_eq!(
                fields(&mut connection, &key),
                stored,
                "{policy}: peek wrote"
            );

            assert!(limiter.try_forget("p").await.unwrap(), "{policy}");
            assert!(
                !exists(&mut connection, &key),
                "{policy}: forget left the key"
            );
            assert!(!limiter.forget("p").await, "{policy}");
            let fresh = in_memory(policy, config);
            for now in [500, 500, 1_400, 1_499, 1_500] {
                assert_eq!(
                    limiter.check_at("p", now).await,
                    fresh.check_at("p", now),
                    "{policy}: after forget, at {now}"
                );
            }
            assert!(limiter.forget("p").await, "{policy}");
            assert_eq!(limiter.peek_at("p", 1_500).await, None, "{policy}");
        }
    });
}

// Several processes, one limit --------------------------------------------------

/// What `several_processes_share_one_limit` runs in each child process
/// (`spec` is the URL and the prefix): checks every policy's shared client
/// from two threads at a frozen time and prints how many each policy
/// admitted.
fn child_checks_the_shared_client(spec: &str) {
    let (url, prefix) = spec.split_once(' ').expect("URL and prefix");
    for policy in PolicyKind::ALL {
        let limiter = Arc::new(
            RedisLimiter::new(
                url,
                policy,
                Config::per_ticks(SHARED_LIMIT, 1_000_000).unwrap(),
                exact_options(prefix).connections(2),
            )
            .unwrap(),
        );
        let admitted: u64 = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let limiter = Arc::clone(&limiter);
                    scope.spawn(move || {
                        (0..CHECKS_PER_THREAD)
                            .filter(|_| limiter.try_check_at("shared", 7).unwrap().allowed())
                            .count() as u64
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        });
        // A line of its own: the test harness prints the test's name on the
        // same stream, without a newline before the test's output.
        println!("\n{MARKER} {} {admitted}", policy.name());
    }
}

const SHARED_LIMIT: u64 = 37;
/// Starts each child's result line.
const MARKER: &str = "floodgate-child-admitted";
const CHECKS_PER_THREAD: usize = 25;
const CHILDREN: usize = 4;

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn several_processes_share_one_limit() {
    // The same test in each child process, which plays its part only.
    if let Ok(spec) = std::env::var(CHILD_VARIABLE) {
        child_checks_the_shared_client(&spec);
        return;
    }
    let url = shared_url();
    let prefix = prefix("processes");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<Child> = (0..CHILDREN)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "several_processes_share_one_limit",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_VARIABLE, format!("{url} {prefix}"))
                .stdout(Stdio::piped())
                .spawn()
                .expect("run this test binary again")
        })
        .collect();
    let mut totals = std::collections::HashMap::<String, u64>::new();
    for mut child in children {
        let stdout = child.stdout.take().unwrap();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(rest) = line.strip_prefix(MARKER).map(str::trim_start) {
                let (policy, count) = rest.split_once(' ').unwrap();
                *totals.entry(policy.to_owned()).or_default() += count.parse::<u64>().unwrap();
            }
        }
        assert!(child.wait().unwrap().success(), "a child process failed");
    }
    let cleaner = RedisLimiter::new(
        &url,
        PolicyKind::Gcra,
        Config::per_ticks(1, 1).unwrap(),
        exact_options(&prefix),
    )
    .unwrap();
    cleaner.clear_prefix(&prefix).unwrap();
    // 4 processes × 2 threads × 25 checks = 200 requests at one instant:
    // every policy admits exactly its limit of them, whoever sent them.
    for policy in PolicyKind::ALL {
        assert_eq!(
            totals.get(policy.name()).copied(),
            Some(SHARED_LIMIT),
            "{policy}: {totals:?}"
        );
    }
}

// Expiry -----------------------------------------------------------------------

/// Checks that `key` expires in `expected` ms: PTTL is read after the call
/// returned, so it is at most `expected` and at least `expected` less the
/// whole milliseconds that passed since just before the call.
fn assert_ttl(connection: &mut redis::Connection, key: &str, expected: i64, since: Instant) {
    let ttl: i64 = redis::cmd("PTTL").arg(key).query(connection).unwrap();
    let passed = since.elapsed().as_millis() as i64 + 1;
    assert!(
        ttl <= expected && ttl >= expected - passed,
        "{key}: PTTL {ttl}, expected {expected} (less at most {passed} ms that passed)"
    );
}

/// A policy, its limit and window, the calls as (allow?, now), and the TTL
/// in milliseconds after the last one.
type TtlCase = (PolicyKind, u64, u64, &'static [(bool, u64)], i64);

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn keys_expire_exactly_when_the_state_answers_as_an_empty_one() {
    let url = shared_url();
    let prefix = prefix("ttl");
    let options = RedisOptions::new().prefix(&prefix).time(TimeSource::MILLIS);
    let mut connection = inspect(&url);
    #[rustfmt::skip]
    let cases: [TtlCase; 12] = [
        // TAT − now: one interval after one admission, then the whole
        // window after a burst of L, then TAT 1250 at 600.
        (PolicyKind::Gcra, 4, 1_000, &[(true, 0)], 250),
        (PolicyKind::Gcra, 4, 1_000, &[(true, 0), (true, 0), (true, 0), (true, 0)], 1_000),
        (PolicyKind::Gcra, 4, 1_000, &[(true, 0), (true, 0), (true, 0), (true, 0), (true, 600)], 650),
        (PolicyKind::LeakyBucket, 4, 1_000, &[(true, 0), (true, 0), (true, 300)], 450),
        // newest + W − now.
        (PolicyKind::SlidingWindow, 2, 10_000, &[(true, 0), (true, 4_000)], 10_000),
        // full again at drip d + L − t: 1 × 250 after one token; after
        // three tokens by 100, (0 + 4 − 1) × 250 − 100.
        (PolicyKind::TokenBucket, 4, 1_000, &[(true, 0)], 250),
        (PolicyKind::TokenBucket, 4, 1_000, &[(true, 0), (true, 100), (true, 100)], 650),
        // the window with admissions ends: window 0 at 2500, window 1 at 12000.
        (PolicyKind::FixedWindow, 5, 10_000, &[(true, 0), (true, 2_500)], 7_500),
        (PolicyKind::FixedWindow, 5, 10_000, &[(true, 0), (true, 12_000)], 8_000),
        // two windows after the one with admissions starts.
        (PolicyKind::SlidingWindowCounter, 5, 10_000, &[(true, 0)], 20_000),
        (PolicyKind::SlidingWindowCounter, 5, 10_000, &[(true, 0), (true, 12_000)], 18_000),
        // remaining creates no key for a new client, and then the first
        // allow (at a later time) is the origin.
        (PolicyKind::FixedWindow, 5, 10_000, &[(false, 0), (true, 3_000)], 10_000),
    ];
    for (number, (policy, limit, window, calls, expected)) in cases.into_iter().enumerate() {
        let limiter = RedisLimiter::new(
            &url,
            policy,
            Config::per_ticks(limit, window).unwrap(),
            options.clone(),
        )
        .unwrap();
        let client = format!("case-{number}");
        let key = limiter.key(&client);
        let mut started = Instant::now();
        for &(allow, now) in calls {
            started = Instant::now();
            if allow {
                limiter.try_check_at(&client, now).unwrap();
            } else {
                limiter.try_remaining_at(&client, now).unwrap();
                let exists: bool = redis::cmd("EXISTS")
                    .arg(&key)
                    .query(&mut connection)
                    .unwrap();
                assert!(
                    !exists,
                    "{policy}: remaining stored the state of a new client"
                );
            }
        }
        assert_ttl(&mut connection, &key, expected, started);
    }
    // A rejection writes nothing, so the TTL of the last admission stands.
    let limiter = RedisLimiter::new(
        &url,
        PolicyKind::SlidingWindow,
        Config::per_ticks(1, 10_000).unwrap(),
        options.clone(),
    )
    .unwrap();
    let started = Instant::now();
    assert!(limiter.try_check_at("rejected", 0).unwrap().allowed());
    assert!(!limiter.try_check_at("rejected", 3_000).unwrap().allowed());
    assert_ttl(&mut connection, &limiter.key("rejected"), 10_000, started);
    // The least TTL raises short ones, and makes `remaining` store a new
    // client (so its origin holds).
    let kept = RedisLimiter::new(
        &url,
        PolicyKind::FixedWindow,
        Config::per_ticks(5, 1_000).unwrap(),
        options.clone().min_ttl(Duration::from_secs(60)),
    )
    .unwrap();
    let started = Instant::now();
    assert_eq!(kept.try_remaining_at("kept", 0).unwrap(), 5);
    assert_ttl(&mut connection, &kept.key("kept"), 60_000, started);
    // Ticks of 10 µs: TTLs round up to whole milliseconds.
    let micro = RedisLimiter::new(
        &url,
        PolicyKind::Gcra,
        Config::per_ticks(1, 12_345).unwrap(),
        options.clone().time(TimeSource::Caller {
            tick: Duration::from_micros(10),
        }),
    )
    .unwrap();
    let started = Instant::now();
    micro.try_check_at("micro", 0).unwrap();
    assert_ttl(&mut connection, &micro.key("micro"), 124, started);
    limiter.clear_prefix(&prefix).unwrap();
}

/// A least TTL longer than any a script sets is the longest (2^46 ms),
/// under every policy: the state is kept, so the limit holds. (Passed to
/// Redis as it was, it made PEXPIRE delete the key it had just written, and
/// every call was a new client's.)
#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn a_least_ttl_past_the_longest_is_the_longest() {
    const LONGEST_MS: i64 = 1 << 46;
    let url = shared_url();
    let prefix = prefix("longest_ttl");
    let mut connection = inspect(&url);
    let options = exact_options(&prefix).min_ttl(Duration::MAX);
    for policy in PolicyKind::ALL {
        let limiter = RedisLimiter::new(
            &url,
            policy,
            Config::per_ticks(2, 1_000).unwrap(),
            options.clone(),
        )
        .unwrap();
        let since = Instant::now();
        let admitted: Vec<bool> = (0..3)
            .map(|_| limiter.try_check_at("c", 10).unwrap().allowed())
            .collect();
        assert_eq!(admitted, [true, true, false], "{policy}");
        assert_ttl(&mut connection, &limiter.key("c"), LONGEST_MS, since);
    }
    clear(&url, &prefix);
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn an_idle_client_expires_and_comes_back_as_a_new_one() {
    let url = shared_url();
    let prefix = prefix("expiry");
    // Redis's own clock: a window of 50 ms, in microseconds.
    let limiter = RedisLimiter::new(
        &url,
        PolicyKind::Gcra,
        Config::per_ticks(1, 50_000).unwrap(),
        RedisOptions::new().prefix(&prefix),
    )
    .unwrap();
    let _cleanup = Cleanup {
        limiter: &limiter,
        prefix: prefix.clone(),
    };
    let mut connection = inspect(&url);
    let key = limiter.key("idle");
    assert!(limiter.try_check("idle").unwrap().allowed());
    let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut connection).unwrap();
    assert!((1..=50).contains(&ttl), "PTTL {ttl}");
    // Poll until Redis drops the key; the deadline only turns a hang into a
    // failure.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let exists: bool = redis::cmd("EXISTS")
            .arg(&key)
            .query(&mut connection)
            .unwrap();
        if !exists {
            break;
        }
        assert!(Instant::now() < deadline, "{key} never expired");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(limiter.try_tracked_clients().unwrap(), 0);
    let back = limiter.try_check("idle").unwrap();
    assert_eq!(
        back,
        Decision::admitted(0).with_tick(floodgate::Tick::MICROSECOND)
    );
    assert_eq!(limiter.try_tracked_clients().unwrap(), 1);
}

// Faults --------------------------------------------------------------------------

/// A `redis-server` of the test's own on a free loopback port, stopped
/// (and waited for) when dropped.
struct Server {
    port: u16,
    child: Option<Child>,
}

impl Server {
    /// # Panics
    ///
    /// When `redis-server` cannot be run (it is not on the PATH).
    fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let mut server = Server { port, child: None };
        if let Err(error) = server.spawn() {
            panic!("cannot run redis-server ({error}); install it to run the fault tests");
        }
        server
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        // Wait until it answers; the deadline only turns a hang into a failure.
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = redis::Client::open(self.url()).unwrap();
        loop {
            if let Ok(mut connection) = client.get_connection() {
                if redis::cmd("PING").query::<String>(&mut connection).is_ok() {
                    return Ok(());
                }
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn restart(&mut self) {
        self.stop();
        self.spawn().expect("restart redis-server");
    }

    /// Sends SIGSTOP or SIGCONT: a stopped server accepts nothing and
    /// answers nothing, as a stalled one.
    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A stopped process must be continued before it can exit cleanly.
            self.signal("-CONT");
        }
        self.stop();
    }
}

/// Calls `check` until it succeeds; the deadline only turns a hang into a
/// failure.
fn until_ok<T>(mut check: impl FnMut() -> Result<T, RedisError>) -> T {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match check() {
            Ok(value) => return value,
            Err(error) => assert!(Instant::now() < deadline, "never recovered: {error}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn fault_options(rule: OnFailure) -> RedisOptions {
    RedisOptions::new()
        .prefix("faults")
        .time(TimeSource::MILLIS)
        .timeout(Duration::from_millis(200))
        .on_failure(rule)
        .connections(2)
}

#[test]
#[ignore = "needs redis-server on the PATH: run with --include-ignored"]
fn each_fault_rule_answers_while_redis_is_down_and_traffic_resumes_after_a_restart() {
    let mut server = Server::start();
    let config = Config::per_ticks(2, 1_000).unwrap();
    let limiters: Vec<(OnFailure, RedisLimiter)> =
        [OnFailure::FailClosed, OnFailure::FailOpen, OnFailure::Local]
            .into_iter()
            .map(|rule| {
                let options = fault_options(rule).prefix(format!("faults-{rule:?}"));
                (
                    rule,
                    RedisLimiter::new(&server.url(), PolicyKind::Gcra, config, options).unwrap(),
                )
            })
            .collect();
    for (rule, limiter) in &limiters {
        assert!(limiter.check_at("a", 0).allowed(), "{rule:?}");
        assert_eq!(limiter.faults(), 0);
    }
    server.stop();
    for (rule, limiter) in &limiters {
        assert!(
            matches!(
                limiter.try_check_at("a", 1),
                Err(RedisError::Unavailable(_))
            ),
            "{rule:?}"
        );
        let answers: Vec<Decision> = (0..3).map(|_| limiter.check_at("a", 1)).collect();
        match rule {
            OnFailure::FailClosed => {
                for answer in &answers {
                    assert_eq!(
                        *answer,
                        Decision::rejected(0, 200).with_tick(floodgate::Tick::MILLISECOND)
                    );
                }
                assert_eq!(limiter.remaining_at("a", 1), 0);
            }
            OnFailure::FailOpen => {
                for answer in &answers {
                    assert_eq!(
                        *answer,
                        Decision::admitted(2).with_tick(floodgate::Tick::MILLISECOND)
                    );
                }
                assert_eq!(limiter.remaining_at("a", 1), 2);
            }
            // The local limiter has never seen "a": a burst of 2, then one
            // per 500 ms.
            _ => {
                let allowed: Vec<bool> = answers.iter().map(|d| d.allowed()).collect();
                assert_eq!(allowed, [true, true, false]);
                assert_eq!(answers[2].retry_after_ticks().unwrap_or(u64::MAX), 500);
                assert_eq!(limiter.remaining_at("a", 1), 0);
            }
        }
        assert_eq!(limiter.faults(), 4, "{rule:?}");
    }
    server.restart();
    for (rule, limiter) in &limiters {
        // The restarted server kept nothing: "a" is new again.
        let decision = until_ok(|| limiter.try_check_at("a", 2));
        assert_eq!(
            decision,
            Decision::admitted(1).with_tick(floodgate::Tick::MILLISECOND),
            "{rule:?}"
        );
        assert_eq!(limiter.try_remaining_at("a", 2).unwrap(), 1);
        // Every connection of the pool reconnects, not only the first.
        for _ in 0..4 {
            assert!(limiter.try_remaining_at("a", 2).is_ok());
        }
    }
}

#[test]
#[ignore = "needs redis-server on the PATH: run with --include-ignored"]
fn a_stalled_redis_times_out_and_the_call_is_not_sent_again() {
    let server = Server::start();
    let limiter = RedisLimiter::new(
        &server.url(),
        PolicyKind::FixedWindow,
        Config::per_ticks(5, 1_000).unwrap(),
        fault_options(OnFailure::FailClosed).connections(1),
    )
    .unwrap();
    assert!(limiter.try_check_at("s", 0).unwrap().allowed());
    server.signal("-STOP");
    let result = limiter.try_check_at("s", 0);
    assert!(matches!(result, Err(RedisError::Timeout)), "{result:?}");
    server.signal("-CONT");
    // The timed-out call was in the stopped server's socket and ran when it
    // woke up, exactly once (it was not sent again): 2 of the 5 are used.
    let remaining = until_ok(|| limiter.try_remaining_at("s", 0));
    assert_eq!(remaining, 3);
    for _ in 0..3 {
        assert!(limiter.try_check_at("s", 0).unwrap().allowed());
    }
    assert!(!limiter.try_check_at("s", 0).unwrap().allowed());
}

/// Four checks are in flight on a stopped server, holding every batch's
/// place, when twenty more queue behind them and their callers give up.
/// Those twenty are never sent: once the server wakes, only the four have
/// been counted.
#[test]
#[ignore = "needs redis-server on the PATH: run with --include-ignored"]
fn a_batched_check_whose_caller_gave_up_before_it_was_sent_is_not_sent() {
    let server = Server::start();
    let runtime = two_workers();
    let remaining = runtime.block_on(async {
        let options = fault_options(OnFailure::FailClosed).timeout(Duration::from_secs(1));
        let limiter = AsyncRedisLimiter::new(
            &server.url(),
            PolicyKind::FixedWindow,
            Config::per_ticks(100, 1_000_000).unwrap(),
            options,
        )
        .await
        .unwrap();
        assert!(limiter.try_check_at("s", 0).await.unwrap().allowed());
        server.signal("-STOP");
        // Far apart, so that each goes out alone and takes a place.
        let mut in_flight = Vec::new();
        for _ in 0..4 {
            let limiter = limiter.clone();
            in_flight.push(tokio::spawn(
                async move { limiter.try_check_at("s", 0).await },
            ));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let given_up: Vec<_> = (0..20)
            .map(|_| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    tokio::time::timeout(Duration::from_millis(100), limiter.try_check_at("s", 0))
                        .await
                        .is_err()
                })
            })
            .collect();
        for caller in given_up {
            assert!(
                caller.await.unwrap(),
                "a queued check was answered by a stopped server"
            );
        }
        for check in in_flight {
            let result = check.await.unwrap();
            assert!(matches!(result, Err(RedisError::Timeout)), "{result:?}");
        }
        server.signal("-CONT");
        let mut remaining = limiter.try_remaining_at("s", 0).await;
        for _ in 0..100 {
            if remaining.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            remaining = limiter.try_remaining_at("s", 0).await;
        }
        remaining.unwrap()
    });
    // 1 before the stop and the 4 in flight: none of the 20.
    assert_eq!(remaining, 95);
}

#[test]
#[ignore = "needs redis-server on the PATH: run with --include-ignored"]
fn the_async_limiter_fails_by_its_rule_and_reconnects_on_its_own() {
    let mut server = Server::start();
    let runtime = two_workers();
    runtime.block_on(async {
        let limiter = AsyncRedisLimiter::new(
            &server.url(),
            PolicyKind::SlidingWindow,
            Config::per_ticks(2, 1_000).unwrap(),
            fault_options(OnFailure::FailClosed),
        )
        .await
        .unwrap();
        assert!(limiter.check_at("a", 0).await.allowed());
        server.stop();
        let error = limiter.try_check_at("a", 1).await.unwrap_err();
        assert!(
            matches!(error, RedisError::Unavailable(_) | RedisError::Timeout),
            "{error}"
        );
        assert_eq!(
            limiter.check_at("a", 1).await,
            Decision::rejected(0, 200).with_tick(floodgate::Tick::MILLISECOND)
        );
        assert_eq!(limiter.faults(), 1);
        server.restart();
        let deadline = Instant::now() + Duration::from_secs(15);
        let decision = loop {
            match limiter.try_check_at("a", 2).await {
                Ok(decision) => break decision,
                Err(error) => assert!(Instant::now() < deadline, "never recovered: {error}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(
            decision,
            Decision::admitted(1).with_tick(floodgate::Tick::MILLISECOND)
        );
    });
}

// Redis Cluster ---------------------------------------------------------------------

/// A three-primary Redis Cluster of the test's own on free loopback ports
/// (no replicas, no persistence), in a directory of its own; stopped and
/// removed when dropped. A stopped node that comes back on its port with
/// its `nodes.conf` rejoins with its slots (and no keys).
struct Cluster {
    _turn: std::sync::MutexGuard<'static, ()>,
    dir: std::path::PathBuf,
    ports: Vec<u16>,
    children: Vec<Option<Child>>,
}

/// Held by each cluster test: clusters start one at a time, so that two
/// never race for the same free ports (a node's bus port is its port +
/// 10,000, which nothing reserves while the first is checked).
static CLUSTERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Cluster {
    /// # Panics
    ///
    /// When `redis-server` or `redis-cli` cannot be run, or the cluster
    /// does not form.
    fn start(name: &str) -> Self {
        let turn = CLUSTERS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir =
            std::env::temp_dir().join(format!("floodgate-cluster-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut ports = Vec::new();
        while ports.len() < 3 {
            let port = free_port();
            // The cluster bus listens on the port + 10,000.
            if port < 55_000
                && !ports.contains(&port)
                && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
            {
                ports.push(port);
            }
        }
        let mut cluster = Cluster {
            _turn: turn,
            dir,
            children: ports.iter().map(|_| None).collect(),
            ports,
        };
        for node in 0..3 {
            cluster.spawn(node);
        }
        let nodes: Vec<String> = cluster
            .ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("cannot run redis-cli; install redis-tools to run the cluster tests");
        assert!(status.success(), "redis-cli --cluster create failed");
        cluster.wait_until_ok();
        cluster
    }

    fn url(&self) -> String {
        let nodes: Vec<String> = self
            .ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        format!("redis-cluster://{}", nodes.join(","))
    }

    fn spawn(&mut self, node: usize) {
        let port = self.ports[node].to_string();
        let config = self.dir.join(format!("nodes-{port}.conf"));
        let child = Command::new("redis-server")
            .args(["--port", &port, "--bind", "127.0.0.1"])
            .args(["--cluster-enabled", "yes"])
            .arg("--cluster-config-file")
            .arg(&config)
            .args(["--cluster-node-timeout", "1000"])
            // The other nodes keep serving their slots while one is down.
            .args(["--cluster-require-full-coverage", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .spawn()
            .expect("cannot run redis-server; install it to run the cluster tests");
        self.children[node] = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.query(node, &["PING"]).is_none() {
            assert!(Instant::now() < deadline, "node {port} did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// One node's answer to a command, as text; `None` if it gave none.
    fn query(&self, node: usize, args: &[&str]) -> Option<String> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.ports[node])).ok()?;
        let mut connection = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        let value: redis::Value = command.query(&mut connection).ok()?;
        Some(match value {
            redis::Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            redis::Value::SimpleString(text) => text,
            redis::Value::VerbatimString { text, .. } => text,
            redis::Value::Int(n) => n.to_string(),
            other => format!("{other:?}"),
        })
    }

    /// Waits until every running node sees every slot served; the deadline
    /// only turns a hang into a failure.
    fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = (0..3)
                .filter(|&node| self.children[node].is_some())
                .all(|node| {
                    self.query(node, &["CLUSTER", "INFO"]).is_some_and(|info| {
                        info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
                    })
                });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not converge");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn id(&self, node: usize) -> String {
        self.query(node, &["CLUSTER", "MYID"]).expect("node id")
    }

    fn keys(&self, node: usize) -> u64 {
        self.query(node, &["DBSIZE"]).unwrap().parse().unwrap()
    }

    fn stop(&mut self, node: usize) {
        if let Some(mut child) = self.children[node].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in 0..3 {
            self.stop(node);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// The contract traces and the spec's sessions through a three-node
/// cluster and through one Redis side by side: every answer of each is the
/// in-memory engine's (the same seeded traces as the `differential_*`
/// tests), on both APIs; and `clear_prefix` and `tracked_clients` reach
/// every node.
#[test]
#[ignore = "needs redis-server and redis-cli on the PATH: run with --include-ignored"]
fn through_a_cluster_the_contract_traces_give_one_redis_answers() {
    let cluster = Cluster::start("differential");
    let single = Server::start();
    let url = cluster.url();
    spec_examples(&url);
    for policy in PolicyKind::ALL {
        differential_through(&[&url, &single.url()], policy, 60);
    }
    // Keys of many clients land on every node, and are all found again.
    let prefix = prefix("cluster_keys");
    let limiter = RedisLimiter::new(
        &url,
        PolicyKind::FixedWindow,
        Config::per_ticks(5, 1_000).unwrap(),
        exact_options(&prefix),
    )
    .unwrap();
    for id in 0..300 {
        assert!(limiter
            .try_check_at(&format!("k{id}"), 0)
            .unwrap()
            .allowed());
    }
    assert_eq!(limiter.try_tracked_clients().unwrap(), 300);
    assert!(
        (0..3).all(|node| cluster.keys(node) > 50),
        "keys on every node"
    );
    assert_eq!(limiter.clear_prefix(&prefix).unwrap(), 300);
    assert_eq!(limiter.try_tracked_clients().unwrap(), 0);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut rng = fastrand::Rng::with_seed(0xC1);
        for policy in PolicyKind::ALL {
            for number in 0..10 {
                let trace = trace(policy, &mut rng);
                let config = Config::per_ticks(trace.limit, trace.window).unwrap();
                let memory = in_memory(policy, config);
                let redis = AsyncRedisLimiter::new(&url, policy, config, exact_options(&prefix))
                    .await
                    .unwrap();
                for (index, &(allow, client, now)) in trace.calls.iter().enumerate() {
                    let key = format!("{policy}-{number}-{client}");
                    let cost = trace.costs[index];
                    if allow {
                        assert_eq!(
                            redis.try_check_n_at(&key, now, cost).await.unwrap(),
                            memory.check_n_at(&key, now, cost),
                            "{policy} {key} at {now} cost {cost}"
                        );
                    } else {
                        assert_eq!(
                            redis.try_remaining_at(&key, now).await.unwrap(),
                            memory.remaining_at(&key, now),
                            "{policy} {key} at {now}"
                        );
                    }
                }
            }
        }
    });
    limiter.clear_prefix(&prefix).unwrap();
}

/// Several rules through a three-node cluster and one Redis side by side:
/// each client's keys (one per rule) share one slot, so every decision is
/// still one script call, and every answer is the mutex engine's.
#[test]
#[ignore = "needs redis-server and redis-cli on the PATH: run with --include-ignored"]
fn through_a_cluster_several_rules_keep_a_client_in_one_slot() {
    let cluster = Cluster::start("rules");
    let single = Server::start();
    let url = cluster.url();
    let prefix = prefix("cluster_rules");
    let rules: RuleSet = "gcra:5/1s,sliding-window:7/10s,fixed-window:20/1m"
        .parse()
        .unwrap();
    let limiter = RedisLimiter::with_rules(&url, &rules, exact_options(&prefix)).unwrap();
    for id in 0..200 {
        let client = format!("k{id}");
        assert!(limiter.try_check_at(&client, 0).unwrap().allowed());
        let slots: Vec<String> = limiter
            .keys(&client)
            .iter()
            .map(|key| cluster.query(0, &["CLUSTER", "KEYSLOT", key]).unwrap())
            .collect();
        assert_eq!(slots.len(), 3);
        assert!(
            slots.iter().all(|slot| *slot == slots[0]),
            "{client}: {slots:?}"
        );
    }
    assert_eq!(limiter.try_tracked_clients().unwrap(), 200);
    assert!(
        (0..3).all(|node| cluster.keys(node) > 50 * 3),
        "keys on every node"
    );
    assert_eq!(limiter.clear_prefix(&prefix).unwrap(), 600);
    rules_differential_through(&[&url, &single.url()], 0x000C_15E7, 60);
}

/// Slots move from one node to another (`redis-cli --cluster reshard`)
/// while four threads check 600 clients: the client follows `MOVED` and
/// `ASK`, no call fails, and afterwards every client's count in Redis is
/// exactly the admissions its callers saw: nothing lost, nothing counted
/// twice.
#[test]
#[ignore = "needs redis-server and redis-cli on the PATH: run with --include-ignored"]
fn a_slot_migration_under_traffic_loses_nothing_and_counts_nothing_twice() {
    let cluster = Cluster::start("reshard");
    let url = cluster.url();
    let prefix = prefix("reshard");
    const LIMIT: u64 = 1_000_000;
    const CLIENTS: usize = 600;
    let limiter = RedisLimiter::new(
        &url,
        PolicyKind::FixedWindow,
        Config::per_ticks(LIMIT, 1 << 40).unwrap(),
        exact_options(&prefix).connections(4),
    )
    .unwrap();
    let keys_before = cluster.keys(1);
    let done = std::sync::atomic::AtomicBool::new(false);
    let counts: Vec<std::sync::atomic::AtomicU64> = (0..CLIENTS)
        .map(|_| std::sync::atomic::AtomicU64::new(0))
        .collect();
    let (from, to) = (cluster.id(0), cluster.id(1));
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..4)
            .map(|thread| {
                let (limiter, done, counts) = (&limiter, &done, &counts);
                scope.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(thread);
                    let mut calls = 0u64;
                    // At least a pass over every client, and on until the
                    // reshard is over.
                    while calls < CLIENTS as u64 || !done.load(std::sync::atomic::Ordering::SeqCst)
                    {
                        let client = rng.usize(..CLIENTS);
                        let decision = limiter
                            .try_check_at(&format!("c{client}"), 0)
                            .unwrap_or_else(|e| panic!("a call failed during the reshard: {e}"));
                        assert!(decision.allowed());
                        counts[client].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        calls += 1;
                    }
                    calls
                })
            })
            .collect();
        let status = Command::new("redis-cli")
            .args([
                "--cluster",
                "reshard",
                &format!("127.0.0.1:{}", cluster.ports[0]),
            ])
            .args(["--cluster-from", &from, "--cluster-to", &to])
            .args(["--cluster-slots", "2000", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("run redis-cli --cluster reshard");
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(status.success(), "the reshard failed");
        let calls: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        eprintln!("{calls} decisions during the reshard");
    });
    cluster.wait_until_ok();
    assert!(
        cluster.keys(1) > keys_before,
        "no key moved to the new node"
    );
    for (client, count) in counts.iter().enumerate() {
        let count = count.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            limiter.try_remaining_at(&format!("c{client}"), 0).unwrap(),
            LIMIT - count,
            "client c{client}, admitted {count} times"
        );
    }
    limiter.clear_prefix(&prefix).unwrap();
}

/// A node is killed: calls for the clients it served fail, and the fault
/// rule answers them; the other nodes' clients are served as before. When
/// the node returns, traffic to its clients resumes without rebuilding the
/// limiter, on both APIs.
#[test]
#[ignore = "needs redis-server and redis-cli on the PATH: run with --include-ignored"]
fn a_killed_cluster_node_fails_by_the_rule_and_traffic_resumes() {
    let mut cluster = Cluster::start("faults");
    let url = cluster.url();
    let config = Config::per_ticks(1_000, 1_000).unwrap();
    let limiter = RedisLimiter::new(
        &url,
        PolicyKind::Gcra,
        config,
        fault_options(OnFailure::FailClosed),
    )
    .unwrap();
    let runtime = two_workers();
    let async_limiter = runtime.block_on(async {
        AsyncRedisLimiter::new(
            &url,
            PolicyKind::Gcra,
            config,
            fault_options(OnFailure::FailClosed).prefix("faults-async"),
        )
        .await
        .unwrap()
    });
    let clients: Vec<String> = (0..30).map(|id| format!("n{id}")).collect();
    for client in &clients {
        assert!(limiter.try_check_at(client, 0).unwrap().allowed());
        assert!(runtime
            .block_on(async_limiter.try_check_at(client, 0))
            .unwrap()
            .allowed());
    }
    cluster.stop(2);
    let mut lost = Vec::new();
    for client in &clients {
        match limiter.try_check_at(client, 1) {
            Ok(decision) => assert!(decision.allowed()),
            Err(error) => {
                assert!(
                    matches!(error, RedisError::Unavailable(_) | RedisError::Timeout),
                    "{error}"
                );
                lost.push(client.clone());
            }
        }
    }
    assert!(!lost.is_empty() && lost.len() < clients.len(), "{lost:?}");
    let faults = limiter.faults();
    let decision = limiter.check_at(&lost[0], 1);
    assert_eq!(
        (
            decision.allowed(),
            decision.retry_after_ticks().unwrap_or(u64::MAX),
            limiter.faults()
        ),
        (false, 200, faults + 1),
        "the fault rule answers"
    );
    let async_decision = runtime.block_on(async_limiter.check_at(&lost[0], 1));
    assert_eq!(
        (async_decision.allowed(), async_limiter.faults()),
        (false, 1)
    );

    cluster.spawn(2);
    cluster.wait_until_ok();
    for client in &lost {
        // The node came back empty: its clients are new again.
        let decision = until_ok(|| limiter.try_check_at(client, 2));
        assert_eq!(
            (decision.allowed(), decision.remaining()),
            (true, 999),
            "{client}"
        );
    }
    runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match async_limiter.try_check_at(&lost[0], 2).await {
                Ok(decision) => {
                    assert!(decision.allowed());
                    break;
                }
                Err(error) => assert!(Instant::now() < deadline, "never recovered: {error}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

// The store's own statistics ----------------------------------------------------

/// With nothing listening, every check is a failed round trip answered by
/// the fault rule, and each is counted: calls, errors, faults.
#[test]
fn an_unreachable_server_is_counted_call_by_call() {
    let limiter = RedisLimiter::new(
        "redis://127.0.0.1:1",
        PolicyKind::Gcra,
        Config::per_ticks(1, 1_000).unwrap(),
        RedisOptions::new()
            .time(TimeSource::MILLIS)
            .timeout(Duration::from_millis(200)),
    )
    .unwrap();
    for now in 0..3 {
        assert!(!limiter.check_at("a", now).allowed());
    }
    let stats = limiter.redis_stats();
    assert_eq!(
        (stats.calls, stats.errors, stats.faults),
        (3, 3, 3),
        "{stats:?}"
    );
    assert_eq!(
        stats.latency_buckets.len(),
        floodgate::redis::LATENCY_BUCKETS.len()
    );
    // Cumulative buckets never fall, and never pass the calls.
    assert!(stats
        .latency_buckets
        .windows(2)
        .all(|pair| pair[0].1 <= pair[1].1));
    assert!(stats.latency_buckets.last().unwrap().1 <= stats.latency_count);
    assert_eq!(stats.latency_count, stats.calls);
    // The fault rule's answers are decisions too.
    let decided = limiter.stats().unwrap();
    assert_eq!((decided.admitted, decided.rejected), (0, 3));
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn the_store_counts_its_round_trips_and_the_caches_answers() {
    let url = shared_url();
    let prefix = prefix("stats");
    let limiter = RedisLimiter::new(
        &url,
        PolicyKind::FixedWindow,
        Config::per_ticks(2, 1_000).unwrap(),
        RedisOptions::new()
            .prefix(&prefix)
            .time(TimeSource::MILLIS)
            .timeout(Duration::from_secs(5)),
    )
    .unwrap();
    limiter.clear_prefix(&prefix).unwrap();
    let before = limiter.redis_stats();
    let answers: Vec<bool> = (0..5)
        .map(|_| limiter.check_at("a", 10).allowed())
        .collect();
    assert_eq!(answers, [true, true, false, false, false]);
    let stats = limiter.redis_stats();
    // Two admissions and one rejection from Redis; the rejection cache
    // answers the other two.
    assert_eq!(stats.calls - before.calls, 3, "{stats:?}");
    assert_eq!(stats.answered_locally - before.answered_locally, 2);
    assert_eq!((stats.errors, stats.faults), (0, 0));
    assert_eq!(stats.latency_count, stats.calls);
    assert!(stats.latency_sum > Duration::ZERO);
    // Every answer is counted, Redis's and the cache's alike.
    let decided = limiter.stats().unwrap();
    assert_eq!((decided.admitted, decided.rejected), (2, 3), "{decided:?}");
    limiter.clear_prefix(&prefix).unwrap();
}
