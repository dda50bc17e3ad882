//! Loom models of floodgate's lock-free engine.
//!
//! The library is built with `--cfg floodgate_loom`, so its `sync` shim hands
//! the policies loom's atomics and the keyed store a loom-visible map: the
//! models run the very CAS loops and create protocol the crate ships. Run
//! them with `loom-tests/run`; without the cfg this crate is empty.
//!
//! # What a model checks
//!
//! A model is a [`Scenario`]: calls made one after another on a fresh client
//! (`before`), then 2–3 threads making their calls concurrently, then
//! `probes` made after every thread has finished. Loom runs it under every
//! interleaving (up to the preemption bound `run` sets) and, for each one,
//! [`explore`] asserts that the answers are **linearisable**: some order of
//! the threads' calls, each thread's kept in program order, gives exactly the
//! same answers and the same probe answers when made one at a time on a fresh
//! client. Over-admission, a lost update and a stale `remaining` each give
//! answers that no such order gives; the probes (a `remaining` at several
//! times, then checks until one is rejected) make a lost or backdated update
//! visible even when the threads' own answers look plausible.
//!
//! Two more rules are checked on every sequential order, because they belong
//! to the contract rather than to concurrency: each `remaining` is honoured by
//! the checks that follow it at the same instant, and a check carrying a time
//! older than the latest admission is never admitted when the same check at
//! that latest time would be rejected (SPEC.md, "Time going backwards").
//! Each model adds its own plain assertions on top (for example "exactly
//! `min(L, calls)` admitted"), so a failure says what went wrong in words.
#![cfg(floodgate_loom)]

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};
use std::sync::{Arc, OnceLock};

use floodgate::policy::Policy;
use floodgate::{Config, Decision, Limiter, ManualClock, PolicyKind};
use loom::sync::atomic::{AtomicBool, Ordering};

/// One call on the modelled client, with its `now` (ticks past the origin of
/// a bare state; ticks of the limiter's clock for a keyed client).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `check(now)`: decide one request.
    Check(u64),
    /// `check_n(now, cost)`: decide one request of cost `cost`, all of it
    /// or none.
    CheckN(u64, u64),
    /// `remaining(now)`.
    Remaining(u64),
    /// `refund(now, at, cost)`: give back up to `cost` units of the
    /// admission made at `at`.
    Refund(u64, u64, u64),
    /// How many client states exist (1 for a bare state).
    Clients,
}

/// What a [`Call`] answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A check's decision.
    Check(Decision),
    /// A `remaining` count.
    Remaining(u64),
    /// The units a refund gave back.
    Refunded(u64),
    /// A count of client states.
    Clients(usize),
}

impl Answer {
    /// Whether this is an admitted check.
    pub fn admitted(self) -> bool {
        matches!(self, Answer::Check(decision) if decision.allowed())
    }
}

/// What the models run calls on: one client of one policy.
pub trait Subject: Send + Sync + 'static {
    /// The policy the subject applies.
    const KIND: PolicyKind;

    /// Whether the client comes into being with the first call that reaches
    /// it, at that call's time (a limiter's key), rather than before any call
    /// (a bare state).
    const CREATED_BY_FIRST_CALL: bool;

    /// A client that has made no call yet.
    fn new(config: Config) -> Self;

    /// Makes one call.
    fn call(&self, call: Call) -> Answer;
}

/// A policy state driven directly: `Policy::check` and `Policy::remaining`
/// on one `P::State`, exactly what the limiter runs for a known client.
pub struct Bare<P: Policy> {
    policy: P,
    state: P::State,
}

impl<P: Policy> Subject for Bare<P> {
    const KIND: PolicyKind = P::KIND;
    const CREATED_BY_FIRST_CALL: bool = false;

    fn new(config: Config) -> Self {
        let policy = P::new(config).expect("the model's config is valid for its policy");
        let state = policy.new_state();
        Self { policy, state }
    }

    fn call(&self, call: Call) -> Answer {
        match call {
            Call::Check(now) => Answer::Check(
                self.policy
                    .check(&self.state, now)
                    .expect("nothing retires a bare state"),
            ),
            Call::CheckN(now, cost) => Answer::Check(
                self.policy
                    .check_n(&self.state, now, cost)
                    .expect("nothing retires a bare state"),
            ),
            Call::Remaining(now) => Answer::Remaining(
                self.policy
                    .remaining(&self.state, now)
                    .expect("nothing retires a bare state"),
            ),
            Call::Refund(now, at, cost) => Answer::Refunded(
                self.policy
                    .refund(&self.state, now, now - at, cost)
                    .expect("nothing retires a bare state"),
            ),
            Call::Clients => Answer::Clients(1),
        }
    }
}

