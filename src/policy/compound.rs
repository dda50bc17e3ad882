//! Several rules on one client (the contract's "Several limits on one
//! client"), any rules: a request is admitted iff every rule admits it,
//! then every rule counts it, and a refused request changes no rule. One
//! atomic step decides all of them, so no thread ever sees one rule spent
//! and another not, and no thread waits for another.
//!
//! Two rules that fit one 16-byte word take one CAS on it instead
//! ([`Pair`](super::Pair), [`WindowPair`](super::WindowPair)); this is the
//! design for any other mix, up to [`MAX_RULES`](crate::MAX_RULES). The
//! client's rules keep their state words side by side in a frame
//! (`crate::frame`): a drip rule its one word, a window rule its two (the
//! start of its window and its counts; for a window of 2^62 ticks or
//! more, its own `WindowWord`), a `sliding-window` log its count
//! of entries, its latest entry, where its window began and the address of
//! its ring (five), a ring that every frame of the client shares until a
//! refund replaces it (`sliding_window::LogView`, `LogRing`), so no step
//! copies a log. A decision reads
//! a validated copy of the frame, steps every rule on it with the rule's
//! own pure step and, if every rule admits, publishes the new words with
//! one 16-byte CAS of the client's control word (a version and the frame's
//! address). The frame published is the thread's spare, and the one it
//! replaces becomes the spare: after a thread's first admission, no
//! decision allocates, and none pins anything but the crate's own epoch
//! collector, which a keyed check holds already. A refusal writes nothing.
//!
//! It is lock-free as the one-rule CAS loops are (`cell::transition`): a
//! pass repeats only when another thread's CAS succeeded since its read.
//!
//! Each rule keeps the times it keeps alone: a drip rule counts from tick
//! 0 and begins at the client's origin; a window rule's windows start at
//! the origin and whole windows after it (its stored start carries that
//! phase, as [`WindowPair`](super::WindowPair)'s end does), and a call
//! before its window is judged at the window's start, that much later; a
//! log counts from the origin and judges an earlier
//! call at the origin, that much later (`Limiter::decide`'s `lag`). So
//! every rule answers exactly what it would answer alone (a drip rule's
//! time stops at the clock's horizon, 2^62 − 1 ticks, as it does alone; a
//! window rule's and a log's do not), and the limiter keeps no origin
//! (`Origin = ()`).

use super::combine::{beyond, own_answer, Verdict};
use super::pair::WordRule;
use super::sliding_window::{LogRing, LogView, LogWords, Moved};
use super::window_pair::{judge, Counts, Judged, WindowRule};
use super::{sealed, InFlight, Policy, Retired, SlidingWindow, Spent};
use crate::cell::schedule_time;
use crate::frame::{Framed, MAX_WORDS};
use crate::limiter::since_origin;
use crate::{Config, ConfigError, Decision, PolicyKind, RuleAnswers, RuleSet, Tick, MAX_RULES};

// Compound ----------------------------------------------------------------

/// Any rules (one to [`MAX_RULES`]), decided in one atomic step on a
/// frame of all their states, swapped by one 16-byte CAS (module docs).
#[derive(Clone, Debug)]
pub struct Compound {
    parts: Box<[Part]>,
    /// Where each rule's words begin in a frame.
    offsets: [usize; MAX_RULES],
    /// The words of the frame's head: [`HEAD`] if a rule is a log or a
    /// long window, else 0.
    head: usize,
    /// The frame words that hold a log's ring's address, one bit each.
    rings: u64,
    /// Words in a frame.
    len: usize,
    set: RuleSet,
    strictest: usize,
}

/// From how long a window a window rule keeps its own `WindowWord`
/// (`Part::LongWindow`): the judged view of a counter counts the window
/// as its second, so `2W` must fit a `u64`.
const LONG_WINDOW: u64 = 1 << 62;

/// The words of the copies most decisions make (`check_within`).
const SMALL_FRAME: usize = 8;

/// The words of a frame's head, where a rule set with a log or a window
/// of 2^62 ticks or more keeps what those rules need beside their words:
/// [`RINGS`] and [`ORIGIN`]. Set when the state is made, copied into every
/// frame after; other sets' frames have no head (their rules count from
/// tick 0 or carry the origin's phase in their windows' starts).
const HEAD: usize = 2;

/// The head word that marks which frame words name a log's ring, one bit
/// each, for a dropped state to give its rings back.
const RINGS: usize = 0;

/// The head word that holds the client's origin.
const ORIGIN: usize = 1;

/// One rule, as a frame keeps it.
#[derive(Clone, Copy, Debug)]
enum Part {
    /// `gcra`, `leaky-bucket` or `token-bucket`: one word, from tick 0.
    Drip(WordRule),
    /// `fixed-window` or `sliding-window-counter`: two words, the start
    /// of the stored window in the clock's ticks (the client's origin and
    /// whole windows after it) and its counts, judged as
    /// [`WindowPair`](super::WindowPair) judges them: no division unless two
    /// or more windows passed.
    Window(WindowRule),
    /// A window rule whose window is 2^62 ticks or more (146 years of
    /// nanoseconds), where a counter's judged view would not fit a `u64`:
    /// its own `WindowWord` (two words), counted from the origin, as alone.
    LongWindow(WindowRule),
    /// `sliding-window`: the entries committed, the latest one, where its
    /// window began and its ring's address (five words), from the origin.
    Log(SlidingWindow),
    /// `in-flight`: the units held (one word, no time).
    Held(InFlight),
}

impl Part {
    fn words(&self) -> usize {
        match self {
            Self::Drip(_) | Self::Held(_) => 1,
            Self::Window(_) | Self::LongWindow(_) => 2,
            Self::Log(_) => LOG_WORDS,
        }
    }

