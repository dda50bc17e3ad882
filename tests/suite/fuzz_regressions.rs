//! Every input kept in `fuzz/regressions/<target>/`, replayed through the
//! same check the fuzz target runs, so a failure the fuzzer once found stays
//! fixed without a fuzzer.
//!
//! The checks live in `fuzz/src/lib.rs`, which depends only on `floodgate`
//! and `std`; it is compiled here as a module, so these tests need neither
//! cargo-fuzz nor a nightly flag.

#[path = "../../fuzz/src/lib.rs"]
mod checks;

#[path = "../../fuzz/src/leases.rs"]
mod lease_checks;

use std::fs;
use std::path::Path;

use proptest::prelude::*;

/// Runs `check` on every file of `fuzz/regressions/<target>/` and returns how
/// many there were.
fn replay(target: &str, check: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let Ok(entries) = fs::read_dir(&dir) else {
        return 0;
    };
    let mut count = 0;
    for entry in entries {
        let path = entry.expect("a readable directory entry").path();
        let data = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // A panic names the input: the check's message names the call.
        eprintln!("replaying {}", path.display());
        check(&data);
        count += 1;
    }
    count
}

#[test]
fn differential_regressions_still_agree() {
    let count = replay("differential", checks::check_differential);
    assert!(count > 0, "fuzz/regressions/differential holds no input");
}

#[test]
fn time_backwards_regressions_still_hold_the_rule() {
    let count = replay("time_backwards", checks::check_time_backwards);
    assert!(count > 0, "fuzz/regressions/time_backwards holds no input");
}

#[test]
fn load_regressions_still_load_whole_or_not_at_all() {
    let count = replay("load", checks::check_load);
    assert!(count > 0, "fuzz/regressions/load holds no input");
}

#[test]
fn leases_regressions_still_agree_with_the_model() {
    let count = replay("leases", lease_checks::check_leases);
    assert!(count > 0, "fuzz/regressions/leases holds no input");
}

/// The decoder the targets share turns every byte string into a valid
/// input, the empty one included, and stays within its bounds.
#[test]
fn every_byte_string_decodes() {
    for data in [&[][..], &[0xff; 64][..], &[0x07, 0x03, 0x05][..]] {
        for backwards in [false, true] {
            let input = checks::Input::decode(data, backwards);
            assert!(input.limit >= 1 && input.window >= 1, "{input:?}");
            assert!(input.calls.len() <= checks::MAX_CALLS, "{input:?}");
            if input.policy == floodgate::PolicyKind::SlidingWindow {
                assert!(input.limit <= checks::MAX_SLIDING_LIMIT, "{input:?}");
            }
        }
    }
    // Time never decreases unless asked to.
    let forward = checks::Input::decode(&[0xab; 200], false);
    assert!(forward.calls.windows(2).all(|w| w[0].now <= w[1].now));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The time-backwards check on random inputs, so that `cargo test`
    /// runs it without a fuzzer: every byte string is an input, with its
    /// calls going back and forth, sweeps and reloads among them.
    /// The loader's check on random inputs, half of them saves changed
    /// in place with their checksum made to hold again.
    #[test]
    fn load_holds_on_random_inputs(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        checks::check_load(&data);
    }

    /// The lease slots against their model on random inputs.
    #[test]
    fn leases_hold_on_random_inputs(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        lease_checks::check_leases(&data);
    }

    #[test]
    fn time_backwards_holds_on_random_inputs(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        checks::check_time_backwards(&data);
    }
}

/// A first byte of 128 or more gives each `allow` a cost, and only when
/// time never decreases; the kept weighted inputs reach every policy and the
/// contract's edges: 0, 1, `L`, `L + 1` and `u64::MAX`.
#[test]
fn weighted_inputs_decode_with_costs_at_the_edges() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/differential");
    let mut policies = Vec::new();
    for k in 0..6 {
        let data = fs::read(dir.join(format!("weighted-costs-at-the-edges-{k}"))).unwrap();
        let input = checks::Input::decode(&data, false);
        let costs: Vec<u64> = input.calls.iter().map(|c| c.cost).collect();
        for edge in [0, 1, input.limit, input.limit + 1, u64::MAX] {
            assert!(costs.contains(&edge), "{edge} in {input:?}");
        }
        let remaining: Vec<_> = input
            .calls
            .iter()
            .filter(|c| c.verb == checks::Verb::Remaining)
            .collect();
        assert!(!remaining.is_empty() && remaining.iter().all(|c| c.cost == 1));
        let backwards = checks::Input::decode(&data, true);
        assert!(backwards.calls.iter().all(|c| c.cost == 1), "{backwards:?}");
        policies.push(input.policy);
    }
    policies.sort_by_key(|p| p.name());
    policies.dedup();
    assert_eq!(policies.len(), 6, "{policies:?}");
}
