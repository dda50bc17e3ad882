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
//! for an idle or a saturated client, O(log L) at worst. A single request
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
//! waits for a refund. A client never refunded pays nothing for this: its
//! home ring is unmarked, and the mark test is the one that already looks
//! for `R`. A refunded client's calls find the home ring marked and go on,
//! under a pin, through the link (a cold path): they decide, retire or read
//! on the current ring exactly as on a home ring, with its hint and floor.
//!
//! A ring the link moves past is reachable only by threads that loaded the
//! link before, each under a pin taken before that load, so the thread
//! whose CAS moved the link hands the old ring to the crate's collector
//! (`store::epoch`), which frees it once those pins are gone; the current
//! ring is freed with the home ring (`Home`'s drop), when no copy of the
//! state is left to reach it.

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
    /// Shared, not copied, when the keyed store moves the client to a
    /// larger table: the ring is the state, and every decision through
    /// either table's entry lands in it (`relocate`).
    ring: Arc<Home>,
}

/// A client's first ring: its `L` slots, then the link (module docs,
/// "Giving units back"), `L + 1` words in one allocation, so that a check
/// of a client never refunded reaches its slots as it always did.
#[derive(Debug)]
#[repr(transparent)]
struct Home([AtomicU128]);

/// A ring a refund built (module docs, "Giving units back"): reached only
/// through its client's link, under a pin.
struct Successor {
    /// Entries committed to `slots`, or one fewer (as `committed` above).
    committed: AtomicU64,
    /// The time the refund was judged at: every call on this ring judges
    /// at this time or later.
    floor: u64,
    slots: Box<[AtomicU128]>,
}

/// One ring with its hint and floor: the home ring (floor 0) or the
/// current successor. Every step of the log runs on one.
#[derive(Clone, Copy)]
struct Ring<'a> {
    slots: &'a [AtomicU128],
    committed: &'a AtomicU64,
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

impl Home {
    /// A home ring of `slots` (`L` of them) and a link of 0.
    #[allow(unsafe_code)]
    fn new(slots: impl Iterator<Item = AtomicU128>) -> Arc<Self> {
        let words: Arc<[AtomicU128]> = slots.chain(std::iter::once(AtomicU128::new(0))).collect();
        // SAFETY: `Home` is `repr(transparent)` over `[AtomicU128]`, so a
        // pointer to one means the same data and length as a pointer to the
        // other, and the allocation `into_raw` gives up has the layout an
        // `Arc<Home>` of that length would have (as `Arc<str>` is made from
        // `Arc<[u8]>`); the `Arc` is rebuilt once, from this one pointer.
        unsafe { Arc::from_raw(Arc::into_raw(words) as *const Self) }
    }

    #[inline(always)]
    fn slots(&self) -> &[AtomicU128] {
        // Never empty: L >= 1 slots and the link.
        &self.0[..self.0.len() - 1]
    }

    /// Word `L`: 0, or the address of the client's current `Successor`
    /// (held as the low 64 bits).
    #[inline]
    fn link(&self) -> &AtomicU128 {
        &self.0[self.0.len() - 1]
    }
}

impl Drop for Home {
    /// Frees the current successor: the home ring goes with the last copy
    /// of the state, so no thread holds a way to it any more.
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        let link = self.link().load(Ordering::Acquire) as u64;
        if link != 0 {
            // SAFETY: the link names a successor made by `Box::into_raw`
            // (`refund_on`) that no one freed: only the thread that moves
            // the link past a ring retires it (`install`), and this is the
            // link's last value.
            drop(unsafe { Box::from_raw(link as usize as *mut Successor) });
        }
    }
}

impl Successor {
    fn ring(&self) -> Ring<'_> {
        Ring {
            slots: &self.slots,
            committed: &self.committed,
            floor: self.floor,
        }
    }
}

