//! A drip rule (`gcra`, `token-bucket`, `leaky-bucket`) beside a window
//! rule (`fixed-window`, `sliding-window-counter`) in one 16-byte word,
//! decided by one compare-and-swap: the burst limit and the daily quota at
//! about one rule's cost, with no allocation, no pointer, and no division to
//! find the window a call falls in (one rule alone divides its time by `W`
//! on every call).
//!
//! The window rule keeps the end of its window instead of an index from the
//! client's origin: the end carries the grid's phase, so the state needs no
//! origin and fits a 32-byte slot with its key. The end is stored as an
//! offset from the drip rule's word, only as wide as the two windows make
//! it, and each count only as wide as the limit (layout at [`WindowPair`]).
//! Rules whose fields do not fit keep the window's index and the origin
//! instead ([`WideWindowPair`](super::WideWindowPair)).
//!
//! Each rule's own step decides on its part of the word (the window rule's
//! on its counts as a call sees them), the word is stored only if both
//! admit (`combine::two`), through the one-rule CAS loop
//! (`cell::transition`): a pass repeats only when its CAS lost to another
//! thread's successful one.

use super::combine::{self, beyond, own_answer};
use super::pair::WordRule;
use super::sliding_window_counter::View;
use super::{sealed, FixedWindow, Policy, Retired, SlidingWindowCounter, Spent};
use crate::cell::{self, schedule_time, transition, AtomicWord, Step, Stepper, WindowWord};
use crate::sync::AtomicU128;
use crate::{Config, ConfigError, Decision, PolicyKind, Rule, RuleAnswers, RuleSet, Tick};

/// A window rule: `fixed-window` or `sliding-window-counter`.
#[derive(Clone, Copy, Debug)]
pub(super) enum WindowRule {
    Fixed(FixedWindow),
    Counter(SlidingWindowCounter),
}

impl WindowRule {
    pub(super) fn new(rule: Rule) -> Option<Self> {
        let config = rule.config();
        match rule.policy() {
            PolicyKind::FixedWindow => FixedWindow::new(config).ok().map(Self::Fixed),
            PolicyKind::SlidingWindowCounter => {
                SlidingWindowCounter::new(config).ok().map(Self::Counter)
            }
            _ => None,
        }
    }

    pub(super) fn config(&self) -> Config {
        match self {
            Self::Fixed(p) => p.config(),
            Self::Counter(p) => p.config(),
        }
    }

    /// How many counts a word keeps: the current window's, and for the
    /// counter the previous one's.
    pub(super) fn counts(&self) -> u32 {
        match self {
            Self::Fixed(_) => 1,
            Self::Counter(_) => 2,
        }
    }

    /// The bits of one count: as many as `L` takes.
    pub(super) fn count_bits(&self) -> u32 {
        u64::BITS - self.config().limit().leading_zeros()
    }

    /// The rule's pure step on a `WindowWord` at `since` ticks past the
    /// origin, for `1 <= cost <= L`; an admission answers what it leaves
    /// only if `counted` (else its `remaining` is not to be read: the other
    /// rule refused, and `combine::two` asks for it through a closure).
    #[inline(always)]
    pub(super) fn step(&self, word: u128, since: u64, cost: u64, counted: bool) -> Step<u128> {
        match self {
            Self::Fixed(p) => p.step(word, since, cost),
            Self::Counter(p) => p.step_counted(word, since, cost, counted),
        }
    }

    #[inline]
    pub(super) fn remaining(&self, word: u128, since: u64) -> u64 {
        match self {
            Self::Fixed(p) => p.remaining_of(word, since),
            Self::Counter(p) => p.remaining_at(word, since),
        }
    }

    pub(super) fn idle(&self, word: u128, since: u64) -> bool {
        match self {
            Self::Fixed(p) => p.idle_of(word, since),
            Self::Counter(p) => p.idle_of(word, since),
        }
    }

    pub(super) fn spent(&self, word: u128, since: u64) -> Spent {
        match self {
            Self::Fixed(p) => p.spent_of(word, since),
            Self::Counter(p) => p.spent_of(word, since),
        }
    }

    pub(super) fn spent_word(&self, spent: u64, since: u64) -> u128 {
        match self {
            Self::Fixed(p) => p.spent_word(spent, since),
            Self::Counter(p) => p.spent_word(spent, since),
        }
    }

