//! Through a Redis Cluster: the contract's traces, several rules in one slot,
//! a slot migration under traffic, a killed node.

use super::batches::two_workers;
use super::faults::{fault_options, until_ok, Server};
use super::several_rules::rules_differential_through;
use super::traces::{differential_through, spec_examples, trace};
use super::*;

/// A three-primary Redis Cluster of the test's own on free loopback ports
/// (no replicas, no persistence), in a directory of its own; stopped and
/// removed when dropped. A stopped node that comes back on its port with
/// its `nodes.conf` rejoins with its slots (and no keys).
pub(super) struct Cluster {
    pub(super) _turn: std::sync::MutexGuard<'static, ()>,
    pub(super) dir: std::path::PathBuf,
    pub(super) ports: Vec<u16>,
    pub(super) children: Vec<Option<Child>>,
}

/// Held by each cluster test: clusters start one at a time, so that two
/// never race for the same free ports (a node's bus port is its port +
/// 10,000, which nothing reserves while the first is checked).
pub(super) static CLUSTERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Cluster {
    /// # Panics
    ///
    /// When `redis-server` or `redis-cli` cannot be run, or the cluster
    /// does not form.
    pub(super) fn start(name: &str) -> Self {
        let turn = CLUSTERS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir =
            std::env::temp_dir().join(format!("floodgate-cluster-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut ports = Vec::new();
        while ports.len() < 3 {
            let port = free_port();
            // The cluster bus listens on the port + 10,000.
            if port < 55_000
                && !ports.contains(&port)
                && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
            {
                ports.push(port);
            }
        }
        let mut cluster = Cluster {
            _turn: turn,
            dir,
            children: ports.iter().map(|_| None).collect(),
            ports,
        };
        for node in 0..3 {
            cluster.spawn(node);
        }
        let nodes: Vec<String> = cluster
            .ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("cannot run redis-cli; install redis-tools to run the cluster tests");
        assert!(status.success(), "redis-cli --cluster create failed");
        cluster.wait_until_ok();
        cluster
    }

    pub(super) fn url(&self) -> String {
        let nodes: Vec<String> = self
            .ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        format!("redis-cluster://{}", nodes.join(","))
    }

    pub(super) fn spawn(&mut self, node: usize) {
        let port = self.ports[node].to_string();
        let config = self.dir.join(format!("nodes-{port}.conf"));
        let child = Command::new("redis-server")
            .args(["--port", &port, "--bind", "127.0.0.1"])
            .args(["--cluster-enabled", "yes"])
            .arg("--cluster-config-file")
            .arg(&config)
            .args(["--cluster-node-timeout", "1000"])
            // The other nodes keep serving their slots while one is down.
            .args(["--cluster-require-full-coverage", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .spawn()
            .expect("cannot run redis-server; install it to run the cluster tests");
        self.children[node] = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.query(node, &["PING"]).is_none() {
            assert!(Instant::now() < deadline, "node {port} did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// One node's answer to a command, as text; `None` if it gave none.
    pub(super) fn query(&self, node: usize, args: &[&str]) -> Option<String> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.ports[node])).ok()?;
        let mut connection = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        let value: redis::Value = command.query(&mut connection).ok()?;
        Some(match value {
            redis::Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            redis::Value::SimpleString(text) => text,
            redis::Value::VerbatimString { text, .. } => text,
            redis::Value::Int(n) => n.to_string(),
            other => format!("{other:?}"),
        })
    }

    /// Waits until every running node sees every slot served; the deadline
    /// only turns a hang into a failure.
    pub(super) fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = (0..3)
                .filter(|&node| self.children[node].is_some())
                .all(|node| {
                    self.query(node, &["CLUSTER", "INFO"]).is_some_and(|info| {
                        info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
                    })
                });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not converge");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub(super) fn id(&self, node: usize) -> String {
        self.query(node, &["CLUSTER", "MYID"]).expect("node id")
    }

    pub(super) fn keys(&self, node: usize) -> u64 {
        self.query(node, &["DBSIZE"]).unwrap().parse().unwrap()
    }

    pub(super) fn stop(&mut self, node: usize) {
        if let Some(mut child) = self.children[node].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in 0..3 {
            self.stop(node);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(super) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// The contract traces and the spec's sessions through a three-node
/// cluster and through one Redis side by side: every answer of each is the
/// in-memory engine's (the same seeded traces as the `differential_*`
/// tests), on both APIs; and `clear_prefix` and `tracked_clients` reach
/// every node.
#[test]
#[ignore = "needs redis-server and redis-cli on the PATH: run with --include-ignored"]
fn through_a_cluster_the_contract_traces_give_one_redis_answers() {
    let cluster = Cluster::start("differential");
    let single = Server::start();
    let url = cluster.url();
    spec_examples(&url);
    for policy in PolicyKind::ALL {
        differential_through(&[&url, &single.url()], policy, 60);
    }
    // Keys of many clients land on every node, and are all found again.
    let prefix = prefix("cluster_keys");
    let limiter = RedisLimiter::new(
        &url,
        PolicyKind::FixedWindow,
        Config::per_ticks(5, 1_000).unwrap(),
        exact_options(&prefix),
    )
    .unwrap();
    for id in 0..300 {
        assert!(limiter
            .try_check_at(&format!("k{id}"), 0)
            .unwrap()
            .allowed());
    }
    assert_eq!(limiter.try_tracked_clients().unwrap(), 300);
    assert!(
        (0..3).all(|node| cluster.keys(node) > 50),
        "keys on every node"
    );
    assert_eq!(limiter.clear_prefix(&prefix).unwrap(), 300);
    assert_eq!(limiter.try_tracked_clients().unwrap(), 0);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut rng = fastrand::Rng::with_seed(0xC1);
        for policy in PolicyKind::ALL {
            for number in 0..10 {
                let trace = trace(policy, &mut rng);
                let config = Config::per_ticks(trace.limit, trace.window).unwrap();
                let memory = in_memory(policy, config);
                let redis = AsyncRedisLimiter::new(&url, policy, config, exact_options(&prefix))
                    .await
                    .unwrap();
                for (index, &(allow, client, now)) in trace.calls.iter().enumerate() {
                    let key = format!("{policy}-{number}-{client}");
                    let cost = trace.costs[index];
                    if allow {
                        assert_eq!(
                            redis.try_check_n_at(&key, now, cost).await.unwrap(),
                            memory.check_n_at(&key, now, cost),
                            "{policy} {key} at {now} cost {cost}"
                        );
                    } else {
                        assert_eq!(
                            redis.try_remaining_at(&key, now).await.unwrap(),
                            memory.remaining_at(&key, now),
                            "{policy} {key} at {now}"
                        );
                    }
                }
            }
        }
    });
    limiter.clear_prefix(&prefix).unwrap();
}

/// Several rules through a three-node cluster and one Redis side by side:
/// each client's keys (one per rule) share one slot, so every decision is
/// still one script call, and every answer is the mutex engine's.
#[test]
#[ignore = "needs redis-server and redis-cli on the PATH: run with --include-ignored"]
fn through_a_cluster_several_rules_keep_a_client_in_one_slot() {
    let cluster = Cluster::start("rules");
    let single = Server::start();
    let url = cluster.url();
    let prefix = prefix("cluster_rules");
    let rules: RuleSet = "gcra:5/1s,sliding-window:7/10s,fixed-window:20/1m"
        .parse()
        .unwrap();
    let limiter = RedisLimiter::with_rules(&url, &rules, exact_options(&prefix)).unwrap();
    for id in 0..200 {
        let client = format!("k{id}");
        assert!(limiter.try_check_at(&client, 0).unwrap().allowed());
        let slots: Vec<String> = limiter
            .keys(&client)
            .iter()
            .map(|key| cluster.query(0, &["CLUSTER", "KEYSLOT", key]).unwrap())
            .collect();
        assert_eq!(slots.len(), 3);
        assert!(
            slots.iter().all(|slot| *slot == slots[0]),
            "{client}: {slots:?}"
        );
    }
    assert_eq!(limiter.try_tracked_clients().unwrap(), 200);
    assert!(
        (0..3).all(|node| cluster.keys(node) > 50 * 3),
        "keys on every node"
    );
    assert_eq!(limiter.clear_prefix(&prefix).unwrap(), 600);
    rules_differential_through(&[&url, &single.url()], 0x000C_15E7, 60);
}

/// Slots move from one node to another (`redis-cli --cluster reshard`)
/// while four threads check 600 clients: the client follows `MOVED` and
/// `ASK`, no call fails, and afterwards every client's count in Redis is
/// exactly the admissions its callers saw: nothing lost, nothing counted
/// twice.
#[test]
#[ignore = "needs redis-server and redis-cli on the PATH: run with --include-ignored"]
fn a_slot_migration_under_traffic_loses_nothing_and_counts_nothing_twice() {
    let cluster = Cluster::start("reshard");
    let url = cluster.url();
    let prefix = prefix("reshard");
    const LIMIT: u64 = 1_000_000;
    const CLIENTS: usize = 600;
    let limiter = RedisLimiter::new(
        &url,
        PolicyKind::FixedWindow,
        Config::per_ticks(LIMIT, 1 << 40).unwrap(),
        exact_options(&prefix).connections(4),
    )
    .unwrap();
    let keys_before = cluster.keys(1);
    let done = std::sync::atomic::AtomicBool::new(false);
    let counts: Vec<std::sync::atomic::AtomicU64> = (0..CLIENTS)
        .map(|_| std::sync::atomic::AtomicU64::new(0))
        .collect();
    let (from, to) = (cluster.id(0), cluster.id(1));
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..4)
            .map(|thread| {
                let (limiter, done, counts) = (&limiter, &done, &counts);
                scope.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(thread);
                    let mut calls = 0u64;
                    // At least a pass over every client, and on until the
                    // reshard is over.
                    while calls < CLIENTS as u64 || !done.load(std::sync::atomic::Ordering::SeqCst)
                    {
                        let client = rng.usize(..CLIENTS);
                        let decision = limiter
                            .try_check_at(&format!("c{client}"), 0)
                            .unwrap_or_else(|e| panic!("a call failed during the reshard: {e}"));
                        assert!(decision.allowed());
                        counts[client].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        calls += 1;
                    }
                    calls
                })
            })
            .collect();
        let status = Command::new("redis-cli")
            .args([
                "--cluster",
                "reshard",
                &format!("127.0.0.1:{}", cluster.ports[0]),
            ])
            .args(["--cluster-from", &from, "--cluster-to", &to])
            .args(["--cluster-slots", "2000", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("run redis-cli --cluster reshard");
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(status.success(), "the reshard failed");
        let calls: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        eprintln!("{calls} decisions during the reshard");
    });
    cluster.wait_until_ok();
    assert!(
        cluster.keys(1) > keys_before,
        "no key moved to the new node"
    );
    for (client, count) in counts.iter().enumerate() {
        let count = count.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            limiter.try_remaining_at(&format!("c{client}"), 0).unwrap(),
            LIMIT - count,
            "client c{client}, admitted {count} times"
        );
    }
    limiter.clear_prefix(&prefix).unwrap();
}

