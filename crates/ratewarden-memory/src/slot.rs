//! What a table keeps per key: a [`Slot`], the state of one key under one quota.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use ratewarden_core::algorithm::{AlgorithmState, GcraState, Ledger, SlidingLogState};
use ratewarden_core::{Decision, Quota, Timestamp};

/// The state of one key under one quota, as a table stores it.
pub(crate) trait Slot: Send + Sync + 'static {
    /// A fresh state for `quota`, with room for everything the quota can make it hold.
    fn new(quota: &Quota) -> Self;

    /// The microsecond from which this state equals a fresh one.
    fn fresh_at(&self) -> u64;

    /// Bytes this state owns on the heap (beyond its place in the table).
    fn heap_bytes(&self) -> usize {
        0
    }

    /// Whether the entry must not be evicted at `now` (µs) to make room, whatever its
    /// `fresh_at`: a ledger's live holds and debt, which evicted would admit over the quota
    /// (an in-flight limit's places given to others while their requests run).
    fn is_pinned(&self, now: u64) -> bool {
        let _ = now;
        false
    }
}

/// GCRA: the theoretical arrival time, updated by compare-and-swap under a shared lock.
impl Slot for AtomicU64 {
    fn new(_quota: &Quota) -> Self {
        Self::new(0)
    }

    fn fresh_at(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }
}

/// A 64-bit cell holding a GCRA TAT: the std atomic, or loom's in its model tests.
pub(crate) trait TatCell {
    fn load(&self) -> u64;
    fn compare_exchange_weak(&self, current: u64, new: u64) -> Result<u64, u64>;
}

impl TatCell for AtomicU64 {
    #[inline]
    fn load(&self) -> u64 {
        self.load(Ordering::Acquire)
    }

    #[inline]
    fn compare_exchange_weak(&self, current: u64, new: u64) -> Result<u64, u64> {
        self.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
    }
}

/// How much older than another thread's a reading of a clock that is not monotonic may be
/// when it reaches the compare-and-swap (the time between reading the clock and deciding): a
/// TAT no further than this past a reading's horizon is left where it is.
pub(crate) const STALE_READING_MICROS: u64 = 1_000_000;

