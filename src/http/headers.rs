//! The rate-limit headers of a response: draft-ietf-httpapi-ratelimit-headers-10
//! (`RateLimit-Policy`, `RateLimit`), `Retry-After`, and the legacy
//! `X-RateLimit-*`.
//!
//! A limiter with several rules gives each list one member per rule, in
//! the limiter's order, named after the policy name with the rule's
//! 1-based position: `"default-1"`, `"default-2"` (a tier's name likewise),
//! so that a client can tell the rules apart and pair each `RateLimit`
//! item with its `RateLimit-Policy` item. The legacy headers, which hold
//! one number each, describe one rule: the rule that refused the request,
//! else the one with the fewest requests left (the first of them).

use std::fmt::Write as _;
use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use crate::{Decision, PolicyKind, Rule, RuledDecision};

static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The rate-limit headers one decision gives its response, as
/// [`RateLimitLayer`](super::RateLimitLayer) sends them, for a server that
/// sends them itself: a rate-limit service answering a proxy that adds
/// them to its response (Envoy's `response_headers_to_add`).
///
/// `RateLimit-Policy` and `RateLimit` (one member per rule, named after
/// the policy or the decision's tier), `Retry-After` for a refusal a wait
/// admits, and the legacy `X-RateLimit-*` when asked for
/// ([`legacy_headers`](Self::legacy_headers)). The module's docs say what
/// each field holds and how it is rounded.
///
/// ```
/// use floodgate::http::RateLimitHeaders;
/// use floodgate::{build_rules, Bounds, Engine, ManualClock, RateLimiter};
///
/// let api = build_rules::<str, _>(&"fixed-window:2/1m".parse()?, Engine::LockFree,
///                                  ManualClock::new(0), Bounds::new())?;
/// api.check_at("alice", 0);
/// let ruled = api.check_ruled_at("alice", 0); // the last of the two
/// let headers = RateLimitHeaders::new(&ruled, "api");
/// let pairs: Vec<(String, String)> = headers
///     .pairs()
///     .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_owned()))
///     .collect();
/// assert_eq!(pairs, [
///     ("ratelimit-policy".to_owned(), r#""api";q=2;w=60"#.to_owned()),
///     ("ratelimit".to_owned(), r#""api";r=0;t=60"#.to_owned()),
/// ]);
///
/// // A refusal says when to come back; the legacy headers on request.
/// let refused = RateLimitHeaders::new(&api.check_ruled_at("alice", 0), "api").legacy_headers();
/// assert_eq!(refused.retry_after(), Some(60));
/// let names: Vec<String> = refused.pairs().map(|(name, _)| name.to_string()).collect();
/// assert_eq!(names, ["ratelimit-policy", "ratelimit", "retry-after", "x-ratelimit-limit",
///                    "x-ratelimit-remaining", "x-ratelimit-reset"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitHeaders {
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
    /// The headers for `ruled`, whose policy is named `policy_name` unless
    /// a tier decided it (the tier's name then), without the legacy ones.
    pub fn new(ruled: &RuledDecision<'_>, policy_name: &str) -> Self {
        Self::for_layer(ruled, policy_name, None, false)
    }

    /// Also `X-RateLimit-Limit`, `-Remaining` and `-Reset` (as `q`, `r`,
    /// `t`): with several rules, of the rule that refused, else of the one
    /// with the fewest left.
    #[must_use]
    pub fn legacy_headers(mut self) -> Self {
        self.legacy = true;
        self
    }

    /// Each header's name and value, in the order above: the structured
    /// lists first, `Retry-After` for a refusal, then the legacy headers
    /// when asked for.
    pub fn pairs(&self) -> impl Iterator<Item = (HeaderName, HeaderValue)> + '_ {
        let legacy = self.legacy.then(|| {
            [
                Some((X_RATELIMIT_LIMIT.clone(), self.limit.into())),
                Some((X_RATELIMIT_REMAINING.clone(), self.remaining.into())),
                self.reset
                    .map(|reset| (X_RATELIMIT_RESET.clone(), reset.into())),
            ]
        });
        [
            Some((RATELIMIT_POLICY.clone(), self.policy.clone())),
            Some((RATELIMIT.clone(), self.ratelimit.clone())),
            self.retry_after
                .map(|seconds| (RETRY_AFTER, HeaderValue::from(seconds))),
        ]
        .into_iter()
        .chain(legacy.into_iter().flatten())
        .flatten()
    }

    /// The headers for `ruled`, as the layer sends them: with the cost's
    /// `unit` in `RateLimit-Policy`, and the legacy headers if `legacy`.
    pub(crate) fn for_layer(
        ruled: &RuledDecision<'_>,
        name: &str,
        unit: Option<&str>,
        legacy: bool,
    ) -> Self {
        let decision = &ruled.decision;
        let name = ruled.tier.unwrap_or(name);
        let mut policy = String::new();
        let mut ratelimit = String::new();
        // One rule: the decision is its own answer.
        let only = || RuleHeader::new(Rule::from_parts(ruled.policy, ruled.config), decision);
        let described = if ruled.each.is_empty() {
            let one = only();
            one.write(&mut policy, &mut ratelimit, name, unit);
            one
        } else {
            let mut described: Option<RuleHeader> = None;
            let refused_by = decision.refused_by();
            for (index, answer) in ruled.each.iter().enumerate() {
                if index > 0 {
                    policy.push_str(", ");
                    ratelimit.push_str(", ");
                }
                let each = RuleHeader::new(answer.rule, &answer.decision);
                each.write(
                    &mut policy,
                    &mut ratelimit,
                    &format!("{name}-{}", index + 1),
                    unit,
                );
                let describes = match (refused_by, &described) {
                    (Some(by), _) => by == index,
                    (None, None) => true,
                    (None, Some(fewest)) => each.remaining < fewest.remaining,
                };
                if describes {
                    described = Some(each);
                }
            }
            // None only for a refusal by a rule past the answers, which
            // no engine gives: the decision and the strictest rule then.
            described.unwrap_or_else(only)
        };
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
            limit: described.limit,
            remaining: described.remaining,
            reset: described.reset,
            legacy,
        }
    }

    /// Adds the headers to `headers`. The structured fields are appended,
    /// so a layer stacked inside another adds its own member to each list;
    /// `Retry-After` and the legacy headers replace any already there.
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
        for (name, value) in self.pairs() {
            if name == RATELIMIT_POLICY || name == RATELIMIT {
                headers.append(name, value);
            } else {
                headers.insert(name, value);
            }
        }
    }

    /// `Retry-After`, in whole seconds: for a refusal that a wait admits,
    /// else `None`.
    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }
}

