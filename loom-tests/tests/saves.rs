//! A save racing checks (`floodgate::state`): the save walks the table and
//! reads each client in one atomic step, while another thread admits a
//! client's last unit and inserts a second client, which moves the first
//! into a larger table during the walk. In every interleaving the save
//! holds the first client exactly once, as it was before the admission or
//! after it (never a torn state, never lost to the move), and loading what
//! it holds into a new limiter gives exactly that state. The same on one
//! word, a 16-byte word, the sliding log's ring, the pairs of one CAS and a
//! frame of several rules with a log.
#![cfg(floodgate_loom)]

use floodgate::policy::{Compound, FixedWindow, Gcra, Pair, Policy, SlidingWindow, WindowPair};
use floodgate::state::Group;
use floodgate::{Bounds, Config, Limiter, ManualClock, RateLimiter, RuleSet};
use loom::sync::Arc;
use loom::thread;

/// Client 1 has spent one of its two units at tick 0 and fills the table
/// (under loom a new table has room for one client). A thread admits its
/// second unit at 10 and then creates client 2 (a move of client 1) while
/// the save walks. The save holds client 1 once; loaded, it has 1 unit
/// left (saved before the admission) or none (after); client 2 is in the
/// save or not, with its one admission if it is.
fn a_save_races_a_check_and_a_move<P: Policy>(make: impl Fn() -> P + Sync + Send + 'static) {
    let make = std::sync::Arc::new(make);
    floodgate_loom_tests::model(move || {
        let limiter = Arc::new(
            Limiter::<u64, P, _>::with_bounds(make(), ManualClock::new(0), Bounds::new()).unwrap(),
        );
        assert!(limiter.check_at(&1, 0).allowed());
        let checker = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                assert!(limiter.check_at(&1, 10).allowed());
                assert!(limiter.check_at(&2, 10).allowed());
            })
        };
        let mut saved = Vec::new();
        RateLimiter::save_clients(&*limiter, &mut |group, key: &u64, words| {
            assert_eq!(group, "");
            saved.push((*key, words.to_vec()));
        });
        checker.join().unwrap();
        let ones = saved.iter().filter(|(key, _)| *key == 1).count();
        assert_eq!(ones, 1, "client 1 saved once: {saved:?}");
        let loaded =
            Limiter::<u64, P, _>::with_bounds(make(), ManualClock::new(10), Bounds::new()).unwrap();
        let groups = vec![Group {
            name: String::new(),
            rules: RateLimiter::rules(&loaded),
            clients: saved
                .iter()
                .map(|(key, words)| (*key, &words[..]))
                .collect(),
        }];
        assert_eq!(RateLimiter::load_clients(&loaded, groups), Ok(saved.len()));
        let left = loaded.remaining_at(&1, 10);
        assert!(left <= 1, "client 1 as it was, before or after: {left}");
        if saved.iter().any(|(key, _)| *key == 2) {
            assert_eq!(
                loaded.remaining_at(&2, 10),
                1,
                "client 2 with its admission"
            );
        }
    });
}

fn rules(text: &str) -> RuleSet {
    text.parse().expect("valid rules")
}

#[test]
fn a_save_races_a_check_and_a_move_on_one_word() {
    a_save_races_a_check_and_a_move(|| Gcra::new(Config::per_ticks(2, 1_000).unwrap()).unwrap());
}

#[test]
fn a_save_races_a_check_and_a_move_on_a_wide_word() {
    a_save_races_a_check_and_a_move(|| {
        FixedWindow::new(Config::per_ticks(2, 1_000).unwrap()).unwrap()
    });
}

#[test]
fn a_save_races_a_check_and_a_move_on_a_log() {
    a_save_races_a_check_and_a_move(|| {
        SlidingWindow::new(Config::per_ticks(2, 1_000).unwrap()).unwrap()
    });
}

#[test]
fn a_save_races_a_check_and_a_move_on_the_pairs() {
    a_save_races_a_check_and_a_move(|| {
        Pair::from_rules(&rules("gcra:2/1000ticks,token-bucket:5/1000ticks")).unwrap()
    });
    a_save_races_a_check_and_a_move(|| {
        WindowPair::from_rules(&rules("gcra:2/1000ticks,fixed-window:5/1000ticks")).unwrap()
    });
}

#[test]
fn a_save_races_a_check_and_a_move_on_a_frame_with_a_log() {
    a_save_races_a_check_and_a_move(|| {
        Compound::from_rules(&rules("sliding-window:2/1000ticks,gcra:5/1000ticks")).unwrap()
    });
}
