//! Requests decided on a manual clock: exact answers over time, all or
//! nothing across descriptors, costs, and what is refused as invalid.

use std::path::Path;

use floodgate::{Bounds, ManualClock};

use super::*;
use crate::rls::proto::{RateLimitDescriptor, UInt64Value};

const SECOND: u64 = 1_000_000_000;

fn limits(text: &str) -> (Limits, ManualClock) {
    let config = Config::from_texts([(Path::new("test.yaml"), text)]).expect("the file reads");
    let clock = ManualClock::new(0);
    let limits = now(Limits::new(config, Bounds::new(), clock.clone())).expect("limiters built");
    (limits, clock)
}

/// The answer of `future`, which in memory awaits nothing: its first poll
/// answers (the service decides so, on the calling task).
fn now<F: std::future::Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Waker};
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("an in-memory decision awaited something"),
    }
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(key, value)| Entry {
                        key: (*key).to_owned(),
                        value: (*value).to_owned(),
                    })
                    .collect(),
                limit: None,
                hits_addend: None,
            })
            .collect(),
        hits_addend: 0,
    }
}

/// Each status's code and remaining.
fn answers(response: &RateLimitResponse) -> Vec<(Code, u32)> {
    response
        .statuses
        .iter()
        .map(|status| {
            (
                Code::try_from(status.code).expect("a known code"),
                status.limit_remaining,
            )
        })
        .collect()
}

