//! Bounded memory: which idle clients are forgotten, how many clients are
//! tracked at most, and what a new client gets when there is no room.
//!
//! A limiter in front of a public API is itself a target: a caller that sends
//! a new client id with every request must not grow the limiter's memory
//! without bound. [`Bounds`] says how a limiter defends itself; the default
//! is the exact, unbounded limiter of the contract.
//!
//! # Idle clients
//!
//! A client is *idle* at `now` when its state answers every call at `now` or
//! later exactly as a brand-new client's state would: its sliding log holds
//! no admission inside the window, its bucket is full, its schedule (`TAT`)
//! is not ahead of `now`, its window counts are all zero or belong to windows
//! that are over. A *sweep* at `now` removes every idle client. A client that
//! calls again after being removed is created afresh, with that call as its
//! origin:
//!
//! | policy | what a re-created client changes |
//! | --- | --- |
//! | `sliding-window`, `gcra`, `leaky-bucket` | nothing: no answer depends on the origin of an idle client |
//! | `token-bucket` | the drips' phase: they fall at `new origin + k·I` |
//! | `fixed-window`, `sliding-window-counter` | the grid: windows start at the new origin |
//!
//! A sweep treats its `now` as a time every client has reached. With a real
//! clock that is so; in a trace whose clients have unrelated clocks, a
//! client whose own time is behind a sweep's may be forgotten early.
//!
//! # When sweeps run
//!
//! Only on a new client's arrival (a call for a key that is not tracked), and
//! on an explicit [`RateLimiter::sweep`](crate::RateLimiter::sweep): never on
//! a known client's check. With eviction on, the arrival that brings the
//! number of arrivals since the last sweep began to `max(SWEEP_EVERY_AT_LEAST,
//! clients kept by the last sweep)` begins a sweep, at its own `now`. At the
//! cap, an arrival begins one if at least `max(1, max_clients / 16)`
//! arrivals came since the last began, so a flood of new ids that finds
//! nothing idle costs 16 visits per arrival, amortised. One sweep runs at a
//! time; the others go on.
//!
//! The lock-free engine takes a sweep in steps: the arrival that begins it
//! visits 256 slots of its table, and each arrival after visits the next
//! 256, judging every client at the sweep's `now`, until the whole table
//! is visited. No arrival pays for the whole table (about a microsecond a
//! step, where a sweep of a million clients in one call took milliseconds).
//! A table of at most 1,024 slots, which every limiter of fewer than 512
//! clients has, is swept whole by the arrival that begins the sweep, as the
//! mutex engine sweeps its map, so the two engines agree on every call
//! there; on larger tables the lock-free engine removes the same clients a
//! few arrivals later. The map never holds more than twice the clients the
//! last sweep kept (the ones not idle then), plus 64, plus one client per
//! step of the sweep under way (the table's slots over 256). At the cap,
//! a newcomer gets a place as soon as a step of the sweep under way has
//! found an idle client: within the steps a sweep takes, not at once.
//! Checks of known clients take no lock and never wait for a sweep.
//!
//! A sweep's cost lands on the arrivals that take its steps: about 4 ns per
//! client it keeps and 6 ns per client it removes (`cargo bench --bench
//! limiter -- sweep`, 100,000 `gcra` clients: 0.36 ms to keep them all,
//! 0.60 ms to remove them all, on the machine of `benches/README.md`). An
//! explicit sweep takes every step itself. A service that wants no such
//! arrival can leave eviction off and call
//! [`sweep`](crate::RateLimiter::sweep) from a timer instead.
//!
//! # The cap
//!
//! With [`Bounds::max_clients`], the number of tracked clients never passes
//! the cap: a new client reserves its place before it is inserted. When a new
//! client arrives at the cap, the sweep under way (or one that is due) takes
//! a step first (as above); if no place is free after it, the [`Overflow`]
//! rule decides. Known clients are never affected by the cap.
//!
//! # Memory, in bytes
//!
//! The cap counts clients; what a client costs is fixed by its policy from
//! its first call on (`remaining` included — [`peek`](crate::RateLimiter::peek)
//! creates nothing): one slot of the limiter's table, 24 bytes for a `u64`
//! key with `gcra`, `leaky-bucket` or `token-bucket` and 48 with a window
//! policy or `sliding-window`, whose ring of its last `L` admissions adds
//! `16·L` more on the heap (16 MiB at the largest `L`, 2^20 − 1). The table
//! keeps at least 1/8 of its slots free, so at 100,000 clients that is
//! about 31.5, 63 and `79 + 16·L` bytes per client (the README's table).
//! A capped limiter sizes its table for `max_clients` once, plus one
//! candidate entry per thread that is creating a client at that moment (a
//! thread that loses the race to create a client drops its candidate at
//! once). Size the cap of a sliding log with its `L` in mind; the other
//! policies' states are all small.

use std::fmt;
use std::str::FromStr;

use crate::sync::{AtomicBool, AtomicUsize, Ordering};
use crate::ConfigError;

