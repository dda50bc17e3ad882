//! What the fuzz targets check, callable from anywhere: the targets in
//! `fuzz_targets/` run these functions on libFuzzer's inputs, and the
//! library's `tests/suite/fuzz_regressions.rs` runs them (through a `#[path]`
//! module) on every input kept in `fuzz/regressions/`. This file therefore
//! depends on nothing but `floodgate` and `std`.
//!
//! An input is raw bytes, decoded by [`Input::decode`] so that every byte
//! string is a valid input and small mutations make small changes: a policy,
//! a limit and window, a starting time, then calls, each a client (one of
//! four), `allow` or `remaining`, and a step of the clock drawn from shapes
//! that find edges — the same instant, a few ticks, one window either side,
//! `2^k` windows, the drip interval, any `u64`. When time may go back, a
//! call may also be preceded by a sweep at its time and by a reload of the
//! tier (for the limiters that have them, see [`check_time_backwards`]). A
//! first byte of 128 or more makes a weighted input (time never decreasing
//! only): each `allow` then carries a cost too, from shapes that find the
//! contract's edges — 0, 1 to `L`, `L`, `L + 1`, `u64::MAX`, any `u64`.
#![forbid(unsafe_code)]

use floodgate::tiers::{TierSpec, Tiers};
use floodgate::{
    build_bounded, build_with, Bounds, Config, Engine, ManualClock, PolicyKind, RateLimiter,
    MAX_LIMIT,
};
use std::sync::Arc;

/// The most calls one input makes: the checks of [`check_time_backwards`]
/// replay the history for each backwards call, so their cost is quadratic.
pub const MAX_CALLS: usize = 256;

/// The largest sliding-window limit an input asks for: the ring allocates
/// `L` slots per client up front, and a fuzzer wants thousands of runs a
/// second. Every other policy takes limits up to [`MAX_LIMIT`].
pub const MAX_SLIDING_LIMIT: u64 = 4_096;

/// Reads the bytes of an input front to back; past the end, every read is 0.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&first, rest)) => {
                self.0 = rest;
                first
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A cost for a limit of `limit`: one byte picks the shape (a 0, as
    /// past the end, is the absent cost, 1), some shapes read more.
    fn cost(&mut self, limit: u64) -> u64 {
        let shape = self.u8();
        match shape % 8 {
            0 => 1,
            1 => 0,
            2 | 3 => 1 + u64::from(shape >> 3) % limit,
            4 => limit,
            5 => limit.saturating_add(1),
            6 => u64::MAX,
            _ => self.u64(),
        }
    }
}

/// `allow` or `remaining`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// `check_n_at`: decide one request of the call's cost.
    Allow,
    /// `remaining_at`.
    Remaining,
}

/// The rule a reload installs, relative to the input's own (its *base*).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// The rule the tier has now: a no-op.
    Current,
    /// The base rule: a no-op unless the tier has another one now.
    Base,
    /// A rule that admits what the base admits but is not equal to it, so
    /// that a reload to it carries every client over: `gcra` ↔
    /// `leaky-bucket`, `fixed-window` ↔ `sliding-window-counter`, and
    /// `(L, W + 1)` for the other two.
    Twin,
    /// The base policy at another limit: `L + 1`, or `L − 1` where `L + 1`
    /// is refused.
    OtherLimit,
}

/// One call of an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// Which call.
    pub verb: Verb,
    /// The client, `0..4`.
    pub client: u64,
    /// The time passed to the call.
    pub now: u64,
    /// Before the call, the tier is reloaded with this rule (by the checks
    /// that drive a tier registry).
    pub reload: Option<Rule>,
    /// Before the call (and after any reload), a sweep at `now` (by the
    /// checks that drive a limiter with idle eviction).
    pub sweep: bool,
    /// The request's cost (1 unless the input is weighted; always 1 for
    /// `remaining`).
    pub cost: u64,
}

/// A decoded input: one limiter configuration and the calls made on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    /// The policy.
    pub policy: PolicyKind,
    /// The limit, possibly one the policy refuses (then both engines must
    /// refuse it alike).
    pub limit: u64,
    /// The window, possibly one the policy refuses.
    pub window: u64,
    /// The calls, in order.
    pub calls: Vec<Call>,
    /// More rules applied to every client with the first (the contract's
    /// "Several limits on one client"): a policy, limit and window each,
    /// possibly ones the policy refuses. Only in inputs without time going
    /// back whose first byte has bit 6 set.
    pub more: Vec<(PolicyKind, u64, u64)>,
}

