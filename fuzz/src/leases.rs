//! What the `leases` fuzz target checks: one client's lease slots
//! (`floodgate::__fuzz::LeaseSlots`, the local side of SPEC.md's "A limit
//! shared by many instances"), driven by what the store's lease script
//! could answer — leases of any size from 0 to 2^20 − 1 units, any end, any
//! `taken_at` (often the same one twice), any `rest` — and by the checks
//! and refunds of one instance, at times that may go backwards, against a
//! plain reference model: a list of the leases in the two slots.
//!
//! For every step the slots must answer what the model says:
//! - a landing goes into the first slot whose lease is spent out or ended
//!   (lapsing what an ended one held), or is told `NoRoom` if both are
//!   live; its end is kept to whole milliseconds below 2^44 − 1;
//! - a spend succeeds only if a live lease (`now < end`) holds the whole
//!   cost, and then takes it from exactly one such lease, the one that ends
//!   first (slot 0 on a tie), answering that lease's `taken_at`, `rest`
//!   and units left;
//! - a refund goes into the first live lease of its `taken_at` that has
//!   room for it, or into none;
//! - a reclaim takes the units of the first ended lease that holds any
//!   (they lapse, its end kept), answering them with its `taken_at` and
//!   `rest`, or finds none;
//! - `held` is the live leases' units, after every step;
//! - the sizing steps (`landed`, `lapsed`) keep the next size from 1 to
//!   2^20 − 1, doubling on a landing within a term, up to the most;
//! - and units are conserved: landed + given back = spent + lapsed + in
//!   the slots, so never more is spent than was landed and given back.
//!
//! No panic and no overflow (the target runs with overflow checks) on any
//! input. Depends on `floodgate` and `std` only, so
//! `tests/suite/fuzz_regressions.rs` replays the kept inputs through it.

use floodgate::__fuzz::{Landing, LeaseSlots, Spent};

/// The most units a slot holds (20 bits), as `src/lease.rs` says.
const MAX_UNITS: u64 = (1 << 20) - 1;
/// The largest end a slot keeps: ends are clamped below 2^44 − 1, which
/// marks a slot being landed into.
const MAX_KEPT_END: u64 = (1 << 44) - 2;
/// The plan word's time: 43 bits of milliseconds.
const MAX_PLAN_TIME: u64 = (1 << 43) - 1;
/// The most steps one input makes.
const MAX_STEPS: usize = 128;

/// Reads the input a byte at a time; zeros once it runs out, so every
/// byte string is an input.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&first, rest)) => {
                self.0 = rest;
                first
            }
            None => 0,
        }
    }

    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |value, _| (value << 8) | u64::from(self.byte()))
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One lease in the model: a slot's contents.
#[derive(Clone, Copy, Debug, Default)]
struct Lease {
    units: u64,
    end: u64,
    taken_at: u64,
    rest: u64,
}

impl Lease {
    fn live(&self, now: u64) -> bool {
        now < self.end
    }
}

/// The reference: two slots (an empty one is a lease of no units ending
/// at 0), the next size and the last landing's time, and the running
/// totals of units.
#[derive(Debug)]
struct Model {
    slots: [Lease; 2],
    size: u64,
    plan_time: u64,
    landed: u64,
    given_back: u64,
    spent: u64,
    lapsed: u64,
}

impl Model {
    fn land(&mut self, now: u64, lease: Lease) -> Landing {
        let Some(slot) = self
            .slots
            .iter()
            .position(|old| old.units == 0 || !old.live(now))
        else {
            return Landing::NoRoom;
        };
        let old = self.slots[slot];
        let lapsed = if old.live(now) { 0 } else { old.units };
        // A lease never ends in the millisecond of the one it replaces.
        let mut lease = lease;
        if lease.end == old.end {
            lease.end = lease.end.saturating_sub(1);
        }
        self.slots[slot] = lease;
        self.landed += lease.units;
        self.lapsed += lapsed;
        Landing::Landed { lapsed }
    }

    fn spend(&mut self, now: u64, cost: u64) -> Option<Spent> {
        let payable = |lease: &Lease| lease.live(now) && lease.units >= cost;
        let slot = match (payable(&self.slots[0]), payable(&self.slots[1])) {
            (true, true) if self.slots[1].end < self.slots[0].end => 1,
            (true, _) => 0,
            (false, true) => 1,
            (false, false) => return None,
        };
        let lease = &mut self.slots[slot];
        lease.units -= cost;
        self.spent += cost;
        Some(Spent {
            taken_at: lease.taken_at,
            left: lease.units,
            rest: lease.rest,
        })
    }

    fn give_back(&mut self, now: u64, taken_at: u64, units: u64) -> bool {
        let Some(lease) = self.slots.iter_mut().find(|lease| {
            lease.live(now)
                && lease.taken_at == taken_at
                && lease.units.saturating_add(units) <= MAX_UNITS
        }) else {
            return false;
        };
        lease.units += units;
        self.given_back += units;
        true
    }

    fn held(&self, now: u64) -> u64 {
        self.slots
            .iter()
            .filter(|lease| lease.live(now))
            .map(|lease| lease.units)
            .sum()
    }

    fn reclaim_ended(&mut self, now: u64) -> Option<(u64, u64, u64)> {
        let lease = self
            .slots
            .iter_mut()
            .find(|lease| lease.units > 0 && !lease.live(now))?;
        let units = lease.units;
        lease.units = 0;
        self.lapsed += units;
        Some((units, lease.taken_at, lease.rest))
    }

