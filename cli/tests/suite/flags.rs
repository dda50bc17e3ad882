//! One vocabulary for every subcommand's flags, end to end: the built
//! binary, refusing values in the words the user typed with status 2, the
//! same text whichever subcommand was given it, and `replay --window` and
//! its millisecond alias `--window-ms` giving the same answers.

use super::binary;

use binary::floodgate;

/// The options each subcommand needs around the ones under test; a
/// refused value must stop every one of them before it does anything
/// (the proxy never listens, the bench never measures).
fn command<'a>(subcommand: &'a str, options: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![subcommand];
    match subcommand {
        "replay" => args.extend(["--policy", "gcra"]),
        "proxy" => args.extend([
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:9",
            "--policy",
            "gcra",
        ]),
        "bench" => args.extend(["--quick", "--keys", "hot", "--threads", "1"]),
        _ => {}
    }
    args.extend_from_slice(options);
    args
}

/// Asserts a refusal: status 2, nothing on standard output, exactly
/// `error: MESSAGE` on standard error.
fn assert_refused(args: &[&str], message: &str) {
    let run = floodgate(args, "allow a 0\n");
    assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
    assert_eq!(run.stdout, "", "{args:?}");
    assert_eq!(run.stderr, format!("error: {message}\n"), "{args:?}");
}

#[test]
fn a_window_is_refused_in_the_same_words_by_every_subcommand() {
    for subcommand in ["replay", "bench", "proxy"] {
        for (window, message) in [
            (
                "1",
                "--window 1: a duration needs a unit, such as 1s, 500ms or 2m",
            ),
            ("1.5s", "--window 1.5s: write whole units, such as 1500ms"),
            ("2.5m", "--window 2.5m: write whole units, such as 150s"),
            (
                "1fortnight",
                "--window 1fortnight: unknown unit \"fortnight\": the units are ns, us, ms, s, \
                 m, h, d",
            ),
            (
                "soon",
                "--window soon: a duration is a whole number and a unit, such as 1s, 500ms or 2m",
            ),
        ] {
            let args = command(subcommand, &["--limit", "10", "--window", window]);
            assert_refused(&args, message);
        }
    }
}

#[test]
fn a_limit_is_refused_in_the_same_words_by_every_subcommand() {
    for subcommand in ["replay", "bench", "proxy"] {
        for limit in ["ten", "+1", "0"] {
            let args = command(subcommand, &["--limit", limit, "--window", "1s"]);
            assert_refused(
                &args,
                &format!(
                    "--limit {limit}: the limit must be a whole number between 1 and 4294967295"
                ),
            );
        }
    }
}

#[test]
fn a_window_shorter_than_the_limit_says_what_to_write_instead() {
    // The replay's tick is a millisecond, the others' a nanosecond.
    assert_refused(
        &command("replay", &["--limit", "10", "--window", "9ms"]),
        "--limit 10 --window 9ms: gcra lets one request in every window/limit, and that must be \
         at least 1ms: give --window 10ms or longer, or a smaller --limit",
    );
    assert_refused(
        &command("replay", &["--limit", "10", "--window-ms", "9"]),
        "--limit 10 --window-ms 9: gcra lets one request in every window/limit, and that must \
         be at least 1ms: give --window-ms 10 or longer, or a smaller --limit",
    );
    for subcommand in ["bench", "proxy"] {
        assert_refused(
            &command(subcommand, &["--limit", "10", "--window", "9ns"]),
            "--limit 10 --window 9ns: gcra lets one request in every window/limit, and that \
             must be at least 1ns: give --window 10ns or longer, or a smaller --limit",
        );
    }
    assert_refused(
        &command("bench", &["--limit", "10", "--window-ns", "9"]),
        "--limit 10 --window-ns 9: gcra lets one request in every window/limit, and that must \
         be at least 1ns: give --window-ns 10 or longer, or a smaller --limit",
    );
}

#[test]
fn a_cap_of_no_clients_is_explained_in_flags() {
    let message = "--max-clients 0: with --overflow reject (the default) every client would be \
                   refused; give --max-clients 1 or more, or add --overflow admit (new clients \
                   pass untracked) or --overflow shared (they share one limit)";
    for subcommand in ["replay", "proxy"] {
        assert_refused(
            &command(
                subcommand,
                &["--limit", "10", "--window", "1s", "--max-clients", "0"],
            ),
            message,
        );
    }
    // With a rule that gives newcomers something, a cap of 0 is valid.
    let run = floodgate(
        &command(
            "replay",
            &[
                "--limit",
                "1",
                "--window",
                "1s",
                "--max-clients",
                "0",
                "--overflow",
                "shared",
            ],
        ),
        "allow a 0\nallow b 0\n",
    );
    assert_eq!((run.code, run.stdout.as_str()), (Some(0), "true\nfalse\n"));
}

