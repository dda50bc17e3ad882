//! The pin of a hot check under three collectors, side by side in one run:
//! ours (`store::epoch`, reached through `floodgate::__bench`),
//! `crossbeam-epoch`'s and `seize`'s. Is a well-kept crate within the
//! runs' noise of ours? `benches/README.md`, "The collector: ours,
//! crossbeam-epoch or seize", has the method, the figures and the answer.
//!
//! Rows, each on 1 thread and on 2 (each thread its own key and slot):
//!
//! * `pin` — pin and unpin around an empty critical section;
//! * `shape-reject` — a check's shape under each pin: load the table
//!   pointer, the slot's key, then its GCRA state word, and decide; the
//!   flood quota rejects nearly all, so no write (a flood's common case);
//! * `shape-admit` — the same with every check admitted: a
//!   `compare_exchange` (AcqRel) on the state word, a locked instruction of
//!   the check's own on x86;
//! * `check-reject`, `check-admit` — the library's real hot check,
//!   `Limiter<u64, Gcra, ManualClock>::check_at` on one known client, at
//!   the same two quotas (ours is the only pin it can use).
//!
//! A plain harness, not criterion: every sample is one batch of operations
//! timed as a whole, and the rows take turns sample by sample (from a
//! different first row each round), so the machine's noise falls on all
//! of them alike.
//!
//! ```sh
//! cargo bench --bench pin                    # 41 samples of 10^6 per row
//! cargo bench --bench pin -- 61 2000000      # samples, operations per sample
//! cargo bench --bench pin -- --only shape-admit/seize 3000000   # one row, one
//!                                            # thread, untimed: for callgrind
//! ```

use std::hint::black_box;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use floodgate::policy::{Gcra, Policy};
use floodgate::{Config, Limiter, ManualClock};
use seize::Guard as _;

/// The flood quota (100 per millisecond) as GCRA sees it: one admission
/// per 10 µs and a burst of 100; with `now` moving [`NOW_STEP_NS`] a check,
/// about 1 check in 1,000 is admitted.
const FLOOD: Quota = Quota {
    interval: 10_000,
    tolerance: 10_000 * 99,
};

/// The admit quota (100 per 100 ns): every check admitted, so every check
/// writes.
const ADMIT: Quota = Quota {
    interval: 1,
    tolerance: 99,
};

/// How far each thread's `now` moves per check: about one check's time.
const NOW_STEP_NS: u64 = 10;

/// One key per thread; lane `i` is thread `i`'s.
const KEYS: [u64; 2] = [0x51_7cc1_b727_220a, 0x2545_f491_4f6c_dd1d];

#[derive(Clone, Copy)]
struct Quota {
    interval: u64,
    tolerance: u64,
}

/// A client's slot: its key beside its state word, on a line of its own so
/// that the two threads' slots share nothing.
#[repr(align(64))]
struct Slot {
    key: AtomicU64,
    state: AtomicU64,
}

/// The small table a check reaches through an `AtomicPtr`, as the store's
/// current table is.
struct Table {
    lanes: [Slot; 2],
}

impl Table {
    fn boxed() -> *mut Table {
        Box::into_raw(Box::new(Table {
            lanes: KEYS.map(|key| Slot {
                key: AtomicU64::new(key),
                state: AtomicU64::new(0),
            }),
        }))
    }
}

