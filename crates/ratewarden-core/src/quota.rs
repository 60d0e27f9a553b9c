//! [`Quota`]: how much a key may do, how fast it refills, and with which [`Algorithm`].

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;
use std::time::Duration;

#[cfg(feature = "serde")]
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Algorithm;

/// The longest period a quota may have: 366 days.
const MAX_PERIOD_MICROS: u64 = 366 * 86_400 * 1_000_000;
/// Every span an algorithm adds to a timestamp stays at or below this (about 142 years), so
/// timestamp + span stays below 2^53 and is exact in Lua.
const MAX_SPAN_MICROS: u64 = 1 << 52;
/// A quota's burst takes at most this long to refill (about 71 years): half the span
/// arithmetic allows, so that every [`Quota::share`] of it stays within that span too.
const MAX_BURST_SPAN_MICROS: u64 = MAX_SPAN_MICROS / 2;
/// The sliding log keeps one timestamp per admitted unit of cost; this bounds its size.
const MAX_LOG_LIMIT: u32 = 4_096;

/// How many requests (or units of cost) a key may make per period, how many at once, and which
/// [`Algorithm`] enforces it.
///
/// Construction is validated: a zero count, a zero, sub-microsecond or longer-than-a-year
/// period, a rate above one per microsecond, or figures that would overflow are
/// [`QuotaError`]s that name the bad value.
///
/// ```
/// use ratewarden_core::{Algorithm, Quota};
/// use std::time::Duration;
///
/// let quota = Quota::per_second(100)?;               // 100 per second, burst 100
/// assert_eq!(quota.count(), 100);
/// assert_eq!(quota.period(), Duration::from_secs(1));
/// assert_eq!(quota.burst(), 100);
///
/// let bursty = Quota::per_second(10)?.with_burst(50)?; // 50 at once, then 10 per second
/// assert_eq!(bursty, "10/s burst 50".parse()?);
///
/// let window: Quota = "1000/h fixed-window".parse()?;
/// assert_eq!(window.algorithm(), Algorithm::FixedWindow);
/// assert_eq!(window, Quota::per_hour(1000)?.with_algorithm(Algorithm::FixedWindow)?);
///
/// assert_eq!(
///     Quota::per_second(0).unwrap_err().to_string(),
///     "quota count is 0: a quota must admit at least one request per period",
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    algorithm: Algorithm,
    count: u32,
    burst: u32,
    period_micros: u64,
    /// `period / count`, rounded up (derived; kept to spare a division per check).
    interval_micros: u64,
    /// [`Quota::fingerprint`] (derived; kept to spare hashing per check).
    fingerprint: u64,
}

impl Quota {
    /// `count` per `period`, with a burst of `count`, enforced by [`Algorithm::Gcra`].
    ///
    /// # Errors
    ///
    /// A [`QuotaError`] when `count` is zero, `period` is zero, not a whole number of
    /// microseconds or longer than 366 days, or the rate exceeds one per microsecond.
    ///
    /// ```
    /// use ratewarden_core::Quota;
    /// use std::time::Duration;
    /// let quota = Quota::new(300, Duration::from_secs(15 * 60))?;
    /// assert_eq!(quota.to_string(), "300/15min");
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    pub fn new(count: u32, period: Duration) -> Result<Self, QuotaError> {
        let nanos = period.as_nanos();
        if nanos < 1_000 {
            return Err(QuotaError::PeriodTooShort { period });
        }
        if !nanos.is_multiple_of(1_000) {
            return Err(QuotaError::PeriodNotWholeMicros { period });
        }
        let period_micros = u64::try_from(nanos / 1_000).unwrap_or(u64::MAX);
        if period_micros > MAX_PERIOD_MICROS {
            return Err(QuotaError::PeriodTooLong { period });
        }
        Self {
            algorithm: Algorithm::Gcra,
            count,
            burst: count,
            period_micros,
            interval_micros: 0,
            fingerprint: 0,
        }
        .validated()
    }

    /// `count` per second.
    ///
    /// # Errors
    ///
    /// See [`Quota::new`].
    ///
    /// ```
    /// assert_eq!(ratewarden_core::Quota::per_second(100)?.to_string(), "100/s");
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    pub fn per_second(count: u32) -> Result<Self, QuotaError> {
        Self::new(count, Duration::from_secs(1))
    }

