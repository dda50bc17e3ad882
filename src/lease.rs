//! One client's units on lease at one instance (the contract's "A limit
//! shared by many instances"): the lock-free steps that spend them, land a
//! new lease beside them, take a refund back into them and let them lapse,
//! and the size of the next lease to ask for. The store that lends them is
//! elsewhere (`redis::lease`); this file knows nothing of it, so its loom
//! models (`loom-tests/tests/leases.rs`) run without one.
//!
//! # The slot words
//!
//! A client has two slots, so that a lease taken ahead of need lands
//! beside the one it follows instead of merging into it: a merged lease
//! would have to end at the earlier of the two ends (stranding the new
//! units) or at the later (spending the old ones past their own end, over
//! the contract's bound). A slot is one word:
//!
//! ```text
//! bits 63..20  the lease's end, whole milliseconds of the limiter's time
//!              line, rounded down (44 bits: 557 years of Unix time)
//! bits 19..0   the units left, at most MAX_UNITS = 2^20 - 1
//! ```
//!
//! 0 is an empty slot; [`LANDING`] (an end of all ones, no units) a slot a
//! lease is being written into. A unit is spent only while `now_ms < end`,
//! both whole milliseconds rounded down, which implies `now < end` in any
//! finer tick: a lease ends up to a millisecond early, never late (two
//! early when it would end in the millisecond of the lease it replaces in
//! its slot, so that a step preempted across a landing does not find the
//! word it read of the old lease again in the new one). Beside
//! each slot, `taken_at` (the lease's time on the store's clock, which a
//! refund names it by) and `rest` (what the store had left after it),
//! written by the lander before it publishes the slot's word with Release;
//! a spender loads the word with Acquire and reads them after it.
//!
//! # The plan word
//!
//! ```text
//! bit 63       a sized lease is in flight, taken ahead of need or for a
//!              request that found nothing to spend (one at a time)
//! bits 62..20  the time of the last landing, whole milliseconds (43 bits)
//! bits 19..0   the size of the next lease asked for, 1 ..= MAX_UNITS
//! ```
//!
//! [`RETIRED`] (all ones, which no plan reaches: its time would be 278
//! years of Unix time with the in-flight bit set) marks a state a sweep
//! removed from the table.
//!
//! # The size of a lease
//!
//! A client starts at one unit a lease: a client seen rarely costs one
//! round trip a request, as without leases. A lease that lands less than a
//! term after the one before (its predecessor was spent within a term)
//! doubles the next size, up to the limiter's most; units that lapse
//! unspent halve it. The store then cuts a grant to what is left over the
//! cost divided by its share (`redis::script::LEASE_SHARE`), so near the
//! limit leases shrink to one unit whatever was asked.

use crate::sync::{AtomicU64, Ordering};

/// The most units one slot holds (20 bits).
pub const MAX_UNITS: u64 = (1 << UNIT_BITS) - 1;
const UNIT_BITS: u32 = 20;
/// The largest end a slot can hold, in milliseconds (44 bits).
const MAX_END: u64 = (1 << (64 - UNIT_BITS)) - 1;
/// A slot a lease is being written into: no units, so nothing spends it.
pub const LANDING: u64 = MAX_END << UNIT_BITS;
/// A state a sweep removed (the plan word).
pub const RETIRED: u64 = u64::MAX;
const IN_FLIGHT: u64 = 1 << 63;
const PLAN_TIME_MAX: u64 = (1 << 43) - 1;

fn units(word: u64) -> u64 {
    word & MAX_UNITS
}

fn end(word: u64) -> u64 {
    word >> UNIT_BITS
}

fn pack(units: u64, end_ms: u64) -> u64 {
    (end_ms.min(MAX_END - 1) << UNIT_BITS) | units.min(MAX_UNITS)
}

fn plan_size(plan: u64) -> u64 {
    (plan & MAX_UNITS).max(1)
}

fn plan_time(plan: u64) -> u64 {
    (plan >> UNIT_BITS) & PLAN_TIME_MAX
}

fn plan(size: u64, time_ms: u64, in_flight: bool) -> u64 {
    let flight = if in_flight { IN_FLIGHT } else { 0 };
    flight | (time_ms.min(PLAN_TIME_MAX) << UNIT_BITS) | size.clamp(1, MAX_UNITS)
}

