use super::{AlgorithmState, info, insufficient};
use crate::{Decision, Quota, Timestamp};

/// Token bucket: a bucket of `burst` tokens, refilled one token every `period / count`
/// (rounded up), each unit of cost taking one.
///
/// The state counts the tokens *used* (so `Default` is a full bucket) and the time from which
/// the next token is counted. Refills are whole tokens; the remainder carries over.
///
/// ```
/// use rl_core::algorithm::{AlgorithmState, TokenBucketState};
/// use rl_core::{Quota, Timestamp};
///
/// // capacity 100, refilling 10 per second
/// let quota: rl_core::Quota = "10/s burst 100 token-bucket".parse()?;
/// let mut state = TokenBucketState::default();
/// let now = Timestamp::from_micros(0);
/// assert!(state.check(now, 100, &quota).is_allowed());
/// assert!(!state.check(now, 1, &quota).is_allowed());
/// let later = Timestamp::from_micros(1_000_000);
/// assert!(state.check(later, 10, &quota).is_allowed());
/// # Ok::<(), rl_core::ParseQuotaError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TokenBucketState {
    /// Tokens taken and not yet refilled.
    pub used: u64,
    /// Microsecond from which the next refill is counted.
    pub last: u64,
}

impl TokenBucketState {
    fn refill(&mut self, now: u64, interval: u64) {
        if now > self.last {
            let tokens = (now - self.last) / interval;
            if tokens >= self.used {
                self.used = 0;
                self.last = now;
            } else {
                self.used -= tokens;
                self.last += tokens * interval;
            }
        }
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
        self.refill(now.as_micros(), interval);
        let remaining = capacity.saturating_sub(self.used);
        if cost > capacity {
            return insufficient(capacity, remaining, now, self.full_at(interval));
        }
        if cost <= remaining {
            self.used += cost;
            Decision::Allowed(info(
                capacity,
                remaining - cost,
                now,
                self.full_at(interval),
                0,
            ))
        } else {
            let missing = self.used.saturating_add(cost) - capacity;
            let allowed_at = self.last.saturating_add(missing.saturating_mul(interval));
            Decision::Denied(info(
                capacity,
                remaining,
                now,
                self.full_at(interval),
                allowed_at,
            ))
        }
    }

    fn fresh_at(&self, quota: &Quota) -> u64 {
        if self.used == 0 {
            0
        } else {
            self.full_at(quota.emission_interval_micros())
        }
    }
}
