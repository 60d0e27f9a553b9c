//! [`PolicyService`]: how one request is decided, step by step.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode, header};
use ratewarden_core::{Decision, Decisions, Key, Limit, MAX_LIMITS, Quota, Store};
use ratewarden_memory::MemoryStore;
use tower_service::Service;

use super::ban::Ban;
use super::handle::{Now, PolicyHandle, Snapshot, SnapshotCache};
use super::headers::{self, Applied, AppliedLimits, Checks};
use super::keys::{Keys, RequestKeys};
use super::observe::{self, Outcome};
use super::plans::{self, PlanSource, RequestLimits};
use super::rule::Action;
use crate::rate_limit::future::{Headers, ResponseFuture, finish};
use crate::rate_limit::is_grpc;
use crate::rate_limit::{
    DefaultRejection, DenialReason, Denied, HeaderStyle, MissingKey, Rejection, ResponseBody,
};
use crate::tenant::Resolution;

/// What a [`PolicyLayer`](super::PolicyLayer) does with a request when its store cannot decide.
///
/// ```
/// use ratewarden_tower::policy::OnStoreError;
/// assert_eq!(OnStoreError::default(), OnStoreError::Fallback);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnStoreError {
    /// Let it through, uncounted.
    Open,
    /// Answer `503` with `Retry-After: 1` (gRPC `UNAVAILABLE`).
    Closed,
    /// Decide on a local [`MemoryStore`](crate::MemoryStore) of the layer's, made when the
    /// store first fails, each instance enforcing the whole quotas alone (as
    /// [`FailureMode`](crate::rate_limit::FailureMode)'s default does for one quota).
    #[default]
    Fallback,
}

/// The layer's settings.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) style: HeaderStyle,
    pub(crate) missing_key: MissingKey,
    pub(crate) on_store_error: OnStoreError,
    pub(crate) deny_status: StatusCode,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            style: HeaderStyle::default(),
            missing_key: MissingKey::default(),
            on_store_error: OnStoreError::default(),
            deny_status: StatusCode::FORBIDDEN,
        }
    }
}

/// What a layer and its services share.
pub(crate) struct Shared<St, B> {
    pub(crate) store: Arc<St>,
    pub(crate) keys: Keys<B>,
    pub(crate) handle: PolicyHandle,
    pub(crate) config: Config,
    /// The local store of [`OnStoreError::Fallback`], made when the store first fails.
    pub(crate) fallback: OnceLock<MemoryStore>,
    /// Where tenants' plans come from, if they count.
    pub(crate) plans: Option<Arc<dyn PlanSource>>,
    /// Bans, and the scope of the bans of each key extractor's keys.
    pub(crate) ban: Option<(Ban, Vec<(String, u64)>)>,
}

/// The checks one request needs: its limits for the store, and how they map to the limits
/// shown in its headers.
struct Plan {
    limits: RequestLimits,
    applied: AppliedLimits,
    shadow: bool,
    /// The cost of the request's limits (a tenant plan's limits count it too).
    cost: u32,
    /// A tenant whose plan is to be looked up before the check.
    tenant: Option<Key>,
    /// With bans: the probe of each key's ban (its index among the limits), and each limit
    /// whose denial counts against its key (index, ban scope, key).
    bans: Vec<usize>,
    bannable: Vec<(usize, u64, Key)>,
}

/// What a store's failure leaves the layer to do.
enum AfterFailure {
    /// The local fallback decided.
    Decided(Decisions),
    /// Call the inner service, uncounted.
    Pass,
    /// Answer with this response.
    Answer(Response<Bytes>),
}

/// What the layer does with a request before the store is asked.
#[expect(
    clippy::large_enum_variant,
    reason = "made and taken apart once per request: a box would allocate per request"
)]
enum Step {
    /// Call the inner service, with no rate-limit headers.
    Pass,
    /// Answer with this response.
    Answer(Response<Bytes>),
    /// Check these limits.
    Check(Plan),
}