impl Input {
    /// Decodes `data`. With `backwards`, a step of the clock may go back as
    /// well as forward; without, time never decreases, and a first byte of
    /// 128 or more gives every `allow` a cost (see [`Bytes::cost`]).
    pub fn decode(data: &[u8], backwards: bool) -> Self {
        let mut bytes = Bytes(data);
        let first = bytes.u8();
        // The policy is `first mod 6` either way; 128..=255 covers all six.
        let weighted = !backwards && first >= 128;
        let policy = PolicyKind::ALL[usize::from(first) % PolicyKind::ALL.len()];
        let more = if !backwards && first & 64 != 0 {
            (0..1 + bytes.u8() % 2)
                .map(|_| {
                    let policy = PolicyKind::ALL[usize::from(bytes.u8()) % PolicyKind::ALL.len()];
                    let limit = 1 + u64::from(bytes.u8() % 16);
                    let window = match bytes.u8() % 3 {
                        0 => 1 + u64::from(bytes.u8()),
                        1 => limit.saturating_mul(1 + u64::from(bytes.u8())),
                        _ => bytes.u64().max(1),
                    };
                    (policy, limit, window)
                })
                .collect()
        } else {
            Vec::new()
        };
        let limit = match bytes.u8() % 4 {
            0 | 1 => 1 + u64::from(bytes.u8() % 8),
            2 => 1 + u64::from(bytes.u16() % 256),
            _ => 1 + u64::from(bytes.u32()) % MAX_LIMIT,
        };
        let limit = if policy == PolicyKind::SlidingWindow {
            limit.min(MAX_SLIDING_LIMIT)
        } else {
            limit
        };
        let window = match bytes.u8() % 6 {
            0 => 1 + u64::from(bytes.u8()),
            1 => 1 + u64::from(bytes.u16()),
            2 => 1 << (bytes.u8() % 64),
            3 => bytes.u64().max(1),
            // A whole number of drip intervals, and a ragged one.
            4 => limit.saturating_mul(1 + u64::from(bytes.u8())),
            _ => limit.saturating_mul(1 + u64::from(bytes.u8())) + u64::from(bytes.u8()),
        };
        let mut now = match bytes.u8() % 3 {
            0 => 0,
            1 => u64::from(bytes.u32()),
            _ => bytes.u64(),
        };
        let interval = (window / limit).max(1);
        let mut calls = Vec::new();
        while !bytes.is_empty() && calls.len() < MAX_CALLS {
            let op = bytes.u8();
            let verb = if op & 1 == 0 {
                Verb::Allow
            } else {
                Verb::Remaining
            };
            let client = u64::from((op >> 1) & 3);
            let step = match op >> 3 {
                0..=9 => 0,
                10..=15 => u64::from(bytes.u8()),
                16..=18 => u64::from(bytes.u16()),
                19..=22 => {
                    let edge = window.saturating_mul(u64::from(bytes.u8() % 3));
                    let jitter = bytes.u8();
                    match jitter % 3 {
                        0 => edge,
                        1 => edge.saturating_sub(1),
                        _ => edge.saturating_add(1),
                    }
                }
                23..=26 => {
                    let windows = u128::from(window) << (bytes.u8() % 64);
                    u64::try_from(windows).unwrap_or(u64::MAX)
                }
                27..=29 => interval.saturating_mul(u64::from(bytes.u8())),
                _ => bytes.u64(),
            };
            // The byte that says which way time goes also says what else
            // happens before the call: bit 0 the direction, bits 1–2 a
            // sweep (one call in four), bits 3–4 a reload (one in four),
            // bits 5–6 its rule.
            let (back, reload, sweep) = if backwards {
                let events = bytes.u8();
                let rule = match (events >> 5) & 3 {
                    0 => Rule::Current,
                    1 => Rule::Base,
                    2 => Rule::Twin,
                    _ => Rule::OtherLimit,
                };
                (
                    events & 1 == 1,
                    ((events >> 3) & 3 == 3).then_some(rule),
                    (events >> 1) & 3 == 3,
                )
            } else {
                (false, None, false)
            };
            now = if back {
                now.saturating_sub(step)
            } else {
                now.saturating_add(step)
            };
            let cost = if weighted && verb == Verb::Allow {
                bytes.cost(limit)
            } else {
                1
            };
            calls.push(Call {
                verb,
                client,
                now,
                reload,
                sweep,
                cost,
            });
        }
        Input {
            policy,
            limit,
            window,
            calls,
            more,
        }
    }
}

/// What one call answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Decision(floodgate::Decision),
    Remaining(u64),
    Refunded(u64),
}

