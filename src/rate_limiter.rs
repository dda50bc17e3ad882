//! The strategy trait every limiter implements, so a call site never knows
//! which policy or engine it holds.

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;

use crate::admission::Admission;
use crate::decision::NEVER;
use crate::{Config, Decision, PolicyKind, Rule, RuleAnswers, RuleSet, Tick};

/// Every method of [`RateLimiter`], forwarded to the pointee (`**self`), so
/// a pointer keeps its limiter's own overrides.
macro_rules! forward_rate_limiter {
    () => {
        #[inline]
        fn check_at(&self, key: &Q, now: u64) -> Decision {
            (**self).check_at(key, now)
        }
        #[inline]
        fn remaining_at(&self, key: &Q, now: u64) -> u64 {
            (**self).remaining_at(key, now)
        }
        fn peek_at(&self, key: &Q, now: u64) -> Option<u64> {
            (**self).peek_at(key, now)
        }
        fn peek_each_at(&self, key: &Q, now: u64) -> Option<RuleAnswers> {
            (**self).peek_each_at(key, now)
        }
        fn peek_each(&self, key: &Q) -> Option<RuleAnswers> {
            (**self).peek_each(key)
        }
        fn forget(&self, key: &Q) -> bool {
            (**self).forget(key)
        }
        #[inline]
        fn now(&self) -> u64 {
            (**self).now()
        }
        fn policy(&self) -> PolicyKind {
            (**self).policy()
        }
        fn config(&self) -> Config {
            (**self).config()
        }
        fn rules(&self) -> RuleSet {
            (**self).rules()
        }
        fn stats(&self) -> Option<crate::Stats> {
            (**self).stats()
        }

        fn take_offenders(&self) -> Option<crate::offenders::Report<Q::Owned>>
        where
            Q: ToOwned,
        {
            (**self).take_offenders()
        }
        fn saved_by(&self) -> Option<(&'static str, Tick)> {
            (**self).saved_by()
        }
        fn saved_groups(&self) -> Vec<(String, RuleSet)> {
            (**self).saved_groups()
        }
        fn save_clients(&self, visit: &mut dyn FnMut(&str, &Q, &[u64])) {
            (**self).save_clients(visit)
        }
        fn load_clients(
            &self,
            groups: Vec<crate::state::Group<'_, Q::Owned>>,
        ) -> Result<usize, crate::state::ClientsRefused>
        where
            Q: ToOwned,
        {
            (**self).load_clients(groups)
        }
        fn load_spent(
            &self,
            clients: Vec<(Q::Owned, Vec<u64>)>,
        ) -> Result<usize, crate::state::ClientsRefused>
        where
            Q: ToOwned,
        {
            (**self).load_spent(clients)
        }

        fn tracked_clients(&self) -> usize {
            (**self).tracked_clients()
        }
        fn sweep_at(&self, now: u64) -> usize {
            (**self).sweep_at(now)
        }
        fn sweep(&self) -> usize {
            (**self).sweep()
        }
        #[inline]
        fn check(&self, key: &Q) -> Decision {
            (**self).check(key)
        }
        fn remaining(&self, key: &Q) -> u64 {
            (**self).remaining(key)
        }
        fn peek(&self, key: &Q) -> Option<u64> {
            (**self).peek(key)
        }
        fn allow(&self, key: &Q) -> bool {
            (**self).allow(key)
        }
        fn check_ruled_at(&self, key: &Q, now: u64) -> RuledDecision<'_> {
            (**self).check_ruled_at(key, now)
        }
        fn check_ruled_n_at(&self, key: &Q, now: u64, cost: u64) -> RuledDecision<'_> {
            (**self).check_ruled_n_at(key, now, cost)
        }
        fn check_ruled_in_n_at(
            &self,
            tier: &str,
            key: &Q,
            now: u64,
            cost: u64,
        ) -> RuledDecision<'_> {
            (**self).check_ruled_in_n_at(tier, key, now, cost)
        }
        fn refund_at(&self, key: &Q, now: u64, at: u64, cost: u64) -> u64 {
            (**self).refund_at(key, now, at, cost)
        }
        fn admit_n(&self, key: &Q, cost: u64) -> Result<Admission<Q::Owned>, Decision>
        where
            Q: ToOwned,
        {
            (**self).admit_n(key, cost)
        }
        fn admit(&self, key: &Q) -> Result<Admission<Q::Owned>, Decision>
        where
            Q: ToOwned,
        {
            (**self).admit(key)
        }
        fn admit_in_n(
            &self,
            tier: &str,
            key: &Q,
            cost: u64,
        ) -> Result<Admission<Q::Owned>, Decision>
        where
            Q: ToOwned,
        {
            (**self).admit_in_n(tier, key, cost)
        }
        fn refund(&self, admission: Admission<Q::Owned>, units: u64) -> u64
        where
            Q: ToOwned,
        {
            (**self).refund(admission, units)
        }
        fn refund_admitted(&self, key: &Q, admitted: &Decision, cost: u64) -> u64 {
            (**self).refund_admitted(key, admitted, cost)
        }
        fn refund_in_at(&self, tier: &str, key: &Q, now: u64, at: u64, cost: u64) -> u64 {
            (**self).refund_in_at(tier, key, now, at, cost)
        }
        fn release_at(&self, key: &Q, now: u64, cost: u64) -> u64 {
            (**self).release_at(key, now, cost)
        }
        fn release(&self, key: &Q, cost: u64) -> u64 {
            (**self).release(key, cost)
        }
        fn release_in_at(&self, tier: &str, key: &Q, now: u64, cost: u64) -> u64 {
            (**self).release_in_at(tier, key, now, cost)
        }
        #[inline]
        fn check_n_at(&self, key: &Q, now: u64, cost: u64) -> Decision {
            (**self).check_n_at(key, now, cost)
        }
        fn try_check_n_at(
            &self,
            key: &Q,
            now: u64,
            cost: u64,
        ) -> Result<Decision, InsufficientCapacity> {
            (**self).try_check_n_at(key, now, cost)
        }
        fn check_n(&self, key: &Q, cost: u64) -> Decision {
            (**self).check_n(key, cost)
        }
        fn try_check_n(&self, key: &Q, cost: u64) -> Result<Decision, InsufficientCapacity> {
            (**self).try_check_n(key, cost)
        }
    };
}

