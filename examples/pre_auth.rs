//! Pre-auth limits: a cheap per-IP limit in front of authentication, a per-user limit behind
//! it. Every request, forged credentials included, is charged to its IP first; only a verified
//! JWT reaches a user's bucket.
//!
//! ```sh
//! cargo run --example pre_auth      # prints a valid demo token
//! curl -i -H "authorization: Bearer $TOKEN" http://127.0.0.1:3000/me
//! curl -i -H "authorization: Bearer forged" http://127.0.0.1:3000/me   # 401, charged to the IP
//! ```

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::{Router, routing::get};
use http::StatusCode;
use jsonwebtoken::{EncodingKey, Header};
use ratewarden_tower::key::{JwtClaim, PeerIp};
use ratewarden_tower::rate_limit::MissingKey;
use ratewarden_tower::{MemoryStore, Quota, RateLimitLayer};

/// The demo signing key. A real service loads its key from configuration.
const DEMO_SECRET: &[u8] = b"ratewarden-tower demo secret: not for production";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let per_ip =
        RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(60)?, PeerIp::new()).name("ip");
    let per_user = RateLimitLayer::new(
        MemoryStore::new(),
        Quota::per_minute(5)?,
        JwtClaim::hs256(DEMO_SECRET)?,
    )
    .name("user")
    .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED));

    let app = Router::new()
        .route("/me", get(|| async { "hello, verified user\n" }))
        .layer(per_user) // inner: runs after the IP limit let the request through
        .layer(per_ip); // outer: runs first, for every request

    let exp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() + 3_600;
    let claims = serde_json::json!({ "sub": "demo-user", "exp": exp });
    let token = jsonwebtoken::encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(DEMO_SECRET)?,
    )?;
    println!("token: {token}");

    let listener = tokio::net::TcpListener::bind(examples::addr()).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
