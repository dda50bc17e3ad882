//! A drip rule beside a window rule in one 16-byte word and the client's
//! origin, for the rules whose fields the origin-free layout
//! ([`WindowPair`](super::WindowPair)) cannot hold: a long window with a
//! large limit (a year of 2^32 − 1), a counter of large limits. The window
//! keeps its index from the origin, only its low bits, as many as the drip
//! rule's schedule leaves ambiguous (layout at [`WideWindowPair`]). A state
//! takes 24 bytes, a 48-byte slot with its key.

use super::combine::beyond;
use super::pair::WordRule;
use super::window_pair::{join_word, split_word, DripWindow, WindowRule};
use super::{sealed, Policy, Retired, Spent};
use crate::cell::{self, schedule_time, transition, AtomicWord, Step, Stepper, WindowWord};
use crate::limiter::since_origin;
use crate::sync::AtomicU128;
use crate::{Config, ConfigError, Decision, PolicyKind, RuleAnswers, RuleSet, Tick};

/// Where the window rule's fields sit in the upper 64 bits of a
/// [`WideWindowPair`]'s word (layout there).
#[derive(Clone, Copy, Debug)]
struct Fields {
    /// Bits of one count: as many as `L` takes.
    count: u32,
    /// Bits of every count: `count`, or twice it with the previous
    /// window's; the window index's low bits sit above them.
    counts: u32,
    /// The mask of the index's low bits: `2^(64 − counts) − 1`.
    index: u64,
}

impl Fields {
    /// The fields for `window` beside a drip rule of window `reach`, if
    /// they fit: `64 − counts` index bits must tell apart every index the
    /// schedule leaves possible, `⌊2·reach / W⌋ + 2` of them (layout).
    fn fit(window: &WindowRule, reach: u64) -> Option<Self> {
        let count = window.count_bits();
        let counts = count * window.counts();
        let index_bits = 64u32.checked_sub(counts).filter(|&bits| bits >= 1)?;
        let possible = 2 * u128::from(reach) / u128::from(window.config().window()) + 2;
        (possible <= 1u128 << index_bits).then(|| Self {
            count,
            counts,
            index: u64::MAX >> counts,
        })
    }

    #[inline(always)]
    fn count_mask(self) -> u64 {
        (1 << self.count) - 1
    }

    /// Whether a loaded word's upper part holds counts a window rule of
    /// `limit` stores (no previous one for a fixed window).
    fn holds(self, part: u64, limit: u64) -> bool {
        let (_, previous, current) = self.split(part);
        u64::from(current) <= limit
            && (if self.counts > self.count {
                u64::from(previous) <= limit
            } else {
                true
            })
    }

    /// The window's counts and the low bits of its index, from the word's
    /// upper part.
    #[inline(always)]
    fn split(self, part: u64) -> (u64, u32, u32) {
        let current = part & self.count_mask();
        let previous = if self.counts > self.count {
            (part >> self.count) & self.count_mask()
        } else {
            0
        };
        // Each count is below 2^count <= 2^32: the casts are exact.
        (part >> self.counts, previous as u32, current as u32)
    }

    /// The upper part holding `word`'s counts and its index's low bits.
    #[inline(always)]
    fn join(self, word: WindowWord) -> u64 {
        // A fixed window's previous count is always 0 (its own step never
        // sets it), so it adds nothing below the index.
        ((word.window & self.index) << self.counts)
            | (u64::from(word.previous) << self.count)
            | u64::from(word.current)
    }
}

/// A drip rule (`gcra`, `leaky-bucket`, `token-bucket`) and a window rule
/// (`fixed-window`, `sliding-window-counter`) in one `u128` beside the
/// client's origin, updated by one 16-byte CAS.
///
/// Layout (`b` bits a count, as many as the window rule's `L` takes;
/// `c = b` for `fixed-window`, `2b` for `sliding-window-counter`):
///
/// ```text
///  127 126             63+c 63+c-1   63+b 63+b-1    63 62                0
/// +---+-------------------+------------+-------------+-------------------+
/// | R | index, low 64 − c | previous   |  current    | drip word (63)    |
/// +---+-------------------+------------+-------------+-------------------+
/// ```
///
/// * The drip word is the drip rule's own (`TAT`, or the drip from which
///   the bucket is full), below 2^63 as alone (`cell`'s layouts), in the
///   clock's ticks.
/// * The counts are the window's own, each at most `L < 2^b`: an admission
///   stores `c + n` only when `c + n <= L`.
/// * The window index counts windows from the origin, which the state
///   keeps beside the word (it fills the padding a 16-byte word leaves in
///   the store's slot). Only its low `m = 64 − c` bits are stored. The
///   rest follows from the drip word: every stored pair was written at some
///   instant `t` (an admission, a client's beginning, a carried spend) in
///   the window of that index, and then the drip word was within the drip
///   rule's window `D` of `t` (a schedule runs at most `D` ahead of its
///   admission and starts at most a drip behind the time it was built at).
///   So the index is one of the `⌊2D / W⌋ + 2` windows that meet
///   `[word − D, word + D]`, and `m` bits tell those apart: the pair is
///   built only when `2^m` is at least that many (`Fields::fit`: for
///   `fixed-window` a drip window up to 2^31 of the window's own, far past
///   any burst-and-quota pair; beyond, [`Compound`](super::Compound)
///   applies the rules).
/// * The stored index is found from the call's own (the one division a
///   window rule makes anyway) with no other in the common case: the
///   latest index at or before the call's own with the stored low bits is
///   the stored one when it lies among those possible windows;
///   above them, the stored window is `2^m >= 2` or more windows back and
///   its counts no longer matter, however long the client was idle; below
///   them (time went back before the stored window), the one possible
///   index with those bits is computed.
/// * Time: both rules read the clock through `schedule_time`, which stops
///   at 2^62 − 1 (146 years of nanoseconds), so the window's time stops
///   where the drip's does, which can only be stricter. The origin is kept
///   stopped there too.
#[derive(Clone, Debug)]
pub struct WideWindowPair {
    rules: DripWindow,
    fields: Fields,
}

