//! [`MemoryStore`] and its builder.

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::OnceLock;

use ratewarden_core::algorithm::{
    AlgorithmState, FixedWindowState, GcraState, SlidingLogState, SlidingWindowState,
    TokenBucketState,
};
use ratewarden_core::{
    Algorithm, Clock, Decision, Decisions, Info, Key, KeyRepr, Limit, MAX_LIMITS, MonotonicClock,
    Quota, Reservation, Store, StoreError, StoreErrorKind, Timestamp, merged,
};

use crate::keys::{AnyKey, StoredBytes, StoredKey};
use crate::limits::{KindTables, LimitTables, Limits, OverflowTable, Placed};
use crate::slot::{Locked, Slot, gcra_check};
use crate::table::Table;

mod reserve;

/// How many entries a new key may have evicted from other shards than its own, when its own
/// has nothing left.
const EVICT_ELSEWHERE: usize = 8;

/// The default memory bound: 64 MiB (about 1,800,000 GCRA keys of integers or addresses, or
/// 900,000 of short strings).
const DEFAULT_MAX_MEMORY: usize = 64 << 20;

/// An in-process [`Store`]: a sharded map of key -> compact state, bounded in bytes, with no
/// background thread. Clones share one map.
///
/// See the [crate documentation](crate) for how memory is bounded and keys are forgotten.
///
/// ```
/// use ratewarden_core::{Key, ManualClock, Quota, Store};
/// use ratewarden_memory::MemoryStore;
/// use std::time::Duration;
///
/// # tokio_test();
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn tokio_test() {
/// let clock = ManualClock::default();
/// let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
/// let quota = Quota::per_second(1).unwrap();
/// let key = Key::from(42u64);
///
/// assert!(store.check(&key, &quota, 1).await.unwrap().is_allowed());
/// let denied = store.check(&key, &quota, 1).await.unwrap();
/// assert_eq!(denied.info().retry_after(), Duration::from_secs(1));
/// clock.advance(Duration::from_secs(1));
/// assert!(store.clone().check(&key, &quota, 1).await.unwrap().is_allowed());
/// # }
/// ```
pub struct MemoryStore<C = MonotonicClock> {
    inner: Arc<Inner<C>>,
}

impl<C> Clone for MemoryStore<C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<C> {
    clock: C,
    limits: Limits,
}

impl<C> fmt::Debug for MemoryStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("len", &self.len())
            .field("memory", &self.memory())
            .field("max_memory", &self.inner.limits.budget.max())
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// A store with the default bound (64 MiB) and a [`MonotonicClock`].
    ///
    /// ```
    /// let store = ratewarden_memory::MemoryStore::new();
    /// assert_eq!(store.len(), 0);
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Self::builder().build_valid()
    }

    /// A builder to set the bound or the clock.
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// let store = ratewarden_memory::MemoryStore::builder()
    ///     .max_memory(NonZeroUsize::new(16 << 20).unwrap())
    ///     .build()
    ///     .unwrap();
    /// assert!(store.memory() <= 16 << 20);
    /// ```
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            max_memory: DEFAULT_MAX_MEMORY,
            clock: MonotonicClock::new(),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl<C> MemoryStore<C> {
    /// The hash this store places `key` by.
    #[cfg(test)]
    pub(crate) fn hash_of(&self, key: &Key) -> u64 {
        self.inner.limits.hash_of(key)
    }

    /// How many keys hold state (including ones not yet swept after they became fresh).
    ///
    /// ```
    /// use ratewarden_core::{Key, Quota};
    /// let store = ratewarden_memory::MemoryStore::new();
    /// store.check_sync(&Key::from(1u64), &Quota::per_second(1)?, 1);
    /// assert_eq!(store.len(), 1);
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.limits.budget.keys()
    }

    /// Whether no key holds state.
    ///
    /// ```
    /// assert!(ratewarden_memory::MemoryStore::new().is_empty());
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes the store holds now, as counted against its
    /// [bound](MemoryStoreBuilder::max_memory): its tables' allocations and what their keys
    /// own, never more than the bound.
    ///
    /// ```
    /// let store = ratewarden_memory::MemoryStore::new();
    /// assert!(store.memory() > 0); // the directory of limits
    /// ```
    #[must_use]
    pub fn memory(&self) -> usize {
        self.inner.limits.budget.used()
    }

    /// How many keys were forgotten before their state was fresh, to make room for new keys
    /// in a full store. Each gave its key back what it had spent and not yet regained (see
    /// the [crate documentation](crate)): a number to watch, and to size the store by.
    ///
    /// ```
    /// assert_eq!(ratewarden_memory::MemoryStore::new().evictions(), 0);
    /// ```
    #[must_use]
    pub fn evictions(&self) -> u64 {
        self.inner.limits.budget.evictions()
    }
}

