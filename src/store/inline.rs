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
//!   the one step of a move or a sweep, or the `forget`, that holds it. So
//!   each of those changes it with a plain store, never a CAS.
//!
//! # Growing in steps
//!
//! A table takes claims up to 7/8 of its slots (`room`; half in a growing
//! store's tables of at most `SPARSE_BYTES`, whose probes are then shorter
//! for little memory). An insert that finds no room has the table moved
//! into a new one: twice the size if its live clients fill more than half
//! the room, the same size otherwise (a flood of ids that were evicted
//! leaves `DEAD` slots behind; the move drops them). A capped store is
//! sized for its cap once and is only ever moved at that size. No call
//! moves the whole table: each new client's arrival takes at most one
//! *step* of the move, [`MOVE_CHUNK`] slots, and the move ends at the step
//! that moves its last slot, whichever arrival takes it. Checks of known
//! clients take no step and never wait for one.
//!
//! 1. Before the move, while the table nears its room, arrivals prepare the
//!    new table's memory a few pages at a time (`prepare`, which says why).
//! 2. The insert that finds no room builds the new table from that memory
//!    and publishes it as the old one's `next` (`begin_move`), with a claim
//!    taken at once for every client the move may place (`reserved`).
//! 3. Each step, under `upkeep`, moves the next slots of the old table in
//!    order (`move_slot`): an `EMPTY` one is `SEALED`; a `BUSY` one is
//!    waited for (a few of its writer's steps); a `FULL` one has its key
//!    hashed and cloned, then its state frozen by the policy's retirement
//!    mark and continued in `next` ([`Lifecycle::relocate`]), and becomes
//!    `MOVED`. Placing claims `next`'s slots by CAS, as inserts do, since
//!    inserts fill `next` meanwhile.
//! 4. The step that moves the last slot gives back the reserved claims no
//!    client used and publishes `next` as the current table; the old one
//!    goes to the epoch collector (`store::epoch`), and once no pin taken
//!    before can reach it, its memory to the releases (`store::release`),
//!    which give it back to the kernel a step per arrival.
//!
//! While the move runs, a new client's insert probes the old table first.
//! If its probe ends on a slot that is `SEALED` (by the move or another
//! insert) or `EMPTY` (which the insert seals itself), the key is not in
//! the old table and never will be: claimed slots never become `EMPTY` or
//! `SEALED`, and once the seal is in place no insert can claim a slot of
//! the key's path before it. The insert then goes on into `next` and claims
//! a slot there, taking a step of the move first if the arrival has taken
//! none. So a key is in one table only, and a client is never created
//! while an older state of it waits to move. The reserve leaves the new
//! table room for inserts during the move: at least half its room at the
//! same size, the old table's whole room when it doubles; a move takes a
//! step per arrival, so it ends long before inserts fill that, and an
//! insert that finds `next` full anyway takes the steps that end the move
//! (`make_room`: the one case where an arrival takes more than one; the
//! tests count that it never happens).
//!
//! No admission is lost or counted twice: a check's CAS on the old state
//! either lands before the freeze, and is in what moves, or fails on the
//! mark; the check then looks again, waits for `MOVED` and decides on the
//! state in `next`. A probe goes on to `next` only on `MOVED` for its key
//! (the key is there already) or on `SEALED` before its key (it was never
//! in the old table).
//!
//! What a call costs at worst, in slots: a known client's check, a probe
//! of its path in the current table and, while a move runs, in `next`; a
//! new client's arrival, its probes, one step of a move ([`MOVE_CHUNK`]
//! slots moved), one step of a sweep ([`SWEEP_CHUNK`] slots visited,
//! below), the zeroing of a few pages of a table being prepared, and
//! [`release::STEP`](super::release::STEP) bytes given back. `forget`
//! probes only. An explicit sweep takes every step of its own sweep (and of
//! a move under way), giving `upkeep` back between steps.
//!
//! # Sweeps in steps
//!
//! A sweep due on an arrival (`bounds`' schedule) begins at that arrival's
//! `now` and visits [`SWEEP_CHUNK`] slots; each later arrival visits the
//! next chunk, judging every client idle or not at the sweep's `now`, until
//! the sweep has visited the whole table. A table of at most
//! [`SWEEP_CHUNK`] slots is swept whole by the arrival that begins it, as
//! the mutex engine sweeps, so the two engines agree on every call there.
//! A sweep whose table was replaced by a move starts over in the new one,
//! and a step never walks a table being moved. The next sweep is due
//! `max(64, kept)` arrivals after this one began, where `kept` is what the
//! last one kept, so the table holds at most twice the clients that were
//! not idle, plus 64, plus one client per step of the sweep under way (at
//! most the table's slots over [`SWEEP_CHUNK`]). At the cap, a sweep is
//! due once per `max(1, cap / 16)` arrivals and goes on a chunk per
//! arrival; a newcomer gets a place once a step of it has found an idle
//! client, within the sweep's steps rather than at once.
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
//! panic leaves no slot in between. `upkeep` is held for one step at a
//! time and never waited on with a lock: an arrival tries it and goes on
//! without it; the calls that cannot go on without it (an insert with no
//! room anywhere, `forget`, an explicit sweep) yield until the holder's
//! step ends. A step that unwinds (a `Hash` or `Clone` that panicked)
//! leaves the slots before the panicking one `SEALED` or `MOVED` and the
//! move's cursor at the step's start: the next step takes it up there. No
//! client is lost (its slot is `FULL` in the old table or placed in
//! `next`, never neither) and none is counted twice (a slot is moved at
//! most once: `MOVED` is final). Each wait and retry loop says beside it
//! which step of which thread ends it.
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
//! move publishes the new table through `next` (Release store, Acquire
//! load) before any probe can reach it, and each moved client through the
//! new slot's `FULL` and then the old slot's `MOVED`, so a probe that
//! follows `MOVED` sees the client placed. The CASes on tags are weaker
//! where nothing is read on their strength: claiming an empty slot and
//! sealing one publish no entry (the claimer's entry goes out with its own
//! `FULL`). The counters (`claimed`, `dead`, `tracked`) are Relaxed: each
//! publishes nothing, is moved by read-modify-writes (and `claimed` set to
//! the move's reserve before its table is published), and decides when to
//! move, whether there is a place or what `stored` reads, never what a
//! decision answers. A move's `cursor` and `placed`, and a sweep's place,
//! are read and written only under `upkeep`, whose lock orders them. The
//! states' own words keep their orderings (`cell`).
//!
//! # Sweeps and time, the cap
//!
//! As in the tiers' store (`store::keyed`, same sections): `swept` is the
//! earliest origin a new client may get; `tracked` counts places under the
//! cap, taken before an insert and given back by whoever removes a client;
//! `stored` counts what the table did: its claimed slots less its `DEAD`
//! ones (a slot is claimed after its insert took a place and before it is
//! published `FULL`; it is counted `DEAD` before the place is given back),
//! so that `stored <= tracked <= cap` and a watcher can see a broken cap.
//! While a move runs, `stored` adds the old table's clients (moved ones
//! included) and the new one's inserts (its claims past the reserve, less
//! its `DEAD` slots). A store without a cap takes no places: `stored`
//! alone counts its clients, and an insert moves no counter but its
//! table's claims.

