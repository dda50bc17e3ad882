//! The lock-free engine against the mutex baseline, time never decreasing:
//! every field of every answer equal. See `floodgate_fuzz::check_differential`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::check_differential(data);
});
