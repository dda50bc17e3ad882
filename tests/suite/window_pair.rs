//! A drip rule beside a window rule in one 16-byte word, at the edges of
//! both layouts: [`WindowPair`] (the window's end as an offset from the
//! drip word, no origin) and [`WideWindowPair`] (the origin beside the
//! word, the window index's low bits in it). The largest limits (the
//! fewest bits left), the smallest windows, idle gaps across the index's
//! width and time going back past the stored window. Every answer is the
//! general design's ([`Compound`], which keeps every index whole) and, on
//! times that never decrease, the mutex engine's.

use super::support;

use std::sync::Arc;

use floodgate::policy::{Compound, Pair, Policy, WideWindowPair, WindowPair};
use floodgate::{
    build_rules, Bounds, Builder, Config, Engine, Limiter, ManualClock, PolicyKind, RateLimiter,
    Rule, RuleSet,
};
use proptest::prelude::*;
use proptest::sample::select;
use support::{run, Call, Op};

fn rule(policy: PolicyKind, limit: u64, window: u64) -> Rule {
    Rule::new(policy, Config::per_ticks(limit, window).unwrap()).unwrap()
}

/// A drip rule of short windows (or one that admits 2^31 − 1 at once), and
/// a window rule whose limit leaves the index few bits
/// (`sliding-window-counter` at 2^31 − 1 keeps 2), of a few ticks (or of
/// 2^33, beside the large drip rule).
fn edge_rules() -> impl Strategy<Value = RuleSet> {
    let drip = (
        select(vec![
            PolicyKind::Gcra,
            PolicyKind::TokenBucket,
            PolicyKind::LeakyBucket,
        ]),
        prop_oneof![4 => 1..=3u64, 1 => Just((1u64 << 31) - 1)],
        0..=3u64,
    )
        .prop_map(|(policy, limit, extra)| rule(policy, limit, limit + extra));
    let window = (
        select(vec![
            PolicyKind::FixedWindow,
            PolicyKind::SlidingWindowCounter,
        ]),
        select(vec![1u64, 2, 3, 65_535, (1 << 31) - 1, u64::from(u32::MAX)]),
        prop_oneof![4 => 1..=8u64, 1 => 9..=100u64, 1 => Just(1u64 << 33)],
    )
        .prop_map(|(policy, limit, window)| rule(policy, limit, window));
    (drip, window, any::<bool>()).prop_map(|(drip, window, drip_first)| {
        let rules = if drip_first {
            vec![drip, window]
        } else {
            vec![window, drip]
        };
        RuleSet::new(rules).unwrap()
    })
}

/// Costs from 1 to the window rule's limit, so that large counts are
/// reached in a few calls.
fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Allow),
        3 => select(vec![0u64, 2, 3, 1 << 15, (1 << 31) - 1, u64::from(u32::MAX), u64::MAX])
            .prop_map(Op::AllowN),
        1 => Just(Op::Remaining),
    ]
}

/// Steps that cross the index's width: a few ticks, and whole multiples of
/// 2^m windows of 1 to 8 ticks (m = 1, 2, 3, 32, 33), give or take a tick.
fn step(back: bool) -> impl Strategy<Value = i64> {
    let far = (
        select(vec![1u32, 2, 3, 32, 33]),
        1..=3i64,
        1..=8i64,
        -1..=1i64,
    )
        .prop_map(|(bits, windows, width, off)| ((windows << bits) * width) + off);
    let near = if back { -12i64..=12 } else { 0i64..=12 };
    let sign = if back { -1i64..=1 } else { 1i64..=1 };
    prop_oneof![3 => Just(0i64), 3 => near, 3 => (far, sign).prop_map(|(d, s)| if s < 0 { -d } else { d.max(0) })]
}

fn trace(back: bool) -> impl Strategy<Value = Vec<Call>> {
    prop::collection::vec(
        (
            0..2u64,
            op(),
            step(back),
            prop_oneof![3 => Just(1usize), 1 => 2..=5usize],
        ),
        1..40,
    )
    .prop_map(|steps| {
        // Far from 0, so that time can go back by 2^33 windows.
        let mut at: u64 = 1 << 40;
        let mut trace = Vec::new();
        for (client, op, step, repeat) in steps {
            at = at.saturating_add_signed(step);
            trace.extend((0..repeat).map(|_| Call { op, client, at }));
        }
        trace
    })
}

fn built(rules: &RuleSet, engine: Engine) -> Arc<dyn RateLimiter<u64>> {
    build_rules::<u64, _>(rules, engine, ManualClock::new(0), Bounds::new())
        .unwrap_or_else(|e| panic!("{rules}: {e}"))
}