/// The refund the differential checks make of a `remaining` call, leaving
/// the decoding as it is (so the kept inputs mean what they meant): one
/// call in four, chosen by its time's low bits, gives back the cost of its
/// client's latest check (`last_cost`), of an admission `ago` ticks before
/// it: at once, `W − 1` or `W` ticks before (the contract's edge), or a
/// few intervals before (often a time that was no admission).
fn as_refund(call: Call, window: u64, last_cost: u64) -> Option<(u64, u64)> {
    if call.verb != Verb::Remaining || call.now & 3 != 1 {
        return None;
    }
    let ago = match (call.now >> 2) & 3 {
        0 => 0,
        1 => window - 1,
        2 => window,
        _ => (call.now >> 4) & 0xff,
    };
    Some((call.now.saturating_sub(ago), last_cost))
}

/// `call`, or the refund [`as_refund`] makes of it.
fn call_or_refund(limiter: &dyn RateLimiter<u64>, c: Call, refund: Option<(u64, u64)>) -> Answer {
    match refund {
        Some((at, cost)) => Answer::Refunded(limiter.refund_at(&c.client, c.now, at, cost)),
        None => call(limiter, c),
    }
}

fn call(limiter: &dyn RateLimiter<u64>, call: Call) -> Answer {
    match call.verb {
        Verb::Allow => Answer::Decision(limiter.check_n_at(&call.client, call.now, call.cost)),
        Verb::Remaining => Answer::Remaining(limiter.remaining_at(&call.client, call.now)),
    }
}

/// Whether a call `since` ticks past its client's origin is inside the
/// horizon where no time the engines hold can saturate: every stored time is
/// at most `now + 2W` past the origin (a GCRA schedule runs at most `τ + I`
/// ahead, a window ends within `W`), so answers are exact while that fits
/// in a `u64`; and the lock-free engine's `u64`-word policies stop their
/// clock at 2^62 − 1 ticks past the origin (146 years of nanoseconds, far
/// past the contract's 2 × 10^12 ticks). For a limiter's drip policy the
/// origin here is tick 0 ([`counts_from_zero`]). Past it the engines may answer
/// differently; they must still not panic.
pub fn within_horizon(since: u64, window: u64) -> bool {
    since < 1 << 62 && u128::from(since) + 2 * u128::from(window) <= u128::from(u64::MAX)
}

/// Whether the lock-free limiter counts `policy`'s times from tick 0
/// rather than from each client's origin: the drip policies keep no origin
/// (`token-bucket` stores the drip from which its bucket is full, a
/// schedule begins at `TAT = origin`), so their horizon
/// ([`within_horizon`]) is measured from 0. Tiers keep every client's
/// origin.
pub fn counts_from_zero(policy: PolicyKind) -> bool {
    policy.drips()
}

/// Differential check, time never decreasing: the lock-free engine and the
/// mutex baseline refuse the same configurations and, call by call, give
/// identical answers — every field of every decision — as long as the
/// client stays within [`within_horizon`]; and they track the same clients.
/// Neither may panic, inside the horizon or past it.
///
/// # Panics
///
/// On any disagreement, with the input and the call that showed it.
pub fn check_differential(data: &[u8]) {
    let input = Input::decode(data, false);
    if !input.more.is_empty() {
        return check_differential_rules(&input);
    }
    let Ok(config) = Config::per_ticks(input.limit, input.window) else {
        return; // the inputs' ranges are checked before any engine is involved
    };
    let lock_free =
        build_with::<u64, _>(input.policy, config, Engine::LockFree, ManualClock::new(0));
    let mutex = build_with::<u64, _>(input.policy, config, Engine::Mutex, ManualClock::new(0));
    let (lock_free, mutex) = match (lock_free, mutex) {
        (Ok(lock_free), Ok(mutex)) => (lock_free, mutex),
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "the engines refuse {input:?} differently");
            return;
        }
        (a, b) => panic!(
            "one engine refuses {input:?}: lockfree {:?}, mutex {:?}",
            a.err(),
            b.err()
        ),
    };
    // Per client: where its times count from (its origin, or 0), and
    // whether it has stayed inside the horizon.
    let mut clients: [Option<(u64, bool)>; 4] = [None; 4];
    let from_zero = counts_from_zero(input.policy);
    let mut last_cost = [1; 4];
    for (k, &c) in input.calls.iter().enumerate() {
        let refund = as_refund(c, input.window, last_cost[c.client as usize]);
        if c.verb == Verb::Allow {
            last_cost[c.client as usize] = c.cost;
        }
        let (a, b) = (
            call_or_refund(&*lock_free, c, refund),
            call_or_refund(&*mutex, c, refund),
        );
        let counted_from = if from_zero { 0 } else { c.now };
        let (origin, inside) = clients[c.client as usize].get_or_insert((counted_from, true));
        *inside &= within_horizon(c.now.saturating_sub(*origin), input.window);
        if *inside {
            assert_eq!(
                a, b,
                "call {k} {c:?} (refund {refund:?}) of {input:?}: lockfree (left) and mutex \
                 (right) disagree"
            );
        }
    }
    assert_eq!(
        lock_free.tracked_clients(),
        mutex.tracked_clients(),
        "{input:?}"
    );
}

