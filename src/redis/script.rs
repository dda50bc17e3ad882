//! The six policies as Lua scripts, and the one place that encodes their
//! arguments and decodes their replies.
//!
//! Every script is `scripts/prelude.lua` (argument parsing, the integer
//! helpers, the TTL writer), each rule's policy step as the body of a
//! function with that rule's constants, the `decide` that combines them
//! (a call of the one step, or `scripts/rules.lua` for several rules: every
//! step with its writes held, written only if all admit), then
//! `scripts/driver.lua` (the clock, and one decision or a batch of them);
//! the argument and reply contract is written at the top of the prelude.
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
const RULES: &str = include_str!("scripts/rules.lua");
const HELD: &str = include_str!("scripts/held.lua");

/// What a script answers for a wait no time ends (an `in-flight` rule's
/// refusal: only a release admits it): 2^53, larger than any wait a rate
/// rule computes, and read back as [`NEVER`](crate::decision::NEVER).
const NEVER_WAIT: i64 = 1 << 53;

/// The most decisions one batch call carries: enough that the call's own
/// cost (a script run, a read and a write of the connection) is a small
/// part of each decision's, and few enough that one call holds Redis (which
/// runs scripts one at a time) for well under a millisecond.
pub(super) const MAX_BATCH: usize = 32;

/// The script of one limiter: its rules' steps with their constants, and
/// how many keys (one per rule) each client has.
#[derive(Debug)]
pub(super) struct RuleScript {
    script: Script,
    rules: usize,
}

impl RuleScript {
    /// Adds `client`'s keys to `call`: the client's key itself for one rule
    /// (the layout of a single rule's limiter, unchanged), the key with
    /// `:0`, `:1`, … after it for several. Every suffix follows the hash
    /// tag, so all of a client's keys share its cluster slot.
    fn add_keys(&self, call: &mut ::redis::ScriptInvocation<'_>, client: &str) {
        if self.rules == 1 {
            call.key(client);
        } else {
            for rule in 0..self.rules {
                call.key(rule_key(client, rule));
            }
        }
    }
}

/// The key of rule `rule` of a client whose key (for several rules) is
/// `client`.
pub(super) fn rule_key(client: &str, rule: usize) -> String {
    format!("{client}:{rule}")
}

