//! The Redis store against real `redis-server`s that the tests start themselves.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod batch;
mod clock;
mod conformance;
mod differential;
mod eviction;
mod expiry;
mod lone;
mod queue;
mod reserve;
mod scale;
mod server;
mod several;
mod several_edges;
mod slots;
mod tls;
mod work;

use ratewarden_core::{Key, Quota, Store};
use ratewarden_redis::{RedisConfig, RedisStore};
use tests::redis_server::RedisServer;

/// A server of this test's own, and a store on it with a prefix unique to the test.
async fn store(server: &RedisServer, prefix: &str) -> RedisStore {
    // Generous: debug builds of 50 concurrent tasks on two cores are slow.
    store_with_timeout(server, prefix, std::time::Duration::from_secs(10)).await
}

/// A store on `server` under `prefix` whose checks give up after `timeout`.
async fn store_with_timeout(
    server: &RedisServer,
    prefix: &str,
    timeout: std::time::Duration,
) -> RedisStore {
    RedisConfig::new(server.url())
        .prefix(prefix)
        .timeout(timeout)
        .connect()
        .await
        .unwrap()
}

/// A check's result, and how long it took.
type Timed = (
    Result<ratewarden_core::Decision, ratewarden_core::StoreError>,
    std::time::Duration,
);

/// `n` checks spawned at once on the current runtime, each of its own key `tag-i`: each
/// one's result and time, when awaited.
pub(crate) fn timed_checks(
    store: &RedisStore,
    quota: Quota,
    tag: &str,
    n: usize,
) -> Vec<tokio::task::JoinHandle<Timed>> {
    (0..n)
        .map(|i| {
            let (store, key) = (store.clone(), Key::from(format!("{tag}-{i}")));
            tokio::spawn(async move {
                let came = std::time::Instant::now();
                let result = store.check(&key, &quota, 1).await;
                (result, came.elapsed())
            })
        })
        .collect()
}

/// Polls `future` once: whether it is still pending.
pub(crate) async fn pending_after_one_poll<F: std::future::Future>(
    future: &mut std::pin::Pin<Box<F>>,
) -> bool {
    std::future::poll_fn(|cx| std::task::Poll::Ready(future.as_mut().poll(cx).is_pending())).await
}

/// A check of a key named `tag-...`, polled once and pending: its call is in flight. On a
/// loaded machine a check may be answered within its first poll (the thread paused between
/// sending and polling its reply): it is then taken as done, and another key's tried.
pub(crate) async fn one_in_flight(
    store: &RedisStore,
    quota: Quota,
    tag: &str,
) -> impl Future<Output = Result<ratewarden_core::Decision, ratewarden_core::StoreError>> + use<> {
    for attempt in 0..100 {
        let (store, key) = (store.clone(), Key::from(format!("{tag}-{attempt}")));
        let mut check = Box::pin(async move { store.check(&key, &quota, 1).await });
        if pending_after_one_poll(&mut check).await {
            return check;
        }
    }
    panic!("100 checks were each answered within their first poll");
}

/// `n` checks polled once (so `n` calls are in flight) and then held, unpolled: a
/// `select!` loop busy in another branch, or a `buffer_unordered` whose consumer awaits
/// something else, does this.
pub(crate) async fn held_in_flight(
    store: &RedisStore,
    quota: Quota,
    tag: &str,
    n: usize,
) -> Vec<impl Sized> {
    let mut held = Vec::new();
    for i in 0..n {
        held.push(one_in_flight(store, quota, &format!("{tag}-{i}")).await);
    }
    held
}
