//! The units this process holds in Redis under `in-flight` rules, by
//! client: which of the holders in Redis (`scripts/held.lua`) are its own,
//! so that a release takes back its own admissions' units, and a renewal
//! keeps their leases running while their requests do.
//!
//! Units are alike within one client, so a release of `n` units takes from
//! this process's newest holders of that client, whichever request they
//! were admitted for. A release of a client this process holds nothing of
//! (the units were admitted by another process, which handed the release
//! on) takes from the client's holders whose leases end first.
//!
//! The registry is a map behind a lock: it is touched once per admission
//! and per release of a limiter whose every call is a round trip to Redis,
//! never on the in-memory engine's path.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::script;

/// One admission of this process, still held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Held {
    /// In Redis: the holder [`script::holder`]`(units, id)` of each
    /// `in-flight` rule's key.
    Redis { units: u64, id: u64 },
    /// Admitted by the in-memory fallback ([`OnFailure::Local`](super::OnFailure::Local)),
    /// which holds the units: released there.
    Local(u64),
    /// Admitted by the fault rule without holding anything
    /// ([`OnFailure::FailOpen`](super::OnFailure::FailOpen)): its release
    /// touches nothing, so that it never takes another admission's units.
    Unheld(u64),
}

/// What a release of `n` units of one client takes from this process's
/// holdings.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// The Redis holders named to the script, and the units taken from
    /// them (the last one's in part, maybe).
    pub(super) holders: Vec<String>,
    pub(super) redis: u64,
    /// Units held by the in-memory fallback, and by nobody.
    pub(super) local: u64,
    pub(super) unheld: u64,
    /// This process holds nothing of the client: the script takes from
    /// the holders whose leases end first.
    pub(super) by_key: bool,
    /// What was taken, to put back if the release fails.
    taken: Vec<Held>,
}

/// This process's holdings.
#[derive(Debug)]
pub(super) struct Holdings {
    /// The next admission's id: a random start (so that two processes'
    /// ids do not meet), then one more per admission.
    ids: AtomicU64,
    clients: Mutex<HashMap<String, Vec<Held>>>,
}

impl Holdings {
    pub(super) fn new() -> Self {
        let start = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        Self {
            ids: AtomicU64::new(start),
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// An id no other admission of this limiter has. Relaxed: the
    /// read-modify-write alone makes it unique; it orders nothing.
    pub(super) fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<Held>>> {
        // A panic under the lock leaves a map that is still whole (every
        // change below is one push, pop or replacement).
        self.clients.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records an admission of `client` that holds.
    pub(super) fn add(&self, client: &str, held: Held) {
        self.lock().entry(client.to_owned()).or_default().push(held);
    }

    /// Takes up to `n` units of `client`'s holdings, newest first.
    pub(super) fn take(&self, client: &str, n: u64) -> Plan {
        let mut plan = Plan::default();
        let mut clients = self.lock();
        let Some(held) = clients.get_mut(client) else {
            plan.by_key = true;
            return plan;
        };
        let mut wanted = n;
        // Ends: each pass pops one holding of this client's list, under
        // the lock (no other thread changes it meanwhile), or stops at its
        // end.
        while wanted > 0 {
            let Some(last) = held.pop() else { break };
            plan.taken.push(last);
            let units = match last {
                Held::Redis { units, .. } | Held::Local(units) | Held::Unheld(units) => units,
            };
            let taken = units.min(wanted);
            wanted -= taken;
            match last {
                Held::Redis { id, .. } => {
                    plan.holders.push(script::holder(units, id));
                    plan.redis += taken;
                }
                Held::Local(_) => plan.local += taken,
                Held::Unheld(_) => plan.unheld += taken,
            }
            // The rest of a holding taken in part stays held (the script
            // renames a Redis holder to its rest).
            if taken < units {
                held.push(match last {
                    Held::Redis { id, .. } => Held::Redis {
                        units: units - taken,
                        id,
                    },
                    Held::Local(_) => Held::Local(units - taken),
                    Held::Unheld(_) => Held::Unheld(units - taken),
                });
            }
        }
        if held.is_empty() {
            clients.remove(client);
        }
        plan
    }

    /// Puts back the Redis holders a failed release took (they are still
    /// held there); the other parts were released already.
    pub(super) fn restore(&self, client: &str, plan: Plan) {
        let taken: Vec<Held> = plan
            .taken
            .into_iter()
            .filter(|held| matches!(held, Held::Redis { .. }))
            .collect();
        if taken.is_empty() {
            return;
        }
        let mut clients = self.lock();
        let held = clients.entry(client.to_owned()).or_default();
        // A holder taken in part was pushed back with its rest: the whole
        // goes back in its place.
        if let (Some(rest), Some(last)) = (held.last().copied(), taken.last())
            && same_admission(rest, *last)
        {
            held.pop();
        }
        held.extend(taken.into_iter().rev());
    }

    /// Drops every holding of `client` (its state was deleted).
    pub(super) fn forget(&self, client: &str) {
        self.lock().remove(client);
    }

    /// Every client with holders in Redis, and those holders: what a
    /// renewal renews.
    pub(super) fn in_redis(&self) -> Vec<(String, Vec<String>)> {
        self.lock()
            .iter()
            .filter_map(|(client, held)| {
                let holders: Vec<String> = held
                    .iter()
                    .filter_map(|held| match *held {
                        Held::Redis { units, id } => Some(script::holder(units, id)),
                        _ => None,
                    })
                    .collect();
                (!holders.is_empty()).then(|| (client.clone(), holders))
            })
            .collect()
    }
}

/// Whether `a` and `b` are parts of one Redis admission.
fn same_admission(a: Held, b: Held) -> bool {
    matches!((a, b), (Held::Redis { id: x, .. }, Held::Redis { id: y, .. }) if x == y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_takes_the_newest_holdings_and_leaves_a_rest() {
        let holdings = Holdings::new();
        holdings.add("a", Held::Redis { units: 2, id: 1 });
        holdings.add("a", Held::Unheld(1));
        holdings.add("a", Held::Redis { units: 3, id: 2 });
        let plan = holdings.take("a", 4);
        assert_eq!(plan.holders, [script::holder(3, 2)]);
        assert_eq!((plan.redis, plan.unheld, plan.by_key), (3, 1, false));
        let plan = holdings.take("a", 1);
        assert_eq!(plan.holders, [script::holder(2, 1)]);
        assert_eq!(plan.redis, 1);
        // The rest of 1 is still held, as the script renamed it.
        assert_eq!(
            holdings.in_redis(),
            [("a".to_owned(), vec![script::holder(1, 1)])]
        );
        holdings.restore("a", plan);
        assert_eq!(
            holdings.in_redis(),
            [("a".to_owned(), vec![script::holder(2, 1)])]
        );
        assert!(holdings.take("b", 1).by_key);
    }
}
