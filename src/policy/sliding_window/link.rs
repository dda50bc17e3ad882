//! The sliding log's link: the home ring every copy of a client's state
//! shares, whose last word names the client's current ring once a refund
//! has replaced it, and the rings refunds build (the parent module's
//! "Giving units back"). A client never refunded decides on its home ring
//! and never reaches anything here but `home`.

use std::sync::Arc;

use super::{Frozen, Ring, SlidingWindowState};
use crate::policy::Retired;
use crate::sync::{AtomicU128, AtomicU64, Ordering};

/// A client's first ring: its `L` slots, then the link (module docs,
/// "Giving units back"), `L + 1` words in one allocation, so that a check
/// of a client never refunded reaches its slots as it always did.
#[derive(Debug)]
#[repr(transparent)]
pub(super) struct Home([AtomicU128]);

/// A ring a refund built (module docs, "Giving units back"): reached only
/// through its client's link, under a pin.
pub(super) struct Successor {
    /// Entries committed to `slots`, or one fewer (as the state's own).
    pub(super) committed: AtomicU64,
    /// Where the window began at the last admission here (as the state's
    /// own).
    pub(super) boundary: AtomicU64,
    /// The time the refund was judged at: every call on this ring judges
    /// at this time or later.
    pub(super) floor: u64,
    pub(super) slots: Box<[AtomicU128]>,
}

impl Home {
    /// A home ring of `slots` (`L` of them) and a link of 0.
    #[allow(unsafe_code)]
    pub(super) fn new(slots: impl Iterator<Item = AtomicU128>) -> Arc<Self> {
        let words: Arc<[AtomicU128]> = slots.chain(std::iter::once(AtomicU128::new(0))).collect();
        // SAFETY: `Home` is `repr(transparent)` over `[AtomicU128]`, so a
        // pointer to one means the same data and length as a pointer to the
        // other, and the allocation `into_raw` gives up has the layout an
        // `Arc<Home>` of that length would have (as `Arc<str>` is made from
        // `Arc<[u8]>`); the `Arc` is rebuilt once, from this one pointer.
        unsafe { Arc::from_raw(Arc::into_raw(words) as *const Self) }
    }

    #[inline(always)]
    pub(super) fn slots(&self) -> &[AtomicU128] {
        // Never empty: L >= 1 slots and the link.
        &self.0[..self.0.len() - 1]
    }

    /// Word `L`: 0, or the address of the client's current `Successor`
    /// (held as the low 64 bits).
    #[inline]
    fn link(&self) -> &AtomicU128 {
        &self.0[self.0.len() - 1]
    }
}

impl Drop for Home {
    /// Frees the current successor: the home ring goes with the last copy
    /// of the state, so no thread holds a way to it any more.
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        let link = self.link().load(Ordering::Acquire) as u64;
        if link != 0 {
            // SAFETY: the link names a successor made by `Box::into_raw`
            // (`refund_on`) that no one freed: only the thread that moves
            // the link past a ring retires it (`install`), and this is the
            // link's last value.
            drop(unsafe { Box::from_raw(link as usize as *mut Successor) });
        }
    }
}

impl Successor {
    fn ring(&self) -> Ring<'_> {
        Ring {
            slots: &self.slots,
            committed: &self.committed,
            boundary: &self.boundary,
            floor: self.floor,
        }
    }
}

/// Hands a successor the link moved past to the collector: freed once no
/// pin taken before it is handed over is held (module docs). A thread
/// gathers them and hands them over 64 at a time (or once they hold 1 MiB
/// of slots), as `frame` does dropped clients' frames, so the collector's
/// list is locked once per 64 refunds, not per refund; the rest at thread
/// exit (`RetiredRings`). Handing over later than the link moved is only
/// more careful: the ring is reachable by no pin taken after the move.
#[cfg(not(floodgate_loom))]
#[allow(unsafe_code)]
fn retire_successor(address: u64) {
    // SAFETY: made by `Box::into_raw` (`refund_on`); only the one thread
    // whose CAS moved the link past it gets here, once (`install`).
    let successor = unsafe { Box::from_raw(address as usize as *mut Successor) };
    let mut successor = Some(successor);
    let full = RETIRED_RINGS.try_with(|bag| {
        let mut bag = bag.0.borrow_mut();
        let ring = successor.take().expect("taken once");
        bag.slots += ring.slots.len();
        bag.rings.push(ring);
        (bag.rings.len() >= 64 || bag.slots >= (1 << 20) / 16).then(|| bag.take())
    });
    match (full, successor) {
        (Ok(Some(rings)), _) => hand_over(rings),
        (Ok(None), _) => {}
        // The thread's locals are gone: hand it over alone.
        (Err(_), Some(ring)) => hand_over(vec![ring]),
        (Err(_), None) => {}
    }
}

#[cfg(not(floodgate_loom))]
#[allow(clippy::vec_box)] // boxed as made (`RetiredRings`)
fn hand_over(rings: Vec<Box<Successor>>) {
    if !rings.is_empty() {
        crate::store::epoch::retire_in(Box::new(rings), crate::store::epoch::EVERY_STORE);
    }
}

/// Rings a thread retired and has not yet handed over (`retire_successor`).
/// Boxed as they were made: a pinned reader may still hold a reference into
/// one (its hint), so none may move until the collector frees it.
#[cfg(not(floodgate_loom))]
#[derive(Default)]
#[allow(clippy::vec_box)]
struct RetiredRings {
    rings: Vec<Box<Successor>>,
    /// Their slots, all told.
    slots: usize,
}

