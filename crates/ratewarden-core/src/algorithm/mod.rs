//! The five algorithms, as pure state machines over integer microseconds.
//!
//! Each state type is the whole per-key state of its algorithm. [`AlgorithmState::check`]
//! takes the current time, a cost and the [`Quota`] and returns the [`Decision`]. It changes
//! the state only when it admits a cost above 0, or when the clock has stepped back behind
//! the state (which it then pulls back to now, see each algorithm); the sliding log also drops
//! its expired entries. Stores read their clock, call this, and write the state back only when
//! it changed; the Lua scripts of `ratewarden-redis` mirror these functions line for line.
//!
//! All arithmetic is on integers and saturating: no input (a clock at `u64::MAX`, a cost of 0
//! or above the burst, a state read back garbled) panics. Stored numbers stay below 2^53 for
//! any timestamp before the year 2255.
//!
//! ```
//! use ratewarden_core::algorithm::{AlgorithmState, FixedWindowState};
//! use ratewarden_core::{Decision, Quota, Timestamp};
//!
//! let quota: Quota = "2/min fixed-window".parse()?;
//! let mut state = FixedWindowState::default();
//! let t = Timestamp::from_micros(59_000_000); // 59 s: the last second of the first minute
//! assert!(state.check(t, 2, &quota).is_allowed());
//! assert!(!state.check(t, 1, &quota).is_allowed());
//! let next_minute = Timestamp::from_micros(60_000_000);
//! assert!(state.check(next_minute, 2, &quota).is_allowed()); // the boundary burst
//! assert!(matches!(state.check(next_minute, 3, &quota), Decision::InsufficientCapacity(_)));
//! # Ok::<(), ratewarden_core::ParseQuotaError>(())
//! ```

mod fixed_window;
mod gcra;
mod sliding_log;
mod sliding_window;
mod token_bucket;

pub use fixed_window::FixedWindowState;
pub use gcra::GcraState;
pub use sliding_log::SlidingLogState;
pub use sliding_window::SlidingWindowState;
pub use token_bucket::TokenBucketState;

use crate::{Decision, Info, Quota, Timestamp};

/// The per-key state of one algorithm. `Default` is the state of a key never seen.
///
/// ```
/// use ratewarden_core::algorithm::{AlgorithmState, GcraState};
/// use ratewarden_core::{Quota, Timestamp};
///
/// let quota = Quota::per_second(1)?;
/// let mut state = GcraState::default();
/// let now = Timestamp::from_micros(5_000_000);
/// assert!(state.check(now, 1, &quota).is_allowed());
/// assert!(!state.peek(now, &quota).is_allowed());
/// assert_eq!(state.fresh_at(&quota), 6_000_000); // equals a fresh state from t = 6 s on
/// # Ok::<(), ratewarden_core::QuotaError>(())
/// ```
pub trait AlgorithmState: Clone + Default + Send + Sync + 'static {
    /// Counts `cost` against this state at `now` if it fits, and says what happened.
    fn check(&mut self, now: Timestamp, cost: u32, quota: &Quota) -> Decision;

    /// Whether a cost of 1 would be admitted at `now`, without counting it. The
    /// [`Info::remaining`] is what is left now.
    #[must_use]
    fn peek(&self, now: Timestamp, quota: &Quota) -> Decision {
        let one = self.clone().check(now, 1, quota);
        match self.clone().check(now, 0, quota) {
            Decision::Allowed(now_info) if one.is_allowed() => Decision::Allowed(now_info),
            _ => one,
        }
    }

    /// The time, in microseconds, from which this state behaves exactly like a fresh one:
    /// when a store may forget it (memory eviction, Redis TTL). 0 when it already does.
    fn fresh_at(&self, quota: &Quota) -> u64;
}

/// Builds an [`Info`] from instants in microseconds.
#[inline]
fn info(limit: u64, remaining: u64, now: Timestamp, reset_at: u64, retry_at: u64) -> Info {
    Info::from_parts(
        limit,
        remaining,
        1,
        now.nanos_until_micros(reset_at),
        now.nanos_until_micros(retry_at),
    )
}

/// The decision for a cost larger than `limit`: nothing counted, no retry time.
fn insufficient(limit: u64, remaining: u64, now: Timestamp, reset_at: u64) -> Decision {
    Decision::InsufficientCapacity(Info::from_parts(
        limit,
        remaining,
        1,
        now.nanos_until_micros(reset_at),
        0,
    ))
}

#[cfg(test)]
mod tests;
