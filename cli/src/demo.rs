//! `floodgate demo` (not written yet).

use std::process::ExitCode;

/// Options of `floodgate demo`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `floodgate demo`.
pub fn run(_args: Args) -> ExitCode {
    eprintln!("floodgate demo: not written yet");
    ExitCode::FAILURE
}
