//! [`RedisConfig`]: how to reach Redis, and what the store keeps in front of it.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use ratewarden_core::{MonotonicClock, StoreError, StoreErrorKind};
use redis::aio::ConnectionManagerConfig;

use crate::connection::{Connection, LazyCluster, Link, Single};
use crate::deny_cache::DenyCache;
use crate::eviction::{self, EvictionWatch};
use crate::hot_keys::{HotKeyState, HotKeys, MAX_HOLD};
use crate::lease::{LeasePolicy, Leases};
use crate::script::MAX_PREFIX_LEN;
use crate::store::{Local, RedisStore};

/// How to reach Redis. Every timeout is explicit; the defaults are small so that a hung Redis
/// never holds a request for long.
///
/// ```
/// use ratewarden_redis::RedisConfig;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisConfig::new("redis://127.0.0.1:6379")
///     .pool(16)
///     .prefix("api-limits")
///     .connect_timeout(Duration::from_millis(500))
///     .timeout(Duration::from_millis(20))
///     .deny_cache(100_000)
///     .lease(std::num::NonZeroU32::new(10).ok_or("10")?, Duration::from_millis(100))
///     .clock_skew_warning(Duration::from_millis(250))
///     .build()?; // connects on its first call
/// let quota: ratewarden_core::Quota = "10/s".parse()?;
/// let name = store.state_key(&ratewarden_core::Key::from("user-42"), &quota);
/// assert!(name.starts_with(b"api-limits:{"));
/// // A cluster takes no pool: refused when built, not pooled on one node.
/// let refused = RedisConfig::cluster(["redis://127.0.0.1:7000"]).pool(4).build();
/// assert!(matches!(refused, Err(ratewarden_redis::ConfigError::PoolOnCluster)));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct RedisConfig {
    topology: Topology,
    /// A builder step that cannot apply to the topology: [`build`](Self::build) reports it.
    misuse: Option<ConfigError>,
    prefix: String,
    connect_timeout: Duration,
    timeout: Duration,
    skew_warning: Duration,
    deny_cache: usize,
    lease: Option<LeasePolicy>,
    lease_keys: usize,
    hot_keys: HotKeys,
    functions: bool,
    /// Where the `maxmemory-policy` read is reported (a watch of the config's own by default).
    eviction: EvictionWatch,
    /// The CA and client certificates given for TLS (none by default).
    #[cfg(feature = "tls-rustls")]
    tls: redis::TlsCertificates,
}

