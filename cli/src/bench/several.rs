//! The several-rules rows of `floodgate bench`: one client under a burst
//! rule and a quota at once (the contract's "Several limits on one
//! client"), beside the burst rule alone and beside what users write
//! without it, two limiters called one after the other (the second only
//! when the first admits, which also spends the first rule on requests the
//! second refuses). Each cell (keys, threads) takes turns with the others
//! as the main rows do, so every ratio compares measurements that shared
//! the machine's noise.
//!
//! The burst rule is the bench's `gcra` quota (`--limit` per `--window`);
//! each quota rule admits 60 times as many per 60 windows, so it refuses
//! rarely and each check pays for every rule's step. Each row runs the
//! design the factory picks for its rules.

use std::time::Duration;

use floodgate::policy::{Compound, Gcra, Pair, Policy, SlidingWindow, TokenBucket, WindowPair};
use floodgate::{Config, Limiter, PolicyKind, QuantaClock, Rule, RuleSet};

use super::{take_turns, Keys, Runner, Subject};
use crate::heap::Meter;

/// How many windows the quota rule spans.
const QUOTA_WINDOWS: u64 = 60;

/// The rows, in the order printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Setup {
    /// The burst rule alone.
    One,
    /// With a `token-bucket` quota: two one-word rules, one 16-byte CAS.
    Pair,
    /// With a `fixed-window` quota (the README's pair): one 16-byte CAS,
    /// no origin.
    FixedWindow,
    /// The same rules in the general design (a frame of words swapped by
    /// one CAS), which took them before they had a word of their own: the
    /// figure the word is measured against.
    FixedWindowFrame,
    /// With a `sliding-window-counter` quota: one 16-byte CAS, no origin.
    Counter,
    /// With a `sliding-window` quota: the general design, its log's view
    /// over a shared ring.
    SlidingWindow,
    /// The `sliding-window` quota alone: what a log among the rules is
    /// measured against.
    LogAlone,
    /// With a `fixed-window` and a `sliding-window-counter` quota: the
    /// general design.
    Three,
    /// Two limiters, the burst then a `token-bucket` quota, one after the
    /// other.
    TwoLimiters,
}

impl Setup {
    const ALL: [Setup; 9] = [
        Setup::One,
        Setup::Pair,
        Setup::FixedWindow,
        Setup::FixedWindowFrame,
        Setup::Counter,
        Setup::SlidingWindow,
        Setup::LogAlone,
        Setup::Three,
        Setup::TwoLimiters,
    ];

    pub(super) fn name(self) -> &'static str {
        match self {
            Setup::One => "gcra alone",
            Setup::Pair => "gcra + token-bucket",
            Setup::FixedWindow => "gcra + fixed-window",
            Setup::FixedWindowFrame => "  the same, in a frame",
            Setup::Counter => "gcra + sl-window-counter",
            Setup::SlidingWindow => "gcra + sliding-window",
            Setup::LogAlone => "  the log alone",
            Setup::Three => "gcra + fixed + counter",
            Setup::TwoLimiters => "two limiters in turn",
        }
    }

    /// The design the row runs, for `--json`.
    fn design(self) -> &'static str {
        match self {
            Setup::One | Setup::LogAlone => "one rule",
            Setup::Pair => "pair",
            Setup::FixedWindow | Setup::Counter => "window pair",
            Setup::FixedWindowFrame | Setup::SlidingWindow | Setup::Three => "frame",
            Setup::TwoLimiters => "two limiters",
        }
    }

    /// The quota rules beside the burst rule.
    fn quotas(self) -> &'static [PolicyKind] {
        match self {
            Setup::One => &[],
            Setup::Pair | Setup::TwoLimiters => &[PolicyKind::TokenBucket],
            Setup::FixedWindow | Setup::FixedWindowFrame => &[PolicyKind::FixedWindow],
            Setup::Counter => &[PolicyKind::SlidingWindowCounter],
            Setup::SlidingWindow | Setup::LogAlone => &[PolicyKind::SlidingWindow],
            Setup::Three => &[PolicyKind::FixedWindow, PolicyKind::SlidingWindowCounter],
        }
    }

    /// The most this row's check may cost, in times one rule's (the
    /// targets); none for the rows it is measured against.
    fn target(self) -> Option<f64> {
        match self {
            Setup::One | Setup::TwoLimiters | Setup::FixedWindowFrame | Setup::LogAlone => None,
            Setup::Pair | Setup::FixedWindow | Setup::Counter => Some(1.5),
            Setup::SlidingWindow => Some(3.0),
            Setup::Three => Some(2.0),
        }
    }
}

/// One measured cell.
pub(super) struct RuleRow {
    pub(super) setup: Setup,
    pub(super) keys: Keys,
    pub(super) threads: usize,
    /// Median checks per second over the rounds, all threads.
    pub(super) ops_per_sec: f64,
    /// This row's time per check over the same cell's `gcra alone`.
    pub(super) vs_one: f64,
    /// This row's time per check over the same cell's two limiters in turn.
    pub(super) vs_two: f64,
}

