//! Keeping state across a restart (the contract's section of that name):
//! a trace answered in two parts, with a save after the first and a load
//! into a new limiter before the second, answers exactly as the whole
//! trace on one limiter, for every policy and every mix of rules; an
//! `in-flight` rule loads holding nothing; time between the save and the
//! load counts as time passed; a file that cannot be read whole loads
//! nothing and says what is wrong with it.

use super::support;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use floodgate::state::{self, Saved};
use floodgate::{
    build_rules, Bounds, Config, Engine, ManualClock, PolicyKind, RateLimiter, Rule, RuleSet,
};
use proptest::prelude::*;
use proptest::sample::select;
use support::{run, Call, Op};

/// A file of this test's own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(
            std::env::temp_dir().join(format!("floodgate-state-{}-{name}-{n}", std::process::id())),
        )
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A rate rule in ticks (no `in-flight`: its units are held across the
/// trace, and a load holds none; tested on its own below).
fn rule() -> impl Strategy<Value = Rule> {
    let rates: Vec<PolicyKind> = PolicyKind::ALL
        .into_iter()
        .filter(|p| *p != PolicyKind::InFlight)
        .collect();
    (
        select(rates),
        1..=6u64,
        1..=40u64,
        prop_oneof![3 => Just(1u64), 1 => Just(1u64 << 40)],
    )
        .prop_map(|(policy, limit, window, scale)| {
            let window = if policy.drips() {
                window.max(limit)
            } else {
                window
            };
            let window = window.saturating_mul(scale);
            Rule::new(policy, Config::per_ticks(limit, window).unwrap()).unwrap()
        })
}

fn rules() -> impl Strategy<Value = RuleSet> {
    prop::collection::vec(rule(), 1..=3).prop_map(|rules| RuleSet::new(rules).unwrap())
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Allow),
        3 => prop_oneof![Just(0u64), 1..=3u64, 4..=8u64].prop_map(Op::AllowN),
        1 => Just(Op::Remaining),
        2 => (1..=3u64, prop_oneof![Just(0u64), 1..=45u64])
            .prop_map(|(cost, back)| Op::Refund { cost, back }),
    ]
}

/// A trace of up to three clients whose times never decrease.
fn trace() -> impl Strategy<Value = Vec<Call>> {
    prop::collection::vec(
        (0..3u64, op(), prop_oneof![3 => Just(0u64), 2 => 0..=40u64]),
        1..60,
    )
    .prop_map(|steps| {
        let mut at = 1_000u64;
        steps
            .into_iter()
            .map(|(client, op, delta)| {
                at += delta;
                Call { op, client, at }
            })
            .collect()
    })
}

fn limiter(rules: &RuleSet, bounds: Bounds) -> std::sync::Arc<dyn RateLimiter<u64>> {
    on(Engine::LockFree, rules, bounds)
}

fn on(engine: Engine, rules: &RuleSet, bounds: Bounds) -> std::sync::Arc<dyn RateLimiter<u64>> {
    build_rules::<u64, _>(rules, engine, ManualClock::new(0), bounds).unwrap()
}

/// Saves `limiter` to a scratch file and loads it into a new limiter of
/// the same rules.
fn restarted(
    limiter: &dyn RateLimiter<u64>,
    bounds: Bounds,
) -> std::sync::Arc<dyn RateLimiter<u64>> {
    let file = Scratch::new("restart");
    state::save(limiter, &file.0).unwrap();
    let saved = Saved::read(&file.0).unwrap();
    let loaded = build_rules::<u64, _>(
        saved.rules(),
        saved.engine().unwrap(),
        ManualClock::new(saved.saved_at()),
        bounds,
    )
    .unwrap();
    assert_eq!(saved.load_into(&*loaded).unwrap(), saved.clients());
    loaded
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// The contract's two parts: the second part's answers after a save and
    /// a load are the whole trace's.
    #[test]
    fn two_parts_answer_as_one_run(
        rules in rules(),
        trace in trace(),
        split in any::<prop::sample::Index>(),
        evict in any::<bool>(),
        mutex in any::<bool>(),
    ) {
        let bounds = if evict { Bounds::new().evict_idle() } else { Bounds::new() };
        let split = split.index(trace.len() + 1);
        let engine = if mutex { Engine::Mutex } else { Engine::LockFree };
        let whole = on(engine, &rules, bounds);
        run(&*whole, &trace[..split]);
        let loaded = restarted(&*whole, bounds);
        let expected = run(&*whole, &trace[split..]);
        prop_assert_eq!(run(&*loaded, &trace[split..]), expected, "rules {} on {}", rules, engine);
    }
}

