//! Time going backwards, on each engine: no panic, and nothing the latest
//! reflected time would reject. See `floodgate_fuzz::check_time_backwards`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::check_time_backwards(data);
});
