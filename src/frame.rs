//! Frames: the states of several rules on one client (`policy::Compound`)
//! as one array of words, never changed while it is the client's, replaced
//! whole by one 16-byte compare-and-swap, and recycled through the threads
//! that replaced it. A decision allocates nothing and takes no pin but the
//! crate's own (`store::epoch`), which a keyed check already holds.
//!
//! # The control word
//!
//! ```text
//!  127                          64 63                             1   0
//! +------------------------------+--------------------------------+---+
//! |  version (64)                |  the current frame's address   | R |
//! +------------------------------+--------------------------------+---+
//! ```
//!
//! A frame's first [`HEAD`] words are its head: its length (in [`META`],
//! with bits the owner uses above it) and a word the owner keeps the same
//! in every frame of a client. They are copied and published with the
//! rest, so the client holds nothing but this control word, and a frame
//! whose client is dropped still knows its length (`Framed::drop`).
//!
//! A frame is an array of `AtomicU64` (8-aligned), so its address leaves
//! bit 0 free for the retirement mark `R`. The version counts the frames
//! published on this client and grows by one with each: 2^64 publications
//! are never reached, so the control word never holds the same value twice
//! while `R` is clear, and a CAS that expects a value read earlier succeeds
//! only if nothing was published since (no ABA, though frames are reused).
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

/// The most words a frame holds: its head, and five per rule (a
/// `sliding-window` log among the rules takes five, a window rule two, a
/// drip rule one).
pub(crate) const MAX_WORDS: usize = HEAD + 5 * crate::MAX_RULES;

/// The words of a frame's head: [`META`] and one the owner keeps constant
/// with the frame's contents (`policy::Compound`: the client's origin).
pub(crate) const HEAD: usize = 2;

/// The frame's first word: its length in the low 8 bits ([`len_of`]), the
/// rest the owner's (`policy::Compound`: which words name a log's ring).
/// A frame carries it so that a client's slot holds the control word
/// alone (16 bytes: a slot of 32 with its key and tag, where the length
/// beside it made 64), and a dropped client's frame still finds its spare
/// slot and its rings.
pub(crate) const META: usize = 0;

