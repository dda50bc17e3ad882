//! Every call returns, and a panic costs nothing but its call: a check
//! parked across a table rebuild, a key whose `Eq` parks inside the probe,
//! and keys whose `Hash` or `Clone` panic in the middle of a rebuild.
//!
//! Each call that could hang runs under a watchdog (`returns`), which
//! fails the test, naming the call, if it has not returned within
//! [`WATCHDOG`]: a hang is a failure here, never a test that runs until
//! CI's own limit.

use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::time::Duration;

use floodgate::policy::{
    FixedWindow, Gcra, LeakyBucket, Policy, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use floodgate::{build_with, Bounds, Clock, Config, Engine, Limiter, ManualClock, PolicyKind};
use floodgate::{RateLimiter, Tick};

/// How long a call may take before the watchdog calls it hung: far above
/// any of these calls' time on a loaded machine, far below CI's limit.
const WATCHDOG: Duration = Duration::from_secs(30);

/// Runs `call` on its own thread and answers what it returned; fails the
/// test, naming `what`, if it has not returned within [`WATCHDOG`]. A hung
/// call's thread is left spinning: the test has failed by then.
fn returns<T: Send + 'static>(what: &str, call: impl FnOnce() -> T + Send + 'static) -> T {
    let (sent, answer) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        let _ = sent.send(call());
    });
    match answer.recv_timeout(WATCHDOG) {
        Ok(value) => {
            thread.join().unwrap();
            value
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: has not returned after {WATCHDOG:?}")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // The call panicked: its thread's panic is the failure.
            match thread.join() {
                Err(panic) => std::panic::resume_unwind(panic),
                Ok(()) => unreachable!("sent nothing and did not panic"),
            }
        }
    }
}

/// Where a parked call waits: it reaches the first barrier once parked, and
/// goes on past the second.
type Parking = Mutex<Option<(Arc<Barrier>, Arc<Barrier>)>>;

/// A clock that parks the thread reading it once, when armed: inside a
/// check, that is after the look-up found the client's slot and before the
/// decision (a check reads its clock there), as preemption would park it.
#[derive(Clone, Default)]
struct ParkingClock {
    now: Arc<AtomicU64>,
    armed: Arc<AtomicBool>,
    parked: Arc<Parking>,
}

impl Clock for ParkingClock {
    fn now(&self) -> u64 {
        if self.armed.swap(false, SeqCst) {
            let (found, resume) = self.parked.lock().unwrap().clone().unwrap();
            found.wait();
            resume.wait();
        }
        self.now.load(SeqCst)
    }

    fn tick(&self) -> Tick {
        Tick::NANOSECOND
    }
}

/// A `sliding-window` check parked inside its look-up while the table is
/// rebuilt and the client decided more than `L` times through its new
/// entry (or `L` times and then forgotten) returns once it resumes, and
/// its admission lands in the one ring both entries share. It used to spin
/// for ever: the old entry's hint had fallen more than one entry behind.
#[test]
fn a_sliding_window_check_parked_across_a_rebuild_returns() {
    for limit in 1..=3u64 {
        for forget in [false, true] {
            let case = format!("L = {limit}, forgotten: {forget}");
            let clock = ParkingClock::default();
            let (found, resume) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
            *clock.parked.lock().unwrap() = Some((Arc::clone(&found), Arc::clone(&resume)));
            let limiter: Arc<dyn RateLimiter<str>> = build_with::<str, _>(
                PolicyKind::SlidingWindow,
                Config::per_ticks(limit, 1_000).unwrap(),
                Engine::LockFree,
                clock.clone(),
            )
            .unwrap();
            assert!(limiter.check_at("hot", 0).allowed(), "{case}");
            clock.armed.store(true, SeqCst);
            let parked = {
                let limiter = Arc::clone(&limiter);
                std::thread::spawn(move || limiter.check("hot"))
            };
            found.wait();
            // The 33rd new client rebuilds the first table (64 slots, 32
            // of room): "hot" moves while the parked check holds its slot.
            for i in 0..40 {
                limiter.check_at(&format!("k{i}"), 0);
            }
            let through_new = if forget { limit } else { limit + 1 };
            for window in 1..=through_new {
                assert!(limiter.check_at("hot", window * 1_000).allowed(), "{case}");
            }
            if forget {
                assert!(limiter.forget("hot"), "{case}");
            }
            let now = (through_new + 1) * 1_000;
            clock.now.store(now, SeqCst);
            resume.wait();
            let decision = returns(&format!("{case}: the parked check"), move || {
                parked.join().unwrap()
            });
            // The last admission through the new entry left the window at
            // `now`: the parked check is admitted, with `L − 1` left, and
            // every later call sees that admission.
            assert!(decision.allowed(), "{case}: {decision:?}");
            assert_eq!(decision.remaining(), limit - 1, "{case}");
            assert_eq!(limiter.remaining_at("hot", now), limit - 1, "{case}");
        }
    }
}

