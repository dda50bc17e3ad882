//! `floodgate`: replay a trace through any policy, compare the engines'
//! speed, watch the limiter protect a simulated payments API, or put it in
//! front of an HTTP service.

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
    about = "Per-client rate limiting: replay, bench, demo, proxy"
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
    Bench(bench::Args),
    /// A payments API, 1,000 good apps and one buggy one, through every policy.
    Demo(demo::Args),
    /// A rate-limiting reverse proxy in front of one HTTP service.
    #[cfg(feature = "proxy")]
    Proxy(proxy::Args),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Replay(args) => replay::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Demo(args) => demo::run(args),
        #[cfg(feature = "proxy")]
        Command::Proxy(args) => proxy::run(args),
    }
}