#[cfg(not(floodgate_loom))]
impl RetiredRings {
    #[allow(clippy::vec_box)] // boxed as made (type docs)
    fn take(&mut self) -> Vec<Box<Successor>> {
        self.slots = 0;
        std::mem::take(&mut self.rings)
    }
}

#[cfg(not(floodgate_loom))]
struct Bag(std::cell::RefCell<RetiredRings>);

#[cfg(not(floodgate_loom))]
impl Drop for Bag {
    fn drop(&mut self) {
        hand_over(self.0.get_mut().take());
    }
}

#[cfg(not(floodgate_loom))]
std::thread_local! {
    static RETIRED_RINGS: Bag = Bag(std::cell::RefCell::new(RetiredRings::default()));
}

/// Kept, under the models' cfg, where nothing is freed (`sync`).
#[cfg(floodgate_loom)]
fn retire_successor(_: u64) {}

impl SlidingWindowState {
    /// The home ring: where every call of a client never refunded decides.
    #[inline(always)]
    pub(super) fn home(&self) -> Ring<'_> {
        Ring {
            slots: self.ring.slots(),
            committed: &self.committed,
            boundary: &self.boundary,
            floor: 0,
        }
    }

    /// Runs `step` on the home ring, or, once a refund replaced it, on the
    /// current ring (`through_link`). `step` answers `Frozen` only before
    /// it changed anything.
    #[inline(always)]
    pub(super) fn on_current<T>(
        &self,
        mut step: impl FnMut(Ring<'_>, u64) -> Result<T, Frozen>,
    ) -> Result<T, Retired> {
        match step(self.home(), 0) {
            Ok(value) => Ok(value),
            Err(Frozen::Retired) => Err(Retired),
            Err(Frozen::Replaced) => self.through_link(&mut step),
        }
    }

    /// `step` on the ring the link names (with its address, 0 for the
    /// home ring), under a pin (module docs).
    ///
    /// Progress: a pass repeats only when `step` found its ring replaced,
    /// after which `install` has moved the link on to the ring that
    /// replaced it (this thread's CAS or another's). A ring is replaced
    /// only by a refund's successful mark, so passes repeat only while
    /// other threads' refunds succeed.
    #[cold]
    #[inline(never)]
    pub(super) fn through_link<T>(
        &self,
        step: &mut impl FnMut(Ring<'_>, u64) -> Result<T, Frozen>,
    ) -> Result<T, Retired> {
        let _pin = crate::frame::pin();
        loop {
            let (ring, address) = self.current();
            match step(ring, address) {
                Ok(value) => return Ok(value),
                Err(Frozen::Retired) => return Err(Retired),
                Err(Frozen::Replaced) => self.install(address, ring.frozen_mark().time),
            }
        }
    }

    /// The ring the link names, and its address (0: the home ring). The
    /// caller holds a pin taken before this call, and keeps the ring only
    /// while it holds it.
    #[allow(unsafe_code)]
    fn current(&self) -> (Ring<'_>, u64) {
        // Acquire: pairs with the Release of the `install` that stored it,
        // which follows the refund's writes into that ring.
        let link = self.ring.link().load(Ordering::Acquire) as u64;
        if link == 0 {
            return (self.home(), 0);
        }
        // SAFETY: a successor the link names is freed only by the
        // collector, after the link moved past it and after every pin taken
        // before that move (`install`); this thread's pin is older than its
        // load. Or by `Home`'s drop, when no `&self` is left.
        let successor = unsafe { &*(link as usize as *const Successor) };
        (successor.ring(), link)
    }

    /// Moves the link from the ring at `from` (0: the home ring) to the
    /// ring its `P` mark names, `to`, unless someone did: the link only
    /// ever moves along marks, so a failed CAS means it is already past
    /// `from`. The thread whose CAS succeeds retires `from`.
    pub(super) fn install(&self, from: u64, to: u64) {
        // AcqRel: the Release passes on, to readers that Acquire the link,
        // the refund's writes into `to`, which this thread saw with the
        // Acquire load of the mark; Relaxed on failure: nothing is read.
        let moved = self
            .ring
            .link()
            .compare_exchange(
                u128::from(from),
                u128::from(to),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok();
        if moved && from != 0 {
            retire_successor(from);
        }
    }
}

impl SlidingWindowState {
    /// The ring to go on with after `ring` (at `address`) was found
    /// replaced: the ring the link names, once it names one past `ring`
    /// (installed here if no one has; a client's home ring is found
    /// replaced on every call, and then the link is usually past it). Pins on the first call (`pin`
    /// holds it for the caller's whole decision).
    #[cold]
    #[inline(never)]
    pub(super) fn follow<'s>(
        &'s self,
        ring: Ring<'s>,
        address: u64,
        pin: &mut Option<crate::frame::Pin>,
    ) -> (Ring<'s>, u64) {
        if pin.is_none() {
            *pin = Some(crate::frame::pin());
        }
        // Relaxed: only compared; `current` loads it again with Acquire
        // before reading any ring it names.
        if self.ring.link().load(Ordering::Relaxed) as u64 == address {
            self.install(address, ring.frozen_mark().time);
        }
        self.current()
    }
}
