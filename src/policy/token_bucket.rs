//! `token-bucket`: discrete drips from the origin.
//!
//! The bucket holds up to `L` tokens and starts full; one token drips in at
//! every `k·I` (k >= 1), wasted if the bucket is full; a request takes a
//! token or is rejected.
//!
//! Stored as one number: with `d = ⌊now / I⌋` the drips so far, the bucket
//! holds `L − (max(B, d) − d)` tokens, where `B` starts at 0 and an admission
//! sets `B = max(B, d) + 1`. (Induction: a drip raises `d`, adding a token
//! until `B <= d`, the full bucket; an admission raises `max(B, d)` by one,
//! taking one.) That is GCRA counted in drips with `τ = L − 1`, so the whole
//! state is one `u64` that only grows — by `n` per admission of cost `n`,
//! never past `d + L` — and no count or timestamp needs packing. A cost `n`
//! is admitted iff the bucket holds `n` tokens, `max(B, d) − d <= L − n`,
//! and sets `B = max(B, d) + n` in one CAS. Time stops at 2^62 − 1 ticks
//! past the origin (`cell::schedule_time`), so `d < 2^62`,
//! `B <= d + L < 2^62 + 2^32` and the top bit is free for the retirement
//! mark.

use super::{saturate, sealed, Policy, Retired, Spent};
use crate::cell::{self, schedule_time, transition, AtomicWord, Step};
use crate::sync::AtomicU64;
use crate::{Config, ConfigError, Decision, PolicyKind};

/// A bucket of `limit` tokens, refilled by one every `window / limit` ticks,
/// counted from each client's first request.
#[derive(Clone, Copy, Debug)]
pub struct TokenBucket {
    config: Config,
    interval: u64,
}

/// One client's `token-bucket` state: `B`, in drips since the origin.
#[derive(Debug)]
pub struct TokenBucketState {
    drips: AtomicU64,
}

impl TokenBucket {
    /// Drips so far at `now`.
    #[inline]
    fn drips(&self, now: u64) -> u64 {
        schedule_time(now) / self.interval
    }

    /// Tokens in a bucket whose state is `b` after `drips` drips.
    #[inline]
    fn tokens(&self, b: u64, drips: u64) -> u64 {
        // max(b, drips) − drips <= L for every state this policy writes;
        // saturating covers a `now` older than the state (time going back).
        self.config.limit().saturating_sub(b.max(drips) - drips)
    }

    /// The pure step for a cost `1 <= cost <= L`.
    #[inline]
    fn step(&self, b: u64, now: u64, cost: u64) -> Step<u64> {
        let drips = now / self.interval;
        let t = b.max(drips);
        let limit = self.config.limit();
        // t − d <= L for every state written here; saturating covers a `now`
        // older than the state.
        let tokens = limit.saturating_sub(t - drips);
        if tokens >= cost {
            // t + n <= d + L < 2^62 + 2^32: no overflow (module docs).
            let next = t + cost;
            Step {
                decision: Decision::admit(tokens - cost),
                next: Some(next),
            }
        } else {
            // The first drip that leaves `n` tokens: B − d* = L − n, the
            // (n − tokens)-th after now. t >= d + L − n + 1 here, so the
            // subtraction does not wrap.
            let first = t - (limit - cost);
            let at = u128::from(first) * u128::from(self.interval);
            Step {
                decision: Decision::reject(tokens, saturate(at - u128::from(now))),
                next: None,
            }
        }
    }
}

impl sealed::Sealed for TokenBucket {}

impl Policy for TokenBucket {
    type State = TokenBucketState;
    const KIND: PolicyKind = PolicyKind::TokenBucket;

    fn new(config: Config) -> Result<Self, ConfigError> {
        let config = config.check_for(Self::KIND)?;
        Ok(Self {
            config,
            interval: config.interval(),
        })
    }

    fn config(&self) -> Config {
        self.config
    }

    fn new_state(&self) -> TokenBucketState {
        TokenBucketState {
            drips: AtomicU64::new(0),
        }
    }

