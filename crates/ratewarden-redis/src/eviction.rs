//! Redis's `maxmemory-policy`: read when the store connects and every minute after, because a
//! policy that evicts keys hands a throttled client a fresh quota.
//!
//! ```
//! use ratewarden_redis::EvictionPolicy;
//!
//! assert!(EvictionPolicy::from_name("allkeys-lru").evicts());
//! // Every state has a TTL: the `volatile-*` policies evict them too.
//! assert!(EvictionPolicy::from_name("volatile-ttl").evicts());
//! assert_eq!(EvictionPolicy::from_name("noeviction"), EvictionPolicy::NoEviction);
//! ```

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ratewarden_core::StoreErrorKind;
use redis::RedisResult;

use crate::connection::{Connection, MasterReplies, WeakConnection};

/// How often a store reads the policy again, after the read at [`connect`](crate::RedisConfig::connect).
pub(crate) const PERIOD: Duration = Duration::from_secs(60);

/// What Redis's `maxmemory-policy` means for this store's states, as read by
/// `CONFIG GET maxmemory-policy` (on every master of a cluster).
///
/// Every state this store writes has a TTL, so Redis may evict it under two families of
/// policies: `allkeys-*` (any key) and `volatile-*` (keys with a TTL: all of ours). An evicted
/// state is read as a fresh one: a throttled client gets its whole quota again
/// (over-admission). Under `noeviction`, Redis's default, a full Redis refuses writes with
/// `OOM` instead, a backend failure that a circuit breaker and the layer's failure mode see.
///
/// ```
/// use ratewarden_redis::EvictionPolicy;
///
/// let policy = EvictionPolicy::from_name("allkeys-lru");
/// assert!(policy.evicts());
/// assert_eq!(policy.to_string(), "allkeys-lru");
/// assert!(!EvictionPolicy::from_name("noeviction").evicts());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EvictionPolicy {
    /// `noeviction` (on every master of a cluster): a full Redis refuses writes, and no state
    /// is lost.
    NoEviction,
    /// A policy under which Redis may evict this store's states when full: `allkeys-*`,
    /// `volatile-*`, or a name this crate does not know (taken as evicting, to be safe). On a
    /// cluster, the first master found so.
    Evicting {
        /// The policy's name, as Redis reports it (`allkeys-lru`).
        policy: String,
    },
    /// Redis would not say: this user may not run `CONFIG` (`NOPERM`), the command is renamed
    /// away (as many managed Redis services do), or the reply held no policy. The store works
    /// all the same; check the policy where the server is configured.
    Unknown {
        /// Why: the error Redis answered, or what was missing.
        reason: String,
    },
}

impl EvictionPolicy {
    /// The policy named `name` (`noeviction`, `allkeys-lru`, `volatile-ttl`, ...), in any case;
    /// an empty name is [`Unknown`](Self::Unknown).
    ///
    /// ```
    /// use ratewarden_redis::EvictionPolicy;
    /// assert_eq!(EvictionPolicy::from_name("NoEviction"), EvictionPolicy::NoEviction);
    /// assert!(EvictionPolicy::from_name("allkeys-lfu").evicts());
    /// assert!(EvictionPolicy::from_name("some-future-policy").evicts());
    /// ```
    #[must_use]
    pub fn from_name(name: &str) -> Self {
        let name = name.trim();
        if name.eq_ignore_ascii_case("noeviction") {
            Self::NoEviction
        } else if name.is_empty() {
            Self::Unknown {
                reason: "Redis reported an empty maxmemory-policy".to_owned(),
            }
        } else {
            Self::Evicting {
                policy: name.to_ascii_lowercase(),
            }
        }
    }

    /// Whether Redis may evict this store's states (handing throttled clients a fresh quota).
    /// `false` for `noeviction`, and for a policy that could not be read.
    ///
    /// ```
    /// use ratewarden_redis::EvictionPolicy;
    /// assert!(EvictionPolicy::from_name("volatile-lru").evicts());
    /// let unknown = EvictionPolicy::Unknown { reason: "NOPERM".into() };
    /// assert!(!unknown.evicts());
    /// ```
    #[must_use]
    pub const fn evicts(&self) -> bool {
        matches!(self, Self::Evicting { .. })
    }
}

