//! A sharded hash table of key -> slot with bounded, lazily swept entries.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use rl_core::algorithm::AlgorithmState;
use rl_core::{KeyRepr, Quota};

/// A stored value: knows when it equals a fresh state and may be dropped.
pub(crate) trait Slot: Default + Send + Sync {
    /// Microsecond from which this slot equals a fresh one.
    fn fresh_at(&self) -> u64;
}

/// GCRA: the theoretical arrival time, updated by compare-and-swap.
impl Slot for AtomicU64 {
    fn fresh_at(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }
}

/// Any other algorithm: its state and its `fresh_at`, behind a mutex.
#[derive(Debug, Default)]
pub(crate) struct Locked<S>(Mutex<(S, u64)>);

impl<S: AlgorithmState> Locked<S> {
    pub(crate) fn lock(&self) -> MutexGuard<'_, (S, u64)> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the state, then records when the state becomes fresh.
    pub(crate) fn update<R>(&self, quota: &Quota, f: impl FnOnce(&mut S) -> R) -> R {
        let mut guard = self.lock();
        let result = f(&mut guard.0);
        guard.1 = guard.0.fresh_at(quota);
        result
    }
}

impl<S: AlgorithmState> Slot for Locked<S> {
    fn fresh_at(&self) -> u64 {
        self.lock().1
    }
}

/// The key types a table can hold, hashed the same way as the [`KeyRepr`] that finds them.
pub(crate) trait TableKey: Send + Sync + Sized {
    fn hash(&self, hasher: &RandomState) -> u64;
}

impl TableKey for u64 {
    fn hash(&self, hasher: &RandomState) -> u64 {
        hasher.hash_one(self)
    }
}

impl TableKey for [u8; 16] {
    fn hash(&self, hasher: &RandomState) -> u64 {
        hasher.hash_one(self)
    }
}

impl TableKey for [u8; 32] {
    fn hash(&self, hasher: &RandomState) -> u64 {
        hasher.hash_one(self)
    }
}

impl TableKey for smol_str::SmolStr {
    fn hash(&self, hasher: &RandomState) -> u64 {
        hasher.hash_one(self.as_bytes())
    }
}

/// Shared bookkeeping of all the tables of one store.
#[derive(Debug)]
pub(crate) struct Budget {
    pub(crate) max_keys: usize,
    pub(crate) len: AtomicUsize,
    /// No live key becomes forgettable before this microsecond (a lower bound).
    pub(crate) next_fresh_at: AtomicU64,
    /// When the store last swept every table because it was full (µs).
    pub(crate) last_full_sweep: AtomicU64,
}

/// A full store sweeps every table at most this often (µs).
pub(crate) const FULL_SWEEP_INTERVAL: u64 = 100_000;

impl Budget {
    /// The earliest time a full store may admit a new key (µs).
    pub(crate) fn room_at(&self) -> u64 {
        let next_fresh = self.next_fresh_at.load(Ordering::Acquire);
        let next_sweep = self
            .last_full_sweep
            .load(Ordering::Acquire)
            .saturating_add(FULL_SWEEP_INTERVAL);
        next_fresh.max(next_sweep)
    }

    /// Claims the right to sweep a full store at `now`; only one caller wins per interval.
    pub(crate) fn claim_full_sweep(&self, now: u64) -> bool {
        let last = self.last_full_sweep.load(Ordering::Acquire);
        now >= self.room_at()
            && self
                .last_full_sweep
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }
}

/// What happened to a lookup.
pub(crate) enum Found<R> {
    /// The slot existed or was created; `f` ran on it.
    Slot(R),
    /// The key is unknown and was not created.
    Missing,
    /// The store is full.
    Full,
}

#[repr(align(128))]
#[derive(Debug)]
struct Padded<T>(T);

#[derive(Debug)]
struct Shard<K, V> {
    map: HashTable<(K, V)>,
    /// Sweep when the shard reaches this many entries.
    sweep_at: usize,
}

const MIN_SWEEP: usize = 64;

impl<K: TableKey, V: Slot> Shard<K, V> {
    /// Drops every entry that equals a fresh one; returns how many, and the earliest time a
    /// remaining entry becomes fresh.
    fn sweep(&mut self, now: u64) -> (usize, u64) {
        let before = self.map.len();
        let mut next = u64::MAX;
        self.map.retain(|(_, slot)| {
            let fresh_at = slot.fresh_at();
            let keep = fresh_at > now;
            if keep {
                next = next.min(fresh_at);
            }
            keep
        });
        self.sweep_at = (self.map.len() * 2).max(MIN_SWEEP);
        (before - self.map.len(), next)
    }
}

/// A sharded table of `K` -> `V`.
#[derive(Debug)]
pub(crate) struct Table<K, V> {
    shards: Box<[Padded<RwLock<Shard<K, V>>>]>,
}

impl<K: TableKey, V: Slot> Table<K, V> {
    pub(crate) fn new(shards: usize) -> Self {
        let shards = (0..shards)
            .map(|_| {
                Padded(RwLock::new(Shard {
                    map: HashTable::new(),
                    sweep_at: MIN_SWEEP,
                }))
            })
            .collect();
        Self { shards }
    }

    fn shard(&self, hash: u64) -> &RwLock<Shard<K, V>> {
        // The low bits pick the bucket inside a shard and the top 7 its control byte.
        let index = (hash >> 40) as usize & (self.shards.len() - 1);
        &self.shards[index].0
    }

