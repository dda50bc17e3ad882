//! Where `now` comes from. Only the limiter facade reads a clock; every
//! policy takes `now` as an argument, so decisions are exact and repeatable
//! under a [`ManualClock`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
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
/// against tens for the system clock). Where `quanta` reads the counter
/// (x86-64), the read and `quanta`'s scaling of it are done inline, to the
/// same nanosecond as `quanta`'s own calls.
#[derive(Clone, Debug)]
pub struct QuantaClock {
    clock: quanta::Clock,
    start: u64,
    /// The tick it read when made: 0, or where a loaded state's clock
    /// goes on from ([`starting_at`](Self::starting_at)).
    offset: u64,
    /// `quanta`'s own reading of the time-stamp counter and its scaling,
    /// done here inline: `None` where `quanta` reads another source, and
    /// the reads then go through its calls.
    inline: Option<TscScale>,
}

/// `quanta`'s scaling of time-stamp counter ticks to nanoseconds,
/// `⌊ticks · F / 2^S⌋` for its calibration's `F` and `S`, in one 128-bit
/// product: `⌊ticks · G / 2^63⌋` with `G = F · 2^(63 − S)`, which is
/// `quanta`'s own answer for `2^63` ticks. The same integer for every tick
/// count, not an approximation of it (`QuantaClock::starting_at` checks a
/// few, and a unit test many). What it saves is `quanta`'s two calls
/// across crates a read (`Clock::raw` and `Clock::delta_as_nanos`, which
/// are not inlined without link-time optimisation) and their match on its
/// source.
#[derive(Clone, Copy, Debug)]
struct TscScale {
    per_2_63_ticks: u64,
}

impl TscScale {
    /// `clock`'s scaling, if `clock` reads the time-stamp counter (its raw
    /// reading falls between two of ours) and its scaling is the product
    /// above for every tick count checked.
    fn of(clock: &quanta::Clock) -> Option<Self> {
        let before = read_tsc()?;
        let raw = clock.raw();
        let after = read_tsc()?;
        if !(before <= raw && raw <= after) {
            return None;
        }
        let scale = Self {
            per_2_63_ticks: clock.delta_as_nanos(0, 1 << 63),
        };
        // `G` would pass 2^64 at more than 2 ns a tick (a counter below
        // 500 MHz), and `quanta`'s answer for 2^63 ticks would then not be
        // `G`: these checks fail and `quanta` goes on scaling.
        let checks = [
            1,
            999,
            1 << 20,
            123_456_789_012,
            1 << 40,
            1 << 62,
            u64::MAX / 3,
        ];
        checks
            .iter()
            .all(|&ticks| scale.nanos(ticks) == clock.delta_as_nanos(0, ticks))
            .then_some(scale)
    }

    #[inline]
    fn nanos(self, ticks: u64) -> u64 {
        ((u128::from(ticks) * u128::from(self.per_2_63_ticks)) >> 63) as u64
    }
}

