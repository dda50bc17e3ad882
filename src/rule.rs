//! A rule as text — `"gcra:100/1s"`, `"sliding-window:1000/1h"` — for
//! configuration files, environment variables and command lines.
//!
//! The grammar is `POLICY:LIMIT/WINDOW`: one of the six policy names, a
//! limit, and a window written as an optional whole number and a unit
//! (`ns`, `us` or `µs`, `ms`, `s`, `m`, `h`, `d`; `100/s` is `100/1s`), or
//! `N ticks` for a raw count of the clock's ticks (`gcra:10/1000ticks`).
//! Printing gives the same form back, the window in the largest unit that
//! holds it exactly. With the cargo feature `serde`, a [`Rule`] is
//! serialized as that text.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::{Config, ConfigError, PolicyKind, Tick, UnknownPolicy};

/// A policy and its limits, validated together: a tier's rule, or a whole
/// limiter's ([`Builder::from_rule`](crate::Builder::from_rule)).
///
/// ```
/// use floodgate::{PolicyKind, Rule};
/// use std::time::Duration;
///
/// let rule: Rule = "token-bucket:100/1s".parse()?;
/// assert_eq!(rule.policy(), PolicyKind::TokenBucket);
/// assert_eq!(rule.config().limit(), 100);
/// assert_eq!(rule.config().span(), Some(Duration::from_secs(1)));
/// assert_eq!(rule.to_string(), "token-bucket:100/1s");
/// assert_eq!("gcra:5/90m".parse::<Rule>()?.to_string(), "gcra:5/90m");
/// assert_eq!("gcra:5/3600s".parse::<Rule>()?.to_string(), "gcra:5/1h");
///
/// let error = "gcra:100/1fortnight".parse::<Rule>().unwrap_err();
/// assert_eq!(
///     error.to_string(),
///     "invalid rule \"gcra:100/1fortnight\" at byte 10: unknown unit \"fortnight\" \
///      (the units are ns, us, ms, s, m, h, d and ticks)"
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    policy: PolicyKind,
    config: Config,
}

impl Rule {
    /// `policy` with `config`.
    ///
    /// # Errors
    ///
    /// What [`Config::resolve`] refuses for `policy` on the default
    /// (nanosecond) tick.
    pub fn new(policy: PolicyKind, config: Config) -> Result<Self, ConfigError> {
        let config = config.resolve(policy, Tick::NANOSECOND)?;
        Ok(Self { policy, config })
    }

    /// `policy` with `config`, already checked for it.
    pub(crate) const fn from_parts(policy: PolicyKind, config: Config) -> Self {
        Self { policy, config }
    }

    /// The policy.
    pub const fn policy(&self) -> PolicyKind {
        self.policy
    }

    /// The limit and window.
    pub const fn config(&self) -> Config {
        self.config
    }

    /// The rule in ticks of `tick` (see [`Config::resolve`]).
    ///
    /// # Errors
    ///
    /// What [`Config::resolve`] refuses.
    pub fn in_ticks_of(self, tick: Tick) -> Result<Self, ConfigError> {
        Ok(Self {
            config: self.config.resolve(self.policy, tick)?,
            ..self
        })
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.policy.has_window() {
            return write!(f, "{}:{}", self.policy, self.config.limit());
        }
        write!(f, "{}:{}/", self.policy, self.config.limit())?;
        match self.config.span() {
            Some(span) => write_duration(f, span),
            None => write!(f, "{}ticks", self.config.window()),
        }
    }
}

/// Text that is not a rule: what was wrong, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    /// The text given.
    pub text: String,
    /// The byte offset of the part that is wrong.
    pub at: usize,
    /// What is wrong there.
    pub problem: RuleProblem,
}