/// What a spend took its units from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spent {
    /// The lease's time on the store's clock: an admission's refund names
    /// it by this.
    pub taken_at: u64,
    /// The units left in that lease after this spend.
    pub left: u64,
    /// What the store had left after the lease.
    pub rest: u64,
}

/// What became of a lease that came back from the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Landing {
    /// In a slot; the units of an ended lease it replaced lapsed.
    Landed {
        /// The units the ended lease it replaced still held (0 if the
        /// slot was empty or spent out).
        lapsed: u64,
    },
    /// Both slots hold live leases (two round trips raced): its units
    /// lapse, as the caller counts them.
    NoRoom,
}

/// One client's leases at this instance.
#[derive(Debug)]
pub struct LeaseSlots {
    slots: [AtomicU64; 2],
    taken_at: [AtomicU64; 2],
    rest: [AtomicU64; 2],
    plan: AtomicU64,
}

impl Default for LeaseSlots {
    fn default() -> Self {
        Self::new()
    }
}

impl LeaseSlots {
    /// No units, a first lease of one unit.
    pub fn new() -> Self {
        Self {
            slots: [AtomicU64::new(0), AtomicU64::new(0)],
            taken_at: [AtomicU64::new(0), AtomicU64::new(0)],
            rest: [AtomicU64::new(0), AtomicU64::new(0)],
            plan: AtomicU64::new(plan(1, 0, false)),
        }
    }

    /// Spends `cost` (>= 1) units at `now_ms` from one live lease that
    /// holds them all, the one that ends first; `None` if none does (a
    /// cost is never split between two leases: each admission is one
    /// lease's, which its refund names).
    pub fn spend(&self, now_ms: u64, cost: u64) -> Option<Spent> {
        // Acquire: pairs with the lander's Release store of the word, so
        // the slot's `taken_at` and `rest` read after it are that lease's.
        let first = self.slots[0].load(Ordering::Acquire);
        let second = self.slots[1].load(Ordering::Acquire);
        let order = if end(second) < end(first) {
            [1, 0]
        } else {
            [0, 1]
        };
        order
            .into_iter()
            .find_map(|slot| self.spend_from(slot, now_ms, cost))
    }

