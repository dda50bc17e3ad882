//! `floodgate bench --state`: what keeping the state across a restart
//! costs (`floodgate::state`). For each engine and rule set, a limiter of
//! `--state-clients` clients (each given one check) is saved to a file and
//! loaded back into a new limiter: the time of each, and the file's bytes
//! per client. Then the checks of one thread on 10,000 known clients are
//! timed with and without another thread saving that many clients in a
//! loop beside them, in alternating slices: the ratio says what a save
//! costs the checks that run beside it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate::state::{self, Saved};
use floodgate::{build_rules, Bounds, Engine, QuantaClock, RateLimiter, RuleSet};

/// The clients a save and a load are timed on, by default.
pub const CLIENTS: u64 = 1_000_000;

/// The known clients the checks beside a save go over.
const KNOWN: u64 = 10_000;

/// The rule sets measured: one rule, and the README's burst and daily
/// quota.
const RULES: [&str; 2] = ["gcra:100/1s", "gcra:10/1s,fixed-window:10000/1d"];

/// Alternating slices of checks, with and without a save beside them.
const SLICES: usize = 20;

/// One slice's length.
const SLICE: Duration = Duration::from_millis(50);

/// One save and load.
pub struct Row {
    engine: Engine,
    rules: &'static str,
    clients: u64,
    save_ms: f64,
    load_ms: f64,
    bytes_per_client: f64,
}

/// The checks beside a save: checks per second with nothing beside them,
/// beside a pure compute loop (the other core busy, nothing shared), and
/// beside a save in a loop.
pub struct Beside {
    alone: f64,
    spinning: f64,
    saving: f64,
    saves: u64,
}

/// A scratch file, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn limiter(rules: &RuleSet, engine: Engine, clock: QuantaClock) -> Arc<dyn RateLimiter<u64>> {
    build_rules::<u64, _>(rules, engine, clock, Bounds::new()).expect("the bench's rules")
}

/// Saves and loads `clients` clients of each rule set on each engine,
/// then times checks beside a save loop.
pub fn rows(clients: u64) -> (Vec<Row>, Beside) {
    let file =
        Scratch(std::env::temp_dir().join(format!("floodgate-bench-state-{}", std::process::id())));
    let mut rows = Vec::new();
    for rules_text in RULES {
        let rules: RuleSet = rules_text.parse().expect("the bench's rules");
        for engine in [Engine::LockFree, Engine::Mutex] {
            let full = limiter(&rules, engine, QuantaClock::new());
            for key in 0..clients {
                full.check(&key);
            }
            let started = Instant::now();
            let summary = state::save(&*full, &file.0).expect("a save to the temporary directory");
            let save_ms = started.elapsed().as_secs_f64() * 1e3;
            drop(full);
            let started = Instant::now();
            let saved = Saved::read(&file.0).expect("the file just saved");
            let clock = QuantaClock::starting_at(saved.resume_at(std::time::SystemTime::now()));
            let loaded = limiter(saved.rules(), engine, clock);
            let count = saved
                .load_into(&*loaded)
                .expect("the file just saved loads");
            let load_ms = started.elapsed().as_secs_f64() * 1e3;
            assert_eq!(count as u64, clients);
            rows.push(Row {
                engine,
                rules: rules_text,
                clients,
                save_ms,
                load_ms,
                bytes_per_client: summary.bytes as f64 / clients as f64,
            });
        }
    }
    (rows, beside(&file))
}

