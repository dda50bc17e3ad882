//! Each fault rule while Redis is down or stalled, and traffic after a
//! restart.

use super::batches::two_workers;
use super::*;

/// A `redis-server` of the test's own on a free loopback port, stopped
/// (and waited for) when dropped.
pub(super) struct Server {
    pub(super) port: u16,
    pub(super) child: Option<Child>,
}

impl Server {
    /// # Panics
    ///
    /// When `redis-server` cannot be run (it is not on the PATH).
    pub(super) fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let mut server = Server { port, child: None };
        if let Err(error) = server.spawn() {
            panic!("cannot run redis-server ({error}); install it to run the fault tests");
        }
        server
    }

    pub(super) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub(super) fn spawn(&mut self) -> std::io::Result<()> {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        // Wait until it answers; the deadline only turns a hang into a failure.
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = redis::Client::open(self.url()).unwrap();
        loop {
            if let Ok(mut connection) = client.get_connection()
                && redis::cmd("PING").query::<String>(&mut connection).is_ok()
            {
                return Ok(());
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub(super) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub(super) fn restart(&mut self) {
        self.stop();
        self.spawn().expect("restart redis-server");
    }

    /// Sends SIGSTOP or SIGCONT: a stopped server accepts nothing and
    /// answers nothing, as a stalled one.
    pub(super) fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A stopped process must be continued before it can exit cleanly.
            self.signal("-CONT");
        }
        self.stop();
    }
}

