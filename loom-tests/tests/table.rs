//! The inline store's own races (`store::inline`). Under loom a new table
//! has two slots and room for one client, so the second client's insert
//! rebuilds it: each model below races a rebuild (or a sweep) with checks
//! and inserts, and counts every admission exactly.
#![cfg(floodgate_loom)]

use floodgate::policy::{FixedWindow, Gcra, Policy, SlidingWindow, TokenBucket};
use floodgate::{Bounds, Config, Limiter, ManualClock};
use loom::sync::Arc;
use loom::thread;

fn limiter<P: Policy>(limit: u64, bounds: Bounds) -> Arc<Limiter<u64, P, ManualClock>> {
    let policy = P::new(Config::per_ticks(limit, 1_000).unwrap()).unwrap();
    Arc::new(Limiter::with_bounds(policy, ManualClock::new(0), bounds).unwrap())
}

/// Client 1 has spent one of two and fills the table; a check of it races
/// the insert of client 2, which moves client 1 into a larger table. The check lands on the old
/// state before the freeze (and moves with it) or on the moved state,
/// never on both and never on neither: client 1 ends with nothing left,
/// whichever order, and both clients are found afterwards.
fn a_rebuild_races_a_check<P: Policy>() {
    floodgate_loom_tests::model(|| {
        let limiter = limiter::<P>(2, Bounds::new());
        assert!(limiter.check_at(&1, 0).allowed());
        let inserter = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check_at(&2, 0))
        };
        let checked = limiter.check_at(&1, 0);
        let inserted = inserter.join().unwrap();
        assert!(checked.allowed(), "the second of two is admitted");
        assert_eq!(checked.remaining(), 0);
        assert!(inserted.allowed());
        assert_eq!(inserted.remaining(), 1);
        assert_eq!(limiter.peek_at(&1, 0), Some(0), "the admission moved");
        assert_eq!(limiter.peek_at(&2, 0), Some(1));
        assert!(!limiter.check_at(&1, 0).allowed());
        assert_eq!(limiter.tracked_clients(), 2);
        assert_eq!(limiter.stored_clients(), 2);
    });
}

#[test]
fn a_rebuild_races_a_check_gcra() {
    a_rebuild_races_a_check::<Gcra>();
}

#[test]
fn a_rebuild_races_a_check_token_bucket() {
    a_rebuild_races_a_check::<TokenBucket>();
}

#[test]
fn a_rebuild_races_a_check_fixed_window() {
    a_rebuild_races_a_check::<FixedWindow>();
}

#[test]
fn a_rebuild_races_a_check_sliding_window() {
    a_rebuild_races_a_check::<SlidingWindow>();
}

/// Two new clients race into a full table (client 1 filled it): one
/// rebuilds it, the other waits for the move (the move alone writes the
/// new table's empty slots while it runs) and inserts after. Both end with
/// exactly one state each, and the old client's admission is carried.
#[test]
fn two_inserts_race_a_rebuild() {
    floodgate_loom_tests::model(|| {
        let limiter = limiter::<Gcra>(1, Bounds::new());
        assert!(limiter.check_at(&1, 0).allowed());
        let other = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check_at(&2, 0))
        };
        let third = limiter.check_at(&3, 0);
        assert!(other.join().unwrap().allowed());
        assert!(third.allowed());
        for key in 1..=3 {
            assert_eq!(limiter.peek_at(&key, 0), Some(0), "client {key}");
            assert!(!limiter.check_at(&key, 0).allowed(), "client {key}");
        }
        assert_eq!(limiter.tracked_clients(), 3);
        assert_eq!(limiter.stored_clients(), 3);
    });
}

/// The same new client's first calls from two threads while the table is
/// full: whichever inserts it (after the rebuild, which one of them runs),
/// the other finds it, and exactly one is admitted (`L = 1`).
#[test]
fn one_new_client_from_two_threads_during_a_rebuild() {
    floodgate_loom_tests::model(|| {
        let limiter = limiter::<Gcra>(1, Bounds::new());
        assert!(limiter.check_at(&1, 0).allowed());
        let other = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check_at(&2, 0))
        };
        let mine = limiter.check_at(&2, 0);
        let other = other.join().unwrap();
        assert_eq!(
            usize::from(mine.allowed()) + usize::from(other.allowed()),
            1,
            "one state for client 2: {mine:?} {other:?}"
        );
        assert_eq!(limiter.tracked_clients(), 2);
        assert_eq!(limiter.stored_clients(), 2);
    });
}

