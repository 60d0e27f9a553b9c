//! [`RedisStore`] and its configuration.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, ServerErrorKind};
use rl_core::{
    Clock, Decision, Info, Key, MonotonicClock, Quota, Store, StoreError, StoreErrorKind,
};

use crate::deny_cache::DenyCache;
use crate::error::classify;
use crate::hot_keys::{HotKeyState, HotKeys};
use crate::lease::{LeasePolicy, Leases};
use crate::script::{Call, Lua, script, state_key};

/// How to reach Redis. Every timeout is explicit; the defaults are small so that a hung Redis
/// never holds a request for long.
///
/// ```
/// use rl_store_redis::RedisConfig;
/// use std::time::Duration;
///
/// let config = RedisConfig::new("redis://127.0.0.1:6379")
///     .prefix("api-limits")
///     .timeout(Duration::from_millis(20));
/// # drop(config);
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct RedisConfig {
    url: String,
    cluster: Option<Vec<String>>,
    pool: Option<usize>,
    prefix: String,
    connect_timeout: Duration,
    timeout: Duration,
    skew_warning: Duration,
    deny_cache: usize,
    lease: Option<LeasePolicy>,
    hot_keys: HotKeys,
}

impl RedisConfig {
    /// Redis at `url` (`redis://host:port/db`), key prefix `rl`, a deadline of 50 ms per call,
    /// connect timeout 1 s.
    ///
    /// ```
    /// let config = rl_store_redis::RedisConfig::new("redis://127.0.0.1:6379");
    /// # drop(config);
    /// ```
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            cluster: None,
            pool: None,
            prefix: "rl".to_owned(),
            connect_timeout: Duration::from_secs(1),
            timeout: DEFAULT_TIMEOUT,
            deny_cache: DEFAULT_DENY_CACHE,
            lease: None,
            hot_keys: HotKeys::default(),
            skew_warning: Duration::from_millis(100),
        }
    }

    /// A Redis Cluster, reached through any of `nodes` (`redis://host:port` each). Every key's
    /// state lives on the node owning its hash tag; `MOVED` and `ASK` redirections and failovers
    /// are followed by the client.
    ///
    /// ```
    /// let config = rl_store_redis::RedisConfig::cluster([
    ///     "redis://10.0.0.1:7000",
    ///     "redis://10.0.0.2:7000",
    /// ]);
    /// # drop(config);
    /// ```
    pub fn cluster<I: IntoIterator<Item = S>, S: Into<String>>(nodes: I) -> Self {
        let nodes: Vec<String> = nodes.into_iter().map(Into::into).collect();
        Self {
            cluster: Some(nodes.clone()),
            ..Self::new(nodes.first().cloned().unwrap_or_default())
        }
    }

    /// Use a `deadpool-redis` pool of up to `max_size` connections instead of the default single
    /// multiplexed connection. Measured here (BENCHMARKS.md), the multiplexed connection is
    /// faster: every checkout from the pool costs a round trip of its own (deadpool pings a
    /// connection before handing it out). A pool isolates slow scripts from one another, and
    /// its checkouts count against the call's [deadline](Self::timeout); creating and recycling a connection at
    /// most the connect timeout.
    ///
    /// ```
    /// let config = rl_store_redis::RedisConfig::new("redis://127.0.0.1:6379").pool(16);
    /// # drop(config);
    /// ```
    pub const fn pool(mut self, max_size: usize) -> Self {
        self.pool = Some(max_size);
        self
    }

    /// The prefix of every key (default `rl`): 1 to 64 bytes without `{`, `}` or whitespace.
    ///
    /// ```
    /// let config = rl_store_redis::RedisConfig::new("redis://127.0.0.1").prefix("tenant-a");
    /// # drop(config);
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one attempt to open a connection may take (default 1 s). A call never waits
    /// past its [deadline](Self::timeout) for it: the attempt goes on for the calls after.
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = rl_store_redis::RedisConfig::new("redis://127.0.0.1")
    ///     .connect_timeout(Duration::from_millis(250));
    /// # drop(config);
    /// ```
    pub const fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The deadline of every call, from its start to its decision (default 50 ms): waiting for a
    /// pooled connection, reconnecting, reloading a flushed script and the round trip all count.
    /// Past it, the call fails with [`StoreErrorKind::Timeout`] and the layer's failure mode
    /// answers. Redis answers a healthy check in well under a millisecond; the deadline is for
    /// a Redis that is stopped, paused, busy or unreachable.
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = rl_store_redis::RedisConfig::new("redis://127.0.0.1")
    ///     .timeout(Duration::from_millis(20));
    /// # drop(config);
    /// ```
    pub const fn timeout(mut self, deadline: Duration) -> Self {
        self.timeout = deadline;
        self
    }

    /// How many denied keys this gateway remembers (default 100,000; 0 turns the cache off).
    /// Once Redis denies a key, checks of it are answered here, without a round trip, until
    /// the denial's retry time: a blocked key, however hot, costs Redis one call per retry
    /// period instead of one per request. Never admits more: see the crate docs.
    ///
    /// ```
    /// let config = rl_store_redis::RedisConfig::new("redis://127.0.0.1").deny_cache(10_000);
    /// # drop(config);
    /// ```
    pub const fn deny_cache(mut self, max_keys: usize) -> Self {
        self.deny_cache = max_keys;
        self
    }

    /// Leases tokens (off by default): a check that finds no lease here takes `batch` of the
    /// key's quota from Redis in one round trip, and the next `batch - 1` units of cost are
    /// admitted locally until `period` has passed. Fewer round trips, at a bounded cost in
    /// accuracy: across a fleet, any interval admits at most
    /// `min(rate × period, gateways × batch)` more than the quota (the crate docs derive it);
    /// tokens unspent at the end of a period are forgotten. When Redis cannot grant a whole
    /// batch, the check asks for its own cost alone.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// let config = rl_store_redis::RedisConfig::new("redis://127.0.0.1")
    ///     .lease(NonZeroU32::new(10).unwrap(), Duration::from_millis(100));
    /// # drop(config);
    /// ```
    pub const fn lease(mut self, batch: NonZeroU32, period: Duration) -> Self {
        self.lease = Some(LeasePolicy { batch, period });
        self
    }

    /// Splits hot keys over sub-counters (default: never); see [`HotKeys`].
    ///
    /// ```
    /// use rl_store_redis::{HotKeys, RedisConfig};
    /// use std::num::NonZeroU32;
    /// let config = RedisConfig::new("redis://127.0.0.1")
    ///     .hot_keys(HotKeys::adaptive(1_000, NonZeroU32::new(16).unwrap()));
    /// # drop(config);
    /// ```
    pub const fn hot_keys(mut self, hot_keys: HotKeys) -> Self {
        self.hot_keys = hot_keys;
        self
    }

    /// Past how much clock skew between this host and Redis
    /// [`RedisStore::measure_clock_skew`] logs a warning (default 100 ms). The store's
    /// decisions never depend on this host's clock; other parts of the service may.
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = rl_store_redis::RedisConfig::new("redis://127.0.0.1")
    ///     .clock_skew_warning(Duration::from_millis(50));
    /// # drop(config);
    /// ```
    pub const fn clock_skew_warning(mut self, threshold: Duration) -> Self {
        self.skew_warning = threshold;
        self
    }

    /// Connects, checks that Redis answers within the [deadline](Self::timeout), and
    /// measures the clock skew once: for a service that should not start without Redis.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build), and a [`StoreError`] of kind
    /// [`Connection`](StoreErrorKind::Connection) or [`Timeout`](StoreErrorKind::Timeout) when
    /// Redis cannot be reached.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), rl_core::StoreError> {
    /// let store = rl_store_redis::RedisConfig::new("redis://127.0.0.1:6379").connect().await?;
    /// # drop(store); Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        let store = self.build()?;
        store.measure_clock_skew().await?;
        Ok(store)
    }

    /// The store, without touching the network: it connects on its first call, and a call
    /// made while Redis is down fails within its deadline (so the layer's failure mode
    /// answers) until Redis is up. For a service that must start, and serve, without Redis.
    /// Call it from within a Tokio runtime.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] of kind [`InvalidInput`](StoreErrorKind::InvalidInput), with a
    /// [`ConfigError`] as its source, for a bad URL or prefix or when called outside a Tokio
    /// runtime.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), rl_core::StoreError> {
    /// // Nothing listens on port 1: building still succeeds.
    /// let store = rl_store_redis::RedisConfig::new("redis://127.0.0.1:1").build()?;
    /// # drop(store); Ok(()) }
    /// ```
    pub fn build(self) -> Result<RedisStore, StoreError> {
        let invalid =
            |error: ConfigError| StoreError::with_source(StoreErrorKind::InvalidInput, error);
        let prefix_ok = !self.prefix.is_empty()
            && self.prefix.len() <= 64
            && !self
                .prefix
                .bytes()
                .any(|b| b == b'{' || b == b'}' || b.is_ascii_whitespace() || b.is_ascii_control());
        if !prefix_ok {
            return Err(invalid(ConfigError::InvalidPrefix {
                prefix: self.prefix,
            }));
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(invalid(ConfigError::NoRuntime));
        }
        let bad_url = |e: &dyn fmt::Display| {
            invalid(ConfigError::InvalidUrl {
                url: self.url.clone(),
                reason: e.to_string(),
            })
        };
        let connection = if let Some(max_size) = self.pool {
            let mut config = deadpool_redis::Config::from_url(self.url.clone());
            let mut pool = deadpool_redis::PoolConfig::new(max_size.max(1));
            pool.timeouts.wait = Some(self.timeout);
            pool.timeouts.create = Some(self.connect_timeout);
            pool.timeouts.recycle = Some(self.connect_timeout);
            config.pool = Some(pool);
            let pool = config
                .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                .map_err(|e| bad_url(&e))?;
            Connection::Pool(pool)
        } else if let Some(nodes) = &self.cluster {
            let client = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                .connection_timeout(self.connect_timeout)
                .response_timeout(self.timeout)
                .build()
                .map_err(|e| bad_url(&e))?;
            Connection::Cluster(Arc::new(LazyCluster {
                client,
                connection: tokio::sync::OnceCell::new(),
            }))
        } else {
            let client = redis::Client::open(self.url.as_str()).map_err(|e| bad_url(&e))?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(self.connect_timeout))
                .set_response_timeout(Some(self.timeout))
                .set_number_of_retries(1);
            Connection::Single(
                ConnectionManager::new_lazy_with_config(client, config).map_err(|e| bad_url(&e))?,
            )
        };
        let prefix: Arc<str> = Arc::from(self.prefix);
        let local = Arc::new(Local {
            clock: MonotonicClock::new(),
            deny: DenyCache::new(self.deny_cache),
            leases: self
                .lease
                .map(|policy| Leases::new(policy, self.deny_cache.max(1_000))),
            hot: HotKeyState::new(self.hot_keys),
            channel: format!("{prefix}:hot-keys"),
            subscriber: OnceLock::new(),
        });
        if self.hot_keys.is_adaptive() {
            let url = self
                .cluster
                .as_ref()
                .and_then(|nodes| nodes.first())
                .unwrap_or(&self.url);
            let client = redis::Client::open(url.as_str()).map_err(|e| bad_url(&e))?;
            let task = tokio::spawn(subscribe(client, Arc::downgrade(&local)));
            let _ = local.subscriber.set(AbortOnDrop(task));
        }
        Ok(RedisStore {
            connection,
            prefix,
            timeout: self.timeout,
            skew_warning: self.skew_warning,
            local,
        })
    }
}

