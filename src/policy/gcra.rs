//! `gcra`: the generic cell rate algorithm, virtual-scheduling form.
//!
//! State: the theoretical arrival time `TAT`, initially the origin (0). With
//! `t = max(TAT, now)`, a request is admitted iff `t − now <= τ`, where
//! `τ = I·(L − 1)`, and then `TAT = t + I`. A burst of `L` gets through at
//! once, then one per `I`. A request of cost `n` (`1 <= n <= L`) is the
//! last of `n` such requests at `now`: admitted iff
//! `t + (n − 1)·I − now <= τ`, then `TAT = t + n·I`, in one CAS.
//!
//! Horizon: `TAT` is at most `now + W` (`τ + I = I·L <= W`), whatever the
//! cost: an admission leaves `TAT = t + n·I <= now + τ + I`. In the
//! arithmetic `n·I <= L·I <= W <= 2^62` and `t < 2^63`, so
//! `t + (n − 1)·I < 2^64` even on a rejection. Windows are
//! capped at 2^62 ticks ([`MAX_SCHEDULE_WINDOW`](crate::MAX_SCHEDULE_WINDOW))
//! and time stops at 2^62 − 1 ticks (146 years of nanoseconds;
//! `cell::schedule_time`; in the limiter, which keeps no origin for a
//! schedule, ticks of the clock itself), so `TAT` stays below 2^63, exact,
//! with the top bit free for the retirement mark.

use super::{sealed, Policy, Spent};
use crate::cell::{self, schedule_time, transition, AtomicWord, Retired, Step};
use crate::sync::AtomicU64;
use crate::{Config, ConfigError, Decision, PolicyKind};

/// The generic cell rate algorithm: a burst of `limit`, then one request per
/// `window / limit` ticks. The same admissions as `governor` built with
/// `Quota::with_period(window / limit).allow_burst(limit)`.
#[derive(Clone, Copy, Debug)]
pub struct Gcra {
    pub(super) config: Config,
    /// `I`: ticks between two requests at the sustained rate.
    pub(super) interval: u64,
    /// `τ = I·(L − 1)`: how far ahead of `now` the schedule may run.
    pub(super) tolerance: u64,
}

/// One client's `gcra` or `leaky-bucket` state: `TAT`, ticks past the origin.
#[derive(Debug)]
pub struct GcraState {
    tat: AtomicU64,
}

/// The schedule's answer for one request: admitted with `wait = t − now`,
/// or rejected with its retry-after.
pub(super) enum Slot {
    Admitted { wait: u64, next_tat: u64 },
    Rejected { retry_after: u64 },
}

impl Gcra {
    /// Where a request of cost `cost` (`1 <= cost <= L`) at `now` falls in
    /// the schedule `tat`.
    #[inline]
    pub(super) fn slot(&self, tat: u64, now: u64, cost: u64) -> Slot {
        let t = tat.max(now);
        let wait = t - now;
        // (n − 1)·I <= τ <= W and wait < 2^63: exact (module docs).
        let last = wait + (cost - 1) * self.interval;
        if last <= self.tolerance {
            Slot::Admitted {
                wait,
                // Exact below the horizon in the module docs.
                next_tat: t + cost * self.interval,
            }
        } else {
            Slot::Rejected {
                retry_after: last - self.tolerance,
            }
        }
    }

    /// `⌊(τ − (t − now)) / I⌋ + 1` when `t − now <= τ`, else 0.
    #[inline]
    pub(super) fn remaining_of(&self, tat: u64, now: u64) -> u64 {
        let wait = tat.max(now) - now;
        match self.tolerance.checked_sub(wait) {
            Some(slack) => slack / self.interval + 1,
            None => 0,
        }
    }

    /// The pure step for a cost `1 <= cost <= L`; `shaped` answers with the
    /// queueing delay (of the first of the `cost`).
    #[inline]
    pub(super) fn step(&self, tat: u64, now: u64, cost: u64, shaped: bool) -> Step<u64> {
        match self.slot(tat, now, cost) {
            Slot::Admitted { wait, next_tat } => {
                // A client within its rate (`TAT <= now`) is now scheduled
                // `n` intervals ahead, which leaves `L − n`: the common
                // admission, answered without `remaining_of`'s division.
                let remaining = if wait == 0 {
                    self.config.limit() - cost
                } else {
                    self.remaining_of(next_tat, now)
                };
                Step {
                    decision: Decision {
                        delay: if shaped { wait } else { 0 },
                        ..Decision::admit(remaining)
                    },
                    next: Some(next_tat),
                }
            }
            Slot::Rejected { retry_after } => Step {
                // A single request is refused only with nothing left; a
                // larger one may be refused with some left.
                decision: Decision::reject(
                    if cost == 1 {
                        0
                    } else {
                        self.remaining_of(tat, now)
                    },
                    retry_after,
                ),
                next: None,
            },
        }
    }

