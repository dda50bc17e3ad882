//! The mutex baseline: the six policies of `SPEC.md` (the decision contract
//! at the repository root) written out plainly, with a lock around each
//! client's state.
//!
//! It exists for two reasons. It is the **reference** the lock-free engine is
//! tested against: every state here is the spec's own description, kept as
//! literally as the arithmetic allows, so that a disagreement between the two
//! engines points at the lock-free one unless the spec says otherwise. And it
//! is the **baseline** the lock-free engine is measured against: the classic
//! design a service would write first. Nothing here is shared with
//! `src/policy/` or `src/cell.rs`; keep it that way, or the differential tests
//! would compare a reading of the spec with itself.
//!
//! # The states
//!
//! | policy | state per client |
//! | --- | --- |
//! | `sliding-window` | the times of the last `L` admissions, oldest first |
//! | `token-bucket` | the token count and the index of the last drip counted in it |
//! | `fixed-window` | the current window's index and its count |
//! | `sliding-window-counter` | the current window's index, the previous and current counts |
//! | `gcra`, `leaky-bucket` | the theoretical arrival time `TAT` |
//!
//! Times are ticks since the client's origin (the `now` of its first call) and
//! are held in `u64`; every product or sum that could pass `u64::MAX` (the
//! window may be as long as `u64::MAX` ticks) is computed in `u128`/`i128`,
//! and an answer that would not fit in a `u64` saturates.

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::{Clock, Config, ConfigError, Decision, PolicyKind, QuantaClock, RateLimiter};

/// The plain reference implementation of all six policies: a locked map from
/// client to a locked state.
///
/// Its answers are the contract read as literally as possible; the lock-free
/// engine ([`Limiter`]) is tested to give the same ones whenever a client's
/// times do not decrease. Build either with [`build_with`], choosing the
/// [`Engine`].
///
/// # Locking
///
/// Every call takes the map's lock only to find the client (or, on its first
/// call, to allocate and insert it), releases it, then takes that client's own
/// lock for the decision. Calls for different clients therefore contend on the
/// map lock for the length of one hash lookup; calls for the same client are
/// serialised by the client's lock. Nothing here is lock-free.
///
/// A panic while a lock is held cannot leave a state half-updated (every state
/// is valid between any two statements that change it), so a poisoned lock is
/// taken over rather than propagated.
///
/// # Time going backwards
///
/// On a real clock threads race, so a call can carry a `now` earlier than a
/// time the client's state already reflects. Each policy then judges the call
/// at the latest time its state reflects (the newest admission, the last
/// counted drip, the start of the current window; GCRA's `max(TAT, now)` does
/// this by itself) and measures `retry_after` from the call's own `now`.
/// Stored time never moves backwards, and such a call is never admitted where
/// the latest reflected time would reject it. A `now` before the client's
/// origin is judged at the origin, and the difference is added to
/// `retry_after` (and, for the leaky bucket, to `delay`).
///
/// # Examples
///
/// ```
/// use floodgate::{Config, ManualClock, MutexLimiter, PolicyKind, RateLimiter};
///
/// let limiter: MutexLimiter<String, _> = MutexLimiter::with_clock(
///     PolicyKind::SlidingWindow,
///     Config::new(3, 1_000)?,
///     ManualClock::new(0),
/// )?;
/// for at in [0, 100, 200] {
///     assert!(limiter.check_at("rahul", at).allowed);
/// }
/// let fourth = limiter.check_at("rahul", 300);
/// assert!(!fourth.allowed);
/// assert_eq!(fourth.retry_after, 700); // the request at 0 leaves at 1000
/// assert!(limiter.check_at("priya", 300).allowed);
/// assert_eq!(limiter.tracked_clients(), 2);
/// # Ok::<(), floodgate::ConfigError>(())
/// ```
///
/// [`Limiter`]: crate::Limiter
/// [`build_with`]: crate::build_with
/// [`Engine`]: crate::Engine
pub struct MutexLimiter<K, C = QuantaClock> {
    config: Config,
    rules: Rules,
    clients: Mutex<HashMap<K, Arc<Mutex<Client>>>>,
    clock: C,
}

