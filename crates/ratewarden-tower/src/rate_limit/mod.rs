//! The rate-limiting middleware: [`RateLimitLayer`] -> [`RateLimit`] -> [`future::ResponseFuture`].
//!
//! For every request the service extracts a [`Key`](ratewarden_core::Key), resolves a
//! [`Quota`] and a cost, and asks its [`Store`](ratewarden_core::Store). An admitted request goes to
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
mod failure;
pub mod future;
mod layer;
mod missing_key;
mod observe;
mod response;
mod service;

use http::Request;
use ratewarden_core::Quota;

pub use body::ResponseBody;
pub use failure::FailureMode;
pub use layer::RateLimitLayer;
pub use missing_key::MissingKey;
pub use response::{DefaultRejection, DenialReason, Denied, Rejection};
pub use service::RateLimit;

/// Which rate-limit header fields responses carry.
///
/// ```
/// use ratewarden_tower::rate_limit::HeaderStyle;
/// assert_eq!(HeaderStyle::default(), HeaderStyle::Both);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
    Ietf,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    XRateLimit,
    /// Both of the above.
    #[default]
    Both,
    /// None (a rejection still carries `Retry-After`).
    None,
}

/// Which quota applies to a request: a fixed [`Quota`], or a closure
/// `Fn(&Request<B>) -> Option<Quota>` choosing by route, method or plan. `None` exempts the
/// request from this limit.
///
/// ```
/// use http::{Method, Request};
/// use ratewarden_tower::Quota;
/// use ratewarden_tower::rate_limit::QuotaPolicy;
///
/// let reads = Quota::per_second(100).unwrap();
/// let writes = Quota::per_second(10).unwrap();
/// let by_method = move |req: &Request<()>| match *req.method() {
///     Method::GET | Method::HEAD => Some(reads),
///     _ => Some(writes),
/// };
/// let post = Request::post("/").body(()).unwrap();
/// assert_eq!(by_method.quota(&post), Some(writes));
/// assert_eq!(reads.quota(&post), Some(reads));
/// ```
pub trait QuotaPolicy<B>: Clone + Send + Sync + 'static {
    /// The quota for `req`, or `None` to let it through unlimited.
    fn quota(&self, req: &Request<B>) -> Option<Quota>;
}

impl<B> QuotaPolicy<B> for Quota {
    fn quota(&self, _req: &Request<B>) -> Option<Quota> {
        Some(*self)
    }
}

impl<B, F> QuotaPolicy<B> for F
where
    F: Fn(&Request<B>) -> Option<Quota> + Clone + Send + Sync + 'static,
{
    fn quota(&self, req: &Request<B>) -> Option<Quota> {
        self(req)
    }
}

/// How much of the quota a request uses: [`UnitCost`] (1, the default) or a closure
/// `Fn(&Request<B>) -> u32`.
///
/// A cost of 0 is checked but never counted, so it is admitted however spent the key is;
/// a cost above the burst is never admitted. A cost read from the request is the client's
/// choice: clamp it to at least 1 (and to what the quota can admit).
///
/// ```
/// use http::Request;
/// use ratewarden_tower::rate_limit::{Cost, UnitCost};
///
/// let by_batch_size = |req: &Request<()>| -> u32 {
///     let asked = req.headers().get("x-batch-size").and_then(|v| v.to_str().ok()?.parse().ok());
///     asked.unwrap_or(1).clamp(1, 100) // never 0: a client must not make itself free
/// };
/// let batch = |size: &str| Request::builder().header("x-batch-size", size).body(()).unwrap();
/// assert_eq!(by_batch_size.cost(&batch("25")), 25);
/// assert_eq!(by_batch_size.cost(&batch("0")), 1);
/// assert_eq!(UnitCost.cost(&batch("25")), 1);
/// ```
pub trait Cost<B>: Clone + Send + Sync + 'static {
    /// The cost of `req`.
    fn cost(&self, req: &Request<B>) -> u32;
}

/// Every request costs 1.
///
/// ```
/// use ratewarden_tower::rate_limit::{Cost, UnitCost};
/// assert_eq!(UnitCost.cost(&http::Request::new(())), 1);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct UnitCost;

impl<B> Cost<B> for UnitCost {
    fn cost(&self, _req: &Request<B>) -> u32 {
        1
    }
}

impl<B, F> Cost<B> for F
where
    F: Fn(&Request<B>) -> u32 + Clone + Send + Sync + 'static,
{
    fn cost(&self, req: &Request<B>) -> u32 {
        self(req)
    }
}
