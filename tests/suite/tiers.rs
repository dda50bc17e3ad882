//! Tiers and live reload: a reloaded rule applies from a client's next call,
//! what a client spent is carried over (exactly, at a frozen instant), and
//! under concurrent traffic no request is lost or counted twice.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::thread;

use floodgate::tiers::{self, Resolver, TierError, TierSpec, Tiers};
use floodgate::{Bounds, Config, ManualClock, Overflow, PolicyKind, RateLimiter};

/// A spec, for tests that only build valid ones.
fn spec(policy: PolicyKind, limit: u64, window: u64) -> TierSpec {
    TierSpec::new(policy, Config::per_ticks(limit, window).unwrap()).unwrap()
}

/// Clients whose name starts with `pro-` are premium; everyone else is free.
fn by_prefix(client: &str) -> &'static str {
    if client.starts_with("pro-") {
        "premium"
    } else {
        "free"
    }
}

/// A window long enough for every drip policy at every limit used here.
const W: u64 = 1_000_000;

type Registry = Tiers<String, fn(&str) -> &'static str, ManualClock>;

fn registry(free: TierSpec, clock: &ManualClock) -> Registry {
    Tiers::with_clock(
        "free",
        free,
        by_prefix as fn(&str) -> &'static str,
        clock.clone(),
    )
    .unwrap()
    .with_tier("premium", spec(PolicyKind::Gcra, 1_000, W))
    .unwrap()
}

#[test]
fn eighty_of_a_hundred_spent_leaves_a_hundred_and_twenty_of_two_hundred() {
    for policy in PolicyKind::ALL {
        let clock = ManualClock::new(5_000);
        let tiers = registry(spec(policy, 100, W), &clock);
        for _ in 0..80 {
            assert!(tiers.allow("alice"), "{policy}");
        }
        assert_eq!(tiers.remaining("alice"), 20, "{policy}");
        tiers.reload("free", spec(policy, 200, W)).unwrap();
        assert_eq!(tiers.remaining("alice"), 120, "{policy}");
        for left in (0..120).rev() {
            assert_eq!(tiers.check("alice").remaining(), left, "{policy}");
        }
        assert!(!tiers.allow("alice"), "{policy}: 200 in all, no more");
        assert_eq!(tiers.rule("free").unwrap(), spec(policy, 200, W));
    }
}

#[test]
fn a_policy_change_keeps_how_much_was_spent() {
    for old in PolicyKind::ALL {
        for new in PolicyKind::ALL {
            let clock = ManualClock::new(70);
            let tiers = registry(spec(old, 100, W), &clock);
            for _ in 0..30 {
                assert!(tiers.allow("bob"));
            }
            clock.advance(10);
            tiers.reload("free", spec(new, 100, W)).unwrap();
            assert_eq!(tiers.remaining("bob"), 70, "{old} → {new}");
            assert_eq!(tiers.check("bob").remaining(), 69, "{old} → {new}");
        }
    }
}

#[test]
fn a_lower_limit_than_what_was_spent_leaves_nothing_until_it_is_given_back() {
    for policy in PolicyKind::ALL {
        let clock = ManualClock::new(0);
        let tiers = registry(spec(policy, 100, W), &clock);
        for _ in 0..80 {
            assert!(tiers.allow("carol"));
        }
        tiers.reload("free", spec(policy, 50, W)).unwrap();
        let rejected = tiers.check("carol");
        assert!(!rejected.allowed(), "{policy}");
        assert!(
            rejected.retry_after_ticks().unwrap_or(u64::MAX) >= 1,
            "{policy}"
        );
        // Everything carried is given back within two windows (one for all
        // but the counter, whose current window then becomes the previous).
        clock.advance(2 * W);
        assert_eq!(tiers.remaining("carol"), 50, "{policy}");
    }
}

