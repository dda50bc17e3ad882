//! Slots and probes: the tags, a slot's entry, and a table of slots with
//! its claims and probes (the module docs' "Slots").

use std::alloc::Layout;
use std::borrow::Borrow;
use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::panic::AssertUnwindSafe;
use std::ptr::NonNull;
use std::sync::Arc;

use super::growth::{PAGE, PREPARE_FROM, TOUCH_PAGES};
use super::Alone;
use crate::store::release::Releases;
use crate::sync::{AtomicPtr, AtomicU64, AtomicUsize, Guard, Ordering};

/// Where the slot's state starts in its tag: the top 3 bits (module docs,
/// "Slots"), so that the fingerprint below them keeps the hash's low bits,
/// where every probe starts.
const STATE_SHIFT: u32 = 61;
/// The tag's top bits: the slot's state.
pub(super) const STATE: u64 = 0b111 << STATE_SHIFT;
pub(super) const EMPTY: u64 = 0;
pub(super) const BUSY: u64 = 1 << STATE_SHIFT;
pub(super) const FULL: u64 = 2 << STATE_SHIFT;
pub(super) const DEAD: u64 = 3 << STATE_SHIFT;
pub(super) const MOVED: u64 = 4 << STATE_SHIFT;
pub(super) const SEALED: u64 = 5 << STATE_SHIFT;

/// The tag bits that identify a key: its hash, top bits cleared. A probe
/// starts at the hash's low bits (`hash & mask`), which the fingerprint
/// keeps whole for any table of fewer than 2^61 slots, so a slot's tag
/// alone says where its client goes in a larger table: a move places its
/// clients by their fingerprints and hashes no key (`move_slot`).
#[inline]
pub(super) fn fingerprint(hash: u64) -> u64 {
    hash & !STATE
}

/// A growing table of at most this many bytes (16,384 slots of 24 bytes)
/// takes claims up to half its slots instead of 7/8 (`Table::room_for`).
const SPARSE_BYTES: usize = 1 << 19;

/// A slot, and the table it is in.
pub(super) type InTable<'g, K, C> = (&'g Table<K, C>, &'g Slot<K, C>);

/// A client's key and state, on their way into a slot.
pub(super) struct Entry<K, C> {
    pub(super) key: K,
    pub(super) client: C,
}

/// A slot's entry, as readers see it.
pub(super) struct EntryRef<'s, K, C> {
    pub(super) key: &'s K,
    pub(super) client: &'s C,
}

/// The key and the client are two fields of the slot, not one struct, so
/// that the compiler packs the tag, the key and the origin into the
/// padding a 16-byte state needs: 48 bytes for a `u64` key and a `u128`
/// word, not 64.
pub(super) struct Slot<K, C> {
    pub(super) tag: AtomicU64,
    key: UnsafeCell<MaybeUninit<K>>,
    client: UnsafeCell<MaybeUninit<C>>,
}

impl<K, C> Slot<K, C> {
    /// The entry of a slot whose tag was loaded (Acquire) as `FULL`,
    /// `DEAD` or `MOVED`.
    ///
    /// # Safety
    ///
    /// The caller saw one of those states with an Acquire load of this
    /// slot's tag (or set it itself), and holds the table: the entry was
    /// written before the Release store of `FULL`, and is never written
    /// again nor dropped while the table lives.
    #[inline]
    pub(super) unsafe fn entry(&self) -> EntryRef<'_, K, C> {
        // SAFETY: as the caller promised: initialized, published, and from
        // then on shared read-only.
        unsafe {
            EntryRef {
                key: (*self.key.get()).assume_init_ref(),
                client: (*self.client.get()).assume_init_ref(),
            }
        }
    }

    /// Writes the entry of a slot this thread claimed.
    ///
    /// # Safety
    ///
    /// The caller turned the slot from `EMPTY` to `BUSY` and has not yet
    /// published it: it is the only thread that touches the entry.
    #[inline]
    pub(super) unsafe fn write(&self, entry: Entry<K, C>) {
        // SAFETY: as the caller promised: no other access to the cells.
        unsafe {
            (*self.key.get()).write(entry.key);
            (*self.client.get()).write(entry.client);
        }
    }
}