/// One client's state under a [`WideWindowPair`]: both rules' words, and the
/// origin its window rule counts from.
#[derive(Debug)]
pub struct WideWindowPairState {
    words: AtomicU128,
    origin: u64,
}

impl WideWindowPair {
    /// The pair of `rules`, if they are a drip rule and a window rule
    /// whose fields fit (layout).
    ///
    /// # Errors
    ///
    /// [`ConfigError::RuleCount`] unless [`WideWindowPair::fits`].
    pub fn from_rules(rules: &RuleSet) -> Result<Self, ConfigError> {
        let (rules, fields) = DripWindow::fitted(rules, Fields::fit)?;
        Ok(Self { rules, fields })
    }

    /// Whether `rules` can be a window pair: a drip rule and a window rule
    /// whose fields fit the word (layout).
    pub fn fits(rules: &RuleSet) -> bool {
        Self::from_rules(rules).is_ok()
    }

    /// The window rule's word (a `WindowWord`) as a call `since` ticks past
    /// `origin` sees it: the stored counts under their full index, or no
    /// counts when the stored window is too far back to matter (layout: how
    /// the index is found). Always inlined: the hot path.
    #[inline(always)]
    fn seen(&self, part: u64, drip: u64, origin: u64, since: u64) -> u128 {
        let (low, previous, current) = self.fields.split(part);
        let width = self.rules.window.config().window();
        let reach = self.rules.drip.config().window();
        // The windows the schedule leaves possible, as bounds on ticks past
        // the origin: the stored index `k` has `k·W <= upper` and
        // `(k + 1)·W > lower` (`drip + D` stays below 2^64: the drip word
        // is below 2^63 and `D <= 2^62`).
        let upper = u128::from((drip + reach).saturating_sub(origin));
        let lower = u128::from(drip.saturating_sub(reach).max(origin) - origin);
        let here = since / width;
        let back = here.wrapping_sub(low) & self.fields.index;
        let window = if back <= here {
            let latest = here - back;
            if u128::from(latest) * u128::from(width) > upper {
                // Above every possible window: the stored one is 2^m >= 2
                // or more windows back, and counts nothing now.
                return WindowWord::default().pack();
            }
            if (u128::from(latest) + 1) * u128::from(width) > lower {
                latest
            } else {
                self.index_after(low, lower, width)
            }
        } else {
            self.index_after(low, lower, width)
        };
        WindowWord {
            window,
            previous,
            current,
        }
        .pack()
    }

    /// The one possible index with low bits `low`, from the first possible
    /// window (`lower / W`): a call before the stored window.
    #[cold]
    fn index_after(&self, low: u64, lower: u128, width: u64) -> u64 {
        // lower < 2^63: the quotient fits.
        let first = (lower / u128::from(width)) as u64;
        first + (low.wrapping_sub(first) & self.fields.index)
    }

    /// The drip rule's and the window rule's steps, in the set's order.
    #[inline(always)]
    fn step(&self, words: u128, origin: u64, now: u64, cost: u64) -> Step<u128> {
        let now = schedule_time(now);
        let (drip, part) = split_word(words);
        let (since, lag) = since_origin(origin, now);
        let seen = self.seen(part, drip, origin, since);
        let dripped = self.rules.drip.step(drip, now, cost);
        // A refusal by the drip rule needs of the window rule only whether
        // it refuses too, and why: not what an admission would leave.
        let mut windowed = self
            .rules
            .window
            .step(seen, since, cost, dripped.next.is_some());
        if lag != 0 && !windowed.decision.allowed {
            // A call before the origin is judged at it, `lag` later.
            windowed.decision.retry_after = windowed.decision.retry_after.saturating_add(lag);
        }
        let drip_remaining = || self.rules.drip.remaining(drip, now);
        let window_remaining = || self.rules.window.remaining(seen, since);
        let (decision, next) =
            self.rules
                .combine(dripped, windowed, drip_remaining, window_remaining);
        let fields = self.fields;
        Step {
            decision,
            next: next
                .map(|(drip, window)| join_word(drip, fields.join(WindowWord::unpack(window)))),
        }
    }

