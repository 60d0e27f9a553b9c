//! The denied-key cache: once Redis denies a key, this gateway answers that key itself until
//! the denial's retry time, without a round trip.
//!
//! Exact, never generous: a key Redis denied at `T` with a retry time `r` is denied by Redis
//! for any cost at least as large until `T + r` (time passing is the only thing that frees
//! quota; other gateways only spend more). The cache denies until its own clock's
//! `t + r`, where `t` is when the reply arrived here, which is after `T`: it answers "denied"
//! at most one network trip longer than Redis would, and never "allowed".

use ratewarden_core::{Decision, Info, Key, Quota, Timestamp};

use crate::per_key::{Expiring, PerKey};
use crate::time::between;

/// One denial: which quota and cost it was for, and until when it stands (this gateway's clock).
/// For a split key it covers the whole key, whichever part denied: a client told to retry
/// after `t` is not admitted by another part before `t`.
#[derive(Debug)]
struct Denial {
    quota: Quota,
    cost: u32,
    until: Timestamp,
    limit: u64,
    reset_at: Timestamp,
}

impl Expiring for Denial {
    fn quota(&self) -> &Quota {
        &self.quota
    }

    fn expires(&self) -> Timestamp {
        self.until
    }
}

/// Denials by key and quota, bounded by `max_keys`.
#[derive(Debug)]
pub(crate) struct DenyCache {
    denials: PerKey<Denial>,
    off: bool,
}

impl DenyCache {
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            denials: PerKey::new(max_keys),
            off: max_keys == 0,
        }
    }

    /// The cached denial of `cost` for `key` under `quota` at `now`, if one stands.
    pub(crate) fn get(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
        now: Timestamp,
    ) -> Option<Decision> {
        self.denials
            .read(key, quota, |denial| {
                (cost >= denial.cost && now < denial.until).then(|| {
                    Decision::Denied(Info::new(
                        denial.limit,
                        0,
                        between(now, denial.reset_at),
                        between(now, denial.until),
                    ))
                })
            })
            .flatten()
    }

    /// Remembers that Redis denied `cost` for `key` under `quota` with `info`, the reply
    /// having arrived at `now`. A full cache first drops expired denials (at most every 100
    /// ms); still full, it remembers nothing (which costs round trips, never accuracy).
    pub(crate) fn insert(&self, key: &Key, quota: Quota, cost: u32, info: &Info, now: Timestamp) {
        if self.off || info.retry_after().is_zero() {
            return;
        }
        let denial = Denial {
            quota,
            cost,
            until: now.saturating_add(info.retry_after()),
            limit: info.limit(),
            reset_at: now.saturating_add(info.reset_after()),
        };
        self.denials.insert(key, denial, now);
    }

    /// Forgets every denial of `key` (after a reset).
    pub(crate) fn remove(&self, key: &Key) {
        self.denials.remove(key);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.denials.len()
    }

    /// Whether the cache is off (`max_keys` 0): then it never holds anything.
    pub(crate) const fn is_off(&self) -> bool {
        self.off
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::per_key::SWEEP_EVERY;
    use std::time::Duration;

    fn info(retry_ms: u64) -> Info {
        Info::new(
            5,
            0,
            Duration::from_secs(1),
            Duration::from_millis(retry_ms),
        )
    }

    #[test]
    fn a_denial_stands_until_its_retry_time_for_that_cost_or_more() {
        let cache = DenyCache::new(10);
        let quota = Quota::per_second(5).unwrap();
        let key = Key::from(1_u64);
        let at = Timestamp::from_nanos;
        cache.insert(&key, quota, 2, &info(100), at(1_000));
        let hit = cache.get(&key, &quota, 2, at(1_000)).expect("cached");
        assert_eq!(hit.info().retry_after(), Duration::from_millis(100));
        assert!(cache.get(&key, &quota, 3, at(50_000_000)).is_some());
        let later = cache.get(&key, &quota, 2, at(50_001_000)).unwrap();
        assert_eq!(later.info().retry_after(), Duration::from_millis(50));
        // A smaller cost may fit sooner; another quota is another limit; the time passes.
        assert!(cache.get(&key, &quota, 1, at(1_000)).is_none());
        let other = Quota::per_second(6).unwrap();
        assert!(cache.get(&key, &other, 2, at(1_000)).is_none());
        assert!(cache.get(&key, &quota, 2, at(100_001_000)).is_none());
        // Quotas are remembered side by side.
        cache.insert(&key, other, 1, &info(100), at(1_000));
        assert!(cache.get(&key, &quota, 2, at(1_000)).is_some());
        assert!(cache.get(&key, &other, 1, at(1_000)).is_some());
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn a_full_cache_sweeps_expired_denials_and_otherwise_declines() {
        let cache = DenyCache::new(2);
        let quota = Quota::per_second(5).unwrap();
        let now = Timestamp::from_nanos(0).saturating_add(SWEEP_EVERY);
        let key = |n: u64| Key::from(n);
        cache.insert(&key(1), quota, 1, &info(1), now);
        cache.insert(&key(2), quota, 1, &info(1_000), now);
        // Full, and nothing expired yet: the third is not remembered.
        let soon = now.saturating_add(Duration::from_nanos(1));
        cache.insert(&key(3), quota, 1, &info(1_000), soon);
        assert_eq!(cache.len(), 2);
        assert!(cache.get(&key(3), &quota, 1, soon).is_none());
        // Later, the first has expired: a sweep makes room.
        let later = now.saturating_add(2 * SWEEP_EVERY);
        cache.insert(&key(3), quota, 1, &info(1_000), later);
        assert_eq!(cache.len(), 2);
        assert!(cache.get(&key(3), &quota, 1, later).is_some());
        cache.remove(&key(3));
        assert_eq!(cache.len(), 1);
    }
}
