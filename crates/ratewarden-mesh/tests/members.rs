//! Membership by SWIM ([`Config::discover`]): gateways join a running mesh through a seed,
//! every member learns of them, a member that dies or leaves is taken as gone, and a joiner
//! is given shares out of its peers' without lifting what the mesh admits.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::HashMap;

use ratewarden_core::{Key, Quota, Timestamp};
use ratewarden_mesh::{Config, Mode, Node, NodeId};

const INTERVAL: u64 = 100_000;
const SECRET: &[u8] = b"the members test's shared secret";

fn config(mode: Mode) -> Config {
    let mut config = Config::new(mode).secret(SECRET).unwrap();
    config.discover = true;
    config
}

/// Whether sealed bytes are a SWIM datagram: its magic follows the seal's sequence number.
fn is_swim(bytes: &[u8]) -> bool {
    bytes.get(8..12) == Some(b"RWS1")
}

/// Nodes by id, which of them are cut off (they send and hear nothing), and pairs of them
/// that do not hear each other.
struct Mesh {
    nodes: HashMap<NodeId, Node>,
    cut: Vec<NodeId>,
    apart: Vec<(NodeId, NodeId)>,
    /// Gateways whose SWIM datagrams are lost (their gossip arrives).
    swim_lost: Vec<NodeId>,
    /// Gateways whose datagrams are recorded as they are sent (in `recorded`).
    taped: Vec<NodeId>,
    recorded: Vec<(NodeId, ratewarden_mesh::Outgoing)>,
    round: u64,
}

impl Mesh {
    fn founded(ids: &[NodeId], mode: Mode) -> Self {
        Self::founded_with(ids, &config(mode))
    }

    fn founded_with(ids: &[NodeId], config: &Config) -> Self {
        let nodes = ids
            .iter()
            .map(|&id| (id, Node::new(id, ids, config.clone())))
            .collect();
        Self {
            nodes,
            cut: Vec::new(),
            apart: Vec::new(),
            swim_lost: Vec::new(),
            taped: Vec::new(),
            recorded: Vec::new(),
            round: 0,
        }
    }

    fn now(&self) -> Timestamp {
        Timestamp::from_micros(self.round * INTERVAL)
    }

    /// One round: every node ticks, and what it sends arrives (unless cut off).
    fn round(&mut self) {
        self.round += 1;
        let now = self.now();
        let mut ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        ids.sort_unstable();
        let mut out = Vec::new();
        for &id in &ids {
            let sent = self.nodes.get_mut(&id).unwrap().tick(now);
            out.extend(sent.into_iter().map(|o| (id, o)));
        }
        self.deliver(now, out);
    }

    /// Delivers datagrams (sender, datagram) that get through.
    fn deliver(&mut self, now: Timestamp, out: Vec<(NodeId, ratewarden_mesh::Outgoing)>) {
        for (from, datagram) in out {
            if self.taped.contains(&from) {
                self.recorded.push((from, datagram.clone()));
            }
            let to = datagram.to;
            if self.cut.contains(&from)
                || self.cut.contains(&to)
                || self.apart.contains(&(from, to))
                || self.apart.contains(&(to, from))
                || (self.swim_lost.contains(&from) && is_swim(&datagram.bytes))
            {
                continue;
            }
            if let Some(node) = self.nodes.get_mut(&to) {
                node.receive(now, &datagram.bytes).unwrap();
            }
        }
    }

    fn rounds_until(&mut self, most: u64, done: impl Fn(&Self) -> bool) -> u64 {
        for r in 1..=most {
            self.round();
            if done(self) {
                return r;
            }
        }
        panic!("not done within {most} rounds");
    }

    /// Each of `ids` asks for a unit of `key` under `quota` ten times now; what is admitted
    /// is logged in `admitted` (µs, units). Answers how many were.
    fn ask(
        &mut self,
        ids: &[NodeId],
        (key, quota): (&Key, &Quota),
        admitted: &mut Vec<(u64, u32)>,
    ) -> usize {
        let now = self.now();
        let before = admitted.len();
        for id in ids {
            let node = self.nodes.get_mut(id).unwrap();
            for _ in 0..10 {
                if node.check(now, key, quota, 1).unwrap().is_allowed() {
                    admitted.push((now.as_micros(), 1));
                }
            }
        }
        admitted.len() - before
    }

    /// `rounds` rounds without demand.
    fn rounds(&mut self, rounds: u64) {
        for _ in 0..rounds {
            self.round();
        }
    }

    /// `rounds` rounds, each of `ids` asking as [`ask`](Self::ask) does in each.
    fn rounds_asking(
        &mut self,
        rounds: u64,
        ids: &[NodeId],
        demand: (&Key, &Quota),
        admitted: &mut Vec<(u64, u32)>,
    ) {
        for _ in 0..rounds {
            self.round();
            self.ask(ids, demand, admitted);
        }
    }

    /// The shares `ids` hold of `key` under `quota`, in millionths (none for a node without
    /// state for it).
    fn held(&self, ids: &[NodeId], key: &Key, quota: &Quota) -> u64 {
        ids.iter()
            .map(|id| self.nodes[id].share(key, quota).unwrap_or(0))
            .sum()
    }

