//! The local side of leases (`src/lease.rs`, SPEC.md "A limit shared by
//! many instances"): one client's two lease slots, each one word of units
//! and end, and its plan word. Every step is one CAS on one word (a spend,
//! a refund back into a lease, a landing's claim of a slot as `LANDING`
//! and its publish), so what can go wrong is a step computed from a word
//! another thread changed since: a unit spent twice, a refund landing in
//! the lease that replaced its own, a landing that overwrites a live lease
//! or loses the units it replaced, two leases taken ahead at once.
//!
//! Each model lands its leases at distinct ends and names each by its
//! `taken_at`, then, once every thread has finished, spends what is left
//! unit by unit (`drain`): the units each lease gave out, kept or lapsed
//! are counted per lease from the `Spent` answers, and must sum to what it
//! was landed with (plus what was given back to it). A unit spent twice
//! shows as two answers with the same `left` from one lease, or as more
//! units than the lease held; a refund in the wrong lease as a lease that
//! gives out more than it had.
//!
//! Why distinct ends: two leases of one size and one end, one after the
//! other in one slot, are the same word to a step preempted across the
//! second's landing (an ABA on the word). Its CAS then succeeds on the new
//! lease while it reports the old one's `taken_at` and `rest`, and a
//! refund checked against the old lease goes into the new one; units are
//! still conserved. The slot word has no room for a count of landings
//! that would tell the two apart, so that case is left out here.
#![cfg(floodgate_loom)]

// The models sit in a module named as the file, so that
// `loom-tests/run leases` picks out all of them and only them.
mod leases {
    use floodgate::__loom::{Landing, LeaseSlots, Spent};
    use loom::sync::Arc;
    use loom::thread;

    /// Spends what is left at `now_ms` one unit at a time (a model holds at
    /// most a few units, so 16 spends end it; the assertion says if not).
    fn drain(slots: &LeaseSlots, now_ms: u64) -> Vec<Spent> {
        let spent: Vec<Spent> = (0..16).map_while(|_| slots.spend(now_ms, 1)).collect();
        assert!(spent.len() < 16, "a model's leases hold fewer units");
        spent
    }

    /// Checks the spends of unit cost taken from the lease taken at `taken_at`
    /// and returns how many there were: each says a different `left` (each
    /// unit spent once), all below `units`, what the lease was landed with
    /// plus what was given back to it.
    fn spent_from(spent: &[Spent], taken_at: u64, units: u64) -> u64 {
        let mut lefts: Vec<u64> = spent
            .iter()
            .filter(|spent| spent.taken_at == taken_at)
            .map(|spent| spent.left)
            .collect();
        let count = lefts.len() as u64;
        lefts.sort_unstable();
        lefts.dedup();
        assert_eq!(lefts.len() as u64, count, "a unit spent twice: {spent:?}");
        assert!(
            lefts.iter().all(|&left| left < units),
            "lease {taken_at} gave out more than its {units}: {spent:?}"
        );
        count
    }

    fn lapsed(landing: Landing) -> u64 {
        match landing {
            Landing::Landed { lapsed } => lapsed,
            Landing::NoRoom => panic!("a slot was free or ended"),
        }
    }

    /// Lease 1 (1 unit, ending at 100) is live; two checks at 50 race for
    /// its last unit while lease 2 (2 units, ending at 200) lands. The lander
    /// finds slot 0 live and takes slot 1, or finds it spent out and replaces
    /// it (nothing lapses: it had not ended), so the check that lost the race
    /// for lease 1's unit may meet lease 2 in either slot, or a slot being
    /// landed into. Every unit is spent at most once, and the units spent,
    /// held at the end and lapsed sum to the 3 landed. A spend whose CAS did
    /// not expect the word it computed from (a load then a store) writes lease
    /// 1's spent-out word over lease 2's, losing its units, or spends lease
    /// 1's unit twice.
    #[test]
    fn a_spend_races_a_landing_in_the_other_slot() {
        floodgate_loom_tests::model(|| {
            let slots = Arc::new(LeaseSlots::new());
            assert_eq!(slots.land(0, 1, 100, 1, 0), Landing::Landed { lapsed: 0 });
            let spenders: Vec<_> = (0..2)
                .map(|_| {
                    let slots = Arc::clone(&slots);
                    thread::spawn(move || slots.spend(50, 1))
                })
                .collect();
            let lapsed = lapsed(slots.land(50, 2, 200, 2, 0));
            let mut spent: Vec<Spent> = spenders
                .into_iter()
                .filter_map(|spender| spender.join().unwrap())
                .collect();
            assert!(!spent.is_empty(), "lease 1's unit went to one of them");
            let held = slots.held(50);
            let drained = drain(&slots, 50);
            assert_eq!(drained.len() as u64, held, "held is what can be spent");
            spent.extend(drained);
            assert_eq!(lapsed, 0, "nothing ended");
            let total = spent_from(&spent, 1, 1) + spent_from(&spent, 2, 2);
            assert_eq!(total + lapsed, 3, "{spent:?}");
        });
    }

