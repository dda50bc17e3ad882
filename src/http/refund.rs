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

/// An admission the layer may still give back: its limiter, and the
/// [`Admission`](crate::Admission) itself (key, tier, decision, cost), so a
/// refund gives back at most its cost, once, as the library's does.
/// Dropped while `on_drop` (the request was cancelled before its response:
/// the future was dropped), it gives its units back.
pub(crate) struct Admission<L, K>
where
    L: AsyncLimiter<K::Query> + 'static,
    K: Key,
{
    limiter: Arc<L>,
    admission: Option<crate::Admission<K>>,
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
            admission: Some(crate::Admission::new(key, tier.as_deref(), decision, cost)),
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
        let Some(admission) = self.admission.take() else {
            return 0;
        };
        let cost = admission.cost();
        refund(&*self.limiter, admission, cost).await
    }

    /// What the response body runs when it ends (or is dropped, the
    /// client gone): gives back the part of the cost `used` says the
    /// response did not use, read from `head` then.
    pub(crate) fn settle_at_end(mut self, used: Used, head: response::Parts) -> OnEnd {
        let admission = self.admission.take();
        let limiter = Arc::clone(&self.limiter);
        Box::new(move || {
            let Some(admission) = admission else { return };
            // A response that says nothing keeps the whole cost; one that
            // says it used more than it was admitted for gives nothing back.
            let unused = used(&head).map_or(0, |used| admission.cost().saturating_sub(used));
            if unused > 0 {
                detached(limiter, admission, unused);
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
        if let Some(admission) = self.admission.take() {
            let cost = admission.cost();
            detached(Arc::clone(&self.limiter), admission, cost);
        }
    }
}

/// Gives back up to `units` of `admission` (never more than its cost: the
/// refund takes it) through the layer's limiter.
async fn refund<L, K>(limiter: &L, admission: crate::Admission<K>, units: u64) -> u64
where
    L: AsyncLimiter<K::Query> + 'static,
    K: Key,
{
    let (key, tier, decision, units) = admission.into_refund(units);
    if units == 0 {
        return 0;
    }
    limiter
        .refund_in(tier.as_deref(), key.query(), &decision, units)
        .await
}

/// Gives `units` of `admission` back from a destructor, which cannot wait
/// ([`run_detached`]).
fn detached<L, K>(limiter: Arc<L>, admission: crate::Admission<K>, units: u64)
where
    L: AsyncLimiter<K::Query> + 'static,
    K: Key,
{
    run_detached(async move {
        refund(&*limiter, admission, units).await;
    });
}

/// Runs `work` (a refund, a release) from a destructor, which cannot wait:
/// a limiter in memory answers at the first poll; a store that waits on
/// the network (Redis) finishes on the current tokio runtime, or, with
/// none, gives nothing back (the units stay spent: never given twice).
pub(crate) fn run_detached(work: impl Future<Output = ()> + Send + 'static) {
    let mut work = Box::pin(work);
    let mut context = Context::from_waker(Waker::noop());
    if work.as_mut().poll(&mut context).is_pending()
        && let Ok(runtime) = tokio::runtime::Handle::try_current()
    {
        runtime.spawn(work);
    }
}
