//! One suite, generic over `Store`, run against the memory store and Redis with the same
//! expected decisions. Quotas refill slowly (per hour), so real time never changes a decision.

use std::time::Duration;

use ratewarden_core::{Algorithm, Decision, Key, Quota, Store};
use ratewarden_memory::MemoryStore;
use tests::redis_server::RedisServer;

/// What every store must decide, the same way.
async fn conformance<S: Store>(store: &S) {
    // Two quotas on one key never share state (they did, per algorithm): a login limit and a
    // read limit of one user, both fixed windows, and a POST and a GET limit, both GCRA.
    for (strict, loose) in [
        ("5/h fixed-window", "100/min fixed-window"),
        ("2/h", "100/h"),
        ("3/h token-bucket", "50/h token-bucket"),
        ("2/h sliding-log", "20/h sliding-log"),
        ("4/h sliding-window", "40/h sliding-window"),
    ] {
        let (strict, loose): (Quota, Quota) = (strict.parse().unwrap(), loose.parse().unwrap());
        let key = Key::from(format!("two-quotas-{strict}"));
        let (mut a, mut b) = (0, 0);
        for _ in 0..20 {
            a += u32::from(store.check(&key, &strict, 1).await.unwrap().is_allowed());
            b += u32::from(store.check(&key, &loose, 1).await.unwrap().is_allowed());
        }
        assert_eq!(
            (a, b),
            (strict.count(), 20),
            "{strict} and {loose} on one key"
        );
        store.reset(&key, &strict).await.unwrap();
        assert_eq!(
            store.peek(&key, &loose).await.unwrap().info().remaining(),
            u64::from(loose.count()) - 20,
            "resetting {strict} leaves {loose} alone"
        );
        store.reset(&key, &loose).await.unwrap();
    }

    for algorithm in Algorithm::ALL {
        let quota = Quota::per_hour(5)
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        let key = Key::from(format!("conformance-{algorithm}"));
        let other = Key::from(7u64);

        // A fresh key: a peek admits, counts nothing.
        let peek = store.peek(&key, &quota).await.unwrap();
        assert!(peek.is_allowed(), "{algorithm}");
        assert_eq!(peek.info().remaining(), 5, "{algorithm}");
        assert_eq!(peek.info().limit(), 5, "{algorithm}");

        // Costs count; a cost of 0 counts nothing.
        let d = store.check(&key, &quota, 2).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.info().remaining(), 3, "{algorithm}");
        let d = store.check(&key, &quota, 0).await.unwrap();
        assert_eq!(d.info().remaining(), 3, "{algorithm}");
        for remaining in [2, 1, 0] {
            let d = store.check(&key, &quota, 1).await.unwrap();
            assert!(d.is_allowed(), "{algorithm}");
            assert_eq!(d.info().remaining(), remaining, "{algorithm}");
            assert_eq!(d.info().retry_after(), Duration::ZERO);
        }
        // The same key in another scope (another named limit) is another bucket, and exhausting
        // the key leaves it alone.
        let scoped = key.clone().scoped(Key::scope_of("other-limit"));
        assert_eq!(
            store
                .peek(&scoped, &quota)
                .await
                .unwrap()
                .info()
                .remaining(),
            5,
            "{algorithm}"
        );
        // Exhausted: denied with a retry time, and a peek agrees.
        let denied = store.check(&key, &quota, 1).await.unwrap();
        assert!(matches!(denied, Decision::Denied(_)), "{algorithm}");
        assert_eq!(denied.info().remaining(), 0);
        assert!(denied.info().retry_after() > Duration::ZERO, "{algorithm}");
        assert!(
            !store.peek(&key, &quota).await.unwrap().is_allowed(),
            "{algorithm}"
        );
        // More than the quota can ever admit is its own outcome.
        let too_big = store.check(&other, &quota, 6).await.unwrap();
        assert!(
            matches!(too_big, Decision::InsufficientCapacity(_)),
            "{algorithm}"
        );
        assert_eq!(too_big.info().retry_after(), Duration::ZERO);
        // Other keys are untouched; a reset gives the key a fresh quota.
        assert_eq!(
            store.peek(&other, &quota).await.unwrap().info().remaining(),
            5
        );
        store.reset(&key, &quota).await.unwrap();
        assert_eq!(
            store
                .check(&key, &quota, 1)
                .await
                .unwrap()
                .info()
                .remaining(),
            4
        );
        store.reset(&key, &quota).await.unwrap();
        assert!(store.check(&scoped, &quota, 5).await.unwrap().is_allowed());
        assert!(!store.check(&scoped, &quota, 1).await.unwrap().is_allowed());
        assert_eq!(
            store.peek(&key, &quota).await.unwrap().info().remaining(),
            5,
            "{algorithm}: a scoped key's use shows up unscoped"
        );
        store.reset(&scoped, &quota).await.unwrap();
    }
}