/// The script that runs each rule's step for one limiter: its constants
/// (each rule's limit and window, whether it answers a leaky bucket's
/// delay; the tick's length in milliseconds, the least TTL) are written
/// into the script as literals, so a call sends and Redis parses only its
/// own arguments (an operation, a `now` and a cost). Limiters of the same
/// rules and constants share one script. `rules` are `(policy, config)`
/// in ticks, at least one; `tick_ns` is the tick's length in nanoseconds: a
/// whole number of milliseconds, or a divisor of one millisecond (checked
/// by the options).
///
/// `lease` is how long, in ticks, an `in-flight` rule's holder holds its
/// units without a renewal (0: until released; at most [`MAX_WINDOW`]).
/// `term` is a leasing limiter's term δ in ticks (0: the limiter does not
/// lease; at most [`MAX_WINDOW`]), which a `sliding-window` rule's
/// admissions are written that much later by (`scripts/sliding_window.lua`).
pub(super) fn script(
    rules: &[(PolicyKind, Config)],
    tick_ns: u64,
    min_ttl_ms: u64,
    lease: u64,
    term: u64,
) -> RuleScript {
    use std::fmt::Write as _;
    const MS: u64 = 1_000_000;
    let (ms_per_tick, ticks_per_ms) = if tick_ns >= MS {
        (tick_ns / MS, 1)
    } else {
        (1, MS / tick_ns)
    };
    // Every constant is an integer below 2^53 (a limit below 2^32, a
    // window at most MAX_WINDOW, checked by the options; the least TTL
    // capped at the longest), written in decimal: Lua reads it exactly.
    let mut text = format!(
        "local K = {}\nlocal ms_per_tick = {ms_per_tick}\nlocal ticks_per_ms = {ticks_per_ms}\n\
         local min_ttl = {}\nlocal MAX_TTL = {MAX_TTL_MS}\nlocal LEASE = {lease}\n\
         local TERM = {term}\nlocal SHARE = {LEASE_SHARE}\n{PRELUDE}\n\
         {HELD}\nlocal steps = {{}}\n",
        rules.len(),
        min_ttl_ms.min(MAX_TTL_MS),
    );
    for (index, &(policy, config)) in rules.iter().enumerate() {
        let step = match policy {
            PolicyKind::SlidingWindow => include_str!("scripts/sliding_window.lua"),
            PolicyKind::TokenBucket => include_str!("scripts/token_bucket.lua"),
            PolicyKind::FixedWindow => include_str!("scripts/fixed_window.lua"),
            PolicyKind::SlidingWindowCounter => include_str!("scripts/sliding_window_counter.lua"),
            PolicyKind::Gcra | PolicyKind::LeakyBucket => include_str!("scripts/gcra.lua"),
            PolicyKind::InFlight => {
                let _ = writeln!(text, "holds[{}] = true", index + 1);
                include_str!("scripts/in_flight.lua")
            }
        };
        // Each step in a block of its own, so that its L, W and leaky are
        // its rule's.
        let _ = write!(
            text,
            "do\nlocal L = {}\nlocal W = {}\nlocal leaky = {}\n\
             steps[{}] = function(key, check, now, cost)\n{step}\nend\nend\n",
            config.limit(),
            config.window(),
            policy == PolicyKind::LeakyBucket,
            index + 1,
        );
    }
    if rules.len() == 1 {
        // One rule's answer is the decision itself: no `answers`.
        text.push_str(
            "local step = steps[1]\nlocal function decide(first, check, now, cost)\n\
             return step(KEYS[first], check, now, cost)\nend\nlocal answers\n",
        );
    } else {
        let limits: Vec<String> = rules
            .iter()
            .map(|(_, config)| config.limit().to_string())
            .collect();
        let _ = writeln!(text, "local limits = {{{}}}", limits.join(", "));
        text.push_str(RULES);
    }
    text.push_str(DRIVER);
    RuleScript {
        script: Script::new(&text),
        rules: rules.len(),
    }
}

/// A lease takes at most the caller's cost plus this fraction's inverse of
/// what is left over it: with the shared remainder falling, leases shrink
/// to the cost alone, so near the limit few units are out on lease and
/// none stranded at one instance (the contract's "Never far under it").
pub(super) const LEASE_SHARE: u64 = 4;

/// The longest TTL a script sets, in milliseconds: 2^46 (2,230 years), the
/// scripts' `MAX_TTL`. A longer least TTL is that.
const MAX_TTL_MS: u64 = 1 << 46;

/// What a script is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// Decide one request of this cost, `1 <= cost <= L` for every rule's
    /// `L` (the limiter answers the other costs from [`Op::Remaining`]); 1
    /// for a plain check.
    CheckN(u64),
    /// How many would be admitted.
    Remaining,
    /// How many would be admitted, if any of the client's keys exists: the
    /// reply is nil for a client with none, and the script writes nothing
    /// either way.
    Peek,
    /// Give back up to `cost` units of the admission at `at` (ticks):
    /// the reply is the units given back, 0 for a client with no key.
    Refund { cost: u64, at: u64 },
    /// [`CheckN`](Op::CheckN) of a limiter with `in-flight` rules: an
    /// admission holds its units as the holder `<cost>:<id>`.
    Hold { cost: u64, id: u64 },
    /// A lease of a leasing limiter: an admission of up to `ask` units,
    /// at least `cost` (`1 <= cost <= ask <= L` for every rule's `L`); the
    /// reply is a [`LeaseReply`].
    Lease { cost: u64, ask: u64 },
}

/// A wait a script answered, in ticks: [`NEVER`](crate::decision::NEVER)
/// for [`NEVER_WAIT`] and beyond; `None` for a negative one (a script bug).
pub(super) fn wait(value: i64) -> Option<u64> {
    if value >= NEVER_WAIT {
        return Some(crate::decision::NEVER);
    }
    u64::try_from(value).ok()
}

