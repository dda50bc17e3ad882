//! A limiter's [`Stats`] for a monitoring system: as Prometheus text
//! ([`Prometheus`], always there: it is string formatting, no dependency),
//! or through the `metrics` facade (`report_metrics`, feature `metrics`:
//! the application installs the recorder it exports with).
//!
//! Both give the same names and labels; `docs/metrics.md` lists every
//! metric in one table. Every sample carries the labels `limiter` (the name
//! the application gives) and `tier`, which is empty for a limiter without
//! tiers: Prometheus treats an empty label as an absent one
//! (`{tier=""}` selects the untiered series), and one label set per family
//! is what strict parsers and the `metrics` recorders expect.
//!
//! The numbers are a snapshot the application takes when it is scraped
//! ([`RateLimiter::stats`](crate::RateLimiter::stats) and
//! [`RateLimiter::tracked_clients`](crate::RateLimiter::tracked_clients)),
//! so exporting costs nothing between scrapes. The decision counters stay
//! at 0 unless the limiter was built with
//! [`Builder::counting`](crate::Builder::counting).
//!
//! ```
//! use floodgate::export::Prometheus;
//! use floodgate::{Builder, PolicyKind, RateLimiter};
//! use std::time::Duration;
//!
//! let api = Builder::new(PolicyKind::Gcra, 100, Duration::from_secs(1))
//!     .counting(true)
//!     .build::<str>()?;
//! api.check("alice");
//!
//! // In the handler of `GET /metrics`:
//! let mut text = Prometheus::new();
//! if let Some(stats) = api.stats() {
//!     text.limiter("api", None, &stats, api.tracked_clients());
//! }
//! let body: String = text.finish();
//! assert!(body.contains("floodgate_decisions_total{limiter=\"api\",tier=\"\",outcome=\"admitted\"} 1\n"));
//! # Ok::<(), floodgate::ConfigError>(())
//! ```

use std::fmt::Write as _;

use crate::Stats;

/// Whether a family only goes up, or is a level.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

/// One metric family: its name, type and help.
struct Family {
    name: &'static str,
    kind: Kind,
    help: &'static str,
}

/// Every family, in the order they are written. The one list both
/// exporters and `docs/metrics.md` follow.
const FAMILIES: [Family; 12] = [
    Family {
        name: "floodgate_decisions_total",
        kind: Kind::Counter,
        help: "Requests decided, by outcome (counted when the limiter is built with counting).",
    },
    Family {
        name: "floodgate_decision_units_total",
        kind: Kind::Counter,
        help: "The costs of the requests decided, in the limit's units, by outcome.",
    },
    Family {
        name: "floodgate_refunded_units_total",
        kind: Kind::Counter,
        help: "Units given back by refunds, in the limit's units (counted when the limiter is built with counting).",
    },
    Family {
        name: "floodgate_released_units_total",
        kind: Kind::Counter,
        help: "Units released from in-flight rules (counted when the limiter is built with counting).",
    },
    Family {
        name: "floodgate_in_flight_rejections_total",
        kind: Kind::Counter,
        help: "Requests refused by an in-flight rule, each also a rejected decision (counted when the limiter is built with counting).",
    },
    Family {
        name: "floodgate_overflow_decisions_total",
        kind: Kind::Counter,
        help: "Requests answered by the overflow rule, the client cap being full.",
    },
    Family {
        name: "floodgate_clients_created_total",
        kind: Kind::Counter,
        help: "Clients whose state was created.",
    },
    Family {
        name: "floodgate_clients_evicted_total",
        kind: Kind::Counter,
        help: "Clients removed by sweeps, as idle.",
    },
    Family {
        name: "floodgate_clients_forgotten_total",
        kind: Kind::Counter,
        help: "Clients removed by forget.",
    },
    Family {
        name: "floodgate_table_rebuilds_total",
        kind: Kind::Counter,
        help: "Rebuilds of the client table (growth, or dropping evicted slots).",
    },
    Family {
        name: "floodgate_sweeps_total",
        kind: Kind::Counter,
        help: "Sweeps for idle clients run.",
    },
    Family {
        name: "floodgate_tracked_clients",
        kind: Kind::Gauge,
        help: "Clients tracked now.",
    },
];

