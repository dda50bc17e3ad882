//! Criterion group `store`: which keyed table a check should find its
//! client's state in. Every design runs the same step on the same key
//! streams — find the `u64` key, then one GCRA compare-and-swap on the
//! client's state word at a `now` the loop advances, no clock, no policy
//! object, no decision — so the only difference is the table:
//!
//! * `hashindex-arc` — today's store: `scc::HashIndex<u64, Arc<AtomicU64>>`,
//!   read lock-free by `peek_with`, the state one pointer hop from the entry;
//! * `hashmap-inline` — `scc::HashMap<u64, AtomicU64>`, the state in the
//!   entry, read through `read_sync` (a shared bucket lock);
//! * `papaya-inline` — `papaya::HashMap<u64, AtomicU64>`, read under a pin
//!   taken per check;
//! * `dashmap-inline` — `DashMap<u64, AtomicU64>`, governor's design: a
//!   shard's read lock per check;
//! * `floor` — a table of 16-byte `(key, state)` slots sized once (at most
//!   half full), a multiplicative hash and linear probing: what the
//!   hardware allows.
//!
//! The maps hash with a randomly seeded `ahash`, as the store does. The
//! streams are `floodgate bench`'s: 10,000 clients drawn uniformly and
//! 100,000 drawn by a Zipf law (s = 1), every client inserted before
//! timing, on 1 and 2 threads (each its own key sequence). Each thread's
//! `now` moves 10 ns per check, and the threads meet at the furthest
//! every 1,024 checks. `benches/README.md` has the results.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const UNIFORM_CLIENTS: u64 = 10_000;
const ZIPF_CLIENTS: u64 = 100_000;
const THREADS: [usize; 2] = [1, 2];

/// `floodgate bench`'s default quota, 100 per millisecond, as GCRA sees it:
/// one admission per 10 µs, and a burst of 100.
const INTERVAL_NS: u64 = 10_000;
const TOLERANCE_NS: u64 = INTERVAL_NS * 99;

/// How far the loop's `now` moves per check: about one check's wall time.
const NOW_STEP_NS: u64 = 10;

/// GCRA on one state word at `now`: admit if the theoretical arrival time
/// is at most the tolerance ahead, and move it one interval on.
#[inline]
fn gcra(arrival: &AtomicU64, now: u64) -> bool {
    // Relaxed: the word is the client's whole state and publishes nothing;
    // the compare-and-swap alone decides which of two racing checks wins.
    let mut current = arrival.load(Ordering::Relaxed);
    loop {
        let start = current.max(now);
        if start - now > TOLERANCE_NS {
            return false;
        }
        match arrival.compare_exchange_weak(
            current,
            start + INTERVAL_NS,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => return true,
            Err(seen) => current = seen,
        }
    }
}

/// One table design: the check of a known client, and the insert that
/// makes a client known.
trait Design: Sync {
    fn insert(&self, key: u64);
    fn check(&self, key: u64, now: u64) -> bool;
}

type Hasher = ahash::RandomState;

struct HashIndexArc(scc::HashIndex<u64, Arc<AtomicU64>, Hasher>);

impl Design for HashIndexArc {
    fn insert(&self, key: u64) {
        let _ = self.0.insert_sync(key, Arc::new(AtomicU64::new(0)));
    }

    #[inline]
    fn check(&self, key: u64, now: u64) -> bool {
        self.0
            .peek_with(&key, |_, state| gcra(state, now))
            .unwrap_or(false)
    }
}

struct HashMapInline(scc::HashMap<u64, AtomicU64, Hasher>);

impl Design for HashMapInline {
    fn insert(&self, key: u64) {
        let _ = self.0.insert_sync(key, AtomicU64::new(0));
    }

    #[inline]
    fn check(&self, key: u64, now: u64) -> bool {
        self.0
            .read_sync(&key, |_, state| gcra(state, now))
            .unwrap_or(false)
    }
}

struct PapayaInline(papaya::HashMap<u64, AtomicU64, Hasher>);

