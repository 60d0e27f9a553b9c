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
    /// Which generation of holds is live: it moves on each time the holds are all dropped,
    /// so a settle of a hold made before finds it gone. A store that forgets a ledger
    /// starts the next one at a round no earlier ledger of the key used (see
    /// [`Ledger::starting_at`]).
    pub round: u64,
    /// Units settled that the state could not take yet.
    pub debt: u64,
    /// While debt is owed: when it was last repaid (µs), the state full since.
    pub repaid_at: u64,
}

/// What one reservation holds on a [`Ledger`]: give it back to
/// [`settle`](Ledger::settle) or [`release`](Ledger::release).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold {
    /// The units held.
    pub units: u32,
    /// The ledger's [`round`](Ledger::round) when it was made.
    pub round: u64,
}

impl<S: AlgorithmState> Ledger<S> {
    /// A fresh ledger whose holds start at `round`: a store that may forget a ledger (its
    /// holds lapsed) and make another for the key gives each a round none before used, so
    /// that a late settle of a hold of the forgotten ledger never ends a hold of the new one.
    ///
    /// ```
    /// use ratewarden_core::algorithm::{GcraState, Ledger};
    /// assert_eq!(Ledger::<GcraState>::starting_at(1 << 32).round, 1 << 32);
    /// ```
    #[must_use]
    pub fn starting_at(round: u64) -> Self {
        Self {
            round,
            ..Self::default()
        }
    }

    /// Whether `units` would be admitted at `now` beside what is held and owed, holding
    /// nothing: [`reserve`](Self::reserve)'s decision, the ledger left as it is.
    ///
    /// ```
    /// use ratewarden_core::algorithm::{GcraState, Ledger};
    /// use ratewarden_core::{Quota, Timestamp};
    /// let ledger = Ledger::<GcraState>::default();
    /// let now = Timestamp::from_micros(0);
    /// assert!(ledger.probe(now, 10, &Quota::per_minute(10)?).is_allowed());
    /// assert_eq!(ledger, Ledger::default());
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub fn probe(&self, now: Timestamp, units: u32, quota: &Quota) -> Decision {
        self.clone().reserve(now, units, now, quota).0
    }

    /// Admits `units` at `now` if they fit together with every unit held and owed, and holds
    /// them until `lapse_at`: the decision, and the hold when admitted.
    ///
    /// Denied while debt is owed or the holds leave no room, with the time the debt, the
    /// holds and the units would take to fit were the holds all settled at their estimates
    /// (at least a unit's interval). [`Decision::InsufficientCapacity`] for more units than
    /// the burst.
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
                // Room for the units, not beside what is held and owed: when that would fit.
                _ => {
                    let info = decision.info();
                    let room = self.state.clone().check(now, 0, quota).info().remaining();
                    let short = wanted.saturating_sub(room).max(1);
                    let wait = quota.emission_interval_micros().saturating_mul(short);
                    let retry = info
                        .retry_after()
                        .max(std::time::Duration::from_micros(wait));
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

    /// Keeps `hold` (if it has not lapsed) until `lapse_at` at least: a request that runs
    /// longer than its hold time renews it. Here the holds of a key lapse together, so it
    /// keeps them all.
    ///
    /// ```
    /// use ratewarden_core::algorithm::{GcraState, Ledger};
    /// use ratewarden_core::{Quota, Timestamp};
    /// let quota = Quota::per_minute(10)?;
    /// let mut ledger = Ledger::<GcraState>::default();
    /// let t = Timestamp::from_micros;
    /// let (_, hold) = ledger.reserve(t(0), 1, t(10), &quota);
    /// ledger.renew(t(5), hold.unwrap(), t(20));
    /// assert_eq!(ledger.held_at(t(15)), 1);
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    pub fn renew(&mut self, now: Timestamp, hold: Hold, lapse_at: Timestamp) {
        self.lapse(now);
        if hold.round == self.round && self.holds > 0 {
            self.lapse_at = self.lapse_at.max(lapse_at.as_micros());
        }
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
    /// assert_eq!(ledger, Ledger::starting_at(1)); // as if never reserved
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

    /// Whether the ledger holds what a store must not forget: live holds, or debt.
    ///
    /// ```
    /// use ratewarden_core::algorithm::{GcraState, Ledger};
    /// use ratewarden_core::{Quota, Timestamp};
    /// let mut ledger = Ledger::<GcraState>::default();
    /// let t = Timestamp::from_micros;
    /// ledger.reserve(t(0), 1, t(10), &Quota::per_minute(10)?);
    /// assert!(ledger.is_pinned(t(9)) && !ledger.is_pinned(t(10)));
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub fn is_pinned(&self, now: Timestamp) -> bool {
        self.debt > 0 || self.held_at(now) > 0
    }

    /// Repays debt: into the state as far as it has room, and at least at the quota's rate
    /// since the last repayment (the state was full since: its refill went to the debt
    /// whether or not anyone asked; a state caps its room at the burst, so an idle key
    /// would otherwise repay a burst at a time).
    fn repay(&mut self, now: Timestamp, quota: &Quota) {
        if self.debt == 0 {
            self.repaid_at = 0;
            return;
        }
        let room = self.state.clone().check(now, 0, quota).info().remaining();
        let pay = room.min(self.debt).min(u64::from(quota.burst()));
        let pay = u32::try_from(pay).unwrap_or(0);
        let mut repaid = 0;
        if pay > 0 && self.state.check(now, pay, quota).is_allowed() {
            repaid = u64::from(pay);
        }
        let n = now.as_micros();
        if self.repaid_at > 0 {
            let since = n.saturating_sub(self.repaid_at);
            repaid = repaid.max(since / quota.emission_interval_micros().max(1));
        }
        self.debt = self.debt.saturating_sub(repaid);
        self.repaid_at = if self.debt > 0 { n.max(1) } else { 0 };
    }
}

#[cfg(test)]
mod tests;
