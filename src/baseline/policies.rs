//! Each policy's check as the contract states it, on one rule's state
//! under its client's lock.

use std::collections::VecDeque;

use super::client::{Rules, State};
use super::saturate;
use crate::decision::NEVER;
use crate::{Decision, PolicyKind};

// sliding-window ----------------------------------------------------------

/// How many of `times` (sorted) are in the window that ends at `now`: the
/// times `t > now − W`, i.e. `t + W > now`.
pub(super) fn in_window(times: &VecDeque<u64>, window: u64, now: u64) -> u64 {
    let gone = times.partition_point(|&t| u128::from(t) + u128::from(window) <= u128::from(now));
    (times.len() - gone) as u64
}

/// `cost` admissions at once: one time per unit, as `cost` single requests
/// would leave them.
pub(super) fn sliding_window_check(
    times: &mut VecDeque<u64>,
    rules: &Rules,
    now: u64,
    cost: u64,
) -> Decision {
    // Judged no earlier than the newest admission, so that `times` stays
    // sorted and an early `now` cannot see a window with fewer admissions.
    let at = now.max(times.back().copied().unwrap_or(0));
    let used = in_window(times, rules.window, at);
    if used + cost <= rules.limit {
        for _ in 0..cost {
            if times.len() as u64 == rules.limit {
                times.pop_front();
            }
            times.push_back(at);
        }
        Decision::admit(rules.limit - used - cost)
    } else {
        // With the `used` times inside the window in order, the k-th oldest
        // (k = used + cost − L) leaving makes room for all `cost`, at
        // `t + W` (the window then ends there and excludes it).
        let k = used + cost - rules.limit;
        let first_inside = times.len() - used as usize;
        let leaving = times[first_inside + k as usize - 1];
        let leaves = u128::from(leaving) + u128::from(rules.window);
        Decision::reject(rules.limit - used, saturate(leaves - u128::from(now)))
    }
}

// token-bucket ------------------------------------------------------------

/// The bucket at `now`: every drip at `k · I ≤ now` not yet counted is added,
/// up to `L`. Returns the token count and the index of the last drip counted.
/// A `now` before the last counted drip adds nothing (the bucket is read as
/// of that drip).
pub(super) fn drip(tokens: u64, drips: u64, rules: &Rules, now: u64) -> (u64, u64) {
    let due = now / rules.interval;
    if due > drips {
        // `due − drips` may be huge after a long gap; the bucket holds L.
        (tokens.saturating_add(due - drips).min(rules.limit), due)
    } else {
        (tokens, drips)
    }
}

pub(super) fn token_bucket_check(
    tokens: &mut u64,
    drips: &mut u64,
    schedule: &mut u64,
    rules: &Rules,
    now: u64,
    cost: u64,
) -> Decision {
    let (available, counted) = drip(*tokens, *drips, rules, now);
    if available >= cost {
        *tokens = available - cost;
        *drips = counted;
        // Saturates only past 2^64 ticks, where no call before the origin
        // is left to read it.
        *schedule = (*schedule).max(counted).saturating_add(cost);
        Decision::admit(available - cost)
    } else {
        // The (cost − available)-th drip after the last one counted fills
        // the bucket to `cost` (never past L: cost <= L).
        let filling = u128::from(counted) + u128::from(cost - available);
        let at = filling * u128::from(rules.interval);
        Decision::reject(available, saturate(at - u128::from(now)))
    }
}

/// The tokens a bucket whose schedule is `schedule` lacks `lag` ticks
/// before its origin: one per drip from the call to the schedule's end,
/// `⌈(schedule · I + lag) / I⌉ = schedule + ⌈lag / I⌉`.
pub(super) fn lacking_before_origin(schedule: u64, rules: &Rules, lag: u64) -> u64 {
    schedule.saturating_add(lag.div_ceil(rules.interval))
}

