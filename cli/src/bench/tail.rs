//! `floodgate bench --tail`: what the slowest calls cost, not the average.
//!
//! A throughput row hides the one call in a million that pays for everyone
//! (a table's growth, a sweep at the cap); a service behind the limiter sees
//! that call in its p99.99. So here every call is timed on its own.
//!
//! # The probe
//!
//! Two threads share one engine. One checks `--tail-known` known clients
//! (given their first check before the timing starts) round-robin, as fast
//! as it can; the other gives `N` clients never seen before their first
//! check, one after the other. Each call is timed alone, between two reads
//! of the TSC clock (a read pair with nothing between them is reported as
//! the floor), and counted in a log-linear histogram; the known thread stops
//! when the new one is done. Rows give p50, p99, p99.9, p99.99 and the max,
//! known and new clients apart.
//!
//! # Scenarios
//!
//! * **growth**: an unbounded limiter grows from the known clients to `N`
//!   more, for each `N` of `--tail-clients` (default 1 M and 4 M).
//! * **capped**: a limiter capped at the smallest `N` (`evict_idle`,
//!   `Overflow::Reject`) takes a flood of four times that many new ids.
//!   At 10 per 10 s a newcomer's one admission is 1 s of schedule: it is
//!   idle and evictable a second later, while the known clients, checked
//!   every millisecond or so, never are. So the flood fills the cap (at a
//!   few million ids a second), is rejected while nobody is idle, and then
//!   finds room as the first newcomers go idle: every arrival at the cap
//!   may run a sweep of the whole table. (At 10 ms of schedule the idle
//!   sweeps keep the table at tens of thousands and the cap is never
//!   reached.) governor has no cap: its row is its plain keyed limiter,
//!   never `retain_recent`-ed, holding every id of the flood.
//!
//! Every engine reads its own real clock, at `gcra` 10 per 10 s. Engines
//! run one after the other in one process (lock-free, mutex, governor),
//! each dropped before the next is built, so at most one table of 4 M
//! clients is alive at a time.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;

use floodgate::policy::{Gcra, Policy};
use floodgate::{
    Bounds, Clock, Config, Limiter, MutexLimiter, Overflow, PolicyKind, QuantaClock, RateLimiter,
};
use governor::DefaultKeyedRateLimiter;

use super::{governor_quota, parallel_capacity, EngineName, Subject, PROBE};

/// The tail rows' quota: a unit is 1 s, long enough that the capped
/// flood fills the cap before its first newcomers go idle, short enough
/// that they do within the flood.
const LIMIT: u64 = 10;
const WINDOW_NS: u64 = 10_000_000_000;

/// The default known clients: the throughput grid's uniform stream.
pub(super) const KNOWN: u64 = 10_000;

/// The default growth targets; the smallest is also the cap.
pub(super) const CLIENTS: [u64; 2] = [1_000_000, 4_000_000];

/// The capped flood brings this many times the cap in new ids.
const FLOOD: u64 = 4;

/// Percentiles, in parts per million of the calls.
const PERCENTILES: [u64; 4] = [500_000, 990_000, 999_000, 999_900];

/// Which clients a row timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Known,
    New,
}

impl Who {
    fn name(self) -> &'static str {
        match self {
            Who::Known => "known",
            Who::New => "new",
        }
    }
}

/// What a limiter is asked to hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    /// Unbounded, growing by `new` clients.
    Growth { new: u64 },
    /// Capped at `cap`, flooded by `new` ids.
    Capped { cap: u64, new: u64 },
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Growth { .. } => "growth",
            Scenario::Capped { .. } => "capped",
        }
    }

    fn new_clients(self) -> u64 {
        match self {
            Scenario::Growth { new } | Scenario::Capped { new, .. } => new,
        }
    }

    fn cap(self) -> Option<u64> {
        match self {
            Scenario::Growth { .. } => None,
            Scenario::Capped { cap, .. } => Some(cap),
        }
    }

    fn label(self) -> String {
        match self {
            Scenario::Growth { new } => format!("growth, {} new", count(new)),
            Scenario::Capped { cap, new } => format!("cap {}, {} new", count(cap), count(new)),
        }
    }
}

/// The scenarios `--tail-clients` asks for: one growth per target, then
/// the flood at a cap of the smallest.
fn scenarios(clients: &[u64]) -> Vec<Scenario> {
    let mut targets = clients.to_vec();
    targets.sort_unstable();
    targets.dedup();
    let mut all: Vec<Scenario> = targets
        .iter()
        .map(|&new| Scenario::Growth { new })
        .collect();
    if let Some(&cap) = targets.first() {
        all.push(Scenario::Capped {
            cap,
            new: cap * FLOOD,
        });
    }
    all
}