impl<K> MutexLimiter<K, QuantaClock> {
    /// A limiter applying `policy` with `config`, on the default clock
    /// (nanosecond ticks).
    ///
    /// # Errors
    ///
    /// [`ConfigError::WindowShorterThanLimit`] when `policy` drips and the
    /// window is shorter than the limit.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::{Config, ConfigError, MutexLimiter, PolicyKind, RateLimiter};
    ///
    /// let limiter: MutexLimiter<u64> =
    ///     MutexLimiter::new(PolicyKind::Gcra, Config::new(10, 1_000_000_000)?)?;
    /// assert!(limiter.allow(&42));
    ///
    /// let too_short = MutexLimiter::<u64>::new(PolicyKind::Gcra, Config::new(10, 9)?);
    /// assert!(matches!(too_short, Err(ConfigError::WindowShorterThanLimit { .. })));
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn new(policy: PolicyKind, config: Config) -> Result<Self, ConfigError> {
        Self::with_clock(policy, config, QuantaClock::new())
    }
}

impl<K, C: Clock> MutexLimiter<K, C> {
    /// A limiter applying `policy` with `config`, reading `clock`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::WindowShorterThanLimit`] when `policy` drips and the
    /// window is shorter than the limit.
    pub fn with_clock(policy: PolicyKind, config: Config, clock: C) -> Result<Self, ConfigError> {
        let config = config.check_for(policy)?;
        Ok(Self {
            config,
            rules: Rules {
                policy,
                limit: config.limit(),
                window: config.window(),
                interval: config.interval(),
            },
            clients: Mutex::new(HashMap::new()),
            clock,
        })
    }
}

impl<K, C> MutexLimiter<K, C> {
    /// How many clients have state (takes the map lock).
    pub fn tracked_clients(&self) -> usize {
        lock(&self.clients).len()
    }
}

impl<K: Hash + Eq, C> MutexLimiter<K, C> {
    /// `key`'s client, created with origin `now` if this is its first call.
    /// The map lock is held for this lookup only.
    fn client<Q>(&self, key: &Q, now: u64) -> Arc<Mutex<Client>>
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        let mut clients = lock(&self.clients);
        if let Some(client) = clients.get(key) {
            return Arc::clone(client);
        }
        let client = Arc::new(Mutex::new(Client {
            origin: now,
            state: State::new(&self.rules),
        }));
        clients.insert(key.to_owned(), Arc::clone(&client));
        client
    }
}

impl<K, Q, C> RateLimiter<Q> for MutexLimiter<K, C>
where
    K: Borrow<Q> + Hash + Eq + Send + Sync,
    Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    C: Clock,
{
    fn check_at(&self, key: &Q, now: u64) -> Decision {
        let client = self.client(key, now);
        let mut client = lock(&client);
        let origin = client.origin;
        match now.checked_sub(origin) {
            Some(since) => client.state.check(&self.rules, since),
            // A call that raced with the one creating the client, carrying an
            // earlier time: judged at the origin, it waits that much longer.
            None => {
                let lag = origin - now;
                let mut decision = client.state.check(&self.rules, 0);
                if !decision.allowed {
                    decision.retry_after = decision.retry_after.saturating_add(lag);
                } else if self.rules.policy == PolicyKind::LeakyBucket {
                    decision.delay = decision.delay.saturating_add(lag);
                }
                decision
            }
        }
    }

    fn remaining_at(&self, key: &Q, now: u64) -> u64 {
        let client = self.client(key, now);
        let client = lock(&client);
        client
            .state
            .remaining(&self.rules, now.saturating_sub(client.origin))
    }

    fn now(&self) -> u64 {
        self.clock.now()
    }

    fn policy(&self) -> PolicyKind {
        self.rules.policy
    }

    fn config(&self) -> Config {
        self.config
    }

    fn tracked_clients(&self) -> usize {
        MutexLimiter::tracked_clients(self)
    }
}

impl<K, C> fmt::Debug for MutexLimiter<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutexLimiter")
            .field("policy", &self.rules.policy)
            .field("limit", &self.rules.limit)
            .field("window", &self.rules.window)
            .field("clients", &self.tracked_clients())
            .finish_non_exhaustive()
    }
}