impl State {
    /// `token-bucket` at a call `lag` ticks before the origin. The lock-free
    /// engine keeps no origin for a bucket (its one word is the drip, in
    /// ticks, from which the bucket is full), so it judges such a call at
    /// the call's own time: the bucket lacks every drip between the call and
    /// the end of its schedule. That can only be stricter than at the
    /// origin; this answers the same.
    pub(super) fn bucket_before_origin(&mut self, rules: &Rules, lag: u64, cost: u64) -> Decision {
        let State::Bucket {
            tokens,
            drips,
            schedule,
        } = self
        else {
            unreachable!("called for buckets only")
        };
        let available = rules
            .limit
            .saturating_sub(lacking_before_origin(*schedule, rules, lag));
        if cost == 0 {
            return Decision::admit(available);
        }
        if cost > rules.limit {
            return Decision::reject(available, NEVER);
        }
        if available >= cost {
            // Taken from the schedule's end, as at any time before it. The
            // counted tokens follow: `L − (max(B, drips) − drips)`.
            *schedule = schedule.saturating_add(cost);
            *tokens = rules.limit - ((*schedule).max(*drips) - *drips);
            Decision::admit(available - cost)
        } else {
            // Holds `cost` again from the drip `L − cost` intervals before
            // the schedule's end, `lag` ticks after the origin's time.
            let end = u128::from(*schedule) * u128::from(rules.interval) + u128::from(lag);
            let room = u128::from(rules.limit - cost) * u128::from(rules.interval);
            Decision::reject(available, saturate(end - room))
        }
    }
}

// fixed-window ------------------------------------------------------------

pub(super) fn fixed_window_check(
    index: &mut u64,
    count: &mut u64,
    rules: &Rules,
    now: u64,
    cost: u64,
) -> Decision {
    // A `now` in an earlier window than the stored one is judged in the
    // stored one: it is full at least as often.
    let current = now / rules.window;
    let (window, used) = if current > *index {
        (current, 0)
    } else {
        (*index, *count)
    };
    if used + cost <= rules.limit {
        *index = window;
        *count = used + cost;
        Decision::admit(rules.limit - used - cost)
    } else {
        let end = (u128::from(window) + 1) * u128::from(rules.window);
        Decision::reject(rules.limit - used, saturate(end - u128::from(now)))
    }
}

// sliding-window-counter ----------------------------------------------------

/// The counter policy's view of one instant.
#[derive(Clone, Copy, Debug)]
pub(super) struct CounterAt {
    /// The index of the window the instant is judged in.
    pub(super) index: u64,
    /// `p`: admissions in window `index − 1`.
    pub(super) previous: u64,
    /// `c`: admissions in window `index`.
    pub(super) current: u64,
    /// `e`: ticks from the start of window `index` to the instant.
    pub(super) elapsed: u64,
}

