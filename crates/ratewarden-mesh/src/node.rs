//! [`Node`]: one gateway's side of the mesh, sans-IO. It is fed checks, datagrams and ticks
//! with the time, and returns decisions and datagrams to send; it never reads a clock, a
//! socket or a random source of its own (its random peer choices come from a seed).

use hashbrown::HashMap;
use indexmap::IndexMap;
use indexmap::map::Entry as SlotEntry;
use std::collections::VecDeque;
use std::time::Duration;

use ratewarden_core::{
    Algorithm, Decision, Decisions, Info, Key, Limit, Quota, Reservation, Timestamp, merged,
};

use crate::bucket::{Admit, MICRO, OwingBucket, ShareBucket, WHOLE};
use crate::membership::{self, Change, Membership};
use crate::seal::{self, MIN_SECRET, Sealer, Window};
use crate::window::may_weigh;
use crate::wire::{Ack, Datagram, Entry, NodeId, Slot, Transfer, WireError, Written};

/// How gateways share a quota.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Each gateway decides on the whole quota, charged with its own admissions at once and
    /// with its peers' as gossip brings them. Admits above the quota by what the other
    /// gateways admit during one propagation delay (see the crate docs).
    Eventual,
    /// Each gateway spends only its share of the quota; shares follow demand, moved by
    /// being given. Never admits above the quota.
    #[default]
    Escrow,
}

/// A [`Node`]'s settings.
///
/// ```
/// use ratewarden_mesh::{Config, Mode};
/// let config = Config::new(Mode::Escrow);
/// assert_eq!(config.fanout, 3);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// How gateways share each quota.
    pub mode: Mode,
    /// Peers each round's gossip goes to, chosen at random (all of them when there are fewer).
    pub fanout: usize,
    /// Rounds an entry is relayed after it changed; `None`: `ceil(log2 n) + 2` for `n` members.
    pub relay_rounds: Option<u8>,
    /// The largest datagram sent, in bytes.
    pub max_datagram: usize,
    /// Slots (key and quota) kept at most; a check of a new key beyond is refused with
    /// [`Full`], an entry about one is dropped and counted. Slots at rest are forgotten
    /// (see the crate docs).
    pub max_slots: usize,
    /// Entries no longer relayed (any origin's), resent each round (round robin over the
    /// slots), so a view that missed an update or was cut off is repaired.
    pub repair_per_round: usize,
    /// Seeds the random choice of peers.
    pub seed: u64,
    /// The first sequence number this gateway seals a datagram to each peer with; a peer
    /// drops numbers it has seen or older than the last 1,024 it was sent, so a gateway that
    /// restarts starts above where it stopped (the time in microseconds, say; one that does
    /// not moves above what a peer last took from it once it hears that peer).
    pub first_sequence: u64,
    /// This run of the gateway: a gateway that restarts takes a higher one (the time in
    /// microseconds, say, which grows faster than rounds: escrow versions are the
    /// incarnation plus the round; one that does not moves above what its peers last saw
    /// once it hears them). Peers that hear a member's higher incarnation know the one
    /// before is gone: escrow peers settle what they and it had given each other (the
    /// restarted gateway holds its first share again), transfers to or from the one before
    /// are void, and datagrams from it are dropped and counted ([`Dropped::stale`]).
    pub incarnation: u64,
    /// Learns who is in the mesh by SWIM (the `foca` crate) over the mesh's datagrams:
    /// gateways that join later ([`Node::join`]), leave ([`Node::leave`]) or are found dead.
    /// Off, the members are those the node was made with, and each is taken as gone only
    /// while it is not heard from ([`Node::quiet_rounds`]).
    pub discover: bool,
    /// The time between the node's ticks: SWIM's timeouts count in it (what SWIM sends goes
    /// out at the next tick).
    pub interval: Duration,
    /// Members kept at most, this gateway among them: a gateway beyond is not let in (its
    /// datagrams are dropped and counted as [`Dropped::strangers`]). Joiners gone a minute
    /// with nothing outstanding are forgotten, and make room (see the crate docs).
    pub max_members: usize,
    /// This gateway's region (escrow): gateways of a region move shares among themselves
    /// every round, and to gateways of another region only every
    /// [`region_rounds`](Self::region_rounds).
    pub region: u16,
    /// Escrow: rounds between moves of shares from one region to another, so that a quota
    /// split between regions follows demand more slowly than within one; `None`: never, each
    /// region keeps its founders' first shares of every quota (a fixed split; a joiner is
    /// given shares by gateways of its region only). A gateway hands what it holds to
    /// another region only when it leaves and no member of its own region is live. Give
    /// every gateway of a mesh the same value. A gateway that keeps a fixed split says so in
    /// its datagrams, and gateways of other regions give it nothing (it would give nothing
    /// back); what it gives a region-mate that does not keep one may still go across.
    /// Gateways given different numbers each move shares across at their own pace: one
    /// given a far larger number holds what it was given from another region that much
    /// longer (`Some(u32::MAX)`, for good).
    pub region_rounds: Option<u32>,
    pub(crate) sealer: Option<Sealer>,
}

impl Config {
    /// The defaults for `mode`: fanout 3, datagrams of 1,400 bytes, 100,000 slots, 64
    /// entries repaired a round, region 0, shares moved across regions every 10 rounds.
    #[must_use]
    pub const fn new(mode: Mode) -> Self {
        Self {
            mode,
            fanout: 3,
            relay_rounds: None,
            max_datagram: 1_400,
            max_slots: 100_000,
            repair_per_round: 64,
            seed: 0,
            first_sequence: 0,
            incarnation: 0,
            discover: false,
            interval: Duration::from_millis(100),
            max_members: 64,
            region: 0,
            region_rounds: Some(10),
            sealer: None,
        }
    }

    /// Seals every datagram with HMAC-SHA256 under `secret` (shared by the mesh), and drops
    /// every datagram not sealed under it ([`Dropped::forged`]) or sealed with a sequence
    /// number seen before or older than the last 1,024 the sender sent this gateway
    /// ([`Dropped::replayed`]).
    ///
    /// # Errors
    ///
    /// [`ShortSecret`] for a secret shorter than 16 bytes.
    ///
    /// ```
    /// use ratewarden_mesh::{Config, Mode};
    /// assert!(Config::new(Mode::Escrow).secret(b"a secret of 16 bytes or more").is_ok());
    /// assert!(Config::new(Mode::Escrow).secret(b"short").is_err());
    /// ```
    pub fn secret(mut self, secret: &[u8]) -> Result<Self, ShortSecret> {
        self.sealer = Some(Sealer::new(secret).ok_or(ShortSecret)?);
        Ok(self)
    }
}

/// A mesh secret shorter than 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShortSecret;

impl std::fmt::Display for ShortSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a mesh secret must be at least {MIN_SECRET} bytes")
    }
}

impl std::error::Error for ShortSecret {}

/// A check of a new slot while a [`Node`] holds [`Config::max_slots`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full;

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the mesh holds its maximum number of keys")
    }
}

impl std::error::Error for Full {}

/// Datagrams a [`Node`] dropped, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Dropped {
    /// Not a datagram ([`WireError`]).
    pub malformed: u64,
    /// From a gateway that is not a member or runs the other mode, or addressed to another.
    pub strangers: u64,
    /// Entries or transfers about new slots beyond [`Config::max_slots`].
    pub over_bound: u64,
    /// Not sealed under the mesh's secret ([`Config::secret`]).
    pub forged: u64,
    /// Sealed with a sequence number seen before, or older than the last 1,024 the sender
    /// sent.
    pub replayed: u64,
    /// From a member's incarnation before its last restart, or carrying transfers for this
    /// gateway's incarnation before.
    pub stale: u64,
}

/// What a [`Node`] has sent so far: its rounds, the datagrams they made and their bytes
/// (sealed, as they go on the wire).
///
/// A round sends each of `min(fanout, n − 1)` peers the entries that changed lately (each
/// relayed for [`Node::relay_rounds`] rounds) and up to [`Config::repair_per_round`] repaired
/// ones, one peer in turn a datagram (empty if it has nothing else for it), and each peer it
/// owes a transfer or an acknowledgement one of each per slot; every
/// datagram of at most [`Config::max_datagram`] bytes. In bytes: a datagram's head is 53
/// (93 sealed), a slot `25 + k` where `k` is 9 for a number key, 17 for an IP address, 33 for
/// a digest and `2 + len` for a short string key; an entry is a slot and 48, a transfer a
/// slot and 32, an acknowledgement a slot and 24. One key changing on every gateway of `n`
/// costs a gateway at most `min(fanout, n − 1) × (93 + 2n × entry) + (n − 1) × (93 +
/// transfer + acknowledgement)` bytes a round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sent {
    /// Rounds ([`Node::tick`] calls).
    pub rounds: u64,
    /// Datagrams.
    pub datagrams: u64,
    /// Bytes.
    pub bytes: u64,
    /// Datagrams of SWIM ([`Config::discover`]): probes, their answers, joins, and the
    /// changes of membership they carry; apart from the gossip counted above.
    pub membership_datagrams: u64,
    /// Their bytes.
    pub membership_bytes: u64,
}

/// One datagram to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The peer it goes to.
    pub to: NodeId,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// One gateway's side of the mesh.
///
/// It decides every algorithm but the sliding log ([`supports`]; a sliding-log quota is
/// decided as GCRA, its slot as GCRA's). Its `now` must never move back: a step back holds
/// refills, windows and holds where they were until the clock passes them again.
///
/// ```
/// use ratewarden_core::{Key, Quota, Timestamp};
/// use ratewarden_mesh::{Config, Mode, Node};
///
/// let quota: Quota = "10/s".parse()?;
/// let members = [1, 2];
/// let mut a = Node::new(1, &members, Config::new(Mode::Eventual));
/// let mut b = Node::new(2, &members, Config::new(Mode::Eventual));
/// let now = Timestamp::from_micros(0);
/// for _ in 0..10 {
///     assert!(a.check(now, &Key::from("k"), &quota, 1)?.is_allowed());
/// }
/// for out in a.tick(now) {
///     b.receive(now, &out.bytes)?;
/// }
/// // b has heard of a's ten admissions.
/// assert!(!b.check(now, &Key::from("k"), &quota, 1)?.is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Node {
    id: NodeId,
    /// The founders (sorted), then the gateways that joined since, in the order they did.
    members: Vec<NodeId>,
    /// Each member's index in `members`.
    index: HashMap<NodeId, usize, foldhash::fast::RandomState>,
    /// How many of `members` share each quota at first: the founders.
    founders: usize,
    /// How many of `members` this node was made with (the founders; a joiner's seeds and
    /// itself): never forgotten, so a joiner whose seeds are not up yet still asks them.
    made_with: usize,
    /// Members SWIM found dead or that left.
    down: Vec<bool>,
    membership: Option<Membership>,
    /// Whether a founder counts this gateway (it heard one by SWIM), or it founded the
    /// mesh: until then an eventual joiner admits nothing.
    let_in: bool,
    /// A digest of the founders ([`membership::founders_digest`]).
    founders_digest: u64,
    /// Whether this founder gave up its first shares ([`Node::founders_disagree`]).
    disowned: bool,
    /// Whether it left the mesh ([`Node::leave`]).
    left: bool,
    /// SWIM's datagrams made between ticks (answers to probes), sent with the next tick's.
    pending: Vec<Outgoing>,
    me: usize,
    config: Config,
    relay_rounds: u8,
    /// The slots, in the order they were made (save those forgotten since): a round visits
    /// them in turn, and the repair and the sweep of slots at rest take them round robin.
    slots: IndexMap<Slot, State, foldhash::fast::RandomState>,
    repair_at: usize,
    sweep_at: usize,
    /// The round under way, while [`Node::advance_round`] has not finished it.
    under_way: Option<Round>,
    /// Slots made so far: each starts its rounds of holds above any before it.
    made: u64,
    /// The peer the last round reached in turn.
    beat_at: usize,
    round: u64,
    /// When the last round was ticked (µs).
    last_round: Option<u64>,
    rng: fastrand::Rng,
    dropped: Dropped,
    sent: Sent,
    /// The last sequence number sealed to each member.
    sequences: Vec<u64>,
    /// Each member's sequence numbers seen.
    windows: Vec<Window>,
    /// Each member's incarnation, once heard from.
    incarnations: Vec<Option<u64>>,
    /// When each member was last heard from (µs), and in which round.
    heard: Vec<Option<u64>>,
    heard_round: Vec<u64>,
    /// Each member's region, once heard from (this gateway's own from the start).
    regions: Vec<Option<u16>>,
    /// Whether each member keeps a fixed split between regions, as it last said.
    fixed_splits: Vec<bool>,
    /// The highest incarnation of the members forgotten ([`Node::forget_gone`]), and the
    /// highest sequence number sent one (or a gateway not a member): a member added later is
    /// held above them, so that nothing a forgotten run sent is taken, and it is sent no
    /// number it saw before.
    forgotten_run: Option<u64>,
    forgotten_sequence: u64,
    /// The members forgotten last, [`FORGOTTEN_KEPT`] at most: SWIM may still ask them to
    /// let this gateway in.
    forgotten: VecDeque<NodeId>,
}

