//! `.wait(max_delay)`: requests slightly over their rate wait for their turn, at the quota's
//! pace; beyond what may wait they are refused at once; a waiter dropped gives its units back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use ratewarden_core::Quota;
use ratewarden_memory::MemoryStore;
use ratewarden_tower::RateLimitLayer;
use ratewarden_tower::key::Global;
use tokio::time::Instant;
use tower::ServiceExt;

use crate::support::send;

/// An app whose handler records when each request reached it.
fn app(quota: Quota, wait: Duration, reached: &Arc<Mutex<Vec<Instant>>>) -> Router {
    let reached = Arc::clone(reached);
    Router::new()
        .route(
            "/",
            get(move || {
                let reached = Arc::clone(&reached);
                async move {
                    reached.lock().unwrap().push(Instant::now());
                    "ok"
                }
            }),
        )
        .layer(RateLimitLayer::new(MemoryStore::new(), quota, Global).wait(wait))
}

fn request() -> Request<Body> {
    Request::get("/").body(Body::empty()).unwrap()
}

#[tokio::test]
async fn waiting_requests_go_on_at_the_quotas_pace_and_within_their_wait() {
    // 20/s (one per 50 ms), burst 2, a wait of 500 ms: 10 may wait.
    for text in ["20/s burst 2", "20/s burst 2 token-bucket"] {
        go_on_at_the_pace(text.parse().unwrap()).await;
    }
}

async fn go_on_at_the_pace(quota: Quota) {
    let reached = Arc::new(Mutex::new(Vec::new()));
    let app = app(quota, Duration::from_millis(500), &reached);
    let start = Instant::now();
    let tasks: Vec<_> = (0..40)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let (response, _) = send(&app, request()).await;
                (response, Instant::now())
            })
        })
        .collect();
    let (mut admitted, mut refused) = (0, 0);
    for task in tasks {
        let (response, done) = task.await.unwrap();
        match response.status() {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                refused += 1;
                assert!(done - start < Duration::from_millis(100), "refused at once");
                assert!(response.headers().contains_key("retry-after"));
            }
            other => panic!("{other}"),
        }
    }
    assert_eq!(
        (admitted, refused),
        (12, 28),
        "the burst and the 10 that may wait"
    );
    let mut reached = reached.lock().unwrap().clone();
    reached.sort();
    // The pace: never more than burst + t / 50 ms requests in any interval t.
    for (i, a) in reached.iter().enumerate() {
        for (j, b) in reached.iter().enumerate().skip(i) {
            let t = (*b - *a).as_micros() as u64;
            assert!(
                (j - i + 1) as u64 <= 2 + t / 50_000,
                "{} requests in {t} µs",
                j - i + 1
            );
        }
    }
    // Every wait within the 500 ms asked for, and 5 ms of timers.
    let longest = reached.iter().map(|r| *r - start).max().unwrap();
    assert!(longest <= Duration::from_millis(505), "waited {longest:?}");
    assert!(
        longest >= Duration::from_millis(450),
        "the last waited its turn: {longest:?}"
    );
}

#[tokio::test]
async fn a_waiter_dropped_before_its_turn_gives_its_units_back() {
    // One a second, burst 1, a wait of 5 s.
    let quota = Quota::per_second(1).unwrap();
    let reached = Arc::new(Mutex::new(Vec::new()));
    let app = app(quota, Duration::from_secs(5), &reached);
    assert_eq!(send(&app, request()).await.0.status(), StatusCode::OK); // at once
    let dropped = tokio::spawn(app.clone().oneshot(request())); // waits a second
    tokio::time::sleep(Duration::from_millis(100)).await;
    dropped.abort();
    let _ = dropped.await;
    tokio::time::sleep(Duration::from_millis(20)).await; // the give-back's task
    let start = Instant::now();
    assert_eq!(send(&app, request()).await.0.status(), StatusCode::OK);
    let waited = start.elapsed();
    // Its turn is the dropped one's (about 0.9 s from now), not the one after (1.9 s).
    assert!(waited < Duration::from_millis(1_300), "waited {waited:?}");
    assert!(waited > Duration::from_millis(600), "waited {waited:?}");
}

