//! The tiers' keyed store: client key → that client's state, in an
//! `scc::HashIndex` hashed by a randomly seeded `ahash`, with the bounds of
//! [`crate::bounds`] (idle sweeps, a cap). A tier client's state is replaced
//! whole when its tier's rule changes (the carry-over), so it lives behind
//! an `Arc` here; a [`Limiter`](crate::Limiter)'s clients live inline in
//! `store::inline`'s table.
//!
//! # What is lock-free
//!
//! A call for a known client is one `HashIndex::peek_with`: no lock, not even
//! a bucket's shared lock, and no allocation. `HashIndex` may relocate a
//! value while resizing, and a reader may then see the old copy; so the value
//! is an `Arc` — copies of it are pointers to the one state, and updates made
//! through any of them land in the same atomic words.
//!
//! Creating a client takes the bucket's lock inside `insert_sync`. Threads
//! that race to create the same client each build a candidate, exactly one
//! insert succeeds, and the others drop theirs and use the winner's: every
//! client has exactly one state.
//!
//! # Removing clients
//!
//! A client leaves the map only after its state was *retired* (`cell`'s
//! module docs): a sweep retires an idle state with one CAS, which fails if
//! any decision was stored since it was judged idle, and only then removes
//! the entry. A call that still holds the entry sees the mark on its next
//! CAS, removes the entry if the sweep has not yet, and looks the client up
//! again — so no admission is ever made on a state that has left the map.
//!
//! # Sweeps and time
//!
//! A sweep judges idleness at its own `now`, and a caller on a real clock
//! may carry a `now` a little older than that. A client created after a
//! sweep therefore never gets an origin earlier than the latest time any
//! sweep judged at (`swept`, which only grows): a stale call that finds its
//! client evicted meets a fresh state that starts where the evicted one was
//! judged, never a younger one that would let it through again (a sliding
//! log admitted at 0 and evicted at 1000 must not admit a call read at 999
//! as if the window started there).
//!
//! # The cap
//!
//! `tracked` counts places: clients in the map plus places reserved by
//! inserts in flight. A new client reserves its place (one CAS that fails at
//! the cap) before it is inserted, and a sweep gives the places of the
//! clients it removed back only after `retain_sync` has removed them, so
//! `tracked` never passes the cap and the map never holds more than
//! `tracked` says.
//!
//! `stored` counts the map's entries as only completed map operations move
//! them: +1 after an `insert_sync` that returned `Ok`, −1 per entry after
//! the `retain_sync` or `remove_if_sync` that removed it has returned. It is
//! built from what the map did, not from the reservations, so it is what a
//! test watches to see the cap hold (a bug in `reserve` moves `stored` past
//! the cap while `tracked` may not move at all). The relations, where
//! `inserting` is the number of threads between an `insert_sync` that
//! returned `Ok` and their increment, and `removing` the entries removed by
//! calls that have not yet subtracted them:
//!
//! * `map − inserting + removing = stored`: the map's length and `stored`
//!   differ only by the operations completed but not yet counted;
//! * `stored <= tracked`, place by place: the thread that inserts a client
//!   has reserved its place before it increments `stored`, and a sweep
//!   subtracts what it removed from `stored` before it gives those places
//!   back; what moves only one of the two (a failed insert's reservation
//!   and its return, the removal of an entry retired by someone else) never
//!   lifts `stored` above `tracked`. The two are separate Relaxed counters:
//!   the relation holds along each thread's own order of its updates, and
//!   two loads by an onlooker are not one snapshot of both;
//! * so `stored <= tracked <= cap`; in a quiet moment (no call in flight)
//!   `stored` is the map's length, and it equals `tracked` unless an entry
//!   retired by someone else was removed (its place is its retirer's to
//!   give back).

use std::hash::Hash;
use std::sync::Arc;

use scc::Equivalent;

use crate::bounds::{Bounds, SweepSchedule, SweepTurn};
use crate::stats::StoreCounts;
use crate::store::Arrival;
use crate::sync::{self, AtomicU64, AtomicUsize, ClientIndex, Ordering};

/// One client: when it was created, and its policy state.
#[derive(Debug)]
pub(crate) struct Client<S, O = u64> {
    /// The `now` of the call that created it. Policies measure time from
    /// here, so their state words hold small relative times. The
    /// limiter's store keeps none (`O = ()`) for the policies whose states
    /// count from tick 0 (`Policy::Origin`); the tiers' store always keeps
    /// it.
    pub(crate) origin: O,
    pub(crate) state: S,
}

