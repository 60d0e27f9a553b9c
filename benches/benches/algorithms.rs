//! Each algorithm's pure check (no clock, no map), and through `MemoryStore` with one key.
//!
//! `cargo bench -p benches --bench algorithms`

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use ratewarden_core::algorithm::{
    AlgorithmState, FixedWindowState, GcraState, SlidingLogState, SlidingWindowState,
    TokenBucketState,
};
use ratewarden_core::{Algorithm, Key, Quota, Timestamp};
use ratewarden_memory::MemoryStore;

/// Checks at 1 µs steps against 100/s: a mix of admissions and denials.
fn pure<S: AlgorithmState>(c: &mut Criterion, name: &str, quota: &Quota) {
    let mut state = S::default();
    let mut now = 1_700_000_000_000_000_000u64;
    c.bench_function(&format!("pure/{name}"), |b| {
        b.iter(|| {
            now += 1_000;
            std::hint::black_box(state.check(Timestamp::from_nanos(now), 1, quota))
        });
    });
}

fn bench(c: &mut Criterion) {
    let base = Quota::per_second(100).expect("valid quota");
    let q = |a| base.with_algorithm(a).expect("valid quota");
    pure::<GcraState>(c, "gcra", &q(Algorithm::Gcra));
    pure::<TokenBucketState>(c, "token-bucket", &q(Algorithm::TokenBucket));
    pure::<FixedWindowState>(c, "fixed-window", &q(Algorithm::FixedWindow));
    pure::<SlidingWindowState>(c, "sliding-window", &q(Algorithm::SlidingWindow));
    pure::<SlidingLogState>(c, "sliding-log", &q(Algorithm::SlidingLog));

    let store = MemoryStore::new();
    let key = Key::from("user-1");
    for algorithm in Algorithm::ALL {
        let quota = q(algorithm);
        c.bench_function(&format!("memory_store/{algorithm}"), |b| {
            b.iter(|| std::hint::black_box(store.check_sync(&key, &quota, 1)));
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