/// A per-client rate limiter: one decision per request.
///
/// `Q` is the type a client is looked up by: `str` for a `String`-keyed
/// limiter, `u64` for a `u64`-keyed one. Every implementation in this crate
/// is `Send + Sync` and meant to be shared by reference (or in an `Arc`)
/// across threads.
///
/// The `*_at` forms take the time explicitly (exact and repeatable); the
/// others read the limiter's own clock.
///
/// ```
/// use floodgate::{build, Config, PolicyKind, RateLimiter};
///
/// let limiter = build::<str>(PolicyKind::TokenBucket, Config::per_ticks(2, 1_000)?)?;
/// assert!(limiter.check_at("app", 0).allowed());
/// assert!(limiter.check_at("app", 10).allowed());
/// let third = limiter.check_at("app", 20);
/// assert!(!third.allowed());
/// assert_eq!(third.retry_after_ticks(), Some(480)); // the first drip is at 500
/// # Ok::<(), floodgate::ConfigError>(())
/// ```
pub trait RateLimiter<Q: ?Sized>: Send + Sync {
    /// Decides one request of client `key` at time `now` (in ticks).
    ///
    /// The first call for a client, this or [`remaining_at`](Self::remaining_at),
    /// creates its state with `now` as its origin.
    fn check_at(&self, key: &Q, now: u64) -> Decision;

    /// Decides one request of cost `cost` (bytes, tokens, rows: units of the
    /// limit) of client `key` at `now`, all or nothing: admitted iff `cost`
    /// single requests arriving one after another at `now` would all be,
    /// and then it leaves the state those `cost` would. On the lock-free
    /// engine that is one atomic step on every policy, so racing threads
    /// never see part of it.
    ///
    /// A cost of 0 is admitted and changes nothing but creates the client,
    /// like [`remaining_at`](Self::remaining_at). A cost above the limit is
    /// never admitted: `allowed` false, `remaining` as `remaining_at`,
    /// `retry_after()` `None`, `delay` 0 (the contract's "Weighted
    /// requests"); [`try_check_n_at`](Self::try_check_n_at) answers it as
    /// an error instead.
    ///
    /// ```
    /// use floodgate::{build, Config, PolicyKind, RateLimiter};
    ///
    /// let limiter = build::<str>(PolicyKind::TokenBucket, Config::per_ticks(3, 3_000)?)?;
    /// assert!(!limiter.check_n_at("app", 0, 4).allowed()); // never: more than the bucket
    /// assert_eq!(limiter.check_n_at("app", 0, 2).remaining(), 1);
    /// let refused = limiter.check_n_at("app", 0, 2); // all or nothing
    /// assert_eq!((refused.allowed(), refused.remaining()), (false, 1));
    /// assert_eq!(refused.retry_after_ticks(), Some(1_000)); // the next drip
    /// # Ok::<(), floodgate::ConfigError>(())
    /// ```
    fn check_n_at(&self, key: &Q, now: u64, cost: u64) -> Decision;

