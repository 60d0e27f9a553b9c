//! [`RateLimitLayer`]: the layer and its builder methods.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ratewarden_core::Quota;
use tower_layer::Layer;

use super::rejection::DefaultRejection;
use super::service::{Config, RateLimit, Shared};
use super::{
    AtOnce, CountIf, FailureMode, HeaderStyle, InFlight, MissingKey, SettleByFrames, SettleWith,
    UnitCost,
};

/// Applies a rate limit to every request of the services it wraps; see the
/// [module docs](super) for an example and the headers.
///
/// `K` extracts the key ([`key`](crate::key)), `St` is the [`Store`](ratewarden_core::Store), `P` the
/// [`QuotaPolicy`](super::QuotaPolicy) (a fixed [`Quota`] by default), `C` the [`Cost`](super::Cost) and `R` the
/// [`Rejection`](super::Rejection). Cheap to clone: every clone, and every service made from
/// it, shares one store and counts in the same buckets.
///
/// ```
/// use http::{Method, Request, StatusCode};
/// use ratewarden_tower::rate_limit::{FailureMode, HeaderStyle, MissingKey};
/// use ratewarden_tower::{key::PeerIp, MemoryStore, Quota, RateLimitLayer};
/// use std::convert::Infallible;
/// use tower::{Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let writes = Quota::per_minute(10)?;
/// let layer = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(100)?, PeerIp::new())
///     .name("api")
///     .quota_by(move |req: &Request<()>| match *req.method() {
///         Method::GET => Some(Quota::per_minute(100).ok()?),
///         _ => Some(writes),
///     })
///     .cost_by(|req: &Request<()>| if req.uri().path() == "/export" { 10 } else { 1 })
///     .headers(HeaderStyle::Ietf)
///     .headers_on_allowed(true)
///     .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
///     .on_store_error(FailureMode::closed())
///     .shadow(false);
/// let service = layer.layer(tower::service_fn(|_: Request<()>| async {
///     Ok::<_, Infallible>(http::Response::new(String::new()))
/// }));
/// let export = |peer: &str| {
///     let mut req = Request::post("/export").body(()).unwrap();
///     req.extensions_mut().insert(peer.parse::<std::net::SocketAddr>().unwrap());
///     req
/// };
/// // An export costs all 10 writes a minute allows: the second is refused.
/// let first = service.clone().oneshot(export("192.0.2.1:1")).await?;
/// assert_eq!(first.headers()["ratelimit"], r#""api";r=0;t=60"#);
/// let second = service.clone().oneshot(export("192.0.2.1:1")).await?;
/// assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
/// // Without a peer address there is no key: the chosen answer.
/// let keyless = service.oneshot(Request::new(())).await?;
/// assert_eq!(keyless.status(), StatusCode::UNAUTHORIZED);
/// # Ok(()) }
/// ```
///
/// Several layers may share one store (one Redis for every limit, say) as long as each has
/// its own [`name`](Self::name): the name scopes the layer's keys, so the `login` and `search`
/// limits of one client are different buckets. Two *unnamed* layers on one store are both
/// `default` and count in the same buckets.
#[derive(Clone)]
#[must_use]
pub struct RateLimitLayer<K, St, P = Quota, C = UnitCost, R = DefaultRejection, M = AtOnce> {
    key: K,
    store: Arc<St>,
    policy: P,
    cost: C,
    reject: R,
    settle: M,
    config: Config,
    skipped: Arc<AtomicU64>,
}

impl<K, St> RateLimitLayer<K, St> {
    /// Limits each key (from `key`) to `quota`, counting in `store`.
    ///
    /// See the example on [`RateLimitLayer`].
    pub fn new(store: St, quota: Quota, key: K) -> Self {
        Self {
            key,
            store: Arc::new(store),
            policy: quota,
            cost: UnitCost,
            reject: DefaultRejection,
            settle: AtOnce,
            config: Config::default(),
            skipped: Arc::default(),
        }
    }
}

