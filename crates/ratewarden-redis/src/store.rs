//! [`RedisStore`]: the [`Store`], and where each check goes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ratewarden_core::{
    Clock, Decision, Decisions, Info, Key, Limit, MonotonicClock, Quota, Reservation, Store,
    StoreError, StoreErrorKind, Timestamp,
};

use crate::batch::Batcher;
use crate::connection::Connection;
use crate::deny_cache::DenyCache;
use crate::hot_keys::HotKeyState;
use crate::lease::Leases;
use crate::script::{Call, Counter, Mode, Reply, figures, marker_key, state_key};
use crate::time::between;

mod reserve;
mod several;

/// A [`Store`] in Redis or Redis Cluster; see the [crate docs](crate). Clones share one
/// multiplexed connection (per cluster node), or one pool, and one local front.
#[derive(Clone)]
pub struct RedisStore {
    batcher: Batcher,
    prefix: Arc<str>,
    timeout: Duration,
    skew_warning: Duration,
    local: Arc<Local>,
}

/// What a gateway keeps in front of Redis, shared by a store's clones.
#[derive(Debug)]
pub(crate) struct Local {
    pub(crate) clock: MonotonicClock,
    pub(crate) deny: DenyCache,
    pub(crate) leases: Option<Leases>,
    pub(crate) hot: HotKeyState,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    pub(crate) fn new(
        connection: Connection,
        prefix: Arc<str>,
        timeout: Duration,
        skew_warning: Duration,
        local: Local,
    ) -> Self {
        Self {
            batcher: Batcher::new(connection),
            prefix,
            timeout,
            skew_warning,
            local: Arc::new(local),
        }
    }

