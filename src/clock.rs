//! Where `now` comes from. Only the limiter facade reads a clock; every
//! policy takes `now` as an argument, so decisions are exact and repeatable
//! under a [`ManualClock`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The length of one tick: the unit of every time a limiter takes and
/// answers (`now`, a raw window, [`Decision`](crate::Decision)'s
/// `retry_after` and `delay`). A whole number of nanoseconds, at least one.
///
/// ```
/// use floodgate::Tick;
/// use std::time::Duration;
///
/// assert_eq!(Tick::MILLISECOND.duration(), Duration::from_millis(1));
/// assert_eq!(Tick::from_duration(Duration::from_micros(1)), Some(Tick::MICROSECOND));
/// assert_eq!(Tick::from_duration(Duration::ZERO), None);
/// assert_eq!(Tick::MILLISECOND.to_string(), "1ms");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tick {
    nanos: u64,
}

impl Tick {
    /// One nanosecond: the default clocks' tick.
    pub const NANOSECOND: Tick = Tick { nanos: 1 };
    /// One microsecond: Redis `TIME`'s tick.
    pub const MICROSECOND: Tick = Tick { nanos: 1_000 };
    /// One millisecond: `floodgate replay`'s tick.
    pub const MILLISECOND: Tick = Tick { nanos: 1_000_000 };
    /// One second.
    pub const SECOND: Tick = Tick {
        nanos: 1_000_000_000,
    };

    /// A tick of `length`; `None` unless it is a whole number of
    /// nanoseconds between 1 and `u64::MAX`.
    pub const fn from_duration(length: Duration) -> Option<Tick> {
        let nanos = length.as_nanos();
        if nanos == 0 || nanos > u64::MAX as u128 {
            return None;
        }
        Some(Tick {
            nanos: nanos as u64,
        })
    }

    /// The tick's length.
    pub const fn duration(self) -> Duration {
        Duration::from_nanos(self.nanos)
    }

    /// The tick's length in nanoseconds.
    pub const fn nanos(self) -> u64 {
        self.nanos
    }

    /// `ticks` of this length, saturating at [`Duration::MAX`].
    pub fn times(self, ticks: u64) -> Duration {
        let nanos = u128::from(ticks) * u128::from(self.nanos);
        let secs = nanos / 1_000_000_000;
        match u64::try_from(secs) {
            // The remainder is below 10^9: it fits a u32.
            Ok(secs) => Duration::new(secs, (nanos % 1_000_000_000) as u32),
            Err(_) => Duration::MAX,
        }
    }
}

impl Default for Tick {
    fn default() -> Self {
        Tick::NANOSECOND
    }
}

impl fmt::Display for Tick {
    /// The tick in the largest unit that holds it exactly: `1ns`, `1us`,
    /// `1ms`, `1s`, or a count of nanoseconds otherwise.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::rule::write_duration(f, self.duration())
    }
}

impl fmt::Debug for Tick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tick({self})")
    }
}

/// A source of ticks. The limiter calls [`Clock::now`] once per clock-driven
/// check; the unit is [`Clock::tick`], which is how a limiter turns a
/// duration into ticks and its answers back into durations.
pub trait Clock: Send + Sync {
    /// The current time in ticks. Should not decrease, but the policies
    /// tolerate a `now` that does (see the crate docs on time going
    /// backwards).
    fn now(&self) -> u64;

    /// The length of one tick.
    fn tick(&self) -> Tick;
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

    fn tick(&self) -> Tick {
        Tick::NANOSECOND
    }
}

/// A clock that moves only when told to: for tests, simulations and trace
/// replay. Clones share one time. Its ticks are nanoseconds unless made
/// [`with_tick`](Self::with_tick).
///
/// ```
/// use floodgate::{Clock, ManualClock, Tick};
///
/// let clock = ManualClock::new(100);
/// let shared = clock.clone();
/// shared.advance(5);
/// assert_eq!(clock.now(), 105);
/// assert_eq!(ManualClock::with_tick(0, Tick::MILLISECOND).tick(), Tick::MILLISECOND);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    // Relaxed throughout: the time is one independent value; no other memory
    // is published through it.
    ticks: Arc<AtomicU64>,
    tick: Tick,
}

impl ManualClock {
    /// A clock of nanosecond ticks that reads `ticks` until set or advanced.
    pub fn new(ticks: u64) -> Self {
        Self::with_tick(ticks, Tick::NANOSECOND)
    }

    /// A clock of ticks of length `tick` that reads `ticks` until set or
    /// advanced.
    pub fn with_tick(ticks: u64, tick: Tick) -> Self {
        Self {
            ticks: Arc::new(AtomicU64::new(ticks)),
            tick,
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

    fn tick(&self) -> Tick {
        self.tick
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }

    fn tick(&self) -> Tick {
        (**self).tick()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }

    fn tick(&self) -> Tick {
        (**self).tick()
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
