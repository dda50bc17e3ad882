//! A leasing limiter's own side (the module's "Leases"): every client this
//! instance holds units of, in the engine's keyed store (a lock-free
//! look-up, no allocation for a known client), each with its two lease
//! slots (`crate::lease`); how big a lease to ask for, what a lease that
//! came back leaves here, and what was counted.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::lease::{Landing, LeaseSlots, Spent};
use crate::store::{Arrival, KeyedStore};
use crate::{Bounds, Decision, Tick};

use super::script::LeaseReply;

/// The clients this instance holds leases of, and the leases' constants.
pub(super) struct Leases {
    clients: KeyedStore<String, LeaseSlots>,
    /// δ in ticks, and in whole milliseconds (at least 1).
    term_ms: u64,
    /// The length of a tick, in nanoseconds.
    tick_ns: u64,
    /// The most units a lease takes: the option, cut to the strictest limit
    /// and to what a slot holds.
    most: u64,
    pub(super) counts: LeaseCounts,
}

/// What the leases did, for [`RedisStats`](super::RedisStats). Relaxed
/// counters: statistics, publishing nothing.
#[derive(Debug, Default)]
pub(super) struct LeaseCounts {
    /// Leases taken (a round trip each), and of those taken ahead of need.
    pub(super) taken: AtomicU64,
    pub(super) ahead: AtomicU64,
    /// Units the leases took out of Redis.
    pub(super) units: AtomicU64,
    /// Decisions answered from a lease, with no round trip.
    pub(super) local: AtomicU64,
    /// Units of refunds that went back into a lease.
    pub(super) given_back: AtomicU64,
    /// Units whose lease ended unspent.
    pub(super) lapsed: AtomicU64,
}

impl Leases {
    pub(super) fn new(term_ticks: u64, tick_ns: u64, most: u64, bounds: Bounds) -> Self {
        let term_ms = u64::try_from(u128::from(term_ticks) * u128::from(tick_ns) / 1_000_000)
            .unwrap_or(u64::MAX)
            .max(1);
        Self {
            clients: KeyedStore::new(bounds),
            term_ms,
            tick_ns,
            most: most.clamp(1, crate::lease::MAX_UNITS),
            counts: LeaseCounts::default(),
        }
    }

    /// `ticks` of the limiter's time line in whole milliseconds, rounded
    /// down (the slots' unit: a lease's end rounded down ends it early,
    /// never late).
    fn ms(&self, ticks: u64) -> u64 {
        u64::try_from(u128::from(ticks) * u128::from(self.tick_ns) / 1_000_000).unwrap_or(u64::MAX)
    }

    /// A request of cost `cost` of `key` at `now` (ticks) answered from a
    /// lease this instance holds, with whether this call should take the
    /// next lease ahead of need; `None` when no live lease holds `cost`.
    pub(super) fn spend(
        &self,
        key: &str,
        now: u64,
        cost: u64,
        tick: Tick,
    ) -> Option<(Decision, bool)> {
        let now_ms = self.ms(now);
        self.clients.peek(key, |client| {
            let slots = &client.state;
            let spent = slots.spend(now_ms, cost)?;
            self.counts.local.fetch_add(1, Ordering::Relaxed);
            // Ahead of need: half of the last lease's size is left, and no
            // other lease is held beside it.
            let size = slots.size();
            let ahead = size >= 2
                && spent.left <= size / 2
                && slots.held(now_ms) == spent.left
                && slots.start_ahead();
            Some((admitted(&spent, tick), ahead))
        })?
    }

    /// How many units to ask for, for a request of cost `cost` of `key`
    /// (`cost` 0 for a lease taken ahead): the client's next size, at
    /// least the cost, at most the limiter's most.
    pub(super) fn ask(&self, key: &str, cost: u64) -> u64 {
        let size = self
            .clients
            .peek(key, |client| client.state.size())
            .unwrap_or(1);
        size.min(self.most).max(cost).max(1)
    }