    pub(super) fn forgets_after(&self) -> u64 {
        match self {
            Self::Fixed(p) => p.forgets_after(),
            Self::Counter(p) => p.forgets_after(),
        }
    }

    /// The rule's own step on the window a call is judged in, for
    /// `1 <= cost <= L`: the decision, and the counts to store if admitted
    /// (`counted` as in [`step`](Self::step)).
    #[inline(always)]
    pub(super) fn decide(
        &self,
        judged: Judged,
        now: u64,
        cost: u64,
        counted: bool,
    ) -> (Decision, Option<Counts>) {
        match self {
            Self::Fixed(p) => {
                let (decision, next) = p.judge(judged.counts.current, judged.end, now, cost);
                let next = next.map(|current| Counts {
                    previous: 0,
                    current,
                });
                (decision, next)
            }
            Self::Counter(p) => {
                // In the counter's own times with the judged window as
                // window 1 (its start at `W`), a call `elapsed` into it.
                let (view, at) = judged.view(p.config().window());
                let (mut decision, next) = p.step_view(view, at, cost, counted);
                if !decision.allowed {
                    // A call before the window is judged at its start.
                    decision.retry_after = decision.retry_after.saturating_add(judged.before);
                }
                let next = next.map(|word| Counts {
                    previous: word.previous,
                    current: word.current,
                });
                (decision, next)
            }
        }
    }

    /// What an admission that left `counts` in the judged window leaves,
    /// or any figure at least `other` when that is no more: the smaller of
    /// the two is the pair's answer. The counter's previous count fades by
    /// at most itself, so `L − c − p` bounds what it leaves from below, and
    /// above `other` no division is needed.
    #[inline(always)]
    pub(super) fn left(&self, judged: Judged, counts: Counts, other: u64) -> u64 {
        let open = self
            .config()
            .limit()
            .saturating_sub(u64::from(counts.current));
        match self {
            Self::Fixed(_) => open,
            Self::Counter(_) if open.saturating_sub(u64::from(counts.previous)) >= other => open,
            Self::Counter(p) => {
                p.remaining_of(Judged { counts, ..judged }.view(p.config().window()).0)
            }
        }
    }

    /// The rule's own refund on a `WindowWord` at `since` ticks past the
    /// origin, of an admission `at` ticks past it (`Policy::refund`): the
    /// units given back and the word after.
    #[inline]
    pub(super) fn give_back(&self, word: u128, since: u64, ago: u64, cost: u64) -> (u64, u128) {
        if super::gives_nothing(self.config(), ago, cost) {
            return (0, word);
        }
        let (given, next) = match self {
            Self::Fixed(p) => p.give_back(word, since, ago, cost),
            Self::Counter(p) => p.give_back(word, since, ago, cost),
        };
        (given, next.unwrap_or(word))
    }

    /// The rule's own refund, on the window a call is judged in, of an
    /// admission at `at` (the clock's ticks, as the window's end): back to
    /// the count of the window that holds `at` if it is this window, or for
    /// the counter the one before (`Policy::refund` of each rule alone).
    /// The units given back and the counts after.
    #[inline]
    pub(super) fn give_back_in(
        &self,
        judged: Judged,
        now: u64,
        ago: u64,
        cost: u64,
    ) -> (u64, Counts) {
        let mut counts = judged.counts;
        if let Self::Fixed(_) = self {
            // A fixed window keeps no previous count (`judge` moves the
            // stored count there for the counter's sake): the layouts
            // give it no bits.
            counts.previous = 0;
        }
        if super::gives_nothing(self.config(), ago, cost) {
            return (0, counts);
        }
        let width = u128::from(self.config().window());
        // The clock's ticks from 0: an admission `ago` before `now` is at
        // most `now`; one before tick 0 was none of this state's.
        let Some(at) = now.checked_sub(ago) else {
            return (0, counts);
        };
        let at = u128::from(at);
        // The window is [end − W, end); `end` is above W (layouts).
        let start = judged.end.saturating_sub(width);
        let count = if at >= start {
            &mut counts.current
        } else if matches!(self, Self::Counter(_)) && at >= start.saturating_sub(width) {
            &mut counts.previous
        } else {
            return (0, counts);
        };
        let given = cost.min(u64::from(*count));
        // given <= the count: it stays in its bits.
        *count -= given as u32;
        (given, counts)
    }