/// `forget` racing the rebuild that a new client's insert starts: client 1
/// fills the table and is forgotten while client 2's insert moves it. The
/// move leaves a `FULL` slot's tag to whoever holds `upkeep`, which
/// `forget` takes too: client 1 is removed once, in whichever table it
/// was, and is never carried into the new one.
#[test]
fn forget_races_a_rebuild() {
    floodgate_loom_tests::model(|| {
        let limiter = limiter::<Gcra>(1, Bounds::new());
        assert!(limiter.check_at(&1, 0).allowed());
        let forgetter = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.forget(&1))
        };
        assert!(limiter.check_at(&2, 0).allowed());
        assert!(forgetter.join().unwrap(), "client 1 had state");
        assert_eq!(limiter.peek_at(&1, 0), None, "forgotten, not moved");
        assert_eq!(limiter.peek_at(&2, 0), Some(0));
        assert!(limiter.check_at(&1, 0).allowed(), "client 1 begins again");
        assert_eq!(limiter.tracked_clients(), 2);
        assert_eq!(limiter.stored_clients(), 2);
    });
}

/// A sweep racing the insert of a new client into a full table: client 1
/// (admitted at 0) is idle at 1,000 and goes; client 2, created at 1,000,
/// is published with its first call decided, so it is never idle, and its
/// insert waits for the sweep if it needs the table rebuilt. Counts stay
/// exact either way.
#[test]
fn a_sweep_races_an_insert() {
    floodgate_loom_tests::model(|| {
        let limiter = limiter::<Gcra>(1, Bounds::new());
        assert!(limiter.check_at(&1, 0).allowed());
        let sweeper = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.sweep_at(1_000))
        };
        let inserted = limiter.check_at(&2, 1_000);
        let removed = sweeper.join().unwrap();
        assert!(inserted.allowed());
        assert_eq!(removed, 1, "client 1 alone is idle at 1,000");
        assert_eq!(limiter.peek_at(&1, 1_000), None);
        assert_eq!(limiter.peek_at(&2, 1_000), Some(0));
        assert_eq!(limiter.tracked_clients(), 1);
        assert_eq!(limiter.stored_clients(), 1);
    });
}

/// `sliding-window` with `L = 1`: client 1 admitted at 0, a thread that
/// checks it at 3,000, and client 2's insert, which rebuilds the table and
/// moves client 1 (the ring shared by both entries, each with its own
/// hint) while that check may hold the old entry.
fn parked_across_a_rebuild() -> (
    Arc<Limiter<u64, SlidingWindow, ManualClock>>,
    thread::JoinHandle<floodgate::Decision>,
) {
    let limiter = limiter::<SlidingWindow>(1, Bounds::new());
    assert!(limiter.check_at(&1, 0).allowed());
    let parked = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.check_at(&1, 3_000))
    };
    assert!(limiter.check_at(&2, 0).allowed(), "client 2 rebuilds");
    (limiter, parked)
}

/// The case that once spun for ever, as a model (`parked_across_a_rebuild`),
/// with client 1 then checked at 1,000 and 2,000 through the new entry. In
/// the schedules where the parked check found the old slot before the move
/// and decides after both later ones, the old entry's hint is two entries
/// behind its ring: the check used to find its hint's slot holding neither
/// entry it knew and retry without end (a model that never ends; loom
/// fails it). Now it catches the hint up. Each answer is one that some
/// order of the calls gives: the check at 3,000 is always admitted (no
/// other admission is within 1,000 before it), and the ones at 1,000 and
/// 2,000 are admitted while they come before it, the second only after the
/// first.
#[test]
fn a_sliding_window_check_parked_across_a_rebuild_returns() {
    floodgate_loom_tests::model(|| {
        let (limiter, parked) = parked_across_a_rebuild();
        let first = limiter.check_at(&1, 1_000).allowed();
        let second = limiter.check_at(&1, 2_000).allowed();
        let parked = parked.join().unwrap();
        assert!(parked.allowed(), "{parked:?}");
        assert!(first || !second, "{first} {second}");
        assert_eq!(
            limiter.remaining_at(&1, 3_000),
            0,
            "the one ring holds 3,000"
        );
        assert!(limiter.check_at(&1, 4_000).allowed());
        assert_eq!(limiter.tracked_clients(), 2);
        assert_eq!(limiter.stored_clients(), 2);
    });
}