/// One sample of a limiter: its family's index in [`FAMILIES`], its
/// `outcome` if the family has one, its value.
type Sample = (usize, Option<&'static str>, u64);

/// A limiter's samples, family by family. A limiter that does not count
/// its decisions (built without `counting(true)`) has no samples of the
/// decisions' families rather than zeros that read as nothing decided.
fn samples(stats: &Stats, tracked_clients: usize) -> Vec<Sample> {
    // The first eight samples are the decisions' (families 0 to 5).
    let first = if stats.decisions_counted { 0 } else { 8 };
    let all = [
        (0, Some("admitted"), stats.admitted),
        (0, Some("rejected"), stats.rejected),
        (1, Some("admitted"), stats.admitted_units),
        (1, Some("rejected"), stats.rejected_units),
        (2, None, stats.refunded_units),
        (3, None, stats.released_units),
        (4, None, stats.in_flight_rejected),
        (5, None, stats.overflowed),
        (6, None, stats.created),
        (7, None, stats.evicted),
        (8, None, stats.forgotten),
        (9, None, stats.rebuilds),
        (10, None, stats.sweeps),
        // A count of clients always fits: `usize` is at most 64 bits.
        (11, None, tracked_clients as u64),
    ];
    all[first..].to_vec()
}

/// The Prometheus text exposition (format 0.0.4) of one or more limiters:
/// each family once, with `# HELP` and `# TYPE`, then its samples for every
/// limiter given.
///
/// Give each `(limiter, tier)` pair once: Prometheus rejects a scrape that
/// repeats a series. Serve the text with the content type
/// [`Prometheus::CONTENT_TYPE`].
#[derive(Clone, Debug, Default)]
pub struct Prometheus {
    /// Each limiter's escaped `limiter` and `tier` labels, and its samples.
    limiters: Vec<(String, Vec<Sample>)>,
    /// Each Redis store's escaped `limiter` label, and its stats.
    #[cfg(feature = "redis")]
    redis: Vec<(String, crate::redis::RedisStats)>,
}

impl Prometheus {
    /// The content type of the text: Prometheus's text format, version
    /// 0.0.4.
    pub const CONTENT_TYPE: &'static str = "text/plain; version=0.0.4; charset=utf-8";

    /// An exposition with no limiter yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the snapshot `stats` of the limiter called `limiter`, of
    /// `tier` if it is one tier's (`None`: the label is empty), tracking
    /// `tracked_clients` clients.
    pub fn limiter(
        &mut self,
        limiter: &str,
        tier: Option<&str>,
        stats: &Stats,
        tracked_clients: usize,
    ) -> &mut Self {
        let mut labels = String::from("limiter=\"");
        escape_label_value(&mut labels, limiter);
        labels.push_str("\",tier=\"");
        escape_label_value(&mut labels, tier.unwrap_or(""));
        labels.push('"');
        self.limiters
            .push((labels, samples(stats, tracked_clients)));
        self
    }

    /// Adds what the Redis store of the limiter called `limiter` did
    /// ([`RedisStats`](crate::redis::RedisStats)): its round trips, their
    /// errors and latency (a histogram), the fault rule's answers and the
    /// rejection cache's.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn redis(&mut self, limiter: &str, stats: &crate::redis::RedisStats) -> &mut Self {
        let mut labels = String::from("limiter=\"");
        escape_label_value(&mut labels, limiter);
        labels.push('"');
        self.redis.push((labels, stats.clone()));
        self
    }

    /// The text: empty if nothing was added.
    pub fn finish(self) -> String {
        let mut out = String::new();
        #[cfg(feature = "redis")]
        redis_families(&self.redis, &mut out);
        if self.limiters.is_empty() {
            return out;
        }
        for (index, family) in FAMILIES.iter().enumerate() {
            let kind = match family.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
            };
            // Writing to a `String` cannot fail.
            let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
            let _ = writeln!(out, "# TYPE {} {kind}", family.name);
            for (labels, samples) in &self.limiters {
                for (_, outcome, value) in samples.iter().filter(|s| s.0 == index) {
                    let _ = match outcome {
                        Some(outcome) => writeln!(
                            out,
                            "{}{{{labels},outcome=\"{outcome}\"}} {value}",
                            family.name
                        ),
                        None => writeln!(out, "{}{{{labels}}} {value}", family.name),
                    };
                }
            }
        }
        out
    }
}

