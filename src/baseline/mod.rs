//! The mutex baseline: the six policies of `SPEC.md` (the decision contract
//! at the repository root) written out plainly, with a lock around each
//! client's state.
//!
//! It exists for two reasons. It is the **reference** the lock-free engine is
//! tested against: every state here is the spec's own description, kept as
//! literally as the arithmetic allows, so that a disagreement between the two
//! engines points at the lock-free one unless the spec says otherwise. And it
//! is the **baseline** the lock-free engine is measured against: the classic
//! design a service would write first. Nothing here is shared with
//! `src/policy/` or `src/cell.rs`; keep it that way, or the differential tests
//! would compare a reading of the spec with itself.
//!
//! # The states
//!
//! | policy | state per client |
//! | --- | --- |
//! | `sliding-window` | the times of the last `L` admissions, oldest first |
//! | `token-bucket` | the token count and the index of the last drip counted in it |
//! | `fixed-window` | the current window's index and its count |
//! | `sliding-window-counter` | the current window's index, the previous and current counts |
//! | `gcra`, `leaky-bucket` | the theoretical arrival time `TAT` |
//!
//! Times are ticks since the client's origin (the `now` of its first call) and
//! are held in `u64`; every product or sum that could pass `u64::MAX` (the
//! window may be as long as `u64::MAX` ticks) is computed in `u128`/`i128`,
//! and an answer that would not fit in a `u64` saturates.
//!
//! # Bounded memory
//!
//! [`Bounds`] apply here exactly as in the lock-free engine (the rules are in
//! [`crate::bounds`]): the same schedule decides which arrivals sweep (its
//! bookkeeping is shared on purpose, so that both engines sweep at the same
//! calls), and the same cap and overflow rules answer when there is no
//! room. Which clients a sweep removes is decided here, on this file's
//! states, from the definition of *idle* (a state that answers every call
//! from now on as a new client's would):
//!
//! | policy | idle `r` ticks past the origin when |
//! | --- | --- |
//! | `sliding-window` | no kept admission `t` has `t + W > r` (none is in any window from `r` on) |
//! | `token-bucket` | the bucket holds `L` once the drips up to `r` are counted |
//! | `fixed-window` | nothing was ever admitted, or `r` is past the stored window |
//! | `sliding-window-counter` | both counts, rolled forward to `r`'s window, are 0 |
//! | `gcra`, `leaky-bucket` | `TAT ≤ r` (then `max(TAT, now) = now` for every `now ≥ r`, as for a new client) |
//!
//! The first and the last two are exact: no answer changes when such a client
//! is forgotten and later re-created. The grid policies lose only their grid:
//! a re-created client's windows or drips start at its new origin.

use crate::{Rule, RuleSet};
use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use self::client::{Client, Part, Rules};
use crate::bounds::{SweepSchedule, SweepTurn};
use crate::decision::NEVER;
use crate::offenders::Offenders;
use crate::stats::{Counters, StoreCounts};
use crate::{
    Bounds, Clock, Config, ConfigError, Decision, Overflow, PolicyKind, QuantaClock, RateLimiter,
    Tick,
};

mod client;
mod policies;
#[cfg(test)]
mod tests;

