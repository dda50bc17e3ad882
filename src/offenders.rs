//! The clients refused most, in bounded memory: a heavy-hitters summary fed
//! only by rejections.
//!
//! ```
//! use floodgate::offenders::Offenders;
//!
//! // At most 1,024 clients held, whatever the number of distinct ids.
//! let offenders = Offenders::<String>::new(1024);
//!
//! // On a rejection only (an admitted request pays nothing):
//! for _ in 0..3 {
//!     offenders.record("flooder", 1);
//! }
//! offenders.record("alice", 5);
//!
//! let top = offenders.top(10);
//! assert_eq!(top[0].key, "flooder");
//! assert_eq!((top[0].refused, top[0].error), (3, 0));
//!
//! // Once an interval: its report, and a new interval from here.
//! let report = offenders.take();
//! assert_eq!(report.recorded + report.unattributed, 4);
//! assert!(offenders.take().offenders.is_empty());
//! ```
//!
//! # What it is
//!
//! Space-Saving (Metwally, Agrawal and El Abbadi, "Efficient computation of
//! frequent and top-k elements in data streams", ICDT 2005) in `S` shards.
//! A key's hash chooses its shard; shard `s` holds at most `m_s` entries
//! (the capacity `k` split evenly: `m_s` is `k / S` or one more, and the
//! `m_s` add up to `k`). A record for a key its shard holds adds to that
//! key's entry. A record for a new key takes a free entry with count 1, or,
//! when the shard is full, takes over the entry with the smallest count
//! `μ_s`: count `μ_s + 1`, error `μ_s`.
//!
//! Entries are ranked by refusals (requests), not by units (costs): the
//! question is who was refused most often, and every refusal is one step
//! whatever it asked for. `units` comes along as a lower bound (below).
//!
//! # Error bound
//!
//! Per interval (since [`Offenders::new`] or the last [`Offenders::take`]),
//! let `N_s` be the records shard `s` took (a report's `recorded` is their
//! sum) and `f(x)` a key's refusals among them, its *attributed* refusals.
//! Space-Saving's invariants, per shard:
//!
//! * the counts add up to `N_s`, so when the shard is full its smallest
//!   count is `μ_s ≤ N_s / m_s`;
//! * an entry's count overestimates: `refused − error ≤ f(x) ≤ refused`,
//!   and `error ≤ μ_s ≤ N_s / m_s`;
//! * a key the shard does not hold has `f(x) ≤ μ_s`: every key with more
//!   than `N_s / m_s` attributed refusals is held.
//!
//! [`Report::error_bound`] is the largest `μ_s` among the shards that have
//! taken an entry over: the bound measured, at most `N_s / m_s`. Until a
//! shard takes one over, every key it saw is held with an exact count
//! (`error` 0): certain while the interval has seen at most
//! `capacity / shards` distinct keys. With a well-mixed hash,
//! `N_s` is about `N / S` and `m_s` about `k / S`, so the bound is about
//! `N / k`: with `k = 1024`, a client with 1% of all rejections is held
//! and named, its count off by at most about 0.1% of all rejections.
//!
//! A record that finds its shard busy is not attributed (below): it is
//! counted in [`Report::unattributed`] instead. So a key's true refusals in
//! the interval are at least `refused − error` and at most
//! `refused + unattributed`, and `recorded + unattributed` is exactly the
//! number of [`Offenders::record`] calls that returned normally.
//!
//! `units` is the sum of costs since the key took its entry: exact when
//! `error` is 0, otherwise a lower bound (the refusals `error` stands for
//! may have been another key's, and their costs are not kept).
//!
//! # Memory
//!
//! Everything is allocated in [`Offenders::new`] (and again by
//! [`Offenders::take`], whose report keeps the old entries): a shard never
//! grows, so a flood of distinct ids takes entries over instead of adding
//! them. Per
//! entry: the entry (key, hash, count, units, error, place in the shard's
//! heap), 4 bytes in the min-heap, and 8 to 16 bytes of index (4-byte slots,
//! a power of two at least twice the entries; 8 when `m_s` is a power of
//! two). For `m_s` a power of two, that is 60 bytes for a `u64` key, 68 for
//! an `IpAddr` and 76 for a `String` (plus the string's own bytes);
//! [`Offenders::footprint`] gives the total.
//!
//! # Concurrency
//!
//! [`Offenders::record`] never waits for another thread. It takes its
//! shard's mutex with `try_lock` only; if another thread holds it, the
//! record adds to two atomic counters (`unattributed`, its units) and
//! returns. There is no retry loop anywhere, so a record is a bounded number
//! of its own steps whatever other threads do: a hash, one `try_lock`, and
//! either an update of one shard (a probe of an index at most half full, a
//! sift in a heap of `m_s` entries) or two `fetch_add`s.
//!
//! Why nothing is lost or counted twice: a record either holds its shard's
//! lock and adds one to that shard's `recorded` and to one entry, or adds
//! one to `unattributed`; never both. [`Offenders::take`] swaps each shard's
//! whole state for an empty one under that shard's lock, and `unattributed`
//! for 0 with one atomic swap. A locked record lands entirely before or
//! entirely after the shard's swap (the lock orders them), and a
//! `fetch_add` entirely before or after the counter's swap (one atomic's
//! read-modify-writes are totally ordered), so each record is in exactly
//! one interval's report.
//!
//! Why try-lock rather than a lock-free table: a shard's update moves an
//! entry in a heap and its key in an index, several words that must change
//! together; a lock-free Space-Saving needs either a CAS loop whose retries
//! depend on other threads or per-word races that break the invariants
//! above. Skipping instead keeps every invariant exact over what is
//! attributed and puts the rest, counted, in one number. The cost: skips
//! fall where threads collide, and the hottest key's shard is where they
//! collide most, so under heavy contention a flooder's `refused` understates it by up to
//! `unattributed`; its rank among the attributed is still sound. Shards
//! (`S`, from [`Offenders::new`]) make collisions rarer: a record finds its
//! shard busy about `(T − 1) · d / S` of the time, for `T` threads each
//! spending a share `d` of its time inside `record`. The worst case is
//! threads doing nothing but record (`d` near 1): measured on two cores
//! with 16 shards, 5% of records went unattributed with two threads and
//! 15% with four (a thread preempted while holding a shard makes the
//! others skip it until it runs again). On a rejection path, where
//! recording is a small part of answering a request, `d` is far smaller.
//!
//! [`Offenders::top`] and [`Offenders::take`] are the reporter's calls, not
//! a check's: they take each shard's lock with `lock()`, waiting at most for
//! one record's update. `take` holds it only for a swap; `top` for copying
//! at most `n` of the shard's entries. Records meanwhile skip that shard.
//! A report is not a snapshot across shards: each shard is read at its own
//! moment.
//!
//! A key whose `Eq` or `ToOwned` panics inside `record` poisons its shard's
//! mutex; the summary is still whole (those run before any change, and the
//! key's `Hash` before the lock) and every later call uses it as before.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::mem;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