#[tokio::test]
async fn the_memory_store_conforms() {
    conformance(&MemoryStore::new()).await;
}

#[tokio::test]
async fn the_redis_store_conforms_by_scripts_on_a_server_without_functions() {
    let server = RedisServer::start_with(
        tests::redis_server::free_port(),
        &[
            "--rename-command",
            "FCALL",
            "",
            "--rename-command",
            "FUNCTION",
            "",
        ],
    );
    let store = crate::store(&server, "conformance").await;
    conformance(&store).await;
    let info: String = server
        .query(redis::cmd("INFO").arg("commandstats"))
        .unwrap();
    assert_eq!(
        tests::redis_server::command_calls(&info, "fcall"),
        0,
        "{info}"
    );
    assert!(
        tests::redis_server::command_calls(&info, "evalsha") > 0,
        "{info}"
    );
}

#[tokio::test]
async fn the_redis_store_conforms() {
    let server = RedisServer::start();
    let store = crate::store(&server, "conformance").await;
    conformance(&store).await;
    for algorithm in Algorithm::ALL {
        let quota = Quota::per_hour(5)
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        store
            .check(&Key::from("left-behind"), &quota, 2)
            .await
            .unwrap();
    }
    // Every key written has a TTL: none stays forever.
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), Algorithm::ALL.len(), "{keys:?}");
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
}

#[tokio::test]
async fn the_redis_cluster_store_conforms() {
    let cluster = tests::redis_server::RedisCluster::start();
    let store = ratewarden_redis::RedisConfig::cluster(cluster.urls())
        .prefix("conformance")
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    conformance(&store).await;
    // Keys land on different masters, and each still decides alone.
    let quota = Quota::per_hour(1).unwrap();
    for i in 0..50u64 {
        assert!(
            store
                .check(&Key::from(i), &quota, 1)
                .await
                .unwrap()
                .is_allowed()
        );
        assert!(
            !store
                .check(&Key::from(i), &quota, 1)
                .await
                .unwrap()
                .is_allowed()
        );
    }
    let sizes: Vec<u64> = cluster
        .on_every_node("DBSIZE\r\n")
        .iter()
        .filter_map(|reply| reply.trim().strip_prefix(':')?.parse().ok())
        .collect();
    assert_eq!(sizes.len(), 6, "{sizes:?}");
    assert!(
        sizes.iter().filter(|&&n| n > 0).count() >= 3,
        "keys on one node only: {sizes:?}"
    );
    // After SCRIPT FLUSH on every node, the scripts are reloaded wherever they are missing.
    assert!(
        cluster
            .on_every_node("SCRIPT FLUSH\r\n")
            .iter()
            .all(|r| r.starts_with("+OK"))
    );
    for i in 0..50u64 {
        assert!(
            !store
                .check(&Key::from(i), &quota, 1)
                .await
                .unwrap()
                .is_allowed()
        );
    }
}

#[tokio::test]
async fn the_redis_pool_store_conforms() {
    let server = RedisServer::start();
    let store = ratewarden_redis::RedisConfig::new(server.url())
        .pool(4)
        .prefix("pool")
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    conformance(&store).await;
}