    /// `count` per minute.
    ///
    /// # Errors
    ///
    /// See [`Quota::new`].
    ///
    /// ```
    /// assert_eq!(ratewarden_core::Quota::per_minute(100)?.to_string(), "100/min");
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    pub fn per_minute(count: u32) -> Result<Self, QuotaError> {
        Self::new(count, Duration::from_secs(60))
    }

    /// `count` per hour.
    ///
    /// # Errors
    ///
    /// See [`Quota::new`].
    ///
    /// ```
    /// assert_eq!(ratewarden_core::Quota::per_hour(1000)?.to_string(), "1000/h");
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    pub fn per_hour(count: u32) -> Result<Self, QuotaError> {
        Self::new(count, Duration::from_secs(3_600))
    }

    /// `count` per day.
    ///
    /// # Errors
    ///
    /// See [`Quota::new`].
    ///
    /// ```
    /// assert_eq!(ratewarden_core::Quota::per_day(5)?.to_string(), "5/d");
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    pub fn per_day(count: u32) -> Result<Self, QuotaError> {
        Self::new(count, Duration::from_secs(86_400))
    }

    /// The same rate, with up to `burst` admitted at once. Only [`Algorithm::Gcra`] and
    /// [`Algorithm::TokenBucket`] have a burst separate from the count.
    ///
    /// # Errors
    ///
    /// A [`QuotaError`] when `burst` is zero, too large for the period, or the algorithm is a
    /// window.
    ///
    /// ```
    /// let quota = ratewarden_core::Quota::per_second(10)?.with_burst(50)?;
    /// assert_eq!(quota.burst(), 50);
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    pub fn with_burst(self, burst: u32) -> Result<Self, QuotaError> {
        Self { burst, ..self }.validated()
    }

    /// The same figures, enforced by `algorithm`.
    ///
    /// # Errors
    ///
    /// A [`QuotaError`] when the figures do not suit `algorithm` (a separate burst for a
    /// window, a sliding log above 4,096 entries, ...).
    ///
    /// ```
    /// use ratewarden_core::{Algorithm, Quota};
    /// let quota = Quota::per_minute(5)?.with_algorithm(Algorithm::SlidingLog)?;
    /// assert_eq!(quota.to_string(), "5/min sliding-log");
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    pub fn with_algorithm(self, algorithm: Algorithm) -> Result<Self, QuotaError> {
        Self { algorithm, ..self }.validated()
    }

    /// The algorithm that enforces this quota.
    ///
    /// ```
    /// assert_eq!(ratewarden_core::Quota::per_second(1)?.algorithm(), ratewarden_core::Algorithm::Gcra);
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub const fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// How many requests (units of cost) per [`period`](Self::period).
    ///
    /// ```
    /// assert_eq!(ratewarden_core::Quota::per_second(9)?.count(), 9);
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub const fn count(&self) -> u32 {
        self.count
    }

    /// The period over which [`count`](Self::count) requests are admitted.
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(ratewarden_core::Quota::per_minute(9)?.period(), Duration::from_secs(60));
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub const fn period(&self) -> Duration {
        Duration::from_micros(self.period_micros)
    }

    /// How many are admitted at once: the limit a client sees. Equals
    /// [`count`](Self::count) unless set with [`with_burst`](Self::with_burst).
    ///
    /// ```
    /// assert_eq!(ratewarden_core::Quota::per_second(9)?.burst(), 9);
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub const fn burst(&self) -> u32 {
        self.burst
    }

    /// The period in whole microseconds, the unit algorithms (and Lua scripts) compute in.
    ///
    /// ```
    /// assert_eq!(ratewarden_core::Quota::per_second(9)?.period_micros(), 1_000_000);
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub const fn period_micros(&self) -> u64 {
        self.period_micros
    }

    /// The time one unit of cost takes to refill, in microseconds: `period / count`, rounded
    /// up so that rounding never admits more than the quota.
    ///
    /// ```
    /// assert_eq!(ratewarden_core::Quota::per_second(3)?.emission_interval_micros(), 333_334);
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub const fn emission_interval_micros(&self) -> u64 {
        self.interval_micros
    }