/// Locks `mutex`, taking over a poisoned lock: no state here is ever left
/// invalid between two statements, so a panic elsewhere cannot corrupt it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A `u128` answer as a `u64`, saturating. Every answer fits while a client's
/// times do not decrease (each is at most `W`); only a call whose `now` is far
/// older than its client's state can ask for more.
fn saturate(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// The policy and its parameters, fixed at construction.
#[derive(Clone, Copy, Debug)]
struct Rules {
    policy: PolicyKind,
    /// `L`.
    limit: u64,
    /// `W`, in ticks.
    window: u64,
    /// `I = ⌊W / L⌋`; at least 1 for the drip policies (checked by
    /// `Config::check_for`), unused by the others.
    interval: u64,
}

/// One client: when it was created, and its policy's state.
#[derive(Clone, Debug)]
struct Client {
    origin: u64,
    state: State,
}

/// One client's state, for whichever policy the limiter applies. Every time
/// in it is in ticks since the client's origin.
#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// `sliding-window`: the times of the last (at most `L`) admissions,
    /// oldest first; older admissions can no longer decide anything.
    Log(VecDeque<u64>),
    /// `token-bucket`: the tokens in the bucket once the drips up to index
    /// `drips` (at `drips · I`) are counted; starts full at drip 0.
    Bucket { tokens: u64, drips: u64 },
    /// `fixed-window`: the admissions counted in window `index`, which spans
    /// `[index · W, (index + 1) · W)`.
    Fixed { index: u64, count: u64 },
    /// `sliding-window-counter`: window `index`'s count and the count of the
    /// window just before it.
    Counter {
        index: u64,
        previous: u64,
        current: u64,
    },
    /// `gcra` and `leaky-bucket`: the theoretical arrival time. A `u128`
    /// because `TAT ≤ now + W`, and both may be close to `u64::MAX`.
    Tat(u128),
}

impl State {
    /// The state of a client that has made no call yet.
    fn new(rules: &Rules) -> Self {
        match rules.policy {
            PolicyKind::SlidingWindow => State::Log(VecDeque::new()),
            PolicyKind::TokenBucket => State::Bucket {
                tokens: rules.limit,
                drips: 0,
            },
            PolicyKind::FixedWindow => State::Fixed { index: 0, count: 0 },
            PolicyKind::SlidingWindowCounter => State::Counter {
                index: 0,
                previous: 0,
                current: 0,
            },
            PolicyKind::Gcra | PolicyKind::LeakyBucket => State::Tat(0),
        }
    }

    /// Decides one request at `now` ticks past the origin, recording it if
    /// admitted.
    fn check(&mut self, rules: &Rules, now: u64) -> Decision {
        match self {
            State::Log(times) => sliding_window_check(times, rules, now),
            State::Bucket { tokens, drips } => token_bucket_check(tokens, drips, rules, now),
            State::Fixed { index, count } => fixed_window_check(index, count, rules, now),
            State::Counter {
                index,
                previous,
                current,
            } => counter_check(index, previous, current, rules, now),
            State::Tat(tat) => gcra_check(tat, rules, now),
        }
    }

    /// How many requests would be admitted one after another at `now`.
    fn remaining(&self, rules: &Rules, now: u64) -> u64 {
        // Each policy's check on a copy would give the same answer (the unit
        // tests confirm it); the formulas below are the spec's.
        match self {
            State::Log(times) => {
                let now = now.max(times.back().copied().unwrap_or(0));
                rules.limit - in_window(times, rules.window, now)
            }
            State::Bucket { tokens, drips } => drip(*tokens, *drips, rules, now).0,
            State::Fixed { index, count } => {
                if now / rules.window > *index {
                    rules.limit
                } else {
                    rules.limit - count
                }
            }
            State::Counter {
                index,
                previous,
                current,
            } => {
                let at = counter_at(*index, *previous, *current, rules, now);
                counter_remaining(at.previous, at.current, at.elapsed, rules)
            }
            State::Tat(tat) => gcra_remaining(*tat, rules, now),
        }
    }
}

// sliding-window ----------------------------------------------------------

