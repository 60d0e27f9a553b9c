//! [`CachedResolverBuilder`]: the settings of a [`CachedResolver`], checked by `build`.

use std::error::Error;
use std::fmt;
use std::time::Duration;

use super::{CachedResolver, OnFailure, QuotaResolver};

/// The settings of a [`CachedResolver`], with their defaults. Made by
/// [`CachedResolver::builder`]; each step returns the builder, and
/// [`build`](Self::build) refuses settings that cannot work.
///
/// | setting | default | what it bounds |
/// |---------|---------|----------------|
/// | [`max_entries`](Self::max_entries) | 10,000 | tenants held at once (plans, unknown tenants and failures alike) |
/// | [`ttl`](Self::ttl) | 30 s | how long a plan is used before it is looked up again |
/// | [`unknown_ttl`](Self::unknown_ttl) | 5 s | how long "unknown tenant" is remembered (at most `ttl`) |
/// | [`failure_ttl`](Self::failure_ttl) | 1 s | how long a failed lookup's answer is kept before the resolver is asked again |
/// | [`timeout`](Self::timeout) | 1 s | how long a call waits for a lookup, its own or another's |
/// | [`on_failure`](Self::on_failure) | [`OnFailure::FailureMode`] | the answer when a lookup fails or times out |
///
/// ```
/// use ratewarden_tower::{Key, Quota};
/// use ratewarden_tower::tenant::{CachedResolver, OnFailure, Plan, ResolveError};
/// use std::time::Duration;
///
/// let resolver = |_: &Key| async { Ok::<Option<Plan>, ResolveError>(None) };
/// let cache = CachedResolver::builder(resolver)
///     .max_entries(50_000)
///     .ttl(Duration::from_secs(60))
///     .unknown_ttl(Duration::from_secs(10))
///     .timeout(Duration::from_millis(250))
///     .on_failure(OnFailure::Unavailable)
///     .build()?;
/// # let _ = cache;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use]
pub struct CachedResolverBuilder<R> {
    resolver: R,
    pub(super) settings: Settings,
}

/// A [`CachedResolver`]'s checked settings.
#[derive(Clone, Debug)]
pub(super) struct Settings {
    pub(super) max_entries: usize,
    pub(super) ttl: Duration,
    pub(super) unknown_ttl: Duration,
    pub(super) failure_ttl: Duration,
    pub(super) timeout: Duration,
    pub(super) on_failure: OnFailure,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_entries: 10_000,
            ttl: Duration::from_secs(30),
            unknown_ttl: Duration::from_secs(5),
            failure_ttl: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            on_failure: OnFailure::FailureMode,
        }
    }
}

impl<R> CachedResolverBuilder<R> {
    pub(super) fn new(resolver: R) -> Self {
        Self {
            resolver,
            settings: Settings::default(),
        }
    }

