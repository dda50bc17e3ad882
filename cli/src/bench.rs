//! `floodgate bench` (not written yet).

use std::process::ExitCode;

/// Options of `floodgate bench`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `floodgate bench`.
pub fn run(_args: Args) -> ExitCode {
    eprintln!("floodgate bench: not written yet");
    ExitCode::FAILURE
}