#[test]
fn an_in_flight_rule_loads_holding_nothing() {
    for text in [
        "in-flight:2",
        "gcra:5/1s,in-flight:2",
        "fixed-window:5/1s,in-flight:2,sliding-window:4/1s",
    ] {
        let rules: RuleSet = text.parse().unwrap();
        let rules = rules.in_ticks_of(floodgate::Tick::MILLISECOND).unwrap();
        for engine in [Engine::LockFree, Engine::Mutex] {
            let held = on(engine, &rules, Bounds::new());
            assert!(held.check_at(&1, 0).allowed());
            assert!(held.check_at(&1, 0).allowed());
            assert!(
                !held.check_at(&1, 0).allowed(),
                "{text} on {engine}: two held"
            );
            let loaded = restarted(&*held, Bounds::new());
            let first = loaded.check_at(&1, 0);
            assert!(
                first.allowed(),
                "{text} on {engine}: nothing held after the load"
            );
        }
    }
}

/// On the real clock, the wall-clock time between a save and a load has
/// passed: a spent one-second window is open again a second later.
#[test]
fn time_between_save_and_load_counts_as_passed() {
    let file = Scratch::new("downtime");
    let limiter = build_rules::<str, _>(
        &"fixed-window:1/1s".parse().unwrap(),
        Engine::LockFree,
        floodgate::QuantaClock::new(),
        Bounds::new(),
    )
    .unwrap();
    assert!(limiter.check("app").allowed());
    state::save(&*limiter, &file.0).unwrap();
    let saved = Saved::read(&file.0).unwrap();
    // Loaded at once: still spent.
    let now: std::sync::Arc<dyn RateLimiter<str>> = state::load(&file.0, Bounds::new()).unwrap();
    assert!(!now.check("app").allowed());
    // The wall clock 2 s on: the window has ended; the wall clock back: no
    // time passed, never negative time.
    assert!(
        saved.resume_at(saved.saved_wall() + Duration::from_secs(2))
            >= saved.saved_at() + 2_000_000_000
    );
    assert_eq!(
        saved.resume_at(saved.saved_wall() - Duration::from_secs(5)),
        saved.saved_at()
    );
    let later = build_rules::<str, _>(
        saved.rules(),
        Engine::LockFree,
        ManualClock::new(saved.resume_at(saved.saved_wall() + Duration::from_secs(2))),
        Bounds::new(),
    )
    .unwrap();
    saved.load_into(&*later).unwrap();
    assert!(later.check("app").allowed());
    assert!(SystemTime::now() >= saved.saved_wall());
}

/// A spent daily quota stays spent across the restart.
#[test]
fn a_daily_quota_survives_a_restart() {
    let rules: RuleSet = "gcra:10/1s,fixed-window:20/1d".parse().unwrap();
    let rules = rules.in_ticks_of(floodgate::Tick::MILLISECOND).unwrap();
    let limiter = limiter(&rules, Bounds::new());
    let mut at = 0;
    while limiter.check_at(&7, at).allowed() || at < 10_000 {
        at += 100;
        if at > 100_000 {
            break;
        }
    }
    assert_eq!(limiter.remaining_at(&7, at), 0);
    let loaded = restarted(&*limiter, Bounds::new());
    let refused = loaded.check_at(&7, at + 60_000);
    assert!(!refused.allowed());
    assert_eq!(refused, limiter.check_at(&7, at + 60_000));
}