#[derive(Clone, Copy, Debug, Default)]
struct View {
    /// Eventual: the running total `a`, counted since `b`, the count's start (µs, on its
    /// origin's clock): a count that starts later outranks any before it.
    version: u64,
    a: u64,
    b: u64,
    c: u64,
    /// Rounds it is still relayed.
    hot: u8,
}

#[derive(Clone, Copy, Debug)]
enum Bucket {
    Owing(OwingBucket),
    Share(ShareBucket),
}

#[derive(Clone, Copy, Debug, Default)]
struct Given {
    share: u64,
    tokens: u64,
    acked: u64,
}

#[derive(Debug)]
struct State {
    /// What each member (by index) last said of the slot.
    views: Vec<View>,
    bucket: Bucket,
    /// Escrow: units asked for since the last round, admitted or not, and refused.
    requested: u64,
    refused: u64,
    /// Escrow: units asked for a second, in micro-units, averaged over the quota's
    /// [`horizon`]; and units refused a round, in thousandths, averaged over a few rounds.
    demand: u64,
    pressure: u64,
    /// Escrow: this slot's life here ([`Entry::life`]), and each member's as last heard:
    /// the running totals with a member count between its life and this one.
    life: u64,
    lives: Vec<u64>,
    /// Escrow: running totals given to each member, and received from each.
    given: Vec<Given>,
    received: Vec<(u64, u64)>,
    /// Escrow: members whose transfers we owe an acknowledgement.
    ack_due: Vec<bool>,
    /// Escrow: share given up to a restarted member beyond what this gateway held, repaid
    /// from the next shares it is given.
    debt: u64,
    /// A reserved slot's holds (their units are held in the bucket).
    holds: Holds,
}

/// The reservations holding units of a reserved slot.
#[derive(Clone, Copy, Debug, Default)]
struct Holds {
    /// Holds not yet settled.
    count: u32,
    /// When every hold has lapsed (µs).
    lapse_at: u64,
    /// Moves on each time the holds lapse, so that a settle of one made before finds it
    /// gone (and drops nothing held by those made since).
    round: u64,
}

impl Holds {
    /// Ends the round of holds: none is left, and a ticket of the round finds none.
    const fn end_round(&mut self) {
        self.count = 0;
        self.lapse_at = 0;
        self.round += 1;
    }
}

impl Bucket {
    fn admit(&mut self, quota: &Quota, now: u64, cost: u32, admit: Admit) -> Decision {
        match self {
            Self::Owing(bucket) => bucket.admit(quota, now, cost, admit),
            Self::Share(bucket) => bucket.admit(quota, now, cost, admit),
        }
    }

    fn release(&mut self, units: u64) {
        match self {
            Self::Owing(bucket) => bucket.release(units),
            Self::Share(bucket) => bucket.release(units),
        }
    }

    const fn release_all(&mut self) {
        match self {
            Self::Owing(bucket) => bucket.release_all(),
            Self::Share(bucket) => bucket.release_all(),
        }
    }
}

impl State {
    /// Eventual: counts `units` this gateway admitted at `now`, to be gossiped: its running
    /// total, and when it last admitted (for a peer that hears of the total for the first
    /// time). Once its last admission weighs no more (in a mesh of `n`), the total starts
    /// over, from `now`: peers charge a later count as new (so a gateway that forgot the key
    /// loses nothing, and one that kept it charges what the new count adds).
    fn announce(&mut self, me: usize, relay: u8, now: u64, units: u32, quota: &Quota, n: usize) {
        if units == 0 {
            return;
        }
        let own = &mut self.views[me];
        if own.version == 0 || !may_weigh(quota, own.c, now, n) {
            *own = View {
                b: own.b.saturating_add(1).max(now),
                ..View::default()
            };
        }
        own.a += u64::from(units);
        own.version = own.a;
        own.c = own.c.max(now);
        own.hot = relay;
    }

    /// Drops every hold once the latest has lapsed.
    const fn lapse(&mut self, now: u64) {
        if self.holds.count > 0 && now >= self.holds.lapse_at {
            self.holds.end_round();
            self.bucket.release_all();
        }
    }

    /// Whether the slot is as a fresh one would be at `now`, with nothing still to tell, so
    /// that forgetting it admits nothing more: no hold; eventual: the bucket full (windows
    /// counting nothing) and no count, any origin's, that may still weigh, even heard
    /// [`LATE`] later, none still relayed; escrow: at least this gateway's `first` share, as
    /// much given each peer as taken from it (or less, to a member `down`: what it handed
    /// over is given up, as the slot is made again at the first share), its bucket full, every share it gave acknowledged
    /// (its peers hold it), nothing owed or refused lately, no demand, and its own entry
    /// (its life among it) no longer relayed. Its peers settle with the life it ends once
    /// they hear of a later one (see [`State::meet`]).
    fn at_rest(&mut self, quota: &Quota, now: u64, me: usize, first: u64, down: &[bool]) -> bool {
        let n = down.len();
        self.lapse(now);
        if self.holds.count > 0 {
            return false;
        }
        match &mut self.bucket {
            Bucket::Owing(bucket) => {
                bucket.at_rest(quota, now)
                    && self.views.iter().all(|v| {
                        let late = v.c.saturating_add(LATE);
                        v.version == 0 || (v.hot == 0 && !may_weigh(quota, late, now, n))
                    })
            }
            Bucket::Share(bucket) => {
                bucket.share() >= first
                    && self.debt == 0
                    && self.pressure == 0
                    && self.refused == 0
                    && self.demand == 0
                    && self.views[me].hot == 0
                    // Every gift acknowledged, and as much given each peer as taken from it,
                    // so that each peer's settling with this life moves nothing but its own
                    // gifts this life never took; from a member that left or died, more
                    // taken is given up with the slot (it is back to first shares), and
                    // settled should it come back.
                    && self
                        .given
                        .iter()
                        .zip(&self.received)
                        .zip(down)
                        .all(|((g, r), &down)| {
                            g.acked >= g.share && (g.share == r.0 || (down && g.share < r.0))
                        })
                    && bucket.at_rest(quota, now)
            }
        }
    }

    /// Escrow: member `from`'s slot has `life`. A later life than the one known means it
    /// forgot the slot at rest ([`State::at_rest`]: its first share, as much given each peer
    /// as taken from it, every gift acknowledged): what was exchanged with the life before
    /// is settled ([`State::settle`], as with a restarted member), which moves nothing but
    /// a share this gateway sent that life and it never took (it comes back). Answers
    /// whether `life` is the one now known (not an earlier one).
    fn meet(&mut self, quota: &Quota, from: usize, life: u64, now: u64) -> bool {
        let known = self.lives[from];
        if life > known {
            self.settle(quota, from, now);
            self.lives[from] = life;
        }
        life >= known
    }

    /// Escrow: undoes the shares exchanged with member `from` (see [`Node::forget`]) and
    /// starts the running totals with it over.
    fn settle(&mut self, quota: &Quota, from: usize, now: u64) {
        if let Bucket::Share(bucket) = &mut self.bucket {
            let (received, given) = (self.received[from].0, self.given[from].share);
            if received > given {
                let short = bucket.give_up(quota, now, received - given);
                self.debt = self.debt.saturating_add(short);
            } else {
                let back = given - received;
                let repaid = self.debt.min(back);
                self.debt -= repaid;
                bucket.take_back(quota, now, back - repaid);
            }
        }
        self.received[from] = (0, 0);
        self.given[from] = Given::default();
        self.ack_due[from] = false;
    }

    /// Escrow, with no gateway refusing and none asked for here: gives each live peer (not
    /// `gone`, its life of the slot known) back what this gateway took from it beyond what it
    /// gave it, so that the books balance and a key at rest comes to be held as at first
    /// everywhere, and is forgotten ([`State::at_rest`]).
    fn repay(&mut self, quota: &Quota, now: u64, me: usize, gone: &[bool]) {
        let Bucket::Share(bucket) = &mut self.bucket else {
            return;
        };
        for peer in (0..gone.len()).filter(|&i| i != me && !gone[i] && self.lives[i] != 0) {
            let owed = self.received[peer].0.saturating_sub(self.given[peer].share);
            if owed > 0 {
                let (part, tokens) = bucket.take(quota, now, owed);
                self.given[peer].share += part;
                self.given[peer].tokens += tokens;
            }
        }
    }

    /// Whether nothing is outstanding with member `j` (in a mesh of `n`), so that forgetting
    /// it admits nothing more and throws nothing away: eventual, no count of its that may
    /// still weigh, even heard [`LATE`] later; escrow, as much given it as taken from it,
    /// and all of it acknowledged (settling with it would move nothing).
    fn even_with(&self, quota: &Quota, j: usize, now: u64, n: usize) -> bool {
        match self.bucket {
            Bucket::Owing(_) => {
                let v = &self.views[j];
                v.version == 0
                    || (v.hot == 0 && !may_weigh(quota, v.c.saturating_add(LATE), now, n))
            }
            Bucket::Share(_) => {
                let given = &self.given[j];
                given.share == self.received[j].0 && given.acked >= given.share
            }
        }
    }

    /// A copy of the bucket as it is at `now`, its holds dropped if they have lapsed.
    fn bucket_at(&self, now: u64) -> Bucket {
        let mut bucket = self.bucket;
        if self.holds.count > 0 && now >= self.holds.lapse_at {
            bucket.release_all();
        }
        bucket
    }

    /// Escrow: counts a request's units as asked for, and as refused if it was denied (one
    /// no retry can meet is no demand).
    fn ask(&mut self, cost: u32, decision: &Decision) {
        if matches!(decision, Decision::InsufficientCapacity(_)) {
            return;
        }
        self.requested = self.requested.saturating_add(u64::from(cost));
        if !decision.is_allowed() {
            self.refused = self.refused.saturating_add(u64::from(cost));
        }
    }
}

impl Node {
    /// A gateway `id` in a mesh founded by `members` (which should include `id`; it is added
    /// if not): each founder holds an equal share of every quota at first, so each must be
    /// made with the same members. A gateway added to a running mesh [joins](Self::join).
    #[must_use]
    pub fn new(id: NodeId, members: &[NodeId], mut config: Config) -> Self {
        let mut members = members.to_vec();
        members.push(id);
        members.sort_unstable();
        members.dedup();
        let founders = members.len();
        // Every founder is a member, whatever the bound.
        config.max_members = config.max_members.max(founders);
        Self::with_members(id, members, founders, config)
    }