    /// Whether the window a call is judged in leaves the rule idle: it has
    /// no admission (and for the counter, neither had the one before).
    #[inline]
    pub(super) fn idle_in(&self, judged: Judged) -> bool {
        let counts = judged.counts;
        match self {
            Self::Fixed(_) => counts.current == 0,
            Self::Counter(_) => counts.previous == 0 && counts.current == 0,
        }
    }

    /// `remaining` on the window a call is judged in.
    #[inline]
    pub(super) fn remaining_in(&self, judged: Judged) -> u64 {
        match self {
            Self::Fixed(p) => p.config().limit() - u64::from(judged.counts.current),
            Self::Counter(p) => p.remaining_of(judged.view(p.config().window()).0),
        }
    }
}

/// A window rule's counts: the current window's, and the previous one's
/// (always 0 for `fixed-window`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Counts {
    pub(super) previous: u32,
    pub(super) current: u32,
}

/// The window a call is judged in: the one that holds its time, or the
/// stored one for a call before it (time went back), judged at its start.
#[derive(Clone, Copy, Debug)]
pub(super) struct Judged {
    pub(super) counts: Counts,
    /// The window's end, in the clock's ticks (stopped at the horizon).
    pub(super) end: u128,
    /// Ticks from the window's start to the call.
    elapsed: u64,
    /// Ticks from the call to the window's start, for a call before it.
    pub(super) before: u64,
}

impl Judged {
    /// The counter's view of this window as window 1 of its own grid, and
    /// the call's time there.
    #[inline(always)]
    fn view(self, width: u64) -> (View, u64) {
        let view = View {
            counts: WindowWord {
                window: 1,
                previous: self.counts.previous,
                current: self.counts.current,
            },
            elapsed: self.elapsed,
        };
        // elapsed < W < 2^63 (`Fields::fit`): the sum fits.
        (view, width + self.elapsed)
    }
}

/// Where the window rule's fields sit in the upper 64 bits of a
/// [`WindowPair`]'s word, and the two windows they are read with.
#[derive(Clone, Copy, Debug)]
struct Fields {
    /// Bits of one count.
    count: u32,
    /// Bits of every count: `count`, or twice it with the previous
    /// window's; the end's offset sits above them.
    counts: u32,
    /// The drip rule's window `D`.
    reach: u64,
    /// The window rule's window `W`.
    width: u64,
}

impl Fields {
    /// The fields for `window` beside a drip rule of window `reach`, if
    /// they fit: the end's offset takes values up to `2D + W` (layout).
    fn fit(window: &WindowRule, reach: u64) -> Option<Self> {
        let width = window.config().window();
        let count = window.count_bits();
        let counts = count * window.counts();
        let span = 2 * u128::from(reach) + u128::from(width);
        let offset = u128::BITS - span.leading_zeros();
        (offset + counts <= 64).then_some(Self {
            count,
            counts,
            reach,
            width,
        })
    }

    #[inline(always)]
    fn count_mask(self) -> u64 {
        (1 << self.count) - 1
    }

    /// Whether a loaded word's upper part is one a state of a window rule
    /// of `limit` stores beside the drip word `drip`: counts at most the
    /// limit (no previous one for a fixed window), an offset within
    /// `(0, 2D + W]` and a window's end after tick 0 (layout).
    fn holds(self, part: u64, drip: u64, limit: u64) -> bool {
        let current = part & self.count_mask();
        let previous = (part >> self.count) & self.count_mask();
        let offset = u128::from(part >> self.counts);
        current <= limit
            && (if self.counts > self.count {
                previous <= limit
            } else {
                true
            })
            && offset > 0
            && offset <= 2 * u128::from(self.reach) + u128::from(self.width)
            && u128::from(drip) + offset > u128::from(self.reach)
    }

    /// The counts and the end of the stored window, from the word's upper
    /// part and the drip word.
    #[inline(always)]
    fn split(self, window: WindowRule, part: u64, drip: u64) -> (Counts, u64) {
        let current = part & self.count_mask();
        let previous = if let WindowRule::Counter(_) = window {
            (part >> self.count) & self.count_mask()
        } else {
            0
        };
        // The offset is `end − drip + D` (layout): `drip + offset` is below
        // 2^63 + 2^63, and at least `D`, as `end` is positive.
        let end = drip + (part >> self.counts) - self.reach;
        // Each count is below 2^count <= 2^32: the casts are exact.
        let counts = Counts {
            previous: previous as u32,
            current: current as u32,
        };
        (counts, end)
    }

