//! Token leases: a gateway takes a batch of a key's quota from Redis in one round trip and
//! spends it locally until the batch runs out or the lease period ends.
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
//! Tokens left when a lease ends are forgotten (Redis has no way to take them back): that is
//! under-admission, at most `batch - 1` per gateway and period.

use std::num::NonZeroU32;
use std::time::Duration;

use std::sync::atomic::AtomicU64;

use dashmap::DashMap;
use foldhash::fast::RandomState;
use rl_core::{Decision, Info, Key, Quota};

use crate::deny_cache::sweep_due;

/// How many tokens to lease at a time and for how long; see [`RedisConfig::lease`](crate::RedisConfig::lease).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeasePolicy {
    pub(crate) batch: NonZeroU32,
    pub(crate) period: Duration,
}

/// What is left of one key's lease.
#[derive(Debug)]
struct Lease {
    quota: Quota,
    tokens: u32,
    expires: u64,
    limit: u64,
}

/// The leases this gateway holds, by key.
#[derive(Debug)]
pub(crate) struct Leases {
    map: DashMap<Key, Lease, RandomState>,
    pub(crate) policy: LeasePolicy,
    max_keys: usize,
    last_sweep: AtomicU64,
}

impl Leases {
    pub(crate) fn new(policy: LeasePolicy, max_keys: usize) -> Self {
        Self {
            map: DashMap::with_hasher(RandomState::default()),
            policy,
            max_keys,
            last_sweep: AtomicU64::new(0),
        }
    }

    /// Spends `cost` of `key`'s lease at `now`, if it holds that much.
    pub(crate) fn spend(&self, key: &Key, quota: &Quota, cost: u32, now: u64) -> Option<Decision> {
        let mut lease = self.map.get_mut(key)?;
        if lease.quota != *quota || now >= lease.expires || lease.tokens < cost {
            return None;
        }
        lease.tokens -= cost;
        Some(Decision::Allowed(Info::new(
            lease.limit,
            u64::from(lease.tokens),
            Duration::ZERO,
            Duration::ZERO,
        )))
    }

    /// Whether a request of `cost` should ask Redis for a whole batch (else for itself only).
    pub(crate) fn batch_for(&self, cost: u32) -> Option<u32> {
        let batch = self.policy.batch.get();
        (cost > 0 && cost < batch).then_some(batch)
    }

    /// Redis granted a batch for `key` at `now`, of which `cost` is spent at once.
    pub(crate) fn granted(&self, key: &Key, quota: Quota, cost: u32, info: &Info, now: u64) {
        if self.map.len() >= self.max_keys && !self.map.contains_key(key) {
            if !sweep_due(&self.last_sweep, now) {
                return;
            }
            self.map.retain(|_, lease| lease.expires > now);
            if self.map.len() >= self.max_keys {
                return;
            }
        }
        let period = u64::try_from(self.policy.period.as_nanos()).unwrap_or(u64::MAX);
        self.map.insert(
            key.clone(),
            Lease {
                quota,
                tokens: self.policy.batch.get() - cost,
                expires: now.saturating_add(period),
                limit: info.limit(),
            },
        );
    }

    /// Forgets `key`'s lease (after a reset).
    pub(crate) fn remove(&self, key: &Key) {
        self.map.remove(key);
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
        assert!(leases.spend(&key, &quota, 1, 0).is_none());
        assert_eq!(leases.batch_for(1), Some(10));
        assert_eq!(leases.batch_for(10), None);
        let info = Info::new(100, 90, Duration::ZERO, Duration::ZERO);
        leases.granted(&key, quota, 1, &info, 0);
        for left in (0..9).rev() {
            let d = leases.spend(&key, &quota, 1, 1_000).expect("leased");
            assert_eq!(d.info().remaining(), left);
        }
        assert!(leases.spend(&key, &quota, 1, 1_000).is_none(), "spent");
        leases.granted(&key, quota, 1, &info, 0);
        assert!(
            leases.spend(&key, &quota, 1, 100_000_000).is_none(),
            "expired"
        );
        assert!(
            leases
                .spend(&key, &Quota::per_second(5).unwrap(), 1, 0)
                .is_none()
        );
    }
}
