//! A Redis [`Store`](ratewarden_core::Store) for [`ratewarden_core`]: the state of every key lives in Redis, so
//! a fleet of gateways shares one quota.
//!
//! - Lua code, one check per algorithm, mirroring `ratewarden-core`'s integer arithmetic line for
//!   line (a differential test runs 100,000 random operations per algorithm through both). On
//!   Redis 7.0 and later it is a library of Redis functions, loaded once per server and called
//!   by `FCALL`: what a script would make again at every call is made once, which cuts what
//!   Redis spends per call by a quarter to a third (`BENCHMARKS.md`). Where the library is
//!   missing (a new server, a restart, `FUNCTION FLUSH`, a new cluster node) a check goes by
//!   the script's source while the library is loaded beside it. A server without functions
//!   (before 7.0, or a user whose ACL lacks `FCALL` or `FUNCTION`) is served by the same code
//!   as scripts by SHA, reloaded after `SCRIPT FLUSH`, and a warning is logged once. The
//!   library is named by a hash of its code, so versions of this crate sharing a server each
//!   call their own; an old version's library stays until removed (`FUNCTION DELETE`).
//!   Avoid Redis 7.2.0 to 7.2.4: they pass a script's whole numbers with 8 or more trailing
//!   zeros to commands in exponent form (redis/redis#13113). States so written are read
//!   right, but a TTL so written (a multiple of 10^8 ms: only a state that stays more than
//!   27 hours, and rarely then) is refused, and that check fails.
//! - Time is the Redis server's `TIME`, read inside the script: gateways whose clocks disagree
//!   still share one clock. [`RedisStore::measure_clock_skew`] reports (and past a threshold,
//!   logs) how far this host's clock is from Redis's.
//! - Every key expires when its state equals a fresh one, so idle keys vanish by themselves.
//!   Keep Redis's `maxmemory-policy` at `noeviction` (its default): an evicted state is a
//!   fresh one (over-admission), where a full Redis answers `OOM`, a backend failure. Every
//!   state has a TTL, so the `volatile-*` policies evict them as the `allkeys-*` ones do. The
//!   store reads the policy (`CONFIG GET maxmemory-policy`, on every master of a cluster) when
//!   it connects and every 60 s, from a task that ends with the store, and reports it to an
//!   [`EvictionWatch`]; an evicting policy is also a warning (`tracing`) and the gauge
//!   `ratewarden_redis_evicting_policy` at 1 (`metrics`). Where `CONFIG` is refused
//!   (`NOPERM`) or renamed away (as managed services do), the policy is
//!   [`Unknown`](EvictionPolicy::Unknown) and the store works all the same.
//! - A key has one state per quota and per named limit: its Redis key is
//!   `PREFIX:{KIND KEY}:LIMIT`, with the user key inside the hash tag (integers in decimal,
//!   addresses as text, strings as their bytes, or the first 16 bytes of their SHA-256 in hex
//!   when too long to fit or holding a `}`, which would end the tag and let the key choose its
//!   slot) and [`Key::limit_id`](ratewarden_core::Key::limit_id) in hex: at most 128
//!   bytes, whatever the key, and one cluster slot for every limit of a key, the slot of the
//!   whole key.
//! - A state that cannot be read (garbage, `inf`, a key of another type) counts as spent: the
//!   check is denied, never let through, the state is replaced by a spent one that refills,
//!   and an error is logged (with the `tracing` feature; with the `metrics` feature, `ratewarden_redis_corrupt_states_total`
//!   counts it).
//! - One check is at most one round trip, over one multiplexed connection that reconnects by
//!   itself (the default, and the faster), or over a `deadpool-redis` pool
//!   ([`RedisConfig::pool`]), within a deadline ([`RedisConfig::timeout`], 50 ms). A server that
//!   answers `READONLY` (demoted behind a DNS name or VIP) has its connection replaced.
//! - Checks that wait together go together: while four calls are in flight on a connection,
//!   further checks queue, and when one returns they go as one call (up to 128 checks),
//!   decided in arrival order exactly as if each had gone alone. A check that finds fewer in
//!   flight goes at once: no timer, no added latency. On a pool or a cluster each key's state
//!   has its own queue, so different keys still go in parallel and a batch never spans a slot
//!   being migrated. In a batch, GCRA checks of one key read its state once and write it once,
//!   so a hot key's checks cost Redis a fraction of a script call each (see `BENCHMARKS.md`).
//!
//! # Errors
//!
//! Every error that means the store cannot decide for anyone counts against a circuit
//! breaker ([`StoreErrorKind::is_backend_failure`](ratewarden_core::StoreErrorKind::is_backend_failure)),
//! so that the layer's failure mode engages instead of each request failing alone:
//!
//! | what Redis or the client reports | kind | a backend failure |
//! |---|---|---|
//! | I/O error, connection refused or dropped, `ERR max number of clients reached` | `Connection` | yes |
//! | the deadline passed | `Timeout` | yes |
//! | no pooled connection in time | `PoolExhausted` | yes |
//! | `BUSY`, `LOADING`, `MASTERDOWN` | `Busy` | yes |
//! | `OOM` | `OutOfMemory` | yes |
//! | `READONLY` | `ReadOnly` | yes |
//! | `CLUSTERDOWN`, `TRYAGAIN`, `MOVED`, `ASK`, no connection to a slot's node | `ClusterDown` | yes |
//! | `NOAUTH`, `WRONGPASS`, `NOPERM`, a failed `AUTH` | `Unauthorized` | yes |
//! | a script error, a reply of the wrong shape | `Script` | yes |
//! | any other error code | `Other` | yes |
//! | `WRONGTYPE` where a script did not repair it | `CorruptState` | no |
//! | a bad URL or prefix; `CROSSSLOT` (one call's keys span slots: never sent, as a batch holds one state's checks) | `InvalidInput` | no |
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
//!   up to a batch of the key's quota from Redis in its one round trip (deducted there at
//!   once; never more than the burst, and what is left if less) and the gateway spends it
//!   locally until it runs out or the lease period `p` ends, counted from when its call was
//!   sent (before Redis granted it, however late its reply is read). A request admitted at `t`
//!   spends a token granted in `[t - p, t]`, and Redis grants at most
//!   `burst + rate × (w + p)` in any interval of length `w + p`; so in any interval of length
//!   `w` the fleet admits at most the quota's `burst + rate × w`, plus an overshoot of at most
//!   `rate × p`, and at most the tokens the gateways held when the interval began
//!   (`gateways × batch`):
//!   **overshoot ≤ min(rate × period, gateways × batch)** (a test checks it under overload).
//!   Tokens unspent when a lease ends are forgotten: under-admission, never over, at most
//!   `batch - 1` per gateway, key and period: a check asks for a batch only where the grant
//!   has a place in the lease map ([`RedisConfig::lease_keys`]) and no other check of the key
//!   is asking for one, so no granted batch is declined or overwritten. A check dropped before
//!   its answer loses the batch it asked for (Redis deducted it); its key asks again only a
//!   period later, so such checks lose at most one batch more per key and period.
//! - **Hot keys** ([`RedisConfig::hot_keys`], off by default): a key split into `n`
//!   sub-counters on `n` evenly spread cluster slots, each with `1/n` of its quota, one
//!   picked per check; for every key, or adaptively for keys over a rate ([`HotKeys`]). An
//!   adaptive split is written next to the key in Redis, where every gateway's next check of
//!   the key reads it: no side channel to lose. Across promotion, renewal and demotion a split
//!   key admits at most `burst + ⌈rate × t⌉ + n - 1` in any interval of length `t`.
//!
//! BENCHMARKS.md measures each against plain Redis: calls per check, throughput, admitted
//! against the quota.
//!
//! ```no_run
//! use ratewarden_core::{Key, Quota, Store};
//! use ratewarden_redis::RedisStore;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let decision = store.check(&Key::from("user-42"), &Quota::per_second(10)?, 1).await?;
//! println!("allowed: {}", decision.is_allowed());
//! # Ok(()) }
//! ```
//!
//! Redis Cluster: [`RedisConfig::cluster`].
//!
//! # TLS
//!
//! With a `tls-*` feature, `rediss://` URLs connect over TLS (rustls), for a single connection,
//! a pool and a cluster alike. A server whose certificate a default root signed needs nothing
//! more; for an internal CA, give it with `RedisConfig::tls_ca_cert`, and for mutual TLS a
//! client certificate with `RedisConfig::tls_client_cert`:
//!
//! ```no_run
//! # #[cfg(feature = "tls-rustls")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = ratewarden_redis::RedisConfig::new("rediss://redis.internal:6380")
//!     .tls_ca_cert(std::fs::read("/etc/redis/ca.crt")?)
//!     .connect()
//!     .await?;
//! assert!(store.split_keys().is_empty());
//! # Ok(()) }
//! ```
//!
//! rustls needs one crypto provider for the process: when the store is built and none is
//! installed, it installs ring's. To use another (aws-lc-rs, FIPS), install it first
//! (`CryptoProvider::install_default`).
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `tls-rustls` | no | `rediss://` through rustls, trusting the operating system's roots; `RedisConfig::tls_ca_cert`, `RedisConfig::tls_client_cert` |
//! | `tls-rustls-webpki-roots` | no | as `tls-rustls`, trusting Mozilla's roots (compiled in) instead of the operating system's |
//! | `tracing` | no | `tracing` events: a corrupt state (error), clock skew past the threshold, a replica's connection not replaced and a `maxmemory-policy` that evicts states (warnings), a policy that cannot be read (info), a part of a split not started (debug) |
//! | `metrics` | no | `ratewarden_redis_corrupt_states_total` (counter) and `ratewarden_redis_evicting_policy` (gauge: 1 when the `maxmemory-policy` last read evicts states, 0 for `noeviction`) through the `metrics` facade |

#![cfg_attr(docsrs, feature(doc_cfg))]

mod batch;
mod config;
mod connection;
mod deny_cache;
mod error;
mod eviction;
mod hot_keys;
mod lease;
mod log;
mod per_key;
mod rate_tracker;
mod script;
mod store;
mod time;

pub use config::{ConfigError, RedisConfig};
pub use eviction::{EvictionPolicy, EvictionWatch};
pub use hot_keys::{HotKeys, MAX_PARTS, MAX_SPLIT_KEYS};
#[cfg(feature = "test-util")]
pub use rate_tracker::RateTracker;
pub use store::RedisStore;

/// The [`redis`](https://docs.rs/redis) crate this store is built with, to name its types
/// (an error's source, a command for your own queries) without a second, possibly
/// mismatched, dependency on it: a `redis::RedisError` from another version is another type,
/// and a downcast to it finds nothing.
///
/// ```
/// use ratewarden_redis::redis;
///
/// let mut ping = redis::cmd("PING");
/// ping.arg("hello");
/// let source: Option<&redis::RedisError> = None;
/// # let _ = (ping, source);
/// ```
pub use redis;
