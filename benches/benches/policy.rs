//! Time a request spends in the policy layer against the one-quota rate-limit layer, on the
//! memory store and the same per-IP limit, in one run: the policy with its default only, and
//! with 20 rules the request is matched against (19 that do not match its route, then its
//! own), each once with a limit nothing hits; then a request under three limits (IP, user,
//! tenant) decided together.
//!
//! At these speeds the one-quota layer outruns its 1,000,000/s quota once the burst is spent,
//! and answers part of its requests with 429. The `-admitted` rows compare the two layers
//! with a burst that outlasts the run, so that every request is admitted; last, the store's
//! part of it: one key checked alone, and as the one limit of a `check_all`.
//!
//! `cargo bench -p benches --bench policy`

use std::time::Duration;

use axum::body::Body;
use benches::{call_now, handler};
use criterion::{Criterion, criterion_group, criterion_main};
use http::Request;
use ratewarden_core::Limit;
use ratewarden_tower::key::PeerIp;
use ratewarden_tower::policy::{NamedLimit, Policy, PolicyHandle, PolicyLayer, Rule};
use ratewarden_tower::{Key, MemoryStore, Quota, RateLimitLayer};
use tower::Layer;

/// A policy of `rules` rules for other routes, then one for every route, limiting per IP.
fn policy(rules: usize, quota: Quota) -> Policy {
    let mut policy = Policy::new();
    for i in 1..rules {
        let route = format!("/other-{i}/*");
        let limit = NamedLimit::new(&format!("route-{i}"), "ip", quota);
        policy = policy.rule(Rule::new().route(&route).limit(limit));
    }
    let per_ip = NamedLimit::new("per-ip", "ip", quota);
    if rules == 0 {
        policy.otherwise(Rule::new().limit(per_ip))
    } else {
        policy.rule(Rule::new().route("/*").limit(per_ip))
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("policy");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    let quota = Quota::per_second(1_000_000)
        .and_then(|q| q.with_burst(1_000_000))
        .expect("valid quota");

    let mut one_quota =
        RateLimitLayer::new(MemoryStore::new(), quota, PeerIp::new()).layer(handler());
    assert!(call_now(&mut one_quota));
    group.bench_function("one-quota-layer", |b| b.iter(|| call_now(&mut one_quota)));

    for rules in [0, 20] {
        let handle = PolicyHandle::new(policy(rules, quota)).expect("a valid policy");
        let layer = PolicyLayer::builder(MemoryStore::new(), handle)
            .key("ip", PeerIp::new())
            .build()
            .expect("valid keys");
        let mut service = layer.layer(handler());
        assert!(call_now(&mut service));
        group.bench_function(format!("policy-{rules}-rules"), |b| {
            b.iter(|| call_now(&mut service));
        });
    }

    // Three limits on three keys, decided together.
    let three = Policy::new().otherwise(
        Rule::new()
            .limit(NamedLimit::new("per-ip", "ip", quota))
            .limit(NamedLimit::new("per-user", "user", quota))
            .limit(NamedLimit::new("per-tenant", "tenant", quota)),
    );
    let layer = PolicyLayer::builder(MemoryStore::new(), PolicyHandle::new(three).expect("valid"))
        .key("ip", PeerIp::new())
        .key("user", |_: &Request<Body>| Some(Key::from("user-7")))
        .key("tenant", |_: &Request<Body>| Some(Key::from("tenant-acme")))
        .build()
        .expect("valid keys");
    let mut service = layer.layer(handler());
    assert!(call_now(&mut service));
    group.bench_function("policy-three-limits", |b| b.iter(|| call_now(&mut service)));

    // Every request admitted: a burst that outlasts the run.
    let quota = quota.with_burst(u32::MAX).expect("valid quota");
    let mut one_quota =
        RateLimitLayer::new(MemoryStore::new(), quota, PeerIp::new()).layer(handler());
    assert!(call_now(&mut one_quota));
    group.bench_function("one-quota-layer-admitted", |b| {
        b.iter(|| assert!(call_now(&mut one_quota)));
    });
    let handle = PolicyHandle::new(policy(20, quota)).expect("a valid policy");
    let layer = PolicyLayer::builder(MemoryStore::new(), handle)
        .key("ip", PeerIp::new())
        .build()
        .expect("valid keys");
    let mut service = layer.layer(handler());
    group.bench_function("policy-20-rules-admitted", |b| {
        b.iter(|| assert!(call_now(&mut service)));
    });

    // The store's part: what the rate-limit layer asks of it, and what the policy layer does.
    let store = MemoryStore::new();
    let key = Key::from("203.0.113.9").scoped(Key::scope_of("per-ip"));
    group.bench_function("store-check-one", |b| {
        b.iter(|| store.check_sync(&key, &quota, 1));
    });
    let store = MemoryStore::new();
    let limits = [Limit::new(key, quota, 1)];
    group.bench_function("store-check-all-one", |b| {
        b.iter(|| store.check_all_sync(&limits));
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