/// One key of a [`Limiter`], created by whichever call comes first: the path
/// that decides the first-touch race (the keyed store's create protocol, run
/// over the loom-visible map of the library's `sync` shim).
pub struct Keyed<P: Policy> {
    limiter: Limiter<u64, P, ManualClock>,
}

/// The key every keyed call uses.
const KEY: u64 = 7;

impl<P: Policy> Subject for Keyed<P> {
    const KIND: PolicyKind = P::KIND;
    const CREATED_BY_FIRST_CALL: bool = true;

    fn new(config: Config) -> Self {
        let policy = P::new(config).expect("the model's config is valid for its policy");
        // The clock is never read: every call passes its `now`.
        Self {
            limiter: Limiter::with_clock(policy, ManualClock::new(0))
                .expect("a clock of nanoseconds"),
        }
    }

    fn call(&self, call: Call) -> Answer {
        match call {
            Call::Check(now) => Answer::Check(self.limiter.check_at(&KEY, now)),
            Call::CheckN(now, cost) => Answer::Check(self.limiter.check_n_at(&KEY, now, cost)),
            Call::Remaining(now) => Answer::Remaining(self.limiter.remaining_at(&KEY, now)),
            Call::Refund(now, at, cost) => {
                Answer::Refunded(self.limiter.refund_at(&KEY, now, at, cost))
            }
            Call::Clients => Answer::Clients(self.limiter.tracked_clients()),
        }
    }
}

/// A model: calls before, during and after a race on one client.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The policy's limit and window.
    pub config: Config,
    /// Calls made one after another before any thread starts.
    pub before: Vec<Call>,
    /// Each thread's calls, in its program order.
    pub threads: Vec<Vec<Call>>,
    /// Calls made one after another once every thread has finished.
    pub probes: Vec<Call>,
    /// Whether each thread, before its first call, looks (Acquire) at a flag
    /// every other thread raises (Release) after its last call. A thread that
    /// saw another finish must be ordered after all of its calls: this checks
    /// the real-time half of linearisability, that a finished call is never
    /// missed by a call that knowably starts later.
    pub real_time: bool,
}

/// The answers of one concurrent run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// Each thread's answers, in its program order.
    pub threads: Vec<Vec<Answer>>,
    /// The probes' answers.
    pub probes: Vec<Answer>,
}

impl Run {
    /// How many units the threads' admitted checks spent: `calls` are the
    /// scenario's threads, in the same shape as `self.threads`.
    pub fn admitted_units(&self, calls: &[Vec<Call>]) -> u64 {
        self.threads
            .iter()
            .flatten()
            .zip(calls.iter().flatten())
            .filter(|(answer, _)| answer.admitted())
            .map(|(_, call)| match *call {
                Call::CheckN(_, cost) => cost,
                _ => 1,
            })
            .sum()
    }

    /// How many of the threads' checks were admitted.
    pub fn admitted(&self) -> usize {
        self.threads
            .iter()
            .flatten()
            .filter(|a| a.admitted())
            .count()
    }
}

/// One sequential order of the threads' calls and what it answered.
#[derive(Clone, Debug)]
struct Reference {
    /// For a client created by the race: the time of the call that created
    /// it.
    origin: Option<u64>,
    /// `(thread, index)` of each call, in the order made.
    order: Vec<(usize, usize)>,
    run: Run,
}

/// Runs `scenario` under loom on subject `S`; every interleaving must be
/// explained by a sequential order (see the crate docs), and then `check`
/// runs on the scenario and the run.
///
/// # Panics
///
/// When an interleaving breaks linearisability, the contract rules of the
/// crate docs, or `check`. The message shows the answers; to see the
/// schedule too, rerun the model with `LOOM_LOG=trace LOOM_LOCATION=1`.
pub fn explore<S, F>(scenario: Scenario, check: F)
where
    S: Subject,
    F: Fn(&Scenario, &Run) + Send + Sync + 'static,
{
    assert!(
        (2..=3).contains(&scenario.threads.len()),
        "models race 2 or 3 threads"
    );
    let scenario = Arc::new(scenario);
    // The sequential answers do not depend on any schedule, so they are
    // worked out once, up front. Policy states hold loom objects, which live
    // only inside a model: a model with no threads has exactly one
    // execution, and the branch limit (a guard against spinning) is lifted
    // for it because hundreds of sequential calls are not a spin.
    let references: Arc<OnceLock<Vec<Reference>>> = Arc::new(OnceLock::new());
    {
        let scenario = Arc::clone(&scenario);
        let references = Arc::clone(&references);
        let mut builder = loom::model::Builder::new();
        builder.max_branches = 100_000;
        builder.check(move || {
            references.get_or_init(|| sequential_references::<S>(&scenario));
        });
    }
    model(move || {
        let run = run_concurrently::<S>(&scenario);
        let references = references.get().expect("worked out above");
        let explained = references
            .iter()
            .any(|reference| reference.run == run.0 && run.1.allows(&reference.order));
        assert!(
            explained,
            "no sequential order gives these answers\n  scenario: {scenario:?}\n  \
             concurrent: {:?}\n  sequential orders:\n{}",
            run.0,
            References(references),
        );
        check(&scenario, &run.0);
    });
}

