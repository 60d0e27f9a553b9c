//! [`MemoryStore`] and its builder.

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use foldhash::fast::RandomState;
use rl_core::algorithm::{
    AlgorithmState, FixedWindowState, GcraState, SlidingLogState, SlidingWindowState,
    TokenBucketState,
};
use rl_core::{
    Algorithm, Clock, Decision, Info, Key, MonotonicClock, Quota, Store, StoreError, Timestamp,
};

use crate::table::{Budget, Found, Locked, MIN_SWEEP, Slot, Tables};

/// The default bound on live keys: 1,000,000 (about 36 MB of GCRA state with integer keys).
const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// An in-process [`Store`]: a sharded map of key -> compact state, bounded, with no background
/// thread. Clones share one map.
///
/// See the [crate documentation](crate) for how keys are bounded and forgotten.
///
/// ```
/// use rl_core::{Key, ManualClock, Quota, Store};
/// use rl_store_memory::MemoryStore;
/// use std::time::Duration;
///
/// # tokio_test();
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn tokio_test() {
/// let clock = ManualClock::default();
/// let store = MemoryStore::builder().clock(clock.clone()).build();
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
    budget: Budget,
    gcra: Tables<AtomicU64>,
    token_bucket: Tables<Locked<TokenBucketState>>,
    fixed_window: Tables<Locked<FixedWindowState>>,
    sliding_window: Tables<Locked<SlidingWindowState>>,
    sliding_log: Tables<Locked<SlidingLogState>>,
}

impl<C> fmt::Debug for MemoryStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("len", &self.len())
            .field("max_keys", &self.inner.budget.max_keys)
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// A store with the default bound (1,000,000 keys) and a [`MonotonicClock`].
    ///
    /// ```
    /// let store = rl_store_memory::MemoryStore::new();
    /// assert_eq!(store.len(), 0);
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder to set the bound or the clock.
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// let store = rl_store_memory::MemoryStore::builder()
    ///     .max_keys(NonZeroUsize::new(10_000).unwrap())
    ///     .build();
    /// # drop(store);
    /// ```
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            max_keys: DEFAULT_MAX_KEYS,
            shards: None,
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
    /// How many keys hold state (including ones not yet swept after they became fresh).
    ///
    /// ```
    /// use rl_core::{Key, Quota};
    /// let store = rl_store_memory::MemoryStore::new();
    /// store.check_sync(&Key::from(1u64), &Quota::per_second(1)?, 1);
    /// assert_eq!(store.len(), 1);
    /// # Ok::<(), rl_core::QuotaError>(())
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.budget.len.load(Ordering::Acquire)
    }

    /// Whether no key holds state.
    ///
    /// ```
    /// assert!(rl_store_memory::MemoryStore::new().is_empty());
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<C: Clock> MemoryStore<C> {
    /// Checks `cost` against `key` under `quota` now, synchronously: the same decision
    /// [`Store::check`] returns, without a future.
    ///
    /// ```
    /// use rl_core::{Key, Quota};
    /// let store = rl_store_memory::MemoryStore::new();
    /// let quota = Quota::per_minute(10)?;
    /// let decision = store.check_sync(&Key::from("a"), &quota, 3);
    /// assert_eq!(decision.info().remaining(), 7);
    /// # Ok::<(), rl_core::QuotaError>(())
    /// ```
    #[inline]
    pub fn check_sync(&self, key: &Key, quota: &Quota, cost: u32) -> Decision {
        let now = self.inner.clock.now();
        self.inner.decide(key, quota, now, Mode::Check(cost))
    }

    /// Forgets every key whose state equals a fresh one now; returns how many. Never needed
    /// for correctness or bounds (the store sweeps as it grows), but frees memory after a burst
    /// of keys at a chosen moment.
    ///
    /// ```
    /// use rl_core::{Key, ManualClock, Quota};
    /// use std::time::Duration;
    /// let clock = ManualClock::default();
    /// let store = rl_store_memory::MemoryStore::builder().clock(clock.clone()).build();
    /// store.check_sync(&Key::from(1u64), &Quota::per_second(1)?, 1);
    /// assert_eq!(store.sweep(), 0); // still counted: not fresh yet
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(store.sweep(), 1);
    /// assert!(store.is_empty());
    /// # Ok::<(), rl_core::QuotaError>(())
    /// ```
    pub fn sweep(&self) -> usize {
        self.inner.sweep(self.inner.clock.now().as_micros())
    }
}

