//! Two one-word rules (`gcra`, `token-bucket`, `leaky-bucket`, and
//! `in-flight`, whose word is the units it holds) in one 16-byte word,
//! decided by one compare-and-swap: no allocation and no pointer, so a
//! client under two rules costs about what it costs under one. A drip rule beside a window rule takes one word too
//! ([`WindowPair`](super::WindowPair),
//! [`WideWindowPair`](super::WideWindowPair)).
//!
//! Each rule's own pure step runs on its half, and the word is stored only
//! if both admit (`combine::two`), through the one-rule CAS loop
//! (`cell::transition`): a pass repeats only when its CAS lost to another
//! thread's successful one. Both rules count from tick 0, as each does
//! alone.

use super::combine::{self, beyond, own_answer};
use super::{
    sealed, Gcra, InFlight, LeakyBucket, Policy, Retired, Spent, TokenBucket, TokenBucketState,
};
use crate::cell::{self, schedule_time, transition, AtomicWord, Step, Stepper};
use crate::sync::AtomicU128;
use crate::{Config, ConfigError, Decision, PolicyKind, Rule, RuleAnswers, RuleSet, Tick};

/// A one-word rule: `gcra`, `leaky-bucket` or `token-bucket`.
#[derive(Clone, Copy, Debug)]
pub(super) enum WordRule {
    Gcra(Gcra),
    LeakyBucket(LeakyBucket),
    TokenBucket(TokenBucket),
}

impl WordRule {
    pub(super) fn new(rule: Rule) -> Option<Self> {
        let config = rule.config();
        match rule.policy() {
            PolicyKind::Gcra => Gcra::new(config).ok().map(Self::Gcra),
            PolicyKind::LeakyBucket => LeakyBucket::new(config).ok().map(Self::LeakyBucket),
            PolicyKind::TokenBucket => TokenBucket::new(config).ok().map(Self::TokenBucket),
            _ => None,
        }
    }

    pub(super) fn config(&self) -> Config {
        match self {
            Self::Gcra(p) => p.config(),
            Self::LeakyBucket(p) => p.config(),
            Self::TokenBucket(p) => p.config(),
        }
    }

    /// The rule's pure step at `now` (already `schedule_time`), for
    /// `1 <= cost <= L`.
    #[inline(always)]
    pub(super) fn step(&self, word: u64, now: u64, cost: u64) -> Step<u64> {
        match self {
            Self::Gcra(p) => p.step(word, now, cost, false),
            Self::LeakyBucket(p) => p.schedule().step(word, now, cost, true),
            Self::TokenBucket(p) => p.step(word, now, cost),
        }
    }

    #[inline]
    pub(super) fn remaining(&self, word: u64, now: u64) -> u64 {
        match self {
            Self::Gcra(p) => p.remaining_of(word, now),
            Self::LeakyBucket(p) => p.schedule().remaining_of(word, now),
            Self::TokenBucket(p) => p.tokens(word, now),
        }
    }

    /// The rule's own refund step at `now` (already `schedule_time`) of
    /// an admission at `at` (`Policy::refund`): the units given back and
    /// the word after, unchanged when none came back.
    #[inline]
    pub(super) fn give_back(&self, word: u64, now: u64, ago: u64, cost: u64) -> (u64, u64) {
        if super::gives_nothing(self.config(), ago, cost) {
            return (0, word);
        }
        let (given, next) = match self {
            Self::Gcra(p) => p.give_back(word, now, cost),
            Self::LeakyBucket(p) => p.schedule().give_back(word, now, cost),
            Self::TokenBucket(p) => p.give_back(word, now, cost),
        };
        (given, next.unwrap_or(word))
    }

    /// The word that answers every call at `now` or later as `word` does,
    /// and is not behind `now` by a drip or more: a schedule behind `now`
    /// moved up to it (`max(TAT, now)` is all a `gcra` reads), a full
    /// bucket's to its latest drip. What a refund that leaves the drip rule
    /// as it was stores beside a window moved up to `now`, so that the
    /// layouts that keep the window relative to the drip word hold.
    #[inline]
    pub(super) fn settled(&self, word: u64, now: u64) -> u64 {
        match self {
            Self::Gcra(_) | Self::LeakyBucket(_) => word.max(now),
            Self::TokenBucket(p) => p.settled(word, now),
        }
    }