/// The time-stamp counter, as `quanta` reads it (`_rdtsc`, no fence), on
/// the targets where `quanta` does; `None` elsewhere.
#[inline]
#[allow(unsafe_code)]
fn read_tsc() -> Option<u64> {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2", not(miri)))]
    {
        // SAFETY: `rdtsc` reads a counter and writes nothing; every
        // x86-64 processor has it (the target's SSE2 is `quanta`'s own
        // condition for reading it).
        Some(unsafe { core::arch::x86_64::_rdtsc() })
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2", not(miri))))]
    {
        None
    }
}

impl QuantaClock {
    /// A clock whose tick 0 is now.
    pub fn new() -> Self {
        Self::starting_at(0)
    }

    /// A clock that reads `ticks` now and counts on from there: the clock
    /// of a limiter loaded from a save, which goes on from the saved one's
    /// ticks with the time between the save and the load added
    /// (`state::Saved::resume_at`, feature `state`).
    ///
    /// ```
    /// use floodgate::{Clock, QuantaClock};
    ///
    /// let clock = QuantaClock::starting_at(86_400_000_000_000);
    /// assert!(clock.now() >= 86_400_000_000_000);
    /// ```
    pub fn starting_at(ticks: u64) -> Self {
        let clock = quanta::Clock::new();
        let start = clock.raw();
        Self {
            inline: TscScale::of(&clock),
            clock,
            start,
            offset: ticks,
        }
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
        // The counter is read only where `quanta` reads it too (`inline`).
        let inline = self.inline.and_then(|scale| Some((scale, read_tsc()?)));
        let nanos = match inline {
            // `quanta`'s `delta_as_nanos(start, raw)`, inlined: 0 for a
            // counter at or before `start`, as there.
            Some((scale, raw)) => scale.nanos(raw.saturating_sub(self.start)),
            None => self.clock.delta_as_nanos(self.start, self.clock.raw()),
        };
        // A wrapping add: one instruction on the hot path. The offset is
        // a saved clock's ticks (nanoseconds since its own start), so the
        // sum passes 2^64 only 584 years after that start.
        nanos.wrapping_add(self.offset)
    }

    fn tick(&self) -> Tick {
        Tick::NANOSECOND
    }
}

impl QuantaClock {
    /// Tick 0 as an instant of quanta's reference time, for a
    /// [`CoarseClock`] that shares this clock's origin.
    fn origin(&self) -> quanta::Instant {
        self.clock.scaled(self.start)
    }
}

/// A clock that costs one load per read: nanoseconds, like
/// [`QuantaClock`], but read from the time `quanta`'s upkeep thread stores
/// every `resolution`
/// ([`quanta::Clock::recent`](https://docs.rs/quanta/0.12/quanta/struct.Clock.html#method.recent))
/// instead of from the
/// time-stamp counter. A TSC read and its scaling are a third of a hot
/// check; this read is a few instructions.
///
/// Decisions stay exact for the time the clock reports: every policy is
/// as exact as under any other clock, but that time may lag real time by
/// up to one resolution (plus the upkeep thread's scheduling delay), so a
/// client may be admitted up to one resolution late or early at a window's
/// edge. Pick a resolution well below the rules' shortest interval; a
/// millisecond suits per-second and per-minute rules. Callers that already
/// hold a timestamp (an event loop's, a request's arrival time) should
/// pass it to [`Limiter::check_at`](crate::Limiter::check_at) instead and
/// read no clock at all.
///
/// quanta runs at most one upkeep thread per process. Every `CoarseClock`
/// built with [`new`](Self::new) or [`aligned_with`](Self::aligned_with)
/// shares the one floodgate started while any of them is alive (the
/// thread stops when the last is dropped, which waits out the thread's
/// current sleep of up to one resolution), so they must all ask for the
/// same resolution ([`CoarseClockError::ResolutionMismatch`] otherwise).
/// When another library already runs the upkeep thread (`governor`'s
/// `QuantaUpkeepClock`, say), `new` answers
/// [`CoarseClockError::UpkeepRunningElsewhere`] and
/// [`on_running_upkeep`](Self::on_running_upkeep) reads that thread's time
/// instead.
///
/// ```
/// use floodgate::{CoarseClock, Limiter, policy::{Gcra, Policy}, Config};
/// use std::time::Duration;
///
/// let clock = CoarseClock::new(Duration::from_millis(1)).expect("no other upkeep thread");
/// let gcra = Gcra::new(Config::per(10, Duration::from_secs(1))?)?;
/// let limiter = Limiter::<u64, Gcra, CoarseClock>::with_clock(gcra, clock)?;
/// assert!(limiter.check(&7).allowed());
/// # Ok::<(), floodgate::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct CoarseClock {
    clock: quanta::Clock,
    origin: quanta::Instant,
    /// The tick `origin` is: an aligned clock's offset
    /// ([`QuantaClock::starting_at`]), else 0.
    offset: u64,
    resolution: Duration,
    /// Keeps floodgate's upkeep thread running; `None` when the thread is
    /// someone else's.
    lease: Option<Arc<UpkeepLease>>,
}

/// Why a [`CoarseClock`] could not be made.
#[derive(Debug)]
#[non_exhaustive]
pub enum CoarseClockError {
    /// The resolution was zero: the upkeep thread would never sleep.
    ZeroResolution,
    /// floodgate's upkeep thread already runs at another resolution.
    ResolutionMismatch {
        /// The resolution of the thread that runs.
        running: Duration,
        /// The resolution asked for.
        requested: Duration,
    },
    /// An upkeep thread started outside floodgate already runs; see
    /// [`CoarseClock::on_running_upkeep`].
    UpkeepRunningElsewhere,
    /// The upkeep thread could not be spawned.
    Spawn(std::io::Error),
}

impl fmt::Display for CoarseClockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoarseClockError::ZeroResolution => {
                write!(f, "a coarse clock's resolution must be above zero")
            }
            CoarseClockError::ResolutionMismatch { running, requested } => write!(
                f,
                "the coarse clock's upkeep thread runs every {running:?}, not every {requested:?}"
            ),
            CoarseClockError::UpkeepRunningElsewhere => {
                write!(f, "another library already runs quanta's upkeep thread")
            }
            CoarseClockError::Spawn(error) => write!(f, "cannot spawn the upkeep thread: {error}"),
        }
    }
}

impl std::error::Error for CoarseClockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CoarseClockError::Spawn(error) => Some(error),
            _ => None,
        }
    }
}

