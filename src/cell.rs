//! Per-client state words, their bit layouts, and the CAS loops that update
//! and retire them.
//!
//! # Layouts
//!
//! The window policies' times are ticks since the client's origin (its
//! first call), so they start at 0 and, for any clock that counts from a
//! fixed point, stay far below 2^64. The drip policies' are the clock's own
//! ticks in the limiter, which keeps no origin for them (their one word
//! carries it: `TAT` and the bucket start there), and ticks since the
//! origin in a tier.
//!
//! * `gcra`, `leaky-bucket`: one `u64`, the theoretical arrival time `TAT`.
//! * `token-bucket`: one `u64`, the drip from which the bucket is full,
//!   in ticks: its `TAT` on the drip grid (see `policy::token_bucket`).
//!
//!   ```text
//!    63 62                                                                    0
//!   +--+-----------------------------------------------------------------------+
//!   |R |  TAT (63 bits)                                                        |
//!   +--+-----------------------------------------------------------------------+
//!   ```
//!
//!   These policies read time through [`schedule_time`], which stops at
//!   [`TIME_HORIZON`] = 2^62 − 1 ticks (146 years of nanoseconds), and
//!   their windows stop at
//!   [`MAX_SCHEDULE_WINDOW`](crate::MAX_SCHEDULE_WINDOW) = 2^62: `TAT` runs at
//!   most one window ahead of time (for `token-bucket`, `L` intervals), so
//!   it stays below 2^63 and bit 63 is free for `R`.
//! * `fixed-window` and `sliding-window-counter`: one `u128`, [`WindowWord`]:
//!
//!   ```text
//!    127 126                    64 63                  32 31                   0
//!   +--+--------------------------+---------------------+---------------------+
//!   |R | window index  (63 bits)  |  previous (32 bits) |  current (32 bits)  |
//!   +--+--------------------------+---------------------+---------------------+
//!   ```
//!
//!   The counts are at most `L <= 2^32 − 1` ([`MAX_LIMIT`](crate::MAX_LIMIT)):
//!   an admission of cost `n` stores `c + n` only when `c + n <= L`, and a
//!   carried-over spend is capped at `L`, so 32 bits hold them exactly and
//!   `c + n` (computed in `u64`) cannot overflow. This layout replaced one
//!   with a 64-bit index, a zero gap holding `R` and two 20-bit counts, when
//!   the limit was raised from 2^20 − 1: two 32-bit counts leave 64 bits, of
//!   which `R` takes the top. The window index is
//!   `min((now − origin) / W, 2^63 − 1)`: it is exact for every `W >= 2`
//!   (then the quotient of a `u64` is below 2^63), so a client idle for
//!   any number of windows is never mistaken for a recent one. Only a
//!   window of one tick stops telling windows apart, 2^63 ticks past the
//!   origin (292 years of nanoseconds): from there on every call is judged
//!   in that last window, which can only be stricter. `fixed-window` leaves
//!   `previous` at 0.
//! * `sliding-window`: a ring of `L` `u128` slots, [`LogSlot`], one per
//!   admission (an admission of cost `n` is one entry that counts `n`):
//!
//!   ```text
//!    127 126 125          84 83             64 63                               0
//!   +--+--+---------------+-----------------+-----------------------------------+
//!   |R |P | sequence (42) |  units (20)     |  admission time (64 bits)         |
//!   +--+--+---------------+-----------------+-----------------------------------+
//!   ```
//!
//!   Slot `i` holds entry `m` (`m ≡ i mod L`) with sequence `m + L`, taken
//!   mod 2^42; a slot that never held an entry has sequence `i`, as if entry
//!   `i − L` had been there. `units` is the running total of units admitted
//!   through this entry, mod 2^20. The log only ever subtracts two totals
//!   of entries that are both in the ring and whose difference is a count
//!   of units inside one window, at most `L <= 2^20 − 1`
//!   ([`MAX_LOG_LIMIT`](crate::MAX_LOG_LIMIT)), so the difference mod 2^20
//!   is exact. The sequence only has to tell apart entries less than 2^42
//!   apart: a slot is compared with the entry a reader expects, and a
//!   wrong match needs the ring to have moved on by a multiple of 2^42
//!   entries (4.4 × 10^12) between a reader's two loads. A slot can never
//!   hold the same word twice (an ABA on the frontier's CAS): its times
//!   only rise, and one instant holds at most `L` entries, far fewer than
//!   2^42. Only the slot of the next entry (the ring's frontier) is ever
//!   marked: with `R` (below), or with `P` when a refund replaced the ring
//!   by a new one (`policy::sliding_window`, "Giving units back"); a `P`
//!   slot's time field is that new ring's address, and its units are 0.
//!
//! # Retirement
//!
//! `R` marks a *retired* state: one removed from its map (idle eviction) or
//! carried into a reloaded tier. Marking is one CAS that keeps the rest of
//! the word, so the state is frozen exactly as it was — anyone can still read
//! what it held — and every later CAS on it fails: a call that raced with the
//! retirement sees the mark, never counts anything in the dead state, and
//! looks its client up again. An admission that won its CAS before the mark
//! is in the frozen state, and so is carried over (tiers) or was judged idle
//! with it (eviction): no request is lost or counted twice.

