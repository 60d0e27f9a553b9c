//! Several limits decided together (`Store::check_all`), against the model of
//! `tests::several`: the memory store, and Redis on one server and on a cluster.

use std::time::Duration;

use ratewarden_core::{Clock, Key, Limit, ManualClock, Quota, Store, Timestamp};
use ratewarden_memory::MemoryStore;
use tests::several::{Model, Tally, assert_agrees, gap, request};

/// 100,000 requests at random times ([`gap`]: about 11 hours), of costs 0-5, under
/// per-user `10/s` and `3000/h` and a per-tenant limit: the memory store admits exactly the
/// requests the model does, and a denied request leaves every limit as it was (a later
/// request would otherwise disagree).
#[test]
fn the_memory_store_decides_several_limits_as_the_model_does() {
    let clock = ManualClock::new(Timestamp::from_micros(1_000_000_000));
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let mut model = Model::default();
    let mut rng = fastrand::Rng::with_seed(0x05e7_eba1);
    let mut tally = Tally::default();
    for n in 0..100_000 {
        clock.advance(Duration::from_micros(gap(&mut rng)));
        let cost = rng.u32(0..=5);
        let limits = request(&mut rng, cost);
        let decided = store.check_all_sync(&limits).unwrap();
        let expected = model.check_all(&limits, clock.now());
        assert_agrees(n, &limits, &decided, &expected);
        tally.count(&decided);
    }
    // Every limit denied some requests: the run tested each one's bound.
    assert!(tally.denied_by.iter().all(|&n| n > 100), "{tally:?}");
    assert!(tally.admitted > 10_000, "{tally:?}");
}

/// A request that one limit denies charges none of the others: a key's remaining count under
/// its loose limit is unchanged by 1,000 requests its strict limit denied.
#[tokio::test]
async fn a_denied_request_charges_no_limit_of_the_memory_store() {
    let store = MemoryStore::new();
    let limits = request(&mut fastrand::Rng::with_seed(7), 1);
    let strict = &limits[0];
    // Spend the per-second limit, then deny 1,000 requests.
    while store
        .check(strict.key(), strict.quota(), 1)
        .await
        .unwrap()
        .is_allowed()
    {}
    let before: Vec<_> = futures_peek(&store, &limits).await;
    for _ in 0..1_000 {
        assert!(!store.check_all(&limits).await.unwrap().is_allowed());
    }
    assert_eq!(futures_peek(&store, &limits).await, before);
}

/// What every limit has left.
async fn futures_peek(store: &MemoryStore, limits: &[ratewarden_core::Limit]) -> Vec<u64> {
    let mut left = Vec::new();
    for limit in limits {
        let peeked = store.peek(limit.key(), limit.quota()).await.unwrap();
        left.push(peeked.info().remaining());
    }
    left
}

/// A Redis store of its own on `urls` (a cluster when several).
async fn redis_store(urls: Vec<String>, prefix: &str) -> ratewarden_redis::RedisStore {
    let config = if urls.len() == 1 {
        ratewarden_redis::RedisConfig::new(urls[0].clone())
    } else {
        ratewarden_redis::RedisConfig::cluster(urls)
    };
    config
        .prefix(prefix)
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap()
}

/// The model run against Redis: `requests` requests at random times, by `check_all_at`; every
/// 10th request first snapshots (`DUMP`) the states its limits name, and if it is denied, the
/// states of every slot where a limit denied must be byte for byte as they were (nothing was
/// written there; a slot whose limits all admitted was counted and refunded, and the model
/// checks that it then decides as if it never was).
async fn redis_agrees_with_the_model(
    store: &ratewarden_redis::RedisStore,
    dump: impl Fn(&[u8]) -> Option<Vec<u8>>,
    requests: u64,
) -> Tally {
    let mut now = 1_700_000_000_000_000;
    let mut model = Model::default();
    let mut rng = fastrand::Rng::with_seed(0x05e7_eba1);
    let mut tally = Tally::default();
    let mut compared = 0;
    for n in 0..requests {
        now += gap(&mut rng);
        let at = Timestamp::from_micros(now);
        let cost = rng.u32(0..=5);
        let limits = request(&mut rng, cost);
        let names: Vec<Vec<u8>> = (limits.iter())
            .map(|l| store.state_key(l.key(), l.quota()))
            .collect();
        let before: Option<Vec<_>> = (n % 10 == 0).then(|| names.iter().map(|k| dump(k)).collect());
        let decided = store.check_all_at(&limits, at).await.unwrap();
        let expected = model.check_all(&limits, at);
        assert_agrees(n, &limits, &decided, &expected);
        if let Some(before) = before
            && !decided.is_allowed()
        {
            let denying: Vec<u16> = (names.iter().zip(decided.as_slice()))
                .filter(|(_, d)| !d.is_allowed())
                .map(|(name, _)| slot(name))
                .collect();
            for (i, name) in names.iter().enumerate() {
                if denying.contains(&slot(name)) {
                    assert_eq!(
                        before[i],
                        dump(name),
                        "request {n} was denied and changed a state"
                    );
                    compared += 1;
                }
            }
        }
        tally.count(&decided);
    }
    assert!(
        compared > requests / 40,
        "{compared} states of denied requests compared"
    );
    tally
}

