//! A per-IP rate limit on an axum app, counted in process.
//!
//! ```sh
//! cargo run --example quickstart
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! ```
//!
//! The first 10 requests pass (the burst), then 429s until the quota refills (5 per second).

use std::net::SocketAddr;

use axum::{Router, routing::get};
use ratewarden_tower::{Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let quota = Quota::per_second(5)?.with_burst(10)?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::per_ip(quota));

    let listener = tokio::net::TcpListener::bind(examples::addr()).await?;
    println!("listening on http://{}", listener.local_addr()?);
    // The connect info makes the peer address (the key) available to the layer.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
