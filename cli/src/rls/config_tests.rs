//! The configuration's errors, each with its exact text, and loading
//! from files and directories.

use std::path::Path;

use super::*;

const FILE: &str = "limits/payments.yaml";

/// The text of the error `text` gets, read as `limits/payments.yaml`.
fn error(text: &str) -> String {
    Config::from_texts([(Path::new(FILE), text)])
        .expect_err("refused")
        .to_string()
}

/// A configuration of one descriptor `d` whose `rate_limit` is `body`,
/// which starts on line 5, column 7.
fn rate_limit(body: &str) -> String {
    error(&format!(
        "domain: payments\ndescriptors:\n  - key: d\n    rate_limit:\n{}",
        body.lines()
            .map(|line| format!("      {line}\n"))
            .collect::<String>()
    ))
}

#[test]
fn a_file_that_is_not_yaml_names_its_line() {
    assert_eq!(
        error("domain: payments\ndescriptors: [\n  - key: a\n"),
        "limits/payments.yaml:3:3: not YAML: \"-\" is only valid inside a block"
    );
    assert_eq!(
        error("domain: payments\n---\ndomain: other\n"),
        "limits/payments.yaml:2:1: a second YAML document (---): a file holds one domain, \
         give each its own file"
    );
}

#[test]
fn aliases_past_a_million_nodes_are_refused() {
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 1..9 {
        let list = vec![format!("*a{}", level - 1); 10].join(", ");
        bomb.push_str(&format!("a{level}: &a{level} [{list}]\n"));
    }
    assert_eq!(
        error(&bomb),
        "limits/payments.yaml:6:45: the aliases here take the file past 1000000 nodes"
    );
}

#[test]
fn nesting_past_256_levels_is_refused() {
    // 150 levels of descriptors, each a list and a mapping.
    let mut text = String::from("domain: deep\ndescriptors:\n");
    for level in 0..150 {
        let indent = "  ".repeat(2 * level);
        text.push_str(&format!(
            "{indent}  - key: k{level}\n{indent}    descriptors:\n"
        ));
    }
    assert_eq!(
        error(&text),
        "limits/payments.yaml:257:516: nested deeper than 256 levels of lists and mappings"
    );
}

#[test]
fn unknown_and_repeated_keys_are_refused_where_written() {
    assert_eq!(
        error("domain: payments\ndescriptor:\n  - key: a\n"),
        "limits/payments.yaml:2:1: unknown key \"descriptor\" in the file (its keys are \
         domain, descriptors)"
    );
    assert_eq!(
        error("domain: payments\ndescriptors:\n  - key: a\n    ratelimit: {}\n"),
        "limits/payments.yaml:4:5: unknown key \"ratelimit\" in a descriptor (its keys are \
         key, value, rate_limit, descriptors, shadow_mode, detailed_metric)"
    );
    // The reference takes `unit` at any level; here it belongs to a
    // rate_limit only.
    assert_eq!(
        error("domain: payments\ndescriptors:\n  - key: a\n    unit: second\n"),
        "limits/payments.yaml:4:5: unknown key \"unit\" in a descriptor (its keys are key, \
         value, rate_limit, descriptors, shadow_mode, detailed_metric)"
    );
    assert_eq!(
        rate_limit("unti: second\nrequests_per_unit: 5"),
        "limits/payments.yaml:5:7: unknown key \"unti\" in a rate_limit (its keys are unit, \
         requests_per_unit, unlimited, name, replaces, rules, hold)"
    );
    assert_eq!(
        rate_limit("unit: second\nrequests_per_unit: 5\nreplaces: [{nmae: x}]"),
        "limits/payments.yaml:7:19: unknown key \"nmae\" in a replaces entry (its keys are \
         name)"
    );
    assert_eq!(
        error("domain: payments\ndescriptors:\n  - key: a\n    quota_mode: true\n"),
        "limits/payments.yaml:4:5: \"quota_mode\" is a key of envoyproxy/ratelimit that \
         floodgate rls does not support"
    );
    assert_eq!(
        error("domain: payments\ndescriptors:\n  - key: a\n    value: b\n    value: c\n"),
        "limits/payments.yaml:5:5: \"value\" is given twice (first on line 4)"
    );
}

