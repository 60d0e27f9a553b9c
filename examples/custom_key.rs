//! A closure key (the `x-api-key` header, hashed) and per-route quotas.
//!
//! ```sh
//! cargo run --example custom_key
//! curl -i -H 'x-api-key: demo' http://127.0.0.1:3000/search   # 2 per second
//! curl -i -H 'x-api-key: demo' http://127.0.0.1:3000/items    # 20 per second
//! curl -i http://127.0.0.1:3000/items                         # 401: no key
//! ```

use axum::body::Body;
use axum::{Router, routing::get};
use http::{Request, StatusCode};
use ratewarden_tower::rate_limit::MissingKey;
use ratewarden_tower::{Key, MemoryStore, Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The API key is a credential: only its digest is ever stored. The route group is part
    // of the key, so that /search and the other routes count apart (a store keeps one state
    // per key and algorithm).
    let api_key = |req: &Request<Body>| {
        let value = req.headers().get("x-api-key")?;
        let group: &[u8] = if req.uri().path() == "/search" {
            b"search:"
        } else {
            b"default:"
        };
        (!value.is_empty()).then(|| Key::hashed([group, value.as_bytes()].concat()))
    };
    let search = Quota::per_second(2)?;
    let default = Quota::per_second(20)?;
    let per_route = move |req: &Request<Body>| match req.uri().path() {
        "/health" => None, // never limited
        "/search" => Some(search),
        _ => Some(default),
    };
    let layer = RateLimitLayer::new(MemoryStore::new(), default, api_key)
        .quota_by(per_route)
        .name("api-key")
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED));

    let app = Router::new()
        .route("/search", get(|| async { "results\n" }))
        .route("/items", get(|| async { "items\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .layer(layer);

    let listener = tokio::net::TcpListener::bind(examples::addr()).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