    /// Both rules' words as a call at `now` sees them: the drip word, the
    /// window's, the clock stopped where the drip's stops, and the call's
    /// ticks past the origin with its lag.
    fn read(&self, words: u128, origin: u64, now: u64) -> (u64, u128, u64, u64, u64) {
        let now = schedule_time(now);
        let (drip, part) = split_word(words);
        let (since, lag) = since_origin(origin, now);
        (drip, self.seen(part, drip, origin, since), now, since, lag)
    }

    fn remaining_of(&self, words: u128, origin: u64, now: u64) -> u64 {
        let (drip, window, now, since, _) = self.read(words, origin, now);
        self.rules
            .drip
            .remaining(drip, now)
            .min(self.rules.window.remaining(window, since))
    }
}

/// A wide pair's step at one `now` and cost, as a value whose step is
/// always inlined into the CAS loop (`cell::Stepper`).
struct WideStep<'p> {
    pair: &'p WideWindowPair,
    origin: u64,
    now: u64,
    cost: u64,
}

impl Stepper<u128> for WideStep<'_> {
    #[inline(always)]
    fn step(&mut self, words: u128) -> Step<u128> {
        self.pair.step(words, self.origin, self.now, self.cost)
    }
}

impl sealed::Sealed for WideWindowPair {}

impl Policy for WideWindowPair {
    type State = WideWindowPairState;
    type Origin = ();
    /// Unused: a pair reports its strictest rule's kind (`kind`).
    const KIND: PolicyKind = PolicyKind::Gcra;
    const SEVERAL: bool = true;

    /// A pair is made from its rules ([`WideWindowPair::from_rules`]); one
    /// `Config` names no policies, so this answers
    /// [`ConfigError::RuleCount`].
    fn new(_: Config) -> Result<Self, ConfigError> {
        Err(ConfigError::RuleCount { count: 1 })
    }

    fn config(&self) -> Config {
        self.rules.config()
    }

    fn new_state(&self) -> WideWindowPairState {
        self.begin(0)
    }

    /// The drip rule begun at `origin`, as alone; the window at index 0
    /// with nothing counted, its times counting from `origin`.
    fn begin(&self, origin: u64) -> WideWindowPairState {
        WideWindowPairState {
            words: AtomicU128::new(join_word(self.rules.drip.begin(origin), 0)),
            origin: schedule_time(origin),
        }
    }

    /// Always inlined, as `check_within`.
    #[inline(always)]
    fn check(&self, state: &WideWindowPairState, now: u64) -> Result<Decision, Retired> {
        self.check_within(state, now, 1)
    }