/// The policy's name (`noeviction`, `allkeys-lru`), or `unknown (REASON)`.
///
/// ```
/// let unknown = ratewarden_redis::EvictionPolicy::Unknown { reason: "NOPERM".into() };
/// assert_eq!(unknown.to_string(), "unknown (NOPERM)");
/// ```
impl fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoEviction => f.write_str("noeviction"),
            Self::Evicting { policy } => f.write_str(policy),
            Self::Unknown { reason } => write!(f, "unknown ({reason})"),
        }
    }
}

/// Where a store reports the `maxmemory-policy` it last read: give one to
/// [`RedisConfig::eviction_watch`](crate::RedisConfig::eviction_watch), and read it from a
/// readiness check, a debug endpoint or a test. A cheap handle: clones share one reading.
///
/// The store reads the policy when it [connects](crate::RedisConfig::connect) and every 60 s
/// after, from a task that ends with the store (a store made by
/// [`build`](crate::RedisConfig::build), which touches no network, reads it first after 60 s).
/// Each read that finds an evicting policy also logs a warning (with the `tracing` feature) and
/// sets the gauge `ratewarden_redis_evicting_policy` to 1 (with the `metrics` feature; 0 for
/// `noeviction`; it has no labels, so stores of one process on different servers share it,
/// and the last read sets it). A read that gets no answer (Redis down, the deadline passed)
/// changes nothing.
///
/// ```no_run
/// use ratewarden_redis::{EvictionWatch, RedisConfig};
///
/// # async fn demo() -> Result<(), ratewarden_core::StoreError> {
/// let eviction = EvictionWatch::new();
/// let store = RedisConfig::new("redis://127.0.0.1:6379")
///     .eviction_watch(&eviction)
///     .connect()
///     .await?;
/// if eviction.evicts() {
///     eprintln!("Redis evicts rate-limit states ({:?}): set maxmemory-policy noeviction", eviction.policy());
/// }
/// # let _ = store;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct EvictionWatch {
    last: Arc<Mutex<Option<EvictionPolicy>>>,
}

impl EvictionWatch {
    /// A watch with nothing read yet.
    ///
    /// ```
    /// let watch = ratewarden_redis::EvictionWatch::new();
    /// assert_eq!(watch.policy(), None);
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The policy last read, or `None` before the first read that got an answer.
    ///
    /// See the example on [`EvictionWatch`].
    #[must_use]
    pub fn policy(&self) -> Option<EvictionPolicy> {
        self.lock().clone()
    }

    /// Whether the policy last read [evicts](EvictionPolicy::evicts) this store's states.
    ///
    /// ```
    /// let watch = ratewarden_redis::EvictionWatch::new();
    /// assert!(!watch.evicts(), "nothing read yet");
    /// ```
    #[must_use]
    pub fn evicts(&self) -> bool {
        self.lock().as_ref().is_some_and(EvictionPolicy::evicts)
    }

    /// Records `policy`: the one it replaces.
    fn set(&self, policy: EvictionPolicy) -> Option<EvictionPolicy> {
        self.lock().replace(policy)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<EvictionPolicy>> {
        // One assignment at a time: a poisoned lock still holds a whole value.
        self.last.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Reads a store's policy and reports it, holding the store's connection weakly.
#[derive(Clone)]
pub(crate) struct Watcher {
    connection: WeakConnection,
    watch: EvictionWatch,
}

impl Watcher {
    pub(crate) fn new(connection: &Connection, watch: EvictionWatch) -> Self {
        Self {
            connection: connection.downgrade(),
            watch,
        }
    }

    /// Reads the policy now and reports it: `false` when the store is gone.
    pub(crate) async fn read(&self) -> bool {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("maxmemory-policy");
        // The query holds the store's connection until it ends, and no longer.
        let Some(query) = self.connection.query_masters(&cmd) else {
            return false;
        };
        // At least a second: no request waits on this read.
        let deadline = self.connection.timeout().max(Duration::from_secs(1));
        // No pooled connection, or no answer in time: nothing learnt.
        if let Ok(Ok(replies)) = tokio::time::timeout(deadline, query).await {
            self.report(&nodes(replies));
        }
        true
    }

    /// Reads every `period` from a task of its own, the first time after `period`, until the
    /// store is dropped. The task holds the store's connection only while it reads, and ends
    /// at the first tick after the store is gone (or with its runtime).
    pub(crate) fn spawn(self, runtime: &tokio::runtime::Handle, period: Duration) {
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                if !self.read().await {
                    return;
                }
            }
        });
    }

