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
//! state is one `u64` that only grows — by one per admission, never past
//! `d + L` — and no count or timestamp needs packing.

use super::{saturate, sealed, Policy};
use crate::cell::{transition, AtomicWord, Step};
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
    /// Tokens in a bucket whose state is `b` after `drips` drips.
    #[inline]
    fn tokens(&self, b: u64, drips: u64) -> u64 {
        // max(b, drips) − drips <= L for every state this policy writes;
        // saturating covers a `now` older than the state (time going back).
        self.config.limit().saturating_sub(b.max(drips) - drips)
    }

    #[inline]
    fn step(&self, b: u64, now: u64) -> Step<u64> {
        let drips = now / self.interval;
        let t = b.max(drips);
        if t - drips < self.config.limit() {
            // Saturates only at now / I = 2^64 − 1, past any real clock.
            let next = t.saturating_add(1);
            Step {
                decision: Decision::admit(self.tokens(next, drips)),
                next: Some(next),
            }
        } else {
            // The first drip that leaves a token: B − d* = L − 1.
            let first = t - (self.config.limit() - 1);
            let at = u128::from(first) * u128::from(self.interval);
            Step {
                decision: Decision::reject(0, saturate(at - u128::from(now))),
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

    #[inline]
    fn check(&self, state: &TokenBucketState, now: u64) -> Decision {
        transition(&state.drips, |b| self.step(b, now))
    }

    #[inline]
    fn remaining(&self, state: &TokenBucketState, now: u64) -> u64 {
        self.tokens(state.drips.load_word(), now / self.interval)
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_spec_session() {
        let policy = TokenBucket::new(Config::new(2, 1_000).unwrap()).unwrap();
        let state = policy.new_state();
        assert_eq!(policy.check(&state, 0), Decision::admit(1));
        assert_eq!(policy.check(&state, 10), Decision::admit(0));
        assert_eq!(policy.check(&state, 20), Decision::reject(0, 480));
        assert_eq!(policy.remaining(&state, 499), 0);
        assert_eq!(policy.check(&state, 500), Decision::admit(0));
        assert_eq!(policy.remaining(&state, 2_000), 2);
    }

    #[test]
    fn a_drip_into_a_full_bucket_is_wasted() {
        let policy = TokenBucket::new(Config::new(2, 10).unwrap()).unwrap(); // I = 5
        let state = policy.new_state();
        assert_eq!(policy.remaining(&state, 1_000), 2);
        assert!(policy.check(&state, 1_000).allowed);
        assert!(policy.check(&state, 1_000).allowed);
        assert_eq!(policy.check(&state, 1_004), Decision::reject(0, 1));
    }
}
