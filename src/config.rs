//! Policy names and validated limits: everything that is checked once, at
//! construction, so the hot path never has to.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::Tick;

/// The largest limit any policy accepts (2^32 − 1), as the contract sets it:
/// limits in bytes need that much, and the window policies' state words hold
/// two counts of 32 bits (layouts in the state words' docs).
/// `sliding-window` takes at most [`MAX_LOG_LIMIT`]: its state is O(L).
pub const MAX_LIMIT: u64 = (1 << 32) - 1;

/// The largest limit `sliding-window` accepts (2^20 − 1): each client keeps a
/// log of up to `L` admissions, 16 bytes each, so a client of this limit
/// already takes 16 MiB. [`Config::check_for`] checks it.
pub const MAX_LOG_LIMIT: u64 = (1 << 20) - 1;

/// The longest window the drip policies (`token-bucket`, `gcra`,
/// `leaky-bucket`) accept: 2^62 ticks (146 years of nanoseconds). Their
/// state is one `u64` time (the theoretical arrival time, or the drip from
/// which the bucket is full), which runs up to one window ahead of `now`;
/// they tell times apart up to 2^62 ticks, so it stays below 2^63 and the
/// top bit is free to mark a retired state.
pub const MAX_SCHEDULE_WINDOW: u64 = 1 << 62;

/// The six policies, by the names used in configuration files and on the
/// command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// `sliding-window`: an exact log of the last `limit` admissions.
    SlidingWindow,
    /// `token-bucket`: a bucket of `limit` tokens, one drip every `window / limit`.
    TokenBucket,
    /// `fixed-window`: at most `limit` per window, on each client's own grid.
    FixedWindow,
    /// `sliding-window-counter`: two windows' counts, weighted by overlap.
    SlidingWindowCounter,
    /// `gcra`: the generic cell rate algorithm (virtual scheduling).
    Gcra,
    /// `leaky-bucket`: GCRA's admissions, answered as a queueing delay.
    LeakyBucket,
    /// `in-flight`: at most `limit` units held at once, each until it is
    /// released; no window (the contract's "Requests in flight").
    InFlight,
}

impl PolicyKind {
    /// Every policy, in the order the documentation lists them.
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::SlidingWindow,
        PolicyKind::TokenBucket,
        PolicyKind::FixedWindow,
        PolicyKind::SlidingWindowCounter,
        PolicyKind::Gcra,
        PolicyKind::LeakyBucket,
    ];

    /// Every rule kind: the six rate policies and `in-flight`, which bounds
    /// what is held at once rather than what is spent per window.
    pub const EVERY: [PolicyKind; 7] = [
        PolicyKind::SlidingWindow,
        PolicyKind::TokenBucket,
        PolicyKind::FixedWindow,
        PolicyKind::SlidingWindowCounter,
        PolicyKind::Gcra,
        PolicyKind::LeakyBucket,
        PolicyKind::InFlight,
    ];

    /// The policy's configuration name, e.g. `"token-bucket"`.
    pub const fn name(self) -> &'static str {
        match self {
            PolicyKind::SlidingWindow => "sliding-window",
            PolicyKind::TokenBucket => "token-bucket",
            PolicyKind::FixedWindow => "fixed-window",
            PolicyKind::SlidingWindowCounter => "sliding-window-counter",
            PolicyKind::Gcra => "gcra",
            PolicyKind::LeakyBucket => "leaky-bucket",
            PolicyKind::InFlight => "in-flight",
        }
    }

    /// Whether the rule has a window: every rate policy; not `in-flight`,
    /// which holds units until they are released.
    pub const fn has_window(self) -> bool {
        !matches!(self, PolicyKind::InFlight)
    }

    /// Whether the policy releases one request per interval `window / limit`
    /// and so needs `window >= limit`.
    pub const fn drips(self) -> bool {
        matches!(
            self,
            PolicyKind::TokenBucket | PolicyKind::Gcra | PolicyKind::LeakyBucket
        )
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;

    /// Parses one of the seven names exactly (case-sensitive).
    ///
    /// # Errors
    ///
    /// [`UnknownPolicy`], whose message lists the names that exist.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        PolicyKind::EVERY
            .into_iter()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| UnknownPolicy {
                name: name.to_owned(),
            })
    }
}

/// A policy name that is not one of the seven.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownPolicy {
    /// The name that was asked for.
    pub name: String,
}

impl fmt::Display for UnknownPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown policy {:?}; the policies are ", self.name)?;
        for (i, kind) in PolicyKind::EVERY.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(kind.name())?;
        }
        Ok(())
    }
}