/// The plain reference implementation of all six policies: a locked map from
/// client to a locked state.
///
/// Its answers are the contract read as literally as possible; the lock-free
/// engine ([`Limiter`]) is tested to give the same ones whenever a client's
/// times do not decrease. Build either with [`build_with`] (or
/// [`build_bounded`], to bound its memory), choosing the [`Engine`].
///
/// # Locking
///
/// Every call takes the map's lock only to find the client (or, on its first
/// call, to allocate and insert it), releases it, then takes that client's own
/// lock for the decision. Calls for different clients therefore contend on the
/// map lock for the length of one hash lookup; calls for the same client are
/// serialised by the client's lock. Nothing here is lock-free.
///
/// A sweep (on an arrival, or [`sweep_at`](Self::sweep_at)) holds the map
/// lock from start to end and takes each client's lock in turn, so it stalls
/// every call for its length. The order is always the map's lock, then a
/// client's (a decision never asks for the map's lock while holding a
/// client's), so the two cannot deadlock. A removed client is marked retired
/// under its own lock: a call that found it just before the sweep and locks
/// it just after sees the mark and looks its key up again (an arrival), so no
/// admission is ever recorded in a state the map has forgotten.
///
/// A panic while a lock is held cannot leave a state half-updated (every state
/// is valid between any two statements that change it), so a poisoned lock is
/// taken over rather than propagated.
///
/// # Time going backwards
///
/// On a real clock threads race, so a call can carry a `now` earlier than a
/// time the client's state already reflects. Each policy then judges the call
/// at the latest time its state reflects (the newest admission, the last
/// counted drip, the start of the current window; GCRA's `max(TAT, now)` does
/// this by itself) and measures `retry_after` from the call's own `now`.
/// Stored time never moves backwards, and such a call is never admitted where
/// the latest reflected time would reject it. A `now` before the client's
/// origin is judged at the origin, and the difference is added to
/// `retry_after`; except where the lock-free engine keeps no origin (a
/// schedule, `gcra` and `leaky-bucket`, starts at `TAT = origin`; a
/// bucket's state is the drip from which it is full): there the call is
/// judged at its own `now` against that state, which can only be stricter.
///
/// # Examples
///
/// ```
/// use floodgate::{Config, ManualClock, MutexLimiter, PolicyKind, RateLimiter};
///
/// let limiter: MutexLimiter<String, _> = MutexLimiter::with_clock(
///     PolicyKind::SlidingWindow,
///     Config::per_ticks(3, 1_000)?,
///     ManualClock::new(0),
/// )?;
/// for at in [0, 100, 200] {
///     assert!(limiter.check_at("rahul", at).allowed());
/// }
/// let fourth = limiter.check_at("rahul", 300);
/// assert!(!fourth.allowed());
/// assert_eq!(fourth.retry_after_ticks(), Some(700)); // the request at 0 leaves at 1000
/// assert!(limiter.check_at("priya", 300).allowed());
/// assert_eq!(limiter.tracked_clients(), 2);
/// # Ok::<(), floodgate::ConfigError>(())
/// ```
///
/// [`Limiter`]: crate::Limiter
/// [`build_with`]: crate::build_with
/// [`build_bounded`]: crate::build_bounded
/// [`Engine`]: crate::Engine
pub struct MutexLimiter<K, C = QuantaClock> {
    /// The rules, as given (resolved for the clock's tick).
    set: RuleSet,
    /// Each rule's parameters, in the same order.
    rules: Box<[Rules]>,
    /// The smallest limit: no request of a larger cost is ever admitted.
    limit: u64,
    clients: Mutex<HashMap<K, Arc<Mutex<Client>>>>,
    /// When sweeps run, and the bounds they enforce.
    schedule: SweepSchedule,
    /// [`Overflow::Shared`]'s state, created by the first call that finds no
    /// room (its `now` is the origin) and never swept: it is not in the map.
    shared: OnceLock<Mutex<Client>>,
    /// The latest `now` a sweep judged at: no client created afterwards gets
    /// an earlier origin, so a stale call that finds its client swept meets
    /// a state no younger than the one that went. Read and written only
    /// under the map lock, which orders every access (hence Relaxed).
    swept: AtomicU64,
    /// The clock's tick, which every decision carries.
    tick: Tick,
    clock: C,
    /// The decision counters, if it counts them (`counting`).
    counters: Option<Box<Counters>>,
    /// The `in-flight` rules, as bits by position: their refusals are
    /// counted apart.
    in_flight: u8,
    /// What the map's changes were: clients created, evicted, forgotten,
    /// and sweeps (a map has no rebuild to count).
    counts: StoreCounts,
    /// The clients refused most, if it keeps them (`offenders`).
    offenders: Option<Box<Offenders<K>>>,
}

