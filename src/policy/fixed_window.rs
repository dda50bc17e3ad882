//! `fixed-window`: at most `L` admissions in each window
//! `[k·W, (k+1)·W)` of the client's own grid (windows start at its origin,
//! so clients do not all reset at once).

use super::{saturate, sealed, Policy};
use crate::cell::{transition, AtomicWord, Step, WindowWord};
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
        let window = now / self.config.window();
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
    fn step(&self, word: u128, now: u64) -> Step<u128> {
        let mut state = self.current(word, now);
        let limit = self.config.limit();
        if u64::from(state.current) < limit {
            state.current += 1;
            Step {
                decision: Decision::admit(limit - u64::from(state.current)),
                next: Some(state.pack()),
            }
        } else {
            let end = (u128::from(state.window) + 1) * u128::from(self.config.window());
            Step {
                decision: Decision::reject(0, saturate(end - u128::from(now))),
                next: None,
            }
        }
    }
}

impl sealed::Sealed for FixedWindow {}

impl Policy for FixedWindow {
    type State = FixedWindowState;
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

    #[inline]
    fn check(&self, state: &FixedWindowState, now: u64) -> Decision {
        transition(&state.word, |word| self.step(word, now))
    }

    #[inline]
    fn remaining(&self, state: &FixedWindowState, now: u64) -> u64 {
        let current = self.current(state.word.load_word(), now).current;
        self.config.limit() - u64::from(current)
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn windows_start_at_the_origin() {
        let policy = FixedWindow::new(Config::new(2, 100).unwrap()).unwrap();
        let state = policy.new_state();
        assert_eq!(policy.check(&state, 0), Decision::admit(1));
        assert_eq!(policy.check(&state, 99), Decision::admit(0));
        assert_eq!(policy.check(&state, 99), Decision::reject(0, 1));
        assert_eq!(policy.remaining(&state, 100), 2);
        assert_eq!(policy.check(&state, 100), Decision::admit(1));
        // Back in window 0: judged in window 1, where one is left.
        assert_eq!(policy.check(&state, 50), Decision::admit(0));
        assert_eq!(policy.check(&state, 50), Decision::reject(0, 150));
    }
}