    fn spend_from(&self, slot: usize, now_ms: u64, cost: u64) -> Option<Spent> {
        let word_cell = &self.slots[slot];
        let mut word = word_cell.load(Ordering::Acquire);
        // Progress: the CAS fails only when the word changed since it was
        // read, which only another thread's finished step does (a spend, a
        // refund back into the lease, a landing); each failure re-reads
        // the word that step left, and the loop ends at once when that
        // word cannot pay.
        loop {
            if word == LANDING || units(word) < cost || now_ms >= end(word) {
                return None;
            }
            // Relaxed: the Acquire load of `word` made the lander's writes
            // of this lease visible; a later lease's can only be here if
            // the word changed, and then the CAS below fails.
            let taken_at = self.taken_at[slot].load(Ordering::Relaxed);
            let rest = self.rest[slot].load(Ordering::Relaxed);
            // Acquire on both outcomes: the word read may be a new
            // lease's, whose fields the next pass reads.
            match word_cell.compare_exchange(
                word,
                word - cost,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Some(Spent {
                        taken_at,
                        left: units(word) - cost,
                        rest,
                    })
                }
                Err(current) => word = current,
            }
        }
    }

    /// Puts a lease of `units` (>= 1) ending at `end_ms`, taken at
    /// `taken_at` on the store's clock with `rest` left there, in a slot
    /// that is empty or whose lease has ended at `now_ms` (its units lapse).
    // The models' and the fuzz target's step; the store gives back what
    // lapsed, through `land_replacing`.
    #[allow(dead_code)]
    pub fn land(
        &self,
        now_ms: u64,
        units_left: u64,
        end_ms: u64,
        taken_at: u64,
        rest: u64,
    ) -> Landing {
        self.land_replacing(now_ms, units_left, end_ms, taken_at, rest)
            .0
    }

    /// [`land`](Self::land), with the time of the ended lease whose units
    /// lapsed (when any did), so that they can be given back to the store.
    pub fn land_replacing(
        &self,
        now_ms: u64,
        units_left: u64,
        end_ms: u64,
        taken_at: u64,
        rest: u64,
    ) -> (Landing, u64) {
        for slot in 0..2 {
            let word_cell = &self.slots[slot];
            let mut word = word_cell.load(Ordering::Acquire);
            // Progress: as `spend_from`'s loop; the loop leaves for the
            // next slot as soon as this one holds a live lease or another
            // landing.
            loop {
                let live = units(word) > 0 && now_ms < end(word);
                if word == LANDING || live {
                    break;
                }
                match word_cell.compare_exchange(
                    word,
                    LANDING,
                    Ordering::Acquire,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        // The slot is this thread's alone until the store
                        // below: LANDING has no units, so no spend or
                        // refund touches it, and no other lander takes it.
                        // The replaced lease's time first: the CAS read
                        // its word with Acquire, so this is its own.
                        // Relaxed: published by the Release store.
                        let replaced = self.taken_at[slot].load(Ordering::Relaxed);
                        self.taken_at[slot].store(taken_at, Ordering::Relaxed);
                        self.rest[slot].store(rest, Ordering::Relaxed);
                        // A lease never ends in the millisecond of the one
                        // it replaces, but one earlier: a spend or refund
                        // preempted after reading the old lease's word
                        // (units u, end e) must not find that very word
                        // again in a new lease of u units ending at e, and
                        // take from it in the old one's name (its
                        // `taken_at`). Ending early is always safe.
                        let end_ms = end_ms.min(MAX_END - 1);
                        let end_ms = if end_ms == end(word) {
                            end_ms.saturating_sub(1)
                        } else {
                            end_ms
                        };
                        word_cell.store(pack(units_left, end_ms), Ordering::Release);
                        let lapsed = if now_ms >= end(word) { units(word) } else { 0 };
                        return (Landing::Landed { lapsed }, replaced);
                    }
                    Err(current) => word = current,
                }
            }
        }
        (Landing::NoRoom, 0)
    }

    /// Gives `units` of an admission spent from the lease taken at
    /// `taken_at` back to that lease, if it still lasts at `now_ms`;
    /// whether it did (if not, they go back to the store).
    pub fn give_back(&self, now_ms: u64, taken_at: u64, units_back: u64) -> bool {
        for slot in 0..2 {
            let word_cell = &self.slots[slot];
            let mut word = word_cell.load(Ordering::Acquire);
            // Progress: as `spend_from`'s loop.
            loop {
                if word == LANDING
                    || now_ms >= end(word)
                    // Saturating: `units_back` is the caller's, and a
                    // count past any lease's room must fail here, not wrap.
                    || units(word).saturating_add(units_back) > MAX_UNITS
                    // Relaxed: as in `spend_from`; another lease's time
                    // here means the word changed, and so does the CAS.
                    || self.taken_at[slot].load(Ordering::Relaxed) != taken_at
                {
                    break;
                }
                match word_cell.compare_exchange(
                    word,
                    word + units_back,
                    Ordering::Acquire,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return true,
                    Err(current) => word = current,
                }
            }
        }
        false
    }

    /// Takes the units an ended lease left unspent at `now_ms` out of its
    /// slot (the first such slot), so that they can be given back to the
    /// store: `(units, taken_at, rest)`, or `None` if no ended lease holds
    /// any. A landing gives such units back when it replaces the lease; a
    /// client that Redis (or the rejection cache) refuses takes no lease,
    /// so without this they would sit here until their window ended.
    pub fn reclaim_ended(&self, now_ms: u64) -> Option<(u64, u64, u64)> {
        for slot in 0..2 {
            let word_cell = &self.slots[slot];
            let mut word = word_cell.load(Ordering::Acquire);
            // Progress: as `spend_from`'s loop; it leaves for the next slot
            // as soon as this one holds no ended lease with units.
            loop {
                if word == LANDING || units(word) == 0 || now_ms < end(word) {
                    break;
                }
                // Read before the CAS, as `spend_from` reads them: once the
                // word is spent out a lander may take the slot, so after
                // the CAS they could be the next lease's. Relaxed: the
                // Acquire load of `word` made them visible, and a later
                // lease's can only be here if the word changed, which
                // fails the CAS.
                let taken_at = self.taken_at[slot].load(Ordering::Relaxed);
                let rest = self.rest[slot].load(Ordering::Relaxed);
                // The end is kept: a spent-out word, which no spend or
                // refund takes (it has ended) and a landing may replace,
                // whose end still tells the next lease in it from this one.
                match word_cell.compare_exchange(
                    word,
                    pack(0, end(word)),
                    Ordering::Acquire,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return Some((units(word), taken_at, rest)),
                    Err(current) => word = current,
                }
            }
        }
        None
    }

    /// The units held in live leases at `now_ms`.
    pub fn held(&self, now_ms: u64) -> u64 {
        self.slots
            .iter()
            .map(|slot| slot.load(Ordering::Acquire))
            .filter(|&word| word != LANDING && now_ms < end(word))
            .map(units)
            .sum()
    }

    /// The size of the next lease to ask for (at least 1).
    pub fn size(&self) -> u64 {
        plan_size(self.plan.load(Ordering::Relaxed))
    }

    /// Whether nothing is held or coming at `now_ms`, and the last lease
    /// landed a term (`term_ms`) or more ago: a sweep may retire it. A
    /// client whose lease was just spent keeps its size for the next.
    pub fn idle(&self, now_ms: u64, term_ms: u64) -> bool {
        let plan = self.plan.load(Ordering::Acquire);
        plan != RETIRED
            && plan & IN_FLIGHT == 0
            && now_ms >= plan_time(plan).saturating_add(term_ms)
            && self.slots.iter().all(|slot| {
                let word = slot.load(Ordering::Acquire);
                word != LANDING && (units(word) == 0 || now_ms >= end(word))
            })
    }

    /// Retires the state if it is idle at `now_ms` (one CAS of the plan,
    /// which fails if a lease was asked for since); whether it did.
    pub fn retire_if_idle(&self, now_ms: u64, term_ms: u64) -> bool {
        let plan = self.plan.load(Ordering::Acquire);
        self.idle(now_ms, term_ms)
            && self
                .plan
                .compare_exchange(plan, RETIRED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// Retires the state whatever it holds (its client was forgotten):
    /// its units lapse.
    pub fn retire(&self) {
        self.plan.store(RETIRED, Ordering::Release);
    }

    /// Whether a sweep retired it.
    pub fn retired(&self) -> bool {
        self.plan.load(Ordering::Acquire) == RETIRED
    }

    /// Marks a sized lease in flight (ahead of need, or for a request that
    /// found nothing to spend), unless one is (or the state is retired):
    /// whether this call is the one to take it. The others ask only for
    /// their own cost meanwhile.
    pub fn start_ahead(&self) -> bool {
        let mut plan = self.plan.load(Ordering::Relaxed);
        // Progress: the CAS fails only when another thread changed the
        // plan (a landing's resize, another start or end); the loop ends
        // at the first word with the bit set.
        loop {
            if plan == RETIRED || plan & IN_FLIGHT != 0 {
                return false;
            }
            // Relaxed: the bit is a lone flag; the lease's own words are
            // published by its landing.
            match self.plan.compare_exchange(
                plan,
                plan | IN_FLIGHT,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(current) => plan = current,
            }
        }
    }

    /// The sized lease came back (landed or not): the next may go.
    pub fn end_ahead(&self) {
        self.update_plan(|plan| plan & !IN_FLIGHT);
    }

    /// After a lease landed at `now_ms`: one landing less than `term_ms`
    /// after the one before doubles the next size, up to `most`.
    pub fn landed(&self, now_ms: u64, term_ms: u64, most: u64) {
        self.update_plan(|word| {
            let size = plan_size(word);
            let quick = now_ms.saturating_sub(plan_time(word)) < term_ms;
            let size = if quick { (size * 2).min(most) } else { size };
            plan(size, now_ms, word & IN_FLIGHT != 0)
        });
    }

    /// After units lapsed unspent: the next size halves.
    pub fn lapsed(&self) {
        self.update_plan(|word| plan(plan_size(word) / 2, plan_time(word), word & IN_FLIGHT != 0));
    }

    fn update_plan(&self, step: impl Fn(u64) -> u64) {
        // Relaxed: the plan publishes nothing (see `start_ahead`).
        // Progress: `fetch_update` retries only after another thread's
        // change of the plan.
        let _ = self
            .plan
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
                (word != RETIRED).then(|| step(word))
            });
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_spent_until_its_end_and_no_further() {
        let slots = LeaseSlots::new();
        assert_eq!(slots.spend(0, 1), None, "nothing held");
        assert_eq!(slots.land(0, 3, 100, 7, 40), Landing::Landed { lapsed: 0 });
        assert_eq!(slots.held(0), 3);
        let spent = slots.spend(10, 2).expect("3 held");
        assert_eq!(
            spent,
            Spent {
                taken_at: 7,
                left: 1,
                rest: 40
            }
        );
        assert_eq!(slots.spend(10, 2), None, "a cost is never split");
        assert_eq!(slots.spend(100, 1), None, "ended at 100");
        assert!(slots.spend(99, 1).is_some());
        assert_eq!(slots.held(99), 0);
    }

    #[test]
    fn a_lease_lands_beside_a_live_one_and_the_earlier_is_spent_first() {
        let slots = LeaseSlots::new();
        slots.land(0, 2, 100, 1, 0);
        slots.land(50, 4, 150, 2, 0);
        assert_eq!(slots.held(50), 6);
        assert_eq!(slots.spend(60, 1).map(|spent| spent.taken_at), Some(1));
        assert_eq!(slots.spend(60, 2).map(|spent| spent.taken_at), Some(2));
        // Both live: a third lease finds no room.
        assert_eq!(slots.land(60, 5, 160, 3, 0), Landing::NoRoom);
        // The first ended with 1 unit: it lapses into the next landing.
        assert_eq!(slots.land(120, 5, 220, 3, 0), Landing::Landed { lapsed: 1 });
        assert_eq!(slots.held(120), 7);
    }

    #[test]
    fn a_refund_goes_back_to_its_own_lease_while_it_lasts() {
        let slots = LeaseSlots::new();
        slots.land(0, 1, 100, 5, 0);
        slots.spend(0, 1).expect("held");
        assert!(!slots.give_back(0, 6, 1), "another lease's admission");
        assert!(slots.give_back(0, 5, 1));
        assert_eq!(slots.held(0), 1);
        assert!(!slots.give_back(100, 5, 1), "the lease ended");
    }

    #[test]
    fn leases_grow_while_spent_within_a_term_and_halve_when_units_lapse() {
        let slots = LeaseSlots::new();
        assert_eq!(slots.size(), 1);
        slots.landed(5, 1000, 64);
        assert_eq!(slots.size(), 2);
        slots.landed(10, 1000, 64);
        slots.landed(20, 1000, 64);
        assert_eq!(slots.size(), 8);
        slots.landed(5000, 1000, 64);
        assert_eq!(slots.size(), 8, "a term apart: no growth");
        slots.lapsed();
        assert_eq!(slots.size(), 4);
        for _ in 0..10 {
            slots.landed(5001, 1000, 64);
        }
        assert_eq!(slots.size(), 64, "at most the most");
    }

    #[test]
    fn one_lease_ahead_at_a_time_and_none_once_retired() {
        let slots = LeaseSlots::new();
        assert!(slots.start_ahead());
        assert!(!slots.start_ahead());
        assert!(!slots.retire_if_idle(0, 0), "a lease is coming");
        slots.end_ahead();
        slots.land(0, 1, 10, 0, 0);
        slots.landed(0, 100, 64);
        assert!(!slots.retire_if_idle(5, 100), "units held");
        assert!(!slots.retire_if_idle(10, 100), "its size is kept a term");
        assert!(slots.retire_if_idle(100, 100));
        assert!(slots.retired());
        assert!(!slots.start_ahead());
    }

    #[test]
    fn the_words_hold_their_fields() {
        let word = pack(MAX_UNITS, (1 << 43) + 12_345);
        assert_eq!(units(word), MAX_UNITS);
        assert_eq!(end(word), (1 << 43) + 12_345);
        assert_ne!(pack(0, u64::MAX), LANDING, "no end reaches LANDING's");
        let word = plan(300, 1_800_000_000_000, true);
        assert_eq!((plan_size(word), plan_time(word)), (300, 1_800_000_000_000));
        assert_ne!(word, RETIRED);
    }
}
