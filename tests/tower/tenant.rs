//! `tenant::CachedResolver` on the real clock: single flight across threads, TTLs, bounded
//! entries and waits, and the lookup rate of 1,000 steady tenants (the 30 s TTL scaled to
//! 300 ms).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ratewarden_core::{Key, Quota};
use ratewarden_tower::tenant::{
    CachedResolver, OnFailure, Plan, QuotaResolver, Resolution, ResolveError,
};
use tokio::task::JoinSet;

/// How late a timer may fire on a loaded 2-core machine, and still pass.
const SLACK: Duration = Duration::from_millis(250);

fn plan(name: &str) -> Plan {
    Plan::new(name, [("rps", Quota::per_second(10).unwrap())]).unwrap()
}

/// Answers `plan` for tenants below `known` (integer keys), unknown for the rest, after
/// `delay`; fails instead while `failing`. Records when it looked each tenant up.
#[derive(Clone)]
struct Recording {
    plan: Plan,
    known: u64,
    delay: Duration,
    failing: bool,
    lookups: Arc<AtomicUsize>,
    times: Arc<Mutex<HashMap<Key, Vec<Instant>>>>,
}

impl Recording {
    fn new(delay: Duration) -> Self {
        Self {
            plan: plan("pro"),
            known: u64::MAX,
            delay,
            failing: false,
            lookups: Arc::default(),
            times: Arc::default(),
        }
    }

    fn lookups(&self) -> usize {
        self.lookups.load(Ordering::SeqCst)
    }
}

