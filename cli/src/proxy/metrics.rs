//! `floodgate proxy --metrics-listen`: the proxy's own counts (responses by
//! status, the time it added) and its limiter's `Stats`, served as
//! Prometheus text on `GET /metrics` by a listener of their own.
//!
//! Counting costs a request two clock reads (four when forwarded) and two
//! or three relaxed atomic adds on counters no lock guards; the text is
//! built only when scraped.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use floodgate::export::Prometheus;
use floodgate::state::Saver;
use floodgate::RateLimiter;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;

use super::{Client, Stats};

/// The upper bounds of the added-time histogram's buckets, in nanoseconds,
/// and as the `le` label writes them: 0.1 ms (a check and a forward on
/// loopback) to 10 s (a long shaping delay). Past the last: `+Inf`.
const BUCKETS: [(u64, &str); 16] = [
    (100_000, "0.0001"),
    (250_000, "0.00025"),
    (500_000, "0.0005"),
    (1_000_000, "0.001"),
    (2_500_000, "0.0025"),
    (5_000_000, "0.005"),
    (10_000_000, "0.01"),
    (25_000_000, "0.025"),
    (50_000_000, "0.05"),
    (100_000_000, "0.1"),
    (250_000_000, "0.25"),
    (500_000_000, "0.5"),
    (1_000_000_000, "1"),
    (2_500_000_000, "2.5"),
    (5_000_000_000, "5"),
    (10_000_000_000, "10"),
];

/// The status codes counted one by one: 100 to 599, all HTTP defines.
const STATUSES: std::ops::Range<u16> = 100..600;

