//! The state file's loader on arbitrary bytes: never a panic, and a file
//! loaded whole or not at all. See `floodgate_fuzz::check_load`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::check_load(data);
});
