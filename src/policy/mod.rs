//! The six policies of the lock-free engine, one file each.
//!
//! Each policy is a pure step — previous state and `now` in, next state and
//! [`Decision`] out — plus the per-client state it runs on. The engine makes
//! the step atomic (a CAS loop on the state word); nothing here reads a clock
//! or knows about other clients. Times are ticks since the client's origin.

pub(crate) mod any;
mod combine;
mod compound;
mod fixed_window;
mod gcra;
mod in_flight;
mod leaky_bucket;
mod pair;
pub(crate) mod sliding_window;
mod sliding_window_counter;
mod token_bucket;
mod wide_pair;
mod window_pair;

pub use fixed_window::{FixedWindow, FixedWindowState};
pub use gcra::{Gcra, GcraState};
pub use in_flight::{InFlight, InFlightState};
pub use leaky_bucket::LeakyBucket;
pub use sliding_window::{SlidingWindow, SlidingWindowState};
pub use sliding_window_counter::{SlidingWindowCounter, SlidingWindowCounterState};
pub use token_bucket::{TokenBucket, TokenBucketState};

pub use crate::cell::Retired;
use crate::decision::NEVER;
use crate::{Config, ConfigError, Decision, PolicyKind, Rule, RuleSet, Tick};
pub use compound::{Compound, CompoundState};
pub use pair::{Pair, PairState};
pub use wide_pair::{WideWindowPair, WideWindowPairState};
pub use window_pair::{WindowPair, WindowPairState};

mod sealed {
    pub trait Sealed {}

    /// What the limiter keeps of a client's origin (the `now` of its first
    /// call), by policy: the origin itself, where answers are measured from
    /// it (`u64`), or nothing, where a policy's state holds times counted
    /// from tick 0 (`()`). Keeping nothing is what lets a one-word state's
    /// slot shrink from 32 to 24 bytes (`store::inline`).
    pub trait Origin: Copy + Send + Sync + 'static {
        /// Keeps what the policy needs of `origin`.
        fn keep(origin: u64) -> Self;

        /// The tick the state's times count from: the origin, or 0.
        fn tick(self) -> u64;

        /// Keeps what is kept for a save (`Policy::save_words`).
        fn save(self, out: &mut Vec<u64>);

        /// What `save` kept, and the words after it.
        fn load(words: &[u64]) -> Option<(Self, &[u64])>;
    }

    impl Origin for u64 {
        #[inline(always)]
        fn keep(origin: u64) -> Self {
            origin
        }

        #[inline(always)]
        fn tick(self) -> u64 {
            self
        }

        fn save(self, out: &mut Vec<u64>) {
            out.push(self);
        }

        fn load(words: &[u64]) -> Option<(Self, &[u64])> {
            words.split_first().map(|(&origin, rest)| (origin, rest))
        }
    }

    impl Origin for () {
        #[inline(always)]
        fn keep(_: u64) -> Self {}

        #[inline(always)]
        fn tick(self) -> u64 {
            0
        }

        fn save(self, _: &mut Vec<u64>) {}

        fn load(words: &[u64]) -> Option<(Self, &[u64])> {
            Some(((), words))
        }
    }
}

pub(crate) use sealed::Origin;

