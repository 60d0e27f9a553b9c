//! What a tenant's plan costs a check: a cache hit of `tenant::CachedResolver` (the fast path a
//! layer takes, `resolve_ready`), for one tenant and for 10,000 in turn; a miss, against a
//! resolver that answers at once (a new tenant each time, in a full cache); and, measured in
//! the same run, the memory-store check the plan is added to.
//!
//! `cargo bench -p benches --bench tenant`

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ratewarden_core::{Key, Quota, Store};
use ratewarden_memory::MemoryStore;
use ratewarden_tower::tenant::{CachedResolver, Plan, Resolution, ResolveError};
use std::hint::black_box;

const TENANTS: u64 = 10_000;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("tenant");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(1));

    let quota = Quota::per_second(1_000_000).expect("valid quota");
    let plan = Plan::new(
        "pro",
        [
            ("rps", quota),
            ("rph", Quota::per_hour(1_000_000).expect("valid quota")),
        ],
    )
    .expect("valid plan");
    let resolver = move |_: &Key| {
        let plan = plan.clone();
        async move { Ok::<_, ResolveError>(Some(plan)) }
    };
    // The lookup timeout needs tokio's timer; the futures complete at their first poll.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let _context = runtime.enter();
    let cache = CachedResolver::builder(resolver)
        .max_entries(TENANTS as usize)
        .build()
        .expect("valid settings");

    let store = MemoryStore::new();
    let key = Key::from(7u64);
    group.bench_function("check/memory-store", |b| {
        b.iter(|| store.check_ready(black_box(&key), &quota, 1));
    });

    let keys: Vec<Key> = (0..TENANTS).map(Key::from).collect();
    for key in &keys {
        assert!(matches!(resolve_now(&cache, key), Resolution::Plan(_)));
    }
    group.bench_function(BenchmarkId::new("hit", 1), |b| {
        b.iter(|| cache.resolve_ready(black_box(&keys[7])));
    });
    let mut next = 0;
    group.bench_function(BenchmarkId::new("hit", TENANTS), |b| {
        b.iter(|| {
            next = (next + 7_919) % keys.len();
            cache.resolve_ready(black_box(&keys[next]))
        });
    });

    // Each miss is a tenant never seen: it is looked up and pushes out another.
    let fresh = AtomicU64::new(TENANTS);
    group.bench_function(BenchmarkId::new("miss", "resolver-at-once"), |b| {
        b.iter_batched(
            || Key::from(fresh.fetch_add(1, Ordering::Relaxed)),
            |key| resolve_now(&cache, &key),
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

/// Resolves with a future that must complete at its first poll (a hit, or a resolver that
/// answers at once).
fn resolve_now<R: ratewarden_tower::tenant::QuotaResolver>(
    cache: &CachedResolver<R>,
    key: &Key,
) -> Resolution {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(cache.resolve(key)).poll(&mut cx) {
        Poll::Ready(resolution) => resolution,
        Poll::Pending => panic!("the lookup did not complete at once"),
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
