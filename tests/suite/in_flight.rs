//! `in-flight` rules (the contract's "Requests in flight"): alone and beside
//! rate rules, on both engines, call by call against each other and against
//! the contract's own model; held units survive bounded memory; threads
//! holding and releasing at a frozen clock leave exact totals; permits
//! release once however their request ends, panics included.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use floodgate::permit::Permit;
use floodgate::policy::{Pair, WindowPair};
use floodgate::{build_rules, Bounds, Engine, ManualClock, Overflow, RateLimiter, RuleSet};
use proptest::prelude::*;
use proptest::sample::select;

fn built(rules: &RuleSet, engine: Engine, bounds: Bounds) -> Arc<dyn RateLimiter<u64>> {
    build_rules::<u64, _>(rules, engine, ManualClock::new(0), bounds)
        .unwrap_or_else(|e| panic!("{rules}: {e}"))
}

/// Rule sets with an `in-flight` rule: alone, twice, beside a drip rule, a
/// window rule, a log, and three rules.
fn rules() -> impl Strategy<Value = RuleSet> {
    select(vec![
        "in-flight:1",
        "in-flight:3",
        "in-flight:2,in-flight:5",
        "gcra:3/10ticks,in-flight:2",
        "leaky-bucket:3/9ticks,in-flight:2",
        "in-flight:4,token-bucket:5/20ticks",
        "fixed-window:4/10ticks,in-flight:3",
        "sliding-window-counter:5/10ticks,in-flight:2",
        "sliding-window:3/10ticks,in-flight:2",
        "gcra:4/8ticks,fixed-window:6/30ticks,in-flight:3",
    ])
    .prop_map(|text| text.parse().unwrap())
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Check(u64),
    Release(u64),
    Refund(u64, u64),
    Remaining,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..=4u64).prop_map(Op::Check),
        3 => (0..=3u64).prop_map(Op::Release),
        1 => (1..=3u64, 0..=12u64).prop_map(|(cost, ago)| Op::Refund(cost, ago)),
        1 => Just(Op::Remaining),
    ]
}

/// `(client, step, op)`: times never decrease per trace.
fn trace() -> impl Strategy<Value = Vec<(u64, u64, Op)>> {
    prop::collection::vec((0..3u64, 0..4u64, op()), 1..80)
}

/// What an answer is, for comparing the engines.
#[derive(Debug, PartialEq)]
enum Answer {
    Decision(floodgate::Decision),
    Units(u64),
}