/// Randomly seeded per summary, so ids crafted to fall in one shard (and
/// so to raise its bound) in one process do not in another. foldhash's
/// `quality` variant: the shard comes from the hash's bits 32 and up, the
/// index probe from its low bits, and both must be well mixed.
type KeyHasher = foldhash::quality::RandomState;

/// An empty index slot.
const EMPTY: u32 = u32::MAX;

/// The most shards [`Offenders::new`] chooses.
const MAX_SHARDS: usize = 256;

/// The fewest entries per shard [`Offenders::new`] aims for: a shard's
/// bound is `N_s / m_s`, and a small `m_s` makes it depend more on how
/// evenly the hash spreads the records.
const MIN_PER_SHARD: usize = 16;

/// Shards per core for [`Offenders::new`]: two threads collide on a shard
/// about once in `S` records at most (module docs, measured).
const SHARDS_PER_CORE: usize = 8;

/// The clients refused most, in memory fixed at construction (module docs).
pub struct Offenders<K> {
    shards: Box<[Mutex<Shard<K>>]>,
    /// `S - 1`, `S` a power of two.
    shard_mask: usize,
    /// Each shard's entries: `m_s` is `base + 1` for the first `extra`
    /// shards, `base` for the rest.
    base: usize,
    extra: usize,
    hasher: KeyHasher,
    /// Records whose shard was busy. Relaxed, here and in `take`: each is
    /// one counter changed only by read-modify-writes (totally ordered on
    /// their own), and publishes nothing else.
    unattributed: AtomicU64,
    unattributed_units: AtomicU64,
}

