//! placeholder
use crate::{Clock, Config, ConfigError, Decision, PolicyKind, QuantaClock, RateLimiter};
use std::borrow::Borrow;
use std::hash::Hash;
use std::marker::PhantomData;

/// The plain reference (being written).
pub struct MutexLimiter<K, C = QuantaClock> {
    k: PhantomData<fn() -> K>,
    c: C,
    p: PolicyKind,
    config: Config,
}
impl<K, C: Clock> MutexLimiter<K, C> {
    /// x
    pub fn with_clock(policy: PolicyKind, config: Config, clock: C) -> Result<Self, ConfigError> {
        Ok(Self {
            k: PhantomData,
            c: clock,
            p: policy,
            config: config.check_for(policy)?,
        })
    }
}
impl<K, Q, C> RateLimiter<Q> for MutexLimiter<K, C>
where
    K: Borrow<Q> + Hash + Eq + Send + Sync,
    Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    C: Clock,
{
    fn check_at(&self, _key: &Q, _now: u64) -> Decision {
        todo!()
    }
    fn remaining_at(&self, _key: &Q, _now: u64) -> u64 {
        todo!()
    }
    fn now(&self) -> u64 {
        self.c.now()
    }
    fn policy(&self) -> PolicyKind {
        self.p
    }
    fn config(&self) -> Config {
        self.config
    }
    fn tracked_clients(&self) -> usize {
        0
    }
}
