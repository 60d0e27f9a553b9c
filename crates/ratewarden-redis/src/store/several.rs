//! Several limits of one request, decided together ([`Store::check_all`]): one script call per
//! cluster slot (one call in all on a single server), in parallel, then a refund of what was
//! counted in one slot when a limit in another denied.
//!
//! A limit goes to the counter a single check of its key would go to: a part of a key that
//! hot-key splitting split, else the key's own (whose split marker is read where splits
//! adapt: a key another gateway split answers so, and the limits are asked again, of a part).
//!
//! [`Store::check_all`]: ratewarden_core::Store::check_all

use std::time::Duration;

use ratewarden_core::{
    Decision, Decisions, Limit, MAX_LIMITS, Store as _, StoreError, StoreErrorKind, Timestamp,
    merged,
};

use super::{RedisStore, unexpected_split};
use crate::script::{Call, Counter, Entry, Mode, Numbers, Reply, figures};

/// Where one state of a request is counted: its counter, and the shortest TTL of its writes.
#[derive(Clone, Copy)]
struct Route {
    counter: Counter,
    keep_for: Duration,
    /// The longest an adaptive split can still run, when the call reads the key's marker.
    marker: Option<Duration>,
}

/// What the calls of one try found: each state's decision, or a split to learn first.
enum Found {
    Decided(Vec<Decision>),
    Split,
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
        // Limits on one state are decided once: two that fit alone may not fit together.
        let (states, of) = merged(limits);
        if let ([state], None) = (&states[..], now)
            && state.is_counted()
        {
            // One state: a check like any other (leases, the cache of denials, hot keys).
            let decision = self.check(state.key(), state.quota(), state.cost()).await?;
            return Ok(Decisions::from(vec![decision; limits.len()]));
        }
        let decided = if self.batcher.connection().is_cluster() {
            // Calls to several slots, in a task of its own which the answer waits for: a
            // caller that stops waiting never leaves one slot counted for a request another
            // slot denied.
            let this = self.clone();
            let task = tokio::spawn(async move { this.decide_states(&states, now).await });
            match task.await {
                Ok(decided) => decided?,
                Err(error) => return Err(StoreError::with_source(StoreErrorKind::Other, error)),
            }
        } else {
            // One call: it counts all or nothing.
            self.decide_states(&states, now).await?
        };
        Ok(Decisions::from(
            of.iter().map(|&s| decided[s]).collect::<Vec<_>>(),
        ))
    }

    /// Decides merged `states`; asks again once when a key turned out split.
    async fn decide_states(
        &self,
        states: &[Limit],
        now: Option<Timestamp>,
    ) -> Result<Vec<Decision>, StoreError> {
        match self.try_states(states, now).await? {
            Found::Decided(decided) => Ok(decided),
            Found::Split => match self.try_states(states, now).await? {
                Found::Decided(decided) => Ok(decided),
                Found::Split => Err(unexpected_split()),
            },
        }
    }

    /// One try: one call per slot, in parallel; a refund of the slots that counted when the
    /// request is not admitted.
    async fn try_states(
        &self,
        states: &[Limit],
        now: Option<Timestamp>,
    ) -> Result<Found, StoreError> {
        let routes: Vec<Route> = states.iter().map(|limit| self.route(limit)).collect();
        let entries: Vec<Entry> = (states.iter().zip(&routes))
            .map(|(limit, route)| {
                let mode = if limit.is_counted() {
                    Mode::Check
                } else {
                    Mode::Probe
                };
                self.entry(limit, *route, mode, now)
            })
            .collect();
        let groups = self.groups(&entries);
        let connection = self.batcher.connection();
        let sent = self.now();
        let calls = groups.iter().map(|group| {
            let group: Vec<&Entry> = group.iter().map(|&i| &entries[i]).collect();
            async move { self.within(connection.eval_limits(&group)).await }
        });
        let results = futures_util::future::join_all(calls).await;

        let mut decided: Vec<Option<Decision>> = vec![None; states.len()];
        let mut charged = Vec::new();
        let mut failed = None;
        let mut split = false;
        for (group, result) in groups.iter().zip(results) {
            let read = result.and_then(|(replies, at)| {
                let replies = (replies.iter().zip(group))
                    .map(|(reply, &i)| self.read(&reply, &states[i], routes[i], sent))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok((replies, at))
            });
            match read {
                Ok((replies, at)) => {
                    // A slot's limits were counted when all of them admitted.
                    if replies.iter().all(|r| r.is_some_and(|d| d.is_allowed())) {
                        charged.push((group, at));
                    }
                    for (&i, reply) in group.iter().zip(replies) {
                        decided[i] = reply;
                        split |= reply.is_none();
                    }
                }
                Err(error) => failed = failed.or(Some(error)),
            }
        }
        let admitted =
            failed.is_none() && decided.iter().all(|d| d.is_some_and(|d| d.is_allowed()));
        if !admitted {
            self.refund(states, &routes, &charged, now).await;
        }
        if let Some(error) = failed {
            return Err(error);
        }
        if split {
            return Ok(Found::Split);
        }
        Ok(Found::Decided(
            decided
                .into_iter()
                .map(|d| d.unwrap_or_else(denied))
                .collect(),
        ))
    }

    /// The counter a single check of the limit's key would count on.
    fn route(&self, limit: &Limit) -> Route {
        let hot = &self.local.hot;
        let route = hot.route(limit.key(), limit.quota(), self.now());
        let reads_marker = hot.config().adapts(limit.quota()) && route.counter == Counter::Whole;
        Route {
            counter: route.counter,
            keep_for: route.keep_for,
            marker: reads_marker.then(|| self.split_slack()).flatten(),
        }
    }

    /// The script entry of a limit's state.
    fn entry(&self, limit: &Limit, route: Route, mode: Mode, now: Option<Timestamp>) -> Entry {
        let call = Call {
            quota: limit.quota(),
            counter: route.counter,
            mode,
            cost: limit.cost(),
            now,
            marker: route.marker,
            keep_for: route.keep_for,
        };
        call.entry(&self.prefix, limit.key())
    }

    /// A limit's decision from its reply; `None` for a key split by another gateway, which
    /// this one learns of.
    fn read(
        &self,
        reply: &Numbers,
        limit: &Limit,
        route: Route,
        sent: Timestamp,
    ) -> Result<Option<Decision>, StoreError> {
        match Reply::parse(reply, figures(limit.quota(), route.counter).1)? {
            Reply::Decided { decision, .. } => Ok(Some(decision)),
            Reply::Split {
                parts,
                remaining,
                epoch,
                ..
            } => {
                let hot = &self.local.hot;
                hot.learn(limit.key(), *limit.quota(), (parts, epoch), remaining, sent);
                Ok(None)
            }
        }
    }

    /// The entries each call decides (by index): all of them in one on a single server or a
    /// pool, one call per slot on a cluster (a script's keys must share a slot).
    pub(super) fn groups(&self, entries: &[Entry]) -> Vec<Vec<usize>> {
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

    /// Gives back the charges of the slots whose limits all admitted (`charged`, with the
    /// time each was decided at), for a request another slot denied or whose call failed:
    /// one call per slot. A refund that fails leaves its units counted until they refill:
    /// what was admitted stays within the quota, and other requests see less room than
    /// there is meanwhile.
    async fn refund(
        &self,
        states: &[Limit],
        routes: &[Route],
        charged: &[(&Vec<usize>, Timestamp)],
        now: Option<Timestamp>,
    ) {
        let calls = charged.iter().filter_map(|&(group, at)| {
            let refund = Mode::Refund { charged_at: at };
            let now = now.map(|_| at);
            let entries: Vec<Entry> = (group.iter())
                .filter(|&&i| states[i].is_counted() && states[i].cost() > 0)
                .map(|&i| {
                    let route = Route {
                        marker: None,
                        ..routes[i]
                    };
                    self.entry(&states[i], route, refund, now)
                })
                .collect();
            (!entries.is_empty()).then_some(async move {
                let entries: Vec<&Entry> = entries.iter().collect();
                let refunded = self.within(self.batcher.connection().refund_limits(&entries));
                if let Err(error) = refunded.await {
                    crate::log::refund_failed(&error);
                }
            })
        });
        futures_util::future::join_all(calls).await;
    }
}

/// What a limit whose call failed would show (never returned: the request fails).
pub(super) fn denied() -> Decision {
    Decision::Denied(ratewarden_core::Info::new(
        0,
        0,
        Duration::ZERO,
        Duration::ZERO,
    ))
}
