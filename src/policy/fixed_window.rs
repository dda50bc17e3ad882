//! `fixed-window`: at most `L` admissions in each window
//! `[k·W, (k+1)·W)` of the client's own grid (windows start at its origin,
//! so clients do not all reset at once). A request of cost `n` is admitted
//! iff `c + n <= L` in the current window, and adds `n` to its count in one
//! CAS.

use super::{sealed, spent_window_word, until, window_spent, Policy, Retired, Spent};
use crate::cell::{self, transition, AtomicWord, Step, WindowWord};
use crate::sync::AtomicU128;
use crate::{Config, ConfigError, Decision, PolicyKind};

/// At most `limit` requests in each `window`, windows counted from each
/// client's first request.
#[derive(Clone, Copy, Debug)]
pub struct FixedWindow {
    config: Config,
}

/// One client's `fixed-window` state: a `WindowWord` (layout in `cell`).
#[derive(Debug)]
pub struct FixedWindowState {
    word: AtomicU128,
}

impl FixedWindow {
    /// The count of the window that holds `now`. A `now` in a window before
    /// the stored one (time going back) is judged in the stored window: the
    /// latest time the state reflects.
    #[inline]
    fn current(&self, word: u128, now: u64) -> WindowWord {
        let stored = WindowWord::unpack(word);
        let window = WindowWord::index(now, self.config.window());
        if window > stored.window {
            WindowWord {
                window,
                previous: 0,
                current: 0,
            }
        } else {
            stored
        }
    }

    #[inline]
    pub(super) fn remaining_of(&self, word: u128, now: u64) -> u64 {
        self.config.limit() - u64::from(self.current(word, now).current)
    }

    /// The pure step for a cost `1 <= cost <= L`.
    #[inline]
    pub(super) fn step(&self, word: u128, now: u64, cost: u64) -> Step<u128> {
        let state = self.current(word, now);
        let end = (u128::from(state.window) + 1) * u128::from(self.config.window());
        let (decision, next) = self.judge(state.current, end, now, cost);
        Step {
            decision,
            next: next.map(|current| WindowWord { current, ..state }.pack()),
        }
    }

    /// The step on the count `current` of the window that ends at `end`,
    /// the one a call at `now` is judged in, for a cost `1 <= cost <= L`:
    /// the decision, and the count to store if admitted.
    #[inline]
    pub(super) fn judge(
        &self,
        current: u32,
        end: u128,
        now: u64,
        cost: u64,
    ) -> (Decision, Option<u32>) {
        let limit = self.config.limit();
        // c <= L < 2^32 and n <= L: the sum fits a u64.
        let after = u64::from(current) + cost;
        if after <= limit {
            // At most L <= 2^32 − 1: the 32-bit field holds it (`cell`).
            (Decision::admit(limit - after), Some(after as u32))
        } else {
            let remaining = limit - u64::from(current);
            (Decision::reject(remaining, until(end, now)), None)
        }
    }

    /// The pure refund step: `min(n, c)` back to the window that holds
    /// `now`, if the admission at `at` was counted in it; nothing for one
    /// of an earlier window (that count is gone). The word to store, if
    /// any.
    #[inline]
    pub(super) fn give_back(
        &self,
        word: u128,
        now: u64,
        ago: u64,
        cost: u64,
    ) -> (u64, Option<u128>) {
        // An admission before the origin was none of this state's.
        let Some(at) = now.checked_sub(ago) else {
            return (0, None);
        };
        let state = self.current(word, now);
        if WindowWord::index(at, self.config.window()) != state.window {
            return (0, None);
        }
        let given = cost.min(u64::from(state.current));
        if given == 0 {
            return (0, None);
        }
        // given <= c: the count stays in its 32 bits.
        let current = state.current - given as u32;
        (given, Some(WindowWord { current, ..state }.pack()))
    }

    /// Whether a word is idle at `now`: the window that holds `now` has no
    /// admission (the stored one with a count of 0, or a later one).
    #[inline]
    pub(super) fn idle_of(&self, word: u128, now: u64) -> bool {
        self.current(word, now).current == 0
    }

    /// What a word had spent (`window_spent`).
    pub(super) fn spent_of(&self, word: u128, now: u64) -> Spent {
        window_spent(self.config, word, now, |word, at| {
            self.remaining_of(word, at)
        })
    }

    /// The word of a state that has spent `min(spent, L)` at `now`.
    pub(super) fn spent_word(&self, spent: u64, now: u64) -> u128 {
        spent_window_word(self.config, spent, now)
    }
}

impl sealed::Sealed for FixedWindow {}

impl Policy for FixedWindow {
    type State = FixedWindowState;
    type Origin = u64;
    const KIND: PolicyKind = PolicyKind::FixedWindow;

    fn new(config: Config) -> Result<Self, ConfigError> {
        Ok(Self {
            config: config.check_for(Self::KIND)?,
        })
    }

    fn config(&self) -> Config {
        self.config
    }

    fn new_state(&self) -> FixedWindowState {
        FixedWindowState {
            word: AtomicU128::new(WindowWord::default().pack()),
        }
    }

