//! The only file that names std or loom atomics. Everything else imports
//! `crate::sync`, so the loom models check the very code the library ships.
//!
//! Under `--cfg floodgate_loom` the atomics come from `loom`. Loom has no
//! 128-bit atomic, so there `AtomicU128` is a word behind a loom mutex: every
//! operation on it is one indivisible step, which is exactly what the
//! hardware's 16-byte compare-and-swap gives (FIXME: loom does not model the
//! memory ordering of that emulation; the 128-bit operations used here are
//! sequentially consistent on x86-64 and AArch64 anyway).

#[cfg(not(floodgate_loom))]
pub(crate) use core::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(floodgate_loom))]
pub(crate) use portable_atomic::AtomicU128;

#[cfg(floodgate_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};

#[cfg(floodgate_loom)]
pub(crate) use self::loom_u128::AtomicU128;

#[cfg(floodgate_loom)]
mod loom_u128 {
    use super::Ordering;

    /// A 128-bit word whose every operation is one step under loom.
    #[derive(Debug)]
    pub(crate) struct AtomicU128(loom::sync::Mutex<u128>);

    impl AtomicU128 {
        pub(crate) fn new(value: u128) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn load(&self, _: Ordering) -> u128 {
            *self.0.lock().unwrap()
        }

        pub(crate) fn compare_exchange_weak(
            &self,
            current: u128,
            new: u128,
            success: Ordering,
            failure: Ordering,
        ) -> Result<u128, u128> {
            self.compare_exchange(current, new, success, failure)
        }

        pub(crate) fn compare_exchange(
            &self,
            current: u128,
            new: u128,
            _: Ordering,
            _: Ordering,
        ) -> Result<u128, u128> {
            let mut word = self.0.lock().unwrap();
            if *word == current {
                *word = new;
                Ok(current)
            } else {
                Err(*word)
            }
        }
    }
}