    /// The upper part holding `counts` and the end `end`, beside the drip
    /// word `drip`.
    #[inline(always)]
    fn join(self, counts: Counts, end: u128, drip: u64) -> u64 {
        // The layout's invariant keeps the offset within (0, 2D + W], which
        // `fit` gave its bits.
        let offset = end + u128::from(self.reach) - u128::from(drip);
        debug_assert!(
            offset > 0 && offset <= 2 * u128::from(self.reach) + u128::from(self.width),
            "offset {offset} out of its field"
        );
        // Below 2^(64 − counts): the cast is exact, and the fields do not
        // overlap. A fixed window's previous count is 0.
        ((offset as u64) << self.counts)
            | (u64::from(counts.previous) << self.count)
            | u64::from(counts.current)
    }

    /// The window a call at `now` (stopped at the horizon) is judged in,
    /// from the stored counts and the end of their window (`judge`).
    #[inline(always)]
    fn judge(self, counts: Counts, end: u64, now: u64) -> Judged {
        judge(counts, u128::from(end), now, self.width)
    }
}

/// The window a call at `now` (stopped at the horizon) is judged in, from
/// the stored counts and the end of their window, `width` ticks wide. No
/// division within the stored window or the next: only a call two or more
/// windows after the stored one divides, to find how many passed.
#[inline(always)]
pub(super) fn judge(counts: Counts, end: u128, now: u64, width: u64) -> Judged {
    let (now128, width) = (u128::from(now), u128::from(width));
    if now128 < end {
        let back = end - now128;
        return if back <= width {
            Judged {
                counts,
                end,
                // back <= W < 2^64: exact.
                elapsed: (width - back) as u64,
                before: 0,
            }
        } else {
            Judged {
                counts,
                end,
                // back − W is the window's start less `now`, below the
                // start, which every layout keeps below 2^64.
                elapsed: 0,
                before: (back - width) as u64,
            }
        };
    }
    let passed = now128 - end;
    if passed < width {
        // The next window: the stored current count is its previous.
        return Judged {
            counts: Counts {
                previous: counts.current,
                current: 0,
            },
            end: end + width,
            elapsed: passed as u64,
            before: 0,
        };
    }
    // Two or more windows on: nothing counts any more.
    let windows = passed / width;
    Judged {
        counts: Counts {
            previous: 0,
            current: 0,
        },
        end: end + (windows + 1) * width,
        elapsed: (passed - windows * width) as u64,
        before: 0,
    }
}

/// A drip rule and a window rule in one `u128`, updated by one 16-byte
/// CAS, with no origin.
///
/// Layout (`b` bits a count, as many as the window rule's `L` takes;
/// `c = b` for `fixed-window`, `2b` for `sliding-window-counter`):
///
/// ```text
///  127 126             63+c 63+c-1   63+b 63+b-1    63 62                0
/// +---+-------------------+------------+-------------+-------------------+
/// | R | end's offset      | previous   |  current    | drip word (63)    |
/// +---+-------------------+------------+-------------+-------------------+
/// ```
///
/// * The drip word is the drip rule's own (`TAT`, or the drip from which
///   the bucket is full), below 2^63 as alone (`cell`'s layouts), in the
///   clock's ticks.
/// * The counts are the window's own, each at most `L < 2^b`: an admission
///   stores `c + n` only when `c + n <= L`.
/// * The window's end `E` replaces both the window's index and the
///   client's origin: the windows are `[E − W, E)` moved by whole `W`, so
///   `E` carries the grid's phase (the origin's, `E = origin + (k + 1)·W`).
///   It is stored as `E − word + D`, `D` the drip rule's window. Every
///   stored word was written at some instant `t` (an admission, the
///   client's beginning, a carried spend) with `E` in `(t, t + W]` (the
///   window that held `t`, or a later stored one: time went back), and the
///   drip word then within `D` of `t` (a schedule runs at most `D` ahead of
///   its admission, starts at most a drip behind the time it was built at,
///   and only rises). So the offset is in `(0, 2D + W]`, and takes
///   `bits(2D + W)` bits: the pair is built only when those and the counts
///   fit 64 (`Fields::fit`: a daily quota of up to 131,071 beside a burst
///   rule of a second, a counter of an hour of up to 2,047; beyond,
///   [`WideWindowPair`](super::WideWindowPair) keeps the origin).
/// * However long a client was idle, the end tells exactly how many
///   windows passed (`Fields::judge`): nothing wraps.
/// * Time: both rules read the clock through `schedule_time`, which stops
///   at 2^62 − 1 (146 years of nanoseconds), so the window's time stops
///   where the drip's does, which can only be stricter.
#[derive(Clone, Debug)]
pub struct WindowPair {
    rules: DripWindow,
    fields: Fields,
}

