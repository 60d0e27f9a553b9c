//! [`Cost`]: how much of the quota a request uses.

use http::Request;

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
