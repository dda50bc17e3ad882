//! What the service counts, served as Prometheus text at
//! `--metrics-listen`: each limit's hits as envoyproxy/ratelimit names them
//! (`total_hits`, `over_limit`, `near_limit`, `within_limit`,
//! `shadow_mode`), the calls by answer, and each limit's limiter (its
//! clients, what its store did) in the library's own families; and at
//! `/offenders`, the clients each limit refused most.
//!
//! Every count is a relaxed atomic add: each is read alone, by a scrape,
//! and no decision depends on it, so no ordering with any other memory is
//! needed; a scrape sees every add that happened before it and may miss
//! one under way.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use arc_swap::ArcSwap;
use floodgate::export::{escape_label_value, Prometheus};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use tokio::net::TcpListener;

use super::decide::{readable_client, Limits};

/// One limit's hits, in units (a call of cost 3 is 3 hits), as the
/// reference counts them.
#[derive(Debug, Default)]
pub struct LimitStats {
    /// Every hit a descriptor of this limit asked for.
    pub total_hits: AtomicU64,
    /// Hits this limit refused (with `shadow_mode`, let through all the
    /// same).
    pub over_limit: AtomicU64,
    /// Hits it admitted with less than a fifth of the limit left after
    /// them (the reference's 80% threshold).
    pub near_limit: AtomicU64,
    /// Hits it admitted.
    pub within_limit: AtomicU64,
    /// Hits refused but let through by `shadow_mode`.
    pub shadow_mode: AtomicU64,
}

impl LimitStats {
    /// Its counts, in the order of the families: total, over, near,
    /// within, shadow.
    fn snapshot(&self) -> [u64; 5] {
        [
            &self.total_hits,
            &self.over_limit,
            &self.near_limit,
            &self.within_limit,
            &self.shadow_mode,
        ]
        .map(|counter| counter.load(Ordering::Relaxed))
    }

    /// Counts a descriptor's `cost` hits, admitted or not, by a limit of
    /// `limit` units that left `remaining`.
    pub(super) fn count(
        &self,
        cost: u64,
        admitted: bool,
        shadow: bool,
        limit: u64,
        remaining: u64,
    ) {
        self.total_hits.fetch_add(cost, Ordering::Relaxed);
        if admitted {
            self.within_limit.fetch_add(cost, Ordering::Relaxed);
            // Less than a fifth left: remaining < limit / 5, in integers.
            if remaining.saturating_mul(5) < limit {
                self.near_limit.fetch_add(cost, Ordering::Relaxed);
            }
        } else {
            self.over_limit.fetch_add(cost, Ordering::Relaxed);
            if shadow {
                self.shadow_mode.fetch_add(cost, Ordering::Relaxed);
            }
        }
    }
}

/// The most descriptor values a `detailed_metric` limit names series by:
/// the hits of a value first seen past them count under `key="_other"`,
/// so that a flood of values (a client per request) cannot grow memory
/// or the scrape without limit. A value's series is its key of up to
/// 4,096 bytes and five counters: at most about 4 MB a limit.
pub const DETAILED_VALUES: usize = 1_000;

/// A `detailed_metric` limit's hits per descriptor value, under the
/// reference's per-value stats key (`domain.key_value`), at most
/// [`DETAILED_VALUES`] of them.
#[derive(Debug, Default)]
pub struct DetailedStats {
    /// Read-locked to count a value already named; write-locked to name a
    /// new one.
    values: RwLock<HashMap<String, LimitStats>>,
    /// The values past the bound.
    other: LimitStats,
}

impl DetailedStats {
    /// Counts as [`LimitStats::count`] under the value named `key`, or
    /// `_other` past the bound.
    pub(super) fn count(
        &self,
        key: String,
        cost: u64,
        admitted: bool,
        shadow: bool,
        limit: u64,
        remaining: u64,
    ) {
        let count = |stats: &LimitStats| stats.count(cost, admitted, shadow, limit, remaining);
        // A lock poisoned by a panic elsewhere holds counters still whole.
        if let Some(stats) = self
            .values
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return count(stats);
        }
        let mut values = self.values.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(stats) = values.get(&key) {
            count(stats);
        } else if values.len() < DETAILED_VALUES {
            count(values.entry(key).or_default());
        } else {
            count(&self.other);
        }
    }

    /// Each value's stats key and counts, sorted by key, then `_other`'s
    /// when it counted any.
    fn snapshot(&self) -> Vec<(String, [u64; 5])> {
        let values = self.values.read().unwrap_or_else(PoisonError::into_inner);
        let mut rows: Vec<(String, [u64; 5])> = values
            .iter()
            .map(|(key, stats)| (key.clone(), stats.snapshot()))
            .collect();
        drop(values);
        rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let other = self.other.snapshot();
        if other[0] > 0 {
            rows.push(("_other".to_owned(), other));
        }
        rows
    }
}

/// The calls answered, by their answer.
#[derive(Debug, Default)]
pub struct CallStats {
    /// Answered OK.
    pub ok: AtomicU64,
    /// Answered OVER_LIMIT.
    pub over_limit: AtomicU64,
    /// Refused as INVALID_ARGUMENT.
    pub invalid: AtomicU64,
}