impl<K> MutexLimiter<K, QuantaClock> {
    /// A limiter applying `policy` with `config`, on the default clock
    /// (nanosecond ticks).
    ///
    /// # Errors
    ///
    /// [`ConfigError::WindowShorterThanLimit`] when `policy` drips and the
    /// window is shorter than the limit.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Config, ConfigError, MutexLimiter, PolicyKind, RateLimiter};
    ///
    /// let limiter: MutexLimiter<u64> =
    ///     MutexLimiter::new(PolicyKind::Gcra, Config::per_ticks(10, 1_000_000_000)?)?;
    /// assert!(limiter.allow(&42));
    ///
    /// let too_short = MutexLimiter::<u64>::new(PolicyKind::Gcra, Config::per_ticks(10, 9)?);
    /// assert!(matches!(too_short, Err(ConfigError::WindowShorterThanLimit { .. })));
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn new(policy: PolicyKind, config: Config) -> Result<Self, ConfigError> {
        Self::with_clock(policy, config, QuantaClock::new())
    }
}

impl<K, C: Clock> MutexLimiter<K, C> {
    /// A limiter applying `policy` with `config`, reading `clock`; it tracks
    /// every client for ever (`Bounds::new()`).
    ///
    /// # Errors
    ///
    /// [`ConfigError::WindowShorterThanLimit`] when `policy` drips and the
    /// window is shorter than the limit.
    pub fn with_clock(policy: PolicyKind, config: Config, clock: C) -> Result<Self, ConfigError> {
        Self::with_bounds(policy, config, clock, Bounds::new())
    }

    /// A limiter applying `policy` with `config`, reading `clock`, and
    /// bounding its memory by `bounds`.
    ///
    /// # Errors
    ///
    /// As [`with_clock`](Self::with_clock).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Bounds, Config, ManualClock, MutexLimiter, Overflow};
    /// use floodgate::{PolicyKind, RateLimiter};
    ///
    /// let limiter: MutexLimiter<u64, _> = MutexLimiter::with_bounds(
    ///     PolicyKind::FixedWindow,
    ///     Config::per_ticks(1, 1_000)?,
    ///     ManualClock::new(0),
    ///     Bounds::new().max_clients(1).on_overflow(Overflow::Reject),
    /// )?;
    /// assert!(limiter.check_at(&1, 0).allowed());
    /// let second = limiter.check_at(&2, 10); // no room, and client 1 is busy
    /// assert!(!second.allowed());
    /// assert_eq!(second.retry_after_ticks(), Some(1_000));
    /// // At 1_000 client 1's window is over: it is swept to make room.
    /// assert!(limiter.check_at(&2, 1_000).allowed());
    /// assert_eq!(limiter.tracked_clients(), 1);
    /// # Ok::<(), floodgate::ConfigError>(())
    /// ```
    pub fn with_bounds(
        policy: PolicyKind,
        config: Config,
        clock: C,
        bounds: Bounds,
    ) -> Result<Self, ConfigError> {
        let config = config.resolve(policy, clock.tick())?;
        Self::with_rules(
            RuleSet::from(Rule::from_parts(policy, config)),
            clock,
            bounds,
        )
    }