impl<K, St> RateLimitLayer<K, St, Quota, UnitCost, DefaultRejection, InFlight> {
    /// Limits each key (from `key`) to `max` requests in progress at once, counting in
    /// `store`: a request holds a place from when it is admitted until its response body
    /// ends or is dropped (a cancelled request, a handler that panics: at once). Stripe's
    /// second limiter, keyed like the rate limits.
    ///
    /// A request refused for want of a place is answered like a rate-limited one (429, or
    /// gRPC `RESOURCE_EXHAUSTED`) with `Retry-After: 1`. No IETF field describes a
    /// concurrency limit, so by default it carries no rate-limit fields
    /// ([`HeaderStyle::None`]); with [`headers`](Self::headers), the fields show the limit
    /// as `max` per one-second window and the places free as its remaining.
    ///
    /// A place not given back (a gateway that crashed while a request ran on a shared
    /// store) is free again after [`hold`](Self::hold) (default 60 s); a request that runs
    /// longer renews its place while it runs and while its body is read (from half the hold
    /// on, every quarter of it). When the store fails, the failure mode decides: the default fallback
    /// then limits a key to `max` requests a second on each instance, not in flight.
    /// In-flight states are apart from the rate limits', whatever the layers' names.
    ///
    /// # Errors
    ///
    /// A [`QuotaError`](ratewarden_core::QuotaError) when `max` is 0.
    ///
    /// See [`InFlight`](super::InFlight) for an example.
    pub fn in_flight(store: St, max: u32, key: K) -> Result<Self, ratewarden_core::QuotaError> {
        let places = Quota::new(max, Duration::from_secs(1))?;
        let mut layer = RateLimitLayer::new(store, places, key).settle_by(InFlight);
        layer.config.style = HeaderStyle::None;
        Ok(layer)
    }
}

impl RateLimitLayer<crate::key::PeerIp, ratewarden_memory::MemoryStore> {
    /// Limits each client IP address (the connection's peer; IPv6 by /64) to `quota`, in a
    /// new in-process [`MemoryStore`](ratewarden_memory::MemoryStore).
    ///
    /// See the example on [`RateLimitLayer`].
    pub fn per_ip(quota: Quota) -> Self {
        Self::new(
            ratewarden_memory::MemoryStore::new(),
            quota,
            crate::key::PeerIp::new(),
        )
    }
}

impl<K, St, P, C, R, M> RateLimitLayer<K, St, P, C, R, M> {
    /// Chooses the quota per request (route, method, plan): a closure
    /// `Fn(&Request<B>) -> Option<Quota>`, `None` exempting the request.
    ///
    /// See the example on [`RateLimitLayer`].
    pub fn quota_by<P2>(self, policy: P2) -> RateLimitLayer<K, St, P2, C, R, M> {
        RateLimitLayer {
            key: self.key,
            store: self.store,
            policy,
            cost: self.cost,
            reject: self.reject,
            settle: self.settle,
            config: self.config,
            skipped: self.skipped,
        }
    }

    /// Sets each request's cost: a closure `Fn(&Request<B>) -> u32` (default 1).
    ///
    /// See the example on [`RateLimitLayer`].
    pub fn cost_by<C2>(self, cost: C2) -> RateLimitLayer<K, St, P, C2, R, M> {
        RateLimitLayer {
            key: self.key,
            store: self.store,
            policy: self.policy,
            cost,
            reject: self.reject,
            settle: self.settle,
            config: self.config,
            skipped: self.skipped,
        }
    }

    /// Answers denials with `reject` instead of the default `problem+json` 429.
    ///
    /// See the example on [`RateLimitLayer`].
    pub fn reject_with<R2>(self, reject: R2) -> RateLimitLayer<K, St, P, C, R2, M> {
        RateLimitLayer {
            key: self.key,
            store: self.store,
            policy: self.policy,
            cost: self.cost,
            reject,
            settle: self.settle,
            config: self.config,
            skipped: self.skipped,
        }
    }

