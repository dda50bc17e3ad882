//! What a limiter decided, counted without a write that another thread's
//! check also makes.
//!
//! A check that counts adds to its thread's own stripe of the counters,
//! cache lines no other thread writes, with a plain load and store (each
//! live thread holds a seat no other live thread holds: `Counters`); a
//! thread past the seats adds to a shared stripe with read-modify-writes,
//! still exact. [`Stats`] sums the stripes when read. Counting decisions is
//! a switch, off by default ([`Builder::counting`](crate::Builder::counting)),
//! whose cost `floodgate bench`'s `"metrics": true` rows measure beside the
//! same checks uncounted. What the store does on its cold paths (clients
//! created, evicted and forgotten, rebuilds and sweeps) is always counted:
//! those paths make read-modify-writes of their own already.

use std::cell::Cell;

use crate::sync::counter::{AtomicBool, AtomicU64, Ordering};
use crate::{Decision, Overflow};

/// What a limiter decided and did since it was built: plain numbers, read
/// with [`RateLimiter::stats`](crate::RateLimiter::stats).
///
/// Each number is exact once the calls that moved it have returned; while
/// calls run, one snapshot may show a decision in one field before another
/// (its `admitted` before its `admitted_units`).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Requests admitted (0 unless the limiter counts its decisions:
    /// `decisions_counted`).
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
    /// Units given back by refunds (`RateLimiter::refund_at`), counted
    /// with the decisions.
    pub refunded_units: u64,
    /// Units released from `in-flight` rules (`RateLimiter::release_at`,
    /// a permit's drop, the end of a response body), counted with the
    /// decisions. Under one `in-flight` rule and counting, the units held
    /// now are `admitted_units - released_units` (less what `forget`
    /// dropped with a client).
    pub released_units: u64,
    /// Requests refused by an `in-flight` rule: their client had as many
    /// units in flight as the rule allows (counted with the decisions,
    /// each also in `rejected`).
    pub in_flight_rejected: u64,
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
    /// Whether the decisions were counted: `false` means `admitted`,
    /// `rejected`, their units and `overflowed` read 0 because the limiter
    /// was built without [`Builder::counting`](crate::Builder::counting),
    /// not because nothing was decided. A sum is counted if any part was.
    pub decisions_counted: bool,
}

/// Says that decisions were not counted, rather than showing their fields
/// as zeros that read as nothing decided.
impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut debug = f.debug_struct("Stats");
        if self.decisions_counted {
            debug
                .field("admitted", &self.admitted)
                .field("rejected", &self.rejected)
                .field("admitted_units", &self.admitted_units)
                .field("rejected_units", &self.rejected_units)
                .field("overflowed", &self.overflowed)
                .field("refunded_units", &self.refunded_units)
                .field("released_units", &self.released_units)
                .field("in_flight_rejected", &self.in_flight_rejected);
        } else {
            debug.field(
                "decisions",
                &format_args!("not counted (build the limiter with counting(true))"),
            );
        }
        debug
            .field("created", &self.created)
            .field("evicted", &self.evicted)
            .field("forgotten", &self.forgotten)
            .field("rebuilds", &self.rebuilds)
            .field("sweeps", &self.sweeps)
            .finish()
    }
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
        self.refunded_units += other.refunded_units;
        self.released_units += other.released_units;
        self.in_flight_rejected += other.in_flight_rejected;
        self.rejected_units += other.rejected_units;
        self.overflowed += other.overflowed;
        self.created += other.created;
        self.evicted += other.evicted;
        self.forgotten += other.forgotten;
        self.rebuilds += other.rebuilds;
        self.sweeps += other.sweeps;
        self.decisions_counted |= other.decisions_counted;
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
    /// Rejected, then admitted requests: indexed by `allowed`, so that
    /// counting takes no branch.
    decided: [AtomicU64; 2],
    /// Costs beyond 1 of the rejected, then admitted requests: a request
    /// of cost 1, the common case, then makes one add, not two.
    extra: [AtomicU64; 2],
    overflowed: AtomicU64,
    /// Units given back by refunds.
    refunded: AtomicU64,
    /// Units released from `in-flight` rules.
    released: AtomicU64,
    /// Refusals by an `in-flight` rule.
    in_flight_rejected: AtomicU64,
}