/// One GCRA check on a shared cell: decide on the TAT read, and write the new TAT only if no
/// one else wrote in between (else decide again on theirs). Exact under any interleaving:
/// every admission moves the TAT on from the value it was decided on.
///
/// A thread whose clock reading is older than another's write (it read the clock, then
/// waited) decides more strictly, never more loosely, and never moves the TAT back. With a
/// `monotonic` clock that is the only way a TAT gets past a reading's horizon (`now + τ`),
/// so it is never pulled back. With another clock, a TAT more than
/// [`STALE_READING_MICROS`] past the horizon is a clock that stepped back: it is pulled back
/// to that distance from the horizon, so such a clock denies a key for at most its horizon
/// and a second (a reading staler than a second gives back what it is staler by).
#[inline]
pub(crate) fn gcra_check(
    tat: &impl TatCell,
    now: Timestamp,
    cost: u32,
    quota: &Quota,
    monotonic: bool,
) -> Decision {
    let mut current = tat.load();
    loop {
        let mut state = GcraState { tat: current };
        let decision = state.check(now, cost, quota);
        let new = if state.tat >= current {
            state.tat
        } else if monotonic {
            current
        } else {
            // ratewarden-core pulled a TAT past the horizon back to it: here, only as far as a stale
            // reading could not have pushed it.
            let horizon = now.as_micros().saturating_add(quota.tolerance_micros());
            horizon.saturating_add(STALE_READING_MICROS).min(current)
        };
        if new == current {
            return decision;
        }
        match tat.compare_exchange_weak(current, new) {
            Ok(_) => return decision,
            Err(actual) => current = actual,
        }
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

/// The states whose size is fixed.
macro_rules! fixed_size_slot {
    ($($state:ty),*) => {$(
        impl Slot for Locked<$state> {
            fn new(_quota: &Quota) -> Self {
                Self::default()
            }

            fn fresh_at(&self) -> u64 {
                self.lock().1
            }
        }
    )*};
}

fixed_size_slot!(
    ratewarden_core::algorithm::TokenBucketState,
    ratewarden_core::algorithm::FixedWindowState,
    ratewarden_core::algorithm::SlidingWindowState
);

/// The sliding log holds up to `count` timestamps: room for all of them is made (and counted
/// against the store's memory) when the key is created, so the log never grows afterwards.
impl Slot for Locked<SlidingLogState> {
    fn new(quota: &Quota) -> Self {
        let entries = VecDeque::with_capacity(quota.count() as usize);
        Self(Mutex::new((SlidingLogState { entries }, 0)))
    }

    fn fresh_at(&self) -> u64 {
        self.lock().1
    }

    fn heap_bytes(&self) -> usize {
        self.lock().0.entries.capacity() * size_of::<u64>()
    }
}

/// A reserved limit's [`Ledger`] and its `fresh_at`, behind a mutex.
#[derive(Debug, Default)]
pub(crate) struct LedgerSlot<S>(Mutex<(Ledger<S>, u64)>);

impl<S: AlgorithmState> LedgerSlot<S> {
    /// Runs `f` on the ledger, then records when it becomes fresh.
    pub(crate) fn update<R>(&self, quota: &Quota, f: impl FnOnce(&mut Ledger<S>) -> R) -> R {
        let mut guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let result = f(&mut guard.0);
        guard.1 = guard.0.fresh_at(quota);
        result
    }

    /// Runs `f` on the ledger as it is.
    pub(crate) fn inspect<R>(&self, f: impl FnOnce(&Ledger<S>) -> R) -> R {
        f(&self.0.lock().unwrap_or_else(PoisonError::into_inner).0)
    }

    fn fresh(&self) -> u64 {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).1
    }

    /// A new ledger, its holds starting at a round no ledger of this process used before: a
    /// late settle of a hold of a ledger swept or evicted since never ends a hold of this one.
    fn starting() -> Self {
        /// Each ledger's first round: 2^32 rounds apart, more than any ledger moves through.
        static NEXT: AtomicU64 = AtomicU64::new(1 << 32);
        let round = NEXT.fetch_add(1 << 32, Ordering::Relaxed);
        Self(Mutex::new((Ledger::starting_at(round), 0)))
    }

    fn pinned(&self, now: u64) -> bool {
        let guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        guard.0.is_pinned(Timestamp::from_micros(now))
    }
}

/// The ledgers of the fixed-size states.
macro_rules! fixed_size_ledger {
    ($($state:ty),*) => {$(
        impl Slot for LedgerSlot<$state> {
            fn new(_quota: &Quota) -> Self {
                Self::starting()
            }

            fn fresh_at(&self) -> u64 {
                self.fresh()
            }

            fn is_pinned(&self, now: u64) -> bool {
                self.pinned(now)
            }
        }
    )*};
}

fixed_size_ledger!(
    GcraState,
    ratewarden_core::algorithm::TokenBucketState,
    ratewarden_core::algorithm::FixedWindowState,
    ratewarden_core::algorithm::SlidingWindowState
);

/// A sliding log's ledger: room for `count` entries made at once, as for a checked log.
impl Slot for LedgerSlot<SlidingLogState> {
    fn new(quota: &Quota) -> Self {
        let slot = Self::starting();
        let entries = VecDeque::with_capacity(quota.count() as usize);
        slot.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .state = SlidingLogState { entries };
        slot
    }

    fn fresh_at(&self) -> u64 {
        self.fresh()
    }

    fn is_pinned(&self, now: u64) -> bool {
        self.pinned(now)
    }

    fn heap_bytes(&self) -> usize {
        let guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        guard.0.state.entries.capacity() * size_of::<u64>()
    }
}

#[cfg(all(test, rl_loom))]
mod loom_tests {
    //! The compare-and-swap under every interleaving loom can find:
    //! `RUSTFLAGS="--cfg rl_loom" cargo test -p ratewarden-memory --release --lib loom`.

    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicU64, Ordering};
    use ratewarden_core::{Quota, Timestamp};

    use super::{TatCell, gcra_check};

    /// Every interleaving with up to 3 preemptions (loom's advice: bugs need few).
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(f);
    }

    impl TatCell for AtomicU64 {
        fn load(&self) -> u64 {
            self.load(Ordering::Acquire)
        }

        fn compare_exchange_weak(&self, current: u64, new: u64) -> Result<u64, u64> {
            self.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire)
        }
    }

    /// Three threads check at once against a burst of 2: exactly two are admitted.
    #[test]
    fn loom_racing_checks_admit_exactly_the_burst() {
        model(|| {
            let quota = Quota::per_hour(2).expect("a valid quota");
            let tat = Arc::new(AtomicU64::new(0));
            let now = Timestamp::from_micros(1_000_000);
            let threads: Vec<_> = (0..3)
                .map(|_| {
                    let tat = Arc::clone(&tat);
                    loom::thread::spawn(move || {
                        gcra_check(&*tat, now, 1, &quota, false).is_allowed()
                    })
                })
                .collect();
            let admitted = threads
                .into_iter()
                .filter_map(|t| t.join().ok())
                .filter(|&allowed| allowed)
                .count();
            assert_eq!(admitted, 2);
        });
    }

    /// Threads whose clock readings differ (one read its clock, then waited): the TAT never
    /// moves back, and no more than the quota allows by the latest reading is admitted.
    #[test]
    fn loom_a_stale_reading_never_moves_the_tat_back() {
        model(|| {
            let quota = Quota::per_second(1).expect("a valid quota");
            let tat = Arc::new(AtomicU64::new(0));
            let readings = [5_000_000, 4_000_000, 5_000_000];
            let threads: Vec<_> = readings
                .into_iter()
                .enumerate()
                .map(|(i, at)| {
                    let tat = Arc::clone(&tat);
                    // The second thread only peeks (cost 0), which is where a stale reading
                    // could have pulled the TAT back.
                    let cost = if i == 1 { 0 } else { 1 };
                    loom::thread::spawn(move || {
                        let before = tat.load(Ordering::Acquire);
                        let decision =
                            gcra_check(&*tat, Timestamp::from_micros(at), cost, &quota, false);
                        assert!(tat.load(Ordering::Acquire) >= before);
                        decision.is_allowed() && cost > 0
                    })
                })
                .collect();
            let admitted = threads
                .into_iter()
                .filter_map(|t| t.join().ok())
                .filter(|&allowed| allowed)
                .count();
            assert_eq!(admitted, 1, "burst 1 at one instant");
        });
    }
}
