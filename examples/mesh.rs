//! One limit shared by several gateways without Redis: each decides in its own memory and
//! gossips what it counted to the others over UDP, sealed under a shared secret. Each client
//! IP may make 30 requests a minute across all of them (escrow: never more).
//!
//! ```sh
//! export MESH_SECRET='a secret the three gateways share'
//! S=127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103
//! NODE=a ADDR=127.0.0.1:3001 MESH_ADDR=127.0.0.1:7101 SEEDS=$S cargo run --example mesh &
//! NODE=b ADDR=127.0.0.1:3002 MESH_ADDR=127.0.0.1:7102 SEEDS=$S cargo run --example mesh &
//! NODE=c ADDR=127.0.0.1:3003 MESH_ADDR=127.0.0.1:7103 SEEDS=$S cargo run --example mesh &
//! curl -s http://127.0.0.1:3001/mesh   # {"node":"a","members":3,...}
//! # A fourth joins the running mesh: its address is not among the seeds.
//! NODE=d ADDR=127.0.0.1:3004 MESH_ADDR=127.0.0.1:7104 SEEDS=$S cargo run --example mesh &
//! # 60 requests spread over the four: about 30 are admitted, the rest refused.
//! for i in $(seq 60); do curl -s -o /dev/null -w '%{http_code}\n' "http://127.0.0.1:300$((i % 4 + 1))/"; done | sort | uniq -c
//! ```

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use ratewarden_tower::key::PeerIp;
use ratewarden_tower::{MeshMode, MeshStore, Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let node = std::env::var("NODE").unwrap_or_else(|_| "gateway".into());
    let mesh_addr: SocketAddr = var("MESH_ADDR")?.parse()?;
    // The founders' mesh addresses, this one's among them or not: a gateway whose address
    // is not among them joins the running mesh through them.
    let seeds = var("SEEDS")?
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse::<SocketAddr>())
        .collect::<Result<Vec<_>, _>>()?;
    let builder = MeshStore::builder(mesh_addr);
    let builder = if seeds.contains(&mesh_addr) {
        builder.peers(seeds.into_iter().filter(|&seed| seed != mesh_addr))
    } else {
        builder.join(seeds)
    };
    let store = builder
        .mode(MeshMode::Escrow)
        .secret(var("MESH_SECRET")?.as_bytes())?
        .bind()
        .await?;

    let limit = RateLimitLayer::new(store.clone(), Quota::per_minute(30)?, PeerIp::new());
    let members = {
        let (store, node) = (store.clone(), node.clone());
        move || async move {
            let live = store.live();
            let ids: Vec<String> = live.iter().map(|id| format!("\"{id:x}\"")).collect();
            // What an operator looks at first: who is heard, and what was dropped and why.
            let dropped = store.dropped();
            format!(
                "{{\"node\":\"{node}\",\"members\":{},\"ids\":[{}],\"founders_disagree\":{},\"dropped\":{{\"forged\":{},\"replayed\":{},\"stale\":{},\"strangers\":{},\"malformed\":{}}}}}\n",
                live.len(),
                ids.join(","),
                store.founders_disagree(),
                dropped.forged,
                dropped.replayed,
                dropped.stale,
                dropped.strangers,
                dropped.malformed,
            )
        }
    };
    let app = Router::new()
        .route(
            "/",
            get(move || async move { format!("hello from {node}\n") }),
        )
        .layer(limit)
        .route("/mesh", get(members));

    let listener = tokio::net::TcpListener::bind(examples::addr()).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(stopped())
    .await?;
    // Stopped for good: the members take this gateway as gone at once, and in escrow mode
    // take the shares it held, so none of the quota is left unused.
    store.leave().await;
    Ok(())
}

/// Ctrl-C, or on Unix SIGTERM (what an orchestrator sends to stop a gateway).
async fn stopped() {
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                terminate.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}