/// What the headers say of one rule: one member of each list, and the
/// numbers of the legacy headers.
#[derive(Clone, Copy, Debug)]
struct RuleHeader {
    limit: u64,
    window: Duration,
    remaining: u64,
    /// `t`: `None` for a request that no wait admits.
    reset: Option<u64>,
}

impl RuleHeader {
    /// `rule`, from its own `decision`.
    fn new(rule: Rule, decision: &Decision) -> Self {
        let window = window(rule, decision);
        Self {
            limit: rule.config().limit(),
            window,
            remaining: decision.remaining,
            reset: until_more(rule, decision, window),
        }
    }

    /// Appends the rule's member of `RateLimit-Policy` to `policy` and of
    /// `RateLimit` to `ratelimit`, both named `name`.
    fn write(&self, policy: &mut String, ratelimit: &mut String, name: &str, unit: Option<&str>) {
        let name = sf_string(name);
        let _ = write!(policy, "{name};q={}", self.limit);
        if let Some(unit) = unit {
            let _ = write!(policy, ";qu={}", sf_string(unit));
        }
        if let Some(seconds) = whole_seconds(self.window) {
            let _ = write!(policy, ";w={seconds}");
        }
        let _ = write!(ratelimit, "{name};r={}", self.remaining);
        // No reset for a request no wait admits: no time can be honoured.
        if let Some(reset) = self.reset {
            let _ = write!(ratelimit, ";t={reset}");
        }
    }
}

/// The rule's window as a duration: as it was given, or its ticks times the
/// decision's tick.
fn window(rule: Rule, decision: &Decision) -> Duration {
    let config = rule.config();
    config
        .span()
        .unwrap_or_else(|| decision.tick.times(config.window()))
}

