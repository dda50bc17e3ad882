//! The local rejection cache: a client that Redis rejected is rejected here,
//! without a round trip, until the time Redis named.
//!
//! # Why it is exact
//!
//! A rejected request changes nothing (`SPEC.md`), and every policy's
//! admission is monotone in time: once a request would be admitted, it
//! stays admissible while nothing else happens. So a request of cost `n`
//! rejected at `now` with `retry_after = d` is rejected at every time in
//! `[now, now + d)` if nothing else happens, and anything else that can
//! happen on another instance (an admission) only makes the client's state
//! stricter. A request of a cost `m ≥ n` needs at least what `n` needs, so
//! it is rejected over the same interval; a smaller cost may be admitted,
//! and goes to Redis.
//!
//! # The rule per cost
//!
//! One entry per client: the smallest rejected cost and its deadline. A
//! request of cost `m` at `t` is answered here iff the entry is live, `m`
//! is at least the entry's cost and `t` is before the deadline by at least
//! one tick. A new rejection of cost `n` replaces the entry when `n` is
//! smaller than the entry's cost or the entry is dead; for the same cost
//! the later deadline is kept (both are rejections Redis gave); a larger
//! cost leaves the entry alone.
//!
//! # Times
//!
//! A deadline is kept on the time line of the call that made it:
//!
//! - the caller's ticks, for a call that passed its `now` (the `*_at`
//!   methods, and every call with [`TimeSource::Caller`](super::TimeSource)):
//!   Redis judged that very time, so the deadline is `now + d` exactly;
//! - the local monotonic clock, for a call on Redis's clock without a
//!   `now`: the deadline is the instant the call was sent plus `d`. Redis
//!   read its `TIME` after that instant, so the true deadline is no earlier
//!   (as long as Redis's clock does not jump forward).
//!
//! An entry answers only calls on its own time line, and never a call
//! whose time is before the rejection's (time that steps back goes to
//! Redis, which judges it at the latest time it has).
//!
//! # What invalidates an entry
//!
//! [`Rejections::invalidate`] (this limiter's `forget` and `clear_prefix`)
//! bumps a generation after Redis has deleted the state: an entry made by
//! a call that started before is never used again, because that call's
//! rejection may predate the deletion. A `forget` on another instance is
//! not seen here: its clients stay rejected until their deadlines.
//!
//! # Bounds
//!
//! At most `capacity` entries. An entry whose deadline passed is dropped
//! when a lookup meets it, and a full cache sweeps out its dead entries
//! before it refuses a newcomer (paced so that a sweep costs O(1) per
//! insert, amortised); a refused newcomer is asked of Redis, as without
//! the cache.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crate::decision::NEVER;
use crate::Decision;

/// The default [`RedisOptions::rejection_cache`](super::RedisOptions::rejection_cache):
/// how many rejected clients one limiter remembers at most.
///
/// An entry is the client's name plus 56 bytes (and the table's overhead,
/// about a pointer per slot): for ids of about 20 bytes, 10,000 entries
/// are under 1 MB.
pub const DEFAULT_REJECTION_CACHE: usize = 10_000;

/// When a call was made, on one of the two time lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stamp {
    /// The caller's `now`, in ticks.
    Given(u64),
    /// Nanoseconds of the local monotonic clock since the cache was made.
    Local(u64),
}

/// One client's remembered rejection.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The smallest rejected cost.
    cost: u64,
    /// When the rejection was made.
    at: Stamp,
    /// The first time (same line and unit as `at`) the request may be
    /// admitted.
    deadline: u64,
    /// `remaining` as Redis answered it with the rejection.
    remaining: u64,
    /// The rule that refused, as Redis answered it.
    refused_by: u8,
    /// [`Rejections::generation`] when the call that made it started.
    generation: u64,
}

