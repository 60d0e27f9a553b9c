//! [`PolicyLayer`] and its builder.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use http::StatusCode;
use ratewarden_core::{Key, Store, StoreError, StoreErrorKind};
use tower_layer::Layer;

use super::ban::{self, Ban};
use super::error::{PolicyError, Problem};
use super::handle::PolicyHandle;
use super::keys::Keys;
use super::plans::{PlanSource, Plans};
use super::service::{Config, OnStoreError, PolicyService, Shared};
use crate::key::KeyExtractor;
use crate::rate_limit::{HeaderStyle, MissingKey};
use crate::tenant::{CachedResolver, QuotaResolver};

/// Builds a [`PolicyLayer`]: registers key extractors by name and the layer's answers,
/// then checks the running policy against the names in [`build`](Self::build).
///
/// See the [module example](super).
#[must_use]
pub struct PolicyLayerBuilder<St, B> {
    store: Arc<St>,
    handle: PolicyHandle,
    keys: Keys<B>,
    config: Config,
    plans: Option<Arc<dyn PlanSource>>,
    ban: Option<(Ban, Vec<String>)>,
}

impl<St, B: 'static> PolicyLayerBuilder<St, B> {
    /// Registers `extractor` under `name`, for the policy's limits and lists to name
    /// (`global`, one key for every request, is always there).
    ///
    /// See the [module example](super).
    pub fn key<K: KeyExtractor<B>>(mut self, name: &str, extractor: K) -> Self {
        self.keys.insert(name, extractor);
        self
    }

    /// What to do with a request for which a limit's key is missing (default: 400). With
    /// [`MissingKey::Skip`], that limit is left out and the request's other limits apply.
    ///
    /// See the [module example](super).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.config.missing_key = missing;
        self
    }

    /// What to do when the store cannot decide (default [`OnStoreError::Fallback`]).
    ///
    /// See the [module example](super).
    pub const fn on_store_error(mut self, mode: OnStoreError) -> Self {
        self.config.on_store_error = mode;
        self
    }

    /// The status of requests refused by the deny list or a `deny` rule (default 403).
    ///
    /// See the [module example](super).
    pub const fn deny_status(mut self, status: StatusCode) -> Self {
        self.config.deny_status = status;
        self
    }

    /// Which rate-limit header fields to send (default [`HeaderStyle::Both`]).
    ///
    /// See the [module example](super).
    pub const fn headers(mut self, style: HeaderStyle) -> Self {
        self.config.style = style;
        self
    }

    /// Adds each tenant's plan to the limits the rules give a request: the tenant is keyed by
    /// the extractor named `key`, its [`Plan`](crate::tenant::Plan) comes from `plans` (the
    /// application's resolver behind its cache), and each of the plan's limits counts the
    /// request's cost on the tenant's key, under the limit's name. A request the rules do not
    /// limit (allowed, or given no limits) is not counted against its plan. An unknown tenant
    /// adds nothing; a lookup that fails follows the cache's `on_failure`: a plan, the
    /// layer's [store error mode](Self::on_store_error), or 503. A plan whose limits would
    /// take a request past [`MAX_LIMITS`](ratewarden_core::MAX_LIMITS) counts as a lookup that
    /// failed.
    ///
    /// ```
    /// use ratewarden_tower::key::Header;
    /// use ratewarden_tower::policy::{NamedLimit, Policy, PolicyHandle, PolicyLayer, Rule};
    /// use ratewarden_tower::tenant::{CachedResolver, Plan, ResolveError};
    /// use ratewarden_tower::{Key, MemoryStore, Quota};
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let plans = CachedResolver::new(|tenant: &Key| {
    ///     let gold = *tenant == Key::from("acme");
    ///     async move {
    ///         let quota = if gold { Quota::per_minute(1_000) } else { Quota::per_minute(10) };
    ///         Ok::<_, ResolveError>(Some(Plan::new("plan", [("per-tenant", quota.map_err(ResolveError::new)?)]).map_err(ResolveError::new)?))
    ///     }
    /// });
    /// let policy = Policy::new().otherwise(Rule::new().limit(NamedLimit::new("everyone", "global", Quota::per_second(100)?)));
    /// let layer = PolicyLayer::<_, ()>::builder(MemoryStore::new(), PolicyHandle::new(policy)?)
    ///     .key("tenant", Header::new(http::HeaderName::from_static("x-tenant")))
    ///     .plans("tenant", plans)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn plans<R: QuotaResolver>(mut self, key: &str, plans: CachedResolver<R>) -> Self {
        self.plans = Some(Arc::new(Plans {
            key: key.to_owned(),
            cache: plans,
        }));
        self
    }

    /// Bans a key of one of the extractors named in `keys` that its limits denied too often
    /// (see [`Ban`]). Name the keys of single clients (an IP, a user): a key many clients
    /// share (a tenant, an IP behind a NAT) is banned for all of them when some are denied,
    /// and `global`, which every request shares, cannot be named. A ban binds a request where
    /// a limit of the request is keyed by that extractor, a tenant plan's limits included
    /// when the plans' key is named.
    ///
    /// ```
    /// use ratewarden_tower::key::PeerIp;
    /// use ratewarden_tower::policy::{Ban, Policy, PolicyHandle, PolicyLayer};
    /// use ratewarden_tower::MemoryStore;
    /// use std::time::Duration;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let ban = Ban::new(20, Duration::from_secs(60), Duration::from_secs(600))?;
    /// let layer = PolicyLayer::<_, ()>::builder(MemoryStore::new(), PolicyHandle::new(Policy::new())?)
    ///     .key("ip", PeerIp::new())
    ///     .ban(&["ip"], ban)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn ban(mut self, keys: &[&str], ban: Ban) -> Self {
        self.ban = Some((ban, keys.iter().map(|&key| key.to_owned()).collect()));
        self
    }

    /// The layer, once the running policy names only registered keys; every later policy
    /// the handle is given must too.
    ///
    /// # Errors
    ///
    /// The [`PolicyError`] of a running policy that names a key not registered, or tenant
    /// plans or bans keyed by one (or bans of `global`).
    ///
    /// See the [module example](super).
    pub fn build(self) -> Result<PolicyLayer<St, B>, PolicyError> {
        let names = self.keys.names();
        if let Some(plans) = &self.plans
            && !names.iter().any(|name| name == plans.key())
        {
            return Err(PolicyError::new(
                "plans",
                Problem::UnknownKey {
                    key: plans.key().to_owned(),
                    known: names,
                },
            ));
        }
        if let Some((_, banned)) = &self.ban
            && let Some(key) = banned
                .iter()
                .find(|key| *key == "global" || !names.contains(key))
        {
            return Err(PolicyError::new(
                "ban",
                Problem::UnknownKey {
                    key: key.clone(),
                    known: names.into_iter().filter(|name| name != "global").collect(),
                },
            ));
        }
        self.handle.attach(names)?;
        Ok(PolicyLayer {
            shared: Arc::new(Shared {
                store: self.store,
                keys: self.keys,
                handle: self.handle,
                config: self.config,
                fallback: OnceLock::new(),
                plans: self.plans,
                ban: self.ban.map(|(ban, keys)| {
                    let scopes = keys
                        .iter()
                        .map(|key| (key.clone(), ban::scope(key)))
                        .collect();
                    (ban, scopes)
                }),
            }),
            _body: PhantomData,
        })
    }
}

