//! The 128-bit words of `fixed-window`, `sliding-window-counter` and
//! `sliding-window` are lock-free on the targets the crate is built for in
//! CI and production: x86-64 (with `cmpxchg16b`, found at run time if not
//! enabled at compile time) and AArch64.

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[test]
fn the_16_byte_cas_is_native_on_x86_64_and_aarch64() {
    assert!(
        floodgate::wide_cas_is_lock_free(),
        "portable-atomic fell back to locks for AtomicU128"
    );
}