    pub(super) fn validated(config: Config, kind: PolicyKind) -> Result<Self, ConfigError> {
        let config = config.check_for(kind)?;
        let interval = config.interval();
        Ok(Self {
            config,
            interval,
            // I·(L − 1) <= W, so it cannot overflow.
            tolerance: interval * (config.limit() - 1),
        })
    }

    /// Linearised at the one CAS that moves `TAT` by all `cost` intervals.
    #[inline]
    pub(super) fn check_state(
        &self,
        state: &GcraState,
        now: u64,
        cost: u64,
        shaped: bool,
    ) -> Result<Decision, Retired> {
        let now = schedule_time(now);
        transition(&state.tat, |tat| self.step(tat, now, cost, shaped))
    }

    /// `check_state` of a state no other thread can reach yet.
    #[inline]
    pub(super) fn check_unshared_state(
        &self,
        state: GcraState,
        now: u64,
        cost: u64,
        shaped: bool,
    ) -> (GcraState, Decision) {
        let now = schedule_time(now);
        let (tat, decision) =
            cell::transition_unshared(state.tat, |tat| self.step(tat, now, cost, shaped));
        (GcraState { tat }, decision)
    }

    #[inline]
    pub(super) fn remaining_state(&self, state: &GcraState, now: u64) -> Result<u64, Retired> {
        Ok(self.remaining_of(cell::read(&state.tat)?, schedule_time(now)))
    }

    pub(super) fn fresh_state() -> GcraState {
        GcraState {
            tat: AtomicU64::new(0),
        }
    }

    /// Idle once the schedule is not ahead of `now`: `max(TAT, t) = t` for
    /// every later `t`, as with a new client's `TAT` of 0.
    pub(super) fn retire_if_idle_state(&self, state: &GcraState, now: u64) -> bool {
        let now = schedule_time(now);
        cell::retire_if(&state.tat, |tat| tat <= now)
    }

    /// Judged no earlier than `TAT − L·I`: the latest admission `a` left
    /// `TAT <= a + τ + I = a + L·I`, so the state reflects that time. From
    /// there `TAT − at <= L·I`, and `spent_state_at(spent, at)` rebuilds a
    /// schedule at least as far ahead as `TAT` (equal when `I` divides
    /// `TAT − at`, one step of rounding further otherwise).
    pub(super) fn retire_spent_state(&self, state: &GcraState, now: u64) -> Spent {
        let (tat, _) = cell::retire(&state.tat);
        // L·I <= W: no overflow.
        let reflected = tat.saturating_sub(self.config.limit() * self.interval);
        let at = schedule_time(now).max(reflected);
        Spent {
            count: self.config.limit() - self.remaining_of(tat, at),
            at,
        }
    }

    /// `TAT = now + spent·I` leaves `⌊(τ − spent·I) / I⌋ + 1 = L − spent`.
    pub(super) fn spent_state_at(&self, spent: u64, now: u64) -> GcraState {
        let spent = spent.min(self.config.limit());
        GcraState {
            // At most now + L·I <= now + W: below 2^63 (module docs).
            tat: AtomicU64::new(schedule_time(now) + spent * self.interval),
        }
    }

    /// The pure refund step: `g = min(n, L − remaining(now))` given back
    /// by moving the schedule back `g` intervals from `t = max(TAT, now)`,
    /// never before `now` (the contract's `TAT = max(t − g·I, now)`): then
    /// `remaining(now)` is `g` more. The word to store, if any.
    #[inline]
    pub(super) fn give_back(&self, tat: u64, now: u64, cost: u64) -> (u64, Option<u64>) {
        let given = cost.min(self.config.limit() - self.remaining_of(tat, now));
        if given == 0 {
            return (0, None);
        }
        // g·I <= L·I <= W <= 2^62: no overflow; t < 2^63 (module docs).
        let back = tat.max(now).saturating_sub(given * self.interval).max(now);
        (given, Some(back))
    }

    /// `give_back` on the state, in one CAS.
    #[inline]
    pub(super) fn refund_state(
        &self,
        state: &GcraState,
        now: u64,
        ago: u64,
        cost: u64,
    ) -> Result<u64, Retired> {
        if super::gives_nothing(self.config, ago, cost) {
            return Ok(0);
        }
        let now = schedule_time(now);
        cell::update(&state.tat, |tat| self.give_back(tat, now, cost))
    }

    /// The schedule frozen where it stands and continued in a new word.
    pub(super) fn relocate_state(state: &GcraState) -> Option<GcraState> {
        let (tat, retired_now) = cell::retire(&state.tat);
        retired_now.then(|| GcraState {
            tat: AtomicU64::new(tat),
        })
    }

    /// A state holding the schedule `word`.
    pub(super) fn state_of(word: u64) -> GcraState {
        GcraState {
            tat: AtomicU64::new(word),
        }
    }

    /// The schedule's word, from a state no other thread can reach.
    pub(super) fn word(state: GcraState) -> u64 {
        state.tat.into_word()
    }

