//! Per-client state words, their bit layouts, and the one CAS loop that
//! updates them.
//!
//! # Layouts
//!
//! All times are ticks since the client's origin (its first call), so they
//! start at 0 and, for any clock that counts from a fixed point, stay far
//! below 2^64.
//!
//! * `gcra`, `leaky-bucket`: one `u64`, the theoretical arrival time `TAT`.
//!   No packing; saturating arithmetic keeps it below 2^64.
//! * `token-bucket`: one `u64`, the bucket's `TAT` counted in drips (see
//!   `policy::token_bucket`). It grows by one per admission and never passes
//!   `now / I + L`.
//! * `fixed-window` and `sliding-window-counter`: one `u128`, [`WindowWord`]:
//!
//!   ```text
//!    127                      64 63            40 39           20 19            0
//!   +---------------------------+----------------+---------------+---------------+
//!   |  window index  (64 bits)  |  zero (24)     | previous (20) |  current (20) |
//!   +---------------------------+----------------+---------------+---------------+
//!   ```
//!
//!   The window index is `(now − origin) / W`: it fits 64 bits for every
//!   `now` a `u64` holds, so it never wraps and a client idle for any number
//!   of windows is never mistaken for a recent one (a 64-bit word with a
//!   44-bit index would alias after 2^44 windows). The counts are at most
//!   `L <= 2^20 − 1`, so 20 bits hold them exactly. `fixed-window` leaves
//!   `previous` at 0.
//! * `sliding-window`: a ring of `L` `u128` slots, [`LogSlot`]:
//!
//!   ```text
//!    127                      64 63                                            0
//!   +---------------------------+-----------------------------------------------+
//!   |  sequence  (64 bits)      |  admission time (64 bits)                     |
//!   +---------------------------+-----------------------------------------------+
//!   ```
//!
//!   Slot `i` holds admission number `m` (`m ≡ i mod L`) with sequence
//!   `m + L`; a slot that never held an admission has sequence `i`, as if
//!   admission `i − L` had been there. One admission per `u64` sequence
//!   number cannot wrap in practice (2^64 admissions).

use crate::sync::{AtomicU128, AtomicU64, Ordering};
use crate::Decision;

/// A machine word updated only by compare-and-swap.
pub(crate) trait AtomicWord {
    /// The plain value.
    type Word: Copy + Eq;

    fn load_word(&self) -> Self::Word;

    /// One compare-and-swap; may fail spuriously.
    fn swap_if_unchanged(&self, current: Self::Word, new: Self::Word) -> Result<(), Self::Word>;
}

// Orderings. A decision reads and writes only its own word, which is atomic
// on its own: any ordering gives each word one total modification order, and
// every successful CAS reads the latest value in it, so no admission is lost
// or counted twice. Acquire on loads and Release on the successful CAS add a
// happens-before edge from one decision of a client to the next one that
// reads its result, so a caller that learns of a decision (through any
// channel) and then asks again cannot see an older state. On x86-64 both are
// free: every locked instruction is a full barrier and plain loads acquire.
impl AtomicWord for AtomicU64 {
    type Word = u64;

    #[inline]
    fn load_word(&self) -> u64 {
        self.load(Ordering::Acquire)
    }

    #[inline]
    fn swap_if_unchanged(&self, current: u64, new: u64) -> Result<(), u64> {
        self.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
            .map(drop)
    }
}

impl AtomicWord for AtomicU128 {
    type Word = u128;

    #[inline]
    fn load_word(&self) -> u128 {
        self.load(Ordering::Acquire)
    }

    #[inline]
    fn swap_if_unchanged(&self, current: u128, new: u128) -> Result<(), u128> {
        self.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
            .map(drop)
    }
}

/// What a pure policy step decided from one value of a word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Step<W> {
    pub(crate) decision: Decision,
    /// The word to store, or `None` when the step changes nothing (a
    /// rejection: rejected requests are not counted anywhere).
    pub(crate) next: Option<W>,
}

/// The CAS loop: applies `step` to the word until the result is stored or
/// there is nothing to store.
///
/// Linearisation point: the successful compare-and-swap for a step that
/// stores; the load it was computed from for one that does not. `step` is
/// pure, so running it again after a lost race is harmless.
#[inline]
pub(crate) fn transition<A: AtomicWord>(
    cell: &A,
    mut step: impl FnMut(A::Word) -> Step<A::Word>,
) -> Decision {
    let mut current = cell.load_word();
    loop {
        let Step { decision, next } = step(current);
        let Some(next) = next else {
            return decision;
        };
        match cell.swap_if_unchanged(current, next) {
            Ok(()) => return decision,
            Err(actual) => current = actual,
        }
    }
}

/// The `u128` word of the window policies (layout in the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WindowWord {
    /// `(now − origin) / W` of the window the counts belong to.
    pub(crate) window: u64,
    /// Admissions in window `window − 1`.
    pub(crate) previous: u32,
    /// Admissions in window `window`.
    pub(crate) current: u32,
}

const COUNT_BITS: u32 = 20;
const COUNT_MASK: u128 = (1 << COUNT_BITS) - 1;

impl WindowWord {
    #[inline]
    pub(crate) fn pack(self) -> u128 {
        debug_assert!(u128::from(self.previous) <= COUNT_MASK);
        debug_assert!(u128::from(self.current) <= COUNT_MASK);
        (u128::from(self.window) << 64)
            | (u128::from(self.previous) << COUNT_BITS)
            | u128::from(self.current)
    }

    #[inline]
    pub(crate) fn unpack(word: u128) -> Self {
        // The casts keep exactly the documented fields: 64 bits of window,
        // 20 bits of each count.
        Self {
            window: (word >> 64) as u64,
            previous: ((word >> COUNT_BITS) & COUNT_MASK) as u32,
            current: (word & COUNT_MASK) as u32,
        }
    }
}

/// One slot of the sliding log's ring (layout in the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LogSlot {
    pub(crate) sequence: u64,
    pub(crate) time: u64,
}

impl LogSlot {
    #[inline]
    pub(crate) fn pack(self) -> u128 {
        (u128::from(self.sequence) << 64) | u128::from(self.time)
    }

    #[inline]
    pub(crate) fn unpack(word: u128) -> Self {
        Self {
            sequence: (word >> 64) as u64,
            time: word as u64,
        }
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn window_word_round_trips_at_the_extremes() {
        for word in [
            WindowWord::default(),
            WindowWord {
                window: u64::MAX,
                previous: (1 << 20) - 1,
                current: (1 << 20) - 1,
            },
            WindowWord {
                window: 1 << 44,
                previous: 0,
                current: 1,
            },
        ] {
            assert_eq!(WindowWord::unpack(word.pack()), word);
        }
    }

    #[test]
    fn log_slot_round_trips() {
        let slot = LogSlot {
            sequence: u64::MAX - 3,
            time: 2_000_000_000_000,
        };
        assert_eq!(LogSlot::unpack(slot.pack()), slot);
    }

    #[test]
    fn transition_retries_until_stored() {
        let cell = AtomicU64::new(5);
        let mut calls = 0;
        let decision = transition(&cell, |word| {
            calls += 1;
            if calls == 1 {
                // Another thread wins the race between our load and CAS.
                cell.store(7, Ordering::Relaxed);
            }
            Step {
                decision: Decision::admit(word),
                next: Some(word + 1),
            }
        });
        assert!(calls >= 2);
        assert_eq!(decision.remaining, 7);
        assert_eq!(cell.load(Ordering::Relaxed), 8);
    }
}
