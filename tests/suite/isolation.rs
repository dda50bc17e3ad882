//! Clients never affect each other: thousands of clients whose calls are
//! interleaved get, call for call, what each gets alone on a fresh limiter,
//! and every one of them is tracked. Both engines, `String` keys queried
//! with `&str` and `u64` keys.

use super::support;

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::Hash;

use floodgate::{Engine, PolicyKind};
use support::{ask, limiter, Answer, Op, ENGINES};

const CLIENTS: usize = 5_000;
const CALLS_PER_CLIENT: u64 = 6;
const LIMIT: u64 = 3;
const WINDOW: u64 = 10;

/// One call of client number `client`.
#[derive(Clone, Copy, Debug)]
struct Call {
    client: usize,
    op: Op,
    at: u64,
}

/// Every client's calls, merged in time order. Client `i` starts at its own
/// origin (spread over 100 windows) and calls every `i mod 7` ticks (0: a
/// burst at one instant), so limits are reached at different moments and the
/// clients' calls interleave throughout.
fn interleaved_calls() -> Vec<Call> {
    let mut calls: Vec<Call> = (0..CLIENTS)
        .flat_map(|client| {
            let origin = (client as u64 * 37) % (100 * WINDOW);
            let step = client as u64 % 7;
            (0..CALLS_PER_CLIENT).map(move |j| Call {
                client,
                op: if (client as u64 + j).is_multiple_of(5) {
                    Op::Remaining
                } else {
                    Op::Allow
                },
                at: origin + j * step,
            })
        })
        .collect();
    // Stable: each client's own calls keep their order.
    calls.sort_by_key(|call| call.at);
    calls
}

/// Runs the interleaved calls on one limiter, then each client alone on a
/// fresh one, and compares; checks `tracked_clients` along the way. Returns
/// the interleaved answers.
fn each_client_answers_as_if_alone<Q>(
    policy: PolicyKind,
    engine: Engine,
    keys: &[Q::Owned],
) -> Vec<Answer>
where
    Q: ?Sized + Hash + Eq + ToOwned + 'static,
    Q::Owned: Hash + Eq + Clone + Send + Sync + 'static,
{
    let calls = interleaved_calls();
    let shared = limiter::<Q>(policy, LIMIT, WINDOW, engine);
    let mut seen = HashSet::new();
    let mut together = Vec::with_capacity(calls.len());
    for (i, call) in calls.iter().enumerate() {
        together.push(ask(&*shared, keys[call.client].borrow(), call.op, call.at));
        seen.insert(call.client);
        if i % 997 == 0 {
            assert_eq!(shared.tracked_clients(), seen.len(), "{engine} {policy}");
        }
    }
    assert_eq!(shared.tracked_clients(), CLIENTS, "{engine} {policy}");
    let rejected = together
        .iter()
        .filter(|answer| matches!(answer, Answer::Decision(d) if !d.allowed()))
        .count();
    // The schedule must make clients reach their limits, or being alone
    // and being together could not differ.
    assert!(
        rejected > CLIENTS / 10,
        "{engine} {policy}: {rejected} rejected"
    );

    let mut by_client: Vec<Vec<(Call, Answer)>> = vec![Vec::new(); CLIENTS];
    for (&call, &answer) in calls.iter().zip(&together) {
        by_client[call.client].push((call, answer));
    }
    for (client, history) in by_client.iter().enumerate() {
        let alone = limiter::<Q>(policy, LIMIT, WINDOW, engine);
        for &(call, answer) in history {
            assert_eq!(
                ask(&*alone, keys[client].borrow(), call.op, call.at),
                answer,
                "{engine} {policy}: client {client} at {}",
                call.at
            );
        }
        assert_eq!(alone.tracked_clients(), 1);
    }
    together
}

#[test]
fn thousands_of_string_keyed_clients_queried_by_str_never_affect_each_other() {
    let keys: Vec<String> = (0..CLIENTS).map(|i| format!("client-{i}")).collect();
    for policy in PolicyKind::ALL {
        let [lock_free, mutex] =
            ENGINES.map(|engine| each_client_answers_as_if_alone::<str>(policy, engine, &keys));
        assert!(lock_free == mutex, "{policy}: the engines disagree");
    }
}

#[test]
fn thousands_of_u64_keyed_clients_never_affect_each_other() {
    // Spread over the whole key space, not just small integers.
    let keys: Vec<u64> = (0..CLIENTS as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    for policy in PolicyKind::ALL {
        let [lock_free, mutex] =
            ENGINES.map(|engine| each_client_answers_as_if_alone::<u64>(policy, engine, &keys));
        assert!(lock_free == mutex, "{policy}: the engines disagree");
    }
}
