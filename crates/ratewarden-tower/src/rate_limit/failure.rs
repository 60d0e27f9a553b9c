//! [`FailureMode`]: what a layer does while its store cannot decide.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use ratewarden_core::{Decision, Key, Quota};
use ratewarden_memory::MemoryStore;

use super::Instances;

/// What a layer does when its store cannot decide: Redis down or slow, the pool exhausted, a
/// [`CircuitBreaker`](crate::breaker::CircuitBreaker) open. Chosen per layer, so a login route
/// can fail closed while reads fail open on the same store.
///
/// | mode | while the store fails |
/// |------|-----------------------|
/// | [`fallback`](Self::fallback) (the default, with `instances = 1`) | a local [`MemoryStore`](crate::MemoryStore) decides, enforcing `1 / instances` of the quota ([`Quota::share`]) |
/// | [`closed`](Self::closed) | `503 Service Unavailable` with `Retry-After: 1` (gRPC `UNAVAILABLE`), never a 429: the client did nothing wrong. [`closed_allowing`](Self::closed_allowing) lists keys that still go through |
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
/// `n - 1` per period. With a live count ([`Instances::live`], [`Instances::mesh`]), `n`
/// follows the gateways alive, and each move of it may add `⌈burst / n⌉` per key and
/// gateway (see [`Instances`]). The local stores start empty, so the quota the store had already given
/// out before the outage is not subtracted: in the worst case a key gets one extra burst at the
/// moment the store first fails.
///
/// From then on, spending is carried across every switch, so that a store that fails and
/// recovers over and over (a flapping link) never lets a gateway spend both counts: what the
/// store admits is charged to the fallback too (one local check more per admitted request,
/// only once the fallback has decided), and what the fallback admits is owed to the store and
/// charged with the key's next check there (at most a burst of it; a check that does not fit
/// with what is owed is denied, as the key has spent it). With `instances = 1`, a gateway then
/// admits at most the quota plus that one burst in any interval, however often the store
/// fails (tested against a proxy switching Redis on and off every 500 ms). Owed units are
/// kept for at most 100,000 keys and quotas at once, each until its quota would have
/// refilled them (past that, the store may admit them again anyway); beyond, a key's are
/// forgotten. A
/// check that carries owed units is a heavier check to its store: on a Redis key split
/// adaptively (`ratewarden_redis::HotKeys`), one heavier than a part's share of the burst is
/// denied until the split ends.
///
/// ```
/// use ratewarden_tower::rate_limit::FailureMode;
/// use ratewarden_tower::{Key, MemoryStore};
/// use std::num::NonZeroU32;
///
/// let api = FailureMode::default(); // each instance enforces the quota alone
/// let fleet = FailureMode::fallback(MemoryStore::new(), NonZeroU32::new(8).unwrap());
/// let login = FailureMode::closed_allowing([Key::from("health-checker")]);
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
        instances: Instances,
        /// What carries spending across a switch between the store and the fallback.
        carry: Arc<Carry>,
    },
}

/// What a fallback and its store tell each other, so that a gateway switching between them
/// (a store that fails and recovers repeatedly) never spends both counts: once the fallback
/// has decided for the first time, what the store admits is charged to the fallback too, and
/// what the fallback admits is owed to the store, under the quota it was admitted under, and
/// charged with the key's next check there under that quota.
#[derive(Default)]
struct Carry {
    /// Whether the fallback has ever decided: before, nothing is carried (no cost to a layer
    /// whose store never failed).
    engaged: AtomicBool,
    owed: Mutex<Owes>,
    /// How many keys owe: the map is locked only when some do.
    owing: AtomicUsize,
}

/// What keys owe, by key and quota.
#[derive(Default)]
struct Owes {
    map: HashMap<(Key, Quota), Owing>,
    /// When a full map was last swept of what no longer matters.
    swept: Option<Instant>,
}

/// Units owed, and until when they matter: once the quota has refilled them (a burst's span,
/// or two periods for windows), the store would admit them again anyway.
struct Owing {
    units: u32,
    until: Instant,
}

/// The most key and quota pairs that may owe units to the store at once: past it, a pair's
/// owed units are forgotten (the store may then admit them again), after a sweep (at most
/// once a second) of those that no longer matter.
const MAX_OWING_KEYS: usize = 100_000;

