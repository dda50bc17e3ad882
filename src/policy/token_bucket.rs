//! `token-bucket`: discrete drips from the origin.
//!
//! The bucket holds up to `L` tokens and starts full; one token drips in at
//! every `origin + k·I` (k >= 1), wasted if the bucket is full; a request
//! takes a token or is rejected.
//!
//! Stored as one time: `F`, the drip from which the bucket is full again
//! if nothing more is taken, on the drip grid `origin + k·I` and initially
//! the origin. At `now` the bucket lacks one token per drip in `(now, F]`,
//! `⌈(F − now) / I⌉` when `F > now`, and is full when `F <= now`. An
//! admission of cost `n` takes `n` tokens, so it moves `F` on by `n` drips
//! from where the bucket stands: from `F` while not full, else from the
//! latest drip `g <= now` (a full bucket wastes the drips before it). It is
//! admitted iff the bucket holds `n`, `⌈(F − now) / I⌉ <= L − n`, which is
//! `F − now <= (L − n)·I` with no division, and sets `F = max(F, g) + n·I`
//! in one CAS. (This is the drip count `B` of the contract's bucket,
//! `F = origin + B·I`: `L − (max(B, d) − d)` tokens after `d` drips.
//! Counting `F` in ticks rather than drips since the origin keeps the
//! grid's phase in the word itself, so the limiter keeps no origin for
//! this policy; see `Policy::Origin`.)
//!
//! Horizon: an admission leaves `F <= now + L·I <= now + W`. Time stops at
//! 2^62 − 1 ticks (`cell::schedule_time`) and windows at
//! [`MAX_SCHEDULE_WINDOW`](crate::MAX_SCHEDULE_WINDOW) = 2^62, so `F` stays
//! below 2^63, exact, with the top bit free for the retirement mark.

use super::{sealed, Policy, Retired, Spent};
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

/// One client's `token-bucket` state: `F`, the drip from which the bucket
/// is full.
#[derive(Debug)]
pub struct TokenBucketState {
    full_at: AtomicU64,
}

impl TokenBucket {
    /// The tokens the bucket lacks at `now` when it is full from `full_at`:
    /// one per drip in `(now, full_at]`. More than `L` only for a `now`
    /// older than the state (time going back).
    #[inline]
    fn lacking(&self, full_at: u64, now: u64) -> u64 {
        match full_at.checked_sub(now) {
            // ⌈ahead / I⌉ without overflow: ahead >= 1.
            Some(ahead) if ahead > 0 => (ahead - 1) / self.interval + 1,
            _ => 0,
        }
    }

    /// The pure refund step: `g = min(n, L − tokens(now))` tokens back,
    /// by moving `F` back `g` drips (it stays on the drip grid): the bucket
    /// then lacks `⌈(F − g·I − now) / I⌉ = lacking − g`. The word to store,
    /// if any.
    #[inline]
    pub(super) fn give_back(&self, full_at: u64, now: u64, cost: u64) -> (u64, Option<u64>) {
        // At most L once judged at the latest time the word reflects; an
        // older `now` (time going back) may count more, never given.
        let lacking = self.lacking(full_at, now).min(self.config.limit());
        let given = cost.min(lacking);
        if given == 0 {
            return (0, None);
        }
        // g·I <= lacking·I < F − now + I: F − g·I > now − I, no underflow
        // past 0 (it saturates only for a `now` before F's first drip).
        (given, Some(full_at.saturating_sub(given * self.interval)))
    }

    /// Tokens in the bucket at `now`.
    #[inline]
    pub(super) fn tokens(&self, full_at: u64, now: u64) -> u64 {
        self.config
            .limit()
            .saturating_sub(self.lacking(full_at, now))
    }