    /// A limiter applying every rule of `rules` to each client (the
    /// contract's "Several limits on one client"), reading `clock`, and
    /// bounding its memory by `bounds`: a request is admitted iff every
    /// rule admits it, and a refused one changes no rule.
    ///
    /// # Errors
    ///
    /// What a rule's [`Config::resolve`] refuses for the clock's tick, or
    /// [`Bounds::validate`].
    ///
    /// ```
    /// use floodgate::{Bounds, ManualClock, MutexLimiter, RateLimiter};
    ///
    /// let limiter: MutexLimiter<u64, _> = MutexLimiter::with_rules(
    ///     "gcra:2/1s,fixed-window:3/1m".parse()?,
    ///     ManualClock::new(0),
    ///     Bounds::new(),
    /// )?;
    /// assert!(limiter.check_at(&7, 0).allowed());
    /// assert!(limiter.check_at(&7, 0).allowed());
    /// assert!(!limiter.check_at(&7, 0).allowed()); // the burst: the quota keeps its third
    /// assert_eq!(limiter.check_at(&7, 1_000_000_000).remaining(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_rules(rules: RuleSet, clock: C, bounds: Bounds) -> Result<Self, ConfigError> {
        let set = rules.in_ticks_of(clock.tick())?;
        let bounds = bounds.validate_for(&set)?;
        Ok(Self {
            in_flight: crate::stats::in_flight_mask(&set),
            limit: set.strictest().config().limit(),
            rules: set
                .iter()
                .map(|rule| {
                    let config = rule.config();
                    Rules {
                        policy: rule.policy(),
                        limit: config.limit(),
                        window: config.window(),
                        interval: config.interval(),
                    }
                })
                .collect(),
            set,
            tick: clock.tick(),
            clients: Mutex::new(HashMap::new()),
            schedule: SweepSchedule::new(bounds),
            shared: OnceLock::new(),
            swept: AtomicU64::new(0),
            clock,
            counters: None,
            counts: StoreCounts::default(),
            offenders: None,
        })
    }

    /// The limiter, keeping the clients it refuses most, as
    /// [`Limiter::offenders`](crate::Limiter::offenders).
    ///
    /// # Panics
    ///
    /// If `capacity` is 0 or above 2^31.
    #[must_use]
    pub fn offenders(mut self, capacity: usize) -> Self {
        self.offenders = Some(Box::new(Offenders::new(capacity)));
        self
    }

    /// The limiter, counting its decisions (`on`) or not, as
    /// [`Limiter::counting`](crate::Limiter::counting).
    #[must_use]
    pub fn counting(mut self, on: bool) -> Self {
        self.counters = on.then(Counters::new);
        self
    }

    /// What this limiter decided and did since it was built.
    pub fn stats(&self) -> crate::Stats {
        let mut stats = crate::Stats::default();
        self.counts.fill(&mut stats);
        if let Some(counters) = &self.counters {
            counters.fill(&mut stats);
        }
        stats
    }

    /// Removes every client idle now, by the limiter's clock (see
    /// [`sweep_at`](Self::sweep_at)).
    pub fn sweep(&self) -> usize
    where
        K: Hash + Eq,
    {
        self.sweep_at(self.clock.now())
    }
}

impl<K, C> MutexLimiter<K, C> {
    /// How many clients have state (takes the map lock). The overflow state
    /// of [`Overflow::Shared`] is not a client and is not counted.
    pub fn tracked_clients(&self) -> usize {
        lock(&self.clients).len()
    }

    /// The same as [`tracked_clients`](Self::tracked_clients): here the
    /// count is the map's length under its lock, exact at every instant. It
    /// exists so that the tests' cap watchers ask both engines alike (see
    /// `Limiter::stored_clients`).
    #[doc(hidden)]
    pub fn stored_clients(&self) -> usize {
        self.tracked_clients()
    }

    /// The bounds this limiter was built with.
    pub fn bounds(&self) -> Bounds {
        self.schedule.bounds()
    }
}

impl<K: Hash + Eq, C> MutexLimiter<K, C> {
    /// Removes every client idle at `now` and returns how many it removed.
    /// Runs whatever the bounds say: with eviction off, this is how idle
    /// clients go. Holds the map lock throughout (see "Locking" above).
    pub fn sweep_at(&self, now: u64) -> usize {
        let mut clients = lock(&self.clients);
        // Every turn in this engine is taken and given back under the map
        // lock, so this one is always free; the `None` arm is the schedule's
        // contract (no waiting for another sweeper), kept as such.
        match self.schedule.turn() {
            Some(turn) => self.sweep_locked(&mut clients, turn, now),
            None => 0,
        }
    }