    /// Idle as the rule alone is: its schedule (`TAT`, or the drip from
    /// which the bucket is full) is not ahead of `now`.
    pub(super) fn idle(word: u64, now: u64) -> bool {
        word <= now
    }

    /// The rule's own `retire_spent`, on a word of its own.
    pub(super) fn spent(&self, word: u64, now: u64) -> Spent {
        match self {
            Self::Gcra(p) => p.retire_spent(&Gcra::state_of(word), now),
            Self::LeakyBucket(p) => p.retire_spent(&Gcra::state_of(word), now),
            Self::TokenBucket(p) => p.retire_spent(&TokenBucketState::of(word), now),
        }
    }

    pub(super) fn begin(&self, origin: u64) -> u64 {
        match self {
            Self::Gcra(p) => Gcra::word(p.begin(origin)),
            Self::LeakyBucket(p) => Gcra::word(p.begin(origin)),
            Self::TokenBucket(p) => p.begin(origin).word(),
        }
    }

    pub(super) fn spent_word(&self, spent: u64, now: u64) -> u64 {
        match self {
            Self::Gcra(p) => Gcra::word(p.spent_state(spent, now)),
            Self::LeakyBucket(p) => Gcra::word(p.spent_state(spent, now)),
            Self::TokenBucket(p) => p.spent_state(spent, now).word(),
        }
    }
}

/// A rule of a [`Pair`]: a one-word rate rule, or an `in-flight` rule,
/// whose word is the units it holds (below 2^32: a limit's bound).
#[derive(Clone, Copy, Debug)]
enum PairRule {
    Word(WordRule),
    Held(InFlight),
}

impl PairRule {
    fn new(rule: Rule) -> Option<Self> {
        match rule.policy() {
            PolicyKind::InFlight => InFlight::new(rule.config()).ok().map(Self::Held),
            _ => WordRule::new(rule).map(Self::Word),
        }
    }

    fn config(&self) -> Config {
        match self {
            Self::Word(rule) => rule.config(),
            Self::Held(rule) => rule.config(),
        }
    }

    #[inline(always)]
    fn step(&self, word: u64, now: u64, cost: u64) -> Step<u64> {
        match self {
            Self::Word(rule) => rule.step(word, now, cost),
            Self::Held(rule) => rule.step(word, cost),
        }
    }

    #[inline]
    fn remaining(&self, word: u64, now: u64) -> u64 {
        match self {
            Self::Word(rule) => rule.remaining(word, now),
            Self::Held(rule) => rule.remaining_of(word),
        }
    }

    /// What a refund gives back and the word after: `None` for an
    /// `in-flight` rule, which a refund leaves out (only a release gives
    /// its units back).
    #[inline]
    fn give_back(&self, word: u64, now: u64, ago: u64, cost: u64) -> Option<(u64, u64)> {
        match self {
            Self::Word(rule) => Some(rule.give_back(word, now, ago, cost)),
            Self::Held(_) => None,
        }
    }

    #[inline]
    fn settled(&self, word: u64, now: u64) -> u64 {
        match self {
            Self::Word(rule) => rule.settled(word, now),
            Self::Held(_) => word,
        }
    }

    /// Idle as the rule alone is: a drip rule's schedule not ahead of
    /// `now`; an `in-flight` rule holding nothing (time never frees it).
    fn idle(&self, word: u64, now: u64) -> bool {
        match self {
            Self::Word(_) => WordRule::idle(word, now),
            Self::Held(_) => word == 0,
        }
    }

    fn spent(&self, word: u64, now: u64) -> Spent {
        match self {
            Self::Word(rule) => rule.spent(word, now),
            Self::Held(_) => Spent {
                count: word,
                at: now,
            },
        }
    }

    fn begin(&self, origin: u64) -> u64 {
        match self {
            Self::Word(rule) => rule.begin(origin),
            Self::Held(_) => 0,
        }
    }