    fn sorted_members(&self, id: NodeId) -> Vec<NodeId> {
        let mut members = self.nodes[&id].members().to_vec();
        members.sort_unstable();
        members
    }

    fn live(&self, id: NodeId) -> Vec<NodeId> {
        let since = Timestamp::from_micros(self.now().as_micros().saturating_sub(20 * INTERVAL));
        let mut live = self.nodes[&id].live(since);
        live.sort_unstable();
        live
    }
}

#[test]
fn a_gateway_joins_through_one_seed_and_every_member_learns_of_it() {
    let founders = [1, 2, 3];
    let mut mesh = Mesh::founded(&founders, Mode::Escrow);
    mesh.nodes
        .insert(4, Node::join(4, &[1], config(Mode::Escrow)));
    mesh.nodes
        .insert(5, Node::join(5, &[3], config(Mode::Escrow)));
    let all = vec![1, 2, 3, 4, 5];
    let rounds = mesh.rounds_until(200, |mesh| {
        all.iter()
            .all(|&id| mesh.sorted_members(id) == all && mesh.live(id) == all)
    });
    // SWIM's join (an announce and its feed) and its gossip take a few rounds, each of
    // them a tick apart here.
    assert!(
        rounds <= 20,
        "every member learnt of every other in {rounds} rounds"
    );
    for id in &all {
        let dropped = mesh.nodes[id].dropped();
        assert_eq!(
            dropped.forged + dropped.replayed + dropped.malformed,
            0,
            "{dropped:?}"
        );
        assert!(mesh.nodes[id].sent().membership_datagrams > 0);
    }
}

/// Never over: of the units `admitted` (µs, units), fleet-wide, in every interval of t at
/// most `burst` + `rate_per_us` × t.
fn assert_never_over(admitted: &[(u64, u32)], burst: f64, rate_per_us: f64) {
    for (i, &(start, _)) in admitted.iter().enumerate() {
        let mut units = 0_u64;
        for &(at, u) in &admitted[i..] {
            units += u64::from(u);
            let bound = burst + rate_per_us * (at - start) as f64;
            assert!(
                units as f64 <= bound + 1e-6,
                "{units} admitted from {start} to {at} µs, over {bound}"
            );
        }
    }
}

#[test]
fn a_joiner_holds_no_share_is_given_one_as_it_asks_and_the_mesh_never_goes_over() {
    // 3 founders and a joiner, all asking for more than the quota: 60 a minute, burst 60.
    let quota: Quota = "60/min burst 60".parse().unwrap();
    let key = Key::from("k");
    let founders = [1, 2, 3];
    let mut mesh = Mesh::founded(&founders, Mode::Escrow);
    let joiner = Node::join(4, &[1], config(Mode::Escrow));
    mesh.nodes.insert(4, joiner);
    let all = [1_u64, 2, 3, 4];
    let mut admitted: Vec<(u64, u32)> = Vec::new(); // (µs, units), fleet-wide
    let mut by_joiner = 0;
    for r in 0..1_200 {
        mesh.round();
        let now = mesh.now();
        // Only the joiner asks for the first 20 s, then everyone does.
        for &id in &all {
            if id != 4 && r < 200 {
                continue;
            }
            let node = mesh.nodes.get_mut(&id).unwrap();
            if node.check(now, &key, &quota, 1).unwrap().is_allowed() {
                admitted.push((now.as_micros(), 1));
                by_joiner += u64::from(id == 4 && r < 200);
            }
        }
        if r == 0 {
            assert!(admitted.is_empty(), "a joiner holds no share at first");
        }
    }
    assert_never_over(&admitted, 60.0, 60.0 / 60_000_000.0);
    // The joiner was given shares: over its 20 s alone it admits most of what one limiter
    // would (the burst and 20 s of refill: 80), not nothing.
    assert!(
        by_joiner >= 60,
        "the joiner admitted {by_joiner} of 80 alone"
    );
    let total: u64 = admitted.len() as u64;
    // 120 s at 1/s and the burst: 180 at most; a fixed fleet admits most of it.
    assert!(total >= 150, "the fleet admitted {total} of 180");
}

#[test]
fn a_member_that_dies_is_taken_as_gone_and_one_that_leaves_at_once() {
    let ids = [1, 2, 3, 4];
    let mut mesh = Mesh::founded(&ids, Mode::Escrow);
    mesh.rounds_until(100, |mesh| ids.iter().all(|&id| mesh.live(id).len() == 4));
    // 4 leaves: the others take it as gone within a few rounds (they hear it at once).
    let now = mesh.now();
    let out = mesh.nodes.get_mut(&4).unwrap().leave(now);
    assert!(!out.is_empty());
    mesh.deliver(now, out.into_iter().map(|o| (4, o)).collect());
    let left = mesh.rounds_until(10, |mesh| {
        [1, 2, 3].iter().all(|&id| !mesh.live(id).contains(&4))
    });
    assert!(left <= 5, "taken as gone {left} rounds after it left");
    // It stays a member (its share stays with it).
    assert!(mesh.sorted_members(1).contains(&4));
    // 3 dies: SWIM finds it dead, though it was heard from lately, within its timeouts
    // (probes a second, suspicion for some seconds).
    mesh.cut.push(3);
    let dead = mesh.rounds_until(300, |mesh| [1, 2].iter().all(|&id| mesh.live(id) == [1, 2]));
    assert!(dead > 2, "taken as dead at once ({dead} rounds)");
    // It comes back: taken as live again.
    mesh.cut.clear();
    mesh.rounds_until(1_000, |mesh| {
        [1, 2].iter().all(|&id| mesh.live(id).contains(&3))
    });
}

