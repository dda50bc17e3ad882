//! `floodgate replay`: answers a trace of `allow`/`remaining` calls read from
//! standard input, one answer line per call, exactly as the decision contract
//! (SPEC.md, "The replay trace") prescribes: for one rule (`--policy`,
//! `--limit`, `--window-ms`, or one `--rule`), or for several rules on every
//! client (`--rule` repeated; the contract's "Several limits on one
//! client").
//!
//! The input is streamed: one line is held at a time, so a trace of any
//! length replays in constant memory apart from the per-client state and
//! the last time of each client. Under `--evict-idle` or `--max-clients`
//! both are bounded by the clients the limiter tracks (see `Latest`). Answers
//! go through one buffer that is flushed whenever the input has no complete
//! line left buffered — before a read that could block — and at the end, so
//! a person typing calls sees each answer at once while a piped trace of a
//! million lines costs a few hundred writes, not a million.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use floodgate::{
    build_bounded, build_rules, Bounds, Config, Engine, ManualClock, Overflow, PolicyKind,
    RateLimiter, Rule, RuleSet, Tick,
};

use crate::args::{
    explain, parse_count, parse_digits, parse_duration, parse_engine, parse_limit, parse_overflow,
    parse_policy, refuse, shown, Checked, Span, Written, USAGE,
};

#[cfg(feature = "redis")]
mod redis_backend;

/// The longest window replay accepts, in milliseconds (the contract's bound).
const MAX_WINDOW_MS: u64 = 1_000_000_000;

/// What `--window-ms` takes, for the messages that refuse it.
const WINDOW_RANGE: &str =
    "the window must be a whole number of milliseconds between 1 and 1000000000";

/// Nanoseconds per millisecond: a trace's tick.
const MILLISECOND: u64 = 1_000_000;

/// The latest `NOW` a trace may carry, in milliseconds (the contract's bound).
const MAX_NOW: u64 = 2_000_000_000_000;

/// The largest `COST` a trace may carry (the contract's bound, 2^64 − 1).
const MAX_COST: u64 = u64::MAX;

/// The longest line a trace may hold, in bytes before its `\n` (a trailing
/// `\r` included). A line is two words and at most two numbers: this leaves a client
/// name of over 8,000 bytes, as long as the request lines and header fields
/// HTTP servers accept (Apache's `LimitRequestLine` is 8190), so any key
/// taken from a request fits beside the largest NOW and COST, and it keeps the one line held in memory
/// smaller than the input buffer. A longer line is malformed as soon as its
/// first `MAX_LINE + 1` bytes are read; the rest is never read.
const MAX_LINE: usize = 8 * 1024;

/// Input and output buffer size. Large enough that a piped trace is read and
/// answered in few system calls; the flush rule keeps it interactive.
const BUFFER: usize = 64 * 1024;

/// The trace format, shown after the options by `floodgate replay --help`.
const TRACE_HELP: &str = "\
The trace on standard input has one call per line:

  allow CLIENT NOW [COST]   answered true or false
  remaining CLIENT NOW      answered with a count
  refund CLIENT NOW COST AT answered with the units given back of COST,
                            for the admission made at AT (AT <= NOW)
  release CLIENT NOW [COST] answered with the units released of COST
                            (1 when absent) that in-flight rules hold

COST is what the request spends of the limit (ASCII digits, at most
18446744073709551615; 1 when absent), all of it or nothing: a request of
cost n is admitted iff n requests at NOW would all be. A COST of 0 is
always admitted and spends nothing; one above the limit never is.
NOW is in milliseconds (ASCII digits, at most 2000000000000) and must not
decrease for a client. With --evict-idle or --max-clients this is checked
for the clients the limiter tracks: one it forgot, or never tracked, is new
at its next call, whatever its NOW. Fields are separated by spaces or tabs;
blank lines and lines starting with # are skipped. A line holds at most 8192
bytes before its newline. A malformed line (a longer one included) stops the
replay with its line number on standard error and exit status 2.

Example: printf 'allow rahul 0\\nremaining rahul 999\\n' |
  floodgate replay --policy sliding-window --limit 3 --window 1s

Several rules on every client, in place of --policy, --limit and --window:
  floodgate replay --rule gcra:10/1s --rule fixed-window:1000/1h
A request is admitted only if every rule admits it, and then counts in
each; one refused counts in none. remaining is the least of the rules',
retry_after the longest wait of those that refused.";

