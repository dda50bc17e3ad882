//! One tier: its current rules, and its clients' states, each made by the
//! rules that were current when it was made or last carried over.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::{Arc, OnceLock};

use crate::policy::any::{AnyPolicy, AnyState};
use crate::policy::{Retired, Spent};
use crate::stats::{Counters, Stats};
use crate::store::{Arrival, Client, KeyedStore};
use crate::sync::{AtomicU64, Ordering, SwapCell};
use crate::{Bounds, Decision, Overflow, Rule, RuleAnswers, RuleSet, Tick};

/// One tier: its current rule, and its clients' states (each made by the
/// rule that was current when it was made or last carried over).
pub(super) struct Tier<K> {
    pub(super) current: SwapCell<Generation>,
    pub(super) clients: KeyedStore<K, TierState>,
    /// The tier's decision counters, if the registry counts them.
    pub(super) counters: Option<Box<Counters>>,
}

impl<K> Tier<K> {
    /// Its rule (for several, the strictest: [`RuleSet::strictest`]).
    pub(super) fn spec(&self) -> Rule {
        self.current.load().strictest
    }

    pub(super) fn rules(&self) -> RuleSet {
        self.current.load().spec.clone()
    }
}

/// A client read from a save, with its key (`Tier::loaded`).
pub(super) type Loaded<K> = (K, Client<TierState>);

/// A client's state and the rule that made it.
pub(super) struct TierState {
    pub(super) generation: Arc<Generation>,
    pub(super) state: AnyState,
    /// The latest `now` any check of this state presented (or the instant
    /// it was carried over at): the time a carry-over is judged at, and the
    /// earliest a check is judged at. A state word tells only a bound on
    /// its latest admission (a schedule runs up to `L·I` past it); this
    /// tells the time itself, so a call that is a little behind neither
    /// carries the client back in time nor is stamped before a carry-over
    /// it comes after.
    ///
    /// Raised (Relaxed) before a check's own compare-and-swap, which
    /// releases it: a carrier that retires the state after that admission
    /// (an acquiring read-modify-write later in the word's order) sees at
    /// least this time.
    pub(super) latest: AtomicU64,
}

impl TierState {
    pub(super) fn new(generation: Arc<Generation>, state: AnyState, latest: u64) -> Self {
        Self {
            generation,
            state,
            latest: AtomicU64::new(latest),
        }
    }
}

