//! Who is in the mesh: SWIM (the `foca` crate) over the mesh's own datagrams, so that
//! gateways join through seeds, leave, and are found dead, with no list kept by hand.
//!
//! `foca` is sans-IO, as [`Node`](crate::Node) is: it is fed datagrams and timer events and
//! answers datagrams to send, timers to set and changes of membership. This module keeps its
//! timers on the node's clock (they fire at the node's next tick or datagram after they are
//! due) and frames its datagrams with a head of our own (magic, sender, receiver, mode), sealed
//! as gossip is.

use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use foca::{AccumulatingRuntime, Foca, Identity, NoCustomBroadcast, OwnedNotification, Timer};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::{Deserialize, Serialize};

use crate::wire::NodeId;

/// A membership datagram's magic number and version.
pub(crate) const MAGIC: &[u8; 4] = b"RWS1";
/// Its head: the magic, the sender, the receiver, flags ([`ESCROW`], [`FOUNDER`]), and a
/// digest of the sender's founders.
pub(crate) const HEAD: usize = 4 + 8 + 8 + 1 + 8;
/// A flag: the sender runs escrow.
pub(crate) const ESCROW: u8 = 1;
/// A flag: the sender founded the mesh (it holds a first share).
pub(crate) const FOUNDER: u8 = 2;

/// A digest of a mesh's founders (sorted), the same on every gateway and build: FNV-1a
/// over their ids.
pub(crate) fn founders_digest(founders: &[NodeId]) -> u64 {
    founders
        .iter()
        .flat_map(|id| id.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// A member as SWIM knows it: the gateway's id, its run (the node's incarnation: a
/// restarted gateway comes back under a later one), and how many times this run came back
/// after SWIM took it for dead (the same node, its shares and what it exchanged intact).
/// A later run, or the same run come back more times, wins over the one before.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct Member {
    id: NodeId,
    run: u64,
    back: u32,
}

impl Identity for Member {
    type Addr = NodeId;

    fn renew(&self) -> Option<Self> {
        let back = self.back.checked_add(1)?;
        Some(Self { back, ..*self })
    }

    fn addr(&self) -> NodeId {
        self.id
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        (self.run, self.back) > (adversary.run, adversary.back)
    }
}

/// A change of membership SWIM decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// A member (its id and run) joined, or came back.
    Up(NodeId, u64),
    /// A member was found dead or left.
    Down(NodeId, u64),
    /// A member is known under a later run, or came back: the run before may be over.
    Run(NodeId, u64),
}

type Swim = Foca<Member, foca::PostcardCodec, SmallRng, NoCustomBroadcast>;

/// One gateway's side of SWIM.
pub(crate) struct Membership {
    swim: Swim,
    runtime: AccumulatingRuntime<Member>,
    /// Timers set, with when they are due (µs).
    timers: Vec<(u64, Timer<Member>)>,
    /// When it last asked the gateways it knows to let it in, knowing no live member (µs).
    announced: Option<u64>,
    /// The latest time it was given (µs): a clock stepped back moves its timers back too.
    last: u64,
    /// How often it asks them again while it knows no live member (µs).
    announce_every: u64,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("members", &self.swim.num_members())
            .field("timers", &self.timers.len())
            .finish_non_exhaustive()
    }
}

impl Membership {
    /// `id`'s side of SWIM for this `run` of it, in a mesh of about `size` members;
    /// timeouts in multiples of `interval` (the time between the node's ticks, when what
    /// SWIM sends goes out), never below SWIM's defaults for a LAN; datagrams of at most
    /// `max_packet` bytes.
    pub(crate) fn new(
        id: NodeId,
        run: u64,
        size: usize,
        interval: Duration,
        max_packet: usize,
        seed: u64,
    ) -> Self {
        let size =
            NonZeroU32::new(u32::try_from(size).unwrap_or(u32::MAX)).unwrap_or(NonZeroU32::MIN);
        let mut config = foca::Config::new_lan(size);
        // What SWIM sends waits for the node's next tick, so a probe's answer takes up to two
        // intervals to come back: its timeouts count in intervals.
        config.probe_rtt = config.probe_rtt.max(interval * 4);
        config.probe_period = config.probe_period.max(interval * 10);
        config.suspect_to_down_after = config.suspect_to_down_after.max(interval * 30);
        // Members taken for dead are asked to let this one in every ten probes, so that two
        // sides of a healed partition find each other again.
        if let Some(periodic) = &mut config.periodic_announce_to_down_members {
            periodic.frequency = config.probe_period * 10;
        }
        config.max_packet_size =
            NonZeroUsize::new(max_packet.saturating_sub(HEAD).max(64)).unwrap_or(NonZeroUsize::MIN);
        let announce_every = u64::try_from(config.probe_period.as_micros()).unwrap_or(u64::MAX);
        let swim = Foca::new(
            Member { id, run, back: 0 },
            config,
            SmallRng::seed_from_u64(seed),
            foca::PostcardCodec,
        );
        Self {
            swim,
            runtime: AccumulatingRuntime::new(),
            timers: Vec::new(),
            announced: None,
            last: 0,
            announce_every,
        }
    }

