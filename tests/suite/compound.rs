//! Several limits on one client (the contract's section of that name): on
//! random traces of 2–3 rules of every policy mix, with costs, bounds and
//! time going backwards, both engines answer alike; on traces whose times
//! never decrease, every answer is the contract's, computed from each rule
//! alone; and racing threads spend every rule together or none.

use super::support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use floodgate::policy::{Compound, Pair};
use floodgate::{
    build_rules, build_with, Bounds, Builder, Config, Decision, Engine, Limiter, ManualClock,
    Overflow, PolicyKind, RateLimiter, Rule, RuleSet,
};
use proptest::prelude::*;
use proptest::sample::select;
use support::{run, Answer, Call, Op};

/// A rule in ticks: small limits, so that traces reach them.
fn rule() -> impl Strategy<Value = Rule> {
    (select(PolicyKind::ALL.to_vec()), 1..=6u64, 1..=40u64).prop_map(|(policy, limit, window)| {
        let window = if policy.drips() {
            window.max(limit)
        } else {
            window
        };
        Rule::new(policy, Config::per_ticks(limit, window).unwrap()).unwrap()
    })
}

fn rules() -> impl Strategy<Value = RuleSet> {
    prop::collection::vec(rule(), 2..=3).prop_map(|rules| RuleSet::new(rules).unwrap())
}

/// Costs the contract singles out: 0, within every limit, above some.
fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Allow),
        3 => prop_oneof![Just(0u64), 1..=3u64, 4..=8u64, Just(u64::MAX)].prop_map(Op::AllowN),
        1 => Just(Op::Remaining),
        2 => (prop_oneof![Just(0u64), 1..=3u64, 4..=8u64, Just(u64::MAX)], prop_oneof![Just(0u64), 1..=45u64])
            .prop_map(|(cost, back)| Op::Refund { cost, back }),
    ]
}

/// A call that moved a client's state, to replay on each rule alone:
/// `(now, cost, None)` an admission, `(now, cost, Some(at))` a refund of
/// the admission at `at`.
type Moved = (u64, u64, Option<u64>);

/// A trace of up to three clients; `back` lets time step back as well.
fn trace(back: bool) -> impl Strategy<Value = Vec<Call>> {
    let delta = if back { -30i64..=40 } else { 0i64..=40 };
    prop::collection::vec(
        (
            0..3u64,
            op(),
            prop_oneof![3 => Just(0i64), 2 => delta],
            prop_oneof![3 => Just(1usize), 1 => 2..=8usize],
        ),
        1..40,
    )
    .prop_map(|steps| {
        let mut at: u64 = 1_000;
        let mut trace = Vec::new();
        for (client, op, delta, repeat) in steps {
            at = at.saturating_add_signed(delta);
            trace.extend((0..repeat).map(|_| Call { op, client, at }));
        }
        trace
    })
}

fn bounds() -> impl Strategy<Value = Bounds> {
    prop_oneof![
        2 => Just(Bounds::new()),
        1 => Just(Bounds::new().evict_idle()),
        2 => (1..=2usize, select(vec![Overflow::Reject, Overflow::Admit, Overflow::Shared]))
            .prop_map(|(cap, overflow)| Bounds::new().evict_idle().max_clients(cap).on_overflow(overflow)),
    ]
}

fn built(rules: &RuleSet, engine: Engine, bounds: Bounds) -> Arc<dyn RateLimiter<u64>> {
    build_rules::<u64, _>(rules, engine, ManualClock::new(0), bounds)
        .unwrap_or_else(|e| panic!("{rules}: {e}"))
}

