//! `floodgate replay --save FILE` and `--load FILE` (the contract's
//! "Keeping state across a restart"): a trace replayed in two parts, the
//! first saving and the second loading, answers exactly as the whole trace
//! at once, errors included, on both engines and for every policy, several
//! rules, refunds and `in-flight` rules (with nothing held at the start of
//! the second part); a file that cannot be read whole is exit status 2 and
//! a message, with nothing on standard output.

use super::binary;

use std::path::PathBuf;

use binary::floodgate;

/// A file of this test's own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(std::env::temp_dir().join(format!(
            "floodgate-replay-state-{}-{name}-{n}",
            std::process::id()
        )))
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn args<'a>(rules: &'a [String], engine: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["replay", "--engine", engine, "--detail"];
    for rule in rules {
        args.extend(["--rule", rule.as_str()]);
    }
    args.extend(extra);
    args
}

/// The rule sets: every policy alone, the pairs of one CAS, a log among
/// rules, three rules, and `in-flight` alone and among rate rules.
const RULE_SETS: &[&[&str]] = &[
    &["sliding-window:3/100ms"],
    &["token-bucket:3/90ms"],
    &["fixed-window:3/100ms"],
    &["sliding-window-counter:4/100ms"],
    &["gcra:3/90ms"],
    &["leaky-bucket:3/90ms"],
    &["in-flight:2"],
    &["gcra:2/40ms", "token-bucket:5/100ms"],
    &["gcra:2/40ms", "fixed-window:5/1s"],
    &["token-bucket:2/40ms", "sliding-window-counter:5/300ms"],
    &["gcra:3/60ms", "sliding-window:4/200ms"],
    &[
        "gcra:3/60ms",
        "fixed-window:6/1s",
        "sliding-window-counter:5/300ms",
    ],
    &["sliding-window:3/100ms", "in-flight:2"],
    &["gcra:3/90ms", "in-flight:2"],
];

/// A seeded trace of `lines` calls of three clients, times never falling.
fn trace(seed: u64, lines: usize) -> Vec<String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut now = 0u64;
    (0..lines)
        .map(|_| {
            now += [0, 0, 1, 7, 30][rng.usize(..5)];
            let client = ["a", "b", "c"][rng.usize(..3)];
            match rng.u8(..10) {
                0..=4 => format!("allow {client} {now}"),
                5 => format!("allow {client} {now} {}", rng.u64(0..4)),
                6 => format!("remaining {client} {now}"),
                7 => format!(
                    "refund {client} {now} {} {}",
                    rng.u64(1..3),
                    now.saturating_sub(rng.u64(0..50))
                ),
                _ => format!("release {client} {now} {}", rng.u64(1..3)),
            }
        })
        .collect()
}

/// The whole trace at once, with every unit `in-flight` rules hold at the
/// split released there first (the load holds nothing), those lines'
/// answers left out.
fn whole(rules: &[String], engine: &str, first: &[String], second: &[String]) -> String {
    let last = first
        .iter()
        .filter_map(|line| line.split(' ').nth(2))
        .map(|now| now.parse::<u64>().unwrap())
        .max()
        .unwrap_or(0);
    let releases: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|client| format!("release {client} {last} 1000000"))
        .collect();
    let mut input = first.to_vec();
    input.extend(releases.iter().cloned());
    input.extend(second.iter().cloned());
    let run = floodgate(&args(rules, engine, &[]), &(input.join("\n") + "\n"));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let mut answers: Vec<&str> = run.stdout.lines().collect();
    answers.drain(first.len()..first.len() + releases.len());
    answers.join("\n") + "\n"
}

#[test]
fn two_parts_answer_as_the_whole_trace_on_both_engines() {
    for (n, rules) in RULE_SETS.iter().enumerate() {
        let rules: Vec<String> = rules.iter().map(|r| r.to_string()).collect();
        for engine in ["lockfree", "mutex"] {
            for seed in 0..4u64 {
                let lines = trace(seed * 100 + n as u64, 80);
                let split = [0, 1, 40, 80][seed as usize];
                let (first, second) = lines.split_at(split);
                let file = Scratch::new("parts");
                let one = floodgate(
                    &args(&rules, engine, &["--save", file.path()]),
                    &(first.join("\n") + "\n"),
                );
                assert_eq!(one.code, Some(0), "{}", one.stderr);
                let two = floodgate(
                    &args(&rules, engine, &["--load", file.path()]),
                    &(second.join("\n") + "\n"),
                );
                assert_eq!(two.code, Some(0), "{}", two.stderr);
                let parts = one.stdout + &two.stdout;
                assert_eq!(
                    parts,
                    whole(&rules, engine, first, second),
                    "{rules:?} on {engine}, seed {seed}, split at {split}"
                );
            }
        }
    }
}

