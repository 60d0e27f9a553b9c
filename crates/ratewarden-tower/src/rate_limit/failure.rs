//! [`FailureMode`]: what a layer does while its store cannot decide.

use std::collections::HashSet;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::{Arc, OnceLock};

use ratewarden_core::{Decision, Key, Quota};
use ratewarden_memory::MemoryStore;

/// What a layer does when its store cannot decide: Redis down or slow, the pool exhausted, a
/// [`CircuitBreaker`](crate::breaker::CircuitBreaker) open. Chosen per layer, so a login route
/// can fail closed while reads fail open on the same store.
///
/// | mode | while the store fails |
/// |------|-----------------------|
/// | [`fallback`](Self::fallback) (the default, with `instances = 1`) | a local [`MemoryStore`](crate::MemoryStore) decides, enforcing `1 / instances` of the quota ([`Quota::share`]) |
/// | [`closed`](Self::closed) | `503 Service Unavailable` with `Retry-After: 1` (gRPC `UNAVAILABLE`), never a 429: the client did nothing wrong. [`allow`](Self::allow) lists keys that still go through |
/// | [`open`](Self::open) | every request goes through, uncounted |
///
/// Only store errors engage a mode; a denial from a healthy store is always a 429. When the
/// store answers again, it decides again.
///
/// By default every layer keeps limiting on its own: each instance enforces the whole quota
/// alone (a store of its own, made when first needed), so a fleet of `n` gateways admits at
/// most `n` times the quota during an outage, never an unlimited number. Choose
/// [`fallback`](Self::fallback) with `instances = n` to come closer to the quota,
/// [`closed`](Self::closed) where an unlimited minute is an attack window (login, password
/// reset, payments), and [`open`](Self::open) only where an outage of the limit costs less
/// than an outage of the route.
///
/// A fleet of `n` gateways falling back with `instances = n` admits, during an outage of
/// length `T`, at most `n × (⌈burst / n⌉ + ⌈count / n⌉ × T / period)`: about the quota plus
/// `n - 1` per period. The local stores start empty, so the quota the store had already given
/// out before the outage is not subtracted: in the worst case a key gets one extra burst at the
/// moment the store fails.
///
/// ```
/// use ratewarden_tower::rate_limit::FailureMode;
/// use ratewarden_tower::{Key, MemoryStore};
/// use std::num::NonZeroU32;
///
/// let api = FailureMode::default(); // each instance enforces the quota alone
/// let fleet = FailureMode::fallback(MemoryStore::new(), NonZeroU32::new(8).unwrap());
/// let login = FailureMode::closed().allow([Key::from("health-checker")]);
/// let reads = FailureMode::open();
/// # let _ = (api, fleet, login, reads);
/// ```
#[derive(Clone)]
pub struct FailureMode {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Open,
    Closed {
        allow: Arc<HashSet<Key>>,
    },
    Fallback {
        /// Made on first use: most layers never need it.
        store: Arc<OnceLock<MemoryStore>>,
        instances: NonZeroU32,
    },
}

impl Default for FailureMode {
    /// A local limit per instance: [`fallback`](Self::fallback) with `instances = 1`, on a
    /// store made when the store first fails.
    fn default() -> Self {
        Self {
            kind: Kind::Fallback {
                store: Arc::default(),
                instances: NonZeroU32::MIN,
            },
        }
    }
}

/// What the layer does with one request whose store call failed.
pub(crate) enum Failed {
    /// Let it through, uncounted.
    Pass,
    /// Answer 503.
    Unavailable,
    /// The fallback store's decision, under the share of the quota it enforced.
    Decided(Decision, Quota),
}

impl FailureMode {
    /// Let every request through, uncounted, while the store fails: for routes where an
    /// outage of the limit costs less than an outage of the route.
    ///
    /// ```
    /// use ratewarden_tower::rate_limit::FailureMode;
    /// assert_eq!(format!("{:?}", FailureMode::open()), "FailureMode::Open");
    /// ```
    #[must_use]
    pub fn open() -> Self {
        Self { kind: Kind::Open }
    }

