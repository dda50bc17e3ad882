//! Several rules on one client (the contract's "Several limits on one
//! client"): a request is admitted iff every rule admits it, then every
//! rule counts it, and a refused request changes no rule. One atomic step
//! decides all of them, so no thread ever sees one rule spent and another
//! not, and no thread waits for another.
//!
//! Two designs, chosen by the rules:
//!
//! * [`Pair`]: two one-word rules (`gcra`, `token-bucket`, `leaky-bucket`),
//!   whose 63-bit words share one `u128` (layout below), updated by one
//!   16-byte compare-and-swap: each rule's own pure step on its half, and
//!   the pair stored only if both admit. No allocation, no pointer: the
//!   common burst-and-quota pair costs one wide CAS.
//! * [`Compound`]: any rules, up to [`MAX_RULES`](crate::MAX_RULES). The
//!   client's state is a pointer to an immutable snapshot of every rule's
//!   state; a decision reads each rule in place, steps copies of the rules
//!   it must (`Policy::duplicate`, then the rule's own `check_unshared`)
//!   and, if every rule admits, publishes a new snapshot with one
//!   compare-and-swap of the pointer. A refusal writes nothing. A
//!   `sliding-window` rule keeps a view of its log over a ring that every
//!   snapshot of the client shares (`sliding_window::LogView`), so no step
//!   copies a log. Outgrown snapshots are freed through `crossbeam-epoch`,
//!   so a reader's snapshot is never freed under it (and so a pointer is
//!   never reused while a CAS could compare it: no ABA). An admission
//!   allocates its snapshot: the price of atomicity over states of several
//!   words, measured in `floodgate bench`.
//!
//! Both are lock-free as the one-rule CAS loops are (`cell::transition`):
//! a pass repeats only when its CAS lost to another thread's successful
//! one.
//!
//! Each rule keeps the times it keeps alone: a drip rule counts from tick
//! 0 and begins at the client's origin, a window rule counts from the
//! origin (kept in the snapshot) and judges a call before it at the origin,
//! that much later (`Limiter::decide`'s `lag`). So every rule answers
//! exactly what it would answer alone, and the limiter keeps no origin for
//! either design (`Origin = ()`).

use super::any::{AnyPolicy, AnyState};
use super::sliding_window::{LogView, Moved};
use super::{sealed, Gcra, LeakyBucket, Policy, Retired, Spent, TokenBucket, TokenBucketState};
use crate::cell::{self, schedule_time, transition, AtomicWord, Step};
use crate::decision::NEVER;
use crate::sync::{AtomicPtr, AtomicU128, Ordering};
use crate::{
    Config, ConfigError, Decision, PolicyKind, Rule, RuleAnswer, RuleAnswers, RuleSet, Tick,
    MAX_RULES,
};

/// Combines the rules' own decisions on one request (the contract):
/// admitted iff all admit, with the smallest `remaining` and the largest
/// `delay`; else refused, with the smallest `remaining(now)` and the
/// largest `retry_after`, by the first rule that waits that long. A
/// refusing rule's decision carries its `remaining(now)`; a rule that would
/// admit counted the request in its decision, so its `remaining(now)` comes
/// from `remaining_now`, asked only while the smallest is above 0.
#[inline]
fn combine(decisions: &[Decision], remaining_now: impl Fn(usize) -> u64) -> Decision {
    if decisions.iter().all(|d| d.allowed) {
        let mut admitted = decisions[0];
        for d in &decisions[1..] {
            admitted.remaining = admitted.remaining.min(d.remaining);
            admitted.delay = admitted.delay.max(d.delay);
        }
        return admitted;
    }
    let mut remaining = u64::MAX;
    let mut by = 0;
    let mut retry_after = 0;
    for (i, d) in decisions.iter().enumerate() {
        if !d.allowed {
            remaining = remaining.min(d.remaining);
            if d.retry_after > retry_after {
                retry_after = d.retry_after;
                by = i;
            }
        }
    }
    for (i, d) in decisions.iter().enumerate() {
        if d.allowed && remaining > 0 {
            remaining = remaining.min(remaining_now(i));
        }
    }
    Decision::reject(remaining, retry_after).by_rule(by)
}

