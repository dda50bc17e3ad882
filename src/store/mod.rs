//! Where per-client state lives. The in-memory keyed store is here; other
//! backends get their own files beside it.

mod keyed;

pub(crate) use keyed::{Arrival, Client, KeyedStore};
