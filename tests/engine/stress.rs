//! Many threads, one limiter: the totals stay exact under contention.
//!
//! The loom models (`loom-tests/`) prove the CAS protocols on two or three
//! threads with tiny limits; these tests run the real engines — the real
//! `scc` map, the real atomics, both engines — with eight threads and
//! hundreds of requests, and check answers that leave no room for luck: at a
//! frozen instant each client admits exactly `min(L, calls)` (requests of
//! random costs exactly `L` units, each whole or not at all) — also while
//! sweeps remove idle clients under the threads' feet, and while a flood of
//! new clients meets the cap — and on a moving clock no span of `W` holds
//! more than `L` sliding-window admissions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Barrier;
use std::thread;

use floodgate::policy::{
    FixedWindow, Gcra, LeakyBucket, Policy, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use floodgate::{
    build_bounded, build_with, Bounds, Config, Decision, Engine, Limiter, ManualClock,
    MutexLimiter, Overflow, PolicyKind, RateLimiter,
};

/// More threads than the machine has cores, so the scheduler interleaves
/// them as well as the hardware does.
const THREADS: usize = 8;

const ENGINES: [Engine; 2] = [Engine::LockFree, Engine::Mutex];

/// A limiter with `limit` per `window` ticks on a clock frozen at `now`.
fn frozen(
    policy: PolicyKind,
    engine: Engine,
    limit: u64,
    window: u64,
    now: u64,
) -> Arc<dyn RateLimiter<u64>> {
    let config = Config::per_ticks(limit, window).expect("a valid config");
    build_with(policy, config, engine, ManualClock::new(now)).expect("a valid config")
}

/// Runs `work(thread index)` on [`THREADS`] threads released together by a
/// barrier, and returns what each returned.
fn hammer<T: Send>(work: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let start = Barrier::new(THREADS);
    thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|me| {
                let (start, work) = (&start, &work);
                scope.spawn(move || {
                    start.wait();
                    work(me)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("a hammering thread panicked"))
            .collect()
    })
}

/// The window of a test at a frozen instant: long enough that nothing drips
/// or expires, and at least `limit` for the drip policies.
const LONG_WINDOW: u64 = 1 << 40;

/// One hot client, hammered by every thread at one instant: exactly `L` of
/// the `THREADS × CALLS` requests are admitted, and the admitted decisions
/// are the `L` sequential ones — remaining `L − 1` down to 0 once each (and
/// for leaky-bucket the delays `0, I, …, (L − 1)·I`), which is what no
/// lost or doubled update can produce.
#[test]
fn one_hot_client_admits_exactly_the_limit() {
    const LIMIT: u64 = 2_000;
    const CALLS: usize = 500; // per thread: 4,000 in all
    for engine in ENGINES {
        for policy in PolicyKind::ALL {
            let limiter = frozen(policy, engine, LIMIT, LONG_WINDOW, 1_000);
            let admitted: Vec<Decision> = hammer(|_| {
                (0..CALLS)
                    .map(|_| limiter.check(&42))
                    .filter(|decision| {
                        if !decision.allowed() {
                            assert!(
                                decision.retry_after_ticks().unwrap_or(u64::MAX) > 0,
                                "{decision:?}"
                            );
                            assert_eq!(decision.remaining(), 0, "{decision:?}");
                        }
                        decision.allowed()
                    })
                    .collect::<Vec<_>>()
            })
            .into_iter()
            .flatten()
            .collect();
            let context = format!("{policy} on {engine}");
            assert_eq!(admitted.len() as u64, LIMIT, "{context}");
            assert_eq!(limiter.remaining(&42), 0, "{context}");
            assert!(!limiter.allow(&42), "{context}");

            let mut remaining: Vec<u64> = admitted.iter().map(|d| d.remaining()).collect();
            remaining.sort_unstable();
            assert_eq!(remaining, (0..LIMIT).collect::<Vec<_>>(), "{context}");
            let mut delays: Vec<u64> = admitted.iter().map(|d| d.delay_ticks()).collect();
            delays.sort_unstable();
            let expected: Vec<u64> = if policy == PolicyKind::LeakyBucket {
                let interval = LONG_WINDOW / LIMIT;
                (0..LIMIT).map(|k| k * interval).collect()
            } else {
                vec![0; LIMIT as usize]
            };
            assert_eq!(delays, expected, "{context}");
        }
    }
}

/// One hot client at one instant, every thread making requests of random
/// costs (1 to 7, seeded per thread), then requests of cost 1 until one is
/// refused: the admitted units total exactly `L` (the last refusal saw
/// nothing left, and nothing comes back at a frozen instant), every refused
/// request cost more than what was left when the threads were done, and the
/// admissions chain like sequential ones — sorted by `remaining`, each one's
/// `remaining + cost` is the previous one's `remaining`, from `L` down — so
/// no request was admitted in parts or counted against a stale state. For
/// leaky-bucket each admission's delay is that of its first unit.
#[test]
fn weighted_requests_on_one_hot_client_admit_exactly_the_limit() {
    const LIMIT: u64 = 2_048; // divides LONG_WINDOW: I is exact
    const CALLS: usize = 300; // per thread, before the cost-1 tail
    for engine in ENGINES {
        for policy in PolicyKind::ALL {
            let limiter = frozen(policy, engine, LIMIT, LONG_WINDOW, 1_000);
            let calls: Vec<Vec<(u64, Decision)>> = hammer(|me| {
                let mut rng = fastrand::Rng::with_seed(me as u64);
                let mut made: Vec<(u64, Decision)> = (0..CALLS)
                    .map(|_| {
                        let cost = rng.u64(1..=7);
                        (cost, limiter.check_n(&42, cost))
                    })
                    .collect();
                loop {
                    let decision = limiter.check_n(&42, 1);
                    made.push((1, decision));
                    if !decision.allowed() {
                        break made;
                    }
                }
            });
            let context = format!("{policy} on {engine}");
            let calls: Vec<(u64, Decision)> = calls.into_iter().flatten().collect();
            let units: u64 = calls
                .iter()
                .filter(|(_, d)| d.allowed())
                .map(|(cost, _)| cost)
                .sum();
            assert_eq!(units, LIMIT, "{context}");
            assert_eq!(limiter.remaining(&42), 0, "{context}");
            for (cost, decision) in calls.iter().filter(|(_, d)| !d.allowed()) {
                assert!(
                    decision.remaining() < *cost,
                    "{context}: {cost} {decision:?}"
                );
                assert!(
                    decision.retry_after_ticks().unwrap_or(u64::MAX) > 0,
                    "{context}: {decision:?}"
                );
            }
            let mut admitted: Vec<(u64, Decision)> =
                calls.into_iter().filter(|(_, d)| d.allowed()).collect();
            admitted.sort_unstable_by_key(|(_, d)| std::cmp::Reverse(d.remaining()));
            let mut left = LIMIT;
            for (cost, decision) in admitted {
                assert_eq!(decision.remaining() + cost, left, "{context}: {decision:?}");
                let delay = if policy == PolicyKind::LeakyBucket {
                    (LIMIT - left) * (LONG_WINDOW / LIMIT)
                } else {
                    0
                };
                assert_eq!(decision.delay_ticks(), delay, "{context}: {decision:?}");
                left = decision.remaining();
            }
            assert_eq!(left, 0, "{context}");
        }
    }
}

/// Many clients, every thread visiting all of them from a different
/// starting point, so most clients are first touched by several threads at
/// once: each client ends with exactly `min(L, calls)` admissions — whether
/// the limit is reached (`L = 5`) or not (`L = 20`) — and exactly one state.
#[test]
fn many_clients_each_admit_exactly_min_of_limit_and_calls() {
    const CLIENTS: u64 = 64;
    const PASSES: usize = 2; // calls per client: THREADS × PASSES = 16
    for engine in ENGINES {
        for policy in PolicyKind::ALL {
            for limit in [5, 20] {
                let limiter = frozen(policy, engine, limit, LONG_WINDOW, 7);
                let per_thread: Vec<Vec<u64>> = hammer(|me| {
                    let mut admitted = vec![0u64; CLIENTS as usize];
                    for _ in 0..PASSES {
                        for k in 0..CLIENTS {
                            let client = (k + me as u64 * 8) % CLIENTS;
                            if limiter.allow(&client) {
                                admitted[client as usize] += 1;
                            }
                        }
                    }
                    admitted
                });
                let calls = (THREADS * PASSES) as u64;
                for client in 0..CLIENTS {
                    let total: u64 = per_thread
                        .iter()
                        .map(|counts| counts[client as usize])
                        .sum();
                    assert_eq!(
                        total,
                        limit.min(calls),
                        "{policy} on {engine}, L = {limit}, client {client}"
                    );
                    assert_eq!(
                        limiter.remaining(&client),
                        limit.saturating_sub(calls),
                        "{policy} on {engine}, L = {limit}, client {client}"
                    );
                }
                assert_eq!(
                    limiter.tracked_clients() as u64,
                    CLIENTS,
                    "{policy} on {engine}"
                );
            }
        }
    }
}

/// The hot-client test above would pass with threads that never overlap.
/// This one shows that they do overlap on one state word: at a frozen
/// instant a gcra admission's `remaining` is its exact position in the
/// sequence of admissions, so a thread whose consecutive admissions are more
/// than one position apart had another thread's admission land between its
/// own — the interleaving the CAS loop exists to resolve. (No counter of
/// failed CASes is kept on the hot path to count collisions directly.) The
/// scheduler decides whether a round interleaves, so rounds are repeated
/// until one does; with 8 threads on a shared word each round almost always
/// does on an idle machine, and the bound only keeps a pathological
/// scheduler from looping (20 rounds once all failed to interleave while a
/// build shared the two cores; rounds that interleave end the loop early).
#[test]
fn threads_really_interleave_on_one_client() {
    const LIMIT: u64 = 20_000;
    for engine in ENGINES {
        let interleaved = (0..200).any(|_| {
            let limiter = frozen(PolicyKind::Gcra, engine, LIMIT, LONG_WINDOW, 0);
            let positions: Vec<Vec<u64>> = hammer(|_| {
                (0..LIMIT as usize / THREADS)
                    .map(|_| limiter.check(&1))
                    .filter(|d| d.allowed())
                    .map(|d| d.remaining())
                    .collect()
            });
            positions
                .iter()
                .any(|mine| mine.windows(2).any(|pair| pair[0] - pair[1] > 1))
        });
        assert!(
            interleaved,
            "on {engine}, no two threads' admissions ever interleaved"
        );
    }
}

/// One admission on a moving clock: the time the caller passed, and an upper
/// bound on the time the admission counts at.
#[derive(Clone, Copy, Debug)]
struct Admission {
    passed: u64,
    latest: u64,
}

/// Threads take their times from one shared counter, so they race as on a
/// real clock: a thread preempted between taking its time and calling
/// presents a time older than calls already made. The contract then judges
/// it at the latest time the client reflects, so an admission counts at
/// some time between the time it passed and the last time any thread had
/// taken when it returned (`latest`). "Never more than `L` admitted in any
/// span of `W`" is checked on those intervals: `L + 1` admissions whose
/// intervals all lie within less than `W` of each other would be a certain
/// violation, whatever their exact times.
#[test]
fn a_moving_clock_never_admits_more_than_l_in_any_window() {
    const LIMIT: u64 = 40;
    const WINDOW: u64 = 1_000;
    const CALLS: usize = 10_000; // per thread: 80 windows' worth of ticks in all
    for engine in ENGINES {
        let config = Config::per_ticks(LIMIT, WINDOW).expect("a valid config");
        let limiter = build_with::<u64, _>(
            PolicyKind::SlidingWindow,
            config,
            engine,
            ManualClock::new(0),
        )
        .expect("a valid config");
        let ticks = AtomicU64::new(0);
        let mut admissions: Vec<Admission> = hammer(|_| {
            let mut mine = Vec::new();
            for _ in 0..CALLS {
                // Relaxed: the counter orders nothing but itself; its
                // modification order alone makes the times unique.
                let passed = ticks.fetch_add(1, Ordering::Relaxed);
                if limiter.check_at(&9, passed).allowed() {
                    let latest = ticks.load(Ordering::Relaxed).saturating_sub(1);
                    mine.push(Admission { passed, latest });
                }
            }
            mine
        })
        .into_iter()
        .flatten()
        .collect();

        // The limit binds: every window of the run had demand.
        let windows = THREADS as u64 * CALLS as u64 / WINDOW;
        assert!(admissions.len() as u64 >= LIMIT * (windows - 1), "{engine}");

        admissions.sort_unstable_by_key(|a| a.passed);
        for (i, first) in admissions.iter().enumerate() {
            let crowded: Vec<&Admission> = admissions[i..]
                .iter()
                .take_while(|a| a.passed < first.passed + WINDOW)
                .filter(|a| a.latest < first.passed + WINDOW)
                .collect();
            assert!(
                crowded.len() as u64 <= LIMIT,
                "on {engine}, {} admissions within less than {WINDOW} ticks of {}: {crowded:?}",
                crowded.len(),
                first.passed
            );
        }
    }
}

/// Sweeps racing checks: phases at frozen instants two windows apart (so at
/// the start of each every client is idle, for every policy), threads
/// hammering the same clients while another thread sweeps over and over at
/// the phase's instant. A sweep may remove a client only while it is idle —
/// before its first admission of the phase — and whether it was removed or
/// not, it has all `L` again; so each phase admits exactly `min(L, calls)`
/// per client. An admission lost in a removed state, or a client removed
/// while busy, would admit more.
#[test]
fn sweeps_under_traffic_keep_every_total_exact() {
    const CLIENTS: u64 = 16;
    const LIMIT: u64 = 5;
    const WINDOW: u64 = 1_000;
    const PHASES: u64 = 6;
    const PASSES: usize = 3; // calls per client and phase: (THREADS − 1) × 3
    for engine in ENGINES {
        for policy in PolicyKind::ALL {
            let clock = ManualClock::new(0);
            let config = Config::per_ticks(LIMIT, WINDOW).expect("a valid config");
            let bounds = Bounds::new().evict_idle();
            let limiter = build_bounded::<u64, _>(policy, config, engine, clock.clone(), bounds)
                .expect("a valid config");
            let mut removed = 0;
            for phase in 0..PHASES {
                let now = phase * 2 * WINDOW;
                let swept = AtomicU64::new(0);
                let per_thread: Vec<Vec<u64>> = hammer(|me| {
                    let mut admitted = vec![0u64; CLIENTS as usize];
                    if me == 0 {
                        for _ in 0..200 {
                            let n = limiter.sweep_at(now) as u64;
                            swept.fetch_add(n, Ordering::Relaxed);
                        }
                        return admitted;
                    }
                    for _ in 0..PASSES {
                        for k in 0..CLIENTS {
                            let client = (k + me as u64 * 5) % CLIENTS;
                            if limiter.check_at(&client, now).allowed() {
                                admitted[client as usize] += 1;
                            }
                        }
                    }
                    admitted
                });
                let calls = ((THREADS - 1) * PASSES) as u64;
                for client in 0..CLIENTS {
                    let total: u64 = per_thread.iter().map(|c| c[client as usize]).sum();
                    let context = format!("{policy} on {engine}, phase {phase}, client {client}");
                    assert_eq!(total, LIMIT.min(calls), "{context}");
                    assert_eq!(limiter.remaining_at(&client, now), 0, "{context}");
                }
                assert_eq!(
                    limiter.tracked_clients() as u64,
                    CLIENTS,
                    "{policy} on {engine}"
                );
                removed += swept.load(Ordering::Relaxed);
            }
            // Whether a racing sweep caught a client while idle is up to
            // the scheduler (the loom models cover each order); what is
            // certain is that two windows after the last phase everyone is
            // idle and one sweep removes them all.
            eprintln!("{policy} on {engine}: {removed} removed by racing sweeps");
            let later = PHASES * 2 * WINDOW;
            assert_eq!(
                limiter.sweep_at(later) as u64,
                CLIENTS,
                "{policy} on {engine}"
            );
            assert_eq!(limiter.tracked_clients(), 0, "{policy} on {engine}");
        }
    }
}

/// A flood of new clients from every thread against a cap, at a frozen
/// instant (so nobody is ever idle): exactly `cap` of them are tracked and
/// admitted, every other one is refused by the fail-closed rule, and a
/// watcher never sees the map above the cap.
///
/// The watcher counts the map (`stored_clients`: slots as inserts claim
/// and removals empty them), not the places reserved under the cap
/// (`tracked_clients`), which the reservation cannot push past the cap even
/// when the map does pass it. So it holds the engines' concrete types.
#[test]
fn a_concurrent_flood_tracks_exactly_the_cap() {
    for policy in PolicyKind::ALL {
        let config = Config::per_ticks(3, LONG_WINDOW).expect("a valid config");
        match policy {
            PolicyKind::SlidingWindow => flood_lock_free::<SlidingWindow>(config),
            PolicyKind::TokenBucket => flood_lock_free::<TokenBucket>(config),
            PolicyKind::FixedWindow => flood_lock_free::<FixedWindow>(config),
            PolicyKind::SlidingWindowCounter => flood_lock_free::<SlidingWindowCounter>(config),
            PolicyKind::Gcra => flood_lock_free::<Gcra>(config),
            PolicyKind::LeakyBucket => flood_lock_free::<LeakyBucket>(config),
            PolicyKind::InFlight => unreachable!("not a rate policy (PolicyKind::ALL)"),
        }
        let limiter: MutexLimiter<u64, _> =
            MutexLimiter::with_bounds(policy, config, ManualClock::new(50), flood_bounds())
                .expect("a valid config");
        flood(
            &limiter,
            MutexLimiter::stored_clients,
            policy,
            Engine::Mutex,
        );
    }
}

const FLOOD_CAP: usize = 5_000;

fn flood_bounds() -> Bounds {
    Bounds::new()
        .evict_idle()
        .max_clients(FLOOD_CAP)
        .on_overflow(Overflow::Reject)
}

fn flood_lock_free<P: Policy>(config: Config) {
    let policy = P::new(config).expect("a valid config");
    let limiter: Limiter<u64, P, _> =
        Limiter::with_bounds(policy, ManualClock::new(50), flood_bounds()).unwrap();
    flood(&limiter, Limiter::stored_clients, P::KIND, Engine::LockFree);
}

/// The flood on one limiter; `stored(limiter)` counts its map.
fn flood<L: RateLimiter<u64>>(
    limiter: &L,
    stored: impl Fn(&L) -> usize + Sync,
    policy: PolicyKind,
    engine: Engine,
) {
    const PER_THREAD: u64 = 2_000; // 7 × 2,000 = 14,000 new clients
    let config = limiter.config();
    let flooding = AtomicU64::new(THREADS as u64 - 1);
    let admitted: u64 = hammer(|me| {
        if me == 0 {
            let mut peak = 0;
            // Acquire pairs with each flooder's Release: once the count is
            // 0, the last look below sees every insert of the flood.
            while flooding.load(Ordering::Acquire) > 0 {
                peak = peak.max(stored(limiter));
                thread::yield_now();
            }
            peak = peak.max(stored(limiter));
            assert!(
                peak <= FLOOD_CAP,
                "{policy} on {engine}: {peak} clients in the map"
            );
            return 0;
        }
        let mut admitted = 0;
        for k in 0..PER_THREAD {
            let stranger = me as u64 * 1_000_000 + k;
            let decision = limiter.check(&stranger);
            if decision.allowed() {
                admitted += 1;
            } else {
                assert_eq!(
                    decision.retry_after_ticks().unwrap_or(u64::MAX),
                    config.window()
                        * if policy == PolicyKind::SlidingWindowCounter {
                            2
                        } else {
                            1
                        },
                    "{policy} on {engine}"
                );
            }
        }
        flooding.fetch_sub(1, Ordering::Release);
        admitted
    })
    .into_iter()
    .sum();
    assert_eq!(admitted, FLOOD_CAP as u64, "{policy} on {engine}");
    assert_eq!(limiter.tracked_clients(), FLOOD_CAP, "{policy} on {engine}");
    assert_eq!(stored(limiter), FLOOD_CAP, "{policy} on {engine}");
}

/// The lock-free store grows its table from 64 slots to 32,768 while four
/// threads check and create clients in it, at a frozen instant: every move
/// of a client into a larger table races checks of that client and inserts
/// of others. Each of 20,000 clients gets 12 calls of which exactly `L = 5`
/// are admitted, whichever table each landed in: nothing lost or counted
/// twice by a move, and every client found afterwards.
#[test]
fn a_growing_table_keeps_every_total_exact() {
    const CLIENTS: u64 = 20_000;
    const GROWERS: u64 = 4;
    const PASSES: u64 = 3;
    const LIMIT: u64 = 5;
    for policy in PolicyKind::ALL {
        let limiter = frozen(policy, Engine::LockFree, LIMIT, LONG_WINDOW, 7);
        let start = Barrier::new(GROWERS as usize);
        let per_thread: Vec<Vec<u8>> = thread::scope(|scope| {
            let handles: Vec<_> = (0..GROWERS)
                .map(|me| {
                    let (start, limiter) = (&start, &limiter);
                    scope.spawn(move || {
                        start.wait();
                        let mut admitted = vec![0u8; CLIENTS as usize];
                        for pass in 0..PASSES {
                            // Each thread and pass walks the clients in its
                            // own order (a stride coprime to the count), so
                            // new clients and known ones interleave.
                            let stride = [7_919, 104_729, 1_299_709][pass as usize];
                            for step in 0..CLIENTS {
                                let client = (me * 5_003 + step * stride) % CLIENTS;
                                if limiter.allow(&client) {
                                    admitted[client as usize] += 1;
                                }
                            }
                        }
                        admitted
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for client in 0..CLIENTS {
            let total: u64 = per_thread
                .iter()
                .map(|counts| u64::from(counts[client as usize]))
                .sum();
            assert_eq!(total, LIMIT, "{policy}, client {client}");
            assert_eq!(limiter.peek(&client), Some(0), "{policy}, client {client}");
        }
        assert_eq!(limiter.tracked_clients() as u64, CLIENTS, "{policy}");
    }
}

/// Moves racing checks, made frequent: three threads check eight hot
/// clients without pause while a fourth creates 200,000 new ones, so the
/// table is rebuilt about a dozen times and every rebuild moves the hot
/// clients under the checkers' feet. At a frozen instant and a limit no
/// thread reaches, every check is admitted, and each hot client's
/// `remaining` must be the limit minus exactly the checks it got: a check
/// lost in a move (landing on a state after it was copied) or counted twice
/// would leave it one off. (Not `sliding-window`: its move shares the
/// ring rather than freezing a word, and 200,000 rings of this limit would
/// not fit in memory; the growth test above covers it.)
#[test]
fn moves_racing_hot_checks_lose_nothing() {
    const HOT: u64 = 8;
    const LIMIT: u64 = 100_000;
    /// Per hot client per checker: the three together stay below `LIMIT`.
    const MOST: u64 = 30_000;
    const NEW: u64 = 200_000;
    for policy in PolicyKind::ALL {
        if policy == PolicyKind::SlidingWindow {
            continue;
        }
        let limiter = frozen(policy, Engine::LockFree, LIMIT, LONG_WINDOW, 7);
        for client in 0..HOT {
            assert!(limiter.allow(&client));
        }
        let done = std::sync::atomic::AtomicBool::new(false);
        let start = Barrier::new(4);
        let checked: Vec<(Vec<u64>, Vec<u64>)> = thread::scope(|scope| {
            let inserter = scope.spawn(|| {
                start.wait();
                for client in HOT..HOT + NEW {
                    assert!(limiter.allow(&client), "{policy}, new client {client}");
                }
                done.store(true, Ordering::Release);
            });
            let checkers: Vec<_> = (0..3)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        let (mut calls, mut admitted) =
                            (vec![0; HOT as usize], vec![0; HOT as usize]);
                        'run: for _ in 0..MOST {
                            for client in 0..HOT {
                                if done.load(Ordering::Acquire) {
                                    break 'run;
                                }
                                calls[client as usize] += 1;
                                admitted[client as usize] += u64::from(limiter.allow(&client));
                            }
                        }
                        (calls, admitted)
                    })
                })
                .collect();
            inserter.join().unwrap();
            checkers.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for client in 0..HOT {
            let calls: u64 = checked.iter().map(|(c, _)| c[client as usize]).sum();
            let admitted: u64 = checked.iter().map(|(_, a)| a[client as usize]).sum();
            assert_eq!(admitted, calls, "{policy}, hot client {client}");
            assert_eq!(
                limiter.peek(&client),
                Some(LIMIT - 1 - calls),
                "{policy}, hot client {client} after {calls} checks"
            );
        }
        assert_eq!(limiter.tracked_clients() as u64, HOT + NEW, "{policy}");
    }
}

/// Refunds racing admissions on one hot client's sliding log, alone and
/// among several rules, at a frozen instant: every thread gives back every
/// other unit it was admitted, each refund replacing the log's ring while
/// the other threads decide on it. Every refund finds a unit at that
/// instant to give back (its own admission's, or an equal one), so each
/// answers 1, and at the end the client's `remaining` is `L` less the
/// units admitted and not given back: nothing lost to a replaced ring,
/// nothing given twice. (Under `.ci/asan` it also reads every replaced
/// ring only while it is alive.)
#[test]
fn refunds_racing_admissions_on_a_log_keep_every_total_exact() {
    const LIMIT: u64 = 64;
    const CALLS: usize = 300;
    let rules: floodgate::RuleSet =
        format!("sliding-window:{LIMIT}/{LONG_WINDOW}ticks,gcra:100000/{LONG_WINDOW}ticks")
            .parse()
            .unwrap();
    let limiters: [(&str, Arc<dyn RateLimiter<u64>>); 2] = [
        (
            "alone",
            frozen(
                PolicyKind::SlidingWindow,
                Engine::LockFree,
                LIMIT,
                LONG_WINDOW,
                1_000,
            ),
        ),
        (
            "among rules",
            floodgate::build_rules(
                &rules,
                Engine::LockFree,
                ManualClock::new(1_000),
                Bounds::new(),
            )
            .unwrap(),
        ),
    ];
    for (name, limiter) in limiters {
        let tallies = hammer(|me| {
            let (mut admitted, mut given) = (0u64, 0u64);
            for call in 0..CALLS {
                if let Ok(admission) = limiter.admit(&7) {
                    admitted += 1;
                    if (me + call) % 2 == 0 {
                        let back = limiter.refund(admission, 1);
                        assert_eq!(back, 1, "{name}: thread {me}, call {call}");
                        given += back;
                    }
                }
            }
            (admitted, given)
        });
        let (admitted, given) = tallies
            .iter()
            .fold((0, 0), |(a, g), &(ta, tg)| (a + ta, g + tg));
        assert!(given > 0, "{name}: some refunds ran");
        assert!(admitted - given <= LIMIT, "{name}: {tallies:?}");
        assert_eq!(
            limiter.remaining(&7),
            LIMIT - (admitted - given),
            "{name}: {tallies:?}"
        );
    }
}