fn call(limiter: &dyn RateLimiter<u64>, client: u64, now: u64, op: Op) -> Answer {
    match op {
        Op::Check(cost) => Answer::Decision(limiter.check_n_at(&client, now, cost)),
        Op::Release(cost) => Answer::Units(limiter.release_at(&client, now, cost)),
        Op::Refund(cost, ago) => {
            Answer::Units(limiter.refund_at(&client, now, now.saturating_sub(ago), cost))
        }
        Op::Remaining => Answer::Units(limiter.remaining_at(&client, now)),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Both engines answer every call alike, which rule refused included.
    #[test]
    fn both_engines_answer_alike(rules in rules(), trace in trace()) {
        let lock_free = built(&rules, Engine::LockFree, Bounds::new());
        let mutex = built(&rules, Engine::Mutex, Bounds::new());
        let mut now = 0;
        for (i, &(client, step, op)) in trace.iter().enumerate() {
            now += step;
            let expected = call(&*mutex, client, now, op);
            let got = call(&*lock_free, client, now, op);
            prop_assert_eq!(got, expected, "{}: call {} {:?} at {}", rules, i, op, now);
        }
    }

    /// `in-flight:L` alone is the contract's model: admitted iff
    /// `h + n <= L`, a release gives back `min(n, h)`, a refund nothing,
    /// and time changes nothing.
    #[test]
    fn alone_it_is_the_contracts_model(limit in 1..=5u64, trace in trace()) {
        let rules: RuleSet = format!("in-flight:{limit}").parse().unwrap();
        for engine in [Engine::LockFree, Engine::Mutex] {
            let limiter = built(&rules, engine, Bounds::new());
            let mut held = [0u64; 3];
            let mut now = 0;
            for &(client, step, op) in &trace {
                now += step;
                let h = &mut held[client as usize];
                match call(&*limiter, client, now, op) {
                    Answer::Decision(d) => {
                        let Op::Check(cost) = op else { unreachable!() };
                        let admit = *h + cost <= limit;
                        prop_assert_eq!(d.allowed(), admit);
                        if admit {
                            *h += cost;
                            prop_assert_eq!(d.remaining(), limit - *h);
                        } else {
                            prop_assert_eq!(d.remaining(), limit - *h);
                            prop_assert_eq!(d.retry_after(), None);
                        }
                    }
                    Answer::Units(units) => match op {
                        Op::Release(cost) => {
                            prop_assert_eq!(units, cost.min(*h));
                            *h -= units;
                        }
                        Op::Refund(..) => prop_assert_eq!(units, 0),
                        Op::Remaining => prop_assert_eq!(units, limit - *h),
                        Op::Check(_) => unreachable!(),
                    },
                }
            }
        }
    }
}

/// A refund gives nothing back to an `in-flight` rule and leaves it out of
/// its answer: beside a drip rule, the answer is the drip rule's; a
/// release gives back only the held units.
#[test]
fn a_refund_and_a_release_each_give_back_their_own() {
    let rules: RuleSet = "gcra:3/30ticks,in-flight:2".parse().unwrap();
    for engine in [Engine::LockFree, Engine::Mutex] {
        let limiter = built(&rules, engine, Bounds::new());
        let admitted = limiter.check_n_at(&1, 0, 2);
        assert!(admitted.allowed());
        assert!(!limiter.check_at(&1, 0).allowed(), "{engine:?}: both held");
        assert_eq!(
            limiter.refund_at(&1, 0, 0, 2),
            2,
            "{engine:?}: the rate rule's"
        );
        assert!(!limiter.check_at(&1, 0).allowed(), "{engine:?}: still held");
        assert_eq!(limiter.release_at(&1, 0, 2), 2, "{engine:?}");
        assert_eq!(limiter.release_at(&1, 0, 2), 0, "{engine:?}: nothing held");
        assert_eq!(limiter.remaining_at(&1, 0), 2, "{engine:?}");
        assert_eq!(limiter.release_at(&9, 0, 1), 0, "{engine:?}: no client");
        assert_eq!(
            limiter.peek_at(&9, 0),
            None,
            "{engine:?}: a release creates nothing"
        );
    }
}

/// A cap full of clients that hold units, and a flood of newcomers: no
/// holder is evicted (held units are never idle), the cap holds, and every
/// holder's release gives its unit back.
#[test]
fn bounded_memory_never_forgets_held_units() {
    let rules: RuleSet = "gcra:10/10ticks,in-flight:1".parse().unwrap();
    for engine in [Engine::LockFree, Engine::Mutex] {
        let bounds = Bounds::new()
            .evict_idle()
            .max_clients(1_000)
            .on_overflow(Overflow::Reject);
        let limiter = built(&rules, engine, bounds);
        for client in 0..1_000 {
            assert!(limiter.check_at(&client, 0).allowed());
        }
        let mut refused = 0;
        for client in 1_000..101_000u64 {
            // Long after every rate rule forgot the holders.
            refused += usize::from(!limiter.check_at(&client, 1_000 + client).allowed());
            if client % 10_000 == 0 {
                limiter.sweep_at(1_000 + client);
            }
        }
        assert_eq!(refused, 100_000, "{engine:?}: no room while all hold");
        assert!(limiter.tracked_clients() <= 1_000, "{engine:?}");
        for client in 0..1_000 {
            assert!(
                !limiter.check_at(&client, 200_000).allowed(),
                "{engine:?}: {client} still holds its unit"
            );
            assert_eq!(limiter.release_at(&client, 200_000, 1), 1, "{engine:?}");
        }
        assert_eq!(
            limiter.sweep_at(200_001),
            1_000,
            "{engine:?}: idle once released"
        );
    }
}

/// Four threads take and give back units of a few clients at a frozen
/// clock: every admission is released once, so every client ends holding
/// nothing, and no client ever held more than its limit (each admission's
/// `remaining` is at least 0, which the step's arithmetic would break).
#[test]
fn threads_holding_and_releasing_leave_exact_totals() {
    let rules: RuleSet = "in-flight:3,gcra:1000000/1000000ticks".parse().unwrap();
    for engine in [Engine::LockFree, Engine::Mutex] {
        let limiter = built(&rules, engine, Bounds::new());
        let barrier = Arc::new(Barrier::new(4));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (limiter, barrier) = (Arc::clone(&limiter), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    let (mut admitted, mut released) = (0u64, 0u64);
                    for i in 0..20_000u64 {
                        let client = (i + t) % 4;
                        if limiter.check_at(&client, 0).allowed() {
                            admitted += 1;
                            released += limiter.release_at(&client, 0, 1);
                        }
                    }
                    (admitted, released)
                })
            })
            .collect();
        let (mut admitted, mut released) = (0, 0);
        for thread in threads {
            let (a, r) = thread.join().unwrap();
            admitted += a;
            released += r;
        }
        assert_eq!(
            released, admitted,
            "{engine:?}: every admission released once"
        );
        for client in 0..4 {
            assert_eq!(limiter.release_at(&client, 0, 5), 0, "{engine:?}");
        }
        assert!(admitted > 0);
    }
}

