//! The rate-limit headers of a response: draft-ietf-httpapi-ratelimit-headers-10
//! (`RateLimit-Policy`, `RateLimit`), `Retry-After`, and the legacy
//! `X-RateLimit-*`.

use std::fmt::Write as _;
use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use crate::{PolicyKind, RuledDecision};

static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The headers one decision gives its response, computed once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RateLimitHeaders {
    policy: HeaderValue,
    ratelimit: HeaderValue,
    /// `Retry-After`, for a rejection.
    retry_after: Option<u64>,
    limit: u64,
    remaining: u64,
    reset: Option<u64>,
    legacy: bool,
}

impl RateLimitHeaders {
    /// The headers for `ruled`, whose policy is named `name` unless a tier
    /// decided it (the tier's name then).
    pub(crate) fn new(
        ruled: &RuledDecision<'_>,
        name: &str,
        unit: Option<&str>,
        legacy: bool,
    ) -> Self {
        let decision = &ruled.decision;
        let name = ruled.tier.unwrap_or(name);
        let limit = ruled.config.limit();
        let window = window(ruled);
        let reset = until_more(ruled, window);

        let mut policy = sf_string(name);
        let _ = write!(policy, ";q={limit}");
        if let Some(unit) = unit {
            let _ = write!(policy, ";qu={}", sf_string(unit));
        }
        if let Some(seconds) = whole_seconds(window) {
            let _ = write!(policy, ";w={seconds}");
        }
        let mut ratelimit = sf_string(name);
        let _ = write!(ratelimit, ";r={}", decision.remaining);
        // No reset for a request no wait admits: no time can be honoured.
        if let Some(reset) = reset {
            let _ = write!(ratelimit, ";t={reset}");
        }
        Self {
            policy: value(policy),
            ratelimit: value(ratelimit),
            // None for an admission, and for a request that can never be
            // admitted: no `Retry-After` the limiter cannot honour.
            retry_after: if decision.allowed {
                None
            } else {
                decision.retry_after_secs()
            },
            limit,
            remaining: decision.remaining,
            reset,
            legacy,
        }
    }

    /// Adds the headers to `headers`. The structured fields are appended,
    /// so a layer stacked inside another adds its own member to each list;
    /// `Retry-After` and the legacy headers replace any already there.
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
        headers.append(RATELIMIT_POLICY.clone(), self.policy.clone());
        headers.append(RATELIMIT.clone(), self.ratelimit.clone());
        if let Some(seconds) = self.retry_after {
            headers.insert(RETRY_AFTER, seconds.into());
        }
        if self.legacy {
            headers.insert(X_RATELIMIT_LIMIT.clone(), self.limit.into());
            headers.insert(X_RATELIMIT_REMAINING.clone(), self.remaining.into());
            if let Some(reset) = self.reset {
                headers.insert(X_RATELIMIT_RESET.clone(), reset.into());
            }
        }
    }

    /// `Retry-After`, in whole seconds (a rejection only).
    pub(crate) fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }
}

/// The rule's window as a duration: as it was given, or its ticks times the
/// decision's tick.
fn window(ruled: &RuledDecision<'_>) -> Duration {
    ruled
        .config
        .span()
        .unwrap_or_else(|| ruled.decision.tick.times(ruled.config.window()))
}

/// `t`: whole seconds, rounded up, until the client has at least one more
/// request. A rejection: its `Retry-After`. An admission with more left: 0.
/// An admission that spent the last one: an upper bound, since a decision
/// only says when a *rejected* request would pass: one interval `W / L`
/// for the drip policies, the window for the log and the fixed window, the
/// window and one tick for the counter (its current count becomes the
/// previous window's at the next boundary, and decays from the tick after).
/// `None` for a request that can never be admitted.
fn until_more(ruled: &RuledDecision<'_>, window: Duration) -> Option<u64> {
    let decision = &ruled.decision;
    if !decision.allowed {
        return decision.retry_after_secs();
    }
    if decision.remaining > 0 {
        return Some(0);
    }
    let tick = decision.tick;
    let wait = match ruled.policy {
        kind if kind.drips() => tick.times(ruled.config.interval()),
        PolicyKind::SlidingWindowCounter => window.saturating_add(tick.duration()),
        _ => window,
    };
    Some(ceil_seconds(wait).max(1))
}

/// `duration` in whole seconds, rounded up.
pub(crate) fn ceil_seconds(duration: Duration) -> u64 {
    let whole = duration.as_secs();
    if duration.subsec_nanos() > 0 {
        whole.saturating_add(1)
    } else {
        whole
    }
}

/// The window in seconds when it is a whole number of them.
fn whole_seconds(window: Duration) -> Option<u64> {
    (window.subsec_nanos() == 0 && window.as_secs() > 0).then_some(window.as_secs())
}

/// `name` as an RFC 9651 string: quoted, `\` and `"` escaped, and any
/// character outside printable ASCII (which a string cannot hold) as `?`.
fn sf_string(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 24);
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

/// A header value from text made of printable ASCII only.
fn value(text: String) -> HeaderValue {
    HeaderValue::try_from(text).unwrap_or_else(|_| HeaderValue::from_static("\"invalid\""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Decision, Tick};

    fn ruled(decision: Decision, policy: PolicyKind, config: Config) -> RuledDecision<'static> {
        RuledDecision {
            decision,
            tier: None,
            policy,
            config,
            refused_unknown_tier: false,
            each: crate::RuleAnswers::default(),
        }
    }

    #[test]
    fn names_are_structured_strings() {
        assert_eq!(sf_string("default"), r#""default""#);
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("café"), r#""caf?""#);
    }

    #[test]
    fn the_window_is_given_only_in_whole_seconds() {
        let admitted = Decision {
            allowed: true,
            remaining: 4,
            ..Decision::default()
        };
        let config = Config::per(5, Duration::from_millis(1_500)).unwrap();
        let headers = RateLimitHeaders::new(
            &ruled(admitted, PolicyKind::Gcra, config),
            "api",
            None,
            false,
        );
        assert_eq!(headers.policy, r#""api";q=5"#);
        assert_eq!(headers.ratelimit, r#""api";r=4;t=0"#);

        // A window in ticks: ticks times the decision's tick.
        let config = Config::per_ticks(5, 60_000).unwrap();
        let admitted = Decision {
            tick: Tick::MILLISECOND,
            ..admitted
        };
        let headers = RateLimitHeaders::new(
            &ruled(admitted, PolicyKind::Gcra, config),
            "api",
            None,
            false,
        );
        assert_eq!(headers.policy, r#""api";q=5;w=60"#);
    }

    #[test]
    fn the_last_unit_says_when_the_next_comes_at_most() {
        let spent = Decision {
            allowed: true,
            remaining: 0,
            ..Decision::default()
        };
        let config = Config::per(10, Duration::from_secs(60)).unwrap();
        let t = |policy| until_more(&ruled(spent, policy, config), Duration::from_secs(60));
        assert_eq!(t(PolicyKind::Gcra), Some(6));
        assert_eq!(t(PolicyKind::FixedWindow), Some(60));
        assert_eq!(t(PolicyKind::SlidingWindowCounter), Some(61));
    }
}
