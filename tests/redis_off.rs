//! `tests/redis.rs` needs the cargo feature `redis`; without it, this says
//! so instead of passing in silence.
#![cfg(not(feature = "redis"))]

use std::io::Write as _;

#[test]
fn the_redis_tests_need_the_redis_feature() {
    // Written to the process's standard error itself: the test harness
    // captures `eprintln!` of passing tests, not this handle.
    let _ = writeln!(
        std::io::stderr(),
        "skipped tests/redis.rs: built without the `redis` feature; run \
         `FLOODGATE_REDIS_URL=redis://127.0.0.1:6379 cargo test --features redis --test redis`"
    );
}