thread_local! {
    /// Set on the straggler thread: its next comparison of the key "hot"
    /// (the probe that finds the slot) parks at `STALL_AT`'s barriers.
    static STALL: Cell<bool> = const { Cell::new(false) };
}

static STALL_AT: Parking = Mutex::new(None);

/// A key whose `Eq` parks the thread once, when armed on it: a check
/// parked in the middle of its probe, holding the old table's slot.
#[derive(Clone)]
struct StallKey(String);

impl Hash for StallKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

impl PartialEq for StallKey {
    fn eq(&self, other: &Self) -> bool {
        let same = self.0 == other.0;
        if same && self.0 == "hot" && STALL.with(|stall| stall.replace(false)) {
            let (found, resume) = STALL_AT.lock().unwrap().clone().unwrap();
            found.wait();
            resume.wait();
        }
        same
    }
}

impl Eq for StallKey {}

/// The same straggler reached through a key's `Eq` rather than the clock,
/// with `L = 2` and ten admissions through the moved entry: it returns,
/// and is decided on the ring every entry shares.
#[test]
fn a_straggler_parked_in_its_probe_returns() {
    const L: u64 = 2;
    let key = |name: &str| StallKey(name.to_string());
    let limiter: Arc<Limiter<StallKey, SlidingWindow, ManualClock>> = Arc::new(
        Limiter::with_bounds(
            SlidingWindow::new(Config::per_ticks(L, 10).unwrap()).unwrap(),
            ManualClock::new(0),
            Bounds::new(),
        )
        .unwrap(),
    );
    assert!(limiter.check_at(&key("hot"), 0).allowed());
    // The first table (64 slots, room 32) one claim short of a rebuild.
    for i in 0..31 {
        limiter.check_at(&key(&format!("filler-{i}")), 0);
    }
    let (found, resume) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    *STALL_AT.lock().unwrap() = Some((Arc::clone(&found), Arc::clone(&resume)));
    let straggler = {
        let limiter = Arc::clone(&limiter);
        std::thread::spawn(move || {
            STALL.with(|stall| stall.set(true));
            limiter.check_at(&StallKey("hot".into()), 1_000)
        })
    };
    found.wait();
    limiter.check_at(&key("rebuilds"), 0);
    limiter.check_at(&key("rebuilds-2"), 0);
    let mut admitted = 0;
    for t in 1..=5u64 {
        for _ in 0..L {
            admitted += u64::from(limiter.check_at(&key("hot"), t * 100).allowed());
        }
    }
    assert_eq!(admitted, 2 * 5, "L per window of 10 ticks, five windows");
    resume.wait();
    let decision = returns("the straggler's check", move || straggler.join().unwrap());
    // At 1,000 every admission (the last at 500) has left the window.
    assert!(decision.allowed(), "{decision:?}");
    assert_eq!(limiter.remaining_at(&key("hot"), 1_000), L - 1);
}

thread_local! {
    /// Armed on the calling thread only (the tests run side by side): the
    /// next `Hash` of a `PanicKey` named "victim" panics.
    static PANIC_IN_HASH: Cell<bool> = const { Cell::new(false) };
    /// As above, for its `Clone`.
    static PANIC_IN_CLONE: Cell<bool> = const { Cell::new(false) };
    /// As above, for its `Eq`.
    static PANIC_IN_EQ: Cell<bool> = const { Cell::new(false) };
    /// Counts down every `PanicKey` clone on this thread; the one that
    /// takes it from 1 to 0 panics (0 is disarmed).
    static CLONES_LEFT: Cell<u64> = const { Cell::new(0) };
}

