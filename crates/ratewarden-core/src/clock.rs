//! Time: [`Timestamp`], the [`Clock`] trait, [`MonotonicClock`] and [`ManualClock`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A point in time, in nanoseconds since the clock's epoch.
///
/// [`MonotonicClock`] and the Redis store count from the UNIX epoch, so fixed windows line up
/// with wall-clock minutes and hours. Algorithms work in whole microseconds
/// ([`Timestamp::as_micros`]).
///
/// ```
/// use ratewarden_core::Timestamp;
/// use std::time::Duration;
///
/// let t = Timestamp::from_micros(1_500);
/// assert_eq!(t.as_nanos(), 1_500_000);
/// assert_eq!(t.saturating_add(Duration::from_micros(500)).as_micros(), 2_000);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// A timestamp `nanos` nanoseconds after the epoch.
    ///
    /// ```
    /// assert_eq!(ratewarden_core::Timestamp::from_nanos(7).as_nanos(), 7);
    /// ```
    #[must_use]
    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }

    /// A timestamp `micros` microseconds after the epoch (saturating at `u64::MAX` ns).
    ///
    /// ```
    /// assert_eq!(ratewarden_core::Timestamp::from_micros(7).as_nanos(), 7_000);
    /// ```
    #[must_use]
    pub const fn from_micros(micros: u64) -> Self {
        Self(micros.saturating_mul(1_000))
    }

    /// Nanoseconds since the epoch.
    ///
    /// ```
    /// assert_eq!(ratewarden_core::Timestamp::from_nanos(7).as_nanos(), 7);
    /// ```
    #[must_use]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Whole microseconds since the epoch (rounded down): the unit algorithms compute in.
    ///
    /// ```
    /// assert_eq!(ratewarden_core::Timestamp::from_nanos(1_999).as_micros(), 1);
    /// ```
    #[must_use]
    pub const fn as_micros(self) -> u64 {
        self.0 / 1_000
    }

    /// This timestamp moved `by` into the future, saturating at the end of time.
    ///
    /// ```
    /// use ratewarden_core::Timestamp;
    /// use std::time::Duration;
    /// assert_eq!(Timestamp::from_nanos(u64::MAX).saturating_add(Duration::from_secs(1)).as_nanos(), u64::MAX);
    /// ```
    #[must_use]
    pub fn saturating_add(self, by: Duration) -> Self {
        Self(self.0.saturating_add(saturating_nanos(by)))
    }

    /// Nanoseconds from `self` until `later_micros`, or zero when that moment has passed.
    #[inline]
    pub(crate) const fn nanos_until_micros(self, later_micros: u64) -> u64 {
        later_micros.saturating_mul(1_000).saturating_sub(self.0)
    }
}

pub(crate) fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A source of [`Timestamp`]s.
///
/// Stores read their clock once per decision and pass the reading to the algorithm; the
/// algorithms never read a clock themselves. A clock may stand still or even step backwards:
/// no algorithm panics or admits more because of it.
///
/// ```
/// use ratewarden_core::{Clock, ManualClock, Timestamp};
///
/// fn elapsed<C: Clock>(clock: &C, since: Timestamp) -> u64 {
///     clock.now().as_nanos().saturating_sub(since.as_nanos())
/// }
/// let clock = ManualClock::new(Timestamp::from_nanos(10));
/// assert_eq!(elapsed(&clock, Timestamp::from_nanos(4)), 6);
/// ```
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;

    /// Whether a reading is never earlier than one taken before it, on any thread (default
    /// `false`). A store that meets state ahead of a reading from such a clock knows the
    /// reading is stale (its thread read the clock, then waited), never a clock that stepped
    /// back, and does not pull the state back to it.
    ///
    /// ```
    /// use ratewarden_core::{Clock, ManualClock, MonotonicClock, Timestamp};
    /// assert!(MonotonicClock::new().is_monotonic());
    /// assert!(!ManualClock::new(Timestamp::from_nanos(0)).is_monotonic()); // it can be set back
    /// ```
    fn is_monotonic(&self) -> bool {
        false
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }

    fn is_monotonic(&self) -> bool {
        (**self).is_monotonic()
    }
}

