//! The only file that names std, loom or shuttle atomics. Everything else
//! imports `crate::sync`, so the models check the very code the library
//! ships.
//!
//! Under `--cfg floodgate_loom` the atomics come from `loom`. Loom has no
//! 128-bit atomic, so there `AtomicU128` is a word behind a loom mutex, and
//! the tiers' map is a list behind another. Each stand-in makes every
//! operation one indivisible step, which is what the real ones give, but
//! each also hides something; what, and why the models still prove what
//! they claim, follows.
//!
//! Under `--cfg floodgate_shuttle` too (always set with `floodgate_loom`,
//! so every model-only choice elsewhere applies unchanged) the same
//! stand-ins run on `shuttle`'s atomics, mutexes and yield (`model` below),
//! for the models in `shuttle-tests/`: too large for loom to exhaust (more
//! threads and calls, a table growth and a sweep in one run), so shuttle's
//! PCT scheduler samples their schedules instead. That proves nothing, but
//! each run finds a bug that needs `d` particular steps in order with
//! probability at least `1/(n·k^(d-1))` (`n` threads, `k` steps), so a
//! bug of small depth is found within a bounded number of runs, however
//! large the model. The stand-ins hide what they hide under loom; and
//! shuttle runs every atomic as `SeqCst` (its fences do nothing), so the
//! orderings are left to the loom models.
//!
//! # What the 128-bit stand-in cannot see
//!
//! * **Its own orderings.** The `Ordering` arguments are ignored. A loom
//!   mutex orders every operation on the word after every earlier one, loads
//!   included, and always shows the latest value: stronger than the
//!   `Acquire` loads and `AcqRel` compare-and-swaps the code asks for (a
//!   real `Acquire` load releases nothing to the next writer, and may read a
//!   value that is not the latest). So a model cannot catch an ordering on a
//!   128-bit word that is too weak for what some other location needs, nor a
//!   stale read of the word.
//! * **Orderings between a 128-bit word and other locations.** Whatever a
//!   thread wrote anywhere before an operation on the word is visible to the
//!   next thread that locks it, whether or not the real orderings would make
//!   it so.
//!
//! Why the protocols do not lean on what it hides:
//!
//! * `fixed-window` and `sliding-window-counter` read and write one word per
//!   decision and nothing else (`cell::transition`, `cell::read`,
//!   `cell::retire_if`): each decision is a pure step on the value its CAS
//!   expects, and a CAS is a read-modify-write, which reads the latest value
//!   whatever the ordering. A stale load only makes the CAS fail and the
//!   step run again; a stale read for `remaining` is a value the word held.
//!   No other location is read on the strength of that word.
//! * `sliding-window`'s live path validates every slot it reads by the
//!   sequence number stored in the same 128-bit word (`SlidingWindowState::
//!   read`, `snapshot`): a slot that does not hold the admission asked for is
//!   `Moved` and the read starts again, and an admission is one CAS that
//!   expects the frontier slot exactly. Its `committed` counter (a real loom
//!   atomic) is only a hint: a stale or lagging value fails a sequence check
//!   and is retried or moved on. A stale read costs a retry, never a wrong
//!   answer, so the models' verdicts on admissions and `remaining` stand.
//! * **Not so the sliding log's frozen path.** After a ring is retired,
//!   `frozen_remaining` reads the admissions below the marked frontier by
//!   position (`frozen_time`), without a sequence check: it relies on
//!   happens-before from each admission's CAS (Release) through the hint's
//!   AcqRel CASes and the retiring CAS to the reader's Acquire load that saw
//!   the mark. That is a cross-location ordering, and the stand-in makes it
//!   hold whatever the orderings say: the loom models (the tier carry-overs)
//!   check what the frozen path computes, not that its orderings suffice.
//!   That part rests on the argument just given.
//!
//! * **Nor the frames' validated reads** (`frame`, several rules). A
//!   reader copies a frame's words (real loom atomics) between two loads
//!   of the client's 128-bit control word, and a thread that reuses a
//!   replaced frame stores into it after a Release fence; that a copy
//!   which saw such a store also sees the changed control word is a
//!   cross-location ordering (the fences pair up), and the stand-in makes
//!   it hold whatever the fences say. The model of a frame being reused
//!   (`a_recycled_frame_is_never_read_as_its_old_client`) checks that
//!   every copy is validated (without the second load it fails), not that
//!   the fences suffice; that rests on `frame`'s argument, the seqlock's.
//!   Under the models a thread's spare frames are loom's thread-locals
//!   (`thread_local` below), since a model's threads are not threads of
//!   their own.
//!
//! * **Nor a refunded log's new ring** (`policy::sliding_window`, "Giving
//!   units back"). The refund writes the new ring (loom atomics) and then
//!   marks the old ring's frontier (a 128-bit word) with its address; a
//!   thread that loads the mark stores that address into the link (another
//!   128-bit word), and readers load the link before they read the ring.
//!   The new ring's contents reach them through Release and Acquire on two
//!   128-bit words, a cross-location chain the stand-in makes hold
//!   whatever the orderings say. The models
//!   (`two_refunds_of_one_admission_give_each_unit_back_once` and the
//!   log's runs of the refund models) check which ring each call decides
//!   on, not that the orderings suffice; that rests on the module's
//!   argument (the refund's mark is `AcqRel`, every load of a slot and of
//!   the link is `Acquire`, and the link's CAS is `AcqRel`).
//!
//! (FIXME: loom does not model the orderings of the 128-bit words; the
//! frozen path's, the frames' and a refunded log's rest on the arguments
//! above, not on the models. Nor can the
//! hardware be relied on to hide the gap: on AArch64 an `Acquire` load of a
//! 128-bit word may be a load-acquire pair, weaker than the mutex.)
//!
//! # What the table stand-in cannot see
//!
//! The limiter's inline store (`store::inline`) runs under loom as it ships:
//! its slot tags, claims, seals and moves are loom atomics, its upkeep
//! lock a loom mutex, and a new table has two slots, moved one slot a step,
//! so the models grow it and race a move left half done. Two things are
//! stood in for, and one is left out:
//!
//! * **Reclamation.** Under the cfg [`TableCell`] keeps every table it
//!   ever held until it is dropped, and [`Guard`] is empty, so the table
//!   models check that a rebuild loses and double-counts nothing, not when
//!   an outgrown table may be freed. That has models of its own
//!   (`loom-tests/tests/epoch.rs`), on the collector itself
//!   (`store::epoch`), which every reader reaches a table under: a table
//!   is retired only after it stopped being current and freed only once
//!   no pin taken before that is held, and a reader holds its pin (the
//!   current table, or an outgrown one's `next`) for as long as it uses
//!   the slot.
//! * **The entries' memory.** A slot's key and client are written through
//!   a std `UnsafeCell`, which loom does not track; what makes them safe to
//!   read is that the write happens before the Release store of the tag
//!   that every reader loads with Acquire first, and that loom does check.
//! * **Left out: preparing a table's memory and giving it back**
//!   (`InlineStore::prepare`, `store::release`). Both only touch memory no
//!   other thread can reach (a table not yet published, a table already
//!   freed), and a loom model's tables are a few slots of no pages, so
//!   under the cfg they never run.
//!
//! The waits are not stood in for. A thread that meets a slot being
//! written (`BUSY`) or a state being moved or removed yields and looks
//! again, under loom as in production ([`spin`]): loom schedules around
//! each spin, so a wait for a step that never comes is a model that never
//! ends, which loom reports. The one lock, `upkeep` (the steps of moves
//! and sweeps, `forget`), is a loom mutex, as it is a mutex in
//! production; no check takes it, and no call waits on it as a lock: it is
//! tried, and a call that must have it spins until the holder's one step
//! ends, as loom sees. One limit of loom's scheduler shapes the models: two threads
//! spinning on one write at once hand the turn to each other, never to the
//! writer, so such a model never ends however right the code is. The loom
//! models keep at most one thread able to wait on a write at a time; the
//! shuttle models, whose scheduler lowers a yielding thread below every
//! other, run three and four.
//!
//! # What the map stand-in cannot see
//!
//! `scc::HashIndex` is not loom-aware, so under the cfg [`ClientIndex`] is a
//! list of entries behind a loom mutex with the operations the store uses
//! (`insert_sync`, `peek_with`, `remove_if_sync`, `retain_sync`) and their
//! contracts: an insert of a key that is present fails and hands the pair
//! back; a peek runs its reader on a shared value outside any lock, as
//! `peek_with` does. The store's create protocol — build a candidate,
//! insert it, on losing the race use the winner's — then runs unchanged
//! with every step visible to loom.
//!
//! What it hides: `HashIndex` relocates entries while it resizes, and a
//! lock-free `peek_with` may then return the old copy of a value (scc's
//! docs: a possibly stale snapshot); the stand-in never resizes and always
//! shows the one current entry. The store is still right on the real map
//! because its values are `Arc<Client>` and never change in place: an old
//! copy of an entry is a pointer to the same client, so every decision made
//! through it lands in the same atomic words, and a retired state is seen
//! retired through any copy. No state lives in the map's slots themselves;
//! the one value that is ever replaced (a tier's carry-over, through
//! [`replace_if`]) replaces a retired state, so a reader holding the old
//! copy sees the mark and looks again. The stand-in also runs `retain_sync`
//! as one step over every entry, where the real one locks one bucket at a
//! time; the store judges each entry on its own, by one CAS under that
//! entry's bucket lock, so nothing rests on a sweep being one step.