/// What is wrong with a rule's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleProblem {
    /// No `:` between the policy and the limit.
    MissingColon,
    /// No `/` between the limit and the window.
    MissingSlash,
    /// The policy is not one of the seven.
    Policy(UnknownPolicy),
    /// A window on an `in-flight` rule, which bounds units held at once
    /// and has none (`in-flight:10`).
    WindowOnInFlight,
    /// The limit is not a whole number.
    Limit(String),
    /// The window's count is not a whole number.
    Count(String),
    /// The window's unit is not one of the units.
    Unit(String),
    /// The window is a number with no unit (`1`): a unit says how long.
    NoUnit(String),
    /// The window is longer than the policy keeps: 2^64 − 1 nanoseconds
    /// (about 584 years), or 2^62 for the policies that drip.
    WindowTooLong {
        /// The window as written.
        window: String,
        /// The longest window the policy takes, in whole days.
        longest_days: u64,
    },
    /// A comma after a rule: several rules are a [`RuleSet`].
    Comma,
    /// The window has a fraction (`1.5s`): windows are whole units. Says
    /// the same window in a smaller unit, when there is one (`1500ms`).
    Fraction {
        /// The window as written.
        written: String,
        /// The same window in whole units, if one holds it exactly.
        whole: Option<String>,
    },
    /// The numbers are well formed but the policy refuses them.
    Config(ConfigError),
    /// Several rules with nothing between two commas, or none at all.
    NoRule,
    /// More rules than a limiter applies ([`MAX_RULES`]).
    TooManyRules {
        /// How many were given.
        count: usize,
    },
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid rule {:?} at byte {}: ", self.text, self.at)?;
        match &self.problem {
            RuleProblem::MissingColon => {
                f.write_str("expected POLICY:LIMIT/WINDOW, e.g. gcra:100/1s (no `:`)")
            }
            RuleProblem::MissingSlash => {
                f.write_str("expected POLICY:LIMIT/WINDOW, e.g. gcra:100/1s (no `/`)")
            }
            RuleProblem::Policy(unknown) => write!(f, "{unknown}"),
            RuleProblem::WindowOnInFlight => f.write_str(
                "in-flight takes no window: in-flight:LIMIT, e.g. in-flight:10 (units held at \
                 once, each until it is released)",
            ),
            RuleProblem::Limit(text) => write!(f, "the limit {text:?} is not a whole number"),
            RuleProblem::Count(text) => {
                write!(f, "the window {text:?} does not start with a whole number")
            }
            RuleProblem::Fraction { written, whole } => match whole {
                Some(whole) => write!(
                    f,
                    "the window {written:?} has a fraction: windows are whole units, \
                     write {whole}"
                ),
                None => write!(
                    f,
                    "the window {written:?} has a fraction: windows are whole units \
                     (ns, us, ms, s, m, h, d)"
                ),
            },
            RuleProblem::Unit(unit) => write!(
                f,
                "unknown unit {unit:?} (the units are ns, us, ms, s, m, h, d and ticks)"
            ),
            RuleProblem::NoUnit(window) => write!(
                f,
                "the window {window:?} needs a unit, such as 1s, 500ms or 2m (the units \
                 are ns, us, ms, s, m, h, d and ticks)"
            ),
            RuleProblem::WindowTooLong {
                window,
                longest_days,
            } => write!(
                f,
                "the window {window:?} is too long: this policy keeps at most \
                 {longest_days}d (about {} years)",
                longest_days * 4 / 1461
            ),
            RuleProblem::Comma => f.write_str(
                "a rule ends at its window's unit; several rules are a rule set, joined by \
                 commas (RuleSet, or --rules)",
            ),
            RuleProblem::Config(error) => write!(f, "{error}"),
            RuleProblem::NoRule => f.write_str(
                "expected POLICY:LIMIT/WINDOW, e.g. gcra:100/1s (no rule here; several \
                 rules are joined by commas)",
            ),
            RuleProblem::TooManyRules { count } => {
                write!(f, "{count} rules: a limiter applies at most {MAX_RULES}")
            }
        }
    }
}