    fn forgets_after(&self) -> u64 {
        match self {
            Self::Drip(rule) => rule.config().window(),
            Self::Window(rule) | Self::LongWindow(rule) => rule.forgets_after(),
            Self::Log(rule) => rule.forgets_after(),
            Self::Held(rule) => rule.forgets_after(),
        }
    }
}

/// A log's words in a frame: its `LogWords` (four) and its ring's address.
const LOG_WORDS: usize = 5;

/// Where a log's ring's address is among its words.
const RING: usize = 4;

/// One client's state under a [`Compound`]: its frame, and nothing else,
/// so a slot of 32 bytes with its key and tag (the origin, the length and
/// the ring mask beside it made 64: three rules took 291.7 heap bytes a
/// client at 100,000 clients, now 82.0; `benches/README.md`, "The slot
/// holds the control word alone"). The frame's length is in its control
/// word; where the rules need the origin or have rings, the frame's head
/// keeps them (`HEAD`), and the control word's flag says so. It holds one
/// count of each ring its current frame names (`LogRing`), given back
/// when the state is dropped, or, for a ring a refund replaced, once no
/// reader of the replaced frame can be left (`Compound::refund`).
pub struct CompoundState {
    framed: Framed,
}

impl Drop for CompoundState {
    fn drop(&mut self) {
        // No head, no log: no ring to give back.
        if !self.framed.flagged() {
            return;
        }
        let mut words = [0; MAX_WORDS];
        self.framed.read(&mut words);
        for at in positions(words[RINGS]) {
            // SAFETY: the count this state holds for its frame's ring; no
            // other thread reaches the state any more.
            #[allow(unsafe_code)]
            unsafe {
                LogRing::let_go(words[at]);
            }
        }
    }
}

/// The positions of the bits set in `mask`, lowest first.
fn positions(mut mask: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let at = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            at
        })
    })
}

impl std::fmt::Debug for CompoundState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompoundState")
            .field("frame", &self.framed)
            .finish_non_exhaustive()
    }
}

#[inline(always)]
fn wide(words: &[u64], at: usize) -> u128 {
    u128::from(words[at]) | (u128::from(words[at + 1]) << 64)
}

#[inline(always)]
fn put_wide(words: &mut [u64], at: usize, value: u128) {
    words[at] = value as u64;
    words[at + 1] = (value >> 64) as u64;
}

/// A window rule's counts as a frame keeps them: the previous window's in
/// the high half, the current one's in the low half.
#[inline(always)]
fn counts_of(word: u64) -> Counts {
    Counts {
        previous: (word >> 32) as u32,
        current: word as u32,
    }
}

#[inline(always)]
fn counts_word(counts: Counts) -> u64 {
    (u64::from(counts.previous) << 32) | u64::from(counts.current)
}

#[inline(always)]
fn log_words(words: &[u64], at: usize) -> LogWords {
    (words[at], wide(words, at + 1), words[at + 3])
}

#[inline(always)]
fn put_log(words: &mut [u64], at: usize, (n, latest, from): LogWords) {
    words[at] = n;
    put_wide(words, at + 1, latest);
    words[at + 3] = from;
}

/// A call at `now` before the origin is judged at it, `lag` later: a
/// refusal waits that much longer (each window rule alone, as
/// `Policy::measured_from_earlier`).
#[inline(always)]
fn lagged(mut decision: Decision, lag: u64) -> Decision {
    if lag != 0 && !decision.allowed {
        decision.retry_after = decision.retry_after.saturating_add(lag);
    }
    decision
}

impl Compound {
    /// The rules of `rules`, any policies.
    ///
    /// # Errors
    ///
    /// What a rule's policy refuses (nothing, for checked [`Rule`](crate::Rule)s).
    pub fn from_rules(rules: &RuleSet) -> Result<Self, ConfigError> {
        let mut parts = Vec::with_capacity(rules.len());
        for rule in rules.iter() {
            let part = match rule.policy() {
                PolicyKind::SlidingWindow => Part::Log(SlidingWindow::new(rule.config())?),
                PolicyKind::InFlight => Part::Held(InFlight::new(rule.config())?),
                _ => match (WordRule::new(*rule), WindowRule::new(*rule)) {
                    (Some(drip), _) => Part::Drip(drip),
                    (None, Some(window)) if window.config().window() >= LONG_WINDOW => {
                        Part::LongWindow(window)
                    }
                    (None, Some(window)) => Part::Window(window),
                    // What the rule's own policy refuses (every other
                    // policy is a drip or a window rule).
                    (None, None) => match super::any::AnyPolicy::new(*rule) {
                        Err(error) => return Err(error),
                        Ok(_) => unreachable!("a drip or a window rule"),
                    },
                },
            };
            parts.push(part);
        }
        let mut offsets = [0; MAX_RULES];
        let head = if parts
            .iter()
            .any(|part| matches!(part, Part::Log(_) | Part::LongWindow(_)))
        {
            HEAD
        } else {
            0
        };
        let (mut len, mut rings) = (head, 0u64);
        for (i, part) in parts.iter().enumerate() {
            offsets[i] = len;
            len += part.words();
            if let Part::Log(_) = part {
                // At most 2 + 5 × 8 words: a bit of a `u64` each.
                rings |= 1 << (offsets[i] + RING);
            }
        }
        // A frame holds at least two words: one rule alone takes a
        // policy of its own, but a set of one may still be asked for here.
        let len = len.max(2);
        let strictest = rules
            .iter()
            .position(|r| r.config().limit() == rules.strictest().config().limit())
            .unwrap_or(0);
        Ok(Self {
            parts: parts.into_boxed_slice(),
            offsets,
            head,
            rings,
            len,
            set: rules.clone(),
            strictest,
        })
    }