impl RedisConfig {
    /// Redis at `url` (`redis://host:port/db`), key prefix `rl`, a deadline of 50 ms per call,
    /// connect timeout 1 s.
    ///
    /// See the example on [`RedisConfig`].
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            topology: Topology::Single { url: url.into() },
            misuse: None,
            prefix: "rl".to_owned(),
            connect_timeout: Duration::from_secs(1),
            timeout: DEFAULT_TIMEOUT,
            deny_cache: DEFAULT_DENY_CACHE,
            lease_keys: DEFAULT_LEASE_KEYS,
            lease: None,
            hot_keys: HotKeys::default(),
            functions: true,
            eviction: EvictionWatch::new(),
            skew_warning: Duration::from_millis(100),
            #[cfg(feature = "tls-rustls")]
            tls: redis::TlsCertificates {
                client_tls: None,
                root_cert: None,
            },
        }
    }

    /// A Redis Cluster, reached through any of `nodes` (`redis://host:port` each). Every key's
    /// state lives on the node owning its hash tag; `MOVED` and `ASK` redirections and failovers
    /// are followed by the client.
    ///
    /// See the example on [`RedisConfig`].
    pub fn cluster<I: IntoIterator<Item = S>, S: Into<String>>(nodes: I) -> Self {
        Self {
            topology: Topology::Cluster {
                nodes: nodes.into_iter().map(Into::into).collect(),
            },
            ..Self::new("")
        }
    }

    /// Use a `deadpool-redis` pool of up to `max_size` connections instead of the default single
    /// multiplexed connection. Measured here (BENCHMARKS.md), the multiplexed connection is
    /// faster: every checkout from the pool costs a round trip of its own (deadpool pings a
    /// connection before handing it out). A pool isolates slow scripts from one another, and
    /// its checkouts count against the call's [deadline](Self::timeout); creating and recycling a connection at
    /// most the connect timeout. From 1 to 1,024 connections, or [`build`](Self::build)
    /// refuses it ([`ConfigError::OutOfRange`]).
    ///
    /// A check holds its pooled connection until its call ends: a caller that keeps check
    /// futures without polling them (nor dropping them) keeps their connections, and
    /// `max_size` such futures leave none for any other check until they are polled or
    /// dropped. The multiplexed connection has no such limit: a call held so gives up its place
    /// at its deadline.
    ///
    /// A pool is for one server: on a [cluster](Self::cluster) config, where the cluster
    /// client keeps a multiplexed connection per node, [`build`](Self::build) refuses it
    /// ([`ConfigError::PoolOnCluster`]) rather than pool the first node alone.
    ///
    /// See the example on [`RedisConfig`].
    pub fn pool(mut self, max_size: usize) -> Self {
        self.topology = match self.topology {
            Topology::Single { url } | Topology::Pool { url, .. } => {
                Topology::Pool { url, max_size }
            }
            cluster @ Topology::Cluster { .. } => {
                self.misuse.get_or_insert(ConfigError::PoolOnCluster);
                cluster
            }
        };
        self
    }

    /// The prefix of every key (default `rl`): 1 to 32 bytes without `{`, `}` or whitespace.
    ///
    /// See the example on [`RedisConfig`].
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one attempt to open a connection may take (default 1 s). A call never waits
    /// past its [deadline](Self::timeout) for it: the attempt goes on for the calls after.
    ///
    /// See the example on [`RedisConfig`].
    pub const fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The deadline of every call, from its start to its decision (default 50 ms): waiting for a
    /// pooled connection, reconnecting, reloading a flushed script and the round trip all count.
    /// Past it, the call fails with [`StoreErrorKind::Timeout`] and the layer's failure mode
    /// answers. Redis answers a healthy check in well under a millisecond; the deadline is for
    /// a Redis that is stopped, paused, busy or unreachable. With adaptive
    /// [hot keys](Self::hot_keys) it is also how long a key waits after its split ends, and
    /// must be at most a day ([`build`](Self::build) refuses more).
    ///
    /// See the example on [`RedisConfig`].
    pub const fn timeout(mut self, deadline: Duration) -> Self {
        self.timeout = deadline;
        self
    }

    /// How many denied keys this gateway remembers (default 100,000; 0 turns the cache off).
    /// Once Redis denies a key, checks of it are answered here, without a round trip, until
    /// the denial's retry time: a blocked key, however hot, costs Redis one call per retry
    /// period instead of one per request. Never admits more: see the crate docs.
    ///
    /// See the example on [`RedisConfig`].
    pub const fn deny_cache(mut self, max_keys: usize) -> Self {
        self.deny_cache = max_keys;
        self
    }

    /// Leases tokens (off by default): a check that finds no lease here takes up to `batch`
    /// of the key's quota from Redis in one round trip (never more than the quota's burst, and
    /// what is left if less, as long as it covers the check), and the rest of the batch is
    /// admitted locally until `period` has passed. Fewer round trips, at a bounded cost in
    /// accuracy: across a fleet, any interval admits at most
    /// `min(rate × period, gateways × batch)` more than the quota (the crate docs derive it);
    /// tokens unspent at the end of a period are forgotten.
    ///
    /// See the example on [`RedisConfig`].
    pub const fn lease(mut self, batch: NonZeroU32, period: Duration) -> Self {
        self.lease = Some(LeasePolicy { batch, period });
        self
    }

    /// How many keys this gateway holds leases for at once (default 10,000; see
    /// [`lease`](Self::lease)). A key that finds the leases full asks Redis for its own cost
    /// only, as without leases: no batch is taken that could not be held.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), ratewarden_redis::ConfigError> {
    /// use std::{num::NonZeroU32, time::Duration};
    /// let store = ratewarden_redis::RedisConfig::new("redis://127.0.0.1:6379")
    ///     .lease(NonZeroU32::new(10).unwrap(), Duration::from_millis(100))
    ///     .lease_keys(1_000)
    ///     .build()?;
    /// # let _ = store;
    /// # Ok(()) }
    /// ```
    pub const fn lease_keys(mut self, max_keys: usize) -> Self {
        self.lease_keys = max_keys;
        self
    }

    /// Whether checks call this crate's library of Redis functions (`FCALL`, loaded by
    /// `FUNCTION LOAD`) on a server that has them (default `true`): they cost Redis a quarter
    /// to a third less than scripts by `EVALSHA`. A server without them (before 7.0, or a
    /// user whose ACL lacks them) is found out by its first answer and served by scripts;
    /// turn them off behind a proxy that does not pass `FCALL` and `FUNCTION` on and closes
    /// the connection on a command it does not know, where that answer never comes.
    ///
    /// ```
    /// use ratewarden_redis::RedisConfig;
    /// let behind_a_proxy = RedisConfig::new("redis://127.0.0.1:22121").functions(false);
    /// # let _ = behind_a_proxy;
    /// ```
    pub const fn functions(mut self, on: bool) -> Self {
        self.functions = on;
        self
    }

    /// Splits hot keys over sub-counters (default: never); see [`HotKeys`].
    ///
    /// See the example on [`RedisConfig`].
    pub const fn hot_keys(mut self, hot_keys: HotKeys) -> Self {
        self.hot_keys = hot_keys;
        self
    }

    /// Trusts the CA certificates in `pem` (one or more, PEM-encoded) for `rediss://`
    /// connections, instead of the default roots (the operating system's, or with the
    /// `tls-rustls-webpki-roots` feature Mozilla's): for a Redis whose certificate an internal,
    /// self-signed CA signed. Applies to the single connection, the pool and every cluster
    /// node alike; every URL must then be `rediss://`.
    ///
    /// A `rediss://` URL needs no CA here when a default root signed the server's certificate.
    /// The certificate is read when the store is [built](Self::build), so a malformed one is an
    /// error there, not at the first check.
    ///
    /// Without `tls-rustls-webpki-roots`, the `redis` crate still reads the operating system's
    /// certificates at every connection, even with a CA given here, and fails the connection
    /// when it cannot (`SSL_CERT_FILE` naming a missing file, say): in a container without a
    /// working certificate store, turn on `tls-rustls-webpki-roots`.
    ///
    /// See the example on [`RedisConfig`].
    #[cfg(feature = "tls-rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls-rustls")))]
    pub fn tls_ca_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_cert = Some(pem.into());
        self
    }

    /// Presents the certificate chain `cert_pem` and its private key `key_pem` (both PEM) to
    /// Redis: mutual TLS, for a Redis run with `tls-auth-clients yes`. Applies to the single
    /// connection, the pool and every cluster node alike; every URL must then be `rediss://`.
    ///
    /// See the example on [`RedisConfig`].
    #[cfg(feature = "tls-rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls-rustls")))]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client_tls = Some(redis::ClientTlsConfig {
            client_cert: cert_pem.into(),
            client_key: key_pem.into(),
        });
        self
    }

    /// Past how much clock skew between this host and Redis
    /// [`RedisStore::measure_clock_skew`] logs a warning (default 100 ms). The store's
    /// decisions never depend on this host's clock; other parts of the service may.
    ///
    /// See the example on [`RedisConfig`].
    pub const fn clock_skew_warning(mut self, threshold: Duration) -> Self {
        self.skew_warning = threshold;
        self
    }

    /// Reports the `maxmemory-policy` the store reads (when it connects, and every 60 s) to
    /// `watch`, which the caller keeps: see [`EvictionWatch`]. A policy that evicts keys hands
    /// throttled clients a fresh quota. Without this step the store still reads it, and warns
    /// (`tracing` feature) and sets a gauge (`metrics` feature) when it evicts. Stores built
    /// from clones of one config report to one watch: give each its own.
    ///
    /// ```
    /// use ratewarden_redis::{EvictionWatch, RedisConfig};
    /// let eviction = EvictionWatch::new();
    /// let config = RedisConfig::new("redis://127.0.0.1:6379").eviction_watch(&eviction);
    /// assert_eq!(eviction.policy(), None, "nothing read before the store connects");
    /// # let _ = config;
    /// ```
    pub fn eviction_watch(mut self, watch: &EvictionWatch) -> Self {
        self.eviction = watch.clone();
        self
    }

    /// Connects, checks that Redis answers within the [deadline](Self::timeout), measures
    /// the clock skew once, and reads Redis's `maxmemory-policy` (see
    /// [`eviction_watch`](Self::eviction_watch); a policy Redis will not report fails
    /// nothing): for a service that should not start without Redis.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build), and a [`StoreError`] of kind
    /// [`Connection`](StoreErrorKind::Connection) or [`Timeout`](StoreErrorKind::Timeout) when
    /// Redis cannot be reached.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), ratewarden_core::StoreError> {
    /// let store = ratewarden_redis::RedisConfig::new("redis://127.0.0.1:6379").connect().await?;
    /// assert!(store.split_keys().is_empty());
    /// # Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        let (store, eviction) = self.build_watched()?;
        store.measure_clock_skew().await?;
        eviction.read().await;
        Ok(store)
    }

    /// The store, without touching the network: it connects on its first call, and a call
    /// made while Redis is down fails within its deadline (so the layer's failure mode
    /// answers) until Redis is up. For a service that must start, and serve, without Redis.
    /// Call it from within a Tokio runtime: the store reads Redis's `maxmemory-policy` from a
    /// task of its own there, 60 s after it is built and every 60 s after, until it is dropped
    /// (see [`eviction_watch`](Self::eviction_watch)).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for a bad URL, prefix or certificate, a zero timeout, lease period or
    /// hot-key hold, a [pool](Self::pool) on a cluster, or when called outside a Tokio runtime.
    /// It converts into a [`StoreError`] of kind
    /// [`InvalidInput`](StoreErrorKind::InvalidInput) for `?`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), ratewarden_redis::ConfigError> {
    /// // Nothing listens on port 1: building still succeeds.
    /// let store = ratewarden_redis::RedisConfig::new("redis://127.0.0.1:1").build()?;
    /// assert!(store.split_keys().is_empty());
    /// # Ok(()) }
    /// ```
    pub fn build(self) -> Result<RedisStore, ConfigError> {
        Ok(self.build_watched()?.0)
    }

    /// The store, and what reads its `maxmemory-policy` (already reading every 60 s).
    fn build_watched(self) -> Result<(RedisStore, eviction::Watcher), ConfigError> {
        if let Some(misuse) = self.misuse {
            return Err(misuse);
        }
        let prefix_ok = !self.prefix.is_empty()
            && self.prefix.len() <= MAX_PREFIX_LEN
            && !self
                .prefix
                .bytes()
                .any(|b| b == b'{' || b == b'}' || b.is_ascii_whitespace() || b.is_ascii_control());
        if !prefix_ok {
            return Err(ConfigError::InvalidPrefix {
                prefix: self.prefix,
            });
        }
        let zero = [
            ("timeout", self.timeout),
            ("connect_timeout", self.connect_timeout),
            (
                "lease period",
                self.lease.map_or(Duration::MAX, |lease| lease.period),
            ),
            (
                "hot-key hold",
                self.hot_keys.hold_time().unwrap_or(Duration::MAX),
            ),
        ]
        .into_iter()
        .find(|(_, duration)| duration.is_zero());
        if let Some((setting, _)) = zero {
            return Err(ConfigError::ZeroDuration { setting });
        }
        if let Some(hold) = self.hot_keys.hold_time() {
            // A split's end, and the deadline a split key then waits (its checks' margin),
            // go to Redis as microseconds: they must stay within the integers it counts
            // exactly (2^53).
            let long = [
                ("hot-key hold", hold),
                ("timeout (with adaptive hot keys)", self.timeout),
            ]
            .into_iter()
            .find(|&(_, duration)| duration > MAX_HOLD);
            if let Some((setting, _)) = long {
                return Err(ConfigError::DurationTooLong {
                    setting,
                    max: MAX_HOLD,
                });
            }
        }
        self.check_ranges()?;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(ConfigError::NoRuntime);
        };
        let connection = self.connection()?;
        let eviction = eviction::Watcher::new(&connection, self.eviction);
        eviction.clone().spawn(&runtime, eviction::PERIOD);
        let local = Local {
            clock: MonotonicClock::new(),
            deny: DenyCache::new(self.deny_cache),
            leases: self
                .lease
                .map(|policy| Leases::new(policy, self.lease_keys)),
            hot: HotKeyState::new(self.hot_keys),
        };
        let store = RedisStore::new(
            connection,
            Arc::from(self.prefix),
            self.timeout,
            self.skew_warning,
            local,
        );
        Ok((store, eviction))
    }
}