    fn spent_word(&self, spent: u64, now: u64) -> u64 {
        match self {
            Self::Word(rule) => rule.spent_word(spent, now),
            // Holding what was held (at most a former limit, < 2^32), as
            // the several-rules design carries it over.
            Self::Held(_) => spent.min(crate::MAX_LIMIT),
        }
    }

    fn forgets_after(&self) -> u64 {
        match self {
            Self::Word(rule) => rule.config().window(),
            Self::Held(rule) => rule.forgets_after(),
        }
    }
}

/// Two one-word rules in one `u128`, updated by one 16-byte CAS.
///
/// Layout: each rule's word is below 2^63 (`cell`'s layouts: time stops at
/// 2^62 − 1 and a schedule runs at most one window, at most 2^62, ahead;
/// an `in-flight` rule's held units are at most its limit, below 2^32),
/// so the first rule's word takes bits 0–62, bit 63 is 0, the second's
/// takes bits 64–126, and bit 127 is the retirement mark `R` that every
/// `u128` state word uses (`cell::AtomicWord`).
///
/// ```text
///  127 126                          64 63 62                            0
/// +---+------------------------------+---+------------------------------+
/// | R |  second rule's word (63)     | 0 |  first rule's word (63)      |
/// +---+------------------------------+---+------------------------------+
/// ```
#[derive(Clone, Debug)]
pub struct Pair {
    rules: [PairRule; 2],
    set: RuleSet,
    /// The index of the rule with the smallest limit.
    strictest: usize,
}

/// One client's state under a [`Pair`]: both rules' words.
#[derive(Debug)]
pub struct PairState {
    words: AtomicU128,
}

const LOW: u128 = (1 << 63) - 1;

#[inline(always)]
fn unpack(words: u128) -> (u64, u64) {
    // Both halves are below 2^63 (layout above): the casts are exact.
    ((words & LOW) as u64, ((words >> 64) & LOW) as u64)
}

#[inline(always)]
fn pack(first: u64, second: u64) -> u128 {
    u128::from(first) | (u128::from(second) << 64)
}

impl Pair {
    /// The pair of `rules`, if they are two one-word rules.
    ///
    /// # Errors
    ///
    /// [`ConfigError::RuleCount`] unless there are two rules, both of
    /// `gcra`, `leaky-bucket`, `token-bucket` and `in-flight`.
    pub fn from_rules(rules: &RuleSet) -> Result<Self, ConfigError> {
        match rules.rules() {
            [first, second] => match (PairRule::new(*first), PairRule::new(*second)) {
                (Some(a), Some(b)) => Ok(Self {
                    rules: [a, b],
                    set: rules.clone(),
                    strictest: usize::from(second.config().limit() < first.config().limit()),
                }),
                _ => Err(ConfigError::RuleCount { count: 2 }),
            },
            other => Err(ConfigError::RuleCount { count: other.len() }),
        }
    }

    /// Whether `rules` can be a pair.
    pub fn fits(rules: &RuleSet) -> bool {
        rules.len() == 2 && rules.iter().all(|r| PairRule::new(*r).is_some())
    }

    /// Both rules' steps, combined as the contract combines them
    /// (`combine::two`).
    #[inline(always)]
    fn step(&self, words: u128, now: u64, cost: u64) -> Step<u128> {
        let (a, b) = unpack(words);
        let (decision, next) = combine::two(
            self.rules[0].step(a, now, cost),
            self.rules[1].step(b, now, cost),
            || self.rules[0].remaining(a, now),
            || self.rules[1].remaining(b, now),
        );
        Step {
            decision,
            next: next.map(|(a, b)| pack(a, b)),
        }
    }

    fn remaining_of(&self, words: u128, now: u64) -> u64 {
        let (a, b) = unpack(words);
        self.rules[0]
            .remaining(a, now)
            .min(self.rules[1].remaining(b, now))
    }
}

/// A pair's step at one `now` and cost, as a value whose step is always
/// inlined into the CAS loop (`cell::Stepper`).
struct PairStep<'p> {
    pair: &'p Pair,
    now: u64,
    cost: u64,
}

