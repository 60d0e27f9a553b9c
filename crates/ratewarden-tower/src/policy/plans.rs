//! Tenant plans in the policy layer: the limits of a tenant's [`Plan`], from the
//! application's [`QuotaResolver`] behind a [`CachedResolver`], added to the limits the rules
//! give a request.

use std::future::Future;
use std::pin::Pin;

use ratewarden_core::Key;

use crate::tenant::{CachedResolver, QuotaResolver, Resolution};

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
