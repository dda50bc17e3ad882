//! The engines as the timed loop sees them (`Subject`: one check of a
//! `u64` client at the loop's time), the floor, and the loop itself
//! (`Runner`), compiled once per engine.

use std::hash::BuildHasher;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

use floodgate::policy::{Gcra, InFlight, Policy};
use floodgate::{Clock, Config, Limiter, MutexLimiter, QuantaClock, RateLimiter};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::DefaultKeyedRateLimiter;

use super::{BATCH, NOW_STEP_NS, SYNC_EVERY};

/// The furthest `now` any timed loop reached, so that the next slice
/// starts from there: a loop's time runs faster than real time when its
/// checks take less than [`NOW_STEP_NS`], and must not step back between
/// slices. Relaxed: a lone value, read and raised by atomic steps only.
pub(super) static LOOP_TIME: AtomicU64 = AtomicU64::new(0);

/// The time the `caller` and `floor` rows start a slice from, in
/// nanoseconds: the later of real time since the bench's first look at it
/// and the furthest any loop reached.
pub(super) fn loop_epoch() -> u64 {
    static EPOCH: OnceLock<QuantaClock> = OnceLock::new();
    let real = EPOCH.get_or_init(QuantaClock::new).now();
    real.max(LOOP_TIME.load(Ordering::Relaxed))
}

/// Records that a loop reached `now`; the furthest any loop reached.
pub(super) fn loop_reached(now: u64) -> u64 {
    LOOP_TIME.fetch_max(now, Ordering::Relaxed).max(now)
}

/// One engine at one quota, as the timed loop sees it: a check of a `u64`
/// client. `now` is the loop's own time; an engine that reads its own
/// clock ignores it, and the loop's arithmetic on it then compiles away.
pub(super) trait Subject: Sync {
    /// Whether `check` decides at the loop's `now` (else the loop's time
    /// is dead code for it and compiles away).
    const AT_LOOP_TIME: bool = false;

    fn check(&self, key: u64, now: u64) -> bool;
}

impl<P: Policy, C: Clock> Subject for Limiter<u64, P, C> {
    #[inline]
    fn check(&self, key: u64, _now: u64) -> bool {
        Limiter::check(self, &key).allowed()
    }
}

impl Subject for MutexLimiter<u64, QuantaClock> {
    #[inline]
    fn check(&self, key: u64, _now: u64) -> bool {
        RateLimiter::<u64>::check(self, &key).allowed()
    }
}

impl<C> Subject
    for governor::RateLimiter<u64, DashMapStateStore<u64>, C, NoOpMiddleware<C::Instant>>
where
    C: governor::clock::Clock + Sync,
    C::Instant: Sync,
{
    #[inline]
    fn check(&self, key: u64, _now: u64) -> bool {
        self.check_key(&key).is_ok()
    }
}

/// The lock-free engine giving every admission back at once: each call is
/// an admission ([`RateLimiter::admit`]) and, when it admits, the refund
/// of its unit ([`RateLimiter::refund`], which reads the clock again, as a
/// caller's refund does). The client then stays full and every call pays
/// both, so a refund's own cost is this row's time less the plain row's.
pub(super) struct CheckThenRefund(pub(super) Limiter<u64, Gcra, QuantaClock>);

impl Subject for CheckThenRefund {
    #[inline]
    fn check(&self, key: u64, _now: u64) -> bool {
        match RateLimiter::admit(&self.0, &key) {
            Ok(admission) => {
                RateLimiter::refund(&self.0, admission, 1);
                true
            }
            Err(_) => false,
        }
    }
}

/// The lock-free engine under `in-flight:L`, releasing every admission at
/// once: each call is a check and, when it admits, a release of its unit
/// ([`RateLimiter::release`], which reads the clock again, as a guard's
/// drop does). Set beside the admitting check of one rate rule: what a
/// request pays for holding its slot.
pub(super) struct CheckThenRelease(pub(super) Limiter<u64, InFlight, QuantaClock>);

impl Subject for CheckThenRelease {
    #[inline]
    fn check(&self, key: u64, _now: u64) -> bool {
        let decision = Limiter::check(&self.0, &key);
        if decision.allowed() {
            RateLimiter::release(&self.0, &key, 1);
        }
        decision.allowed()
    }
}

/// The lock-free engine at the caller's time: `check_at` with the loop's
/// `now`, no clock read.
pub(super) struct AtCallersTime(pub(super) Limiter<u64, Gcra, QuantaClock>);

impl Subject for AtCallersTime {
    const AT_LOOP_TIME: bool = true;

    #[inline]
    fn check(&self, key: u64, now: u64) -> bool {
        self.0.check_at(&key, now).allowed()
    }
}

