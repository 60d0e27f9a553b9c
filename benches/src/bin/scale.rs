//! Accuracy and speed of the local cache in front of Redis and of hot-key splitting, measured
//! (BENCHMARKS.md): 4 gateways (4 stores, each with its own local cache and connection, 8
//! clients each) share one `redis-server` this program starts on a free loopback port, and
//! hammer one key. For each configuration: admitted against the quota's bound, Redis script
//! calls per check (`INFO commandstats`), and checks per second; then the same hot key on one
//! in-process memory store, for scale. Last, the design document's two claims about local
//! limits and 1-second caches, simulated on a virtual clock.
//!
//! `cargo run --release -p benches --bin scale [SECS]`

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratewarden_core::{Key, Quota, Store};
use ratewarden_memory::MemoryStore;
use ratewarden_redis::{HotKeys, RedisConfig, RedisStore};
use tests::redis_server::RedisServer;

const GATEWAYS: usize = 4;
const CLIENTS: usize = 8;

struct Run {
    admitted: u64,
    checks: u64,
    elapsed: Duration,
}

/// Every client checks one key as fast as it can for `secs`, as the layer does (the I/O-free
/// answer first).
async fn hammer<S: Store + Clone>(stores: Vec<S>, quota: Quota, run: Duration) -> Run {
    let admitted = Arc::new(AtomicU64::new(0));
    let checks = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut handles = Vec::new();
    for store in stores {
        for _ in 0..CLIENTS {
            let (store, admitted, checks) =
                (store.clone(), Arc::clone(&admitted), Arc::clone(&checks));
            handles.push(tokio::spawn(async move {
                let key = Key::from("hot");
                let mut n = 0_u64;
                while start.elapsed() < run {
                    let decision = match store.check_ready(&key, &quota, 1) {
                        Some(result) => result,
                        None => store.check(&key, &quota, 1).await,
                    };
                    if decision.is_ok_and(|d| d.is_allowed()) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    n += 1;
                    if n.is_multiple_of(64) {
                        tokio::task::yield_now().await;
                    }
                }
                checks.fetch_add(n, Ordering::Relaxed);
            }));
        }
    }
    for handle in handles {
        handle.await.expect("client");
    }
    Run {
        admitted: admitted.load(Ordering::SeqCst),
        checks: checks.load(Ordering::SeqCst),
        elapsed: start.elapsed(),
    }
}

fn row(name: &str, run: &Run, bound: f64, calls: Option<u64>) {
    let per_second = run.checks as f64 / run.elapsed.as_secs_f64();
    let calls = calls.map_or_else(
        || "-".to_owned(),
        |c| format!("{:.4}", c as f64 / run.checks as f64),
    );
    println!(
        "| {name} | {} | {bound:.0} | {:.3} | {calls} | {per_second:.0} |",
        run.admitted,
        run.admitted as f64 / bound
    );
}

async fn scenario(
    redis: &RedisServer,
    name: &str,
    config: impl Fn(RedisConfig) -> RedisConfig,
    quota: Quota,
    run: Duration,
) -> Run {
    let prefix = name.replace(' ', "-").replace(['(', ')', ',', '='], "");
    let stores: Vec<RedisStore> = (0..GATEWAYS)
        .map(|_| {
            config(RedisConfig::new(redis.url()).prefix(prefix.as_str()))
                .build()
                .expect("store")
        })
        .collect();
    stores[0]
        .check(&Key::from("warm-up"), &quota, 0)
        .await
        .expect("Redis answers");
    let before = redis.script_calls();
    let result = hammer(stores, quota, run).await;
    let bound = f64::from(quota.burst())
        + f64::from(quota.count()) * result.elapsed.as_secs_f64() / quota.period().as_secs_f64();
    row(name, &result, bound, Some(redis.script_calls() - before));
    result
}