/// Options of `floodgate replay`.
#[derive(clap::Args)]
#[command(after_help = TRACE_HELP)]
#[command(group(clap::ArgGroup::new("window_given").args(["window", "window_ms"])))]
pub struct Args {
    /// The policy: sliding-window, token-bucket, fixed-window,
    /// sliding-window-counter, gcra or leaky-bucket.
    #[arg(long, value_name = "NAME", value_parser = Checked(parse_policy),
          required_unless_present = "rules")]
    policy: Option<PolicyKind>,

    /// At most L requests per window (1 to 4294967295; 1 to 1048575 for
    /// sliding-window).
    #[arg(long, value_name = "L", value_parser = Checked(parse_limit),
          required_unless_present = "rules")]
    limit: Option<u64>,

    /// The window W: a whole number and a unit, such as 1s, 500ms or 2m,
    /// in whole milliseconds (1ms to 1000000000ms; at least L ms for
    /// token-bucket, gcra and leaky-bucket).
    #[arg(long, value_name = "DURATION", value_parser = Checked(parse_duration),
          required_unless_present_any = ["window_ms", "rules"])]
    window: Option<Span>,

    /// The window in milliseconds, the unit of a trace's times: --window-ms
    /// 1000 is --window 1s.
    #[arg(long = "window-ms", value_name = "W", value_parser = Checked(parse_window_ms))]
    window_ms: Option<u64>,

    /// A rule POLICY:LIMIT/WINDOW, in place of --policy, --limit and
    /// --window-ms, written as the library reads it (gcra:10/1s,
    /// in-flight:5): the window a whole number with a unit (ns, us, ms, s,
    /// m, h or d), whole milliseconds from 1ms to 1000000000ms. Repeat it
    /// for several rules on every client: a request is admitted only if
    /// every rule admits it, and then counts in each.
    #[arg(long = "rule", value_name = "POLICY:LIMIT/WINDOW", value_parser = Checked(parse_rule))]
    rules: Vec<RuleArg>,

    /// Answer each call with a JSON object: every field of the decision for
    /// `allow`, `{"remaining":N}` for `remaining`.
    #[arg(long)]
    detail: bool,

    /// The engine that answers: lockfree or mutex.
    #[arg(long, value_name = "ENGINE", default_value_t = Engine::LockFree,
          value_parser = Checked(parse_engine))]
    engine: Engine,

    #[command(flatten)]
    backend: Backend,

    /// Forget idle clients, swept as new clients arrive (off by default, so
    /// answers are exactly the contract's). A forgotten client that calls
    /// again is new: for token-bucket, fixed-window and
    /// sliding-window-counter its grid starts at that call, and its NOW may
    /// be earlier than its calls before it was forgotten.
    #[arg(long)]
    evict_idle: bool,

    /// Track at most N clients; a new client that finds no room gets the
    /// --overflow rule. The replay keeps the last NOW of tracked clients
    /// only, so its memory is bounded too: an untracked client's NOW is not
    /// checked against its earlier calls.
    #[arg(long, value_name = "N", value_parser = Checked(parse_max_clients))]
    max_clients: Option<usize>,

    /// Start from the state a --save wrote (the same rules are given
    /// again): the trace goes on from there, its clients' latest times
    /// included. A file that is missing, damaged, of a newer format or
    /// saved under other rules is an error (exit status 2). Needs the
    /// CLI's `state` feature.
    #[arg(long, value_name = "FILE")]
    load: Option<PathBuf>,

    /// Write the state after the last line of the trace to FILE (written
    /// beside it, then renamed over it): a later --load goes on from
    /// there. Nothing is written when the replay stops early. Needs the
    /// CLI's `state` feature.
    #[arg(long, value_name = "FILE")]
    save: Option<PathBuf>,

    /// What a new client gets at --max-clients when nobody is idle: reject
    /// (fail closed), admit (fail open, untracked) or shared (one state for
    /// all of them).
    #[arg(long, value_name = "RULE", default_value_t = Overflow::Reject, requires = "max_clients",
          value_parser = Checked(parse_overflow))]
    overflow: Overflow,
}

/// The Redis options of `floodgate replay` (feature `redis`; without it
/// they are refused with the command that builds them).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Backend {
    /// Answer from Redis instead of memory: redis://HOST:PORT[/DB], or a
    /// Redis Cluster: redis-cluster://HOST:PORT[,HOST:PORT...]. Only keys
    /// under the replay's prefix are touched; they are deleted before the
    /// trace.
    /// Redis forgets idle clients by itself (keys expire), so the in-memory
    /// options --engine, --evict-idle and --max-clients do not go with it,
    /// and it keeps its state itself: neither do --load and --save.
    #[arg(
        long = "backend",
        value_name = "URL",
        conflicts_with_all = ["engine", "evict_idle", "max_clients", "load", "save"]
    )]
    pub url: Option<String>,

    /// The prefix of the replay's keys in Redis. By default the run's own
    /// (floodgate-replay-PID-RANDOM), whose keys are deleted at the end too,
    /// so concurrent replays on one Redis keep apart. A prefix given here is
    /// cleared before the trace and its keys are kept after it.
    #[arg(long, value_name = "PREFIX", requires = "url")]
    pub prefix: Option<String>,
}

/// Runs `floodgate replay` on standard input, output and error.
///
/// Exit status: 0 when the whole trace was answered (or standard output was
/// closed early, as by `head`); 2 for invalid options or a malformed line;
/// 1 when standard input or output fails otherwise.
pub fn run(args: Args) -> ExitCode {
    let output = BufWriter::with_capacity(BUFFER, io::stdout().lock());
    ExitCode::from(replay_with(
        &args,
        io::stdin().lock(),
        output,
        io::stderr().lock(),
    ))
}

/// `floodgate replay` on any input and outputs: [`run`] is this on standard
/// input, output and error. Returns the exit status [`run`] documents.
pub fn replay_with<R: Read, W: Write, E: Write>(
    args: &Args,
    input: R,
    output: W,
    mut errors: E,
) -> u8 {
    let limiter = match limiter(args) {
        Ok(limiter) => limiter,
        Err(message) => {
            let _ = writeln!(errors, "error: {message}");
            return USAGE;
        }
    };
    let input = BufReader::with_capacity(BUFFER, input);
    let forgets = args.evict_idle || args.max_clients.is_some();
    let mut latest = Latest::new(forgets);
    if let Some(path) = &args.load {
        match load(&*limiter, path) {
            Ok(times) => latest.times = times,
            Err(message) => {
                let _ = writeln!(errors, "error: {message}");
                return USAGE;
            }
        }
    }
    match replay(&*limiter, args.detail, &mut latest, input, output) {
        Ok(()) => match &args.save {
            Some(path) => match save(&*limiter, &latest, path) {
                Ok(()) => 0,
                Err(message) => {
                    let _ = writeln!(errors, "error: {message}");
                    1
                }
            },
            None => 0,
        },
        Err(Stop::Malformed { line, error }) => {
            let _ = writeln!(errors, "error: line {line}: {error}");
            USAGE
        }
        // The reader went away (`floodgate replay … | head`): nobody is left
        // to read more answers, which is not a failure of the replay.
        Err(Stop::Write(error)) if error.kind() == io::ErrorKind::BrokenPipe => 0,
        Err(Stop::Write(error)) => {
            let _ = writeln!(errors, "error: cannot write to standard output: {error}");
            1
        }
        Err(Stop::Read(error)) => {
            let _ = writeln!(errors, "error: cannot read standard input: {error}");
            1
        }
    }
}

