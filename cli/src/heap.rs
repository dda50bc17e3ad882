//! The binary's global allocator: the system's, keeping a per-thread
//! count of heap bytes, for `floodgate demo`'s bytes per app and
//! `floodgate bench`'s bytes per client.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, keeping a per-thread count of bytes allocated
/// minus bytes freed, so the demo and the bench can measure what creating
/// clients costs. Per thread, so counting never contends; the bench's timed
/// loops on known clients do not allocate at all.
struct Counting;

thread_local! {
    // Const-initialised, no destructor: touching it never allocates, so the
    // allocator cannot re-enter itself.
    static NET_BYTES: Cell<i64> = const { Cell::new(0) };
    static ALLOCATED_BYTES: Cell<u64> = const { Cell::new(0) };
}

fn account(bytes: usize, sign: i64) {
    // A thread being torn down may still allocate or free; it is not being
    // measured, so `try_with` just skips it then.
    let _ = NET_BYTES.try_with(|net| net.set(net.get() + sign * bytes as i64));
    if sign > 0 {
        let _ = ALLOCATED_BYTES.try_with(|total| total.set(total.get() + bytes as u64));
    }
}

// SAFETY: every method forwards its arguments unchanged to `System`, which
// meets `GlobalAlloc`'s contract for them; the accounting touches only a
// thread-local `Cell` and neither allocates nor unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        account(layout.size(), 1);
        // SAFETY: the caller upholds `alloc`'s contract, which is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        account(layout.size(), 1);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        account(layout.size(), -1);
        account(new_size, 1);
        // SAFETY: the caller guarantees `ptr` came from this allocator (so
        // from `System`) with `layout`, and a valid `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        account(layout.size(), -1);
        // SAFETY: the caller guarantees `ptr` came from this allocator (so
        // from `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Bytes this thread allocated since it started, whatever it freed: what a
/// measurement counts when frees of memory other threads retired (a table
/// outgrown elsewhere, reclaimed by epochs on whichever thread passes by)
/// may land inside it.
pub(crate) fn allocated_bytes() -> u64 {
    ALLOCATED_BYTES.with(Cell::get)
}

/// Bytes this thread allocated minus bytes it freed, since it started.
#[cfg(feature = "bench")]
pub(crate) fn net_bytes() -> i64 {
    NET_BYTES.with(Cell::get)
}

/// Heap bytes the calling thread allocated and did not free between
/// [`Meter::start`] and [`Meter::live_bytes`].
#[cfg(feature = "bench")]
pub(crate) struct Meter {
    start: i64,
}

#[cfg(feature = "bench")]
impl Meter {
    pub(crate) fn start() -> Self {
        Self { start: net_bytes() }
    }

    pub(crate) fn live_bytes(self) -> i64 {
        net_bytes() - self.start
    }
}
