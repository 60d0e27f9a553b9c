//! [`MeshStore`]: a [`Node`] over a UDP socket, its gossip on a tokio task of its own, as a
//! [`Store`]. A check locks the node for the time of one decision and never awaits the
//! network.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ratewarden_core::{
    Clock, Decision, Decisions, Key, Limit, MAX_LIMITS, MonotonicClock, Quota, Reservation, Store,
    StoreError, StoreErrorKind, Timestamp,
};
use sha2::{Digest, Sha256};
use tokio::net::UdpSocket;

use crate::node::{Config, Dropped, Mode, Node, Sent, ShortSecret};
use crate::wire::NodeId;

/// Gossip intervals [`MeshStore::leave`] waits at most for its shares to be taken.
const PARTING_ROUNDS: u32 = 50;

/// A gateway's id from its mesh address: for IPv4 the address and port packed (readable in
/// hex), for IPv6 the first 63 bits of a SHA-256 of both (the top bit set, so never an IPv4
/// gateway's id).
///
/// ```
/// use ratewarden_mesh::node_id;
/// let a = node_id("127.0.0.1:7000".parse()?);
/// assert_eq!(a, 0x7f00_0001_1b58);
/// assert_ne!(a, node_id("127.0.0.1:7001".parse()?));
/// assert_ne!(node_id("[2001:db8::1]:7000".parse()?), node_id("[2001:db8::2]:7000".parse()?));
/// # Ok::<(), std::net::AddrParseError>(())
/// ```
#[must_use]
pub fn node_id(addr: SocketAddr) -> NodeId {
    match addr {
        SocketAddr::V4(v4) => (u64::from(v4.ip().to_bits()) << 16) | u64::from(v4.port()),
        SocketAddr::V6(v6) => {
            let digest = Sha256::new()
                .chain_update(v6.ip().octets())
                .chain_update(v6.port().to_be_bytes())
                .finalize();
            let mut first = [0_u8; 8];
            first.copy_from_slice(&digest[..8]);
            u64::from_be_bytes(first) | (1 << 63)
        }
    }
}

/// The IPv4 address and port an id holds ([`node_id`]); `None` for an IPv6 gateway's.
fn ipv4(id: NodeId) -> Option<SocketAddr> {
    if id >> 48 != 0 {
        return None;
    }
    let ip = std::net::Ipv4Addr::from_bits(u32::try_from(id >> 16).ok()?);
    Some(SocketAddr::from((ip, u16::try_from(id & 0xffff).ok()?)))
}

/// Builds a [`MeshStore`]: its address, its peers' and the shared secret.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use ratewarden_mesh::{MeshStore, Mode};
/// let store = MeshStore::builder("127.0.0.1:7001".parse()?)
///     .peers(["127.0.0.1:7002".parse()?, "127.0.0.1:7003".parse()?])
///     .mode(Mode::Escrow)
///     .secret(b"a secret every gateway shares")?
///     .bind()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use]
pub struct MeshBuilder {
    addr: SocketAddr,
    peers: Vec<SocketAddr>,
    joining: bool,
    config: Config,
    interval: Duration,
    sealed: bool,
}

impl MeshBuilder {
    /// The other founders' mesh addresses: the mesh is founded by these and this gateway,
    /// which share each quota equally at first (each founder must be given the same ones).
    /// Gateways added later [join](Self::join); every member learns of them (SWIM).
    pub fn peers(mut self, peers: impl IntoIterator<Item = SocketAddr>) -> Self {
        self.peers.extend(peers);
        self
    }