    /// Connects to `url` with the default [`RedisConfig`](crate::RedisConfig).
    ///
    /// # Errors
    ///
    /// See [`RedisConfig::connect`](crate::RedisConfig::connect).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), ratewarden_core::StoreError> {
    /// let store = ratewarden_redis::RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// assert!(store.split_keys().is_empty());
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        crate::RedisConfig::new(url).connect().await
    }

    /// The name of the Redis key holding `key`'s state under `quota` (for inspection and
    /// tests): `PREFIX:{KIND KEY}:LIMIT`, at most 128 bytes (see the crate docs).
    ///
    /// ```no_run
    /// # async fn demo(store: ratewarden_redis::RedisStore) {
    /// let quota = ratewarden_core::Quota::per_second(1).unwrap();
    /// let name = store.state_key(&ratewarden_core::Key::from(7u64), &quota);
    /// assert!(name.starts_with(b"rl:{i7}:"));
    /// # }
    /// ```
    #[must_use]
    pub fn state_key(&self, key: &Key, quota: &Quota) -> Vec<u8> {
        state_key(&self.prefix, key, quota, Counter::Whole)
    }

    /// How far Redis's clock is ahead of this host's (negative: behind), in microseconds: the
    /// Redis `TIME` against the midpoint of this host's clock around the call. Logs a warning
    /// (with the `tracing` feature) when it exceeds the configured threshold (default 100 ms): decisions use
    /// Redis's clock only, but a skewed host misreads `X-RateLimit-Reset` and its own logs.
    ///
    /// # Errors
    ///
    /// When Redis does not answer `TIME`.
    ///
    /// ```no_run
    /// # async fn demo(store: ratewarden_redis::RedisStore) -> Result<(), ratewarden_core::StoreError> {
    /// let skew = store.measure_clock_skew().await?;
    /// println!("redis is {skew} µs ahead");
    /// # Ok(()) }
    /// ```
    pub async fn measure_clock_skew(&self) -> Result<i64, StoreError> {
        let local = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        };
        let before = local();
        let (secs, micros): (i64, i64) = self
            .within(self.batcher.connection().query(&redis::cmd("TIME")))
            .await?;
        let after = local();
        let redis = secs.saturating_mul(1_000_000).saturating_add(micros);
        let skew = redis.saturating_sub(before / 2 + after / 2);
        let threshold = i64::try_from(self.skew_warning.as_micros()).unwrap_or(i64::MAX);
        if skew.unsigned_abs() > threshold.unsigned_abs() {
            crate::log::clock_skew(skew, threshold);
        }
        Ok(skew)
    }

    /// The keys this gateway knows to be split now (by [`HotKeys`](crate::HotKeys)), with
    /// their numbers of parts: for a debug endpoint or a log line. Empty unless the store
    /// splits adaptively.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), ratewarden_core::StoreError> {
    /// let store = ratewarden_redis::RedisConfig::new("redis://127.0.0.1:1").build()?;
    /// assert!(store.split_keys().is_empty());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn split_keys(&self) -> Vec<(Key, u32)> {
        self.local.hot.split_keys(self.now())
    }

    /// [`Store::check`] at a given time (since the UNIX epoch; the scripts see its whole
    /// microseconds) instead of Redis's clock, on the key's own counter: for tests that
    /// compare the scripts with `ratewarden-core` step by step. The state written lives a
    /// day longer than its own TTL, as test time may run ahead of Redis's.
    ///
    /// # Errors
    ///
    /// As for [`Store::check`].
    ///
    /// ```no_run
    /// # async fn demo(store: ratewarden_redis::RedisStore) -> Result<(), ratewarden_core::StoreError> {
    /// use ratewarden_core::{Key, Quota, Timestamp};
    /// let quota = Quota::per_second(1).unwrap();
    /// let at = Timestamp::from_micros(1_700_000_000_000_000);
    /// assert!(store.check_at(&Key::from(7u64), &quota, 1, at).await?.is_allowed());
    /// assert!(!store.check_at(&Key::from(7u64), &quota, 1, at).await?.is_allowed());
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "test-util")]
    pub async fn check_at(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        let call = Call {
            quota,
            counter: Counter::Whole,
            mode: Mode::Check,
            cost,
            now: Some(now),
            marker: None,
            keep_for: Duration::ZERO,
        };
        match self.call(key, &call).await? {
            Reply::Decided { decision, .. } => Ok(decision),
            Reply::Split { .. } => Err(unexpected_split()),
        }
    }

    /// [`check_at`](Self::check_at) for several checks sent as one batch, decided in order (as
    /// checks that queue together are): for tests that compare batches with `ratewarden-core`.
    ///
    /// # Errors
    ///
    /// As for [`Store::check`], for the whole batch.
    ///
    /// ```no_run
    /// # async fn demo(store: ratewarden_redis::RedisStore) -> Result<(), ratewarden_core::StoreError> {
    /// use ratewarden_core::{Key, Quota, Timestamp};
    /// let (quota, at) = (Quota::per_second(1).unwrap(), Timestamp::from_micros(1_700_000_000_000_000));
    /// let checks = [(Key::from(7u64), quota, 1, at), (Key::from(7u64), quota, 1, at)];
    /// let decisions = store.check_batch_at(&checks).await?;
    /// assert!(decisions[0].is_allowed() && !decisions[1].is_allowed());
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "test-util")]
    pub async fn check_batch_at(
        &self,
        checks: &[(Key, Quota, u32, Timestamp)],
    ) -> Result<Vec<Decision>, StoreError> {
        let entries: Vec<_> = checks
            .iter()
            .map(|(key, quota, cost, now)| {
                let call = Call {
                    quota,
                    counter: Counter::Whole,
                    mode: Mode::Check,
                    cost: *cost,
                    now: Some(*now),
                    marker: None,
                    keep_for: Duration::ZERO,
                };
                call.entry(&self.prefix, key)
            })
            .collect();
        let entries: Vec<_> = entries.iter().collect();
        let replies = self
            .within(self.batcher.connection().eval_batch(&entries))
            .await?;
        (replies.iter().zip(checks))
            .map(|(reply, (_, quota, ..))| {
                match Reply::parse(&reply, figures(quota, Counter::Whole).1)? {
                    Reply::Decided { decision, .. } => Ok(decision),
                    Reply::Split { .. } => Err(unexpected_split()),
                }
            })
            .collect()
    }

    /// [`Store::check_all`] at `now` on Redis's side (each limit's time, as
    /// [`check_at`](Self::check_at) takes it): for tests that compare several limits with a
    /// model.
    ///
    /// # Errors
    ///
    /// As for [`Store::check_all`].
    ///
    /// ```no_run
    /// # async fn demo(store: ratewarden_redis::RedisStore) -> Result<(), ratewarden_core::StoreError> {
    /// use ratewarden_core::{Key, Limit, Quota, Timestamp};
    /// let at = Timestamp::from_micros(1_700_000_000_000_000);
    /// let limits = [Limit::new(Key::from(7u64), Quota::per_second(1).unwrap(), 1)];
    /// assert!(store.check_all_at(&limits, at).await?.is_allowed());
    /// assert!(!store.check_all_at(&limits, at).await?.is_allowed());
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "test-util")]
    pub async fn check_all_at(
        &self,
        limits: &[Limit],
        now: Timestamp,
    ) -> Result<Decisions, StoreError> {
        self.decide_all(limits, Some(now)).await
    }

    /// [`Store::reserve`] at `now` on Redis's side (as [`check_at`](Self::check_at) takes
    /// it): for tests that compare reservations with `ratewarden-core`'s `Ledger`.
    ///
    /// # Errors
    ///
    /// As for [`Store::reserve`].
    ///
    /// ```no_run
    /// # async fn demo(store: ratewarden_redis::RedisStore) -> Result<(), ratewarden_core::StoreError> {
    /// use ratewarden_core::{Key, Limit, Quota, Timestamp};
    /// use std::time::Duration;
    /// let at = Timestamp::from_micros(1_700_000_000_000_000);
    /// let limits = [Limit::new(Key::from(7u64), Quota::per_second(1).unwrap(), 1)];
    /// let reservation = store.reserve_at(&limits, Duration::from_secs(5), at).await?;
    /// store.settle_at(reservation, 1, at).await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "test-util")]
    pub async fn reserve_at(
        &self,
        limits: &[Limit],
        hold: Duration,
        now: Timestamp,
    ) -> Result<Reservation, StoreError> {
        self.reserve_on(limits, hold, Some(now)).await
    }

    /// [`Store::settle`] at `now` on Redis's side (see [`reserve_at`](Self::reserve_at)).
    ///
    /// # Errors
    ///
    /// As for [`Store::settle`].
    ///
    /// See [`reserve_at`](Self::reserve_at) for an example.
    #[cfg(feature = "test-util")]
    pub async fn settle_at(
        &self,
        reservation: Reservation,
        actual: u32,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.settle_on(reservation.held(), actual, Some(now)).await
    }

    /// This store with one queue for every key, as if every state's queue number (a hash of
    /// its name) were the same: for tests that two states sharing a queue are still decided
    /// in batches of their own (see the crate docs on batching).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), ratewarden_redis::ConfigError> {
    /// let store = ratewarden_redis::RedisConfig::new("redis://127.0.0.1:1").build()?;
    /// let shared = store.with_one_queue();
    /// assert!(shared.split_keys().is_empty());
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "test-util")]
    #[must_use]
    pub fn with_one_queue(mut self) -> Self {
        self.batcher = self.batcher.with_one_queue();
        self
    }

    /// `call`, failing with [`StoreErrorKind::Timeout`] past the deadline.
    async fn within<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(elapsed) => Err(StoreError::with_source(StoreErrorKind::Timeout, elapsed)),
        }
    }

    /// Runs a script within the deadline (see [`crate::batch::run`]), and reads its reply.
    async fn call(&self, key: &Key, call: &Call<'_>) -> Result<Reply, StoreError> {
        let eval = self.batcher.eval(&self.prefix, key, call);
        let limit = figures(call.quota, call.counter).1;
        let reply = Reply::parse(&Box::pin(eval).await?, limit)?;
        if let Reply::Decided { corrupt: true, .. } = reply {
            let name = state_key(&self.prefix, key, call.quota, call.counter);
            crate::log::corrupt_state(&name);
            #[cfg(feature = "metrics")]
            metrics::counter!("ratewarden_redis_corrupt_states_total").increment(1);
        }
        Ok(reply)
    }

    fn now(&self) -> Timestamp {
        self.local.clock.now()
    }

    /// The longest an adaptive split can still run when a gateway checks its key: its hold,
    /// and the margin after it (the deadline); `None` without adaptive hot keys.
    fn split_slack(&self) -> Option<Duration> {
        let hold = self.local.hot.config().hold_time()?;
        Some(hold.saturating_add(self.timeout))
    }

    /// A decision this gateway can make alone: from a lease, or a standing denial.
    fn decide_locally(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
        now: Timestamp,
    ) -> Option<Decision> {
        let leases = self.local.leases.as_ref();
        if let Some(leased) = leases.and_then(|l| l.spend(key, quota, cost, now)) {
            return Some(leased);
        }
        self.local.deny.get(key, quota, cost, now)
    }

    /// Asks Redis, in four steps: split the key first if it is hot here
    /// ([`split_if_hot`](Self::split_if_hot)); ask the counter it routes to, following a
    /// split another gateway made ([`ask`](Self::ask)); ask another part of a split if the
    /// one asked is spent ([`ask_another_part`](Self::ask_another_part)); and read the reply
    /// as the whole key's ([`as_decided`](Self::as_decided)).
    async fn decide(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
        mode: Mode,
    ) -> Result<(Decision, u32), StoreError> {
        if mode != Mode::Peek {
            self.split_if_hot(key, quota, cost).await?;
        }
        let (call, reply, counter) = self.ask(key, quota, cost, mode).await?;
        match self.ask_another_part(key, &call, reply, counter).await? {
            Ok((reply, counter)) => self.as_decided(key, quota, cost, reply, counter),
            Err(denied) => Ok((denied, 0)),
        }
    }

    /// Splits `key` (or renews its split) when this gateway counts it over the adaptive
    /// threshold; seeds the parts when this call made the split.
    async fn split_if_hot(&self, key: &Key, quota: &Quota, cost: u32) -> Result<(), StoreError> {
        let hot = &self.local.hot;
        let Some(ask) = hot.wants_split(key, quota, self.now()) else {
            return Ok(());
        };
        let split = Call {
            quota,
            counter: Counter::Whole,
            mode: Mode::Split {
                parts: ask.parts,
                hold: ask.hold,
                // A part's check sent before the split ends may still run until its
                // deadline: the key itself waits that long more.
                margin: self.timeout,
            },
            cost,
            now: None,
            marker: self.split_slack(),
            keep_for: Duration::ZERO,
        };
        let sent = self.now();
        if let Reply::Split {
            parts,
            remaining,
            epoch,
            made,
        } = self.call(key, &split).await?
        {
            hot.learn(key, *quota, (parts, epoch), remaining, sent);
            // Only the gateway that made the split seeds it: another's seed of a split it
            // only renewed (nothing left) could land first, and a part takes one seed.
            if let Some(left) = made {
                self.seed(key, quota, (parts, epoch), left, remaining).await;
            }
        }
        Ok(())
    }

    /// Asks the counter `key` routes to (its own, or a part of a split known here); where
    /// Redis answers that another gateway split the key, learns of the split and asks one of
    /// its parts. The call made, the reply, and the counter that replied.
    async fn ask<'q>(
        &self,
        key: &Key,
        quota: &'q Quota,
        cost: u32,
        mode: Mode,
    ) -> Result<(Call<'q>, Reply, Counter), StoreError> {
        let hot = &self.local.hot;
        let route = hot.route(key, quota, self.now());
        let call = Call {
            quota,
            counter: route.counter,
            mode,
            cost,
            now: None,
            marker: (hot.config().adapts(quota) && route.counter == Counter::Whole)
                .then(|| self.split_slack())
                .flatten(),
            keep_for: route.keep_for,
        };
        let sent = self.now();
        let reply = self.call(key, &call).await?;
        let Reply::Split {
            parts,
            remaining,
            epoch,
            ..
        } = reply
        else {
            return Ok((call, reply, route.counter));
        };
        // Split by another gateway: learn of it, and ask one of its parts.
        hot.learn(key, *quota, (parts, epoch), remaining, sent);
        let counter = match hot.route(key, quota, self.now()).counter {
            // Not recorded (too many splits tracked): a part all the same.
            Counter::Whole => Counter::Part {
                index: fastrand::u32(0..parts),
                parts,
                epoch: Some(epoch),
            },
            part => part,
        };
        let elapsed = between(sent, self.now());
        let part = Call {
            counter,
            marker: None,
            keep_for: remaining.saturating_sub(elapsed),
            ..call
        };
        Ok((call, self.call(key, &part).await?, counter))
    }

    /// A part of an adaptive split denied: it is spent for a while; another part may not be,
    /// so it is asked at once (one more round trip, at most). The reply to use and its
    /// counter, or (`Err`) the denial of the whole key until a part may have room.
    async fn ask_another_part(
        &self,
        key: &Key,
        call: &Call<'_>,
        mut reply: Reply,
        mut counter: Counter,
    ) -> Result<Result<(Reply, Counter), Decision>, StoreError> {
        let (hot, quota) = (&self.local.hot, call.quota);
        let (mut retried, mut reseeded) = (false, false);
        while let (
            Reply::Decided {
                decision: Decision::Denied(info),
                unseeded,
                ..
            },
            Counter::Part {
                index,
                epoch: Some(_),
                ..
            },
        ) = (reply, counter)
        {
            let now = self.now();
            // A part its seed never reached (the splitting gateway's seed failed, or its
            // reply came too late to seed): once the seed has had its time, started with
            // nothing left, refilling from the split's start, and asked again.
            if unseeded
                && !reseeded
                && call.mode != Mode::Peek
                && hot.learnt_before(key, quota, now, self.timeout.saturating_mul(2))
            {
                reseeded = true;
                self.seed_part(key, call, counter).await?;
                reply = self
                    .call(
                        key,
                        &Call {
                            counter,
                            marker: None,
                            ..*call
                        },
                    )
                    .await?;
                continue;
            }
            let room_at = now.saturating_add(info.retry_after());
            let other = hot.spent(key, quota, (index, room_at), now);
            let Some(route) = other.filter(|_| !retried) else {
                // Denied until a part may have room: no sooner, and no later.
                let room_at = hot.room_at(key, quota, now).unwrap_or(room_at);
                let retry = between(now, room_at).max(Duration::from_micros(1));
                let limit = u64::from(quota.burst());
                let denied = Info::new(limit, 0, info.reset_after(), retry);
                return Ok(Err(Decision::Denied(denied)));
            };
            retried = true;
            counter = route.counter;
            let part = Call {
                counter,
                marker: None,
                keep_for: route.keep_for,
                ..*call
            };
            reply = self.call(key, &part).await?;
        }
        Ok(Ok((reply, counter)))
    }

    /// `reply`, from `counter`, as the whole key's decision and the units it granted.
    fn as_decided(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
        reply: Reply,
        counter: Counter,
    ) -> Result<(Decision, u32), StoreError> {
        match reply {
            // Too heavy for a part of an adaptive split, not for the whole quota: denied
            // until the key is whole again (its split over, and the margin after it), never
            // refused as a cost no retry could meet.
            Reply::Decided {
                decision: Decision::InsufficientCapacity(info),
                ..
            } if matches!(counter, Counter::Part { epoch: Some(_), .. })
                && cost <= quota.burst() =>
            {
                let now = self.now();
                let whole_at = (self.local.hot.known_until(key, quota, now))
                    .unwrap_or(now)
                    .saturating_add(self.timeout);
                let retry = between(now, whole_at).max(Duration::from_micros(1));
                let limit = u64::from(quota.burst());
                let denied = Info::new(limit, 0, info.reset_after(), retry);
                Ok((Decision::Denied(denied), 0))
            }
            Reply::Decided {
                decision, granted, ..
            } => Ok((as_whole(decision, quota, counter), granted)),
            Reply::Split { .. } => Err(unexpected_split()),
        }
    }
}