impl Carry {
    fn owed(&self) -> std::sync::MutexGuard<'_, Owes> {
        self.owed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes what `key` owes under `quota`, at most `room` units (the rest stays owed).
    fn take(&self, key: &Key, quota: &Quota, room: u32) -> u32 {
        if self.owing.load(Ordering::Relaxed) == 0 || room == 0 {
            return 0;
        }
        let mut owes = self.owed();
        let pair = (key.clone(), *quota);
        let Some(owing) = owes.map.get_mut(&pair) else {
            return 0;
        };
        let taken = if owing.until <= Instant::now() {
            owing.units = 0;
            0
        } else {
            owing.units.min(room)
        };
        owing.units -= taken;
        if owing.units == 0 {
            owes.map.remove(&pair);
        }
        self.owing.store(owes.map.len(), Ordering::Relaxed);
        taken
    }

    /// Adds `units` to what `key` owes under `quota`, up to its burst.
    fn owe(&self, key: &Key, quota: &Quota, units: u32) {
        if units == 0 {
            return;
        }
        let now = Instant::now();
        let mut owes = self.owed();
        let pair = (key.clone(), *quota);
        if owes.map.len() >= MAX_OWING_KEYS && !owes.map.contains_key(&pair) {
            if owes
                .swept
                .is_some_and(|at| now - at < Duration::from_secs(1))
            {
                return;
            }
            owes.swept = Some(now);
            owes.map.retain(|_, owing| owing.until > now);
            if owes.map.len() >= MAX_OWING_KEYS {
                return;
            }
        }
        let span = Duration::from_micros(quota.tolerance_micros()).max(quota.period() * 2);
        let owing = owes.map.entry(pair).or_insert(Owing {
            units: 0,
            until: now,
        });
        owing.units = owing.units.saturating_add(units).min(quota.burst());
        // (A span no `Instant` can hold: a day, far past any outage's news.)
        owing.until = (now.checked_add(span))
            .or_else(|| now.checked_add(Duration::from_secs(86_400)))
            .unwrap_or(now);
        self.owing.store(owes.map.len(), Ordering::Relaxed);
    }
}

/// Units a fallback admitted that a check of the store carries (see
/// [`FailureMode::carried`]): owed again when dropped, unless the store admitted the check
/// that carried them ([`FailureMode::decided`]), so that a request dropped before its answer
/// (a client gone, a timeout around the layer) never lets them escape.
#[derive(Default)]
pub(crate) struct Owed {
    units: u32,
    /// Where the units go back, and for which key and quota.
    back: Option<(Arc<Carry>, Key, Quota)>,
}

impl Owed {
    /// The units carried.
    pub(crate) const fn units(&self) -> u32 {
        self.units
    }
}

impl Drop for Owed {
    fn drop(&mut self) {
        if let Some((carry, key, quota)) = self.back.take() {
            carry.owe(&key, &quota, self.units);
        }
    }
}

