//! `sliding-window-counter`: the fixed-window grid, with the previous
//! window's count weighted by how much of it the sliding window still
//! covers. With `p` admitted in the previous window, `c` in the current one
//! and `e` ticks into it, a request is admitted iff
//! `p·(W − e) + c·W < L·W` (all in exact integers). A request of cost `n`
//! is the last of `n` such requests at that instant: admitted iff
//! `p·(W − e) + (c + n − 1)·W < L·W`, then `c += n`, in one CAS. The
//! products are below 2^33 · 2^64 (`p, c, n <= L < 2^32`), exact in `i128`.

use super::{sealed, spent_window_word, until, window_spent, Policy, Retired, Spent};
use crate::cell::{self, transition, AtomicWord, Step, WindowWord};
use crate::sync::AtomicU128;
use crate::{Config, ConfigError, Decision, PolicyKind};

/// An approximation of the sliding window from two counters: the previous
/// window's count, weighted by overlap, plus the current one's.
#[derive(Clone, Copy, Debug)]
pub struct SlidingWindowCounter {
    config: Config,
}

/// One client's `sliding-window-counter` state: a `WindowWord` (layout in
/// `cell`).
#[derive(Debug)]
pub struct SlidingWindowCounterState {
    word: AtomicU128,
}

/// The counts as seen from one instant.
#[derive(Clone, Copy, Debug)]
pub(super) struct View {
    pub(super) counts: WindowWord,
    /// Ticks since the start of `counts.window`.
    pub(super) elapsed: u64,
}

impl SlidingWindowCounter {
    fn window(&self) -> u128 {
        u128::from(self.config.window())
    }

    /// The counts rolled forward to the window that holds `now`. A `now`
    /// before the stored window (time going back) is judged at the start of
    /// the stored window, its strictest instant.
    #[inline]
    fn view(&self, word: u128, now: u64) -> View {
        let stored = WindowWord::unpack(word);
        let window = WindowWord::index(now, self.config.window());
        if window <= stored.window {
            let elapsed = if window == stored.window {
                now % self.config.window()
            } else {
                0
            };
            return View {
                counts: stored,
                elapsed,
            };
        }
        let previous = if window == stored.window + 1 {
            stored.current
        } else {
            0
        };
        View {
            counts: WindowWord {
                window,
                previous,
                current: 0,
            },
            elapsed: now % self.config.window(),
        }
    }

    /// `L·W − p·(W − e) − c·W`: positive iff one more is admitted. `current`
    /// may be `c + n − 1` (below 2^33), for a request of cost `n`.
    #[inline]
    fn slack(&self, previous: u32, current: u64, elapsed: u64) -> i128 {
        let w = self.window() as i128;
        let weighted = i128::from(previous) * (w - i128::from(elapsed)) + i128::from(current) * w;
        i128::from(self.config.limit()) * w - weighted
    }

    /// Whether `slack(p, c, e) > 0`, without its signed 128-bit products:
    /// `c >= L` refuses (the weighted count is at least `c·W`), else it
    /// admits iff `p·(W − e) < (L − c)·W`, two products of 64-bit factors
    /// (one multiply each). `current` as in `slack`; `e < W` in every view.
    #[inline(always)]
    fn admits(&self, previous: u32, current: u64, elapsed: u64) -> bool {
        let (limit, width) = (self.config.limit(), self.config.window());
        current < limit
            && u128::from(previous) * u128::from(width - elapsed)
                < u128::from(limit - current) * u128::from(width)
    }

    /// `max(0, ⌈slack / W⌉)`, as `(L − c) − ⌊p·(W − e) / W⌋` (for an
    /// integer `A`, `⌈A − x⌉ = A − ⌊x⌋`): one division, of a `u64` when the
    /// product fits one (any count beside a window of up to 2^32 ticks, 4
    /// seconds of nanoseconds, and small counts beside any window), which
    /// costs a fraction of the `u128` one.
    #[inline]
    pub(super) fn remaining_of(&self, view: View) -> u64 {
        let open = self
            .config
            .limit()
            .saturating_sub(u64::from(view.counts.current));
        let width = self.config.window();
        // elapsed < W in every view (the counts' window holds the call, or
        // it is judged at the window's start).
        let weighted = u128::from(view.counts.previous) * u128::from(width - view.elapsed);
        let faded = match u64::try_from(weighted) {
            Ok(weighted) => weighted / width,
            // Below 2^32 · 2^64 / W: the quotient is at most p < 2^32.
            Err(_) => (weighted / u128::from(width)) as u64,
        };
        open.saturating_sub(faded)
    }

