//! The limiter's keyed store: an open-addressing table whose slots hold
//! each client's key and state inline, so that a known client's check reads
//! one slot — a tag, the key beside it, the state words after them, 24
//! bytes for a `u64` key and a one-word policy (which keeps no origin,
//! `Policy::Origin`), 48 for a two-word one with its origin — with no lock
//! and no pointer to follow. (The slots are not aligned to cache lines, so
//! some span two adjacent lines.)
//!
//! # Slots
//!
//! A slot is a tag word and an entry (the key and the [`Client`]). The tag
//! says what the entry is and carries the key's fingerprint, so a probe
//! compares keys only where fingerprints match (a long key, which lives
//! behind a pointer, is read only then):
//!
//! ```text
//!  63                                                          3 2     0
//! +-------------------------------------------------------------+-------+
//! |  fingerprint: the key's hash with its low 3 bits cleared    | state |
//! +-------------------------------------------------------------+-------+
//! ```
//!
//! A slot only moves forward through its states, never back to `EMPTY`, so
//! a key in a table stays where it was put, and an entry, once written, is
//! never written again while the table lives:
//!
//! ```text
//! EMPTY ──claim──▶ BUSY ──entry written──▶ FULL ──evicted, forgotten──▶ DEAD
//!   │                                        │
//!   └──resize──▶ SEALED                      └──resize──▶ MOVED
//! ```
//!
//! * `EMPTY` (tag 0, the zeroed slot) ends a probe: the key is not in the
//!   table, and this is where it would go. A claim is one CAS to
//!   `BUSY | fingerprint`; the claimer writes the entry and publishes it
//!   with a Release store of `FULL | fingerprint`, which every reader of the
//!   entry loads with Acquire first.
//! * `BUSY` with another key's fingerprint is skipped; with this key's, the
//!   probe waits for the entry (a first insert racing a lookup of the same
//!   key: one cold path waits on another, never a known client's check).
//! * `DEAD` slots keep their entry (it is freed with the table) and are
//!   probed past: a client that was evicted and comes back gets a new slot
//!   further along its path.
//! * The linear probe's invariant: when a key's slot was claimed, every slot
//!   before it on its path was already claimed, and claimed slots never
//!   become `EMPTY` or `SEALED`. So a probe that meets `EMPTY` or `SEALED`
//!   before the key knows it is not in this table, and never will be.
//! * Once `FULL`, a tag changes only under `upkeep` (module docs below): by
//!   the one rebuild, sweep or `forget` that holds it. So each of those
//!   changes it with a plain store, never a CAS.
//!
//! # Growing without stopping
//!
//! A table takes claims up to 7/8 of its slots (`room`; half in a growing
//! store's tables of at most `SPARSE_BYTES`, whose probes are then shorter
//! for little memory). An insert that finds no room has the table rebuilt:
//! twice the size if its live clients fill more than half the room, the
//! same size otherwise (a flood of ids that were evicted leaves `DEAD`
//! slots behind; the rebuild drops them). A capped store is sized for its
//! cap once and is only ever rebuilt at that size. Rebuilds (and sweeps,
//! and `forget`) run one at a time, under `upkeep`; checks go on
//! meanwhile, and so do inserts into the old table's empty slots while it
//! has room:
//!
//! 1. The new table is built and published as the old one's `next`.
//! 2. Every slot of the old table, in order: an `EMPTY` one is `SEALED`
//!    (inserts that reach it see the move through, then go on to `next`);
//!    a `BUSY` one is waited for; a `FULL` one has its key hashed and
//!    cloned, then its state frozen by the policy's retirement mark and
//!    continued in `next` ([`Lifecycle::relocate`]), and becomes `MOVED`.
//!    The move is the only writer of `next`'s empty slots, so it places
//!    clients there with plain stores.
//! 3. `next` becomes the current table; the old one goes to the epoch
//!    collector (`store::epoch`) and is freed once no thread holds a pin
//!    taken before.
//!
//! No admission is lost or counted twice: a check's CAS on the old state
//! either lands before the freeze, and is in what moves, or fails on the
//! mark; the check then looks again, waits for `MOVED` and decides on the
//! state in `next`. A probe goes on to `next` only on `MOVED` for its key
//! (the key is there already) or on `SEALED` before its key (it was never
//! in the old table), and an insert claims a slot in `next` only once the
//! move is over, so it can never create a client that is still waiting to
//! move.
//!
//! # Panics, and no wait without an end
//!
//! The only code of the caller's that a store call runs is the key's
//! `Hash`, `Eq`, `Clone` and `Drop`, and none of it runs between two steps
//! that another thread waits between: a `BUSY` slot's claim and its `FULL`
//! (the key was made before the claim), a move's freeze of a state and its
//! `MOVED` (the key is hashed and cloned before the freeze), a sweep's
//! retirement of a state and its `DEAD`. So each of those waits ends within
//! a few steps of the thread it waits for, which nothing can stop, and a
//! panic leaves no slot in between. A move that unwinds (a `Hash` or
//! `Clone` that panicked) leaves `next` set and the slots before the
//! panicking one `SEALED` or `MOVED`: every holder of `upkeep` takes the
//! move up where it stopped before it does anything else
//! (`lock_upkeep`), into the same `next`, and so does an insert that needs
//! `next`. No client is lost (its slot is `FULL` in the old table or
//! placed in `next`, never neither) and none is counted twice (a slot is
//! moved at most once: `MOVED` is final). Each wait and retry loop says
//! beside it which step of which thread ends it.
//!
//! # Removing clients
//!
//! Whoever turns a slot `DEAD` removed the client, and only they move the
//! counts below. A sweep retires an idle state first (one CAS, which fails
//! if a decision was stored since it was judged idle) and then marks the
//! slot; `forget` marks the slot first and then retires the state, so a
//! check that found the slot before either is decided on the old state or
//! fails on the mark and looks again. A check that meets a retired state
//! in a slot still `FULL` (a sweep between its CAS and its mark, a move
//! between its freeze and `MOVED`) yields until the slot changes
//! (`settle`).
//!
//! # Orderings
//!
//! What carries data between threads is the tag: an entry is written before
//! the Release store of `FULL` and read only after an Acquire load that saw
//! `FULL`, `DEAD` or `MOVED` (or by the thread that wrote it). The stores of
//! `DEAD` and `MOVED` are Release too, each after its writer's own Acquire
//! load of `FULL`, so a reader that loads them sees the entry as well. A
//! rebuild publishes the new table through `next` (Release store, Acquire
//! load) before any probe can reach it, and each moved client through the
//! new slot's `FULL` and then the old slot's `MOVED`, so a probe that
//! follows `MOVED` sees the client placed. The CASes on tags are weaker
//! where nothing is read on their strength: claiming an empty slot and
//! sealing one publish no entry (the claimer's entry goes out with its own
//! `FULL`). The counters (`claimed`, `dead`, `tracked`) are Relaxed: each
//! publishes nothing, is moved by read-modify-writes (and `claimed`
//! counted by the move that fills its table, before it is published), and
//! decides when to rebuild, whether there is a place or what `stored`
//! reads, never what a decision answers. The states' own words keep their orderings (`cell`).
//!
//! # Sweeps and time, the cap
//!
//! As in the tiers' store (`store::keyed`, same sections): `swept` is the
//! earliest origin a new client may get; `tracked` counts places under the
//! cap, taken before an insert and given back by whoever removes a client;
//! `stored` counts what the table did: its claimed slots less its `DEAD`
//! ones (a slot is claimed after its insert took a place and before it is
//! published `FULL`; it is counted `DEAD` before the place is given back),
//! so that `stored <= tracked <= cap` and a watcher can see a broken cap. A
//! store without a cap takes no places: `stored` alone counts its clients,
//! and an insert moves no counter but its table's claims.

