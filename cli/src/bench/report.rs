//! What `floodgate bench` prints of its main rows: each row's ratios to
//! the baseline, governor and the floor, the table, the targets it checks
//! and `--json`.

use std::fmt::Write as _;

use floodgate::PolicyKind;

use super::{ClockKind, EngineName, Keys, Row};

/// Fills each row's ratios to the mutex baseline and to governor measured
/// at the same policy, clock, cost, thread count and keys, and to the floor
/// row of the same thread count and keys.
pub(super) fn add_ratios(rows: &mut [Row]) {
    let rate_of = |rows: &[Row], row: &Row, engine: EngineName| {
        rows.iter()
            .find(|other| {
                other.engine == engine
                    && other.policy == row.policy
                    && other.clock == row.clock
                    && other.cost == row.cost
                    && other.threads == row.threads
                    && other.keys == row.keys
            })
            .map(|other| other.ops_per_sec)
    };
    let floor_of = |rows: &[Row], row: &Row| {
        rows.iter()
            .find(|other| {
                other.engine == EngineName::Floor
                    && other.threads == row.threads
                    && other.keys == row.keys
            })
            .map(|other| other.ops_per_sec)
    };
    for index in 0..rows.len() {
        let row = &rows[index];
        let vs_mutex = rate_of(rows, row, EngineName::Mutex).map(|rate| row.ops_per_sec / rate);
        let vs_governor =
            rate_of(rows, row, EngineName::Governor).map(|rate| row.ops_per_sec / rate);
        let vs_floor = floor_of(rows, row).map(|rate| row.ops_per_sec / rate);
        let vs_uncounted = (row.engine == EngineName::Counted)
            .then(|| rate_of(rows, row, EngineName::LockFree))
            .flatten()
            .map(|rate| row.ops_per_sec / rate);
        rows[index].vs_uncounted = vs_uncounted;
        rows[index].vs_mutex = vs_mutex;
        rows[index].vs_governor = vs_governor;
        rows[index].vs_floor = vs_floor;
    }
}

pub(super) fn ratio(value: Option<f64>) -> String {
    value.map_or_else(String::new, |r| format!("{r:.2}x"))
}

pub(super) fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let header = format!(
        "{:<24} {:<12} {:<6} {:>4} {:>7} {:<8} {:>9} {:>8} {:>8} {:>8} {:>11} {:>8} {:>8}",
        "policy",
        "engine",
        "clock",
        "cost",
        "threads",
        "keys",
        "Mchecks/s",
        "ns/check",
        "admitted",
        "vs mutex",
        "vs governor",
        "vs floor",
        "B/client"
    );
    let _ = writeln!(out, "\n{header}");
    let _ = writeln!(out, "{}", "-".repeat(header.len()));
    let mut previous = None;
    for row in rows {
        if previous.is_some_and(|(keys, threads)| (keys, threads) != (row.keys, row.threads)) {
            out.push('\n');
        }
        previous = Some((row.keys, row.threads));
        let _ = writeln!(
            out,
            "{:<24} {:<12} {:<6} {:>4} {:>7} {:<8} {:>9.2} {:>8.1} {:>7.1}% {:>8} {:>11} {:>8} {:>8}",
            row.policy.name(),
            row.engine.name(),
            row.clock.name(),
            row.cost,
            row.threads,
            row.keys.name(),
            row.ops_per_sec / 1e6,
            row.ns_per_op(),
            row.admitted * 100.0,
            ratio(row.vs_mutex),
            ratio(row.vs_governor),
            ratio(row.vs_floor),
            row.bytes_per_client
                .map_or_else(String::new, |bytes| format!("{bytes:.1}")),
        );
    }
    out.push_str(
        "\nns/check is 1 / throughput (wall time per check, all threads together); \
         a check of cost n decides one request of n units; a fresh row's check is a \
         new client's first. B/client: heap bytes per client at the stream's client \
         count. The floor is one GCRA compare-and-swap in a fixed table of (key, state) \
         slots at the loop's own time, its probe started by Fibonacci hashing (which \
         gives each of the bench's ranks a slot of its own); floor-seeded starts it \
         by the store's seeded hash.\n",
    );
    out
}