/// One client in a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offender<K> {
    /// The client.
    pub key: K,
    /// Its refusals counted (requests); at most `error` above its true
    /// attributed refusals, never below them.
    pub refused: u64,
    /// The costs of the refusals recorded since the key took its entry: a
    /// lower bound, exact when `error` is 0.
    pub units: u64,
    /// How much `refused` may overcount: the count the key's entry had when
    /// the key took it over from another (0 if it took a free entry).
    pub error: u64,
}

/// One interval's summary, from [`Offenders::take`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report<K> {
    /// Every client held, by `refused` descending (ties: smaller `error`
    /// first). At most the capacity.
    pub offenders: Vec<Offender<K>>,
    /// Records attributed to a shard: the `N` of the bound.
    pub recorded: u64,
    /// The costs of those records.
    pub recorded_units: u64,
    /// Records that found their shard busy, and so are in no count. With
    /// `recorded`, exactly the interval's completed `record` calls.
    pub unattributed: u64,
    /// The costs of those records.
    pub unattributed_units: u64,
    /// The largest smallest count among the shards where a key took an
    /// entry over (0 if none did, and every count is exact): no entry's
    /// `error` exceeds it, and a client not listed had at most this many
    /// attributed refusals.
    pub error_bound: u64,
}

/// The most entries a summary holds: its index's slots are 4 bytes.
pub const MAX_CAPACITY: usize = 1 << 31;

