//! Keeping a limiter's state across a restart (the contract's "Keeping
//! state across a restart"): a daily quota that a deploy resets is no
//! quota.
//!
//! With the feature `state`, a save (`save`) writes every client's state
//! under every rule to a file, each client read in one atomic step while
//! checks go on (no lock on their path), with the rules, the clock's tick,
//! and the time of the save by the limiter's clock and by the wall clock. A load (`load`, or
//! `Saved::read` and `Saved::load_into`) refuses the whole file or
//! gives every client exactly the state it had, with the time between the
//! save and the load counted as time passed: the loaded limiter's clock
//! goes on from the saved one's ticks, plus the wall-clock time between
//! the two (`Saved::resume_at`; a wall clock that went back counts as
//! no time). `in-flight` rules load holding nothing.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use floodgate::{build_rules, state, Bounds, Engine, ManualClock, RateLimiter};
//!
//! let path = std::env::temp_dir().join(format!("floodgate-doc-{}.state", std::process::id()));
//! let clock = ManualClock::new(0);
//! let rules = "gcra:10/1s,fixed-window:1000/1d".parse()?;
//! let limiter = build_rules::<str, _>(&rules, Engine::LockFree, clock.clone(), Bounds::new())?;
//! for _ in 0..10 {
//!     limiter.check("rahul");
//! }
//! state::save(&*limiter, &path)?;
//!
//! // The next process: the same rules, its clock going on from the save's.
//! let saved = state::Saved::read(&path)?;
//! let clock = ManualClock::new(saved.saved_at());
//! let limiter = build_rules::<str, _>(saved.rules(), Engine::LockFree, clock, Bounds::new())?;
//! saved.load_into(&*limiter)?;
//! assert!(!limiter.check("rahul").allowed()); // the burst is still spent
//! assert_eq!(limiter.remaining("priya"), 10);
//! # std::fs::remove_file(&path)?;
//! # Ok(())
//! # }
//! ```
//!
//! The file is either whole or refused: a format version, the rules, the
//! records, and a CRC-32 over all of it; it is written to a file beside
//! the target and renamed over it, so a crash during a save leaves the
//! last good file. A file saved under other rules, by the other engine,
//! or with another tick is refused. What is not saved: the shared state of
//! [`Overflow::Shared`](crate::Overflow::Shared), the decision counters
//! and the offenders' summary.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

#[cfg(feature = "state")]
mod file;
#[cfg(feature = "state")]
mod saver;

#[cfg(feature = "state")]
#[cfg_attr(docsrs, doc(cfg(feature = "state")))]
pub use file::{
    check_writable, load, load_or_new, resealed, save, save_with, to_bytes, LoadError, SaveError,
    Saved, Summary, FORMAT_VERSION,
};
#[cfg(feature = "state")]
#[cfg_attr(docsrs, doc(cfg(feature = "state")))]
pub use saver::Saver;

/// Why a limiter refused saved clients
/// ([`RateLimiter::load_clients`](crate::RateLimiter)).
#[doc(hidden)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientsRefused {
    /// The limiter keeps no saves.
    Unsupported,
    /// It holds clients already.
    NotEmpty,
    /// Client `i` of its group's words are no state of the group's rules.
    Client(usize),
    /// Client `i` of its group's key is an earlier client's.
    Duplicate(usize),
    /// A group this limiter does not have (a tier since removed).
    UnknownGroup(String),
}

/// A save's clients of one group, as a load hands them to a limiter: a
/// limiter's one unnamed group, or one tier of a registry, with the rules
/// they were saved under.
#[doc(hidden)]
pub struct Group<'a, K> {
    /// `""` for a limiter; the tier's name for a registry's.
    pub name: String,
    /// The rules the clients were saved under.
    pub rules: crate::RuleSet,
    /// Each client's key and words.
    pub clients: Vec<(K, &'a [u64])>,
}

impl<'a, K> Group<'a, K> {
    /// The clients of a limiter's one unnamed group.
    pub(crate) fn only(groups: Vec<Group<'a, K>>) -> Result<Vec<(K, &'a [u64])>, ClientsRefused> {
        match <[Group<'a, K>; 1]>::try_from(groups) {
            Ok([group]) if group.name.is_empty() => Ok(group.clients),
            Ok([group]) => Err(ClientsRefused::UnknownGroup(group.name)),
            Err(_) => Err(ClientsRefused::Unsupported),
        }
    }
}

/// The saved clients a limiter with room for `cap` keeps: all of them
/// within it; past it, the `cap` with the least left by `remaining` (a
/// client left out starts afresh, with its whole limit, so those that spent
/// the most are the ones a load must keep), ties by the order saved, and in
/// that order.
pub(crate) fn keep_at_cap<T>(
    clients: Vec<T>,
    cap: Option<usize>,
    remaining: impl Fn(&T) -> u64,
) -> Vec<T> {
    let Some(cap) = cap.filter(|&cap| cap < clients.len()) else {
        return clients;
    };
    let mut order: Vec<(u64, usize)> = clients
        .iter()
        .enumerate()
        .map(|(i, client)| (remaining(client), i))
        .collect();
    order.sort_unstable();
    let mut kept = vec![false; clients.len()];
    for &(_, i) in &order[..cap] {
        kept[i] = true;
    }
    clients
        .into_iter()
        .zip(kept)
        .filter_map(|(client, kept)| kept.then_some(client))
        .collect()
}