fn saved_file(name: &str) -> (Scratch, Vec<u8>) {
    let file = Scratch::new(name);
    let rules: RuleSet = "sliding-window:3/1s,token-bucket:5/1s".parse().unwrap();
    let limiter =
        build_rules::<str, _>(&rules, Engine::LockFree, ManualClock::new(0), Bounds::new())
            .unwrap();
    for key in ["a", "b", "c"] {
        limiter.check_at(key, 5);
    }
    state::save(&*limiter, &file.0).unwrap();
    let bytes = std::fs::read(&file.0).unwrap();
    (file, bytes)
}

fn refused(bytes: &[u8], name: &str) -> String {
    let file = Scratch::new(name);
    std::fs::write(&file.0, bytes).unwrap();
    let error = Saved::read(&file.0).unwrap_err().to_string();
    assert!(
        error.contains(&file.0.display().to_string()),
        "{error}: names the file"
    );
    error
}

#[test]
fn every_bad_file_is_refused_whole_with_what_is_wrong() {
    let (_file, bytes) = saved_file("good");
    assert!(refused(&[], "empty").contains("empty"));
    assert!(refused(b"#!/bin/sh\necho hello\n", "script").contains("not a floodgate state file"));
    for cut in [9, bytes.len() / 2, bytes.len() - 1] {
        assert!(
            refused(&bytes[..cut], "truncated").contains("damaged"),
            "cut at {cut}"
        );
    }
    for at in [12, bytes.len() / 2, bytes.len() - 1] {
        let mut changed = bytes.clone();
        changed[at] ^= 0x20;
        assert!(
            refused(&changed, "changed").contains("damaged"),
            "byte {at}"
        );
    }
    // The version is the byte after the magic (a varint below 128).
    let mut newer = bytes.clone();
    newer[8] = 2;
    assert!(refused(&newer, "newer").contains("newer floodgate"));
    let missing = Scratch::new("missing");
    let error = Saved::read(&missing.0).unwrap_err();
    assert!(error.is_missing() && error.to_string().contains("no such file"));
}

#[test]
fn a_file_saved_under_other_rules_or_engine_loads_nothing() {
    let (file, _) = saved_file("rules");
    let saved = Saved::read(&file.0).unwrap();
    let other = build_rules::<str, _>(
        &"sliding-window:3/1s,token-bucket:6/1s".parse().unwrap(),
        Engine::LockFree,
        ManualClock::new(0),
        Bounds::new(),
    )
    .unwrap();
    let error = saved.load_into(&*other).unwrap_err().to_string();
    assert!(
        error.contains("saved under the rules sliding-window:3/1s,token-bucket:5/1s"),
        "{error}"
    );
    assert_eq!(other.tracked_clients(), 0);
}

#[test]
fn a_save_that_cannot_be_written_leaves_the_old_file() {
    let (file, bytes) = saved_file("kept");
    let limiter = build_rules::<str, _>(
        &"gcra:1/1s".parse().unwrap(),
        Engine::LockFree,
        ManualClock::new(0),
        Bounds::new(),
    )
    .unwrap();
    let nowhere = std::env::temp_dir().join("floodgate-no-such-dir/state");
    let error = state::save(&*limiter, &nowhere).unwrap_err();
    assert!(
        error.to_string().contains("floodgate-no-such-dir"),
        "{error}"
    );
    assert_eq!(std::fs::read(&file.0).unwrap(), bytes);
}

/// More saved clients than the new cap: the ones with the least left are
/// kept (one left out would start with its whole limit), on both engines.
#[test]
fn a_cap_keeps_the_clients_that_spent_most() {
    let rules: RuleSet = "fixed-window:10/1s".parse().unwrap();
    let rules = rules.in_ticks_of(floodgate::Tick::MILLISECOND).unwrap();
    for engine in [Engine::LockFree, Engine::Mutex] {
        let limiter = on(engine, &rules, Bounds::new());
        for client in 0..20u64 {
            // Client c spends c % 10 + 1.
            for _ in 0..=client % 10 {
                limiter.check_at(&client, 5);
            }
        }
        let file = Scratch::new("cap");
        state::save(&*limiter, &file.0).unwrap();
        let saved = Saved::read(&file.0).unwrap();
        let capped = build_rules::<u64, _>(
            saved.rules(),
            engine,
            ManualClock::new(5),
            Bounds::new().max_clients(6),
        )
        .unwrap();
        assert_eq!(saved.load_into(&*capped).unwrap(), 6, "{engine}");
        // Clients 9, 19 (spent 10), 8, 18 (9) and 7, 17 (8).
        for client in 0..20u64 {
            let kept = capped.peek_at(&client, 5).is_some();
            assert_eq!(kept, client % 10 >= 7, "{engine}: client {client}");
        }
    }
}

