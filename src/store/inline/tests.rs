//! The store's own tests: its slots' sizes, its hasher, its tables' room,
//! and the most one arrival moves and sweeps.

use super::growth::{MOVE_CHUNK, PAGE};
use super::sweeps::{SWEEP_CHUNK, WHOLE_TABLE};
use super::*;

fn first_table(bounds: Bounds) -> (usize, usize, bool) {
    let store = InlineStore::<u64, AtomicU64>::new(bounds);
    let guard = Guard::new();
    let table = store.table.load(&guard);
    (table.capacity(), table.room, store.grows())
}

/// The slot sizes the module docs (and the README's memory table)
/// give: 24 bytes for a `u64` key and a one-word policy, which keeps no
/// origin; 48 for a two-word one, whose origin fills the padding.
#[test]
fn slots_are_the_sizes_the_docs_give() {
    use crate::policy::{FixedWindowState, GcraState, TokenBucketState};
    use crate::store::keyed::Client;
    use std::mem::size_of;
    assert_eq!(size_of::<Slot<u64, Client<GcraState, ()>>>(), 24);
    assert_eq!(size_of::<Slot<u64, Client<TokenBucketState, ()>>>(), 24);
    assert_eq!(size_of::<Slot<u64, Client<FixedWindowState, u64>>>(), 48);
    // With an origin, a one-word state would take a word more.
    assert_eq!(size_of::<Slot<u64, Client<GcraState, u64>>>(), 32);
    // Two rules in one word keep no origin (a drip rule beside a window
    // rule keeps its window's end instead), but for the wide pair, which
    // keeps it in the state, in the padding.
    use crate::policy::{PairState, WideWindowPairState, WindowPairState};
    assert_eq!(size_of::<Slot<u64, Client<PairState, ()>>>(), 32);
    assert_eq!(size_of::<Slot<u64, Client<WindowPairState, ()>>>(), 32);
    assert_eq!(size_of::<Slot<u64, Client<WideWindowPairState, ()>>>(), 48);
    // Any other rule set keeps the control word of its frame alone (it
    // holds the frame's length; a frame that needs the origin keeps it).
    use crate::policy::CompoundState;
    assert_eq!(size_of::<Slot<u64, Client<CompoundState, ()>>>(), 32);
}

