//! Concurrency, TTLs, script reloads and failures on a real server.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::AsyncCommands;
use rl_core::{Algorithm, Key, Quota, Store, StoreErrorKind};
use rl_store_redis::RedisStore;
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
                        let store = rl_store_redis::RedisConfig::new(url.clone())
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
    let period = Duration::from_millis(300);
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
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
        // The sliding window forgets after two windows; nothing needs longer.
        assert!(ttl > 0 && ttl <= 2 * 300 + 1, "{key}: {ttl} ms");
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
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
async fn corrupt_state_is_an_error_never_a_reset() {
    let server = RedisServer::start();
    let store = crate::store(&server, "corrupt").await;
    let mut conn = raw(&server).await;
    let quota = Quota::per_hour(10).unwrap();
    let key = Key::from("victim");
    let name = store.state_key(&key, &quota);
    let _: () = conn.set(&name, "garbage").await.unwrap();
    let err = store.check(&key, &quota, 1).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::CorruptState, "{err}");
    let _: () = conn.del(&name).await.unwrap();
    let _: () = conn.lpush(&name, "x").await.unwrap();
    let err = store.check(&key, &quota, 1).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::CorruptState, "{err}");
    // The bad value is still there for an operator to look at.
    let len: u64 = conn.llen(&name).await.unwrap();
    assert_eq!(len, 1);
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
    let err = rl_store_redis::RedisConfig::new("redis://127.0.0.1")
        .prefix("a{b")
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::InvalidInput);
    assert!(err.to_string().contains("invalid key prefix"), "{err}");
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