/// What the hardware allows a keyed GCRA check: a table of slots sized once
/// for its clients (at most half full, so probes stay short), each slot a
/// key and its theoretical arrival time side by side in 16 bytes, found by
/// a hash (`H`) and linear probing, updated by one compare-and-swap at the
/// caller's `now`. No clock, no policy object, no decision, no eviction,
/// no growth: the floor under every engine's row.
pub(super) struct FloorTable<H> {
    pub(super) slots: Box<[FloorSlot]>,
    /// Where each key's probe starts.
    pub(super) hash: H,
    /// Nanoseconds per admission.
    pub(super) interval: u64,
    /// How far ahead of `now` the arrival time may be and still admit: the
    /// burst of `limit` admissions, less one.
    pub(super) tolerance: u64,
}

/// Where a key's probe starts in a table of `2^bits` slots.
pub(super) trait FloorHash: Sync {
    fn for_slots(bits: u32) -> Self;
    /// The first slot of `key`'s path, below `2^bits`.
    fn start(&self, key: u64) -> usize;
}

/// Fibonacci hashing: the top `bits` bits of key × 2^64/φ. One multiply,
/// no seed. The bench's keys are ranks (`0..n`), which it spreads a
/// golden ratio apart: in a table of at least `2n` slots each has a slot
/// of its own (a unit test counts them), so no probe goes past its
/// first. The `floor` row.
pub(super) struct Fibonacci {
    bits: u32,
}

impl FloorHash for Fibonacci {
    fn for_slots(bits: u32) -> Self {
        Self { bits }
    }

    #[inline]
    fn start(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.bits)) as usize
    }
}

/// The hash the limiter's store uses (foldhash's `quality`, with a seed
/// drawn per table), its low bits the start: what a table of keys chosen
/// by its callers must pay, since a hash without a seed lets them choose
/// keys that share one path. It spreads the bench's ranks as it would any
/// keys: the `floor-seeded` row.
pub(super) struct Seeded {
    mask: usize,
    hasher: foldhash::quality::RandomState,
}

impl FloorHash for Seeded {
    fn for_slots(bits: u32) -> Self {
        Self {
            mask: (1 << bits) - 1,
            hasher: foldhash::quality::RandomState::default(),
        }
    }

    #[inline]
    fn start(&self, key: u64) -> usize {
        self.hasher.hash_one(key) as usize & self.mask
    }
}

/// One slot: a key (or [`EMPTY`]) and its client's
/// theoretical arrival time, in one 16-byte line segment.
#[repr(C, align(16))]
pub(super) struct FloorSlot {
    pub(super) key: AtomicU64,
    pub(super) arrival: AtomicU64,
}

/// No key: the bench's keys are below 2^32.
pub(super) const EMPTY: u64 = u64::MAX;

impl<H: FloorHash> FloorTable<H> {
    pub(super) fn new(clients: u64, config: Config) -> Self {
        let slots = (clients.max(1) * 2).next_power_of_two();
        Self {
            slots: (0..slots)
                .map(|_| FloorSlot {
                    key: AtomicU64::new(EMPTY),
                    arrival: AtomicU64::new(0),
                })
                .collect(),
            hash: H::for_slots(slots.trailing_zeros()),
            interval: config.interval(),
            tolerance: config.interval() * (config.limit() - 1),
        }
    }

    /// The client's slot, claimed on its first check.
    #[inline]
    fn slot(&self, key: u64) -> &FloorSlot {
        debug_assert_ne!(key, EMPTY);
        let mask = self.slots.len() - 1;
        let mut index = self.hash.start(key);
        for _ in 0..self.slots.len() {
            let slot = &self.slots[index];
            // Relaxed: a slot's key is written once, from EMPTY to its key,
            // and publishes nothing else. The arrival time beside it was 0
            // from the table's making, which happened before any thread
            // checked, and is only ever read and written by atomic steps,
            // which see its latest value whatever ordered them.
            let found = slot.key.load(Ordering::Relaxed);
            if found == key {
                return slot;
            }
            if found == EMPTY {
                // Relaxed, as above; a lost race to another key moves on,
                // a lost race to this key uses the slot.
                match slot
                    .key
                    .compare_exchange(EMPTY, key, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => return slot,
                    Err(winner) if winner == key => return slot,
                    Err(_) => {}
                }
            }
            index = (index + 1) & mask;
        }
        panic!("the floor table is full: it is sized for its key stream");
    }

    /// GCRA at `now`: admit if the arrival time is at most `tolerance`
    /// ahead, and move it one interval on.
    #[inline]
    fn check(&self, key: u64, now: u64) -> bool {
        let arrival = &self.slot(key).arrival;
        // Relaxed: the arrival time is the whole of the client's state;
        // the compare-and-swap alone decides which check wins a race.
        let mut current = arrival.load(Ordering::Relaxed);
        loop {
            let start = current.max(now);
            if start - now > self.tolerance {
                return false;
            }
            match arrival.compare_exchange_weak(
                current,
                start + self.interval,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(seen) => current = seen,
            }
        }
    }
}

impl<H: FloorHash> Subject for FloorTable<H> {
    const AT_LOOP_TIME: bool = true;

    #[inline]
    fn check(&self, key: u64, now: u64) -> bool {
        FloorTable::check(self, key, now)
    }
}

/// An engine's weighted check: one request of cost `cost`, all or nothing.
pub(super) trait WeightedCheck: Sync {
    fn check_n(&self, key: u64, cost: NonZeroU32) -> bool;
}

