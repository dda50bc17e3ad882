//! The exporters say what `stats` says: a limiter that counts runs a seeded
//! trace, and its Prometheus text, read back by a real parser of the
//! format, and what the `metrics` facade was told, are its `Stats` field by
//! field.

use std::collections::BTreeMap;
use std::time::Duration;

use floodgate::export::Prometheus;
use floodgate::{Bounds, Builder, ManualClock, Overflow, PolicyKind, RateLimiter, Stats};
use openmetrics_parser::prometheus::parse_prometheus;
use openmetrics_parser::{MetricNumber, PrometheusType, PrometheusValue};

/// Every metric, its type, and the field it must equal (`None`: the
/// tracked clients), with the outcome label where the family has one.
const EXPECTED: [(&str, &str, Option<&str>); 14] = [
    ("floodgate_decisions_total", "counter", Some("admitted")),
    ("floodgate_decisions_total", "counter", Some("rejected")),
    (
        "floodgate_decision_units_total",
        "counter",
        Some("admitted"),
    ),
    (
        "floodgate_decision_units_total",
        "counter",
        Some("rejected"),
    ),
    ("floodgate_refunded_units_total", "counter", None),
    ("floodgate_released_units_total", "counter", None),
    ("floodgate_in_flight_rejections_total", "counter", None),
    ("floodgate_overflow_decisions_total", "counter", None),
    ("floodgate_clients_created_total", "counter", None),
    ("floodgate_clients_evicted_total", "counter", None),
    ("floodgate_clients_forgotten_total", "counter", None),
    ("floodgate_table_rebuilds_total", "counter", None),
    ("floodgate_sweeps_total", "counter", None),
    ("floodgate_tracked_clients", "gauge", None),
];

/// What the metric `index` of [`EXPECTED`] must read for `stats`.
fn expected(index: usize, stats: &Stats, tracked: usize) -> u64 {
    [
        stats.admitted,
        stats.rejected,
        stats.admitted_units,
        stats.rejected_units,
        stats.refunded_units,
        stats.released_units,
        stats.in_flight_rejected,
        stats.overflowed,
        stats.created,
        stats.evicted,
        stats.forgotten,
        stats.rebuilds,
        stats.sweeps,
        tracked as u64,
    ][index]
}

/// A counting limiter after a seeded trace that moves every number: a cap
/// that overflows, idle clients swept, forgets, costs other than 1,
/// refunds, releases and refusals by its `in-flight` rule.
fn traced(seed: u64) -> (std::sync::Arc<dyn RateLimiter<u64>>, Stats) {
    let clock = ManualClock::new(0);
    let limiter = Builder::from_rules(&"fixed-window:5/10us,in-flight:6".parse().unwrap())
        .clock(clock.clone())
        .bounds(
            Bounds::new()
                .evict_idle()
                .max_clients(16)
                .on_overflow(Overflow::Admit),
        )
        .counting(true)
        .build::<u64>()
        .unwrap();
    let mut rng = fastrand::Rng::with_seed(seed);
    for _ in 0..20_000 {
        clock.advance(rng.u64(..1_000));
        let key = rng.u64(..64);
        let roll = rng.u8(..100);
        if roll == 0 {
            limiter.forget(&key);
        } else if roll < 30 {
            limiter.release(&key, rng.u64(1..=4));
        } else if roll < 36 {
            let now = limiter.now();
            limiter.refund_at(
                &key,
                now,
                now.saturating_sub(rng.u64(..2_000)),
                rng.u64(1..=4),
            );
        } else {
            limiter.check_n(&key, rng.u64(..=4));
        }
    }
    let stats = limiter.stats().unwrap();
    (limiter, stats)
}

/// One parsed sample: family, type, labels, value.
type Parsed = (String, String, BTreeMap<String, String>, f64);

fn number(number: &MetricNumber) -> f64 {
    number.as_f64()
}