/// One table: a power of two of slots, and where its clients went if it was
/// outgrown.
pub(crate) struct Table<K, C> {
    pub(super) slots: Box<[Slot<K, C>]>,
    mask: usize,
    /// Slots claimed so far (every state but `EMPTY` and `SEALED`), and,
    /// while a move fills the table, its reserve for the clients it places
    /// (`reserved`): set before the table is published, then moved by
    /// read-modify-writes. Relaxed: it decides when to move, never an
    /// answer.
    /// Alone on its lines: every insert writes it, and every arrival reads
    /// the fields beside it (`next`, `prepare_from`).
    pub(super) claimed: Alone<AtomicUsize>,
    /// Claims stop here (`room_for`): 7/8 of the slots, or half.
    pub(super) room: usize,
    /// Slots turned `DEAD`: counted by removals, which run under `upkeep`.
    /// Relaxed, as `claimed`.
    pub(super) dead: AtomicUsize,
    /// The table this one is being emptied into; null until its move
    /// begins, then set once. Release/Acquire: a reader that follows it
    /// sees it built.
    pub(super) next: AtomicPtr<Table<K, C>>,
    /// While this table is being moved: the first slot no step has moved
    /// yet. Written only under `upkeep`, whose lock orders its writes and
    /// the reads there: Relaxed (`room_to_spare` reads it as a hint). Alone
    /// on its lines, as `claimed`, and so is `placed`: each step writes
    /// them, and every arrival reads the fields beside them.
    pub(super) cursor: Alone<AtomicUsize>,
    /// In a table being filled by a move: the claims taken for the clients
    /// the move will place, all at once when it began (`claimed` starts
    /// there), so that inserts racing the move can never take the room the
    /// move needs. What the move did not use is given back when it ends.
    pub(super) reserved: usize,
    /// Clients the move placed here so far. Under `upkeep`, as `cursor`.
    pub(super) placed: Alone<AtomicUsize>,
    /// Counts the tables of one store, from 0: a sweep under way knows by
    /// it whether the table it walks was replaced (`Round`).
    pub(super) generation: u64,
    /// Where the slots' memory goes when the table is dropped: given back
    /// in steps by the store's arrivals (`store::release`).
    releases: Arc<Releases>,
    /// From this many claims on, arrivals prepare the memory of the table
    /// this one's move will fill (`InlineStore::prepare`): the room less
    /// four times the steps that takes for a table twice this size, and
    /// some. Every arrival that finds `upkeep` free takes a step, and under
    /// contention at least one in each few does, so the steps are done
    /// before the claims run out. `usize::MAX` (never) for a next table
    /// below [`PREPARE_FROM`], whose pages are few and which moves in one
    /// step, and under loom, whose tables are a few slots of no pages.
    pub(super) prepare_from: usize,
}

// SAFETY: a table owns its keys and states and hands out only shared
// references to them, to any thread; it is what a `Vec<(K, C)>` behind an
// `Arc` would be, so it needs what that needs.
unsafe impl<K: Send + Sync, C: Send + Sync> Send for Table<K, C> {}
// SAFETY: as above; the entries' one-time writes are published through the
// tags (module docs, "Slots").
unsafe impl<K: Send + Sync, C: Send + Sync> Sync for Table<K, C> {}

/// What an attempt to write an entry into a vacant slot came to.
pub(super) enum Written {
    Yes,
    /// The table's room is used up.
    NoRoom,
    /// Another thread took the slot (or a move sealed it) first.
    Lost,
}

/// Where a look-up that found no client for its key stopped: the first
/// `EMPTY` slot of the key's path in the table of `generation` (which no
/// other table of the store shares). An insert of that key into that same
/// table may begin its probe there (`InlineStore::insert` says why that
/// finds what a probe from the path's start would), so that a new client's
/// first call walks its path once, not twice.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Vacancy {
    generation: u64,
    index: usize,
}

/// Where a probe ended.
pub(super) enum Probe<'t, K, C> {
    /// The key's slot (`FULL`).
    Found(&'t Slot<K, C>),
    /// Not in this table: the first `EMPTY` slot on its path.
    Vacant(usize),
    /// Not in this table: look in `next` (which is null only when every
    /// slot was probed and the table is not being rebuilt).
    Onward,
    /// A slot with this key's fingerprint is being written: wait for its
    /// writer, then probe again.
    Busy,
}

impl<K, C> Table<K, C> {
    /// A table of `capacity` slots, all `EMPTY`; `sparse` for a store that
    /// grows (`room_for`); `reserved` claims taken for a move into it.
    pub(super) fn new(
        capacity: usize,
        sparse: bool,
        reserved: usize,
        generation: u64,
        releases: &Arc<Releases>,
    ) -> Self {
        Self::with_slots(
            Self::empty_slots(capacity),
            sparse,
            reserved,
            generation,
            releases,
        )
    }