/// How many of `times` (sorted) are in the window that ends at `now`: the
/// times `t > now − W`, i.e. `t + W > now`.
fn in_window(times: &VecDeque<u64>, window: u64, now: u64) -> u64 {
    let gone = times.partition_point(|&t| u128::from(t) + u128::from(window) <= u128::from(now));
    (times.len() - gone) as u64
}

fn sliding_window_check(times: &mut VecDeque<u64>, rules: &Rules, now: u64) -> Decision {
    // Judged no earlier than the newest admission, so that `times` stays
    // sorted and an early `now` cannot see a window with fewer admissions.
    let at = now.max(times.back().copied().unwrap_or(0));
    let used = in_window(times, rules.window, at);
    if used < rules.limit {
        if times.len() as u64 == rules.limit {
            times.pop_front();
        }
        times.push_back(at);
        Decision::admit(rules.limit - used - 1)
    } else {
        // All L kept times are in the window; the oldest leaves first, at
        // `oldest + W` (the window then ends there and excludes it).
        let oldest = times.front().copied().unwrap_or(0);
        let leaves = u128::from(oldest) + u128::from(rules.window);
        Decision::reject(0, saturate(leaves - u128::from(now)))
    }
}

// token-bucket ------------------------------------------------------------

/// The bucket at `now`: every drip at `k · I ≤ now` not yet counted is added,
/// up to `L`. Returns the token count and the index of the last drip counted.
/// A `now` before the last counted drip adds nothing (the bucket is read as
/// of that drip).
fn drip(tokens: u64, drips: u64, rules: &Rules, now: u64) -> (u64, u64) {
    let due = now / rules.interval;
    if due > drips {
        // `due − drips` may be huge after a long gap; the bucket holds L.
        (tokens.saturating_add(due - drips).min(rules.limit), due)
    } else {
        (tokens, drips)
    }
}

fn token_bucket_check(tokens: &mut u64, drips: &mut u64, rules: &Rules, now: u64) -> Decision {
    let (available, counted) = drip(*tokens, *drips, rules, now);
    if available > 0 {
        *tokens = available - 1;
        *drips = counted;
        Decision::admit(available - 1)
    } else {
        let next_drip = (u128::from(counted) + 1) * u128::from(rules.interval);
        Decision::reject(0, saturate(next_drip - u128::from(now)))
    }
}

// fixed-window ------------------------------------------------------------

fn fixed_window_check(index: &mut u64, count: &mut u64, rules: &Rules, now: u64) -> Decision {
    // A `now` in an earlier window than the stored one is judged in the
    // stored one: it is full at least as often.
    let current = now / rules.window;
    let (window, used) = if current > *index {
        (current, 0)
    } else {
        (*index, *count)
    };
    if used < rules.limit {
        *index = window;
        *count = used + 1;
        Decision::admit(rules.limit - used - 1)
    } else {
        let end = (u128::from(window) + 1) * u128::from(rules.window);
        Decision::reject(0, saturate(end - u128::from(now)))
    }
}

// sliding-window-counter ----------------------------------------------------

/// The counter policy's view of one instant.
#[derive(Clone, Copy, Debug)]
struct CounterAt {
    /// The index of the window the instant is judged in.
    index: u64,
    /// `p`: admissions in window `index − 1`.
    previous: u64,
    /// `c`: admissions in window `index`.
    current: u64,
    /// `e`: ticks from the start of window `index` to the instant.
    elapsed: u64,
}

/// The counts as seen at `now`: rolled forward by the windows that have
/// passed since the stored one. A `now` before the stored window is judged at
/// that window's start (`e = 0`), where the weighted count is highest.
fn counter_at(index: u64, previous: u64, current: u64, rules: &Rules, now: u64) -> CounterAt {
    let now_index = now / rules.window;
    if now_index < index {
        return CounterAt {
            index,
            previous,
            current,
            elapsed: 0,
        };
    }
    let (previous, current) = match now_index - index {
        0 => (previous, current),
        1 => (current, 0),
        _ => (0, 0),
    };
    CounterAt {
        index: now_index,
        previous,
        current,
        elapsed: now - now_index * rules.window,
    }
}

