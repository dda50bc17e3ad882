//! One `ShouldRateLimit` answered: a request's descriptors matched to their
//! limits ([`Config::applied_limits`]), each limit decided by its own
//! limiter, and the request admitted in all of them or in none.
//!
//! All or nothing: each limited descriptor is checked in the request's
//! order, and when one refuses, the units the ones before it took are
//! given back ([`Store::refund_admitted`]), so a refused request
//! spends nothing. This differs from envoyproxy/ratelimit on purpose: it
//! counts a request's hits in every descriptor, a refused one's too, so a
//! client refused by one limit spends another's quota for nothing. Between
//! a descriptor's check and its refund, another request for the same
//! client may find those units spent and be refused: the race can only
//! refuse, never admit past a limit.
//!
//! Each limit's store is in memory or in Redis ([`Backing`]): in memory a
//! decision awaits nothing; in Redis each limited descriptor is a call
//! there, one after another, and so is each refund.

use std::collections::HashMap;
use std::sync::Arc;

use floodgate::{Clock, Decision, PolicyKind, RateLimiter, RuleSet};

use super::config::{Config, Limit, Quota, Unit};
use super::matching::DescriptorEntry;
use super::metrics::LimitStats;
use super::proto::{
    Code, DescriptorStatus, Entry, RateLimit, RateLimitRequest, RateLimitResponse,
    Unit as ProtoUnit,
};
use super::store::{Admitted, Backing, Refused, Store};

/// The most descriptors one request may carry. Envoy sends one per
/// `rate_limits` action that applied, a handful; a request past this is
/// refused as invalid before anything is decided.
pub const MAX_DESCRIPTORS: usize = 1_024;

/// The most bytes of keys and values one descriptor may carry. Its entries
/// are the client's key in its limit's limiter, kept as long as the client
/// is: a 1 MB header value would be a 1 MB client.
pub const MAX_DESCRIPTOR_BYTES: usize = 4_096;

/// Why a request was not decided: the gRPC status `INVALID_ARGUMENT`,
/// with this message. Nothing was spent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub String);

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl DescriptorEntry for Entry {
    fn key(&self) -> &str {
        &self.key
    }

    fn value(&self) -> &str {
        &self.value
    }
}

/// A configuration with a limiter for each of its limits that counts.
pub struct Limits {
    config: Config,
    /// Every limit but `unlimited` (never counted), by [`Limit::id`]: one
    /// look-up a descriptor.
    counted: HashMap<String, Counted>,
    /// Whether every store is in memory: a decision then awaits nothing.
    in_memory_only: bool,
}

/// A counted limit's store and hits.
struct Counted {
    /// None for `requests_per_unit: 0`, which refuses without one.
    store: Option<Store>,
    /// The rules the store was built with, to tell at a reload whether
    /// they changed.
    rules: Option<RuleSet>,
    /// Carried across reloads, so that counters never go back.
    stats: Arc<LimitStats>,
}

impl Counted {
    /// Its store, if it was built with `rules`: a reload keeps it.
    fn kept(&self, rules: &RuleSet) -> Option<Store> {
        self.store
            .as_ref()
            .filter(|_| self.rules.as_ref() == Some(rules))
            .cloned()
    }
}

