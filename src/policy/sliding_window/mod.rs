//! `sliding-window`: the exact sliding log. A request at `now` is admitted
//! iff fewer than `L` admitted requests have times `t > now − W`; one of
//! cost `n` iff at most `L − n` units were admitted in that window.
//!
//! Each client keeps a ring of `L` slots (`LogSlot`, layout in `cell`), one
//! *entry* per admission: an admission of cost `n` is one entry that counts
//! `n` units, so it takes one slot and one CAS whatever `n` is, and a racing
//! thread can never see part of it. Entry `m` lives in slot `m mod L`,
//! tagged with sequence `m + L`, and carries the running total `U_m` of
//! units admitted through it. Every entry counts at least one unit and the
//! window never holds more than `L` units, so at most `L` entries are ever
//! inside it: the ring keeps every entry that can still matter. With `e`
//! entries so far, slot `e mod L` holds the oldest kept one, and
//!
//! * the units inside the window are `U_{e−1} − U_j` with `j` the newest
//!   entry already outside it (0 if there is none): one search by time,
//!   one subtraction of running totals — or exactly `L` if all `L` kept
//!   entries are inside (they count at least `L` units, and never more);
//! * admission `e` is one CAS on slot `e mod L`, from (`e`, oldest) to
//!   (`e + L`, `U_{e−1} + n`, now) — it fails if anyone else committed entry
//!   `e` first, so each entry is committed exactly once, in order;
//! * `committed` is only a hint for `e`, never past it: it is set only to
//!   an entry count that a slot showed reached. The admitting thread moves
//!   it from `e` to `e + 1`; a reader that finds the hint's slot committed
//!   moves it on to what that slot shows (the slot of entry `h` holds the
//!   latest entry `m ≡ h mod L`, so `m + 1` entries at least are
//!   committed), however far behind it was. It may lag by more than one
//!   when the ring is shared by two copies of the state (a client moved to
//!   a new table while a call still decides through the old one,
//!   `relocate`): each copy's hint moves only when a call goes through that
//!   copy. No thread waits on another either way (`snapshot`).
//!
//! An entry never changes while it is in its slot, and a slot read is
//! checked against the sequence it should carry, so every read a decision
//! makes after its snapshot (the load of the frontier slot, which shows
//! entry `e` not yet committed) sees that snapshot's entries. A rejection is
//! linearised at the snapshot; an admission at its CAS, which succeeds only
//! if entry `e` is still uncommitted, so the same entries were there.
//! `Decision::remaining` of an admission is `L − (units inside) − n` at that
//! CAS.
//!
//! Entry times are stored as `max(now, previous entry's time)`, so the ring
//! is sorted and stored time never moves backwards; the search finds the
//! first entry still inside the window by galloping in from both ends: O(1)
//! for an idle or a saturated client, O(log L) at worst. The lower end
//! starts where the last admission found the window to begin (a hint each
//! copy of the state keeps, checked by one read before it is used), so a
//! client whose window slides a few entries between admissions reads the
//! slots about that boundary, not the ring's cold far end. A single request
//! refused by a saturated client (all `L` kept entries inside) reads nothing
//! beyond the snapshot: each of those entries then counts one unit, and the
//! oldest one leaves first.
//!
//! Retiring the state marks the frontier slot (the one entry `e` would
//! take) with `R`: every admission's CAS expects that slot unmarked, so the
//! ring is frozen from then on, and reads see the mark and stop.
//!
//! # Giving units back
//!
//! A refund takes `g` units from the entries at one time, and an entry left
//! with none must leave the ring: the shortcuts above ("`L` kept entries
//! inside count `L` units", "an overwritten entry had left the window")
//! hold only while every entry counts at least one unit. Taking entries out
//! renumbers the ones after them, which no slot can do in place while
//! readers compare sequences. So a refund builds a new ring, a
//! [`Successor`]: the entries inside the window after the refund, numbered
//! from 0 with their running totals from 0, its own hint, and a *floor*,
//! the time the refund was judged at (every later call judges at no earlier
//! time, so entries dropped because they had left the window stay dropped,
//! and stored time never moves back). Then one CAS marks the old ring's
//! frontier `P`, with the new ring's address in the slot's time: the
//! refund's linearisation point. It succeeds only if no entry was
//! committed since the refund's snapshot, so the new ring is exactly the
//! old one's state with the refund applied; from then on the old ring takes
//! no entry (every admission's CAS expects its frontier unmarked).
//!
//! The client's first ring, its [`Home`], which every copy of its state
//! shares, ends with a *link*: 0 until the first refund, then the address
//! of the client's current ring. Whoever finds a `P` mark whose ring the
//! link does not name yet installs it (one CAS of the link, from the marked
//! ring's address to the new one's): the refunder does before it returns,
//! and a check that meets the mark first does it for it, so no call ever
//! waits for a refund. A client never refunded pays almost nothing for
//! this: its home ring is unmarked, and the mark test is the one that
//! already looks for `R` (1 to 2 ns on a hot refusal, for the ring's floor
//! and the pin's drop flag in the decision loop: benches/README.md, "The
//! log's refunds"). A refunded client's calls find the home ring marked and go on,
//! under a pin, through the link (a cold path): they decide, retire or read
//! on the current ring exactly as on a home ring, with its hint and floor.
//!
//! A ring the link moves past is reachable only by threads that loaded the
//! link before, each under a pin taken before that load, so the thread
//! whose CAS moved the link hands the old ring to the crate's collector
//! (`store::epoch`), which frees it once those pins are gone; the current
//! ring is freed with the home ring (`Home`'s drop), when no copy of the
//! state is left to reach it.

mod link;
mod view;

use self::link::{Home, Successor};
pub(crate) use self::view::{LogRing, LogView, LogWords};
use super::{sealed, Policy, Retired, Spent};
use crate::cell::LogSlot;
use std::sync::Arc;

use crate::sync::{AtomicU128, AtomicU64, Ordering};
use crate::{Config, ConfigError, Decision, PolicyKind};

/// The exact sliding log: at most `limit` units in any `window` ticks.
/// Keeps up to `limit` admissions per client (16 bytes each), so it takes
/// limits up to [`MAX_LOG_LIMIT`](crate::MAX_LOG_LIMIT).
#[derive(Clone, Copy, Debug)]
pub struct SlidingWindow {
    config: Config,
}