    /// Linearised at the one CAS that adds all `cost` to the count.
    #[inline]
    fn check_within(
        &self,
        state: &FixedWindowState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, Retired> {
        transition(&state.word, |word| self.step(word, now, cost))
    }

    #[inline]
    fn check_unshared(
        &self,
        state: FixedWindowState,
        now: u64,
        cost: u64,
    ) -> (FixedWindowState, Decision) {
        let (word, decision) =
            cell::transition_unshared(state.word, |word| self.step(word, now, cost));
        (FixedWindowState { word }, decision)
    }

    #[inline]
    fn remaining(&self, state: &FixedWindowState, now: u64) -> Result<u64, Retired> {
        Ok(self.remaining_of(cell::read(&state.word)?, now))
    }

    fn refund(
        &self,
        state: &FixedWindowState,
        now: u64,
        ago: u64,
        cost: u64,
    ) -> Result<u64, Retired> {
        if super::gives_nothing(self.config, ago, cost) {
            return Ok(0);
        }
        cell::update(&state.word, |word| self.give_back(word, now, ago, cost))
    }

    /// Idle when the window that holds `now` has no admission: it is the
    /// stored one with a count of 0, or a later one (counts start at 0).
    fn retire_if_idle(&self, state: &FixedWindowState, now: u64) -> bool {
        cell::retire_if(&state.word, |word| self.idle_of(word, now))
    }

    /// Judged no earlier than the start of the stored window (`spent_of`).
    fn retire_spent(&self, state: &FixedWindowState, now: u64) -> Spent {
        let (word, _) = cell::retire(&state.word);
        self.spent_of(word, now)
    }

    fn spent_state(&self, spent: u64, now: u64) -> FixedWindowState {
        FixedWindowState {
            word: AtomicU128::new(self.spent_word(spent, now)),
        }
    }

    fn save_words(&self, state: &FixedWindowState, out: &mut Vec<u64>) -> Result<(), Retired> {
        cell::save_wide_word(&state.word, out)
    }

    fn load_words(&self, words: &[u64]) -> Option<FixedWindowState> {
        let word = cell::loaded_wide_word(words)?;
        WindowWord::unpack(word)
            .holds_at_most(self.config.limit(), false)
            .then(|| FixedWindowState {
                word: AtomicU128::new(word),
            })
    }

    fn is_retired(&self, state: &FixedWindowState) -> bool {
        AtomicU128::is_retired(state.word.load_word())
    }

    fn relocate(&self, state: &FixedWindowState) -> Option<FixedWindowState> {
        let (word, retired_now) = cell::retire(&state.word);
        retired_now.then(|| FixedWindowState {
            word: AtomicU128::new(word),
        })
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn windows_start_at_the_origin() {
        let policy = FixedWindow::new(Config::per_ticks(2, 100).unwrap()).unwrap();
        let state = policy.new_state();
        assert_eq!(policy.check(&state, 0), Ok(Decision::admit(1)));
        assert_eq!(policy.check(&state, 99), Ok(Decision::admit(0)));
        assert_eq!(policy.check(&state, 99), Ok(Decision::reject(0, 1)));
        assert_eq!(policy.remaining(&state, 100), Ok(2));
        assert_eq!(policy.check(&state, 100), Ok(Decision::admit(1)));
        // Back in window 0: judged in window 1, where one is left.
        assert_eq!(policy.check(&state, 50), Ok(Decision::admit(0)));
        assert_eq!(policy.check(&state, 50), Ok(Decision::reject(0, 150)));
    }

    #[test]
    fn idle_once_the_window_with_admissions_is_over() {
        let policy = FixedWindow::new(Config::per_ticks(2, 100).unwrap()).unwrap();
        let state = policy.new_state();
        assert!(policy.retire_if_idle(&policy.new_state(), 0), "never used");
        policy.check(&state, 150).unwrap();
        assert!(!policy.retire_if_idle(&state, 199));
        assert!(policy.retire_if_idle(&state, 200));
        assert_eq!(policy.check(&state, 200), Err(Retired));
    }

    #[test]
    fn spent_is_carried_in_the_same_window() {
        let policy = FixedWindow::new(Config::per_ticks(100, 1_000).unwrap()).unwrap();
        let state = policy.new_state();
        for _ in 0..80 {
            policy.check(&state, 1_500).unwrap();
        }
        assert_eq!(
            policy.retire_spent(&state, 1_600),
            Spent {
                count: 80,
                at: 1_600
            }
        );
        // Judged at the start of its window, never in the one before.
        let drained = policy.new_state();
        for _ in 0..100 {
            policy.check(&drained, 1_000).unwrap();
        }
        assert_eq!(
            policy.retire_spent(&drained, 999),
            Spent {
                count: 100,
                at: 1_000
            }
        );
        let wider = FixedWindow::new(Config::per_ticks(200, 1_000).unwrap()).unwrap();
        let carried = wider.spent_state(80, 1_600);
        assert_eq!(wider.remaining(&carried, 1_999), Ok(120));
        assert_eq!(wider.remaining(&carried, 2_000), Ok(200));
    }
}