/// The holder an admission of `cost` units with id `id` is kept as, in
/// each `in-flight` rule's sorted set (`scripts/held.lua`).
pub(super) fn holder(cost: u64, id: u64) -> String {
    format!("{cost}:{id:016x}")
}

/// The script call for `key`: `now` is `None` for the server's clock.
///
/// # Errors
///
/// [`RedisError::TimeOutOfRange`] for a `now` past [`MAX_NOW`].
pub(super) fn invocation<'s>(
    script: &'s RuleScript,
    key: &str,
    op: Op,
    now: Option<u64>,
) -> Result<::redis::ScriptInvocation<'s>, RedisError> {
    Ok(call(script, key, op, &encode_now(now)?))
}

/// A check of `cost` of `key` at `now` (from [`encode_now`]): the call a
/// batch of one sends.
pub(super) fn single<'s>(
    script: &'s RuleScript,
    key: &str,
    now: &str,
    cost: u64,
) -> ::redis::ScriptInvocation<'s> {
    call(script, key, Op::CheckN(cost), now)
}

/// The call of `op` on `key` at `now` (from [`encode_now`]): `ARGV[1]` to
/// `ARGV[3]` of the prelude's contract.
fn call<'s>(script: &'s RuleScript, key: &str, op: Op, now: &str) -> ::redis::ScriptInvocation<'s> {
    let (name, cost) = match op {
        Op::CheckN(cost) => ("c", cost),
        Op::Remaining => ("r", 1),
        Op::Peek => ("p", 1),
        Op::Refund { cost, .. } => ("f", cost),
        Op::Hold { cost, .. } => ("c", cost),
        Op::Lease { cost, .. } => ("g", cost),
    };
    let mut call = script.script.prepare_invoke();
    script.add_keys(&mut call, key);
    call.arg(name).arg(now).arg(cost);
    match op {
        Op::Refund { at, .. } => {
            call.arg(at);
        }
        Op::Hold { id, .. } => {
            call.arg(format!("{id:016x}"));
        }
        Op::Lease { ask, .. } => {
            call.arg(ask);
        }
        _ => {}
    }
    call
}

/// The call that releases up to `cost` units of `key` at `now` (from
/// [`encode_now`]) from the holders `holders` (this process's own, as
/// [`holder`] names them), or, with none, from the holders whose leases end
/// first: the reply is the units released.
pub(super) fn release<'s>(
    script: &'s RuleScript,
    key: &str,
    now: &str,
    cost: u64,
    holders: &[String],
) -> ::redis::ScriptInvocation<'s> {
    let mut call = script.script.prepare_invoke();
    script.add_keys(&mut call, key);
    call.arg("l").arg(now).arg(cost);
    for holder in holders {
        call.arg(holder);
    }
    call
}

/// The call that renews the leases of `key`'s holders `holders` at `now`
/// (from [`encode_now`]): the reply is how many are still held.
pub(super) fn renew<'s>(
    script: &'s RuleScript,
    key: &str,
    now: &str,
    holders: &[String],
) -> ::redis::ScriptInvocation<'s> {
    let mut call = script.script.prepare_invoke();
    script.add_keys(&mut call, key);
    call.arg("w").arg(now);
    for holder in holders {
        call.arg(holder);
    }
    call
}

/// The call that asks each rule's own answer to a request of cost `cost`
/// of `key` at `now` (from [`encode_now`]) that the limiter decided,
/// `admitted` or not: [`Answers`] is the reply.
pub(super) fn answers<'s>(
    script: &'s RuleScript,
    key: &str,
    now: &str,
    cost: u64,
    admitted: bool,
) -> ::redis::ScriptInvocation<'s> {
    let mut call = script.script.prepare_invoke();
    script.add_keys(&mut call, key);
    call.arg("e").arg(now).arg(cost).arg(u8::from(admitted));
    call
}

/// Each rule's own answer, from the `answers` call: per rule, its
/// remaining now, and whether it alone admits, its retry_after and its
/// delay (0 when not asked).
pub(super) type Answers = Vec<i64>;

