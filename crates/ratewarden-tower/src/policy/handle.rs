//! [`PolicyHandle`]: the running policy, replaced whole, and what a replacement keeps checking.

use std::cell::OnceCell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::{ArcSwap, Cache};
use ratewarden_core::{Algorithm, Clock, MonotonicClock, Quota, Timestamp};

use super::definition::Policy;
use super::error::PolicyError;
use super::rule::NamedLimit;

/// A limit whose quota (or key) a reload changed, still checked under its previous quota
/// and key until `until`.
#[derive(Clone, Debug)]
pub(crate) struct Transition {
    pub(crate) previous: NamedLimit,
    pub(crate) until: Timestamp,
}

/// One policy, as every request that loads it sees it whole.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub(crate) policy: Arc<Policy>,
    pub(crate) version: u64,
    /// The previous quotas still checked, newest first.
    pub(crate) transitions: Vec<Transition>,
}

impl Snapshot {
    /// The previous forms of the limit `name` still checked `now`, newest first.
    pub(crate) fn previous<'a>(
        &'a self,
        name: &'a str,
        now: &Now<'_>,
    ) -> impl Iterator<Item = &'a NamedLimit> + 'a {
        // The clock is read only when there is a transition to time.
        let now = (!self.transitions.is_empty()).then(|| now.get());
        self.transitions
            .iter()
            .filter(move |t| t.previous.name() == name && now.is_some_and(|now| t.until > now))
            .map(|t| &t.previous)
    }
}

/// The time a request's transitions are decided by: the handle's clock, read once, when a
/// transition is first looked at.
pub(crate) struct Now<'a> {
    clock: &'a dyn Clock,
    read: OnceCell<Timestamp>,
}

impl Now<'_> {
    fn get(&self) -> Timestamp {
        *self.read.get_or_init(|| self.clock.now())
    }
}

/// How many times a [`PolicyHandle`] was given a new policy, by outcome.
///
/// ```
/// use ratewarden_tower::policy::{Policy, PolicyHandle, Rule};
/// let handle = PolicyHandle::new(Policy::new())?;
/// handle.store(Policy::new())?;
/// assert!(handle.store(Policy::new().rule(Rule::new().route("bad"))).is_err());
/// assert_eq!((handle.reloads().ok(), handle.reloads().error()), (1, 1));
/// # Ok::<(), ratewarden_tower::policy::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reloads {
    ok: u64,
    error: u64,
}

impl Reloads {
    /// Policies that replaced the running one.
    ///
    /// See the example on [`Reloads`].
    #[must_use]
    pub const fn ok(&self) -> u64 {
        self.ok
    }

    /// Policies refused (the running one stayed).
    ///
    /// See the example on [`Reloads`].
    #[must_use]
    pub const fn error(&self) -> u64 {
        self.error
    }
}

/// A [`PolicyHandle`]'s running policy, as one service caches it.
pub(crate) type SnapshotCache = Cache<Current, Arc<Snapshot>>;

/// The running policy's cell, for [`SnapshotCache`].
#[derive(Clone)]
pub(crate) struct Current(Arc<Shared>);

impl std::ops::Deref for Current {
    type Target = ArcSwap<Snapshot>;

    fn deref(&self) -> &Self::Target {
        &self.0.current
    }
}

struct Shared {
    current: ArcSwap<Snapshot>,
    clock: Arc<dyn Clock>,
    /// The key names of every layer built on this handle: a new policy must suit each.
    layers: Mutex<Vec<Vec<String>>>,
    /// Held while a policy is checked and stored, so that two stores never interleave.
    writing: Mutex<()>,
    ok: AtomicU64,
    error: AtomicU64,
}

