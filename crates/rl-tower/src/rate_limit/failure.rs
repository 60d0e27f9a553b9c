//! [`FailureMode`]: what a layer does while its store cannot decide.

use std::collections::HashSet;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;

use rl_core::{Decision, Key, Quota};

/// What a layer does when its store cannot decide: Redis down or slow, the pool exhausted, a
/// [`CircuitBreaker`](crate::breaker::CircuitBreaker) open. Chosen per layer, so a login route
/// can fail closed while reads fail open on the same store.
///
/// | mode | while the store fails |
/// |------|-----------------------|
/// | [`open`](Self::open) (default) | every request goes through, uncounted |
/// | [`closed`](Self::closed) | `503 Service Unavailable` with `Retry-After: 1` (gRPC `UNAVAILABLE`), never a 429: the client did nothing wrong. [`allow`](Self::allow) lists keys that still go through |
/// | [`fallback`](Self::fallback) | a local [`MemoryStore`](crate::MemoryStore) decides, enforcing `1 / instances` of the quota ([`Quota::share`]) |
///
/// Only store errors engage a mode; a denial from a healthy store is always a 429. When the
/// store answers again, it decides again.
///
/// A fleet of `n` gateways falling back with `instances = n` admits, during an outage of
/// length `T`, at most `n × (⌈burst / n⌉ + ⌈count / n⌉ × T / period)`: about the quota plus
/// `n - 1` per period. The local stores start empty, so the quota the store had already given
/// out before the outage is not subtracted: in the worst case a key gets one extra burst at the
/// moment the store fails.
///
/// ```
/// use rl_tower::rate_limit::FailureMode;
/// use rl_tower::{Key, MemoryStore};
/// use std::num::NonZeroU32;
///
/// let reads = FailureMode::open();
/// let login = FailureMode::closed().allow([Key::from("health-checker")]);
/// let api = FailureMode::fallback(MemoryStore::new(), NonZeroU32::new(8).unwrap());
/// # let _ = (reads, login, api);
/// ```
#[derive(Clone, Default)]
pub struct FailureMode {
    kind: Kind,
}

#[derive(Clone, Default)]
enum Kind {
    #[default]
    Open,
    Closed {
        allow: Arc<HashSet<Key>>,
    },
    #[cfg(feature = "memory")]
    Fallback {
        store: Arc<crate::MemoryStore>,
        instances: NonZeroU32,
    },
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
    /// Let every request through while the store fails (the default: availability first).
    ///
    /// ```
    /// use rl_tower::rate_limit::FailureMode;
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
    /// use rl_tower::rate_limit::FailureMode;
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
    /// health checkers, internal callers. No effect on other modes.
    ///
    /// ```
    /// use rl_tower::Key;
    /// use rl_tower::rate_limit::FailureMode;
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
    /// use rl_tower::rate_limit::FailureMode;
    /// use rl_tower::MemoryStore;
    /// use std::num::NonZeroU32;
    ///
    /// let mode = FailureMode::fallback(MemoryStore::new(), NonZeroU32::new(4).unwrap());
    /// assert_eq!(format!("{mode:?}"), "FailureMode::Fallback { instances: 4 }");
    /// ```
    #[cfg(feature = "memory")]
    #[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
    #[must_use]
    pub fn fallback(store: crate::MemoryStore, instances: NonZeroU32) -> Self {
        Self {
            kind: Kind::Fallback {
                store: Arc::new(store),
                instances,
            },
        }
    }

    /// What to do with a request for `key` under `quota` whose store call failed.
    pub(crate) fn on_failure(&self, key: &Key, quota: &Quota, cost: u32) -> Failed {
        #[cfg(not(feature = "memory"))]
        let _ = (quota, cost);
        match &self.kind {
            Kind::Open => Failed::Pass,
            Kind::Closed { allow } if allow.contains(&key.clone().scoped(0)) => Failed::Pass,
            Kind::Closed { .. } => Failed::Unavailable,
            #[cfg(feature = "memory")]
            Kind::Fallback { store, instances } => {
                let share = quota.share(*instances);
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
            #[cfg(feature = "memory")]
            Kind::Fallback { instances, .. } => {
                write!(f, "FailureMode::Fallback {{ instances: {instances} }}")
            }
        }
    }
}