use std::borrow::Borrow;
use std::cell::UnsafeCell;
use std::hash::{BuildHasher, Hash, Hasher};
use std::mem::MaybeUninit;
use std::panic::AssertUnwindSafe;

use crate::bounds::{Bounds, SweepSchedule, SweepTurn};
use crate::stats::StoreCounts;
use crate::store::Arrival;
use crate::sync::{
    AtomicPtr, AtomicU64, AtomicUsize, Guard, Mutex, MutexGuard, Ordering, Staged, TableCell,
};

/// What the store needs of a policy: how a client (its state, with what it
/// keeps of its origin) is begun, judged idle, and frozen for a move.
pub(crate) trait Lifecycle<C> {
    /// A new client created at `origin`.
    fn new_client(&self, origin: u64) -> C;

    /// Retires `client`'s state if it is idle at `now`; whether it did.
    fn retire_idle(&self, client: &C, now: u64) -> bool;

    /// Freezes `client`'s state (its retirement mark) and answers the
    /// client that continues it in a new table: the same decisions from
    /// here on. `None` if it was retired already.
    fn relocate(&self, client: &C) -> Option<C>;
}

/// The tag's low bits: the slot's state (module docs, "Slots").
const STATE: u64 = 0b111;
const EMPTY: u64 = 0;
const BUSY: u64 = 1;
const FULL: u64 = 2;
const DEAD: u64 = 3;
const MOVED: u64 = 4;
const SEALED: u64 = 5;

/// The tag bits that identify a key: its hash, low bits cleared.
#[inline]
fn fingerprint(hash: u64) -> u64 {
    hash & !STATE
}

/// The store's hasher: foldhash's `quality` variant, its `fast` one with
/// one more folded multiply by a constant at the end. A probe starts at the
/// hash's low bits, and `fast`'s low bits for one integer key come from a
/// single multiply by the process's random seed: for keys with structure
/// (sequential ids, ids with a stride, the addresses of one subnet) some
/// seeds place them in long runs, and linear probing then walks those runs.
/// Measured on 100,000 such keys in 2^17 slots, over 60 seeds each: with
/// `fast` the worst seed's mean displacement was 5 to 8 times random
/// keys' (8.7 slots for sequential ids, against 1.6), and 34 times at 7/8
/// load for a stride of 1,024 (120 slots against 3.5); with `quality`,
/// every seed's was within the spread of random keys' (worst seeds 1.69
/// and 3.75). The test `structured_keys_spread_under_every_seed` holds it.
type KeyHasher = foldhash::quality::SeedableRandomState;

/// How many slots a new unbounded store starts with. Under loom, two: room
/// for one client, so a model's second client rebuilds the table (and the
/// models of one client never do).
const FIRST_CAPACITY: usize = if cfg!(floodgate_loom) { 2 } else { 64 };

/// The largest table a capped store allocates up front (24 MiB of 24-byte
/// slots); a larger cap's table starts small and grows.
const MOST_PRESIZED: usize = 1 << 20;

/// A growing table of at most this many bytes (16,384 slots of 24 bytes)
/// takes claims up to half its slots instead of 7/8 (`Table::room_for`).
const SPARSE_BYTES: usize = 1 << 19;

/// A client's key and state, on their way into a slot.
struct Entry<K, C> {
    key: K,
    client: C,
}

/// A slot's entry, as readers see it.
struct EntryRef<'s, K, C> {
    key: &'s K,
    client: &'s C,
}