    /// Removes every client idle at `now` from `clients` (the locked map) and
    /// records what it kept for the schedule. Returns how many it removed.
    fn sweep_locked(
        &self,
        clients: &mut HashMap<K, Arc<Mutex<Client>>>,
        turn: SweepTurn<'_>,
        now: u64,
    ) -> usize {
        self.swept.fetch_max(now, Ordering::Relaxed);
        let before = clients.len();
        clients.retain(|_, client| {
            let mut client = lock(client);
            client.retired = client.idle_at(&self.rules, now);
            !client.retired
        });
        turn.finish(clients.len());
        let removed = before - clients.len();
        StoreCounts::add(&self.counts.sweeps, 1);
        StoreCounts::add(&self.counts.evicted, removed as u64);
        removed
    }

    /// Where `key`'s call at `now` is decided: its client (created with
    /// origin `now` if there is room), or the overflow rule. The map lock is
    /// held for this lookup only; on a new client's arrival that includes
    /// the sweeps the schedule asks for.
    fn slot<Q>(&self, key: &Q, now: u64) -> Slot<'_>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let mut clients = lock(&self.clients);
        if let Some(client) = clients.get(key) {
            return Slot::Tracked(Arc::clone(client));
        }
        if let Some(turn) = self.schedule.arrive() {
            self.sweep_locked(&mut clients, turn, now);
        }
        let bounds = self.schedule.bounds();
        if let Some(cap) = bounds.cap() {
            if clients.len() >= cap
                && let Some(turn) = self.schedule.at_cap(cap)
            {
                self.sweep_locked(&mut clients, turn, now);
            }
            if clients.len() >= cap {
                self.counts.cap_reached(cap, bounds.overflow());
                return match bounds.overflow() {
                    Overflow::Reject => Slot::Reject,
                    Overflow::Admit => Slot::Admit,
                    // Created under the map lock, so the first overflowing
                    // call in the map lock's order sets the origin.
                    Overflow::Shared => Slot::Shared(
                        self.shared
                            .get_or_init(|| Mutex::new(Client::new(now, &self.rules))),
                    ),
                };
            }
        }
        let origin = now.max(self.swept.load(Ordering::Relaxed));
        let client = Arc::new(Mutex::new(Client::new(origin, &self.rules)));
        clients.insert(key.to_owned(), Arc::clone(&client));
        StoreCounts::add(&self.counts.created, 1);
        Slot::Tracked(client)
    }

    /// Answers `key`'s call at `now`: `decide` on the state it is decided on
    /// (its own, or the shared overflow state), or `untracked` when the
    /// overflow rule answers without any state.
    fn decide_for<Q, R>(
        &self,
        key: &Q,
        now: u64,
        mut decide: impl FnMut(&mut Client) -> R,
        untracked: impl FnOnce(Overflow) -> R,
        overflowed: impl FnOnce(),
    ) -> R
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        // Progress: a pass repeats only when a sweep removed the client
        // between the look-up and its lock; the next look-up then creates
        // it (or finds the one another thread created).
        loop {
            match self.slot(key, now) {
                Slot::Tracked(client) => {
                    if let Some(answer) = unless_retired(&client, &mut decide) {
                        return answer;
                    }
                    // Swept between the lookup and the client's lock: the
                    // key is no longer tracked, so look it up again, as an
                    // arrival.
                }
                Slot::Shared(shared) => {
                    overflowed();
                    return decide(&mut lock(shared));
                }
                Slot::Reject => {
                    overflowed();
                    return untracked(Overflow::Reject);
                }
                Slot::Admit => {
                    overflowed();
                    return untracked(Overflow::Admit);
                }
            }
        }
    }
}

