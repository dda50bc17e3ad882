//! Every call returns: a hammer on the real clock over every policy, small
//! limits, every kind of bounds, both engines and tiers under reloads,
//! with a watchdog that fails the run, naming the case and the call, when a
//! call has not returned within [`WATCHDOG`]; and the bound: no client is
//! admitted more units than its policy allows in the time the run took.
//!
//! The case that once hung is in the grid: four threads, `sliding-window`
//! with L = 1, a cap of 5 that rejects, idle eviction, a window of 200 µs,
//! `remaining` mixed in (a check parked across a table rebuild spun for ever
//! on the old entry's hint).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate::tiers::{TierSpec, Tiers};
use floodgate::{
    Bounds, Builder, Clock, Config, Engine, Overflow, PolicyKind, QuantaClock, RateLimiter,
};

/// How long a call may run before the case is called hung: far above any
/// call's time on a loaded machine (a rebuild of these small tables takes
/// microseconds), far below CI's limit.
const WATCHDOG: Duration = Duration::from_secs(20);

/// How long each case hammers.
const RUN: Duration = Duration::from_millis(25);

const THREADS: usize = 4;

/// The window: short, so that clients go idle, are evicted and come back
/// many times within one run.
const WINDOW: Duration = Duration::from_micros(200);

const LIMITS: [u64; 5] = [1, 2, 3, 7, 100];

/// Clients whose admissions are counted against the bound, and never
/// forgotten; `FORGOTTEN` more are forgotten now and then (which gives a
/// client its burst back, so they are left out of the bound).
const COUNTED: u64 = 8;
const FORGOTTEN: u64 = 4;

/// The calls the hammer makes, by the index a thread publishes while it
/// is inside one (`CALLS[i]` names it for the watchdog).
const CALLS: [&str; 8] = [
    "check",
    "check_n (cost 0)",
    "check_n (cost 1)",
    "check_n (cost L)",
    "check_n (cost L + 1)",
    "remaining",
    "peek",
    "forget",
];
const SWEEP: usize = CALLS.len();
const RELOAD: usize = CALLS.len() + 1;
const IDLE: usize = usize::MAX;

fn call_name(call: usize) -> &'static str {
    match call {
        SWEEP => "sweep",
        RELOAD => "reload",
        call => CALLS[call],
    }
}

/// The bounds of one case.
fn bound_kinds() -> Vec<(&'static str, Bounds)> {
    let capped = |overflow| {
        Bounds::new()
            .evict_idle()
            .max_clients(5)
            .on_overflow(overflow)
    };
    vec![
        ("no bounds", Bounds::new()),
        ("idle eviction", Bounds::new().evict_idle()),
        ("cap 5, reject", capped(Overflow::Reject)),
        ("cap 5, admit", capped(Overflow::Admit)),
        ("cap 5, shared", capped(Overflow::Shared)),
        (
            "cap 2 without eviction, reject",
            Bounds::new().max_clients(2).on_overflow(Overflow::Reject),
        ),
    ]
}

