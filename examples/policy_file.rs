//! Limits from a policy file that reloads on change: per route, per plan, an IP + user pair
//! on one route, and an allow list (see `examples/policy.toml`).
//!
//! ```sh
//! POLICY=examples/policy.toml cargo run --example policy_file
//! for i in $(seq 6); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! # edit "5/min" in the file: the next requests are decided by the new quota
//! curl -H 'x-user: ann' -H 'x-plan: gold' http://127.0.0.1:3000/api/items
//! curl http://127.0.0.1:3000/debug/policy
//! ```
//!
//! A quota raised by a reload does not hand out a fresh quota: for the old quota's period
//! (a minute here) requests are checked against it too.

use std::net::SocketAddr;

use axum::{Router, routing::get};
use ratewarden_tower::MemoryStore;
use ratewarden_tower::key::{Header, PeerIp};
use ratewarden_tower::policy::{PolicyHandle, PolicyLayer, load_file, watch};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::var("POLICY").unwrap_or_else(|_| "examples/policy.toml".to_owned());
    let handle = PolicyHandle::new(load_file(&path)?)?;
    let layer = PolicyLayer::builder(MemoryStore::new(), handle.clone())
        .key("ip", PeerIp::new())
        .key("user", Header::new(http::HeaderName::from_static("x-user")))
        .build()?;
    // Reloads the file whenever it changes, until dropped.
    let _watching = watch(&path, handle.clone())?;

    let status = handle.clone();
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .route("/api/items", get(|| async { "[]\n" }))
        .layer(layer)
        // Outside the limits: how many reloads were taken and refused.
        .route(
            "/debug/policy",
            get(move || {
                let reloads = status.reloads();
                let body = serde_json::json!({
                    "version": status.version(),
                    "reloads_ok": reloads.ok(),
                    "reloads_error": reloads.error(),
                });
                async move { format!("{body}\n") }
            }),
        );

    let listener = tokio::net::TcpListener::bind(examples::addr()).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