impl<St, B> Shared<St, B> {
    /// Decides what `req` needs, on one policy snapshot: deny list, allow list, the rules,
    /// then each limit's key.
    fn plan(&self, req: &Request<B>, snapshot: &Snapshot, now: Now<'_>) -> Step {
        let policy = &snapshot.policy;
        let mut keys = RequestKeys::new(&self.keys, req);
        // A key the deny list names, sent so that it cannot be read (a header twice), cannot
        // be told off the list: refused.
        if !policy.denied().is_empty()
            && (policy.denied().contains(&mut keys) || policy.denied().has_unusable(&mut keys))
        {
            observe::count(Outcome::DenyListed);
            return Step::Answer(self.refuse(req));
        }
        if !policy.allowed().is_empty() && policy.allowed().contains(&mut keys) {
            observe::count(Outcome::AllowListed);
            return Step::Pass;
        }
        let verdict = policy.verdict(req, route(req));
        match verdict.action {
            Action::Allow => {
                observe::count(Outcome::RuleAllowed);
                return Step::Pass;
            }
            Action::Deny => {
                observe::count(Outcome::RuleDenied);
                return Step::Answer(self.refuse(req));
            }
            Action::Limit | Action::Shadow => {}
        }
        let mut plan = Plan {
            // (Inline up to two: more are allocated once, not grown into.)
            limits: RequestLimits::with_capacity(verdict.limits.len()),
            applied: AppliedLimits::default(),
            shadow: verdict.action == Action::Shadow,
            cost: 1,
            tenant: None,
            bans: Vec::new(),
            bannable: Vec::new(),
        };
        // Each limit under its own scope, so that two names never share a bucket.
        for (limit, cost) in verdict.limits.iter() {
            let Some(key) = keys.get(limit.key()) else {
                match self.missing_key(req, &keys, limit.key(), plan.shadow) {
                    None => continue,
                    Some(answer) => return Step::Answer(answer),
                }
            };
            plan.applied.push(Applied {
                limit: limit.shown(),
                checks: Checks::one(plan.limits.len()),
            });
            plan.cost = plan.cost.max(cost);
            if let Some(scope) = self.ban_scope(limit.key()) {
                plan.bannable.push((plan.limits.len(), scope, key.clone()));
            }
            plan.limits
                .push(Limit::new(key.scoped(limit.scope()), *limit.quota(), cost));
        }
        // A rule's limits, all applied: their `RateLimit-Policy` is formatted once.
        // (One limit's headers are its own: see `decided`.)
        if let Some(rule) = verdict.limits.rule()
            && plan.limits.len() == rule.limits().len()
            && plan.limits.len() > 1
        {
            plan.applied.formatted(rule.policy_header());
        }
        if plan.limits.is_empty() {
            return Step::Pass;
        }
        if let Some(step) = self.plan_extras(&mut plan, &mut keys, req) {
            return step;
        }
        // Then the previous quotas a reload changed, while they fit: every limit's newest
        // first, then every limit's next, so that none loses its newest to another's older.
        if !snapshot.transitions.is_empty() {
            let previous: Vec<_> = (verdict.limits.iter())
                .map(|(limit, cost)| {
                    (
                        limit,
                        cost,
                        snapshot.previous(limit.name(), &now).collect::<Vec<_>>(),
                    )
                })
                .collect();
            let deepest = previous.iter().map(|(_, _, p)| p.len()).max().unwrap_or(0);
            for depth in 0..deepest {
                for (limit, cost, quotas) in &previous {
                    let Some(previous) = quotas.get(depth) else {
                        continue;
                    };
                    if plan.limits.len() >= MAX_LIMITS {
                        break;
                    }
                    let Some(applied) =
                        (plan.applied.iter_mut()).find(|a| a.limit.name() == limit.name())
                    else {
                        continue;
                    };
                    let Some(key) = keys.get(previous.key()) else {
                        continue;
                    };
                    applied.checks.insert(plan.limits.len());
                    plan.limits.push(Limit::new(
                        key.scoped(previous.scope()),
                        *previous.quota(),
                        *cost,
                    ));
                }
            }
        }
        if plan.limits.is_empty() {
            return Step::Pass;
        }
        Step::Check(plan)
    }

