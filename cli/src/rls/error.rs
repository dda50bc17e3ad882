//! What a configuration file can get wrong, said with its file and line.

use std::fmt;
use std::path::PathBuf;

use super::yaml::Position;

/// A configuration refused: the file, the place in it (none for a file
/// that could not be read) and what is wrong there. Its text is
/// `FILE:LINE:COLUMN: PROBLEM`, as compilers print theirs, so that editors
/// and terminals can jump to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, as given or as found in the directory given.
    pub file: PathBuf,
    /// Where in it, when the problem has a place.
    pub at: Option<Position>,
    /// What is wrong.
    pub problem: Problem,
}

/// What is wrong with a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The file or directory could not be read: the system's message.
    Read(String),
    /// A directory with no `*.yaml` or `*.yml` file in it.
    NoFiles,
    /// Not YAML: the parser's message.
    Syntax(String),
    /// More than one YAML document (`---`) in a file.
    SeveralDocuments,
    /// Aliases repeating their anchors past the bound on nodes.
    TooLarge,
    /// Collections nested past the bound on depth.
    TooDeep,
    /// A node of the wrong shape: where it is, what was expected, what
    /// was found.
    Expected {
        /// The field or place (`"descriptors"`, `"the file"`).
        field: String,
        /// What it takes ("a list of descriptors").
        expected: &'static str,
        /// What it has ("a scalar").
        found: &'static str,
    },
    /// A key no field has at this place.
    UnknownKey {
        /// The key.
        key: String,
        /// The place ("a descriptor").
        place: &'static str,
        /// The keys it takes.
        known: &'static str,
    },
    /// A key of envoyproxy/ratelimit's that this service does not read
    /// (yet): refused rather than ignored, since it would change answers
    /// or names.
    Unsupported(String),
    /// The same key twice in one mapping.
    DuplicateKey {
        /// The key.
        key: String,
        /// The line of its first use.
        first_line: u32,
    },
    /// No `domain`, or an empty one.
    NoDomain,
    /// A descriptor without a `key`, or with an empty one.
    NoKey,
    /// A `unit` that is none of the units.
    UnknownUnit(String),
    /// A `unit` without `requests_per_unit`.
    NoRequestsPerUnit,
    /// `requests_per_unit` without a `unit`.
    NoUnit,
    /// A `rate_limit` with neither a unit, rules nor `unlimited: true`.
    EmptyRateLimit,
    /// `unlimited: true` with a unit, a count or rules.
    UnlimitedWith(&'static str),
    /// `rules` with a `unit` or `requests_per_unit`.
    RulesWithUnit,
    /// A scalar that is not a whole number where one is needed, or one
    /// too large.
    NotANumber {
        /// The field.
        field: &'static str,
        /// The text.
        text: String,
    },
    /// A scalar that is not a boolean where one is needed.
    NotABool {
        /// The field.
        field: &'static str,
        /// The text.
        text: String,
    },
    /// A rule this crate's parser refuses: the rule and its message.
    Rule {
        /// The rule as written.
        rule: String,
        /// The parser's message.
        message: String,
    },
    /// `hold` that does not read as a duration longer than 0: why.
    Hold(String),
    /// `hold` on a limit with no `in-flight` rule, which holds nothing.
    HoldWithoutInFlight,
    /// `rules: []`.
    NoRules,
    /// More rules than a limiter applies ([`floodgate::MAX_RULES`]).
    TooManyRules(usize),
    /// Two descriptors with the same key and value at one level.
    DuplicateDescriptor {
        /// The limit's id they share (`domain.key_value`).
        id: String,
        /// The line of the first.
        first_line: u32,
    },
    /// A domain already given by another file.
    DuplicateDomain {
        /// The domain.
        domain: String,
        /// The file that gave it first.
        first_file: PathBuf,
        /// The line there.
        first_line: u32,
    },
    /// A `replaces` entry without a name.
    EmptyReplaces,
    /// A limit that replaces its own name.
    ReplacesItself(String),
    /// A `replaces` naming no limit of the domain.
    ReplacesNothing {
        /// The name.
        name: String,
        /// The domain.
        domain: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(at) = self.at {
            write!(f, ":{}:{}", at.line, at.column)?;
        }
        write!(f, ": {}", self.problem)
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Read(message) => write!(f, "cannot read: {message}"),
            Problem::NoFiles => f.write_str("no *.yaml or *.yml file in this directory"),
            Problem::Syntax(message) => write!(f, "not YAML: {message}"),
            Problem::SeveralDocuments => f.write_str(
                "a second YAML document (---): a file holds one domain, give each its own file",
            ),
            Problem::TooLarge => write!(
                f,
                "the aliases here take the file past {} nodes",
                super::yaml::MAX_NODES
            ),
            Problem::TooDeep => write!(
                f,
                "nested deeper than {} levels of lists and mappings",
                super::yaml::MAX_DEPTH
            ),
            Problem::Expected {
                field,
                expected,
                found,
            } => write!(f, "{field} takes {expected}, not {found}"),
            Problem::UnknownKey { key, place, known } => {
                write!(f, "unknown key {key:?} in {place} (its keys are {known})")
            }
            Problem::Unsupported(key) => write!(
                f,
                "{key:?} is a key of envoyproxy/ratelimit that floodgate rls does not support"
            ),
            Problem::DuplicateKey { key, first_line } => {
                write!(f, "{key:?} is given twice (first on line {first_line})")
            }
            Problem::NoDomain => f.write_str("no domain: a file starts with `domain: NAME`"),
            Problem::NoKey => f.write_str("a descriptor needs a key (`key: NAME`)"),
            Problem::UnknownUnit(unit) => write!(
                f,
                "unknown unit {unit:?} (second, minute, hour, day, week, month or year)"
            ),
            Problem::NoRequestsPerUnit => f.write_str(
                "a unit needs requests_per_unit, a whole number (0 refuses every request)",
            ),
            Problem::NoUnit => f.write_str(
                "requests_per_unit needs a unit (second, minute, hour, day, week, month or year)",
            ),
            Problem::EmptyRateLimit => f.write_str(
                "a rate_limit needs unit and requests_per_unit, rules, or unlimited: true",
            ),
            Problem::UnlimitedWith(what) => {
                write!(f, "unlimited: true takes no {what}: it never limits")
            }
            Problem::RulesWithUnit => f.write_str(
                "rules replace unit and requests_per_unit: give one or the other, not both",
            ),
            Problem::NotANumber { field, text } => write!(
                f,
                "{field} takes a whole number from 0 to 4294967295 (decimal, no leading \
                 zero), not {text:?}"
            ),
            Problem::NotABool { field, text } => {
                write!(f, "{field} takes true or false, not {text:?}")
            }
            Problem::Rule { rule, message } => write!(f, "invalid rule {rule:?}: {message}"),
            Problem::Hold(message) => write!(f, "hold: {message}"),
            Problem::HoldWithoutInFlight => f.write_str(
                "hold is how long an in-flight rule holds each admitted unit: this limit has \
                 no in-flight rule, so it would hold nothing",
            ),
            Problem::NoRules => {
                f.write_str("rules is empty: give at least one, e.g. rules: [\"gcra:10/1s\"]")
            }
            Problem::TooManyRules(count) => write!(
                f,
                "{count} rules: a limiter applies at most {}",
                floodgate::MAX_RULES
            ),
            Problem::DuplicateDescriptor { id, first_line } => write!(
                f,
                "the descriptor {id:?} is given twice at this level (first on line {first_line})"
            ),
            Problem::DuplicateDomain {
                domain,
                first_file,
                first_line,
            } => write!(
                f,
                "the domain {domain:?} is already given by {}:{first_line}",
                first_file.display()
            ),
            Problem::EmptyReplaces => f.write_str("a replaces entry needs a name (`- name: NAME`)"),
            Problem::ReplacesItself(name) => {
                write!(f, "the limit {name:?} replaces itself")
            }
            Problem::ReplacesNothing { name, domain } => {
                write!(
                    f,
                    "replaces {name:?}, but no limit of the domain {domain:?} has that name"
                )
            }
        }
    }
}

impl std::error::Error for ConfigError {}