/// The decision counters of a limiter that counts them.
///
/// A live thread holds a seat ([`SEATS`]): a number no other live thread
/// holds, given back when the thread exits. Stripe `seat` is then written
/// by that thread alone, so it adds with a load and a store, not a locked
/// read-modify-write (a locked add costs a check about 5 ns even on a line
/// no one else touches; a plain add, one). A thread without a seat (more
/// live threads than seats) adds to `shared` with read-modify-writes.
pub(crate) struct Counters {
    /// One stripe per seat, in the counters' own allocation: a check finds
    /// its stripe at a fixed offset, with no pointer of its own to load.
    stripes: [Stripe; SEATS],
    /// For the threads without a seat, and the models.
    shared: Stripe,
}

/// How many threads hold a seat at once: the threads of any pool of one or
/// two per core, on machines of up to 128 cores, for 32 KiB of stripes per
/// limiter that counts.
const SEATS: usize = 256;

/// The seats taken, one bit each. A thread takes the lowest free bit with
/// a compare-and-swap and gives it back at exit. AcqRel: the thread that
/// takes a seat must see every add its previous holder made to the seat's
/// stripes (each add happened before that holder's exit, which released
/// the seat), or it would add to stale values and lose counts.
static TAKEN: [AtomicU64; SEATS / 64] = [const { AtomicU64::new(0) }; SEATS / 64];

/// A thread's seat, given back when the thread exits.
struct Seat(usize);

impl Seat {
    /// The lowest free seat, if any.
    fn take() -> Option<Self> {
        for (word, taken) in TAKEN.iter().enumerate() {
            let mut seen = taken.load(Ordering::Acquire);
            // Progress: the CAS fails only when another thread took or gave
            // back a seat of this word since the load; each failure shows
            // the new value, and a full word is left at once.
            while seen != u64::MAX {
                let bit = seen.trailing_ones() as usize;
                match taken.compare_exchange_weak(
                    seen,
                    seen | (1 << bit),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return Some(Seat(word * 64 + bit)),
                    Err(now) => seen = now,
                }
            }
        }
        None
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        // Counted as shared from here on, whatever this thread's other
        // thread-locals still count as they are torn down.
        SEATED.with(|seated| seated.set(NO_SEAT));
        // Release (in AcqRel): this thread's adds before its seat's next
        // holder's (`TAKEN`).
        TAKEN[self.0 / 64].fetch_and(!(1 << (self.0 % 64)), Ordering::AcqRel);
    }
}

/// `SEATED` before the thread first counts.
const UNSEATED: usize = usize::MAX;
/// `SEATED` of a thread that found no seat free, or whose seat went back.
const NO_SEAT: usize = usize::MAX - 1;

std::thread_local! {
    /// This thread's seat number: a constant-initialised cell with no
    /// destructor, so reading it on the hot path is one load from the
    /// thread's block, with no check of whether it was initialised.
    static SEATED: Cell<usize> = const { Cell::new(UNSEATED) };
    /// The seat itself, which gives the number back when the thread exits.
    static HELD: Cell<Option<Seat>> = const { Cell::new(None) };
}

/// This thread's seat number, taking one the first time.
#[inline(always)]
fn seat() -> usize {
    let seated = SEATED.with(Cell::get);
    if seated == UNSEATED {
        return sit();
    }
    seated
}

/// Takes a seat for this thread, held until it exits.
#[cold]
#[inline(never)]
fn sit() -> usize {
    let Some(seat) = Seat::take() else {
        SEATED.with(|seated| seated.set(NO_SEAT));
        return NO_SEAT;
    };
    let number = seat.0;
    // A thread being torn down cannot hold one: it counts as shared, and
    // the seat goes straight back.
    if HELD.try_with(|held| held.set(Some(seat))).is_err() {
        return NO_SEAT;
    }
    SEATED.with(|seated| seated.set(number));
    number
}

/// The rules of `rules` that are `in-flight` rules, as bits by position
/// (at most [`MAX_RULES`](crate::MAX_RULES) = 8 rules): what
/// [`Counters::decided`] reads to count their refusals.
pub(crate) fn in_flight_mask(rules: &crate::RuleSet) -> u8 {
    rules
        .iter()
        .enumerate()
        .filter(|(_, rule)| rule.policy() == crate::PolicyKind::InFlight)
        .fold(0, |mask, (i, _)| mask | (1 << i))
}

