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
//! - One check is at most one round trip, over one multiplexed connection that reconnects by
//!   itself (the default, and the faster), or over a `deadpool-redis` pool
//!   ([`RedisConfig::pool`]), within a deadline ([`RedisConfig::timeout`], 50 ms).
//!
//! # In front of Redis
//!
//! A gateway keeps a little state of its own, so that Redis is asked only when its answer can
//! differ from what the gateway already knows:
//!
//! - **Denied keys** ([`RedisConfig::deny_cache`], on by default). A key Redis denied at `T`
//!   with retry time `r` stays denied, for that cost or more, until `T + r`: time passing is
//!   the only thing that frees quota, and other gateways only spend more. So the gateway
//!   answers such checks itself until its own `t + r`, `t` being when the reply arrived (after
//!   `T`): "denied" for at most one network trip longer than Redis would say it, never
//!   "allowed". A blocked key, however hot, costs one Redis call per retry period.
//! - **Leases** ([`RedisConfig::lease`], off by default). A check with no lease at hand takes
//!   a batch of the key's quota from Redis (deducted there at once) and the gateway spends it
//!   locally until it runs out or the lease period `p` ends. A request admitted at `t` spends a
//!   token granted in `[t - p, t]`, and Redis grants at most `burst + rate × (w + p)` in any
//!   interval of length `w + p`; so in any interval of length `w` the fleet admits at most the
//!   quota's `burst + rate × w`, plus an overshoot of at most `rate × p`, and at most the tokens
//!   the gateways held when the interval began (`gateways × batch`):
//!   **overshoot ≤ min(rate × period, gateways × batch)** (a test checks it under overload).
//!   Tokens unspent when a lease ends are forgotten: under-admission, never over.
//! - **Hot keys** ([`RedisConfig::hot_keys`], off by default): a key split into `n`
//!   sub-counters in `n` cluster slots, each enforcing [`Quota::share`](rl_core::Quota::share)
//!   `(n)`, one picked at random per check; for every key, or adaptively for keys over a rate,
//!   announced to every gateway by pub/sub ([`HotKeys`]).
//!
//! BENCHMARKS.md measures each against plain Redis: calls per check, throughput, admitted
//! against the quota.
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
