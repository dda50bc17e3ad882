//! Each policy's answers, worked out by hand from SPEC.md, through the public
//! API of both engines: the spec's example sessions, the exact boundaries,
//! `retry_after` and `delay` figures, long gaps and times near the contract's
//! 2 × 10^12-tick horizon.

use super::support;

use floodgate::{Decision, PolicyKind, MAX_LIMIT, MAX_LOG_LIMIT};
use support::{admitted, delayed, on_both, rejected};

use PolicyKind::{
    FixedWindow, Gcra, InFlight, LeakyBucket, SlidingWindow, SlidingWindowCounter, TokenBucket,
};

/// One call of a hand-written session and the answer the spec gives.
#[derive(Clone, Copy, Debug)]
enum Step {
    Check(&'static str, u64, Decision),
    CheckN(&'static str, u64, u64, Decision),
    Remaining(&'static str, u64, u64),
}

fn check_n(client: &'static str, at: u64, cost: u64, answer: Decision) -> Step {
    Step::CheckN(client, at, cost, answer)
}

/// A refused request with `remaining` left (a weighted request can be
/// refused with some left).
const fn refused(remaining: u64, retry_after: u64) -> Decision {
    Decision::rejected(remaining, retry_after)
}

/// A request whose cost exceeds the limit: never admitted.
const fn never(remaining: u64) -> Decision {
    Decision::never_admitted(remaining)
}

fn check(client: &'static str, at: u64, answer: Decision) -> Step {
    Step::Check(client, at, answer)
}

fn remaining(client: &'static str, at: u64, answer: u64) -> Step {
    Step::Remaining(client, at, answer)
}

/// Plays `steps` on a fresh limiter of each engine and checks every answer.
fn session(policy: PolicyKind, limit: u64, window: u64, steps: &[Step]) {
    on_both::<str>(policy, limit, window, |limiter, engine| {
        for (i, step) in steps.iter().enumerate() {
            let context = format!("{engine} {policy} L={limit} W={window}, step {i}: {step:?}");
            match *step {
                Step::Check(client, at, answer) => {
                    assert_eq!(limiter.check_at(client, at), answer, "{context}");
                }
                Step::CheckN(client, at, cost, answer) => {
                    assert_eq!(limiter.check_n_at(client, at, cost), answer, "{context}");
                }
                Step::Remaining(client, at, answer) => {
                    assert_eq!(limiter.remaining_at(client, at), answer, "{context}");
                }
            }
        }
    });
}

// The spec's example sessions -------------------------------------------------

#[test]
fn sliding_window_replays_the_spec_session() {
    session(
        SlidingWindow,
        3,
        1_000,
        &[
            check("rahul", 0, admitted(2)),
            check("rahul", 100, admitted(1)),
            check("rahul", 200, admitted(0)),
            // 0 leaves the window at 1000.
            check("rahul", 300, rejected(700)),
            check("priya", 300, admitted(2)),
            remaining("rahul", 999, 0),
            // 0 > 1000 − 1000 is false: only 100 and 200 are in the window.
            check("rahul", 1_000, admitted(0)),
            // Only 200 and 1000 are in (150, 1150].
            remaining("rahul", 1_150, 1),
        ],
    );
}

#[test]
fn token_bucket_replays_the_spec_session() {
    session(
        TokenBucket,
        2,
        1_000,
        &[
            check("app", 0, admitted(1)),
            check("app", 10, admitted(0)),
            // The first drip is at 0 + 500.
            check("app", 20, rejected(480)),
            remaining("app", 499, 0),
            check("app", 500, admitted(0)),
            // Drips at 1000, 1500 and 2000, into a bucket that holds 2.
            remaining("app", 2_000, 2),
        ],
    );
}

// sliding-window ------------------------------------------------------------

#[test]
fn sliding_window_counts_an_admission_until_exactly_w_ticks_later() {
    session(
        SlidingWindow,
        1,
        1_000,
        &[
            // Origin at 5000: times are relative to nothing but the calls.
            check("k", 5_000, admitted(0)),
            // 5000 > 5999 − 1000: still in the window, for one more tick.
            check("k", 5_999, rejected(1)),
            remaining("k", 5_999, 0),
            // 5000 > 6000 − 1000 is false: it has left.
            remaining("k", 6_000, 1),
            check("k", 6_000, admitted(0)),
        ],
    );
}

#[test]
fn sliding_window_retry_after_waits_for_the_oldest_of_the_last_l() {
    session(
        SlidingWindow,
        3,
        10,
        &[
            check("k", 0, admitted(2)),
            check("k", 4, admitted(1)),
            check("k", 7, admitted(0)),
            check("k", 8, rejected(2)), // 0 leaves at 10
            check("k", 10, admitted(0)),
            check("k", 13, rejected(1)), // the last three are 4, 7, 10: 4 leaves at 14
            check("k", 14, admitted(0)),
            remaining("k", 17, 1), // 7 has left (17 − 10 = 7); 10 and 14 remain
            remaining("k", 24, 3),
        ],
    );
}

#[test]
fn sliding_window_at_the_largest_limit_counts_every_admission() {
    const L: u64 = MAX_LOG_LIMIT;
    session(
        SlidingWindow,
        L,
        10,
        &[
            remaining("k", 3, L),
            check("k", 3, admitted(L - 1)),
            check("k", 12, admitted(L - 2)),
            remaining("k", 13, L - 1), // 3 left at 13
            remaining("k", 22, L),
            check_n("k", 22, L - 1, admitted(1)),
            // k = (L − 1) + 2 − L = 1: the entry at 22 leaves at 32.
            check_n("k", 23, 2, refused(1, 9)),
            remaining("k", 32, L),
        ],
    );
}

// token-bucket ----------------------------------------------------------------

#[test]
fn token_bucket_drips_on_multiples_of_the_rounded_down_interval() {
    // W = 10 is not a multiple of L = 3: I = 3, so drips fall at 3, 6, 9, 12
    // (not at multiples of 10/3), and the sustained rate is one per 3 ticks.
    session(
        TokenBucket,
        3,
        10,
        &[
            check("k", 0, admitted(2)),
            check("k", 0, admitted(1)),
            check("k", 0, admitted(0)),
            check("k", 2, rejected(1)),
            check("k", 3, admitted(0)),
            check("k", 5, rejected(1)),
            remaining("k", 9, 2), // drips at 6 and 9
            check("k", 10, admitted(1)),
            remaining("k", 11, 1),
            remaining("k", 12, 2),
            remaining("k", 100, 3), // full: later drips are wasted
        ],
    );
}

#[test]
fn token_bucket_drips_count_from_the_clients_own_origin() {
    session(
        TokenBucket,
        1,
        100,
        &[
            check("early", 0, admitted(0)),
            check("late", 30, admitted(0)),
            check("early", 99, rejected(1)),
            check("late", 99, rejected(31)), // its first drip is at 30 + 100
            check("early", 100, admitted(0)),
            check("late", 129, rejected(1)),
            check("late", 130, admitted(0)),
        ],
    );
}

// fixed-window ----------------------------------------------------------------

#[test]
fn fixed_window_grids_start_at_each_clients_origin() {
    session(
        FixedWindow,
        2,
        1_000,
        &[
            check("a", 0, admitted(1)),
            check("a", 0, admitted(0)),
            check("b", 500, admitted(1)),
            check("b", 500, admitted(0)),
            // a's window [0, 1000) ends in one tick; b's [500, 1500) in 500.
            check("a", 999, rejected(1)),
            check("a", 1_000, admitted(1)),
            check("b", 1_000, rejected(500)),
            check("b", 1_499, rejected(1)),
            remaining("b", 1_499, 0),
            remaining("b", 1_500, 2),
            check("b", 1_500, admitted(1)),
        ],
    );
}

#[test]
fn fixed_window_forgets_the_previous_window_entirely() {
    session(
        FixedWindow,
        3,
        10,
        &[
            check("k", 0, admitted(2)),
            check("k", 9, admitted(1)),
            check("k", 9, admitted(0)),
            check("k", 9, rejected(1)),
            // A new window: three more at once, right after three.
            check("k", 10, admitted(2)),
            check("k", 10, admitted(1)),
            check("k", 10, admitted(0)),
            check("k", 15, rejected(5)),
        ],
    );
}

// sliding-window-counter ------------------------------------------------------

#[test]
fn sliding_window_counter_weighs_the_previous_window_by_its_overlap() {
    // L = 3, W = 10: admit iff p·(10 − e) + c·10 < 30.
    session(
        SlidingWindowCounter,
        3,
        10,
        &[
            check("k", 0, admitted(2)),
            check("k", 0, admitted(1)),
            check("k", 0, admitted(0)),
            // p = 0, c = 3: never in this window. Next window (p = 3, c = 0)
            // admits at e = 1 (27 < 30), i.e. at 11.
            check("k", 4, rejected(7)),
            // e = 0: 30 < 30 is false; (3 + 0 − 3)·10 / 3 + 1 = 1 tick on.
            check("k", 10, rejected(1)),
            remaining("k", 10, 0),
            // 27 < 30; afterwards 27 + 10 = 37, so nothing remains.
            check("k", 11, admitted(0)),
            // p = 3, c = 1: 3·8 + 10 = 34. Admitted once 3·e > 10, at e = 4.
            check("k", 12, rejected(2)),
            check("k", 13, rejected(1)), // 3·7 + 10 = 31
            check("k", 14, admitted(0)), // 3·6 + 10 = 28 < 30, then 38
            // 3·1 + 20 = 23: the room of 7 rounds up to one request.
            remaining("k", 19, 1),
            // Next window: p = 2, c = 0.
            remaining("k", 20, 1), // 20: room 10
            remaining("k", 25, 2), // 2·5 = 10: room 20
            remaining("k", 26, 3), // 2·4 = 8: room 22, rounded up
            // Two windows on, the old counts are gone.
            remaining("k", 30, 3),
        ],
    );
}

#[test]
fn sliding_window_counter_with_a_one_tick_window_retries_two_windows_on() {
    // W = 1, L = 1: the next window holds p = 1 at e = 0 (1 < 1 is false),
    // so the first admitted instant is the start of the window after.
    session(
        SlidingWindowCounter,
        1,
        1,
        &[
            check("k", 7, admitted(0)),
            check("k", 7, rejected(2)),
            check("k", 8, rejected(1)),
            check("k", 9, admitted(0)),
        ],
    );
}

#[test]
fn sliding_window_counter_when_the_previous_window_was_full_retries_one_tick_into_the_next() {
    session(
        SlidingWindowCounter,
        2,
        100,
        &[
            check("k", 0, admitted(1)),
            check("k", 50, admitted(0)),
            // c = L: the next window admits from e = 1 (2·99 < 200).
            check("k", 60, rejected(41)),
            check("k", 100, rejected(1)),
            check("k", 101, admitted(0)),
        ],
    );
}

// gcra --------------------------------------------------------------------------

#[test]
fn gcra_admits_a_burst_of_l_then_one_per_interval() {
    // L = 3, W = 30: I = 10, τ = 20.
    session(
        Gcra,
        3,
        30,
        &[
            check("k", 0, admitted(2)),
            check("k", 0, admitted(1)),
            check("k", 0, admitted(0)),
            check("k", 0, rejected(10)), // TAT 30: 30 − 20 − 0
            check("k", 9, rejected(1)),  // 30 − 9 = 21 > 20
            check("k", 10, admitted(0)), // 30 − 10 = 20 ≤ 20; TAT 40
            check("k", 15, rejected(5)),
            remaining("k", 35, 2), // ⌊(20 − 5) / 10⌋ + 1
            remaining("k", 40, 3),
        ],
    );
}

#[test]
fn gcra_uses_the_rounded_down_interval_when_w_is_not_a_multiple_of_l() {
    // L = 3, W = 10: I = 3, τ = 6.
    session(
        Gcra,
        3,
        10,
        &[
            check("k", 0, admitted(2)),
            check("k", 0, admitted(1)),
            check("k", 0, admitted(0)),
            check("k", 0, rejected(3)), // TAT 9: 9 − 6 − 0
            check("k", 3, admitted(0)), // 9 − 3 = 6 ≤ 6; TAT 12
            check("k", 4, rejected(2)), // 12 − 6 − 4
            remaining("k", 12, 3),      // ⌊6 / 3⌋ + 1
        ],
    );
}

// leaky-bucket ------------------------------------------------------------------

#[test]
fn leaky_bucket_delays_each_request_by_its_place_in_the_queue() {
    // L = 3, W = 30: I = 10, τ = 20; admissions are gcra's.
    session(
        LeakyBucket,
        3,
        30,
        &[
            check("k", 0, delayed(2, 0)),
            check("k", 0, delayed(1, 10)),
            check("k", 0, delayed(0, 20)),
            check("k", 0, rejected(10)),
            check("k", 5, rejected(5)),
            // t = 30: it waits 20, at the back of the queue.
            check("k", 10, delayed(0, 20)),
            remaining("k", 35, 2),
            // The queue has drained: no wait.
            check("k", 100, delayed(2, 0)),
        ],
    );
}

#[test]
fn leaky_bucket_delay_uses_the_rounded_down_interval() {
    // L = 4, W = 10: I = 2, τ = 6.
    session(
        LeakyBucket,
        4,
        10,
        &[
            check("k", 1, delayed(3, 0)),
            check("k", 1, delayed(2, 2)),
            check("k", 1, delayed(1, 4)),
            check("k", 1, delayed(0, 6)),
            check("k", 1, rejected(2)),
            check("k", 4, delayed(0, 5)), // t = 9 (TAT), now 4
        ],
    );
}

// Every policy ------------------------------------------------------------------

#[test]
fn remaining_before_any_allow_is_the_limit_and_creates_the_client() {
    for policy in PolicyKind::ALL {
        on_both::<str>(policy, 5, 100, |limiter, engine| {
            assert_eq!(limiter.tracked_clients(), 0, "{engine} {policy}");
            assert_eq!(limiter.remaining_at("new", 123), 5, "{engine} {policy}");
            assert_eq!(limiter.tracked_clients(), 1, "{engine} {policy}");
            // Its origin is the remaining call: nothing has been used.
            assert_eq!(
                limiter.check_at("new", 123),
                admitted(4),
                "{engine} {policy}"
            );
            assert_eq!(limiter.tracked_clients(), 1, "{engine} {policy}");
        });
    }
}

#[test]
fn a_limit_of_one_admits_one_per_window() {
    // L = 1, W = 10. The counter policy is the odd one out: at e = 0 of the
    // next window the previous admission still weighs fully (1·10 < 10 is
    // false), so it waits one tick more.
    for (policy, first_retry, next) in [
        (SlidingWindow, 10, admitted(0)),
        (TokenBucket, 10, admitted(0)),
        (FixedWindow, 10, admitted(0)),
        (SlidingWindowCounter, 11, rejected(1)),
        (Gcra, 10, admitted(0)),
        (LeakyBucket, 10, admitted(0)),
    ] {
        session(
            policy,
            1,
            10,
            &[
                check("k", 40, admitted(0)),
                check("k", 40, rejected(first_retry)),
                check("k", 49, rejected(first_retry - 9)),
                check("k", 50, next),
                remaining("k", 50, 0),
            ],
        );
    }
}

/// For L = 3, W = 7 (I = 2, τ = 4): what a fourth request gets after a burst
/// of three at a window start that is also a drip.
fn retry_after_a_full_burst(policy: PolicyKind) -> u64 {
    match policy {
        SlidingWindow => 7,        // the burst leaves at +7
        TokenBucket => 2,          // the next drip
        FixedWindow => 7,          // the window's end
        SlidingWindowCounter => 8, // c = L: one tick into the next window
        Gcra | LeakyBucket => 2,   // TAT +6, minus τ
        InFlight => unreachable!("no window: not in PolicyKind::ALL"),
    }
}

/// For the same burst: the answer at `retry_after`.
fn admitted_at_the_retry(policy: PolicyKind) -> Decision {
    match policy {
        SlidingWindow | FixedWindow => admitted(2), // the whole burst is gone
        TokenBucket => admitted(0),                 // one drip
        SlidingWindowCounter => admitted(0),        // 3·6 < 21, then 3·6 + 7
        Gcra => admitted(0),                        // TAT +6 − 2 = τ
        LeakyBucket => delayed(0, 4),
        InFlight => unreachable!("no window: not in PolicyKind::ALL"),
    }
}

/// A full burst at `at` (a multiple of 14 ticks past `key`'s origin, so a
/// window start and a drip), then a rejection with the policy's exact
/// `retry_after`, one more rejection a tick before it, and an admission at it.
fn full_burst_steps(policy: PolicyKind, key: &'static str, at: u64) -> Vec<Step> {
    let burst = |remaining, place: u64| match policy {
        LeakyBucket => delayed(remaining, place * 2),
        _ => admitted(remaining),
    };
    let retry = retry_after_a_full_burst(policy);
    vec![
        remaining(key, at, 3),
        check(key, at, burst(2, 0)),
        check(key, at, burst(1, 1)),
        check(key, at, burst(0, 2)),
        check(key, at, rejected(retry)),
        check(key, at + retry - 1, rejected(1)),
        check(key, at + retry, admitted_at_the_retry(policy)),
    ]
}

#[test]
fn a_gap_of_2_pow_k_windows_restores_the_full_burst() {
    for policy in PolicyKind::ALL {
        // From k = 2: the counter policy's previous window must hold none of
        // the first session's admissions.
        for k in [2, 3, 10, 20, 30, 35, 40] {
            let gap = 7 << k;
            let mut steps = full_burst_steps(policy, "k", 0);
            steps.extend(full_burst_steps(policy, "k", gap));
            session(policy, 3, 7, &steps);
        }
    }
}

#[test]
fn answers_stay_exact_near_2e12_ticks() {
    // 1_999_999_999_998 = 14 · 142_857_142_857: a window start and a drip
    // for a client whose origin is 0.
    const LATE: u64 = 1_999_999_999_998;
    for policy in PolicyKind::ALL {
        let mut steps = full_burst_steps(policy, "old", 0);
        steps.extend(full_burst_steps(policy, "old", LATE));
        // A client created late measures from its own origin.
        steps.extend(full_burst_steps(policy, "new", LATE - 14));
        session(policy, 3, 7, &steps);
    }
}

#[test]
fn a_call_before_the_origin_is_judged_at_the_origin_and_waits_the_difference() {
    // L = 1, W = 10. A thread that read the clock at 90 loses the race to
    // create the client to one that read 100: its answer is the origin's,
    // pushed 10 ticks later. (A drip policy keeps no origin and judges the
    // call at 90 itself: TAT 110 − 90, or the bucket full from 110, the
    // same 20 ticks here.)
    for policy in PolicyKind::ALL {
        let at_origin = if policy == SlidingWindowCounter {
            11
        } else {
            10
        };
        session(
            policy,
            1,
            10,
            &[
                check("k", 100, admitted(0)),
                check("k", 90, rejected(at_origin + 10)),
                remaining("k", 90, 0),
            ],
        );
    }
    // Judged at its own time, a drip policy can only be stricter than at
    // the origin. L = 2, W = 10: I = 5, τ = 5. At the origin the second
    // request would be admitted (waiting 5 on the leaky bucket); at 90 it
    // is 15 ahead of the schedule, past τ, and the bucket, full from 105,
    // lacks the drips at 95, 100 and 105.
    for policy in [TokenBucket, Gcra, LeakyBucket] {
        session(
            policy,
            2,
            10,
            &[
                check(
                    "k",
                    100,
                    if policy == LeakyBucket {
                        delayed(1, 0)
                    } else {
                        admitted(1)
                    },
                ),
                check("k", 90, rejected(10)), // 105 − 5 − 90
                remaining("k", 90, 0),
                remaining("k", 100, 1),
            ],
        );
    }
}

// Weighted requests (SPEC "Weighted requests") -----------------------------------

#[test]
fn sliding_window_admits_a_cost_iff_that_many_fit_in_the_window() {
    session(
        SlidingWindow,
        5,
        100,
        &[
            check_n("a", 0, 3, admitted(2)), // 0, 0, 0
            // k = 3 + 3 − 5 = 1: the oldest inside, 0, leaves at 100.
            check_n("a", 10, 3, refused(2, 90)),
            check_n("a", 10, 2, admitted(0)), // 0, 0, 0, 10, 10
            check_n("a", 50, 0, admitted(0)),
            check_n("a", 50, 6, never(0)),
            // At 100 the zeros are out: c = 2, k = 2 + 4 − 5 = 1 → 10 + 100.
            check_n("a", 100, 4, refused(3, 10)),
            check_n("a", 100, 3, admitted(0)),
            remaining("a", 110, 2),
            // k = 3 + 5 − 5 = 3: the third of 100, 100, 100.
            check_n("a", 110, 5, refused(2, 90)),
        ],
    );
}

#[test]
fn token_bucket_takes_a_cost_in_tokens_and_waits_for_its_drips() {
    session(
        TokenBucket,
        4,
        400, // I = 100
        &[
            check_n("a", 0, 3, admitted(1)),
            // 1 token; the first drip after 50 (at 100) makes 2.
            check_n("a", 50, 2, refused(1, 50)),
            check_n("a", 100, 2, admitted(0)),
            // Empty: the 4th drip after 150 is at 500.
            check_n("a", 150, 4, refused(0, 350)),
            check_n("a", 150, 5, never(0)),
            check_n("a", 150, 0, admitted(0)),
            remaining("a", 1_000, 4),
        ],
    );
}

#[test]
fn fixed_window_adds_a_cost_to_the_window_count() {
    session(
        FixedWindow,
        10,
        100,
        &[
            check_n("a", 0, 7, admitted(3)),
            check_n("a", 20, 4, refused(3, 80)),
            check_n("a", 20, 3, admitted(0)),
            check_n("a", 100, 10, admitted(0)),
            check_n("a", 150, 0, admitted(0)),
            check_n("a", 199, 11, never(0)),
        ],
    );
}

#[test]
fn sliding_window_counter_weighs_the_last_of_the_cost() {
    session(
        SlidingWindowCounter,
        4,
        100,
        &[
            // (0 + 4 − 1)·100 < 400.
            check_n("a", 0, 4, admitted(0)),
            // e = 50: 4·50 + 2·100 = 400 is not < 400; remaining ⌈200/100⌉;
            // 4·f > (4 + 0 + 2 − 4)·100 first at f = 51.
            check_n("a", 150, 3, refused(2, 1)),
            // e = 75: 4·25 + 2·100 = 300 < 400.
            check_n("a", 175, 3, admitted(0)),
            // Window 2, e = 0, p = 3: 300 + 100 is not < 400; first at f = 1.
            check_n("a", 200, 2, refused(1, 1)),
            check_n("a", 200, 5, never(1)),
            check_n("a", 201, 2, admitted(0)),
        ],
    );
}

#[test]
fn gcra_schedules_the_last_of_the_cost() {
    session(
        Gcra,
        3,
        300, // I = 100, τ = 200
        &[
            check_n("a", 0, 2, admitted(1)), // TAT 200
            // t + I − now = 300 > 200: 100 to wait; one is left.
            check_n("a", 0, 2, refused(1, 100)),
            check("a", 0, admitted(0)), // TAT 300
            check_n("a", 150, 3, refused(1, 150)),
            check_n("a", 300, 3, admitted(0)), // TAT 600
            check_n("a", 300, 4, never(0)),
            check_n("a", 300, 0, admitted(0)),
        ],
    );
}

#[test]
fn leaky_bucket_delays_a_cost_by_the_first_of_its_places() {
    session(
        LeakyBucket,
        3,
        300, // I = 100, τ = 200
        &[
            check_n("a", 0, 2, delayed(1, 0)),    // TAT 200
            check_n("a", 0, 1, delayed(0, 200)),  // TAT 300
            check_n("a", 250, 2, delayed(0, 50)), // 300 + 100 − 250 <= 200
            check_n("a", 250, 0, admitted(0)),
        ],
    );
}

/// The raised limits: a cost of the whole limit and then one more, on every
/// policy but the sliding log (above), at `L = 2^32 − 1`.
#[test]
fn a_cost_of_the_largest_limit_is_admitted_once() {
    const L: u64 = MAX_LIMIT;
    session(
        Gcra,
        L,
        L, // I = 1, τ = L − 1
        &[
            check_n("a", 0, L, admitted(0)),
            check("a", 0, rejected(1)),
            check_n("a", 0, L + 1, never(0)),
            remaining("a", L, L),
        ],
    );
    session(
        TokenBucket,
        L,
        2 * L, // I = 2
        &[
            check_n("a", 0, L, admitted(0)),
            check("a", 1, rejected(1)),
            // One token; the bucket is full again at drip L, at 2L.
            check_n("a", 2, L, refused(1, 2 * L - 2)),
        ],
    );
    session(
        FixedWindow,
        L,
        10,
        &[
            check_n("a", 0, L, admitted(0)),
            check("a", 3, rejected(7)),
            check_n("a", 10, L, admitted(0)),
        ],
    );
    session(
        SlidingWindowCounter,
        L,
        10,
        &[
            check_n("a", 0, L, admitted(0)),
            // Window 1, e = 0: L·10 is not < L·10; L·f > 0 first at f = 1.
            check("a", 10, rejected(1)),
            // Two windows on, everything is forgotten.
            check_n("a", 20, L, admitted(0)),
        ],
    );
}

/// A new client's first request is decided on its state before the client
/// is published, where no other thread can reach it (`check_unshared`, no
/// CAS): the same decision as the shared step's, and a state that answers
/// every later time as the shared step's does, for every policy, cost and
/// origin tried.
#[test]
fn a_first_request_decided_unshared_answers_as_the_shared_step() {
    use floodgate::policy::{self, Policy};
    use floodgate::Config;

    fn compare<P: Policy>(limit: u64, window: u64) {
        let policy = P::new(Config::per_ticks(limit, window).unwrap()).unwrap();
        for origin in [0, 1, 999, 1_000_000_007] {
            for since in [0, 1, window / 3, window, 5 * window + 7] {
                let now = origin + since;
                for cost in 1..=limit {
                    let shared = policy.begin(origin);
                    let expected = policy.check_within(&shared, now, cost);
                    let (unshared, decided) =
                        policy.check_unshared(policy.begin(origin), now, cost);
                    let case = format!("{}: origin {origin}, now {now}, cost {cost}", P::KIND);
                    assert_eq!(Ok(decided), expected, "{case}");
                    for later in [
                        now,
                        now + 1,
                        now + window / 2,
                        now + window,
                        now + 3 * window,
                    ] {
                        assert_eq!(
                            policy.remaining(&unshared, later),
                            policy.remaining(&shared, later),
                            "{case}: remaining at {later}"
                        );
                    }
                }
            }
        }
    }
    compare::<policy::SlidingWindow>(4, 1_000);
    compare::<policy::TokenBucket>(4, 1_000);
    compare::<policy::FixedWindow>(4, 1_000);
    compare::<policy::SlidingWindowCounter>(4, 1_000);
    compare::<policy::Gcra>(4, 1_000);
    compare::<policy::LeakyBucket>(4, 1_000);
}

/// A check by the limiter's own clock reads it once, for a new client and
/// a known one, directly and through the trait, and is decided at the time
/// it read: the read comes after the look-up (`Limiter::check`), and
/// nothing reads it a second time. The clock here moves 10 ticks a read.
#[test]
fn a_check_reads_its_clock_once_and_is_decided_at_that_time() {
    use floodgate::policy::{self, Policy};
    use floodgate::{Clock, Config, Limiter, RateLimiter, Tick};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    struct Counting(Arc<AtomicU64>);
    impl Clock for Counting {
        fn now(&self) -> u64 {
            self.0.fetch_add(1, Ordering::SeqCst) * 10
        }
        fn tick(&self) -> Tick {
            Tick::NANOSECOND
        }
    }
    let count = Arc::new(AtomicU64::new(0));
    let reads = || count.load(Ordering::SeqCst);
    // gcra, 2 per 100 ticks: an interval of 50 and a burst of 2.
    let config = Config::per_ticks(2, 100).expect("a valid quota");
    let gcra = policy::Gcra::new(config).expect("a valid gcra quota");
    let limiter =
        Limiter::with_clock(gcra, Counting(Arc::clone(&count))).expect("a nanosecond clock");
    assert!(limiter.check(&1).allowed(), "new client, read at 0");
    assert_eq!(reads(), 1);
    assert!(limiter.check(&1).allowed(), "known client, read at 10");
    assert_eq!(reads(), 2);
    // Read at 20: the next admission is at 100, 80 ticks on, 30 past the
    // burst's tolerance. Had the clock been read twice, the time would be
    // 30 and the wait 20.
    let third = limiter.check(&1);
    assert_eq!(
        (
            third.allowed(),
            third.retry_after_ticks().unwrap_or(u64::MAX)
        ),
        (false, 30)
    );
    assert_eq!(reads(), 3);
    let through_the_trait: &dyn RateLimiter<u64> = &limiter;
    assert!(through_the_trait.check(&2).allowed());
    assert!(!through_the_trait.check_n(&1, 2).allowed());
    assert_eq!(reads(), 5);
}