/// The length a frame's [`META`] word gives. Every frame of one
/// allocation has the same length (a spare serves one length only), so
/// a frame's word 0 always names its own allocation's length.
#[inline(always)]
pub(crate) fn len_of(meta: u64) -> usize {
    (meta & 0xff) as usize
}

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
    (control >> 64) as u64
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
fn control(version: u64, frame: Words) -> u128 {
    (u128::from(version) << 64) | frame as usize as u128
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

/// One client's frame: the control word (layout above). The frame's
/// length is its owner's to pass (`len`, the same for every frame of a
/// client), and is also in the frame's [`META`] word for `Drop`.
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
    /// A client whose frame holds `words` (a head and at least one
    /// rule's word, at most `MAX_WORDS`; word [`META`] names their count).
    pub(crate) fn new(words: &[u64]) -> Self {
        debug_assert!((HEAD + 1..=MAX_WORDS).contains(&words.len()));
        debug_assert_eq!(len_of(words[META]), words.len());
        Self {
            control: AtomicU128::new(control(0, allocate(words))),
        }
    }

    /// Copies the current frame as published into `words` (at least as
    /// many as the frame holds), and answers
    /// the control word that named it, retired or not (module docs).
    /// Progress: a pass repeats only when the control word changed between
    /// its two loads, which only another thread's successful CAS does.
    #[inline(always)]
    pub(crate) fn read(&self, len: usize, words: &mut [u64]) -> Seen {
        debug_assert!(words.len() >= len);
        let _pin = pin();
        loop {
            // Acquire: pairs with the Release of the CAS that published
            // the frame, so its words as published are seen.
            let first = self.control.load(Ordering::Acquire);
            // SAFETY: a frame of `len` words (every frame of a client has
            // its length), read under the pin taken above (module docs).
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

    /// `read` for a caller that does not know the length (a dropped
    /// client's, `Debug`): the frame's own, from its [`META`] word, which
    /// every frame of one allocation holds alike (`len_of`), so reading
    /// that many words stays inside the frame even from a stale copy.
    pub(crate) fn read_whole(&self, words: &mut [u64; MAX_WORDS]) -> (Seen, usize) {
        let len = len_of(self.meta());
        (self.read(len, words), len)
    }

    /// The current frame's [`META`] word. Not validated as `read` is: every
    /// frame of one allocation holds the same length (`len_of`), and the
    /// rest is the owner's to keep the same for every frame of a client.
    pub(crate) fn meta(&self) -> u64 {
        let _pin = pin();
        // SAFETY: the current frame's first word (every frame has one),
        // read under the pin taken above (module docs).
        #[allow(unsafe_code)]
        let head = unsafe { self::words(frame_of(self.control.load(Ordering::Acquire)), 1) };
        head[META].load(Ordering::Relaxed)
    }

    /// Publishes `words` as the client's frame if the control word still
    /// holds what `seen` read (and is not retired): whether it did. The
    /// frame published is this thread's spare, and the one it replaces
    /// becomes the spare (module docs).
    #[inline(always)]
    pub(crate) fn publish(&self, len: usize, seen: Seen, words: &[u64]) -> Result<bool, Retired> {
        if seen.retired() {
            return Err(Retired);
        }
        debug_assert_eq!(len_of(words[META]), len);
        let spare = take_spare(len, &words[..len]);
        let next = control(version(seen.0).wrapping_add(1), spare);
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
    pub(crate) fn write_unshared(&self, len: usize, words: &[u64]) {
        let _pin = pin();
        // SAFETY: this state's own frame, of `len` words, which no other
        // thread can reach.
        #[allow(unsafe_code)]
        let frame = unsafe { self::words(frame_of(self.control.load(Ordering::Relaxed)), len) };
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
        let frame = frame_of(self.control.load(Ordering::Acquire));
        // SAFETY: the current frame, alive while its client is (no other
        // thread reaches a client being dropped); its word 0 is its
        // allocation's length (`len_of`).
        #[allow(unsafe_code)]
        let len = len_of(unsafe { self::words(frame, 1) }[META].load(Ordering::Relaxed));
        debug_assert!(
            (HEAD + 1..=MAX_WORDS).contains(&len),
            "a frame of {len} words"
        );
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
        let (seen, len) = self.read_whole(&mut words);
        f.debug_struct("Framed")
            .field("version", &version(seen.0))
            .field("retired", &seen.retired())
            .field("words", &&words[..len])
            .finish()
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::{Framed, MAX_WORDS, META, SLOTS};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Frames freed, by length: a test counts only its own length's, so
    /// tests running beside it do not move its count.
    pub(super) static FREED: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];

    /// A thread's frames go back when it exits: its spare, and the frames
    /// of the clients it dropped (one to its empty spare slot, the rest to
    /// its bag), are handed to the collector, which frees each once.
    #[test]
    fn an_exiting_threads_frames_are_all_freed_once() {
        // A length no other test uses.
        const LEN: usize = MAX_WORDS - 1;
        let before = FREED[LEN].load(Ordering::Relaxed);
        std::thread::spawn(|| {
            let clients: Vec<Framed> = (0..3)
                .map(|i| {
                    let mut words = [i; LEN];
                    words[META] = LEN as u64;
                    Framed::new(&words)
                })
                .collect();
            let mut words = [0; MAX_WORDS];
            for client in &clients {
                let seen = client.read(LEN, &mut words);
                words[LEN - 1] += 1;
                // The first publication makes the thread's spare: four
                // frames in all, three clients' and one spare.
                assert_eq!(client.publish(LEN, seen, &words), Ok(true));
                let mut again = [0; MAX_WORDS];
                assert_eq!(client.read_whole(&mut again).1, LEN);
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