impl std::error::Error for RuleError {}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let fail = |at: usize, problem| RuleError {
            text: text.to_owned(),
            at,
            problem,
        };
        let (policy, rest) = text
            .split_once(':')
            .ok_or_else(|| fail(0, RuleProblem::MissingColon))?;
        let policy: PolicyKind = policy
            .trim()
            .parse()
            .map_err(|unknown| fail(0, RuleProblem::Policy(unknown)))?;
        let limit_at = policy.name().len() + 1;
        if !policy.has_window() {
            // `in-flight:L`: a limit and no window.
            if let Some(slash) = rest.find('/') {
                return Err(fail(limit_at + slash, RuleProblem::WindowOnInFlight));
            }
            if let Some(comma) = rest.find(',') {
                return Err(fail(limit_at + comma, RuleProblem::Comma));
            }
            let limit = parse_number(rest.trim())
                .ok_or_else(|| fail(limit_at, RuleProblem::Limit(rest.to_owned())))?;
            return Config::in_flight(limit)
                .and_then(|config| Rule::new(policy, config))
                .map_err(|error| fail(limit_at, RuleProblem::Config(error)));
        }
        let (limit, window) = rest
            .split_once('/')
            .ok_or_else(|| fail(limit_at, RuleProblem::MissingSlash))?;
        let limit = parse_number(limit.trim())
            .ok_or_else(|| fail(limit_at, RuleProblem::Limit(limit.to_owned())))?;
        let window_at = text.len() - window.len();
        let window = window.trim();
        let digits = window.len()
            - window
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .len();
        let (count, unit) = window.split_at(digits);
        if count.is_empty() && !window.starts_with(char::is_alphabetic) {
            // `-1s`, `+1s`, `.5s`: not a whole number (a bare unit, `/s`,
            // is one of it).
            return Err(fail(window_at, RuleProblem::Count(window.into())));
        }
        let count = if count.is_empty() {
            1
        } else {
            parse_number(count).ok_or_else(|| fail(window_at, RuleProblem::Count(count.into())))?
        };
        let unit_at = window_at + digits;
        let unit = unit.trim();
        if let Some(comma) = unit.find(',') {
            return Err(fail(unit_at + comma, RuleProblem::Comma));
        }
        if unit.is_empty() {
            return Err(fail(unit_at, RuleProblem::NoUnit(window.into())));
        }
        if let Some(fraction) = unit.strip_prefix('.') {
            return Err(fail(window_at, fractional(window, digits, fraction)));
        }
        let config = if unit == "ticks" || unit == "tick" {
            Config::per_ticks(limit, count)
        } else {
            let nanos_per = unit_nanos(unit)
                .ok_or_else(|| fail(unit_at, RuleProblem::Unit(unit.to_owned())))?;
            let span = u64::try_from(u128::from(count) * u128::from(nanos_per))
                .map_err(|_| fail(window_at, too_long(window, u64::MAX)))?;
            Config::per(limit, Duration::from_nanos(span))
        };
        let in_ticks = unit == "ticks" || unit == "tick";
        config
            .and_then(|config| Rule::new(policy, config))
            .map_err(|error| match error {
                // Said in the units written, not in nanoseconds.
                ConfigError::WindowTooLong { max, .. } if !in_ticks => {
                    fail(window_at, too_long(window, max))
                }
                error => fail(limit_at, RuleProblem::Config(error)),
            })
    }
}

/// The problem with a window longer than `max_nanos`, as written.
fn too_long(window: &str, max_nanos: u64) -> RuleProblem {
    RuleProblem::WindowTooLong {
        window: window.to_owned(),
        longest_days: max_nanos / 86_400_000_000_000,
    }
}

/// The problem with a window written with a fraction (`1.5s`, whose count
/// is `window[..digits]` and whose text after the point is `fraction`):
/// the same window in whole units, when it is a whole number of
/// nanoseconds.
fn fractional(window: &str, digits: usize, fraction: &str) -> RuleProblem {
    let written = window.to_owned();
    let places = fraction.len()
        - fraction
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .len();
    let (decimals, unit) = fraction.split_at(places);
    let whole = (|| {
        let count = parse_number(&window[..digits]).unwrap_or(0);
        let decimals_value = parse_number(decimals)?;
        let scale = 10u128.checked_pow(u32::try_from(places).ok()?)?;
        let nanos_per = u128::from(unit_nanos(unit.trim())?);
        let scaled = (u128::from(count) * scale + u128::from(decimals_value)) * nanos_per;
        if scaled % scale != 0 {
            return None;
        }
        let nanos = u64::try_from(scaled / scale).ok()?;
        Some(Spelled(Duration::from_nanos(nanos)).to_string())
    })();
    RuleProblem::Fraction { written, whole }
}