/// GCRA on the slot at `now`: the store's probe (key compare) and the
/// policy's step, one CAS when admitted.
#[inline(always)]
fn gcra(slot: &Slot, key: u64, now: u64, quota: Quota) -> bool {
    if slot.key.load(Ordering::Acquire) != key {
        return false;
    }
    let tat = slot.state.load(Ordering::Acquire);
    let start = tat.max(now);
    if start - now > quota.tolerance {
        return false;
    }
    slot.state
        .compare_exchange(
            tat,
            start + quota.interval,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok()
}

/// One collector's pin, as a check would take it.
trait Pinner: Sync {
    /// Runs `f` pinned.
    fn pinned<R>(&self, f: impl FnOnce() -> R) -> R;
    /// Runs `f` on the table `cell` points to, pinned, the pointer loaded
    /// the collector's way.
    fn with_table<R>(&self, cell: &AtomicPtr<Table>, f: impl FnOnce(&Table) -> R) -> R;
}

struct Ours;
struct Crossbeam;
struct Seize(seize::Collector);

impl Pinner for Ours {
    #[inline(always)]
    fn pinned<R>(&self, f: impl FnOnce() -> R) -> R {
        floodgate::__bench::pinned(f)
    }

    #[inline(always)]
    fn with_table<R>(&self, cell: &AtomicPtr<Table>, f: impl FnOnce(&Table) -> R) -> R {
        floodgate::__bench::pinned(|| {
            // SAFETY: the tables are freed only after every worker ended
            // (`main`), and never replaced.
            f(unsafe { &*cell.load(Ordering::Acquire) })
        })
    }
}

impl Pinner for Crossbeam {
    #[inline(always)]
    fn pinned<R>(&self, f: impl FnOnce() -> R) -> R {
        let _guard = crossbeam_epoch::pin();
        f()
    }

    #[inline(always)]
    fn with_table<R>(&self, cell: &AtomicPtr<Table>, f: impl FnOnce(&Table) -> R) -> R {
        let _guard = crossbeam_epoch::pin();
        // SAFETY: as `Ours::with_table`. (`crossbeam_epoch::Atomic::load`
        // is this Acquire load.)
        f(unsafe { &*cell.load(Ordering::Acquire) })
    }
}

impl Pinner for Seize {
    #[inline(always)]
    fn pinned<R>(&self, f: impl FnOnce() -> R) -> R {
        let _guard = self.0.enter();
        f()
    }

    #[inline(always)]
    fn with_table<R>(&self, cell: &AtomicPtr<Table>, f: impl FnOnce(&Table) -> R) -> R {
        let guard = self.0.enter();
        // SAFETY: as `Ours::with_table`. `protect` is seize's load (SeqCst,
        // a plain load on x86).
        f(unsafe { &*guard.protect(cell, Ordering::Acquire) })
    }
}

/// Everything the rows touch, shared by both threads.
struct Bench {
    seize: Seize,
    /// The shape rows' tables, one per quota (each slot's state is its
    /// quota's).
    flood_table: AtomicPtr<Table>,
    admit_table: AtomicPtr<Table>,
    flood_limiter: Limiter<u64, Gcra, ManualClock>,
    admit_limiter: Limiter<u64, Gcra, ManualClock>,
}

#[derive(Clone, Copy, PartialEq)]
enum Collector {
    Ours,
    Crossbeam,
    Seize,
}

#[derive(Clone, Copy, PartialEq)]
enum Work {
    Pin,
    ShapeReject,
    ShapeAdmit,
    CheckReject,
    CheckAdmit,
}

#[derive(Clone, Copy)]
struct Row {
    work: Work,
    collector: Collector,
    threads: usize,
}

impl Row {
    fn name(self) -> String {
        let work = match self.work {
            Work::Pin => "pin",
            Work::ShapeReject => "shape-reject",
            Work::ShapeAdmit => "shape-admit",
            Work::CheckReject => "check-reject",
            Work::CheckAdmit => "check-admit",
        };
        let collector = match self.collector {
            Collector::Ours => "ours",
            Collector::Crossbeam => "crossbeam",
            Collector::Seize => "seize",
        };
        format!("{work}/{collector}")
    }
}

fn rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for threads in [1, 2] {
        for work in [Work::Pin, Work::ShapeReject, Work::ShapeAdmit] {
            for collector in [Collector::Ours, Collector::Crossbeam, Collector::Seize] {
                rows.push(Row {
                    work,
                    collector,
                    threads,
                });
            }
        }
        for work in [Work::CheckReject, Work::CheckAdmit] {
            rows.push(Row {
                work,
                collector: Collector::Ours,
                threads,
            });
        }
    }
    rows
}

/// One thread's own: its lane and its `now`, which only grows.
struct Lane {
    index: usize,
    now: u64,
}

fn pin_loop(pinner: &impl Pinner, ops: u64) {
    for i in 0..ops {
        pinner.pinned(|| black_box(i));
    }
}