/// The key and the client are two fields of the slot, not one struct, so
/// that the compiler packs the tag, the key and the origin into the
/// padding a 16-byte state needs: 48 bytes for a `u64` key and a `u128`
/// word, not 64.
struct Slot<K, C> {
    tag: AtomicU64,
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
    unsafe fn entry(&self) -> EntryRef<'_, K, C> {
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
    unsafe fn write(&self, entry: Entry<K, C>) {
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
    slots: Box<[Slot<K, C>]>,
    mask: usize,
    /// Slots claimed so far (every state but `EMPTY` and `SEALED`): counted
    /// by the move that fills the table before it is published, then moved
    /// by read-modify-writes. Relaxed: it decides when to rebuild, never an
    /// answer.
    claimed: AtomicUsize,
    /// Claims stop here (`room_for`): 7/8 of the slots, or half.
    room: usize,
    /// Slots turned `DEAD`: counted by removals, which run under `upkeep`.
    /// Relaxed, as `claimed`.
    dead: AtomicUsize,
    /// The table this one is being emptied into; null until a rebuild
    /// begins, then set once (a move that unwinds is taken up again into
    /// the same table). Release/Acquire: a reader that follows it sees it
    /// built.
    next: AtomicPtr<Table<K, C>>,
}

// SAFETY: a table owns its keys and states and hands out only shared
// references to them, to any thread; it is what a `Vec<(K, C)>` behind an
// `Arc` would be, so it needs what that needs.
unsafe impl<K: Send + Sync, C: Send + Sync> Send for Table<K, C> {}
// SAFETY: as above; the entries' one-time writes are published through the
// tags (module docs, "Slots").
unsafe impl<K: Send + Sync, C: Send + Sync> Sync for Table<K, C> {}

/// What an attempt to write an entry into a vacant slot came to.
enum Written {
    Yes,
    /// The table's room is used up.
    NoRoom,
    /// Another thread took the slot (or a rebuild sealed it) first.
    Lost,
}

/// Where a probe ended.
enum Probe<'t, K, C> {
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
    /// grows (`room_for`).
    fn new(capacity: usize, sparse: bool) -> Self {
        debug_assert!(capacity.is_power_of_two() && capacity >= 2);
        Self {
            slots: (0..capacity)
                .map(|_| Slot {
                    tag: AtomicU64::new(EMPTY),
                    key: UnsafeCell::new(MaybeUninit::uninit()),
                    client: UnsafeCell::new(MaybeUninit::uninit()),
                })
                .collect(),
            mask: capacity - 1,
            claimed: AtomicUsize::new(0),
            dead: AtomicUsize::new(0),
            room: Self::room_for(capacity, sparse),
            next: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Where claims stop in a table of `capacity` slots: 7/8 of them, so a
    /// probe always ends; half of them in a small table of a store that
    /// grows (`sparse`, at most [`SPARSE_BYTES`]), whose probes are then
    /// shorter — a known client's check stays in its first slot more often —
    /// for at most that many bytes more. A capped store's table is sized
    /// for its cap at 7/8 and keeps that.
    fn room_for(capacity: usize, sparse: bool) -> usize {
        let small = capacity.saturating_mul(std::mem::size_of::<Slot<K, C>>()) <= SPARSE_BYTES;
        let room = if sparse && small {
            capacity / 2
        } else {
            capacity - capacity / 8
        };
        room.min(capacity - 1)
    }

    fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Looks `key` up along its path.
    ///
    /// The common case first: a known client's key in the first slot of
    /// its path, `FULL`, is one compare of the tag and one of the key. Any
    /// other first slot goes to the full walk, which decides it on the tag
    /// already loaded.
    #[inline(always)]
    fn probe<Q>(&self, key: &Q, hash: u64) -> Probe<'_, K, C>
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

    /// The full probe from `index`, the first slot of `key`'s path, whose
    /// tag `probe` loaded already (`tag`; the slots after it are loaded
    /// here): every state decided as the module docs say. One load per
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

    /// The table this one is being emptied into, if a rebuild began.
    #[inline]
    fn next<'g>(&self, _: &'g Guard) -> Option<&'g Table<K, C>> {
        let next = self.next.load(Ordering::Acquire);
        // SAFETY: `next` is set once in a table's life, to a table that is
        // staged by the rebuild and then published as current (by that
        // rebuild, or by the holder of `upkeep` that finishes it if it
        // unwound: `move_table` goes on into the same `next`); it is retired
        // only by a later rebuild, after this one, so the collector frees
        // it only once the guard that reached this table is gone. A staged
        // table never published is freed only by the store's drop.
        (!next.is_null()).then(|| unsafe { &*next })
    }

    /// The clients in this table, at most: its claims less its `DEAD`
    /// slots, read in that order so that a removal between the two reads
    /// can only lower the answer, never a claim raise it past what the
    /// table held at the first. Exact when no call is in flight.
    fn live(&self) -> usize {
        let claimed = self.claimed.load(Ordering::Relaxed);
        claimed.saturating_sub(self.dead.load(Ordering::Relaxed))
    }

    /// Takes one claim under `room`; false if there is none left.
    fn claim(&self) -> bool {
        // Progress: `fetch_update` retries its CAS only after another
        // thread's claim or give-back moved the count.
        self.claimed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |claimed| {
                (claimed < self.room).then_some(claimed + 1)
            })
            .is_ok()
    }

    /// Writes `entry` into the first `EMPTY` slot on `hash`'s path. Only
    /// for a rebuild's move into this table (module docs, "Growing without
    /// stopping"), of a client that cannot be in it yet: while the move
    /// runs, it is the only writer of this table's empty slots, so a plain
    /// load finds one and a plain store takes it, with no read-modify-write
    /// (inserts wait for the move, `InlineStore::wait_for_move`; removals
    /// only turn `FULL` slots `DEAD`).
    fn place(&self, hash: u64, entry: Entry<K, C>) {
        let print = fingerprint(hash);
        let mut index = hash as usize & self.mask;
        // Progress: the table has empty slots to spare (its room is below
        // its size, and the move places at most its live clients), and no
        // one else fills them meanwhile, so the walk ends within one lap.
        loop {
            let slot = &self.slots[index];
            // Relaxed: only this thread writes an empty slot's tag, so an
            // `EMPTY` it reads is current; any other tag is skipped unread.
            if slot.tag.load(Ordering::Relaxed) == EMPTY {
                // SAFETY: the slot is EMPTY and only this thread may change
                // that (above); no reader reads an EMPTY slot's entry.
                unsafe { slot.write(entry) };
                // Release: publishes the entry to every reader that loads
                // this tag with Acquire.
                slot.tag.store(print | FULL, Ordering::Release);
                // Counted as it is placed, so a move that unwinds and is
                // taken up again counts each client once. A load and a
                // store: no other thread moves this table's claims until
                // it is published (Relaxed: it reaches inserts with the
                // table, through its publication).
                let claimed = self.claimed.load(Ordering::Relaxed);
                self.claimed.store(claimed + 1, Ordering::Relaxed);
                return;
            }
            index = (index + 1) & self.mask;
        }
    }
}