impl Stepper<u128> for PairStep<'_> {
    #[inline(always)]
    fn step(&mut self, words: u128) -> Step<u128> {
        self.pair.step(words, self.now, self.cost)
    }
}

impl sealed::Sealed for Pair {}

impl Policy for Pair {
    type State = PairState;
    type Origin = ();
    /// Unused: a pair reports its strictest rule's kind (`kind`).
    const KIND: PolicyKind = PolicyKind::Gcra;
    const SEVERAL: bool = true;

    /// A pair is made from its rules ([`Pair::from_rules`]); one `Config`
    /// names no policies, so this answers [`ConfigError::RuleCount`].
    fn new(_: Config) -> Result<Self, ConfigError> {
        Err(ConfigError::RuleCount { count: 1 })
    }

    fn config(&self) -> Config {
        self.rules[self.strictest].config()
    }

    fn new_state(&self) -> PairState {
        self.begin(0)
    }

    fn begin(&self, origin: u64) -> PairState {
        PairState {
            words: AtomicU128::new(pack(
                self.rules[0].begin(origin),
                self.rules[1].begin(origin),
            )),
        }
    }

    /// Always inlined, as `check_within`.
    #[inline(always)]
    fn check(&self, state: &PairState, now: u64) -> Result<Decision, Retired> {
        self.check_within(state, now, 1)
    }

    #[inline]
    fn check_n(&self, state: &PairState, now: u64, cost: u64) -> Result<Decision, Retired> {
        if cost == 0 || cost > self.config().limit() {
            let remaining = self.remaining(state, now)?;
            return Ok(beyond(&self.set, cost, remaining).expect("cost 0 or above a limit"));
        }
        self.check_within(state, now, cost)
    }

    /// Linearised at the one CAS that moves both words. Always inlined, as
    /// its step is (`PairStep`): it is the body of the hot path, and a call
    /// returns its decision through memory, which the caller then reloads
    /// wider than it was written.
    #[inline(always)]
    fn check_within(&self, state: &PairState, now: u64, cost: u64) -> Result<Decision, Retired> {
        let now = schedule_time(now);
        transition(
            &state.words,
            PairStep {
                pair: self,
                now,
                cost,
            },
        )
    }

    #[inline]
    fn check_unshared(&self, state: PairState, now: u64, cost: u64) -> (PairState, Decision) {
        let now = schedule_time(now);
        let (words, decision) =
            cell::transition_unshared(state.words, |words| self.step(words, now, cost));
        (PairState { words }, decision)
    }

    #[inline]
    fn remaining(&self, state: &PairState, now: u64) -> Result<u64, Retired> {
        Ok(self.remaining_of(cell::read(&state.words)?, schedule_time(now)))
    }

    /// Each rule gives back on its own, in one CAS of the word; the
    /// answer is the smaller of the two. An `in-flight` rule is left out
    /// (the answer is the other rule's; 0 when both are).
    fn refund(&self, state: &PairState, now: u64, ago: u64, cost: u64) -> Result<u64, Retired> {
        let now = schedule_time(now);
        cell::update(&state.words, |words| {
            let (a, b) = unpack(words);
            let gave_a = self.rules[0].give_back(a, now, ago, cost);
            let gave_b = self.rules[1].give_back(b, now, ago, cost);
            let (given_a, a) = gave_a.unwrap_or((0, a));
            let (given_b, b) = gave_b.unwrap_or((0, b));
            let given = match (gave_a, gave_b) {
                (Some(_), Some(_)) => given_a.min(given_b),
                (Some(_), None) => given_a,
                (None, Some(_)) => given_b,
                (None, None) => 0,
            };
            // Both words as of `now`, as every design stores a refund's.
            let next = pack(self.rules[0].settled(a, now), self.rules[1].settled(b, now));
            (given, (given_a > 0 || given_b > 0).then_some(next))
        })
    }