use crate::sync::{self, AtomicU128, AtomicU64, Ordering};
use crate::Decision;

/// Whether this machine does a 16-byte compare-and-swap natively, so that
/// the policies built on 128-bit words are lock-free here.
///
/// `fixed-window` and `sliding-window-counter` keep each client in one
/// `u128` word, and `sliding-window` keeps a ring of `u128` slots; every
/// decision of theirs is a compare-and-swap on such a word, through
/// `portable-atomic`'s `AtomicU128`. That is a native instruction on
/// AArch64 always, and on x86-64 where `cmpxchg16b` is available: enabled
/// at compile time (the default only on Apple, Windows and Fuchsia
/// targets), or else found by `portable-atomic`'s run-time detection (every x86-64 CPU but
/// the earliest, before about 2006, has it). Where this answers
/// `false`, `portable-atomic` falls back to a lock-based implementation (a
/// global table of seqlocks): every answer is still exact, but those three
/// policies are no longer lock-free, since a check may wait on a lock that
/// another thread holds. `token-bucket`, `gcra` and `leaky-bucket` use
/// `u64` words and are lock-free on every target with a 64-bit CAS.
///
/// ```
/// if !floodgate::wide_cas_is_lock_free() {
///     eprintln!("fixed-window, sliding-window-counter and sliding-window take a lock here");
/// }
/// ```
pub fn wide_cas_is_lock_free() -> bool {
    sync::native_u128_is_lock_free()
}

/// A state word was retired while a call was using it (module docs,
/// "Retirement"): the call looks its client up again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retired;

/// Time as the `u64`-word policies see it: `now`, stopped at
/// [`TIME_HORIZON`] (layout in the module docs). Stopping the clock there
/// can only make them stricter: no drip or refill comes after it.
#[inline]
pub(crate) fn schedule_time(now: u64) -> u64 {
    now.min(TIME_HORIZON)
}

/// The latest time the `u64`-word policies tell apart: 2^62 − 1 ticks (of
/// the clock in the limiter, past the origin in a tier).
pub(crate) const TIME_HORIZON: u64 = (1 << 62) - 1;

/// A machine word updated only by compare-and-swap.
pub(crate) trait AtomicWord {
    /// The plain value.
    type Word: Copy + Eq;

    /// The retirement mark `R` (layouts in the module docs).
    const RETIRED: Self::Word;

    /// Whether `word` is marked retired.
    fn is_retired(word: Self::Word) -> bool;

    /// `word` with the mark set.
    fn marked(word: Self::Word) -> Self::Word;

    /// `word` with the mark cleared: what the state held.
    fn unmarked(word: Self::Word) -> Self::Word;

    fn load_word(&self) -> Self::Word;

    /// A word holding `word`.
    fn from_word(word: Self::Word) -> Self;

    /// The word's value, taken from a cell no one else can reach.
    fn into_word(self) -> Self::Word;

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
    const RETIRED: u64 = 1 << 63;

    #[inline]
    fn is_retired(word: u64) -> bool {
        word & Self::RETIRED != 0
    }

    #[inline]
    fn marked(word: u64) -> u64 {
        word | Self::RETIRED
    }

    #[inline]
    fn unmarked(word: u64) -> u64 {
        word & !Self::RETIRED
    }

    #[inline]
    fn load_word(&self) -> u64 {
        self.load(Ordering::Acquire)
    }

    #[inline]
    fn from_word(word: u64) -> Self {
        Self::new(word)
    }

    #[inline]
    fn into_word(self) -> u64 {
        self.into_inner()
    }

    #[inline]
    fn swap_if_unchanged(&self, current: u64, new: u64) -> Result<(), u64> {
        self.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
            .map(drop)
    }
}