impl RedisStore {
    /// Starts `counter`, a part of an adaptive split, with nothing left at the split's epoch,
    /// if it has no state yet.
    async fn seed_part(
        &self,
        key: &Key,
        call: &Call<'_>,
        counter: Counter,
    ) -> Result<(), StoreError> {
        let Counter::Part {
            epoch: Some(epoch), ..
        } = counter
        else {
            return Ok(());
        };
        let seed = Call {
            counter,
            mode: Mode::Seed {
                units: 0,
                at: epoch,
            },
            cost: 0,
            marker: None,
            ..*call
        };
        self.call(key, &seed).await.map(drop)
    }

    /// Starts the parts of a split this gateway just made, each with its share of the
    /// `left` units the key had (the first `left % parts` one more), kept for the split's `remaining` time: so that
    /// they refill from the split's start, and hand out no more than the key had left. A
    /// part checked before its seed lands is denied (with no retry time) and left unwritten,
    /// so the seed still lands; a part whose seed never comes (the call failed, or this
    /// gateway's reply came too late to seed) is started with nothing left, refilling from the
    /// split's start, by the first gateway that finds it unseeded twice the deadline after it
    /// learnt of the split (under-admission, never over).
    async fn seed(
        &self,
        key: &Key,
        quota: &Quota,
        (parts, epoch): (u32, Timestamp),
        left: u64,
        remaining: Duration,
    ) {
        let (share, rest) = (
            left / u64::from(parts.max(1)),
            left % u64::from(parts.max(1)),
        );
        let calls = (0..parts).map(|index| async move {
            // The remainder to the first parts: between them, exactly what the key had left.
            let units = share + u64::from(u64::from(index) < rest);
            let call = Call {
                quota,
                counter: Counter::Part {
                    index,
                    parts,
                    epoch: Some(epoch),
                },
                mode: Mode::Seed { units, at: epoch },
                cost: 0,
                now: None,
                marker: None,
                keep_for: remaining,
            };
            self.call(key, &call).await
        });
        for result in futures_util::future::join_all(calls).await {
            if let Err(error) = result {
                crate::log::part_not_started(&error);
            }
        }
    }
}