    /// Joins a running mesh through `seeds`, some of its members' mesh addresses, instead of
    /// founding one ([`Node::join`]): this gateway holds no share of any quota until its
    /// peers give it one as it asks, so adding it never lifts what the mesh admits. A joining
    /// gateway binds an IPv4 address (a member's id holds its IPv4 address and port, so
    /// members reach one they learn of by its id; an IPv6 address's id is a digest).
    ///
    /// ```no_run
    /// # async fn run() -> std::io::Result<()> {
    /// use ratewarden_mesh::MeshStore;
    /// let store = MeshStore::builder("10.0.0.4:7946".parse().unwrap())
    ///     .join(["10.0.0.1:7946".parse().unwrap()])
    ///     .secret(b"the mesh's shared secret")
    ///     .expect("16 bytes or more")
    ///     .bind()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn join(mut self, seeds: impl IntoIterator<Item = SocketAddr>) -> Self {
        self.peers.extend(seeds);
        self.joining = true;
        self
    }

    /// How gateways share each quota (default [`Mode::Escrow`]).
    pub const fn mode(mut self, mode: Mode) -> Self {
        self.config.mode = mode;
        self
    }

    /// How often gossip goes out (default 100 ms; at least 1 ms).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// The node's settings (fanout, datagram size, slots, and its mode: of [`mode`](Self::mode)
    /// and this, the one called last decides). A secret given before is kept; the config's
    /// sequence numbers and incarnation are replaced by the time at [`bind`](Self::bind).
    pub fn config(mut self, config: Config) -> Self {
        let sealed = self.config.clone();
        self.config = config;
        if self.sealed {
            self.config.take_sealer(sealed);
        }
        self
    }

    /// The secret every gateway of the mesh shares (at least 16 bytes): every datagram is
    /// sealed with HMAC-SHA256 under it, and one that is not, or is replayed, is dropped.
    ///
    /// # Errors
    ///
    /// [`ShortSecret`] for a shorter secret.
    pub fn secret(mut self, secret: &[u8]) -> Result<Self, ShortSecret> {
        self.config = self.config.secret(secret)?;
        self.sealed = true;
        Ok(self)
    }

    /// Binds the socket and starts gossiping (on the current tokio runtime).
    ///
    /// # Errors
    ///
    /// An [`io::Error`] if the address cannot be bound, or
    /// [`io::ErrorKind::InvalidInput`] without a [secret](Self::secret).
    pub async fn bind(self) -> io::Result<MeshStore> {
        if !self.sealed {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a mesh needs a secret: strangers could inject consumption without one",
            ));
        }
        if self.addr.ip().is_unspecified() {
            // Peers know a gateway by the address they send to; one bound to every interface
            // would call itself by another and drop all they send as from strangers.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a mesh gateway binds the address its peers know it by, not an unspecified one",
            ));
        }
        if self.joining && !self.addr.is_ipv4() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a joining gateway binds an IPv4 address: members reach one they learn of by \
                 its id, which holds an IPv4 address and port (an IPv6 one is a digest)",
            ));
        }
        let socket = Arc::new(UdpSocket::bind(self.addr).await?);
        let addr = socket.local_addr()?;
        let id = node_id(addr);
        let addresses: HashMap<NodeId, SocketAddr> = self
            .peers
            .iter()
            .map(|&peer| (node_id(peer), peer))
            .chain([(id, addr)])
            .collect();
        let members: Vec<NodeId> = addresses.keys().copied().collect();
        let mut config = self.config;
        // Both above what this gateway's run before used (time has moved on).
        config.first_sequence = sequence_start();
        config.incarnation = config.first_sequence;
        config.discover = true;
        config.interval = self.interval;
        let node = if self.joining {
            Node::join(id, &members, config)
        } else {
            Node::new(id, &members, config)
        };
        let shared = Arc::new(Shared {
            node: Mutex::new(node),
            clock: MonotonicClock::new(),
            interval: self.interval,
            addr,
            socket,
            addresses: Mutex::new(addresses),
        });
        let task = tokio::spawn(gossip(Arc::clone(&shared)));
        Ok(MeshStore {
            shared,
            _task: Arc::new(Task(task.abort_handle())),
        })
    }
}

impl Config {
    /// Keeps `other`'s secret in this config.
    fn take_sealer(&mut self, other: Self) {
        self.sealer = other.sealer;
    }
}

/// Sequence numbers start at the time in microseconds, so a gateway that restarts starts
/// above where it stopped.
fn sequence_start() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[derive(Debug)]
struct Shared {
    node: Mutex<Node>,
    clock: MonotonicClock,
    interval: Duration,
    addr: SocketAddr,
    socket: Arc<UdpSocket>,
    /// Members' addresses: those given, and those members sent from.
    addresses: Mutex<HashMap<NodeId, SocketAddr>>,
}