impl AtomicWord for AtomicU128 {
    type Word = u128;
    // Bit 127, above `WindowWord`'s 63-bit index (the only `u128` word that
    // goes through these loops; the sliding log marks its own slots).
    const RETIRED: u128 = 1 << 127;

    #[inline]
    fn is_retired(word: u128) -> bool {
        word & Self::RETIRED != 0
    }

    #[inline]
    fn marked(word: u128) -> u128 {
        word | Self::RETIRED
    }

    #[inline]
    fn unmarked(word: u128) -> u128 {
        word & !Self::RETIRED
    }

    #[inline]
    fn load_word(&self) -> u128 {
        self.load(Ordering::Acquire)
    }

    #[inline]
    fn from_word(word: u128) -> Self {
        Self::new(word)
    }

    #[inline]
    fn into_word(self) -> u128 {
        self.into_inner()
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

/// A pure step on a word: a closure, or a value whose `step` is always
/// inlined. A step too large for the compiler to inline as a closure (two
/// rules' steps) is called instead, and its answer comes back through
/// memory, reloaded wider than it was written: on a hot two-rule check
/// that stall was 10 of 22 ns (`benches/README.md`).
pub(crate) trait Stepper<W> {
    fn step(&mut self, word: W) -> Step<W>;
}

impl<W, F: FnMut(W) -> Step<W>> Stepper<W> for F {
    #[inline(always)]
    fn step(&mut self, word: W) -> Step<W> {
        self(word)
    }
}

/// The CAS loop: applies `step` to the word until the result is stored or
/// there is nothing to store.
///
/// Linearisation point: the successful compare-and-swap for a step that
/// stores; the load it was computed from for one that does not. `step` is
/// pure, so running it again after a lost race is harmless. A retired word
/// is never stepped on: `Err(Retired)`.
///
/// Progress (this loop and the two retiring ones below): a pass ends the
/// loop unless its CAS failed, and a CAS fails because another thread's
/// CAS on the word succeeded since the load (or, on machines whose CAS is
/// a load-linked/store-conditional pair, spuriously, which a weak CAS
/// allows: the retry then runs on a fresh value). So a call with no other
/// thread writing the word ends within a pass or two, and it goes on only
/// while other threads' steps land: lock-free, and never a wait.
#[inline(always)]
pub(crate) fn transition<A: AtomicWord>(
    cell: &A,
    mut step: impl Stepper<A::Word>,
) -> Result<Decision, Retired> {
    let mut current = cell.load_word();
    loop {
        if A::is_retired(current) {
            return Err(Retired);
        }
        let Step { decision, next } = step.step(current);
        let Some(next) = next else {
            return Ok(decision);
        };
        match cell.swap_if_unchanged(current, next) {
            Ok(()) => return Ok(decision),
            Err(actual) => current = actual,
        }
    }
}

/// Applies `step` to the word in one CAS: `step` answers what the call
/// answers and the word to store, if any (none: nothing changes, and the
/// answer is linearised at the load). A refund's loop: `transition` for
/// answers that are not decisions.
///
/// Progress: as `transition`'s; a CAS fails only because another thread's
/// CAS on this word succeeded.
#[inline]
pub(crate) fn update<A: AtomicWord, T>(
    cell: &A,
    mut step: impl FnMut(A::Word) -> (T, Option<A::Word>),
) -> Result<T, Retired> {
    let mut current = cell.load_word();
    loop {
        if A::is_retired(current) {
            return Err(Retired);
        }
        let (answer, next) = step(current);
        let Some(next) = next else {
            return Ok(answer);
        };
        match cell.swap_if_unchanged(current, next) {
            Ok(()) => return Ok(answer),
            Err(actual) => current = actual,
        }
    }
}

/// [`transition`] of a word no other thread can reach yet: a new client's,
/// decided before its slot is published (`Policy::check_unshared`). One
/// step, and its word put in a new cell: no CAS, which only a shared word
/// needs (on x86-64 a locked instruction, a new client's dearest step).
#[inline]
pub(crate) fn transition_unshared<A: AtomicWord>(
    cell: A,
    step: impl FnOnce(A::Word) -> Step<A::Word>,
) -> (A, Decision) {
    let current = cell.into_word();
    debug_assert!(!A::is_retired(current), "a new state is never retired");
    let Step { decision, next } = step(current);
    (A::from_word(next.unwrap_or(current)), decision)
}

/// Reads the word for an answer that changes nothing (`remaining`).
#[inline]
pub(crate) fn read<A: AtomicWord>(cell: &A) -> Result<A::Word, Retired> {
    let word = cell.load_word();
    if A::is_retired(word) {
        Err(Retired)
    } else {
        Ok(word)
    }
}

/// Keeps a one-word state's word for a save (`Policy::save_words`): one
/// atomic read, as `read`.
pub(crate) fn save_word(cell: &AtomicU64, out: &mut Vec<u64>) -> Result<(), Retired> {
    out.push(read(cell)?);
    Ok(())
}

/// Keeps a 16-byte state's word for a save: one atomic read, its low half
/// first.
pub(crate) fn save_wide_word(cell: &AtomicU128, out: &mut Vec<u64>) -> Result<(), Retired> {
    let word = read(cell)?;
    // The two halves, each cast exactly (`loaded_wide_word` joins them).
    out.extend([word as u64, (word >> 64) as u64]);
    Ok(())
}

/// The word `save_word` kept, if it is one word without the mark.
pub(crate) fn loaded_word(words: &[u64]) -> Option<u64> {
    match *words {
        [word] if !AtomicU64::is_retired(word) => Some(word),
        _ => None,
    }
}

/// The word `save_wide_word` kept, if it is two halves without the mark.
pub(crate) fn loaded_wide_word(words: &[u64]) -> Option<u128> {
    match *words {
        [low, high] => {
            let word = u128::from(low) | (u128::from(high) << 64);
            (!AtomicU128::is_retired(word)).then_some(word)
        }
        _ => None,
    }
}

/// Retires the word if `idle` holds for it; whether this call retired it.
/// Linearised at the marking CAS, which fails if any decision stored since
/// the word was judged idle.
pub(crate) fn retire_if<A: AtomicWord>(cell: &A, idle: impl Fn(A::Word) -> bool) -> bool {
    let mut current = cell.load_word();
    // Progress: as `transition`'s.
    loop {
        if A::is_retired(current) || !idle(current) {
            return false;
        }
        match cell.swap_if_unchanged(current, A::marked(current)) {
            Ok(()) => return true,
            Err(actual) => current = actual,
        }
    }
}

/// Retires the word whatever it holds; what it held when it was retired
/// (by this call or an earlier one), and whether this call retired it.
pub(crate) fn retire<A: AtomicWord>(cell: &A) -> (A::Word, bool) {
    let mut current = cell.load_word();
    // Progress: as `transition`'s.
    loop {
        if A::is_retired(current) {
            return (A::unmarked(current), false);
        }
        match cell.swap_if_unchanged(current, A::marked(current)) {
            Ok(()) => return (current, true),
            Err(actual) => current = actual,
        }
    }
}

/// The `u128` word of the window policies (layout in the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WindowWord {
    /// `(now − origin) / W` of the window the counts belong to, at most
    /// [`WindowWord::LAST`].
    pub(crate) window: u64,
    /// Admissions (units) in window `window − 1`.
    pub(crate) previous: u32,
    /// Admissions (units) in window `window`.
    pub(crate) current: u32,
}

impl WindowWord {
    /// The largest window index the word holds (63 bits).
    pub(crate) const LAST: u64 = (1 << 63) - 1;