#[tokio::test]
async fn a_hundred_thousand_attempts_beyond_what_may_wait_are_refused_at_once() {
    // One a second, burst 1, a wait of 3 s: 3 may wait; the rest hold nothing.
    let quota = Quota::per_second(1).unwrap();
    let reached = Arc::new(Mutex::new(Vec::new()));
    let app = app(quota, Duration::from_secs(3), &reached);
    let mut waiting = Vec::new();
    let mut refused = 0;
    let start = Instant::now();
    for _ in 0..100_000 {
        let mut answer = Box::pin(app.clone().oneshot(request()));
        let polled = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(std::future::Future::poll(answer.as_mut(), cx))
        })
        .await;
        match polled {
            std::task::Poll::Ready(response) => {
                if response.unwrap().status() == StatusCode::TOO_MANY_REQUESTS {
                    refused += 1;
                }
            }
            std::task::Poll::Pending => waiting.push(answer),
        }
        // The 3 that may wait, and one more per second the quota refills meanwhile (the
        // limiter's clock, calibrated apart from `Instant`, may run a hair ahead of it).
        let refilled = (start.elapsed() + Duration::from_millis(50)).as_secs() as usize;
        assert!(
            waiting.len() <= 3 + refilled,
            "{} requests waiting",
            waiting.len()
        );
    }
    // All but the burst, the 3 that may wait and what refilled while the loop ran (slow on a
    // loaded machine) are refused.
    let refilled = (start.elapsed() + Duration::from_millis(50)).as_secs();
    assert!(
        refused >= 100_000 - 4 - refilled - 1,
        "{refused} refused in {:?}",
        start.elapsed()
    );
    drop(waiting);
}

#[tokio::test]
async fn a_waiter_dropped_before_another_never_lets_two_go_on_at_once() {
    // 10/s (one per 100 ms), burst 1, a wait of 1 s. r0 goes on at once, a and b wait; a is
    // dropped: c's turn comes an interval after b's, never just behind it.
    for text in ["10/s burst 1", "10/s burst 1 token-bucket"] {
        let quota: Quota = text.parse().unwrap();
        let reached = Arc::new(Mutex::new(Vec::new()));
        let app = app(quota, Duration::from_secs(1), &reached);
        assert_eq!(send(&app, request()).await.0.status(), StatusCode::OK);
        let a = tokio::spawn(app.clone().oneshot(request()));
        tokio::time::sleep(Duration::from_millis(2)).await;
        let b = tokio::spawn(app.clone().oneshot(request()));
        tokio::time::sleep(Duration::from_millis(10)).await;
        a.abort();
        let _ = a.await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let c = tokio::spawn(app.clone().oneshot(request()));
        b.await.unwrap().unwrap();
        c.await.unwrap().unwrap();
        let reached = reached.lock().unwrap().clone();
        let (b_at, c_at) = (reached[1], reached[2]);
        assert!(
            c_at - b_at >= Duration::from_millis(95),
            "{text}: b and c {:?} apart",
            c_at - b_at
        );
    }
}

#[tokio::test]
async fn shadow_layers_and_requests_of_cost_0_never_wait() {
    let quota = Quota::per_second(1).unwrap();
    let shadow = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(MemoryStore::new(), quota, Global)
            .wait(Duration::from_secs(5))
            .shadow(true),
    );
    let free = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(MemoryStore::new(), quota, Global)
            .cost_by(|r: &Request<Body>| u32::from(r.uri().query() != Some("free")))
            .wait(Duration::from_secs(5)),
    );
    for (app, uri) in [(&shadow, "/"), (&free, "/?free")] {
        assert_eq!(
            send(app, Request::get("/").body(Body::empty()).unwrap())
                .await
                .0
                .status(),
            StatusCode::OK
        );
        let start = Instant::now();
        let (response, _) = send(app, Request::get(uri).body(Body::empty()).unwrap()).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(
            start.elapsed() < Duration::from_millis(100),
            "{uri} waited {:?}",
            start.elapsed()
        );
    }
}

#[tokio::test]
async fn a_wait_longer_than_a_quota_can_hold_still_waits() {
    let quota = Quota::per_second(1).unwrap();
    let reached = Arc::new(Mutex::new(Vec::new()));
    let app = app(quota, Duration::MAX, &reached);
    assert_eq!(send(&app, request()).await.0.status(), StatusCode::OK);
    let start = Instant::now();
    assert_eq!(send(&app, request()).await.0.status(), StatusCode::OK);
    assert!(
        start.elapsed() >= Duration::from_millis(900),
        "it waited its turn"
    );
}