    /// A new client's frame `words` with its head, if it has one (the
    /// rings and `origin`); the state that holds it.
    fn framed(&self, mut words: [u64; MAX_WORDS], origin: u64) -> CompoundState {
        if self.head != 0 {
            words[RINGS] = self.rings;
            words[ORIGIN] = origin;
        }
        self.holding(&words)
    }

    /// The state that holds a frame of `words`, its head (if it has one)
    /// already in them: the one place a state's frame is made, with the
    /// control word's flag saying whether it has a head.
    fn holding(&self, words: &[u64]) -> CompoundState {
        CompoundState {
            framed: Framed::new(&words[..self.len], self.head != 0),
        }
    }

    /// Copies the head of `words`, if the frame has one, into `next`.
    #[inline(always)]
    fn keep_head(&self, words: &[u64], next: &mut [u64]) {
        if self.head != 0 {
            next[RINGS] = words[RINGS];
            next[ORIGIN] = words[ORIGIN];
        }
    }

    /// The client's origin, as a frame's `words` keep it: in the head, or,
    /// for a set without one, 0 (no rule of such a set reads it).
    #[inline(always)]
    fn origin(&self, words: &[u64]) -> u64 {
        if self.head != 0 {
            words[ORIGIN]
        } else {
            0
        }
    }

    /// The origin a window rule's spend is judged from: the client's, or
    /// in a set without a head, its phase, which the window's stored start
    /// carries (windows start at the origin and whole windows after it):
    /// any time of that phase up to the start judges alike.
    fn window_origin(&self, rule: &WindowRule, words: &[u64], at: usize) -> u64 {
        if self.head != 0 {
            self.origin(words)
        } else {
            words[at] % rule.config().window()
        }
    }