/// The default deadline of a call: see [`RedisConfig::timeout`].
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// The default size of the denied-key cache: see [`RedisConfig::deny_cache`].
const DEFAULT_DENY_CACHE: usize = 100_000;

/// A configuration that cannot work; the source of an
/// [`InvalidInput`](StoreErrorKind::InvalidInput) error from [`RedisConfig::connect`].
///
/// ```
/// let err = rl_store_redis::ConfigError::InvalidPrefix { prefix: "a{b".into() };
/// assert_eq!(err.to_string(), "invalid key prefix \"a{b\": use 1 to 64 bytes without braces or whitespace");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The URL could not be parsed.
    InvalidUrl {
        /// The URL given.
        url: String,
        /// Why it is invalid.
        reason: String,
    },
    /// The key prefix is empty, too long, or holds a brace or whitespace.
    InvalidPrefix {
        /// The prefix given.
        prefix: String,
    },
    /// [`RedisConfig::build`] was called outside a Tokio runtime.
    NoRuntime,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidUrl { url, reason } => write!(f, "invalid redis url {url:?}: {reason}"),
            Self::InvalidPrefix { prefix } => write!(
                f,
                "invalid key prefix {prefix:?}: use 1 to 64 bytes without braces or whitespace"
            ),
            Self::NoRuntime => f.write_str("build the Redis store from within a Tokio runtime"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A [`Store`] in Redis or Redis Cluster; see the [crate docs](crate). Clones share one
/// multiplexed connection (per cluster node), or one pool.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    prefix: Arc<str>,
    timeout: Duration,
    skew_warning: Duration,
    local: Arc<Local>,
}

