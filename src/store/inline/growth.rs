//! Growing in steps: the next table's memory prepared ahead of a move,
//! and the move itself, a chunk an arrival (the module docs' "Growing in
//! steps").

use std::alloc::Layout;
use std::hash::Hash;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use super::slots::{Entry, Slot, Table, BUSY, DEAD, EMPTY, FULL, MOVED, SEALED, STATE};
use super::sweeps::step_slots;
use super::{InlineStore, Lifecycle, Upkeep, Work};
use crate::stats::StoreCounts;
use crate::store::release::Releases;
use crate::sync::{Guard, Ordering, Staged, TableCell};

/// How many slots of an outgrown table one step of its move visits: the
/// most any call moves (module docs, "Growing in steps"). Chosen with
/// `floodgate bench --tail` (growth to 4 M clients beside known clients'
/// checks), each arrival's upkeep timed apart, AMD EPYC: a step of 64
/// slots took 1.2 to 1.6 µs at the median and 2.4 to 4.8 µs at its p99,
/// one of 32 slots 0.8 to 0.9 µs and 1.6 to 2.1 µs, in twice as many
/// arrivals (6.5 % of them, below the page faults' 2.5 % at 2.3 µs
/// that set a new client's p99: `TOUCH_PAGES`). A step is mostly its
/// read-modify-writes (a freeze and a claim a client): fetching the new
/// table's lines for its placements ahead of them (a first pass that
/// hashes the step's keys and prefetches) read the same. Earlier, 128
/// read a p99.9 of 36.5 µs (a step then places 128 clients at random in
/// a table of 192 MB, a cache and TLB miss each). Under loom, one: a
/// model's two-slot table then moves in two steps, so the models race
/// checks, inserts, sweeps and `forget` against a move half done.
pub(crate) const MOVE_CHUNK: usize = if cfg!(floodgate_loom) { 1 } else { 32 };

/// The kernel's page size where it is smallest, 4 KiB: the unit of
/// `TOUCH_PAGES`.
pub(super) const PAGE: usize = 4096;

/// How many pages of the next table one arrival zeroes before a move
/// (`InlineStore::prepare`): a page fault each, 2 to 2.3 µs on a 2-core
/// AMD EPYC guest (the kernel's own `MADV_POPULATE_WRITE` takes 1.3 µs a
/// page there, and an aligned huge page 4.5 ms). A table's growth faults
/// every page of every table it passes through, 2.5 pages per 100 new
/// clients at 24 bytes a slot, so these steps are 2.5 % of arrivals at
/// one page and a new client's p99 is one fault: 2.3 to 2.5 µs, against
/// 4.1 to 4.5 µs at two pages (1.2 % of arrivals, 4.3 µs each), and its
/// p99.9 4.6 to 5.0 µs against 7.2 to 17 µs. Eight read a p99.9 of 10
/// µs. Fewer steps of more pages would take the faults out of the p99
/// only by putting several in each of more than 0.1 % of arrivals. The
/// page is mapped by `MADV_POPULATE_WRITE` before it is written
/// (`populate`): on that guest a tenth dearer than the fault for one page
/// (2.2 µs against 2.0 to 2.1), on an Intel Xeon guest a fifth cheaper
/// (1.01 to 1.07 µs against 1.25 to 1.33), where it took a new client's
/// p99 and p99.9 under growth to about twice `governor`'s.
pub(super) const TOUCH_PAGES: usize = 1;

/// The smallest next table whose memory arrivals prepare (`prepare`):
/// 1 MiB, 256 pages.
pub(super) const PREPARE_FROM: usize = 1 << 20;

/// Slots not yet all zeroed (`Prepared`).
type RawSlots<K, C> = Box<[MaybeUninit<Slot<K, C>>]>;