/// Builds the limiter the options describe, or says what is allowed.
///
/// The window's bound is replay's own (the contract's ranges in
/// milliseconds); the limit's range and `W >= L` for the drip policies are
/// the library's checks, put in the flags' words by [`explain`].
fn limiter(args: &Args) -> Result<Arc<dyn RateLimiter<str>>, String> {
    #[cfg(not(feature = "redis"))]
    if args.backend.url.is_some() {
        return Err(crate::args::left_out(
            "`floodgate replay --backend`",
            "redis",
        ));
    }
    #[cfg(not(feature = "state"))]
    if let Some(flag) = state_flag(args) {
        return Err(state_left_out(flag));
    }
    if !args.rules.is_empty() {
        return rules_limiter(args);
    }
    // clap requires these three without --rule.
    let (Some(policy), Some(limit)) = (args.policy, args.limit) else {
        unreachable!("--policy and --limit are required without --rule");
    };
    let (flag, text, window_ms) = window(args)?;
    let written = Written {
        limit,
        window_flag: flag,
        window_text: &text,
        tick_nanos: MILLISECOND,
    };
    let config = Config::per_ticks(limit, window_ms).map_err(|e| explain(&e, &written))?;
    #[cfg(feature = "redis")]
    if let Some(redis) = redis_backend::limiter(
        &RuleSet::from(Rule::new(policy, config).map_err(|e| explain(&e, &written))?),
        &args.backend,
    )? {
        return Ok(redis);
    }
    build_bounded::<str, _>(
        policy,
        config,
        args.engine,
        ManualClock::with_tick(0, Tick::MILLISECOND),
        bounds(args),
    )
    .map_err(|e| explain(&e, &written))
}

/// The limiter of the `--rule` options: one, or several on every client.
fn rules_limiter(args: &Args) -> Result<Arc<dyn RateLimiter<str>>, String> {
    let named = args
        .rules
        .iter()
        .map(|rule| format!("--rule {}", shown(&rule.text)))
        .collect::<Vec<_>>()
        .join(" ");
    let clash = [
        ("--policy", args.policy.is_some()),
        ("--limit", args.limit.is_some()),
        ("--window-ms", args.window_ms.is_some()),
        ("--window", args.window.is_some()),
    ]
    .into_iter()
    .find_map(|(flag, given)| given.then_some(flag));
    if let Some(flag) = clash {
        // The window flag named as the user wrote it.
        let window = if args.window.is_some() {
            "--window"
        } else {
            "--window-ms"
        };
        return Err(format!(
            "{named}: a rule replaces --policy, --limit and {window}, so it does not go \
             with {flag}; give either --rule (one or more) or those three"
        ));
    }
    let rules = RuleSet::new(args.rules.iter().map(|rule| rule.rule))
        .map_err(|e| format!("{named}: {e}"))?;
    #[cfg(feature = "redis")]
    if let Some(redis) = redis_backend::limiter(&rules, &args.backend)? {
        return Ok(redis);
    }
    build_rules::<str, _>(
        &rules,
        args.engine,
        ManualClock::with_tick(0, Tick::MILLISECOND),
        bounds(args),
    )
    .map_err(|e| format!("{named}: {e}"))
}

/// The in-memory limiter's bounds, from the options. Every call passes its
/// time explicitly, so the clock is never read: a manual clock keeps the
/// limiter free of any real time.
fn bounds(args: &Args) -> Bounds {
    let mut bounds = Bounds::new().on_overflow(args.overflow);
    if args.evict_idle {
        bounds = bounds.evict_idle();
    }
    if let Some(max_clients) = args.max_clients {
        bounds = bounds.max_clients(max_clients);
    }
    bounds
}

/// A `--rule` as typed, and the rule it gives in the trace's milliseconds.
#[derive(Clone, Debug)]
struct RuleArg {
    text: String,
    rule: Rule,
}

/// Parses `--rule POLICY:LIMIT/WINDOW` as the library reads a rule, with
/// its messages (as `floodgate proxy --rule` does), then in the trace's
/// milliseconds: a window of whole milliseconds, from 1ms to
/// [`MAX_WINDOW_MS`]ms, and what the policy refuses in those ticks.
fn parse_rule(text: &str) -> Result<RuleArg, String> {
    let rule = crate::args::parse_rule(text)?;
    if let Some(span) = rule.config().span() {
        let written = text
            .split_once('/')
            .map_or(text, |(_, window)| window.trim());
        let nanos = span.as_nanos();
        let millis = nanos / u128::from(MILLISECOND);
        if nanos % u128::from(MILLISECOND) != 0 {
            let whole = if millis == 0 {
                "1ms".to_owned()
            } else {
                format!("{millis}ms or {}ms", millis + 1)
            };
            return Err(format!(
                "the window {}: a trace's times are milliseconds, so the window is a whole \
                 number of them, such as {whole}",
                shown(written)
            ));
        }
        if millis > u128::from(MAX_WINDOW_MS) {
            return Err(format!(
                "the window {} must be between 1ms and {MAX_WINDOW_MS}ms",
                shown(written)
            ));
        }
    }
    let rule = rule
        .in_ticks_of(Tick::MILLISECOND)
        .map_err(|error| error.to_string())?;
    Ok(RuleArg {
        text: text.to_owned(),
        rule,
    })
}

/// The window in milliseconds, with the flag and the text that gave it.
fn window(args: &Args) -> Result<(&'static str, String, u64), String> {
    let (flag, text, window_ms) = match (&args.window, args.window_ms) {
        (_, Some(window_ms)) => {
            let text = window_ms.to_string();
            if !(1..=MAX_WINDOW_MS).contains(&window_ms) {
                return Err(refuse("--window-ms", &text, WINDOW_RANGE));
            }
            return Ok(("--window-ms", text, window_ms));
        }
        (Some(span), None) => ("--window", span.text.clone(), span.nanos / MILLISECOND),
        // clap requires one of the two (the group `window_given`).
        (None, None) => unreachable!("--window or --window-ms is required"),
    };
    if !(1..=MAX_WINDOW_MS).contains(&window_ms) {
        return Err(refuse(
            flag,
            &text,
            format!("the window must be between 1ms and {MAX_WINDOW_MS}ms"),
        ));
    }
    if args
        .window
        .as_ref()
        .is_some_and(|span| span.nanos % MILLISECOND != 0)
    {
        return Err(refuse(
            flag,
            &text,
            format!(
                "a trace's times are milliseconds, so the window is a whole number of them, \
                 such as {window_ms}ms or {}ms",
                window_ms + 1
            ),
        ));
    }
    Ok((flag, text, window_ms))
}

/// Parses `--max-clients`: a whole number (0 tracks nobody).
fn parse_max_clients(text: &str) -> Result<usize, String> {
    parse_count(text)?
        .try_into()
        .map_err(|_| "expected a whole number of clients".to_owned())
}