    /// A gateway `id` joining a running mesh through `seeds` (some of its members). It
    /// holds no share of any quota at first and is given shares as it asks for them, so a
    /// join never lifts what the mesh admits; it learns the other members by SWIM
    /// ([`Config::discover`], on for it), and they learn it.
    ///
    /// ```
    /// use ratewarden_core::{Key, Quota, Timestamp};
    /// use ratewarden_mesh::{Config, Mode, Node};
    ///
    /// let quota: Quota = "10/s".parse()?;
    /// let mut config = Config::new(Mode::Escrow);
    /// config.discover = true;
    /// let mut a = Node::new(1, &[1], config.clone());
    /// let mut b = Node::join(2, &[1], config);
    /// // b holds no share until a gives it one.
    /// assert!(!b.check(Timestamp::from_micros(0), &Key::from("k"), &quota, 1)?.is_allowed());
    /// let mut now = 0;
    /// while a.members().len() < 2 && now < 10_000_000 {
    ///     now += 100_000;
    ///     for out in b.tick(Timestamp::from_micros(now)) {
    ///         a.receive(Timestamp::from_micros(now), &out.bytes)?;
    ///     }
    ///     for out in a.tick(Timestamp::from_micros(now)) {
    ///         b.receive(Timestamp::from_micros(now), &out.bytes)?;
    ///     }
    /// }
    /// assert_eq!(a.members(), &[1, 2]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn join(id: NodeId, seeds: &[NodeId], mut config: Config) -> Self {
        let mut members: Vec<NodeId> = seeds.iter().copied().filter(|&s| s != id).collect();
        members.sort_unstable();
        members.dedup();
        members.truncate(config.max_members.saturating_sub(1));
        members.push(id);
        config.discover = true;
        Self::with_members(id, members, 0, config)
    }

    fn with_members(id: NodeId, members: Vec<NodeId>, founders: usize, config: Config) -> Self {
        let me = members.iter().position(|&m| m == id).unwrap_or(0);
        let n = members.len();
        let index = members.iter().enumerate().map(|(i, &m)| (m, i)).collect();
        let founders_digest = membership::founders_digest(&members[..founders]);
        let membership = config.discover.then(|| {
            Membership::new(
                id,
                config.incarnation,
                members.len(),
                config.interval,
                config.max_datagram,
                config.seed ^ id.rotate_left(17),
            )
        });
        let relay_rounds = config.relay_rounds.unwrap_or_else(|| {
            u8::try_from(usize::BITS - (n - 1).leading_zeros() + 2).unwrap_or(u8::MAX)
        });
        Self {
            id,
            me,
            relay_rounds,
            rng: fastrand::Rng::with_seed(config.seed ^ id),
            sequences: vec![config.first_sequence; n],
            windows: vec![Window::default(); n],
            incarnations: vec![None; n],
            heard: vec![None; n],
            heard_round: vec![0; n],
            regions: (0..n).map(|i| (i == me).then_some(config.region)).collect(),
            fixed_splits: (0..n)
                .map(|i| i == me && config.region_rounds.is_none())
                .collect(),
            forgotten_run: None,
            forgotten_sequence: 0,
            forgotten: VecDeque::new(),
            config,
            members,
            index,
            founders,
            made_with: n,
            down: vec![false; n],
            membership,
            let_in: me < founders,
            founders_digest,
            disowned: false,
            left: false,
            pending: Vec::new(),
            slots: IndexMap::default(),
            repair_at: 0,
            sweep_at: 0,
            under_way: None,
            made: 0,
            beat_at: me,
            round: 0,
            last_round: None,
            dropped: Dropped::default(),
            sent: Sent::default(),
        }
    }

    /// Rounds without a datagram from a member after which escrow takes it as gone and
    /// gives it no more shares: `max(3 (n - 1) / fanout, n - 1) + 3`. A live member is heard
    /// from about every `(n - 1) / fanout` rounds, and at least every `n - 1` (each round
    /// also reaches one peer in turn), so it is taken as gone only when datagrams are lost
    /// (which only delays what it is given).
    ///
    /// ```
    /// use ratewarden_mesh::{Config, Mode, Node};
    /// let node = Node::new(1, &[1, 2, 3], Config::new(Mode::Escrow));
    /// assert_eq!(node.quiet_rounds(), 5);
    /// ```
    #[must_use]
    pub fn quiet_rounds(&self) -> u64 {
        let peers = self.members.len() as u64 - 1;
        (3 * peers / self.config.fanout.max(1) as u64).max(peers) + 3
    }

    /// This gateway's id.
    #[must_use]
    pub const fn id(&self) -> NodeId {
        self.id
    }

    /// The mesh's members, this gateway among them: its founders, sorted, then the gateways
    /// that joined since, in the order this gateway learnt of them. A member stays on the
    /// list once it leaves or dies ([`live`](Self::live) tells who is heard from); a joiner
    /// gone a minute with nothing outstanding is forgotten (see the crate docs).
    #[must_use]
    pub fn members(&self) -> &[NodeId] {
        &self.members
    }

    /// Datagrams dropped so far.
    #[must_use]
    pub const fn dropped(&self) -> Dropped {
        self.dropped
    }

    /// Rounds, datagrams and bytes sent so far.
    ///
    /// ```
    /// use ratewarden_core::Timestamp;
    /// use ratewarden_mesh::{Config, Mode, Node};
    /// let mut node = Node::new(1, &[1, 2], Config::new(Mode::Eventual));
    /// let out = node.tick(Timestamp::from_micros(0));
    /// assert_eq!(node.sent().rounds, 1);
    /// assert_eq!(node.sent().datagrams, out.len() as u64);
    /// ```
    #[must_use]
    pub const fn sent(&self) -> Sent {
        self.sent
    }

    /// Rounds an entry that changed is relayed for: `ceil(log2 n) + 2` unless
    /// [`Config::relay_rounds`] says otherwise.
    ///
    /// ```
    /// use ratewarden_mesh::{Config, Mode, Node};
    /// assert_eq!(Node::new(1, &[1, 2, 3, 4], Config::new(Mode::Eventual)).relay_rounds(), 4);
    /// ```
    #[must_use]
    pub const fn relay_rounds(&self) -> u8 {
        self.relay_rounds
    }

    /// Decides a request of `cost` units for `key` under `quota`, at once.
    ///
    /// # Errors
    ///
    /// [`Full`] for a new key while the node holds [`Config::max_slots`].
    pub fn check(
        &mut self,
        now: Timestamp,
        key: &Key,
        quota: &Quota,
        cost: u32,
    ) -> Result<Decision, Full> {
        let slot = Slot::checked(key, quota);
        let (decision, _) = self.admit(now.as_micros(), slot, cost, Admit::Charge, 0)?;
        Ok(decision)
    }

    /// Admits `cost` units on the slot's state (made if new), charging or holding them
    /// until `lapse_at`; answers the decision and the round of holds a hold joined.
    fn admit(
        &mut self,
        now: u64,
        slot: Slot,
        cost: u32,
        admit: Admit,
        lapse_at: u64,
    ) -> Result<(Decision, u64), Full> {
        let quota = slot.quota;
        if self.left || (!self.let_in && self.config.mode == Mode::Eventual) {
            // A gateway that left admits nothing; a joiner no member counts yet would
            // decide alone, unseen.
            let wait = self.config.interval;
            let info = Info::new(u64::from(quota.burst()), 0, wait, wait);
            return Ok((Decision::Denied(info), 0));
        }
        let (me, relay, n) = (self.me, self.relay_rounds, self.members.len());
        let state = self.state(slot, now).ok_or(Full)?;
        state.lapse(now);
        let decision = state.bucket.admit(&quota, now, cost, admit);
        match state.bucket {
            Bucket::Owing(_) if decision.is_allowed() && admit == Admit::Charge => {
                state.announce(me, relay, now, cost, &quota, n);
            }
            Bucket::Owing(_) => {}
            Bucket::Share(_) => state.ask(cost, &decision),
        }
        if decision.is_allowed() && admit == Admit::Hold {
            state.holds.count += 1;
            state.holds.lapse_at = state.holds.lapse_at.max(lapse_at);
        }
        Ok((decision, state.holds.round))
    }

    /// Decides a request against several limits together: every limit admits its cost and
    /// all are counted, or none is counted and the answer says which denied. A
    /// [probe](Limit::probe) must admit its cost and is never counted; limits on one key and
    /// quota are decided once, at their summed cost.
    ///
    /// # Errors
    ///
    /// [`Full`] when a limit's key is new and the node holds [`Config::max_slots`] already
    /// (nothing counted).
    ///
    /// ```
    /// use ratewarden_core::{Key, Limit, Quota, Timestamp};
    /// use ratewarden_mesh::{Config, Mode, Node};
    /// let mut node = Node::new(1, &[1], Config::new(Mode::Eventual));
    /// let now = Timestamp::from_micros(0);
    /// let (user, tenant) = (Key::from("user-7"), Key::from("acme"));
    /// let limits = [
    ///     Limit::new(user, "10/s".parse()?, 1),
    ///     Limit::new(tenant.clone(), "2/s".parse()?, 1),
    /// ];
    /// assert!(node.check_all(now, &limits)?.is_allowed());
    /// assert!(node.check_all(now, &limits)?.is_allowed());
    /// // The tenant's limit denies the third: the user's is not counted either.
    /// let third = node.check_all(now, &limits)?;
    /// assert_eq!(third.binding().map(|(i, _)| i), Some(1));
    /// assert_eq!(node.admitted_seen(&limits[0].key(), limits[0].quota()), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_all(&mut self, now: Timestamp, limits: &[Limit]) -> Result<Decisions, Full> {
        if let [one] = limits
            && one.is_counted()
        {
            return self
                .check(now, one.key(), one.quota(), one.cost())
                .map(Decisions::from);
        }
        let at = now.as_micros();
        let (states, of) = merged(limits);
        let mut decisions = self.decide_unless_refused(at, &states, false)?;
        if !decisions.iter().all(Decision::is_allowed) {
            return Ok(Decisions::from(
                of.iter().map(|&s| decisions[s]).collect::<Vec<_>>(),
            ));
        }
        for (i, limit) in states.iter().enumerate() {
            if limit.is_counted() {
                // Admitted on the copy, so admitted here: the node has not moved since.
                decisions[i] = self.check(now, limit.key(), limit.quota(), limit.cost())?;
            }
        }
        Ok(Decisions::from(
            of.iter().map(|&s| decisions[s]).collect::<Vec<_>>(),
        ))
    }

    /// Holds the cost of every counted limit for `hold`, for a request whose cost is known
    /// once it is served: all held or none, as [`check_all`](Self::check_all) counts (a
    /// [probe](Limit::probe) is decided on the checked state and never held). The units
    /// held take room in the state of the key's reserved limit, apart from the state checks
    /// count on: nothing is charged until [`settle`](Self::settle), and holds not settled
    /// by their time lapse, charging nothing (a key's holds lapse together, when the latest
    /// has). In escrow mode a gateway gives away no share that backs what it holds.
    ///
    /// # Errors
    ///
    /// [`Full`] when a counted limit's key is new and the node holds [`Config::max_slots`]
    /// already (nothing held).
    ///
    /// ```
    /// use ratewarden_core::{Key, Limit, Timestamp};
    /// use ratewarden_mesh::{Config, Mode, Node};
    /// use std::time::Duration;
    /// let mut node = Node::new(1, &[1], Config::new(Mode::Escrow));
    /// let now = Timestamp::from_micros(0);
    /// let tokens = Limit::new(Key::from("user-7"), "100/min".parse()?, 60);
    /// let first = node.reserve(now, &[tokens.clone()], Duration::from_secs(30))?;
    /// assert!(first.is_allowed());
    /// // 60 held: another 60 do not fit while the first request runs.
    /// assert!(!node.reserve(now, &[tokens.clone()], Duration::from_secs(30))?.is_allowed());
    /// node.settle(now, first.held(), 10); // it used 10
    /// assert!(node.reserve(now, &[tokens], Duration::from_secs(30))?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve(
        &mut self,
        now: Timestamp,
        limits: &[Limit],
        hold: Duration,
    ) -> Result<Reservation, Full> {
        let at = now.as_micros();
        let lapse_at = at.saturating_add(u64::try_from(hold.as_micros()).unwrap_or(u64::MAX));
        let (states, of) = merged(limits);
        let decisions = self.decide_unless_refused(at, &states, true)?;
        if !decisions.iter().all(Decision::is_allowed) {
            let each = of.iter().map(|&s| decisions[s]).collect::<Vec<_>>();
            return Ok(Reservation::new(Decisions::from(each), Vec::new()));
        }
        let mut decided = Vec::with_capacity(limits.len());
        let mut held = Vec::with_capacity(limits.len());
        for (limit, &s) in limits.iter().zip(&of) {
            if limit.is_counted() {
                // Admitted together on copies, so each admitted here.
                let slot = Slot::reserved(limit.key(), limit.quota());
                let (decision, round) =
                    self.admit(at, slot, limit.cost(), Admit::Hold, lapse_at)?;
                held.push((limit.clone(), round));
                decided.push(decision);
            } else {
                decided.push(decisions[s]);
            }
        }
        Ok(Reservation::new(Decisions::from(decided), held))
    }

    /// Ends a reservation: drops the holds of `held` ([`Reservation::held`]) and charges
    /// `actual` units to each limit held. What the state has no room for is owed, repaid as
    /// it refills before anything new is admitted (a settle at or below the units held
    /// always finds room, save after a peer's restart took shares back). A hold that lapsed
    /// is gone; its `actual` is charged all the same. In eventual mode the charge is counted
    /// as admitted and gossiped like a check's.
    ///
    /// A ticket is settled once, as it came from [`reserve`](Self::reserve) (`Store::settle`
    /// takes the reservation): one settled again while other holds of its round are live
    /// drops units they hold, as on one exact limiter's [`Ledger`]. Once the last hold of a
    /// round is settled the round ends, and its tickets find nothing more.
    ///
    /// [`Ledger`]: ratewarden_core::algorithm::Ledger
    pub fn settle(&mut self, now: Timestamp, held: &[(Limit, u64)], actual: u32) {
        let at = now.as_micros();
        let (me, relay, n) = (self.me, self.relay_rounds, self.members.len());
        for (limit, round) in held {
            let slot = Slot::reserved(limit.key(), limit.quota());
            let quota = slot.quota;
            let state = if actual > 0 {
                self.state(slot, at)
            } else {
                self.slots.get_mut(&slot)
            };
            let Some(state) = state else {
                continue;
            };
            state.lapse(at);
            if state.holds.round == *round && state.holds.count > 0 {
                state.holds.count -= 1;
                state.bucket.release(u64::from(limit.cost()));
                if state.holds.count == 0 {
                    // The round ends with its last hold: a ticket of it settled again, or
                    // renewed, finds the holds made since apart from it, and they lapse by
                    // their own time.
                    state.holds.end_round();
                    state.bucket.release_all();
                }
            }
            match &mut state.bucket {
                Bucket::Owing(bucket) => {
                    bucket.owe(&quota, at, u64::from(actual));
                    state.announce(me, relay, at, actual, &quota, n);
                }
                Bucket::Share(bucket) => bucket.charge(&quota, at, actual),
            }
        }
    }

    /// Keeps the holds of `held` for `hold` more from now (a request that runs longer than
    /// its hold renews it). A hold that lapsed, or was settled, stays so.
    pub fn renew(&mut self, now: Timestamp, held: &[(Limit, u64)], hold: Duration) {
        let at = now.as_micros();
        let lapse_at = at.saturating_add(u64::try_from(hold.as_micros()).unwrap_or(u64::MAX));
        for (limit, round) in held {
            let slot = Slot::reserved(limit.key(), limit.quota());
            if let Some(state) = self.slots.get_mut(&slot) {
                state.lapse(at);
                if state.holds.round == *round && state.holds.count > 0 {
                    state.holds.lapse_at = state.holds.lapse_at.max(lapse_at);
                }
            }
        }
    }

    /// Gives back `units` of `key`'s reserved state under `quota` (a charge owed by no one):
    /// what it owes first, then tokens, never beyond a full bucket. In eventual mode the
    /// units come back to this gateway only: its peers, told they were admitted, keep them
    /// charged.
    pub fn refund(&mut self, now: Timestamp, key: &Key, quota: &Quota, units: u32) {
        let at = now.as_micros();
        if let Some(state) = self.slots.get_mut(&Slot::reserved(key, quota)) {
            match &mut state.bucket {
                Bucket::Owing(bucket) => bucket.refund(quota, at, units),
                Bucket::Share(bucket) => bucket.refund(quota, at, units),
            }
        }
    }

    /// Each of `states` (merged limits) decided on a copy of its bucket (a fresh one for a
    /// key without state), charging nothing and making no state: counted limits on their
    /// reserved states when `reserving`, probes always on the checked ones. Escrow counts
    /// what was asked and refused in the rebalancing.
    ///
    /// # Errors
    ///
    /// [`Full`] when the new keys of counted limits do not fit in [`Config::max_slots`].
    fn decide_unless_refused(
        &mut self,
        at: u64,
        states: &[Limit],
        reserving: bool,
    ) -> Result<Vec<Decision>, Full> {
        let slot_of = |limit: &Limit| Slot {
            reserved: reserving && limit.is_counted(),
            ..Slot::checked(limit.key(), limit.quota())
        };
        let mut new = 0;
        let decisions: Vec<Decision> = states
            .iter()
            .map(|limit| {
                let mut bucket = match self.slots.get(&slot_of(limit)) {
                    Some(state) => state.bucket_at(at),
                    None => {
                        new += usize::from(limit.is_counted());
                        self.fresh(limit.quota(), at)
                    }
                };
                bucket.admit(limit.quota(), at, limit.cost(), Admit::Charge)
            })
            .collect();
        if self.slots.len() + new > self.config.max_slots {
            return Err(Full);
        }
        if !decisions.iter().all(Decision::is_allowed) {
            // Escrow: what was asked and refused still weighs in the rebalancing.
            for (limit, decision) in states.iter().zip(&decisions) {
                if let Some(state) = self.slots.get_mut(&slot_of(limit))
                    && limit.is_counted()
                {
                    state.ask(limit.cost(), decision);
                }
            }
        }
        Ok(decisions)
    }

    /// Whether a request of cost 1 would be admitted now, counting nothing and making no
    /// state for a key it has none for.
    ///
    /// ```
    /// use ratewarden_core::{Key, Quota, Timestamp};
    /// use ratewarden_mesh::{Config, Mode, Node};
    /// let node = Node::new(1, &[1, 2], Config::new(Mode::Escrow));
    /// let quota: Quota = "10/s".parse()?;
    /// assert!(node.peek(Timestamp::from_micros(0), &Key::from("k"), &quota).is_allowed());
    /// # Ok::<(), ratewarden_core::ParseQuotaError>(())
    /// ```
    #[must_use]
    pub fn peek(&self, now: Timestamp, key: &Key, quota: &Quota) -> Decision {
        let now = now.as_micros();
        let mut bucket = self
            .slots
            .get(&Slot::checked(key, quota))
            .map_or_else(|| self.fresh(quota, now), |state| state.bucket_at(now));
        bucket.admit(quota, now, 1, Admit::Charge)
    }

    /// The gateways heard from since `since` (this one among them). Each round goes to
    /// [`Config::fanout`] peers at random and one in turn, so a live member is heard from
    /// about every `(n - 1) / fanout` rounds, and at least every `n - 1` where no datagram
    /// is lost.
    #[must_use]
    pub fn live(&self, since: Timestamp) -> Vec<NodeId> {
        let since = since.as_micros();
        (0..self.members.len())
            .filter(|&i| {
                i == self.me || (!self.down[i] && self.heard[i].is_some_and(|at| at >= since))
            })
            .map(|i| self.members[i])
            .collect()
    }

    /// Member `i`'s share of a quota no one has moved yet.
    fn first_share(&self, i: usize) -> u64 {
        if i == self.me && self.disowned {
            return 0;
        }
        first_share(i, self.founders)
    }

    /// How many gateways may hold shares: the members, or as many as may join.
    fn share_holders(&self) -> usize {
        share_holders(&self.config, self.members.len())
    }

    /// Member `id`'s index, the member added (holding no share) if it is new and there is
    /// room.
    fn member(&mut self, id: NodeId) -> Option<usize> {
        if let Some(&i) = self.index.get(&id) {
            return Some(i);
        }
        if self.members.len() >= self.config.max_members {
            return None;
        }
        let i = self.members.len();
        self.forgotten.retain(|&f| f != id);
        self.members.push(id);
        self.index.insert(id, i);
        self.down.push(false);
        self.sequences
            .push(self.config.first_sequence.max(self.forgotten_sequence));
        self.windows.push(Window::default());
        // Its datagrams are taken from a run above any forgotten: one that was forgotten and
        // comes back in the same run is dropped and told to move above it (settling with
        // every peer, as they then settle with it), so nothing it sent before is taken.
        self.incarnations
            .push(self.forgotten_run.map(|run| run.saturating_add(1)));
        self.heard.push(None);
        self.regions.push(None);
        self.fixed_splits.push(false);
        // Not taken as gone before it could have been heard from.
        self.heard_round.push(self.round);
        for state in self.slots.values_mut() {
            state.views.push(View::default());
            state.given.push(Given::default());
            state.received.push((0, 0));
            state.ack_due.push(false);
            state.lives.push(0);
        }
        Some(i)
    }

    /// Member `i` is known (by SWIM) under `run`: a run later than the one heard from means
    /// that one is over, and escrow settles with it as with a restarted peer, though this
    /// gateway never hears the later run itself.
    fn known_run(&mut self, i: usize, run: u64, now: u64) {
        if i == self.me {
            return;
        }
        match self.incarnations[i] {
            Some(known) if run <= known => {}
            Some(_) if self.config.mode == Mode::Escrow => {
                self.forget(i, now);
                self.incarnations[i] = Some(run);
            }
            _ => self.incarnations[i] = Some(run),
        }
    }

    /// Leaves the mesh: from now on this gateway admits nothing, and in escrow mode hands
    /// every share it holds to the live members (each first what it gave this gateway
    /// beyond what it was given back, the rest in equal parts), sent with its next ticks
    /// until they acknowledge it ([`parted`](Self::parted)); a share that reservations or
    /// a window's count pin is handed over once they no longer do. With
    /// [`Config::discover`] the members are told at once, by the datagrams answered, and
    /// take it as gone.
    pub fn leave(&mut self, now: Timestamp) -> Vec<Outgoing> {
        let now = now.as_micros();
        if let Some(membership) = &mut self.membership {
            membership.leave();
        }
        self.membership_out(now);
        self.left = true;
        self.part(now);
        std::mem::take(&mut self.pending)
    }

    /// Whether every share this gateway gave is acknowledged, and, once it
    /// [left](Self::leave), it holds none: it may stop without throwing quota away.
    ///
    /// ```
    /// use ratewarden_core::{Key, Quota, Timestamp};
    /// use ratewarden_mesh::{Config, Mode, Node};
    ///
    /// let (key, quota) = (Key::from("k"), "10/s".parse::<Quota>()?);
    /// let mut a = Node::new(1, &[1, 2], Config::new(Mode::Escrow));
    /// let mut b = Node::new(2, &[1, 2], Config::new(Mode::Escrow));
    /// let at = |ms: u64| Timestamp::from_micros(ms * 1_000);
    /// a.check(at(0), &key, &quota, 1)?;
    /// for out in a.tick(at(100)) {
    ///     b.receive(at(100), &out.bytes)?;
    /// }
    /// a.leave(at(200));
    /// let mut ms = 200;
    /// while !a.parted() && ms < 2_000 {
    ///     ms += 100;
    ///     for out in a.tick(at(ms)) {
    ///         b.receive(at(ms), &out.bytes)?;
    ///     }
    ///     for out in b.tick(at(ms)) {
    ///         a.receive(at(ms), &out.bytes)?;
    ///     }
    /// }
    /// assert!(a.parted());
    /// assert_eq!(b.share(&key, &quota), Some(1_000_000));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn parted(&self) -> bool {
        self.slots.values().all(|state| {
            let holds = match &state.bucket {
                Bucket::Share(bucket) if self.left => bucket.share() > 0,
                _ => false,
            };
            !holds && state.given.iter().all(|given| given.acked >= given.share)
        })
    }

    /// Escrow, once this gateway left: hands the shares it can give to the live members
    /// (see [`leave`](Self::leave)).
    fn part(&mut self, now: u64) {
        let me = self.me;
        let gone = self.gone();
        let region = Some(self.config.region);
        let live: Vec<usize> = (0..self.members.len())
            .filter(|&i| i != me && !gone[i])
            .collect();
        if live.is_empty() {
            return;
        }
        let near_live = live.iter().any(|&i| self.regions[i] == region);
        for (slot, state) in &mut self.slots {
            let Bucket::Share(bucket) = &mut state.bucket else {
                continue;
            };
            let quota = &slot.quota;
            let live: Vec<usize> = live
                .iter()
                .copied()
                .filter(|&i| state.lives[i] != 0)
                .collect();
            if live.is_empty() {
                continue;
            }
            for &peer in &live {
                let owed = state.received[peer]
                    .0
                    .saturating_sub(state.given[peer].share);
                let (part, tokens) = bucket.take(quota, now, owed);
                state.given[peer].share += part;
                state.given[peer].tokens += tokens;
            }
            // The rest to this region's gateways, or others' if none of its own is live (one
            // live that has not made the key yet will, hearing this gateway left).
            let near: Vec<usize> = live
                .iter()
                .copied()
                .filter(|&i| self.regions[i] == region)
                .collect();
            let heirs = if near_live { &near } else { &live };
            if heirs.is_empty() {
                continue;
            }
            let rest = bucket.share();
            let each = rest / heirs.len() as u64;
            for (k, &peer) in heirs.iter().enumerate() {
                let part = if k == 0 {
                    rest - each * (heirs.len() as u64 - 1)
                } else {
                    each
                };
                let (part, tokens) = bucket.take(quota, now, part);
                state.given[peer].share += part;
                state.given[peer].tokens += tokens;
            }
        }
    }

    /// Which members escrow takes as gone: found dead or left, not heard from lately, or
    /// never heard from by this run (a member that died before it started).
    fn gone(&self) -> Vec<bool> {
        let quiet = self.quiet_rounds();
        (0..self.members.len())
            .map(|i| {
                i != self.me
                    && (self.down[i]
                        || self.heard[i].is_none()
                        || self.round.saturating_sub(self.heard_round[i]) > quiet)
            })
            .collect()
    }

    /// Applies SWIM's changes of membership and seals what it sends into `pending`.
    fn membership_out(&mut self, now: u64) {
        let Some(membership) = &mut self.membership else {
            return;
        };
        let (changes, sends) = membership.drain(now);
        for change in changes {
            match change {
                Change::Up(id, run) => {
                    if let Some(i) = self.member(id) {
                        self.down[i] = false;
                        self.known_run(i, run, now);
                    }
                }
                Change::Down(id, run) => {
                    if let Some(&i) = self.index.get(&id) {
                        self.down[i] = i != self.me;
                        self.known_run(i, run, now);
                    }
                }
                Change::Run(id, run) => {
                    if let Some(&i) = self.index.get(&id) {
                        self.known_run(i, run, now);
                    }
                }
            }
        }
        for (to, body) in sends {
            // SWIM sends to members, to a gateway it takes as live (added, if there is
            // room), and now and then to a member forgotten that it took for dead, which
            // stays forgotten (so the sides of a partition long healed find each other
            // again). Never to others: a founder sends to its members only.
            let i = match self.index.get(&to) {
                Some(&i) => Some(i),
                None if self.membership.as_ref().is_some_and(|m| m.is_live(to)) => {
                    let Some(i) = self.member(to) else {
                        continue;
                    };
                    Some(i)
                }
                None if self.forgotten.contains(&to) => None,
                None => continue,
            };
            let mut bytes = Vec::with_capacity(membership::HEAD + body.len());
            bytes.extend_from_slice(membership::MAGIC);
            bytes.extend_from_slice(&self.id.to_le_bytes());
            bytes.extend_from_slice(&to.to_le_bytes());
            let mut flags = 0;
            if self.config.mode == Mode::Escrow {
                flags |= membership::ESCROW;
            }
            if self.me < self.founders {
                flags |= membership::FOUNDER;
            }
            bytes.push(flags);
            bytes.extend_from_slice(&self.founders_digest.to_le_bytes());
            bytes.extend_from_slice(&body);
            let bytes = match i {
                Some(i) => self.seal(i, &bytes),
                None => self.seal_forgotten(&bytes),
            };
            self.sent.membership_datagrams += 1;
            self.sent.membership_bytes += bytes.len() as u64;
            self.pending.push(Outgoing { to, bytes });
        }
    }

    /// `bytes` sealed for member `i`, with the next sequence number to it.
    fn seal(&mut self, i: usize, bytes: &[u8]) -> Vec<u8> {
        match &self.config.sealer {
            Some(sealer) => {
                // Sequences run out after 2^64 datagrams; the last is then reused, and peers
                // drop it as replayed.
                let sequence = &mut self.sequences[i];
                *sequence = sequence.saturating_add(1);
                sealer.seal(*sequence, bytes)
            }
            None => bytes.to_vec(),
        }
    }

    /// `bytes` sealed for a gateway not a member, with a sequence number above any sent a
    /// member forgotten, and below those a member added later is sent.
    fn seal_forgotten(&mut self, bytes: &[u8]) -> Vec<u8> {
        match &self.config.sealer {
            Some(sealer) => {
                self.forgotten_sequence = self.forgotten_sequence.saturating_add(1);
                sealer.seal(self.forgotten_sequence, bytes)
            }
            None => bytes.to_vec(),
        }
    }

    /// Applies a membership datagram `body` (after the magic) from a sender whose sequence
    /// number, if sealed, is `sequence`.
    fn receive_membership(&mut self, now: u64, sequence: Option<u64>, body: &[u8]) {
        let Some(membership) = &mut self.membership else {
            self.dropped.strangers += 1;
            return;
        };
        if self.left {
            return;
        }
        let head = membership::HEAD - membership::MAGIC.len();
        let word = |at: usize| {
            body.get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
        };
        let (Some(from), Some(to), Some(&flags), Some(digest)) =
            (word(0), word(8), body.get(16), word(17))
        else {
            self.dropped.malformed += 1;
            return;
        };
        if flags & !(membership::ESCROW | membership::FOUNDER) != 0 {
            self.dropped.malformed += 1;
            return;
        }
        let (escrow, founder) = (
            flags & membership::ESCROW != 0,
            flags & membership::FOUNDER != 0,
        );
        if to != self.id || from == self.id || escrow != (self.config.mode == Mode::Escrow) {
            self.dropped.strangers += 1;
            return;
        }
        // A gateway not yet a member is let in by what SWIM makes of it (its datagram is
        // sealed under the mesh's secret, so it holds it); one known is held to its window.
        let known = self.index.get(&from).copied();
        if let (Some(sequence), Some(i)) = (sequence, known)
            && !self.windows[i].accept(sequence)
        {
            self.dropped.replayed += 1;
            return;
        }
        if !membership.receive(now, &body[head..]) {
            self.dropped.malformed += 1;
        }
        self.membership_out(now);
        if let (Some(sequence), None, Some(&i)) = (sequence, known, self.index.get(&from)) {
            self.windows[i].accept(sequence);
        }
        // A founder sends to its members only: it counts this gateway (a joiner counted by
        // joiners alone is counted by no one who decides).
        self.let_in |= founder;
        // A founder (by its own list) made with another list than this gateway's: the first
        // shares do not sum to the quota, and this gateway gives its up.
        if founder && self.me < self.founders && digest != self.founders_digest {
            self.disown(now);
        }
    }

    /// Gives up this gateway's first share of every quota, for good: its founders' list is
    /// not its co-founders'. What it gave from it already is owed, repaid from the next
    /// shares it is given.
    fn disown(&mut self, now: u64) {
        if self.disowned {
            return;
        }
        self.disowned = true;
        let first = first_share(self.me, self.founders);
        for (slot, state) in &mut self.slots {
            if let Bucket::Share(bucket) = &mut state.bucket {
                let short = bucket.give_up(&slot.quota, now, first);
                state.debt = state.debt.saturating_add(short);
            }
        }
    }

    /// Whether this founder heard a gateway made a founder with another list of founders
    /// ([`Node::new`]): the first shares then do not sum to the quota, and this gateway holds
    /// no first share of any quota (escrow; it admits what its peers give it) until the
    /// lists are mended. Known once it hears such a founder by SWIM ([`Config::discover`]),
    /// and for this run: restart it once the founders agree (a list changed on some
    /// founders only leaves each that heard the other list without its first share).
    ///
    /// ```
    /// use ratewarden_mesh::{Config, Mode, Node};
    /// let node = Node::new(1, &[1, 2], Config::new(Mode::Escrow));
    /// assert!(!node.founders_disagree());
    /// ```
    #[must_use]
    pub const fn founders_disagree(&self) -> bool {
        self.disowned
    }

    fn fresh(&self, quota: &Quota, now: u64) -> Bucket {
        let share = self.first_share(self.me);
        fresh_bucket(self.config.mode, quota, now, share, self.share_holders())
    }

    /// Units of `key` under `quota` this gateway knows were admitted across the mesh (eventual
    /// mode; 0 in escrow mode or for a key it has no state for), each gateway's since its
    /// count last started over (see the crate docs).
    #[must_use]
    pub fn admitted_seen(&self, key: &Key, quota: &Quota) -> u64 {
        let slot = Slot::checked(key, quota);
        match self.slots.get(&slot) {
            Some(state) if matches!(state.bucket, Bucket::Owing(_)) => {
                state.views.iter().map(|v| v.a).sum()
            }
            _ => 0,
        }
    }

    /// Units of `key` under `quota` this gateway knows `origin` admitted (eventual mode; 0
    /// otherwise).
    #[must_use]
    pub fn admitted_from(&self, key: &Key, quota: &Quota, origin: NodeId) -> u64 {
        let slot = Slot::checked(key, quota);
        let Some(&i) = self.index.get(&origin) else {
            return 0;
        };
        match self.slots.get(&slot) {
            Some(state) if matches!(state.bucket, Bucket::Owing(_)) => state.views[i].a,
            _ => 0,
        }
    }

    /// This gateway's share of `quota` for `key`, in parts per million (escrow mode; `None`
    /// in eventual mode or for a key it has no state for: its share is then its first one).
    #[must_use]
    pub fn share(&self, key: &Key, quota: &Quota) -> Option<u64> {
        let slot = Slot::checked(key, quota);
        match &self.slots.get(&slot)?.bucket {
            Bucket::Share(bucket) => Some(bucket.share()),
            Bucket::Owing(_) => None,
        }
    }

    /// One gossip round: rebalances escrow shares, and returns the datagrams to send. It
    /// finishes a round [under way](Self::advance_round) first, if one is.
    pub fn tick(&mut self, now: Timestamp) -> Vec<Outgoing> {
        loop {
            if let Some(out) = self.advance_round(now, usize::MAX) {
                return out;
            }
        }
    }

    /// A gossip round done a few slots at a time: visits at most `slots` slots (one at
    /// least) of the round under way (starting one if none is), and answers the round's
    /// datagrams once it is done. A round visits each slot held twice (to rebalance it, then to gossip it), so a
    /// caller that holds a lock over the node while it calls this, and lets go between
    /// calls, keeps its checks from waiting on a whole round. [`tick`](Self::tick) does a
    /// round at once.
    ///
    /// Checks, datagrams received and departures may come between the steps: each slot is
    /// visited as it is at its step, as if the round had come before or after what changed
    /// it. The round's start (membership, the length of the round, which peers count) and
    /// its end (the repair, the datagrams) are each done in one step.
    ///
    /// ```
    /// use ratewarden_core::{Key, Quota, Timestamp};
    /// use ratewarden_mesh::{Config, Mode, Node};
    /// let mut a = Node::new(1, &[1, 2], Config::new(Mode::Eventual));
    /// let quota: Quota = "10/s".parse()?;
    /// let now = Timestamp::from_micros(0);
    /// for key in ["k1", "k2", "k3"] {
    ///     a.check(now, &Key::from(key), &quota, 1)?;
    /// }
    /// let mut steps = 1;
    /// let out = loop {
    ///     if let Some(out) = a.advance_round(now, 1) {
    ///         break out;
    ///     }
    ///     // A check may come between two steps.
    ///     a.check(now, &Key::from("k1"), &quota, 1)?;
    ///     steps += 1;
    /// };
    /// assert!(steps > 1);
    /// assert!(!out.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn advance_round(&mut self, now: Timestamp, slots: usize) -> Option<Vec<Outgoing>> {
        self.advance_round_unsealed(now, slots).map(Unsealed::seal)
    }

    /// [`advance_round`](Self::advance_round), its datagrams numbered but not yet sealed,
    /// so that a caller holding a lock over the node seals them after letting go.
    pub(crate) fn advance_round_unsealed(
        &mut self,
        now: Timestamp,
        slots: usize,
    ) -> Option<Unsealed> {
        let now = now.as_micros();
        let mut round = match self.under_way.take() {
            Some(round) => round,
            None => self.start_round(now),
        };
        // A step visits one slot at least, so that steps always come to the round's end.
        let mut budget = slots.max(1);
        if let Some(rebalance) = &round.rebalance {
            // Escrow: each slot rebalanced (no more once this gateway left).
            while !self.left {
                let Some((slot, state)) = self.slots.get_index_mut(round.at) else {
                    break;
                };
                if budget == 0 {
                    self.under_way = Some(round);
                    return None;
                }
                budget -= 1;
                // The incarnation as it is now: a later run (`move_above`) may have come
                // since the round began.
                let incarnation = self.config.incarnation;
                state.rebalance(&slot.quota, rebalance, incarnation, now);
                round.at += 1;
            }
            round.rebalance = None;
            round.at = 0;
        }
        if !round.gossiping {
            self.sweep(now);
            self.forget_gone(now);
            self.choose_peers(&mut round);
        }
        // Gossip: what changed lately, any origin's; escrow: transfers until acknowledged,
        // and acknowledgements, to each peer concerned.
        // An eventual entry tells how long ago its origin last admitted, on no one's clock.
        let age = (self.config.mode == Mode::Eventual).then_some(now);
        while let Some((slot, state)) = self.slots.get_index_mut(round.at) {
            if budget == 0 {
                self.under_way = Some(round);
                return None;
            }
            budget -= 1;
            round.at += 1;
            for (origin, view) in state.views.iter_mut().enumerate() {
                if view.hot > 0 {
                    view.hot -= 1;
                    let life = life_of(origin, self.me, state.life, &state.lives);
                    let entry = entry(slot, self.members[origin], view, age, life);
                    round.gossip.push(entry);
                }
            }
            for (peer, given) in state.given.iter().enumerate() {
                if given.acked < given.share {
                    at_least(&mut round.transfers, peer).push(Transfer {
                        slot: slot.clone(),
                        from_life: state.life,
                        to_life: state.lives[peer],
                        share: given.share,
                        tokens: given.tokens,
                    });
                }
            }
            for (peer, due) in state.ack_due.iter_mut().enumerate() {
                if std::mem::take(due) {
                    at_least(&mut round.acks, peer).push(Ack {
                        slot: slot.clone(),
                        from_life: state.life,
                        to_life: state.lives[peer],
                        share: state.received[peer].0,
                    });
                }
            }
        }
        Some(self.end_round(round, now))
    }

    /// A round's start: membership's round, and (escrow) what its rebalancing goes by or
    /// (once this gateway left) its shares handed on.
    fn start_round(&mut self, now: u64) -> Round {
        self.round += 1;
        // One that left stays out: SWIM would take it back in.
        if let Some(membership) = self.membership.as_mut().filter(|_| !self.left) {
            membership.tick(now, &self.members);
        }
        self.membership_out(now);
        let mut rebalance = None;
        if self.left {
            self.part(now);
        } else if self.config.mode == Mode::Escrow {
            rebalance = Some(self.rebalancing(now));
        }
        Round {
            rebalance,
            at: 0,
            gossiping: false,
            peers: Vec::new(),
            beat: 0,
            heads: Vec::new(),
            gossip: Vec::new(),
            transfers: Vec::new(),
            acks: Vec::new(),
        }
    }

    /// Picks the round's peers: `fanout` at random hear what changed lately, and one in
    /// turn hears that this gateway is alive, so that every member hears from every other
    /// at least every `n - 1` rounds, whatever the draws.
    fn choose_peers(&mut self, round: &mut Round) {
        let n = self.members.len();
        let mut peers: Vec<usize> = (0..n).filter(|&i| i != self.me).collect();
        self.rng.shuffle(&mut peers);
        peers.truncate(self.config.fanout);
        self.beat_at = (self.beat_at + 1) % n;
        if self.beat_at == self.me {
            self.beat_at = (self.beat_at + 1) % n;
        }
        round.peers = peers;
        round.beat = self.beat_at;
        round.gossiping = true;
        round.at = 0;
        round.heads = self
            .members
            .iter()
            .enumerate()
            .map(|(i, &peer)| Datagram {
                from: self.id,
                to: peer,
                incarnation: self.config.incarnation,
                to_incarnation: self.incarnations[i].unwrap_or(0),
                to_sequence: self.windows[i].highest(),
                escrow: self.config.mode == Mode::Escrow,
                left: self.left,
                region: self.config.region,
                fixed_split: self.config.region_rounds.is_none(),
                ..Datagram::default()
            })
            .collect();
    }

    /// A round's end: the repair, and the datagrams, numbered to be sealed.
    ///
    /// Their heads are as the gossip began, for what was gathered since is of the runs then
    /// known: a member's restart heard meanwhile voids what was gathered for its run before,
    /// and this gateway's own move to a later run ([`Node::move_above`]) all of it, as the
    /// datagrams of a round before would be (transfers are sent again until acknowledged,
    /// and acknowledged again as they come).
    fn end_round(&mut self, mut round: Round, now: u64) -> Unsealed {
        let mut to = std::mem::take(&mut round.heads);
        let moved = to
            .first()
            .is_some_and(|head| head.incarnation != self.config.incarnation);
        if moved {
            round.gossip.clear();
            round.transfers.clear();
            round.acks.clear();
        }
        for (i, head) in to.iter().enumerate() {
            if head.to_incarnation != self.incarnations[i].unwrap_or(0) {
                round.transfers.get_mut(i).map(Vec::clear);
                round.acks.get_mut(i).map(Vec::clear);
            }
        }
        let age = (self.config.mode == Mode::Eventual).then_some(now);
        // Repair: what this gateway knows of a few slots (any origin's entries that are no
        // longer relayed), round robin, so a view that missed an update or was cut off is
        // made whole.
        let mut repaired = 0;
        for _ in 0..self.slots.len() {
            if moved || repaired >= self.config.repair_per_round {
                break;
            }
            self.repair_at = (self.repair_at + 1) % self.slots.len();
            if let Some((slot, state)) = self.slots.get_index(self.repair_at) {
                for (origin, view) in state.views.iter().enumerate() {
                    if view.hot == 0 && view.version > 0 {
                        let life = life_of(origin, self.me, state.life, &state.lives);
                        round
                            .gossip
                            .push(entry(slot, self.members[origin], view, age, life));
                        repaired += 1;
                    }
                }
            }
        }
        // The gossip, written once for the round's peers.
        let gossip = Written::entries(&round.gossip);
        for (d, transfers) in to.iter_mut().zip(round.transfers) {
            d.transfers = transfers;
        }
        for (d, acks) in to.iter_mut().zip(round.acks) {
            d.acks = acks;
        }
        let max = self.config.max_datagram;
        let overhead = if self.config.sealer.is_some() {
            seal::OVERHEAD
        } else {
            0
        };
        let mut numbered = Vec::new();
        for (i, d) in to.into_iter().enumerate() {
            // The round's peers, and the one in turn, hear from this gateway even when it
            // has nothing to say (it is alive); others only when it has.
            let empty = d.transfers.is_empty() && d.acks.is_empty();
            if i == self.me || (empty && i != round.beat && !round.peers.contains(&i)) {
                continue;
            }
            let written = round.peers.contains(&i).then_some(&gossip);
            for bytes in d.encode_with(written, max) {
                // Sequences run out after 2^64 datagrams; the last is then reused, and peers
                // drop it as replayed.
                let sequence = &mut self.sequences[i];
                *sequence = sequence.saturating_add(1);
                self.sent.datagrams += 1;
                self.sent.bytes += (bytes.len() + overhead) as u64;
                numbered.push((d.to, *sequence, bytes));
            }
        }
        self.sent.rounds += 1;
        Unsealed {
            sealed: std::mem::take(&mut self.pending),
            numbered,
            sealer: self.config.sealer.clone(),
        }
    }

    /// Applies a datagram from a peer. Applying one twice, or late, changes nothing.
    ///
    /// # Errors
    ///
    /// [`WireError`] for bytes that are not a datagram (counted in [`Dropped::malformed`]).
    /// A datagram from a stranger or for another gateway is dropped and counted
    /// ([`Dropped::strangers`]), not an error.
    pub fn receive(&mut self, now: Timestamp, bytes: &[u8]) -> Result<(), WireError> {
        let now = now.as_micros();
        let (sequence, bytes) = match &self.config.sealer {
            Some(sealer) => {
                let Some(opened) = sealer.open(bytes) else {
                    self.dropped.forged += 1;
                    return Ok(());
                };
                (Some(opened.0), opened.1)
            }
            None => (None, bytes),
        };
        if let Some(body) = bytes.strip_prefix(membership::MAGIC) {
            self.receive_membership(now, sequence, body);
            return Ok(());
        }
        let datagram = Datagram::decode(bytes).inspect_err(|_| self.dropped.malformed += 1)?;
        let Some(&from) = self.index.get(&datagram.from) else {
            self.dropped.strangers += 1;
            return Ok(());
        };
        if datagram.to != self.id || from == self.me {
            self.dropped.strangers += 1;
            return Ok(());
        }
        if let Some(sequence) = sequence
            && !self.windows[from].accept(sequence)
        {
            self.dropped.replayed += 1;
            return Ok(());
        }
        let mode = self.config.mode;
        if datagram.escrow != (mode == Mode::Escrow) {
            self.dropped.strangers += 1; // a gateway of another mesh, in the other mode
            return Ok(());
        }
        match self.incarnations[from] {
            Some(known) if datagram.incarnation < known => {
                self.dropped.stale += 1;
                // Each side may hold the other above a run it forgot: the one told it is
                // known above its own moves above, or neither would hear the other again.
                if datagram.to_incarnation > self.config.incarnation {
                    self.move_above(datagram.to_incarnation, now);
                }
                return Ok(());
            }
            Some(known) if datagram.incarnation > known && mode == Mode::Escrow => {
                self.forget(from, now);
            }
            _ => {}
        }
        let later = self.incarnations[from].is_some_and(|known| datagram.incarnation > known);
        if later && let Some(membership) = &mut self.membership {
            // SWIM passes the later run on, to peers that may never hear it themselves.
            membership.learn(datagram.from, datagram.incarnation);
        }
        self.incarnations[from] = Some(datagram.incarnation);
        // A member that left says so in every datagram (its SWIM leave may be lost); a later
        // run of it is back.
        let left = datagram.left;
        if left {
            self.down[from] = true;
        } else if later {
            self.down[from] = false;
        }
        self.membership_out(now);
        // A peer that knows this gateway by a higher incarnation, or took higher sequence
        // numbers from it than this run sent, saw a run of it before this one (a clock
        // behind, the same incarnation again): this run moves above, or it would never be
        // heard, and settles with every peer as they will with it.
        if datagram.to_incarnation > self.config.incarnation
            || datagram.to_sequence > self.sequences[from]
        {
            self.move_above(datagram.to_incarnation, now);
        }
        let sequence = &mut self.sequences[from];
        *sequence = (*sequence).max(datagram.to_sequence);
        self.heard[from] = Some(now);
        self.heard_round[from] = self.round;
        self.regions[from] = Some(datagram.region);
        self.fixed_splits[from] = datagram.fixed_split;
        let (relay, members) = (self.relay_rounds, self.members.len());
        // Transfers and acknowledgements meant for this gateway's incarnation before are void.
        let for_me = datagram.to_incarnation == self.config.incarnation;
        let carries = !datagram.transfers.is_empty() || !datagram.acks.is_empty();
        // (0: the sender has not heard this gateway yet, and resends once it has.)
        if carries && !for_me && datagram.to_incarnation != 0 {
            self.dropped.stale += 1;
        }
        let (transfers, acks) = if for_me {
            (datagram.transfers, datagram.acks)
        } else {
            (Vec::new(), Vec::new())
        };
        for e in datagram.entries {
            let Some(&origin) = self.index.get(&e.origin) else {
                continue;
            };
            if mode == Mode::Escrow && origin == self.me {
                continue; // this gateway's share is its own to say
            }
            // What still weighs: eventual, a count whose last admission does; escrow, a
            // gateway refusing (its peers may give it a share), or any key of one that left
            // (it hands its shares over).
            let weighs = match mode {
                Mode::Eventual => may_weigh(&e.slot.quota, now.saturating_sub(e.c), now, members),
                Mode::Escrow => e.c > 0 || left,
            };
            if !weighs && !self.slots.contains_key(&e.slot) {
                // A key at rest here stays forgotten: an entry that weighs nothing (a late
                // datagram, a peer's repair) makes no state, nor is relayed.
                continue;
            }
            let Some(state) = self.state(e.slot.clone(), now) else {
                self.dropped.over_bound += 1;
                continue;
            };
            if mode == Mode::Escrow && e.life > 0 {
                state.meet(&e.slot.quota, origin, e.life, now);
            }
            let view = &mut state.views[origin];
            // Eventual: a count that started later is newer, and all it adds is new.
            let (newer, first) = match mode {
                Mode::Eventual => (
                    (e.b, e.version) > (view.b, view.version),
                    view.version == 0 || e.b != view.b,
                ),
                Mode::Escrow => (e.version > view.version, view.version == 0),
            };
            if !newer {
                continue;
            }
            if let Bucket::Owing(bucket) = &mut state.bucket {
                let quota = &e.slot.quota;
                let owed = if first {
                    // First heard of: at most what one period can have admitted, and
                    // nothing once its origin's last admission weighs no more.
                    if weighs {
                        e.a.min(u64::from(quota.burst()) + u64::from(quota.count()))
                    } else {
                        0
                    }
                } else {
                    e.a.saturating_sub(view.a)
                };
                bucket.owe(quota, now, owed);
            }
            *view = View {
                version: e.version,
                a: e.a,
                // No share is larger than the whole quota, whatever a member says.
                b: if mode == Mode::Escrow {
                    e.b.min(WHOLE)
                } else {
                    e.b
                },
                // Eventual: when its origin last admitted, on this gateway's clock (the
                // time in flight makes it later: a first hearing charges it longer).
                c: if mode == Mode::Eventual {
                    now.saturating_sub(e.c)
                } else {
                    e.c
                },
                hot: if weighs || mode == Mode::Escrow {
                    relay
                } else {
                    0
                },
            };
        }
        for t in transfers {
            let Some(state) = self.state(t.slot.clone(), now) else {
                self.dropped.over_bound += 1;
                continue;
            };
            // Between the lives of the slot known on both ends, or dropped: one from a life
            // of the sender's before is stale; one for a life of this gateway's before is
            // answered with this life, so that the sender settles with the one before.
            if !state.meet(&t.slot.quota, from, t.from_life, now) {
                self.dropped.stale += 1;
                continue;
            }
            if t.to_life != state.life {
                state.ack_due[from] = true;
                self.dropped.stale += 1;
                continue;
            }
            if let Bucket::Share(bucket) = &mut state.bucket {
                let (share, tokens) = &mut state.received[from];
                let (mut more_share, mut more_tokens) = (
                    t.share.saturating_sub(*share),
                    t.tokens.saturating_sub(*tokens),
                );
                *share = (*share).max(t.share);
                *tokens = (*tokens).max(t.tokens);
                if state.debt > 0 && more_share > 0 {
                    // A debt is repaid first, with the tokens that came with it.
                    let repaid = state.debt.min(more_share);
                    let with =
                        u128::from(more_tokens) * u128::from(repaid) / u128::from(more_share);
                    more_tokens -= u64::try_from(with).unwrap_or(more_tokens).min(more_tokens);
                    more_share -= repaid;
                    state.debt -= repaid;
                }
                bucket.add(&t.slot.quota, now, more_share, more_tokens);
                state.ack_due[from] = true;
            }
        }
        for a in acks {
            if let Some(state) = self.slots.get_mut(&a.slot)
                && state.meet(&a.slot.quota, from, a.from_life, now)
                && a.to_life == state.life
            {
                let given = &mut state.given[from];
                given.acked = given.acked.max(a.share).min(given.share);
            }
        }
        Ok(())
    }

    /// Escrow: member `from` restarted, holding its first share again. What this gateway
    /// had been given by its incarnation before, beyond what it gave it, is given up (owed,
    /// if it has passed it on: repaid from the next shares it is given); what it gave it
    /// beyond what it was given comes back, as share without tokens (a debt repaid first).
    /// So the shares held sum to what they did, less what the one before held above its
    /// first share. Running totals with it start over.
    fn forget(&mut self, from: usize, now: u64) {
        self.settle_with(from, now);
        for state in self.slots.values_mut() {
            state.views[from] = View::default();
            state.lives[from] = 0;
        }
    }

    /// This run takes an incarnation above `known` (and its own) by more than any run's
    /// rounds, so its entries outrank any its run before sent and peers settle with that
    /// run; it settles with every peer alike, as it would with a restarted one.
    fn move_above(&mut self, known: u64, now: u64) {
        let above = known
            .max(self.config.incarnation)
            .saturating_add(ROUNDS_A_RUN);
        self.config.incarnation = above;
        if let Some(membership) = &mut self.membership {
            membership.rerun(above);
        }
        if self.config.mode == Mode::Escrow {
            let me = self.me;
            for peer in (0..self.members.len()).filter(|&p| p != me) {
                self.settle_with(peer, now);
            }
            // Its slots take lives above the run's before too (nothing is exchanged with
            // them yet): a peer that hears a life of that run late takes it as earlier.
            for state in self.slots.values_mut() {
                state.life = above.saturating_add(self.made).saturating_add(1);
                state.views[me].hot = self.relay_rounds;
                self.made += 1;
            }
        }
    }

    /// Escrow: undoes the shares exchanged with member `from` (see [`Node::forget`]) and
    /// starts the running totals with it over.
    fn settle_with(&mut self, from: usize, now: u64) {
        for (slot, state) in &mut self.slots {
            state.settle(&slot.quota, from, now);
        }
    }

    /// Forgets slots at rest ([`State::at_rest`]), visiting [`SWEPT_A_ROUND`] in turn: a
    /// fresh one is made as it is needed again.
    fn sweep(&mut self, now: u64) {
        let (me, first) = (self.me, self.first_share(self.me));
        for _ in 0..SWEPT_A_ROUND.min(self.slots.len()) {
            if self.slots.is_empty() {
                break;
            }
            self.sweep_at = (self.sweep_at + 1) % self.slots.len();
            let rest = self
                .slots
                .get_index_mut(self.sweep_at)
                .is_none_or(|(slot, state)| state.at_rest(&slot.quota, now, me, first, &self.down));
            if rest {
                self.slots.swap_remove_index(self.sweep_at);
            }
        }
    }

    /// Forgets joiners gone for [`FORGET_AFTER`] (not heard from, SWIM not taking them as
    /// live; SWIM keeps them as dead, asking them now and then to let this gateway in) with
    /// which every slot is even ([`State::even_with`]), so that settling with them would
    /// move nothing: they no longer count against [`Config::max_members`]. Run
    /// every [`FORGET_EVERY`] rounds. The members it was made with are kept: founders hold
    /// first shares, and a joiner's seeds are whom it asks to let it in.
    fn forget_gone(&mut self, now: u64) {
        if !self.round.is_multiple_of(FORGET_EVERY) {
            return;
        }
        let interval = u64::try_from(self.config.interval.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let after = FORGET_AFTER.div_ceil(interval).max(self.quiet_rounds());
        let n = self.members.len();
        for j in (self.made_with..n).rev() {
            if j == self.me || self.round.saturating_sub(self.heard_round[j]) <= after {
                continue;
            }
            let Some(membership) = &self.membership else {
                return;
            };
            if !membership.is_live(self.members[j])
                && self
                    .slots
                    .iter()
                    .all(|(slot, state)| state.even_with(&slot.quota, j, now, n))
            {
                self.remove_member(j);
            }
        }
    }

    /// Removes member `j` from every list, keeping what is needed to hold a member added
    /// later above its run and sequence numbers.
    fn remove_member(&mut self, j: usize) {
        let id = self.members.remove(j);
        self.index.remove(&id);
        if self.forgotten.len() >= FORGOTTEN_KEPT {
            self.forgotten.pop_front();
        }
        self.forgotten.push_back(id);
        for i in self.index.values_mut() {
            if *i > j {
                *i -= 1;
            }
        }
        self.down.remove(j);
        let sequence = self.sequences.remove(j);
        self.forgotten_sequence = self.forgotten_sequence.max(sequence);
        self.windows.remove(j);
        if let Some(run) = self.incarnations.remove(j) {
            self.forgotten_run = Some(self.forgotten_run.map_or(run, |r| r.max(run)));
        }
        self.heard.remove(j);
        self.heard_round.remove(j);
        self.regions.remove(j);
        self.fixed_splits.remove(j);
        if self.me > j {
            self.me -= 1;
        }
        if self.beat_at > j {
            self.beat_at -= 1;
        }
        for state in self.slots.values_mut() {
            state.views.remove(j);
            state.given.remove(j);
            state.received.remove(j);
            state.ack_due.remove(j);
            state.lives.remove(j);
        }
    }

    /// The slot's state, made if new and there is room.
    fn state(&mut self, slot: Slot, now: u64) -> Option<&mut State> {
        // The slot is hashed once: a check of a key known is one lookup.
        let len = self.slots.len();
        match self.slots.entry(slot) {
            SlotEntry::Occupied(entry) => Some(entry.into_mut()),
            SlotEntry::Vacant(_) if len >= self.config.max_slots => None,
            SlotEntry::Vacant(entry) => {
                let n = self.members.len();
                // What `fresh` makes, from fields borrowed apart from the slots.
                let share = if self.disowned {
                    0
                } else {
                    first_share(self.me, self.founders)
                };
                let holders = share_holders(&self.config, n);
                let bucket =
                    fresh_bucket(self.config.mode, &entry.key().quota, now, share, holders);
                let state = State {
                    views: vec![View::default(); n],
                    bucket,
                    requested: 0,
                    refused: 0,
                    demand: 0,
                    pressure: 0,
                    // Later than any life before it, this run's or (incarnations growing faster
                    // than slots are made) a run's before.
                    life: self
                        .config
                        .incarnation
                        .saturating_add(self.made)
                        .saturating_add(1),
                    lives: vec![0; n],
                    given: vec![Given::default(); n],
                    received: vec![(0, 0); n],
                    ack_due: vec![false; n],
                    debt: 0,
                    // A ticket of a slot forgotten since finds no hold of this one.
                    holds: Holds {
                        round: self.made << 32,
                        ..Holds::default()
                    },
                };
                self.made += 1;
                Some(entry.insert(state))
            }
        }
    }

    /// Escrow: what this round's rebalancing goes by ([`State::rebalance`]).
    ///
    /// A member not heard from for [`Node::quiet_rounds`] is taken as gone: its demand
    /// counts for nothing and it is given nothing (what it holds stays with it).
    fn rebalancing(&mut self, now: u64) -> Rebalance {
        let me = self.me;
        // This round's length, µs (the first: a second): how much its demand weighs.
        let length = self
            .last_round
            .replace(now)
            .map_or(MICRO, |last| now.saturating_sub(last).max(1));
        let n = self.members.len();
        // Shares go to gateways of this region, and of others every `region_rounds`. A
        // gateway of another region with which either side keeps a fixed split is apart, as
        // one gone is: given nothing (it would give nothing back), and parts are reckoned on
        // what the gateways not apart hold. What comes back along the books goes to any
        // live peer.
        let region = Some(self.config.region);
        let across = self
            .config
            .region_rounds
            .is_some_and(|every| self.round.is_multiple_of(u64::from(every.max(1))));
        let (regions, fixed_splits) = (&self.regions, &self.fixed_splits);
        let gone = self.gone();
        let apart: Vec<bool> = (0..n)
            .map(|i| {
                gone[i]
                    || (i != me && regions[i] != region && (fixed_splits[me] || fixed_splits[i]))
            })
            .collect();
        let split = (0..n).any(|i| apart[i] && !gone[i]);
        Rebalance {
            me,
            round: self.round,
            relay: self.relay_rounds,
            founders: self.founders,
            length,
            region,
            regions: regions.clone(),
            across,
            gone,
            apart,
            split,
        }
    }
}