impl<K, C> InlineStore<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Send + Sync + 'static,
{
    /// For an insert that found no room in `table`: begins `table`'s move
    /// if it is current and no one has (the insert then seals its way into
    /// the new table), or, if `table` is the one a move under way is
    /// filling, takes a step of that move, which must end before `table`
    /// can have a move of its own. A step taken here is not counted against
    /// the call's one step (`Work`): the reserve of room a move leaves for
    /// inserts (`begin_move`) is far more than the arrivals a move takes,
    /// and arrivals wait to take a step once it runs low
    /// (`room_to_spare`), so it happens only if a thread checked the spare
    /// room just before it ran out; the tests count that it never happens.
    #[cold]
    #[inline(never)]
    pub(super) fn make_room(&self, table: &Table<K, C>, policy: &impl Lifecycle<C>, guard: &Guard) {
        let Some(mut upkeep) = self.try_upkeep() else {
            // Another thread holds `upkeep` for one step (`upkeep`'s
            // progress): yield to it, and the caller probes again.
            crate::sync::spin();
            return;
        };
        let current = self.table.load(guard);
        match current.next(guard) {
            // Room freed meanwhile (claims given back after lost races), or
            // another thread began and ended a move: probe again.
            None if !std::ptr::eq(current, table)
                || table.claimed.load(Ordering::Relaxed) < table.room => {}
            None => self.begin_move(&mut upkeep, current),
            Some(next) if std::ptr::eq(next, table) => {
                #[cfg(test)]
                Work::forced();
                self.move_chunk(current, policy, guard);
            }
            // `table` is the current one, already being moved: the caller
            // probes again and seals its way on.
            Some(_) => {}
        }
    }

    /// The steps of upkeep an arrival takes, at most one of each kind: a
    /// chunk of the move under way (or, before a move, of preparing its
    /// table's memory), and a chunk of the sweep under way; and a step of
    /// giving outgrown memory back.
    pub(super) fn step(&self, policy: &impl Lifecycle<C>, guard: &Guard, work: &mut Work) {
        self.releases.step();
        let current = self.table.load(guard);
        let next = current.next(guard);
        let moving = !work.moved && next.is_some();
        let preparing = !work.moved && next.is_none() && self.preparing.load(Ordering::Relaxed);
        let sweeping = !work.swept && self.sweeping.load(Ordering::Relaxed);
        if !moving && !preparing && !sweeping {
            return;
        }
        // A step is skipped when another thread holds `upkeep` (it is
        // taking one), but for one: during a move, once the new table's
        // free room nears the steps left, every arrival takes a step,
        // waiting for the holder's if need be, so that the move ends
        // before inserts fill the room kept for them (`room_to_spare`).
        let upkeep = match self.try_upkeep() {
            Some(upkeep) => upkeep,
            None => match next {
                Some(next) if moving && !self.room_to_spare(current, next) => self.upkeep(),
                _ => {
                    // Another thread is taking a step: this arrival takes
                    // none of the move's (`help_move` tries no more).
                    work.moved |= moving;
                    return;
                }
            },
        };
        let mut upkeep = upkeep;
        let mut current = self.table.load(guard);
        if !work.moved && current.next(guard).is_some() {
            self.move_chunk(current, policy, guard);
            work.moved = true;
            current = self.table.load(guard);
        } else if preparing {
            if self.nearly_full(current) {
                self.prepare(&mut upkeep, current);
                work.moved = true;
            } else {
                // Asked by a claim of a table moved since (a late insert
                // into it): nothing to prepare yet for this one.
                self.preparing.store(false, Ordering::Relaxed);
            }
        }
        // A sweep walks a table no move is emptying; with a move still
        // under way, it waits for a later arrival.
        if !work.swept && upkeep.round.is_some() && current.next(guard).is_none() {
            self.sweep_chunk(&mut upkeep, current, policy);
            work.swept = true;
        }
    }

    /// Whether `table` (current, not being moved) is near enough its room
    /// that arrivals prepare the table its move will fill (`prepare`):
    /// one load (`Table::prepare_from`).
    #[inline]
    fn nearly_full(&self, table: &Table<K, C>) -> bool {
        table.claimed.load(Ordering::Relaxed) >= table.prepare_from
    }

    /// Whether the table a move is filling has room enough to spare that
    /// an arrival may insert there without taking a step of the move when
    /// another thread holds `upkeep`: more free claims than twice the
    /// steps left, and some. Below that, every arrival takes a step,
    /// waiting for the holder's if need be, and the steps left are done
    /// before the free claims run out (one claim an arrival, and only the
    /// arrivals that checked just before, one a thread, claim without a
    /// step). Relaxed reads: `cursor` only grows while a move runs, so a
    /// stale one counts more steps left, never fewer; a stale `claimed`
    /// is at most a few claims behind, which the slack covers.
    fn room_to_spare(&self, table: &Table<K, C>, next: &Table<K, C>) -> bool {
        let moved = table.cursor.load(Ordering::Relaxed);
        let steps_left = table.capacity().saturating_sub(moved) / MOVE_CHUNK + 1;
        let free = next
            .room
            .saturating_sub(next.claimed.load(Ordering::Relaxed));
        free > 2 * steps_left + 64
    }

