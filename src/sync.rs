//! The only file that names std or loom atomics. Everything else imports
//! `crate::sync`, so the loom models check the very code the library ships.
//!
//! Under `--cfg floodgate_loom` the atomics come from `loom`. Loom has no
//! 128-bit atomic, so there `AtomicU128` is a word behind a loom mutex: every
//! operation on it is one indivisible step, which is exactly what the
//! hardware's 16-byte compare-and-swap gives (FIXME: loom does not model the
//! memory ordering of that emulation; the 128-bit operations used here are
//! sequentially consistent on x86-64 and AArch64 anyway).
//!
//! The same goes for the keyed store's map. `scc::HashIndex` is not
//! loom-aware, so under the cfg [`ClientIndex`] is a list of entries behind a
//! loom mutex with the two operations the store uses, `insert_sync` and
//! `peek_with`, and their contracts: an insert of a key that is present fails
//! and hands the pair back; a peek runs its reader on a shared value outside
//! any lock, as `peek_with` does. The store's create protocol — build a
//! candidate, insert it, on losing the race use the winner's — then runs
//! unchanged with every step visible to loom.

#[cfg(not(floodgate_loom))]
pub(crate) use core::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(floodgate_loom))]
pub(crate) use portable_atomic::AtomicU128;

#[cfg(floodgate_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};

#[cfg(floodgate_loom)]
pub(crate) use self::loom_u128::AtomicU128;

/// The keyed store's map: client key → shared client state.
#[cfg(not(floodgate_loom))]
pub(crate) type ClientIndex<K, V> = scc::HashIndex<K, V, ahash::RandomState>;

#[cfg(floodgate_loom)]
pub(crate) use self::loom_index::ClientIndex;

#[cfg(floodgate_loom)]
mod loom_u128 {
    use super::Ordering;

    /// A 128-bit word whose every operation is one step under loom.
    #[derive(Debug)]
    pub(crate) struct AtomicU128(loom::sync::Mutex<u128>);

    impl AtomicU128 {
        pub(crate) fn new(value: u128) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn load(&self, _: Ordering) -> u128 {
            *self.0.lock().unwrap()
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
    use scc::Equivalent;

    /// The keyed store's map under loom: each operation is one step on a
    /// loom mutex, so loom explores every order of the create protocol's
    /// inserts and peeks. A linear scan is enough for the few keys of a
    /// model.
    pub(crate) struct ClientIndex<K, V>(loom::sync::Mutex<Vec<(K, V)>>);

    impl<K, V> Default for ClientIndex<K, V> {
        fn default() -> Self {
            Self(loom::sync::Mutex::new(Vec::new()))
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

        pub(crate) fn len(&self) -> usize {
            self.0.lock().unwrap().len()
        }
    }
}