#[cfg(not(floodgate_loom))]
pub(crate) use core::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(floodgate_loom))]
pub(crate) use portable_atomic::AtomicU128;
#[cfg(not(floodgate_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
// Loom does not model `OnceLock`; the one it guards (the shared overflow
// state) is set once and then only read, so std's is used under loom too.
pub(crate) use std::sync::OnceLock;

/// The counters of `stats`: std's atomics under the models too. A counter
/// only counts (Relaxed adds, read for reporting), so no model's verdict
/// rests on it, and leaving it out keeps the models' schedules to the steps
/// that decide something.
pub(crate) mod counter {
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
}

/// The model checker the stand-ins run on: loom, or shuttle when
/// `floodgate_shuttle` is set as well. Both name their types as std does,
/// so one set of paths serves either.
#[cfg(all(floodgate_loom, not(floodgate_shuttle)))]
use loom as model;
#[cfg(all(floodgate_loom, floodgate_shuttle))]
use shuttle as model;

#[cfg(floodgate_loom)]
pub(crate) use self::model::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(floodgate_loom)]
pub(crate) use self::model::sync::{Mutex, MutexGuard};

/// Thread-locals under the models: theirs, since a model's threads are not
/// threads of their own (`frame`'s spares; std's `thread_local!` elsewhere).
#[cfg(floodgate_loom)]
pub(crate) use self::model::thread_local;

