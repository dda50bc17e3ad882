//! The vocabulary every subcommand shares: how a duration, a limit or a
//! count is written on the command line, and how a value that will not do
//! is refused.
//!
//! A refusal names the flag and the value the user typed, then says what to
//! write instead — `--window 1: a duration needs a unit, such as 1s, 500ms
//! or 2m` — and exits with status 2, clap's own for usage errors. The
//! library's errors (a limit out of range, a window shorter than the limit)
//! are put in the same words here, so a user never reads `max_clients(0)`
//! or a window in raw ticks.
//!
//! Value parsers check only how a value is written; ranges that depend on
//! the policy or on other flags are checked once every flag is parsed, with
//! [`explain`] for the library's refusals.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::builder::TypedValueParser;
use clap::error::ErrorKind;
use floodgate::{ConfigError, Engine, Overflow, PolicyKind, Rule, RuleError, MAX_LIMIT};

/// Exit status of a usage error: clap's own.
pub const USAGE: u8 = 2;

/// What a duration looks like, for the messages.
pub const DURATION_EXAMPLES: &str = "such as 1s, 500ms or 2m";

/// The units a duration may carry, for the messages.
pub const UNITS: &str = "ns, us, ms, s, m, h, d";

/// Prints `error: MESSAGE` on standard error and gives the usage status.
pub fn usage(message: impl std::fmt::Display) -> ExitCode {
    let _ = writeln!(std::io::stderr().lock(), "error: {message}");
    ExitCode::from(USAGE)
}

/// A value as the user typed it, quoted only when it would not read back
/// as one word (empty, or holding spaces or quotes).
pub fn shown(text: &str) -> String {
    if text.is_empty()
        || text
            .chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '\'')
    {
        format!("{text:?}")
    } else {
        text.to_owned()
    }
}

/// `--flag VALUE: why`, the form of every refusal of a value.
pub fn refuse(flag: &str, text: &str, why: impl std::fmt::Display) -> String {
    format!("{flag} {}: {why}", shown(text))
}

/// A clap value parser from a function that reads a value or says, in
/// words, what is wrong with it. clap then prints `error: --flag VALUE:
/// why` and exits with [`USAGE`].
#[derive(Clone)]
pub struct Checked<F>(pub F);

impl<T, F> TypedValueParser for Checked<F>
where
    F: Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static,
    T: Clone + Send + Sync + 'static,
{
    type Value = T;

    fn parse_ref(
        &self,
        _cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let flag = arg
            .and_then(clap::Arg::get_long)
            .map_or_else(|| "a value".to_owned(), |long| format!("--{long}"));
        let fail = |text: &str, why: &str| {
            clap::Error::raw(ErrorKind::ValueValidation, refuse(&flag, text, why) + "\n")
        };
        let Some(text) = value.to_str() else {
            return Err(fail(&value.to_string_lossy(), "not valid UTF-8"));
        };
        (self.0)(text).map_err(|why| fail(text, &why))
    }
}

/// A non-empty run of ASCII digits as a `u64` (leading zeros allowed), or
/// `None` for anything else — a sign, `_`, a space, or a value past
/// `u64::MAX`. Stricter than `u64::from_str`, which takes a leading `+`.
pub fn parse_digits(text: &str) -> Option<u64> {
    if text.is_empty() {
        return None;
    }
    text.bytes().try_fold(0u64, |value, byte| {
        if !byte.is_ascii_digit() {
            return None;
        }
        value.checked_mul(10)?.checked_add(u64::from(byte - b'0'))
    })
}

/// What `--limit` takes, for the messages.
pub fn limit_range() -> String {
    format!("the limit must be a whole number between 1 and {MAX_LIMIT}")
}

/// Parses `--limit`: a whole number. Its range depends on the policy, so
/// it is checked with the rest of the quota ([`explain`]).
pub fn parse_limit(text: &str) -> Result<u64, String> {
    parse_digits(text).ok_or_else(limit_range)
}

/// Parses a count such as `--max-clients`, `--threads` or `--seed`: a whole
/// number. Its range is the subcommand's to check.
pub fn parse_count(text: &str) -> Result<u64, String> {
    parse_digits(text).ok_or_else(|| "expected a whole number, such as 100".to_owned())
}

