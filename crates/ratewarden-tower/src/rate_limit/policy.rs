//! [`QuotaPolicy`]: which quota applies to a request.

use http::Request;
use ratewarden_core::Quota;

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