impl RedisConfig {
    /// The first number out of its range, if any: never clamped into it.
    fn check_ranges(&self) -> Result<(), ConfigError> {
        let out = |setting, value: usize, (min, max): (usize, usize)| {
            (!(min..=max).contains(&value)).then_some(ConfigError::OutOfRange {
                setting,
                value: value as u64,
                min: min as u64,
                max: max as u64,
            })
        };
        let parts = self.hot_keys.parts() as usize;
        let max_parts = crate::MAX_PARTS as usize;
        let pool = match self.topology {
            Topology::Pool { max_size, .. } => Some(max_size),
            _ => None,
        };
        let found = [
            pool.and_then(|size| out("pool size", size, (1, MAX_POOL))),
            match self.hot_keys.hold_time() {
                Some(_) => out("hot-key parts", parts, (2, max_parts)),
                None => out("hot-key parts", parts, (1, max_parts)),
            },
            self.lease
                .and_then(|_| out("lease keys", self.lease_keys, (1, usize::MAX))),
            // A batch of 1 leases nothing: every check asks for its cost alone.
            self.lease.and_then(|lease| {
                let batch = lease.batch.get() as usize;
                out("lease batch", batch, (2, u32::MAX as usize))
            }),
            // A threshold of 0 splits every key at its first check.
            match self.hot_keys.threshold() {
                Some(threshold) => out(
                    "hot-key threshold",
                    threshold as usize,
                    (1, u32::MAX as usize),
                ),
                None => None,
            },
        ];
        match found.into_iter().flatten().next() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// The connection, or pool, or cluster client: nothing connects yet.
    fn connection(&self) -> Result<Connection, ConfigError> {
        #[cfg(feature = "tls-rustls")]
        if self.uses_tls() {
            install_crypto_provider();
        }
        match &self.topology {
            Topology::Single { url } => {
                let client = self.client(url)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(self.timeout))
                    .set_number_of_retries(1);
                let single = Single::new(client, config).map_err(|e| invalid_url(url, &e))?;
                Ok(Connection::new(
                    Link::Single(Arc::new(single)),
                    self.timeout,
                    self.functions,
                ))
            }
            Topology::Pool { url, max_size } => {
                let client = self.client(url)?;
                // The client's connection info carries its TLS certificates into the pool.
                let manager = deadpool_redis::Manager::new(client.get_connection_info().clone())
                    .map_err(|e| invalid_url(url, &e))?;
                let mut pool = deadpool_redis::PoolConfig::new(*max_size);
                pool.timeouts.wait = Some(self.timeout);
                pool.timeouts.create = Some(self.connect_timeout);
                pool.timeouts.recycle = Some(self.connect_timeout);
                let pool = deadpool_redis::Pool::builder(manager)
                    .config(pool)
                    .runtime(deadpool_redis::Runtime::Tokio1)
                    .build()
                    .map_err(|e| invalid_url(url, &e))?;
                Ok(Connection::new(
                    Link::Pool(pool),
                    self.timeout,
                    self.functions,
                ))
            }
            Topology::Cluster { nodes } => {
                for node in nodes {
                    self.client(node)?;
                }
                // The client retries nothing: redirects are followed by the connection
                // (`ASKING` and its command in one pipeline), and a server that answers
                // `TRYAGAIN` or `CLUSTERDOWN` is a check's error at once (the client waited
                // 1.28 s or more before each of 16 retries, far past any check's deadline).
                let builder = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(self.connect_timeout)
                    .response_timeout(self.timeout)
                    .retries(0);
                #[cfg(feature = "tls-rustls")]
                let builder = if self.has_tls_certs() {
                    builder.certs(self.tls.clone())
                } else {
                    builder
                };
                let client = builder
                    .build()
                    .map_err(|e| invalid_url(nodes.first().map_or("", String::as_str), &e))?;
                Ok(Connection::new(
                    Link::Cluster(Arc::new(LazyCluster::new(client))),
                    self.timeout,
                    self.functions,
                ))
            }
        }
    }

