//! Redis's `maxmemory-policy`: read when the store connects, an evicting one reported (by the
//! watch, and the gauge), and the harm it warns of.

use std::time::{Duration, Instant};

use ratewarden_core::{Key, Quota, Store};
use ratewarden_redis::{EvictionPolicy, EvictionWatch, RedisConfig, RedisStore};
use tests::redis_server::{RedisCluster, RedisServer, free_port};

/// A server that evicts any key when over 2 MB.
fn evicting_server() -> RedisServer {
    RedisServer::start_with(
        free_port(),
        &["--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"],
    )
}

/// A store connected to `url`, reporting the policy it reads to the watch returned.
async fn watched(url: String, prefix: &str) -> (RedisStore, EvictionWatch) {
    let eviction = EvictionWatch::new();
    let store = RedisConfig::new(url)
        .prefix(prefix)
        .deny_cache(0)
        .timeout(Duration::from_secs(10))
        .eviction_watch(&eviction)
        .connect()
        .await
        .unwrap();
    (store, eviction)
}

fn evicting(policy: &str) -> Option<EvictionPolicy> {
    Some(EvictionPolicy::Evicting {
        policy: policy.to_owned(),
    })
}

#[test]
fn an_allkeys_policy_is_reported_as_evicting_once_connected() {
    let server = evicting_server();
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The read at connect runs in `connect`, on this thread, where the local recorder is.
    let (store, eviction) = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(watched(server.url(), "allkeys"))
    });
    assert_eq!(eviction.policy(), evicting("allkeys-lru"));
    assert!(eviction.evicts());
    let gauge = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find(|(key, ..)| key.key().name() == "ratewarden_redis_evicting_policy")
        .map(|(.., value)| value);
    assert_eq!(
        gauge,
        Some(metrics_util::debugging::DebugValue::Gauge(1.0.into()))
    );
    drop(store);
}

#[tokio::test]
async fn a_volatile_policy_is_evicting_too_since_every_state_has_a_ttl() {
    let server = RedisServer::start_with(
        free_port(),
        &["--maxmemory", "2mb", "--maxmemory-policy", "volatile-ttl"],
    );
    let (_store, eviction) = watched(server.url(), "volatile").await;
    assert_eq!(eviction.policy(), evicting("volatile-ttl"));
}

#[tokio::test]
async fn noeviction_is_reported_safe() {
    let server = RedisServer::start_with(
        free_port(),
        &["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"],
    );
    let (_store, eviction) = watched(server.url(), "noeviction").await;
    assert_eq!(eviction.policy(), Some(EvictionPolicy::NoEviction));
    assert!(!eviction.evicts());
}

/// The store on a server that will not report its policy: unknown, and checks work.
async fn unknown_yet_working(url: String) {
    let (store, eviction) = watched(url, "unknown").await;
    let policy = eviction.policy();
    assert!(
        matches!(policy, Some(EvictionPolicy::Unknown { .. })),
        "{policy:?}"
    );
    assert!(!eviction.evicts());
    let quota = Quota::per_hour(1).unwrap();
    assert!(
        store
            .check(&Key::from(1_u64), &quota, 1)
            .await
            .unwrap()
            .is_allowed()
    );
    assert!(
        !store
            .check(&Key::from(1_u64), &quota, 1)
            .await
            .unwrap()
            .is_allowed()
    );
}

#[tokio::test]
async fn a_user_not_allowed_config_gets_an_unknown_policy_and_a_working_store() {
    let server = evicting_server();
    let _: () = server
        .query(redis::cmd("ACL").arg(&[
            "SETUSER", "noconfig", "on", ">secret", "~*", "+@all", "-config",
        ]))
        .unwrap();
    let url = server
        .url()
        .replacen("redis://", "redis://noconfig:secret@", 1);
    unknown_yet_working(url).await;
}

#[tokio::test]
async fn a_config_command_renamed_away_gives_an_unknown_policy_and_a_working_store() {
    // As managed Redis services do.
    let server = RedisServer::start_with(
        free_port(),
        &[
            "--maxmemory-policy",
            "allkeys-lru",
            "--rename-command",
            "CONFIG",
            "",
        ],
    );
    unknown_yet_working(server.url()).await;
}