    /// The word that answers every call at `now` or later as `full_at`
    /// does, and is at most an interval behind `now`: a full bucket's `F`
    /// moved up to the latest drip `g <= now` (the drips before it are
    /// wasted on a full bucket either way). For layouts that keep other
    /// fields relative to the drip word (`WindowPair`).
    #[inline]
    pub(super) fn settled(&self, full_at: u64, now: u64) -> u64 {
        match now.checked_sub(full_at) {
            Some(since) => now - since % self.interval,
            None => full_at,
        }
    }

    /// The pure step for a cost `1 <= cost <= L`.
    #[inline]
    pub(super) fn step(&self, full_at: u64, now: u64, cost: u64) -> Step<u64> {
        let limit = self.config.limit();
        // (L − n)·I <= L·I <= W: no overflow.
        let room = (limit - cost) * self.interval;
        if full_at <= now {
            // Full: the `n` tokens come from the latest drip `g <= now`,
            // `F` plus whole intervals. A client within its rate is usually
            // less than one interval past `F`, where `g = F` and no
            // division is needed.
            let since = now - full_at;
            let latest = if since < self.interval {
                full_at
            } else {
                now - since % self.interval
            };
            return Step {
                // From full, `L − n` are left whatever `now − g` is.
                decision: Decision::admit(limit - cost),
                // g + n·I <= now + W < 2^63 (module docs).
                next: Some(latest + cost * self.interval),
            };
        }
        let ahead = full_at - now;
        if ahead <= room {
            let next = full_at + cost * self.interval;
            Step {
                // next − now <= L·I: exact (module docs).
                decision: Decision::admit(limit - self.lacking(next, now)),
                next: Some(next),
            }
        } else {
            // The bucket holds `n` again from the drip `(L − n)` intervals
            // before `F`, which is after `now` here.
            Step {
                decision: Decision::reject(
                    if cost == 1 {
                        0
                    } else {
                        self.tokens(full_at, now)
                    },
                    ahead - room,
                ),
                next: None,
            }
        }
    }
}

impl TokenBucketState {
    /// The word, from a state no other thread can reach.
    /// A state holding the word `word`.
    pub(super) fn of(word: u64) -> Self {
        Self {
            full_at: AtomicU64::new(word),
        }
    }

    /// The word, from a state no other thread can reach.
    pub(super) fn word(self) -> u64 {
        self.full_at.into_word()
    }
}

impl sealed::Sealed for TokenBucket {}