/// Escrow: what a round's rebalancing goes by, read as the round starts: members added
/// since (beyond `gone`'s length) wait for the next round.
#[derive(Debug)]
struct Rebalance {
    me: usize,
    round: u64,
    relay: u8,
    founders: usize,
    /// The round's length, µs.
    length: u64,
    region: Option<u16>,
    regions: Vec<Option<u16>>,
    /// Whether shares go to gateways of other regions this round.
    across: bool,
    /// Members taken as gone ([`Node::gone`]), and those apart: gone, or of another region
    /// with which either side keeps a fixed split; `split` if any is apart and not gone.
    gone: Vec<bool>,
    apart: Vec<bool>,
    split: bool,
}

/// A round's datagrams: SWIM's, sealed as they were made, then the round's, numbered, to
/// be sealed ([`Node::advance_round_unsealed`]).
#[derive(Debug)]
pub(crate) struct Unsealed {
    sealed: Vec<Outgoing>,
    numbered: Vec<(NodeId, u64, Vec<u8>)>,
    sealer: Option<Sealer>,
}

impl Unsealed {
    /// The datagrams to send, each sealed under its number.
    pub(crate) fn seal(self) -> Vec<Outgoing> {
        let mut out = self.sealed;
        out.extend(self.numbered.into_iter().map(|(to, sequence, bytes)| {
            let bytes = match &self.sealer {
                Some(sealer) => sealer.seal(sequence, &bytes),
                None => bytes,
            };
            Outgoing { to, bytes }
        }));
        out
    }
}