/// `t`: whole seconds, rounded up, until the client has at least one more
/// request by `rule`, from its own `decision`. A
/// rejection: its `Retry-After`. An admission with more left: 0.
/// An admission that spent the last one: an upper bound, since a decision
/// only says when a *rejected* request would pass: one interval `W / L`
/// for the drip policies, the window for the log and the fixed window, the
/// window and one tick for the counter (its current count becomes the
/// previous window's at the next boundary, and decays from the tick after).
/// `None` for a request that no wait admits, and for an `in-flight` rule
/// with none left (a release, not a time, gives the next).
fn until_more(rule: Rule, decision: &Decision, window: Duration) -> Option<u64> {
    if !decision.allowed {
        return decision.retry_after_secs();
    }
    if decision.remaining > 0 {
        return Some(0);
    }
    // An `in-flight` rule's next unit comes with a release, at no time
    // known.
    if rule.policy() == PolicyKind::InFlight {
        return None;
    }
    let tick = decision.tick;
    let wait = match rule.policy() {
        kind if kind.drips() => tick.times(rule.config().interval()),
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
    use crate::decision::NEVER;
    use crate::{Config, Tick};

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
        let headers = RateLimitHeaders::for_layer(
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
        let headers = RateLimitHeaders::for_layer(
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
        let t = |policy| {
            until_more(
                Rule::from_parts(policy, config),
                &spent,
                Duration::from_secs(60),
            )
        };
        assert_eq!(t(PolicyKind::Gcra), Some(6));
        assert_eq!(t(PolicyKind::FixedWindow), Some(60));
        assert_eq!(t(PolicyKind::SlidingWindowCounter), Some(61));
    }

    /// `RuledDecision` of a limiter with `rules`, each answering its
    /// decision in turn.
    fn several(decision: Decision, rules: &str, answers: &[Decision]) -> RuledDecision<'static> {
        let rules: crate::RuleSet = rules.parse().unwrap();
        let mut each = crate::RuleAnswers::default();
        for (rule, decision) in rules.iter().zip(answers) {
            each.push(crate::RuleAnswer {
                rule: *rule,
                decision: *decision,
            });
        }
        let strictest = rules.strictest();
        RuledDecision {
            each,
            ..ruled(decision, strictest.policy(), strictest.config())
        }
    }

    #[test]
    fn several_rules_give_one_member_each_named_by_position() {
        let ruled = several(
            Decision::admit(9),
            "gcra:10/1s,fixed-window:10000/1d",
            &[Decision::admit(9), Decision::admit(9_999)],
        );
        let headers = RateLimitHeaders::for_layer(&ruled, "api", None, true);
        assert_eq!(
            headers.policy,
            r#""api-1";q=10;w=1, "api-2";q=10000;w=86400"#
        );
        assert_eq!(headers.ratelimit, r#""api-1";r=9;t=0, "api-2";r=9999;t=0"#);
        assert_eq!(headers.retry_after, None);
        // The legacy headers: the rule with the fewest left.
        assert_eq!((headers.limit, headers.remaining), (10, 9));
        assert_eq!(headers.reset, Some(0));

        // A tier's name is numbered the same way, and every member has the
        // unit.
        let tiered = RuledDecision {
            tier: Some("pro"),
            ..ruled
        };
        let headers = RateLimitHeaders::for_layer(&tiered, "api", Some("requests"), false);
        assert_eq!(
            headers.policy,
            r#""pro-1";q=10;qu="requests";w=1, "pro-2";q=10000;qu="requests";w=86400"#
        );
    }

    #[test]
    fn each_rule_says_its_own_wait_and_the_legacy_headers_the_refusing_rule() {
        let second = Duration::from_secs(1).as_nanos() as u64;
        // The daily quota refuses for an hour; the burst rule would admit.
        let quota = Decision::reject(0, 3_600 * second);
        let ruled = several(
            quota.by_rule(1),
            "gcra:10/1s,fixed-window:10000/1d",
            &[Decision::admit(5), quota],
        );
        let headers = RateLimitHeaders::for_layer(&ruled, "api", None, true);
        assert_eq!(headers.ratelimit, r#""api-1";r=5;t=0, "api-2";r=0;t=3600"#);
        assert_eq!(headers.retry_after, Some(3_600));
        assert_eq!((headers.limit, headers.remaining), (10_000, 0));
        assert_eq!(headers.reset, Some(3_600));

        // An admission that spent the quota's last: each rule's `t` as one
        // rule's would be, and the legacy headers describe the quota.
        let ruled = several(
            Decision::admit(0),
            "gcra:10/1s,fixed-window:10000/1d",
            &[Decision::admit(9), Decision::admit(0)],
        );
        let headers = RateLimitHeaders::for_layer(&ruled, "api", None, true);
        assert_eq!(headers.ratelimit, r#""api-1";r=9;t=0, "api-2";r=0;t=86400"#);
        assert_eq!((headers.limit, headers.remaining), (10_000, 0));
        assert_eq!(headers.reset, Some(86_400));

        // A cost above the burst's limit: no wait admits it, so that rule
        // has no `t` and there is no `Retry-After`.
        let never = Decision::reject(3, NEVER);
        let ruled = several(
            never,
            "gcra:10/1s,fixed-window:10000/1d",
            &[never, Decision::admit(9_999)],
        );
        let headers = RateLimitHeaders::for_layer(&ruled, "api", None, true);
        assert_eq!(headers.ratelimit, r#""api-1";r=3, "api-2";r=9999;t=0"#);
        assert_eq!(headers.retry_after, None);
        assert_eq!((headers.limit, headers.reset), (10, None));
    }
}
