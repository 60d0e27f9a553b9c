//! A sharded hash table of key -> [`Slot`] whose every byte is charged to a [`Budget`]: it
//! grows only while the budget allows, sweeps a few buckets per insertion (never the whole
//! table at once), gives memory back when it turns sparse, and makes room for a new key by
//! evicting the sampled entry closest to fresh.
//!
//! Built on `hashbrown`'s `HashTable` rather than a concurrent map crate: the budget needs the
//! table's exact allocation size, and the bounded sweeps and sampled evictions need to visit
//! buckets by index, which `hashbrown` offers safely and `dashmap` does not.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use foldhash::fast::RandomState;
use hashbrown::HashTable;

use crate::keys::StoredKey;
use crate::slot::Slot;

/// Buckets a shard sweeps, for fresh entries, each time a key is inserted into it.
const SWEEP_STEP: usize = 8;
/// Entries an eviction looks at (like Redis's `maxmemory-samples`).
const EVICTION_SAMPLES: usize = 5;
/// Random buckets an eviction probes to find its samples before it scans.
const EVICTION_PROBES: usize = 64;
/// How many ways an insertion tries to make room (each: evict, rehash, grow or rebuild).
const MAX_ROUNDS: usize = 12;

/// How many entries `hashbrown` holds in `buckets` buckets before it must grow.
const fn full_capacity(buckets: usize) -> usize {
    if buckets < 8 {
        buckets.saturating_sub(1)
    } else {
        buckets / 8 * 7
    }
}

/// The memory a store may use, and what it uses now, in bytes; shared by all its tables.
#[derive(Debug)]
pub(crate) struct Budget {
    max: usize,
    used: AtomicUsize,
    keys: AtomicUsize,
    evictions: AtomicU64,
}

impl Budget {
    pub(crate) const fn new(max: usize) -> Self {
        Self {
            max,
            used: AtomicUsize::new(0),
            keys: AtomicUsize::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// Takes `bytes` from the budget if it has them.
    pub(crate) fn try_charge(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.max)
            })
            .is_ok()
    }

    /// Records `bytes` in use whatever the budget says: a growth a little larger than
    /// predicted, or what a store needs before its first key.
    pub(crate) fn charge(&self, bytes: usize) {
        self.used.fetch_add(bytes, Ordering::AcqRel);
    }

    pub(crate) fn refund(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    pub(crate) const fn max(&self) -> usize {
        self.max
    }

    pub(crate) fn keys(&self) -> usize {
        self.keys.load(Ordering::Acquire)
    }

    pub(crate) fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Acquire)
    }
}

/// What a store's global sweep needs of a table, whatever its key and slot types.
pub(crate) trait Sweep: Send + Sync {
    /// Sweeps a few buckets of the table's next shard, if no one holds it.
    fn sweep_step(&self, now: u64, budget: &Budget);
    /// Forgets every fresh entry; returns how many.
    fn sweep_all(&self, now: u64, budget: &Budget) -> usize;
    /// Evicts one entry (sampled, closest to fresh) from the first shard, from a rotating
    /// start, that no one holds and that has one; false when none could.
    fn evict_any(&self, now: u64, budget: &Budget) -> bool;
}

/// A table of `K` -> `V`, in shards that each take a lock of their own.
pub(crate) struct Table<K, V> {
    shards: Box<[Shard<K, V>]>,
    hasher: RandomState,
    /// The allocation of the smallest non-empty table: pre-paid for every shard, so that a
    /// shard can always take its first key.
    min_alloc: usize,
    /// The shard the next global sweep step visits.
    next_sweep: AtomicUsize,
}

/// One shard, on cache lines of its own.
#[repr(align(128))]
struct Shard<K, V>(RwLock<Entries<K, V>>);

struct Entries<K, V> {
    table: HashTable<(K, V)>,
    /// Bytes charged to the budget for `table`'s allocation: at least `min_alloc`.
    charged: usize,
    /// The bucket the next sweep step starts at.
    cursor: usize,
}

impl<K: StoredKey, V: Slot> Table<K, V> {
    /// A table of `shards` shards (a power of two), and the bytes it costs before its first
    /// key: what the caller must charge the budget.
    pub(crate) fn new(shards: usize, hasher: RandomState) -> (Self, usize) {
        let min_alloc = HashTable::<(K, V)>::with_capacity(1).allocation_size();
        let table = Self {
            shards: (0..shards)
                .map(|_| {
                    Shard(RwLock::new(Entries {
                        table: HashTable::new(),
                        charged: min_alloc,
                        cursor: 0,
                    }))
                })
                .collect(),
            hasher,
            min_alloc,
            next_sweep: AtomicUsize::new(0),
        };
        let fixed = shards * (size_of::<Shard<K, V>>() + min_alloc) + size_of::<Self>();
        (table, fixed)
    }

