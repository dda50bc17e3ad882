//! The service's configuration: envoyproxy/ratelimit's YAML files, one
//! domain each, read as that server reads them (its
//! `src/config/config_impl.go`), with this crate's rules as an extension.
//!
//! # The rules taken from envoyproxy/ratelimit
//!
//! - A file is one YAML document: `domain: NAME` and `descriptors:`, a list.
//!   A descriptor has `key` (required, not empty), `value` (optional),
//!   `rate_limit`, `shadow_mode`, `detailed_metric` and nested
//!   `descriptors`. A field given as null (`value:`, `~`) is a field not
//!   given, and a string field takes any scalar's text (`value: 123` is
//!   `"123"`), as Go's yaml.v2 reads them; booleans are yaml.v2's (`true`,
//!   `yes`, `on`, `y` and their capitalised forms, and the false ones).
//! - A descriptor's place in its level is its key, or `KEY_VALUE` with a
//!   value (the reference's composite key, quirks included: `a` = `b_c` and
//!   `a_b` = `c` are the same place); two descriptors in one place are an
//!   error. A limit's id, the reference's stats key, is the domain and the
//!   composite keys from the top, joined by dots:
//!   `messaging.message_type_marketing.to_number`.
//! - A `*` in a value is a wildcard matching any run of characters,
//!   anywhere in it and as many times as written (`value*`, `/api/*/action`);
//!   the reference matches the pattern against the composite `KEY_VALUE`.
//! - `rate_limit`: `unit` (case-insensitive) and `requests_per_unit`, or
//!   `unlimited: true` with no unit; `name`, and `replaces: [{name: X}]`,
//!   whose names are not empty and not the limit's own name. The units are
//!   the reference's protocol's: second, minute, hour, day, and also week
//!   (7 days), month (30 days) and year (365 days), which the reference
//!   accepts too. `requests_per_unit: 0` refuses every request, as the
//!   reference's README blocks an address with it.
//! - `shadow_mode` and `detailed_metric` belong to the descriptor's limit;
//!   on a descriptor with no `rate_limit` they do nothing, as there.
//! - Two files giving one domain are an error.
//! - How a request's descriptors find their limits (most specific first,
//!   wildcards in the order written, the level of the last entry, a
//!   descriptor with no limit letting through): see [`super::matching`].
//! - `--config DIR` reads the directory's files and those of its
//!   subdirectories, as the reference's runtime loader walks its tree.
//!
//! # Where this reads more strictly
//!
//! The reference accepts these and answers from them in ways nobody
//! wants; here they are errors naming the file and line: an unknown key
//! (the reference checks keys against one list for every level, so `unit`
//! in a descriptor passes there), the same key twice in a mapping, a
//! second YAML document, `unlimited: true` with a unit (even an unknown
//! one) or a count, a unit without `requests_per_unit` (the reference
//! reads 0, refusing everything), `requests_per_unit` without a unit, and
//! a `replaces` naming no limit of its domain. The reference's keys
//! `quota_mode`, `value_to_metric`, `share_threshold` and `metadata` are
//! refused as not supported rather than silently ignored. In a directory
//! only `*.yaml` and `*.yml` files count, hidden ones (a leading `.`,
//! editors' swap files) left out, read in the order of their paths
//! (the reference reads every file, in no set order). Numbers are
//! decimal, without a leading zero (yaml.v2 reads `010` as octal 8).
//! A file whose aliases expand past a million nodes, or whose lists and
//! mappings nest past 256 levels, is refused where it passes the bound.
//!
//! # This crate's extension
//!
//! A `rate_limit` may give `rules: ["gcra:10/1s", "fixed-window:10000/1d"]`
//! (or one string, the rules joined by commas) instead of `unit` and
//! `requests_per_unit`: any of the library's policies, several at once
//! (a request is admitted when every rule admits it), `in-flight:N`
//! included with `hold: DURATION`, how long each admitted unit is held
//! (the service refuses it without: [`super::decide`]); a
//! window in ticks is refused, as on the command line, since
//! its length would depend on the clock. A unit and its count become the
//! rule `fixed-window:N/1s` (`1m`, `1h`, `1d`, `7d`, `30d`, `365d`), so
//! that every limit is a [`RuleSet`].
//!
//! One difference remains in those windows: the reference's are aligned
//! on the Unix epoch (a minute's window is `[now − now mod 60, …)` in UTC
//! seconds, shared by every client), while this crate's `fixed-window`
//! starts each client's grid at its first request (SPEC.md), so that
//! clients do not all reset at once. The counts per window agree; the
//! window edges do not.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use floodgate::{PolicyKind, Rule, RuleSet};