/// Lets the thread whose step this one waits for run: a wait of the cold
/// path only (a slot being filled, moved or removed by another thread),
/// which a known client's check reaches only while its own state is being
/// moved or removed. Each caller says beside it which step of which thread
/// ends its wait, and why that step always comes.
///
/// Under loom, loom's yield: a scheduling point that lets loom run the
/// other threads, so a wait is modelled as the spin it is, and a wait whose
/// step never comes is a model that never ends (which loom reports), not a
/// lock that hides it. Under shuttle, shuttle's: its PCT scheduler lowers
/// the yielding thread below every other, so the spin lets the others run.
#[inline]
pub(crate) fn spin() {
    #[cfg(not(floodgate_loom))]
    std::thread::yield_now();
    #[cfg(floodgate_loom)]
    model::thread::yield_now();
}

/// A thread's pin on the inline store's tables: while one is held, no
/// table it loaded is freed (`store::epoch`: an epoch pin of two plain
/// stores, its barrier paid by the rare collect).
#[cfg(not(floodgate_loom))]
pub(crate) use crate::store::epoch::Guard;

/// The current table of the inline store, reclaimed by epochs
/// (`store::epoch`).
#[cfg(not(floodgate_loom))]
pub(crate) use self::epoch_table::{Staged, TableCell};

#[cfg(not(floodgate_loom))]
#[allow(unsafe_code)]
mod epoch_table {
    use super::{AtomicPtr, Guard, Ordering};
    use crate::store::epoch;

    /// A table built but not yet published: owned here, reachable by
    /// pointer (an outgrown table's `next`) while it is being filled. A
    /// box does not move its contents, so that pointer stays good when the
    /// box becomes the current table.
    pub(crate) type Staged<T> = Box<T>;