impl Policy for TokenBucket {
    type State = TokenBucketState;
    type Origin = ();
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
        self.begin(0)
    }

    /// `F = origin`: full, on a grid that starts there. The limiter keeps
    /// no origin for this policy and hands it times since tick 0.
    fn begin(&self, origin: u64) -> TokenBucketState {
        TokenBucketState {
            full_at: AtomicU64::new(schedule_time(origin)),
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
        transition(&state.full_at, |full_at| self.step(full_at, now, cost))
    }

    #[inline]
    fn check_unshared(
        &self,
        state: TokenBucketState,
        now: u64,
        cost: u64,
    ) -> (TokenBucketState, Decision) {
        let now = schedule_time(now);
        let (full_at, decision) =
            cell::transition_unshared(state.full_at, |full_at| self.step(full_at, now, cost));
        (TokenBucketState { full_at }, decision)
    }

    #[inline]
    fn remaining(&self, state: &TokenBucketState, now: u64) -> Result<u64, Retired> {
        Ok(self.tokens(cell::read(&state.full_at)?, schedule_time(now)))
    }

    fn refund(
        &self,
        state: &TokenBucketState,
        now: u64,
        ago: u64,
        cost: u64,
    ) -> Result<u64, Retired> {
        if super::gives_nothing(self.config, ago, cost) {
            return Ok(0);
        }
        let now = schedule_time(now);
        cell::update(&state.full_at, |full_at| self.give_back(full_at, now, cost))
    }

    /// Idle when full, `F <= now`: then every later call finds it full, as
    /// a new client's bucket would be.
    fn retire_if_idle(&self, state: &TokenBucketState, now: u64) -> bool {
        let now = schedule_time(now);
        cell::retire_if(&state.full_at, |full_at| full_at <= now)
    }

    /// Judged no earlier than `F − L·I`: an admission at `a` leaves
    /// `F <= a + L·I`, so the state reflects that time; from there the
    /// bucket lacks at most `L`, and `spent_state` rebuilds `F` exactly on
    /// the same grid.
    fn retire_spent(&self, state: &TokenBucketState, now: u64) -> Spent {
        let (full_at, _) = cell::retire(&state.full_at);
        // L·I <= W: no overflow.
        let reflected = full_at.saturating_sub(self.config.limit() * self.interval);
        let at = schedule_time(now).max(reflected);
        Spent {
            count: self.config.limit() - self.tokens(full_at, at),
            at,
        }
    }

    /// The bucket at `now` on the grid from 0 (a tier's times are ticks
    /// past the client's origin), lacking `spent`: `F = g + spent·I` for
    /// the latest drip `g <= now`.
    fn spent_state(&self, spent: u64, now: u64) -> TokenBucketState {
        let now = schedule_time(now);
        let latest = now - now % self.interval;
        TokenBucketState {
            // At most now + L·I: below 2^63 (module docs).
            full_at: AtomicU64::new(latest + spent.min(self.config.limit()) * self.interval),
        }
    }

    fn save_words(&self, state: &TokenBucketState, out: &mut Vec<u64>) -> Result<(), Retired> {
        cell::save_word(&state.full_at, out)
    }

    fn load_words(&self, words: &[u64]) -> Option<TokenBucketState> {
        cell::loaded_word(words).map(TokenBucketState::of)
    }

    fn is_retired(&self, state: &TokenBucketState) -> bool {
        AtomicU64::is_retired(state.full_at.load_word())
    }

    fn relocate(&self, state: &TokenBucketState) -> Option<TokenBucketState> {
        let (full_at, retired_now) = cell::retire(&state.full_at);
        retired_now.then(|| TokenBucketState {
            full_at: AtomicU64::new(full_at),
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

    /// Begun at its origin (the limiter keeps none for this policy), the
    /// bucket drips on the origin's grid, and a call before the origin
    /// lacks every drip up to where the bucket is full.
    #[test]
    fn a_bucket_begun_at_its_origin_drips_on_its_grid() {
        let policy = TokenBucket::new(Config::per_ticks(2, 10).unwrap()).unwrap(); // I = 5
        let state = policy.begin(103);
        assert_eq!(policy.check(&state, 103), Ok(Decision::admit(1))); // full from 108
        assert_eq!(policy.check(&state, 104), Ok(Decision::admit(0))); // full from 113
        assert_eq!(policy.check(&state, 107), Ok(Decision::reject(0, 1)));
        assert_eq!(policy.check(&state, 108), Ok(Decision::admit(0)));
        // At 93, before the origin: lacking the five drips of (93, 118] on
        // the grid (98, 103, 108, 113, 118), so none is left, and one comes
        // back at 113.
        assert_eq!(policy.remaining(&state, 93), Ok(0));
        assert_eq!(policy.check(&state, 93), Ok(Decision::reject(0, 20)));
        // Full long after: the drip at 133 is the latest before 137, so
        // two taken at 137 leave the bucket full from 143, and the drip at
        // 138 brings one back.
        assert_eq!(policy.check(&state, 137), Ok(Decision::admit(1)));
        assert_eq!(policy.check(&state, 137), Ok(Decision::admit(0)));
        assert_eq!(policy.check(&state, 137), Ok(Decision::reject(0, 1)));
        assert_eq!(policy.check(&state, 142), Ok(Decision::admit(0))); // full from 148
        assert_eq!(policy.check(&state, 142), Ok(Decision::reject(0, 1)));
        assert!(!policy.retire_if_idle(&state, 147));
        assert!(policy.retire_if_idle(&state, 148));
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
