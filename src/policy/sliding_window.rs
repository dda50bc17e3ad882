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
    /// Entries committed so far, or one fewer (a hint; see module docs).
    committed: AtomicU64,
    /// Shared, not copied, when the keyed store moves the client to a
    /// larger table: the ring is the state, and every decision through
    /// either table's entry lands in it (`relocate`).
    ring: Arc<[AtomicU128]>,
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

/// What the slot at a hint says of the frontier (`frontier_at`).
enum Frontier {
    /// The hint is the frontier: its slot waits for that entry.
    Open,
    /// The ring is frozen with this many entries.
    Retired(u64),
    /// At least this many entries are committed: look there.
    Behind(u64),
}

/// Entry `entry`'s sequence (module docs; 43 bits, `cell`).
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

impl SlidingWindowState {
    #[inline]
    fn slot(&self, entry: u64) -> &AtomicU128 {
        // The ring has L slots and L fits usize (it is at most 2^20 − 1), so
        // the remainder does too.
        &self.ring[(entry % self.ring.len() as u64) as usize]
    }

    /// Slot `entry mod L` if it still holds that entry.
    ///
    /// Acquire pairs with the Release of the CAS that wrote the slot; the
    /// slot's own sequence number is what the reader checks, so nothing else
    /// rides on this ordering.
    #[inline]
    fn read(&self, entry: u64) -> Result<LogSlot, Moved> {
        let slot = LogSlot::unpack(self.slot(entry).load(Ordering::Acquire));
        if slot.sequence == sequence(entry + self.ring.len() as u64) {
            Ok(slot)
        } else {
            Err(Moved)
        }
    }

