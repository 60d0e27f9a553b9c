//! [`RateLimit`]: the service, and how one request is decided.

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use ratewarden_core::{Decision, Key, Limit, Quota, Reservation, Store, StoreError};
use tower_service::Service;

use super::body::ResponseBody;
use super::failure::{Failed, Owed};
use super::future::{Headers, ResponseFuture};
use super::headers::PolicyHeaders;
use super::observe::{self, Event};
use super::problem;
use super::rejection::{self, DenialReason, Denied};
use super::settle::Settling;
use super::{Cost, FailureMode, HeaderStyle, MissingKey, QuotaPolicy, Rejection, Settlement};
use crate::key::KeyExtractor;

/// The layer's settings that are not type parameters.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) name: Arc<str>,
    /// The scope of this limit's keys: 0 for the default name, else from the name.
    pub(crate) scope: u64,
    pub(crate) style: HeaderStyle,
    pub(crate) headers_on_allowed: bool,
    pub(crate) missing_key: MissingKey,
    pub(crate) failure: FailureMode,
    pub(crate) shadow: bool,
    pub(crate) exempt_preflight: bool,
    /// How long a held request's units stay held unsettled.
    pub(crate) hold: Duration,
    /// How long a request may wait for its turn instead of being refused (rate algorithms).
    pub(crate) wait: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            name: Arc::from("default"),
            scope: 0,
            style: HeaderStyle::default(),
            headers_on_allowed: true,
            missing_key: MissingKey::default(),
            failure: FailureMode::default(),
            shadow: false,
            exempt_preflight: false,
            hold: Duration::from_secs(60),
            wait: None,
        }
    }
}

/// Everything the services made by one `layer` call share.
pub(crate) struct Shared<K, St, P, C, R, M> {
    pub(crate) key: K,
    pub(crate) store: Arc<St>,
    pub(crate) policy: P,
    pub(crate) cost: C,
    pub(crate) reject: R,
    pub(crate) settle: M,
    pub(crate) config: Config,
    /// The headers of the first quota this limit applied, formatted once: a fixed quota's,
    /// or the commonest of a policy's (others are formatted per request).
    pub(crate) first_policy: OnceLock<Arc<PolicyHeaders>>,
    /// The answer to a request without a key, made once (`None`: let it through).
    pub(crate) missing_key_answer: OnceLock<Option<Response<Bytes>>>,
    /// The failure mode's allowed keys as the extractor keys clients, made at the first
    /// failure.
    pub(crate) allowed: OnceLock<HashSet<Key>>,
    /// The request counters of this limit (with the `metrics` feature).
    pub(crate) counters: observe::Counters,
    /// Requests `MissingKey::Skip` let through, shared with the layer and its clones
    /// ([`RateLimitLayer::skipped`](super::RateLimitLayer::skipped)), whatever the features.
    pub(crate) skipped: Arc<AtomicU64>,
}

/// What the layer does with a request once the store has decided.
pub(crate) enum Outcome {
    /// Call the inner service; add these headers to its response.
    Allow(Option<(Arc<PolicyHeaders>, ratewarden_core::Info)>),
    /// Answer with this response; the inner service is not called.
    Reject(Response<Bytes>),
}

impl<K, St, P, C, R: Rejection, M> Shared<K, St, P, C, R, M> {
    fn policy_headers(&self, quota: Quota) -> Arc<PolicyHeaders> {
        let format = || Arc::new(PolicyHeaders::new(&self.config.name, quota));
        let first = self.first_policy.get_or_init(format);
        if first.quota == quota {
            Arc::clone(first)
        } else {
            format()
        }
    }