    /// Rule `i`'s log over its ring, as `words` (a copy of `state`'s
    /// frame) have it. The caller holds `pin_logs`'s pin, taken before the
    /// copy was read, or `state` alone, or a retired `state` (whose frame
    /// no longer changes): the ring the copy names is then alive while the
    /// view is used (`LogRing::at`).
    #[inline(always)]
    fn view<'s>(&self, i: usize, _state: &'s CompoundState, words: &[u64]) -> LogView<'s> {
        let at = self.offsets[i];
        // SAFETY: the frame named the ring when it was read, and the caller
        // holds it alive (above).
        #[allow(unsafe_code)]
        let ring = unsafe { LogRing::at(words[at + RING]) };
        LogView::new(ring, log_words(words, at))
    }

    /// Writes each log's latest entry of `words` into its ring if no one
    /// has (`LogView::help`): what a frame that admits must do before its
    /// CAS replaces `words`' frame, so that every entry of a current frame
    /// but its latest is in its ring (`LogView`). Refusals skip it: they
    /// write nothing. `Moved` if a ring showed the frame stale (another
    /// thread published a later one). Each `help` retries only while
    /// another helper writes the same entry (its own progress note).
    ///
    /// Always inlined, and its loop out of line (`help_rings`): a rule set
    /// without a log pays one branch an admission here, where the call
    /// the compiler kept cost 19 instructions of a three-rule admission's
    /// 568 (`benches/README.md`, "A log's help, out of line").
    #[inline(always)]
    fn help_logs(&self, state: &CompoundState, words: &[u64]) -> Result<(), Moved> {
        if self.rings == 0 {
            return Ok(());
        }
        self.help_rings(state, words)
    }

    /// `help_logs` of a rule set with a log.
    #[inline(never)]
    fn help_rings(&self, state: &CompoundState, words: &[u64]) -> Result<(), Moved> {
        for (i, part) in self.parts.iter().enumerate() {
            if let Part::Log(_) = part {
                self.view(i, state, words).help()?;
            }
        }
        Ok(())
    }

    /// A pin for a pass that reads logs' rings (`view`), taken before its
    /// frame is read; none when no rule is a log.
    #[inline(always)]
    fn pin_logs(&self) -> Option<crate::frame::Pin> {
        (self.rings != 0).then(crate::frame::pin)
    }

    /// Gives back the rings `next` names in place of `words`' (built by a
    /// refund that was not published): never anyone's but this thread's.
    fn drop_built(&self, words: &[u64], next: &[u64]) {
        for at in positions(self.rings) {
            if next[at] != words[at] {
                // SAFETY: built by this pass and never published.
                #[allow(unsafe_code)]
                unsafe {
                    LogRing::let_go(next[at]);
                }
            }
        }
    }

    /// The window a call at `now` is judged in by the window rule whose
    /// words begin at `at`. The clock is not stopped at the horizon, as a
    /// window rule alone does not stop it: its start and the call's time
    /// are both at most 2^64 − 1, and `judge` adds in 128 bits.
    #[inline(always)]
    fn judged(rule: &WindowRule, words: &[u64], at: usize, now: u64) -> Judged {
        let width = rule.config().window();
        judge(
            counts_of(words[at + 1]),
            u128::from(words[at]) + u128::from(width),
            now,
            width,
        )
    }

    /// The start of the window `judged`, as a frame keeps it: the end less
    /// a window, at most the later of the call's time and the stored
    /// start, both `u64`s, so it fits one.
    #[inline(always)]
    fn start_of(rule: &WindowRule, judged: Judged) -> u64 {
        (judged.end - u128::from(rule.config().window())) as u64
    }

    /// A window rule's words as the rule's own `WindowWord` (counted from
    /// the client's origin, as alone), for the cold paths that hand a
    /// rule's state to the rule: the start's whole windows past the origin.
    fn window_word(rule: &WindowRule, words: &[u64], at: usize, origin: u64) -> u128 {
        let counts = counts_of(words[at + 1]);
        crate::cell::WindowWord {
            window: words[at].saturating_sub(origin) / rule.config().window(),
            previous: counts.previous,
            current: counts.current,
        }
        .pack()
    }

    /// The words of a window rule whose own `WindowWord` is `word`, its
    /// windows counted from `origin`.
    fn window_words(rule: &WindowRule, word: u128, origin: u64, words: &mut [u64], at: usize) {
        let word = crate::cell::WindowWord::unpack(word);
        let start =
            u128::from(word.window) * u128::from(rule.config().window()) + u128::from(origin);
        words[at] = u64::try_from(start).unwrap_or(u64::MAX);
        words[at + 1] = counts_word(Counts {
            previous: word.previous,
            current: word.current,
        });
    }

    /// Rule `i`'s own decision on `words` for `1 <= cost <= L`, writing
    /// its next words into `next` if it admits; `Moved` if a log's ring
    /// showed the frame stale. An admission answers what it leaves only if
    /// `counted` (a window rule's `remaining` may take a division; once an
    /// earlier rule refused, the verdict asks the rules that admitted for
    /// their `remaining(now)` only if it can matter).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn part_step(
        &self,
        i: usize,
        state: &CompoundState,
        words: &[u64],
        now: u64,
        cost: u64,
        counted: bool,
        next: &mut [u64],
    ) -> Result<Decision, Moved> {
        let at = self.offsets[i];
        Ok(match &self.parts[i] {
            Part::Drip(rule) => {
                let step = rule.step(words[at], schedule_time(now), cost);
                if let Some(word) = step.next {
                    next[at] = word;
                }
                step.decision
            }
            Part::Window(rule) => {
                let mut step = |rule| Self::window_step(rule, words, at, now, cost, counted, next);
                // Each kind of window rule as a value of its own variant, so
                // the step inlined below matches on no kind (`window_step`).
                match *rule {
                    WindowRule::Fixed(rule) => step(WindowRule::Fixed(rule)),
                    WindowRule::Counter(rule) => step(WindowRule::Counter(rule)),
                }
            }
            Part::LongWindow(rule) => {
                let (since, lag) = since_origin(self.origin(words), now);
                let step = rule.step(wide(words, at), since, cost, counted);
                if let Some(word) = step.next {
                    put_wide(next, at, word);
                }
                lagged(step.decision, lag)
            }
            Part::Log(rule) => {
                let (since, lag) = since_origin(self.origin(words), now);
                let (decision, admitted) =
                    rule.view_check(&self.view(i, state, words), since, cost)?;
                if let Some(log) = admitted {
                    put_log(next, at, log);
                    next[at + RING] = words[at + RING];
                }
                lagged(decision, lag)
            }
            Part::Held(rule) => {
                let step = rule.step(words[at], cost);
                if let Some(word) = step.next {
                    next[at] = word;
                }
                step.decision
            }
        })
    }

    /// A window rule's step on the words that begin at `at` (`part_step`),
    /// for a `rule` the caller built as the variant it matched.
    #[inline(always)]
    fn window_step(
        rule: WindowRule,
        words: &[u64],
        at: usize,
        now: u64,
        cost: u64,
        counted: bool,
        next: &mut [u64],
    ) -> Decision {
        let judged = Self::judged(&rule, words, at, now);
        let (decision, counts) = rule.decide(judged, now, cost, counted);
        if let Some(counts) = counts {
            next[at] = Self::start_of(&rule, judged);
            next[at + 1] = counts_word(counts);
        }
        decision
    }

    /// Rule `i`'s `remaining` at `now` on `words`; `Moved` if a log's ring
    /// showed the frame stale.
    #[inline]
    fn part_remaining(
        &self,
        i: usize,
        state: &CompoundState,
        words: &[u64],
        now: u64,
    ) -> Result<u64, Moved> {
        let at = self.offsets[i];
        match &self.parts[i] {
            Part::Drip(rule) => Ok(rule.remaining(words[at], schedule_time(now))),
            Part::Window(rule) => Ok(rule.remaining_in(Self::judged(rule, words, at, now))),
            Part::LongWindow(rule) => {
                Ok(rule.remaining(wide(words, at), since_origin(self.origin(words), now).0))
            }
            Part::Log(rule) => rule.view_remaining(
                &self.view(i, state, words),
                since_origin(self.origin(words), now).0,
            ),
            Part::Held(rule) => Ok(rule.remaining_of(words[at])),
        }
    }

    fn remaining_of(&self, state: &CompoundState, words: &[u64], now: u64) -> Result<u64, Moved> {
        let mut least = u64::MAX;
        for i in 0..self.parts.len() {
            least = least.min(self.part_remaining(i, state, words, now)?);
        }
        Ok(least)
    }

    /// Every rule's step on `words`: the decision, and whether every rule
    /// admitted (then `next` holds the words to publish); `Moved` if a
    /// log's ring showed the frame stale.
    ///
    /// A refusal answers the smallest `remaining(now)` of all rules (the
    /// contract), so the rules that would have admitted are asked theirs.
    #[inline(always)]
    fn step(
        &self,
        state: &CompoundState,
        words: &[u64],
        now: u64,
        cost: u64,
        next: &mut [u64],
    ) -> Result<(Decision, bool), Moved> {
        let mut verdict = Verdict::new(self.part_step(0, state, words, now, cost, true, next)?);
        for i in 1..self.parts.len() {
            // After a refusal, an admission's own `remaining` is never the
            // answer (`Verdict::decision` asks for `remaining(now)`).
            let counted = verdict.admits();
            verdict.add(
                i,
                self.part_step(i, state, words, now, cost, counted, next)?,
            );
        }
        let admitted = verdict.admits();
        let decision = verdict.decision(|i| self.part_remaining(i, state, words, now))?;
        Ok((decision, admitted))
    }

    /// `check_within` with copies of `N` words (at least the frame's).
    ///
    /// Linearised at the CAS that publishes the new frame (an admission),
    /// or at the first load of the control word of the copy it judged (a
    /// refusal).
    ///
    /// Progress: a pass repeats only when its CAS failed, which a strong
    /// CAS does only when another thread published a frame (or marked the
    /// state) since this pass's read, or when a log's ring showed the copy
    /// stale, which also takes another thread's published frame
    /// (`LogView`): lock-free, never a wait.
    #[inline(always)]
    fn check_in<const N: usize>(
        &self,
        state: &CompoundState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, Retired> {
        let mut words = [0; N];
        let mut next = [0; N];
        let _pin = self.pin_logs();
        loop {
            let seen = state.framed.read(&mut words);
            if seen.retired() {
                return Err(Retired);
            }
            let Ok((decision, admitted)) = self.step(state, &words, now, cost, &mut next) else {
                continue;
            };
            if !admitted {
                return Ok(decision);
            }
            // The head goes on unchanged (the rules wrote the rest).
            self.keep_head(&words, &mut next);
            // `Moved`: the ring of a log moved on past this copy's latest
            // entry, which only another thread's published frame does; the
            // next pass reads that frame (progress, above).
            if self.help_logs(state, &words).is_err() {
                continue;
            }
            // Every rule admitted, so every rule wrote its words in `next`.
            if state.framed.publish(seen, &next)? {
                return Ok(decision);
            }
        }
    }

    /// The start of the latest window a window rule's words hold, in the
    /// clock's ticks (0 without window rules): a time the state reflects.
    fn latest_start(&self, words: &[u64]) -> u64 {
        let mut latest = 0;
        for (i, part) in self.parts.iter().enumerate() {
            let off = self.offsets[i];
            let start = match part {
                Part::Window(_) => words[off],
                Part::LongWindow(rule) => {
                    let window = crate::cell::WindowWord::unpack(wide(words, off)).window;
                    self.origin(words)
                        .saturating_add(window.saturating_mul(rule.config().window()))
                }
                Part::Drip(_) | Part::Log(_) | Part::Held(_) => 0,
            };
            latest = latest.max(start);
        }
        latest
    }

    /// Rule `i`'s own refund on `words` (`Policy::refund` of the rule
    /// alone), writing its words after into `next` when it gives
    /// something back: the units it gives.
    fn part_give_back(
        &self,
        i: usize,
        state: &CompoundState,
        words: &[u64],
        (now, ago): (u64, u64),
        cost: u64,
        next: &mut [u64],
    ) -> Result<u64, Moved> {
        let off = self.offsets[i];
        Ok(match &self.parts[i] {
            Part::Drip(rule) => {
                let now = schedule_time(now);
                let (given, word) = rule.give_back(words[off], now, ago, cost);
                // As of `now`, as every design stores a refund's drip word.
                next[off] = rule.settled(word, now);
                given
            }
            Part::Window(rule) => {
                let judged = Self::judged(rule, words, off, now);
                let (given, counts) = rule.give_back_in(judged, now, ago, cost);
                // Written even when it gives nothing, as the pair writes its
                // window word: moved to the window the refund was judged
                // in, which answers every later call alike (an older
                // window's count is spent at any later time).
                next[off] = Self::start_of(rule, judged);
                next[off + 1] = counts_word(counts);
                given
            }
            Part::LongWindow(rule) => {
                let since = since_origin(self.origin(words), now).0;
                let (given, word) = rule.give_back(wide(words, off), since, ago, cost);
                put_wide(next, off, word);
                given
            }
            // A new ring when it gives something back (`view_refund`),
            // named in `next`: the caller publishes it or gives it back.
            Part::Log(rule) => {
                let since = since_origin(self.origin(words), now).0;
                let (given, refunded) =
                    rule.view_refund(&self.view(i, state, words), since, ago, cost)?;
                if let Some((ring, log)) = refunded {
                    put_log(next, off, log);
                    next[off + RING] = ring;
                }
                given
            }
            // Left out by the caller: a release gives held units back.
            Part::Held(_) => 0,
        })
    }

    /// Runs `read` on a validated copy of the current frame until it
    /// answers: a copy a log's ring showed stale (`Moved`) is followed by a
    /// newer one. Progress: `Moved` means another thread's CAS published a
    /// newer frame since the copy was read, and the next pass reads that.
    fn read_current<T>(
        &self,
        state: &CompoundState,
        read: impl Fn(&[u64]) -> Result<T, Moved>,
    ) -> Result<T, Retired> {
        let mut words = [0; MAX_WORDS];
        let _pin = self.pin_logs();
        loop {
            if state.framed.read(&mut words).retired() {
                return Err(Retired);
            }
            if let Ok(answer) = read(&words) {
                return Ok(answer);
            }
        }
    }

    /// Retires the state and answers what each rule had spent, each judged
    /// as its own `retire_spent` judges (a tier's carry-over keeps every
    /// rule's spend, not only the strictest one's).
    pub(crate) fn retire_spent_each(&self, state: &CompoundState, now: u64) -> Vec<Spent> {
        state.framed.retire();
        let mut words = [0; MAX_WORDS];
        state.framed.read(&mut words);
        (0..self.parts.len())
            .map(|i| self.spent_of(i, state, &words, now))
            .collect()
    }

    /// Rule `i`'s spend in a retired frame.
    fn spent_of(&self, i: usize, state: &CompoundState, words: &[u64], now: u64) -> Spent {
        let at = self.offsets[i];
        let (since, _) = since_origin(self.origin(words), now);
        match &self.parts[i] {
            Part::Drip(rule) => rule.spent(words[at], schedule_time(now)),
            Part::Window(rule) => {
                let origin = self.window_origin(rule, words, at);
                let since = since_origin(origin, now).0;
                rule.spent(Self::window_word(rule, words, at, origin), since)
            }
            Part::LongWindow(rule) => rule.spent(wide(words, at), since),
            Part::Log(rule) => rule.view_spent_at(&self.view(i, state, words), since),
            Part::Held(_) => Spent {
                count: words[at],
                at: now,
            },
        }
    }

    /// A state (times counted from tick 0, as a tier counts from each
    /// client's origin) whose rule `i` has spent `spent[i]`, or the last
    /// spend given for a rule beyond them.
    pub(crate) fn spent_state_each(&self, spent: &[Spent]) -> CompoundState {
        let mut words = [0u64; MAX_WORDS];
        for (i, part) in self.parts.iter().enumerate() {
            let Spent { count, at: now } = spent[i.min(spent.len() - 1)];
            let at = self.offsets[i];
            match part {
                Part::Drip(rule) => words[at] = rule.spent_word(count, schedule_time(now)),
                Part::Window(rule) => {
                    Self::window_words(rule, rule.spent_word(count, now), 0, &mut words, at);
                }
                Part::LongWindow(rule) => put_wide(&mut words, at, rule.spent_word(count, now)),
                Part::Log(rule) => {
                    let (ring, log) = rule.view_spent(count, now);
                    put_log(&mut words, at, log);
                    words[at + RING] = ring;
                }
                // Holding what was held (at most a former limit, < 2^32).
                Part::Held(_) => words[at] = count.min(crate::MAX_LIMIT),
            }
        }
        self.framed(words, 0)
    }

    /// A state that goes on from a state's frame `words` (its head
    /// included), its logs sharing their rings.
    fn continued(&self, words: &[u64]) -> CompoundState {
        for at in positions(self.rings) {
            // SAFETY: the frame names the ring and the caller holds the
            // state it was read from (so its count); the new state holds
            // one more.
            #[allow(unsafe_code)]
            unsafe {
                LogRing::share(words[at]);
            }
        }
        self.holding(words)
    }
}