/// One client's state under a [`WindowPair`]: both rules' fields in one
/// word.
#[derive(Debug)]
pub struct WindowPairState {
    words: AtomicU128,
}

const LOW_WORD: u64 = (1 << 63) - 1;

/// The drip word and the window's part (bits 63–126) of a pair's word.
#[inline(always)]
pub(super) fn split_word(words: u128) -> (u64, u64) {
    // Bits 0–62 and 63–126 (the mark, bit 127, is shifted out of the
    // `u64`): the casts keep exactly the layout's fields.
    ((words as u64) & LOW_WORD, (words >> 63) as u64)
}

#[inline(always)]
pub(super) fn join_word(drip: u64, part: u64) -> u128 {
    u128::from(drip) | (u128::from(part) << 63)
}

/// A drip rule and a window rule in their set's order: what both window
/// pairs share.
#[derive(Clone, Debug)]
pub(super) struct DripWindow {
    pub(super) drip: WordRule,
    pub(super) window: WindowRule,
    /// Whether the drip rule is the first of the set (answers are in the
    /// set's order).
    drip_first: bool,
    set: RuleSet,
    /// The index of the rule with the smallest limit.
    strictest: usize,
}

impl DripWindow {
    /// The rules of `rules`, if they are one drip rule and one window rule.
    pub(super) fn new(rules: &RuleSet) -> Option<Self> {
        let [first, second] = rules.rules() else {
            return None;
        };
        let (drip, window, drip_first) = match (WordRule::new(*first), WindowRule::new(*second)) {
            (Some(drip), Some(window)) => (drip, window, true),
            _ => (WordRule::new(*second)?, WindowRule::new(*first)?, false),
        };
        Some(Self {
            drip,
            window,
            drip_first,
            set: rules.clone(),
            strictest: usize::from(second.config().limit() < first.config().limit()),
        })
    }

    /// The rules of `rules` with the fields of a word that holds them
    /// (`fit`, given the window rule and the drip rule's window).
    ///
    /// # Errors
    ///
    /// [`ConfigError::RuleCount`] unless `rules` are a drip rule and a
    /// window rule whose fields `fit`.
    pub(super) fn fitted<F>(
        rules: &RuleSet,
        fit: impl FnOnce(&WindowRule, u64) -> Option<F>,
    ) -> Result<(Self, F), ConfigError> {
        let rules = Self::new(rules).ok_or(ConfigError::RuleCount { count: rules.len() })?;
        let fields = fit(&rules.window, rules.drip.config().window())
            .ok_or(ConfigError::RuleCount { count: 2 })?;
        Ok((rules, fields))
    }

    pub(super) fn set(&self) -> &RuleSet {
        &self.set
    }

    /// The strictest rule's limit and window, as a pair reports them.
    pub(super) fn config(&self) -> Config {
        self.set[self.strictest].config()
    }

    pub(super) fn kind(&self) -> PolicyKind {
        self.set[self.strictest].policy()
    }

    /// What the drip rule and the window rule spent, of `spent` in the
    /// set's order (a rule past them, what the last one spent).
    pub(super) fn split_spent(&self, spent: &[u64]) -> (u64, u64) {
        let of = |i: usize| spent[i.min(spent.len() - 1)];
        if self.drip_first {
            (of(0), of(1))
        } else {
            (of(1), of(0))
        }
    }

    /// Whether the strictest rule is the drip rule.
    pub(super) fn strictest_drips(&self) -> bool {
        (self.strictest == 0) == self.drip_first
    }

    pub(super) fn forgets_after(&self) -> u64 {
        self.drip.config().window().max(self.window.forgets_after())
    }

    /// Both rules' steps combined as the contract combines them, in the
    /// set's order (`combine::two`): the decision, and both next values
    /// when both admit.
    #[inline(always)]
    pub(super) fn combine<W>(
        &self,
        dripped: Step<u64>,
        windowed: Step<W>,
        drip_remaining: impl FnOnce() -> u64,
        window_remaining: impl FnOnce() -> u64,
    ) -> (Decision, Option<(u64, W)>) {
        if self.drip_first {
            combine::two(dripped, windowed, drip_remaining, window_remaining)
        } else {
            let (decision, next) =
                combine::two(windowed, dripped, window_remaining, drip_remaining);
            (decision, next.map(|(window, drip)| (drip, window)))
        }
    }