#[test]
fn a_domain_and_each_key_are_required() {
    let no_domain = "limits/payments.yaml:1:1: no domain: a file starts with `domain: NAME`";
    assert_eq!(error(""), no_domain);
    assert_eq!(error("# nothing yet\n"), no_domain);
    assert_eq!(error("descriptors: []\n"), no_domain);
    assert_eq!(
        error("\ndomain: \"\"\n"),
        "limits/payments.yaml:2:9: no domain: a file starts with `domain: NAME`"
    );
    assert_eq!(
        error("domain: payments\ndescriptors:\n  - value: a\n"),
        "limits/payments.yaml:3:5: a descriptor needs a key (`key: NAME`)"
    );
    assert_eq!(
        error("domain: payments\ndescriptors:\n  - key: ''\n"),
        "limits/payments.yaml:3:10: a descriptor needs a key (`key: NAME`)"
    );
}

#[test]
fn nodes_of_the_wrong_shape_are_named() {
    assert_eq!(
        error("- domain: payments\n"),
        "limits/payments.yaml:1:1: the file takes a mapping, not a list"
    );
    assert_eq!(
        error("domain: payments\ndescriptors: none\n"),
        "limits/payments.yaml:2:14: descriptors takes a list of descriptors, not a scalar"
    );
    assert_eq!(
        error("domain: payments\ndescriptors:\n  - a\n"),
        "limits/payments.yaml:3:5: a descriptor takes a mapping (key:, value:, rate_limit:, \
         …), not a scalar"
    );
    assert_eq!(
        error("domain: [payments]\n"),
        "limits/payments.yaml:1:9: domain takes text, not a list"
    );
    assert_eq!(
        error("domain: payments\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n"),
        "limits/payments.yaml:4:18: shadow_mode takes true or false, not \"maybe\""
    );
    assert_eq!(
        error("domain: payments\ndescriptors:\n  - key: a\n    shadow_mode: \"true\"\n"),
        "limits/payments.yaml:4:18: shadow_mode takes true or false, not \"true\""
    );
}

#[test]
fn units_and_counts_are_checked() {
    // The brief's own example, line 12, column 9 of a longer file.
    let text = "domain: payments
descriptors:
  - key: merchant
    rate_limit:
      unit: second
      requests_per_unit: 100
  - key: card
    descriptors:
      - key: country
        rate_limit:
          requests_per_unit: 3
          unit: fortnight
";
    assert_eq!(
        error(text),
        "limits/payments.yaml:12:17: unknown unit \"fortnight\" (second, minute, hour, day, \
         week, month or year)"
    );
    assert_eq!(
        rate_limit("unit: second"),
        "limits/payments.yaml:5:13: a unit needs requests_per_unit, a whole number (0 \
         refuses every request)"
    );
    assert_eq!(
        rate_limit("requests_per_unit: 5"),
        "limits/payments.yaml:5:26: requests_per_unit needs a unit (second, minute, hour, \
         day, week, month or year)"
    );
    assert_eq!(
        rate_limit("name: x"),
        "limits/payments.yaml:5:7: a rate_limit needs unit and requests_per_unit, rules, or \
         unlimited: true"
    );
    assert_eq!(
        error("domain: payments\ndescriptors:\n  - key: d\n    rate_limit: 5\n"),
        "limits/payments.yaml:4:17: rate_limit takes a mapping (unit:, requests_per_unit:, …), \
         not a scalar"
    );
    for (count, column) in [
        ("-1", 26),
        ("1.5", 26),
        ("010", 26),
        ("\"5\"", 26),
        ("4294967296", 26),
        ("ten", 26),
    ] {
        let text = count.trim_matches('"');
        assert_eq!(
            rate_limit(&format!("unit: second\nrequests_per_unit: {count}")),
            format!(
                "limits/payments.yaml:6:{column}: requests_per_unit takes a whole number from \
                 0 to 4294967295 (decimal, no leading zero), not {text:?}"
            )
        );
    }
}

#[test]
fn unlimited_and_rules_exclude_units() {
    assert_eq!(
        rate_limit("unlimited: true\nunit: second"),
        "limits/payments.yaml:6:13: unlimited: true takes no unit: it never limits"
    );
    assert_eq!(
        rate_limit("unlimited: true\nrequests_per_unit: 5"),
        "limits/payments.yaml:6:26: unlimited: true takes no requests_per_unit: it never limits"
    );
    assert_eq!(
        rate_limit("unlimited: true\nrules: [gcra:1/1s]"),
        "limits/payments.yaml:6:14: unlimited: true takes no rules: it never limits"
    );
    assert_eq!(
        rate_limit("rules: [gcra:1/1s]\nunit: second\nrequests_per_unit: 5"),
        "limits/payments.yaml:6:13: rules replace unit and requests_per_unit: give one or the \
         other, not both"
    );
}