/// What a gateway keeps in front of Redis, shared by a store's clones.
#[derive(Debug)]
struct Local {
    clock: MonotonicClock,
    deny: DenyCache,
    leases: Option<Leases>,
    hot: HotKeyState,
    /// The pub/sub channel of hot-key announcements.
    channel: String,
    /// The task listening on it (adaptive hot keys only), stopped with the last clone.
    subscriber: OnceLock<AbortOnDrop>,
}

#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Listens for hot-key announcements while the store lives, reconnecting every second while
/// Redis cannot be reached.
async fn subscribe(client: redis::Client, local: Weak<Local>) {
    loop {
        let Some(channel) = local.upgrade().map(|l| l.channel.clone()) else {
            return;
        };
        if let Ok(mut pubsub) = client.get_async_pubsub().await
            && pubsub.subscribe(&channel).await.is_ok()
        {
            let mut messages = pubsub.on_message();
            while let Some(message) = messages.next().await {
                let Some(local) = local.upgrade() else {
                    return;
                };
                local
                    .hot
                    .receive(message.get_payload_bytes(), local.clock.now().as_nanos());
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One multiplexed connection to a server, or the cluster client's connections.
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(Arc<LazyCluster>),
    Pool(deadpool_redis::Pool),
}

/// The cluster client connects on first use (it has no lazy mode of its own); until a
/// connection succeeds, every call tries anew.
struct LazyCluster {
    client: redis::cluster::ClusterClient,
    connection: tokio::sync::OnceCell<redis::cluster_async::ClusterConnection>,
}

impl LazyCluster {
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let mut connection = self
            .connection
            .get_or_try_init(|| self.client.get_async_connection())
            .await?
            .clone();
        match cmd.query_async(&mut connection).await {
            Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::Ask) => {
                // The slot is migrating and the key has moved. The client follows `ASK` by
                // sending `ASKING` and the command separately on a shared connection, where
                // another request's command can slip in between and use up the `ASKING`; it
                // then gives up after its retries. Sent as one pipeline, the pair stays together.
                let Some((host, port)) = error
                    .redirect_node()
                    .and_then(|(node, _)| node.rsplit_once(':'))
                    .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
                else {
                    return Err(error);
                };
                let mut pipeline = redis::pipe();
                pipeline.cmd("ASKING").add_command(cmd.clone());
                let route = redis::cluster_routing::SingleNodeRoutingInfo::ByAddress { host, port };
                let mut replies = connection.route_pipeline(pipeline, 1, 1, route).await?;
                match replies.pop() {
                    // A server error in a pipeline comes back as a value: make it an error
                    // again (`NOSCRIPT` must read as such, so that the script is sent whole).
                    Some(reply) => {
                        redis::from_redis_value(reply.extract_error()?).map_err(Into::into)
                    }
                    None => Err(error),
                }
            }
            result => result,
        }
    }
}

impl Connection {
    /// Runs `lua` for `call`: by SHA, and by source when Redis lacks the script (after a
    /// restart, a `SCRIPT FLUSH`, or on a cluster node the key just moved to). `EVAL` caches
    /// the script, so the next call is by SHA again.
    async fn eval(&self, lua: &Lua, call: &Call<'_>) -> Result<Vec<i64>, StoreError> {
        match self.send(&lua.command(true, call)).await? {
            Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.send(&lua.command(false, call)).await?
            }
            result => result,
        }
        .map_err(classify)
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        self.send(cmd).await?.map_err(classify)
    }

    /// Sends `cmd`; the outer error is a pooled connection not to be had.
    async fn send<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<redis::RedisResult<T>, StoreError> {
        // Each arm's future is boxed: their sizes differ by kilobytes (the cluster client's is the
        // largest), and a check's future would otherwise be as large as the largest of them.
        Ok(match self.clone() {
            Self::Single(mut c) => match Box::pin(cmd.query_async(&mut c)).await {
                // The error may be the old connection's: the manager has begun reconnecting
                // on seeing it, so one more try (within the same deadline) reaches a Redis that
                // is back, rather than leaving the circuit breaker's probe to fail on it.
                Err(error) if error.is_connection_dropped() || error.is_io_error() => {
                    Box::pin(cmd.query_async(&mut c)).await
                }
                result => result,
            },
            Self::Cluster(lazy) => Box::pin(lazy.query(cmd)).await,
            Self::Pool(pool) => {
                let mut c = Box::pin(checkout(&pool)).await?;
                Box::pin(cmd.query_async(&mut c)).await
            }
        })
    }
}