/// floodgate's upkeep thread while any [`CoarseClock`] holds a lease on it.
struct RunningUpkeep {
    handle: quanta::Handle,
    resolution: Duration,
    leases: usize,
}

/// The one upkeep thread floodgate runs. A mutex, not an atomic: leases
/// are taken and returned when clocks are made and dropped, never per
/// read, and the last lease must stop the thread before a new clock may
/// start another.
static UPKEEP: Mutex<Option<RunningUpkeep>> = Mutex::new(None);

/// One share of [`UPKEEP`]; the last one dropped stops the thread.
struct UpkeepLease;

impl UpkeepLease {
    fn take(resolution: Duration) -> Result<UpkeepLease, CoarseClockError> {
        if resolution.is_zero() {
            return Err(CoarseClockError::ZeroResolution);
        }
        // The guarded value is consistent at every point a panic could
        // leave it, so a poisoned lock is still usable.
        let mut upkeep = UPKEEP.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(running) = upkeep.as_mut() {
            if running.resolution != resolution {
                return Err(CoarseClockError::ResolutionMismatch {
                    running: running.resolution,
                    requested: resolution,
                });
            }
            running.leases += 1;
            return Ok(UpkeepLease);
        }
        // None here means floodgate's last thread was stopped and joined
        // under this lock, so quanta's "already running" is someone else's.
        let handle = quanta::Upkeep::new(resolution)
            .start()
            .map_err(|error| match error {
                quanta::Error::UpkeepRunning => CoarseClockError::UpkeepRunningElsewhere,
                quanta::Error::FailedToSpawnUpkeepThread(error) => CoarseClockError::Spawn(error),
            })?;
        *upkeep = Some(RunningUpkeep {
            handle,
            resolution,
            leases: 1,
        });
        Ok(UpkeepLease)
    }
}

impl Drop for UpkeepLease {
    fn drop(&mut self) {
        let mut upkeep = UPKEEP.lock().unwrap_or_else(PoisonError::into_inner);
        let last = upkeep.as_mut().is_some_and(|running| {
            running.leases -= 1;
            running.leases == 0
        });
        if last {
            // Dropping the handle stops and joins the thread, under the
            // lock: a clock made next finds quanta free to start another.
            drop(upkeep.take().map(|running| running.handle));
        }
    }
}

impl CoarseClock {
    /// A clock of `resolution` whose tick 0 is now, on floodgate's upkeep
    /// thread (started here, or shared with the coarse clocks alive).
    pub fn new(resolution: Duration) -> Result<Self, CoarseClockError> {
        let lease = UpkeepLease::take(resolution)?;
        let clock = quanta::Clock::new();
        let origin = clock.now();
        Ok(Self::from_parts(
            clock,
            (origin, 0),
            resolution,
            Some(lease),
        ))
    }

    /// A clock of `resolution` whose tick 0 is `exact`'s: both read the
    /// same nanoseconds, the coarse one up to one resolution behind.
    pub fn aligned_with(
        exact: &QuantaClock,
        resolution: Duration,
    ) -> Result<Self, CoarseClockError> {
        let lease = UpkeepLease::take(resolution)?;
        Ok(Self::from_parts(
            exact.clock.clone(),
            (exact.origin(), exact.offset),
            resolution,
            Some(lease),
        ))
    }

    /// A clock whose tick 0 is now, reading the upkeep thread another
    /// library started (as `governor`'s `QuantaUpkeepClock` does), whose
    /// interval the caller states as `resolution`. Make it after that
    /// thread started: the clock stops moving if the thread stops.
    pub fn on_running_upkeep(resolution: Duration) -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.recent();
        Self::from_parts(clock, (origin, 0), resolution, None)
    }

    fn from_parts(
        clock: quanta::Clock,
        (origin, offset): (quanta::Instant, u64),
        resolution: Duration,
        lease: Option<UpkeepLease>,
    ) -> Self {
        Self {
            clock,
            origin,
            offset,
            resolution,
            lease: lease.map(Arc::new),
        }
    }

    /// How often the upkeep thread updates the time: how far the clock may
    /// lag real time.
    pub fn resolution(&self) -> Duration {
        self.resolution
    }
}

