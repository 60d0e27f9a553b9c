//! Concurrency, TTLs, script reloads and failures on a real server.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratewarden_core::{Algorithm, Key, Quota, Store, StoreErrorKind, Timestamp};
use ratewarden_redis::RedisStore;
use redis::AsyncCommands;
use tests::redis_server::RedisServer;

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[test]
fn two_runtimes_of_16_connections_admit_exactly_the_limit_on_one_key() {
    let server = RedisServer::start();
    let url = server.url();
    // One unit refills every 86.4 s: none during the test, so exactly 1,000 may pass.
    let quota = Quota::per_day(1_000).unwrap();
    let admitted = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (url, admitted) = (url.clone(), Arc::clone(&admitted));
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    let mut tasks = Vec::new();
                    for _ in 0..16 {
                        // Each its own connection.
                        let store = ratewarden_redis::RedisConfig::new(url.clone())
                            .timeout(Duration::from_secs(10))
                            .connect()
                            .await
                            .unwrap();
                        let admitted = Arc::clone(&admitted);
                        tasks.push(tokio::spawn(async move {
                            for _ in 0..5_000 {
                                if store
                                    .check(&Key::from("hot"), &quota, 1)
                                    .await
                                    .unwrap()
                                    .is_allowed()
                                {
                                    admitted.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }));
                    }
                    for task in tasks {
                        task.await.unwrap();
                    }
                });
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(admitted.load(Ordering::Relaxed), 1_000);
}

#[tokio::test]
async fn every_key_gets_a_ttl_and_none_outlives_its_window() {
    let server = RedisServer::start();
    let store = crate::store(&server, "ttl").await;
    let mut conn = raw(&server).await;
    // Long enough that no key expires before it is looked at on a busy machine (a second was
    // not: 4 of 25 keys were gone while two cores also built).
    let period = Duration::from_secs(3);
    for algorithm in Algorithm::ALL {
        let quota = Quota::new(3, period)
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        for i in 0..5u64 {
            store.check(&Key::from(i), &quota, 1).await.unwrap();
            store.check(&Key::from(i), &quota, 1).await.unwrap();
        }
    }
    let keys: Vec<String> = conn.keys("ttl:*").await.unwrap();
    assert_eq!(keys.len(), 25, "{keys:?}");
    for key in &keys {
        let ttl: i64 = conn.pttl(key).await.unwrap();
        // The sliding window forgets after two windows; nothing needs longer. A key that
        // expired since it was listed (-2, or 0 while it goes) had a TTL too; -1 is none.
        assert!(
            ttl == -2 || (0..=2 * 3_000 + 1).contains(&ttl),
            "{key}: {ttl} ms"
        );
    }
    tokio::time::sleep(Duration::from_millis(6_100)).await;
    let left: Vec<String> = conn.keys("ttl:*").await.unwrap();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test]
async fn scripts_are_reloaded_after_a_flush() {
    let server = RedisServer::start();
    let store = crate::store(&server, "flush").await;
    let quota = Quota::per_hour(10).unwrap();
    assert_eq!(
        store
            .check(&Key::from(1u64), &quota, 1)
            .await
            .unwrap()
            .info()
            .remaining(),
        9
    );
    let mut conn = raw(&server).await;
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        store
            .check(&Key::from(1u64), &quota, 1)
            .await
            .unwrap()
            .info()
            .remaining(),
        8
    );
}