/// The general design on any rules, two one-word ones included (which the
/// factory gives a [`Pair`]).
fn compound(rules: &RuleSet, bounds: Bounds) -> Limiter<u64, Compound, ManualClock> {
    Limiter::with_bounds(
        Compound::from_rules(rules).unwrap(),
        ManualClock::new(0),
        bounds,
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Both engines answer every call alike, which rule refused included,
    /// under every bound, on traces whose times never decrease per client
    /// (the contract's exact setting, as `tests/suite/differential.rs`).
    #[test]
    fn engines_agree_on_several_rules(
        rules in rules(),
        bounds in bounds(),
        trace in trace(false),
    ) {
        let mutex = run(&*built(&rules, Engine::Mutex, bounds), &trace);
        let lock_free = run(&*built(&rules, Engine::LockFree, bounds), &trace);
        for (i, call) in trace.iter().enumerate() {
            prop_assert_eq!(lock_free[i], mutex[i], "{} {:?}: call {} {:?} (lock-free, mutex)", rules, bounds, i, call);
        }
    }

    /// Both lock-free designs answer alike on any rules they both take,
    /// time going backwards included: the 16-byte pair and the frame
    /// run each rule's own step.
    #[test]
    fn both_lock_free_designs_agree(
        rules in rules(),
        bounds in bounds(),
        trace in trace(true),
    ) {
        let lock_free = run(&*built(&rules, Engine::LockFree, bounds), &trace);
        let general = run(&compound(&rules, bounds), &trace);
        for (i, call) in trace.iter().enumerate() {
            prop_assert_eq!(general[i], lock_free[i], "{} {:?}: call {} {:?} (compound, factory's)", rules, bounds, i, call);
        }
    }

    /// Every answer is the contract's, computed from each rule alone: a
    /// fresh one-rule limiter per rule, replayed with the admissions the
    /// several rules made, answers what that rule would say.
    #[test]
    fn several_rules_answer_as_the_contract_says(rules in rules(), trace in trace(false)) {
        for engine in support::ENGINES {
            let limiter = built(&rules, engine, Bounds::new());
            // Per client: its origin, and the calls that moved it so far.
            let mut history: Vec<(u64, Vec<Moved>)> = Vec::new();
            let mut clients: Vec<u64> = Vec::new();
            for (i, call) in trace.iter().enumerate() {
                if matches!(call.op, Op::Refund { .. }) && !clients.contains(&call.client) {
                    // A refund for a client with no state gives nothing and
                    // creates nothing.
                    prop_assert_eq!(support::call(&*limiter, *call), Answer::Refunded(0));
                    prop_assert!(limiter.peek_at(&call.client, call.at).is_none());
                    continue;
                }
                let index = clients.iter().position(|&c| c == call.client).unwrap_or_else(|| {
                    clients.push(call.client);
                    history.push((call.at, Vec::new()));
                    clients.len() - 1
                });
                let (origin, admitted) = &history[index];
                let alone: Vec<Arc<dyn RateLimiter<u64>>> = rules
                    .iter()
                    .map(|rule| {
                        let one = build_with::<u64, _>(rule.policy(), rule.config(), engine, ManualClock::new(0)).unwrap();
                        one.remaining_at(&0, *origin);
                        for &(at, cost, refunded) in admitted {
                            match refunded {
                                None => assert!(one.check_n_at(&0, at, cost).allowed()),
                                Some(of) => {
                                    one.refund_at(&0, at, of, cost);
                                }
                            }
                        }
                        one
                    })
                    .collect();
                let before: Vec<u64> = alone.iter().map(|one| one.remaining_at(&0, call.at)).collect();
                let cost = match call.op {
                    Op::Remaining => {
                        let got = support::call(&*limiter, *call);
                        prop_assert_eq!(got, Answer::Remaining(*before.iter().min().unwrap()), "{} on {}: call {} {:?}", rules, engine, i, call);
                        // Each rule's peek: its own remaining, and what its
                        // own check of one unit would say, nothing spent.
                        let each = limiter.peek_each_at(&call.client, call.at).expect("made by remaining");
                        let next: Vec<Decision> = alone.iter().map(|one| one.check_n_at(&0, call.at, 1)).collect();
                        prop_assert_eq!(each.len(), rules.len());
                        for (r, answer) in each.iter().enumerate() {
                            let context = format!("{rules} on {engine}: call {i} {call:?}, rule {r}: {answer:?}, alone {:?}", next[r]);
                            prop_assert_eq!(answer.rule, *rules.get(r).unwrap(), "{}", context);
                            prop_assert_eq!(answer.decision.remaining(), before[r], "{}", context);
                            prop_assert_eq!(answer.decision.allowed(), next[r].allowed(), "{}", context);
                            prop_assert_eq!(answer.decision.retry_after_ticks(), next[r].retry_after_ticks(), "{}", context);
                        }
                        prop_assert_eq!(limiter.peek_each_at(&call.client, call.at), Some(each), "nothing spent");
                        continue;
                    }
                    Op::AllowN(cost) => cost,
                    Op::Allow => 1,
                    Op::Refund { cost, back } => {
                        // Every rule gives back on its own; the answer is
                        // the smallest (the contract's "Giving units back").
                        let of = call.at.saturating_sub(back);
                        let own: Vec<u64> = alone.iter().map(|one| one.refund_at(&0, call.at, of, cost)).collect();
                        let got = support::call(&*limiter, *call);
                        prop_assert_eq!(got, Answer::Refunded(*own.iter().min().unwrap()), "{} on {}: call {} {:?} from {:?}", rules, engine, i, call, own);
                        history[index].1.push((call.at, cost, Some(of)));
                        continue;
                    }
                };
                let own: Vec<Decision> = alone.iter().map(|one| one.check_n_at(&0, call.at, cost)).collect();
                let got = limiter.check_n_at(&call.client, call.at, cost);
                let context = format!("{rules} on {engine}: call {i} {call:?}: {got:?} from {own:?}");
                prop_assert_eq!(got.allowed(), own.iter().all(Decision::allowed), "{}", context);
                if got.allowed() {
                    prop_assert_eq!(got.remaining(), own.iter().map(Decision::remaining).min().unwrap(), "{}", context);
                    prop_assert_eq!(got.delay_ticks(), own.iter().map(Decision::delay_ticks).max().unwrap(), "{}", context);
                    prop_assert_eq!(got.refused_by(), None, "{}", context);
                    if cost > 0 {
                        history[index].1.push((call.at, cost, None));
                    }
                } else {
                    let wait = |d: &Decision| d.retry_after_ticks().unwrap_or(u64::MAX);
                    let longest = own.iter().filter(|d| !d.allowed()).map(wait).max().unwrap();
                    prop_assert_eq!(got.remaining(), *before.iter().min().unwrap(), "{}", context);
                    prop_assert_eq!(wait(&got), longest, "{}", context);
                    prop_assert_eq!(got.delay_ticks(), 0, "{}", context);
                    let by = own.iter().position(|d| !d.allowed() && wait(d) == longest);
                    prop_assert_eq!(got.refused_by(), by, "{}", context);
                }
            }
        }
    }
}
/// A refused request spends nothing of any rule: a burst refused by the
/// per-second rule leaves the day's quota whole, on both engines.
/// A refund that gives back to the drip rule only, across a fixed
/// window's edge, rewrites the window word without the count it left
/// behind: the next refusal still waits for the window's true end (the
/// pair once stored that count in the end's bits, a tick late).
#[test]
fn a_refund_across_a_fixed_windows_edge_keeps_its_end() {
    let rules: RuleSet = "token-bucket:3/30ticks,fixed-window:1/4ticks"
        .parse()
        .unwrap();
    for engine in support::ENGINES {
        let limiter = built(&rules, engine, Bounds::new());
        assert!(limiter.check_at(&0, 1000).allowed());
        // The bucket takes the unit back, the new window has none to give.
        assert_eq!(limiter.refund_at(&0, 1004, 1004, 1), 0);
        assert!(limiter.check_at(&0, 1004).allowed());
        let refused = limiter.check_at(&0, 1004);
        assert_eq!(
            refused.retry_after(),
            Some(Duration::from_nanos(4)),
            "{engine}"
        );
    }
}

#[test]
fn a_refused_burst_does_not_drain_the_quota() {
    let rules: RuleSet = "gcra:10/1s,fixed-window:1000/1d".parse().unwrap();
    for engine in support::ENGINES {
        let limiter = built(&rules, engine, Bounds::new());
        let mut admitted = 0;
        for _ in 0..100 {
            admitted += u64::from(limiter.check_at(&1, 0).allowed());
        }
        assert_eq!(admitted, 10, "{engine}");
        let ruled = limiter.check_ruled_at(&1, 0);
        assert_eq!(ruled.decision.refused_by(), Some(0), "{engine}");
        let each: Vec<_> = ruled.each.iter().collect();
        assert_eq!(each.len(), 2, "{engine}");
        assert!(!each[0].decision.allowed());
        assert_eq!(each[0].decision.retry_after_ticks(), Some(100_000_000));
        assert!(
            each[1].decision.allowed(),
            "{engine}: the quota would admit"
        );
        assert_eq!(
            each[1].decision.remaining(),
            990,
            "{engine}: only the ten count"
        );
    }
}

/// Many threads at one frozen instant on one client: exactly the
/// strictest rule's limit is admitted, and every rule spent exactly that
/// (no thread saw one rule spent and another not), on every design.
#[test]
fn racing_threads_spend_every_rule_together() {
    for text in [
        "gcra:10/1s,token-bucket:7/1m",
        "gcra:10/1s,fixed-window:7/1m",
        "sliding-window:10/1s,fixed-window:7/1m,leaky-bucket:9/1s",
    ] {
        let rules: RuleSet = text.parse().unwrap();
        for engine in support::ENGINES {
            let limiter = built(&rules, engine, Bounds::new());
            let admitted = AtomicU64::new(0);
            let start = Barrier::new(4);
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        start.wait();
                        for _ in 0..1_000 {
                            if limiter.check_at(&9, 5).allowed() {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                }
            });
            assert_eq!(admitted.load(Ordering::Relaxed), 7, "{text} on {engine}");
            let ruled = limiter.check_ruled_n_at(&9, 5, 0);
            let spent: Vec<u64> = ruled
                .each
                .iter()
                .map(|a| a.rule.config().limit() - a.decision.remaining())
                .collect();
            assert!(
                spent.iter().all(|&s| s == 7),
                "{text} on {engine}: {spent:?}"
            );
        }
    }
}