/// A part's decision as the whole key's: its limit, and its remaining as a share of the whole.
fn as_whole(decision: Decision, quota: &Quota, counter: Counter) -> Decision {
    let Counter::Part { parts, .. } = counter else {
        return decision;
    };
    let info = decision.info();
    let limit = u64::from(quota.burst());
    let whole = Info::new(
        limit,
        info.remaining().saturating_mul(u64::from(parts)).min(limit),
        info.reset_after(),
        info.retry_after(),
    );
    match decision {
        Decision::Allowed(_) => Decision::Allowed(whole),
        Decision::Denied(_) => Decision::Denied(whole),
        Decision::InsufficientCapacity(_) => Decision::InsufficientCapacity(whole),
    }
}

fn unexpected_split() -> StoreError {
    StoreError::with_source(
        StoreErrorKind::Script,
        "a split reply where a decision was expected",
    )
}

impl Store for RedisStore {
    /// Answers without Redis when this gateway holds a lease for the key, or a denial of it
    /// that still stands.
    fn check_ready(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
    ) -> Option<Result<Decision, StoreError>> {
        if self.local.deny.is_off() && self.local.leases.is_none() {
            return None;
        }
        self.decide_locally(key, quota, cost, self.now()).map(Ok)
    }

    async fn check(&self, key: &Key, quota: &Quota, cost: u32) -> Result<Decision, StoreError> {
        let now = self.now();
        if let Some(decision) = self.decide_locally(key, quota, cost, now) {
            return Ok(decision);
        }
        // (A deadline past a day is no deadline: a lease ask holds its place a day at most.)
        let deadline = now.saturating_add(self.timeout.min(Duration::from_secs(86_400)));
        let leasing = (self.local.leases.as_ref()).and_then(|leases| {
            Some((leases, leases.batch_for(key, quota, cost, (now, deadline))?))
        });
        let mode = match leasing {
            Some((_, (batch, _))) => Mode::Lease { batch },
            None => Mode::Check,
        };
        let decided = self.decide(key, quota, cost, mode).await;
        if let Some((leases, (_, ask))) = leasing {
            // From before the call: Redis granted the lease after `now`, and its reply may be
            // read any time later (a future held before it is polled).
            let (granted, limit) = match &decided {
                Ok((Decision::Allowed(info), granted)) => (*granted, info.limit()),
                _ => (0, 0),
            };
            leases.granted(key, quota, (granted, cost), (limit, ask), now);
        }
        let (decision, granted) = decided?;
        match &decision {
            Decision::Allowed(info) if granted > cost => {
                let held = u64::from(granted - cost);
                return Ok(Decision::Allowed(Info::new(
                    info.limit(),
                    info.remaining() + held,
                    info.reset_after(),
                    Duration::ZERO,
                )));
            }
            Decision::Denied(info) => {
                // For a split key, whichever part denied: the denial covers the whole key.
                self.local.deny.insert(key, *quota, cost, info, self.now());
            }
            _ => {}
        }
        Ok(decision)
    }

