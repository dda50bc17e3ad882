//! Reclamation of the inline store's outgrown tables, with a pin and unpin
//! that cost three plain stores.
//!
//! Every check of a known client pins the table it reads, so the pin is on
//! the hot path. The epoch collectors of the field (`sdd`, which `scc` is
//! built on, `crossbeam-epoch`, and `seize`, papaya's) each spend one locked
//! instruction per pin or unpin, a full barrier on x86: on a hot `gcra`
//! check that was 7 of its 22 ns (`benches/README.md`, "The pin"). Tables
//! are retired rarely (once per rebuild), so here the retiring side pays:
//!
//! * a **pin** stores its store's scope and the current epoch into the
//!   thread's own [`Record`] with plain stores, and an **unpin** stores 0;
//! * a **collect**, before it reads the records, makes every running thread
//!   of the process pass a full memory barrier, with Linux's
//!   `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` — the asymmetric barrier
//!   of folly's hazard pointers and of `seize`. Where that is not available
//!   (another OS, an old kernel, a filtered syscall) a pin issues a SeqCst
//!   fence instead, and the collect one too: the same proof, paid per pin.
//!   Where the expedited command was registered and is refused later (a
//!   seccomp filter on that one command), a collect uses
//!   `MEMBARRIER_CMD_GLOBAL`, the same barrier for every thread of the
//!   system, slower and needing no registration; if that is refused too,
//!   nothing can be freed safely any more, and the process is told so on
//!   standard error, once (`heavy_barrier`).
//!
//! # Why nothing is freed while a pin can reach it
//!
//! A table is **retired** after it stopped being current: the epoch moves
//! on to `e` (a read-modify-write, AcqRel) and the table is garbage of
//! epoch `e`. A collect frees garbage of epoch `e` only if every record it
//! reads holds 0 (not pinned) or an epoch of at least `e`:
//!
//! * A pin that read an epoch of at least `e` (Acquire) synchronised with
//!   the retire's read-modify-write, which came after the table was
//!   replaced: everything it loads sees a newer table, and a newer table's
//!   `next` leads only to newer ones. It cannot reach the garbage.
//! * A pin that read an older epoch stored it, then passed its barrier,
//!   then loaded the table. The collect passes its own barrier before it
//!   reads the record. The pair of barriers acts as two SeqCst fences
//!   (`membarrier(2)`: every thread runs a full barrier between the
//!   caller's earlier and later accesses): if the collect's read misses the
//!   pin's store, the pin's barrier came after the collect's, so the pin's
//!   table load sees the replacement, which happened before the collect
//!   (the retire pushed the garbage under the lock the collect takes). If
//!   the read sees the store, the garbage is kept until the record reads 0
//!   or a newer epoch. The unpin's Release store of 0 follows every read
//!   the pin made, and the collect's Acquire load of that 0 orders the
//!   free after them.
//!
//! # Scopes: what a stuck pin holds back
//!
//! Each store has a scope of its own (`new_scope`), and a pin records the
//! scope of the store it was taken in beside its epoch; garbage records
//! the scope of the store it came from. A pin holds back only garbage of
//! its own scope: tables of another store are never reached under it. So a
//! pin held for ever (a thread stopped inside a call: a debugger, a key's
//! `Eq` that never returns) keeps alive what its own store retires from
//! then on, nothing of any other store. The bound is per store: a store
//! whose call is stuck keeps each table it retires after that. Those it
//! outgrows double, so they add up to less than its current table; a
//! rebuild at the same size (a capped store's, or a growing store's after
//! evictions left `DEAD` slots) keeps one table of that size, and takes at
//! least an eighth of a table's new clients to come about. Every other
//! store's are freed as ever.
//!
//! A pin nested in a pin of another store (a key's `Hash` that checks
//! another limiter) keeps the outer pin's epoch and widens its scope to
//! every store (`EVERY_STORE`) until the outer pin ends: a Release store
//! before the nested pin's barrier, so a collect that misses it is one
//! whose barrier came first, and the nested pin's loads then see every
//! replacement that collect's garbage came from (the argument above). A
//! collect reads each record's epoch (Acquire) and then its scope
//! (Acquire): the scope is stored (Release) before the epoch, so a collect
//! that reads a pin's epoch reads that pin's scope or a later pin's, and a
//! later pin's scope is stored (Release) after the earlier pin's last read,
//! which the collect's free is then ordered after.
//!
//! Frames (`crate::frame`, several rules' states) are retired here too,
//! rarely and in bags (a thread's spares when it exits, dropped clients'
//! frames 64 at a time), as garbage of every store: a frame moves from
//! client to client of any store, so any pin may be reading one, and every
//! pin holds them back. A read of a frame under a pin of some store keeps
//! that pin as it is (`Guard::frames`), without widening it.
//!
//! A collect never waits: what it cannot free yet stays, and the next
//! unpin that sees `pending` tries again (at most once every
//! [`RETRY_EVERY`] unpins of a thread, so a thread stalled inside a pin
//! does not make the others' unpins a syscall each).
//!
//! # Nesting, threads, loom
//!
//! A pin nested in another of the same thread (a key's `Hash` that checks
//! another limiter) leaves the record as the outer pin set it, with the
//! older epoch, and the outer pin unpins. A thread's record goes back when
//! the thread exits and is reused by the next one; a pin taken after that,
//! from another thread-local's destructor, borrows a record for itself.
//!
//! The loom models (`loom-tests/tests/epoch.rs`) run the fallback path:
//! both barriers are SeqCst fences, which loom models; that membarrier may
//! stand in for the pin's fence is the kernel's guarantee above. On that
//! path the fence alone already orders the pin after a replacement whose
//! epoch it read, so loom cannot fail a Relaxed load of the epoch; with
//! membarrier, only the load's Acquire does.