impl Shared {
    fn node(&self) -> std::sync::MutexGuard<'_, Node> {
        // A panic while holding the lock leaves a consistent node: every step is one call.
        self.node.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn addresses(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, SocketAddr>> {
        self.addresses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `out` to each member's address (a member known only by its id: the IPv4
    /// address and port it holds).
    async fn send(&self, out: Vec<crate::Outgoing>) {
        for datagram in out {
            let addr = self.addresses().get(&datagram.to).copied();
            if let Some(addr) = addr.or_else(|| ipv4(datagram.to)) {
                // A datagram that cannot be sent is as lost: the protocol repairs it.
                let _ = self.socket.send_to(&datagram.bytes, addr).await;
            }
        }
    }
}

/// Aborts the gossip task when the last clone of the store is dropped.
#[derive(Debug)]
struct Task(tokio::task::AbortHandle);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Slots a step of a round visits ([`Node::advance_round`]): tens of µs a step.
const SLOTS_A_STEP: usize = 256;

/// Receives datagrams and ticks, until aborted.
async fn gossip(shared: Arc<Shared>) {
    let socket = &shared.socket;
    let mut ticks = tokio::time::interval(shared.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut buf = vec![0_u8; 65_536];
    // Whether a round is under way: it goes on a step at a time, datagrams received
    // between its steps.
    let mut under_way = false;
    loop {
        tokio::select! {
            received = socket.recv_from(&mut buf) => {
                if let Ok((len, from)) = received {
                    let now = shared.clock.now();
                    // Malformed datagrams are counted by the node.
                    let mut node = shared.node();
                    let _ = node.receive(now, &buf[..len]);
                    // A member's address is the one it sends from (a member let in by SWIM
                    // first sends to its seeds, so they reach it over IPv6 too).
                    let id = node_id(from);
                    if node.members().contains(&id) {
                        drop(node);
                        shared.addresses().entry(id).or_insert(from);
                    }
                }
            }
            _ = ticks.tick(), if !under_way => under_way = true,
            () = std::future::ready(()), if under_way => {
                // A round visits every slot held: a few at a time, the lock let go between
                // steps, so that checks wait on a step, not on the round. Its datagrams are
                // sealed once the lock is let go.
                let now = shared.clock.now();
                let step = shared.node().advance_round_unsealed(now, SLOTS_A_STEP);
                if let Some(out) = step {
                    under_way = false;
                    shared.send(out.seal()).await;
                }
                // Checks waiting on the lock take it before the next step.
                tokio::task::yield_now().await;
            }
        }
    }
}

/// A [`Store`] shared by a fleet of gateways without a central server: each decides in its
/// own memory ([`Node`]) and exchanges what it counted with its peers over UDP, sealed under
/// a shared secret. Clones share one node and one socket; the gossip stops when the last is
/// dropped.
///
/// Decides every algorithm but the sliding log, one limit or several together
/// ([`check_all`](Store::check_all): all counted or none), and reserves them
/// ([`reserve`](Store::reserve), [`settle`](Store::settle), [`renew`](Store::renew),
/// [`refund`](Store::refund); see [`Node::reserve`]). The window algorithms count in windows
/// of the wall clock (read once, at start), so gateways' windows line up as far as their
/// clocks do. The sliding log answers [`StoreErrorKind::Unsupported`], and so do
/// [`reset`](Store::reset) and [`give_back`](Store::give_back) (a gateway cannot take back
/// what its peers counted).
#[derive(Clone, Debug)]
pub struct MeshStore {
    shared: Arc<Shared>,
    _task: Arc<Task>,
}

impl MeshStore {
    /// Starts building a store whose socket binds `addr` (port 0: any free port).
    pub fn builder(addr: SocketAddr) -> MeshBuilder {
        MeshBuilder {
            addr,
            peers: Vec::new(),
            joining: false,
            config: Config::new(Mode::Escrow),
            interval: Duration::from_millis(100),
            sealed: false,
        }
    }

    /// The address the socket is bound to.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// This gateway's id ([`node_id`] of its address).
    #[must_use]
    pub fn id(&self) -> NodeId {
        self.shared.node().id()
    }

    /// The mesh's members (the founders, then those that joined since, as this gateway
    /// learnt of them), heard from or not, gone or not.
    #[must_use]
    pub fn members(&self) -> Vec<NodeId> {
        self.shared.node().members().to_vec()
    }

    /// Leaves the mesh (call it before stopping a gateway for good): the members are told,
    /// and take this gateway as gone at once; from now on it admits nothing, and in escrow
    /// mode hands the shares it holds to the live members ([`Node::leave`]). Returns once
    /// they have taken them ([`Node::parted`]), or after 50 gossip intervals (5 s at the
    /// default; a share not taken by then stays unused until this gateway's id comes
    /// back).
    ///
    /// ```no_run
    /// # async fn run(store: ratewarden_mesh::MeshStore) {
    /// store.leave().await;
    /// # }
    /// ```
    pub async fn leave(&self) {
        let now = self.shared.clock.now();
        let out = self.shared.node().leave(now);
        self.shared.send(out).await;
        for _ in 0..PARTING_ROUNDS {
            if self.shared.node().parted() {
                return;
            }
            tokio::time::sleep(self.shared.interval).await;
        }
    }

    /// The members heard from lately, this one among them: in the last `2 × (n − 1) + 3`
    /// gossip intervals. Each round reaches one peer in turn (beside `fanout` at random), so
    /// a live member is left out only when two of its rounds in turn, and every other
    /// datagram from it for as long, are lost.
    #[must_use]
    pub fn live(&self) -> Vec<NodeId> {
        let now = self.shared.clock.now().as_nanos();
        let rounds = {
            let node = self.shared.node();
            let others = u32::try_from(node.members().len() - 1).unwrap_or(u32::MAX);
            2 * others + 3
        };
        let window = u64::try_from((self.shared.interval * rounds).as_nanos()).unwrap_or(u64::MAX);
        let since = Timestamp::from_nanos(now.saturating_sub(window));
        self.shared.node().live(since)
    }

    /// Whether a gateway made a founder with another list of peers was heard
    /// ([`Node::founders_disagree`]): this gateway then holds no first share of any quota;
    /// restart the founders with the same peers.
    ///
    /// ```no_run
    /// # fn run(store: ratewarden_mesh::MeshStore) {
    /// if store.founders_disagree() {
    ///     eprintln!("this gateway's mesh peers differ from its co-founders'");
    /// }
    /// # }
    /// ```
    #[must_use]
    pub fn founders_disagree(&self) -> bool {
        self.shared.node().founders_disagree()
    }

    /// Datagrams dropped so far, by reason.
    #[must_use]
    pub fn dropped(&self) -> Dropped {
        self.shared.node().dropped()
    }

    /// Rounds, datagrams and bytes sent so far (what a round costs: [`Sent`]).
    #[must_use]
    pub fn sent(&self) -> Sent {
        self.shared.node().sent()
    }

    fn decide(&self, key: &Key, quota: &Quota, cost: u32) -> Result<Decision, StoreError> {
        supported(quota)?;
        let now = self.shared.clock.now();
        self.shared
            .node()
            .check(now, key, quota, cost)
            .map_err(full)
    }

    fn decide_all(&self, limits: &[Limit]) -> Result<Decisions, StoreError> {
        all_supported(limits)?;
        let now = self.shared.clock.now();
        self.shared.node().check_all(now, limits).map_err(full)
    }

    fn hold(&self, limits: &[Limit], hold: Duration) -> Result<Reservation, StoreError> {
        all_supported(limits)?;
        let now = self.shared.clock.now();
        self.shared.node().reserve(now, limits, hold).map_err(full)
    }

    fn charge(&self, reservation: &Reservation, actual: u32) {
        if reservation.held().is_empty() {
            return;
        }
        let now = self.shared.clock.now();
        self.shared.node().settle(now, reservation.held(), actual);
    }
}

fn all_supported(limits: &[Limit]) -> Result<(), StoreError> {
    if limits.len() > MAX_LIMITS {
        return Err(StoreError::with_source(
            StoreErrorKind::InvalidInput,
            "more than 16 limits in one check",
        ));
    }
    limits.iter().try_for_each(|limit| supported(limit.quota()))
}

fn supported(quota: &Quota) -> Result<(), StoreError> {
    if crate::supports(quota.algorithm()) {
        Ok(())
    } else {
        Err(StoreError::with_source(
            StoreErrorKind::Unsupported,
            "the mesh keeps no sliding log: use the sliding window counter",
        ))
    }
}

fn full(full: crate::Full) -> StoreError {
    StoreError::with_source(StoreErrorKind::OutOfMemory, full.to_string())
}

impl Store for MeshStore {
    async fn check(&self, key: &Key, quota: &Quota, cost: u32) -> Result<Decision, StoreError> {
        self.decide(key, quota, cost)
    }

    fn check_ready(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
    ) -> Option<Result<Decision, StoreError>> {
        Some(self.decide(key, quota, cost))
    }

    async fn check_all(&self, limits: &[Limit]) -> Result<Decisions, StoreError> {
        self.decide_all(limits)
    }

    /// Always decides at once.
    fn check_all_ready(&self, limits: &[Limit]) -> Option<Result<Decisions, StoreError>> {
        Some(self.decide_all(limits))
    }

    async fn reserve(&self, limits: &[Limit], hold: Duration) -> Result<Reservation, StoreError> {
        self.hold(limits, hold)
    }

    async fn settle(&self, reservation: Reservation, actual: u32) -> Result<(), StoreError> {
        self.charge(&reservation, actual);
        Ok(())
    }

    /// Always settles at once.
    fn settle_ready(
        &self,
        reservation: Reservation,
        actual: u32,
    ) -> Result<Result<(), StoreError>, Reservation> {
        self.charge(&reservation, actual);
        Ok(Ok(()))
    }

    async fn renew(&self, held: &[(Limit, u64)], hold: Duration) -> Result<(), StoreError> {
        let now = self.shared.clock.now();
        self.shared.node().renew(now, held, hold);
        Ok(())
    }

    async fn refund(&self, key: &Key, quota: &Quota, units: u32) -> Result<(), StoreError> {
        supported(quota)?;
        let now = self.shared.clock.now();
        self.shared.node().refund(now, key, quota, units);
        Ok(())
    }

    async fn peek(&self, key: &Key, quota: &Quota) -> Result<Decision, StoreError> {
        let now = self.shared.clock.now();
        Ok(self.shared.node().peek(now, key, quota))
    }

    async fn reset(&self, _: &Key, _: &Quota) -> Result<(), StoreError> {
        Err(StoreError::with_source(
            StoreErrorKind::Unsupported,
            "a mesh gateway cannot take back what its peers counted",
        ))
    }
}
