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
mod ledger;
mod sliding_log;
mod sliding_window;
mod token_bucket;

pub use fixed_window::FixedWindowState;
pub use gcra::GcraState;
pub use ledger::{Hold, Ledger};
pub use sliding_log::SlidingLogState;
pub use sliding_window::SlidingWindowState;
pub use token_bucket::TokenBucketState;

use std::fmt;
use std::str::FromStr;

use crate::{Decision, Info, ParseQuotaError, Quota, Timestamp};

/// How a quota is enforced.
///
/// The enum is exhaustive on purpose: a new algorithm is a breaking change of this crate, so
/// every store must say how it runs it (a compile error), never route it to another algorithm.
///
/// | algorithm | state per key | behaviour |
/// |-----------|---------------|-----------|
/// | [`Gcra`](Self::Gcra) (default) | 8 bytes | smooth rate with a burst; exact |
/// | [`TokenBucket`](Self::TokenBucket) | 16 bytes | a bucket of `burst` tokens refilled one at a time; exact |
/// | [`FixedWindow`](Self::FixedWindow) | 16 bytes | `count` per aligned window; up to 2× across a boundary |
/// | [`SlidingWindow`](Self::SlidingWindow) | 24 bytes | two windows, the previous one weighted by its overlap |
/// | [`SlidingLog`](Self::SlidingLog) | 8 bytes × `count` | exact sliding window; for small limits (at most 4,096) |
///
/// ```
/// use ratewarden_core::Algorithm;
/// assert_eq!("sliding-window".parse::<Algorithm>(), Ok(Algorithm::SlidingWindow));
/// assert_eq!(Algorithm::TokenBucket.to_string(), "token-bucket");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum Algorithm {
    /// Generic cell rate algorithm: one timestamp per key, bursts up to `burst`, then one
    /// request every `period / count`.
    #[default]
    Gcra,
    /// Token bucket of capacity `burst`, refilled with `count` tokens per `period`.
    TokenBucket,
    /// At most `count` per window, windows aligned to the clock's epoch.
    FixedWindow,
    /// Sliding window counter: the current window's count plus the previous window's,
    /// weighted by how much of it the sliding window still covers.
    SlidingWindow,
    /// Sliding window log: the timestamp of every admitted unit in the last `period`.
    SlidingLog,
}

impl Algorithm {
    /// Every algorithm, in the order of the table above.
    ///
    /// ```
    /// use ratewarden_core::Algorithm;
    /// let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.as_str()).collect();
    /// assert_eq!(names, ["gcra", "token-bucket", "fixed-window", "sliding-window", "sliding-log"]);
    /// ```
    pub const ALL: [Self; 5] = [
        Self::Gcra,
        Self::TokenBucket,
        Self::FixedWindow,
        Self::SlidingWindow,
        Self::SlidingLog,
    ];

    /// The algorithm's name, as parsed and printed.
    ///
    /// ```
    /// assert_eq!(ratewarden_core::Algorithm::SlidingLog.as_str(), "sliding-log");
    /// ```
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Gcra => "gcra",
            Self::TokenBucket => "token-bucket",
            Self::FixedWindow => "fixed-window",
            Self::SlidingWindow => "sliding-window",
            Self::SlidingLog => "sliding-log",
        }
    }

    pub(crate) const fn has_burst(self) -> bool {
        matches!(self, Self::Gcra | Self::TokenBucket)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Algorithm {
    type Err = ParseQuotaError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|a| a.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                ParseQuotaError::new(
                    s,
                    "unknown algorithm (expected gcra, token-bucket, fixed-window, sliding-window or sliding-log)",
                )
            })
    }
}

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

    /// Gives back, at `now`, `cost` units that [`check`](Self::check) admitted at
    /// `charged_at`. A store calls it to undo one limit's charge when another limit of the
    /// same request denied.
    ///
    /// Never gives back more than the charge still holds: what time has already paid back of
    /// it (a window that ended, a log entry that aged out, refill since the charge) stays
    /// spent, so a refund never admits more than the state would have without the charge.
    /// Refunded at once (`now == charged_at`, nothing checked in between), the state decides
    /// every later check exactly as if the charge had never been made. Refunded later, the
    /// token bucket's refill in progress restarts at `now` (at most one token's interval later
    /// than without the charge). The state must be the one the check admitted against.
    ///
    /// ```
    /// use ratewarden_core::algorithm::{AlgorithmState, SlidingLogState};
    /// use ratewarden_core::{Quota, Timestamp};
    ///
    /// let quota: Quota = "3/min sliding-log".parse()?;
    /// let mut state = SlidingLogState::default();
    /// let t = Timestamp::from_micros(1_000_000);
    /// assert!(state.check(t, 2, &quota).is_allowed());
    /// state.refund(t, t, 2, &quota);
    /// assert!(state.check(t, 3, &quota).is_allowed());
    /// # Ok::<(), ratewarden_core::ParseQuotaError>(())
    /// ```
    fn refund(&mut self, now: Timestamp, charged_at: Timestamp, cost: u32, quota: &Quota);

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
