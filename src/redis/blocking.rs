//! The blocking Redis limiter and its small pool of reconnecting
//! connections.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use ::redis::cluster::ClusterConnection;
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use ::redis::{Connection, ConnectionLike, FromRedisValue, RedisResult};

use super::script::{self, Op, Reply};
use super::{
    cluster_primaries, prefix_pattern, Core, RedisConfigError, RedisError, RedisOptions,
    RedisStats, Target, TimeSource,
};
use crate::{Admission, Config, Decision, PolicyKind, RateLimiter, RuleSet, RuledDecision};

/// A per-client limiter whose state lives in Redis, for threads that block:
/// one script call per decision over a pool of connections.
///
/// It is a [`RateLimiter<str>`]: its trait methods never fail, and answer
/// by the configured [`OnFailure`](super::OnFailure) rule when Redis does.
/// The inherent `try_*` methods return the error instead.
///
/// # Connections
///
/// The limiter keeps up to [`RedisOptions::connections`] connections, each
/// behind its own lock; a call takes a free one (or waits for one) for the
/// duration of its round trip. Connections are made on first use: building
/// the limiter does not need Redis to be up. A connection that fails or
/// times out is dropped, and the next call on its slot connects again, so
/// the limiter outlives a restart of Redis without being rebuilt.
///
/// # Examples
///
/// ```no_run
/// use floodgate::redis::{OnFailure, RedisLimiter, RedisOptions, TimeSource};
/// use floodgate::{Config, PolicyKind, RateLimiter};
/// use std::time::Duration;
///
/// let limiter = RedisLimiter::new(
///     "redis://127.0.0.1:6379",
///     PolicyKind::SlidingWindow,
///     Config::per_ticks(3, 1_000)?,
///     RedisOptions::new()
///         .time(TimeSource::MILLIS)
///         .timeout(Duration::from_millis(50))
///         .on_failure(OnFailure::Local),
/// )?;
/// assert!(limiter.check_at("rahul", 0).allowed());
/// // The same call, with the error instead of the fault rule:
/// match limiter.try_check_at("rahul", 100) {
///     Ok(decision) => assert!(decision.allowed()),
///     Err(error) => eprintln!("Redis failed: {error}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct RedisLimiter {
    core: Arc<Core>,
    pool: Arc<Pool>,
}

impl RedisLimiter {
    /// A limiter applying `policy` with `config` to the Redis at `url`
    /// (`redis://[user:password@]host:port[/db]`), or to the Redis Cluster
    /// whose nodes it names (`redis-cluster://host:port[,host:port…]`; see
    /// the module's "Redis Cluster"). Connects on first use.
    ///
    /// # Errors
    ///
    /// [`RedisConfigError`] when the policy refuses the configuration, the
    /// scripts could not compute it exactly, an option is invalid or the
    /// URL is not a Redis URL.
    pub fn new(
        url: &str,
        policy: PolicyKind,
        config: Config,
        options: RedisOptions,
    ) -> Result<Self, RedisConfigError> {
        Self::open(
            url,
            Core::with_rules(&[(policy, config)], &options)?,
            &options,
        )
    }

    /// A limiter applying every rule of `rules` to each client at once (the
    /// contract's "Several limits on one client"): a request is admitted
    /// only if every rule admits it, and then counts in each; one refused
    /// counts in none. Each decision is still one script call, which runs
    /// every rule's step on the client's key for that rule and writes only
    /// if all admit. A client's keys share its hash tag, so they live in
    /// one cluster slot.
    ///
    /// ```no_run
    /// use floodgate::redis::{RedisLimiter, RedisOptions};
    /// use floodgate::{RateLimiter, RuleSet};
    ///
    /// // A burst of 10 a second, and 10,000 a day.
    /// let rules: RuleSet = "gcra:10/1s,fixed-window:10000/1d".parse()?;
    /// let limiter = RedisLimiter::with_rules("redis://127.0.0.1:6379", &rules, RedisOptions::new())?;
    /// let decision = limiter.check("client-42");
    /// if let Some(rule) = decision.refused_by() {
    ///     eprintln!("refused by {}", limiter.rules()[rule]);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new), for any of the rules.
    pub fn with_rules(
        url: &str,
        rules: &RuleSet,
        options: RedisOptions,
    ) -> Result<Self, RedisConfigError> {
        Self::open(url, Core::with_rule_set(rules, &options)?, &options)
    }

