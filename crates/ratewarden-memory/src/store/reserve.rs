//! Reservations on the memory store: each reserved limit's [`Ledger`], in tables of their own.

use std::time::Duration;

use ratewarden_core::algorithm::{
    AlgorithmState, FixedWindowState, GcraState, Hold, Ledger, SlidingLogState, SlidingWindowState,
    TokenBucketState,
};
use ratewarden_core::{
    Algorithm, Clock, Decision, Decisions, Key, Limit, MAX_LIMITS, Quota, Reservation, StoreError,
    StoreErrorKind, Timestamp, merged,
};

use super::{EVICT_ELSEWHERE, Inner, MemoryStore, Op};
use crate::keys::AnyKey;
use crate::limits::OverflowTable;
use crate::slot::{LedgerSlot, Slot};

/// What to do with a reserved limit's ledger.
#[derive(Clone, Copy)]
enum LedgerOp {
    /// Decide a reservation of `units`, holding nothing.
    Probe {
        units: u32,
    },
    Reserve {
        units: u32,
        lapse_at: Timestamp,
    },
    Settle {
        hold: Hold,
        actual: u32,
    },
    Renew {
        hold: Hold,
        lapse_at: Timestamp,
    },
    Refund(u32),
}

impl LedgerOp {
    /// Whether the operation makes a ledger for a key that has none: a reservation, and a
    /// settle that charges something (its ledger evicted meanwhile, the charge still counts).
    const fn creates(self) -> bool {
        match self {
            Self::Reserve { .. } => true,
            Self::Settle { actual, .. } => actual > 0,
            Self::Probe { .. } | Self::Renew { .. } | Self::Refund(_) => false,
        }
    }

    fn apply<S: AlgorithmState>(
        self,
        ledger: &mut Ledger<S>,
        now: Timestamp,
        quota: &Quota,
    ) -> Option<(Decision, Option<Hold>)> {
        match self {
            Self::Probe { units } => Some((ledger.probe(now, units, quota), None)),
            Self::Reserve { units, lapse_at } => Some(ledger.reserve(now, units, lapse_at, quota)),
            Self::Settle { hold, actual } => {
                ledger.settle(now, hold, actual, quota);
                None
            }
            Self::Renew { hold, lapse_at } => {
                ledger.renew(now, hold, lapse_at);
                None
            }
            Self::Refund(units) => {
                ledger.refund(now, units, quota);
                None
            }
        }
    }
}

