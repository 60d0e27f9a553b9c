//! Throughput and latency of a GCRA check against one Redis, at concurrency 1, 16 and 64:
//! `RedisStore::check` against a bare redis-rs loop running the same script by EVALSHA on one
//! multiplexed connection. `benches/scripts/redis_throughput.sh` starts the server, runs this
//! and `redis-benchmark` side by side.
//!
//! `redis_throughput REDIS_URL SECONDS`; with several comma-separated URLs, a Redis Cluster.

use std::time::{Duration, Instant};

use ratewarden_core::{Key, Quota, Store};
use ratewarden_redis::{RedisConfig, RedisStore};

/// The GCRA script the store runs, for the bare loop.
const GCRA: &str = concat!(
    include_str!("../../../crates/ratewarden-redis/src/lua/prelude.lua"),
    include_str!("../../../crates/ratewarden-redis/src/lua/gcra.lua")
);

/// The bare loop's connection: to one server, or to the cluster.
#[derive(Clone)]
enum Bare {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

struct Figures {
    per_second: f64,
    p50_us: u64,
    p99_us: u64,
}

/// Runs `concurrency` tasks calling `op` for `seconds`; returns throughput and latencies.
async fn measure<F, Fut>(concurrency: usize, seconds: u64, op: F) -> Figures
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    op().await;
                    latencies.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap_or_default());
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let at = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    Figures {
        per_second: all.len() as f64 / elapsed,
        p50_us: at(0.50),
        p99_us: at(0.99),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .ok_or("usage: redis_throughput REDIS_URL SECONDS")?;
    let seconds: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(5);
    let nodes: Vec<&str> = url.split(',').collect();
    let cluster = nodes.len() > 1;
    let config = if cluster {
        RedisConfig::cluster(nodes.iter().copied())
    } else {
        RedisConfig::new(url.clone())
    };
    let store = config
        .prefix("bench")
        .timeout(Duration::from_secs(5))
        .connect()
        .await?;
    let quota = Quota::per_second(1_000_000)?;
    let key = Key::from("bench-key");
    let state_key = store.state_key(&key, &quota);
    let bare = if cluster {
        Bare::Cluster(
            redis::cluster::ClusterClient::new(nodes.clone())?
                .get_async_connection()
                .await?,
        )
    } else {
        Bare::Single(
            redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        )
    };
    let script = redis::Script::new(GCRA);
    // The pool is for a single server.
    let pooled = if cluster {
        None
    } else {
        let config = RedisConfig::new(url.clone()).prefix("bench").pool(64);
        Some(config.timeout(Duration::from_secs(5)).connect().await?)
    };
    println!(
        "| concurrency | rl checks/s | bare EVALSHA/s | rl / bare | rl p50 / p99 (µs) | bare p50 / p99 (µs) | rl with a deadpool pool: checks/s, p50 / p99 (µs) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for concurrency in [1, 16, 64] {
        let ours = {
            let (store, key): (RedisStore, Key) = (store.clone(), key.clone());
            measure(concurrency, seconds, move || {
                let (store, key) = (store.clone(), key.clone());
                async move {
                    let _ = store.check(&key, &quota, 1).await;
                }
            })
            .await
        };
        let theirs = {
            let (bare, script, state_key) = (bare.clone(), script.clone(), state_key.clone());
            measure(concurrency, seconds, move || {
                let (bare, script, state_key) = (bare.clone(), script.clone(), state_key.clone());
                async move {
                    let mut invocation = script.prepare_invoke();
                    invocation
                        .key(state_key)
                        .arg("c")
                        .arg(1)
                        .arg("")
                        .arg(quota.emission_interval_micros())
                        .arg(quota.burst());
                    let _: Result<Vec<i64>, _> = match bare {
                        Bare::Single(mut c) => invocation.invoke_async(&mut c).await,
                        Bare::Cluster(mut c) => invocation.invoke_async(&mut c).await,
                    };
                }
            })
            .await
        };
        let pool = match &pooled {
            Some(pooled) => {
                let (store, key) = (pooled.clone(), key.clone());
                let figures = measure(concurrency, seconds, move || {
                    let (store, key) = (store.clone(), key.clone());
                    async move {
                        let _ = store.check(&key, &quota, 1).await;
                    }
                })
                .await;
                format!(
                    "{:.0}, {} / {}",
                    figures.per_second, figures.p50_us, figures.p99_us
                )
            }
            None => "-".to_owned(),
        };
        println!(
            "| {concurrency} | {:.0} | {:.0} | {:.2} | {} / {} | {} / {} | {pool} |",
            ours.per_second,
            theirs.per_second,
            ours.per_second / theirs.per_second,
            ours.p50_us,
            ours.p99_us,
            theirs.p50_us,
            theirs.p99_us,
        );
    }
    if !cluster {
        println!();
        memory_usage(&store, &url).await?;
    }
    println!(
        "EVALSHA {} {}",
        script.get_hash(),
        String::from_utf8_lossy(&state_key)
    );
    Ok(())
}

/// `MEMORY USAGE` of one key's state for each algorithm, after three checks of cost 1 (a
/// sliding log then holds three entries). Averaged over 100 keys.
async fn memory_usage(store: &RedisStore, url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut connection = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    println!("| algorithm | Redis type | MEMORY USAGE per key (bytes) |");
    println!("|---|---|---:|");
    for algorithm in ratewarden_core::Algorithm::ALL {
        let quota = Quota::per_hour(100)?.with_algorithm(algorithm)?;
        let mut total = 0u64;
        let mut kind = String::new();
        for i in 0..100u64 {
            let key = Key::from(format!("user-{i:06}"));
            for _ in 0..3 {
                store.check(&key, &quota, 1).await?;
            }
            let name = store.state_key(&key, &quota);
            let bytes: u64 = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&name)
                .query_async(&mut connection)
                .await?;
            total += bytes;
            kind = redis::cmd("TYPE")
                .arg(&name)
                .query_async(&mut connection)
                .await?;
        }
        println!("| {algorithm} | {kind} | {} |", total / 100);
    }
    Ok(())
}
