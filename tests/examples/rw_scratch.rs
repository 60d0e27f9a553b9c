//! Scratch (untracked, deleted after): review probes.
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use ratewarden_tower::key::{Global, PeerIp};
use ratewarden_tower::rate_limit::MissingKey;
use ratewarden_tower::{MemoryStore, Quota, RateLimitLayer};
use tower::{Layer, ServiceExt};

fn ok() -> impl tower::Service<Request<()>, Response = Response<String>, Error = Infallible, Future = impl Send> + Clone + Send + 'static {
    tower::service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(String::new())) })
}

#[derive(Clone, Debug)]
struct Marker(u32);

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // 1. MissingKey::respond: "answers with the response this function makes, as it makes it".
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let layer = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(5).unwrap(), PeerIp::new())
        .on_missing_key(MissingKey::respond(move || {
            let n = c.fetch_add(1, Ordering::SeqCst) + 1;
            let mut r = Response::new(Bytes::from(format!("call {n}")));
            *r.status_mut() = StatusCode::UNAUTHORIZED;
            r.headers_mut().insert("x-call", n.into());
            r.extensions_mut().insert(Marker(7));
            r
        }));
    let svc = layer.layer(ok());
    for i in 1..=3 {
        let r = svc.clone().oneshot(Request::new(())).await.unwrap();
        println!("[respond] request {i}: status {} x-call {:?} extension {:?}", r.status(), r.headers().get("x-call"), r.extensions().get::<Marker>());
    }
    println!("[respond] closure called {} times for 3 requests", calls.load(Ordering::SeqCst));

    // 2. The per-thread `RateLimit` header cache, keyed by the prefix's address.
    let warm = Quota::per_minute(100).unwrap();
    let other = Quota::per_minute(10).unwrap();
    let policy = move |req: &Request<()>| Some(if req.uri().path() == "/warm" { warm } else { other });
    let a = RateLimitLayer::new(MemoryStore::new(), warm, Global).name("aaaa").quota_by(policy).layer(ok());
    let b = RateLimitLayer::new(MemoryStore::new(), warm, Global).name("bbbb").quota_by(policy).layer(ok());
    for svc in [&a, &b] {
        let _ = svc.clone().oneshot(Request::get("/warm").body(()).unwrap()).await.unwrap();
    }
    for (label, svc) in [("aaaa", &a), ("bbbb", &b)] {
        let r = svc.clone().oneshot(Request::get("/x").body(()).unwrap()).await.unwrap();
        println!("[header cache] layer {label}: ratelimit={:?} policy={:?}", r.headers()["ratelimit"], r.headers()["ratelimit-policy"]);
    }
}
