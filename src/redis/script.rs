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

/// The script that runs `policy`'s step for one limiter: its constants
/// (the limit, the window, the tick's length in milliseconds, the least TTL,
/// whether to answer a leaky bucket's delay) are written into the script as
/// literals, so a call sends and Redis parses only its own arguments (an
/// operation, a `now` and a cost). Limiters of the same policy and
/// constants share one script. `tick_ns` is the tick's length in
/// nanoseconds: a whole number of milliseconds, or a divisor of one
/// millisecond (checked by the options).
pub(super) fn script(policy: PolicyKind, config: Config, tick_ns: u64, min_ttl_ms: u64) -> Script {
    const MS: u64 = 1_000_000;
    let (ms_per_tick, ticks_per_ms) = if tick_ns >= MS {
        (tick_ns / MS, 1)
    } else {
        (1, MS / tick_ns)
    };
    let step = match policy {
        PolicyKind::SlidingWindow => include_str!("scripts/sliding_window.lua"),
        PolicyKind::TokenBucket => include_str!("scripts/token_bucket.lua"),
        PolicyKind::FixedWindow => include_str!("scripts/fixed_window.lua"),
        PolicyKind::SlidingWindowCounter => include_str!("scripts/sliding_window_counter.lua"),
        PolicyKind::Gcra | PolicyKind::LeakyBucket => include_str!("scripts/gcra.lua"),
    };
    // Every constant is an integer below 2^53 (the limit below 2^32, the
    // window at most MAX_WINDOW, checked by the options; the least TTL
    // capped at the longest), written in decimal: Lua reads it exactly.
    let constants = format!(
        "local L = {}\nlocal W = {}\nlocal ms_per_tick = {ms_per_tick}\n\
         local ticks_per_ms = {ticks_per_ms}\nlocal min_ttl = {}\nlocal leaky = {}\n\
         local MAX_TTL = {MAX_TTL_MS}\n",
        config.limit(),
        config.window(),
        min_ttl_ms.min(MAX_TTL_MS),
        policy == PolicyKind::LeakyBucket,
    );
    // The step is the body of the prelude's `decide`: `end` closes it.
    Script::new(&format!("{constants}{PRELUDE}\n{step}\nend\n{DRIVER}"))
}

/// The longest TTL a script sets, in milliseconds: 2^46 (2,230 years), the
/// scripts' `MAX_TTL`. A longer least TTL is that.
const MAX_TTL_MS: u64 = 1 << 46;

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

/// The script call for `key`: `now` is `None` for the server's clock.
///
/// # Errors
///
/// [`RedisError::TimeOutOfRange`] for a `now` past [`MAX_NOW`].
pub(super) fn invocation<'s>(
    script: &'s Script,
    key: &str,
    op: Op,
    now: Option<u64>,
) -> Result<::redis::ScriptInvocation<'s>, RedisError> {
    Ok(call(script, key, op, &encode_now(now)?))
}

/// A check of `cost` of `key` at `now` (from [`encode_now`]): the call a
/// batch of one sends.
pub(super) fn single<'s>(
    script: &'s Script,
    key: &str,
    now: &str,
    cost: u64,
) -> ::redis::ScriptInvocation<'s> {
    call(script, key, Op::CheckN(cost), now)
}

/// The call of `op` on `key` at `now` (from [`encode_now`]): `ARGV[1]` to
/// `ARGV[3]` of the prelude's contract.
fn call<'s>(script: &'s Script, key: &str, op: Op, now: &str) -> ::redis::ScriptInvocation<'s> {
    let (op, cost) = match op {
        Op::CheckN(cost) => ("c", cost),
        Op::Remaining => ("r", 1),
        Op::Peek => ("p", 1),
    };
    let mut call = script.key(key);
    call.arg(op).arg(now).arg(cost);
    call
}

/// A batch call: one check of each request's key in order, each
/// `(key, now, cost)` with `now` from [`encode_now`] and `1 <= cost <= L`.
/// The reply is one [`Reply`] per request.
pub(super) fn batch<'s, 'r>(
    script: &'s Script,
    requests: impl IntoIterator<Item = (&'r str, &'r str, u64)>,
) -> ::redis::ScriptInvocation<'s> {
    let mut call = script.prepare_invoke();
    call.arg("b");
    for (key, now, cost) in requests {
        call.key(key).arg(now).arg(cost);
    }
    call
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
        refused_by: 0,
    })
}