/// Client key → shared client state.
pub(crate) struct KeyedStore<K, S> {
    /// `scc::HashIndex` hashed by a randomly seeded `ahash` (a loom-visible
    /// stand-in under the loom cfg; see `crate::sync`).
    clients: ClientIndex<K, Arc<Client<S>>>,
    /// Places taken under the cap (module docs, "The cap"). Relaxed: it is
    /// one counter changed only by read-modify-writes, which are totally
    /// ordered whatever the ordering; nothing else is published through it.
    tracked: AtomicUsize,
    /// The latest `now` a sweep judged at (module docs, "Sweeps and time"):
    /// the earliest origin a new client may get.
    swept: AtomicU64,
    /// The map's entries, as completed inserts and removals count them
    /// (module docs, "The cap"). Relaxed for the same reason as `tracked`:
    /// a lone counter moved only by read-modify-writes, publishing nothing.
    stored: AtomicUsize,
    schedule: SweepSchedule,
    /// What the cold paths did, for `stats` (module `stats`).
    pub(crate) counts: StoreCounts,
}

impl<K, S> KeyedStore<K, S>
where
    K: Hash + Eq + Clone + 'static,
    S: 'static,
{
    pub(crate) fn new(bounds: Bounds) -> Self {
        Self {
            // `HashIndex::default()` is `with_hasher(RandomState::default())`,
            // and ahash's `default()` is `new()`: a randomly seeded hasher, so
            // ids crafted to collide in one process do not in another.
            clients: ClientIndex::default(),
            tracked: AtomicUsize::new(0),
            swept: AtomicU64::new(0),
            stored: AtomicUsize::new(0),
            schedule: SweepSchedule::new(bounds),
            counts: StoreCounts::default(),
        }
    }

    pub(crate) fn bounds(&self) -> Bounds {
        self.schedule.bounds()
    }

    /// Runs `visit` on `key`'s client, if it is tracked.
    #[inline]
    pub(crate) fn peek<Q, R>(&self, key: &Q, visit: impl FnOnce(&Client<S>) -> R) -> Option<R>
    where
        Q: ?Sized + Hash + Equivalent<K>,
    {
        self.clients.peek_with(key, |_, client| visit(client))
    }

    /// A call for `key`, which was not tracked, at `now`: sweeps first if a
    /// sweep is due, then creates the client if there is room.
    ///
    /// `retire_idle(client, now)` retires the client's state if it is idle
    /// at `now` and says whether it did; `retired(state)` tells a retired
    /// state.
    #[cold]
    #[inline(never)]
    pub(crate) fn arrive<Q>(
        &self,
        key: &Q,
        now: u64,
        new_state: impl FnOnce() -> S,
        retire_idle: impl Fn(&Client<S>, u64) -> bool,
        retired: impl Fn(&S) -> bool,
    ) -> Arrival<Arc<Client<S>>>
    where
        Q: ?Sized + Hash + Equivalent<K> + ToOwned<Owned = K>,
    {
        if let Some(turn) = self.schedule.arrive() {
            self.sweep_turn(turn, now, &retire_idle, &retired);
        }
        let cap = self.schedule.bounds().cap();
        if !self.reserve(cap) {
            let Some(cap) = cap else {
                unreachable!("reserving fails only at a cap")
            };
            if let Some(turn) = self.schedule.at_cap(cap) {
                self.sweep_turn(turn, now, &retire_idle, &retired);
            }
            if !self.reserve(Some(cap)) {
                // A racing first call may have created this very client.
                return if self.clients.peek_with(key, |_, _| ()).is_some() {
                    Arrival::Raced
                } else {
                    self.counts
                        .cap_reached(cap, self.schedule.bounds().overflow());
                    Arrival::Full
                };
            }
        }
        // Acquire pairs with the Release of the sweep that raised `swept`:
        // a caller that learned its client was evicted — through the
        // retired mark (an Acquire load of the state word, written after
        // `swept` was raised) or through the map (scc publishes a removal
        // with Release and reads it with Acquire) — sees that sweep's time.
        let origin = now.max(self.swept.load(Ordering::Acquire));
        let candidate = Arc::new(Client {
            origin,
            state: new_state(),
        });
        match self
            .clients
            .insert_sync(key.to_owned(), Arc::clone(&candidate))
        {
            Ok(()) => {
                self.stored.fetch_add(1, Ordering::Relaxed);
                StoreCounts::add(&self.counts.created, 1);
                Arrival::Created(candidate)
            }
            Err(_) => {
                // Another thread created it first: give the place back and
                // use theirs.
                self.tracked.fetch_sub(1, Ordering::Relaxed);
                Arrival::Raced
            }
        }
    }

    /// Takes a place under `cap`; false at the cap.
    fn reserve(&self, cap: Option<usize>) -> bool {
        super::reserve(&self.tracked, cap)
    }

    /// Removes `key`'s client and retires its state with `retire`; whether
    /// it was tracked. The removal takes the bucket's lock. A call that
    /// still holds the removed state finds it retired on its next CAS and
    /// looks the client up again, so nothing is decided on it after this
    /// returns.
    pub(crate) fn forget<Q>(&self, key: &Q, retire: impl Fn(&S)) -> bool
    where
        Q: ?Sized + Hash + Equivalent<K>,
    {
        // Progress: a pass repeats only when another thread replaced or
        // removed the entry between the look-up and the removal (a tier's
        // carry-over, a sweep): that thread's step is done, and the next
        // look finds its result.
        loop {
            let Some(client) = self.get(key) else {
                return false;
            };
            if self
                .clients
                .remove_if_sync(key, |present| Arc::ptr_eq(present, &client))
            {
                // `stored` first, then the place: as a sweep gives them back.
                self.stored.fetch_sub(1, Ordering::Relaxed);
                self.tracked.fetch_sub(1, Ordering::Relaxed);
                retire(&client.state);
                StoreCounts::add(&self.counts.forgotten, 1);
                return true;
            }
            // Replaced (a tier's carry-over) or removed (a sweep) meanwhile:
            // look again.
        }
    }

    /// Removes `key`'s entry if its state is retired (a call found it so;
    /// the place was given back by whoever retired it).
    #[cfg_attr(not(any(test, feature = "redis")), allow(dead_code))]
    pub(crate) fn remove_retired<Q>(&self, key: &Q, retired: impl Fn(&S) -> bool)
    where
        Q: ?Sized + Hash + Equivalent<K>,
    {
        if self
            .clients
            .remove_if_sync(key, |client| retired(&client.state))
        {
            self.stored.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// An explicit sweep at `now`: how many clients it removed (0 if another
    /// thread is sweeping).
    pub(crate) fn sweep(
        &self,
        now: u64,
        retire_idle: impl Fn(&Client<S>, u64) -> bool,
        retired: impl Fn(&S) -> bool,
    ) -> usize {
        match self.schedule.turn() {
            Some(turn) => self.sweep_turn(turn, now, &retire_idle, &retired),
            None => 0,
        }
    }

    /// Removes every client idle at `now`, one bucket at a time.
    fn sweep_turn(
        &self,
        turn: SweepTurn<'_>,
        now: u64,
        retire_idle: &impl Fn(&Client<S>, u64) -> bool,
        retired: &impl Fn(&S) -> bool,
    ) -> usize {
        // Raised before any state is judged, so that every eviction below
        // happens after it (Release: see `arrive`).
        self.swept.fetch_max(now, Ordering::Release);
        let (mut removed, mut dropped) = (0, 0);
        self.clients.retain_sync(|_, client| {
            if retire_idle(client, now) {
                removed += 1;
                return false;
            }
            // Retired by someone else (a reloaded tier's carry-over) and not
            // yet removed: drop the entry too; its place is not ours to give.
            let keep = !retired(&client.state);
            dropped += usize::from(!keep);
            keep
        });
        // `stored` first, then the places: so `stored <= tracked` (module
        // docs, "The cap").
        self.stored.fetch_sub(removed + dropped, Ordering::Relaxed);
        let kept = self.tracked.fetch_sub(removed, Ordering::Relaxed) - removed;
        turn.finish(kept);
        StoreCounts::add(&self.counts.sweeps, 1);
        StoreCounts::add(&self.counts.evicted, removed as u64);
        removed
    }

    /// How many clients hold a place: those in the map, plus those being
    /// inserted right now. Exact when no call is in flight; and, unlike a
    /// count of the map's entries (a scan, which while another thread
    /// resizes the map can see an entry in both the old and the new table),
    /// never above the cap and O(1).
    pub(crate) fn len(&self) -> usize {
        self.tracked.load(Ordering::Relaxed)
    }

    /// How many entries the map holds, as completed inserts and removals
    /// count them (module docs, "The cap"): never above `len`, and equal to
    /// the map's length when no call is in flight. O(1).
    #[cfg(test)]
    pub(crate) fn stored(&self) -> usize {
        self.stored.load(Ordering::Relaxed)
    }

    /// Every key the map holds now (a save lists them, then reads each
    /// client by `get`). The map's own walk: it takes each bucket's lock in
    /// turn, as a sweep does, which readers never wait for.
    pub(crate) fn keys(&self) -> Vec<K> {
        let mut keys = Vec::new();
        self.clients.retain_sync(|key, _| {
            keys.push(key.clone());
            true
        });
        keys
    }

    /// `key`'s client, shared.
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<Arc<Client<S>>>
    where
        Q: ?Sized + Hash + Equivalent<K>,
    {
        self.clients.peek_with(key, |_, client| Arc::clone(client))
    }

    /// Puts `successor` in `key`'s entry if the entry still holds `client`;
    /// whether it did. The place stays taken: it is the same client.
    pub(crate) fn replace<Q>(
        &self,
        key: &Q,
        client: &Arc<Client<S>>,
        successor: Arc<Client<S>>,
    ) -> bool
    where
        Q: ?Sized + Hash + Equivalent<K>,
    {
        sync::replace_if(
            &self.clients,
            key,
            |present| Arc::ptr_eq(present, client),
            successor,
        )
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;
    use crate::sync::AtomicU64;

    /// A state that is idle while its word is even, retired when it is
    /// `u64::MAX`: enough to drive the store's protocols by hand.
    type Word = AtomicU64;

    fn idle(client: &Client<Word>, _: u64) -> bool {
        let word = client.state.load(Ordering::Relaxed);
        word.is_multiple_of(2)
            && client
                .state
                .compare_exchange(word, u64::MAX, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    fn retired(state: &Word) -> bool {
        state.load(Ordering::Relaxed) == u64::MAX
    }

    fn arrive(store: &KeyedStore<u64, Word>, key: u64, word: u64) -> bool {
        matches!(
            store.arrive(&key, 0, || AtomicU64::new(word), idle, retired),
            Arrival::Created(_)
        )
    }

    /// Places, `stored` and the map's length, in that order.
    fn counts(store: &KeyedStore<u64, Word>) -> (usize, usize, usize) {
        (store.len(), store.stored(), store.clients.len())
    }

    /// The place count and `stored` are the map's length after every kind
    /// of step: inserts, a lost race, a sweep, the cap; and a retired entry
    /// removed by a call or dropped by a sweep moves `stored` with the map
    /// and leaves the places alone.
    #[test]
    fn places_follow_the_map() {
        let store = KeyedStore::<u64, Word>::new(Bounds::new().max_clients(5));
        for key in 0..4 {
            assert!(arrive(&store, key, key)); // keys 0 and 2 idle
        }
        assert_eq!(counts(&store), (4, 4, 4));
        assert!(matches!(
            store.arrive(&1, 0, || AtomicU64::new(1), idle, retired),
            Arrival::Raced
        ));
        assert_eq!(counts(&store), (4, 4, 4));
        assert!(arrive(&store, 4, 5));
        // At the cap: the arrival sweeps (0 and 2 go) and takes a place.
        assert!(arrive(&store, 10, 1));
        assert_eq!(counts(&store), (4, 4, 4));
        assert!(store.peek(&0, |_| ()).is_none());
        assert!(arrive(&store, 11, 3));
        // Full of busy clients: no room.
        assert!(matches!(
            store.arrive(&12, 0, || AtomicU64::new(1), idle, retired),
            Arrival::Full
        ));
        assert_eq!(counts(&store), (5, 5, 5));
        // A state retired by someone else, then removed by a call: the map
        // and `stored` lose it; the place is its retirer's to give back.
        store.peek(&10, |client| {
            client.state.store(u64::MAX, Ordering::Relaxed)
        });
        store.remove_retired(&10, retired);
        assert_eq!(counts(&store), (5, 4, 4));
        // Removing it again finds nothing: nothing moves.
        store.remove_retired(&10, retired);
        assert_eq!(counts(&store), (5, 4, 4));
        // Retired by someone else and met by a sweep: dropped, counted in
        // `stored` only.
        store.peek(&11, |client| {
            client.state.store(u64::MAX, Ordering::Relaxed)
        });
        assert_eq!(store.sweep(0, idle, retired), 0);
        assert_eq!(counts(&store), (5, 3, 3));
    }
}
