//! The lock-free limiter: one policy, its clients' states inline in the
//! keyed store, and a clock.

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;

use crate::decision::NEVER;
use crate::offenders::Offenders;
use crate::policy::{Origin, Policy, Retired};
use crate::stats::Counters;
use crate::store::{Arrival, Client, InlineStore, Lifecycle, Vacancy};
use crate::sync::OnceLock;
use crate::{
    Bounds, Clock, Config, ConfigError, Decision, Overflow, PolicyKind, QuantaClock, RateLimiter,
    RuleAnswers, RuleSet, RuledDecision, Tick,
};

/// The lock-free limiter: one policy, per-client state in a concurrent map,
/// and a clock. Generic over the policy, so each check compiles to that
/// policy's code with no dynamic dispatch; [`build`](crate::build) gives the
/// same behind `Box<dyn RateLimiter>` when the policy is chosen at run time.
///
/// A check for a known client takes no lock and allocates nothing, and
/// follows no pointer of its own: the client's key and state lie inline in
/// one slot of the store's table (a key longer than a word, such as a
/// `String`, and a `sliding-window` ring are the exceptions: each lives
/// behind one pointer). The first check of a new client claims an empty slot
/// with one compare-and-swap (allocating only what its key or a
/// `sliding-window` ring needs). [`Bounds`] (see
/// [`with_bounds`](Self::with_bounds)) evict idle clients and cap how many
/// are tracked; a capped limiter sizes its table for the cap once.
///
/// ```
/// use floodgate::policy::{Policy, SlidingWindow};
/// use floodgate::{Config, Limiter, ManualClock};
///
/// let clock = ManualClock::new(0);
/// let limiter: Limiter<String, SlidingWindow, _> =
///     Limiter::with_clock(SlidingWindow::new(Config::per_ticks(3, 1_000)?)?, clock.clone())?;
/// for _ in 0..3 {
///     assert!(limiter.check("rahul").allowed());
/// }
/// let fourth = limiter.check("rahul");
/// assert!(!fourth.allowed());
/// assert_eq!(fourth.retry_after_ticks(), Some(1_000));
/// assert!(limiter.check("priya").allowed()); // clients never share state
/// # Ok::<(), floodgate::ConfigError>(())
/// ```
pub struct Limiter<K, P: Policy, C = QuantaClock> {
    policy: P,
    /// Each client's state, with its origin where the policy needs it
    /// (`Policy::Origin`): a `gcra` client is its key and one word.
    clients: InlineStore<K, Resident<P>>,
    /// The state every client shares under [`Overflow::Shared`], created by
    /// the first of them.
    overflow: OnceLock<Resident<P>>,
    /// The clock's tick, which every decision carries.
    tick: Tick,
    clock: C,
    /// What it watches of its decisions, if anything: one pointer, so
    /// that a limiter that watches nothing pays one predictable branch a
    /// check, whatever the check answers.
    watch: Option<Box<Watch<K>>>,
}

/// What a limiter watches of its decisions.
struct Watch<K> {
    /// The decision counters, if it counts them ([`Limiter::counting`]).
    counters: Option<Box<Counters>>,
    /// The clients refused most, if it keeps them ([`Limiter::offenders`]).
    offenders: Option<Offenders<K>>,
    /// The policy's `in-flight` rules, as bits by position
    /// (`stats::in_flight_mask`): their refusals are counted apart.
    in_flight: u8,
}

impl<K> Watch<K> {
    /// Counts `decision` of `key`, of cost `cost`, and records a refusal.
    #[inline(always)]
    fn saw<Q>(&self, key: &Q, decision: &Decision, cost: u64)
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        if let Some(counters) = &self.counters {
            counters.decided(decision, cost, self.in_flight);
        }
        if !decision.allowed {
            self.refused(key, cost);
        }
    }

    /// Records a refusal of `key` in the offenders' summary, if kept.
    #[cold]
    #[inline(never)]
    fn refused<Q>(&self, key: &Q, cost: u64)
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        if let Some(offenders) = &self.offenders {
            offenders.record(key, cost);
        }
    }
}

impl<K, P> Limiter<K, P, QuantaClock>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    P: Policy,
{
    /// A limiter applying `policy`, on the default clock (nanoseconds, the
    /// ticks a policy made from [`Config::per`] is in), tracking every
    /// client for ever.
    pub fn new(policy: P) -> Self {
        Self::assemble(policy, QuantaClock::new(), Bounds::new())
    }
}