#[test]
fn a_file_of_the_other_engine_is_refused() {
    let (file, _) = saved_file("engine");
    let saved = Saved::read(&file.0).unwrap();
    let mutex = build_rules::<str, _>(
        saved.rules(),
        Engine::Mutex,
        ManualClock::new(0),
        Bounds::new(),
    )
    .unwrap();
    let error = saved.load_into(&*mutex).unwrap_err().to_string();
    assert!(
        error.contains("saved by the lockfree engine, not the mutex engine"),
        "{error}"
    );
}

fn ms_clock(at: u64) -> ManualClock {
    ManualClock::with_tick(at, floodgate::Tick::MILLISECOND)
}

fn registry(
    free: &str,
    premium: &str,
    clock: ManualClock,
) -> floodgate::tiers::Tiers<u64, fn(&u64) -> &'static str, ManualClock> {
    fn plan(key: &u64) -> &'static str {
        if key.is_multiple_of(2) {
            "free"
        } else {
            "premium"
        }
    }
    let rules = |text: &str| text.parse::<RuleSet>().unwrap();
    floodgate::tiers::Tiers::with_clock_rules(
        "free",
        rules(free),
        plan as fn(&u64) -> &'static str,
        clock,
    )
    .unwrap()
    .with_tier_rules("premium", rules(premium))
    .unwrap()
}

/// A registry of tiers in two parts answers as in one, every tier's
/// clients kept under its own rules.
#[test]
fn tiers_in_two_parts_answer_as_in_one() {
    let (free, premium) = ("gcra:4/100ms,fixed-window:10/1s", "sliding-window:5/200ms");
    let trace: Vec<Call> = (0..300u64)
        .map(|i| Call {
            op: if i % 7 == 3 {
                Op::Refund { cost: 1, back: 5 }
            } else {
                Op::Allow
            },
            client: i % 5,
            at: 1_000 + i * 9,
        })
        .collect();
    for split in [0, 1, 150, 300] {
        let whole = registry(free, premium, ms_clock(0));
        run(&whole, &trace[..split]);
        let file = Scratch::new("tiers");
        let summary = state::save(&whole, &file.0).unwrap();
        let saved = Saved::read(&file.0).unwrap();
        assert_eq!(saved.engine(), None);
        let tiers: Vec<(String, String)> = saved
            .tiers()
            .map(|(name, rules)| (name.to_owned(), rules.to_string()))
            .collect();
        assert_eq!(
            tiers,
            [
                ("free".to_owned(), free.to_owned()),
                ("premium".to_owned(), premium.to_owned())
            ]
        );
        let loaded = registry(free, premium, ms_clock(0));
        assert_eq!(saved.load_into(&loaded).unwrap(), summary.clients);
        assert_eq!(
            run(&loaded, &trace[split..]),
            run(&whole, &trace[split..]),
            "split {split}"
        );
    }
}