    /// The limiter of `core` on the Redis at `url`.
    fn open(url: &str, core: Core, options: &RedisOptions) -> Result<Self, RedisConfigError> {
        let target = Target::open(url, core.timeout)?;
        let limiter = Self {
            pool: Arc::new(Pool::new(target, options.connections, core.timeout)),
            core: Arc::new(core),
        };
        if let Some(every) = limiter.core.renew_every {
            renew_leases(
                Arc::downgrade(&limiter.core),
                Arc::downgrade(&limiter.pool),
                every,
            );
        }
        Ok(limiter)
    }

    /// Releases up to `cost` units `key` holds under its `in-flight` rules
    /// at `now` ([`RateLimiter::release_at`]): this process's own holders
    /// first (newest first), or, when it holds none of `key`, the holders
    /// whose leases end first. One script call.
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at); on a timeout the units may
    /// have been released (this process then renews them no more, and they
    /// come back within one lease).
    pub fn try_release_at(&self, key: &str, now: u64, cost: u64) -> Result<u64, RedisError> {
        self.let_go(key, Some(now), cost)
    }

    /// [`try_release_at`](Self::try_release_at) now.
    ///
    /// # Errors
    ///
    /// As [`try_release_at`](Self::try_release_at).
    pub fn try_release(&self, key: &str, cost: u64) -> Result<u64, RedisError> {
        self.let_go(key, self.core.implicit_now(), cost)
    }

    /// Renews the leases of every holder this process holds, at `now`, as
    /// its lease thread does every third of a lease: how many are still
    /// held (a holder whose lease ended is not brought back). For a
    /// caller that keeps the time itself ([`TimeSource::Caller`]).
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at).
    pub fn try_renew_at(&self, now: u64) -> Result<u64, RedisError> {
        let now = script::encode_now(Some(now))?;
        let mut kept = 0;
        for invocation in self.core.renewals(&now) {
            kept += self
                .pool
                .with(|connection| invocation.invoke::<u64>(connection))?;
        }
        Ok(kept)
    }

    fn let_go(&self, key: &str, now: Option<u64>, cost: u64) -> Result<u64, RedisError> {
        if cost == 0 {
            return Ok(0);
        }
        let Some((plan, local)) = self.core.plan_release(key, now, cost) else {
            return Ok(0);
        };
        let result = script::encode_now(now).and_then(|encoded| {
            let Some(invocation) = self.core.release_call(key, &encoded, cost, &plan) else {
                return Ok(0);
            };
            let start = std::time::Instant::now();
            let result = self
                .pool
                .with(|connection| invocation.invoke::<u64>(connection));
            self.core.round_trips.done(start, &result);
            result
        });
        self.core.released(key, plan, local, result)
    }

    /// Decides one request of `key` at `now` (ticks of the time source).
    ///
    /// # Errors
    ///
    /// [`RedisError`] when Redis is unreachable, fails or is too slow, or
    /// `now` is past [`MAX_NOW`](super::MAX_NOW). On
    /// [`RedisError::Timeout`] and [`RedisError::Unavailable`] the request
    /// may have been counted.
    pub fn try_check_at(&self, key: &str, now: u64) -> Result<Decision, RedisError> {
        self.decide(key, 1, Some(now))
    }

    /// Decides one request of cost `cost` of `key` at `now`, all or nothing
    /// ([`RateLimiter::check_n_at`]): one script call, with the cost as an
    /// argument.
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at).
    pub fn try_check_n_at(&self, key: &str, now: u64, cost: u64) -> Result<Decision, RedisError> {
        self.decide(key, cost, Some(now))
    }

    /// Decides one request of cost `cost` of `key` now (the clock as
    /// [`try_check`](Self::try_check)).
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at).
    pub fn try_check_n(&self, key: &str, cost: u64) -> Result<Decision, RedisError> {
        self.decide(key, cost, self.core.implicit_now())
    }

    /// Decides one request of `key` now: by Redis's clock with
    /// [`TimeSource::Server`], by the local Unix time in ticks otherwise.
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at).
    pub fn try_check(&self, key: &str) -> Result<Decision, RedisError> {
        self.decide(key, 1, self.core.implicit_now())
    }

    /// How many requests of `key` would be admitted one after another at
    /// `now`.
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at).
    pub fn try_remaining_at(&self, key: &str, now: u64) -> Result<u64, RedisError> {
        let remaining = self
            .core
            .decision(self.call(key, Op::Remaining, Some(now))?)?
            .remaining;
        Ok(self.core.with_held(key, Some(now), remaining))
    }

    /// How many requests of `key` would be admitted now.
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at).
    pub fn try_remaining(&self, key: &str) -> Result<u64, RedisError> {
        Ok(self
            .core
            .decision(self.call(key, Op::Remaining, self.core.implicit_now())?)?
            .remaining)
    }

    /// [`RateLimiter::peek_at`]: `key`'s `remaining` at `now` if it has
    /// state in Redis, `None` if it has none. One script call, which looks
    /// the key up and answers from it atomically, and writes nothing (not
    /// even with [`RedisOptions::min_ttl`], with which `remaining` stores a
    /// new client).
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at).
    pub fn try_peek_at(&self, key: &str, now: u64) -> Result<Option<u64>, RedisError> {
        self.call::<Option<Reply>>(key, Op::Peek, Some(now))?
            .map(|reply| Ok(self.core.decision(reply)?.remaining))
            .transpose()
    }

    /// [`RateLimiter::peek_each_at`]: each rule's own answer for one unit
    /// of `key` at `now`, nothing spent, if it has state in Redis; `None`
    /// if it has none. One script call for one rule (the peek's own
    /// answer), two for several (the peek, then each rule's answer to a
    /// refused request, which writes nothing).
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at).
    pub fn try_peek_each_at(
        &self,
        key: &str,
        now: u64,
    ) -> Result<Option<crate::RuleAnswers>, RedisError> {
        let Some(reply) = self.call::<Option<Reply>>(key, Op::Peek, Some(now))? else {
            return Ok(None);
        };
        if self.core.rules.len() > 1 {
            let refused = Decision::reject(0, crate::decision::NEVER);
            return self.try_answers(key, now, 1, &refused).map(Some);
        }
        let decision = self.core.decision(reply)?;
        let mut answers = crate::RuleAnswers::default();
        answers.push(crate::RuleAnswer {
            rule: self.core.rules.strictest(),
            decision: if decision.allowed {
                Decision::admit(decision.remaining).in_ticks(decision.tick)
            } else {
                decision
            },
        });
        Ok(Some(answers))
    }

    /// [`RateLimiter::refund_at`]: one script call, which gives back up to
    /// `cost` units of `key`'s admission at `at` (0 for a client with no
    /// state, and nothing is created). A refund that gives anything back
    /// clears the client's cached refusal: it may be admittable now.
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at); on a timeout the units may
    /// have been given back.
    pub fn try_refund_at(
        &self,
        key: &str,
        now: u64,
        at: u64,
        cost: u64,
    ) -> Result<u64, RedisError> {
        // No admission after `now` (the contract's `at ≤ now`): no call.
        if at > now {
            return Ok(0);
        }
        self.give_back(key, Some(now), at, cost)
    }

    /// [`RateLimiter::refund`]: gives back up to `units` of the admission
    /// `admission` (never more than its cost, once: the refund takes it),
    /// now (by Redis's clock with
    /// [`TimeSource::Server`](super::TimeSource::Server): the decision
    /// carries the server's time it was judged at).
    ///
    /// # Errors
    ///
    /// As [`try_refund_at`](Self::try_refund_at).
    pub fn try_refund(&self, admission: Admission<String>, units: u64) -> Result<u64, RedisError> {
        let (key, _, admitted, units) = admission.into_refund(units);
        self.refund_decision(&key, &admitted, units)
    }

    /// Gives back up to `cost` units of the admission `admitted` answered,
    /// now, by the clock that judged it: trusts its caller, as
    /// [`try_refund_at`](Self::try_refund_at) does.
    fn refund_decision(
        &self,
        key: &str,
        admitted: &Decision,
        cost: u64,
    ) -> Result<u64, RedisError> {
        if !admitted.allowed {
            return Ok(0);
        }
        if let (Some(leases), true) = (&self.core.leases, cost > 0) {
            // Into the lease it came from while that lasts (the contract's
            // "Faults"), to Redis after.
            let local = self.core.local_now(self.core.implicit_now());
            if leases.give_back(key, local, admitted.at, cost) {
                return Ok(cost);
            }
        }
        let now = self.core.implicit_now().map(|now| now.max(admitted.at));
        self.give_back(key, now, admitted.at, cost)
    }

    /// One refund script call at `now` (`None`: Redis's clock, raised to
    /// `at` by the script).
    fn give_back(
        &self,
        key: &str,
        now: Option<u64>,
        at: u64,
        cost: u64,
    ) -> Result<u64, RedisError> {
        if cost == 0 {
            return Ok(0);
        }
        let given = self.call::<u64>(key, Op::Refund { cost, at }, now)?;
        if given > 0 {
            self.core.invalidate(Some(key));
        }
        Ok(given)
    }

    /// [`RateLimiter::forget`]: deletes `key`'s state; whether it had any.
    /// One `DEL`.
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at), but on
    /// [`RedisError::Timeout`] and [`RedisError::Unavailable`] the state may
    /// have been deleted.
    pub fn try_forget(&self, key: &str) -> Result<bool, RedisError> {
        let stored = self.core.keys(key);
        let deleted = self
            .pool
            .with(|connection| ::redis::cmd("DEL").arg(&stored).query::<u64>(connection));
        // Whether or not the answer came, the state may be gone.
        self.core.invalidate(Some(key));
        self.core.forget_holdings(key);
        Ok(deleted? > 0)
    }

    /// How many clients of this limiter (this prefix, policy, configuration
    /// and clock) have state in Redis: one `SCAN` through the database (of
    /// every primary, in a cluster), so meant for tests and diagnostics, not
    /// for a hot path.
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at).
    pub fn try_tracked_clients(&self) -> Result<usize, RedisError> {
        let pattern = self.core.pattern();
        self.pool
            .with_raw(|connection| Ok(self.core.clients_of(&connection.keys(&pattern)?)))
    }

    /// Deletes every key under `prefix` (any policy, configuration or clock)
    /// with `SCAN` and `UNLINK`, never `FLUSHDB`: what `floodgate replay
    /// --backend redis://…` does before a trace. Returns how many keys went.
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at).
    pub fn clear_prefix(&self, prefix: &str) -> Result<usize, RedisError> {
        let pattern = prefix_pattern(prefix);
        let cleared = self.pool.with_raw(|connection| {
            let keys = connection.keys(&pattern)?;
            for batch in keys.chunks(512) {
                match connection {
                    Conn::Single(connection) => {
                        ::redis::cmd("UNLINK").arg(batch).exec(connection)?;
                    }
                    // Keys of different slots cannot share one command: one
                    // UNLINK each, pipelined per node. A pipeline that meets
                    // a moved slot fails as a whole; then each key on its
                    // own, which follows MOVED and ASK.
                    Conn::Cluster(connection) => {
                        let mut pipe = ::redis::cluster::cluster_pipe();
                        for key in batch {
                            pipe.cmd("UNLINK").arg(key).ignore();
                        }
                        if pipe.exec(connection).is_err() {
                            for key in batch {
                                ::redis::cmd("UNLINK").arg(key).exec(&mut **connection)?;
                            }
                        }
                    }
                }
            }
            Ok(keys.len())
        });
        self.core.invalidate(None);
        cleared
    }

    /// What the store did: its round trips to Redis (calls, errors, their
    /// latency), the fault rule's answers, the rejection cache's.
    pub fn redis_stats(&self) -> RedisStats {
        self.core.redis_stats()
    }

    /// How many [`RateLimiter`] calls the fault rule has answered.
    pub fn faults(&self) -> u64 {
        self.core.faults.load(Ordering::Relaxed)
    }

    /// How many decisions the local rejection cache answered without a
    /// round trip ([`RedisOptions::rejection_cache`]).
    pub fn answered_locally(&self) -> u64 {
        self.core.answered_locally()
    }

    /// How many rejected clients the local rejection cache remembers now
    /// (at most [`RedisOptions::rejection_cache`]).
    pub fn cached_rejections(&self) -> usize {
        self.core.cached_rejections()
    }

    /// The options' time source.
    pub fn time_source(&self) -> TimeSource {
        self.core.time
    }

    /// The key that holds `client`'s state; with several rules, the first
    /// rule's ([`keys`](Self::keys) has them all).
    pub fn key(&self, client: &str) -> String {
        self.core.first_key(client)
    }

    /// Every key of `client`'s state, one per rule in the rules' order.
    pub fn keys(&self, client: &str) -> Vec<String> {
        self.core.keys(client)
    }

    /// A request of cost `cost` of `key` at `now` (`None`: Redis's clock or
    /// the local Unix time, as the time source says): from the rejection
    /// cache, or one script call whose rejection the cache remembers.
    fn decide(&self, key: &str, cost: u64, now: Option<u64>) -> Result<Decision, RedisError> {
        if let Some(leases) = self.core.leasing(cost) {
            return self.decide_leased(leases, key, cost, now);
        }
        let ticket = match self.core.cached(key, cost, now) {
            Ok(decision) => return Ok(self.core.counted(decision, cost)),
            Err(ticket) => ticket,
        };
        let (op, holder) = self.core.holding(cost);
        let decision = self
            .call(key, op, now)
            .and_then(|reply| self.core.weighed_decision(reply, cost))?;
        self.core.held(key, holder, cost, &decision);
        self.core.remember(key, cost, ticket, &decision);
        Ok(self.core.counted(decision, cost))
    }

    /// [`decide`](Self::decide) of a leasing limiter: from a lease this
    /// instance holds (no round trip), else from the rejection cache, else
    /// by taking a lease. A lease taken ahead of need is taken here, by
    /// the call that crossed the mark, after its own decision: the
    /// blocking limiter has no task to hand it to.
    fn decide_leased(
        &self,
        leases: &super::lease::Leases,
        key: &str,
        cost: u64,
        now: Option<u64>,
    ) -> Result<Decision, RedisError> {
        let asked = self.core.local_now(now);
        if let Some((decision, ahead)) = leases.spend(key, asked, cost, self.core.tick()) {
            if ahead {
                let ask = leases.ask(key, 0);
                // A failed lease ahead is no answer's: the next one that
                // runs short asks again.
                let taken = self.take_lease(key, now, 0, ask);
                leases.ahead_done(key, matches!(taken, Ok(decision) if decision.allowed()));
            }
            return Ok(self.core.counted_from_lease(decision, cost));
        }
        if let Some(back) = leases.reclaim(key, asked) {
            // An ended lease's rest, before the rejection cache: its
            // failure loses nothing but those units until their window or
            // drip frees them. A refund that gives back clears the cache.
            if let Ok(taken) = self.give_back(key, now, back.taken_at, back.units) {
                leases.returned(taken);
            }
        }
        let ticket = match self.core.cached(key, cost, now) {
            Ok(decision) => return Ok(self.core.counted(decision, cost)),
            Err(ticket) => ticket,
        };
        let (ask, alone) = leases.ask_alone(key, cost);
        let decision = self.take_lease(key, now, cost, ask);
        drop(alone);
        let decision = decision?;
        self.core.remember(key, cost, ticket, &decision);
        Ok(self.core.counted(decision, cost))
    }

    /// One lease of up to `ask` units of `key`, `cost` of them this call's
    /// own (0 for a lease ahead, which then asks at least 1): the call's
    /// decision, the rest landed in the client's slots.
    fn take_lease(
        &self,
        key: &str,
        now: Option<u64>,
        cost: u64,
        ask: u64,
    ) -> Result<Decision, RedisError> {
        let asked = self.core.local_now(now);
        let reply = self.call::<script::LeaseReply>(
            key,
            Op::Lease {
                cost: cost.max(1),
                ask: ask.max(cost).max(1),
            },
            now,
        )?;
        let (decision, give_back) = self.core.leased(key, asked, cost, &reply)?;
        if let (Some(give_back), Some(leases)) = (give_back, &self.core.leases) {
            // One more round trip, rare: an ended lease's rest, whose
            // failure loses nothing but those units until their window or
            // drip frees them.
            if let Ok(taken) = self.give_back(key, now, give_back.taken_at, give_back.units) {
                leases.returned(taken);
            }
        }
        Ok(decision)
    }

    /// Each rule's own answer to the request of cost `cost` of `key` at
    /// `now` that was decided `decided`: one more script call, which reads
    /// the states as they are after the decision and writes nothing.
    fn try_answers(
        &self,
        key: &str,
        now: u64,
        cost: u64,
        decided: &Decision,
    ) -> Result<crate::RuleAnswers, RedisError> {
        let now = script::encode_now(Some(now))?;
        let invocation = script::answers(
            &self.core.script,
            &self.core.key(key),
            &now,
            cost,
            decided.allowed,
        );
        let start = std::time::Instant::now();
        let result = self
            .pool
            .with(|connection| invocation.invoke::<script::Answers>(connection));
        self.core.round_trips.done(start, &result);
        self.core.answers(&result?, cost, decided)
    }

    /// One script call, sent at most once (see the module's Faults).
    fn call<T: FromRedisValue>(
        &self,
        key: &str,
        op: Op,
        now: Option<u64>,
    ) -> Result<T, RedisError> {
        let invocation = script::invocation(&self.core.script, &self.core.key(key), op, now)?;
        // `invoke` sends EVALSHA; only on NOSCRIPT (the script did not run)
        // does it load the script and send it again.
        let start = std::time::Instant::now();
        let result = self
            .pool
            .with(|connection| invocation.invoke::<T>(connection));
        self.core.round_trips.done(start, &result);
        result
    }
}