impl<K, Q, C> RateLimiter<Q> for MutexLimiter<K, C>
where
    K: Borrow<Q> + Hash + Eq + Send + Sync,
    Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    C: Clock,
{
    fn check_at(&self, key: &Q, now: u64) -> Decision {
        self.check_n_at(key, now, 1)
    }

    fn check_n_at(&self, key: &Q, now: u64, cost: u64) -> Decision {
        let limit = self.limit;
        let decision = self
            .decide_for(
                key,
                now,
                |client| client.check(&self.rules, now, cost),
                // No room: the overflow rule answers as for a new client's
                // first call, with the contract's answers for a cost of 0 and
                // for one above the limit.
                |rule| {
                    let untracked_remaining = match rule {
                        Overflow::Admit => limit,
                        _ => 0,
                    };
                    match rule {
                        _ if cost == 0 => Decision::admit(untracked_remaining),
                        _ if cost > limit => Decision::reject(untracked_remaining, NEVER),
                        Overflow::Admit => Decision::admit(limit - cost),
                        _ => Decision::reject(0, self.idle_within()),
                    }
                },
                || {
                    if let Some(counters) = &self.counters {
                        counters.overflowed();
                    }
                },
            )
            .in_ticks(self.tick)
            .made_at(now);
        if let Some(counters) = &self.counters {
            counters.decided(&decision, cost, self.in_flight);
        }
        if let (false, Some(offenders)) = (decision.allowed, &self.offenders) {
            offenders.record(key, cost);
        }
        decision
    }

    fn remaining_at(&self, key: &Q, now: u64) -> u64 {
        self.decide_for(
            key,
            now,
            |client| client.remaining(&self.rules, now),
            |rule| match rule {
                Overflow::Admit => self.limit,
                _ => 0,
            },
            // A question, not a decision: not counted.
            || {},
        )
    }

    fn now(&self) -> u64 {
        self.clock.now()
    }

    fn policy(&self) -> PolicyKind {
        self.set.strictest().policy()
    }

    fn config(&self) -> Config {
        self.set.strictest().config()
    }

    fn rules(&self) -> RuleSet {
        self.set.clone()
    }

    fn check_ruled_n_at(&self, key: &Q, now: u64, cost: u64) -> crate::RuledDecision<'_> {
        let decision = self.check_n_at(key, now, cost);
        let each = match (self.rules.len(), lock(&self.clients).get(key).cloned()) {
            (2.., Some(client)) => unless_retired(&client, |client| {
                client.each(&self.set, &self.rules, now, cost, &decision)
            })
            .unwrap_or_default()
            .in_ticks(self.tick),
            _ => crate::RuleAnswers::default(),
        };
        crate::RuledDecision {
            decision,
            tier: None,
            policy: self.set.strictest().policy(),
            config: self.set.strictest().config(),
            refused_unknown_tier: false,
            each,
        }
    }

    fn check_ruled_at(&self, key: &Q, now: u64) -> crate::RuledDecision<'_> {
        self.check_ruled_n_at(key, now, 1)
    }

    fn tracked_clients(&self) -> usize {
        MutexLimiter::tracked_clients(self)
    }

    /// Under the client's lock: each rule's answer to a refused request of
    /// one unit is its own, nothing spent.
    fn peek_each_at(&self, key: &Q, now: u64) -> Option<crate::RuleAnswers> {
        let client = Arc::clone(lock(&self.clients).get(key)?);
        let refused = Decision::reject(0, NEVER);
        unless_retired(&client, |client| {
            client.each(&self.set, &self.rules, now, 1, &refused)
        })
        .map(|answers| answers.in_ticks(self.tick))
    }

    fn peek_at(&self, key: &Q, now: u64) -> Option<u64> {
        let client = Arc::clone(lock(&self.clients).get(key)?);
        // Swept between the two locks: it has no state any more.
        unless_retired(&client, |client| client.remaining(&self.rules, now))
    }

    /// Under the client's lock, as a check; a client with no state (or
    /// one a sweep removed meanwhile, which had nothing left to give) gets
    /// 0, and none is made. The shared overflow state is no client's own:
    /// nothing is given back to it.
    fn refund_at(&self, key: &Q, now: u64, at: u64, cost: u64) -> u64 {
        // No admission after `now` (the contract's `at ≤ now`).
        if at > now {
            return 0;
        }
        let Some(client) = lock(&self.clients).get(key).map(Arc::clone) else {
            return 0;
        };
        let given = unless_retired(&client, |client| client.refund(&self.rules, now, at, cost))
            .unwrap_or(0);
        if let Some(counters) = &self.counters {
            counters.refunded(given);
        }
        given
    }

    /// Under the client's lock, as a refund: a client with no state gets
    /// 0, and none is made.
    fn release_at(&self, key: &Q, _now: u64, cost: u64) -> u64 {
        let Some(client) = lock(&self.clients).get(key).map(Arc::clone) else {
            return 0;
        };
        let released =
            unless_retired(&client, |client| client.release(&self.rules, cost)).unwrap_or(0);
        if let Some(counters) = &self.counters {
            counters.released(released);
        }
        released
    }

    fn forget(&self, key: &Q) -> bool {
        let Some(client) = lock(&self.clients).remove(key) else {
            return false;
        };
        // A call that found it before the removal sees the mark and looks
        // its key up again.
        lock(&client).retired = true;
        StoreCounts::add(&self.counts.forgotten, 1);
        true
    }

    fn sweep_at(&self, now: u64) -> usize {
        MutexLimiter::sweep_at(self, now)
    }

    fn stats(&self) -> Option<crate::Stats> {
        Some(MutexLimiter::stats(self))
    }

    fn take_offenders(&self) -> Option<crate::offenders::Report<K>> {
        Some(self.offenders.as_ref()?.take())
    }

    fn saved_by(&self) -> Option<(&'static str, Tick)> {
        Some((crate::Engine::Mutex.name(), self.tick))
    }

    /// Each client under its own lock, the map's held only to list them.
    fn save_clients(&self, visit: &mut dyn FnMut(&str, &Q, &[u64])) {
        let clients: Vec<(K, Arc<Mutex<Client>>)> = lock(&self.clients)
            .iter()
            .map(|(key, client)| (key.borrow().to_owned(), Arc::clone(client)))
            .collect();
        let mut words = Vec::new();
        for (key, client) in clients {
            let client = lock(&client);
            // Swept since it was listed: idle, so nothing to keep.
            if client.retired {
                continue;
            }
            words.clear();
            for part in &client.parts {
                part.save(&mut words);
            }
            visit("", key.borrow(), &words);
        }
    }

    fn load_clients(
        &self,
        groups: Vec<crate::state::Group<'_, K>>,
    ) -> Result<usize, crate::state::ClientsRefused> {
        MutexLimiter::load_clients(self, crate::state::Group::only(groups)?)
    }

    fn load_spent(
        &self,
        clients: Vec<(K, Vec<u64>)>,
    ) -> Result<usize, crate::state::ClientsRefused> {
        MutexLimiter::load_spent(self, clients)
    }
}