/// The answer for a cost no step decides: 0 (admitted, nothing changes),
/// or above some rule's limit (never admitted, by the first such rule).
fn beyond(rules: &RuleSet, cost: u64, remaining: u64) -> Option<Decision> {
    if cost == 0 {
        return Some(Decision::admit(remaining));
    }
    let by = rules.iter().position(|r| cost > r.config().limit())?;
    Some(Decision::reject(remaining, NEVER).by_rule(by))
}

/// A rule's own answer for `RuleAnswers`: `own` is its step's decision
/// for `cost` on the state as it is (ignored for a cost of 0 or above its
/// limit), `remaining` its `remaining` now.
fn own_answer(rule: Rule, cost: u64, own: Option<Decision>, remaining: u64) -> RuleAnswer {
    let decision = match own {
        _ if cost == 0 => Decision::admit(remaining),
        _ if cost > rule.config().limit() => Decision::reject(remaining, NEVER),
        Some(d) if !d.allowed => d,
        Some(d) => Decision { remaining, ..d },
        None => Decision::admit(remaining),
    };
    RuleAnswer { rule, decision }
}

// Pair --------------------------------------------------------------------

/// A one-word rule: `gcra`, `leaky-bucket` or `token-bucket`.
#[derive(Clone, Copy, Debug)]
enum WordRule {
    Gcra(Gcra),
    LeakyBucket(LeakyBucket),
    TokenBucket(TokenBucket),
}

impl WordRule {
    fn new(rule: Rule) -> Option<Self> {
        let config = rule.config();
        match rule.policy() {
            PolicyKind::Gcra => Gcra::new(config).ok().map(Self::Gcra),
            PolicyKind::LeakyBucket => LeakyBucket::new(config).ok().map(Self::LeakyBucket),
            PolicyKind::TokenBucket => TokenBucket::new(config).ok().map(Self::TokenBucket),
            _ => None,
        }
    }

    fn config(&self) -> Config {
        match self {
            Self::Gcra(p) => p.config(),
            Self::LeakyBucket(p) => p.config(),
            Self::TokenBucket(p) => p.config(),
        }
    }

    /// The rule's pure step at `now` (already `schedule_time`), for
    /// `1 <= cost <= L`.
    #[inline(always)]
    fn step(&self, word: u64, now: u64, cost: u64) -> Step<u64> {
        match self {
            Self::Gcra(p) => p.step(word, now, cost, false),
            Self::LeakyBucket(p) => p.schedule().step(word, now, cost, true),
            Self::TokenBucket(p) => p.step(word, now, cost),
        }
    }

    #[inline]
    fn remaining(&self, word: u64, now: u64) -> u64 {
        match self {
            Self::Gcra(p) => p.remaining_of(word, now),
            Self::LeakyBucket(p) => p.schedule().remaining_of(word, now),
            Self::TokenBucket(p) => p.tokens(word, now),
        }
    }

    /// Idle as the rule alone is: its schedule (`TAT`, or the drip from
    /// which the bucket is full) is not ahead of `now`.
    fn idle(word: u64, now: u64) -> bool {
        word <= now
    }

    /// The rule's own `retire_spent`, on a word of its own.
    fn spent(&self, word: u64, now: u64) -> Spent {
        match self {
            Self::Gcra(p) => p.retire_spent(&Gcra::state_of(word), now),
            Self::LeakyBucket(p) => p.retire_spent(&Gcra::state_of(word), now),
            Self::TokenBucket(p) => p.retire_spent(&TokenBucketState::of(word), now),
        }
    }

    fn begin(&self, origin: u64) -> u64 {
        match self {
            Self::Gcra(p) => Gcra::word(p.begin(origin)),
            Self::LeakyBucket(p) => Gcra::word(p.begin(origin)),
            Self::TokenBucket(p) => p.begin(origin).word(),
        }
    }

    fn spent_word(&self, spent: u64, now: u64) -> u64 {
        match self {
            Self::Gcra(p) => Gcra::word(p.spent_state(spent, now)),
            Self::LeakyBucket(p) => Gcra::word(p.spent_state(spent, now)),
            Self::TokenBucket(p) => p.spent_state(spent, now).word(),
        }
    }
}