#[test]
fn a_gateway_without_the_secret_cannot_join() {
    let mut mesh = Mesh::founded(&[1, 2], Mode::Escrow);
    let mut stranger = Config::new(Mode::Escrow)
        .secret(b"another secret of 16 bytes")
        .unwrap();
    stranger.discover = true;
    mesh.nodes.insert(9, Node::join(9, &[1, 2], stranger));
    mesh.rounds(100);
    for id in [1, 2] {
        assert_eq!(mesh.sorted_members(id), [1, 2]);
        assert!(mesh.nodes[&id].dropped().forged > 0);
    }
    // Nor one without any seal.
    let mut open = Config::new(Mode::Escrow);
    open.discover = true;
    mesh.nodes.insert(8, Node::join(8, &[1, 2], open));
    mesh.rounds(50);
    assert_eq!(mesh.sorted_members(1), [1, 2]);
}

#[test]
fn a_gateway_of_the_other_mode_cannot_join() {
    let mut mesh = Mesh::founded(&[1, 2], Mode::Escrow);
    mesh.nodes
        .insert(7, Node::join(7, &[1], config(Mode::Eventual)));
    mesh.rounds(100);
    assert_eq!(mesh.sorted_members(1), [1, 2]);
    assert!(mesh.nodes[&1].dropped().strangers > 0);
}

#[test]
fn no_more_members_than_the_bound_are_let_in() {
    let mut founders = config(Mode::Eventual);
    founders.max_members = 3;
    let mut mesh = Mesh::founded_with(&[1, 2], &founders);
    for id in 3..=6 {
        mesh.nodes
            .insert(id, Node::join(id, &[1], config(Mode::Eventual)));
    }
    mesh.rounds(200);
    for id in [1, 2] {
        assert_eq!(
            mesh.nodes[&id].members().len(),
            3,
            "{:?}",
            mesh.nodes[&id].members()
        );
    }
}

#[test]
fn a_gateway_cut_off_from_every_peer_rejoins_when_the_cut_heals_though_its_seed_is_gone() {
    let mut mesh = Mesh::founded(&[1], Mode::Escrow);
    for id in [2, 3] {
        mesh.nodes
            .insert(id, Node::join(id, &[1], config(Mode::Escrow)));
    }
    mesh.rounds_until(200, |mesh| (1..=3).all(|id| mesh.live(id) == [1, 2, 3]));
    // The seed dies for good, and 2 and 3 do not hear each other until each takes every
    // peer it knows for dead.
    mesh.cut.push(1);
    mesh.apart.push((2, 3));
    mesh.rounds_until(600, |mesh| mesh.live(2) == [2] && mesh.live(3) == [3]);
    mesh.rounds(50);
    mesh.apart.clear();
    let healed = mesh.rounds_until(1_200, |mesh| {
        mesh.live(2) == [2, 3] && mesh.live(3) == [2, 3]
    });
    assert!(
        healed <= 300,
        "live to each other {healed} rounds after the heal"
    );
}

#[test]
fn a_joiner_restarted_where_only_its_seed_hears_it_then_dead_leaves_the_mesh_within_the_quota() {
    let quota: Quota = "600/min burst 600".parse().unwrap();
    let key = Key::from("k");
    let mut mesh = Mesh::founded(&[1, 2, 3], Mode::Escrow);
    mesh.nodes
        .insert(4, Node::join(4, &[1], config(Mode::Escrow)));
    let mut admitted: Vec<(u64, u32)> = Vec::new();
    // The joiner is given shares as it asks; then 2 asks and the joiner passes them on.
    mesh.rounds_asking(300, &[4], (&key, &quota), &mut admitted);
    mesh.rounds_asking(300, &[2], (&key, &quota), &mut admitted);
    // The joiner restarts (a later run), heard by its seed only, and dies.
    let mut later = config(Mode::Escrow);
    later.incarnation = 1_000_000;
    mesh.nodes.insert(4, Node::join(4, &[1], later));
    mesh.apart.extend([(4, 2), (4, 3)]);
    mesh.rounds_asking(100, &[1, 2, 3], (&key, &quota), &mut admitted);
    mesh.cut.push(4);
    mesh.rounds_asking(3_000, &[1, 2, 3], (&key, &quota), &mut admitted);
    // The shares held, the dead joiner's among them, sum to the whole quota at most (parts
    // per million).
    let held = mesh.held(&[1, 2, 3, 4], &key, &quota);
    assert!(held <= 1_000_000, "shares sum to {held} millionths");
    assert_never_over(&admitted, 600.0, 600.0 / 60_000_000.0);
}