impl std::error::Error for UnknownPolicy {}

/// A limit that some policy would refuse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// The limit is outside `1..=MAX_LIMIT`.
    LimitOutOfRange {
        /// The limit that was given.
        limit: u64,
    },
    /// The limit is above what this policy takes: `sliding-window` takes at
    /// most [`MAX_LOG_LIMIT`].
    LimitTooLargeFor {
        /// The policy.
        policy: PolicyKind,
        /// The limit that was given.
        limit: u64,
        /// The largest limit the policy takes.
        max: u64,
    },
    /// The window is 0 ticks.
    ZeroWindow,
    /// A policy that releases one request per `window / limit` ticks was
    /// given a window shorter than its limit, so that interval would be 0.
    WindowShorterThanLimit {
        /// The policy that needs `window >= limit`.
        policy: PolicyKind,
        /// The limit that was given.
        limit: u64,
        /// The window that was given, in ticks.
        window: u64,
        /// The window as it was written, if it was given as a duration.
        span: Option<Duration>,
    },
    /// The window is longer than the policy can hold: a `Duration` past
    /// `u64::MAX` ticks, or a drip policy's (`token-bucket`, `gcra`,
    /// `leaky-bucket`) window past [`MAX_SCHEDULE_WINDOW`].
    WindowTooLong {
        /// The window that was asked for, in ticks.
        window: u128,
        /// The longest window allowed.
        max: u64,
    },
    /// An offenders' summary ([`Builder::offenders`](crate::Builder::offenders))
    /// of no entries, or of more than 2^31.
    OffendersOutOfRange {
        /// The capacity that was given.
        capacity: usize,
    },
    /// A limiter given no rule, or more than [`MAX_RULES`](crate::MAX_RULES).
    RuleCount {
        /// How many were given.
        count: usize,
    },
    /// Bounds that can only refuse everyone: a cap of 0 clients that
    /// rejects the ones without room ([`Bounds::validate`](crate::Bounds::validate)).
    RefusesEveryone,
    /// [`Overflow::Shared`](crate::Overflow::Shared) with an `in-flight`
    /// rule: the one state shared by the newcomers without room would hold
    /// their units, and no release could find it (a release goes by the
    /// client's own state), so it would fill and refuse every newcomer for
    /// ever. Choose `Overflow::Reject` or `Overflow::Admit` for such rules.
    SharedOverflowHolds,
    /// A tier added twice to one registry
    /// ([`Tiers::with_tier`](crate::tiers::Tiers::with_tier)): the second
    /// would silently replace the first. A tier's rules change at run time
    /// through [`Tiers::reload`](crate::tiers::Tiers::reload).
    DuplicateTier {
        /// The tier's name.
        name: String,
    },
    /// A rate given as a duration that the clock's tick cannot express
    /// within 0.1 %: the window is not close to a whole number of ticks,
    /// or (for the policies that drip) the interval `window / limit` is not.
    RateDoesNotFitTick {
        /// The limit.
        limit: u64,
        /// The window asked for.
        window: Duration,
        /// The clock's tick.
        tick: Tick,
        /// The window the tick would give: `limit` per this much (for the
        /// drip policies, `limit` intervals of a whole number of ticks).
        nearest: Duration,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::LimitOutOfRange { limit } => write!(
                f,
                "limit {limit} is out of range: it must be between 1 and {MAX_LIMIT}"
            ),
            ConfigError::LimitTooLargeFor { policy, limit, max } => write!(
                f,
                "limit {limit} is out of range for {policy}: it must be between 1 and {max}"
            ),
            ConfigError::ZeroWindow => {
                f.write_str("the window is zero: a rate needs a window of at least one tick")
            }
            ConfigError::WindowShorterThanLimit {
                policy,
                limit,
                window,
                span: Some(span),
            } if *window > 0 => {
                // The window in the words it was given, and the shortest
                // one that would do, in the same clock's ticks.
                let tick_nanos = span.as_nanos() / u128::from(*window);
                let least = Duration::from_nanos(
                    u64::try_from(tick_nanos.max(1) * u128::from(*limit)).unwrap_or(u64::MAX),
                );
                f.write_str("window ")?;
                crate::rule::write_duration(f, *span)?;
                write!(
                    f,
                    " is too short for limit {limit}: {policy} releases one request every \
                     window/limit, at least one tick of the clock, so the window must be at least "
                )?;
                crate::rule::write_duration(f, least)
            }
            ConfigError::WindowShorterThanLimit {
                policy,
                limit,
                window,
                ..
            } => write!(
                f,
                "window {window} ticks is shorter than limit {limit}: {policy} releases one \
                 request every window/limit ticks, so it needs window >= limit"
            ),
            ConfigError::WindowTooLong { window, max } => write!(
                f,
                "window {window} is too long: it must be at most {max} ticks"
            ),
            ConfigError::OffendersOutOfRange { capacity } => write!(
                f,
                "offenders({capacity}) is out of range: the summary of the clients refused \
                 most holds between 1 and 2^31 of them (1,024 names a client with 1 % of \
                 the rejections)"
            ),
            ConfigError::RuleCount { count } => write!(
                f,
                "{count} rules: a limiter applies between 1 and {} rules to each client",
                crate::MAX_RULES
            ),
            ConfigError::DuplicateTier { name } => write!(
                f,
                "tier {name:?} is added twice: each tier is added once (the default tier \
                 by `Tiers::new`), and its rules change through `reload`"
            ),
            ConfigError::SharedOverflowHolds => f.write_str(
                "the shared overflow state cannot hold an in-flight rule's units (no release \
                 finds it, so it would fill and refuse every newcomer): use Overflow::Reject \
                 or Overflow::Admit with in-flight rules",
            ),
            ConfigError::RefusesEveryone => f.write_str(
                "max_clients(0) with the overflow rule `reject` refuses every client: \
                 give a cap of at least 1, or the rule `shared` (one limit for all) or `admit`",
            ),
            ConfigError::RateDoesNotFitTick {
                limit,
                window,
                tick,
                nearest,
            } => {
                write!(f, "{limit} per ")?;
                crate::rule::write_duration(f, *window)?;
                write!(
                    f,
                    " does not fit a clock tick of {tick} within 0.1 %: it would be {limit} per "
                )?;
                crate::rule::write_duration(f, *nearest)
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// A validated limit: at most `limit` requests per window.
///
/// Give the window as a duration with [`Config::per`]: it means the same
/// rate whatever the clock's tick, in memory and on Redis; each limiter
/// turns it into its own ticks when it is built. [`Config::per_ticks`]
/// takes a raw count of ticks, for exact work (traces, tests) where the
/// unit is yours.
///
/// The ranges every policy shares are checked here; [`Config::check_for`]
/// adds what one policy needs (the drip policies need `window >= limit`).
///
/// ```
/// use floodgate::{Config, ConfigError, Tick};
/// use std::time::Duration;
///
/// let config = Config::per(100, Duration::from_secs(1))?;
/// assert_eq!(format!("{config:?}"), "Config { limit: 100, window: 1s }");
/// assert_eq!(config.window(), 1_000_000_000); // in nanoseconds, the default tick
/// let in_millis = config.in_ticks_of(Tick::MILLISECOND)?;
/// assert_eq!((in_millis.window(), in_millis.interval()), (1_000, 10));
///
/// let exact = Config::per_ticks(100, 1_000)?;
/// assert_eq!(format!("{exact:?}"), "Config { limit: 100, window: 1000 ticks }");
/// assert_eq!(Config::per_ticks(0, 1_000), Err(ConfigError::LimitOutOfRange { limit: 0 }));
/// # Ok::<(), ConfigError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Config {
    limit: u64,
    /// In ticks: of the default clock (nanoseconds) until
    /// [`in_ticks_of`](Config::in_ticks_of) resolves `span` for another.
    window: u64,
    /// The window as a duration, when it was given as one.
    span: Option<Duration>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Window(Config);
        impl fmt::Debug for Window {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.0.span {
                    Some(span) => crate::rule::write_duration(f, span),
                    None => write!(f, "{} ticks", self.0.window),
                }
            }
        }
        f.debug_struct("Config")
            .field("limit", &self.limit)
            .field("window", &Window(*self))
            .finish()
    }
}

