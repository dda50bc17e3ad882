//! Frames: the states of several rules on one client (`policy::Compound`)
//! as one array of words, never changed while it is the client's, replaced
//! whole by one 16-byte compare-and-swap, and recycled through the threads
//! that replaced it. A decision allocates nothing and takes no pin but the
//! crate's own (`store::epoch`), which a keyed check already holds.
//!
//! # The control word
//!
//! ```text
//!  127 126     120 119             64 63                             1   0
//! +---+----------+-----------------+--------------------------------+---+
//! | F | len (7)  |  version (56)   |  the current frame's address   | R |
//! +---+----------+-----------------+--------------------------------+---+
//! ```
//!
//! A frame is an array of `AtomicU64` (8-aligned), so its address leaves
//! bit 0 free for the retirement mark `R`. The version counts the frames
//! published on this client and grows by one with each: 2^56 publications
//! on one client (twenty years at a hundred million a second) are never
//! reached, so the control word never holds the same value twice while `R`
//! is clear, and a CAS that expects a value read earlier succeeds only if
//! nothing was published since (no ABA, though frames are reused). `len`
//! is the frame's length in words (at most [`MAX_WORDS`], 42) and `F` a
//! flag its owner sets when the client is made (`policy::Compound`: its
//! frames begin with a head); both are the same for every frame of a
//! client, so the client's slot needs nothing beside this word (a slot of
//! 32 bytes with its key and tag), and a dropped client's frame still
//! knows its length.
//!
//! # Who may write a frame
//!
//! Every frame belongs to exactly one place at a time: it is some client's
//! current frame (its control word names it), or one thread's spare (a
//! thread-local slot per frame length), or waiting to be freed. Only a
//! thread writes, and only its own spare. A decision:
//!
//! 1. reads the client's frame (`read`: a validated copy, below);
//! 2. steps every rule on the copy;
//! 3. if every rule admits, writes the new words into its spare (a new
//!    frame if it has none, the only allocation, once per thread and
//!    length) and publishes it with one CAS of the control word, from the
//!    value read in 1 to `(version + 1, spare)`. The CAS moves two
//!    frames' places at once: the spare becomes the client's and the
//!    replaced frame becomes this thread's spare. A failed CAS moves
//!    nothing, and the spare stays this thread's for the next pass.
//!
//! A current frame is therefore never written: a CAS that replaces it hands
//! it to the replacing thread, and that thread writes it only after.
//!
//! # A reader of a frame that is being reused
//!
//! A reader may load a frame's address, be delayed, and read the frame
//! after another thread replaced it and began writing it as its spare. The
//! words are atomics, so that read is no data race, only stale; and each
//! read is validated as a seqlock's is (`read`): load the control word
//! (Acquire), copy the words (Relaxed), an Acquire fence, load the control
//! word again; the copy counts only if both loads are equal. The writer
//! issues a Release fence between the CAS that made the frame its spare and
//! its first store into it. If the reader's copy saw one of those stores,
//! the writer's fence synchronises with the reader's, so that CAS happens
//! before the reader's second load, which then reads it or a later value:
//! a different version, and the copy is thrown away. If the copy saw none,
//! it holds the words as published (the first load's Acquire pairs with the
//! publishing CAS's Release). So a copy that counts is one frame as it was
//! published, and a decision is made on it only after that check: no step
//! ever runs on words torn between two frames. The retry is lock-free: the
//! control word changed, which only another thread's successful CAS does.
//!
//! # When a frame is freed
//!
//! A frame is freed only through the crate's epoch collector
//! (`store::epoch`), as garbage of every store (`EVERY_STORE`), which any
//! pin holds back: a thread that exits hands its spares over, and a
//! dropped client's frame goes to the dropping thread's spares or, if it
//! has one of that length, to a bag handed over 64 frames at a time. Every
//! read of a frame is made under a pin of that collector (the keyed
//! store's, or `Guard::frames`), taken before the frame's address was
//! loaded, and a frame handed over is reachable from no control word, so
//! the collector's proof holds: no frame is freed while a reader can still
//! read it. Under the models' cfg nothing is freed (as outgrown tables are
//! kept there, `sync`).
//!
//! A thread holds at most one spare per frame length (2 to
//! [`MAX_WORDS`]) and a bag of fewer than 64: the memory a frame ever
//! takes beyond its client's is bounded by the threads, not the decisions.
//! One case keeps a frame for ever: a decision made from a thread-local
//! destructor that runs after the thread's own frames were handed over
//! leaves its spare in a slot no one empties (at most one per length per
//! such thread).