    /// The pointer to the current table, always a `Box` this cell owns.
    /// Replacing it hands the old table to the epoch collector, which
    /// frees it once no pin of this store (`scope`) taken before the
    /// replacement is held. `Send` and `Sync` as the `Box<T>` it owns is
    /// (the marker): it hands out `&T` to any thread, and drops a `T`.
    pub(crate) struct TableCell<T> {
        current: AtomicPtr<T>,
        /// This store's scope in the collector (`epoch::new_scope`).
        scope: u64,
        _owns: std::marker::PhantomData<Box<T>>,
    }

    impl<T> TableCell<T> {
        pub(crate) fn new(value: T) -> Self {
            Self {
                current: AtomicPtr::new(Box::into_raw(Box::new(value))),
                scope: epoch::new_scope(),
                _owns: std::marker::PhantomData,
            }
        }

        /// A pin of the calling thread for this store's tables: a stuck
        /// one holds back no other store's (`store::epoch`).
        #[inline]
        pub(crate) fn pin(&self) -> Guard {
            Guard::in_store(self.scope)
        }

        /// Makes a table that is not yet published.
        pub(crate) fn stage(value: T) -> Staged<T> {
            Box::new(value)
        }

        /// The current table, alive as long as `guard`. Acquire pairs with
        /// `publish`'s swap: a reader sees the table as it was built.
        #[inline]
        pub(crate) fn load<'g>(&self, guard: &'g Guard) -> &'g T {
            debug_assert!(guard.reaches(self.scope), "a pin of another store");
            // SAFETY: the pointer came from `Box::into_raw` and is freed
            // only by the collector, after a `publish` replaced it and
            // every pin of this store (or of every store) taken before that
            // was dropped (`store::epoch`'s module docs); `guard` is such a
            // pin, held for `'g`. Or by `drop`, which no borrow of the cell
            // outlives.
            unsafe { &*self.current.load(Ordering::Acquire) }
        }

        /// Makes `table` the current one and retires the old one.
        pub(crate) fn publish(&self, table: Staged<T>)
        where
            T: Send + 'static,
        {
            // AcqRel: Release publishes the new table's contents; Acquire
            // takes the old one's for its drop.
            let old = self.current.swap(Box::into_raw(table), Ordering::AcqRel);
            // SAFETY: `old` came from `Box::into_raw` (`new` or an earlier
            // `publish`) and the swap took it out of the cell, so it is
            // owned here once; pins of this store that still read it keep
            // it from being freed (`epoch::retire_in`).
            epoch::retire_in(unsafe { Box::from_raw(old) }, self.scope);
        }
    }

    /// The current table goes with the store, at once: `&mut self` means no
    /// thread holds it (a reader borrows the store for as long as it reads
    /// a slot), so there is nothing to wait for, and the heap a dropped
    /// limiter held is back when the drop returns, outgrown tables too
    /// unless a pin older than their retirement is still held.
    impl<T> Drop for TableCell<T> {
        fn drop(&mut self) {
            // SAFETY: the pointer came from `Box::into_raw`, no reference
            // to it outlives `&mut self` (above), and the cell is not used
            // again.
            drop(unsafe { Box::from_raw(*self.current.get_mut()) });
            epoch::collect();
        }
    }
}

#[cfg(floodgate_loom)]
pub(crate) use self::loom_table::{Guard, Staged, TableCell};

#[cfg(floodgate_loom)]
#[allow(unsafe_code)]
mod loom_table {
    use super::{AtomicPtr, Mutex, Ordering};

    /// No reclamation under loom: every table lives until the store does
    /// (sync.rs's module docs, "What the table stand-in cannot see").
    pub(crate) struct Guard;

    impl Guard {
        pub(crate) fn new() -> Self {
            Guard
        }
    }

    pub(crate) type Staged<T> = Box<T>;

    /// The current table as a loom pointer; outgrown tables are kept.
    pub(crate) struct TableCell<T> {
        current: AtomicPtr<T>,
        every: Mutex<Vec<*mut T>>,
    }

    // SAFETY: the raw pointers are `Box`es this cell owns; sharing the cell
    // shares `&T` only, as an `Arc<T>` would.
    unsafe impl<T: Send + Sync> Send for TableCell<T> {}
    // SAFETY: as above.
    unsafe impl<T: Send + Sync> Sync for TableCell<T> {}