/// Runs `body` under loom, as `loom::model` does, and fails if loom ran it
/// in a single schedule: a model whose threads loom orders only one way
/// proves nothing about their race, and passes whatever the code does.
/// (Seen here: a racing call that only reads, made on the main thread
/// while a spawned thread wrote, was run in one schedule; on the spawned
/// thread the same model explores 44.) Shown with `--nocapture`: how many
/// schedules each model explored.
pub fn model(body: impl Fn() + Sync + Send + 'static) {
    let executions = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&executions);
    loom::model(move || {
        // Relaxed: a plain count, read once the model has finished.
        counted.fetch_add(1, StdOrdering::Relaxed);
        body();
    });
    let executions = executions.load(StdOrdering::Relaxed);
    println!("{executions} interleavings explored");
    assert!(
        executions > 1,
        "loom found one schedule only: the model races nothing"
    );
}

/// Which threads each thread saw finish before it started (real-time mode).
struct Seen(Vec<Vec<bool>>);

impl Seen {
    /// Whether `order` puts all of a thread's calls before those of every
    /// thread that saw it finish.
    fn allows(&self, order: &[(usize, usize)]) -> bool {
        let first = |thread: usize| order.iter().position(|&(t, _)| t == thread);
        let last = |thread: usize| order.iter().rposition(|&(t, _)| t == thread);
        self.0.iter().enumerate().all(|(later, saw)| {
            saw.iter().enumerate().all(|(earlier, &saw)| {
                !saw || match (last(earlier), first(later)) {
                    (Some(last), Some(first)) => last < first,
                    _ => true,
                }
            })
        })
    }
}

fn run_concurrently<S: Subject>(scenario: &Scenario) -> (Run, Seen) {
    let subject = Arc::new(S::new(scenario.config));
    for &call in &scenario.before {
        subject.call(call);
    }
    let finished: Arc<Vec<AtomicBool>> = Arc::new(
        scenario
            .threads
            .iter()
            .map(|_| AtomicBool::new(false))
            .collect(),
    );
    let handles: Vec<_> = scenario
        .threads
        .iter()
        .enumerate()
        .map(|(me, calls)| {
            let subject = Arc::clone(&subject);
            let finished = Arc::clone(&finished);
            let calls = calls.clone();
            let real_time = scenario.real_time;
            loom::thread::spawn(move || {
                // Acquire pairs with the Release below: whatever the other
                // thread did before raising its flag happens-before our calls.
                let saw: Vec<bool> = finished
                    .iter()
                    .enumerate()
                    .map(|(other, flag)| real_time && other != me && flag.load(Ordering::Acquire))
                    .collect();
                let answers: Vec<Answer> = calls.iter().map(|&call| subject.call(call)).collect();
                if real_time {
                    finished[me].store(true, Ordering::Release);
                }
                (saw, answers)
            })
        })
        .collect();
    let (seen, threads): (Vec<_>, Vec<_>) = handles
        .into_iter()
        .map(|handle| handle.join().expect("a model thread panicked"))
        .unzip();
    let probes = scenario
        .probes
        .iter()
        .map(|&call| subject.call(call))
        .collect();
    (Run { threads, probes }, Seen(seen))
}

/// Every order of the threads' calls that keeps each thread's program order.
fn interleavings(lengths: &[usize]) -> Vec<Vec<(usize, usize)>> {
    fn extend(
        next: &mut Vec<usize>,
        lengths: &[usize],
        prefix: &mut Vec<(usize, usize)>,
        out: &mut Vec<Vec<(usize, usize)>>,
    ) {
        if prefix.len() == lengths.iter().sum::<usize>() {
            out.push(prefix.clone());
            return;
        }
        for thread in 0..lengths.len() {
            if next[thread] < lengths[thread] {
                prefix.push((thread, next[thread]));
                next[thread] += 1;
                extend(next, lengths, prefix, out);
                next[thread] -= 1;
                prefix.pop();
            }
        }
    }
    let mut out = Vec::new();
    extend(
        &mut vec![0; lengths.len()],
        lengths,
        &mut Vec::new(),
        &mut out,
    );
    out
}

/// Makes `before`, then `calls`, one at a time on a fresh subject; returns
/// their answers and the subject.
fn sequential<S: Subject>(scenario: &Scenario, calls: &[Call]) -> (Vec<Answer>, S) {
    let subject = S::new(scenario.config);
    for &call in &scenario.before {
        subject.call(call);
    }
    let answers = calls.iter().map(|&call| subject.call(call)).collect();
    (answers, subject)
}

