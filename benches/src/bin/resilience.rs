//! The resilience figures of BENCHMARKS.md, on a `redis-server` this program starts on a free
//! loopback port (and kills, and restarts):
//!
//! 1. decision latency (p50 / p99 / p99.9 / max) through the layer while the circuit breaker
//!    is open, for each failure mode, against the same layer on a healthy memory store;
//! 2. the time from a Redis restart (after `kill -9`) to the first decision from Redis again;
//! 3. over-admission during a 10 s outage: 4 gateways (4 layers, one Redis) falling back to
//!    local stores at `instances = 4`, all hammering one key, against the documented bound.
//!
//! `cargo run --release -p benches --bin resilience [OUTAGE_SECS]`

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use ratewarden_core::{Decision, Key, Quota, Store, StoreError};
use ratewarden_tower::breaker::{BreakerState, CircuitBreaker};
use ratewarden_tower::key::Global;
use ratewarden_tower::rate_limit::FailureMode;
use ratewarden_tower::{MemoryStore, RateLimitLayer, RedisConfig};
use tests::Down;
use tests::redis_server::RedisServer;
use tower::{Service, ServiceBuilder, ServiceExt};

fn percentiles(name: &str, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    let at = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
    println!(
        "{name:<28} n={} p50={:>7.2?} p99={:>7.2?} p99.9={:>7.2?} max={:>8.2?}",
        samples.len(),
        at(0.50),
        at(0.99),
        at(0.999),
        samples[samples.len() - 1]
    );
}

async fn latency_while_open() {
    const N: usize = 200_000;
    let quota = Quota::per_second(1_000_000).expect("quota");
    let modes: [(&str, FailureMode); 3] = [
        ("open breaker, fail open", FailureMode::open()),
        ("open breaker, fail closed", FailureMode::closed()),
        (
            "open breaker, fallback",
            FailureMode::fallback(MemoryStore::new(), NonZeroU32::new(4).expect("4")),
        ),
    ];
    let handler = || {
        tower::service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        })
    };
    let healthy = ServiceBuilder::new()
        .layer(RateLimitLayer::new(MemoryStore::new(), quota, Global))
        .service(handler());
    percentiles("healthy memory store", measure(healthy, N).await);
    for (name, mode) in modes {
        let breaker = Arc::new(
            CircuitBreaker::builder(Down)
                .backoff(Duration::from_secs(3_600), Duration::from_secs(3_600))
                .build()
                .expect("valid settings"),
        );
        let service = ServiceBuilder::new()
            .layer(RateLimitLayer::new(Arc::clone(&breaker), quota, Global).on_store_error(mode))
            .service(handler());
        for _ in 0..3 {
            let _ = service.clone().oneshot(Request::new(())).await;
        }
        assert_eq!(breaker.state(), BreakerState::Open);
        percentiles(name, measure(service, N).await);
    }
}

async fn measure<S>(service: S, n: usize) -> Vec<Duration>
where
    S: Service<
            Request<()>,
            Response = Response<ratewarden_tower::rate_limit::ResponseBody<String>>,
        > + Clone,
    S::Error: std::fmt::Debug,
{
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let response = service
            .clone()
            .oneshot(Request::new(()))
            .await
            .expect("answered");
        samples.push(start.elapsed());
        std::hint::black_box(response.status());
    }
    samples
}

/// Counts what a store decides, so that Redis's decisions can be told from the fallback's.
#[derive(Debug)]
struct Counted<S> {
    inner: S,
    decided: AtomicU64,
}

impl<S: Store> Store for Counted<S> {
    async fn check(&self, key: &Key, quota: &Quota, cost: u32) -> Result<Decision, StoreError> {
        let result = self.inner.check(key, quota, cost).await;
        if result.is_ok() {
            self.decided.fetch_add(1, Ordering::SeqCst);
        }
        result
    }
    async fn peek(&self, key: &Key, quota: &Quota) -> Result<Decision, StoreError> {
        self.inner.peek(key, quota).await
    }
    async fn reset(&self, key: &Key, quota: &Quota) -> Result<(), StoreError> {
        self.inner.reset(key, quota).await
    }
}

