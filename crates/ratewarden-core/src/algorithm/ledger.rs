//! [`Ledger`]: an algorithm's state with the units reservations hold on it and the units
//! settles owe it.

use super::AlgorithmState;
use crate::{Decision, Info, Quota, Timestamp};

/// The state of a reserved limit: the algorithm's state, the units that reservations hold
/// while their requests run, and the units settled beyond what the state could take (debt).
///
/// - [`reserve`](Self::reserve) admits `units` when they fit together with every unit held
///   and owed, and holds them: the algorithm's state is not charged yet.
/// - [`settle`](Self::settle) drops the hold and charges the actual units, whatever they
///   are: what the state cannot take now becomes debt, charged as the state makes room
///   (before any new reservation is admitted). [`release`](Self::release) settles 0.
/// - Holds not settled by their `lapse_at` are dropped, counting nothing (a hold is a
///   reservation's place, not a charge): here, all of a key's holds together when the
///   latest of them has lapsed, so a hold may outlive its own time while later holds of the
///   same key are live (never the other way round). A settle that comes after its hold
///   lapsed charges the actual units all the same.
///
/// **Bounds.** The algorithm's state is only ever charged by admissions, so it keeps its own
/// bound (GCRA: at most `burst + t / interval` units in any interval `t`). Settled units
/// reach the state at once or as debt, which is repaid before anything new is admitted. In
/// any interval, units settled exceed the algorithm's bound by at most the overdraft
/// (`actual - estimate`, where positive) of the reservations outstanding at the last
/// admission before the interval ends, plus what lapsed holds settled late: one request's
/// overdraft when reservations of a key do not overlap. A reservation never leaves quota
/// unused once settled: what it held and did not use is back at once (a settle below the
/// estimate charges only the actual units).
///
/// ```
/// use ratewarden_core::algorithm::{GcraState, Ledger};
/// use ratewarden_core::{Quota, Timestamp};
///
/// let quota = Quota::per_minute(100)?; // burst 100
/// let mut ledger = Ledger::<GcraState>::default();
/// let now = Timestamp::from_micros(1_000_000);
/// let lapse = Timestamp::from_micros(31_000_000);
/// let (decision, hold) = ledger.reserve(now, 60, lapse, &quota);
/// assert!(decision.is_allowed());
/// // 60 held: 50 more do not fit while the first request runs.
/// assert!(!ledger.reserve(now, 50, lapse, &quota).0.is_allowed());
/// ledger.settle(now, hold.unwrap(), 10, &quota); // it used 10
/// assert!(ledger.reserve(now, 90, lapse, &quota).0.is_allowed());
/// # Ok::<(), ratewarden_core::QuotaError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger<S> {
    /// The algorithm's state: units settled (and debt repaid).
    pub state: S,
    /// Units held by reservations not yet settled.
    pub held: u64,
    /// Reservations holding them.
    pub holds: u32,
    /// The microsecond from which every hold has lapsed.
    pub lapse_at: u64,
    /// How many times the holds were all dropped: a settle of a hold made before finds it
    /// gone.
    pub round: u32,
    /// Units settled that the state could not take yet.
    pub debt: u64,
}

/// What one reservation holds on a [`Ledger`]: give it back to
/// [`settle`](Ledger::settle) or [`release`](Ledger::release).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold {
    /// The units held.
    pub units: u32,
    /// The ledger's [`round`](Ledger::round) when it was made.
    pub round: u32,
}

impl<S: AlgorithmState> Ledger<S> {
    /// Admits `units` at `now` if they fit together with every unit held and owed, and holds
    /// them until `lapse_at`: the decision, and the hold when admitted.
    ///
    /// Denied while debt is owed (its retry: when the debt and the units would fit), or
    /// while the holds leave no room (its retry: a unit's interval, as holds end when their
    /// requests do). [`Decision::InsufficientCapacity`] for more units than the burst.
    ///
    /// See [`Ledger`] for an example.
    pub fn reserve(
        &mut self,
        now: Timestamp,
        units: u32,
        lapse_at: Timestamp,
        quota: &Quota,
    ) -> (Decision, Option<Hold>) {
        self.lapse(now);
        self.repay(now, quota);
        let burst = u64::from(quota.burst());
        let wanted = self.held.saturating_add(self.debt) + u64::from(units);
        if u64::from(units) > burst || wanted > burst {
            let decision = self.state.clone().check(now, units, quota);
            return match decision {
                Decision::InsufficientCapacity(_) => (decision, None),
                // Room for the units, not with what is held and owed: when some of it ends.
                _ => {
                    let info = decision.info();
                    let retry = info.retry_after().max(std::time::Duration::from_micros(
                        quota.emission_interval_micros(),
                    ));
                    let info = Info::new(info.limit(), 0, info.reset_after(), retry);
                    (Decision::Denied(info), None)
                }
            };
        }
        // `wanted <= burst`, a `u32`.
        let wanted = u32::try_from(wanted).unwrap_or(u32::MAX);
        match self.state.clone().check(now, wanted, quota) {
            Decision::Allowed(info) => {
                self.held += u64::from(units);
                self.holds += 1;
                self.lapse_at = self.lapse_at.max(lapse_at.as_micros());
                let hold = Hold {
                    units,
                    round: self.round,
                };
                (Decision::Allowed(info), Some(hold))
            }
            denied => (denied, None),
        }
    }