/// `p·(W − e) + c·W < L·W`, the spec's admission rule (at most 2^20 · 2^64,
/// so exact in `u128`).
fn counter_admits(previous: u64, current: u64, elapsed: u64, rules: &Rules) -> bool {
    let w = u128::from(rules.window);
    let weighted = u128::from(previous) * (w - u128::from(elapsed)) + u128::from(current) * w;
    weighted < u128::from(rules.limit) * w
}

/// `max(0, ceil((L·W − p·(W − e) − c·W) / W))`, the spec's formula, in `i128`.
fn counter_remaining(previous: u64, current: u64, elapsed: u64, rules: &Rules) -> u64 {
    let w = i128::from(rules.window);
    let room = i128::from(rules.limit) * w
        - i128::from(previous) * (w - i128::from(elapsed))
        - i128::from(current) * w;
    if room <= 0 {
        0
    } else {
        // `room ≤ L·W`, so the quotient is at most L.
        ((room + w - 1) / w) as u64
    }
}

fn counter_check(
    index: &mut u64,
    previous: &mut u64,
    current: &mut u64,
    rules: &Rules,
    now: u64,
) -> Decision {
    let at = counter_at(*index, *previous, *current, rules, now);
    if counter_admits(at.previous, at.current, at.elapsed, rules) {
        *index = at.index;
        *previous = at.previous;
        *current = at.current + 1;
        Decision::admit(counter_remaining(
            at.previous,
            at.current + 1,
            at.elapsed,
            rules,
        ))
    } else {
        let remaining = counter_remaining(at.previous, at.current, at.elapsed, rules);
        Decision::reject(remaining, counter_retry_after(at, rules, now))
    }
}

/// The first instant after `now` at which a request rejected at `at` would be
/// admitted, as ticks from `now`.
///
/// Nothing else happens in between, so the counts change only when a window
/// ends. Within window `index` (`p`, `c` fixed) the rule admits at offset `f`
/// iff `p·(W − f) + c·W < L·W`, i.e. `p·f > (p + c − L)·W`; being rejected at
/// `e` means `p·e ≤ (p + c − L)·W`, so the first such `f` is
/// `⌊(p + c − L)·W / p⌋ + 1 > e` (none if `p = 0`). In window `index + 1` the
/// counts are `(c, 0)`: admitted at `f` iff `c·(W − f) < L·W`, so at `f = 0`
/// if `c < L` and at `f = 1` if `c = L` (admissions keep `c ≤ L`). That needs
/// `W ≥ 2`; with `W = 1` the window after has counts `(0, 0)` and admits at
/// its start.
fn counter_retry_after(at: CounterAt, rules: &Rules, now: u64) -> u64 {
    // i128 throughout: `(p + c − L)·W` is at most 2^21 · 2^64 in size, and
    // the start of a window plus two windows at most 3 · 2^64.
    let w = i128::from(rules.window);
    let start = i128::from(at.index) * w;
    let (p, c, l) = (
        i128::from(at.previous),
        i128::from(at.current),
        i128::from(rules.limit),
    );
    let in_this_window = if p > 0 {
        let need = (p + c - l) * w;
        debug_assert!(need >= 0, "a rejection implies p·e ≤ (p + c − L)·W");
        Some(need / p + 1).filter(|&f| f < w)
    } else {
        None
    };
    let first = match in_this_window {
        Some(f) => start + f,
        None if c < l => start + w,
        None if w >= 2 => start + w + 1,
        None => start + 2 * w,
    };
    u64::try_from(first - i128::from(now)).unwrap_or(u64::MAX)
}

// gcra and leaky-bucket -------------------------------------------------------

/// `τ = I·(L − 1)`: how far ahead of `now` the TAT may be for a request to be
/// admitted (a burst of `L` fits in it).
fn tolerance(rules: &Rules) -> u128 {
    u128::from(rules.interval) * u128::from(rules.limit - 1)
}

/// `floor((τ − (t − now)) / I) + 1` when `t − now ≤ τ`, else 0, with
/// `t = max(TAT, now)`.
fn gcra_remaining(tat: u128, rules: &Rules, now: u64) -> u64 {
    let now = u128::from(now);
    let ahead = tat.max(now) - now;
    let tau = tolerance(rules);
    if ahead <= tau {
        // At most L − 1 + 1 = L.
        ((tau - ahead) / u128::from(rules.interval) + 1) as u64
    } else {
        0
    }
}

