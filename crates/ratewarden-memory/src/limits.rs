//! The limits a store has seen, each a (scope, quota) pair with tables of its own: a key has
//! one state per limit, so requests decided under different quotas, or under differently
//! named limits, never share one.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use foldhash::fast::RandomState;
use ratewarden_core::algorithm::{
    FixedWindowState, GcraState, SlidingLogState, SlidingWindowState, TokenBucketState,
};
use ratewarden_core::{Algorithm, Key, Quota};

use crate::keys::{AnyKey, StoredBytes, StoredKey};
use crate::slot::{LedgerSlot, Locked, Slot};
use crate::table::{Budget, Sweep, Table};

/// Slots in the directory of limits. A store that meets more distinct limits (scope and
/// quota pairs) than find a slot keeps the rest in overflow tables, with the limit in each
/// key.
const DIRECTORY: usize = 256;
/// How far a limit's slot may be from its home in the directory.
const PROBES: usize = 16;

/// The directory of a store's limits, its overflow tables, and every table for the sweeps.
pub(crate) struct Limits {
    slots: Box<[OnceLock<Limit>]>,
    pub(crate) overflow: Overflow,
    /// The reserved limits' ledgers, with the limit in every key.
    pub(crate) reserved: Reserved,
    /// Every table made, for the global sweep.
    tables: RwLock<Vec<Arc<dyn Sweep>>>,
    next_table: AtomicUsize,
    shards: usize,
    hasher: RandomState,
    pub(crate) budget: Budget,
}

impl Limits {
    /// The hash this store's tables place `key` by.
    #[cfg(test)]
    pub(crate) fn hash_of(&self, key: &ratewarden_core::Key) -> u64 {
        use std::hash::BuildHasher as _;
        self.hasher.hash_one(key)
    }
}

/// One limit: a scope and a quota, and its tables.
pub(crate) struct Limit {
    scope: u64,
    quota: Quota,
    /// The id of the limit (its keys' `limit_id`), in the overflow tables.
    pub(crate) id: u64,
    pub(crate) tables: LimitTables,
}

/// A limit's tables, by its algorithm's slot type.
pub(crate) enum LimitTables {
    Gcra(KindTables<AtomicU64>),
    TokenBucket(KindTables<Locked<TokenBucketState>>),
    FixedWindow(KindTables<Locked<FixedWindowState>>),
    SlidingWindow(KindTables<Locked<SlidingWindowState>>),
    SlidingLog(KindTables<Locked<SlidingLogState>>),
}

/// A limit's tables, one per kind of key, each placed on first use.
pub(crate) struct KindTables<V> {
    pub(crate) int: OnceLock<Placed<u64, V>>,
    pub(crate) ip: OnceLock<Placed<[u8; 16], V>>,
    pub(crate) bytes: OnceLock<Placed<StoredBytes, V>>,
    pub(crate) digest: OnceLock<Placed<[u8; 32], V>>,
}

impl<V> KindTables<V> {
    const fn new() -> Self {
        Self {
            int: OnceLock::new(),
            ip: OnceLock::new(),
            bytes: OnceLock::new(),
            digest: OnceLock::new(),
        }
    }
}

/// Where a limit's keys of one kind live, decided once for the life of the store (so that a
/// key never has two places): a table of the limit's own, or, when the budget had no room for
/// one, the overflow table.
pub(crate) enum Placed<K, V> {
    Own(Arc<Table<K, V>>),
    Overflow,
}

/// An overflow table, made on first use (`None`: the budget had no room for it either).
pub(crate) type OverflowTable<V> = OnceLock<Option<Arc<Table<AnyKey, V>>>>;

/// The overflow tables, one per algorithm.
#[derive(Default)]
pub(crate) struct Overflow {
    pub(crate) gcra: OverflowTable<AtomicU64>,
    pub(crate) token_bucket: OverflowTable<Locked<TokenBucketState>>,
    pub(crate) fixed_window: OverflowTable<Locked<FixedWindowState>>,
    pub(crate) sliding_window: OverflowTable<Locked<SlidingWindowState>>,
    pub(crate) sliding_log: OverflowTable<Locked<SlidingLogState>>,
}

/// The reserved limits' ledger tables, one per algorithm, made on first use.
#[derive(Default)]
pub(crate) struct Reserved {
    pub(crate) gcra: OverflowTable<LedgerSlot<GcraState>>,
    pub(crate) token_bucket: OverflowTable<LedgerSlot<TokenBucketState>>,
    pub(crate) fixed_window: OverflowTable<LedgerSlot<FixedWindowState>>,
    pub(crate) sliding_window: OverflowTable<LedgerSlot<SlidingWindowState>>,
    pub(crate) sliding_log: OverflowTable<LedgerSlot<SlidingLogState>>,
}

impl Limits {
    /// What a store costs before its first key, at least: the budget must be larger.
    pub(crate) const MIN_BYTES: usize = 256 << 10;