    /// The first offset `e >= from` in a window with counts `p`, `c` that
    /// admits a request, if any (`current` is `c + n − 1` for a cost `n`).
    #[inline(always)]
    fn first_open(&self, previous: u32, current: u64, from: u64) -> Option<u64> {
        let w = self.config.window();
        if from >= w || current >= self.config.limit() {
            return None;
        }
        if previous == 0 {
            return Some(from);
        }
        // Admitted iff p·e > p·W + c·W − L·W = −slack(p, c, 0).
        let excess = -self.slack(previous, current, 0);
        let first = if excess < 0 {
            0
        } else if let Ok(excess) = u64::try_from(excess) {
            // The common case, a division of a `u64` (a fraction of the
            // `u128` one's cost).
            u128::from(excess / u64::from(previous) + 1)
        } else {
            excess as u128 / u128::from(previous) + 1
        };
        let first = first.max(u128::from(from));
        (first < u128::from(w)).then_some(first as u64)
    }

    /// Ticks from `now` to the first instant that admits a request of cost
    /// `cost`, rejected at `view`: in this window, else the next (counts
    /// `(c, 0)`), else the one after (`(0, 0)`, which admits any cost up to
    /// `L` at its start).
    #[inline(always)]
    fn retry_after(&self, view: View, now: u64, cost: u64) -> u64 {
        let WindowWord {
            window,
            previous,
            current,
        } = view.counts;
        let start = u128::from(window) * self.window();
        let extra = cost - 1;
        let at = if let Some(e) =
            self.first_open(previous, u64::from(current) + extra, view.elapsed + 1)
        {
            start + u128::from(e)
        } else if let Some(e) = self.first_open(current, extra, 0) {
            start + self.window() + u128::from(e)
        } else {
            start + 2 * self.window()
        };
        until(at, now)
    }

    /// The pure step for a cost `1 <= cost <= L`.
    #[inline]
    fn step(&self, word: u128, now: u64, cost: u64) -> Step<u128> {
        self.step_counted(word, now, cost, true)
    }

    /// The pure step; an admission answers what it leaves only if
    /// `counted` (else `remaining` 0, for a caller that only needs to know
    /// whether this rule admits: several rules, one of which refused).
    #[inline]
    pub(super) fn step_counted(
        &self,
        word: u128,
        now: u64,
        cost: u64,
        counted: bool,
    ) -> Step<u128> {
        let (decision, next) = self.step_view(self.view(word, now), now, cost, counted);
        Step {
            decision,
            next: next.map(WindowWord::pack),
        }
    }

    /// The step on the counts as seen at `now` (`view`, or a caller's own
    /// view in times of its own: [`WindowPair`](super::WindowPair)), for a
    /// cost `1 <= cost <= L`: the decision, and the counts to store if
    /// admitted. Always inlined: with the pairs and the frames calling it
    /// too, the compiler stopped inlining it into the counter's own check,
    /// which then called it (one-rule rows of `floodgate bench`).
    #[inline(always)]
    pub(super) fn step_view(
        &self,
        view: View,
        now: u64,
        cost: u64,
        counted: bool,
    ) -> (Decision, Option<WindowWord>) {
        let counts = view.counts;
        // c + n − 1 < 2^33: no overflow.
        let last = u64::from(counts.current) + (cost - 1);
        if self.admits(counts.previous, last, view.elapsed) {
            let counts = WindowWord {
                // Admitted means (c + n − 1)·W < L·W: c + n <= L <= 2^32 − 1,
                // which the 32-bit field holds (`cell`).
                current: (last + 1) as u32,
                ..counts
            };
            let remaining = if counted {
                self.remaining_of(View { counts, ..view })
            } else {
                0
            };
            (Decision::admit(remaining), Some(counts))
        } else {
            // Refused: slack(p, c + n − 1, e) <= 0, so slack(p, c, e) is at
            // most (n − 1)·W and what is left at most n − 1: 0 for a cost of
            // 1, with no division (a hot client's refusals).
            let remaining = if cost == 1 {
                0
            } else {
                self.remaining_of(view)
            };
            let decision = Decision::reject(remaining, self.retry_after(view, now, cost));
            (decision, None)
        }
    }

