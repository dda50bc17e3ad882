//! The examples of envoyproxy/ratelimit's README (its configuration
//! section), each answering as that README says.

use std::path::Path;

use super::*;
use crate::rls::config::{Quota, Unit};

fn domain(text: &str) -> Domain {
    let config = Config::from_texts([(Path::new("limits.yaml"), text)])
        .unwrap_or_else(|error| panic!("{error}"));
    let mut domains: Vec<Domain> = config.domains().cloned().collect();
    assert_eq!(domains.len(), 1);
    domains.remove(0)
}

/// The id of the limit one descriptor gets, or "none".
fn limit_of(domain: &Domain, entries: &[(&str, &str)]) -> String {
    domain
        .limits_for(entries)
        .map_or_else(|| "none".to_owned(), |limit| limit.id.clone())
}

fn per_unit(limit: &Limit) -> (u32, Unit) {
    match &limit.quota {
        Quota::PerUnit {
            unit,
            requests_per_unit,
            ..
        } => (*requests_per_unit, *unit),
        other => panic!("not a unit limit: {other:?}"),
    }
}

#[test]
fn example_1_two_values_of_one_key() {
    let domain = domain(
        "domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
",
    );
    let users = domain.limits_for([("database", "users")]).unwrap();
    assert_eq!(users.id, "mongo_cps.database_users");
    assert_eq!(per_unit(users), (500, Unit::Second));
    assert_eq!(users.rules().unwrap().to_string(), "fixed-window:500/1s");
    assert_eq!(
        limit_of(&domain, &[("database", "default")]),
        "mongo_cps.database_default"
    );
    // A value not listed, and a key not listed, match nothing.
    assert_eq!(limit_of(&domain, &[("database", "orders")]), "none");
    assert_eq!(limit_of(&domain, &[("table", "users")]), "none");
}

const MESSAGING: &str = "domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";

#[test]
fn example_2_nested_descriptors_and_several_in_one_request() {
    let domain = domain(MESSAGING);
    let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
    let limit = domain.limits_for(marketing).unwrap();
    assert_eq!(limit.id, "messaging.message_type_marketing.to_number");
    assert_eq!(per_unit(limit), (5, Unit::Day));
    assert_eq!(limit.rules().unwrap().to_string(), "fixed-window:5/1d");
    let other_number = [("message_type", "marketing"), ("to_number", "2062222222")];
    assert_eq!(
        limit_of(&domain, &other_number),
        "messaging.message_type_marketing.to_number"
    );
    let any = domain.limits_for([("to_number", "2061111111")]).unwrap();
    assert_eq!(any.id, "messaging.to_number");
    assert_eq!(per_unit(any), (100, Unit::Day));
    // The placeholder level has no limit of its own.
    assert_eq!(limit_of(&domain, &[("message_type", "marketing")]), "none");
    // Other message types have no nested level.
    let transactional = [("message_type", "transactional"), ("to_number", "1")];
    assert_eq!(limit_of(&domain, &transactional), "none");
    // The README's request of two descriptors: both limits apply.
    let applied = domain.applied_limits([&marketing[..], &[("to_number", "2061111111")]]);
    let ids: Vec<&str> = applied.iter().map(|l| l.unwrap().id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "messaging.message_type_marketing.to_number",
            "messaging.to_number"
        ]
    );
}

#[test]
fn example_3_the_most_specific_match_first() {
    let domain = domain(
        "domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
",
    );
    let any = domain.limits_for([("remote_address", "50.0.0.1")]).unwrap();
    assert_eq!(any.id, "edge_proxy_per_ip.remote_address");
    assert_eq!(per_unit(any), (10, Unit::Second));
    assert!(!any.refuses_all());
    // Written after the key alone, the key and value still win.
    let blocked = domain.limits_for([("remote_address", "50.0.0.5")]).unwrap();
    assert_eq!(blocked.id, "edge_proxy_per_ip.remote_address_50.0.0.5");
    assert_eq!(per_unit(blocked), (0, Unit::Second));
    assert!(blocked.refuses_all());
    assert!(blocked.rules().is_none());
}

#[test]
fn example_4_levels_must_match_the_request_s_length() {
    let flat = domain(
        "domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
",
    );
    let request = [("key", "value"), ("subkey", "subvalue")];
    assert_eq!(limit_of(&flat, &request), "none");
    assert_eq!(limit_of(&flat, &request[..1]), "example4.key_value");
    let nested = domain(
        "domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
",
    );
    assert_eq!(limit_of(&nested, &request), "example4.key_value.subkey");
    assert_eq!(limit_of(&nested, &request[..1]), "none");
    // A request longer than the configuration's levels has none either.
    let longer = [("key", "value"), ("subkey", "subvalue"), ("more", "x")];
    assert_eq!(limit_of(&nested, &longer), "none");
    assert_eq!(limit_of(&nested, &[]), "none");
}

