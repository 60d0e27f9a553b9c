//! A Redis-backed API limited per tenant (the `x-tenant` header), ready for a tenant whose
//! traffic one Redis node could not carry:
//!
//! - the denied-key cache (on by default): once a tenant is over its quota, this gateway
//!   answers its requests itself until the retry time, without asking Redis;
//! - adaptive hot-key splitting: a tenant checked more than 50 times a second here is split
//!   over 8 sub-counters (each on its own cluster slot, each with 1/8 of the quota, starting
//!   with what the tenant had left), and every gateway learns of it from Redis on its next
//!   check of the tenant; it returns to one counter 10 s after it cools.
//!
//! `/debug/hot-keys` lists the tenants split now.
//!
//! ```sh
//! redis-server --port 6379 &                      # or any Redis; REDIS_URL points elsewhere
//! cargo run --example hot_keys
//! for i in $(seq 200); do curl -s -o /dev/null -H 'x-tenant: acme' http://127.0.0.1:3000/; done
//! curl http://127.0.0.1:3000/debug/hot-keys       # acme: 8 parts
//! ```

use std::num::NonZeroU32;
use std::time::Duration;

use axum::{Router, routing::get};
use ratewarden_tower::key::Header;
use ratewarden_tower::{HotKeys, Quota, RateLimitLayer, RedisConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let parts = NonZeroU32::new(8).expect("8 is not zero");
    let store = RedisConfig::new(url)
        .deny_cache(100_000)
        .hot_keys(HotKeys::adaptive(50, parts).hold(Duration::from_secs(10)))
        .connect()
        .await?;

    let split = store.clone();
    let hot_keys = get(move || async move {
        let mut body = String::new();
        for (key, parts) in split.split_keys() {
            body.push_str(&format!("{key:?}: {parts} parts\n"));
        }
        body
    });
    let per_tenant = RateLimitLayer::new(
        store,
        Quota::per_minute(100)?,
        Header::new(http::HeaderName::from_static("x-tenant")),
    )
    .name("tenant");
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }).layer(per_tenant))
        .route("/debug/hot-keys", hot_keys);

    let listener = tokio::net::TcpListener::bind(examples::addr()).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