    impl<T> TableCell<T> {
        pub(crate) fn new(value: T) -> Self {
            let table = Box::into_raw(Box::new(value));
            Self {
                current: AtomicPtr::new(table),
                every: Mutex::new(vec![table]),
            }
        }

        pub(crate) fn stage(value: T) -> Staged<T> {
            Box::new(value)
        }

        pub(crate) fn pin(&self) -> Guard {
            Guard::new()
        }

        pub(crate) fn load<'g>(&self, _: &'g Guard) -> &'g T {
            // SAFETY: every table this cell ever held is freed only when
            // the cell is dropped, which no holder of `&self` outlives.
            unsafe { &*self.current.load(Ordering::Acquire) }
        }

        pub(crate) fn publish(&self, table: Staged<T>) {
            let table = Box::into_raw(table);
            self.every.lock().unwrap().push(table);
            self.current.store(table, Ordering::Release);
        }
    }

    impl<T> Drop for TableCell<T> {
        fn drop(&mut self) {
            for table in self.every.get_mut().unwrap().drain(..) {
                // SAFETY: each came from `Box::into_raw` once, and nothing
                // borrows the cell any more.
                drop(unsafe { Box::from_raw(table) });
            }
        }
    }
}

#[cfg(floodgate_loom)]
pub(crate) use self::loom_u128::AtomicU128;

/// Whether the hardware's 128-bit CAS backs `portable-atomic`'s
/// `AtomicU128` (see `cell::wide_cas_is_lock_free`). Always asks
/// `portable-atomic`, under loom too: it is a fact about the machine, not a
/// step of any model.
pub(crate) fn native_u128_is_lock_free() -> bool {
    portable_atomic::AtomicU128::is_lock_free()
}

/// The tiers' map (`store::keyed`): client key → shared client state.
#[cfg(not(floodgate_loom))]
pub(crate) type ClientIndex<K, V> = scc::HashIndex<K, V, ahash::RandomState>;

#[cfg(floodgate_loom)]
pub(crate) use self::loom_index::ClientIndex;

/// A read-mostly pointer to a shared value: `arc-swap`'s, whose `load` is
/// lock-free. Under loom, a loom mutex around an `Arc` (arc-swap keeps
/// per-thread state loom does not see), so a swap racing a load is one of
/// loom's steps.
#[cfg(not(floodgate_loom))]
pub(crate) type SwapCell<T> = arc_swap::ArcSwap<T>;

#[cfg(floodgate_loom)]
pub(crate) use self::loom_swap::SwapCell;

#[cfg(floodgate_loom)]
mod loom_swap {
    use super::Mutex;
    use std::sync::Arc;

    /// `ArcSwap`'s three operations the tiers use, as single loom steps.
    pub(crate) struct SwapCell<T>(Mutex<Arc<T>>);

    impl<T> SwapCell<T> {
        pub(crate) fn from_pointee(value: T) -> Self {
            Self(Mutex::new(Arc::new(value)))
        }

        pub(crate) fn load(&self) -> Arc<T> {
            Arc::clone(&self.0.lock().unwrap())
        }

        pub(crate) fn load_full(&self) -> Arc<T> {
            self.load()
        }

        pub(crate) fn store(&self, value: Arc<T>) {
            *self.0.lock().unwrap() = value;
        }
    }
}

/// Replaces `key`'s value by `value` if `condition` holds for the present
/// one, under the bucket's lock; whether it did. Lock-free readers see the
/// old value or the new one.
#[cfg(not(floodgate_loom))]
pub(crate) fn replace_if<K, V, Q>(
    index: &ClientIndex<K, V>,
    key: &Q,
    condition: impl FnOnce(&V) -> bool,
    value: V,
) -> bool
where
    K: Eq + std::hash::Hash + Clone + 'static,
    V: Clone + 'static,
    Q: ?Sized + std::hash::Hash + scc::Equivalent<K>,
{
    match index.get_sync(key) {
        Some(mut entry) if condition(entry.get()) => {
            entry.update(value);
            true
        }
        _ => false,
    }
}

#[cfg(floodgate_loom)]
pub(crate) use self::loom_index::replace_if;

#[cfg(floodgate_loom)]
mod loom_u128 {
    use super::{Mutex, Ordering};

