//! Outgrown tables' memory, given back to the kernel a step at a time.
//!
//! A table of millions of slots is hundreds of megabytes, and freeing it in
//! one call (`munmap`) took 3 ms for 100 MB here, in whichever call's unpin
//! collected it: a known client's check as often as a new one's. Instead, a
//! table's drop queues its memory here ([`Releases::free`]), and each new
//! client's arrival gives back [`STEP`] bytes of it with
//! `madvise(MADV_DONTNEED)` (the pages go back to the kernel, the range
//! stays mapped), until the whole block is given back; it is then
//! deallocated, and the allocator's `munmap` finds no pages left to free.
//! An explicit sweep gives back everything queued, and so does the store's
//! drop (with the last table that holds this queue).
//!
//! Nothing here is read by a check: the memory is no table's any more.
//! Elsewhere than Linux, and under loom, memory is freed at once.

use std::alloc::Layout;
use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::TryLockError;

use crate::sync::{AtomicBool, Mutex, Ordering};

/// Bytes given back per arrival: 32 pages of 4 KiB. Most of a step's cost
/// is fixed: the kernel must make the other cores forget the range (an
/// interrupt to each), about 10 µs on a 2-core AMD EPYC guest whatever
/// the range's size, then frees about a page every 0.35 µs. Measured,
/// `floodgate bench --tail`'s growth to 4 M clients, each step timed
/// apart: steps of 64 KiB took 16 to 19 µs in 2,880 arrivals (0.07 %,
/// most of the 0.1 % a new client's p99.9 allows above it); of 128 KiB,
/// 20 to 21 µs in 1,440 (0.04 %); of 256 KiB, 31 to 32 µs in 720 (0.02
/// %), more than the 0.01 % of the p99.99, which they then set: 35.3 and
/// 38.8 µs against 27.1 and 27.9 at 128 KiB (the p99.9 4.8 to 4.9 µs
/// with either; `governor`'s p99.99 56 to 62 µs in the same runs).
pub(crate) const STEP: usize = 128 << 10;

/// Blocks below this are deallocated at once: 8 MiB, whose `munmap`
/// takes about a quarter of a millisecond here. Below it, the allocator
/// often keeps the memory for its next allocations, warm (glibc's heap
/// serves blocks of up to 32 MB once it has freed one that large), which
/// giving the pages back would throw away: measured, limiters grown to
/// 100,000 clients one after another created each client 9 ns slower
/// (69 against 78 ns) when every outgrown table's pages went back.
pub(crate) const QUEUE_FROM: usize = 8 << 20;

/// Memory waiting to be given back, oldest first.
pub(crate) struct Releases {
    blocks: Mutex<VecDeque<Block>>,
    /// Whether `blocks` may hold anything: arrivals look here first.
    /// Relaxed: a hint; a stale reading delays a step by one arrival.
    pending: AtomicBool,
}

/// One allocation of the global allocator that nothing refers to any more.
struct Block {
    start: NonNull<u8>,
    layout: Layout,
    /// Bytes given back so far, from the block's first whole page.
    given: usize,
}

// SAFETY: a block is memory that no one else refers to (the table that held
// it was dropped), passed to whichever thread gives it back.
unsafe impl Send for Block {}

impl Releases {
    pub(crate) fn new() -> Self {
        Self {
            blocks: Mutex::new(VecDeque::new()),
            pending: AtomicBool::new(false),
        }
    }

    /// Takes `start`, an allocation of `layout` from the global allocator
    /// that nothing refers to any more: deallocates it at once if it is
    /// smaller than [`QUEUE_FROM`], else queues it.
    ///
    /// # Safety
    ///
    /// `start` was allocated by the global allocator with `layout`, and
    /// nothing reads or writes it any more.
    pub(crate) unsafe fn free(&self, start: NonNull<u8>, layout: Layout) {
        let block = Block {
            start,
            layout,
            given: 0,
        };
        if layout.size() < QUEUE_FROM || !cfg!(target_os = "linux") || cfg!(floodgate_loom) {
            block.dealloc();
            return;
        }
        let mut blocks = self
            .blocks
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        blocks.push_back(block);
        self.pending.store(true, Ordering::Relaxed);
    }

    /// Gives back up to [`STEP`] bytes of the oldest block, and
    /// deallocates it once all of it is given back. Never waits: if
    /// another thread is taking a step, this one takes none.
    #[inline]
    pub(crate) fn step(&self) {
        if cfg!(floodgate_loom) || !self.pending.load(Ordering::Relaxed) {
            return;
        }
        self.step_queued();
    }

    #[cold]
    #[inline(never)]
    fn step_queued(&self) {
        let mut blocks = match self.blocks.try_lock() {
            Ok(blocks) => blocks,
            Err(TryLockError::Poisoned(poison)) => poison.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        let Some(block) = blocks.front_mut() else {
            self.pending.store(false, Ordering::Relaxed);
            return;
        };
        if block.give_back(STEP) {
            let block = blocks.pop_front().expect("the front block");
            self.pending.store(!blocks.is_empty(), Ordering::Relaxed);
            drop(blocks);
            block.dealloc();
        }
    }

    /// Deallocates everything queued (an explicit sweep: a service that
    /// sweeps on a timer gets its memory back without new clients).
    pub(crate) fn drain(&self) {
        if !self.pending.load(Ordering::Relaxed) {
            return;
        }
        let drained: Vec<Block> = {
            let mut blocks = self
                .blocks
                .lock()
                .unwrap_or_else(|poison| poison.into_inner());
            self.pending.store(false, Ordering::Relaxed);
            blocks.drain(..).collect()
        };
        for block in drained {
            block.dealloc();
        }
    }
}

impl Drop for Releases {
    fn drop(&mut self) {
        let blocks = self
            .blocks
            .get_mut()
            .unwrap_or_else(|poison| poison.into_inner());
        for block in blocks.drain(..) {
            block.dealloc();
        }
    }
}

impl Block {
    /// Gives the next `bytes` of the block's whole pages back to the
    /// kernel; whether none is left.
    #[cfg(target_os = "linux")]
    fn give_back(&mut self, bytes: usize) -> bool {
        let page = rustix::param::page_size();
        let start = self.start.as_ptr() as usize;
        let first = start.next_multiple_of(page);
        let last = (start + self.layout.size()) / page * page;
        let from = first + self.given;
        let to = from.saturating_add(bytes).min(last);
        if from < to {
            // SAFETY: `from..to` are whole pages inside the block, which
            // nothing refers to any more; their contents may go. An error
            // (none is expected) leaves the pages to the deallocation.
            let _ = unsafe {
                rustix::mm::madvise(
                    from as *mut std::ffi::c_void,
                    to - from,
                    rustix::mm::Advice::LinuxDontNeed,
                )
            };
        }
        self.given = to.saturating_sub(first);
        to >= last
    }

    #[cfg(not(target_os = "linux"))]
    fn give_back(&mut self, _: usize) -> bool {
        true
    }

    fn dealloc(self) {
        // SAFETY: as `Releases::free`'s caller promised: allocated by the
        // global allocator with this layout, and referred to by nothing.
        unsafe { std::alloc::dealloc(self.start.as_ptr(), self.layout) }
    }
}