/// Hands a successor the link moved past to the collector: freed once no
/// pin taken before it is handed over is held (module docs). A thread
/// gathers them and hands them over 64 at a time (or once they hold 1 MiB
/// of slots), as `frame` does dropped clients' frames, so the collector's
/// list is locked once per 64 refunds, not per refund; the rest at thread
/// exit (`RetiredRings`). Handing over later than the link moved is only
/// more careful: the ring is reachable by no pin taken after the move.
#[cfg(not(floodgate_loom))]
#[allow(unsafe_code)]
fn retire_successor(address: u64) {
    // SAFETY: made by `Box::into_raw` (`refund_on`); only the one thread
    // whose CAS moved the link past it gets here, once (`install`).
    let successor = unsafe { Box::from_raw(address as usize as *mut Successor) };
    let mut successor = Some(successor);
    let full = RETIRED_RINGS.try_with(|bag| {
        let mut bag = bag.0.borrow_mut();
        let ring = successor.take().expect("taken once");
        bag.slots += ring.slots.len();
        bag.rings.push(ring);
        (bag.rings.len() >= 64 || bag.slots >= (1 << 20) / 16).then(|| bag.take())
    });
    match (full, successor) {
        (Ok(Some(rings)), _) => hand_over(rings),
        (Ok(None), _) => {}
        // The thread's locals are gone: hand it over alone.
        (Err(_), Some(ring)) => hand_over(vec![ring]),
        (Err(_), None) => {}
    }
}

#[cfg(not(floodgate_loom))]
#[allow(clippy::vec_box)] // boxed as made (`RetiredRings`)
fn hand_over(rings: Vec<Box<Successor>>) {
    if !rings.is_empty() {
        crate::store::epoch::retire_in(Box::new(rings), crate::store::epoch::EVERY_STORE);
    }
}

/// Rings a thread retired and has not yet handed over (`retire_successor`).
/// Boxed as they were made: a pinned reader may still hold a reference into
/// one (its hint), so none may move until the collector frees it.
#[cfg(not(floodgate_loom))]
#[derive(Default)]
#[allow(clippy::vec_box)]
struct RetiredRings {
    rings: Vec<Box<Successor>>,
    /// Their slots, all told.
    slots: usize,
}

#[cfg(not(floodgate_loom))]
impl RetiredRings {
    #[allow(clippy::vec_box)] // boxed as made (type docs)
    fn take(&mut self) -> Vec<Box<Successor>> {
        self.slots = 0;
        std::mem::take(&mut self.rings)
    }
}

#[cfg(not(floodgate_loom))]
struct Bag(std::cell::RefCell<RetiredRings>);

#[cfg(not(floodgate_loom))]
impl Drop for Bag {
    fn drop(&mut self) {
        hand_over(self.0.get_mut().take());
    }
}

#[cfg(not(floodgate_loom))]
std::thread_local! {
    static RETIRED_RINGS: Bag = Bag(std::cell::RefCell::new(RetiredRings::default()));
}

/// Kept, under the models' cfg, where nothing is freed (`sync`).
#[cfg(floodgate_loom)]
fn retire_successor(_: u64) {}