/// `n` clients, in words: `1 client`, `2 clients`.
#[cfg(feature = "state")]
pub(crate) fn clients(n: usize) -> String {
    if n == 1 {
        "1 client".to_owned()
    } else {
        format!("{n} clients")
    }
}

/// A registry of tiers' kind of store, as a save names it.
pub(crate) const TIERS: &str = "tiers";

/// Rules as a file keeps them, one text for each set of windows in ticks
/// of the tick: a window as a duration (the tick's length times its
/// ticks) where that text reads back as the same ticks, else as ticks
/// (`gcra:2/13ticks`: a drip rule given in ticks whose interval a
/// duration would have to state exactly). So a file names its rules as
/// they were written, and two rule sets of the same windows compare equal
/// whether they were given in ticks or as durations.
pub(crate) struct RulesText<'a>(pub(crate) &'a crate::RuleSet, pub(crate) crate::Tick);

impl fmt::Display for RulesText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, rule) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let config = rule.config();
            if !rule.policy().has_window() {
                write!(f, "{}:{}", rule.policy(), config.limit())?;
                continue;
            }
            let text = format!(
                "{}:{}/{}",
                rule.policy(),
                config.limit(),
                Span(self.1.times(config.window()))
            );
            let same = text
                .parse::<crate::Rule>()
                .ok()
                .and_then(|read| read.in_ticks_of(self.1).ok())
                .is_some_and(|read| read.config().window() == config.window());
            if same {
                f.write_str(&text)?;
            } else {
                write!(
                    f,
                    "{}:{}/{}ticks",
                    rule.policy(),
                    config.limit(),
                    config.window()
                )?;
            }
        }
        Ok(())
    }
}

/// A duration as rules write it.
struct Span(std::time::Duration);

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::rule::write_duration(f, self.0)
    }
}

/// The position of the first key that an earlier one equals, if any: a
/// file that names a client twice is refused whole.
pub(crate) fn first_duplicate<'k, K: std::hash::Hash + Eq + 'k>(
    keys: impl ExactSizeIterator<Item = &'k K>,
) -> Option<usize> {
    let mut seen = std::collections::HashSet::with_capacity_and_hasher(
        keys.len(),
        foldhash::fast::RandomState::default(),
    );
    keys.enumerate()
        .find_map(|(i, key)| (!seen.insert(key)).then_some(i))
}

/// A key a save can keep: its bytes, and the key back from them.
pub trait StateKey: ToOwned {
    /// The key as bytes.
    fn key_bytes(&self) -> Cow<'_, [u8]>;

    /// The key whose bytes are `bytes`; `None` if they are no such key's.
    fn from_key_bytes(bytes: &[u8]) -> Option<Self::Owned>;
}

impl StateKey for str {
    fn key_bytes(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.as_bytes())
    }

    fn from_key_bytes(bytes: &[u8]) -> Option<String> {
        String::from_utf8(bytes.to_vec()).ok()
    }
}

impl StateKey for String {
    fn key_bytes(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.as_bytes())
    }

    fn from_key_bytes(bytes: &[u8]) -> Option<String> {
        str::from_key_bytes(bytes)
    }
}

impl StateKey for [u8] {
    fn key_bytes(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self)
    }

    fn from_key_bytes(bytes: &[u8]) -> Option<Vec<u8>> {
        Some(bytes.to_vec())
    }
}

impl StateKey for Vec<u8> {
    fn key_bytes(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self)
    }

    fn from_key_bytes(bytes: &[u8]) -> Option<Vec<u8>> {
        Some(bytes.to_vec())
    }
}

/// Integers as their little-endian bytes.
macro_rules! integer_keys {
    ($($int:ty),*) => {$(
        impl StateKey for $int {
            fn key_bytes(&self) -> Cow<'_, [u8]> {
                Cow::Owned(self.to_le_bytes().to_vec())
            }

            fn from_key_bytes(bytes: &[u8]) -> Option<$int> {
                bytes.try_into().ok().map(<$int>::from_le_bytes)
            }
        }
    )*};
}

integer_keys!(u16, u32, u64, u128, i32, i64);

impl StateKey for Ipv4Addr {
    fn key_bytes(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.octets().to_vec())
    }

    fn from_key_bytes(bytes: &[u8]) -> Option<Ipv4Addr> {
        <[u8; 4]>::try_from(bytes).ok().map(Ipv4Addr::from)
    }
}

impl StateKey for Ipv6Addr {
    fn key_bytes(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.octets().to_vec())
    }

    fn from_key_bytes(bytes: &[u8]) -> Option<Ipv6Addr> {
        <[u8; 16]>::try_from(bytes).ok().map(Ipv6Addr::from)
    }
}

/// Four bytes for a v4 address, sixteen for a v6 one.
impl StateKey for IpAddr {
    fn key_bytes(&self) -> Cow<'_, [u8]> {
        match self {
            IpAddr::V4(ip) => Cow::Owned(ip.octets().to_vec()),
            IpAddr::V6(ip) => Cow::Owned(ip.octets().to_vec()),
        }
    }

    fn from_key_bytes(bytes: &[u8]) -> Option<IpAddr> {
        match bytes.len() {
            4 => Ipv4Addr::from_key_bytes(bytes).map(IpAddr::V4),
            16 => Ipv6Addr::from_key_bytes(bytes).map(IpAddr::V6),
            _ => None,
        }
    }
}