use super::error::{ConfigError, Problem};
use super::matching::Level;
use super::yaml::{self, Node, Position, YamlError};

/// Every domain of the files read.
#[derive(Debug, Clone, Default)]
pub struct Config {
    domains: HashMap<String, Domain>,
}

/// One file's domain: its descriptors and their limits.
#[derive(Debug, Clone)]
pub struct Domain {
    pub(super) name: String,
    pub(super) origin: Origin,
    pub(super) root: Level,
}

/// Where something was written: the file, line and column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The file.
    pub file: Arc<Path>,
    /// The place in it.
    pub at: Position,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}",
            self.file.display(),
            self.at.line,
            self.at.column
        )
    }
}

/// A descriptor's limit.
#[derive(Debug, Clone)]
pub struct Limit {
    /// The id, the reference's stats key: the domain and the composite
    /// keys (`KEY` or `KEY_VALUE`) from the top, joined by dots
    /// (`messaging.message_type_marketing.to_number`). Unique in its
    /// configuration; a client's state is keyed by it with the request's
    /// values, and metrics are named by it.
    pub id: String,
    /// What it allows.
    pub quota: Quota,
    /// `name`, which other limits' `replaces` name.
    pub name: Option<String>,
    /// The names of the limits this one replaces in a request.
    pub replaces: Vec<String>,
    /// `shadow_mode: true`: decided and counted, but never refused.
    pub shadow_mode: bool,
    /// `detailed_metric: true`: metrics named by the request's values
    /// (see [`Limit::stats_key`]), at most
    /// [`DETAILED_VALUES`](super::metrics::DETAILED_VALUES) of them.
    pub detailed_metric: bool,
    /// `hold: DURATION` (this crate's): how long each unit an `in-flight`
    /// rule admits is held before it is released, since a rate-limit call
    /// never says when its request ends. Only on a limit with such a rule.
    pub hold: Option<Duration>,
    /// The descriptor that gave it.
    pub origin: Origin,
}

/// What a limit allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Quota {
    /// The reference's `unit` and `requests_per_unit`, with the rule that
    /// gives their answers, `fixed-window:N/1UNIT`; none for 0, which
    /// refuses every request.
    PerUnit {
        /// The unit.
        unit: Unit,
        /// Requests per unit.
        requests_per_unit: u32,
        /// `fixed-window:requests_per_unit/1unit`, or none for 0.
        rules: Option<RuleSet>,
    },
    /// This crate's rules (`rules:`).
    Rules(RuleSet),
    /// `unlimited: true`: never limited, never counted.
    Unlimited,
}

/// The reference's units (its protocol's `RateLimit.Unit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3,600 seconds.
    Hour,
    /// 86,400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days, as the reference counts a month.
    Month,
    /// 365 days, as the reference counts a year.
    Year,
}

impl Unit {
    /// The unit's name in the protocol (`SECOND`), which the files give in
    /// any case.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }

    /// Its length.
    pub fn duration(self) -> Duration {
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        })
    }

    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    fn parse(text: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|unit| unit.name().eq_ignore_ascii_case(text))
    }
}

impl Limit {
    /// The rules to apply, or none: for `unlimited`, and for
    /// `requests_per_unit: 0`, which refuses everything.
    pub fn rules(&self) -> Option<&RuleSet> {
        match &self.quota {
            Quota::PerUnit { rules, .. } => rules.as_ref(),
            Quota::Rules(rules) => Some(rules),
            Quota::Unlimited => None,
        }
    }

    /// Whether the limit never limits.
    pub fn is_unlimited(&self) -> bool {
        self.quota == Quota::Unlimited
    }