use std::cell::Cell;
use std::ptr;

use crate::policy::Retired;
use crate::sync::{fence, AtomicU128, AtomicU64, Ordering};

/// The most words a frame holds: a head of two, and five per rule (a
/// `sliding-window` log among the rules takes five, a window rule two, a
/// drip rule one). Below 2^7, the width of `len` in the control word.
pub(crate) const MAX_WORDS: usize = 2 + 5 * crate::MAX_RULES;
const _: () = assert!(MAX_WORDS < 1 << 7, "a frame's length fits `len`");

/// The bits of the control word's version (layout above).
const VERSION: u64 = (1 << 56) - 1;

/// The retirement mark, bit 0 of the address half (layout above).
const MARK: u64 = 1;

/// A frame's first word; the frame is `len` of them from there.
type Words = *mut AtomicU64;

#[inline(always)]
fn address(control: u128) -> u64 {
    control as u64
}

#[inline(always)]
fn version(control: u128) -> u64 {
    (control >> 64) as u64 & VERSION
}

/// The control word's top byte: `F` and `len` (layout above).
#[inline(always)]
fn tag(control: u128) -> u64 {
    (control >> 120) as u64
}

#[inline(always)]
fn len_of(control: u128) -> usize {
    (tag(control) & 0x7f) as usize
}

#[inline(always)]
fn flagged(control: u128) -> bool {
    tag(control) & 0x80 != 0
}

#[inline(always)]
fn frame_of(control: u128) -> Words {
    (address(control) & !MARK) as usize as Words
}

#[inline(always)]
fn is_marked(control: u128) -> bool {
    address(control) & MARK != 0
}

#[inline(always)]
fn control(tag: u64, version: u64, frame: Words) -> u128 {
    (u128::from(tag) << 120) | (u128::from(version & VERSION) << 64) | frame as usize as u128
}

/// A new frame of `words`, not yet anyone's but the caller's.
fn allocate(words: &[u64]) -> Words {
    let frame: Box<[AtomicU64]> = words.iter().map(|&w| AtomicU64::new(w)).collect();
    Box::into_raw(frame).cast::<AtomicU64>()
}

/// A frame's words.
///
/// # Safety
///
/// `frame` was made by `allocate` with `len` words and is not freed while
/// the borrow lives (module docs: every read is under a pin taken before
/// its address was loaded).
#[allow(unsafe_code)]
#[inline(always)]
unsafe fn words<'a>(frame: Words, len: usize) -> &'a [AtomicU64] {
    // SAFETY: the caller's promise; `AtomicU64`s may be shared.
    unsafe { std::slice::from_raw_parts(frame, len) }
}

/// A frame owned by no control word and no spare slot, to be freed.
struct Owned {
    frame: Words,
    len: usize,
}

// SAFETY: a frame is an array of atomics, and an `Owned` is its only owner.
#[allow(unsafe_code)]
unsafe impl Send for Owned {}

impl Drop for Owned {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: made by `allocate` with `len` words, owned by this value
        // alone, and freed once, here.
        drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(self.frame, self.len)) });
        #[cfg(all(test, not(floodgate_loom)))]
        tests::FREED[self.len].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Hands frames no control word names to the collector, to be freed once
/// no pin taken before this call is held (module docs).
#[cfg(not(floodgate_loom))]
fn hand_over(frames: Vec<Owned>) {
    if !frames.is_empty() {
        crate::store::epoch::retire_in(Box::new(frames), crate::store::epoch::EVERY_STORE);
    }
}

/// Kept, under the models' cfg (module docs).
#[cfg(floodgate_loom)]
fn hand_over(frames: Vec<Owned>) {
    std::mem::forget(frames);
}

/// Spare slots: one per frame length, index = length.
const SLOTS: usize = MAX_WORDS + 1;

/// How many dropped clients' frames a thread gathers before handing them
/// over as one piece of garbage.
const BAG: usize = 64;