fn shape_loop(
    pinner: &impl Pinner,
    cell: &AtomicPtr<Table>,
    quota: Quota,
    lane: &mut Lane,
    ops: u64,
) -> u64 {
    let key = KEYS[lane.index];
    let mut admitted = 0;
    for _ in 0..ops {
        lane.now += NOW_STEP_NS;
        let now = lane.now;
        let index = lane.index;
        admitted += u64::from(pinner.with_table(cell, |table| {
            gcra(&table.lanes[index], black_box(key), now, quota)
        }));
    }
    admitted
}

fn check_loop(limiter: &Limiter<u64, Gcra, ManualClock>, lane: &mut Lane, ops: u64) -> u64 {
    let key = KEYS[lane.index];
    let mut admitted = 0;
    for _ in 0..ops {
        lane.now += NOW_STEP_NS;
        admitted += u64::from(limiter.check_at(black_box(&key), lane.now).allowed());
    }
    admitted
}

fn run_work(bench: &Bench, work: Work, collector: Collector, lane: &mut Lane, ops: u64) -> u64 {
    let table = |work| match work {
        Work::ShapeReject => (&bench.flood_table, FLOOD),
        _ => (&bench.admit_table, ADMIT),
    };
    match (work, collector) {
        (Work::Pin, Collector::Ours) => pin_loop(&Ours, ops),
        (Work::Pin, Collector::Crossbeam) => pin_loop(&Crossbeam, ops),
        (Work::Pin, Collector::Seize) => pin_loop(&bench.seize, ops),
        (Work::ShapeReject | Work::ShapeAdmit, collector) => {
            let (cell, quota) = table(work);
            return match collector {
                Collector::Ours => shape_loop(&Ours, cell, quota, lane, ops),
                Collector::Crossbeam => shape_loop(&Crossbeam, cell, quota, lane, ops),
                Collector::Seize => shape_loop(&bench.seize, cell, quota, lane, ops),
            };
        }
        (Work::CheckReject, _) => return check_loop(&bench.flood_limiter, lane, ops),
        (Work::CheckAdmit, _) => return check_loop(&bench.admit_limiter, lane, ops),
    }
    0
}

/// Times one batch, in ns per operation.
fn timed(bench: &Bench, row: Row, lane: &mut Lane, ops: u64) -> f64 {
    let start = Instant::now();
    black_box(run_work(bench, row.work, row.collector, lane, ops));
    start.elapsed().as_nanos() as f64 / ops as f64
}

/// What the main thread tells the second one before a sample.
#[derive(Clone, Copy)]
enum Command {
    Run { row: usize, generation: usize },
    Idle,
    Stop,
}

/// The second thread's side of a 2-thread sample, and the start line both
/// cross together.
struct Control {
    barrier: Barrier,
    command: Mutex<Command>,
    /// Arrivals at the start line: both threads spin until it reaches twice
    /// the sample's generation, so their batches overlap to within a few
    /// hundred ns (a barrier's wake-up alone is tens of µs apart).
    arrived: AtomicUsize,
    result: Mutex<f64>,
}

impl Control {
    fn start_line(&self, generation: usize) {
        self.arrived.fetch_add(1, Ordering::AcqRel);
        // Progress: ends when the other thread of this generation arrives,
        // its own `fetch_add` above; both are sent the same row.
        while self.arrived.load(Ordering::Acquire) < 2 * generation {
            std::hint::spin_loop();
        }
    }
}

fn helper(bench: &Bench, control: &Control, rows: &[Row], ops: u64) {
    let mut lane = Lane { index: 1, now: 0 };
    loop {
        control.barrier.wait();
        let command = *control.command.lock().unwrap();
        match command {
            Command::Stop => return,
            Command::Idle => {}
            Command::Run { row, generation } => {
                control.start_line(generation);
                let ns = timed(bench, rows[row], &mut lane, ops);
                *control.result.lock().unwrap() = ns;
            }
        }
        control.barrier.wait();
    }
}

/// The quantile `q` of sorted `values`, nearest rank.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank]
}

fn parse_args() -> (usize, u64, Option<String>) {
    let mut samples = 41;
    let mut ops = 1_000_000;
    let mut only = None;
    let mut numbers = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--only" {
            only = args.next();
        } else if !arg.starts_with('-') {
            numbers.push(arg.parse::<u64>().expect("a whole number"));
        }
        // Other flags (`--bench`, which cargo passes) are ignored.
    }
    if only.is_some() {
        if let Some(&n) = numbers.first() {
            ops = n;
        }
    } else {
        if let Some(&n) = numbers.first() {
            samples = n as usize;
        }
        if let Some(&n) = numbers.get(1) {
            ops = n;
        }
    }
    (samples, ops, only)
}