const PER_SECOND: &str = "\
domain: api
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: route
    rate_limit:
      rules: [\"gcra:4/1s\", \"fixed-window:6/1m\"]
  - key: plan
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: zero
    rate_limit: {unit: second, requests_per_unit: 0}
";

#[test]
fn a_unit_and_a_count_are_a_fixed_window_per_descriptor_value() {
    let (limits, clock) = limits(PER_SECOND);
    let a = request("api", &[&[("client", "a")]]);
    let b = request("api", &[&[("client", "b")]]);
    let decide = |request: &RateLimitRequest| answers(&now(limits.decide(request)).unwrap());
    assert_eq!(decide(&a), [(Code::Ok, 1)]);
    assert_eq!(decide(&a), [(Code::Ok, 0)]);
    clock.set(SECOND / 2);
    let refused = now(limits.decide(&a)).unwrap();
    assert_eq!(refused.overall_code, Code::OverLimit as i32);
    // Refused until the window's second is over: half a second.
    assert_eq!(
        refused.statuses[0].duration_until_reset,
        Some(std::time::Duration::from_millis(500).into())
    );
    // Another value is another client.
    assert_eq!(decide(&b), [(Code::Ok, 1)]);
    clock.set(SECOND);
    assert_eq!(decide(&a), [(Code::Ok, 1)]);
}

#[test]
fn rules_decide_as_the_spec_says_with_costs() {
    let (limits, clock) = limits(PER_SECOND);
    let mut route = request("api", &[&[("route", "/pay")]]);
    route.hits_addend = 3;
    // gcra:4/1s admits a burst of 4: 3, then 1 more.
    assert_eq!(
        answers(&now(limits.decide(&route)).unwrap()),
        [(Code::Ok, 1)]
    );
    route.descriptors[0].hits_addend = Some(UInt64Value { value: 2 });
    assert_eq!(
        answers(&now(limits.decide(&route)).unwrap()),
        [(Code::OverLimit, 1)]
    );
    route.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    // 0 means 1.
    assert_eq!(
        answers(&now(limits.decide(&route)).unwrap()),
        [(Code::Ok, 0)]
    );
    // A quarter second drips one back; the minute's six allow two more.
    clock.set(SECOND / 4);
    assert_eq!(
        answers(&now(limits.decide(&route)).unwrap()),
        [(Code::Ok, 0)]
    );
    clock.set(SECOND);
    route.descriptors[0].hits_addend = Some(UInt64Value { value: 2 });
    // gcra has 4 again, the minute has 1 of 6: the minute refuses.
    assert_eq!(
        answers(&now(limits.decide(&route)).unwrap()),
        [(Code::OverLimit, 1)]
    );
}

#[test]
fn a_refused_request_leaves_every_other_descriptor_as_it_was() {
    let (limits, _clock) = limits(PER_SECOND);
    let both = request("api", &[&[("client", "a")], &[("plan", "free")]]);
    assert_eq!(
        answers(&now(limits.decide(&both)).unwrap()),
        [(Code::Ok, 1), (Code::Ok, 0)]
    );
    for _ in 0..5 {
        let refused = now(limits.decide(&both)).unwrap();
        assert_eq!(refused.overall_code, Code::OverLimit as i32);
        // The client's descriptor admitted it, then gave it back.
        assert_eq!(answers(&refused), [(Code::Ok, 1), (Code::OverLimit, 0)]);
    }
    let client = limits.limiter("api.client").unwrap();
    assert_eq!(client.remaining("6:client1:a"), 1);
}

#[test]
fn requests_per_unit_zero_refuses_and_shadow_mode_lets_through() {
    let text = format!(
        "{PER_SECOND}  - key: shadow\n    shadow_mode: true\n    \
         rate_limit: {{unit: hour, requests_per_unit: 1}}\n"
    );
    let (limits, _clock) = limits(&text);
    let zero = request("api", &[&[("zero", "z")]]);
    assert_eq!(
        answers(&now(limits.decide(&zero)).unwrap()),
        [(Code::OverLimit, 0)]
    );
    let shadow = request("api", &[&[("shadow", "s")]]);
    for remaining in [0, 0, 0] {
        let answer = now(limits.decide(&shadow)).unwrap();
        assert_eq!(answer.overall_code, Code::Ok as i32);
        assert_eq!(answer.statuses[0].limit_remaining, remaining);
    }
}

#[test]
fn invalid_requests_spend_nothing() {
    let (limits, _clock) = limits(PER_SECOND);
    let mut bad = request("api", &[&[("client", "a")], &[]]);
    assert_eq!(
        now(limits.decide(&bad)).unwrap_err().0,
        "descriptor 1 has no entries"
    );
    bad.descriptors.pop();
    bad.domain.clear();
    assert!(now(limits.decide(&bad)).is_err());
    let client = limits.limiter("api.client").unwrap();
    assert_eq!(client.remaining("6:client1:a"), 2);
}

#[test]
fn client_keys_keep_entries_apart() {
    let mut one = String::new();
    client_key(
        &mut one,
        &[Entry {
            key: "a".into(),
            value: "b1:c".into(),
        }],
    );
    let mut two = String::new();
    client_key(
        &mut two,
        &[
            Entry {
                key: "a".into(),
                value: "b".into(),
            },
            Entry {
                key: "c".into(),
                value: String::new(),
            },
        ],
    );
    assert_ne!(one, two);
}

#[test]
fn an_in_flight_rule_is_refused_where_it_is_written() {
    let config = Config::from_texts([(
        Path::new("held.yaml"),
        "domain: api\ndescriptors:\n  - key: job\n    rate_limit: {rules: [\"in-flight:2\"]}\n",
    )])
    .expect("the file reads");
    let Err(error) = now(Limits::new(config, Bounds::new(), ManualClock::new(0))) else {
        panic!("an in-flight rule is refused");
    };
    assert_eq!(
        error,
        "held.yaml:3:5: api.job: an `in-flight` rule needs `hold: DURATION` in its rate_limit \
         (such as `hold: 30s`): a rate-limit call never says when its request ends, so each \
         admitted unit is released after its hold"
    );
}

#[test]
fn redis_prefixes_name_each_limit_apart_and_keep_out_what_would_mix_keys() {
    use crate::rls::store::redis_prefix;
    assert_eq!(
        redis_prefix("edge.remote_address"),
        "floodgate-rls:edge.remote_address"
    );
    // `:` would let one limit's prefix run into another's keys, braces
    // would move the client's hash tag, `%` would make the encoding two
    // to one.
    assert_eq!(
        redis_prefix("a:b {c}%/é"),
        "floodgate-rls:a%3Ab%20%7Bc%7D%25%2F%C3%A9"
    );
    assert_ne!(redis_prefix("a:b"), redis_prefix("a%3Ab"));
}

/// `api`'s limits, their clients saved to a file and loaded into limits of
/// `text` on a clock that goes on from the save's.
fn saved_and_loaded(
    text: &str,
    carry_over: bool,
) -> Result<(Arc<Limits>, usize, Vec<String>), String> {
    use crate::rls::state::{load, LimitSet};
    use arc_swap::ArcSwap;
    use floodgate::state::{save, Saved};

    let (before, clock) = limits(PER_SECOND);
    let both = request("api", &[&[("client", "a")], &[("plan", "free")]]);
    now(before.decide(&both)).unwrap();
    let path = std::env::temp_dir().join(format!(
        "floodgate-rls-unit-{}-{}.state",
        std::process::id(),
        fastrand::u64(..)
    ));
    let set = LimitSet::new(Arc::new(ArcSwap::from_pointee(before)), clock.clone());
    let summary = save(&set, &path).expect("saved");
    assert_eq!(summary.clients, 2);
    let saved = Saved::read(&path).expect("read back");
    let _ = std::fs::remove_file(&path);
    let config = Config::from_texts([(Path::new("test.yaml"), text)]).expect("the file reads");
    let clock = ManualClock::new(saved.saved_at());
    let after = Arc::new(ArcSwap::from_pointee(
        now(Limits::new(config, Bounds::new(), clock.clone())).expect("limiters built"),
    ));
    let loaded = load(&saved, &path, &after, &clock, carry_over)?;
    let limits = Arc::try_unwrap(after)
        .ok()
        .expect("no other owner")
        .into_inner();
    Ok((limits, loaded.clients, loaded.afresh))
}

/// What `key` has left under the limit `id`, in memory.
fn remaining(limits: &Limits, id: &str, key: &str) -> u64 {
    limits
        .limiter(id)
        .expect("counted in memory")
        .remaining(key)
}

#[test]
fn a_state_keeps_each_limits_clients_and_other_rules_are_refused_or_start_afresh() {
    // The same rules: both clients as they were.
    let (limits, clients, afresh) = saved_and_loaded(PER_SECOND, false).unwrap();
    assert_eq!((clients, afresh.len()), (2, 0));
    assert_eq!(remaining(&limits, "api.client", "6:client1:a"), 1);
    assert_eq!(remaining(&limits, "api.plan", "4:plan4:free"), 0);
    // The plan's limit raised: refused, naming the limit and both rules.
    let raised = PER_SECOND.replace(
        "{unit: minute, requests_per_unit: 1}",
        "{unit: minute, requests_per_unit: 3}",
    );
    let Err(error) = saved_and_loaded(&raised, false) else {
        panic!("a save under other rules is refused");
    };
    assert!(
        error.contains(
            "limit api.plan was saved under the rules fixed-window:1/1m, not fixed-window:3/1m"
        ) && error.contains("--state-carry-over"),
        "{error}"
    );
    // Carried over: the plan afresh, the client's limit as it was.
    let (limits, clients, afresh) = saved_and_loaded(&raised, true).unwrap();
    assert_eq!((clients, afresh), (1, vec!["api.plan".to_owned()]));
    assert_eq!(remaining(&limits, "api.client", "6:client1:a"), 1);
    assert_eq!(remaining(&limits, "api.plan", "4:plan4:free"), 3);
}

#[tokio::test]
async fn a_held_unit_is_released_after_its_hold_and_at_once_when_refused() {
    let text = format!(
        "{PER_SECOND}  - key: job
    rate_limit: {{rules: [\"in-flight:2\"], hold: 200ms}}
"
    );
    let (limits, _clock) = limits(&text);
    let job = request("api", &[&[("job", "a")]]);
    assert_eq!(answers(&now(limits.decide(&job)).unwrap()), [(Code::Ok, 1)]);
    assert_eq!(answers(&now(limits.decide(&job)).unwrap()), [(Code::Ok, 0)]);
    let refused = now(limits.decide(&job)).unwrap();
    assert_eq!(answers(&refused), [(Code::OverLimit, 0)]);
    // Only a release admits it: no wait to say.
    assert_eq!(refused.statuses[0].duration_until_reset, None);
    let held = limits.limiter("api.job").unwrap();
    // Released by the timers; polled until then, failing only if never.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while held.remaining("3:job1:a") < 2 {
        assert!(std::time::Instant::now() < deadline, "never released");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // A request another descriptor refuses holds nothing.
    let both = request("api", &[&[("job", "b")], &[("plan", "free")]]);
    assert_eq!(
        answers(&now(limits.decide(&both)).unwrap()),
        [(Code::Ok, 1), (Code::Ok, 0)]
    );
    assert_eq!(
        answers(&now(limits.decide(&both)).unwrap()),
        [(Code::Ok, 1), (Code::OverLimit, 0)]
    );
    assert_eq!(held.remaining("3:job1:b"), 1);
}

/// The answer's `response_headers_to_add`, as (name, value).
fn headers(response: &RateLimitResponse) -> Vec<(&str, &str)> {
    response
        .response_headers_to_add
        .iter()
        .map(|header| (header.key.as_str(), header.value.as_str()))
        .collect()
}

#[test]
fn response_headers_are_off_by_default_and_one_descriptor_gives_the_layers() {
    let (plain, _clock) = limits(PER_SECOND);
    let a = request("api", &[&[("client", "a")]]);
    assert!(now(plain.decide(&a))
        .unwrap()
        .response_headers_to_add
        .is_empty());

    let (limits, clock) = limits(PER_SECOND);
    let limits = limits.with_response_headers(true);
    assert_eq!(
        headers(&now(limits.decide(&a)).unwrap()),
        [
            ("ratelimit-policy", r#""api.client";q=2;w=1"#),
            ("ratelimit", r#""api.client";r=1;t=0"#),
            ("x-ratelimit-limit", "2"),
            ("x-ratelimit-remaining", "1"),
            ("x-ratelimit-reset", "0"),
        ]
    );
    now(limits.decide(&a)).unwrap();
    // Refused for the rest of the second: a quarter of it, rounded up.
    clock.set(SECOND * 3 / 4);
    let refused = now(limits.decide(&a)).unwrap();
    assert_eq!(refused.overall_code, Code::OverLimit as i32);
    assert_eq!(
        headers(&refused),
        [
            ("ratelimit-policy", r#""api.client";q=2;w=1"#),
            ("ratelimit", r#""api.client";r=0;t=1"#),
            ("retry-after", "1"),
            ("x-ratelimit-limit", "2"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1"),
        ]
    );
    // Several rules: one member each, named by position.
    let route = request("api", &[&[("route", "/pay")]]);
    let limits = limits.with_response_headers(false);
    assert_eq!(
        headers(&now(limits.decide(&route)).unwrap()),
        [
            (
                "ratelimit-policy",
                r#""api.route-1";q=4;w=1, "api.route-2";q=6;w=60"#
            ),
            (
                "ratelimit",
                r#""api.route-1";r=3;t=0, "api.route-2";r=5;t=0"#
            ),
        ]
    );
}

#[test]
fn several_descriptors_add_a_member_each_with_the_longest_retry_after() {
    let text = PER_SECOND.replace(
        "  - key: plan\n    rate_limit: {",
        "  - key: plan\n    rate_limit: {name: plan, ",
    );
    let (limits, clock) = limits(&text);
    let limits = limits.with_response_headers(true);
    let both = request("api", &[&[("route", "/r")], &[("plan", "free")]]);
    let first = now(limits.decide(&both)).unwrap();
    assert_eq!(
        headers(&first),
        [
            (
                "ratelimit-policy",
                r#""api.route-1";q=4;w=1, "api.route-2";q=6;w=60, "plan";q=1;w=60"#
            ),
            (
                "ratelimit",
                r#""api.route-1";r=3;t=0, "api.route-2";r=5;t=0, "plan";r=0;t=60"#
            ),
            // The descriptor with the fewest left.
            ("x-ratelimit-limit", "1"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "60"),
        ]
    );
    // The plan refuses for a minute: the route's units are given back,
    // and its members say so, as its status does (the burst is whole
    // again after half a second).
    clock.set(SECOND / 2);
    let refused = now(limits.decide(&both)).unwrap();
    assert_eq!(answers(&refused), [(Code::Ok, 4), (Code::OverLimit, 0)]);
    let retry = [
        (
            "ratelimit",
            r#""api.route-1";r=4;t=0, "api.route-2";r=5;t=0, "plan";r=0;t=60"#,
        ),
        ("retry-after", "60"),
    ];
    assert_eq!(headers(&refused)[1..3], retry);
    // Both refuse, each with its wait: the longer is Retry-After, and the
    // legacy headers describe it.
    let mut spend = request("api", &[&[("route", "/r")]]);
    spend.hits_addend = 4;
    now(limits.decide(&spend)).unwrap();
    let refused = now(limits.decide(&both)).unwrap();
    assert_eq!(
        answers(&refused),
        [(Code::OverLimit, 0), (Code::OverLimit, 0)]
    );
    assert_eq!(
        headers(&refused)[2..],
        [
            ("retry-after", "60"),
            ("x-ratelimit-limit", "1"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "60"),
        ]
    );
}

#[test]
fn offenders_name_each_limit_and_its_client_s_entries() {
    use serde_json::json;
    let (limits, _clock) = limits(PER_SECOND);
    let client = request("api", &[&[("client", "a:1")]]);
    let plan = request("api", &[&[("plan", "free")]]);
    // Two admitted and three refused; one admitted and two refused.
    for _ in 0..5 {
        now(limits.decide(&client)).unwrap();
    }
    for _ in 0..3 {
        now(limits.decide(&plan)).unwrap();
    }
    let report: serde_json::Value =
        serde_json::from_str(&crate::rls::metrics::offenders(&limits)).unwrap();
    assert_eq!(
        report["offenders"],
        json!([
            {"limit": "api.client", "client": "client=a:1", "refused": 3, "units": 3, "error": 0},
            {"limit": "api.plan", "client": "plan=free", "refused": 2, "units": 2, "error": 0},
        ])
    );
    assert_eq!(report["limits"][0]["recorded"], 3);
    // Each request of it begins a new interval.
    let report: serde_json::Value =
        serde_json::from_str(&crate::rls::metrics::offenders(&limits)).unwrap();
    assert_eq!(report, json!({"offenders": [], "limits": []}));

    // Several entries read as the request gave them; a key of another
    // form is given as it is.
    let mut key = String::new();
    let entries = [("tenant", "acme"), ("plan", "")].map(|(key, value)| Entry {
        key: key.into(),
        value: value.into(),
    });
    client_key(&mut key, &entries);
    assert_eq!(readable_client(&key), "tenant=acme,plan=");
    assert_eq!(readable_client("6:client"), "6:client");
}

#[test]
fn detailed_metric_names_a_series_per_value_up_to_its_bound() {
    use crate::rls::metrics::{render, CallStats, DETAILED_VALUES};
    let text = format!(
        "{PER_SECOND}  - key: user\n    detailed_metric: true\n    \
         rate_limit: {{unit: hour, requests_per_unit: 1}}\n"
    );
    let (limits, _clock) = limits(&text);
    // One value past the bound, and the first value again (refused).
    for n in 0..=DETAILED_VALUES {
        let user = format!("u{n}");
        now(limits.decide(&request("api", &[&[("user", &user)]]))).unwrap();
    }
    now(limits.decide(&request("api", &[&[("user", "u0")]]))).unwrap();
    now(limits.decide(&request("api", &[&[("client", "a")]]))).unwrap();
    let scrape = render(&limits, &CallStats::default());
    for line in [
        "floodgate_rls_total_hits_total{limit=\"api.user\",key=\"api.user_u0\"} 2\n",
        "floodgate_rls_over_limit_total{limit=\"api.user\",key=\"api.user_u0\"} 1\n",
        "floodgate_rls_within_limit_total{limit=\"api.user\",key=\"api.user_u999\"} 1\n",
        "floodgate_rls_total_hits_total{limit=\"api.user\",key=\"_other\"} 1\n",
        // A limit without it keeps its one series.
        "floodgate_rls_total_hits_total{limit=\"api.client\"} 1\n",
    ] {
        assert!(scrape.contains(line), "{line:?}");
    }
    let series = scrape
        .lines()
        .filter(|line| line.starts_with("floodgate_rls_total_hits_total{limit=\"api.user\""))
        .count();
    // The bound's values and `_other`, in place of the limit's own.
    assert_eq!(series, DETAILED_VALUES + 1);
    assert!(!scrape.contains("{limit=\"api.user\"}"));
}
