//! Held requests settled from their responses: `count_if`, `settle_with`, `settle_by_frames`
//! (streaming bodies, gRPC trailers), through real axum routers on the memory store.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, Response, StatusCode, Uri};
use http_body::Frame;
use http_body_util::BodyExt;
use ratewarden_core::{Key, Quota};
use ratewarden_tower::RateLimitLayer;
use ratewarden_tower::key::{Global, Header, KeyExtractor, PeerIp};
use tower::ServiceExt;

use crate::support::{get_from, manual_store, send};

/// A streaming body of `left` one-byte chunks, then trailers if given.
struct Chunks {
    left: u32,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.left > 0 {
            self.left -= 1;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }
}

/// A request's URI, for its query.
type Units = Uri;

/// The `units=N` of a query string (0 when absent).
fn units(uri: &Uri) -> u32 {
    uri.query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("units=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn user(name: &str) -> Request<Body> {
    get_from("10.0.0.1:1000", "/", &[("x-user", name.as_bytes())])
}

fn user_key(name: &str) -> Key {
    let header = Header::new(HeaderName::from_static("x-user"));
    KeyExtractor::<Body>::key_for(&header, Key::from(name))
}

#[tokio::test]
async fn only_failed_logins_count_and_successes_are_never_refused() {
    let (store, _clock) = manual_store();
    let layer = RateLimitLayer::new(store, Quota::per_minute(5).unwrap(), PeerIp::new())
        .count_if(|r: &Response<Body>| r.status() == StatusCode::UNAUTHORIZED);
    let app = Router::new()
        .route(
            "/login",
            post(|uri: Uri| async move {
                if uri.query() == Some("ok=1") {
                    StatusCode::OK
                } else {
                    StatusCode::UNAUTHORIZED
                }
            }),
        )
        .layer(layer);
    let login = |ok: bool| {
        let mut req = get_from("10.0.0.1:1000", &format!("/login?ok={}", u8::from(ok)), &[]);
        *req.method_mut() = http::Method::POST;
        req
    };
    // 100 successes with 5 failures among them: every one is served.
    for i in 0..105 {
        let ok = i % 21 != 20;
        let (response, _) = send(&app, login(ok)).await;
        let expected = if ok {
            StatusCode::OK
        } else {
            StatusCode::UNAUTHORIZED
        };
        assert_eq!(response.status(), expected, "attempt {i}");
    }
    // The 6th failure is refused, as is any attempt now: the quota of failures is spent.
    assert_eq!(
        send(&app, login(false)).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, login(true)).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn a_streamed_response_is_charged_the_chunks_it_sent_when_its_body_ends() {
    let (store, _clock) = manual_store();
    let layer = RateLimitLayer::new(
        store.clone(),
        Quota::per_minute(100).unwrap(),
        Header::new(HeaderName::from_static("x-user")),
    )
    .cost_by(|_: &Request<Body>| 10)
    .settle_by_frames(|frame: &Frame<Bytes>| u32::from(frame.is_data()));
    let app = Router::new()
        .route(
            "/",
            get(|q: Units| async move {
                Body::new(Chunks {
                    left: units(&q),
                    trailers: None,
                })
            }),
        )
        .layer(layer);
    let stream = |name: &str, units: u32| {
        get_from(
            "10.0.0.1:1000",
            &format!("/?units={units}"),
            &[("x-user", name.as_bytes())],
        )
    };
    for _ in 0..3 {
        let (response, body) = send(&app, stream("alice", 40)).await;
        assert_eq!((response.status(), body.len()), (StatusCode::OK, 40));
    }
    let quota = Quota::per_minute(100).unwrap();
    assert_eq!(store.held(&user_key("alice"), &quota), 0);
    // 120 charged, 100 in the quota: the fourth is refused; another user is not.
    let (response, _) = send(&app, stream("alice", 1)).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        send(&app, stream("bob", 1)).await.0.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_body_dropped_half_way_settles_what_it_counted() {
    let (store, _clock) = manual_store();
    let quota = Quota::per_minute(100).unwrap();
    let layer = RateLimitLayer::new(store.clone(), quota, Global)
        .cost_by(|_: &Request<Body>| 50)
        .settle_by_frames(|frame: &Frame<Bytes>| u32::from(frame.is_data()));
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                Body::new(Chunks {
                    left: 80,
                    trailers: None,
                })
            }),
        )
        .layer(layer);
    let key = KeyExtractor::<Body>::extract(&Global, &user("x")).unwrap();
    let response = app.clone().oneshot(user("x")).await.unwrap();
    assert_eq!(store.held(&key, &quota), 50, "held while the body streams");
    let mut body = response.into_body();
    for _ in 0..30 {
        body.frame().await.unwrap().unwrap();
    }
    drop(body);
    assert_eq!(store.held(&key, &quota), 0);
    // 30 charged: 70 left, not 71.
    let reserve = |units| {
        store
            .reserve_sync(
                &[ratewarden_core::Limit::new(key.clone(), quota, units)],
                Duration::from_secs(1),
            )
            .unwrap()
    };
    assert!(!reserve(71).is_allowed());
    let seventy = reserve(70);
    assert!(seventy.is_allowed());
    store.settle_sync(seventy, 0);
}