#[derive(Clone, Copy)]
enum Mode {
    Check(u32),
    Peek,
}

impl<C: Clock> Inner<C> {
    #[inline]
    fn decide(&self, key: &Key, quota: &Quota, now: Timestamp, mode: Mode) -> Decision {
        match quota.algorithm() {
            Algorithm::Gcra => self.gcra(key, quota, now, mode),
            Algorithm::TokenBucket => self.locked(&self.token_bucket, key, quota, now, mode),
            Algorithm::FixedWindow => self.locked(&self.fixed_window, key, quota, now, mode),
            Algorithm::SlidingWindow => self.locked(&self.sliding_window, key, quota, now, mode),
            _ => self.locked(&self.sliding_log, key, quota, now, mode),
        }
    }

    #[inline]
    fn gcra(&self, key: &Key, quota: &Quota, now: Timestamp, mode: Mode) -> Decision {
        let Mode::Check(cost) = mode else {
            let peek = |tat: &AtomicU64| {
                GcraState {
                    tat: tat.load(Ordering::Acquire),
                }
                .peek(now, quota)
            };
            return self
                .gcra
                .get(key, peek)
                .unwrap_or_else(|| GcraState::default().peek(now, quota));
        };
        let cas = |tat: &AtomicU64| {
            let mut current = tat.load(Ordering::Acquire);
            loop {
                let mut state = GcraState { tat: current };
                let decision = state.check(now, cost, quota);
                if !decision.is_allowed() || state.tat == current {
                    return decision;
                }
                match tat.compare_exchange_weak(
                    current,
                    state.tat,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return decision,
                    Err(actual) => current = actual,
                }
            }
        };
        match self.gcra.get(key, cas) {
            Some(decision) => decision,
            None => self.insert(&self.gcra, key, quota, now, &cas),
        }
    }

    fn locked<S: AlgorithmState>(
        &self,
        tables: &Tables<Locked<S>>,
        key: &Key,
        quota: &Quota,
        now: Timestamp,
        mode: Mode,
    ) -> Decision {
        match mode {
            Mode::Check(cost) => {
                let check =
                    |slot: &Locked<S>| slot.update(quota, |state| state.check(now, cost, quota));
                match tables.get(key, check) {
                    Some(decision) => decision,
                    None => self.insert(tables, key, quota, now, &check),
                }
            }
            Mode::Peek => tables
                .get(key, |slot| slot.lock().0.peek(now, quota))
                .unwrap_or_else(|| S::default().peek(now, quota)),
        }
    }

    /// Decides on a key seen for the first time: creates its slot, or, when the store is full
    /// and nothing can be forgotten yet, denies it until something can.
    #[inline(never)]
    fn insert<V: Slot>(
        &self,
        tables: &Tables<V>,
        key: &Key,
        quota: &Quota,
        now: Timestamp,
        f: &dyn Fn(&V) -> Decision,
    ) -> Decision {
        let now_us = now.as_micros();
        let try_insert = || match tables.insert(&self.budget, key, f) {
            Found::Slot(decision) => Some(decision),
            Found::Created(decision) => {
                if self.budget.claim_growth_sweep() {
                    self.sweep(now_us);
                }
                Some(decision)
            }
            Found::Full => None,
        };
        if let Some(decision) = try_insert() {
            return decision;
        }
        // Full: forget what can be forgotten, at most once per FULL_SWEEP_INTERVAL.
        if self.budget.claim_full_sweep(now_us) {
            self.sweep(now_us);
            if let Some(decision) = try_insert() {
                return decision;
            }
        }
        let retry_at = self
            .budget
            .room_at()
            .min(now_us.saturating_add(quota.period_micros()));
        let wait = Duration::from_nanos(
            retry_at
                .saturating_mul(1_000)
                .saturating_sub(now.as_nanos()),
        );
        Decision::Denied(Info::new(u64::from(quota.burst()), 0, wait, wait))
    }

    fn sweep(&self, now_us: u64) -> usize {
        let results = [
            self.gcra.sweep(now_us),
            self.token_bucket.sweep(now_us),
            self.fixed_window.sweep(now_us),
            self.sliding_window.sweep(now_us),
            self.sliding_log.sweep(now_us),
        ];
        let freed = results.iter().map(|r| r.0).sum();
        let next = results.iter().map(|r| r.1).min().unwrap_or(u64::MAX);
        self.budget.swept(freed, next);
        freed
    }

