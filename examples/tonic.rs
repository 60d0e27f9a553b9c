//! A gRPC service (the standard health service) behind the rate limit. Denials are gRPC
//! status 8, `RESOURCE_EXHAUSTED`, as gRPC clients expect.
//!
//! ```sh
//! cargo run --example tonic
//! # any gRPC client; with curl and an empty HealthCheckRequest frame:
//! printf '\0\0\0\0\0' | curl -s --http2-prior-knowledge -D - -o /dev/null \
//!   -H 'content-type: application/grpc' -H 'te: trailers' --data-binary @- \
//!   http://127.0.0.1:3000/grpc.health.v1.Health/Check
//! ```

use ratewarden_tower::key::PeerIp;
use ratewarden_tower::{MemoryStore, Quota, RateLimitLayer};
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_reporter, health) = tonic_health::server::health_reporter();
    // tonic puts the peer address in `TcpConnectInfo`, which `PeerIp` reads (feature `tonic`).
    let limit = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(5)?, PeerIp::new());

    let listener = tokio::net::TcpListener::bind(examples::addr()).await?;
    println!("listening on http://{}", listener.local_addr()?);
    Server::builder()
        .layer(limit)
        .add_service(health)
        .serve_with_incoming(TcpIncoming::from(listener))
        .await?;
    Ok(())
}