/// [`check_differential`] for several rules on one client: both engines
/// refuse the same rule sets and, call by call, answer alike (which rule
/// refused included) while every rule of the client stays within
/// [`within_horizon`] (measured from 0 for a drip rule, from the client's
/// origin for a window rule, as one rule alone).
fn check_differential_rules(input: &Input) {
    let rules: Result<Vec<floodgate::Rule>, _> =
        std::iter::once((input.policy, input.limit, input.window))
            .chain(input.more.iter().copied())
            .map(|(policy, limit, window)| {
                Config::per_ticks(limit, window)
                    .and_then(|config| floodgate::Rule::new(policy, config))
            })
            .collect();
    let Ok(rules) = rules.and_then(floodgate::RuleSet::new) else {
        return; // a rule refused before any engine is involved
    };
    let build = |engine| {
        floodgate::build_rules::<u64, _>(
            &rules,
            engine,
            ManualClock::new(0),
            floodgate::Bounds::new(),
        )
        .unwrap_or_else(|e| panic!("{rules}: {e}"))
    };
    let (lock_free, mutex) = (build(Engine::LockFree), build(Engine::Mutex));
    let mut origins: [Option<u64>; 4] = [None; 4];
    let mut inside = [true; 4];
    let mut last_cost = [1; 4];
    for (k, &c) in input.calls.iter().enumerate() {
        let refund = as_refund(c, input.window, last_cost[c.client as usize]);
        if c.verb == Verb::Allow {
            last_cost[c.client as usize] = c.cost;
        }
        let (a, b) = (
            call_or_refund(&*lock_free, c, refund),
            call_or_refund(&*mutex, c, refund),
        );
        let origin = *origins[c.client as usize].get_or_insert(c.now);
        let client = c.client as usize;
        inside[client] &= rules.iter().all(|rule| {
            let from = if counts_from_zero(rule.policy()) {
                0
            } else {
                origin
            };
            within_horizon(c.now.saturating_sub(from), rule.config().window())
        });
        if inside[client] {
            assert_eq!(
                a, b,
                "call {k} {c:?} (refund {refund:?}) of {rules} ({input:?}): lockfree (left) and \
                 mutex (right) disagree"
            );
        }
    }
    assert_eq!(
        lock_free.tracked_clients(),
        mutex.tracked_clients(),
        "{rules}"
    );
}

/// What the check knows of `client` after its tier carried it over at `at`
/// (no older than its latest time): its state was rebuilt at `at`, so it
/// reflects `at`, even when it kept nothing of what was spent.
fn carried_over(subject: &Subject, at: u64, known: &mut Known) {
    let (Subject::Tiers(_), Known::Tracked { origin, latest }) = (subject, *known) else {
        return;
    };
    *known = Known::Tracked {
        origin,
        latest: latest.max(at),
    };
}

/// The one tier of the registries [`check_time_backwards`] drives.
const TIER: &str = "only";

fn one_tier(_: &u64) -> &'static str {
    TIER
}

/// A registry of one tier, [`TIER`].
type OneTier = Tiers<u64, fn(&u64) -> &'static str, ManualClock>;

/// A limiter [`check_time_backwards`] drives, with what it does besides
/// calls.
enum Subject {
    /// A limiter with no bounds: calls only.
    Plain(Arc<dyn RateLimiter<u64>>),
    /// A limiter with idle eviction: calls and sweeps.
    Evicting(Arc<dyn RateLimiter<u64>>),
    /// A registry of one tier with idle eviction: calls, sweeps and
    /// reloads.
    Tiers(OneTier),
}

/// Which [`Subject`] to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Plain(Engine),
    Evicting(Engine),
    Tiers,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kind::Plain(engine) => write!(f, "{engine}"),
            Kind::Evicting(engine) => write!(f, "{engine} evicting idle clients"),
            Kind::Tiers => f.write_str("tiers evicting idle clients"),
        }
    }
}