/// A client's time in the second part earlier than its last in the first
/// is a malformed line there, as in one run.
#[test]
fn a_time_before_the_first_parts_is_malformed_in_the_second() {
    let file = Scratch::new("backwards");
    let rules = vec!["gcra:3/1s".to_owned()];
    let one = floodgate(
        &args(&rules, "lockfree", &["--save", file.path()]),
        "allow a 500\n",
    );
    assert_eq!(one.code, Some(0), "{}", one.stderr);
    let two = floodgate(
        &args(&rules, "lockfree", &["--load", file.path()]),
        "allow b 10\nallow a 499\n",
    );
    assert_eq!(two.code, Some(2));
    assert!(two.stderr.contains("line 2"), "{}", two.stderr);
}

/// Every file that cannot be read whole: exit status 2, a message naming
/// the file and what is wrong, nothing answered.
#[test]
fn bad_files_are_refused_before_any_answer() {
    let rules = vec!["gcra:3/1s".to_owned()];
    let good = Scratch::new("good");
    let one = floodgate(
        &args(&rules, "lockfree", &["--save", good.path()]),
        "allow a 0\nallow b 0\n",
    );
    assert_eq!(one.code, Some(0), "{}", one.stderr);
    let bytes = std::fs::read(&good.0).unwrap();
    let mut changed = bytes.clone();
    changed[bytes.len() / 2] ^= 1;
    let mut newer = bytes.clone();
    newer[8] = 9;
    let cases: [(&str, Vec<u8>, &str); 5] = [
        ("empty", Vec::new(), "empty"),
        ("truncated", bytes[..bytes.len() - 3].to_vec(), "damaged"),
        ("changed", changed, "damaged"),
        ("newer", newer, "newer floodgate"),
        (
            "other",
            b"{\"not\": \"a state\"}".to_vec(),
            "not a floodgate state file",
        ),
    ];
    for (name, contents, says) in cases {
        let file = Scratch::new(name);
        std::fs::write(&file.0, contents).unwrap();
        let run = floodgate(
            &args(&rules, "lockfree", &["--load", file.path()]),
            "allow a 1\n",
        );
        assert_eq!(run.code, Some(2), "{name}");
        assert_eq!(run.stdout, "", "{name}");
        assert!(
            run.stderr.contains(file.path()) && run.stderr.contains(says),
            "{name}: {}",
            run.stderr
        );
    }
    let missing = Scratch::new("missing");
    let run = floodgate(
        &args(&rules, "lockfree", &["--load", missing.path()]),
        "allow a 1\n",
    );
    assert_eq!((run.code, run.stdout.as_str()), (Some(2), ""));
    assert!(run.stderr.contains("no such file"), "{}", run.stderr);
    let other = vec!["gcra:4/1s".to_owned()];
    let run = floodgate(
        &args(&other, "lockfree", &["--load", good.path()]),
        "allow a 1\n",
    );
    assert_eq!((run.code, run.stdout.as_str()), (Some(2), ""));
    assert!(
        run.stderr
            .contains("saved under the rules gcra:3/1s, not gcra:4/1s"),
        "{}",
        run.stderr
    );
    let run = floodgate(
        &args(&rules, "mutex", &["--load", good.path()]),
        "allow a 1\n",
    );
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr.contains("saved by the lockfree engine"),
        "{}",
        run.stderr
    );
}

/// A save that cannot be written is an error, and the file it was for is
/// as it was.
#[test]
fn a_save_that_cannot_be_written_is_an_error() {
    let rules = vec!["gcra:3/1s".to_owned()];
    let run = floodgate(
        &args(
            &rules,
            "lockfree",
            &["--save", "/nonexistent-dir/floodgate.state"],
        ),
        "allow a 0\n",
    );
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr
            .contains("cannot save to /nonexistent-dir/floodgate.state"),
        "{}",
        run.stderr
    );
    // A malformed line: the replay stops, and nothing is saved.
    let file = Scratch::new("stopped");
    let run = floodgate(
        &args(&rules, "lockfree", &["--save", file.path()]),
        "allow a 0\nallow\n",
    );
    assert_eq!(run.code, Some(2));
    assert!(!file.0.exists());
}
