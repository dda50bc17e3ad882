//! A check of a known client allocates nothing: every policy, through the
//! monomorphised `Limiter<K, P, C>` and through the boxed `build` forms, with
//! `u64` keys and `String` keys queried by `&str`, on admissions and
//! rejections alike.
//!
//! A counting global allocator counts the allocations made by the thread
//! that runs a closure (a thread-local count, so tests running in parallel
//! on other threads do not disturb it). The count is deterministic: unlike
//! a speed, it can be asserted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use floodgate::policy::{
    FixedWindow, Gcra, LeakyBucket, Policy, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use floodgate::tiers::{TierSpec, Tiers};
use floodgate::{
    build, build_with, Clock, Config, Engine, Limiter, ManualClock, PolicyKind, QuantaClock,
    RateLimiter,
};

/// The system allocator, counting each allocation on the allocating thread.
struct Counting;

thread_local! {
    // Const-initialised and without a destructor: reading or writing it
    // never allocates and never registers anything, so the allocator can
    // touch it without re-entering itself.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: a thread being torn down may still allocate; it is not
    // measuring anything then, so such allocations go uncounted.
    let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
}

// SAFETY: every method forwards its arguments unchanged to `System`, which
// meets `GlobalAlloc`'s contract for them; counting touches only a
// thread-local `Cell` and neither allocates nor unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: the caller upholds `alloc`'s contract (non-zero size),
        // which is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: the caller guarantees `ptr` was allocated by this
        // allocator (so by `System`) with `layout`, and a valid `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Freeing is not counted: a check may legitimately release memory
        // that earlier inserts retired (the map's epoch-based reclamation).
        // SAFETY: the caller guarantees `ptr` came from this allocator (so
        // from `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// How many allocations this thread makes while running `f`.