async fn checkout(pool: &deadpool_redis::Pool) -> Result<deadpool_redis::Connection, StoreError> {
    pool.get().await.map_err(|error| match error {
        deadpool_redis::PoolError::Backend(error) => classify(error),
        deadpool_redis::PoolError::Timeout(deadpool_redis::TimeoutType::Wait) => {
            StoreError::with_source(StoreErrorKind::PoolExhausted, error)
        }
        deadpool_redis::PoolError::Timeout(_) => {
            StoreError::with_source(StoreErrorKind::Timeout, error)
        }
        other => StoreError::with_source(StoreErrorKind::Connection, other),
    })
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to `url` with the default [`RedisConfig`].
    ///
    /// # Errors
    ///
    /// See [`RedisConfig::connect`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), rl_core::StoreError> {
    /// let store = rl_store_redis::RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// # drop(store); Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        RedisConfig::new(url).connect().await
    }

    /// The key under which `key`'s state for `quota` lives (for inspection and tests).
    ///
    /// ```no_run
    /// # async fn demo(store: rl_store_redis::RedisStore) {
    /// let name = store.state_key(&rl_core::Key::from(7u64), &rl_core::Quota::per_second(1).unwrap());
    /// assert_eq!(name, "rl:{i7}:gcra");
    /// # }
    /// ```
    #[must_use]
    pub fn state_key(&self, key: &Key, quota: &Quota) -> String {
        state_key(&self.prefix, key, None, quota.algorithm())
    }

    /// How far Redis's clock is ahead of this host's (negative: behind), in microseconds: the
    /// Redis `TIME` against the midpoint of this host's clock around the call. Logs a warning
    /// (`tracing`) when it exceeds the configured threshold (default 100 ms): decisions use
    /// Redis's clock only, but a skewed host misreads `X-RateLimit-Reset` and its own logs.
    ///
    /// # Errors
    ///
    /// When Redis does not answer `TIME`.
    ///
    /// ```no_run
    /// # async fn demo(store: rl_store_redis::RedisStore) -> Result<(), rl_core::StoreError> {
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
            .within(self.connection.query(&redis::cmd("TIME")))
            .await?;
        let after = local();
        let redis = secs.saturating_mul(1_000_000).saturating_add(micros);
        let skew = redis.saturating_sub(before / 2 + after / 2);
        let threshold = i64::try_from(self.skew_warning.as_micros()).unwrap_or(i64::MAX);
        if skew.unsigned_abs() > threshold.unsigned_abs() {
            tracing::warn!(
                skew_us = skew,
                threshold_us = threshold,
                "the clocks of this host and Redis disagree"
            );
        }
        Ok(skew)
    }

    /// [`Store::check`] at a given time (microseconds since the UNIX epoch) instead of Redis's
    /// clock: for tests that compare the scripts with `rl-core` step by step.
    ///
    /// # Errors
    ///
    /// As for [`Store::check`].
    /// The keys this gateway splits now (by [`HotKeys`]), with their numbers of parts: for a
    /// debug endpoint or a log line. Empty unless the store splits adaptively.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), rl_core::StoreError> {
    /// let store = rl_store_redis::RedisConfig::new("redis://127.0.0.1:1").build()?;
    /// assert!(store.split_keys().is_empty());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn split_keys(&self) -> Vec<(Key, u32)> {
        self.local.hot.promoted(self.now())
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

    #[doc(hidden)]
    pub async fn check_at(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
        now_micros: u64,
    ) -> Result<Decision, StoreError> {
        self.run(key, None, quota, "c", cost, Some(now_micros))
            .await
    }

    async fn run(
        &self,
        key: &Key,
        part: Option<u32>,
        quota: &Quota,
        mode: &str,
        cost: u32,
        now_micros: Option<u64>,
    ) -> Result<Decision, StoreError> {
        let (lua, figure, limit) = script(quota);
        let key = state_key(&self.prefix, key, part, quota.algorithm());
        let call = Call {
            key: &key,
            mode,
            cost,
            now: now_micros,
            figure,
            limit,
        };
        let reply = Box::pin(self.within(self.connection.eval(lua, &call))).await?;
        decision(&reply)
    }
}