impl<K, C> Drop for Table<K, C> {
    /// Drops every entry, even past a key's `Drop` that panics: the first
    /// panic is resumed once the rest are dropped (a second one, during
    /// that unwinding, would abort), so one bad key leaks no other.
    fn drop(&mut self) {
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
        if let Some(panic) = panicked {
            std::panic::resume_unwind(panic);
        }
    }
}

/// Client key → that client's state, inline in an open-addressing table.
pub(crate) struct InlineStore<K, C> {
    table: TableCell<Table<K, C>>,
    /// Randomly seeded (foldhash's `random()`), so ids crafted to collide
    /// in one process do not in another.
    hasher: KeyHasher,
    /// Rebuilds, sweeps and `forget`, one at a time. Checks never take it;
    /// an insert waits on it only when its table has no room left or is
    /// being moved.
    upkeep: Mutex<()>,
    /// Whether a rebuild may double the table: not for a capped store,
    /// whose first table already holds its cap.
    grows: bool,
    /// Places taken under the cap (module docs); a store without a cap
    /// takes none. Relaxed: one counter changed only by read-modify-writes,
    /// publishing nothing.
    tracked: AtomicUsize,
    /// The latest `now` a sweep judged at: the earliest origin a new client
    /// may get (module docs).
    swept: AtomicU64,
    schedule: SweepSchedule,
    /// What the cold paths did, for `stats`: each moved where its event
    /// happens, one more add on a path that makes several.
    pub(crate) counts: StoreCounts,
}

impl<K, C> InlineStore<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Send + Sync + 'static,
{
    pub(crate) fn new(bounds: Bounds) -> Self {
        let (capacity, grows) = match bounds.cap().map(Self::capacity_for_cap) {
            // The room (7/8 of the slots) exceeds the cap by at least 1/8
            // of it and one, so the DEAD slots evictions leave behind are
            // dropped by a rebuild at most once per cap/8 + 1 new clients,
            // and the table never needs to grow.
            Some(capacity) if capacity <= MOST_PRESIZED => (capacity, false),
            // A cap too large to allocate for up front: grow towards it.
            _ => (FIRST_CAPACITY, true),
        };
        Self {
            table: TableCell::new(Table::new(capacity, grows)),
            // Under loom, fixed seeds: every execution of a model must probe
            // the same slots.
            #[cfg(not(floodgate_loom))]
            hasher: KeyHasher::random(),
            #[cfg(floodgate_loom)]
            hasher: KeyHasher::fixed(),
            upkeep: Mutex::new(()),
            grows,
            tracked: AtomicUsize::new(0),
            swept: AtomicU64::new(0),
            schedule: SweepSchedule::new(bounds),
            counts: StoreCounts::default(),
        }
    }

    pub(crate) fn bounds(&self) -> Bounds {
        self.schedule.bounds()
    }