    /// A client of `url`, with the TLS certificates given, if any (which need a `rediss://`
    /// URL, and are read here).
    fn client(&self, url: &str) -> Result<redis::Client, ConfigError> {
        let client = redis::Client::open(url).map_err(|e| invalid_url(url, &e))?;
        if let redis::ConnectionAddr::TcpTls { insecure: true, .. } =
            client.get_connection_info().addr()
        {
            // Without `redis/tls-rustls-insecure` every call would fail; with it (turned on by
            // any crate in the build), the server's certificate would go unchecked.
            return Err(invalid_url(
                url,
                &"#insecure turns certificate checks off: ratewarden-redis always checks them",
            ));
        }
        #[cfg(feature = "tls-rustls")]
        if self.has_tls_certs() {
            if !matches!(
                client.get_connection_info().addr(),
                redis::ConnectionAddr::TcpTls { .. }
            ) {
                return Err(invalid_url(
                    url,
                    &"TLS certificates are given: use rediss://",
                ));
            }
            self.check_tls_certs()?;
            return redis::Client::build_with_tls(
                client.get_connection_info().clone(),
                self.tls.clone(),
            )
            .map_err(|e| ConfigError::InvalidCertificate {
                reason: e.to_string(),
            });
        }
        Ok(client)
    }

