//! The connections to Redis: one multiplexed connection (the default), the cluster client's,
//! or a pool, each sending a command and reporting what went wrong.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use futures_util::FutureExt as _;
use futures_util::future::{BoxFuture, Shared};
use ratewarden_core::{StoreError, StoreErrorKind, Timestamp};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind};

use crate::error::classify;
use crate::script::{
    Entry, Invoke, LIBRARY, Ledger, Replies, batch_command, ledger_command, limits_command,
};

/// Where commands go.
#[derive(Clone)]
pub(crate) struct Connection {
    link: Link,
    functions: Arc<Functions>,
    /// The deadline of a call: a batch sent for checks that queued gives up then too.
    timeout: Duration,
}

/// Whether checks go by the library of Redis functions, and whether it is being loaded.
struct Functions {
    /// The server has none for this store (before 7.0, or a user not allowed them): scripts.
    unavailable: AtomicBool,
    /// A `FUNCTION LOAD` is on its way: one at a time.
    loading: AtomicBool,
    /// This user may not run scripts: a missing library is loaded before the check goes.
    no_scripts: AtomicBool,
}

/// How commands reach Redis.
#[derive(Clone)]
pub(crate) enum Link {
    Single(Arc<Single>),
    Cluster(Arc<LazyCluster>),
    Pool(deadpool_redis::Pool),
}

impl Connection {
    /// A connection over `link` whose calls give up after `timeout`; by Redis functions
    /// where the server has them, if `functions`, else by scripts.
    pub(crate) fn new(link: Link, timeout: Duration, functions: bool) -> Self {
        Self {
            link,
            functions: Arc::new(Functions {
                unavailable: AtomicBool::new(!functions),
                loading: AtomicBool::new(false),
                no_scripts: AtomicBool::new(false),
            }),
            timeout,
        }
    }

    /// Whether a batch must hold checks of one state only: on a pool or a cluster, where a
    /// state's queue is its own (and on a cluster a batch must stay within one slot).
    pub(crate) const fn one_state_per_batch(&self) -> bool {
        !matches!(self.link, Link::Single(_))
    }

    /// Whether the link is to a cluster, where the limits of one request go by slot.
    pub(crate) const fn is_cluster(&self) -> bool {
        matches!(self.link, Link::Cluster(_))
    }

    pub(crate) const fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs `entries` in one call, decided in their order: one entry by its algorithm's own
    /// check, several by the batch. Their replies, one per entry.
    pub(crate) async fn eval_batch(&self, entries: &[&Entry]) -> Result<Replies, StoreError> {
        match self.eval_script(entries).await? {
            redis::Value::BulkString(bytes) => Replies::new(bytes, entries.len()),
            other => Err(unexpected(&other)),
        }
    }

    /// Calls the library's function for `entries`. Where Redis lacks the library (a new
    /// server, a restart, a `FUNCTION FLUSH`, a node the slot just moved to) the call goes by
    /// the script while the library is loaded beside it; where Redis has no functions, by the
    /// script from then on. A script goes by `EVALSHA`, and by its source after `NOSCRIPT`:
    /// a library that cannot be loaded (a server out of memory) costs a check one more round
    /// trip, never its source sent again. A user who may not run scripts loads the missing
    /// library and calls it instead.
    async fn eval_script(&self, entries: &[&Entry]) -> Result<redis::Value, StoreError> {
        self.run_code(|invoke| batch_command(entries.iter().copied(), invoke))
            .await
    }

    /// Runs the limits of one request (each its own state, all in one slot) decided together
    /// (`lua/all.lua`): their replies, and the time Redis decided them at.
    pub(crate) async fn eval_limits(
        &self,
        entries: &[&Entry],
    ) -> Result<(Replies, Timestamp), StoreError> {
        let reply = self
            .run_code(|invoke| limits_command(entries, invoke, false))
            .await?;
        match reply {
            redis::Value::BulkString(bytes) => Replies::of_limits(bytes, entries.len()),
            other => Err(unexpected(&other)),
        }
    }