/// One client's `sliding-window` state: the ring of its last `L` entries.
#[derive(Debug)]
pub struct SlidingWindowState {
    /// Entries committed so far to the home ring, or one fewer (a hint; see
    /// module docs).
    committed: AtomicU64,
    /// Where the last admission through this copy found the window to
    /// begin on the home ring (a hint; `SlidingWindow::gone`).
    boundary: AtomicU64,
    /// Shared, not copied, when the keyed store moves the client to a
    /// larger table: the ring is the state, and every decision through
    /// either table's entry lands in it (`relocate`).
    ring: Arc<Home>,
}

/// One ring with its hint and floor: the home ring (floor 0) or the
/// current successor. Every step of the log runs on one.
#[derive(Clone, Copy)]
struct Ring<'a> {
    slots: &'a [AtomicU128],
    committed: &'a AtomicU64,
    /// The first entry inside the window at the last admission that set
    /// it: a hint, never trusted unread (`SlidingWindow::gone`).
    boundary: &'a AtomicU64,
    floor: u64,
}

/// The state as of one instant: `n` entries, the oldest of the last `L`
/// (as stored in its slot), and the latest entry (time 0 and no units if
/// there is none).
struct Snapshot {
    n: u64,
    oldest: LogSlot,
    latest: LogSlot,
}

/// A slot was overwritten while being read: the state moved on; start again.
#[derive(Debug)]
pub(crate) struct Moved;

/// Why a ring takes no more entries.
#[derive(Debug)]
enum Frozen {
    /// It was retired: so is the state.
    Retired,
    /// A refund replaced it (the mark names the new ring: `frozen_mark`).
    /// No address here, so that a decision's `Result` stays as small as a
    /// decision: the hot path returns it.
    Replaced,
}

/// What the slot at a hint says of the frontier (`frontier_at`).
enum Frontier {
    /// The hint is the frontier: its slot waits for that entry.
    Open,
    /// The ring is frozen with this many entries, by this mark.
    Marked(u64, Frozen),
    /// At least this many entries are committed: look there.
    Behind(u64),
}

/// Entry `entry`'s sequence (module docs; 42 bits, `cell`).
#[inline]
fn sequence(entry: u64) -> u64 {
    entry & LogSlot::SEQUENCE
}

/// `U_a − U_b` from two running totals mod 2^20 (exact: it is at most `L`,
/// `cell`).
#[inline]
fn units_between(later: LogSlot, earlier: LogSlot) -> u64 {
    u64::from(later.units.wrapping_sub(earlier.units) & LogSlot::UNITS)
}

/// No entry: what a ring with none reads as its latest.
const NONE: LogSlot = LogSlot {
    sequence: 0,
    units: 0,
    time: 0,
};