impl<C: Clock> MemoryStore<C> {
    /// Checks `cost` against `key` under `quota` now, synchronously: the same decision
    /// [`Store::check`] returns, without a future.
    ///
    /// ```
    /// use ratewarden_core::{Key, Quota};
    /// let store = ratewarden_memory::MemoryStore::new();
    /// let quota = Quota::per_minute(10)?;
    /// let decision = store.check_sync(&Key::from("a"), &quota, 3);
    /// assert_eq!(decision.info().remaining(), 7);
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[inline]
    pub fn check_sync(&self, key: &Key, quota: &Quota, cost: u32) -> Decision {
        let now = self.inner.clock.now();
        if let Some(decision) = self.inner.check_gcra_seen(key, quota, now, cost) {
            return decision;
        }
        self.inner.run(key, quota, now, Op::Check(cost))
    }

    /// Checks a request against several limits together, synchronously: the decisions
    /// [`Store::check_all`] returns, without a future.
    ///
    /// Limits on one state are decided once ([`merged`]). Every limit first decides on its
    /// state as it is, changing nothing, so a request one
    /// limit refuses leaves every state exactly as it was. When all admit, each counted limit
    /// (not a [probe](Limit::probe)) is charged in turn; should one have been spent by another request in between, it denies and the
    /// charges already made are refunded ([`AlgorithmState::refund`]): while they are, other
    /// requests see less room than there is (never more).
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidInput`](ratewarden_core::StoreErrorKind::InvalidInput) for
    /// more than [`MAX_LIMITS`] limits.
    ///
    /// ```
    /// use ratewarden_core::{Key, Limit, Quota};
    /// let store = ratewarden_memory::MemoryStore::new();
    /// let key = Key::from("user-7");
    /// let limits = [
    ///     Limit::new(key.clone(), Quota::per_second(10)?, 1),
    ///     Limit::new(key, Quota::per_hour(2)?, 1),
    /// ];
    /// assert!(store.check_all_sync(&limits)?.is_allowed());
    /// assert!(store.check_all_sync(&limits)?.is_allowed());
    /// let third = store.check_all_sync(&limits)?;
    /// assert_eq!(third.binding().map(|(i, _)| i), Some(1)); // the hourly limit denied
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_all_sync(&self, limits: &[Limit]) -> Result<Decisions, StoreError> {
        if limits.len() > MAX_LIMITS {
            return Err(StoreError::with_source(
                StoreErrorKind::InvalidInput,
                "more than 16 limits in one check",
            ));
        }
        if let [one] = limits
            && one.is_counted()
        {
            // One limit: a check, at its cost.
            let decision = self.check_sync(one.key(), one.quota(), one.cost());
            return Ok(Decisions::from(decision));
        }
        let inner = &self.inner;
        let now = inner.clock.now();
        // Limits on one state are decided once: two that fit alone may not fit together.
        let (states, of) = merged(limits);
        let mut decisions: Vec<Decision> = states
            .iter()
            .map(|l| inner.run(l.key(), l.quota(), now, Op::Probe(l.cost())))
            .collect();
        let each = |decisions: Vec<Decision>| {
            Decisions::from(of.iter().map(|&s| decisions[s]).collect::<Vec<_>>())
        };
        if !decisions.iter().all(Decision::is_allowed) {
            return Ok(each(decisions));
        }
        let mut charged = Vec::with_capacity(states.len());
        for (i, limit) in states.iter().enumerate() {
            if !limit.is_counted() {
                continue;
            }
            let (decision, at) =
                inner.run_at(limit.key(), limit.quota(), now, Op::Check(limit.cost()));
            let admitted = decision.is_allowed();
            decisions[i] = decision;
            if !admitted {
                inner.refund(&charged);
                break;
            }
            charged.push((limit, at));
        }
        Ok(each(decisions))
    }