impl Limits {
    /// A store for every limit of `config`, as `backing` says: in memory
    /// on `clock`, each holding at most its bounds' clients, or in Redis.
    ///
    /// # Errors
    ///
    /// A limit with an `in-flight` rule, which no call would release, or
    /// rules the store refuses (none that the configuration checked should
    /// be in memory): the limit's file, line and id, and why.
    pub async fn new<C: Clock + Clone + 'static>(
        config: Config,
        backing: impl Into<Backing>,
        clock: C,
    ) -> Result<Self, String> {
        Self::keeping(config, &backing.into(), clock, &HashMap::new())
            .await
            .map(|(limits, _)| limits)
    }

    /// The stores of `config`, keeping this one's for every limit whose
    /// id and rules are unchanged, with what its clients spent: a reload.
    /// A limit whose rules changed starts afresh. Also says how many
    /// stores were kept.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); this one is unchanged then.
    pub async fn reloaded<C: Clock + Clone + 'static>(
        &self,
        config: Config,
        backing: &Backing,
        clock: C,
    ) -> Result<(Self, usize), String> {
        Self::keeping(config, backing, clock, &self.counted).await
    }

    async fn keeping<C: Clock + Clone + 'static>(
        config: Config,
        backing: &Backing,
        clock: C,
        old: &HashMap<String, Counted>,
    ) -> Result<(Self, usize), String> {
        let mut counted = HashMap::new();
        let mut kept = 0;
        for domain in config.domains() {
            for limit in domain.limits() {
                if limit.is_unlimited() {
                    continue;
                }
                let before = old.get(&limit.id);
                let store = match limit.rules() {
                    None => None,
                    Some(rules) => {
                        // A unit of `in-flight` is held until its request
                        // ends, which a `ShouldRateLimit` call does not
                        // say: nothing would release it, and the client
                        // would be locked out after N calls.
                        if rules
                            .rules()
                            .iter()
                            .any(|rule| rule.policy() == PolicyKind::InFlight)
                        {
                            return Err(format!(
                                "{}: {}: `in-flight` rules are not served: a rate-limit call \
                                 never says when its request ends, so nothing would release \
                                 them",
                                limit.origin, limit.id
                            ));
                        }
                        Some(match before.and_then(|b| b.kept(rules)) {
                            Some(store) => {
                                kept += 1;
                                store
                            }
                            None => built(backing, limit, rules, &clock).await?,
                        })
                    }
                };
                let stats = before.map(|b| Arc::clone(&b.stats)).unwrap_or_default();
                let rules = limit.rules().cloned();
                counted.insert(
                    limit.id.clone(),
                    Counted {
                        store,
                        rules,
                        stats,
                    },
                );
            }
        }
        let in_memory_only = counted
            .values()
            .all(|counted| counted.store.as_ref().is_none_or(|s| s.memory().is_some()));
        Ok((
            Self {
                config,
                counted,
                in_memory_only,
            },
            kept,
        ))
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Every counted limit's id and hits, in no set order.
    pub fn stats(&self) -> impl Iterator<Item = (&str, &LimitStats)> {
        self.counted
            .iter()
            .map(|(id, counted)| (id.as_str(), &*counted.stats))
    }

    /// The in-memory limiter of the limit with `id`, if it counts in
    /// memory.
    pub fn limiter(&self, id: &str) -> Option<&Arc<dyn RateLimiter<str>>> {
        self.counted.get(id)?.store.as_ref()?.memory()
    }

    /// Every limit counted in memory: its id, limiter and rules.
    pub fn in_memory(&self) -> impl Iterator<Item = (&str, &Arc<dyn RateLimiter<str>>)> {
        self.counted
            .iter()
            .filter_map(|(id, counted)| Some((id.as_str(), counted.store.as_ref()?.memory()?)))
    }

    /// Whether every store is in memory: a decision then awaits nothing.
    pub fn all_in_memory(&self) -> bool {
        self.in_memory_only
    }

    /// The first store in Redis, if there is one.
    #[cfg(feature = "redis")]
    pub fn any_redis(&self) -> Option<&floodgate::redis::AsyncRedisLimiter> {
        self.counted
            .values()
            .find_map(|counted| match counted.store.as_ref()? {
                Store::Redis(redis) => Some(redis),
                Store::Memory(_) => None,
            })
    }

    /// Answers `request`: every limited descriptor admitted, or none.
    ///
    /// # Errors
    ///
    /// [`Invalid`] for a request with no domain, no descriptors, more than
    /// [`MAX_DESCRIPTORS`], a descriptor with no entries or more than
    /// [`MAX_DESCRIPTOR_BYTES`]: nothing is spent.
    pub async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Invalid> {
        validate(request)?;
        let limits = self.config.applied_limits(
            &request.domain,
            request.descriptors.iter().map(|d| d.entries.iter()),
        );
        let request_cost = u64::from(request.hits_addend.max(1));
        let mut statuses = Vec::with_capacity(limits.len());
        // What each admitted descriptor took, to give back if another
        // refuses; the keys of every descriptor, one after another.
        let mut taken: Vec<Taken<'_>> = Vec::new();
        let mut keys = String::new();
        let mut refused = false;
        for (index, (descriptor, limit)) in request.descriptors.iter().zip(&limits).enumerate() {
            let Some(limit) = limit else {
                statuses.push(ok_unlimited(None));
                continue;
            };
            if limit.is_unlimited() {
                statuses.push(ok_unlimited(Some(u32::MAX)));
                continue;
            }
            let current = current_limit(limit);
            let limit_count = u64::from(current.requests_per_unit);
            // A descriptor's own `hits_addend` over the request's; 0 means 1.
            let cost = descriptor
                .hits_addend
                .map_or(request_cost, |addend| addend.value.max(1));
            // Built from this configuration: every limit but `unlimited`
            // has its entry.
            let counted = &self.counted[&limit.id];
            let start = keys.len();
            let (decision, admitted) = match &counted.store {
                Some(store) => {
                    client_key(&mut keys, &descriptor.entries);
                    store.check_n(&keys[start..], cost).await
                }
                // `requests_per_unit: 0`: every request refused, never
                // admitted.
                None => (Decision::never_admitted(0), Admitted::Memory),
            };
            counted.stats.count(
                cost,
                decision.allowed(),
                limit.shadow_mode,
                limit_count,
                decision.remaining(),
            );
            let code = if decision.allowed() {
                if let Some(store) = &counted.store {
                    taken.push(Taken {
                        status: index,
                        store,
                        key: start..keys.len(),
                        decision,
                        admitted,
                        cost,
                    });
                }
                Code::Ok
            } else if limit.shadow_mode {
                // Decided and counted as refused, but let through.
                Code::Ok
            } else {
                refused = true;
                Code::OverLimit
            };
            statuses.push(DescriptorStatus {
                code: code as i32,
                current_limit: Some(current),
                limit_remaining: saturate(decision.remaining()),
                duration_until_reset: (!decision.allowed())
                    .then(|| decision.retry_after())
                    .flatten()
                    .map(Into::into),
            });
        }
        if refused {
            for taken in taken {
                let given = taken
                    .store
                    .refund_admitted(
                        &keys[taken.key],
                        &taken.decision,
                        taken.admitted,
                        taken.cost,
                    )
                    .await;
                statuses[taken.status].limit_remaining =
                    saturate(taken.decision.remaining().saturating_add(given));
            }
        }
        Ok(RateLimitResponse {
            overall_code: if refused { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: Vec::new(),
        })
    }
}

/// A new store of `rules` for `limit`; an error names its file, line and
/// id.
async fn built<C: Clock + Clone + 'static>(
    backing: &Backing,
    limit: &Limit,
    rules: &RuleSet,
    clock: &C,
) -> Result<Store, String> {
    backing
        .store(&limit.id, rules, clock)
        .await
        .map_err(|refused| match refused {
            Refused::Flags(message) => message,
            Refused::Rules(why) => format!("{}: {}: {why}", limit.origin, limit.id),
        })
}