    pub(super) fn is_retired_state(state: &GcraState) -> bool {
        AtomicU64::is_retired(state.tat.load_word())
    }
}

impl sealed::Sealed for Gcra {}

impl Policy for Gcra {
    type State = GcraState;
    type Origin = ();
    const KIND: PolicyKind = PolicyKind::Gcra;

    fn new(config: Config) -> Result<Self, ConfigError> {
        Self::validated(config, Self::KIND)
    }

    fn config(&self) -> Config {
        self.config
    }

    fn new_state(&self) -> GcraState {
        Self::fresh_state()
    }

    /// `TAT = origin`: the limiter keeps no origin for this policy and
    /// hands it times since tick 0.
    fn begin(&self, origin: u64) -> GcraState {
        self.spent_state_at(0, origin)
    }

    #[inline]
    fn check_within(&self, state: &GcraState, now: u64, cost: u64) -> Result<Decision, Retired> {
        self.check_state(state, now, cost, false)
    }

    #[inline]
    fn check_unshared(&self, state: GcraState, now: u64, cost: u64) -> (GcraState, Decision) {
        self.check_unshared_state(state, now, cost, false)
    }

    #[inline]
    fn remaining(&self, state: &GcraState, now: u64) -> Result<u64, Retired> {
        self.remaining_state(state, now)
    }

    #[inline]
    fn refund(&self, state: &GcraState, now: u64, ago: u64, cost: u64) -> Result<u64, Retired> {
        self.refund_state(state, now, ago, cost)
    }

    fn retire_if_idle(&self, state: &GcraState, now: u64) -> bool {
        self.retire_if_idle_state(state, now)
    }

    fn retire_spent(&self, state: &GcraState, now: u64) -> Spent {
        self.retire_spent_state(state, now)
    }

    fn spent_state(&self, spent: u64, now: u64) -> GcraState {
        self.spent_state_at(spent, now)
    }

    fn save_words(&self, state: &GcraState, out: &mut Vec<u64>) -> Result<(), Retired> {
        cell::save_word(&state.tat, out)
    }

    fn load_words(&self, words: &[u64]) -> Option<GcraState> {
        cell::loaded_word(words).map(Self::state_of)
    }

    fn is_retired(&self, state: &GcraState) -> bool {
        Self::is_retired_state(state)
    }

    fn relocate(&self, state: &GcraState) -> Option<GcraState> {
        Self::relocate_state(state)
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;

    fn gcra(limit: u64, window: u64) -> Gcra {
        Gcra::new(Config::per_ticks(limit, window).unwrap()).unwrap()
    }

    #[test]
    fn burst_then_one_per_interval() {
        let policy = gcra(3, 300); // I = 100, τ = 200
        let state = policy.new_state();
        assert_eq!(policy.remaining(&state, 0), Ok(3));
        for left in [2, 1, 0] {
            assert_eq!(policy.check(&state, 0), Ok(Decision::admit(left)));
        }
        assert_eq!(policy.check(&state, 0), Ok(Decision::reject(0, 100)));
        assert_eq!(policy.check(&state, 99), Ok(Decision::reject(0, 1)));
        assert_eq!(policy.check(&state, 100), Ok(Decision::admit(0)));
    }

    #[test]
    fn an_older_now_is_never_more_lenient() {
        let policy = gcra(2, 200);
        let state = policy.new_state();
        let allowed = |now| policy.check(&state, now).unwrap().allowed;
        assert!(allowed(1_000));
        assert!(allowed(1_000));
        assert!(!allowed(1_050));
        assert!(!allowed(10));
        assert!(allowed(1_100));
    }

    #[test]
    fn idle_exactly_when_the_schedule_is_not_ahead() {
        let policy = gcra(2, 200); // I = 100
        let state = policy.new_state();
        policy.check(&state, 1_000).unwrap(); // TAT = 1100
        assert!(!policy.retire_if_idle(&state, 1_099));
        assert!(policy.retire_if_idle(&state, 1_100));
        assert_eq!(policy.check(&state, 1_100), Err(Retired));
        assert!(policy.is_retired(&state));
    }

    #[test]
    fn spent_is_carried_and_capped_at_the_limit() {
        let policy = gcra(100, 1_000); // I = 10
        let state = policy.new_state();
        for _ in 0..80 {
            policy.check(&state, 500).unwrap();
        }
        assert_eq!(
            policy.retire_spent(&state, 500),
            Spent { count: 80, at: 500 }
        );
        assert_eq!(policy.check(&state, 500), Err(Retired));
        let wider = gcra(200, 1_000); // I = 5
        assert_eq!(wider.remaining(&wider.spent_state(80, 500), 500), Ok(120));
        let narrower = gcra(50, 1_000);
        assert_eq!(
            narrower.remaining(&narrower.spent_state(80, 500), 500),
            Ok(0)
        );
    }
}