/// The counts as seen at `now`: rolled forward by the windows that have
/// passed since the stored one. A `now` before the stored window is judged at
/// that window's start (`e = 0`), where the weighted count is highest.
pub(super) fn counter_at(
    index: u64,
    previous: u64,
    current: u64,
    rules: &Rules,
    now: u64,
) -> CounterAt {
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

/// `p·(W − e) + c·W < L·W`, the spec's admission rule (at most 2^33 · 2^64,
/// so exact in `u128`). For a request of cost `n`, `current` is `c + n − 1`:
/// the last of `n` single requests.
pub(super) fn counter_admits(previous: u64, current: u64, elapsed: u64, rules: &Rules) -> bool {
    let w = u128::from(rules.window);
    let weighted = u128::from(previous) * (w - u128::from(elapsed)) + u128::from(current) * w;
    weighted < u128::from(rules.limit) * w
}

/// `max(0, ceil((L·W − p·(W − e) − c·W) / W))`, the spec's formula, in `i128`.
pub(super) fn counter_remaining(previous: u64, current: u64, elapsed: u64, rules: &Rules) -> u64 {
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

pub(super) fn counter_check(
    index: &mut u64,
    previous: &mut u64,
    current: &mut u64,
    rules: &Rules,
    now: u64,
    cost: u64,
) -> Decision {
    let at = counter_at(*index, *previous, *current, rules, now);
    if counter_admits(at.previous, at.current + cost - 1, at.elapsed, rules) {
        *index = at.index;
        *previous = at.previous;
        *current = at.current + cost;
        Decision::admit(counter_remaining(
            at.previous,
            at.current + cost,
            at.elapsed,
            rules,
        ))
    } else {
        let remaining = counter_remaining(at.previous, at.current, at.elapsed, rules);
        Decision::reject(remaining, counter_retry_after(at, rules, now, cost))
    }
}

/// The first instant after `now` at which a request of cost `n` rejected at
/// `at` would be admitted, as ticks from `now`.
///
/// Nothing else happens in between, so the counts change only when a window
/// ends. Write `m = n − 1` (the requests before the last of the `n`). Within
/// window `index` (`p`, `c` fixed) the rule admits at offset `f` iff
/// `p·(W − f) + (c + m)·W < L·W`, i.e. `p·f > (p + c + m − L)·W`; being
/// rejected at `e` means `p·e ≤ (p + c + m − L)·W`, so the first such `f` is
/// `⌊(p + c + m − L)·W / p⌋ + 1 > e` (none if `p = 0`, or if it is not
/// below `W`). In window `index + 1` the counts are `(c, 0)`: admitted at `f`
/// iff `c·f > (c + m − L)·W`, so at `f = 0` if `c + m < L`, else at
/// `⌊(c + m − L)·W / c⌋ + 1` if that is below `W` (here `c ≥ 1`, as
/// `m < L`). Otherwise the window after has counts `(0, 0)` and admits any
/// `n ≤ L` at its start.
pub(super) fn counter_retry_after(at: CounterAt, rules: &Rules, now: u64, cost: u64) -> u64 {
    // i128 throughout: `(p + c + m − L)·W` is at most 2^34 · 2^64 in size,
    // and the start of a window plus two windows at most 3 · 2^64.
    let w = i128::from(rules.window);
    let start = i128::from(at.index) * w;
    let (p, c, m, l) = (
        i128::from(at.previous),
        i128::from(at.current),
        i128::from(cost - 1),
        i128::from(rules.limit),
    );
    let in_this_window = if p > 0 {
        let need = (p + c + m - l) * w;
        debug_assert!(need >= 0, "a rejection implies p·e ≤ (p + c + m − L)·W");
        Some(need / p + 1).filter(|&f| f < w)
    } else {
        None
    };
    let in_next_window = if c + m < l {
        Some(0)
    } else {
        Some((c + m - l) * w / c + 1).filter(|&f| f < w)
    };
    let first = match (in_this_window, in_next_window) {
        (Some(f), _) => start + f,
        (None, Some(f)) => start + w + f,
        (None, None) => start + 2 * w,
    };
    u64::try_from(first - i128::from(now)).unwrap_or(u64::MAX)
}

// gcra and leaky-bucket -------------------------------------------------------

/// `τ = I·(L − 1)`: how far ahead of `now` the TAT may be for a request to be
/// admitted (a burst of `L` fits in it).
pub(super) fn tolerance(rules: &Rules) -> u128 {
    u128::from(rules.interval) * u128::from(rules.limit - 1)
}

/// `floor((τ − (t − now)) / I) + 1` when `t − now ≤ τ`, else 0, with
/// `t = max(TAT, now)`.
pub(super) fn gcra_remaining(tat: u128, rules: &Rules, now: u64) -> u64 {
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

/// `cost` requests at once: the last of them is at `t + (cost − 1)·I`, and
/// each moves the TAT on by `I`.
pub(super) fn gcra_check(tat: &mut u128, rules: &Rules, now: u64, cost: u64) -> Decision {
    let tau = tolerance(rules);
    let now_wide = u128::from(now);
    let t = (*tat).max(now_wide);
    let last = t + u128::from(cost - 1) * u128::from(rules.interval);
    if last - now_wide <= tau {
        *tat = t + u128::from(cost) * u128::from(rules.interval);
        let mut decision = Decision::admit(gcra_remaining(*tat, rules, now));
        if rules.policy == PolicyKind::LeakyBucket {
            // `t − now ≤ τ ≤ W`, so it fits.
            decision.delay = saturate(t - now_wide);
        }
        decision
    } else {
        Decision::reject(
            gcra_remaining(*tat, rules, now),
            saturate(last - tau - now_wide),
        )
    }
}