    /// Every certificate given holds at least one certificate (the `redis` crate takes a PEM
    /// without any for an empty list: no server, or no client, would pass).
    #[cfg(feature = "tls-rustls")]
    fn check_tls_certs(&self) -> Result<(), ConfigError> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject as _;
        let given = [
            ("CA", self.tls.root_cert.as_deref()),
            (
                "client",
                self.tls
                    .client_tls
                    .as_ref()
                    .map(|c| c.client_cert.as_slice()),
            ),
        ];
        for (which, pem) in given {
            let Some(pem) = pem else { continue };
            let mut count = 0;
            for cert in CertificateDer::pem_slice_iter(pem) {
                cert.map_err(|e| ConfigError::InvalidCertificate {
                    reason: format!("the {which} certificate: {e}"),
                })?;
                count += 1;
            }
            if count == 0 {
                return Err(ConfigError::InvalidCertificate {
                    reason: format!("no PEM certificate in the {which} certificate given"),
                });
            }
        }
        if let Some(client) = &self.tls.client_tls {
            check_client_key(&client.client_cert, &client.client_key)?;
        }
        Ok(())
    }

    /// Whether a CA or client certificate was given.
    #[cfg(feature = "tls-rustls")]
    const fn has_tls_certs(&self) -> bool {
        self.tls.root_cert.is_some() || self.tls.client_tls.is_some()
    }

    /// Whether any connection will be TLS, as the `redis` crate reads the URLs (`rediss://`,
    /// `valkeys://`, any case, spaces around).
    #[cfg(feature = "tls-rustls")]
    fn uses_tls(&self) -> bool {
        self.has_tls_certs()
            || self.topology.urls().iter().any(|url| {
                redis::Client::open(url.as_str()).is_ok_and(|client| {
                    matches!(
                        client.get_connection_info().addr(),
                        redis::ConnectionAddr::TcpTls { .. }
                    )
                })
            })
    }
}