/// The sequential histories a concurrent run may match.
///
/// A client created by the race has one more degree of freedom: its creation
/// (the insert that wins) and the creating call's decision are two steps, so
/// another racer's call can be decided on the new state first — judged at
/// the winner's origin if it carries an older time. So the creation is an
/// event of its own: any racer's first call may have created the client, at
/// its time, and then the calls run in any order. A `remaining` at that time
/// creates the client and changes nothing else, so it stands for that event.
fn sequential_references<S: Subject>(scenario: &Scenario) -> Vec<Reference> {
    let mut origins: Vec<Option<u64>> = vec![None];
    if S::CREATED_BY_FIRST_CALL && scenario.before.is_empty() {
        for calls in &scenario.threads {
            if let Some(Call::Check(now) | Call::CheckN(now, _) | Call::Remaining(now)) =
                calls.first()
            {
                origins.push(Some(*now));
            }
        }
    }
    origins
        .into_iter()
        .flat_map(|origin| {
            let mut scenario = scenario.clone();
            if let Some(origin) = origin {
                scenario.before = vec![Call::Remaining(origin)];
            }
            references_after::<S>(&scenario, origin)
        })
        .collect()
}

fn references_after<S: Subject>(scenario: &Scenario, origin: Option<u64>) -> Vec<Reference> {
    let lengths: Vec<usize> = scenario.threads.iter().map(Vec::len).collect();
    interleavings(&lengths)
        .into_iter()
        .map(|order| {
            let calls: Vec<Call> = order.iter().map(|&(t, i)| scenario.threads[t][i]).collect();
            let everything: Vec<Call> = calls.iter().chain(&scenario.probes).copied().collect();
            let (answers, _) = sequential::<S>(scenario, &everything);
            check_contract_rules::<S>(scenario, &everything, &answers);
            let mut threads: Vec<Vec<Answer>> =
                lengths.iter().map(|&n| Vec::with_capacity(n)).collect();
            for (&(thread, _), &answer) in order.iter().zip(&answers) {
                threads[thread].push(answer);
            }
            let probes = answers[calls.len()..].to_vec();
            Reference {
                origin,
                order,
                run: Run { threads, probes },
            }
        })
        .collect()
}

/// The contract rules that hold for any one sequential history: `remaining`
/// is honoured at its instant, and a check with an older `now` is no more
/// lenient than the same check at the latest admitted time.
fn check_contract_rules<S: Subject>(scenario: &Scenario, calls: &[Call], answers: &[Answer]) {
    let times = |call: &Call| match *call {
        Call::Check(now) | Call::CheckN(now, _) | Call::Remaining(now) | Call::Refund(now, ..) => {
            Some(now)
        }
        Call::Clients => None,
    };
    let mut latest_admitted: Option<u64> = None;
    for (k, (call, answer)) in calls.iter().zip(answers).enumerate() {
        let history = || {
            scenario
                .before
                .iter()
                .chain(&calls[..k])
                .copied()
                .collect::<Vec<_>>()
        };
        if let (Call::Remaining(now), Answer::Remaining(remaining)) = (call, answer) {
            // `remaining` checks in a row at the same instant: exactly
            // `remaining` are admitted, then one is rejected.
            let remaining = usize::try_from(*remaining).expect("small in a model");
            let burst = vec![Call::Check(*now); remaining + 1];
            let (_, subject) = sequential::<S>(
                &Scenario {
                    before: history(),
                    ..scenario.clone()
                },
                &[],
            );
            let admitted: Vec<bool> = burst.iter().map(|&c| subject.call(c).admitted()).collect();
            let mut expected = vec![true; remaining];
            expected.push(false);
            assert_eq!(
                admitted,
                expected,
                "remaining({now}) = {remaining} is not what checks at {now} honour after {:?}",
                history()
            );
        }
        if let (Call::Check(now), Some(latest)) = (call, latest_admitted) {
            if *now < latest && answer.admitted() {
                let (_, subject) = sequential::<S>(
                    &Scenario {
                        before: history(),
                        ..scenario.clone()
                    },
                    &[],
                );
                assert!(
                    subject.call(Call::Check(latest)).admitted(),
                    "check({now}) was admitted after {:?}, but check({latest}) would be rejected",
                    history()
                );
            }
        }
        if answer.admitted() {
            latest_admitted = latest_admitted.max(times(call));
        }
    }
}

struct References<'a>(&'a [Reference]);

impl fmt::Display for References<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for reference in self.0 {
            if let Some(origin) = reference.origin {
                write!(f, "    created at {origin}, then")?;
            }
            writeln!(f, "    {:?}: {:?}", reference.order, reference.run)?;
        }
        Ok(())
    }
}