impl<C: Clock> MemoryStore<C> {
    /// Holds the estimates of `limits` for `hold`, synchronously: what
    /// [`Store::reserve`](ratewarden_core::Store::reserve) returns, without a future.
    ///
    /// Every limit first decides holding nothing (limits on one state together), so a
    /// reservation one limit denies leaves every ledger as it was; then each counted limit
    /// is held in turn, and should one have been filled by another request in between, the
    /// holds already made are released. A limit on the same state twice holds twice.
    ///
    /// # Errors
    ///
    /// [`StoreErrorKind::InvalidInput`] for more than [`MAX_LIMITS`] limits.
    ///
    /// ```
    /// use ratewarden_core::{Key, Limit, Quota};
    /// use std::time::Duration;
    /// let store = ratewarden_memory::MemoryStore::new();
    /// let tokens = Limit::new(Key::from("user-7"), Quota::per_minute(100)?, 40);
    /// let hold = Duration::from_secs(30);
    /// let first = store.reserve_sync(&[tokens.clone()], hold)?;
    /// let second = store.reserve_sync(&[tokens.clone()], hold)?;
    /// assert!(!store.reserve_sync(&[tokens.clone()], hold)?.is_allowed()); // 80 held
    /// store.settle_sync(first, 5);
    /// assert!(store.reserve_sync(&[tokens], hold)?.is_allowed()); // 5 + 40 + 40
    /// # drop(second);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_sync(
        &self,
        limits: &[Limit],
        hold: Duration,
    ) -> Result<Reservation, StoreError> {
        if limits.len() > MAX_LIMITS {
            return Err(StoreError::with_source(
                StoreErrorKind::InvalidInput,
                "more than 16 limits in one reservation",
            ));
        }
        let inner = &self.inner;
        let now = inner.clock.now();
        let lapse_at = now.saturating_add(hold);
        if let [one] = limits
            && one.is_counted()
        {
            // One limit: decided and held at once, under its ledger's lock.
            let reserve = LedgerOp::Reserve {
                units: one.cost(),
                lapse_at,
            };
            let (decision, hold) = inner
                .on_ledger(one.key(), one.quota(), now, reserve)
                .unwrap_or_else(|| (inner.refuse(one.quota()), None));
            let held = hold
                .map(|h| vec![(one.clone(), h.round)])
                .unwrap_or_default();
            return Ok(Reservation::new(Decisions::from(decision), held));
        }
        // First every limit decides, holding nothing (limits on one state together), so
        // that a request one limit denies leaves every ledger as it was.
        let (states, of) = merged(limits);
        let decided: Vec<Decision> = states
            .iter()
            .map(|limit| {
                let (key, quota) = (limit.key(), limit.quota());
                if limit.is_counted() {
                    let probe = LedgerOp::Probe {
                        units: limit.cost(),
                    };
                    match inner.on_ledger(key, quota, now, probe) {
                        Some((decision, _)) => decision,
                        // No ledger yet: a fresh one's answer.
                        None => fresh_probe(quota, now, limit.cost()),
                    }
                } else {
                    inner.run(key, quota, now, Op::Probe(limit.cost()))
                }
            })
            .collect();
        let each = |decided: &[Decision]| match of.as_slice() {
            [one] => Decisions::from(decided[*one]),
            _ => Decisions::from(of.iter().map(|&s| decided[s]).collect::<Vec<_>>()),
        };
        if !decided.iter().all(Decision::is_allowed) {
            return Ok(Reservation::new(each(&decided), Vec::new()));
        }
        // Then each counted limit is held; one that another request filled in between
        // denies, and the holds made are released.
        let mut decisions = Vec::with_capacity(limits.len());
        let mut held = Vec::with_capacity(limits.len());
        for limit in limits {
            let (key, quota) = (limit.key(), limit.quota());
            if !limit.is_counted() {
                decisions.push(inner.run(key, quota, now, Op::Probe(limit.cost())));
                continue;
            }
            let units = limit.cost();
            let reserve = LedgerOp::Reserve { units, lapse_at };
            let (decision, hold) = inner
                .on_ledger(key, quota, now, reserve)
                .unwrap_or_else(|| (inner.refuse(quota), None));
            if let Some(hold) = hold {
                held.push((limit.clone(), hold.round));
            }
            decisions.push(decision);
        }
        let decisions = match decisions.as_slice() {
            [one] => Decisions::from(*one),
            _ => Decisions::from(decisions),
        };
        if decisions.is_allowed() {
            return Ok(Reservation::new(decisions, held));
        }
        inner.settle(now, &held, 0);
        Ok(Reservation::new(decisions, Vec::new()))
    }

    /// Ends `reservation`, charging `actual` units to each limit it held, synchronously: what
    /// [`Store::settle`](ratewarden_core::Store::settle) does, without a future.
    ///
    /// See [`reserve_sync`](Self::reserve_sync) for an example.
    pub fn settle_sync(&self, reservation: Reservation, actual: u32) {
        let now = self.inner.clock.now();
        self.inner.settle(now, reservation.held(), actual);
    }

    /// Keeps the holds `held` (a reservation's [`held`](Reservation::held)) for `hold` more,
    /// synchronously: what [`Store::renew`](ratewarden_core::Store::renew) does, without a
    /// future.
    ///
    /// ```
    /// use ratewarden_core::{Key, Limit, Quota};
    /// use std::time::Duration;
    /// let store = ratewarden_memory::MemoryStore::new();
    /// let limit = Limit::new(Key::from("export"), Quota::per_hour(10)?, 1);
    /// let reservation = store.reserve_sync(&[limit], Duration::from_secs(30))?;
    /// store.renew_sync(reservation.held(), Duration::from_secs(30));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn renew_sync(&self, held: &[(Limit, u64)], hold: Duration) {
        let now = self.inner.clock.now();
        let lapse_at = now.saturating_add(hold);
        for (limit, ticket) in held {
            let hold = Hold {
                units: limit.cost(),
                round: *ticket,
            };
            let renew = LedgerOp::Renew { hold, lapse_at };
            let _ = self.inner.on_ledger(limit.key(), limit.quota(), now, renew);
        }
    }

    /// Gives back `units` of `key`'s reserved state under `quota`, synchronously: what
    /// [`Store::refund`](ratewarden_core::Store::refund) does, without a future.
    ///
    /// ```
    /// use ratewarden_core::{Key, Limit, Quota};
    /// use std::time::Duration;
    /// let store = ratewarden_memory::MemoryStore::new();
    /// let (key, quota) = (Key::from("job"), Quota::per_hour(10)?);
    /// let limit = Limit::new(key.clone(), quota, 10);
    /// let reservation = store.reserve_sync(&[limit.clone()], Duration::from_secs(60))?;
    /// store.settle_sync(reservation, 10);
    /// assert!(!store.reserve_sync(&[limit.clone()], Duration::from_secs(60))?.is_allowed());
    /// store.refund_sync(&key, &quota, 10);
    /// assert!(store.reserve_sync(&[limit], Duration::from_secs(60))?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund_sync(&self, key: &Key, quota: &Quota, units: u32) {
        let now = self.inner.clock.now();
        let _ = self
            .inner
            .on_ledger(key, quota, now, LedgerOp::Refund(units));
    }

    /// The units held at this moment by reservations of `key` under `quota` not yet settled
    /// (nor lapsed).
    ///
    /// ```
    /// use ratewarden_core::{Key, Limit, Quota};
    /// use std::time::Duration;
    /// let store = ratewarden_memory::MemoryStore::new();
    /// let (key, quota) = (Key::from("user-7"), Quota::per_minute(100)?);
    /// let reservation = store.reserve_sync(&[Limit::new(key.clone(), quota, 30)], Duration::from_secs(5))?;
    /// assert_eq!(store.held(&key, &quota), 30);
    /// store.settle_sync(reservation, 0);
    /// assert_eq!(store.held(&key, &quota), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn held(&self, key: &Key, quota: &Quota) -> u64 {
        let inner = &self.inner;
        let now = inner.clock.now();
        let reserved = &inner.limits.reserved;
        let any = AnyKey::new(key.limit_id(quota), key);
        match quota.algorithm() {
            Algorithm::Gcra => held_in(&reserved.gcra, &any, now),
            Algorithm::TokenBucket => held_in(&reserved.token_bucket, &any, now),
            Algorithm::FixedWindow => held_in(&reserved.fixed_window, &any, now),
            Algorithm::SlidingWindow => held_in(&reserved.sliding_window, &any, now),
            Algorithm::SlidingLog => held_in(&reserved.sliding_log, &any, now),
        }
    }
}

