//! [`FixedWindowState`]: at most `count` per window aligned to the epoch.

use super::{AlgorithmState, info, insufficient};
use crate::{Decision, Quota, Timestamp};

/// Fixed window: at most `count` per window of `period`, windows aligned to the clock's epoch
/// (so `100/min` windows start on the minute).
///
/// Cheap and easy to explain, but a client can spend a full window's count at the end of one
/// window and again at the start of the next: up to 2 × `count` within one `period`. A stored
/// window after `now`'s (a clock that stepped back) becomes `now`'s window, spent in full (the
/// state no longer knows what `now`'s window had spent): a denial never lasts longer than one
/// period, and a window the clock passes through twice never hands out its count twice.
///
/// ```
/// use ratewarden_core::algorithm::{AlgorithmState, FixedWindowState};
/// use ratewarden_core::{Quota, Timestamp};
/// use std::time::Duration;
///
/// let quota: Quota = "100/min fixed-window".parse()?;
/// let mut state = FixedWindowState::default();
/// let at = |s: u64| Timestamp::from_micros(s * 1_000_000);
/// assert!(state.check(at(30), 100, &quota).is_allowed());
/// let denied = state.check(at(30), 1, &quota);
/// assert_eq!(denied.info().retry_after(), Duration::from_secs(30));
/// # Ok::<(), ratewarden_core::ParseQuotaError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FixedWindowState {
    /// Index of the current window (`now / period`).
    pub window: u64,
    /// Cost admitted in the current window.
    pub count: u64,
}

impl AlgorithmState for FixedWindowState {
    fn check(&mut self, now: Timestamp, cost: u32, quota: &Quota) -> Decision {
        let period = quota.period_micros();
        let limit = u64::from(quota.count());
        let cost = u64::from(cost);
        let window = now.as_micros() / period;
        let mut next = *self;
        if window > next.window {
            next = Self { window, count: 0 };
        } else if window < next.window {
            // The clock stepped back: now's window may have been spent before the state moved
            // on, so it counts as spent, until its end.
            next = Self {
                window,
                count: next.count.max(limit),
            };
            *self = next;
        }
        let reset_at = next.window.saturating_add(1).saturating_mul(period);
        let remaining = limit.saturating_sub(next.count);
        if cost > limit {
            insufficient(limit, remaining, now, reset_at)
        } else if cost <= remaining {
            if cost > 0 {
                *self = Self {
                    count: next.count + cost,
                    ..next
                };
            }
            Decision::Allowed(info(limit, remaining - cost, now, reset_at, 0))
        } else {
            Decision::Denied(info(limit, remaining, now, reset_at, reset_at))
        }
    }

    /// Takes the cost off the window it was counted in, if that is still the current one (a
    /// window that ended no longer counts).
    fn refund(&mut self, _now: Timestamp, charged_at: Timestamp, cost: u32, quota: &Quota) {
        if self.window == charged_at.as_micros() / quota.period_micros() {
            self.count = self.count.saturating_sub(u64::from(cost));
        }
    }

    fn fresh_at(&self, quota: &Quota) -> u64 {
        if self.count == 0 {
            0
        } else {
            self.window
                .saturating_add(1)
                .saturating_mul(quota.period_micros())
        }
    }
}