    /// Whether the limit refuses every request (`requests_per_unit: 0`).
    pub fn refuses_all(&self) -> bool {
        matches!(
            self.quota,
            Quota::PerUnit {
                requests_per_unit: 0,
                ..
            }
        )
    }

    /// The name of the metrics of a request's descriptor (its entries)
    /// that matched this limit: the id, or with `detailed_metric` the
    /// domain and the request's own `KEY_VALUE`s, as the reference names
    /// them.
    pub fn stats_key<K: AsRef<str>, V: AsRef<str>>(
        &self,
        domain: &str,
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> String {
        if !self.detailed_metric {
            return self.id.clone();
        }
        let mut key = domain.to_owned();
        for (k, v) in entries {
            key.push('.');
            key.push_str(k.as_ref());
            key.push('_');
            key.push_str(v.as_ref());
        }
        key
    }
}

impl Config {
    /// Reads `--config`: one file, or every `*.yaml` and `*.yml` file of a
    /// directory and its subdirectories (hidden ones left out), in the
    /// order of their paths.
    ///
    /// # Errors
    ///
    /// The first problem found, with its file and line.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let texts = Self::read(path)?;
        Self::from_texts(
            texts
                .iter()
                .map(|(file, text)| (file.as_path(), text.as_str())),
        )
    }

    /// The files [`load`](Self::load) reads, each with its text, in order:
    /// what a reload compares with the last it read before parsing again.
    ///
    /// # Errors
    ///
    /// A file or directory that cannot be read, or a directory without
    /// YAML files.
    pub fn read(path: impl AsRef<Path>) -> Result<Vec<(PathBuf, String)>, ConfigError> {
        let path = path.as_ref();
        let read_error = |file: &Path, error: std::io::Error| ConfigError {
            file: file.to_owned(),
            at: None,
            problem: Problem::Read(error.to_string()),
        };
        let metadata = fs::metadata(path).map_err(|e| read_error(path, e))?;
        let files = if metadata.is_dir() {
            let mut files = Vec::new();
            yaml_files(path, &mut files).map_err(|(file, e)| read_error(&file, e))?;
            if files.is_empty() {
                return Err(ConfigError {
                    file: path.to_owned(),
                    at: None,
                    problem: Problem::NoFiles,
                });
            }
            files
        } else {
            vec![path.to_owned()]
        };
        let mut texts = Vec::with_capacity(files.len());
        for file in files {
            let text = fs::read_to_string(&file).map_err(|e| read_error(&file, e))?;
            texts.push((file, text));
        }
        Ok(texts)
    }

    /// The domains of files already read: each file's name (for errors
    /// and origins) and text, in order; a domain given twice is refused at
    /// its second file.
    ///
    /// # Errors
    ///
    /// The first problem found, with its file and line.
    pub fn from_texts<'a>(
        files: impl IntoIterator<Item = (&'a Path, &'a str)>,
    ) -> Result<Self, ConfigError> {
        let mut domains: HashMap<String, Domain> = HashMap::new();
        for (file, text) in files {
            let domain = read_file(file, text)?;
            if let Some(first) = domains.get(&domain.name) {
                return Err(ConfigError {
                    file: file.to_owned(),
                    at: Some(domain.origin.at),
                    problem: Problem::DuplicateDomain {
                        domain: domain.name,
                        first_file: first.origin.file.to_path_buf(),
                        first_line: first.origin.at.line,
                    },
                });
            }
            domains.insert(domain.name.clone(), domain);
        }
        Ok(Self { domains })
    }

    /// A domain by name.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Every domain, in no set order.
    pub fn domains(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }
}

impl Domain {
    /// The domain's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where its `domain:` was written.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// Every limit of the domain, depth first in the order written.
    pub fn limits(&self) -> Vec<&Limit> {
        let mut limits = Vec::new();
        self.root.collect_limits(&mut limits);
        limits
    }
}

/// The `*.yaml` and `*.yml` files under `dir`, hidden ones left out,
/// sorted by path (a directory's files before and beside its
/// subdirectories', by name).
fn yaml_files(dir: &Path, files: &mut Vec<PathBuf>) -> Result<(), (PathBuf, std::io::Error)> {
    let entries = fs::read_dir(dir).map_err(|e| (dir.to_owned(), e))?;
    let mut paths = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| (dir.to_owned(), e))?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        paths.push(entry.path());
    }
    paths.sort();
    for path in paths {
        if path.is_dir() {
            yaml_files(&path, files)?;
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
        {
            files.push(path);
        }
    }
    Ok(())
}