impl sealed::Sealed for Compound {}

impl Policy for Compound {
    type State = CompoundState;
    type Origin = ();
    /// Unused: a compound reports its strictest rule's kind (`kind`).
    const KIND: PolicyKind = PolicyKind::Gcra;
    const SEVERAL: bool = true;

    /// A compound is made from its rules ([`Compound::from_rules`]); one
    /// `Config` names no policies, so this answers
    /// [`ConfigError::RuleCount`].
    fn new(_: Config) -> Result<Self, ConfigError> {
        Err(ConfigError::RuleCount { count: 1 })
    }

    fn config(&self) -> Config {
        self.set[self.strictest].config()
    }

    fn new_state(&self) -> CompoundState {
        self.begin(0)
    }

    /// Each rule begun as it begins alone: a drip rule at `origin`, a
    /// window rule at tick 0 of its own times, which count from `origin`.
    fn begin(&self, origin: u64) -> CompoundState {
        let mut words = [0u64; MAX_WORDS];
        for (i, part) in self.parts.iter().enumerate() {
            let at = self.offsets[i];
            match part {
                Part::Drip(rule) => words[at] = rule.begin(origin),
                Part::Window(rule) => Self::window_words(
                    rule,
                    crate::cell::WindowWord::default().pack(),
                    origin,
                    &mut words,
                    at,
                ),
                Part::LongWindow(_) => {
                    put_wide(&mut words, at, crate::cell::WindowWord::default().pack());
                }
                Part::Log(rule) => {
                    let (ring, log) = rule.view_begin();
                    put_log(&mut words, at, log);
                    words[at + RING] = ring;
                }
                // Holding nothing: the word is 0 already.
                Part::Held(_) => {}
            }
        }
        self.framed(words, origin)
    }

