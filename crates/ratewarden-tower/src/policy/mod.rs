//! Policies: several named limits per request, decided together, chosen by rules that a
//! [`PolicyHandle`] replaces whole at run time: [`PolicyLayer`] -> [`PolicyService`].
//!
//! A [`Policy`] holds [`Rule`]s in order and a default. A rule matches on route (axum's
//! matched path, or the URI path), method and headers, and gives the request its
//! [`NamedLimit`]s (a name, a key extractor by name, a quota), a cost and an [`Action`].
//! [`MatchMode`] says whether a request gets the first matching rule or all of them. An
//! [`AccessList`] of keys and IP networks lets clients through uncounted (the allow list) or
//! refuses them (the deny list, 403).
//!
//! For each request the service loads the running policy once, matches it, extracts each
//! limit's key (scoped by the limit's name, so that two limits never share a bucket) and
//! makes **one** [`check_all`](ratewarden_core::Store::check_all) call: every limit admits
//! the request and all are counted, or none is and the request gets `429` (gRPC
//! `RESOURCE_EXHAUSTED`) with `Retry-After` the longest wait.
//!
//! # Headers
//!
//! `RateLimit-Policy` and `RateLimit` carry one item per limit that applied
//! (draft-ietf-httpapi-ratelimit-headers-10): `RateLimit-Policy: "per-ip";q=100;w=60,
//! "per-user";q=10;w=1` and `RateLimit: "per-ip";r=99;t=60, "per-user";r=3;t=1`.
//! `X-RateLimit-Limit`, `-Remaining` and `-Reset` show the limit closest to exhaustion
//! ([`Decisions::binding`](ratewarden_core::Decisions::binding)).
//!
//! # Policy files
//!
//! With the `policy-file` feature, [`load_file`] reads a policy from TOML or YAML, with
//! errors that name the file, line and field; [`watch`] reloads it when it changes (written
//! in place, renamed over, or a Kubernetes ConfigMap's symlink swap).
//!
//! # Example
//!
//! ```
//! use http::{Request, Response, StatusCode};
//! use ratewarden_tower::key::Header;
//! use ratewarden_tower::policy::{NamedLimit, Policy, PolicyHandle, PolicyLayer, Rule};
//! use ratewarden_tower::{MemoryStore, Quota};
//! use std::convert::Infallible;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = Policy::new().otherwise(
//!     Rule::new()
//!         .limit(NamedLimit::new("everyone", "global", Quota::per_minute(100)?))
//!         .limit(NamedLimit::new("per-tenant", "tenant", Quota::per_minute(1)?)),
//! );
//! let handle = PolicyHandle::new(policy)?;
//! let layer = PolicyLayer::builder(MemoryStore::new(), handle.clone())
//!     .key("tenant", Header::new(http::HeaderName::from_static("x-tenant")))
//!     .build()?;
//! let service = ServiceBuilder::new().layer(layer).service_fn(|_: Request<()>| async {
//!     Ok::<_, Infallible>(Response::new(String::from("hello")))
//! });
//! let acme = || Request::builder().header("x-tenant", "acme").body(()).unwrap();
//!
//! let ok = service.clone().oneshot(acme()).await?;
//! assert_eq!(ok.status(), StatusCode::OK);
//! assert_eq!(ok.headers()["ratelimit-policy"], r#""everyone";q=100;w=60, "per-tenant";q=1;w=60"#);
//! let limited = service.clone().oneshot(acme()).await?;
//! assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(limited.headers()["retry-after"], "60");
//!
//! // A new policy applies to the next request, whole.
//! handle.store(Policy::new())?;
//! assert_eq!(service.oneshot(acme()).await?.status(), StatusCode::OK);
//! # Ok(()) }
//! ```

mod access;
mod ban;
mod definition;
mod error;
#[cfg(feature = "policy-file")]
mod file;
mod handle;
mod headers;
mod keys;
mod layer;
mod observe;
mod plans;
mod rule;
mod service;
#[cfg(feature = "policy-file")]
mod watch;

pub use access::AccessList;
pub use ban::Ban;
pub use definition::{MAX_LIMITS_PER_REQUEST, MatchMode, Policy};
pub use error::{Location, PolicyError, Problem};
#[cfg(feature = "policy-file")]
#[cfg_attr(docsrs, doc(cfg(feature = "policy-file")))]
pub use file::{LoadError, load_file, parse};
pub use handle::{PolicyHandle, Reloads};
pub use layer::{PolicyLayer, PolicyLayerBuilder};
pub use rule::{Action, NamedLimit, Rule};
pub use service::{OnStoreError, PolicyService};
#[cfg(feature = "policy-file")]
#[cfg_attr(docsrs, doc(cfg(feature = "policy-file")))]
pub use watch::{WatchGuard, watch};