#[cfg(not(floodgate_loom))]
std::thread_local! {
    /// This thread's spares. A `const` cell with no destructor, so a
    /// decision's access is one thread-local load (`KEEPER` hands them
    /// over when the thread exits).
    static SPARES: [Cell<Words>; SLOTS] = const { [const { Cell::new(ptr::null_mut()) }; SLOTS] };
    /// Dropped clients' frames not yet handed over; its destructor hands
    /// them and the spares over at thread exit.
    static KEEPER: Keeper = const { Keeper { bag: std::cell::RefCell::new(Vec::new()) } };
}

#[cfg(floodgate_loom)]
crate::sync::thread_local! {
    static SPARES: [Cell<Words>; SLOTS] = std::array::from_fn(|_| Cell::new(ptr::null_mut()));
    static KEEPER: Keeper = Keeper { bag: std::cell::RefCell::new(Vec::new()) };
}

struct Keeper {
    bag: std::cell::RefCell<Vec<Owned>>,
}

impl Drop for Keeper {
    fn drop(&mut self) {
        let mut frames = std::mem::take(self.bag.get_mut());
        let _ = SPARES.try_with(|spares| {
            for (len, slot) in spares.iter().enumerate() {
                let frame = slot.replace(ptr::null_mut());
                if !frame.is_null() {
                    frames.push(Owned { frame, len });
                }
            }
        });
        hand_over(frames);
    }
}

/// This thread's spare of `len` words, or a new frame (the first time, or
/// after the thread gave its spare away): the frame is the caller's.
#[inline(always)]
fn take_spare(len: usize, words: &[u64]) -> Words {
    let spare = SPARES.with(|spares| spares[len].replace(ptr::null_mut()));
    if spare.is_null() {
        return first_spare(words);
    }
    // Release: the CAS that made this frame the thread's spare comes
    // before every store below for a reader that sees one of them (module
    // docs, "A reader of a frame that is being reused").
    fence(Ordering::Release);
    // SAFETY: the thread's spare, `len` words, never freed while spare.
    #[allow(unsafe_code)]
    let frame = unsafe { self::words(spare, len) };
    for (word, &value) in frame.iter().zip(words) {
        // Relaxed: published by the CAS's Release (module docs).
        word.store(value, Ordering::Relaxed);
    }
    spare
}

/// A thread's first frame of a length: allocated, and its keeper made, so
/// that the spare it will hold is handed over when the thread exits.
#[cold]
#[inline(never)]
fn first_spare(words: &[u64]) -> Words {
    let _ = KEEPER.try_with(|_| ());
    allocate(words)
}

/// Makes `frame` (`len` words, the caller's) this thread's spare of that
/// length. The slot is empty: the publication calling this emptied it
/// (`take_spare`), and nothing of this thread ran since. Were it not, the
/// frame it held is handed over rather than lost; so is `frame` if the
/// thread's locals are gone.
#[inline(always)]
fn keep_spare(len: usize, frame: Words) {
    match SPARES.try_with(|spares| spares[len].replace(frame)) {
        Ok(kept) if kept.is_null() => {}
        Ok(kept) => hand_over(vec![Owned { frame: kept, len }]),
        Err(_) => hand_over(vec![Owned { frame, len }]),
    }
}

/// A pin under which frames (and a refunded log's rings) are read (module
/// docs): the keyed store's, when the thread holds one.
#[cfg(not(floodgate_loom))]
#[inline(always)]
pub(crate) fn pin() -> Pin {
    crate::store::epoch::Guard::frames()
}

/// What `pin` gives.
#[cfg(not(floodgate_loom))]
pub(crate) type Pin = crate::store::epoch::Guard;

/// No pin under the models' cfg, where no frame is freed.
#[cfg(floodgate_loom)]
pub(crate) struct Pin;

#[cfg(floodgate_loom)]
#[inline(always)]
pub(crate) fn pin() -> Pin {
    Pin
}

/// One client's frame: the control word (layout above), which also holds
/// the frame's length.
pub(crate) struct Framed {
    control: AtomicU128,
}

/// The control word a validated read saw: what a publication expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seen(u128);