/// The running [`Policy`] of one or more [`PolicyLayer`](super::PolicyLayer)s: a cheap
/// clone, whose [`store`](Self::store) replaces the whole policy at once. Each request loads
/// the policy once, so none ever sees part of one policy and part of another.
///
/// # Quota changes
///
/// A store keeps a key's state per limit name, key and quota, so a limit whose quota (or
/// key) a reload changes starts from a fresh bucket. So that a reload never hands out a
/// fresh quota, the layer keeps checking the limit's previous quota and key as well (in the
/// same [`check_all`](ratewarden_core::Store::check_all), same key, same cost) for the
/// previous quota's horizon after the reload: its period, or for GCRA and the token bucket
/// its burst × emission interval when that is longer. A change back to a quota still
/// checked ends its transition; a limit a reload removes is no longer checked.
///
/// The bound, for a change at time `t` with horizon `H` from quota `old` to quota `new`
/// (`old(L)` and `new(L)` being what each admits in an interval of length `L`):
///
/// - an interval that ends before `t + H` admits at most `old(L)`, and one that starts at or
///   after `t` at most `new(L)`: so every interval of length `L ≤ H` admits at most the larger
///   of the two;
/// - an interval that starts before `t` and ends after `t + H` admits at most
///   `old(t - start) + new(end - t)`: the old quota's bound for its part before the change
///   plus the new quota's for the rest;
/// - while both are checked, a request is admitted only when both admit it: at most the
///   smaller of the two (the under-admission during a transition).
///
/// A client that spends the old quota's burst just before a reload so gets no second burst
/// within `H`. Over longer intervals the two bounds add up, as any change of quota whose new
/// state starts without the old one's history allows. No state kept per quota can bound
/// every interval by the larger of `old(L)` and `new(L)` alone: a client that ran steadily
/// at `old`'s rate leaves `old`'s state as empty as an idle client's, yet under `new` (a
/// lower rate, a larger burst) it would have built up a debt. Both bounds are property
/// tests over random reloads (`tests/tower/policy.rs`); the first is the one that fails
/// when a change starts from a fresh state with no transition.
///
/// When one request would get more than [`MAX_LIMITS`](ratewarden_core::MAX_LIMITS) limits
/// with the previous quotas of changes in quick succession, the oldest previous quotas are
/// left out for that request.
///
/// ```
/// use ratewarden_tower::policy::{NamedLimit, Policy, PolicyHandle, Rule};
/// use ratewarden_tower::Quota;
///
/// let limit = |quota| Policy::new().otherwise(Rule::new().limit(NamedLimit::new("per-ip", "ip", quota)));
/// let handle = PolicyHandle::new(limit(Quota::per_minute(5)?))?;
/// handle.store(limit(Quota::per_minute(50)?))?;
/// assert_eq!(handle.policy().limits()[0].quota(), &Quota::per_minute(50)?);
/// // For a minute, requests are checked against 5/min too.
/// assert_eq!(handle.transitions(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct PolicyHandle {
    shared: Arc<Shared>,
}

impl PolicyHandle {
    /// A handle running `policy`, timing quota transitions on a monotonic clock.
    ///
    /// # Errors
    ///
    /// A [`PolicyError`] for a policy that cannot be used (key names are checked when a
    /// layer is built on the handle).
    ///
    /// See the example on [`PolicyHandle`].
    pub fn new(policy: Policy) -> Result<Self, PolicyError> {
        Self::with_clock(policy, MonotonicClock::new())
    }

    /// [`new`](Self::new), timing quota transitions on `clock`: give it the store's clock
    /// when it has one of its own (a [`ManualClock`](crate::ManualClock) in tests).
    ///
    /// # Errors
    ///
    /// As for [`new`](Self::new).
    ///
    /// ```
    /// use ratewarden_tower::policy::{Policy, PolicyHandle};
    /// use ratewarden_tower::{ManualClock, Timestamp};
    /// let handle = PolicyHandle::with_clock(Policy::new(), ManualClock::new(Timestamp::from_micros(0)))?;
    /// # let _ = handle;
    /// # Ok::<(), ratewarden_tower::policy::PolicyError>(())
    /// ```
    pub fn with_clock(policy: Policy, clock: impl Clock) -> Result<Self, PolicyError> {
        policy.check(None)?;
        Ok(Self {
            shared: Arc::new(Shared {
                current: ArcSwap::from_pointee(Snapshot {
                    policy: Arc::new(policy),
                    version: 0,
                    transitions: Vec::new(),
                }),
                clock: Arc::new(clock),
                layers: Mutex::default(),
                writing: Mutex::default(),
                ok: AtomicU64::new(0),
                error: AtomicU64::new(0),
            }),
        })
    }

