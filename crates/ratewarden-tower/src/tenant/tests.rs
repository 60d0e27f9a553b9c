//! The cache on tokio's paused clock: TTLs, timeouts and single flight to the millisecond.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratewarden_core::{Key, Quota};
use tokio::task::JoinSet;
use tokio::time::{Instant, advance, sleep};

use super::*;

/// What the fake resolver answers.
#[derive(Clone)]
enum Reply {
    Plan(Plan),
    Unknown,
    Fail,
    /// Never answers.
    Hang,
}

/// A resolver that counts its lookups, takes `delay` to answer, and answers `reply`.
#[derive(Clone)]
struct Fake {
    lookups: Arc<AtomicUsize>,
    delay: Duration,
    reply: Arc<Mutex<Reply>>,
}

impl Fake {
    fn new(reply: Reply, delay: Duration) -> Self {
        Self {
            lookups: Arc::default(),
            delay,
            reply: Arc::new(Mutex::new(reply)),
        }
    }

    fn lookups(&self) -> usize {
        self.lookups.load(Ordering::SeqCst)
    }

    fn set(&self, reply: Reply) {
        *self.reply.lock().unwrap() = reply;
    }
}

impl QuotaResolver for Fake {
    async fn resolve(&self, _tenant: &Key) -> Result<Option<Plan>, ResolveError> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        if !self.delay.is_zero() {
            sleep(self.delay).await;
        }
        let reply = self.reply.lock().unwrap().clone();
        match reply {
            Reply::Plan(plan) => Ok(Some(plan)),
            Reply::Unknown => Ok(None),
            Reply::Fail => Err(ResolveError::new("resolver down")),
            Reply::Hang => std::future::pending().await,
        }
    }
}

