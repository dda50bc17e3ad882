//! Units held while a request runs, released when it ends: the guard of the
//! contract's "Requests in flight". A [`Permit`] releases what it holds when
//! it is dropped, on an unwind too, so a request that returns early, fails
//! or panics cannot leave its client one slot short for ever.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;

use crate::{Decision, RateLimiter};

/// Units of one client's `in-flight` rules, admitted and held until the
/// permit is dropped or [`release`](Self::release)d.
///
/// `H` is how the permit reaches its limiter: a reference (`&limiter`)
/// for a permit that lives within one call, an [`Arc`](std::sync::Arc)
/// for one that moves into a spawned task or a response body (it is then
/// `'static`), as tokio's `SemaphorePermit` and `OwnedSemaphorePermit`.
///
/// Its units are released once at most: [`release`](Self::release) and
/// [`detach`](Self::detach) take the permit by value. A limiter without
/// `in-flight` rules admits a permit as any request and holds nothing, so
/// its release gives 0 back. Units are released by key: a client that was
/// [`forget`](RateLimiter::forget)-ten while a permit held its units
/// starts again from none held, and the permit's release then gives 0
/// back, unless the client was admitted again meanwhile, whose unit it
/// then releases (never more than is held). Forget a client only when
/// none of its requests run.
///
/// ```
/// use floodgate::permit::Permit;
/// use floodgate::{build_rules, Bounds, Engine, ManualClock, RateLimiter};
///
/// let jobs = build_rules::<str, _>(
///     &"in-flight:2".parse()?,
///     Engine::LockFree,
///     ManualClock::new(0),
///     Bounds::new(),
/// )?;
/// let first = Permit::acquire(&jobs, "alice", 1).expect("none running");
/// let second = Permit::acquire(&jobs, "alice", 1).expect("one running");
/// let third = Permit::acquire(&jobs, "alice", 1).unwrap_err();
/// assert_eq!(third.retry_after(), None); // only a release admits it
///
/// drop(first); // the job ended (or returned early, or panicked)
/// assert!(Permit::acquire(&jobs, "alice", 1).is_ok()); // dropped at once
/// assert_eq!(second.release(), 1);
/// assert_eq!(jobs.remaining("alice"), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Permit<Q, H>
where
    Q: ?Sized + ToOwned,
    H: Deref,
    H::Target: RateLimiter<Q>,
{
    limiter: H,
    key: Q::Owned,
    admitted: Decision,
    /// Units still held: released by `release` or the drop.
    held: u64,
}

impl<Q, H> Permit<Q, H>
where
    Q: ?Sized + ToOwned,
    H: Deref,
    H::Target: RateLimiter<Q>,
{
    /// Admits `units` of `key` now, by the limiter's clock, and holds them
    /// until the permit is dropped or released.
    ///
    /// # Errors
    ///
    /// The refusal, when the limiter does not admit `units` now: an
    /// `in-flight` rule's says no wait admits it (only a release does).
    pub fn acquire(limiter: H, key: &Q, units: u64) -> Result<Self, Decision> {
        let admitted = limiter.check_n(key, units);
        if !admitted.allowed() {
            return Err(admitted);
        }
        Ok(Self {
            limiter,
            key: key.to_owned(),
            admitted,
            held: units,
        })
    }

    /// The admission's decision.
    pub fn decision(&self) -> &Decision {
        &self.admitted
    }

    /// The units held.
    pub fn units(&self) -> u64 {
        self.held
    }

    /// The client's key.
    pub fn key(&self) -> &Q {
        self.key.borrow()
    }

    /// Releases the units now and answers how many the limiter gave back
    /// ([`RateLimiter::release`]): all of them, unless the client was
    /// forgotten meanwhile or the limiter has no `in-flight` rule.
    pub fn release(mut self) -> u64 {
        self.release_held()
    }

    /// Gives up the permit without releasing: the units stay held, and the
    /// caller releases them by key later ([`RateLimiter::release`]), for
    /// a request handed on to another task or process. Answers the units.
    pub fn detach(mut self) -> u64 {
        std::mem::take(&mut self.held)
    }

    fn release_held(&mut self) -> u64 {
        let held = std::mem::take(&mut self.held);
        if held == 0 {
            return 0;
        }
        // Never before the admission: a release by another thread's clock
        // reading (a TSC behind by a few ticks) is judged at the admission.
        let now = self.limiter.now().max(self.admitted.at);
        self.limiter.release_at(self.key.borrow(), now, held)
    }
}

impl<Q, H> Drop for Permit<Q, H>
where
    Q: ?Sized + ToOwned,
    H: Deref,
    H::Target: RateLimiter<Q>,
{
    /// Releases what it still holds: the request ended, returned early or
    /// unwound.
    fn drop(&mut self) {
        self.release_held();
    }
}

impl<Q, H> fmt::Debug for Permit<Q, H>
where
    Q: ?Sized + ToOwned,
    Q::Owned: fmt::Debug,
    H: Deref,
    H::Target: RateLimiter<Q>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("key", &self.key)
            .field("units", &self.held)
            .field("admitted", &self.admitted)
            .finish_non_exhaustive()
    }
}
