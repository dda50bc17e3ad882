//! Errors in the words the user wrote: a window as written (`1us`), a zero
//! window as `ZeroWindow`, a fraction with the whole-unit spelling to use
//! instead; and a misspelt tier that is loud once per name.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use floodgate::tiers::{ByTable, Tiers};
use floodgate::{Config, ConfigError, ManualClock, RateLimiter, Rule};

fn rule_error(text: &str) -> String {
    text.parse::<Rule>().unwrap_err().to_string()
}

#[test]
fn a_zero_window_is_zero_window_however_it_is_written() {
    assert_eq!(Config::per(5, Duration::ZERO), Err(ConfigError::ZeroWindow));
    assert_eq!(Config::per_ticks(5, 0), Err(ConfigError::ZeroWindow));
    assert_eq!(
        rule_error("gcra:5/0s"),
        "invalid rule \"gcra:5/0s\" at byte 5: the window is zero: a rate needs a window \
         of at least one tick"
    );
}

#[test]
fn a_window_too_short_for_its_limit_is_said_as_written() {
    assert_eq!(
        rule_error("gcra:5000/1us"),
        "invalid rule \"gcra:5000/1us\" at byte 5: window 1us is too short for limit 5000: \
         gcra releases one request every window/limit, at least one tick of the clock, so \
         the window must be at least 5us"
    );
    let error = Config::per(5_000, Duration::from_micros(1))
        .and_then(|config| config.check_for(floodgate::PolicyKind::TokenBucket))
        .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("window 1us is too short for limit 5000"),
        "{error}"
    );
    // Raw ticks stay ticks.
    let error = Config::per_ticks(5_000, 1_000)
        .and_then(|config| config.check_for(floodgate::PolicyKind::Gcra))
        .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("window 1000 ticks is shorter than limit 5000"),
        "{error}"
    );
}

#[test]
fn a_fraction_says_the_whole_units_to_write() {
    assert_eq!(
        rule_error("gcra:5/1.5s"),
        "invalid rule \"gcra:5/1.5s\" at byte 7: the window \"1.5s\" has a fraction: \
         windows are whole units, write 1500ms"
    );
    assert!(rule_error("gcra:5/2.25m").ends_with("write 135s"));
    assert!(rule_error("gcra:5/0.5us").ends_with("write 500ns"));
    // No whole number of nanoseconds: no spelling to offer.
    assert!(rule_error("gcra:5/1.0005ns").ends_with("(ns, us, ms, s, m, h, d)"));
}

/// Counts the `WARN` events it is sent.
struct Warnings(Arc<AtomicUsize>);

impl tracing::Subscriber for Warnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == tracing::Level::WARN {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A closure resolver cannot list its names, so a misspelt tier shows only
/// when it is met: a warning the first time each name is seen, and the
/// counter every time.
#[test]
fn a_misspelt_tier_warns_once_per_name() {
    let warnings = Arc::new(AtomicUsize::new(0));
    let tiers = Tiers::with_clock(
        "free",
        "gcra:10/1s".parse().unwrap(),
        |key: &str| {
            key.split_once(':')
                .map_or("free", |(tier, _)| tier)
                .to_owned()
        },
        ManualClock::new(0),
    )
    .unwrap()
    .with_tier("premium", "gcra:100/1s".parse().unwrap())
    .unwrap();
    tracing::subscriber::with_default(Warnings(Arc::clone(&warnings)), || {
        for key in ["premuim:a", "premuim:b", "premium:c", "premuim:a", "gold:x"] {
            assert!(tiers.check(key).allowed());
        }
        assert_eq!(
            warnings.load(Ordering::Relaxed),
            2,
            "premuim and gold, once each"
        );
        // A flood of invented names stops being logged one by one.
        for n in 0..1_000 {
            tiers.check(&format!("t{n}:x"));
        }
        assert!(warnings.load(Ordering::Relaxed) <= 2 + 64 + 1);
    });
    assert_eq!(tiers.unknown_tier_calls(), 1_004);
}

/// A registry made by `new` names no type: its keys are `String`, so
/// `with_tier` and `checked` compile before anything looks a client up.
#[test]
fn a_table_resolver_is_checked_without_turbofish() {
    let plans = ByTable::new([("acme".to_owned(), "premium")], "free");
    let tiers = Tiers::new("free", "gcra:10/1s".parse().unwrap(), plans)
        .with_tier("premium", "gcra:100/1s".parse().unwrap())
        .unwrap()
        .checked()
        .unwrap();
    assert!(tiers.check("acme").allowed());
}