    /// One step of preparing the memory of the table that `table`'s move
    /// will fill (under `upkeep`, before the move): allocates it at the
    /// first step, and maps (`populate`) and zeroes [`TOUCH_PAGES`] more
    /// pages of it at each.
    ///
    /// Why not take zeroed memory when the move begins, as smaller tables
    /// do: the allocator may hand back memory it had (glibc serves blocks
    /// of up to 32 MB from its heap once it has freed one that large), and
    /// then zeroes it all in that call, 5 to 8 ms here for a table of 24
    /// MB. And fresh pages cost more than their zeroing: a page first read
    /// is mapped to the shared zero page, and its first write then replaces
    /// that mapping, which the kernel must make every core the process
    /// runs on forget (an interrupt to each, a TLB shootdown); a move's
    /// probes read its new table before anything writes there. Measured,
    /// one thread creating 4 million clients while another checks known
    /// ones: a new client's check had a p99 of 20.5 µs and a p99.9 of
    /// 55 µs, against 3.0 µs and 4.0 µs with the pages written first.
    /// Written here, a step at a time before the move (`nearly_full`), each
    /// page is mapped once, by a write, with none.
    fn prepare(&self, upkeep: &mut Upkeep<K, C>, table: &Table<K, C>) {
        let capacity = self.next_capacity(table);
        if !upkeep
            .prepared
            .as_ref()
            .is_some_and(|prepared| prepared.serves(table, capacity))
        {
            // Memory prepared for an earlier table's move, or too small
            // for this one's (clients came faster than evictions, and the
            // move must now double the table), goes to the releases, and
            // is made again.
            upkeep.prepared = Some(Prepared::new(capacity, table, &self.releases));
        }
        let prepared = upkeep.prepared.as_mut().expect("made above");
        let per_step = (TOUCH_PAGES * PAGE / std::mem::size_of::<Slot<K, C>>()).max(1);
        prepared.zero(per_step);
        if prepared.is_whole() {
            self.preparing.store(false, Ordering::Relaxed);
        }
    }

    /// A step of `table`'s move for an insert that is going on into its
    /// `next`, if the call has taken none yet and `table` is still the one
    /// being moved.
    pub(super) fn help_move(
        &self,
        table: &Table<K, C>,
        policy: &impl Lifecycle<C>,
        guard: &Guard,
        work: &mut Work,
    ) {
        if work.moved || !std::ptr::eq(self.table.load(guard), table) {
            return;
        }
        // Waits for the holder's step only when `step` would.
        let _upkeep = match self.try_upkeep() {
            Some(upkeep) => upkeep,
            None => match table.next(guard) {
                Some(next) if !self.room_to_spare(table, next) => self.upkeep(),
                _ => return,
            },
        };
        // Checked again under `upkeep`: the move may have ended meanwhile.
        let current = self.table.load(guard);
        if std::ptr::eq(current, table) && current.next(guard).is_some() {
            self.move_chunk(current, policy, guard);
            work.moved = true;
        }
    }