/// The targets, each as a ratio from this run.
pub(super) fn targets(rows: &[Row], cores: usize) -> String {
    let find = |engine: EngineName, clock: ClockKind, threads: usize, keys: Keys| {
        rows.iter().find(|row| {
            row.policy == PolicyKind::Gcra
                && row.engine == engine
                && row.clock == clock
                && row.cost == 1
                && row.threads == threads
                && row.keys == keys
        })
    };
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let mut out = String::from("\ntargets:\n");
    // At least twice governor on every key stream, one and two threads.
    for (keys, threads, goal) in [
        (Keys::Hot, 1, 2.0),
        (Keys::Uniform, 1, 2.0),
        (Keys::Zipf, 1, 2.0),
        (Keys::Hot, 2, 2.0),
        (Keys::Uniform, 2, 2.0),
        (Keys::Zipf, 2, 2.0),
    ] {
        let ratio = find(EngineName::LockFree, ClockKind::Quanta, threads, keys)
            .and_then(|row| row.vs_governor);
        if let Some(ratio) = ratio {
            let _ = writeln!(
                out,
                "  gcra, quanta clocks, {threads}t {:<7} lockfree / governor  {ratio:>5.2}x  (>= {goal}x: {})",
                keys.name(),
                verdict(ratio >= goal)
            );
        }
    }
    for keys in [Keys::Uniform, Keys::Zipf] {
        let ratio =
            find(EngineName::LockFree, ClockKind::Coarse, 1, keys).and_then(|row| row.vs_governor);
        if let Some(ratio) = ratio {
            let _ = writeln!(
                out,
                "  gcra, coarse clocks, 1t {:<7} lockfree / governor  {ratio:>5.2}x  (>= 2x: {})",
                keys.name(),
                verdict(ratio >= 2.0)
            );
        }
    }
    for keys in [Keys::Uniform, Keys::Zipf] {
        let lockfree = find(EngineName::LockFree, ClockKind::Caller, 1, keys);
        let ratio = lockfree.and_then(|row| row.vs_floor);
        // Beside it, not instead: the same over the same table hashed by
        // the store's seeded hash, whose lead is not the bench's ranks'
        // (`benches/README.md`, "The floor's hash and the bench's keys").
        let seeded = lockfree
            .zip(find(EngineName::SeededFloor, ClockKind::Caller, 1, keys))
            .map(|(lockfree, seeded)| lockfree.ops_per_sec / seeded.ops_per_sec);
        if let Some(ratio) = ratio {
            let _ = writeln!(
                out,
                "  gcra, caller's now, 1t {:<7} lockfree / floor     {ratio:>5.2}x  (>= 0.6x: {}){}",
                keys.name(),
                verdict(ratio >= 0.6),
                seeded.map_or_else(String::new, |seeded| format!(
                    "  [{seeded:.2}x of floor-seeded]"
                ))
            );
        }
    }
    for threads in [2, 4] {
        let worst = rows
            .iter()
            .filter(|row| {
                row.engine == EngineName::LockFree
                    && row.clock == ClockKind::Quanta
                    && row.cost == 1
                    && row.keys == Keys::Hot
                    && row.threads == threads
            })
            .filter_map(|row| row.vs_mutex.map(|ratio| (ratio, row.policy)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((ratio, policy)) = worst {
            let _ = writeln!(
                out,
                "  hot client, {threads} threads, lockfree / mutex, worst policy {:<22} {ratio:>5.2}x  (>= 3x: {}){}",
                policy.name(),
                verdict(ratio >= 3.0),
                if threads > cores { " [oversubscribed]" } else { "" }
            );
        }
    }
    // Counting decisions (issue 28): within 3 % or 1 ns of not counting on
    // one thread, and no loss of scaling on two.
    for keys in [Keys::Hot, Keys::Uniform] {
        for threads in [1, 2] {
            let (Some(counted), Some(plain)) = (
                find(EngineName::Counted, ClockKind::Quanta, threads, keys),
                find(EngineName::LockFree, ClockKind::Quanta, threads, keys),
            ) else {
                continue;
            };
            let extra = counted.ns_per_op() - plain.ns_per_op();
            let share = extra / plain.ns_per_op();
            let _ = writeln!(
                out,
                "  gcra, {threads}t {:<7} counting decisions: {:.1} ns against {:.1} ns, {:+.1} ns ({:+.1} %)  (within 3 % or 1 ns: {})",
                keys.name(),
                counted.ns_per_op(),
                plain.ns_per_op(),
                extra,
                share * 100.0,
                verdict(extra <= 1.0 || share <= 0.03)
            );
        }
    }
    // Refunds (issue 37): a refund, measured as a check that gives its
    // admission back less the check alone, at most 1.5x a check.
    for keys in [Keys::Hot, Keys::Uniform] {
        for threads in [1, 2] {
            let (Some(both), Some(mut plain)) = (
                find(EngineName::Refunding, ClockKind::Quanta, threads, keys),
                find(EngineName::LockFree, ClockKind::Quanta, threads, keys),
            ) else {
                continue;
            };
            // A check that refuses only reads; every check of the refund
            // row admits and writes (on one hot client, two threads'
            // writes contend for its line). Where the plain row mostly
            // refuses, the refund is held to a check that admits.
            let mut against = String::new();
            if plain.admitted < 0.5 {
                if let Some(admitting) =
                    find(EngineName::Admitting, ClockKind::Quanta, threads, keys)
                {
                    against = format!(
                        " [the check: one that admits; the plain check admits {:.1} %]",
                        plain.admitted * 100.0
                    );
                    plain = admitting;
                } else {
                    against = format!(
                        " [an upper bound: the plain check admits {:.1} %]",
                        plain.admitted * 100.0
                    );
                }
            }
            let refund = both.ns_per_op() - plain.ns_per_op();
            let ratio = refund / plain.ns_per_op();
            let _ = writeln!(
                out,
                "  gcra, {threads}t {:<7} a refund: {:.1} ns ({:.1} with its check), a check {:.1} ns, {ratio:.2}x  (<= 1.5x: {}){against}",
                keys.name(),
                refund,
                both.ns_per_op(),
                plain.ns_per_op(),
                verdict(ratio <= 1.5)
            );
        }
    }
    // Requests in flight (issue 38): a check under `in-flight` and its
    // release, beside a rate rule's check that admits (both write).
    for keys in [Keys::Hot, Keys::Uniform] {
        for threads in [1, 2] {
            let (Some(held), Some(admitting)) = (
                find(EngineName::Holding, ClockKind::Quanta, threads, keys),
                find(EngineName::Admitting, ClockKind::Quanta, threads, keys),
            ) else {
                continue;
            };
            let _ = writeln!(
                out,
                "  in-flight, {threads}t {:<7} a check and its release: {:.1} ns, a gcra check that admits {:.1} ns, {:.2}x",
                keys.name(),
                held.ns_per_op(),
                admitting.ns_per_op(),
                held.ns_per_op() / admitting.ns_per_op(),
            );
        }
    }
    let insert = |engine| find(engine, ClockKind::Quanta, 1, Keys::Fresh);
    if let (Some(ours), Some(theirs)) = (insert(EngineName::LockFree), insert(EngineName::Governor))
    {
        let _ = writeln!(
            out,
            "  a new client's first check, 1t: lockfree {:.0} ns, governor {:.0} ns  (no slower: {})",
            ours.ns_per_op(),
            theirs.ns_per_op(),
            verdict(ours.ops_per_sec >= theirs.ops_per_sec)
        );
    }
    out
}

#[cfg(test)]
pub(super) fn json(rows: &[Row]) -> String {
    json_rows(json_values(rows))
}

/// The throughput rows as `--json` objects.
pub(super) fn json_values(rows: &[Row]) -> impl Iterator<Item = serde_json::Value> + '_ {
    rows.iter().map(|row| {
        serde_json::json!({
            "policy": row.policy.name(),
            "engine": match row.engine {
                EngineName::Counted
                | EngineName::Refunding
                | EngineName::Admitting
                | EngineName::Holding => {
                    EngineName::LockFree.name()
                }
                engine => engine.name(),
            },
            "metrics": row.engine == EngineName::Counted,
            "refunds": row.engine == EngineName::Refunding,
            "admitting": row.engine == EngineName::Admitting,
            "holds": row.engine == EngineName::Holding,
            "vs_uncounted": row.vs_uncounted,
            "cost": row.cost,
            "threads": row.threads,
            "keys": row.keys.name(),
            "ops_per_sec": row.ops_per_sec.round(),
            "ns_per_op": row.ns_per_op(),
            "ops_per_sec_min": row.min.round(),
            "ops_per_sec_max": row.max.round(),
            "admitted": row.admitted,
            "vs_mutex": row.vs_mutex,
            "vs_governor": row.vs_governor,
            "limit": row.limit,
            "window_ns": row.window_ns,
            "clock": row.clock.name(),
            "vs_floor": row.vs_floor,
            "bytes_per_client": row.bytes_per_client,
        })
    })
}

/// `--json` output: a JSON array with one row object per line.
pub(crate) fn json_rows(rows: impl Iterator<Item = serde_json::Value>) -> String {
    let rows: Vec<String> = rows.map(|row| format!("  {row}")).collect();
    format!("[\n{}\n]", rows.join(",\n"))
}