#[test]
fn an_eventual_joiner_no_member_lets_in_admits_nothing() {
    let mut full = config(Mode::Eventual);
    full.max_members = 2;
    let mut mesh = Mesh::founded_with(&[1, 2], &full);
    mesh.nodes
        .insert(3, Node::join(3, &[1], config(Mode::Eventual)));
    let quota: Quota = "60/min".parse().unwrap();
    let key = Key::from("k");
    let mut by_joiner = 0;
    for _ in 0..600 {
        mesh.round();
        let now = mesh.now();
        if mesh
            .nodes
            .get_mut(&3)
            .unwrap()
            .check(now, &key, &quota, 1)
            .unwrap()
            .is_allowed()
        {
            by_joiner += 1;
        }
    }
    assert_eq!(by_joiner, 0, "a joiner no member counts decided alone");
}

#[test]
fn an_eventual_joiner_let_in_admits_its_part() {
    let mut mesh = Mesh::founded(&[1, 2], Mode::Eventual);
    mesh.nodes
        .insert(3, Node::join(3, &[1], config(Mode::Eventual)));
    let quota: Quota = "60/min".parse().unwrap();
    let key = Key::from("k");
    let mut admitted: Vec<(u64, u32)> = Vec::new();
    let mut by_joiner = 0;
    for r in 0..1_200 {
        mesh.round();
        let now = mesh.now();
        for id in [1, 2, 3] {
            // The founders ask from the second minute.
            if id != 3 && r < 600 {
                continue;
            }
            let node = mesh.nodes.get_mut(&id).unwrap();
            if node.check(now, &key, &quota, 1).unwrap().is_allowed() {
                admitted.push((now.as_micros(), 1));
                by_joiner += u64::from(id == 3);
            }
        }
    }
    // Alone for a minute, it admits most of what one limiter would.
    assert!(by_joiner >= 90, "the joiner admitted {by_joiner}");
    // Eventual's bound for 3 gateways: at most two bursts over, each a second at most late.
    assert_never_over(&admitted, 60.0 * 3.0 + 2.0, 60.0 / 60_000_000.0);
}

#[test]
fn a_restarted_gateway_gives_no_share_to_a_member_that_died_before() {
    let quota: Quota = "600/min burst 600".parse().unwrap();
    let key = Key::from("k");
    let mut mesh = Mesh::founded(&[1, 2, 3], Mode::Escrow);
    let mut admitted = Vec::new();
    mesh.rounds_asking(100, &[1, 2, 3], (&key, &quota), &mut admitted);
    let died_with = mesh.nodes[&3].share(&key, &quota).unwrap();
    mesh.cut.push(3);
    mesh.rounds_until(600, |mesh| mesh.live(1) == [1, 2] && mesh.live(2) == [1, 2]);
    // 1 restarts, and is idle a while: what it does not want goes to live members only.
    let mut later = config(Mode::Escrow);
    later.incarnation = 1_000_000;
    mesh.nodes.insert(1, Node::new(1, &[1, 2, 3], later));
    mesh.rounds_asking(20, &[2], (&key, &quota), &mut admitted);
    mesh.rounds_asking(600, &[1, 2], (&key, &quota), &mut admitted);
    let held = mesh.held(&[1, 2], &key, &quota);
    assert!(
        held + died_with >= 999_000,
        "the live members hold {held} millionths, the dead one held {died_with}"
    );
}

#[test]
fn a_gateway_that_leaves_hands_its_shares_to_the_live_members() {
    let quota: Quota = "600/min burst 600".parse().unwrap();
    let key = Key::from("k");
    let mut mesh = Mesh::founded(&[1, 2, 3, 4], Mode::Escrow);
    let mut admitted: Vec<(u64, u32)> = Vec::new();
    // 4 dies first: what it holds stays with it.
    mesh.rounds_asking(100, &[1, 2, 3, 4], (&key, &quota), &mut admitted);
    let died_with = mesh.nodes[&4].share(&key, &quota).unwrap();
    mesh.cut.push(4);
    // 3 leaves, and is stopped a few rounds later: it admits nothing more.
    mesh.rounds_asking(100, &[1, 2, 3], (&key, &quota), &mut admitted);
    let now = mesh.now();
    let out = mesh.nodes.get_mut(&3).unwrap().leave(now);
    mesh.deliver(now, out.into_iter().map(|o| (3, o)).collect());
    for _ in 0..10 {
        mesh.round();
        mesh.ask(&[1, 2], (&key, &quota), &mut admitted);
        let after = mesh.ask(&[3], (&key, &quota), &mut admitted);
        assert_eq!(after, 0, "a gateway admitted after it left");
    }
    assert!(
        mesh.nodes[&3].parted(),
        "the shares it gave are not all taken"
    );
    mesh.cut.push(3);
    mesh.rounds_asking(600, &[1, 2], (&key, &quota), &mut admitted);
    let held = mesh.held(&[1, 2], &key, &quota);
    assert!(
        held + died_with >= 999_000,
        "the live members hold {held} millionths, the dead one held {died_with}"
    );
    assert_never_over(&admitted, 600.0, 600.0 / 60_000_000.0);
}