/// What one admitted descriptor took.
struct Taken<'a> {
    /// Its status's index in the answer.
    status: usize,
    store: &'a Store,
    /// Its client key's place among the request's keys.
    key: std::ops::Range<usize>,
    decision: Decision,
    admitted: Admitted,
    cost: u64,
}

/// Refuses what cannot be decided, before anything is spent.
fn validate(request: &RateLimitRequest) -> Result<(), Invalid> {
    if request.domain.is_empty() {
        return Err(Invalid("the request names no domain".into()));
    }
    if request.descriptors.is_empty() {
        return Err(Invalid("the request has no descriptors".into()));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(Invalid(format!(
            "the request has {} descriptors, over the {MAX_DESCRIPTORS} this service takes",
            request.descriptors.len()
        )));
    }
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() {
            return Err(Invalid(format!("descriptor {index} has no entries")));
        }
        let bytes: usize = descriptor
            .entries
            .iter()
            .map(|entry| entry.key.len() + entry.value.len())
            .sum();
        if bytes > MAX_DESCRIPTOR_BYTES {
            return Err(Invalid(format!(
                "descriptor {index}'s keys and values are {bytes} bytes, over the \
                 {MAX_DESCRIPTOR_BYTES} this service takes"
            )));
        }
    }
    Ok(())
}

/// Appends a descriptor's client key to `keys`: every key and value with
/// its length before it, so that no two lists of entries give the same
/// key (`a=b,c` and `a=b` `c=` would, joined by separators alone).
fn client_key(keys: &mut String, entries: &[Entry]) {
    use std::fmt::Write as _;
    for entry in entries {
        let _ = write!(
            keys,
            "{}:{}{}:{}",
            entry.key.len(),
            entry.key,
            entry.value.len(),
            entry.value
        );
    }
}

/// The status of a descriptor no limit counts: none matched (no
/// `current_limit`, nothing remaining, as the reference answers), or an
/// `unlimited` one (`u32::MAX` remaining).
fn ok_unlimited(remaining: Option<u32>) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        current_limit: None,
        limit_remaining: remaining.unwrap_or(0),
        duration_until_reset: None,
    }
}

/// The limit as the protocol says it: a unit and a count, or for this
/// crate's rules, the first rule's limit, in a unit when its window is one
/// (else `UNKNOWN`).
fn current_limit(limit: &Limit) -> RateLimit {
    let (requests_per_unit, unit) = match &limit.quota {
        Quota::PerUnit {
            unit,
            requests_per_unit,
            ..
        } => (*requests_per_unit, proto_unit(*unit)),
        Quota::Rules(rules) => {
            let rule = rules.rules()[0];
            let config = rule.config();
            let unit = config
                .span()
                .and_then(|span| Unit::ALL.into_iter().find(|unit| unit.duration() == span))
                .map_or(ProtoUnit::Unknown, proto_unit);
            (saturate(config.limit()), unit)
        }
        Quota::Unlimited => (0, ProtoUnit::Unknown),
    };
    RateLimit {
        name: limit.name.clone().unwrap_or_default(),
        requests_per_unit,
        unit: unit as i32,
    }
}

fn proto_unit(unit: Unit) -> ProtoUnit {
    match unit {
        Unit::Second => ProtoUnit::Second,
        Unit::Minute => ProtoUnit::Minute,
        Unit::Hour => ProtoUnit::Hour,
        Unit::Day => ProtoUnit::Day,
        Unit::Week => ProtoUnit::Week,
        Unit::Month => ProtoUnit::Month,
        Unit::Year => ProtoUnit::Year,
    }
}

/// A count in the protocol's 32 bits: past them, all of them.
fn saturate(count: u64) -> u32 {
    u32::try_from(count).unwrap_or(u32::MAX)
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
