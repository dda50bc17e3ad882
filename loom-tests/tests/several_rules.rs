//! Several rules on one client (`policy::Pair`, one 16-byte CAS over two
//! one-word rules; `policy::WindowPair` and `policy::WideWindowPair`, one
//! over a drip rule and a window rule, without and with the origin;
//! `policy::Compound`, a frame of words swapped by a versioned 16-byte CAS
//! and recycled through the threads' spares), raced under loom: the step
//! racing itself, a reader of every rule, the table's rebuild, a sweep and
//! `forget`, a reader of a frame that is being reused for another client;
//! each with a `sliding-window` rule too, whose log's ring the frames share
//! and helpers write. Every model checks that each
//! rule spent exactly what the others did (no thread sees one rule spent
//! and another not) and that admissions are exact.
#![cfg(floodgate_loom)]

use floodgate::policy::{Compound, Pair, Policy, WideWindowPair, WindowPair};
use floodgate::{Bounds, Limiter, ManualClock, RateLimiter, RuleSet};
use loom::sync::Arc;
use loom::thread;

/// `gcra` 2 per 20 ticks and a second rule of 3: two admissions at one
/// instant, then the first rule refuses.
const PAIR: &str = "gcra:2/20ticks,token-bucket:3/30ticks";
const COMPOUND: &str = "gcra:2/20ticks,fixed-window:3/10ticks";
/// The same rules in one word: the drip word beside the window's counts and
/// its end (or, in the wide word, the low bits of its index).
const WINDOW_PAIR: &str = COMPOUND;
/// The counter beside a drip rule: two counts and the index in the word.
const COUNTER_PAIR: &str = "leaky-bucket:2/20ticks,sliding-window-counter:3/10ticks";
/// A log among the rules: its view over a ring every frame shares, whose
/// latest entry a helper writes after the frame's CAS.
const LOG: &str = "sliding-window:2/10ticks,gcra:3/30ticks";

fn limiter<P: Policy>(
    make: fn(&RuleSet) -> P,
    rules: &str,
    bounds: Bounds,
) -> Arc<Limiter<u64, P, ManualClock>> {
    let rules: RuleSet = rules.parse().expect("valid rules");
    Arc::new(Limiter::with_bounds(make(&rules), ManualClock::new(0), bounds).unwrap())
}

fn pair(rules: &RuleSet) -> Pair {
    Pair::from_rules(rules).unwrap()
}

fn window_pair(rules: &RuleSet) -> WindowPair {
    WindowPair::from_rules(rules).unwrap()
}

fn wide_pair(rules: &RuleSet) -> WideWindowPair {
    WideWindowPair::from_rules(rules).unwrap()
}

fn compound(rules: &RuleSet) -> Compound {
    Compound::from_rules(rules).unwrap()
}

/// What each rule of `key` has spent at `now`, read in one look.
fn spent<P: Policy>(limiter: &Limiter<u64, P, ManualClock>, key: u64, now: u64) -> Vec<u64> {
    limiter
        .check_ruled_n_at(&key, now, 0)
        .each
        .iter()
        .map(|answer| answer.rule.config().limit() - answer.decision.remaining())
        .collect()
}

/// Two threads check client 1 at one instant while a third reads every
/// rule: exactly two are admitted (the first rule's limit), every look
/// finds both rules spent alike, and afterwards each rule spent two.
fn the_step_races_itself<P: Policy>(make: fn(&RuleSet) -> P, rules: &'static str) {
    floodgate_loom_tests::model(move || {
        let limiter = limiter(make, rules, Bounds::new());
        assert!(limiter.check_at(&1, 5).allowed());
        let checker = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check_at(&1, 5))
        };
        let reader = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || spent(&limiter, 1, 5))
        };
        let mine = limiter.check_at(&1, 5);
        let other = checker.join().unwrap();
        let seen = reader.join().unwrap();
        assert_eq!(
            usize::from(mine.allowed()) + usize::from(other.allowed()),
            1,
            "{mine:?} {other:?}"
        );
        assert!(
            seen[0] == seen[1],
            "one rule spent without the other: {seen:?}"
        );
        assert!(seen[0] == 1 || seen[0] == 2, "{seen:?}");
        assert_eq!(spent(&limiter, 1, 5), vec![2, 2]);
        let refused = if mine.allowed() { other } else { mine };
        assert_eq!(refused.refused_by(), Some(0), "the burst refused it");
    });
}