    #[inline]
    fn check_n(&self, state: &CompoundState, now: u64, cost: u64) -> Result<Decision, Retired> {
        if cost == 0 || cost > self.config().limit() {
            let remaining = self.remaining(state, now)?;
            return Ok(beyond(&self.set, cost, remaining).expect("cost 0 or above a limit"));
        }
        self.check_within(state, now, cost)
    }

    /// Always inlined, as `check_within`.
    #[inline(always)]
    fn check(&self, state: &CompoundState, now: u64) -> Result<Decision, Retired> {
        self.check_within(state, now, 1)
    }

    /// Linearised and lock-free as `Compound::check_in` says. Always
    /// inlined into the limiter's hot path: returned from a call, the
    /// decision is stored field by field and loaded back wider, a store
    /// forward that stalls (a third of a decision's time, measured).
    #[inline(always)]
    fn check_within(
        &self,
        state: &CompoundState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, Retired> {
        // The copies live on the stack, as small as the frame allows: most
        // rule sets (three rules, or a log beside a drip rule) fit the
        // small ones, which cost a decision a quarter of the zeroing.
        if self.len <= SMALL_FRAME {
            self.check_in::<SMALL_FRAME>(state, now, cost)
        } else {
            self.check_in::<MAX_WORDS>(state, now, cost)
        }
    }

    fn check_unshared(
        &self,
        state: CompoundState,
        now: u64,
        cost: u64,
    ) -> (CompoundState, Decision) {
        let mut words = [0; MAX_WORDS];
        state.framed.read(&mut words);
        let mut next = [0; MAX_WORDS];
        self.keep_head(&words, &mut next);
        let (decision, admitted) = self
            .step(&state, &words, now, cost, &mut next)
            .expect("no other thread moves a new state's log");
        if admitted {
            self.help_logs(&state, &words)
                .expect("no other thread moves a new state's log");
            state.framed.write_unshared(&next);
        }
        (state, decision)
    }

    fn remaining(&self, state: &CompoundState, now: u64) -> Result<u64, Retired> {
        self.read_current(state, |words| self.remaining_of(state, words, now))
    }

    /// Every rule gives back on its own, all in one publication of a new
    /// frame (or none, when nothing comes back); the answer is the
    /// smallest of the rules'. A log that gives back names a new ring in
    /// that frame (`view_refund`): published, the state's count of the
    /// ring it replaces is given back once no reader of the old frame can
    /// be left; not published, the new ring is dropped.
    ///
    /// Progress: a pass repeats only when its publication's CAS failed,
    /// which takes another thread's published frame (or mark) since this
    /// pass's read, or when a log's ring showed the copy stale, which also
    /// takes another thread's published frame (`LogView`).
    fn refund(&self, state: &CompoundState, now: u64, ago: u64, cost: u64) -> Result<u64, Retired> {
        let mut words = [0; MAX_WORDS];
        let mut next = [0; MAX_WORDS];
        let _pin = self.pin_logs();
        'pass: loop {
            let seen = state.framed.read(&mut words);
            if seen.retired() {
                return Err(Retired);
            }
            next[..self.len].copy_from_slice(&words[..self.len]);
            // Judged no earlier than any window rule's stored window (time
            // went back), as the pairs judge it: the admission is then
            // that much longer ago.
            let judged = self.latest_start(&words).max(now);
            let ago = ago.saturating_add(judged - now);
            let now = judged;
            // `in-flight` rules are left out (0 when every rule is one).
            let mut least = None::<u64>;
            let mut any = false;
            for i in 0..self.parts.len() {
                if let Part::Held(_) = self.parts[i] {
                    continue;
                }
                let Ok(given) = self.part_give_back(i, state, &words, (now, ago), cost, &mut next)
                else {
                    self.drop_built(&words, &next);
                    continue 'pass;
                };
                least = Some(least.map_or(given, |least| least.min(given)));
                any |= given > 0;
            }
            let answer = least.unwrap_or(0);
            if !any {
                return Ok(answer);
            }
            match state.framed.publish(seen, &next) {
                Ok(true) => {
                    for at in positions(self.rings) {
                        if next[at] != words[at] {
                            // SAFETY: the state's count of the ring its
                            // frame named until this publication, given
                            // back once; a reader of that frame holds a pin
                            // taken before it read it (`pin_logs`).
                            #[allow(unsafe_code)]
                            unsafe {
                                LogRing::let_go_later(words[at]);
                            }
                        }
                    }
                    return Ok(answer);
                }
                Ok(false) => self.drop_built(&words, &next),
                Err(Retired) => {
                    self.drop_built(&words, &next);
                    return Err(Retired);
                }
            }
        }
    }

