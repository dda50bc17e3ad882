//! A leasing limiter's own side (the module's "Leases"): every client this
//! instance holds units of, in the engine's keyed store (a lock-free
//! look-up, no allocation for a known client), each with its two lease
//! slots (`crate::lease`); how big a lease to ask for, what a lease that
//! came back leaves here, and what was counted.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::lease::{Landing, LeaseSlots, Spent};
use crate::store::{Arrival, KeyedStore};
use crate::{Bounds, Clock, Decision, QuantaClock, Tick};

use super::script::LeaseReply;

/// The clients this instance holds leases of, and the leases' constants.
///
/// # The time line
///
/// A lease is measured on this instance's own time line, from the moment
/// it asked: with [`TimeSource::Caller`](super::TimeSource::Caller), the
/// caller's ticks (the `now` each call passes, or the local Unix time);
/// with Redis's clock, the time-stamp counter (`clock`, nanoseconds), which
/// never steps back when the wall clock is set and costs a few nanoseconds
/// a read. The slots keep whole milliseconds of it, rounded down.
pub(super) struct Leases {
    clients: KeyedStore<String, LeaseSlots>,
    /// δ in whole milliseconds (at least 1).
    term_ms: u64,
    /// The length of a tick of the time line, and of the script's ticks
    /// (a lease's term comes back in those), in nanoseconds.
    tick_ns: u64,
    script_tick_ns: u64,
    /// With Redis's clock: the time line.
    clock: Option<QuantaClock>,
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
    /// Decisions of a leasing limiter answered otherwise than from a lease
    /// (Redis's, the rejection cache's, the fault rule's): those answered
    /// from one are the rest of the limiter's decisions, counted on its
    /// striped counters, so a spend adds to no line another thread adds to.
    pub(super) elsewhere: AtomicU64,
    /// Units of refunds that went back into a lease.
    pub(super) given_back: AtomicU64,
    /// Units whose lease ended unspent.
    pub(super) lapsed: AtomicU64,
    /// Of those, the units Redis took back (a refund of each ended lease's
    /// rest, when a landing finds it).
    pub(super) returned: AtomicU64,
}

impl Leases {
    /// Leases of term `term`, at most `most` units each, on Redis's clock
    /// (`caller_tick_ns` `None`) or the caller's ticks of that length;
    /// `script_tick_ns` is the script's tick (a microsecond on Redis's
    /// clock).
    pub(super) fn new(
        term: std::time::Duration,
        caller_tick_ns: Option<u64>,
        script_tick_ns: u64,
        most: u64,
        bounds: Bounds,
    ) -> Self {
        Self {
            clients: KeyedStore::new(bounds),
            term_ms: u64::try_from(term.as_millis()).unwrap_or(u64::MAX).max(1),
            tick_ns: caller_tick_ns.unwrap_or(1),
            script_tick_ns,
            clock: caller_tick_ns.is_none().then(QuantaClock::new),
            most: most.clamp(1, crate::lease::MAX_UNITS),
            counts: LeaseCounts::default(),
        }
    }

    /// Now on the time line: the caller's `now` (or the local Unix time it
    /// stands for, `implicit`), or the time-stamp counter's.
    pub(super) fn now(&self, implicit: impl FnOnce() -> u64) -> u64 {
        match &self.clock {
            Some(clock) => clock.now(),
            None => implicit(),
        }
    }

    /// `ticks` of the time line in whole milliseconds, rounded down (the
    /// slots' unit: a lease's end rounded down ends it early, never late).
    #[inline]
    fn ms(&self, ticks: u64) -> u64 {
        ms(ticks, self.tick_ns)
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
        self.asked(size, cost)
    }

    /// A lease of the client's `size` for a request of cost `cost`: at
    /// least the cost, at most the limiter's most.
    fn asked(&self, size: u64, cost: u64) -> u64 {
        size.min(self.most).max(cost).max(1)
    }