    /// A 128-bit word whose every operation is one step under loom.
    #[derive(Debug)]
    pub(crate) struct AtomicU128(Mutex<u128>);

    impl AtomicU128 {
        pub(crate) fn new(value: u128) -> Self {
            Self(Mutex::new(value))
        }

        pub(crate) fn load(&self, _: Ordering) -> u128 {
            *self.0.lock().unwrap()
        }

        pub(crate) fn into_inner(self) -> u128 {
            self.0.into_inner().unwrap()
        }

        pub(crate) fn compare_exchange_weak(
            &self,
            current: u128,
            new: u128,
            success: Ordering,
            failure: Ordering,
        ) -> Result<u128, u128> {
            self.compare_exchange(current, new, success, failure)
        }

        pub(crate) fn compare_exchange(
            &self,
            current: u128,
            new: u128,
            _: Ordering,
            _: Ordering,
        ) -> Result<u128, u128> {
            let mut word = self.0.lock().unwrap();
            if *word == current {
                *word = new;
                Ok(current)
            } else {
                Err(*word)
            }
        }
    }
}

#[cfg(floodgate_loom)]
mod loom_index {
    use super::Mutex;
    use scc::Equivalent;

    /// The keyed store's map under loom: each operation is one step on a
    /// loom mutex, so loom explores every order of the create protocol's
    /// inserts and peeks. A linear scan is enough for the few keys of a
    /// model.
    pub(crate) struct ClientIndex<K, V>(Mutex<Vec<(K, V)>>);

    impl<K, V> Default for ClientIndex<K, V> {
        fn default() -> Self {
            Self(Mutex::new(Vec::new()))
        }
    }

    impl<K: Clone + Eq, V: Clone> ClientIndex<K, V> {
        /// As `HashIndex::insert_sync`: fails, handing the pair back, if
        /// `key` is present.
        pub(crate) fn insert_sync(&self, key: K, value: V) -> Result<(), (K, V)> {
            let mut entries = self.0.lock().unwrap();
            if entries.iter().any(|(present, _)| *present == key) {
                return Err((key, value));
            }
            entries.push((key, value));
            Ok(())
        }

        /// As `HashIndex::peek_with`: `reader` runs on a copy of the entry
        /// (the values are `Arc`s, so a copy is the same state) after the
        /// lock is released, as it runs under no lock in production.
        pub(crate) fn peek_with<Q, R>(&self, key: &Q, reader: impl FnOnce(&K, &V) -> R) -> Option<R>
        where
            Q: ?Sized + Equivalent<K>,
        {
            let entry = self
                .0
                .lock()
                .unwrap()
                .iter()
                .find(|(present, _)| key.equivalent(present))
                .cloned();
            entry.map(|(key, value)| reader(&key, &value))
        }

        /// As `HashIndex::remove_if_sync`: removes `key` if `condition`
        /// holds for its value, under the lock.
        pub(crate) fn remove_if_sync<Q, F>(&self, key: &Q, condition: F) -> bool
        where
            Q: ?Sized + Equivalent<K>,
            F: FnOnce(&V) -> bool,
        {
            let mut entries = self.0.lock().unwrap();
            match entries
                .iter()
                .position(|(present, _)| key.equivalent(present))
            {
                Some(at) if condition(&entries[at].1) => {
                    entries.swap_remove(at);
                    true
                }
                _ => false,
            }
        }

        /// As `HashIndex::retain_sync`: keeps the entries `keep` accepts.
        pub(crate) fn retain_sync(&self, mut keep: impl FnMut(&K, &V) -> bool) {
            self.0
                .lock()
                .unwrap()
                .retain(|(key, value)| keep(key, value));
        }
    }

    /// As `crate::sync::replace_if` on the real map.
    pub(crate) fn replace_if<K, V, Q>(
        index: &ClientIndex<K, V>,
        key: &Q,
        condition: impl FnOnce(&V) -> bool,
        value: V,
    ) -> bool
    where
        Q: ?Sized + Equivalent<K>,
    {
        let mut entries = index.0.lock().unwrap();
        match entries
            .iter_mut()
            .find(|(present, _)| key.equivalent(present))
        {
            Some((_, present)) if condition(present) => {
                *present = value;
                true
            }
            _ => false,
        }
    }
}