    /// Each rule's own answer for a request of cost `cost` decided
    /// `decided`, in the set's order: the drip rule's from its word at a
    /// time (`drip`), the window rule's from its step for `cost` (asked
    /// only of a refusal) and its `remaining`.
    pub(super) fn each(
        &self,
        (drip, now): (u64, u64),
        cost: u64,
        decided: &Decision,
        window_step: impl FnOnce() -> Decision,
        window_remaining: u64,
    ) -> RuleAnswers {
        let refused = |limit: u64| !decided.allowed && cost >= 1 && cost <= limit;
        let (drip_rule, window_rule) = if self.drip_first {
            (self.set[0], self.set[1])
        } else {
            (self.set[1], self.set[0])
        };
        let stepped =
            refused(drip_rule.config().limit()).then(|| self.drip.step(drip, now, cost).decision);
        let drip_answer = own_answer(drip_rule, cost, stepped, self.drip.remaining(drip, now));
        let stepped = refused(window_rule.config().limit()).then(window_step);
        let window_answer = own_answer(window_rule, cost, stepped, window_remaining);
        let mut answers = RuleAnswers::default();
        if self.drip_first {
            answers.push(drip_answer);
            answers.push(window_answer);
        } else {
            answers.push(window_answer);
            answers.push(drip_answer);
        }
        answers
    }
}

/// What a call at one instant reads of a word: the drip word, the window
/// it is judged in, and the time (stopped at the horizon).
#[derive(Clone, Copy, Debug)]
struct Read {
    drip: u64,
    judged: Judged,
    now: u64,
}

impl WindowPair {
    /// The pair of `rules`, if they are a drip rule and a window rule
    /// whose fields fit the word (layout).
    ///
    /// # Errors
    ///
    /// [`ConfigError::RuleCount`] unless [`WindowPair::fits`].
    pub fn from_rules(rules: &RuleSet) -> Result<Self, ConfigError> {
        let (rules, fields) = DripWindow::fitted(rules, Fields::fit)?;
        Ok(Self { rules, fields })
    }

    /// Whether `rules` can be a window pair: a drip rule and a window rule
    /// whose fields fit the word (layout).
    pub fn fits(rules: &RuleSet) -> bool {
        Self::from_rules(rules).is_ok()
    }

    /// The word as a call at `now` sees it.
    #[inline(always)]
    fn read(&self, words: u128, now: u64) -> Read {
        self.read_as(self.rules.window, words, now)
    }

    /// [`read`](Self::read) with the window rule as a value (`step_as`).
    #[inline(always)]
    fn read_as(&self, window: WindowRule, words: u128, now: u64) -> Read {
        let now = schedule_time(now);
        let (drip, part) = split_word(words);
        let (counts, end) = self.fields.split(window, part, drip);
        Read {
            drip,
            judged: self.fields.judge(counts, end, now),
            now,
        }
    }

    /// Both rules' steps, in the set's order. Always inlined: the hot path.
    #[inline(always)]
    fn step(&self, words: u128, now: u64, cost: u64) -> Step<u128> {
        self.step_as(self.rules.window, words, now, cost)
    }

    /// [`step`](Self::step) with the window rule as a value the caller
    /// may have matched already: `check_within` hands each kind its own
    /// copy of the loop, so no match on the kind is left in it.
    #[inline(always)]
    fn step_as(&self, window: WindowRule, words: u128, now: u64, cost: u64) -> Step<u128> {
        let Read { drip, judged, now } = self.read_as(window, words, now);
        let dripped = self.rules.drip.step(drip, now, cost);
        // What the window rule's admission leaves is read only when both
        // admit, and then only if it can be the smaller of the two.
        let (mut decision, counts) = window.decide(judged, now, cost, false);
        if let (Some(counts), true) = (counts, dripped.next.is_some()) {
            decision.remaining = window.left(judged, counts, dripped.decision.remaining);
        }
        let windowed = Step {
            decision,
            next: counts,
        };
        let drip_remaining = || self.rules.drip.remaining(drip, now);
        let window_remaining = || window.remaining_in(judged);
        let (decision, next) =
            self.rules
                .combine(dripped, windowed, drip_remaining, window_remaining);
        Step {
            decision,
            next: next
                .map(|(drip, counts)| join_word(drip, self.fields.join(counts, judged.end, drip))),
        }
    }