/// A key whose `Hash`, `Clone` or `Eq` panics when armed, or whose `Drop`
/// does (`drop_panics`, shared by its copies), and which counts the copies
/// of it alive in `alive`, to find a leaked table.
struct PanicKey {
    name: String,
    alive: Arc<AtomicUsize>,
    drop_panics: Option<Arc<AtomicBool>>,
}

impl PanicKey {
    fn new(name: &str, alive: &Arc<AtomicUsize>) -> Self {
        alive.fetch_add(1, SeqCst);
        Self {
            name: name.to_string(),
            alive: Arc::clone(alive),
            drop_panics: None,
        }
    }
}

impl Hash for PanicKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        if self.name == "victim" && PANIC_IN_HASH.with(|armed| armed.replace(false)) {
            panic!("the victim's Hash panics, once");
        }
        self.name.hash(state)
    }
}

impl Clone for PanicKey {
    fn clone(&self) -> Self {
        if self.name == "victim" && PANIC_IN_CLONE.with(|armed| armed.replace(false)) {
            panic!("the victim's Clone panics, once");
        }
        let left = CLONES_LEFT.with(Cell::get);
        if left > 0 {
            CLONES_LEFT.with(|cell| cell.set(left - 1));
            if left == 1 {
                panic!("the counted-down Clone panics, once");
            }
        }
        let mut copy = Self::new(&self.name, &self.alive);
        copy.drop_panics = self.drop_panics.clone();
        copy
    }
}

impl PartialEq for PanicKey {
    fn eq(&self, other: &Self) -> bool {
        if self.name == "victim" && PANIC_IN_EQ.with(|armed| armed.replace(false)) {
            panic!("the victim's Eq panics, once");
        }
        self.name == other.name
    }
}

impl Eq for PanicKey {}

impl Drop for PanicKey {
    fn drop(&mut self) {
        self.alive.fetch_sub(1, SeqCst);
        if let Some(armed) = &self.drop_panics
            && armed.swap(false, SeqCst)
        {
            panic!("{}'s Drop panics, once", self.name);
        }
    }
}

/// Where the panic comes from.
#[derive(Clone, Copy, Debug)]
enum Panic {
    VictimsClone,
    /// The last client the move clones: nearly every empty slot of the old
    /// table is sealed by then.
    LastClone,
}

/// Checks `name` at 0 until one is refused: its burst is spent.
fn spend<P: Policy>(limiter: &Limiter<PanicKey, P, ManualClock>, key: &PanicKey) {
    for _ in 0..1_000 {
        if !limiter.check_at(key, 0).allowed() {
            return;
        }
    }
    panic!("{}: never refused at one instant", key.name);
}

/// A limiter whose first table (64 slots, room 32) is full: 31 clients
/// and a "victim", each with its burst spent, so the next new client's
/// arrival begins a move. Answers the limiter and the clients' names.
fn full_first_table<P: Policy>(
    alive: &Arc<AtomicUsize>,
) -> (Limiter<PanicKey, P, ManualClock>, Vec<String>) {
    let limiter = Limiter::with_bounds(
        P::new(Config::per_ticks(2, 1_000_000).unwrap()).unwrap(),
        ManualClock::new(0),
        Bounds::new(),
    )
    .unwrap();
    let names: Vec<String> = (0..31)
        .map(|i| format!("client-{i}"))
        .chain(["victim".to_string()])
        .collect();
    for name in &names {
        spend(&limiter, &PanicKey::new(name, alive));
    }
    (limiter, names)
}