impl Ring<'_> {
    #[inline]
    fn slot(&self, entry: u64) -> &AtomicU128 {
        // The ring has L slots and L fits usize (it is at most 2^20 − 1), so
        // the remainder does too.
        &self.slots[(entry % self.slots.len() as u64) as usize]
    }

    /// Slot `entry mod L` if it still holds that entry.
    ///
    /// Acquire pairs with the Release of the CAS that wrote the slot; the
    /// slot's own sequence number is what the reader checks, so nothing else
    /// rides on this ordering.
    #[inline]
    fn read(&self, entry: u64) -> Result<LogSlot, Moved> {
        let slot = LogSlot::unpack(self.slot(entry).load(Ordering::Acquire));
        if slot.sequence == sequence(entry + self.slots.len() as u64) {
            Ok(slot)
        } else {
            Err(Moved)
        }
    }

    /// What the slot of entry `n` says of the frontier `e` (the next entry
    /// to commit), given `n <= e` (module docs: a hint never passes the
    /// frontier). The slot holds the latest entry `m ≡ n (mod L)` that was
    /// committed (sequence `m + L`), or the mark on a frozen frontier
    /// (sequence `e | R` or `e | P`); its distance from `n`'s own sequence
    /// tells which.
    #[inline]
    fn frontier_at(&self, n: u64, slot: LogSlot) -> Frontier {
        if slot.sequence & LogSlot::MARKS != 0 {
            // Only the frontier is ever marked, and a marked ring never
            // changes again.
            return Frontier::Marked(
                n + (slot.sequence.wrapping_sub(sequence(n)) & LogSlot::SEQUENCE),
                frozen_by(slot),
            );
        }
        let ahead = slot.sequence.wrapping_sub(sequence(n)) & LogSlot::SEQUENCE;
        if ahead == 0 {
            return Frontier::Open;
        }
        // Entry `n + ahead − L` is committed (`ahead` is a multiple of L,
        // at least L): the frontier is past it. Entries commit in order
        // (an admission's CAS expects the frontier's slot), so every entry
        // below it is committed too.
        let len = self.slots.len() as u64;
        debug_assert!(
            ahead >= len && ahead.is_multiple_of(len),
            "slot {slot:?} for entry {n}"
        );
        Frontier::Behind((n + ahead + 1).saturating_sub(len).max(n + 1))
    }

    /// A consistent view of the ring: linearised at the load of the oldest
    /// slot (which shows that entry `n` had not yet been committed).
    ///
    /// Progress: the loop starts from the hint, which is never past the
    /// frontier (it is only ever set from what a slot showed committed), in
    /// this copy of the state or another that shares its ring (`relocate`).
    /// Each pass either returns, or moves `n` forward to an entry that a
    /// slot showed committed (at most up to the frontier, which only an
    /// admission's CAS moves), or finds that entry `n − 1` was overwritten,
    /// which takes `L` more admissions by other threads. So with no other
    /// thread running the loop ends within `L + 1` passes (a hint that lags
    /// by any number of entries catches up one slot's worth per pass), and
    /// it goes on only while other threads commit entries.
    #[inline]
    fn snapshot(&self) -> Result<Snapshot, Frozen> {
        // Acquire: a hint only; every slot read below is checked by its
        // sequence number.
        let mut n = self.committed.load(Ordering::Acquire);
        loop {
            let oldest = LogSlot::unpack(self.slot(n).load(Ordering::Acquire));
            match self.frontier_at(n, oldest) {
                Frontier::Open => {}
                Frontier::Marked(_, frozen) => return Err(frozen),
                Frontier::Behind(committed) => {
                    // The hint lags: move it on for whoever committed the
                    // entries, then look at the slot of the frontier found.
                    self.advance_hint_to(committed);
                    n = committed;
                    continue;
                }
            }
            let latest = match n.checked_sub(1) {
                None => NONE,
                // Entry n − 1 stays in its slot until entry n − 1 + L, which
                // follows entry n: if it is gone, so is this view, and the
                // next pass finds slot n committed.
                Some(previous) => match self.read(previous) {
                    Ok(slot) => slot,
                    Err(Moved) => continue,
                },
            };
            return Ok(Snapshot { n, oldest, latest });
        }
    }

    /// Marks the frontier slot of `snapshot` with `mark` (`R`, or `P` and
    /// the new ring's address as `time`); fails if the ring moved on since.
    /// AcqRel/Acquire as an admission's CAS: the Release also publishes a
    /// new ring written before a `P`.
    fn mark(&self, snapshot: &Snapshot, mark: LogSlot) -> bool {
        self.slot(snapshot.n)
            .compare_exchange(
                snapshot.oldest.pack(),
                mark.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Marks the frontier of `snapshot` retired (`mark`).
    fn retire(&self, snapshot: &Snapshot) -> bool {
        let marked = LogSlot {
            sequence: sequence(snapshot.n) | LogSlot::RETIRED,
            ..snapshot.oldest
        };
        self.mark(snapshot, marked)
    }

    /// The entries of a retired (frozen) ring: the frontier, where the
    /// mark is. Found from the hint as `snapshot` finds it: with no slot
    /// changing, each pass moves on to a later committed entry, so the loop
    /// ends within `L + 1` passes.
    fn frozen_entries(&self) -> u64 {
        let mut n = self.committed.load(Ordering::Acquire);
        loop {
            match self.frontier_at(n, self.frozen(n)) {
                Frontier::Marked(frontier, _) => return frontier,
                Frontier::Behind(committed) => n = committed,
                Frontier::Open => unreachable!("a frozen ring's frontier is marked"),
            }
        }
    }

    /// The mark on a frozen ring's frontier.
    fn frozen_mark(&self) -> LogSlot {
        self.frozen(self.frozen_entries())
    }

    /// Entry `entry` of a frozen ring (no slot can change).
    fn frozen(&self, entry: u64) -> LogSlot {
        LogSlot::unpack(self.slot(entry).load(Ordering::Acquire))
    }

    #[inline]
    fn advance_hint(&self, from: u64) {
        // Failure means another thread already moved it: nothing to do.
        // AcqRel/Relaxed: the hint carries no data (see `snapshot`).
        let _ =
            self.committed
                .compare_exchange(from, from + 1, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Moves the hint up to `committed` (an entry count a slot showed
    /// reached), never back. One read-modify-write: it never retries.
    #[cold]
    fn advance_hint_to(&self, committed: u64) {
        self.committed.fetch_max(committed, Ordering::AcqRel);
    }
}

/// Why a marked ring takes no more entries.
#[inline]
fn frozen_by(mark: LogSlot) -> Frozen {
    if mark.sequence & LogSlot::RETIRED != 0 {
        Frozen::Retired
    } else {
        Frozen::Replaced
    }
}

impl SlidingWindow {
    /// Whether entry time `time` has left the window at `now`:
    /// `time <= now − W`.
    #[inline]
    fn expired(&self, time: u64, now: u64) -> bool {
        u128::from(time) + u128::from(self.config.window()) <= u128::from(now)
    }

    /// An entry before which every one of the `n` entries of `ring` has
    /// left the window at `at`: all `n` if the latest has (no read), else
    /// the ring's boundary `hint` if the entry before it is read expired at
    /// `at` (times rise along the ring, so every earlier entry has too),
    /// else 0 (nothing known). The hint may be stale, or come from another
    /// copy of the state or from a call judged later than `at`: it only
    /// says where to look, and the read decides. A client whose window
    /// slides a few entries between its admissions then starts its search
    /// at the slots its last admission read, instead of at the far end of
    /// the ring (`in_window`).
    #[inline]
    fn gone(
        &self,
        ring: Ring<'_>,
        hint: u64,
        n: u64,
        latest: LogSlot,
        at: u64,
    ) -> Result<u64, Moved> {
        if n == 0 || self.expired(latest.time, at) {
            return Ok(n);
        }
        let hint = hint.min(n);
        // Entries before the oldest of the last L are never read (their
        // slots hold later ones), and `in_window` starts there anyway.
        if hint <= n.saturating_sub(self.config.limit()) {
            return Ok(0);
        }
        let before = ring.read(hint - 1)?;
        Ok(if self.expired(before.time, at) {
            hint
        } else {
            0
        })
    }

    /// How many of the last `L` entries before entry `n` are still inside
    /// the window at `now`, given that those before entry `from` are not
    /// (0 when nothing is known); `Moved` if the ring changed meanwhile.
    ///
    /// Times rise with the entry number, so the expired ones are a prefix.
    /// Gallop in from both ends (1, 2, 4, … slots from each), then bisect
    /// what is left: O(log min(expired, inside)) slot reads, so a client
    /// that is idle (all expired) or saturated (all inside) costs two or
    /// three reads, mostly of slots the caller has just touched.
    #[inline]
    fn in_window(
        &self,
        n: u64,
        from: u64,
        now: u64,
        read: &impl Fn(u64) -> Result<LogSlot, Moved>,
    ) -> Result<u64, Moved> {
        let expired = |entry| Ok::<_, Moved>(self.expired(read(entry)?.time, now));
        // [first, low) expired
        let mut low = n.saturating_sub(self.config.limit()).max(from.min(n));
        let mut high = n; // [high, n) inside
        let mut stride = 1;
        while high - low > 2 * stride {
            let bottom = low + stride - 1;
            if !expired(bottom)? {
                high = bottom;
                break;
            }
            low = bottom + 1;
            let top = high - stride;
            if expired(top)? {
                low = top + 1;
                break;
            }
            high = top;
            stride *= 2;
        }
        while low < high {
            let middle = low + (high - low) / 2;
            if expired(middle)? {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        Ok(n - low)
    }

    /// The units inside the window at `now` (at least the latest entry's
    /// time) of the `n` entries ending in `latest`, those before `from`
    /// known to have left it (`in_window`), and how many entries are
    /// inside.
    #[inline]
    fn units_inside(
        &self,
        n: u64,
        from: u64,
        latest: LogSlot,
        now: u64,
        read: &impl Fn(u64) -> Result<LogSlot, Moved>,
    ) -> Result<(u64, u64), Moved> {
        let limit = self.config.limit();
        let inside = self.in_window(n, from, now, read)?;
        let units = if inside == 0 {
            0
        } else if inside >= limit {
            // L entries of at least one unit each, and never more than L
            // units in a window.
            limit
        } else if inside == n {
            // Every entry so far: the running total itself.
            u64::from(latest.units)
        } else {
            units_between(latest, read(n - inside - 1)?)
        };
        // Exact for the entries of one snapshot; the bound only keeps a read
        // the caller will discard from underflowing `L − units`.
        Ok((units.min(limit), inside))
    }

    /// Ticks from `now` until a request of cost `cost`, refused at `at`,
    /// would be admitted: when the first entry `e` with
    /// `U_{n−1} − U_e <= L − cost` leaves the window. Refused means more
    /// than `L − cost` units are inside, so there is at least one entry.
    fn retry_after(
        &self,
        snapshot: &Snapshot,
        from: u64,
        at: u64,
        now: u64,
        cost: u64,
        read: &impl Fn(u64) -> Result<LogSlot, Moved>,
    ) -> Result<u64, Moved> {
        let limit = self.config.limit();
        let n = snapshot.n;
        // The entries inside are [n − inside, n); the one sought is among
        // them (the latest one qualifies: 0 <= L − cost).
        let room = limit - cost;
        let mut low = n - self.in_window(n, from, at, read)?;
        let mut high = n - 1;
        while low < high {
            let middle = low + (high - low) / 2;
            if units_between(snapshot.latest, read(middle)?) <= room {
                high = middle;
            } else {
                low = middle + 1;
            }
        }
        let leaving = if low == n - 1 {
            snapshot.latest
        } else {
            read(low)?
        };
        let free_at = u128::from(leaving.time) + u128::from(self.config.window());
        Ok(u64::try_from(free_at - u128::from(now)).unwrap_or(u64::MAX))
    }

    /// `remaining` at `now` on one ring.
    fn remaining_at(&self, ring: Ring<'_>, now: u64) -> Result<u64, Frozen> {
        // Progress: a pass is repeated only when a slot read after the
        // snapshot was overwritten, which takes other threads' admissions
        // (L of them past the snapshot's frontier); `snapshot` itself ends
        // as its docs say.
        loop {
            let snapshot = ring.snapshot()?;
            let now = now.max(snapshot.latest.time).max(ring.floor);
            let read = |entry| ring.read(entry);
            let Ok((used, _)) = self.units_inside(snapshot.n, 0, snapshot.latest, now, &read)
            else {
                continue;
            };
            return Ok(self.config.limit() - used);
        }
    }

    /// Idle when no entry is inside the window at `now`: none ever, or
    /// the latest one is `<= now − W` (times rise along the ring).
    fn idle(&self, snapshot: &Snapshot, now: u64) -> bool {
        snapshot.n == 0 || self.expired(snapshot.latest.time, now)
    }
}

impl sealed::Sealed for SlidingWindow {}

impl Policy for SlidingWindow {
    type State = SlidingWindowState;
    type Origin = u64;
    const KIND: PolicyKind = PolicyKind::SlidingWindow;

    fn new(config: Config) -> Result<Self, ConfigError> {
        Ok(Self {
            config: config.check_for(Self::KIND)?,
        })
    }

    fn config(&self) -> Config {
        self.config
    }

    /// Slot `i` starts as if entry `i − L` had been there.
    fn new_state(&self) -> SlidingWindowState {
        self.spent_state(0, 0)
    }

    #[inline]
    fn check_within(
        &self,
        state: &SlidingWindowState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, Retired> {
        self.decide(state, now, cost)
    }

    fn remaining(&self, state: &SlidingWindowState, now: u64) -> Result<u64, Retired> {
        state.on_current(|ring, _| self.remaining_at(ring, now))
    }

    /// Takes up to `cost` units from the entries at `now − ago` into a new
    /// ring (module docs, "Giving units back").
    fn refund(
        &self,
        state: &SlidingWindowState,
        now: u64,
        ago: u64,
        cost: u64,
    ) -> Result<u64, Retired> {
        if super::gives_nothing(self.config, ago, cost) {
            return Ok(0);
        }
        // Before the origin: no admission of this state.
        let Some(at) = now.checked_sub(ago) else {
            return Ok(0);
        };
        state.on_current(|ring, address| self.refund_on(state, ring, address, now, at, cost))
    }

    fn retire_if_idle(&self, state: &SlidingWindowState, now: u64) -> bool {
        // Progress: the mark's CAS fails only after another thread
        // committed the frontier entry or marked it.
        state
            .on_current(|ring, _| loop {
                let snapshot = ring.snapshot()?;
                if !self.idle(&snapshot, now.max(ring.floor)) {
                    return Ok(false);
                }
                if ring.retire(&snapshot) {
                    return Ok(true);
                }
            })
            .unwrap_or(false)
    }

    /// Judged no earlier than the newest entry in the log.
    fn retire_spent(&self, state: &SlidingWindowState, now: u64) -> Spent {
        // Progress: as `retire_if_idle`'s. The ring retired is the current
        // one (a replaced ring is never retired), read as it was frozen.
        let spent = state.on_current(|ring, _| {
            loop {
                match ring.snapshot() {
                    Ok(snapshot) if ring.retire(&snapshot) => break,
                    Ok(_) => {}
                    Err(Frozen::Retired) => break,
                    Err(replaced) => return Err(replaced),
                }
            }
            Ok(self.frozen_spent(ring, now))
        });
        match spent {
            Ok(spent) => spent,
            Err(Retired) => unreachable!("a retired ring answers what it spent"),
        }
    }

    fn spent_state(&self, spent: u64, now: u64) -> SlidingWindowState {
        let (entries, _) = self.spent_entry(spent, now);
        SlidingWindowState {
            committed: AtomicU64::new(entries),
            boundary: AtomicU64::new(0),
            ring: Home::new(self.spent_slots(spent, now)),
        }
    }

    /// The entries inside the window at the latest time the state
    /// reflects (its latest entry's, or its floor), each as its time and
    /// units: every call at that time or later counts exactly these. The
    /// floor itself is not kept (a loaded state is a home ring, from 0):
    /// it only judges a call older than it, which time going back makes.
    fn save_words(&self, state: &SlidingWindowState, out: &mut Vec<u64>) -> Result<(), Retired> {
        // Progress: a pass repeats only when a slot it read was
        // overwritten, after another thread committed an entry;
        // `on_current` follows a replaced ring as its docs say.
        let entries = state.on_current(|ring, _| loop {
            let snapshot = ring.snapshot()?;
            let judged = snapshot.latest.time.max(ring.floor);
            if let Ok(entries) = self.entries_inside(ring, &snapshot, judged) {
                return Ok(entries);
            }
        })?;
        out.extend(entries.iter().flat_map(|&(time, units)| [time, units]));
        Ok(())
    }

    /// A home ring whose whole history is the entries saved, if they are
    /// entries of one window of this log: at most `L` of them, times that
    /// never fall, each of at least one unit, `L` units in all at most.
    fn load_words(&self, words: &[u64]) -> Option<SlidingWindowState> {
        let entries = self.loaded_entries(words)?;
        Some(SlidingWindowState {
            committed: AtomicU64::new(entries.len() as u64),
            boundary: AtomicU64::new(0),
            ring: Home::new(self.young_slots(&entries)),
        })
    }

    fn is_retired(&self, state: &SlidingWindowState) -> bool {
        state
            .on_current(|ring, _| ring.snapshot().map(|_| ()))
            .is_err()
    }

    /// The ring is not frozen but shared: the old table's entry and the
    /// new one's hold the same ring, so a check through either is a check
    /// on the one state (and a refund through either moves the one link).
    /// Only the home ring's `committed` hint is per entry: the old entry's
    /// may fall any number of entries behind while calls go through the new
    /// one, and the next call through the old one catches it up (module
    /// docs, `snapshot`).
    fn relocate(&self, state: &SlidingWindowState) -> Option<SlidingWindowState> {
        (!self.is_retired(state)).then(|| SlidingWindowState {
            committed: AtomicU64::new(state.committed.load(Ordering::Acquire)),
            // Relaxed: a hint, checked before use (`gone`).
            boundary: AtomicU64::new(state.boundary.load(Ordering::Relaxed)),
            ring: Arc::clone(&state.ring),
        })
    }
}

impl SlidingWindow {
    /// A check: the body of the hot path. It decides on the home ring, and
    /// on a client a refund replaced, on the ring the link names (module
    /// docs, "Giving units back"), under a pin taken the first time it
    /// follows the link. The ring is a variable of the one loop, not a
    /// second path, so the decision is made and returned in one place (a
    /// call that returned one for the cold path cost the hot one 5 ns of
    /// copies).
    #[inline(always)]
    fn decide(&self, state: &SlidingWindowState, now: u64, cost: u64) -> Result<Decision, Retired> {
        let mut pin = None;
        let (mut ring, mut address) = (state.home(), 0);
        let limit = self.config.limit();
        // Progress: a pass is repeated only when a slot it read was
        // overwritten, or when its CAS on the frontier failed: both only
        // after another thread committed an entry (or marked the ring,
        // which the next snapshot answers as `Frozen`); or when its ring
        // was replaced, after which `follow` moved the link on (as
        // `through_link`'s passes). `snapshot` ends as its docs say.
        loop {
            let snapshot = match ring.snapshot() {
                Ok(snapshot) => snapshot,
                Err(Frozen::Retired) => return Err(Retired),
                Err(Frozen::Replaced) => {
                    (ring, address) = state.follow(ring, address, &mut pin);
                    continue;
                }
            };
            let read = |entry| ring.read(entry);
            let Snapshot { n, oldest, latest } = snapshot;
            // Judged at the latest time the state reflects, if that is later.
            let at = now.max(latest.time).max(ring.floor);
            if n >= limit && cost == 1 && !self.expired(oldest.time, at) {
                // All of the last L are inside the window: none left.
                let free_at = u128::from(oldest.time) + u128::from(self.config.window());
                let retry_after = u64::try_from(free_at - u128::from(now)).unwrap_or(u64::MAX);
                return Ok(Decision::reject(0, retry_after));
            }
            // Relaxed: a hint, checked before use (`gone`).
            let hint = ring.boundary.load(Ordering::Relaxed);
            let Ok(from) = self.gone(ring, hint, n, latest, at) else {
                continue;
            };
            let Ok((used, inside)) = self.units_inside(n, from, latest, at, &read) else {
                continue;
            };
            if used + cost > limit {
                let Ok(retry_after) = self.retry_after(&snapshot, from, at, now, cost, &read)
                else {
                    continue;
                };
                return Ok(Decision::reject(limit - used, retry_after));
            }
            let admitted = LogSlot {
                sequence: sequence(n + limit),
                // cost <= L < 2^20: the running total stays mod 2^20 (`cell`).
                units: latest.units.wrapping_add(cost as u32) & LogSlot::UNITS,
                time: at,
            };
            // Linearisation point of an admission. AcqRel: Release publishes
            // the slot to readers that Acquire it; Acquire on failure is for
            // the retry's reads.
            if ring
                .slot(n)
                .compare_exchange(
                    oldest.pack(),
                    admitted.pack(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                ring.advance_hint(n);
                // Entries before the first inside at `at` left the window
                // for good: every later call judges at `at` or later (the
                // new latest entry's time). Stored once it moved a line of
                // slots on (four entries), or back: a hint a few entries
                // behind still starts the search on the boundary's line, and
                // a store on every admission cost a client whose window
                // holds one or two entries 6-10 % (benches/README.md, "The
                // log's search from where its window began").
                // Relaxed: a hint, read back only through `gone`.
                let first = n - inside;
                if first >= hint.saturating_add(4) || first < hint {
                    ring.boundary.store(first, Ordering::Relaxed);
                }
                return Ok(Decision::admit(limit - used - cost));
            }
        }
    }

    /// One refund on `ring` (at `address`, 0 for the home ring): builds the
    /// ring that goes on from it and marks this one replaced, or answers 0
    /// with nothing changed (module docs, "Giving units back").
    ///
    /// Progress: a pass repeats only when a slot read after the snapshot
    /// was overwritten or the mark's CAS failed, both only after another
    /// thread committed an entry or marked the ring (which the next
    /// snapshot answers as `Frozen`).
    #[allow(unsafe_code)]
    fn refund_on(
        &self,
        state: &SlidingWindowState,
        ring: Ring<'_>,
        address: u64,
        now: u64,
        at: u64,
        cost: u64,
    ) -> Result<u64, Frozen> {
        loop {
            let snapshot = ring.snapshot()?;
            let judged = now.max(snapshot.latest.time).max(ring.floor);
            if self.expired(at, judged) {
                return Ok(0);
            }
            let Ok(mut entries) = self.entries_inside(ring, &snapshot, judged) else {
                continue;
            };
            let given = take_units(&mut entries, at, cost);
            if given == 0 {
                // Linearised at the snapshot.
                return Ok(0);
            }
            let next = Box::into_raw(Box::new(self.successor(&entries, judged))) as usize as u64;
            let replaced = LogSlot {
                sequence: sequence(snapshot.n) | LogSlot::REPLACED,
                units: 0,
                time: next,
            };
            // The refund's linearisation point: the new ring, written
            // above, is published by this CAS's Release.
            if ring.mark(&snapshot, replaced) {
                state.install(address, next);
                return Ok(given);
            }
            // SAFETY: made above and never published (the mark failed), so
            // it is this thread's alone.
            drop(unsafe { Box::from_raw(next as usize as *mut Successor) });
        }
    }

    /// The entries of `snapshot` inside the window at `judged`, oldest
    /// first, each as its time and the units it counts; `Moved` if the ring
    /// moved on while they were read.
    fn entries_inside(
        &self,
        ring: Ring<'_>,
        snapshot: &Snapshot,
        judged: u64,
    ) -> Result<Vec<(u64, u64)>, Moved> {
        let n = snapshot.n;
        let read = |entry| {
            if entry + 1 == n {
                Ok(snapshot.latest)
            } else {
                ring.read(entry)
            }
        };
        self.entries_of(n, 0, judged, &read)
    }

    /// `entries_inside` of the `n` entries `read` reads, those before
    /// `from` known to have left the window.
    fn entries_of(
        &self,
        n: u64,
        from: u64,
        judged: u64,
        read: &impl Fn(u64) -> Result<LogSlot, Moved>,
    ) -> Result<Vec<(u64, u64)>, Moved> {
        let inside = self.in_window(n, from, judged, read)?;
        let first = n - inside;
        // The running total just before the first entry inside: 0 when it
        // is the ring's first, else the entry before it if the ring still
        // keeps it. When it does not, all `L` kept entries are inside, and
        // each counts one unit (module docs): `None`.
        let mut before = if first == 0 {
            Some(NONE)
        } else if inside < self.config.limit() {
            Some(read(first - 1)?)
        } else {
            None
        };
        let mut entries = Vec::with_capacity(inside as usize);
        for entry in first..n {
            let slot = read(entry)?;
            let units = before.map_or(1, |previous| units_between(slot, previous));
            entries.push((slot.time, units));
            before = before.map(|_| slot);
        }
        Ok(entries)
    }

    /// A ring whose whole history is `entries` (times and units, oldest
    /// first, fewer than `L`), judged from `floor` on: numbered from 0,
    /// running totals from 0, the other slots as new.
    fn successor(&self, entries: &[(u64, u64)], floor: u64) -> Successor {
        Successor {
            committed: AtomicU64::new(entries.len() as u64),
            boundary: AtomicU64::new(0),
            floor,
            slots: self.young_slots(entries).collect(),
        }
    }

    /// The entries `save_words` wrote (`words` in pairs), if they are
    /// entries of one window of this log (`load_words`).
    pub(crate) fn loaded_entries(&self, words: &[u64]) -> Option<Vec<(u64, u64)>> {
        let limit = self.config.limit();
        if !words.len().is_multiple_of(2) || (words.len() / 2) as u64 > limit {
            return None;
        }
        let entries: Vec<(u64, u64)> = words.chunks_exact(2).map(|e| (e[0], e[1])).collect();
        let rising = entries.windows(2).all(|pair| pair[0].0 <= pair[1].0);
        let units = entries.iter().try_fold(0u64, |total, &(_, units)| {
            (units >= 1).then(|| total.saturating_add(units))
        })?;
        let one_window = match (entries.first(), entries.last()) {
            (Some(&(first, _)), Some(&(last, _))) => !self.expired(first, last),
            _ => true,
        };
        (rising && units <= limit && one_window).then_some(entries)
    }

    /// The `L` slots of a ring whose whole history is `entries` (at most
    /// `L`), and its latest entry (`NONE` if none).
    fn young_slots<'e>(&self, entries: &'e [(u64, u64)]) -> impl Iterator<Item = AtomicU128> + 'e {
        let limit = self.config.limit();
        let mut total = 0u32;
        (0..limit).map(move |i| {
            let slot = match entries.get(i as usize) {
                Some(&(time, units)) => {
                    // Each entry counts at most L < 2^20 units; the total
                    // is kept mod 2^20 (`cell`).
                    total = total.wrapping_add(units as u32) & LogSlot::UNITS;
                    LogSlot {
                        sequence: sequence(i + limit),
                        units: total,
                        time,
                    }
                }
                None => LogSlot {
                    sequence: i,
                    units: 0,
                    time: 0,
                },
            };
            AtomicU128::new(slot.pack())
        })
    }

    /// What a retired (frozen) ring had spent, judged no earlier than its
    /// newest entry or its floor.
    fn frozen_spent(&self, ring: Ring<'_>, now: u64) -> Spent {
        let n = ring.frozen_entries();
        let latest = n.checked_sub(1).map_or(NONE, |last| ring.frozen(last));
        let at = now.max(latest.time).max(ring.floor);
        let read = |entry| Ok(ring.frozen(entry));
        match self.units_inside(n, 0, latest, at, &read) {
            Ok((count, _)) => Spent { count, at },
            Err(Moved) => unreachable!("a frozen ring does not move"),
        }
    }
}

/// Takes up to `cost` units from the entries at time `at` (side by side:
/// times rise along the ring), oldest first, drops every entry left with
/// none, and answers the units taken: `min(cost, k)`, `k` the units at
/// `at` (the contract's "Giving units back").
fn take_units(entries: &mut Vec<(u64, u64)>, at: u64, cost: u64) -> u64 {
    let mut left = cost;
    for (time, units) in entries.iter_mut() {
        if *time == at && left > 0 {
            let taken = left.min(*units);
            *units -= taken;
            left -= taken;
        }
    }
    entries.retain(|&(_, units)| units > 0);
    cost - left
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;

    fn policy(limit: u64, window: u64) -> SlidingWindow {
        SlidingWindow::new(Config::per_ticks(limit, window).unwrap()).unwrap()
    }

    #[test]
    fn the_spec_session_for_one_client() {
        let policy = policy(3, 1_000);
        let rahul = policy.new_state();
        assert_eq!(policy.check(&rahul, 0).unwrap(), Decision::admit(2));
        assert_eq!(policy.check(&rahul, 100).unwrap(), Decision::admit(1));
        assert_eq!(policy.check(&rahul, 200).unwrap(), Decision::admit(0));
        assert_eq!(policy.check(&rahul, 300).unwrap(), Decision::reject(0, 700));
        assert_eq!(policy.remaining(&rahul, 999).unwrap(), 0);
        assert_eq!(policy.check(&rahul, 1_000).unwrap(), Decision::admit(0));
        assert_eq!(policy.remaining(&rahul, 1_150).unwrap(), 1);
    }

    #[test]
    fn remaining_counts_across_many_laps_of_the_ring() {
        let policy = policy(5, 100);
        let state = policy.new_state();
        for lap in 0..50u64 {
            for i in 0..5 {
                assert!(policy.check(&state, lap * 100 + i * 10).unwrap().allowed);
            }
        }
        // Admissions at 4900, 4910, …, 4940.
        assert_eq!(policy.remaining(&state, 4_999).unwrap(), 0);
        assert_eq!(policy.remaining(&state, 5_000).unwrap(), 1);
        assert_eq!(policy.remaining(&state, 5_025).unwrap(), 3);
        assert_eq!(policy.remaining(&state, 5_040).unwrap(), 5);
    }

    #[test]
    fn remaining_is_exact_wherever_the_window_edge_falls() {
        // Admissions at 0, 10, …, 630 (64 of them, L = 64, W = 1000): at
        // every instant from 630 to 1640 count the inside ones by hand.
        let policy = policy(64, 1_000);
        let state = policy.new_state();
        let times: Vec<u64> = (0..64).map(|i| i * 10).collect();
        for &t in &times {
            assert!(policy.check(&state, t).unwrap().allowed);
        }
        for now in 630..=1_640 {
            let inside = times.iter().filter(|&&t| t + 1_000 > now).count() as u64;
            assert_eq!(
                policy.remaining(&state, now).unwrap(),
                64 - inside,
                "at {now}"
            );
        }
    }

    #[test]
    fn the_boundary_hint_is_read_before_it_is_trusted() {
        // L = 8, W = 100, admissions at 0, 10, …, 40: at 120 only the ones
        // at 30 and 40 are inside. Whatever the hint says (stale, or past
        // every entry as a racing call's could), the answers are these.
        let policy = policy(8, 100);
        for hint in 0..=12 {
            let fresh = || {
                let state = policy.new_state();
                for t in [0, 10, 20, 30, 40] {
                    assert!(policy.check(&state, t).unwrap().allowed);
                }
                state.boundary.store(hint, Ordering::Relaxed);
                state
            };
            let state = fresh();
            assert_eq!(
                policy.check_within(&state, 120, 7).unwrap(),
                Decision::reject(6, 10),
                "hint {hint}"
            );
            assert_eq!(
                policy.check(&state, 120).unwrap(),
                Decision::admit(5),
                "hint {hint}"
            );
            // The admission left where the window began, entry 3 (at 30),
            // unless the hint was behind it by fewer than four entries.
            let left = if hint <= 3 { hint } else { 3 };
            assert_eq!(state.boundary.load(Ordering::Relaxed), left, "hint {hint}");
            let state = fresh();
            assert_eq!(
                policy.check_within(&state, 120, 6).unwrap(),
                Decision::admit(0)
            );
        }
    }

    #[test]
    fn the_boundary_hint_follows_the_window_a_line_at_a_time() {
        // L = 64, W = 100, one admission every 10 ticks: nine inside before
        // each, and the window's start moves one entry an admission.
        let policy = policy(64, 100);
        let state = policy.new_state();
        let mut stored = Vec::new();
        for i in 0..40u64 {
            assert_eq!(
                policy.check(&state, i * 10).unwrap(),
                Decision::admit(64 - i.min(9) - 1)
            );
            stored.push(state.boundary.load(Ordering::Relaxed));
        }
        // The first inside before admission i is i − 9 (from i = 9 on):
        // stored at 4, 8, 12, … once it is four past the hint.
        for (i, hint) in stored.iter().enumerate().skip(13) {
            let first = i as u64 - 9;
            assert!(first - hint < 4, "admission {i}: hint {hint}");
            assert_eq!(hint % 4, 0, "admission {i}: hint {hint}");
        }
    }

    #[test]
    fn an_older_now_is_stored_as_the_latest_time() {
        let policy = policy(2, 100);
        let state = policy.new_state();
        assert!(policy.check(&state, 500).unwrap().allowed);
        assert!(policy.check(&state, 10).unwrap().allowed); // stored as 500
        assert_eq!(policy.check(&state, 550).unwrap(), Decision::reject(0, 50));
        assert_eq!(policy.remaining(&state, 600).unwrap(), 2);
    }

    #[test]
    fn idle_once_the_latest_admission_left_the_window() {
        let policy = policy(3, 100);
        let state = policy.new_state();
        assert!(policy.check(&state, 10).unwrap().allowed);
        assert!(policy.check(&state, 40).unwrap().allowed);
        assert!(!policy.retire_if_idle(&state, 139));
        assert!(policy.retire_if_idle(&state, 140));
        assert_eq!(policy.check(&state, 140), Err(Retired));
        assert_eq!(policy.remaining(&state, 140), Err(Retired));
        assert!(policy.is_retired(&state));
    }

    #[test]
    fn a_retired_ring_still_tells_what_it_spent() {
        let policy = policy(4, 100);
        let state = policy.new_state();
        for t in [0, 10, 20, 30, 100, 110] {
            assert!(policy.check(&state, t).unwrap().allowed);
        }
        // At 110: 20, 30, 100 and 110 are inside.
        assert_eq!(policy.retire_spent(&state, 110).count, 4);
        assert_eq!(
            policy.retire_spent(&state, 131).count,
            2,
            "frozen: 100, 110"
        );
        // An older `now` is judged at the newest admission, 110.
        assert_eq!(policy.retire_spent(&state, 50), Spent { count: 4, at: 110 });
        let carried = policy.spent_state(2, 131);
        assert_eq!(policy.remaining(&carried, 131).unwrap(), 2);
        assert_eq!(policy.remaining(&carried, 231).unwrap(), 4);
    }

    /// A refund of `cost` units of the admission at `at`, at `now`.
    fn refund(
        policy: &SlidingWindow,
        state: &SlidingWindowState,
        now: u64,
        at: u64,
        cost: u64,
    ) -> u64 {
        policy.refund(state, now, now - at, cost).unwrap()
    }

    #[test]
    fn an_entry_refunded_to_nothing_leaves_the_ring() {
        // Were the entry at 2 kept with 0 units, three kept entries inside
        // would read as three units and refuse the check at 3.
        let policy = policy(3, 100);
        let state = policy.new_state();
        for t in [0, 1, 2] {
            assert!(policy.check(&state, t).unwrap().allowed);
        }
        assert_eq!(refund(&policy, &state, 2, 2, 1), 1);
        assert_eq!(policy.check(&state, 3).unwrap(), Decision::admit(0));
        assert_eq!(policy.check(&state, 4).unwrap(), Decision::reject(0, 96));
    }

    #[test]
    fn a_refunded_young_ring_counts_only_what_is_left() {
        // Entries at 0 and 10, the one at 10 refunded: the new ring holds
        // one entry and counts from there.
        let policy = policy(3, 100);
        let state = policy.new_state();
        assert!(policy.check(&state, 0).unwrap().allowed);
        assert!(policy.check(&state, 10).unwrap().allowed);
        assert_eq!(refund(&policy, &state, 10, 10, 1), 1);
        assert_eq!(policy.check(&state, 20).unwrap(), Decision::admit(1));
        assert_eq!(policy.check(&state, 30).unwrap(), Decision::admit(0));
        assert_eq!(policy.check(&state, 40).unwrap(), Decision::reject(0, 60));
        assert_eq!(policy.remaining(&state, 100).unwrap(), 1);
        assert_eq!(policy.remaining(&state, 130).unwrap(), 3);
    }

    #[test]
    fn a_weighted_admission_gives_back_what_is_left_of_it() {
        let policy = policy(10, 100);
        let state = policy.new_state();
        assert!(policy.check_n(&state, 5, 3).unwrap().allowed);
        assert!(policy.check_n(&state, 5, 4).unwrap().allowed);
        assert!(policy.check_n(&state, 6, 2).unwrap().allowed);
        // Seven units at 5: the first refund takes 5, the second the two
        // left, the third finds none.
        assert_eq!(refund(&policy, &state, 7, 5, 5), 5);
        assert_eq!(policy.remaining(&state, 7).unwrap(), 6);
        assert_eq!(refund(&policy, &state, 8, 5, 5), 2);
        assert_eq!(refund(&policy, &state, 8, 5, 5), 0);
        assert_eq!(policy.remaining(&state, 8).unwrap(), 8);
        // A time that was no admission gives nothing back.
        assert_eq!(refund(&policy, &state, 8, 7, 1), 0);
        assert_eq!(refund(&policy, &state, 9, 6, u64::MAX), 2);
        assert_eq!(policy.remaining(&state, 9).unwrap(), 10);
        assert_eq!(refund(&policy, &state, 9, 6, 0), 0);
    }

    #[test]
    fn nothing_comes_back_a_window_after_the_admission() {
        let policy = policy(2, 100);
        let state = policy.new_state();
        assert!(policy.check(&state, 0).unwrap().allowed);
        assert!(policy.check(&state, 50).unwrap().allowed);
        assert_eq!(refund(&policy, &state, 100, 0, 1), 0);
        assert_eq!(refund(&policy, &state, 149, 50, 1), 1);
        assert_eq!(policy.remaining(&state, 149).unwrap(), 2);
    }

    #[test]
    fn a_refunds_time_is_a_floor_for_every_later_call() {
        // The refund at 90 took the newest entry: a later call with an
        // older `now` is judged at 90 and stored there, never at 10.
        let policy = policy(2, 100);
        let state = policy.new_state();
        assert!(policy.check(&state, 0).unwrap().allowed);
        assert!(policy.check(&state, 90).unwrap().allowed);
        assert_eq!(refund(&policy, &state, 90, 90, 1), 1);
        assert_eq!(policy.check(&state, 10).unwrap(), Decision::admit(0));
        assert_eq!(policy.remaining(&state, 150).unwrap(), 1);
        assert_eq!(policy.remaining(&state, 190).unwrap(), 2);
    }

    #[test]
    fn refunds_on_a_saturated_ring_that_wrapped_count_one_unit_an_entry() {
        // L = 4 over many laps; every kept entry inside (each one unit).
        let policy = policy(4, 100);
        let state = policy.new_state();
        let mut times = Vec::new();
        for t in (0..2_000).step_by(25) {
            assert!(policy.check(&state, t).unwrap().allowed, "at {t}");
            times.push(t);
        }
        let now = *times.last().unwrap();
        assert_eq!(policy.remaining(&state, now).unwrap(), 0);
        for (k, &at) in times.iter().rev().take(4).enumerate() {
            assert_eq!(refund(&policy, &state, now, at, 2), 1, "refund {k}");
            assert_eq!(policy.remaining(&state, now).unwrap(), k as u64 + 1);
        }
        // Four refunds, four rings; it still admits, retires and carries.
        for t in 0..4 {
            assert!(policy.check(&state, now + t).unwrap().allowed);
        }
        assert!(!policy.check(&state, now + 4).unwrap().allowed);
        assert_eq!(policy.retire_spent(&state, now + 4).count, 4);
        assert!(policy.is_retired(&state));
        assert_eq!(policy.check(&state, now + 5), Err(Retired));
        assert_eq!(policy.refund(&state, now + 5, 5, 1), Err(Retired));
    }

    #[test]
    fn a_refunded_client_is_swept_once_idle() {
        let policy = policy(3, 100);
        let state = policy.new_state();
        assert!(policy.check(&state, 0).unwrap().allowed);
        assert!(policy.check(&state, 40).unwrap().allowed);
        assert_eq!(refund(&policy, &state, 40, 40, 1), 1);
        assert!(!policy.retire_if_idle(&state, 99));
        assert!(policy.retire_if_idle(&state, 100));
        assert!(policy.is_retired(&state));
        assert_eq!(policy.remaining(&state, 100), Err(Retired));
        // Everything refunded: idle at once.
        let state = policy.new_state();
        assert!(policy.check(&state, 0).unwrap().allowed);
        assert_eq!(refund(&policy, &state, 0, 0, 1), 1);
        assert!(policy.retire_if_idle(&state, 0));
    }

    #[test]
    fn both_copies_of_a_moved_client_see_one_refunded_state() {
        let policy = policy(3, 100);
        let old = policy.new_state();
        for t in [0, 1, 2] {
            assert!(policy.check(&old, t).unwrap().allowed);
        }
        let new = policy.relocate(&old).unwrap();
        assert_eq!(refund(&policy, &new, 3, 1, 1), 1);
        assert_eq!(policy.remaining(&old, 3).unwrap(), 1);
        assert!(policy.check(&old, 4).unwrap().allowed);
        assert_eq!(policy.remaining(&new, 4).unwrap(), 0);
        assert_eq!(refund(&policy, &old, 5, 4, 1), 1);
        assert_eq!(policy.remaining(&new, 5).unwrap(), 1);
        let newer = policy.relocate(&new).unwrap();
        drop(old);
        drop(new);
        assert_eq!(policy.remaining(&newer, 5).unwrap(), 1);
        assert!(policy.retire_if_idle(&newer, 200));
        assert!(policy.relocate(&newer).is_none());
    }
}
