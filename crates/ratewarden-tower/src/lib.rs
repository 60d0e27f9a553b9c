//! Rate limiting for [tower](https://docs.rs/tower) services (axum, tonic, hyper) in one
//! `.layer()`.
//!
//! ```
//! use axum::{Router, routing::get};
//! use ratewarden_tower::{Quota, RateLimitLayer};
//!
//! # fn app() -> Result<Router, ratewarden_tower::QuotaError> {
//! // 10 requests per second per client IP, bursts of 20, counted in process.
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::per_ip(Quota::per_second(10)?.with_burst(20)?));
//! # Ok(app) }
//! // serve with `into_make_service_with_connect_info::<SocketAddr>()` so the peer IP is known
//! ```
//!
//! - [`rate_limit`]: the layer, its service and future, headers, rejections, shadow mode,
//!   per-route quotas and costs.
//! - [`policy`]: several named limits per request decided together, chosen by rules (route,
//!   method, header), with allow and deny lists, from code or a policy file that reloads.
//! - [`key`]: whose quota a request uses: peer IP, client IP behind trusted proxies, a header,
//!   a verified JWT claim, an extension, or everyone.
//! - [`tenant`]: quotas per tenant from the application: a resolver of plans behind a
//!   bounded cache with single flight, a lookup timeout and an answer for failures.
//! - [`breaker`]: a circuit breaker in front of a store; with
//!   [`FailureMode`](rate_limit::FailureMode), what each layer does while the store fails (let
//!   requests through, answer 503, or decide on a local share of the quota).
//!
//! # Pre-auth limits
//!
//! A flood of forged credentials must not be free, nor fill the store with one bucket per fake
//! identity. Put a cheap per-IP layer **outside** authentication and the per-user layer
//! inside: every request, forged or not, is charged to its IP first, before its body is read;
//! only a verified identity reaches a user's bucket.
//!
//! ```
//! use axum::{Router, routing::get};
//! use ratewarden_tower::key::{JwtClaim, PeerIp};
//! use ratewarden_tower::rate_limit::MissingKey;
//! use ratewarden_tower::{MemoryStore, Quota, RateLimitLayer};
//!
//! # fn app() -> Result<Router, Box<dyn std::error::Error>> {
//! let per_user = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(5)?, JwtClaim::hs256(b"secret")?)
//!     .name("user")
//!     .on_missing_key(MissingKey::Reject(http::StatusCode::UNAUTHORIZED));
//! let per_ip = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(50)?, PeerIp::new()).name("ip");
//! let app = Router::new()
//!     .route("/me", get(|| async { "you" }))
//!     .layer(per_user) // inner: runs second, only for requests the IP limit let through
//!     .layer(per_ip); // outer: runs first, for every request
//! # Ok(app) }
//! ```
//!
//! # Stacking layers, and `layer` versus `route_layer` in axum
//!
//! Layers run from the outside in: in `Router::new().route(..).layer(a).layer(b)`, `b` is the
//! outer one and sees every request first; `a` sees only what `b` let through. A denial by an
//! outer layer never costs an inner one anything, so put the cheap, broad limits (per IP)
//! outside and the narrow ones (per user, per route) inside. When several layers admit a
//! request, its headers show the strictest of them (the fewest remaining).
//!
//! axum's `Router::layer` wraps the router's fallback too, so every request for a path that
//! has no route passes through the limit; with `MissingKey::Reject` (the default), a request
//! without a key for an unknown path gets that rejection instead of `404`. `Router::route_layer`
//! wraps only the routes that matched: use it for limits keyed by credentials, and `layer` for
//! limits every request should pay (per IP, against scanning).
//!
//! ```
//! use axum::{Router, routing::get};
//! use ratewarden_tower::key::{JwtClaim, PeerIp};
//! use ratewarden_tower::rate_limit::MissingKey;
//! use ratewarden_tower::{MemoryStore, Quota, RateLimitLayer};
//!
//! # fn app() -> Result<Router, Box<dyn std::error::Error>> {
//! let per_user = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(5)?, JwtClaim::hs256(b"secret")?)
//!     .name("user")
//!     .on_missing_key(MissingKey::Reject(http::StatusCode::UNAUTHORIZED));
//! let app = Router::new()
//!     .route("/me", get(|| async { "you" }))
//!     .route_layer(per_user) // matched routes only: an unknown path is still 404
//!     .layer(RateLimitLayer::per_ip(Quota::per_second(50)?)); // every request, 404s included
//! # Ok(app) }
//! ```
//!
//! # Metrics
//!
//! With the `metrics` feature, through the [`metrics`](https://docs.rs/metrics) facade (install
//! any recorder, e.g. a Prometheus exporter). Every request a layer handles is counted once.
//!
//! | name | type, unit | labels | what it counts |
//! |------|------------|--------|----------------|
//! | `ratewarden_requests_total` | counter, requests | `limit` (the layer's [name](RateLimitLayer::name)), `outcome` | each request a layer handled, by `outcome`: `allowed`, `denied`, `shadow_denied` (denied, by the store or a fallback, and passed in shadow mode), `missing_key` (no key: answered by the [`MissingKey`](rate_limit::MissingKey) rule, or passed in shadow mode), `missing_key_skipped` (no key: passed uncounted by `MissingKey::Skip`, also counted without this feature by [`RateLimitLayer::skipped`]), and while the store fails: `failure_open` (passed uncounted: the open mode, or a key the closed mode allows), `failure_closed` (answered 503), `fallback_allowed`, `fallback_denied` (decided by the local fallback) |
//! | `ratewarden_store_failures_total` | counter, failed calls | `breaker` (its name), `kind` ([`StoreErrorKind::as_str`]) | each call a [`CircuitBreaker`](breaker::CircuitBreaker) saw fail, and why |
//! | `ratewarden_breaker_transitions_total` | counter, transitions | `breaker`, `to` (`closed`, `half-open`, `open`) | each change of a breaker's state |
//! | `ratewarden_breaker_state` | gauge, state | `breaker` | the breaker's state now: 0 closed, 1 half open, 2 open |
//! | `ratewarden_redis_corrupt_states_total` | counter, states | none | Redis states that could not be read, each denied once and replaced (`ratewarden-redis`) |
//!
//! # Feature flags
//!
//! | feature | default | what it adds |
//! |---------|---------|--------------|
//! | `axum` | **yes** | the peer address from axum's `ConnectInfo<SocketAddr>` (serve with `into_make_service_with_connect_info::<SocketAddr>()`) |
//! | `redis` | no | `RedisStore`, `RedisConfig` and `HotKeys` from `ratewarden-redis`: one quota for a fleet |
//! | `mesh` | no | `MeshStore`, `MeshBuilder` and `MeshMode` from `ratewarden-mesh`: one quota for a fleet without a central store (gossip over UDP) |
//! | `redis-tls-rustls` | no | `redis` over TLS (`rediss://`, `RedisConfig::tls_ca_cert` for an internal CA), trusting the system's roots |
//! | `redis-tls-rustls-webpki-roots` | no | the same, trusting Mozilla's roots, compiled in |
//! | `tonic` | no | the peer address from tonic's `TcpConnectInfo` |
//! | `jwt` | no | [`key::JwtClaim`], verifying with the crypto backend your application gives `jsonwebtoken` |
//! | `jwt-rust-crypto` | no | `jwt` with jsonwebtoken's RustCrypto backend (pure Rust) |
//! | `jwt-aws-lc-rs` | no | `jwt` with jsonwebtoken's aws-lc-rs backend (C, FIPS-capable) |
//! | `tracing` | no | `tracing` events for denials (keys as unlinkable fingerprints), missing keys and store errors |
//! | `metrics` | no | counters through the `metrics` facade (the table above) |
//! | `serde` | no | `Serialize`/`Deserialize` for [`Quota`] and [`Algorithm`] in their string forms |
//! | `policy-file` | no | [`policy::load_file`] (TOML and YAML policy files) and [`policy::watch`], which reloads one when it changes |
//! | `full` | no | all of the above but `jwt-aws-lc-rs` |
//!
//! Pick one JWT backend. If your application already uses `jsonwebtoken` with a backend, turn
//! on `jwt` alone and it verifies with yours. With two backends compiled in and none installed,
//! `jsonwebtoken` panics at its first use; building a [`JwtClaim`](key::JwtClaim) then installs
//! the backend of this crate's feature as the process default (RustCrypto if both), and
//! without any backend it returns an error: never a panic at a request.
//!
//! MSRV: Rust 1.89.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod key;
pub mod policy;
pub mod rate_limit;
pub mod tenant;