impl Seen {
    /// Whether the state was retired when read.
    #[inline(always)]
    pub(crate) fn retired(self) -> bool {
        is_marked(self.0)
    }
}

impl Framed {
    /// A client whose frame holds `words` (2 to `MAX_WORDS` of them), with
    /// the owner's flag `F` set or not (layout above).
    pub(crate) fn new(words: &[u64], flag: bool) -> Self {
        debug_assert!((2..=MAX_WORDS).contains(&words.len()));
        let tag = words.len() as u64 | u64::from(flag) << 7;
        Self {
            control: AtomicU128::new(control(tag, 0, allocate(words))),
        }
    }

    /// The owner's flag `F`, set when the client was made.
    pub(crate) fn flagged(&self) -> bool {
        // Relaxed: every value the word ever holds has the flag it was made
        // with (a publication and a retirement keep the tag), so any value
        // read answers alike.
        flagged(self.control.load(Ordering::Relaxed))
    }

    /// Copies the current frame as published into `words` (at least as
    /// many as the frame holds), and answers
    /// the control word that named it, retired or not (module docs).
    /// Progress: a pass repeats only when the control word changed between
    /// its two loads, which only another thread's successful CAS does.
    #[inline(always)]
    pub(crate) fn read(&self, words: &mut [u64]) -> Seen {
        let _pin = pin();
        loop {
            // Acquire: pairs with the Release of the CAS that published
            // the frame, so its words as published are seen.
            let first = self.control.load(Ordering::Acquire);
            let len = len_of(first);
            debug_assert!(words.len() >= len);
            // SAFETY: a frame of `len` words (every frame of a client has
            // the length its control word names), read under the pin taken
            // above (module docs).
            #[allow(unsafe_code)]
            let frame = unsafe { self::words(frame_of(first), len) };
            for (copy, word) in words.iter_mut().zip(frame) {
                // Relaxed: validated below.
                *copy = word.load(Ordering::Relaxed);
            }
            // Acquire: a copy that saw a reusing writer's store sees that
            // writer's CAS in the load below (module docs).
            fence(Ordering::Acquire);
            if self.control.load(Ordering::Relaxed) == first {
                return Seen(first);
            }
        }
    }

