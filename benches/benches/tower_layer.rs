//! Time a request spends in the rate-limit layer (memory store, per-IP key) against the bare
//! service and against `tower_governor` configured the same (same rate, burst and key, rate
//! headers on), in one run: once with a limit nothing hits, once with every request rejected.
//!
//! Then the same layer while its circuit breaker is open, for each failure mode.
//!
//! `cargo bench -p benches --bench tower_layer`

use std::time::Duration;

use benches::{call_now, handler};
use criterion::{Criterion, criterion_group, criterion_main};
use ratewarden_tower::breaker::{BreakerState, CircuitBreaker};
use ratewarden_tower::key::PeerIp;
use ratewarden_tower::rate_limit::FailureMode;
use ratewarden_tower::{MemoryStore, Quota, RateLimitLayer};
use std::num::NonZeroU32;
use std::sync::Arc;
use tests::Down;
use tower::Layer;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("layer");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));

    let mut bare = handler();
    group.bench_function("bare", |b| b.iter(|| call_now(&mut bare)));

    // (rate per second, burst): nothing is rejected / everything after the first is rejected.
    for (case, per_second, burst) in [("allowed", 1_000_000u32, 1_000_000u32), ("rejected", 1, 1)] {
        let quota = Quota::per_second(per_second)
            .and_then(|q| q.with_burst(burst))
            .expect("valid quota");
        let ours = RateLimitLayer::new(MemoryStore::new(), quota, PeerIp::new());
        let mut ours = ours.layer(handler());
        let config = GovernorConfigBuilder::default()
            .period(Duration::from_secs(1) / per_second)
            .burst_size(burst)
            .use_headers()
            .finish()
            .expect("valid governor config");
        let mut theirs = GovernorLayer::new(config).layer(handler());
        let expect_ok = case == "allowed";
        assert!(call_now(&mut ours) && call_now(&mut theirs));
        assert_eq!(call_now(&mut ours), expect_ok);
        assert_eq!(call_now(&mut theirs), expect_ok);
        group.bench_function(format!("{case}/rl"), |b| b.iter(|| call_now(&mut ours)));
        group.bench_function(format!("{case}/tower_governor"), |b| {
            b.iter(|| call_now(&mut theirs));
        });
    }
    group.finish();
}

/// A request's time in the layer while the circuit breaker is open, per failure mode (the
/// issue's target: under 50 µs at p99; `cargo run --release -p benches --bin resilience`
/// gives the percentiles).
fn breaker_open(c: &mut Criterion) {
    let mut group = c.benchmark_group("breaker-open");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    let quota = Quota::per_second(1_000_000).expect("valid quota");
    let modes = [
        ("fail-open", FailureMode::open()),
        ("fail-closed", FailureMode::closed()),
        (
            "fallback",
            FailureMode::fallback(MemoryStore::new(), NonZeroU32::new(4).expect("4")),
        ),
    ];
    for (name, mode) in modes {
        let breaker = Arc::new(
            CircuitBreaker::builder(Down)
                .backoff(Duration::from_secs(3_600), Duration::from_secs(3_600))
                .build()
                .expect("valid settings"),
        );
        let layer =
            RateLimitLayer::new(Arc::clone(&breaker), quota, PeerIp::new()).on_store_error(mode);
        let mut service = layer.layer(handler());
        for _ in 0..3 {
            call_now(&mut service);
        }
        assert_eq!(breaker.state(), BreakerState::Open);
        group.bench_function(name, |b| b.iter(|| call_now(&mut service)));
    }
    group.finish();
}

criterion_group!(benches, bench, breaker_open);
criterion_main!(benches);
