//! `floodgate bench --tail` end to end, at a size that runs in a moment:
//! the rows' shape and their order, never their timings.

use std::process::Command;

use serde_json::Value;

/// `floodgate bench ARGS`: its standard output, after a clean exit.
fn bench(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .arg("bench")
        .args(args)
        .output()
        .expect("the floodgate binary runs");
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("the rows are UTF-8")
}

const SMALL: [&str; 5] = ["--tail", "--tail-clients", "2000", "--tail-known", "100"];

#[test]
fn tail_rows_give_every_percentile_in_order_for_known_and_new_clients() {
    let rows: Vec<Value> =
        serde_json::from_str(&bench(&[&SMALL[..], &["--json"]].concat())).expect("JSON rows");
    // Alone, --tail runs no throughput row: two scenarios (growth to 2,000,
    // a cap of 2,000 flooded by 8,000), three engines, known and new.
    assert_eq!(rows.len(), 2 * 3 * 2, "{rows:#?}");
    for row in &rows {
        assert_eq!(row["keys"], "tail", "{row}");
        assert_eq!(row["policy"], "gcra", "{row}");
        assert_eq!(row["known_clients"], 100, "{row}");
        let latencies: Vec<u64> = ["p50_ns", "p99_ns", "p99_9_ns", "p99_99_ns", "max_ns"]
            .iter()
            .map(|field| {
                row[field]
                    .as_u64()
                    .unwrap_or_else(|| panic!("{field}: {row}"))
            })
            .collect();
        assert!(latencies.is_sorted(), "percentiles out of order: {row}");
        assert!(row["mean_ns"].as_f64().is_some(), "{row}");
        let admitted = row["admitted"].as_f64().expect("a share");
        assert!((0.0..=1.0).contains(&admitted), "{row}");
        // Each new client is checked once; the known ones at least once,
        // as the new ones wait for their first call.
        let calls = row["calls"].as_u64().expect("a count");
        match row["client"].as_str() {
            Some("new") => assert_eq!(row["calls"], row["new_clients"], "{row}"),
            Some("known") => assert!(calls >= 1, "{row}"),
            _ => panic!("client is known or new: {row}"),
        }
        let tracked = row["tracked"].as_u64().expect("a count");
        match (row["scenario"].as_str(), row["engine"].as_str()) {
            (Some("growth"), _) => {
                assert_eq!(row["new_clients"], 2_000, "{row}");
                assert!(row["max_clients"].is_null(), "{row}");
                assert_eq!(tracked, 2_100, "{row}");
            }
            (Some("capped"), engine) => {
                assert_eq!(row["new_clients"], 8_000, "{row}");
                assert_eq!(row["max_clients"], 2_000, "{row}");
                if engine == Some("governor") {
                    // No cap: it keeps every id of the flood.
                    assert_eq!(tracked, 8_100, "{row}");
                } else {
                    assert!(tracked <= 2_000, "the cap was passed: {row}");
                }
            }
            _ => panic!("scenario is growth or capped: {row}"),
        }
    }
    for engine in ["lockfree", "mutex", "governor"] {
        assert_eq!(
            rows.iter().filter(|row| row["engine"] == engine).count(),
            4,
            "{engine}"
        );
    }
}

#[test]
fn the_tail_table_has_a_row_per_engine_and_client_and_a_legend() {
    let table = bench(&SMALL);
    for label in ["growth, 2 k new", "cap 2 k, 8 k new"] {
        for engine in ["lockfree", "mutex", "governor"] {
            for client in ["known", "new"] {
                let wanted = [label, engine, client];
                assert_eq!(
                    table
                        .lines()
                        .filter(|line| {
                            let mut words =
                                line.split("  ").map(str::trim).filter(|w| !w.is_empty());
                            wanted.iter().all(|want| words.next() == Some(want))
                        })
                        .count(),
                    1,
                    "{label} {engine} {client} in\n{table}"
                );
            }
        }
    }
    assert!(table.contains("p99.99"), "{table}");
    assert!(table.contains("Each call timed alone"), "{table}");
}
