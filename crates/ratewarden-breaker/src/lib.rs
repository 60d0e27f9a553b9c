//! [`CircuitBreaker`]: stops asking a failing store, then asks again after a backoff.
//!
//! A breaker wraps any [`Store`] and is itself a `Store`, and a cheap handle: its clones share
//! one state, so one breaker guards every layer that shares a Redis.
//! `ratewarden-tower` re-exports this crate as `ratewarden_tower::breaker`.
//!
//! ```text
//!            N consecutive failures, or a failure rate over a window
//!   Closed ----------------------------------------------------------> Open (for a backoff)
//!     ^                                                                  |
//!     | a probe succeeds                          the backoff has passed |
//!     |                                                                  v
//!     +------------------------------------------------------------- HalfOpen (probes only)
//!                 a probe fails: Open again, for twice the backoff (up to a cap)
//! ```
//!
//! While open, checks fail at once with [`StoreErrorKind::CircuitOpen`], without touching the
//! store, and a rate-limit layer applies its failure mode (`ratewarden-tower`'s
//! `FailureMode`). Only backend failures ([`StoreError::is_backend_failure`]: timeouts,
//! connection errors, `OOM`, `READONLY`, `CLUSTERDOWN`, `BUSY`, ...) count against the store; a
//! denial is a success, and so is an error about one key (a key of the wrong type). Every
//! transition is decided when a call arrives, from the [`Clock`]: the breaker starts no task
//! and no timer.
//!
//! ```
//! use ratewarden_breaker::{BreakerState, CircuitBreaker};
//! use ratewarden_core::{Key, Quota, Store};
//! use ratewarden_memory::MemoryStore;
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let breaker = CircuitBreaker::builder(MemoryStore::new()) // a RedisStore, in earnest
//!     .failure_threshold(5)
//!     .backoff(Duration::from_millis(500), Duration::from_secs(10))
//!     .build()?;
//! // Each layer gets a clone; a readiness detail reads the same breaker.
//! let for_a_layer = breaker.clone();
//! let quota: Quota = "1/s".parse()?;
//! let decision = for_a_layer.check_ready(&Key::from("k"), &quota, 1).ok_or("memory decides at once")??;
//! assert!(decision.is_allowed());
//! assert_eq!(breaker.state(), BreakerState::Closed);
//! # Ok(()) }
//! ```
//!
//! # Feature flags
//!
//! | feature | what it adds |
//! |---------|--------------|
//! | `tracing` | a log event for each transition (warn when opening, info otherwise) |
//! | `metrics` | `ratewarden_breaker_transitions_total`, `ratewarden_breaker_state`, `ratewarden_store_failures_total` (`ratewarden-tower`'s crate docs list them) |

use std::fmt;
use std::sync::{Arc, PoisonError};

// The state machine's lock is loom's in the model-checking tests (`--cfg rl_loom`).
#[cfg(rl_loom)]
use loom::sync::{Mutex, MutexGuard};
#[cfg(not(rl_loom))]
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use ratewarden_core::{
    Clock, Decision, Decisions, Key, Limit, MonotonicClock, Quota, Reservation, Store, StoreError,
    StoreErrorKind, Timestamp,
};

/// Where a [`CircuitBreaker`] stands.
///
/// ```
/// use ratewarden_breaker::{BreakerState, CircuitBreaker};
/// let breaker = CircuitBreaker::new(ratewarden_memory::MemoryStore::new());
/// assert_eq!(breaker.state(), BreakerState::Closed);
/// assert_eq!(BreakerState::Open.as_str(), "open");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// The store is asked (healthy).
    Closed,
    /// The store is not asked; every check fails at once with
    /// [`StoreErrorKind::CircuitOpen`].
    Open,
    /// The backoff has passed: a limited number of probes ask the store, the rest fail at once.
    HalfOpen,
}

impl BreakerState {
    /// `"closed"`, `"open"` or `"half-open"`.
    ///
    /// ```
    /// assert_eq!(ratewarden_breaker::BreakerState::HalfOpen.as_str(), "half-open");
    /// ```
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half-open",
        }
    }
}

impl fmt::Display for BreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The settings of a [`CircuitBreaker`]; see its builder methods for the defaults.
#[derive(Clone, Debug)]
struct Settings {
    name: Arc<str>,
    consecutive: u32,
    rate: Option<FailureRate>,
    base_backoff: Duration,
    max_backoff: Duration,
    probes: u32,
    probe_timeout: Duration,
}