impl<K: Hash + Eq, C: Clock> MutexLimiter<K, C> {
    /// Puts saved clients into the map, which holds none yet: every one is
    /// read first, so a refusal puts none; at a cap, the clients with the
    /// least left are kept (`state::keep_at_cap`). Each is created as an
    /// arrival is (the sweep schedule counts it).
    fn load_clients(&self, saved: Vec<(K, &[u64])>) -> Result<usize, crate::state::ClientsRefused> {
        use crate::state::ClientsRefused;
        let mut clients = lock(&self.clients);
        if !clients.is_empty() {
            return Err(ClientsRefused::NotEmpty);
        }
        let mut built = Vec::with_capacity(saved.len());
        for (i, (key, words)) in saved.into_iter().enumerate() {
            let mut words = words;
            let parts = self
                .rules
                .iter()
                .map(|rules| Part::load(rules, &mut words))
                .collect::<Option<Vec<Part>>>()
                .filter(|_| words.is_empty())
                .ok_or(ClientsRefused::Client(i))?;
            built.push((
                key,
                Client {
                    parts,
                    retired: false,
                },
            ));
        }
        if let Some(i) = crate::state::first_duplicate(built.iter().map(|(key, _)| key)) {
            return Err(ClientsRefused::Duplicate(i));
        }
        Ok(self.put_loaded(&mut clients, built))
    }