impl<K, P, C> Limiter<K, P, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    P: Policy,
    C: Clock,
{
    /// A limiter applying `policy`, reading `clock`, tracking every client
    /// for ever (no eviction, no cap).
    ///
    /// # Errors
    ///
    /// As [`with_bounds`](Self::with_bounds).
    pub fn with_clock(policy: P, clock: C) -> Result<Self, ConfigError> {
        Self::with_bounds(policy, clock, Bounds::new())
    }

    fn assemble(policy: P, clock: C, bounds: Bounds) -> Self {
        Self {
            policy,
            clients: InlineStore::new(bounds),
            overflow: OnceLock::new(),
            tick: clock.tick(),
            clock,
            watch: None,
        }
    }

    /// The limiter's watch, made if it had none.
    fn watch_mut(&mut self) -> &mut Watch<K> {
        let in_flight = crate::stats::in_flight_mask(&self.policy.rule_set());
        self.watch.get_or_insert_with(|| {
            Box::new(Watch {
                counters: None,
                offenders: None,
                in_flight,
            })
        })
    }

    /// The limiter, keeping the clients it refuses most in a summary of
    /// `capacity` entries ([`crate::offenders`]): fed by rejections only,
    /// so an admitted request pays nothing, and never growing, whatever
    /// the flood of ids. Read with [`RateLimiter::take_offenders`].
    ///
    /// # Panics
    ///
    /// If `capacity` is 0 or above 2^31.
    #[must_use]
    pub fn offenders(mut self, capacity: usize) -> Self {
        self.watch_mut().offenders = Some(Offenders::new(capacity));
        self
    }

    /// The limiter, counting its decisions (`on`) or not: [`stats`]'s
    /// `admitted`, `rejected`, their units and `overflowed` stay 0 without
    /// it. Each counted check adds to its thread's own counters, never to
    /// another thread's (module `stats`): a few nanoseconds, which
    /// `floodgate bench`'s `"metrics": true` rows measure.
    ///
    /// [`stats`]: Self::stats
    #[must_use]
    pub fn counting(mut self, on: bool) -> Self {
        if on || self.watch.is_some() {
            self.watch_mut().counters = on.then(Counters::new);
        }
        self
    }

    /// What this limiter decided and did since it was built.
    pub fn stats(&self) -> crate::Stats {
        let mut stats = crate::Stats::default();
        self.clients.counts.fill(&mut stats);
        if let Some(counters) = self.watch.as_ref().and_then(|w| w.counters.as_ref()) {
            counters.fill(&mut stats);
        }
        stats
    }

    /// A limiter applying `policy`, reading `clock`, within `bounds`. A
    /// policy made from a rate given as a duration ([`Config::per`]) is
    /// made again for the clock's tick.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] if that rate does not fit the tick
    /// ([`Config::resolve`]), or if the bounds can only refuse everyone
    /// ([`Bounds::validate`]).
    ///
    /// ```
    /// use floodgate::policy::{Gcra, Policy};
    /// use floodgate::{Bounds, Config, Limiter, ManualClock, Overflow};
    ///
    /// let clock = ManualClock::new(0);
    /// let limiter: Limiter<u64, Gcra, _> = Limiter::with_bounds(
    ///     Gcra::new(Config::per_ticks(10, 1_000)?)?,
    ///     clock.clone(),
    ///     Bounds::new().max_clients(2).on_overflow(Overflow::Reject),
    /// )?;
    /// assert!(limiter.check(&1).allowed());
    /// assert!(limiter.check(&2).allowed());
    /// assert!(!limiter.check(&3).allowed()); // no room, and nobody is idle
    /// clock.advance(100); // clients 1 and 2 have their full burst back
    /// assert!(limiter.check(&3).allowed()); // so they made room
    /// assert_eq!(limiter.tracked_clients(), 1);
    /// # Ok::<(), floodgate::ConfigError>(())
    /// ```
    pub fn with_bounds(policy: P, clock: C, bounds: Bounds) -> Result<Self, ConfigError> {
        let bounds = bounds.validate_for(&policy.rule_set())?;
        let policy = if policy
            .rule_set()
            .iter()
            .any(|r| r.config().span().is_some())
            && clock.tick() != Tick::NANOSECOND
        {
            policy.in_ticks_of(clock.tick())?
        } else {
            policy
        };
        Ok(Self::assemble(policy, clock, bounds))
    }

    /// The policy's parameters.
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// The limiter's bounds.
    pub fn bounds(&self) -> Bounds {
        self.clients.bounds()
    }

    /// Decides one request of `key` at `now` (see [`RateLimiter::check_at`]).
    #[inline]
    pub fn check_at<Q>(&self, key: &Q, now: u64) -> Decision
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        self.check_known_first(key, || now, 1)
    }

    /// Decides one request of cost `cost` of `key` at `now`, in one atomic
    /// step (see [`RateLimiter::check_n_at`]).
    #[inline]
    pub fn check_n_at<Q>(&self, key: &Q, now: u64, cost: u64) -> Decision
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        self.check_known_first(key, || now, cost)
    }

    /// The body of `check_at`, `check_n_at`, `check` and `check_n`,
    /// inlined into each so that `check_at`'s constant cost of 1 reaches
    /// the step: the hot path, a known client, is one look-up and one step.
    ///
    /// `now` is read where the decision needs it, once the look-up's loads
    /// are issued: with the limiter's clock, the clock's read (a TSC read
    /// and a scaling, 11 to 13 ns) then overlaps the miss on the client's
    /// slot instead of coming before it. A later read is only a fresher
    /// time, which every decision accepts.
    #[inline(always)]
    fn check_known_first<Q>(&self, key: &Q, now: impl Fn() -> u64, cost: u64) -> Decision
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        let hash = self.clients.hash(key);
        let decision = match self.clients.peek_or_vacancy(
            key,
            hash,
            #[inline(always)]
            |client| self.decide(client, now(), cost),
        ) {
            Ok(Ok(decision)) => decision.in_ticks(self.tick),
            found => self
                .check_cold(key, hash, now(), cost, found.map(|_| ()))
                .in_ticks(self.tick),
        };
        if let Some(watch) = &self.watch {
            watch.saw(key, &decision, cost);
        }
        decision
    }

    /// A check of a new client (`found` an error: the hot path just looked
    /// and found none, and stopped at the vacancy it holds), or of one
    /// whose state was retired under it.
    #[cold]
    #[inline(never)]
    fn check_cold<Q>(
        &self,
        key: &Q,
        hash: u64,
        now: u64,
        cost: u64,
        mut found: Result<(), Option<Vacancy>>,
    ) -> Decision
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        // Each answer returned where it is matched, never carried out of
        // its enum first: a `Decision` moved through `Arrival` and `Result`
        // was copied with its padding, and the copies' loads stalled on the
        // stores before them (a tenth of a new client's check).
        //
        // Progress: a pass repeats only when the client's state was retired
        // under it (a move's freeze, a sweep, `forget`: the store's `settle`
        // says why the slot changes within a few of that thread's steps,
        // and the next pass then finds the client moved, or gone and made
        // anew), when it vanished between two looks (a removal by another
        // thread), or when another thread created it first (`Raced`: the
        // next pass finds it). Each is another thread's finished step, so
        // with no other thread running the call ends within two passes.
        loop {
            match found {
                Ok(()) => match self
                    .clients
                    .peek_or_vacancy(key, hash, |client| self.decide(client, now, cost))
                {
                    Ok(Ok(decision)) => return decision,
                    Ok(Err(Retired)) => self.clients.settle(),
                    Err(vacancy) => found = Err(vacancy),
                },
                Err(vacancy) => {
                    // The new client's decision comes back in `first`, not
                    // in the `Arrival`: carried there, its copy stalled the
                    // same way.
                    let mut first = Decision::default();
                    match self
                        .clients
                        .arrive(vacancy, key, hash, now, &self.policy, |client| {
                            let (client, decision) = self.decide_first(client, now, cost);
                            first = decision;
                            (client, ())
                        }) {
                        Arrival::Created(()) => return first,
                        Arrival::Raced => found = Ok(()),
                        Arrival::Full => return self.overflow_check(now, cost),
                    }
                }
            }
        }
    }

    /// How many requests of `key` would be admitted at `now` (see
    /// [`RateLimiter::remaining_at`]).
    #[inline]
    pub fn remaining_at<Q>(&self, key: &Q, now: u64) -> u64
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        let hash = self.clients.hash(key);
        match self
            .clients
            .peek_hashed(key, hash, |client| self.count(client, now))
        {
            Some(Ok(remaining)) => remaining,
            found => self.remaining_cold(key, hash, now, found.is_some()),
        }
    }

    /// As `check_cold`, for `remaining`.
    #[cold]
    #[inline(never)]
    fn remaining_cold<Q>(&self, key: &Q, hash: u64, now: u64, mut present: bool) -> u64
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        // Progress: as `check_cold`'s.
        loop {
            let answer = if present {
                match self
                    .clients
                    .peek_hashed(key, hash, |client| self.count(client, now))
                {
                    Some(answer) => answer,
                    None => {
                        present = false;
                        continue;
                    }
                }
            } else {
                match self
                    .clients
                    .arrive(None, key, hash, now, &self.policy, |client| {
                        let answer = self.count(&client, now);
                        (client, answer)
                    }) {
                    Arrival::Created(answer) => answer,
                    Arrival::Raced => {
                        present = true;
                        continue;
                    }
                    Arrival::Full => return self.overflow_remaining(now),
                }
            };
            match answer {
                Ok(remaining) => return remaining,
                Err(Retired) => {
                    self.clients.settle();
                    present = true;
                }
            }
        }
    }

    /// How many requests of `key` would be admitted at `now`, if it has
    /// state (see [`RateLimiter::peek_at`]). Creates nothing.
    pub fn peek_at<Q>(&self, key: &Q, now: u64) -> Option<u64>
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        // Progress: as `check_cold`'s; a client removed ends the loop.
        loop {
            match self.clients.peek(key, |client| self.count(client, now))? {
                Ok(remaining) => return Some(remaining),
                // Moved or removed under this call: look again once that
                // step is done.
                Err(Retired) => self.clients.settle(),
            }
        }
    }

    /// Each rule's own answer for one unit of `key` at `now`, nothing spent
    /// (see [`RateLimiter::peek_each_at`]); `None` for a client with no
    /// state, and none is made.
    pub fn peek_each_at<Q>(&self, key: &Q, now: u64) -> Option<RuleAnswers>
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        // Progress: as `peek_at`'s.
        loop {
            let answers = self.clients.peek(key, |client| {
                let (since, _) = since_origin(client.origin.tick(), now);
                self.policy.peek_each(&client.state, since)
            })?;
            match answers {
                Ok(answers) => return Some(answers.in_ticks(self.tick)),
                Err(Retired) => self.clients.settle(),
            }
        }
    }

    /// Each rule's own answer to a request of `key` of cost `cost` at
    /// `now` that was `decided`: for several rules, read from the client's
    /// state right after the decision (so, like `remaining`, it may count
    /// later admissions of other threads); empty for one rule, or for a
    /// client that has no state (the overflow rule answered it, or it was
    /// removed meanwhile).
    pub fn each_at<Q>(&self, key: &Q, now: u64, cost: u64, decided: &Decision) -> RuleAnswers
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        if !P::SEVERAL {
            return RuleAnswers::default();
        }
        // Progress: as `peek_at`'s.
        loop {
            let answers = self.clients.peek(key, |client| {
                self.policy.each(&client.state, now, cost, decided)
            });
            match answers {
                None => return RuleAnswers::default(),
                Some(Ok(answers)) => return answers.in_ticks(self.tick),
                Some(Err(Retired)) => self.clients.settle(),
            }
        }
    }

    /// Forgets `key`'s state (see [`RateLimiter::forget`]). The removal
    /// takes the store's upkeep lock, so it waits for the one step of a
    /// move or a sweep that holds it; checks never wait for it.
    pub fn forget<Q>(&self, key: &Q) -> bool
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        self.clients.forget(key, |client| {
            self.policy.retire_spent(&client.state, 0);
        })
    }

    /// Gives back up to `cost` units of `key`'s admission at `at`, judged
    /// at `now` (see [`RateLimiter::refund_at`]): one CAS step on the
    /// client's state, or none when nothing comes back. A client with no
    /// state gets 0 and is not created; one under the shared overflow
    /// state has none of its own, and gets 0 too.
    #[inline]
    pub fn refund_at<Q>(&self, key: &Q, now: u64, at: u64, cost: u64) -> u64
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        // No admission after `now` (the contract's `at ≤ now`).
        if at > now {
            return 0;
        }
        // Progress: as `peek_at`'s.
        loop {
            match self
                .clients
                .peek(key, |client| self.give_back(client, now, at, cost))
            {
                None => return 0,
                Some(Ok(given)) => {
                    if let Some(counters) = self.watch.as_ref().and_then(|w| w.counters.as_ref()) {
                        counters.refunded(given);
                    }
                    return given;
                }
                // Moved or removed under this call: look again once that
                // step is done (a removed client had nothing to give).
                Some(Err(Retired)) => self.clients.settle(),
            }
        }
    }

    /// Gives back up to `cost` of the units `key` holds under its
    /// `in-flight` rules (see [`RateLimiter::release_at`]): one CAS step on
    /// the client's state. A client with no state gets 0 and is not
    /// created.
    pub fn release_at<Q>(&self, key: &Q, now: u64, cost: u64) -> u64
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        // Progress: as `peek_at`'s.
        loop {
            match self.clients.peek(key, |client| {
                let (since, _) = since_origin(client.origin.tick(), now);
                self.policy.release(&client.state, since, cost)
            }) {
                None => return 0,
                Some(Ok(released)) => {
                    if let Some(counters) = self.watch.as_ref().and_then(|w| w.counters.as_ref()) {
                        counters.released(released);
                    }
                    return released;
                }
                // Moved or removed under this call: look again once that
                // step is done (a removed client held nothing any more).
                Some(Err(Retired)) => self.clients.settle(),
            }
        }
    }

    /// One refund on `client`'s state, in the times its policy counts in
    /// (`now >= at`): a call before the origin is judged at it, as a
    /// check is.
    #[inline]
    fn give_back(
        &self,
        client: &Resident<P>,
        now: u64,
        at: u64,
        cost: u64,
    ) -> Result<u64, Retired> {
        let (since, _) = since_origin(client.origin.tick(), now);
        self.policy.refund(&client.state, since, now - at, cost)
    }

    /// Whether `key` has state. Changes nothing and creates nothing.
    pub fn tracks<Q>(&self, key: &Q) -> bool
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        self.clients.peek(key, |_| ()).is_some()
    }

    /// Visits every client with the words a save keeps of it: what the
    /// limiter keeps of its origin, then its state's words
    /// (`Policy::save_words`), read in one atomic step. A client whose
    /// state a move or a removal retired under the walk is looked up again:
    /// found, it is read where it went; gone, it is passed over (it was
    /// idle, or forgotten). The shared state of [`Overflow::Shared`] is
    /// not saved.
    pub(crate) fn save_clients(&self, mut visit: impl FnMut(&K, &[u64])) {
        let mut words = Vec::new();
        let save = |client: &Resident<P>, words: &mut Vec<u64>| {
            words.clear();
            client.origin.save(words);
            self.policy.save_words(&client.state, words)
        };
        self.clients.visit_all(&self.policy, |key, client| {
            // Progress: as `check_cold`'s: a state found retired again is
            // one another thread's step is moving or removing, and
            // `settle` waits for that step.
            let mut saved = save(client, &mut words);
            while saved.is_err() {
                match self.clients.peek(key, |client| save(client, &mut words)) {
                    Some(Ok(())) => saved = Ok(()),
                    Some(Err(Retired)) => self.clients.settle(),
                    None => return,
                }
            }
            visit(key, &words);
        });
    }

    /// Puts saved clients into this limiter, which holds none yet: every
    /// one's words are made a state first, so that a refusal puts none;
    /// at a cap, the clients with the least left are kept
    /// (`state::keep_at_cap`); then each is created as a first call
    /// creates a client.
    pub(crate) fn load_clients(
        &self,
        clients: Vec<(K, &[u64])>,
    ) -> Result<usize, crate::state::ClientsRefused> {
        use crate::state::ClientsRefused;
        if self.clients.stored() != 0 {
            return Err(ClientsRefused::NotEmpty);
        }
        if let Some(i) = crate::state::first_duplicate(clients.iter().map(|(key, _)| key)) {
            return Err(ClientsRefused::Duplicate(i));
        }
        let mut built = Vec::with_capacity(clients.len());
        for (i, (key, words)) in clients.into_iter().enumerate() {
            let (origin, words) = P::Origin::load(words).ok_or(ClientsRefused::Client(i))?;
            let state = self
                .policy
                .load_words(words)
                .ok_or(ClientsRefused::Client(i))?;
            built.push((key, Client { origin, state }));
        }
        Ok(self.put_loaded(built, self.clock.now()))
    }

    /// A load under changed rules carried over: each client created with
    /// what each rule has spent now (`Policy::spent_state_each`; its
    /// origin, where the policy keeps one, now).
    pub(crate) fn load_spent(
        &self,
        clients: Vec<(K, Vec<u64>)>,
    ) -> Result<usize, crate::state::ClientsRefused> {
        use crate::state::ClientsRefused;
        if self.clients.stored() != 0 {
            return Err(ClientsRefused::NotEmpty);
        }
        if let Some(i) = crate::state::first_duplicate(clients.iter().map(|(key, _)| key)) {
            return Err(ClientsRefused::Duplicate(i));
        }
        let now = self.clock.now();
        let built = clients
            .into_iter()
            .map(|(key, spent)| {
                let origin = P::Origin::keep(now);
                let since = now - origin.tick();
                let state = self.policy.spent_state_each(&spent, since);
                (key, Client { origin, state })
            })
            .collect();
        Ok(self.put_loaded(built, now))
    }

    /// Creates loaded clients as first calls create clients; past the cap,
    /// the ones with the least left are kept (`state::keep_at_cap`).
    fn put_loaded(&self, built: Vec<(K, Resident<P>)>, now: u64) -> usize {
        let built = crate::state::keep_at_cap(built, self.clients.bounds().cap(), |(_, client)| {
            self.count(client, now).unwrap_or(0)
        });
        let mut kept = 0;
        for (key, client) in built {
            let hash = self.clients.hash(&key);
            let mut client = Some(client);
            let arrival = self
                .clients
                .arrive(None, &key, hash, now, &self.policy, |_| {
                    (client.take().expect("one client a key"), ())
                });
            match arrival {
                Arrival::Created(()) => kept += 1,
                // No key twice (above), and no one else holds the limiter
                // yet: only the cap refuses.
                Arrival::Raced => {}
                Arrival::Full => break,
            }
        }
        kept
    }

    /// Removes every client idle at `now` (see [`RateLimiter::sweep_at`]).
    pub fn sweep_at(&self, now: u64) -> usize {
        self.clients.sweep(now, &self.policy)
    }

    /// One decision on `client`'s state. Always inlined: it is the body of
    /// the hot path, and as a call it costs a fifth of a known client's
    /// check (measured in instructions).
    #[inline(always)]
    fn decide(&self, client: &Resident<P>, now: u64, cost: u64) -> Result<Decision, Retired> {
        // A call with a time before the client's origin (it raced with the
        // thread that created the client at a slightly later time) is
        // judged at the origin, `lag` ticks later. A policy that keeps no
        // origin counts from tick 0, so there is no lag: its state began
        // at the origin, and a call before it is judged at its own time
        // against that state, which is only stricter.
        let (since, lag) = since_origin(client.origin.tick(), now);
        // One call site of the step, with no closure around it, so that the
        // whole step inlines into the hot path. A single request (the
        // constant 1 of `check_at`, once inlined) skips `check_n`'s tests
        // for 0 and for a cost above the limit.
        let decision = if cost == 1 {
            self.policy.check(&client.state, since)?
        } else {
            self.policy.check_n(&client.state, since, cost)?
        };
        // A cost of 0 changes nothing, so it waits for nothing either.
        if lag == 0 || cost == 0 {
            return Ok(decision.made_at(now));
        }
        Ok(self
            .policy
            .measured_from_earlier(decision, lag)
            .made_at(now))
    }

    /// A new client's first call, decided before the store publishes the
    /// client (so no other call can come between its creation and this
    /// decision): as `decide`, with the policy's step on a state no other
    /// thread can reach yet, which needs no CAS (`Policy::check_unshared`).
    /// Answers the client to publish, with the decision.
    #[inline]
    fn decide_first(&self, client: Resident<P>, now: u64, cost: u64) -> (Resident<P>, Decision) {
        if cost == 0 || cost > self.policy.config().limit() {
            // Answered from `remaining`, by `check_n`: nothing to store.
            let decision = match self.decide(&client, now, cost) {
                Ok(decision) => decision,
                Err(Retired) => unreachable!("a new state is never retired"),
            };
            return (client, decision);
        }
        let Client { origin, state } = client;
        // As in `decide`: an origin after `now` (a sweep's time, later than
        // this call's) is where the call is judged, `lag` ticks later.
        let (since, lag) = since_origin(origin.tick(), now);
        let (state, decision) = self.policy.check_unshared(state, since, cost);
        let decision = self
            .policy
            .measured_from_earlier(decision, lag)
            .made_at(now);
        (Client { origin, state }, decision)
    }

    #[inline(always)]
    fn count(&self, client: &Resident<P>, now: u64) -> Result<u64, Retired> {
        self.policy
            .remaining(&client.state, now.saturating_sub(client.origin.tick()))
    }

    /// A check of a client that found no room at the cap: [`Overflow`]'s
    /// answer, with the contract's for a cost of 0 (admitted, changing
    /// nothing) and above the limit (never admitted).
    #[cold]
    fn overflow_check(&self, now: u64, cost: u64) -> Decision {
        self.overflow_decision(now, cost).made_at(now)
    }

    fn overflow_decision(&self, now: u64, cost: u64) -> Decision {
        if let Some(counters) = self.watch.as_ref().and_then(|w| w.counters.as_ref()) {
            counters.overflowed();
        }
        let limit = self.policy.config().limit();
        let overflow = self.bounds().overflow();
        if overflow == Overflow::Shared {
            return self
                .decide(self.shared(now), now, cost)
                .expect("the overflow state is never retired");
        }
        let remaining = self.overflow_remaining(now);
        if cost == 0 {
            Decision::admit(remaining)
        } else if cost > limit {
            Decision::reject(remaining, NEVER)
        } else if overflow == Overflow::Admit {
            Decision::admit(limit - cost)
        } else {
            Decision::reject(0, self.policy.forgets_after())
        }
    }

    #[cold]
    fn overflow_remaining(&self, now: u64) -> u64 {
        match self.bounds().overflow() {
            Overflow::Reject => 0,
            Overflow::Admit => self.policy.config().limit(),
            Overflow::Shared => self
                .count(self.shared(now), now)
                .expect("the overflow state is never retired"),
        }
    }

    fn shared(&self, now: u64) -> &Resident<P> {
        self.overflow.get_or_init(|| self.policy.new_client(now))
    }

    /// Decides one request of `key` now, by the limiter's clock.
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Decision
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        self.check_known_first(key, || self.clock.now(), 1)
    }

    /// Decides one request of cost `cost` of `key` now, by the limiter's
    /// clock (see [`RateLimiter::check_n_at`]).
    #[inline]
    pub fn check_n<Q>(&self, key: &Q, cost: u64) -> Decision
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        self.check_known_first(key, || self.clock.now(), cost)
    }

    /// How many requests of `key` would be admitted now, by the limiter's
    /// clock.
    #[inline]
    pub fn remaining<Q>(&self, key: &Q) -> u64
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        self.remaining_at(key, self.clock.now())
    }

    /// How many clients have state.
    pub fn tracked_clients(&self) -> usize {
        self.clients.len()
    }

    /// How many entries the map holds, as the slots its inserts claimed and
    /// its removals emptied count them, rather than the places reserved
    /// under the cap that [`tracked_clients`](Self::tracked_clients)
    /// counts. It exists for the tests' cap watchers: the reservations
    /// cannot pass the cap by construction, so only a count of what the map
    /// did can show a bug that lets it. Never above `tracked_clients()`
    /// (each insert's slot is counted after its reservation, each removal
    /// before its place is given back), and equal to the map's length when
    /// no call is in flight. Without a cap nothing is reserved, and the two
    /// are the same count.
    #[doc(hidden)]
    pub fn stored_clients(&self) -> usize {
        self.clients.stored()
    }
}

