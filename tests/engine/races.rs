//! Calls whose `now` is a little older than what their client's state
//! already reflects, as threads on a real clock present them, around the
//! two operations that rebuild a client's state: a tier reload (the
//! carry-over) and an idle sweep (the eviction). The contract (`SPEC.md`,
//! "Time going backwards"): such a call is never judged more leniently than
//! at the latest time the state reflects, and never moves stored time back.
//!
//! The exact tests replay each race on a manual clock; the stress tests
//! hammer one client on the real clock while the tier is reloaded (and
//! swept) without pause, and bound the admissions by the clock's own
//! readings before and after, never by a duration.

use super::support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use floodgate::tiers::TierSpec;
use floodgate::{build_bounded, Bounds, Config, ManualClock, PolicyKind, QuantaClock, RateLimiter};
use support::{drain, rejected, single_tier, spec, ENGINES, TIER};

const L: u64 = 10;
const W: u64 = 1_000;

/// The admissions the contract allows in `[1000, 1999]` to a client
/// created at 0, drained at 1000 by `L` per `W`, with its tier then
/// reloaded to `new_limit` per `W`, after a call at 999 and drains at 1000
/// and 1999: all of them judged at 1000 or later.
///
/// The three window policies allow `new_limit` in the window that holds
/// `[1000, 2000)` (the sliding log: in `(999, 1999]`). The drip policies
/// allow the new limit at once plus one per drip of the new rule up to
/// 1999: `gcra`'s schedule was `L` intervals ahead at 1000, carried as
/// `L` new intervals (`⌊999 / I'⌋` more by 1999); `token-bucket`'s drips
/// fall on the client's grid at `k·I'`, 11 of them in `(1000, 1999]`
/// for `I' = 90` and 9 for `I' = 100`.
fn allowed_after_reload(policy: PolicyKind, new_limit: u64) -> u64 {
    let interval = W / new_limit;
    match policy {
        PolicyKind::SlidingWindow | PolicyKind::FixedWindow | PolicyKind::SlidingWindowCounter => {
            new_limit
        }
        PolicyKind::Gcra | PolicyKind::LeakyBucket => new_limit + 999 / interval,
        PolicyKind::TokenBucket => new_limit + (1_999 / interval - 1_000 / interval),
        PolicyKind::InFlight => unreachable!("not a rate policy (PolicyKind::ALL)"),
    }
}