/// The keys of each place, and the reference's keys this does not read.
const ROOT_KEYS: &str = "domain, descriptors";
const DESCRIPTOR_KEYS: &str = "key, value, rate_limit, descriptors, shadow_mode, detailed_metric";
const RATE_LIMIT_KEYS: &str = "unit, requests_per_unit, unlimited, name, replaces, rules, hold";
const REPLACES_KEYS: &str = "name";
const UNSUPPORTED: [&str; 4] = [
    "quota_mode",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// One file's domain.
fn read_file(file: &Path, text: &str) -> Result<Domain, ConfigError> {
    let reader = Reader {
        file: Arc::from(file),
        replaces: RefCell::new(Vec::new()),
    };
    let root = yaml::parse(text).map_err(|error| match error {
        YamlError::Syntax(message, at) => reader.error(at, Problem::Syntax(message)),
        YamlError::SeveralDocuments(at) => reader.error(at, Problem::SeveralDocuments),
        YamlError::TooLarge(at) => reader.error(at, Problem::TooLarge),
        YamlError::TooDeep(at) => reader.error(at, Problem::TooDeep),
    })?;
    let Some(root) = root else {
        return Err(reader.error(Position { line: 1, column: 1 }, Problem::NoDomain));
    };
    let fields = reader.fields(&root, "the file", "a mapping", "the file", ROOT_KEYS)?;
    let Some(name_node) = fields.get("domain") else {
        return Err(reader.error(root.at(), Problem::NoDomain));
    };
    let name = reader.string(name_node, "domain")?;
    if name.is_empty() {
        return Err(reader.error(name_node.at(), Problem::NoDomain));
    }
    let origin = reader.origin(name_node.at());
    let mut level = Level::default();
    if let Some(list) = fields.get("descriptors") {
        reader.descriptors(list, &format!("{name}."), &mut level)?;
    }
    let domain = Domain {
        name,
        origin,
        root: level,
    };
    reader.check_replaces(&domain)?;
    Ok(domain)
}

/// A mapping's pairs by key, checked.
struct Fields<'a> {
    pairs: Vec<(&'a str, &'a Node)>,
}

impl<'a> Fields<'a> {
    /// The value of `key`, unless absent or null.
    fn get(&self, key: &str) -> Option<&'a Node> {
        self.pairs
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, node)| *node)
            .filter(|node| !node.is_null())
    }
}

/// Reads one file's nodes, naming the file in its errors.
struct Reader {
    file: Arc<Path>,
    /// Every `replaces` name read, and where, to check once the domain's
    /// names are all known.
    replaces: RefCell<Vec<(String, Position)>>,
}

impl Reader {
    fn error(&self, at: Position, problem: Problem) -> ConfigError {
        ConfigError {
            file: self.file.to_path_buf(),
            at: Some(at),
            problem,
        }
    }

    fn origin(&self, at: Position) -> Origin {
        Origin {
            file: Arc::clone(&self.file),
            at,
        }
    }

    fn expected(&self, node: &Node, field: &str, expected: &'static str) -> ConfigError {
        self.error(
            node.at(),
            Problem::Expected {
                field: field.to_owned(),
                expected,
                found: node.kind(),
            },
        )
    }