/// A policy of the lock-free engine: its validated parameters, and how it
/// decides on one client's state. Implemented by the six policy types of
/// this module and sealed; use it to name a policy in
/// [`Limiter`](crate::Limiter)'s type.
///
/// Every method that reads or writes a state answers `Err(`[`Retired`]`)`
/// when the state was retired (evicted as idle, or carried into a reloaded
/// tier) under the call: the caller looks the client up again. Times are
/// ticks past the client's origin.
pub trait Policy: sealed::Sealed + Send + Sync + Sized + 'static {
    /// One client's state: atomic words, updated in place.
    type State: Send + Sync + 'static;

    /// What the limiter keeps of a client's origin: `u64` where the
    /// policy's answers are measured from it (the windows' grid, the
    /// sliding log's times), `()` where the state counts time from tick 0
    /// and a new client's state is begun at its origin instead (the drip
    /// policies: `token-bucket`'s word keeps the drips' phase itself; see
    /// [`Policy::begin`]).
    #[doc(hidden)]
    type Origin: sealed::Origin;

    /// Which of the six this is.
    const KIND: PolicyKind;

    /// Whether it applies several rules ([`Pair`], [`WindowPair`],
    /// [`WideWindowPair`], [`Compound`]).
    #[doc(hidden)]
    const SEVERAL: bool = false;

    /// Validates `config` for this policy.
    ///
    /// # Errors
    ///
    /// [`ConfigError::WindowShorterThanLimit`] for a drip policy with
    /// `window < limit`.
    fn new(config: Config) -> Result<Self, ConfigError>;

    /// The limit and window.
    fn config(&self) -> Config;

    /// The state of a client that has made no request yet.
    fn new_state(&self) -> Self::State;

    /// A new client's state, for a client created at `origin`, in the
    /// times the limiter hands this policy: ticks past `origin` when the
    /// origin is kept (then this is [`new_state`](Self::new_state)), ticks
    /// since 0 when it is not (then the state holds `origin`, as the
    /// contract's `TAT = origin`).
    #[doc(hidden)]
    fn begin(&self, origin: u64) -> Self::State {
        let _ = origin;
        self.new_state()
    }

    /// Decides one request at `now`, and records it if admitted.
    ///
    /// # Errors
    ///
    /// [`Retired`] if the state was retired.
    #[inline]
    fn check(&self, state: &Self::State, now: u64) -> Result<Decision, Retired> {
        self.check_within(state, now, 1)
    }

    /// Decides one request of cost `cost` at `now` (the contract's
    /// "Weighted requests"), and records it if admitted: all of it in one
    /// atomic step, or nothing. A cost of 0 is admitted and changes
    /// nothing; a cost above the limit is never admitted
    /// (`retry_after` `NEVER`: `None` to callers); both answer `remaining(now)`.
    ///
    /// # Errors
    ///
    /// [`Retired`] if the state was retired.
    #[inline]
    fn check_n(&self, state: &Self::State, now: u64, cost: u64) -> Result<Decision, Retired> {
        if cost == 0 {
            return Ok(Decision::admit(self.remaining(state, now)?));
        }
        if cost > self.config().limit() {
            return Ok(Decision::reject(self.remaining(state, now)?, NEVER));
        }
        self.check_within(state, now, cost)
    }

    /// [`check_n`](Self::check_n) for `1 <= cost <= limit`, the costs a
    /// policy step decides; the others are answered by `check_n` from
    /// `remaining`. A cost outside that range gives an unspecified answer
    /// (never a panic or an overflow).
    ///
    /// # Errors
    ///
    /// [`Retired`] if the state was retired.
    #[doc(hidden)]
    fn check_within(&self, state: &Self::State, now: u64, cost: u64) -> Result<Decision, Retired>;

    /// [`check_within`](Self::check_within) on a state no other thread can
    /// reach yet — a new client's first request, decided before the client
    /// is published — answering the state after it and the decision. A
    /// one-word policy needs no CAS for it (`cell::transition_unshared`);
    /// the sliding log takes its usual step.
    #[doc(hidden)]
    fn check_unshared(&self, state: Self::State, now: u64, cost: u64) -> (Self::State, Decision) {
        match self.check_within(&state, now, cost) {
            Ok(decision) => (state, decision),
            Err(Retired) => unreachable!("a new state is never retired"),
        }
    }

    /// How many requests would be admitted one after another at `now`.
    ///
    /// # Errors
    ///
    /// [`Retired`] if the state was retired.
    fn remaining(&self, state: &Self::State, now: u64) -> Result<u64, Retired>;

    /// Gives back up to `cost` units of the admission made `ago` ticks
    /// before `now` (ticks past the origin; an admission before the origin,
    /// `ago > now`, was no admission of this state), and answers how many
    /// it gave: the contract's "Giving units back". One CAS step on the
    /// state, or none when nothing comes back. The drip policies give back
    /// whatever the admission's time, within a window of it.
    ///
    /// # Errors
    ///
    /// [`Retired`] if the state was retired.
    #[doc(hidden)]
    fn refund(&self, state: &Self::State, now: u64, ago: u64, cost: u64) -> Result<u64, Retired>;

    /// Gives back up to `cost` of the units an `in-flight` rule holds (the
    /// contract's "Requests in flight": `min(n, h)`), and answers how many.
    /// One CAS step; 0 for every rate policy, which holds nothing.
    ///
    /// # Errors
    ///
    /// [`Retired`] if the state was retired.
    #[doc(hidden)]
    fn release(&self, state: &Self::State, now: u64, cost: u64) -> Result<u64, Retired> {
        let _ = (now, cost);
        if self.is_retired(state) {
            return Err(Retired);
        }
        Ok(0)
    }

    /// Retires the state if it is idle at `now` — it answers every call at
    /// `now` or later as a new state would (see [`crate::bounds`]) — and
    /// says whether this call retired it.
    fn retire_if_idle(&self, state: &Self::State, now: u64) -> bool;

    /// Retires the state, whatever it holds, and answers how much of the
    /// limit it had spent, judged at the later of `now` and the latest time
    /// the state reflects (a caller on a real clock may be a little behind
    /// it): `limit − remaining(at)` of the state as it was retired (by this
    /// call or an earlier one).
    fn retire_spent(&self, state: &Self::State, now: u64) -> Spent;

    /// A state that has spent `min(spent, limit)` at `now`, as if that many
    /// requests had just been admitted: `remaining(now)` answers
    /// `limit − spent`.
    fn spent_state(&self, spent: u64, now: u64) -> Self::State;

    /// A state in which rule `i` has spent `spent[i]` at `now` (a rule
    /// past them, what the last one spent), as
    /// [`spent_state`](Self::spent_state) makes one for each rule: what a
    /// load under changed rules carries a client over to
    /// (`crate::state`). `spent` holds one count at least.
    #[doc(hidden)]
    fn spent_state_each(&self, spent: &[u64], now: u64) -> Self::State {
        self.spent_state(spent[0], now)
    }

    /// Whether the state was retired.
    fn is_retired(&self, state: &Self::State) -> bool;

    /// The state as one atomic read sees it, as the words a save keeps
    /// (`crate::state`): the state's own words with its times as it keeps
    /// them, which stay right in a limiter whose clock goes on from the
    /// saved one's ticks. A log keeps its entries inside its window.
    ///
    /// # Errors
    ///
    /// [`Retired`] if the state was retired.
    #[doc(hidden)]
    fn save_words(&self, state: &Self::State, out: &mut Vec<u64>) -> Result<(), Retired>;

    /// The state `save_words` wrote `words` of, under the same rules;
    /// `None` if they are no words this policy writes (a value out of its
    /// field). An `in-flight` rule holds nothing: the requests that held
    /// its units ended with the process that saved them.
    #[doc(hidden)]
    fn load_words(&self, words: &[u64]) -> Option<Self::State>;

    /// Which policy a limiter built on this one reports
    /// ([`RateLimiter::policy`](crate::RateLimiter::policy)): `KIND`, or
    /// for several rules the strictest one's ([`RuleSet::strictest`]).
    #[doc(hidden)]
    fn kind(&self) -> PolicyKind {
        Self::KIND
    }

    /// The rules it applies: its own, or several ([`Compound`]).
    #[doc(hidden)]
    fn rule_set(&self) -> RuleSet {
        RuleSet::from(Rule::from_parts(self.kind(), self.config()))
    }

    /// The policy made again for a clock of `tick`, from the durations its
    /// rules were given in ([`Config::resolve`]).
    ///
    /// # Errors
    ///
    /// What [`Config::resolve`] refuses.
    #[doc(hidden)]
    fn in_ticks_of(&self, tick: Tick) -> Result<Self, ConfigError> {
        Self::new(self.config().resolve(Self::KIND, tick)?)
    }

    /// Each rule's own answer for a request of cost `cost` at `now` that
    /// was decided `decided`, read from the state as it is now: for a
    /// limiter with several rules, what a response's headers say of each
    /// ([`RuledDecision::each`](crate::RuledDecision::each)). Empty for one
    /// rule, whose answer is `decided` itself.
    ///
    /// # Errors
    ///
    /// [`Retired`] if the state was retired.
    #[doc(hidden)]
    fn each(
        &self,
        state: &Self::State,
        now: u64,
        cost: u64,
        decided: &Decision,
    ) -> Result<crate::RuleAnswers, Retired> {
        let _ = (state, now, cost, decided);
        Ok(crate::RuleAnswers::default())
    }

    /// Each rule's own answer for one unit at `now`, nothing spent: its
    /// `remaining`, and for a rule with none left when its next unit comes
    /// (`retry_after`; never, for an `in-flight` rule, which only a release
    /// frees). One answer for one rule. What
    /// [`RateLimiter::peek_each_at`](crate::RateLimiter::peek_each_at)
    /// answers.
    ///
    /// # Errors
    ///
    /// [`Retired`] if the state was retired.
    #[doc(hidden)]
    fn peek_each(&self, state: &Self::State, now: u64) -> Result<crate::RuleAnswers, Retired> {
        // A refusal leaves every rule's answer its own, nothing spent:
        // `each` steps each rule on what it read, and stores nothing.
        if Self::SEVERAL {
            return self.each(state, now, 1, &Decision::reject(0, NEVER));
        }
        let remaining = self.remaining(state, now)?;
        let decision = if remaining > 0 {
            Decision::admit(remaining)
        } else if self.kind() == PolicyKind::InFlight {
            // None left waits for a release, at no time known.
            Decision::reject(0, NEVER)
        } else {
            // When the next unit comes: a step of a copy of the state (its
            // words, as a state file keeps them), so nothing is spent.
            let mut words = Vec::new();
            self.save_words(state, &mut words)?;
            match self.load_words(&words) {
                Some(copy) => self.check_unshared(copy, now, 1).1,
                None => Decision::reject(0, NEVER),
            }
        };
        let mut answers = crate::RuleAnswers::default();
        answers.push(crate::RuleAnswer {
            rule: Rule::from_parts(self.kind(), self.config()),
            decision,
        });
        Ok(answers)
    }

    /// Freezes `state` with its retirement mark and answers a state that
    /// continues it exactly: the keyed store moving a client into a larger
    /// table. A call that raced with the freeze sees the mark and looks the
    /// client up again, in the new table. `None` if it was retired already.
    fn relocate(&self, state: &Self::State) -> Option<Self::State>;

    /// Within how many ticks a client that stops calling becomes idle: the
    /// window (two for `sliding-window-counter`, whose previous window still
    /// counts).
    fn forgets_after(&self) -> u64 {
        self.config().window()
    }

    /// Re-expresses a decision made at the client's origin for a call whose
    /// `now` was `lag` ticks before it (threads race to create a client, so a
    /// call can carry a time just before the winner's origin).
    fn measured_from_earlier(&self, mut decision: Decision, lag: u64) -> Decision {
        if !decision.allowed {
            decision.retry_after = decision.retry_after.saturating_add(lag);
        }
        decision
    }
}

