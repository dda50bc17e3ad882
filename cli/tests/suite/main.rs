//! The CLI's end-to-end tests, one module per subject, in one test binary:
//! each runs the built `floodgate` binary (or the library's replay), and
//! one build and link serves them all.
//!
//! `replay_memory` keeps a binary of its own (`tests/replay_memory.rs`):
//! its counting global allocator must see its process alone. The modules
//! behind a feature are the targets that once required it.

mod binary;

#[cfg(all(feature = "rls", feature = "proxy"))]
mod bench_rls;
mod bench_tail;
mod flags;
mod fuzz_regressions;
#[cfg(feature = "proxy")]
mod proxy;
#[cfg(feature = "proxy")]
mod proxy_metrics;
mod replay;
mod replay_state;
#[cfg(feature = "rls")]
mod rls;