impl Config {
    /// At most `limit` requests per `window` **ticks** — whatever the
    /// clock's tick is: nanoseconds on the default clock, so
    /// `per_ticks(5, 1_000)` is 5 per microsecond there. For a rate a
    /// person would write in seconds, use [`Config::per`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::LimitOutOfRange`] unless `1 <= limit <= MAX_LIMIT`;
    /// [`ConfigError::ZeroWindow`] if `window` is 0.
    pub const fn per_ticks(limit: u64, window: u64) -> Result<Self, ConfigError> {
        if limit == 0 || limit > MAX_LIMIT {
            return Err(ConfigError::LimitOutOfRange { limit });
        }
        if window == 0 {
            return Err(ConfigError::ZeroWindow);
        }
        Ok(Self {
            limit,
            window,
            span: None,
        })
    }

    /// At most `limit` units held at once, for an `in-flight` rule: no
    /// window (it is kept as one tick, which nothing reads).
    ///
    /// # Errors
    ///
    /// [`ConfigError::LimitOutOfRange`] unless `1 <= limit <= MAX_LIMIT`.
    pub const fn in_flight(limit: u64) -> Result<Self, ConfigError> {
        Self::per_ticks(limit, 1)
    }

    /// At most `limit` requests per `window`: the same rate on every clock
    /// and backend. Until a limiter resolves it for its clock's tick, its
    /// [`window`](Self::window) is in nanoseconds.
    ///
    /// # Errors
    ///
    /// As [`Config::per_ticks`] ([`ConfigError::ZeroWindow`] for
    /// `Duration::ZERO`), and [`ConfigError::WindowTooLong`] if the window
    /// does not fit in 64 bits of nanoseconds (about 584 years).
    pub fn per(limit: u64, window: Duration) -> Result<Self, ConfigError> {
        if window.is_zero() {
            return Err(ConfigError::ZeroWindow);
        }
        let mut config = Self::per_ticks(limit, 1)?;
        config.span = Some(window);
        config.in_ticks_of(Tick::NANOSECOND)
    }

