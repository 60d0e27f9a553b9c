//! A Redis [`Store`](rl_core::Store) for [`rl_core`]: the state of every key lives in Redis, so
//! a fleet of gateways shares one quota.
//!
//! - One Lua script per algorithm, mirroring `rl-core`'s integer arithmetic line for line (a
//!   differential test runs 100,000 random operations per algorithm through both). Scripts run
//!   by SHA and are reloaded transparently after `SCRIPT FLUSH` or a restart.
//! - Time is the Redis server's `TIME`, read inside the script: gateways whose clocks disagree
//!   still share one clock. [`RedisStore::measure_clock_skew`] reports (and past a threshold,
//!   logs) how far this host's clock is from Redis's.
//! - Every key expires when its state equals a fresh one, so idle keys vanish by themselves.
//! - Keys are `PREFIX:{KEY}:ALGORITHM` (`PREFIX:{KEY}:SCOPE:ALGORITHM` for a key of a named
//!   limit, see `Key::scoped`), the user key hex-encoded inside the hash tag.
//! - One check is one round trip, over one multiplexed connection that reconnects by itself
//!   (the default, and the faster), or over a `deadpool-redis` pool ([`RedisConfig::pool`]).
//!
//! ```no_run
//! use rl_core::{Key, Quota, Store};
//! use rl_store_redis::RedisStore;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let decision = store.check(&Key::from("user-42"), &Quota::per_second(10)?, 1).await?;
//! println!("allowed: {}", decision.is_allowed());
//! # Ok(()) }
//! ```
//!
//! Redis Cluster: [`RedisConfig::cluster`].

mod deny_cache;
mod error;
mod hot_keys;
mod lease;
mod script;
mod store;

pub use hot_keys::{HotKeys, MAX_PARTS};
pub use store::{ConfigError, RedisConfig, RedisStore};