    fn read(&self, hash: u64) -> RwLockReadGuard<'_, Shard<K, V>> {
        self.shard(hash)
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self, hash: u64) -> RwLockWriteGuard<'_, Shard<K, V>> {
        self.shard(hash)
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the slot of the key `eq` recognises, creating it with `make` when `create`
    /// is set and the budget allows.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn with_slot<R>(
        &self,
        hasher: &RandomState,
        budget: &Budget,
        hash: u64,
        eq: impl Fn(&K) -> bool,
        make: impl FnOnce() -> K,
        create: bool,
        now: u64,
        f: impl FnOnce(&V) -> R,
    ) -> Found<R> {
        {
            let shard = self.read(hash);
            if let Some((_, slot)) = shard.map.find(hash, |(k, _)| eq(k)) {
                return Found::Slot(f(slot));
            }
        }
        if !create {
            return Found::Missing;
        }
        let mut shard = self.write(hash);
        if let Some((_, slot)) = shard.map.find(hash, |(k, _)| eq(k)) {
            return Found::Slot(f(slot));
        }
        if shard.map.len() >= shard.sweep_at {
            let (freed, _) = shard.sweep(now);
            budget.len.fetch_sub(freed, Ordering::AcqRel);
        }
        if budget.len.fetch_add(1, Ordering::AcqRel) >= budget.max_keys {
            budget.len.fetch_sub(1, Ordering::AcqRel);
            return Found::Full;
        }
        let entry = shard
            .map
            .insert_unique(hash, (make(), V::default()), |(k, _)| k.hash(hasher));
        let slot = &entry.get().1;
        let result = f(slot);
        budget
            .next_fresh_at
            .fetch_min(slot.fresh_at(), Ordering::AcqRel);
        Found::Slot(result)
    }

    /// Forgets every entry that equals a fresh one; returns how many, and the earliest time a
    /// remaining entry becomes fresh.
    pub(crate) fn sweep(&self, now: u64) -> (usize, u64) {
        self.shards
            .iter()
            .fold((0, u64::MAX), |(freed, next), shard| {
                let (f, n) = shard
                    .0
                    .write()
                    .unwrap_or_else(PoisonError::into_inner)
                    .sweep(now);
                (freed + f, next.min(n))
            })
    }

    /// Removes the key `eq` recognises; returns whether it was there.
    pub(crate) fn remove(&self, hash: u64, eq: impl Fn(&K) -> bool) -> bool {
        let mut shard = self.write(hash);
        shard
            .map
            .find_entry(hash, |(k, _)| eq(k))
            .map(|entry| entry.remove())
            .is_ok()
    }
}

/// One table per kind of key.
#[derive(Debug)]
pub(crate) struct Tables<V> {
    int: Table<u64, V>,
    ip: Table<[u8; 16], V>,
    str: Table<smol_str::SmolStr, V>,
    digest: Table<[u8; 32], V>,
}

impl<V: Slot> Tables<V> {
    pub(crate) fn new(shards: usize) -> Self {
        Self {
            int: Table::new(shards),
            ip: Table::new(shards),
            str: Table::new(shards),
            digest: Table::new(shards),
        }
    }

    /// [`Table::with_slot`] on the table for `key`'s kind.
    #[inline]
    pub(crate) fn with_slot<R>(
        &self,
        hasher: &RandomState,
        budget: &Budget,
        key: KeyRepr<'_>,
        create: bool,
        now: u64,
        f: impl FnOnce(&V) -> R,
    ) -> Found<R> {
        match key {
            KeyRepr::Int(n) => {
                let hash = n.hash(hasher);
                self.int
                    .with_slot(hasher, budget, hash, |k| *k == n, || n, create, now, f)
            }
            KeyRepr::Ip(ip) => {
                let hash = ip.hash(hasher);
                self.ip
                    .with_slot(hasher, budget, hash, |k| k == ip, || *ip, create, now, f)
            }
            KeyRepr::Str(s) => {
                let hash = hasher.hash_one(s.as_bytes());
                let make = || smol_str::SmolStr::new(s);
                self.str.with_slot(
                    hasher,
                    budget,
                    hash,
                    |k| k.as_str() == s,
                    make,
                    create,
                    now,
                    f,
                )
            }
            KeyRepr::Digest(d) => {
                let hash = d.hash(hasher);
                self.digest
                    .with_slot(hasher, budget, hash, |k| k == d, || *d, create, now, f)
            }
        }
    }

    pub(crate) fn remove(&self, hasher: &RandomState, key: KeyRepr<'_>) -> bool {
        match key {
            KeyRepr::Int(n) => self.int.remove(n.hash(hasher), |k| *k == n),
            KeyRepr::Ip(ip) => self.ip.remove(ip.hash(hasher), |k| k == ip),
            KeyRepr::Str(s) => self
                .str
                .remove(hasher.hash_one(s.as_bytes()), |k| k.as_str() == s),
            KeyRepr::Digest(d) => self.digest.remove(d.hash(hasher), |k| k == d),
        }
    }

    pub(crate) fn sweep(&self, now: u64) -> (usize, u64) {
        [
            self.int.sweep(now),
            self.ip.sweep(now),
            self.str.sweep(now),
            self.digest.sweep(now),
        ]
        .into_iter()
        .fold((0, u64::MAX), |(f, n), (f2, n2)| (f + f2, n.min(n2)))
    }
}