/// A round under way ([`Node::advance_round`]).
#[derive(Debug)]
struct Round {
    /// Escrow: what the rebalancing goes by, while slots are rebalanced.
    rebalance: Option<Rebalance>,
    /// The next slot (by index) the round visits.
    at: usize,
    /// Whether slots are swept and the peers picked: slots are gossiped.
    gossiping: bool,
    /// The peers that hear what changed, and the one in turn.
    peers: Vec<usize>,
    beat: usize,
    /// Each member's datagram head, as the gossip began.
    heads: Vec<Datagram>,
    /// Entries for `peers`, and each member's transfers and acknowledgements (by index).
    gossip: Vec<Entry>,
    transfers: Vec<Vec<Transfer>>,
    acks: Vec<Vec<Ack>>,
}

impl State {
    /// Escrow: the slot's demand is updated and, while some gateway refuses, one that
    /// holds more than its max-min fair part of the quota's rate (reckoned on every member's
    /// demand, in whole units of the burst) gives half the difference, at least a unit's
    /// worth, to those holding less than theirs.
    /// Its own view is versioned above what runs before `incarnation` (this gateway's
    /// run) could have sent.
    fn rebalance(&mut self, quota: &Quota, r: &Rebalance, incarnation: u64, now: u64) {
        let (me, n, apart) = (r.me, r.gone.len(), &r.apart);
        // Lapsed holds pin no share.
        self.lapse(now);
        let share = match &self.bucket {
            Bucket::Share(bucket) => bucket.share(),
            Bucket::Owing(_) => return,
        };
        // What this gateway asks for: its demand over the long run (an estimate steady
        // enough that demand spread over some gateways, however sparse, keeps shares
        // spread over them too; a burst raises it at once), and whether it had to refuse
        // over the last few rounds (shares move only then).
        let own = self.views[me];
        // The quota's rate, in micro-units a second: no one asks for more (a storm of
        // refused requests asks for the whole rate, no more).
        let capacity = capacity(quota);
        let requested = std::mem::take(&mut self.requested);
        self.demand = average_rate(self.demand, requested, r.length, horizon(quota)).min(capacity);
        // A thousandth of the rate is none: an idle key's demand settles at 0 (and is
        // told once) rather than decaying for minutes.
        if self.demand <= capacity / 1_000 {
            self.demand = 0;
        }
        self.pressure = ewma(self.pressure, std::mem::take(&mut self.refused), FAST);
        // A gateway in debt asks for the whole rate, as if it refused a unit a round,
        // until what it owes is repaid.
        let (demand, pressure) = if self.debt > 0 {
            (capacity, self.pressure.max(1_000))
        } else {
            (self.demand, self.pressure)
        };
        // While no gateway refuses, demand moves no share: it is told again once it moved
        // by more than a quarter, or to or from zero (it decays for a minute or more after
        // a key is used, and telling each step would gossip every key used lately every
        // round). While one refuses, it is told as it is.
        // (This gateway's told pressure is `pressure`: it is told again whenever it changes.)
        let refusing =
            pressure != 0 || (0..n).any(|i| i != me && !apart[i] && self.views[i].c != 0);
        let demand_moved = if refusing || demand == 0 || own.a == 0 {
            demand != own.a
        } else {
            demand.abs_diff(own.a) > demand.max(own.a) / 4
        };
        if demand_moved || share != own.b || pressure != own.c || own.version == 0 {
            self.views[me] = View {
                // Above every version an incarnation before could have sent.
                version: incarnation.saturating_add(r.round),
                a: demand,
                b: share,
                c: pressure,
                hot: r.relay,
            };
        }
        let share_of = |i: usize, view: &View| {
            if view.version == 0 {
                first_share(i, r.founders)
            } else {
                view.b
            }
        };
        // Shares move only while some gateway refuses, toward each one's max-min fair
        // part of the quota's rate (in whole units of its burst).
        if !refusing {
            if demand == 0 {
                self.repay(quota, now, me, &r.gone);
            }
            return;
        }
        let views = &self.views;
        let wants: Vec<u128> = (0..n)
            .map(|i| {
                let v = &views[i];
                if apart[i] {
                    0
                } else {
                    u128::from(v.a.min(capacity))
                }
            })
            .collect();
        // Under a fixed split, the parts are of what the gateways not apart hold.
        let pool = if r.split {
            (0..n)
                .filter(|&i| !apart[i])
                .map(|i| share_of(i, &views[i]))
                .sum::<u64>()
                .min(WHOLE)
        } else {
            WHOLE
        };
        let rate = u128::from(capacity) * u128::from(pool) / u128::from(WHOLE);
        let parts = fair_parts(&wants, apart, rate);
        let target = in_units(&parts, quota.burst(), pool);
        // Half of what it holds above its part a round, so that shares settle rather than
        // swing; and at least a unit's share, so that a part of whole units is reached.
        let unit = (WHOLE / u64::from(quota.burst()).max(1)).max(1);
        let above = share.saturating_sub(target[me]);
        if above < WHOLE / 1_000 {
            return;
        }
        let excess = (above / 2).max(above.min(unit));
        // Only to members whose life of the slot is known (heard in their entries).
        let lives = &self.lives;
        let needs: Vec<(usize, u64)> = (0..n)
            .filter(|&i| i != me && lives[i] != 0 && (r.across || r.regions[i] == r.region))
            .map(|i| (i, target[i].saturating_sub(share_of(i, &views[i]))))
            .filter(|&(_, need)| need > 0)
            .collect();
        let total_need: u128 = needs.iter().map(|&(_, need)| u128::from(need)).sum();
        if total_need == 0 {
            return;
        }
        let giving = u128::from(excess).min(total_need);
        let Bucket::Share(bucket) = &mut self.bucket else {
            return;
        };
        for (peer, need) in needs {
            let part = u64::try_from(giving * u128::from(need) / total_need).unwrap_or(0);
            let (part, tokens) = bucket.take(quota, now, part);
            let given = &mut self.given[peer];
            given.share += part;
            given.tokens += tokens;
        }
    }
}