impl fmt::Debug for CoarseClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoarseClock")
            .field("resolution", &self.resolution)
            .field("shared_upkeep", &self.lease.is_some())
            .finish()
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> u64 {
        // Nanoseconds of reference time since the origin, as QuantaClock's
        // `delta_as_nanos`; before the origin (a stale recent time) is 0.
        (self
            .clock
            .recent()
            .saturating_duration_since(self.origin)
            .as_nanos() as u64)
            .wrapping_add(self.offset)
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
        // fetch_update cannot fail with a closure that always returns Some;
        // it retries its CAS only after another thread moved the time.
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

    /// The inline read is `quanta`'s own: the same integer for any count
    /// of ticks, and a read lands between two of `quanta`'s own, tens of
    /// nanoseconds apart, about a second of ticks from the start, where a
    /// scaling off by one part in ten million would fall outside them. On
    /// a processor whose counter `quanta` reads (x86-64 with an invariant
    /// TSC, as Linux's `constant_tsc` and `nonstop_tsc` flags say), the
    /// inline path must be the one taken.
    #[test]
    fn quanta_clock_reads_as_quanta_does() {
        let clock = QuantaClock::starting_at(0);
        let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let invariant = cfg!(all(target_arch = "x86_64", not(miri)))
            && flags.contains(" constant_tsc")
            && flags.contains(" nonstop_tsc");
        if invariant {
            assert!(clock.inline.is_some(), "quanta reads the TSC here");
        }
        if let Some(scale) = clock.inline {
            let mut rng = fastrand::Rng::with_seed(7);
            for ticks in (0..64)
                .flat_map(|bit| [1u64 << bit, (1u64 << bit) - 1, (1u64 << bit) + 1])
                .chain((0..10_000).map(|_| rng.u64(..)))
            {
                assert_eq!(
                    scale.nanos(ticks),
                    clock.clock.delta_as_nanos(0, ticks),
                    "{ticks}"
                );
            }
        }
        // Three billion ticks (about a second) on from the start, as if
        // the clock had been running, so that a wrong scale would show.
        let mut later = clock.clone();
        later.start = later.start.saturating_sub(3_000_000_000);
        for _ in 0..1_000 {
            let before = later.clock.delta_as_nanos(later.start, later.clock.raw());
            let now = later.now();
            let after = later.clock.delta_as_nanos(later.start, later.clock.raw());
            assert!(
                before <= now && now <= after,
                "{before} <= {now} <= {after}"
            );
        }
    }

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

    /// Every coarse clock of these tests asks for this resolution, as
    /// they share one process's upkeep thread.
    const RESOLUTION: Duration = Duration::from_millis(1);

    /// Polls `clock` until it reads more than `after`, failing after a
    /// bound far beyond any scheduling delay (the thread updates every
    /// millisecond).
    fn wait_past(clock: &CoarseClock, after: u64) -> u64 {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let now = clock.now();
            if now > after {
                return now;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the coarse clock stayed at {now} for 30 s"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    #[test]
    fn coarse_clock_never_decreases_and_advances() {
        let clock = CoarseClock::new(RESOLUTION).expect("floodgate's upkeep thread");
        let mut last = clock.now();
        for _ in 0..5 {
            let next = wait_past(&clock, last);
            for _ in 0..1_000 {
                let now = clock.now();
                assert!(now >= next, "{now} after {next}");
            }
            last = next;
        }
    }

    #[test]
    fn coarse_clock_trails_the_exact_clock_it_is_aligned_with() {
        let exact = QuantaClock::new();
        let coarse = CoarseClock::aligned_with(&exact, RESOLUTION).expect("shared upkeep");
        wait_past(&coarse, 0);
        for _ in 0..100 {
            let before = exact.now();
            let reading = coarse.now();
            let after = exact.now();
            // Same ticks, same origin: never ahead of the exact clock read
            // after it (1 µs for quanta's rounding of the two scalings).
            assert!(reading <= after + 1_000, "{reading} > {after}");
            // And behind by a resolution plus the upkeep thread's
            // scheduling delay, bounded here by a generous second.
            assert!(
                before - reading.min(before) < 1_000_000_000,
                "{reading} vs {before}"
            );
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    #[test]
    fn coarse_clocks_share_one_resolution() {
        let clock = CoarseClock::new(RESOLUTION).expect("shared upkeep");
        assert_eq!(clock.resolution(), RESOLUTION);
        assert_eq!(clock.tick(), Tick::NANOSECOND);
        assert!(matches!(
            CoarseClock::new(RESOLUTION * 2),
            Err(CoarseClockError::ResolutionMismatch { running, requested })
                if running == RESOLUTION && requested == RESOLUTION * 2
        ));
        assert!(matches!(
            CoarseClock::new(Duration::ZERO),
            Err(CoarseClockError::ZeroResolution)
        ));
        let shared = clock.clone();
        drop(clock);
        wait_past(&shared, shared.now());
    }

    #[test]
    fn manual_clock_saturates() {
        let clock = ManualClock::new(u64::MAX - 1);
        clock.advance(10);
        assert_eq!(clock.now(), u64::MAX);
    }
}