/// What the proxy counts for `/metrics`. Every add and load is Relaxed:
/// each counter is a number on its own that publishes no other memory, and
/// a scrape that sees one request in one counter before another (its
/// status before its time) is off by that request until the next scrape.
pub struct Metrics {
    /// Responses by status code, `STATUSES.start` first.
    statuses: Box<[AtomicU64]>,
    /// Requests per bucket of added time, not cumulative (a request adds
    /// to one bucket only); the last is past every bound.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    /// The added times' sum, in nanoseconds (584 years fit).
    added_nanos: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            statuses: STATUSES.map(|_| AtomicU64::new(0)).collect(),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            added_nanos: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// One response of `status`, to which the proxy added `added`.
    fn responded(&self, status: StatusCode, added: Duration) {
        if let Some(counter) = self
            .statuses
            .get(usize::from(status.as_u16().wrapping_sub(STATUSES.start)))
        {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        let nanos = u64::try_from(added.as_nanos()).unwrap_or(u64::MAX);
        let bucket = BUCKETS.partition_point(|&(bound, _)| bound < nanos);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.added_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The proxy's own families, in the text format.
    fn render(&self, upstream_errors: u64, out: &mut String) {
        use std::fmt::Write as _;
        // Writing to a `String` cannot fail.
        let _ = writeln!(
            out,
            "# HELP floodgate_proxy_requests_total Responses sent, by status code.\n\
             # TYPE floodgate_proxy_requests_total counter"
        );
        for (status, counter) in STATUSES.zip(self.statuses.iter()) {
            let count = counter.load(Ordering::Relaxed);
            if count > 0 {
                let _ = writeln!(
                    out,
                    "floodgate_proxy_requests_total{{status=\"{status}\"}} {count}"
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP floodgate_proxy_upstream_errors_total Requests the upstream did not answer \
             (each answered 502).\n\
             # TYPE floodgate_proxy_upstream_errors_total counter\n\
             floodgate_proxy_upstream_errors_total {upstream_errors}"
        );
        let _ = writeln!(
            out,
            "# HELP floodgate_proxy_added_seconds The time the proxy added to a request: \
             from its arrival to its response's head, less the wait for the upstream's.\n\
             # TYPE floodgate_proxy_added_seconds histogram"
        );
        let mut cumulative = 0u64;
        for (index, counter) in self.buckets.iter().enumerate() {
            cumulative += counter.load(Ordering::Relaxed);
            let le = BUCKETS.get(index).map_or("+Inf", |&(_, le)| le);
            let _ = writeln!(
                out,
                "floodgate_proxy_added_seconds_bucket{{le=\"{le}\"}} {cumulative}"
            );
        }
        let sum = Duration::from_nanos(self.added_nanos.load(Ordering::Relaxed)).as_secs_f64();
        let _ = writeln!(
            out,
            "floodgate_proxy_added_seconds_sum {sum}\n\
             floodgate_proxy_added_seconds_count {cumulative}"
        );
    }
}

/// The whole scrape: the limiter's stats (in memory) or its Redis store's,
/// then the proxy's own.
fn scrape(scraped: &Scraped) -> String {
    let mut text = Prometheus::new();
    if let Some(limiter) = &scraped.limiter {
        if let Some(snapshot) = limiter.stats() {
            text.limiter(&scraped.name, None, &snapshot, limiter.tracked_clients());
        }
    }
    #[cfg(feature = "redis")]
    if let Some(redis) = &scraped.redis {
        text.redis(&scraped.name, &redis.redis_stats());
    }
    let mut out = text.finish();
    scraped
        .metrics
        .render(scraped.stats.snapshot()[3], &mut out);
    if let Some(saver) = &scraped.saver {
        render_saves(saver.saves(), saver.failures(), &mut out);
    }
    out
}

/// `--state`'s saves, in the text format: those made and those that
/// failed (each logged, and tried again at the next `--state-every`).
fn render_saves(saves: u64, failures: u64, out: &mut String) {
    use std::fmt::Write as _;
    // Writing to a `String` cannot fail.
    let _ = writeln!(
        out,
        "# HELP floodgate_proxy_state_saves_total Saves of the state to --state that were made.\n\
         # TYPE floodgate_proxy_state_saves_total counter\n\
         floodgate_proxy_state_saves_total {saves}\n\
         # HELP floodgate_proxy_state_save_failures_total Saves of the state to --state that \
         failed, each logged on standard error and tried again at the next --state-every.\n\
         # TYPE floodgate_proxy_state_save_failures_total counter\n\
         floodgate_proxy_state_save_failures_total {failures}"
    );
}

/// How many of the clients refused most `/offenders` lists.
const LISTED: usize = 20;

/// `/offenders`: the clients refused most since the previous request of
/// it (each request begins a new interval), as JSON; `None` for a store
/// that keeps none (Redis).
fn offenders(scraped: &Scraped) -> Option<String> {
    let report = scraped.limiter.as_ref()?.take_offenders()?;
    let listed: Vec<serde_json::Value> = report
        .offenders
        .iter()
        .take(LISTED)
        .map(|offender| {
            let client = match &offender.key {
                Client::Ip(ip) => ip.to_string(),
                Client::Text(text) => text.clone(),
            };
            serde_json::json!({
                "client": client,
                "refused": offender.refused,
                "units": offender.units,
                "error": offender.error,
            })
        })
        .collect();
    Some(
        serde_json::json!({
            "offenders": listed,
            "recorded": report.recorded,
            "unattributed": report.unattributed,
            "error_bound": report.error_bound,
        })
        .to_string()
            + "\n",
    )
}

/// What the metrics listener needs to answer.
pub struct Scraped {
    /// The in-memory limiter (none with Redis).
    pub limiter: Option<Arc<dyn RateLimiter<Client>>>,
    /// The Redis store, whose round trips `/metrics` reports.
    #[cfg(feature = "redis")]
    pub redis: Option<floodgate::redis::AsyncRedisLimiter>,
    /// The `limiter` label: the policy's name.
    pub name: String,
    /// The counts of the stderr line (the upstream errors).
    pub stats: Arc<Stats>,
    /// The proxy's own counts.
    pub metrics: Arc<Metrics>,
    /// `--state`'s saver, whose saves and failures are counted.
    pub saver: Option<Arc<Saver>>,
}

type MetricsBody = Full<Bytes>;

/// Answers one request on the metrics listener.
fn answer(scraped: &Scraped, request: &Request<Incoming>) -> Response<MetricsBody> {
    floodgate_cli::scrapes::answer(
        request,
        || scrape(scraped),
        || offenders(scraped).ok_or("the Redis store keeps no offenders"),
    )
}

/// Serves `/metrics` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, scraped: Arc<Scraped>) {
    floodgate_cli::scrapes::serve(listener, "proxy", move |request| answer(&scraped, request))
        .await;
}

/// How long a forwarded request waited for the upstream's response head,
/// put in the response's extensions by [`Timed`] for [`Measured`].
#[derive(Clone, Copy)]
struct UpstreamWait(Duration);

/// The upstream service, timed: how long its response head took.
#[derive(Clone)]
pub struct Timed<S>(pub S);

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B> tower::Service<Request<Incoming>> for Timed<S>
where
    S: tower::Service<Request<Incoming>, Response = Response<B>>,
    S::Future: Send + 'static,
    B: 'static,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = BoxFuture<Response<B>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        let start = Instant::now();
        let response = self.0.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            response
                .extensions_mut()
                .insert(UpstreamWait(start.elapsed()));
            Ok(response)
        })
    }
}