#[derive(Clone, Copy, Debug)]
struct FailureRate {
    ratio: f64,
    window: Duration,
    min_calls: u32,
}

/// A [`Store`] that stops calling a failing store for a while; see the
/// [crate docs](crate).
///
/// A cheap handle: clones share one breaker (one state, one store), so one breaker guards
/// every layer that shares a store. Build it with [`new`](Self::new) (the defaults) or
/// [`builder`](Self::builder).
///
/// Defaults: open after 3 consecutive failures or when at least half of 20 or more calls in
/// a 10 s window fail; first backoff 1 s, doubling on every failed probe up to 30 s, each
/// shortened by up to a quarter at random so that a fleet does not probe in step; 1 probe at
/// a time, which counts as failed past 1 s.
pub struct CircuitBreaker<S, C = MonotonicClock> {
    inner: Arc<Inner<S, C>>,
}

struct Inner<S, C> {
    store: S,
    clock: C,
    settings: Settings,
    machine: Mutex<Machine>,
    /// Every transition reported, in order: what the tests count.
    #[cfg(test)]
    transitions: std::sync::Mutex<Vec<BreakerState>>,
}

impl<S, C> Clone for CircuitBreaker<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for CircuitBreaker<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("store", &self.inner.store)
            .field("settings", &self.inner.settings)
            .field("machine", &*self.lock())
            .finish_non_exhaustive()
    }
}

impl<S> CircuitBreaker<S> {
    /// A closed breaker in front of `store`, with the default settings.
    ///
    /// ```
    /// use ratewarden_breaker::{BreakerState, CircuitBreaker};
    /// let breaker = CircuitBreaker::new(ratewarden_memory::MemoryStore::new());
    /// assert_eq!(breaker.state(), BreakerState::Closed);
    /// ```
    pub fn new(store: S) -> Self {
        Self::builder(store).build_valid()
    }

    /// A builder for a breaker in front of `store`, starting from the default settings.
    ///
    /// ```
    /// use ratewarden_breaker::{BreakerState, CircuitBreaker};
    /// use std::time::Duration;
    ///
    /// let breaker = CircuitBreaker::builder(ratewarden_memory::MemoryStore::new())
    ///     .name("redis-sessions")
    ///     .failure_threshold(5)
    ///     .failure_rate(0.25, Duration::from_secs(30), 100)
    ///     .backoff(Duration::from_millis(100), Duration::from_secs(5))
    ///     .probes(2)
    ///     .probe_timeout(Duration::from_millis(200))
    ///     .build()?;
    /// assert_eq!(breaker.state(), BreakerState::Closed);
    /// assert!(format!("{breaker:?}").contains("redis-sessions"));
    /// # Ok::<(), ratewarden_breaker::ConfigError>(())
    /// ```
    pub fn builder(store: S) -> CircuitBreakerBuilder<S> {
        CircuitBreakerBuilder {
            store,
            clock: MonotonicClock::new(),
            settings: Settings {
                name: Arc::from("store"),
                consecutive: 3,
                rate: Some(FailureRate {
                    ratio: 0.5,
                    window: Duration::from_secs(10),
                    min_calls: 20,
                }),
                base_backoff: Duration::from_secs(1),
                max_backoff: Duration::from_secs(30),
                probes: 1,
                probe_timeout: Duration::from_secs(1),
            },
        }
    }
}

/// Configures a [`CircuitBreaker`]; made by [`CircuitBreaker::builder`], which shows every
/// setting.
#[must_use]
pub struct CircuitBreakerBuilder<S, C = MonotonicClock> {
    store: S,
    clock: C,
    settings: Settings,
}