/// A panic in a key's `Clone` in the middle of a rebuild reaches
/// the call that rebuilt, and costs nothing else: the victim's check
/// returns, no client that spent its burst is admitted again (none lost),
/// new clients go on being created (none of the inserts loops); and a
/// limiter dropped before any call took the move up leaves no key alive
/// (the table staged for the move is not leaked).
fn panic_mid_rebuild<P: Policy + 'static>(panic: Panic, resumed: bool) {
    let case = format!("{:?}, {panic:?}, move taken up: {resumed}", P::KIND);
    let alive = Arc::new(AtomicUsize::new(0));
    let key = |name: &str| PanicKey::new(name, &alive);
    let (limiter, names) = full_first_table::<P>(&alive);
    let limiter = Arc::new(limiter);
    let newcomer = key("new-1");
    match panic {
        Panic::VictimsClone => PANIC_IN_CLONE.with(|armed| armed.set(true)),
        // One clone for the newcomer's own key (`to_owned`, before its
        // insert finds no room), then one per client moved: the 32nd moved
        // is the last FULL slot in table order.
        Panic::LastClone => CLONES_LEFT.with(|left| left.set(1 + 32)),
    }
    let rebuilt = catch_unwind(AssertUnwindSafe(|| limiter.check_at(&newcomer, 0)));
    PANIC_IN_CLONE.with(|armed| armed.set(false));
    CLONES_LEFT.with(|left| left.set(0));
    assert!(rebuilt.is_err(), "{case}: the rebuilding call panicked");
    if resumed {
        let victim = {
            let limiter = Arc::clone(&limiter);
            let victim = key("victim");
            returns(&format!("{case}: the victim's check"), move || {
                limiter.check_at(&victim, 0)
            })
        };
        assert!(
            !victim.allowed(),
            "{case}: the victim's spent burst is kept"
        );
        // A second rebuild and more: every insert returns.
        let later: Vec<PanicKey> = (0..200).map(|i| key(&format!("later-{i}"))).collect();
        let created = {
            let limiter = Arc::clone(&limiter);
            returns(&format!("{case}: 200 new clients"), move || {
                later
                    .iter()
                    .filter(|k| limiter.check_at(k, 0).allowed())
                    .count()
            })
        };
        assert_eq!(created, 200, "{case}");
        let readmitted: Vec<&String> = names
            .iter()
            .filter(|name| limiter.check_at(&key(name), 0).allowed())
            .collect();
        assert!(
            readmitted.is_empty(),
            "{case}: admitted again: {readmitted:?}"
        );
        assert_eq!(
            limiter.tracked_clients(),
            32 + 200,
            "{case}: the newcomer was not created"
        );
    }
    drop(newcomer);
    drop(Arc::into_inner(limiter).expect("the only owner left"));
    if !resumed {
        // The first table and the one staged for the move that unwound are
        // all the limiter ever had, and its drop frees both at once. (Once
        // a move ended, the outgrown table is the collector's, freed when
        // no pin of any thread of the process is older: not at a point a
        // test with others running beside it can name.)
        assert_eq!(alive.load(SeqCst), 0, "{case}: keys alive after the drop");
    }
}

fn panic_mid_rebuild_every_way<P: Policy + 'static>() {
    for panic in [Panic::VictimsClone, Panic::LastClone] {
        for resumed in [true, false] {
            panic_mid_rebuild::<P>(panic, resumed);
        }
    }
}

#[test]
fn a_panic_mid_rebuild_costs_only_its_call_sliding_window() {
    panic_mid_rebuild_every_way::<SlidingWindow>();
}

#[test]
fn a_panic_mid_rebuild_costs_only_its_call_token_bucket() {
    panic_mid_rebuild_every_way::<TokenBucket>();
}

#[test]
fn a_panic_mid_rebuild_costs_only_its_call_fixed_window() {
    panic_mid_rebuild_every_way::<FixedWindow>();
}

#[test]
fn a_panic_mid_rebuild_costs_only_its_call_sliding_window_counter() {
    panic_mid_rebuild_every_way::<SlidingWindowCounter>();
}

#[test]
fn a_panic_mid_rebuild_costs_only_its_call_gcra() {
    panic_mid_rebuild_every_way::<Gcra>();
}

#[test]
fn a_panic_mid_rebuild_costs_only_its_call_leaky_bucket() {
    panic_mid_rebuild_every_way::<LeakyBucket>();
}

/// A move places its clients by the fingerprints in their slots' tags and
/// runs no key's `Hash`: a victim whose `Hash` would panic is moved by the
/// rebuild a newcomer begins, that call returns, and the victim's state
/// (its spent burst) is where its next look-up finds it.
#[test]
fn a_move_hashes_no_key() {
    let alive = Arc::new(AtomicUsize::new(0));
    let key = |name: &str| PanicKey::new(name, &alive);
    let (limiter, names) = full_first_table::<Gcra>(&alive);
    PANIC_IN_HASH.with(|armed| armed.set(true));
    let rebuilt = catch_unwind(AssertUnwindSafe(|| limiter.check_at(&key("new-1"), 0)));
    let unhashed = PANIC_IN_HASH.with(|armed| armed.replace(false));
    assert!(rebuilt.is_ok(), "the rebuilding call returned");
    assert!(unhashed, "the victim's Hash never ran");
    assert_eq!(limiter.tracked_clients(), 33);
    let readmitted: Vec<&String> = names
        .iter()
        .filter(|name| limiter.check_at(&key(name), 0).allowed())
        .collect();
    assert!(readmitted.is_empty(), "admitted again: {readmitted:?}");
}

