//! Quotas per tenant, from the application: a [`QuotaResolver`] says which [`Plan`] (a set of
//! named quotas) a tenant is on, and a [`CachedResolver`] in front of it answers the layers.
//!
//! The application implements [`QuotaResolver`] over its own store of plans (a database, a
//! billing service). The cache keeps answers for a TTL (a shorter one for unknown tenants),
//! holds a bounded number of tenants, makes one lookup for all the concurrent calls of a
//! tenant, bounds every wait by a timeout, and turns a failed lookup into a configured
//! [`OnFailure`] answer. A layer asks [`CachedResolver::resolve_ready`] first (a cached
//! answer, with no future) and [`CachedResolver::resolve`] when that is `None`; either way it
//! gets a [`Resolution`] to act on.
//!
//! Put a per-IP limit in front of a per-tenant one: every made-up tenant id costs one lookup.
//!
//! ```
//! use ratewarden_core::KeyRepr;
//! use ratewarden_tower::{Key, Quota};
//! use ratewarden_tower::tenant::{CachedResolver, OnFailure, Plan, QuotaResolver, ResolveError, Resolution};
//! use std::collections::HashMap;
//! use std::time::Duration;
//!
//! /// Plans by tenant id, as an application might load them.
//! struct Plans(HashMap<&'static [u8], Plan>);
//!
//! impl QuotaResolver for Plans {
//!     async fn resolve(&self, tenant: &Key) -> Result<Option<Plan>, ResolveError> {
//!         let KeyRepr::Bytes(id) = tenant.repr() else { return Ok(None) };
//!         Ok(self.0.get(id).cloned())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let free = Plan::new("free", [("per-minute", Quota::per_minute(60)?)])?;
//! let pro = Plan::new("pro", [
//!     ("per-second", Quota::per_second(50)?),
//!     ("per-hour", Quota::per_hour(100_000)?),
//! ])?;
//! let plans = Plans(HashMap::from([(&b"acme"[..], pro), (&b"hobby"[..], free.clone())]));
//!
//! let tenants = CachedResolver::builder(plans)
//!     .ttl(Duration::from_secs(30))
//!     .unknown_ttl(Duration::from_secs(5))
//!     .timeout(Duration::from_millis(200))
//!     .on_failure(OnFailure::Plan(free))
//!     .build()?;
//!
//! let acme = Key::from("acme");
//! let answer = match tenants.resolve_ready(&acme) {
//!     Some(cached) => cached,
//!     None => tenants.resolve(&acme).await,
//! };
//! let Resolution::Plan(plan) = answer else { panic!("acme is on a plan") };
//! assert_eq!(plan.name(), "pro");
//! assert_eq!(plan.limits().len(), 2);
//! assert_eq!(tenants.resolve(&Key::from("mallory")).await, Resolution::Unknown);
//! # Ok(()) }
//! ```

mod answer;
mod builder;
mod cache;
mod plan;
mod resolver;
mod unwind;

pub use answer::{OnFailure, Resolution};
pub use builder::{CacheConfigError, CachedResolverBuilder};
pub use cache::CachedResolver;
pub use plan::{Plan, PlanError, PlanLimit};
pub use resolver::{QuotaResolver, ResolveError};

#[cfg(test)]
mod tests;