impl<K> Tier<K>
where
    K: Hash + Eq + Clone + 'static,
{
    pub(super) fn new(spec: RuleSet, bounds: Bounds, counting: bool) -> Self {
        Self {
            current: SwapCell::from_pointee(Generation::new(spec)),
            clients: KeyedStore::new(bounds),
            counters: counting.then(Counters::new),
        }
    }

    /// What this tier decided and did.
    pub(super) fn stats(&self) -> Stats {
        let mut stats = Stats::default();
        self.clients.counts.fill(&mut stats);
        if let Some(counters) = &self.counters {
            counters.fill(&mut stats);
        }
        stats
    }

    /// Runs `op` on `key`'s state made by the current rule (with the
    /// client's origin), carrying the client over first if its state is
    /// older, creating it if it is new. A new client that finds no room
    /// under the tier's cap gets the overflow rule: `untracked` answers
    /// for [`Overflow::Reject`] and [`Overflow::Admit`], and `op` runs on
    /// the rule's shared overflow state for [`Overflow::Shared`].
    #[inline]
    pub(super) fn call<Q, T>(
        &self,
        key: &Q,
        now: u64,
        op: impl Fn(&Generation, u64, &AnyState, Option<&AtomicU64>, u64) -> Result<T, Retired>,
        untracked: impl FnOnce(&Generation, Overflow) -> T,
        deciding: bool,
    ) -> T
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        // Progress: a pass repeats only when the client's state was made by
        // an older rule or was retired; `carry_over` then replaces it by
        // this thread's own step (or finds it replaced or removed by
        // another's), so the next pass finds a current state unless another
        // thread reloaded, swept or forgot meanwhile: each pass that
        // repeats follows another thread's finished step, or this one's.
        // A new client raced (`Raced`) is found by the next pass.
        loop {
            // A lock-free read of the current rule (arc-swap's fast path).
            let guard = self.current.load();
            let generation: &Arc<Generation> = &guard;
            let answer = self.clients.peek(key, |client| {
                Arc::ptr_eq(&client.state.generation, generation).then(|| {
                    op(
                        generation,
                        client.origin,
                        &client.state.state,
                        Some(&client.state.latest),
                        now,
                    )
                })
            });
            match answer {
                Some(Some(Ok(answer))) => return answer,
                // Made by an older rule, or retired under this call.
                Some(_) => self.carry_over(key, now),
                None => {
                    let arrival = self.clients.arrive(
                        key,
                        now,
                        || TierState::new(Arc::clone(generation), generation.new_state(), 0),
                        retire_if_idle,
                        // A retired entry may be mid-carry-over: the sweep
                        // leaves it to the client's next call.
                        |_| false,
                    );
                    match arrival {
                        Arrival::Created(client) => {
                            if let Ok(answer) = op(
                                generation,
                                client.origin,
                                &client.state.state,
                                Some(&client.state.latest),
                                now,
                            ) {
                                return answer;
                            }
                        }
                        Arrival::Raced => {}
                        Arrival::Full => {
                            if let (true, Some(counters)) = (deciding, &self.counters) {
                                counters.overflowed();
                            }
                            let rule = self.clients.bounds().overflow();
                            if rule != Overflow::Shared {
                                return untracked(generation, rule);
                            }
                            let (origin, state) = generation
                                .overflow
                                .get_or_init(|| (now, generation.new_state()));
                            return op(generation, *origin, state, None, now)
                                .expect("the overflow state is never retired");
                        }
                    }
                }
            }
        }
    }

    /// Moves `key`'s client to the current rule if its state was made by an
    /// older one or is retired: freezes the old state, and puts in its place
    /// one that has spent as much. Racing carriers each compute a successor
    /// from the same frozen state; the first to replace the entry wins.
    #[cold]
    #[inline(never)]
    pub(super) fn carry_over<Q>(&self, key: &Q, now: u64)
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        let generation = self.current.load_full();
        let Some(client) = self.clients.get(key) else {
            return; // removed by a sweep: the next look-up creates it
        };
        let old = &client.state.generation;
        if Arc::ptr_eq(old, &generation) && !generation.is_retired(&client.state.state) {
            return; // someone else carried it over already
        }
        // Judged and re-stamped at `spent.at`, never before the latest time
        // the old state reflects: a stale `now` must not move the client
        // back in time (module docs, "Reload"). First retire (freezing what
        // is carried), then read the latest time a check presented: Relaxed
        // is enough, as the retiring CAS acquired every admission before
        // it, and each of those raised `latest` before its own CAS.
        //
        // Several rules carry over rule by rule: the new rule at each
        // position keeps what the old one there had spent (a rule beyond
        // the old ones, what the old last one had).
        let state = &client.state.state;
        let first = old
            .policy
            .retire_spent_each(state, now.saturating_sub(client.origin));
        let latest = client
            .state
            .latest
            .load(Ordering::Relaxed)
            .saturating_sub(client.origin);
        let spent = if first.iter().any(|spent| latest > spent.at) {
            // Already retired: this only judges the frozen state again.
            old.policy.retire_spent_each(state, latest)
        } else {
            first
        };
        let at = spent.iter().map(|spent| spent.at).max().unwrap_or(0);
        let successor = Arc::new(Client {
            origin: client.origin,
            state: TierState::new(
                Arc::clone(&generation),
                generation.policy.spent_state_each(&spent),
                client.origin + at,
            ),
        });
        self.clients.replace(key, &client, successor);
    }

    pub(super) fn sweep_at(&self, now: u64) -> usize {
        self.clients
            .sweep(now, retire_if_idle, |_: &TierState| false)
    }

    /// Visits each client with the words a save keeps of it: its origin,
    /// its latest time, and its state's words under the current rule (a
    /// client whose state an older rule made is carried over first, as
    /// its next call would).
    pub(super) fn save_clients(&self, now: u64, mut visit: impl FnMut(&K, &[u64])) {
        let mut words = Vec::new();
        for key in self.clients.keys() {
            // Progress: as `call`'s: a pass repeats only after
            // `carry_over` replaced an older or retired state (this
            // thread's step, or another's it found done).
            loop {
                let generation = self.current.load_full();
                let Some(client) = self.clients.get(&key) else {
                    break; // swept or forgotten since it was listed
                };
                if Arc::ptr_eq(&client.state.generation, &generation) {
                    words.clear();
                    words.extend([client.origin, 0]);
                    if generation
                        .policy
                        .save_words(&client.state.state, &mut words)
                        .is_ok()
                    {
                        // Read after the state (Relaxed is enough): its
                        // Acquire read saw every admission's CAS, and each
                        // raised `latest` before its own CAS, so this is
                        // at least the latest time those admissions
                        // presented.
                        words[1] = client.state.latest.load(Ordering::Relaxed);
                        visit(&key, &words);
                        break;
                    }
                }
                self.carry_over(&key, now);
            }
        }
    }

    /// The clients of `group` as states of its saved rules (this tier's
    /// current generation when they are the same, else one of their own,
    /// which each client's next call carries over), with their keys; the
    /// index of the first client whose words are no such state otherwise.
    pub(super) fn loaded(
        &self,
        group: crate::state::Group<'_, K>,
        tick: Tick,
    ) -> Result<(Arc<Generation>, Vec<Loaded<K>>), usize> {
        use crate::state::RulesText;
        let current = self.current.load_full();
        let rules = group.rules.in_ticks_of(tick).map_err(|_| 0usize)?;
        let generation =
            if RulesText(&rules, tick).to_string() == RulesText(&current.spec, tick).to_string() {
                current
            } else {
                Arc::new(Generation::new(rules))
            };
        let mut clients = Vec::with_capacity(group.clients.len());
        for (i, (key, words)) in group.clients.into_iter().enumerate() {
            let [origin, latest, ref state @ ..] = words[..] else {
                return Err(i);
            };
            let state = generation.policy.load_words(state).ok_or(i)?;
            clients.push((
                key,
                Client {
                    origin,
                    state: TierState::new(Arc::clone(&generation), state, latest),
                },
            ));
        }
        Ok((generation, clients))
    }

    /// Puts loaded clients in, each created as an arrival creates one and
    /// then replaced by its loaded self (the store sets a new client's
    /// origin; the loaded one keeps its own).
    pub(super) fn put(&self, clients: Vec<(K, Client<TierState>)>, now: u64) -> usize {
        let generation = self.current.load_full();
        let mut kept = 0;
        for (key, client) in clients {
            let arrival = self.clients.arrive(
                &key,
                now,
                || TierState::new(Arc::clone(&generation), generation.new_state(), 0),
                retire_if_idle,
                |_| false,
            );
            if let Arrival::Created(made) = arrival {
                // No one else holds the registry yet: the entry is `made`.
                self.clients.replace(&key, &made, Arc::new(client));
                kept += 1;
            }
        }
        kept
    }

    /// `key`'s `remaining` at `now` by the current rule, if it has state.
    pub(super) fn peek<Q>(&self, key: &Q, now: u64) -> Option<u64>
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        // Progress: as `call`'s.
        loop {
            let guard = self.current.load();
            let generation: &Arc<Generation> = &guard;
            let answer = self.clients.peek(key, |client| {
                Arc::ptr_eq(&client.state.generation, generation).then(|| {
                    generation.remaining(&client.state.state, now.saturating_sub(client.origin))
                })
            })?;
            match answer {
                Some(Ok(remaining)) => return Some(remaining),
                // Made by an older rule, or retired under this call (by a
                // carry-over, a sweep or `forget`): settle it, look again.
                _ => self.carry_over(key, now),
            }
        }
    }

    /// `key`'s answer of each rule at `now` by the current rule, nothing
    /// spent, if it has state: `peek`'s, rule by rule.
    pub(super) fn peek_each<Q>(&self, key: &Q, now: u64) -> Option<crate::RuleAnswers>
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        // Progress: as `call`'s.
        loop {
            let guard = self.current.load();
            let generation: &Arc<Generation> = &guard;
            let answer = self.clients.peek(key, |client| {
                Arc::ptr_eq(&client.state.generation, generation).then(|| {
                    generation.peek_each(&client.state.state, now.saturating_sub(client.origin))
                })
            })?;
            match answer {
                Some(Ok(answers)) => return Some(answers),
                // As `peek`'s: settle it, look again.
                _ => self.carry_over(key, now),
            }
        }
    }

    /// Each rule's own answer to `key`'s request of cost `cost` at `now`
    /// that was `decided`, read from its state right after the decision,
    /// by the rules that made that state (the ones that decided, unless a
    /// reload carried the client over since): what a response's headers
    /// say of each rule. Empty for one rule, for a client without state
    /// of its own (the overflow rule answered it), and for a state retired
    /// meanwhile: the headers then describe the strictest rule alone.
    pub(super) fn each<Q>(&self, key: &Q, now: u64, cost: u64, decided: &Decision) -> RuleAnswers
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        // One rule answers for itself: no second look-up.
        if self.current.load().spec.len() < 2 {
            return RuleAnswers::default();
        }
        self.clients
            .peek(key, |client| {
                // Judged as the check was: no earlier than the client's
                // latest time (which the check raised to at least `now`).
                let latest = client.state.latest.load(Ordering::Relaxed);
                let judged = now.max(latest).max(client.origin);
                client
                    .state
                    .generation
                    .policy
                    .each(&client.state.state, judged - client.origin, cost, decided)
                    .ok()
            })
            .flatten()
            .unwrap_or_default()
    }

    /// Gives back to `key`'s state in this tier, if it has one (a refund
    /// creates nothing): `refund_at` of one tier. A state made by an older
    /// rule is carried over first, as any call carries it, and the refund
    /// goes to what the carry-over made (it kept the spend as admitted at
    /// the carry-over's time, so a window rule gives back what it still
    /// counts of it).
    pub(super) fn refund<Q>(&self, key: &Q, now: u64, at: u64, cost: u64) -> u64
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        // No admission after `now` (the contract's `at ≤ now`).
        if at > now {
            return 0;
        }
        // Progress: as `call`'s.
        loop {
            let guard = self.current.load();
            let generation: &Arc<Generation> = &guard;
            let Some(answer) = self.clients.peek(key, |client| {
                Arc::ptr_eq(&client.state.generation, generation).then(|| {
                    let since = now.saturating_sub(client.origin);
                    generation.refund(&client.state.state, since, now - at, cost)
                })
            }) else {
                return 0;
            };
            match answer {
                Some(Ok(given)) => {
                    if let Some(counters) = &self.counters {
                        counters.refunded(given);
                    }
                    return given;
                }
                _ => self.carry_over(key, now),
            }
        }
    }

    /// Gives back up to `cost` of the units the client holds under its
    /// `in-flight` rules, on its state of the current rule (carried over
    /// first, as a refund's).
    pub(super) fn release<Q>(&self, key: &Q, now: u64, cost: u64) -> u64
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        // Progress: as `call`'s.
        loop {
            let guard = self.current.load();
            let generation: &Arc<Generation> = &guard;
            let Some(answer) = self.clients.peek(key, |client| {
                Arc::ptr_eq(&client.state.generation, generation).then(|| {
                    let since = now.saturating_sub(client.origin);
                    generation.release(&client.state.state, since, cost)
                })
            }) else {
                return 0;
            };
            match answer {
                Some(Ok(released)) => {
                    if let Some(counters) = &self.counters {
                        counters.released(released);
                    }
                    return released;
                }
                _ => self.carry_over(key, now),
            }
        }
    }

    pub(super) fn forget<Q>(&self, key: &Q) -> bool
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        self.clients.forget(key, |client: &TierState| {
            client.generation.retire_spent(&client.state, 0);
        })
    }
}