    fn remaining_of(&self, words: u128, now: u64) -> u64 {
        let Read { drip, judged, now } = self.read(words, now);
        self.rules
            .drip
            .remaining(drip, now)
            .min(self.rules.window.remaining_in(judged))
    }

    /// The state holding the drip word `drip`, and `counts` in the window
    /// that ends at `end`.
    fn state(&self, drip: u64, counts: Counts, end: u128) -> WindowPairState {
        WindowPairState {
            words: AtomicU128::new(join_word(drip, self.fields.join(counts, end, drip))),
        }
    }
}

/// A window pair's step at one `now` and cost, as a value whose step is
/// always inlined into the CAS loop (`cell::Stepper`).
struct WindowStep<'p> {
    pair: &'p WindowPair,
    window: WindowRule,
    now: u64,
    cost: u64,
}

impl Stepper<u128> for WindowStep<'_> {
    #[inline(always)]
    fn step(&mut self, words: u128) -> Step<u128> {
        self.pair.step_as(self.window, words, self.now, self.cost)
    }
}

impl sealed::Sealed for WindowPair {}

impl Policy for WindowPair {
    type State = WindowPairState;
    type Origin = ();
    /// Unused: a pair reports its strictest rule's kind (`kind`).
    const KIND: PolicyKind = PolicyKind::Gcra;
    const SEVERAL: bool = true;

    /// A pair is made from its rules ([`WindowPair::from_rules`]); one
    /// `Config` names no policies, so this answers
    /// [`ConfigError::RuleCount`].
    fn new(_: Config) -> Result<Self, ConfigError> {
        Err(ConfigError::RuleCount { count: 1 })
    }

    fn config(&self) -> Config {
        self.rules.config()
    }

    fn new_state(&self) -> WindowPairState {
        self.begin(0)
    }

    /// The drip rule begun at `origin`, as alone; the window `[origin,
    /// origin + W)` with nothing counted.
    fn begin(&self, origin: u64) -> WindowPairState {
        let origin = schedule_time(origin);
        let end = u128::from(origin) + u128::from(self.fields.width);
        let counts = Counts {
            previous: 0,
            current: 0,
        };
        self.state(self.rules.drip.begin(origin), counts, end)
    }

    /// Always inlined, as `check_within`.
    #[inline(always)]
    fn check(&self, state: &WindowPairState, now: u64) -> Result<Decision, Retired> {
        self.check_within(state, now, 1)
    }

    #[inline]
    fn check_n(&self, state: &WindowPairState, now: u64, cost: u64) -> Result<Decision, Retired> {
        if cost == 0 || cost > self.config().limit() {
            let remaining = self.remaining(state, now)?;
            return Ok(beyond(self.rules.set(), cost, remaining).expect("cost 0 or above a limit"));
        }
        self.check_within(state, now, cost)
    }