    /// Each `in-flight` rule gives back `min(cost, held)` on its own, in
    /// one CAS of the word (none when nothing comes back); the answer is
    /// the smaller, 0 without such a rule.
    fn release(&self, state: &PairState, _now: u64, cost: u64) -> Result<u64, Retired> {
        cell::update(&state.words, |words| {
            let (mut a, mut b) = unpack(words);
            let mut least = None::<u64>;
            for (rule, word) in self.rules.iter().zip([&mut a, &mut b]) {
                if let PairRule::Held(_) = rule {
                    let (released, held) = InFlight::let_go(*word, cost);
                    *word = held.unwrap_or(*word);
                    least = Some(least.map_or(released, |least| least.min(released)));
                }
            }
            let next = pack(a, b);
            (least.unwrap_or(0), (next != words).then_some(next))
        })
    }

    /// Idle when both rules are: then it answers every later call as a new
    /// client's pair would.
    fn retire_if_idle(&self, state: &PairState, now: u64) -> bool {
        let now = schedule_time(now);
        cell::retire_if(&state.words, |words| {
            let (a, b) = unpack(words);
            self.rules[0].idle(a, now) && self.rules[1].idle(b, now)
        })
    }

    /// The strictest rule's spend (what a carry-over of one count keeps).
    fn retire_spent(&self, state: &PairState, now: u64) -> Spent {
        let (words, _) = cell::retire(&state.words);
        let (a, b) = unpack(words);
        let word = if self.strictest == 0 { a } else { b };
        self.rules[self.strictest].spent(word, schedule_time(now))
    }

    fn spent_state(&self, spent: u64, now: u64) -> PairState {
        PairState {
            words: AtomicU128::new(pack(
                self.rules[0].spent_word(spent, now),
                self.rules[1].spent_word(spent, now),
            )),
        }
    }

    fn save_words(&self, state: &PairState, out: &mut Vec<u64>) -> Result<(), Retired> {
        cell::save_wide_word(&state.words, out)
    }

    /// Both words as saved, but an `in-flight` rule's: it holds nothing.
    fn load_words(&self, words: &[u64]) -> Option<PairState> {
        let words = cell::loaded_wide_word(words)?;
        // Bit 63 is no field's (layout): a word with it set was not saved.
        if words & (1 << 63) != 0 {
            return None;
        }
        let (a, b) = unpack(words);
        let held = |i: usize, word| match self.rules[i] {
            PairRule::Held(_) => 0,
            PairRule::Word(_) => word,
        };
        Some(PairState {
            words: AtomicU128::new(pack(held(0, a), held(1, b))),
        })
    }

    fn spent_state_each(&self, spent: &[u64], now: u64) -> PairState {
        let of = |i: usize| spent[i.min(spent.len() - 1)];
        PairState {
            words: AtomicU128::new(pack(
                self.rules[0].spent_word(of(0), now),
                self.rules[1].spent_word(of(1), now),
            )),
        }
    }

    fn is_retired(&self, state: &PairState) -> bool {
        AtomicU128::is_retired(state.words.load_word())
    }

    fn relocate(&self, state: &PairState) -> Option<PairState> {
        let (words, retired_now) = cell::retire(&state.words);
        retired_now.then(|| PairState {
            words: AtomicU128::new(words),
        })
    }

    fn forgets_after(&self) -> u64 {
        self.rules
            .iter()
            .map(PairRule::forgets_after)
            .max()
            .unwrap_or(0)
    }

    fn kind(&self) -> PolicyKind {
        self.set[self.strictest].policy()
    }

    fn rule_set(&self) -> RuleSet {
        self.set.clone()
    }

    fn in_ticks_of(&self, tick: Tick) -> Result<Self, ConfigError> {
        Self::from_rules(&self.set.in_ticks_of(tick)?)
    }

    fn each(
        &self,
        state: &PairState,
        now: u64,
        cost: u64,
        decided: &Decision,
    ) -> Result<RuleAnswers, Retired> {
        let now = schedule_time(now);
        let (a, b) = unpack(cell::read(&state.words)?);
        let mut answers = RuleAnswers::default();
        for (i, (rule, word)) in self.rules.iter().zip([a, b]).enumerate() {
            let stepped = (!decided.allowed && cost >= 1 && cost <= rule.config().limit())
                .then(|| rule.step(word, now, cost).decision);
            answers.push(own_answer(
                self.set[i],
                cost,
                stepped,
                rule.remaining(word, now),
            ));
        }
        Ok(answers)
    }
}