use crate::sync::{fence, AtomicBool, AtomicU32, AtomicU64, Mutex, MutexGuard, Ordering};

/// How many unpins a thread lets pass between two attempts to free what a
/// collect had to keep.
const RETRY_EVERY: u32 = 64;

/// Epoch 0 is "not pinned": the epoch starts at 1 and only grows (2^64
/// rebuilds are never reached).
const UNPINNED: u64 = 0;

/// The scope of a pin that may reach any store's tables (a pin nested in
/// a pin of another store), and of garbage that any pin may reach. Stores'
/// own scopes start at 1 ([`new_scope`]).
pub const EVERY_STORE: u64 = 0;

/// What the collector keeps until it may free it: the epoch it was
/// retired at, the store whose pins may reach it, and the thing itself.
type Garbage = (u64, u64, Box<dyn Send>);

/// Frees outgrown tables once no pin can reach them.
pub struct Collector {
    /// The current epoch: moved on by every retire.
    epoch: AtomicU64,
    /// Every thread's record, once registered: read by collects, extended
    /// by registrations. Records are never freed, only reused.
    records: Mutex<Vec<&'static Record>>,
    /// What was retired and not yet freed, with its epoch.
    garbage: Mutex<Vec<Garbage>>,
    /// `garbage` is not empty: unpins try to collect. Relaxed: a hint,
    /// never what makes a free safe.
    pending: AtomicBool,
}

/// One thread's pin: written by its thread, read by collects.
pub struct Record {
    /// The epoch the thread pinned at, or [`UNPINNED`]. A pin taken while
    /// the thread holds one already (a nested pin) leaves it as it is.
    pinned: AtomicU64,
    /// The store the outermost pin is in ([`EVERY_STORE`] once a pin of
    /// another store nested in it): only that store's garbage is held back
    /// by this pin. Written by the owner before `pinned`, and read by
    /// collects after it (Release/Acquire both ways, module docs).
    scope: AtomicU64,
    /// Unpins left before the next attempt to collect (owner only).
    countdown: AtomicU32,
    /// Owned by a thread (or by a guard taken during thread exit).
    in_use: AtomicBool,
    /// Taken for one pin alone (a pin during thread exit): given back when
    /// that pin ends (owner only).
    lent: AtomicBool,
    /// The pin's barrier: a compiler fence where collects use membarrier,
    /// else a SeqCst fence. Fixed at the record's making, from the same
    /// once-decided answer collects use ([`Collector::asymmetric`]).
    asymmetric: bool,
}

