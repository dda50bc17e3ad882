//! One client's lease slots driven by the lease script's answers (any
//! size, end, `taken_at` and `rest`), checks and refunds, at times that may
//! go back: every answer the reference model's, units conserved, no panic.
//! See `src/leases.rs`.
#![no_main]

#[path = "../src/leases.rs"]
mod leases;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    leases::check_leases(data);
});
