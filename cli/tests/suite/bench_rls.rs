//! `floodgate bench --rls` end to end, at its quickest: every subject
//! answered as it should be (the bench checks each answer, and stops at
//! the first wrong one), the rows' shape and order, never their timings.

use std::process::Command;

use serde_json::Value;

#[test]
fn rls_rows_give_each_subject_its_calls_and_percentiles_in_order() {
    let output = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(["bench", "--rls", "--quick", "--connections", "2", "--json"])
        .output()
        .expect("the floodgate binary runs");
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rows: Vec<Value> = serde_json::from_slice(&output.stdout).expect("JSON rows");
    let subjects = ["proxy 429", "rls refused", "rls admitted", "h2 floor"];
    assert_eq!(rows.len(), subjects.len(), "{rows:#?}");
    for (row, subject) in rows.iter().zip(subjects) {
        assert_eq!(row["connections"], 2, "{row}");
        assert_eq!(row["subject"], subject, "{row}");
        assert!(
            row["calls"].as_u64().is_some_and(|calls| calls > 0),
            "{row}"
        );
        let latencies: Vec<f64> = ["p50_us", "p99_us", "p99_99_us", "max_us"]
            .iter()
            .map(|field| {
                row[field]
                    .as_f64()
                    .unwrap_or_else(|| panic!("{field}: {row}"))
            })
            .collect();
        assert!(latencies.is_sorted(), "percentiles out of order: {row}");
        // Each server ran for its calls: the kernel counted its time.
        let cpu = row["server_cpu_us_per_call"].as_f64().expect("a figure");
        assert!(cpu > 0.0, "{row}");
    }
}