    /// Every `in-flight` rule gives back `min(cost, held)` on its own, all
    /// in one publication (or none, when nothing comes back); the answer
    /// is the smallest, 0 without such a rule.
    ///
    /// Progress: as `refund`'s.
    fn release(&self, state: &CompoundState, _now: u64, cost: u64) -> Result<u64, Retired> {
        let mut words = [0; MAX_WORDS];
        let mut next = [0; MAX_WORDS];
        loop {
            let seen = state.framed.read(&mut words);
            if seen.retired() {
                return Err(Retired);
            }
            next[..self.len].copy_from_slice(&words[..self.len]);
            let mut least = None::<u64>;
            for (i, part) in self.parts.iter().enumerate() {
                if let Part::Held(_) = part {
                    let at = self.offsets[i];
                    let (released, held) = InFlight::let_go(words[at], cost);
                    if let Some(held) = held {
                        next[at] = held;
                    }
                    least = Some(least.map_or(released, |least| least.min(released)));
                }
            }
            let released = least.unwrap_or(0);
            let changed = next[..self.len] != words[..self.len];
            if !changed || state.framed.publish(seen, &next)? {
                return Ok(released);
            }
        }
    }

    /// Idle when every rule is, each judged as it is alone (a window rule
    /// never before the origin); marked with one CAS on the frame that
    /// was judged, so an admission since then keeps it.
    fn retire_if_idle(&self, state: &CompoundState, now: u64) -> bool {
        // Progress: the CAS fails only when another thread published a
        // frame since the read; the next pass judges that one.
        let mut copy = [0; MAX_WORDS];
        let _pin = self.pin_logs();
        loop {
            let seen = state.framed.read(&mut copy);
            if seen.retired() {
                return false;
            }
            let words = &copy;
            let since = now.checked_sub(self.origin(words));
            let idle = self.parts.iter().enumerate().all(|(i, part)| {
                let at = self.offsets[i];
                match part {
                    Part::Drip(_) => WordRule::idle(words[at], schedule_time(now)),
                    Part::Window(rule) => {
                        let judged = Self::judged(rule, words, at, now);
                        judged.before == 0 && rule.idle_in(judged)
                    }
                    Part::LongWindow(rule) => {
                        since.is_some_and(|since| rule.idle(wide(words, at), since))
                    }
                    Part::Log(rule) => since
                        .is_some_and(|since| rule.view_idle(&self.view(i, state, words), since)),
                    // Held units come back only by a release.
                    Part::Held(_) => words[at] == 0,
                }
            });
            if !idle {
                return false;
            }
            if state.framed.retire_if_unchanged(seen) {
                return true;
            }
        }
    }

    /// The strictest rule's spend (what a carry-over of one count keeps).
    fn retire_spent(&self, state: &CompoundState, now: u64) -> Spent {
        state.framed.retire();
        let mut words = [0; MAX_WORDS];
        state.framed.read(&mut words);
        self.spent_of(self.strictest, state, &words, now)
    }

    fn spent_state(&self, spent: u64, now: u64) -> CompoundState {
        Compound::spent_state_each(
            self,
            &[Spent {
                count: spent,
                at: now,
            }],
        )
    }

    fn spent_state_each(&self, spent: &[u64], now: u64) -> CompoundState {
        let spent: Vec<Spent> = spent
            .iter()
            .map(|&count| Spent { count, at: now })
            .collect();
        Compound::spent_state_each(self, &spent)
    }