    /// The index of the window that holds `now` (ticks past the origin),
    /// stopped at [`LAST`](Self::LAST) (module docs).
    #[inline]
    pub(crate) fn index(now: u64, window: u64) -> u64 {
        (now / window).min(Self::LAST)
    }

    #[inline]
    pub(crate) fn pack(self) -> u128 {
        debug_assert!(self.window <= Self::LAST);
        (u128::from(self.window) << 64)
            | (u128::from(self.previous) << 32)
            | u128::from(self.current)
    }

    /// Whether a loaded word holds counts a window rule of `limit` can
    /// store: each at most the limit, and no previous count for a fixed
    /// window (`counter` false).
    pub(crate) fn holds_at_most(self, limit: u64, counter: bool) -> bool {
        u64::from(self.current) <= limit
            && u64::from(self.previous) <= limit
            && (counter || self.previous == 0)
    }

    #[inline]
    pub(crate) fn unpack(word: u128) -> Self {
        // The casts keep exactly the documented fields: 63 bits of window
        // (the mark masked off), 32 bits of each count.
        Self {
            window: ((word >> 64) as u64) & Self::LAST,
            previous: (word >> 32) as u32,
            current: word as u32,
        }
    }
}

/// One slot of the sliding log's ring (layout in the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LogSlot {
    /// The entry's sequence (its number + L), mod 2^42; with
    /// [`RETIRED`](Self::RETIRED) or [`REPLACED`](Self::REPLACED) set on a
    /// marked frontier.
    pub(crate) sequence: u64,
    /// Units admitted through this entry, mod 2^20.
    pub(crate) units: u32,
    pub(crate) time: u64,
}