/// The text through the parser, flattened.
fn parse(text: &str) -> Vec<Parsed> {
    let exposition = parse_prometheus(text).unwrap_or_else(|e| panic!("{e:?} in\n{text}"));
    let mut samples = Vec::new();
    for (name, family) in &exposition.families {
        assert!(!family.help.is_empty(), "{name} has no HELP");
        let kind = match family.family_type {
            PrometheusType::Counter => "counter",
            PrometheusType::Gauge => "gauge",
            ref other => panic!("{name} is a {other:?}"),
        };
        for sample in family.iter_samples() {
            let labels = sample
                .get_labelset()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let value = match &sample.value {
                PrometheusValue::Counter(counter) => number(&counter.value),
                PrometheusValue::Gauge(gauge) => number(gauge),
                other => panic!("{name}: {other:?}"),
            };
            samples.push((name.clone(), kind.to_owned(), labels, value));
        }
    }
    samples
}

fn labels(limiter: &str, tier: &str, outcome: Option<&str>) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        ("limiter".to_owned(), limiter.to_owned()),
        ("tier".to_owned(), tier.to_owned()),
    ]);
    if let Some(outcome) = outcome {
        labels.insert("outcome".to_owned(), outcome.to_owned());
    }
    labels
}

/// Every sample the exporters must give for these limiters (name, tier,
/// stats, tracked clients), sorted as the tests sort what they parsed.
fn wanted(limiters: [(&str, &str, &Stats, usize); 2]) -> Vec<Parsed> {
    let mut wanted = Vec::new();
    for (limiter, tier, stats, tracked) in limiters {
        for (index, (name, kind, outcome)) in EXPECTED.into_iter().enumerate() {
            wanted.push((
                name.to_owned(),
                kind.to_owned(),
                labels(limiter, tier, outcome),
                expected(index, stats, tracked) as f64,
            ));
        }
    }
    wanted.sort_by(|a, b| (&a.0, &a.2).cmp(&(&b.0, &b.2)));
    wanted
}

#[test]
fn every_sample_is_its_stats_field() {
    let (api, api_stats) = traced(7);
    let (uploads, uploads_stats) = traced(11);
    // The trace moved every number, so that a swapped field shows.
    for (index, (name, _, _)) in EXPECTED.iter().enumerate() {
        assert!(
            expected(index, &api_stats, api.tracked_clients()) > 0,
            "{name}: {api_stats:?}"
        );
    }

    let mut text = Prometheus::new();
    text.limiter("api", None, &api_stats, api.tracked_clients());
    text.limiter(
        "uploads",
        Some("premium"),
        &uploads_stats,
        uploads.tracked_clients(),
    );
    let text = text.finish();
    // Each family once, HELP then TYPE.
    for (name, kind, _) in EXPECTED {
        assert_eq!(
            text.matches(&format!("# HELP {name} ")).count(),
            1,
            "{name}"
        );
        assert_eq!(text.matches(&format!("# TYPE {name} {kind}\n")).count(), 1);
    }

    let mut samples = parse(&text);
    samples.sort_by(|a, b| (&a.0, &a.2).cmp(&(&b.0, &b.2)));
    let wanted = wanted([
        ("api", "", &api_stats, api.tracked_clients()),
        (
            "uploads",
            "premium",
            &uploads_stats,
            uploads.tracked_clients(),
        ),
    ]);
    assert_eq!(samples, wanted, "\n{text}");
}

#[test]
fn label_values_round_trip_through_the_parser() {
    let (limiter, stats) = traced(3);
    for name in [
        "a\\b",
        "quote \" in it",
        "two\nlines",
        "all \\\" \n\\n of them, {braces}=",
        "ünïcödé",
        "",
    ] {
        let mut text = Prometheus::new();
        text.limiter(name, Some(name), &stats, limiter.tracked_clients());
        let text = text.finish();
        let samples = parse(&text);
        assert_eq!(samples.len(), EXPECTED.len(), "{text}");
        for (family, _, labels, _) in samples {
            assert_eq!(labels["limiter"], name, "{family}");
            assert_eq!(labels["tier"], name, "{family}");
        }
    }
}

