//! Reserve, then settle: a request admitted at the most it may cost (an
//! LLM call's `max_tokens`, an upload's declared size) gives back what it
//! did not use once it knows, exactly as the contract's "Giving units back"
//! says, and never more than it reserved.

use std::borrow::Borrow;
use std::fmt;

use crate::{Admission, Decision, RateLimiter};

/// What a [`Reservation`] dropped unsettled does with the units it holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Unsettled {
    /// Gives them all back (the default): a reservation dropped before it
    /// was settled is a request that was cancelled, or failed, before it
    /// could say what it used (a future dropped when its client went away,
    /// an early `?`), and such a request should not count.
    #[default]
    GiveBack,
    /// Keeps them spent: for work that may have used everything before it
    /// failed (the upstream was called), where giving back would let a
    /// client past its limit by failing on purpose.
    Keep,
}

/// Units of one client's limit admitted at the most a request may cost,
/// held until the request says what it used.
///
/// [`settle`](Self::settle) gives back what was not used; dropping it
/// unsettled gives back everything or nothing, as chosen when it was made
/// ([`Unsettled`]). Its units are given back once at most, and never more
/// than it reserved: it holds its [`Admission`], which its end consumes.
/// Its end is its request's end, however it comes (settled, kept, dropped,
/// unwound): the units its `in-flight` rules hold are released there,
/// once.
///
/// ```
/// use floodgate::reservation::Reservation;
/// use floodgate::{build_with, Config, Engine, ManualClock, PolicyKind, RateLimiter};
///
/// let clock = ManualClock::new(0);
/// let tokens = build_with::<str, _>(
///     PolicyKind::FixedWindow,
///     Config::per_ticks(1_000, 60_000)?,
///     Engine::LockFree,
///     clock.clone(),
/// )?;
/// // Admitted at its `max_tokens`...
/// let call = Reservation::new(&*tokens, "app", 400).expect("400 of 1,000 left");
/// assert_eq!(tokens.remaining("app"), 600);
/// // ...and charged what the completion used.
/// assert_eq!(call.settle(120), 280);
/// assert_eq!(tokens.remaining("app"), 880);
///
/// // Dropped unsettled (cancelled): all of it comes back.
/// drop(Reservation::new(&*tokens, "app", 500).expect("880 left"));
/// assert_eq!(tokens.remaining("app"), 880);
/// # Ok::<(), floodgate::ConfigError>(())
/// ```
pub struct Reservation<'l, Q, L>
where
    Q: ?Sized + ToOwned,
    L: ?Sized + RateLimiter<Q>,
{
    limiter: &'l L,
    /// The admission, until the reservation ends (settled, kept or
    /// dropped): its refund gives back at most what it took, once.
    admission: Option<Admission<Q::Owned>>,
    unsettled: Unsettled,
}

impl<'l, Q, L> Reservation<'l, Q, L>
where
    Q: ?Sized + ToOwned,
    L: ?Sized + RateLimiter<Q>,
{
    /// Admits `units` of `key`'s limit now, to be settled; dropped
    /// unsettled, it gives them all back ([`Unsettled::GiveBack`]).
    ///
    /// # Errors
    ///
    /// The refusal, when the limiter does not admit `units` now.
    pub fn new(limiter: &'l L, key: &Q, units: u64) -> Result<Self, Decision> {
        Self::with(limiter, key, units, Unsettled::GiveBack)
    }

    /// [`new`](Self::new), with what a drop unsettled does.
    ///
    /// # Errors
    ///
    /// The refusal, when the limiter does not admit `units` now.
    pub fn with(
        limiter: &'l L,
        key: &Q,
        units: u64,
        unsettled: Unsettled,
    ) -> Result<Self, Decision> {
        let admission = limiter.admit_n(key, units)?;
        Ok(Self {
            limiter,
            admission: Some(admission),
            unsettled,
        })
    }

    /// The admission's decision.
    pub fn decision(&self) -> &Decision {
        self.admission().decision()
    }

    /// The units reserved.
    pub fn units(&self) -> u64 {
        self.admission().cost()
    }

    /// Charges `used` of the units reserved and gives back the rest;
    /// answers the units given back (less than the rest when a policy has
    /// less to take back: the window it was admitted in ended, or a
    /// bucket refilled meanwhile). A `used` above the reservation keeps it
    /// all: a limiter takes nothing after the fact. The request has ended:
    /// what its `in-flight` rules hold is released (a refund gives those
    /// rules nothing: under `in-flight` rules alone the answer is 0).
    pub fn settle(mut self, used: u64) -> u64 {
        let admission = self.take();
        let rest = admission.cost().saturating_sub(used);
        self.end(admission, rest)
    }

    /// Keeps every unit reserved spent, as a settle of all of them (what
    /// `in-flight` rules hold is released: the request has ended).
    pub fn keep(mut self) {
        let admission = self.take();
        self.end(admission, 0);
    }

    fn admission(&self) -> &Admission<Q::Owned> {
        self.admission
            .as_ref()
            .expect("a reservation holds its admission until it ends")
    }

    fn take(&mut self) -> Admission<Q::Owned> {
        self.admission
            .take()
            .expect("a reservation ends once: settle and keep take it by value")
    }

    /// The request's end, reached once (settle, keep or drop, on an unwind
    /// too): its `in-flight` units released, `rest` of its units given
    /// back. Answers the units given back.
    fn end(&self, admission: Admission<Q::Owned>, rest: u64) -> u64 {
        // Units held under `in-flight` rules come back by release, never
        // by refund (the contract's "Giving units back"); a limiter
        // without such rules holds nothing and releases 0. Never before
        // the admission: a clock read on another thread may be a few
        // ticks behind it.
        let now = self.limiter.now().max(admission.at_ticks());
        self.limiter
            .release_at(admission.key().borrow(), now, admission.cost());
        if rest == 0 {
            return 0;
        }
        self.limiter.refund(admission, rest)
    }
}

impl<Q, L> Drop for Reservation<'_, Q, L>
where
    Q: ?Sized + ToOwned,
    L: ?Sized + RateLimiter<Q>,
{
    /// Unsettled: gives back what it holds, or keeps it, as made; on an
    /// unwind too. Either way the request has ended: its `in-flight` units
    /// are released.
    fn drop(&mut self) {
        if let Some(admission) = self.admission.take() {
            let rest = match self.unsettled {
                Unsettled::GiveBack => admission.cost(),
                Unsettled::Keep => 0,
            };
            self.end(admission, rest);
        }
    }
}

impl<Q, L> fmt::Debug for Reservation<'_, Q, L>
where
    Q: ?Sized + ToOwned,
    Q::Owned: fmt::Debug,
    L: ?Sized + RateLimiter<Q>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("admission", &self.admission)
            .field("unsettled", &self.unsettled)
            .finish_non_exhaustive()
    }
}