impl RateLimiter<str> for RedisLimiter {
    fn check_at(&self, key: &str, now: u64) -> Decision {
        self.try_check_at(key, now).unwrap_or_else(|_| {
            self.core
                .counted(self.core.check_on_failure(key, Some(now)), 1)
        })
    }

    fn check_n_at(&self, key: &str, now: u64, cost: u64) -> Decision {
        self.try_check_n_at(key, now, cost).unwrap_or_else(|_| {
            self.core
                .counted(self.core.check_n_on_failure(key, Some(now), cost), cost)
        })
    }

    fn remaining_at(&self, key: &str, now: u64) -> u64 {
        self.try_remaining_at(key, now)
            .unwrap_or_else(|_| self.core.remaining_on_failure(key, Some(now)))
    }

    /// The local Unix time in ticks (microseconds with the server's clock).
    fn now(&self) -> u64 {
        crate::Clock::now(&self.core.clock)
    }

    fn policy(&self) -> PolicyKind {
        self.core.policy
    }

    fn config(&self) -> Config {
        self.core.config
    }

    fn rules(&self) -> RuleSet {
        self.core.rules()
    }

    /// With several rules, [`each`](crate::RuledDecision::each) holds every
    /// rule's own answer, read by a second script call after the decision
    /// (as the in-memory engine reads them after its own); empty if that
    /// call fails.
    fn check_ruled_n_at(&self, key: &str, now: u64, cost: u64) -> RuledDecision<'_> {
        let decision = self.check_n_at(key, now, cost);
        let each = if self.core.rules.len() > 1 {
            self.try_answers(key, now, cost, &decision)
                .unwrap_or_default()
        } else {
            crate::RuleAnswers::default()
        };
        RuledDecision {
            decision,
            tier: None,
            policy: self.core.policy,
            config: self.core.config,
            refused_unknown_tier: false,
            each,
        }
    }

    fn check_ruled_at(&self, key: &str, now: u64) -> RuledDecision<'_> {
        self.check_ruled_n_at(key, now, 1)
    }

    /// [`try_peek_at`](RedisLimiter::try_peek_at); `None` when Redis fails.
    fn peek_at(&self, key: &str, now: u64) -> Option<u64> {
        self.try_peek_at(key, now).ok().flatten()
    }

    /// [`try_peek_each_at`](RedisLimiter::try_peek_each_at); `None` when
    /// Redis fails.
    fn peek_each_at(&self, key: &str, now: u64) -> Option<crate::RuleAnswers> {
        self.try_peek_each_at(key, now).ok().flatten()
    }

    /// [`try_refund_at`](RedisLimiter::try_refund_at); 0 when Redis fails.
    fn refund_at(&self, key: &str, now: u64, at: u64, cost: u64) -> u64 {
        self.try_refund_at(key, now, at, cost).unwrap_or(0)
    }

    /// [`try_refund`](RedisLimiter::try_refund); 0 when Redis fails.
    fn refund(&self, admission: Admission<String>, units: u64) -> u64 {
        self.try_refund(admission, units).unwrap_or(0)
    }

    /// By Redis's clock, as [`try_refund`](RedisLimiter::try_refund); 0
    /// when Redis fails.
    fn refund_admitted(&self, key: &str, admitted: &Decision, cost: u64) -> u64 {
        self.refund_decision(key, admitted, cost).unwrap_or(0)
    }

    /// [`try_forget`](RedisLimiter::try_forget); false when Redis fails.
    fn forget(&self, key: &str) -> bool {
        self.try_forget(key).unwrap_or(false)
    }

    /// 0 when Redis fails: the units stay held until released again or
    /// their lease ends.
    fn release_at(&self, key: &str, now: u64, cost: u64) -> u64 {
        self.try_release_at(key, now, cost).unwrap_or(0)
    }

    fn release(&self, key: &str, cost: u64) -> u64 {
        self.try_release(key, cost).unwrap_or(0)
    }

    /// [`try_tracked_clients`](RedisLimiter::try_tracked_clients), or 0 when
    /// Redis fails.
    fn tracked_clients(&self) -> usize {
        self.try_tracked_clients().unwrap_or(0)
    }

    /// The decisions this limiter answered: Redis's, the rejection
    /// cache's and the fault rule's (always counted; the clients are
    /// Redis's, so those counts stay 0).
    fn stats(&self) -> Option<crate::Stats> {
        Some(self.core.stats())
    }

    /// With the server's clock, the script reads Redis `TIME`.
    fn check(&self, key: &str) -> Decision {
        let now = self.core.implicit_now();
        self.decide(key, 1, now)
            .unwrap_or_else(|_| self.core.counted(self.core.check_on_failure(key, now), 1))
    }

    fn check_n(&self, key: &str, cost: u64) -> Decision {
        let now = self.core.implicit_now();
        self.decide(key, cost, now).unwrap_or_else(|_| {
            self.core
                .counted(self.core.check_n_on_failure(key, now, cost), cost)
        })
    }

    fn remaining(&self, key: &str) -> u64 {
        let now = self.core.implicit_now();
        self.call(key, Op::Remaining, now)
            .and_then(|reply| self.core.decision(reply))
            .map(|decision| self.core.with_held(key, now, decision.remaining))
            .unwrap_or_else(|_| self.core.remaining_on_failure(key, now))
    }
}