impl SlidingWindowState {
    /// The home ring: where every call of a client never refunded decides.
    #[inline(always)]
    fn home(&self) -> Ring<'_> {
        Ring {
            slots: self.ring.slots(),
            committed: &self.committed,
            floor: 0,
        }
    }

    /// Runs `step` on the home ring, or, once a refund replaced it, on the
    /// current ring (`through_link`). `step` answers `Frozen` only before
    /// it changed anything.
    #[inline(always)]
    fn on_current<T>(
        &self,
        mut step: impl FnMut(Ring<'_>, u64) -> Result<T, Frozen>,
    ) -> Result<T, Retired> {
        match step(self.home(), 0) {
            Ok(value) => Ok(value),
            Err(Frozen::Retired) => Err(Retired),
            Err(Frozen::Replaced) => self.through_link(&mut step),
        }
    }

    /// `step` on the ring the link names (with its address, 0 for the
    /// home ring), under a pin (module docs).
    ///
    /// Progress: a pass repeats only when `step` found its ring replaced,
    /// after which `install` has moved the link on to the ring that
    /// replaced it (this thread's CAS or another's). A ring is replaced
    /// only by a refund's successful mark, so passes repeat only while
    /// other threads' refunds succeed.
    #[cold]
    #[inline(never)]
    fn through_link<T>(
        &self,
        step: &mut impl FnMut(Ring<'_>, u64) -> Result<T, Frozen>,
    ) -> Result<T, Retired> {
        let _pin = crate::frame::pin();
        loop {
            let (ring, address) = self.current();
            match step(ring, address) {
                Ok(value) => return Ok(value),
                Err(Frozen::Retired) => return Err(Retired),
                Err(Frozen::Replaced) => self.install(address, ring.frozen_mark().time),
            }
        }
    }

    /// The ring the link names, and its address (0: the home ring). The
    /// caller holds a pin taken before this call, and keeps the ring only
    /// while it holds it.
    #[allow(unsafe_code)]
    fn current(&self) -> (Ring<'_>, u64) {
        // Acquire: pairs with the Release of the `install` that stored it,
        // which follows the refund's writes into that ring.
        let link = self.ring.link().load(Ordering::Acquire) as u64;
        if link == 0 {
            return (self.home(), 0);
        }
        // SAFETY: a successor the link names is freed only by the
        // collector, after the link moved past it and after every pin taken
        // before that move (`install`); this thread's pin is older than its
        // load. Or by `Home`'s drop, when no `&self` is left.
        let successor = unsafe { &*(link as usize as *const Successor) };
        (successor.ring(), link)
    }

    /// Moves the link from the ring at `from` (0: the home ring) to the
    /// ring its `P` mark names, `to`, unless someone did: the link only
    /// ever moves along marks, so a failed CAS means it is already past
    /// `from`. The thread whose CAS succeeds retires `from`.
    fn install(&self, from: u64, to: u64) {
        // AcqRel: the Release passes on, to readers that Acquire the link,
        // the refund's writes into `to`, which this thread saw with the
        // Acquire load of the mark; Relaxed on failure: nothing is read.
        let moved = self
            .ring
            .link()
            .compare_exchange(
                u128::from(from),
                u128::from(to),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok();
        if moved && from != 0 {
            retire_successor(from);
        }
    }
}

impl SlidingWindowState {
    /// The ring to go on with after `ring` (at `address`) was found
    /// replaced: the ring the link names, once it names one past `ring`
    /// (installed here if no one has; a client's home ring is found
    /// replaced on every call, and then the link is usually past it). Pins on the first call (`pin`
    /// holds it for the caller's whole decision).
    #[cold]
    #[inline(never)]
    fn follow<'s>(
        &'s self,
        ring: Ring<'s>,
        address: u64,
        pin: &mut Option<crate::frame::Pin>,
    ) -> (Ring<'s>, u64) {
        if pin.is_none() {
            *pin = Some(crate::frame::pin());
        }
        // Relaxed: only compared; `current` loads it again with Acquire
        // before reading any ring it names.
        if self.ring.link().load(Ordering::Relaxed) as u64 == address {
            self.install(address, ring.frozen_mark().time);
        }
        self.current()
    }
}

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

/// A `sliding-window` rule among several ([`Compound`](super::Compound)):
/// the log as of one frame of the client's rules, over a ring that every
/// frame of the client shares, so that a decision copies nothing.
///
/// A frame holds `n`, the entries committed as of it, and the latest of
/// them, entry `n − 1`, which it *publishes*: the compound's CAS that
/// installs the frame is the entry's commit, and the ring is only
/// written afterwards, by whoever reads the frame first (`help`: one
/// CAS of slot `(n − 1) mod L` from entry `n − 1 − L` to entry `n − 1`, or
/// nothing if it holds entry `n − 1` already). A frame of `n + 1`
/// entries is only ever made from one of `n` whose entry `n − 1` its maker
/// wrote first, so while a frame is current every entry but its latest
/// is in the ring, and only its latest may wait for a helper. Each entry
/// is committed once, by one successful CAS of the compound, so every
/// helper of it writes the same word; a helper holding an older frame finds
/// its slot already moved on (the sequence number says so) and its CAS,
/// which expects the older word, fails harmlessly: a slot never holds the
/// same word twice (module docs). A reader of an older frame that finds a
/// slot overwritten answers `Moved`, and loads the compound's word
/// again, which then shows a newer frame: another thread's CAS landed.
///
/// A refund among the rules builds a new ring (as the log alone does,
/// module docs), and the frame names its ring (`LogRing`): the refund's
/// frame names the new one, so the compound's one CAS publishes the new
/// ring with every other rule's refund. A frame's ring is never written
/// again once a later frame names another (only an old frame's helper may
/// write its latest entry into it, which changes nothing any reader of a
/// later frame reads).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogView<'r> {
    ring: &'r [AtomicU128],
    /// The ring's floor (`LogRing`).
    floor: u64,
    /// Entries committed as of this frame.
    n: u64,
    /// Entry `n − 1` (time 0, no units, if there is none).
    latest: LogSlot,
    /// The entries before this one had left the window at the latest
    /// entry's time, so they have at every time a decision judges at (at
    /// least that one): where counting what is inside begins
    /// (`in_window`), so a log that is partly expired costs a few reads,
    /// not a search of the ring.
    from: u64,
}