    /// The window as a duration, if it was given as one.
    pub const fn span(self) -> Option<Duration> {
        self.span
    }

    /// The same rule in ticks of `tick`: a window given as a duration is
    /// converted; a window given in ticks is kept as it is.
    ///
    /// # Errors
    ///
    /// [`ConfigError::WindowTooLong`] past `u64::MAX` ticks;
    /// [`ConfigError::RateDoesNotFitTick`] if the window is not within
    /// 0.1 % of a whole number of ticks (one tick at least).
    pub fn in_ticks_of(self, tick: Tick) -> Result<Self, ConfigError> {
        let Some(span) = self.span else {
            return Ok(self);
        };
        let nanos = span.as_nanos();
        let tick_nanos = u128::from(tick.nanos());
        // The nearest whole number of ticks.
        let ticks = (nanos + tick_nanos / 2) / tick_nanos;
        let window = u64::try_from(ticks).map_err(|_| ConfigError::WindowTooLong {
            window: ticks,
            max: u64::MAX,
        })?;
        if window == 0 {
            return Err(self.misfit(span, tick, tick.duration()));
        }
        let nearest = tick.times(window);
        if !within_a_thousandth(nearest, span) {
            return Err(self.misfit(span, tick, nearest));
        }
        Ok(Self { window, ..self })
    }

    /// The rule resolved for `tick` ([`in_ticks_of`](Self::in_ticks_of))
    /// and checked for `policy` ([`check_for`](Self::check_for)).
    ///
    /// # Errors
    ///
    /// What those two refuse.
    pub fn resolve(self, policy: PolicyKind, tick: Tick) -> Result<Self, ConfigError> {
        self.in_ticks_of(tick)?.check_for(policy)
    }

    fn misfit(self, span: Duration, tick: Tick, nearest: Duration) -> ConfigError {
        ConfigError::RateDoesNotFitTick {
            limit: self.limit,
            window: span,
            tick,
            nearest,
        }
    }

    /// Checks what `policy` needs beyond the shared ranges. A drip policy
    /// releases one request per whole interval `⌊window / limit⌋`, so a rate
    /// given as a duration must keep that interval within 0.1 % of
    /// `window / limit` in the ticks it is resolved for.
    ///
    /// # Errors
    ///
    /// [`ConfigError::LimitTooLargeFor`] for `sliding-window` with
    /// `limit >` [`MAX_LOG_LIMIT`];
    /// [`ConfigError::WindowShorterThanLimit`] for a drip policy with
    /// `window < limit`; [`ConfigError::WindowTooLong`] for a drip policy
    /// with `window >` [`MAX_SCHEDULE_WINDOW`];
    /// [`ConfigError::RateDoesNotFitTick`] for a duration-given drip rate
    /// whose interval does not fit.
    pub fn check_for(self, policy: PolicyKind) -> Result<Self, ConfigError> {
        let checked = self.check_ranges_for(policy)?;
        if let (Some(span), true) = (self.span, policy.drips()) {
            // In the ticks the window is resolved for, `limit` intervals
            // cover `interval·limit` of its `window` ticks.
            let covered = u128::from(self.interval() * self.limit);
            let window = u128::from(self.window);
            if (window - covered) * 1_000 > window {
                let nearest_nanos = span.as_nanos() * covered / window;
                let nearest =
                    Duration::from_nanos(u64::try_from(nearest_nanos).unwrap_or(u64::MAX));
                let tick_nanos = (span.as_nanos() / window).max(1);
                let tick = Tick::from_duration(Duration::from_nanos(
                    u64::try_from(tick_nanos).unwrap_or(u64::MAX),
                ))
                .unwrap_or(Tick::NANOSECOND);
                return Err(self.misfit(span, tick, nearest));
            }
        }
        Ok(checked)
    }