#[tokio::test]
async fn a_built_store_reads_nothing_until_its_first_period() {
    let server = evicting_server();
    let eviction = EvictionWatch::new();
    let store = RedisConfig::new(server.url())
        .eviction_watch(&eviction)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let quota = Quota::per_hour(1).unwrap();
    store.check(&Key::from(1_u64), &quota, 1).await.unwrap();
    assert_eq!(eviction.policy(), None, "build() touches no network itself");
}

/// `connected_clients` from `INFO clients`, counting the connection that asks.
fn connected_clients(server: &RedisServer) -> u64 {
    let info: String = server.query(redis::cmd("INFO").arg("clients")).unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("connected_clients:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_read_does_not_keep_a_dropped_store_connected() {
    let server = evicting_server();
    let alone = connected_clients(&server);
    for pool in [false, true] {
        let eviction = EvictionWatch::new();
        let config = RedisConfig::new(server.url())
            .timeout(Duration::from_secs(10))
            .eviction_watch(&eviction);
        let config = if pool { config.pool(2) } else { config };
        let store = config.connect().await.unwrap();
        store
            .check(&Key::from(1_u64), &Quota::per_hour(1).unwrap(), 1)
            .await
            .unwrap();
        assert_eq!(eviction.policy(), evicting("allkeys-lru"), "pool: {pool}");
        assert!(connected_clients(&server) > alone, "pool: {pool}");
        drop(store);
        // The reading task sleeps until its next minute, holding the connection weakly: the
        // store's connections close now.
        let deadline = Instant::now() + Duration::from_secs(5);
        while connected_clients(&server) > alone {
            assert!(
                Instant::now() < deadline,
                "pool: {pool}: a dropped store's connection stayed open"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_state_hands_a_throttled_key_a_fresh_quota() {
    // The harm an evicting policy is warned of.
    let server = evicting_server();
    let (store, eviction) = watched(server.url(), "harm").await;
    assert!(eviction.evicts());
    let (key, quota) = (Key::from("throttled"), Quota::per_hour(1).unwrap());
    assert!(store.check(&key, &quota, 1).await.unwrap().is_allowed());
    assert!(!store.check(&key, &quota, 1).await.unwrap().is_allowed());
    let state = store.state_key(&key, &quota);
    // Other keys fill the 2 MB until Redis evicts the throttled key's state (the least
    // recently used key by then).
    let mut filler = server.client().unwrap().get_connection().unwrap();
    let value = vec![b'x'; 1024];
    let mut written = 0_u64;
    let exists = |filler: &mut redis::Connection| -> bool {
        redis::cmd("EXISTS").arg(&state).query(filler).unwrap()
    };
    while exists(&mut filler) {
        assert!(
            written < 200_000,
            "the state survived {written} KB of other keys"
        );
        let mut pipe = redis::pipe();
        for i in written..written + 100 {
            pipe.cmd("SET")
                .arg(format!("filler:{i}"))
                .arg(&value)
                .ignore();
        }
        let () = pipe.query(&mut filler).unwrap();
        written += 100;
    }
    let again = store.check(&key, &quota, 1).await.unwrap();
    println!(
        "state evicted after {written} KB of other keys; the throttled key's next check: {again:?}"
    );
    assert!(
        again.is_allowed(),
        "an evicted state is a fresh one: the key is admitted again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_evicting_master_of_a_cluster_is_reported() {
    let cluster = RedisCluster::start();
    let connect = |eviction: &EvictionWatch| {
        RedisConfig::cluster(cluster.urls())
            .prefix("eviction")
            .timeout(Duration::from_secs(10))
            .eviction_watch(eviction)
            .connect()
    };
    let safe = EvictionWatch::new();
    let _store = connect(&safe).await.unwrap();
    assert_eq!(safe.policy(), Some(EvictionPolicy::NoEviction));
    // One master of three evicts: CONFIG GET alone would go to one node at random.
    let (master, _) = cluster.master_of(16_000, 0).unwrap();
    let _: () = cluster
        .query(
            master,
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory-policy")
                .arg("volatile-lru"),
        )
        .unwrap();
    for _ in 0..3 {
        let eviction = EvictionWatch::new();
        let _store = connect(&eviction).await.unwrap();
        assert_eq!(eviction.policy(), evicting("volatile-lru"));
    }
}