    /// Linearised at the one CAS that takes all `cost` tokens.
    #[inline]
    fn check_within(
        &self,
        state: &TokenBucketState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, Retired> {
        let now = schedule_time(now);
        transition(&state.drips, |b| self.step(b, now, cost))
    }

    #[inline]
    fn remaining(&self, state: &TokenBucketState, now: u64) -> Result<u64, Retired> {
        Ok(self.tokens(cell::read(&state.drips)?, self.drips(now)))
    }

    /// Idle when full: `B <= d`, as a new bucket's `B = 0` is for every `d`.
    fn retire_if_idle(&self, state: &TokenBucketState, now: u64) -> bool {
        let drips = self.drips(now);
        cell::retire_if(&state.drips, |b| b <= drips)
    }

    /// Judged no earlier than drip `B − L`: an admission leaves
    /// `B <= d + L` with `d` the drips at its time, so the state reflects
    /// that drip; from there the bucket's count needs no saturation, and
    /// `spent_state` rebuilds exactly `max(B, d)`.
    fn retire_spent(&self, state: &TokenBucketState, now: u64) -> Spent {
        let (b, _) = cell::retire(&state.drips);
        // (B − L)·I is at most the time of a drip the state reached: no
        // overflow.
        let reflected = b.saturating_sub(self.config.limit()) * self.interval;
        let at = schedule_time(now).max(reflected);
        Spent {
            count: self.config.limit() - self.tokens(b, self.drips(at)),
            at,
        }
    }

    /// `B = d + spent` holds `L − spent` tokens.
    fn spent_state(&self, spent: u64, now: u64) -> TokenBucketState {
        TokenBucketState {
            drips: AtomicU64::new(self.drips(now) + spent.min(self.config.limit())),
        }
    }

    fn is_retired(&self, state: &TokenBucketState) -> bool {
        AtomicU64::is_retired(state.drips.load_word())
    }

    fn relocate(&self, state: &TokenBucketState) -> Option<TokenBucketState> {
        let (drips, retired_now) = cell::retire(&state.drips);
        retired_now.then(|| TokenBucketState {
            drips: AtomicU64::new(drips),
        })
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_spec_session() {
        let policy = TokenBucket::new(Config::per_ticks(2, 1_000).unwrap()).unwrap();
        let state = policy.new_state();
        assert_eq!(policy.check(&state, 0), Ok(Decision::admit(1)));
        assert_eq!(policy.check(&state, 10), Ok(Decision::admit(0)));
        assert_eq!(policy.check(&state, 20), Ok(Decision::reject(0, 480)));
        assert_eq!(policy.remaining(&state, 499), Ok(0));
        assert_eq!(policy.check(&state, 500), Ok(Decision::admit(0)));
        assert_eq!(policy.remaining(&state, 2_000), Ok(2));
    }

    #[test]
    fn a_drip_into_a_full_bucket_is_wasted() {
        let policy = TokenBucket::new(Config::per_ticks(2, 10).unwrap()).unwrap(); // I = 5
        let state = policy.new_state();
        assert_eq!(policy.remaining(&state, 1_000), Ok(2));
        assert!(policy.check(&state, 1_000).unwrap().allowed);
        assert!(policy.check(&state, 1_000).unwrap().allowed);
        assert_eq!(policy.check(&state, 1_004), Ok(Decision::reject(0, 1)));
    }

    #[test]
    fn idle_exactly_when_full_again() {
        let policy = TokenBucket::new(Config::per_ticks(2, 10).unwrap()).unwrap(); // I = 5
        let state = policy.new_state();
        policy.check(&state, 7).unwrap(); // B = 2, d = 1: one token
        assert!(!policy.retire_if_idle(&state, 9));
        assert!(policy.retire_if_idle(&state, 10)); // the drip at 10 fills it
        assert_eq!(policy.remaining(&state, 10), Err(Retired));
    }

    #[test]
    fn spent_is_carried() {
        let policy = TokenBucket::new(Config::per_ticks(100, 1_000).unwrap()).unwrap();
        let state = policy.new_state();
        for _ in 0..80 {
            policy.check(&state, 3).unwrap();
        }
        assert_eq!(policy.retire_spent(&state, 3), Spent { count: 80, at: 3 });
        let wider = TokenBucket::new(Config::per_ticks(200, 1_000).unwrap()).unwrap();
        assert_eq!(wider.remaining(&wider.spent_state(80, 3), 3), Ok(120));
    }
}