    fn is_retired(&self, state: &CompoundState) -> bool {
        state.framed.is_retired()
    }

    /// The origin (0 for a set whose frames keep none: its window rules
    /// carry the origin's phase in their starts), then each rule's words
    /// in the set's order: a drip
    /// rule's one, a window rule's two, nothing for an `in-flight` rule,
    /// and for a log its ring's floor, its count of entries and each entry
    /// (time and units) inside its window (`view_saved`). One frame, read
    /// once (a log's entries as of that frame).
    fn save_words(&self, state: &CompoundState, out: &mut Vec<u64>) -> Result<(), Retired> {
        let saved = self.read_current(state, |words| {
            let mut saved = vec![self.origin(words)];
            for (i, part) in self.parts.iter().enumerate() {
                let at = self.offsets[i];
                match part {
                    Part::Drip(_) => saved.push(words[at]),
                    Part::Window(_) | Part::LongWindow(_) => saved.extend(&words[at..at + 2]),
                    Part::Held(_) => {}
                    Part::Log(rule) => {
                        let (floor, entries) = rule.view_saved(&self.view(i, state, words))?;
                        saved.extend([floor, entries.len() as u64]);
                        saved.extend(entries.iter().flat_map(|&(time, units)| [time, units]));
                    }
                }
            }
            Ok(saved)
        })?;
        out.extend(saved);
        Ok(())
    }

    /// Every rule's words checked before any log's ring is built, so a
    /// refused load leaves nothing behind.
    fn load_words(&self, words: &[u64]) -> Option<CompoundState> {
        let (&origin, mut rest) = words.split_first()?;
        let mut frame = [0u64; MAX_WORDS];
        let mut logs = Vec::new();
        for (i, part) in self.parts.iter().enumerate() {
            let at = self.offsets[i];
            let mut take = |n: usize| {
                let (taken, left) = rest.split_at_checked(n)?;
                rest = left;
                Some(taken)
            };
            match part {
                Part::Drip(_) => frame[at] = crate::cell::loaded_word(take(1)?)?,
                Part::Window(rule) => {
                    let taken = take(2)?;
                    let counts = counts_of(taken[1]);
                    let word = crate::cell::WindowWord {
                        window: 0,
                        previous: counts.previous,
                        current: counts.current,
                    };
                    if !word.holds_at_most(rule.config().limit(), rule.counts() == 2) {
                        return None;
                    }
                    frame[at..at + 2].copy_from_slice(taken);
                }
                Part::LongWindow(rule) => {
                    let word = crate::cell::loaded_wide_word(take(2)?)?;
                    let limit = rule.config().limit();
                    if !crate::cell::WindowWord::unpack(word)
                        .holds_at_most(limit, rule.counts() == 2)
                    {
                        return None;
                    }
                    put_wide(&mut frame, at, word);
                }
                // Holding nothing: the word is 0 already.
                Part::Held(_) => {}
                Part::Log(rule) => {
                    let [floor, count] = *take(2)? else {
                        return None;
                    };
                    let pairs = usize::try_from(count).ok()?.checked_mul(2)?;
                    logs.push((i, floor, rule.loaded_entries(take(pairs)?)?));
                }
            }
        }
        if !rest.is_empty() {
            return None;
        }
        for (i, floor, entries) in logs {
            let Part::Log(rule) = &self.parts[i] else {
                unreachable!("only logs were kept")
            };
            let at = self.offsets[i];
            let (ring, log) = rule.view_of_entries(&entries, floor);
            put_log(&mut frame, at, log);
            frame[at + RING] = ring;
        }
        Some(self.framed(frame, origin))
    }

    /// The state frozen, and continued in a new one whose logs share their
    /// rings: a call that raced with the freeze looks the client up again
    /// and goes on through the new state, on the same ring.
    fn relocate(&self, state: &CompoundState) -> Option<CompoundState> {
        if !state.framed.retire() {
            return None;
        }
        let mut words = [0; MAX_WORDS];
        state.framed.read(&mut words);
        Some(self.continued(&words))
    }

    fn forgets_after(&self) -> u64 {
        self.parts
            .iter()
            .map(Part::forgets_after)
            .max()
            .unwrap_or(0)
    }

    /// A call before the origin waits the lag longer, as each rule alone
    /// (its wait to be admitted, or a shaper's delay).
    fn measured_from_earlier(&self, mut decision: Decision, lag: u64) -> Decision {
        if !decision.allowed {
            decision.retry_after = decision.retry_after.saturating_add(lag);
        } else if self
            .set
            .iter()
            .any(|r| r.policy() == PolicyKind::LeakyBucket)
        {
            decision.delay = decision.delay.saturating_add(lag);
        }
        decision
    }

    fn kind(&self) -> PolicyKind {
        self.set[self.strictest].policy()
    }

    fn rule_set(&self) -> RuleSet {
        self.set.clone()
    }

    fn in_ticks_of(&self, tick: Tick) -> Result<Self, ConfigError> {
        Self::from_rules(&self.set.in_ticks_of(tick)?)
    }

    fn each(
        &self,
        state: &CompoundState,
        now: u64,
        cost: u64,
        decided: &Decision,
    ) -> Result<RuleAnswers, Retired> {
        self.read_current(state, |words| {
            let mut answers = RuleAnswers::default();
            let mut scratch = [0u64; MAX_WORDS];
            for i in 0..self.parts.len() {
                let limit = self.set[i].config().limit();
                let stepped = if !decided.allowed && cost >= 1 && cost <= limit {
                    Some(self.part_step(i, state, words, now, cost, true, &mut scratch)?)
                } else {
                    None
                };
                answers.push(own_answer(
                    self.set[i],
                    cost,
                    stepped,
                    self.part_remaining(i, state, words, now)?,
                ));
            }
            Ok(answers)
        })
    }
}
