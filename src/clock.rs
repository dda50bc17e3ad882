//! Where `now` comes from. Only the limiter facade reads a clock; every
//! policy takes `now` as an argument, so decisions are exact and repeatable
//! under a [`ManualClock`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A source of ticks. The limiter calls [`Clock::now`] once per clock-driven
/// check; the unit is whatever the limiter's window is measured in.
pub trait Clock: Send + Sync {
    /// The current time in ticks. Should not decrease, but the policies
    /// tolerate a `now` that does (see the crate docs on time going
    /// backwards).
    fn now(&self) -> u64;
}

/// The default clock: nanoseconds since the clock was created, read from the
/// CPU's time-stamp counter through [`quanta`] (a few nanoseconds per read,
/// against tens for the system clock).
#[derive(Clone, Debug)]
pub struct QuantaClock {
    clock: quanta::Clock,
    start: u64,
}

impl QuantaClock {
    /// A clock whose tick 0 is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let start = clock.raw();
        Self { clock, start }
    }
}

impl Default for QuantaClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for QuantaClock {
    #[inline]
    fn now(&self) -> u64 {
        self.clock.delta_as_nanos(self.start, self.clock.raw())
    }
}

/// A clock that moves only when told to: for tests, simulations and trace
/// replay. Clones share one time.
///
/// ```
/// use floodgate::{Clock, ManualClock};
///
/// let clock = ManualClock::new(100);
/// let shared = clock.clone();
/// shared.advance(5);
/// assert_eq!(clock.now(), 105);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    // Relaxed throughout: the time is one independent value; no other memory
    // is published through it.
    ticks: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock that reads `ticks` until set or advanced.
    pub fn new(ticks: u64) -> Self {
        Self {
            ticks: Arc::new(AtomicU64::new(ticks)),
        }
    }

    /// Sets the time.
    pub fn set(&self, ticks: u64) {
        self.ticks.store(ticks, Ordering::Relaxed);
    }

    /// Moves the time forward by `ticks` (saturating at `u64::MAX`).
    pub fn advance(&self, ticks: u64) {
        // fetch_update cannot fail with a closure that always returns Some.
        let _ = self
            .ticks
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(ticks))
            });
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        self.ticks.load(Ordering::Relaxed)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quanta_clock_does_not_go_backwards() {
        let clock = QuantaClock::new();
        let mut last = clock.now();
        for _ in 0..10_000 {
            let now = clock.now();
            assert!(now >= last);
            last = now;
        }
    }

    #[test]
    fn manual_clock_saturates() {
        let clock = ManualClock::new(u64::MAX - 1);
        clock.advance(10);
        assert_eq!(clock.now(), u64::MAX);
    }
}