/// The cache of one limiter.
pub(super) struct Rejections {
    entries: scc::HashMap<Box<str>, Entry, ahash::RandomState>,
    capacity: usize,
    /// Entries in `entries`: reserved before an insert, so it never passes
    /// `capacity`. Relaxed would do for a statistic, but the reservation
    /// must see every other reservation: `fetch_add` is a read-modify-write,
    /// which always reads the latest value whatever the ordering, so
    /// Relaxed is right for the bound too.
    len: AtomicUsize,
    /// Refused inserts since the last sweep. Relaxed: it only paces sweeps.
    refused: AtomicUsize,
    /// Bumped by [`invalidate`](Self::invalidate). SeqCst: a call reads it
    /// before it is sent, and `invalidate` bumps it after Redis deleted the
    /// state; the order between those two matters and costs nothing here.
    generation: AtomicU64,
    /// Decisions answered here. Relaxed: a statistic.
    hits: AtomicU64,
    /// The zero of [`Stamp::Local`].
    base: Instant,
    /// Nanoseconds per tick on the local time line (Redis's clock: 1,000).
    tick_ns: u64,
}

impl Rejections {
    /// A cache of at most `capacity` entries (at least 1), whose local time
    /// line converts to ticks of `tick_ns` nanoseconds.
    pub(super) fn new(capacity: usize, tick_ns: u64) -> Self {
        Self {
            entries: scc::HashMap::with_hasher(ahash::RandomState::new()),
            capacity: capacity.max(1),
            len: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            base: Instant::now(),
            tick_ns: tick_ns.max(1),
        }
    }

    /// The stamp of a call about to be sent: its own `now`, or the local
    /// monotonic clock's.
    pub(super) fn stamp(&self, now: Option<u64>) -> Stamp {
        match now {
            Some(now) => Stamp::Given(now),
            None => Stamp::Local(self.local_now()),
        }
    }

    /// The current generation, read before a call is sent.
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    fn local_now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The deadline's distance from `at` in the stamp's own unit.
    fn scale(&self, at: Stamp) -> u64 {
        match at {
            Stamp::Given(_) => 1,
            Stamp::Local(_) => self.tick_ns,
        }
    }