impl LogSlot {
    /// The retirement mark `R`, the top bit (layout in the module docs).
    pub(crate) const RETIRED: u64 = 1 << (SEQUENCE_BITS + 1);
    /// The replacement mark `P`, just above the sequence: a refund froze
    /// this ring and named the one that goes on from it.
    pub(crate) const REPLACED: u64 = 1 << SEQUENCE_BITS;
    /// Either mark: a frontier that takes no more entries.
    pub(crate) const MARKS: u64 = Self::RETIRED | Self::REPLACED;
    /// The sequence's mask: 42 bits.
    pub(crate) const SEQUENCE: u64 = (1 << SEQUENCE_BITS) - 1;
    /// The running total's mask: 20 bits.
    pub(crate) const UNITS: u32 = (1 << UNIT_BITS) - 1;

    #[inline]
    pub(crate) fn pack(self) -> u128 {
        debug_assert!(self.sequence <= Self::SEQUENCE | Self::MARKS);
        debug_assert!(self.units <= Self::UNITS);
        (u128::from(self.sequence) << (64 + UNIT_BITS))
            | (u128::from(self.units) << 64)
            | u128::from(self.time)
    }

    #[inline]
    pub(crate) fn unpack(word: u128) -> Self {
        Self {
            sequence: (word >> (64 + UNIT_BITS)) as u64,
            units: ((word >> 64) as u32) & Self::UNITS,
            time: word as u64,
        }
    }
}

const SEQUENCE_BITS: u32 = 42;
const UNIT_BITS: u32 = 20;

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;

    #[test]
    fn window_word_round_trips_at_the_extremes() {
        for word in [
            WindowWord::default(),
            WindowWord {
                window: WindowWord::LAST,
                previous: u32::MAX,
                current: u32::MAX,
            },
            WindowWord {
                window: 1 << 44,
                previous: 0,
                current: 1,
            },
        ] {
            assert_eq!(WindowWord::unpack(word.pack()), word);
        }
        assert_eq!(WindowWord::index(u64::MAX, 1), WindowWord::LAST);
        assert_eq!(WindowWord::index(u64::MAX, 2), u64::MAX / 2);
    }

    #[test]
    fn log_slot_round_trips() {
        for slot in [
            LogSlot {
                sequence: LogSlot::SEQUENCE,
                units: LogSlot::UNITS,
                time: u64::MAX,
            },
            LogSlot {
                sequence: 7 | LogSlot::RETIRED,
                units: 0,
                time: 2_000_000_000_000,
            },
            LogSlot {
                sequence: LogSlot::SEQUENCE | LogSlot::REPLACED,
                units: 0,
                time: u64::MAX - 7,
            },
        ] {
            assert_eq!(LogSlot::unpack(slot.pack()), slot);
        }
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
        assert_eq!(decision.unwrap().remaining, 7);
        assert_eq!(cell.load(Ordering::Relaxed), 8);
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod retirement_tests {
    use super::*;

    #[test]
    fn a_retired_word_is_never_stepped_on_and_keeps_its_value() {
        let cell = AtomicU64::new(41);
        assert!(!retire_if(&cell, |word| word == 0));
        assert!(retire_if(&cell, |word| word == 41));
        assert!(!retire_if(&cell, |_| true), "retired once only");
        let stepped = transition(&cell, |word| Step {
            decision: Decision::admit(word),
            next: Some(word + 1),
        });
        assert_eq!(stepped, Err(Retired));
        assert_eq!(read(&cell), Err(Retired));
        assert_eq!(retire(&cell), (41, false));
    }

    #[test]
    fn the_window_mark_sits_above_the_index() {
        let word = WindowWord {
            window: WindowWord::LAST,
            previous: u32::MAX,
            current: u32::MAX,
        }
        .pack();
        assert!(!AtomicU128::is_retired(word));
        let marked = AtomicU128::marked(word);
        assert!(AtomicU128::is_retired(marked));
        assert_eq!(AtomicU128::unmarked(marked), word);
    }
}