#[test]
fn the_pair_step_races_itself() {
    the_step_races_itself(pair, PAIR);
}

#[test]
fn the_compound_step_races_itself() {
    the_step_races_itself(compound, COMPOUND);
}

/// Client 1 has spent one and fills the table; a check of it races the
/// insert of client 2, which moves client 1 into a larger table: the
/// check lands before the freeze (and moves with it) or after, never on
/// both and never on neither.
fn a_rebuild_races_a_check<P: Policy>(make: fn(&RuleSet) -> P, rules: &'static str) {
    floodgate_loom_tests::model(move || {
        let limiter = limiter(make, rules, Bounds::new());
        assert!(limiter.check_at(&1, 0).allowed());
        let inserter = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check_at(&2, 0))
        };
        let checked = limiter.check_at(&1, 0);
        assert!(inserter.join().unwrap().allowed());
        assert!(checked.allowed(), "the second of two");
        assert_eq!(spent(&limiter, 1, 0), vec![2, 2], "the admission moved");
        assert_eq!(spent(&limiter, 2, 0), vec![1, 1]);
        assert!(!limiter.check_at(&1, 0).allowed());
        assert_eq!(limiter.tracked_clients(), 2);
    });
}

/// Limits large enough for a weighted admission: client 2 spends 3 of
/// both rules where client 1 spends 1, so a frame read as client 1's that
/// holds client 2's words (or half of them) shows.
const RECYCLED: &str = "gcra:4/40ticks,fixed-window:5/10ticks";

/// A frame replaced on one client becomes the replacing thread's spare,
/// and that thread's next admission fills it with another client's words
/// (`frame`'s module docs). Here a writer admits client 1 (client 1's old
/// frame becomes its spare) and then client 2 (that frame is written with
/// client 2's words and published there), while a reader reads client 1,
/// perhaps from the old frame as it is being rewritten: every look finds
/// client 1 as it was (spent 1 of each rule) or as the writer left it
/// (spent 2 of each), never client 2's words (4) nor a mix of both.
fn a_recycled_frame_is_never_read_as_its_old_client(rules: &'static str) {
    floodgate_loom_tests::model(move || {
        let limiter = limiter(compound, rules, Bounds::new());
        assert!(limiter.check_at(&1, 0).allowed());
        assert!(limiter.check_n_at(&2, 0, 3).allowed());
        let writer = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                assert!(limiter.check_at(&1, 0).allowed());
                assert!(limiter.check_at(&2, 0).allowed());
            })
        };
        let seen = spent(&limiter, 1, 0);
        assert!(
            seen == [1, 1] || seen == [2, 2],
            "client 1 read from a frame being reused: {seen:?}"
        );
        writer.join().unwrap();
        assert_eq!(spent(&limiter, 1, 0), vec![2, 2]);
        assert_eq!(spent(&limiter, 2, 0), vec![4, 4]);
    });
}

#[test]
fn a_recycled_frame_is_never_read_as_its_old_client_of_two_rules() {
    a_recycled_frame_is_never_read_as_its_old_client(RECYCLED);
}

#[test]
fn the_step_with_a_log_races_itself() {
    the_step_races_itself(compound, LOG);
}

#[test]
fn a_rebuild_races_a_pair_check() {
    a_rebuild_races_a_check(pair, PAIR);
}

#[test]
fn a_rebuild_races_a_compound_check() {
    a_rebuild_races_a_check(compound, COMPOUND);
}

/// A sweep at 1,000, when client 1 (admitted at 0) is idle by every rule,
/// races a check of client 1: the check lands on the old state (which is
/// then not idle and stays) or on a state made after the sweep took the
/// old one; either way client 1 ends with one admission in each rule.
fn a_sweep_races_a_check<P: Policy>(make: fn(&RuleSet) -> P, rules: &'static str) {
    floodgate_loom_tests::model(move || {
        let limiter = limiter(make, rules, Bounds::new());
        assert!(limiter.check_at(&1, 0).allowed());
        let sweeper = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.sweep_at(1_000))
        };
        let checked = limiter.check_at(&1, 1_000);
        let removed = sweeper.join().unwrap();
        assert!(checked.allowed());
        assert!(removed <= 1);
        assert_eq!(spent(&limiter, 1, 1_000), vec![1, 1]);
        assert_eq!(limiter.tracked_clients(), 1);
    });
}

#[test]
fn a_rebuild_races_a_check_with_a_log() {
    a_rebuild_races_a_check(compound, LOG);
}

