//! Shared helpers for the `ratewarden` benchmarks.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, Response};
use tower::{Service, service_fn};

/// A `GET /` from one peer address, as axum's `ConnectInfo` gives it.
#[must_use]
pub fn peer_request() -> Request<Body> {
    let mut req = Request::get("/")
        .body(Body::empty())
        .expect("valid request");
    let addr: SocketAddr = "203.0.113.9:40000".parse().expect("valid address");
    req.extensions_mut().insert(ConnectInfo(addr));
    req
}

/// Drives a service whose future completes at once (every layer over a memory store, or over
/// an open breaker), without a runtime; returns whether the response was a success.
///
/// # Panics
///
/// When the service is not ready, or its future is.
pub fn call_now<S, RB>(service: &mut S) -> bool
where
    S: Service<Request<Body>, Response = Response<RB>>,
{
    let mut cx = Context::from_waker(Waker::noop());
    assert!(service.poll_ready(&mut cx).is_ready());
    let future = pin!(service.call(peer_request()));
    match future.poll(&mut cx) {
        Poll::Ready(Ok(response)) => response.status().is_success(),
        _ => panic!("the service did not answer at once"),
    }
}

/// The inner service of the layer benches: an empty 200.
pub fn handler() -> impl Service<
    Request<Body>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>>,
> + Clone {
    service_fn(|_req: Request<Body>| async { Ok(Response::new(Body::empty())) })
}

/// Runs `f(thread, i)` for `i` in `0..iters` on each of `threads` threads at once, and returns
/// the wall time: with criterion's `iter_custom`, the time per check as each thread sees it.
pub fn on_threads(threads: usize, iters: u64, f: impl Fn(usize, u64) + Sync) -> Duration {
    let barrier = std::sync::Barrier::new(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (f, barrier) = (&f, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    for i in 0..iters {
                        f(t, i);
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .max()
            .unwrap_or_default()
    })
}

/// The resident set size of this process, in bytes (Linux; 0 elsewhere).
#[must_use]
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// The `i`-th of `n` keys, visited in a scattered order (a multiplicative hash of `i`, mapped
/// to `0..n` by a multiply rather than a division, to keep the harness cheap).
#[inline]
#[must_use]
pub fn scatter(i: u64, n: u64) -> u64 {
    let mixed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((u128::from(mixed) * u128::from(n)) >> 64) as u64
}

/// The calls of scripts and functions (`FCALL`, `EVALSHA` and `EVAL`) in an
/// `INFO commandstats` reply, and the microseconds of Redis CPU they took.
#[must_use]
pub fn script_stats(info: &str) -> (u64, u64) {
    let (mut calls, mut usec) = (0, 0);
    let lines = info.lines().filter(|l| {
        ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"]
            .iter()
            .any(|stat| l.starts_with(stat))
    });
    for line in lines {
        let field = |name: &str| -> u64 {
            line.split(name)
                .nth(1)
                .and_then(|v| v.split(',').next()?.parse().ok())
                .unwrap_or(0)
        };
        calls += field("calls=");
        usec += field("usec=");
    }
    (calls, usec)
}
