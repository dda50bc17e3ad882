//! Helpers shared by the integration tests: both engines built side by side,
//! the decisions the spec prescribes, and traces of calls to replay.

// Each test file uses its own subset of these helpers.
#![allow(dead_code)]

use std::hash::Hash;
use std::sync::Arc;

use floodgate::tiers::{TierSpec, Tiers};
use floodgate::{
    build_with, Clock, Config, Decision, Engine, ManualClock, PolicyKind, RateLimiter,
};

/// Both engines, in the order the tests report them.
pub const ENGINES: [Engine; 2] = [Engine::LockFree, Engine::Mutex];

/// A limiter for `policy` on `engine`, with `limit` per `window` ticks, on a
/// manual clock (the tests pass every time explicitly).
///
/// # Panics
///
/// If the configuration is invalid: the tests only build valid ones.
pub fn limiter<Q>(
    policy: PolicyKind,
    limit: u64,
    window: u64,
    engine: Engine,
) -> Arc<dyn RateLimiter<Q>>
where
    Q: ?Sized + Hash + Eq + ToOwned + 'static,
    Q::Owned: Hash + Eq + Clone + Send + Sync + 'static,
{
    let config = Config::per_ticks(limit, window)
        .unwrap_or_else(|e| panic!("{policy} L={limit} W={window}: {e}"));
    build_with(policy, config, engine, ManualClock::new(0))
        .unwrap_or_else(|e| panic!("{policy} L={limit} W={window}: {e}"))
}

/// Runs `test` once on a fresh limiter of each engine, naming the engine so
/// that a failed assertion says which one disagreed.
pub fn on_both<Q>(
    policy: PolicyKind,
    limit: u64,
    window: u64,
    test: impl Fn(&dyn RateLimiter<Q>, Engine),
) where
    Q: ?Sized + Hash + Eq + ToOwned + 'static,
    Q::Owned: Hash + Eq + Clone + Send + Sync + 'static,
{
    for engine in ENGINES {
        test(&*limiter::<Q>(policy, limit, window, engine), engine);
    }
}

/// An admitted request with `remaining` left and no delay.
pub const fn admitted(remaining: u64) -> Decision {
    Decision::admitted(remaining)
}

/// An admitted leaky-bucket request that must wait `delay`.
pub const fn delayed(remaining: u64, delay: u64) -> Decision {
    Decision::admitted(remaining).with_delay(delay)
}

/// A rejected request that would be admitted `retry_after` ticks later.
pub const fn rejected(retry_after: u64) -> Decision {
    Decision::rejected(0, retry_after)
}

/// One call of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `check_at`.
    Allow,
    /// `check_n_at` with this cost.
    AllowN(u64),
    /// `remaining_at`.
    Remaining,
    /// `refund_at` of `cost` units of the admission `back` ticks before
    /// the call (0: at the call's own time).
    Refund { cost: u64, back: u64 },
}

/// One call of a client at an absolute time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    pub op: Op,
    pub client: u64,
    pub at: u64,
}

/// What a call answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Decision(Decision),
    Remaining(u64),
    /// The units a refund gave back.
    Refunded(u64),
}

impl Answer {
    /// Whether this answers an admitted `allow`.
    pub fn admitted(self) -> bool {
        matches!(self, Answer::Decision(decision) if decision.allowed())
    }
}

/// Makes one call of `key`, whatever its key type.
pub fn ask<Q: ?Sized>(limiter: &dyn RateLimiter<Q>, key: &Q, op: Op, at: u64) -> Answer {
    match op {
        Op::Allow => Answer::Decision(limiter.check_at(key, at)),
        Op::AllowN(cost) => Answer::Decision(limiter.check_n_at(key, at, cost)),
        Op::Remaining => Answer::Remaining(limiter.remaining_at(key, at)),
        Op::Refund { cost, back } => {
            Answer::Refunded(limiter.refund_at(key, at, at.saturating_sub(back), cost))
        }
    }
}

/// Makes one call.
pub fn call(limiter: &dyn RateLimiter<u64>, call: Call) -> Answer {
    ask(limiter, &call.client, call.op, call.at)
}

/// Makes every call of `trace`, in order.
pub fn run(limiter: &dyn RateLimiter<u64>, trace: &[Call]) -> Vec<Answer> {
    trace.iter().map(|&c| call(limiter, c)).collect()
}

/// A tier rule, for tests that only build valid ones.
///
/// # Panics
///
/// If `policy` refuses the limits.
pub fn spec(policy: PolicyKind, limit: u64, window: u64) -> TierSpec {
    TierSpec::new(policy, Config::per_ticks(limit, window).unwrap())
        .unwrap_or_else(|e| panic!("{policy} L={limit} W={window}: {e}"))
}

/// The name of the one tier of [`single_tier`] registries.
pub const TIER: &str = "only";

/// Every client is in [`TIER`].
pub fn everyone_in_one_tier(_: &u64) -> &'static str {
    TIER
}

/// A registry of `u64` clients with one tier, [`TIER`], applying `rule`.
pub type OneTier<C> = Tiers<u64, fn(&u64) -> &'static str, C>;

/// A registry with one tier applying `rule`, reading `clock`.
///
/// # Panics
///
/// If `rule` does not fit the clock's tick: the tests only build ones that
/// do.
pub fn single_tier<C: Clock>(rule: TierSpec, clock: C) -> OneTier<C> {
    Tiers::with_clock(
        TIER,
        rule,
        everyone_in_one_tier as fn(&u64) -> &'static str,
        clock,
    )
    .unwrap_or_else(|e| panic!("{rule}: {e}"))
}

/// How many requests of `key` are admitted at `at`, one after another,
/// until the first rejection.
///
/// # Panics
///
/// If more than a million are admitted: no test here allows that many.
pub fn drain<Q: ?Sized>(limiter: &dyn RateLimiter<Q>, key: &Q, at: u64) -> u64 {
    let mut admitted = 0;
    while limiter.check_at(key, at).allowed() {
        admitted += 1;
        assert!(admitted <= 1_000_000, "no end to the admissions at {at}");
    }
    admitted
}
