//! The quickstart with its state in Redis: every instance of the service shares one quota per
//! client IP, decided by Redis's clock.
//!
//! ```sh
//! redis-server --port 6379 &                      # or any Redis; REDIS_URL points elsewhere
//! cargo run --example redis
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! ```

use std::net::SocketAddr;

use axum::{Router, routing::get};
use ratewarden_tower::key::PeerIp;
use ratewarden_tower::{Quota, RateLimitLayer, RedisStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let store = RedisStore::connect(&url).await?;
    let quota = Quota::per_second(5)?.with_burst(10)?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::new(store, quota, PeerIp::new()));

    let listener = tokio::net::TcpListener::bind(examples::addr()).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