    /// Forgets every key whose state equals a fresh one now; returns how many. Never needed
    /// for correctness or bounds (the store sweeps a few entries per new key), but frees
    /// memory after a burst of keys at a chosen moment.
    ///
    /// ```
    /// use ratewarden_core::{Key, ManualClock, Quota};
    /// use std::time::Duration;
    /// let clock = ManualClock::default();
    /// let store = ratewarden_memory::MemoryStore::builder().clock(clock.clone()).build().unwrap();
    /// store.check_sync(&Key::from(1u64), &Quota::per_second(1)?, 1);
    /// assert_eq!(store.sweep(), 0); // still counted: not fresh yet
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(store.sweep(), 1);
    /// assert!(store.is_empty());
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    pub fn sweep(&self) -> usize {
        let now = self.inner.clock.now().as_micros();
        self.inner.limits.sweep_all(now)
    }
}

/// One operation on one key's state: what, under which quota, when.
#[derive(Clone, Copy)]
struct Ask<'a> {
    quota: &'a Quota,
    now: Timestamp,
    op: Op,
}

/// What to do with a key's state.
#[derive(Clone, Copy)]
enum Op {
    Check(u32),
    Peek,
    /// A check of this cost that changes nothing.
    Probe(u32),
    /// Gives back a cost a check admitted; with `last`, only if the state is still as
    /// that check left it (fresh by `last`, µs: nothing counted since).
    Refund {
        cost: u32,
        charged_at: Timestamp,
        last: Option<u64>,
    },
    Remove,
}

impl Op {
    /// Whether the operation makes state for a key that has none.
    const fn creates(self) -> bool {
        matches!(self, Self::Check(_))
    }
}

/// What an operation found.
enum Outcome {
    Decided(Decision),
    /// A check's decision, and the time it was decided at.
    Charged(Decision, Timestamp),
    /// Peek, probe, refund or remove of a key without state.
    Absent,
    Removed,
}

/// A slot that decides: GCRA's atomic, or any other algorithm's locked state.
trait Decide: Slot {
    /// The state, read (for a probe).
    type State: AlgorithmState;

    /// Checks at `now`, a reading of `clock` taken before, and says when it decided. A
    /// reading of a monotonic clock that finds the state ahead of it is stale, never a step
    /// back: the state is not pulled back to it.
    fn check<C: Clock>(
        &self,
        now: Timestamp,
        cost: u32,
        quota: &Quota,
        clock: &C,
    ) -> (Decision, Timestamp);
    /// Runs `f` on the state as it is.
    fn inspect<R>(&self, f: impl FnOnce(&Self::State) -> R) -> R;
    /// Gives back `cost` charged at `.0`; with `.1`, only if the state is fresh by then
    /// (nothing counted since the charge).
    fn refund(&self, now: Timestamp, charged: (Timestamp, Option<u64>), cost: u32, quota: &Quota);
}

impl Decide for AtomicU64 {
    type State = GcraState;

    #[inline]
    fn check<C: Clock>(
        &self,
        now: Timestamp,
        cost: u32,
        quota: &Quota,
        clock: &C,
    ) -> (Decision, Timestamp) {
        (
            gcra_check(self, now, cost, quota, clock.is_monotonic()),
            now,
        )
    }

