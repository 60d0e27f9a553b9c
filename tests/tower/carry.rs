//! What a fallback admitted while its store failed is owed to the store, under the quota it
//! was admitted under, and never escapes (a store of memory that fails on command stands in
//! for Redis).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::Request;
use ratewarden_core::{Decision, Key, Quota, Store, StoreError, StoreErrorKind};
use ratewarden_memory::MemoryStore;
use ratewarden_tower::RateLimitLayer;
use tower::{Service, ServiceExt};

/// A store that fails while `down`, else answers from a memory store after a few ms.
#[derive(Clone)]
struct Flaky {
    inner: Arc<MemoryStore>,
    down: Arc<AtomicBool>,
}

impl Store for Flaky {
    async fn check(&self, key: &Key, quota: &Quota, cost: u32) -> Result<Decision, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::new(StoreErrorKind::Connection));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.inner.check(key, quota, cost).await
    }
    async fn peek(&self, key: &Key, quota: &Quota) -> Result<Decision, StoreError> {
        self.inner.peek(key, quota).await
    }
    async fn reset(&self, key: &Key, quota: &Quota) -> Result<(), StoreError> {
        self.inner.reset(key, quota).await
    }
}

fn flaky() -> (Flaky, Arc<AtomicBool>) {
    let down = Arc::new(AtomicBool::new(false));
    let store = Flaky {
        inner: Arc::new(MemoryStore::new()),
        down: Arc::clone(&down),
    };
    (store, down)
}

/// Whether `path` is admitted.
async fn admitted<S>(service: &mut S, path: &str) -> bool
where
    S: Service<
            Request<()>,
            Response = http::Response<ratewarden_tower::rate_limit::ResponseBody<String>>,
        >,
    S::Error: std::fmt::Debug,
{
    let request = Request::get(path).body(()).unwrap();
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    response.status().is_success()
}

#[tokio::test]
async fn owed_units_never_escape_through_a_request_dropped_before_its_answer() {
    // Reproduced: the units were taken from what the key owed when the request came, and lost
    // when its future was dropped unpolled: the store then admitted 10 again, not 1.
    for dropped in [false, true] {
        let (store, down) = flaky();
        // 10 at once, then one a minute.
        let quota = Quota::per_minute(1).unwrap().with_burst(10).unwrap();
        let layer = RateLimitLayer::new(store, quota, |_: &Request<()>| Some(Key::from("k")));
        let mut service = tower::Layer::layer(&layer, tower::service_fn(ok));
        down.store(true, Ordering::SeqCst);
        let mut during = 0;
        for _ in 0..15 {
            during += u32::from(admitted(&mut service, "/").await);
        }
        down.store(false, Ordering::SeqCst);
        if dropped {
            let request = Request::get("/").body(()).unwrap();
            drop(service.ready().await.unwrap().call(request));
        }
        let mut after = 0;
        for _ in 0..15 {
            after += u32::from(admitted(&mut service, "/").await);
        }
        assert_eq!(during, 10, "the fallback held the quota");
        // The store learns of the 10: at most one more (a minute's refill).
        assert!(
            after <= 1,
            "dropped {dropped}: the store admitted {after} more"
        );
    }
}

#[tokio::test]
async fn owed_units_are_charged_to_the_quota_they_were_admitted_under() {
    // Reproduced: units owed per key were charged to whichever quota the key's next request
    // had: after 100 admitted on `/cheap` (100/min), `/dear` (10/min, unused) admitted 1 of 10
    // and `/cheap` 100 more.
    let (store, down) = flaky();
    let cheap = Quota::per_minute(100).unwrap();
    let dear = Quota::per_minute(10).unwrap();
    let layer = RateLimitLayer::new(store, cheap, |_: &Request<()>| Some(Key::from("k"))).quota_by(
        move |req: &Request<()>| {
            Some(if req.uri().path() == "/dear" {
                dear
            } else {
                cheap
            })
        },
    );
    let mut service = tower::Layer::layer(&layer, tower::service_fn(ok));
    down.store(true, Ordering::SeqCst);
    for _ in 0..100 {
        assert!(admitted(&mut service, "/cheap").await);
    }
    down.store(false, Ordering::SeqCst);
    let mut dear_admitted = 0;
    for _ in 0..10 {
        dear_admitted += u32::from(admitted(&mut service, "/dear").await);
    }
    let mut cheap_admitted = 0;
    for _ in 0..100 {
        cheap_admitted += u32::from(admitted(&mut service, "/cheap").await);
    }
    assert_eq!(dear_admitted, 10, "/dear owed nothing");
    assert!(
        cheap_admitted <= 2,
        "/cheap admitted {cheap_admitted} more after 100"
    );
}

/// The service behind the layer: every request answered `200`.
async fn ok(_: http::Request<()>) -> Result<http::Response<String>, std::convert::Infallible> {
    Ok(http::Response::new(String::new()))
}

/// Units a fallback admitted while the store failed go with a waiting request's check too:
/// once the store is back they are charged, and no request goes on at once in their place.
#[tokio::test]
async fn owed_units_go_with_a_waiting_check() {
    let (store, down) = flaky();
    let quota = Quota::per_minute(1).unwrap().with_burst(10).unwrap();
    let layer = RateLimitLayer::new(store, quota, |_: &Request<()>| Some(Key::from("k")))
        .wait(Duration::from_secs(120));
    let mut service = tower::Layer::layer(&layer, tower::service_fn(ok));
    down.store(true, Ordering::SeqCst);
    let mut during = 0;
    for _ in 0..15 {
        during += u32::from(admitted(&mut service, "/").await);
    }
    assert_eq!(during, 10, "the fallback admitted its burst");
    down.store(false, Ordering::SeqCst);
    let mut at_once = 0;
    for _ in 0..15 {
        let answered =
            tokio::time::timeout(Duration::from_millis(200), admitted(&mut service, "/"));
        if answered.await.is_ok_and(|ok| ok) {
            at_once += 1;
        }
    }
    assert!(
        at_once <= 1,
        "{at_once} went on at once after the fallback's 10"
    );
}