/// Whether a refund of the admission `ago` ticks before the call gives
/// nothing back whatever the state: a cost of 0, or an admission `W` or
/// more ticks ago (every policy has forgotten it, or given its units back
/// by itself).
#[inline]
fn gives_nothing(config: Config, ago: u64, cost: u64) -> bool {
    cost == 0 || ago >= config.window()
}

/// What a retired state had spent, and when: see [`Policy::retire_spent`].
///
/// A carry-over re-creates the spend at `at`, never at an older caller's
/// `now`: a state built at an older time would give back what the retired
/// one still held (a fixed window carried into the window before its own
/// would reset one window early).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spent {
    /// `limit − remaining(at)`.
    pub count: u64,
    /// The time it was judged at: `max(now, ` the latest time the state
    /// reflects`)`.
    pub at: u64,
}

/// The start of the window a `WindowWord` (`cell`) holds counts of: the
/// latest time such a state is known to reflect. At most the `now` that
/// wrote it, so it fits a `u64`.
#[inline]
fn window_start(word: u128, window: u64) -> u64 {
    crate::cell::WindowWord::unpack(word).window * window
}

/// What a window policy's `WindowWord` had spent, judged no earlier than
/// the start of its window, the latest time it reflects (a carried spend
/// lands in that window, never in the one before it): `L − remaining(at)`,
/// `remaining` the policy's own.
fn window_spent(
    config: Config,
    word: u128,
    now: u64,
    remaining: impl Fn(u128, u64) -> u64,
) -> Spent {
    let at = now.max(window_start(word, config.window()));
    Spent {
        count: config.limit() - remaining(word, at),
        at,
    }
}

/// The `WindowWord` of a window policy's state that has spent
/// `min(spent, L)` at `now`: the count in the window that holds `now`,
/// none before it (for `sliding-window-counter`, `remaining` is then
/// `⌈(L·W − spent·W) / W⌉ = L − spent`).
fn spent_window_word(config: Config, spent: u64, now: u64) -> u128 {
    crate::cell::WindowWord {
        window: crate::cell::WindowWord::index(now, config.window()),
        previous: 0,
        // At most L <= 2^32 − 1 (the 32-bit field).
        current: spent.min(config.limit()) as u32,
    }
    .pack()
}

/// Ticks from `now` to `at`; `u64::MAX` when `at` is not after `now`: a
/// window of one tick stopped at its last index (`cell::WindowWord`) never
/// ends, so a request refused there is never admitted.
#[inline]
fn until(at: u128, now: u64) -> u64 {
    match at.checked_sub(u128::from(now)) {
        Some(0) | None => NEVER,
        Some(ticks) => saturate(ticks),
    }
}

/// `max(0, a − b)` without a branch the reader has to check.
#[inline]
fn saturate(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}