/// The same with the retirement mark: client 1 is checked through its new
/// entry once and then forgotten while the parked check may hold the old
/// one. The parked check returns admitted either way: on the ring before
/// it is forgotten (client 1 is then gone, and a check at 3,000 begins it
/// again), or after, on a client it creates (which a check at 3,000 then
/// finds spent).
#[test]
fn a_sliding_window_check_parked_across_a_rebuild_and_forget_returns() {
    floodgate_loom_tests::model(|| {
        let (limiter, parked) = parked_across_a_rebuild();
        limiter.check_at(&1, 1_000);
        assert!(limiter.forget(&1), "client 1 had state");
        let parked = parked.join().unwrap();
        assert!(parked.allowed(), "{parked:?}");
        let recreated = limiter.tracked_clients() == 2;
        assert_eq!(
            limiter.check_at(&1, 3_000).allowed(),
            !recreated,
            "client 1 begun again by the parked check: {recreated}"
        );
    });
}

/// A move in steps (`store::inline`, "Growing in steps"): under loom a step
/// moves one slot, so client 2's insert begins the move of the two-slot
/// table, moves one slot of it and goes on into the new table, leaving the
/// move half done; client 3's insert then finds the new table's free room
/// taken, finishes the move itself and grows the table a second time.
/// Meanwhile another thread checks client 1 twice (`L = 2`): each check
/// lands on the old state before its freeze or on the moved one, so
/// client 1 ends with its two admissions counted once, wherever the move
/// stood when each came, and every client is found afterwards.
#[test]
fn checks_race_a_move_in_steps_and_a_second_growth() {
    floodgate_loom_tests::model(|| {
        let limiter = limiter::<Gcra>(2, Bounds::new());
        assert!(limiter.check_at(&1, 0).allowed());
        let checker = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check_at(&1, 0))
        };
        assert!(limiter.check_at(&2, 0).allowed());
        assert!(limiter.check_at(&3, 0).allowed());
        let checked = checker.join().unwrap();
        assert!(checked.allowed(), "the second of two is admitted");
        assert_eq!(checked.remaining(), 0);
        assert_eq!(limiter.peek_at(&1, 0), Some(0), "both admissions kept");
        assert_eq!(limiter.peek_at(&2, 0), Some(1));
        assert_eq!(limiter.peek_at(&3, 0), Some(1));
        assert!(!limiter.check_at(&1, 0).allowed());
        assert_eq!(limiter.tracked_clients(), 3);
        assert_eq!(limiter.stored_clients(), 3);
    });
}

/// Two new clients' inserts race each other while the move they share is
/// half done: each may take a step of the move, seal its way past the old
/// table or find the new one's room taken; each client is created once
/// (`L = 1`: a second state would admit again) and the moved client keeps
/// its admission.
#[test]
fn two_inserts_race_a_move_in_steps() {
    floodgate_loom_tests::model(|| {
        let limiter = limiter::<Gcra>(1, Bounds::new());
        assert!(limiter.check_at(&1, 0).allowed());
        assert!(limiter.check_at(&2, 0).allowed(), "begins the move");
        let other = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check_at(&3, 0))
        };
        let mine = limiter.check_at(&3, 0);
        let other = other.join().unwrap();
        assert_eq!(
            usize::from(mine.allowed()) + usize::from(other.allowed()),
            1,
            "one state for client 3: {mine:?} {other:?}"
        );
        for key in 1..=3 {
            assert_eq!(limiter.peek_at(&key, 0), Some(0), "client {key}");
        }
        assert_eq!(limiter.tracked_clients(), 3);
        assert_eq!(limiter.stored_clients(), 3);
    });
}

/// `forget` racing the steps of a move: client 2's insert left the move
/// half done, and client 1 (old table, perhaps not moved yet) is forgotten
/// while client 3's insert takes the move's next step. Client 1 is removed
/// once, from whichever table held it then, and never carried on; the
/// counts stay exact.
#[test]
fn forget_races_a_move_in_steps() {
    floodgate_loom_tests::model(|| {
        let limiter = limiter::<Gcra>(1, Bounds::new());
        assert!(limiter.check_at(&1, 0).allowed());
        assert!(limiter.check_at(&2, 0).allowed(), "begins the move");
        let forgetter = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.forget(&1))
        };
        assert!(limiter.check_at(&3, 0).allowed());
        assert!(forgetter.join().unwrap(), "client 1 had state");
        assert_eq!(limiter.peek_at(&1, 0), None, "forgotten, not moved");
        assert_eq!(limiter.peek_at(&2, 0), Some(0));
        assert_eq!(limiter.peek_at(&3, 0), Some(0));
        assert!(limiter.check_at(&1, 0).allowed(), "client 1 begins again");
        assert_eq!(limiter.tracked_clients(), 3);
        assert_eq!(limiter.stored_clients(), 3);
    });
}

