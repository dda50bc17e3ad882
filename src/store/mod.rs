//! Where per-client state lives. The in-memory keyed store is here; other
//! backends get their own files beside it.

pub(crate) mod epoch;
// The one module of the engine with unsafe code: the slots' entries are
// written once and published by their tags (see its module docs).
#[allow(unsafe_code)]
mod inline;
mod keyed;
// Outgrown tables' memory given back in steps: raw allocations and
// `madvise` (see its module docs).
#[allow(unsafe_code)]
mod release;

pub(crate) use inline::{InlineStore, Lifecycle, Vacancy};
pub(crate) use keyed::{Client, KeyedStore};

/// Takes one of the places counted by `tracked` under `cap`; false at the
/// cap. Relaxed: a lone counter moved only by read-modify-writes, which are
/// totally ordered whatever the ordering, publishing nothing.
fn reserve(tracked: &crate::sync::AtomicUsize, cap: Option<usize>) -> bool {
    use crate::sync::Ordering;
    let Some(cap) = cap else {
        tracked.fetch_add(1, Ordering::Relaxed);
        return true;
    };
    // Progress: `fetch_update` retries its CAS only after another
    // thread's reservation or give-back moved the count.
    tracked
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |places| {
            (places < cap).then_some(places + 1)
        })
        .is_ok()
}

/// What a new client's arrival came to.
pub(crate) enum Arrival<T> {
    /// This call created the client: its state, or what the call did with it.
    Created(T),
    /// Another call created it first: look it up again.
    Raced,
    /// The cap is reached and nothing idle could go: the overflow rule.
    Full,
}