/// The whole proxy's service, measured: each response's status, and the
/// time from the request's arrival to the response's head less the
/// upstream's [`UpstreamWait`].
#[derive(Clone)]
pub struct Measured<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S> Measured<S> {
    /// `inner`, counted in `metrics`.
    pub fn new(inner: S, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }
}

impl<S, Q, B> tower::Service<Request<Q>> for Measured<S>
where
    S: tower::Service<Request<Q>, Response = Response<B>>,
    S::Future: Send + 'static,
    B: 'static,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = BoxFuture<Response<B>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Q>) -> Self::Future {
        let start = Instant::now();
        let response = self.inner.call(request);
        let metrics = Arc::clone(&self.metrics);
        Box::pin(async move {
            let mut response = response.await?;
            let upstream = response
                .extensions_mut()
                .remove::<UpstreamWait>()
                .map_or(Duration::ZERO, |wait| wait.0);
            metrics.responded(response.status(), start.elapsed().saturating_sub(upstream));
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_in_the_text_format() {
        let metrics = Metrics::default();
        metrics.responded(StatusCode::OK, Duration::from_micros(50));
        metrics.responded(StatusCode::OK, Duration::from_millis(1));
        metrics.responded(StatusCode::TOO_MANY_REQUESTS, Duration::from_secs(60));
        let mut out = String::new();
        metrics.render(2, &mut out);
        for line in [
            "floodgate_proxy_requests_total{status=\"200\"} 2\n",
            "floodgate_proxy_requests_total{status=\"429\"} 1\n",
            "floodgate_proxy_upstream_errors_total 2\n",
            "floodgate_proxy_added_seconds_bucket{le=\"0.0001\"} 1\n",
            // A bound is inclusive: 1 ms is in `le="0.001"`.
            "floodgate_proxy_added_seconds_bucket{le=\"0.001\"} 2\n",
            "floodgate_proxy_added_seconds_bucket{le=\"10\"} 2\n",
            "floodgate_proxy_added_seconds_bucket{le=\"+Inf\"} 3\n",
            "floodgate_proxy_added_seconds_sum 60.00105\n",
            "floodgate_proxy_added_seconds_count 3\n",
        ] {
            assert!(out.contains(line), "{line:?} in\n{out}");
        }
        assert!(!out.contains("status=\"500\""));
    }

    #[test]
    fn the_saves_in_the_text_format() {
        let mut out = String::new();
        render_saves(4, 2, &mut out);
        for line in [
            "# TYPE floodgate_proxy_state_saves_total counter\n",
            "floodgate_proxy_state_saves_total 4\n",
            "# TYPE floodgate_proxy_state_save_failures_total counter\n",
            "floodgate_proxy_state_save_failures_total 2\n",
        ] {
            assert!(out.contains(line), "{line:?} in\n{out}");
        }
    }
}
