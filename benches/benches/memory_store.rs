//! `MemoryStore` GCRA checks against `governor`'s keyed `RateLimiter` (default DashMap store,
//! default quanta clock), same quota and same keys, in one run.
//!
//! `cargo bench -p benches --bench memory_store`

use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::time::Duration;

use benches::{on_threads, scatter};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use governor::{Quota as GovQuota, RateLimiter};
use ratewarden_core::{Key, Quota};
use ratewarden_memory::MemoryStore;

/// 1 per minute with a burst of 1,000: every key stays live (not yet forgettable) for the
/// whole run, so both maps hold all their keys.
const BURST: u32 = 1_000;

fn ip(i: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0A00_0000 | (i as u32)))
}

/// Twelve-byte string keys, built once: both limiters read the same strings.
fn strings(n: u64) -> Vec<String> {
    (0..n).map(|i| format!("user{i:08}")).collect()
}

fn bench(c: &mut Criterion) {
    let quota = Quota::per_minute(1)
        .and_then(|q| q.with_burst(BURST))
        .expect("valid quota");
    let gov_quota = GovQuota::per_minute(NonZeroU32::MIN)
        .allow_burst(NonZeroU32::new(BURST).expect("non-zero"));
    let mut group = c.benchmark_group("gcra_check");
    group.throughput(Throughput::Elements(1));
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    group.sample_size(20);

    for keys in [1u64, 10_000, 1_000_000] {
        let names = strings(keys);
        for threads in [1usize, 2] {
            let row = format!("{keys}keys/{threads}t");
            // u64 keys
            let ours = MemoryStore::new();
            let theirs = RateLimiter::keyed(gov_quota);
            for i in 0..keys {
                ours.check_sync(&Key::from(i), &quota, 1);
                let _ = theirs.check_key(&i);
            }
            group.bench_function(BenchmarkId::new("u64/rl", &row), |b| {
                b.iter_custom(|iters| {
                    on_threads(threads, iters, |t, i| {
                        let k = scatter(i + t as u64 * 7, keys);
                        std::hint::black_box(ours.check_sync(&Key::from(k), &quota, 1));
                    })
                });
            });
            group.bench_function(BenchmarkId::new("u64/governor", &row), |b| {
                b.iter_custom(|iters| {
                    on_threads(threads, iters, |t, i| {
                        let k = scatter(i + t as u64 * 7, keys);
                        let _ = std::hint::black_box(theirs.check_key(&k));
                    })
                });
            });
            drop((ours, theirs));

            // IP keys
            let ours = MemoryStore::new();
            let theirs = RateLimiter::keyed(gov_quota);
            for i in 0..keys {
                ours.check_sync(&Key::from(ip(i)), &quota, 1);
                let _ = theirs.check_key(&ip(i));
            }
            group.bench_function(BenchmarkId::new("ip/rl", &row), |b| {
                b.iter_custom(|iters| {
                    on_threads(threads, iters, |t, i| {
                        let k = ip(scatter(i + t as u64 * 7, keys));
                        std::hint::black_box(ours.check_sync(&Key::from(k), &quota, 1));
                    })
                });
            });
            group.bench_function(BenchmarkId::new("ip/governor", &row), |b| {
                b.iter_custom(|iters| {
                    on_threads(threads, iters, |t, i| {
                        let k = ip(scatter(i + t as u64 * 7, keys));
                        let _ = std::hint::black_box(theirs.check_key(&k));
                    })
                });
            });
            drop((ours, theirs));

            // 12-byte string keys, built before the run for both (`Key`s and `String`s)
            let keys_rl: Vec<Key> = names.iter().map(|n| Key::from(n.as_str())).collect();
            let ours = MemoryStore::new();
            let theirs = RateLimiter::keyed(gov_quota);
            for name in &names {
                ours.check_sync(&Key::from(name.as_str()), &quota, 1);
                let _ = theirs.check_key(name);
            }
            group.bench_function(BenchmarkId::new("str/rl", &row), |b| {
                b.iter_custom(|iters| {
                    on_threads(threads, iters, |t, i| {
                        let key = &keys_rl[scatter(i + t as u64 * 7, keys) as usize];
                        std::hint::black_box(ours.check_sync(key, &quota, 1));
                    })
                });
            });
            group.bench_function(BenchmarkId::new("str/governor", &row), |b| {
                b.iter_custom(|iters| {
                    on_threads(threads, iters, |t, i| {
                        let name = &names[scatter(i + t as u64 * 7, keys) as usize];
                        let _ = std::hint::black_box(theirs.check_key(name));
                    })
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