/// Two one-word rules in one `u128`, updated by one 16-byte CAS.
///
/// Layout: each rule's word is below 2^63 (`cell`'s layouts: time stops at
/// 2^62 − 1 and a schedule runs at most one window, at most 2^62, ahead),
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
    rules: [WordRule; 2],
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
    /// `gcra`, `leaky-bucket` and `token-bucket`.
    pub fn from_rules(rules: &RuleSet) -> Result<Self, ConfigError> {
        match rules.rules() {
            [first, second] => match (WordRule::new(*first), WordRule::new(*second)) {
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
        rules.len() == 2 && rules.iter().all(|r| WordRule::new(*r).is_some())
    }

    /// Both rules' steps, combined as `combine` does, written out for two:
    /// this is a hot path, and a refusal by the first rule (a client at its
    /// burst) reads the second's `remaining` only when it can matter.
    #[inline(always)]
    fn step(&self, words: u128, now: u64, cost: u64) -> Step<u128> {
        let (a, b) = unpack(words);
        let first = self.rules[0].step(a, now, cost);
        let second = self.rules[1].step(b, now, cost);
        let (one, two) = (first.decision, second.decision);
        match (first.next, second.next) {
            // Both admit (a word step stores exactly when it admits): both
            // spend, in one word.
            (Some(na), Some(nb)) => Step {
                decision: Decision {
                    remaining: one.remaining.min(two.remaining),
                    delay: one.delay.max(two.delay),
                    ..one
                },
                next: Some(pack(na, nb)),
            },
            _ => {
                // The longest wait, by the first rule that waits it; a rule
                // that admits waits 0 and answers `remaining` from its word.
                let (wait, by) = match (one.allowed, two.allowed) {
                    (false, false) if two.retry_after > one.retry_after => (two.retry_after, 1),
                    (false, _) => (one.retry_after, 0),
                    _ => (two.retry_after, 1),
                };
                let remaining = match (one.allowed, two.allowed) {
                    (false, false) => one.remaining.min(two.remaining),
                    (false, true) if one.remaining == 0 => 0,
                    (false, true) => one.remaining.min(self.rules[1].remaining(b, now)),
                    _ if two.remaining == 0 => 0,
                    _ => two.remaining.min(self.rules[0].remaining(a, now)),
                };
                Step {
                    decision: Decision::reject(remaining, wait).by_rule(by),
                    next: None,
                }
            }
        }
    }

    fn remaining_of(&self, words: u128, now: u64) -> u64 {
        let (a, b) = unpack(words);
        self.rules[0]
            .remaining(a, now)
            .min(self.rules[1].remaining(b, now))
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

    #[inline]
    fn check_n(&self, state: &PairState, now: u64, cost: u64) -> Result<Decision, Retired> {
        if cost == 0 || cost > self.config().limit() {
            let remaining = self.remaining(state, now)?;
            return Ok(beyond(&self.set, cost, remaining).expect("cost 0 or above a limit"));
        }
        self.check_within(state, now, cost)
    }

    /// Linearised at the one CAS that moves both words.
    #[inline]
    fn check_within(&self, state: &PairState, now: u64, cost: u64) -> Result<Decision, Retired> {
        let now = schedule_time(now);
        transition(&state.words, |words| self.step(words, now, cost))
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

    /// Idle when both rules are: then it answers every later call as a new
    /// client's pair would.
    fn retire_if_idle(&self, state: &PairState, now: u64) -> bool {
        let now = schedule_time(now);
        cell::retire_if(&state.words, |words| {
            let (a, b) = unpack(words);
            WordRule::idle(a, now) && WordRule::idle(b, now)
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

    fn is_retired(&self, state: &PairState) -> bool {
        AtomicU128::is_retired(state.words.load_word())
    }

    fn relocate(&self, state: &PairState) -> Option<PairState> {
        let (words, retired_now) = cell::retire(&state.words);
        retired_now.then(|| PairState {
            words: AtomicU128::new(words),
        })
    }

    fn duplicate(&self, state: &PairState) -> PairState {
        PairState {
            words: AtomicU128::new(AtomicU128::unmarked(state.words.load_word())),
        }
    }

    fn forgets_after(&self) -> u64 {
        self.set
            .iter()
            .map(|r| r.config().window())
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

// Compound ----------------------------------------------------------------

/// Any rules (one to [`MAX_RULES`]), decided in one atomic step on a
/// snapshot of all their states, swapped by one pointer CAS (module docs).
#[derive(Clone, Debug)]
pub struct Compound {
    rules: Box<[AnyPolicy]>,
    set: RuleSet,
    strictest: usize,
}

/// One client's state under a [`Compound`]: a pointer to the snapshot of
/// its rules' states, with the retirement mark `R` in its lowest bit (a
/// `Snapshot` is 8-aligned, so the bit is otherwise 0).
pub struct CompoundState {
    current: AtomicPtr<Snapshot>,
}

/// Every rule's state as of one instant, never changed once published
/// (a decision steps copies): a reader needs no lock and sees one instant.
#[derive(Debug)]
struct Snapshot {
    /// The client's origin: window rules count from it.
    origin: u64,
    states: Box<[RuleState]>,
}

/// One rule's state in a snapshot: its policy's own state, stepped on a
/// copy; or, for `sliding-window`, a view of the log over a ring every
/// snapshot of the client shares, whose step copies nothing
/// ([`LogView`]).
#[derive(Debug)]
enum RuleState {
    Own(AnyState),
    Log(LogView),
}

/// A compound step's answer: the decision, and the states to publish if
/// every rule admitted.
type Stepped = (Decision, Option<Box<[RuleState]>>);

const MARK: usize = 1;

fn is_marked(ptr: *mut Snapshot) -> bool {
    ptr as usize & MARK != 0
}

fn marked(ptr: *mut Snapshot) -> *mut Snapshot {
    (ptr as usize | MARK) as *mut Snapshot
}

fn unmarked(ptr: *mut Snapshot) -> *mut Snapshot {
    (ptr as usize & !MARK) as *mut Snapshot
}

/// Reclamation of outgrown snapshots: `crossbeam-epoch`'s pin and deferred
/// free. Under the loom cfg a retired snapshot is kept (a model's few are
/// freed with the process), as `sync::TableCell` keeps tables there: the
/// models check the CAS protocol, not the collector.
#[cfg(not(floodgate_loom))]
mod reclaim {
    use super::Snapshot;

    pub(super) struct Pin(crossbeam_epoch::Guard);

    pub(super) fn pin() -> Pin {
        Pin(crossbeam_epoch::pin())
    }

    /// A snapshot no longer reachable from its state.
    struct Garbage(*mut Snapshot);

    // SAFETY: a `Snapshot` is `Send` (plain words, atomics and `Arc`s of
    // atomics), and the pointer is the collector's alone once retired.
    unsafe impl Send for Garbage {}

    impl Garbage {
        fn free(self) {
            // SAFETY: made by `Box::into_raw`, unlinked by the CAS that
            // retired it, and freed once, by the collector.
            drop(unsafe { Box::from_raw(self.0) });
        }
    }

    impl Pin {
        /// Frees `snapshot` once no pinned thread can still hold it.
        ///
        /// # Safety
        ///
        /// `snapshot` came from `Box::into_raw` and was just unlinked by a
        /// successful CAS, so only threads pinned now can hold it.
        pub(super) unsafe fn retire(&self, snapshot: *mut Snapshot) {
            let garbage = Garbage(snapshot);
            // SAFETY: the caller's promise; the collector runs the free
            // after every thread pinned now has unpinned.
            unsafe { self.0.defer_unchecked(move || garbage.free()) };
        }
    }
}

#[cfg(floodgate_loom)]
mod reclaim {
    use super::Snapshot;

    pub(super) struct Pin;

    pub(super) fn pin() -> Pin {
        Pin
    }

    impl Pin {
        /// Keeps the snapshot (module docs).
        pub(super) unsafe fn retire(&self, _: *mut Snapshot) {}
    }
}

impl CompoundState {
    fn new(snapshot: Snapshot) -> Self {
        Self {
            current: AtomicPtr::new(Box::into_raw(Box::new(snapshot))),
        }
    }

    /// The current snapshot and its pointer as loaded (mark included).
    ///
    /// Acquire pairs with the Release of the CAS that published it, so
    /// the snapshot's contents, written before, are seen.
    #[inline]
    fn load<'p>(&self, _pin: &'p reclaim::Pin) -> (*mut Snapshot, &'p Snapshot) {
        let ptr = self.current.load(Ordering::Acquire);
        // SAFETY: never null; published whole (above); and freed only
        // through `Pin::retire` after it was replaced, once every thread
        // pinned as this one is has unpinned, or with the state itself,
        // which no call outlives (the store frees a table's states only
        // when no call can reach them).
        (ptr, unsafe { &*unmarked(ptr) })
    }

    /// Marks the state retired; whether this call did. Progress: the CAS
    /// fails only when another thread published a snapshot (or marked it).
    fn retire(&self) -> bool {
        let mut current = self.current.load(Ordering::Acquire);
        loop {
            if is_marked(current) {
                return false;
            }
            match self.current.compare_exchange(
                current,
                marked(current),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }
}

impl Drop for CompoundState {
    fn drop(&mut self) {
        let ptr = unmarked(self.current.load(Ordering::Acquire));
        // SAFETY: the state owns its current snapshot, and no call
        // outlives the state (`load`).
        drop(unsafe { Box::from_raw(ptr) });
    }
}

impl std::fmt::Debug for CompoundState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pin = reclaim::pin();
        let (ptr, snapshot) = self.load(&pin);
        f.debug_struct("CompoundState")
            .field("retired", &is_marked(ptr))
            .field("snapshot", snapshot)
            .finish()
    }
}

impl Compound {
    /// The rules of `rules`, any policies.
    ///
    /// # Errors
    ///
    /// What a rule's policy refuses (nothing, for checked [`Rule`]s).
    pub fn from_rules(rules: &RuleSet) -> Result<Self, ConfigError> {
        let policies = rules
            .iter()
            .map(|rule| AnyPolicy::new(*rule))
            .collect::<Result<Box<[_]>, _>>()?;
        let strictest = rules
            .iter()
            .position(|r| r.config().limit() == rules.strictest().config().limit())
            .unwrap_or(0);
        Ok(Self {
            rules: policies,
            set: rules.clone(),
            strictest,
        })
    }

    /// Where rule `rule` judges a call at `now`: its own time, and how far
    /// before the origin the call came (window rules, `Limiter::decide`).
    #[inline]
    fn judged(rule: &AnyPolicy, origin: u64, now: u64) -> (u64, u64) {
        if rule.keeps_origin() {
            crate::limiter::since_origin(origin, now)
        } else {
            (now, 0)
        }
    }

    /// Rule `rule`'s state for a client created at `origin`, or one that
    /// has spent `spent` (`Some`) in a tier's times.
    fn rule_state(rule: &AnyPolicy, origin: u64, spent: Option<Spent>) -> RuleState {
        match (rule, spent) {
            (AnyPolicy::SlidingWindow(log), None) => RuleState::Log(log.view_begin()),
            (AnyPolicy::SlidingWindow(log), Some(spent)) => {
                RuleState::Log(log.view_spent(spent.count, spent.at))
            }
            (_, None) => RuleState::Own(rule.begin(origin)),
            (_, Some(spent)) => RuleState::Own(rule.spent_state(spent.count, spent.at)),
        }
    }

    /// Rule `i`'s `remaining` at `now`; `Moved` if the snapshot is stale.
    fn rule_remaining(&self, i: usize, snapshot: &Snapshot, now: u64) -> Result<u64, Moved> {
        let rule = &self.rules[i];
        let (at, _) = Self::judged(rule, snapshot.origin, now);
        match (rule, &snapshot.states[i]) {
            (AnyPolicy::SlidingWindow(log), RuleState::Log(view)) => log.view_remaining(view, at),
            (_, RuleState::Own(state)) => Ok(rule
                .remaining(state, at)
                .expect("a snapshot's states are never retired")),
            _ => unreachable!("a rule's state is made by the rule"),
        }
    }

    fn remaining_of(&self, snapshot: &Snapshot, now: u64) -> Result<u64, Moved> {
        let mut least = u64::MAX;
        for i in 0..self.rules.len() {
            least = least.min(self.rule_remaining(i, snapshot, now)?);
        }
        Ok(least)
    }

    /// Rule `i`'s own decision, for `1 <= cost <= L`, and its state after
    /// it (on a copy of its own state; a log's view copies nothing).
    fn rule_step(
        &self,
        i: usize,
        snapshot: &Snapshot,
        now: u64,
        cost: u64,
    ) -> Result<(Option<RuleState>, Decision), Moved> {
        let rule = &self.rules[i];
        let (at, lag) = Self::judged(rule, snapshot.origin, now);
        let (state, decision) = match (rule, &snapshot.states[i]) {
            (AnyPolicy::SlidingWindow(log), RuleState::Log(view)) => {
                let (decision, next) = log.view_check(view, at, cost)?;
                (next.map(RuleState::Log), decision)
            }
            (_, RuleState::Own(state)) => {
                let (state, decision) = rule.check_unshared(rule.duplicate(state), at, cost);
                (Some(RuleState::Own(state)), decision)
            }
            _ => unreachable!("a rule's state is made by the rule"),
        };
        if lag == 0 {
            Ok((state, decision))
        } else {
            Ok((state, rule.measured_from_earlier(decision, lag)))
        }
    }

    /// Every rule's step on `snapshot`: the decision, and the states to
    /// publish if every rule admitted; `Moved` if the snapshot is stale.
    ///
    /// A rule admits a request of cost `n` iff `n` single requests at
    /// `now` would all be admitted (the contract's "Weighted requests"),
    /// that is iff its `remaining(now) >= n`: so each rule is first read
    /// in place, and only the rules whose step is needed are stepped (all
    /// of them for an admission, whose new states are published; the
    /// refusing ones for a refusal, for their waits).
    fn step(&self, snapshot: &Snapshot, now: u64, cost: u64) -> Result<Stepped, Moved> {
        let k = self.rules.len();
        let mut remaining = [0u64; MAX_RULES];
        for (i, left) in remaining.iter_mut().enumerate().take(k) {
            *left = self.rule_remaining(i, snapshot, now)?;
        }
        let remaining = &remaining[..k];
        let mut decisions = [Decision::default(); MAX_RULES];
        if remaining.iter().all(|&left| left >= cost) {
            let mut next = Vec::with_capacity(k);
            for (i, decision) in decisions.iter_mut().enumerate().take(k) {
                let (state, decided) = self.rule_step(i, snapshot, now, cost)?;
                *decision = decided;
                next.extend(state);
            }
            let decision = combine(&decisions[..k], |_| 0);
            debug_assert!(decision.allowed && next.len() == k, "{decisions:?}");
            return Ok((decision, decision.allowed.then(|| next.into_boxed_slice())));
        }
        for (i, decision) in decisions.iter_mut().enumerate().take(k) {
            *decision = if remaining[i] >= cost {
                Decision::admit(remaining[i])
            } else {
                Decision {
                    remaining: remaining[i],
                    ..self.rule_step(i, snapshot, now, cost)?.1
                }
            };
        }
        Ok((combine(&decisions[..k], |i| remaining[i]), None))
    }

    /// Runs `read` on the current snapshot until it answers: a stale
    /// snapshot (`Moved`) is followed by a newer one. Progress: `Moved`
    /// means another thread's CAS published a newer snapshot (or marked the
    /// state) since the load, and the next pass reads that one.
    fn read_current<T>(
        &self,
        state: &CompoundState,
        read: impl Fn(&Snapshot) -> Result<T, Moved>,
    ) -> Result<T, Retired> {
        let pin = reclaim::pin();
        loop {
            let (ptr, snapshot) = state.load(&pin);
            if is_marked(ptr) {
                return Err(Retired);
            }
            if let Ok(answer) = read(snapshot) {
                return Ok(answer);
            }
        }
    }

    /// Retires the state and answers what each rule had spent, each judged
    /// as its own `retire_spent` judges (a tier's carry-over keeps every
    /// rule's spend, not only the strictest one's).
    pub(crate) fn retire_spent_each(&self, state: &CompoundState, now: u64) -> Vec<Spent> {
        state.retire();
        let pin = reclaim::pin();
        let (_, snapshot) = state.load(&pin);
        (0..self.rules.len())
            .map(|i| self.spent_of(i, snapshot, now))
            .collect()
    }

    /// Rule `i`'s spend in a retired snapshot.
    fn spent_of(&self, i: usize, snapshot: &Snapshot, now: u64) -> Spent {
        let rule = &self.rules[i];
        let (at, _) = Self::judged(rule, snapshot.origin, now);
        match (rule, &snapshot.states[i]) {
            (AnyPolicy::SlidingWindow(log), RuleState::Log(view)) => log.view_spent_at(view, at),
            (_, RuleState::Own(state)) => rule.retire_spent(&rule.duplicate(state), at),
            _ => unreachable!("a rule's state is made by the rule"),
        }
    }

    /// A state (times counted from tick 0, as a tier counts from each
    /// client's origin) whose rule `i` has spent `spent[i]`, or the last
    /// spend given for a rule beyond them.
    pub(crate) fn spent_state_each(&self, spent: &[Spent]) -> CompoundState {
        CompoundState::new(Snapshot {
            origin: 0,
            states: self
                .rules
                .iter()
                .enumerate()
                .map(|(i, rule)| Self::rule_state(rule, 0, Some(spent[i.min(spent.len() - 1)])))
                .collect(),
        })
    }

    /// A snapshot that goes on from `snapshot`: each rule's own state
    /// copied, each log's view sharing its ring (`deep` copies the ring
    /// too, for a state that must not share it).
    fn continued(&self, snapshot: &Snapshot, deep: bool) -> Snapshot {
        Snapshot {
            origin: snapshot.origin,
            states: self
                .rules
                .iter()
                .zip(snapshot.states.iter())
                .map(|(rule, state)| match state {
                    RuleState::Own(state) => RuleState::Own(rule.duplicate(state)),
                    RuleState::Log(view) if deep => RuleState::Log(view.deep_copy()),
                    RuleState::Log(view) => RuleState::Log(view.clone()),
                })
                .collect(),
        }
    }
}

impl sealed::Sealed for Compound {}

impl Policy for Compound {
    type State = CompoundState;
    type Origin = ();
    /// Unused: a compound reports its strictest rule's kind (`kind`).
    const KIND: PolicyKind = PolicyKind::Gcra;
    const SEVERAL: bool = true;

    /// A compound is made from its rules ([`Compound::from_rules`]); one
    /// `Config` names no policies, so this answers
    /// [`ConfigError::RuleCount`].
    fn new(_: Config) -> Result<Self, ConfigError> {
        Err(ConfigError::RuleCount { count: 1 })
    }

    fn config(&self) -> Config {
        self.set[self.strictest].config()
    }

    fn new_state(&self) -> CompoundState {
        self.begin(0)
    }

    /// Each rule begun as it begins alone: a drip rule at `origin`, a
    /// window rule at tick 0 of its own times, which count from `origin`.
    fn begin(&self, origin: u64) -> CompoundState {
        CompoundState::new(Snapshot {
            origin,
            states: self
                .rules
                .iter()
                .map(|rule| Self::rule_state(rule, origin, None))
                .collect(),
        })
    }

    #[inline]
    fn check_n(&self, state: &CompoundState, now: u64, cost: u64) -> Result<Decision, Retired> {
        if cost == 0 || cost > self.config().limit() {
            let remaining = self.remaining(state, now)?;
            return Ok(beyond(&self.set, cost, remaining).expect("cost 0 or above a limit"));
        }
        self.check_within(state, now, cost)
    }

    /// Linearised at the CAS that publishes the new snapshot (an
    /// admission), or at the load of the snapshot it judged (a refusal).
    ///
    /// Progress: a pass repeats only when its CAS failed, which a strong
    /// CAS does only when another thread published a snapshot (or marked
    /// the state) since this pass's load, or when a log's ring showed the
    /// snapshot stale, which also takes another thread's published
    /// snapshot (`LogView`): lock-free, never a wait.
    fn check_within(
        &self,
        state: &CompoundState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, Retired> {
        let pin = reclaim::pin();
        loop {
            let (ptr, snapshot) = state.load(&pin);
            if is_marked(ptr) {
                return Err(Retired);
            }
            let Ok((decision, next)) = self.step(snapshot, now, cost) else {
                continue;
            };
            let Some(states) = next else {
                return Ok(decision);
            };
            let new = Box::into_raw(Box::new(Snapshot {
                origin: snapshot.origin,
                states,
            }));
            // AcqRel: Release publishes the new snapshot's contents to the
            // next loader; Acquire on failure for the retry's reads.
            if state
                .current
                .compare_exchange(ptr, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // SAFETY: from `Box::into_raw`, unlinked by this CAS.
                unsafe { pin.retire(ptr) };
                return Ok(decision);
            }
            // SAFETY: never published: this thread's alone.
            drop(unsafe { Box::from_raw(new) });
        }
    }

    fn check_unshared(
        &self,
        state: CompoundState,
        now: u64,
        cost: u64,
    ) -> (CompoundState, Decision) {
        let ptr = state.current.load(Ordering::Relaxed);
        debug_assert!(!is_marked(ptr), "a new state is never retired");
        // SAFETY: the state is this call's alone (no other thread can
        // reach it yet), so is its snapshot.
        let snapshot = unsafe { &mut *ptr };
        let (decision, next) = self
            .step(snapshot, now, cost)
            .expect("no other thread moves a new state's log");
        if let Some(states) = next {
            snapshot.states = states;
        }
        (state, decision)
    }

    fn remaining(&self, state: &CompoundState, now: u64) -> Result<u64, Retired> {
        self.read_current(state, |snapshot| self.remaining_of(snapshot, now))
    }

    /// Idle when every rule is, each judged as it is alone (a window rule
    /// never before the origin); marked with one CAS on the snapshot that
    /// was judged, so an admission since then keeps it.
    fn retire_if_idle(&self, state: &CompoundState, now: u64) -> bool {
        let pin = reclaim::pin();
        // Progress: the CAS fails only when another thread published a
        // snapshot since the load; the next pass judges that one.
        loop {
            let (ptr, snapshot) = state.load(&pin);
            if is_marked(ptr) {
                return false;
            }
            let idle = self.rules.iter().enumerate().all(|(i, rule)| {
                let at = if rule.keeps_origin() {
                    match now.checked_sub(snapshot.origin) {
                        Some(since) => since,
                        None => return false,
                    }
                } else {
                    now
                };
                match (rule, &snapshot.states[i]) {
                    (AnyPolicy::SlidingWindow(log), RuleState::Log(view)) => {
                        log.view_idle(view, at)
                    }
                    (_, RuleState::Own(state)) => rule.retire_if_idle(&rule.duplicate(state), at),
                    _ => unreachable!("a rule's state is made by the rule"),
                }
            });
            if !idle {
                return false;
            }
            if state
                .current
                .compare_exchange(ptr, marked(ptr), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return true;
            }
        }
    }

    /// The strictest rule's spend (what a carry-over of one count keeps).
    fn retire_spent(&self, state: &CompoundState, now: u64) -> Spent {
        state.retire();
        let pin = reclaim::pin();
        let (_, snapshot) = state.load(&pin);
        self.spent_of(self.strictest, snapshot, now)
    }

    fn spent_state(&self, spent: u64, now: u64) -> CompoundState {
        self.spent_state_each(&[Spent {
            count: spent,
            at: now,
        }])
    }

    fn is_retired(&self, state: &CompoundState) -> bool {
        is_marked(state.current.load(Ordering::Acquire))
    }

    /// The state frozen, and continued in a new one whose logs share their
    /// rings: a call that raced with the freeze looks the client up again
    /// and goes on through the new state, on the same ring.
    fn relocate(&self, state: &CompoundState) -> Option<CompoundState> {
        if !state.retire() {
            return None;
        }
        let pin = reclaim::pin();
        let (_, snapshot) = state.load(&pin);
        Some(CompoundState::new(self.continued(snapshot, false)))
    }

    fn duplicate(&self, state: &CompoundState) -> CompoundState {
        let pin = reclaim::pin();
        let (_, snapshot) = state.load(&pin);
        CompoundState::new(self.continued(snapshot, true))
    }

    fn forgets_after(&self) -> u64 {
        self.rules
            .iter()
            .map(AnyPolicy::forgets_after)
            .max()
            .unwrap_or(0)
    }

    /// A call before the origin waits the lag longer, as each rule alone
    /// (its wait to be admitted, or a shaper's delay).
    fn measured_from_earlier(&self, mut decision: Decision, lag: u64) -> Decision {
        if !decision.allowed {
            decision.retry_after = decision.retry_after.saturating_add(lag);
        } else if self
            .set
            .iter()
            .any(|r| r.policy() == PolicyKind::LeakyBucket)
        {
            decision.delay = decision.delay.saturating_add(lag);
        }
        decision
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
        state: &CompoundState,
        now: u64,
        cost: u64,
        decided: &Decision,
    ) -> Result<RuleAnswers, Retired> {
        self.read_current(state, |snapshot| {
            let mut answers = RuleAnswers::default();
            for i in 0..self.rules.len() {
                let limit = self.set[i].config().limit();
                let stepped = if !decided.allowed && cost >= 1 && cost <= limit {
                    Some(self.rule_step(i, snapshot, now, cost)?.1)
                } else {
                    None
                };
                answers.push(own_answer(
                    self.set[i],
                    cost,
                    stepped,
                    self.rule_remaining(i, snapshot, now)?,
                ));
            }
            Ok(answers)
        })
    }
}