    /// Slots whose room holds `cap` clients plus an eighth and one more.
    fn capacity_for_cap(cap: usize) -> usize {
        let need = cap.saturating_add(cap / 8).saturating_add(1);
        (need / 7)
            .saturating_mul(8)
            .saturating_add(if cfg!(floodgate_loom) { 2 } else { 16 })
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX)
    }

    /// The key's hash, the same for every borrowed form of it (`K`, `Q`,
    /// a reference to either), as `Borrow` promises. Not `hash_one`: where
    /// a hasher specialises (`ahash` did, on nightly compilers), its answer
    /// may depend on the argument's type — `&u64` took a dedicated path,
    /// `&&u64` the generic one — and a rebuild that hashed a key through
    /// one more reference than the probe placed clients where no probe
    /// looked.
    #[inline]
    #[allow(clippy::manual_hash_one)]
    pub(crate) fn hash<Q: ?Sized + Hash>(&self, key: &Q) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        key.hash(&mut hasher);
        hasher.finish()
    }

    /// The slot holding `key`'s client, in the current table or the one it
    /// is moving to.
    #[inline(always)]
    fn find<'g, Q>(&self, key: &Q, hash: u64, guard: &'g Guard) -> Option<&'g Slot<K, C>>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let mut table = self.table.load(guard);
        // Progress: `Onward` goes to a newer table, of which there are
        // finitely many (a table's `next` is set once, `Table::next`), and
        // `Busy` waits for a writer that publishes within a few of its own
        // steps (`wait_for_writer`).
        loop {
            match table.probe(key, hash) {
                Probe::Found(slot) => return Some(slot),
                Probe::Vacant(_) => return None,
                Probe::Onward => table = table.next(guard)?,
                Probe::Busy => self.wait_for_writer(),
            }
        }
    }

    /// Waits for a thread that is writing a slot's entry (`BUSY`), then
    /// the caller probes again.
    ///
    /// Progress: the writer turned the slot `BUSY` in `write` and stores
    /// `FULL` a few of its own steps later, with no code of the caller's
    /// (no key's `Hash`, `Eq`, `Clone` or `Drop`, no clock) in between, so
    /// nothing can stop it but its thread not being scheduled; the wait
    /// yields to it. Under loom, a yield too: a scheduling point, so a
    /// writer that never published would be a model that never ends.
    #[cold]
    fn wait_for_writer(&self) {
        crate::sync::spin();
    }

    /// Runs `visit` on `key`'s client, if it is tracked.
    #[inline]
    pub(crate) fn peek<Q, R>(&self, key: &Q, visit: impl FnOnce(&C) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        self.peek_hashed(key, self.hash(key), visit)
    }

    /// [`peek`](Self::peek) with `key`'s [`hash`](Self::hash) already
    /// made: a call that goes on to `arrive` hashes its key once.
    #[inline(always)]
    pub(crate) fn peek_hashed<Q, R>(
        &self,
        key: &Q,
        hash: u64,
        visit: impl FnOnce(&C) -> R,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let guard = self.table.pin();
        let slot = self.find(key, hash, &guard)?;
        // SAFETY: `find` answers only slots it loaded (Acquire) as FULL,
        // and `guard` holds their table.
        Some(visit(unsafe { slot.entry() }.client))
    }

    /// Sees a rebuild that has begun (its table's `next` was seen set)
    /// through: takes `upkeep`, and finishes the move if the thread that
    /// began it did not (a key's `Hash` or `Clone` panicked in it).
    ///
    /// Progress: the rebuild holds `upkeep` from before it sets `next`
    /// until the move is over or has unwound; either way the lock is given
    /// back (a poisoned lock is taken as it is), and this thread then ends
    /// the move itself if it is not over, in steps of its own.
    #[cold]
    fn finish_move(&self, policy: &impl Lifecycle<C>, guard: &Guard) {
        let _upkeep = self.lock_upkeep(policy, guard);
    }

    /// Takes `upkeep` for a rebuild, a sweep or `forget`, after finishing
    /// a move that an earlier holder began and did not end (it unwound):
    /// every holder then finds the current table with no move under way,
    /// as the module docs say.
    fn lock_upkeep(&self, policy: &impl Lifecycle<C>, guard: &Guard) -> MutexGuard<'_, ()> {
        let upkeep = self
            .upkeep
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let table = self.table.load(guard);
        if table.next(guard).is_some() {
            self.move_table(table, policy, guard);
        }
        upkeep
    }

    /// A call that found its client's state retired (a rebuild moving it,
    /// a sweep or `forget` removing it) yields to the thread doing that
    /// before it looks again.
    ///
    /// Progress: a state is seen retired in a slot still `FULL` only
    /// between two steps of one holder of `upkeep` with no code of the
    /// caller's in between: a move's freeze and its store of `MOVED`
    /// (`move_table` runs the key's `Hash` and `Clone` before it freezes
    /// the state), or a sweep's retirement and its store of `DEAD`. Both
    /// always happen, so the next look finds the slot changed once that
    /// thread is scheduled. (`forget` marks the slot `DEAD` before it
    /// retires the state.) Under loom, a scheduling point.
    #[cold]
    pub(crate) fn settle(&self) {
        crate::sync::spin();
    }

    /// A call for `key` (whose [`hash`](Self::hash) is `hash`), which was
    /// not tracked, at `now`: sweeps first if a sweep is due, then creates
    /// the client if there is room. `first` runs on the new client before
    /// it is published — no other thread can reach it yet — and answers
    /// the client to publish with the call's answer, which is returned if
    /// this call's insert is the one that created the client.
    #[cold]
    #[inline(never)]
    pub(crate) fn arrive<Q, R>(
        &self,
        key: &Q,
        hash: u64,
        now: u64,
        policy: &impl Lifecycle<C>,
        first: impl FnOnce(C) -> (C, R),
    ) -> Arrival<R>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        if let Some(turn) = self.schedule.arrive() {
            self.sweep_turn(turn, now, policy);
        }
        let cap = self.schedule.bounds().cap();
        if !self.reserve(cap) {
            let Some(cap) = cap else {
                unreachable!("reserving fails only at a cap")
            };
            if let Some(turn) = self.schedule.at_cap(cap) {
                self.sweep_turn(turn, now, policy);
            }
            if !self.reserve(Some(cap)) {
                // A racing first call may have created this very client.
                return if self.peek_hashed(key, hash, |_| ()).is_some() {
                    Arrival::Raced
                } else {
                    self.counts
                        .cap_reached(cap, self.schedule.bounds().overflow());
                    Arrival::Full
                };
            }
        }
        // Acquire pairs with the Release of the sweep that raised `swept`
        // (see `store::keyed`'s `arrive`). A call gets here having seen the
        // client's eviction one of two ways, each of which makes that raise
        // visible: its state's retired mark (an AcqRel CAS made after the
        // raise), or its slot DEAD (a Release store, `sweep_turn`).
        let origin = now.max(self.swept.load(Ordering::Acquire));
        // The place goes back unless this call creates the client, however
        // it ends: another thread creating it first, or a panic in the
        // key's `Clone` (`to_owned`), `Eq` or `Drop`, or in a rebuild
        // this insert runs.
        let place = Place(self);
        let (client, answer) = first(policy.new_client(origin));
        let entry = Entry {
            key: key.to_owned(),
            client,
        };
        let guard = self.table.pin();
        if self.insert(key, hash, entry, policy, &guard) {
            std::mem::forget(place);
            StoreCounts::add(&self.counts.created, 1);
            Arrival::Created(answer)
        } else {
            drop(place);
            Arrival::Raced
        }
    }

    /// Puts `entry` in `key`'s first empty slot, unless `key` is present
    /// (then false): in the current table, or in the one it is moving to.
    fn insert<Q>(
        &self,
        key: &Q,
        hash: u64,
        entry: Entry<K, C>,
        policy: &impl Lifecycle<C>,
        guard: &Guard,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let print = fingerprint(hash);
        let mut entry = Some(entry);
        let mut table = self.table.load(guard);
        // Progress: each pass returns, or moves to a newer table (after
        // seeing its move through: `finish_move`, which ends it itself if
        // need be), or rebuilds a table with no room (`rebuild`: the table
        // is current with room again when it returns), or probes again
        // after another thread took the slot it wanted (`Lost`: that
        // thread's claim succeeded, and there are finitely many slots to
        // take before the table has no room), or waits for a writer that
        // publishes within a few of its own steps.
        loop {
            match table.probe(key, hash) {
                Probe::Found(_) => return false,
                Probe::Busy => self.wait_for_writer(),
                Probe::Onward => match table.next(guard) {
                    // The move into `next` is the only writer of its empty
                    // slots while it runs (`Table::place`): see it end
                    // (or end it) before claiming one.
                    Some(next) => {
                        self.finish_move(policy, guard);
                        table = next;
                    }
                    None => {
                        self.rebuild(table, policy, guard);
                        table = self.table.load(guard);
                    }
                },
                Probe::Vacant(index) => {
                    let slot = &table.slots[index];
                    match self.write(table, slot, print, &mut entry) {
                        Written::Yes => return true,
                        // A racing insert may have taken the last claim for
                        // this very key: if the slot is no longer empty,
                        // probe again before rebuilding anything.
                        Written::NoRoom if slot.tag.load(Ordering::Acquire) == EMPTY => {
                            self.rebuild(table, policy, guard);
                            table = self.table.load(guard);
                        }
                        // Taken (by another key, or this one) or sealed
                        // meanwhile: probe again.
                        Written::NoRoom | Written::Lost => {}
                    }
                }
            }
        }
    }

    /// Claims `slot` of `table` and writes `entry` (taken from the option)
    /// there, publishing it `FULL`.
    fn write(
        &self,
        table: &Table<K, C>,
        slot: &Slot<K, C>,
        print: u64,
        entry: &mut Option<Entry<K, C>>,
    ) -> Written {
        if !table.claim() {
            return Written::NoRoom;
        }
        if slot
            .tag
            .compare_exchange(EMPTY, print | BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            table.claimed.fetch_sub(1, Ordering::Relaxed);
            return Written::Lost;
        }
        let entry = entry
            .take()
            .expect("written once: the insert returns after");
        // SAFETY: this thread claimed the slot (EMPTY → BUSY) and is its
        // only writer; readers wait while it is BUSY.
        unsafe { slot.write(entry) };
        // Release: publishes the entry to every reader that loads this tag
        // with Acquire.
        slot.tag.store(print | FULL, Ordering::Release);
        Written::Yes
    }

    /// Rebuilds `table`, which had no room for an insert, unless another
    /// thread already did (module docs, "Growing without stopping").
    #[cold]
    #[inline(never)]
    fn rebuild(&self, table: &Table<K, C>, policy: &impl Lifecycle<C>, guard: &Guard) {
        let _upkeep = self.lock_upkeep(policy, guard);
        if !std::ptr::eq(self.table.load(guard), table) {
            return; // rebuilt while this thread waited (or by `lock_upkeep`)
        }
        // Claims given back meanwhile (inserts that lost a slot race) left
        // room: no rebuild. A table with every slot taken has no claim to
        // give back, so an insert that found none still gets its rebuild.
        if table.claimed.load(Ordering::Relaxed) < table.room {
            return;
        }
        self.move_table(table, policy, guard);
    }

    /// Moves every live client of `table` (the current one) into a new
    /// table and publishes it; or, if a move of `table` began and did not
    /// end (it unwound, `lock_upkeep`), goes on with that one. Runs under
    /// `upkeep`.
    ///
    /// A key's `Hash` and `Clone` run before its client's state is frozen,
    /// so a panic in either leaves the slot `FULL` and its state live, the
    /// slots before it moved or sealed and `next` set: a consistent store
    /// that the next holder of `upkeep` finishes moving. Nothing else in
    /// the move can panic.
    fn move_table(&self, table: &Table<K, C>, policy: &impl Lifecycle<C>, guard: &Guard) {
        let next: &Table<K, C> = match table.next(guard) {
            Some(next) => next,
            None => {
                let staged = TableCell::stage(Table::new(self.next_capacity(table), self.grows));
                // Owned through `table.next` until it is published below
                // (or, if every move of `table` unwinds and the store is
                // dropped, freed by the store's drop).
                let next = Staged::into_raw(staged);
                table.next.store(next, Ordering::Release);
                // SAFETY: just made from a box, and freed only by
                // `publish`'s caller below or the store's drop.
                unsafe { &*next }
            }
        };
        for slot in table.slots.iter() {
            // Progress: each pass turns the slot to a state no other
            // thread changes again (SEALED, MOVED, DEAD), or waits for a
            // writer that publishes within a few of its own steps
            // (`wait_for_writer`); an EMPTY slot's CAS fails only on a
            // claim, which moves it to BUSY.
            let mut tag = slot.tag.load(Ordering::Acquire);
            loop {
                match tag & STATE {
                    EMPTY => match slot.tag.compare_exchange(
                        EMPTY,
                        SEALED,
                        Ordering::Relaxed,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => break,
                        Err(now) => tag = now,
                    },
                    BUSY => {
                        self.wait_for_writer();
                        tag = slot.tag.load(Ordering::Acquire);
                    }
                    FULL => {
                        // SAFETY: the slot was FULL (Acquire) and this
                        // thread holds the table it is rebuilding.
                        let entry = unsafe { slot.entry() };
                        // The caller's code first: if it unwinds, nothing
                        // of this slot has changed.
                        let hash = self.hash(entry.key);
                        let key = entry.key.clone();
                        // Frozen by its retirement mark, one read-modify-
                        // write: a check's CAS lands before it (and is in
                        // what moves) or fails on it. The tag needs no claim
                        // of its own: once FULL, it changes only under
                        // `upkeep` (sweeps and `forget` take it too). A
                        // state retired already cannot happen (a removal
                        // retires a state and marks its slot DEAD within one
                        // hold of `upkeep`), but one must never move, so it
                        // would be left `DEAD`.
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
                        break;
                    }
                    // DEAD, MOVED and SEALED stay as they are: a removal
                    // or this move (or an earlier, unwound one) left them.
                    _ => break,
                }
            }
        }
        let next = table.next.load(Ordering::Relaxed);
        // SAFETY: `next` came from `Staged::into_raw` above (in this call
        // or an unwound one) and is published once, here: `table` stops
        // being current, so no later move of it can reach this line.
        self.table.publish(unsafe { Staged::from_raw(next) });
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
        // A table that could not hold its live clients again is doubled
        // even when capped (the sizing above makes that never happen).
        if (self.grows && live * 2 > table.room) || live >= table.room {
            table.capacity() * 2
        } else {
            table.capacity()
        }
    }

    /// Takes a place under `cap`; false at the cap. Without a cap there
    /// is nothing to count against, and `stored` alone counts the clients:
    /// a new client's arrival saves the read-modify-write, a full barrier
    /// that waits for the stores before it (the last insert's slot).
    fn reserve(&self, cap: Option<usize>) -> bool {
        cap.is_none() || super::reserve(&self.tracked, cap)
    }

    /// Removes `key`'s client and retires its state with `retire`; whether
    /// it was tracked. A call that still holds the state finds it retired
    /// on its next CAS and looks the client up again.
    pub(crate) fn forget<Q>(&self, key: &Q, policy: &impl Lifecycle<C>, retire: impl Fn(&C)) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let hash = self.hash(key);
        // Under `upkeep`, as sweeps and rebuilds: a `FULL` slot's tag then
        // changes nowhere else, so a move needs no claim on it
        // (`move_table`).
        let guard = self.table.pin();
        let _upkeep = self.lock_upkeep(policy, &guard);
        let Some(slot) = self.find(key, hash, &guard) else {
            return false;
        };
        // `find` loaded the tag (Acquire) as FULL, and no one else may
        // change it now. Release: a probe that loads DEAD (Acquire) and then
        // reads the entry sees what this thread saw of it.
        let tag = slot.tag.load(Ordering::Relaxed);
        debug_assert_eq!(tag & STATE, FULL, "found, and only upkeep removes");
        slot.tag.store((tag & !STATE) | DEAD, Ordering::Release);
        // No rebuild runs while `upkeep` is held, so the slot is in the
        // current table. Counted DEAD first, then the place given back: so
        // `stored <= tracked`.
        self.table.load(&guard).dead.fetch_add(1, Ordering::Relaxed);
        self.give_back(1);
        StoreCounts::add(&self.counts.forgotten, 1);
        // SAFETY: the slot was FULL (Acquire, in `find`); `guard` holds it.
        retire(unsafe { slot.entry() }.client);
        true
    }

    /// An explicit sweep at `now`: how many clients it removed (0 if another
    /// thread is sweeping).
    pub(crate) fn sweep(&self, now: u64, policy: &impl Lifecycle<C>) -> usize {
        match self.schedule.turn() {
            Some(turn) => self.sweep_turn(turn, now, policy),
            None => 0,
        }
    }

    /// Removes every client idle at `now`, under `upkeep`.
    fn sweep_turn(&self, turn: SweepTurn<'_>, now: u64, policy: &impl Lifecycle<C>) -> usize {
        let guard = self.table.pin();
        let _upkeep = self.lock_upkeep(policy, &guard);
        // Raised before any state is judged, so that every eviction below
        // happens after it (Release: see `arrive`).
        self.swept.fetch_max(now, Ordering::Release);
        // The current table: no rebuild runs while `upkeep` is held.
        let table = self.table.load(&guard);
        let mut removed = 0;
        for slot in table.slots.iter() {
            let tag = slot.tag.load(Ordering::Acquire);
            if tag & STATE != FULL {
                continue;
            }
            // SAFETY: the slot was FULL (Acquire); `guard` holds the table.
            let client = unsafe { slot.entry() }.client;
            // A plain store: under `upkeep`, no one else changes a FULL
            // tag. Release: a call that finds the slot DEAD (by its probe's
            // Acquire load of the tag, never having read the retired state)
            // must also find `swept` raised above, or it re-creates the
            // client with an origin older than this sweep (`arrive`; the
            // drip policies' `sweep_races_an_older_check` models in
            // `loom-tests/tests/eviction.rs` fail with Relaxed here).
            if policy.retire_idle(client, now) {
                slot.tag.store((tag & !STATE) | DEAD, Ordering::Release);
                removed += 1;
            }
        }
        // Counted DEAD first, then the places given back: so `stored <=
        // tracked`.
        table.dead.fetch_add(removed, Ordering::Relaxed);
        let kept = self.give_back(removed).unwrap_or_else(|| table.live());
        turn.finish(kept);
        StoreCounts::add(&self.counts.sweeps, 1);
        StoreCounts::add(&self.counts.evicted, removed as u64);
        removed
    }

    /// How many clients hold a place (see `store::keyed`'s `len`); without
    /// a cap, how many the table holds.
    pub(crate) fn len(&self) -> usize {
        if self.schedule.bounds().cap().is_none() {
            return self.stored();
        }
        self.tracked.load(Ordering::Relaxed)
    }

    /// How many clients the current table holds, as its claims and
    /// removals count them (module docs). O(1).
    pub(crate) fn stored(&self) -> usize {
        self.table.load(&self.table.pin()).live()
    }
}