    /// GCRA's tolerance `burst × emission interval`, in microseconds: how far ahead of now a
    /// key's theoretical arrival time may run.
    ///
    /// ```
    /// let quota = ratewarden_core::Quota::per_second(10)?.with_burst(5)?;
    /// assert_eq!(quota.tolerance_micros(), 500_000);
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub const fn tolerance_micros(&self) -> u64 {
        self.interval_micros * self.burst as u64
    }

    /// One of `n` equal shares of this quota, each rounded up: the quota each of `n` gateways
    /// enforces alone when they cannot share state, or each of `n` sub-counters of a hot key.
    /// Together the `n` shares admit at most `n - 1` more than the whole, per period and at
    /// once (`n × ⌈count / n⌉ ≤ count + n - 1`); no share is ever below 1, and none is ever
    /// more than the `n`-th part rounded up.
    ///
    /// Every share of a valid quota is itself valid: a quota's burst may take at most 71 years
    /// to refill, so that a share's (at most twice as long, by rounding) stays within what the
    /// algorithms compute exactly. A quota too long for that is refused when it is built.
    ///
    /// ```
    /// use ratewarden_core::Quota;
    /// use std::num::NonZeroU32;
    ///
    /// let quota = Quota::per_second(100)?.with_burst(10)?;
    /// let share = quota.share(NonZeroU32::new(4).unwrap());
    /// assert_eq!((share.count(), share.burst()), (25, 3));
    /// assert_eq!(share.period(), quota.period());
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub const fn share(self, n: NonZeroU32) -> Self {
        // Why the share is valid without checking: with `c' = ⌈c/n⌉ ≥ c/n` the share's
        // interval `I' = ⌈P/c'⌉ ≤ n × I`, so for `n ≤ b` its burst span
        // `⌈b/n⌉ × I' ≤ (b + n - 1) × I < 2 × b × I ≤ 2 × MAX_BURST_SPAN = MAX_SPAN`, and for
        // `n > b` it is `I' ≤ P`; a smaller count passes the rate and window limits the whole
        // passed, and a window's burst stays equal to its count.
        let count = self.count.div_ceil(n.get());
        let burst = self.burst.div_ceil(n.get());
        Self {
            count,
            burst,
            interval_micros: self.period_micros.div_ceil(count as u64),
            ..self
        }
        .with_fingerprint()
    }

    /// Checks the figures and fills in the derived interval.
    fn validated(mut self) -> Result<Self, QuotaError> {
        let Self {
            algorithm,
            count,
            burst,
            period_micros,
            ..
        } = self;
        let period = self.period();
        if count == 0 {
            return Err(QuotaError::ZeroCount);
        }
        if burst == 0 {
            return Err(QuotaError::ZeroBurst);
        }
        if algorithm.has_burst() {
            if u64::from(count) > period_micros {
                return Err(QuotaError::RateTooHigh { count, period });
            }
            if u64::from(burst).saturating_mul(period_micros.div_ceil(u64::from(count)))
                > MAX_BURST_SPAN_MICROS
            {
                return Err(QuotaError::BurstTooLarge { burst, period });
            }
        } else if burst != count {
            return Err(QuotaError::BurstNotSupported { algorithm, burst });
        }
        let too_large = match algorithm {
            Algorithm::SlidingWindow => u64::from(count).saturating_mul(period_micros) >= 1 << 53,
            Algorithm::SlidingLog => count > MAX_LOG_LIMIT,
            _ => false,
        };
        if too_large {
            return Err(QuotaError::LimitTooLarge {
                algorithm,
                count,
                period,
            });
        }
        self.interval_micros = period_micros.div_ceil(u64::from(count));
        Ok(self.with_fingerprint())
    }

    const fn with_fingerprint(mut self) -> Self {
        let algorithm = match self.algorithm {
            Algorithm::Gcra => 1,
            Algorithm::TokenBucket => 2,
            Algorithm::FixedWindow => 3,
            Algorithm::SlidingWindow => 4,
            Algorithm::SlidingLog => 5,
        };
        let mut h = mix(algorithm);
        h = mix(h ^ self.count as u64);
        h = mix(h ^ self.burst as u64);
        self.fingerprint = mix(h ^ self.period_micros);
        self
    }