/// One connection of the pool: to one server, or to a cluster (itself a
/// connection per node, routing each call by its key's slot).
/// Renews this process's holders' leases every `every` on a thread of its
/// own, until the limiter is dropped (the thread then ends at its next
/// turn).
fn renew_leases(core: Weak<Core>, pool: Weak<Pool>, every: Duration) {
    let renew = move || loop {
        std::thread::sleep(every);
        let (Some(core), Some(pool)) = (core.upgrade(), pool.upgrade()) else {
            return;
        };
        let Ok(now) = script::encode_now(core.implicit_now()) else {
            continue;
        };
        for invocation in core.renewals(&now) {
            // A renewal that fails is tried again at the next turn, within
            // the lease (a third of it has passed).
            let _ = pool.with(|connection| invocation.invoke::<u64>(connection));
        }
    };
    // Without a thread, leases are not renewed: a request longer than the
    // lease then gives its units back early, never later.
    if let Err(error) = std::thread::Builder::new()
        .name("floodgate-redis-leases".to_owned())
        .spawn(renew)
    {
        tracing::error!(
            "floodgate: no thread to renew the Redis leases of in-flight rules: {error}"
        );
    }
}

enum Conn {
    Single(Connection),
    /// Boxed: it is several times the size of a single connection.
    Cluster(Box<ClusterConnection>),
}