/// Where a call at `now` is judged for a client whose times count from
/// `origin`: the ticks since it, and `lag`, how many ticks before it the
/// call came (judged at the origin then, `Limiter::decide`).
#[inline(always)]
pub(crate) fn since_origin(origin: u64, now: u64) -> (u64, u64) {
    match now.checked_sub(origin) {
        Some(since) => (since, 0),
        None => (0, origin - now),
    }
}

/// What the limiter keeps per client: the policy's state, with what the
/// policy keeps of the client's origin (`u64`, or nothing for the drip
/// policies, whose states count from tick 0).
type Resident<P> = Client<<P as Policy>::State, <P as Policy>::Origin>;

/// What the store asks of the policy it holds states for.
impl<P: Policy> Lifecycle<Resident<P>> for P {
    fn new_client(&self, origin: u64) -> Resident<P> {
        Client {
            origin: P::Origin::keep(origin),
            state: Policy::begin(self, origin),
        }
    }

    /// Never retires a client created after `now` (a sweep's `now` is a
    /// time every client it removes has reached). A client that keeps no
    /// origin began with its origin in its state, which is not idle before
    /// it.
    fn retire_idle(&self, client: &Resident<P>, now: u64) -> bool {
        now.checked_sub(client.origin.tick())
            .is_some_and(|since| self.retire_if_idle(&client.state, since))
    }

