//! Lock-free per-client rate limiting.
#![forbid(unsafe_code)]

mod baseline;
mod cell;
mod clock;
mod config;
mod decision;
mod factory;
mod limiter;
pub mod policy;
mod store;
mod sync;

pub use baseline::MutexLimiter;
pub use clock::{Clock, ManualClock, QuantaClock};
pub use config::{Config, ConfigError, PolicyKind, UnknownPolicy, MAX_LIMIT};
pub use decision::Decision;
pub use factory::{build, build_with, Engine, UnknownEngine};
pub use limiter::{Limiter, RateLimiter};
