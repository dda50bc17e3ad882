//! What the fuzz targets check, callable from anywhere: the targets in
//! `fuzz_targets/` run these functions on libFuzzer's inputs, and the
//! library's `tests/fuzz_regressions.rs` runs them (through a `#[path]`
//! module) on every input kept in `fuzz/regressions/`. This file therefore
//! depends on nothing but `floodgate` and `std`.
//!
//! An input is raw bytes, decoded by [`Input::decode`] so that every byte
//! string is a valid input and small mutations make small changes: a policy,
//! a limit and window, a starting time, then calls, each a client (one of
//! four), `allow` or `remaining`, and a step of the clock drawn from shapes
//! that find edges — the same instant, a few ticks, one window either side,
//! `2^k` windows, the drip interval, any `u64`. A first byte of 128 or more
//! makes a weighted input (time never decreasing only): each `allow` then
//! carries a cost too, from shapes that find the contract's edges — 0, 1 to
//! `L`, `L`, `L + 1`, `u64::MAX`, any `u64`.
#![forbid(unsafe_code)]

use floodgate::{build_with, Config, Engine, ManualClock, PolicyKind, RateLimiter, MAX_LIMIT};

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

/// One call of an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// Which call.
    pub verb: Verb,
    /// The client, `0..4`.
    pub client: u64,
    /// The time passed to the call.
    pub now: u64,
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
            now = if backwards && bytes.u8() & 1 == 1 {
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
                cost,
            });
        }
        Input {
            policy,
            limit,
            window,
            calls,
        }
    }

    /// Builds a limiter for this input on `engine`; `None` when the
    /// configuration is refused.
    fn limiter(&self, engine: Engine) -> Option<Box<dyn RateLimiter<u64>>> {
        let config = Config::per_ticks(self.limit, self.window).ok()?;
        build_with(self.policy, config, engine, ManualClock::new(0)).ok()
    }
}

/// What one call answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Decision(floodgate::Decision),
    Remaining(u64),
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
/// past the contract's 2 × 10^12 ticks). Past it the engines may answer
/// differently; they must still not panic.
pub fn within_horizon(since: u64, window: u64) -> bool {
    since < 1 << 62 && u128::from(since) + 2 * u128::from(window) <= u128::from(u64::MAX)
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
    // Per client: its origin, and whether it has stayed inside the horizon.
    let mut clients: [Option<(u64, bool)>; 4] = [None; 4];
    for (k, &c) in input.calls.iter().enumerate() {
        let (a, b) = (call(&*lock_free, c), call(&*mutex, c));
        let (origin, inside) = clients[c.client as usize].get_or_insert((c.now, true));
        *inside &= within_horizon(c.now.saturating_sub(*origin), input.window);
        if *inside {
            assert_eq!(
                a, b,
                "call {k} {c:?} of {input:?}: lockfree (left) and mutex (right) disagree"
            );
        }
    }
    assert_eq!(
        lock_free.tracked_clients(),
        mutex.tracked_clients(),
        "{input:?}"
    );
}

/// The contract's rule for time going backwards, checked on each engine on
/// its own (the contract lets the engines differ there: "being stricter is
/// fine"). For every call whose `now` is older than `m`, the latest time the
/// client's state reflects (its origin and the times of its admitted
/// checks), a twin limiter is built by replaying every earlier call, and the
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
/// The twin is a replay, not a second implementation, so the check holds
/// each engine to the contract without re-deriving any policy; and no call
/// may panic.
///
/// # Panics
///
/// On a broken rule, with the input and the call.
pub fn check_time_backwards(data: &[u8]) {
    let input = Input::decode(data, true);
    for engine in [Engine::LockFree, Engine::Mutex] {
        let Some(limiter) = input.limiter(engine) else {
            return;
        };
        // Per client: its origin and the latest reflected time, once it
        // exists.
        let mut clients: [Option<(u64, u64)>; 4] = [None; 4];
        for (k, &c) in input.calls.iter().enumerate() {
            let slot = &mut clients[c.client as usize];
            let Some((origin, m)) = *slot else {
                // The first call creates the client at its own time.
                let answer = call(&*limiter, c);
                *slot = Some((c.now, c.now));
                if let Answer::Decision(decision) = answer {
                    assert!(
                        decision.allowed,
                        "{engine}: first call {k} rejected: {input:?}"
                    );
                }
                continue;
            };
            // Past the horizon stored times saturate and the rule is not
            // promised; the calls must still not panic.
            if c.now >= m || !within_horizon(m - origin, input.window) {
                if let Answer::Decision(decision) = call(&*limiter, c) {
                    if decision.allowed {
                        *slot = Some((origin, m.max(c.now)));
                    }
                }
                continue;
            }
            let twin = input.limiter(engine).expect("built once already");
            for &earlier in &input.calls[..k] {
                call(&*twin, earlier);
            }
            let probes = [
                m,
                m.saturating_add(1),
                m.saturating_add(input.window - 1),
                m.saturating_add(input.window),
                m.saturating_add(input.window.saturating_mul(2)),
            ];
            let remaining = |limiter: &dyn RateLimiter<u64>| {
                probes.map(|at| limiter.remaining_at(&c.client, at))
            };
            let context = || format!("{engine}: call {k} {c:?}, latest time {m}, of {input:?}");
            match call(&*limiter, c) {
                Answer::Remaining(older) => {
                    let at_latest = twin.remaining_at(&c.client, m);
                    assert!(
                        older <= at_latest,
                        "remaining {older} > {at_latest} at the latest time; {}",
                        context()
                    );
                }
                Answer::Decision(decision) if decision.allowed => {
                    let twin_decision = twin.check_at(&c.client, m);
                    assert!(
                        twin_decision.allowed,
                        "admitted, but rejected at the latest time ({twin_decision:?}); {}",
                        context()
                    );
                    assert_eq!(
                        remaining(&*limiter),
                        remaining(&*twin),
                        "the admission left another state than one at the latest time \
                         (remaining at {probes:?}); {}",
                        context()
                    );
                }
                Answer::Decision(_) => {
                    let before = remaining(&*twin);
                    assert_eq!(
                        remaining(&*limiter),
                        before,
                        "a rejection changed the state (remaining at {probes:?}); {}",
                        context()
                    );
                }
            }
        }
    }
}