/// A sweep runs at most once per this many new-client arrivals when eviction
/// is on, however few clients are tracked.
pub const SWEEP_EVERY_AT_LEAST: usize = 64;

/// What a new client gets when the limiter tracks
/// [`max_clients`](Bounds::max_clients) clients and none is idle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Overflow {
    /// Fail closed (the default): the request is rejected, with
    /// `remaining` 0 and a `retry_after` of the time within which a client
    /// that stops calling becomes idle (`W`; `2·W` for
    /// `sliding-window-counter`). That is a hint, not the contract's exact
    /// figure: whether there is room then depends on the other clients.
    /// Nothing is tracked.
    #[default]
    Reject,
    /// Fail open: the request is admitted untracked, answered as a brand-new
    /// client's first request (`remaining` is `L − 1`, no delay), and
    /// `remaining` answers `L`.
    Admit,
    /// All clients that find no room share one overflow state of the same
    /// policy and limit, created by the first of them: together they get
    /// what one client gets.
    Shared,
}

impl Overflow {
    /// Every rule, by its configuration name.
    pub const ALL: [Overflow; 3] = [Overflow::Reject, Overflow::Admit, Overflow::Shared];

    /// The rule's configuration name: `reject`, `admit` or `shared`.
    pub const fn name(self) -> &'static str {
        match self {
            Overflow::Reject => "reject",
            Overflow::Admit => "admit",
            Overflow::Shared => "shared",
        }
    }
}

impl fmt::Display for Overflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not an overflow rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownOverflow {
    /// The name given.
    pub name: String,
}

impl fmt::Display for UnknownOverflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown overflow rule `{}` (expected reject, admit or shared)",
            self.name
        )
    }
}

impl std::error::Error for UnknownOverflow {}

impl FromStr for Overflow {
    type Err = UnknownOverflow;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Overflow::ALL
            .into_iter()
            .find(|rule| rule.name() == name)
            .ok_or_else(|| UnknownOverflow {
                name: name.to_owned(),
            })
    }
}

/// How a limiter bounds its memory: idle eviction, a cap on tracked
/// clients, and the rule at the cap (module docs: [`crate::bounds`]).
///
/// The default tracks every client for ever and evicts nothing: the exact
/// limiter of the contract.
///
/// ```
/// use floodgate::{Bounds, Overflow};
///
/// let bounds = Bounds::new().evict_idle().max_clients(100_000);
/// assert_eq!(bounds.overflow(), Overflow::Reject); // fail closed unless told
/// let open = bounds.on_overflow(Overflow::Admit);
/// assert_eq!(open.cap(), Some(100_000));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Bounds {
    evict_idle: bool,
    max_clients: Option<usize>,
    overflow: Overflow,
}

impl Bounds {
    /// No eviction, no cap.
    pub const fn new() -> Self {
        Self {
            evict_idle: false,
            max_clients: None,
            overflow: Overflow::Reject,
        }
    }

    /// Sweeps idle clients, amortised over new clients' arrivals.
    #[must_use]
    pub const fn evict_idle(mut self) -> Self {
        self.evict_idle = true;
        self
    }

    /// Tracks at most `max_clients` clients (0 tracks none: every client
    /// gets the overflow rule, so 0 with [`Overflow::Reject`] is refused
    /// when the limiter is built: see [`validate`](Self::validate)).
    #[must_use]
    pub const fn max_clients(mut self, max_clients: usize) -> Self {
        self.max_clients = Some(max_clients);
        self
    }

    /// What a new client gets at the cap (default [`Overflow::Reject`]).
    #[must_use]
    pub const fn on_overflow(mut self, rule: Overflow) -> Self {
        self.overflow = rule;
        self
    }

    /// Whether idle clients are swept on arrivals.
    pub const fn evicts_idle(&self) -> bool {
        self.evict_idle
    }

    /// The cap, if any.
    pub const fn cap(&self) -> Option<usize> {
        self.max_clients
    }

    /// The rule at the cap.
    pub const fn overflow(&self) -> Overflow {
        self.overflow
    }

    /// The bounds, if they can admit anyone: every limiter checks them
    /// when it is built.
    ///
    /// # Errors
    ///
    /// [`ConfigError::RefusesEveryone`] for `max_clients(0)` with
    /// [`Overflow::Reject`]: no client could ever be tracked, and every
    /// newcomer would be refused. (`max_clients(0)` with
    /// [`Overflow::Shared`] is one limit for everyone together, and with
    /// [`Overflow::Admit`] no limit at all: both are accepted.)
    pub const fn validate(self) -> Result<Self, ConfigError> {
        if matches!(self.max_clients, Some(0)) && matches!(self.overflow, Overflow::Reject) {
            return Err(ConfigError::RefusesEveryone);
        }
        Ok(self)
    }