/// A duration in the rules' units, for messages (`write_duration`).
struct Spelled(Duration);

impl fmt::Display for Spelled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_duration(f, self.0)
    }
}

/// ASCII digits only (no sign, no spaces), as a `u64`.
fn parse_number(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Nanoseconds per unit.
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

/// Writes `span` as a whole number of the largest unit that holds it
/// exactly: `1s`, `90m`, `1500us`.
pub(crate) fn write_duration(f: &mut fmt::Formatter<'_>, span: Duration) -> fmt::Result {
    const UNITS: [(&str, u128); 7] = [
        ("d", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ];
    let nanos = span.as_nanos();
    let (unit, per) = UNITS
        .into_iter()
        .find(|&(_, per)| nanos.is_multiple_of(per) && nanos > 0)
        .unwrap_or(("ns", 1));
    write!(f, "{}{unit}", nanos / per)
}

/// The most rules one limiter applies to every client: enough for any
/// ladder of limits (a second, a minute, an hour, a day, a month…), and
/// few enough that a decision's per-rule answers fit on the stack.
pub const MAX_RULES: usize = 8;

/// Several rules applied to every client at once (the contract's "Several
/// limits on one client"), for instance a burst limit and a daily quota:
/// a request is admitted only if every rule admits it, and then every rule
/// counts it; a request any rule refuses counts in none. One rule is the
/// case of one.
///
/// Its text is the rules joined by commas, spaces after a comma allowed;
/// printing gives each rule's own text back, joined by `,`. With the cargo
/// feature `serde`, a `RuleSet` is serialized as that text.
///
/// ```
/// use floodgate::{PolicyKind, RuleSet};
///
/// let rules: RuleSet = "gcra:10/1s, fixed-window:10000/1d".parse()?;
/// assert_eq!(rules.len(), 2);
/// assert_eq!(rules[1].policy(), PolicyKind::FixedWindow);
/// assert_eq!(rules.to_string(), "gcra:10/1s,fixed-window:10000/1d");
///
/// // An error names the rule that is wrong, and where in it.
/// let error = "gcra:10/1s,fixed-window:10000/1dd".parse::<RuleSet>().unwrap_err();
/// assert_eq!(
///     error.to_string(),
///     "invalid rule \"fixed-window:10000/1dd\" at byte 20: unknown unit \"dd\" \
///      (the units are ns, us, ms, s, m, h, d and ticks)"
/// );
/// # Ok::<(), floodgate::RuleError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RuleSet {
    rules: Vec<Rule>,
}

impl RuleSet {
    /// The rules, in order.
    ///
    /// # Errors
    ///
    /// [`ConfigError::RuleCount`] for none, or for more than [`MAX_RULES`].
    pub fn new(rules: impl IntoIterator<Item = Rule>) -> Result<Self, ConfigError> {
        let rules: Vec<Rule> = rules.into_iter().collect();
        if rules.is_empty() || rules.len() > MAX_RULES {
            return Err(ConfigError::RuleCount { count: rules.len() });
        }
        Ok(Self { rules })
    }

    /// The rules, in order: a decision's
    /// [`refused_by`](crate::Decision::refused_by) indexes them.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rules in ticks of `tick` (see [`Config::resolve`]).
    ///
    /// # Errors
    ///
    /// What [`Config::resolve`] refuses, for the first rule it refuses.
    pub fn in_ticks_of(&self, tick: Tick) -> Result<Self, ConfigError> {
        Ok(Self {
            rules: self
                .rules
                .iter()
                .map(|rule| rule.in_ticks_of(tick))
                .collect::<Result<_, _>>()?,
        })
    }

    /// The rule with the smallest limit (the first of them): what
    /// [`RateLimiter::policy`](crate::RateLimiter::policy) and
    /// [`config`](crate::RateLimiter::config) answer for several rules,
    /// since no request of a larger cost is ever admitted.
    pub fn strictest(&self) -> Rule {
        let mut strictest = self.rules[0];
        for rule in &self.rules[1..] {
            if rule.config.limit() < strictest.config.limit() {
                strictest = *rule;
            }
        }
        strictest
    }
}

impl std::ops::Deref for RuleSet {
    type Target = [Rule];

    fn deref(&self) -> &[Rule] {
        &self.rules
    }
}

impl From<Rule> for RuleSet {
    fn from(rule: Rule) -> Self {
        Self { rules: vec![rule] }
    }
}

impl<'a> IntoIterator for &'a RuleSet {
    type Item = &'a Rule;
    type IntoIter = std::slice::Iter<'a, Rule>;

    fn into_iter(self) -> Self::IntoIter {
        self.rules.iter()
    }
}

impl fmt::Display for RuleSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, rule) in self.rules.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{rule}")?;
        }
        Ok(())
    }
}

