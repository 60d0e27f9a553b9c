//! Idle keys leave Redis by themselves (scenario E3): every state expires once it equals a
//! fresh one, so a burst of one-off keys costs Redis memory for a window, not for ever.

use std::time::{Duration, Instant};

use ratewarden_core::{Algorithm, Key, Quota, Store};
use ratewarden_redis::RedisConfig;
use tests::redis_server::RedisServer;

/// One-off keys checked once each: 100,000, or `RL_EXPIRY_KEYS` (a million takes a minute on
/// this machine's debug build: its figure is in BENCHMARKS.md, with the command).
fn keys() -> u64 {
    std::env::var("RL_EXPIRY_KEYS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_off_keys_leave_redis_within_their_window_and_5_s() {
    let keys_checked = keys();
    let server = RedisServer::start();
    let store = RedisConfig::new(server.url())
        .prefix("expiry")
        .deny_cache(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let info_memory = || -> u64 {
        let info: String = server.query(redis::cmd("INFO").arg("memory")).unwrap();
        (info.lines())
            .find_map(|line| line.strip_prefix("used_memory:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap()
    };
    let dbsize = || -> u64 { server.query(&redis::cmd("DBSIZE")).unwrap() };
    let window = Duration::from_secs(2);
    let quotas = [
        Quota::new(5, window).unwrap(),
        Quota::new(5, window)
            .unwrap()
            .with_algorithm(Algorithm::FixedWindow)
            .unwrap(),
        Quota::new(5, window)
            .unwrap()
            .with_algorithm(Algorithm::SlidingLog)
            .unwrap(),
    ];
    // The baseline: the library loaded, nothing of ours stored.
    store
        .check(&Key::from("warm"), &quotas[0], 0)
        .await
        .unwrap();
    let (baseline_keys, baseline_memory) = (dbsize(), info_memory());
    let started = Instant::now();
    let tasks: Vec<_> = (0..8_u64)
        .map(|task| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in (task..keys_checked).step_by(8) {
                    let quota = &quotas[(i % 3) as usize];
                    store.check(&Key::from(i), quota, 1).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let filled = started.elapsed();
    let (peak_keys, peak_memory) = (dbsize(), info_memory());
    eprintln!(
        "{keys_checked} keys checked in {filled:?}: {peak_keys} keys, {peak_memory} bytes used"
    );
    // Those of the last window at least (the first may have gone already).
    assert!(peak_keys > baseline_keys + 1_000, "{peak_keys} keys");
    // Each key expires at most a window after its check; Redis's active expiry reaches it
    // within seconds after that.
    let deadline = Instant::now() + window + Duration::from_secs(5);
    while dbsize() > baseline_keys && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (keys, memory) = (dbsize(), info_memory());
    eprintln!(
        "{:?} after the last check: {keys} keys (baseline {baseline_keys}), {memory} bytes (baseline {baseline_memory})",
        started.elapsed() - filled
    );
    assert_eq!(keys, baseline_keys);
    // Memory back within 1 MiB of the baseline (allocator slack, Redis's own buffers).
    assert!(
        memory < baseline_memory + (1 << 20),
        "{memory} bytes, baseline {baseline_memory}"
    );
}