    /// The scope of the bans of keys named `name`, when the layer bans.
    pub(crate) fn ban_scope(&self, name: &str) -> Option<u64> {
        let (_, scopes) = self.ban.as_ref()?;
        scopes
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, scope)| scope)
    }

    /// Adds what the layer's tenant plans and bans give a request limited by the rules: the
    /// tenant's plan (now, when the cache holds it; else the tenant is looked up before the
    /// check), and a probe of the ban of each key its limits count; `Some` to answer at once.
    fn plan_extras(
        &self,
        plan: &mut Plan,
        keys: &mut RequestKeys<'_, B>,
        req: &Request<B>,
    ) -> Option<Step> {
        // Bans first: the probes always fit (a rule gives at most 8 limits).
        if let Some((ban, _)) = &self.ban {
            let mut probed: Vec<(u64, &Key)> = Vec::new();
            for (_, scope, key) in &plan.bannable {
                if probed.contains(&(*scope, key)) || plan.limits.len() >= MAX_LIMITS {
                    continue;
                }
                probed.push((*scope, key));
                plan.bans.push(plan.limits.len());
                plan.limits.push(ban.probe(key, *scope));
            }
        }
        if let Some(plans) = &self.plans {
            // A tenant key missing, or sent so that it cannot be read, is answered as a limit's
            // missing key is: never a way out of the plan.
            let Some(tenant) = keys.get(plans.key()) else {
                return self
                    .missing_key(req, keys, plans.key(), plan.shadow)
                    .map(Step::Answer);
            };
            match plans.ready(&tenant) {
                Some(resolution) => {
                    let step = self.with_plan(plan, resolution, &tenant, is_grpc(req));
                    if step.is_some() {
                        return step;
                    }
                }
                None => plan.tenant = Some(tenant),
            }
        }
        None
    }

    /// Adds a tenant's plan, as looked up, to `plan`; `Some` with what to do with the request
    /// instead when the lookup failed and the layer's store error mode does not let it go on.
    fn with_plan(
        &self,
        plan: &mut Plan,
        resolution: Resolution,
        tenant: &Key,
        grpc: bool,
    ) -> Option<Step> {
        let failed = match (&resolution, &self.plans) {
            (Resolution::Plan(found), Some(plans)) => {
                let first = plan.limits.len();
                let limits = (&mut plan.limits, &mut plan.applied);
                let added = plans::add(found, (tenant, plans.key()), plan.cost, limits.0, limits.1);
                if added.is_err() || self.ban_plan(plan, tenant, plans.key(), first).is_err() {
                    // More limits than a store decides together: never let through uncounted.
                    return Some(Step::Answer(unavailable(grpc)));
                }
                false
            }
            (Resolution::Unknown, _) | (Resolution::Plan(_), None) => false,
            (Resolution::FailureMode, _) => true,
            (Resolution::Unavailable, _) if plan.shadow => false,
            (Resolution::Unavailable, _) => return Some(Step::Answer(unavailable(grpc))),
        };
        // In shadow mode a failed lookup refuses nothing: the rules' limits are shown.
        if !failed || plan.shadow {
            return None;
        }
        // As a store that failed: let the request through, refuse it, or (the local
        // fallback) decide it on the rules' limits alone.
        match self.config.on_store_error {
            OnStoreError::Open => Some(Step::Pass),
            OnStoreError::Closed => Some(Step::Answer(unavailable(grpc))),
            OnStoreError::Fallback => None,
        }
    }

    /// With a ban on the tenants' key `name`: the denials of the plan's limits (those from
    /// `first` on) count against the tenant, and the request reads the tenant's ban. `Err`
    /// when that takes the request past [`MAX_LIMITS`].
    fn ban_plan(&self, plan: &mut Plan, tenant: &Key, name: &str, first: usize) -> Result<(), ()> {
        let (Some((ban, _)), Some(scope)) = (&self.ban, self.ban_scope(name)) else {
            return Ok(());
        };
        if first == plan.limits.len() {
            return Ok(());
        }
        for i in first..plan.limits.len() {
            plan.bannable.push((i, scope, tenant.clone()));
        }
        let probe = ban.probe(tenant, scope);
        let probed =
            (plan.bans.iter()).any(|&i| plan.limits.get(i).is_some_and(|l| l.key() == probe.key()));
        if probed {
            return Ok(());
        }
        if plan.limits.len() >= MAX_LIMITS {
            return Err(());
        }
        plan.bans.push(plan.limits.len());
        plan.limits.push(probe);
        Ok(())
    }

    /// The answer to a request without the key `name` (`None`: leave that limit out).
    fn missing_key(
        &self,
        req: &Request<B>,
        keys: &RequestKeys<'_, B>,
        name: &str,
        shadow: bool,
    ) -> Option<Response<Bytes>> {
        let (challenge, unusable) = keys.missing(name);
        let skip = matches!(self.config.missing_key, MissingKey::Skip);
        if skip && !unusable {
            return None;
        }
        observe::count(Outcome::MissingKey);
        if shadow {
            return None;
        }
        let missing = if skip {
            let status = if challenge.is_some() {
                StatusCode::UNAUTHORIZED
            } else {
                StatusCode::BAD_REQUEST
            };
            MissingKey::Reject(status)
        } else {
            self.config.missing_key.clone()
        };
        missing.answer(is_grpc(req), challenge)
    }

    /// The answer of the deny list and of `deny` rules.
    fn refuse(&self, req: &Request<B>) -> Response<Bytes> {
        self.refuse_for(is_grpc(req))
    }

    /// The answer of the deny list, deny rules and bans.
    fn refuse_for(&self, grpc: bool) -> Response<Bytes> {
        MissingKey::Reject(self.config.deny_status)
            .answer(grpc, None)
            .unwrap_or_default()
    }

    /// The keys whose denial this request counts toward a ban: those of the limits that
    /// denied it (each once), with their ban scopes.
    fn denied_keys(plan: &Plan, decisions: &Decisions) -> Vec<(u64, Key)> {
        let mut keys: Vec<(u64, Key)> = Vec::new();
        for (i, scope, key) in &plan.bannable {
            let denied = decisions
                .as_slice()
                .get(*i)
                .is_some_and(|d| !d.is_allowed());
            if denied && !keys.iter().any(|(s, k)| s == scope && k == key) {
                keys.push((*scope, key.clone()));
            }
        }
        keys
    }

    /// The 429 for `decisions`, with its headers.
    fn rejection(&self, plan: &Plan, decisions: &Decisions, grpc: bool) -> Response<Bytes> {
        let binding = decisions.binding();
        let (info, reason, name, quota) = match binding {
            Some((i, decision)) => {
                let reason = if matches!(decision, Decision::InsufficientCapacity(_)) {
                    DenialReason::InsufficientCapacity
                } else {
                    DenialReason::RateLimited
                };
                let shown = plan.applied.iter().find(|a| a.checks.contains(i));
                (
                    *decision.info(),
                    reason,
                    shown.map_or_else(
                        || Arc::from("default"),
                        |a| Arc::clone(a.limit.shown_name()),
                    ),
                    plan.limits.get(i).map(|l| *l.quota()),
                )
            }
            None => return Response::default(),
        };
        let Some(quota) = quota else {
            return Response::default();
        };
        let denied = Denied {
            info,
            quota,
            name,
            reason,
            grpc,
        };
        let (mut parts, body) = DefaultRejection.response(&denied).into_parts();
        headers::apply(
            &mut parts.headers,
            self.config.style,
            &plan.applied,
            decisions,
            true,
        );
        Response::from_parts(parts, body)
    }
}

