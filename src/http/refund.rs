//! Giving an admitted request's units back: when its response says it did
//! not count, when it was cancelled before its response, and the unused
//! part of what it was admitted for, once its body has ended.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Waker};

use http::response;
use http::StatusCode;

use super::extract::Key;
use super::limit::AsyncLimiter;
use crate::Decision;

/// Whether a response's status says its request did not count.
pub(crate) type RefundOn = Arc<dyn Fn(StatusCode) -> bool + Send + Sync>;

/// The units a response used, read from its head at the end of its body
/// (`None`: it does not say, and the admission keeps them all).
pub(crate) type Used = Arc<dyn Fn(&response::Parts) -> Option<u64> + Send + Sync>;

/// What runs once when a response body ends or is dropped.
pub(crate) type OnEnd = Box<dyn FnOnce() + Send>;

/// An admission the layer may still give back: its limiter, key, tier,
/// decision and cost. Dropped while `on_drop` (the request was cancelled
/// before its response: the future was dropped), it gives its units back.
pub(crate) struct Admission<L, K>
where
    L: AsyncLimiter<K::Query> + 'static,
    K: Key,
{
    limiter: Arc<L>,
    key: Option<K>,
    tier: Option<String>,
    decision: Decision,
    cost: u64,
    on_drop: bool,
}

impl<L, K> Admission<L, K>
where
    L: AsyncLimiter<K::Query> + 'static,
    K: Key,
{
    pub(crate) fn new(
        limiter: Arc<L>,
        key: K,
        tier: Option<String>,
        decision: Decision,
        cost: u64,
        on_drop: bool,
    ) -> Self {
        Self {
            limiter,
            key: Some(key),
            tier,
            decision,
            cost,
            on_drop,
        }
    }

    /// The response arrived: dropped from now on, the admission keeps its
    /// units.
    pub(crate) fn arrived(&mut self) {
        self.on_drop = false;
    }

    /// Gives the whole cost back now: the response said the request did
    /// not count.
    pub(crate) async fn give_back(mut self) -> u64 {
        let Some(key) = self.key.take() else {
            return 0;
        };
        let tier = self.tier.as_deref();
        self.limiter
            .refund_in(tier, key.query(), &self.decision, self.cost)
            .await
    }

    /// What the response body runs when it ends (or is dropped, the
    /// client gone): gives back the part of the cost `used` says the
    /// response did not use, read from `head` then.
    pub(crate) fn settle_at_end(mut self, used: Used, head: response::Parts) -> OnEnd {
        let key = self.key.take();
        let (limiter, tier, decision, cost) = (
            Arc::clone(&self.limiter),
            self.tier.take(),
            self.decision,
            self.cost,
        );
        Box::new(move || {
            let Some(key) = key else { return };
            // A response that says nothing keeps the whole cost; one that
            // says it used more than it was admitted for gives nothing back.
            let unused = used(&head).map_or(0, |used| cost.saturating_sub(used));
            if unused > 0 {
                detached(limiter, key, tier, decision, unused);
            }
        })
    }
}

impl<L, K> Drop for Admission<L, K>
where
    L: AsyncLimiter<K::Query> + 'static,
    K: Key,
{
    fn drop(&mut self) {
        if !self.on_drop {
            return;
        }
        if let Some(key) = self.key.take() {
            let tier = self.tier.take();
            detached(
                Arc::clone(&self.limiter),
                key,
                tier,
                self.decision,
                self.cost,
            );
        }
    }
}

/// Gives `cost` units of `decision` back from a destructor, which cannot
/// wait ([`run_detached`]).
fn detached<L, K>(limiter: Arc<L>, key: K, tier: Option<String>, decision: Decision, cost: u64)
where
    L: AsyncLimiter<K::Query> + 'static,
    K: Key,
{
    run_detached(async move {
        limiter
            .refund_in(tier.as_deref(), key.query(), &decision, cost)
            .await;
    });
}

/// Runs `work` (a refund, a release) from a destructor, which cannot wait:
/// a limiter in memory answers at the first poll; a store that waits on
/// the network (Redis) finishes on the current tokio runtime, or, with
/// none, gives nothing back (the units stay spent: never given twice).
pub(crate) fn run_detached(work: impl Future<Output = ()> + Send + 'static) {
    let mut work = Box::pin(work);
    let mut context = Context::from_waker(Waker::noop());
    if work.as_mut().poll(&mut context).is_pending() {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(work);
        }
    }
}