/// On the real clock, racing threads never get more than the strictest
/// reading of the rules allows in the time they ran: each rule's burst
/// plus what it refills in the elapsed time.
#[test]
fn racing_on_the_real_clock_never_exceeds_any_rule() {
    let limiter = Builder::new(PolicyKind::Gcra, 50, Duration::from_millis(10))
        .and(PolicyKind::TokenBucket, 200, Duration::from_secs(1))
        .build::<u64>()
        .unwrap();
    let admitted = AtomicU64::new(0);
    let start = limiter.now();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..50_000 {
                    if limiter.check(&3).allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let elapsed = limiter.now() - start;
    let admitted = admitted.load(Ordering::Relaxed);
    // gcra: 50 at once, then one per 200 µs; token-bucket: 200, then one
    // per 5 ms. The first decision came after `start`.
    let gcra = 50 + elapsed / 200_000;
    let bucket = 200 + elapsed / 5_000_000;
    assert!(admitted <= gcra.min(bucket), "{admitted} in {elapsed} ns");
    assert!(admitted >= 50, "the burst is admitted: {admitted}");
}

/// Two one-word rules take the 16-byte word; the others, a frame.
#[test]
fn the_design_follows_the_rules() {
    assert!(Pair::fits(&"gcra:1/1s,leaky-bucket:5/1m".parse().unwrap()));
    assert!(Pair::fits(
        &"token-bucket:1/1s,token-bucket:5/1m".parse().unwrap()
    ));
    assert!(!Pair::fits(&"gcra:1/1s,fixed-window:5/1m".parse().unwrap()));
    assert!(!Pair::fits(
        &"gcra:1/1s,gcra:2/1s,gcra:5/1m".parse().unwrap()
    ));
    let limiter = Builder::from_rules(&"gcra:10/1s,fixed-window:3/1m".parse().unwrap())
        .clock(ManualClock::new(0))
        .build::<str>()
        .unwrap();
    assert_eq!(limiter.policy(), PolicyKind::FixedWindow, "the strictest");
    assert_eq!(limiter.config().limit(), 3);
    assert_eq!(limiter.rules().to_string(), "gcra:10/1s,fixed-window:3/1m");
    let too_many = Builder::new(PolicyKind::Gcra, 1, Duration::from_secs(1));
    let too_many = (0..8).fold(too_many, |b, _| {
        b.and(PolicyKind::Gcra, 1, Duration::from_secs(1))
    });
    assert_eq!(
        too_many.build::<str>().err(),
        Some(floodgate::ConfigError::RuleCount { count: 9 })
    );
}

/// A tier's rule may be several: a tier answers as a limiter with the same
/// rules does, and a reload that changes one of them keeps what each rule
/// had spent (rule by rule, by position).
#[test]
fn a_tier_applies_several_rules_and_a_reload_keeps_each_spend() {
    use floodgate::tiers::Tiers;
    let rules: RuleSet = "gcra:5/100ticks,fixed-window:8/1000ticks".parse().unwrap();
    let tiers =
        Tiers::with_clock_rules("only", rules.clone(), |_: &u64| "only", ManualClock::new(0))
            .unwrap();
    assert_eq!(tiers.rules("only").unwrap(), rules);
    let limiter = built(&rules, Engine::LockFree, Bounds::new());
    for at in [0, 0, 0, 0, 0, 0, 500, 500, 500, 500] {
        assert_eq!(tiers.check_at(&1, at), limiter.check_at(&1, at), "at {at}");
    }
    // At 500 the burst rule has two left and the quota none (5 + 3 = 8).
    assert_eq!(tiers.check_at(&1, 500).refused_by(), Some(1));
    tiers
        .reload_rules(
            "only",
            "gcra:5/100ticks,fixed-window:10/1000ticks"
                .parse::<RuleSet>()
                .unwrap(),
        )
        .unwrap();
    // The quota kept its 8 of now 10; the burst rule its 3 of 5.
    assert_eq!(tiers.remaining_at(&1, 500), 2);
    assert!(tiers.check_at(&1, 500).allowed());
    assert!(tiers.check_at(&1, 500).allowed());
    let refused = tiers.check_at(&1, 500);
    assert!(!refused.allowed());
    // Both have none left now; the burst rule's wait (20 ticks) is shorter
    // than the quota's (500), so the quota refused it.
    assert_eq!(refused.refused_by(), Some(1));
    assert_eq!(refused.retry_after_ticks(), Some(500));
}

/// One rule's peek: its remaining, and what its next check of one unit
/// would say (admitted, or its wait), nothing spent; every policy, both
/// engines, as the client spends its limit and past it. A client with no
/// state has none, and gets none.
#[test]
fn each_rule_peeks_what_its_next_check_would_say() {
    for text in [
        "sliding-window:3/10ticks",
        "token-bucket:3/12ticks",
        "fixed-window:3/10ticks",
        "sliding-window-counter:3/10ticks",
        "gcra:3/12ticks",
        "leaky-bucket:3/12ticks",
        "in-flight:3",
        "gcra:3/12ticks,fixed-window:5/40ticks",
    ] {
        let rules: RuleSet = text.parse().unwrap();
        for engine in support::ENGINES {
            let limiter = built(&rules, engine, Bounds::new());
            assert_eq!(limiter.peek_each_at(&1, 0), None, "{text} on {engine}");
            for now in [0, 1, 1, 2, 2, 3, 9, 11, 11, 11] {
                limiter.remaining_at(&1, now);
                let each = limiter.peek_each_at(&1, now).expect("made");
                assert_eq!(each.len(), rules.len(), "{text} on {engine}");
                let remaining = limiter.remaining_at(&1, now);
                let check = limiter.check_at(&1, now);
                let context = format!("{text} on {engine} at {now}: {each:?}, then {check:?}");
                let least = each.iter().map(|a| a.decision.remaining()).min();
                assert_eq!(least, Some(remaining), "{context}");
                assert_eq!(
                    each.iter().all(|a| a.decision.allowed()),
                    check.allowed(),
                    "{context}"
                );
                if !check.allowed() {
                    let longest = each
                        .iter()
                        .map(|a| a.decision.retry_after_ticks().unwrap_or(u64::MAX))
                        .max();
                    assert_eq!(
                        longest,
                        Some(check.retry_after_ticks().unwrap_or(u64::MAX)),
                        "{context}"
                    );
                }
            }
        }
    }
}

/// An admission's refund gives back at most its own cost, once (it takes
/// the admission), on every policy, one rule or several, both engines:
/// the other admissions' units stay spent whatever is asked. The refund by
/// time trusts its caller, so the same over-large refund by time takes
/// the others' units (which is why the handle exists); and an `at` after
/// `now` names no admission: 0.
#[test]
fn a_refund_gives_back_at_most_its_admissions_cost_once() {
    for text in [
        "sliding-window:10/60ticks",
        "token-bucket:10/60ticks",
        "fixed-window:10/60ticks",
        "sliding-window-counter:10/60ticks",
        "gcra:10/60ticks",
        "leaky-bucket:10/60ticks",
        "gcra:10/60ticks,fixed-window:20/600ticks",
        "fixed-window:10/60ticks,sliding-window:12/60ticks,token-bucket:15/600ticks",
    ] {
        let rules: RuleSet = text.parse().unwrap();
        for engine in support::ENGINES {
            let limiter = build_rules::<str, _>(&rules, engine, ManualClock::new(0), Bounds::new())
                .unwrap_or_else(|e| panic!("{rules}: {e}"));
            let context = format!("{text} on {engine}");
            let one = limiter.admit_n("a", 1).expect("ten left");
            assert_eq!((one.cost(), one.key().as_str()), (1, "a"), "{context}");
            let five = limiter.admit_n("a", 5).expect("nine left");
            assert_eq!(limiter.remaining("a"), 4, "{context}");
            // Six asked of a one-unit admission: one comes back.
            assert_eq!(limiter.refund(one, 6), 1, "{context}: the one");
            assert_eq!(limiter.remaining("a"), 5, "{context}: the five stay spent");
            // Part of the five, then nothing more: the refund took it.
            assert_eq!(limiter.refund(five, 2), 2, "{context}: two of five");
            assert_eq!(limiter.remaining("a"), 7, "{context}");
            // A refusal is no admission: nothing to give back.
            let refused = limiter.admit_n("a", 8).unwrap_err();
            assert!(!refused.allowed(), "{context}");
            assert_eq!(
                limiter.remaining("a"),
                7,
                "{context}: a refusal spent nothing"
            );
            // The refund by time trusts its caller: a later admission's units.
            let one = limiter.admit_n("a", 1).expect("seven left");
            let at = one.at_ticks();
            assert_eq!(
                limiter.refund_at("a", at, at, 6),
                4,
                "{context}: by time, trusted"
            );
            // No admission after `now`.
            assert_eq!(
                limiter.refund_at("a", at, at + 1, 1),
                0,
                "{context}: at > now"
            );
            assert_eq!(limiter.remaining("a"), 10, "{context}");
        }
    }
}
