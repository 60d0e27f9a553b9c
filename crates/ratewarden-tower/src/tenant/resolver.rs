//! [`QuotaResolver`]: the application's answer to "which plan is this tenant on".

use std::error::Error;
use std::fmt;
use std::future::Future;

use ratewarden_core::Key;

use super::Plan;

/// Looks up a tenant's [`Plan`]: implemented by the application (a database, a billing
/// service, a config map), and called through a [`CachedResolver`](super::CachedResolver),
/// which bounds how often and how long it is asked.
///
/// The tenant is the [`Key`] a key extractor took from the request (a header, a JWT claim), as
/// extracted: not [scoped](Key::scoped) to any limit. A key keeps at most
/// [`MAX_KEY_LEN`](ratewarden_core::MAX_KEY_LEN) bytes, so every tenant the cache holds has a
/// bounded size, and a tenant id need not be UTF-8. Read it with [`Key::repr`]; a value longer
/// than `MAX_KEY_LEN` arrives as its digest, so pick an extractor that keeps tenant ids whole.
///
/// `Ok(None)` says the tenant is unknown (cached for a shorter time than a plan); `Err` says
/// the lookup failed (answered as configured by [`OnFailure`](super::OnFailure)).
///
/// The future is `Send`, so generic callers (a tower service) can box it, while an implementor
/// writes a plain `async fn`. A closure `Fn(&Key) -> impl Future<Output = Result<Option<Plan>,
/// ResolveError>>` implements it too.
///
/// ```
/// use ratewarden_core::KeyRepr;
/// use ratewarden_tower::{Key, Quota};
/// use ratewarden_tower::tenant::{Plan, QuotaResolver, ResolveError};
///
/// struct Billing { pro: Plan }
///
/// impl QuotaResolver for Billing {
///     async fn resolve(&self, tenant: &Key) -> Result<Option<Plan>, ResolveError> {
///         match tenant.repr() {
///             KeyRepr::Bytes(b"acme") => Ok(Some(self.pro.clone())),
///             KeyRepr::Bytes(b"down") => Err(ResolveError::new("billing unreachable")),
///             _ => Ok(None),
///         }
///     }
/// }
///
/// // The same as a closure:
/// let pro = Plan::new("pro", [("rps", Quota::per_second(100)?)])?;
/// let closure = move |tenant: &Key| {
///     let found = (tenant == &Key::from("acme")).then(|| pro.clone());
///     async move { Ok::<_, ResolveError>(found) }
/// };
/// # fn is_resolver(_: impl QuotaResolver) {}
/// # is_resolver(closure);
/// # is_resolver(Billing { pro: Plan::new("pro", [("rps", Quota::per_second(100)?)])? });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait QuotaResolver: Send + Sync + 'static {
    /// The plan of `tenant`, `Ok(None)` for an unknown tenant.
    ///
    /// # Errors
    ///
    /// A [`ResolveError`] when the lookup failed (not for an unknown tenant).
    fn resolve(
        &self,
        tenant: &Key,
    ) -> impl Future<Output = Result<Option<Plan>, ResolveError>> + Send;
}

impl<F, Fut> QuotaResolver for F
where
    F: Fn(&Key) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<Plan>, ResolveError>> + Send,
{
    fn resolve(
        &self,
        tenant: &Key,
    ) -> impl Future<Output = Result<Option<Plan>, ResolveError>> + Send {
        self(tenant)
    }
}

/// A failed lookup: the resolver's own error, kept as [`source`](Error::source).
///
/// ```
/// use ratewarden_tower::tenant::ResolveError;
/// use std::error::Error;
///
/// let err = ResolveError::new(std::io::Error::other("connection refused"));
/// assert_eq!(err.to_string(), "quota resolver failed: connection refused");
/// assert!(err.source().is_some());
/// let msg = ResolveError::new("no such table");
/// assert_eq!(msg.to_string(), "quota resolver failed: no such table");
/// ```
#[derive(Debug)]
pub struct ResolveError {
    source: Box<dyn Error + Send + Sync>,
}

impl ResolveError {
    /// A failed lookup, caused by `source` (an error, or a message).
    ///
    /// ```
    /// let err = ratewarden_tower::tenant::ResolveError::new(format!("status {}", 500));
    /// assert!(err.to_string().ends_with("status 500"));
    /// ```
    pub fn new(source: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        Self {
            source: source.into(),
        }
    }
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "quota resolver failed: {}", self.source)
    }
}

impl Error for ResolveError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.source)
    }
}
