//! `floodgate demo`: the job this crate exists for, in a few seconds.
//!
//! A payments API serves 1,000 well-behaved apps, each sending 1 to 20
//! requests a second at random (Poisson) moments, and one buggy app stuck in
//! a retry loop at 5,000 requests a second. Every app is limited to 100
//! requests a second. A simulated minute of that traffic goes through each
//! policy from several worker threads, and the demo prints what the buggy
//! app got through, what share of everyone else's requests got through, how
//! long a check took and how much memory each tracked app costs.
//!
//! # Simulated time, real threads
//!
//! Requests carry simulated times (nanoseconds) and go to the limiter with
//! `check_at`, so a minute takes as long as its checks do. Like the worker
//! pool of a real server, the workers share every app's requests, the buggy
//! app's included: request `i` of each 10 ms slice goes to worker
//! `i mod threads`, and the workers meet at a barrier between slices. So
//! within a slice the workers race, and one app's requests can reach the
//! limiter slightly out of order — as on a real clock, where the contract
//! lets a policy be stricter but never more lenient.
//!
//! # What is measured
//!
//! * Latency: each check is timed with the real (TSC) clock; the median
//!   cost of an empty timing is subtracted. On a machine with fewer cores
//!   than workers, the 99th percentile includes some descheduling.
//! * Memory: a counting allocator records the bytes a fresh limiter
//!   allocates while the 1,001 apps make their first request, divided by
//!   1,001: each app's state, its shared handle and its share of the map's
//!   buckets (which grow in steps, so the share depends on the count).

use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use floodgate::{build, Clock, Config, PolicyKind, QuantaClock};

use floodgate_cli::args::{parse_count, parse_in, parse_policy, Checked};

use crate::heap::allocated_bytes;

/// The apps that behave.
const GOOD_APPS: u64 = 1_000;
/// The buggy app's id (the good ones are `0..GOOD_APPS`).
const BUGGY: u64 = GOOD_APPS;
/// The buggy app's retry rate, requests per second.
const BUGGY_RATE: f64 = 5_000.0;
/// The good apps' rates are drawn uniformly from `1..=MAX_GOOD_RATE` per second.
const MAX_GOOD_RATE: u64 = 20;
/// Every app's limit: 100 requests per second.
const LIMIT: u64 = 100;
const SECOND: u64 = 1_000_000_000;
/// Simulated time between two barriers of the workers.
const SLICE: u64 = 10_000_000;

/// Options of `floodgate demo`.
#[derive(clap::Args)]
pub struct Args {
    /// Worker threads sharing the traffic (like a server's worker pool), 1
    /// to 64.
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = Checked(parse_in::<u32>(1, MAX_THREADS)))]
    threads: u32,

    /// Simulated seconds of traffic, 1 to 3600.
    #[arg(long, value_name = "N", default_value_t = 60,
          value_parser = Checked(parse_in::<u64>(1, MAX_SECONDS)))]
    seconds: u64,

    /// Only these policies (comma-separated names; default: all six).
    #[arg(long, value_name = "NAMES", value_delimiter = ',', value_parser = Checked(parse_policy))]
    policy: Vec<PolicyKind>,

    /// Seed of the simulated traffic.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = Checked(parse_count))]
    seed: u64,
}

/// The most worker threads `--threads` takes.
const MAX_THREADS: u64 = 64;

/// The longest simulated run `--seconds` takes.
const MAX_SECONDS: u64 = 3_600;

/// One request: when it arrives (simulated ns) and which app sends it.
#[derive(Clone, Copy)]
struct Request {
    at: u64,
    app: u64,
}

/// An exponential gap with the given mean, so arrivals form a Poisson
/// process: `-mean · ln u` for `u` uniform in `(0, 1]` (inverting the
/// exponential's distribution function). `f64()` is in `[0, 1)`; flipping
/// it keeps `u` off zero and the logarithm finite.
fn gap(rng: &mut fastrand::Rng, mean_ns: f64) -> u64 {
    (-(1.0 - rng.f64()).ln() * mean_ns) as u64
}

