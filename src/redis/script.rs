//! The six policies as Lua scripts, and the one place that encodes their
//! arguments and decodes their replies.
//!
//! Every script is `scripts/prelude.lua` (argument parsing, the integer
//! helpers, the TTL writer), the policy's own step as the body of the
//! prelude's `decide` function, then `scripts/driver.lua` (the clock, and
//! one decision or a batch of them); the argument and reply contract is
//! written at the top of the prelude.
//! `leaky-bucket` runs `gcra`'s script with a flag, as the in-memory engine
//! runs GCRA's step and answers the delay.

use ::redis::Script;

use crate::{Config, Decision, PolicyKind};

use super::RedisError;

/// The largest `now` (in ticks) a script is given: 2^52. With windows up to
/// [`MAX_WINDOW`] every time a script computes stays below 2^53, where Lua's
/// doubles hold every integer exactly; Redis `TIME` in microseconds stays
/// below it until the year 2112.
pub const MAX_NOW: u64 = 1 << 52;

/// The longest window the scripts take, in ticks: 2^50 (35 years of
/// microseconds, 35,000 years of milliseconds). A script adds at most two
/// windows to a time, so `now + 2W` stays below 2^52 + 2^51.
pub const MAX_WINDOW: u64 = 1 << 50;

/// The largest `L × W` `sliding-window-counter` takes: 2^52. Its rule
/// compares `p·(W − e) + c·W` with `L·W`; each product is then at most 2^52
/// and the sum at most 2^53, exact in a double.
pub const MAX_COUNTER_PRODUCT: u64 = 1 << 52;

const PRELUDE: &str = include_str!("scripts/prelude.lua");
const DRIVER: &str = include_str!("scripts/driver.lua");

/// The most decisions one batch call carries: enough that the call's own
/// cost (a script run, a read and a write of the connection) is a small
/// part of each decision's, and few enough that one call holds Redis (which
/// runs scripts one at a time) for well under a millisecond.
pub(super) const MAX_BATCH: usize = 32;

/// The script that runs `policy`'s step.
pub(super) fn script(policy: PolicyKind) -> Script {
    let step = match policy {
        PolicyKind::SlidingWindow => include_str!("scripts/sliding_window.lua"),
        PolicyKind::TokenBucket => include_str!("scripts/token_bucket.lua"),
        PolicyKind::FixedWindow => include_str!("scripts/fixed_window.lua"),
        PolicyKind::SlidingWindowCounter => include_str!("scripts/sliding_window_counter.lua"),
        PolicyKind::Gcra | PolicyKind::LeakyBucket => include_str!("scripts/gcra.lua"),
    };
    // The step is the body of the prelude's `decide`: `end` closes it.
    Script::new(&format!("{PRELUDE}\n{step}\nend\n{DRIVER}"))
}

/// What a script is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// Decide one request of this cost, `1 <= cost <= L` (the limiter
    /// answers the other costs from [`Op::Remaining`]); 1 for a plain check.
    CheckN(u64),
    /// How many would be admitted.
    Remaining,
    /// How many would be admitted, if the key exists: the reply is nil for
    /// a key that does not, and the script writes nothing either way.
    Peek,
}

/// The arguments every call of one limiter shares (everything but the
/// operation and `now`), encoded once.
#[derive(Clone, Debug)]
pub(super) struct Arguments {
    limit: String,
    window: String,
    ms_per_tick: String,
    ticks_per_ms: String,
    min_ttl_ms: String,
    leaky: &'static str,
}

impl Arguments {
    /// `tick_ns` is the tick's length in nanoseconds: a whole number of
    /// milliseconds, or a divisor of one millisecond (checked by the
    /// options).
    pub(super) fn new(policy: PolicyKind, config: Config, tick_ns: u64, min_ttl_ms: u64) -> Self {
        const MS: u64 = 1_000_000;
        let (ms_per_tick, ticks_per_ms) = if tick_ns >= MS {
            (tick_ns / MS, 1)
        } else {
            (1, MS / tick_ns)
        };
        Self {
            limit: config.limit().to_string(),
            window: config.window().to_string(),
            ms_per_tick: ms_per_tick.to_string(),
            ticks_per_ms: ticks_per_ms.to_string(),
            min_ttl_ms: min_ttl_ms.to_string(),
            leaky: if policy == PolicyKind::LeakyBucket {
                "1"
            } else {
                "0"
            },
        }
    }