/// Runs `THREADS` workers on `limiter` for [`RUN`], each making a mix of
/// calls on the clients, and fails naming `case` and the call if a worker
/// has not returned within [`WATCHDOG`] of the run's end. Answers the
/// units admitted per counted client and the run's length in ticks
/// (nanoseconds), measured around every call.
fn hammer(
    case: &str,
    limiter: Arc<dyn RateLimiter<u64>>,
    limit: u64,
    reload: Option<Arc<dyn Fn(u64) + Send + Sync>>,
) -> (Vec<u64>, u64) {
    let clock = QuantaClock::new();
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..COUNTED).map(|_| AtomicU64::new(0)).collect());
    let inside: Arc<Vec<AtomicUsize>> =
        Arc::new((0..THREADS + 1).map(|_| AtomicUsize::new(IDLE)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let began = clock.now();
    let workers = THREADS + usize::from(reload.is_some());
    for worker in 0..workers {
        let (limiter, admitted, inside, stop, done) = (
            Arc::clone(&limiter),
            Arc::clone(&admitted),
            Arc::clone(&inside),
            Arc::clone(&stop),
            Arc::clone(&done),
        );
        let reload = reload.clone();
        std::thread::spawn(move || {
            let mut rng = fastrand::Rng::with_seed(worker as u64 + 1);
            let publish = |call: usize| inside[worker].store(call, Ordering::SeqCst);
            // Relaxed: the flag only ends the loop.
            while !stop.load(Ordering::Relaxed) {
                if let (THREADS, Some(reload)) = (worker, &reload) {
                    publish(RELOAD);
                    reload(rng.u64(..));
                    publish(IDLE);
                    std::thread::yield_now();
                    continue;
                }
                let key = rng.u64(..COUNTED + FORGOTTEN);
                let roll = rng.u32(..100);
                let call = match roll {
                    0..=59 => 0,
                    60..=63 => 1,
                    64..=71 => 2,
                    72..=77 => 3,
                    78..=79 => 4,
                    80..=88 => 5,
                    89..=95 => 6,
                    96..=98 if key >= COUNTED => 7,
                    96..=98 => 0,
                    _ => SWEEP,
                };
                publish(call);
                let units = match call {
                    0 => u64::from(limiter.check(&key).allowed()),
                    1..=4 => {
                        let cost = [0, 1, limit, limit + 1][call - 1];
                        if limiter.check_n(&key, cost).allowed() {
                            cost
                        } else {
                            0
                        }
                    }
                    5 => {
                        limiter.remaining(&key);
                        0
                    }
                    6 => {
                        limiter.peek(&key);
                        0
                    }
                    7 => {
                        limiter.forget(&key);
                        0
                    }
                    _ => {
                        limiter.sweep();
                        0
                    }
                };
                publish(IDLE);
                if let Some(count) = admitted.get(key as usize) {
                    count.fetch_add(units, Ordering::Relaxed);
                }
            }
            done.fetch_add(1, Ordering::SeqCst);
        });
    }
    std::thread::sleep(RUN);
    stop.store(true, Ordering::Relaxed);
    let deadline = Instant::now() + WATCHDOG;
    // Ends when every worker has seen `stop` and finished its call (each
    // adds to `done`), or at the deadline, which fails the test.
    while done.load(Ordering::SeqCst) < workers {
        if Instant::now() > deadline {
            let stuck: Vec<String> = inside
                .iter()
                .enumerate()
                .filter(|(_, call)| call.load(Ordering::SeqCst) != IDLE)
                .map(|(worker, call)| {
                    format!(
                        "worker {worker} in {}",
                        call_name(call.load(Ordering::SeqCst))
                    )
                })
                .collect();
            panic!("{case}: a call has not returned after {WATCHDOG:?}: {stuck:?}");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let elapsed = clock.now() - began;
    let admitted = admitted.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    (admitted, elapsed)
}

/// The most units any policy admits to one client in `elapsed` ticks with
/// `limit` per `window`: a full burst, a refill of the limit per window
/// (rounded up), and one more burst for a fixed window's boundary.
fn most_allowed(limit: u64, window: u64, elapsed: u64) -> u64 {
    limit * (elapsed.div_ceil(window) + 2)
}

fn check_bound(case: &str, admitted: &[u64], limit: u64, window: u64, elapsed: u64) {
    let most = most_allowed(limit, window, elapsed);
    for (client, &units) in admitted.iter().enumerate() {
        assert!(
            units <= most,
            "{case}: client {client} admitted {units} units in {elapsed} ns, at most {most} allowed"
        );
    }
}

fn run_policy(policy: PolicyKind) {
    let window = WINDOW.as_nanos() as u64;
    for limit in LIMITS {
        for (bounds_name, bounds) in bound_kinds() {
            for engine in [Engine::LockFree, Engine::Mutex] {
                let case = format!("{policy} L = {limit}, {bounds_name}, {engine}");
                let limiter: Arc<dyn RateLimiter<u64>> = Builder::new(policy, limit, WINDOW)
                    .bounds(bounds)
                    .engine(engine)
                    .build::<u64>()
                    .unwrap_or_else(|e| panic!("{case}: {e}"));
                let (admitted, elapsed) = hammer(&case, limiter, limit, None);
                // An overflow that admits, or shares one state, admits
                // clients beyond their own state's count.
                if !matches!(bounds.overflow(), Overflow::Admit | Overflow::Shared)
                    || bounds.cap().is_none()
                {
                    check_bound(&case, &admitted, limit, window, elapsed);
                }
            }
        }
    }
}

#[test]
fn every_call_returns_sliding_window() {
    run_policy(PolicyKind::SlidingWindow);
}

#[test]
fn every_call_returns_token_bucket() {
    run_policy(PolicyKind::TokenBucket);
}

#[test]
fn every_call_returns_fixed_window() {
    run_policy(PolicyKind::FixedWindow);
}

#[test]
fn every_call_returns_sliding_window_counter() {
    run_policy(PolicyKind::SlidingWindowCounter);
}

#[test]
fn every_call_returns_gcra() {
    run_policy(PolicyKind::Gcra);
}

#[test]
fn every_call_returns_leaky_bucket() {
    run_policy(PolicyKind::LeakyBucket);
}

/// Tiers under reloads: one tier whose rule a fifth thread replaces over
/// and over (every policy, limits 1 to 3, the same window) while the
/// others hammer it. A reload keeps what each client spent, so no bound
/// is claimed across rules; what is checked is that every call returns.
#[test]
fn every_call_returns_in_tiers_under_reloads() {
    let window = WINDOW.as_nanos() as u64;
    let spec = move |policy: PolicyKind, limit: u64| {
        TierSpec::new(policy, Config::per_ticks(limit, window).unwrap()).unwrap()
    };
    for (bounds_name, bounds) in bound_kinds() {
        for policy in PolicyKind::ALL {
            let case = format!("tiers from {policy}, {bounds_name}, reloaded");
            let tiers = Arc::new(
                Tiers::with_clock(
                    "free",
                    spec(policy, 2),
                    |_: &u64| "free",
                    QuantaClock::new(),
                )
                .unwrap()
                .with_bounds(bounds)
                .unwrap_or_else(|e| panic!("{case}: {e}")),
            );
            let reloaded = Arc::clone(&tiers);
            let reload: Arc<dyn Fn(u64) + Send + Sync> = Arc::new(move |roll: u64| {
                let policy = PolicyKind::ALL[(roll % 6) as usize];
                let limit = 1 + (roll >> 8) % 3;
                reloaded.reload("free", spec(policy, limit)).unwrap();
            });
            let limiter: Arc<dyn RateLimiter<u64>> = tiers;
            hammer(&case, limiter, 2, Some(reload));
        }
    }
}