    /// How many units a request of cost `cost` of `key` that found no
    /// lease to spend asks for: the client's next size when no other
    /// sized lease of it is in flight (this call then holds the client's
    /// one, until the guard drops), only its cost when one is. Without
    /// it, every request in flight that runs out at once takes a lease of
    /// the full size, and the third finds both slots live (its units
    /// lapse, a round trip more to give them back).
    pub(super) fn ask_alone<'a>(&'a self, key: &'a str, cost: u64) -> (u64, Option<Alone<'a>>) {
        // One look-up: the mark and the size read under it.
        let started = self.clients.peek(key, |client| {
            let slots = &client.state;
            slots.start_ahead().then(|| slots.size())
        });
        match started {
            Some(Some(size)) => (self.asked(size, cost), Some(Alone { leases: self, key })),
            Some(None) => (cost.max(1), None),
            // A client not seen yet: its first lease is one unit (or its
            // cost), whoever asks.
            None => (cost.max(1), None),
        }
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
    ) -> (Decision, Option<GiveBack>) {
        if !decision.allowed {
            return (decision, None);
        }
        let mut give_back = None;
        self.counts.taken.fetch_add(1, Ordering::Relaxed);
        self.counts
            .units
            .fetch_add(reply.granted, Ordering::Relaxed);
        let now_ms = self.ms(asked);
        // Each part rounded down: the end is no later than the term after
        // the ask.
        let end_ms = now_ms.saturating_add(ms(reply.term, self.script_tick_ns));
        // Units that end before they could be spent lapse at once.
        let left = if end_ms > now_ms {
            reply.granted.saturating_sub(taken)
        } else {
            let units = reply.granted.saturating_sub(taken);
            self.lapse(units);
            give_back = (units > 0).then_some(GiveBack {
                taken_at: decision.at,
                units,
            });
            0
        };
        // The units this instance holds of this lease once it landed.
        let mut kept = left;
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
                let (landing, replaced) = if left > 0 {
                    slots.land_replacing(now_ms, left, end_ms, decision.at, decision.remaining)
                } else {
                    (Landing::Landed { lapsed: 0 }, 0)
                };
                slots.landed(now_ms, self.term_ms, self.most);
                if matches!(landing, Landing::Landed { lapsed } if lapsed > 0) {
                    slots.lapsed();
                }
                Some((landing, replaced))
            });
            match landing {
                Some(Some((Landing::Landed { lapsed }, replaced))) => {
                    if lapsed > 0 {
                        self.lapse(lapsed);
                        give_back = Some(GiveBack {
                            taken_at: replaced,
                            units: lapsed,
                        });
                    }
                    break;
                }
                Some(Some((Landing::NoRoom, _))) => {
                    self.lapse(left);
                    give_back = Some(GiveBack {
                        taken_at: decision.at,
                        units: left,
                    });
                    kept = 0;
                    break;
                }
                Some(None) => self
                    .clients
                    .remove_retired(key, |slots: &LeaseSlots| slots.retired()),
                None => match self.clients.arrive(
                    key,
                    now_ms,
                    LeaseSlots::new,
                    |client, now_ms| client.state.retire_if_idle(now_ms, self.term_ms),
                    LeaseSlots::retired,
                ) {
                    Arrival::Created(_) | Arrival::Raced => {}
                    Arrival::Full => {
                        self.lapse(left);
                        give_back = (left > 0).then_some(GiveBack {
                            taken_at: decision.at,
                            units: left,
                        });
                        kept = 0;
                        break;
                    }
                },
            }
        }
        // Redis's remainder after this lease: what the units given back
        // are weighed against.
        let give_back = give_back
            .filter(|back| back.units.saturating_mul(GIVE_BACK_SHARE) > decision.remaining);
        let decision = Decision {
            remaining: decision.remaining.saturating_add(kept),
            ..decision
        };
        (decision, give_back)
    }

    /// The units an ended lease of `key` left unspent at `now` (ticks),
    /// taken out of its slot: they lapse (halving the next size), and go
    /// back to Redis (the [`GiveBack`]) when they weigh as a landing's do,
    /// more than a sixteenth of what Redis had left after that lease.
    /// Asked by a request that found nothing to spend, before the
    /// rejection cache: a client refused until its window ends takes no
    /// lease, so no landing would ever give them back.
    pub(super) fn reclaim(&self, key: &str, now: u64) -> Option<GiveBack> {
        let now_ms = self.ms(now);
        let (units, taken_at, rest) = self.clients.peek(key, |client| {
            let reclaimed = client.state.reclaim_ended(now_ms);
            // The lapse halves the next size, as a landing that found
            // them would have: without it a client seen less than once a
            // term keeps growing leases it never spends.
            if reclaimed.is_some() {
                client.state.lapsed();
            }
            reclaimed
        })??;
        self.lapse(units);
        (units.saturating_mul(GIVE_BACK_SHARE) > rest).then_some(GiveBack { taken_at, units })
    }

    /// Counts what Redis took back of a [`GiveBack`].
    pub(super) fn returned(&self, units: u64) {
        self.counts.returned.fetch_add(units, Ordering::Relaxed);
    }

    /// A lease asked ahead of need came back, `taken` (counted among the
    /// leases) or refused, failed, landed or not: the next may be asked.
    pub(super) fn ahead_done(&self, key: &str, taken: bool) {
        if taken {
            self.counts.ahead.fetch_add(1, Ordering::Relaxed);
        }
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

/// A client's one sized lease in flight ([`Leases::ask_alone`]): the mark
/// is cleared when this drops, however the call that holds it ends (an
/// answer, an error, a future dropped mid-call), so that the client's
/// next miss asks its full size again.
pub(super) struct Alone<'a> {
    leases: &'a Leases,
    key: &'a str,
}

impl Drop for Alone<'_> {
    fn drop(&mut self) {
        self.leases
            .clients
            .peek(self.key, |client| client.state.end_ahead());
    }
}

/// Unspent units go back to Redis only when they are more than a
/// sixteenth of what Redis had left after the lease that found them
/// lapsed: near the limit, where the others may be refused for want of
/// them. Far from it the contract lets them lapse (under-admitting, never
/// over), and the window's end or the drip gives them back on its own; a
/// round trip for each would cost a client seen a few times a term one
/// more call per lease (the Zipf rows of `floodgate bench --lease`).
const GIVE_BACK_SHARE: u64 = 16;

/// Unspent units of an ended lease (or of one that found no slot), to be
/// given back to Redis as a refund of the admission that took them: the
/// contract's "what is left unspent then is given back to the store".
/// Nothing spends them any more, so giving them back is always safe; a
/// window rule whose window has ended takes nothing back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct GiveBack {
    pub(super) taken_at: u64,
    pub(super) units: u64,
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

/// `ticks` of `tick_ns` nanoseconds each, in whole milliseconds rounded
/// down: a quotient or a product for the ticks that divide or are whole
/// milliseconds, exact in 128 bits for the others.
#[inline]
fn ms(ticks: u64, tick_ns: u64) -> u64 {
    const MS: u64 = 1_000_000;
    if MS.is_multiple_of(tick_ns) {
        ticks / (MS / tick_ns)
    } else if tick_ns.is_multiple_of(MS) {
        ticks.saturating_mul(tick_ns / MS)
    } else {
        u64::try_from(u128::from(ticks) * u128::from(tick_ns) / u128::from(MS)).unwrap_or(u64::MAX)
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
