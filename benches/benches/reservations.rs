//! Reservations on the memory store: a reserve and its settle against a plain check (same
//! quota, same keys), and a request through an in-flight limit against the bare service and
//! the rate-limit layer, in one run.
//!
//! `cargo bench -p benches --bench reservations`

use std::time::Duration;

use benches::{call_now, handler, scatter};
use criterion::{Criterion, criterion_group, criterion_main};
use ratewarden_core::{Key, Limit, Quota};
use ratewarden_memory::MemoryStore;
use ratewarden_tower::RateLimitLayer;
use ratewarden_tower::key::PeerIp;
use tower::Layer;

const KEYS: u64 = 10_000;

fn store(c: &mut Criterion) {
    // A quota no run can spend: every call admits.
    let quota = Quota::per_second(1_000_000)
        .and_then(|q| q.with_burst(1_000_000))
        .expect("valid quota");
    let mut group = c.benchmark_group("reservation");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    let store = MemoryStore::new();
    let hold = Duration::from_secs(60);
    for i in 0..KEYS {
        store.check_sync(&Key::from(i), &quota, 1);
        let r = store.reserve_sync(&[Limit::new(Key::from(i), quota, 1)], hold);
        store.settle_sync(r.expect("reserved"), 1);
    }
    let mut i = 0;
    group.bench_function("check", |b| {
        b.iter(|| {
            i += 1;
            let key = Key::from(scatter(i, KEYS));
            assert!(store.check_sync(&key, &quota, 1).is_allowed());
        });
    });
    group.bench_function("reserve+settle", |b| {
        b.iter(|| {
            i += 1;
            let limit = Limit::new(Key::from(scatter(i, KEYS)), quota, 2);
            let reservation = store.reserve_sync(&[limit], hold).expect("reserved");
            assert!(reservation.is_allowed());
            store.settle_sync(reservation, 1);
        });
    });
    group.finish();
}

fn in_flight(c: &mut Criterion) {
    let mut group = c.benchmark_group("in_flight");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    let mut bare = handler();
    group.bench_function("bare", |b| b.iter(|| call_now(&mut bare)));
    let quota = Quota::per_second(1_000_000)
        .and_then(|q| q.with_burst(1_000_000))
        .expect("valid quota");
    let mut rate = RateLimitLayer::new(MemoryStore::new(), quota, PeerIp::new()).layer(handler());
    group.bench_function("rate_limit", |b| b.iter(|| call_now(&mut rate)));
    let places = RateLimitLayer::in_flight(MemoryStore::new(), 4, PeerIp::new()).expect("valid");
    let mut places = places.layer(handler());
    assert!(call_now(&mut places) && call_now(&mut places));
    group.bench_function("in_flight", |b| b.iter(|| assert!(call_now(&mut places))));
    group.finish();
}

criterion_group!(benches, store, in_flight);
criterion_main!(benches);