/// Parses `--window-ms`: a whole number of milliseconds; its range is
/// checked with the rest of the configuration.
fn parse_window_ms(text: &str) -> Result<u64, String> {
    parse_digits(text).ok_or_else(|| WINDOW_RANGE.to_owned())
}

/// The two calls a trace can make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verb {
    /// `allow CLIENT NOW [COST]`: decide one request of cost `COST`.
    Allow,
    /// `remaining CLIENT NOW`: how many would be admitted at `NOW`.
    Remaining,
    /// `refund CLIENT NOW COST AT`: give back up to `COST` units of the
    /// admission made at `AT`.
    Refund,
    /// `release CLIENT NOW [COST]`: give back up to `COST` of the units
    /// the client's `in-flight` rules hold.
    Release,
}

/// One call of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Call<'a> {
    verb: Verb,
    client: &'a str,
    now: u64,
    /// The request's cost: 1 when the line gives none (always 1 for
    /// `remaining`); a refund's units.
    cost: u64,
    /// A refund's `AT` (0 for the other calls).
    at: u64,
}

/// What one line of a trace holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Line<'a> {
    /// No fields at all.
    Blank,
    /// The first field starts with `#`.
    Comment,
    /// A call to answer.
    Call(Call<'a>),
}

/// Why a line is malformed. The messages say what the line should have been.
#[derive(Clone, Debug, PartialEq, Eq)]
enum LineError {
    /// The line has more than [`MAX_LINE`] bytes before its `\n`.
    TooLong,
    /// The line is not UTF-8; `valid_up_to` bytes of it are.
    NotUtf8 { valid_up_to: usize },
    /// A line that is neither blank nor a comment must have three fields
    /// (four for an `allow` with a cost).
    FieldCount(usize),
    /// The first field is neither `allow` nor `remaining`.
    Verb(String),
    /// `NOW` is not a run of ASCII digits.
    NotANumber(String),
    /// `NOW` is digits but above [`MAX_NOW`].
    TooLate(String),
    /// `COST` is not a run of ASCII digits, or is above [`MAX_COST`].
    Cost(String),
    /// A `remaining` line with a fourth field: only `allow` takes a cost.
    CostOnRemaining(String),
    /// A `refund` line without its `COST` and `AT`.
    RefundFields(usize),
    /// A refund's `AT` later than its `NOW`.
    AtAfterNow { at: u64, now: u64 },
    /// `NOW` is earlier than this client's previous call: the contract's
    /// answers assume a client's time never decreases in a trace.
    Backwards {
        client: String,
        now: u64,
        previous: u64,
    },
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineError::TooLong => write!(
                f,
                "longer than {MAX_LINE} bytes: a line is one call (allow CLIENT NOW [COST] or \
                 remaining CLIENT NOW) of at most {MAX_LINE} bytes before its newline"
            ),
            LineError::NotUtf8 { valid_up_to } => write!(
                f,
                "not valid UTF-8 (the byte after the first {valid_up_to} is not)"
            ),
            LineError::FieldCount(found) => write!(
                f,
                "expected 3 or 4 fields (allow CLIENT NOW [COST] or release CLIENT NOW [COST]), \
                 3 (remaining CLIENT NOW) or 5 (refund CLIENT NOW COST AT), found {found}"
            ),
            LineError::Verb(verb) => {
                write!(
                    f,
                    "unknown call {verb:?}: expected allow, remaining, refund or release"
                )
            }
            LineError::RefundFields(found) => write!(
                f,
                "a refund has 5 fields, refund CLIENT NOW COST AT (COST and AT are required), \
                 found {found}"
            ),
            LineError::AtAfterNow { at, now } => write!(
                f,
                "AT {at} is later than NOW {now}: a refund names an admission made at or \
                 before its own time"
            ),
            LineError::NotANumber(now) => write!(
                f,
                "NOW {now:?} is not a number of milliseconds (ASCII digits, at most {MAX_NOW})"
            ),
            LineError::TooLate(now) => {
                write!(
                    f,
                    "NOW {now:?} is too large: at most {MAX_NOW} milliseconds"
                )
            }
            LineError::Cost(cost) => write!(
                f,
                "COST {cost:?} is not a cost (ASCII digits, at most {MAX_COST})"
            ),
            LineError::CostOnRemaining(cost) => write!(
                f,
                "remaining takes no COST (found {cost:?}): remaining CLIENT NOW"
            ),
            LineError::Backwards {
                client,
                now,
                previous,
            } => write!(
                f,
                "NOW {now} of client {client:?} is earlier than its previous call at {previous}; \
                 a client's time must not decrease"
            ),
        }
    }
}

/// Parses one line, without its `\n` (a trailing `\r` is ignored here).
///
/// Fields are separated by runs of spaces and tabs only: any other character,
/// `#` and `\r` included, belongs to a field.
fn parse_line(bytes: &[u8]) -> Result<Line<'_>, LineError> {
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    let text = std::str::from_utf8(bytes).map_err(|e| LineError::NotUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    let mut fields = text.split([' ', '\t']).filter(|field| !field.is_empty());
    let Some(first) = fields.next() else {
        return Ok(Line::Blank);
    };
    if first.starts_with('#') {
        return Ok(Line::Comment);
    }
    // Only reached for a wrong count, so counting again is off the common
    // path.
    let count = || text.split([' ', '\t']).filter(|f| !f.is_empty()).count();
    let verb = match first {
        "allow" => Verb::Allow,
        "remaining" => Verb::Remaining,
        "refund" => Verb::Refund,
        "release" => Verb::Release,
        _ if count() < 3 || count() > 5 => return Err(LineError::FieldCount(count())),
        _ => return Err(LineError::Verb(first.to_owned())),
    };
    if verb == Verb::Refund {
        let (Some(client), Some(now), Some(cost), Some(at), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return Err(LineError::RefundFields(count()));
        };
        let (now, cost, at) = (parse_now(now)?, parse_cost(cost)?, parse_now(at)?);
        if at > now {
            return Err(LineError::AtAfterNow { at, now });
        }
        return Ok(Line::Call(Call {
            verb,
            client,
            now,
            cost,
            at,
        }));
    }
    let (Some(client), Some(now), cost, None) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return Err(LineError::FieldCount(count()));
    };
    let now = parse_now(now)?;
    let cost = match (verb, cost) {
        (_, None) => 1,
        (Verb::Remaining, Some(cost)) => return Err(LineError::CostOnRemaining(cost.to_owned())),
        (_, Some(cost)) => parse_cost(cost)?,
    };
    Ok(Line::Call(Call {
        verb,
        client,
        now,
        cost,
        at: 0,
    }))
}