    fn inspect<R>(&self, f: impl FnOnce(&GcraState) -> R) -> R {
        f(&GcraState {
            tat: self.load(std::sync::atomic::Ordering::Acquire),
        })
    }

    fn refund(&self, now: Timestamp, charged: (Timestamp, Option<u64>), cost: u32, quota: &Quota) {
        use std::sync::atomic::Ordering;
        let (charged_at, last) = charged;
        let _ = self.fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
            let mut state = GcraState { tat };
            if last.is_some_and(|last| state.fresh_at(quota) > last) {
                return None;
            }
            state.refund(now, charged_at, cost, quota);
            Some(state.tat)
        });
    }
}

impl<S: AlgorithmState> Decide for Locked<S>
where
    Self: Slot,
{
    type State = S;

    fn check<C: Clock>(
        &self,
        now: Timestamp,
        cost: u32,
        quota: &Quota,
        clock: &C,
    ) -> (Decision, Timestamp) {
        self.update(quota, |state| {
            // Under the lock, a monotonic clock read again is never behind the readings that
            // decided before: the state is never ahead of it.
            let now = if clock.is_monotonic() {
                clock.now()
            } else {
                now
            };
            (state.check(now, cost, quota), now)
        })
    }

    fn inspect<R>(&self, f: impl FnOnce(&S) -> R) -> R {
        f(&self.lock().0)
    }

    fn refund(&self, now: Timestamp, charged: (Timestamp, Option<u64>), cost: u32, quota: &Quota) {
        let (charged_at, last) = charged;
        self.update(quota, |state| {
            if last.is_none_or(|last| state.fresh_at(quota) <= last) {
                state.refund(now, charged_at, cost, quota);
            }
        });
    }
}

/// What `op` finds for a key without state: a fresh state's answer.
fn fresh<S: AlgorithmState>(now: Timestamp, quota: &Quota, op: Op) -> Decision {
    match op {
        Op::Probe(cost) => S::default().check(now, cost, quota),
        _ => S::default().peek(now, quota),
    }
}

/// Runs `$body` with `$kinds` (the limit's tables) and `$overflow` (the overflow table) of
/// the limit's algorithm, whatever its slot type.
macro_rules! with_tables {
    ($limits:expr, $tables:expr, |$kinds:ident, $overflow:ident| $body:expr) => {
        match $tables {
            LimitTables::Gcra($kinds) => {
                let $overflow = &$limits.overflow.gcra;
                $body
            }
            LimitTables::TokenBucket($kinds) => {
                let $overflow = &$limits.overflow.token_bucket;
                $body
            }
            LimitTables::FixedWindow($kinds) => {
                let $overflow = &$limits.overflow.fixed_window;
                $body
            }
            LimitTables::SlidingWindow($kinds) => {
                let $overflow = &$limits.overflow.sliding_window;
                $body
            }
            LimitTables::SlidingLog($kinds) => {
                let $overflow = &$limits.overflow.sliding_log;
                $body
            }
        }
    };
}

impl<C: Clock> Inner<C> {
    /// The common check, straight to the slot: a GCRA key already held in its limit's own
    /// table. `None` for anything else (a new limit, key or table, another algorithm, the
    /// overflow tables), which [`Inner::run`] then decides exactly as it would have.
    #[inline]
    fn check_gcra_seen(
        &self,
        key: &Key,
        quota: &Quota,
        now: Timestamp,
        cost: u32,
    ) -> Option<Decision> {
        if quota.algorithm() != Algorithm::Gcra {
            return None;
        }
        let limit = self.limits.find(key.scope(), quota, false)?;
        let LimitTables::Gcra(kinds) = &limit.tables else {
            return None;
        };
        let check = |slot: &AtomicU64| slot.check(now, cost, quota, &self.clock).0;
        match key.repr() {
            KeyRepr::Int(n) => seen(&kinds.int, &n, check),
            KeyRepr::Ip(ip) => seen(&kinds.ip, ip, check),
            KeyRepr::Bytes(b) => seen(&kinds.bytes, b, check),
            KeyRepr::Digest(d) => seen(&kinds.digest, d, check),
        }
    }

