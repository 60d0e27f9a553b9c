//! Tables of key -> slot, one per kind of key, over [`DashMap`] shards.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use foldhash::fast::RandomState;
use rl_core::algorithm::AlgorithmState;
use rl_core::{Key, KeyRepr, Quota};

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

/// Shared bookkeeping of all the tables of one store.
#[derive(Debug)]
pub(crate) struct Budget {
    pub(crate) max_keys: usize,
    pub(crate) len: AtomicUsize,
    /// No live key becomes forgettable before this microsecond (a lower bound).
    pub(crate) next_fresh_at: AtomicU64,
    /// When the store last swept every table because it was full (µs).
    pub(crate) last_full_sweep: AtomicU64,
    /// Sweep every table once this many keys are live (twice the count after the last sweep).
    pub(crate) sweep_at: AtomicUsize,
}

/// A full store sweeps every table at most this often (µs).
const FULL_SWEEP_INTERVAL: u64 = 100_000;
/// The smallest store that sweeps as it grows.
pub(crate) const MIN_SWEEP: usize = 1_024;

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

    /// Claims the right to sweep a store that has doubled since its last sweep.
    pub(crate) fn claim_growth_sweep(&self) -> bool {
        let at = self.sweep_at.load(Ordering::Acquire);
        self.len.load(Ordering::Acquire) >= at
            && self
                .sweep_at
                .compare_exchange(at, usize::MAX, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// Records a sweep that freed `freed` keys and found none fresher than `next_fresh_at`.
    pub(crate) fn swept(&self, freed: usize, next_fresh_at: u64) {
        let len = self.len.fetch_sub(freed, Ordering::AcqRel) - freed;
        self.next_fresh_at.store(next_fresh_at, Ordering::Release);
        self.sweep_at
            .store((len * 2).max(MIN_SWEEP), Ordering::Release);
    }
}

/// What happened to an insertion.
pub(crate) enum Found<R> {
    /// Another thread created the slot first; `f` ran on it.
    Slot(R),
    /// The slot was created; `f` ran on it.
    Created(R),
    /// The store is full.
    Full,
}

/// One map of `K` -> `V`.
#[derive(Debug)]
struct Table<K: Eq + Hash, V>(DashMap<K, V, RandomState>);

impl<K: Eq + Hash, V: Slot> Table<K, V> {
    fn new(hasher: &RandomState, shards: usize) -> Self {
        Self(DashMap::with_hasher_and_shard_amount(
            hasher.clone(),
            shards,
        ))
    }

    /// Runs `f` on the slot of `probe`, if there is one (under a shared shard lock).
    #[inline]
    fn get<Q, R>(&self, probe: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.0.get(probe).map(|slot| f(&slot))
    }

    /// Creates the slot of `key` if the budget allows (or finds it, if another thread just
    /// did), then runs `f` on it.
    fn insert<R>(&self, budget: &Budget, key: K, f: impl FnOnce(&V) -> R) -> Found<R> {
        match self.0.entry(key) {
            Entry::Occupied(entry) => Found::Slot(f(entry.get())),
            Entry::Vacant(entry) => {
                if budget.len.fetch_add(1, Ordering::AcqRel) >= budget.max_keys {
                    budget.len.fetch_sub(1, Ordering::AcqRel);
                    return Found::Full;
                }
                let slot = entry.insert(V::default());
                let result = f(&slot);
                budget
                    .next_fresh_at
                    .fetch_min(slot.fresh_at(), Ordering::AcqRel);
                Found::Created(result)
            }
        }
    }

    /// Forgets every entry that equals a fresh one at `now`; returns how many, and the
    /// earliest time a remaining entry becomes fresh.
    fn sweep(&self, now: u64) -> (usize, u64) {
        let (mut freed, mut next) = (0, u64::MAX);
        self.0.retain(|_, slot| {
            let fresh_at = slot.fresh_at();
            if fresh_at > now {
                next = next.min(fresh_at);
                true
            } else {
                freed += 1;
                false
            }
        });
        (freed, next)
    }
}

/// Byte strings up to this long are stored inline: with its length and tag, a stored key is
/// 24 bytes, the size of a `String`, and needs no allocation of its own.
const INLINE_BYTES: usize = 22;

/// A stored byte-string key: inline up to 22 bytes, boxed beyond. Hashes and compares as the
/// `[u8]` it holds, so a `&[u8]` finds it.
#[derive(Clone, Debug)]
enum StoredBytes {
    Inline { len: u8, buf: [u8; INLINE_BYTES] },
    Boxed(Box<[u8]>),
}

impl StoredBytes {
    fn new(bytes: &[u8]) -> Self {
        match u8::try_from(bytes.len()) {
            Ok(len) if bytes.len() <= INLINE_BYTES => {
                let mut buf = [0; INLINE_BYTES];
                buf[..bytes.len()].copy_from_slice(bytes);
                Self::Inline { len, buf }
            }
            _ => Self::Boxed(bytes.into()),
        }
    }
}

const _: () = assert!(std::mem::size_of::<StoredBytes>() == 24);

impl Borrow<[u8]> for StoredBytes {
    fn borrow(&self) -> &[u8] {
        match self {
            Self::Inline { len, buf } => &buf[..usize::from(*len)],
            Self::Boxed(bytes) => bytes,
        }
    }
}

impl PartialEq for StoredBytes {
    fn eq(&self, other: &Self) -> bool {
        Borrow::<[u8]>::borrow(self) == Borrow::<[u8]>::borrow(other)
    }
}

impl Eq for StoredBytes {}

impl Hash for StoredBytes {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        Borrow::<[u8]>::borrow(self).hash(state);
    }
}