pub use rate_limit::{RateLimit, RateLimitLayer};
/// The circuit breaker in front of a store (the `ratewarden-breaker` crate).
pub use ratewarden_breaker as breaker;
pub use ratewarden_core::{
    Algorithm, Clock, Decision, Info, Key, ManualClock, MonotonicClock, ParseQuotaError, Quota,
    QuotaError, Store, StoreError, StoreErrorKind, Timestamp,
};
pub use ratewarden_memory::{MemoryStore, MemoryStoreBuilder};
#[cfg(feature = "mesh")]
#[cfg_attr(docsrs, doc(cfg(feature = "mesh")))]
pub use ratewarden_mesh::{MeshBuilder, MeshStore, Mode as MeshMode};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use ratewarden_redis::{ConfigError as RedisConfigError, HotKeys, RedisConfig, RedisStore};

/// The `ipnet` crate this one takes trusted proxy networks from
/// ([`ClientIp::trust`](key::ClientIp::trust)), so that no second version is needed to name them.
///
/// ```
/// let network: ratewarden_tower::ipnet::IpNet = "10.0.0.0/8".parse().unwrap();
/// use ratewarden_tower::key::{ClientIp, ForwardedHeader};
/// let client_ip = ClientIp::new(ForwardedHeader::XForwardedFor).trust(network);
/// # let _ = client_ip;
/// ```
pub use ipnet;
/// The `jsonwebtoken` crate [`JwtClaim`](key::JwtClaim) verifies with: its key, validation and
/// error types.
#[cfg(feature = "jwt")]
#[cfg_attr(docsrs, doc(cfg(feature = "jwt")))]
pub use jsonwebtoken;