    /// A 64-bit fingerprint of the quota (its algorithm, count, burst and period): equal
    /// quotas have equal fingerprints on every host and in every version of this crate, and
    /// different quotas practically never do. Stores keep a key's state per quota under it
    /// (the Redis store writes it into its key names), so requests decided under different
    /// quotas never share state.
    ///
    /// ```
    /// use ratewarden_core::Quota;
    /// let login = Quota::per_hour(5)?;
    /// assert_eq!(login.fingerprint(), Quota::per_hour(5)?.fingerprint());
    /// assert_ne!(login.fingerprint(), Quota::per_minute(100)?.fingerprint());
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    #[inline]
    pub const fn fingerprint(&self) -> u64 {
        self.fingerprint
    }
}

/// splitmix64's finalizer: a fixed bijective mix of 64 bits, the same everywhere.
pub(crate) const fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const UNITS: [(u64, &str); 6] = [
    (86_400_000_000, "d"),
    (3_600_000_000, "h"),
    (60_000_000, "min"),
    (1_000_000, "s"),
    (1_000, "ms"),
    (1, "us"),
];

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (size, unit) = UNITS
            .into_iter()
            .find(|(size, _)| self.period_micros.is_multiple_of(*size))
            .unwrap_or((1, "us"));
        let n = self.period_micros / size;
        write!(f, "{}/", self.count)?;
        if n != 1 {
            write!(f, "{n}")?;
        }
        f.write_str(unit)?;
        if self.burst != self.count {
            write!(f, " burst {}", self.burst)?;
        }
        if self.algorithm != Algorithm::Gcra {
            write!(f, " {}", self.algorithm)?;
        }
        Ok(())
    }
}

fn parse_unit(unit: &str) -> Option<u64> {
    Some(match unit.to_ascii_lowercase().as_str() {
        "us" | "µs" => 1,
        "ms" => 1_000,
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000_000,
        "m" | "min" | "mins" | "minute" | "minutes" => 60_000_000,
        "h" | "hr" | "hour" | "hours" => 3_600_000_000,
        "d" | "day" | "days" => 86_400_000_000,
        _ => return None,
    })
}

impl FromStr for Quota {
    type Err = ParseQuotaError;

    /// Parses `COUNT/[N]UNIT [burst B] [ALGORITHM]`, e.g. `100/s`, `1000/h`, `300/15min`,
    /// `10/s burst 50`, `5/min sliding-log`. Units: `us`, `ms`, `s`, `min` (or `m`), `h`, `d`.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason: &str| ParseQuotaError::new(input, reason);
        let (count, rest) = input
            .split_once('/')
            .ok_or_else(|| err("expected COUNT/PERIOD, such as 100/s"))?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| err("the count must be a whole number from 1 to 4294967295"))?;
        let mut words = rest.split_whitespace();
        let period = words
            .next()
            .ok_or_else(|| err("missing period unit after '/'"))?;
        let digits = period.bytes().take_while(u8::is_ascii_digit).count();
        let (n, unit) = period.split_at(digits);
        let n: u64 = if n.is_empty() {
            1
        } else {
            n.parse()
                .map_err(|_| err("the period multiplier is too large"))?
        };
        let unit = parse_unit(unit)
            .ok_or_else(|| err("unknown period unit (expected us, ms, s, min, h or d)"))?;
        let micros = n
            .checked_mul(unit)
            .ok_or_else(|| err("the period is too long"))?;
        let mut quota =
            Self::new(count, Duration::from_micros(micros)).map_err(|e| e.in_input(input))?;
        let (mut burst, mut algorithm) = (None, None);
        while let Some(word) = words.next() {
            if word.eq_ignore_ascii_case("burst") {
                let b = words
                    .next()
                    .and_then(|b| b.parse::<u32>().ok())
                    .ok_or_else(|| err("'burst' must be followed by a whole number"))?;
                // Said twice, one of the two is not what the quota does: refused.
                if burst.replace(b).is_some() {
                    return Err(err("'burst' given twice"));
                }
            } else {
                let named = word.parse().map_err(|_| {
                    err(&format!(
                        "unexpected {word:?} (expected 'burst N' or an algorithm name)"
                    ))
                })?;
                if algorithm.replace(named).is_some() {
                    return Err(err("two algorithms given"));
                }
                quota.algorithm = named;
            }
        }
        if let Some(burst) = burst {
            quota.burst = burst;
        }
        quota.validated().map_err(|e| e.in_input(input))
    }
}

