//! The async Redis limiter, for tokio.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, Value};

use super::batch::Batcher;
use super::script::{self, Op, Reply};
use super::{Core, RedisConfigError, RedisError, RedisOptions, RedisStats, Target, TimeSource};
use crate::{Admission, Config, Decision, PolicyKind, RuleSet};

/// A per-client limiter whose state lives in Redis, for tokio: the
/// decisions of [`RedisLimiter`](super::RedisLimiter) as `async` methods.
///
/// All calls share one multiplexed connection (a [`ConnectionManager`]):
/// concurrent calls are pipelined on it, and after a failure it reconnects
/// in the background, so the limiter outlives a restart of Redis. With a
/// `redis-cluster://` URL it is the cluster client's multiplexed connection
/// to every node instead, which routes each call by its key's slot and
/// reconnects to a node that comes back. Each call is bounded by
/// [`RedisOptions::timeout`], waiting for a reconnection included. Cloning
/// is cheap and shares the connection.
///
/// The infallible methods answer by the [`OnFailure`](super::OnFailure)
/// rule when Redis fails; the `try_*` methods return the error.
///
/// # Examples
///
/// ```no_run
/// use floodgate::redis::{AsyncRedisLimiter, RedisOptions};
/// use floodgate::{Config, PolicyKind};
///
/// # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
/// // 10 requests per second on Redis's clock (microseconds).
/// let limiter = AsyncRedisLimiter::new(
///     "redis://127.0.0.1:6379",
///     PolicyKind::TokenBucket,
///     Config::per_ticks(10, 1_000_000)?,
///     RedisOptions::new(),
/// )
/// .await?;
/// let decision = limiter.check("client-42").await;
/// if !decision.allowed() {
///     // 429, retry after `decision.retry_after()`
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct AsyncRedisLimiter {
    core: std::sync::Arc<Core>,
    connection: Connection,
    /// Where checks wait for a batch (module docs, "Batches"): one server,
    /// with batching on, made on a tokio runtime.
    batcher: Option<Batcher>,
}

/// The shared connection: to one server, or to a cluster.
#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Connection::Single(_) => "Connection::Single",
            Connection::Cluster(_) => "Connection::Cluster",
        })
    }
}

impl ::redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(connection) => connection.req_packed_command(cmd),
            Connection::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            Connection::Cluster(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(connection) => connection.get_db(),
            Connection::Cluster(connection) => connection.get_db(),
        }
    }
}