#[test]
fn the_spent_requests_are_given_back_as_documented() {
    // Sliding log: the carried requests count as made at the carry-over.
    let clock = ManualClock::new(0);
    let tiers = registry(spec(PolicyKind::SlidingWindow, 10, 1_000), &clock);
    for _ in 0..4 {
        assert!(tiers.allow("dan"));
    }
    clock.set(600);
    tiers
        .reload("free", spec(PolicyKind::SlidingWindow, 20, 1_000))
        .unwrap();
    assert_eq!(tiers.remaining("dan"), 16); // carried over at 600
    clock.set(1_599);
    assert_eq!(tiers.remaining("dan"), 16);
    clock.set(1_600);
    assert_eq!(tiers.remaining("dan"), 20);

    // Fixed window: same origin, so the client's window still ends at 1000.
    let clock = ManualClock::new(0);
    let tiers = registry(spec(PolicyKind::FixedWindow, 10, 1_000), &clock);
    for _ in 0..4 {
        assert!(tiers.allow("erin"));
    }
    clock.set(600);
    tiers
        .reload("free", spec(PolicyKind::FixedWindow, 20, 1_000))
        .unwrap();
    assert_eq!(tiers.remaining("erin"), 16);
    clock.set(999);
    assert_eq!(tiers.remaining("erin"), 16);
    clock.set(1_000);
    assert_eq!(tiers.remaining("erin"), 20);
}

#[test]
fn the_new_rule_applies_from_the_next_call_and_only_to_its_tier() {
    let clock = ManualClock::new(0);
    let tiers = registry(spec(PolicyKind::TokenBucket, 2, W), &clock);
    assert!(tiers.allow("frank"));
    assert!(tiers.allow("frank"));
    assert!(!tiers.allow("frank"));
    assert_eq!(tiers.remaining("pro-gina"), 1_000);
    tiers
        .reload("free", spec(PolicyKind::TokenBucket, 3, W))
        .unwrap();
    assert!(tiers.allow("frank"), "the very next call sees L = 3");
    assert!(!tiers.allow("frank"));
    assert_eq!(tiers.remaining("pro-gina"), 1_000, "premium untouched");
    assert_eq!(tiers.rule("premium").unwrap().config().limit(), 1_000);
}

#[test]
fn unknown_tiers_are_errors_and_unknown_answers_mean_the_default() {
    let clock = ManualClock::new(0);
    let tiers = Tiers::with_clock(
        "free",
        spec(PolicyKind::FixedWindow, 1, W),
        |_: &str| "no-such-tier",
        clock,
    )
    .unwrap();
    assert!(tiers.allow("hal"), "resolved to the default tier");
    assert!(!tiers.allow("hal"));
    assert_eq!(tiers.unknown_tier_calls(), 2, "and counted, not quietly");
    let tiered = tiers.check_tiered_at("hal", 0);
    assert_eq!(
        (tiered.tier, tiered.unknown.as_deref()),
        ("free", Some("no-such-tier"))
    );
    let TierError::Unknown(error) = tiers
        .reload("gold", spec(PolicyKind::Gcra, 1, W))
        .unwrap_err()
    else {
        panic!("an unknown tier")
    };
    assert_eq!(error.name, "gold");
    assert_eq!(
        error.to_string(),
        "no tier named `gold` (the tiers are: free)"
    );
    assert!(tiers.rule("gold").is_err());
    assert_eq!(tiers.names(), ["free"]);
}

#[test]
fn idle_clients_of_every_tier_and_rule_are_swept() {
    let clock = ManualClock::new(0);
    let tiers = registry(spec(PolicyKind::SlidingWindow, 5, 1_000), &clock)
        .with_bounds(Bounds::new().evict_idle())
        .unwrap();
    assert!(tiers.allow("ivy"));
    assert!(tiers.allow("pro-jo"));
    tiers
        .reload("free", spec(PolicyKind::Gcra, 5, 1_000))
        .unwrap();
    assert_eq!(tiers.tracked_clients(), 2);
    clock.set(999);
    assert_eq!(tiers.sweep(), 0, "both still have a request in the window");
    clock.set(1_000);
    // ivy's state is still the sliding log's (she has not called since the
    // reload), judged by its own rule; pro-jo's schedule (one interval of
    // 1000 ahead of 0) is not ahead of 1000.
    assert_eq!(tiers.sweep(), 2);
    assert_eq!(tiers.tracked_clients(), 0);
    assert_eq!(tiers.remaining("ivy"), 5);
}

