//! Waiting for a turn instead of being refused ([`RateLimitLayer::wait`]).
//!
//! A request is decided under its quota widened by the wait: `max_delay / interval` more
//! units of burst. Admitted, its units are taken at once, and it waits until it conforms to
//! the quota itself (its theoretical arrival time less the quota's tolerance), so requests
//! go on at the quota's pace, never faster: in any interval of length `t` they go on with at
//! most `burst + t / interval` units, as the quota alone admits. At most
//! `max_delay / interval` units of a key wait at once; one that would wait longer is refused
//! at once, with `Retry-After`.
//!
//! [`RateLimitLayer::wait`]: super::RateLimitLayer::wait

use std::sync::Arc;
use std::time::Duration;

use ratewarden_core::{Algorithm, Decision, Info, Key, Quota, Store};
use tokio::time::Instant;

/// A request's quota, and the same widened by what may wait.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Turn {
    pub(crate) quota: Quota,
    pub(crate) widened: Quota,
    /// The units of burst added: those that may wait.
    waiting: u32,
}

impl Turn {
    /// The turn of a request of `cost` under `quota` that may wait `max`: `None` for an
    /// algorithm without a rate to wait for (the windows), a wait shorter than one unit's
    /// interval, a cost of 0 (admitted however spent the key is) or one the quota can never
    /// admit (decided as without waiting). A wait longer than a quota can hold (its burst
    /// refilling within about 71 years) is cut to the longest it can.
    pub(crate) fn of(quota: Quota, max: Duration, cost: u32) -> Option<Self> {
        if !matches!(quota.algorithm(), Algorithm::Gcra | Algorithm::TokenBucket)
            || cost == 0
            || cost > quota.burst()
        {
            return None;
        }
        let interval = quota.emission_interval_micros().max(1);
        let max = u64::try_from(max.as_micros()).unwrap_or(u64::MAX);
        let mut waiting = u32::try_from(max / interval).unwrap_or(u32::MAX);
        while waiting > 0 {
            if let Ok(widened) = quota.with_burst(quota.burst().saturating_add(waiting)) {
                let waiting = widened.burst() - quota.burst();
                return (waiting > 0).then_some(Self {
                    quota,
                    widened,
                    waiting,
                });
            }
            waiting /= 2;
        }
        None
    }

    /// The decision to show for `decided` (under the widened quota), and how long an admitted
    /// request waits for its turn: the figures shown are the quota's own (what is left now,
    /// not counting what may wait).
    pub(crate) fn decided(&self, decided: Decision) -> (Decision, Duration) {
        let info = decided.info();
        let limit = u64::from(self.quota.burst());
        let tolerance = Duration::from_micros(self.quota.tolerance_micros());
        match decided {
            Decision::Allowed(_) => {
                let wait = info.reset_after().saturating_sub(tolerance);
                let remaining = info.remaining().saturating_sub(u64::from(self.waiting));
                let shown = Info::new(limit, remaining, info.reset_after(), Duration::ZERO);
                (Decision::Allowed(shown), wait)
            }
            Decision::Denied(_) => {
                let shown = Info::new(limit, 0, info.reset_after(), info.retry_after());
                (Decision::Denied(shown), Duration::ZERO)
            }
            Decision::InsufficientCapacity(_) => {
                let shown = Info::new(limit, 0, info.reset_after(), Duration::ZERO);
                (Decision::InsufficientCapacity(shown), Duration::ZERO)
            }
        }
    }
}

/// A waiting request's units, given back to the store if it is dropped before its turn
/// (and nothing was counted after them: see [`Store::give_back`]).
pub(crate) struct GiveBack<St: Store> {
    back: Option<(Arc<St>, Key, Quota, u32)>,
    checked: Instant,
    /// What the check's decision said of its state: fresh this long after it.
    fresh_in: Duration,
}

impl<St: Store> GiveBack<St> {
    pub(crate) fn new(
        store: Arc<St>,
        (key, quota, cost): (Key, Quota, u32),
        checked: Instant,
        fresh_in: Duration,
    ) -> Self {
        Self {
            back: Some((store, key, quota, cost)),
            checked,
            fresh_in,
        }
    }

    /// Its turn came: the units are spent.
    pub(crate) fn disarm(mut self) {
        self.back = None;
    }
}

impl<St: Store> Drop for GiveBack<St> {
    fn drop(&mut self) {
        let Some((store, key, quota, cost)) = self.back.take() else {
            return;
        };
        let ago = self.checked.elapsed();
        let fresh_in = self.fresh_in;
        // On the current runtime; with none (a runtime shutting down), the units stay spent.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = store.give_back(&key, &quota, cost, ago, fresh_in).await;
            });
        }
    }
}