impl AsyncRedisLimiter {
    /// A limiter applying `policy` with `config` to the Redis at `url`
    /// (`redis://…`, or `redis-cluster://host:port[,host:port…]` for a
    /// cluster). Connects on first use (Redis need not be up yet); call it
    /// inside a tokio runtime.
    ///
    /// # Errors
    ///
    /// As [`RedisLimiter::new`](super::RedisLimiter::new).
    pub async fn new(
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

    /// A limiter applying every rule of `rules` to each client at once, one
    /// script call per decision: see
    /// [`RedisLimiter::with_rules`](super::RedisLimiter::with_rules).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new), for any of the rules.
    pub async fn with_rules(
        url: &str,
        rules: &RuleSet,
        options: RedisOptions,
    ) -> Result<Self, RedisConfigError> {
        Self::open(url, Core::with_rule_set(rules, &options)?, &options)
    }

    /// The limiter of `core` on the Redis at `url`.
    fn open(url: &str, core: Core, options: &RedisOptions) -> Result<Self, RedisConfigError> {
        let connection = match Target::open(url, core.timeout)? {
            Target::Single(client) => {
                let manager = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(core.timeout))
                    .set_response_timeout(Some(core.timeout))
                    // Reconnection attempts back off from 10 ms to 1 s, so
                    // traffic resumes within about a second of Redis coming
                    // back.
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_secs(1));
                Connection::Single(
                    ConnectionManager::new_lazy_with_config(client, manager)
                        .map_err(RedisConfigError::Url)?,
                )
            }
            // Connects to the nodes in the background: the first calls
            // wait for it (within their timeout).
            Target::Cluster(client) => Connection::Cluster(
                client.get_pending_async_connection_with_config(
                    ::redis::cluster::ClusterConfig::new()
                        .set_connection_timeout(core.timeout)
                        .set_response_timeout(core.timeout),
                ),
            ),
        };
        let core = std::sync::Arc::new(core);
        let batcher = match connection {
            // A batch carries no holder ids: a limiter that holds units
            // sends each check on its own.
            Connection::Single(_) if options.batching && core.holdings.is_none() => {
                Batcher::spawn(std::sync::Arc::clone(&core), connection.clone())
            }
            _ => None,
        };
        if let (Some(every), Ok(runtime)) =
            (core.renew_every, tokio::runtime::Handle::try_current())
        {
            runtime.spawn(renew_leases(
                std::sync::Arc::downgrade(&core),
                connection.clone(),
                every,
            ));
        }
        Ok(Self {
            core,
            connection,
            batcher,
        })
    }

    /// Decides one request of `key` at `now` (ticks of the time source).
    ///
    /// # Errors
    ///
    /// As [`RedisLimiter::try_check_at`](super::RedisLimiter::try_check_at).
    pub async fn try_check_at(&self, key: &str, now: u64) -> Result<Decision, RedisError> {
        self.decide(key, 1, Some(now)).await
    }

    /// Decides one request of cost `cost` of `key` at `now`, all or nothing:
    /// one script call, with the cost as an argument.
    ///
    /// # Errors
    ///
    /// As [`RedisLimiter::try_check_at`](super::RedisLimiter::try_check_at).
    pub async fn try_check_n_at(
        &self,
        key: &str,
        now: u64,
        cost: u64,
    ) -> Result<Decision, RedisError> {
        self.decide(key, cost, Some(now)).await
    }

    /// Decides one request of `key` now (by Redis's clock with
    /// [`TimeSource::Server`]).
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at).
    pub async fn try_check(&self, key: &str) -> Result<Decision, RedisError> {
        self.decide(key, 1, self.core.implicit_now()).await
    }

    /// How many requests of `key` would be admitted one after another at
    /// `now`.
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at).
    pub async fn try_remaining_at(&self, key: &str, now: u64) -> Result<u64, RedisError> {
        let remaining = self
            .core
            .decision(self.call(key, Op::Remaining, Some(now)).await?)?
            .remaining;
        Ok(self.core.with_held(key, Some(now), remaining))
    }

    /// How many requests of `key` would be admitted now.
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at).
    pub async fn try_remaining(&self, key: &str) -> Result<u64, RedisError> {
        let now = self.core.implicit_now();
        let remaining = self
            .core
            .decision(self.call(key, Op::Remaining, now).await?)?
            .remaining;
        Ok(self.core.with_held(key, now, remaining))
    }

    /// `key`'s `remaining` at `now` if it has state in Redis, `None` if it
    /// has none ([`RateLimiter::peek_at`](crate::RateLimiter::peek_at)).
    /// One script call, which looks the key up and answers from it
    /// atomically, and writes nothing.
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at).
    pub async fn try_peek_at(&self, key: &str, now: u64) -> Result<Option<u64>, RedisError> {
        self.call::<Option<Reply>>(key, Op::Peek, Some(now))
            .await?
            .map(|reply| Ok(self.core.decision(reply)?.remaining))
            .transpose()
    }

    /// Deletes `key`'s state, as if it had never called; whether it had any
    /// ([`RateLimiter::forget`](crate::RateLimiter::forget)). One `DEL`.
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at), but on
    /// [`RedisError::Timeout`] and [`RedisError::Unavailable`] the state may
    /// have been deleted.
    pub async fn try_forget(&self, key: &str) -> Result<bool, RedisError> {
        let deleted = self
            .command::<u64>(::redis::cmd("DEL").arg(self.core.keys(key)))
            .await;
        // Whether or not the answer came, the state may be gone.
        self.core.invalidate(Some(key));
        self.core.forget_holdings(key);
        Ok(deleted? > 0)
    }

    /// Releases up to `cost` units `key` holds under its `in-flight` rules
    /// at `now`: see
    /// [`RedisLimiter::try_release_at`](super::RedisLimiter::try_release_at).
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at); on a timeout the units may
    /// have been released.
    pub async fn try_release_at(&self, key: &str, now: u64, cost: u64) -> Result<u64, RedisError> {
        self.let_go(key, Some(now), cost).await
    }

    /// [`try_release_at`](Self::try_release_at) now.
    ///
    /// # Errors
    ///
    /// As [`try_release_at`](Self::try_release_at).
    pub async fn try_release(&self, key: &str, cost: u64) -> Result<u64, RedisError> {
        self.let_go(key, self.core.implicit_now(), cost).await
    }

    /// [`try_release`](Self::try_release); 0 when Redis fails (the units
    /// stay held until released again or their lease ends).
    pub async fn release(&self, key: &str, cost: u64) -> u64 {
        self.try_release(key, cost).await.unwrap_or(0)
    }

    async fn let_go(&self, key: &str, now: Option<u64>, cost: u64) -> Result<u64, RedisError> {
        if cost == 0 {
            return Ok(0);
        }
        let Some((plan, local)) = self.core.plan_release(key, now, cost) else {
            return Ok(0);
        };
        let result = match script::encode_now(now) {
            Err(error) => Err(error),
            Ok(encoded) => match self.core.release_call(key, &encoded, cost, &plan) {
                None => Ok(0),
                Some(invocation) => {
                    let mut connection = self.connection.clone();
                    let start = std::time::Instant::now();
                    let result = within(
                        self.core.timeout,
                        invocation.invoke_async::<u64>(&mut connection),
                    )
                    .await;
                    self.core.round_trips.done(start, &result);
                    result
                }
            },
        };
        self.core.released(key, plan, local, result)
    }

    /// Gives back up to `cost` units of `key`'s admission at `at`, judged
    /// at `now` (0 for an `at` after `now`): the units given back
    /// ([`RedisLimiter::try_refund_at`](super::RedisLimiter::try_refund_at)).
    ///
    /// # Errors
    ///
    /// As [`try_check_at`](Self::try_check_at); on a timeout the units may
    /// have been given back.
    pub async fn try_refund_at(
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
        self.give_back(key, Some(now), at, cost).await
    }

    /// [`check_n`](Self::check_n) answered as an [`Admission`], the handle
    /// that gives its units back once and never more than `cost`
    /// ([`refund`](Self::refund); [`RateLimiter::admit_n`](crate::RateLimiter::admit_n)).
    ///
    /// # Errors
    ///
    /// The refusal (a fault answered by the fault rule included).
    pub async fn admit_n(&self, key: &str, cost: u64) -> Result<Admission<String>, Decision> {
        let decision = self.check_n(key, cost).await;
        if !decision.allowed {
            return Err(decision);
        }
        Ok(Admission::new(key.to_owned(), None, decision, cost))
    }

    /// Gives back up to `units` of the admission `admission` (never more
    /// than its cost, once: the refund takes it), now (by Redis's clock
    /// with [`TimeSource::Server`](super::TimeSource::Server))
    /// ([`RedisLimiter::try_refund`](super::RedisLimiter::try_refund)).
    ///
    /// # Errors
    ///
    /// As [`try_refund_at`](Self::try_refund_at).
    pub async fn try_refund(
        &self,
        admission: Admission<String>,
        units: u64,
    ) -> Result<u64, RedisError> {
        let (key, _, admitted, units) = admission.into_refund(units);
        self.refund_decision(&key, &admitted, units).await
    }

    /// [`try_refund`](Self::try_refund); 0 when Redis fails.
    pub async fn refund(&self, admission: Admission<String>, units: u64) -> u64 {
        self.try_refund(admission, units).await.unwrap_or(0)
    }

    /// Gives back up to `cost` units of the admission `admitted` answered,
    /// now: the HTTP layer's refund, which holds each admission once and
    /// gives back at most its cost. Trusts its caller, as
    /// [`try_refund_at`](Self::try_refund_at) does.
    pub(crate) async fn refund_decision(
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
        self.give_back(key, now, admitted.at, cost).await
    }

    /// One refund script call at `now` (`None`: Redis's clock, raised to
    /// `at` by the script); a refund that gives anything back clears the
    /// client's cached refusal.
    async fn give_back(
        &self,
        key: &str,
        now: Option<u64>,
        at: u64,
        cost: u64,
    ) -> Result<u64, RedisError> {
        if cost == 0 {
            return Ok(0);
        }
        let given = self.call::<u64>(key, Op::Refund { cost, at }, now).await?;
        if given > 0 {
            self.core.invalidate(Some(key));
        }
        Ok(given)
    }

    /// [`try_peek_at`](Self::try_peek_at); `None` when Redis fails.
    pub async fn peek_at(&self, key: &str, now: u64) -> Option<u64> {
        self.try_peek_at(key, now).await.ok().flatten()
    }

    /// [`try_forget`](Self::try_forget); false when Redis fails.
    pub async fn forget(&self, key: &str) -> bool {
        self.try_forget(key).await.unwrap_or(false)
    }

    /// Decides one request of `key` at `now`; the fault rule answers when
    /// Redis fails.
    pub async fn check_at(&self, key: &str, now: u64) -> Decision {
        match self.try_check_at(key, now).await {
            Ok(decision) => decision,
            Err(_) => self
                .core
                .counted(self.core.check_on_failure(key, Some(now)), 1),
        }
    }

    /// Decides one request of cost `cost` of `key` now (by Redis's clock
    /// with [`TimeSource::Server`]), in one script call; the fault rule
    /// answers when Redis fails.
    pub async fn check_n(&self, key: &str, cost: u64) -> Decision {
        let now = self.core.implicit_now();
        match self.decide(key, cost, now).await {
            Ok(decision) => decision,
            Err(_) => self
                .core
                .counted(self.core.check_n_on_failure(key, now, cost), cost),
        }
    }

    /// Decides one request of `key` now (by Redis's clock with
    /// [`TimeSource::Server`]); the fault rule answers when Redis fails.
    pub async fn check(&self, key: &str) -> Decision {
        let now = self.core.implicit_now();
        match self.decide(key, 1, now).await {
            Ok(decision) => decision,
            Err(_) => self.core.counted(self.core.check_on_failure(key, now), 1),
        }
    }

    /// How many requests of `key` would be admitted at `now`; the fault
    /// rule answers when Redis fails.
    pub async fn remaining_at(&self, key: &str, now: u64) -> u64 {
        match self.try_remaining_at(key, now).await {
            Ok(remaining) => remaining,
            Err(_) => self.core.remaining_on_failure(key, Some(now)),
        }
    }

    /// How many requests of `key` would be admitted now; the fault rule
    /// answers when Redis fails.
    pub async fn remaining(&self, key: &str) -> u64 {
        let now = self.core.implicit_now();
        match self
            .call(key, Op::Remaining, now)
            .await
            .and_then(|reply| self.core.decision(reply))
        {
            Ok(decision) => decision.remaining,
            Err(_) => self.core.remaining_on_failure(key, now),
        }
    }

    /// Whether its rules include an `in-flight` rule: its admissions then
    /// hold units until released ([`release`](Self::release)).
    pub fn holds_units(&self) -> bool {
        self.core.holdings.is_some()
    }

    /// What the store did: its round trips to Redis (calls and batches,
    /// errors, their latency), the fault rule's answers, the rejection
    /// cache's.
    pub fn redis_stats(&self) -> RedisStats {
        self.core.redis_stats()
    }

    /// The decisions this limiter answered: Redis's, the rejection
    /// cache's and the fault rule's (always counted; the clients are
    /// Redis's, so those counts stay 0).
    pub fn stats(&self) -> crate::Stats {
        self.core.stats()
    }

    /// How many infallible calls the fault rule has answered.
    pub fn faults(&self) -> u64 {
        self.core.faults.load(Ordering::Relaxed)
    }

    /// How many decisions the local rejection cache answered without a
    /// round trip ([`RedisOptions::rejection_cache`]).
    pub fn answered_locally(&self) -> u64 {
        self.core.answered_locally()
    }

    /// How many rejected clients the local rejection cache remembers now.
    pub fn cached_rejections(&self) -> usize {
        self.core.cached_rejections()
    }

    /// The policy this limiter applies; for several rules, the strictest
    /// rule's ([`RuleSet::strictest`]).
    pub fn policy(&self) -> PolicyKind {
        self.core.policy
    }

    /// The limit and window this limiter applies; for several rules, the
    /// strictest rule's.
    pub fn config(&self) -> Config {
        self.core.config
    }

    /// Every rule this limiter applies, in order: a decision's
    /// [`refused_by`](Decision::refused_by) indexes them.
    pub fn rules(&self) -> RuleSet {
        self.core.rules()
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

    /// A request of cost `cost` of `key` at `now` (`None`: by the time
    /// source): from the rejection cache, or one script call whose
    /// rejection the cache remembers.
    async fn decide(&self, key: &str, cost: u64, now: Option<u64>) -> Result<Decision, RedisError> {
        if self.core.leasing(cost).is_some() {
            return self.decide_leased(key, cost, now).await;
        }
        let ticket = match self.core.cached(key, cost, now) {
            Ok(decision) => return Ok(self.core.counted(decision, cost)),
            Err(ticket) => ticket,
        };
        let (op, holder) = self.core.holding(cost);
        let reply = match (op, &self.batcher) {
            (Op::CheckN(cost), Some(batcher)) => self.batched(batcher, key, cost, now).await?,
            (op, _) => self.call(key, op, now).await?,
        };
        let decision = self.core.weighed_decision(reply, cost)?;
        self.core.held(key, holder, cost, &decision);
        self.core.remember(key, cost, ticket, &decision);
        Ok(self.core.counted(decision, cost))
    }

    /// [`decide`](Self::decide) of a leasing limiter: from a lease this
    /// instance holds (no round trip), else from the rejection cache, else
    /// by taking a lease. The lease taken ahead of need goes to a task of
    /// its own, off the caller's path (inline only outside a runtime).
    async fn decide_leased(
        &self,
        key: &str,
        cost: u64,
        now: Option<u64>,
    ) -> Result<Decision, RedisError> {
        let Some(leases) = self.core.leasing(cost) else {
            unreachable!("asked only of a leasing limiter")
        };
        let asked = self.core.local_now(now);
        if let Some((decision, ahead)) = leases.spend(key, asked, cost, self.core.tick()) {
            if ahead {
                let limiter = self.clone();
                let key = key.to_owned();
                let ahead = async move {
                    let Some(leases) = limiter.core.leases.as_ref() else {
                        return;
                    };
                    let ask = leases.ask(&key, 0);
                    // A failed lease ahead is no answer's: the next one
                    // that runs short asks again.
                    let taken = limiter.take_lease(&key, now, 0, ask).await;
                    leases.ahead_done(&key, matches!(taken, Ok(decision) if decision.allowed()));
                };
                match tokio::runtime::Handle::try_current() {
                    Ok(runtime) => drop(runtime.spawn(ahead)),
                    Err(_) => ahead.await,
                }
            }
            return Ok(self.core.counted_from_lease(decision, cost));
        }
        if let Some(back) = leases.reclaim(key, asked) {
            // As the blocking limiter's: an ended lease's rest, before the
            // rejection cache.
            if let Ok(taken) = self.give_back(key, now, back.taken_at, back.units).await {
                leases.returned(taken);
            }
        }
        let ticket = match self.core.cached(key, cost, now) {
            Ok(decision) => return Ok(self.core.counted(decision, cost)),
            Err(ticket) => ticket,
        };
        let (ask, alone) = leases.ask_alone(key, cost);
        let decision = self.take_lease(key, now, cost, ask).await;
        drop(alone);
        let decision = decision?;
        self.core.remember(key, cost, ticket, &decision);
        Ok(self.core.counted(decision, cost))
    }

    /// One lease of up to `ask` units of `key`, `cost` of them this call's
    /// own (0 for a lease ahead, which then asks at least 1): the call's
    /// decision, the rest landed in the client's slots.
    async fn take_lease(
        &self,
        key: &str,
        now: Option<u64>,
        cost: u64,
        ask: u64,
    ) -> Result<Decision, RedisError> {
        let asked = self.core.local_now(now);
        let reply = self
            .call::<script::LeaseReply>(
                key,
                Op::Lease {
                    cost: cost.max(1),
                    ask: ask.max(cost).max(1),
                },
                now,
            )
            .await?;
        let (decision, give_back) = self.core.leased(key, asked, cost, &reply)?;
        if let (Some(give_back), Some(leases)) = (give_back, &self.core.leases) {
            // One more round trip, rare: an ended lease's rest, whose
            // failure loses nothing but those units until their window or
            // drip frees them.
            if let Ok(taken) = self
                .give_back(key, now, give_back.taken_at, give_back.units)
                .await
            {
                leases.returned(taken);
            }
        }
        Ok(decision)
    }

    /// One script call, sent at most once, within the timeout. A call cut
    /// by the timeout is dropped, never re-sent: its reply, if it comes, is
    /// discarded by the multiplexer.
    async fn call<T: FromRedisValue>(
        &self,
        key: &str,
        op: Op,
        now: Option<u64>,
    ) -> Result<T, RedisError> {
        let invocation = script::invocation(&self.core.script, &self.core.key(key), op, now)?;
        let mut connection = self.connection.clone();
        // `invoke_async` sends EVALSHA; only on NOSCRIPT (the script did not
        // run) does it load the script and send it again.
        let start = std::time::Instant::now();
        let result = within(
            self.core.timeout,
            invocation.invoke_async::<T>(&mut connection),
        )
        .await;
        self.core.round_trips.done(start, &result);
        result
    }

    /// A check of `cost` (`1 <= cost <= L`) sent with the next batch, within
    /// the timeout; alone if the batch queue's task is gone.
    async fn batched(
        &self,
        batcher: &Batcher,
        key: &str,
        cost: u64,
        now: Option<u64>,
    ) -> Result<Reply, RedisError> {
        let answer = batcher.check(self.core.key(key), script::encode_now(now)?, cost);
        match tokio::time::timeout(self.core.timeout, answer).await {
            Ok(Some(reply)) => reply,
            Ok(None) => self.call(key, Op::CheckN(cost), now).await,
            // Dropping the wait closes its reply channel: a check not yet
            // sent is left out of its batch.
            Err(_elapsed) => Err(RedisError::Timeout),
        }
    }

    /// One plain command, sent at most once, within the timeout.
    async fn command<T: FromRedisValue>(&self, command: &::redis::Cmd) -> Result<T, RedisError> {
        let mut connection = self.connection.clone();
        within(self.core.timeout, command.query_async::<T>(&mut connection)).await
    }
}