/// A tier whose rules changed across the restart: refused by default;
/// carried over rule by rule on request, as a reload carries it.
#[test]
fn a_tier_whose_rules_changed_is_refused_or_carried_over() {
    let saved_under = registry("fixed-window:10/1s", "gcra:5/1s", ms_clock(0));
    for _ in 0..8 {
        saved_under.check_at(&2, 10);
    }
    for _ in 0..3 {
        saved_under.check_at(&4, 10);
    }
    saved_under.check_at(&1, 10);
    let file = Scratch::new("changed");
    state::save(&saved_under, &file.0).unwrap();
    let saved = Saved::read(&file.0).unwrap();
    let changed = registry("fixed-window:5/1s", "gcra:5/1s", ms_clock(10));
    let error = saved.load_into(&changed).unwrap_err().to_string();
    assert!(
        error.contains(
            "tier free was saved under the rules fixed-window:10/1s, not fixed-window:5/1s"
        ),
        "{error}"
    );
    assert_eq!(changed.tracked_clients(), 0);
    assert_eq!(saved.load_carried_into(&changed).unwrap(), 3);
    assert_eq!(changed.remaining_at(&2, 20), 0); // spent 8 of a new 5
    assert_eq!(changed.remaining_at(&4, 20), 2); // spent 3
    assert_eq!(
        changed.remaining_at(&1, 20),
        saved_under.remaining_at(&1, 20)
    );
}

/// What every client of a save had spent, by loading it into a new
/// limiter of the same rules and reading each rule at `now`.
fn spent_in(bytes: &[u8], rules: &RuleSet, now: u64, clients: u64) -> Vec<u64> {
    let saved = Saved::from_bytes(bytes).unwrap();
    let loaded = on(saved.engine().unwrap(), rules, Bounds::new());
    saved.load_into(&*loaded).unwrap();
    let limit = rules.strictest().config().limit();
    (0..clients)
        .map(|client| match loaded.peek_at(&client, now) {
            Some(remaining) => limit - remaining,
            None => 0,
        })
        .collect()
}

/// Saves in a loop while four threads admit requests of 4,000 clients at a
/// frozen clock, the table growing under them: each save holds every
/// client as it was at some instant of the save (what each spent never
/// falls from one save to the next, and never exceeds the end's), and a
/// save after the threads end holds exactly what they admitted.
#[test]
fn saves_racing_admissions_and_growth_keep_every_total_exact() {
    const CLIENTS: u64 = 4_000;
    let rules: RuleSet = "fixed-window:1000/1000000ticks".parse().unwrap();
    for engine in [Engine::LockFree, Engine::Mutex] {
        let limiter = on(engine, &rules, Bounds::new());
        let done = std::sync::atomic::AtomicBool::new(false);
        let (admitted, saves) = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4u64)
                .map(|t| {
                    let limiter = &limiter;
                    scope.spawn(move || {
                        let mut admitted = vec![0u64; CLIENTS as usize];
                        for round in 0..6u64 {
                            for client in 0..CLIENTS {
                                let client = (client * 7 + t * 13 + round) % CLIENTS;
                                if limiter.check_at(&client, 5).allowed() {
                                    admitted[client as usize] += 1;
                                }
                            }
                        }
                        admitted
                    })
                })
                .collect();
            let saver = scope.spawn(|| {
                let mut saves = Vec::new();
                // At least one save, whether or not the workers are still
                // running when this thread is first scheduled. Ends with
                // the first save begun after the main thread, having
                // joined the workers, set `done`.
                loop {
                    let finished = done.load(std::sync::atomic::Ordering::Relaxed);
                    saves.push(state::to_bytes(&*limiter, &[]).unwrap());
                    if finished {
                        break;
                    }
                }
                saves
            });
            let mut admitted = vec![0u64; CLIENTS as usize];
            for worker in workers {
                for (total, own) in admitted.iter_mut().zip(worker.join().unwrap()) {
                    *total += own;
                }
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            (admitted, saver.join().unwrap())
        });
        let last = spent_in(
            &state::to_bytes(&*limiter, &[]).unwrap(),
            &rules,
            5,
            CLIENTS,
        );
        assert_eq!(last, admitted, "{engine}: the last save is exact");
        let mut before = vec![0u64; CLIENTS as usize];
        for bytes in &saves {
            let spent = spent_in(bytes, &rules, 5, CLIENTS);
            for client in 0..CLIENTS as usize {
                assert!(
                    before[client] <= spent[client] && spent[client] <= admitted[client],
                    "{engine}: client {client}: {} then {}, of {}",
                    before[client],
                    spent[client],
                    admitted[client]
                );
            }
            before = spent;
        }
        assert!(!saves.is_empty());
    }
}