/// A pin on a collector of its own, with the thread's record passed in:
/// the loom models' and the tests' form of the store's [`Guard`]. While it
/// lives, no table loaded under it is freed. Not `Send`: it is undone on
/// the thread that took it.
#[cfg(any(test, floodgate_loom))]
pub struct Pin<'c> {
    collector: &'c Collector,
    /// The record this pin set, or `None` for a pin nested in another of
    /// the same thread (the outer one unpins).
    record: Option<&'static Record>,
    _not_send: std::marker::PhantomData<*const ()>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

impl Collector {
    /// A collector with nothing retired (`const`: the process's is a
    /// static).
    #[cfg(not(floodgate_loom))]
    pub(crate) const fn new() -> Self {
        Self {
            epoch: AtomicU64::new(1),
            records: Mutex::new(Vec::new()),
            garbage: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
        }
    }

    /// A collector with nothing retired, one per model (loom's atomics
    /// cannot be made in a `const`).
    #[cfg(floodgate_loom)]
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Self {
            epoch: AtomicU64::new(1),
            records: Mutex::new(Vec::new()),
            garbage: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
        }
    }

    /// A record for the calling thread: a free one reused, or a new one
    /// (leaked: records live as long as the process, one per thread alive
    /// at once).
    pub fn register(&self) -> &'static Record {
        let mut records = lock(&self.records);
        for record in records.iter() {
            if record
                .in_use
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return record;
            }
        }
        let record: &'static Record = Box::leak(Box::new(Record {
            pinned: AtomicU64::new(UNPINNED),
            scope: AtomicU64::new(EVERY_STORE),
            countdown: AtomicU32::new(0),
            in_use: AtomicBool::new(true),
            lent: AtomicBool::new(false),
            asymmetric: Self::asymmetric(),
        }));
        records.push(record);
        record
    }

    /// Pins `record` (the calling thread's): tables loaded until the pin
    /// is dropped stay alive.
    #[cfg(any(test, floodgate_loom))]
    pub fn pin(&self, record: &'static Record) -> Pin<'_> {
        self.pin_in(record, EVERY_STORE)
    }

    /// As [`pin`](Self::pin), for tables of the store `scope` only.
    #[cfg(any(test, floodgate_loom))]
    pub fn pin_in(&self, record: &'static Record, scope: u64) -> Pin<'_> {
        Pin {
            collector: self,
            record: self.enter(record, scope).then_some(record),
            _not_send: std::marker::PhantomData,
        }
    }

    /// Pins `record` for the tables of the store `scope` unless it is
    /// pinned already (a nested pin keeps the outer one's epoch, which is
    /// older and so covers everything the inner one may load, and widens
    /// its scope to every store if the inner one is in another): true if
    /// this call pinned it.
    #[inline]
    fn enter(&self, record: &Record, scope: u64) -> bool {
        // Relaxed: only the owning thread writes its record's `pinned`.
        if record.pinned.load(Ordering::Relaxed) != UNPINNED {
            if record.scope.load(Ordering::Relaxed) != scope {
                self.widen(record);
            }
            return false;
        }
        // Acquire: see the table replacements of every retire up to this
        // epoch (module docs). Release stores: a collect that reads this
        // `pinned` (Acquire) reads this scope or a later one; one that
        // reads the scope reads it after every access of the pins before.
        // Both are ordered before the table loads by the barrier below.
        let epoch = self.epoch.load(Ordering::Acquire);
        record.scope.store(scope, Ordering::Release);
        record.pinned.store(epoch, Ordering::Release);
        light_barrier(record.asymmetric);
        true
    }

    /// A pin of another store nested in this record's: from now until the
    /// outer pin ends, it holds back every store's garbage. Ordered before
    /// the nested pin's table loads by the barrier, as a pin's own store
    /// is (module docs).
    #[cold]
    fn widen(&self, record: &Record) {
        record.scope.store(EVERY_STORE, Ordering::Release);
        light_barrier(record.asymmetric);
    }

    /// Unpins `record`, which [`enter`](Self::enter) pinned.
    #[inline]
    fn leave(&self, record: &Record) {
        // Release: every read made under the pin comes before a collect
        // that reads this 0 (module docs).
        record.pinned.store(UNPINNED, Ordering::Release);
        if self.pending.load(Ordering::Relaxed) {
            self.retry(record);
        }
        if record.lent.load(Ordering::Relaxed) {
            record.lent.store(false, Ordering::Relaxed);
            record.release();
        }
    }

    /// An unpin that found garbage waiting: collects, at most once every
    /// [`RETRY_EVERY`] unpins of this record.
    #[cold]
    #[inline(never)]
    fn retry(&self, record: &Record) {
        let left = record.countdown.load(Ordering::Relaxed);
        if left == 0 {
            record.countdown.store(RETRY_EVERY, Ordering::Relaxed);
            self.collect();
        } else {
            record.countdown.store(left - 1, Ordering::Relaxed);
        }
    }

    /// Hands over `garbage`, which no new pin can reach any more (it was
    /// replaced before this call), to be freed once no older pin is held.
    #[cfg(any(test, floodgate_loom))]
    pub fn retire(&self, garbage: Box<dyn Send>) {
        self.retire_in(garbage, EVERY_STORE);
    }

    /// As `retire`, for garbage that only pins of the store `scope` (and
    /// pins of every store) can reach.
    pub fn retire_in(&self, garbage: Box<dyn Send>, scope: u64) {
        let mut list = lock(&self.garbage);
        // AcqRel: Release so that a pin which reads the new epoch sees the
        // replacement made before this call; the list's lock orders the
        // pushes of concurrent retires.
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        list.push((epoch, scope, garbage));
        self.pending.store(true, Ordering::Relaxed);
        self.collect_locked(list);
    }

    /// Frees what no pin can reach any more; a no-op if another thread is
    /// collecting.
    pub fn collect(&self) {
        if let Ok(list) = self.garbage.try_lock() {
            self.collect_locked(list);
        }
    }

    /// Whether everything retired has been freed.
    #[cfg(any(test, floodgate_loom))]
    pub fn is_empty(&self) -> bool {
        lock(&self.garbage).is_empty()
    }

    fn collect_locked(&self, mut list: MutexGuard<'_, Vec<Garbage>>) {
        if list.is_empty() || !heavy_barrier() {
            return;
        }
        // Each pin held: its epoch and the store it may reach.
        let pins: Vec<(u64, u64)> = lock(&self.records)
            .iter()
            .filter_map(|record| {
                // Acquire: a 0 read here follows the unpin's reads (module
                // docs); an epoch read here comes with its pin's scope, or
                // a later one, which is stored only after this pin ended.
                let epoch = record.pinned.load(Ordering::Acquire);
                (epoch != UNPINNED).then(|| (epoch, record.scope.load(Ordering::Acquire)))
            })
            .collect();
        // A pin holds back garbage retired after it began, of its store
        // (or of every store: nested, or garbage of no one store).
        let held = |&(retired, scope, _): &Garbage| {
            pins.iter().any(|&(pinned, reach)| {
                pinned < retired && (reach == EVERY_STORE || scope == EVERY_STORE || reach == scope)
            })
        };
        let mut free = Vec::new();
        let mut index = 0;
        while index < list.len() {
            if held(&list[index]) {
                index += 1;
            } else {
                free.push(list.swap_remove(index));
            }
        }
        self.pending.store(!list.is_empty(), Ordering::Relaxed);
        drop(list);
        // Freed outside the lock: a table's drop frees its slots' keys.
        drop(free);
    }

    /// Whether collects use membarrier (and pins a compiler fence): decided
    /// once per process, before the first record is made.
    #[cfg(all(not(floodgate_loom), any(target_os = "linux", target_os = "android")))]
    fn asymmetric() -> bool {
        use rustix::thread::{membarrier, membarrier_query, MembarrierCommand};
        static ASYMMETRIC: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ASYMMETRIC.get_or_init(|| {
            membarrier_query().contains_command(MembarrierCommand::PrivateExpedited)
                && membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok()
        })
    }

    /// Fences on both sides: loom models these, and other systems have no
    /// membarrier here.
    #[cfg(any(floodgate_loom, not(any(target_os = "linux", target_os = "android"))))]
    fn asymmetric() -> bool {
        false
    }
}

impl Record {
    /// Gives the record back for another thread to use: only when no pin
    /// of it is alive (a pin outliving its thread's local is kept pinned
    /// until it drops, and the record is then simply never reused).
    pub fn release(&self) {
        if self.pinned.load(Ordering::Relaxed) == UNPINNED {
            // Release: this thread's last unpin comes before the next
            // owner's first pin.
            self.in_use.store(false, Ordering::Release);
        }
    }
}

#[cfg(any(test, floodgate_loom))]
impl Drop for Pin<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(record) = self.record {
            self.collector.leave(record);
        }
    }
}