/// The Redis stores' families, each once (none without a store).
#[cfg(feature = "redis")]
fn redis_families(stores: &[(String, crate::redis::RedisStats)], out: &mut String) {
    if stores.is_empty() {
        return;
    }
    type Of = fn(&crate::redis::RedisStats) -> u64;
    let counters: [(&str, &str, Of); 9] = [
        (
            "floodgate_redis_round_trips_total",
            "Round trips to Redis: script calls, and batches of them.",
            |s| s.calls,
        ),
        (
            "floodgate_redis_errors_total",
            "Round trips to Redis that failed (unreachable, timed out, an error reply).",
            |s| s.errors,
        ),
        (
            "floodgate_redis_fault_answers_total",
            "Calls the fault rule answered, Redis having failed.",
            |s| s.faults,
        ),
        (
            "floodgate_redis_cached_answers_total",
            "Decisions the local rejection cache answered without a round trip.",
            |s| s.answered_locally,
        ),
        (
            "floodgate_redis_leases_total",
            "Leases taken out of Redis, a round trip each (ahead of need or not).",
            |s| s.leases,
        ),
        (
            "floodgate_redis_leased_units_total",
            "Units the leases took out of Redis.",
            |s| s.units_leased,
        ),
        (
            "floodgate_redis_lease_answers_total",
            "Decisions answered from a lease held here, without a round trip.",
            |s| s.answered_from_leases,
        ),
        (
            "floodgate_redis_lease_units_given_back_total",
            "Units of refunds that went back into the lease they came from.",
            |s| s.units_given_back,
        ),
        (
            "floodgate_redis_lease_units_lapsed_total",
            "Units whose lease ended before they were spent.",
            |s| s.units_lapsed,
        ),
    ];
    // Writing to a `String` cannot fail.
    for (name, help, of) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (labels, stats) in stores {
            let _ = writeln!(out, "{name}{{{labels}}} {}", of(stats));
        }
    }
    let name = "floodgate_redis_round_trip_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} The latency of the round trips to Redis.\n# TYPE {name} histogram"
    );
    for (labels, stats) in stores {
        for (bound, count) in &stats.latency_buckets {
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels},le=\"{}\"}} {count}",
                bound.as_secs_f64()
            );
        }
        // The histogram's own count, not `calls`: its buckets and count
        // are then one snapshot, consistent whatever was in flight.
        let count = stats.latency_count;
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {}",
            stats.latency_sum.as_secs_f64()
        );
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