    /// [`check_n_at`](Self::check_n_at), with a cost above the limit
    /// answered as an error (as `governor`'s `check_key_n` does) rather than
    /// as a decision; such a call still creates the client.
    ///
    /// # Errors
    ///
    /// [`InsufficientCapacity`] if `cost` exceeds the limit that applies to
    /// `key`: no wait would ever admit it.
    fn try_check_n_at(
        &self,
        key: &Q,
        now: u64,
        cost: u64,
    ) -> Result<Decision, InsufficientCapacity> {
        let decision = self.check_n_at(key, now, cost);
        let limit = self.config().limit();
        if cost > limit {
            return Err(InsufficientCapacity { cost, limit });
        }
        Ok(decision)
    }

    /// Gives back up to `cost` units of `key`'s admission made at `at` (its
    /// decision's [`at_ticks`](Decision::at_ticks)), judged at `now`, and
    /// answers the units given back: the contract's "Giving units back".
    /// Each rule gives back what its policy can (a token bucket up to full,
    /// a fixed window only to the window that holds `now`, nothing for an
    /// admission a window or more ago), and the answer is the smallest of
    /// the rules'. A client with no state gets 0 and is not created, so a
    /// flood of refunds for invented keys takes no memory. An `at` later
    /// than `now` names no admission (the contract has `at ≤ now`): 0,
    /// nothing changed.
    ///
    /// **This call trusts its caller.** The limiter cannot tell one
    /// admission's units from another's in the same window: a refund of
    /// more than the admission took, or of the same admission twice, takes
    /// other admissions' units. It is for callers that refund across
    /// processes or keep their own record (`floodgate replay`); in one
    /// process, take an [`Admission`] ([`admit_n`](Self::admit_n)) and give
    /// it to [`refund`](Self::refund), which gives back at most its cost,
    /// once.
    ///
    /// The default gives nothing back: a limiter of your own that keeps no
    /// state to give back to.
    ///
    /// ```
    /// use floodgate::{build_with, Config, Engine, ManualClock, PolicyKind, RateLimiter};
    ///
    /// let clock = ManualClock::new(0);
    /// let quota = build_with::<str, _>(
    ///     PolicyKind::FixedWindow,
    ///     Config::per_ticks(10, 1_000)?,
    ///     Engine::LockFree,
    ///     clock.clone(),
    /// )?;
    /// let upload = quota.check_n("app", 8);
    /// clock.advance(5); // the upstream failed: the 8 do not count
    /// assert_eq!(quota.refund_at("app", 5, upload.at_ticks(), 8), 8);
    /// assert_eq!(quota.remaining("app"), 10);
    /// assert_eq!(quota.refund_at("someone", 5, 0, 3), 0); // no state, none made
    /// assert_eq!(quota.refund_at("app", 5, 6, 1), 0); // no admission after `now`
    /// # Ok::<(), floodgate::ConfigError>(())
    /// ```
    fn refund_at(&self, key: &Q, now: u64, at: u64, cost: u64) -> u64 {
        let _ = (key, now, at, cost);
        0
    }

    /// Decides one request of cost `cost` of `key` now, as
    /// [`check_n`](Self::check_n), and answers an admission as an
    /// [`Admission`]: the handle that gives its units back once, and never
    /// more than `cost` ([`refund`](Self::refund)).
    ///
    /// # Errors
    ///
    /// The refusal, when the limiter does not admit `cost` now.
    fn admit_n(&self, key: &Q, cost: u64) -> Result<Admission<Q::Owned>, Decision>
    where
        Q: ToOwned,
    {
        let decision = self.check_n(key, cost);
        if !decision.allowed {
            return Err(decision);
        }
        Ok(Admission::new(key.to_owned(), None, decision, cost))
    }