impl<K> Offenders<K> {
    /// A summary of at most `capacity` clients, in a number of shards
    /// chosen for this machine: eight per core up to 256, a power of two,
    /// and fewer when `capacity` would leave a shard under 16 entries.
    ///
    /// # Panics
    ///
    /// If `capacity` is 0 or above 2^31 (the index's 4-byte slots).
    pub fn new(capacity: usize) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        let wanted = (cores * SHARDS_PER_CORE)
            .next_power_of_two()
            .min(MAX_SHARDS);
        // The largest power of two at most `capacity / MIN_PER_SHARD`, at
        // least 1.
        let fits = (capacity / MIN_PER_SHARD).max(1);
        let fits = 1 << (usize::BITS - 1 - fits.leading_zeros());
        Self::with_shards(capacity, wanted.min(fits))
    }

    /// A summary of at most `capacity` clients in `shards` shards (rounded
    /// up to a power of two, and down to at most `capacity`): fewer shards
    /// make the bound less dependent on the hash's spread, more make a busy
    /// shard rarer.
    ///
    /// # Panics
    ///
    /// If `capacity` or `shards` is 0, or `capacity` is above 2^31.
    pub fn with_shards(capacity: usize, shards: usize) -> Self {
        assert!(
            capacity > 0,
            "an offenders summary needs a capacity of at least 1"
        );
        assert!(
            capacity <= MAX_CAPACITY,
            "an offenders summary holds at most 2^31 entries"
        );
        assert!(shards > 0, "an offenders summary needs at least one shard");
        let mut count = shards.next_power_of_two();
        while count > capacity {
            count /= 2;
        }
        let (base, extra) = (capacity / count, capacity % count);
        let shards = (0..count)
            .map(|s| Mutex::new(Shard::new(base + usize::from(s < extra))))
            .collect();
        Self {
            shards,
            shard_mask: count - 1,
            base,
            extra,
            hasher: KeyHasher::default(),
            unattributed: AtomicU64::new(0),
            unattributed_units: AtomicU64::new(0),
        }
    }

    /// Shard `s`'s capacity, `m_s`.
    fn shard_capacity(&self, s: usize) -> usize {
        self.base + usize::from(s < self.extra)
    }

    /// The most clients held at once: the `capacity` it was made with.
    pub fn capacity(&self) -> usize {
        self.base * self.shards.len() + self.extra
    }

    /// The number of shards, `S`.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// The clients held now, at most [`capacity`](Self::capacity). Takes
    /// each shard's lock in turn (a reporter's call).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).entries.len()).sum()
    }

    /// Whether no client is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes the summary allocated: fixed at construction, whatever is
    /// recorded (a key's own heap bytes, such as a `String`'s, not
    /// included).
    pub fn footprint(&self) -> usize {
        let shards: usize = self.shards.iter().map(|s| lock(s).footprint()).sum();
        mem::size_of::<Self>() + mem::size_of_val(&*self.shards) + shards
    }

    /// Counts one refusal of `key`, costing `cost` units. Never waits: if
    /// another thread holds the key's shard, the refusal is counted as
    /// unattributed instead (module docs). Clones the key only when it
    /// takes an entry.
    pub fn record<Q>(&self, key: &Q, cost: u64)
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let hash = self.hasher.hash_one(key);
        // Bits 32 and up: the index probes from the low bits, and a shard's
        // keys must not share those (capacity ≤ 2^31 keeps an index under
        // 2^32 slots).
        let shard = &self.shards[(hash >> 32) as usize & self.shard_mask];
        let mut shard = match shard.try_lock() {
            Ok(guard) => guard,
            // Whole despite the panic (module docs).
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                // Relaxed: counters only (the fields' docs); `take`'s swap
                // sees each add exactly once, before or after it.
                self.unattributed.fetch_add(1, Ordering::Relaxed);
                self.unattributed_units.fetch_add(cost, Ordering::Relaxed);
                return;
            }
        };
        shard.record(key, hash, cost);
    }

    /// The `n` clients refused most so far this interval, by `refused`
    /// descending (ties: smaller `error` first). A reporter's call: takes
    /// each shard's lock in turn, copying at most `n` of its entries.
    pub fn top(&self, n: usize) -> Vec<Offender<K>>
    where
        K: Clone,
    {
        let mut all = Vec::with_capacity(n.saturating_mul(self.shards.len()).min(self.capacity()));
        // Allocated before any lock: a shard is held for the choice and the
        // copies only.
        let mut order = Vec::with_capacity(self.base + 1);
        for shard in self.shards.iter() {
            let shard = lock(shard);
            order.clear();
            order.extend(0..shard.entries.len() as u32);
            let rank = |&a: &u32, &b: &u32| shard.rank(a, b);
            if n < order.len() {
                order.select_nth_unstable_by(n, rank);
                order.truncate(n);
            }
            all.extend(order.iter().map(|&i| shard.entries[i as usize].offender()));
        }
        sort(&mut all);
        all.truncate(n);
        all
    }

    /// This interval's report, and a new interval from now: every shard
    /// and the unattributed counts start again from empty. A reporter's
    /// call: holds each shard's lock for one swap.
    pub fn take(&self) -> Report<K> {
        let mut report = Report {
            offenders: Vec::with_capacity(self.capacity()),
            recorded: 0,
            recorded_units: 0,
            unattributed: 0,
            unattributed_units: 0,
            error_bound: 0,
        };
        for (s, shard) in self.shards.iter().enumerate() {
            // Built before the lock: the swap is all it holds the lock for.
            let mut old = Shard::new(self.shard_capacity(s));
            mem::swap(&mut *lock(shard), &mut old);
            report.recorded += old.recorded;
            report.recorded_units = report.recorded_units.saturating_add(old.units);
            report.error_bound = report.error_bound.max(old.smallest());
            report
                .offenders
                .extend(old.entries.into_iter().map(Entry::into_offender));
        }
        // Relaxed: counters only (the fields' docs); nothing else is read
        // through them.
        report.unattributed = self.unattributed.swap(0, Ordering::Relaxed);
        report.unattributed_units = self.unattributed_units.swap(0, Ordering::Relaxed);
        sort(&mut report.offenders);
        report
    }
}

/// A shard's lock for a reporter's call: it may wait for one record's
/// update. A poisoned shard is whole (module docs).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Ranks a report: `refused` descending, then `error` ascending.
fn sort<K>(offenders: &mut [Offender<K>]) {
    offenders.sort_unstable_by(|a, b| b.refused.cmp(&a.refused).then(a.error.cmp(&b.error)));
}

/// One shard's Space-Saving summary: entries, a min-heap of them by count,
/// and an index from key to entry. All three are allocated at construction
/// and never grow.
struct Shard<K> {
    /// At most `capacity` entries; once full, entries are taken over, never
    /// removed.
    entries: Vec<Entry<K>>,
    /// Entry numbers, a binary min-heap by `refused`: the root is the entry
    /// a new key takes over.
    heap: Vec<u32>,
    /// Entry numbers by key hash, linear probing, `EMPTY` where free: a
    /// power of two at least twice the capacity, so a probe always meets an
    /// empty slot.
    index: Box<[u32]>,
    /// Records attributed to this shard, `N_s`; the entries' counts add up
    /// to it.
    recorded: u64,
    /// Whether a key has taken an entry over: until then every key seen is
    /// held, its count exact.
    took_over: bool,
    /// Their costs (saturating).
    units: u64,
}