    /// Turns the store's answer to a check of `cost` that carried `owed` (see
    /// [`FailureMode::carried`](super::FailureMode)) into what to do with `req`.
    pub(crate) fn outcome<B>(
        &self,
        result: Result<Decision, StoreError>,
        key: &Key,
        quota: Quota,
        (cost, owed): (u32, Owed),
        req: &Request<B>,
    ) -> Outcome
    where
        K: KeyExtractor<B>,
    {
        let failure = &self.config.failure;
        failure.decided(key, &quota, (cost, owed), result.as_ref().ok());
        match result {
            Ok(decision) => self.decided(decision, key, quota, req, false),
            Err(error) => self.store_failed(&error, key, quota, cost, req),
        }
    }

    /// What to do with a request `decision` decided: by the store, or by the failure mode's
    /// fallback store (`fallback`), counted under outcomes of its own. Whether `req` is a
    /// gRPC call is looked at only when it is refused.
    fn decided<B>(
        &self,
        decision: Decision,
        key: &Key,
        quota: Quota,
        req: &Request<B>,
        fallback: bool,
    ) -> Outcome {
        let config = &self.config;
        let (info, reason) = match decision {
            Decision::Allowed(info) => {
                let event = if fallback {
                    Event::FallbackAllowed
                } else {
                    Event::Allowed
                };
                self.counters.count(event);
                let headers = config
                    .headers_on_allowed
                    .then(|| (self.policy_headers(quota), info));
                return Outcome::Allow(headers);
            }
            Decision::Denied(info) => (info, DenialReason::RateLimited),
            Decision::InsufficientCapacity(info) => (info, DenialReason::InsufficientCapacity),
        };
        #[cfg(feature = "tracing")]
        tracing::debug!(
            limit = %config.name,
            key = observe::fingerprint(key),
            shadow = config.shadow,
            retry_after_ms = info.retry_after().as_millis() as u64,
            ?reason,
            "rate limit exceeded"
        );
        #[cfg(not(feature = "tracing"))]
        let _ = key;
        let headers = self.policy_headers(quota);
        if config.shadow {
            self.counters.count(Event::ShadowDenied);
            return Outcome::Allow(Some((headers, info)));
        }
        let event = if fallback {
            Event::FallbackDenied
        } else {
            Event::Denied
        };
        self.counters.count(event);
        let denied = Denied {
            info,
            quota,
            name: Arc::clone(&config.name),
            reason,
            grpc: is_grpc(req),
        };
        let rejection = self.reject.response(&denied);
        Outcome::Reject(rejection::finish_rejection(
            rejection,
            &denied,
            &headers,
            self.config.style,
        ))
    }

    fn store_failed<B>(
        &self,
        error: &StoreError,
        key: &Key,
        quota: Quota,
        cost: u32,
        req: &Request<B>,
    ) -> Outcome
    where
        K: KeyExtractor<B>,
    {
        // Counted once, by what the failure mode made of it (the store's own failures are
        // counted, by kind, by the circuit breaker). Per request at debug only: a down store fails every request, and the circuit breaker
        // logs its transitions once each.
        #[cfg(feature = "tracing")]
        tracing::debug!(limit = %self.config.name, %error, mode = ?self.config.failure, "rate-limit store failed");
        #[cfg(not(feature = "tracing"))]
        let _ = error;
        let failure = &self.config.failure;
        let allowed = self.allowed.get_or_init(|| {
            failure.allowed_as(|allowed| KeyExtractor::<B>::key_for(&self.key, allowed))
        });
        match failure.on_failure(key, &quota, cost, allowed) {
            Failed::Pass => {
                self.counters.count(Event::FailureOpen);
                Outcome::Allow(None)
            }
            Failed::Decided(decision, share) => self.decided(decision, key, share, req, true),
            Failed::Unavailable => {
                self.counters.count(Event::FailureClosed);
                if self.config.shadow {
                    return Outcome::Allow(None);
                }
                Outcome::Reject(problem::unavailable(is_grpc(req)))
            }
        }
    }