    /// Counts a request's cost only when `count(&response)` is `true` (failed logins only):
    /// the cost is held while the request runs, so concurrent attempts never pass the quota,
    /// and settled from the response's head. A request never counted is still refused once
    /// the quota is spent: `3/min` of failures, and the attempt after the third failure is
    /// refused, whatever it would have answered. See [`Settlement`](super::Settlement).
    ///
    /// ```
    /// use http::{Response, StatusCode};
    /// use ratewarden_tower::{key::PeerIp, MemoryStore, Quota, RateLimitLayer};
    /// let failed_logins = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(3)?, PeerIp::new())
    ///     .name("login-failures")
    ///     .count_if(|response: &Response<axum::body::Body>| response.status() == StatusCode::UNAUTHORIZED);
    /// # Ok::<(), ratewarden_tower::QuotaError>(())
    /// ```
    pub fn count_if<F>(self, count: F) -> RateLimitLayer<K, St, P, C, R, CountIf<F>> {
        self.settle_by(CountIf(count))
    }

    /// Charges the units `actual(&response)` reports, read from the response's head; the
    /// request's [cost](Self::cost_by) is its estimate, held while it runs. See
    /// [`Settlement`](super::Settlement) for what a settle above the estimate does.
    ///
    /// See [`SettleWith`](super::SettleWith) for an example.
    pub fn settle_with<F>(self, actual: F) -> RateLimitLayer<K, St, P, C, R, SettleWith<F>> {
        self.settle_by(SettleWith(actual))
    }

    /// Charges the units counted over the response's body: `per_frame` for each frame (data
    /// or trailers), summed, settled when the body ends or is dropped (with what it counted).
    /// The request's [cost](Self::cost_by) is its estimate, held while it runs.
    ///
    /// See [`SettleByFrames`](super::SettleByFrames) for an example.
    pub fn settle_by_frames<F>(
        self,
        per_frame: F,
    ) -> RateLimitLayer<K, St, P, C, R, SettleByFrames<F>> {
        self.settle_by(SettleByFrames(Arc::new(per_frame)))
    }

    fn settle_by<M2>(self, settle: M2) -> RateLimitLayer<K, St, P, C, R, M2> {
        RateLimitLayer {
            key: self.key,
            store: self.store,
            policy: self.policy,
            cost: self.cost,
            reject: self.reject,
            settle,
            config: self.config,
            skipped: self.skipped,
        }
    }

    /// How long a held request's units stay held if it is never settled (default 60 s): a
    /// gateway that crashed, a task that never ran. Cut to between 10 ms and 24 hours.
    ///
    /// A request still running at half its hold renews its holds on a task of its own (at
    /// once, then every quarter of the hold, so one failed renewal is retried before they run
    /// out), while its handler runs and while its body is read, until the body ends or is
    /// dropped; a body never read after a fast handler keeps them for the hold alone. The
    /// renewal and [`wait`](Self::wait) need a tokio runtime with its timer (`enable_time`, as
    /// `tokio::main` and every server builds); outside a runtime nothing is renewed.
    ///
    /// ```
    /// use ratewarden_tower::{key::Global, MemoryStore, Quota, RateLimitLayer};
    /// use std::time::Duration;
    /// let layer = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(100)?, Global)
    ///     .settle_with(|_: &http::Response<String>| 1)
    ///     .hold(Duration::from_secs(300));
    /// # Ok::<(), ratewarden_tower::QuotaError>(())
    /// ```
    pub fn hold(mut self, hold: Duration) -> Self {
        self.config.hold = hold.clamp(super::settle::MIN_HOLD, super::settle::MAX_HOLD);
        self
    }

    /// Lets a request slightly over its rate wait for its turn, up to `max_delay`, instead of
    /// being refused: one that conforms to its quota within `max_delay` is admitted at once,
    /// its units taken then, and goes on to the inner service when it conforms; one that
    /// would wait longer is refused at once, with `Retry-After`. Requests go on at the
    /// quota's pace, never faster (at most `burst + t / interval` units in any interval `t`).
    ///
    /// For GCRA and the token bucket (the windows have no pace to wait for: their requests
    /// are decided as without waiting). At most `max_delay / interval` units of a key wait at
    /// once (`interval = period / count`): 10 per second with a wait of 500 ms lets 5 wait;
    /// beyond them, requests are refused at once and hold no memory. A request dropped while
    /// it waits gives its units back ([`Store::give_back`](ratewarden_core::Store::give_back),
    /// less what time has already given back; a store that cannot, Redis for now, keeps them
    /// spent; and a request counted after it keeps its turn, so the units are given back
    /// only when nothing was counted since). Waiting requests count in a state apart from
    /// the quota's without waiting (its burst widened by what may wait). A cost of 0 never
    /// waits; a shadow layer never holds a request back; held requests
    /// ([`count_if`](Self::count_if), [`settle_with`](Self::settle_with),
    /// [`settle_by_frames`](Self::settle_by_frames), [`in_flight`](Self::in_flight)) do not
    /// wait.
    ///
    /// ```
    /// use ratewarden_tower::{key::PeerIp, MemoryStore, Quota, RateLimitLayer};
    /// use std::time::Duration;
    /// let smooth = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(10)?, PeerIp::new())
    ///     .wait(Duration::from_millis(500));
    /// # Ok::<(), ratewarden_tower::QuotaError>(())
    /// ```
    pub fn wait(mut self, max_delay: Duration) -> Self {
        self.config.wait = Some(max_delay).filter(|d| !d.is_zero());
        self
    }