/// `forget` removes a client that holds units, held units and all: its
/// next request starts from nothing held, and a release of the old units
/// afterwards finds none, unless the client was admitted again meanwhile:
/// releases go by key, so it then releases the newer request's unit
/// (docs/in-flight.md says both).
#[test]
fn forget_drops_held_units() {
    let rules: RuleSet = "in-flight:1".parse().unwrap();
    for engine in [Engine::LockFree, Engine::Mutex] {
        let limiter = built(&rules, engine, Bounds::new());
        assert!(limiter.check_at(&1, 0).allowed());
        assert!(!limiter.check_at(&1, 0).allowed());
        assert!(limiter.forget(&1), "{engine:?}");
        assert_eq!(
            limiter.release_at(&1, 0, 1),
            0,
            "{engine:?}: nothing held now"
        );
        assert!(
            limiter.check_at(&1, 0).allowed(),
            "{engine:?}: a fresh client"
        );
        assert_eq!(limiter.release_at(&1, 0, 1), 1, "{engine:?}");

        // A permit of the forgotten client, released after a newer
        // admission, releases that admission's unit: never more than held.
        let old = Permit::acquire(&limiter, &2, 1).unwrap();
        assert!(limiter.forget(&2));
        let new = Permit::acquire(&limiter, &2, 1).unwrap();
        assert_eq!(old.release(), 1, "{engine:?}: by key");
        assert_eq!(new.release(), 0, "{engine:?}: nothing left to release");
        assert_eq!(limiter.remaining_at(&2, 0), 1, "{engine:?}");
    }
}

/// An `in-flight` rule beside one one-word rate rule (or another
/// `in-flight` rule) is decided in one 16-byte word, as two drip rules
/// are; beside a window rule it takes the general several-rules design.
#[test]
fn an_in_flight_rule_beside_a_one_word_rule_is_a_pair() {
    for text in [
        "gcra:3/10ticks,in-flight:2",
        "in-flight:4,token-bucket:5/20ticks",
        "leaky-bucket:3/9ticks,in-flight:1",
        "in-flight:2,in-flight:5",
    ] {
        assert!(Pair::fits(&text.parse().unwrap()), "{text}");
    }
    for text in [
        "fixed-window:4/10ticks,in-flight:3",
        "sliding-window-counter:5/10ticks,in-flight:2",
    ] {
        let rules: RuleSet = text.parse().unwrap();
        assert!(!Pair::fits(&rules) && !WindowPair::fits(&rules), "{text}");
    }
}