/// Keys with structure spread over the slots as random keys do,
/// whatever the seeds (`KeyHasher`): 100,000 sequential, strided and
/// one-subnet keys placed by linear probing from `hash & mask`, as
/// `Table::probe` starts, in 2^17 slots (3/4 full), under 32 seeds.
/// Random keys' mean displacement there is 1.6 slots; with foldhash's
/// `fast` hasher, several of these seeds gave over 2, the worst 21.
#[test]
fn structured_keys_spread_under_every_seed() {
    const SLOTS: usize = 1 << 17;
    type KeySet = (&'static str, fn(u64) -> u64);
    let sets: [KeySet; 3] = [
        ("sequential", |k| k),
        ("stride 1024", |k| k << 10),
        ("one /8 subnet", |k| 0x0a00_0000 + k),
    ];
    for seed in 1..=32u64 {
        let shared = Box::leak(Box::new(foldhash::SharedSeed::from_u64(seed)));
        let hasher = KeyHasher::with_seed(seed.wrapping_mul(0x9e37_79b9), shared);
        for (name, key) in sets {
            let mut full = vec![false; SLOTS];
            let mut walked = 0u64;
            for k in 0..100_000 {
                let mut index = hasher.hash_one(key(k)) as usize & (SLOTS - 1);
                while full[index] {
                    index = (index + 1) & (SLOTS - 1);
                    walked += 1;
                }
                full[index] = true;
            }
            let mean = walked as f64 / 100_000.0;
            assert!(mean < 2.0, "{name} keys, seed {seed}: {mean:.2} slots");
        }
    }
}

/// A key hashes the same through any number of references, and as
/// any borrowed form: a rebuild hashes the key it moves (`&K`), a probe
/// the one it was given (`&Q`). `hash_one` broke this under `ahash`'s
/// nightly specialisation (`&u64` and `&&u64` differed), and every
/// moved client was lost to its probe.
#[test]
fn a_key_hashes_the_same_in_every_borrowed_form() {
    let store = InlineStore::<u64, AtomicU64>::new(Bounds::new());
    let key = 0x1234_5678_u64;
    assert_eq!(store.hash(&key), store.hash(&&key));
    assert_eq!(store.hash(&key), store.hash(&&&key));
    let strings = InlineStore::<String, AtomicU64>::new(Bounds::new());
    let owned = String::from("app-7");
    assert_eq!(strings.hash(&owned), strings.hash("app-7"));
    assert_eq!(strings.hash(&&owned), strings.hash(&"app-7"));
}

/// A capped table's room holds the cap and an eighth more, from a cap
/// of one up (a room below the cap would rebuild without end), and a
/// cap too large to allocate for starts small and grows.
#[test]
fn capped_tables_hold_their_cap_with_slack() {
    for cap in [0, 1, 3, 7, 8, 100, 100_000, 800_000] {
        let (capacity, room, grows) = first_table(Bounds::new().max_clients(cap));
        assert!(!grows, "cap {cap}");
        assert!(room > cap + cap / 8, "cap {cap}: room {room}");
        assert!(capacity <= 4 * (cap + 16), "cap {cap}: {capacity} slots");
    }
    assert_eq!(first_table(Bounds::new().max_clients(100_000)).0, 131_072);
    // A growing store's small first table is half used at most.
    assert_eq!(
        first_table(Bounds::new().max_clients(usize::MAX)),
        (FIRST_CAPACITY, FIRST_CAPACITY / 2, true)
    );
    assert_eq!(
        first_table(Bounds::new()),
        (FIRST_CAPACITY, FIRST_CAPACITY / 2, true)
    );
}

/// A growing store's tables take claims up to half their slots while
/// they are at most `SPARSE_BYTES` (16,384 slots of 24 bytes), 7/8
/// after; a capped store's always 7/8.
#[test]
fn small_growing_tables_are_half_used_at_most() {
    type Small = Table<u64, AtomicU64>;
    assert_eq!(std::mem::size_of::<Slot<u64, AtomicU64>>(), 24);
    assert_eq!(Small::room_for(16_384, true), 8_192);
    assert_eq!(Small::room_for(32_768, true), 28_672);
    assert_eq!(Small::room_for(16_384, false), 14_336);
    assert_eq!(Small::room_for(2, true), 1);
    assert_eq!(Small::room_for(2, false), 1);
}

/// A client for the store's own tests: the time of its last call, or
/// `RETIRED`. Idle `IDLE` ticks after it.
struct Stamp;

const RETIRED: u64 = u64::MAX;
const IDLE: u64 = 10_000;

impl Lifecycle<AtomicU64> for Stamp {
    fn new_client(&self, origin: u64) -> AtomicU64 {
        AtomicU64::new(origin)
    }

    fn retire_idle(&self, client: &AtomicU64, now: u64) -> bool {
        let at = client.load(Ordering::SeqCst);
        at != RETIRED
            && now >= at + IDLE
            && client
                .compare_exchange(at, RETIRED, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
    }

    fn relocate(&self, client: &AtomicU64) -> Option<AtomicU64> {
        let at = client.swap(RETIRED, Ordering::SeqCst);
        (at != RETIRED).then(|| AtomicU64::new(at))
    }
}

/// A new client `key`'s arrival at `now`; whether it was created.
fn arrive(store: &InlineStore<u64, AtomicU64>, key: u64, now: u64) -> bool {
    let hash = store.hash(&key);
    matches!(
        store.arrive(None, &key, hash, now, &Stamp, |client| (client, ())),
        Arrival::Created(())
    )
}

/// No arrival moves more than [`MOVE_CHUNK`] slots of a table larger
/// than [`WHOLE_TABLE`] (a smaller one moves whole, in one step), nor
/// sweeps any, counted slot by slot, while the
/// table grows from 64 slots to 2^21 (a million clients, fifteen
/// moves), and no arrival is made to finish a move: every client is
/// found after.
#[test]
fn growth_moves_at_most_a_chunk_per_arrival() {
    const CLIENTS: u64 = 1_000_000;
    let store = InlineStore::<u64, AtomicU64>::new(Bounds::new());
    Work::take();
    for key in 0..CLIENTS {
        assert!(arrive(&store, key, 0), "client {key}");
    }
    let most = Work::take();
    assert_eq!(most.moved, WHOLE_TABLE, "{most:?}");
    assert_eq!(most.moved_large, MOVE_CHUNK, "{most:?}");
    assert_eq!((most.swept, most.swept_large), (0, 0), "{most:?}");
    assert_eq!(most.forced, 0, "{most:?}");
    // The moves into tables of 1 MiB and more (2^16 slots of 24 bytes
    // and up: six of them) found their memory prepared, all zeroed.
    assert_eq!((most.prepared, most.unprepared), (6, 0), "{most:?}");
    assert_eq!(store.counts.rebuilds.load(Ordering::Relaxed), 15);
    assert_eq!(store.stored(), CLIENTS as usize);
    for key in 0..CLIENTS {
        assert!(store.peek(&key, |_| ()).is_some(), "client {key}");
    }
}

/// Two threads creating 300,000 clients each at once: each arrival
/// still moves at most a chunk, and none is forced to finish a move;
/// every client is created once and found after.
#[test]
fn racing_arrivals_move_at_most_a_chunk_each() {
    const EACH: u64 = 300_000;
    let store = InlineStore::<u64, AtomicU64>::new(Bounds::new());
    let most: Vec<Visits> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2u64)
            .map(|thread| {
                let store = &store;
                scope.spawn(move || {
                    Work::take();
                    for key in thread * EACH..(thread + 1) * EACH {
                        assert!(arrive(store, key, 0), "client {key}");
                    }
                    Work::take()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for most in most {
        assert!(most.moved <= WHOLE_TABLE, "{most:?}");
        assert!(most.moved_large <= MOVE_CHUNK, "{most:?}");
        assert_eq!(most.forced, 0, "{most:?}");
    }
    assert_eq!(store.stored(), 2 * EACH as usize);
    for key in 0..2 * EACH {
        assert!(store.peek(&key, |_| ()).is_some(), "client {key}");
    }
}

/// With idle eviction, a stream of one-shot clients, one tick apart:
/// each is idle `IDLE` ticks after it came, so about `IDLE` are not
/// idle at any time. No arrival sweeps more than [`SWEEP_CHUNK`] slots
/// of a large table (a table of at most [`WHOLE_TABLE`] is swept whole)
/// or moves more than [`MOVE_CHUNK`]; the sweeps do remove the idle
/// ones, and the table holds at most twice the clients that are not
/// idle, plus 64, plus one arrival per step of a sweep (module docs).
#[test]
fn sweeps_visit_at_most_a_chunk_per_arrival() {
    const ARRIVALS: u64 = 400_000;
    let store = InlineStore::<u64, AtomicU64>::new(Bounds::new().evict_idle());
    Work::take();
    let mut most_stored = 0;
    for key in 0..ARRIVALS {
        assert!(arrive(&store, key, key), "client {key}");
        most_stored = most_stored.max(store.stored());
    }
    let most = Work::take();
    assert!(most.swept <= WHOLE_TABLE && most.swept > 0, "{most:?}");
    assert_eq!(most.swept_large, SWEEP_CHUNK, "{most:?}");
    assert!(most.moved <= WHOLE_TABLE, "{most:?}");
    assert!(most.moved_large <= MOVE_CHUNK, "{most:?}");
    assert_eq!(most.forced, 0, "{most:?}");
    let steps = store.table.load(&Guard::new()).capacity() / SWEEP_CHUNK;
    let bound = 2 * (IDLE as usize + 1) + 64 + steps;
    assert!(most_stored <= bound, "{most_stored} > {bound}");
    assert!(store.counts.sweeps.load(Ordering::Relaxed) > 10);
}

/// A capped store under a flood of newcomers, with clients going idle:
/// the cap holds after every arrival, each arrival sweeps and moves
/// at most a chunk, and a newcomer finds a place again once the sweep
/// under way reaches idle clients.
#[test]
fn a_capped_flood_visits_at_most_a_chunk_per_arrival() {
    const CAP: usize = 50_000;
    let store = InlineStore::<u64, AtomicU64>::new(Bounds::new().max_clients(CAP));
    Work::take();
    let mut created = 0;
    for key in 0..1_000_000u64 {
        // One arrival a tick: the first CAP fill the cap, and each
        // client is idle IDLE ticks later, so at most IDLE are not.
        created += usize::from(arrive(&store, key, key));
        assert!(store.len() <= CAP);
    }
    let most = Work::take();
    // Its table holds the cap from the start: never small.
    assert_eq!((most.swept, most.swept_large), (0, SWEEP_CHUNK), "{most:?}");
    assert!(most.moved <= WHOLE_TABLE, "{most:?}");
    assert!(most.moved_large <= MOVE_CHUNK, "{most:?}");
    assert_eq!(most.forced, 0, "{most:?}");
    // Every tick past the first IDLE frees as many places as it brings
    // newcomers; the sweeps reach them within a few thousand arrivals.
    assert!(created > 999_000, "{created} created");
}

/// A cap too large to allocate for up front (`MOST_PRESIZED`): the
/// table grows until it holds the cap and is moved at that size from
/// then on, however many clients come and go, and every move into a
/// table of `PREPARE_FROM` bytes or more finds its memory prepared —
/// also when evictions during the preparing made the move need less
/// than was prepared. Time moves a tick every 128 arrivals, so a client
/// is idle 1.28 M arrivals after it came: the cap is reached, and a
/// rebuild finds about the cap's worth of clients live, more than half
/// its table's room.
#[test]
fn a_large_cap_stops_growing_at_the_table_that_holds_it() {
    const CAP: usize = MOST_PRESIZED;
    let largest = InlineStore::<u64, AtomicU64>::capacity_for_cap(CAP);
    assert!(largest > MOST_PRESIZED, "the cap's table is not presized");
    let store = InlineStore::<u64, AtomicU64>::new(
        Bounds::new()
            .evict_idle()
            .max_clients(CAP)
            .on_overflow(crate::Overflow::Reject),
    );
    Work::take();
    for key in 0..4 * CAP as u64 {
        arrive(&store, key, key / 128);
        assert!(store.len() <= CAP);
    }
    let most = Work::take();
    let table = store.table.load(&Guard::new()).capacity();
    assert_eq!(table, largest);
    // Fifteen moves grew it from 64 slots; the rest were at its size.
    let rebuilds = store.counts.rebuilds.load(Ordering::Relaxed);
    assert!(rebuilds > 15, "{rebuilds} rebuilds");
    assert_eq!(most.unprepared, 0, "{most:?}");
    assert!(most.prepared > 6, "{most:?}");
    assert!(most.moved_large <= MOVE_CHUNK, "{most:?}");
    assert!(most.swept_large <= SWEEP_CHUNK, "{most:?}");
    assert_eq!(most.forced, 0, "{most:?}");
}

/// Memory prepared for a doubled table serves a move that, after
/// evictions since, would have rebuilt at the same size: the move takes
/// it whole, and no table is made with its pages still to fault. The
/// table of 32,768 slots is the first whose next one arrivals prepare
/// (1.5 MiB); it is prepared all while its clients are live, then an
/// explicit sweep removes them all before its room runs out.
#[test]
fn a_move_takes_prepared_memory_larger_than_it_needs() {
    const SLOTS: usize = 1 << 15;
    let store = InlineStore::<u64, AtomicU64>::new(Bounds::new().evict_idle());
    let capacity = |store: &InlineStore<u64, AtomicU64>| store.table.load(&Guard::new()).capacity();
    let mut key = 0;
    let mut began = false;
    // Ends once the preparing began in the table of `SLOTS` and ended
    // with the memory whole: a step an arrival, a few hundred pages,
    // well before the table's room (`prepare_from`).
    while !began || store.preparing.load(Ordering::Relaxed) {
        assert!(arrive(&store, key, 0), "client {key}");
        key += 1;
        began |= capacity(&store) == SLOTS && store.preparing.load(Ordering::Relaxed);
    }
    assert_eq!(capacity(&store), SLOTS);
    assert_eq!(store.sweep(IDLE, &Stamp), key as usize);
    Work::take();
    let rebuilds = store.counts.rebuilds.load(Ordering::Relaxed);
    // Ends when the move the room's end begins has ended (one chunk an
    // arrival).
    while store.counts.rebuilds.load(Ordering::Relaxed) == rebuilds {
        assert!(arrive(&store, key, IDLE), "client {key}");
        key += 1;
    }
    let most = Work::take();
    assert_eq!(capacity(&store), 2 * SLOTS);
    assert_eq!((most.prepared, most.unprepared), (1, 0), "{most:?}");
}

/// `populate` maps pages and changes no byte: a buffer of marked bytes,
/// populated over a range that starts and ends inside pages (so the pages
/// it widens to hold bytes on both sides of it), reads the same after.
#[test]
fn populating_pages_changes_no_byte() {
    let mut bytes = vec![0xA5u8; 5 * PAGE];
    let start = bytes.as_mut_ptr().wrapping_add(PAGE / 2 + 3);
    super::growth::populate(start, start.wrapping_add(3 * PAGE));
    assert!(bytes.iter().all(|&byte| byte == 0xA5));
}