    #[inline]
    fn check_n(
        &self,
        state: &WideWindowPairState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, Retired> {
        if cost == 0 || cost > self.config().limit() {
            let remaining = self.remaining(state, now)?;
            return Ok(beyond(self.rules.set(), cost, remaining).expect("cost 0 or above a limit"));
        }
        self.check_within(state, now, cost)
    }

    /// Linearised at the one CAS that moves both rules' fields. Always
    /// inlined, as its step is (`WideStep`).
    #[inline(always)]
    fn check_within(
        &self,
        state: &WideWindowPairState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, Retired> {
        transition(
            &state.words,
            WideStep {
                pair: self,
                origin: state.origin,
                now,
                cost,
            },
        )
    }

    #[inline]
    fn check_unshared(
        &self,
        state: WideWindowPairState,
        now: u64,
        cost: u64,
    ) -> (WideWindowPairState, Decision) {
        let origin = state.origin;
        let (words, decision) =
            cell::transition_unshared(state.words, |words| self.step(words, origin, now, cost));
        (WideWindowPairState { words, origin }, decision)
    }

    #[inline]
    fn remaining(&self, state: &WideWindowPairState, now: u64) -> Result<u64, Retired> {
        Ok(self.remaining_of(cell::read(&state.words)?, state.origin, now))
    }

    /// Each rule gives back on its own, in one CAS of the word; the answer
    /// is the smaller of the two.
    fn refund(
        &self,
        state: &WideWindowPairState,
        now: u64,
        ago: u64,
        cost: u64,
    ) -> Result<u64, Retired> {
        cell::update(&state.words, |words| {
            let (drip, window, mut now, mut since, _) = self.read(words, state.origin, now);
            // A call before the stored window (time went back) is judged
            // at its start, the latest time the word is known to reflect,
            // and the admission is that much longer ago: a drip word moved
            // back from there still tells the window's index (layout).
            let start = WindowWord::unpack(window)
                .window
                .saturating_mul(self.rules.window.config().window());
            let mut ago = ago;
            if since < start {
                ago = ago.saturating_add(start - since);
                (now, since) = (state.origin.saturating_add(start), start);
            }
            let (drip_given, drip) = self.rules.drip.give_back(drip, now, ago, cost);
            let (window_given, window) = self.rules.window.give_back(window, since, ago, cost);
            // The window's index is read relative to the drip word (layout):
            // keep it within reach of `now`, where the window now is.
            let drip = self.rules.drip.settled(drip, now);
            let next = join_word(drip, self.fields.join(WindowWord::unpack(window)));
            (
                drip_given.min(window_given),
                (drip_given > 0 || window_given > 0).then_some(next),
            )
        })
    }

    /// Idle when both rules are (a window rule never before the origin):
    /// then it answers every later call as a new client's pair would.
    fn retire_if_idle(&self, state: &WideWindowPairState, now: u64) -> bool {
        cell::retire_if(&state.words, |words| {
            let (drip, window, now, since, lag) = self.read(words, state.origin, now);
            lag == 0 && WordRule::idle(drip, now) && self.rules.window.idle(window, since)
        })
    }

    /// The strictest rule's spend (what a carry-over of one count keeps),
    /// in the times of a state that counts from tick 0 (a tier's).
    fn retire_spent(&self, state: &WideWindowPairState, now: u64) -> Spent {
        let (words, _) = cell::retire(&state.words);
        let (drip, window, now, since, _) = self.read(words, state.origin, now);
        if self.rules.strictest_drips() {
            self.rules.drip.spent(drip, now)
        } else {
            self.rules.window.spent(window, since)
        }
    }

    fn spent_state(&self, spent: u64, now: u64) -> WideWindowPairState {
        self.spent_state_each(&[spent], now)
    }

    fn spent_state_each(&self, spent: &[u64], now: u64) -> WideWindowPairState {
        let (drip, window) = self.rules.split_spent(spent);
        let now = schedule_time(now);
        let window = WindowWord::unpack(self.rules.window.spent_word(window, now));
        WideWindowPairState {
            words: AtomicU128::new(join_word(
                self.rules.drip.spent_word(drip, now),
                self.fields.join(window),
            )),
            origin: 0,
        }
    }

    /// The word and the origin.
    fn save_words(&self, state: &WideWindowPairState, out: &mut Vec<u64>) -> Result<(), Retired> {
        cell::save_wide_word(&state.words, out)?;
        out.push(state.origin);
        Ok(())
    }

    fn load_words(&self, words: &[u64]) -> Option<WideWindowPairState> {
        let [low, high, origin] = *words else {
            return None;
        };
        let words = cell::loaded_wide_word(&[low, high])?;
        let (_, part) = split_word(words);
        self.fields
            .holds(part, self.rules.window.config().limit())
            .then(|| WideWindowPairState {
                words: AtomicU128::new(words),
                origin,
            })
    }

    fn is_retired(&self, state: &WideWindowPairState) -> bool {
        AtomicU128::is_retired(state.words.load_word())
    }

    fn relocate(&self, state: &WideWindowPairState) -> Option<WideWindowPairState> {
        let (words, retired_now) = cell::retire(&state.words);
        retired_now.then(|| WideWindowPairState {
            words: AtomicU128::new(words),
            origin: state.origin,
        })
    }

    fn forgets_after(&self) -> u64 {
        self.rules.forgets_after()
    }

    fn kind(&self) -> PolicyKind {
        self.rules.kind()
    }

    fn rule_set(&self) -> RuleSet {
        self.rules.set().clone()
    }

    fn in_ticks_of(&self, tick: Tick) -> Result<Self, ConfigError> {
        Self::from_rules(&self.rules.set().in_ticks_of(tick)?)
    }

    fn each(
        &self,
        state: &WideWindowPairState,
        now: u64,
        cost: u64,
        decided: &Decision,
    ) -> Result<RuleAnswers, Retired> {
        let (drip, window, now, since, lag) =
            self.read(cell::read(&state.words)?, state.origin, now);
        let window_step = || {
            let mut decision = self.rules.window.step(window, since, cost, true).decision;
            if !decision.allowed {
                decision.retry_after = decision.retry_after.saturating_add(lag);
            }
            decision
        };
        Ok(self.rules.each(
            (drip, now),
            cost,
            decided,
            window_step,
            self.rules.window.remaining(window, since),
        ))
    }
}
