//! The [`Store`] trait: where limiter state lives.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::{
    Decision, Decisions, Key, Limit, MAX_LIMITS, Quota, Reservation, StoreError, StoreErrorKind,
};

/// Where limiter state lives. Implemented by `ratewarden-memory` (in process) and
/// `ratewarden-redis` (shared by a fleet).
///
/// A store keeps one state per key, [scope](Key::scoped) and [`Quota`]
/// ([`Key::limit_id`]): requests decided under different quotas, or under differently named
/// limits, never share state, even on one key.
///
/// The futures are `Send`, so generic callers (a tower service) can spawn or box them, while an
/// implementor may write plain `async fn`s.
///
/// ```
/// use ratewarden_core::{Decision, Info, Key, Quota, Store, StoreError};
/// use std::time::Duration;
///
/// /// A store that admits everything (for illustration).
/// struct AllowAll;
///
/// impl Store for AllowAll {
///     async fn check(&self, _: &Key, quota: &Quota, _: u32) -> Result<Decision, StoreError> {
///         let limit = u64::from(quota.burst());
///         Ok(Decision::Allowed(Info::new(limit, limit, Duration::ZERO, Duration::ZERO)))
///     }
///     async fn peek(&self, key: &Key, quota: &Quota) -> Result<Decision, StoreError> {
///         self.check(key, quota, 0).await
///     }
///     async fn reset(&self, _: &Key, _: &Quota) -> Result<(), StoreError> {
///         Ok(())
///     }
/// }
///
/// async fn is_allowed<S: Store>(store: &S, key: &Key, quota: &Quota) -> bool {
///     matches!(store.check(key, quota, 1).await, Ok(d) if d.is_allowed())
/// }
/// ```
pub trait Store: Send + Sync + 'static {
    /// Counts `cost` units against `key` under `quota` if they fit, and says what happened.
    ///
    /// A cost of 0 consumes nothing and reports the key's state. A cost the quota can never
    /// admit is [`Decision::InsufficientCapacity`].
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot decide (unreachable, timed out, ...). Never for a
    /// denial.
    fn check(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Checks a request against several limits together (at most [`MAX_LIMITS`]): every
    /// limit admits its cost and all are counted, or none is counted and the answer says
    /// which denied ([`Decisions::binding`]).
    ///
    /// A [probe](Limit::probe) must admit its cost like any limit, and is never counted.
    ///
    /// The default decides one counted limit by [`check`](Self::check) and no limits as
    /// admitted; for several, or a probe, it answers [`StoreErrorKind::Unsupported`]
    /// (counting nothing), as a store that checks one limit at a time cannot keep them
    /// all-or-nothing. A store that can overrides it.
    ///
    /// # Errors
    ///
    /// As for [`check`](Self::check); [`StoreErrorKind::InvalidInput`] for more than
    /// [`MAX_LIMITS`] limits.
    ///
    /// ```
    /// # async fn demo(store: impl ratewarden_core::Store) -> Result<(), ratewarden_core::StoreError> {
    /// use ratewarden_core::{Key, Limit, Quota, Store};
    /// let user = Key::from("user-7");
    /// let decisions = store
    ///     .check_all(&[Limit::new(user, Quota::per_second(10).unwrap(), 1)])
    ///     .await?;
    /// println!("admitted: {}", decisions.is_allowed());
    /// # Ok(()) }
    /// ```
    fn check_all(
        &self,
        limits: &[Limit],
    ) -> impl Future<Output = Result<Decisions, StoreError>> + Send {
        async move {
            match limits {
                [] => Ok(Decisions::default()),
                [one] if one.is_counted() => {
                    let decision = self.check(one.key(), one.quota(), one.cost()).await?;
                    Ok(Decisions::from(decision))
                }
                _ if limits.len() > MAX_LIMITS => Err(StoreError::with_source(
                    StoreErrorKind::InvalidInput,
                    "more than 16 limits in one check",
                )),
                _ => Err(StoreError::with_source(
                    StoreErrorKind::Unsupported,
                    "this store decides one limit at a time",
                )),
            }
        }
    }

    /// Decides at once, if this store can: a store that needs no I/O (the memory store) returns
    /// `Some`, sparing its caller a future; one that must wait (Redis) returns `None`, the
    /// default, and the caller uses [`check`](Self::check). Never counts twice: when this
    /// returns `Some`, the cost was counted (or not) exactly as `check` would have.
    ///
    /// ```
    /// # use ratewarden_core::{Key, Quota, Store};
    /// # fn demo(store: &impl Store, key: &Key, quota: &Quota) {
    /// match store.check_ready(key, quota, 1) {
    ///     Some(result) => { /* decided without waiting */ }
    ///     None => { /* call `store.check(key, quota, 1).await` */ }
    /// }
    /// # }
    /// ```
    fn check_ready(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
    ) -> Option<Result<Decision, StoreError>> {
        let _ = (key, quota, cost);
        None
    }

    /// [`check_all`](Self::check_all) at once, if this store can: as
    /// [`check_ready`](Self::check_ready) is to [`check`](Self::check). `None` by default.
    ///
    /// ```
    /// # use ratewarden_core::{Limit, Store};
    /// # fn demo(store: &impl Store, limits: &[Limit]) {
    /// if store.check_all_ready(limits).is_none() {
    ///     // call `store.check_all(limits).await`
    /// }
    /// # }
    /// ```
    fn check_all_ready(&self, limits: &[Limit]) -> Option<Result<Decisions, StoreError>> {
        let _ = limits;
        None
    }

    /// Holds the cost of every counted limit (its estimate) for a request whose actual cost
    /// is known only once it is served: admitted when each estimate fits together with what
    /// the limit's other reservations hold, all-or-nothing like
    /// [`check_all`](Self::check_all). Nothing is charged until
    /// [`settle`](Self::settle); a reservation never settled lapses after `hold`, charging
    /// nothing. [Probes](Limit::probe) are decided as by `check_all`.
    ///
    /// A reserved limit has a state of its own, apart from the state [`check`](Self::check)
    /// counts for the same key and quota (as a state per quota is apart from another's): a
    /// key's reserved and checked requests do not share one quota.
    ///
    /// For every algorithm: holds, debt and settles work on any state (see
    /// [`Ledger`](crate::algorithm::Ledger)). The default answers
    /// [`StoreErrorKind::Unsupported`].
    ///
    /// # Errors
    ///
    /// As for [`check_all`](Self::check_all).
    ///
    /// ```
    /// # async fn demo(store: impl ratewarden_core::Store) -> Result<(), ratewarden_core::StoreError> {
    /// use ratewarden_core::{Key, Limit, Quota, Store};
    /// use std::time::Duration;
    /// let tokens = Limit::new(Key::from("user-7"), Quota::per_minute(10_000).unwrap(), 500);
    /// let reservation = store.reserve(&[tokens], Duration::from_secs(30)).await?;
    /// if reservation.is_allowed() {
    ///     // ... serve the request, which used 120 tokens
    ///     store.settle(reservation, 120).await?;
    /// }
    /// # Ok(()) }
    /// ```
    fn reserve(
        &self,
        limits: &[Limit],
        hold: Duration,
    ) -> impl Future<Output = Result<Reservation, StoreError>> + Send {
        let _ = (limits, hold);
        async {
            Err(StoreError::with_source(
                StoreErrorKind::Unsupported,
                "this store does not reserve",
            ))
        }
    }

    /// Ends `reservation`: drops its holds and charges `actual` units to each limit it held.
    /// What a limit's state has no room for now is owed, and charged as room comes, before
    /// the limit admits anything new (so one request's overdraft, `actual` above the
    /// estimate, is the most a key can go over its quota by, per reservation outstanding at
    /// once). A denied reservation holds nothing: settling it does nothing.
    ///
    /// # Errors
    ///
    /// As for [`check`](Self::check). The default answers [`StoreErrorKind::Unsupported`]
    /// for a reservation that holds something.
    ///
    /// See [`reserve`](Self::reserve) for an example.
    fn settle(
        &self,
        reservation: Reservation,
        actual: u32,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = actual;
        let holds = !reservation.held().is_empty();
        async move {
            if holds {
                Err(StoreError::with_source(
                    StoreErrorKind::Unsupported,
                    "this store does not reserve",
                ))
            } else {
                Ok(())
            }
        }
    }

    /// [`settle`](Self::settle) at once, if this store can (as
    /// [`check_ready`](Self::check_ready) is to `check`): `Ok` with the result when it
    /// settled, `Err` giving the reservation back when the caller must await `settle`
    /// (the default).
    ///
    /// ```
    /// # use ratewarden_core::{Reservation, Store};
    /// # fn demo(store: &impl Store, reservation: Reservation) {
    /// if let Err(reservation) = store.settle_ready(reservation, 3) {
    ///     // spawn `store.settle(reservation, 3)`
    /// }
    /// # }
    /// ```
    fn settle_ready(
        &self,
        reservation: Reservation,
        actual: u32,
    ) -> Result<Result<(), StoreError>, Reservation> {
        let _ = actual;
        Err(reservation)
    }

    /// Keeps the holds of a reservation (its [`held`](Reservation::held)) for `hold` more
    /// from now: a request that runs longer than its hold time renews it (a heartbeat), so
    /// that its units stay held while it runs, and come back `hold` after a gateway that
    /// crashed stopped renewing them. A hold that has lapsed, or was settled, stays so. The
    /// default answers [`StoreErrorKind::Unsupported`].
    ///
    /// # Errors
    ///
    /// As for [`check`](Self::check).
    ///
    /// ```
    /// # async fn demo(store: impl ratewarden_core::Store, reservation: ratewarden_core::Reservation) -> Result<(), ratewarden_core::StoreError> {
    /// use ratewarden_core::Store;
    /// use std::time::Duration;
    /// // Every 10 s while a long export runs:
    /// store.renew(reservation.held(), Duration::from_secs(30)).await?;
    /// # Ok(()) }
    /// ```
    fn renew(
        &self,
        held: &[(Limit, u64)],
        hold: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (held, hold);
        async {
            Err(StoreError::with_source(
                StoreErrorKind::Unsupported,
                "this store does not reserve",
            ))
        }
    }

    /// Ends `reservation` charging nothing: [`settle`](Self::settle) with 0.
    ///
    /// # Errors
    ///
    /// As for [`settle`](Self::settle).
    ///
    /// ```
    /// # async fn demo(store: impl ratewarden_core::Store, reservation: ratewarden_core::Reservation) -> Result<(), ratewarden_core::StoreError> {
    /// use ratewarden_core::Store;
    /// store.release(reservation).await?; // the request failed before it used anything
    /// # Ok(()) }
    /// ```
    fn release(
        &self,
        reservation: Reservation,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.settle(reservation, 0)
    }

    /// Gives back `units` of `key`'s reserved state under `quota` (a charge found to be
    /// owed by no one: a duplicate job, a cancelled export): debt first, then the state,
    /// never beyond a fresh one. See [`Ledger::refund`](crate::algorithm::Ledger::refund)
    /// for each algorithm.
    ///
    /// # Errors
    ///
    /// As for [`check`](Self::check); the default answers [`StoreErrorKind::Unsupported`].
    ///
    /// ```
    /// # async fn demo(store: impl ratewarden_core::Store) -> Result<(), ratewarden_core::StoreError> {
    /// use ratewarden_core::{Key, Quota, Store};
    /// store.refund(&Key::from("user-7"), &Quota::per_minute(100).unwrap(), 40).await?;
    /// # Ok(()) }
    /// ```
    fn refund(
        &self,
        key: &Key,
        quota: &Quota,
        units: u32,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (key, quota, units);
        async {
            Err(StoreError::with_source(
                StoreErrorKind::Unsupported,
                "this store does not reserve",
            ))
        }
    }

    /// Gives back `cost` units that [`check`](Self::check) admitted for `key` under `quota`
    /// `ago` before now, whose decision said the state would be fresh `fresh_in` after it
    /// ([`Info::reset_after`](crate::Info::reset_after)): a request admitted to wait for
    /// its turn (`.wait` in the tower layer) that gave up before its turn came. Only while
    /// nothing was counted on the state since (a later charge's turn is fixed: the hole
    /// left before it cannot be handed on), and never more than the charge still holds
    /// ([`AlgorithmState::refund`](crate::algorithm::AlgorithmState::refund)). The default
    /// answers [`StoreErrorKind::Unsupported`].
    ///
    /// # Errors
    ///
    /// As for [`check`](Self::check).
    ///
    /// ```
    /// # async fn demo(store: impl ratewarden_core::Store) -> Result<(), ratewarden_core::StoreError> {
    /// use ratewarden_core::{Key, Quota, Store};
    /// use std::time::Duration;
    /// let (key, quota) = (Key::from("user-7"), Quota::per_second(10).unwrap());
    /// let decided = store.check(&key, &quota, 1).await?;
    /// let fresh_in = decided.info().reset_after();
    /// store.give_back(&key, &quota, 1, Duration::from_millis(20), fresh_in).await?;
    /// # Ok(()) }
    /// ```
    fn give_back(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
        ago: Duration,
        fresh_in: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (key, quota, cost, ago, fresh_in);
        async {
            Err(StoreError::with_source(
                StoreErrorKind::Unsupported,
                "this store cannot give back a check",
            ))
        }
    }

    /// Whether a request of cost 1 would be admitted now, without counting it (and without
    /// creating state for an unknown key).
    ///
    /// # Errors
    ///
    /// As for [`check`](Self::check).
    fn peek(
        &self,
        key: &Key,
        quota: &Quota,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Forgets `key`'s state under `quota`'s algorithm: its next request sees a fresh quota.
    ///
    /// # Errors
    ///
    /// As for [`check`](Self::check).
    fn reset(
        &self,
        key: &Key,
        quota: &Quota,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl<S: Store> Store for Arc<S> {
    fn check_ready(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
    ) -> Option<Result<Decision, StoreError>> {
        (**self).check_ready(key, quota, cost)
    }

    fn check(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).check(key, quota, cost)
    }

    fn check_all(
        &self,
        limits: &[Limit],
    ) -> impl Future<Output = Result<Decisions, StoreError>> + Send {
        (**self).check_all(limits)
    }

    fn check_all_ready(&self, limits: &[Limit]) -> Option<Result<Decisions, StoreError>> {
        (**self).check_all_ready(limits)
    }

    fn reserve(
        &self,
        limits: &[Limit],
        hold: Duration,
    ) -> impl Future<Output = Result<Reservation, StoreError>> + Send {
        (**self).reserve(limits, hold)
    }

    fn settle(
        &self,
        reservation: Reservation,
        actual: u32,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).settle(reservation, actual)
    }

    fn settle_ready(
        &self,
        reservation: Reservation,
        actual: u32,
    ) -> Result<Result<(), StoreError>, Reservation> {
        (**self).settle_ready(reservation, actual)
    }

    fn renew(
        &self,
        held: &[(Limit, u64)],
        hold: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).renew(held, hold)
    }

    fn release(
        &self,
        reservation: Reservation,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).release(reservation)
    }

    fn refund(
        &self,
        key: &Key,
        quota: &Quota,
        units: u32,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).refund(key, quota, units)
    }

    fn give_back(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
        ago: Duration,
        fresh_in: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).give_back(key, quota, cost, ago, fresh_in)
    }

    fn peek(
        &self,
        key: &Key,
        quota: &Quota,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).peek(key, quota)
    }

    fn reset(
        &self,
        key: &Key,
        quota: &Quota,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).reset(key, quota)
    }
}
