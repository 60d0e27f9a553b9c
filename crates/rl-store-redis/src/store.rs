//! [`RedisStore`] and its configuration.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use rl_core::{Decision, Info, Key, Quota, Store, StoreError, StoreErrorKind};

use crate::error::classify;
use crate::script::{script, state_key};

/// How to reach Redis. Every timeout is explicit; the defaults are small so that a hung Redis
/// never holds a request for long.
///
/// ```
/// use rl_store_redis::RedisConfig;
/// use std::time::Duration;
///
/// let config = RedisConfig::new("redis://127.0.0.1:6379")
///     .prefix("api-limits")
///     .response_timeout(Duration::from_millis(50));
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
    response_timeout: Duration,
    skew_warning: Duration,
}

impl RedisConfig {
    /// Redis at `url` (`redis://host:port/db`), key prefix `rl`, connect timeout 1 s, response
    /// timeout 100 ms.
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
            response_timeout: Duration::from_millis(100),
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
    /// its checkouts wait at most the response timeout; creating and recycling a connection at
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

    /// How long to wait for a connection (default 1 s).
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

    /// How long to wait for a reply (default 100 ms): past it, the check fails with
    /// [`StoreErrorKind::Timeout`].
    ///
    /// ```
    /// use std::time::Duration;
    /// let config = rl_store_redis::RedisConfig::new("redis://127.0.0.1")
    ///     .response_timeout(Duration::from_millis(20));
    /// # drop(config);
    /// ```
    pub const fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
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

    /// Connects, and measures the clock skew once.
    ///
    /// # Errors
    ///
    /// A [`StoreError`] of kind [`InvalidInput`](StoreErrorKind::InvalidInput) (with a
    /// [`ConfigError`] as its source) for a bad URL or prefix, or of kind
    /// [`Connection`](StoreErrorKind::Connection) / [`Timeout`](StoreErrorKind::Timeout) when
    /// Redis cannot be reached.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), rl_core::StoreError> {
    /// let store = rl_store_redis::RedisConfig::new("redis://127.0.0.1:6379").connect().await?;
    /// # drop(store); Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
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
        let bad_url = |e: redis::RedisError| {
            invalid(ConfigError::InvalidUrl {
                url: self.url.clone(),
                reason: e.to_string(),
            })
        };
        let connection = if let Some(max_size) = self.pool {
            let mut config = deadpool_redis::Config::from_url(self.url.clone());
            let mut pool = deadpool_redis::PoolConfig::new(max_size.max(1));
            pool.timeouts.wait = Some(self.response_timeout);
            pool.timeouts.create = Some(self.connect_timeout);
            pool.timeouts.recycle = Some(self.connect_timeout);
            config.pool = Some(pool);
            let pool = config
                .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                .map_err(|e| {
                    invalid(ConfigError::InvalidUrl {
                        url: self.url.clone(),
                        reason: e.to_string(),
                    })
                })?;
            Connection::Pool(pool)
        } else if let Some(nodes) = &self.cluster {
            let client = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                .connection_timeout(self.connect_timeout)
                .response_timeout(self.response_timeout)
                .build()
                .map_err(bad_url)?;
            Connection::Cluster(client.get_async_connection().await.map_err(classify)?)
        } else {
            let client = redis::Client::open(self.url.as_str()).map_err(bad_url)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(self.connect_timeout))
                .set_response_timeout(Some(self.response_timeout))
                .set_number_of_retries(1);
            Connection::Single(
                ConnectionManager::new_with_config(client, config)
                    .await
                    .map_err(classify)?,
            )
        };
        let store = RedisStore {
            connection,
            prefix: Arc::from(self.prefix),
            skew_warning: self.skew_warning,
        };
        store.measure_clock_skew().await?;
        Ok(store)
    }
}

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
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidUrl { url, reason } => write!(f, "invalid redis url {url:?}: {reason}"),
            Self::InvalidPrefix { prefix } => write!(
                f,
                "invalid key prefix {prefix:?}: use 1 to 64 bytes without braces or whitespace"
            ),
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
    skew_warning: Duration,
}

/// One multiplexed connection to a server, or the cluster client's connections.
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
    Pool(deadpool_redis::Pool),
}

impl Connection {
    async fn invoke(
        &self,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<Vec<i64>, StoreError> {
        // Each arm's future is boxed: their sizes differ by kilobytes (the cluster client's is the
        // largest), and a check's future would otherwise be as large as the largest of them.
        let result = match self.clone() {
            Self::Single(mut c) => Box::pin(invocation.invoke_async(&mut c)).await,
            Self::Cluster(mut c) => Box::pin(invocation.invoke_async(&mut c)).await,
            Self::Pool(pool) => {
                let mut c = Box::pin(checkout(&pool)).await?;
                Box::pin(invocation.invoke_async(&mut c)).await
            }
        };
        result.map_err(classify)
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        let result = match self.clone() {
            Self::Single(mut c) => cmd.query_async(&mut c).await,
            Self::Cluster(mut c) => cmd.query_async(&mut c).await,
            Self::Pool(pool) => cmd.query_async(&mut checkout(&pool).await?).await,
        };
        result.map_err(classify)
    }
}

/// A connection from the pool, or why there is none.
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
        state_key(&self.prefix, key.repr(), quota.algorithm())
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
        let (secs, micros): (i64, i64) = self.connection.query(&redis::cmd("TIME")).await?;
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
    #[doc(hidden)]
    pub async fn check_at(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
        now_micros: u64,
    ) -> Result<Decision, StoreError> {
        self.run(key, quota, "c", cost, Some(now_micros)).await
    }

    async fn run(
        &self,
        key: &Key,
        quota: &Quota,
        mode: &str,
        cost: u32,
        now_micros: Option<u64>,
    ) -> Result<Decision, StoreError> {
        let (script, figure, limit) = script(quota);
        let now = now_micros.map_or_else(String::new, |n| n.to_string());
        let mut invocation = script.prepare_invoke();
        invocation
            .key(self.state_key(key, quota))
            .arg(mode)
            .arg(cost)
            .arg(now)
            .arg(figure)
            .arg(limit);
        let reply = Box::pin(self.connection.invoke(invocation)).await?;
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

impl Store for RedisStore {
    async fn check(&self, key: &Key, quota: &Quota, cost: u32) -> Result<Decision, StoreError> {
        self.run(key, quota, "c", cost, None).await
    }

    async fn peek(&self, key: &Key, quota: &Quota) -> Result<Decision, StoreError> {
        self.run(key, quota, "p", 1, None).await
    }

    async fn reset(&self, key: &Key, quota: &Quota) -> Result<(), StoreError> {
        let mut del = redis::cmd("DEL");
        del.arg(self.state_key(key, quota));
        self.connection.query::<()>(&del).await
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