    /// What the slot of entry `n` says of the frontier `e` (the next entry
    /// to commit), given `n <= e` (module docs: a hint never passes the
    /// frontier). The slot holds the latest entry `m ≡ n (mod L)` that was
    /// committed (sequence `m + L`), or the mark on a frozen frontier
    /// (sequence `e | R`); its distance from `n`'s own sequence tells which.
    #[inline]
    fn frontier_at(&self, n: u64, slot: LogSlot) -> Frontier {
        if slot.sequence & LogSlot::RETIRED != 0 {
            // Only the frontier is ever marked, and a marked ring never
            // changes again.
            return Frontier::Retired(
                n + (slot.sequence.wrapping_sub(sequence(n)) & LogSlot::SEQUENCE),
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
        let len = self.ring.len() as u64;
        debug_assert!(
            ahead >= len && ahead.is_multiple_of(len),
            "slot {slot:?} for entry {n}"
        );
        Frontier::Behind((n + ahead + 1).saturating_sub(len).max(n + 1))
    }

    /// A consistent view of the state: linearised at the load of the oldest
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
    fn snapshot(&self) -> Result<Snapshot, Retired> {
        // Acquire: a hint only; every slot read below is checked by its
        // sequence number.
        let mut n = self.committed.load(Ordering::Acquire);
        loop {
            let oldest = LogSlot::unpack(self.slot(n).load(Ordering::Acquire));
            match self.frontier_at(n, oldest) {
                Frontier::Open => {}
                Frontier::Retired(_) => return Err(Retired),
                Frontier::Behind(committed) => {
                    // The hint lags: move it on for whoever committed the
                    // entries, then look at the slot of the frontier found.
                    self.advance_hint_to(committed);
                    n = committed;
                    continue;
                }
            }
            let latest = match n.checked_sub(1) {
                None => LogSlot {
                    sequence: 0,
                    units: 0,
                    time: 0,
                },
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

    /// Marks the frontier slot of `snapshot` retired; fails if the ring
    /// moved on since. AcqRel/Acquire as an admission's CAS.
    fn mark(&self, snapshot: &Snapshot) -> bool {
        let marked = LogSlot {
            sequence: sequence(snapshot.n) | LogSlot::RETIRED,
            ..snapshot.oldest
        };
        self.slot(snapshot.n)
            .compare_exchange(
                snapshot.oldest.pack(),
                marked.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// The entries of a retired (frozen) ring: the frontier, where the
    /// mark is. Found from the hint as `snapshot` finds it: with no slot
    /// changing, each pass moves on to a later committed entry, so the loop
    /// ends within `L + 1` passes.
    fn frozen_entries(&self) -> u64 {
        let mut n = self.committed.load(Ordering::Acquire);
        loop {
            match self.frontier_at(n, self.frozen(n)) {
                Frontier::Retired(frontier) => return frontier,
                Frontier::Behind(committed) => n = committed,
                Frontier::Open => unreachable!("a frozen ring's frontier is marked"),
            }
        }
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

    fn remaining_at(&self, state: &SlidingWindowState, now: u64) -> Result<u64, Retired> {
        // Progress: a pass is repeated only when a slot read after the
        // snapshot was overwritten, which takes other threads' admissions
        // (L of them past the snapshot's frontier); `snapshot` itself ends
        // as its docs say.
        loop {
            let snapshot = state.snapshot()?;
            let now = now.max(snapshot.latest.time);
            let read = |entry| state.read(entry);
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
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogView<'r> {
    ring: &'r [AtomicU128],
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
    pub(crate) fn new(ring: &'r [AtomicU128], (n, latest, from): LogWords) -> Self {
        Self {
            ring,
            n,
            latest: LogSlot::unpack(latest),
            from,
        }
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

impl SlidingWindow {
    /// A new client's log among several rules: its ring and its words.
    pub(crate) fn view_begin(&self) -> (Arc<[AtomicU128]>, LogWords) {
        self.view_spent(0, 0)
    }

    /// A log with `spent` units admitted at `now` (as `spent_state`): its
    /// ring and its words.
    pub(crate) fn view_spent(&self, spent: u64, now: u64) -> (Arc<[AtomicU128]>, LogWords) {
        let state = self.spent_state(spent, now);
        let n = state.committed.load(Ordering::Acquire);
        let none = LogSlot {
            sequence: 0,
            units: 0,
            time: 0,
        };
        let latest = match n.checked_sub(1) {
            Some(last) => state.read(last).unwrap_or(none),
            None => none,
        };
        (state.ring, (n, latest.pack(), 0))
    }

    /// `remaining` at `now` as of `view`.
    pub(crate) fn view_remaining(&self, view: &LogView<'_>, now: u64) -> Result<u64, Moved> {
        view.help()?;
        let at = now.max(view.latest.time);
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
        let at = now.max(view.latest.time);
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
        view.n == 0 || self.expired(view.latest.time, now)
    }

    /// What `view` had spent, judged no earlier than its newest entry (as
    /// `retire_spent`). The view is a retired state's, whose ring no chain
    /// of frames moves on; were it moved, the whole limit counts as
    /// spent, the stricter answer.
    pub(crate) fn view_spent_at(&self, view: &LogView<'_>, now: u64) -> Spent {
        let at = now.max(view.latest.time);
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
        let limit = self.config.limit();
        let read = |entry| state.read(entry);
        // Progress: a pass is repeated only when a slot it read was
        // overwritten, or when its CAS on the frontier failed: both only
        // after another thread committed an entry (or marked the ring,
        // which the next snapshot answers as `Retired`). `snapshot` ends
        // as its docs say.
        loop {
            let snapshot = state.snapshot()?;
            let Snapshot { n, oldest, latest } = snapshot;
            // Judged at the latest time the state reflects, if that is later.
            let at = now.max(latest.time);
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
            if state
                .slot(n)
                .compare_exchange(
                    oldest.pack(),
                    admitted.pack(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                state.advance_hint(n);
                return Ok(Decision::admit(limit - used - cost));
            }
        }
    }

    fn remaining(&self, state: &SlidingWindowState, now: u64) -> Result<u64, Retired> {
        self.remaining_at(state, now)
    }

    /// Not yet: the log gives nothing back.
    fn refund(
        &self,
        state: &SlidingWindowState,
        now: u64,
        ago: u64,
        cost: u64,
    ) -> Result<u64, Retired> {
        let _ = (now, ago, cost);
        state.snapshot().map(|_| 0)
    }

    fn retire_if_idle(&self, state: &SlidingWindowState, now: u64) -> bool {
        // Progress: the mark's CAS fails only after another thread
        // committed the frontier entry or marked it.
        loop {
            let Ok(snapshot) = state.snapshot() else {
                return false;
            };
            if !self.idle(&snapshot, now) {
                return false;
            }
            if state.mark(&snapshot) {
                return true;
            }
        }
    }

    /// Judged no earlier than the newest entry in the log.
    fn retire_spent(&self, state: &SlidingWindowState, now: u64) -> Spent {
        // Progress: as `retire_if_idle`'s.
        while let Ok(snapshot) = state.snapshot() {
            if state.mark(&snapshot) {
                break;
            }
        }
        let at = now.max(self.frozen_latest(state).time);
        Spent {
            count: self.config.limit() - self.frozen_remaining(state, at),
            at,
        }
    }

    /// The ring with `spent` units admitted at `now`: one entry (slot 0,
    /// sequence `L`) that counts them, the other slots as new.
    fn spent_state(&self, spent: u64, now: u64) -> SlidingWindowState {
        let len = self.config.limit();
        let spent = spent.min(len);
        let entries = u64::from(spent > 0);
        SlidingWindowState {
            committed: AtomicU64::new(entries),
            ring: (0..len)
                .map(|i| {
                    let slot = if i < entries {
                        LogSlot {
                            sequence: sequence(i + len),
                            // At most L < 2^20 (`cell`).
                            units: spent as u32,
                            time: now,
                        }
                    } else {
                        LogSlot {
                            sequence: i,
                            units: 0,
                            time: 0,
                        }
                    };
                    AtomicU128::new(slot.pack())
                })
                .collect(),
        }
    }

    fn is_retired(&self, state: &SlidingWindowState) -> bool {
        state.snapshot().is_err()
    }

    /// The ring is not frozen but shared: the old table's entry and the
    /// new one's hold the same ring, so a check through either is a check
    /// on the one state. Only the `committed` hint is per entry: the old
    /// entry's may fall any number of entries behind while calls go
    /// through the new one, and the next call through the old one catches
    /// it up (module docs, `snapshot`).
    fn relocate(&self, state: &SlidingWindowState) -> Option<SlidingWindowState> {
        (!self.is_retired(state)).then(|| SlidingWindowState {
            committed: AtomicU64::new(state.committed.load(Ordering::Acquire)),
            ring: Arc::clone(&state.ring),
        })
    }
}

impl SlidingWindow {
    /// The newest entry of a frozen ring (time 0, no units, if none).
    fn frozen_latest(&self, state: &SlidingWindowState) -> LogSlot {
        let n = state.frozen_entries();
        n.checked_sub(1).map_or(
            LogSlot {
                sequence: 0,
                units: 0,
                time: 0,
            },
            |last| state.frozen(last),
        )
    }

    /// `remaining` of a retired ring, as it was frozen.
    fn frozen_remaining(&self, state: &SlidingWindowState, now: u64) -> u64 {
        let n = state.frozen_entries();
        let latest = self.frozen_latest(state);
        let read = |entry| Ok(state.frozen(entry));
        match self.units_inside(n, 0, latest, now.max(latest.time), &read) {
            Ok((used, _)) => self.config.limit() - used,
            Err(Moved) => unreachable!("a frozen ring does not move"),
        }
    }
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
}
