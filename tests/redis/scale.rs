//! The local cache in front of Redis (denied keys, leases) and hot-key splitting, on real
//! servers: what they save, and that they never admit more than their documented bounds.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rl_core::{Key, Quota, Store};
use rl_store_redis::{HotKeys, RedisConfig, RedisStore};
use tests::redis_server::{RedisCluster, RedisServer, script_calls};

/// Loads the scripts (a first call costs `EVALSHA`, then `EVAL`), so that counts start clean.
async fn warm_up(store: &RedisStore) {
    store
        .check(&Key::from("warm-up"), &Quota::per_second(1).unwrap(), 0)
        .await
        .unwrap();
}

fn config(url: String, prefix: &str) -> RedisConfig {
    RedisConfig::new(url)
        .prefix(prefix)
        .timeout(Duration::from_secs(10))
}

#[tokio::test]
async fn a_blocked_key_costs_one_redis_call_not_one_per_request() {
    let server = RedisServer::start();
    let store = config(server.url(), "deny").build().unwrap();
    let quota = Quota::per_minute(10).unwrap();
    let key = Key::from("blocked");
    warm_up(&store).await;
    let before = server.script_calls();
    let mut admitted = 0;
    for _ in 0..10_000 {
        // As the layer does: the I/O-free answer first.
        let decision = match store.check_ready(&key, &quota, 1) {
            Some(result) => result.unwrap(),
            None => store.check(&key, &quota, 1).await.unwrap(),
        };
        admitted += u32::from(decision.is_allowed());
        if !decision.is_allowed() {
            let retry = decision.info().retry_after();
            assert!(
                retry > Duration::from_secs(5) && retry <= Duration::from_secs(6),
                "{retry:?}"
            );
        }
    }
    assert_eq!(admitted, 10);
    // 10 admissions and the first denial; the other 9,989 denials were answered here.
    assert_eq!(server.script_calls() - before, 11);
}

#[tokio::test]
async fn without_the_cache_every_denial_is_a_round_trip() {
    let server = RedisServer::start();
    let store = config(server.url(), "nocache")
        .deny_cache(0)
        .build()
        .unwrap();
    let quota = Quota::per_minute(10).unwrap();
    let key = Key::from("blocked");
    warm_up(&store).await;
    let before = server.script_calls();
    for _ in 0..100 {
        assert!(store.check_ready(&key, &quota, 1).is_none());
        store.check(&key, &quota, 1).await.unwrap();
    }
    assert_eq!(server.script_calls() - before, 100);
}

/// `gateways` stores (each its own local cache) on one server, each with `tasks` clients
/// hammering one key for `run`; returns (admitted, checks, admission times).
async fn hammer(
    stores: Vec<RedisStore>,
    tasks: usize,
    quota: Quota,
    run: Duration,
) -> (u64, u64, Vec<Instant>) {
    let admitted = Arc::new(std::sync::Mutex::new(Vec::new()));
    let checks = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + run;
    let mut handles = Vec::new();
    for store in stores {
        for _ in 0..tasks {
            let (store, admitted, checks) =
                (store.clone(), Arc::clone(&admitted), Arc::clone(&checks));
            handles.push(tokio::spawn(async move {
                let key = Key::from("shared");
                while Instant::now() < deadline {
                    let decision = match store.check_ready(&key, &quota, 1) {
                        Some(result) => result.unwrap(),
                        None => store.check(&key, &quota, 1).await.unwrap(),
                    };
                    checks.fetch_add(1, Ordering::Relaxed);
                    if decision.is_allowed() {
                        admitted.lock().unwrap().push(Instant::now());
                    }
                    tokio::task::yield_now().await;
                }
            }));
        }
    }
    for handle in handles {
        handle.await.unwrap();
    }
    let times = std::mem::take(&mut *admitted.lock().unwrap());
    (times.len() as u64, checks.load(Ordering::SeqCst), times)
}

