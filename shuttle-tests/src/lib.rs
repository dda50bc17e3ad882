//! Shuttle models of floodgate's lock-free engine: the models too large for
//! loom to exhaust.
//!
//! The library is built with `--cfg floodgate_loom --cfg floodgate_shuttle`:
//! every model-only choice of the loom build applies (fixed hash seeds, a
//! first table of two slots, so a handful of new clients rebuild it several
//! times), and the `sync` shim hands the library shuttle's atomics, mutexes
//! and yield under the same stand-ins. Run them with `shuttle-tests/run`;
//! without the cfg this crate is empty.
//!
//! # What a model checks, and what it cannot
//!
//! Loom explores every schedule of a model of two or three threads and a
//! few calls. These models have three or four threads, dozens of calls, a
//! table that grows several times and a sweep, in one run: far too many
//! schedules to exhaust. Shuttle's PCT scheduler samples them instead
//! ([`explore`]): each run finds a given bug of depth `d` (one that needs
//! `d` particular steps to happen in order) with probability at least
//! `1/(n·k^(d-1))` for `n` threads and `k` steps, whatever the model's
//! size. A pass is evidence, not a proof; the orderings of the atomics are
//! not checked at all (shuttle runs every atomic as `SeqCst`), which is
//! what the loom models are for. Each model asserts counts that hold under
//! every schedule, and its doc comment says why they do.
//!
//! # Replaying a failure
//!
//! A failing model prints its schedule, a hex string over a few lines
//! between quotes after `failing schedule:`, twice: once as the panic
//! happens, and once more when the panicking thread has unwound. Copy the
//! last one (the first replays the failure too, then ends early with
//! "schedule ended early" while the thread unwinds). Run that one model
//! again with the string in `FLOODGATE_SHUTTLE_REPLAY` (line breaks and
//! quotes may come along), and [`explore`] replays exactly that schedule
//! (`shuttle::replay`) instead of sampling new ones:
//!
//! ```text
//! FLOODGATE_SHUTTLE_REPLAY='9103c005…' shuttle-tests/run growth_gcra --exact
//! ```
//!
//! The replay is deterministic (the models draw no random numbers, and
//! under the cfg the store's hash seeds are fixed), so a debugger or extra
//! prints in the library see the same failure every time.
#![cfg(floodgate_shuttle)]

use std::env;

use shuttle::scheduler::PctScheduler;
use shuttle::{Config, FailurePersistence, Runner};

/// How many schedules each model samples unless `FLOODGATE_SHUTTLE_ITERATIONS`
/// says otherwise: `run`'s default, which keeps a whole run, build
/// included, at two to two and a half minutes on two cores.
const ITERATIONS: usize = 100_000;

/// PCT's bug depth unless `FLOODGATE_SHUTTLE_DEPTH` says otherwise: 3 finds
/// a lost update (one preemption inside another thread's read-modify-write)
/// and one more thread stepping into the window, as loom's bound does.
const DEPTH: usize = 3;

/// Runs `body` under `iterations` schedules of shuttle's PCT scheduler
/// (`FLOODGATE_SHUTTLE_ITERATIONS`, `FLOODGATE_SHUTTLE_DEPTH`): what
/// `shuttle::check_pct` runs, with its configuration spelled out so that a
/// failure always prints its schedule. Or, if `FLOODGATE_SHUTTLE_REPLAY`
/// holds a failing schedule, replays that one schedule (crate docs).
///
/// # Panics
///
/// When `body` panics under some schedule (shuttle prints the schedule
/// first), or when an environment variable is not a number.
pub fn explore(name: &str, body: impl Fn() + Send + Sync + 'static) {
    if let Ok(schedule) = env::var("FLOODGATE_SHUTTLE_REPLAY") {
        // The printed schedule sits on its own line between quotes: either
        // may come along when it is copied.
        let schedule = schedule.trim().trim_matches('"').trim();
        println!("{name}: replaying one schedule");
        shuttle::replay(body, schedule);
        return;
    }
    let iterations = setting("FLOODGATE_SHUTTLE_ITERATIONS", ITERATIONS);
    let depth = setting("FLOODGATE_SHUTTLE_DEPTH", DEPTH);
    let mut config = Config::new();
    config.failure_persistence = FailurePersistence::Print;
    // The warning says that every ordering runs as `SeqCst`, which the
    // crate docs say once for all models.
    config.silence_warnings = true;
    let runs = Runner::new(PctScheduler::new(depth, iterations), config).run(body);
    println!("{name}: {runs} schedules passed (PCT, depth {depth})");
}

fn setting(name: &str, default: usize) -> usize {
    match env::var(name) {
        Ok(value) => value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a count")),
        Err(_) => default,
    }
}