impl<St: Store, B> Shared<St, B> {
    /// What the store's failure leaves the layer to do.
    fn on_store_error(
        &self,
        error: &ratewarden_core::StoreError,
        limits: &[Limit],
        grpc: bool,
        shadow: bool,
    ) -> AfterFailure {
        #[cfg(feature = "tracing")]
        tracing::debug!(%error, mode = ?self.config.on_store_error, "rate-limit store failed");
        // A request the store cannot decide whatever its health (more limits than it decides
        // together, several limits on a store that decides one): refused, as a store failure
        // of a closed layer is, never let through uncounted.
        let mode = if error.is_backend_failure() {
            self.config.on_store_error
        } else {
            OnStoreError::Closed
        };
        match mode {
            OnStoreError::Open => {
                observe::count(Outcome::FailureOpen);
                AfterFailure::Pass
            }
            OnStoreError::Closed => {
                observe::count(Outcome::FailureClosed);
                if shadow {
                    return AfterFailure::Pass;
                }
                AfterFailure::Answer(unavailable(grpc))
            }
            OnStoreError::Fallback => {
                observe::count(Outcome::Fallback);
                let store = self.fallback.get_or_init(MemoryStore::new);
                match store.check_all_sync(limits) {
                    Ok(decisions) => AfterFailure::Decided(decisions),
                    Err(_) => AfterFailure::Answer(unavailable(grpc)),
                }
            }
        }
    }
}

