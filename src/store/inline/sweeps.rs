//! Sweeps in steps: the removal of idle clients, a chunk an arrival, and
//! the walk of every client for a save (the module docs' "Sweeps in
//! steps").

use std::hash::Hash;

use super::slots::{Table, DEAD, FULL, MOVED, STATE};
#[cfg(test)]
use super::Work;
use super::{InlineStore, Lifecycle, Upkeep};
use crate::bounds::SweepTurn;
use crate::stats::StoreCounts;
use crate::sync::{Guard, Ordering};

/// How many slots one step of a sweep visits in a table larger than
/// [`WHOLE_TABLE`]: the most any arrival visits (module docs, "Sweeps in
/// steps"). A visit of a slot that stays is a load and a compare, about 4
/// ns, so a step costs about a microsecond: measured on a 2-core AMD
/// EPYC guest, `floodgate bench --tail`'s flood of 4 M new ids at a cap
/// of 1 M, a step of 256 took 1.2 µs at the median and 1.6 to 1.9 µs at
/// its p99, in 8 % of the arrivals; one of 1,024 took 4.0 to 4.2 µs in
/// 2.2 % of them, and was the new clients' p99 (4.1 µs, against 1.5 to
/// 2.3 µs with 256). Under loom, two: the models' first table is swept
/// whole, a grown one in two steps.
pub(crate) const SWEEP_CHUNK: usize = if cfg!(floodgate_loom) { 2 } else { 256 };

/// A table of at most this many slots (every table of a limiter below
/// 512 clients) is swept whole, and moved whole, in one step, at the
/// arrival that began the sweep or the move: there the lock-free engine
/// agrees with the mutex engine on every call (module docs, "Sweeps in
/// steps"). Under loom, two, as [`SWEEP_CHUNK`].
pub(crate) const WHOLE_TABLE: usize = if cfg!(floodgate_loom) { 2 } else { 1024 };

/// The slots one step visits in a table of `capacity` slots: all of a
/// table of at most [`WHOLE_TABLE`], else `chunk` ([`SWEEP_CHUNK`] for a
/// sweep, `MOVE_CHUNK` for a move).
pub(super) fn step_slots(capacity: usize, chunk: usize) -> usize {
    if capacity <= WHOLE_TABLE {
        WHOLE_TABLE
    } else {
        chunk
    }
}

impl<K, C> InlineStore<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Send + Sync + 'static,
{
    /// An explicit sweep at `now`: how many clients it removed (0 if another
    /// thread is sweeping). It takes every step itself, giving `upkeep`
    /// back between them (arrivals that come meanwhile take steps of the
    /// same sweep): first the move under way, if any, then its own sweep of
    /// the whole table.
    pub(crate) fn sweep(&self, now: u64, policy: &impl Lifecycle<C>) -> usize {
        let Some(turn) = self.schedule.turn() else {
            return 0;
        };
        turn.restart();
        self.releases.drain();
        let guard = self.table.pin();
        let mut mine = None;
        // Progress: each pass takes a step (a chunk of a move, of which a
        // table has finitely many, or of this sweep's walk, which ends
        // after one pass over the table: a move starts it over, and a move
        // begins only after inserts filled half a table's room), or ends.
        // The wait for `upkeep` is one step of another thread's.
        let removed = loop {
            let mut upkeep = self.upkeep();
            let table = self.table.load(&guard);
            if table.next(&guard).is_some() {
                self.move_chunk(table, policy, &guard);
                continue;
            }
            let id = *mine.get_or_insert_with(|| self.begin_round(&mut upkeep, now, table));
            if !matches!(&upkeep.round, Some(round) if round.id == id) {
                // An arrival took its last step: its count is the sweep's.
                // (Only this sweep ends it: arrivals begin none while one
                // is under way.)
                debug_assert_eq!(upkeep.finished.0, id);
                break upkeep.finished.1;
            }
            if let Some(removed) = self.sweep_chunk(&mut upkeep, table, policy) {
                break removed;
            }
        };
        // Held until the sweep ended: another explicit sweep meanwhile
        // answered 0 at once.
        drop(turn);
        removed
    }

    /// Visits every client the table holds, each once (a save,
    /// `crate::state`): first takes any move under way to its end, as a
    /// sweep does, then walks the current table. A client created during
    /// the walk may be missed; one a move that begins during the walk
    /// moves is visited in the old table (FULL or already MOVED) with its
    /// state retired, which the caller reads again through `peek`. The walk holds one pin
    /// throughout: an outgrown table retired meanwhile is freed after it.
    pub(crate) fn visit_all(&self, policy: &impl Lifecycle<C>, mut visit: impl FnMut(&K, &C)) {
        let guard = self.table.pin();
        // Progress: each pass moves a chunk of the move under way, of
        // which it has finitely many; the wait for `upkeep` is one step of
        // another thread's (`upkeep`).
        let table = loop {
            let upkeep = self.upkeep();
            let table = self.table.load(&guard);
            if table.next(&guard).is_none() {
                break table;
            }
            self.move_chunk(table, policy, &guard);
            drop(upkeep);
        };
        for slot in table.slots.iter() {
            // MOVED too: a move that began during the walk took the client
            // to a table the walk does not visit; its state here is
            // retired, so the caller reads it where it went.
            if !matches!(slot.tag.load(Ordering::Acquire) & STATE, FULL | MOVED) {
                continue;
            }
            // SAFETY: the slot was FULL or MOVED (Acquire); `guard` holds
            // the table.
            let entry = unsafe { slot.entry() };
            visit(entry.key, entry.client);
        }
    }