/// The list at index `i` of `lists`, made (with those before it) if there is none yet.
fn at_least<T>(lists: &mut Vec<Vec<T>>, i: usize) -> &mut Vec<T> {
    if lists.len() <= i {
        lists.resize_with(i + 1, Vec::new);
    }
    &mut lists[i]
}

/// Eventual: how much later than this gateway an entry may place a count's last admission
/// (its time in flight, relays' and repairs' among it) and still find the slot it counts
/// in: a slot is forgotten only once no count would weigh even this much later, so an
/// entry that comes after finds it weighing nothing and makes no state (µs).
const LATE: u64 = 5 * MICRO;

/// Slots each round visits to forget those at rest: all of 100,000 every 40 s at 100 ms.
const SWEPT_A_ROUND: usize = 256;

/// How long a joiner is gone before it may be forgotten (µs): a minute, far longer than
/// SWIM takes to find a member dead, so a member forgotten is one that left, died, or was
/// cut off a long while.
const FORGET_AFTER: u64 = 60 * MICRO;

/// Members forgotten that SWIM may still ask to let a gateway in (as it asks members it
/// took for dead): the last so many forgotten.
const FORGOTTEN_KEPT: usize = 256;

/// Rounds between looks for members to forget.
const FORGET_EVERY: u64 = 16;

