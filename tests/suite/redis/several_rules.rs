//! Several rules on one client: the mutex engine's answers, the refusing
//! rule, the rejection cache and batches.

use super::batches::{forced_batches, two_workers};
use super::cache::cached_options;
use super::faults::Server;
use super::peek::exists;
use super::*;

/// A trace for a limiter of several rules: 2 or 3 rules of any policies,
/// with small limits and windows of different lengths so that each of them
/// gets to refuse, and costs up to past the largest limit.
pub(super) struct RulesTrace {
    pub(super) rules: RuleSet,
    /// `(call, client, now)`: 0 allow, 1 remaining, 2 peek, 3 refund.
    pub(super) calls: Vec<(u8, usize, u64)>,
    pub(super) costs: Vec<u64>,
    /// A refund's admission, that many ticks before its `now`.
    pub(super) agos: Vec<u64>,
}

pub(super) fn rules_trace(rng: &mut fastrand::Rng) -> RulesTrace {
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
pub(super) fn in_memory_rules(rules: &RuleSet) -> Arc<dyn RateLimiter<str>> {
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
pub(super) fn rules_differential_through(urls: &[&str], seed: u64, traces: usize) {
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