/// Parses `--max-clients`: a whole number (0 tracks nobody).
pub fn parse_max_clients(text: &str) -> Result<usize, String> {
    parse_count(text)?
        .try_into()
        .map_err(|_| "expected a whole number of clients".to_owned())
}

/// A parser of a whole number from `min` to `max` (`--threads`,
/// `--seconds`, …), for a field of type `T`.
pub fn parse_in<T>(min: u64, max: u64) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync
where
    T: TryFrom<u64>,
{
    move |text| {
        parse_digits(text)
            .filter(|n| (min..=max).contains(n))
            .and_then(|n| T::try_from(n).ok())
            .ok_or_else(|| format!("expected a whole number between {min} and {max}"))
    }
}

/// Parses `--policy`: one of the six names.
pub fn parse_policy(text: &str) -> Result<PolicyKind, String> {
    let names = || {
        let names: Vec<&str> = PolicyKind::ALL.iter().map(|p| p.name()).collect();
        names.join(", ")
    };
    match text.parse() {
        Ok(PolicyKind::InFlight) => Err(format!(
            "in-flight has no window, so it is no --policy (one of {}): give it as a rule, \
             --rule in-flight:LIMIT",
            names()
        )),
        Ok(policy) => Ok(policy),
        Err(_) => Err(format!("expected one of {}", names())),
    }
}

/// Parses a rule, `POLICY:LIMIT/WINDOW` (`gcra:10/1s`), as the library
/// reads it, its window with a unit: a count of ticks means a different
/// window for each clock, as for `--window`. `in-flight:LIMIT` has none. The refusal says where in
/// the rule it is wrong; `--rule` and the rule itself come first, from
/// [`Checked`].
pub fn parse_rule(text: &str) -> Result<Rule, String> {
    let rule: Rule = text.parse().map_err(|error: RuleError| {
        let message = error.to_string();
        let named = format!("invalid rule {:?} ", error.text);
        match message.strip_prefix(&named) {
            Some(rest) => rest.to_owned(),
            None => message,
        }
    })?;
    if rule.config().span().is_none() && rule.policy() != PolicyKind::InFlight {
        return Err(format!(
            "a window in ticks depends on the clock: give it with a unit ({UNITS}), \
             {DURATION_EXAMPLES}"
        ));
    }
    Ok(rule)
}

/// Parses `--engine`.
pub fn parse_engine(text: &str) -> Result<Engine, String> {
    text.parse()
        .map_err(|_| "expected lockfree or mutex".to_owned())
}

/// Parses `--overflow`.
pub fn parse_overflow(text: &str) -> Result<Overflow, String> {
    text.parse()
        .map_err(|_| "expected reject, admit or shared".to_owned())
}

/// A duration as the user wrote it: the text, for the messages, and its
/// length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// What was typed.
    pub text: String,
    /// Its length in nanoseconds (at most `u64::MAX`, about 584 years).
    pub nanos: u64,
}

impl Span {
    /// The span as a [`Duration`].
    pub fn duration(&self) -> Duration {
        Duration::from_nanos(self.nanos)
    }
}

/// Nanoseconds per unit, for the units a duration may carry.
fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" | "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        _ => return None,
    })
}

