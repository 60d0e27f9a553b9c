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
//! under-admission, at most `batch - 1` per gateway, key and period. A gateway asks for a
//! batch only where the grant has a place to go (the lease map has room for the key) and no
//! other check of the key is asking for one, so that no granted batch is declined or
//! overwritten.

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

/// What is left of one key's lease under one quota, or a lease asked for and not yet granted.
#[derive(Debug)]
struct Lease {
    quota: Quota,
    tokens: u32,
    expires: Timestamp,
    limit: u64,
    /// A check has asked Redis for a batch: until its answer (or `expires`), other checks of
    /// the key ask for their cost only, so that no two grants of one key race to overwrite
    /// each other.
    asked: bool,
    /// The number of the last ask: a grant answers it, or (a reply read after another ask)
    /// is not recorded.
    ask: u64,
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
    /// The number of the next ask.
    asks: std::sync::atomic::AtomicU64,
}

impl Leases {
    pub(crate) fn new(policy: LeasePolicy, max_keys: usize) -> Self {
        Self {
            leases: PerKey::new(max_keys),
            policy,
            asks: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Spends `cost` of `key`'s lease under `quota` at `now`, if it holds that much (a lease
    /// asked for holds nothing yet).
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

    /// The batch a check of `cost` of `key` under `quota` at `now` asks Redis for, and the
    /// ask's number for [`granted`](Self::granted) (`None`: just its cost), never more than
    /// the quota's burst (which Redis could never grant at once). A check asks for a batch
    /// only where its grant has a place to go: the key holds no lease with tokens left (a
    /// lease too small for this cost is kept for smaller checks), no other check is asking
    /// for one, and the map has room for the key. It then holds the key's place until its
    /// grant, or for a lease period (at least until its call's `deadline`): a check dropped
    /// before its answer (Redis deducted its batch all the same) lets the key ask again only
    /// a period later, so that such checks lose at most a batch per period.
    pub(crate) fn batch_for(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
        (now, deadline): (Timestamp, Timestamp),
    ) -> Option<(u32, u64)> {
        let batch = self.policy.batch.get().min(quota.burst());
        if cost == 0 || cost >= batch {
            return None;
        }
        let held = deadline.max(now.saturating_add(self.policy.period));
        let ask = self.asks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let claim = |lease: &mut Lease| {
            let live = now < lease.expires;
            if live && (lease.asked || lease.tokens > 0) {
                return None;
            }
            (lease.tokens, lease.expires, lease.asked, lease.ask) = (0, held, true, ask);
            Some((batch, ask))
        };
        let asked = || {
            let lease = Lease {
                quota: *quota,
                tokens: 0,
                expires: held,
                limit: 0,
                asked: true,
                ask,
            };
            (lease, Some((batch, ask)))
        };
        self.leases.upsert(key, quota, now, claim, asked).flatten()
    }

    /// Redis answered ask number `ask` of `key` (`granted` units, of which `cost` are spent at
    /// once; `granted` 0 for a denial or an error), as sent at `now`: the rest is leased for
    /// the period from `now`, in the place the ask held. A reply to an older ask (read after
    /// its place went to another) is not recorded: its tokens' period, counted from its own
    /// call, is over or nearly.
    pub(crate) fn granted(
        &self,
        key: &Key,
        quota: &Quota,
        (granted, cost): (u32, u32),
        (limit, ask): (u64, u64),
        now: Timestamp,
    ) {
        let period = self.policy.period;
        self.leases.update(key, quota, |lease| {
            if lease.ask != ask {
                return;
            }
            lease.asked = false;
            lease.tokens = granted.saturating_sub(cost);
            lease.expires = now.saturating_add(period);
            lease.limit = limit;
        });
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
        let until = |t| (at(t), at(t + 50_000_000));
        assert!(leases.spend(&key, &quota, 1, at(0)).is_none());
        assert_eq!(
            leases.batch_for(&key, &quota, 10, until(0)),
            None,
            "no smaller"
        );
        let (batch, ask) = leases.batch_for(&key, &quota, 1, until(0)).unwrap();
        assert_eq!(batch, 10);
        // Asked for: other checks ask for their cost only, until the grant or the deadline.
        assert_eq!(leases.batch_for(&key, &quota, 1, until(0)), None);
        assert!(leases.spend(&key, &quota, 1, at(0)).is_none());
        leases.granted(&key, &quota, (10, 1), (100, ask), at(0));
        for left in (0..9).rev() {
            let d = leases.spend(&key, &quota, 1, at(1_000)).expect("leased");
            assert_eq!(d.info().remaining(), left);
        }
        assert!(leases.spend(&key, &quota, 1, at(1_000)).is_none(), "spent");
        let (_, ask) = leases.batch_for(&key, &quota, 1, until(1_000)).unwrap();
        leases.granted(&key, &quota, (10, 1), (100, ask), at(0));
        assert!(
            leases.spend(&key, &quota, 1, at(100_000_000)).is_none(),
            "expired"
        );
        // Another quota of the key has its own lease.
        let other = Quota::per_second(5).unwrap();
        assert!(leases.spend(&key, &other, 1, at(0)).is_none());
        let (_, ask) = leases.batch_for(&key, &other, 1, until(0)).unwrap();
        leases.granted(&key, &other, (4, 1), (5, ask), at(0));
        assert!(leases.spend(&key, &other, 2, at(0)).is_some());
        // A lease too small for a check is kept for smaller ones.
        assert_eq!(leases.batch_for(&key, &other, 2, until(0)), None);
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
        let (key, at) = (
            Key::from(1_u64),
            (Timestamp::from_nanos(0), Timestamp::from_nanos(9)),
        );
        assert_eq!(leases.batch_for(&key, &small, 8, at), None);
        assert_eq!(
            leases
                .batch_for(&key, &small, 1, at)
                .map(|(batch, _)| batch),
            Some(8)
        );
    }
}
