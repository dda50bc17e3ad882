//! What the `replay` fuzz target checks: `floodgate replay`, run in-process
//! on arbitrary bytes, never panics and always ends with either every answer
//! or a clean error — and exactly the ones the contract (SPEC.md, "The replay
//! trace") prescribes.
//!
//! The check reads the trace with its own few lines of the contract's line
//! rules (at most 8192 bytes before the `\n`, fields split on runs of spaces
//! and tabs, a trailing `\r` ignored, blank and `#` lines skipped, three
//! fields or, for `allow` and `release`, four, `NOW` of ASCII digits up to
//! 2 × 10^12 (a `refund` line is read as malformed: the fuzzer has not
//! reached one; the end-to-end tests cover it),
//! never earlier than the client's previous call, `COST` of ASCII digits up
//! to 2^64 − 1; a trace is text, so a line that is not UTF-8 is malformed)
//! and asks the library
//! directly for each answer. The replay must then print exactly those
//! answers, stop at exactly the first malformed line with its number on the
//! error stream and status 2, or, for options the contract refuses, print
//! nothing and exit 2.
//!
//! Depends on `floodgate`, `floodgate-cli` (its library target) and `clap`,
//! so the CLI's own tests can include it with `#[path]` to replay the kept
//! inputs.

use std::collections::HashMap;
use std::sync::Arc;

use clap::Parser;
use floodgate::{build_with, Config, Engine, ManualClock, PolicyKind, RateLimiter};
use floodgate_cli::replay::{replay_with, Args};

/// The latest `NOW` a trace may carry (SPEC.md).
const MAX_NOW: u64 = 2_000_000_000_000;

/// The longest window replay accepts, in milliseconds (SPEC.md).
const MAX_WINDOW_MS: u64 = 1_000_000_000;

/// The most bytes a line holds before its `\n` (SPEC.md).
const MAX_LINE: usize = 8 * 1024;

/// The bytes before the trace that choose the options.
const OPTION_BYTES: usize = 8;

/// `floodgate replay`'s options, parsed as the command line parses them.
#[derive(Parser)]
struct Replay {
    #[command(flatten)]
    args: Args,
}

/// The options an input asks for: mostly valid ones, sometimes a limit or
/// window the contract refuses.
struct Options {
    policy: PolicyKind,
    limit: u64,
    window_ms: u64,
    detail: bool,
    engine: Engine,
}

impl Options {
    fn decode(bytes: &[u8]) -> Self {
        let byte = |i: usize| u64::from(bytes.get(i).copied().unwrap_or(0));
        let policy = PolicyKind::ALL[byte(0) as usize % PolicyKind::ALL.len()];
        let limit = match byte(1) % 8 {
            0 => 0,
            7 => (1 << 20) + byte(2),
            _ => 1 + byte(2) % 16,
        };
        let window_ms = match byte(3) % 8 {
            0 => 0,
            1 => MAX_WINDOW_MS + byte(4),
            2 => MAX_WINDOW_MS - byte(4),
            _ => 1 + byte(4) * byte(5),
        };
        Options {
            policy,
            limit,
            window_ms,
            detail: byte(6) & 1 == 1,
            engine: if byte(6) & 2 == 0 {
                Engine::LockFree
            } else {
                Engine::Mutex
            },
        }
    }

    fn args(&self) -> Args {
        let (limit, window) = (self.limit.to_string(), self.window_ms.to_string());
        let mut argv = vec![
            "replay",
            "--policy",
            self.policy.name(),
            "--limit",
            &limit,
            "--window-ms",
            &window,
            "--engine",
            self.engine.name(),
        ];
        if self.detail {
            argv.push("--detail");
        }
        match Replay::try_parse_from(&argv) {
            Ok(replay) => replay.args,
            Err(error) => panic!("{argv:?} does not parse: {error}"),
        }
    }

    /// The limiter the contract says these options describe, or `None` if it
    /// refuses them.
    fn limiter(&self) -> Option<Arc<dyn RateLimiter<str>>> {
        if !(1..=MAX_WINDOW_MS).contains(&self.window_ms) {
            return None;
        }
        let config = Config::per_ticks(self.limit, self.window_ms).ok()?;
        build_with(self.policy, config, self.engine, ManualClock::new(0)).ok()
    }
}

/// One call of a trace, as the contract reads it.
struct Call<'a> {
    allow: bool,
    /// A `release CLIENT NOW [COST]` line (then `allow` is false).
    release: bool,
    client: &'a str,
    now: u64,
    /// 1 when the line gives none.
    cost: u64,
}

/// `COST` as the contract reads it: ASCII digits, at most 2^64 − 1.
fn read_cost(field: &str) -> Result<u64, ()> {
    if field.is_empty() || !field.bytes().all(|b| b.is_ascii_digit()) {
        return Err(());
    }
    let digits = field.trim_start_matches('0');
    if digits.is_empty() {
        Ok(0)
    } else if digits.len() > 20 {
        Err(()) // past 2^64 − 1 whatever the digits
    } else {
        digits.parse::<u64>().map_err(drop)
    }
}

