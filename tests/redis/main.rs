//! The Redis store against real `redis-server`s that the tests start themselves.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod batch;
mod conformance;
mod differential;
mod queue;
mod scale;
mod server;
mod tls;

use ratewarden_redis::{RedisConfig, RedisStore};
use tests::redis_server::RedisServer;

/// A server of this test's own, and a store on it with a prefix unique to the test.
async fn store(server: &RedisServer, prefix: &str) -> RedisStore {
    // Generous: debug builds of 50 concurrent tasks on two cores are slow.
    RedisConfig::new(server.url())
        .prefix(prefix)
        .timeout(std::time::Duration::from_secs(10))
        .connect()
        .await
        .unwrap()
}
