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
//! the quota rule admits 60 times as many per 60 windows, so it refuses
//! rarely and each check pays for both rules' steps.

use std::time::Duration;

use floodgate::policy::{Compound, Gcra, Pair, Policy, TokenBucket};
use floodgate::{Config, Limiter, PolicyKind, QuantaClock, Rule, RuleSet};

use super::{take_turns, Keys, Runner, Subject};

/// How many windows the quota rule spans.
const QUOTA_WINDOWS: u64 = 60;

/// The rows, in the order printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Setup {
    /// The burst rule alone.
    One,
    /// With a `token-bucket` quota: two one-word rules, one 16-byte CAS.
    Pair,
    /// With a `fixed-window` quota: the snapshot design.
    FixedWindow,
    /// With a `sliding-window` quota: the snapshot design, which copies
    /// the log on each admission.
    SlidingWindow,
    /// Two limiters, the burst then a `token-bucket` quota, one after the
    /// other.
    TwoLimiters,
}

impl Setup {
    const ALL: [Setup; 5] = [
        Setup::One,
        Setup::Pair,
        Setup::FixedWindow,
        Setup::SlidingWindow,
        Setup::TwoLimiters,
    ];

    pub(super) fn name(self) -> &'static str {
        match self {
            Setup::One => "gcra alone",
            Setup::Pair => "gcra + token-bucket",
            Setup::FixedWindow => "gcra + fixed-window",
            Setup::SlidingWindow => "gcra + sliding-window",
            Setup::TwoLimiters => "two limiters in turn",
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
}

/// The burst rule and a quota of `policy` 60 times its size.
fn rules(config: Config, quota: PolicyKind) -> RuleSet {
    let limit = (config.limit() * QUOTA_WINDOWS).min(match quota {
        PolicyKind::SlidingWindow => floodgate::MAX_LOG_LIMIT,
        _ => floodgate::MAX_LIMIT,
    });
    let burst = Rule::new(PolicyKind::Gcra, config).expect("the bench's quota");
    let quota = Config::per_ticks(limit, config.window() * QUOTA_WINDOWS)
        .and_then(|config| Rule::new(quota, config))
        .expect("a valid quota");
    RuleSet::new([burst, quota]).expect("two rules")
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

fn build(setup: Setup, config: Config) -> Box<dyn Runner> {
    let made = |quota| rules(config, quota);
    match setup {
        Setup::One => Box::new(Limiter::<u64, Gcra>::new(
            Gcra::new(config).expect("the bench's quota"),
        )),
        Setup::Pair => Box::new(Limiter::<u64, Pair>::new(
            Pair::from_rules(&made(PolicyKind::TokenBucket)).expect("two one-word rules"),
        )),
        Setup::FixedWindow => Box::new(Limiter::<u64, Compound>::new(
            Compound::from_rules(&made(PolicyKind::FixedWindow)).expect("valid rules"),
        )),
        Setup::SlidingWindow => Box::new(Limiter::<u64, Compound>::new(
            Compound::from_rules(&made(PolicyKind::SlidingWindow)).expect("valid rules"),
        )),
        Setup::TwoLimiters => {
            let quota = made(PolicyKind::TokenBucket)[1].config();
            Box::new(TwoLimiters {
                burst: Limiter::new(Gcra::new(config).expect("the bench's quota")),
                quota: Limiter::new(TokenBucket::new(quota).expect("a valid quota")),
            })
        }
    }
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
            });
        }
        let mine = &mut rows[first..];
        let one: Vec<(usize, f64)> = mine
            .iter()
            .filter(|row| row.setup == Setup::One)
            .map(|row| (row.threads, row.ops_per_sec))
            .collect();
        for row in mine.iter_mut() {
            let alone = one
                .iter()
                .find(|&&(threads, _)| threads == row.threads)
                .map_or(f64::NAN, |&(_, rate)| rate);
            row.vs_one = alone / row.ops_per_sec;
        }
    }
    rows
}

/// The rows as a table, and the targets: two one-word rules cost at most
/// 1.5 times one rule's check on a known client, and less than two
/// limiters called in turn.
pub(super) fn table(rows: &[RuleRow]) -> String {
    let mut out = String::from(
        "\nseveral rules on one client (burst gcra, quota 60x the burst over 60 windows)\n",
    );
    out.push_str(&format!(
        "{:<8} {:>7}  {:<22} {:>10} {:>9}\n",
        "keys", "threads", "rules", "ns/check", "vs alone"
    ));
    for row in rows {
        out.push_str(&format!(
            "{:<8} {:>7}  {:<22} {:>10.1} {:>8.2}x\n",
            row.keys.name(),
            row.threads,
            row.setup.name(),
            1e9 * row.threads as f64 / row.ops_per_sec,
            row.vs_one,
        ));
    }
    out.push_str("targets (two one-word rules):\n");
    for row in rows.iter().filter(|row| row.setup == Setup::Pair) {
        let two = rows
            .iter()
            .find(|other| {
                other.setup == Setup::TwoLimiters
                    && other.keys == row.keys
                    && other.threads == row.threads
            })
            .map_or(f64::NAN, |other| other.ops_per_sec);
        let verdict = |met: bool| if met { "met" } else { "MISSED" };
        out.push_str(&format!(
            "  {} {} thread(s): {:.2}x one rule's time (target <= 1.5x: {}), {:.2}x two \
             limiters' (target < 1x: {})\n",
            row.keys.name(),
            row.threads,
            row.vs_one,
            verdict(row.vs_one <= 1.5),
            two / row.ops_per_sec,
            verdict(row.ops_per_sec > two),
        ));
    }
    out
}