    fn relocate(&self, client: &Resident<P>) -> Option<Resident<P>> {
        Policy::relocate(self, &client.state).map(|state| Client {
            origin: client.origin,
            state,
        })
    }
}

impl<K, P, C> fmt::Debug for Limiter<K, P, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    P: Policy + fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("policy", &self.policy)
            .field("bounds", &self.clients.bounds())
            .field("tracked_clients", &self.clients.len())
            .finish_non_exhaustive()
    }
}

impl<K, Q, P, C> RateLimiter<Q> for Limiter<K, P, C>
where
    K: Borrow<Q> + Hash + Eq + Clone + Send + Sync + 'static,
    Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    P: Policy,
    C: Clock,
{
    #[inline]
    fn check_at(&self, key: &Q, now: u64) -> Decision {
        Limiter::check_at(self, key, now)
    }

    #[inline]
    fn check_n_at(&self, key: &Q, now: u64, cost: u64) -> Decision {
        Limiter::check_n_at(self, key, now, cost)
    }

    /// The inherent `check`, which reads the clock after the look-up.
    #[inline]
    fn check(&self, key: &Q) -> Decision {
        Limiter::check(self, key)
    }

    #[inline]
    fn check_n(&self, key: &Q, cost: u64) -> Decision {
        Limiter::check_n(self, key, cost)
    }

    #[inline]
    fn remaining_at(&self, key: &Q, now: u64) -> u64 {
        Limiter::remaining_at(self, key, now)
    }

    #[inline]
    fn now(&self) -> u64 {
        self.clock.now()
    }

    fn policy(&self) -> PolicyKind {
        self.policy.kind()
    }

    fn config(&self) -> Config {
        self.policy.config()
    }

    fn rules(&self) -> RuleSet {
        self.policy.rule_set()
    }

    fn check_ruled_n_at(&self, key: &Q, now: u64, cost: u64) -> RuledDecision<'_> {
        let decision = Limiter::check_n_at(self, key, now, cost);
        RuledDecision {
            decision,
            tier: None,
            policy: self.policy.kind(),
            config: self.policy.config(),
            refused_unknown_tier: false,
            each: self.each_at(key, now, cost, &decision),
        }
    }

    fn check_ruled_at(&self, key: &Q, now: u64) -> RuledDecision<'_> {
        self.check_ruled_n_at(key, now, 1)
    }

    fn tracked_clients(&self) -> usize {
        self.clients.len()
    }

    fn stats(&self) -> Option<crate::Stats> {
        Some(Limiter::stats(self))
    }

    fn take_offenders(&self) -> Option<crate::offenders::Report<K>> {
        Some(self.watch.as_ref()?.offenders.as_ref()?.take())
    }

    #[inline]
    fn refund_at(&self, key: &Q, now: u64, at: u64, cost: u64) -> u64 {
        Limiter::refund_at(self, key, now, at, cost)
    }

    fn release_at(&self, key: &Q, now: u64, cost: u64) -> u64 {
        Limiter::release_at(self, key, now, cost)
    }

    fn peek_at(&self, key: &Q, now: u64) -> Option<u64> {
        Limiter::peek_at(self, key, now)
    }

    fn peek_each_at(&self, key: &Q, now: u64) -> Option<RuleAnswers> {
        Limiter::peek_each_at(self, key, now)
    }

    fn forget(&self, key: &Q) -> bool {
        Limiter::forget(self, key)
    }

    fn sweep_at(&self, now: u64) -> usize {
        Limiter::sweep_at(self, now)
    }

    fn saved_by(&self) -> Option<(&'static str, Tick)> {
        Some((crate::Engine::LockFree.name(), self.tick))
    }

    fn save_clients(&self, visit: &mut dyn FnMut(&str, &Q, &[u64])) {
        Limiter::save_clients(self, |key, words| visit("", key.borrow(), words));
    }

    fn load_clients(
        &self,
        groups: Vec<crate::state::Group<'_, K>>,
    ) -> Result<usize, crate::state::ClientsRefused> {
        Limiter::load_clients(self, crate::state::Group::only(groups)?)
    }

    fn load_spent(
        &self,
        clients: Vec<(K, Vec<u64>)>,
    ) -> Result<usize, crate::state::ClientsRefused> {
        Limiter::load_spent(self, clients)
    }
}
