//! What a check decided: [`Decision`] and [`Info`].

use std::time::Duration;

/// The outcome of one check.
///
/// A denial is not an error: it carries the same [`Info`] as an admission, so a service can
/// always answer with accurate rate-limit headers.
///
/// ```
/// use ratewarden_core::{Decision, Info};
/// use std::time::Duration;
///
/// let info = Info::new(10, 0, Duration::from_secs(6), Duration::from_secs(1));
/// let decision = Decision::Denied(info);
/// assert!(!decision.is_allowed());
/// assert_eq!(decision.info().retry_after(), Duration::from_secs(1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The request fits the quota and was counted.
    Allowed(Info),
    /// The request does not fit now; it will after [`Info::retry_after`]. Nothing was counted.
    Denied(Info),
    /// The cost is larger than the quota can ever admit at once ([`Info::limit`]): retrying
    /// will never help, so there is no retry time. Nothing was counted.
    InsufficientCapacity(Info),
}

impl Decision {
    /// Whether the request was admitted.
    ///
    /// ```
    /// # use ratewarden_core::{Decision, Info};
    /// # use std::time::Duration;
    /// let info = Info::new(1, 0, Duration::ZERO, Duration::ZERO);
    /// assert!(Decision::Allowed(info).is_allowed());
    /// assert!(!Decision::InsufficientCapacity(info).is_allowed());
    /// ```
    #[must_use]
    pub const fn is_allowed(&self) -> bool {
        matches!(self, Self::Allowed(_))
    }

    /// The limit, remaining, reset and retry figures, whatever the outcome.
    ///
    /// ```
    /// # use ratewarden_core::{Decision, Info};
    /// # use std::time::Duration;
    /// let info = Info::new(5, 4, Duration::from_secs(1), Duration::ZERO);
    /// assert_eq!(Decision::Allowed(info).info().remaining(), 4);
    /// ```
    #[must_use]
    pub const fn info(&self) -> &Info {
        match self {
            Self::Allowed(info) | Self::Denied(info) | Self::InsufficientCapacity(info) => info,
        }
    }
}

/// The figures behind a [`Decision`], as a client should see them.
///
/// ```
/// use ratewarden_core::Info;
/// use std::time::Duration;
///
/// let info = Info::new(100, 42, Duration::from_secs(30), Duration::ZERO);
/// assert_eq!((info.limit(), info.remaining()), (100, 42));
/// assert_eq!(info.reset_after(), Duration::from_secs(30));
/// ```
#[derive(Clone, Copy)]
pub struct Info {
    limit: u64,
    /// `remaining = slack / per_unit`, divided only when asked: the division is the single
    /// most expensive instruction of a GCRA check.
    slack: u64,
    per_unit: u64,
    reset_after_nanos: u64,
    retry_after_nanos: u64,
}

impl Info {
    /// Builds the figures; stores that compute decisions elsewhere (in Lua, say) use this.
    ///
    /// ```
    /// # use ratewarden_core::Info;
    /// # use std::time::Duration;
    /// let info = Info::new(1, 0, Duration::from_millis(5), Duration::from_millis(5));
    /// assert_eq!(info.retry_after(), Duration::from_millis(5));
    /// ```
    #[must_use]
    pub const fn new(
        limit: u64,
        remaining: u64,
        reset_after: Duration,
        retry_after: Duration,
    ) -> Self {
        Self {
            limit,
            slack: remaining,
            per_unit: 1,
            reset_after_nanos: saturating_nanos(reset_after),
            retry_after_nanos: saturating_nanos(retry_after),
        }
    }

    /// Builds the figures with `remaining = slack / per_unit` (computed when read), and times
    /// in nanoseconds.
    pub(crate) const fn from_parts(
        limit: u64,
        slack: u64,
        per_unit: u64,
        reset_after_nanos: u64,
        retry_after_nanos: u64,
    ) -> Self {
        Self {
            limit,
            slack,
            per_unit,
            reset_after_nanos,
            retry_after_nanos,
        }
    }

    /// The most the quota admits at once (its burst, or its per-window limit).
    ///
    /// ```
    /// # use ratewarden_core::Info;
    /// # use std::time::Duration;
    /// assert_eq!(Info::new(7, 0, Duration::ZERO, Duration::ZERO).limit(), 7);
    /// ```
    #[must_use]
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// How much more cost would be admitted right now.
    ///
    /// ```
    /// # use ratewarden_core::Info;
    /// # use std::time::Duration;
    /// assert_eq!(Info::new(7, 3, Duration::ZERO, Duration::ZERO).remaining(), 3);
    /// ```
    #[must_use]
    pub const fn remaining(&self) -> u64 {
        if self.per_unit <= 1 {
            self.slack
        } else {
            self.slack / self.per_unit
        }
    }

    /// How long until the key's state equals a fresh one (its full limit is available again).
    ///
    /// ```
    /// # use ratewarden_core::Info;
    /// # use std::time::Duration;
    /// assert_eq!(Info::new(7, 3, Duration::from_secs(2), Duration::ZERO).reset_after(), Duration::from_secs(2));
    /// ```
    #[must_use]
    pub const fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after_nanos)
    }

    /// For a denial, how long until the same request would be admitted; zero otherwise.
    ///
    /// A request made exactly `retry_after` later is admitted (if nothing else consumed the
    /// quota meanwhile); one made a nanosecond earlier is not.
    ///
    /// ```
    /// # use ratewarden_core::Info;
    /// # use std::time::Duration;
    /// assert_eq!(Info::new(7, 0, Duration::ZERO, Duration::from_secs(1)).retry_after(), Duration::from_secs(1));
    /// ```
    #[must_use]
    pub const fn retry_after(&self) -> Duration {
        Duration::from_nanos(self.retry_after_nanos)
    }
}

const fn saturating_nanos(d: Duration) -> u64 {
    let nanos = d.as_nanos();
    if nanos > u64::MAX as u128 {
        u64::MAX
    } else {
        nanos as u64
    }
}

impl PartialEq for Info {
    fn eq(&self, other: &Self) -> bool {
        self.limit == other.limit
            && self.remaining() == other.remaining()
            && self.reset_after_nanos == other.reset_after_nanos
            && self.retry_after_nanos == other.retry_after_nanos
    }
}

impl Eq for Info {}

impl std::hash::Hash for Info {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (
            self.limit,
            self.remaining(),
            self.reset_after_nanos,
            self.retry_after_nanos,
        )
            .hash(state);
    }
}

impl std::fmt::Debug for Info {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Info")
            .field("limit", &self.limit)
            .field("remaining", &self.remaining())
            .field("reset_after", &self.reset_after())
            .field("retry_after", &self.retry_after())
            .finish()
    }
}