#[tokio::test]
async fn a_corrupt_state_is_a_denial_and_is_replaced_never_unlimited() {
    // Reproduced: a corrupt state was an error for the key on every check, which the default
    // failure mode answered by letting the request through: unlimited for as long as it
    // stayed. Now it counts as spent: denied, and replaced by a spent state that refills.
    let server = RedisServer::start();
    let store = crate::store(&server, "corrupt").await;
    let mut conn = raw(&server).await;
    let mut victims = Vec::new();
    for algorithm in Algorithm::ALL {
        let quota = Quota::new(5, Duration::from_millis(500))
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        // The last is no garbage but a time in 2255 (a state no Redis clock could have
        // written): spent now, never until then.
        for garbage in [
            "garbage",
            "inf",
            "nan",
            "-5",
            "1e300",
            "9007199254740993",
            "9000000000000000",
            // Numbers to Lua's `tonumber` (hexadecimal, blanks around), never written by a
            // gateway: reproduced, each was read as a state of a few
            // microseconds, a key with its whole burst.
            "0x10",
            " 7 ",
            "0x1p4",
            "\t0x0\n",
            // And, found by a third run once exponent forms were read: a sign, fractions and
            // exponents that round to whole numbers, an underflow, text after a NUL.
            "+16",
            "16.0",
            "1.6e1",
            ".16e2",
            "1e-400",
            "16\0junk",
        ] {
            let key = Key::from(format!("victim-{garbage}"));
            let name = store.state_key(&key, &quota);
            let _: () = conn.del(&name).await.unwrap();
            if algorithm == Algorithm::Gcra {
                let _: () = conn.set(&name, garbage).await.unwrap();
            } else {
                // Every field of the algorithm's state holds the garbage.
                let _: () = redis::cmd("HSET")
                    .arg(&name)
                    .arg(
                        &[
                            "u", garbage, "l", garbage, "w", garbage, "c", garbage, "p", garbage,
                        ][..],
                    )
                    .query_async(&mut conn)
                    .await
                    .unwrap_or(());
                if algorithm == Algorithm::SlidingLog {
                    let _: () = conn.del(&name).await.unwrap();
                    let _: () = conn.rpush(&name, &[garbage; 5][..]).await.unwrap();
                }
            }
            let first = store.check(&key, &quota, 1).await.unwrap();
            assert!(!first.is_allowed(), "{algorithm} {garbage}: {first:?}");
            // Replaced: a state of the right shape, with a TTL (0: under a millisecond left;
            // -2: it has expired already, as a fixed window's state does at its window's end,
            // which may be a moment away).
            let ttl: i64 = conn.pttl(&name).await.unwrap();
            assert!(
                ttl >= 0 || ttl == -2,
                "{algorithm} {garbage}: no TTL ({ttl})"
            );
            victims.push((key, quota));
        }
    }
    // Spent, each refills: within its quota's horizon it is admitted again.
    tokio::time::sleep(Duration::from_millis(1_050)).await;
    for (key, quota) in &victims {
        assert!(
            store.check(key, quota, 1).await.unwrap().is_allowed(),
            "{key:?} {quota}: still denied"
        );
    }
    // A key of another type (a list where a string belongs) too.
    let quota = Quota::per_hour(10).unwrap();
    let key = Key::from("wrong-type");
    let name = store.state_key(&key, &quota);
    let _: () = conn.lpush(&name, "x").await.unwrap();
    assert!(!store.check(&key, &quota, 1).await.unwrap().is_allowed());
    let kind: String = redis::cmd("TYPE")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "string");
}

#[tokio::test]
async fn a_clock_stepped_back_denies_a_key_for_at_most_its_horizon() {
    // Reproduced: after a failover to a Redis whose clock was 10 minutes behind, a spent GCRA
    // key was denied for the 10 minutes, each denial saying "retry in 100 ms".
    let server = RedisServer::start();
    let store = crate::store(&server, "stepped").await;
    let second = 1_000_000;
    for algorithm in Algorithm::ALL {
        let quota = Quota::per_second(10)
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        let key = Key::from("stepped");
        let before = 1_700_000_000 * second;
        while store
            .check_at(&key, &quota, 1, Timestamp::from_micros(before))
            .await
            .unwrap()
            .is_allowed()
        {}
        let start = before - 600 * second;
        let mut now = start;
        // The horizon: a burst's refill, or a period (two for the sliding window).
        let most = if algorithm == Algorithm::SlidingWindow {
            2 * second
        } else {
            second
        };
        loop {
            assert!(
                now - start <= most,
                "{algorithm}: still denied {} ms after the step",
                (now - start) / 1_000
            );
            let decision = store
                .check_at(&key, &quota, 1, Timestamp::from_micros(now))
                .await
                .unwrap();
            if decision.is_allowed() {
                break;
            }
            let retry = u64::try_from(decision.info().retry_after().as_micros()).unwrap();
            now += retry.max(1);
        }
    }
}

#[tokio::test]
async fn unreachable_redis_is_a_connection_error_and_bad_config_is_invalid_input() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let err = RedisStore::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert!(err.is_connection() || err.is_timeout(), "{err}");
    let err = RedisStore::connect("not a url").await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::InvalidInput);
    let err = ratewarden_redis::RedisConfig::new("redis://127.0.0.1")
        .prefix("a{b")
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::InvalidInput);
    assert!(err.to_string().contains("invalid key prefix"), "{err}");
}