    /// Begins the move of `table` (current, with no room and no move under
    /// way; under `upkeep`): builds the table its clients move into and
    /// publishes it as `table`'s `next`. No slot moves here: the steps do.
    ///
    /// The new table takes at once a claim for every client the move could
    /// place (`reserved`): `table`'s room less its `DEAD` slots, which only
    /// `upkeep`'s holders count, is at least every client it holds now or
    /// will (no claim in it can pass its room, and once `next` is set no
    /// insert claims there without racing a seal). What is left of the new
    /// table's room is for inserts while the move runs: at least half its
    /// room at the same size (`next_capacity` rebuilds at the same size only
    /// then), at least the old table's whole room when it doubles.
    ///
    /// The new table is the one arrivals prepared (`prepare`), if it has
    /// at least the size the move needs.
    fn begin_move(&self, upkeep: &mut Upkeep<K, C>, table: &Table<K, C>) {
        let reserved = table
            .room
            .saturating_sub(table.dead.load(Ordering::Relaxed));
        let capacity = self.next_capacity(table);
        let slots = match upkeep.prepared.take() {
            // Larger than the move needs now (evictions since the
            // preparing began brought the live clients below what doubles
            // the table) serves as well: more room, and none of the page
            // faults a table made here would take, a step at a time, in
            // the move's placements.
            Some(prepared) if prepared.serves(table, capacity) => {
                #[cfg(test)]
                if prepared.is_whole() {
                    Work::note(|visits| visits.prepared += 1);
                } else {
                    Work::note(|visits| visits.unprepared += 1);
                }
                prepared.into_slots()
            }
            _ => {
                #[cfg(test)]
                if capacity.saturating_mul(std::mem::size_of::<Slot<K, C>>()) >= PREPARE_FROM {
                    Work::note(|visits| visits.unprepared += 1);
                }
                Table::empty_slots(capacity)
            }
        };
        let staged = TableCell::stage(Table::with_slots(
            slots,
            self.grows(),
            reserved,
            table.generation + 1,
            &self.releases,
        ));
        // No claim of the new table will reach its `prepare_from` if the
        // reserve starts past it: its arrivals prepare from the start (once
        // the move ends: `step` prepares only with no move under way).
        self.preparing
            .store(reserved >= staged.prepare_from, Ordering::Relaxed);
        // Owned through `table.next` until it is published (`end_move`), or
        // freed by the store's drop if the store goes first.
        let next = Staged::into_raw(staged);
        // Release: a reader that loads it (Acquire) sees it built.
        table.next.store(next, Ordering::Release);
    }

    /// Moves the next [`MOVE_CHUNK`] slots of `table` (current, being
    /// moved; under `upkeep`) into its `next`, or all of a table of at
    /// most [`WHOLE_TABLE`](super::sweeps::WHOLE_TABLE), and ends the move
    /// if they were the last.
    ///
    /// A key's `Hash` and `Clone` run before its client's state is frozen,
    /// so a panic in either leaves the slot `FULL` and its state live, the
    /// slots before it moved or sealed and `cursor` at the step's start: a
    /// consistent store, whose next step visits this chunk again (a slot
    /// moved or sealed is passed over). Nothing else in a step can panic.
    pub(super) fn move_chunk(
        &self,
        table: &Table<K, C>,
        policy: &impl Lifecycle<C>,
        guard: &Guard,
    ) {
        let next = table.next(guard).expect("a move is under way");
        // A table a sweep visits whole in one step moves in one step too:
        // so on the tables where the two engines must agree (module docs,
        // "Sweeps in steps"), every move ends in the arrival that began it.
        let chunk = step_slots(table.capacity(), MOVE_CHUNK);
        // Relaxed: `cursor` is read and written only under `upkeep`.
        let start = table.cursor.load(Ordering::Relaxed);
        let end = (start + chunk).min(table.capacity());
        for slot in &table.slots[start..end] {
            #[cfg(test)]
            Work::visit(if chunk == MOVE_CHUNK { 2 } else { 0 });
            self.move_slot(slot, next, policy);
        }
        table.cursor.store(end, Ordering::Relaxed);
        if end == table.capacity() {
            self.end_move(table, next);
        }
    }