/// A batch call: one check of each request's client in order, each
/// `(key, now, cost)` with `now` from [`encode_now`] and `1 <= cost <= L`
/// for every rule's `L`. The reply is one [`Reply`] per request.
pub(super) fn batch<'s, 'r>(
    script: &'s RuleScript,
    requests: impl IntoIterator<Item = (&'r str, &'r str, u64)>,
) -> ::redis::ScriptInvocation<'s> {
    let mut call = script.script.prepare_invoke();
    call.arg("b");
    for (key, now, cost) in requests {
        script.add_keys(&mut call, key);
        call.arg(now).arg(cost);
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

/// The reply every script gives: `{allowed, remaining, retry_after, delay}`,
/// the index of the rule that refused (0 for one rule), and the time the
/// call was judged at (in the limiter's ticks: the server's when it keeps
/// the time), which a refund names the admission by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Reply {
    allowed: i64,
    remaining: i64,
    retry_after: i64,
    delay: i64,
    refused_by: i64,
    at: i64,
}

impl ::redis::FromRedisValue for Reply {
    /// Read in place: a reply is decoded on every decision, so without the
    /// vector of fields a generic read would allocate.
    fn from_redis_value(value: ::redis::Value) -> Result<Self, ::redis::ParsingError> {
        let ::redis::Value::Array(items) = &value else {
            return Err(format!("a reply that is not an array: {value:?}").into());
        };
        let field = |index: usize| match items.get(index) {
            Some(item) => i64::from_redis_value_ref(item),
            None => Ok(0),
        };
        if items.len() != 6 {
            return Err(format!("a reply of {} fields, not 6", items.len()).into());
        }
        Ok(Reply {
            allowed: field(0)?,
            remaining: field(1)?,
            retry_after: field(2)?,
            delay: field(3)?,
            refused_by: field(4)?,
            at: field(5)?,
        })
    }
}

/// The decision a script's reply carries.
///
/// # Errors
///
/// [`RedisError::Reply`] if a field is out of its range (a script bug, or a
/// key changed by something other than these scripts).
pub(super) fn decision(reply: Reply) -> Result<Decision, RedisError> {
    let Reply {
        allowed,
        remaining,
        retry_after,
        delay,
        refused_by,
        at,
    } = reply;
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
    let refused_by = usize::try_from(refused_by)
        .ok()
        .filter(|&index| index < crate::MAX_RULES)
        .ok_or_else(|| RedisError::Reply(format!("refused by rule {refused_by}")))?;
    // An `in-flight` rule's refusal: no wait admits it.
    let retry_after = match wait(retry_after) {
        Some(wait) => wait,
        None => field(retry_after)?,
    };
    Ok(Decision {
        allowed,
        remaining: field(remaining)?,
        retry_after,
        delay: field(delay)?,
        // Made the limiter's own by `Core::decision`.
        tick: crate::Tick::NANOSECOND,
        refused_by: 0,
        at: field(at)?,
    }
    .by_rule(refused_by))
}

/// A lease's reply: the check's [`Reply`] for an admission of the grant,
/// the grant (0 when refused) and the lease's term in ticks from the time
/// it was judged at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LeaseReply {
    pub(super) reply: Reply,
    pub(super) granted: u64,
    pub(super) term: u64,
}

impl ::redis::FromRedisValue for LeaseReply {
    fn from_redis_value(value: ::redis::Value) -> Result<Self, ::redis::ParsingError> {
        let ::redis::Value::Array(mut items) = value else {
            return Err(format!("a lease reply that is not an array: {value:?}").into());
        };
        if items.len() != 8 {
            return Err(format!("a lease reply of {} fields, not 8", items.len()).into());
        }
        let term = u64::from_redis_value(items.pop().expect("8 fields"))?;
        let granted = u64::from_redis_value(items.pop().expect("7 fields"))?;
        let reply = Reply::from_redis_value(::redis::Value::Array(items))?;
        Ok(LeaseReply {
            reply,
            granted,
            term,
        })
    }
}
