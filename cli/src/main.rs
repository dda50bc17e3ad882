//! `floodgate`: replay a trace through any policy, compare the engines'
//! speed, watch the limiter protect a simulated payments API, put it in
//! front of an HTTP service, or behind Envoy as its rate-limit service.
//!
//! `demo` and `replay` are always built; `bench`, `proxy` and `rls` come
//! with the features of the same names (`full`: everything). A subcommand
//! left out is still listed, and says how to build it when it is asked for.

#[cfg(feature = "bench")]
mod bench;
mod demo;
mod heap;
#[cfg(feature = "proxy")]
mod proxy;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use floodgate_cli::replay;

#[derive(Parser)]
#[command(
    name = "floodgate",
    version,
    about = "Per-client rate limiting: replay, bench, demo, proxy, rls"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Answer a trace of `allow`/`remaining` calls read from standard input.
    Replay(replay::Args),
    /// Measure checks per second: lock-free engine vs mutex baseline vs governor.
    #[cfg(feature = "bench")]
    Bench(bench::Args),
    /// Measure checks per second (not in this build: needs the CLI's `bench`
    /// feature).
    #[cfg(not(feature = "bench"))]
    #[command(disable_help_flag = true)]
    Bench(LeftOut),
    /// A payments API, 1,000 good apps and one buggy one, through every policy.
    Demo(demo::Args),
    /// A rate-limiting reverse proxy in front of one HTTP service.
    // Boxed: its options are the largest of any command by far.
    #[cfg(feature = "proxy")]
    Proxy(Box<proxy::Args>),
    /// A rate-limiting reverse proxy (not in this build: needs the CLI's
    /// `proxy` feature).
    #[cfg(not(feature = "proxy"))]
    #[command(disable_help_flag = true)]
    Proxy(LeftOut),
    /// Envoy's rate-limit service (gRPC) on envoyproxy/ratelimit's configuration.
    #[cfg(feature = "rls")]
    Rls(floodgate_cli::rls::Args),
    /// Envoy's rate-limit service (not in this build: needs the CLI's `rls`
    /// feature).
    #[cfg(not(feature = "rls"))]
    #[command(disable_help_flag = true)]
    Rls(LeftOut),
}

/// The arguments of a subcommand this build leaves out: taken as they come,
/// so that asking for it, with any options, says how to build it.
#[cfg(not(all(feature = "bench", feature = "proxy", feature = "rls")))]
#[derive(clap::Args)]
struct LeftOut {
    #[arg(hide = true, allow_hyphen_values = true, trailing_var_arg = true)]
    _rest: Vec<std::ffi::OsString>,
}

/// Refuses a subcommand this build leaves out, with the command that
/// builds it.
#[cfg(not(all(feature = "bench", feature = "proxy", feature = "rls")))]
fn left_out(name: &str) -> ExitCode {
    use floodgate_cli::args::{left_out, usage};
    usage(left_out(&format!("`floodgate {name}`"), name))
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Replay(args) => replay::run(args),
        #[cfg(feature = "bench")]
        Command::Bench(args) => bench::run(args),
        #[cfg(not(feature = "bench"))]
        Command::Bench(_) => left_out("bench"),
        Command::Demo(args) => demo::run(args),
        #[cfg(feature = "proxy")]
        Command::Proxy(args) => proxy::run(*args),
        #[cfg(not(feature = "proxy"))]
        Command::Proxy(_) => left_out("proxy"),
        #[cfg(feature = "rls")]
        Command::Rls(args) => floodgate_cli::rls::run(args),
        #[cfg(not(feature = "rls"))]
        Command::Rls(_) => left_out("rls"),
    }
}