#[cfg(feature = "serde")]
impl Serialize for Quota {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(feature = "serde")]
impl<'de> Deserialize<'de> for Quota {
    /// Reads the string form, e.g. `"10/s burst 50"`.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Why a [`Quota`] could not be built. Each variant names the offending value.
///
/// ```
/// use ratewarden_core::{Quota, QuotaError};
/// use std::time::Duration;
///
/// let err = Quota::new(10, Duration::from_secs(400 * 86_400)).unwrap_err();
/// assert!(matches!(err, QuotaError::PeriodTooLong { .. }));
/// assert_eq!(err.to_string(), "quota period 34560000s is longer than 366 days");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuotaError {
    /// The count was zero.
    ZeroCount,
    /// The burst was zero.
    ZeroBurst,
    /// The period was shorter than one microsecond.
    PeriodTooShort {
        /// The period given.
        period: Duration,
    },
    /// The period had a fraction of a microsecond.
    PeriodNotWholeMicros {
        /// The period given.
        period: Duration,
    },
    /// The period was longer than 366 days.
    PeriodTooLong {
        /// The period given.
        period: Duration,
    },
    /// More than one request per microsecond: finer than the algorithms' resolution.
    RateTooHigh {
        /// The count given.
        count: u32,
        /// The period given.
        period: Duration,
    },
    /// `burst` intervals of `period / count` would span more than 2^51 microseconds (about 71
    /// years): too long to refill, and to share.
    BurstTooLarge {
        /// The burst given.
        burst: u32,
        /// The quota's period.
        period: Duration,
    },
    /// A window algorithm was given a burst different from its count.
    BurstNotSupported {
        /// The algorithm.
        algorithm: Algorithm,
        /// The burst given.
        burst: u32,
    },
    /// The count is too large for the algorithm (sliding log above 4,096 entries, or a
    /// sliding window whose count × period in microseconds reaches 2^53).
    LimitTooLarge {
        /// The algorithm.
        algorithm: Algorithm,
        /// The count given.
        count: u32,
        /// The quota's period.
        period: Duration,
    },
}

impl QuotaError {
    fn in_input(self, input: &str) -> ParseQuotaError {
        ParseQuotaError {
            input: input.to_owned(),
            reason: self.to_string(),
            source: Some(self),
        }
    }
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroCount => {
                f.write_str("quota count is 0: a quota must admit at least one request per period")
            }
            Self::ZeroBurst => f.write_str("quota burst is 0: a burst must be at least 1"),
            Self::PeriodTooShort { period } => {
                write!(f, "quota period {period:?} is shorter than 1µs")
            }
            Self::PeriodNotWholeMicros { period } => {
                write!(
                    f,
                    "quota period {period:?} is not a whole number of microseconds"
                )
            }
            Self::PeriodTooLong { period } => {
                write!(f, "quota period {period:?} is longer than 366 days")
            }
            Self::RateTooHigh { count, period } => write!(
                f,
                "quota rate {count} per {period:?} is above one per microsecond, the finest rate a quota can express"
            ),
            Self::BurstTooLarge { burst, period } => write!(
                f,
                "quota burst {burst} is too large for its period {period:?}: it would take more than 71 years to refill"
            ),
            Self::BurstNotSupported { algorithm, burst } => write!(
                f,
                "quota burst {burst} is not supported by {algorithm}: only gcra and token-bucket have a burst separate from the count"
            ),
            Self::LimitTooLarge {
                algorithm,
                count,
                period,
            } => write!(
                f,
                "quota count {count} per {period:?} is too large for {algorithm} (sliding-log keeps at most 4096 entries; sliding-window needs count × period in µs below 2^53)"
            ),
        }
    }
}