/// Adds `n` to a counter only this thread writes: a load and a store.
/// Relaxed: the counter publishes nothing; the one writer reads its own
/// last store, and readers see some recent value, never a torn one.
#[inline(always)]
fn bump(counter: &AtomicU64, n: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

/// Adds `n` to a counter other threads may write too. Relaxed: counters
/// publish nothing (`StoreCounts::add`).
#[inline(always)]
fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn new() -> Box<Self> {
        Box::new(Self {
            stripes: std::array::from_fn(|_| Stripe::default()),
            shared: Stripe::default(),
        })
    }

    /// Runs `count` on this thread's own stripe with [`bump`], or on the
    /// shared one with [`add`].
    #[inline(always)]
    fn on_stripe(&self, count: impl FnOnce(&Stripe, fn(&AtomicU64, u64))) {
        // Under the models, threads are not real threads (a thread-local
        // may be shared): every add is then a read-modify-write on `shared`.
        let seat = if cfg!(floodgate_loom) {
            NO_SEAT
        } else {
            seat()
        };
        match self.stripes.get(seat) {
            Some(own) => count(own, bump),
            None => count(&self.shared, add),
        }
    }

    /// Counts `decision`, of a request of `cost`, by rules whose
    /// `in-flight` ones are the set bits of `in_flight` ([`in_flight_mask`]).
    #[inline(always)]
    pub(crate) fn decided(&self, decision: &Decision, cost: u64, in_flight: u8) {
        let outcome = usize::from(decision.allowed);
        self.on_stripe(|stripe, add| {
            add(&stripe.decided[outcome], 1);
            if cost != 1 {
                // A cost of 0 takes one back: units are `count + extra`.
                add(&stripe.extra[outcome], cost.wrapping_sub(1));
            }
        });
        if !decision.allowed && in_flight != 0 {
            // The rule's index, not the decision: a reference handed to a
            // call not inlined kept the whole `Decision` in memory on every
            // check's path, copied at each move (a hot check that counts
            // nothing took 117 instructions with it, 104 without).
            self.refused_by(decision.refused_by, in_flight);
        }
    }

    /// Counts a refusal by rule `rule`, if it is an `in-flight` rule.
    #[cold]
    #[inline(never)]
    fn refused_by(&self, rule: u8, in_flight: u8) {
        // `rule` is a rule's index, below MAX_RULES = 8.
        if (in_flight >> (rule & 7)) & 1 == 1 {
            self.on_stripe(|stripe, add| add(&stripe.in_flight_rejected, 1));
        }
    }

    /// Counts the units a refund gave back.
    pub(crate) fn refunded(&self, units: u64) {
        if units > 0 {
            self.on_stripe(|stripe, add| add(&stripe.refunded, units));
        }
    }

    /// Counts the units a release gave back.
    pub(crate) fn released(&self, units: u64) {
        if units > 0 {
            self.on_stripe(|stripe, add| add(&stripe.released, units));
        }
    }

    /// Counts an answer of the overflow rule.
    #[cold]
    pub(crate) fn overflowed(&self) {
        self.on_stripe(|stripe, add| add(&stripe.overflowed, 1));
    }

    /// The decisions' part of a snapshot.
    pub(crate) fn fill(&self, stats: &mut Stats) {
        stats.decisions_counted = true;
        let (mut admitted_extra, mut rejected_extra) = (0u64, 0u64);
        for stripe in self.stripes.iter().chain([&self.shared]) {
            stats.rejected += stripe.decided[0].load(Ordering::Relaxed);
            stats.admitted += stripe.decided[1].load(Ordering::Relaxed);
            rejected_extra = rejected_extra.wrapping_add(stripe.extra[0].load(Ordering::Relaxed));
            admitted_extra = admitted_extra.wrapping_add(stripe.extra[1].load(Ordering::Relaxed));
            stats.overflowed += stripe.overflowed.load(Ordering::Relaxed);
            stats.refunded_units += stripe.refunded.load(Ordering::Relaxed);
            stats.released_units += stripe.released.load(Ordering::Relaxed);
            stats.in_flight_rejected += stripe.in_flight_rejected.load(Ordering::Relaxed);
        }
        stats.admitted_units = stats.admitted.wrapping_add(admitted_extra);
        stats.rejected_units = stats.rejected.wrapping_add(rejected_extra);
    }
}