    /// [`admit_n`](Self::admit_n) of one unit.
    ///
    /// # Errors
    ///
    /// The refusal, when the limiter does not admit the request now.
    fn admit(&self, key: &Q) -> Result<Admission<Q::Owned>, Decision>
    where
        Q: ToOwned,
    {
        self.admit_n(key, 1)
    }

    /// [`admit_n`](Self::admit_n) in the tier named `tier`, known from the
    /// request ([`check_ruled_in_n_at`](Self::check_ruled_in_n_at)): its
    /// refund goes back to that tier.
    ///
    /// # Errors
    ///
    /// The refusal, when the limiter does not admit `cost` now in that tier
    /// (a limiter without tiers refuses every named tier).
    fn admit_in_n(&self, tier: &str, key: &Q, cost: u64) -> Result<Admission<Q::Owned>, Decision>
    where
        Q: ToOwned,
    {
        let decision = self
            .check_ruled_in_n_at(tier, key, self.now(), cost)
            .decision;
        if !decision.allowed {
            return Err(decision);
        }
        Ok(Admission::new(key.to_owned(), Some(tier), decision, cost))
    }

    /// Gives back up to `units` of the admission `admission`, now by the
    /// limiter's clock, and answers the units given back: a request that
    /// failed upstream, or used less than it was admitted for. At most the
    /// admission's cost comes back, and once: the refund takes the
    /// admission. What comes back per policy is
    /// [`refund_at`](Self::refund_at)'s at the admission's time, in the
    /// tier that admitted it.
    ///
    /// ```
    /// use floodgate::{build_with, Config, Engine, ManualClock, PolicyKind, RateLimiter};
    ///
    /// let clock = ManualClock::new(0);
    /// let quota = build_with::<str, _>(
    ///     PolicyKind::Gcra,
    ///     Config::per_ticks(3, 3_000)?,
    ///     Engine::LockFree,
    ///     clock.clone(),
    /// )?;
    /// let failed = quota.admit("app").expect("3 left");
    /// let _next = quota.admit("app").expect("2 left");
    /// assert_eq!(quota.refund(failed, 5), 1); // one unit, not five
    /// assert_eq!(quota.remaining("app"), 2); // the next one's unit stays spent
    /// # Ok::<(), floodgate::ConfigError>(())
    /// ```
    fn refund(&self, admission: Admission<Q::Owned>, units: u64) -> u64
    where
        Q: ToOwned,
    {
        let (key, tier, decision, units) = admission.into_refund(units);
        if units == 0 {
            return 0;
        }
        match tier {
            Some(tier) => {
                // Never before the admission: a refund by another thread's
                // clock reading (a TSC behind by a few ticks) is judged at
                // the admission.
                let now = self.now().max(decision.at);
                self.refund_in_at(&tier, key.borrow(), now, decision.at, units)
            }
            None => self.refund_admitted(key.borrow(), &decision, units),
        }
    }

    /// Gives back up to `cost` units of the admission `admitted` of `key`
    /// now, by the clock that judged it: what [`refund`](Self::refund) and
    /// the HTTP layer call, each holding the admission once and asking at
    /// most its cost. It trusts its caller as
    /// [`refund_at`](Self::refund_at) does; a limiter whose decisions carry
    /// another clock's time (Redis's) overrides it.
    #[doc(hidden)]
    fn refund_admitted(&self, key: &Q, admitted: &Decision, cost: u64) -> u64 {
        if !admitted.allowed {
            return 0;
        }
        // Never before the admission: a refund by another thread's clock
        // reading (a TSC behind by a few ticks) is judged at the admission.
        self.refund_at(key, self.now().max(admitted.at), admitted.at, cost)
    }