/// 100,000 requests under per-user `10/s` and `3000/h` and a per-tenant limit on one server:
/// Redis admits exactly the requests the model does, and a denied request leaves the states
/// byte for byte as they were.
#[tokio::test]
async fn redis_decides_several_limits_as_the_model_does() {
    let server = tests::redis_server::RedisServer::start();
    let store = redis_store(vec![server.url()], "several").await;
    let dump = |name: &[u8]| server.query(redis::cmd("DUMP").arg(name)).unwrap();
    let tally = redis_agrees_with_the_model(&store, dump, 100_000).await;
    assert!(tally.denied_by.iter().all(|&n| n > 100), "{tally:?}");
}

/// The same on a cluster of 3 masters, where a user's and a tenant's limits live on different
/// slots: the calls go per slot, and a denial in one is refunded in the other before the
/// next request.
#[tokio::test]
async fn a_redis_cluster_decides_several_limits_as_the_model_does() {
    let cluster = tests::redis_server::RedisCluster::start();
    let store = redis_store(cluster.urls(), "several").await;
    let dump = |name: &[u8]| {
        let (node, _) = cluster.master_of(slot(name), 0).unwrap();
        cluster.query(node, redis::cmd("DUMP").arg(name)).unwrap()
    };
    let tally = redis_agrees_with_the_model(&store, dump, 20_000).await;
    assert!(tally.denied_by.iter().all(|&n| n > 20), "{tally:?}");
}

/// The cluster slot of a state's name: its hash tag's.
fn slot(name: &[u8]) -> u16 {
    let open = name.iter().position(|&b| b == b'{').unwrap();
    let close = open + 1 + name[open + 1..].iter().position(|&b| b == b'}').unwrap();
    crc16::State::<crc16::XMODEM>::calculate(&name[open + 1..close]) % 16_384
}

/// Three quotas on one key cost one script call, on a server and on a cluster.
#[tokio::test]
async fn three_quotas_on_one_key_are_one_call() {
    let quotas: Vec<Quota> = [
        "10/s",
        "1000/h sliding-window",
        "50/min burst 20 token-bucket",
    ]
    .iter()
    .map(|q| q.parse().unwrap())
    .collect();
    let limits: Vec<Limit> = (quotas.iter())
        .map(|q| Limit::new(Key::from("one-key"), *q, 1))
        .collect();
    let server = tests::redis_server::RedisServer::start();
    let store = redis_store(vec![server.url()], "calls").await;
    store.check_all(&limits).await.unwrap(); // loads the library
    let before = server.script_calls();
    for _ in 0..5 {
        assert!(store.check_all(&limits).await.unwrap().is_allowed());
    }
    assert_eq!(server.script_calls() - before, 5);

    let cluster = tests::redis_server::RedisCluster::start();
    let store = redis_store(cluster.urls(), "calls").await;
    let calls = || -> u64 {
        let infos = cluster.on_every_node("INFO commandstats\r\n");
        infos
            .iter()
            .map(|info| tests::redis_server::script_calls(info))
            .sum()
    };
    store.check_all(&limits).await.unwrap();
    let before = calls();
    for _ in 0..5 {
        assert!(store.check_all(&limits).await.unwrap().is_allowed());
    }
    assert_eq!(calls() - before, 5);
}

/// 64 tasks at once on a cluster, each request under its IP's limit and its user's, the users
/// spent: once every call has returned, the IP limits hold exactly the units of the requests
/// admitted, none of those the user limits denied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_refunds_every_unit_a_denied_user_took_from_its_ip() {
    let cluster = tests::redis_server::RedisCluster::start();
    let store = redis_store(cluster.urls(), "refunds").await;
    let ip_quota: Quota = "4000/h sliding-log".parse().unwrap();
    let user_quota: Quota = "5/h".parse().unwrap();
    let request = move |task: u32, i: u32| {
        vec![
            Limit::new(Key::from(format!("ip-{}", task % 8)), ip_quota, 1 + i % 3),
            Limit::new(Key::from(format!("user-{}", task % 4)), user_quota, 1),
        ]
    };
    let tasks: Vec<_> = (0..64u32)
        .map(|task| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut charged = [0u64; 8];
                for i in 0..10 {
                    let limits = request(task, i);
                    if store.check_all(&limits).await.unwrap().is_allowed() {
                        charged[(task % 8) as usize] += u64::from(limits[0].cost());
                    }
                }
                charged
            })
        })
        .collect();
    let mut charged = [0u64; 8];
    for task in tasks {
        for (total, n) in charged.iter_mut().zip(task.await.unwrap()) {
            *total += n;
        }
    }
    // 4 users of 5 each: exactly 20 requests admitted, the rest (620) denied.
    let held = async |ip: usize| {
        let key = Key::from(format!("ip-{ip}"));
        4_000
            - store
                .peek(&key, &ip_quota)
                .await
                .unwrap()
                .info()
                .remaining()
    };
    for (ip, &units) in charged.iter().enumerate() {
        assert_eq!(
            held(ip).await,
            units,
            "ip-{ip} holds units of denied requests"
        );
    }
}