/// The pin's side of the barrier pair.
#[inline]
fn light_barrier(asymmetric: bool) {
    if asymmetric {
        // The collect's membarrier supplies the full barrier (module docs);
        // this only keeps the compiler from moving the pin's store past
        // the table loads.
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The collect's side: false if the barrier could not be made (nothing may
/// be freed then).
///
/// The expedited command can fail after its registration succeeded (a
/// seccomp filter on that one command): the pins, which fence only for the
/// compiler, then need another barrier of the same strength, and
/// `MEMBARRIER_CMD_GLOBAL` is one (every running thread of the system
/// passes a full barrier; it needs no registration, and is slower, which
/// a collect, once per rebuild, can afford). If that fails too, no barrier
/// can be had: nothing is freed from then on, and the process is told so
/// on standard error, once.
#[cfg(all(not(floodgate_loom), any(target_os = "linux", target_os = "android")))]
fn heavy_barrier() -> bool {
    use rustix::thread::{membarrier, MembarrierCommand};
    if !Collector::asymmetric() {
        fence(Ordering::SeqCst);
        return true;
    }
    registered_barrier(
        || membarrier(MembarrierCommand::PrivateExpedited),
        || membarrier(MembarrierCommand::Global),
    )
}

/// [`heavy_barrier`] once membarrier was registered: the expedited
/// command, else the global one, else false (and the process told).
#[cfg(all(not(floodgate_loom), any(target_os = "linux", target_os = "android")))]
fn registered_barrier(
    expedited: impl FnOnce() -> rustix::io::Result<()>,
    global: impl FnOnce() -> rustix::io::Result<()>,
) -> bool {
    let Err(expedited) = expedited() else {
        return true;
    };
    let Err(global) = global() else {
        return true;
    };
    static TOLD: std::sync::Once = std::sync::Once::new();
    TOLD.call_once(|| {
        eprintln!(
            "floodgate: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed after it was \
             registered ({expedited}), and MEMBARRIER_CMD_GLOBAL too ({global}): the \
             limiters' outgrown tables will not be freed in this process"
        );
    });
    false
}

#[cfg(any(floodgate_loom, not(any(target_os = "linux", target_os = "android"))))]
fn heavy_barrier() -> bool {
    fence(Ordering::SeqCst);
    true
}

/// The process's collector, and each thread's record in it.
#[cfg(not(floodgate_loom))]
mod global {
    use std::cell::Cell;

    use super::{Collector, Ordering, Record, EVERY_STORE};
    use std::sync::atomic::AtomicU64;

    static COLLECTOR: Collector = Collector::new();

    /// The scope of a frames pin (`Guard::frames`): no store's, so it
    /// reaches no table (stores' scopes count up from 1 and never get here).
    const FRAMES_ONLY: u64 = u64::MAX;

    thread_local! {
        /// The calling thread's record. A `const` cell of a type with no
        /// destructor, so that reading it is one load with no lazy-init or
        /// destroyed check (`Owner` gives the record back).
        static RECORD: Cell<Option<&'static Record>> = const { Cell::new(None) };
        /// Gives the thread's record back when the thread exits.
        static OWNER: Owner = const { Owner };
    }

    struct Owner;

    impl Drop for Owner {
        fn drop(&mut self) {
            if let Some(record) = RECORD.with(Cell::take) {
                record.release();
            }
        }
    }

    /// A pin of the calling thread on the process's collector. Neither
    /// `Send` nor `Sync` (the raw-pointer marker): `enter` and `leave`
    /// assume that only the record's own thread writes its `pinned`, so a
    /// guard must be dropped on the thread that took it.
    pub(crate) struct Guard(
        Option<&'static Record>,
        std::marker::PhantomData<*const ()>,
        /// The scope it was taken for, for `reaches`.
        u64,
    );

    impl Guard {
        /// A pin that holds back every store's garbage.
        #[inline]
        pub(crate) fn new() -> Self {
            Self::in_store(EVERY_STORE)
        }

        /// A pin for the tables of the store `scope` ([`new_scope`]).
        #[inline]
        pub(crate) fn in_store(scope: u64) -> Self {
            let record = match RECORD.get() {
                Some(record) => record,
                None => first_record(),
            };
            Guard(
                COLLECTOR.enter(record, scope).then_some(record),
                std::marker::PhantomData,
                scope,
            )
        }

        /// A pin under which frames (`crate::frame`) are read. Frames
        /// are garbage of every store, which any pin holds back, so a pin
        /// the thread holds already, of any store, is kept as it is (not
        /// widened, as `in_store` would); else one of every store is taken.
        /// It reaches no store's tables (`FRAMES_ONLY`).
        #[inline(always)]
        pub(crate) fn frames() -> Self {
            let record = match RECORD.get() {
                Some(record) => record,
                None => first_record(),
            };
            // Relaxed: only this thread writes its record's `pinned`.
            let pinned = record.pinned.load(Ordering::Relaxed) != super::UNPINNED;
            Guard(
                (!pinned && COLLECTOR.enter(record, EVERY_STORE)).then_some(record),
                std::marker::PhantomData,
                FRAMES_ONLY,
            )
        }

        /// Whether tables of the store `scope` may be loaded under it.
        pub(crate) fn reaches(&self, scope: u64) -> bool {
            self.2 == EVERY_STORE || self.2 == scope
        }
    }

    impl Drop for Guard {
        #[inline]
        fn drop(&mut self) {
            if let Some(record) = self.0 {
                COLLECTOR.leave(record);
            }
        }
    }

    /// The thread's first pin registers its record, to be given back at
    /// thread exit. A pin taken after that (from another thread-local's
    /// destructor) gets a record of its own, given back when it ends.
    #[cold]
    #[inline(never)]
    fn first_record() -> &'static Record {
        let record = COLLECTOR.register();
        if OWNER.try_with(|_| ()).is_ok() {
            RECORD.set(Some(record));
        } else {
            record.lent.store(true, Ordering::Relaxed);
        }
        record
    }

    /// See [`Collector::retire_in`].
    pub(crate) fn retire_in(garbage: Box<dyn Send>, scope: u64) {
        COLLECTOR.retire_in(garbage, scope);
    }

    /// A scope of its own for a new store: what its pins hold back, and
    /// what holds its garbage back.
    pub(crate) fn new_scope() -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(EVERY_STORE + 1);
        // Relaxed: a unique number is all it gives.
        NEXT.fetch_add(1, Ordering::Relaxed)
    }

    /// See [`Collector::collect`].
    pub(crate) fn collect() {
        COLLECTOR.collect();
    }

    #[cfg(test)]
    mod tests {
        use super::{Guard, RECORD};
        use std::cell::RefCell;
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;

        /// Pins from its destructor, which runs after the thread gave its
        /// record back.
        struct Late(Arc<AtomicBool>);

        impl Drop for Late {
            fn drop(&mut self) {
                assert!(RECORD.get().is_none(), "the record was given back first");
                let guard = Guard::new();
                let record = guard.0.expect("an outermost pin");
                assert!(record.lent.load(Ordering::Relaxed));
                assert_ne!(
                    record.pinned.load(Ordering::Relaxed),
                    super::super::UNPINNED
                );
                drop(guard);
                assert!(
                    !record.lent.load(Ordering::Relaxed),
                    "given back at the unpin"
                );
                self.0.store(true, Ordering::Relaxed);
            }
        }

        thread_local! {
            static LATE: RefCell<Option<Late>> = const { RefCell::new(None) };
        }

        /// A thread-local destructor that checks a limiter after the
        /// thread's record went back gets a record of its own for that pin
        /// (thread-local destructors run in the reverse order of their
        /// registration: `LATE` is registered before the first pin).
        #[test]
        fn a_pin_during_thread_exit_borrows_a_record() {
            let ran = Arc::new(AtomicBool::new(false));
            let flag = Arc::clone(&ran);
            std::thread::spawn(move || {
                LATE.with(|late| *late.borrow_mut() = Some(Late(flag)));
                drop(Guard::new());
                assert!(RECORD.get().is_some());
            })
            .join()
            .unwrap();
            assert!(ran.load(Ordering::Relaxed));
        }
    }
}