impl<K, C> InlineStore<K, C> {
    /// Gives back `places` that `reserve` took; how many are still taken,
    /// or `None` without a cap (nothing was taken). No load of its own:
    /// a removal's counts are read only from its read-modify-writes.
    fn give_back(&self, places: usize) -> Option<usize> {
        self.schedule.bounds().cap()?;
        Some(self.tracked.fetch_sub(places, Ordering::Relaxed) - places)
    }
}

/// A place under the cap that an arriving call took (`reserve`): given
/// back when dropped, unless the call created its client (then forgotten).
struct Place<'s, K, C>(&'s InlineStore<K, C>);

impl<K, C> Drop for Place<'_, K, C> {
    fn drop(&mut self) {
        self.0.give_back(1);
    }
}

/// A table staged by a move that unwound and was never taken up again is
/// owned by nothing but the current table's `next`: freed here, with the
/// clients placed in it (their keys are clones, their states copies, so the
/// current table's drop frees its own).
impl<K, C> Drop for InlineStore<K, C> {
    fn drop(&mut self) {
        let guard = self.table.pin();
        let next = self
            .table
            .load(&guard)
            .next
            .swap(std::ptr::null_mut(), Ordering::Acquire);
        if !next.is_null() {
            // SAFETY: `&mut self`: no thread reaches the store any more,
            // and a non-null `next` of the current table was made by
            // `Staged::into_raw` and never published (`move_table`).
            drop(unsafe { Staged::from_raw(next) });
        }
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;

    fn first_table(bounds: Bounds) -> (usize, usize, bool) {
        let store = InlineStore::<u64, AtomicU64>::new(bounds);
        let guard = Guard::new();
        let table = store.table.load(&guard);
        (table.capacity(), table.room, store.grows)
    }

    /// The slot sizes the module docs (and the README's memory table)
    /// give: 24 bytes for a `u64` key and a one-word policy, which keeps no
    /// origin; 48 for a two-word one, whose origin fills the padding.
    #[test]
    fn slots_are_the_sizes_the_docs_give() {
        use crate::policy::{FixedWindowState, GcraState, TokenBucketState};
        use crate::store::keyed::Client;
        use std::mem::size_of;
        assert_eq!(size_of::<Slot<u64, Client<GcraState, ()>>>(), 24);
        assert_eq!(size_of::<Slot<u64, Client<TokenBucketState, ()>>>(), 24);
        assert_eq!(size_of::<Slot<u64, Client<FixedWindowState, u64>>>(), 48);
        // With an origin, a one-word state would take a word more.
        assert_eq!(size_of::<Slot<u64, Client<GcraState, u64>>>(), 32);
    }

    /// Keys with structure spread over the slots as random keys do,
    /// whatever the seeds (`KeyHasher`): 100,000 sequential, strided and
    /// one-subnet keys placed by linear probing from `hash & mask`, as
    /// `Table::probe` starts, in 2^17 slots (3/4 full), under 32 seeds.
    /// Random keys' mean displacement there is 1.6 slots; with foldhash's
    /// `fast` hasher, several of these seeds gave over 2, the worst 21.
    #[test]
    fn structured_keys_spread_under_every_seed() {
        const SLOTS: usize = 1 << 17;
        type KeySet = (&'static str, fn(u64) -> u64);
        let sets: [KeySet; 3] = [
            ("sequential", |k| k),
            ("stride 1024", |k| k << 10),
            ("one /8 subnet", |k| 0x0a00_0000 + k),
        ];
        for seed in 1..=32u64 {
            let shared = Box::leak(Box::new(foldhash::SharedSeed::from_u64(seed)));
            let hasher = KeyHasher::with_seed(seed.wrapping_mul(0x9e37_79b9), shared);
            for (name, key) in sets {
                let mut full = vec![false; SLOTS];
                let mut walked = 0u64;
                for k in 0..100_000 {
                    let mut index = hasher.hash_one(key(k)) as usize & (SLOTS - 1);
                    while full[index] {
                        index = (index + 1) & (SLOTS - 1);
                        walked += 1;
                    }
                    full[index] = true;
                }
                let mean = walked as f64 / 100_000.0;
                assert!(mean < 2.0, "{name} keys, seed {seed}: {mean:.2} slots");
            }
        }
    }

    /// A key hashes the same through any number of references, and as
    /// any borrowed form: a rebuild hashes the key it moves (`&K`), a probe
    /// the one it was given (`&Q`). `hash_one` broke this under `ahash`'s
    /// nightly specialisation (`&u64` and `&&u64` differed), and every
    /// moved client was lost to its probe.
    #[test]
    fn a_key_hashes_the_same_in_every_borrowed_form() {
        let store = InlineStore::<u64, AtomicU64>::new(Bounds::new());
        let key = 0x1234_5678_u64;
        assert_eq!(store.hash(&key), store.hash(&&key));
        assert_eq!(store.hash(&key), store.hash(&&&key));
        let strings = InlineStore::<String, AtomicU64>::new(Bounds::new());
        let owned = String::from("app-7");
        assert_eq!(strings.hash(&owned), strings.hash("app-7"));
        assert_eq!(strings.hash(&&owned), strings.hash(&"app-7"));
    }

    /// A capped table's room holds the cap and an eighth more, from a cap
    /// of one up (a room below the cap would rebuild without end), and a
    /// cap too large to allocate for starts small and grows.
    #[test]
    fn capped_tables_hold_their_cap_with_slack() {
        for cap in [0, 1, 3, 7, 8, 100, 100_000, 800_000] {
            let (capacity, room, grows) = first_table(Bounds::new().max_clients(cap));
            assert!(!grows, "cap {cap}");
            assert!(room > cap + cap / 8, "cap {cap}: room {room}");
            assert!(capacity <= 4 * (cap + 16), "cap {cap}: {capacity} slots");
        }
        assert_eq!(first_table(Bounds::new().max_clients(100_000)).0, 131_072);
        // A growing store's small first table is half used at most.
        assert_eq!(
            first_table(Bounds::new().max_clients(usize::MAX)),
            (FIRST_CAPACITY, FIRST_CAPACITY / 2, true)
        );
        assert_eq!(
            first_table(Bounds::new()),
            (FIRST_CAPACITY, FIRST_CAPACITY / 2, true)
        );
    }

    /// A growing store's tables take claims up to half their slots while
    /// they are at most `SPARSE_BYTES` (16,384 slots of 24 bytes), 7/8
    /// after; a capped store's always 7/8.
    #[test]
    fn small_growing_tables_are_half_used_at_most() {
        type Small = Table<u64, AtomicU64>;
        assert_eq!(std::mem::size_of::<Slot<u64, AtomicU64>>(), 24);
        assert_eq!(Small::room_for(16_384, true), 8_192);
        assert_eq!(Small::room_for(32_768, true), 28_672);
        assert_eq!(Small::room_for(16_384, false), 14_336);
        assert_eq!(Small::room_for(2, true), 1);
        assert_eq!(Small::room_for(2, false), 1);
    }
}