/// One table per kind of key, so that keys of different kinds never meet.
/// A key of a scoped limit, owned: its scope, then its value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ScopedKey {
    Int(u64, u64),
    Ip(u64, [u8; 16]),
    Bytes(u64, StoredBytes),
    Digest(u64, [u8; 32]),
}

impl ScopedKey {
    fn new(key: &Key) -> Self {
        let scope = key.scope();
        match key.repr() {
            KeyRepr::Int(n) => Self::Int(scope, n),
            KeyRepr::Ip(ip) => Self::Ip(scope, *ip),
            KeyRepr::Bytes(b) => Self::Bytes(scope, StoredBytes::new(b)),
            KeyRepr::Digest(d) => Self::Digest(scope, *d),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Tables<V> {
    int: Table<u64, V>,
    ip: Table<[u8; 16], V>,
    bytes: Table<StoredBytes, V>,
    digest: Table<[u8; 32], V>,
    /// Keys with a scope (a named limit): kept apart, so that unscoped keys stay compact.
    scoped: Table<ScopedKey, V>,
}

impl<V: Slot> Tables<V> {
    pub(crate) fn new(hasher: &RandomState, shards: usize) -> Self {
        Self {
            int: Table::new(hasher, shards),
            ip: Table::new(hasher, shards),
            bytes: Table::new(hasher, shards),
            digest: Table::new(hasher, shards),
            scoped: Table::new(hasher, shards),
        }
    }

    /// Runs `f` on `key`'s slot, if there is one.
    #[inline]
    pub(crate) fn get<R>(&self, key: &Key, f: impl FnOnce(&V) -> R) -> Option<R> {
        if key.scope() != 0 {
            return self.scoped.get(&ScopedKey::new(key), f);
        }
        match key.repr() {
            KeyRepr::Int(n) => self.int.get(&n, f),
            KeyRepr::Ip(ip) => self.ip.get(ip, f),
            KeyRepr::Bytes(b) => self.bytes.get(b, f),
            KeyRepr::Digest(d) => self.digest.get(d, f),
        }
    }

    /// Creates `key`'s slot if the budget allows, and runs `f` on it.
    pub(crate) fn insert<R>(
        &self,
        budget: &Budget,
        key: &Key,
        f: impl FnOnce(&V) -> R,
    ) -> Found<R> {
        if key.scope() != 0 {
            return self.scoped.insert(budget, ScopedKey::new(key), f);
        }
        match key.repr() {
            KeyRepr::Int(n) => self.int.insert(budget, n, f),
            KeyRepr::Ip(ip) => self.ip.insert(budget, *ip, f),
            KeyRepr::Bytes(b) => self.bytes.insert(budget, StoredBytes::new(b), f),
            KeyRepr::Digest(d) => self.digest.insert(budget, *d, f),
        }
    }

    /// Removes `key`; returns whether it was there.
    pub(crate) fn remove(&self, key: &Key) -> bool {
        if key.scope() != 0 {
            return self.scoped.0.remove(&ScopedKey::new(key)).is_some();
        }
        match key.repr() {
            KeyRepr::Int(n) => self.int.0.remove(&n).is_some(),
            KeyRepr::Ip(ip) => self.ip.0.remove(ip).is_some(),
            KeyRepr::Bytes(b) => self.bytes.0.remove(b).is_some(),
            KeyRepr::Digest(d) => self.digest.0.remove(d).is_some(),
        }
    }

    /// [`Table::sweep`] over every kind of key.
    pub(crate) fn sweep(&self, now: u64) -> (usize, u64) {
        [
            self.int.sweep(now),
            self.ip.sweep(now),
            self.bytes.sweep(now),
            self.digest.sweep(now),
            self.scoped.sweep(now),
        ]
        .into_iter()
        .fold((0, u64::MAX), |(f, n), (f2, n2)| (f + f2, n.min(n2)))
    }
}