/// A monotonic clock counting nanoseconds since the UNIX epoch.
///
/// It reads the wall clock once, at construction, and from then on advances with the CPU's
/// time stamp counter (through [`quanta`](https://docs.rs/quanta)), which costs about 10 ns a
/// read where `Instant::now()` costs about 25 ns. It never moves backwards, whatever NTP does to
/// the wall clock. Clones share the calibration and the anchor.
///
/// ```
/// use ratewarden_core::{Clock, MonotonicClock};
///
/// let clock = MonotonicClock::new();
/// let (a, b) = (clock.now(), clock.now());
/// assert!(b >= a);
/// ```
#[cfg(feature = "monotonic-clock")]
#[cfg_attr(docsrs, doc(cfg(feature = "monotonic-clock")))]
#[derive(Clone, Debug)]
pub struct MonotonicClock {
    clock: quanta::Clock,
    start_raw: u64,
    anchor_nanos: u64,
}

#[cfg(feature = "monotonic-clock")]
impl MonotonicClock {
    /// A clock anchored at the current wall-clock time.
    ///
    /// ```
    /// use ratewarden_core::{Clock, MonotonicClock};
    /// assert!(MonotonicClock::new().now().as_nanos() > 0);
    /// ```
    #[must_use]
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let start_raw = clock.raw();
        let anchor_nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, saturating_nanos);
        Self {
            clock,
            start_raw,
            anchor_nanos,
        }
    }
}

#[cfg(feature = "monotonic-clock")]
impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "monotonic-clock")]
impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> Timestamp {
        let elapsed = self.clock.delta_as_nanos(self.start_raw, self.clock.raw());
        Timestamp(self.anchor_nanos.saturating_add(elapsed))
    }

    #[inline]
    fn is_monotonic(&self) -> bool {
        true
    }
}

/// A clock that moves only when told to: for tests, benchmarks, simulations and replays.
///
/// Clones share one reading, so a test keeps a handle while the store owns another.
///
/// ```
/// use ratewarden_core::{Clock, ManualClock, Timestamp};
/// use std::time::Duration;
///
/// let clock = ManualClock::default();
/// let store_side = clock.clone();
/// clock.advance(Duration::from_secs(1));
/// assert_eq!(store_side.now(), Timestamp::from_nanos(1_000_000_000));
/// clock.set(Timestamp::from_nanos(5)); // time may also run backwards
/// assert_eq!(store_side.now().as_nanos(), 5);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock that reads `start` until moved.
    ///
    /// ```
    /// use ratewarden_core::{Clock, ManualClock, Timestamp};
    /// assert_eq!(ManualClock::new(Timestamp::from_nanos(3)).now().as_nanos(), 3);
    /// ```
    #[must_use]
    pub fn new(start: Timestamp) -> Self {
        Self(Arc::new(AtomicU64::new(start.0)))
    }

    /// Moves the clock forward by `by`, saturating at the end of time.
    ///
    /// ```
    /// use ratewarden_core::{Clock, ManualClock};
    /// use std::time::Duration;
    /// let clock = ManualClock::default();
    /// clock.advance(Duration::from_nanos(2));
    /// assert_eq!(clock.now().as_nanos(), 2);
    /// ```
    pub fn advance(&self, by: Duration) {
        let by = saturating_nanos(by);
        // `fetch_update` with a closure that always returns `Some` cannot fail.
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Sets the clock to `to`, forwards or backwards.
    ///
    /// ```
    /// use ratewarden_core::{Clock, ManualClock, Timestamp};
    /// let clock = ManualClock::default();
    /// clock.set(Timestamp::from_micros(9));
    /// assert_eq!(clock.now().as_micros(), 9);
    /// ```
    pub fn set(&self, to: Timestamp) {
        self.0.store(to.0, Ordering::Release);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::Acquire))
    }
}