    /// Names the limit in the `RateLimit-Policy` and `RateLimit` fields, metrics and logs
    /// (default `default`), and scopes its keys in the store ([`Key::scoped`](ratewarden_core::Key::scoped)):
    /// layers with different names never share a bucket, even on one store; gateways of a
    /// fleet that give a limit the same name share its buckets through a shared store.
    ///
    /// Any string is a name, so this cannot fail. The buckets are scoped by the name exactly
    /// as given; where it is shown (headers, metric labels, logs), every byte other than an
    /// ASCII letter, digit, `-`, `_`, `.` or `:` is shown as `_` and the name is cut to 64
    /// bytes, so that it always fits a `RateLimit-Policy` field. An empty name is `default`.
    ///
    /// ```
    /// use ratewarden_tower::{key::Global, MemoryStore, Quota, RateLimitLayer};
    /// let search = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(50)?, Global).name("search");
    /// let shown = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(50)?, Global).name("my search");
    /// assert_eq!(search.policy_name(), "search");
    /// assert_eq!(shown.policy_name(), "my_search"); // its own buckets, shown with a `_`
    /// # Ok::<(), ratewarden_tower::QuotaError>(())
    /// ```
    pub fn name(mut self, name: &str) -> Self {
        // Another limit: its own count of skipped requests.
        self.skipped = Arc::default();
        if name.is_empty() || name == "default" {
            self.config.name = Arc::from("default");
            self.config.scope = 0;
            return self;
        }
        let shown: String = name
            .bytes()
            .take(64)
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.:".contains(&b) {
                    char::from(b)
                } else {
                    '_'
                }
            })
            .collect();
        self.config.name = Arc::from(shown);
        self.config.scope = ratewarden_core::Key::scope_of(name);
        self
    }

    /// The name shown in headers, metrics and logs (see [`name`](Self::name)).
    ///
    /// ```
    /// use ratewarden_tower::{key::Global, MemoryStore, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(50)?, Global);
    /// assert_eq!(layer.policy_name(), "default");
    /// # Ok::<(), ratewarden_tower::QuotaError>(())
    /// ```
    #[must_use]
    pub fn policy_name(&self) -> &str {
        &self.config.name
    }

    /// Which rate-limit header fields to send (default [`HeaderStyle::Both`]).
    ///
    /// See the example on [`RateLimitLayer`].
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.config.style = style;
        self
    }

    /// Whether admitted responses carry the rate-limit headers too (default `true`).
    ///
    /// See the example on [`RateLimitLayer`].
    pub fn headers_on_allowed(mut self, on: bool) -> Self {
        self.config.headers_on_allowed = on;
        self
    }

    /// What to do with requests that have no key (default: reject with 400). Requests that
    /// [`MissingKey::Skip`] lets through are counted by [`skipped`](Self::skipped).
    ///
    /// See the example on [`RateLimitLayer`].
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.config.missing_key = missing;
        self
    }

    /// What to do when the store cannot decide (default: a local limit per instance, see
    /// [`FailureMode`]).
    ///
    /// See the example on [`RateLimitLayer`].
    pub fn on_store_error(mut self, mode: FailureMode) -> Self {
        self.config.failure = mode;
        self
    }

    /// Shadow mode: decide, count, log and send headers, but never reject (default off). For
    /// trying a limit on production traffic before enforcing it. Requests without a key and
    /// requests a closed failure mode would refuse pass too, counted as `missing_key` (or
    /// `missing_key_skipped` under [`MissingKey::Skip`]) and `failure_closed`.
    ///
    /// See the example on [`RateLimitLayer`].
    pub fn shadow(mut self, on: bool) -> Self {
        self.config.shadow = on;
        self
    }

    /// Whether CORS preflights (`OPTIONS` with `Access-Control-Request-Method`) pass to the
    /// inner service without being counted (default `false`: counted like any request).
    ///
    /// Anyone can send a request shaped like a preflight, and many services run their
    /// handler for it (tonic routes on the path alone, `any()` routes and proxies take every
    /// method): exempted, such requests are unlimited. Turn this on only when the inner
    /// service answers every preflight itself, without a handler, such as a CORS layer
    /// inside this one; or, simpler, put the CORS layer outside this one, where preflights
    /// never reach the limit.
    ///
    /// See the example on [`RateLimitLayer`].
    pub fn exempt_preflight(mut self, on: bool) -> Self {
        self.config.exempt_preflight = on;
        self
    }

    /// How many requests [`MissingKey::Skip`] let through uncounted because they had no key,
    /// counted by this layer, its clones and every service they made (a clone given another
    /// [`name`](Self::name) counts its own), whatever the crate's features. Requests that had a key, keyless requests that were answered, and
    /// requests exempted by [`quota_by`](Self::quota_by) or
    /// [`exempt_preflight`](Self::exempt_preflight) are not counted.
    ///
    /// A count that grows with the traffic usually means that the server does not give the
    /// key: served without connect info, every request has no peer address for
    /// [`PeerIp`](crate::key::PeerIp), so under `Skip` none is limited. Keep a clone of the
    /// layer to read it, or poll it into your own metrics. With the `metrics` feature these
    /// requests are also counted as `ratewarden_requests_total{outcome="missing_key_skipped"}`
    /// and, with `tracing`, the first is logged at warn level.
    ///
    /// ```
    /// use http::{Request, Response};
    /// use ratewarden_tower::rate_limit::MissingKey;
    /// use ratewarden_tower::{key::PeerIp, MemoryStore, Quota, RateLimitLayer};
    /// use std::convert::Infallible;
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(1)?, PeerIp::new())
    ///     .on_missing_key(MissingKey::Skip);
    /// let service = layer.layer(tower::service_fn(|_: Request<()>| async {
    ///     Ok::<_, Infallible>(Response::new(String::new()))
    /// }));
    /// // No peer address in the extensions (no connect info): no key, skipped.
    /// for _ in 0..3 {
    ///     service.clone().oneshot(Request::new(())).await?;
    /// }
    /// assert_eq!(layer.skipped(), 3);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// The store this layer counts in.
    ///
    /// ```
    /// use ratewarden_tower::{key::Global, MemoryStore, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(50)?, Global);
    /// assert!(layer.store().is_empty());
    /// # Ok::<(), ratewarden_tower::QuotaError>(())
    /// ```
    pub fn store(&self) -> &St {
        &self.store
    }
}

impl<S, K, St, P, C, R, M> Layer<S> for RateLimitLayer<K, St, P, C, R, M>
where
    K: Clone,
    P: Clone,
    C: Clone,
    R: Clone,
    M: Clone,
{
    type Service = RateLimit<S, K, St, P, C, R, M>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(
            inner,
            Arc::new(Shared {
                key: self.key.clone(),
                store: Arc::clone(&self.store),
                policy: self.policy.clone(),
                cost: self.cost.clone(),
                reject: self.reject.clone(),
                settle: self.settle.clone(),
                config: self.config.clone(),
                first_policy: OnceLock::new(),
                missing_key_answer: OnceLock::new(),
                allowed: OnceLock::new(),
                counters: super::observe::Counters::new(&self.config.name),
                skipped: Arc::clone(&self.skipped),
            }),
        )
    }
}

impl<K: fmt::Debug, St, P: fmt::Debug, C, R, M> fmt::Debug for RateLimitLayer<K, St, P, C, R, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("key", &self.key)
            .field("policy", &self.policy)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