/// Checks on one thread, over `KNOWN` clients of the README's pair, in
/// slices that take turns: nothing beside them, a compute loop on another
/// thread (so that a save's cost is told from the cost of a busy sibling
/// core), and a save of the same limiter in a loop on another thread; the
/// median rate of each.
fn beside(file: &Scratch) -> Beside {
    let rules: RuleSet = RULES[1].parse().expect("the bench's rules");
    let limiter = limiter(&rules, Engine::LockFree, QuantaClock::new());
    for key in 0..KNOWN {
        limiter.check(&key);
    }
    let (mut alone, mut spinning, mut saving) = (Vec::new(), Vec::new(), Vec::new());
    let mut saves = 0;
    for slice in 0..SLICES * 3 / 2 {
        let stop = AtomicBool::new(false);
        let beside = slice % 3;
        let (checks, saved) = std::thread::scope(|scope| {
            let other = (beside != 0).then(|| {
                scope.spawn(|| {
                    let (mut saved, mut spin) = (0u64, 1u64);
                    while !stop.load(Ordering::Relaxed) {
                        if beside == 2 {
                            state::save(&*limiter, &file.0)
                                .expect("a save to the temporary directory");
                            saved += 1;
                        } else {
                            for _ in 0..1_000 {
                                spin ^= spin << 13;
                                spin ^= spin >> 7;
                                spin ^= spin << 17;
                            }
                            std::hint::black_box(spin);
                        }
                    }
                    saved
                })
            });
            let started = Instant::now();
            let mut checks = 0u64;
            let mut key = 0;
            while started.elapsed() < SLICE {
                for _ in 0..1_000 {
                    std::hint::black_box(limiter.check(&key));
                    key = (key + 7_919) % KNOWN;
                }
                checks += 1_000;
            }
            let rate = checks as f64 / started.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            (
                rate,
                other.map_or(0, |other| other.join().expect("the other thread")),
            )
        });
        saves += saved;
        [&mut alone, &mut spinning, &mut saving][beside].push(checks);
    }
    let median = |rates: &mut Vec<f64>| {
        rates.sort_by(f64::total_cmp);
        rates[rates.len() / 2]
    };
    Beside {
        alone: median(&mut alone),
        spinning: median(&mut spinning),
        saving: median(&mut saving),
        saves,
    }
}

/// The rows as a table.
pub fn table(rows: &[Row], beside: &Beside) -> String {
    let mut out = String::from(
        "\nkeeping the state across a restart (floodgate::state): one save and one load\n\
         engine    rules                               clients    save ms    load ms  B/client\n",
    );
    for row in rows {
        out += &format!(
            "{:<9} {:<34} {:>8} {:>10.1} {:>10.1} {:>9.1}\n",
            row.engine.name(),
            row.rules,
            row.clients,
            row.save_ms,
            row.load_ms,
            row.bytes_per_client
        );
    }
    out += &format!(
        "checks on 1 thread over {KNOWN} clients of {}: {:.1} M/s alone, {:.1} M/s beside \
         a compute loop, {:.1} M/s beside a save of them in a loop ({} saves): {:.2}x the \
         compute loop's, {:.2}x alone\n",
        RULES[1],
        beside.alone / 1e6,
        beside.spinning / 1e6,
        beside.saving / 1e6,
        beside.saves,
        beside.saving / beside.spinning,
        beside.saving / beside.alone
    );
    out
}

/// The rows as JSON values, `"keys": "state"`.
pub fn json<'a>(
    rows: &'a [Row],
    beside: &'a Beside,
) -> impl Iterator<Item = serde_json::Value> + 'a {
    rows.iter()
        .map(|row| {
            serde_json::json!({
                "keys": "state",
                "engine": row.engine.name(),
                "rules": row.rules,
                "clients": row.clients,
                "save_ms": row.save_ms,
                "load_ms": row.load_ms,
                "bytes_per_client": row.bytes_per_client,
            })
        })
        .chain(std::iter::once(serde_json::json!({
            "keys": "state",
            "engine": "lockfree",
            "rules": RULES[1],
            "clients": KNOWN,
            "checks_per_sec_alone": beside.alone,
            "checks_per_sec_beside_compute": beside.spinning,
            "checks_per_sec_beside_saves": beside.saving,
            "saves": beside.saves,
            "vs_compute": beside.saving / beside.spinning,
            "vs_alone": beside.saving / beside.alone,
        })))
}