/// Retires `client` if it is idle at `now`, by its own rule.
pub(super) fn retire_if_idle(client: &Client<TierState>, now: u64) -> bool {
    now.checked_sub(client.origin).is_some_and(|since| {
        client
            .state
            .generation
            .retire_if_idle(&client.state.state, since)
    })
}

/// One rule of a tier, as it was between two reloads.
pub(super) struct Generation {
    pub(super) spec: RuleSet,
    /// The rule with the smallest limit: the tier's `config` and `policy`.
    pub(super) strictest: Rule,
    pub(super) policy: AnyPolicy,
    /// The state newcomers share under [`Overflow::Shared`], with its
    /// origin: created by the first of them.
    pub(super) overflow: OnceLock<(u64, AnyState)>,
}

impl Generation {
    pub(super) fn new(spec: RuleSet) -> Self {
        Self {
            strictest: spec.strictest(),
            // `Rule::in_ticks_of` ran `check_for`, which is all a policy's
            // `new` checks.
            policy: AnyPolicy::from_rules(&spec).expect("validated by Rule::new"),
            spec,
            overflow: OnceLock::new(),
        }
    }

    pub(super) fn new_state(&self) -> AnyState {
        self.spent_state(0, 0)
    }

    pub(super) fn spent_state(&self, spent: u64, now: u64) -> AnyState {
        self.policy.spent_state(spent, now)
    }

