//! Several limits of one request, decided together ([`Store::check_all`]): one script call per
//! cluster slot (one call in all on a single server), in parallel, then a refund of what was
//! counted in one slot when a limit in another denied.
//!
//! [`Store::check_all`]: ratewarden_core::Store::check_all

use std::time::Duration;

use ratewarden_core::{
    Decision, Decisions, Limit, MAX_LIMITS, StoreError, StoreErrorKind, Timestamp,
};

use ratewarden_core::Store as _;

use super::{RedisStore, unexpected_split};
use crate::script::{Call, Counter, Entry, Mode, Reply, figures};

/// One state a request's limits count against: the first limit naming it, and the cost of
/// every limit that does (counted limits on one key and quota are one state, their costs
/// summed; so are probes, the largest cost deciding).
struct State {
    first: usize,
    cost: u32,
}

impl RedisStore {
    /// Decides `limits` together at `now` (`None`: Redis's clock).
    pub(super) async fn decide_all(
        &self,
        limits: &[Limit],
        now: Option<Timestamp>,
    ) -> Result<Decisions, StoreError> {
        if limits.is_empty() {
            return Ok(Decisions::default());
        }
        if limits.len() > MAX_LIMITS {
            return Err(StoreError::with_source(
                StoreErrorKind::InvalidInput,
                "more than 16 limits in one check",
            ));
        }
        let (states, state_of) = merged(limits);
        if let ([state], None) = (&states[..], now)
            && limits[state.first].is_counted()
        {
            // One state: a check like any other (leases, the cache of denials, hot keys).
            let limit = &limits[state.first];
            let decision = self.check(limit.key(), limit.quota(), state.cost).await?;
            return Ok(Decisions::from(vec![decision; limits.len()]));
        }
        let entries: Vec<Entry> = (states.iter())
            .map(|state| {
                let limit = &limits[state.first];
                let mode = if limit.is_counted() {
                    Mode::Check
                } else {
                    Mode::Probe
                };
                self.entry(limit, state.cost, mode, now)
            })
            .collect();
        let groups = self.groups(&entries);
        let connection = self.batcher.connection();
        let calls = groups.iter().map(|group| {
            let group: Vec<&Entry> = group.iter().map(|&i| &entries[i]).collect();
            async move { self.within(connection.eval_limits(&group)).await }
        });
        let results = futures_util::future::join_all(calls).await;

        let mut decided: Vec<Option<Decision>> = vec![None; states.len()];
        let mut charged = Vec::new();
        let mut failed = None;
        for (group, result) in groups.iter().zip(results) {
            let read = result.and_then(|(replies, at)| {
                let decisions = (replies.iter().zip(group))
                    .map(|(reply, &i)| decision(&reply, &limits[states[i].first]))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok((decisions, at))
            });
            match read {
                Ok((decisions, at)) => {
                    // A slot's limits were counted when all of them admitted.
                    if decisions.iter().all(Decision::is_allowed) {
                        charged.push((group, at));
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
        if !admitted && !charged.is_empty() {
            let refunds: Vec<Vec<Entry>> = (charged.iter())
                .map(|(group, at)| {
                    let refund = Mode::Refund { charged_at: *at };
                    let now = now.map(|_| *at);
                    (group.iter())
                        .map(|&i| (&limits[states[i].first], states[i].cost))
                        .filter(|(limit, _)| limit.is_counted())
                        .map(|(limit, cost)| self.entry(limit, cost, refund, now))
                        .collect()
                })
                .filter(|entries: &Vec<Entry>| !entries.is_empty())
                .collect();
            // In a task of its own, which the answer waits for: a caller that stops waiting
            // does not leave the units counted.
            if !refunds.is_empty() {
                let _ = tokio::spawn(self.refund(refunds)).await;
            }
        }
        if let Some(error) = failed {
            return Err(error);
        }
        let decisions = state_of.iter().map(|&s| decided[s].unwrap_or_else(denied));
        Ok(Decisions::from(decisions.collect::<Vec<_>>()))
    }

    /// The script entry of a limit's state, with the cost of every limit on it.
    fn entry(&self, limit: &Limit, cost: u32, mode: Mode, now: Option<Timestamp>) -> Entry {
        let call = Call {
            quota: limit.quota(),
            counter: Counter::Whole,
            mode,
            cost,
            now,
            marker: None,
            keep_for: Duration::ZERO,
        };
        call.entry(&self.prefix, limit.key())
    }

    /// The entries each call decides (by index): all of them in one on a single server or a
    /// pool, one call per slot on a cluster (a script's keys must share a slot).
    fn groups(&self, entries: &[Entry]) -> Vec<Vec<usize>> {
        if !self.batcher.connection().is_cluster() {
            return vec![(0..entries.len()).collect()];
        }
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            let slot = entry.slot();
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, group)) => group.push(i),
                None => groups.push((slot, vec![i])),
            }
        }
        groups.into_iter().map(|(_, group)| group).collect()
    }

    /// Gives back the charges of slots whose limits all admitted, for a request another
    /// slot's limit denied (or whose call failed): one call per slot. A refund that fails
    /// leaves its units counted until they refill: what was admitted stays within the quota,
    /// and other requests see less room than there is meanwhile.
    fn refund(&self, refunds: Vec<Vec<Entry>>) -> impl Future<Output = ()> + Send + 'static {
        let this = self.clone();
        async move {
            let calls = refunds.iter().map(|entries| {
                let entries: Vec<&Entry> = entries.iter().collect();
                let this = &this;
                async move {
                    let refunded = this.within(this.batcher.connection().refund_limits(&entries));
                    if let Err(error) = refunded.await {
                        crate::log::refund_failed(&error);
                    }
                }
            });
            futures_util::future::join_all(calls).await;
        }
    }
}

/// The states of `limits` (limits on one key and quota merged, their costs summed), and the
/// state of each limit.
fn merged(limits: &[Limit]) -> (Vec<State>, Vec<usize>) {
    let mut states: Vec<State> = Vec::with_capacity(limits.len());
    let mut state_of = Vec::with_capacity(limits.len());
    for (i, limit) in limits.iter().enumerate() {
        let same = |state: &State| {
            let first = &limits[state.first];
            first.key() == limit.key()
                && first.quota() == limit.quota()
                && first.is_counted() == limit.is_counted()
        };
        match states.iter().position(same) {
            Some(s) => {
                // Counted costs add up; probes read the same state, and the largest decides.
                states[s].cost = if limit.is_counted() {
                    states[s].cost.saturating_add(limit.cost())
                } else {
                    states[s].cost.max(limit.cost())
                };
                state_of.push(s);
            }
            None => {
                states.push(State {
                    first: i,
                    cost: limit.cost(),
                });
                state_of.push(states.len() - 1);
            }
        }
    }
    (states, state_of)
}

/// A limit's decision from its reply.
fn decision(reply: &crate::script::Numbers, limit: &Limit) -> Result<Decision, StoreError> {
    match Reply::parse(reply, figures(limit.quota(), Counter::Whole).1)? {
        Reply::Decided { decision, .. } => Ok(decision),
        Reply::Split { .. } => Err(unexpected_split()),
    }
}

/// What a limit whose call failed would show (never returned: the request fails).
fn denied() -> Decision {
    Decision::Denied(ratewarden_core::Info::new(
        0,
        0,
        Duration::ZERO,
        Duration::ZERO,
    ))
}