/// Calls `check` until it succeeds; the deadline only turns a hang into a
/// failure.
pub(super) fn until_ok<T>(mut check: impl FnMut() -> Result<T, RedisError>) -> T {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match check() {
            Ok(value) => return value,
            Err(error) => assert!(Instant::now() < deadline, "never recovered: {error}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(super) fn fault_options(rule: OnFailure) -> RedisOptions {
    RedisOptions::new()
        .prefix("faults")
        .time(TimeSource::MILLIS)
        .timeout(Duration::from_millis(200))
        .on_failure(rule)
        .connections(2)
}

#[test]
#[ignore = "needs redis-server on the PATH: run with --include-ignored"]
fn each_fault_rule_answers_while_redis_is_down_and_traffic_resumes_after_a_restart() {
    let mut server = Server::start();
    let config = Config::per_ticks(2, 1_000).unwrap();
    let limiters: Vec<(OnFailure, RedisLimiter)> =
        [OnFailure::FailClosed, OnFailure::FailOpen, OnFailure::Local]
            .into_iter()
            .map(|rule| {
                let options = fault_options(rule).prefix(format!("faults-{rule:?}"));
                (
                    rule,
                    RedisLimiter::new(&server.url(), PolicyKind::Gcra, config, options).unwrap(),
                )
            })
            .collect();
    for (rule, limiter) in &limiters {
        assert!(limiter.check_at("a", 0).allowed(), "{rule:?}");
        assert_eq!(limiter.faults(), 0);
    }
    server.stop();
    for (rule, limiter) in &limiters {
        assert!(
            matches!(
                limiter.try_check_at("a", 1),
                Err(RedisError::Unavailable(_))
            ),
            "{rule:?}"
        );
        let answers: Vec<Decision> = (0..3).map(|_| limiter.check_at("a", 1)).collect();
        match rule {
            OnFailure::FailClosed => {
                for answer in &answers {
                    assert_eq!(
                        *answer,
                        Decision::rejected(0, 200).with_tick(floodgate::Tick::MILLISECOND)
                    );
                }
                assert_eq!(limiter.remaining_at("a", 1), 0);
            }
            OnFailure::FailOpen => {
                for answer in &answers {
                    assert_eq!(
                        *answer,
                        Decision::admitted(2).with_tick(floodgate::Tick::MILLISECOND)
                    );
                }
                assert_eq!(limiter.remaining_at("a", 1), 2);
            }
            // The local limiter has never seen "a": a burst of 2, then one
            // per 500 ms.
            _ => {
                let allowed: Vec<bool> = answers.iter().map(|d| d.allowed()).collect();
                assert_eq!(allowed, [true, true, false]);
                assert_eq!(answers[2].retry_after_ticks().unwrap_or(u64::MAX), 500);
                assert_eq!(limiter.remaining_at("a", 1), 0);
            }
        }
        assert_eq!(limiter.faults(), 4, "{rule:?}");
    }
    server.restart();
    for (rule, limiter) in &limiters {
        // The restarted server kept nothing: "a" is new again.
        let decision = until_ok(|| limiter.try_check_at("a", 2));
        assert_eq!(
            decision,
            Decision::admitted(1).with_tick(floodgate::Tick::MILLISECOND),
            "{rule:?}"
        );
        assert_eq!(limiter.try_remaining_at("a", 2).unwrap(), 1);
        // Every connection of the pool reconnects, not only the first.
        for _ in 0..4 {
            assert!(limiter.try_remaining_at("a", 2).is_ok());
        }
    }
}

#[test]
#[ignore = "needs redis-server on the PATH: run with --include-ignored"]
fn a_stalled_redis_times_out_and_the_call_is_not_sent_again() {
    let server = Server::start();
    let limiter = RedisLimiter::new(
        &server.url(),
        PolicyKind::FixedWindow,
        Config::per_ticks(5, 1_000).unwrap(),
        fault_options(OnFailure::FailClosed).connections(1),
    )
    .unwrap();
    assert!(limiter.try_check_at("s", 0).unwrap().allowed());
    server.signal("-STOP");
    let result = limiter.try_check_at("s", 0);
    assert!(matches!(result, Err(RedisError::Timeout)), "{result:?}");
    server.signal("-CONT");
    // The timed-out call was in the stopped server's socket and ran when it
    // woke up, exactly once (it was not sent again): 2 of the 5 are used.
    let remaining = until_ok(|| limiter.try_remaining_at("s", 0));
    assert_eq!(remaining, 3);
    for _ in 0..3 {
        assert!(limiter.try_check_at("s", 0).unwrap().allowed());
    }
    assert!(!limiter.try_check_at("s", 0).unwrap().allowed());
}

/// Four checks are in flight on a stopped server, holding every batch's
/// place, when twenty more queue behind them and their callers give up.
/// Those twenty are never sent: once the server wakes, only the four have
/// been counted.
#[test]
#[ignore = "needs redis-server on the PATH: run with --include-ignored"]
fn a_batched_check_whose_caller_gave_up_before_it_was_sent_is_not_sent() {
    let server = Server::start();
    let runtime = two_workers();
    let remaining = runtime.block_on(async {
        let options = fault_options(OnFailure::FailClosed).timeout(Duration::from_secs(1));
        let limiter = AsyncRedisLimiter::new(
            &server.url(),
            PolicyKind::FixedWindow,
            Config::per_ticks(100, 1_000_000).unwrap(),
            options,
        )
        .await
        .unwrap();
        assert!(limiter.try_check_at("s", 0).await.unwrap().allowed());
        server.signal("-STOP");
        // Far apart, so that each goes out alone and takes a place.
        let mut in_flight = Vec::new();
        for _ in 0..4 {
            let limiter = limiter.clone();
            in_flight.push(tokio::spawn(
                async move { limiter.try_check_at("s", 0).await },
            ));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let given_up: Vec<_> = (0..20)
            .map(|_| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    tokio::time::timeout(Duration::from_millis(100), limiter.try_check_at("s", 0))
                        .await
                        .is_err()
                })
            })
            .collect();
        for caller in given_up {
            assert!(
                caller.await.unwrap(),
                "a queued check was answered by a stopped server"
            );
        }
        for check in in_flight {
            let result = check.await.unwrap();
            assert!(matches!(result, Err(RedisError::Timeout)), "{result:?}");
        }
        server.signal("-CONT");
        let mut remaining = limiter.try_remaining_at("s", 0).await;
        for _ in 0..100 {
            if remaining.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            remaining = limiter.try_remaining_at("s", 0).await;
        }
        remaining.unwrap()
    });
    // 1 before the stop and the 4 in flight: none of the 20.
    assert_eq!(remaining, 95);
}

#[test]
#[ignore = "needs redis-server on the PATH: run with --include-ignored"]
fn the_async_limiter_fails_by_its_rule_and_reconnects_on_its_own() {
    let mut server = Server::start();
    let runtime = two_workers();
    runtime.block_on(async {
        let limiter = AsyncRedisLimiter::new(
            &server.url(),
            PolicyKind::SlidingWindow,
            Config::per_ticks(2, 1_000).unwrap(),
            fault_options(OnFailure::FailClosed),
        )
        .await
        .unwrap();
        assert!(limiter.check_at("a", 0).await.allowed());
        server.stop();
        let error = limiter.try_check_at("a", 1).await.unwrap_err();
        assert!(
            matches!(error, RedisError::Unavailable(_) | RedisError::Timeout),
            "{error}"
        );
        assert_eq!(
            limiter.check_at("a", 1).await,
            Decision::rejected(0, 200).with_tick(floodgate::Tick::MILLISECOND)
        );
        assert_eq!(limiter.faults(), 1);
        server.restart();
        let deadline = Instant::now() + Duration::from_secs(15);
        let decision = loop {
            match limiter.try_check_at("a", 2).await {
                Ok(decision) => break decision,
                Err(error) => assert!(Instant::now() < deadline, "never recovered: {error}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(
            decision,
            Decision::admitted(1).with_tick(floodgate::Tick::MILLISECOND)
        );
    });
}