/// A log among several rules as its frame keeps it: the entries committed,
/// the latest entry (packed) and where its window began (`LogView::from`).
pub(crate) type LogWords = (u64, u128, u64);

impl<'r> LogView<'r> {
    /// The view a frame's words give over `ring`.
    #[inline]
    pub(crate) fn new(ring: &'r LogRing, (n, latest, from): LogWords) -> Self {
        Self {
            ring: &ring.slots,
            floor: ring.floor,
            n,
            latest: LogSlot::unpack(latest),
            from,
        }
    }

    /// The time a decision as of this view judges at: `now`, or a later
    /// time the log reflects (its latest entry's, or its ring's floor).
    #[inline]
    fn judged(&self, now: u64) -> u64 {
        now.max(self.latest.time).max(self.floor)
    }

    #[inline]
    fn slot(&self, entry: u64) -> &AtomicU128 {
        // L fits usize (at most 2^20 − 1), so the remainder does too.
        &self.ring[(entry % self.ring.len() as u64) as usize]
    }

    /// Entry `entry` (below `n`), if its slot still holds it. Acquire
    /// pairs with the Release of the CAS that wrote it.
    #[inline]
    fn read(&self, entry: u64) -> Result<LogSlot, Moved> {
        if entry + 1 == self.n {
            return Ok(self.latest);
        }
        let slot = LogSlot::unpack(self.slot(entry).load(Ordering::Acquire));
        if slot.sequence == sequence(entry + self.ring.len() as u64) {
            Ok(slot)
        } else {
            Err(Moved)
        }
    }

    /// Writes the latest entry into its slot if no one has (type docs).
    ///
    /// Progress: the CAS fails only when the slot changed since the load,
    /// which only a helper writing this same entry (then the next pass
    /// finds it) or, for an older frame, the ring moving on (`Moved`)
    /// does.
    fn help(&self) -> Result<(), Moved> {
        let Some(entry) = self.n.checked_sub(1) else {
            return Ok(());
        };
        let len = self.ring.len() as u64;
        let slot = self.slot(entry);
        loop {
            let word = slot.load(Ordering::Acquire);
            let held = LogSlot::unpack(word).sequence;
            if held == sequence(entry + len) {
                return Ok(());
            }
            // The slot still holds entry `entry − L`, whose sequence is
            // `entry` (a slot never written holds sequence `i`, as if entry
            // `i − L` had been there).
            if held != sequence(entry) {
                return Err(Moved);
            }
            // AcqRel: Release publishes the entry to readers that Acquire
            // the slot.
            if slot
                .compare_exchange(
                    word,
                    self.latest.pack(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                return Ok(());
            }
        }
    }
}

/// A ring of a log among several rules, shared by the frames and states
/// that name it: each state holds one count of the `Arc` for every ring
/// its current frame names (`Compound`'s `CompoundState`), and a frame
/// names it by its address (`into_address`), one word.
pub(crate) struct LogRing {
    slots: Box<[AtomicU128]>,
    /// As a successor's (`Successor::floor`): 0, or the time the refund
    /// that built the ring was judged at.
    floor: u64,
}

impl LogRing {
    /// A ring of `slots` judged from `floor` on, held once, as a frame
    /// word.
    pub(crate) fn into_address(slots: Box<[AtomicU128]>, floor: u64) -> u64 {
        Arc::into_raw(Arc::new(Self { slots, floor })) as usize as u64
    }

    /// The ring at `address`.
    ///
    /// # Safety
    ///
    /// `address` came from `into_address`, and a count of it is held (by a
    /// state the caller holds, whose current frame named it when read), or
    /// was held when the caller's pin was taken and the caller still holds
    /// that pin (a ring given up is freed only through the collector,
    /// `let_go_later`).
    #[allow(unsafe_code)]
    pub(crate) unsafe fn at<'a>(address: u64) -> &'a Self {
        // SAFETY: as the caller promises, the `LogRing` is alive for 'a.
        unsafe { &*(address as usize as *const Self) }
    }

