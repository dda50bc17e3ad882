//! Where a limit's clients are counted: in this process's memory (the
//! lock-free engine, the default), or in Redis with `--backend`, shared by
//! every `floodgate rls` on the same Redis and configuration.
//!
//! Each limit has a store of its own. In Redis its keys start with
//! [`redis_prefix`]: `floodgate-rls:` and the limit's id, whose every byte
//! but a letter, a digit, `.`, `_` and `-` is written `%XX`. Ids are unique
//! in a configuration and the encoding is one to one with no `:` left, so
//! two limits never share a key (the library's keys go on with `:` and the
//! rules), and two servers with the same configuration share each limit.

use std::sync::Arc;

use floodgate::{Bounds, Clock, Decision, RateLimiter, RuleSet, RuledDecision};

#[cfg(feature = "redis")]
use floodgate::redis::{AsyncRedisLimiter, RedisOptions};
#[cfg(feature = "redis")]
use floodgate::Admission;

/// How each limit's store is made: the flags' choice.
#[derive(Clone, Debug)]
pub enum Backing {
    /// In memory, each limit holding at most these bounds' clients.
    Memory(Bounds),
    /// In the Redis at `url`, with `options` (each limit's prefix is set
    /// from its id).
    #[cfg(feature = "redis")]
    Redis {
        /// `redis://…` or `redis-cluster://…`.
        url: String,
        /// Leases, and the library's defaults.
        options: RedisOptions,
    },
}

impl From<Bounds> for Backing {
    fn from(bounds: Bounds) -> Self {
        Backing::Memory(bounds)
    }
}

impl Backing {
    /// A store of `rules` for the limit `id`, in memory on `clock`.
    ///
    /// # Errors
    ///
    /// The engine's refusal of the rules (in memory), or the library's of
    /// the URL, the leases' term or the rules (Redis), as it says it.
    #[cfg_attr(
        not(feature = "redis"),
        expect(unused_variables, reason = "`id` names a limit's keys in Redis")
    )]
    pub async fn store<C: Clock + Clone + 'static>(
        &self,
        id: &str,
        rules: &RuleSet,
        clock: &C,
    ) -> Result<Store, Refused> {
        match self {
            Backing::Memory(bounds) => floodgate::Builder::from_rules(rules)
                .bounds(*bounds)
                .counting(true)
                .offenders(super::decide::OFFENDERS)
                .clock(clock.clone())
                .build::<str>()
                .map(Store::Memory)
                .map_err(|error| Refused::Rules(error.to_string())),
            #[cfg(feature = "redis")]
            Backing::Redis { url, options } => {
                let options = options.clone().prefix(redis_prefix(id));
                use floodgate::redis::RedisConfigError;
                crate::stores::open_redis(url, rules, options)
                    .await
                    .map(Store::Redis)
                    .map_err(|error| match error {
                        RedisConfigError::Url(_) => {
                            Refused::Flags(format!("--backend {url}: {error}"))
                        }
                        RedisConfigError::Leasing(_) => {
                            Refused::Flags(format!("--lease-term: {error}"))
                        }
                        error => Refused::Rules(error.to_string()),
                    })
            }
        }
    }
}

/// Why a store was not built.
#[derive(Debug)]
pub enum Refused {
    /// The flags, whatever the limit: the whole message.
    Flags(String),
    /// The limit's rules: why.
    Rules(String),
}

/// One limit's store.
#[derive(Clone)]
pub enum Store {
    /// The lock-free engine: decided on the calling task, nothing awaited.
    Memory(Arc<dyn RateLimiter<str>>),
    /// A script call on Redis a decision (or a lease's units spent here).
    #[cfg(feature = "redis")]
    Redis(AsyncRedisLimiter),
}

/// What an admission needs to be given back.
pub enum Admitted {
    /// In memory: the decision is enough.
    Memory,
    /// In Redis: the admission's handle (its key, decision and cost).
    #[cfg(feature = "redis")]
    Redis(Admission<String>),
    /// In Redis, decided rule by rule (`--response-headers`): given back
    /// as the HTTP layer gives its admissions back, once, at most their
    /// cost.
    #[cfg(feature = "redis")]
    RedisRuled,
}

impl Store {
    /// The in-memory limiter, if this is one.
    pub fn memory(&self) -> Option<&Arc<dyn RateLimiter<str>>> {
        match self {
            Store::Memory(limiter) => Some(limiter),
            #[cfg(feature = "redis")]
            Store::Redis(_) => None,
        }
    }

    /// Decides `cost` units of `key`, all or nothing; what an admission
    /// needs to be given back beside the decision. In memory this is the
    /// engine's `check_n`, which returns at once.
    pub async fn check_n(&self, key: &str, cost: u64) -> (Decision, Admitted) {
        match self {
            Store::Memory(limiter) => (limiter.check_n(key, cost), Admitted::Memory),
            #[cfg(feature = "redis")]
            Store::Redis(redis) => match redis.admit_n(key, cost).await {
                Ok(admission) => (*admission.decision(), Admitted::Redis(admission)),
                Err(refused) => (refused, Admitted::Memory),
            },
        }
    }

    /// [`check_n`](Self::check_n) with each rule's own answer, for the
    /// response headers: in memory the engine's `check_ruled_n_at`, in
    /// Redis the HTTP layer's check.
    pub async fn check_ruled_n(&self, key: &str, cost: u64) -> (RuledDecision<'_>, Admitted) {
        match self {
            Store::Memory(limiter) => (
                limiter.check_ruled_n_at(key, limiter.now(), cost),
                Admitted::Memory,
            ),
            #[cfg(feature = "redis")]
            Store::Redis(redis) => (
                floodgate::http::AsyncLimiter::<str>::check_ruled_n(redis, key, cost).await,
                Admitted::RedisRuled,
            ),
        }
    }

    /// Releases up to `cost` units `key` holds under its `in-flight` rules:
    /// the units released (in Redis, 0 when Redis fails: they are held
    /// until their lease ends or they are released again).
    pub async fn release(&self, key: &str, cost: u64) -> u64 {
        match self {
            Store::Memory(limiter) => limiter.release(key, cost),
            #[cfg(feature = "redis")]
            Store::Redis(redis) => redis.release(key, cost).await,
        }
    }

    /// Gives back the `cost` units that `decision` admitted for `key`
    /// ([`RateLimiter::refund_admitted`]; in Redis, its refund of the
    /// admission, 0 when Redis fails): the units given back.
    pub async fn refund_admitted(
        &self,
        key: &str,
        decision: &Decision,
        admitted: Admitted,
        cost: u64,
    ) -> u64 {
        match (self, admitted) {
            (Store::Memory(limiter), _) => limiter.refund_admitted(key, decision, cost),
            #[cfg(feature = "redis")]
            (Store::Redis(redis), Admitted::Redis(admission)) => {
                redis.refund(admission, cost).await
            }
            #[cfg(feature = "redis")]
            (Store::Redis(redis), Admitted::RedisRuled) => {
                floodgate::http::AsyncLimiter::<str>::refund_in(redis, None, key, decision, cost)
                    .await
            }
            // A refusal holds nothing to give back.
            #[cfg(feature = "redis")]
            (Store::Redis(_), Admitted::Memory) => 0,
        }
    }
}

/// The first part of every Redis key of the limit `id` (module docs).
pub fn redis_prefix(id: &str) -> String {
    use std::fmt::Write as _;
    let mut prefix = String::from("floodgate-rls:");
    for byte in id.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-') {
            prefix.push(char::from(byte));
        } else {
            let _ = write!(prefix, "%{byte:02X}");
        }
    }
    prefix
}