#[test]
fn a_gateway_made_a_founder_with_a_list_its_peers_do_not_share_holds_no_first_share() {
    let quota: Quota = "600/min burst 600".parse().unwrap();
    let key = Key::from("k");
    let mut mesh = Mesh::founded(&[1, 2, 3], Mode::Escrow);
    // 4 was a joiner; it comes back made as a founder of a mesh of four.
    mesh.nodes
        .insert(4, Node::new(4, &[1, 2, 3, 4], config(Mode::Escrow)));
    let mut admitted: Vec<(u64, u32)> = Vec::new();
    mesh.rounds_asking(600, &[1, 2, 3, 4], (&key, &quota), &mut admitted);
    let held = mesh.held(&[1, 2, 3, 4], &key, &quota);
    assert!(held <= 1_000_000, "shares sum to {held} millionths");
    // Every founder that hears the other list gives up its first shares.
    assert!((1..=4).all(|id| mesh.nodes[&id].founders_disagree()));
    // The first second, before they hear each other, is all they may admit over.
    assert_never_over(&admitted, 600.0 + 150.0 + 10.0, 600.0 / 60_000_000.0);
}

/// SWIM's steady cost, printed with `--nocapture` (BENCHMARKS.md has the figures): a probe
/// and its answer about each second, and gossip of what changed.
#[test]
fn swim_costs_a_few_hundred_bytes_a_gateway_a_second() {
    for n in [4_u64, 10, 32] {
        let ids: Vec<NodeId> = (1..=n).collect();
        let mut mesh = Mesh::founded(&ids, Mode::Escrow);
        let seconds = 60;
        for _ in 0..seconds * 10 {
            mesh.round();
        }
        let (datagrams, bytes) = mesh.nodes.values().fold((0, 0), |(d, b), node| {
            let sent = node.sent();
            (d + sent.membership_datagrams, b + sent.membership_bytes)
        });
        let per = (n * seconds) as f64;
        let (datagrams, bytes) = (datagrams as f64 / per, bytes as f64 / per);
        println!(
            "{n} gateways: {datagrams:.1} SWIM datagrams, {bytes:.0} bytes a gateway a second"
        );
        assert!(
            bytes <= 500.0,
            "{bytes:.0} bytes a gateway a second at n = {n}"
        );
    }
}

#[test]
fn eventual_joiners_the_founders_turn_away_do_not_let_each_other_in() {
    let mut full = config(Mode::Eventual);
    full.max_members = 2;
    let mut mesh = Mesh::founded_with(&[1, 2], &full);
    mesh.nodes
        .insert(3, Node::join(3, &[1], config(Mode::Eventual)));
    mesh.nodes
        .insert(4, Node::join(4, &[1, 3], config(Mode::Eventual)));
    let quota: Quota = "60/min".parse().unwrap();
    let key = Key::from("k");
    let mut by_joiners = 0;
    for _ in 0..600 {
        mesh.round();
        let now = mesh.now();
        for id in [3, 4] {
            let node = mesh.nodes.get_mut(&id).unwrap();
            by_joiners += usize::from(node.check(now, &key, &quota, 1).unwrap().is_allowed());
        }
    }
    assert_eq!(by_joiners, 0, "joiners no founder counts decided");
}

#[test]
fn a_restart_one_peer_hears_only_by_gossip_reaches_every_peer_by_swim() {
    let quota: Quota = "600/min burst 600".parse().unwrap();
    let key = Key::from("k");
    let mut mesh = Mesh::founded(&[1, 2, 3], Mode::Escrow);
    let mut admitted = Vec::new();
    // 1 and 3 give 2 most of their shares.
    for r in 0..400 {
        mesh.round();
        let ids: &[NodeId] = if r < 3 { &[1, 2, 3] } else { &[2] };
        mesh.ask(ids, (&key, &quota), &mut admitted);
    }
    // 3 restarts; 1 hears its gossip only, 2 nothing of it; it dies a second later.
    let mut later = config(Mode::Escrow);
    later.incarnation = 1_000_000;
    mesh.nodes.insert(3, Node::new(3, &[1, 2, 3], later));
    mesh.apart.push((3, 2));
    mesh.swim_lost.push(3);
    mesh.rounds(10);
    mesh.cut.push(3);
    mesh.rounds(100);
    let held = mesh.held(&[1, 2, 3], &key, &quota);
    assert!(held <= 1_000_000, "shares sum to {held} millionths");
}

#[test]
fn swim_finds_a_dead_member_though_the_clock_stepped_back_an_hour() {
    let mut mesh = Mesh::founded(&[1, 2, 3], Mode::Escrow);
    mesh.round = 36_000 + 100;
    mesh.rounds_until(100, |mesh| (1..=3).all(|id| mesh.live(id) == [1, 2, 3]));
    mesh.round -= 36_000;
    mesh.cut.push(3);
    // `live` counts SWIM's verdict only once it is heard of: it must come within seconds.
    mesh.rounds_until(300, |mesh| {
        !mesh.nodes[&1].live(Timestamp::from_micros(0)).contains(&3)
    });
}

#[test]
fn two_groups_of_founders_bridged_by_a_joiner_give_up_their_first_shares() {
    let quota: Quota = "600/min burst 600".parse().unwrap();
    let key = Key::from("k");
    let mut mesh = Mesh::founded(&[1, 2], Mode::Escrow);
    for id in [3, 4] {
        mesh.nodes
            .insert(id, Node::new(id, &[3, 4], config(Mode::Escrow)));
    }
    mesh.nodes
        .insert(5, Node::join(5, &[1, 3], config(Mode::Escrow)));
    mesh.rounds(100);
    let mut admitted = Vec::new();
    mesh.rounds_asking(600, &[1, 2, 3, 4], (&key, &quota), &mut admitted);
    let held = mesh.held(&[1, 2, 3, 4, 5], &key, &quota);
    assert!(held <= 1_000_000, "shares sum to {held} millionths");
    assert!((1..=4).all(|id| mesh.nodes[&id].founders_disagree()));
}