/// A reservation of `units` on a ledger not made yet: a fresh ledger's decision.
fn fresh_probe(quota: &Quota, now: Timestamp, units: u32) -> Decision {
    fn probe<S: AlgorithmState>(quota: &Quota, now: Timestamp, units: u32) -> Decision {
        Ledger::<S>::default().probe(now, units, quota)
    }
    match quota.algorithm() {
        Algorithm::Gcra => probe::<GcraState>(quota, now, units),
        Algorithm::TokenBucket => probe::<TokenBucketState>(quota, now, units),
        Algorithm::FixedWindow => probe::<FixedWindowState>(quota, now, units),
        Algorithm::SlidingWindow => probe::<SlidingWindowState>(quota, now, units),
        Algorithm::SlidingLog => probe::<SlidingLogState>(quota, now, units),
    }
}

fn held_in<S: AlgorithmState>(
    cell: &OverflowTable<LedgerSlot<S>>,
    key: &AnyKey,
    now: Timestamp,
) -> u64
where
    LedgerSlot<S>: Slot,
{
    let Some(Some(table)) = cell.get() else {
        return 0;
    };
    table
        .get(table.hash(key), key, |slot| {
            slot.inspect(|l| l.held_at(now))
        })
        .unwrap_or(0)
}

impl<C: Clock> Inner<C> {
    /// Settles each held limit at `actual`.
    fn settle(&self, now: Timestamp, held: &[(Limit, u64)], actual: u32) {
        for (limit, ticket) in held.iter().rev() {
            let hold = Hold {
                units: limit.cost(),
                round: *ticket,
            };
            let settle = LedgerOp::Settle { hold, actual };
            let _ = self.on_ledger(limit.key(), limit.quota(), now, settle);
        }
    }

    /// Runs `op` on the ledger of `key` under `quota`: `None` when it has none (and the
    /// operation makes none), or no room could be made for it.
    fn on_ledger(
        &self,
        key: &Key,
        quota: &Quota,
        now: Timestamp,
        op: LedgerOp,
    ) -> Option<(Decision, Option<Hold>)> {
        let reserved = &self.limits.reserved;
        let any = AnyKey::new(key.limit_id(quota), key);
        match quota.algorithm() {
            Algorithm::Gcra => self.in_ledgers(&reserved.gcra, &any, quota, now, op),
            Algorithm::TokenBucket => self.in_ledgers(&reserved.token_bucket, &any, quota, now, op),
            Algorithm::FixedWindow => self.in_ledgers(&reserved.fixed_window, &any, quota, now, op),
            Algorithm::SlidingWindow => {
                self.in_ledgers(&reserved.sliding_window, &any, quota, now, op)
            }
            Algorithm::SlidingLog => self.in_ledgers(&reserved.sliding_log, &any, quota, now, op),
        }
        .flatten()
    }

    fn in_ledgers<S: AlgorithmState>(
        &self,
        cell: &OverflowTable<LedgerSlot<S>>,
        key: &AnyKey,
        quota: &Quota,
        now: Timestamp,
        op: LedgerOp,
    ) -> Option<Option<(Decision, Option<Hold>)>>
    where
        LedgerSlot<S>: Slot,
    {
        let create = op.creates();
        let table = if create {
            self.limits.overflow(cell)?
        } else {
            cell.get()?.as_ref()?
        };
        let hash = table.hash(key);
        let run = |slot: &LedgerSlot<S>| slot.update(quota, |ledger| op.apply(ledger, now, quota));
        if let Some(answer) = table.get(hash, key, run) {
            return Some(answer);
        }
        if !create {
            return None;
        }
        let now_us = now.as_micros();
        self.limits.sweep_step(now_us);
        let budget = &self.limits.budget;
        let entry = || (key.clone(), LedgerSlot::<S>::new(quota));
        let mut answer = table.get_or_insert(hash, key, entry, now_us, budget, run);
        for _ in 0..EVICT_ELSEWHERE {
            if answer.is_some() || !self.limits.evict_any(now_us) {
                break;
            }
            answer = table.get_or_insert(hash, key, entry, now_us, budget, run);
        }
        answer
    }
}