#[cfg(feature = "metrics")]
mod facade {
    use super::*;
    use floodgate::export::{describe_metrics, report_metrics};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use metrics_util::MetricKind;

    #[test]
    fn the_recorder_is_told_every_stats_field() {
        let (api, api_stats) = traced(7);
        let (uploads, uploads_stats) = traced(11);
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            describe_metrics();
            // Twice: a second report sets the same values, it does not add.
            for _ in 0..2 {
                report_metrics("api", None, &api_stats, api.tracked_clients());
                report_metrics(
                    "uploads",
                    Some("premium"),
                    &uploads_stats,
                    uploads.tracked_clients(),
                );
            }
        });
        let mut seen = Vec::new();
        for (key, _unit, description, value) in snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let name = key.name().to_owned();
            assert!(description.is_some(), "{name} has no description");
            let labels: BTreeMap<String, String> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let (kind, value) = match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => ("counter", n as f64),
                (MetricKind::Gauge, DebugValue::Gauge(g)) => ("gauge", g.into_inner()),
                other => panic!("{name}: {other:?}"),
            };
            seen.push((name, kind.to_owned(), labels, value));
        }
        seen.sort_by(|a, b| (&a.0, &a.2).cmp(&(&b.0, &b.2)));
        let wanted = wanted([
            ("api", "", &api_stats, api.tracked_clients()),
            (
                "uploads",
                "premium",
                &uploads_stats,
                uploads.tracked_clients(),
            ),
        ]);
        assert_eq!(seen, wanted);
    }
}

/// A Redis store's round trips, errors and fault answers, and its latency
/// histogram, as the parser reads them: here a store with nothing
/// listening, so that each call is a failed round trip the fault rule
/// answers.
#[cfg(feature = "redis")]
#[test]
fn a_redis_stores_round_trips_are_exported() {
    use floodgate::redis::{RedisLimiter, RedisOptions, TimeSource};
    use floodgate::Config;
    let store = RedisLimiter::new(
        "redis://127.0.0.1:1",
        PolicyKind::Gcra,
        Config::per_ticks(1, 1_000).unwrap(),
        RedisOptions::new()
            .time(TimeSource::MILLIS)
            .timeout(Duration::from_millis(200)),
    )
    .unwrap();
    for now in 0..4 {
        store.check_at("a", now);
    }
    let stats = store.redis_stats();
    let mut text = Prometheus::new();
    text.redis("shared \"quota\"", &stats);
    let text = text.finish();
    let exposition = parse_prometheus(&text).unwrap_or_else(|e| panic!("{e:?} in\n{text}"));
    let counter = |name: &str| -> f64 {
        let family = &exposition.families[name];
        let sample = family.iter_samples().next().unwrap();
        assert_eq!(
            sample.get_labelset().unwrap().iter().collect::<Vec<_>>(),
            [(&"limiter".to_owned(), &"shared \"quota\"".to_owned())]
        );
        match &sample.value {
            PrometheusValue::Counter(counter) => number(&counter.value),
            other => panic!("{name}: {other:?}"),
        }
    };
    assert_eq!(counter("floodgate_redis_round_trips_total"), 4.0);
    assert_eq!(counter("floodgate_redis_errors_total"), 4.0);
    assert_eq!(counter("floodgate_redis_fault_answers_total"), 4.0);
    assert_eq!(counter("floodgate_redis_cached_answers_total"), 0.0);
    assert!(matches!(
        exposition.families["floodgate_redis_round_trip_seconds"].family_type,
        PrometheusType::Histogram
    ));
    assert!(text.contains(
        "floodgate_redis_round_trip_seconds_bucket{limiter=\"shared \\\"quota\\\"\",le=\"+Inf\"} 4\n"
    ));
    assert!(text.contains(
        "floodgate_redis_round_trip_seconds_count{limiter=\"shared \\\"quota\\\"\"} 4\n"
    ));
}