impl QuotaResolver for Recording {
    async fn resolve(&self, tenant: &Key) -> Result<Option<Plan>, ResolveError> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        self.times
            .lock()
            .unwrap()
            .entry(tenant.clone())
            .or_default()
            .push(Instant::now());
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if self.failing {
            return Err(ResolveError::new("plans database unreachable"));
        }
        let known = match tenant.repr() {
            ratewarden_core::KeyRepr::Int(n) => n < self.known,
            _ => true,
        };
        Ok(known.then(|| self.plan.clone()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_first_requests_make_one_lookup() {
    let resolver = Recording::new(Duration::from_millis(50));
    let cache = CachedResolver::new(resolver.clone());
    let mut calls = JoinSet::new();
    for _ in 0..100 {
        let cache = cache.clone();
        calls.spawn(async move { cache.resolve(&Key::from("acme")).await });
    }
    let answers = calls.join_all().await;
    assert_eq!(answers.len(), 100);
    assert!(answers.iter().all(|a| *a == Resolution::Plan(plan("pro"))));
    assert_eq!(resolver.lookups(), 1);
}

#[tokio::test]
async fn a_plan_expires_after_its_ttl() {
    let resolver = Recording::new(Duration::ZERO);
    let cache = CachedResolver::builder(resolver.clone())
        .ttl(Duration::from_millis(200))
        .unknown_ttl(Duration::from_millis(50))
        .build()
        .unwrap();
    let acme = Key::from("acme");
    let start = Instant::now();
    cache.resolve(&acme).await;
    while start.elapsed() < Duration::from_millis(150) {
        assert!(cache.resolve_ready(&acme).is_some());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(resolver.lookups(), 1);
    tokio::time::sleep(
        Duration::from_millis(250) - start.elapsed().min(Duration::from_millis(250)),
    )
    .await;
    assert!(cache.resolve_ready(&acme).is_none());
    cache.resolve(&acme).await;
    assert_eq!(resolver.lookups(), 2);
}

#[tokio::test]
async fn an_unknown_tenant_expires_before_a_plan() {
    let mut resolver = Recording::new(Duration::ZERO);
    resolver.known = 1; // tenant 0 has a plan, tenant 1 is unknown
    let cache = CachedResolver::builder(resolver.clone())
        .ttl(Duration::from_secs(60))
        .unknown_ttl(Duration::from_millis(100))
        .build()
        .unwrap();
    let (known, unknown) = (Key::from(0u64), Key::from(1u64));
    assert!(cache.resolve(&known).await.plan().is_some());
    assert_eq!(cache.resolve(&unknown).await, Resolution::Unknown);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(cache.resolve_ready(&known).is_some());
    assert!(cache.resolve_ready(&unknown).is_none());
    assert_eq!(cache.resolve(&unknown).await, Resolution::Unknown);
    let times = resolver.times.lock().unwrap();
    assert_eq!(times[&known].len(), 1);
    assert_eq!(times[&unknown].len(), 2);
}

#[tokio::test]
async fn entries_stay_bounded_under_many_tenants() {
    let mut resolver = Recording::new(Duration::ZERO);
    resolver.known = 1_000;
    let cache = CachedResolver::builder(resolver)
        .max_entries(500)
        .build()
        .unwrap();
    for tenant in 0..20_000u64 {
        cache.resolve(&Key::from(tenant)).await;
        assert!(cache.len() <= 500, "{} tenants held", cache.len());
    }
}

#[tokio::test]
async fn a_timeout_gets_the_configured_answer_within_the_timeout() {
    let resolver = Recording::new(Duration::from_secs(30));
    let timeout = Duration::from_millis(100);
    let cache = CachedResolver::builder(resolver.clone())
        .timeout(timeout)
        .on_failure(OnFailure::Unavailable)
        .build()
        .unwrap();
    let start = Instant::now();
    assert_eq!(
        cache.resolve(&Key::from("acme")).await,
        Resolution::Unavailable
    );
    let waited = start.elapsed();
    assert!(waited >= timeout && waited <= timeout + SLACK, "{waited:?}");
    assert_eq!(resolver.lookups(), 1);
}

#[tokio::test]
async fn a_resolver_error_gets_the_configured_answer() {
    let mut resolver = Recording::new(Duration::ZERO);
    resolver.failing = true;
    let fallback = plan("fallback");
    let cache = CachedResolver::builder(resolver)
        .on_failure(OnFailure::Plan(fallback.clone()))
        .build()
        .unwrap();
    assert_eq!(
        cache.resolve(&Key::from("acme")).await,
        Resolution::Plan(fallback)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_lookup_does_not_hang_its_waiters() {
    let resolver = Recording::new(Duration::from_millis(100));
    let cache = CachedResolver::builder(resolver.clone())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let first = {
        let cache = cache.clone();
        tokio::spawn(async move { cache.resolve(&Key::from("acme")).await })
    };
    let start = Instant::now();
    while resolver.lookups() == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "no lookup started"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut waiters = JoinSet::new();
    for _ in 0..20 {
        let cache = cache.clone();
        waiters.spawn(async move { cache.resolve(&Key::from("acme")).await });
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    first.abort();
    let aborted = Instant::now();
    let answers = tokio::time::timeout(Duration::from_secs(5), waiters.join_all())
        .await
        .expect("waiters finish");
    assert!(answers.iter().all(|a| *a == Resolution::Plan(plan("pro"))));
    assert_eq!(resolver.lookups(), 2);
    assert!(aborted.elapsed() <= Duration::from_millis(100) + SLACK);
}

/// The figure, scaled: 1,000 tenants at a steady rate (10,000 checks per TTL) with a
/// 300 ms TTL make at most 1,000 lookups per TTL, each tenant at most once per TTL.
#[tokio::test]
async fn steady_tenants_are_looked_up_once_per_ttl() {
    const TENANTS: u64 = 1_000;
    const TTL: Duration = Duration::from_millis(300);
    let resolver = Recording::new(Duration::ZERO);
    let cache = CachedResolver::builder(resolver.clone())
        .ttl(TTL)
        .unknown_ttl(TTL)
        .build()
        .unwrap();
    // 34 checks per 1 ms tick, about 10,000 per TTL, visiting the tenants in a fixed scattered
    // order (7 is prime to 1,000). A loaded machine ticks slower: fewer checks, not more.
    let start = Instant::now();
    let mut checks = 0u64;
    while start.elapsed() < 3 * TTL {
        for _ in 0..34 {
            let tenant = (checks * 7) % TENANTS;
            assert!(cache.resolve(&Key::from(tenant)).await.plan().is_some());
            checks += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(checks >= 10_000, "{checks} checks");
    let times = resolver.times.lock().unwrap();
    assert_eq!(times.len(), TENANTS as usize);
    let in_first_ttl = times
        .values()
        .flatten()
        .filter(|&&t| t < start + TTL)
        .count();
    assert!(
        in_first_ttl <= TENANTS as usize,
        "{in_first_ttl} lookups in the first TTL"
    );
    // Each tenant at most once per TTL: no window of one TTL holds more than 1,000 lookups.
    for looked_up in times.values() {
        for pair in looked_up.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(gap >= TTL, "looked up again after {gap:?}");
        }
    }
    let elapsed = start.elapsed();
    let ttls = elapsed.as_nanos().div_ceil(TTL.as_nanos()) as usize;
    assert!(resolver.lookups() <= ttls * TENANTS as usize);
}