/// A limiter's file loaded under changed rules: refused by `load_into`;
/// carried over rule by rule by `load_carried_into`, on both engines (the
/// 8 of 10 spent count against a new 5; a rule past the saved ones gets
/// the last one's spend; a client that spent nothing keeps its whole new
/// limit).
#[test]
fn a_limiter_whose_rules_changed_is_refused_or_carried_over() {
    let rules = |text: &str| text.parse::<RuleSet>().unwrap();
    for engine in [Engine::LockFree, Engine::Mutex] {
        let saved_under = build_rules::<u64, _>(
            &rules("fixed-window:10/1h"),
            engine,
            ms_clock(0),
            Bounds::new(),
        )
        .unwrap();
        for _ in 0..8 {
            saved_under.check_at(&1, 10);
        }
        saved_under.check_at(&2, 10);
        saved_under.remaining_at(&3, 10);
        let file = Scratch::new("carried");
        state::save(&*saved_under, &file.0).unwrap();
        let saved = Saved::read(&file.0).unwrap();
        for (now_rules, one, two, three) in [
            ("fixed-window:5/1h", 0, 4, 5),
            ("fixed-window:5/1h,gcra:20/1h", 0, 4, 5),
            ("sliding-window:12/1h", 4, 11, 12),
        ] {
            let changed =
                build_rules::<u64, _>(&rules(now_rules), engine, ms_clock(20), Bounds::new())
                    .unwrap();
            let error = saved.load_into(&*changed).unwrap_err().to_string();
            assert!(
                error.contains("saved under the rules fixed-window:10/1h"),
                "{error}"
            );
            assert_eq!(changed.tracked_clients(), 0);
            assert_eq!(
                saved.load_carried_into(&*changed).unwrap(),
                3,
                "{engine} {now_rules}"
            );
            let left = [1, 2, 3].map(|client| changed.remaining_at(&client, 20));
            assert_eq!(left, [one, two, three], "{engine} {now_rules}");
        }
        // Under the same rules, exactly `load_into`.
        let same = build_rules::<u64, _>(
            &rules("fixed-window:10/1h"),
            engine,
            ms_clock(20),
            Bounds::new(),
        )
        .unwrap();
        saved.load_carried_into(&*same).unwrap();
        assert_eq!(same.remaining_at(&1, 20), 2);
    }
}

/// A table growth that begins while a save walks the table (here, made by
/// the save's own first visit, so the order is certain): every client
/// that was there before the save is in it once, the ones the move took
/// on to the new table included.
#[test]
fn a_growth_during_a_save_loses_no_client() {
    let rules: RuleSet = "gcra:5/1000ticks".parse().unwrap();
    let limiter = on(Engine::LockFree, &rules, Bounds::new());
    for client in 0..1_000u64 {
        limiter.check_at(&client, 0);
    }
    let mut seen = Vec::new();
    let mut grown = false;
    limiter.save_clients(&mut |_, key: &u64, _| {
        if !grown {
            grown = true;
            for client in 1_000..20_000u64 {
                limiter.check_at(&client, 0);
            }
        }
        seen.push(*key);
    });
    seen.sort_unstable();
    let before: Vec<u64> = seen.iter().copied().filter(|&k| k < 1_000).collect();
    assert_eq!(before, (0..1_000).collect::<Vec<_>>());
}

// ------------------------------------------------- load_or_new and Saver

/// A directory of this test's own, not made until the test makes it,
/// removed with what it holds when dropped.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(name: &str) -> Self {
        Self(Scratch::new(name).0.with_extension("dir"))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A limiter of `rules` on a millisecond manual clock starting at
/// `start`, as `load_or_new`'s `build` makes it.
fn ms_limiter(
    rules: &str,
    start: u64,
) -> Result<std::sync::Arc<dyn RateLimiter<str>>, floodgate::ConfigError> {
    build_rules::<str, _>(
        &rules.parse().unwrap(),
        Engine::LockFree,
        ms_clock(start),
        Bounds::new(),
    )
}

