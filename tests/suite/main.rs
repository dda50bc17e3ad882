//! The integration tests, one module per subject, in one test binary: one
//! build and one link of the crate and its dependencies, where a binary per
//! file linked them some thirty times over.
//!
//! A test keeps a binary of its own (`tests/*.rs`) when it needs its
//! process to itself: a counting global allocator (`alloc`, `cap`,
//! `memory`), or when AddressSanitizer runs it and should build nothing
//! else (`tests/engine/`, the engine's concurrency tests, with this
//! suite's `support`). The modules behind a feature are the targets that
//! once required it.
//!
//! proptest keeps a module's failing cases in
//! `tests/proptest-regressions/MODULE.txt`: its rule for a source file in a
//! directory with a `main.rs` (a sibling directory of that one, the file's
//! path under it with `.txt` for `.rs`).

mod support;

mod compound;
mod differential;
mod export;
mod fuzz_regressions;
mod gcra_conformance;
#[cfg(feature = "http")]
mod http;
#[cfg(feature = "http")]
mod http_in_flight;
mod in_flight;
mod isolation;
mod offenders;
mod policies;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
mod redis_in_flight;
mod state;
mod stats;
mod tiers;
mod wide_cas;
mod window_pair;
mod words;
