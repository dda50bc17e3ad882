//! `peek_at` creates nothing and agrees with `remaining_at`; `forget` starts
//! a client afresh, on both APIs.

use super::*;

pub(super) fn exists(connection: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query(connection).unwrap()
}

pub(super) fn fields(connection: &mut redis::Connection, key: &str) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> =
        redis::cmd("HGETALL").arg(key).query(connection).unwrap();
    fields.sort();
    fields
}

/// A few calls, then the times at which `peek_at` is compared with
/// `remaining_at`: before the origin, at it, at the latest call, and past
/// one and several windows (W = 1000).
pub(super) const PEEK_CALLS: [(bool, u64); 5] = [
    (true, 10),
    (true, 10),
    (false, 200),
    (true, 400),
    (false, 450),
];
pub(super) const PEEK_TIMES: [u64; 8] = [0, 10, 400, 401, 999, 1_410, 2_010, 50_000];

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn peek_creates_nothing_and_forget_starts_the_client_afresh() {
    let url = shared_url();
    let prefix = prefix("peek");
    let mut connection = inspect(&url);
    let config = Config::per_ticks(3, 1_000).unwrap();
    for policy in PolicyKind::ALL {
        // The least TTL of `exact_options` makes `remaining` store a new
        // client; a peek must still store nothing.
        let limiter = RedisLimiter::new(&url, policy, config, exact_options(&prefix)).unwrap();
        let _cleanup = Cleanup {
            limiter: &limiter,
            prefix: prefix.clone(),
        };
        let key = limiter.key("p");
        assert_eq!(limiter.try_peek_at("p", 10).unwrap(), None, "{policy}");
        assert_eq!(limiter.peek_at("p", 10), None, "{policy}");
        assert!(
            !exists(&mut connection, &key),
            "{policy}: peek stored a key"
        );
        assert_eq!(limiter.try_tracked_clients().unwrap(), 0, "{policy}");

        let memory = in_memory(policy, config);
        for (allow, now) in PEEK_CALLS {
            if allow {
                assert_eq!(
                    limiter.try_check_at("p", now).unwrap(),
                    memory.check_at("p", now)
                );
            } else {
                assert_eq!(
                    limiter.try_remaining_at("p", now).unwrap(),
                    memory.remaining_at("p", now)
                );
            }
        }
        let stored = fields(&mut connection, &key);
        for at in PEEK_TIMES {
            let peeked = limiter.try_peek_at("p", at).unwrap();
            assert_eq!(
                peeked,
                Some(limiter.try_remaining_at("p", at).unwrap()),
                "{policy} at {at}"
            );
            // Before the latest reflected time (400) the engines may
            // differ: SPEC, time going backwards.
            if at >= 400 {
                assert_eq!(peeked, memory.peek_at("p", at), "{policy} at {at}");
            }
        }
        assert_eq!(
            fields(&mut connection, &key),
            stored,
            "{policy}: peek wrote"
        );

        assert!(limiter.try_forget("p").unwrap(), "{policy}");
        assert!(
            !exists(&mut connection, &key),
            "{policy}: forget left the key"
        );
        assert!(!limiter.try_forget("p").unwrap(), "{policy}");
        assert!(!limiter.forget("p"), "{policy}");
        assert_eq!(limiter.try_peek_at("p", 500).unwrap(), None, "{policy}");
        // The next calls are a new client's, whose origin is 500: the grid
        // policies' windows and drips move with it.
        let fresh = in_memory(policy, config);
        for now in [500, 500, 1_400, 1_499, 1_500] {
            assert_eq!(
                limiter.try_check_at("p", now).unwrap(),
                fresh.check_at("p", now),
                "{policy}: after forget, at {now}"
            );
        }
        assert!(limiter.forget("p"), "{policy}");
        assert_eq!(limiter.peek_at("p", 1_500), None, "{policy}");
    }
}

#[test]
#[ignore = "needs a Redis server: FLOODGATE_REDIS_URL and --include-ignored"]
fn the_async_limiter_peeks_and_forgets_as_the_blocking_one() {
    let url = shared_url();
    let prefix = prefix("async-peek");
    let mut connection = inspect(&url);
    let cleaner = RedisLimiter::new(
        &url,
        PolicyKind::Gcra,
        Config::per_ticks(1, 1).unwrap(),
        exact_options(&prefix),
    )
    .unwrap();
    let _cleanup = Cleanup {
        limiter: &cleaner,
        prefix: prefix.clone(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = Config::per_ticks(3, 1_000).unwrap();
    runtime.block_on(async {
        for policy in PolicyKind::ALL {
            let limiter = AsyncRedisLimiter::new(&url, policy, config, exact_options(&prefix))
                .await
                .unwrap();
            let key = limiter.key("p");
            assert_eq!(
                limiter.try_peek_at("p", 10).await.unwrap(),
                None,
                "{policy}"
            );
            assert_eq!(limiter.peek_at("p", 10).await, None, "{policy}");
            assert!(
                !exists(&mut connection, &key),
                "{policy}: peek stored a key"
            );

            let memory = in_memory(policy, config);
            for (allow, now) in PEEK_CALLS {
                if allow {
                    assert_eq!(
                        limiter.try_check_at("p", now).await.unwrap(),
                        memory.check_at("p", now)
                    );
                } else {
                    assert_eq!(
                        limiter.try_remaining_at("p", now).await.unwrap(),
                        memory.remaining_at("p", now)
                    );
                }
            }
            let stored = fields(&mut connection, &key);
            for at in PEEK_TIMES {
                let peeked = limiter.try_peek_at("p", at).await.unwrap();
                assert_eq!(
                    peeked,
                    Some(limiter.try_remaining_at("p", at).await.unwrap()),
                    "{policy} at {at}"
                );
                if at >= 400 {
                    assert_eq!(peeked, memory.peek_at("p", at), "{policy} at {at}");
                }
            }
            assert_eq!(
                fields(&mut connection, &key),
                stored,
                "{policy}: peek wrote"
            );

            assert!(limiter.try_forget("p").await.unwrap(), "{policy}");
            assert!(
                !exists(&mut connection, &key),
                "{policy}: forget left the key"
            );
            assert!(!limiter.forget("p").await, "{policy}");
            let fresh = in_memory(policy, config);
            for now in [500, 500, 1_400, 1_499, 1_500] {
                assert_eq!(
                    limiter.check_at("p", now).await,
                    fresh.check_at("p", now),
                    "{policy}: after forget, at {now}"
                );
            }
            assert!(limiter.forget("p").await, "{policy}");
            assert_eq!(limiter.peek_at("p", 1_500).await, None, "{policy}");
        }
    });
}