#[cfg(not(floodgate_loom))]
pub(crate) use global::{collect, new_scope, retire_in, Guard};

// The tests stand in for the store's table cell, raw pointers and all.
#[cfg(all(test, not(floodgate_loom)))]
#[allow(unsafe_code)]
mod tests {
    use super::Collector;
    use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A table stand-in that counts its frees.
    struct Table {
        canary: AtomicU64,
        frees: Arc<AtomicUsize>,
    }

    const ALIVE: u64 = 0x5afe_5afe_5afe_5afe;

    impl Drop for Table {
        fn drop(&mut self) {
            self.canary.store(0, Ordering::Relaxed);
            self.frees.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Two threads pin and read the current table while the main thread
    /// replaces it 20,000 times, on this process's barrier (membarrier where
    /// the kernel has it): every read sees a live table, and once the
    /// readers are gone every outgrown table has been freed, each once.
    #[test]
    fn every_outgrown_table_is_freed_once_and_never_under_a_pin() {
        static COLLECTOR: Collector = Collector::new();
        let frees = Arc::new(AtomicUsize::new(0));
        let table = |frees: &Arc<AtomicUsize>| {
            Box::into_raw(Box::new(Table {
                canary: AtomicU64::new(ALIVE),
                frees: Arc::clone(frees),
            }))
        };
        let current = Arc::new(AtomicPtr::new(table(&frees)));
        let stop = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (current, stop) = (Arc::clone(&current), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let record = COLLECTOR.register();
                    let mut reads = 0u64;
                    while stop.load(Ordering::Relaxed) == 0 {
                        let _pin = COLLECTOR.pin(record);
                        // SAFETY: freed only by the collector, after this
                        // pin (the property under test).
                        let table = unsafe { &*current.load(Ordering::Acquire) };
                        assert_eq!(table.canary.load(Ordering::Relaxed), ALIVE);
                        // Hold the pin a while, as a check that misses
                        // the cache does: a free that ignored it lands
                        // inside this window.
                        for _ in 0..64 {
                            std::hint::spin_loop();
                        }
                        assert_eq!(table.canary.load(Ordering::Relaxed), ALIVE);
                        reads += 1;
                    }
                    record.release();
                    reads
                })
            })
            .collect();
        const REPLACED: usize = 20_000;
        for _ in 0..REPLACED {
            let old = current.swap(table(&frees), Ordering::AcqRel);
            // SAFETY: swapped out above, so owned here once.
            COLLECTOR.retire(unsafe { Box::from_raw(old) });
        }
        stop.store(1, Ordering::Relaxed);
        let reads: u64 = readers
            .into_iter()
            .map(|reader| reader.join().unwrap())
            .sum();
        assert!(reads > 0);
        COLLECTOR.collect();
        assert!(COLLECTOR.is_empty(), "kept after every pin ended");
        assert_eq!(frees.load(Ordering::Relaxed), REPLACED);
        // SAFETY: the last table was never retired; nothing reads it now.
        drop(unsafe { Box::from_raw(current.load(Ordering::Acquire)) });
        assert_eq!(frees.load(Ordering::Relaxed), REPLACED + 1);
    }

    /// A record is given back when its thread is done and reused by the
    /// next: a thousand short-lived threads in turn leave one record, not a
    /// thousand.
    #[test]
    fn records_of_finished_threads_are_reused() {
        static COLLECTOR: Collector = Collector::new();
        for _ in 0..1_000 {
            std::thread::spawn(|| {
                let record = COLLECTOR.register();
                drop(COLLECTOR.pin(record));
                record.release();
            })
            .join()
            .unwrap();
        }
        assert_eq!(super::lock(&COLLECTOR.records).len(), 1);
    }

    /// An expedited barrier refused after registration falls back to the
    /// global one; with both refused, none is made (and nothing is freed).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_refused_expedited_barrier_falls_back_to_the_global_one() {
        use rustix::io::Errno;
        assert!(super::registered_barrier(|| Ok(()), || unreachable!()));
        assert!(super::registered_barrier(|| Err(Errno::PERM), || Ok(())));
        assert!(!super::registered_barrier(
            || Err(Errno::PERM),
            || Err(Errno::NOSYS)
        ));
    }

    /// A pin held for ever in one store holds back that store's garbage,
    /// and garbage of no one store, but not another store's; and once a pin
    /// of another store nested in it, every store's.
    #[test]
    fn a_stuck_pin_holds_back_its_own_store_only() {
        static COLLECTOR: Collector = Collector::new();
        let frees = Arc::new(AtomicUsize::new(0));
        let garbage = || {
            Box::new(Table {
                canary: AtomicU64::new(ALIVE),
                frees: Arc::clone(&frees),
            })
        };
        let record = COLLECTOR.register();
        let stuck = COLLECTOR.pin_in(record, 7);
        COLLECTOR.retire_in(garbage(), 8);
        assert_eq!(frees.load(Ordering::Relaxed), 1, "another store's: freed");
        COLLECTOR.retire_in(garbage(), 7);
        COLLECTOR.retire(garbage());
        assert_eq!(
            frees.load(Ordering::Relaxed),
            1,
            "its own, and no one's: kept"
        );
        let nested = COLLECTOR.pin_in(record, 8);
        drop(nested);
        COLLECTOR.retire_in(garbage(), 9);
        assert_eq!(
            frees.load(Ordering::Relaxed),
            1,
            "widened: every store's kept"
        );
        drop(stuck);
        COLLECTOR.collect();
        assert_eq!(frees.load(Ordering::Relaxed), 4);
        assert!(COLLECTOR.is_empty());
    }

    /// Nested pins on one thread: only the outermost unpins.
    #[test]
    fn a_nested_pin_keeps_the_outer_one() {
        static COLLECTOR: Collector = Collector::new();
        let record = COLLECTOR.register();
        let outer = COLLECTOR.pin(record);
        let pinned = record.pinned.load(Ordering::Relaxed);
        assert_ne!(pinned, super::UNPINNED);
        drop(COLLECTOR.pin(record));
        assert_eq!(record.pinned.load(Ordering::Relaxed), pinned);
        drop(outer);
        assert_eq!(record.pinned.load(Ordering::Relaxed), super::UNPINNED);
    }
}
