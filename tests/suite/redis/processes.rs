//! Several processes share one limit through one Redis.

use super::*;

/// What `several_processes_share_one_limit` runs in each child process
/// (`spec` is the URL and the prefix): checks every policy's shared client
/// from two threads at a frozen time and prints how many each policy
/// admitted.
pub(super) fn child_checks_the_shared_client(spec: &str) {
    let (url, prefix) = spec.split_once(' ').expect("URL and prefix");
    for policy in PolicyKind::ALL {
        let limiter = Arc::new(
            RedisLimiter::new(
                url,
                policy,
                Config::per_ticks(SHARED_LIMIT, 1_000_000).unwrap(),
                exact_options(prefix).connections(2),
            )
            .unwrap(),
        );
        let admitted: u64 = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let limiter = Arc::clone(&limiter);
                    scope.spawn(move || {
                        (0..CHECKS_PER_THREAD)
                            .filter(|_| limiter.try_check_at("shared", 7).unwrap().allowed())
                            .count() as u64
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        });
        // A line of its own: the test harness prints the test's name on the
        // same stream, without a newline before the test's output.
        println!("\n{MARKER} {} {admitted}", policy.name());
    }
}

pub(super) const SHARED_LIMIT: u64 = 37;
/// Starts each child's result line.
pub(super) const MARKER: &str = "floodgate-child-admitted";
pub(super) const CHECKS_PER_THREAD: usize = 25;
pub(super) const CHILDREN: usize = 4;

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn several_processes_share_one_limit() {
    // The same test in each child process, which plays its part only.
    if let Ok(spec) = std::env::var(CHILD_VARIABLE) {
        child_checks_the_shared_client(&spec);
        return;
    }
    let url = shared_url();
    let prefix = prefix("processes");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<Child> = (0..CHILDREN)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "redis::processes::several_processes_share_one_limit",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_VARIABLE, format!("{url} {prefix}"))
                .stdout(Stdio::piped())
                .spawn()
                .expect("run this test binary again")
        })
        .collect();
    let mut totals = std::collections::HashMap::<String, u64>::new();
    for mut child in children {
        let stdout = child.stdout.take().unwrap();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(rest) = line.strip_prefix(MARKER).map(str::trim_start) {
                let (policy, count) = rest.split_once(' ').unwrap();
                *totals.entry(policy.to_owned()).or_default() += count.parse::<u64>().unwrap();
            }
        }
        assert!(child.wait().unwrap().success(), "a child process failed");
    }
    let cleaner = RedisLimiter::new(
        &url,
        PolicyKind::Gcra,
        Config::per_ticks(1, 1).unwrap(),
        exact_options(&prefix),
    )
    .unwrap();
    cleaner.clear_prefix(&prefix).unwrap();
    // 4 processes × 2 threads × 25 checks = 200 requests at one instant:
    // every policy admits exactly its limit of them, whoever sent them.
    for policy in PolicyKind::ALL {
        assert_eq!(
            totals.get(policy.name()).copied(),
            Some(SHARED_LIMIT),
            "{policy}: {totals:?}"
        );
    }
}