/// What a subject did, in order: what a twin replays.
#[derive(Clone, Copy, Debug)]
enum Op {
    Call(Call),
    Sweep(u64),
    Reload(TierSpec),
    Peek(u64, u64),
}

impl Subject {
    fn new(input: &Input, kind: Kind) -> Option<Self> {
        let config = Config::per_ticks(input.limit, input.window).ok()?;
        let bounds = Bounds::new().evict_idle();
        Some(match kind {
            Kind::Plain(engine) => {
                Subject::Plain(build_with(input.policy, config, engine, ManualClock::new(0)).ok()?)
            }
            Kind::Evicting(engine) => Subject::Evicting(
                build_bounded(input.policy, config, engine, ManualClock::new(0), bounds).ok()?,
            ),
            Kind::Tiers => Subject::Tiers(
                Tiers::with_clock(
                    TIER,
                    TierSpec::new(input.policy, config).ok()?,
                    one_tier as fn(&u64) -> &'static str,
                    ManualClock::new(0),
                )
                .ok()?
                .with_bounds(bounds)
                .ok()?,
            ),
        })
    }

    fn limiter(&self) -> &dyn RateLimiter<u64> {
        match self {
            Subject::Plain(limiter) | Subject::Evicting(limiter) => &**limiter,
            Subject::Tiers(tiers) => tiers,
        }
    }

    fn evicts(&self) -> bool {
        !matches!(self, Subject::Plain(_))
    }

    /// The rule `rule` names for a tier whose base is `input`'s and whose
    /// rule now is `current`; `None` where that rule would be refused.
    fn rule(input: &Input, rule: Rule, current: TierSpec) -> Option<TierSpec> {
        let spec = |policy, limit, window| {
            TierSpec::new(policy, Config::per_ticks(limit, window).ok()?).ok()
        };
        let (policy, limit, window) = (input.policy, input.limit, input.window);
        match rule {
            Rule::Current => Some(current),
            Rule::Base => spec(policy, limit, window),
            Rule::Twin => match policy {
                PolicyKind::Gcra => spec(PolicyKind::LeakyBucket, limit, window),
                PolicyKind::LeakyBucket => spec(PolicyKind::Gcra, limit, window),
                PolicyKind::FixedWindow => spec(PolicyKind::SlidingWindowCounter, limit, window),
                PolicyKind::SlidingWindowCounter => spec(PolicyKind::FixedWindow, limit, window),
                PolicyKind::TokenBucket | PolicyKind::SlidingWindow => {
                    spec(policy, limit, window.checked_add(1)?)
                }
                // The fuzzed policies are the rate policies only.
                PolicyKind::InFlight => None,
            },
            Rule::OtherLimit => {
                let higher = (policy != PolicyKind::SlidingWindow || limit < MAX_SLIDING_LIMIT)
                    .then(|| spec(policy, limit + 1, window))
                    .flatten();
                higher.or_else(|| spec(policy, limit.checked_sub(1)?, window))
            }
        }
    }

    fn apply(&self, op: Op) {
        match (self, op) {
            (_, Op::Call(c)) => {
                call(self.limiter(), c);
            }
            (_, Op::Sweep(now)) => {
                self.limiter().sweep_at(now);
            }
            (Subject::Tiers(tiers), Op::Reload(spec)) => {
                tiers.reload(TIER, spec).expect("the registry's own tier");
            }
            (_, Op::Reload(_)) => unreachable!("only a registry is reloaded"),
            (_, Op::Peek(client, now)) => {
                self.limiter().peek_at(&client, now);
            }
        }
    }
}

/// What [`check_time_backwards`] knows of a client.
#[derive(Clone, Copy, Debug)]
enum Known {
    /// It has state: its origin, and the latest time the state reflects
    /// (the origin and the times of its admitted checks).
    Tracked { origin: u64, latest: u64 },
    /// It has none (never called, or evicted); a call creates it with an
    /// origin no earlier than `floor`, the latest time a sweep judged at.
    Untracked { floor: u64 },
}