    pub(crate) fn new(max_bytes: usize) -> Self {
        // Shards small enough that any work on one (a sweep, a shrink) stays short: about
        // 64 KiB of a full store's memory each.
        let shards = (max_bytes / (64 << 10)).clamp(1, 1_024).next_power_of_two();
        let limits = Self {
            slots: (0..DIRECTORY).map(|_| OnceLock::new()).collect(),
            overflow: Overflow::default(),
            reserved: Reserved::default(),
            tables: RwLock::new(Vec::new()),
            next_table: AtomicUsize::new(0),
            shards,
            hasher: RandomState::default(),
            budget: Budget::new(max_bytes),
        };
        // The directory is the first thing the budget pays for (`MIN_BYTES` covers it).
        let fixed = size_of::<Self>() + DIRECTORY * size_of::<OnceLock<Limit>>();
        limits.budget.charge(fixed);
        limits
    }

    /// The limit of `scope` and `quota` (made if new, when `create`); `None` when it has no
    /// slot in the directory (its keys then live in the overflow tables).
    #[inline]
    pub(crate) fn find(&self, scope: u64, quota: &Quota, create: bool) -> Option<&Limit> {
        // The fingerprint is mixed already, and a scope is a digest: no need to mix again.
        let home = (quota.fingerprint() ^ scope) as usize;
        for probe in 0..PROBES {
            let slot = &self.slots[(home + probe) % DIRECTORY];
            let limit = match slot.get() {
                Some(limit) => limit,
                None if create => slot.get_or_init(|| Limit {
                    scope,
                    quota: *quota,
                    id: Key::from(0u64).scoped(scope).limit_id(quota),
                    tables: match quota.algorithm() {
                        Algorithm::Gcra => LimitTables::Gcra(KindTables::new()),
                        Algorithm::TokenBucket => LimitTables::TokenBucket(KindTables::new()),
                        Algorithm::FixedWindow => LimitTables::FixedWindow(KindTables::new()),
                        Algorithm::SlidingWindow => LimitTables::SlidingWindow(KindTables::new()),
                        Algorithm::SlidingLog => LimitTables::SlidingLog(KindTables::new()),
                    },
                }),
                None => return None,
            };
            if limit.quota.fingerprint() == quota.fingerprint()
                && limit.scope == scope
                && limit.quota == *quota
            {
                return Some(limit);
            }
        }
        None
    }

    /// Where the keys of one kind of a limit live (placed now if this is their first use).
    pub(crate) fn placed<'a, K: StoredKey, V: Slot>(
        &self,
        cell: &'a OnceLock<Placed<K, V>>,
    ) -> &'a Placed<K, V> {
        cell.get_or_init(|| match self.new_table::<K, V>() {
            Some(table) => Placed::Own(table),
            None => Placed::Overflow,
        })
    }

    /// An overflow table (made now if this is its first use).
    pub(crate) fn overflow<'a, V: Slot>(
        &self,
        cell: &'a OverflowTable<V>,
    ) -> Option<&'a Arc<Table<AnyKey, V>>> {
        cell.get_or_init(|| self.new_table::<AnyKey, V>()).as_ref()
    }

    fn new_table<K: StoredKey, V: Slot>(&self) -> Option<Arc<Table<K, V>>> {
        let (table, fixed) = Table::<K, V>::new(self.shards, self.hasher.clone());
        let mut tables = self.tables.write().unwrap_or_else(PoisonError::into_inner);
        // The table's `Arc` counts, and the list of tables when it must grow to hold it: bytes
        // held like any other (uncharged, they took a flood of sliding logs 60 bytes past the
        // bound).
        let grow = if tables.len() == tables.capacity() {
            tables.capacity().max(4)
        } else {
            0
        };
        let list = grow * size_of::<Arc<dyn Sweep>>();
        if !self
            .budget
            .try_charge(fixed + 2 * size_of::<usize>() + list)
        {
            return None;
        }
        tables.reserve_exact(grow);
        let table = Arc::new(table);
        tables.push(Arc::clone(&table) as Arc<dyn Sweep>);
        Some(table)
    }

    /// One step of the global sweep: a few buckets of the next table's next shard. Every
    /// insertion takes one, so that tables no longer taking keys give their memory back too.
    pub(crate) fn sweep_step(&self, now: u64) {
        let tables = self.tables.read().unwrap_or_else(PoisonError::into_inner);
        if !tables.is_empty() {
            let index = self.next_table.fetch_add(1, Ordering::Relaxed) % tables.len();
            tables[index].sweep_step(now, &self.budget);
        }
    }

    /// Evicts one entry from any table, for a new key whose own shard has nothing left to
    /// evict while others hold the bound (keys with large states, few to a shard); false when
    /// nothing could be.
    pub(crate) fn evict_any(&self, now: u64) -> bool {
        let tables = self.tables.read().unwrap_or_else(PoisonError::into_inner);
        let start = self.next_table.fetch_add(1, Ordering::Relaxed);
        (0..tables.len()).any(|i| tables[(start + i) % tables.len()].evict_any(now, &self.budget))
    }

    /// Forgets every fresh entry of every table; returns how many.
    pub(crate) fn sweep_all(&self, now: u64) -> usize {
        let tables = self
            .tables
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        tables
            .iter()
            .map(|table| table.sweep_all(now, &self.budget))
            .sum()
    }
}