    /// Gives back the charges of limits, each made at its time.
    #[cold]
    fn refund(&self, charged: &[(&Limit, Timestamp)]) {
        // A monotonic clock's reading under a lock may be ahead of a reading taken now.
        let now = (charged.iter().map(|&(_, at)| at)).fold(self.clock.now(), Timestamp::max);
        for &(limit, charged_at) in charged.iter().rev() {
            let cost = limit.cost();
            self.run(
                limit.key(),
                limit.quota(),
                now,
                Op::Refund {
                    cost,
                    charged_at,
                    last: None,
                },
            );
        }
    }

    #[inline]
    fn run(&self, key: &Key, quota: &Quota, now: Timestamp, op: Op) -> Decision {
        self.run_at(key, quota, now, op).0
    }

    /// [`run`](Self::run), and the time it decided at.
    fn run_at(&self, key: &Key, quota: &Quota, now: Timestamp, op: Op) -> (Decision, Timestamp) {
        let ask = Ask { quota, now, op };
        let decision = match self.apply(key, ask) {
            Outcome::Charged(decision, at) => return (decision, at),
            Outcome::Decided(decision) => decision,
            // A key without state peeks (and probes) like a fresh one.
            Outcome::Absent | Outcome::Removed => match quota.algorithm() {
                Algorithm::Gcra => fresh::<GcraState>(now, quota, op),
                Algorithm::TokenBucket => fresh::<TokenBucketState>(now, quota, op),
                Algorithm::FixedWindow => fresh::<FixedWindowState>(now, quota, op),
                Algorithm::SlidingWindow => fresh::<SlidingWindowState>(now, quota, op),
                Algorithm::SlidingLog => fresh::<SlidingLogState>(now, quota, op),
            },
        };
        (decision, now)
    }

    #[inline]
    fn apply(&self, key: &Key, ask: Ask<'_>) -> Outcome {
        let limits = &self.limits;
        let create = ask.op.creates();
        if let Some(limit) = limits.find(key.scope(), ask.quota, create) {
            return with_tables!(limits, &limit.tables, |kinds, overflow| {
                self.in_kinds(kinds, overflow, limit.id, key, ask)
            });
        }
        // No slot in the directory: the overflow tables, with the limit in every key.
        let any = AnyKey::new(key.limit_id(ask.quota), key);
        let overflow = &limits.overflow;
        match ask.quota.algorithm() {
            Algorithm::Gcra => self.in_overflow(&overflow.gcra, &any, ask),
            Algorithm::TokenBucket => self.in_overflow(&overflow.token_bucket, &any, ask),
            Algorithm::FixedWindow => self.in_overflow(&overflow.fixed_window, &any, ask),
            Algorithm::SlidingWindow => self.in_overflow(&overflow.sliding_window, &any, ask),
            Algorithm::SlidingLog => self.in_overflow(&overflow.sliding_log, &any, ask),
        }
    }

    /// In the limit's table for the key's kind.
    #[inline]
    fn in_kinds<V: Decide>(
        &self,
        kinds: &KindTables<V>,
        overflow: &OverflowTable<V>,
        id: u64,
        key: &Key,
        ask: Ask<'_>,
    ) -> Outcome {
        let elsewhere = || Elsewhere { overflow, id, key };
        match key.repr() {
            KeyRepr::Int(n) => self.in_place(&kinds.int, elsewhere(), &n, || n, ask),
            KeyRepr::Ip(ip) => self.in_place(&kinds.ip, elsewhere(), ip, || *ip, ask),
            KeyRepr::Bytes(b) => {
                self.in_place(&kinds.bytes, elsewhere(), b, || StoredBytes::new(b), ask)
            }
            KeyRepr::Digest(d) => self.in_place(&kinds.digest, elsewhere(), d, || *d, ask),
        }
    }