/// The contract's rule for time going backwards, checked on each engine on
/// its own (the contract lets the engines differ there: "being stricter is
/// fine"): on each engine's plain limiter; on each engine's limiter with
/// idle eviction, with the sweeps an input asks for; and on a tier
/// registry with idle eviction, with those sweeps and the reloads an input
/// asks for (to the rule it has, to the base rule, to its twin, to another
/// limit: [`Rule`]).
///
/// For every call whose `now` is older than `m`, the latest time the
/// client's state reflects (its origin and the times of its admitted
/// checks; for a client a sweep evicted, the latest time a sweep judged
/// at, which its new origin is no earlier than), a twin is built by
/// replaying every earlier operation (calls, sweeps, reloads), and the
/// same call is made on the twin at `m`. Then:
///
/// * an admitted call must be admitted by the twin too (the contract: never
///   admit what the same call at the latest reflected time would reject),
///   and must leave the state as the twin's admission at `m` does: equal
///   `remaining` at `m`, `m + 1`, `m + W − 1`, `m + W` and `m + 2W`. This is
///   how "stored time never moves backwards" shows: an admission recorded at
///   the older time would leave more room at some later instant;
/// * a rejected call must change nothing: the same `remaining` at those
///   instants as the twin had before its call;
/// * an older `remaining` never promises more than `remaining` at `m`.
///
/// After each sweep, each client the check knows is peeked at the later of
/// the sweep's time and its `m` (a peek creates nothing) to learn whether
/// it was evicted; the peeks are operations the twin replays too. The twin
/// is a replay, not a second implementation, so the check holds each
/// limiter to the contract without re-deriving any policy; and no call may
/// panic.
///
/// # Panics
///
/// On a broken rule, with the input and the call.
pub fn check_time_backwards(data: &[u8]) {
    let input = Input::decode(data, true);
    for kind in [
        Kind::Plain(Engine::LockFree),
        Kind::Plain(Engine::Mutex),
        Kind::Evicting(Engine::LockFree),
        Kind::Evicting(Engine::Mutex),
        Kind::Tiers,
    ] {
        let Some(subject) = Subject::new(&input, kind) else {
            return;
        };
        check_time_backwards_on(&input, kind, &subject);
    }
}