use std::alloc::Layout;
use std::borrow::Borrow;
use std::cell::UnsafeCell;
use std::hash::{BuildHasher, Hash, Hasher};
use std::mem::MaybeUninit;
use std::panic::AssertUnwindSafe;
use std::ptr::NonNull;
use std::sync::{Arc, TryLockError};

use crate::bounds::{Bounds, SweepSchedule, SweepTurn};
use crate::stats::StoreCounts;
use crate::store::release::Releases;
use crate::store::Arrival;
use crate::sync::{
    AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Guard, Mutex, MutexGuard, Ordering, Staged,
    TableCell,
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
/// for one client, so a model's second client begins a move of the table
/// (and the models of one client never do).
const FIRST_CAPACITY: usize = if cfg!(floodgate_loom) { 2 } else { 64 };

/// The largest table a capped store allocates up front (24 MiB of 24-byte
/// slots); a larger cap's table starts small and grows.
const MOST_PRESIZED: usize = 1 << 20;

/// A growing table of at most this many bytes (16,384 slots of 24 bytes)
/// takes claims up to half its slots instead of 7/8 (`Table::room_for`).
const SPARSE_BYTES: usize = 1 << 19;

/// How many slots of an outgrown table one step of its move visits: the
/// most any call moves (module docs, "Growing in steps"). Chosen with
/// `floodgate bench --tail` (growth to 4 M clients beside known clients'
/// checks, one run each): steps of 32 and 64 slots read the same, a new
/// client's check at p99 2.2 µs and p99.9 10.4 to 10.6 µs, and 128 read
/// p99.9 36.5 µs (a step then places 128 clients at random in a table of
/// 192 MB, a cache and TLB miss each). Under loom, one: a model's two-slot
/// table then moves in two steps, so the models race checks, inserts,
/// sweeps and `forget` against a move half done.
pub(crate) const MOVE_CHUNK: usize = if cfg!(floodgate_loom) { 1 } else { 64 };

/// How many slots one step of a sweep visits: the most any arrival visits
/// (module docs, "Sweeps in steps"). A visit of a slot that stays is a
/// load and a compare, about 4 ns, so a step costs a few microseconds; and
/// a table of up to this many slots (every table of a limiter below 512
/// clients) is swept in one step, as a whole, at the arrival that began the
/// sweep. Under loom, two: the models' first table in one step, a grown
/// one in two.
pub(crate) const SWEEP_CHUNK: usize = if cfg!(floodgate_loom) { 2 } else { 1024 };

/// The kernel's page size where it is smallest, 4 KiB: the unit of
/// `TOUCH_PAGES`.
const PAGE: usize = 4096;

/// How many pages of the next table one arrival zeroes before a move
/// (`InlineStore::prepare`): a page fault each, about a microsecond. Eight
/// read a p99.9 of 10 µs for a new client's check at 4 M clients (a
/// step's eight faults); two, 3.7 to 6 µs.
const TOUCH_PAGES: usize = 2;

/// The smallest next table whose memory arrivals prepare (`prepare`):
/// 1 MiB, 256 pages.
const PREPARE_FROM: usize = 1 << 20;

/// A value alone on its cache lines (two: the adjacent-line prefetcher
/// pulls lines in pairs), so that the writes every insert makes to it do
/// not take from other cores the lines every arrival reads. Measured: the
/// flags and the table's `next` sharing lines with `claimed` and `created`
/// cost two threads creating clients at once 14 % of their time in
/// `step`'s loads.
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct Alone<T>(T);

impl<T> std::ops::Deref for Alone<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// A slot, and the table it is in.
type InTable<'g, K, C> = (&'g Table<K, C>, &'g Slot<K, C>);

/// Slots not yet all zeroed (`Prepared`).
type RawSlots<K, C> = Box<[MaybeUninit<Slot<K, C>>]>;

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
    /// Slots claimed so far (every state but `EMPTY` and `SEALED`), and,
    /// while a move fills the table, its reserve for the clients it places
    /// (`reserved`): set before the table is published, then moved by
    /// read-modify-writes. Relaxed: it decides when to move, never an
    /// answer.
    /// Alone on its lines: every insert writes it, and every arrival reads
    /// the fields beside it (`next`, `prepare_from`).
    claimed: Alone<AtomicUsize>,
    /// Claims stop here (`room_for`): 7/8 of the slots, or half.
    room: usize,
    /// Slots turned `DEAD`: counted by removals, which run under `upkeep`.
    /// Relaxed, as `claimed`.
    dead: AtomicUsize,
    /// The table this one is being emptied into; null until its move
    /// begins, then set once. Release/Acquire: a reader that follows it
    /// sees it built.
    next: AtomicPtr<Table<K, C>>,
    /// While this table is being moved: the first slot no step has moved
    /// yet. Written only under `upkeep`, whose lock orders its writes and
    /// the reads there: Relaxed (`room_to_spare` reads it as a hint). Alone
    /// on its lines, as `claimed`, and so is `placed`: each step writes
    /// them, and every arrival reads the fields beside them.
    cursor: Alone<AtomicUsize>,
    /// In a table being filled by a move: the claims taken for the clients
    /// the move will place, all at once when it began (`claimed` starts
    /// there), so that inserts racing the move can never take the room the
    /// move needs. What the move did not use is given back when it ends.
    reserved: usize,
    /// Clients the move placed here so far. Under `upkeep`, as `cursor`.
    placed: Alone<AtomicUsize>,
    /// Counts the tables of one store, from 0: a sweep under way knows by
    /// it whether the table it walks was replaced (`Round`).
    generation: u64,
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
    prepare_from: usize,
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
    /// Another thread took the slot (or a move sealed it) first.
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
    /// grows (`room_for`); `reserved` claims taken for a move into it.
    fn new(
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
    fn with_slots(
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
    fn empty_slots(capacity: usize) -> Box<[Slot<K, C>]> {
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
    fn empty_slots(capacity: usize) -> Box<[Slot<K, C>]> {
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

    /// The table this one is being emptied into, if its move began.
    #[inline]
    fn next<'g>(&self, _: &'g Guard) -> Option<&'g Table<K, C>> {
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
    fn live(&self) -> usize {
        let claimed = self.claimed.load(Ordering::Relaxed);
        claimed.saturating_sub(self.dead.load(Ordering::Relaxed))
    }

    /// Takes one claim under `room`: the claims taken before it, or `None`
    /// if there is none left.
    fn claim(&self) -> Option<usize> {
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
    fn place(&self, hash: u64, entry: Entry<K, C>) {
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

/// Client key → that client's state, inline in an open-addressing table.
pub(crate) struct InlineStore<K, C> {
    table: TableCell<Table<K, C>>,
    /// Randomly seeded (foldhash's `random()`), so ids crafted to collide
    /// in one process do not in another.
    hasher: KeyHasher,
    /// The steps of moves and sweeps, and `forget`, one at a time, and the
    /// sweep under way. Checks never take it; an arrival tries it
    /// (`try_lock`) and goes on without it if another thread holds it, and
    /// waits for it (yielding, `upkeep`) only when no table has room for its
    /// client, for one step of the holder's.
    /// Alone on its lines: its holders write it at every step, and every
    /// check reads `table` and `hasher`.
    upkeep: Alone<Mutex<Upkeep<K, C>>>,
    /// Whether a sweep is under way (`Upkeep::round`): a hint that lets an
    /// arrival skip the lock when there is nothing to do. Relaxed: written
    /// under `upkeep`, and a stale reading only delays a step by one
    /// arrival.
    sweeping: AtomicBool,
    /// Whether arrivals prepare the next table's memory (`prepare`): set by
    /// the claim that reaches the current table's `prepare_from`, cleared
    /// when the memory is all zeroed or the move begins. Relaxed, as
    /// `sweeping`: a hint, which `prepare` checks against the claims.
    preparing: AtomicBool,
    /// Whether a rebuild may double the table: not for a capped store,
    /// whose first table already holds its cap.
    grows: bool,
    /// Places taken under the cap (module docs); a store without a cap
    /// takes none. Relaxed: one counter changed only by read-modify-writes,
    /// publishing nothing.
    tracked: Alone<AtomicUsize>,
    /// The latest `now` a sweep judged at: the earliest origin a new client
    /// may get (module docs).
    swept: AtomicU64,
    schedule: SweepSchedule,
    /// What the cold paths did, for `stats`: each moved where its event
    /// happens, one more add on a path that makes several. Alone on its
    /// lines: every arrival writes `created`, and reads the flags above.
    pub(crate) counts: Alone<StoreCounts>,
    /// Outgrown tables' memory, given back a step per arrival.
    releases: Arc<Releases>,
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
        let releases = Arc::new(Releases::new());
        Self {
            table: TableCell::new(Table::new(capacity, grows, 0, 0, &releases)),
            // Under loom, fixed seeds: every execution of a model must probe
            // the same slots.
            #[cfg(not(floodgate_loom))]
            hasher: KeyHasher::random(),
            #[cfg(floodgate_loom)]
            hasher: KeyHasher::fixed(),
            upkeep: Alone(Mutex::new(Upkeep::default())),
            sweeping: AtomicBool::new(false),
            preparing: AtomicBool::new(false),
            grows,
            tracked: Alone(AtomicUsize::new(0)),
            swept: AtomicU64::new(0),
            schedule: SweepSchedule::new(bounds),
            counts: Alone(StoreCounts::default()),
            releases,
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
        self.find_in(key, hash, guard).map(|(_, slot)| slot)
    }

    /// As [`find`](Self::find), with the table the slot is in.
    #[inline(always)]
    fn find_in<'g, Q>(&self, key: &Q, hash: u64, guard: &'g Guard) -> Option<InTable<'g, K, C>>
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
                Probe::Found(slot) => return Some((table, slot)),
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

    /// `upkeep`, if no other thread holds it. A poisoned lock (a key's
    /// `Hash` or `Clone` panicked in a step) is taken as it is: every step
    /// leaves the store consistent where it stopped (module docs, "Panics").
    fn try_upkeep(&self) -> Option<MutexGuard<'_, Upkeep<K, C>>> {
        match self.upkeep.try_lock() {
            Ok(upkeep) => Some(upkeep),
            Err(TryLockError::Poisoned(poison)) => Some(poison.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// `upkeep`, for a call that cannot go on without it.
    ///
    /// Progress: every holder of `upkeep` gives it back after one step (a
    /// move's chunk, a sweep's chunk, a `forget`, a sweep's or a move's
    /// start), with no wait inside; an explicit sweep gives it back between
    /// its steps. So the wait lasts one step of the holder's. Under loom, a
    /// scheduling point, never a lock.
    fn upkeep(&self) -> MutexGuard<'_, Upkeep<K, C>> {
        loop {
            if let Some(upkeep) = self.try_upkeep() {
                return upkeep;
            }
            crate::sync::spin();
        }
    }

    /// A call that found its client's state retired (a move's step moving it,
    /// a sweep or `forget` removing it) yields to the thread doing that
    /// before it looks again.
    ///
    /// Progress: a state is seen retired in a slot still `FULL` only
    /// between two steps of one holder of `upkeep` with no code of the
    /// caller's in between: a move's freeze and its store of `MOVED`
    /// (`move_slot` runs the key's `Hash` and `Clone` before it freezes
    /// the state), or a sweep's retirement and its store of `DEAD`. Both
    /// always happen, so the next look finds the slot changed once that
    /// thread is scheduled. (`forget` marks the slot `DEAD` before it
    /// retires the state.) Under loom, a scheduling point.
    #[cold]
    pub(crate) fn settle(&self) {
        crate::sync::spin();
    }

    /// A call for `key` (whose [`hash`](Self::hash) is `hash`), which was
    /// not tracked, at `now`: takes one step of upkeep if one is due (a
    /// chunk of a move or of a sweep), then creates the client if there is
    /// room. `first` runs on the new client before it is published — no
    /// other thread can reach it yet — and answers the client to publish
    /// with the call's answer, which is returned if this call's insert is
    /// the one that created the client.
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
        let guard = self.table.pin();
        let mut work = Work::default();
        #[cfg(test)]
        Work::take_visits();
        if let Some(turn) = self.schedule.arrive() {
            self.begin_sweep(turn, now, &guard);
        }
        self.step(policy, &guard, &mut work);
        let cap = self.schedule.bounds().cap();
        if !self.reserve(cap) {
            let Some(cap) = cap else {
                unreachable!("reserving fails only at a cap")
            };
            if let Some(turn) = self.schedule.at_cap(cap) {
                self.begin_sweep(turn, now, &guard);
                self.step(policy, &guard, &mut work);
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
        // raise), or its slot DEAD (a Release store, `sweep_chunk`).
        let origin = now.max(self.swept.load(Ordering::Acquire));
        // The place goes back unless this call creates the client, however
        // it ends: another thread creating it first, or a panic in the
        // key's `Clone` (`to_owned`), `Eq` or `Drop`, or in a step of a
        // move this insert takes.
        let place = Place(self);
        let (client, answer) = first(policy.new_client(origin));
        let entry = Entry {
            key: key.to_owned(),
            client,
        };
        let created = self.insert(key, hash, entry, policy, &guard, &mut work);
        #[cfg(test)]
        work.record();
        if created {
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
    ///
    /// While a table is being moved, an insert goes on into `next` once
    /// its probe of the old table ends before the key on a `SEALED` slot:
    /// one the move sealed, or the `EMPTY` one the probe ended on, which the
    /// insert seals itself. From then on no insert can put the key in the
    /// old table (claims of its path's slots fail on the seal), so the key
    /// is in one table only.
    fn insert<Q>(
        &self,
        key: &Q,
        hash: u64,
        entry: Entry<K, C>,
        policy: &impl Lifecycle<C>,
        guard: &Guard,
        work: &mut Work,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let print = fingerprint(hash);
        let mut entry = Some(entry);
        let mut table = self.table.load(guard);
        // Progress: each pass returns; or goes on to a newer table, of
        // which there are finitely many; or, in a table with no room, begins
        // its move or takes a step of the move under way (`make_room`,
        // which waits only for one step of another thread's); or probes
        // again after another thread took or sealed the slot it wanted (a
        // claim or seal that succeeded, of finitely many slots); or waits
        // for a writer that publishes within a few of its own steps.
        loop {
            match table.probe(key, hash) {
                Probe::Found(_) => return false,
                Probe::Busy => self.wait_for_writer(),
                Probe::Onward => match table.next(guard) {
                    Some(next) => {
                        self.help_move(table, policy, guard, work);
                        table = next;
                    }
                    // Every slot probed and none empty: cannot happen while
                    // claims stop below the table's size, but if it did,
                    // the table needs its move as much as a full one.
                    None => self.make_room(table, policy, guard),
                },
                Probe::Vacant(index) => {
                    let slot = &table.slots[index];
                    if let Some(next) = table.next(guard) {
                        // Being moved: seal the slot the probe ended on and
                        // go on into `next` (above). Relaxed: a seal
                        // publishes nothing; a failed CAS (another thread
                        // claimed or sealed it) probes again.
                        if slot
                            .tag
                            .compare_exchange(EMPTY, SEALED, Ordering::Relaxed, Ordering::Relaxed)
                            .is_ok()
                        {
                            self.help_move(table, policy, guard, work);
                            table = next;
                        }
                        continue;
                    }
                    match self.write(table, slot, print, &mut entry) {
                        Written::Yes => return true,
                        // A racing insert may have taken the last claim for
                        // this very key: if the slot is no longer empty,
                        // probe again before making room.
                        Written::NoRoom if slot.tag.load(Ordering::Acquire) == EMPTY => {
                            self.make_room(table, policy, guard);
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
        let Some(before) = table.claim() else {
            return Written::NoRoom;
        };
        // The claim that reaches `prepare_from` asks arrivals to prepare the
        // next table (`prepare`): a flag they read on a line no insert
        // writes, where reading `claimed` itself took the line from the
        // other cores at every arrival.
        if before + 1 == table.prepare_from {
            self.preparing.store(true, Ordering::Relaxed);
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
    fn make_room(&self, table: &Table<K, C>, policy: &impl Lifecycle<C>, guard: &Guard) {
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
    fn step(&self, policy: &impl Lifecycle<C>, guard: &Guard, work: &mut Work) {
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
    /// first step, and zeroes [`TOUCH_PAGES`] more pages of it at each.
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
            .is_some_and(|prepared| prepared.fits(table, capacity))
        {
            // Memory prepared for another size (evictions changed what
            // the move needs) goes to the releases, and is made again.
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
    fn help_move(
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
    /// the size the move needs.
    fn begin_move(&self, upkeep: &mut Upkeep<K, C>, table: &Table<K, C>) {
        let reserved = table
            .room
            .saturating_sub(table.dead.load(Ordering::Relaxed));
        let capacity = self.next_capacity(table);
        let slots = match upkeep.prepared.take() {
            Some(prepared) if prepared.fits(table, capacity) => {
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
            self.grows,
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
    /// most [`SWEEP_CHUNK`], and ends the move if they were the last.
    ///
    /// A key's `Hash` and `Clone` run before its client's state is frozen,
    /// so a panic in either leaves the slot `FULL` and its state live, the
    /// slots before it moved or sealed and `cursor` at the step's start: a
    /// consistent store, whose next step visits this chunk again (a slot
    /// moved or sealed is passed over). Nothing else in a step can panic.
    fn move_chunk(&self, table: &Table<K, C>, policy: &impl Lifecycle<C>, guard: &Guard) {
        let next = table.next(guard).expect("a move is under way");
        // A table a sweep's step could visit whole moves in one step too:
        // so on the tables where the two engines must agree (module docs,
        // "Sweeps in steps"), every move ends in the arrival that began it.
        let chunk = if table.capacity() <= SWEEP_CHUNK {
            SWEEP_CHUNK
        } else {
            MOVE_CHUNK
        };
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
                    // The caller's code first: if it unwinds, nothing of
                    // this slot has changed.
                    let hash = self.hash(entry.key);
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
    pub(crate) fn forget<Q>(&self, key: &Q, retire: impl Fn(&C)) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let hash = self.hash(key);
        // Under `upkeep`, as the steps of moves and sweeps: a `FULL` slot's
        // tag then changes nowhere else, so a move needs no claim on it
        // (`move_slot`). A move may be under way: the client is then in
        // the old table or the new one, and `find` says which.
        let guard = self.table.pin();
        let _upkeep = self.upkeep();
        let Some((table, slot)) = self.find_in(key, hash, &guard) else {
            return false;
        };
        // `find_in` loaded the tag (Acquire) as FULL, and no one else may
        // change it now. Release: a probe that loads DEAD (Acquire) and then
        // reads the entry sees what this thread saw of it.
        let tag = slot.tag.load(Ordering::Relaxed);
        debug_assert_eq!(tag & STATE, FULL, "found, and only upkeep removes");
        slot.tag.store((tag & !STATE) | DEAD, Ordering::Release);
        // Counted DEAD in the slot's own table first, then the place given
        // back: so `stored <= tracked`.
        table.dead.fetch_add(1, Ordering::Relaxed);
        self.give_back(1);
        StoreCounts::add(&self.counts.forgotten, 1);
        // SAFETY: the slot was FULL (Acquire, in `find_in`); `guard` holds
        // it.
        retire(unsafe { slot.entry() }.client);
        true
    }

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
    fn begin_sweep(&self, turn: SweepTurn<'_>, now: u64, guard: &Guard) {
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
    /// `table` (current, not being moved; under `upkeep`) and removes the
    /// clients idle at the sweep's `now`; if that ended the sweep, how many
    /// it removed in all. A sweep whose table was replaced since its last
    /// step (a move ended) starts over in the new one.
    fn sweep_chunk(
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
        let end = (start + SWEEP_CHUNK).min(table.capacity());
        let mut removed = 0;
        for slot in &table.slots[start..end] {
            #[cfg(test)]
            Work::visit(1);
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

    /// How many clients hold a place (see `store::keyed`'s `len`); without
    /// a cap, how many the tables hold.
    pub(crate) fn len(&self) -> usize {
        if self.schedule.bounds().cap().is_none() {
            return self.stored();
        }
        self.tracked.load(Ordering::Relaxed)
    }

    /// How many clients the tables hold, as their claims and removals
    /// count them (module docs). O(1). During a move, the old table's
    /// clients (moved ones included) and the new one's inserts: its claims
    /// past the move's reserve, less its removals.
    pub(crate) fn stored(&self) -> usize {
        let guard = self.table.pin();
        let table = self.table.load(&guard);
        match table.next(&guard) {
            None => table.live(),
            Some(next) => {
                let inserted = next
                    .claimed
                    .load(Ordering::Relaxed)
                    .saturating_sub(next.reserved);
                (table.live() + inserted).saturating_sub(next.dead.load(Ordering::Relaxed))
            }
        }
    }
}

/// What `upkeep` guards besides the turn itself.
struct Upkeep<K, C> {
    /// The memory of the table the current one's move will fill, zeroed a
    /// few pages an arrival ahead of the move (`InlineStore::prepare`).
    prepared: Option<Prepared<K, C>>,
    /// The sweep under way, if any (module docs, "Sweeps in steps").
    round: Option<Round>,
    /// Sweeps begun so far: the last one's id.
    rounds: u64,
    /// The last sweep that ended: its id and how many clients it removed.
    finished: (u64, usize),
}

impl<K, C> Default for Upkeep<K, C> {
    fn default() -> Self {
        Self {
            prepared: None,
            round: None,
            rounds: 0,
            finished: (0, 0),
        }
    }
}

/// The memory of a table made ahead of a move, zeroed a few pages at a
/// time (`InlineStore::prepare`).
struct Prepared<K, C> {
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
    /// `capacity` slots.
    fn fits(&self, table: &Table<K, C>, capacity: usize) -> bool {
        self.replaces == table.generation && self.slots.as_ref().map(|s| s.len()) == Some(capacity)
    }

    /// Whether every slot is zeroed.
    fn is_whole(&self) -> bool {
        self.slots.as_ref().map(|slots| slots.len()) == Some(self.zeroed)
    }

    /// Zeroes the next `count` slots (all that are left, at most).
    fn zero(&mut self, count: usize) {
        let from = self.zeroed;
        let slots = self.slots();
        let to = from.saturating_add(count).min(slots.len());
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

/// A sweep that arrivals carry out a chunk at a time.
struct Round {
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

/// The upkeep one arrival has taken: at most one step of a move and one of
/// a sweep, a chunk of each (module docs, "Growing in steps").
#[derive(Default)]
struct Work {
    moved: bool,
    swept: bool,
}

/// What a thread's arrivals did, for the tests that hold each arrival to
/// the chunks: slots its steps visited, moving and sweeping.
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Visits {
    /// Slots moved of a table of at most `SWEEP_CHUNK` slots.
    pub(crate) moved: usize,
    /// Slots moved of a larger table.
    pub(crate) moved_large: usize,
    pub(crate) swept: usize,
    /// Steps taken past an arrival's own because a move had to end first
    /// (`make_room`).
    pub(crate) forced: usize,
    /// Moves into a table of at least `PREPARE_FROM` bytes that found its
    /// memory prepared and all zeroed, and that did not.
    pub(crate) prepared: usize,
    pub(crate) unprepared: usize,
}

#[cfg(test)]
thread_local! {
    /// Slots this thread's steps visited since its last arrival began.
    static VISITS: std::cell::Cell<[usize; 3]> = const { std::cell::Cell::new([0; 3]) };
    /// The most one arrival of this thread visited, of each kind.
    static MOST: std::cell::Cell<Visits> = const {
        std::cell::Cell::new(Visits {
            moved: 0,
            moved_large: 0,
            swept: 0,
            forced: 0,
            prepared: 0,
            unprepared: 0,
        })
    };
}

#[cfg(test)]
impl Work {
    fn visit(kind: usize) {
        VISITS.with(|visits| {
            let mut counts = visits.get();
            counts[kind] += 1;
            visits.set(counts);
        });
    }

    fn forced() {
        Self::note(|visits| visits.forced += 1);
    }

    /// Counts an event of this thread's in its `Visits`.
    fn note(event: impl FnOnce(&mut Visits)) {
        MOST.with(|most| {
            let mut visits = most.get();
            event(&mut visits);
            most.set(visits);
        });
    }

    /// Ends an arrival's count.
    fn record(&self) {
        let [moved, swept, moved_large] = VISITS.with(|visits| visits.replace([0; 3]));
        MOST.with(|most| {
            let before = most.get();
            most.set(Visits {
                moved: before.moved.max(moved),
                moved_large: before.moved_large.max(moved_large),
                swept: before.swept.max(swept),
                ..before
            });
        });
    }

    /// Forgets what this thread's steps visited outside an arrival (an
    /// explicit sweep, `forget`): an arrival counts its own.
    fn take_visits() {
        VISITS.with(|visits| visits.set([0; 3]));
    }

    /// This thread's most slots visited by one arrival, and its forced
    /// steps, since the last call; all start again from 0.
    pub(crate) fn take() -> Visits {
        VISITS.with(|visits| visits.set([0; 3]));
        MOST.with(|most| most.replace(Visits::default()))
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

/// The table a move under way is filling is owned by nothing but the
/// current table's `next`: freed here, with the clients placed in it (their
/// keys are clones, their states copies, so the current table's drop frees
/// its own) and those inserted there.
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
            // `Staged::into_raw` and not yet published (`begin_move`; the
            // move was under way).
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
        // Two rules in one word keep no origin (a drip rule beside a window
        // rule keeps its window's end instead), but for the wide pair, which
        // keeps it in the state, in the padding.
        use crate::policy::{PairState, WideWindowPairState, WindowPairState};
        assert_eq!(size_of::<Slot<u64, Client<PairState, ()>>>(), 32);
        assert_eq!(size_of::<Slot<u64, Client<WindowPairState, ()>>>(), 32);
        assert_eq!(size_of::<Slot<u64, Client<WideWindowPairState, ()>>>(), 48);
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

    /// A client for the store's own tests: the time of its last call, or
    /// `RETIRED`. Idle `IDLE` ticks after it.
    struct Stamp;

    const RETIRED: u64 = u64::MAX;
    const IDLE: u64 = 10_000;

    impl Lifecycle<AtomicU64> for Stamp {
        fn new_client(&self, origin: u64) -> AtomicU64 {
            AtomicU64::new(origin)
        }

        fn retire_idle(&self, client: &AtomicU64, now: u64) -> bool {
            let at = client.load(Ordering::SeqCst);
            at != RETIRED
                && now >= at + IDLE
                && client
                    .compare_exchange(at, RETIRED, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
        }

        fn relocate(&self, client: &AtomicU64) -> Option<AtomicU64> {
            let at = client.swap(RETIRED, Ordering::SeqCst);
            (at != RETIRED).then(|| AtomicU64::new(at))
        }
    }

    /// A new client `key`'s arrival at `now`; whether it was created.
    fn arrive(store: &InlineStore<u64, AtomicU64>, key: u64, now: u64) -> bool {
        let hash = store.hash(&key);
        matches!(
            store.arrive(&key, hash, now, &Stamp, |client| (client, ())),
            Arrival::Created(())
        )
    }

    /// No arrival moves more than [`MOVE_CHUNK`] slots of a table larger
    /// than [`SWEEP_CHUNK`] (a smaller one moves whole, in one step), nor
    /// sweeps more than [`SWEEP_CHUNK`], counted slot by slot, while the
    /// table grows from 64 slots to 2^21 (a million clients, fifteen
    /// moves), and no arrival is made to finish a move: every client is
    /// found after.
    #[test]
    fn growth_moves_at_most_a_chunk_per_arrival() {
        const CLIENTS: u64 = 1_000_000;
        let store = InlineStore::<u64, AtomicU64>::new(Bounds::new());
        Work::take();
        for key in 0..CLIENTS {
            assert!(arrive(&store, key, 0), "client {key}");
        }
        let most = Work::take();
        assert_eq!(most.moved, SWEEP_CHUNK, "{most:?}");
        assert_eq!(most.moved_large, MOVE_CHUNK, "{most:?}");
        assert_eq!(most.swept, 0, "{most:?}");
        assert_eq!(most.forced, 0, "{most:?}");
        // The moves into tables of 1 MiB and more (2^16 slots of 24 bytes
        // and up: six of them) found their memory prepared, all zeroed.
        assert_eq!((most.prepared, most.unprepared), (6, 0), "{most:?}");
        assert_eq!(store.counts.rebuilds.load(Ordering::Relaxed), 15);
        assert_eq!(store.stored(), CLIENTS as usize);
        for key in 0..CLIENTS {
            assert!(store.peek(&key, |_| ()).is_some(), "client {key}");
        }
    }

    /// Two threads creating 300,000 clients each at once: each arrival
    /// still moves at most a chunk, and none is forced to finish a move;
    /// every client is created once and found after.
    #[test]
    fn racing_arrivals_move_at_most_a_chunk_each() {
        const EACH: u64 = 300_000;
        let store = InlineStore::<u64, AtomicU64>::new(Bounds::new());
        let most: Vec<Visits> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..2u64)
                .map(|thread| {
                    let store = &store;
                    scope.spawn(move || {
                        Work::take();
                        for key in thread * EACH..(thread + 1) * EACH {
                            assert!(arrive(store, key, 0), "client {key}");
                        }
                        Work::take()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        for most in most {
            assert!(most.moved <= SWEEP_CHUNK, "{most:?}");
            assert!(most.moved_large <= MOVE_CHUNK, "{most:?}");
            assert_eq!(most.forced, 0, "{most:?}");
        }
        assert_eq!(store.stored(), 2 * EACH as usize);
        for key in 0..2 * EACH {
            assert!(store.peek(&key, |_| ()).is_some(), "client {key}");
        }
    }

    /// With idle eviction, a stream of one-shot clients, one tick apart:
    /// each is idle `IDLE` ticks after it came, so about `IDLE` are not
    /// idle at any time. No arrival sweeps more than [`SWEEP_CHUNK`] slots
    /// or moves more than [`MOVE_CHUNK`]; the sweeps do remove the idle
    /// ones, and the table holds at most twice the clients that are not
    /// idle, plus 64, plus one arrival per step of a sweep (module docs).
    #[test]
    fn sweeps_visit_at_most_a_chunk_per_arrival() {
        const ARRIVALS: u64 = 400_000;
        let store = InlineStore::<u64, AtomicU64>::new(Bounds::new().evict_idle());
        Work::take();
        let mut most_stored = 0;
        for key in 0..ARRIVALS {
            assert!(arrive(&store, key, key), "client {key}");
            most_stored = most_stored.max(store.stored());
        }
        let most = Work::take();
        assert!(most.swept <= SWEEP_CHUNK && most.swept > 0, "{most:?}");
        assert!(most.moved <= SWEEP_CHUNK, "{most:?}");
        assert!(most.moved_large <= MOVE_CHUNK, "{most:?}");
        assert_eq!(most.forced, 0, "{most:?}");
        let steps = store.table.load(&Guard::new()).capacity() / SWEEP_CHUNK;
        let bound = 2 * (IDLE as usize + 1) + 64 + steps;
        assert!(most_stored <= bound, "{most_stored} > {bound}");
        assert!(store.counts.sweeps.load(Ordering::Relaxed) > 10);
    }

    /// A capped store under a flood of newcomers, with clients going idle:
    /// the cap holds after every arrival, each arrival sweeps and moves
    /// at most a chunk, and a newcomer finds a place again once the sweep
    /// under way reaches idle clients.
    #[test]
    fn a_capped_flood_visits_at_most_a_chunk_per_arrival() {
        const CAP: usize = 50_000;
        let store = InlineStore::<u64, AtomicU64>::new(Bounds::new().max_clients(CAP));
        Work::take();
        let mut created = 0;
        for key in 0..1_000_000u64 {
            // One arrival a tick: the first CAP fill the cap, and each
            // client is idle IDLE ticks later, so at most IDLE are not.
            created += usize::from(arrive(&store, key, key));
            assert!(store.len() <= CAP);
        }
        let most = Work::take();
        assert!(most.swept <= SWEEP_CHUNK && most.swept > 0, "{most:?}");
        assert!(most.moved <= SWEEP_CHUNK, "{most:?}");
        assert!(most.moved_large <= MOVE_CHUNK, "{most:?}");
        assert_eq!(most.forced, 0, "{most:?}");
        // Every tick past the first IDLE frees as many places as it brings
        // newcomers; the sweeps reach them within a few thousand arrivals.
        assert!(created > 999_000, "{created} created");
    }
}