    const fn check_ranges_for(self, policy: PolicyKind) -> Result<Self, ConfigError> {
        if matches!(policy, PolicyKind::SlidingWindow) && self.limit > MAX_LOG_LIMIT {
            return Err(ConfigError::LimitTooLargeFor {
                policy,
                limit: self.limit,
                max: MAX_LOG_LIMIT,
            });
        }
        if policy.drips() && self.window > MAX_SCHEDULE_WINDOW {
            return Err(ConfigError::WindowTooLong {
                window: self.window as u128,
                max: MAX_SCHEDULE_WINDOW,
            });
        }
        if policy.drips() && self.window < self.limit {
            return Err(ConfigError::WindowShorterThanLimit {
                policy,
                limit: self.limit,
                window: self.window,
                span: self.span,
            });
        }
        Ok(self)
    }

    /// The limit `L`.
    pub const fn limit(self) -> u64 {
        self.limit
    }

    /// The window `W`, in ticks.
    pub const fn window(self) -> u64 {
        self.window
    }

    /// `I = ⌊W / L⌋`: the drip policies release one request per `I` ticks.
    pub const fn interval(self) -> u64 {
        self.window / self.limit
    }
}

/// Whether `got` is within 0.1 % of `wanted`.
fn within_a_thousandth(got: Duration, wanted: Duration) -> bool {
    got.abs_diff(wanted).as_nanos() * 1_000 <= wanted.as_nanos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_lists_all() {
        for kind in PolicyKind::ALL {
            assert_eq!(kind.name().parse::<PolicyKind>(), Ok(kind));
        }
        let err = "token_bucket".parse::<PolicyKind>().unwrap_err();
        let message = err.to_string();
        assert!(message.contains("\"token_bucket\""), "{message}");
        for kind in PolicyKind::ALL {
            assert!(message.contains(kind.name()), "{message}");
        }
    }

    #[test]
    fn limits_and_windows_are_range_checked() {
        assert_eq!(
            Config::per_ticks(0, 10),
            Err(ConfigError::LimitOutOfRange { limit: 0 })
        );
        assert_eq!(
            Config::per_ticks(MAX_LIMIT + 1, 10),
            Err(ConfigError::LimitOutOfRange {
                limit: MAX_LIMIT + 1
            })
        );
        assert!(Config::per_ticks(MAX_LIMIT, 1).is_ok());
        for kind in PolicyKind::ALL {
            let largest = Config::per_ticks(MAX_LIMIT, MAX_LIMIT).unwrap();
            let log = kind == PolicyKind::SlidingWindow;
            assert_eq!(
                largest.check_for(kind),
                if log {
                    Err(ConfigError::LimitTooLargeFor {
                        policy: kind,
                        limit: MAX_LIMIT,
                        max: MAX_LOG_LIMIT,
                    })
                } else {
                    Ok(largest)
                },
                "{kind}"
            );
            let within = Config::per_ticks(MAX_LOG_LIMIT, MAX_LOG_LIMIT).unwrap();
            assert_eq!(within.check_for(kind), Ok(within), "{kind}");
        }
        assert_eq!(Config::per_ticks(1, 0), Err(ConfigError::ZeroWindow));
        let short = Config::per_ticks(10, 9).unwrap();
        for kind in PolicyKind::ALL {
            assert_eq!(short.check_for(kind).is_err(), kind.drips(), "{kind}");
        }
        assert_eq!(
            Config::per(1, Duration::from_secs(u64::MAX)),
            Err(ConfigError::WindowTooLong {
                window: u128::from(u64::MAX) * 1_000_000_000,
                max: u64::MAX,
            })
        );
        let longest = Config::per_ticks(1, MAX_SCHEDULE_WINDOW + 1).unwrap();
        for kind in PolicyKind::ALL {
            assert_eq!(longest.check_for(kind).is_err(), kind.drips(), "{kind}");
        }
        assert!(Config::per_ticks(1, MAX_SCHEDULE_WINDOW)
            .unwrap()
            .check_for(PolicyKind::Gcra)
            .is_ok());
    }
}