async fn outage(outage: Duration) {
    const GATEWAYS: u32 = 4;
    // 100 per second, bursts of 100: the limit of the one hot key every client hits.
    let quota = Quota::per_second(100).expect("quota");
    let mut redis = RedisServer::start();
    let (backoff, max_backoff) = (Duration::from_millis(500), Duration::from_secs(5));
    let mut gateways = Vec::new();
    let mut breakers = Vec::new();
    for _ in 0..GATEWAYS {
        let store = RedisConfig::new(redis.url())
            .prefix("resilience")
            .build()
            .expect("store");
        let breaker = Arc::new(
            CircuitBreaker::builder(Counted {
                inner: store,
                decided: AtomicU64::new(0),
            })
            .backoff(backoff, max_backoff)
            .build()
            .expect("valid settings"),
        );
        let fallback =
            FailureMode::fallback(MemoryStore::new(), NonZeroU32::new(GATEWAYS).expect("4"));
        let layer =
            RateLimitLayer::new(Arc::clone(&breaker), quota, Global).on_store_error(fallback);
        gateways.push(
            ServiceBuilder::new()
                .layer(layer)
                .service_fn(|_: Request<()>| async {
                    Ok::<_, Infallible>(Response::new(String::new()))
                }),
        );
        breakers.push(breaker);
    }
    let admitted = Arc::new(AtomicU64::new(0));
    let requests = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for gateway in &gateways {
        for _ in 0..8 {
            let (gateway, admitted, requests, stop) = (
                gateway.clone(),
                Arc::clone(&admitted),
                Arc::clone(&requests),
                Arc::clone(&stop),
            );
            clients.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let response = gateway
                        .clone()
                        .oneshot(Request::new(()))
                        .await
                        .expect("answer");
                    requests.fetch_add(1, Ordering::Relaxed);
                    if response.status() == StatusCode::OK {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_micros(500)).await;
                }
            }));
        }
    }
    // Steady state on Redis: the key's burst is spent, admissions follow the rate.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = admitted.load(Ordering::SeqCst);
    redis.kill();
    let down_at = Instant::now();
    tokio::time::sleep(outage).await;
    let during = admitted.load(Ordering::SeqCst) - before;
    let down_for = down_at.elapsed();
    let decided_before: u64 = breakers
        .iter()
        .map(|b| b.get_ref().decided.load(Ordering::SeqCst))
        .sum();
    redis.restart();
    let restarted = Instant::now();
    let resumed = loop {
        let decided: u64 = breakers
            .iter()
            .map(|b| b.get_ref().decided.load(Ordering::SeqCst))
            .sum();
        if decided > decided_before {
            break restarted.elapsed();
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(30),
            "Redis never decided again"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let each_closed: Vec<Duration> = closing_times(&breakers, restarted).await;
    let all_closed = loop {
        if breakers.iter().all(|b| b.state() == BreakerState::Closed) {
            break restarted.elapsed();
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(30),
            "a breaker stayed open"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.expect("client");
    }
    redis.kill();

    let secs = down_for.as_secs_f64();
    let share = quota.share(NonZeroU32::new(GATEWAYS).expect("4"));
    let bound = f64::from(GATEWAYS)
        * (f64::from(share.burst())
            + f64::from(share.count()) * secs / quota.period().as_secs_f64());
    let exact = f64::from(quota.count()) * secs / quota.period().as_secs_f64();
    println!(
        "outage {down_for:.2?}, {GATEWAYS} gateways falling back at instances={GATEWAYS}, quota {quota}: admitted {during} \
         (the quota's own rate: {exact:.0}; documented bound n*(ceil(burst/n) + ceil(count/n)*T/period) = {bound:.0}); \
         {} requests in all",
        requests.load(Ordering::SeqCst)
    );
    println!(
        "restart after kill -9: first Redis decision {resumed:.2?} after the restart, every breaker closed after {all_closed:.2?} \
         (each: {each_closed:.2?}; backoff {backoff:?} doubling to {max_backoff:?})"
    );
    assert!(during as f64 <= bound, "over the documented bound");
}

/// When each breaker closed, measured from `since`.
async fn closing_times<S: Store>(
    breakers: &[Arc<CircuitBreaker<S>>],
    since: Instant,
) -> Vec<Duration> {
    let mut closed = vec![None; breakers.len()];
    while closed.iter().any(Option::is_none) {
        for (slot, breaker) in closed.iter_mut().zip(breakers) {
            if slot.is_none() && breaker.state() == BreakerState::Closed {
                *slot = Some(since.elapsed());
            }
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "a breaker stayed open"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    closed.into_iter().flatten().collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10);
    latency_while_open().await;
    outage(Duration::from_secs(secs)).await;
}