    /// Replaces the running policy with `policy`, after checking it against the key names
    /// of every layer built on this handle. Refused, the running policy stays.
    ///
    /// # Errors
    ///
    /// The [`PolicyError`] that refused it (counted in [`reloads`](Self::reloads)).
    ///
    /// See the example on [`PolicyHandle`].
    pub fn store(&self, policy: Policy) -> Result<(), PolicyError> {
        let _writing = self
            .shared
            .writing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let checked = self.check(&policy);
        if let Err(err) = checked {
            self.shared.error.fetch_add(1, Ordering::Relaxed);
            super::observe::reload(false);
            return Err(err);
        }
        let now = self.shared.clock.now();
        let old = self.shared.current.load_full();
        let transitions = transitions(&old, &policy, now);
        self.shared.current.store(Arc::new(Snapshot {
            policy: Arc::new(policy),
            version: old.version + 1,
            transitions,
        }));
        self.shared.ok.fetch_add(1, Ordering::Relaxed);
        super::observe::reload(true);
        Ok(())
    }

    /// Counts a policy refused before it reached [`store`](Self::store) (a file that does
    /// not parse).
    #[cfg(feature = "policy-file")]
    pub(crate) fn refused(&self) {
        self.shared.error.fetch_add(1, Ordering::Relaxed);
        super::observe::reload(false);
    }

    fn check(&self, policy: &Policy) -> Result<(), PolicyError> {
        let layers = self
            .shared
            .layers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if layers.is_empty() {
            return policy.check(None);
        }
        for names in layers.iter() {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            policy.check(Some(&names))?;
        }
        Ok(())
    }

    /// Checks the running policy against a layer's key names and, if it suits them, makes
    /// every later policy meet them too.
    pub(crate) fn attach(&self, names: Vec<String>) -> Result<(), PolicyError> {
        let _writing = self
            .shared
            .writing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let borrowed: Vec<&str> = names.iter().map(String::as_str).collect();
        self.shared.current.load().policy.check(Some(&borrowed))?;
        self.shared
            .layers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(names);
        Ok(())
    }

    /// The running policy.
    ///
    /// See the example on [`PolicyHandle`].
    #[must_use]
    pub fn policy(&self) -> Arc<Policy> {
        Arc::clone(&self.shared.current.load().policy)
    }

    /// How many policies were stored since the handle was made: 0 for the first.
    ///
    /// ```
    /// use ratewarden_tower::policy::{Policy, PolicyHandle};
    /// let handle = PolicyHandle::new(Policy::new())?;
    /// handle.store(Policy::new())?;
    /// assert_eq!(handle.version(), 1);
    /// # Ok::<(), ratewarden_tower::policy::PolicyError>(())
    /// ```
    #[must_use]
    pub fn version(&self) -> u64 {
        self.shared.current.load().version
    }

    /// How many previous quotas are still checked now (see the type's docs).
    ///
    /// See the example on [`PolicyHandle`].
    #[must_use]
    pub fn transitions(&self) -> usize {
        let now = self.shared.clock.now();
        let snapshot = self.shared.current.load();
        snapshot
            .transitions
            .iter()
            .filter(|t| t.until > now)
            .count()
    }

    /// How many policies [`store`](Self::store) (and a watcher) took and refused, whatever
    /// the crate's features; with `metrics`, also counted as
    /// `ratewarden_policy_reloads_total{result="ok"|"error"}`.
    ///
    /// See the example on [`Reloads`].
    #[must_use]
    pub fn reloads(&self) -> Reloads {
        Reloads {
            ok: self.shared.ok.load(Ordering::Relaxed),
            error: self.shared.error.load(Ordering::Relaxed),
        }
    }