/// A pin held for ever in one limiter (a check parked inside its look-up,
/// as a thread stopped in a debugger or a key's `Eq` that never returns
/// would hold it) keeps no other limiter's outgrown tables alive: another
/// limiter grown to 5,000 clients and dropped frees every key it held.
/// It used to keep them all: the collector judged garbage by epoch alone,
/// across every limiter of the process.
#[test]
fn a_stuck_pin_keeps_no_other_limiters_tables_alive() {
    let clock = ParkingClock::default();
    let (found, resume) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    *clock.parked.lock().unwrap() = Some((Arc::clone(&found), Arc::clone(&resume)));
    let stuck: Arc<dyn RateLimiter<str>> = build_with::<str, _>(
        PolicyKind::Gcra,
        Config::per_ticks(5, 1_000).unwrap(),
        Engine::LockFree,
        clock.clone(),
    )
    .unwrap();
    assert!(stuck.check_at("parked", 0).allowed());
    clock.armed.store(true, SeqCst);
    let parked = {
        let stuck = Arc::clone(&stuck);
        std::thread::spawn(move || stuck.check("parked"))
    };
    found.wait(); // pinned inside `stuck`'s look-up from here on

    let alive = Arc::new(AtomicUsize::new(0));
    {
        let other: Limiter<PanicKey, Gcra, ManualClock> = Limiter::with_bounds(
            Gcra::new(Config::per_ticks(5, 100).unwrap()).unwrap(),
            ManualClock::new(0),
            Bounds::new(),
        )
        .unwrap();
        for i in 0..5_000 {
            other.check_at(&PanicKey::new(&format!("counted-{i}"), &alive), 0);
        }
    }
    // The drop frees the current table at once and collects the outgrown
    // ones; a collect running on another thread at that moment leaves them
    // to the next, which unpins trigger: checks of a third limiter here.
    let third: Limiter<u64, Gcra, ManualClock> = Limiter::with_bounds(
        Gcra::new(Config::per_ticks(5, 100).unwrap()).unwrap(),
        ManualClock::new(0),
        Bounds::new(),
    )
    .unwrap();
    let deadline = std::time::Instant::now() + WATCHDOG;
    while alive.load(SeqCst) > 0 && std::time::Instant::now() < deadline {
        for key in 0..1_000 {
            third.check_at(&key, 0);
        }
        std::thread::yield_now();
    }
    assert_eq!(
        alive.load(SeqCst),
        0,
        "keys of a dropped limiter kept alive by another limiter's stuck pin"
    );
    resume.wait();
    returns("the parked check", move || parked.join().unwrap());
}