    /// Lease 1 (2 units) ends at 10. A check at 9 and then one at 10 race
    /// the landing, at 10, of lease 2 (3 units, ending at 30), which always
    /// replaces the ended lease 1 and lapses what it still held. The check at
    /// 10 never takes from lease 1 (only from lease 2, or nothing); the check
    /// at 9 takes from either; and lease 1's units are spent or lapsed, never
    /// both: its spends plus the lapsed units are its 2, and all units spent,
    /// held and lapsed are the 5 landed. A spend that compared its time with
    /// the end of a word it did not CAS against, or a landing that lapsed a
    /// count read before its claim, would count a unit twice.
    #[test]
    fn a_lease_ends_while_a_check_spends_from_it() {
        floodgate_loom_tests::model(|| {
            let slots = Arc::new(LeaseSlots::new());
            assert_eq!(slots.land(0, 2, 10, 1, 0), Landing::Landed { lapsed: 0 });
            let spender = {
                let slots = Arc::clone(&slots);
                thread::spawn(move || (slots.spend(9, 1), slots.spend(10, 1)))
            };
            let lapsed = lapsed(slots.land(10, 3, 30, 2, 0));
            let (before_end, at_end) = spender.join().unwrap();
            if let Some(at_end) = at_end {
                assert_eq!(at_end.taken_at, 2, "lease 1 ended at 10: {at_end:?}");
            }
            let mut spent: Vec<Spent> = [before_end, at_end].into_iter().flatten().collect();
            spent.extend(drain(&slots, 10));
            let from_first = spent_from(&spent, 1, 2);
            assert_eq!(
                from_first + lapsed,
                2,
                "lease 1: {spent:?}, {lapsed} lapsed"
            );
            assert_eq!(spent_from(&spent, 2, 3), 3, "lease 2: {spent:?}");
        });
    }

    /// Lease 1 (2 units) ends at 10. A check at 9 (its time read before
    /// the end) spends from it while a request at 10, finding nothing to
    /// spend, reclaims what it left unspent (to give back to the store),
    /// and lease 2 (3 units, ending at 30) lands at 10, replacing it and
    /// lapsing what it still holds. Lease 1's units are spent, reclaimed or
    /// lapsed, each once: the three counts sum to its 2. A reclaim that
    /// wrote a spent-out word computed from a stale read would hand a unit
    /// out twice (spent and reclaimed), or lose the new lease's units; one
    /// that read the lease's time after its CAS could name lease 2.
    #[test]
    fn a_reclaim_races_a_spend_and_a_landing_at_the_lease_end() {
        floodgate_loom_tests::model(|| {
            let slots = Arc::new(LeaseSlots::new());
            assert_eq!(slots.land(0, 2, 10, 1, 0), Landing::Landed { lapsed: 0 });
            let spender = {
                let slots = Arc::clone(&slots);
                thread::spawn(move || slots.spend(9, 1))
            };
            let reclaimer = {
                let slots = Arc::clone(&slots);
                thread::spawn(move || slots.reclaim_ended(10))
            };
            let lapsed = lapsed(slots.land(10, 3, 30, 2, 0));
            let mut spent: Vec<Spent> = spender.join().unwrap().into_iter().collect();
            let reclaimed = match reclaimer.join().unwrap() {
                Some((units, taken_at, _)) => {
                    assert_eq!(taken_at, 1, "only lease 1 has ended");
                    units
                }
                None => 0,
            };
            spent.extend(drain(&slots, 10));
            let from_first = spent_from(&spent, 1, 2);
            assert_eq!(
                from_first + reclaimed + lapsed,
                2,
                "lease 1: {spent:?}, {reclaimed} reclaimed, {lapsed} lapsed"
            );
            assert_eq!(spent_from(&spent, 2, 3), 3, "lease 2: {spent:?}");
        });
    }

    /// Lease 1 (1 unit, ending at 10) is spent out; its admission's refund of
    /// that unit at 5 races a check at 5 and the landing at 5 of lease 2 (2
    /// units, ending at 20), which replaces the spent-out lease 1 unless the
    /// refund came first (then lease 1 is live again and lease 2 takes slot
    /// 1). The refund lands in lease 1 or not at all (then it goes back to
    /// the store, as its caller does): after its first spend lease 1 gives
    /// out exactly the unit given back to it, if any, lease 2 exactly its 2,
    /// and nothing lapses. (The check may find nothing: a slot being landed
    /// into holds no units until it is published, and then its caller asks
    /// the store.) A refund that checked its
    /// lease's `taken_at` but CASed a word it had not read it with would put
    /// the unit in lease 2, which would then give out 3.
    #[test]
    fn a_refund_races_a_spend_and_a_landing() {
        floodgate_loom_tests::model(|| {
            let slots = Arc::new(LeaseSlots::new());
            assert_eq!(slots.land(0, 1, 10, 1, 0), Landing::Landed { lapsed: 0 });
            let first = slots.spend(0, 1).expect("1 held");
            let refunder = {
                let slots = Arc::clone(&slots);
                thread::spawn(move || slots.give_back(5, 1, 1))
            };
            let spender = {
                let slots = Arc::clone(&slots);
                thread::spawn(move || slots.spend(5, 1))
            };
            let lapsed = lapsed(slots.land(5, 2, 20, 2, 0));
            let given_back = u64::from(refunder.join().unwrap());
            // After `first`, lease 1 holds only what was given back to it.
            let mut spent: Vec<Spent> = spender.join().unwrap().into_iter().collect();
            spent.extend(drain(&slots, 5));
            assert_eq!(lapsed, 0, "nothing ended");
            assert_eq!(first.left, 0);
            let from_first = spent_from(&spent, 1, given_back);
            assert_eq!(from_first, given_back, "{spent:?}, given back {given_back}");
            assert_eq!(spent_from(&spent, 2, 2), 2, "{spent:?}");
        });
    }