impl FromStr for RuleSet {
    type Err = RuleError;

    /// The rules joined by commas. An error's `text` is the rule that is
    /// wrong and its `at` a byte offset in it, so that the message names
    /// that rule; for too many rules, the whole text.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut rules = Vec::new();
        let mut at = 0;
        for part in text.split(',') {
            let start = at;
            at += part.len() + 1;
            let part = part.trim();
            if part.is_empty() {
                return Err(RuleError {
                    text: text.to_owned(),
                    at: start,
                    problem: RuleProblem::NoRule,
                });
            }
            rules.push(part.parse::<Rule>()?);
        }
        if rules.len() > MAX_RULES {
            return Err(RuleError {
                text: text.to_owned(),
                at: 0,
                problem: RuleProblem::TooManyRules { count: rules.len() },
            });
        }
        Ok(Self { rules })
    }
}

#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl serde::Serialize for RuleSet {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<'de> serde::Deserialize<'de> for RuleSet {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl serde::Serialize for Rule {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<'de> serde::Deserialize<'de> for Rule {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_round_trip_through_text() {
        for text in [
            "gcra:100/1s",
            "sliding-window:1000/1h",
            "fixed-window:5/500ms",
            "token-bucket:3/1d",
            "leaky-bucket:10/1500us",
            "sliding-window-counter:7/1000ticks",
        ] {
            let rule: Rule = text.parse().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(rule.to_string(), text);
        }
        assert_eq!(
            "gcra:100/s".parse::<Rule>().unwrap().to_string(),
            "gcra:100/1s"
        );
        assert_eq!(
            " gcra : 100 / 60 s ".parse::<Rule>().unwrap().to_string(),
            "gcra:100/1m"
        );
    }

    #[test]
    fn errors_say_what_and_where() {
        let problem = |text: &str| {
            let error = text.parse::<Rule>().unwrap_err();
            (error.at, error.problem)
        };
        assert_eq!(problem("gcra100/1s"), (0, RuleProblem::MissingColon));
        assert_eq!(problem("gcra:100"), (5, RuleProblem::MissingSlash));
        assert!(matches!(problem("gcr:1/1s"), (0, RuleProblem::Policy(_))));
        assert_eq!(problem("gcra:-1/1s"), (5, RuleProblem::Limit("-1".into())));
        assert_eq!(problem("gcra:1/1x"), (8, RuleProblem::Unit("x".into())));
        // A number with no unit, a sign, a comma after the rule, and a
        // window past 2^64 − 1 ns: each said as written, where it is.
        assert_eq!(problem("gcra:5/1"), (8, RuleProblem::NoUnit("1".into())));
        assert_eq!(problem("gcra:5/-1s"), (7, RuleProblem::Count("-1s".into())));
        assert_eq!(problem("gcra:5/1s,"), (9, RuleProblem::Comma));
        let too_long = |window: &str, longest_days| RuleProblem::WindowTooLong {
            window: window.into(),
            longest_days,
        };
        assert_eq!(
            problem("fixed-window:5/1000000d"),
            (15, too_long("1000000d", 213_503))
        );
        // The policies that drip keep 2^62 ns.
        assert_eq!(problem("gcra:5/53376d"), (7, too_long("53376d", 53_375)));
        // The longest windows that fit are taken, and a bare unit is one.
        assert!("fixed-window:5/213503d".parse::<Rule>().is_ok());
        assert!("gcra:5/53375d".parse::<Rule>().is_ok());
        assert!("gcra:5/s".parse::<Rule>().is_ok());
        let said = |text: &str| text.parse::<Rule>().unwrap_err().to_string();
        assert!(
            said("gcra:5/1").contains("needs a unit"),
            "{}",
            said("gcra:5/1")
        );
        assert!(
            said("gcra:5/1000000d").contains(
                "\"1000000d\" is too long: this policy keeps at most 213503d (about 584 years)"
            ),
            "{}",
            said("gcra:5/1000000d")
        );
        assert!(said("gcra:5/1s,").contains("joined by commas"));
        assert_eq!(
            problem("gcra:0/1s"),
            (
                5,
                RuleProblem::Config(ConfigError::LimitOutOfRange { limit: 0 })
            )
        );
        // 3 per 2 ns cannot drip one per whole nanosecond within 0.1 %.
        assert!(matches!(
            problem("gcra:3/4ns"),
            (
                5,
                RuleProblem::Config(ConfigError::RateDoesNotFitTick { .. })
            )
        ));
    }
}