    /// The pure refund step: back to the count of the window that holds
    /// `at`, if it is the current window (`min(n, c)`) or the previous one
    /// (`min(n, p)`), the counts rolled forward to `now` as a check rolls
    /// them; nothing for an older window. The word to store, if any.
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
        let View { mut counts, .. } = self.view(word, now);
        let admitted = WindowWord::index(at, self.config.window());
        let count = if admitted == counts.window {
            &mut counts.current
        } else if admitted.checked_add(1) == Some(counts.window) {
            &mut counts.previous
        } else {
            return (0, None);
        };
        let given = cost.min(u64::from(*count));
        if given == 0 {
            return (0, None);
        }
        // given <= the count: it stays in its 32 bits.
        *count -= given as u32;
        (given, Some(counts.pack()))
    }

    /// `remaining` of a word at `now`.
    #[inline]
    pub(super) fn remaining_at(&self, word: u128, now: u64) -> u64 {
        self.remaining_of(self.view(word, now))
    }

    /// Whether a word is idle at `now`: both counts seen from `now` are 0,
    /// so every later window starts from (0, 0), as a new client's do.
    #[inline]
    pub(super) fn idle_of(&self, word: u128, now: u64) -> bool {
        let counts = self.view(word, now).counts;
        counts.previous == 0 && counts.current == 0
    }

    /// What a word had spent (`window_spent`, as `fixed-window`).
    pub(super) fn spent_of(&self, word: u128, now: u64) -> Spent {
        window_spent(self.config, word, now, |word, at| {
            self.remaining_at(word, at)
        })
    }

    /// The word of a state that has spent `min(spent, L)` at `now`.
    pub(super) fn spent_word(&self, spent: u64, now: u64) -> u128 {
        spent_window_word(self.config, spent, now)
    }
}

impl sealed::Sealed for SlidingWindowCounter {}

impl Policy for SlidingWindowCounter {
    type State = SlidingWindowCounterState;
    type Origin = u64;
    const KIND: PolicyKind = PolicyKind::SlidingWindowCounter;

    fn new(config: Config) -> Result<Self, ConfigError> {
        Ok(Self {
            config: config.check_for(Self::KIND)?,
        })
    }

    fn config(&self) -> Config {
        self.config
    }

    fn new_state(&self) -> SlidingWindowCounterState {
        SlidingWindowCounterState {
            word: AtomicU128::new(WindowWord::default().pack()),
        }
    }