/// Parses `COST`: ASCII digits (leading zeros allowed), at most
/// [`MAX_COST`], which is exactly what fits a `u64`.
fn parse_cost(field: &str) -> Result<u64, LineError> {
    parse_digits(field).ok_or_else(|| LineError::Cost(field.to_owned()))
}

/// Parses `NOW`: ASCII digits (leading zeros allowed), at most [`MAX_NOW`].
fn parse_now(field: &str) -> Result<u64, LineError> {
    if !field.bytes().all(|b| b.is_ascii_digit()) {
        return Err(LineError::NotANumber(field.to_owned()));
    }
    match parse_digits(field) {
        Some(now) if now <= MAX_NOW => Ok(now),
        _ => Err(LineError::TooLate(field.to_owned())),
    }
}

/// Why a replay ended before the end of its input.
#[derive(Debug)]
enum Stop {
    /// Line `line` (1-based) is malformed.
    Malformed { line: u64, error: LineError },
    /// Reading the trace failed.
    Read(io::Error),
    /// Writing an answer failed.
    Write(io::Error),
}

/// Answers every call of `input` on `output`, in order.
///
/// On a malformed line, the answers to every earlier line have been flushed
/// before it returns, so they reach the reader even though the replay stops.
fn replay<R: Read, W: Write>(
    limiter: &dyn RateLimiter<str>,
    detail: bool,
    latest: &mut Latest,
    mut input: BufReader<R>,
    mut output: W,
) -> Result<(), Stop> {
    let mut bytes = Vec::new();
    let mut number = 0u64;
    loop {
        bytes.clear();
        // One byte past the bound tells a line that is too long from one
        // that ends exactly at it, without reading any further.
        let mut bounded = (&mut input).take(MAX_LINE as u64 + 1);
        if bounded.read_until(b'\n', &mut bytes).map_err(Stop::Read)? == 0 {
            break;
        }
        number += 1;
        let parsed = match bytes.strip_suffix(b"\n") {
            Some(line) => parse_line(line),
            None if bytes.len() > MAX_LINE => Err(LineError::TooLong),
            // The last line, ended by the end of the input.
            None => parse_line(&bytes),
        };
        let call = match parsed.and_then(|line| latest.check(limiter, line)) {
            Ok(Line::Call(call)) => call,
            Ok(Line::Blank | Line::Comment) => continue,
            Err(error) => {
                output.flush().map_err(Stop::Write)?;
                return Err(Stop::Malformed {
                    line: number,
                    error,
                });
            }
        };
        answer(limiter, detail, call, &mut output).map_err(Stop::Write)?;
        // After the call, so that a client it created is kept.
        latest.prune(limiter);
        // The next read blocks only if no complete line is buffered: flush
        // then, so an interactive user sees this answer before typing more.
        if !input.buffer().contains(&b'\n') {
            output.flush().map_err(Stop::Write)?;
        }
    }
    output.flush().map_err(Stop::Write)
}

/// The first of `--load` and `--save` given, if any.
#[cfg(not(feature = "state"))]
fn state_flag(args: &Args) -> Option<&'static str> {
    [("--load", &args.load), ("--save", &args.save)]
        .into_iter()
        .find_map(|(flag, path)| path.is_some().then_some(flag))
}

/// The refusal of `--load` or `--save` in a build without the `state`
/// feature (the default build, the demo's: no serde, no postcard).
#[cfg(not(feature = "state"))]
fn state_left_out(flag: &str) -> String {
    crate::args::left_out(&format!("`floodgate replay {flag}`"), "state")
}

/// Without the `state` feature, `--load` is refused before the trace
/// ([`limiter`]); this answers the same refusal.
#[cfg(not(feature = "state"))]
fn load(_: &dyn RateLimiter<str>, _: &Path) -> Result<HashMap<String, u64>, String> {
    Err(state_left_out("--load"))
}

/// Without the `state` feature, `--save` is refused before the trace
/// ([`limiter`]); this answers the same refusal.
#[cfg(not(feature = "state"))]
fn save(_: &dyn RateLimiter<str>, _: &Latest, _: &Path) -> Result<(), String> {
    Err(state_left_out("--save"))
}

/// Loads the state file at `path` into the new `limiter` (the contract's
/// "Keeping state across a restart"), and answers the clients' latest
/// times it kept; or what is wrong with the file.
#[cfg(feature = "state")]
fn load(limiter: &dyn RateLimiter<str>, path: &Path) -> Result<HashMap<String, u64>, String> {
    let saved = floodgate::state::Saved::read(path).map_err(|e| e.to_string())?;
    let times: Vec<(String, u64)> = postcard::from_bytes(saved.attachment()).map_err(|_| {
        format!(
            "cannot load {}: not saved by floodgate replay (it keeps no latest times)",
            path.display()
        )
    })?;
    saved.load_into(limiter).map_err(|e| e.to_string())?;
    // A client a cap left out is new at its next call, as one it forgot.
    Ok(times
        .into_iter()
        .filter(|(client, now)| limiter.peek_at(client, *now).is_some())
        .collect())
}

