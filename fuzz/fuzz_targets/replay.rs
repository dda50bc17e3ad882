//! `floodgate replay` on arbitrary bytes (the first eight choose the
//! options, the rest is the trace): never a panic, always exactly the
//! contract's answers or its clean error. See `src/replay.rs`.
//!
//! Needs the `replay` feature, which needs `floodgate-cli`'s library target.
#![no_main]

#[path = "../src/replay.rs"]
mod replay;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    replay::check_replay(data);
});
