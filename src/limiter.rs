//! The strategy trait every limiter implements, so a call site never knows
//! which policy or engine it holds.

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;

use crate::policy::Policy;
use crate::store::KeyedStore;
use crate::{Clock, Config, Decision, PolicyKind, QuantaClock};

/// A per-client rate limiter: one decision per request.
///
/// `Q` is the type a client is looked up by: `str` for a `String`-keyed
/// limiter, `u64` for a `u64`-keyed one. Every implementation in this crate
/// is `Send + Sync` and meant to be shared by reference (or in an `Arc`)
/// across threads.
///
/// The `*_at` forms take the time explicitly (exact and repeatable); the
/// others read the limiter's own clock.
///
/// ```
/// use floodgate::{build, Config, PolicyKind, RateLimiter};
///
/// let limiter = build::<str>(PolicyKind::TokenBucket, Config::new(2, 1_000)?)?;
/// assert!(limiter.check_at("app", 0).allowed);
/// assert!(limiter.check_at("app", 10).allowed);
/// let third = limiter.check_at("app", 20);
/// assert!(!third.allowed);
/// assert_eq!(third.retry_after, 480); // the first drip is at 500
/// # Ok::<(), floodgate::ConfigError>(())
/// ```
pub trait RateLimiter<Q: ?Sized>: Send + Sync {
    /// Decides one request of client `key` at time `now` (in ticks).
    ///
    /// The first call for a client, this or [`remaining_at`](Self::remaining_at),
    /// creates its state with `now` as its origin.
    fn check_at(&self, key: &Q, now: u64) -> Decision;

    /// How many requests of `key` would be admitted if they arrived one after
    /// another at `now`. Changes nothing, except that it creates the client.
    fn remaining_at(&self, key: &Q, now: u64) -> u64;

    /// The limiter's clock, in ticks.
    fn now(&self) -> u64;

    /// The policy this limiter applies.
    fn policy(&self) -> PolicyKind;

    /// The limit and window this limiter applies.
    fn config(&self) -> Config;

    /// How many clients have state right now.
    fn tracked_clients(&self) -> usize;

    /// Decides one request of `key` now, by the limiter's clock.
    #[inline]
    fn check(&self, key: &Q) -> Decision {
        self.check_at(key, self.now())
    }

    /// [`remaining_at`](Self::remaining_at) now, by the limiter's clock.
    #[inline]
    fn remaining(&self, key: &Q) -> u64 {
        self.remaining_at(key, self.now())
    }

    /// Whether one request of `key` is admitted now.
    #[inline]
    fn allow(&self, key: &Q) -> bool {
        self.check(key).allowed
    }
}

/// The lock-free limiter: one policy, per-client state in a concurrent map,
/// and a clock. Generic over the policy, so each check compiles to that
/// policy's code with no dynamic dispatch; [`build`](crate::build) gives the
/// same behind `Box<dyn RateLimiter>` when the policy is chosen at run time.
///
/// A check for a known client takes no lock and allocates nothing; the first
/// check of a new client allocates its state and takes one bucket lock of the
/// map to insert it.
///
/// ```
/// use floodgate::policy::{Policy, SlidingWindow};
/// use floodgate::{Config, Limiter, ManualClock};
///
/// let clock = ManualClock::new(0);
/// let limiter: Limiter<String, SlidingWindow, _> =
///     Limiter::with_clock(SlidingWindow::new(Config::new(3, 1_000)?)?, clock.clone());
/// for _ in 0..3 {
///     assert!(limiter.check("rahul").allowed);
/// }
/// let fourth = limiter.check("rahul");
/// assert!(!fourth.allowed);
/// assert_eq!(fourth.retry_after, 1_000);
/// assert!(limiter.check("priya").allowed); // clients never share state
/// # Ok::<(), floodgate::ConfigError>(())
/// ```
pub struct Limiter<K, P: Policy, C = QuantaClock> {
    policy: P,
    clients: KeyedStore<K, P::State>,
    clock: C,
}

impl<K, P> Limiter<K, P, QuantaClock>
where
    K: Hash + Eq + Clone + 'static,
    P: Policy,
{
    /// A limiter applying `policy`, on the default clock (nanoseconds).
    pub fn new(policy: P) -> Self {
        Self::with_clock(policy, QuantaClock::new())
    }
}

impl<K, P, C> Limiter<K, P, C>
where
    K: Hash + Eq + Clone + 'static,
    P: Policy,
    C: Clock,
{
    /// A limiter applying `policy`, reading `clock`.
    pub fn with_clock(policy: P, clock: C) -> Self {
        Self {
            policy,
            clients: KeyedStore::new(),
            clock,
        }
    }

    /// The policy's parameters.
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// Decides one request of `key` at `now` (see [`RateLimiter::check_at`]).
    #[inline]
    pub fn check_at<Q>(&self, key: &Q, now: u64) -> Decision
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        self.clients.with_client(
            key,
            now,
            || self.policy.new_state(),
            |client| match now.checked_sub(client.origin) {
                Some(since) => self.policy.check(&client.state, since),
                // Raced with the thread that created the client at a
                // slightly later time: judge at the origin.
                None => {
                    let decision = self.policy.check(&client.state, 0);
                    self.policy
                        .measured_from_earlier(decision, client.origin - now)
                }
            },
        )
    }

    /// How many requests of `key` would be admitted at `now` (see
    /// [`RateLimiter::remaining_at`]).
    #[inline]
    pub fn remaining_at<Q>(&self, key: &Q, now: u64) -> u64
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        self.clients.with_client(
            key,
            now,
            || self.policy.new_state(),
            |client| {
                self.policy
                    .remaining(&client.state, now.saturating_sub(client.origin))
            },
        )
    }

    /// Decides one request of `key` now, by the limiter's clock.
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Decision
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        self.check_at(key, self.clock.now())
    }

    /// How many requests of `key` would be admitted now, by the limiter's
    /// clock.
    #[inline]
    pub fn remaining<Q>(&self, key: &Q) -> u64
    where
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
        K: Borrow<Q>,
    {
        self.remaining_at(key, self.clock.now())
    }

    /// How many clients have state.
    pub fn tracked_clients(&self) -> usize {
        self.clients.len()
    }
}

impl<K, P, C> fmt::Debug for Limiter<K, P, C>
where
    K: Hash + Eq + Clone + 'static,
    P: Policy + fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("policy", &self.policy)
            .field("tracked_clients", &self.clients.len())
            .finish_non_exhaustive()
    }
}

impl<K, Q, P, C> RateLimiter<Q> for Limiter<K, P, C>
where
    K: Borrow<Q> + Hash + Eq + Clone + Send + Sync + 'static,
    Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    P: Policy,
    C: Clock,
{
    #[inline]
    fn check_at(&self, key: &Q, now: u64) -> Decision {
        Limiter::check_at(self, key, now)
    }

    #[inline]
    fn remaining_at(&self, key: &Q, now: u64) -> u64 {
        Limiter::remaining_at(self, key, now)
    }

    #[inline]
    fn now(&self) -> u64 {
        self.clock.now()
    }

    fn policy(&self) -> PolicyKind {
        P::KIND
    }

    fn config(&self) -> Config {
        self.policy.config()
    }

    fn tracked_clients(&self) -> usize {
        self.clients.len()
    }
}