/// Call latencies in nanoseconds: exact below 512, then 256 buckets per
/// power of two (within 0.4 %). A known thread makes tens of millions of
/// calls in a run; a fixed 117 KB beats keeping them all.
struct Histogram {
    counts: Box<[u64]>,
    calls: u64,
    sum: u64,
    max: u64,
}

impl Histogram {
    /// log2 of the exact range, and of the sub-buckets per power of two
    /// above it, times two.
    const BITS: u32 = 9;
    const HALF: u64 = 1 << (Self::BITS - 1);

    fn new() -> Self {
        let buckets = Self::index(u64::MAX) + 1;
        Self {
            counts: vec![0; buckets].into_boxed_slice(),
            calls: 0,
            sum: 0,
            max: 0,
        }
    }

    /// Below `2^BITS` the value itself; above, its top `BITS` bits (in
    /// `[HALF, 2·HALF)`) after a shift, the shift counting `HALF` buckets.
    fn index(ns: u64) -> usize {
        if ns < 2 * Self::HALF {
            return ns as usize;
        }
        let shift = 64 - ns.leading_zeros() - Self::BITS;
        (u64::from(shift) * Self::HALF + (ns >> shift)) as usize
    }

    /// The largest value of bucket `index`.
    fn highest(index: usize) -> u64 {
        let index = index as u64;
        if index < 2 * Self::HALF {
            return index;
        }
        let shift = index / Self::HALF - 1;
        let top = index - shift * Self::HALF;
        u64::try_from(((u128::from(top) + 1) << shift) - 1).unwrap_or(u64::MAX)
    }

    #[inline]
    fn record(&mut self, ns: u64) {
        self.counts[Self::index(ns)] += 1;
        self.calls += 1;
        self.sum = self.sum.saturating_add(ns);
        self.max = self.max.max(ns);
    }

    /// The value at or below which `ppm` parts per million of the calls
    /// fell: its bucket's highest, never above the exact max, so the
    /// percentiles and the max are in order.
    fn percentile(&self, ppm: u64) -> u64 {
        let rank = (self.calls * ppm).div_ceil(1_000_000).max(1);
        let mut seen = 0;
        for (index, &count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Self::highest(index).min(self.max);
            }
        }
        self.max
    }
}

/// One row: one engine, one scenario, known or new clients.
pub(super) struct TailRow {
    scenario: Scenario,
    engine: EngineName,
    who: Who,
    known: u64,
    calls: u64,
    /// Share of the row's calls admitted.
    admitted: f64,
    mean: f64,
    /// p50, p99, p99.9, p99.99.
    percentiles: [u64; 4],
    max: u64,
    /// Clients the engine tracked when the new ones were all in.
    tracked: usize,
    /// Wall time of the new clients' pass.
    seconds: f64,
}

/// An engine as the probe sees it: a check, and how many clients it holds.
trait Probed: Subject {
    fn tracked(&self) -> usize;
}

impl Probed for Limiter<u64, Gcra, QuantaClock> {
    fn tracked(&self) -> usize {
        self.tracked_clients()
    }
}

impl Probed for MutexLimiter<u64, QuantaClock> {
    fn tracked(&self) -> usize {
        RateLimiter::<u64>::tracked_clients(self)
    }
}

impl Probed for DefaultKeyedRateLimiter<u64> {
    fn tracked(&self) -> usize {
        self.len()
    }
}

/// Client `i`'s id: a bijection of `u64`, so ids are distinct and look
/// random to every engine's hasher, as real ones do.
fn client_id(i: u64) -> u64 {
    let x = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 32)
}

/// What one engine's run measured.
struct Probe {
    known: Histogram,
    known_admitted: u64,
    new: Histogram,
    new_admitted: u64,
    tracked: usize,
    seconds: f64,
}