    /// Runs a call on reserved limits (`lua/reserve.lua`): a reservation's replies and time,
    /// or (settle, give back) nothing.
    pub(crate) async fn eval_ledger(
        &self,
        entries: &[(&Entry, u64, Option<u64>)],
        op: Ledger,
    ) -> Result<Option<(Replies, Timestamp)>, StoreError> {
        let reply = self
            .run_code(|invoke| ledger_command(entries, op, invoke))
            .await?;
        match (op, reply) {
            (Ledger::Reserve { .. }, redis::Value::BulkString(bytes)) => {
                Replies::of_limits(bytes, entries.len()).map(Some)
            }
            (Ledger::Reserve { .. }, other) => Err(unexpected(&other)),
            _ => Ok(None),
        }
    }

    /// Gives back what [`eval_limits`](Self::eval_limits) counted: `entries` in
    /// [`Mode::Refund`](crate::script::Mode::Refund).
    pub(crate) async fn refund_limits(&self, entries: &[&Entry]) -> Result<(), StoreError> {
        self.run_code(|invoke| limits_command(entries, invoke, true))
            .await
            .map(drop)
    }

    /// Runs the code `command` calls as an [`Invoke`] says: the library's function, or the
    /// script (see [`eval_script`](Self::eval_script)).
    async fn run_code(
        &self,
        command: impl Fn(Invoke) -> redis::Cmd,
    ) -> Result<redis::Value, StoreError> {
        let functions = || !self.functions.unavailable.load(Ordering::Relaxed);
        if functions() {
            match self.send(&command(Invoke::Function)).await? {
                Err(error) if function_missing(&error) => {
                    if self.functions.no_scripts.load(Ordering::Relaxed) {
                        return self.call_after_loading(&command).await;
                    }
                    self.load_library();
                }
                Err(error) if functions_unavailable(&error) => self.no_functions(&error),
                result => return result.map_err(classify),
            }
        }
        let result = match self.send(&command(Invoke::Sha)).await? {
            Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.send(&command(Invoke::Source)).await?
            }
            result => result,
        };
        match result {
            Err(error) if functions() && scripts_denied(&error) => {
                self.functions.no_scripts.store(true, Ordering::Relaxed);
                self.call_after_loading(&command).await
            }
            result => result.map_err(classify),
        }
    }

    /// Loads the library, and calls its function by `command`: for a user allowed functions
    /// but not scripts, when the library is missing. "Already exists" (loaded meanwhile) is
    /// success.
    async fn call_after_loading(
        &self,
        command: impl Fn(Invoke) -> redis::Cmd,
    ) -> Result<redis::Value, StoreError> {
        let _: RedisResult<redis::Value> = self.send(&LIBRARY.load()).await?;
        self.send(&command(Invoke::Function))
            .await?
            .map_err(classify)
    }

    /// Loads the library, from a task of its own (one at a time, within a second or the
    /// deadline of a call if longer: Redis compiles it then): the check that found it missing
    /// does not wait for it. "Already exists" (another gateway loaded it first, or a master of
    /// a cluster had it) is success.
    fn load_library(&self) {
        if self.functions.loading.swap(true, Ordering::AcqRel) {
            return;
        }
        /// Lets the next call load again when this load ends, even if its task never runs to
        /// its end (a runtime shutting down).
        struct Loaded(Arc<Functions>);
        impl Drop for Loaded {
            fn drop(&mut self) {
                self.0.loading.store(false, Ordering::Release);
            }
        }
        let this = self.clone();
        let loaded = Loaded(Arc::clone(&self.functions));
        tokio::spawn(async move {
            let _loaded = loaded;
            let load = LIBRARY.load();
            let load = this.send::<redis::Value>(&load);
            let deadline = this.timeout.max(Duration::from_secs(1));
            if let Ok(Ok(Err(error))) = tokio::time::timeout(deadline, load).await
                && functions_unavailable(&error)
            {
                this.no_functions(&error);
            }
        });
    }

    fn no_functions(&self, error: &RedisError) {
        if !self.functions.unavailable.swap(true, Ordering::Relaxed) {
            crate::log::functions_unavailable(error);
        }
    }

    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        self.send(cmd).await?.map_err(classify)
    }

    /// Sends `cmd`; the outer error is a pooled connection not to be had.
    async fn send<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<RedisResult<T>, StoreError> {
        // Each arm's future is boxed: their sizes differ by kilobytes (the cluster client's is
        // the largest), and a check's future would otherwise be as large as the largest.
        Ok(match &self.link {
            Link::Single(single) => Box::pin(single.query(cmd)).await,
            Link::Cluster(lazy) => Box::pin(lazy.query(cmd)).await,
            Link::Pool(pool) => {
                let mut connection = Box::pin(checkout(pool)).await?;
                let result = Box::pin(cmd.query_async(&mut connection)).await;
                if result.as_ref().is_err_and(is_read_only) {
                    // A replica now (a failover behind a DNS name or VIP): this connection
                    // leaves the pool, and the pool opens another, to whoever the address
                    // names now.
                    drop(deadpool_redis::Connection::take(connection));
                }
                result
            }
        })
    }
}