/// The burst rule and a quota of each of `quotas`, 60 times its size.
fn rules(config: Config, quotas: &[PolicyKind]) -> RuleSet {
    let burst = Rule::new(PolicyKind::Gcra, config).expect("the bench's quota");
    let quotas = quotas.iter().map(|&quota| {
        let limit = (config.limit() * QUOTA_WINDOWS).min(match quota {
            PolicyKind::SlidingWindow => floodgate::MAX_LOG_LIMIT,
            _ => floodgate::MAX_LIMIT,
        });
        Config::per_ticks(limit, config.window() * QUOTA_WINDOWS)
            .and_then(|config| Rule::new(quota, config))
            .expect("a valid quota")
    });
    RuleSet::new(std::iter::once(burst).chain(quotas)).expect("valid rules")
}

/// The rule set's text (for `--json`), or the one rule's.
pub(super) fn rules_text(setup: Setup, config: Config) -> String {
    let rules = rules(config, setup.quotas());
    match setup {
        Setup::LogAlone => rules[1].to_string(),
        _ => rules.to_string(),
    }
}

/// Two limiters in turn, as an application would call them.
struct TwoLimiters {
    burst: Limiter<u64, Gcra, QuantaClock>,
    quota: Limiter<u64, TokenBucket, QuantaClock>,
}

impl Subject for TwoLimiters {
    #[inline]
    fn check(&self, key: u64, _now: u64) -> bool {
        self.burst.check(&key).allowed() && self.quota.check(&key).allowed()
    }
}

/// The limiter of `setup`, in the design the factory picks for its rules.
fn build(setup: Setup, config: Config) -> Box<dyn Runner> {
    let made = rules(config, setup.quotas());
    match setup {
        Setup::One => Box::new(Limiter::<u64, Gcra>::new(
            Gcra::new(config).expect("the bench's quota"),
        )),
        Setup::Pair => Box::new(Limiter::<u64, Pair>::new(
            Pair::from_rules(&made).expect("two one-word rules"),
        )),
        Setup::FixedWindow | Setup::Counter => Box::new(Limiter::<u64, WindowPair>::new(
            WindowPair::from_rules(&made).expect("a drip rule and a window rule that fit"),
        )),
        Setup::SlidingWindow | Setup::Three | Setup::FixedWindowFrame => {
            Box::new(Limiter::<u64, Compound>::new(
                Compound::from_rules(&made).expect("valid rules"),
            ))
        }
        Setup::LogAlone => Box::new(Limiter::<u64, SlidingWindow>::new(
            SlidingWindow::new(made[1].config()).expect("a valid quota"),
        )),
        Setup::TwoLimiters => Box::new(TwoLimiters {
            burst: Limiter::new(Gcra::new(config).expect("the bench's quota")),
            quota: Limiter::new(TokenBucket::new(made[1].config()).expect("a valid quota")),
        }),
    }
}

/// How many clients the memory row holds.
pub(super) const MEMORY_CLIENTS: u64 = 100_000;

/// Heap bytes per client of each setup once it holds
/// [`MEMORY_CLIENTS`] clients (the two limiters count both tables). Not the
/// log's: its ring of `L` entries a client (`docs/bounds.md`) would take
/// gigabytes at this many clients.
pub(super) fn bytes_per_client(config: Config) -> Vec<(Setup, f64)> {
    Setup::ALL
        .iter()
        .filter(|&&setup| {
            !matches!(
                setup,
                Setup::SlidingWindow | Setup::LogAlone | Setup::FixedWindowFrame
            )
        })
        .map(|&setup| {
            let meter = Meter::start();
            let runner = build(setup, config);
            runner.prefill(MEMORY_CLIENTS);
            let bytes = meter.live_bytes();
            drop(runner);
            (setup, bytes as f64 / MEMORY_CLIENTS as f64)
        })
        .collect()
}

/// Measures every setup on the hot key and the uniform stream, on each of
/// `thread_counts`.
pub(super) fn rows(
    config: Config,
    thread_counts: &[usize],
    rounds: usize,
    slice: Duration,
    capacities: &mut Vec<f64>,
    cores: usize,
) -> Vec<RuleRow> {
    let mut rows = Vec::new();
    for keys in [Keys::Hot, Keys::Uniform] {
        let engines: Vec<Box<dyn Runner>> = Setup::ALL
            .iter()
            .map(|&setup| {
                let runner = build(setup, config);
                runner.prefill(keys.clients());
                runner
            })
            .collect();
        let sequences: Vec<_> = thread_counts
            .iter()
            .map(|&threads| keys.sequences(threads))
            .collect();
        let mut turns = take_turns(
            thread_counts.len(),
            engines.len(),
            rounds,
            capacities,
            cores,
            |t, e| engines[e].run(&sequences[t], thread_counts[t], slice),
        );
        let first = rows.len();
        for (cell, &(t, e)) in turns.cells.iter().enumerate() {
            let rates = &mut turns.samples[cell];
            rates.sort_by(f64::total_cmp);
            rows.push(RuleRow {
                setup: Setup::ALL[e],
                keys,
                threads: thread_counts[t],
                ops_per_sec: rates[rates.len() / 2],
                vs_one: 0.0,
                vs_two: 0.0,
            });
        }
        let mine = &mut rows[first..];
        let rate = |setup: Setup, threads: usize| {
            mine.iter()
                .find(|row| row.setup == setup && row.threads == threads)
                .map_or(f64::NAN, |row| row.ops_per_sec)
        };
        let ratios: Vec<(f64, f64)> = mine
            .iter()
            .map(|row| {
                (
                    rate(Setup::One, row.threads) / row.ops_per_sec,
                    rate(Setup::TwoLimiters, row.threads) / row.ops_per_sec,
                )
            })
            .collect();
        for (row, (vs_one, vs_two)) in mine.iter_mut().zip(ratios) {
            row.vs_one = vs_one;
            row.vs_two = vs_two;
        }
    }
    rows
}