#[test]
fn peers_that_miss_a_leave_by_swim_learn_it_from_the_gossip() {
    for discover in [true, false] {
        let quota: Quota = "600/min burst 600".parse().unwrap();
        let key = Key::from("k");
        let mut founders = config(Mode::Escrow);
        founders.discover = discover;
        let mut mesh = Mesh::founded_with(&[1, 2, 3], &founders);
        let mut admitted = Vec::new();
        // 1 draws most shares, then 3 asks too.
        for r in 0..303 {
            mesh.round();
            let ids: &[NodeId] = if r < 300 { &[1] } else { &[1, 3] };
            mesh.ask(ids, (&key, &quota), &mut admitted);
        }
        // 3 leaves; its SWIM datagrams are lost.
        mesh.swim_lost.push(3);
        let now = mesh.now();
        let out = mesh.nodes.get_mut(&3).unwrap().leave(now);
        mesh.deliver(now, out.into_iter().map(|o| (3, o)).collect());
        let parted = mesh.rounds_until(50, |mesh| mesh.nodes[&3].parted());
        assert!(parted <= 10, "parted {parted} rounds after leaving");
        mesh.cut.push(3);
        mesh.rounds_asking(600, &[1, 2], (&key, &quota), &mut admitted);
        let held = mesh.held(&[1, 2], &key, &quota);
        assert!(held >= 999_000, "the live members hold {held} millionths");
    }
}

/// Rounds after which a joiner gone (not heard from, not live to SWIM) is forgotten, at
/// [`INTERVAL`]: a minute, and a check every few seconds.
const FORGOTTEN_AFTER: u64 = 700;

#[test]
fn joiners_that_left_are_forgotten_and_make_room_for_new_ones() {
    let quota: Quota = "600/min burst 600".parse().unwrap();
    let key = Key::from("k");
    let mut founders = config(Mode::Escrow);
    founders.max_members = 4;
    let mut mesh = Mesh::founded_with(&[1, 2], &founders);
    for id in [3, 4] {
        mesh.nodes
            .insert(id, Node::join(id, &[1], config(Mode::Escrow)));
    }
    let mut admitted: Vec<(u64, u32)> = Vec::new();
    mesh.rounds_asking(300, &[1, 2, 3, 4], (&key, &quota), &mut admitted);
    assert_eq!(mesh.sorted_members(1), [1, 2, 3, 4]);
    // The joiners leave, hand their shares over, and stop.
    for id in [3, 4] {
        let now = mesh.now();
        let out = mesh.nodes.get_mut(&id).unwrap().leave(now);
        mesh.deliver(now, out.into_iter().map(|o| (id, o)).collect());
    }
    mesh.rounds_until(50, |mesh| [3, 4].iter().all(|id| mesh.nodes[id].parted()));
    mesh.cut.extend([3, 4]);
    mesh.rounds_asking(FORGOTTEN_AFTER, &[1, 2], (&key, &quota), &mut admitted);
    for id in [1, 2] {
        assert_eq!(
            mesh.sorted_members(id),
            [1, 2],
            "gone joiners are still members"
        );
    }
    // Two new gateways join in their place, are given shares, and the mesh stays within
    // the quota.
    for id in [5, 6] {
        mesh.nodes
            .insert(id, Node::join(id, &[2], config(Mode::Escrow)));
    }
    mesh.rounds_until(200, |mesh| {
        [1, 2, 5, 6]
            .iter()
            .all(|&id| mesh.sorted_members(id) == [1, 2, 5, 6])
    });
    let before = admitted.len();
    mesh.rounds_asking(600, &[5, 6], (&key, &quota), &mut admitted);
    let by_new = admitted.len() - before;
    assert!(by_new >= 500, "the new joiners admitted {by_new} of 660");
    let held = mesh.held(&[1, 2, 5, 6], &key, &quota);
    assert!(
        (999_000..=1_000_000).contains(&held),
        "the members hold {held} millionths"
    );
    assert_never_over(&admitted, 600.0, 600.0 / 60_000_000.0);
}

#[test]
fn a_gone_joiner_that_holds_shares_is_kept() {
    let quota: Quota = "600/min burst 600".parse().unwrap();
    let key = Key::from("k");
    let mut mesh = Mesh::founded(&[1, 2], Mode::Escrow);
    mesh.nodes
        .insert(3, Node::join(3, &[1], config(Mode::Escrow)));
    let mut admitted: Vec<(u64, u32)> = Vec::new();
    mesh.rounds_asking(300, &[1, 2, 3], (&key, &quota), &mut admitted);
    assert!(mesh.nodes[&3].share(&key, &quota).unwrap() > 0);
    // It dies holding them: what its peers gave it is theirs to take back should it come
    // back, so they keep it.
    mesh.cut.push(3);
    mesh.rounds_asking(2 * FORGOTTEN_AFTER, &[1, 2], (&key, &quota), &mut admitted);
    for id in [1, 2] {
        assert_eq!(mesh.sorted_members(id), [1, 2, 3]);
    }
    assert_never_over(&admitted, 600.0, 600.0 / 60_000_000.0);
}