/// Gives `known` clients their first check, then times every call of the
/// two threads: the known clients round-robin while `new` new clients get
/// their first check.
fn probe<E: Probed>(engine: &E, known: u64, new: u64) -> Probe {
    for i in 0..known {
        engine.check(client_id(i), 0);
    }
    let barrier = Barrier::new(2);
    // Neither carries data (each thread's counts come back through
    // `join`): Relaxed.
    let (checking, done) = (AtomicBool::new(false), AtomicBool::new(false));
    std::thread::scope(|scope| {
        let known_thread = scope.spawn(|| {
            let clock = QuantaClock::new();
            let ids: Vec<u64> = (0..known).map(client_id).collect();
            let mut histogram = Histogram::new();
            let mut admitted = 0;
            let mut next = 0;
            barrier.wait();
            // Ends when the new clients' thread, below, has given every new
            // client its first check and sets `done`.
            while !done.load(Ordering::Relaxed) {
                let id = ids[next];
                next = if next + 1 == ids.len() { 0 } else { next + 1 };
                let start = clock.now();
                let allowed = engine.check(id, 0);
                let end = clock.now();
                histogram.record(end.saturating_sub(start));
                admitted += u64::from(allowed);
                checking.store(true, Ordering::Relaxed);
            }
            (histogram, admitted)
        });
        let clock = QuantaClock::new();
        let mut histogram = Histogram::new();
        let mut admitted = 0;
        barrier.wait();
        // A small run could end before the known thread is scheduled at
        // all: the new clients start once it has made its first call.
        // Progress: the known thread sets `checking` after its first check,
        // which nothing stops once it is past the barrier both passed.
        while !checking.load(Ordering::Relaxed) {
            std::hint::spin_loop();
            std::thread::yield_now();
        }
        let began = clock.now();
        for i in known..known + new {
            let id = client_id(i);
            let start = clock.now();
            let allowed = engine.check(id, 0);
            let end = clock.now();
            histogram.record(end.saturating_sub(start));
            admitted += u64::from(allowed);
        }
        let seconds = (clock.now() - began) as f64 / 1e9;
        done.store(true, Ordering::Relaxed);
        let (known, known_admitted) = known_thread.join().expect("the known thread panicked");
        Probe {
            known,
            known_admitted,
            new: histogram,
            new_admitted: admitted,
            tracked: engine.tracked(),
            seconds,
        }
    })
}

/// A read pair of the probe's clock with nothing between: the p50 under
/// every row's.
fn clock_floor() -> u64 {
    let clock = QuantaClock::new();
    let mut histogram = Histogram::new();
    for _ in 0..100_000 {
        let start = clock.now();
        let end = clock.now();
        histogram.record(end.saturating_sub(start));
    }
    histogram.percentile(PERCENTILES[0])
}

/// The tail rows, and the probe's clock floor in ns. The machine's
/// parallel capacity is probed before every engine's run, into
/// `capacities`.
pub(super) fn rows(
    clients: &[u64],
    known: u64,
    capacities: &mut Vec<f64>,
    cores: usize,
) -> (Vec<TailRow>, u64) {
    let config = Config::per_ticks(LIMIT, WINDOW_NS).expect("a valid quota");
    let floor = clock_floor();
    let mut rows = Vec::new();
    for scenario in scenarios(clients) {
        let bounds = match scenario.cap() {
            None => Bounds::new(),
            Some(cap) => Bounds::new()
                .evict_idle()
                .max_clients(usize::try_from(cap).expect("a cap fits in memory"))
                .on_overflow(Overflow::Reject),
        };
        let new = scenario.new_clients();
        for engine in [
            EngineName::LockFree,
            EngineName::Mutex,
            EngineName::Governor,
        ] {
            capacities.push(parallel_capacity(cores, PROBE));
            // Each engine is dropped at the end of its arm, before the
            // next is built.
            let measured = match engine {
                EngineName::LockFree => {
                    let policy = Gcra::new(config).expect("a valid quota");
                    let limiter: Limiter<u64, Gcra, QuantaClock> =
                        Limiter::with_bounds(policy, QuantaClock::new(), bounds)
                            .expect("valid bounds");
                    probe(&limiter, known, new)
                }
                EngineName::Mutex => {
                    let limiter: MutexLimiter<u64, QuantaClock> = MutexLimiter::with_bounds(
                        PolicyKind::Gcra,
                        config,
                        QuantaClock::new(),
                        bounds,
                    )
                    .expect("valid bounds");
                    probe(&limiter, known, new)
                }
                EngineName::Governor => {
                    let limiter = DefaultKeyedRateLimiter::<u64>::keyed(governor_quota(config));
                    probe(&limiter, known, new)
                }
                EngineName::Floor
                | EngineName::SeededFloor
                | EngineName::Counted
                | EngineName::Refunding
                | EngineName::Admitting
                | EngineName::Holding => {
                    unreachable!("the tail rows have no floor, do not count, give nothing back and hold nothing")
                }
            };
            for (who, histogram, admitted) in [
                (Who::Known, &measured.known, measured.known_admitted),
                (Who::New, &measured.new, measured.new_admitted),
            ] {
                rows.push(TailRow {
                    scenario,
                    engine,
                    who,
                    known,
                    calls: histogram.calls,
                    admitted: admitted as f64 / histogram.calls.max(1) as f64,
                    mean: histogram.sum as f64 / histogram.calls.max(1) as f64,
                    percentiles: PERCENTILES.map(|ppm| histogram.percentile(ppm)),
                    max: histogram.max,
                    tracked: measured.tracked,
                    seconds: measured.seconds,
                });
            }
        }
    }
    (rows, floor)
}