/// The client certificate and its key belong together, as rustls checks when a connection is
/// made: found here, when the store is built, not at every call.
#[cfg(feature = "tls-rustls")]
fn check_client_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<(), ConfigError> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let invalid = |reason: String| ConfigError::InvalidCertificate { reason };
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("the client certificate: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| invalid(format!("the client key: {e}")))?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(e.to_string()))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_client_auth_cert(chain, key)
        .map_err(|e| invalid(format!("the client certificate and key: {e}")))?;
    Ok(())
}

/// Where Redis is, and how the store talks to it: one of three, so that no combination of
/// settings means something else than it says.
#[derive(Clone, Debug)]
enum Topology {
    /// One server, over one multiplexed connection that reconnects by itself (the default).
    Single { url: String },
    /// One server, over a `deadpool-redis` pool of up to `max_size` connections.
    Pool { url: String, max_size: usize },
    /// A Redis Cluster, reached through any of `nodes`; the cluster client keeps one
    /// multiplexed connection per node.
    Cluster { nodes: Vec<String> },
}

impl Topology {
    /// The URLs given.
    #[cfg(feature = "tls-rustls")]
    fn urls(&self) -> &[String] {
        match self {
            Self::Single { url } | Self::Pool { url, .. } => std::slice::from_ref(url),
            Self::Cluster { nodes } => nodes,
        }
    }
}

