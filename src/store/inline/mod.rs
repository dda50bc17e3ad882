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
//!  63     61 60                                                        0
//! +---------+-----------------------------------------------------------+
//! |  state  |  fingerprint: the key's hash with its top 3 bits cleared  |
//! +---------+-----------------------------------------------------------+
//! ```
//!
//! The state is on top so that the fingerprint keeps the hash's low bits,
//! where a probe starts: a move finds a client's place in the new table
//! from its tag and never hashes its key again.
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
//! sized for its cap once and is only ever moved at that size; one whose
//! cap is too large to allocate up front grows until its table holds the
//! cap, and from then on is moved at that size. No call
//! moves the whole table: each new client's arrival takes at most one
//! *step* of the move, [`MOVE_CHUNK`] slots (all of a table of at most
//! [`WHOLE_TABLE`]), and the move ends at the step that moves its last
//! slot, whichever arrival takes it. Checks of known
//! clients take no step and never wait for one.
//!
//! 1. Before the move, while the table nears its room, arrivals prepare the
//!    new table's memory a page at a time (`prepare`, which says why).
//! 2. The insert that finds no room builds the new table from that memory
//!    and publishes it as the old one's `next` (`begin_move`), with a claim
//!    taken at once for every client the move may place (`reserved`).
//! 3. Each step, under `upkeep`, moves the next slots of the old table in
//!    order (`move_slot`): an `EMPTY` one is `SEALED`; a `BUSY` one is
//!    waited for (a few of its writer's steps); a `FULL` one has its key
//!    cloned (its place in `next` comes from its tag's fingerprint: no key
//!    is hashed again), then its state frozen by the policy's retirement
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
//! below), the mapping and zeroing of a page of a table being prepared, and
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
//! [`WHOLE_TABLE`] slots is swept whole by the arrival that begins it, as
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
//! `MOVED` (the key is cloned before the freeze), a sweep's
//! retirement of a state and its `DEAD`. So each of those waits ends within
//! a few steps of the thread it waits for, which nothing can stop, and a
//! panic leaves no slot in between. `upkeep` is held for one step at a
//! time and never waited on with a lock: an arrival tries it and goes on
//! without it; the calls that cannot go on without it (an insert with no
//! room anywhere, `forget`, an explicit sweep) yield until the holder's
//! step ends. A step that unwinds (a `Clone` that panicked)
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
//!
//! [`Client`]: super::Client
//! [`MOVE_CHUNK`]: growth::MOVE_CHUNK
//! [`SWEEP_CHUNK`]: sweeps::SWEEP_CHUNK
//! [`WHOLE_TABLE`]: sweeps::WHOLE_TABLE

mod growth;
mod slots;
mod sweeps;

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, TryLockError};