    /// The answer to a request without a key, or `None` to let it through uncounted (also in
    /// shadow mode, which never rejects).
    fn missing_key<B>(&self, req: &Request<B>) -> Option<Response<Bytes>>
    where
        K: KeyExtractor<B>,
    {
        #[cfg(feature = "tracing")]
        tracing::debug!(limit = %self.config.name, "request has no rate-limit key");
        let skip = matches!(self.config.missing_key, MissingKey::Skip);
        if skip && !self.key.has_unusable_key(req) {
            self.skip();
            return None;
        }
        self.counters.count(Event::MissingKey);
        if self.config.shadow {
            return None;
        }
        let grpc = is_grpc(req);
        if skip {
            // A key sent twice is refused, never skipped: 401 for a credential.
            let challenge = self.key.challenge();
            let status = if challenge.is_some() {
                StatusCode::UNAUTHORIZED
            } else {
                StatusCode::BAD_REQUEST
            };
            return MissingKey::Reject(status).answer(grpc, challenge);
        }
        if grpc || matches!(self.config.missing_key, MissingKey::Respond(_)) {
            // A responder runs for each request, as it would answer it; gRPC answers are rare
            // enough to make each time. The rest are made once.
            return self.config.missing_key.answer(grpc, self.key.challenge());
        }
        self.missing_key_answer
            .get_or_init(|| self.config.missing_key.answer(false, self.key.challenge()))
            .as_ref()
            .map(clone_response)
    }
}

impl<K, St, P, C, R, M> Shared<K, St, P, C, R, M> {
    /// Counts a request `MissingKey::Skip` lets through uncounted, whatever the features: a
    /// server that gives no peer address skips every request, a deployment mistake that
    /// default features would otherwise never show. With `tracing`, the first is logged at
    /// warn level (once for a layer and its clones).
    fn skip(&self) {
        self.counters.count(Event::MissingKeySkipped);
        let before = self.skipped.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "tracing")]
        if before == 0 {
            tracing::warn!(
                limit = %self.config.name,
                "a request without a rate-limit key passed uncounted (`MissingKey::Skip`); \
                 `RateLimitLayer::skipped` counts them, and if every request is skipped, the \
                 server may not give the key (for `PeerIp`: serve with connect info)"
            );
        }
        #[cfg(not(feature = "tracing"))]
        let _ = before;
    }
}

/// A copy of a made-once response (the body is reference-counted).
fn clone_response(response: &Response<Bytes>) -> Response<Bytes> {
    let mut copy = Response::new(response.body().clone());
    *copy.status_mut() = response.status();
    *copy.headers_mut() = response.headers().clone();
    copy
}

/// A gRPC (or gRPC-Web) call: a `POST` with a gRPC content type. Any other request is
/// answered in HTTP whatever its content type claims, so that a client cannot turn its 429
/// into a gRPC answer's `200 OK`, which a shared cache could store for a `GET`.
pub(crate) fn is_grpc<B>(req: &Request<B>) -> bool {
    req.method() == Method::POST
        && req
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|ct| ct.as_bytes().starts_with(b"application/grpc"))
}