/// The shared overflow state cannot hold in-flight units (no release
/// would find it): a typed error on both engines, in a registry of tiers
/// at its build and at a reload, never a limiter that fills for ever.
#[test]
fn a_shared_overflow_state_refuses_in_flight_rules() {
    use floodgate::tiers::Tiers;
    use floodgate::ConfigError;
    let shared = Bounds::new().max_clients(10).on_overflow(Overflow::Shared);
    let rules: RuleSet = "gcra:3/10ticks,in-flight:2".parse().unwrap();
    for engine in [Engine::LockFree, Engine::Mutex] {
        let built = build_rules::<u64, _>(&rules, engine, ManualClock::new(0), shared);
        assert_eq!(
            built.err(),
            Some(ConfigError::SharedOverflowHolds),
            "{engine:?}"
        );
        let rejecting = shared.on_overflow(Overflow::Reject);
        assert!(build_rules::<u64, _>(&rules, engine, ManualClock::new(0), rejecting).is_ok());
    }
    let tiers = Tiers::<String, _, _>::with_clock_rules(
        "free",
        "gcra:3/10ticks".parse().unwrap(),
        |_: &str| "free",
        ManualClock::new(0),
    )
    .unwrap()
    .with_bounds(shared)
    .unwrap();
    let reload = tiers.reload_rules("free", rules.clone()).unwrap_err();
    assert!(reload.to_string().contains("shared overflow"), "{reload}");
    assert!(tiers.with_tier_rules("pro", rules).is_err());
}

/// A counting limiter counts the units released and the refusals by an
/// `in-flight` rule apart from the rate rule's, on both engines and in a
/// tier; a refusal feeds the offenders' summary as any other.
#[test]
fn releases_and_in_flight_refusals_are_counted() {
    let rules: RuleSet = "gcra:3/1000ticks,in-flight:2".parse().unwrap();
    for engine in [Engine::LockFree, Engine::Mutex] {
        let limiter = floodgate::Builder::from_rules(&rules)
            .engine(engine)
            .clock(ManualClock::new(0))
            .counting(true)
            .build::<u64>()
            .unwrap();
        assert!(limiter.check_n_at(&1, 0, 2).allowed());
        assert!(!limiter.check_at(&1, 0).allowed(), "held: in-flight");
        assert_eq!(limiter.release_at(&1, 0, 2), 2);
        assert!(!limiter.check_n_at(&1, 0, 2).allowed(), "the rate rule");
        assert!(limiter.check_at(&1, 0).allowed());
        assert_eq!(limiter.release_at(&1, 0, 5), 1);
        let stats = limiter.stats().expect("a limiter in memory keeps stats");
        assert_eq!((stats.admitted, stats.rejected), (2, 2), "{engine:?}");
        assert_eq!(stats.in_flight_rejected, 1, "{engine:?}");
        assert_eq!(stats.released_units, 3, "{engine:?}");
        assert_eq!(
            stats.admitted_units - stats.released_units,
            0,
            "{engine:?}: none held"
        );
    }
    let tiers = floodgate::tiers::Tiers::<String, _, _>::with_clock_rules(
        "free",
        rules,
        |_: &str| "free",
        ManualClock::new(0),
    )
    .unwrap()
    .counting(true);
    assert!(tiers.check_n_at("a", 0, 2).allowed());
    assert!(!tiers.check_at("a", 0).allowed());
    assert_eq!(tiers.release_at("a", 0, 1), 1);
    let stats = tiers.stats();
    assert_eq!(
        (stats.in_flight_rejected, stats.released_units),
        (1, 1),
        "tiers"
    );
}