/// Reads a script's reply `{outcome, limit, remaining, reset_after_us, retry_after_us}`.
fn decision(reply: &[i64]) -> Result<Decision, StoreError> {
    let bad = || {
        StoreError::with_source(
            StoreErrorKind::Script,
            format!("unexpected script reply {reply:?}"),
        )
    };
    let &[outcome, limit, remaining, reset, retry] = reply else {
        return Err(bad());
    };
    let unsigned = |n: i64| u64::try_from(n).map_err(|_| bad());
    let info = Info::new(
        unsigned(limit)?,
        unsigned(remaining)?,
        Duration::from_micros(unsigned(reset)?),
        Duration::from_micros(unsigned(retry)?),
    );
    match outcome {
        1 => Ok(Decision::Allowed(info)),
        0 => Ok(Decision::Denied(info)),
        2 => Ok(Decision::InsufficientCapacity(info)),
        _ => Err(bad()),
    }
}

/// Which counter of a key a check uses: the key's own, or one of its parts when split.
struct Route {
    part: Option<u32>,
    quota: Quota,
    /// The deny cache's name for the counter (`u32::MAX` for the key's own).
    cached: u32,
}

impl RedisStore {
    fn now(&self) -> u64 {
        self.local.clock.now().as_nanos()
    }

    fn route(&self, key: &Key, quota: &Quota, now: u64) -> Route {
        let parts = self.local.hot.parts(key, now);
        match NonZeroU32::new(parts) {
            Some(n) if parts > 1 => {
                let part = fastrand::u32(0..parts);
                Route {
                    part: Some(part),
                    quota: quota.share(n),
                    cached: part,
                }
            }
            _ => Route {
                part: None,
                quota: *quota,
                cached: u32::MAX,
            },
        }
    }