    /// A table of `slots`, all `EMPTY` (as `new`).
    pub(super) fn with_slots(
        slots: Box<[Slot<K, C>]>,
        sparse: bool,
        reserved: usize,
        generation: u64,
        releases: &Arc<Releases>,
    ) -> Self {
        let capacity = slots.len();
        debug_assert!(capacity.is_power_of_two() && capacity >= 2);
        let room = Self::room_for(capacity, sparse);
        let next_bytes = capacity
            .saturating_mul(2)
            .saturating_mul(std::mem::size_of::<Slot<K, C>>());
        let prepare_from = if cfg!(floodgate_loom) || next_bytes < PREPARE_FROM {
            usize::MAX
        } else {
            let steps = next_bytes / (PAGE * TOUCH_PAGES) + 1;
            room.saturating_sub(4 * steps + 64)
        };
        Self {
            slots,
            mask: capacity - 1,
            claimed: Alone(AtomicUsize::new(reserved)),
            dead: AtomicUsize::new(0),
            room,
            next: AtomicPtr::new(std::ptr::null_mut()),
            cursor: Alone(AtomicUsize::new(0)),
            reserved,
            placed: Alone(AtomicUsize::new(0)),
            generation,
            releases: Arc::clone(releases),
            prepare_from,
        }
    }