    /// Both slots free: two leases (2 and 3 units, ending at 10) land at 0 at
    /// once. Each claims a slot of its own (a lander that finds the other's
    /// `LANDING` moves on), so both land, nothing lapses, and 5 units are
    /// held, each lease's own. A claim that was a load then a store would let
    /// both write one slot and lose a lease.
    #[test]
    fn two_landings_race_into_free_slots() {
        floodgate_loom_tests::model(|| {
            let slots = Arc::new(LeaseSlots::new());
            let lander = {
                let slots = Arc::clone(&slots);
                thread::spawn(move || slots.land(0, 2, 10, 1, 0))
            };
            let second = slots.land(0, 3, 10, 2, 0);
            let first = lander.join().unwrap();
            assert_eq!(first, Landing::Landed { lapsed: 0 });
            assert_eq!(second, Landing::Landed { lapsed: 0 });
            assert_eq!(slots.held(0), 5);
            let spent = drain(&slots, 0);
            assert_eq!(spent_from(&spent, 1, 2), 2, "{spent:?}");
            assert_eq!(spent_from(&spent, 2, 3), 3, "{spent:?}");
        });
    }

    /// One slot holds a live lease (1 unit, ending at 10): two leases (2 and
    /// 3 units) land at 0 at once into the one free slot. Exactly one lands;
    /// the other is told `NoRoom` (its caller counts its units as lapsed), and
    /// the units held are the live lease's and the landed one's, nothing
    /// lost but what `NoRoom` reported.
    #[test]
    fn two_landings_race_for_the_last_free_slot() {
        floodgate_loom_tests::model(|| {
            let slots = Arc::new(LeaseSlots::new());
            assert_eq!(slots.land(0, 1, 10, 0, 0), Landing::Landed { lapsed: 0 });
            let lander = {
                let slots = Arc::clone(&slots);
                thread::spawn(move || slots.land(0, 2, 10, 1, 0))
            };
            let second = slots.land(0, 3, 10, 2, 0);
            let first = lander.join().unwrap();
            let landed = [(first, 1, 2), (second, 2, 3)];
            let winners: Vec<_> = landed
                .iter()
                .filter(|(landing, _, _)| *landing == Landing::Landed { lapsed: 0 })
                .collect();
            assert_eq!(winners.len(), 1, "{first:?}, {second:?}");
            assert!(landed
                .iter()
                .any(|(landing, _, _)| *landing == Landing::NoRoom));
            let (_, taken_at, units) = *winners[0];
            assert_eq!(slots.held(0), 1 + units);
            let spent = drain(&slots, 0);
            assert_eq!(spent_from(&spent, 0, 1), 1, "{spent:?}");
            assert_eq!(spent_from(&spent, taken_at, units), units, "{spent:?}");
            assert_eq!(spent.len() as u64, 1 + units, "{spent:?}");
        });
    }

    /// Two threads ask to take a lease ahead at once: exactly one is told to
    /// (one lease ahead in flight at a time). A start that read the plan and
    /// stored it with the bit set, rather than CASing it, lets both go.
    #[test]
    fn one_of_two_starts_takes_the_lease_ahead() {
        floodgate_loom_tests::model(|| {
            let slots = Arc::new(LeaseSlots::new());
            let starter = {
                let slots = Arc::clone(&slots);
                thread::spawn(move || slots.start_ahead())
            };
            let second = slots.start_ahead();
            let first = starter.join().unwrap();
            assert!(first ^ second, "{first}, {second}");
            assert!(!slots.start_ahead(), "one is in flight");
        });
    }

    /// A sweep's `retire_if_idle` at 0 races `start_ahead` on an idle state:
    /// exactly one of them wins. Never both (a lease asked for a retired state
    /// would land where no check looks), and never neither (each fails only
    /// because the other changed the plan). A retire that checked idleness
    /// and then stored `RETIRED`, rather than CASing the plan it read first,
    /// would retire a state with a lease in flight.
    #[test]
    fn a_retire_races_a_start_ahead() {
        floodgate_loom_tests::model(|| {
            let slots = Arc::new(LeaseSlots::new());
            let starter = {
                let slots = Arc::clone(&slots);
                thread::spawn(move || slots.start_ahead())
            };
            let retired = slots.retire_if_idle(0, 0);
            let started = starter.join().unwrap();
            assert!(retired ^ started, "retired {retired}, started {started}");
            assert_eq!(slots.retired(), retired);
        });
    }
}