#[test]
fn a_forgotten_joiner_back_in_the_same_run_is_let_in_again_within_the_quota() {
    let quota: Quota = "600/min burst 600".parse().unwrap();
    let key = Key::from("k");
    let mut mesh = Mesh::founded(&[1, 2, 3], Mode::Escrow);
    mesh.nodes
        .insert(4, Node::join(4, &[1], config(Mode::Escrow)));
    let mut admitted: Vec<(u64, u32)> = Vec::new();
    mesh.rounds_asking(300, &[1, 2, 3, 4], (&key, &quota), &mut admitted);
    // It stops asking: with no gateway refusing, it gives back what it was given.
    mesh.rounds_until(3_000, |mesh| {
        mesh.nodes[&4].share(&key, &quota).unwrap_or(0) == 0
    });
    // Then it is cut off long enough to be forgotten, and comes back as it was.
    let now = mesh.now();
    let datagrams_before = mesh.nodes.get_mut(&4).unwrap().tick(now);
    mesh.cut.push(4);
    mesh.rounds_asking(FORGOTTEN_AFTER, &[1, 2, 3], (&key, &quota), &mut admitted);
    for id in [1, 2, 3] {
        assert_eq!(mesh.sorted_members(id), [1, 2, 3]);
    }
    mesh.cut.clear();
    mesh.rounds_until(600, |mesh| {
        [1, 2, 3, 4]
            .iter()
            .all(|&id| mesh.sorted_members(id) == [1, 2, 3, 4])
    });
    // The gossip it sent before it was forgotten is dropped now.
    let stale = |mesh: &Mesh| -> u64 {
        [1, 2, 3]
            .iter()
            .map(|id| {
                let d = mesh.nodes[id].dropped();
                d.stale + d.replayed
            })
            .sum()
    };
    let before = stale(&mesh);
    let now = mesh.now();
    let old: Vec<(NodeId, ratewarden_mesh::Outgoing)> = datagrams_before
        .into_iter()
        .filter(|o| !is_swim(&o.bytes))
        .map(|o| (4, o))
        .collect();
    assert!(!old.is_empty());
    let count = old.len() as u64;
    mesh.deliver(now, old);
    assert_eq!(
        stale(&mesh) - before,
        count,
        "datagrams of before were taken"
    );
    let before = admitted.len();
    mesh.rounds_asking(600, &[1, 2, 3, 4], (&key, &quota), &mut admitted);
    let by_all = admitted.len() - before;
    assert!(by_all >= 500, "the mesh admitted {by_all} of 600");
    let held = mesh.held(&[1, 2, 3, 4], &key, &quota);
    assert!(held <= 1_000_000, "the members hold {held} millionths");
    assert_never_over(&admitted, 600.0, 600.0 / 60_000_000.0);
}

#[test]
fn eventual_joiners_gone_are_forgotten_once_their_counts_weigh_nothing() {
    let quota: Quota = "60/min".parse().unwrap();
    let key = Key::from("k");
    let mut founders = config(Mode::Eventual);
    founders.max_members = 3;
    let mut mesh = Mesh::founded_with(&[1, 2], &founders);
    mesh.nodes
        .insert(3, Node::join(3, &[1], config(Mode::Eventual)));
    let mut admitted: Vec<(u64, u32)> = Vec::new();
    mesh.rounds_asking(300, &[1, 2, 3], (&key, &quota), &mut admitted);
    mesh.cut.push(3);
    // Its last admissions weigh for 3 × 120 s (a burst and a minute's count, drained at
    // 1/s, in a mesh of 3): it is kept until then.
    mesh.rounds_asking(FORGOTTEN_AFTER, &[1, 2], (&key, &quota), &mut admitted);
    for id in [1, 2] {
        assert_eq!(mesh.sorted_members(id), [1, 2, 3]);
    }
    mesh.rounds_asking(3_200, &[1, 2], (&key, &quota), &mut admitted);
    for id in [1, 2] {
        assert_eq!(mesh.sorted_members(id), [1, 2]);
    }
    mesh.nodes
        .insert(4, Node::join(4, &[1], config(Mode::Eventual)));
    mesh.rounds_until(200, |mesh| {
        [1, 2, 4]
            .iter()
            .all(|&id| mesh.sorted_members(id) == [1, 2, 4])
    });
    mesh.rounds_asking(600, &[1, 2, 4], (&key, &quota), &mut admitted);
    // Eventual's bound for 3 gateways: at most two bursts over, each a second at most late.
    assert_never_over(&admitted, 60.0 * 3.0 + 2.0, 60.0 / 60_000_000.0);
}