    /// Every limit decided in Redis together: one script call for the limits of one cluster
    /// slot (all of them on a single server), calls to several slots in parallel. Limits on
    /// one key and quota count as one, their costs summed. A request denied by one slot's
    /// limit is refunded where another slot counted it before the answer returns (a second
    /// round trip for such a denial); while the calls are in flight other requests may see
    /// less room than there is (never more), and a refund that fails leaves the units counted
    /// until they refill. The calls and the refund run in a task of their own: a caller that
    /// stops waiting never leaves a slot counted for a denied request. A state reset (or
    /// evicted) between its charge and the refund, within that round trip, is refunded all
    /// the same: the request's units, once. A limit counts on the counter a single check of
    /// its key would (a part of a split key); one state alone is a single check (leases, the
    /// cache of denials), several always go to Redis.
    async fn check_all(&self, limits: &[Limit]) -> Result<Decisions, StoreError> {
        self.decide_all(limits, None).await
    }

    /// Holds each counted limit in its ledger in Redis (see [`Store::reserve`]): one script
    /// call per cluster slot. Each hold is a field of its own with its own lapse time, so the
    /// holds of a gateway that crashed are free again after `hold`, whatever other gateways
    /// do meanwhile. Reserved states are never leased, cached as denied or split. At most
    /// 1,000 holds live on one key: a reservation beyond them is denied.
    async fn reserve(&self, limits: &[Limit], hold: Duration) -> Result<Reservation, StoreError> {
        self.reserve_on(limits, hold, None).await
    }