    /// Fires the timers due at `now`, and while no member is live (a joiner let in by no
    /// one yet, or a gateway that took every peer for dead) asks every gateway it `knows`
    /// (the seeds, and every member it learnt of) to let it in.
    pub(crate) fn tick(&mut self, now: u64, knows: &[NodeId]) {
        self.fire(now);
        let due = self
            .announced
            .is_none_or(|at| now.saturating_sub(at) >= self.announce_every);
        if self.swim.num_members() == 0 && due {
            self.announced = Some(now);
            let me = self.swim.identity().id;
            for &id in knows.iter().filter(|&&id| id != me) {
                // An error here is SWIM's own bookkeeping refusing; the next tick asks again.
                let _ = self.swim.announce(
                    Member {
                        id,
                        run: 0,
                        back: 0,
                    },
                    &mut self.runtime,
                );
            }
        }
    }

    /// This gateway goes on under a later `run` (its node moved above a run of it its peers
    /// knew): they take the run before as over.
    pub(crate) fn rerun(&mut self, run: u64) {
        let id = self.swim.identity().id;
        let _ = self
            .swim
            .change_identity(Member { id, run, back: 0 }, &mut self.runtime);
    }

    /// Tells SWIM that member `id` runs as `run` (heard by the gossip): a later run than
    /// SWIM knew replaces the one before, and SWIM passes it on.
    pub(crate) fn learn(&mut self, id: NodeId, run: u64) {
        let member = foca::Member::alive(Member { id, run, back: 0 });
        let _ = self
            .swim
            .apply_many(std::iter::once(member), true, &mut self.runtime);
    }

    /// Whether SWIM takes gateway `id` as live.
    pub(crate) fn is_live(&self, id: NodeId) -> bool {
        self.swim.iter_members().any(|m| m.id().id == id)
    }

    /// Applies a membership datagram's body. `false`: SWIM could not read it.
    pub(crate) fn receive(&mut self, now: u64, body: &[u8]) -> bool {
        self.fire(now);
        self.swim.handle_data(body, &mut self.runtime).is_ok()
    }

    /// Leaves the mesh: the members are told, and take this gateway as gone at once.
    pub(crate) fn leave(&mut self) {
        let _ = self.swim.leave_cluster(&mut self.runtime);
    }

    /// Drains what SWIM decided: changes of membership, and datagrams to send (receiver and
    /// body). Timers it set are kept, due at `now` plus their delay.
    pub(crate) fn drain(&mut self, now: u64) -> (Vec<Change>, Vec<(NodeId, Vec<u8>)>) {
        while let Some((after, timer)) = self.runtime.to_schedule() {
            let after = u64::try_from(after.as_micros()).unwrap_or(u64::MAX);
            self.timers.push((now.saturating_add(after), timer));
        }
        let mut changes = Vec::new();
        while let Some(notification) = self.runtime.to_notify() {
            match notification {
                OwnedNotification::MemberUp(m) => changes.push(Change::Up(m.id, m.run)),
                OwnedNotification::MemberDown(m) => changes.push(Change::Down(m.id, m.run)),
                OwnedNotification::Rename(_, m) => changes.push(Change::Run(m.id, m.run)),
                _ => {}
            }
        }
        let mut sends = Vec::new();
        while let Some((to, body)) = self.runtime.to_send() {
            sends.push((to.id, body.to_vec()));
        }
        (changes, sends)
    }

    /// Hands SWIM the timers due at `now`, earliest first.
    fn fire(&mut self, now: u64) {
        if now < self.last {
            // The clock stepped back: what was due in a while still is, not in an hour.
            let back = self.last - now;
            for (due, _) in &mut self.timers {
                *due = due.saturating_sub(back);
            }
            self.announced = self.announced.map(|at| at.saturating_sub(back));
        }
        self.last = now;
        loop {
            let Some(next) = self
                .timers
                .iter()
                .enumerate()
                .filter(|(_, (due, _))| *due <= now)
                .min_by_key(|(_, (due, _))| *due)
                .map(|(i, _)| i)
            else {
                return;
            };
            let (_, timer) = self.timers.swap_remove(next);
            // An error is a timer SWIM no longer wants (an identity changed meanwhile).
            let _ = self.swim.handle_timer(timer, &mut self.runtime);
            // Timers it sets now are due later than `now`: kept by the next drain.
            while let Some((after, timer)) = self.runtime.to_schedule() {
                let after = u64::try_from(after.as_micros()).unwrap_or(u64::MAX);
                self.timers
                    .push((now.saturating_add(after).max(now + 1), timer));
            }
        }
    }
}
