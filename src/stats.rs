//! What a limiter decided, counted without a write that another thread's
//! check also makes.
//!
//! A check that counts adds to its thread's stripe of the counters: one
//! cache line per stripe, each thread on its own stripe (threads are given
//! stripes in turn; more threads than stripes share, and a shared stripe is
//! still exact, its adds being read-modify-writes). [`Stats`] sums the
//! stripes when read. The counting of decisions is a switch, off by
//! default ([`Builder::counting`](crate::Builder::counting)): even on its
//! own line an atomic add is a locked instruction, several nanoseconds
//! beside a check of a dozen (`floodgate bench`'s `"metrics": true` rows say
//! how many). What the store does on its cold paths (clients created,
//! evicted and forgotten, rebuilds and sweeps) is always counted: those
//! paths make read-modify-writes of their own already.

use crate::sync::counter::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crate::{Decision, Overflow};

/// What a limiter decided and did since it was built: plain numbers, read
/// with [`RateLimiter::stats`](crate::RateLimiter::stats).
///
/// Each number is exact once the calls that moved it have returned; while
/// calls run, one snapshot may show a decision in one field before another
/// (its `admitted` before its `admitted_units`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Requests admitted (0 unless the limiter counts its decisions).
    pub admitted: u64,
    /// Requests rejected (0 unless the limiter counts its decisions).
    pub rejected: u64,
    /// The costs of the admitted requests, in the limit's units.
    pub admitted_units: u64,
    /// The costs of the rejected requests.
    pub rejected_units: u64,
    /// Requests answered by the overflow rule, the cap being full (each
    /// also counted as admitted or rejected).
    pub overflowed: u64,
    /// Clients created.
    pub created: u64,
    /// Clients removed by sweeps, as idle.
    pub evicted: u64,
    /// Clients removed by `forget`.
    pub forgotten: u64,
    /// Rebuilds of the store's table (growth, or dropping evicted slots).
    pub rebuilds: u64,
    /// Sweeps run (on arrivals, at the cap, or asked for).
    pub sweeps: u64,
}

impl Stats {
    /// Requests decided: admitted and rejected.
    pub const fn decided(&self) -> u64 {
        self.admitted + self.rejected
    }
}

/// Sums snapshots: a registry's tiers, or several limiters.
impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, other: Stats) {
        self.admitted += other.admitted;
        self.rejected += other.rejected;
        self.admitted_units += other.admitted_units;
        self.rejected_units += other.rejected_units;
        self.overflowed += other.overflowed;
        self.created += other.created;
        self.evicted += other.evicted;
        self.forgotten += other.forgotten;
        self.rebuilds += other.rebuilds;
        self.sweeps += other.sweeps;
    }
}

/// What the store counts on its cold paths, always.
#[derive(Default)]
pub(crate) struct StoreCounts {
    pub(crate) created: AtomicU64,
    pub(crate) evicted: AtomicU64,
    pub(crate) forgotten: AtomicU64,
    pub(crate) rebuilds: AtomicU64,
    pub(crate) sweeps: AtomicU64,
    /// Whether the store logged that its cap was reached (once: an
    /// operator needs to know it happened, not each time).
    cap_logged: AtomicBool,
}

impl StoreCounts {
    /// Adds `n` to `counter`. Relaxed: a counter publishes nothing and
    /// orders nothing; it is read for reporting only.
    #[inline]
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Logs, the first time only, that a newcomer found the cap of `cap`
    /// clients full, none of them idle: from now on newcomers get the
    /// overflow rule's answer until clients go idle.
    #[cold]
    pub(crate) fn cap_reached(&self, cap: usize, overflow: Overflow) {
        // Relaxed: the flag orders nothing; two threads that race may both
        // log, which is harmless.
        if !self.cap_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                cap,
                overflow = overflow.name(),
                "floodgate: the cap of {cap} clients is reached and none is idle: new clients \
                 get the overflow rule ({}) until some go idle",
                overflow.name()
            );
        }
    }

    /// The store's part of a snapshot.
    pub(crate) fn fill(&self, stats: &mut Stats) {
        stats.created = self.created.load(Ordering::Relaxed);
        stats.evicted = self.evicted.load(Ordering::Relaxed);
        stats.forgotten = self.forgotten.load(Ordering::Relaxed);
        stats.rebuilds = self.rebuilds.load(Ordering::Relaxed);
        stats.sweeps = self.sweeps.load(Ordering::Relaxed);
    }
}