/// A permit releases its units once, however its request ends: dropped,
/// released, or unwound by a panic; a detached one leaves them held for a
/// release by key; an `Arc`'s permit moves to another thread.
#[test]
fn a_permit_releases_once_however_its_request_ends() {
    let rules: RuleSet = "in-flight:3,gcra:100/100ticks".parse().unwrap();
    for engine in [Engine::LockFree, Engine::Mutex] {
        let limiter = built(&rules, engine, Bounds::new());
        let dropped = Permit::acquire(&limiter, &1, 2).unwrap();
        assert_eq!(dropped.units(), 2);
        assert_eq!(dropped.decision().remaining(), 1);
        let refused = Permit::acquire(&limiter, &1, 2).unwrap_err();
        assert_eq!(
            refused.refused_by(),
            Some(0),
            "{engine:?}: the in-flight rule"
        );
        assert_eq!(refused.retry_after(), None, "{engine:?}");
        drop(dropped);
        assert_eq!(limiter.remaining_at(&1, 0), 3, "{engine:?}: dropped");

        let released = Permit::acquire(&limiter, &1, 3).unwrap();
        assert_eq!(released.release(), 3, "{engine:?}");
        assert_eq!(limiter.remaining_at(&1, 0), 3, "{engine:?}: not twice");

        let unwound = catch_unwind(AssertUnwindSafe(|| {
            let _permit = Permit::acquire(&limiter, &1, 3).unwrap();
            assert_eq!(limiter.remaining_at(&1, 0), 0);
            resume_unwind(Box::new("the handler failed"));
        }));
        assert!(unwound.is_err());
        assert_eq!(limiter.remaining_at(&1, 0), 3, "{engine:?}: unwound");

        let detached = Permit::acquire(&limiter, &1, 2).unwrap();
        assert_eq!(detached.detach(), 2);
        assert_eq!(limiter.remaining_at(&1, 0), 1, "{engine:?}: still held");
        assert_eq!(limiter.release_at(&1, 0, 2), 2, "{engine:?}");

        let owned = Permit::acquire(Arc::clone(&limiter), &1, 1).unwrap();
        std::thread::spawn(move || drop(owned)).join().unwrap();
        assert_eq!(limiter.remaining_at(&1, 0), 3, "{engine:?}: owned");
    }
}

/// Four threads hold permits of a few clients at a frozen clock, and one
/// request in five unwinds while it holds one. Each thread counts the
/// permits it sees alive per client (raised after the admission, lowered
/// before the release), so the count never exceeds what the limiter
/// holds: it never passes the limit, no unit leaks (every client ends
/// holding none) and every admission was released once.
#[test]
fn permits_under_panics_leave_exact_totals() {
    const LIMIT: u64 = 3;
    let rules: RuleSet = "in-flight:3,gcra:1000000/1000000ticks".parse().unwrap();
    for engine in [Engine::LockFree, Engine::Mutex] {
        let limiter = built(&rules, engine, Bounds::new());
        let alive: Arc<[AtomicU64; 4]> = Arc::new(Default::default());
        let most = Arc::new(AtomicU64::new(0));
        let barrier = Arc::new(Barrier::new(4));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (limiter, barrier) = (Arc::clone(&limiter), Arc::clone(&barrier));
                let (alive, most) = (Arc::clone(&alive), Arc::clone(&most));
                std::thread::spawn(move || {
                    barrier.wait();
                    let (mut admitted, mut unwound) = (0u64, 0u64);
                    for i in 0..20_000u64 {
                        let client = (i + t) % 4;
                        let run = catch_unwind(AssertUnwindSafe(|| {
                            let Ok(permit) = Permit::acquire(&limiter, &client, 1) else {
                                return false;
                            };
                            let count = &alive[client as usize];
                            let now = count.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            count.fetch_sub(1, Ordering::SeqCst);
                            if i % 5 == 0 {
                                resume_unwind(Box::new(i));
                            }
                            assert_eq!(permit.release(), 1);
                            true
                        }));
                        match run {
                            Ok(held) => admitted += u64::from(held),
                            Err(_) => unwound += 1,
                        }
                    }
                    (admitted, unwound)
                })
            })
            .collect();
        let (mut admitted, mut unwound) = (0, 0);
        for thread in threads {
            let (a, u) = thread.join().unwrap();
            admitted += a;
            unwound += u;
        }
        assert!(admitted > 0 && unwound > 0, "{engine:?}");
        let most = most.load(Ordering::SeqCst);
        assert!(most <= LIMIT, "{engine:?}: {most} permits alive at once");
        for client in 0..4 {
            assert_eq!(limiter.release_at(&client, 0, 5), 0, "{engine:?}: leaked");
            assert_eq!(limiter.remaining_at(&client, 0), LIMIT, "{engine:?}");
        }
    }
}