#[test]
fn example_5_unlimited() {
    let domain = domain(
        "domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
",
    );
    let ldap = domain.limits_for([("ldap", "any")]).unwrap();
    assert!(ldap.is_unlimited());
    assert_eq!(ldap.quota, Quota::Unlimited);
    assert!(ldap.rules().is_none());
    let azure = domain.limits_for([("azure", "any")]).unwrap();
    assert!(!azure.is_unlimited());
    assert_eq!(per_unit(azure), (100, Unit::Minute));
    assert_eq!(azure.rules().unwrap().to_string(), "fixed-window:100/1m");
}

#[test]
fn example_6_shadow_mode() {
    let domain = domain(
        "domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
",
    );
    let a = [("service", "auth-service"), ("user", "user-a")];
    let a = domain.limits_for(a).unwrap();
    assert_eq!(a.id, "example6.service.user_user-a");
    assert!(a.shadow_mode);
    assert_eq!(per_unit(a), (10, Unit::Second));
    let b = [("service", "auth-service"), ("user", "user-b")];
    let b = domain.limits_for(b).unwrap();
    assert!(!b.shadow_mode);
    assert_eq!(per_unit(b), (20, Unit::Second));
    let c = [("service", "auth-service"), ("user", "user-c")];
    assert_eq!(limit_of(&domain, &c), "none");
}

#[test]
fn example_7_replaces() {
    let domain = domain(
        "domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
",
    );
    let one: &[(&str, &str)] = &[("key_1", "value_1"), ("user", "bkthomps")];
    let two: &[(&str, &str)] = &[("key_2", "value_2"), ("user", "bkthomps")];
    let rates = |applied: Vec<Option<&Limit>>| -> Vec<Option<u32>> {
        applied.iter().map(|l| l.map(|l| per_unit(l).0)).collect()
    };
    // Each alone: 5 and 10 a second.
    assert_eq!(rates(domain.applied_limits([one])), [Some(5)]);
    assert_eq!(rates(domain.applied_limits([two])), [Some(10)]);
    // Together: the named limit is replaced, in either order.
    assert_eq!(rates(domain.applied_limits([one, two])), [None, Some(10)]);
    assert_eq!(rates(domain.applied_limits([two, one])), [Some(10), None]);
    let first = domain.limits_for(one).unwrap();
    assert_eq!(first.name.as_deref(), Some("specific_limit"));
    let second = domain.limits_for(two).unwrap();
    assert_eq!(second.replaces, ["specific_limit"]);
}

#[test]
fn an_unlimited_limit_is_never_replaced_and_its_replaces_count() {
    let domain = domain(
        "domain: d
descriptors:
  - key: a
    rate_limit: {name: free, unlimited: true, replaces: [{name: counted}]}
  - key: b
    rate_limit: {name: counted, unit: hour, requests_per_unit: 3, replaces: [{name: free}]}
",
    );
    let applied = domain.applied_limits([[("a", "1")], [("b", "1")]]);
    assert!(applied[0].unwrap().is_unlimited());
    assert!(applied[1].is_none());
}

#[test]
fn example_8_detailed_metric() {
    let domain = domain(
        "domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
",
    );
    let entries = [("key1", "unspecified_value")];
    let detailed = domain.limits_for(entries).unwrap();
    assert!(detailed.detailed_metric);
    assert_eq!(per_unit(detailed), (10, Unit::Minute));
    assert_eq!(detailed.id, "example8.key1");
    assert_eq!(
        detailed.stats_key("example8", entries),
        "example8.key1_unspecified_value"
    );
    let entries = [("key1", "value1")];
    let listed = domain.limits_for(entries).unwrap();
    assert_eq!(per_unit(listed), (20, Unit::Minute));
    assert_eq!(
        listed.stats_key("example8", entries),
        "example8.key1_value1"
    );
}