    /// Moves one slot of a table being moved into `next`: seals it if
    /// `EMPTY`, waits for it if `BUSY`, moves its client if `FULL`, and
    /// leaves `DEAD`, `MOVED` and `SEALED` as they are.
    fn move_slot(&self, slot: &Slot<K, C>, next: &Table<K, C>, policy: &impl Lifecycle<C>) {
        // Progress: each pass turns the slot to a state no other thread
        // changes again (SEALED, MOVED, DEAD), or waits for a writer that
        // publishes within a few of its own steps (`wait_for_writer`); an
        // EMPTY slot's CAS fails only on a claim, which moves it to BUSY,
        // or an insert's seal, which ends the loop.
        let mut tag = slot.tag.load(Ordering::Acquire);
        loop {
            match tag & STATE {
                EMPTY => match slot.tag.compare_exchange(
                    EMPTY,
                    SEALED,
                    Ordering::Relaxed,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return,
                    Err(now) => tag = now,
                },
                BUSY => {
                    self.wait_for_writer();
                    tag = slot.tag.load(Ordering::Acquire);
                }
                FULL => {
                    // SAFETY: the slot was FULL (Acquire) and this thread
                    // holds the table it is moving.
                    let entry = unsafe { slot.entry() };
                    // The client's place in `next`: the fingerprint keeps
                    // the hash's bits below the state's, every bit a probe
                    // of a table of fewer than 2^61 slots starts from, and
                    // `place` reads no other (`fingerprint`). No key is
                    // hashed again.
                    let hash = tag & !STATE;
                    // The caller's code first: if it unwinds, nothing of
                    // this slot has changed.
                    let key = entry.key.clone();
                    // Frozen by its retirement mark, one read-modify-write:
                    // a check's CAS lands before it (and is in what moves)
                    // or fails on it. The tag needs no claim of its own:
                    // once FULL, it changes only under `upkeep` (sweeps and
                    // `forget` take it too). A state retired already cannot
                    // happen (a removal retires a state and marks its slot
                    // DEAD within one hold of `upkeep`), but one must never
                    // move, so it would be left `DEAD`.
                    let settled = match policy.relocate(entry.client) {
                        Some(client) => {
                            next.place(hash, Entry { key, client });
                            MOVED
                        }
                        None => DEAD,
                    };
                    // Release: a reader that sees MOVED and goes on to
                    // `next` sees the client placed there.
                    slot.tag.store((tag & !STATE) | settled, Ordering::Release);
                    return;
                }
                // DEAD, MOVED and SEALED stay as they are: a removal, an
                // insert's seal or an earlier step (or one that unwound)
                // left them.
                _ => return,
            }
        }
    }

    /// Ends `table`'s move (every slot moved; under `upkeep`): gives back
    /// the claims reserved in `next` that no client used, then publishes
    /// `next` as the current table and hands `table` to the epoch collector.
    fn end_move(&self, table: &Table<K, C>, next: &Table<K, C>) {
        let placed = next.placed.load(Ordering::Relaxed);
        debug_assert!(placed <= next.reserved, "the reserve covers every client");
        // Given back before `next` is published, so that `stored` may read
        // low for a moment, never above what the table holds.
        next.claimed
            .fetch_sub(next.reserved.saturating_sub(placed), Ordering::Relaxed);
        let raw = table.next.load(Ordering::Relaxed);
        // SAFETY: `raw` came from `Staged::into_raw` in `begin_move` and is
        // published once, here: `table` stops being current, so no later
        // step of its move can reach this line.
        self.table.publish(unsafe { Staged::from_raw(raw) });
        StoreCounts::add(&self.counts.rebuilds, 1);
    }

    /// The size of the table that `table`'s live clients move into.
    fn next_capacity(&self, table: &Table<K, C>) -> usize {
        // Live clients, at most: every claim (inserts still writing, or
        // about to give a lost claim back, included) less the slots turned
        // DEAD, which only `upkeep`'s holder counts. A rebuild at the same
        // size must leave at least half the room free, or the next insert
        // would ask for another at once.
        let live = table.live();
        // A capped store's table stops doubling once it holds the cap
        // (`largest`; a presized one holds it from the start): its rebuilds
        // at that size leave an eighth of the cap free. A table that could
        // not hold its live clients again is doubled even when capped (the
        // sizing makes that never happen).
        let grows = table.capacity() < self.largest;
        if (grows && live * 2 > table.room) || live >= table.room {
            table.capacity() * 2
        } else {
            table.capacity()
        }
    }
}

/// The memory of a table made ahead of a move, zeroed a few pages at a
/// time (`InlineStore::prepare`).
pub(super) struct Prepared<K, C> {
    /// Zeroed up to `zeroed`; the rest not yet.
    slots: Option<RawSlots<K, C>>,
    zeroed: usize,
    /// The generation of the table it is to replace.
    replaces: u64,
    /// Where the memory goes if it is dropped unused.
    releases: Arc<Releases>,
}

impl<K, C> Prepared<K, C> {
    /// `capacity` slots of memory, none zeroed yet, for `table`'s move.
    fn new(capacity: usize, table: &Table<K, C>, releases: &Arc<Releases>) -> Self {
        Self {
            slots: Some(Box::new_uninit_slice(capacity)),
            zeroed: 0,
            replaces: table.generation,
            releases: Arc::clone(releases),
        }
    }