    /// In the table where keys of this kind of this limit live: its own, or the overflow.
    #[inline]
    fn in_place<K, Q, V>(
        &self,
        cell: &OnceLock<Placed<K, V>>,
        elsewhere: Elsewhere<'_, V>,
        probe: &Q,
        make: impl Fn() -> K,
        ask: Ask<'_>,
    ) -> Outcome
    where
        K: StoredKey + Borrow<Q>,
        Q: Eq + Hash + ?Sized,
        V: Decide,
    {
        let placed = if ask.op.creates() {
            self.limits.placed(cell)
        } else {
            match cell.get() {
                Some(placed) => placed,
                None => return Outcome::Absent,
            }
        };
        match placed {
            Placed::Own(table) => self.in_table(table, probe, make, ask),
            Placed::Overflow => {
                let any = AnyKey::new(elsewhere.id, elsewhere.key);
                self.in_overflow(elsewhere.overflow, &any, ask)
            }
        }
    }

    fn in_overflow<V: Decide>(
        &self,
        cell: &OverflowTable<V>,
        key: &AnyKey,
        ask: Ask<'_>,
    ) -> Outcome {
        let table = if ask.op.creates() {
            self.limits.overflow(cell)
        } else {
            cell.get().and_then(Option::as_ref)
        };
        match table {
            Some(table) => self.in_table(table, key, || key.clone(), ask),
            None if ask.op.creates() => Outcome::Charged(self.refuse(ask.quota), ask.now),
            None => Outcome::Absent,
        }
    }

    #[inline]
    fn in_table<K, Q, V>(
        &self,
        table: &Table<K, V>,
        probe: &Q,
        make: impl Fn() -> K,
        ask: Ask<'_>,
    ) -> Outcome
    where
        K: StoredKey + Borrow<Q>,
        Q: Eq + Hash + ?Sized,
        V: Decide,
    {
        let Ask { quota, now, op } = ask;
        let hash = table.hash(probe);
        match op {
            Op::Check(cost) => {
                let check = |slot: &V| slot.check(now, cost, quota, &self.clock);
                if let Some((decision, at)) = table.get(hash, probe, check) {
                    return Outcome::Charged(decision, at);
                }
                // Seen for the first time: make room for it (see `Table`), then decide.
                let now_us = now.as_micros();
                self.limits.sweep_step(now_us);
                let entry = || (make(), V::new(quota));
                let budget = &self.limits.budget;
                let mut decided = table.get_or_insert(hash, probe, entry, now_us, budget, check);
                // The key's shard had nothing left to evict, while others hold the bound:
                // evict elsewhere (a few times: one entry may not free enough), then again.
                for _ in 0..EVICT_ELSEWHERE {
                    if decided.is_some() || !self.limits.evict_any(now_us) {
                        break;
                    }
                    decided = table.get_or_insert(hash, probe, entry, now_us, budget, check);
                }
                let (decision, at) = decided.unwrap_or_else(|| (self.refuse(quota), now));
                Outcome::Charged(decision, at)
            }
            Op::Peek => table
                .get(hash, probe, |slot| slot.inspect(|s| s.peek(now, quota)))
                .map_or(Outcome::Absent, Outcome::Decided),
            Op::Probe(cost) => table
                .get(hash, probe, |slot| {
                    slot.inspect(|s| s.clone().check(now, cost, quota))
                })
                .map_or(Outcome::Absent, Outcome::Decided),
            Op::Refund {
                cost,
                charged_at,
                last,
            } => {
                table.get(hash, probe, |slot| {
                    slot.refund(now, (charged_at, last), cost, quota)
                });
                Outcome::Absent
            }
            Op::Remove => {
                table.remove(hash, probe, &self.limits.budget);
                Outcome::Removed
            }
        }
    }

    /// The decision for a new key the store could make no room for: denied for a second (or
    /// the quota's period, if shorter). Only a store whose bound is too small for a new
    /// limit's tables, or for one key's state, refuses: see the crate docs.
    #[cold]
    fn refuse(&self, quota: &Quota) -> Decision {
        let wait = quota.period().min(Duration::from_secs(1));
        Decision::Denied(Info::new(u64::from(quota.burst()), 0, wait, wait))
    }
}

