//! Redis's work for several limits of one request: `check_all` of 3 GCRA quotas, and of 3 and
//! 5 quotas of mixed algorithms, on one key (one script call each), and of 3 limits on 3 keys,
//! against a check of one GCRA quota, one at a time on one server (no batching), by
//! `INFO commandstats`: script calls per request and the microseconds of Redis CPU per
//! request; then a reservation and its settle of one GCRA quota (`reserve`, `settle`).
//! `benches/scripts/redis_limits.sh` starts the server.
//!
//! `redis_limits REDIS_URL REQUESTS`

use std::time::Duration;

use ratewarden_core::{Key, Limit, Quota, Store};
use ratewarden_redis::RedisConfig;

/// Script calls and their CPU (µs) since the last `CONFIG RESETSTAT`.
fn scripts(client: &redis::Client) -> redis::RedisResult<(u64, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut client.get_connection()?)?;
    Ok(benches::script_stats(&info))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .ok_or("usage: redis_limits REDIS_URL REQUESTS")?;
    let requests: u64 = args.next().map_or(Ok(20_000), |n| n.parse())?;
    let client = redis::Client::open(url.as_str())?;
    let store = RedisConfig::new(url)
        .deny_cache(0)
        .timeout(Duration::from_secs(5))
        .connect()
        .await?;
    let quotas: Vec<Quota> = [
        "1000000/s",
        "1000000/h sliding-window",
        "1000000/s burst 1000000 token-bucket",
        "1000000/h fixed-window",
        "500000/s",
    ]
    .iter()
    .map(|q| q.parse())
    .collect::<Result<_, _>>()?;
    let one_key = |n: usize, i: u64| -> Vec<Limit> {
        let key = Key::from(i % 1_000);
        quotas[..n]
            .iter()
            .map(|q| Limit::new(key.clone(), *q, 1))
            .collect()
    };
    let three_keys = |i: u64| -> Vec<Limit> {
        (0..3)
            .map(|k| Limit::new(Key::from(format!("k{k}-{}", i % 1_000)), quotas[k], 1))
            .collect()
    };
    println!("| request | script calls per request | Redis µs per request | ratio to one quota |");
    println!("|---|---|---|---|");
    let mut base = None;
    let gcra: Vec<Quota> = ["1000000/s", "500000/s", "100000/s"]
        .iter()
        .map(|q| q.parse())
        .collect::<Result<_, _>>()?;
    let three_gcra = |i: u64| -> Vec<Limit> {
        let key = Key::from(i % 1_000);
        gcra.iter()
            .map(|q| Limit::new(key.clone(), *q, 1))
            .collect()
    };
    let cases: [(&str, Box<dyn Fn(u64) -> Vec<Limit>>); 5] = [
        ("one quota (`check`)", Box::new(|i| one_key(1, i))),
        (
            "3 GCRA quotas on one key (`check_all`)",
            Box::new(three_gcra),
        ),
        (
            "3 quotas on one key (`check_all`)",
            Box::new(|i| one_key(3, i)),
        ),
        (
            "5 quotas on one key (`check_all`)",
            Box::new(|i| one_key(5, i)),
        ),
        ("3 limits on 3 keys (`check_all`)", Box::new(three_keys)),
    ];
    for (name, limits) in cases {
        // Warm up (the library loaded, the keys made), then count.
        for i in 0..2_000 {
            store.check_all(&limits(i)).await?;
        }
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .exec(&mut client.get_connection()?)?;
        for i in 0..requests {
            let limits = limits(i);
            if let [one] = &limits[..] {
                store.check(one.key(), one.quota(), 1).await?;
            } else {
                store.check_all(&limits).await?;
            }
        }
        let (calls, usec) = scripts(&client)?;
        let per = usec as f64 / requests as f64;
        let ratio = per / *base.get_or_insert(per);
        println!(
            "| {name} | {:.2} | {per:.2} | {ratio:.2} |",
            calls as f64 / requests as f64
        );
    }
    // A reservation and its settle, one quota: two calls, one at each end of a request.
    let hold = Duration::from_secs(60);
    let reserve_settle = async |i: u64| -> Result<(), ratewarden_core::StoreError> {
        let limit = Limit::new(Key::from(i % 1_000), quotas[0], 2);
        let reservation = store.reserve(&[limit], hold).await?;
        store.settle(reservation, 1).await
    };
    for i in 0..2_000 {
        reserve_settle(i).await?;
    }
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .exec(&mut client.get_connection()?)?;
    for i in 0..requests {
        reserve_settle(i).await?;
    }
    let (calls, usec) = scripts(&client)?;
    let per = usec as f64 / requests as f64;
    println!(
        "| one quota reserved and settled (`reserve` + `settle`) | {:.2} | {per:.2} | {:.2} |",
        calls as f64 / requests as f64,
        per / base.unwrap_or(per)
    );
    Ok(())
}