impl<S: fmt::Debug, C> fmt::Debug for CircuitBreakerBuilder<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerBuilder")
            .field("store", &self.store)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<S, C> CircuitBreakerBuilder<S, C> {
    /// Opens after `n` consecutive failures (default 3; at least 1, or
    /// [`build`](Self::build) refuses it).
    ///
    /// See the example on [`CircuitBreaker::builder`].
    pub fn failure_threshold(mut self, n: u32) -> Self {
        self.settings.consecutive = n;
        self
    }

    /// Also opens when, within a `window`, at least `min_calls` calls were made and at least
    /// `ratio` of them failed (default: 0.5 of at least 20 calls in 10 s). `ratio` is from 0
    /// to 1, `window` above zero and `min_calls` at least 1, or [`build`](Self::build)
    /// refuses them; [`without_failure_rate`](Self::without_failure_rate) turns the rule off.
    ///
    /// See the example on [`CircuitBreaker::builder`].
    pub fn failure_rate(mut self, ratio: f64, window: Duration, min_calls: u32) -> Self {
        self.settings.rate = Some(FailureRate {
            ratio,
            window,
            min_calls,
        });
        self
    }

    /// Opens on consecutive failures only, whatever their rate.
    ///
    /// ```
    /// let breaker = ratewarden_breaker::CircuitBreaker::builder(ratewarden_memory::MemoryStore::new())
    ///     .without_failure_rate()
    ///     .build()?;
    /// # let _ = breaker;
    /// # Ok::<(), ratewarden_breaker::ConfigError>(())
    /// ```
    pub fn without_failure_rate(mut self) -> Self {
        self.settings.rate = None;
        self
    }

    /// The first time open (`base`, default 1 s; at least 1 ms) and the longest (`max`,
    /// default 30 s; at least `base`), or [`build`](Self::build) refuses them; each failed
    /// probe doubles it. Every open period is shortened by up to a quarter at random.
    ///
    /// See the example on [`CircuitBreaker::builder`].
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.settings.base_backoff = base;
        self.settings.max_backoff = max;
        self
    }

    /// How many calls may probe the store at once when half-open (default 1; at least 1, or
    /// [`build`](Self::build) refuses it). A probe whose request is cancelled gives its place
    /// back.
    ///
    /// See the example on [`CircuitBreaker::builder`].
    pub fn probes(mut self, n: u32) -> Self {
        self.settings.probes = n;
        self
    }

    /// How long a probe may take before it counts as failed (default 1 s; at least 1 ms, or
    /// [`build`](Self::build) refuses it: zero would fail every probe as soon as another call
    /// came): past it, the next call opens the breaker again (for twice the backoff),
    /// whatever became of the probe, so that a store that never answers (one without a
    /// deadline of its own) cannot hold the breaker half-open. Keep it at or above the
    /// store's own deadline (`RedisConfig::timeout`): a probe the store may still answer in
    /// time would otherwise count as failed whenever another call comes while it runs.
    ///
    /// ```
    /// use std::time::Duration;
    /// let breaker = ratewarden_breaker::CircuitBreaker::builder(ratewarden_memory::MemoryStore::new())
    ///     .probe_timeout(Duration::from_millis(500))
    ///     .build()?;
    /// # let _ = breaker;
    /// # Ok::<(), ratewarden_breaker::ConfigError>(())
    /// ```
    pub fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.settings.probe_timeout = timeout;
        self
    }

    /// The name in the breaker's log events and metrics labels (default `"store"`).
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.settings.name = name.into();
        self
    }

    /// Reads time from `clock` (a [`ManualClock`](ratewarden_core::ManualClock) in tests).
    ///
    /// ```
    /// use ratewarden_core::{ManualClock, Timestamp};
    /// let clock = ManualClock::new(Timestamp::from_nanos(0));
    /// let breaker = ratewarden_breaker::CircuitBreaker::builder(ratewarden_memory::MemoryStore::new())
    ///     .clock(clock.clone())
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(breaker.state(), ratewarden_breaker::BreakerState::Closed);
    /// ```
    pub fn clock<C2: Clock>(self, clock: C2) -> CircuitBreakerBuilder<S, C2> {
        CircuitBreakerBuilder {
            store: self.store,
            clock,
            settings: self.settings,
        }
    }

    /// The breaker, closed.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming the first setting that cannot work: a threshold or
    /// number of probes of 0, a failure ratio outside 0 to 1 (or not a number), a rate window
    /// of zero or a minimum of 0 calls, a base backoff or probe timeout under 1 ms, a longest
    /// backoff under the base. Never clamped: a value that cannot work is refused, not
    /// changed into another.
    ///
    /// ```
    /// use ratewarden_breaker::{CircuitBreaker, ConfigError};
    /// let zero = CircuitBreaker::builder(ratewarden_memory::MemoryStore::new())
    ///     .failure_threshold(0)
    ///     .build();
    /// assert!(matches!(zero, Err(ConfigError::Invalid { setting: "failure_threshold", .. })));
    /// ```
    pub fn build(self) -> Result<CircuitBreaker<S, C>, ConfigError> {
        self.settings.check()?;
        Ok(self.build_valid())
    }

    /// The breaker, from settings known to be valid.
    fn build_valid(self) -> CircuitBreaker<S, C> {
        let machine = Mutex::new(Machine::new(self.settings.base_backoff));
        CircuitBreaker {
            inner: Arc::new(Inner {
                store: self.store,
                clock: self.clock,
                settings: self.settings,
                machine,
                #[cfg(test)]
                transitions: std::sync::Mutex::default(),
            }),
        }
    }
}