#[test]
fn a_sweep_races_a_pair_check() {
    a_sweep_races_a_check(pair, PAIR);
}

#[test]
fn a_sweep_races_a_compound_check() {
    a_sweep_races_a_check(compound, COMPOUND);
}

/// `forget` races a check of client 1 (which spent one): the check is
/// decided on the old state (then forgotten with it) or on a new one,
/// never on both, and a new one has spent the check's admission in every
/// rule.
fn forget_races_a_check<P: Policy>(make: fn(&RuleSet) -> P, rules: &'static str) {
    floodgate_loom_tests::model(move || {
        let limiter = limiter(make, rules, Bounds::new());
        assert!(limiter.check_at(&1, 0).allowed());
        let forgetter = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.forget(&1))
        };
        let checked = limiter.check_at(&1, 0);
        assert!(forgetter.join().unwrap(), "client 1 had state");
        assert!(checked.allowed());
        match limiter.peek_at(&1, 0) {
            // Decided on the old state, which went with `forget`.
            None => {}
            // Decided on a new state, made after `forget`.
            Some(_) => assert_eq!(spent(&limiter, 1, 0), vec![1, 1]),
        }
    });
}

#[test]
fn a_sweep_races_a_check_with_a_log() {
    a_sweep_races_a_check(compound, LOG);
}

#[test]
fn forget_races_a_pair_check() {
    forget_races_a_check(pair, PAIR);
}

#[test]
fn forget_races_a_compound_check() {
    forget_races_a_check(compound, COMPOUND);
}

#[test]
fn forget_races_a_check_with_a_log() {
    forget_races_a_check(compound, LOG);
}

#[test]
fn the_window_pair_step_races_itself() {
    the_step_races_itself(window_pair, WINDOW_PAIR);
}

#[test]
fn the_counter_pair_step_races_itself() {
    the_step_races_itself(window_pair, COUNTER_PAIR);
}

#[test]
fn a_rebuild_races_a_window_pair_check() {
    a_rebuild_races_a_check(window_pair, WINDOW_PAIR);
}

#[test]
fn a_sweep_races_a_window_pair_check() {
    a_sweep_races_a_check(window_pair, WINDOW_PAIR);
}

#[test]
fn forget_races_a_window_pair_check() {
    forget_races_a_check(window_pair, WINDOW_PAIR);
}

#[test]
fn the_wide_pair_step_races_itself() {
    the_step_races_itself(wide_pair, WINDOW_PAIR);
}

#[test]
fn the_wide_counter_pair_step_races_itself() {
    the_step_races_itself(wide_pair, COUNTER_PAIR);
}

#[test]
fn a_rebuild_races_a_wide_pair_check() {
    a_rebuild_races_a_check(wide_pair, WINDOW_PAIR);
}

#[test]
fn a_sweep_races_a_wide_pair_check() {
    a_sweep_races_a_check(wide_pair, WINDOW_PAIR);
}

#[test]
fn forget_races_a_wide_pair_check() {
    forget_races_a_check(wide_pair, WINDOW_PAIR);
}

/// A refund with a log among the rules (`LOG`): client 1 admitted twice at
/// tick 1 (the log full, `gcra` 2 of 3 spent). A refund of one of those
/// admissions at tick 2 races a check at tick 2: the refund gives back 1
/// in every order (the log builds a new ring without one of its entries,
/// published by the same CAS as `gcra`'s refund), the check is admitted
/// exactly when the refund came first, and every look finds both rules
/// spent alike. A refund that published the log's new ring apart from the
/// other rules' words, or built it from a ring a newer frame replaced,
/// shows here as rules spent apart or a unit given twice.
#[test]
fn a_refund_races_a_check_with_a_log() {
    floodgate_loom_tests::model(|| {
        let limiter = limiter(compound, LOG, Bounds::new());
        assert!(limiter.check_at(&1, 1).allowed());
        assert!(limiter.check_at(&1, 1).allowed());
        let checker = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check_at(&1, 2))
        };
        let given = limiter.refund_at(&1, 2, 1, 1);
        let checked = checker.join().unwrap();
        assert_eq!(given, 1, "{checked:?}");
        let seen = spent(&limiter, 1, 2);
        assert_eq!(seen[0], seen[1], "one rule spent without the other");
        let expected = if checked.allowed() { 2 } else { 1 };
        assert_eq!(seen, vec![expected, expected], "{checked:?}");
        assert_eq!(limiter.refund_at(&1, 2, 1, 2), 1, "one unit of it left");
    });
}