#[tokio::test]
async fn a_redis_error_downcasts_to_the_reexported_redis_type() {
    // The store's `redis` is the one users name through `ratewarden_redis::redis`: a source
    // of another version would be another type, and the downcast would find nothing.
    let port = tests::redis_server::free_port();
    let err = ratewarden_redis::RedisConfig::new(format!("redis://127.0.0.1:{port}"))
        .pool(1)
        .connect()
        .await
        .unwrap_err();
    assert!(err.is_connection(), "{err}");
    let source = std::error::Error::source(&err).unwrap();
    let redis_error = source
        .downcast_ref::<ratewarden_redis::redis::RedisError>()
        .unwrap_or_else(|| panic!("not a redis::RedisError: {source:?}"));
    assert!(redis_error.is_connection_refusal(), "{redis_error}");
}

#[tokio::test]
async fn a_zero_deadline_or_lease_period_is_refused_when_built() {
    // Reproduced: `lease(10, Duration::ZERO)` was accepted; every check took a batch from
    // Redis and the lease ended at once, so a 100/min quota admitted 10 of 100.
    use ratewarden_redis::RedisConfig;
    let url = "redis://127.0.0.1:1";
    let batch = std::num::NonZeroU32::new(10).unwrap();
    for (setting, config) in [
        (
            "lease period",
            RedisConfig::new(url).lease(batch, Duration::ZERO),
        ),
        ("timeout", RedisConfig::new(url).timeout(Duration::ZERO)),
        (
            "connect_timeout",
            RedisConfig::new(url).connect_timeout(Duration::ZERO),
        ),
        (
            "hot-key hold",
            RedisConfig::new(url)
                .hot_keys(ratewarden_redis::HotKeys::adaptive(10, batch).hold(Duration::ZERO)),
        ),
    ] {
        let err = config.build().unwrap_err();
        assert_eq!(err, ratewarden_redis::ConfigError::ZeroDuration { setting });
        assert!(err.to_string().contains(setting), "{setting}: {err}");
    }
}

#[tokio::test]
async fn numbers_out_of_their_range_are_refused_when_built_never_clamped() {
    // Reproduced: `pool(0)` was taken as 1, and more than 64 hot-key parts (or one part of an
    // adaptive split) were changed into 64 (or 2) without a word.
    use ratewarden_redis::{ConfigError, HotKeys, RedisConfig};
    use std::num::NonZeroU32;
    let url = "redis://127.0.0.1:1";
    let n = |n| NonZeroU32::new(n).unwrap();
    for (setting, value, config) in [
        ("pool size", 0, RedisConfig::new(url).pool(0)),
        ("pool size", 2_000, RedisConfig::new(url).pool(2_000)),
        (
            "hot-key parts",
            65,
            RedisConfig::new(url).hot_keys(HotKeys::split(n(65))),
        ),
        (
            "hot-key parts",
            1,
            RedisConfig::new(url).hot_keys(HotKeys::adaptive(10, n(1))),
        ),
        (
            "lease batch",
            1,
            RedisConfig::new(url).lease(n(1), Duration::from_secs(1)),
        ),
        (
            "hot-key threshold",
            0,
            RedisConfig::new(url).hot_keys(HotKeys::adaptive(0, n(8))),
        ),
        (
            "lease keys",
            0,
            RedisConfig::new(url)
                .lease(n(10), Duration::from_secs(1))
                .lease_keys(0),
        ),
    ] {
        match config.build().unwrap_err() {
            ConfigError::OutOfRange {
                setting: named,
                value: given,
                ..
            } => assert_eq!((named, given), (setting, value)),
            other => panic!("{setting}: {other}"),
        }
    }
    assert!(RedisConfig::new(url).pool(1_024).build().is_ok());
    assert!(
        RedisConfig::new(url)
            .hot_keys(HotKeys::split(n(64)))
            .build()
            .is_ok()
    );
}