    /// Publishes `words` as the client's frame if the control word still
    /// holds what `seen` read (and is not retired): whether it did. The
    /// frame published is this thread's spare, and the one it replaces
    /// becomes the spare (module docs).
    #[inline(always)]
    pub(crate) fn publish(&self, seen: Seen, words: &[u64]) -> Result<bool, Retired> {
        if seen.retired() {
            return Err(Retired);
        }
        let len = len_of(seen.0);
        let spare = take_spare(len, &words[..len]);
        // The same tag: every frame of a client has its length and flag.
        let next = control(tag(seen.0), version(seen.0).wrapping_add(1), spare);
        // AcqRel: Release publishes the spare's words to the next reader's
        // Acquire; Acquire takes the replaced frame's last readers' view
        // before this thread reuses it (its stores come after the fence in
        // `take_spare`).
        match self
            .control
            .compare_exchange(seen.0, next, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                keep_spare(len, frame_of(seen.0));
                Ok(true)
            }
            Err(now) => {
                keep_spare(len, spare);
                if is_marked(now) {
                    Err(Retired)
                } else {
                    Ok(false)
                }
            }
        }
    }

    /// Writes `words` into the frame of a state no other thread can reach
    /// yet (its publication, by the keyed store, orders them for readers).
    pub(crate) fn write_unshared(&self, words: &[u64]) {
        let _pin = pin();
        let control = self.control.load(Ordering::Relaxed);
        // SAFETY: this state's own frame, of the length its control word
        // names, which no other thread can reach.
        #[allow(unsafe_code)]
        let frame = unsafe { self::words(frame_of(control), len_of(control)) };
        for (word, &value) in frame.iter().zip(words) {
            word.store(value, Ordering::Relaxed);
        }
    }

    /// Marks the state retired; whether this call did. Progress: the CAS
    /// fails only when another thread published a frame (or marked it).
    pub(crate) fn retire(&self) -> bool {
        let mut current = self.control.load(Ordering::Acquire);
        loop {
            if is_marked(current) {
                return false;
            }
            match self.control.compare_exchange(
                current,
                current | u128::from(MARK),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    /// Marks the state retired if it is still as `seen` read it: whether
    /// this call did (a retirement judged on that frame).
    pub(crate) fn retire_if_unchanged(&self, seen: Seen) -> bool {
        !seen.retired()
            && self
                .control
                .compare_exchange(
                    seen.0,
                    seen.0 | u128::from(MARK),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    pub(crate) fn is_retired(&self) -> bool {
        is_marked(self.control.load(Ordering::Acquire))
    }
}

impl Drop for Framed {
    /// The frame goes to this thread's spares, or to its bag (module docs):
    /// a delayed reader of another client may still read it.
    fn drop(&mut self) {
        let control = self.control.load(Ordering::Acquire);
        let (frame, len) = (frame_of(control), len_of(control));
        let placed = SPARES.try_with(|spares| {
            let slot = &spares[len];
            if slot.get().is_null() && KEEPER.try_with(|_| ()).is_ok() {
                slot.set(frame);
                true
            } else {
                false
            }
        });
        if matches!(placed, Ok(true)) {
            return;
        }
        let full = KEEPER.try_with(|keeper| {
            let mut bag = keeper.bag.borrow_mut();
            bag.push(Owned { frame, len });
            (bag.len() >= BAG).then(|| std::mem::take(&mut *bag))
        });
        match full {
            Ok(Some(frames)) => hand_over(frames),
            Ok(None) => {}
            Err(_) => hand_over(vec![Owned { frame, len }]),
        }
    }
}

impl std::fmt::Debug for Framed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut words = [0; MAX_WORDS];
        let seen = self.read(&mut words);
        f.debug_struct("Framed")
            .field("version", &version(seen.0))
            .field("retired", &seen.retired())
            .field("words", &&words[..len_of(seen.0)])
            .finish()
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::{Framed, MAX_WORDS, SLOTS};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Frames freed, by length: a test counts only its own length's, so
    /// tests running beside it do not move its count.
    pub(super) static FREED: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];

    /// The control word keeps its tag (length and flag) through a
    /// publication, the version's wrap included.
    #[test]
    fn the_control_words_tag_outlives_its_version() {
        use super::{control, flagged, len_of, version, VERSION};
        let frame = 8 as super::Words;
        let tag = 42 | 1 << 7;
        let last = control(tag, VERSION, frame);
        assert_eq!(
            (len_of(last), flagged(last), version(last)),
            (42, true, VERSION)
        );
        let next = control(super::tag(last), version(last).wrapping_add(1), frame);
        assert_eq!((len_of(next), flagged(next), version(next)), (42, true, 0));
        assert_ne!(next, last);
        let unflagged = control(5, 7, frame);
        assert_eq!((len_of(unflagged), flagged(unflagged)), (5, false));
    }

    /// A thread's frames go back when it exits: its spare, and the frames
    /// of the clients it dropped (one to its empty spare slot, the rest to
    /// its bag), are handed to the collector, which frees each once.
    #[test]
    fn an_exiting_threads_frames_are_all_freed_once() {
        // A length no other test uses.
        const LEN: usize = MAX_WORDS - 1;
        let before = FREED[LEN].load(Ordering::Relaxed);
        std::thread::spawn(|| {
            let clients: Vec<Framed> = (0..3).map(|i| Framed::new(&[i; LEN], false)).collect();
            let mut words = [0; MAX_WORDS];
            for client in &clients {
                let seen = client.read(&mut words);
                words[0] += 1;
                // The first publication makes the thread's spare: four
                // frames in all, three clients' and one spare.
                assert_eq!(client.publish(seen, &words), Ok(true));
                let mut again = [0; MAX_WORDS];
                client.read(&mut again);
                assert_eq!(again[..LEN], words[..LEN], "the words published");
            }
            drop(clients);
        })
        .join()
        .unwrap();
        // Freed once no pin older than the hand-over is held: other tests'
        // pins end, and a collect frees what they held back.
        for _ in 0..10_000 {
            crate::store::epoch::collect();
            let freed = FREED[LEN].load(Ordering::Relaxed) - before;
            assert!(freed <= 4, "{freed} frees of four frames");
            if freed == 4 {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("the exited thread's frames were not all freed");
    }
}