/// `nanos` as a whole number of the largest unit that holds it exactly:
/// `1s`, `90m`, `1500us`.
pub fn format_duration(nanos: u128) -> String {
    const UNITS: [(&str, u128); 7] = [
        ("d", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ];
    let (unit, per) = UNITS
        .into_iter()
        .find(|&(_, per)| nanos > 0 && nanos.is_multiple_of(per))
        .unwrap_or(("ns", 1));
    format!("{}{unit}", nanos / per)
}

/// Parses a duration: a whole number and a unit (`500ms`, `1s`, `2m`), the
/// units being those of [`UNITS`] — the same text as a rule's window
/// (`gcra:100/1s`).
pub fn parse_duration(text: &str) -> Result<Span, String> {
    let digits = text.len() - text.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let (count, unit) = text.split_at(digits);
    if count.is_empty() {
        return Err(format!(
            "a duration is a whole number and a unit, {DURATION_EXAMPLES}"
        ));
    }
    if unit.is_empty() {
        return Err(format!("a duration needs a unit, {DURATION_EXAMPLES}"));
    }
    if let Some(rest) = unit.strip_prefix('.') {
        return Err(whole_units(count, rest));
    }
    let per =
        unit_nanos(unit).ok_or_else(|| format!("unknown unit {unit:?}: the units are {UNITS}"))?;
    let nanos = parse_digits(count)
        .and_then(|count| count.checked_mul(per))
        .ok_or_else(|| {
            format!(
                "too long: at most {} (about 584 years)",
                format_duration(u128::from(u64::MAX))
            )
        })?;
    Ok(Span {
        text: text.to_owned(),
        nanos,
    })
}

/// The refusal of a fraction, `1.5s`: the same length in whole units when
/// there is one (`1500ms`).
fn whole_units(count: &str, rest: &str) -> String {
    let fraction_len = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let (fraction, unit) = rest.split_at(fraction_len);
    let exact = unit_nanos(unit).and_then(|per| {
        let scale = 10u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
        let whole: u128 = format!("{count}{fraction}").parse().ok()?;
        let nanos = whole.checked_mul(u128::from(per))?;
        (nanos.is_multiple_of(scale) && nanos > 0).then(|| nanos / scale)
    });
    match exact {
        Some(nanos) => format!("write whole units, such as {}", format_duration(nanos)),
        None => format!("write whole units, {DURATION_EXAMPLES}"),
    }
}

/// How a quota was written, to put the library's refusals in the flags'
/// words.
pub struct Written<'a> {
    /// The limit given.
    pub limit: u64,
    /// The window's flag as typed (`--window`, or an alias such as
    /// `--window-ms`).
    pub window_flag: &'a str,
    /// The window's value as typed.
    pub window_text: &'a str,
    /// Nanoseconds per tick of the limiter the quota was for: a window is
    /// refused or bounded in ticks.
    pub tick_nanos: u64,
}

/// A refusal of the library's in the flags the user typed: what to write
/// instead, never a builder call or a count of ticks.
pub fn explain(error: &ConfigError, written: &Written<'_>) -> String {
    let Written {
        limit,
        window_flag,
        window_text,
        tick_nanos,
    } = *written;
    let window = format!("{window_flag} {}", shown(window_text));
    match error {
        ConfigError::LimitOutOfRange { .. } => refuse("--limit", &limit.to_string(), limit_range()),
        ConfigError::LimitTooLargeFor { policy, max, .. } => refuse(
            "--limit",
            &limit.to_string(),
            format!(
                "{policy} keeps the time of every admitted request, so its limit must be \
                 between 1 and {max}"
            ),
        ),
        ConfigError::ZeroWindow => format!("{window}: the window must be longer than 0"),
        ConfigError::WindowShorterThanLimit { policy, .. } => {
            let least = u128::from(limit) * u128::from(tick_nanos);
            let least = match window_flag {
                "--window-ms" => format!("--window-ms {}", least.div_ceil(1_000_000)),
                "--window-ns" => format!("--window-ns {least}"),
                _ => format!("--window {}", format_duration(least)),
            };
            format!(
                "--limit {limit} {window}: {policy} lets one request in every window/limit, \
                 and that must be at least {}: give {least} or longer, or a smaller --limit",
                format_duration(u128::from(tick_nanos))
            )
        }
        ConfigError::WindowTooLong { max, .. } => format!(
            "{window}: the window must be at most {}",
            format_duration(u128::from(*max) * u128::from(tick_nanos))
        ),
        ConfigError::RefusesEveryone => "--max-clients 0: with --overflow reject (the default) \
             every client would be refused; give --max-clients 1 or more, or add --overflow \
             admit (new clients pass untracked) or --overflow shared (they share one limit)"
            .to_owned(),
        other => format!("--limit {limit} {window}: {other}"),
    }
}

/// The command that builds what this build left out: `cargo run --release
/// -p floodgate-cli --features FEATURES --` and the arguments this run was
/// given.
pub fn rebuild_with(features: &str) -> String {
    let mut command = format!("cargo run --release -p floodgate-cli --features {features} --");
    for arg in std::env::args_os().skip(1) {
        let arg = arg.to_string_lossy();
        let plain = !arg.is_empty()
            && arg
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c));
        if plain {
            let _ = write!(command, " {arg}");
        } else {
            let _ = write!(command, " '{}'", arg.replace('\'', r"'\''"));
        }
    }
    command
}