impl<St, B> fmt::Debug for PolicyLayerBuilder<St, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyLayerBuilder")
            .field("keys", &self.keys.names())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Applies the running policy of a [`PolicyHandle`] to every request of the services it
/// wraps; see the [module docs](super) for an example.
///
/// `St` is the [`Store`](ratewarden_core::Store); `B` the request body type (the key
/// extractors' type parameter). Cheap to clone: clones and their services share the store,
/// the handle and the extractors.
#[must_use]
pub struct PolicyLayer<St, B> {
    shared: Arc<Shared<St, B>>,
    _body: PhantomData<fn(B)>,
}

impl<St, B: 'static> PolicyLayer<St, B> {
    /// Starts a layer counting in `store` and deciding by `handle`'s running policy.
    ///
    /// See the [module example](super).
    pub fn builder(store: St, handle: PolicyHandle) -> PolicyLayerBuilder<St, B> {
        PolicyLayerBuilder {
            store: Arc::new(store),
            handle,
            keys: Keys::new(),
            config: Config::default(),
            plans: None,
            ban: None,
        }
    }
}

impl<St, B> PolicyLayer<St, B> {
    /// The handle whose policy the layer applies.
    ///
    /// See the [module example](super).
    pub fn handle(&self) -> &PolicyHandle {
        &self.shared.handle
    }

    /// The store the layer counts in.
    ///
    /// See the [module example](super).
    pub fn store(&self) -> &St {
        &self.shared.store
    }
}

impl<St: Store, B> PolicyLayer<St, B> {
    /// Lifts the ban of `client`, as the extractor registered as `key` keys it (an IPv6
    /// address names its network, as [`KeyExtractor::key_for`] says), and forgets its
    /// denials, on every gateway that shares the store. (The layer's local fallback never
    /// bans.) A request of the client decided before the lift may still count its denial,
    /// or set the ban, just after it.
    ///
    /// # Errors
    ///
    /// The store's error; [`StoreErrorKind::InvalidInput`] when the layer bans no keys named
    /// `key`.
    ///
    /// ```
    /// use ratewarden_tower::key::PeerIp;
    /// use ratewarden_tower::policy::{Ban, Policy, PolicyHandle, PolicyLayer};
    /// use ratewarden_tower::{Key, MemoryStore};
    /// use std::net::IpAddr;
    /// use std::time::Duration;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let ban = Ban::new(20, Duration::from_secs(60), Duration::from_secs(600))?;
    /// let layer = PolicyLayer::<_, ()>::builder(MemoryStore::new(), PolicyHandle::new(Policy::new())?)
    ///     .key("ip", PeerIp::new())
    ///     .ban(&["ip"], ban)
    ///     .build()?;
    /// let client: IpAddr = "192.0.2.7".parse()?;
    /// layer.lift_ban("ip", &Key::from(client)).await?;
    /// assert!(layer.lift_ban("user", &Key::from("alice")).await.is_err());
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn lift_ban(&self, key: &str, client: &Key) -> Result<(), StoreError> {
        let shared = &self.shared;
        let (Some((ban, _)), Some(scope)) = (&shared.ban, shared.ban_scope(key)) else {
            return Err(StoreError::with_source(
                StoreErrorKind::InvalidInput,
                format!("the layer bans no keys named {key:?}"),
            ));
        };
        let client = shared.keys.key_for(key, client.clone());
        for (state, quota) in [ban.ban(&client, scope), ban.denial(&client, scope)] {
            shared.store.reset(&state, &quota).await?;
        }
        Ok(())
    }
}

impl<St, B> Clone for PolicyLayer<St, B> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            _body: PhantomData,
        }
    }
}

impl<St, B> fmt::Debug for PolicyLayer<St, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyLayer")
            .field("keys", &self.shared.keys.names())
            .field("handle", &self.shared.handle)
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<S, St, B> Layer<S> for PolicyLayer<St, B> {
    type Service = PolicyService<S, St, B>;

    fn layer(&self, inner: S) -> Self::Service {
        PolicyService::new(inner, Arc::clone(&self.shared))
    }
}