fn is_preflight<B>(req: &Request<B>) -> bool {
    req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// The rate-limiting service made by [`RateLimitLayer`](super::RateLimitLayer); see the
/// [module docs](super).
pub struct RateLimit<S, K, St, P, C, R, M = super::AtOnce> {
    inner: S,
    shared: Arc<Shared<K, St, P, C, R, M>>,
}

impl<S, K, St, P, C, R, M> RateLimit<S, K, St, P, C, R, M> {
    pub(crate) const fn new(inner: S, shared: Arc<Shared<K, St, P, C, R, M>>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    pub const fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub const fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, K, St, P, C, R, M> RateLimit<S, K, St, P, C, R, M> {
    /// The ready inner service, for a future that calls it later; a fresh clone stays
    /// (axum's `from_fn` does the same).
    fn take_ready(&mut self) -> S
    where
        S: Clone,
    {
        let clone = self.inner.clone();
        std::mem::replace(&mut self.inner, clone)
    }

    /// A request that may wait for its turn: decided under its quota widened by the wait,
    /// its units taken at once; admitted, it waits until it conforms to its quota, then goes
    /// on (its units given back if it is dropped while it waits).
    fn waiting<B, ResBody>(
        &mut self,
        req: Request<B>,
        key: Key,
        turn: super::wait::Turn,
        cost: u32,
    ) -> ResponseFuture<S::Future, ResBody, S::Error>
    where
        S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        B: Send + 'static,
        ResBody: Send + 'static,
        K: KeyExtractor<B>,
        St: Store,
        P: QuotaPolicy<B>,
        C: Cost<B>,
        R: Rejection,
        M: Settlement<ResBody>,
    {
        let mut inner = self.take_ready();
        let shared = Arc::clone(&self.shared);
        ResponseFuture::boxed(Box::pin(async move {
            let config = &shared.config;
            // What a fallback admitted for the key while the store failed goes with the check
            // (never given back: only the request's own units are).
            let owed = config.failure.carried(&key, &turn.quota, cost);
            let charged = cost + owed.units();
            let checked = tokio::time::Instant::now();
            let result = shared.store.check(&key, &turn.widened, charged).await;
            let (result, wait, fresh_in) = match result {
                Ok(decision) => {
                    let fresh_in = decision.info().reset_after();
                    let (decision, wait) = turn.decided(decision);
                    (Ok(decision), wait, fresh_in)
                }
                Err(error) => (Err(error), Duration::ZERO, Duration::ZERO),
            };
            match shared.outcome(result, &key, turn.quota, (cost, owed), &req) {
                Outcome::Allow(headers) => {
                    // A shadow layer decides and counts, and never holds a request back.
                    if !wait.is_zero() && !config.shadow {
                        let mine = (key, turn.widened, cost);
                        let store = Arc::clone(&shared.store);
                        let give_back = super::wait::GiveBack::new(store, mine, checked, fresh_in);
                        tokio::time::sleep_until(checked + wait).await;
                        give_back.disarm();
                    }
                    let response = inner.call(req).await?;
                    Ok(super::future::finish(
                        response,
                        Headers::one(headers, shared.config.style),
                    ))
                }
                Outcome::Reject(response) => Ok(response.map(ResponseBody::full)),
            }
        }))
    }

    /// A request whose units are held when admitted and settled from its response.
    fn held<B, ResBody>(
        &mut self,
        req: Request<B>,
        key: Key,
        quota: Quota,
        cost: u32,
    ) -> ResponseFuture<S::Future, ResBody, S::Error>
    where
        S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        B: Send + 'static,
        ResBody: Send + 'static,
        K: KeyExtractor<B>,
        St: Store,
        P: QuotaPolicy<B>,
        C: Cost<B>,
        R: Rejection,
        M: Settlement<ResBody>,
    {
        let mut inner = self.take_ready();
        let shared = Arc::clone(&self.shared);
        ResponseFuture::boxed(Box::pin(async move {
            let limit = Limit::new(key.clone(), quota, cost);
            let hold = shared.config.hold;
            let (result, reservation) = match shared.store.reserve(&[limit], hold).await {
                Ok(reservation) => {
                    let decision = reservation.decisions().as_slice().first().copied();
                    let decision = decision.ok_or_else(|| {
                        StoreError::with_source(
                            ratewarden_core::StoreErrorKind::Other,
                            "a reservation of one limit without its decision",
                        )
                    });
                    (decision, Some(reservation))
                }
                Err(error) => (Err(error), None),
            };
            let owed = Owed::default();
            match shared.outcome(result, &key, quota, (cost, owed), &req) {
                Outcome::Allow(headers) => {
                    // Settles 0 if the inner service fails or this future is dropped.
                    let mut settling = reservation
                        .filter(Reservation::is_allowed)
                        .map(|r| Settling::new(Arc::clone(&shared.store), r, hold));
                    let call = inner.call(req);
                    let mut call = std::pin::pin!(call);
                    let response = match &mut settling {
                        // Without a runtime there is no timer, and no heartbeat to start.
                        Some(held) if tokio::runtime::Handle::try_current().is_ok() => {
                            let deadline = held.renew_after();
                            match tokio::time::timeout_at(deadline, &mut call).await {
                                Ok(response) => response,
                                Err(_) => {
                                    // Longer than half its hold: renew it while it runs.
                                    held.keep_alive();
                                    call.await
                                }
                            }
                        }
                        _ => call.await,
                    }?;
                    let settling =
                        settling.and_then(|s| s.metered(shared.settle.meter(&response, cost)));
                    let response =
                        super::future::finish(response, Headers::one(headers, shared.config.style));
                    Ok(response.map(|body| body.settling(settling)))
                }
                Outcome::Reject(response) => Ok(response.map(ResponseBody::full)),
            }
        }))
    }
}

impl<S: Clone, K, St, P, C, R, M> Clone for RateLimit<S, K, St, P, C, R, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, K, St, P, C, R, M> fmt::Debug for RateLimit<S, K, St, P, C, R, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<S, B, ResBody, K, St, P, C, R, M> Service<Request<B>> for RateLimit<S, K, St, P, C, R, M>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    ResBody: Send + 'static,
    K: KeyExtractor<B>,
    St: Store,
    P: QuotaPolicy<B>,
    C: Cost<B>,
    R: Rejection,
    M: Settlement<ResBody>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let shared = &*self.shared;
        let config = &shared.config;
        if config.exempt_preflight && is_preflight(&req) {
            return ResponseFuture::inner(self.inner.call(req), Headers::None);
        }
        let Some(quota) = shared.policy.quota(&req) else {
            return ResponseFuture::inner(self.inner.call(req), Headers::None);
        };
        let scope = config.scope ^ <M as super::settle::sealed::Meter<ResBody>>::SCOPE;
        let Some(key) = shared.key.extract(&req).map(|key| key.scoped(scope)) else {
            return match shared.missing_key(&req) {
                None => ResponseFuture::inner(self.inner.call(req), Headers::None),
                Some(answer) => ResponseFuture::ready(answer),
            };
        };
        let cost = shared.cost.cost(&req);
        if M::RESERVES {
            return self.held(req, key, quota, cost);
        }
        if let Some(turn) = config
            .wait
            .and_then(|max| super::wait::Turn::of(quota, max, cost))
        {
            return self.waiting(req, key, turn, cost);
        }
        // What a fallback admitted for the key while the store failed goes with the check.
        let owed = config.failure.carried(&key, &quota, cost);
        let charged = cost + owed.units();
        if let Some(result) = shared.store.check_ready(&key, &quota, charged) {
            return match shared.outcome(result, &key, quota, (cost, owed), &req) {
                Outcome::Allow(headers) => ResponseFuture::inner(
                    self.inner.call(req),
                    Headers::one(headers, shared.config.style),
                ),
                Outcome::Reject(response) => ResponseFuture::ready(response),
            };
        }
        // The store must wait (I/O): decide in a future that owns what it needs, the ready
        // inner service with it.
        let mut inner = self.take_ready();
        let shared = Arc::clone(&self.shared);
        ResponseFuture::boxed(Box::pin(async move {
            let result = shared.store.check(&key, &quota, charged).await;
            match shared.outcome(result, &key, quota, (cost, owed), &req) {
                Outcome::Allow(headers) => {
                    let response = inner.call(req).await?;
                    Ok(super::future::finish(
                        response,
                        Headers::one(headers, shared.config.style),
                    ))
                }
                Outcome::Reject(response) => Ok(response.map(ResponseBody::full)),
            }
        }))
    }
}