    /// Linearised at the one CAS that moves both rules' fields. Always
    /// inlined, as its step is (`WindowStep`): the body of the hot path.
    #[inline(always)]
    fn check_within(
        &self,
        state: &WindowPairState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, Retired> {
        let step = |window| WindowStep {
            pair: self,
            window,
            now,
            cost,
        };
        // One copy of the loop for each kind of window rule (`step_as`).
        match self.rules.window {
            WindowRule::Fixed(p) => transition(&state.words, step(WindowRule::Fixed(p))),
            WindowRule::Counter(p) => transition(&state.words, step(WindowRule::Counter(p))),
        }
    }

    #[inline]
    fn check_unshared(
        &self,
        state: WindowPairState,
        now: u64,
        cost: u64,
    ) -> (WindowPairState, Decision) {
        let (words, decision) =
            cell::transition_unshared(state.words, |words| self.step(words, now, cost));
        (WindowPairState { words }, decision)
    }

    #[inline]
    fn remaining(&self, state: &WindowPairState, now: u64) -> Result<u64, Retired> {
        Ok(self.remaining_of(cell::read(&state.words)?, now))
    }

    /// Each rule gives back on its own (the window rule to the window that
    /// holds `at`, judged from the stored end), in one CAS of the word; the
    /// answer is the smaller of the two.
    fn refund(
        &self,
        state: &WindowPairState,
        now: u64,
        ago: u64,
        cost: u64,
    ) -> Result<u64, Retired> {
        cell::update(&state.words, |words| {
            let mut read = self.read(words, now);
            let mut ago = ago;
            let before = read.judged.before;
            if before > 0 {
                // A call before the stored window (time went back) is
                // judged at the window's start, the latest time the word
                // is known to reflect, and the admission is that much
                // longer ago: a drip word moved back from there stays
                // within the layout's reach of the window.
                let start = read.judged.end - u128::from(self.fields.width);
                // Below the end, itself below 2^63 + W: within a u64.
                read = self.read(words, start as u64);
                ago = ago.saturating_add(before);
            }
            let Read { drip, judged, now } = read;
            let (drip_given, drip) = self.rules.drip.give_back(drip, now, ago, cost);
            let (window_given, counts) = self.rules.window.give_back_in(judged, now, ago, cost);
            // The end is the window that holds `now`: the drip word beside
            // it must be within the layout's reach of `now` too.
            let drip = self.rules.drip.settled(drip, now);
            let next = join_word(drip, self.fields.join(counts, judged.end, drip));
            (
                drip_given.min(window_given),
                (drip_given > 0 || window_given > 0).then_some(next),
            )
        })
    }

    /// Idle when both rules are: then it answers every later call as a new
    /// client's pair would. (A call before the origin is never idle: the
    /// drip rule's schedule began at the origin.)
    fn retire_if_idle(&self, state: &WindowPairState, now: u64) -> bool {
        cell::retire_if(&state.words, |words| {
            let Read { drip, judged, now } = self.read(words, now);
            WordRule::idle(drip, now) && self.rules.window.idle_in(judged)
        })
    }

    /// The strictest rule's spend (what a carry-over of one count keeps),
    /// judged no earlier than the start of the window the state reflects.
    fn retire_spent(&self, state: &WindowPairState, now: u64) -> Spent {
        let (words, _) = cell::retire(&state.words);
        let Read { drip, judged, now } = self.read(words, now);
        if self.rules.strictest_drips() {
            return self.rules.drip.spent(drip, now);
        }
        Spent {
            count: self.rules.window.config().limit() - self.rules.window.remaining_in(judged),
            // A call before the window is judged at its start.
            at: now.saturating_add(judged.before),
        }
    }

    /// Both rules spent `spent` at `now`, in a state that counts from tick
    /// 0 (a tier's): the window `[k·W, (k + 1)·W)` that holds `now`.
    fn spent_state(&self, spent: u64, now: u64) -> WindowPairState {
        self.spent_state_each(&[spent], now)
    }

    fn spent_state_each(&self, spent: &[u64], now: u64) -> WindowPairState {
        let (drip, window) = self.rules.split_spent(spent);
        let now = schedule_time(now);
        let width = u128::from(self.fields.width);
        let end = (u128::from(now) / width + 1) * width;
        let counts = Counts {
            previous: 0,
            // At most L <= 2^32 − 1.
            current: window.min(self.rules.window.config().limit()) as u32,
        };
        self.state(self.rules.drip.spent_word(drip, now), counts, end)
    }

    fn save_words(&self, state: &WindowPairState, out: &mut Vec<u64>) -> Result<(), Retired> {
        cell::save_wide_word(&state.words, out)
    }

    fn load_words(&self, words: &[u64]) -> Option<WindowPairState> {
        let words = cell::loaded_wide_word(words)?;
        let (drip, part) = split_word(words);
        self.fields
            .holds(part, drip, self.rules.window.config().limit())
            .then(|| WindowPairState {
                words: AtomicU128::new(words),
            })
    }

    fn is_retired(&self, state: &WindowPairState) -> bool {
        AtomicU128::is_retired(state.words.load_word())
    }

    fn relocate(&self, state: &WindowPairState) -> Option<WindowPairState> {
        let (words, retired_now) = cell::retire(&state.words);
        retired_now.then(|| WindowPairState {
            words: AtomicU128::new(words),
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
        state: &WindowPairState,
        now: u64,
        cost: u64,
        decided: &Decision,
    ) -> Result<RuleAnswers, Retired> {
        let Read { drip, judged, now } = self.read(cell::read(&state.words)?, now);
        Ok(self.rules.each(
            (drip, now),
            cost,
            decided,
            || self.rules.window.decide(judged, now, cost, true).0,
            self.rules.window.remaining_in(judged),
        ))
    }
}
