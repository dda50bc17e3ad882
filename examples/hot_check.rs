//! One known client checked in a loop: the program behind the instruction
//! counts per hot check in `benches/README.md` ("Instructions per hot
//! check"). Run it under callgrind twice and take the difference, so that
//! set-up and exit cancel out:
//!
//! ```sh
//! cargo build --release --example hot_check
//! valgrind --tool=callgrind target/release/examples/hot_check quanta 1000000
//! valgrind --tool=callgrind target/release/examples/hot_check quanta 3000000
//! ```
//!
//! (instructions of the second less those of the first, over 2,000,000).
//! The mode is `quanta` (the default `QuantaClock`, a TSC read per check),
//! `caller` (`check_at` with a `now` the loop moves 10 ns per check),
//! `uniform` (as `caller`, but each check one of 10,000 known clients drawn
//! at random, as the bench's `uniform` rows) or `fresh` (`quanta`, but
//! every check a new client's first). CI runs `fresh 600000` under
//! memcheck: a table grown past 1 MiB, and outgrown ones given back.

use std::hint::black_box;
use std::time::Duration;

use floodgate::policy::{Gcra, Policy};
use floodgate::{Config, Limiter};

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "quanta".into());
    let checks: u64 = match args.next().map(|count| count.parse()) {
        Some(Ok(count)) => count,
        None => 1_000_000,
        Some(Err(error)) => {
            eprintln!("hot_check: the count of checks must be a whole number: {error}");
            std::process::exit(2);
        }
    };
    // The bench's flood quota: 100 a millisecond, so nearly every check of
    // one client in a tight loop is a rejection.
    let config = Config::per(100, Duration::from_millis(1)).expect("a valid quota");
    let limiter = Limiter::new(Gcra::new(config).expect("a valid gcra quota"));
    let key = 7u64;
    let mut admitted = 0u64;
    match mode.as_str() {
        "quanta" => {
            for _ in 0..checks {
                admitted += u64::from(limiter.check(black_box(&key)).allowed());
            }
        }
        "caller" => {
            let mut now = 0u64;
            for _ in 0..checks {
                now += 10;
                admitted += u64::from(limiter.check_at(black_box(&key), now).allowed());
            }
        }
        // The bench's uniform keys: 65,536 draws of 10,000 clients by a
        // xorshift of a fixed seed, each known before the count begins.
        "uniform" => {
            let mut state = 0x5EEDu64;
            let keys: Vec<u64> = (0..1 << 16)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state % 10_000
                })
                .collect();
            for key in 0..10_000u64 {
                limiter.check_at(&key, 0);
            }
            let mut now = 0u64;
            for index in 0..checks as usize {
                now += 10;
                let key = keys[index & ((1 << 16) - 1)];
                admitted += u64::from(limiter.check_at(black_box(&key), now).allowed());
            }
        }
        // A new client per check, as in the bench's `fresh` rows.
        "fresh" => {
            for key in 0..checks {
                admitted += u64::from(limiter.check(black_box(&key)).allowed());
            }
        }
        other => {
            eprintln!("hot_check: unknown mode `{other}`: quanta, caller, uniform or fresh");
            std::process::exit(2);
        }
    }
    println!("{checks} checks ({mode}), {admitted} admitted");
}
