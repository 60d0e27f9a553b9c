//! Where a key's state lives on a cluster: in the slot of the whole key, whatever its bytes
//! (no byte ends the hash tag early), and in batches that never span two states.

use std::collections::HashMap;
use std::time::Duration;

use ratewarden_core::{Key, Quota, Store};
use ratewarden_redis::RedisConfig;
use ratewarden_tower::breaker::{BreakerState, CircuitBreaker};
use tests::redis_server::RedisCluster;

/// The slot Redis Cluster hashes `name` to: CRC16 of its hash tag (the bytes between the first
/// `{` and the first `}` after it, if any), else of the whole name.
fn slot_of(name: &[u8]) -> u16 {
    let tag = name.iter().position(|&b| b == b'{').and_then(|open| {
        let close = open + 1 + name[open + 1..].iter().position(|&b| b == b'}')?;
        (close > open + 1).then(|| &name[open + 1..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(name)) % 16_384
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_hashed_whole_and_keys_that_begin_with_a_brace_spread_over_every_master() {
    let cluster = RedisCluster::start();
    let store = RedisConfig::cluster(cluster.urls())
        .prefix("slots")
        .deny_cache(0)
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    let quota = Quota::per_hour(100).unwrap();
    // Random byte strings, heavy in the bytes that shape a name: each state is where Redis's
    // own CLUSTER KEYSLOT puts it, in the slot of the key's whole tag (ending just before the
    // limit), and holds the check.
    let mut rng = fastrand::Rng::with_seed(1);
    let alphabet = b"{}:%\0\x7f\x80\xff a";
    for round in 0..300 {
        let len = rng.usize(0..=300);
        let bytes: Vec<u8> = (0..len)
            .map(|_| match round % 2 {
                0 => alphabet[rng.usize(..alphabet.len())],
                _ => rng.u8(..),
            })
            .collect();
        let key = Key::from_bytes(&bytes);
        let decision = store.check(&key, &quota, 1).await.unwrap();
        assert_eq!(decision.info().remaining(), 99, "{bytes:?}");
        let name = store.state_key(&key, &quota);
        let keyslot: u16 = cluster
            .query(0, redis::cmd("CLUSTER").arg("KEYSLOT").arg(&name))
            .unwrap();
        assert_eq!(keyslot, slot_of(&name), "{name:?}");
        let whole_tag = &name[name.iter().position(|&b| b == b'{').unwrap() + 1..name.len() - 18];
        assert_eq!(
            keyslot,
            crc16::State::<crc16::XMODEM>::calculate(whole_tag) % 16_384,
            "{name:?}: hashed on part of its key"
        );
        let (master, _) = cluster.master_of(keyslot, 0).unwrap();
        let exists: u32 = cluster
            .query(master, redis::cmd("EXISTS").arg(&name))
            .unwrap();
        assert_eq!(exists, 1, "{name:?} is not on the master of its slot");
    }
    // 3,000 keys that all begin with `}`: a third on each master, within 10%.
    let mut per_master: HashMap<usize, u32> = HashMap::new();
    for i in 0..3_000 {
        let key = Key::from(format!("}}{{evil}}{i}"));
        store.check(&key, &quota, 1).await.unwrap();
        let slot = slot_of(&store.state_key(&key, &quota));
        *per_master
            .entry(cluster.master_of(slot, 0).unwrap().0)
            .or_default() += 1;
    }
    assert_eq!(per_master.len(), 3, "{per_master:?}");
    for (&master, &keys) in &per_master {
        assert!(
            (900..=1_100).contains(&keys),
            "master {master}: {keys} keys of 3,000"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn states_that_share_a_queue_are_decided_in_batches_of_their_own() {
    let cluster = RedisCluster::start();
    let store = RedisConfig::cluster(cluster.urls())
        .prefix("queues")
        .deny_cache(0)
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap()
        .with_one_queue();
    let breaker = CircuitBreaker::new(store.clone());
    let quota = Quota::per_hour(1_000).unwrap();
    // Eight keys on different slots, 32 checks of each at once, every one sharing a queue.
    let keys: Vec<Key> = (0..8).map(|i| Key::from(format!("queue-{i}"))).collect();
    let slots: std::collections::HashSet<u16> = keys
        .iter()
        .map(|key| slot_of(&store.state_key(key, &quota)))
        .collect();
    assert!(slots.len() > 1);
    let tasks: Vec<_> = (0..256)
        .map(|i| {
            let (breaker, key) = (breaker.clone(), keys[i % 8].clone());
            tokio::spawn(async move { breaker.check(&key, &quota, 1).await })
        })
        .collect();
    for task in tasks {
        assert!(task.await.unwrap().unwrap().is_allowed());
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    for key in &keys {
        let left = store.peek(key, &quota).await.unwrap().info().remaining();
        assert_eq!(left, 1_000 - 32, "{key:?}");
    }
}