/// Reads one line (without its `\n`) as the contract does: `Ok(None)` for a
/// blank or comment line, `Err(())` for a malformed one.
fn read_line<'a>(
    line: &'a [u8],
    latest: &mut HashMap<&'a str, u64>,
) -> Result<Option<Call<'a>>, ()> {
    if line.len() > MAX_LINE {
        return Err(());
    }
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = std::str::from_utf8(line).map_err(drop)?;
    let fields: Vec<&str> = text.split([' ', '\t']).filter(|f| !f.is_empty()).collect();
    match fields[..] {
        [] => Ok(None),
        [first, ..] if first.starts_with('#') => Ok(None),
        [verb, client, now, ref cost @ ..] if cost.len() <= 1 => {
            let (allow, release) = match verb {
                "allow" => (true, false),
                "remaining" => (false, false),
                "release" => (false, true),
                _ => return Err(()),
            };
            let cost = match (allow || release, cost) {
                (_, []) => 1,
                (true, [cost]) => read_cost(cost)?,
                // `remaining` takes no cost.
                _ => return Err(()),
            };
            if now.is_empty() || !now.bytes().all(|b| b.is_ascii_digit()) {
                return Err(());
            }
            let digits = now.trim_start_matches('0');
            let now = if digits.is_empty() {
                0
            } else if digits.len() > 13 {
                return Err(()); // past 2 × 10^12 whatever the digits
            } else {
                digits.parse::<u64>().map_err(drop)?
            };
            if now > MAX_NOW || latest.get(client).is_some_and(|&previous| now < previous) {
                return Err(());
            }
            latest.insert(client, now);
            Ok(Some(Call {
                allow,
                release,
                client,
                now,
                cost,
            }))
        }
        _ => Err(()),
    }
}

/// Runs the replay on `data` (options, then the trace) and checks its
/// outcome against the contract.
///
/// # Panics
///
/// On a panic inside the replay, or any answer, status or message other than
/// the contract's.
pub fn check_replay(data: &[u8]) {
    let (option_bytes, trace) = data.split_at(data.len().min(OPTION_BYTES));
    let options = Options::decode(option_bytes);
    let mut output = Vec::new();
    let mut errors = Vec::new();
    let status = replay_with(&options.args(), trace, &mut output, &mut errors);
    let output = String::from_utf8(output).expect("answers are text");
    let errors = String::from_utf8_lossy(&errors);
    let context = || {
        format!(
            "--policy {} --limit {} --window-ms {} --engine {}{} on {:?}:\n\
             status {status}\nstdout {output:?}\nstderr {errors:?}",
            options.policy,
            options.limit,
            options.window_ms,
            options.engine,
            if options.detail { " --detail" } else { "" },
            String::from_utf8_lossy(trace),
        )
    };

    let Some(limiter) = options.limiter() else {
        assert_eq!(status, 2, "refused options: {}", context());
        assert!(output.is_empty(), "refused options: {}", context());
        assert!(
            errors.starts_with("error: ") && errors.ends_with('\n'),
            "{}",
            context()
        );
        return;
    };

    let mut expected = String::new();
    let mut latest = HashMap::new();
    let mut malformed = None;
    // The input's lines: each ends at a `\n` or at the end of the input; an
    // empty piece after the last `\n` is no line.
    let mut lines: Vec<&[u8]> = trace.split(|&b| b == b'\n').collect();
    if lines.last().is_some_and(|last| last.is_empty()) {
        lines.pop();
    }
    for (index, line) in lines.into_iter().enumerate() {
        match read_line(line, &mut latest) {
            Ok(None) => {}
            Ok(Some(call)) => expected.push_str(&answer(&*limiter, &call, options.detail)),
            Err(()) => {
                malformed = Some(index + 1);
                break;
            }
        }
    }
    assert_eq!(output, expected, "answers: {}", context());
    match malformed {
        None => assert_eq!(status, 0, "{}", context()),
        Some(line) => {
            assert_eq!(status, 2, "{}", context());
            let prefix = format!("error: line {line}: ");
            assert!(
                errors.starts_with(&prefix)
                    && errors.ends_with('\n')
                    && errors.lines().count() == 1,
                "expected one message starting {prefix:?}: {}",
                context()
            );
        }
    }
}

/// The answer line the contract prescribes for `call`.
fn answer(limiter: &dyn RateLimiter<str>, call: &Call<'_>, detail: bool) -> String {
    if call.release {
        let released = limiter.release_at(call.client, call.now, call.cost);
        if !detail {
            return format!("{released}\n");
        }
        // A client with no state has the whole of the limit.
        let remaining = limiter
            .peek_at(call.client, call.now)
            .unwrap_or_else(|| limiter.config().limit());
        return format!("{{\"released\":{released},\"remaining\":{remaining}}}\n");
    }
    match (call.allow, detail) {
        (true, false) => format!(
            "{}\n",
            limiter
                .check_n_at(call.client, call.now, call.cost)
                .allowed()
        ),
        (true, true) => {
            let d = limiter.check_n_at(call.client, call.now, call.cost);
            format!(
                "{{\"allowed\":{},\"remaining\":{},\"retry_after\":{},\"delay\":{}}}\n",
                d.allowed(),
                d.remaining(),
                d.retry_after_ticks().unwrap_or(u64::MAX),
                d.delay_ticks()
            )
        }
        (false, false) => format!("{}\n", limiter.remaining_at(call.client, call.now)),
        (false, true) => format!(
            "{{\"remaining\":{}}}\n",
            limiter.remaining_at(call.client, call.now)
        ),
    }
}