/// A stale call right after a reload used to carry the client over at its
/// own older `now`: a fixed window carried into the window before its own,
/// a schedule rebuilt from 999, a log stamped at 999 — each gave back up to
/// a whole limit.
#[test]
fn a_stale_call_after_a_reload_gets_no_more_than_at_the_latest_time() {
    // Every case runs before the assertion, so that a failure lists them all.
    let mut wrong = Vec::new();
    for policy in PolicyKind::ALL {
        for new_limit in [L, L + 1] {
            let tiers = single_tier(spec(policy, L, W), ManualClock::new(0));
            let key = 7;
            assert_eq!(tiers.remaining_at(&key, 0), L, "{policy}");
            assert_eq!(drain(&tiers, &key, 1_000), L, "{policy}");
            tiers.reload(TIER, spec(policy, new_limit, W)).unwrap();
            let stale = u64::from(tiers.check_at(&key, 999).allowed());
            let at_latest = drain(&tiers, &key, 1_000);
            let later = drain(&tiers, &key, 1_999);
            let (total, allowed) = (
                L + stale + at_latest + later,
                allowed_after_reload(policy, new_limit),
            );
            if stale + at_latest != new_limit - L || total != allowed {
                wrong.push(format!(
                    "{policy}, reloaded {L} → {new_limit} per {W}: admitted {L} at 1000, \
                     {stale} at 999, {at_latest} at 1000, {later} at 1999: {total} in all, \
                     not {allowed} (of which {} at 999 and 1000)",
                    new_limit - L
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// An idle client evicted by a sweep at 1000 and met again by a call read
/// at 999 starts at 1000, not at 999: that admission counts as made at 1000,
/// so the next is one full window later. A drip policy (`token-bucket`,
/// `gcra`, `leaky-bucket`) starts its state at 1000 (the bucket full from
/// 1000, `TAT = 1000`) and judges the call at 999 itself: refused for the
/// tick it is early, then admitted at 1000. (Not
/// `sliding-window-counter`: a client admitted in the window before is not
/// idle at 1000 there.)
#[test]
fn a_stale_call_after_a_sweep_starts_where_the_sweep_judged() {
    let policies = [
        PolicyKind::SlidingWindow,
        PolicyKind::TokenBucket,
        PolicyKind::FixedWindow,
        PolicyKind::Gcra,
        PolicyKind::LeakyBucket,
    ];
    let mut wrong = Vec::new();
    for policy in policies {
        for engine in ENGINES {
            let limiter = build_bounded::<u64, _>(
                policy,
                Config::per_ticks(1, W).unwrap(),
                engine,
                ManualClock::new(0),
                Bounds::new().evict_idle(),
            )
            .unwrap();
            let context = format!("{policy} on {engine}");
            assert!(limiter.check_at(&0, 0).allowed(), "{context}");
            // The 64th new client sweeps first, at 1000: client 0 is idle.
            for newcomer in 1..=64 {
                assert!(limiter.check_at(&newcomer, 1_000).allowed(), "{context}");
            }
            assert_eq!(limiter.tracked_clients(), 64, "{context}: 0 was evicted");
            let mut stale = limiter.check_at(&0, 999);
            if policy.drips() {
                if stale != rejected(1) {
                    wrong.push(format!("{context}: at 999 {stale:?}, not 1 tick early"));
                }
                stale = limiter.check_at(&0, 1_000);
            }
            let probe = limiter.check_at(&0, 1_999);
            let next = limiter.check_at(&0, 2_000);
            if !stale.allowed() || probe != rejected(1) || !next.allowed() {
                wrong.push(format!(
                    "{context}: at 999 {stale:?}, then at 1999 {probe:?}, at 2000 {next:?} \
                     (the admission at 999 counts as made at 1000)"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A reload with the rule the tier already has changes nothing: a sliding
/// log spent at 0 still frees its first place at 1000 (it used to be
/// re-stamped at the reload's first call, 950).
#[test]
fn an_identical_reload_keeps_the_spent_requests_where_they_were() {
    let rule = spec(PolicyKind::SlidingWindow, 3, W);
    let tiers = single_tier(rule, ManualClock::new(0));
    assert_eq!(drain(&tiers, &1, 0), 3);
    assert_eq!(tiers.check_at(&1, 950), rejected(50));
    tiers.reload(TIER, rule).unwrap();
    assert_eq!(tiers.check_at(&1, 950), rejected(50));
    assert!(tiers.check_at(&1, 1_000).allowed());
}

/// Every policy: a registry reloaded with its own rule, again and again,
/// answers every call exactly as one never reloaded.
#[test]
fn an_identical_reload_answers_as_no_reload() {
    let mut wrong = Vec::new();
    for policy in PolicyKind::ALL {
        let rule = spec(policy, 3, W);
        let reloaded = single_tier(rule, ManualClock::new(0));
        let untouched = single_tier(rule, ManualClock::new(0));
        for at in [
            0, 0, 0, 0, 950, 999, 1_000, 1_000, 1_333, 1_500, 1_999, 2_000, 3_500,
        ] {
            reloaded.reload(TIER, rule).unwrap();
            let (here, there) = (reloaded.check_at(&1, at), untouched.check_at(&1, at));
            if here != there {
                wrong.push(format!(
                    "{policy}: at {at}, {here:?} after an identical reload"
                ));
            }
            reloaded.reload(TIER, rule).unwrap();
            let (here, there) = (
                reloaded.remaining_at(&1, at + 1),
                untouched.remaining_at(&1, at + 1),
            );
            if here != there {
                wrong.push(format!(
                    "{policy}: remaining at {} is {here}, not {there}, after an identical reload",
                    at + 1
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// One stress configuration: `policy` at `limit` per `window`, and the rule
/// the reloader alternates it with.
struct Stress {
    rule: TierSpec,
    other: TierSpec,
}

/// How long the threads hammer each configuration. Not asserted on: the
/// bound comes from the clock's readings.
const HAMMER: Duration = Duration::from_millis(120);
const THREADS: usize = 4;

/// Limits in nanoseconds: a small limit, `gcra`'s 100 per 3 ms of the
/// original report, and a larger one; none divides `W + 1`, so `(L, W)` and
/// `(L, W + 1)` drip at the same interval.
const LIMITS: [(u64, u64); 3] = [(3, 1_000_000), (100, 3_000_000), (1_000, 10_000_000)];

/// The most admissions `rule` allows to one client between two clock
/// readings `elapsed` ticks apart (every admission's `now` is in that
/// span, and so is its client's origin).
///
/// * `gcra`, `leaky-bucket`: a burst of `L`, then one per `I`.
/// * `token-bucket`: the same, plus one drip for a grid that starts
///   anywhere in the span.
/// * `sliding-window`: `L` in each of the `⌈(E + 1) / W⌉` windows of `W`
///   instants that cover the span.
/// * `fixed-window`, `sliding-window-counter`: `L` in each grid window the
///   span meets, at most `⌊E / W⌋ + 2`.
fn bound(rule: TierSpec, elapsed: u64) -> u64 {
    let (limit, window) = (rule.config().limit(), rule.config().window());
    let interval = window / limit;
    match rule.policy() {
        PolicyKind::Gcra | PolicyKind::LeakyBucket => limit + elapsed / interval,
        PolicyKind::TokenBucket => limit + elapsed / interval + 1,
        PolicyKind::SlidingWindow => limit * (elapsed + 1).div_ceil(window),
        PolicyKind::FixedWindow | PolicyKind::SlidingWindowCounter => {
            limit * (elapsed / window + 2)
        }
        // Nothing comes back by time: the limit, until releases.
        PolicyKind::InFlight => limit,
    }
}

/// A rule that admits exactly the requests `rule` admits but is not equal
/// to it, so that a reload to it carries every client over:
/// `gcra` ↔ `leaky-bucket`; `(L, W + 1)` where it drips at the same
/// interval (or, for the sliding log, where every window of `W` still
/// holds at most `L`); `fixed-window` ↔ `sliding-window-counter`, which
/// both admit at most `L` per grid window and carry that count.
fn twin(rule: TierSpec) -> TierSpec {
    let (limit, window) = (rule.config().limit(), rule.config().window());
    let same = |policy| spec(policy, limit, window);
    match rule.policy() {
        PolicyKind::Gcra => same(PolicyKind::LeakyBucket),
        PolicyKind::FixedWindow => same(PolicyKind::SlidingWindowCounter),
        PolicyKind::SlidingWindowCounter => same(PolicyKind::FixedWindow),
        policy => {
            assert_eq!(window / limit, (window + 1) / limit, "{rule:?}");
            spec(policy, limit, window + 1)
        }
    }
}

/// Hammers one client of a registry on the real clock from [`THREADS`]
/// threads while another reloads its tier without pause (alternating
/// `rule` and `other`) and, with `evict`, another sweeps without pause.
/// Answers (admitted, bound).
fn hammer(stress: &Stress, evict: bool) -> (u64, u64) {
    let Stress { rule, other } = *stress;
    let mut tiers = single_tier(rule, QuantaClock::new());
    if evict {
        tiers = tiers.with_bounds(Bounds::new().evict_idle()).unwrap();
    }
    let tiers = &tiers;
    let stop = &AtomicBool::new(false);
    let admitted = &AtomicU64::new(0);
    let start = tiers.now();
    thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(move || {
                let mut mine = 0;
                while !stop.load(Ordering::Relaxed) {
                    mine += u64::from(tiers.allow(&42));
                }
                admitted.fetch_add(mine, Ordering::Relaxed);
            });
        }
        scope.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                tiers.reload(TIER, other).unwrap();
                tiers.reload(TIER, rule).unwrap();
            }
        });
        if evict {
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    tiers.sweep();
                }
            });
        }
        thread::sleep(HAMMER);
        stop.store(true, Ordering::Relaxed);
    });
    let elapsed = tiers.now() - start;
    let bound = bound(rule, elapsed).max(bound(other, elapsed));
    (admitted.load(Ordering::Relaxed), bound)
}

/// Every policy at every limit of [`LIMITS`], its tier reloaded to `other`
/// and back without pause. Every configuration runs before the assertion,
/// so that a failure shows them all.
fn stress_every_policy(other: impl Fn(TierSpec) -> TierSpec, evict: bool) {
    // One stress test at a time: each hammers one client from more threads
    // than the machine may have cores, and four at once starve each other
    // below the rate that keeps the client at its limit.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let mut report = Vec::new();
    let mut over = 0;
    for policy in PolicyKind::ALL {
        for (limit, window) in LIMITS {
            let rule = spec(policy, limit, window);
            let stress = Stress {
                rule,
                other: other(rule),
            };
            let (admitted, bound) = hammer(&stress, evict);
            let verdict = if admitted > bound {
                over += 1;
                "OVER THE BOUND"
            } else {
                "ok"
            };
            report.push(format!(
                "{policy} {limit} per {window} ns ↔ {} {limit} per {} ns{}: \
                 {admitted} admitted, bound {bound}: {verdict}",
                stress.other.policy(),
                stress.other.config().window(),
                if evict { ", swept" } else { "" },
            ));
        }
    }
    let report = report.join("\n");
    assert_eq!(
        over, 0,
        "admissions beyond what the clock's readings allow:\n{report}"
    );
    // Shown with `--nocapture`: how close each configuration came.
    println!("{report}");
}

#[test]
fn identical_reloads_without_pause_admit_within_the_bound() {
    stress_every_policy(|rule| rule, false);
}

#[test]
fn identical_reloads_and_sweeps_without_pause_admit_within_the_bound() {
    stress_every_policy(|rule| rule, true);
}

#[test]
fn carry_overs_without_pause_admit_within_the_bound() {
    stress_every_policy(twin, false);
}

#[test]
fn carry_overs_and_sweeps_without_pause_admit_within_the_bound() {
    stress_every_policy(twin, true);
}

/// A state word keeps only a lower bound of its latest admission
/// (`token-bucket`: drip `B − L`; `gcra`, `leaky-bucket`: `TAT − L·I`). A
/// stale call that carried its client over at that bound, onto another
/// interval or a lower limit, judged the spend too early and handed a
/// request back: each case below admitted twice at one instant with a limit
/// of 1 under the new rule (and, for the token bucket, under both). The
/// carry-over is now judged at the latest time a check presented, which
/// each tier client keeps beside its state.
#[test]
fn a_stale_carry_over_onto_another_interval_or_a_lower_limit_gives_nothing_back() {
    // Admissions before the reloads, the reloads, the stale time, and the
    // instant that must then reject, with its `retry_after`.
    type Case = (&'static [u64], Vec<TierSpec>, u64, u64, u64);
    let cases: [Case; 2] = [
        // Token bucket, 1 per 21 → 1 per 22 (carried at 21) → 1 per 21.
        (
            &[0, 21],
            vec![
                spec(PolicyKind::TokenBucket, 1, 22),
                spec(PolicyKind::TokenBucket, 1, 21),
            ],
            0,
            21,
            21,
        ),
        // GCRA, 2 per 2000 → 1 per 1000: one admission at 5000 leaves
        // TAT = 6000, judged at TAT − L·I = 4000 as the whole limit spent.
        (
            &[5_000],
            vec![spec(PolicyKind::Gcra, 1, 1_000)],
            4_000,
            5_000,
            1_000,
        ),
    ];
    let first = [
        spec(PolicyKind::TokenBucket, 1, 21),
        spec(PolicyKind::Gcra, 2, 2_000),
    ];
    let mut wrong = Vec::new();
    for ((admitted, reloads, stale, probe, retry), rule) in cases.into_iter().zip(first) {
        let run = |stale: Option<u64>| {
            let tiers = single_tier(rule, ManualClock::new(0));
            assert_eq!(tiers.remaining_at(&1, 0), rule.config().limit());
            for &at in admitted {
                assert!(tiers.check_at(&1, at).allowed());
            }
            for &reload in &reloads {
                // Each carried over at the latest admission, but the last.
                tiers.remaining_at(&1, *admitted.last().unwrap());
                tiers.reload(TIER, reload).unwrap();
            }
            if let Some(at) = stale {
                assert!(!tiers.check_at(&1, at).allowed());
            }
            tiers.check_at(&1, probe)
        };
        assert_eq!(
            run(None),
            rejected(retry),
            "{rule:?}: carried at the latest time"
        );
        let after_stale = run(Some(stale));
        if after_stale != rejected(retry) {
            wrong.push(format!(
                "{rule:?} reloaded to {reloads:?}: a call at {stale}, then at {probe}: \
                 {after_stale:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A sliding log carried over once all its admissions have left the window
/// is rebuilt empty: the state word itself then remembers nothing of the
/// carry-over's instant, and a stale call used to count its admission at
/// its own older `now`, so the next came a window after that, not after
/// the carry-over. Checks are now judged no earlier than the carry-over.
#[test]
fn a_stale_call_after_an_empty_carry_over_counts_at_the_carry_over() {
    let tiers = single_tier(
        spec(PolicyKind::SlidingWindow, 1, 1_000),
        ManualClock::new(0),
    );
    assert!(tiers.check_at(&1, 0).allowed());
    tiers
        .reload(TIER, spec(PolicyKind::SlidingWindow, 1, 1_001))
        .unwrap();
    // Carried over at 1000: the admission at 0 has left the window.
    assert_eq!(tiers.remaining_at(&1, 1_000), 1);
    let stale = tiers.check_at(&1, 999);
    assert!(stale.allowed());
    assert_eq!(
        tiers.check_at(&1, 2_000),
        rejected(1),
        "the admission read at 999 came after the carry-over at 1000"
    );
}