/// `1_000_000` as `1 M`, `2_000` as `2 k`: the scenarios' sizes.
fn count(n: u64) -> String {
    if n >= 1_000_000 && n.is_multiple_of(100_000) {
        format!("{} M", n as f64 / 1e6)
    } else if n >= 1_000 && n.is_multiple_of(100) {
        format!("{} k", n as f64 / 1e3)
    } else {
        n.to_string()
    }
}

/// A latency in the unit that keeps it short: `85 ns`, `4.1 µs`, `613 ms`.
fn duration(ns: u64) -> String {
    let ns = ns as f64;
    if ns < 1e3 {
        format!("{ns} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.1} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// The human-readable tail table.
pub(super) fn table(rows: &[TailRow], floor: u64) -> String {
    let mut out = String::new();
    let header = format!(
        "{:<20} {:<9} {:<6} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "tail (gcra 10/10s)",
        "engine",
        "client",
        "calls",
        "p50",
        "p99",
        "p99.9",
        "p99.99",
        "max",
        "admitted",
        "tracked",
        "secs",
    );
    let _ = writeln!(out, "\n{header}");
    let _ = writeln!(out, "{}", "-".repeat(header.chars().count()));
    let mut previous = None;
    for row in rows {
        if previous.is_some_and(|scenario| scenario != row.scenario) {
            out.push('\n');
        }
        previous = Some(row.scenario);
        let [p50, p99, p999, p9999] = row.percentiles.map(duration);
        let _ = writeln!(
            out,
            "{:<20} {:<9} {:<6} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8.1}% {:>9} {:>6.2}",
            row.scenario.label(),
            row.engine.name(),
            row.who.name(),
            row.calls,
            p50,
            p99,
            p999,
            p9999,
            duration(row.max),
            row.admitted * 100.0,
            row.tracked,
            row.seconds,
        );
    }
    out.push_str(&targets(rows));
    let known = rows.first().map_or(KNOWN, |row| row.known);
    let _ = writeln!(
        out,
        "\nEach call timed alone: one thread checks {known} known clients round-robin while \
         another gives the new ones their first check; capped: evict idle, reject at the cap \
         (governor has no cap: plain keyed limiter). Percentiles within 0.4 %, max exact; \
         an empty timed pair reads {}.",
        duration(floor)
    );
    out
}

/// The tail's targets, each from this run (issue: no call pays for the
/// whole table): per scenario, a new client's first check no slower than
/// governor's at its max and at p99.99, and a known client's check no
/// slower at p99.99.
fn targets(rows: &[TailRow]) -> String {
    let find = |scenario: Scenario, engine: EngineName, who: Who| {
        rows.iter()
            .find(|row| row.scenario == scenario && row.engine == engine && row.who == who)
    };
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let mut out = String::from("\ntargets (lockfree against governor, this run):\n");
    let mut scenarios: Vec<Scenario> = rows.iter().map(|row| row.scenario).collect();
    scenarios.dedup();
    for scenario in scenarios {
        for (who, what, value) in [
            (
                Who::New,
                "max",
                (|row: &TailRow| row.max) as fn(&TailRow) -> u64,
            ),
            (Who::New, "p99.99", |row: &TailRow| row.percentiles[3]),
            (Who::Known, "p99.99", |row: &TailRow| row.percentiles[3]),
        ] {
            let (Some(ours), Some(theirs)) = (
                find(scenario, EngineName::LockFree, who),
                find(scenario, EngineName::Governor, who),
            ) else {
                continue;
            };
            let (ours, theirs) = (value(ours), value(theirs));
            let _ = writeln!(
                out,
                "  {:<20} {:<5} client {:<6} {:>9} against {:>9}  (at most governor's: {})",
                scenario.label(),
                who.name(),
                what,
                duration(ours),
                duration(theirs),
                verdict(ours <= theirs),
            );
        }
    }
    out
}

/// The `--json` rows: `"keys": "tail"`, one per engine, scenario and
/// client kind, latencies in ns.
pub(super) fn json(rows: &[TailRow]) -> impl Iterator<Item = serde_json::Value> + '_ {
    rows.iter().map(|row| {
        let [p50, p99, p999, p9999] = row.percentiles;
        serde_json::json!({
            "policy": "gcra",
            "engine": row.engine.name(),
            "keys": "tail",
            "scenario": row.scenario.name(),
            "client": row.who.name(),
            "threads": 2,
            "known_clients": row.known,
            "new_clients": row.scenario.new_clients(),
            "max_clients": row.scenario.cap(),
            "calls": row.calls,
            "admitted": row.admitted,
            "mean_ns": row.mean,
            "p50_ns": p50,
            "p99_ns": p99,
            "p99_9_ns": p999,
            "p99_99_ns": p9999,
            "max_ns": row.max,
            "tracked": row.tracked,
            "seconds": row.seconds,
            "limit": LIMIT,
            "window_ns": WINDOW_NS,
            "clock": "quanta",
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_falls_in_a_bucket_that_holds_it_within_a_256th() {
        let mut values: Vec<u64> = (0..2_000).collect();
        values.extend((9..64).flat_map(|bit| {
            let power = 1u64 << bit;
            [power - 1, power, power + 1, power + power / 3]
        }));
        values.push(u64::MAX);
        for value in values {
            let index = Histogram::index(value);
            let highest = Histogram::highest(index);
            assert!(
                highest >= value,
                "{value}: bucket {index} ends at {highest}"
            );
            let lowest = if index == 0 {
                0
            } else {
                Histogram::highest(index - 1) + 1
            };
            assert!(
                lowest <= value,
                "{value}: bucket {index} starts at {lowest}"
            );
            assert!(
                (highest - lowest) as f64 <= value as f64 / 256.0,
                "{value}: bucket {lowest}..={highest}"
            );
        }
        assert_eq!(
            Histogram::index(u64::MAX) + 1,
            Histogram::new().counts.len()
        );
    }

    #[test]
    fn percentiles_rank_the_calls_and_never_pass_the_max() {
        let mut histogram = Histogram::new();
        // 9,990 calls of 100 ns, 9 of 10 µs and one of 1 s.
        for _ in 0..9_990 {
            histogram.record(100);
        }
        for _ in 0..9 {
            histogram.record(10_000);
        }
        histogram.record(1_000_000_000);
        assert_eq!(histogram.percentile(500_000), 100);
        assert_eq!(histogram.percentile(990_000), 100);
        // The 9,990th of 10,000 calls is the last at 100 ns; the 9,991st
        // the first at 10 µs, within a bucket's width.
        assert_eq!(histogram.percentile(999_000), 100);
        let p9999 = histogram.percentile(999_900);
        assert!((10_000..=10_000 + 10_000 / 256).contains(&p9999), "{p9999}");
        assert_eq!(histogram.percentile(1_000_000), 1_000_000_000);
        assert_eq!(histogram.max, 1_000_000_000);
        let mut one = Histogram::new();
        one.record(1_000_003);
        assert_eq!(one.percentile(500_000), 1_000_003);
    }

    #[test]
    fn the_smallest_target_is_the_cap_and_the_flood_four_times_it() {
        assert_eq!(
            scenarios(&CLIENTS),
            [
                Scenario::Growth { new: 1_000_000 },
                Scenario::Growth { new: 4_000_000 },
                Scenario::Capped {
                    cap: 1_000_000,
                    new: 4_000_000
                },
            ]
        );
        assert_eq!(
            scenarios(&[2_000, 2_000]),
            [
                Scenario::Growth { new: 2_000 },
                Scenario::Capped {
                    cap: 2_000,
                    new: 8_000
                },
            ]
        );
        assert_eq!(count(1_000_000), "1 M");
        assert_eq!(count(2_500_000), "2.5 M");
        assert_eq!(count(2_000), "2 k");
        assert_eq!(count(123), "123");
        assert_eq!(duration(85), "85 ns");
        assert_eq!(duration(4_100), "4.1 µs");
        assert_eq!(duration(613_000_000), "613.0 ms");
    }

    #[test]
    fn client_ids_are_distinct() {
        let mut ids: Vec<u64> = (0..100_000).map(client_id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 100_000);
    }
}