    fn remove(&self, key: &Key, quota: &Quota) {
        let removed = match quota.algorithm() {
            Algorithm::Gcra => self.gcra.remove(key),
            Algorithm::TokenBucket => self.token_bucket.remove(key),
            Algorithm::FixedWindow => self.fixed_window.remove(key),
            Algorithm::SlidingWindow => self.sliding_window.remove(key),
            _ => self.sliding_log.remove(key),
        };
        if removed {
            self.budget.len.fetch_sub(1, Ordering::AcqRel);
        }
    }
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

    async fn peek(&self, key: &Key, quota: &Quota) -> Result<Decision, StoreError> {
        let now = self.inner.clock.now();
        Ok(self.inner.decide(key, quota, now, Mode::Peek))
    }

    async fn reset(&self, key: &Key, quota: &Quota) -> Result<(), StoreError> {
        self.inner.remove(key, quota);
        Ok(())
    }
}

/// Configures a [`MemoryStore`]; made by [`MemoryStore::builder`].
///
/// ```
/// use rl_core::ManualClock;
/// use rl_store_memory::MemoryStore;
/// use std::num::NonZeroUsize;
///
/// let store = MemoryStore::builder()
///     .max_keys(NonZeroUsize::new(100_000).unwrap())
///     .clock(ManualClock::default())
///     .build();
/// # drop(store);
/// ```
#[derive(Debug)]
#[must_use]
pub struct MemoryStoreBuilder<C = MonotonicClock> {
    max_keys: usize,
    shards: Option<usize>,
    clock: C,
}

impl<C: Clock> MemoryStoreBuilder<C> {
    /// The most keys that hold state at once (default 1,000,000). See the
    /// [crate documentation](crate) for what happens when it is reached.
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// let builder = rl_store_memory::MemoryStore::builder().max_keys(NonZeroUsize::MIN);
    /// # drop(builder);
    /// ```
    pub fn max_keys(mut self, max_keys: NonZeroUsize) -> Self {
        self.max_keys = max_keys.get();
        self
    }

    /// How many shards the map is split into (rounded up to a power of two; default four per
    /// CPU). More shards mean less contention on new keys, and a little more fixed memory.
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// let builder = rl_store_memory::MemoryStore::builder().shards(NonZeroUsize::new(64).unwrap());
    /// # drop(builder);
    /// ```
    pub fn shards(mut self, shards: NonZeroUsize) -> Self {
        self.shards = Some(shards.get());
        self
    }

    /// The clock to decide by (default [`MonotonicClock`]); a [`ManualClock`](rl_core::ManualClock)
    /// in tests.
    ///
    /// ```
    /// let builder = rl_store_memory::MemoryStore::builder().clock(rl_core::ManualClock::default());
    /// # drop(builder);
    /// ```
    pub fn clock<C2: Clock>(self, clock: C2) -> MemoryStoreBuilder<C2> {
        MemoryStoreBuilder {
            max_keys: self.max_keys,
            shards: self.shards,
            clock,
        }
    }

    /// Builds the store.
    ///
    /// ```
    /// let store = rl_store_memory::MemoryStore::builder().build();
    /// assert!(store.is_empty());
    /// ```
    pub fn build(self) -> MemoryStore<C> {
        let shards = self
            .shards
            .unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(4, |n| n.get().saturating_mul(4))
            })
            .clamp(1, 1 << 16)
            .next_power_of_two();
        let hasher = RandomState::default();
        MemoryStore {
            inner: Arc::new(Inner {
                clock: self.clock,
                budget: Budget {
                    max_keys: self.max_keys,
                    len: AtomicUsize::new(0),
                    next_fresh_at: AtomicU64::new(u64::MAX),
                    last_full_sweep: AtomicU64::new(0),
                    sweep_at: AtomicUsize::new(MIN_SWEEP),
                },
                gcra: Tables::new(&hasher, shards),
                token_bucket: Tables::new(&hasher, shards),
                fixed_window: Tables::new(&hasher, shards),
                sliding_window: Tables::new(&hasher, shards),
                sliding_log: Tables::new(&hasher, shards),
            }),
        }
    }
}