    async fn settle(&self, reservation: Reservation, actual: u32) -> Result<(), StoreError> {
        if reservation.held().is_empty() {
            return Ok(());
        }
        self.settle_on(reservation.held(), actual, None).await
    }

    async fn renew(&self, held: &[(Limit, u64)], hold: Duration) -> Result<(), StoreError> {
        self.renew_on(held, hold, None).await
    }

    async fn refund(&self, key: &Key, quota: &Quota, units: u32) -> Result<(), StoreError> {
        self.refund_on(key, quota, units, None).await
    }

    async fn peek(&self, key: &Key, quota: &Quota) -> Result<Decision, StoreError> {
        Ok(self.decide(key, quota, 1, Mode::Peek).await?.0)
    }

    /// Deletes the key's counter, its split and every part of it this gateway knows of, and
    /// forgets this gateway's lease and denials of it. Other gateways' denials stand until
    /// their retry time.
    async fn reset(&self, key: &Key, quota: &Quota) -> Result<(), StoreError> {
        self.local.deny.remove(key);
        if let Some(leases) = &self.local.leases {
            leases.remove(key);
        }
        let whole = state_key(&self.prefix, key, quota, Counter::Whole);
        let mut del = redis::cmd("DEL");
        del.arg(&whole).arg(marker_key(&whole));
        let mut deletes = vec![del];
        let parts = self.local.hot.config().parts();
        let static_parts = (0..parts).filter(|_| parts > 1).map(|index| Counter::Part {
            index,
            parts,
            epoch: None,
        });
        let known = self
            .local
            .hot
            .forget(key)
            .into_iter()
            .filter(|(q, ..)| q == quota)
            .flat_map(|(_, parts, epoch)| {
                (0..parts).map(move |index| Counter::Part {
                    index,
                    parts,
                    epoch: Some(epoch),
                })
            });
        for counter in static_parts.chain(known) {
            let mut del = redis::cmd("DEL");
            del.arg(state_key(&self.prefix, key, quota, counter));
            deletes.push(del);
        }
        // One DEL per slot: in a cluster the parts live on different nodes.
        for del in &deletes {
            self.within(self.batcher.connection().query::<()>(del))
                .await?;
        }
        Ok(())
    }
}
