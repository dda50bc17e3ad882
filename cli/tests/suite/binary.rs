//! The built `floodgate` binary, run once with a given standard input: for
//! the end-to-end tests that need no more than its answers and status.

use std::io::Write;
use std::process::{Command, Stdio};
use std::thread;

/// What one run of the binary left behind.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `floodgate ARGS` with `input` on standard input, written from
/// another thread so that a large input cannot deadlock against unread
/// output (the binary may rightly stop reading early: an invalid option, a
/// malformed line).
pub fn floodgate(args: &[&str], input: &str) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the floodgate binary runs");
    let mut stdin = child.stdin.take().expect("a piped standard input");
    let input = input.as_bytes().to_vec();
    let writer = thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let output = child.wait_with_output().expect("the binary ends");
    writer.join().expect("the writer ends");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8(output.stdout).expect("answers are UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("messages are UTF-8"),
    }
}
