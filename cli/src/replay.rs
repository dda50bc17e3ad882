//! `floodgate replay` (not written yet).

use std::process::ExitCode;

/// Options of `floodgate replay`.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `floodgate replay`.
pub fn run(_args: Args) -> ExitCode {
    eprintln!("floodgate replay: not written yet");
    ExitCode::FAILURE
}