impl Conn {
    fn as_dyn(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Conn::Single(connection) => connection,
            Conn::Cluster(connection) => &mut **connection,
        }
    }

    fn is_open(&self) -> bool {
        match self {
            Conn::Single(connection) => connection.is_open(),
            Conn::Cluster(connection) => connection.is_open(),
        }
    }

    /// Every key matching `pattern`, by `SCAN`: of the server, or of each
    /// primary of the cluster in turn.
    fn keys(&mut self, pattern: &str) -> RedisResult<Vec<String>> {
        // `Cmd::iter` sends the command again with each cursor it is given
        // back, in the place `cursor_arg` marks; the cluster's own loop
        // below passes the cursor as a plain argument.
        let scan = |cursor: Option<u64>| {
            let mut scan = ::redis::cmd("SCAN");
            match cursor {
                Some(cursor) => scan.arg(cursor),
                None => scan.cursor_arg(0),
            };
            scan.arg("MATCH").arg(pattern).arg("COUNT").arg(1_000);
            scan
        };
        match self {
            Conn::Single(connection) => scan(None).iter(connection)?.collect(),
            Conn::Cluster(connection) => {
                let slots = connection.route_command(
                    &::redis::cmd("CLUSTER").arg("SLOTS").clone(),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                )?;
                let mut keys = Vec::new();
                for (host, port) in cluster_primaries(&slots) {
                    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port,
                    });
                    let mut cursor = 0;
                    // Progress: Redis's SCAN ends a full iteration with
                    // cursor 0 (its guarantee), or an error ends the loop.
                    loop {
                        let reply = connection.route_command(&scan(Some(cursor)), route.clone())?;
                        let (next, mut batch): (u64, Vec<String>) =
                            ::redis::FromRedisValue::from_redis_value(reply)?;
                        keys.append(&mut batch);
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                }
                Ok(keys)
            }
        }
    }
}

