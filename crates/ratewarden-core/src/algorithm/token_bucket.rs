//! [`TokenBucketState`]: a bucket of `burst` tokens refilled one at a time.

use super::{AlgorithmState, info, insufficient};
use crate::{Decision, Quota, Timestamp};

/// Token bucket: a bucket of `burst` tokens, refilled one token every `period / count`
/// (rounded up), each unit of cost taking one.
///
/// The state counts the tokens *used* (so `Default` is a full bucket) and the time from which
/// the next token is counted. Refills are whole tokens; the remainder carries over. A refill
/// point after `now` (a clock that stepped back) is moved to `now`: the used tokens come back
/// within the quota's horizon (`burst × interval`), never later.
///
/// ```
/// use ratewarden_core::algorithm::{AlgorithmState, TokenBucketState};
/// use ratewarden_core::{Quota, Timestamp};
///
/// // capacity 100, refilling 10 per second
/// let quota: ratewarden_core::Quota = "10/s burst 100 token-bucket".parse()?;
/// let mut state = TokenBucketState::default();
/// let now = Timestamp::from_micros(0);
/// assert!(state.check(now, 100, &quota).is_allowed());
/// assert!(!state.check(now, 1, &quota).is_allowed());
/// let later = Timestamp::from_micros(1_000_000);
/// assert!(state.check(later, 10, &quota).is_allowed());
/// # Ok::<(), ratewarden_core::ParseQuotaError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TokenBucketState {
    /// Tokens taken and not yet refilled.
    pub used: u64,
    /// Microsecond from which the next refill is counted.
    pub last: u64,
}

impl TokenBucketState {
    /// The state refilled up to `now`, and whether it was pulled back: behind a clock that
    /// stepped back, or past the bucket's capacity (which only a lying store could hold).
    fn refilled(mut self, now: u64, interval: u64, capacity: u64) -> (Self, bool) {
        let pulled_back = now < self.last || self.used > capacity;
        self.used = self.used.min(capacity);
        if now < self.last {
            // The clock stepped back: count refills from now on, not from a time to come.
            self.last = now;
            return (self, pulled_back);
        }
        let tokens = (now - self.last) / interval;
        if tokens >= self.used {
            self.used = 0;
            self.last = now;
        } else {
            self.used -= tokens;
            self.last += tokens * interval;
        }
        (self, pulled_back)
    }

    fn full_at(&self, interval: u64) -> u64 {
        self.last.saturating_add(self.used.saturating_mul(interval))
    }
}

impl AlgorithmState for TokenBucketState {
    fn check(&mut self, now: Timestamp, cost: u32, quota: &Quota) -> Decision {
        let interval = quota.emission_interval_micros();
        let capacity = u64::from(quota.burst());
        let cost = u64::from(cost);
        let (mut next, pulled_back) = self.refilled(now.as_micros(), interval, capacity);
        if pulled_back {
            *self = next;
        }
        let remaining = capacity.saturating_sub(next.used);
        if cost > capacity {
            return insufficient(capacity, remaining, now, next.full_at(interval));
        }
        if cost <= remaining {
            next.used += cost;
            if cost > 0 {
                *self = next;
            }
            Decision::Allowed(info(
                capacity,
                remaining - cost,
                now,
                next.full_at(interval),
                0,
            ))
        } else {
            let missing = next.used.saturating_add(cost) - capacity;
            let allowed_at = next.last.saturating_add(missing.saturating_mul(interval));
            Decision::Denied(info(
                capacity,
                remaining,
                now,
                next.full_at(interval),
                allowed_at,
            ))
        }
    }

    /// Puts back the tokens not refilled since the charge (a bucket refilled in the meantime
    /// may have been refilling them). Refunded later than the charge, it restarts the refill
    /// in progress at `now`: the charge may have started it, on a full bucket, and other
    /// charges since kept it going.
    fn refund(&mut self, now: Timestamp, charged_at: Timestamp, cost: u32, quota: &Quota) {
        let interval = quota.emission_interval_micros();
        let n = now.as_micros();
        let (mut next, _) = self.refilled(n, interval, u64::from(quota.burst()));
        let refilled_since = n.saturating_sub(charged_at.as_micros()) / interval;
        next.used = next
            .used
            .saturating_sub(u64::from(cost).saturating_sub(refilled_since));
        if n > charged_at.as_micros() {
            next.last = next.last.max(n);
        }
        *self = next;
    }

    fn fresh_at(&self, quota: &Quota) -> u64 {
        if self.used == 0 {
            0
        } else {
            self.full_at(quota.emission_interval_micros())
        }
    }
}
