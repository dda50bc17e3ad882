//! `--state FILE`: every in-memory limit's clients in one file across
//! restarts, in the format that keeps a registry's tiers (`floodgate::state`):
//! one group a limit, named by its id, with its rules. The file is the
//! library's: written beside its path and renamed over it, whole or
//! refused at a load.
//!
//! At a load, a group whose limit is no longer configured, or whose rules
//! changed, refuses the file (naming the limit, both rules and the file),
//! unless `--state-carry-over`: then such a limit starts afresh and the
//! others keep their clients.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use floodgate::state::{ClientsRefused, Group, Saved};
use floodgate::{Clock, Config as LimitConfig, Decision, PolicyKind, RateLimiter, RuleSet, Tick};

use super::decide::Limits;

/// The kind of store the file says it holds: the tiers' (named groups of
/// rules), whose format this is.
const KIND: &str = "tiers";

/// The limits in use, as the library saves and loads a limiter: a group
/// per in-memory limit. It decides nothing itself (a check is refused,
/// nothing is remaining): it is only saved and loaded.
pub struct LimitSet<C> {
    limits: Arc<ArcSwap<Limits>>,
    clock: C,
    /// At a load: the file's groups, which it takes whole.
    loading: Vec<(String, RuleSet)>,
    /// The limits a save's groups were read from, so that its clients are
    /// read from the same ones, whatever a reload swaps in between (a save
    /// reads the groups, then the clients; saves never overlap).
    pinned: Mutex<Option<Arc<Limits>>>,
}

impl<C: Clock> LimitSet<C> {
    /// The set to save: whatever `limits` holds at each save.
    pub fn new(limits: Arc<ArcSwap<Limits>>, clock: C) -> Self {
        Self {
            limits,
            clock,
            loading: Vec::new(),
            pinned: Mutex::new(None),
        }
    }

    fn pinned(&self) -> std::sync::MutexGuard<'_, Option<Arc<Limits>>> {
        // Only a save's own state: a save that panicked left nothing to
        // repair.
        self.pinned.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a load did.
#[derive(Debug, PartialEq, Eq)]
pub struct Loaded {
    /// The clients put into the limits.
    pub clients: usize,
    /// The limits of the file that start afresh (`--state-carry-over`):
    /// rules changed since the save, or no longer configured.
    pub afresh: Vec<String>,
}

/// Puts the clients `saved` (read from `path`) holds into `limits`'
/// in-memory limiters, which hold none yet, on `clock` (the one they were
/// built on).
///
/// # Errors
///
/// A group whose limit is not configured or has other rules, unless
/// `carry_over`; what the library refuses of the file, as it says it.
pub fn load<C: Clock + Clone + 'static>(
    saved: &Saved,
    path: &Path,
    limits: &Arc<ArcSwap<Limits>>,
    clock: &C,
    carry_over: bool,
) -> Result<Loaded, String> {
    let path = path.display();
    let current = limits.load();
    let mut afresh = Vec::new();
    for (id, rules) in saved.tiers() {
        // A save with no limit in memory keeps one empty unnamed group.
        if id.is_empty() {
            continue;
        }
        let problem = match current.limiter(id) {
            None => format!(
                "it holds clients of limit {id}, which the configuration no longer has \
                 (or holds in Redis)"
            ),
            Some(limiter) if limiter.rules() != *rules => format!(
                "limit {id} was saved under the rules {rules}, not {}",
                limiter.rules()
            ),
            Some(_) => continue,
        };
        if !carry_over {
            return Err(format!(
                "cannot load {path}: {problem}; give the rules it was saved under, \
                 --state-carry-over to start such limits afresh and keep the others' clients, \
                 or remove it to start afresh"
            ));
        }
        afresh.push(id.to_owned());
    }
    let set = LimitSet {
        limits: Arc::clone(limits),
        clock: clock.clone(),
        loading: saved
            .tiers()
            .map(|(id, rules)| (id.to_owned(), rules.clone()))
            .collect(),
        pinned: Mutex::new(None),
    };
    // Every group's rules are its own (`loading`): the library's checks
    // pass, and `load_clients` below puts each group where it belongs.
    let clients = saved.load_into(&set).map_err(|error| error.to_string())?;
    Ok(Loaded { clients, afresh })
}

/// The one group a save with no limit in memory writes (the format holds
/// at least one), whose rules no limit is compared with.
fn placeholder() -> (String, RuleSet) {
    let rules = LimitConfig::per_ticks(1, 1)
        .and_then(|config| floodgate::Rule::new(PolicyKind::FixedWindow, config))
        .map(RuleSet::from)
        .expect("one a tick is a fixed window's limit");
    (String::new(), rules)
}

impl<C: Clock> RateLimiter<str> for LimitSet<C> {
    fn check_at(&self, _: &str, _: u64) -> Decision {
        Decision::never_admitted(0)
    }

    fn check_n_at(&self, _: &str, _: u64, _: u64) -> Decision {
        Decision::never_admitted(0)
    }

    fn remaining_at(&self, _: &str, _: u64) -> u64 {
        0
    }

    fn peek_at(&self, _: &str, _: u64) -> Option<u64> {
        None
    }

    fn forget(&self, _: &str) -> bool {
        false
    }

    fn now(&self) -> u64 {
        self.clock.now()
    }

    fn policy(&self) -> PolicyKind {
        placeholder().1.rules()[0].policy()
    }

    fn config(&self) -> LimitConfig {
        placeholder().1.rules()[0].config()
    }

    fn tracked_clients(&self) -> usize {
        self.limits
            .load()
            .in_memory()
            .map(|(_, limiter)| limiter.tracked_clients())
            .sum()
    }

    fn saved_by(&self) -> Option<(&'static str, Tick)> {
        Some((KIND, self.clock.tick()))
    }

    fn saved_groups(&self) -> Vec<(String, RuleSet)> {
        if !self.loading.is_empty() {
            return self.loading.clone();
        }
        let limits = self.limits.load_full();
        let mut groups: Vec<(String, RuleSet)> = limits
            .in_memory()
            .map(|(id, limiter)| (id.to_owned(), limiter.rules()))
            .collect();
        groups.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        if groups.is_empty() {
            groups.push(placeholder());
        }
        *self.pinned() = Some(limits);
        groups
    }

    fn save_clients(&self, visit: &mut dyn FnMut(&str, &str, &[u64])) {
        let limits = self
            .pinned()
            .take()
            .unwrap_or_else(|| self.limits.load_full());
        for (id, limiter) in limits.in_memory() {
            limiter.save_clients(&mut |_, key, words| visit(id, key, words));
        }
    }

    fn load_clients(&self, groups: Vec<Group<'_, String>>) -> Result<usize, ClientsRefused> {
        let limits = self.limits.load();
        let mut loaded = 0;
        for group in groups {
            // A limit no longer configured, or under other rules, starts
            // afresh (`load` has refused them without --state-carry-over).
            let Some(limiter) = limits
                .limiter(&group.name)
                .filter(|limiter| limiter.rules() == group.rules)
            else {
                continue;
            };
            loaded += limiter.load_clients(vec![Group {
                name: String::new(),
                rules: group.rules,
                clients: group.clients,
            }])?;
        }
        Ok(loaded)
    }
}