/// Saves `limiter`'s state to `path`, with the clients' latest times.
#[cfg(feature = "state")]
fn save(limiter: &dyn RateLimiter<str>, latest: &Latest, path: &Path) -> Result<(), String> {
    let mut times: Vec<(&str, u64)> = latest
        .times
        .iter()
        .map(|(client, &now)| (client.as_str(), now))
        .collect();
    // By client, not in the map's order, which is the process's own.
    times.sort_unstable();
    let attachment = postcard::to_stdvec(&times)
        .map_err(|e| format!("cannot save to {}: {e}", path.display()))?;
    floodgate::state::save_with(limiter, path, &attachment)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The fewest entries [`Latest`] lets itself hold before it prunes: below
/// this, pruning would cost more visits than the entries it saves.
const PRUNE_FLOOR: usize = 1024;

/// The latest time of each client, to refuse a trace whose time goes
/// backwards: the contract leaves those answers open ("being stricter is
/// fine"), so two engines could disagree and the output would no longer be
/// determined by the trace.
///
/// When the limiter forgets clients (`--evict-idle`, `--max-clients`), a
/// client it no longer tracks is a new one at its next call, with that call
/// as its origin, so any `NOW` is its first: only the times of clients the
/// limiter tracks need keeping. Those of forgotten (or never tracked)
/// clients are pruned whenever the map has doubled since the last prune, so
/// it holds at most twice the clients the limiter tracks (or
/// [`PRUNE_FLOOR`]), each prune visiting no more entries than were added
/// since the one before: O(1) amortised per call. A time earlier than a kept
/// one asks the limiter first, so a refusal never depends on when the last
/// prune ran. Without bounds the limiter forgets nobody and every time is
/// kept: the check is exact.
struct Latest {
    times: HashMap<String, u64>,
    /// Whether the limiter may forget a client (or never track one).
    forgets: bool,
    /// The size at which the next prune runs.
    prune_at: usize,
}

impl Latest {
    fn new(forgets: bool) -> Self {
        Latest {
            times: HashMap::new(),
            forgets,
            prune_at: PRUNE_FLOOR,
        }
    }

    /// Refuses a call whose `NOW` is earlier than its client's previous
    /// call while the limiter still tracks that client, and records the
    /// time of every call.
    fn check<'a>(
        &mut self,
        limiter: &dyn RateLimiter<str>,
        line: Line<'a>,
    ) -> Result<Line<'a>, LineError> {
        let Line::Call(call) = line else {
            return Ok(line);
        };
        // `get_mut` first: a known client costs no allocation.
        match self.times.get_mut(call.client) {
            Some(previous) if call.now < *previous => {
                // `peek_at` creates nothing; it runs only on this rare path.
                if self.forgets && limiter.peek_at(call.client, *previous).is_none() {
                    *previous = call.now;
                    return Ok(line);
                }
                Err(LineError::Backwards {
                    client: call.client.to_owned(),
                    now: call.now,
                    previous: *previous,
                })
            }
            Some(previous) => {
                *previous = call.now;
                Ok(line)
            }
            None => {
                self.times.insert(call.client.to_owned(), call.now);
                Ok(line)
            }
        }
    }

    /// Drops the times of the clients the limiter no longer tracks, once
    /// the map has doubled since the last prune.
    fn prune(&mut self, limiter: &dyn RateLimiter<str>) {
        if !self.forgets || self.times.len() < self.prune_at {
            return;
        }
        self.times
            .retain(|client, &mut now| limiter.peek_at(client, now).is_some());
        self.prune_at = PRUNE_FLOOR.max(2 * self.times.len());
    }
}