    /// A lease that came back for a request of cost `taken` (0 for one
    /// taken ahead) asked at `asked` (ticks): what `reply` granted beyond
    /// `taken` is put in one of `key`'s slots, to end `reply.term` ticks
    /// after `asked` (measured from the ask: a slow answer shortens a
    /// lease, never lengthens it). The caller's decision, with the units
    /// this instance now holds in its `remaining`.
    pub(super) fn landed(
        &self,
        key: &str,
        asked: u64,
        taken: u64,
        reply: &LeaseReply,
        decision: Decision,
    ) -> Decision {
        if !decision.allowed {
            return decision;
        }
        self.counts.taken.fetch_add(1, Ordering::Relaxed);
        self.counts
            .units
            .fetch_add(reply.granted, Ordering::Relaxed);
        let now_ms = self.ms(asked);
        let end_ms = self.ms(asked.saturating_add(reply.term));
        // Units that end before they could be spent lapse at once.
        let left = if end_ms > now_ms {
            reply.granted.saturating_sub(taken)
        } else {
            self.lapse(reply.granted.saturating_sub(taken));
            0
        };
        // The client's slots, made if need be even when nothing lands: the
        // lease's time sizes the next one. Progress: each pass follows a
        // finished step of another thread (a racing first call that
        // created the client, or a sweep that retired it), or ends.
        loop {
            let landing = self.clients.peek(key, |client| {
                let slots = &client.state;
                if slots.retired() {
                    return None;
                }
                let landing = if left > 0 {
                    slots.land(now_ms, left, end_ms, decision.at, decision.remaining)
                } else {
                    Landing::Landed { lapsed: 0 }
                };
                slots.landed(now_ms, self.term_ms, self.most);
                if matches!(landing, Landing::Landed { lapsed } if lapsed > 0) {
                    slots.lapsed();
                }
                Some(landing)
            });
            match landing {
                Some(Some(Landing::Landed { lapsed })) => {
                    self.lapse(lapsed);
                    break;
                }
                Some(Some(Landing::NoRoom)) => {
                    self.lapse(left);
                    break;
                }
                Some(None) => self
                    .clients
                    .remove_retired(key, |slots: &LeaseSlots| slots.retired()),
                None => match self.clients.arrive(
                    key,
                    now_ms,
                    LeaseSlots::new,
                    |client, now_ms| client.state.retire_if_idle(now_ms),
                    LeaseSlots::retired,
                ) {
                    Arrival::Created(_) | Arrival::Raced => {}
                    Arrival::Full => {
                        self.lapse(left);
                        break;
                    }
                },
            }
        }
        Decision {
            remaining: decision.remaining.saturating_add(left),
            ..decision
        }
    }

    /// A lease taken ahead came back, landed or not.
    pub(super) fn ahead_done(&self, key: &str) {
        self.counts.ahead.fetch_add(1, Ordering::Relaxed);
        self.clients.peek(key, |client| client.state.end_ahead());
    }

    /// Gives `units` of an admission of `key` made from the lease taken at
    /// `taken_at` back into that lease, if it lasts at `now`: whether it
    /// did.
    pub(super) fn give_back(&self, key: &str, now: u64, taken_at: u64, units: u64) -> bool {
        let now_ms = self.ms(now);
        let back = self
            .clients
            .peek(key, |client| {
                client.state.give_back(now_ms, taken_at, units)
            })
            .unwrap_or(false);
        if back {
            self.counts.given_back.fetch_add(units, Ordering::Relaxed);
        }
        back
    }

    /// The units this instance holds of `key` at `now`.
    pub(super) fn held(&self, key: &str, now: u64) -> u64 {
        let now_ms = self.ms(now);
        self.clients
            .peek(key, |client| client.state.held(now_ms))
            .unwrap_or(0)
    }

    /// Drops what this instance holds of `key` (its state in Redis was
    /// deleted): the units lapse.
    pub(super) fn forget(&self, key: &str) {
        let lapsed = self
            .clients
            .peek(key, |client| client.state.held(0))
            .unwrap_or(0);
        if self.clients.forget(key, LeaseSlots::retire) {
            self.lapse(lapsed);
        }
    }

    fn lapse(&self, units: u64) {
        if units > 0 {
            self.counts.lapsed.fetch_add(units, Ordering::Relaxed);
        }
    }
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("term_ms", &self.term_ms)
            .field("most", &self.most)
            .field("clients", &self.clients.len())
            .finish_non_exhaustive()
    }
}

/// The decision of a request spent from a lease: admitted, with what the
/// store had left after the lease and what the lease still holds as its
/// `remaining`, and the lease's time as its own (a refund names it so).
fn admitted(spent: &Spent, tick: Tick) -> Decision {
    Decision {
        at: spent.taken_at,
        ..Decision::admit(spent.rest.saturating_add(spent.left)).in_ticks(tick)
    }
}