#[test]
fn example_9_wildcards() {
    let trailing = domain(
        "domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
",
    );
    for value in ["value1", "value2", "valueXYZ", "value"] {
        assert_eq!(
            limit_of(&trailing, &[("key1", value)]),
            "example9.key1_value*"
        );
    }
    assert_eq!(limit_of(&trailing, &[("key1", "valu")]), "none");
    assert_eq!(limit_of(&trailing, &[("key2", "value1")]), "none");

    let middle = domain(
        "domain: example9
descriptors:
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
",
    );
    for (value, matches) in [
        ("/api/123/action", true),
        ("/api/user-id/action", true),
        ("/api/123/other", false),
        ("/api//action", true),
        ("/api/action", false),
    ] {
        let expected = if matches {
            "example9.path_/api/*/action"
        } else {
            "none"
        };
        assert_eq!(limit_of(&middle, &[("path", value)]), expected, "{value}");
    }

    let several = domain(
        "domain: example9
descriptors:
  - key: route
    value: /api/*/resource/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 20
",
    );
    for (value, matches) in [
        ("/api/v1/resource/123/action", true),
        ("/api/v2/resource/456/action", true),
        ("/api/v2/resource/456/other", false),
        ("/api/v2/other/456/action", false),
    ] {
        let expected = if matches {
            "example9.route_/api/*/resource/*/action"
        } else {
            "none"
        };
        assert_eq!(limit_of(&several, &[("route", value)]), expected, "{value}");
    }
}

#[test]
fn exact_value_then_first_wildcard_then_key_alone() {
    let domain = domain(
        "domain: order
descriptors:
  - key: path
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /a*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: /ab*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    value: /abc
    rate_limit: {unit: second, requests_per_unit: 4}
",
    );
    let rate = |value| per_unit(domain.limits_for([("path", value)]).unwrap()).0;
    assert_eq!(rate("/abc"), 4);
    // The first wildcard written wins, not the longest.
    assert_eq!(rate("/abd"), 2);
    assert_eq!(rate("/x"), 1);
}

#[test]
fn a_wildcard_level_leads_to_its_nested_descriptors() {
    let domain = domain(
        "domain: d
descriptors:
  - key: tenant
    value: team-*
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 7}
",
    );
    let request = [("tenant", "team-blue"), ("user", "ann")];
    assert_eq!(limit_of(&domain, &request), "d.tenant_team-*.user");
    assert_eq!(
        limit_of(&domain, &[("tenant", "other"), ("user", "ann")]),
        "none"
    );
}

#[test]
fn the_reference_s_composite_key_quirk_is_kept() {
    // `KEY_VALUE` is one string: the entry ("a_b", "c") reaches the
    // descriptor a = b_c, as in the reference.
    let domain = domain(
        "domain: d
descriptors:
  - key: a
    value: b_c
    rate_limit: {unit: second, requests_per_unit: 1}
",
    );
    assert_eq!(limit_of(&domain, &[("a", "b_c")]), "d.a_b_c");
    assert_eq!(limit_of(&domain, &[("a_b", "c")]), "d.a_b_c");
}

#[test]
fn every_unit_becomes_a_fixed_window() {
    let domain = domain(
        "domain: units
descriptors:
  - {key: s, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: m, rate_limit: {unit: Minute, requests_per_unit: 2}}
  - {key: h, rate_limit: {unit: HOUR, requests_per_unit: 3}}
  - {key: d, rate_limit: {unit: day, requests_per_unit: 4}}
  - {key: w, rate_limit: {unit: week, requests_per_unit: 5}}
  - {key: mo, rate_limit: {unit: month, requests_per_unit: 6}}
  - {key: y, rate_limit: {unit: year, requests_per_unit: 4294967295}}
",
    );
    let rule = |key| {
        let limit = domain.limits_for([(key, "v")]).unwrap();
        limit.rules().unwrap().to_string()
    };
    assert_eq!(rule("s"), "fixed-window:1/1s");
    assert_eq!(rule("m"), "fixed-window:2/1m");
    assert_eq!(rule("h"), "fixed-window:3/1h");
    assert_eq!(rule("d"), "fixed-window:4/1d");
    assert_eq!(rule("w"), "fixed-window:5/7d");
    assert_eq!(rule("mo"), "fixed-window:6/30d");
    assert_eq!(rule("y"), "fixed-window:4294967295/365d");
}

#[test]
fn this_crate_s_rules_are_carried() {
    let domain = domain(
        "domain: api
descriptors:
  - key: user
    rate_limit:
      rules: [\"gcra:10/1s\", \"fixed-window:10000/1d\"]
  - key: upload
    shadow_mode: true
    rate_limit:
      rules: \"in-flight:4, token-bucket:100/1m\"
",
    );
    let user = domain.limits_for([("user", "ann")]).unwrap();
    assert_eq!(
        user.rules().unwrap().to_string(),
        "gcra:10/1s,fixed-window:10000/1d"
    );
    assert!(matches!(user.quota, Quota::Rules(_)));
    let upload = domain.limits_for([("upload", "x")]).unwrap();
    assert_eq!(
        upload.rules().unwrap().to_string(),
        "in-flight:4,token-bucket:100/1m"
    );
    assert!(upload.shadow_mode);
}

#[test]
fn an_unknown_domain_limits_nothing() {
    let config = Config::from_texts([(Path::new("a.yaml"), MESSAGING)]).unwrap();
    let applied = config.applied_limits("nowhere", [[("to_number", "1")], [("x", "y")]]);
    assert_eq!(applied.len(), 2);
    assert!(applied.iter().all(Option::is_none));
    let applied = config.applied_limits("messaging", [[("to_number", "1")]]);
    assert_eq!(applied[0].unwrap().id, "messaging.to_number");
}

#[test]
fn wildcard_match_is_the_reference_s() {
    let parts = |pattern: &str| -> Vec<String> { pattern.split('*').map(str::to_owned).collect() };
    for (pattern, text, expected) in [
        ("abc", "abc", true),
        ("abc", "abcd", false),
        ("a*", "a", true),
        ("*", "", true),
        ("*c", "abc", true),
        ("a*b*c", "abc", true),
        ("a*b*c", "ac", false),
        ("ab*b", "ab", false),
        ("ab*b", "abb", true),
        ("a**b", "ab", true),
        ("é*é", "éé", true),
        ("é*é", "é", false),
    ] {
        assert_eq!(
            wildcard_match(&parts(pattern), text),
            expected,
            "{pattern} {text}"
        );
    }
}

#[test]
fn the_reference_s_basic_config_answers_as_its_tests_say() {
    // Its test/config/basic_config.yaml, comments left out, and the
    // answers of TestBasicConfig.
    let domain = domain(
        "domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  # A value with neither a limit nor nested descriptors: let through.
  - key: key2
    value: value3
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: key4
    rate_limit: {name: key4_rate_limit, unit: day, requests_per_unit: 1}
  - key: key5
    value: value5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit: {unit: day, requests_per_unit: 25}
  - key: key6
    rate_limit: {unlimited: true}
  - key: key7
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 70}
",
    );
    let rate = |entries: &[(&str, &str)]| {
        domain
            .limits_for(entries)
            .map(|limit| (limit.id.clone(), per_unit(limit)))
    };
    assert_eq!(rate(&[]), None);
    assert_eq!(rate(&[("key1", "something")]), None);
    assert_eq!(rate(&[("key1", "value1")]), None);
    assert_eq!(rate(&[("key2", "value2"), ("subkey", "subvalue")]), None);
    assert_eq!(rate(&[("key5", "value5"), ("subkey5", "subvalue")]), None);
    assert_eq!(
        rate(&[("key1", "value1"), ("subkey1", "something")]),
        Some(("test-domain.key1_value1.subkey1".into(), (5, Unit::Second)))
    );
    assert_eq!(
        rate(&[("key1", "value1"), ("subkey1", "subvalue1")]),
        Some((
            "test-domain.key1_value1.subkey1_subvalue1".into(),
            (10, Unit::Second)
        ))
    );
    assert_eq!(
        rate(&[("key2", "something")]),
        Some(("test-domain.key2".into(), (20, Unit::Minute)))
    );
    assert_eq!(
        rate(&[("key2", "value2")]),
        Some(("test-domain.key2_value2".into(), (30, Unit::Minute)))
    );
    // Reached exactly, value3 has no limit: key2's does not stand in.
    assert_eq!(rate(&[("key2", "value3")]), None);
    assert_eq!(
        rate(&[("key3", "foo")]),
        Some(("test-domain.key3".into(), (1, Unit::Hour)))
    );
    assert_eq!(
        rate(&[("key4", "foo")]),
        Some(("test-domain.key4".into(), (1, Unit::Day)))
    );
    assert_eq!(
        rate(&[("key5", "value5"), ("subkey5", "subvalue5")]),
        Some((
            "test-domain.key5_value5.subkey5_subvalue5".into(),
            (25, Unit::Day)
        ))
    );
    assert!(domain.limits_for([("key6", "foo")]).unwrap().is_unlimited());
    let key7 = domain.limits_for([("key7", "unspecified_value")]).unwrap();
    assert_eq!(per_unit(key7), (70, Unit::Minute));
    assert_eq!(
        key7.stats_key("test-domain", [("key7", "unspecified_value")]),
        "test-domain.key7_unspecified_value"
    );
}
