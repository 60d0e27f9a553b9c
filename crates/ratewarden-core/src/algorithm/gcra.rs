//! [`GcraState`]: the generic cell rate algorithm, one theoretical arrival time per key.

use super::AlgorithmState;
use crate::{Decision, Info, Quota, Timestamp};

/// Generic cell rate algorithm: the whole state is one timestamp, the theoretical arrival time
/// (TAT) of the next request at the sustained rate.
///
/// With emission interval `T = period / count` (rounded up) and tolerance `τ = burst × T`, a
/// cost `c` is admitted at `now` when `max(tat, now) + c × T <= now + τ`, which moves the TAT
/// there. Admits `burst` at once, then one per `T`.
///
/// A stored TAT beyond `now + τ` can only come from a clock that stepped back (a failover to a
/// host whose clock is behind, an NTP step) or a store that lies: it is pulled back to
/// `now + τ` (the key fully spent now), so a step back never denies for longer than `τ`, the
/// quota's own horizon.
///
/// ```
/// use ratewarden_core::algorithm::{AlgorithmState, GcraState};
/// use ratewarden_core::{Quota, Timestamp};
/// use std::time::Duration;
///
/// let quota = Quota::per_second(10)?.with_burst(3)?;
/// let mut state = GcraState::default();
/// let now = Timestamp::from_micros(1_000_000);
/// for _ in 0..3 {
///     assert!(state.check(now, 1, &quota).is_allowed());
/// }
/// let denied = state.check(now, 1, &quota);
/// assert_eq!(denied.info().retry_after(), Duration::from_millis(100));
/// # Ok::<(), ratewarden_core::QuotaError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GcraState {
    /// Theoretical arrival time, in microseconds.
    pub tat: u64,
}

impl AlgorithmState for GcraState {
    #[inline]
    fn check(&mut self, now: Timestamp, cost: u32, quota: &Quota) -> Decision {
        let interval = quota.emission_interval_micros();
        let limit = u64::from(quota.burst());
        let n = now.as_micros();
        let horizon = n.saturating_add(quota.tolerance_micros()); // now + τ
        // A TAT past the horizon is a clock that stepped back: fully spent now, no more, and
        // kept so (were it not written, every later check would find it spent again).
        if self.tat > horizon {
            self.tat = horizon;
        }
        let tat = self.tat.max(n);
        // remaining = (horizon - tat) / interval, divided only if read
        let info = |tat: u64, retry_at: u64| {
            Info::from_parts(
                limit,
                horizon.saturating_sub(tat),
                interval,
                now.nanos_until_micros(tat),
                now.nanos_until_micros(retry_at),
            )
        };
        if u64::from(cost) > limit {
            return Decision::InsufficientCapacity(info(tat, 0));
        }
        let new_tat = tat.saturating_add(interval.saturating_mul(u64::from(cost)));
        if new_tat <= horizon {
            if cost > 0 {
                self.tat = new_tat;
            }
            Decision::Allowed(info(new_tat, 0))
        } else {
            let allowed_at = new_tat - (horizon - n);
            Decision::Denied(info(tat, allowed_at))
        }
    }

    /// Moves the TAT back by what of the charge's emission time lies after `now`: the part
    /// time has passed through is spent either way (a TAT behind the clock counts as the
    /// clock).
    fn refund(&mut self, now: Timestamp, charged_at: Timestamp, cost: u32, quota: &Quota) {
        let charge = quota
            .emission_interval_micros()
            .saturating_mul(u64::from(cost));
        let elapsed = now.as_micros().saturating_sub(charged_at.as_micros());
        self.tat = self.tat.saturating_sub(charge.saturating_sub(elapsed));
    }

    fn fresh_at(&self, _quota: &Quota) -> u64 {
        self.tat
    }
}