    /// The cached rejection of a request of cost `cost` (at least 1) of
    /// `client` at `at`, if there is one: `allowed` false, `retry_after` the
    /// whole ticks left to the deadline (a lower bound of Redis's own),
    /// `remaining` Redis's at the rejection. The decision is in
    /// nanosecond ticks; the caller puts it in its own.
    pub(super) fn lookup(&self, client: &str, cost: u64, at: Stamp) -> Option<Decision> {
        let entry = self.entries.read_sync(client, |_, entry| *entry)?;
        if self.expired(&entry, at) {
            let removed = self
                .entries
                .remove_if_sync(client, |entry| self.expired(entry, at))
                .is_some();
            if removed {
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
            return None;
        }
        if cost < entry.cost {
            return None;
        }
        let left = self.left(&entry, at).filter(|&left| left > 0)?;
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(Decision {
            allowed: false,
            remaining: entry.remaining,
            retry_after: left,
            delay: 0,
            tick: crate::Tick::NANOSECOND,
            refused_by: entry.refused_by,
            at: 0,
        })
    }

    /// Whole ticks from `at` to the entry's deadline, if `at` is on the
    /// entry's line and not before the rejection.
    fn left(&self, entry: &Entry, at: Stamp) -> Option<u64> {
        match (entry.at, at) {
            (Stamp::Given(made), Stamp::Given(now)) | (Stamp::Local(made), Stamp::Local(now))
                if now >= made =>
            {
                Some(entry.deadline.saturating_sub(now) / self.scale(at))
            }
            _ => None,
        }
    }

    /// Whether an entry can no longer answer a call at `at` or later: it is
    /// of an old generation, or its deadline is at or before `at` on its
    /// own line, or before the local clock. Dropping an entry is always
    /// safe: the next call asks Redis.
    fn expired(&self, entry: &Entry, at: Stamp) -> bool {
        entry.generation != self.generation()
            || matches!(entry.at, Stamp::Local(_)) && entry.deadline <= self.local_now()
            || matches!((entry.at, at), (Stamp::Given(_), Stamp::Given(now)) if entry.deadline <= now)
    }

    /// Remembers Redis's rejection of a request of cost `cost` of `client`,
    /// made by a call stamped `at` that started at generation `generation`.
    pub(super) fn insert(
        &self,
        client: &str,
        cost: u64,
        at: Stamp,
        generation: u64,
        decision: &Decision,
    ) {
        if decision.allowed
            || decision.retry_after == 0
            || decision.retry_after == NEVER
            || generation != self.generation()
        {
            return;
        }
        let start = match at {
            Stamp::Given(now) | Stamp::Local(now) => now,
        };
        let deadline = start.saturating_add(decision.retry_after.saturating_mul(self.scale(at)));
        let new = Entry {
            cost,
            at,
            deadline,
            remaining: decision.remaining,
            refused_by: decision.refused_by,
            generation,
        };
        let updated = self.entries.update_sync(client, |_, old| {
            // The old entry still answers at `at`: the new rejection is
            // kept beside it only if it is of a smaller cost, or of the same
            // cost on the same line with a later deadline (then the two
            // intervals overlap, and their union is one rejection).
            let old_answers =
                old.generation == new.generation && self.left(old, at).is_some_and(|left| left > 0);
            if !old_answers || new.cost < old.cost {
                *old = new;
            } else if new.cost == old.cost && new.deadline > old.deadline {
                old.deadline = new.deadline;
                old.remaining = new.remaining;
                old.refused_by = new.refused_by;
            }
        });
        if updated.is_some() {
            return;
        }
        if !self.reserve(at) {
            return;
        }
        if self.entries.insert_sync(client.into(), new).is_err() {
            // Another call inserted the client meanwhile: its entry stays.
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Takes room for one entry, sweeping the dead ones out first if the
    /// cache is full; whether there was room. A sweep costs O(capacity), so
    /// it runs at once only after a sweep that freed at least an eighth of
    /// the cache, and otherwise once per `capacity / 8` refusals: either
    /// way O(1) per insert, amortised.
    fn reserve(&self, at: Stamp) -> bool {
        if self.len.fetch_add(1, Ordering::Relaxed) < self.capacity {
            return true;
        }
        self.len.fetch_sub(1, Ordering::Relaxed);
        let pace = (self.capacity / 8).max(1);
        if !self
            .refused
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(pace)
        {
            return false;
        }
        if self.sweep(at) >= pace {
            self.refused.store(0, Ordering::Relaxed);
        }
        if self.len.fetch_add(1, Ordering::Relaxed) < self.capacity {
            return true;
        }
        self.len.fetch_sub(1, Ordering::Relaxed);
        false
    }

    /// Drops every entry that can no longer answer at `at` or later; how
    /// many.
    fn sweep(&self, at: Stamp) -> usize {
        let mut removed = 0;
        self.entries.retain_sync(|_, entry| {
            let expired = self.expired(entry, at);
            removed += usize::from(expired);
            !expired
        });
        self.len.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    /// Forgets `client` (or everyone, for `None`) after Redis deleted its
    /// state: no entry made by a call that started before is used again.
    pub(super) fn invalidate(&self, client: Option<&str>) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        match client {
            Some(client) => {
                if self.entries.remove_sync(client).is_some() {
                    self.len.fetch_sub(1, Ordering::Relaxed);
                }
            }
            None => {
                let mut removed = 0;
                self.entries.retain_sync(|_, _| {
                    removed += 1;
                    false
                });
                self.len.fetch_sub(removed, Ordering::Relaxed);
            }
        }
    }

    /// How many clients are remembered.
    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// How many decisions were answered here.
    pub(super) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for Rejections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rejections")
            .field("len", &self.len())
            .field("capacity", &self.capacity)
            .field("hits", &self.hits())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejection(remaining: u64, retry_after: u64) -> Decision {
        Decision {
            allowed: false,
            remaining,
            retry_after,
            delay: 0,
            tick: crate::Tick::NANOSECOND,
            refused_by: 0,
            at: 0,
        }
    }

    fn retry(cache: &Rejections, cost: u64, now: u64) -> Option<u64> {
        cache
            .lookup("c", cost, Stamp::Given(now))
            .map(|decision| decision.retry_after)
    }

    #[test]
    fn a_rejection_answers_its_cost_and_larger_ones_until_its_deadline() {
        let cache = Rejections::new(8, 1_000);
        cache.insert("c", 3, Stamp::Given(10), 0, &rejection(2, 5));
        assert_eq!(retry(&cache, 2, 10), None, "a smaller cost says nothing");
        assert_eq!(retry(&cache, 3, 10), Some(5));
        assert_eq!(retry(&cache, 9, 12), Some(3));
        assert_eq!(retry(&cache, 3, 14), Some(1));
        assert_eq!(retry(&cache, 3, 9), None, "time before the rejection");
        assert_eq!(retry(&cache, 3, 15), None, "the deadline itself");
        // The expired entry was dropped on the way.
        assert_eq!(cache.len(), 0);

        // A smaller cost replaces a live entry; a larger one does not.
        cache.insert("c", 3, Stamp::Given(20), 0, &rejection(2, 10));
        cache.insert("c", 5, Stamp::Given(21), 0, &rejection(2, 30));
        assert_eq!(retry(&cache, 5, 22), Some(8));
        cache.insert("c", 1, Stamp::Given(22), 0, &rejection(0, 2));
        assert_eq!(retry(&cache, 1, 23), Some(1));
        // The same cost keeps the later deadline.
        cache.insert("c", 1, Stamp::Given(23), 0, &rejection(0, 4));
        assert_eq!(retry(&cache, 1, 25), Some(2));
        // Local stamps answer local calls only.
        assert_eq!(
            cache
                .lookup("c", 1, Stamp::Local(u64::MAX))
                .map(|d| d.retry_after),
            None
        );
        // Admissions, endless rejections and old generations are not kept.
        cache.invalidate(None);
        assert_eq!((cache.len(), retry(&cache, 1, 25)), (0, None));
        let admitted = Decision {
            allowed: true,
            ..rejection(1, 0)
        };
        cache.insert("c", 1, Stamp::Given(30), 1, &admitted);
        cache.insert("c", 1, Stamp::Given(30), 1, &rejection(0, u64::MAX));
        cache.insert("c", 1, Stamp::Given(30), 0, &rejection(0, 5));
        assert_eq!(cache.len(), 0);
        cache.insert("c", 1, Stamp::Given(30), 1, &rejection(0, 5));
        assert_eq!(retry(&cache, 1, 31), Some(4));
    }

    #[test]
    fn local_deadlines_count_whole_ticks_and_the_cap_holds() {
        let cache = Rejections::new(4, 1_000);
        let at = cache.stamp(None);
        cache.insert("c", 1, at, 0, &rejection(0, 1_000_000));
        let Stamp::Local(made) = at else {
            panic!("a call without a time is stamped locally")
        };
        let left = cache
            .lookup("c", 1, Stamp::Local(made + 1_500))
            .unwrap()
            .retry_after;
        assert_eq!(left, 999_998, "1.5 µs later: 999,998.5 µs, rounded down");
        assert_eq!(cache.lookup("c", 1, Stamp::Local(made + 999_999_500)), None);

        for id in 0..100 {
            cache.insert(&id.to_string(), 1, Stamp::Given(id), 0, &rejection(0, 2));
            assert!(cache.len() <= 4);
        }
        // Swept as the time passed: the newest are in.
        assert!(cache.lookup("99", 1, Stamp::Given(100)).is_some());
    }
}