struct Entry<K> {
    key: K,
    /// The key's hash, kept so that the index and its deletions never run
    /// the key's own `Hash` (module docs: a panic there changes nothing).
    hash: u64,
    refused: u64,
    units: u64,
    error: u64,
    /// This entry's place in `heap`.
    heap_at: u32,
}

impl<K> Entry<K> {
    fn offender(&self) -> Offender<K>
    where
        K: Clone,
    {
        Offender {
            key: self.key.clone(),
            refused: self.refused,
            units: self.units,
            error: self.error,
        }
    }

    fn into_offender(self) -> Offender<K> {
        Offender {
            key: self.key,
            refused: self.refused,
            units: self.units,
            error: self.error,
        }
    }
}

impl<K> Shard<K> {
    fn new(capacity: usize) -> Self {
        Self {
            entries: Vec::with_capacity(capacity),
            heap: Vec::with_capacity(capacity),
            index: vec![EMPTY; (capacity * 2).next_power_of_two()].into_boxed_slice(),
            recorded: 0,
            took_over: false,
            units: 0,
        }
    }

    fn footprint(&self) -> usize {
        self.entries.capacity() * mem::size_of::<Entry<K>>()
            + self.heap.capacity() * mem::size_of::<u32>()
            + mem::size_of_val(&*self.index)
    }

    /// The shard's error bound: `μ_s`, the smallest count, once a key has
    /// taken an entry over; 0 before, when every count is exact.
    fn smallest(&self) -> u64 {
        if self.took_over {
            self.heap
                .first()
                .map_or(0, |&i| self.entries[i as usize].refused)
        } else {
            0
        }
    }

    /// Report order between two entries.
    fn rank(&self, a: u32, b: u32) -> std::cmp::Ordering {
        let (a, b) = (&self.entries[a as usize], &self.entries[b as usize]);
        b.refused.cmp(&a.refused).then(a.error.cmp(&b.error))
    }

    /// Space-Saving's step. The key's own code (`eq`, `to_owned`) runs
    /// before anything changes, and the evicted key is dropped after, so a
    /// panic in any of them leaves the shard whole.
    fn record<Q>(&mut self, key: &Q, hash: u64, cost: u64)
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq + ToOwned<Owned = K>,
    {
        let evicted;
        if let Some(i) = self.find(key, hash) {
            let entry = &mut self.entries[i as usize];
            entry.refused += 1;
            entry.units = entry.units.saturating_add(cost);
            let at = entry.heap_at;
            self.sift_down(at);
            evicted = None;
        } else if self.entries.len() < self.entries.capacity() {
            let key = key.to_owned();
            let i = self.entries.len() as u32;
            self.entries.push(Entry {
                key,
                hash,
                refused: 1,
                units: cost,
                error: 0,
                heap_at: i,
            });
            self.heap.push(i);
            self.place(hash, i);
            self.sift_up(i);
            evicted = None;
        } else {
            let key = key.to_owned();
            let i = self.heap[0];
            let old_hash = self.entries[i as usize].hash;
            self.unplace(old_hash, i);
            let entry = &mut self.entries[i as usize];
            evicted = Some(mem::replace(&mut entry.key, key));
            entry.hash = hash;
            entry.error = entry.refused;
            entry.refused += 1;
            entry.units = cost;
            self.place(hash, i);
            self.sift_down(0);
            self.took_over = true;
        }
        self.recorded += 1;
        self.units = self.units.saturating_add(cost);
        drop(evicted);
    }

    fn mask(&self) -> usize {
        self.index.len() - 1
    }