    /// One more count of the ring at `address`, for a new state whose
    /// frame names it.
    ///
    /// # Safety
    ///
    /// As `at`: the ring is alive.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn share(address: u64) {
        // SAFETY: made by `Arc::into_raw` and alive (the caller).
        unsafe { Arc::increment_strong_count(address as usize as *const Self) }
    }

    /// Gives one count of the ring at `address` back now: its holder is
    /// gone, and no other thread can reach it through that holder.
    ///
    /// # Safety
    ///
    /// The caller holds that count, and gives it back once.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn let_go(address: u64) {
        // SAFETY: a count the caller holds, made by `Arc::into_raw`.
        drop(unsafe { Arc::from_raw(address as usize as *const Self) });
    }

    /// Gives one count of the ring at `address` back once no pin taken
    /// before this call is held: a frame that named it was replaced, and a
    /// reader of that frame may still be reading it.
    ///
    /// # Safety
    ///
    /// As `let_go`.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn let_go_later(address: u64) {
        // SAFETY: a count the caller holds (the caller).
        let count = unsafe { Arc::from_raw(address as usize as *const Self) };
        #[cfg(not(floodgate_loom))]
        crate::store::epoch::retire_in(Box::new(count), crate::store::epoch::EVERY_STORE);
        // Kept, under the models' cfg, where nothing is freed (`sync`).
        #[cfg(floodgate_loom)]
        std::mem::forget(count);
    }
}

impl SlidingWindow {
    /// A new client's log among several rules: its ring (`LogRing`, held
    /// once, for the new state) and its words.
    pub(crate) fn view_begin(&self) -> (u64, LogWords) {
        self.view_spent(0, 0)
    }

    /// A log with `spent` units admitted at `now` (as `spent_state`): its
    /// ring (as `view_begin`'s) and its words.
    pub(crate) fn view_spent(&self, spent: u64, now: u64) -> (u64, LogWords) {
        let (entries, latest) = self.spent_entry(spent, now);
        (
            LogRing::into_address(self.spent_slots(spent, now).collect(), 0),
            (entries, latest.pack(), 0),
        )
    }

    /// A refund among several rules as of `view`: up to `cost` units of
    /// the admission `ago` ticks before `now` (`now` no earlier than the
    /// origin), the contract's "Giving units back", as the log alone gives
    /// them. Answers the units given and, when any are, the new ring
    /// (`LogRing`, held once) and words of the log afterwards; `Moved` if
    /// the ring showed the frame stale.
    pub(crate) fn view_refund(
        &self,
        view: &LogView<'_>,
        now: u64,
        ago: u64,
        cost: u64,
    ) -> Result<(u64, Option<(u64, LogWords)>), Moved> {
        if super::gives_nothing(self.config, ago, cost) {
            return Ok((0, None));
        }
        let Some(at) = now.checked_sub(ago) else {
            return Ok((0, None));
        };
        let judged = view.judged(now);
        if self.expired(at, judged) {
            return Ok((0, None));
        }
        let read = |entry| view.read(entry);
        let mut entries = self.entries_of(view.n, view.from, judged, &read)?;
        let given = take_units(&mut entries, at, cost);
        if given == 0 {
            return Ok((0, None));
        }
        let kept = entries.len() as u64;
        let limit = self.config.limit();
        // The new ring's latest entry: the last one kept, with the running
        // total of all of them (mod 2^20, as `young_slots` writes it).
        let total = entries.iter().fold(0u32, |total, &(_, units)| {
            total.wrapping_add(units as u32) & LogSlot::UNITS
        });
        let latest = match entries.last() {
            Some(&(time, _)) => LogSlot {
                sequence: sequence(kept - 1 + limit),
                units: total,
                time,
            },
            None => NONE,
        };
        let ring = LogRing::into_address(self.young_slots(&entries).collect(), judged);
        Ok((given, Some((ring, (kept, latest.pack(), 0)))))
    }

    /// How many entries a ring with `spent` units admitted at `now` holds
    /// (0 or 1), and its latest (`NONE` if none).
    fn spent_entry(&self, spent: u64, now: u64) -> (u64, LogSlot) {
        let limit = self.config.limit();
        if spent == 0 {
            return (0, NONE);
        }
        let entry = LogSlot {
            sequence: sequence(limit),
            // At most L < 2^20 (`cell`).
            units: spent.min(limit) as u32,
            time: now,
        };
        (1, entry)
    }