#[test]
fn a_joiner_whose_seed_comes_up_minutes_later_still_joins_through_it() {
    let mut mesh = Mesh::founded(&[], Mode::Escrow);
    mesh.nodes
        .insert(2, Node::join(2, &[1], config(Mode::Escrow)));
    // Its seed is not up for two minutes: the joiner keeps it, and asks it again.
    mesh.rounds(2 * FORGOTTEN_AFTER);
    assert_eq!(mesh.sorted_members(2), [1, 2]);
    mesh.nodes
        .insert(1, Node::new(1, &[1], config(Mode::Escrow)));
    mesh.rounds_until(300, |mesh| {
        mesh.sorted_members(1) == [1, 2] && mesh.live(2) == [1, 2]
    });
}

#[test]
fn sides_apart_long_enough_to_forget_each_other_meet_again_within_the_quota() {
    let quota: Quota = "600/min burst 600".parse().unwrap();
    let key = Key::from("k");
    let mut mesh = Mesh::founded(&[1, 2], Mode::Escrow);
    for id in [3, 4] {
        mesh.nodes
            .insert(id, Node::join(id, &[1], config(Mode::Escrow)));
    }
    let all = [1, 2, 3, 4];
    mesh.rounds_until(200, |mesh| all.iter().all(|&id| mesh.live(id) == all));
    let mut admitted: Vec<(u64, u32)> = Vec::new();
    mesh.rounds_asking(100, &all, (&key, &quota), &mut admitted);
    // With no one asking, the joiners give back what they were given.
    mesh.rounds_until(3_000, |mesh| mesh.held(&[3, 4], &key, &quota) == 0);
    mesh.rounds(50);
    // The founders and the joiners do not hear each other for four minutes, the founders
    // asking: each side forgets the other's gateways it owes nothing to.
    for a in [1, 2] {
        for b in [3, 4] {
            mesh.apart.push((a, b));
        }
    }
    mesh.rounds_asking(2_400, &[1, 2], (&key, &quota), &mut admitted);
    assert_eq!(
        mesh.sorted_members(2),
        [1, 2],
        "the joiners are not forgotten"
    );
    assert_eq!(
        mesh.sorted_members(4),
        [1, 3, 4],
        "founder 2 is not forgotten"
    );
    mesh.apart.clear();
    let healed = mesh.rounds_until(3_000, |mesh| all.iter().all(|&id| mesh.live(id) == all));
    assert!(
        healed <= 1_200,
        "all live to each other {healed} rounds after the heal"
    );
    mesh.rounds_asking(600, &all, (&key, &quota), &mut admitted);
    let held = mesh.held(&all, &key, &quota);
    assert!(held <= 1_000_000, "the members hold {held} millionths");
    assert_never_over(&admitted, 600.0, 600.0 / 60_000_000.0);
}

#[test]
fn a_founder_and_a_joiner_that_forgot_each_other_hear_each_other_again() {
    let quota: Quota = "600/min burst 600".parse().unwrap();
    let key = Key::from("k");
    let mut mesh = Mesh::founded(&[1, 2], Mode::Escrow);
    mesh.nodes
        .insert(3, Node::join(3, &[2], config(Mode::Escrow)));
    mesh.rounds_until(200, |m| (1..=3).all(|id| m.live(id) == [1, 2, 3]));
    let mut admitted = Vec::new();
    // 3 is given a share by 2 while 1 is cut off: 2 and 3 keep each other, 1 and 3 do not.
    mesh.cut = vec![1];
    mesh.rounds_asking(300, &[3], (&key, &quota), &mut admitted);
    mesh.cut = vec![3];
    mesh.rounds(FORGOTTEN_AFTER + 100);
    assert_eq!(mesh.sorted_members(1), [1, 2]);
    mesh.cut.clear();
    mesh.rounds_until(3_000, |m| m.live(1) == [1, 2, 3] && m.live(3) == [1, 2, 3]);
    let held = mesh.held(&[1, 2, 3], &key, &quota);
    assert!(held <= 1_000_000, "the members hold {held} millionths");
    assert_never_over(&admitted, 600.0, 600.0 / 60_000_000.0);
}

#[test]
fn swim_datagrams_of_a_forgotten_joiner_replayed_do_not_let_it_in_again() {
    let mut mesh = Mesh::founded(&[1, 2], Mode::Escrow);
    mesh.nodes
        .insert(3, Node::join(3, &[1], config(Mode::Escrow)));
    mesh.taped.push(3);
    mesh.rounds_until(200, |m| (1..=3).all(|id| m.live(id) == [1, 2, 3]));
    mesh.rounds(100);
    let taped: Vec<(NodeId, ratewarden_mesh::Outgoing)> = std::mem::take(&mut mesh.recorded)
        .into_iter()
        .filter(|(_, o)| is_swim(&o.bytes))
        .collect();
    assert!(taped.len() > 10, "3 sent {} SWIM datagrams", taped.len());
    // It dies holding nothing, and is forgotten.
    mesh.cut.push(3);
    mesh.rounds(FORGOTTEN_AFTER);
    for id in [1, 2] {
        assert_eq!(mesh.sorted_members(id), [1, 2]);
    }
    // Someone on the network sends what it sent again: SWIM holds it as dead.
    mesh.cut.clear();
    let now = mesh.now();
    mesh.deliver(now, taped);
    mesh.cut.push(3);
    mesh.rounds(20);
    for id in [1, 2] {
        assert_eq!(
            mesh.sorted_members(id),
            [1, 2],
            "a replay let the forgotten joiner in again"
        );
    }
}