/// More rounds than a run lasts (13 years at 100 ms): what a run that moves above its run
/// before adds to the incarnation it learnt, so that its entries' versions (the incarnation
/// plus the round) outrank any that run sent.
const ROUNDS_A_RUN: u64 = 1 << 32;

/// Each live member's part of `capacity` (micro-units a second), max-min fair
/// over what each `wants`: no one is given more than it wants while another wants more,
/// and what no one wants is split evenly.
fn fair_parts(wants: &[u128], gone: &[bool], capacity: u128) -> Vec<u128> {
    let mut live: Vec<usize> = (0..wants.len()).filter(|&i| !gone[i]).collect();
    live.sort_unstable_by_key(|&i| wants[i]);
    let mut parts = vec![0; wants.len()];
    let mut left = capacity;
    for (k, &i) in live.iter().enumerate() {
        let level = left / (live.len() - k) as u128;
        parts[i] = wants[i].min(level);
        left -= parts[i];
    }
    let spare = left / live.len().max(1) as u128;
    for &i in &live {
        parts[i] += spare;
    }
    parts
}

/// Parts of `pool` (millionths of the quota) in proportion to `parts`, in whole units of a
/// quota's `burst` (a share too small to hold one unit admits nothing): each member's part
/// rounded down, the units left to those whose parts lost the most by it.
fn in_units(parts: &[u128], burst: u32, pool: u64) -> Vec<u64> {
    let total = parts.iter().sum::<u128>().max(1);
    let burst = u128::from(burst.max(1));
    // Rounded up: a part of a unit left over is some gateway's to ask for.
    let units_in_pool = (burst * u128::from(pool.min(WHOLE))).div_ceil(u128::from(WHOLE));
    let mut units: Vec<u128> = parts.iter().map(|&p| p * units_in_pool / total).collect();
    let left = units_in_pool.saturating_sub(units.iter().sum());
    let mut order: Vec<usize> = (0..parts.len()).filter(|&i| parts[i] > 0).collect();
    order
        .sort_unstable_by_key(|&i| std::cmp::Reverse((parts[i] * units_in_pool % total, parts[i])));
    for &i in order
        .iter()
        .take(usize::try_from(left).unwrap_or(usize::MAX))
    {
        units[i] += 1;
    }
    units
        .iter()
        .map(|&u| u64::try_from(u * u128::from(WHOLE) / burst).unwrap_or(WHOLE))
        .collect()
}

