//! Tenant plans in the policy layer: the limits of a tenant's [`Plan`], from the
//! application's [`QuotaResolver`] behind a [`CachedResolver`], added to the limits the rules
//! give a request.

use std::future::Future;
use std::pin::Pin;

use ratewarden_core::{Key, Limit, MAX_LIMITS};
use smallvec::SmallVec;

use super::headers::{Applied, AppliedLimits, Checks};
use super::rule::NamedLimit;
use crate::tenant::{CachedResolver, Plan, QuotaResolver, Resolution};

/// The limits of one request: the common one or two kept inline, with no allocation.
pub(crate) type RequestLimits = SmallVec<[Limit; 2]>;

/// Where the layer finds a tenant's plan, whatever the resolver's type.
pub(crate) trait PlanSource: Send + Sync + 'static {
    /// The name of the key extractor that keys tenants.
    fn key(&self) -> &str;
    /// The tenant's plan, when the cache holds an answer.
    fn ready(&self, tenant: &Key) -> Option<Resolution>;
    /// The tenant's plan, looked up when the cache holds none.
    fn resolve(&self, tenant: Key) -> Pin<Box<dyn Future<Output = Resolution> + Send>>;
}

/// A [`CachedResolver`] keyed by the extractor named `key`.
pub(crate) struct Plans<R> {
    pub(crate) key: String,
    pub(crate) cache: CachedResolver<R>,
}

impl<R: QuotaResolver> PlanSource for Plans<R> {
    fn key(&self) -> &str {
        &self.key
    }

    fn ready(&self, tenant: &Key) -> Option<Resolution> {
        self.cache.resolve_ready(tenant)
    }

    fn resolve(&self, tenant: Key) -> Pin<Box<dyn Future<Output = Resolution> + Send>> {
        let cache = self.cache.clone();
        Box::pin(async move { cache.resolve(&tenant).await })
    }
}

/// The limits of a tenant's plan, added to a request's: each counts `cost` on the tenant's
/// key, under the plan limit's name. `Err` when they would take the request past
/// [`MAX_LIMITS`], which counts as a lookup that failed.
pub(crate) fn add(
    plan: &Plan,
    (tenant, key_name): (&Key, &str),
    cost: u32,
    limits: &mut RequestLimits,
    applied: &mut AppliedLimits,
) -> Result<(), ()> {
    if limits.len() + plan.limits().len() > MAX_LIMITS {
        return Err(());
    }
    for limit in plan.limits() {
        let shown = NamedLimit::new(limit.name(), key_name, *limit.quota()).shown();
        applied.push(Applied {
            limit: shown,
            checks: Checks::one(limits.len()),
        });
        limits.push(Limit::new(
            tenant.clone().scoped(limit.scope()),
            *limit.quota(),
            cost,
        ));
    }
    Ok(())
}
