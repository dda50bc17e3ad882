//! What the Redis store did: its round trips (calls, errors, a histogram of
//! their latency), the fault rule's answers and the rejection cache's, and
//! the one log line an operator needs when Redis stops answering and when
//! it is back.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::RedisError;

/// The upper bounds of the latency histogram's buckets: a loopback round
/// trip is tens of microseconds, a network's hundreds, a stalled server's
/// the timeout (250 ms by default).
pub const LATENCY_BUCKETS: [Duration; 12] = [
    Duration::from_micros(50),
    Duration::from_micros(100),
    Duration::from_micros(250),
    Duration::from_micros(500),
    Duration::from_millis(1),
    Duration::from_micros(2_500),
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
];

/// A snapshot of the Redis store's work, read with
/// [`RedisLimiter::redis_stats`](super::RedisLimiter::redis_stats) (or the
/// async limiter's). Each number is exact once the calls that moved it have
/// returned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Round trips to Redis: script calls, and batches of them (one each).
    pub calls: u64,
    /// Round trips that failed: the server unreachable, a timeout, an
    /// error reply.
    pub errors: u64,
    /// Calls the fault rule answered, Redis having failed.
    pub faults: u64,
    /// Decisions the rejection cache answered without a round trip.
    pub answered_locally: u64,
    /// Round trips by latency: for each of [`LATENCY_BUCKETS`], how many
    /// took at most that long (cumulative, as Prometheus's `le` buckets).
    pub latency_buckets: Vec<(Duration, u64)>,
    /// The round trips the histogram holds, however long they took (its
    /// `+Inf` bucket): `calls`, once the calls counted have returned.
    pub latency_count: u64,
    /// The round trips' total latency.
    pub latency_sum: Duration,
    /// Leases taken ([`RedisOptions::leasing`](super::RedisOptions::leasing)):
    /// a round trip each.
    pub leases: u64,
    /// Of `leases`, those taken ahead of need, before the units held ran
    /// out.
    pub leases_ahead: u64,
    /// Units the leases took out of Redis.
    pub units_leased: u64,
    /// Decisions answered from a lease, with no round trip.
    pub answered_from_leases: u64,
    /// Units of refunds that went back into the lease they came from.
    pub units_given_back: u64,
    /// Units whose lease ended before they were spent.
    pub units_lapsed: u64,
    /// Of `units_lapsed`, those Redis took back: an ended lease's rest is
    /// given back by the next lease of its client that lands here (a
    /// window rule whose window ended takes nothing back).
    pub units_returned: u64,
}

/// The counters behind [`RedisStats`]. Every field is Relaxed: a counter
/// publishes nothing and orders nothing, it is read for reporting only.
#[derive(Debug, Default)]
pub(crate) struct RoundTrips {
    calls: AtomicU64,
    errors: AtomicU64,
    /// Per bucket, not cumulative (one add per round trip); the last is
    /// the overflow bucket, past the largest bound.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
    /// Whether Redis answered the last round trip: false once one fails,
    /// true again once one succeeds, each change logged once.
    unreachable: AtomicBool,
}

impl RoundTrips {
    /// Counts a round trip that began at `start` and came to `result`.
    pub(crate) fn done<T>(&self, start: Instant, result: &Result<T, RedisError>) {
        let took = start.elapsed();
        self.calls.fetch_add(1, Ordering::Relaxed);
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|&bound| took <= bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        match result {
            Ok(_) => {
                // A load first: the common case (Redis answering, as it
                // did) writes nothing shared beyond the counters.
                if self.unreachable.load(Ordering::Relaxed)
                    && self.unreachable.swap(false, Ordering::Relaxed)
                {
                    tracing::info!("floodgate: Redis answers again");
                }
            }
            Err(error) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                if !self.unreachable.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        %error,
                        "floodgate: Redis did not answer ({error}): the fault rule answers \
                         until it does"
                    );
                }
            }
        }
    }

    /// The round trips' part of a snapshot.
    pub(crate) fn snapshot(&self, faults: u64, answered_locally: u64) -> RedisStats {
        let mut cumulative = 0;
        let latency_buckets = LATENCY_BUCKETS
            .iter()
            .zip(&self.buckets)
            .map(|(&bound, count)| {
                cumulative += count.load(Ordering::Relaxed);
                (bound, cumulative)
            })
            .collect();
        let latency_count =
            cumulative + self.buckets[LATENCY_BUCKETS.len()].load(Ordering::Relaxed);
        RedisStats {
            latency_count,
            calls: self.calls.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            faults,
            answered_locally,
            latency_buckets,
            latency_sum: Duration::from_nanos(self.sum_nanos.load(Ordering::Relaxed)),
            ..RedisStats::default()
        }
    }
}