#[cfg(test)]
mod rule_set_tests {
    use super::*;

    #[test]
    fn several_rules_round_trip_and_errors_name_the_bad_one() {
        let rules: RuleSet = "gcra:10/1s,  sliding-window:5/1m,fixed-window:100/1d"
            .parse()
            .unwrap();
        assert_eq!(rules.len(), 3);
        assert_eq!(
            rules.to_string(),
            "gcra:10/1s,sliding-window:5/1m,fixed-window:100/1d"
        );
        assert_eq!(rules.strictest().policy(), PolicyKind::SlidingWindow);
        let one: RuleSet = "gcra:10/1s".parse().unwrap();
        assert_eq!(one, RuleSet::from("gcra:10/1s".parse::<Rule>().unwrap()));
        let error = "gcra:10/1s,gcra:0/1s".parse::<RuleSet>().unwrap_err();
        assert_eq!((error.text.as_str(), error.at), ("gcra:0/1s", 5));
        let empty = "gcra:10/1s,,gcra:1/1s".parse::<RuleSet>().unwrap_err();
        assert_eq!((empty.at, empty.problem), (11, RuleProblem::NoRule));
        // A trailing comma: nothing after it, said where it is.
        let trailing = "gcra:5/1s,".parse::<RuleSet>().unwrap_err();
        assert_eq!((trailing.at, trailing.problem), (10, RuleProblem::NoRule));
        assert_eq!(
            "".parse::<RuleSet>().unwrap_err().problem,
            RuleProblem::NoRule
        );
        let nine = ["gcra:1/1s"; 9].join(",");
        assert_eq!(
            nine.parse::<RuleSet>().unwrap_err().problem,
            RuleProblem::TooManyRules { count: 9 }
        );
        assert_eq!(
            RuleSet::new([]).unwrap_err(),
            ConfigError::RuleCount { count: 0 }
        );
    }
}

#[cfg(all(test, feature = "serde"))]
mod serde_tests {
    use super::*;

    #[test]
    fn several_rules_are_their_text_in_a_config_file() {
        let tiers: Vec<RuleSet> =
            serde_json::from_str(r#"["gcra:10/1s, fixed-window:10000/1d", "gcra:5/1s"]"#).unwrap();
        assert_eq!(tiers[0].len(), 2);
        assert_eq!(
            serde_json::to_string(&tiers).unwrap(),
            r#"["gcra:10/1s,fixed-window:10000/1d","gcra:5/1s"]"#
        );
        let error = serde_json::from_str::<RuleSet>(r#""gcra:1/1s,gcra:1""#).unwrap_err();
        assert!(error.to_string().contains("\"gcra:1\""), "{error}");
    }

    #[test]
    fn a_rule_is_its_text_in_a_config_file() {
        let rules: Vec<Rule> =
            serde_json::from_str(r#"["gcra:100/1s", "sliding-window:1000/1h"]"#).unwrap();
        assert_eq!(rules[1].policy(), PolicyKind::SlidingWindow);
        assert_eq!(
            serde_json::to_string(&rules).unwrap(),
            r#"["gcra:100/1s","sliding-window:1000/1h"]"#
        );
        let error = serde_json::from_str::<Rule>(r#""gcra:100""#).unwrap_err();
        assert!(error.to_string().contains("no `/`"), "{error}");
    }
}
