//! [`PerKey`]: what a gateway remembers per key and quota for a while, in bounded memory. The
//! denied-key cache, the leases and the known splits of hot keys each keep one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use foldhash::fast::RandomState;
use ratewarden_core::{Key, Quota, Timestamp};

use crate::time::between;

/// How often a full map may be swept for expired entries.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// An entry of a [`PerKey`] map: for one quota of a key, until a time.
pub(crate) trait Expiring {
    /// The quota the entry is for: a key holds at most one entry per quota.
    fn quota(&self) -> &Quota;
    /// When the entry stops counting (this gateway's clock).
    fn expires(&self) -> Timestamp;
}

/// Entries by key, at most one per quota of the key (almost always one in all), for at most
/// `max_keys` keys: looked up by `&Key`, with no copy of the key per lookup. A full map drops
/// its expired entries (at most once per [`SWEEP_EVERY`], by one caller: a flood of new keys
/// must not turn every insert into a scan) before it takes a new key; still full, it declines.
#[derive(Debug)]
pub(crate) struct PerKey<V> {
    map: DashMap<Key, Vec<V>, RandomState>,
    max_keys: usize,
    /// When the map was last swept, in nanoseconds.
    last_sweep: AtomicU64,
}

impl<V: Expiring> PerKey<V> {
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            map: DashMap::with_hasher(RandomState::default()),
            max_keys,
            last_sweep: AtomicU64::new(0),
        }
    }

    /// `f` of `key`'s entry for `quota`, expired or not.
    pub(crate) fn read<R>(&self, key: &Key, quota: &Quota, f: impl FnOnce(&V) -> R) -> Option<R> {
        let entries = self.map.get(key)?;
        entries.iter().find(|entry| entry.quota() == quota).map(f)
    }

    /// `f` of `key`'s entry for `quota`, expired or not, which it may change.
    pub(crate) fn update<R>(
        &self,
        key: &Key,
        quota: &Quota,
        f: impl FnOnce(&mut V) -> R,
    ) -> Option<R> {
        let mut entries = self.map.get_mut(key)?;
        entries
            .iter_mut()
            .find(|entry| entry.quota() == quota)
            .map(f)
    }

    /// Puts `entry` in place of `key`'s entry for its quota at `now`, and drops the key's
    /// expired entries; whether the map took it (a full map may decline a new key).
    pub(crate) fn insert(&self, key: &Key, entry: V, now: Timestamp) -> bool {
        if !self.has_room_for(key, now) {
            return false;
        }
        let quota = *entry.quota();
        let mut entries = self.map.entry(key.clone()).or_default();
        entries.retain(|held| *held.quota() != quota && held.expires() > now);
        entries.push(entry);
        true
    }

    /// In one step under the key's lock: `update` of `key`'s entry for `quota`, expired or
    /// not, or where it has none, the entry `insert` makes (dropping the key's expired
    /// entries) and what `insert` says; `None` when a full map declines the key.
    pub(crate) fn upsert<R>(
        &self,
        key: &Key,
        quota: &Quota,
        now: Timestamp,
        update: impl FnOnce(&mut V) -> R,
        insert: impl FnOnce() -> (V, R),
    ) -> Option<R> {
        if !self.has_room_for(key, now) {
            return None;
        }
        let mut entries = self.map.entry(key.clone()).or_default();
        if let Some(entry) = entries.iter_mut().find(|entry| entry.quota() == quota) {
            return Some(update(entry));
        }
        let (entry, said) = insert();
        entries.retain(|held| held.expires() > now);
        entries.push(entry);
        Some(said)
    }

    /// Whether the map holds `key`, or has room for it at `now` (after a sweep, if one is
    /// due).
    fn has_room_for(&self, key: &Key, now: Timestamp) -> bool {
        if self.map.len() < self.max_keys || self.map.contains_key(key) {
            return true;
        }
        if !self.sweep_due(now) {
            return false;
        }
        self.map
            .retain(|_, entries| entries.iter().any(|entry| entry.expires() > now));
        self.map.len() < self.max_keys
    }

    /// Forgets `key`, and returns its entries.
    pub(crate) fn remove(&self, key: &Key) -> Vec<V> {
        self.map
            .remove(key)
            .map(|(_, entries)| entries)
            .unwrap_or_default()
    }

    /// `f` of every key and its entries, where it gives something.
    pub(crate) fn collect<R>(&self, mut f: impl FnMut(&Key, &[V]) -> Option<R>) -> Vec<R> {
        self.map
            .iter()
            .filter_map(|entry| f(entry.key(), entry.value()))
            .collect()
    }

    /// How many keys the map holds (expired ones included until swept).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the map may be swept at `now`: the last sweep was at least [`SWEEP_EVERY`] ago,
    /// and no other caller sweeps it instead.
    fn sweep_due(&self, now: Timestamp) -> bool {
        let last = self.last_sweep.load(Ordering::Relaxed);
        between(Timestamp::from_nanos(last), now) >= SWEEP_EVERY
            && self
                .last_sweep
                .compare_exchange(last, now.as_nanos(), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Until(Quota, Timestamp);

    impl Expiring for Until {
        fn quota(&self) -> &Quota {
            &self.0
        }
        fn expires(&self) -> Timestamp {
            self.1
        }
    }

    #[test]
    fn one_entry_per_quota_of_a_key_and_a_full_map_sweeps_at_most_every_100_ms() {
        let map = PerKey::new(2);
        let (q1, q2) = (Quota::per_second(1).unwrap(), Quota::per_second(2).unwrap());
        let at = Timestamp::from_nanos;
        let start = at(0).saturating_add(SWEEP_EVERY);
        let after = |ms| start.saturating_add(Duration::from_millis(ms));
        let key = |n: u64| Key::from(n);
        assert!(map.insert(&key(1), Until(q1, at(u64::MAX)), start));
        assert!(map.insert(&key(1), Until(q2, after(1)), start));
        assert!(map.insert(&key(1), Until(q1, after(1)), start), "replaced");
        assert_eq!(map.read(&key(1), &q1, |u| u.1), Some(after(1)));
        assert_eq!(map.update(&key(1), &q2, |u| u.1), Some(after(1)));
        assert!(map.insert(&key(2), Until(q1, at(u64::MAX)), start));
        // Full, nothing expired: swept in vain, and a new key declined.
        assert!(!map.insert(&key(3), Until(q1, at(u64::MAX)), start));
        // Key 1 has expired, but the last sweep was too recent.
        assert!(!map.insert(&key(3), Until(q1, at(u64::MAX)), after(50)));
        assert_eq!(map.len(), 2);
        assert!(map.insert(&key(3), Until(q1, at(u64::MAX)), after(100)));
        assert!(map.read(&key(1), &q1, |_| ()).is_none(), "swept");
        assert_eq!(map.remove(&key(3)).len(), 1);
        assert_eq!(map.collect(|k, _| Some(k.clone())), vec![key(2)]);
    }
}