    /// The most tenants held at once (default 10,000), at least 1. When full, a new tenant
    /// takes the place of one not asked for lately: tenants seen once (a flood of made-up ids)
    /// are pushed out before those asked for again. The cache never holds more; it may hold up
    /// to one less per shard (a shard holds 32 tenants or more).
    ///
    /// ```
    /// # use ratewarden_tower::{Key, tenant::{CachedResolver, Plan, ResolveError}};
    /// # let resolver = |_: &Key| async { Ok::<Option<Plan>, ResolveError>(None) };
    /// let cache = CachedResolver::builder(resolver).max_entries(100).build()?;
    /// # let _ = cache;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_entries(mut self, max_entries: usize) -> Self {
        self.settings.max_entries = max_entries;
        self
    }

    /// How long a tenant's plan is used before it is looked up again (default 30 s). A plan
    /// change in the application takes effect within it (or at once, with
    /// [`CachedResolver::invalidate`]).
    ///
    /// ```
    /// # use ratewarden_tower::{Key, tenant::{CachedResolver, Plan, ResolveError}};
    /// # use std::time::Duration;
    /// # let resolver = |_: &Key| async { Ok::<Option<Plan>, ResolveError>(None) };
    /// let cache = CachedResolver::builder(resolver).ttl(Duration::from_secs(300)).build()?;
    /// # let _ = cache;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.settings.ttl = ttl;
        self
    }

    /// How long an unknown tenant (`Ok(None)`) is remembered before it is looked up again
    /// (default 5 s, at most [`ttl`](Self::ttl)): short, so that made-up tenant ids leave
    /// soon, and a tenant that has just signed up is found soon.
    ///
    /// ```
    /// # use ratewarden_tower::{Key, tenant::{CachedResolver, Plan, ResolveError}};
    /// # use std::time::Duration;
    /// # let resolver = |_: &Key| async { Ok::<Option<Plan>, ResolveError>(None) };
    /// let cache = CachedResolver::builder(resolver).unknown_ttl(Duration::from_secs(1)).build()?;
    /// # let _ = cache;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn unknown_ttl(mut self, unknown_ttl: Duration) -> Self {
        self.settings.unknown_ttl = unknown_ttl;
        self
    }

    /// How long the answer to a failed or timed-out lookup is kept before the resolver is asked
    /// again for that tenant (default 1 s): a resolver that is down is asked about each tenant
    /// at most once per `failure_ttl`, and calls meanwhile get their answer at once.
    ///
    /// ```
    /// # use ratewarden_tower::{Key, tenant::{CachedResolver, Plan, ResolveError}};
    /// # use std::time::Duration;
    /// # let resolver = |_: &Key| async { Ok::<Option<Plan>, ResolveError>(None) };
    /// let cache = CachedResolver::builder(resolver).failure_ttl(Duration::from_secs(5)).build()?;
    /// # let _ = cache;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn failure_ttl(mut self, failure_ttl: Duration) -> Self {
        self.settings.failure_ttl = failure_ttl;
        self
    }

    /// The longest a call waits for a tenant's lookup, whether it makes the lookup or waits
    /// for another call's (default 1 s). A lookup still running then is dropped, and the call
    /// gets the [`on_failure`](Self::on_failure) answer.
    ///
    /// ```
    /// # use ratewarden_tower::{Key, tenant::{CachedResolver, Plan, ResolveError}};
    /// # use std::time::Duration;
    /// # let resolver = |_: &Key| async { Ok::<Option<Plan>, ResolveError>(None) };
    /// let cache = CachedResolver::builder(resolver).timeout(Duration::from_millis(100)).build()?;
    /// # let _ = cache;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// The answer when a lookup fails or times out, for a tenant with no earlier plan at hand
    /// (default [`OnFailure::FailureMode`]). A tenant whose plan has expired keeps that plan
    /// while its lookups fail.
    ///
    /// ```
    /// # use ratewarden_tower::{Key, tenant::{CachedResolver, OnFailure, Plan, ResolveError}};
    /// # let resolver = |_: &Key| async { Ok::<Option<Plan>, ResolveError>(None) };
    /// let cache = CachedResolver::builder(resolver).on_failure(OnFailure::Unavailable).build()?;
    /// # let _ = cache;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_failure(mut self, on_failure: OnFailure) -> Self {
        self.settings.on_failure = on_failure;
        self
    }

    /// The cache.
    ///
    /// # Errors
    ///
    /// [`CacheConfigError`] for a zero `max_entries`, a zero duration, or an `unknown_ttl`
    /// longer than `ttl`.
    ///
    /// ```
    /// use ratewarden_tower::Key;
    /// use ratewarden_tower::tenant::{CacheConfigError, CachedResolver, Plan, ResolveError};
    /// use std::time::Duration;
    ///
    /// let resolver = |_: &Key| async { Ok::<Option<Plan>, ResolveError>(None) };
    /// let err = CachedResolver::builder(resolver).timeout(Duration::ZERO).build().unwrap_err();
    /// assert_eq!(err, CacheConfigError::Zero { setting: "timeout" });
    /// ```
    pub fn build(self) -> Result<CachedResolver<R>, CacheConfigError>
    where
        R: QuotaResolver,
    {
        let s = &self.settings;
        if s.max_entries == 0 {
            return Err(CacheConfigError::Zero {
                setting: "max_entries",
            });
        }
        for (setting, value) in [
            ("ttl", s.ttl),
            ("unknown_ttl", s.unknown_ttl),
            ("failure_ttl", s.failure_ttl),
            ("timeout", s.timeout),
        ] {
            if value.is_zero() {
                return Err(CacheConfigError::Zero { setting });
            }
        }
        if s.unknown_ttl > s.ttl {
            return Err(CacheConfigError::UnknownTtlOverTtl {
                unknown_ttl: s.unknown_ttl,
                ttl: s.ttl,
            });
        }
        Ok(CachedResolver::with_settings(self.resolver, self.settings))
    }
}

impl<R> fmt::Debug for CachedResolverBuilder<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedResolverBuilder")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Settings a [`CachedResolver`] cannot work with.
///
/// ```
/// use ratewarden_tower::tenant::CacheConfigError;
/// use std::time::Duration;
///
/// let err = CacheConfigError::UnknownTtlOverTtl {
///     unknown_ttl: Duration::from_secs(60),
///     ttl: Duration::from_secs(30),
/// };
/// assert_eq!(err.to_string(), "unknown_ttl (60s) is longer than ttl (30s)");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheConfigError {
    /// A setting that must be positive is zero.
    Zero {
        /// The builder method.
        setting: &'static str,
    },
    /// Unknown tenants would be remembered longer than plans.
    UnknownTtlOverTtl {
        /// The `unknown_ttl` given.
        unknown_ttl: Duration,
        /// The `ttl` given.
        ttl: Duration,
    },
}

impl fmt::Display for CacheConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Zero { setting } => write!(f, "{setting} must not be zero"),
            Self::UnknownTtlOverTtl { unknown_ttl, ttl } => {
                write!(
                    f,
                    "unknown_ttl ({unknown_ttl:?}) is longer than ttl ({ttl:?})"
                )
            }
        }
    }
}

impl Error for CacheConfigError {}