impl Design for PapayaInline {
    fn insert(&self, key: u64) {
        self.0.pin().insert(key, AtomicU64::new(0));
    }

    #[inline]
    fn check(&self, key: u64, now: u64) -> bool {
        self.0.pin().get(&key).is_some_and(|state| gcra(state, now))
    }
}

struct DashMapInline(dashmap::DashMap<u64, AtomicU64, Hasher>);

impl Design for DashMapInline {
    fn insert(&self, key: u64) {
        self.0.insert(key, AtomicU64::new(0));
    }

    #[inline]
    fn check(&self, key: u64, now: u64) -> bool {
        self.0.get(&key).is_some_and(|state| gcra(&state, now))
    }
}

/// The floor: 16-byte slots of a key and its state, sized once for the
/// stream's clients.
struct Floor {
    slots: Box<[Slot]>,
    /// log2 of the slot count: the hash keeps that many top bits.
    bits: u32,
}

#[repr(C, align(16))]
struct Slot {
    key: AtomicU64,
    arrival: AtomicU64,
}

impl Floor {
    /// No key: the streams' keys are below 2^32.
    const EMPTY: u64 = u64::MAX;

    fn new(clients: u64) -> Self {
        let slots = (clients.max(1) * 2).next_power_of_two();
        Self {
            slots: (0..slots)
                .map(|_| Slot {
                    key: AtomicU64::new(Self::EMPTY),
                    arrival: AtomicU64::new(0),
                })
                .collect(),
            bits: slots.trailing_zeros(),
        }
    }

    /// The key's slot, or the empty slot where it would go.
    #[inline]
    fn probe(&self, key: u64) -> &Slot {
        let mask = self.slots.len() - 1;
        // Fibonacci hashing: the top `bits` bits of key × 2^64/φ.
        let mut index = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.bits)) as usize;
        loop {
            let slot = &self.slots[index];
            // Relaxed: a key is written once, from EMPTY, and publishes
            // nothing; the state beside it is only touched by atomic steps.
            let found = slot.key.load(Ordering::Relaxed);
            if found == key || found == Self::EMPTY {
                return slot;
            }
            index = (index + 1) & mask;
        }
    }
}

impl Design for Floor {
    /// Single-threaded, before timing, into a table at most half full.
    fn insert(&self, key: u64) {
        // Relaxed, as in `probe`: the timed threads start after this.
        self.probe(key).key.store(key, Ordering::Relaxed);
    }

    #[inline]
    fn check(&self, key: u64, now: u64) -> bool {
        let slot = self.probe(key);
        // Relaxed, as in `probe`.
        slot.key.load(Ordering::Relaxed) == key && gcra(&slot.arrival, now)
    }
}

/// The furthest `now` any thread reached: a sample starts from it, and
/// the threads meet there every [`SYNC_EVERY`] checks, so a descheduled
/// thread does not fall behind its clients' states. Relaxed: a lone value,
/// read and raised by atomic steps only.
static LOOP_TIME: AtomicU64 = AtomicU64::new(0);

/// 1,024 checks move a thread's `now` about 10 µs: one admission's
/// interval, far inside the burst.
const SYNC_EVERY: usize = 1_024;

/// `iters` checks on each of `threads` threads, each cycling through its
/// own key sequence at a `now` that moves [`NOW_STEP_NS`] per check; the
/// wall time from a common start to the last thread's finish. Generic, so
/// each design's check is inlined into its own loop.
fn run<D: Design>(design: &D, sequences: &[Vec<u32>], iters: u64) -> Duration {
    let barrier = Barrier::new(sequences.len() + 1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = sequences
            .iter()
            .map(|keys| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let mask = keys.len() - 1;
                    let mut now = LOOP_TIME.load(Ordering::Relaxed);
                    let mut admitted = 0u64;
                    barrier.wait();
                    for i in 0..iters as usize {
                        admitted += u64::from(design.check(u64::from(keys[i & mask]), now));
                        now += NOW_STEP_NS;
                        if i % SYNC_EVERY == SYNC_EVERY - 1 {
                            now = LOOP_TIME.fetch_max(now, Ordering::Relaxed).max(now);
                        }
                    }
                    let end = Instant::now();
                    LOOP_TIME.fetch_max(now, Ordering::Relaxed);
                    std::hint::black_box(admitted);
                    end
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a bench thread panicked") - start)
            .max()
            .unwrap_or_default()
    })
}