/// A node is killed: calls for the clients it served fail, and the fault
/// rule answers them; the other nodes' clients are served as before. When
/// the node returns, traffic to its clients resumes without rebuilding the
/// limiter, on both APIs.
#[test]
#[ignore = "needs redis-server and redis-cli on the PATH: run with --include-ignored"]
fn a_killed_cluster_node_fails_by_the_rule_and_traffic_resumes() {
    let mut cluster = Cluster::start("faults");
    let url = cluster.url();
    let config = Config::per_ticks(1_000, 1_000).unwrap();
    let limiter = RedisLimiter::new(
        &url,
        PolicyKind::Gcra,
        config,
        fault_options(OnFailure::FailClosed),
    )
    .unwrap();
    let runtime = two_workers();
    let async_limiter = runtime.block_on(async {
        AsyncRedisLimiter::new(
            &url,
            PolicyKind::Gcra,
            config,
            fault_options(OnFailure::FailClosed).prefix("faults-async"),
        )
        .await
        .unwrap()
    });
    let clients: Vec<String> = (0..30).map(|id| format!("n{id}")).collect();
    for client in &clients {
        assert!(limiter.try_check_at(client, 0).unwrap().allowed());
        assert!(runtime
            .block_on(async_limiter.try_check_at(client, 0))
            .unwrap()
            .allowed());
    }
    cluster.stop(2);
    let mut lost = Vec::new();
    for client in &clients {
        match limiter.try_check_at(client, 1) {
            Ok(decision) => assert!(decision.allowed()),
            Err(error) => {
                assert!(
                    matches!(error, RedisError::Unavailable(_) | RedisError::Timeout),
                    "{error}"
                );
                lost.push(client.clone());
            }
        }
    }
    assert!(!lost.is_empty() && lost.len() < clients.len(), "{lost:?}");
    let faults = limiter.faults();
    let decision = limiter.check_at(&lost[0], 1);
    assert_eq!(
        (
            decision.allowed(),
            decision.retry_after_ticks().unwrap_or(u64::MAX),
            limiter.faults()
        ),
        (false, 200, faults + 1),
        "the fault rule answers"
    );
    let async_decision = runtime.block_on(async_limiter.check_at(&lost[0], 1));
    assert_eq!(
        (async_decision.allowed(), async_limiter.faults()),
        (false, 1)
    );

    cluster.spawn(2);
    cluster.wait_until_ok();
    for client in &lost {
        // The node came back empty: its clients are new again.
        let decision = until_ok(|| limiter.try_check_at(client, 2));
        assert_eq!(
            (decision.allowed(), decision.remaining()),
            (true, 999),
            "{client}"
        );
    }
    runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match async_limiter.try_check_at(&lost[0], 2).await {
                Ok(decision) => {
                    assert!(decision.allowed());
                    break;
                }
                Err(error) => assert!(Instant::now() < deadline, "never recovered: {error}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}