/// `check` on the slot of `probe` in its limit's own table, if both exist.
#[inline]
fn seen<K, Q>(
    cell: &OnceLock<Placed<K, AtomicU64>>,
    probe: &Q,
    check: impl FnOnce(&AtomicU64) -> Decision,
) -> Option<Decision>
where
    K: StoredKey + Borrow<Q>,
    Q: Eq + Hash + ?Sized,
{
    let Some(Placed::Own(table)) = cell.get() else {
        return None;
    };
    table.get(table.hash(probe), probe, check)
}

/// Where a key goes when its limit keeps keys of its kind in the overflow table.
struct Elsewhere<'a, V> {
    overflow: &'a OverflowTable<V>,
    id: u64,
    key: &'a Key,
}

impl<C: Clock> Store for MemoryStore<C> {
    /// Always decides at once: the memory store never waits.
    #[inline]
    fn check_ready(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
    ) -> Option<Result<Decision, StoreError>> {
        Some(Ok(self.check_sync(key, quota, cost)))
    }

    async fn check(&self, key: &Key, quota: &Quota, cost: u32) -> Result<Decision, StoreError> {
        Ok(self.check_sync(key, quota, cost))
    }

    /// Every limit decided in one pass over the store: see [`MemoryStore::check_all_sync`].
    async fn check_all(&self, limits: &[Limit]) -> Result<Decisions, StoreError> {
        self.check_all_sync(limits)
    }

    /// Always decides at once.
    fn check_all_ready(&self, limits: &[Limit]) -> Option<Result<Decisions, StoreError>> {
        Some(self.check_all_sync(limits))
    }

    async fn reserve(&self, limits: &[Limit], hold: Duration) -> Result<Reservation, StoreError> {
        self.reserve_sync(limits, hold)
    }

    async fn settle(&self, reservation: Reservation, actual: u32) -> Result<(), StoreError> {
        self.settle_sync(reservation, actual);
        Ok(())
    }

    /// Always settles at once.
    fn settle_ready(
        &self,
        reservation: Reservation,
        actual: u32,
    ) -> Result<Result<(), StoreError>, Reservation> {
        self.settle_sync(reservation, actual);
        Ok(Ok(()))
    }

    /// Gives back only while nothing was counted on the state since the check (its state
    /// as the check left it): a charge made after it stands where it is, and a hole before
    /// it cannot be given to a later check without letting two go on at once.
    async fn give_back(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
        ago: Duration,
        fresh_in: Duration,
    ) -> Result<(), StoreError> {
        let now = self.inner.clock.now();
        let ago = u64::try_from(ago.as_nanos()).unwrap_or(u64::MAX);
        let charged_at = Timestamp::from_nanos(now.as_nanos().saturating_sub(ago));
        // The state as the check left it is fresh at `charged_at + fresh_in`; a later charge
        // moves that on by an interval at least: half of one tells them apart.
        let fresh_in = u64::try_from(fresh_in.as_micros()).unwrap_or(u64::MAX);
        let slack = quota.emission_interval_micros() / 2;
        let last = charged_at
            .as_micros()
            .saturating_add(fresh_in)
            .saturating_add(slack);
        let refund = Op::Refund {
            cost,
            charged_at,
            last: Some(last),
        };
        let _ = self.inner.run(key, quota, now, refund);
        Ok(())
    }

    async fn renew(&self, held: &[(Limit, u64)], hold: Duration) -> Result<(), StoreError> {
        self.renew_sync(held, hold);
        Ok(())
    }

    async fn refund(&self, key: &Key, quota: &Quota, units: u32) -> Result<(), StoreError> {
        self.refund_sync(key, quota, units);
        Ok(())
    }

    async fn peek(&self, key: &Key, quota: &Quota) -> Result<Decision, StoreError> {
        let now = self.inner.clock.now();
        Ok(self.inner.run(key, quota, now, Op::Peek))
    }