impl CallStats {
    pub(super) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The scrape: the calls, each limit's hits, then each limiter's families.
pub fn render(limits: &Limits, calls: &CallStats) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP floodgate_rls_calls_total ShouldRateLimit calls, by answer.\n\
         # TYPE floodgate_rls_calls_total counter"
    );
    for (code, counter) in [
        ("ok", &calls.ok),
        ("over_limit", &calls.over_limit),
        ("invalid", &calls.invalid),
    ] {
        let _ = writeln!(
            out,
            "floodgate_rls_calls_total{{code=\"{code}\"}} {}",
            counter.load(Ordering::Relaxed)
        );
    }
    let mut counted: Vec<(&str, &LimitStats)> = limits.stats().collect();
    counted.sort_unstable_by_key(|(id, _)| *id);
    // Each series' labels and counts: a limit's own, or with
    // `detailed_metric` one per descriptor value in its place.
    let mut rows: Vec<(String, [u64; 5])> = Vec::with_capacity(counted.len());
    for (id, stats) in &counted {
        let mut label = String::from("limit=\"");
        escape_label_value(&mut label, id);
        label.push('"');
        match limits.detailed_stats(id) {
            None => rows.push((label, stats.snapshot())),
            Some(detailed) => {
                for (key, counts) in detailed.snapshot() {
                    let mut labels = label.clone();
                    labels.push_str(",key=\"");
                    escape_label_value(&mut labels, &key);
                    labels.push('"');
                    rows.push((labels, counts));
                }
            }
        }
    }
    let families: [(&str, &str); 5] = [
        (
            "floodgate_rls_total_hits_total",
            "Hits (a call's cost) asked of each limit.",
        ),
        (
            "floodgate_rls_over_limit_total",
            "Hits each limit refused (shadow_mode's too).",
        ),
        (
            "floodgate_rls_near_limit_total",
            "Hits admitted with less than a fifth of the limit left.",
        ),
        (
            "floodgate_rls_within_limit_total",
            "Hits each limit admitted.",
        ),
        (
            "floodgate_rls_shadow_mode_total",
            "Hits refused but let through by shadow_mode.",
        ),
    ];
    for (index, (name, help)) in families.into_iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (labels, counts) in &rows {
            let _ = writeln!(out, "{name}{{{labels}}} {}", counts[index]);
        }
    }
    let mut prometheus = Prometheus::new();
    for (id, _) in &counted {
        if let Some(limiter) = limits.limiter(id) {
            if let Some(stats) = limiter.stats() {
                prometheus.limiter(id, None, &stats, limiter.tracked_clients());
            }
        }
    }
    out.push_str(&prometheus.finish());
    out
}

/// Serves `GET /metrics` on `listener` until its task is dropped.
pub async fn serve(listener: TcpListener, limits: Arc<ArcSwap<Limits>>, calls: Arc<CallStats>) {
    crate::scrapes::serve(listener, "rls", move |request| {
        answer(&limits, &calls, request)
    })
    .await;
}

fn answer(
    limits: &ArcSwap<Limits>,
    calls: &CallStats,
    request: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    crate::scrapes::answer(
        request,
        || render(&limits.load(), calls),
        || Ok(offenders(&limits.load())),
    )
}

/// How many of the clients refused most `/offenders` lists.
const LISTED: usize = 20;

/// `/offenders`: the clients refused most since the previous request of
/// it (each request begins a new interval in every limiter), across
/// limits, as JSON: each with its limit's id and its descriptor's entries
/// (`key=value,key=value`), ranked by refusals; and each limit that
/// refused anyone, with its summary's counts and error bound
/// ([`floodgate::offenders::Report`]).
pub fn offenders(limits: &Limits) -> String {
    let mut ids: Vec<&str> = limits.stats().map(|(id, _)| id).collect();
    ids.sort_unstable();
    let mut listed = Vec::new();
    let mut summaries = Vec::new();
    for id in ids {
        let Some(report) = limits.limiter(id).and_then(|l| l.take_offenders()) else {
            continue;
        };
        if report.recorded + report.unattributed == 0 {
            continue;
        }
        summaries.push(serde_json::json!({
            "limit": id,
            "recorded": report.recorded,
            "unattributed": report.unattributed,
            "error_bound": report.error_bound,
        }));
        // A report is ranked already: its first `LISTED` are all that can
        // be among the first `LISTED` of every limit.
        listed.extend(
            report
                .offenders
                .into_iter()
                .take(LISTED)
                .map(|offender| (id, offender)),
        );
    }
    // Most refusals first; of equals, the surer count, then by limit.
    listed.sort_by_key(|(id, offender)| (std::cmp::Reverse(offender.refused), offender.error, *id));
    let listed: Vec<serde_json::Value> = listed
        .into_iter()
        .take(LISTED)
        .map(|(id, offender)| {
            serde_json::json!({
                "limit": id,
                "client": readable_client(&offender.key),
                "refused": offender.refused,
                "units": offender.units,
                "error": offender.error,
            })
        })
        .collect();
    serde_json::json!({ "offenders": listed, "limits": summaries }).to_string() + "\n"
}