    /// The hash a key (or a borrowed form that hashes alike) is stored under.
    #[inline]
    pub(crate) fn hash<Q: Hash + ?Sized>(&self, probe: &Q) -> u64 {
        self.hasher.hash_one(probe)
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Shard<K, V> {
        // Bits the hash table itself does not use to pick a bucket or its control byte.
        let index = (hash >> 32) as usize & (self.shards.len() - 1);
        &self.shards[index]
    }

    /// Runs `f` on the slot of `probe`, if there is one (under the shard's shared lock).
    #[inline]
    pub(crate) fn get<Q, R>(&self, hash: u64, probe: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let entries = self.shard(hash).read();
        entries
            .table
            .find(hash, |(key, _)| key.borrow() == probe)
            .map(|(_, slot)| f(slot))
    }

    /// Runs `f` on the slot of `probe`, creating the entry (from `entry()`) if it is not
    /// there. Room is made within the budget: by sweeping a few buckets, growing the shard if
    /// the budget allows, else evicting sampled entries of this shard. `None` when no room can
    /// be made (the shard holds nothing to evict, and the budget is spent).
    pub(crate) fn get_or_insert<Q, R>(
        &self,
        hash: u64,
        probe: &Q,
        entry: impl FnOnce() -> (K, V),
        now: u64,
        budget: &Budget,
        f: impl FnOnce(&V) -> R,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let mut entries = self.shard(hash).write();
        if let Some((_, slot)) = entries.table.find(hash, |(key, _)| key.borrow() == probe) {
            return Some(f(slot));
        }
        entries.sweep(SWEEP_STEP, now, budget, &self.hasher, self.min_alloc);
        let entry = entry();
        let heap = entry.0.heap_bytes() + entry.1.heap_bytes();
        if !entries.make_room(heap, now, budget, &self.hasher, self.min_alloc) {
            return None;
        }
        budget.keys.fetch_add(1, Ordering::AcqRel);
        let hasher = |(key, _): &(K, V)| self.hasher.hash_one(key);
        let inserted = entries.table.insert_unique(hash, entry, hasher);
        Some(f(&inserted.get().1))
    }

    /// Forgets `probe`'s entry; returns whether there was one.
    pub(crate) fn remove<Q>(&self, hash: u64, probe: &Q, budget: &Budget) -> bool
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let mut entries = self.shard(hash).write();
        match entries
            .table
            .find_entry(hash, |(key, _)| key.borrow() == probe)
        {
            Ok(entry) => {
                let (removed, _) = entry.remove();
                forget(&removed, budget);
                true
            }
            Err(_) => false,
        }
    }
}

impl<K: StoredKey, V: Slot> Sweep for Table<K, V> {
    fn sweep_step(&self, now: u64, budget: &Budget) {
        let index = self.next_sweep.fetch_add(1, Ordering::Relaxed) & (self.shards.len() - 1);
        // Someone holds this shard: its own insertions sweep it.
        if let Ok(mut entries) = self.shards[index].0.try_write() {
            entries.sweep(SWEEP_STEP, now, budget, &self.hasher, self.min_alloc);
        }
    }

    fn evict_any(&self, now: u64, budget: &Budget) -> bool {
        let start = self.next_sweep.fetch_add(1, Ordering::Relaxed);
        (0..self.shards.len()).any(|i| {
            let index = start.wrapping_add(i) & (self.shards.len() - 1);
            // Never wait for a shard: the caller may hold another one.
            self.shards[index]
                .0
                .try_write()
                .is_ok_and(|mut entries| entries.evict_one(now, budget))
        })
    }

    fn sweep_all(&self, now: u64, budget: &Budget) -> usize {
        let mut freed = 0;
        for shard in &self.shards {
            let mut entries = shard.write();
            let before = entries.table.len();
            entries.table.retain(|entry| {
                let fresh = entry.1.fresh_at() <= now;
                if fresh {
                    forget(entry, budget);
                }
                !fresh
            });
            freed += before - entries.table.len();
            entries.shrink_if_sparse(budget, &self.hasher, self.min_alloc);
        }
        freed
    }
}

impl<K, V> Shard<K, V> {
    #[inline]
    fn read(&self) -> RwLockReadGuard<'_, Entries<K, V>> {
        // Entries stay consistent whatever panics: a poisoned lock is still good.
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Entries<K, V>> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Returns a removed entry's bytes to the budget.
fn forget<K: StoredKey, V: Slot>((key, slot): &(K, V), budget: &Budget) {
    budget.refund(key.heap_bytes() + slot.heap_bytes());
    budget.keys.fetch_sub(1, Ordering::AcqRel);
}

impl<K: StoredKey, V: Slot> Entries<K, V> {
    /// Makes room for one more entry owning `heap` bytes, within the budget: in the table as
    /// it is, or by clearing tombstones, or by growing it if the budget allows, or else by
    /// evicting. False when no room can be made (nothing left to evict).
    fn make_room(
        &mut self,
        heap: usize,
        now: u64,
        budget: &Budget,
        hasher: &RandomState,
        min_alloc: usize,
    ) -> bool {
        let hash = |(key, _): &(K, V)| hasher.hash_one(key);
        for _ in 0..MAX_ROUNDS {
            if self.table.len() < self.table.capacity() {
                if budget.try_charge(heap) {
                    return true;
                }
                // Room in the table, not in the budget: free what other keys own.
                if !self.evict_one(now, budget) {
                    return false;
                }
                continue;
            }
            let full = full_capacity(self.table.num_buckets());
            if self.table.len() < full / 2 {
                // The room is taken by removed entries' tombstones: `hashbrown` rehashes in
                // place at up to half its full capacity, without a byte more.
                self.table.reserve(1, hash);
                self.settle(budget, min_alloc);
                continue;
            }
            // Growing doubles the buckets (a first allocation is pre-paid).
            let allocated = self.table.allocation_size();
            let grown = if allocated == 0 {
                min_alloc
            } else {
                allocated * 2
            };
            let growth = grown.saturating_sub(self.charged);
            if budget.try_charge(growth) {
                self.charged += growth;
                self.table.reserve(1, hash);
                self.settle(budget, min_alloc);
                continue;
            }
            // No room and no budget: evict a sixteenth of the shard (the sampled entries
            // closest to fresh), then clear the tombstones, so that the next sixteenth of
            // insertions need no eviction.
            for _ in 0..(full / 16).max(1) {
                if !self.evict_one(now, budget) {
                    return false;
                }
            }
            self.rebuild(hasher);
        }
        false
    }