/// Renews this process's holders' leases every `every`, until the limiter
/// is dropped (the task then ends at its next turn).
async fn renew_leases(
    core: std::sync::Weak<super::Core>,
    mut connection: Connection,
    every: Duration,
) {
    let mut turns = tokio::time::interval(every);
    turns.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first turn is at once: nothing is held yet.
    turns.tick().await;
    loop {
        turns.tick().await;
        let Some(core) = core.upgrade() else {
            return;
        };
        let Ok(now) = script::encode_now(core.implicit_now()) else {
            continue;
        };
        for invocation in core.renewals(&now) {
            // A renewal that fails is tried again at the next turn, within
            // the lease (a third of it has passed).
            let _ = within(
                core.timeout,
                invocation.invoke_async::<u64>(&mut connection),
            )
            .await;
        }
    }
}

/// `reply`'s result, or [`RedisError::Timeout`] if it takes longer than
/// `timeout` (the call is then dropped: a late reply is discarded by the
/// multiplexer).
pub(super) async fn within<T>(
    timeout: Duration,
    reply: impl std::future::Future<Output = ::redis::RedisResult<T>>,
) -> Result<T, RedisError> {
    match tokio::time::timeout(timeout, reply).await {
        Ok(reply) => reply.map_err(RedisError::from_client),
        Err(_elapsed) => Err(RedisError::Timeout),
    }
}