    /// A load under changed rules carried over: each client created now
    /// with what each of its rules has spent (`Part::spent`).
    fn load_spent(&self, spent: Vec<(K, Vec<u64>)>) -> Result<usize, crate::state::ClientsRefused> {
        use crate::state::ClientsRefused;
        let mut clients = lock(&self.clients);
        if !clients.is_empty() {
            return Err(ClientsRefused::NotEmpty);
        }
        if let Some(i) = crate::state::first_duplicate(spent.iter().map(|(key, _)| key)) {
            return Err(ClientsRefused::Duplicate(i));
        }
        let now = self.clock.now();
        let built = spent
            .into_iter()
            .map(|(key, spent)| {
                let parts = self
                    .rules
                    .iter()
                    .enumerate()
                    .map(|(i, rules)| Part::spent(rules, spent[i.min(spent.len() - 1)], now))
                    .collect();
                (
                    key,
                    Client {
                        parts,
                        retired: false,
                    },
                )
            })
            .collect();
        Ok(self.put_loaded(&mut clients, built))
    }

    /// Puts loaded clients in the (locked, empty) map as arrivals are put
    /// (the sweep schedule counts each); past the cap, the ones with the
    /// least left are kept (`state::keep_at_cap`).
    fn put_loaded(
        &self,
        clients: &mut HashMap<K, Arc<Mutex<Client>>>,
        built: Vec<(K, Client)>,
    ) -> usize {
        let now = self.clock.now();
        let kept = crate::state::keep_at_cap(built, self.schedule.bounds().cap(), |(_, client)| {
            client.remaining(&self.rules, now)
        });
        let count = kept.len();
        for (key, client) in kept {
            if let Some(turn) = self.schedule.arrive() {
                self.sweep_locked(clients, turn, now);
            }
            clients.insert(key, Arc::new(Mutex::new(client)));
            StoreCounts::add(&self.counts.created, 1);
        }
        count
    }
}

impl<K, C> fmt::Debug for MutexLimiter<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutexLimiter")
            .field("rules", &self.set.to_string())
            .field("bounds", &self.schedule.bounds())
            .field("clients", &self.tracked_clients())
            .finish_non_exhaustive()
    }
}

/// Where one call is decided.
enum Slot<'a> {
    /// The client's own state, in the map.
    Tracked(Arc<Mutex<Client>>),
    /// No room: the state every overflowing call shares.
    Shared(&'a Mutex<Client>),
    /// No room: rejected, with no state.
    Reject,
    /// No room: admitted as a new client's first request, with no state.
    Admit,
}

/// Runs `decide` on `client` under its lock, unless a sweep has removed it
/// from the map meanwhile (then `None`).
fn unless_retired<R>(client: &Mutex<Client>, decide: impl FnOnce(&mut Client) -> R) -> Option<R> {
    let mut client = lock(client);
    (!client.retired).then(|| decide(&mut client))
}

/// Locks `mutex`, taking over a poisoned lock: no state here is ever left
/// invalid between two statements, so a panic elsewhere cannot corrupt it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A `u128` answer as a `u64`, saturating. Every answer fits while a client's
/// times do not decrease (each is at most `W`); only a call whose `now` is far
/// older than its client's state can ask for more.
fn saturate(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

impl<K, C> MutexLimiter<K, C> {
    /// How long after its last call any client is idle, at most: the
    /// longest of its rules' (`Rules::idle_within`).
    fn idle_within(&self) -> u64 {
        self.rules.iter().map(Rules::idle_within).max().unwrap_or(0)
    }
}
