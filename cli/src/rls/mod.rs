//! `floodgate rls`: Envoy's rate-limit service
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) on this
//! crate's engine, so that Envoy, Istio and the gateways that call a
//! rate-limit service over gRPC get this crate's policies.
//!
//! Its rooms: the configuration, the files of envoyproxy/ratelimit read as
//! that server reads them ([`config`], [`yaml`], [`error`]); the match of a
//! request's descriptors to the limits that apply ([`matching`]); a
//! request decided all or nothing on a store per limit, in memory or in
//! Redis ([`decide`], [`store`]), kept across restarts ([`state`]); the
//! protocol's messages ([`proto`]); the gRPC service ([`service`]); what it
//! counts ([`metrics`]); and the command, its server, reloads and stop
//! ([`server`]). See `docs/rls.md`. Every limit is a [`floodgate::RuleSet`]: a
//! unit and a count become a fixed window, and a file may name this
//! crate's rules instead.
//!
//! ```
//! use floodgate_cli::rls::Config;
//! use std::path::Path;
//!
//! let text = "domain: edge\n\
//!             descriptors:\n\
//!             \x20 - key: remote_address\n\
//!             \x20   rate_limit: {unit: second, requests_per_unit: 10}\n";
//! let config = Config::from_texts([(Path::new("edge.yaml"), text)])?;
//! let limits = config.applied_limits("edge", [[("remote_address", "50.0.0.1")]]);
//! let limit = limits[0].expect("matched");
//! assert_eq!(limit.id, "edge.remote_address");
//! assert_eq!(limit.rules().unwrap().to_string(), "fixed-window:10/1s");
//! # Ok::<(), floodgate_cli::rls::ConfigError>(())
//! ```

pub mod config;
pub mod decide;
pub mod error;
pub mod matching;
pub mod metrics;
pub mod proto;
pub mod server;
pub mod service;
pub mod state;
pub mod store;
pub mod yaml;

pub use config::{Config, Domain, Limit, Origin, Quota, Unit};
pub use decide::{Invalid, Limits};
pub use error::{ConfigError, Problem};
pub use matching::DescriptorEntry;
pub use server::{run, Args};
pub use service::RateLimitService;
pub use yaml::Position;
