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

/// Nodes by id, and which of them are cut off (they send and hear nothing).
struct Mesh {
    nodes: HashMap<NodeId, Node>,
    cut: Vec<NodeId>,
    round: u64,
}

impl Mesh {
    fn founded(ids: &[NodeId], mode: Mode) -> Self {
        let nodes = ids
            .iter()
            .map(|&id| (id, Node::new(id, ids, config(mode))))
            .collect();
        Self {
            nodes,
            cut: Vec::new(),
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
        for id in &ids {
            let sent = self.nodes.get_mut(id).unwrap().tick(now);
            if !self.cut.contains(id) {
                out.extend(sent);
            }
        }
        self.deliver(now, out);
    }

    fn deliver(&mut self, now: Timestamp, out: Vec<ratewarden_mesh::Outgoing>) {
        for datagram in out {
            if self.cut.contains(&datagram.to) {
                continue;
            }
            if let Some(node) = self.nodes.get_mut(&datagram.to) {
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
    // Never over: in every window of t, at most burst + rate × t.
    let rate_per_us = 60.0 / 60_000_000.0;
    for (i, &(start, _)) in admitted.iter().enumerate() {
        let mut units = 0_u64;
        for &(at, u) in &admitted[i..] {
            units += u64::from(u);
            let bound = 60.0 + rate_per_us * (at - start) as f64;
            assert!(
                units as f64 <= bound + 1e-6,
                "{units} admitted from {start} to {at} µs, over {bound}"
            );
        }
    }
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
    mesh.deliver(now, out);
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
    for _ in 0..100 {
        mesh.round();
    }
    for id in [1, 2] {
        assert_eq!(mesh.sorted_members(id), [1, 2]);
        assert!(mesh.nodes[&id].dropped().forged > 0);
    }
    // Nor one without any seal.
    let mut open = Config::new(Mode::Escrow);
    open.discover = true;
    mesh.nodes.insert(8, Node::join(8, &[1, 2], open));
    for _ in 0..50 {
        mesh.round();
    }
    assert_eq!(mesh.sorted_members(1), [1, 2]);
}

#[test]
fn a_gateway_of_the_other_mode_cannot_join() {
    let mut mesh = Mesh::founded(&[1, 2], Mode::Escrow);
    mesh.nodes
        .insert(7, Node::join(7, &[1], config(Mode::Eventual)));
    for _ in 0..100 {
        mesh.round();
    }
    assert_eq!(mesh.sorted_members(1), [1, 2]);
    assert!(mesh.nodes[&1].dropped().strangers > 0);
}

#[test]
fn no_more_members_than_the_bound_are_let_in() {
    let mut founders = config(Mode::Eventual);
    founders.max_members = 3;
    let mut mesh = Mesh {
        nodes: [1, 2]
            .iter()
            .map(|&id| (id, Node::new(id, &[1, 2], founders.clone())))
            .collect(),
        cut: Vec::new(),
        round: 0,
    };
    for id in 3..=6 {
        mesh.nodes
            .insert(id, Node::join(id, &[1], config(Mode::Eventual)));
    }
    for _ in 0..200 {
        mesh.round();
    }
    for id in [1, 2] {
        assert_eq!(
            mesh.nodes[&id].members().len(),
            3,
            "{:?}",
            mesh.nodes[&id].members()
        );
    }
}