impl Default for FailureMode {
    /// A local limit per instance: [`fallback`](Self::fallback) with `instances = 1`, on a
    /// store made when the store first fails.
    fn default() -> Self {
        Self {
            kind: Kind::Fallback {
                store: Arc::default(),
                instances: Instances::from(NonZeroU32::MIN),
                carry: Arc::default(),
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

    /// Answer `503` with `Retry-After: 1` while the store fails
    /// ([`closed_allowing`](Self::closed_allowing) lets some keys through).
    ///
    /// ```
    /// use ratewarden_tower::rate_limit::FailureMode;
    /// assert_eq!(format!("{:?}", FailureMode::closed()), "FailureMode::Closed { allowed: 0 }");
    /// ```
    #[must_use]
    pub fn closed() -> Self {
        Self::closed_allowing([])
    }

    /// [`closed`](Self::closed), except for `keys`, which go through (uncounted) while the
    /// store fails: health checkers, internal callers. Each names a client as the layer's
    /// extractor keys it ([`key_for`](crate::key::KeyExtractor::key_for)): with
    /// [`PeerIp`](crate::key::PeerIp) or [`ClientIp`](crate::key::ClientIp), an IPv6 address
    /// lets through its network (a /64 by default), which is one client to the layer.
    ///
    /// ```
    /// use ratewarden_tower::Key;
    /// use ratewarden_tower::rate_limit::FailureMode;
    /// use std::net::{IpAddr, Ipv4Addr};
    ///
    /// let mode = FailureMode::closed_allowing([Key::from(IpAddr::from(Ipv4Addr::new(10, 0, 0, 7)))]);
    /// assert_eq!(format!("{mode:?}"), "FailureMode::Closed { allowed: 1 }");
    /// ```
    #[must_use]
    pub fn closed_allowing(keys: impl IntoIterator<Item = Key>) -> Self {
        Self {
            kind: Kind::Closed {
                allow: Arc::new(keys.into_iter().collect()),
            },
        }
    }

    /// Decide locally while the store fails: `store` enforces [`Quota::share`]`(instances)`
    /// of each request's quota, so that `instances` gateways doing the same admit about the
    /// quota between them (see the type's docs for the bound). `instances` is a fixed number
    /// (a `NonZeroU32`) or a live count ([`Instances::live`], [`Instances::mesh`]: the
    /// gateways alive). Its denials are 429s like any other, and the rate-limit headers show
    /// the share. Give it its own `MemoryStore` (its bound, `max_memory`, applies).
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
    pub fn fallback(store: MemoryStore, instances: impl Into<Instances>) -> Self {
        Self {
            kind: Kind::Fallback {
                store: Arc::new(OnceLock::from(store)),
                instances: instances.into(),
                carry: Arc::default(),
            },
        }
    }

    /// The [allowed](Self::closed_allowing) keys as the layer's extractor keys its clients
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
            Kind::Fallback {
                store,
                instances,
                carry,
            } => {
                let share = quota.share(instances.get());
                let store = store.get_or_init(MemoryStore::new);
                carry.engaged.store(true, Ordering::Relaxed);
                let decision = store.check_sync(key, &share, cost);
                if decision.is_allowed() {
                    carry.owe(key, quota, cost);
                }
                Failed::Decided(decision, share)
            }
        }
    }

    /// What a check of `key` of `cost` under `quota` carries to the store: the units a
    /// fallback admitted for the key under that quota while the store failed (at most the
    /// burst less the cost), charged with the check. Give it back to
    /// [`decided`](Self::decided); dropped, the units are owed again.
    pub(crate) fn carried(&self, key: &Key, quota: &Quota, cost: u32) -> Owed {
        match &self.kind {
            Kind::Fallback { carry, .. } => {
                let units = carry.take(key, quota, quota.burst().saturating_sub(cost));
                Owed {
                    units,
                    back: (units > 0).then(|| (Arc::clone(carry), key.clone(), *quota)),
                }
            }
            Kind::Open | Kind::Closed { .. } => Owed::default(),
        }
    }

    /// The store answered a check of `key` of `cost` that carried `owed` with `decision`
    /// (`None`: it failed): admitted, the owed units are paid, and once the fallback has
    /// decided, the fallback counts what the store admitted; else they are owed still.
    pub(crate) fn decided(
        &self,
        key: &Key,
        quota: &Quota,
        (cost, mut owed): (u32, Owed),
        decision: Option<&Decision>,
    ) {
        let Kind::Fallback {
            store,
            instances,
            carry,
        } = &self.kind
        else {
            return;
        };
        if decision.is_some_and(Decision::is_allowed) {
            owed.back = None;
            if carry.engaged.load(Ordering::Relaxed)
                && let Some(store) = store.get()
            {
                let _ = store.check_sync(key, &quota.share(instances.get()), cost);
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
                write!(f, "FailureMode::Fallback {{ instances: {instances:?} }}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owed_units_that_no_longer_matter_make_room_for_new_keys() {
        // Reproduced: one-off keys filled the map for good, and from then on no key's units
        // were carried. Owed units matter until the quota would have refilled them.
        let carry = Carry::default();
        let brief = Quota::new(1, Duration::from_millis(1)).unwrap();
        for i in 0..MAX_OWING_KEYS as u64 {
            carry.owe(&Key::from(i), &brief, 1);
        }
        let (key, quota) = (Key::from("steady"), Quota::per_minute(10).unwrap());
        std::thread::sleep(Duration::from_millis(10));
        carry.owe(&key, &quota, 3);
        assert_eq!(carry.take(&key, &quota, 10), 3);
        assert!(carry.owed().map.is_empty(), "the expired were swept");
        // Expired units are not taken.
        carry.owe(&Key::from(1_u64), &brief, 1);
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(carry.take(&Key::from(1_u64), &brief, 1), 0);
    }
}