#[test]
fn the_replays_window_is_whole_milliseconds_within_its_bounds() {
    for (window, message) in [
        (
            "1500us",
            "--window 1500us: a trace's times are milliseconds, so the window is a whole number \
             of them, such as 1ms or 2ms",
        ),
        (
            "0s",
            "--window 0s: the window must be between 1ms and 1000000000ms",
        ),
        (
            "500us",
            "--window 500us: the window must be between 1ms and 1000000000ms",
        ),
        (
            "12d",
            "--window 12d: the window must be between 1ms and 1000000000ms",
        ),
    ] {
        assert_refused(
            &command("replay", &["--limit", "1", "--window", window]),
            message,
        );
    }
    assert_refused(
        &command("replay", &["--limit", "1", "--window-ms", "0"]),
        "--window-ms 0: the window must be a whole number of milliseconds between 1 and \
         1000000000",
    );
}

#[test]
fn counts_and_names_are_refused_in_the_same_form() {
    assert_refused(
        &["demo", "--threads", "0"],
        "--threads 0: expected a whole number between 1 and 64",
    );
    assert_refused(
        &["bench", "--threads", "1,0"],
        "--threads 0: expected a whole number between 1 and 256",
    );
    assert_refused(
        &["demo", "--seconds", "1h"],
        "--seconds 1h: expected a whole number between 1 and 3600",
    );
    let policies = "expected one of sliding-window, token-bucket, fixed-window, \
                    sliding-window-counter, gcra, leaky-bucket";
    assert_refused(
        &["demo", "--policy", "gcra,fastest"],
        &format!("--policy fastest: {policies}"),
    );
    assert_refused(
        &["bench", "--policy", "fastest"],
        &format!("--policy fastest: {policies}"),
    );
    assert_refused(
        &[
            "replay", "--policy", "fastest", "--limit", "1", "--window", "1s",
        ],
        &format!("--policy fastest: {policies}"),
    );
    assert_refused(
        &command(
            "replay",
            &[
                "--limit",
                "1",
                "--window",
                "1s",
                "--max-clients",
                "1",
                "--overflow",
                "open",
            ],
        ),
        "--overflow open: expected reject, admit or shared",
    );
    assert_refused(
        &command(
            "proxy",
            &[
                "--limit",
                "1",
                "--window",
                "1s",
                "--max-clients",
                "1",
                "--overflow",
                "open",
            ],
        ),
        "--overflow open: expected reject, admit or shared",
    );
}

#[test]
fn window_and_window_ms_are_one_option() {
    let trace = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/sliding-window.trace"
    ))
    .unwrap();
    for detail in [&[][..], &["--detail"]] {
        let replay = |window: &[&'static str]| {
            let mut args = vec!["replay", "--policy", "sliding-window", "--limit", "3"];
            args.extend_from_slice(window);
            args.extend_from_slice(detail);
            floodgate(&args, &trace)
        };
        let by_duration = replay(&["--window", "1s"]);
        let by_ms = replay(&["--window-ms", "1000"]);
        assert_eq!(by_duration.code, Some(0), "{}", by_duration.stderr);
        assert_eq!(by_ms.code, Some(0), "{}", by_ms.stderr);
        assert!(!by_duration.stdout.is_empty());
        assert_eq!(by_duration.stdout, by_ms.stdout);
        assert_eq!(replay(&["--window", "1000ms"]).stdout, by_ms.stdout);
    }
    let both = floodgate(
        &command(
            "replay",
            &["--limit", "3", "--window", "1s", "--window-ms", "1000"],
        ),
        &trace,
    );
    assert_eq!(both.code, Some(2));
    assert_eq!(both.stdout, "");
    assert!(
        both.stderr
            .starts_with("error: the argument '--window <DURATION>' cannot be used with"),
        "{}",
        both.stderr
    );
    let neither = floodgate(&command("replay", &["--limit", "3"]), &trace);
    assert_eq!(neither.code, Some(2));
    assert!(
        neither.stderr.contains("--window <DURATION>"),
        "{}",
        neither.stderr
    );
}