    /// Linearised at the one CAS that adds all `cost` to the current count.
    #[inline]
    fn check_within(
        &self,
        state: &SlidingWindowCounterState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, Retired> {
        transition(&state.word, |word| self.step(word, now, cost))
    }

    #[inline]
    fn check_unshared(
        &self,
        state: SlidingWindowCounterState,
        now: u64,
        cost: u64,
    ) -> (SlidingWindowCounterState, Decision) {
        let (word, decision) =
            cell::transition_unshared(state.word, |word| self.step(word, now, cost));
        (SlidingWindowCounterState { word }, decision)
    }

    #[inline]
    fn remaining(&self, state: &SlidingWindowCounterState, now: u64) -> Result<u64, Retired> {
        Ok(self.remaining_at(cell::read(&state.word)?, now))
    }

    fn refund(
        &self,
        state: &SlidingWindowCounterState,
        now: u64,
        ago: u64,
        cost: u64,
    ) -> Result<u64, Retired> {
        if super::gives_nothing(self.config, ago, cost) {
            return Ok(0);
        }
        cell::update(&state.word, |word| self.give_back(word, now, ago, cost))
    }

    /// Idle when both counts seen from `now` are 0 (`idle_of`).
    fn retire_if_idle(&self, state: &SlidingWindowCounterState, now: u64) -> bool {
        cell::retire_if(&state.word, |word| self.idle_of(word, now))
    }

    /// Judged no earlier than the start of the stored window (`spent_of`).
    fn retire_spent(&self, state: &SlidingWindowCounterState, now: u64) -> Spent {
        let (word, _) = cell::retire(&state.word);
        self.spent_of(word, now)
    }

    fn spent_state(&self, spent: u64, now: u64) -> SlidingWindowCounterState {
        SlidingWindowCounterState {
            word: AtomicU128::new(self.spent_word(spent, now)),
        }
    }

    fn save_words(
        &self,
        state: &SlidingWindowCounterState,
        out: &mut Vec<u64>,
    ) -> Result<(), Retired> {
        cell::save_wide_word(&state.word, out)
    }

    fn load_words(&self, words: &[u64]) -> Option<SlidingWindowCounterState> {
        let word = cell::loaded_wide_word(words)?;
        WindowWord::unpack(word)
            .holds_at_most(self.config.limit(), true)
            .then(|| SlidingWindowCounterState {
                word: AtomicU128::new(word),
            })
    }

    fn is_retired(&self, state: &SlidingWindowCounterState) -> bool {
        AtomicU128::is_retired(state.word.load_word())
    }

    fn relocate(&self, state: &SlidingWindowCounterState) -> Option<SlidingWindowCounterState> {
        let (word, retired_now) = cell::retire(&state.word);
        retired_now.then(|| SlidingWindowCounterState {
            word: AtomicU128::new(word),
        })
    }

    fn forgets_after(&self) -> u64 {
        self.config.window().saturating_mul(2)
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;
    use crate::MAX_LIMIT;

    fn policy(limit: u64, window: u64) -> SlidingWindowCounter {
        SlidingWindowCounter::new(Config::per_ticks(limit, window).unwrap()).unwrap()
    }

    /// `admits` is `slack > 0` at the edges of every factor: the largest
    /// limit, counts past it (a cost's `c + n − 1`), windows up to 2^64 − 1
    /// ticks, and the products' tie (`p·(W − e) = (L − c)·W` refuses).
    #[test]
    fn admits_exactly_when_slack_is_positive() {
        for limit in [1, 2, 4, 6_000, MAX_LIMIT] {
            for window in [1, 2, 100, 60_000_000_000, 1 << 32, 1 << 62, u64::MAX] {
                let policy = policy(limit, window);
                let previous = [0, 1, 2, 4, limit - 1, limit, u32::MAX as u64];
                let current = [0, 1, 3, limit - 1, limit, limit + 1, limit + MAX_LIMIT - 1];
                let elapsed = [0, 1, window / 4, window / 2, window - 1];
                for &p in &previous {
                    for &c in &current {
                        for &e in &elapsed {
                            let p = p as u32;
                            assert_eq!(
                                policy.admits(p, c, e),
                                policy.slack(p, c, e) > 0,
                                "L {limit}, W {window}, p {p}, c {c}, e {e}"
                            );
                        }
                    }
                }
            }
        }
        // The tie: 4·(100 − 0) = (4 − 0)·100.
        assert!(!policy(4, 100).admits(4, 0, 0));
        assert!(policy(4, 100).admits(4, 0, 1));
    }

    #[test]
    fn the_previous_window_fades_out() {
        let policy = policy(4, 100);
        let state = policy.new_state();
        for _ in 0..4 {
            assert!(policy.check(&state, 10).unwrap().allowed);
        }
        // Window 1, e = 0: 4·100 >= 400, rejected; first open e: 4e > 0 → 1.
        assert_eq!(policy.check(&state, 100), Ok(Decision::reject(0, 1)));
        // e = 25: 4·75 = 300 < 400, one fits: remaining ⌈100/100⌉ = 1 → 0 after.
        assert_eq!(policy.check(&state, 125), Ok(Decision::admit(0)));
        assert_eq!(policy.remaining(&state, 150), Ok(1));
        // Two windows later everything is forgotten.
        assert_eq!(policy.remaining(&state, 300), Ok(4));
    }

    #[test]
    fn idle_once_both_counts_are_behind() {
        let policy = policy(4, 100);
        let state = policy.new_state();
        policy.check(&state, 150).unwrap(); // window 1
        assert!(!policy.retire_if_idle(&state, 299)); // window 2: previous = 1
        assert!(policy.retire_if_idle(&state, 300)); // window 3: (0, 0)
        assert_eq!(policy.check(&state, 300), Err(Retired));
    }

    #[test]
    fn window_of_one_tick_waits_two_windows_when_full() {
        let policy = policy(1, 1);
        let state = policy.new_state();
        assert!(policy.check(&state, 0).unwrap().allowed);
        // At 0 full; at 1 the previous window (count 1) weighs 1·(1 − 0) = 1.
        assert_eq!(policy.check(&state, 0), Ok(Decision::reject(0, 2)));
    }
}