/// The whole contract under load: threads hammer a few clients at a frozen
/// instant while another thread raises the limit step by step. Limits only
/// rise and the clock stands still, so nothing is ever given back or
/// forgiven: every client ends with exactly the final limit admitted — a
/// lost carry-over would admit more, a double count fewer — and nothing
/// left.
#[test]
fn reloads_under_traffic_lose_and_double_count_nothing() {
    const THREADS: usize = 4;
    const CLIENTS: u64 = 8;
    let limits = [10, 15, 23, 40, 41, 64, 100];
    for policy in PolicyKind::ALL {
        let clock = ManualClock::new(1_000);
        let tiers =
            Tiers::with_clock("free", spec(policy, limits[0], W), |_: &u64| "free", clock).unwrap();
        let admitted: Vec<AtomicU64> = (0..CLIENTS).map(|_| AtomicU64::new(0)).collect();
        let reloads_done = AtomicBool::new(false);
        let start = Barrier::new(THREADS + 1);
        thread::scope(|scope| {
            for me in 0..THREADS {
                let (tiers, admitted, reloads_done, start) =
                    (&tiers, &admitted, &reloads_done, &start);
                scope.spawn(move || {
                    start.wait();
                    // Until the last reload is in, and then until every
                    // client has been refused once after it.
                    let mut refused_after = vec![false; CLIENTS as usize];
                    let mut round = me as u64;
                    loop {
                        let done = reloads_done.load(Ordering::SeqCst);
                        if done && refused_after.iter().all(|&r| r) {
                            break;
                        }
                        let client = round % CLIENTS;
                        round += 1;
                        if tiers.check(&client).allowed() {
                            admitted[client as usize].fetch_add(1, Ordering::Relaxed);
                        } else if done {
                            refused_after[client as usize] = true;
                        }
                    }
                });
            }
            start.wait();
            for &limit in &limits[1..] {
                thread::yield_now();
                tiers.reload("free", spec(policy, limit, W)).unwrap();
            }
            reloads_done.store(true, Ordering::SeqCst);
        });
        let last = *limits.last().unwrap();
        for (client, count) in admitted.iter().enumerate() {
            let client = client as u64;
            assert_eq!(
                count.load(Ordering::Relaxed),
                last,
                "{policy} client {client}"
            );
            assert_eq!(tiers.remaining(&client), 0, "{policy} client {client}");
        }
    }
}

#[test]
fn one_registry_can_serve_the_whole_process() {
    let resolver: Box<dyn Resolver<str>> = Box::new(by_prefix);
    let registry = Tiers::new("free", spec(PolicyKind::Gcra, 3, W), resolver)
        .with_tier("premium", spec(PolicyKind::Gcra, 30, W))
        .unwrap();
    let installed = tiers::install(registry).expect("the first install");
    assert_eq!(installed.remaining("pro-kim"), 30);
    // A second install is refused and handed back, never replacing it.
    let again = Tiers::new(
        "free",
        spec(PolicyKind::Gcra, 1, W),
        Box::new(by_prefix) as Box<dyn Resolver<str>>,
    );
    assert!(tiers::install(again).is_err());
    let anywhere = tiers::installed().expect("installed above");
    assert!(std::ptr::eq(anywhere, installed));
    assert_eq!(anywhere.remaining("lee"), 3);
}

#[test]
fn each_tier_is_capped_with_its_overflow_rule() {
    for rule in Overflow::ALL {
        let clock = ManualClock::new(0);
        let tiers = registry(spec(PolicyKind::FixedWindow, 2, W), &clock)
            .with_bounds(Bounds::new().max_clients(1).on_overflow(rule))
            .unwrap();
        assert!(tiers.allow("amy"));
        assert!(tiers.allow("pro-ben"), "{rule}: premium has its own place");
        assert_eq!(tiers.tracked_clients(), 2);
        let newcomer = tiers.check("cal");
        match rule {
            Overflow::Reject => {
                assert!(!newcomer.allowed());
                assert_eq!(newcomer.retry_after_ticks().unwrap_or(u64::MAX), W);
                assert_eq!(tiers.remaining("cal"), 0);
            }
            Overflow::Admit => {
                assert_eq!(newcomer.remaining(), 1);
                assert_eq!(tiers.remaining("cal"), 2);
            }
            Overflow::Shared => {
                assert_eq!(newcomer.remaining(), 1);
                assert_eq!(tiers.check("dee").remaining(), 0, "shared with cal");
                assert!(!tiers.allow("eve"));
                // A reload starts the shared state afresh with the new rule.
                tiers
                    .reload("free", spec(PolicyKind::FixedWindow, 3, W))
                    .unwrap();
                assert_eq!(tiers.remaining("eve"), 3);
            }
        }
        assert_eq!(tiers.tracked_clients(), 2, "{rule}");
        // Amy keeps her state: one of 2 spent (of 3 after the reload).
        let left = if rule == Overflow::Shared { 2 } else { 1 };
        assert_eq!(tiers.remaining("amy"), left, "{rule}");
    }
}

