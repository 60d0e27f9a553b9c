//! The adaptive hot-key tracker's cost per check: steady traffic over 16 and over 128 keys,
//! against a flood of one-off keys (every check a key never seen, each taking a slot from the
//! least-counted key). A flood must not make each check dear: the shard a key falls in is
//! scanned as an array of 16, so a new key costs what a known one does.
//!
//! `cargo bench -p benches --bench hot_keys`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ratewarden_core::{Key, Timestamp};
use ratewarden_redis::RateTracker;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("hot_key_tracker");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(1));
    // One window throughout: a flood within a second is the case that matters.
    let now = Timestamp::from_micros(1);
    // Each check gets its key from the same setup (a clone of a known key, or a new one), so
    // that the two differ in what the tracker does only.
    for keys in [16_u64, 128] {
        let tracker = RateTracker::default();
        let known: Vec<Key> = (0..keys).map(Key::from).collect();
        let mut i = 0;
        group.bench_function(BenchmarkId::new("steady", keys), |b| {
            b.iter_batched(
                || {
                    i = (i + 1) % known.len();
                    known[i].clone()
                },
                |key| tracker.record(black_box(&key), now),
                BatchSize::SmallInput,
            );
        });
    }
    let tracker = RateTracker::default();
    let mut next = 0_u64;
    group.bench_function(BenchmarkId::new("flood", "one-off"), |b| {
        b.iter_batched(
            || {
                next += 1;
                Key::from(next)
            },
            |key| tracker.record(black_box(&key), now),
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
