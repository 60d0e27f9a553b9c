//! Instructions per admitted request through the layer, counted by callgrind (one case per
//! process: `CASE=rl|tower_governor|bare N=100000`): the allowed path of `benches/benches/tower_layer.rs`
//! without the machine's noise.
//!
//! `benches/scripts/layer_instructions.sh` (needs valgrind)

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, Response};
use ratewarden_tower::key::PeerIp;
use ratewarden_tower::{MemoryStore, Quota, RateLimitLayer};
use tower::{Layer, Service, service_fn};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

fn request() -> Request<Body> {
    let mut req = Request::get("/")
        .body(Body::empty())
        .expect("valid request");
    let addr: SocketAddr = "203.0.113.9:40000".parse().expect("valid address");
    req.extensions_mut().insert(ConnectInfo(addr));
    req
}

fn call_now<S, RB>(service: &mut S)
where
    S: Service<Request<Body>, Response = Response<RB>>,
{
    let mut cx = Context::from_waker(Waker::noop());
    assert!(service.poll_ready(&mut cx).is_ready());
    let future = pin!(service.call(request()));
    match future.poll(&mut cx) {
        Poll::Ready(Ok(response)) => assert!(response.status().is_success()),
        _ => panic!("the service did not answer at once"),
    }
}

fn main() {
    let case = std::env::var("CASE").unwrap_or_default();
    let n: u64 = std::env::var("N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let handler = || {
        service_fn(|_req: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Body::empty()))
        })
    };
    let quota = Quota::per_second(1_000_000)
        .and_then(|q| q.with_burst(1_000_000))
        .expect("quota");
    let mut ours = RateLimitLayer::new(MemoryStore::new(), quota, PeerIp::new()).layer(handler());
    let config = GovernorConfigBuilder::default()
        .period(Duration::from_micros(1))
        .burst_size(1_000_000)
        .use_headers()
        .finish()
        .expect("valid governor config");
    let mut theirs = GovernorLayer::new(config).layer(handler());
    let mut bare = handler();
    for _ in 0..3 {
        call_now(&mut ours);
        call_now(&mut theirs);
        call_now(&mut bare);
    }
    for _ in 0..n {
        match case.as_str() {
            "rl" => call_now(&mut ours),
            "tower_governor" => call_now(&mut theirs),
            "bare" => call_now(&mut bare),
            _ => {}
        }
    }
}