fn allocations_in(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

/// Limit 4 per 1,000 ticks; calls 7 ticks apart admit and reject in turn.
const LIMIT: u64 = 4;
const WINDOW: u64 = 1_000;
const STEP: u64 = 7;
const CALLS: u64 = 3_000;

fn config() -> Config {
    Config::per_ticks(LIMIT, WINDOW).expect("a valid limit")
}

/// Runs `calls` checks of one already known client through `check`, and
/// returns (allocations, admitted, rejected): the two paths must both run
/// for the assertion to mean anything.
fn count_checks(mut check: impl FnMut(u64) -> bool) -> (u64, u64, u64) {
    // The first call creates the client (that allocates) and lets the map
    // set up this thread's reclamation state; the next few warm every path.
    for at in 0..10 {
        check(at * STEP);
    }
    let (mut admitted, mut rejected) = (0, 0);
    let allocations = allocations_in(|| {
        for call in 10..CALLS {
            if check(call * STEP) {
                admitted += 1;
            } else {
                rejected += 1;
            }
        }
    });
    (allocations, admitted, rejected)
}

fn assert_none(what: &str, (allocations, admitted, rejected): (u64, u64, u64)) {
    assert!(
        admitted > 0 && rejected > 0,
        "{what}: {admitted} admitted, {rejected} rejected"
    );
    assert_eq!(
        allocations,
        0,
        "{what}: allocations in {} known-client checks",
        CALLS - 10
    );
}

/// Through `Limiter<K, P, C>`: `u64` keys on a manual clock (explicit times),
/// `String` keys queried by `&str` on a manual clock, and the default clock.
fn generic<P: Policy>() {
    let kind = P::KIND;

    let by_id: Limiter<u64, P, ManualClock> =
        Limiter::with_clock(P::new(config()).unwrap(), ManualClock::new(0)).unwrap();
    assert_none(
        &format!("{kind} Limiter<u64> check_at"),
        count_checks(|at| by_id.check_at(&42, at).allowed()),
    );
    let (allocations, _, _) = count_checks(|at| by_id.remaining_at(&42, CALLS * STEP + at) > 0);
    assert_eq!(allocations, 0, "{kind} Limiter<u64> remaining_at");

    let clock = ManualClock::new(0);
    let by_name: Limiter<String, P, ManualClock> =
        Limiter::with_clock(P::new(config()).unwrap(), clock.clone()).unwrap();
    assert_none(
        &format!("{kind} Limiter<String> check(&str)"),
        count_checks(|at| {
            clock.set(at);
            by_name.check("app-42").allowed()
        }),
    );

    // The default clock: the same path plus a clock read, at real times
    // (admissions and rejections in whatever mix the loop's speed gives).
    let real: Limiter<u64, P> = Limiter::new(P::new(config()).unwrap());
    real.check(&7);
    let allocations = allocations_in(|| {
        for _ in 0..CALLS {
            std::hint::black_box(real.check(&7));
        }
    });
    assert_eq!(allocations, 0, "{kind} Limiter<u64, _, QuantaClock> check");
}

#[test]
fn known_client_checks_allocate_nothing_through_limiter() {
    generic::<SlidingWindow>();
    generic::<TokenBucket>();
    generic::<FixedWindow>();
    generic::<SlidingWindowCounter>();
    generic::<Gcra>();
    generic::<LeakyBucket>();
}

#[test]
fn known_client_checks_allocate_nothing_through_build() {
    for kind in PolicyKind::ALL {
        let clock = ManualClock::new(0);
        let by_id = build_with::<u64, _>(kind, config(), Engine::LockFree, clock.clone()).unwrap();
        assert_none(
            &format!("{kind} build_with::<u64> check_at"),
            count_checks(|at| by_id.check_at(&42, at).allowed()),
        );
        assert_none(
            &format!("{kind} build_with::<u64> check"),
            count_checks(|at| {
                clock.set(at + CALLS * STEP);
                by_id.check(&43).allowed()
            }),
        );

        let by_name = build::<str>(kind, config()).unwrap();
        assert_none(
            &format!("{kind} build::<str> check_at"),
            count_checks(|at| by_name.check_at("app-42", at).allowed()),
        );
        let real = build::<str>(kind, config()).unwrap();
        real.allow("app-7");
        let allocations = allocations_in(|| {
            for _ in 0..CALLS {
                std::hint::black_box(real.allow("app-7"));
            }
        });
        assert_eq!(allocations, 0, "{kind} build::<str> allow");
    }
}

/// A reload with the rule a tier already has changes nothing, so neither it
/// nor the next check of a known client allocates; a reload to another
/// rule does (the new rule, and each client's carried state), which shows
/// the count sees this path.
#[test]
fn an_identical_reload_and_the_next_check_allocate_nothing() {
    for kind in PolicyKind::ALL {
        let rule = TierSpec::new(kind, config()).unwrap();
        let tiers = Tiers::with_clock("only", rule, |_: &u64| "only", ManualClock::new(0)).unwrap();
        for at in 0..10 {
            tiers.check_at(&42, at * STEP);
        }
        let allocations = allocations_in(|| {
            for at in 10..100 {
                tiers.reload("only", rule).unwrap();
                std::hint::black_box(tiers.check_at(&42, at * STEP));
            }
        });
        assert_eq!(allocations, 0, "{kind}: identical reloads and checks");

        let other = TierSpec::new(kind, Config::per_ticks(LIMIT + 1, WINDOW).unwrap()).unwrap();
        let allocations = allocations_in(|| {
            tiers.reload("only", other).unwrap();
            std::hint::black_box(tiers.check_at(&42, 100 * STEP));
        });
        assert!(
            allocations >= 2,
            "{kind}: {allocations} allocations for a carry-over"
        );
    }
}

/// The counter is live: a new client's key is allocated (its state lives
/// in the table's slot, and a `sliding-window` ring is one more), and the
/// counting sees it (otherwise the zeros above would prove nothing).
#[test]
fn a_new_client_allocates_and_is_counted() {
    for kind in PolicyKind::ALL {
        let limiter = build::<str>(kind, config()).unwrap();
        limiter.allow("warm-up");
        let allocations = allocations_in(|| {
            limiter.allow("a-new-client");
        });
        let least = if kind == PolicyKind::SlidingWindow {
            2
        } else {
            1
        };
        assert!(
            allocations >= least,
            "{kind}: {allocations} allocations for a new String-keyed client"
        );
    }
    let clock = QuantaClock::new();
    assert_eq!(
        allocations_in(|| {
            std::hint::black_box(clock.now());
        }),
        0
    );
}

/// A limiter of `text`'s rules with three known clients, each created and
/// then admitted once more (that first admission of a known client makes
/// the thread's spare frame, for rules kept in one), and `CALLS − 10`
/// checks of them after: (allocations, admitted, refused). Three clients: no table
/// grows, so no other test's thread meets an outgrown table to free in its
/// own unpin (the collector is shared, and its free would count there).
fn known_clients_under(text: &str) -> (u64, u64, u64) {
    let rules: floodgate::RuleSet = text.parse().unwrap();
    let limiter = floodgate::build_rules::<u64, _>(
        &rules,
        floodgate::Engine::LockFree,
        ManualClock::new(0),
        floodgate::Bounds::new(),
    )
    .unwrap();
    for key in 0..3 {
        limiter.check_at(&key, 0);
        assert!(limiter.check_at(&key, 10_000_000).allowed(), "{text}");
    }
    let (mut admitted, mut refused) = (0, 0);
    let allocations = allocations_in(|| {
        for at in 10..CALLS {
            // 1 µs apart, three clients in turn: each asked every 3 µs,
            // above every rule's rate, so both answers run.
            if limiter
                .check_at(&(at % 3), 20_000_000 + at * 1_000)
                .allowed()
            {
                admitted += 1;
            } else {
                refused += 1;
            }
        }
    });
    (allocations, admitted, refused)
}

/// Two one-word rules on one client (`gcra` and a `token-bucket` quota, or
/// `leaky-bucket`) share one 16-byte word, and so does a drip rule beside
/// a window rule (the README's burst and daily quota): a known client's
/// checks, admitted and refused, allocate nothing, through the builder's
/// `Arc<dyn RateLimiter>` too.
#[test]
fn two_rules_in_one_word_allocate_nothing_on_a_known_client() {
    for text in [
        "gcra:10/1ms,token-bucket:1000/1s",
        "leaky-bucket:10/1ms,gcra:100/1s",
        "gcra:10/1ms,fixed-window:10000/1d",
        "sliding-window-counter:1000/1s,token-bucket:10/1ms",
    ] {
        assert_none(text, known_clients_under(text));
    }
}

/// Any other rule set (three rules, two windows, a `sliding-window` log
/// among the rules, two logs, eight rules) keeps its rules' words in a
/// frame that each admission replaces with the thread's spare, keeping the
/// replaced one as the next spare (`policy::Compound`): after the thread's
/// first admission, a known client's checks, admitted and refused,
/// allocate nothing.
///
/// Measured on a thread that never exits: a thread hands its spare frames
/// to the epoch collector when it exits, and garbage waiting there makes
/// every thread's unpins collect now and then, which allocates (the
/// collector's cold path) in whichever test happens to be measuring.
#[test]
fn any_rule_set_allocates_nothing_on_a_known_client() {
    const SETS: [&str; 5] = [
        "gcra:10/1ms,fixed-window:10000/1d,sliding-window-counter:1000/1s",
        "gcra:10/1ms,sliding-window:100/1s",
        "fixed-window:20/1ms,sliding-window-counter:1000/1s",
        "sliding-window:10/1ms,sliding-window:1000/1s,token-bucket:5/1ms",
        "gcra:1/1ms,gcra:2/1ms,gcra:3/1ms,gcra:4/1ms,gcra:5/1ms,gcra:6/1ms,gcra:7/1ms,gcra:8/1ms",
    ];
    let (sender, answers) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for text in SETS {
            let _ = sender.send((text, known_clients_under(text)));
        }
        drop(sender);
        loop {
            std::thread::park();
        }
    });
    let mut measured = 0;
    for (text, counts) in answers {
        assert_none(text, counts);
        measured += 1;
    }
    assert_eq!(measured, SETS.len(), "the measuring thread stopped early");
}
