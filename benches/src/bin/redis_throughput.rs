//! Throughput, latency and Redis CPU of a GCRA check against one Redis, at concurrency 1, 16
//! and 64 (one key, and 64 keys): `RedisStore::check` against a bare redis-rs loop running a
//! minimal GCRA script (read the clock, the state, write it with a TTL) by EVALSHA on one
//! multiplexed connection. Redis CPU is `INFO commandstats` `usec` over the checks made.
//! `benches/scripts/redis_throughput.sh` starts the server, runs this and `redis-benchmark`
//! side by side.
//!
//! `redis_throughput REDIS_URL SECONDS`; with several comma-separated URLs, a Redis Cluster.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ratewarden_core::{Key, Quota, Store};
use ratewarden_redis::{RedisConfig, RedisStore};

/// The least a GCRA check in Redis does: read the clock and the state, write the state with
/// a TTL. `ARGV[1]` the emission interval (µs), `ARGV[2]` the burst.
const MINIMAL_GCRA: &str = include_str!("../../lua/minimal_gcra.lua");

/// The bare loop's connection: to one server, or to the cluster.
#[derive(Clone)]
enum Bare {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

struct Figures {
    checks: u64,
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
        checks: all.len() as u64,
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
    let nodes: Vec<String> = url.split(',').map(str::to_owned).collect();
    let cluster = nodes.len() > 1;
    let config = if cluster {
        RedisConfig::cluster(nodes.iter().cloned())
    } else {
        RedisConfig::new(url.clone())
    };
    // Every check goes to Redis (no denied-key cache), as in the bare loop.
    let store = config
        .prefix("bench")
        .deny_cache(0)
        .timeout(Duration::from_secs(5))
        .connect()
        .await?;
    let quota = Quota::per_second(1_000_000)?;
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
    let stats = Stats::new(&nodes)?;
    let script = redis::Script::new(MINIMAL_GCRA);
    println!(
        "| concurrency | keys | rl checks/s | bare EVALSHA/s | rl / bare | rl p50 / p99 (µs) | bare p50 / p99 (µs) | rl checks per call | Redis µs per check: rl | bare |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (concurrency, keys) in [(1, 1), (16, 1), (64, 1), (64, 64)] {
        let names: Vec<Key> = (0..keys)
            .map(|i| Key::from(format!("bench-key-{i}")))
            .collect();
        let states: Vec<Vec<u8>> = names.iter().map(|k| store.state_key(k, &quota)).collect();
        let next = Arc::new(AtomicUsize::new(0));
        let pick = move || next.fetch_add(1, Ordering::Relaxed) % keys;
        stats.reset()?;
        let ours = {
            let (store, names, pick) = (store.clone(), names.clone(), pick.clone());
            measure(concurrency, seconds, move || {
                let (store, key) = (store.clone(), names[pick()].clone());
                async move {
                    let _ = store.check(&key, &quota, 1).await;
                }
            })
            .await
        };
        let (ours_calls, ours_usec) = stats.scripts()?;
        stats.reset()?;
        let theirs = {
            let (bare, script) = (bare.clone(), script.clone());
            measure(concurrency, seconds, move || {
                let (bare, script) = (bare.clone(), script.clone());
                let state = states[pick()].clone();
                async move {
                    let mut invocation = script.prepare_invoke();
                    invocation
                        .key(state)
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
        let (_, theirs_usec) = stats.scripts()?;
        println!(
            "| {concurrency} | {keys} | {:.0} | {:.0} | {:.2} | {} / {} | {} / {} | {:.1} | {:.2} | {:.2} |",
            ours.per_second,
            theirs.per_second,
            ours.per_second / theirs.per_second,
            ours.p50_us,
            ours.p99_us,
            theirs.p50_us,
            theirs.p99_us,
            ours.checks as f64 / ours_calls.max(1) as f64,
            ours_usec as f64 / ours.checks.max(1) as f64,
            theirs_usec as f64 / theirs.checks.max(1) as f64,
        );
    }
    if !cluster {
        println!();
        memory_usage(&store, &url).await?;
    }
    let key = store.state_key(&Key::from("bench-key-0"), &quota);
    println!(
        "EVALSHA {} {} {} {}",
        script.get_hash(),
        String::from_utf8_lossy(&key),
        quota.emission_interval_micros(),
        quota.burst()
    );
    Ok(())
}

/// Redis's own accounting of the scripts it ran, over every node.
struct Stats(Vec<redis::Client>);

impl Stats {
    fn new(nodes: &[String]) -> redis::RedisResult<Self> {
        let clients = nodes.iter().map(|node| redis::Client::open(node.as_str()));
        Ok(Self(clients.collect::<Result<_, _>>()?))
    }

    fn reset(&self) -> redis::RedisResult<()> {
        for client in &self.0 {
            redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .exec(&mut client.get_connection()?)?;
        }
        Ok(())
    }

    /// The calls of scripts and functions (`FCALL`, `EVALSHA` and `EVAL`) since the reset, and
    /// the microseconds of CPU they took.
    fn scripts(&self) -> redis::RedisResult<(u64, u64)> {
        let (mut calls, mut usec) = (0, 0);
        for client in &self.0 {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut client.get_connection()?)?;
            let (c, u) = benches::script_stats(&info);
            calls += c;
            usec += u;
        }
        Ok((calls, usec))
    }
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