/// Appends `value` escaped as the text format asks of a label value: a
/// backslash, a double quote and a line feed each behind a backslash
/// (`\n` for the line feed).
pub fn escape_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Reports the snapshot `stats` of the limiter called `limiter` (of `tier`,
/// if it is one tier's) to the `metrics` recorder the application
/// installed, under the names and labels of [`Prometheus`]: the counters
/// set with `absolute`, the gauge with `set`.
///
/// A limiter counts by itself; the facade only passes values on, so call
/// this periodically or when scraped (from the handler of the exporter's
/// endpoint, or a task every few seconds). Call [`describe_metrics`] once
/// after installing the recorder for the help texts.
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn report_metrics(limiter: &str, tier: Option<&str>, stats: &Stats, tracked_clients: usize) {
    use metrics::Label;

    for (index, outcome, value) in samples(stats, tracked_clients) {
        let family = &FAMILIES[index];
        let mut labels = Vec::with_capacity(3);
        labels.push(Label::new("limiter", limiter.to_owned()));
        labels.push(Label::new("tier", tier.unwrap_or("").to_owned()));
        if let Some(outcome) = outcome {
            labels.push(Label::new("outcome", outcome));
        }
        match family.kind {
            Kind::Counter => metrics::counter!(family.name, labels).absolute(value),
            // A gauge is a float; a count of clients is exact in one up to
            // 2^53.
            Kind::Gauge => metrics::gauge!(family.name, labels).set(value as f64),
        }
    }
}

/// Reports what a Redis store did to the `metrics` recorder, under the
/// names of [`Prometheus::redis`]: its round trips, errors, fault-rule and
/// rejection-cache answers (counters set with `absolute`). The latency
/// histogram is in the Prometheus text only: the facade's histograms take
/// one observation at a time, not a store's buckets.
#[cfg(all(feature = "metrics", feature = "redis"))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "metrics", feature = "redis"))))]
pub fn report_redis_metrics(limiter: &str, stats: &crate::redis::RedisStats) {
    for (name, value) in [
        ("floodgate_redis_round_trips_total", stats.calls),
        ("floodgate_redis_errors_total", stats.errors),
        ("floodgate_redis_fault_answers_total", stats.faults),
        (
            "floodgate_redis_cached_answers_total",
            stats.answered_locally,
        ),
    ] {
        metrics::counter!(name, "limiter" => limiter.to_owned()).absolute(value);
    }
}

/// Gives the installed `metrics` recorder the help text of every family
/// [`report_metrics`] reports: once, after installing it.
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe_metrics() {
    for family in &FAMILIES {
        match family.kind {
            Kind::Counter => metrics::describe_counter!(family.name, family.help),
            Kind::Gauge => metrics::describe_gauge!(family.name, family.help),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut out = String::new();
        escape_label_value(&mut out, "a\\b\"c\nd é");
        assert_eq!(out, r#"a\\b\"c\nd é"#);
    }

    #[test]
    fn nothing_to_say_is_an_empty_text() {
        assert_eq!(Prometheus::new().finish(), "");
    }

    #[test]
    fn each_family_once_then_every_limiter() {
        let stats = Stats {
            admitted: 3,
            decisions_counted: true,
            ..Stats::default()
        };
        let counted = Stats {
            decisions_counted: true,
            ..Stats::default()
        };
        let mut text = Prometheus::new();
        text.limiter("a", None, &stats, 1)
            .limiter("b", Some("gold"), &counted, 0)
            .limiter("c", None, &Stats::default(), 0);
        let text = text.finish();
        assert_eq!(text.matches("# TYPE ").count(), FAMILIES.len());
        assert_eq!(text.matches("# HELP ").count(), FAMILIES.len());
        let decisions: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with("floodgate_decisions_total{"))
            .collect();
        assert_eq!(
            decisions,
            [
                r#"floodgate_decisions_total{limiter="a",tier="",outcome="admitted"} 3"#,
                r#"floodgate_decisions_total{limiter="a",tier="",outcome="rejected"} 0"#,
                r#"floodgate_decisions_total{limiter="b",tier="gold",outcome="admitted"} 0"#,
                r#"floodgate_decisions_total{limiter="b",tier="gold",outcome="rejected"} 0"#,
            ]
        );
        // "c" counts no decisions: it has no sample of theirs, but its
        // store's.
        assert!(text.ends_with("floodgate_tracked_clients{limiter=\"c\",tier=\"\"} 0\n"));
    }
}