    /// The time to decide a request's transitions by, read when first asked.
    pub(crate) fn now(&self) -> Now<'_> {
        Now {
            clock: &*self.shared.clock,
            read: OnceCell::new(),
        }
    }

    /// A cache of the running policy, for one service: its load is a pointer compare until
    /// the policy changes.
    pub(crate) fn cache(&self) -> SnapshotCache {
        Cache::new(Current(Arc::clone(&self.shared)))
    }
}

impl fmt::Debug for PolicyHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyHandle")
            .field("version", &self.version())
            .field("reloads", &self.reloads())
            .finish_non_exhaustive()
    }
}

/// How long a quota's state keeps the traffic it admitted: its period, or for GCRA and the
/// token bucket its burst × emission interval when that is longer.
pub(crate) fn horizon(quota: &Quota) -> Duration {
    let period = quota.period();
    match quota.algorithm() {
        Algorithm::Gcra | Algorithm::TokenBucket => {
            period.max(Duration::from_micros(quota.tolerance_micros()))
        }
        _ => period,
    }
}

/// The previous quotas `new` must keep checking, replacing `old` at `now`.
fn transitions(old: &Snapshot, new: &Policy, now: Timestamp) -> Vec<Transition> {
    let current = new.limits();
    let running = old.policy.limits();
    let mut out: Vec<Transition> = Vec::new();
    for limit in &current {
        // The form just replaced, then those still checked from earlier reloads.
        let replaced = running
            .iter()
            .find(|l| l.name() == limit.name() && !l.same_as(limit))
            .map(|previous| Transition {
                previous: (*previous).clone(),
                until: now.saturating_add(horizon(previous.quota())),
            });
        let earlier = old
            .transitions
            .iter()
            .filter(|t| t.previous.name() == limit.name() && t.until > now)
            .cloned();
        for transition in replaced.into_iter().chain(earlier) {
            let same_as_current = transition.previous.same_as(limit);
            let seen = out.iter().any(|t| {
                t.previous.name() == limit.name() && t.previous.same_as(&transition.previous)
            });
            if !same_as_current && !seen {
                out.push(transition);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Rule;
    use ratewarden_core::ManualClock;

    fn one(quota: &str) -> Policy {
        Policy::new().otherwise(Rule::new().limit(NamedLimit::new(
            "per-ip",
            "ip",
            quota.parse().unwrap(),
        )))
    }

    #[test]
    fn a_changed_quota_is_checked_until_its_horizon() {
        let clock = ManualClock::new(Timestamp::from_micros(0));
        let handle = PolicyHandle::with_clock(one("5/min"), clock.clone()).unwrap();
        handle.store(one("50/min")).unwrap();
        assert_eq!(handle.transitions(), 1);
        clock.advance(Duration::from_secs(59));
        handle.store(one("500/min")).unwrap();
        assert_eq!(handle.transitions(), 2, "5/min for 1 s more, and 50/min");
        clock.advance(Duration::from_secs(1));
        assert_eq!(handle.transitions(), 1);
        // Back to a quota still checked: no transition to itself.
        handle.store(one("50/min")).unwrap();
        let (snapshot, now) = (handle.shared.current.load(), handle.now());
        let previous: Vec<_> = snapshot.previous("per-ip", &now).collect();
        assert_eq!(previous.len(), 1);
        assert_eq!(previous[0].quota(), &"500/min".parse::<Quota>().unwrap());
    }

    #[test]
    fn horizons_take_the_longer_of_period_and_burst() {
        let q = |s: &str| s.parse::<Quota>().unwrap();
        assert_eq!(horizon(&q("10/s burst 50")), Duration::from_secs(5));
        assert_eq!(horizon(&q("10/s")), Duration::from_secs(1));
        assert_eq!(horizon(&q("100/h fixed-window")), Duration::from_secs(3600));
    }
}
