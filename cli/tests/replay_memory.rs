//! What a replay holds in memory, measured with a counting allocator, with
//! the replay run in-process through the CLI's library target:
//!
//! - with `--max-clients N --evict-idle`, the peak heap of a replay of
//!   2,000,000 one-shot clients stays within twice that of 20,000 (its own
//!   bookkeeping is bounded by what the limiter tracks), while without
//!   bounds it grows with the clients, which shows the measure can fail;
//! - a line far past the line bound is refused at once, in bounded memory,
//!   after every earlier answer was written.
//!
//! `cargo test -p floodgate-cli --test replay_memory -- --nocapture` prints
//! the figures. The file has one test, so nothing else in the process
//! allocates while it measures.

use std::io::{self, Read};

use clap::Parser;
use floodgate_cli::replay::{replay_with, Args};

#[path = "support/live_bytes.rs"]
mod live_bytes;

#[global_allocator]
static ALLOCATOR: live_bytes::Counting = live_bytes::Counting;

#[derive(Parser)]
struct Replay {
    #[command(flatten)]
    args: Args,
}

/// A trace made as it is read, so that its size costs no memory: `lines`
/// calls `allow c<i> <i>`, one per client and per millisecond, then `tail`
/// bytes of `x` with no newline (a line that never ends).
struct Trace {
    next: u64,
    lines: u64,
    tail: u64,
    pending: Vec<u8>,
    at: usize,
}

impl Trace {
    fn new(lines: u64, tail: u64) -> Self {
        Trace {
            next: 0,
            lines,
            tail,
            pending: Vec::with_capacity(64),
            at: 0,
        }
    }
}

impl Read for Trace {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut written = 0;
        while written < buf.len() {
            if self.at == self.pending.len() {
                self.pending.clear();
                self.at = 0;
                if self.next < self.lines {
                    use std::io::Write as _;
                    writeln!(self.pending, "allow c{0} {0}", self.next)?;
                    self.next += 1;
                } else if self.tail > 0 {
                    let run = self.tail.min(buf.len() as u64 - written as u64);
                    buf[written..written + run as usize].fill(b'x');
                    self.tail -= run;
                    written += run as usize;
                    continue;
                } else {
                    break;
                }
            }
            let run = (self.pending.len() - self.at).min(buf.len() - written);
            buf[written..written + run].copy_from_slice(&self.pending[self.at..self.at + run]);
            self.at += run;
            written += run;
        }
        Ok(written)
    }
}

/// What one replay ended with and the most heap it held at once, in bytes
/// above what was allocated before it started.
struct Measured {
    status: u8,
    output: Vec<u8>,
    errors: String,
    peak: isize,
}

/// Replays `trace` with gcra, 10 per second, and `options`, answers
/// counted but not kept unless `keep` (the kept answers are few).
fn measure(options: &[&str], trace: Trace, keep: bool) -> Measured {
    let argv = [
        "replay",
        "--policy",
        "gcra",
        "--limit",
        "10",
        "--window-ms",
        "1000",
    ];
    let replay = Replay::try_parse_from(argv.iter().chain(options))
        .unwrap_or_else(|e| panic!("{options:?}: {e}"));
    let mut output = Vec::new();
    let mut errors = Vec::new();
    let before = live_bytes::live_bytes();
    live_bytes::reset_peak();
    let status = if keep {
        replay_with(&replay.args, trace, &mut output, &mut errors)
    } else {
        replay_with(&replay.args, trace, io::sink(), &mut errors)
    };
    let peak = live_bytes::peak_bytes() - before;
    Measured {
        status,
        output,
        errors: String::from_utf8(errors).unwrap(),
        peak,
    }
}

/// The peak heap of a replay of `clients` one-shot clients with `options`.
fn one_shot_clients(options: &[&str], clients: u64) -> isize {
    let run = measure(options, Trace::new(clients, 0), false);
    assert_eq!(
        run.status, 0,
        "{options:?}, {clients} clients: {}",
        run.errors
    );
    eprintln!(
        "{clients:>9} one-shot clients {options:?}: peak heap {:>6} KiB",
        run.peak / 1024
    );
    run.peak
}

#[test]
fn the_replay_holds_memory_bounded_by_the_limiter_and_the_line_bound() {
    let bounded = ["--max-clients", "10000", "--evict-idle"];
    let few = one_shot_clients(&bounded, 20_000);
    let many = one_shot_clients(&bounded, 2_000_000);
    assert!(
        many <= 2 * few,
        "bounded: {many} bytes for 2,000,000 clients against {few} for 20,000"
    );
    // Without bounds the limiter and the replay remember every client: the
    // same measure sees them grow (ten times the clients, several times the
    // bytes).
    let few = one_shot_clients(&[], 20_000);
    let more = one_shot_clients(&[], 200_000);
    assert!(
        more > 5 * few,
        "unbounded: {more} bytes for 200,000 clients against {few} for 20,000"
    );

    // Two answered calls, then 8 MiB with no newline.
    let run = measure(&[], Trace::new(2, 8 << 20), true);
    eprintln!(
        "an 8 MiB line after two calls: peak heap {} KiB",
        run.peak / 1024
    );
    assert_eq!(run.status, 2, "{}", run.errors);
    assert_eq!(run.output, b"true\ntrue\n");
    assert!(
        run.errors
            .starts_with("error: line 3: longer than 8192 bytes"),
        "{}",
        run.errors
    );
    assert!(
        run.peak < 256 * 1024,
        "{} bytes held for one line",
        run.peak
    );
}