    fn slots(&mut self) -> &mut [MaybeUninit<Slot<K, C>>] {
        self.slots
            .as_deref_mut()
            .expect("taken only by `into_slots`")
    }

    /// Whether it can be the next table of `table`, which needs
    /// `capacity` slots: it was made for `table`'s move, with at least
    /// that many.
    fn serves(&self, table: &Table<K, C>, capacity: usize) -> bool {
        self.replaces == table.generation
            && self
                .slots
                .as_ref()
                .is_some_and(|slots| slots.len() >= capacity)
    }

    /// Whether every slot is zeroed.
    fn is_whole(&self) -> bool {
        self.slots.as_ref().map(|slots| slots.len()) == Some(self.zeroed)
    }

    /// Maps the pages under the next `count` slots (all that are left, at
    /// most) that are not mapped yet (`populate`), and zeroes the slots:
    /// the memory may be the allocator's again, not the kernel's zeros.
    fn zero(&mut self, count: usize) {
        let from = self.zeroed;
        let slots = self.slots();
        let to = from.saturating_add(count).min(slots.len());
        let bytes = slots[from..to].as_mut_ptr_range();
        populate(bytes.start.cast::<u8>(), bytes.end.cast::<u8>());
        // SAFETY: `from..to` is inside the slice; a `MaybeUninit` may hold
        // any bytes, zeros too.
        unsafe { std::ptr::write_bytes(slots[from..to].as_mut_ptr(), 0, to - from) };
        self.zeroed = to;
    }

    /// The slots, all `EMPTY`: what is not zeroed yet is zeroed here (none,
    /// when the arrivals before the move prepared it all).
    fn into_slots(mut self) -> Box<[Slot<K, C>]> {
        self.zero(usize::MAX);
        let slots = self.slots.take().expect("taken once");
        // SAFETY: every slot is zeroed (above), and a slot of zero bytes is
        // a valid `EMPTY` slot (`Table::empty_slots`). Never under loom,
        // whose tag is not a plain word (`InlineStore::nearly_full`).
        unsafe { slots.assume_init() }
    }
}

/// Maps the pages under `start..end` that are not mapped yet, as writes
/// would, with one `madvise(MADV_POPULATE_WRITE)` (Linux 5.14 and later):
/// the kernel zeroes and maps them without the page-fault exception each
/// first write would take. On an Intel Xeon guest a page took 1.01 to
/// 1.07 µs this way against 1.25 to 1.33 µs by its first write
/// (`benches/tail.md`, "Pages mapped by madvise"). The range is widened
/// to whole pages; a page already mapped is left as it is, and one with
/// other memory on it (the block's first or last) keeps its contents:
/// populating changes no byte. An error (an older kernel, a page outside
/// the mapping) leaves the pages to the writes that follow.
#[cfg(all(target_os = "linux", not(floodgate_loom)))]
pub(super) fn populate(start: *mut u8, end: *mut u8) {
    let page = rustix::param::page_size();
    let first = start as usize / page * page;
    let last = (end as usize).next_multiple_of(page);
    if first < last {
        // SAFETY: `MADV_POPULATE_WRITE` writes nothing the program can
        // read (madvise(2): it faults the pages in "as if manually writing
        // to each page", without the access), and the pages are the
        // prepared block's, which this thread owns, or share a page with
        // it, whose contents stay. Nothing is freed or remapped.
        let _ = unsafe {
            rustix::mm::madvise(
                first as *mut std::ffi::c_void,
                last - first,
                rustix::mm::Advice::LinuxPopulateWrite,
            )
        };
    }
}

/// Elsewhere, the writes map the pages.
#[cfg(not(all(target_os = "linux", not(floodgate_loom))))]
pub(super) fn populate(_: *mut u8, _: *mut u8) {}

impl<K, C> Drop for Prepared<K, C> {
    /// Memory prepared and not used goes to the releases, as a table's.
    fn drop(&mut self) {
        let Some(slots) = self.slots.take() else {
            return;
        };
        let layout = Layout::for_value::<[MaybeUninit<Slot<K, C>>]>(&slots);
        if layout.size() > 0 {
            let start = NonNull::from(Box::leak(slots)).cast::<u8>();
            // SAFETY: allocated by the box with the global allocator and
            // this layout; nothing refers to it, and `leak` keeps the box
            // from freeing it.
            unsafe { self.releases.free(start, layout) };
        }
    }
}
