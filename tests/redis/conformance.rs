//! The suite every store runs (`tests::conformance`), against the memory store and Redis on
//! one server, a pool, a cluster and without functions: the same expected decisions.

use std::time::Duration;

use ratewarden_core::{Algorithm, Key, Quota, Store};
use ratewarden_memory::MemoryStore;
use tests::conformance::store_conforms as conformance;
use tests::redis_server::RedisServer;

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
