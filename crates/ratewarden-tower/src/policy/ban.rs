//! [`Ban`]: a key denied too often is refused for a while, by every gateway that shares the
//! store.

use std::time::Duration;

use ratewarden_core::{Algorithm, Key, Limit, Quota, QuotaError};

/// Temporary bans: a key that its limits denied more than `denials` times within `within` is
/// refused (the policy's deny status, 403 by default) for `duration` from then, whatever its
/// limits would say, and uncounted by them meanwhile.
///
/// Bans apply to the keys of the extractors a layer names
/// ([`PolicyLayerBuilder::ban`](super::PolicyLayerBuilder::ban)), where a limit of a request is
/// keyed by one; only the denials of those limits count. A ban ends when its time is up (no
/// call lifts it sooner).
///
/// A ban is kept in the layer's store, so every gateway that shares the store honours it: the
/// denials are counted under a sliding window, and the ban is a state every request of the
/// key reads in the same call as its limits (a [probe](Limit::probe), never counted). With
/// Redis it is one key with a TTL of `duration`, read by the next request of the key on any
/// gateway: a ban reaches every gateway within one round trip (a request already in flight
/// when it is written is decided without it). With the memory store it binds this process
/// only. Denials are counted once per key per denied request, for every key (IP, user ...)
/// whose limit denied it; a banned request is not counted again.
///
/// ```
/// use ratewarden_tower::policy::Ban;
/// use std::time::Duration;
/// let ban = Ban::new(20, Duration::from_secs(60), Duration::from_secs(600))?;
/// assert_eq!(ban.denials(), 20);
/// assert_eq!(ban.duration(), Duration::from_secs(600));
/// # Ok::<(), ratewarden_tower::QuotaError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ban {
    /// `denials` per `within`, counted under a sliding window.
    denials: Quota,
    /// One per `duration`: spent while the ban stands.
    banned: Quota,
}

impl Ban {
    /// Bans a key for `duration` once its limits denied it more than `denials` times within
    /// `within`.
    ///
    /// # Errors
    ///
    /// A [`QuotaError`] for figures no quota can hold: 0 denials, a zero `within` or
    /// `duration`, or more than a quota counts.
    ///
    /// ```
    /// use ratewarden_tower::policy::Ban;
    /// use std::time::Duration;
    /// assert!(Ban::new(0, Duration::from_secs(60), Duration::from_secs(60)).is_err());
    /// ```
    pub fn new(denials: u32, within: Duration, duration: Duration) -> Result<Self, QuotaError> {
        Ok(Self {
            denials: Quota::new(denials, within)?.with_algorithm(Algorithm::SlidingWindow)?,
            banned: Quota::new(1, duration)?.with_algorithm(Algorithm::SlidingLog)?,
        })
    }

    /// How many denials within [`within`](Self::within) a key may take before it is banned.
    ///
    /// See [`Ban`] for an example.
    #[must_use]
    pub const fn denials(&self) -> u32 {
        self.denials.count()
    }

    /// The window the denials are counted in.
    ///
    /// ```
    /// # use ratewarden_tower::policy::Ban;
    /// # use std::time::Duration;
    /// let ban = Ban::new(5, Duration::from_secs(10), Duration::from_secs(60))?;
    /// assert_eq!(ban.within(), Duration::from_secs(10));
    /// # Ok::<(), ratewarden_tower::QuotaError>(())
    /// ```
    #[must_use]
    pub const fn within(&self) -> Duration {
        self.denials.period()
    }

    /// How long a ban lasts.
    ///
    /// See [`Ban`] for an example.
    #[must_use]
    pub const fn duration(&self) -> Duration {
        self.banned.period()
    }

    /// The probe of `key`'s ban (`scope` names the ban of the key's extractor): denied while
    /// the ban stands.
    pub(crate) fn probe(&self, key: &Key, scope: u64) -> Limit {
        Limit::probe(key.clone().scoped(scope), self.banned, 1)
    }

    /// The counter of `key`'s denials (`scope` names the ban of its extractor).
    pub(crate) fn denial(&self, key: &Key, scope: u64) -> (Key, Quota) {
        (key.clone().scoped(scope ^ DENIALS), self.denials)
    }

    /// The state that bans `key` once checked (spent for `duration`).
    pub(crate) fn ban(&self, key: &Key, scope: u64) -> (Key, Quota) {
        (key.clone().scoped(scope), self.banned)
    }
}

/// What tells a key's denial counter from its ban, under one scope.
const DENIALS: u64 = 0x6465_6e69_616c_7321;

/// The scope of the bans of keys named `name` (by the layer's extractors): a key's ban holds
/// for every limit keyed by that extractor.
pub(crate) fn scope(name: &str) -> u64 {
    Key::scope_of(&format!("ban/{name}"))
}