fn plan(name: &str) -> Plan {
    Plan::new(name, [("rps", Quota::per_second(10).unwrap())]).unwrap()
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test(start_paused = true)]
async fn a_plan_is_looked_up_again_only_after_its_ttl() {
    let fake = Fake::new(Reply::Plan(plan("pro")), Duration::ZERO);
    let cache = CachedResolver::builder(fake.clone())
        .ttl(secs(30))
        .build()
        .unwrap();
    let acme = Key::from("acme");
    assert_eq!(cache.resolve(&acme).await, Resolution::Plan(plan("pro")));
    advance(secs(30) - ms(1)).await;
    assert_eq!(
        cache.resolve_ready(&acme),
        Some(Resolution::Plan(plan("pro")))
    );
    assert_eq!(fake.lookups(), 1);
    advance(ms(1)).await;
    assert_eq!(cache.resolve_ready(&acme), None);
    fake.set(Reply::Plan(plan("enterprise")));
    assert_eq!(
        cache.resolve(&acme).await,
        Resolution::Plan(plan("enterprise"))
    );
    assert_eq!(fake.lookups(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_tenant_is_forgotten_after_the_shorter_unknown_ttl() {
    let fake = Fake::new(Reply::Unknown, Duration::ZERO);
    let cache = CachedResolver::builder(fake.clone())
        .ttl(secs(30))
        .unknown_ttl(secs(5))
        .build()
        .unwrap();
    let nobody = Key::from("nobody");
    assert_eq!(cache.resolve(&nobody).await, Resolution::Unknown);
    advance(secs(5) - ms(1)).await;
    assert_eq!(cache.resolve(&nobody).await, Resolution::Unknown);
    assert_eq!(fake.lookups(), 1);
    advance(ms(1)).await;
    // Signed up meanwhile: found 5 s after the first miss, not 30 s.
    fake.set(Reply::Plan(plan("free")));
    assert_eq!(cache.resolve(&nobody).await, Resolution::Plan(plan("free")));
    assert_eq!(fake.lookups(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_hundred_concurrent_first_calls_make_one_lookup() {
    let fake = Fake::new(Reply::Plan(plan("pro")), ms(20));
    let cache = CachedResolver::new(fake.clone());
    let mut calls = JoinSet::new();
    for _ in 0..100 {
        let cache = cache.clone();
        calls.spawn(async move { cache.resolve(&Key::from("acme")).await });
    }
    let answers = calls.join_all().await;
    assert_eq!(answers.len(), 100);
    assert!(answers.iter().all(|a| *a == Resolution::Plan(plan("pro"))));
    assert_eq!(fake.lookups(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_slow_resolver_gets_the_configured_answer_at_the_timeout() {
    let fake = Fake::new(Reply::Plan(plan("pro")), secs(10));
    let cache = CachedResolver::builder(fake.clone())
        .timeout(ms(100))
        .failure_ttl(secs(1))
        .on_failure(OnFailure::Unavailable)
        .build()
        .unwrap();
    let acme = Key::from("acme");
    let start = Instant::now();
    assert_eq!(cache.resolve(&acme).await, Resolution::Unavailable);
    assert_eq!(start.elapsed(), ms(100));
    // Kept for `failure_ttl`: answered at once, the resolver not asked.
    assert_eq!(cache.resolve_ready(&acme), Some(Resolution::Unavailable));
    advance(secs(1)).await;
    assert_eq!(cache.resolve_ready(&acme), None);
    assert_eq!(fake.lookups(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_lookup_gets_the_configured_answer() {
    let fallback = plan("fallback");
    for (on_failure, expected) in [
        (OnFailure::FailureMode, Resolution::FailureMode),
        (OnFailure::Unavailable, Resolution::Unavailable),
        (
            OnFailure::Plan(fallback.clone()),
            Resolution::Plan(fallback),
        ),
    ] {
        let fake = Fake::new(Reply::Fail, Duration::ZERO);
        let cache = CachedResolver::builder(fake)
            .on_failure(on_failure)
            .build()
            .unwrap();
        assert_eq!(cache.resolve(&Key::from("acme")).await, expected);
    }
}

#[tokio::test(start_paused = true)]
async fn an_expired_plan_is_kept_while_lookups_fail() {
    let fake = Fake::new(Reply::Plan(plan("pro")), Duration::ZERO);
    let cache = CachedResolver::builder(fake.clone())
        .ttl(secs(30))
        .failure_ttl(secs(1))
        .on_failure(OnFailure::Unavailable)
        .build()
        .unwrap();
    let acme = Key::from("acme");
    cache.resolve(&acme).await;
    fake.set(Reply::Fail);
    advance(secs(30)).await;
    assert_eq!(cache.resolve(&acme).await, Resolution::Plan(plan("pro")));
    assert_eq!(fake.lookups(), 2);
    // Retried once per `failure_ttl`, and still the last plan.
    advance(ms(999)).await;
    assert_eq!(cache.resolve(&acme).await, Resolution::Plan(plan("pro")));
    assert_eq!(fake.lookups(), 2);
    advance(ms(1)).await;
    assert_eq!(cache.resolve(&acme).await, Resolution::Plan(plan("pro")));
    assert_eq!(fake.lookups(), 3);
    fake.set(Reply::Plan(plan("free")));
    advance(secs(1)).await;
    assert_eq!(cache.resolve(&acme).await, Resolution::Plan(plan("free")));
}

#[tokio::test(start_paused = true)]
async fn waiters_take_over_the_lookup_of_a_dropped_caller() {
    let fake = Fake::new(Reply::Plan(plan("pro")), ms(50));
    let cache = CachedResolver::builder(fake.clone())
        .timeout(secs(1))
        .build()
        .unwrap();
    let leader = {
        let cache = cache.clone();
        tokio::spawn(async move { cache.resolve(&Key::from("acme")).await })
    };
    while fake.lookups() == 0 {
        tokio::task::yield_now().await;
    }
    let mut waiters = JoinSet::new();
    for _ in 0..10 {
        let cache = cache.clone();
        waiters.spawn(async move { cache.resolve(&Key::from("acme")).await });
    }
    sleep(ms(10)).await;
    leader.abort();
    let start = Instant::now();
    let answers = waiters.join_all().await;
    assert!(answers.iter().all(|a| *a == Resolution::Plan(plan("pro"))));
    // One waiter looked up again, once; the others waited for it.
    assert_eq!(fake.lookups(), 2);
    assert_eq!(start.elapsed(), ms(50));
}

#[tokio::test(start_paused = true)]
async fn no_call_waits_past_the_timeout_for_a_hung_lookup() {
    let fake = Fake::new(Reply::Hang, Duration::ZERO);
    let cache = CachedResolver::builder(fake.clone())
        .timeout(ms(200))
        .build()
        .unwrap();
    let start = Instant::now();
    let mut calls = JoinSet::new();
    for i in 0..20 {
        let cache = cache.clone();
        calls.spawn(async move {
            // Arrivals spread over the first 100 ms.
            sleep(ms(i * 5)).await;
            let arrived = Instant::now();
            let answer = cache.resolve(&Key::from("acme")).await;
            (answer, arrived.elapsed())
        });
    }
    for (answer, waited) in calls.join_all().await {
        assert_eq!(answer, Resolution::FailureMode);
        assert!(waited <= ms(200), "waited {waited:?}");
    }
    assert_eq!(fake.lookups(), 1);
    assert_eq!(start.elapsed(), ms(200));
}

#[tokio::test(start_paused = true)]
async fn never_holds_more_than_max_entries() {
    for max in [1, 31, 32, 33, 100, 1_000, 4_097] {
        let fake = Fake::new(Reply::Unknown, Duration::ZERO);
        let cache = CachedResolver::builder(fake)
            .max_entries(max)
            .build()
            .unwrap();
        for i in 0..3 * max as u64 {
            cache.resolve(&Key::from(i)).await;
            assert!(cache.len() <= max, "{} > {max}", cache.len());
        }
        assert!(cache.len() + 64 >= max, "{} of {max}", cache.len());
    }
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_made_up_tenants_does_not_push_out_one_in_use() {
    let real = Key::from("acme");
    let real_lookups = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&real_lookups);
    let pro = plan("pro");
    let resolver = move |tenant: &Key| {
        let found = (tenant == &Key::from("acme")).then(|| {
            counter.fetch_add(1, Ordering::SeqCst);
            pro.clone()
        });
        async move { Ok::<_, ResolveError>(found) }
    };
    let cache = CachedResolver::builder(resolver)
        .max_entries(1_000)
        .build()
        .unwrap();
    for i in 0..100_000u64 {
        cache.resolve(&Key::from(i)).await;
        if i % 10 == 0 {
            assert!(cache.resolve(&real).await.plan().is_some());
        }
    }
    assert_eq!(real_lookups.load(Ordering::SeqCst), 1);
    assert!(cache.len() <= 1_000);
}

#[tokio::test(start_paused = true)]
async fn invalidate_makes_the_next_call_look_up() {
    let fake = Fake::new(Reply::Plan(plan("free")), Duration::ZERO);
    let cache = CachedResolver::new(fake.clone());
    let acme = Key::from("acme");
    cache.resolve(&acme).await;
    fake.set(Reply::Plan(plan("pro")));
    cache.invalidate(&acme);
    assert_eq!(cache.resolve(&acme).await, Resolution::Plan(plan("pro")));
    assert_eq!(fake.lookups(), 2);
}

#[test]
fn the_builder_refuses_settings_that_cannot_work() {
    let fake = Fake::new(Reply::Unknown, Duration::ZERO);
    type Step = fn(CachedResolverBuilder<Fake>) -> CachedResolverBuilder<Fake>;
    let build = |f: Step| f(CachedResolver::builder(fake.clone())).build().map(drop);
    assert_eq!(
        build(|b| b.max_entries(0)),
        Err(CacheConfigError::Zero {
            setting: "max_entries"
        })
    );
    for (setting, f) in [
        ("ttl", (|b| b.ttl(Duration::ZERO)) as Step),
        ("unknown_ttl", |b| b.unknown_ttl(Duration::ZERO)),
        ("failure_ttl", |b| b.failure_ttl(Duration::ZERO)),
        ("timeout", |b| b.timeout(Duration::ZERO)),
    ] {
        assert_eq!(build(f), Err(CacheConfigError::Zero { setting }));
    }
    assert_eq!(
        build(|b| b.ttl(secs(10)).unknown_ttl(secs(11))),
        Err(CacheConfigError::UnknownTtlOverTtl {
            unknown_ttl: secs(11),
            ttl: secs(10)
        })
    );
    assert!(build(|b| b.ttl(Duration::MAX).unknown_ttl(Duration::MAX)).is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_ttl_past_the_clock_never_expires() {
    let fake = Fake::new(Reply::Plan(plan("pro")), Duration::ZERO);
    let cache = CachedResolver::builder(fake.clone())
        .ttl(Duration::MAX)
        .build()
        .unwrap();
    let acme = Key::from("acme");
    cache.resolve(&acme).await;
    advance(secs(86_400 * 365)).await;
    assert!(cache.resolve_ready(&acme).is_some());
    assert_eq!(fake.lookups(), 1);
}

#[test]
fn resolve_is_send() {
    fn is_send<T: Send>(_: &T) {}
    let cache = CachedResolver::new(Fake::new(Reply::Unknown, Duration::ZERO));
    let key = Key::from("acme");
    is_send(&cache.resolve(&key));
}

/// A resolver that panics: once as it is called, once inside its future.
#[derive(Clone, Default)]
struct Panicking {
    lookups: Arc<AtomicUsize>,
}

impl QuotaResolver for Panicking {
    fn resolve(
        &self,
        _tenant: &Key,
    ) -> impl Future<Output = Result<Option<Plan>, ResolveError>> + Send {
        let n = self.lookups.fetch_add(1, Ordering::SeqCst);
        assert!(n % 2 == 1, "resolver bug before the future");
        async {
            sleep(ms(20)).await;
            panic!("resolver bug in the future");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_resolver_is_a_failed_lookup() {
    let resolver = Panicking::default();
    let cache = CachedResolver::builder(resolver.clone())
        .failure_ttl(secs(10))
        .on_failure(OnFailure::Unavailable)
        .build()
        .unwrap();
    let acme = Key::from("acme");
    // Panics as it is called.
    assert_eq!(cache.resolve(&acme).await, Resolution::Unavailable);
    assert_eq!(cache.resolve_ready(&acme), Some(Resolution::Unavailable));
    advance(secs(10)).await;
    // Panics inside its future, with concurrent calls waiting for it.
    let mut calls = JoinSet::new();
    for _ in 0..5 {
        let cache = cache.clone();
        calls.spawn(async move { cache.resolve(&Key::from("acme")).await });
    }
    let answers = calls.join_all().await;
    assert!(answers.iter().all(|a| *a == Resolution::Unavailable));
    assert_eq!(resolver.lookups.load(Ordering::SeqCst), 2);
    // Remembered for `failure_ttl`.
    advance(ms(9_999)).await;
    assert_eq!(cache.resolve(&acme).await, Resolution::Unavailable);
    assert_eq!(resolver.lookups.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn an_expired_plan_outlives_a_dropped_lookup() {
    let fake = Fake::new(Reply::Plan(plan("pro")), ms(100));
    let cache = CachedResolver::builder(fake.clone())
        .ttl(secs(30))
        .on_failure(OnFailure::Unavailable)
        .build()
        .unwrap();
    let acme = Key::from("acme");
    cache.resolve(&acme).await;
    fake.set(Reply::Fail);
    advance(secs(30)).await;
    let dropped = {
        let cache = cache.clone();
        tokio::spawn(async move { cache.resolve(&Key::from("acme")).await })
    };
    while fake.lookups() == 1 {
        tokio::task::yield_now().await;
    }
    // A call waiting for the lookup that is dropped, and one arriving after it.
    let waiter = {
        let cache = cache.clone();
        tokio::spawn(async move { cache.resolve(&Key::from("acme")).await })
    };
    sleep(ms(10)).await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    assert_eq!(waiter.await.unwrap(), Resolution::Plan(plan("pro")));
    assert_eq!(fake.lookups(), 3);
    // The failed lookup's answer expires, and the next lookup is dropped with no call waiting.
    advance(secs(1)).await;
    let later = {
        let cache = cache.clone();
        tokio::spawn(async move { cache.resolve(&Key::from("acme")).await })
    };
    while fake.lookups() == 3 {
        tokio::task::yield_now().await;
    }
    later.abort();
    let _ = later.await;
    assert_eq!(cache.resolve(&acme).await, Resolution::Plan(plan("pro")));
}
