//! Releasing the units an admission holds under `in-flight` rules once its
//! response has ended: its body's last frame was read, or the body, the
//! response or the request's future was dropped (the client went away, the
//! inner service failed). A streamed response keeps its slot to the end.

use std::sync::Arc;

use super::extract::Key;
use super::limit::AsyncLimiter;
use super::refund::run_detached;

/// Units held for one admitted request: released once, when dropped.
pub(crate) struct Holding<L, K>
where
    L: AsyncLimiter<K::Query> + 'static,
    K: Key,
{
    limiter: Arc<L>,
    key: Option<K>,
    tier: Option<String>,
    cost: u64,
}

impl<L, K> Holding<L, K>
where
    L: AsyncLimiter<K::Query> + 'static,
    K: Key,
{
    /// `cost` units of `key`, admitted in `tier` (when the request named
    /// one), held until this is dropped.
    pub(crate) fn new(limiter: Arc<L>, key: K, tier: Option<String>, cost: u64) -> Self {
        Self {
            limiter,
            key: Some(key),
            tier,
            cost,
        }
    }
}

impl<L, K> Drop for Holding<L, K>
where
    L: AsyncLimiter<K::Query> + 'static,
    K: Key,
{
    /// Releases the units: the key is taken, so only once.
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let (limiter, tier, cost) = (Arc::clone(&self.limiter), self.tier.take(), self.cost);
        run_detached(async move {
            limiter.release_in(tier.as_deref(), key.query(), cost).await;
        });
    }
}
