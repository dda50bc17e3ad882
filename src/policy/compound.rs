//! Several rules on one client (the contract's "Several limits on one
//! client"), any rules: a request is admitted iff every rule admits it,
//! then every rule counts it, and a refused request changes no rule. One
//! atomic step decides all of them, so no thread ever sees one rule spent
//! and another not, and no thread waits for another.
//!
//! Two rules that fit one 16-byte word take one CAS on it instead
//! ([`Pair`](super::Pair), [`WindowPair`](super::WindowPair)); this is the
//! design for any other mix, up to [`MAX_RULES`](crate::MAX_RULES). The
//! client's state is a pointer to an immutable snapshot of every rule's
//! state; a decision reads each rule in place, steps copies of the rules it
//! must (`Policy::duplicate`, then the rule's own `check_unshared`) and, if
//! every rule admits, publishes a new snapshot with one compare-and-swap
//! of the pointer. A refusal writes nothing. A `sliding-window` rule keeps
//! a view of its log over a ring that every snapshot of the client shares
//! (`sliding_window::LogView`), so no step copies a log. Outgrown snapshots
//! are freed through `crossbeam-epoch`, so a reader's snapshot is never
//! freed under it (and so a pointer is never reused while a CAS could
//! compare it: no ABA). An admission allocates its snapshot: the price of
//! atomicity over states of several words, measured in `floodgate bench`.
//!
//! It is lock-free as the one-rule CAS loops are (`cell::transition`): a
//! pass repeats only when its CAS lost to another thread's successful one.
//!
//! Each rule keeps the times it keeps alone: a drip rule counts from tick
//! 0 and begins at the client's origin, a window rule counts from the
//! origin (kept in the snapshot) and judges an earlier call at the origin,
//! that much later (`Limiter::decide`'s `lag`). So every rule answers
//! exactly what it would answer alone, and the limiter keeps no origin
//! (`Origin = ()`).

use super::any::{AnyPolicy, AnyState};
use super::combine::{beyond, combine, own_answer};
use super::sliding_window::{LogView, Moved};
use super::{sealed, Policy, Retired, Spent};
use crate::sync::{AtomicPtr, Ordering};
use crate::{Config, ConfigError, Decision, PolicyKind, RuleAnswers, RuleSet, Tick, MAX_RULES};

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
    /// What a rule's policy refuses (nothing, for checked [`Rule`](crate::Rule)s).
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
