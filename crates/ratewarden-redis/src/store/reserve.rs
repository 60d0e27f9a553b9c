//! Reservations in Redis ([`Store::reserve`], `settle`, `refund`): each reserved limit's
//! ledger in two keys of the limit's slot, its state (`:r`) and its holds (`:h`, a hash of
//! one field per hold, each lapsing at its own time, and the debt), decided by
//! `lua/reserve.lua`. One call per cluster slot, in parallel; a slot that held a reservation
//! another slot denied is released before the answer.
//!
//! [`Store::reserve`]: ratewarden_core::Store::reserve

use std::time::Duration;

use ratewarden_core::{
    Decision, Decisions, Key, Limit, MAX_LIMITS, Quota, Reservation, StoreError, StoreErrorKind,
    Timestamp,
};

use super::several::denied;
use super::{RedisStore, unexpected_split};
use crate::script::{Call, Counter, Entry, Ledger, Mode, Reply, figures};

impl RedisStore {
    /// Holds `limits` for `hold` at `now` (`None`: Redis's clock).
    pub(super) async fn reserve_on(
        &self,
        limits: &[Limit],
        hold: Duration,
        now: Option<Timestamp>,
    ) -> Result<Reservation, StoreError> {
        if limits.len() > MAX_LIMITS {
            return Err(StoreError::with_source(
                StoreErrorKind::InvalidInput,
                "more than 16 limits in one reservation",
            ));
        }
        if limits.is_empty() {
            return Ok(Reservation::new(Decisions::default(), Vec::new()));
        }
        // Each held limit's hold has an id of its own: two gateways never name one alike.
        let ids: Vec<Option<u64>> = (limits.iter())
            .map(|l| l.is_counted().then(|| fastrand::u64(..)))
            .collect();
        let entries: Vec<Entry> = (limits.iter().zip(&ids))
            .map(|(limit, id)| {
                let mode = if id.is_some() {
                    Mode::Check
                } else {
                    Mode::Probe
                };
                self.ledger_entry(limit.key(), limit.quota(), limit.cost(), mode, now)
            })
            .collect();
        let groups = self.groups(&entries);
        let reserve = Ledger::Reserve { hold };
        let calls = groups.iter().map(|group| {
            let args: Vec<_> = group
                .iter()
                .map(|&i| (&entries[i], interval(limits[i].quota()), ids[i]))
                .collect();
            async move {
                self.within(self.batcher.connection().eval_ledger(&args, reserve))
                    .await
            }
        });
        let results = futures_util::future::join_all(calls).await;
        let mut decided: Vec<Option<Decision>> = vec![None; limits.len()];
        let mut held_groups = Vec::new();
        let mut failed = None;
        for (group, result) in groups.iter().zip(results) {
            let read = result.and_then(|replies| {
                let (replies, _) = replies.ok_or_else(unexpected_reply)?;
                (replies.iter().zip(group))
                    .map(|(reply, &i)| {
                        let limit = figures(limits[i].quota(), Counter::Whole).1;
                        match Reply::parse(&reply, limit)? {
                            Reply::Decided { decision, .. } => Ok(decision),
                            Reply::Split { .. } => Err(unexpected_split()),
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()
            });
            match read {
                Ok(decisions) => {
                    if decisions.iter().all(Decision::is_allowed) {
                        held_groups.push(group);
                    }
                    for (&i, decision) in group.iter().zip(decisions) {
                        decided[i] = Some(decision);
                    }
                }
                Err(error) => failed = failed.or(Some(error)),
            }
        }
        let admitted =
            failed.is_none() && decided.iter().all(|d| d.is_some_and(|d| d.is_allowed()));
        let held: Vec<(Limit, u64)> = (limits.iter().zip(&ids))
            .filter_map(|(limit, id)| Some((limit.clone(), (*id)?)))
            .collect();
        if !admitted {
            // Release what the slots that admitted hold: the request holds nothing.
            let release: Vec<(Limit, u64)> = held_groups
                .iter()
                .flat_map(|group| group.iter())
                .filter_map(|&i| Some((limits[i].clone(), ids[i]?)))
                .collect();
            if !release.is_empty()
                && let Err(error) = self.settle_on(&release, 0, now).await
            {
                crate::log::refund_failed(&error);
            }
        }
        if let Some(error) = failed {
            return Err(error);
        }
        let decisions: Vec<Decision> = decided
            .into_iter()
            .map(|d| d.unwrap_or_else(denied))
            .collect();
        let decisions = match decisions.as_slice() {
            [one] => Decisions::from(*one),
            _ => Decisions::from(decisions),
        };
        if admitted {
            Ok(Reservation::new(decisions, held))
        } else {
            Ok(Reservation::new(decisions, Vec::new()))
        }
    }

    /// Ends the holds `held` (each limit with its hold's id), charging `actual` to each.
    pub(super) async fn settle_on(
        &self,
        held: &[(Limit, u64)],
        actual: u32,
        now: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        self.on_holds(held, Ledger::Settle { actual }, now).await
    }

    /// Keeps the holds `held` for `hold` more.
    pub(super) async fn renew_on(
        &self,
        held: &[(Limit, u64)],
        hold: Duration,
        now: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        self.on_holds(held, Ledger::Renew { hold }, now).await
    }

    /// Runs `op` on the holds `held`: one call per slot, in parallel.
    async fn on_holds(
        &self,
        held: &[(Limit, u64)],
        op: Ledger,
        now: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        let entries: Vec<Entry> = (held.iter())
            .map(|(limit, _)| {
                self.ledger_entry(limit.key(), limit.quota(), limit.cost(), Mode::Check, now)
            })
            .collect();
        let calls = self.groups(&entries).into_iter().map(|group| {
            let args: Vec<_> = group
                .iter()
                .map(|&i| (&entries[i], interval(held[i].0.quota()), Some(held[i].1)))
                .collect();
            async move {
                self.within(self.batcher.connection().eval_ledger(&args, op))
                    .await
            }
        });
        let results = futures_util::future::join_all(calls).await;
        results
            .into_iter()
            .find_map(Result::err)
            .map_or(Ok(()), Err)
    }

    /// Gives back `units` of `key`'s reserved state under `quota`.
    pub(super) async fn refund_on(
        &self,
        key: &Key,
        quota: &Quota,
        units: u32,
        now: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        let refund = Mode::Refund {
            charged_at: now.unwrap_or(Timestamp::from_micros(0)),
        };
        let entry = self.ledger_entry(key, quota, 0, refund, now);
        let args = [(&entry, interval(quota), Some(0))];
        let give = Ledger::GiveBack { units };
        self.within(self.batcher.connection().eval_ledger(&args, give))
            .await
            .map(drop)
    }

    /// The script entry of a reserved limit (on the key's own counter: reserved states are
    /// never split).
    fn ledger_entry(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
        mode: Mode,
        now: Option<Timestamp>,
    ) -> Entry {
        let call = Call {
            quota,
            counter: Counter::Whole,
            mode,
            cost,
            now,
            marker: None,
            // Test time runs ahead of Redis's: its states live a day longer (as `check_at`'s).
            keep_for: if now.is_some() {
                Duration::from_secs(86_400)
            } else {
                Duration::ZERO
            },
        };
        call.entry(&self.prefix, key)
    }
}

/// A quota's emission interval (µs): the retry time of a reservation denied for the holds.
fn interval(quota: &Quota) -> u64 {
    quota.emission_interval_micros()
}

fn unexpected_reply() -> StoreError {
    StoreError::with_source(StoreErrorKind::Script, "a reservation without its replies")
}