#[tokio::test]
async fn a_response_header_settles_above_the_estimate_into_debt() {
    let (store, _clock) = manual_store();
    let layer = RateLimitLayer::new(store, Quota::per_minute(100).unwrap(), Global)
        .cost_by(|_: &Request<Body>| 10)
        .settle_with(|r: &Response<Body>| r.headers()["x-used"].to_str().unwrap().parse().unwrap());
    let app = Router::new()
        .route(
            "/",
            get(|q: Units| async move { ([("x-used", units(&q).to_string())], "") }),
        )
        .layer(layer);
    let get = |units: u32| get_from("10.0.0.1:1000", &format!("/?units={units}"), &[]);
    // One request's overdraft: 10 estimated, 130 used. 100 is the quota: nothing more
    // until the 30 owed are repaid (a frozen clock: never).
    assert_eq!(send(&app, get(130)).await.0.status(), StatusCode::OK);
    assert_eq!(
        send(&app, get(1)).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn grpc_trailers_settle_the_units_they_report() {
    let (store, _clock) = manual_store();
    let quota = Quota::per_minute(100).unwrap();
    let layer = RateLimitLayer::new(store.clone(), quota, Global)
        .cost_by(|_: &Request<Body>| 10)
        .settle_by_frames(|frame: &Frame<Bytes>| {
            frame
                .trailers_ref()
                .and_then(|t| t.get("x-tokens")?.to_str().ok()?.parse().ok())
                .unwrap_or(0)
        });
    let app = Router::new()
        .route(
            "/",
            post(|| async {
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", "0".parse().unwrap());
                trailers.insert("x-tokens", "45".parse().unwrap());
                Body::new(Chunks {
                    left: 3,
                    trailers: Some(trailers),
                })
            }),
        )
        .layer(layer);
    let call = || {
        let mut req = get_from(
            "10.0.0.1:1000",
            "/",
            &[("content-type", b"application/grpc")],
        );
        *req.method_mut() = http::Method::POST;
        req
    };
    assert_eq!(send(&app, call()).await.0.status(), StatusCode::OK);
    assert_eq!(send(&app, call()).await.0.status(), StatusCode::OK);
    // 90 charged: a third, holding 10, still fits; its 45 go to debt.
    let (third, _) = send(&app, call()).await;
    assert_eq!(third.status(), StatusCode::OK);
    let (refused, _) = send(&app, call()).await;
    assert_eq!(refused.status(), StatusCode::OK, "gRPC answers 200");
    assert_eq!(refused.headers()["grpc-status"], "8"); // RESOURCE_EXHAUSTED
}

#[tokio::test]
async fn dropped_requests_and_panicking_handlers_release_their_holds() {
    let (store, _clock) = manual_store();
    let quota = Quota::per_minute(100).unwrap();
    let started = Arc::new(AtomicU32::new(0));
    let layer = RateLimitLayer::new(store.clone(), quota, Global)
        .cost_by(|_: &Request<Body>| 10)
        .count_if(|_: &Response<Body>| true);
    let seen = Arc::clone(&started);
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let seen = Arc::clone(&seen);
                async move {
                    seen.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    "never"
                }
            }),
        )
        .route(
            "/panic",
            get(|| async {
                if true {
                    panic!("handler panicked");
                }
                ""
            }),
        )
        .layer(layer);
    let key = KeyExtractor::<Body>::extract(&Global, &user("x")).unwrap();
    // Ten requests hold all 100 units while they run.
    let mut running = Vec::new();
    for _ in 0..10 {
        running.push(tokio::spawn(app.clone().oneshot(user("x"))));
    }
    while started.load(Ordering::SeqCst) < 10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(store.held(&key, &quota), 100);
    assert_eq!(
        send(&app, user("x")).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    for task in running {
        task.abort();
        let _ = task.await;
    }
    assert_eq!(store.held(&key, &quota), 0, "cancelled requests released");
    // A panicking handler (the panic unwinds through the layer's future).
    let panicked = tokio::spawn(
        app.clone()
            .oneshot(get_from("10.0.0.1:1000", "/panic", &[])),
    );
    assert!(panicked.await.unwrap_err().is_panic());
    assert_eq!(store.held(&key, &quota), 0, "the panicked request released");
    // Nothing was charged: the whole quota is there.
    for _ in 0..10 {
        let req = get_from("10.0.0.1:1000", "/missing", &[]);
        assert_eq!(send(&app, req).await.0.status(), StatusCode::NOT_FOUND);
    }
    assert_eq!(
        send(&app, get_from("10.0.0.1:1000", "/missing", &[]))
            .await
            .0
            .status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn concurrent_held_requests_never_pass_the_quota() {
    let (store, _clock) = manual_store();
    let quota = Quota::per_hour(200).unwrap();
    let layer = RateLimitLayer::new(store.clone(), quota, Global)
        .cost_by(|_: &Request<Body>| 7)
        .settle_with(|r: &Response<Body>| r.headers()["x-used"].to_str().unwrap().parse().unwrap());
    let app = Router::new()
        .route(
            "/",
            get(|q: Units| async move {
                tokio::task::yield_now().await;
                ([("x-used", units(&q).to_string())], "")
            }),
        )
        .layer(layer);
    let served = Arc::new(AtomicU32::new(0));
    let key = KeyExtractor::<Body>::extract(&Global, &user("x")).unwrap();
    // 50 clients, each sending until refused with nothing held (a refusal no settle can
    // lift), at most 100 requests each.
    let tasks: Vec<_> = (0..50_u32)
        .map(|c| {
            let (app, served) = (app.clone(), Arc::clone(&served));
            let (store, key) = (store.clone(), key.clone());
            tokio::spawn(async move {
                for i in 0..100_u32 {
                    let used = (c + i) % 8; // 0..=7: never above the estimate
                    let req = get_from("10.0.0.1:1000", &format!("/?units={used}"), &[]);
                    let (response, _) = send(&app, req).await;
                    if response.status() == StatusCode::OK {
                        served.fetch_add(used, Ordering::SeqCst);
                    } else if store.held(&key, &quota) == 0 {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let served = served.load(Ordering::SeqCst);
    assert!(served <= 200, "{served} units served of 200");
    // Unused estimates came back: at most an estimate's 7 units less one were left.
    assert!(served >= 194, "only {served} of 200 used");
}

mod in_flight {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thousand_concurrent_requests_never_run_more_than_four_at_once() {
        let (store, _clock) = manual_store();
        let layer = RateLimitLayer::in_flight(store.clone(), 4, Global).unwrap();
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (n, m) = (Arc::clone(&now), Arc::clone(&most));
        let app = Router::new()
            .route(
                "/",
                get(move || {
                    let (now, most) = (Arc::clone(&n), Arc::clone(&m));
                    async move {
                        let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(running, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        now.fetch_sub(1, Ordering::SeqCst);
                        "done"
                    }
                }),
            )
            .layer(layer);
        let tasks: Vec<_> = (0..1_000)
            .map(|_| {
                let app = app.clone();
                tokio::spawn(async move { send(&app, user("x")).await.0.status() })
            })
            .collect();
        let (mut served, mut refused) = (0, 0);
        for task in tasks {
            match task.await.unwrap() {
                StatusCode::OK => served += 1,
                StatusCode::TOO_MANY_REQUESTS => refused += 1,
                other => panic!("{other}"),
            }
        }
        let most = most.load(Ordering::SeqCst);
        assert!(most <= 4, "{most} in flight at once");
        assert!(
            served >= 4 && refused > 0,
            "{served} served, {refused} refused"
        );
        // Every place came back: four at once again.
        let again: Vec<_> = (0..4)
            .map(|_| {
                tokio::spawn({
                    let app = app.clone();
                    async move { send(&app, user("x")).await.0.status() }
                })
            })
            .collect();
        for task in again {
            assert_eq!(task.await.unwrap(), StatusCode::OK);
        }
    }

    #[tokio::test]
    async fn a_place_is_held_until_the_body_ends_and_given_back_by_cancels_and_panics() {
        let (store, _clock) = manual_store();
        let layer = RateLimitLayer::in_flight(store.clone(), 1, Global).unwrap();
        let app = Router::new()
            .route(
                "/stream",
                get(|| async {
                    Body::new(Chunks {
                        left: 3,
                        trailers: None,
                    })
                }),
            )
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    "never"
                }),
            )
            .route(
                "/panic",
                get(|| async {
                    if true {
                        panic!("handler panicked");
                    }
                    ""
                }),
            )
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        let get = |uri: &str| get_from("10.0.0.1:1000", uri, &[]);
        // A body not yet read holds the place.
        let streaming = app.clone().oneshot(get("/stream")).await.unwrap();
        assert_eq!(
            send(&app, get("/")).await.0.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        let refused = send(&app, get("/")).await.0;
        assert_eq!(refused.headers()["retry-after"], "1");
        assert!(refused.headers().get("ratelimit-policy").is_none());
        let body = streaming.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), 3);
        assert_eq!(send(&app, get("/")).await.0.status(), StatusCode::OK);
        // A cancelled request gives its place back.
        let slow = tokio::spawn(app.clone().oneshot(get("/slow")));
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert_eq!(
            send(&app, get("/")).await.0.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        slow.abort();
        let _ = slow.await;
        assert_eq!(send(&app, get("/")).await.0.status(), StatusCode::OK);
        // So does a handler that panics.
        let panicked = tokio::spawn(app.clone().oneshot(get("/panic")));
        assert!(panicked.await.unwrap_err().is_panic());
        assert_eq!(send(&app, get("/")).await.0.status(), StatusCode::OK);
    }
}

/// A request that runs longer than its hold keeps its place: it renews its hold while it
/// runs (a heartbeat), and gives it back when it ends.
#[tokio::test]
async fn a_request_longer_than_its_hold_keeps_its_place_while_it_runs() {
    let layer = RateLimitLayer::in_flight(ratewarden_memory::MemoryStore::new(), 1, Global)
        .unwrap()
        .hold(Duration::from_millis(300));
    let app = Router::new()
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(1_200)).await;
                "done"
            }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let get_ = |uri: &str| get_from("10.0.0.1:1000", uri, &[]);
    let slow = tokio::spawn({
        let app = app.clone();
        async move {
            send(&app, get_from("10.0.0.1:1000", "/slow", &[]))
                .await
                .0
                .status()
        }
    });
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            send(&app, get_("/")).await.0.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(slow.await.unwrap(), StatusCode::OK);
    assert_eq!(send(&app, get_("/")).await.0.status(), StatusCode::OK);
}

/// A body that yields one frame every `every`, `left` times.
struct EveryFrame {
    sleep: Pin<Box<tokio::time::Sleep>>,
    every: Duration,
    left: u32,
}

impl EveryFrame {
    fn new(every: Duration, left: u32) -> Self {
        Self {
            sleep: Box::pin(tokio::time::sleep(every)),
            every,
            left,
        }
    }
}

impl http_body::Body for EveryFrame {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        std::task::ready!(self.sleep.as_mut().poll(cx));
        self.left -= 1;
        let next = tokio::time::Instant::now() + self.every;
        self.sleep.as_mut().reset(next);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
    }
}

/// A body whose frames come further apart than the hold keeps its place while it is read:
/// the renewal starts at half the hold whether or not a frame has come.
#[tokio::test]
async fn a_body_read_slower_than_its_hold_keeps_its_place() {
    let layer = RateLimitLayer::in_flight(ratewarden_memory::MemoryStore::new(), 1, Global)
        .unwrap()
        .hold(Duration::from_millis(300));
    let app = Router::new()
        .route(
            "/stream",
            get(|| async { Body::new(EveryFrame::new(Duration::from_millis(400), 4)) }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let get_ = |uri: &str| get_from("10.0.0.1:1000", uri, &[]);
    let streaming = app.clone().oneshot(get_("/stream")).await.unwrap();
    let reader = tokio::spawn(async move { streaming.into_body().collect().await.unwrap() });
    let mut statuses = Vec::new();
    for _ in 0..7 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        statuses.push(send(&app, get_("/")).await.0.status().as_u16());
    }
    assert_eq!(reader.await.unwrap().to_bytes().len(), 4);
    assert!(statuses.iter().all(|&s| s == 429), "{statuses:?}");
    assert_eq!(send(&app, get_("/")).await.0.status(), StatusCode::OK);
}

/// A hold too long for the clock is cut to the longest documented, never a panic that
/// leaks the place.
#[tokio::test]
async fn a_huge_hold_is_cut_not_a_panic() {
    let layer = RateLimitLayer::in_flight(ratewarden_memory::MemoryStore::new(), 1, Global)
        .unwrap()
        .hold(Duration::MAX);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    for _ in 0..3 {
        let app = app.clone();
        let status = tokio::spawn(async move {
            send(&app, get_from("10.0.0.1:1000", "/", &[]))
                .await
                .0
                .status()
        });
        assert_eq!(status.await.unwrap(), StatusCode::OK);
    }
}

/// A store that fails the first renewal it is asked for.
#[derive(Clone)]
struct FirstRenewFails {
    inner: ratewarden_memory::MemoryStore,
    renewals: Arc<AtomicU32>,
}

impl ratewarden_core::Store for FirstRenewFails {
    async fn check(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
    ) -> Result<ratewarden_core::Decision, ratewarden_core::StoreError> {
        self.inner.check(key, quota, cost).await
    }
    async fn reserve(
        &self,
        limits: &[ratewarden_core::Limit],
        hold: Duration,
    ) -> Result<ratewarden_core::Reservation, ratewarden_core::StoreError> {
        self.inner.reserve(limits, hold).await
    }
    async fn settle(
        &self,
        reservation: ratewarden_core::Reservation,
        actual: u32,
    ) -> Result<(), ratewarden_core::StoreError> {
        self.inner.settle(reservation, actual).await
    }
    async fn renew(
        &self,
        held: &[(ratewarden_core::Limit, u64)],
        hold: Duration,
    ) -> Result<(), ratewarden_core::StoreError> {
        if self.renewals.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(ratewarden_core::StoreError::with_source(
                ratewarden_core::StoreErrorKind::Timeout,
                "a blip",
            ));
        }
        self.inner.renew(held, hold).await
    }
    async fn peek(
        &self,
        key: &Key,
        quota: &Quota,
    ) -> Result<ratewarden_core::Decision, ratewarden_core::StoreError> {
        self.inner.peek(key, quota).await
    }
    async fn reset(&self, key: &Key, quota: &Quota) -> Result<(), ratewarden_core::StoreError> {
        self.inner.reset(key, quota).await
    }
}

/// One failed renewal does not lose a running request's place: the next comes before the
/// hold runs out.
#[tokio::test]
async fn one_failed_renewal_keeps_the_place() {
    let store = FirstRenewFails {
        inner: ratewarden_memory::MemoryStore::new(),
        renewals: Arc::new(AtomicU32::new(0)),
    };
    let layer = RateLimitLayer::in_flight(store, 1, Global)
        .unwrap()
        .hold(Duration::from_millis(300));
    let app = Router::new()
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(1_200)).await;
                "done"
            }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let slow = tokio::spawn({
        let app = app.clone();
        async move {
            send(&app, get_from("10.0.0.1:1000", "/slow", &[]))
                .await
                .0
                .status()
        }
    });
    let mut statuses = Vec::new();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        statuses.push(
            send(&app, get_from("10.0.0.1:1000", "/", &[]))
                .await
                .0
                .status()
                .as_u16(),
        );
    }
    assert_eq!(slow.await.unwrap(), StatusCode::OK);
    assert!(statuses.iter().all(|&s| s == 429), "{statuses:?}");
}