/// Waits until `done` holds, checking every 5 ms; fails the test if it
/// does not within 30 s (a saver that never saves, not a slow one).
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let patience = Duration::from_secs(30);
    let start = std::time::Instant::now();
    // Ends when `done` holds, or fails the test past `patience`.
    while !done() {
        assert!(
            start.elapsed() < patience,
            "{what}: not within {patience:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The clients a file holds, 0 while it cannot be read.
fn clients_in(path: &std::path::Path) -> usize {
    Saved::read(path).map_or(0, |saved| saved.clients())
}

/// Without a file, `build` makes the limiter with its clock at 0; with
/// one, its clock goes on from the save's and every client is loaded.
#[test]
fn load_or_new_builds_without_a_file_and_loads_with_one() {
    let file = Scratch::new("load-or-new");
    let mut starts = Vec::new();
    let mut build = |start| {
        starts.push(start);
        ms_limiter("fixed-window:3/1h", start)
    };
    let first = state::load_or_new(&file.0, &mut build).unwrap();
    assert_eq!(first.tracked_clients(), 0);
    for client in ["ana", "ana", "ben", "ana"] {
        assert!(first.check(client).allowed());
    }
    state::save(&*first, &file.0).unwrap();
    let again = state::load_or_new(&file.0, &mut build).unwrap();
    assert_eq!(again.tracked_clients(), 2);
    // The clock of the save (still 0: a manual clock never set) plus the
    // wall-clock milliseconds since, a few at most on any machine.
    assert_eq!(starts[0], 0);
    let since = starts[1];
    assert!(since < 60_000, "{starts:?}");
    assert_eq!(again.remaining_at("ana", since), 0);
    assert!(!again.check_at("ana", since).allowed());
    assert_eq!(again.remaining_at("ben", since), 2);
    assert_eq!(again.remaining_at("cleo", since), 3);
}

/// A file that exists but cannot be read whole is an error that names it,
/// never replaced by a new limiter: `build` is not called and the file is
/// left as it was. Under other rules it is refused as `load_into` refuses
/// it; `build`'s own error is named too.
#[test]
fn load_or_new_refuses_a_corrupt_file_and_other_rules() {
    let file = Scratch::new("load-or-new-corrupt");
    std::fs::write(&file.0, b"not a state file").unwrap();
    let mut built = 0;
    let error = state::load_or_new(&file.0, |start| {
        built += 1;
        ms_limiter("gcra:3/1h", start)
    })
    .err()
    .expect("refused");
    assert_eq!(built, 0);
    assert!(!error.is_missing());
    let message = error.to_string();
    assert!(message.contains("not a floodgate state file"), "{message}");
    assert!(message.contains(&*file.0.to_string_lossy()), "{message}");
    assert_eq!(std::fs::read(&file.0).unwrap(), b"not a state file");

    let saved = ms_limiter("gcra:3/1h", 0).unwrap();
    saved.check_at("ana", 0);
    state::save(&*saved, &file.0).unwrap();
    let error = state::load_or_new(&file.0, |start| ms_limiter("gcra:5/1h", start))
        .err()
        .expect("refused");
    assert!(error.is_other_rules(), "{error}");

    let refuses_everyone = Bounds::new().max_clients(0);
    let error = state::load_or_new(&file.0, |start| {
        build_rules::<str, _>(
            &"gcra:3/1h".parse().unwrap(),
            Engine::LockFree,
            ms_clock(start),
            refuses_everyone,
        )
    })
    .err()
    .expect("refused")
    .to_string();
    assert!(
        error.starts_with("cannot build the limiter for "),
        "{error}"
    );
}

/// A saver saves every interval on its own thread: each client checked
/// is in the file within a few intervals, with no call of the test's.
#[test]
fn a_saver_saves_every_interval() {
    let file = Scratch::new("saver-interval");
    let limiter = ms_limiter("gcra:3/1h", 0).unwrap();
    let saver = state::Saver::spawn(
        std::sync::Arc::clone(&limiter),
        &file.0,
        Duration::from_millis(10),
    );
    assert_eq!(saver.interval(), Some(Duration::from_millis(10)));
    limiter.check("ana");
    eventually("the first save", || clients_in(&file.0) == 1);
    limiter.check("ben");
    eventually("a later save", || clients_in(&file.0) == 2);
    // Counted once its file is in place: a moment after the test saw it.
    eventually("two saves counted", || saver.saves() >= 2);
    assert_eq!(saver.failures(), 0);
    assert!(saver.last_error().is_none());
}

/// A saver saves once more when dropped (here, long before its first
/// interval ends), and `stop` does the same, answering what it saved.
#[test]
fn a_saver_saves_at_its_drop_and_its_stop() {
    let file = Scratch::new("saver-drop");
    let limiter = ms_limiter("gcra:3/1h", 0).unwrap();
    let saver = state::Saver::spawn(
        std::sync::Arc::clone(&limiter),
        &file.0,
        Duration::from_secs(3_600),
    );
    limiter.check("ana");
    assert!(!file.0.exists());
    drop(saver);
    assert_eq!(clients_in(&file.0), 1);

    let saver = state::Saver::new(std::sync::Arc::clone(&limiter), &file.0);
    assert_eq!(saver.interval(), None);
    limiter.check("ben");
    let summary = saver.stop().unwrap();
    assert_eq!(summary.clients, 2);
    assert_eq!(clients_in(&file.0), 2);
    limiter.check("cleo");
    drop(saver); // stopped already: no second save
    assert_eq!(clients_in(&file.0), 2);
    assert_eq!(limiter.tracked_clients(), 3);
}

/// A path whose directory does not exist: every periodic save fails and
/// is counted, with the last error; once the directory is made, the next
/// save succeeds and the last error is cleared.
#[test]
fn a_saver_counts_its_failures_and_recovers_when_the_path_can_be_written() {
    let dir = ScratchDir::new("saver-recovers");
    let path = dir.0.join("limits.state");
    let limiter = ms_limiter("gcra:3/1h", 0).unwrap();
    limiter.check("ana");
    let saver = state::Saver::spawn(
        std::sync::Arc::clone(&limiter),
        &path,
        Duration::from_millis(10),
    );
    eventually("two failed saves", || saver.failures() >= 2);
    assert_eq!(saver.saves(), 0);
    let error = saver
        .last_error()
        .expect("the last save failed")
        .to_string();
    assert!(
        error.starts_with(&format!("cannot save to {}: ", path.display())),
        "{error}"
    );
    std::fs::create_dir(&dir.0).unwrap();
    eventually("a save once the directory is there", || saver.saves() >= 1);
    assert!(saver.last_error().is_none());
    assert_eq!(clients_in(&path), 1);
    let failures = saver.failures();
    drop(saver);
    assert!(failures >= 2);
}

/// The stop's save is tried three times before it gives up, each attempt
/// counted, and answers the last error.
#[test]
fn the_stops_save_tries_three_times_then_gives_up() {
    let dir = ScratchDir::new("saver-gives-up");
    let path = dir.0.join("limits.state");
    let limiter = ms_limiter("gcra:3/1h", 0).unwrap();
    limiter.check("ana");
    let saver = state::Saver::new(limiter, &path);
    let error = saver.stop().unwrap_err();
    assert_eq!(error.path(), path);
    assert_eq!((saver.saves(), saver.failures()), (0, 3));
    assert!(!path.exists());
}

/// `check_writable`: a directory that exists takes the check's file and
/// keeps nothing of it; a missing directory and a path that is a directory
/// are refused, named.
#[test]
fn check_writable_finds_a_path_that_cannot_be_written() {
    let dir = ScratchDir::new("writable");
    let path = dir.0.join("limits.state");
    let error = state::check_writable(&path).unwrap_err().to_string();
    assert_eq!(
        error.split(": ").take(2).collect::<Vec<_>>(),
        [
            format!("cannot save to {}", path.display()),
            format!("a file cannot be created in {}", dir.0.display()),
        ],
        "{error}"
    );
    std::fs::create_dir(&dir.0).unwrap();
    state::check_writable(&path).unwrap();
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 0);
    let error = state::check_writable(&dir.0).unwrap_err().to_string();
    assert_eq!(
        error,
        format!("cannot save to {}: it is a directory", dir.0.display())
    );
}