/// An explicit sweep racing a new client's arrival while a move is half
/// done: the sweep takes the move's remaining steps before it walks the
/// table, and the arrival may take a step of either (of the sweep's too,
/// and then the sweep's count includes it). Clients 1 and 2, admitted at
/// 0, are idle at 1,000 and both go, once; client 3, created at 1,000, is
/// never idle then and stays.
#[test]
fn a_sweep_races_a_move_in_steps() {
    floodgate_loom_tests::model(|| {
        let limiter = limiter::<Gcra>(1, Bounds::new());
        assert!(limiter.check_at(&1, 0).allowed());
        assert!(limiter.check_at(&2, 0).allowed(), "begins the move");
        let sweeper = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.sweep_at(1_000))
        };
        assert!(limiter.check_at(&3, 1_000).allowed());
        assert_eq!(sweeper.join().unwrap(), 2, "clients 1 and 2 were idle");
        assert_eq!(limiter.peek_at(&1, 1_000), None);
        assert_eq!(limiter.peek_at(&2, 1_000), None);
        assert_eq!(limiter.peek_at(&3, 1_000), Some(0));
        assert_eq!(limiter.tracked_clients(), 1);
        assert_eq!(limiter.stored_clients(), 1);
    });
}

/// A sweep in steps racing a check: client 1 (admitted at 0) and client 2
/// (at 500) grow the table to four slots, which a sweep walks in two steps
/// under loom. At 1,000 client 1 is idle, and so is client 2 until its
/// check at 1,000, which races the sweep: it lands before the sweep judges
/// client 2 (which then stays), or after it removed client 2 (the check
/// then creates it afresh). Either way client 2 ends with that one
/// admission, counted once, and client 1 is gone.
#[test]
fn a_sweep_in_steps_races_a_check() {
    floodgate_loom_tests::model(|| {
        let limiter = limiter::<Gcra>(2, Bounds::new());
        assert!(limiter.check_at(&1, 0).allowed());
        assert!(limiter.check_at(&2, 500).allowed());
        let sweeper = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.sweep_at(1_000))
        };
        let checked = limiter.check_at(&2, 1_000);
        let removed = sweeper.join().unwrap();
        assert!(checked.allowed());
        assert!(removed == 1 || removed == 2, "{removed}");
        assert_eq!(limiter.peek_at(&1, 1_000), None);
        assert_eq!(limiter.peek_at(&2, 1_000), Some(checked.remaining()));
        assert_eq!(limiter.tracked_clients(), 1);
        assert_eq!(limiter.stored_clients(), 1);
    });
}

/// A key whose hash is its `bucket` alone: keys of one bucket share their
/// whole probe path, so a move's placing of one and an insert of another
/// race for the very same slots of the new table.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Colliding {
    id: u64,
    bucket: u64,
}

impl std::hash::Hash for Colliding {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.bucket.hash(state);
    }
}

/// Keys that all collide: client 1 fills the two-slot table, client 2's
/// insert begins the move and takes its first step (one slot), and then
/// clients 3 and 4 arrive at once. Each arrival may take the move's second
/// step — placing client 1 in the new table, if its slot was the second —
/// while the other claims the same slots for its own client, or finds the
/// new table's free room taken and finishes the move. Every client ends
/// with one state: the placing and the inserts never write one slot twice.
/// Run for four buckets, so that client 1 sits in each slot of the old
/// table and its placing lands on each path in the new one.
#[test]
fn a_move_places_clients_while_colliding_inserts_race_it() {
    for bucket in 0..4 {
        floodgate_loom_tests::model(move || {
            let policy = Gcra::new(floodgate::Config::per_ticks(1, 1_000).unwrap()).unwrap();
            let limiter = Arc::new(
                Limiter::<Colliding, Gcra, ManualClock>::with_bounds(
                    policy,
                    ManualClock::new(0),
                    Bounds::new(),
                )
                .unwrap(),
            );
            let key = move |id| Colliding { id, bucket };
            assert!(limiter.check_at(&key(1), 0).allowed());
            assert!(limiter.check_at(&key(2), 0).allowed(), "begins the move");
            let other = {
                let limiter = Arc::clone(&limiter);
                thread::spawn(move || limiter.check_at(&key(3), 0))
            };
            assert!(limiter.check_at(&key(4), 0).allowed());
            assert!(other.join().unwrap().allowed());
            for id in 1..=4 {
                assert_eq!(limiter.peek_at(&key(id), 0), Some(0), "client {id}");
                assert!(!limiter.check_at(&key(id), 0).allowed(), "client {id}");
            }
            assert_eq!(limiter.tracked_clients(), 4);
            assert_eq!(limiter.stored_clients(), 4);
        });
    }
}