/// Connections made on demand, each slot behind its own lock.
struct Pool {
    target: Target,
    slots: Box<[Mutex<Option<Conn>>]>,
    /// Where the next call starts looking for a free slot, so that
    /// concurrent calls spread over the slots. Relaxed: any value is a
    /// correct starting point.
    next: AtomicUsize,
    timeout: Duration,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("cluster", &matches!(self.target, Target::Cluster(_)))
            .field("connections", &self.slots.len())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Pool {
    fn new(target: Target, size: usize, timeout: Duration) -> Self {
        Self {
            target,
            slots: (0..size).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            timeout,
        }
    }

    /// Runs `work` on a connection (see [`with_raw`](Self::with_raw)).
    fn with<T>(
        &self,
        work: impl FnOnce(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<T, RedisError> {
        self.with_raw(|connection| work(connection.as_dyn()))
    }

    /// Runs `work` on a connection: a free slot's if there is one, else
    /// the first tried slot's once it is free. A slot without a connection
    /// connects first. A connection whose call failed other than by a
    /// server's error reply is dropped: it may be broken, or a late reply
    /// may still be on its way.
    fn with_raw<T>(&self, work: impl FnOnce(&mut Conn) -> RedisResult<T>) -> Result<T, RedisError> {
        let start = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut slot = (0..self.slots.len())
            .find_map(|offset| {
                self.slots[(start + offset) % self.slots.len()]
                    .try_lock()
                    .ok()
            })
            .unwrap_or_else(|| Self::lock(&self.slots[start]));
        let connection = match &mut *slot {
            Some(connection) => connection,
            empty => empty.insert(self.connect()?),
        };
        match work(connection) {
            Ok(value) => Ok(value),
            Err(error) => {
                if !matches!(error.kind(), ::redis::ErrorKind::Server(_)) || !connection.is_open() {
                    *slot = None;
                }
                Err(RedisError::from_client(error))
            }
        }
    }

    /// Takes a slot's lock. A panic while it was held (in `work`) may have
    /// left its connection in the middle of a reply, so a poisoned slot's
    /// connection is dropped.
    fn lock(slot: &Mutex<Option<Conn>>) -> MutexGuard<'_, Option<Conn>> {
        slot.lock().unwrap_or_else(|poisoned| {
            let mut guard = PoisonError::into_inner(poisoned);
            *guard = None;
            guard
        })
    }

    /// A new connection whose reads and writes time out after the timeout.
    /// A cluster's connects to the nodes it is given and learns the rest.
    fn connect(&self) -> Result<Conn, RedisError> {
        match &self.target {
            Target::Single(client) => {
                let connection = client
                    .get_connection_with_timeout(self.timeout)
                    .map_err(RedisError::from_client)?;
                connection
                    .set_read_timeout(Some(self.timeout))
                    .and_then(|()| connection.set_write_timeout(Some(self.timeout)))
                    .map_err(RedisError::from_client)?;
                Ok(Conn::Single(connection))
            }
            Target::Cluster(client) => {
                let connection = client.get_connection().map_err(RedisError::from_client)?;
                connection
                    .set_read_timeout(Some(self.timeout))
                    .and_then(|()| connection.set_write_timeout(Some(self.timeout)))
                    .map_err(RedisError::from_client)?;
                Ok(Conn::Cluster(Box::new(connection)))
            }
        }
    }
}