impl Settings {
    /// The first setting that cannot work, if any.
    fn check(&self) -> Result<(), ConfigError> {
        let invalid = |setting, reason| Err(ConfigError::Invalid { setting, reason });
        if self.consecutive == 0 {
            return invalid("failure_threshold", "0 failures would open it without any");
        }
        if let Some(rate) = self.rate {
            if !(0.0..=1.0).contains(&rate.ratio) {
                return invalid("failure_rate", "the ratio must be from 0 to 1");
            }
            if rate.window.is_zero() {
                return invalid("failure_rate", "the window must be above zero");
            }
            if rate.min_calls == 0 {
                return invalid(
                    "failure_rate",
                    "at least 1 call must be made to judge a rate",
                );
            }
        }
        if self.base_backoff < Duration::from_millis(1) {
            return invalid("backoff", "the base must be at least 1 ms");
        }
        if self.max_backoff < self.base_backoff {
            return invalid("backoff", "the longest must be at least the base");
        }
        if self.probes == 0 {
            return invalid("probes", "0 probes would never close it");
        }
        if self.probe_timeout < Duration::from_millis(1) {
            return invalid(
                "probe_timeout",
                "at least 1 ms: a shorter one fails every probe another call comes during",
            );
        }
        Ok(())
    }
}

/// A [`CircuitBreakerBuilder`] setting that cannot work: [`build`](CircuitBreakerBuilder::build)
/// refuses it rather than changing it into another.
///
/// ```
/// let error = ratewarden_breaker::ConfigError::Invalid { setting: "probes", reason: "0 probes would never close it" };
/// assert_eq!(error.to_string(), "invalid probes: 0 probes would never close it");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The setting named cannot work, for the reason given.
    Invalid {
        /// The builder method.
        setting: &'static str,
        /// Why.
        reason: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid { setting, reason } => write!(f, "invalid {setting}: {reason}"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl<S, C> CircuitBreaker<S, C> {
    /// The store behind the breaker.
    ///
    /// ```
    /// let breaker = ratewarden_breaker::CircuitBreaker::new(ratewarden_memory::MemoryStore::new());
    /// assert!(breaker.get_ref().is_empty());
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner.store
    }

    fn lock(&self) -> MutexGuard<'_, Machine> {
        // The machine is consistent after every statement: a panic elsewhere cannot leave it
        // half-updated, so a poisoned lock is still good.
        self.inner
            .machine
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl<S, C: Clock> CircuitBreaker<S, C> {
    /// The state now: for a readiness endpoint. `Open` turns `HalfOpen` once its backoff has
    /// passed (the next call will probe).
    ///
    /// ```
    /// use ratewarden_breaker::{BreakerState, CircuitBreaker};
    /// let breaker = CircuitBreaker::new(ratewarden_memory::MemoryStore::new());
    /// assert_eq!(breaker.state(), BreakerState::Closed);
    /// ```
    pub fn state(&self) -> BreakerState {
        let now = self.inner.clock.now();
        match self.lock().phase {
            Phase::Closed => BreakerState::Closed,
            Phase::Open { until } if now < until => BreakerState::Open,
            Phase::Open { .. } | Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    fn admit(&self) -> Result<Permit<'_, S, C>, StoreError> {
        let now = self.inner.clock.now();
        let (role, transition) = self.lock().admit(now, &self.inner.settings);
        if let Some(transition) = transition {
            self.report(transition, None);
        }
        match role {
            Some(role) => Ok(Permit {
                breaker: self,
                role,
                done: false,
            }),
            None => Err(StoreError::new(StoreErrorKind::CircuitOpen)),
        }
    }

    fn report(&self, transition: Transition, error: Option<&StoreError>) {
        let name = &*self.inner.settings.name;
        let to = transition.to();
        #[cfg(test)]
        self.inner
            .transitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(to);
        #[cfg(feature = "tracing")]
        match transition {
            Transition::Opened { backoff, after } => tracing::warn!(
                breaker = name,
                ?after,
                backoff_ms = backoff.as_millis() as u64,
                error = error.map(tracing::field::display),
                "circuit breaker opened: the store is not asked until the backoff has passed"
            ),
            Transition::HalfOpened => {
                tracing::info!(
                    breaker = name,
                    "circuit breaker half-open: probing the store"
                );
            }
            Transition::Closed => {
                tracing::info!(
                    breaker = name,
                    "circuit breaker closed: the store answers again"
                );
            }
        }
        #[cfg(not(feature = "tracing"))]
        let _ = error;
        #[cfg(feature = "metrics")]
        {
            metrics::counter!("ratewarden_breaker_transitions_total", "breaker" => name.to_owned(), "to" => to.as_str())
                .increment(1);
            let level = match to {
                BreakerState::Closed => 0.0,
                BreakerState::HalfOpen => 1.0,
                BreakerState::Open => 2.0,
            };
            metrics::gauge!("ratewarden_breaker_state", "breaker" => name.to_owned()).set(level);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (name, to);
    }

    async fn guarded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let mut permit = self.admit()?;
        let result = call.await;
        permit.finish(result.as_ref().err());
        result
    }
}

impl<S: Store, C: Clock> Store for CircuitBreaker<S, C> {
    async fn check(&self, key: &Key, quota: &Quota, cost: u32) -> Result<Decision, StoreError> {
        self.guarded(self.inner.store.check(key, quota, cost)).await
    }

    /// The store's, as one call: it fails or succeeds once, whatever the number of limits
    /// (an `Unsupported` or `InvalidInput` answer is no backend failure).
    async fn check_all(&self, limits: &[Limit]) -> Result<Decisions, StoreError> {
        self.guarded(self.inner.store.check_all(limits)).await
    }

    /// What the store can decide without I/O (a denial it remembers, say) it still decides,
    /// open or not, and that counts neither way; otherwise, while open, fails at once without
    /// locking anything for long or allocating: the path every request takes while the store
    /// is down.
    fn check_ready(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
    ) -> Option<Result<Decision, StoreError>> {
        if let Some(result) = self.inner.store.check_ready(key, quota, cost) {
            return Some(result);
        }
        let now = self.inner.clock.now();
        self.lock()
            .rejects(now, &self.inner.settings)
            .then(|| Err(StoreError::new(StoreErrorKind::CircuitOpen)))
    }

    /// As [`check_ready`](Self::check_ready), for several limits.
    fn check_all_ready(&self, limits: &[Limit]) -> Option<Result<Decisions, StoreError>> {
        if let Some(result) = self.inner.store.check_all_ready(limits) {
            return Some(result);
        }
        let now = self.inner.clock.now();
        self.lock()
            .rejects(now, &self.inner.settings)
            .then(|| Err(StoreError::new(StoreErrorKind::CircuitOpen)))
    }

    async fn reserve(&self, limits: &[Limit], hold: Duration) -> Result<Reservation, StoreError> {
        self.guarded(self.inner.store.reserve(limits, hold)).await
    }

    /// Through the breaker like any call: while it is open, a settle fails at once, and the
    /// reservation's holds lapse after their hold time.
    async fn settle(&self, reservation: Reservation, actual: u32) -> Result<(), StoreError> {
        self.guarded(self.inner.store.settle(reservation, actual))
            .await
    }

    /// The store's: a settle it makes without I/O (the memory store's) is never refused.
    fn settle_ready(
        &self,
        reservation: Reservation,
        actual: u32,
    ) -> Result<Result<(), StoreError>, Reservation> {
        self.inner.store.settle_ready(reservation, actual)
    }

    async fn give_back(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
        ago: Duration,
        fresh_in: Duration,
    ) -> Result<(), StoreError> {
        self.guarded(self.inner.store.give_back(key, quota, cost, ago, fresh_in))
            .await
    }

    async fn renew(&self, held: &[(Limit, u64)], hold: Duration) -> Result<(), StoreError> {
        self.guarded(self.inner.store.renew(held, hold)).await
    }

    async fn refund(&self, key: &Key, quota: &Quota, units: u32) -> Result<(), StoreError> {
        self.guarded(self.inner.store.refund(key, quota, units))
            .await
    }

    async fn peek(&self, key: &Key, quota: &Quota) -> Result<Decision, StoreError> {
        self.guarded(self.inner.store.peek(key, quota)).await
    }

    async fn reset(&self, key: &Key, quota: &Quota) -> Result<(), StoreError> {
        self.guarded(self.inner.store.reset(key, quota)).await
    }
}

/// A call's right to ask the store; reports its outcome, or on drop (the request was
/// cancelled) gives a probe's place back.
struct Permit<'a, S, C: Clock> {
    breaker: &'a CircuitBreaker<S, C>,
    role: Role,
    done: bool,
}

impl<S, C: Clock> Permit<'_, S, C> {
    fn finish(&mut self, error: Option<&StoreError>) {
        // A probe answered with an error about its own request (a corrupt key, several limits
        // a store cannot decide together) says nothing of the store's health: its place goes
        // back, as a cancelled probe's does, and the next call probes.
        if let (Some(error), Role::Probe(_)) = (error, self.role)
            && !error.is_backend_failure()
        {
            return;
        }
        self.done = true;
        let failed = error.is_some_and(StoreError::is_backend_failure);
        #[cfg(feature = "metrics")]
        if let Some(error) = error.filter(|e| e.is_backend_failure()) {
            // Why the store fails, by kind: what an operator reads first.
            let breaker = self.breaker.inner.settings.name.to_string();
            metrics::counter!("ratewarden_store_failures_total", "breaker" => breaker, "kind" => error.kind().as_str())
                .increment(1);
        }
        let now = self.breaker.inner.clock.now();
        let transition =
            self.breaker
                .lock()
                .record(now, self.role, failed, &self.breaker.inner.settings);
        if let Some(transition) = transition {
            self.breaker.report(transition, error);
        }
    }
}

impl<S, C: Clock> Drop for Permit<'_, S, C> {
    fn drop(&mut self) {
        if let (false, Role::Probe(period)) = (self.done, self.role) {
            self.breaker.lock().cancel_probe(period);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// A call made while closed.
    Normal,
    /// A call made while half-open (in the half-open period numbered so), whose outcome
    /// closes or reopens the breaker.
    Probe(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Closed,
    Open {
        until: Timestamp,
    },
    /// Probing: `probing` probes out, in the half-open period `period`, begun `since`.
    HalfOpen {
        probing: u32,
        period: u64,
        since: Timestamp,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transition {
    Opened { backoff: Duration, after: Cause },
    HalfOpened,
    Closed,
}

impl Transition {
    const fn to(self) -> BreakerState {
        match self {
            Self::Opened { .. } => BreakerState::Open,
            Self::HalfOpened => BreakerState::HalfOpen,
            Self::Closed => BreakerState::Closed,
        }
    }
}

/// Why the breaker opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    ConsecutiveFailures(u32),
    FailureRate { failures: u32, calls: u32 },
    ProbeFailed,
    ProbeTimedOut,
}

/// The breaker's state machine: pure, driven by the times it is given.
#[derive(Debug)]
struct Machine {
    phase: Phase,
    /// Consecutive failures while closed.
    consecutive: u32,
    window_start: Timestamp,
    calls: u32,
    failures: u32,
    /// The next open period, before jitter.
    backoff: Duration,
    /// How many half-open periods there were: a probe's news counts only in its own.
    periods: u64,
}

impl Machine {
    const fn new(base: Duration) -> Self {
        Self {
            phase: Phase::Closed,
            consecutive: 0,
            window_start: Timestamp::from_nanos(0),
            calls: 0,
            failures: 0,
            backoff: base,
            periods: 0,
        }
    }

    /// Whether a call at `now` would be refused (no state change; a probe timing out is left
    /// to [`admit`](Self::admit)).
    fn rejects(&self, now: Timestamp, settings: &Settings) -> bool {
        match self.phase {
            Phase::Closed => false,
            Phase::Open { until } => now < until,
            Phase::HalfOpen { probing, since, .. } => {
                probing >= settings.probes && !timed_out(since, now, settings)
            }
        }
    }

    /// May a call at `now` ask the store, and in which role?
    fn admit(&mut self, now: Timestamp, settings: &Settings) -> (Option<Role>, Option<Transition>) {
        match self.phase {
            Phase::Closed => (Some(Role::Normal), None),
            Phase::Open { until } if now < until => (None, None),
            Phase::Open { .. } => {
                self.periods += 1;
                self.phase = Phase::HalfOpen {
                    probing: 1,
                    period: self.periods,
                    since: now,
                };
                (
                    Some(Role::Probe(self.periods)),
                    Some(Transition::HalfOpened),
                )
            }
            Phase::HalfOpen {
                probing,
                period,
                since,
            } if probing < settings.probes => {
                // With no probe out (each gave its place back), the probes' time starts anew:
                // a probe is timed from when it went, not from an earlier one's.
                self.phase = Phase::HalfOpen {
                    probing: probing + 1,
                    period,
                    since: if probing == 0 { now } else { since },
                };
                (Some(Role::Probe(period)), None)
            }
            Phase::HalfOpen { since, .. } if timed_out(since, now, settings) => {
                // The probes have had their time: they count as failed, whatever becomes of
                // them (their news will be stale).
                let backoff = self.backoff.saturating_mul(2).min(settings.max_backoff);
                (None, Some(self.open(now, backoff, Cause::ProbeTimedOut)))
            }
            Phase::HalfOpen { .. } => (None, None),
        }
    }

    fn record(
        &mut self,
        now: Timestamp,
        role: Role,
        failed: bool,
        settings: &Settings,
    ) -> Option<Transition> {
        match (role, self.phase) {
            (Role::Probe(of), Phase::HalfOpen { period, .. }) if of == period && failed => {
                let backoff = self.backoff.saturating_mul(2).min(settings.max_backoff);
                Some(self.open(now, backoff, Cause::ProbeFailed))
            }
            (Role::Probe(of), Phase::HalfOpen { period, .. }) if of == period => {
                *self = Self {
                    periods: self.periods,
                    ..Self::new(settings.base_backoff)
                };
                Some(Transition::Closed)
            }
            (Role::Normal, Phase::Closed) => self.count(now, failed, settings),
            // A call that began before the breaker moved on: its news is stale.
            _ => None,
        }
    }

    fn count(&mut self, now: Timestamp, failed: bool, settings: &Settings) -> Option<Transition> {
        if let Some(rate) = settings.rate {
            let elapsed = now.as_nanos().saturating_sub(self.window_start.as_nanos());
            if u128::from(elapsed) >= rate.window.as_nanos() {
                (self.window_start, self.calls, self.failures) = (now, 0, 0);
            }
        }
        self.calls = self.calls.saturating_add(1);
        if !failed {
            self.consecutive = 0;
            return None;
        }
        self.failures = self.failures.saturating_add(1);
        self.consecutive = self.consecutive.saturating_add(1);
        let cause = if self.consecutive >= settings.consecutive {
            Cause::ConsecutiveFailures(self.consecutive)
        } else {
            let over_rate = settings.rate.is_some_and(|rate| {
                self.calls >= rate.min_calls
                    && f64::from(self.failures) >= rate.ratio * f64::from(self.calls)
            });
            if !over_rate {
                return None;
            }
            Cause::FailureRate {
                failures: self.failures,
                calls: self.calls,
            }
        };
        Some(self.open(now, settings.base_backoff, cause))
    }

    fn open(&mut self, now: Timestamp, backoff: Duration, after: Cause) -> Transition {
        // Up to a quarter shorter at random, so gateways that failed together probe apart.
        let jittered = backoff.mul_f64(1.0 - fastrand::f64() / 4.0);
        self.phase = Phase::Open {
            until: now.saturating_add(jittered),
        };
        self.backoff = backoff;
        self.consecutive = 0;
        Transition::Opened { backoff, after }
    }

    /// A probe of half-open period `of` was cancelled: its place is given back, if that
    /// period is still on.
    fn cancel_probe(&mut self, of: u64) {
        if let Phase::HalfOpen {
            probing,
            period,
            since,
        } = self.phase
            && period == of
        {
            self.phase = Phase::HalfOpen {
                probing: probing.saturating_sub(1),
                period,
                since,
            };
        }
    }
}

/// Whether probes sent `since` have had their time at `now`.
fn timed_out(since: Timestamp, now: Timestamp, settings: &Settings) -> bool {
    u128::from(now.as_nanos().saturating_sub(since.as_nanos())) >= settings.probe_timeout.as_nanos()
}

#[cfg(test)]
mod tests;