/// The 503 of a request the layer cannot decide, to retry in a second.
fn unavailable(grpc: bool) -> Response<Bytes> {
    let mut answer = MissingKey::Reject(StatusCode::SERVICE_UNAVAILABLE)
        .answer(grpc, None)
        .unwrap_or_default();
    answer
        .headers_mut()
        .insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    answer
}

/// The route a request is matched by: axum's matched path when there is one, else the URI
/// path.
fn route<B>(req: &Request<B>) -> &str {
    #[cfg(feature = "axum")]
    if let Some(matched) = req.extensions().get::<axum::extract::MatchedPath>() {
        return matched.as_str();
    }
    req.uri().path()
}

/// The service made by [`PolicyLayer`](super::PolicyLayer); see the [module docs](super).
pub struct PolicyService<S, St, B> {
    inner: S,
    shared: Arc<Shared<St, B>>,
    /// The running policy, as this service last loaded it.
    policy: SnapshotCache,
}

impl<S, St, B> PolicyService<S, St, B> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<St, B>>) -> Self {
        let policy = shared.handle.cache();
        Self {
            inner,
            shared,
            policy,
        }
    }

    /// The inner service.
    ///
    /// See the [module example](super).
    pub const fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the inner service.
    ///
    /// See the [module example](super).
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, St, B> Clone for PolicyService<S, St, B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            policy: self.policy.clone(),
        }
    }
}

impl<S: fmt::Debug, St, B> fmt::Debug for PolicyService<S, St, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyService")
            .field("inner", &self.inner)
            .field("handle", &self.shared.handle)
            .finish_non_exhaustive()
    }
}

impl<S, St, B, ResBody> Service<Request<B>> for PolicyService<S, St, B>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    ResBody: Send + 'static,
    St: Store,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // One snapshot for the whole request: it never sees two policies.
        let snapshot = self.policy.load();
        let now = self.shared.handle.now();
        let mut plan = match self.shared.plan(&req, snapshot, now) {
            Step::Pass => return ResponseFuture::inner(self.inner.call(req), Headers::None),
            Step::Answer(response) => return ResponseFuture::ready(response),
            Step::Check(plan) => plan,
        };
        let grpc = is_grpc(&req);
        // A store that decides at once (the memory store), and no plan to look up: no future
        // to box.
        if plan.tenant.is_none()
            && let Some(result) = self.shared.store.check_all_ready(&plan.limits)
        {
            // (A store deciding at once decides these at once too.)
            let store = &self.shared.store;
            for (counted, (ban, banned)) in self.shared.denials(&result, &plan) {
                if let Some(Ok(decisions)) = store.check_all_ready(&counted)
                    && over(&decisions)
                {
                    let _ = store.check_ready(&ban, &banned, 1);
                }
            }
            return match self.shared.decided(result, &plan, grpc) {
                Verdict::Serve(headers) => ResponseFuture::inner(self.inner.call(req), headers),
                Verdict::Answer(response) => ResponseFuture::ready(response),
            };
        }
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        ResponseFuture::boxed(Box::pin(async move {
            if let (Some(tenant), Some(plans)) = (plan.tenant.take(), shared.plans.as_ref()) {
                let resolution = plans.resolve(tenant.clone()).await;
                match shared.with_plan(&mut plan, resolution, &tenant, grpc) {
                    None => {}
                    Some(Step::Answer(response)) => return Ok(response.map(ResponseBody::full)),
                    Some(_) => return Ok(finish(inner.call(req).await?, Headers::None)),
                }
            }
            let result = shared.store.check_all(&plan.limits).await;
            for (counted, (ban, banned)) in shared.denials(&result, &plan) {
                if let Ok(decisions) = shared.store.check_all(&counted).await
                    && over(&decisions)
                {
                    let _ = shared.store.check(&ban, &banned, 1).await;
                }
            }
            match shared.decided(result, &plan, grpc) {
                Verdict::Serve(headers) => Ok(finish(inner.call(req).await?, headers)),
                Verdict::Answer(response) => Ok(response.map(ResponseBody::full)),
            }
        }))
    }
}