/// The most admitted in any window of length `window` (times sorted).
fn busiest_window(times: &mut [Instant], window: Duration) -> usize {
    times.sort_unstable();
    let mut best = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end].duration_since(times[start]) >= window {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_never_admits_more_than_redis_would() {
    let server = RedisServer::start();
    let quota = Quota::per_second(50).unwrap().with_burst(10).unwrap();
    let stores = (0..4)
        .map(|_| config(server.url(), "exact").build().unwrap())
        .collect();
    let run = Duration::from_secs(3);
    let (admitted, checks, mut times) = hammer(stores, 4, quota, run).await;
    // GCRA: at most burst + rate × t in any interval of length t.
    let bound = 10 + 50 * 3 + 1;
    assert!(admitted <= bound, "{admitted} admitted, bound {bound}");
    assert!(admitted >= 100, "starved: {admitted} of {bound}");
    assert!(busiest_window(&mut times, Duration::from_secs(1)) <= 10 + 50 + 1);
    assert!(checks > 10 * admitted, "the key was hot: {checks} checks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_overshoot_at_most_the_documented_bound() {
    let server = RedisServer::start();
    let (gateways, batch, period) = (4_u64, 10_u32, Duration::from_millis(200));
    // 100 per second, bursts of 20.
    let quota = Quota::per_second(100).unwrap().with_burst(20).unwrap();
    let stores = (0..gateways)
        .map(|_| {
            config(server.url(), "lease")
                .lease(NonZeroU32::new(batch).unwrap(), period)
                .build()
                .unwrap()
        })
        .collect();
    let run = Duration::from_secs(3);
    let (admitted, checks, mut times) = hammer(stores, 4, quota, run).await;
    // overshoot ≤ min(rate × period, gateways × batch) = min(20, 40) = 20
    let overshoot = (100.0 * period.as_secs_f64()).min((gateways * u64::from(batch)) as f64) as u64;
    let bound = 20 + 100 * 3 + overshoot;
    assert!(admitted <= bound, "{admitted} admitted, bound {bound}");
    let window = busiest_window(&mut times, Duration::from_secs(1)) as u64;
    assert!(window <= 20 + 100 + overshoot, "{window} in one second");
    assert!(admitted >= 200, "starved: {admitted}");
    eprintln!(
        "leases under overload: {admitted} admitted of {checks} checks (bound {bound}; busiest second {window}, bound {})",
        20 + 100 + overshoot
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_save_round_trips_below_the_limit() {
    let server = RedisServer::start();
    let batch = 20_u32;
    let quota = Quota::per_second(100_000).unwrap();
    let stores: Vec<RedisStore> = (0..4)
        .map(|_| {
            config(server.url(), "lease-savings")
                .lease(NonZeroU32::new(batch).unwrap(), Duration::from_secs(1))
                .build()
                .unwrap()
        })
        .collect();
    warm_up(&stores[0]).await;
    let before = server.script_calls();
    let key = Key::from("busy-but-under");
    let mut admitted = 0_u64;
    for _ in 0..500 {
        for store in &stores {
            let decision = match store.check_ready(&key, &quota, 1) {
                Some(result) => result.unwrap(),
                None => store.check(&key, &quota, 1).await.unwrap(),
            };
            admitted += u64::from(decision.is_allowed());
        }
    }
    let calls = server.script_calls() - before;
    assert_eq!(admitted, 2_000);
    // One call per batch of 20.
    assert_eq!(calls, 2_000 / u64::from(batch), "{calls} calls");
}

#[tokio::test]
async fn a_split_key_spreads_over_the_cluster_and_admits_its_parts_shares() {
    let cluster = RedisCluster::start();
    // Per hour: less than one refill during the test.
    let quota = Quota::per_hour(1_600).unwrap();
    for parts in [4_u32, 16] {
        let store = RedisConfig::cluster(cluster.urls())
            .prefix(format!("split{parts}"))
            .timeout(Duration::from_secs(10))
            .deny_cache(0)
            .hot_keys(HotKeys::split(NonZeroU32::new(parts).unwrap()))
            .build()
            .unwrap();
        let masters: Vec<usize> = (0..6)
            .filter(|&n| {
                cluster
                    .query::<String>(n, redis::cmd("INFO").arg("replication"))
                    .unwrap()
                    .contains("role:master")
            })
            .collect();
        let calls = |node: usize| {
            script_calls(
                &cluster
                    .query::<String>(node, redis::cmd("INFO").arg("commandstats"))
                    .unwrap(),
            )
        };
        let before: Vec<u64> = masters.iter().map(|&n| calls(n)).collect();
        let key = Key::from("hot-tenant");
        // As many checks as the quota: with one counter, exactly 1,600 would pass.
        let mut admitted_of_quota = 0;
        for _ in 0..1_600 {
            admitted_of_quota +=
                u32::from(store.check(&key, &quota, 1).await.unwrap().is_allowed());
        }
        let mut admitted = admitted_of_quota;
        for _ in 0..3_000 {
            admitted += u32::from(store.check(&key, &quota, 1).await.unwrap().is_allowed());
        }
        let load: Vec<u64> = masters
            .iter()
            .zip(&before)
            .map(|(&n, b)| calls(n) - b)
            .collect();
        let mean = load.iter().sum::<u64>() as f64 / load.len() as f64;
        let busiest = *load.iter().max().unwrap() as f64;
        eprintln!(
            "{parts} parts: {admitted_of_quota} of the first 1,600 checks admitted, {admitted} of 4,600 (quota 1,600); script calls per master {load:?}"
        );
        // Each part admits its rounded-up share, no more.
        let share = 1_600_u32.div_ceil(parts);
        assert!(admitted <= parts * share + 1, "{admitted}");
        assert!(admitted >= 1_600 * 9 / 10, "{admitted}");
        if parts == 16 {
            // The load spreads: no master takes more than 1.5× the mean.
            assert!(busiest <= 1.5 * mean, "{load:?}");
        }
    }
}

/// 300 checks of `key` within a second on `busy` (over its threshold of 200) split it there;
/// `quiet` hears of it within 3 s.
async fn promote_and_hear(busy: &RedisStore, quiet: &RedisStore, key: &Key, quota: &Quota) {
    for _ in 0..300 {
        busy.check(key, quota, 1).await.unwrap();
    }
    assert_eq!(busy.split_keys(), vec![(key.clone(), 8)]);
    let started = Instant::now();
    while quiet.split_keys().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "the other gateway never heard"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(quiet.split_keys(), vec![(key.clone(), 8)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adaptive_split_is_announced_to_every_gateway_then_demoted() {
    let server = RedisServer::start();
    let hold = Duration::from_secs(2);
    let hot = HotKeys::adaptive(200, NonZeroU32::new(8).unwrap()).hold(hold);
    let build = || {
        config(server.url(), "adaptive")
            .deny_cache(0)
            .hot_keys(hot)
            .build()
            .unwrap()
    };
    let (busy, quiet) = (build(), build());
    // Let both subscribe.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Plenty, and slow to refill: the keys a few hundred checks write live for a while
    // (every key expires once its state is fresh again).
    let quota = Quota::per_hour(1_000_000).unwrap();
    let key = Key::from("tenant-7");
    promote_and_hear(&busy, &quiet, &key, &quota).await;
    // The quiet gateway now counts in the parts, in their own slots.
    for _ in 0..50 {
        quiet.check(&key, &quota, 1).await.unwrap();
    }
    let keys: Vec<String> = server.query(redis::cmd("KEYS").arg("adaptive:*")).unwrap();
    assert!(keys.iter().any(|k| k.contains('.')), "{keys:?}");
    // Other keys stay whole.
    busy.check(&Key::from("cold"), &quota, 1).await.unwrap();
    assert_eq!(busy.split_keys().len(), 1);
    // Nobody renews: both demote after the hold.
    tokio::time::sleep(hold + Duration::from_millis(200)).await;
    assert!(busy.split_keys().is_empty());
    assert!(quiet.split_keys().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adaptive_split_is_announced_across_a_cluster() {
    let cluster = RedisCluster::start();
    let hot = HotKeys::adaptive(200, NonZeroU32::new(8).unwrap()).hold(Duration::from_secs(5));
    let build = |urls: Vec<String>| {
        RedisConfig::cluster(urls)
            .prefix("adaptive-cluster")
            .timeout(Duration::from_secs(10))
            .deny_cache(0)
            .hot_keys(hot)
            .build()
            .unwrap()
    };
    // The two gateways know the cluster through different nodes.
    let urls = cluster.urls();
    let busy = build(urls.clone());
    let quiet = build(urls.into_iter().rev().collect());
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Plenty, and slow to refill: the keys a few hundred checks write live for a while
    // (every key expires once its state is fresh again).
    let quota = Quota::per_hour(1_000_000).unwrap();
    let key = Key::from("tenant-9");
    promote_and_hear(&busy, &quiet, &key, &quota).await;
    // It keeps deciding, and the parts (`{KEY.PART}` keys, in slots of their own) live on the
    // cluster.
    for _ in 0..200 {
        assert!(quiet.check(&key, &quota, 1).await.unwrap().is_allowed());
    }
    let parts: usize = (0..6)
        .map(|node| {
            let keys: Vec<String> = cluster
                .query(node, redis::cmd("KEYS").arg("adaptive-cluster:*"))
                .unwrap();
            keys.iter().filter(|k| k.contains('.')).count()
        })
        .sum();
    assert!(parts > 0, "no part keys on any node");
}