    #[inline]
    pub(super) fn check_n(
        &self,
        state: &AnyState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, Retired> {
        self.policy.check_n(state, now, cost)
    }

    #[inline]
    pub(super) fn remaining(&self, state: &AnyState, now: u64) -> Result<u64, Retired> {
        self.policy.remaining(state, now)
    }

    pub(super) fn peek_each(
        &self,
        state: &AnyState,
        now: u64,
    ) -> Result<crate::RuleAnswers, Retired> {
        self.policy.peek_each(state, now)
    }

    pub(super) fn refund(
        &self,
        state: &AnyState,
        now: u64,
        ago: u64,
        cost: u64,
    ) -> Result<u64, Retired> {
        self.policy.refund(state, now, ago, cost)
    }

    pub(super) fn release(&self, state: &AnyState, now: u64, cost: u64) -> Result<u64, Retired> {
        self.policy.release(state, now, cost)
    }

    pub(super) fn retire_if_idle(&self, state: &AnyState, now: u64) -> bool {
        self.policy.retire_if_idle(state, now)
    }

    pub(super) fn retire_spent(&self, state: &AnyState, now: u64) -> Spent {
        self.policy.retire_spent(state, now)
    }

    pub(super) fn is_retired(&self, state: &AnyState) -> bool {
        self.policy.is_retired(state)
    }

    pub(super) fn forgets_after(&self) -> u64 {
        self.policy.forgets_after()
    }

    pub(super) fn measured_from_earlier(&self, decision: Decision, lag: u64) -> Decision {
        self.policy.measured_from_earlier(decision, lag)
    }
}