    fn landed_at(&mut self, now: u64, term: u64, most: u64) {
        let quick = now.saturating_sub(self.plan_time) < term;
        let size = if quick {
            (self.size * 2).min(most)
        } else {
            self.size
        };
        self.size = size.clamp(1, MAX_UNITS);
        self.plan_time = now.min(MAX_PLAN_TIME);
    }

    fn lapsed_units(&mut self) {
        self.size = (self.size / 2).clamp(1, MAX_UNITS);
    }
}

/// A time the next step is at: often near the leases' ends, where a
/// lease stops being spendable, and sometimes back.
fn next_time(bytes: &mut Bytes, now: u64, model: &Model) -> u64 {
    let shape = bytes.byte();
    let small = u64::from(bytes.byte());
    match shape % 8 {
        0 => now,
        1 => now.saturating_add(small),
        2 => now.saturating_sub(small),
        3 | 4 => {
            let end = model.slots[usize::from(shape & 8 != 0)].end;
            // The end itself, or just before or after it.
            match small % 3 {
                0 => end.saturating_sub(1),
                1 => end,
                _ => end.saturating_add(1),
            }
        }
        5 => bytes.u64(),
        6 => now.saturating_add(small << 40),
        _ => now.saturating_add(1),
    }
}

/// A count of units: the edges of a 20-bit field, small ones, any.
fn units(bytes: &mut Bytes, model: &Model) -> u64 {
    let shape = bytes.byte();
    let small = u64::from(bytes.byte());
    match shape % 8 {
        0 => 0,
        1 => 1,
        2 | 3 => small,
        4 => MAX_UNITS,
        5 => model.slots[usize::from(shape & 8 != 0)].units,
        6 => model.slots[usize::from(shape & 8 != 0)].units + 1,
        _ => ((small << 12) | (u64::from(bytes.byte()) << 4)) & MAX_UNITS,
    }
}

/// Runs the steps the input decodes to on fresh slots and on the model,
/// asserting that they agree after each.
pub fn check_leases(data: &[u8]) {
    let mut bytes = Bytes(data);
    let slots = LeaseSlots::new();
    let mut model = Model {
        slots: [Lease::default(); 2],
        size: 1,
        plan_time: 0,
        landed: 0,
        given_back: 0,
        spent: 0,
        lapsed: 0,
    };
    let mut now = 0;
    for step in 0..MAX_STEPS {
        if bytes.is_empty() {
            break;
        }
        let verb = bytes.byte();
        now = next_time(&mut bytes, now, &model);
        match verb % 4 {
            0 => {
                let units = units(&mut bytes, &model).min(MAX_UNITS);
                let end = match bytes.byte() % 4 {
                    0 => now.saturating_add(u64::from(bytes.byte())),
                    1 => model.slots[0].end,
                    2 => u64::MAX,
                    _ => bytes.u64(),
                };
                // A few `taken_at`s, so that refunds find them and two
                // leases share one; sometimes any.
                let taken_at = match bytes.byte() {
                    0 => bytes.u64(),
                    small => u64::from(small % 4),
                };
                let rest = u64::from(bytes.byte());
                let lease = Lease {
                    units,
                    end: end.min(MAX_KEPT_END),
                    taken_at,
                    rest,
                };
                let expected = model.land(now, lease);
                let landed = slots.land(now, units, end, taken_at, rest);
                assert_eq!(landed, expected, "step {step}: land {lease:?} at {now}");
            }
            1 => {
                let cost = units(&mut bytes, &model).max(1);
                let cost = if bytes.byte() == 0xff { u64::MAX } else { cost };
                let expected = model.spend(now, cost);
                let spent = slots.spend(now, cost);
                assert_eq!(
                    spent, expected,
                    "step {step}: spend {cost} at {now} from {:?}",
                    model.slots
                );
            }
            2 => {
                let taken_at = u64::from(bytes.byte() % 4);
                let units = units(&mut bytes, &model);
                let units = if bytes.byte() == 0xff {
                    u64::MAX
                } else {
                    units
                };
                let expected = model.give_back(now, taken_at, units);
                let given = slots.give_back(now, taken_at, units);
                assert_eq!(
                    given, expected,
                    "step {step}: give back {units} to lease {taken_at} at {now} in {:?}",
                    model.slots
                );
            }
            _ => match bytes.byte() % 3 {
                0 => {
                    let term = u64::from(bytes.byte()) << (bytes.byte() % 48);
                    let most = units(&mut bytes, &model);
                    model.landed_at(now, term, most);
                    slots.landed(now, term, most);
                    assert_eq!(slots.size(), model.size, "step {step}: the next size");
                }
                1 => {
                    model.lapsed_units();
                    slots.lapsed();
                    assert_eq!(slots.size(), model.size, "step {step}: the next size");
                }
                _ => {
                    let expected = model.reclaim_ended(now);
                    let reclaimed = slots.reclaim_ended(now);
                    assert_eq!(
                        reclaimed, expected,
                        "step {step}: reclaim at {now} from {:?}",
                        model.slots
                    );
                }
            },
        }
        assert_eq!(
            slots.held(now),
            model.held(now),
            "step {step}: held at {now} in {:?}",
            model.slots
        );
        let in_slots: u64 = model.slots.iter().map(|lease| lease.units).sum();
        assert_eq!(
            model.landed + model.given_back,
            model.spent + model.lapsed + in_slots,
            "step {step}: units conserved"
        );
        assert!(model.spent <= model.landed + model.given_back);
    }
}
