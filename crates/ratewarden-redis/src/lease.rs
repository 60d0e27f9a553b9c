//! Token leases: a gateway takes a batch of a key's quota from Redis in one round trip and
//! spends it locally until the batch runs out or the lease period ends. The period counts
//! from when the call was sent, before Redis granted the batch, so that a reply read late (its
//! check's future held before it is polled) never spends its tokens past `grant + period`.
//!
//! Redis deducts a batch when it grants it, so leases never create quota; they move its use
//! later by at most one period. A request admitted at `t` spends a token granted in
//! `[t - period, t]`; Redis grants at most `burst + rate × (w + period)` in any interval of
//! length `w + period`; so in any interval of length `w` the fleet admits at most
//! `burst + rate × w` (the quota) plus an overshoot of at most `rate × period`, and never more
//! than the tokens the gateways held at the interval's start (`gateways × batch`) beyond what
//! Redis granted inside it:
//!
//! `overshoot ≤ min(rate × period, gateways × batch)`
//!
//! A batch is never larger than the quota's burst, and Redis grants what it has up to the
//! batch (at least the cost) in the same round trip: a check costs one round trip at most.
//! Tokens left when a lease ends are forgotten (Redis has no way to take them back): that is
//! under-admission, at most `batch - 1` per gateway and period.

use std::num::NonZeroU32;
use std::time::Duration;

use ratewarden_core::{Decision, Info, Key, Quota, Timestamp};

use crate::per_key::{Expiring, PerKey};

/// How many tokens to lease at a time and for how long; see [`RedisConfig::lease`](crate::RedisConfig::lease).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeasePolicy {
    pub(crate) batch: NonZeroU32,
    pub(crate) period: Duration,
}

/// What is left of one key's lease under one quota.
#[derive(Debug)]
struct Lease {
    quota: Quota,
    tokens: u32,
    expires: Timestamp,
    limit: u64,
}

impl Expiring for Lease {
    fn quota(&self) -> &Quota {
        &self.quota
    }

    fn expires(&self) -> Timestamp {
        self.expires
    }
}

/// The leases this gateway holds, by key (one per quota of the key), for at most `max_keys`
/// keys.
#[derive(Debug)]
pub(crate) struct Leases {
    leases: PerKey<Lease>,
    policy: LeasePolicy,
}

impl Leases {
    pub(crate) fn new(policy: LeasePolicy, max_keys: usize) -> Self {
        Self {
            leases: PerKey::new(max_keys),
            policy,
        }
    }

    /// Spends `cost` of `key`'s lease under `quota` at `now`, if it holds that much.
    pub(crate) fn spend(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
        now: Timestamp,
    ) -> Option<Decision> {
        self.leases
            .update(key, quota, |lease| {
                if now >= lease.expires || lease.tokens < cost {
                    return None;
                }
                lease.tokens -= cost;
                Some(Decision::Allowed(Info::new(
                    lease.limit,
                    u64::from(lease.tokens),
                    Duration::ZERO,
                    Duration::ZERO,
                )))
            })
            .flatten()
    }

    /// The batch a check of `cost` under `quota` asks Redis for (`None`: just its cost): never
    /// more than the quota's burst, which Redis could never grant at once.
    pub(crate) fn batch_for(&self, quota: &Quota, cost: u32) -> Option<u32> {
        let batch = self.policy.batch.get().min(quota.burst());
        (cost > 0 && cost < batch).then_some(batch)
    }

    /// Redis granted `granted` units of `key`'s quota at `now` or after (the time the call
    /// was sent), of which `cost` are spent at once: the rest is leased for the period from
    /// `now`.
    pub(crate) fn granted(
        &self,
        key: &Key,
        quota: Quota,
        (granted, cost): (u32, u32),
        info: &Info,
        now: Timestamp,
    ) {
        let tokens = granted.saturating_sub(cost);
        if tokens == 0 {
            return;
        }
        let lease = Lease {
            quota,
            tokens,
            expires: now.saturating_add(self.policy.period),
            limit: info.limit(),
        };
        // A full map may decline: the tokens are then forgotten (under-admission, never over).
        self.leases.insert(key, lease, now);
    }

    /// Forgets `key`'s leases (after a reset).
    pub(crate) fn remove(&self, key: &Key) {
        self.leases.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_spent_locally_until_empty_or_expired() {
        let policy = LeasePolicy {
            batch: NonZeroU32::new(10).unwrap(),
            period: Duration::from_millis(100),
        };
        let leases = Leases::new(policy, 100);
        let (key, quota) = (Key::from(1_u64), Quota::per_second(100).unwrap());
        let at = Timestamp::from_nanos;
        assert!(leases.spend(&key, &quota, 1, at(0)).is_none());
        assert_eq!(leases.batch_for(&quota, 1), Some(10));
        assert_eq!(leases.batch_for(&quota, 10), None);
        let info = Info::new(100, 90, Duration::ZERO, Duration::ZERO);
        leases.granted(&key, quota, (10, 1), &info, at(0));
        for left in (0..9).rev() {
            let d = leases.spend(&key, &quota, 1, at(1_000)).expect("leased");
            assert_eq!(d.info().remaining(), left);
        }
        assert!(leases.spend(&key, &quota, 1, at(1_000)).is_none(), "spent");
        leases.granted(&key, quota, (10, 1), &info, at(0));
        assert!(
            leases.spend(&key, &quota, 1, at(100_000_000)).is_none(),
            "expired"
        );
        // Another quota of the key has its own lease.
        let other = Quota::per_second(5).unwrap();
        assert!(leases.spend(&key, &other, 1, at(0)).is_none());
        leases.granted(&key, other, (3, 1), &info, at(0));
        assert!(leases.spend(&key, &other, 2, at(0)).is_some());
        assert!(leases.spend(&key, &quota, 1, at(0)).is_some());
    }

    #[test]
    fn a_batch_is_never_larger_than_the_burst() {
        let policy = LeasePolicy {
            batch: NonZeroU32::new(50).unwrap(),
            period: Duration::from_millis(100),
        };
        let leases = Leases::new(policy, 100);
        let small = Quota::per_second(100).unwrap().with_burst(8).unwrap();
        assert_eq!(leases.batch_for(&small, 1), Some(8));
        assert_eq!(leases.batch_for(&small, 8), None);
    }
}