/// The error of a script's reply that is not what the scripts send.
fn unexpected(reply: &redis::Value) -> StoreError {
    let shown: String = format!("{reply:?}").chars().take(200).collect();
    StoreError::with_source(
        StoreErrorKind::Script,
        format!("unexpected script reply {shown}"),
    )
}

/// Every reply of [`WeakConnection::query_masters`]: each server's, named by its address on a
/// cluster (`None`: the one server, or a cluster that could not be asked at all).
pub(crate) type MasterReplies = Vec<(Option<String>, RedisResult<redis::Value>)>;

impl Connection {
    /// This connection, held without keeping it open: for a task that must end with the
    /// store (see [`crate::eviction`]).
    pub(crate) fn downgrade(&self) -> WeakConnection {
        let link = match &self.link {
            Link::Single(single) => WeakLink::Single(Arc::downgrade(single)),
            Link::Cluster(lazy) => WeakLink::Cluster(Arc::downgrade(lazy)),
            Link::Pool(pool) => {
                let weak = pool.weak();
                WeakLink::Pool(Arc::new(move |cmd: redis::Cmd| {
                    let pool = weak.upgrade()?;
                    Some(
                        async move {
                            let mut connection = pool.get().await.map_err(pool_error)?;
                            Ok(cmd.query_async(&mut *connection).await)
                        }
                        .boxed(),
                    )
                }))
            }
        };
        WeakConnection {
            link,
            timeout: self.timeout,
        }
    }
}

/// A [`Connection`] that keeps nothing open: once every clone of the store is dropped, its
/// queries find nothing, and the connections have closed.
#[derive(Clone)]
pub(crate) struct WeakConnection {
    link: WeakLink,
    timeout: Duration,
}

type PooledReply = BoxFuture<'static, Result<RedisResult<redis::Value>, StoreError>>;

#[derive(Clone)]
enum WeakLink {
    Single(Weak<Single>),
    Cluster(Weak<LazyCluster>),
    /// A query through the pool, while it lives: deadpool's weak pool comes back as a pool of
    /// its plain objects, not a `deadpool_redis::Pool`, and is not `Clone`.
    Pool(Arc<dyn Fn(redis::Cmd) -> Option<PooledReply> + Send + Sync>),
}

impl WeakConnection {
    pub(crate) const fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs `cmd` on the server, or on every master of a cluster (for `CONFIG GET`, which the
    /// cluster client would send to one node at random), while a store still holds the
    /// connection; `None` once none does. The query holds the connection until it ends.
    pub(crate) fn query_masters(
        &self,
        cmd: &redis::Cmd,
    ) -> Option<BoxFuture<'static, Result<MasterReplies, StoreError>>> {
        let cmd = cmd.clone();
        Some(match &self.link {
            WeakLink::Single(single) => {
                let single = single.upgrade()?;
                async move { Ok(vec![(None, single.query(&cmd).await)]) }.boxed()
            }
            WeakLink::Cluster(lazy) => {
                let lazy = lazy.upgrade()?;
                async move {
                    Ok(match lazy.query_masters(&cmd).await {
                        Ok(replies) => replies
                            .into_iter()
                            .map(|(node, reply)| (Some(node), reply))
                            .collect(),
                        Err(error) => vec![(None, Err(error))],
                    })
                }
                .boxed()
            }
            WeakLink::Pool(query) => {
                let reply = query(cmd)?;
                async move { Ok(vec![(None, reply.await?)]) }.boxed()
            }
        })
    }
}

/// `FCALL` of a function the server does not have: its library is to be loaded.
fn function_missing(error: &RedisError) -> bool {
    error.code() == Some("ERR") && error.detail() == Some("Function not found")
}