impl WeightedCheck for Limiter<u64, Gcra, QuantaClock> {
    #[inline]
    fn check_n(&self, key: u64, cost: NonZeroU32) -> bool {
        Limiter::check_n(self, &key, u64::from(cost.get())).allowed()
    }
}

impl WeightedCheck for MutexLimiter<u64, QuantaClock> {
    #[inline]
    fn check_n(&self, key: u64, cost: NonZeroU32) -> bool {
        RateLimiter::<u64>::check_n(self, &key, u64::from(cost.get())).allowed()
    }
}

impl WeightedCheck for DefaultKeyedRateLimiter<u64> {
    /// Admitted iff `Ok(Ok(()))`; `Err(InsufficientCapacity)` (a cost above
    /// the burst) counts as a refusal, as our `retry_after == u64::MAX` does.
    #[inline]
    fn check_n(&self, key: u64, cost: NonZeroU32) -> bool {
        matches!(self.check_key_n(&key, cost), Ok(Ok(())))
    }
}

/// An engine whose every check costs `cost`.
pub(super) struct Weighted<E> {
    pub(super) engine: E,
    pub(super) cost: NonZeroU32,
}

impl<E: WeightedCheck> Subject for Weighted<E> {
    #[inline]
    fn check(&self, key: u64, _now: u64) -> bool {
        self.engine.check_n(key, self.cost)
    }
}

/// What one slice measured.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Slice {
    pub(super) checks: u64,
    pub(super) admitted: u64,
    pub(super) elapsed: Duration,
}

/// The timed work behind one dynamic call per slice (never per check), so
/// engines of different types sit in one list while each loop is compiled
/// for its engine.
pub(super) trait Runner {
    fn prefill(&self, clients: u64);
    fn run(&self, sequences: &[Vec<u32>], threads: usize, slice: Duration) -> Slice;
    /// One first check for each of `per_thread` new keys on each of
    /// `threads` threads (thread `t` takes `t * per_thread..`).
    fn insert(&self, per_thread: u64, threads: usize) -> Slice;
}

impl<S: Subject> Runner for S {
    fn prefill(&self, clients: u64) {
        let now = loop_epoch();
        for key in 0..clients {
            self.check(key, now);
        }
    }

    fn insert(&self, per_thread: u64, threads: usize) -> Slice {
        let barrier = Barrier::new(threads + 1);
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads as u64)
                .map(|thread| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        let first = thread * per_thread;
                        let mut now = loop_epoch();
                        let mut admitted = 0u64;
                        barrier.wait();
                        for key in first..first + per_thread {
                            admitted += u64::from(self.check(key, now));
                            now += NOW_STEP_NS;
                        }
                        let end = Instant::now();
                        if S::AT_LOOP_TIME {
                            let _ = loop_reached(now);
                        }
                        (admitted, end)
                    })
                })
                .collect();
            barrier.wait();
            let start = Instant::now();
            workers
                .into_iter()
                .map(|worker| worker.join().expect("an insert thread panicked"))
                .fold(Slice::default(), |total, (admitted, end)| Slice {
                    checks: total.checks + per_thread,
                    admitted: total.admitted + admitted,
                    elapsed: total.elapsed.max(end - start),
                })
        })
    }

    fn run(&self, sequences: &[Vec<u32>], threads: usize, slice: Duration) -> Slice {
        let barrier = Barrier::new(threads + 1);
        // Written once by this thread, read by the workers between batches;
        // Relaxed suffices, as it carries no data: each worker's counts come
        // back through `join`.
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let workers: Vec<_> = sequences
                .iter()
                .take(threads)
                .map(|sequence| {
                    let (barrier, stop) = (&barrier, &stop);
                    scope.spawn(move || {
                        let mask = sequence.len() - 1;
                        let (mut checks, mut admitted) = (0usize, 0u64);
                        barrier.wait();
                        let mut now = loop_epoch();
                        while !stop.load(Ordering::Relaxed) {
                            for _ in 0..BATCH {
                                let key = u64::from(sequence[checks & mask]);
                                admitted += u64::from(self.check(key, now));
                                now += NOW_STEP_NS;
                                checks += 1;
                            }
                            if S::AT_LOOP_TIME && checks % SYNC_EVERY == 0 {
                                now = loop_reached(now);
                            }
                        }
                        let end = Instant::now();
                        if S::AT_LOOP_TIME {
                            let _ = loop_reached(now);
                        }
                        (checks as u64, admitted, end)
                    })
                })
                .collect();
            barrier.wait();
            let start = Instant::now();
            std::thread::sleep(slice);
            stop.store(true, Ordering::Relaxed);
            workers
                .into_iter()
                .map(|worker| worker.join().expect("a bench thread panicked"))
                .fold(Slice::default(), |total, (checks, admitted, end)| Slice {
                    checks: total.checks + checks,
                    admitted: total.admitted + admitted,
                    elapsed: total.elapsed.max(end - start),
                })
        })
    }
}