/// The refusal of a subcommand or option this build left out: what it
/// needs and the command that builds it.
pub fn left_out(what: &str, features: &str) -> String {
    let feature = if features.contains(',') {
        format!("features `{}`", features.replace(',', "` and `"))
    } else {
        format!("`{features}` feature")
    };
    format!(
        "{what} needs the CLI's {feature}, which this build leaves out: {}",
        rebuild_with(features)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_whole_numbers_and_units() {
        let nanos = |text| parse_duration(text).map(|span| span.nanos);
        assert_eq!(nanos("1s"), Ok(1_000_000_000));
        assert_eq!(nanos("500ms"), Ok(500_000_000));
        assert_eq!(nanos("2m"), Ok(120_000_000_000));
        assert_eq!(nanos("0100ns"), Ok(100));
        assert_eq!(nanos("3us"), Ok(3_000));
        assert_eq!(nanos("1d"), Ok(86_400_000_000_000));
        assert_eq!(nanos("0s"), Ok(0));
        let refused = |text| parse_duration(text).unwrap_err();
        assert_eq!(
            refused("1"),
            "a duration needs a unit, such as 1s, 500ms or 2m"
        );
        assert_eq!(refused("1.5s"), "write whole units, such as 1500ms");
        assert_eq!(refused("1.5m"), "write whole units, such as 90s");
        assert_eq!(refused("0.25s"), "write whole units, such as 250ms");
        assert_eq!(
            refused("1.5ns"),
            "write whole units, such as 1s, 500ms or 2m"
        );
        assert_eq!(refused("1.s"), "write whole units, such as 1s");
        assert!(refused("1x").starts_with("unknown unit \"x\""));
        assert!(refused("1 s").starts_with("unknown unit \" s\""));
        for bad in ["", "s", "-1s", "+1s", "ten", " 1s"] {
            assert!(refused(bad).starts_with("a duration is"), "{bad:?}");
        }
        assert!(refused("18446744073709551616ns").starts_with("too long"));
        assert!(refused("1000000d").starts_with("too long"));
    }

    #[test]
    fn durations_print_in_their_largest_exact_unit() {
        assert_eq!(format_duration(1_000_000_000), "1s");
        assert_eq!(format_duration(90_000_000_000), "90s");
        assert_eq!(format_duration(1_500_000), "1500us");
        assert_eq!(format_duration(0), "0ns");
    }

    #[test]
    fn rules_are_the_librarys_with_a_unit() {
        assert_eq!(
            parse_rule("gcra:10/1s").map(|rule| rule.to_string()),
            Ok("gcra:10/1s".to_owned())
        );
        assert_eq!(
            parse_rule("gcra:10/1fortnight").unwrap_err(),
            "at byte 9: unknown unit \"fortnight\" (the units are ns, us, ms, s, m, h, d \
             and ticks)"
        );
        assert!(parse_rule("gcra:10/1000ticks")
            .unwrap_err()
            .starts_with("a window in ticks depends on the clock"));
    }

    #[test]
    fn counts_are_digits_only() {
        assert_eq!(parse_digits("0042"), Some(42));
        assert_eq!(parse_digits(&u64::MAX.to_string()), Some(u64::MAX));
        for bad in ["", "+1", "-1", " 1", "1 ", "18446744073709551616"] {
            assert_eq!(parse_digits(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_left_out_feature_names_the_command_that_builds_it() {
        let bench = left_out("`floodgate bench`", "bench");
        assert!(
            bench.starts_with(
                "`floodgate bench` needs the CLI's `bench` feature, which this build leaves \
                 out: cargo run --release -p floodgate-cli --features bench --"
            ),
            "{bench}"
        );
        let backend = left_out("`floodgate proxy --backend`", "proxy,redis");
        assert!(
            backend.starts_with(
                "`floodgate proxy --backend` needs the CLI's features `proxy` and `redis`, \
                 which this build leaves out: cargo run --release -p floodgate-cli --features \
                 proxy,redis --"
            ),
            "{backend}"
        );
    }

    #[test]
    fn values_are_quoted_only_when_they_would_not_read_back() {
        assert_eq!(refuse("--window", "1", "why"), "--window 1: why");
        assert_eq!(refuse("--window", "", "why"), "--window \"\": why");
        assert_eq!(refuse("--window", "1 s", "why"), "--window \"1 s\": why");
    }
}