/// The server has no functions for this store: an unknown command (a version before 7.0, a
/// command renamed away, a proxy that does not pass it on), or one this user may not run.
fn functions_unavailable(error: &RedisError) -> bool {
    let detail = error.detail().unwrap_or_default();
    (error.code() == Some("ERR")
        && (detail.starts_with("unknown command") || detail.starts_with("unsupported command")))
        || (error.code() == Some("NOPERM")
            && (detail.contains("'fcall'") || detail.contains("'function")))
}

/// `EVALSHA` or `EVAL` this user may not run.
fn scripts_denied(error: &RedisError) -> bool {
    let detail = error.detail().unwrap_or_default();
    error.code() == Some("NOPERM") && (detail.contains("'evalsha'") || detail.contains("'eval'"))
}

fn is_read_only(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

/// Whether the server refused the connection itself: credentials, or its client limit.
fn failed_to_connect(error: &RedisError) -> bool {
    error.kind() == ErrorKind::AuthenticationFailed
        || error.code() == Some("WRONGPASS")
        || error.to_string().contains("max number of clients")
}

async fn checkout(pool: &deadpool_redis::Pool) -> Result<deadpool_redis::Connection, StoreError> {
    pool.get().await.map_err(pool_error)
}

fn pool_error(error: deadpool_redis::PoolError) -> StoreError {
    match error {
        deadpool_redis::PoolError::Backend(error) => classify(error),
        deadpool_redis::PoolError::Timeout(deadpool_redis::TimeoutType::Wait) => {
            StoreError::with_source(StoreErrorKind::PoolExhausted, error)
        }
        deadpool_redis::PoolError::Timeout(_) => {
            StoreError::with_source(StoreErrorKind::Timeout, error)
        }
        other => StoreError::with_source(StoreErrorKind::Connection, other),
    }
}

/// One multiplexed connection that reconnects by itself (redis-rs's `ConnectionManager`), and
/// is replaced when the server turns out to be a replica.
pub(crate) struct Single {
    client: redis::Client,
    config: ConnectionManagerConfig,
    /// The manager in use, and how many were replaced before it.
    current: RwLock<(u64, ConnectionManager)>,
}

impl Single {
    pub(crate) fn new(client: redis::Client, config: ConnectionManagerConfig) -> RedisResult<Self> {
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?;
        Ok(Self {
            client,
            config,
            current: RwLock::new((0, manager)),
        })
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        let (generation, mut manager) = self
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match cmd.query_async(&mut manager).await {
            // The error may be the old connection's: the manager has begun reconnecting on
            // seeing it, so one more try (within the same deadline) reaches a Redis that is
            // back, rather than leaving the circuit breaker's probe to fail on it.
            Err(error) if error.is_connection_dropped() || error.is_io_error() => {
                cmd.query_async(&mut manager).await
            }
            Err(error) if is_read_only(&error) => {
                // The server was demoted (a failover behind a DNS name or VIP): the manager
                // would keep talking to it, since the connection itself is fine. A new one
                // connects to whoever the address names now.
                self.replace(generation);
                Err(error)
            }
            Err(error) if failed_to_connect(&error) => {
                // The manager reconnects after I/O errors only: a connection refused by the
                // server (a wrong password, no room for another client) would stay refused
                // after the server is fixed. A new manager connects anew on the next call.
                self.replace(generation);
                Err(error)
            }
            result => result,
        }
    }

    /// Replaces the manager of `generation` with a new one (once, whoever asks first).
    fn replace(&self, generation: u64) {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        if current.0 != generation {
            return;
        }
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone()) {
            Ok(manager) => *current = (generation + 1, manager),
            Err(error) => crate::log::replica_not_replaced(&error),
        }
    }
}

type Connecting = Shared<BoxFuture<'static, Result<ClusterConnection, Arc<RedisError>>>>;

/// The cluster client connects on first use (it has no lazy mode of its own). One attempt at
/// a time, shared by every call waiting for it, and carried on by a task of its own: a call
/// that gives up at its deadline does not cancel it, and the calls after it wait for the same
/// attempt instead of starting one each.
pub(crate) struct LazyCluster {
    client: redis::cluster::ClusterClient,
    state: Mutex<ClusterState>,
}

enum ClusterState {
    Idle,
    Connecting(Connecting),
    Ready(ClusterConnection),
}

