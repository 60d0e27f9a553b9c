//! The rate-limiting middleware: [`RateLimitLayer`] -> [`RateLimit`] -> [`future::ResponseFuture`].
//!
//! For every request the service extracts a [`Key`](ratewarden_core::Key), resolves a
//! [`Quota`](ratewarden_core::Quota) and a cost, and asks its [`Store`](ratewarden_core::Store). An admitted request goes to
//! the inner service, and its response gets rate-limit headers. A denied one never reaches the
//! inner service: it is answered with `429 Too Many Requests` (or, for gRPC, `grpc-status: 8`
//! `RESOURCE_EXHAUSTED` in a `200` response, as gRPC clients expect), a `Retry-After` in whole
//! seconds, and the same headers. A rejection is a response, never an error: the service's
//! error type stays the inner one.
//!
//! The service is ready whenever the inner service is; the decision is made in `call`. Every
//! clone of a layer, and every service it makes, shares one store.
//!
//! # Example
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use ratewarden_tower::{MemoryStore, Quota, RateLimitLayer, key::Global};
//! use std::convert::Infallible;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(1)?, Global);
//! let service = ServiceBuilder::new().layer(layer).service_fn(|_: Request<()>| async {
//!     Ok::<_, Infallible>(Response::new(String::from("hello")))
//! });
//!
//! let ok = service.clone().oneshot(Request::new(())).await?;
//! assert_eq!(ok.status(), StatusCode::OK);
//! assert_eq!(ok.headers()["x-ratelimit-remaining"], "0");
//! assert_eq!(ok.headers()["ratelimit-policy"], r#""default";q=1;w=60"#);
//!
//! let limited = service.oneshot(Request::new(())).await?;
//! assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(limited.headers()["retry-after"], "60");
//! assert_eq!(limited.headers()["content-type"], "application/problem+json");
//! # Ok(()) }
//! ```
//!
//! # Headers
//!
//! [`HeaderStyle`] picks the fields (default: both):
//!
//! | style | fields |
//! |-------|--------|
//! | IETF (draft-ietf-httpapi-ratelimit-headers-10) | `RateLimit-Policy: "name";q=100;w=60`, `RateLimit: "name";r=0;t=30` |
//! | X-RateLimit | `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (UNIX time, seconds) |
//!
//! `t` is the seconds until more quota is available (the retry time on a denial, the time to a
//! full quota otherwise), rounded up. When several rate-limit layers apply to one request, the
//! strictest decision (the fewest remaining) sets the headers.

mod body;
mod cost;
mod failure;
pub mod future;
pub(crate) mod headers;
mod instances;
mod layer;
mod missing_key;
mod observe;
mod policy;
mod problem;
mod rejection;
mod service;
mod settle;
mod wait;

pub use body::ResponseBody;
pub use cost::{Cost, UnitCost};
pub use failure::FailureMode;
pub use headers::HeaderStyle;
pub use instances::Instances;
pub use layer::RateLimitLayer;
pub use missing_key::MissingKey;
pub use policy::QuotaPolicy;
pub use rejection::{DefaultRejection, DenialReason, Denied, Rejection};
pub use service::RateLimit;
pub(crate) use service::is_grpc;
pub use settle::{AtOnce, CountIf, InFlight, SettleByFrames, SettleWith, Settlement};