    /// Gives back up to `cost` of the units `key` holds under its
    /// `in-flight` rules (the contract's "Requests in flight": each gives
    /// back `min(cost, held)`, the answer is the smallest), at `now`, and
    /// answers how many. 0 for a client with no state (none is made) or
    /// without an `in-flight` rule. A refund never gives these back: a
    /// request that failed is refunded and released, each once.
    ///
    /// ```
    /// use floodgate::{build_rules, Bounds, Engine, ManualClock, RateLimiter};
    ///
    /// let streams = build_rules::<str, _>(
    ///     &"in-flight:2".parse()?,
    ///     Engine::LockFree,
    ///     ManualClock::new(0),
    ///     Bounds::new(),
    /// )?;
    /// assert!(streams.check_n_at("alice", 0, 2).allowed());
    /// let third = streams.check_at("alice", 1_000_000);
    /// assert!(!third.allowed()); // only a release admits it
    /// assert_eq!(third.retry_after(), None);
    /// assert_eq!(streams.release_at("alice", 5, 1), 1);
    /// assert!(streams.check_at("alice", 5).allowed());
    /// assert_eq!(streams.release_at("nobody", 5, 1), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn release_at(&self, key: &Q, now: u64, cost: u64) -> u64 {
        let _ = (key, now, cost);
        0
    }

    /// [`release_at`](Self::release_at) now by the limiter's clock.
    fn release(&self, key: &Q, cost: u64) -> u64 {
        self.release_at(key, self.now(), cost)
    }

    /// How many requests of `key` would be admitted if they arrived one after
    /// another at `now`. Changes nothing, except that it creates the client
    /// (and so takes a place under a cap): the contract's `remaining`. A
    /// status endpoint that polls ids it has not seen should use
    /// [`peek_at`](Self::peek_at).
    fn remaining_at(&self, key: &Q, now: u64) -> u64;

    /// What [`remaining_at`](Self::remaining_at) would answer for a client
    /// that has state; `None` for one that has none, whose first call would
    /// find the whole limit. Creates nothing and takes no place under a cap.
    fn peek_at(&self, key: &Q, now: u64) -> Option<u64>;

    /// Each rule's own answer for one more unit of `key` at `now`, in the
    /// order of [`rules`](Self::rules) (one answer for one rule), nothing
    /// spent: its `remaining`, and for a rule with none left, when its next
    /// unit comes (`retry_after`; `None` for an `in-flight` rule, which a
    /// release frees). "How much of today's quota is left", asked without
    /// a check that would spend it. `None` for a client with no state
    /// (whose first call finds every rule's whole limit); creates nothing.
    ///
    /// The default, for a limiter of your own, answers its
    /// [`policy`](Self::policy) and [`config`](Self::config) alone from
    /// [`peek_at`](Self::peek_at), with no wait known.
    ///
    /// ```
    /// use floodgate::{build_rules, Bounds, Engine, ManualClock, RateLimiter};
    ///
    /// let api = build_rules::<str, _>(
    ///     &"gcra:10/1s,fixed-window:1000/1d".parse()?,
    ///     Engine::LockFree,
    ///     ManualClock::new(0),
    ///     Bounds::new(),
    /// )?;
    /// assert!(api.peek_each("alice").is_none()); // never seen: nothing made
    /// for _ in 0..10 {
    ///     assert!(api.check("alice").allowed());
    /// }
    /// let each = api.peek_each("alice").expect("alice has state");
    /// let [burst, day] = [0, 1].map(|i| each.iter().nth(i).unwrap().decision);
    /// assert_eq!((burst.remaining(), burst.retry_after_ticks()), (0, Some(100_000_000)));
    /// assert_eq!(day.remaining(), 990); // the day's quota, nothing spent to ask
    /// assert_eq!(api.peek_each("alice"), Some(each));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn peek_each_at(&self, key: &Q, now: u64) -> Option<RuleAnswers> {
        let remaining = self.peek_at(key, now)?;
        let decision = if remaining > 0 {
            Decision::admit(remaining)
        } else {
            Decision::reject(0, NEVER)
        };
        let mut answers = RuleAnswers::default();
        answers.push(crate::RuleAnswer {
            rule: Rule::from_parts(self.policy(), self.config()),
            decision: decision.made_at(now),
        });
        Some(answers)
    }

    /// [`peek_each_at`](Self::peek_each_at) now, by the limiter's clock.
    fn peek_each(&self, key: &Q) -> Option<RuleAnswers> {
        self.peek_each_at(key, self.now())
    }

    /// Forgets `key`'s state, as if it had never called: its next call
    /// creates it afresh with that call's time as its origin. Answers
    /// whether there was state to forget.
    ///
    /// This is how a client is unblocked after a bogus far-future `now`
    /// (a `gcra` schedule pushed years ahead) or reset by an operator. A
    /// check racing with it is decided on the old state (and then forgotten
    /// with it) or on the new one, never on both.
    fn forget(&self, key: &Q) -> bool;

    /// The limiter's clock, in ticks.
    fn now(&self) -> u64;

    /// The policy this limiter applies. For several rules, the one with
    /// the smallest limit ([`rules`](Self::rules) has them all).
    fn policy(&self) -> PolicyKind;

    /// The limit and window this limiter applies. For several rules, the
    /// rule with the smallest limit's ([`RuleSet::strictest`]), as
    /// [`policy`](Self::policy): no request costing more is admitted.
    fn config(&self) -> Config;

    /// The rules this limiter applies to every client, in order: one, or
    /// several (the contract's "Several limits on one client"). A
    /// decision's [`refused_by`](Decision::refused_by) indexes them.
    fn rules(&self) -> RuleSet {
        RuleSet::from(Rule::from_parts(self.policy(), self.config()))
    }

    /// How many clients have state right now.
    fn tracked_clients(&self) -> usize;

    /// Removes every client that is idle at `now` (see [`crate::bounds`]),
    /// and answers how many went. A sweep already running on another thread
    /// is not waited for: this one then removes nothing.
    ///
    /// Backends that forget idle clients on their own (a store with expiring
    /// keys) keep this default, which removes nothing.
    fn sweep_at(&self, now: u64) -> usize {
        let _ = now;
        0
    }

    /// [`sweep_at`](Self::sweep_at) now, by the limiter's clock.
    fn sweep(&self) -> usize {
        self.sweep_at(self.now())
    }

    /// What this limiter decided and did since it was built
    /// ([`Stats`](crate::Stats)), if it keeps count: the in-memory engines
    /// always count their store's work, and their decisions when built
    /// with [`Builder::counting`](crate::Builder::counting). `None` (the
    /// default) for a limiter that keeps no count.
    fn stats(&self) -> Option<crate::Stats> {
        None
    }

    /// The clients refused most since the last call (or since the limiter
    /// was built), and a new interval begun, if the limiter keeps them
    /// ([`Builder::offenders`](crate::Builder::offenders)). `None` (the
    /// default) for a limiter that does not.
    fn take_offenders(&self) -> Option<crate::offenders::Report<Q::Owned>>
    where
        Q: ToOwned,
    {
        None
    }

    /// Which store's records this limiter's saves hold ([`crate::state`]:
    /// `lockfree`, `mutex` or `tiers`) and its clock's tick, or `None` (the
    /// default) if it cannot be saved.
    #[doc(hidden)]
    fn saved_by(&self) -> Option<(&'static str, Tick)> {
        None
    }

    /// The groups a save keeps its clients in, by name, with their rules:
    /// one unnamed group of this limiter's rules (the default), or a
    /// registry's tiers.
    #[doc(hidden)]
    fn saved_groups(&self) -> Vec<(String, RuleSet)> {
        vec![(String::new(), self.rules())]
    }

    /// Visits every client with its group and the words a save keeps of
    /// it, each read in one atomic step ([`crate::state`]). Visits nothing
    /// (the default) for a limiter that cannot be saved.
    #[doc(hidden)]
    fn save_clients(&self, visit: &mut dyn FnMut(&str, &Q, &[u64])) {
        let _ = visit;
    }

    /// Puts saved clients (keys, and the words a save of the same store
    /// kept, by group) into this limiter, which holds no client yet: all of
    /// them, or as many as its cap holds; or none, if any client's words
    /// are not a state of its group's rules. Answers how many it holds.
    ///
    /// # Errors
    ///
    /// What [`ClientsRefused`](crate::state::ClientsRefused) says.
    #[doc(hidden)]
    fn load_clients(
        &self,
        groups: Vec<crate::state::Group<'_, Q::Owned>>,
    ) -> Result<usize, crate::state::ClientsRefused>
    where
        Q: ToOwned,
    {
        let _ = groups;
        Err(crate::state::ClientsRefused::Unsupported)
    }

    /// Puts clients into this limiter, which holds none yet, each with
    /// what each of its rules has spent now (one count a rule, in the set's
    /// order): a load under changed rules carried over (`crate::state`).
    /// Answers how many it holds.
    ///
    /// # Errors
    ///
    /// What [`ClientsRefused`](crate::state::ClientsRefused) says.
    #[doc(hidden)]
    fn load_spent(
        &self,
        clients: Vec<(Q::Owned, Vec<u64>)>,
    ) -> Result<usize, crate::state::ClientsRefused>
    where
        Q: ToOwned,
    {
        let _ = clients;
        Err(crate::state::ClientsRefused::Unsupported)
    }

    /// Decides one request of `key` now, by the limiter's clock.
    #[inline]
    fn check(&self, key: &Q) -> Decision {
        self.check_at(key, self.now())
    }

    /// [`check_n_at`](Self::check_n_at) now, by the limiter's clock.
    #[inline]
    fn check_n(&self, key: &Q, cost: u64) -> Decision {
        self.check_n_at(key, self.now(), cost)
    }

    /// [`try_check_n_at`](Self::try_check_n_at) now, by the limiter's clock.
    ///
    /// # Errors
    ///
    /// As [`try_check_n_at`](Self::try_check_n_at).
    #[inline]
    fn try_check_n(&self, key: &Q, cost: u64) -> Result<Decision, InsufficientCapacity> {
        self.try_check_n_at(key, self.now(), cost)
    }

    /// [`remaining_at`](Self::remaining_at) now, by the limiter's clock.
    #[inline]
    fn remaining(&self, key: &Q) -> u64 {
        self.remaining_at(key, self.now())
    }

    /// [`peek_at`](Self::peek_at) now, by the limiter's clock.
    #[inline]
    fn peek(&self, key: &Q) -> Option<u64> {
        self.peek_at(key, self.now())
    }

    /// Whether one request of `key` is admitted now.
    #[inline]
    fn allow(&self, key: &Q) -> bool {
        self.check(key).allowed
    }

    /// [`check_at`](Self::check_at), with the rule that decided: what a
    /// response's rate-limit headers describe. A limiter with one rule
    /// answers its own [`policy`](Self::policy) and [`config`](Self::config)
    /// and no tier; a registry of [`Tiers`](crate::tiers::Tiers) answers the
    /// client's tier and that tier's rule.
    fn check_ruled_at(&self, key: &Q, now: u64) -> RuledDecision<'_> {
        RuledDecision {
            decision: self.check_at(key, now),
            tier: None,
            policy: self.policy(),
            config: self.config(),
            refused_unknown_tier: false,
            each: RuleAnswers::default(),
        }
    }

    /// [`check_ruled_at`](Self::check_ruled_at) for a request of cost
    /// `cost` ([`check_n_at`](Self::check_n_at)).
    fn check_ruled_n_at(&self, key: &Q, now: u64, cost: u64) -> RuledDecision<'_> {
        RuledDecision {
            decision: self.check_n_at(key, now, cost),
            tier: None,
            policy: self.policy(),
            config: self.config(),
            refused_unknown_tier: false,
            each: RuleAnswers::default(),
        }
    }

    /// [`check_ruled_n_at`](Self::check_ruled_n_at) in the tier named
    /// `tier`, known from the request itself (a plan header a trusted
    /// gateway sets, an extension an authentication layer added) rather
    /// than from the key: what the HTTP layer's `tier_from` asks (feature
    /// `http`). A registry of [`Tiers`](crate::tiers::Tiers) answers a name it
    /// lacks as it answers its resolver's: counted, logged once per name,
    /// and answered by the default tier or refused
    /// ([`reject_unknown_tiers`](crate::tiers::Tiers::reject_unknown_tiers)).
    ///
    /// A limiter without tiers (this default) has no name to match: it
    /// refuses the call as a tier it lacks (`refused_unknown_tier`, never
    /// admitted), so a tier chosen for a limiter that cannot apply it is an
    /// error the layer answers `500`, not a silent fallback.
    fn check_ruled_in_n_at(&self, tier: &str, key: &Q, now: u64, cost: u64) -> RuledDecision<'_> {
        let _ = (tier, key, now, cost);
        RuledDecision {
            decision: Decision::reject(0, NEVER),
            tier: None,
            policy: self.policy(),
            config: self.config(),
            refused_unknown_tier: true,
            each: RuleAnswers::default(),
        }
    }

    /// [`refund_at`](Self::refund_at) in the tier named `tier`, for an
    /// admission made by
    /// [`check_ruled_in_n_at`](Self::check_ruled_in_n_at) in that tier: a
    /// registry of [`Tiers`](crate::tiers::Tiers) gives back where that
    /// check spent (the default tier for a name it lacks, nothing when it
    /// refuses such names). A limiter without tiers admitted nothing in a
    /// named tier, and gives nothing back (this default).
    fn refund_in_at(&self, tier: &str, key: &Q, now: u64, at: u64, cost: u64) -> u64 {
        let _ = (tier, key, now, at, cost);
        0
    }

    /// [`release_at`](Self::release_at) in the tier named `tier`, for an
    /// admission made by
    /// [`check_ruled_in_n_at`](Self::check_ruled_in_n_at) in that tier
    /// (where [`refund_in_at`](Self::refund_in_at) gives back). A limiter
    /// without tiers admitted nothing in a named tier, and releases
    /// nothing (this default).
    fn release_in_at(&self, tier: &str, key: &Q, now: u64, cost: u64) -> u64 {
        let _ = (tier, key, now, cost);
        0
    }
}