#[tokio::test]
async fn a_hot_key_hold_past_a_day_is_refused_when_built() {
    // Reproduced: `hold(Duration::MAX)`, or any hold of 2^53 µs and more, was
    // accepted, and every check of a key once it was split failed ("unexpected script
    // reply"): Redis's numbers are exact below 2^53 only.
    use ratewarden_redis::{ConfigError, HotKeys, RedisConfig};
    let parts = std::num::NonZeroU32::new(8).unwrap();
    let day = Duration::from_secs(86_400);
    for hold in [
        day + Duration::from_nanos(1),
        Duration::from_micros(1 << 53),
        Duration::MAX,
    ] {
        let config = RedisConfig::new("redis://127.0.0.1:1")
            .hot_keys(HotKeys::adaptive(10, parts).hold(hold));
        let err = config.build().unwrap_err();
        assert_eq!(
            err,
            ConfigError::DurationTooLong {
                setting: "hot-key hold",
                max: day
            }
        );
        assert!(err.to_string().contains("hot-key hold"), "{err}");
    }
    // The longest hold splits a hot key, and its checks are decided.
    let server = RedisServer::start();
    let store = RedisConfig::new(server.url())
        .prefix("hold")
        .timeout(Duration::from_secs(10))
        .hot_keys(HotKeys::adaptive(20, parts).hold(day))
        .build()
        .unwrap();
    let (key, quota) = (Key::from("hot"), Quota::per_second(1_000_000).unwrap());
    for _ in 0..200 {
        let decision = match store.check_ready(&key, &quota, 1) {
            Some(result) => result.unwrap(),
            None => store.check(&key, &quota, 1).await.unwrap(),
        };
        assert!(decision.is_allowed());
    }
    assert_eq!(store.split_keys(), vec![(key, 8)], "the key was split");
}

#[tokio::test]
async fn a_whole_number_stored_in_exponent_form_is_read_as_that_number() {
    // Redis 7.2.0 to 7.2.4 write a whole Lua number with 8 or more trailing zeros in exponent
    // form (redis/redis#13113): 100000000 as `1e+8`. Reading states
    // as digits only took such states for corrupt ones, and denied their keys.
    let server = RedisServer::start();
    let store = crate::store(&server, "exponent").await;
    let mut conn = raw(&server).await;
    // A TAT long past (2001, 2017): a fresh key, its whole burst left.
    let quota = Quota::per_hour(5).unwrap();
    for tat in ["1e+15", "1.5e+15"] {
        let key = Key::from(format!("past-{tat}"));
        let _: () = conn.set(store.state_key(&key, &quota), tat).await.unwrap();
        let decision = store.check(&key, &quota, 1).await.unwrap();
        assert!(decision.is_allowed(), "{tat}: {decision:?}");
        assert_eq!(decision.info().remaining(), 4, "{tat}");
    }
    // A fixed window of a billion a day, 100,000,000 spent in today's window.
    let day = Duration::from_secs(86_400);
    let quota = Quota::new(1_000_000_000, day)
        .unwrap()
        .with_algorithm(Algorithm::FixedWindow)
        .unwrap();
    let key = Key::from("a-billion-a-day");
    let window = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / day.as_secs();
    let _: () = redis::cmd("HSET")
        .arg(store.state_key(&key, &quota))
        .arg(&["w", &window.to_string(), "c", "1e+8"][..])
        .query_async(&mut conn)
        .await
        .unwrap();
    let decision = store.check(&key, &quota, 1).await.unwrap();
    assert!(decision.is_allowed(), "{decision:?}");
    assert_eq!(decision.info().remaining(), 900_000_000 - 1);
}

#[tokio::test]
async fn a_sliding_log_longer_than_its_limit_is_corrupt_and_replaced_not_an_error() {
    // Reproduced: a log of 9,000 entries stamped in the future (a clock that
    // stepped back, or garbage) was deleted, then could not be written back (Lua unpacks at
    // most 8,000 values): the check failed with a script error, and the next one found the
    // key fresh, with its whole burst. No log is ever longer than its limit.
    let server = RedisServer::start();
    let store = crate::store(&server, "long-log").await;
    let mut conn = raw(&server).await;
    let quota = Quota::new(5, Duration::from_secs(60))
        .unwrap()
        .with_algorithm(Algorithm::SlidingLog)
        .unwrap();
    for len in [6_usize, 9_000] {
        let key = Key::from(format!("long-{len}"));
        let name = store.state_key(&key, &quota);
        let _: () = conn
            .rpush(&name, &vec!["9000000000000000"; len][..])
            .await
            .unwrap();
        for _ in 0..2 {
            let decision = store.check(&key, &quota, 1).await.unwrap();
            assert!(!decision.is_allowed(), "{len}: {decision:?}");
        }
        let kept: usize = conn.llen(&name).await.unwrap();
        assert_eq!(
            kept, 5,
            "{len}: replaced by a spent log of the limit's length"
        );
    }
}