impl<St, B> Shared<St, B> {
    /// For a request its limits denied (not banned, not in shadow mode), for each key whose
    /// limit denied it: its denial counter, counted with a probe of its ban in one
    /// `check_all` (so that a store decides both on what it holds, never on a denial it
    /// cached before a ban was lifted: see [`over`]), and the ban to set when the counter
    /// denies in turn.
    fn denials(
        &self,
        result: &Result<Decisions, ratewarden_core::StoreError>,
        plan: &Plan,
    ) -> Vec<([Limit; 2], (Key, Quota))> {
        let (Some((ban, _)), Ok(decisions)) = (&self.ban, result) else {
            return Vec::new();
        };
        let slice = decisions.as_slice();
        let banned = plan
            .bans
            .iter()
            .any(|&i| slice.get(i).is_some_and(|d| !d.is_allowed()));
        if plan.shadow || decisions.is_allowed() || banned {
            return Vec::new();
        }
        (Self::denied_keys(plan, decisions).iter())
            .map(|(scope, key)| {
                let (counter, within) = ban.denial(key, *scope);
                let counted = [Limit::new(counter, within, 1), ban.probe(key, *scope)];
                (counted, ban.ban(key, *scope))
            })
            .collect()
    }
}

/// Whether a key's denials (`denials`) are over its ban's number: the counter denies while
/// the key is not banned already.
fn over(decisions: &Decisions) -> bool {
    matches!(decisions.as_slice(), [counter, probe] if !counter.is_allowed() && probe.is_allowed())
}

/// What the layer does once the limits are decided.
enum Verdict {
    /// Call the inner service; its response gets these headers.
    Serve(Headers),
    /// Answer with this response.
    Answer(Response<Bytes>),
}

impl<St: Store, B> Shared<St, B> {
    /// What to do with a request whose limits the store decided as `result`.
    fn decided(
        &self,
        result: Result<Decisions, ratewarden_core::StoreError>,
        plan: &Plan,
        grpc: bool,
    ) -> Verdict {
        let decisions = match result {
            Ok(decisions) => decisions,
            Err(error) => match self.on_store_error(&error, &plan.limits, grpc, plan.shadow) {
                AfterFailure::Decided(decisions) => decisions,
                AfterFailure::Pass => return Verdict::Serve(Headers::None),
                AfterFailure::Answer(answer) => return Verdict::Answer(answer),
            },
        };
        let admitted = decisions.is_allowed();
        let banned = (plan.bans.iter())
            .find_map(|&i| decisions.as_slice().get(i).filter(|d| !d.is_allowed()));
        if let Some(ban) = banned
            && !plan.shadow
        {
            observe::count(Outcome::DenyListed);
            let mut answer = self.refuse_for(grpc);
            // The ban's end, or later when a limit denies past it.
            let retry =
                headers::ceil_secs(ban.info().retry_after()).max(headers::retry_after(&decisions));
            answer
                .headers_mut()
                .insert(header::RETRY_AFTER, http::HeaderValue::from(retry));
            return Verdict::Answer(answer);
        }
        if !admitted && !plan.shadow {
            observe::count(Outcome::Denied);
            #[cfg(feature = "tracing")]
            tracing::debug!(
                retry_after_s = headers::retry_after(&decisions),
                "policy limit exceeded"
            );
            return Verdict::Answer(self.rejection(plan, &decisions, grpc));
        }
        observe::count(if admitted {
            Outcome::Allowed
        } else {
            Outcome::ShadowDenied
        });
        if self.config.style == HeaderStyle::None {
            return Verdict::Serve(Headers::None);
        }
        // One limit: its values formatted once, written into the response as it comes.
        if let Some((only, i)) = plan.applied.only()
            && let Some(decision) = decisions.as_slice().get(i)
        {
            let headers = Arc::clone(only.limit.headers());
            return Verdict::Serve(Headers::One(headers, *decision.info(), self.config.style));
        }
        let mut fields = HeaderMap::new();
        headers::apply(
            &mut fields,
            self.config.style,
            &plan.applied,
            &decisions,
            false,
        );
        Verdict::Serve(Headers::Fields(fields))
    }
}