/// A tier added twice is an error that names it, the default tier too: a
/// second `with_tier` would have replaced the first without a word.
#[test]
fn a_tier_added_twice_is_refused_by_name() {
    let clock = ManualClock::new(0);
    let twice = Tiers::<String, _, _>::with_clock(
        "free",
        spec(PolicyKind::Gcra, 10, 1_000),
        by_prefix,
        clock.clone(),
    )
    .unwrap()
    .with_tier("premium", spec(PolicyKind::Gcra, 100, 1_000))
    .unwrap()
    .with_tier("premium", spec(PolicyKind::Gcra, 1_000, 1_000));
    let Err(error) = twice else {
        panic!("a second premium tier was taken");
    };
    assert_eq!(
        error,
        floodgate::ConfigError::DuplicateTier {
            name: "premium".into()
        }
    );
    assert!(
        error.to_string().contains("\"premium\" is added twice"),
        "{error}"
    );
    let default_again = Tiers::<String, _, _>::with_clock(
        "free",
        spec(PolicyKind::Gcra, 10, 1_000),
        by_prefix,
        clock,
    )
    .unwrap()
    .with_tier("free", spec(PolicyKind::Gcra, 20, 1_000));
    assert!(matches!(
        default_again,
        Err(floodgate::ConfigError::DuplicateTier { .. })
    ));
}

/// A refund goes to the tier that admitted: the resolver's for a plain
/// check, the named one for `check_ruled_in_n_at` (the default tier for a
/// name the registry lacks). Across a reload the client is carried over
/// first, as any call carries it, and the refund gives back to the carried
/// state: 80 of 100 spent, reloaded to 200, 30 given back leaves 150.
#[test]
fn a_refund_goes_to_the_tier_that_admitted_and_survives_a_reload() {
    let clock = ManualClock::new(5_000);
    let tiers = registry(spec(PolicyKind::FixedWindow, 100, W), &clock);
    let mut admitted = Vec::new();
    for _ in 0..80 {
        admitted.push(tiers.admit("alice").expect("100 a window"));
    }
    tiers
        .reload("free", spec(PolicyKind::FixedWindow, 200, W))
        .unwrap();
    assert_eq!(tiers.remaining("alice"), 120);
    // One admission gives back its own unit, whatever is asked...
    let first = admitted.remove(0);
    assert_eq!(tiers.refund(first, 30), 1);
    assert_eq!(tiers.remaining("alice"), 121);
    // ...and thirty of them thirty.
    let given: u64 = admitted.drain(..30).map(|a| tiers.refund(a, 1)).sum();
    assert_eq!(given, 30);
    assert_eq!(tiers.remaining("alice"), 151);

    // Checked in the premium tier by name, though the resolver says free.
    let ruled = tiers.check_ruled_in_n_at("premium", "bob", 5_000, 10);
    assert!(ruled.decision.allowed());
    assert_eq!(ruled.tier, Some("premium"));
    assert_eq!(
        tiers.refund_in_at("free", "bob", 5_000, 5_000, 10),
        Ok(0),
        "free has no bob"
    );
    assert!(tiers.refund_in_at("gold", "bob", 5_000, 5_000, 10).is_err());
    assert_eq!(
        RateLimiter::refund_in_at(&tiers, "premium", "bob", 5_000, 5_000, 4),
        4
    );
    assert_eq!(
        tiers
            .check_ruled_in_n_at("premium", "bob", 5_000, 1)
            .decision
            .remaining(),
        1_000 - 6 - 1
    );
    // An unknown name spent in the default tier, and gives back there.
    assert!(tiers
        .check_ruled_in_n_at("gold", "carol", 5_000, 3)
        .decision
        .allowed());
    assert_eq!(
        RateLimiter::refund_in_at(&tiers, "gold", "carol", 5_000, 5_000, 3),
        3
    );
    assert_eq!(tiers.remaining("carol"), 200);
}

