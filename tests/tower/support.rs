use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::{Request, Response};
use http_body_util::BodyExt;
use ratewarden_core::{ManualClock, Timestamp};
use ratewarden_memory::MemoryStore;
use tower::ServiceExt;

/// A memory store on a manual clock that starts at a whole second (2023-11-14T22:13:20Z).
pub(crate) fn manual_store() -> (MemoryStore<ManualClock>, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_micros(1_700_000_000_000_000));
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    (store, clock)
}

/// An app with one route, `/`, answering "ok".
pub(crate) fn app() -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/search", get(|| async { "results" }))
}

/// A GET of `uri` from `peer` (as axum's `ConnectInfo`), with extra headers.
pub(crate) fn get_from(peer: &str, uri: &str, headers: &[(&str, &[u8])]) -> Request<Body> {
    let mut builder = Request::get(uri);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let mut req = builder.body(Body::empty()).unwrap();
    let addr: SocketAddr = peer.parse().unwrap();
    req.extensions_mut().insert(ConnectInfo(addr));
    req
}

/// Sends `req` through `app` and returns the response with its body read.
pub(crate) async fn send(app: &Router, req: Request<Body>) -> (Response<()>, bytes::Bytes) {
    let response = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (Response::from_parts(parts, ()), bytes)
}

/// A header's value as text ("" when absent).
pub(crate) fn header<'a>(response: &'a Response<()>, name: &str) -> &'a str {
    response
        .headers()
        .get(name)
        .map_or("", |v| v.to_str().unwrap())
}

/// A directory of its own under the system's temp dir, removed when dropped.
pub(crate) struct TempDir(pub(crate) std::path::PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ratewarden-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A policy file whose default limits every client IP at `quota`.
pub(crate) fn policy_file(quota: &str) -> String {
    format!("[default]\nlimits = [{{ name = \"per-ip\", key = \"ip\", quota = \"{quota}\" }}]\n")
}