/// The quota's rate, in micro-units a second (at least 1).
fn capacity(quota: &Quota) -> u64 {
    u64::try_from(
        u128::from(quota.count()) * 1_000_000_000_000 / u128::from(quota.period_micros()).max(1),
    )
    .unwrap_or(u64::MAX)
    .max(1)
}

/// The time a gateway's demand is averaged over for `quota`, µs: the time its bucket takes
/// to fill (`B / rate`), within 1 s and 20 s.
fn horizon(quota: &Quota) -> u64 {
    let fill = u128::from(quota.burst()) * u128::from(quota.period_micros())
        / u128::from(quota.count()).max(1);
    u64::try_from(fill)
        .unwrap_or(u64::MAX)
        .clamp(MICRO, 20 * MICRO)
}

/// A demand of `average` micro-units a second, moved toward `units` asked for in the last
/// `length` µs by `length / horizon` (all the way for a round as long as the horizon).
fn average_rate(average: u64, units: u64, length: u64, horizon: u64) -> u64 {
    let length = u128::from(length.min(horizon));
    let horizon = u128::from(horizon.max(1));
    let kept = u128::from(average) * (horizon - length) / horizon;
    // units / horizon s, in micro-units a second.
    let added = u128::from(units) * 1_000_000_000_000 / horizon;
    u64::try_from(kept + added).unwrap_or(u64::MAX)
}

/// Rounds the units refused are averaged over (while not zero, shares move).
const FAST: u64 = 4;

/// `average` moved toward `units` (in thousandths) by one part in `rounds`.
fn ewma(average: u64, units: u64, rounds: u64) -> u64 {
    let sum = u128::from(average) * u128::from(rounds - 1) + u128::from(units) * 1_000;
    u64::try_from(sum / u128::from(rounds)).unwrap_or(u64::MAX)
}

/// A fresh state's bucket in `mode` at `now`, holding `share` of the quota (escrow) of as
/// many as `holders` may hold.
fn fresh_bucket(mode: Mode, quota: &Quota, now: u64, share: u64, holders: usize) -> Bucket {
    match mode {
        Mode::Eventual => Bucket::Owing(OwingBucket::full(quota, now)),
        Mode::Escrow => Bucket::Share(ShareBucket::full(quota, share, now, holders)),
    }
}

/// How many gateways may hold shares under `config` with `members` members: the members, or
/// as many as may join.
fn share_holders(config: &Config, members: usize) -> usize {
    if config.discover {
        config.max_members.max(members)
    } else {
        members
    }
}

/// Member `i`'s share of a quota no one has moved yet, in a mesh of `founders`: equal parts
/// to the founders (the rest to the first), none to a gateway that joined since.
fn first_share(i: usize, founders: usize) -> u64 {
    if i >= founders {
        return 0;
    }
    let n = founders as u64;
    WHOLE / n + u64::from((i as u64) < WHOLE % n)
}

/// A view as an entry; in eventual mode (`age`: the time now) its `c`, when its origin last
/// admitted, as the time since.
fn entry(slot: &Slot, origin: NodeId, view: &View, age: Option<u64>, life: u64) -> Entry {
    Entry {
        slot: slot.clone(),
        origin,
        version: view.version,
        a: view.a,
        b: view.b,
        c: age.map_or(view.c, |now| now.saturating_sub(view.c)),
        life,
    }
}

/// Member `origin`'s life of a slot whose life here is `life` and whose members' are
/// `lives`, to tell with its entry.
fn life_of(origin: usize, me: usize, life: u64, lives: &[u64]) -> u64 {
    if origin == me { life } else { lives[origin] }
}

/// Whether the mesh decides `algorithm`: every one but the sliding log, whose timestamps
/// per unit no count or share stands for.
///
/// ```
/// use ratewarden_core::Algorithm;
/// assert!(ratewarden_mesh::supports(Algorithm::SlidingWindow));
/// assert!(!ratewarden_mesh::supports(Algorithm::SlidingLog));
/// ```
#[must_use]
pub const fn supports(algorithm: Algorithm) -> bool {
    !matches!(algorithm, Algorithm::SlidingLog)
}