#[test]
fn a_bad_rule_carries_its_line_and_column() {
    assert_eq!(
        rate_limit("rules:\n  - gcra:10/1s\n  - \"fixed-window:10000/1fortnight\""),
        "limits/payments.yaml:7:32: invalid rule \"fixed-window:10000/1fortnight\": unknown \
         unit \"fortnight\" (the units are ns, us, ms, s, m, h, d and ticks)"
    );
    assert_eq!(
        rate_limit("rules: \"gcra:10/1s, gcra10/1s\""),
        "limits/payments.yaml:5:27: invalid rule \"gcra10/1s\": expected POLICY:LIMIT/WINDOW, \
         e.g. gcra:100/1s (no `:`)"
    );
    assert_eq!(
        rate_limit("rules: [gcra:10/1000ticks]"),
        "limits/payments.yaml:5:15: invalid rule \"gcra:10/1000ticks\": a window in ticks \
         depends on the clock: give it with a unit (ns, us, ms, s, m, h, d), such as 1s, \
         500ms or 2m"
    );
    assert_eq!(
        rate_limit("rules: []"),
        "limits/payments.yaml:5:14: rules is empty: give at least one, e.g. rules: \
         [\"gcra:10/1s\"]"
    );
    assert_eq!(
        rate_limit("rules: [gcra:1/1s, gcra:1/1s, gcra:1/1s, gcra:1/1s, gcra:1/1s, gcra:1/1s, gcra:1/1s, gcra:1/1s, gcra:1/1s]"),
        "limits/payments.yaml:5:14: 9 rules: a limiter applies at most 8"
    );
}

#[test]
fn a_descriptor_given_twice_at_one_level_is_refused() {
    let text = "domain: payments
descriptors:
  - key: merchant
    value: acme
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: merchant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: 10}
";
    assert_eq!(
        error(text),
        "limits/payments.yaml:6:5: the descriptor \"payments.merchant_acme\" is given twice \
         at this level (first on line 3)"
    );
    // The same key at two levels, or with two values, is fine.
    let text = "domain: payments
descriptors:
  - key: merchant
    descriptors:
      - key: merchant
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: merchant
    value: acme
";
    assert!(Config::from_texts([(Path::new(FILE), text)]).is_ok());
}

#[test]
fn replaces_name_a_limit_of_the_domain() {
    assert_eq!(
        rate_limit("unit: second\nrequests_per_unit: 5\nreplaces: [{name: ''}]"),
        "limits/payments.yaml:7:25: a replaces entry needs a name (`- name: NAME`)"
    );
    assert_eq!(
        rate_limit("unit: second\nrequests_per_unit: 5\nreplaces:\n  - {}"),
        "limits/payments.yaml:8:11: a replaces entry needs a name (`- name: NAME`)"
    );
    assert_eq!(
        rate_limit("name: mine\nunit: second\nrequests_per_unit: 5\nreplaces: [{name: mine}]"),
        "limits/payments.yaml:8:25: the limit \"mine\" replaces itself"
    );
    assert_eq!(
        rate_limit("unit: second\nrequests_per_unit: 5\nreplaces:\n  - name: specific"),
        "limits/payments.yaml:8:17: replaces \"specific\", but no limit of the domain \
         \"payments\" has that name"
    );
}

#[test]
fn scalars_read_as_yaml_v2_reads_them_into_strings() {
    let text = "domain: 42
descriptors:
  - key: code
    value: 404
    rate_limit: {unit: second, requests_per_unit: 1_000, name: ~}
  - key: flag
    value: true
    rate_limit: {unit: second, requests_per_unit: +7}
  - key: any
    value:
    shadow_mode: yes
    rate_limit: {unit: second, requests_per_unit: 0}
";
    let config = Config::from_texts([(Path::new(FILE), text)]).unwrap();
    let domain = config.domain("42").unwrap();
    let ids: Vec<(&str, Option<&RuleSet>, bool)> = domain
        .limits()
        .into_iter()
        .map(|l| (l.id.as_str(), l.rules(), l.shadow_mode))
        .collect();
    let rule = |text: &str| text.parse::<RuleSet>().unwrap();
    assert_eq!(
        ids,
        [
            ("42.code_404", Some(&rule("fixed-window:1000/1s")), false),
            ("42.flag_true", Some(&rule("fixed-window:7/1s")), false),
            ("42.any", None, true),
        ]
    );
    let code = domain.limits_for([("code", "404")]).unwrap();
    assert_eq!(code.name, None);
    assert_eq!(
        code.origin.to_string(),
        "limits/payments.yaml:3:5",
        "a limit's origin is its descriptor"
    );
    assert_eq!(domain.origin().to_string(), "limits/payments.yaml:1:9");
}