    /// A decision this gateway can make alone: from a lease, or a standing denial of the
    /// counter `route` picked.
    fn decide_locally(
        &self,
        key: &Key,
        quota: &Quota,
        route: &Route,
        cost: u32,
        now: u64,
    ) -> Option<Decision> {
        let leases = self.local.leases.as_ref();
        if let Some(leased) = leases.and_then(|l| l.spend(key, quota, cost, now)) {
            return Some(leased);
        }
        self.local
            .deny
            .get(key, route.cached, &route.quota, cost, now)
    }

    fn announce(&self, payload: Vec<u8>) {
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(&self.local.channel).arg(payload);
        let store = self.clone();
        // At most once per key and half hold: a task, not a wait on the request's path.
        tokio::spawn(async move {
            if let Err(error) = store.within(store.connection.query::<i64>(&publish)).await {
                tracing::debug!(%error, "could not announce a hot key; it is split here only");
            }
        });
    }
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
        let now = self.now();
        let route = self.route(key, quota, now);
        self.decide_locally(key, quota, &route, cost, now).map(Ok)
    }

    async fn check(&self, key: &Key, quota: &Quota, cost: u32) -> Result<Decision, StoreError> {
        let now = self.now();
        let route = self.route(key, quota, now);
        if let Some(decision) = self.decide_locally(key, quota, &route, cost, now) {
            return Ok(decision);
        }
        if let Some(payload) = self.local.hot.record(key, now) {
            self.announce(payload);
        }
        let leases = self.local.leases.as_ref();
        if let Some(batch) = leases.and_then(|l| l.batch_for(cost)) {
            let granted = self
                .run(key, route.part, &route.quota, "c", batch, None)
                .await?;
            if let Decision::Allowed(info) = granted {
                if let Some(leases) = leases {
                    leases.granted(key, *quota, cost, &info, self.now());
                }
                let held = u64::from(batch - cost);
                return Ok(Decision::Allowed(Info::new(
                    info.limit(),
                    info.remaining() + held,
                    info.reset_after(),
                    Duration::ZERO,
                )));
            }
            // Not a whole batch left: ask for this check's cost alone.
        }
        let decision = self
            .run(key, route.part, &route.quota, "c", cost, None)
            .await?;
        if let Decision::Denied(info) = &decision {
            self.local
                .deny
                .insert(key, route.cached, route.quota, cost, info, self.now());
        }
        Ok(decision)
    }

    async fn peek(&self, key: &Key, quota: &Quota) -> Result<Decision, StoreError> {
        let route = self.route(key, quota, self.now());
        self.run(key, route.part, &route.quota, "p", 1, None).await
    }

    /// Deletes the key's counter (and every part of it, when split), and forgets this
    /// gateway's lease and denials of it. Other gateways' denials stand until their retry time.
    async fn reset(&self, key: &Key, quota: &Quota) -> Result<(), StoreError> {
        self.local.deny.remove(key);
        if let Some(leases) = &self.local.leases {
            leases.remove(key);
        }
        let parts = self
            .local
            .hot
            .parts(key, self.now())
            .max(self.local.hot.config_parts());
        let mut del = redis::cmd("DEL");
        del.arg(state_key(&self.prefix, key, None, quota.algorithm()));
        let mut deletes = vec![del];
        for part in (0..parts).filter(|_| parts > 1) {
            let mut del = redis::cmd("DEL");
            del.arg(state_key(&self.prefix, key, Some(part), quota.algorithm()));
            deletes.push(del);
        }
        // One DEL per key: in a cluster the parts live on different nodes.
        for del in &deletes {
            self.within(self.connection.query::<()>(del)).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_checked() {
        assert!(decision(&[1, 10, 9, 100, 0]).unwrap().is_allowed());
        assert!(matches!(
            decision(&[2, 10, 9, 100, 0]).unwrap(),
            Decision::InsufficientCapacity(_)
        ));
        for bad in [
            &[1, 10, 9, 100][..],
            &[3, 10, 9, 100, 0],
            &[1, -1, 9, 100, 0],
            &[],
        ] {
            let err = decision(bad).unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Script);
        }
    }
}