    async fn reset(&self, key: &Key, quota: &Quota) -> Result<(), StoreError> {
        let now = self.inner.clock.now();
        let _ = self.inner.run(key, quota, now, Op::Remove);
        Ok(())
    }
}

/// Configures a [`MemoryStore`]; made by [`MemoryStore::builder`].
///
/// ```
/// use ratewarden_core::ManualClock;
/// use ratewarden_memory::MemoryStore;
/// use std::num::NonZeroUsize;
///
/// let store = MemoryStore::builder()
///     .max_memory(NonZeroUsize::new(8 << 20).unwrap())
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// assert!(store.is_empty() && store.memory() <= 8 << 20);
/// ```
#[derive(Debug)]
#[must_use]
pub struct MemoryStoreBuilder<C = MonotonicClock> {
    max_memory: usize,
    clock: C,
}

impl<C: Clock> MemoryStoreBuilder<C> {
    /// The most memory the store's state may take, in bytes (default 64 MiB; at least
    /// [`MIN_MEMORY`], 256 KiB, or [`build`](Self::build) refuses it). See the
    /// [crate documentation](crate) for what is counted and what happens when it is reached.
    ///
    /// See [`MemoryStoreBuilder`] for an example.
    pub fn max_memory(mut self, bytes: NonZeroUsize) -> Self {
        self.max_memory = bytes.get();
        self
    }

    /// The clock to decide by (default [`MonotonicClock`]); a [`ManualClock`](ratewarden_core::ManualClock)
    /// in tests.
    ///
    /// See [`MemoryStoreBuilder`] for an example.
    pub fn clock<C2: Clock>(self, clock: C2) -> MemoryStoreBuilder<C2> {
        MemoryStoreBuilder {
            max_memory: self.max_memory,
            clock,
        }
    }

    /// Builds the store.
    ///
    /// # Errors
    ///
    /// [`ConfigError::MaxMemoryTooSmall`] for a bound below [`MIN_MEMORY`]: what its
    /// directory of limits takes before its first key.
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// use ratewarden_memory::{ConfigError, MemoryStore, MIN_MEMORY};
    ///
    /// let store = MemoryStore::builder().build()?;
    /// assert!(store.is_empty());
    /// let tiny = MemoryStore::builder().max_memory(NonZeroUsize::new(1_000).unwrap()).build();
    /// assert_eq!(tiny.unwrap_err(), ConfigError::MaxMemoryTooSmall { bytes: 1_000, min: MIN_MEMORY });
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn build(self) -> Result<MemoryStore<C>, ConfigError> {
        if self.max_memory < MIN_MEMORY {
            return Err(ConfigError::MaxMemoryTooSmall {
                bytes: self.max_memory,
                min: MIN_MEMORY,
            });
        }
        Ok(self.build_valid())
    }

    /// The store, from settings known to be valid.
    fn build_valid(self) -> MemoryStore<C> {
        MemoryStore {
            inner: Arc::new(Inner {
                clock: self.clock,
                limits: Limits::new(self.max_memory),
            }),
        }
    }
}

/// The least memory a [`MemoryStore`] can be bounded to: its directory of limits, before its
/// first key (256 KiB).
pub const MIN_MEMORY: usize = Limits::MIN_BYTES;

/// A [`MemoryStoreBuilder`] setting that cannot work.
///
/// ```
/// let error = ratewarden_memory::ConfigError::MaxMemoryTooSmall { bytes: 1_000, min: 262_144 };
/// assert_eq!(error.to_string(), "max_memory of 1000 bytes is below the least a store can hold, 262144 bytes");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The memory bound is below [`MIN_MEMORY`].
    MaxMemoryTooSmall {
        /// The bound given.
        bytes: usize,
        /// The least allowed.
        min: usize,
    },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MaxMemoryTooSmall { bytes, min } => write!(
                f,
                "max_memory of {bytes} bytes is below the least a store can hold, {min} bytes"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}
