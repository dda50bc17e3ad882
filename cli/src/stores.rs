//! What `floodgate proxy` and `floodgate rls` share of their stores: the
//! async Redis limiter that `--backend`, `--lease` and `--lease-term`
//! give, and the `--state` file's start and stop (the path checked before
//! anything is served, the save read, the clock going on from it, the last
//! save at the stop).

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use floodgate::state::{self, LoadError, Saved, Saver};
use floodgate::QuantaClock;

#[cfg(feature = "redis")]
use crate::args::Span;

/// What a refusal of a `--state` file saved under other rules adds: the
/// ways on.
pub const OTHER_RULES_HINT: &str = "give the rules it was saved under, --state-carry-over to \
                                    carry its clients over, or remove it to start afresh";

/// The options `--lease` and `--lease-term` give a Redis limiter: leases
/// of the term given (1 s without it), or none.
#[cfg(feature = "redis")]
pub fn redis_options(lease: bool, lease_term: Option<&Span>) -> floodgate::redis::RedisOptions {
    let leasing = lease.then(|| {
        floodgate::redis::Leasing::new(
            lease_term.map_or(floodgate::redis::DEFAULT_LEASE_TERM, Span::duration),
        )
    });
    floodgate::redis::RedisOptions::new().leasing(leasing)
}

/// An async Redis limiter of `rules` at `url` (`redis://…` or
/// `redis-cluster://…`), with `options`. It connects on first use.
///
/// # Errors
///
/// The library's refusal of the URL, the options or the rules, as it says
/// it.
#[cfg(feature = "redis")]
pub async fn open_redis(
    url: &str,
    rules: &floodgate::RuleSet,
    options: floodgate::redis::RedisOptions,
) -> Result<floodgate::redis::AsyncRedisLimiter, floodgate::redis::RedisConfigError> {
    use floodgate::redis::AsyncRedisLimiter;
    match rules.rules() {
        [rule] => AsyncRedisLimiter::new(url, rule.policy(), rule.config(), options).await,
        _ => AsyncRedisLimiter::with_rules(url, rules, options).await,
    }
}

/// Says on standard error, for `command`, when the Redis at `url` does not
/// answer yet: it need not be up (the limiter reconnects by itself, and
/// until then refuses), but an operator learns it at once rather than at
/// the first refusal.
#[cfg(feature = "redis")]
pub async fn warn_if_unreachable(
    redis: &floodgate::redis::AsyncRedisLimiter,
    url: &str,
    command: &str,
) {
    if let Err(error) = redis.try_peek_at("floodgate-probe", 0).await {
        eprintln!(
            "floodgate {command}: warning: Redis at {url} does not answer yet ({error}); \
             requests are rejected until it does"
        );
    }
}

/// Where the limits are held, as a banner says it: `memory`, the URL, or
/// the URL and the leases' term.
pub fn held(backend: Option<&str>, lease: bool, lease_term: Option<&str>) -> String {
    match (backend, lease) {
        (None, _) => "memory".to_owned(),
        (Some(url), false) => url.to_owned(),
        (Some(url), true) => format!(
            "{url}, spent from leases of term {}",
            lease_term.unwrap_or("1s")
        ),
    }
}

/// Refuses a `--state-every` of zero, which would save without a pause.
///
/// # Errors
///
/// `--state-every: ` and why.
pub fn check_state_every(every: Option<&crate::args::Span>) -> Result<(), String> {
    if every.is_some_and(|every| every.nanos == 0) {
        return Err("--state-every: expected a duration longer than 0".to_owned());
    }
    Ok(())
}

/// Checks that `--state`'s `path` can be written now, so that a path that
/// cannot is found before anything is served, not at the stop with the
/// state lost.
///
/// # Errors
///
/// `--state: ` and why.
pub fn check_state_path(path: &Path) -> Result<(), String> {
    state::check_writable(path).map_err(|error| format!("--state: {error}"))
}

/// The `--state` file at `path` read, if there is one: a first start
/// (no file yet) has none.
///
/// # Errors
///
/// A file that is there but cannot be read whole.
pub fn saved_state(path: &Path) -> Result<Option<Saved>, LoadError> {
    match Saved::read(path) {
        Ok(saved) => Ok(Some(saved)),
        Err(error) if error.is_missing() => Ok(None),
        Err(error) => Err(error),
    }
}

/// The in-memory limiters' clock: going on from a loaded state's ticks,
/// with the time the command was down counted as passed.
pub fn clock(saved: Option<&Saved>) -> QuantaClock {
    match saved {
        Some(saved) => QuantaClock::starting_at(saved.resume_at(SystemTime::now())),
        None => QuantaClock::new(),
    }
}

/// `n` clients, in words: `1 client`, `2 clients`.
pub fn clients(n: usize) -> String {
    if n == 1 {
        "1 client".to_owned()
    } else {
        format!("{n} clients")
    }
}

/// The stop's save (`Saver::stop`: a few attempts, each failure logged),
/// said on standard error for `command`; whether it was made.
pub async fn save_at_stop(saver: Arc<Saver>, command: &str) -> bool {
    let path = saver.path().display().to_string();
    match tokio::task::spawn_blocking(move || saver.stop()).await {
        Ok(Ok(summary)) => {
            eprintln!(
                "floodgate {command}: saved {} to {path}",
                clients(summary.clients)
            );
            true
        }
        Ok(Err(error)) => {
            eprintln!("floodgate {command}: the state was not saved: {error}");
            false
        }
        Err(error) => {
            eprintln!("floodgate {command}: the state was not saved: the save stopped: {error}");
            false
        }
    }
}