fn limiter<P: Policy>(policy: P) -> Limiter<u64, P, ManualClock> {
    Limiter::with_bounds(policy, ManualClock::new(0), Bounds::new()).unwrap()
}

fn window_pair(rules: &RuleSet) -> Limiter<u64, WindowPair, ManualClock> {
    limiter(WindowPair::from_rules(rules).unwrap())
}

fn wide(rules: &RuleSet) -> Limiter<u64, WideWindowPair, ManualClock> {
    limiter(WideWindowPair::from_rules(rules).unwrap())
}

fn compound(rules: &RuleSet) -> Limiter<u64, Compound, ManualClock> {
    Limiter::with_bounds(
        Compound::from_rules(rules).unwrap(),
        ManualClock::new(0),
        Bounds::new(),
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Both words answer as the general design's frame does, time going
    /// back included, on every rule set each takes.
    #[test]
    fn the_words_answer_as_whole_indices_do(rules in edge_rules(), trace in trace(true)) {
        let general = run(&compound(&rules), &trace);
        let mut words = Vec::new();
        if WindowPair::fits(&rules) {
            words.push(("window pair", run(&window_pair(&rules), &trace)));
        }
        if WideWindowPair::fits(&rules) {
            words.push(("wide pair", run(&wide(&rules), &trace)));
        }
        for (name, word) in words {
            for (i, call) in trace.iter().enumerate() {
                prop_assert_eq!(word[i], general[i], "{} {}: call {} {:?} (word, frame)", name, rules, i, call);
            }
        }
    }

    /// On times that never decrease, the lock-free engine (whichever
    /// design the factory picks) answers as the mutex engine.
    #[test]
    fn the_engines_agree_at_the_edges(rules in edge_rules(), trace in trace(false)) {
        let lock_free = run(&*built(&rules, Engine::LockFree), &trace);
        let mutex = run(&*built(&rules, Engine::Mutex), &trace);
        for (i, call) in trace.iter().enumerate() {
            prop_assert_eq!(lock_free[i], mutex[i], "{}: call {} {:?} (lock-free, mutex)", rules, i, call);
        }
    }
}

/// The pairs each word takes. The origin-free word holds the window's end
/// in `bits(2D + W)` beside the counts; the wide one, the index's low bits
/// beside them, as many as `⌊2D / W⌋ + 2` windows need; the rest are the
/// frame's.
#[test]
fn each_word_takes_the_pairs_whose_fields_fit() {
    let fits = |text: &str| {
        let rules = text.parse().unwrap();
        (WindowPair::fits(&rules), WideWindowPair::fits(&rules))
    };
    // A day of nanoseconds is 47 bits: 17 are left for a count.
    assert_eq!(fits("gcra:10/1s,fixed-window:10000/1d"), (true, true));
    assert_eq!(
        fits("fixed-window:131071/1d,token-bucket:10/1s"),
        (true, true)
    );
    assert_eq!(
        fits("fixed-window:131072/1d,token-bucket:10/1s"),
        (false, true)
    );
    assert_eq!(
        fits("leaky-bucket:10/1s,sliding-window-counter:2047/1h"),
        (true, true)
    );
    assert_eq!(
        fits("leaky-bucket:10/1s,sliding-window-counter:2048/1h"),
        (false, true)
    );
    assert_eq!(
        fits("gcra:10/1d,fixed-window:4294967295/365d"),
        (false, true)
    );
    assert_eq!(
        fits("gcra:1/1ticks,sliding-window-counter:2147483647/1ticks"),
        (true, true)
    );
    assert_eq!(
        fits("gcra:1/1ticks,sliding-window-counter:2147483647/2ticks"),
        (false, true)
    );
    assert_eq!(
        fits("gcra:1/1ticks,sliding-window-counter:4294967295/1ticks"),
        (false, false)
    );
    assert_eq!(
        fits("gcra:4/4ticks,sliding-window-counter:2147483647/1ticks"),
        (false, false)
    );
    assert_eq!(
        fits("gcra:10/1d,fixed-window:4294967295/1us"),
        (false, false)
    );
    assert_eq!(fits("gcra:10/1s,gcra:100/1m"), (false, false));
    assert_eq!(
        fits("fixed-window:10/1s,fixed-window:100/1m"),
        (false, false)
    );
    assert_eq!(fits("gcra:10/1s,sliding-window:100/1m"), (false, false));
    assert!(Pair::fits(&"gcra:10/1s,gcra:100/1m".parse().unwrap()));
}

/// A fixed window of one tick whose limit is 2^32 − 1 keeps 32 index
/// bits: after an idle gap of exactly 2^32 windows, whose index has the
/// same low bits, the window is a new one; a call back in the old window
/// is judged in the stored one, as the rule alone judges it.
#[test]
fn an_idle_gap_of_the_index_width_starts_a_new_window() {
    let rules: RuleSet = "gcra:1/1ticks,fixed-window:4294967295/1ticks"
        .parse()
        .unwrap();
    let max = u64::from(u32::MAX);
    for limiter in [
        Arc::new(wide(&rules)) as Arc<dyn RateLimiter<u64>>,
        Arc::new(window_pair(&rules)),
        built(&rules, Engine::Mutex),
    ] {
        let start = 7u64;
        assert!(limiter.check_at(&1, start).allowed());
        assert_eq!(limiter.remaining_at(&1, start), 0, "the burst of one");
        let each = limiter.check_ruled_at(&1, start + 1).each;
        assert_eq!(
            each.iter().nth(1).unwrap().decision.remaining(),
            max - 1,
            "window 8: one of its own"
        );
        let later = start + 1 + (1 << 32);
        let fresh = limiter.check_ruled_at(&1, later).each;
        assert_eq!(
            fresh.iter().nth(1).unwrap().decision.remaining(),
            max - 1,
            "2^32 windows later, a new window"
        );
        // Back before the stored window: judged in it (one left of it).
        let back = limiter.check_ruled_at(&1, later - 5).each;
        assert_eq!(back.iter().nth(1).unwrap().decision.remaining(), max - 1);
    }
}

/// The counter with two counts of 31 bits keeps 2 index bits: gaps of 1
/// to 5 windows are each told apart (the previous window's count weighs
/// only after a gap of 1), as by the rule alone.
#[test]
fn the_counter_tells_apart_gaps_across_two_index_bits() {
    let rules: RuleSet = "gcra:1/1ticks,sliding-window-counter:2147483647/2ticks"
        .parse()
        .unwrap();
    let limit = (1u64 << 31) - 1;
    let counter = |limiter: &dyn RateLimiter<u64>, at: u64| {
        let each = limiter.check_ruled_n_at(&0, at, 0).each;

        each.iter().nth(1).unwrap().decision.remaining()
    };
    for gap in 1..=5u64 {
        let word = wide(&rules);
        let mutex = built(&rules, Engine::Mutex);
        for limiter in [&word as &dyn RateLimiter<u64>, &*mutex] {
            assert!(limiter.check_at(&0, 1).allowed());
            assert_eq!(counter(limiter, 1), limit - 1);
            let expected = if gap == 1 { limit - 1 } else { limit };
            assert_eq!(counter(limiter, 2 * gap), expected, "gap {gap}");
        }
    }
}

/// The oldest client the words hold: up to the clock's horizon
/// (2^62 − 1), where both rules' time stops, each word answers as the
/// frame; past it, to `u64::MAX`, without a panic.
#[test]
fn the_oldest_client_at_the_horizon() {
    let rules: RuleSet = "gcra:2/10ticks,sliding-window-counter:3/7ticks"
        .parse()
        .unwrap();
    let words: [Arc<dyn RateLimiter<u64>>; 2] =
        [Arc::new(window_pair(&rules)), Arc::new(wide(&rules))];
    let horizon = (1u64 << 62) - 1;
    for word in &words {
        let general = compound(&rules);
        for at in [0, 5, horizon - 20, horizon - 3, horizon] {
            for op in [Op::Allow, Op::AllowN(2), Op::Remaining] {
                let call = Call { op, client: 3, at };
                assert_eq!(run(&**word, &[call]), run(&general, &[call]), "{call:?}");
            }
        }
        for at in [horizon + 1, u64::MAX - 1, u64::MAX, 0] {
            for op in [Op::Allow, Op::AllowN(2), Op::Remaining] {
                run(&**word, &[Call { op, client: 3, at }]);
            }
        }
    }
}

/// The README's pair is a word of its own: the factory picks it, and the
/// strictest rule names the limiter.
#[test]
fn the_readme_pair_is_one_word() {
    let limiter = Builder::from_rules(&"gcra:10/1s,fixed-window:10000/1d".parse().unwrap())
        .clock(ManualClock::new(0))
        .build::<str>()
        .unwrap();
    assert_eq!(limiter.policy(), PolicyKind::Gcra);
    let admitted = (0..50)
        .filter(|_| limiter.check_at("a", 5).allowed())
        .count();
    assert_eq!(admitted, 10);
    let each = limiter.check_ruled_at("a", 5).each;
    let quota = each.iter().nth(1).unwrap().decision;
    assert_eq!(quota.remaining(), 9_990);
}