    /// Rebuilds the table at its size: the same memory, without tombstones. For a moment
    /// the old table and the new one are both allocated.
    fn rebuild(&mut self, hasher: &RandomState) {
        let capacity = full_capacity(self.table.num_buckets());
        let old = std::mem::replace(&mut self.table, HashTable::with_capacity(capacity));
        for entry in old {
            self.table
                .insert_unique(hasher.hash_one(&entry.0), entry, |(key, _)| {
                    hasher.hash_one(key)
                });
        }
        self.cursor = 0;
    }

    /// Makes what is charged for the allocation equal what is allocated (at least the
    /// pre-paid first allocation).
    fn settle(&mut self, budget: &Budget, min_alloc: usize) {
        let actual = self.table.allocation_size().max(min_alloc);
        if actual > self.charged {
            budget.charge(actual - self.charged);
        } else {
            budget.refund(self.charged - actual);
        }
        self.charged = actual;
    }

    /// Forgets the fresh entries among the next `buckets` buckets, then gives memory back if
    /// the shard has turned sparse.
    fn sweep(
        &mut self,
        buckets: usize,
        now: u64,
        budget: &Budget,
        hasher: &RandomState,
        min_alloc: usize,
    ) {
        let total = self.table.num_buckets();
        for _ in 0..buckets.min(total) {
            let index = self.cursor % total;
            self.cursor = self.cursor.wrapping_add(1);
            let fresh = self
                .table
                .get_bucket(index)
                .is_some_and(|(_, slot)| slot.fresh_at() <= now);
            if fresh && let Ok(entry) = self.table.get_bucket_entry(index) {
                let (removed, _) = entry.remove();
                forget(&removed, budget);
            }
        }
        self.shrink_if_sparse(budget, hasher, min_alloc);
    }

    /// Below an eighth full, the shard moves to a table half full: its memory goes back to
    /// the budget, for any table to use.
    fn shrink_if_sparse(&mut self, budget: &Budget, hasher: &RandomState, min_alloc: usize) {
        if self.table.allocation_size() > min_alloc
            && self.table.len() * 8 < self.table.num_buckets()
        {
            self.table
                .shrink_to(self.table.len() * 2, |(key, _): &(K, V)| {
                    hasher.hash_one(key)
                });
            self.cursor = 0;
            self.settle(budget, min_alloc);
        }
    }

    /// Evicts the entry closest to fresh among a few sampled ones; false when the shard is
    /// empty. Evicting an entry that is not fresh yet forgets what its key has spent: counted
    /// in [`Budget::evictions`].
    fn evict_one(&mut self, now: u64, budget: &Budget) -> bool {
        let total = self.table.num_buckets();
        if self.table.is_empty() || total == 0 {
            return false;
        }
        let mut best: Option<(u64, usize)> = None;
        let mut sampled = 0;
        for _ in 0..EVICTION_PROBES {
            let index = fastrand::usize(..total);
            if let Some((_, slot)) = self.table.get_bucket(index)
                && !slot.is_pinned(now)
            {
                let fresh_at = slot.fresh_at();
                if best.is_none_or(|(best_at, _)| fresh_at < best_at) {
                    best = Some((fresh_at, index));
                }
                sampled += 1;
                if sampled == EVICTION_SAMPLES {
                    break;
                }
            }
        }
        if best.is_none() {
            // Sparse and unlucky: take the first entry from a random bucket on.
            let start = fastrand::usize(..total);
            best = (0..total).map(|i| (start + i) % total).find_map(|index| {
                self.table
                    .get_bucket(index)
                    .filter(|(_, slot)| !slot.is_pinned(now))
                    .map(|(_, slot)| (slot.fresh_at(), index))
            });
        }
        let Some((fresh_at, index)) = best else {
            return false;
        };
        let Ok(entry) = self.table.get_bucket_entry(index) else {
            return false;
        };
        let (removed, _) = entry.remove();
        forget(&removed, budget);
        if fresh_at > now {
            budget.evictions.fetch_add(1, Ordering::AcqRel);
        }
        true
    }
}