/// Makes ring rustls's process-wide crypto provider, unless the process chose one: rustls
/// cannot pick one by itself when the build enables more than one (another dependency of the
/// application may enable aws-lc-rs), and would then fail at the first connection.
#[cfg(feature = "tls-rustls")]
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one meanwhile, which will do as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

fn invalid_url(url: &str, reason: &dyn fmt::Display) -> ConfigError {
    ConfigError::InvalidUrl {
        url: url.to_owned(),
        reason: reason.to_string(),
    }
}

/// The default deadline of a call: see [`RedisConfig::timeout`].
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// The largest pool: see [`RedisConfig::pool`].
const MAX_POOL: usize = 1_024;

/// The default size of the lease map: see [`RedisConfig::lease_keys`].
const DEFAULT_LEASE_KEYS: usize = 10_000;

/// The default size of the denied-key cache: see [`RedisConfig::deny_cache`].
const DEFAULT_DENY_CACHE: usize = 100_000;

/// A configuration that cannot work: the error of [`RedisConfig::build`], and the source of an
/// [`InvalidInput`](StoreErrorKind::InvalidInput) error from [`RedisConfig::connect`].
///
/// ```
/// let err = ratewarden_redis::ConfigError::InvalidPrefix { prefix: "a{b".into() };
/// assert_eq!(err.to_string(), "invalid key prefix \"a{b\": use 1 to 32 bytes without braces or whitespace");
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
    /// A TLS certificate or key given to [`RedisConfig::tls_ca_cert`] or
    /// [`RedisConfig::tls_client_cert`] could not be read.
    #[cfg(feature = "tls-rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls-rustls")))]
    InvalidCertificate {
        /// Why it could not be read.
        reason: String,
    },
    /// The key prefix is empty, too long, or holds a brace or whitespace.
    InvalidPrefix {
        /// The prefix given.
        prefix: String,
    },
    /// [`RedisConfig::build`] was called outside a Tokio runtime.
    NoRuntime,
    /// [`RedisConfig::pool`] on a [cluster](RedisConfig::cluster) config: a pool is for one
    /// server, and the cluster client keeps a connection per node of its own.
    PoolOnCluster,
    /// A duration that must be above zero is zero: the `timeout` (every call would fail),
    /// the `connect_timeout`, the `lease period` (every check would take a batch and forget
    /// it at once) or the `hot-key hold` (a split would end as it starts).
    ZeroDuration {
        /// Which: `timeout`, `connect_timeout`, `lease period` or `hot-key hold`.
        setting: &'static str,
    },
    /// A number outside its range: the `pool size` (1 to 1,024), `hot-key parts` (up to 64;
    /// at least 2 for adaptive splits), the `hot-key threshold` (at least 1), `lease keys`
    /// (at least 1 with leases), the `lease batch` (at least 2: a batch of 1 leases nothing).
    OutOfRange {
        /// Which.
        setting: &'static str,
        /// The value given.
        value: u64,
        /// The least allowed.
        min: u64,
        /// The most allowed.
        max: u64,
    },
    /// A duration is longer than its setting allows: the `hot-key hold`, and the `timeout`
    /// with adaptive hot keys (how long a split key waits after its split), at most a day
    /// each (a split's end must stay within the integers Redis's scripts count exactly).
    DurationTooLong {
        /// Which: `hot-key hold`, or `timeout (with adaptive hot keys)`.
        setting: &'static str,
        /// The longest it may be.
        max: Duration,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidUrl { url, reason } => write!(f, "invalid redis url {url:?}: {reason}"),
            Self::InvalidPrefix { prefix } => write!(
                f,
                "invalid key prefix {prefix:?}: use 1 to 32 bytes without braces or whitespace"
            ),
            #[cfg(feature = "tls-rustls")]
            Self::InvalidCertificate { reason } => write!(f, "invalid TLS certificate: {reason}"),
            Self::NoRuntime => f.write_str("build the Redis store from within a Tokio runtime"),
            Self::PoolOnCluster => f.write_str(
                "a pool is for one Redis server: a cluster config takes no pool (the cluster client keeps a connection per node)",
            ),
            Self::ZeroDuration { setting } => write!(f, "the {setting} must be above zero"),
            Self::DurationTooLong { setting, max } => {
                write!(f, "the {setting} must be at most {max:?}")
            }
            Self::OutOfRange {
                setting,
                value,
                min,
                max,
            } => write!(f, "the {setting} must be from {min} to {max}, not {value}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A configuration error as a [`StoreError`] of kind
/// [`InvalidInput`](StoreErrorKind::InvalidInput) (with the configuration error as its source),
/// for `?` in a function that returns [`StoreError`]s.
///
/// ```
/// use ratewarden_core::{StoreError, StoreErrorKind};
///
/// let err = StoreError::from(ratewarden_redis::ConfigError::NoRuntime);
/// assert_eq!(err.kind(), StoreErrorKind::InvalidInput);
/// ```
impl From<ConfigError> for StoreError {
    fn from(error: ConfigError) -> Self {
        Self::with_source(StoreErrorKind::InvalidInput, error)
    }
}

#[cfg(all(test, feature = "tls-rustls"))]
mod tls_tests {
    use super::RedisConfig;

    #[test]
    fn every_spelling_of_a_tls_url_is_tls() {
        // The redis crate reads these as TLS too: each needs the crypto provider.
        for url in [
            "rediss://h:1",
            "REDISS://h:1",
            "valkeys://h:1",
            " rediss://h:1",
        ] {
            assert!(RedisConfig::new(url).uses_tls(), "{url:?}");
        }
        for url in ["redis://h:1", "valkey://h:1", "unix:///tmp/redis.sock"] {
            assert!(!RedisConfig::new(url).uses_tls(), "{url:?}");
        }
    }
}
