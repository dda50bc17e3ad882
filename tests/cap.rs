//! The cap under a flood: ten million distinct one-shot client ids through
//! a limiter capped at 100,000, once per overflow rule. The map never holds
//! more than the cap, the heap stays at what 100,000 clients need (twice
//! that at most while a move drops evicted slots), the
//! clients that keep calling are answered exactly as by an unbounded limiter,
//! and each flood client gets its rule's answer whenever there is no room.
//!
//! A counting global allocator keeps the live heap size; the file has one
//! test, so nothing else in the process allocates meanwhile.

use floodgate::policy::{Gcra, Policy};
use floodgate::{Bounds, Config, Decision, Limiter, ManualClock, Overflow};

#[path = "support/live_bytes.rs"]
mod live_bytes;

#[global_allocator]
static ALLOCATOR: live_bytes::Counting = live_bytes::Counting;

const CAP: usize = 100_000;
const FLOOD: u64 = 10_000_000;
/// Clients that keep calling throughout.
const REGULARS: u64 = 1_000;
/// The flood's ids start past the regulars'.
const FIRST_STRANGER: u64 = 1 << 32;
/// `gcra`, 10 per 10,000 ticks: one every 1,000 ticks.
const LIMIT: u64 = 10;
const WINDOW: u64 = 10_000;
/// The clock moves one tick per this many flood arrivals, so a one-shot
/// client (idle 1,000 ticks after its request) stays busy for 100,000
/// arrivals: the map fills with clients nobody can evict, and the rule
/// decides, until the oldest become idle and sweeps make room again.
const ARRIVALS_PER_TICK: u64 = 100;
/// A regular calls every this many ticks: more often than one per interval,
/// so its schedule is always ahead of the clock and it is never idle.
const REGULAR_EVERY: u64 = 500;
/// How often (in flood arrivals) the map's count and the heap are sampled.
const COUNT_EVERY: u64 = 20_000;

/// A new client's first answer.
const FRESH: Decision = Decision::admitted(LIMIT - 1);

/// What one flood client must be answered when it found no room.
fn expected_overflow(rule: Overflow, shared: Option<Decision>) -> Option<Decision> {
    match rule {
        Overflow::Reject => Some(Decision::rejected(0, WINDOW)),
        Overflow::Admit => Some(FRESH),
        Overflow::Shared => shared,
    }
}

#[test]
fn ten_million_one_shot_clients_never_pass_the_cap() {
    let policy = || Gcra::new(Config::per_ticks(LIMIT, WINDOW).unwrap()).unwrap();
    for rule in Overflow::ALL {
        // Before the limiter is built: its table is allocated up front.
        let baseline = live_bytes::live_bytes();
        let clock = ManualClock::new(0);
        let bounds = Bounds::new()
            .evict_idle()
            .max_clients(CAP)
            .on_overflow(rule);
        let limiter: Limiter<u64, Gcra, _> =
            Limiter::with_bounds(policy(), clock.clone(), bounds).unwrap();
        // The regulars' answers, from a limiter that tracks only them and
        // forgets nothing.
        let reference: Limiter<u64, Gcra, _> =
            Limiter::with_clock(policy(), clock.clone()).unwrap();
        // The shared overflow state, replayed on its own: every flood client
        // that found no room, in order, as one client.
        let shared: Limiter<u64, Gcra, _> = Limiter::with_clock(policy(), clock.clone()).unwrap();

        let mut peak_clients = 0;
        let mut peak_bytes = 0;
        // The heap at the samples that found the map full, least of all.
        let mut least_bytes_full = isize::MAX;
        let mut overflowed = 0u64;
        let mut regular_calls = 0u64;
        for regular in 0..REGULARS {
            assert_eq!(
                limiter.check_at(&regular, 0),
                reference.check_at(&regular, 0)
            );
        }
        for arrival in 0..FLOOD {
            let now = arrival / ARRIVALS_PER_TICK;
            if arrival % ARRIVALS_PER_TICK == 0 && now.is_multiple_of(REGULAR_EVERY) && now > 0 {
                for regular in 0..REGULARS {
                    let got = limiter.check_at(&regular, now);
                    assert_eq!(
                        got,
                        reference.check_at(&regular, now),
                        "{rule}: {regular} at {now}"
                    );
                    regular_calls += 1;
                }
            }
            let stranger = FIRST_STRANGER + arrival;
            let got = limiter.check_at(&stranger, now);
            if limiter.tracks(&stranger) {
                assert_eq!(got, FRESH, "{rule}: arrival {arrival}");
            } else {
                let shared_answer = (rule == Overflow::Shared).then(|| shared.check_at(&0, now));
                assert_eq!(
                    Some(got),
                    expected_overflow(rule, shared_answer),
                    "{rule}: arrival {arrival}"
                );
                overflowed += 1;
            }
            if arrival % COUNT_EVERY == 0 {
                // The map as its inserts and removals count it,
                // not the places reserved under the cap (which cannot pass
                // it by construction); between two calls on one thread the
                // two agree.
                let clients = limiter.stored_clients();
                assert!(
                    clients <= CAP,
                    "{rule}: {clients} clients at arrival {arrival}"
                );
                assert_eq!(limiter.tracked_clients(), clients, "{rule}");
                peak_clients = peak_clients.max(clients);
                let bytes = live_bytes::live_bytes() - baseline;
                peak_bytes = peak_bytes.max(bytes);
                if clients == CAP {
                    least_bytes_full = least_bytes_full.min(bytes);
                }
            }
        }
        // The rule really was exercised, and room was really made.
        assert!(
            overflowed > 100_000,
            "{rule}: only {overflowed} found no room"
        );
        assert!(overflowed < FLOOD / 2, "{rule}: {overflowed} found no room");
        assert_eq!(peak_clients, CAP, "{rule}");
        assert!(regular_calls > 10_000_000 / ARRIVALS_PER_TICK);
        // Bytes: the table with the map full (its spare slots included;
        // the table is sized for the cap once), and the reference's 1,000
        // regulars. docs/bounds.md says about 32 per tracked client; held
        // to within half a word, so a change of one word per client fails.
        // A move at the same size, which drops evicted slots, holds a
        // second table while its steps run (and while the arrivals before
        // it prepare it): the peak is at most the two.
        let per_client = least_bytes_full as f64 / CAP as f64;
        assert!(
            (per_client - 32.0).abs() < 4.0,
            "{rule}: {least_bytes_full} bytes with the map full ({per_client:.1} per client; docs/bounds.md says about 32)"
        );
        let peak_per_client = peak_bytes as f64 / CAP as f64;
        assert!(
            peak_per_client < 2.0 * 32.0 + 4.0,
            "{rule}: {peak_bytes} bytes at the peak ({peak_per_client:.1} per client: more than two tables)"
        );
        eprintln!("{rule}: {overflowed} of {FLOOD} found no room; peak {peak_clients} clients, {least_bytes_full} bytes full ({per_client:.1} per client), {peak_bytes} at the peak ({peak_per_client:.1})");
    }
}
