//! The spec's two example sessions and seeded random traces, each policy
//! against the in-memory engine, with times that step back too, and the async
//! API against the blocking one.

use super::batches::clear;
use super::faults::Server;
use super::*;

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn the_spec_example_sessions_replay_exactly() {
    spec_examples(&shared_url());
}

/// The spec's two example sessions through the Redis (or cluster) at `url`.
pub(super) fn spec_examples(url: &str) {
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
pub(super) struct Trace {
    pub(super) limit: u64,
    pub(super) window: u64,
    pub(super) calls: Vec<(bool, usize, u64)>,
    pub(super) costs: Vec<u64>,
    pub(super) refunds: Vec<Option<u64>>,
}

pub(super) fn trace(policy: PolicyKind, rng: &mut fastrand::Rng) -> Trace {
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
pub(super) fn differential(policy: PolicyKind, traces: usize) {
    let own = own_server_for(policy);
    let url = own.as_ref().map_or_else(shared_url, Server::url);
    differential_through(&[&url], policy, traces);
}

/// A server of the test's own for the sliding log's traces, `None` for the
/// other policies (they use the shared one). A log of a million entries is
/// written by one script call, which on a busy machine can run past
/// Redis's busy threshold (5 s); while it runs, Redis answers `BUSY` to
/// every other client, so on the shared server the tests running beside it
/// would fail for want of an answer.
fn own_server_for(policy: PolicyKind) -> Option<Server> {
    (policy == PolicyKind::SlidingWindow).then(Server::start)
}

/// [`differential`] through each Redis (or cluster) of `urls` at once:
/// every call goes to each of them and to the in-memory engine, and every
/// answer must be the engine's, so the backends agree with each other too.
pub(super) fn differential_through(urls: &[&str], policy: PolicyKind, traces: usize) {
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
pub(super) fn log_call(
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
pub(super) fn backwards_trace(policy: PolicyKind, rng: &mut fastrand::Rng) -> Trace {
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
pub(super) fn time_backwards(policy: PolicyKind, traces: usize) {
    let test = format!("time_backwards_{}", policy.name());
    let own = own_server_for(policy);
    let url = own.as_ref().map_or_else(shared_url, Server::url);
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
                if let (Some(decision), _) = run(&redis, call)
                    && decision.allowed()
                {
                    clients[client] = Some((origin, now));
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
            let own = own_server_for(policy);
            let url = own.as_ref().map_or_else(|| url.clone(), Server::url);
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