/// The rows as a table, the memory row, and the targets: the pairs at most
/// 1.5 times one rule's check, a log among the rules at most 3 times (and
/// at most 3 times the log alone's), three rules at most twice; on the uniform stream every several-rules row at
/// most the two limiters in turn; the README's pair at most twice one
/// rule's bytes per client.
pub(super) fn table(rows: &[RuleRow], memory: &[(Setup, f64)]) -> String {
    let mut out = String::from(
        "\nseveral rules on one client (burst gcra, each quota 60x the burst over 60 windows)\n",
    );
    out.push_str(&format!(
        "{:<8} {:>7}  {:<24} {:>10} {:>9} {:>9}\n",
        "keys", "threads", "rules", "ns/check", "vs alone", "vs two"
    ));
    for row in rows {
        out.push_str(&format!(
            "{:<8} {:>7}  {:<24} {:>10.1} {:>8.2}x {:>8.2}x\n",
            row.keys.name(),
            row.threads,
            row.setup.name(),
            1e9 * row.threads as f64 / row.ops_per_sec,
            row.vs_one,
            row.vs_two,
        ));
    }
    out.push_str(&format!(
        "heap bytes per client at {MEMORY_CLIENTS} clients:"
    ));
    for (setup, bytes) in memory {
        out.push_str(&format!(" {} {bytes:.1};", setup.name()));
    }
    out.push('\n');
    let verdict = |met: bool| if met { "met" } else { "MISSED" };
    out.push_str("targets (time per check, one run):\n");
    for row in rows {
        let Some(target) = row.setup.target() else {
            continue;
        };
        out.push_str(&format!(
            "  {} {} thread(s) {}: {:.2}x one rule's (<= {target}x: {})",
            row.keys.name(),
            row.threads,
            row.setup.name(),
            row.vs_one,
            verdict(row.vs_one <= target),
        ));
        if row.keys == Keys::Uniform {
            out.push_str(&format!(
                ", {:.2}x two limiters' (<= 1x: {})",
                row.vs_two,
                verdict(row.vs_two <= 1.0),
            ));
        }
        if row.setup == Setup::SlidingWindow {
            let alone = rows
                .iter()
                .find(|other| {
                    other.setup == Setup::LogAlone
                        && other.keys == row.keys
                        && other.threads == row.threads
                })
                .map_or(f64::NAN, |other| other.ops_per_sec);
            let vs_log = alone / row.ops_per_sec;
            out.push_str(&format!(
                ", {vs_log:.2}x the log alone's (<= 3x: {})",
                verdict(vs_log <= 3.0),
            ));
        }
        out.push('\n');
    }
    let bytes = |setup: Setup| {
        memory
            .iter()
            .find(|(s, _)| *s == setup)
            .map_or(f64::NAN, |(_, b)| *b)
    };
    let ratio = bytes(Setup::FixedWindow) / bytes(Setup::One);
    out.push_str(&format!(
        "  memory, gcra + fixed-window: {ratio:.2}x one rule's bytes per client (<= 2x: {})\n",
        verdict(ratio <= 2.0),
    ));
    out
}

/// The rows for `--json`: one object a cell, with its rules' text.
pub(super) fn json<'r>(
    rows: &'r [RuleRow],
    memory: &'r [(Setup, f64)],
    config: Config,
) -> impl Iterator<Item = serde_json::Value> + 'r {
    rows.iter().map(move |row| {
        let bytes = memory
            .iter()
            .find(|(s, _)| *s == row.setup)
            .map(|(_, b)| *b);
        serde_json::json!({
            "policy": "gcra",
            "engine": "lockfree",
            "keys": row.keys.name(),
            "threads": row.threads,
            "setup": row.setup.name().trim(),
            "design": row.setup.design(),
            "rules": rules_text(row.setup, config),
            "ops_per_sec": row.ops_per_sec.round(),
            "ns_per_op": 1e9 * row.threads as f64 / row.ops_per_sec,
            "vs_one_rule": row.vs_one,
            "vs_two_limiters": row.vs_two,
            "bytes_per_client": bytes,
            "memory_clients": MEMORY_CLIENTS,
            "limit": config.limit(),
            "window_ns": config.window(),
            "clock": "quanta",
        })
    })
}