/// One thread's share of the decision counters, alone on its cache lines
/// (128 bytes: two lines, as the adjacent-line prefetcher pairs them), so
/// that no other thread's check writes them.
#[repr(align(128))]
#[derive(Default)]
struct Stripe {
    admitted: AtomicU64,
    rejected: AtomicU64,
    /// Costs beyond 1 of the admitted requests: a request of cost 1, the
    /// common case, then makes one add, not two.
    admitted_extra: AtomicU64,
    rejected_extra: AtomicU64,
    overflowed: AtomicU64,
}

/// The decision counters of a limiter that counts them.
pub(crate) struct Counters {
    /// A power of two of stripes.
    stripes: Box<[Stripe]>,
}

/// The next stripe to give a thread.
static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

std::thread_local! {
    /// This thread's stripe number, given in turn the first time the
    /// thread counts (any limiter): threads that count are spread over the
    /// stripes before any two share one.
    static STRIPE: usize = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn new() -> Self {
        // Twice the cores, so that the threads of a pool of one per core
        // each get their own; under the models, two.
        let stripes = if cfg!(floodgate_loom) {
            2
        } else {
            let cores = std::thread::available_parallelism().map_or(4, usize::from);
            (cores * 2).next_power_of_two().clamp(2, 64)
        };
        Self {
            stripes: (0..stripes).map(|_| Stripe::default()).collect(),
        }
    }

    #[inline(always)]
    fn stripe(&self) -> &Stripe {
        let index = STRIPE.with(|stripe| *stripe) & (self.stripes.len() - 1);
        &self.stripes[index]
    }

    /// Counts `decision`, of a request of `cost`. Relaxed: counters
    /// publish nothing (`StoreCounts::add`).
    #[inline(always)]
    pub(crate) fn decided(&self, decision: &Decision, cost: u64) {
        let stripe = self.stripe();
        let (count, extra) = if decision.allowed {
            (&stripe.admitted, &stripe.admitted_extra)
        } else {
            (&stripe.rejected, &stripe.rejected_extra)
        };
        count.fetch_add(1, Ordering::Relaxed);
        if cost != 1 {
            // A cost of 0 takes one back: units are `count + extra`.
            extra.fetch_add(cost.wrapping_sub(1), Ordering::Relaxed);
        }
    }

    /// Counts an answer of the overflow rule.
    #[cold]
    pub(crate) fn overflowed(&self) {
        self.stripe().overflowed.fetch_add(1, Ordering::Relaxed);
    }

    /// The decisions' part of a snapshot.
    pub(crate) fn fill(&self, stats: &mut Stats) {
        let (mut admitted_extra, mut rejected_extra) = (0u64, 0u64);
        for stripe in self.stripes.iter() {
            stats.admitted += stripe.admitted.load(Ordering::Relaxed);
            stats.rejected += stripe.rejected.load(Ordering::Relaxed);
            admitted_extra =
                admitted_extra.wrapping_add(stripe.admitted_extra.load(Ordering::Relaxed));
            rejected_extra =
                rejected_extra.wrapping_add(stripe.rejected_extra.load(Ordering::Relaxed));
            stats.overflowed += stripe.overflowed.load(Ordering::Relaxed);
        }
        stats.admitted_units = stats.admitted.wrapping_add(admitted_extra);
        stats.rejected_units = stats.rejected.wrapping_add(rejected_extra);
    }
}
