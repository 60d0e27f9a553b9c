//! [`PolicyLayer`] and its builder.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use http::StatusCode;
use tower_layer::Layer;

use super::error::PolicyError;
use super::handle::PolicyHandle;
use super::keys::Keys;
use super::service::{Config, PolicyService, Shared};
use crate::key::KeyExtractor;
use crate::rate_limit::{HeaderStyle, MissingKey};

/// What a [`PolicyLayer`] does with a request when its store cannot decide.
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

    /// The layer, once the running policy names only registered keys; every later policy
    /// the handle is given must too.
    ///
    /// # Errors
    ///
    /// The [`PolicyError`] of a running policy that names a key not registered.
    ///
    /// See the [module example](super).
    pub fn build(self) -> Result<PolicyLayer<St, B>, PolicyError> {
        self.handle.attach(self.keys.names())?;
        Ok(PolicyLayer {
            shared: Arc::new(Shared {
                store: self.store,
                keys: self.keys,
                handle: self.handle,
                config: self.config,
                fallback: OnceLock::new(),
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
