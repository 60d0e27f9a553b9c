//! [`SlidingWindowState`]: the sliding window counter, two windows weighted by their overlap.

use super::{AlgorithmState, info, insufficient};
use crate::{Decision, Quota, Timestamp};

/// Sliding window counter: two aligned windows. At `e` microseconds into the current window
/// the count is estimated as `current + ceil(previous × (period − e) / period)`, and a cost is
/// admitted while the estimate plus the cost stays within `count`.
///
/// The rounding is up, so the estimate never under-counts the approximation. A stored window
/// after `now`'s (a clock that stepped back) is moved to `now`'s window with both its counts
/// in it, weighed fully: never less strict, and forgotten within two periods, the quota's
/// horizon.
///
/// ```
/// use ratewarden_core::algorithm::{AlgorithmState, SlidingWindowState};
/// use ratewarden_core::{Quota, Timestamp};
///
/// let quota: Quota = "100/min sliding-window".parse()?;
/// // 60 admitted last minute, 10 this minute, 1 s into it:
/// let state = SlidingWindowState { window: 1, current: 10, previous: 60 };
/// let now = Timestamp::from_micros(61_000_000);
/// // estimate = 10 + 60 × 59/60 = 69, so 31 remain
/// assert_eq!(state.peek(now, &quota).info().remaining(), 31);
/// # Ok::<(), ratewarden_core::ParseQuotaError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SlidingWindowState {
    /// Index of the current window (`now / period`).
    pub window: u64,
    /// Cost admitted in the current window.
    pub current: u64,
    /// Cost admitted in the window before it.
    pub previous: u64,
}

impl SlidingWindowState {
    /// The first instant, in microseconds, at which nothing admitted so far is counted.
    fn forgotten_at(&self, period: u64) -> u64 {
        let windows_left = if self.current > 0 {
            2
        } else if self.previous > 0 {
            1
        } else {
            return 0;
        };
        self.window
            .saturating_add(windows_left)
            .saturating_mul(period)
    }
}

/// The first offset into a window at which `ceil(weight × (period − e) / period) <= room`.
fn offset_for(weight: u64, room: u64, period: u64) -> u64 {
    period.saturating_sub(room.saturating_mul(period) / weight.max(1))
}

impl AlgorithmState for SlidingWindowState {
    fn check(&mut self, now: Timestamp, cost: u32, quota: &Quota) -> Decision {
        let period = quota.period_micros();
        let limit = u64::from(quota.count());
        let cost = u64::from(cost);
        let n = now.as_micros();
        let window = n / period;
        let mut next = *self;
        if window > next.window {
            let previous = if window == next.window + 1 {
                next.current
            } else {
                0
            };
            next = Self {
                window,
                current: 0,
                previous,
            };
        } else if window < next.window {
            // The clock stepped back: everything counted so far counts fully in now's window.
            next = Self {
                window,
                current: next.current.saturating_add(next.previous),
                previous: 0,
            };
            *self = next;
        }
        let start = next.window.saturating_mul(period);
        let elapsed = n.saturating_sub(start).min(period);
        let weighted = next
            .previous
            .saturating_mul(period - elapsed)
            .div_ceil(period);
        let estimate = next.current.saturating_add(weighted);
        let remaining = limit.saturating_sub(estimate);
        let reset_at = next.forgotten_at(period);
        if cost > limit {
            return insufficient(limit, remaining, now, reset_at);
        }
        if cost <= remaining {
            next.current += cost;
            if cost > 0 {
                *self = next;
            }
            let reset_at = next.forgotten_at(period);
            return Decision::Allowed(info(limit, remaining - cost, now, reset_at, 0));
        }
        let allowed_at = if next.current.saturating_add(cost) <= limit {
            // Wait for the previous window's weight to decay.
            let room = limit - cost - next.current;
            start.saturating_add(offset_for(next.previous, room, period))
        } else {
            // Wait for the next window, where this one becomes the weighted previous.
            let next_start = start.saturating_add(period);
            next_start.saturating_add(offset_for(next.current, limit - cost, period))
        };
        Decision::Denied(info(limit, remaining, now, reset_at, allowed_at))
    }

    /// Takes the cost off the window it was counted in: the current one, or the previous one
    /// once the state moved on by one window.
    fn refund(&mut self, _now: Timestamp, charged_at: Timestamp, cost: u32, quota: &Quota) {
        let cost = u64::from(cost);
        let window = charged_at.as_micros() / quota.period_micros();
        if self.window == window {
            self.current = self.current.saturating_sub(cost);
        } else if self.window == window.saturating_add(1) {
            self.previous = self.previous.saturating_sub(cost);
        }
    }

    fn fresh_at(&self, quota: &Quota) -> u64 {
        self.forgotten_at(quota.period_micros())
    }
}