    fn report(&self, nodes: &[(Option<String>, Option<EvictionPolicy>)]) {
        for (node, policy) in nodes {
            if let Some(EvictionPolicy::Evicting { policy }) = policy {
                crate::log::evicting_policy(policy, node.as_deref());
            }
        }
        let Some(policy) = combine(nodes) else {
            return;
        };
        #[cfg(feature = "metrics")]
        match policy {
            EvictionPolicy::Evicting { .. } => {
                metrics::gauge!("ratewarden_redis_evicting_policy").set(1.0);
            }
            EvictionPolicy::NoEviction => {
                metrics::gauge!("ratewarden_redis_evicting_policy").set(0.0);
            }
            EvictionPolicy::Unknown { .. } => {}
        }
        let previous = self.watch.set(policy.clone());
        if let EvictionPolicy::Unknown { reason } = &policy
            && previous.as_ref() != Some(&policy)
        {
            crate::log::eviction_policy_unknown(reason);
        }
    }
}

/// Each server's policy, by its address on a cluster; `None` for one that did not answer.
fn nodes(replies: MasterReplies) -> Vec<(Option<String>, Option<EvictionPolicy>)> {
    replies
        .into_iter()
        .map(|(node, reply)| (node, policy(reply)))
        .collect()
}

/// The policy in one server's reply to `CONFIG GET maxmemory-policy`; `None` when the server
/// did not answer (down, busy, the cluster reconfiguring).
fn policy(reply: RedisResult<redis::Value>) -> Option<EvictionPolicy> {
    let value = match reply {
        Ok(value) => value,
        Err(error) => {
            return match crate::error::classify(error.clone()).kind() {
                StoreErrorKind::Timeout
                | StoreErrorKind::Connection
                | StoreErrorKind::Busy
                | StoreErrorKind::ClusterDown
                | StoreErrorKind::PoolExhausted
                | StoreErrorKind::ReadOnly => None,
                // NOPERM, an unknown command (renamed away), anything else the server says.
                _ => Some(EvictionPolicy::Unknown {
                    reason: error.to_string(),
                }),
            };
        }
    };
    // RESP2: ["maxmemory-policy", NAME]; RESP3: {"maxmemory-policy": NAME}.
    let name = match value {
        redis::Value::Array(items) => items.into_iter().nth(1),
        redis::Value::Map(pairs) => pairs.into_iter().next().map(|(_, name)| name),
        _ => None,
    };
    let name = match name {
        Some(redis::Value::BulkString(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
        Some(redis::Value::SimpleString(name)) => name,
        _ => {
            return Some(EvictionPolicy::Unknown {
                reason: "CONFIG GET maxmemory-policy returned no policy".to_owned(),
            });
        }
    };
    Some(EvictionPolicy::from_name(&name))
}

/// The servers' policies as one: evicting if any master evicts; else nothing learnt if any did
/// not answer; else unknown if any would not say; else `noeviction`.
fn combine(nodes: &[(Option<String>, Option<EvictionPolicy>)]) -> Option<EvictionPolicy> {
    let policies = || nodes.iter().map(|(_, policy)| policy);
    if let Some(evicting) = policies().flatten().find(|p| p.evicts()) {
        return Some(evicting.clone());
    }
    if nodes.is_empty() || policies().any(Option::is_none) {
        return None;
    }
    policies()
        .flatten()
        .find(|p| matches!(p, EvictionPolicy::Unknown { .. }))
        .cloned()
        .or(Some(EvictionPolicy::NoEviction))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use redis::aio::ConnectionManagerConfig;

    use super::{EvictionPolicy, EvictionWatch, Watcher, combine, policy};
    use crate::connection::{Connection, Link, Single};

    fn array(name: &str) -> redis::Value {
        redis::Value::Array(vec![
            redis::Value::BulkString(b"maxmemory-policy".to_vec()),
            redis::Value::BulkString(name.as_bytes().to_vec()),
        ])
    }

    #[test]
    fn every_policy_but_noeviction_evicts_our_states() {
        for name in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert!(EvictionPolicy::from_name(name).evicts(), "{name}");
        }
        assert_eq!(
            policy(Ok(array("noeviction"))),
            Some(EvictionPolicy::NoEviction)
        );
        let resp3 = redis::Value::Map(vec![(
            redis::Value::BulkString(b"maxmemory-policy".to_vec()),
            redis::Value::BulkString(b"allkeys-lru".to_vec()),
        )]);
        assert!(policy(Ok(resp3)).is_some_and(|p| p.evicts()));
    }

    #[test]
    fn a_refused_or_renamed_config_is_unknown_and_a_silent_server_is_nothing_learnt() {
        for (code, detail) in [
            (
                "NOPERM",
                "User limited has no permissions to run the 'config|get' command",
            ),
            (
                "ERR",
                "unknown command 'CONFIG', with args beginning with: ",
            ),
        ] {
            let error = redis::make_extension_error(code.into(), Some(detail.into()));
            let read = policy(Err(error));
            assert!(
                matches!(read, Some(EvictionPolicy::Unknown { .. })),
                "{read:?}"
            );
        }
        assert!(matches!(
            policy(Ok(redis::Value::Array(vec![]))),
            Some(EvictionPolicy::Unknown { .. })
        ));
        let down = redis::RedisError::from(std::io::Error::other("connection reset"));
        assert_eq!(policy(Err(down)), None);
    }

    #[test]
    fn one_evicting_master_makes_the_cluster_evicting() {
        let node = |policy: Option<EvictionPolicy>| (Some("127.0.0.1:7000".to_owned()), policy);
        let unknown = EvictionPolicy::Unknown { reason: "x".into() };
        let evicting = EvictionPolicy::from_name("volatile-lru");
        let safe = EvictionPolicy::NoEviction;
        assert_eq!(
            combine(&[node(Some(safe.clone())), node(Some(evicting.clone()))]),
            Some(evicting.clone())
        );
        assert_eq!(
            combine(&[node(None), node(Some(evicting.clone()))]),
            Some(evicting)
        );
        assert_eq!(combine(&[node(Some(safe.clone())), node(None)]), None);
        assert_eq!(
            combine(&[node(Some(safe.clone())), node(Some(unknown.clone()))]),
            Some(unknown)
        );
        assert_eq!(
            combine(&[node(Some(safe.clone())), node(Some(safe.clone()))]),
            Some(safe)
        );
        assert_eq!(combine(&[]), None);
    }

    #[tokio::test]
    async fn a_read_without_an_answer_keeps_what_was_read_before() {
        let watch = EvictionWatch::new();
        let connection = unreachable();
        let watcher = Watcher::new(&connection, watch.clone());
        watcher.report(&[(None, Some(EvictionPolicy::from_name("allkeys-lru")))]);
        watcher.report(&[(None, None)]);
        assert!(watch.evicts());
        watcher.report(&[(None, Some(EvictionPolicy::NoEviction))]);
        assert_eq!(watch.policy(), Some(EvictionPolicy::NoEviction));
    }

    /// A connection to a port where nothing listens.
    fn unreachable() -> Connection {
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(50)))
            .set_number_of_retries(0);
        let single = Single::new(client, config).unwrap();
        Connection::new(
            Link::Single(Arc::new(single)),
            Duration::from_millis(50),
            true,
        )
    }

    #[tokio::test]
    async fn the_periodic_read_ends_with_the_store() {
        let connection = unreachable();
        let watch = EvictionWatch::new();
        let watcher = Watcher::new(&connection, watch.clone());
        let weak = watcher.connection.clone();
        watcher.spawn(&tokio::runtime::Handle::current(), Duration::from_millis(5));
        // Reads fail (nothing listens), and the task goes on while the store lives: it holds
        // the watch's one other handle.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(Arc::strong_count(&watch.last), 2, "the task is running");
        drop(connection);
        // The task holds the connection only while a read runs (one may be running now): it
        // lets go within that read's deadline.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while weak.query_masters(&redis::cmd("PING")).is_some() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the task keeps the connection open"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        while Arc::strong_count(&watch.last) > 1 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the task outlived the store"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