fn gcra_check(tat: &mut u128, rules: &Rules, now: u64) -> Decision {
    let tau = tolerance(rules);
    let now_wide = u128::from(now);
    let t = (*tat).max(now_wide);
    if t - now_wide <= tau {
        *tat = t + u128::from(rules.interval);
        let mut decision = Decision::admit(gcra_remaining(*tat, rules, now));
        if rules.policy == PolicyKind::LeakyBucket {
            // `t − now ≤ τ ≤ W`, so it fits.
            decision.delay = saturate(t - now_wide);
        }
        decision
    } else {
        Decision::reject(0, saturate(t - tau - now_wide))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(policy: PolicyKind, limit: u64, window: u64) -> Rules {
        let config = Config::new(limit, window)
            .and_then(|c| c.check_for(policy))
            .unwrap();
        Rules {
            policy,
            limit,
            window,
            interval: config.interval(),
        }
    }

    /// The smallest `d ≥ 1` at which the same request is admitted, found by
    /// trying each `d` on a copy of the state.
    fn brute_retry_after(state: &State, rules: &Rules, now: u64, give_up: u64) -> Option<u64> {
        (1..=give_up).find(|d| state.clone().check(rules, now + d).allowed)
    }

    /// How many requests in a row a copy of the state admits at `now`.
    fn brute_remaining(state: &State, rules: &Rules, now: u64) -> u64 {
        let mut copy = state.clone();
        let mut admitted = 0;
        while copy.check(rules, now).allowed {
            admitted += 1;
        }
        admitted
    }

    /// A small deterministic generator (xorshift), so that the exhaustive
    /// tests below also see irregular call patterns.
    struct Xorshift(u64);

    impl Xorshift {
        fn below(&mut self, bound: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % bound
        }
    }

    #[test]
    fn counter_retry_after_is_the_first_admitted_instant_in_every_state() {
        for limit in 1..=4 {
            for window in 1..=7 {
                let rules = rules(PolicyKind::SlidingWindowCounter, limit, window);
                for previous in 0..=limit {
                    for current in 0..=limit {
                        for elapsed in 0..window {
                            // Window 1, so that `previous` is window 0's count.
                            let state = State::Counter {
                                index: 1,
                                previous,
                                current,
                            };
                            let now = window + elapsed;
                            let decision = state.clone().check(&rules, now);
                            if decision.allowed {
                                continue;
                            }
                            let expected = brute_retry_after(&state, &rules, now, 4 * window);
                            assert_eq!(
                                Some(decision.retry_after),
                                expected,
                                "L={limit} W={window} p={previous} c={current} e={elapsed}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_policy_answers_retry_after_and_remaining_as_brute_force_does() {
        let mut random = Xorshift(0x9e37_79b9_7f4a_7c15);
        for policy in PolicyKind::ALL {
            for limit in 1..=4 {
                for window in limit..=12 {
                    let rules = rules(policy, limit, window);
                    let mut state = State::new(&rules);
                    let mut now = 0;
                    for _ in 0..200 {
                        now += [0, 0, 1, 1, 2, 3, window / 2, window][random.below(8) as usize];
                        let remaining = state.remaining(&rules, now);
                        assert_eq!(
                            remaining,
                            brute_remaining(&state, &rules, now),
                            "{policy} L={limit} W={window} at {now}: {state:?}"
                        );
                        let before = state.clone();
                        let decision = state.check(&rules, now);
                        assert_eq!(decision.allowed, remaining > 0, "{policy} at {now}");
                        assert_eq!(
                            decision.remaining,
                            state.remaining(&rules, now),
                            "{policy} at {now}"
                        );
                        if decision.allowed {
                            assert_eq!(decision.retry_after, 0);
                        } else {
                            assert_eq!(state, before, "a rejection changed {policy}");
                            assert_eq!(
                                Some(decision.retry_after),
                                brute_retry_after(&before, &rules, now, 3 * window),
                                "{policy} L={limit} W={window} at {now}: {before:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn leaky_bucket_delays_a_burst_by_one_interval_each() {
        // L = 4, W = 10: I = 2, τ = 6.
        let rules = rules(PolicyKind::LeakyBucket, 4, 10);
        let mut state = State::new(&rules);
        let delays: Vec<u64> = (0..4).map(|_| state.check(&rules, 5).delay).collect();
        assert_eq!(delays, [0, 2, 4, 6]);
        let fifth = state.check(&rules, 5);
        assert_eq!(
            (fifth.allowed, fifth.delay, fifth.retry_after),
            (false, 0, 2)
        );
    }

    /// A `now` earlier than the state reflects: never a panic, never an
    /// admission the latest time would refuse, never stored time moving back.
    #[test]
    fn time_going_backwards_is_never_more_lenient() {
        let mut random = Xorshift(0x2545_f491_4f6c_dd1d);
        for policy in PolicyKind::ALL {
            for (limit, window) in [(1, 1), (2, 5), (3, 10), (4, 9)] {
                let rules = rules(policy, limit, window);
                let mut state = State::new(&rules);
                let mut latest: u64 = 0;
                for _ in 0..500 {
                    let now = if random.below(3) == 0 {
                        latest.saturating_sub(random.below(2 * window))
                    } else {
                        latest + random.below(2 * window)
                    };
                    let at_latest = state.clone().check(&rules, latest.max(now));
                    let decision = state.check(&rules, now);
                    assert!(
                        !decision.allowed || at_latest.allowed,
                        "{policy} admitted at {now} but not at {latest}"
                    );
                    assert!(decision.allowed || decision.retry_after >= 1);
                    latest = latest.max(now);
                }
            }
        }
    }

    #[test]
    fn extreme_windows_and_times_neither_panic_nor_wrap() {
        for policy in PolicyKind::ALL {
            for window in [u64::MAX, u64::MAX - 1, 1 << 63] {
                for limit in [1, 3, crate::MAX_LIMIT] {
                    if Config::new(limit, window)
                        .and_then(|c| c.check_for(policy))
                        .is_err()
                    {
                        continue; // gcra and leaky-bucket stop at 2^63
                    }
                    let rules = rules(policy, limit, window);
                    let mut state = State::new(&rules);
                    for now in [0, u64::MAX, 5, u64::MAX - 1, 0] {
                        let decision = state.check(&rules, now);
                        assert!(decision.remaining <= limit);
                        assert!(state.remaining(&rules, now) <= limit);
                    }
                }
            }
        }
    }

    #[test]
    fn a_call_before_the_origin_is_judged_at_the_origin_and_waits_the_lag() {
        let limiter: MutexLimiter<u64, _> = MutexLimiter::with_clock(
            PolicyKind::LeakyBucket,
            Config::new(2, 10).unwrap(),
            crate::ManualClock::new(0),
        )
        .unwrap();
        assert_eq!(limiter.check_at(&1, 100).delay, 0);
        // Judged at 100: delay 5, plus the 30 ticks it is early.
        assert_eq!(limiter.check_at(&1, 70).delay, 35);
        let third = limiter.check_at(&1, 70);
        assert!(!third.allowed);
        // At 100 the TAT is 110 and τ = 5: admitted from 105, 35 ticks on.
        assert_eq!(third.retry_after, 35);
        assert_eq!(limiter.remaining_at(&1, 0), 0);
    }

    #[test]
    fn a_poisoned_client_lock_is_taken_over() {
        let limiter: Arc<MutexLimiter<u64, _>> = Arc::new(
            MutexLimiter::with_clock(
                PolicyKind::FixedWindow,
                Config::new(2, 10).unwrap(),
                crate::ManualClock::new(0),
            )
            .unwrap(),
        );
        assert!(limiter.check_at(&7, 0).allowed);
        let poisoner = Arc::clone(&limiter);
        let panicked = std::thread::spawn(move || {
            let client = poisoner.client(&7, 0);
            let _guard = client.lock().unwrap();
            let _map = poisoner.clients.lock().unwrap();
            panic!("poisoning both locks on purpose");
        })
        .join();
        assert!(panicked.is_err());
        assert_eq!(limiter.remaining_at(&7, 1), 1);
        assert!(limiter.check_at(&7, 1).allowed);
        assert!(!limiter.check_at(&7, 2).allowed);
        assert_eq!(limiter.tracked_clients(), 1);
    }
}