    /// Begins the arrivals' sweep that `turn` says is due, at `now`, unless
    /// another thread holds `upkeep` (then a later arrival does) or one is
    /// under way already (it goes on).
    pub(super) fn begin_sweep(&self, turn: SweepTurn<'_>, now: u64, guard: &Guard) {
        let Some(mut upkeep) = self.try_upkeep() else {
            return;
        };
        if upkeep.round.is_none() {
            let table = self.table.load(guard);
            self.begin_round(&mut upkeep, now, table);
        }
        turn.restart();
    }

    /// Starts a sweep at `now` over `table` (under `upkeep`), in place of
    /// any under way; its id.
    fn begin_round(&self, upkeep: &mut Upkeep<K, C>, now: u64, table: &Table<K, C>) -> u64 {
        // Raised before any state is judged, so that every eviction of the
        // sweep happens after it (Release: see `arrive`).
        self.swept.fetch_max(now, Ordering::Release);
        upkeep.rounds += 1;
        upkeep.round = Some(Round {
            id: upkeep.rounds,
            now,
            generation: table.generation,
            cursor: 0,
            removed: 0,
        });
        self.sweeping.store(true, Ordering::Relaxed);
        upkeep.rounds
    }

    /// Visits the next [`SWEEP_CHUNK`] slots of the sweep under way in
    /// `table` (current, not being moved; under `upkeep`), or all of a
    /// table of at most [`WHOLE_TABLE`], and removes the clients idle at
    /// the sweep's `now`; if that ended the sweep, how many it removed in
    /// all. A sweep whose table was replaced since its last
    /// step (a move ended) starts over in the new one.
    pub(super) fn sweep_chunk(
        &self,
        upkeep: &mut Upkeep<K, C>,
        table: &Table<K, C>,
        policy: &impl Lifecycle<C>,
    ) -> Option<usize> {
        let round = upkeep.round.as_mut().expect("a sweep is under way");
        if round.generation != table.generation {
            round.generation = table.generation;
            round.cursor = 0;
        }
        let start = round.cursor;
        let chunk = step_slots(table.capacity(), SWEEP_CHUNK);
        let end = (start + chunk).min(table.capacity());
        let mut removed = 0;
        for slot in &table.slots[start..end] {
            #[cfg(test)]
            Work::visit(if chunk == WHOLE_TABLE { 1 } else { 3 });
            let tag = slot.tag.load(Ordering::Acquire);
            if tag & STATE != FULL {
                continue;
            }
            // SAFETY: the slot was FULL (Acquire); `guard` holds the table.
            let client = unsafe { slot.entry() }.client;
            // A plain store: under `upkeep`, no one else changes a FULL
            // tag. Release: a call that finds the slot DEAD (by its probe's
            // Acquire load of the tag, never having read the retired state)
            // must also find `swept` raised when the sweep began, or it
            // re-creates the client with an origin older than this sweep
            // (`arrive`; the drip policies' `sweep_races_an_older_check`
            // models in `loom-tests/tests/eviction.rs` fail with Relaxed
            // here).
            if policy.retire_idle(client, round.now) {
                slot.tag.store((tag & !STATE) | DEAD, Ordering::Release);
                removed += 1;
            }
        }
        round.cursor = end;
        round.removed += removed;
        // Counted DEAD first, then the places given back: so `stored <=
        // tracked`.
        table.dead.fetch_add(removed, Ordering::Relaxed);
        let kept = self.give_back(removed);
        StoreCounts::add(&self.counts.evicted, removed as u64);
        if end < table.capacity() {
            return None;
        }
        let total = round.removed;
        upkeep.finished = (round.id, total);
        upkeep.round = None;
        self.sweeping.store(false, Ordering::Relaxed);
        self.schedule
            .finish_round(kept.unwrap_or_else(|| table.live()));
        StoreCounts::add(&self.counts.sweeps, 1);
        Some(total)
    }
}

/// A sweep that arrivals carry out a chunk at a time.
pub(super) struct Round {
    id: u64,
    /// The time every client of the sweep is judged idle at: the one of the
    /// arrival (or explicit sweep) that began it.
    now: u64,
    /// The table it walks: one whose generation differs was replaced by a
    /// move, and the sweep starts over in it.
    generation: u64,
    /// The first slot no step of the sweep has visited.
    cursor: usize,
    /// Clients its steps removed so far.
    removed: usize,
}