/// `Tiers::new` takes its key type from the registry's use, with no key
/// type or clock named: addresses, numbers through a table, text.
#[test]
fn tiers_new_takes_its_key_type_from_its_use() {
    use std::net::IpAddr;

    // An hour's quota: no drip while the test runs, on the default clock.
    let by_address = Tiers::new("anonymous", "gcra:2/1h".parse().unwrap(), |ip: &IpAddr| {
        if ip.is_loopback() {
            "local"
        } else {
            "anonymous"
        }
    })
    .with_tier("local", "gcra:3/1h".parse().unwrap())
    .unwrap();
    let outside: IpAddr = "203.0.113.7".parse().unwrap();
    let local: IpAddr = "127.0.0.1".parse().unwrap();
    assert_eq!(
        (0..4).filter(|_| by_address.allow(&outside)).count(),
        2,
        "anonymous: 2"
    );
    assert_eq!((0..4).filter(|_| by_address.allow(&local)).count(), 3);
    assert_eq!(by_address.check_tiered_at(&local, 0).tier, "local");

    let by_account = Tiers::new(
        "free",
        "gcra:1/1h".parse().unwrap(),
        tiers::ByTable::new([(7u64, "premium")], "free"),
    )
    .with_tier("premium", "gcra:5/1h".parse().unwrap())
    .unwrap()
    .checked()
    .unwrap();
    assert_eq!(by_account.remaining(&7u64), 5);
    assert_eq!(by_account.remaining(&8u64), 1);

    let by_name = Tiers::new("free", "gcra:1/1h".parse().unwrap(), by_prefix);
    assert!(by_name.allow("alice"));
    assert!(!by_name.allow("alice"));
}

/// A tier of several rules answers for each rule (the HTTP layer's member
/// per rule), in the tier's order, by resolver and by name; a tier of one
/// rule answers by its decision alone, as a limiter of one rule does.
#[test]
fn a_tier_of_several_rules_answers_for_each_rule() {
    let tiers = Tiers::with_clock_rules(
        "free",
        "gcra:2/1s,fixed-window:3/1m".parse().unwrap(),
        by_prefix,
        ManualClock::new(0),
    )
    .unwrap()
    .with_tier("premium", spec(PolicyKind::Gcra, 100, W))
    .unwrap();
    let each = |ruled: &floodgate::RuledDecision<'_>| -> Vec<(String, bool, u64)> {
        ruled
            .each
            .iter()
            .map(|answer| {
                let decision = answer.decision;
                (
                    answer.rule.to_string(),
                    decision.allowed(),
                    decision.remaining(),
                )
            })
            .collect()
    };
    let first = tiers.check_ruled_at("alice", 0);
    assert_eq!(first.tier, Some("free"));
    assert_eq!(
        each(&first),
        [
            ("gcra:2/1s".to_owned(), true, 1),
            ("fixed-window:3/1m".to_owned(), true, 2)
        ]
    );
    let named = tiers.check_ruled_in_n_at("free", "alice", 0, 1);
    assert_eq!(
        each(&named),
        [
            ("gcra:2/1s".to_owned(), true, 0),
            ("fixed-window:3/1m".to_owned(), true, 1)
        ]
    );
    // Refused by the burst: its answer refuses, the minute's would admit.
    let burst = tiers.check_ruled_at("alice", 0);
    assert_eq!(burst.decision.refused_by(), Some(0));
    assert_eq!(
        each(&burst),
        [
            ("gcra:2/1s".to_owned(), false, 0),
            ("fixed-window:3/1m".to_owned(), true, 1)
        ]
    );
    assert!(tiers.check_ruled_at("pro-kim", 0).each.is_empty());
    assert!(tiers
        .check_ruled_in_n_at("premium", "alice", 0, 1)
        .each
        .is_empty());
}