    /// Drops `hold` (if it has not lapsed) and charges `actual` units at `now`: into the
    /// state as far as it has room, the rest as debt.
    ///
    /// See [`Ledger`] for an example.
    pub fn settle(&mut self, now: Timestamp, hold: Hold, actual: u32, quota: &Quota) {
        self.lapse(now);
        if hold.round == self.round && self.holds > 0 {
            self.held = self.held.saturating_sub(u64::from(hold.units));
            self.holds -= 1;
            if self.holds == 0 {
                self.drop_holds();
            }
        }
        self.debt = self.debt.saturating_add(u64::from(actual));
        self.repay(now, quota);
    }

    /// Drops `hold`, charging nothing: [`settle`](Self::settle) with 0.
    ///
    /// ```
    /// use ratewarden_core::algorithm::{GcraState, Ledger};
    /// use ratewarden_core::{Quota, Timestamp};
    /// let quota = Quota::per_minute(10)?;
    /// let mut ledger = Ledger::<GcraState>::default();
    /// let now = Timestamp::from_micros(0);
    /// let (_, hold) = ledger.reserve(now, 10, Timestamp::from_micros(1_000_000), &quota);
    /// ledger.release(now, hold.unwrap(), &quota);
    /// assert_eq!(ledger, Ledger { round: 1, ..Ledger::default() }); // as if never reserved
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    pub fn release(&mut self, now: Timestamp, hold: Hold, quota: &Quota) {
        self.settle(now, hold, 0, quota);
    }

    /// Gives back `units` at `now`: debt first, then the state as a charge made now would be
    /// given back ([`AlgorithmState::refund`]); never more than a fresh state holds. The
    /// sliding log gives back debt, and of its entries only those made at this microsecond:
    /// older entries are freed by their own times, and a refund does not know which of them
    /// it stands for.
    ///
    /// ```
    /// use ratewarden_core::algorithm::{GcraState, Ledger};
    /// use ratewarden_core::{Quota, Timestamp};
    /// let quota = Quota::per_minute(10)?;
    /// let mut ledger = Ledger::<GcraState>::default();
    /// let now = Timestamp::from_micros(0);
    /// let (_, hold) = ledger.reserve(now, 5, Timestamp::from_micros(1_000_000), &quota);
    /// ledger.settle(now, hold.unwrap(), 10, &quota); // all 10 used
    /// ledger.refund(now, 4, &quota); // 4 of them were not owed after all
    /// assert!(ledger.reserve(now, 4, Timestamp::from_micros(1_000_000), &quota).0.is_allowed());
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    pub fn refund(&mut self, now: Timestamp, units: u32, quota: &Quota) {
        let from_debt = self.debt.min(u64::from(units));
        self.debt -= from_debt;
        let rest = units - u32::try_from(from_debt).unwrap_or(units);
        if rest > 0 {
            self.state.refund(now, now, rest, quota);
        }
    }

    /// The units held by reservations live at `now`.
    ///
    /// ```
    /// use ratewarden_core::algorithm::{GcraState, Ledger};
    /// use ratewarden_core::{Quota, Timestamp};
    /// let quota = Quota::per_minute(10)?;
    /// let mut ledger = Ledger::<GcraState>::default();
    /// ledger.reserve(Timestamp::from_micros(0), 3, Timestamp::from_micros(5), &quota);
    /// assert_eq!(ledger.held_at(Timestamp::from_micros(4)), 3);
    /// assert_eq!(ledger.held_at(Timestamp::from_micros(5)), 0); // lapsed
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub fn held_at(&self, now: Timestamp) -> u64 {
        if now.as_micros() >= self.lapse_at {
            0
        } else {
            self.held
        }
    }

    /// The microsecond from which this ledger behaves exactly like a fresh one: its state is
    /// fresh, its holds have lapsed and its debt would have been repaid (an upper bound).
    ///
    /// ```
    /// use ratewarden_core::algorithm::{GcraState, Ledger};
    /// assert_eq!(Ledger::<GcraState>::default().fresh_at(&ratewarden_core::Quota::per_second(1)?), 0);
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub fn fresh_at(&self, quota: &Quota) -> u64 {
        let mut at = self.state.fresh_at(quota);
        if self.holds > 0 {
            at = at.max(self.lapse_at);
        }
        if self.debt > 0 {
            // Debt takes the state's room as it comes: at most a period per `count` units,
            // and a period for a window's alignment.
            let periods = self
                .debt
                .div_ceil(u64::from(quota.count()))
                .saturating_add(1);
            at = at.saturating_add(periods.saturating_mul(quota.period_micros()));
        }
        at
    }

    /// Drops every hold when the latest has lapsed.
    fn lapse(&mut self, now: Timestamp) {
        if self.holds > 0 && now.as_micros() >= self.lapse_at {
            self.drop_holds();
        }
    }

    fn drop_holds(&mut self) {
        self.held = 0;
        self.holds = 0;
        self.lapse_at = 0;
        self.round = self.round.wrapping_add(1);
    }

    /// Charges as much debt as the state has room for.
    fn repay(&mut self, now: Timestamp, quota: &Quota) {
        if self.debt == 0 {
            return;
        }
        let room = self.state.clone().check(now, 0, quota).info().remaining();
        let pay = room.min(self.debt).min(u64::from(quota.burst()));
        let pay = u32::try_from(pay).unwrap_or(0);
        if pay > 0 && self.state.check(now, pay, quota).is_allowed() {
            self.debt -= u64::from(pay);
        }
    }
}

#[cfg(test)]
mod tests;