    /// `capacity` `EMPTY` slots, as zeroed memory: the first table, a
    /// small table's move, and a large one's when the arrivals before it
    /// prepared none of the right size (`InlineStore::prepare` says why
    /// they do). A small table (below [`PREPARE_FROM`]) is zeroed here, its
    /// pages written in order, so that no read maps them to the kernel's
    /// zero page first; a large one is left to the allocator's zeroing,
    /// page by page as it is touched, so that no one call zeroes it.
    #[cfg(not(floodgate_loom))]
    pub(super) fn empty_slots(capacity: usize) -> Box<[Slot<K, C>]> {
        let layout = Layout::array::<Slot<K, C>>(capacity).expect("a table fits in memory");
        // SAFETY: the layout is not zero-sized (at least two slots, each
        // with a tag word); a small table's bytes are all zeroed before
        // the box below is made of them.
        let start = unsafe {
            if layout.size() < PREPARE_FROM {
                let start = std::alloc::alloc(layout);
                if !start.is_null() {
                    std::ptr::write_bytes(start, 0, layout.size());
                }
                start
            } else {
                std::alloc::alloc_zeroed(layout)
            }
        }
        .cast::<Slot<K, C>>();
        if start.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: the global allocator gave `capacity` slots' worth of
        // zeroed memory with the layout a boxed slice of them uses, and a
        // slot of zero bytes is a valid `EMPTY` slot: its tag is an
        // `AtomicU64` of 0 (`EMPTY`, the same bytes as a `u64` 0), and its
        // key and client are `MaybeUninit`, valid whatever their bytes.
        unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(start, capacity)) }
    }

    /// Under loom the tag is loom's atomic, which zeroed bytes are not.
    #[cfg(floodgate_loom)]
    pub(super) fn empty_slots(capacity: usize) -> Box<[Slot<K, C>]> {
        (0..capacity)
            .map(|_| Slot {
                tag: AtomicU64::new(EMPTY),
                key: UnsafeCell::new(MaybeUninit::uninit()),
                client: UnsafeCell::new(MaybeUninit::uninit()),
            })
            .collect()
    }

    /// Where claims stop in a table of `capacity` slots: 7/8 of them, so a
    /// probe always ends; half of them in a small table of a store that
    /// grows (`sparse`, at most [`SPARSE_BYTES`]), whose probes are then
    /// shorter — a known client's check stays in its first slot more often —
    /// for at most that many bytes more. A capped store's table is sized
    /// for its cap at 7/8 and keeps that.
    pub(super) fn room_for(capacity: usize, sparse: bool) -> usize {
        let small = capacity.saturating_mul(std::mem::size_of::<Slot<K, C>>()) <= SPARSE_BYTES;
        let room = if sparse && small {
            capacity / 2
        } else {
            capacity - capacity / 8
        };
        room.min(capacity - 1)
    }

    pub(super) fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Looks `key` up along its path.
    ///
    /// The common case first: a known client's key in the first slot of
    /// its path, `FULL`, is one compare of the tag and one of the key. Any
    /// other first slot goes to the full walk, which decides it on the tag
    /// already loaded.
    #[inline(always)]
    pub(super) fn probe<Q>(&self, key: &Q, hash: u64) -> Probe<'_, K, C>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let print = fingerprint(hash);
        // The mask from the slice's own length (a power of two), so that
        // the index is in bounds by construction and needs no check.
        let index = hash as usize & (self.slots.len() - 1);
        let slot = &self.slots[index];
        let tag = slot.tag.load(Ordering::Acquire);
        if tag == print | FULL
            // SAFETY: the tag was just loaded with Acquire as FULL; the
            // caller holds the table.
            && unsafe { slot.entry() }.key.borrow() == key
        {
            return Probe::Found(slot);
        }
        self.walk(key, print, index, tag)
    }

    /// A vacancy this table's probe found, to begin a later probe at.
    pub(super) fn vacancy(&self, index: usize) -> Vacancy {
        Vacancy {
            generation: self.generation,
            index,
        }
    }

    /// Looks `key` up along its path from `vacancy`, where an earlier probe
    /// of this table stopped (`Vacancy`), if it was this table's; else
    /// from its start, as [`probe`](Self::probe).
    #[inline]
    pub(super) fn probe_from<Q>(&self, key: &Q, hash: u64, vacancy: Vacancy) -> Probe<'_, K, C>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        if vacancy.generation != self.generation {
            return self.probe(key, hash);
        }
        // Masked, as `probe`'s index: in bounds by construction.
        let index = vacancy.index & (self.slots.len() - 1);
        let tag = self.slots[index].tag.load(Ordering::Acquire);
        self.walk(key, fingerprint(hash), index, tag)
    }

    /// The full probe from `index`, the first slot of `key`'s path (or the
    /// vacancy an earlier probe stopped at: `probe_from`), whose tag the
    /// caller loaded already (`tag`; the slots after it are loaded here):
    /// every state decided as the module docs say. One load per
    /// slot visited, as if there were no fast path.
    #[inline]
    fn walk<Q>(&self, key: &Q, print: u64, mut index: usize, mut tag: u64) -> Probe<'_, K, C>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let mask = self.slots.len() - 1;
        let mut visited = 0;
        // Progress: one slot a pass, at most every slot once.
        loop {
            let slot = &self.slots[index];
            'slot: {
                let state = tag & STATE;
                if tag & !STATE != print {
                    // Another key's slot (or an empty or sealed one: their
                    // fingerprint bits are 0, and a hash whose fingerprint
                    // is 0 is the one case that reads on below).
                    match state {
                        EMPTY => return Probe::Vacant(index),
                        SEALED => return Probe::Onward,
                        _ => break 'slot,
                    }
                }
                match state {
                    EMPTY => return Probe::Vacant(index),
                    SEALED => return Probe::Onward,
                    // Perhaps this very key, being written: the caller waits
                    // for the writer and probes again.
                    BUSY => return Probe::Busy,
                    _ => {}
                }
                // SAFETY: `tag` was loaded with Acquire and is FULL, DEAD
                // or MOVED; the caller holds the table.
                if unsafe { slot.entry() }.key.borrow() != key {
                    break 'slot;
                }
                match state {
                    FULL => return Probe::Found(slot),
                    MOVED => return Probe::Onward,
                    // An evicted copy: the key may be further on.
                    _ => break 'slot,
                }
            }
            visited += 1;
            if visited > mask {
                return Probe::Onward;
            }
            index = (index + 1) & mask;
            tag = self.slots[index].tag.load(Ordering::Acquire);
        }
    }

    /// The table this one is being emptied into, if its move began.
    #[inline]
    pub(super) fn next<'g>(&self, _: &'g Guard) -> Option<&'g Table<K, C>> {
        let next = self.next.load(Ordering::Acquire);
        // SAFETY: `next` is set once in a table's life (`begin_move`), to a
        // table that is staged and then published as current by the step
        // that ends the move (`end_move`); it is retired only by the end of
        // a later move, after this one, so the collector frees it only once
        // the guard that reached this table is gone. A staged table never
        // published (a move under way when the store goes) is freed only by
        // the store's drop.
        (!next.is_null()).then(|| unsafe { &*next })
    }

    /// The clients in this table, at most: its claims less its `DEAD`
    /// slots, read in that order so that a removal between the two reads
    /// can only lower the answer, never a claim raise it past what the
    /// table held at the first. Exact when no call is in flight.
    pub(super) fn live(&self) -> usize {
        let claimed = self.claimed.load(Ordering::Relaxed);
        claimed.saturating_sub(self.dead.load(Ordering::Relaxed))
    }

    /// Takes one claim under `room`: the claims taken before it, or `None`
    /// if there is none left.
    pub(super) fn claim(&self) -> Option<usize> {
        // Progress: `fetch_update` retries its CAS only after another
        // thread's claim or give-back moved the count.
        self.claimed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |claimed| {
                (claimed < self.room).then_some(claimed + 1)
            })
            .ok()
    }

    /// Writes `entry` into the first `EMPTY` slot on `hash`'s path: a
    /// move's placing of a client that cannot be in this table yet (module
    /// docs, "Growing in steps"). Inserts fill the same table meanwhile, so
    /// a slot is claimed by CAS, as an insert claims it; the claim itself
    /// was taken when the move began (`reserved`).
    pub(super) fn place(&self, hash: u64, entry: Entry<K, C>) {
        let print = fingerprint(hash);
        let mut index = hash as usize & self.mask;
        // Progress: every pass but the last skips a slot that is not
        // empty, or one whose CAS another thread's claim won; each slot is
        // passed at most once, and one stays empty (claims, the reserved
        // ones included, stop at `room`, below the table's size), so the
        // walk ends within one lap.
        loop {
            let slot = &self.slots[index];
            // Acquire on success: as `InlineStore::write`'s claim (the
            // entry goes out with this thread's own Release of FULL, so
            // Relaxed would do; kept alike).
            if slot.tag.load(Ordering::Relaxed) == EMPTY
                && slot
                    .tag
                    .compare_exchange(EMPTY, print | BUSY, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                // SAFETY: this thread claimed the slot (EMPTY → BUSY) and
                // is its only writer; readers wait while it is BUSY.
                unsafe { slot.write(entry) };
                // Release: publishes the entry to every reader that loads
                // this tag with Acquire.
                slot.tag.store(print | FULL, Ordering::Release);
                // Under `upkeep`, which orders the steps that place: a
                // load and a store (Relaxed), counted as the client is
                // placed, so a step that unwinds and is done again counts
                // each client once.
                let placed = self.placed.load(Ordering::Relaxed);
                self.placed.store(placed + 1, Ordering::Relaxed);
                return;
            }
            index = (index + 1) & self.mask;
        }
    }
}