fn limiter(config: Config) -> Limiter<u64, Gcra, ManualClock> {
    Limiter::with_clock(
        Gcra::new(config).expect("a gcra quota"),
        ManualClock::new(0),
    )
    .expect("a limiter")
}

fn main() {
    let (samples, ops, only) = parse_args();
    let bench = Bench {
        seize: Seize(seize::Collector::new()),
        flood_table: AtomicPtr::new(Table::boxed()),
        admit_table: AtomicPtr::new(Table::boxed()),
        flood_limiter: limiter(Config::per(100, Duration::from_millis(1)).expect("a quota")),
        admit_limiter: limiter(Config::per(100, Duration::from_nanos(100)).expect("a quota")),
    };
    let rows = rows();

    if let Some(name) = only {
        let row = rows
            .iter()
            .find(|row| row.threads == 1 && row.name() == name)
            .unwrap_or_else(|| panic!("no row `{name}`"));
        let mut lane = Lane { index: 0, now: 0 };
        let admitted = run_work(&bench, row.work, row.collector, &mut lane, ops);
        println!("{name}: {ops} operations, {admitted} admitted");
        free_tables(&bench);
        return;
    }

    let control = Control {
        barrier: Barrier::new(2),
        command: Mutex::new(Command::Idle),
        arrived: AtomicUsize::new(0),
        result: Mutex::new(0.0),
    };
    let mut figures: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    std::thread::scope(|scope| {
        scope.spawn(|| helper(&bench, &control, &rows, ops));
        let mut lane = Lane { index: 0, now: 0 };
        let mut generation = 0;
        // Round 0 is a warm-up (each thread's first pin registers it with
        // each collector; each limiter meets its keys), not recorded.
        for round in 0..=samples {
            for turn in 0..rows.len() {
                let index = (turn + round) % rows.len();
                let row = rows[index];
                let two = row.threads == 2;
                if two {
                    generation += 1;
                }
                *control.command.lock().unwrap() = if two {
                    Command::Run {
                        row: index,
                        generation,
                    }
                } else {
                    Command::Idle
                };
                control.barrier.wait();
                if two {
                    control.start_line(generation);
                }
                let ns = timed(&bench, row, &mut lane, ops);
                control.barrier.wait();
                if round > 0 {
                    figures[index].push(ns);
                    if two {
                        figures[index].push(*control.result.lock().unwrap());
                    }
                }
            }
        }
        *control.command.lock().unwrap() = Command::Stop;
        control.barrier.wait();
    });
    free_tables(&bench);

    println!(
        "{samples} samples of {ops} operations per row, rows interleaved; \
         ns per operation on each thread (2 threads: both threads' samples)"
    );
    println!(
        "{:<22} {:>7} {:>7} {:>7} {:>7} {:>7} {:>10}",
        "row", "threads", "min", "median", "p90", "max", "vs ours"
    );
    let mut medians = vec![0.0; rows.len()];
    for (index, values) in figures.iter_mut().enumerate() {
        values.sort_by(f64::total_cmp);
        medians[index] = quantile(values, 0.5);
    }
    for (index, row) in rows.iter().enumerate() {
        let values = &figures[index];
        let ours = rows
            .iter()
            .position(|other| {
                other.work == row.work
                    && other.threads == row.threads
                    && other.collector == Collector::Ours
            })
            .expect("every row has ours");
        println!(
            "{:<22} {:>7} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>9.2}x",
            row.name(),
            row.threads,
            values[0],
            medians[index],
            quantile(values, 0.9),
            values[values.len() - 1],
            medians[index] / medians[ours],
        );
    }
}

fn free_tables(bench: &Bench) {
    for cell in [&bench.flood_table, &bench.admit_table] {
        // SAFETY: every worker has ended; each pointer came from
        // `Box::into_raw` and is swapped out once.
        drop(unsafe { Box::from_raw(cell.swap(std::ptr::null_mut(), Ordering::AcqRel)) });
    }
}