    /// The script call for `key`: `now` is `None` for the server's clock.
    ///
    /// # Errors
    ///
    /// [`RedisError::TimeOutOfRange`] for a `now` past [`MAX_NOW`].
    pub(super) fn invocation<'s>(
        &self,
        script: &'s Script,
        key: &str,
        op: Op,
        now: Option<u64>,
    ) -> Result<::redis::ScriptInvocation<'s>, RedisError> {
        Ok(self.call(script, key, op, &encode_now(now)?))
    }

    /// A check of `cost` of `key` at `now` (from [`encode_now`]): the call
    /// a batch of one sends.
    pub(super) fn single<'s>(
        &self,
        script: &'s Script,
        key: &str,
        now: &str,
        cost: u64,
    ) -> ::redis::ScriptInvocation<'s> {
        self.call(script, key, Op::CheckN(cost), now)
    }

    /// The call of `op` on `key` at `now` (from [`encode_now`]).
    fn call<'s>(
        &self,
        script: &'s Script,
        key: &str,
        op: Op,
        now: &str,
    ) -> ::redis::ScriptInvocation<'s> {
        let cost = match op {
            Op::CheckN(cost) => cost,
            _ => 1,
        };
        let op = match op {
            Op::CheckN(_) => "c",
            Op::Remaining => "r",
            Op::Peek => "p",
        };
        let mut call = script.key(key);
        self.head(&mut call, op, now, cost);
        call
    }

    /// `ARGV[1]` to `ARGV[9]` (the prelude's contract): the operation, the
    /// call's `now` and cost, and the arguments every call shares.
    fn head(&self, call: &mut ::redis::ScriptInvocation<'_>, op: &str, now: &str, cost: u64) {
        call.arg(op)
            .arg(now)
            .arg(&self.limit)
            .arg(&self.window)
            .arg(&self.ms_per_tick)
            .arg(&self.ticks_per_ms)
            .arg(&self.min_ttl_ms)
            .arg(self.leaky)
            .arg(cost);
    }

    /// A batch call: one check of each request's key in order, each
    /// `(key, now, cost)` with `now` from [`encode_now`] and `1 <= cost <= L`.
    /// The reply is one [`Reply`] per request.
    pub(super) fn batch<'s, 'r>(
        &self,
        script: &'s Script,
        requests: impl IntoIterator<Item = (&'r str, &'r str, u64)>,
    ) -> ::redis::ScriptInvocation<'s> {
        let mut call = script.prepare_invoke();
        // ARGV[2] and ARGV[9] (one call's now and cost) are unused by a batch
        // but keep their places, so the shared arguments keep theirs.
        self.head(&mut call, "b", "", 1);
        for (key, now, cost) in requests {
            call.key(key).arg(now).arg(cost);
        }
        call
    }
}

/// `now` as a script argument: empty for the server's clock.
///
/// # Errors
///
/// [`RedisError::TimeOutOfRange`] for a `now` past [`MAX_NOW`].
pub(super) fn encode_now(now: Option<u64>) -> Result<String, RedisError> {
    match now {
        Some(now) if now > MAX_NOW => Err(RedisError::TimeOutOfRange { now, max: MAX_NOW }),
        Some(now) => Ok(now.to_string()),
        None => Ok(String::new()),
    }
}

/// The reply every script gives: `{allowed, remaining, retry_after, delay}`.
pub(super) type Reply = (i64, i64, i64, i64);

/// The decision a script's reply carries.
///
/// # Errors
///
/// [`RedisError::Reply`] if a field is out of its range (a script bug, or a
/// key changed by something other than these scripts).
pub(super) fn decision(
    (allowed, remaining, retry_after, delay): Reply,
) -> Result<Decision, RedisError> {
    let field = |value: i64| {
        u64::try_from(value).map_err(|_| {
            RedisError::Reply(format!(
                "negative field in {{{allowed}, {remaining}, {retry_after}, {delay}}}"
            ))
        })
    };
    let allowed = match allowed {
        0 => false,
        1 => true,
        _ => {
            return Err(RedisError::Reply(format!(
                "allowed is {allowed}, not 0 or 1"
            )))
        }
    };
    Ok(Decision {
        allowed,
        remaining: field(remaining)?,
        retry_after: field(retry_after)?,
        delay: field(delay)?,
        // Made the limiter's own by `Core::decision`.
        tick: crate::Tick::NANOSECOND,
    })
}