    /// A mapping's pairs, each key one of `known` (a comma-separated list)
    /// and given once.
    fn fields<'a>(
        &self,
        node: &'a Node,
        field: &str,
        expected: &'static str,
        place: &'static str,
        known: &'static str,
    ) -> Result<Fields<'a>, ConfigError> {
        let Node::Map { pairs, .. } = node else {
            return Err(self.expected(node, field, expected));
        };
        let mut fields = Fields { pairs: Vec::new() };
        for (key, value) in pairs {
            let Node::Scalar { text, at, .. } = key else {
                return Err(self.expected(key, "a key", "text"));
            };
            if let Some(first) = pairs
                .iter()
                .map(|(k, _)| k)
                .take_while(|k| !std::ptr::eq(*k, key))
                .find(|k| matches!(k, Node::Scalar { text: t, .. } if t == text))
            {
                return Err(self.error(
                    *at,
                    Problem::DuplicateKey {
                        key: text.clone(),
                        first_line: first.at().line,
                    },
                ));
            }
            if !known.split(", ").any(|k| k == text) {
                let problem = if UNSUPPORTED.contains(&text.as_str()) {
                    Problem::Unsupported(text.clone())
                } else {
                    Problem::UnknownKey {
                        key: text.clone(),
                        place,
                        known,
                    }
                };
                return Err(self.error(*at, problem));
            }
            fields.pairs.push((text, value));
        }
        Ok(fields)
    }

    /// A string field: any scalar's text.
    fn string(&self, node: &Node, field: &str) -> Result<String, ConfigError> {
        match node {
            Node::Scalar { text, .. } if !node.is_null() => Ok(text.clone()),
            Node::Scalar { .. } => Ok(String::new()),
            _ => Err(self.expected(node, field, "text")),
        }
    }

    /// A boolean field, as yaml.v2 reads one; null is false.
    fn boolean(&self, node: Option<&Node>, field: &'static str) -> Result<bool, ConfigError> {
        let Some(node) = node else {
            return Ok(false);
        };
        match node {
            Node::Scalar {
                text, plain: true, ..
            } => match text.as_str() {
                "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "y"
                | "Y" => Ok(true),
                "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "n"
                | "N" => Ok(false),
                _ => Err(self.error(
                    node.at(),
                    Problem::NotABool {
                        field,
                        text: text.clone(),
                    },
                )),
            },
            Node::Scalar { text, .. } => Err(self.error(
                node.at(),
                Problem::NotABool {
                    field,
                    text: text.clone(),
                },
            )),
            _ => Err(self.expected(node, field, "true or false")),
        }
    }

    /// A whole number from 0 to 2^32 − 1, plain and decimal.
    fn count(&self, node: &Node, field: &'static str) -> Result<u32, ConfigError> {
        let Node::Scalar { text, plain, at } = node else {
            return Err(self.expected(node, field, "a whole number"));
        };
        let digits = text.strip_prefix('+').unwrap_or(text).replace('_', "");
        let well_formed = *plain
            && !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        match digits.parse::<u32>() {
            Ok(n) if well_formed => Ok(n),
            _ => Err(self.error(
                *at,
                Problem::NotANumber {
                    field,
                    text: text.clone(),
                },
            )),
        }
    }

    /// A list of descriptors into `level`, their ids under `parent`.
    fn descriptors(&self, node: &Node, parent: &str, level: &mut Level) -> Result<(), ConfigError> {
        let Node::List { items, .. } = node else {
            return Err(self.expected(node, "descriptors", "a list of descriptors"));
        };
        for item in items {
            let fields = self.fields(
                item,
                "a descriptor",
                "a mapping (key:, value:, rate_limit:, …)",
                "a descriptor",
                DESCRIPTOR_KEYS,
            )?;
            let key = match fields.get("key") {
                Some(node) => self.string(node, "key")?,
                None => String::new(),
            };
            if key.is_empty() {
                let at = fields.pairs.iter().find(|(k, _)| *k == "key");
                let at = at.map_or(item.at(), |(_, node)| node.at());
                return Err(self.error(at, Problem::NoKey));
            }
            let value = match fields.get("value") {
                Some(node) => self.string(node, "value")?,
                None => String::new(),
            };
            let composite = if value.is_empty() {
                key
            } else {
                format!("{key}_{value}")
            };
            let id = format!("{parent}{composite}");
            if let Some(first_line) = level.line_of(&composite) {
                return Err(self.error(item.at(), Problem::DuplicateDescriptor { id, first_line }));
            }
            let shadow_mode = self.boolean(fields.get("shadow_mode"), "shadow_mode")?;
            let detailed_metric = self.boolean(fields.get("detailed_metric"), "detailed_metric")?;
            let limit = match fields.get("rate_limit") {
                Some(node) => {
                    Some(self.rate_limit(node, &id, shadow_mode, detailed_metric, item)?)
                }
                None => None,
            };
            let mut children = Level::default();
            if let Some(list) = fields.get("descriptors") {
                self.descriptors(list, &format!("{id}."), &mut children)?;
            }
            level.insert(composite, item.at().line, limit, children);
        }
        Ok(())
    }

    /// A descriptor's `rate_limit`.
    fn rate_limit(
        &self,
        node: &Node,
        id: &str,
        shadow_mode: bool,
        detailed_metric: bool,
        descriptor: &Node,
    ) -> Result<Limit, ConfigError> {
        let fields = self.fields(
            node,
            "rate_limit",
            "a mapping (unit:, requests_per_unit:, …)",
            "a rate_limit",
            RATE_LIMIT_KEYS,
        )?;
        let unit = fields.get("unit");
        let count = fields.get("requests_per_unit");
        let rules = fields.get("rules");
        let unlimited = self.boolean(fields.get("unlimited"), "unlimited")?;
        let quota = if unlimited {
            let given = [
                (unit, "unit"),
                (count, "requests_per_unit"),
                (rules, "rules"),
            ];
            if let Some((Some(node), what)) = given.into_iter().find(|(n, _)| n.is_some()) {
                return Err(self.error(node.at(), Problem::UnlimitedWith(what)));
            }
            Quota::Unlimited
        } else if let Some(rules) = rules {
            if let Some(node) = unit.or(count) {
                return Err(self.error(node.at(), Problem::RulesWithUnit));
            }
            Quota::Rules(self.rules(rules)?)
        } else if let Some(unit_node) = unit {
            let text = self.string(unit_node, "unit")?;
            let unit = Unit::parse(&text)
                .ok_or_else(|| self.error(unit_node.at(), Problem::UnknownUnit(text)))?;
            let Some(count) = count else {
                return Err(self.error(unit_node.at(), Problem::NoRequestsPerUnit));
            };
            let requests_per_unit = self.count(count, "requests_per_unit")?;
            let rules = (requests_per_unit > 0).then(|| per_unit_rule(requests_per_unit, unit));
            Quota::PerUnit {
                unit,
                requests_per_unit,
                rules,
            }
        } else if let Some(count) = count {
            return Err(self.error(count.at(), Problem::NoUnit));
        } else {
            return Err(self.error(node.at(), Problem::EmptyRateLimit));
        };
        let hold = match fields.get("hold") {
            Some(node) => Some(self.hold(node, &quota)?),
            None => None,
        };
        let name = match fields.get("name") {
            Some(node) => Some(self.string(node, "name")?).filter(|n| !n.is_empty()),
            None => None,
        };
        let mut replaces = Vec::new();
        if let Some(list) = fields.get("replaces") {
            let Node::List { items, .. } = list else {
                return Err(self.expected(list, "replaces", "a list (- name: NAME)"));
            };
            for item in items {
                let entry = self.fields(
                    item,
                    "a replaces entry",
                    "a mapping (name:)",
                    "a replaces entry",
                    REPLACES_KEYS,
                )?;
                let replaced = match entry.get("name") {
                    Some(node) => self.string(node, "name")?,
                    None => String::new(),
                };
                let at = entry.get("name").map_or(item.at(), Node::at);
                if replaced.is_empty() {
                    return Err(self.error(at, Problem::EmptyReplaces));
                }
                if name.as_deref() == Some(replaced.as_str()) {
                    return Err(self.error(at, Problem::ReplacesItself(replaced)));
                }
                self.replaces.borrow_mut().push((replaced.clone(), at));
                replaces.push(replaced);
            }
        }
        Ok(Limit {
            id: id.to_owned(),
            quota,
            name,
            replaces,
            shadow_mode,
            detailed_metric,
            hold,
            origin: self.origin(descriptor.at()),
        })
    }

    /// `hold`: a duration longer than 0, on a limit with an `in-flight`
    /// rule.
    fn hold(&self, node: &Node, quota: &Quota) -> Result<Duration, ConfigError> {
        let text = self.string(node, "hold")?;
        let span = crate::args::parse_duration(&text)
            .map_err(|message| self.error(node.at(), Problem::Hold(message)))?;
        if span.nanos == 0 {
            return Err(self.error(
                node.at(),
                Problem::Hold("expected a duration longer than 0".into()),
            ));
        }
        let in_flight = matches!(quota, Quota::Rules(rules)
            if rules.rules().iter().any(|rule| rule.policy() == PolicyKind::InFlight));
        if !in_flight {
            return Err(self.error(node.at(), Problem::HoldWithoutInFlight));
        }
        Ok(span.duration())
    }

    /// `rules`: a list of rules, or one string of rules joined by commas.
    fn rules(&self, node: &Node) -> Result<RuleSet, ConfigError> {
        let items: Vec<&Node> = match node {
            Node::List { items, .. } => items.iter().collect(),
            Node::Scalar { .. } => vec![node],
            Node::Map { .. } => {
                return Err(self.expected(node, "rules", "a list of rules (\"gcra:10/1s\")"))
            }
        };
        if items.is_empty() {
            return Err(self.error(node.at(), Problem::NoRules));
        }
        let mut rules = Vec::new();
        for item in items {
            let Node::Scalar { text, plain, at } = item else {
                return Err(self.expected(item, "a rule", "text (\"gcra:10/1s\")"));
            };
            // A rule's error column: the scalar's start, past its quote,
            // plus the byte the parser names (rules are ASCII up to it).
            let start = at.column + u32::from(!plain);
            let mut offset = 0;
            for part in text.split(',') {
                let rule = self.rule(part, *at, start + offset)?;
                rules.push(rule);
                offset += u32::try_from(part.len() + 1).unwrap_or(u32::MAX);
            }
        }
        let count = rules.len();
        RuleSet::new(rules).map_err(|_| self.error(node.at(), Problem::TooManyRules(count)))
    }

    /// One rule, `part` of a scalar starting at `column` of `at`'s line.
    fn rule(&self, part: &str, at: Position, column: u32) -> Result<Rule, ConfigError> {
        let trimmed = part.trim();
        let lead = u32::try_from(part.len() - part.trim_start().len()).unwrap_or(0);
        let rule = trimmed.parse::<Rule>().map_err(|error| {
            let message = error.to_string();
            let prefix = format!("invalid rule {:?} at byte {}: ", error.text, error.at);
            let message = message
                .strip_prefix(&prefix)
                .map_or(message.clone(), str::to_owned);
            let byte = u32::try_from(error.at).unwrap_or(0);
            self.error(
                Position {
                    line: at.line,
                    column: column + lead + byte,
                },
                Problem::Rule {
                    rule: trimmed.to_owned(),
                    message,
                },
            )
        })?;
        // A window in ticks means a different window on each clock: the
        // command line refuses it too, with the same words.
        crate::args::parse_rule(trimmed).map_err(|message| {
            self.error(
                Position {
                    line: at.line,
                    column: column + lead,
                },
                Problem::Rule {
                    rule: trimmed.to_owned(),
                    message,
                },
            )
        })?;
        Ok(rule)
    }

    /// Every `replaces` names a limit of the domain.
    fn check_replaces(&self, domain: &Domain) -> Result<(), ConfigError> {
        let limits = domain.limits();
        for (replaced, at) in self.replaces.borrow().iter() {
            if !limits.iter().any(|l| l.name.as_ref() == Some(replaced)) {
                return Err(self.error(
                    *at,
                    Problem::ReplacesNothing {
                        name: replaced.clone(),
                        domain: domain.name.clone(),
                    },
                ));
            }
        }
        Ok(())
    }
}

/// `fixed-window:N/1UNIT`, the rule that counts as the reference does for
/// a unit (N ≥ 1, the fixed window's range).
fn per_unit_rule(requests_per_unit: u32, unit: Unit) -> RuleSet {
    let config = floodgate::Config::per(u64::from(requests_per_unit), unit.duration())
        .and_then(|config| Rule::new(PolicyKind::FixedWindow, config));
    // A fixed window takes any limit from 1 to 2^32 − 1 and any window of
    // a second or more, so every unit and count gives a rule.
    RuleSet::from(config.expect("a fixed window takes every unit and count"))
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