/// Client 1 (`LOG`) spent both of its log's units at tick 0 and fills the
/// table; a refund of one of them at tick 5 races the insert of client 2,
/// which moves client 1 into a larger table (the new state shares the
/// frame's ring, one more count of it). The refund lands once, before the
/// freeze (and moves with it) or after it on the moved state: it gives
/// back 1 in every order, and client 1 then has one more admission.
#[test]
fn a_refund_races_a_rebuild_with_a_log() {
    floodgate_loom_tests::model(|| {
        let limiter = limiter(compound, LOG, Bounds::new());
        assert!(limiter.check_n_at(&1, 0, 2).allowed());
        let inserter = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check_at(&2, 5))
        };
        let given = limiter.refund_at(&1, 5, 0, 1);
        assert!(inserter.join().unwrap().allowed());
        assert_eq!(given, 1);
        assert_eq!(spent(&limiter, 1, 5), vec![1, 1]);
        assert!(limiter.check_at(&1, 5).allowed());
        assert!(!limiter.check_at(&1, 5).allowed());
        assert_eq!(limiter.tracked_clients(), 2);
    });
}

/// Both land, whichever comes first: client 1 (`LOG`) admitted once at
/// tick 1; a refund of that admission races a check at tick 2, which is
/// admitted in every order. The refund's CAS fails when the check
/// published first, and its next pass builds the log's new ring again
/// from the frame that holds the check's entry: every order ends with the
/// refund's 1 given back and only the check's unit spent, in both rules.
/// A refund that kept the ring it built before that failure loses the
/// check's entry (the log spent 0); one that answered without publishing
/// leaves both spent.
#[test]
fn a_refund_and_a_check_with_a_log_both_land() {
    floodgate_loom_tests::model(|| {
        let limiter = limiter(compound, LOG, Bounds::new());
        assert!(limiter.check_at(&1, 1).allowed());
        let checker = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check_at(&1, 2))
        };
        let given = limiter.refund_at(&1, 2, 1, 1);
        let checked = checker.join().unwrap();
        assert_eq!(given, 1);
        assert!(checked.allowed());
        assert_eq!(spent(&limiter, 1, 2), vec![1, 1]);
    });
}

/// One unit a window on both rules, the log among them: a refund at 50 of
/// the admission at 0 gives both back, after which the client is idle.
const REFUNDED_LOG: &str = "sliding-window:1/100ticks,gcra:1/100ticks";

/// A refund with a log among the rules races a sweep (`REFUNDED_LOG`,
/// admitted at 0): the client is busy until the refund lands, so the sweep
/// removes it only after it, and the refund gives back its 1 in every
/// order (a refund that followed a client the sweep had retired, instead
/// of looking again, would give nothing).
#[test]
fn a_refund_races_a_sweep_with_a_log() {
    floodgate_loom_tests::model(|| {
        let limiter = limiter(compound, REFUNDED_LOG, Bounds::new());
        assert!(limiter.check_at(&7, 0).allowed());
        let sweeper = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.sweep_at(50))
        };
        let given = limiter.refund_at(&7, 50, 0, 1);
        let removed = sweeper.join().unwrap();
        assert_eq!(given, 1, "the client was busy until the refund");
        assert_eq!(limiter.tracked_clients(), 1 - removed);
        let kept = limiter.peek_at(&7, 50);
        assert_eq!(kept, (removed == 0).then_some(1), "removed {removed}");
    });
}

/// A refund with a log among the rules races `forget` (`REFUNDED_LOG`):
/// it gives back 1 if it came first and 0 after (it finds no client and
/// creates none); nothing is left either way.
#[test]
fn a_refund_races_forget_with_a_log() {
    floodgate_loom_tests::model(|| {
        let limiter = limiter(compound, REFUNDED_LOG, Bounds::new());
        assert!(limiter.check_at(&7, 0).allowed());
        let forgetter = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || RateLimiter::forget(&*limiter, &7))
        };
        let given = limiter.refund_at(&7, 10, 0, 1);
        assert!(
            forgetter.join().unwrap(),
            "the client had state until forget"
        );
        assert!(given <= 1);
        assert_eq!(limiter.peek_at(&7, 10), None, "given {given}: nothing left");
        assert_eq!(limiter.tracked_clients(), 0);
    });
}