/// A panic in a key's `Clone` (the new client's own key, made once its
/// place under the cap was taken), `Eq` (in a check's probe, in `forget`)
/// or `Drop` (the limiter's) reaches its caller and costs nothing else:
/// the place is given back, the spent client stays spent and can still be
/// forgotten, and every other key is dropped.
fn panic_elsewhere<P: Policy + 'static>() {
    let case = format!("{:?}", P::KIND);
    let alive = Arc::new(AtomicUsize::new(0));
    let key = |name: &str| PanicKey::new(name, &alive);
    let limiter: Limiter<PanicKey, P, ManualClock> = Limiter::with_bounds(
        P::new(Config::per_ticks(2, 1_000_000).unwrap()).unwrap(),
        ManualClock::new(0),
        Bounds::new()
            .max_clients(3)
            .on_overflow(floodgate::Overflow::Reject),
    )
    .unwrap();
    spend(&limiter, &key("a"));
    spend(&limiter, &key("b"));

    // Clone: the insert's own key. Its place goes back, so the victim
    // still finds one, and the cap then holds.
    let victim = key("victim");
    PANIC_IN_CLONE.with(|armed| armed.set(true));
    let cloned = catch_unwind(AssertUnwindSafe(|| limiter.check_at(&victim, 0)));
    PANIC_IN_CLONE.with(|armed| armed.set(false));
    assert!(cloned.is_err(), "{case}: the Clone panicked");
    assert_eq!(
        limiter.tracked_clients(),
        2,
        "{case}: the place was given back"
    );
    assert!(
        limiter.check_at(&victim, 0).allowed(),
        "{case}: a place for the victim"
    );
    assert!(
        !limiter.check_at(&key("late"), 0).allowed(),
        "{case}: the cap holds"
    );
    assert_eq!(limiter.tracked_clients(), 3, "{case}");

    // Eq: a check's probe and `forget` change nothing when they unwind.
    spend(&limiter, &victim);
    PANIC_IN_EQ.with(|armed| armed.set(true));
    let compared = catch_unwind(AssertUnwindSafe(|| limiter.check_at(&victim, 0)));
    assert!(compared.is_err(), "{case}: the Eq panicked");
    assert!(
        !limiter.check_at(&victim, 0).allowed(),
        "{case}: still spent"
    );
    PANIC_IN_EQ.with(|armed| armed.set(true));
    let forgotten = catch_unwind(AssertUnwindSafe(|| limiter.forget(&victim)));
    PANIC_IN_EQ.with(|armed| armed.set(false));
    assert!(forgotten.is_err(), "{case}: the Eq panicked in forget");
    assert!(
        !limiter.check_at(&victim, 0).allowed(),
        "{case}: not forgotten"
    );
    assert!(
        limiter.forget(&victim),
        "{case}: forgotten once it does not panic"
    );
    assert!(
        limiter.check_at(&victim, 0).allowed(),
        "{case}: begun again"
    );
    drop(victim);

    // Drop: a key that panics as the limiter drops it leaks no other.
    let armed = Arc::new(AtomicBool::new(false));
    let mut doomed = key("doomed");
    doomed.drop_panics = Some(Arc::clone(&armed));
    assert!(limiter.forget(&key("a")));
    assert!(limiter.check_at(&doomed, 0).allowed(), "{case}");
    drop(doomed);
    armed.store(true, SeqCst);
    let dropped = catch_unwind(AssertUnwindSafe(|| drop(limiter)));
    assert!(dropped.is_err(), "{case}: the Drop panicked");
    assert_eq!(alive.load(SeqCst), 0, "{case}: keys left alive");
}

#[test]
fn a_panic_in_a_keys_clone_eq_or_drop_costs_only_its_call() {
    panic_elsewhere::<SlidingWindow>();
    panic_elsewhere::<TokenBucket>();
    panic_elsewhere::<FixedWindow>();
    panic_elsewhere::<SlidingWindowCounter>();
    panic_elsewhere::<Gcra>();
    panic_elsewhere::<LeakyBucket>();
}

/// A clock that panics once, when armed.
#[derive(Clone, Default)]
struct PanickingClock {
    now: Arc<AtomicU64>,
    armed: Arc<AtomicBool>,
}

impl Clock for PanickingClock {
    fn now(&self) -> u64 {
        if self.armed.swap(false, SeqCst) {
            panic!("the clock panics, once");
        }
        self.now.load(SeqCst)
    }

    fn tick(&self) -> Tick {
        Tick::NANOSECOND
    }
}

/// A clock that panics inside a check (a known client's, read after the
/// look-up, and a new client's) reaches the caller and changes nothing:
/// the known client's next check finds its state as it was, and the new
/// client was not created.
#[test]
fn a_panic_in_the_clock_costs_only_its_call() {
    for policy in PolicyKind::ALL {
        let clock = PanickingClock::default();
        let limiter = build_with::<str, _>(
            policy,
            Config::per_ticks(2, 1_000_000).unwrap(),
            Engine::LockFree,
            clock.clone(),
        )
        .unwrap();
        assert!(limiter.check("known").allowed(), "{policy}");
        for key in ["known", "new"] {
            clock.armed.store(true, SeqCst);
            let checked = catch_unwind(AssertUnwindSafe(|| limiter.check(key)));
            assert!(
                checked.is_err(),
                "{policy}: the clock panicked in {key}'s check"
            );
        }
        assert_eq!(limiter.peek("new"), None, "{policy}: not created");
        assert_eq!(limiter.remaining("known"), 1, "{policy}: one of two spent");
        assert!(limiter.check("known").allowed(), "{policy}");
        assert!(!limiter.check("known").allowed(), "{policy}");
    }
}
