//! The engine's concurrency tests: threads hammering one limiter with exact
//! totals at a frozen clock (`stress`), the races a sweep, a reload or a
//! forget can lose (`races`), the bounds on memory under floods of new
//! clients (`bounds`), progress when a thread stops or panics mid-step
//! (`progress`) and every call returning under contention (`liveness`).
//!
//! A binary of their own, apart from the suite (`tests/suite/`): they are
//! what `.ci/asan` runs under AddressSanitizer, which then builds these
//! alone rather than the whole suite. proptest keeps their failing cases
//! beside the suite's, in `tests/proptest-regressions/`.

// The suite's helpers (each binary uses part of them).
#[path = "../suite/support.rs"]
mod support;

mod bounds;
mod liveness;
mod progress;
mod races;
mod stress;