impl std::error::Error for QuotaError {}

/// Why a string is not a valid [`Quota`] or [`Algorithm`].
///
/// ```
/// let err = "100/fortnight".parse::<ratewarden_core::Quota>().unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "invalid quota \"100/fortnight\": unknown period unit (expected us, ms, s, min, h or d)",
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseQuotaError {
    input: String,
    reason: String,
    source: Option<QuotaError>,
}

impl ParseQuotaError {
    pub(crate) fn new(input: &str, reason: &str) -> Self {
        Self {
            input: input.to_owned(),
            reason: reason.to_owned(),
            source: None,
        }
    }
}

impl fmt::Display for ParseQuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid quota {:?}: {}", self.input, self.reason)
    }
}

impl std::error::Error for ParseQuotaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_human_strings() {
        let q: Quota = "100/s".parse().unwrap();
        assert_eq!(q, Quota::per_second(100).unwrap());
        let q: Quota = "1000/h".parse().unwrap();
        assert_eq!(q.period(), Duration::from_secs(3600));
        let q: Quota = "10/s burst 50".parse().unwrap();
        assert_eq!((q.count(), q.burst()), (10, 50));
        let q: Quota = "  300 / 15min sliding-window".parse().unwrap();
        assert_eq!(q.period(), Duration::from_secs(900));
        assert_eq!(q.algorithm(), Algorithm::SlidingWindow);
        let q: Quota = "10/s burst 100 token-bucket".parse().unwrap();
        assert_eq!(q.algorithm(), Algorithm::TokenBucket);
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "100/s",
            "1000/h",
            "300/15min",
            "10/s burst 50",
            "5/min sliding-log",
            "7/1500ms fixed-window",
            "3/d",
            "1/7us",
            "10/s burst 100 token-bucket",
        ] {
            let q: Quota = s.parse().unwrap();
            assert_eq!(q.to_string(), s);
            assert_eq!(q.to_string().parse::<Quota>().unwrap(), q);
        }
    }

    #[test]
    fn parse_errors_name_the_problem() {
        let cases = [
            ("", "expected COUNT/PERIOD"),
            ("100", "expected COUNT/PERIOD"),
            ("x/s", "the count must be a whole number"),
            ("-1/s", "the count must be a whole number"),
            ("0/s", "quota count is 0"),
            ("100/", "missing period unit"),
            ("100/fortnight", "unknown period unit"),
            ("100/s burst", "'burst' must be followed"),
            ("100/s burst x", "'burst' must be followed"),
            ("100/s burst 0", "quota burst is 0"),
            ("100/s leaky", "unexpected \"leaky\""),
            (
                "100/99999999999999999999d",
                "the period multiplier is too large",
            ),
            ("100/999999999d", "the period is too long"),
            ("100/400d", "longer than 366 days"),
            (
                "100/min burst 5 fixed-window",
                "not supported by fixed-window",
            ),
            ("5000/min sliding-log", "too large for sliding-log"),
            ("2000000/s", "above one per microsecond"),
            ("5/min burst 5 burst 500", "'burst' given twice"),
            ("5/min sliding-log gcra", "two algorithms given"),
        ];
        for (input, expected) in cases {
            let err = input.parse::<Quota>().unwrap_err().to_string();
            assert!(err.contains(expected), "{input:?}: {err}");
            assert!(err.contains(&format!("{input:?}")), "{err}");
        }
    }

    #[test]
    fn constructors_reject_bad_values_by_name() {
        assert_eq!(
            Quota::new(1, Duration::ZERO).unwrap_err(),
            QuotaError::PeriodTooShort {
                period: Duration::ZERO
            }
        );
        assert_eq!(
            Quota::new(1, Duration::from_nanos(1_500)).unwrap_err(),
            QuotaError::PeriodNotWholeMicros {
                period: Duration::from_nanos(1_500)
            }
        );
        assert!(Quota::new(1, Duration::MAX).is_err());
        assert_eq!(
            Quota::per_second(u32::MAX).unwrap_err(),
            QuotaError::RateTooHigh {
                count: u32::MAX,
                period: Duration::from_secs(1)
            }
        );
        let err = Quota::per_day(1).unwrap().with_burst(u32::MAX).unwrap_err();
        assert!(matches!(
            err,
            QuotaError::BurstTooLarge {
                burst: u32::MAX,
                ..
            }
        ));
        assert!(err.to_string().contains("4294967295"));
        let err = Quota::new(1_000_000, Duration::from_secs(366 * 86_400))
            .unwrap()
            .with_algorithm(Algorithm::SlidingWindow)
            .unwrap_err();
        assert!(matches!(
            err,
            QuotaError::LimitTooLarge {
                count: 1_000_000,
                ..
            }
        ));
    }

    #[test]
    fn a_share_is_never_the_whole_quota() {
        // Reproduced: this quota passed validation, its half did not, and `share` then
        // returned the whole quota to each of the two gateways.
        let two_a_year = Quota::new(2, Duration::from_secs(365 * 86_400)).unwrap();
        match two_a_year.with_burst(285) {
            Ok(quota) => {
                let half = quota.share(NonZeroU32::new(2).unwrap());
                assert_eq!((half.count(), half.burst()), (1, 143), "{half}");
            }
            // Refused when configured, where the operator sees it: also right.
            Err(err) => assert!(matches!(err, QuotaError::BurstTooLarge { .. }), "{err}"),
        }
    }

    proptest::proptest! {
        #[test]
        fn every_share_is_the_nth_part_rounded_up(
            count in proptest::prop_oneof![1u32..=8, 1u32..=5_000],
            period_us in proptest::prop_oneof![MAX_PERIOD_MICROS / 2..=MAX_PERIOD_MICROS, 1u64..=MAX_PERIOD_MICROS],
            burst_from_top in proptest::prop_oneof![0u64..=3, 0u64..=2_000],
            n in proptest::prop_oneof![1u32..=8, 1u32..=5_000],
            algorithm in proptest::sample::select(Algorithm::ALL.to_vec()),
        ) {
            let Ok(quota) = Quota::new(count, Duration::from_micros(period_us))
                .and_then(|q| q.with_algorithm(algorithm))
            else {
                return Ok(());
            };
            // Bursts near the largest the period allows, where shares used to fail.
            let quota = if algorithm.has_burst() {
                let top = MAX_BURST_SPAN_MICROS / quota.emission_interval_micros();
                let burst = u32::try_from(top.saturating_sub(burst_from_top).max(1)).unwrap_or(u32::MAX);
                match quota.with_burst(burst) {
                    Ok(q) => q,
                    Err(_) => return Ok(()),
                }
            } else {
                quota
            };
            let share = quota.share(NonZeroU32::new(n).unwrap());
            proptest::prop_assert_eq!(share.count(), count.div_ceil(n));
            proptest::prop_assert_eq!(share.burst(), quota.burst().div_ceil(n));
            proptest::prop_assert_eq!(share.period(), quota.period());
            proptest::prop_assert_eq!(share.algorithm(), quota.algorithm());
            // Within what the algorithms compute exactly, and valid in every other respect.
            proptest::prop_assert!(share.tolerance_micros() <= MAX_SPAN_MICROS);
            let other_checks = if algorithm.has_burst() { Quota { burst: 1, ..share } } else { share };
            proptest::prop_assert_eq!(
                other_checks.validated().map(|q| q.emission_interval_micros()),
                Ok(share.emission_interval_micros())
            );
        }
    }

    #[cfg(feature = "serde")]
    #[test]
    fn serde_uses_the_string_form() {
        let q: Quota = "10/s burst 50".parse().unwrap();
        let json = serde_json::to_string(&q).unwrap();
        assert_eq!(json, "\"10/s burst 50\"");
        assert_eq!(serde_json::from_str::<Quota>(&json).unwrap(), q);
        let err = serde_json::from_str::<Quota>("\"0/s\"").unwrap_err();
        assert!(err.to_string().contains("quota count is 0"), "{err}");
        let a: Algorithm = serde_json::from_str("\"token-bucket\"").unwrap();
        assert_eq!(a, Algorithm::TokenBucket);
    }
}
