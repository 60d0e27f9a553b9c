//! [`Spent`]: the units a gateway counts in windows aligned to its clock, for the window
//! algorithms (fixed window, sliding window counter), in micro-units.

use std::time::Duration;

use ratewarden_core::{Algorithm, Quota};

/// Units spent in windows of the quota's period aligned to the clock's epoch (window `now /
/// period`). The fixed window counts the current window; the sliding window counter adds
/// the window before, weighted by how much of it the sliding window still covers (rounded
/// up to a micro-unit).
///
/// What is counted only falls as time passes (the window before weighs less, then is
/// dropped), so a count kept within a capacity stays within it until more is added. A
/// clock behind the window counted in counts both windows fully, until it catches up.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spent {
    window: u64,
    /// Micro-units spent in `window`.
    current: u64,
    /// Micro-units spent in the window before (kept for the sliding window only).
    previous: u64,
    sliding: bool,
}

impl Spent {
    /// Nothing spent yet, in `now`'s window.
    pub(crate) fn new(quota: &Quota, now: u64) -> Self {
        Self {
            window: now / quota.period_micros().max(1),
            current: 0,
            previous: 0,
            sliding: quota.algorithm() == Algorithm::SlidingWindow,
        }
    }

    /// Moves to `now`'s window, if it is later.
    pub(crate) fn roll(&mut self, quota: &Quota, now: u64) {
        let window = now / quota.period_micros().max(1);
        if window > self.window {
            let carried = window == self.window + 1 && self.sliding;
            self.previous = if carried { self.current } else { 0 };
            self.current = 0;
            self.window = window;
        }
    }

    /// Micro-units counted at `now` (rolled to it first).
    pub(crate) fn counted(&self, quota: &Quota, now: u64) -> u64 {
        let period = quota.period_micros().max(1);
        if now / period != self.window {
            // A clock behind the window: both count fully.
            return self.current.saturating_add(self.previous);
        }
        let left = u128::from(period - now % period);
        // Rounded up, so that the counts of several gateways never add up to less than the
        // whole fleet's.
        let weighted = (u128::from(self.previous) * left).div_ceil(u128::from(period));
        self.current
            .saturating_add(u64::try_from(weighted).unwrap_or(u64::MAX))
    }

    /// Counts `micros` more, in the current window.
    pub(crate) const fn add(&mut self, micros: u64) {
        self.current = self.current.saturating_add(micros);
    }

    /// Counts `micros` fewer in the current window (as one exact limiter refunds: the
    /// window before stays as it was).
    pub(crate) const fn take_back(&mut self, micros: u64) {
        self.current = self.current.saturating_sub(micros);
    }

    /// How long until nothing is counted.
    pub(crate) fn reset(&self, quota: &Quota, now: u64) -> Duration {
        let period = quota.period_micros().max(1);
        let windows = if self.current > 0 {
            1 + u64::from(self.sliding)
        } else if self.previous > 0 {
            1
        } else {
            return Duration::ZERO;
        };
        let end = self.window.saturating_add(windows).saturating_mul(period);
        Duration::from_micros(end.saturating_sub(now))
    }

    /// The least a capacity of `room` micro-units (beside what is held) must wait, from
    /// `now`, until `need` more fit: `None` when the windows alone never make room for it.
    pub(crate) fn wait(&self, quota: &Quota, now: u64, room: u64, need: u64) -> Option<Duration> {
        let period = quota.period_micros().max(1);
        if need > room {
            return None;
        }
        let start = self.window.saturating_mul(period);
        // The offset into a window from which `weight` weighed by what is left of it fits
        // in `space`.
        let offset = |weight: u64, space: u64| {
            if weight == 0 {
                0
            } else {
                let kept = u128::from(space) * u128::from(period) / u128::from(weight);
                period.saturating_sub(u64::try_from(kept).unwrap_or(u64::MAX))
            }
        };
        let at = match room.checked_sub(self.current.saturating_add(need)) {
            Some(space) if self.sliding => start.saturating_add(offset(self.previous, space)),
            // The next window, where the current one is the window before.
            _ if self.sliding => start
                .saturating_add(period)
                .saturating_add(offset(self.current, room - need)),
            _ => start.saturating_add(period),
        };
        Some(Duration::from_micros(at.saturating_sub(now)))
    }
}

/// Eventual: whether units a peer last admitted at `at` (this gateway's clock: the time it
/// was told had passed since, taken from now) may still weigh in the quota at `now`, in a
/// mesh of `n`: for the windows, while `at`'s window counts (the sliding counter's window
/// before too); for GCRA and the token bucket, for `n` times the time the quota takes to
/// drain a burst and a period's count (the most a first hearing charges), which leaves room
/// for what the mesh may have admitted above the quota.
pub(crate) fn may_weigh(quota: &Quota, at: u64, now: u64, n: usize) -> bool {
    let period = quota.period_micros().max(1);
    match quota.algorithm() {
        Algorithm::FixedWindow => now / period <= at / period,
        Algorithm::SlidingWindow => now / period <= at / period + 1,
        _ => {
            let units = u128::from(quota.burst()) + u128::from(quota.count());
            let drain =
                units * u128::from(period) * n.max(1) as u128 / u128::from(quota.count().max(1));
            u128::from(now.saturating_sub(at)) <= drain
        }
    }
}