    /// The `L` slots of a ring with `spent` units admitted at `now`: one
    /// entry (slot 0, sequence `L`) that counts them, if any, and the other
    /// slots as new (slot `i` as if entry `i − L` had been there).
    fn spent_slots(&self, spent: u64, now: u64) -> impl Iterator<Item = AtomicU128> {
        let (entries, entry) = self.spent_entry(spent, now);
        (0..self.config.limit()).map(move |i| {
            let slot = if i < entries {
                entry
            } else {
                LogSlot {
                    sequence: i,
                    units: 0,
                    time: 0,
                }
            };
            AtomicU128::new(slot.pack())
        })
    }

    /// `remaining` at `now` as of `view`.
    pub(crate) fn view_remaining(&self, view: &LogView<'_>, now: u64) -> Result<u64, Moved> {
        view.help()?;
        let at = view.judged(now);
        let (used, _) = self.units_inside(view.n, view.from, view.latest, at, &|entry| {
            view.read(entry)
        })?;
        Ok(self.config.limit() - used)
    }

    /// The decision on a request of cost `1 <= cost <= L` at `now` as of
    /// `view`, and, if admitted, the words of the frame that commits it
    /// (the caller's CAS is the commit; the ring is written by a later
    /// `help`).
    pub(crate) fn view_check(
        &self,
        view: &LogView<'_>,
        now: u64,
        cost: u64,
    ) -> Result<(Decision, Option<LogWords>), Moved> {
        view.help()?;
        let limit = self.config.limit();
        let read = |entry| view.read(entry);
        let at = view.judged(now);
        if view.n >= limit && cost == 1 {
            // As the log alone: if the oldest of the last L entries is
            // still inside the window, all L are, and none is left.
            let oldest = read(view.n - limit)?;
            if !self.expired(oldest.time, at) {
                let free_at = u128::from(oldest.time) + u128::from(self.config.window());
                let retry_after = u64::try_from(free_at - u128::from(now)).unwrap_or(u64::MAX);
                return Ok((Decision::reject(0, retry_after), None));
            }
        }
        let (used, inside) = self.units_inside(view.n, view.from, view.latest, at, &read)?;
        if used + cost > limit {
            let snapshot = Snapshot {
                n: view.n,
                // Unused by `retry_after`.
                oldest: view.latest,
                latest: view.latest,
            };
            let retry_after = self.retry_after(&snapshot, view.from, at, now, cost, &read)?;
            return Ok((Decision::reject(limit - used, retry_after), None));
        }
        let admitted = LogSlot {
            sequence: sequence(view.n + limit),
            // cost <= L < 2^20: the running total stays mod 2^20 (`cell`).
            units: view.latest.units.wrapping_add(cost as u32) & LogSlot::UNITS,
            time: at,
        };
        Ok((
            Decision::admit(limit - used - cost),
            // Entries before the first inside at `at` have left the window
            // for good: the new latest entry's time is `at`.
            Some((view.n + 1, admitted.pack(), view.n - inside)),
        ))
    }

    /// Idle at `now` as of `view`: no entry inside the window.
    pub(crate) fn view_idle(&self, view: &LogView<'_>, now: u64) -> bool {
        view.n == 0 || self.expired(view.latest.time, now.max(view.floor))
    }

    /// What `view` had spent, judged no earlier than its newest entry (as
    /// `retire_spent`). The view is a retired state's, whose ring no chain
    /// of frames moves on; were it moved, the whole limit counts as
    /// spent, the stricter answer.
    pub(crate) fn view_spent_at(&self, view: &LogView<'_>, now: u64) -> Spent {
        let at = view.judged(now);
        let count = match view.help().and_then(|()| {
            self.units_inside(view.n, view.from, view.latest, at, &|entry| {
                view.read(entry)
            })
        }) {
            Ok((used, _)) => used,
            Err(Moved) => self.config.limit(),
        };
        Spent { count, at }
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
            ring: Home::new(self.spent_slots(spent, now)),
        }
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
            let Ok((used, _)) = self.units_inside(n, 0, latest, at, &read) else {
                continue;
            };
            if used + cost > limit {
                let Ok(retry_after) = self.retry_after(&snapshot, 0, at, now, cost, &read) else {
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
            floor,
            slots: self.young_slots(entries).collect(),
        }
    }

    /// The `L` slots of a ring whose whole history is `entries` (fewer
    /// than `L`), and its latest entry (`NONE` if none).
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