#[test]
fn a_deadline_past_a_day_with_adaptive_hot_keys_is_refused_when_built() {
    // Reproduced: with adaptive hot keys the deadline is also how long a
    // split key waits after its split; `timeout(Duration::MAX)` sent Redis a wait of 1.8e19
    // µs, past the integers its scripts count exactly, and the first check after each split
    // failed (`rl: corrupt state`) where it should have been decided.
    use ratewarden_redis::{ConfigError, HotKeys, RedisConfig};
    let day = Duration::from_secs(86_400);
    let adaptive = || HotKeys::adaptive(10, std::num::NonZeroU32::new(2).unwrap());
    for timeout in [day + Duration::from_nanos(1), Duration::MAX] {
        let err = RedisConfig::new("redis://127.0.0.1:1")
            .timeout(timeout)
            .hot_keys(adaptive())
            .build()
            .unwrap_err();
        assert_eq!(
            err,
            ConfigError::DurationTooLong {
                setting: "timeout (with adaptive hot keys)",
                max: day
            }
        );
        assert!(err.to_string().contains("timeout"), "{err}");
    }
}

#[tokio::test]
async fn a_pool_on_a_cluster_config_is_refused_when_built() {
    // Reproduced: `cluster(nodes).pool(n)` built a pool on the first node alone, as if it
    // were a standalone server: every key on other nodes' slots failed with `MOVED`.
    use ratewarden_redis::{ConfigError, RedisConfig};
    let nodes = ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"];
    let err = RedisConfig::cluster(nodes).pool(4).build().unwrap_err();
    assert_eq!(err, ConfigError::PoolOnCluster);
    // `connect` reports it as a store error, as `?` in users' code does.
    let err = RedisConfig::cluster(nodes)
        .pool(4)
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::InvalidInput, "{err}");
    let source = std::error::Error::source(&err).unwrap();
    assert_eq!(
        source.downcast_ref::<ConfigError>(),
        Some(&ConfigError::PoolOnCluster)
    );
    // A pool on one server still builds (nothing listens on port 1: nothing connects yet).
    assert!(
        RedisConfig::new("redis://127.0.0.1:1")
            .pool(4)
            .build()
            .is_ok()
    );
}

#[tokio::test]
async fn clock_skew_between_this_host_and_redis_is_measured() {
    let server = RedisServer::start();
    let store = crate::store(&server, "skew").await;
    // Same machine, same clock: within the round trip.
    let skew = store.measure_clock_skew().await.unwrap();
    assert!(skew.abs() < 50_000, "{skew} µs");
}

#[tokio::test]
async fn a_check_future_is_small_enough_to_box_cheaply() {
    // The layer boxes a Redis check's future on every request: kilobytes there cost a large
    // allocation and a copy per request (the cluster client's future alone is several KiB).
    let server = RedisServer::start();
    let store = crate::store(&server, "size").await;
    let (key, quota) = (Key::from(1u64), Quota::per_second(1).unwrap());
    let future = store.check(&key, &quota, 1);
    let size = std::mem::size_of_val(&future);
    assert!(size < 1_024, "{size} bytes");
    assert!(future.await.unwrap().is_allowed());
}

#[tokio::test]
async fn calls_that_give_up_share_one_cluster_connect_attempt() {
    // A "cluster node" that accepts connections and never answers: every connect attempt
    // hangs past the call's deadline. The calls after the first must wait for its attempt,
    // not start one each (a connection storm until the breaker opens).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&accepted);
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            held.push(socket);
        }
    });
    let store = ratewarden_redis::RedisConfig::cluster([url])
        .timeout(Duration::from_millis(10))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let quota = Quota::per_second(1).unwrap();
    for _ in 0..50 {
        let err = store.check(&Key::from(1u64), &quota, 1).await.unwrap_err();
        assert!(err.is_timeout(), "{err}");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one connect attempt shared by 50 calls"
    );
    server.abort();
}