/// A decision with the rule that made it ([`RateLimiter::check_ruled_at`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuledDecision<'a> {
    /// The decision.
    pub decision: Decision,
    /// The tier whose rule decided, for a registry of tiers; `None` for a
    /// limiter with one rule.
    pub tier: Option<&'a str>,
    /// The policy that decided.
    pub policy: PolicyKind,
    /// Its limit and window, in ticks of the decision's
    /// [`tick`](Decision::tick) (and as a duration, when the rule was given
    /// as one: [`Config::span`]).
    pub config: Config,
    /// Whether a registry refused the call because its resolver named a
    /// tier the registry lacks ([`reject_unknown_tiers`]): the server's
    /// configuration at fault, not the client's rate.
    ///
    /// [`reject_unknown_tiers`]: crate::tiers::Tiers::reject_unknown_tiers
    pub refused_unknown_tier: bool,
    /// For a limiter with several rules, each rule's own answer, in the
    /// order of [`RateLimiter::rules`] (one `RateLimit` header item each);
    /// empty for one rule.
    pub each: RuleAnswers,
}

impl RuledDecision<'_> {
    /// Whether an admission by this decision holds units until they are
    /// released: one of the rules that decided is an `in-flight` rule
    /// (the contract's "Requests in flight").
    pub fn holds(&self) -> bool {
        if self.each.is_empty() {
            self.policy == PolicyKind::InFlight
        } else {
            self.each
                .iter()
                .any(|answer| answer.rule.policy() == PolicyKind::InFlight)
        }
    }

    /// The `in-flight` rule that refused the request, when one did: the
    /// client has as many units in flight as the rule allows (or asked for
    /// more than it ever allows). Only a release admits it, never a wait.
    pub fn refused_in_flight(&self) -> Option<crate::Rule> {
        let by = self.decision.refused_by()?;
        let rule = if self.each.is_empty() {
            crate::Rule::from_parts(self.policy, self.config)
        } else {
            self.each.iter().nth(by)?.rule
        };
        (rule.policy() == PolicyKind::InFlight).then_some(rule)
    }
}

/// A boxed limiter (what [`Builder::build`](crate::Builder::build) gives)
/// is a limiter, so it can be handed on wherever one is taken.
impl<Q: ?Sized, L: RateLimiter<Q> + ?Sized> RateLimiter<Q> for Box<L> {
    forward_rate_limiter!();
}

/// A shared limiter is a limiter: keep one `Arc` and hand clones of it to
/// every place that checks (a tower layer, a reloading task).
impl<Q: ?Sized, L: RateLimiter<Q> + ?Sized> RateLimiter<Q> for std::sync::Arc<L> {
    forward_rate_limiter!();
}

/// A request whose cost exceeds the limit: no wait would ever admit it.
/// The answer of [`RateLimiter::try_check_n_at`] (`governor`'s
/// `InsufficientCapacity`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InsufficientCapacity {
    /// The cost asked for.
    pub cost: u64,
    /// The limit that applies to the client.
    pub limit: u64,
}

impl fmt::Display for InsufficientCapacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a cost of {} can never be admitted under a limit of {}",
            self.cost, self.limit
        )
    }
}

impl std::error::Error for InsufficientCapacity {}