/// A directory under the system's temporary one, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("floodgate-rls-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

const PAYMENTS: &str = "domain: payments
descriptors:
  - key: merchant
    rate_limit: {unit: second, requests_per_unit: 100}
";

const SEARCH: &str = "domain: search
descriptors:
  - key: user
    rate_limit:
      rules: [\"gcra:10/1s\"]
";

#[test]
fn a_directory_loads_its_yaml_files_in_order() {
    let dir = TempDir::new("dir");
    dir.write("payments.yaml", PAYMENTS);
    dir.write("teams/search.yml", SEARCH);
    // Neither a hidden file nor another extension is read.
    dir.write(".payments.yaml.swp", "not: [yaml");
    dir.write("README.txt", "not: [yaml");
    let config = Config::load(&dir.0).unwrap();
    let mut names: Vec<&str> = config.domains().map(Domain::name).collect();
    names.sort_unstable();
    assert_eq!(names, ["payments", "search"]);
    let search = config.domain("search").unwrap();
    assert_eq!(
        search.origin().file.as_ref(),
        dir.0.join("teams/search.yml").as_path()
    );
    assert_eq!(
        search.limits_for([("user", "ann")]).unwrap().id,
        "search.user"
    );
    // One file alone, whatever its name.
    let one = dir.write("one.conf", SEARCH);
    let config = Config::load(&one).unwrap();
    assert!(config.domain("search").is_some());
    assert!(config.domain("payments").is_none());
}

#[test]
fn a_domain_in_two_files_names_both() {
    let dir = TempDir::new("duplicate");
    let first = dir.write("a.yaml", PAYMENTS);
    let second = dir.write("b.yaml", &format!("# the same again\n{PAYMENTS}"));
    let error = Config::load(&dir.0).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{}:2:9: the domain \"payments\" is already given by {}:1",
            second.display(),
            first.display()
        )
    );
    assert_eq!(
        Config::from_texts([
            (Path::new("a.yaml"), PAYMENTS),
            (Path::new("b.yaml"), PAYMENTS)
        ])
        .unwrap_err()
        .to_string(),
        "b.yaml:1:9: the domain \"payments\" is already given by a.yaml:1"
    );
}

#[test]
fn unreadable_paths_and_empty_directories_are_refused() {
    let dir = TempDir::new("empty");
    let error = Config::load(&dir.0).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{}: no *.yaml or *.yml file in this directory",
            dir.0.display()
        )
    );
    let missing = dir.0.join("missing.yaml");
    let error = Config::load(&missing).unwrap_err();
    assert_eq!(error.at, None);
    assert!(matches!(error.problem, Problem::Read(_)));
    assert!(
        error
            .to_string()
            .starts_with(&format!("{}: cannot read: ", missing.display())),
        "{error}"
    );
    // A bad file in a directory is named with its path.
    let bad = dir.write("bad.yaml", "domain: payments\ndescriptors: [\n");
    let error = Config::load(&dir.0).unwrap_err();
    assert_eq!(error.file, bad);
    assert_eq!(error.at.map(|at| at.line), Some(3));
}

#[test]
fn hold_is_a_duration_on_a_limit_with_an_in_flight_rule() {
    let config = Config::from_texts([(
        Path::new(FILE),
        "domain: payments\ndescriptors:\n  - key: d\n    rate_limit:\n      \
         rules: [\"in-flight:4\", \"gcra:10/1s\"]\n      hold: 30s\n",
    )])
    .expect("the file reads");
    let limit = config.applied_limits("payments", [[("d", "x")]])[0].expect("matched");
    assert_eq!(limit.hold, Some(Duration::from_secs(30)));
    assert_eq!(
        rate_limit("rules: [gcra:10/1s]\nhold: 30s"),
        "limits/payments.yaml:6:13: hold is how long an in-flight rule holds each admitted \
         unit: this limit has no in-flight rule, so it would hold nothing"
    );
    assert_eq!(
        rate_limit("unit: second\nrequests_per_unit: 5\nhold: 1s"),
        "limits/payments.yaml:7:13: hold is how long an in-flight rule holds each admitted \
         unit: this limit has no in-flight rule, so it would hold nothing"
    );
    assert_eq!(
        rate_limit("rules: [in-flight:2]\nhold: 0s"),
        "limits/payments.yaml:6:13: hold: expected a duration longer than 0"
    );
    assert!(rate_limit("rules: [in-flight:2]\nhold: 30")
        .starts_with("limits/payments.yaml:6:13: hold: a duration needs a unit"),);
}