use self::growth::Prepared;
pub(crate) use self::slots::Vacancy;
use self::slots::{
    fingerprint, Entry, InTable, Probe, Slot, Table, Written, BUSY, DEAD, EMPTY, FULL, SEALED,
    STATE,
};
use self::sweeps::Round;
use crate::bounds::{Bounds, SweepSchedule};
use crate::stats::StoreCounts;
use crate::store::release::Releases;
use crate::store::Arrival;
use crate::sync::{
    AtomicBool, AtomicU64, AtomicUsize, Guard, Mutex, MutexGuard, Ordering, Staged, TableCell,
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
    /// The size a table stops doubling at: for a capped store, the table
    /// that holds the cap (`capacity_for_cap`), whose room leaves an eighth
    /// of the cap free after any rebuild at the same size; without a cap,
    /// none. A cap's table of at most `MOST_PRESIZED` slots is the first
    /// table, and never grows (`grows`).
    largest: usize,
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
        let largest = bounds.cap().map_or(usize::MAX, Self::capacity_for_cap);
        let capacity = match largest {
            // The room (7/8 of the slots) exceeds the cap by at least 1/8
            // of it and one, so the DEAD slots evictions leave behind are
            // dropped by a rebuild at most once per cap/8 + 1 new clients,
            // and the table never needs to grow.
            capacity if capacity <= MOST_PRESIZED => capacity,
            // A cap too large to allocate for up front: grow towards it.
            _ => FIRST_CAPACITY,
        };
        let grows = largest > MOST_PRESIZED;
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
            largest,
            tracked: Alone(AtomicUsize::new(0)),
            swept: AtomicU64::new(0),
            schedule: SweepSchedule::new(bounds),
            counts: Alone(StoreCounts::default()),
            releases,
        }
    }

    /// Whether the store's table grows: it has no cap, or one too large
    /// to allocate for up front.
    fn grows(&self) -> bool {
        self.largest > MOST_PRESIZED
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
    /// is moving to, with its table; or, if the key is not tracked, the
    /// vacancy its probe stopped at (none if its last table had no empty
    /// slot on its path).
    #[inline(always)]
    fn find_in<'g, Q>(
        &self,
        key: &Q,
        hash: u64,
        guard: &'g Guard,
    ) -> Result<InTable<'g, K, C>, Option<Vacancy>>
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
                Probe::Found(slot) => return Ok((table, slot)),
                Probe::Vacant(index) => return Err(Some(table.vacancy(index))),
                Probe::Onward => table = table.next(guard).ok_or(None)?,
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
        self.peek_or_vacancy(key, hash, visit).ok()
    }

    /// [`peek_hashed`](Self::peek_hashed), answering for a key that is
    /// not tracked where its probe stopped, for the
    /// [`arrive`](Self::arrive) that creates it.
    #[inline(always)]
    pub(crate) fn peek_or_vacancy<Q, R>(
        &self,
        key: &Q,
        hash: u64,
        visit: impl FnOnce(&C) -> R,
    ) -> Result<R, Option<Vacancy>>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let guard = self.table.pin();
        let (_, slot) = self.find_in(key, hash, &guard)?;
        // SAFETY: `find_in` answers only slots it loaded (Acquire) as FULL,
        // and `guard` holds their table.
        Ok(visit(unsafe { slot.entry() }.client))
    }

    /// `upkeep`, if no other thread holds it. A poisoned lock (a key's
    /// `Clone` panicked in a step) is taken as it is: every step
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
    ///
    /// `vacancy` is where a look-up of `key` just stopped, if the caller
    /// made one ([`peek_or_vacancy`](Self::peek_or_vacancy)): the insert
    /// probes on from there if the table is still the one looked in.
    #[cold]
    #[inline(never)]
    pub(crate) fn arrive<Q, R>(
        &self,
        vacancy: Option<Vacancy>,
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
        let created = self.insert(key, hash, vacancy, entry, policy, &guard, &mut work);
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
    ///
    /// The first probe begins at `vacancy`, where the caller's look-up of
    /// this key stopped, if that was in the table the insert begins in
    /// (`Table::probe_from`; tables never share a generation, so a table
    /// made since at the same address is not mistaken for it). It finds
    /// what a probe from the path's start would: the look-up passed every
    /// slot before the vacancy and found none `EMPTY` (it stops at the
    /// first), none `SEALED` (it would have gone on to `next`), and none
    /// with this key but `DEAD` ones (it would have answered a `FULL` or
    /// `MOVED` one, and waited on a `BUSY` one with its fingerprint). Such
    /// a slot never becomes this key's later: a claim takes only an `EMPTY`
    /// slot, a key's slot turns `FULL` only from its own claim, and the
    /// changes those slots can still see (`FULL` to `MOVED` or `DEAD`,
    /// `BUSY` to `FULL` with another key) are ones a probe passes over for
    /// another key. So a probe from the start would pass the same slots and
    /// begin deciding at the vacancy, as this one does.
    #[allow(clippy::too_many_arguments)]
    fn insert<Q>(
        &self,
        key: &Q,
        hash: u64,
        mut vacancy: Option<Vacancy>,
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
            let probe = match vacancy.take() {
                Some(vacancy) => table.probe_from(key, hash, vacancy),
                None => table.probe(key, hash),
            };
            match probe {
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
        let Ok((table, slot)) = self.find_in(key, hash, &guard) else {
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
    /// Slots moved of a table of at most `WHOLE_TABLE` slots.
    pub(crate) moved: usize,
    /// Slots moved of a larger table.
    pub(crate) moved_large: usize,
    /// Slots swept of a table of at most `WHOLE_TABLE` slots, and of a
    /// larger one.
    pub(crate) swept: usize,
    pub(crate) swept_large: usize,
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
    static VISITS: std::cell::Cell<[usize; 4]> = const { std::cell::Cell::new([0; 4]) };
    /// The most one arrival of this thread visited, of each kind.
    static MOST: std::cell::Cell<Visits> = const {
        std::cell::Cell::new(Visits {
            moved: 0,
            moved_large: 0,
            swept: 0,
            swept_large: 0,
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
        let [moved, swept, moved_large, swept_large] = VISITS.with(|visits| visits.replace([0; 4]));
        MOST.with(|most| {
            let before = most.get();
            most.set(Visits {
                moved: before.moved.max(moved),
                moved_large: before.moved_large.max(moved_large),
                swept: before.swept.max(swept),
                swept_large: before.swept_large.max(swept_large),
                ..before
            });
        });
    }

    /// Forgets what this thread's steps visited outside an arrival (an
    /// explicit sweep, `forget`): an arrival counts its own.
    fn take_visits() {
        VISITS.with(|visits| visits.set([0; 4]));
    }

    /// This thread's most slots visited by one arrival, and its forced
    /// steps, since the last call; all start again from 0.
    pub(crate) fn take() -> Visits {
        VISITS.with(|visits| visits.set([0; 4]));
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
mod tests;