/// Inserts every client into `design`, checks that each is found, then
/// times it on 1 and 2 threads.
fn bench<D: Design>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    design: D,
    clients: u64,
    sequences: &[Vec<u32>],
) {
    for key in 0..clients {
        design.insert(key);
    }
    assert!(
        (0..clients).all(|key| design.check(key, 0)),
        "{name} lost a client"
    );
    for threads in THREADS {
        // Elements per iteration = threads: each thread does `iters`.
        group.throughput(Throughput::Elements(threads as u64));
        group.bench_function(BenchmarkId::new(name, threads), |b| {
            b.iter_custom(|iters| run(&design, &sequences[..threads], iters));
        });
    }
}

/// Ranks `0..n` with `P(k) ∝ 1 / (k + 1)`: the Zipf sampler of
/// `benches/limiter.rs` and `floodgate bench`, kept in step by hand.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(n: u64) -> Self {
        let mut total = 0.0;
        let cumulative = (1..=n)
            .map(|rank| {
                total += 1.0 / rank as f64;
                total
            })
            .collect();
        Self { cumulative }
    }

    fn sample(&self, rng: &mut fastrand::Rng) -> u32 {
        let last = self.cumulative.len() - 1;
        let target = rng.f64() * self.cumulative[last];
        self.cumulative.partition_point(|&c| c <= target).min(last) as u32
    }
}

fn store(c: &mut Criterion) {
    // One sequence per thread, each with its own fixed seed (as in
    // `floodgate bench`), a power of two long.
    let zipf = Zipf::new(ZIPF_CLIENTS);
    let seeded = |thread: usize| fastrand::Rng::with_seed(0x5EED ^ thread as u64);
    let uniform: Vec<Vec<u32>> = (0..THREADS[1])
        .map(|thread| {
            let mut rng = seeded(thread);
            (0..1 << 16)
                .map(|_| rng.u64(..UNIFORM_CLIENTS) as u32)
                .collect()
        })
        .collect();
    let zipfian: Vec<Vec<u32>> = (0..THREADS[1])
        .map(|thread| {
            let mut rng = seeded(thread);
            (0..1 << 18).map(|_| zipf.sample(&mut rng)).collect()
        })
        .collect();
    for (stream, clients, keys) in [
        ("uniform", UNIFORM_CLIENTS, &uniform),
        ("zipf", ZIPF_CLIENTS, &zipfian),
    ] {
        let mut group = c.benchmark_group(format!("store/{stream}"));
        group
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3))
            .sample_size(20)
            .nresamples(5_000);
        // A capacity of the client count keeps every map from resizing
        // during the inserts; none resizes while timed, as every check is
        // of a known client. Each map hashes with its own seeded ahash.
        let capacity = clients as usize;
        bench(
            &mut group,
            "hashindex-arc",
            HashIndexArc(scc::HashIndex::with_capacity_and_hasher(
                capacity,
                Hasher::new(),
            )),
            clients,
            keys,
        );
        bench(
            &mut group,
            "hashmap-inline",
            HashMapInline(scc::HashMap::with_capacity_and_hasher(
                capacity,
                Hasher::new(),
            )),
            clients,
            keys,
        );
        bench(
            &mut group,
            "papaya-inline",
            PapayaInline(papaya::HashMap::with_capacity_and_hasher(
                capacity,
                Hasher::new(),
            )),
            clients,
            keys,
        );
        bench(
            &mut group,
            "dashmap-inline",
            DashMapInline(dashmap::DashMap::with_capacity_and_hasher(
                capacity,
                Hasher::new(),
            )),
            clients,
            keys,
        );
        bench(&mut group, "floor", Floor::new(clients), clients, keys);
        group.finish();
    }
}

criterion_group!(benches, store);
criterion_main!(benches);