    /// [`validate`](Self::validate), and bounds that can apply `rules`:
    /// [`ConfigError::SharedOverflowHolds`] for [`Overflow::Shared`] with
    /// an `in-flight` rule.
    pub(crate) fn validate_for(self, rules: &crate::RuleSet) -> Result<Self, ConfigError> {
        let bounds = self.validate()?;
        let holds = rules
            .iter()
            .any(|rule| rule.policy() == crate::PolicyKind::InFlight);
        if holds && matches!(bounds.overflow, Overflow::Shared) {
            return Err(ConfigError::SharedOverflowHolds);
        }
        Ok(bounds)
    }
}

/// When sweeps run (module docs, "When sweeps run"): the bookkeeping both
/// engines share, so that on the same calls they sweep at the same arrivals
/// and so give the same answers.
///
/// Orderings: these counters only decide *when* a sweep runs, never what a
/// decision answers, so Relaxed is enough for them; `sweeping` hands the
/// sweep from one thread to the next with Acquire/Release, so a sweeper
/// sees the previous sweeper's `kept`.
#[derive(Debug)]
pub(crate) struct SweepSchedule {
    bounds: Bounds,
    /// New-client arrivals since the last sweep.
    arrivals: AtomicUsize,
    /// Clients the last sweep kept.
    kept: AtomicUsize,
    sweeping: AtomicBool,
}

/// A sweep this thread runs; ends (and lets another run) when dropped.
pub(crate) struct SweepTurn<'a> {
    schedule: &'a SweepSchedule,
}

impl SweepTurn<'_> {
    /// Records the result: the sweep kept `kept` clients.
    pub(crate) fn finish(self, kept: usize) {
        self.schedule.arrivals.store(0, Ordering::Relaxed);
        self.schedule.kept.store(kept, Ordering::Relaxed);
    }
}

impl SweepTurn<'_> {
    /// Counts the arrivals towards the next sweep from here: for a sweep
    /// taken in steps (the limiter's store), which records what it kept
    /// only when its last step ends (`SweepSchedule::finish_round`).
    pub(crate) fn restart(&self) {
        self.schedule.arrivals.store(0, Ordering::Relaxed);
    }
}

impl Drop for SweepTurn<'_> {
    fn drop(&mut self) {
        self.schedule.sweeping.store(false, Ordering::Release);
    }
}

impl SweepSchedule {
    pub(crate) fn new(bounds: Bounds) -> Self {
        Self {
            bounds,
            arrivals: AtomicUsize::new(0),
            kept: AtomicUsize::new(0),
            sweeping: AtomicBool::new(false),
        }
    }

    pub(crate) fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// Counts one new-client arrival; a turn to sweep first if eviction is
    /// on and one is due.
    pub(crate) fn arrive(&self) -> Option<SweepTurn<'_>> {
        // Counted only where the count is read: eviction's cadence, or the
        // cap's (`at_cap`).
        if !self.bounds.evict_idle && self.bounds.max_clients.is_none() {
            return None;
        }
        let arrivals = self.arrivals.fetch_add(1, Ordering::Relaxed) + 1;
        if !self.bounds.evict_idle {
            return None;
        }
        let due = arrivals >= SWEEP_EVERY_AT_LEAST.max(self.kept.load(Ordering::Relaxed));
        if due {
            self.turn()
        } else {
            None
        }
    }

    /// A turn to sweep for an arrival that found the cap reached, if one is
    /// due.
    pub(crate) fn at_cap(&self, cap: usize) -> Option<SweepTurn<'_>> {
        if self.arrivals.load(Ordering::Relaxed) >= (cap / 16).max(1) {
            self.turn()
        } else {
            None
        }
    }

    /// Records what a sweep taken in steps kept, at its last step (its
    /// arrivals were counted afresh when it began: `SweepTurn::restart`).
    pub(crate) fn finish_round(&self, kept: usize) {
        self.kept.store(kept, Ordering::Relaxed);
    }

    /// A turn for an explicit sweep (waits for no one: `None` if another
    /// thread is sweeping right now).
    pub(crate) fn turn(&self) -> Option<SweepTurn<'_>> {
        self.sweeping
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| SweepTurn { schedule: self })
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;
    use crate::{build_bounded, Config, Engine, ManualClock, PolicyKind};

    #[test]
    fn bounds_that_refuse_everyone_are_refused_by_every_engine() {
        let config = Config::per_ticks(10, 1_000).unwrap();
        for engine in [Engine::LockFree, Engine::Mutex] {
            let build = |bounds| {
                build_bounded::<u64, _>(
                    PolicyKind::Gcra,
                    config,
                    engine,
                    ManualClock::new(0),
                    bounds,
                )
                .map(drop)
            };
            assert_eq!(
                build(Bounds::new().max_clients(0)),
                Err(ConfigError::RefusesEveryone),
                "{engine}"
            );
            for rule in [Overflow::Admit, Overflow::Shared] {
                assert_eq!(
                    build(Bounds::new().max_clients(0).on_overflow(rule)),
                    Ok(())
                );
            }
            assert_eq!(build(Bounds::new().max_clients(1)), Ok(()));
        }
    }
}