/// A minute (or `seconds`) of traffic, in time order. One seed gives one
/// traffic, so runs are repeatable.
fn traffic(seconds: u64, seed: u64) -> Vec<Request> {
    let end = seconds * SECOND;
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut requests = Vec::new();
    let mut arrivals = |app: u64, rate: f64, rng: &mut fastrand::Rng| {
        let mean = SECOND as f64 / rate;
        let mut at = gap(rng, mean);
        while at < end {
            requests.push(Request { at, app });
            at += gap(rng, mean).max(1);
        }
    };
    for app in 0..GOOD_APPS {
        let rate = rng.u64(1..=MAX_GOOD_RATE);
        arrivals(app, rate as f64, &mut rng);
    }
    arrivals(BUGGY, BUGGY_RATE, &mut rng);
    requests.sort_unstable_by_key(|request| (request.at, request.app));
    requests
}

/// What one worker saw.
#[derive(Default)]
struct Tally {
    good_sent: u64,
    good_admitted: u64,
    buggy_sent: u64,
    buggy_admitted: u64,
    /// Nanoseconds per check, timing overhead removed.
    latencies: Vec<u32>,
    /// Leaky bucket: how long admitted good requests are told to wait.
    good_waits: Vec<u64>,
}

/// One policy's results.
struct Outcome {
    policy: PolicyKind,
    buggy_sent: u64,
    buggy_admitted: u64,
    good_sent: u64,
    good_admitted: u64,
    p50: u32,
    p99: u32,
    /// What timing nothing costs with the clock the checks are timed by:
    /// a check shown as 0 took less than this.
    overhead: u64,
    good_wait_p99: u64,
    bytes_per_app: f64,
    tracked: usize,
}

/// The median cost of timing nothing with the clock the checks are timed by.
fn timing_overhead(clock: &QuantaClock) -> u64 {
    let mut samples: Vec<u64> = (0..10_001)
        .map(|_| {
            let start = clock.now();
            clock.now() - start
        })
        .collect();
    let middle = samples.len() / 2;
    *samples.select_nth_unstable(middle).1
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).copied().unwrap_or(0)
}

/// Bytes a limiter holds once every app has made its first request, per
/// app: the table it starts with included, since a client's state lives in
/// the table's slot and a new client may allocate nothing of its own.
fn bytes_per_app(policy: PolicyKind, config: Config) -> f64 {
    // Allocations, not the net: the epochs may free, on this thread and in
    // the middle of the count, tables that earlier runs outgrew on others.
    let empty = allocated_bytes();
    let limiter = build::<u64>(policy, config).expect("a valid demo quota");
    for app in 0..=BUGGY {
        limiter.check_at(&app, 0);
    }
    let full = allocated_bytes();
    drop(limiter);
    (full - empty) as f64 / (BUGGY + 1) as f64
}