impl LazyCluster {
    pub(crate) const fn new(client: redis::cluster::ClusterClient) -> Self {
        Self {
            client,
            state: Mutex::new(ClusterState::Idle),
        }
    }

    async fn connection(&self) -> RedisResult<ClusterConnection> {
        let attempt = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            match &*state {
                ClusterState::Ready(connection) => return Ok(connection.clone()),
                ClusterState::Connecting(attempt) => attempt.clone(),
                ClusterState::Idle => {
                    let client = self.client.clone();
                    let task = tokio::spawn(async move { client.get_async_connection().await });
                    let attempt = async move {
                        match task.await {
                            Ok(result) => result.map_err(Arc::new),
                            Err(joined) => Err(Arc::new(RedisError::from(std::io::Error::other(
                                joined.to_string(),
                            )))),
                        }
                    }
                    .boxed()
                    .shared();
                    *state = ClusterState::Connecting(attempt.clone());
                    attempt
                }
            }
        };
        let result = attempt.clone().await;
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // Whoever sees the attempt end first records it; a failed one lets the next call try.
        if let ClusterState::Connecting(current) = &*state
            && current.ptr_eq(&attempt)
        {
            *state = match &result {
                Ok(connection) => ClusterState::Ready(connection.clone()),
                Err(_) => ClusterState::Idle,
            };
        }
        result.map_err(|error| (*error).clone())
    }

    /// Runs `cmd` on every master: each one's reply (a server's error reply among them), by
    /// its address.
    async fn query_masters(
        &self,
        cmd: &redis::Cmd,
    ) -> RedisResult<Vec<(String, RedisResult<redis::Value>)>> {
        use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
        let mut connection = self.connection().await?;
        // No response policy: the client answers a map of each node's address to its reply.
        let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        Ok(
            match connection.route_command(cmd.clone(), routing).await? {
                redis::Value::Map(replies) => replies
                    .into_iter()
                    .map(|(node, reply)| {
                        let node = match node {
                            redis::Value::BulkString(bytes) => {
                                String::from_utf8_lossy(&bytes).into_owned()
                            }
                            other => format!("{other:?}"),
                        };
                        (node, reply.extract_error())
                    })
                    .collect(),
                other => vec![(String::new(), Ok(other))],
            },
        )
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        use redis::cluster_routing::SingleNodeRoutingInfo;
        let mut connection = self.connection().await?;
        let mut result = cmd.query_async(&mut connection).await;
        // Redirects are followed here, not by the client (it follows none: `retries(0)`).
        // The client follows `ASK` by sending `ASKING` and the command separately on a
        // shared connection, where another request's command can slip in between and use
        // up the `ASKING`: the command is then answered `MOVED`, back to the node that
        // answered `ASK`, and checks of a migrating slot went round until their deadline.
        // Sent as one pipeline, the pair stays together. A redirect is followed at most
        // `REDIRECTS` times (a slot moved, then asked for on its new node).
        for _ in 0..REDIRECTS {
            let Err(error) = &result else {
                break;
            };
            let asking = match error.kind() {
                ErrorKind::Server(ServerErrorKind::Ask) => true,
                ErrorKind::Server(ServerErrorKind::Moved) => false,
                _ => break,
            };
            let Some((host, port)) = error
                .redirect_node()
                .and_then(|(node, _)| node.rsplit_once(':'))
                .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
            else {
                break;
            };
            let mut pipeline = redis::pipe();
            if asking {
                pipeline.cmd("ASKING");
            }
            pipeline.add_command(cmd.clone());
            let route = SingleNodeRoutingInfo::ByAddress { host, port };
            let offset = usize::from(asking);
            let mut replies = connection
                .route_pipeline(pipeline, offset, 1, route)
                .await?;
            result = match replies.pop() {
                // A server error in a pipeline comes back as a value: make it an error
                // again (`NOSCRIPT` must read as such, so that the script is sent whole).
                Some(reply) => reply
                    .extract_error()
                    .and_then(|reply| redis::from_redis_value(reply).map_err(Into::into)),
                None => break,
            };
        }
        result
    }
}

/// Redirects (`ASK`, `MOVED`) a cluster command follows before its error is answered: a
/// slot moved, then asked for on its new node while it migrates on.
const REDIRECTS: usize = 3;