/// The design document's hybrid scheme: each gateway caches the Redis count for `ttl` and
/// decides on `cached + its own increments since`; Redis gets every increment. A user sends
/// `rate` requests per second, round-robin over `gateways`, against a fixed window of `limit`
/// per minute, for `minutes`. Returns (cache hit ratio, most admitted in one window).
fn simulate_ttl_cache(
    gateways: usize,
    rate: u64,
    ttl_ms: u64,
    limit: u64,
    minutes: u64,
) -> (f64, u64) {
    let mut redis_count = 0_u64;
    let mut window = 0_u64;
    // Per gateway: (count seen, fetched at ms, own increments since).
    let mut caches = vec![(0_u64, None::<u64>, 0_u64); gateways];
    let (mut hits, mut requests, mut admitted_in_window, mut worst) = (0, 0, 0, 0);
    let step = 1_000 / rate;
    for (i, t) in (0..minutes * 60_000)
        .step_by(usize::try_from(step).unwrap_or(1))
        .enumerate()
    {
        if t / 60_000 != window {
            window = t / 60_000;
            redis_count = 0;
            worst = worst.max(admitted_in_window);
            admitted_in_window = 0;
            for cache in &mut caches {
                cache.1 = None;
            }
        }
        let cache = &mut caches[i % gateways];
        requests += 1;
        match cache.1 {
            Some(at) if t - at < ttl_ms => hits += 1,
            _ => *cache = (redis_count, Some(t), 0),
        }
        if cache.0 + cache.2 < limit {
            cache.2 += 1;
            redis_count += 1;
            admitted_in_window += 1;
        }
    }
    (
        f64::from(hits) / f64::from(requests),
        worst.max(admitted_in_window),
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3);
    let run = Duration::from_secs(secs);
    let redis = RedisServer::start();
    let blocked = Quota::per_second(100).expect("quota");
    println!(
        "One hot key, {GATEWAYS} gateways × {CLIENTS} clients, {secs} s each; bound = burst + rate × t.\n"
    );
    println!("Blocked hot key (quota {blocked}, offered far more):\n");
    println!(
        "| configuration | admitted | bound | admitted / bound | Redis calls per check | checks/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let lease = |batch: u32| {
        move |c: RedisConfig| {
            c.lease(
                NonZeroU32::new(batch).expect("batch"),
                Duration::from_millis(100),
            )
        }
    };
    let split = |c: RedisConfig| c.hot_keys(HotKeys::split(NonZeroU32::new(8).expect("8")));
    scenario(
        &redis,
        "plain (no cache)",
        |c| c.deny_cache(0),
        blocked,
        run,
    )
    .await;
    let cached = scenario(&redis, "denied-key cache", |c| c, blocked, run).await;
    scenario(&redis, "leases of 10 (100 ms)", lease(10), blocked, run).await;
    scenario(&redis, "leases of 50 (100 ms)", lease(50), blocked, run).await;
    scenario(&redis, "split 8 + cache", split, blocked, run).await;
    let memory = MemoryStore::new();
    let stores = vec![memory; GATEWAYS];
    let local = hammer(stores, blocked, run).await;
    let bound =
        f64::from(blocked.burst()) + f64::from(blocked.count()) * local.elapsed.as_secs_f64();
    row("one memory store (for scale)", &local, bound, None);
    let ratio = (local.checks as f64 / local.elapsed.as_secs_f64())
        / (cached.checks as f64 / cached.elapsed.as_secs_f64());
    println!("\nmemory store / denied-key cache throughput on the blocked key: {ratio:.2}");

    let busy = Quota::per_second(1_000_000).expect("quota");
    println!("\nBusy key under its limit (quota {busy}):\n");
    println!(
        "| configuration | admitted | bound | admitted / bound | Redis calls per check | checks/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    scenario(&redis, "busy plain", |c| c, busy, run).await;
    scenario(&redis, "busy leases of 10", lease(10), busy, run).await;
    scenario(&redis, "busy leases of 50", lease(50), busy, run).await;
    scenario(&redis, "busy split 8", split, busy, run).await;

    println!("\nThe design document's claims, simulated:\n");
    let per_gateway = Quota::per_second(100).expect("quota");
    let gateways: Vec<MemoryStore> = (0..GATEWAYS).map(|_| MemoryStore::new()).collect();
    let alone = hammer(gateways, per_gateway, run).await;
    let bound = f64::from(per_gateway.burst())
        + f64::from(per_gateway.count()) * alone.elapsed.as_secs_f64();
    println!(
        "- local-only limits: {GATEWAYS} gateways, each its own memory store at {per_gateway}: {} admitted against a fleet quota of {bound:.0}: {:.2}× (claim: about N = {GATEWAYS}×)",
        alone.admitted,
        alone.admitted as f64 / bound
    );
    for (gateways, ttl) in [(1, 1_000), (2, 1_000), (10, 1_000), (10, 5_000), (2, 100)] {
        // The worst over limits 90..=110 per minute: where the limit falls against the cache
        // refreshes decides the overage.
        let (mut hits, mut overage) = (0.0, 0);
        for limit in 90..=110 {
            let (h, worst) = simulate_ttl_cache(gateways, 10, ttl, limit, 10);
            hits = h;
            overage = overage.max(worst.saturating_sub(limit));
        }
        println!(
            "- a {ttl} ms count cache, 10 req/s round-robin over {gateways} gateway(s), limits of 90 to 110 per minute: {:.1}% cache hits, overage up to {overage}",
            hits * 100.0
        );
    }
}
