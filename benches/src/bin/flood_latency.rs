//! The latency of one steady key's checks while another thread floods the store with
//! 1,000,000 new keys, for `MemoryStore` and for governor's keyed `RateLimiter` (its default
//! DashMap store), in one run: the percentiles of the steady key's check times, and how long
//! the flood took.
//!
//! `cargo run --release -p benches --bin flood_latency [FLOOD_KEYS]`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use governor::{Quota as GovQuota, RateLimiter};
use ratewarden_core::{Key, Quota};
use ratewarden_memory::MemoryStore;

fn report(name: &str, flood: Duration, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    let at = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
    println!(
        "{name:<10} flood {flood:>8.2?}  steady key: n={} p50={:>7.2?} p99={:>7.2?} p99.9={:>8.2?} max={:>9.2?}",
        samples.len(),
        at(0.50),
        at(0.99),
        at(0.999),
        samples[samples.len() - 1]
    );
}

/// Floods `check(key)` with `keys` new keys on one thread while another times `steady()`.
fn run(
    keys: u64,
    check: impl Fn(u64) + Sync,
    steady: impl Fn() + Sync,
) -> (Duration, Vec<Duration>) {
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let timer = scope.spawn(|| {
            let mut samples = Vec::with_capacity(4_000_000);
            while !done.load(Ordering::Relaxed) {
                let start = Instant::now();
                steady();
                samples.push(start.elapsed());
            }
            samples
        });
        let start = Instant::now();
        for i in 0..keys {
            check(i);
        }
        let flood = start.elapsed();
        done.store(true, Ordering::Relaxed);
        (flood, timer.join().unwrap_or_default())
    })
}

fn main() {
    let keys: u64 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    // Every flood key stays live for the whole run (1 per minute, burst 10).
    let quota = Quota::per_minute(1)
        .and_then(|q| q.with_burst(10))
        .expect("a valid quota");
    let gov_quota =
        GovQuota::per_minute(NonZeroU32::MIN).allow_burst(NonZeroU32::new(10).expect("not zero"));
    let steady = Key::from("steady");
    for round in 0..3 {
        println!("round {round}, {keys} new keys");
        let ours = MemoryStore::new();
        let (flood, samples) = run(
            keys,
            |i| {
                black_box(ours.check_sync(&Key::from(i), &quota, 1));
            },
            || {
                black_box(ours.check_sync(&steady, &quota, 1));
            },
        );
        report("rl", flood, samples);
        let theirs = RateLimiter::keyed(gov_quota);
        let (flood, samples) = run(
            keys,
            |i| {
                let _ = black_box(theirs.check_key(&i));
            },
            || {
                let _ = black_box(theirs.check_key(&u64::MAX));
            },
        );
        report("governor", flood, samples);
    }
}