impl<K, C> Drop for Table<K, C> {
    /// Drops every entry, even past a key's `Drop` that panics: the first
    /// panic is resumed once the rest are dropped (a second one, during
    /// that unwinding, would abort), so one bad key leaks no other. Then
    /// hands the slots' memory to the store's releases.
    fn drop(&mut self) {
        let panicked = self.drop_entries();
        let slots = std::mem::take(&mut self.slots);
        let layout = Layout::for_value::<[Slot<K, C>]>(&slots);
        if layout.size() > 0 {
            let start = NonNull::from(Box::leak(slots)).cast::<u8>();
            // SAFETY: the box allocated the slots with the global
            // allocator and this layout (`Layout::for_value` of the slice
            // is the one its allocation used), and the table is being
            // dropped: nothing refers to them any more, and `leak` keeps
            // the box from freeing them.
            unsafe { self.releases.free(start, layout) };
        }
        if let Some(panic) = panicked {
            std::panic::resume_unwind(panic);
        }
    }
}

impl<K, C> Table<K, C> {
    /// Drops the entries of every slot that holds one; the first panic of
    /// a key's or state's `Drop`, if any, for the caller to resume.
    fn drop_entries(&mut self) -> Option<Box<dyn std::any::Any + Send>> {
        // Keys and states with nothing to drop (a `u64` key, a one-word
        // state) leave nothing to visit: an outgrown table of millions of
        // slots is not walked.
        if !std::mem::needs_drop::<K>() && !std::mem::needs_drop::<C>() {
            return None;
        }
        let mut panicked = None;
        for slot in self.slots.iter_mut() {
            // Relaxed: `&mut self`, so every write to the tag happened
            // before this drop began.
            let state = slot.tag.load(Ordering::Relaxed) & STATE;
            if matches!(state, FULL | DEAD | MOVED) {
                let key = slot.key.get_mut();
                let client = slot.client.get_mut();
                for part in [
                    // SAFETY: those states hold a written entry, dropped
                    // once, here: moving a client clones its key and
                    // continues its state in a new value, so the old entry
                    // is still its own.
                    std::panic::catch_unwind(AssertUnwindSafe(|| unsafe {
                        key.assume_init_drop()
                    })),
                    // SAFETY: as above.
                    std::panic::catch_unwind(AssertUnwindSafe(|| unsafe {
                        client.assume_init_drop()
                    })),
                ] {
                    if let Err(panic) = part {
                        panicked.get_or_insert(panic);
                    }
                }
            }
        }
        panicked
    }
}