    /// The entry holding `key`, if any. Ends: the index is at most half
    /// full, so the probe meets an empty slot within its length.
    fn find<Q>(&self, key: &Q, hash: u64) -> Option<u32>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let mask = self.mask();
        let mut at = hash as usize & mask;
        loop {
            let i = self.index[at];
            if i == EMPTY {
                return None;
            }
            let entry = &self.entries[i as usize];
            if entry.hash == hash && entry.key.borrow() == key {
                return Some(i);
            }
            at = (at + 1) & mask;
        }
    }

    /// Puts entry `i` in the index at its first free slot from its hash's.
    /// Ends as `find` does.
    fn place(&mut self, hash: u64, i: u32) {
        let mask = self.mask();
        let mut at = hash as usize & mask;
        while self.index[at] != EMPTY {
            at = (at + 1) & mask;
        }
        self.index[at] = i;
    }

    /// Takes entry `i` (hash `hash`) out of the index by backward shifting:
    /// each later entry of the run moves into the hole if the hole lies
    /// between its home slot and where it is, so every probe still finds
    /// it. Ends at the run's empty slot.
    fn unplace(&mut self, hash: u64, i: u32) {
        let mask = self.mask();
        let mut hole = hash as usize & mask;
        while self.index[hole] != i {
            hole = (hole + 1) & mask;
        }
        let mut at = (hole + 1) & mask;
        loop {
            let j = self.index[at];
            if j == EMPTY {
                break;
            }
            let home = self.entries[j as usize].hash as usize & mask;
            // `hole` lies in `[home, at)`, cyclically.
            if (at.wrapping_sub(home) & mask) >= (at.wrapping_sub(hole) & mask) {
                self.index[hole] = j;
                hole = at;
            }
            at = (at + 1) & mask;
        }
        self.index[hole] = EMPTY;
    }

    fn count_at(&self, at: usize) -> u64 {
        self.entries[self.heap[at] as usize].refused
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.entries[self.heap[a] as usize].heap_at = a as u32;
        self.entries[self.heap[b] as usize].heap_at = b as u32;
    }

    /// Restores the heap above `at` after its count fell behind (a new
    /// entry of count 1). Ends at the root at the latest.
    fn sift_up(&mut self, at: u32) {
        let mut at = at as usize;
        while at > 0 {
            let parent = (at - 1) / 2;
            if self.count_at(parent) <= self.count_at(at) {
                break;
            }
            self.swap(parent, at);
            at = parent;
        }
    }

    /// Restores the heap below `at` after its count grew. Ends at a leaf
    /// at the latest.
    fn sift_down(&mut self, at: u32) {
        let mut at = at as usize;
        loop {
            let (left, right) = (2 * at + 1, 2 * at + 2);
            let mut least = at;
            if left < self.heap.len() && self.count_at(left) < self.count_at(least) {
                least = left;
            }
            if right < self.heap.len() && self.count_at(right) < self.count_at(least) {
                least = right;
            }
            if least == at {
                break;
            }
            self.swap(at, least);
            at = least;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The structure's invariants: heap order and places, index finds
    /// every entry, counts add up to `recorded`.
    fn check<K: Hash + Eq>(shard: &Shard<K>) {
        for (at, &i) in shard.heap.iter().enumerate() {
            assert_eq!(shard.entries[i as usize].heap_at as usize, at);
            if at > 0 {
                assert!(shard.count_at((at - 1) / 2) <= shard.count_at(at));
            }
        }
        for (i, entry) in shard.entries.iter().enumerate() {
            assert_eq!(shard.find(entry.key.borrow(), entry.hash), Some(i as u32));
            assert!(entry.refused > entry.error);
        }
        let used = shard.index.iter().filter(|&&i| i != EMPTY).count();
        assert_eq!(used, shard.entries.len());
        let sum: u64 = shard.entries.iter().map(|e| e.refused).sum();
        assert_eq!(sum, shard.recorded);
    }

    /// Space-Saving's guarantees against exact counts, on one shard with
    /// colliding hashes (few index bits), a stream with heavy and light
    /// keys.
    #[test]
    fn one_shard_keeps_its_invariants_and_bound() {
        let hasher = KeyHasher::default();
        let mut rng = fastrand::Rng::with_seed(28);
        let mut shard = Shard::<u64>::new(16);
        let mut exact = HashMap::new();
        for step in 0..20_000u64 {
            let key = if rng.u8(..) < 64 {
                rng.u64(..4)
            } else {
                rng.u64(..500)
            };
            shard.record(&key, hasher.hash_one(key), 1);
            *exact.entry(key).or_insert(0u64) += 1;
            if step % 997 == 0 {
                check(&shard);
            }
        }
        check(&shard);
        let smallest = shard.smallest();
        assert!(smallest <= shard.recorded / 16);
        for entry in &shard.entries {
            let truth = exact[&entry.key];
            assert!(entry.refused - entry.error <= truth && truth <= entry.refused);
            assert!(entry.error <= smallest);
        }
        for (key, &truth) in &exact {
            if truth > smallest {
                assert!(
                    shard.find(key, hasher.hash_one(key)).is_some(),
                    "{key}: {truth}"
                );
            }
        }
    }

    /// Index deletions with every entry's hash in one home slot, and with
    /// runs that wrap around the table's end.
    #[test]
    fn index_deletions_keep_every_entry_findable() {
        for home in [0u64, 5, 7] {
            let mut shard = Shard::<u64>::new(4);
            for key in 0..4u64 {
                // Hashes whose low bits are `home`: runs from there, wrapping
                // at 8 slots.
                shard.record(&key, (key << 32) | home, 1);
            }
            check(&shard);
            for key in 10..40u64 {
                shard.record(&key, (key << 32) | (home + key % 2), 1);
                check(&shard);
            }
        }
    }

    #[test]
    fn shards_split_the_capacity_exactly() {
        for (capacity, shards) in [(1, 8), (5, 4), (100, 16), (1024, 64), (7, 3)] {
            let offenders = Offenders::<u64>::with_shards(capacity, shards);
            assert_eq!(offenders.capacity(), capacity);
            assert!(offenders.shards().is_power_of_two() && offenders.shards() <= capacity);
            let held: usize = offenders
                .shards
                .iter()
                .map(|s| lock(s).entries.capacity())
                .sum();
            assert_eq!(held, capacity);
        }
        let chosen = Offenders::<u64>::new(1024);
        assert!(chosen.shards() <= 1024 / MIN_PER_SHARD);
        assert_eq!(Offenders::<u64>::new(10).shards(), 1);
    }

    /// The bytes per entry the module docs state, for a power-of-two share.
    #[test]
    fn bytes_per_entry() {
        fn per_entry<K>() -> usize {
            Shard::<K>::new(64).footprint() / 64
        }
        assert_eq!(per_entry::<u64>(), 60);
        assert_eq!(per_entry::<std::net::IpAddr>(), 68);
        assert_eq!(per_entry::<String>(), 76);
    }

    /// A record that finds its shard held counts as unattributed, and
    /// returns (a thread's own `try_lock` on a mutex it holds fails, as
    /// another thread's would).
    #[test]
    fn a_busy_shard_counts_the_record_as_unattributed() {
        let offenders = Offenders::<u64>::with_shards(8, 1);
        offenders.record(&1, 1);
        {
            let _held = lock(&offenders.shards[0]);
            offenders.record(&1, 5);
            offenders.record(&2, 7);
        }
        offenders.record(&1, 1);
        let report = offenders.take();
        assert_eq!((report.recorded, report.recorded_units), (2, 2));
        assert_eq!((report.unattributed, report.unattributed_units), (2, 12));
        assert_eq!(report.offenders.len(), 1);
        assert_eq!(report.offenders[0].refused, 2);
    }

    /// A panicking `Eq` poisons the shard's mutex, and the summary goes on
    /// whole.
    #[test]
    fn a_panicking_key_leaves_the_summary_whole() {
        /// Hashed by its number; comparing a touchy one panics.
        #[derive(Clone)]
        struct Touchy(u8, bool);
        impl Hash for Touchy {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.0.hash(state);
            }
        }
        impl PartialEq for Touchy {
            fn eq(&self, other: &Self) -> bool {
                assert!(!(self.1 || other.1), "touchy");
                self.0 == other.0
            }
        }
        impl Eq for Touchy {}

        let offenders = Offenders::<Touchy>::with_shards(4, 1);
        offenders.record(&Touchy(1, false), 1);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            offenders.record(&Touchy(1, true), 1);
        }));
        assert!(panicked.is_err());
        assert!(offenders.shards[0].is_poisoned());
        offenders.record(&Touchy(1, false), 1);
        offenders.record(&Touchy(2, false), 1);
        check(&lock(&offenders.shards[0]));
        let report = offenders.take();
        assert_eq!((report.recorded, report.unattributed), (3, 0));
        assert_eq!(report.offenders[0].refused, 2);
    }
}
