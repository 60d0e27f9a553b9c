//! [`SlidingLogState`]: the time of every admitted unit in the last period; exact, for small limits.

use std::collections::VecDeque;

use super::{AlgorithmState, info, insufficient};
use crate::{Decision, Quota, Timestamp};

/// Sliding window log: the timestamp of every unit of cost admitted in the last `period`. Exact
/// (never more than `count` in any interval of length `period`), at 8 bytes per entry; the log
/// never holds more than `count` entries, and quotas cap `count` at 4,096. Entries stamped
/// after `now` (a clock that stepped back) are read as stamped `now`: they expire within one
/// period, the quota's horizon.
///
/// ```
/// use ratewarden_core::algorithm::{AlgorithmState, SlidingLogState};
/// use ratewarden_core::{Quota, Timestamp};
/// use std::time::Duration;
///
/// let quota: Quota = "5/min sliding-log".parse()?; // login attempts
/// let mut state = SlidingLogState::default();
/// for s in 0..5 {
///     assert!(state.check(Timestamp::from_micros(s * 1_000_000), 1, &quota).is_allowed());
/// }
/// let denied = state.check(Timestamp::from_micros(10_000_000), 1, &quota);
/// assert_eq!(denied.info().retry_after(), Duration::from_secs(50)); // the first entry ages out
/// # Ok::<(), ratewarden_core::ParseQuotaError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SlidingLogState {
    /// Admission times in microseconds, oldest first, one per unit of cost.
    pub entries: VecDeque<u64>,
}

impl SlidingLogState {
    fn expires_at(&self, period: u64) -> u64 {
        self.entries
            .back()
            .map_or(0, |last| last.saturating_add(period))
    }
}

impl AlgorithmState for SlidingLogState {
    fn check(&mut self, now: Timestamp, cost: u32, quota: &Quota) -> Decision {
        let period = quota.period_micros();
        let limit = u64::from(quota.count());
        let n = now.as_micros();
        // Entries are stamped with the time rounded *up* to the microsecond, and expire by
        // the time rounded down: an entry never leaves the log before a whole period of real
        // time has passed (rounding both down let one expire up to 1 µs early).
        let stamp = now.as_nanos().div_ceil(1_000);
        // The clock stepped back: what was stamped later counts as stamped now.
        for entry in self.entries.iter_mut().rev() {
            if *entry <= stamp {
                break;
            }
            *entry = stamp;
        }
        while self
            .entries
            .front()
            .is_some_and(|&t| t.saturating_add(period) <= n)
        {
            self.entries.pop_front();
        }
        let len = self.entries.len() as u64;
        let remaining = limit.saturating_sub(len);
        let cost64 = u64::from(cost);
        if cost64 > limit {
            return insufficient(limit, remaining, now, self.expires_at(period));
        }
        if cost64 <= remaining {
            self.entries
                .extend(std::iter::repeat_n(stamp, cost as usize));
            return Decision::Allowed(info(
                limit,
                remaining - cost64,
                now,
                self.expires_at(period),
                0,
            ));
        }
        // The entry whose expiry frees enough room for `cost`.
        let index = usize::try_from(len + cost64 - limit - 1).unwrap_or(usize::MAX);
        let allowed_at = self
            .entries
            .get(index)
            .map_or(n, |t| t.saturating_add(period));
        Decision::Denied(info(
            limit,
            remaining,
            now,
            self.expires_at(period),
            allowed_at,
        ))
    }

    /// Removes `cost` of the entries stamped with the charge's time (entries of other checks
    /// at that microsecond are alike): entries stamped at other times expire at theirs.
    fn refund(&mut self, _now: Timestamp, charged_at: Timestamp, cost: u32, _quota: &Quota) {
        let stamp = charged_at.as_nanos().div_ceil(1_000);
        let mut left = cost as usize;
        self.entries.retain(|&entry| {
            let remove = left > 0 && entry == stamp;
            left -= usize::from(remove);
            !remove
        });
    }

    fn fresh_at(&self, quota: &Quota) -> u64 {
        self.expires_at(quota.period_micros())
    }
}