fn simulate(policy: PolicyKind, config: Config, requests: &[Request], threads: usize) -> Outcome {
    let limiter = build::<u64>(policy, config).expect("a valid demo quota");
    let clock = QuantaClock::new();
    let overhead = timing_overhead(&clock);
    // Slice boundaries: indices where each 10 ms slice of requests starts.
    let mut bounds = vec![0];
    let mut next = SLICE;
    for (index, request) in requests.iter().enumerate() {
        while request.at >= next {
            bounds.push(index);
            next += SLICE;
        }
    }
    bounds.push(requests.len());
    let barrier = Barrier::new(threads);
    let tallies: Vec<Tally> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|worker| {
                let (limiter, clock, barrier, bounds) = (&limiter, &clock, &barrier, &bounds);
                scope.spawn(move || {
                    let mut tally = Tally {
                        latencies: Vec::with_capacity(requests.len() / threads + 1),
                        ..Tally::default()
                    };
                    for slice in bounds.windows(2) {
                        let mut index = slice[0] + worker;
                        while index < slice[1] {
                            let request = requests[index];
                            let start = clock.now();
                            let decision = limiter.check_at(&request.app, request.at);
                            let took = (clock.now() - start).saturating_sub(overhead);
                            tally
                                .latencies
                                .push(u32::try_from(took).unwrap_or(u32::MAX));
                            if request.app == BUGGY {
                                tally.buggy_sent += 1;
                                tally.buggy_admitted += u64::from(decision.allowed());
                            } else {
                                tally.good_sent += 1;
                                if decision.allowed() {
                                    tally.good_admitted += 1;
                                    tally.good_waits.push(decision.delay_ticks());
                                }
                            }
                            index += threads;
                        }
                        barrier.wait();
                    }
                    tally
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a demo worker panicked"))
            .collect()
    });
    let mut latencies: Vec<u32> = tallies
        .iter()
        .flat_map(|t| t.latencies.iter().copied())
        .collect();
    latencies.sort_unstable();
    let mut waits: Vec<u64> = tallies
        .iter()
        .flat_map(|t| t.good_waits.iter().copied())
        .collect();
    waits.sort_unstable();
    let wait_p99 = waits
        .get(((waits.len() as f64 - 1.0) * 0.99).round() as usize)
        .copied()
        .unwrap_or(0);
    Outcome {
        policy,
        buggy_sent: tallies.iter().map(|t| t.buggy_sent).sum(),
        buggy_admitted: tallies.iter().map(|t| t.buggy_admitted).sum(),
        good_sent: tallies.iter().map(|t| t.good_sent).sum(),
        good_admitted: tallies.iter().map(|t| t.good_admitted).sum(),
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        overhead,
        good_wait_p99: wait_p99,
        bytes_per_app: bytes_per_app(policy, config),
        tracked: limiter.tracked_clients(),
    }
}

/// `1234567` as `1,234,567`.
fn grouped(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A check's time with the clock's own cost taken off: a check that took
/// no longer than timing nothing is said to take less than that, not 0.
fn latency(ns: u32, overhead: u64) -> String {
    if ns == 0 {
        format!("<{} ns", overhead.max(1))
    } else {
        duration(u64::from(ns))
    }
}

fn duration(ns: u64) -> String {
    match ns {
        0 => "0".to_owned(),
        ns if ns < 10_000 => format!("{ns} ns"),
        ns if ns < 10_000_000 => format!("{} us", ns / 1_000),
        ns => format!("{} ms", ns / 1_000_000),
    }
}

/// Runs `floodgate demo`.
pub fn run(args: Args) -> ExitCode {
    let policies = if args.policy.is_empty() {
        PolicyKind::ALL.to_vec()
    } else {
        args.policy.clone()
    };
    let threads = args.threads as usize;
    let config = Config::per(LIMIT, Duration::from_secs(1)).expect("a valid demo quota");
    let started = Instant::now();
    let requests = traffic(args.seconds, args.seed);
    println!(
        "floodgate demo: a payments API, {} well-behaved apps sending 1-{MAX_GOOD_RATE} requests/s each \
         and one buggy app retrying at {} requests/s;\n\
         every app limited to {LIMIT} requests/s; {} simulated seconds ({} requests) through each \
         policy from {threads} worker threads.\n",
        grouped(GOOD_APPS),
        grouped(BUGGY_RATE as u64),
        args.seconds,
        grouped(requests.len() as u64),
    );
    let outcomes: Vec<Outcome> = policies
        .iter()
        .map(|&policy| simulate(policy, config, &requests, threads))
        .collect();
    print!("{}", report(&outcomes, args.seconds, senders(&requests)));
    println!(
        "\n{} checks in {:.1} s of wall time.",
        grouped(outcomes.iter().map(|o| o.buggy_sent + o.good_sent).sum()),
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}

/// How many distinct apps sent at least one request: the clients every
/// policy should end up tracking (an app drawn at 1 request/s can stay silent
/// through a short run).
fn senders(requests: &[Request]) -> usize {
    requests
        .iter()
        .map(|request| request.app)
        .collect::<std::collections::HashSet<_>>()
        .len()
}

fn report(outcomes: &[Outcome], seconds: u64, senders: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:>21}  {:>19}  {:>15}  {:>10}  {:>12}",
        "", "buggy app", "other 1,000 apps", "check latency", "good apps", "memory"
    );
    let header = format!(
        "{:<24} {:>9} {:>11}  {:>9} {:>9}  {:>7} {:>7}  {:>10}  {:>12}",
        "policy", "admitted", "per second", "sent", "served", "p50", "p99", "wait p99", "bytes/app"
    );
    let _ = writeln!(out, "{header}");
    let _ = writeln!(out, "{}", "-".repeat(header.len()));
    for o in outcomes {
        let _ = writeln!(
            out,
            "{:<24} {:>9} {:>11.1}  {:>9} {:>8.2}%  {:>7} {:>7}  {:>10}  {:>12}",
            o.policy.name(),
            grouped(o.buggy_admitted),
            o.buggy_admitted as f64 / seconds as f64,
            grouped(o.good_sent),
            100.0 * o.good_admitted as f64 / o.good_sent.max(1) as f64,
            latency(o.p50, o.overhead),
            latency(o.p99, o.overhead),
            duration(o.good_wait_p99),
            grouped(o.bytes_per_app.round() as u64),
        );
    }
    let Some(first) = outcomes.first() else {
        return out;
    };
    // The most any policy may admit: a full burst, then the limit per
    // second (token-bucket and gcra start full; the windows reset).
    let cap = LIMIT * seconds + LIMIT;
    let capped = outcomes.iter().all(|o| o.buggy_admitted <= cap);
    let unhurt = outcomes.iter().all(|o| o.good_admitted == o.good_sent);
    let low = outcomes.iter().map(|o| o.buggy_admitted).min().unwrap_or(0);
    let high = outcomes.iter().map(|o| o.buggy_admitted).max().unwrap_or(0);
    let tracked = outcomes.iter().all(|o| o.tracked == senders);
    let _ = writeln!(
        out,
        "\nThe buggy app sent {} requests in {seconds} s; every app is allowed {LIMIT}/s \
         (at most {} in {seconds} s with a full first burst).",
        grouped(first.buggy_sent),
        grouped(cap),
    );
    let _ = writeln!(
        out,
        "leaky-bucket admits what gcra admits but spaces it out: \"wait p99\" is how long \
         it tells a good app's request to wait."
    );
    let _ = writeln!(
        out,
        "\nverdict: {} the buggy app was held to {}-{} of {} requests (~{}/s), and the other \
         apps got {} of their requests through{}",
        if capped && unhurt {
            "OK -"
        } else {
            "PROBLEM -"
        },
        grouped(low),
        grouped(high),
        grouped(first.buggy_sent),
        high / seconds,
        if unhurt {
            "100%".to_owned()
        } else {
            "less than 100%".to_owned()
        },
        if tracked {
            ", under every policy."
        } else {
            " (and some apps were not tracked)."
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A check faster than the clock can time reads as under the clock's
    /// own cost, never as 0.
    #[test]
    fn a_check_below_the_clocks_cost_is_not_zero() {
        assert_eq!(latency(0, 18), "<18 ns");
        assert_eq!(latency(0, 0), "<1 ns");
        assert_eq!(latency(42, 18), "42 ns");
    }

    #[test]
    fn traffic_has_the_advertised_rates() {
        let requests = traffic(10, 7);
        assert!(requests.windows(2).all(|pair| pair[0].at <= pair[1].at));
        let buggy = requests.iter().filter(|r| r.app == BUGGY).count() as f64;
        // Poisson at 5,000/s for 10 s: 50,000 ± 224 (one σ).
        assert!((buggy - 50_000.0).abs() < 2_000.0, "{buggy}");
        let good = requests.len() as f64 - buggy;
        // 1,000 apps at 10.5/s on average: 105,000 over 10 s, give or take
        // the draw of the rates (σ of the total rate ≈ 180/s).
        assert!((good - 105_000.0).abs() < 10_000.0, "{good}");
    }

    #[test]
    fn every_policy_caps_the_flood_and_serves_the_rest() {
        let requests = traffic(3, 11);
        // An app drawn at 1 request/s sends nothing in 3 s with probability
        // e^-3, so a few apps may be absent: the limiter must track exactly
        // the apps that sent.
        let senders = senders(&requests);
        let config = Config::per(LIMIT, Duration::from_secs(1)).unwrap();
        for policy in PolicyKind::ALL {
            let outcome = simulate(policy, config, &requests, 3);
            assert_eq!(outcome.good_admitted, outcome.good_sent, "{policy}");
            assert!(
                outcome.buggy_admitted <= LIMIT * 3 + LIMIT,
                "{policy}: {}",
                outcome.buggy_admitted
            );
            // At least the limit per whole window: a flood never starves.
            assert!(
                outcome.buggy_admitted >= LIMIT * 3 - LIMIT / 2,
                "{policy}: {}",
                outcome.buggy_admitted
            );
            assert_eq!(outcome.tracked, senders, "{policy}");
            assert!(outcome.bytes_per_app > 0.0);
        }
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1_000), "1,000");
        assert_eq!(grouped(1_234_567), "1,234,567");
    }
}
