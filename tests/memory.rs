//! What a tracked client costs: the heap bytes per client of each policy
//! (and per unit of limit for the sliding log), measured with a counting
//! allocator over 100,000 clients, against the figures the README gives.
//! `cargo test --test memory -- --nocapture` prints the table.
//!
//! The file has one test, so nothing else in the process allocates while it
//! measures.

use floodgate::policy::{
    Compound, FixedWindow, Gcra, LeakyBucket, Pair, Policy, SlidingWindow, SlidingWindowCounter,
    TokenBucket, WideWindowPair, WindowPair,
};
use floodgate::{Config, Limiter, ManualClock, RuleSet};

#[path = "support/live_bytes.rs"]
mod live_bytes;

#[global_allocator]
static ALLOCATOR: live_bytes::Counting = live_bytes::Counting;

const CLIENTS: u64 = 100_000;

/// Heap bytes per client of a limiter applying `policy` to `CLIENTS` clients
/// with `u64` keys, one check each: the map's share and the client's state.
fn bytes_per_client<P: Policy>(policy: P) -> f64 {
    let before = live_bytes::live_bytes();
    let limiter: Limiter<u64, P, _> = Limiter::with_clock(policy, ManualClock::new(0)).unwrap();
    for client in 0..CLIENTS {
        assert!(limiter.check_at(&client, client).allowed());
    }
    let bytes = live_bytes::live_bytes() - before;
    drop(limiter);
    bytes as f64 / CLIENTS as f64
}

/// The README's figures ("Bounded memory", bytes per tracked client). The
/// map's share depends a little on where its capacity stands at 100,000
/// entries (the measurements are within 0.1 byte of them), so each is held to
/// within half a machine word: a change of one word (8 bytes) per client,
/// up or down, fails.
const PER_CLIENT: [(&str, f64); 9] = [
    ("token-bucket", 31.5),
    ("gcra", 31.5),
    ("leaky-bucket", 31.5),
    ("fixed-window", 63.0),
    ("sliding-window-counter", 63.0),
    // Two rules in one 16-byte word, a 32-byte slot; the wide pair keeps
    // the origin too, in a 48-byte slot, twice one drip rule's.
    ("gcra + token-bucket", 42.0),
    ("gcra + fixed-window", 42.0),
    ("gcra + fixed-window, wide", 63.0),
    // Any other set: a 32-byte slot (the frame's control word) and the
    // frame, its rules' five words.
    ("gcra + fixed-window + sliding-window-counter", 82.0),
];

/// The sliding log: a fixed part, plus this many bytes per unit of limit.
/// (The slot holds the log's two hints, where its entries stand and where
/// its window began, beside the ring's pointer.)
const SLIDING_FIXED: f64 = 105.0;
const SLIDING_PER_UNIT: f64 = 16.0;

/// How far a measurement may be from the README's figure: half a word.
const TOLERANCE: f64 = 4.0;

#[test]
fn bytes_per_tracked_client_are_what_the_readme_says() {
    let config = |limit| Config::per_ticks(limit, 1_000_000).unwrap();
    let rules = |quota: &str| -> RuleSet {
        format!("gcra:100/1000000ticks,{quota}:6000/60000000ticks")
            .parse()
            .unwrap()
    };
    let measured = [
        (
            "token-bucket",
            bytes_per_client(TokenBucket::new(config(100)).unwrap()),
        ),
        ("gcra", bytes_per_client(Gcra::new(config(100)).unwrap())),
        (
            "leaky-bucket",
            bytes_per_client(LeakyBucket::new(config(100)).unwrap()),
        ),
        (
            "fixed-window",
            bytes_per_client(FixedWindow::new(config(100)).unwrap()),
        ),
        (
            "sliding-window-counter",
            bytes_per_client(SlidingWindowCounter::new(config(100)).unwrap()),
        ),
        (
            "gcra + token-bucket",
            bytes_per_client(Pair::from_rules(&rules("token-bucket")).unwrap()),
        ),
        (
            "gcra + fixed-window",
            bytes_per_client(WindowPair::from_rules(&rules("fixed-window")).unwrap()),
        ),
        (
            "gcra + fixed-window, wide",
            bytes_per_client(WideWindowPair::from_rules(&rules("fixed-window")).unwrap()),
        ),
        (
            "gcra + fixed-window + sliding-window-counter",
            bytes_per_client(
                Compound::from_rules(&rules(
                    "fixed-window:6000/60000000ticks,sliding-window-counter",
                ))
                .unwrap(),
            ),
        ),
    ];
    for ((name, bytes), (readme_name, readme)) in measured.iter().zip(PER_CLIENT) {
        assert_eq!(*name, readme_name);
        eprintln!("{name:>24}: {bytes:6.1} bytes per client (README: {readme})");
        assert!(
            (bytes - readme).abs() < TOLERANCE,
            "{name}: {bytes:.1} bytes per client, the README says {readme}"
        );
    }
    for limit in [1, 10, 100] {
        let bytes = bytes_per_client(SlidingWindow::new(config(limit)).unwrap());
        let readme = SLIDING_FIXED + SLIDING_PER_UNIT * limit as f64;
        eprintln!(
            "{:>24}: {bytes:6.1} bytes per client at L = {limit} (README: {readme})",
            "sliding-window"
        );
        assert!(
            (bytes - readme).abs() < TOLERANCE,
            "sliding-window at L = {limit}: {bytes:.1} bytes per client, the README says {readme}"
        );
    }
}
