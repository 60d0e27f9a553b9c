//! The quickstart on a Redis Cluster: each client IP's state lives on the node owning its hash
//! slot.
//!
//! ```sh
//! REDIS_CLUSTER_URLS=redis://127.0.0.1:7000,redis://127.0.0.1:7001 cargo run --example redis_cluster
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! ```

use std::net::SocketAddr;

use axum::{Router, routing::get};
use ratewarden_tower::key::PeerIp;
use ratewarden_tower::{Quota, RateLimitLayer, RedisConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let urls =
        std::env::var("REDIS_CLUSTER_URLS").unwrap_or_else(|_| "redis://127.0.0.1:7000".to_owned());
    let store = RedisConfig::cluster(urls.split(',').map(str::trim))
        .connect()
        .await?;
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