/// Makes one call and writes its answer line.
fn answer<W: Write>(
    limiter: &dyn RateLimiter<str>,
    detail: bool,
    call: Call<'_>,
    output: &mut W,
) -> io::Result<()> {
    match (call.verb, detail) {
        (Verb::Allow, false) => {
            writeln!(
                output,
                "{}",
                limiter
                    .check_n_at(call.client, call.now, call.cost)
                    .allowed()
            )
        }
        (Verb::Allow, true) => {
            let d = limiter.check_n_at(call.client, call.now, call.cost);
            writeln!(
                output,
                r#"{{"allowed":{},"remaining":{},"retry_after":{},"delay":{}}}"#,
                d.allowed(),
                d.remaining(),
                d.retry_after_ticks().unwrap_or(u64::MAX),
                d.delay_ticks()
            )
        }
        (Verb::Remaining, false) => {
            writeln!(output, "{}", limiter.remaining_at(call.client, call.now))
        }
        (Verb::Remaining, true) => writeln!(
            output,
            r#"{{"remaining":{}}}"#,
            limiter.remaining_at(call.client, call.now)
        ),
        (Verb::Refund, detail) => {
            let given = limiter.refund_at(call.client, call.now, call.at, call.cost);
            if !detail {
                return writeln!(output, "{given}");
            }
            // A client with no state has the whole of the smallest limit.
            let remaining = limiter
                .peek_at(call.client, call.now)
                .unwrap_or_else(|| limiter.config().limit());
            writeln!(output, r#"{{"refunded":{given},"remaining":{remaining}}}"#)
        }
        (Verb::Release, detail) => {
            let released = limiter.release_at(call.client, call.now, call.cost);
            if !detail {
                return writeln!(output, "{released}");
            }
            // A client with no state has the whole of the smallest limit.
            let remaining = limiter
                .peek_at(call.client, call.now)
                .unwrap_or_else(|| limiter.config().limit());
            writeln!(
                output,
                r#"{{"released":{released},"remaining":{remaining}}}"#
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use floodgate::build_with;

    fn call(verb: Verb, client: &str, now: u64) -> Line<'_> {
        Line::Call(Call {
            verb,
            client,
            now,
            cost: 1,
            at: 0,
        })
    }

    #[test]
    fn blank_and_comment_lines() {
        for blank in ["", " ", "\t \t", "\r", "  \r"] {
            assert_eq!(parse_line(blank.as_bytes()), Ok(Line::Blank), "{blank:?}");
        }
        for comment in ["#", "# allow a 1", "  \t#x", "#allow", "#\r", "# a b c d e"] {
            assert_eq!(
                parse_line(comment.as_bytes()),
                Ok(Line::Comment),
                "{comment:?}"
            );
        }
    }

    #[test]
    fn calls_split_on_runs_of_spaces_and_tabs() {
        assert_eq!(
            parse_line(b"allow rahul 0"),
            Ok(call(Verb::Allow, "rahul", 0))
        );
        assert_eq!(
            parse_line(b" \tremaining\t\t rahul   999 \t\r"),
            Ok(call(Verb::Remaining, "rahul", 999))
        );
        // `#` is an ordinary character once it is not the first field.
        assert_eq!(parse_line(b"allow #x 5"), Ok(call(Verb::Allow, "#x", 5)));
        assert_eq!(parse_line(b"allow a# 5"), Ok(call(Verb::Allow, "a#", 5)));
        // Only spaces and tabs separate; other whitespace is part of a field.
        assert_eq!(
            parse_line("allow a\u{a0}b 5".as_bytes()),
            Ok(call(Verb::Allow, "a\u{a0}b", 5))
        );
        assert_eq!(
            parse_line("allow 客户 7".as_bytes()),
            Ok(call(Verb::Allow, "客户", 7))
        );
    }

    #[test]
    fn only_one_trailing_carriage_return_is_ignored() {
        assert_eq!(parse_line(b"allow a 5\r"), Ok(call(Verb::Allow, "a", 5)));
        assert_eq!(
            parse_line(b"allow a 5\r\r"),
            Err(LineError::NotANumber("5\r".into()))
        );
        // A `\r` inside a line is not a separator.
        assert_eq!(
            parse_line(b"allow a\rb 5"),
            Ok(call(Verb::Allow, "a\rb", 5))
        );
    }

    #[test]
    fn wrong_field_counts() {
        assert_eq!(parse_line(b"allow"), Err(LineError::FieldCount(1)));
        assert_eq!(parse_line(b"allow rahul"), Err(LineError::FieldCount(2)));
        assert_eq!(
            parse_line(b"allow rahul 1 2 3"),
            Err(LineError::FieldCount(5))
        );
        assert_eq!(
            parse_line(b"allow rahul 1 # trailing comments are not a thing"),
            Err(LineError::FieldCount(10))
        );
    }

    #[test]
    fn a_refund_names_its_cost_and_an_admission_no_later_than_now() {
        assert_eq!(
            parse_line(b"refund a 9 3 5"),
            Ok(Line::Call(Call {
                verb: Verb::Refund,
                client: "a",
                now: 9,
                cost: 3,
                at: 5,
            }))
        );
        assert_eq!(parse_line(b"refund a 9 3"), Err(LineError::RefundFields(4)));
        assert_eq!(parse_line(b"refund a 9"), Err(LineError::RefundFields(3)));
        assert_eq!(
            parse_line(b"refund a 9 3 10"),
            Err(LineError::AtAfterNow { at: 10, now: 9 })
        );
        assert_eq!(
            parse_line(b"refund a 9 x 5"),
            Err(LineError::Cost("x".into()))
        );
        assert_eq!(
            parse_line(b"refund a 9 1 x"),
            Err(LineError::NotANumber("x".into()))
        );
    }

    #[test]
    fn a_cost_is_digits_up_to_u64_max_and_only_on_allow() {
        let weighted = |cost| {
            Ok(Line::Call(Call {
                verb: Verb::Allow,
                client: "a",
                now: 5,
                cost,
                at: 0,
            }))
        };
        assert_eq!(parse_line(b"allow a 5 0"), weighted(0));
        assert_eq!(parse_line(b"allow a 5\t007 \r"), weighted(7));
        assert_eq!(
            parse_line(b"allow a 5 18446744073709551615"),
            weighted(u64::MAX)
        );
        assert_eq!(parse_line(b"allow a 5"), weighted(1));
        for bad in [
            "18446744073709551616",
            "+1",
            "-1",
            "1.5",
            "1e3",
            "x",
            "٣",
            "0x1",
        ] {
            let line = format!("allow a 5 {bad}");
            assert_eq!(
                parse_line(line.as_bytes()),
                Err(LineError::Cost(bad.into())),
                "{line}"
            );
        }
        assert_eq!(
            parse_line(b"remaining a 5 1"),
            Err(LineError::CostOnRemaining("1".into()))
        );
        // A bad NOW is reported before the cost.
        assert_eq!(
            parse_line(b"allow a x 1"),
            Err(LineError::NotANumber("x".into()))
        );
    }

    #[test]
    fn a_release_takes_a_cost_or_one() {
        let release = |cost| {
            Ok(Line::Call(Call {
                verb: Verb::Release,
                client: "a",
                now: 9,
                cost,
                at: 0,
            }))
        };
        assert_eq!(parse_line(b"release a 9"), release(1));
        assert_eq!(parse_line(b"release a 9 3"), release(3));
        assert_eq!(
            parse_line(b"release a 9 3 4"),
            Err(LineError::FieldCount(5))
        );
        assert_eq!(parse_line(b"release a"), Err(LineError::FieldCount(2)));
        assert_eq!(
            parse_line(b"release a 9 x"),
            Err(LineError::Cost("x".into()))
        );
    }

    #[test]
    fn verbs_are_exact() {
        for verb in ["Allow", "ALLOW", "alow", "remain", "check"] {
            let line = format!("{verb} a 1");
            assert_eq!(
                parse_line(line.as_bytes()),
                Err(LineError::Verb(verb.into())),
                "{line}"
            );
        }
    }

    #[test]
    fn now_is_ascii_digits_up_to_the_bound() {
        assert_eq!(parse_now("0"), Ok(0));
        assert_eq!(parse_now("000123"), Ok(123));
        assert_eq!(parse_now("2000000000000"), Ok(MAX_NOW));
        assert_eq!(parse_now("0002000000000000"), Ok(MAX_NOW));
        for bad in ["12a", "+5", "-5", "1_000", "1.5", "1e3", "٣", "0x10"] {
            assert_eq!(
                parse_now(bad),
                Err(LineError::NotANumber(bad.into())),
                "{bad}"
            );
        }
        for late in [
            "2000000000001",
            "18446744073709551616",
            "99999999999999999999999",
        ] {
            assert_eq!(
                parse_now(late),
                Err(LineError::TooLate(late.into())),
                "{late}"
            );
        }
    }

    #[test]
    fn non_utf8_is_an_error_not_a_panic() {
        assert_eq!(
            parse_line(b"allow \xff 1"),
            Err(LineError::NotUtf8 { valid_up_to: 6 })
        );
        assert_eq!(
            parse_line(b"# caf\xe9"),
            Err(LineError::NotUtf8 { valid_up_to: 5 })
        );
    }

    #[test]
    fn messages_say_what_was_expected() {
        let message = parse_line(b"allow a 12a").unwrap_err().to_string();
        assert_eq!(
            message,
            r#"NOW "12a" is not a number of milliseconds (ASCII digits, at most 2000000000000)"#
        );
        let message = parse_line(b"allo a 1").unwrap_err().to_string();
        assert!(
            message.contains("allow, remaining, refund or release"),
            "{message}"
        );
    }

    fn gcra(bounds: Bounds) -> Arc<dyn RateLimiter<str>> {
        build_bounded::<str, _>(
            PolicyKind::Gcra,
            Config::per_ticks(3, 1_000).unwrap(),
            Engine::LockFree,
            ManualClock::new(0),
            bounds,
        )
        .unwrap()
    }

    #[test]
    fn time_may_stay_but_not_go_back_per_client() {
        let limiter = gcra(Bounds::new());
        let mut latest = Latest::new(false);
        let mut check = |line| {
            let checked = latest.check(&*limiter, line);
            if let Ok(Line::Call(call)) = checked {
                limiter.check_at(call.client, call.now);
            }
            checked
        };
        let a5 = call(Verb::Allow, "a", 5);
        assert_eq!(check(a5), Ok(a5));
        assert_eq!(check(a5), Ok(a5));
        // Another client has its own time.
        let b1 = call(Verb::Remaining, "b", 1);
        assert_eq!(check(b1), Ok(b1));
        assert_eq!(
            check(call(Verb::Remaining, "a", 4)),
            Err(LineError::Backwards {
                client: "a".into(),
                now: 4,
                previous: 5
            })
        );
        assert_eq!(check(Line::Comment), Ok(Line::Comment));
    }

    #[test]
    fn a_client_the_limiter_does_not_track_is_new_whatever_its_time() {
        // One place: "a" takes it, every other client is admitted untracked.
        let limiter = gcra(Bounds::new().max_clients(1).on_overflow(Overflow::Admit));
        let mut latest = Latest::new(true);
        for (client, now) in [("a", 5), ("b", 5)] {
            let line = call(Verb::Allow, client, now);
            assert_eq!(latest.check(&*limiter, line), Ok(line));
            limiter.check_at(client, now);
        }
        assert_eq!(limiter.tracked_clients(), 1);
        let b4 = call(Verb::Allow, "b", 4);
        assert_eq!(latest.check(&*limiter, b4), Ok(b4));
        assert!(matches!(
            latest.check(&*limiter, call(Verb::Allow, "a", 4)),
            Err(LineError::Backwards { previous: 5, .. })
        ));
    }

    #[test]
    fn pruning_keeps_exactly_the_tracked_clients() {
        let limiter = gcra(Bounds::new().max_clients(10).on_overflow(Overflow::Admit));
        let mut latest = Latest::new(true);
        for n in 0..PRUNE_FLOOR {
            let client = n.to_string();
            let line = call(Verb::Allow, &client, 7);
            assert_eq!(latest.check(&*limiter, line), Ok(line));
            limiter.check_at(&client, 7);
            latest.prune(&*limiter);
        }
        assert_eq!(latest.times.len(), 10);
        assert_eq!(latest.prune_at, PRUNE_FLOOR);
        assert!((0..10).all(|n| latest.times.get(&n.to_string()) == Some(&7)));
    }

    #[test]
    fn the_texts_state_the_bounds_the_code_applies() {
        assert!(WINDOW_RANGE.ends_with(&format!(" between 1 and {MAX_WINDOW_MS}")));
        assert!(TRACE_HELP.contains(&format!("at most {MAX_NOW})")));
        assert!(TRACE_HELP.contains(&format!("at most {MAX_LINE}\nbytes before its newline")));
    }

    fn replay_str(policy: PolicyKind, detail: bool, trace: &[u8]) -> (String, Result<(), Stop>) {
        let limiter = build_with::<str, _>(
            policy,
            Config::per_ticks(3, 1_000).unwrap(),
            Engine::LockFree,
            ManualClock::new(0),
        )
        .unwrap();
        let mut output = Vec::new();
        // A tiny input buffer exercises lines that straddle refills.
        let input = BufReader::with_capacity(4, trace);
        let result = replay(
            &*limiter,
            detail,
            &mut Latest::new(false),
            input,
            &mut output,
        );
        (String::from_utf8(output).unwrap(), result)
    }

    #[test]
    fn replay_answers_in_order_and_stops_at_a_malformed_line() {
        let trace = b"allow a 0\n\n# c\nremaining a 0\nallow a 0\r\nallow a x\nallow a 1\n";
        let (output, result) = replay_str(PolicyKind::SlidingWindow, false, trace);
        assert_eq!(output, "true\n2\ntrue\n");
        assert!(
            matches!(
                result,
                Err(Stop::Malformed {
                    line: 6,
                    error: LineError::NotANumber(_)
                })
            ),
            "{result:?}"
        );
    }

    #[test]
    fn replay_takes_a_last_line_without_newline() {
        let (output, result) = replay_str(PolicyKind::LeakyBucket, true, b"allow a 0\nallow a 0");
        assert!(result.is_ok());
        assert_eq!(
            output,
            "{\"allowed\":true,\"remaining\":2,\"retry_after\":0,\"delay\":0}\n\
             {\"allowed\":true,\"remaining\":1,\"retry_after\":0,\"delay\":333}\n"
        );
    }

    #[test]
    fn a_line_past_the_bound_is_malformed_and_one_at_it_is_not() {
        // A comment of exactly MAX_LINE bytes, with and without `\r\n`...
        let at_bound = format!("#{}", "x".repeat(MAX_LINE - 1));
        let crlf = format!("#{}\r", "x".repeat(MAX_LINE - 2));
        let trace = format!("allow a 0\n{at_bound}\n{crlf}\n{at_bound}");
        let (output, result) = replay_str(PolicyKind::Gcra, false, trace.as_bytes());
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(output, "true\n");
        // ...and one byte more, ended by a newline or by the input.
        for end in ["\nallow a 1\n", ""] {
            let trace = format!("allow a 0\n\n{at_bound}x{end}");
            let (output, result) = replay_str(PolicyKind::Gcra, false, trace.as_bytes());
            assert_eq!(output, "true\n");
            assert!(
                matches!(
                    result,
                    Err(Stop::Malformed {
                        line: 3,
                        error: LineError::TooLong
                    })
                ),
                "{result:?}"
            );
        }
    }
}