/// A reservation's end is its request's end, however it comes: settled,
/// kept, dropped unsettled (either way), unwound. Each releases what its
/// `in-flight` rules hold there, once, on both engines and beside rate
/// rules (which get back what the ending gives back, never more): the
/// client that reserved and finished can always reserve again. Before,
/// the third reservation under `in-flight:2` was refused for good.
#[test]
fn a_reservation_releases_its_in_flight_units_however_it_ends() {
    use floodgate::reservation::{Reservation, Unsettled};

    for text in [
        "in-flight:2",
        "in-flight:2,gcra:100/1s",
        "in-flight:2,fixed-window:100/1h,sliding-window:50/1s",
    ] {
        let rules: RuleSet = text.parse().unwrap();
        for engine in [Engine::LockFree, Engine::Mutex] {
            let limiter = built(&rules, engine, Bounds::new().evict_idle());
            let held = || 2 - limiter.remaining_at(&7, 0).min(2);
            let at = |what: &str| format!("{text}, {engine:?}: {what}");

            // The trace: dropped unsettled, settled at 0, then a
            // third is admitted.
            drop(Reservation::new(&*limiter, &7, 1).unwrap());
            assert_eq!(held(), 0, "{}", at("dropped"));
            // A refund gives nothing back to an `in-flight` rule (its
            // release does): the settle's answer is the rate rules'.
            let refunded = u64::from(rules.len() > 1);
            assert_eq!(
                Reservation::new(&*limiter, &7, 1).unwrap().settle(0),
                refunded,
                "{}",
                at("settled at 0: the unit given back")
            );
            assert_eq!(held(), 0, "{}", at("settled"));
            let third = Reservation::new(&*limiter, &7, 1);
            assert!(third.is_ok(), "{}", at("the third"));
            drop(third);

            // Settled with some used: the rate rules keep what was used,
            // the in-flight rule holds nothing.
            let used = Reservation::new(&*limiter, &7, 2).unwrap();
            assert_eq!(held(), 2, "{}", at("two held"));
            let refused = Reservation::new(&*limiter, &7, 1).unwrap_err();
            assert_eq!(refused.retry_after(), None, "{}", at("only a release"));
            let given = used.settle(1);
            assert!(given <= 1, "{}", at("at most the rest"));
            assert_eq!(held(), 0, "{}", at("settled at 1"));

            // Kept, by `keep` and by a drop made to keep.
            Reservation::new(&*limiter, &7, 1).unwrap().keep();
            assert_eq!(held(), 0, "{}", at("kept"));
            drop(Reservation::with(&*limiter, &7, 2, Unsettled::Keep).unwrap());
            assert_eq!(held(), 0, "{}", at("dropped, kept"));

            // Unwound while it holds.
            let unwound = catch_unwind(AssertUnwindSafe(|| {
                let _call = Reservation::new(&*limiter, &7, 2).unwrap();
                assert_eq!(held(), 2);
                resume_unwind(Box::new("the handler failed"));
            }));
            assert!(unwound.is_err());
            assert_eq!(held(), 0, "{}", at("unwound"));

            // Never twice: a release of its own after the end finds nothing.
            Reservation::new(&*limiter, &7, 1).unwrap().settle(1);
            assert_eq!(limiter.release_at(&7, 0, 1), 0, "{}", at("not twice"));

            // And again and again: every ending leaves the client free.
            for round in 0..50u64 {
                let call = Reservation::new(&*limiter, &7, 1)
                    .unwrap_or_else(|refused| panic!("{}: {refused:?}", at("round")));
                match round % 3 {
                    0 => drop(call),
                    1 => {
                        call.settle(0);
                    }
                    _ => {
                        call.settle(2);
                    }
                }
                assert_eq!(held(), 0, "{}", at("round"));
            }
            // Nothing held: an idle client, removed by a sweep.
            limiter.sweep_at(u64::MAX / 4);
            assert_eq!(limiter.peek_at(&7, u64::MAX / 4), None, "{}", at("idle"));
        }
    }
}