fn check_time_backwards_on(input: &Input, kind: Kind, subject: &Subject) {
    let mut clients = [Known::Untracked { floor: 0 }; 4];
    // Whether a client's state was made by an older rule than its tier's:
    // its next call (or peek) carries it over.
    let mut carry = [false; 4];
    let mut swept = 0;
    let mut ops = Vec::new();
    for (k, &c) in input.calls.iter().enumerate() {
        if let (Subject::Tiers(tiers), Some(rule)) = (subject, c.reload) {
            let current = tiers.rule(TIER).expect("the registry's own tier");
            if let Some(spec) = Subject::rule(input, rule, current) {
                ops.push(Op::Reload(spec));
                subject.apply(Op::Reload(spec));
                if spec != current {
                    for (pending, known) in carry.iter_mut().zip(&clients) {
                        *pending |= matches!(known, Known::Tracked { .. });
                    }
                }
            }
        }
        if subject.evicts() && c.sweep {
            ops.push(Op::Sweep(c.now));
            subject.apply(Op::Sweep(c.now));
            swept = swept.max(c.now);
            for (client, known) in (0..).zip(&mut clients) {
                let latest = match *known {
                    Known::Tracked { latest, .. } => latest,
                    Known::Untracked { floor } => {
                        *known = Known::Untracked {
                            floor: floor.max(swept),
                        };
                        continue;
                    }
                };
                let at = c.now.max(latest);
                ops.push(Op::Peek(client, at));
                if std::mem::take(&mut carry[client as usize]) {
                    carried_over(subject, at, known);
                }
                if subject.limiter().peek_at(&client, at).is_none() {
                    // Evicted: its next call creates it with an origin no
                    // earlier than `swept`. (Not its own latest time: a
                    // client is evicted only when its state holds nothing
                    // that time would still count, as after a carry-over
                    // that found everything given back.)
                    *known = Known::Untracked { floor: swept };
                }
            }
        }
        let limiter = subject.limiter();
        let carried = std::mem::take(&mut carry[c.client as usize]);
        let known = &mut clients[c.client as usize];
        let (origin, m) = match *known {
            Known::Tracked { origin, latest } => (origin, latest),
            Known::Untracked { floor } if c.now >= floor => {
                // A first call creates the client at its own time.
                let answer = call(limiter, c);
                ops.push(Op::Call(c));
                *known = Known::Tracked {
                    origin: c.now,
                    latest: c.now,
                };
                if let Answer::Decision(decision) = answer {
                    assert!(
                        decision.allowed(),
                        "{kind}: first call {k} rejected: {input:?}"
                    );
                }
                continue;
            }
            Known::Untracked { floor } => (floor, floor),
        };
        // A call that carries its client over to a new rule rebuilds the
        // state from what it had spent at the later of the call's time and
        // the latest time the old state reflects, so it need not match the
        // twin's carry-over at `m` exactly: it must be as strict or
        // stricter, no probe finding more room here. A schedule (`gcra`,
        // `leaky-bucket`) is rebuilt a whole number of intervals ahead of
        // the carry's instant, so two carries at two instants round it up
        // differently, by less than an interval: after a carry-over this
        // state is held to the twin's `slack` ticks later.
        let slack = match subject {
            Subject::Tiers(tiers) if carried => {
                let rule = tiers.rule(TIER).expect("the registry's own tier");
                match rule.policy() {
                    PolicyKind::Gcra | PolicyKind::LeakyBucket => rule.config().interval() - 1,
                    _ => 0,
                }
            }
            _ => 0,
        };
        // Past the horizon stored times saturate and the rule is not
        // promised; the calls must still not panic.
        // Probes shifted by `slack` must stay inside it too: past it the
        // schedule's clock stops (2^62 − 1 ticks past the origin), and a
        // shift there moves nothing.
        // Where the client's times count from: its origin, or 0 for a
        // limiter's drip policy (`counts_from_zero`).
        let counted_from =
            if !matches!(subject, Subject::Tiers(_)) && counts_from_zero(input.policy) {
                0
            } else {
                origin
            };
        let shifted_past_the_end = slack > 0
            && (m
                .checked_add(slack)
                .and_then(|m| m.checked_add(input.window.checked_mul(2)?))
                .is_none()
                || u128::from(m.saturating_sub(counted_from))
                    + u128::from(slack)
                    + 2 * u128::from(input.window)
                    >= 1 << 62);
        if c.now >= m || !within_horizon(m - counted_from, input.window) || shifted_past_the_end {
            if let Answer::Decision(decision) = call(limiter, c) {
                // A tier registry judges every later check of the client no
                // earlier than this one's time, admitted or not (the
                // `tiers` module docs, "Reload").
                if decision.allowed() || matches!(subject, Subject::Tiers(_)) {
                    *known = Known::Tracked {
                        origin,
                        latest: m.max(c.now),
                    };
                }
            }
            ops.push(Op::Call(c));
            if carried && c.now >= m {
                carried_over(subject, c.now, known);
            }
            continue;
        }
        let twin = Subject::new(input, kind).expect("built once already");
        for &op in &ops {
            twin.apply(op);
        }
        let twin = twin.limiter();
        let probes = [
            m,
            m.saturating_add(1),
            m.saturating_add(input.window - 1),
            m.saturating_add(input.window),
            m.saturating_add(input.window.saturating_mul(2)),
        ];
        let remaining = |limiter: &dyn RateLimiter<u64>, later: u64| {
            probes.map(|at| limiter.remaining_at(&c.client, at.saturating_add(later)))
        };
        let context =
            || format!("{kind}: call {k} {c:?}, latest time {m} (+ {slack}), of {input:?}");
        let compare = |here: [u64; 5], there: [u64; 5], what: &str| {
            let fits = if carried {
                here.iter().zip(&there).all(|(here, there)| here <= there)
            } else {
                here == there
            };
            assert!(
                fits,
                "{what} (remaining at {probes:?}: {here:?} here, {there:?} at the latest \
                 time{}); {}",
                if carried { ", after a carry-over" } else { "" },
                context()
            );
        };
        let latest = m.saturating_add(slack);
        match call(limiter, c) {
            Answer::Remaining(older) => {
                let at_latest = twin.remaining_at(&c.client, latest);
                assert!(
                    older <= at_latest,
                    "remaining {older} > {at_latest} at the latest time; {}",
                    context()
                );
            }
            Answer::Decision(decision) if decision.allowed() => {
                let twin_decision = twin.check_at(&c.client, latest);
                assert!(
                    twin_decision.allowed(),
                    "admitted, but rejected at the latest time ({twin_decision:?}); {}",
                    context()
                );
                compare(
                    remaining(limiter, 0),
                    remaining(twin, slack),
                    "the admission left another state than one at the latest time",
                );
            }
            Answer::Decision(_) => {
                compare(
                    remaining(limiter, 0),
                    remaining(twin, slack),
                    "a rejection changed the state",
                );
            }
            Answer::Refunded(_) => unreachable!("`call` makes no refunds"),
        }
        ops.push(Op::Call(c));
        // The probes above created the client if it had no state (on the
        // twin, not here): what the call created, it created at `m`.
        if matches!(*known, Known::Untracked { .. }) {
            *known = Known::Tracked {
                origin: m,
                latest: m,
            };
        }
    }
}

