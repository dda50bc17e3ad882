//! The in-memory keyed store: client key → that client's state, in an
//! `scc::HashIndex` hashed by a randomly seeded `ahash`.
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

use std::hash::Hash;
use std::sync::Arc;

use scc::Equivalent;

use crate::sync::ClientIndex;

/// One client: when it was created, and its policy state.
#[derive(Debug)]
pub(crate) struct Client<S> {
    /// The `now` of the call that created it. Policies measure time from
    /// here, so their state words hold small relative times.
    pub(crate) origin: u64,
    pub(crate) state: S,
}

/// Client key → shared client state.
pub(crate) struct KeyedStore<K, S> {
    /// `scc::HashIndex` hashed by a randomly seeded `ahash` (a loom-visible
    /// stand-in under the loom cfg; see `crate::sync`).
    clients: ClientIndex<K, Arc<Client<S>>>,
}

impl<K, S> KeyedStore<K, S>
where
    K: Hash + Eq + Clone + 'static,
    S: 'static,
{
    pub(crate) fn new() -> Self {
        Self {
            // `HashIndex::default()` is `with_hasher(RandomState::default())`,
            // and ahash's `default()` is `new()`: a randomly seeded hasher.
            clients: ClientIndex::default(),
        }
    }

    /// Runs `visit` on `key`'s client, creating it (with origin `now`) if it
    /// does not exist yet.
    #[inline]
    pub(crate) fn with_client<Q, R>(
        &self,
        key: &Q,
        now: u64,
        new_state: impl Fn() -> S,
        visit: impl Fn(&Client<S>) -> R,
    ) -> R
    where
        Q: ?Sized + Hash + Equivalent<K> + ToOwned<Owned = K>,
    {
        if let Some(answer) = self.clients.peek_with(key, |_, client| visit(client)) {
            return answer;
        }
        self.create(key, now, new_state, visit)
    }

    #[cold]
    #[inline(never)]
    fn create<Q, R>(
        &self,
        key: &Q,
        now: u64,
        new_state: impl Fn() -> S,
        visit: impl Fn(&Client<S>) -> R,
    ) -> R
    where
        Q: ?Sized + Hash + Equivalent<K> + ToOwned<Owned = K>,
    {
        let candidate = Arc::new(Client {
            origin: now,
            state: new_state(),
        });
        loop {
            match self
                .clients
                .insert_sync(key.to_owned(), Arc::clone(&candidate))
            {
                Ok(()) => return visit(&candidate),
                Err(_) => {
                    // Another thread created it first: use theirs.
                    if let Some(answer) = self.clients.peek_with(key, |_, client| visit(client)) {
                        return answer;
                    }
                }
            }
        }
    }

    /// How many clients have state.
    pub(crate) fn len(&self) -> usize {
        self.clients.len()
    }
}
