//! A Redis-backed service that keeps answering when Redis dies: a circuit breaker in front of
//! the store, and a failure mode chosen per route.
//!
//! - `/` (reads) falls back to a local memory store enforcing 1/4 of the quota (this service
//!   runs as 4 instances): still limited while Redis is out, about as strictly as a fleet.
//! - `/login` fails closed: 503 with `Retry-After` while Redis is out (never a 429), except for
//!   the health checker at 127.0.0.2.
//! - `/ready` is a load balancer's readiness probe. It stays 200 while Redis is out, because
//!   every layer's failure mode still decides: answering 503 there would take every instance
//!   out of the load balancer at once, turning a degraded limiter into an outage. The
//!   breaker's state is reported in the body, for dashboards and alerts.
//!
//! The service starts with or without Redis, and uses Redis again once it answers.
//!
//! ```sh
//! redis-server --port 6379 &                      # or any Redis; REDIS_URL points elsewhere
//! cargo run --example circuit_breaker
//! curl -i http://127.0.0.1:3000/ready             # 200 {"ready":true,"rate_limit_store":"closed"}
//! redis-cli shutdown nosave                       # Redis dies
//! for i in $(seq 5); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/login; done
//! curl -i http://127.0.0.1:3000/ready             # 200 {"ready":true,"rate_limit_store":"open"}
//!                                                 # ("half-open" once a backoff has passed)
//! ```

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::{Router, routing::get, routing::post};
use ratewarden_tower::breaker::{BreakerState, CircuitBreaker};
use ratewarden_tower::key::PeerIp;
use ratewarden_tower::rate_limit::FailureMode;
use ratewarden_tower::{Key, MemoryStore, Quota, RateLimitLayer, RedisConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    // `build` does not connect: the service starts even while Redis is down.
    let redis = RedisConfig::new(url)
        .timeout(Duration::from_millis(50))
        .build()?;
    let store = CircuitBreaker::builder(redis)
        .name("redis")
        .failure_threshold(3)
        .backoff(Duration::from_millis(500), Duration::from_secs(5))
        .build()?;

    let instances = NonZeroU32::new(4).expect("4 is not zero");
    let reads = RateLimitLayer::new(
        store.clone(),
        Quota::per_second(5)?.with_burst(10)?,
        PeerIp::new(),
    )
    .name("reads")
    .on_store_error(FailureMode::fallback(MemoryStore::new(), instances));
    let health_checker = Key::from(std::net::IpAddr::from([127, 0, 0, 2]));
    let login = RateLimitLayer::new(store.clone(), Quota::per_minute(5)?, PeerIp::new())
        .name("login")
        .on_store_error(FailureMode::closed_allowing([health_checker]));

    // Ready while the failure modes decide; the breaker's state is a detail to alert on.
    let breaker = store.clone();
    let ready = get(move || async move {
        let state: BreakerState = breaker.state();
        format!(
            "{{\"ready\":true,\"rate_limit_store\":\"{}\"}}\n",
            state.as_str()
        )
    });
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }).layer(reads))
        .route(
            "/login",
            post(|| async { "welcome\n" })
                .get(|| async { "log in\n" })
                .layer(login),
        )
        .route("/ready", ready);

    let listener = tokio::net::TcpListener::bind(examples::addr()).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