/// The rule sets a `load` input saves under: each layout of the lock-free
/// engine (one word, a wide word, a log, the pairs of one CAS, a frame
/// with a log and an `in-flight` rule).
const LOAD_RULES: [&str; 9] = [
    "gcra:3/90ms",
    "token-bucket:3/90ms",
    "fixed-window:3/100ms",
    "sliding-window-counter:3/100ms",
    "sliding-window:3/100ms",
    "gcra:2/40ms,token-bucket:5/100ms",
    "gcra:2/40ms,fixed-window:5/1s",
    "gcra:2/40ms,fixed-window:4000000000/365d",
    "gcra:3/60ms,sliding-window:4/200ms,in-flight:2",
];

/// The name of the one tier a `load` input's registry has.
const LOAD_TIER: &str = "free";

/// A limiter of `rules` (in milliseconds) in store `kind`: 0 the
/// lock-free engine, 1 the mutex engine, 2 a registry of tiers.
fn load_limiter(
    kind: u8,
    tiers: &[(String, floodgate::RuleSet)],
) -> Option<Arc<dyn RateLimiter<u64>>> {
    let clock = ManualClock::with_tick(0, floodgate::Tick::MILLISECOND);
    let (_, rules) = tiers.first()?;
    match kind {
        0 | 1 => {
            let engine = if kind == 0 {
                Engine::LockFree
            } else {
                Engine::Mutex
            };
            floodgate::build_rules::<u64, _>(rules, engine, clock, Bounds::new()).ok()
        }
        _ => {
            let first = tiers[0].0.clone();
            let resolver = {
                let first = first.clone();
                move |_: &u64| first.clone()
            };
            let mut registry =
                Tiers::with_clock_rules(&first, rules.clone(), resolver, clock).ok()?;
            for (name, rules) in &tiers[1..] {
                registry = registry.with_tier_rules(name, rules.clone()).ok()?;
            }
            Some(Arc::new(registry))
        }
    }
}

/// A state file from arbitrary bytes (`fuzz_targets/load.rs`): never a
/// panic, and loaded whole or not at all. An input whose first byte is
/// even is the file itself; an odd one builds a limiter (the byte's next
/// bits pick its store, the next byte its rules), makes a few calls, saves
/// it and changes the bytes the rest of the input says, with the checksum
/// made to hold again, so that the changes reach the decoder and each
/// policy's check of the words past it. Each file read is then loaded into
/// a new limiter of each kind of store, of its rules: one that refuses it
/// holds no client, one that takes it holds them all, and every call on
/// them answers.
pub fn check_load(data: &[u8]) {
    use floodgate::state::{self, Saved};
    let mut bytes = Bytes(data);
    let mode = bytes.u8();
    let file = if mode & 1 == 0 {
        bytes.0.to_vec()
    } else {
        let rules: floodgate::RuleSet = LOAD_RULES[usize::from(bytes.u8()) % LOAD_RULES.len()]
            .parse()
            .expect("a rule set of the list");
        let Some(limiter) = load_limiter((mode >> 1) % 3, &[(LOAD_TIER.to_owned(), rules)]) else {
            return;
        };
        let mut now = 0u64;
        for _ in 0..bytes.u8() % 24 {
            let client = u64::from(bytes.u8() % 4);
            now += u64::from(bytes.u8() % 64);
            match bytes.u8() % 4 {
                0 => drop(limiter.refund_at(&client, now, now.saturating_sub(3), 1)),
                1 => drop(limiter.release_at(&client, now, 1)),
                _ => drop(limiter.check_n_at(&client, now, u64::from(bytes.u8() % 3))),
            }
        }
        let mut file = state::to_bytes(&*limiter, &[]).expect("an in-memory limiter saves");
        while !bytes.is_empty() && !file.is_empty() {
            let at = usize::from(bytes.u16()) % file.len();
            file[at] ^= bytes.u8();
        }
        state::resealed(&file)
    };
    let Ok(saved) = Saved::from_bytes(&file) else {
        return;
    };
    let tiers: Vec<(String, floodgate::RuleSet)> = saved
        .tiers()
        .map(|(name, rules)| (name.to_owned(), rules.clone()))
        .collect();
    for kind in 0..3 {
        let Some(limiter) = load_limiter(kind, &tiers) else {
            continue;
        };
        match saved.load_into(&*limiter) {
            Ok(loaded) => {
                assert_eq!(loaded, saved.clients(), "every client, without a cap");
                assert_eq!(limiter.tracked_clients(), loaded);
                for client in 0..4 {
                    for now in [0, 1_000, u64::from(u32::MAX)] {
                        limiter.remaining_at(&client, now);
                        limiter.check_at(&client, now);
                    }
                }
            }
            Err(error) => assert_eq!(
                limiter.tracked_clients(),
                0,
                "a refused file loads nothing: {error}"
            ),
        }
    }
}