    /// Answer `503` with `Retry-After: 1` while the store fails, except for keys
    /// [allowed](Self::allow).
    ///
    /// ```
    /// use ratewarden_tower::rate_limit::FailureMode;
    /// assert_eq!(format!("{:?}", FailureMode::closed()), "FailureMode::Closed { allowed: 0 }");
    /// ```
    #[must_use]
    pub fn closed() -> Self {
        Self {
            kind: Kind::Closed {
                allow: Arc::default(),
            },
        }
    }

    /// Keys that go through (uncounted) while a [closed](Self::closed) layer's store fails:
    /// health checkers, internal callers. No effect on other modes. Each names a client as
    /// the layer's extractor keys it ([`key_for`](crate::key::KeyExtractor::key_for)): with
    /// [`PeerIp`](crate::key::PeerIp) or [`ClientIp`](crate::key::ClientIp), an IPv6 address
    /// lets through its network (a /64 by default), which is one client to the layer.
    ///
    /// ```
    /// use ratewarden_tower::Key;
    /// use ratewarden_tower::rate_limit::FailureMode;
    /// use std::net::{IpAddr, Ipv4Addr};
    ///
    /// let mode = FailureMode::closed().allow([Key::from(IpAddr::from(Ipv4Addr::new(10, 0, 0, 7)))]);
    /// assert_eq!(format!("{mode:?}"), "FailureMode::Closed { allowed: 1 }");
    /// ```
    #[must_use]
    pub fn allow(mut self, keys: impl IntoIterator<Item = Key>) -> Self {
        if let Kind::Closed { allow } = &mut self.kind {
            Arc::make_mut(allow).extend(keys);
        }
        self
    }

    /// Decide locally while the store fails: `store` enforces [`Quota::share`]`(instances)`
    /// of each request's quota, so that `instances` gateways doing the same admit about the
    /// quota between them (see the type's docs for the bound). Its denials are 429s like any
    /// other, and the rate-limit headers show the share. Give it its own `MemoryStore` (its
    /// bound, `max_memory`, applies).
    ///
    /// ```
    /// use ratewarden_tower::rate_limit::FailureMode;
    /// use ratewarden_tower::MemoryStore;
    /// use std::num::NonZeroU32;
    ///
    /// let mode = FailureMode::fallback(MemoryStore::new(), NonZeroU32::new(4).unwrap());
    /// assert_eq!(format!("{mode:?}"), "FailureMode::Fallback { instances: 4 }");
    /// ```
    #[must_use]
    pub fn fallback(store: MemoryStore, instances: NonZeroU32) -> Self {
        Self {
            kind: Kind::Fallback {
                store: Arc::new(OnceLock::from(store)),
                instances,
            },
        }
    }

    /// The [allowed](Self::allow) keys as the layer's extractor keys its clients
    /// ([`key_for`](crate::key::KeyExtractor::key_for)): made once per layer, for
    /// [`on_failure`](Self::on_failure).
    pub(crate) fn allowed_as(&self, key_for: impl Fn(Key) -> Key) -> HashSet<Key> {
        match &self.kind {
            Kind::Closed { allow } => allow.iter().map(|key| key_for(key.clone())).collect(),
            Kind::Open | Kind::Fallback { .. } => HashSet::new(),
        }
    }

    /// What to do with a request for `key` under `quota` whose store call failed; `allowed`
    /// is [`allowed_as`](Self::allowed_as) the layer's extractor.
    pub(crate) fn on_failure(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
        allowed: &HashSet<Key>,
    ) -> Failed {
        match &self.kind {
            Kind::Open => Failed::Pass,
            Kind::Closed { .. } if allowed.contains(&key.clone().scoped(0)) => Failed::Pass,
            Kind::Closed { .. } => Failed::Unavailable,
            Kind::Fallback { store, instances } => {
                let share = quota.share(*instances);
                let store = store.get_or_init(MemoryStore::new);
                Failed::Decided(store.check_sync(key, &share, cost), share)
            }
        }
    }
}

impl fmt::Debug for FailureMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Open => f.write_str("FailureMode::Open"),
            Kind::Closed { allow } => {
                write!(f, "FailureMode::Closed {{ allowed: {} }}", allow.len())
            }
            Kind::Fallback { instances, .. } => {
                write!(f, "FailureMode::Fallback {{ instances: {instances} }}")
            }
        }
    }
}
