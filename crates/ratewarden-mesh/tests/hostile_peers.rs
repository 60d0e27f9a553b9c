//! What a faulty or lying member, a careless operator and a dead gateway can do to a node:
//! never a panic, never a share created from a lie, never more shares poured into a member
//! that has gone silent.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use ratewarden_core::{Key, Quota, Timestamp};
use ratewarden_mesh::wire::{Datagram, Entry, Slot};
use ratewarden_mesh::{Config, Mode, Node, node_id};

fn at(ms: u64) -> Timestamp {
    Timestamp::from_micros(ms * 1_000)
}

/// Ticks every node at `now` and delivers everything it sends.
fn round(nodes: &mut [Node], now: Timestamp) {
    let mut out = Vec::new();
    for node in nodes.iter_mut() {
        out.extend(node.tick(now));
    }
    for o in out {
        if let Some(node) = nodes.iter_mut().find(|n| n.id() == o.to) {
            node.receive(now, &o.bytes).unwrap();
        }
    }
}

/// Admitted of `tries` checks of cost 1.
fn admit(node: &mut Node, now: Timestamp, key: &Key, quota: &Quota, tries: u32) -> u32 {
    let mut admitted = 0;
    for _ in 0..tries {
        admitted += u32::from(node.check(now, key, quota, 1).unwrap().is_allowed());
    }
    admitted
}

#[test]
fn a_members_huge_demand_is_not_a_panic() {
    let quota: Quota = "100/s".parse().unwrap();
    let mut node = Node::new(1, &[1, 2, 3], Config::new(Mode::Escrow));
    let key = Key::from("k");
    for origin in [2, 3] {
        let lie = Datagram {
            from: 2,
            to: 1,
            entries: vec![Entry {
                slot: Slot {
                    key: key.clone(),
                    quota,
                },
                origin,
                version: u64::MAX,
                a: u64::MAX,
                b: u64::MAX,
                c: u64::MAX,
            }],
            ..Datagram::default()
        };
        node.receive(at(0), &lie.encode(1_400)[0]).unwrap();
    }
    // Rebalancing weighs the lie; the node goes on deciding within its share.
    let _ = node.tick(at(10));
    let admitted = admit(&mut node, at(10), &key, &quota, 200);
    assert!(admitted <= 34, "{admitted} admitted on a third of 100");
}

#[test]
fn the_last_sequence_number_is_not_a_panic() {
    let mut config = Config::new(Mode::Eventual)
        .secret(b"a secret the test's gateways share")
        .unwrap();
    config.first_sequence = u64::MAX;
    let mut node = Node::new(1, &[1, 2], config);
    let _ = node.check(at(0), &Key::from("k"), &"10/s".parse().unwrap(), 1);
    let _ = node.tick(at(0));
    let _ = node.tick(at(100));
}

#[test]
fn ipv6_gateways_in_one_subnet_get_distinct_ids() {
    let addrs = [
        "[2001:db8::1]:7000",
        "[2001:db8::8000:0:1]:7000",
        "[2001:db8::1:0:0:1]:7001",
        "[2001:db8::1]:7001",
        "[2001:db8::2]:7000",
        "127.0.0.1:7000",
    ];
    let mut ids: Vec<u64> = addrs.iter().map(|a| node_id(a.parse().unwrap())).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), addrs.len(), "colliding ids: {ids:x?}");
}

/// Node 3 refuses a few requests, draws shares for it, then dies with its stale view still
/// asking for more: once it has been silent for the quiet rounds, the live members give it
/// nothing more, so what they hold between them stops falling.
#[test]
fn a_silent_member_is_given_nothing() {
    let quota: Quota = "100/h".parse().unwrap();
    let key = Key::from("k");
    let members = [1, 2, 3];
    let mut nodes: Vec<Node> = members
        .iter()
        .map(|&id| Node::new(id, &members, Config::new(Mode::Escrow)))
        .collect();
    let mut ms = 10;
    admit(&mut nodes[2], at(ms), &key, &quota, 40);
    admit(&mut nodes[0], at(ms), &key, &quota, 0);
    admit(&mut nodes[1], at(ms), &key, &quota, 0);
    round(&mut nodes, at(ms));
    nodes.pop();
    let quiet = nodes[0].quiet_rounds();
    let live =
        |nodes: &[Node]| -> u64 { nodes.iter().map(|n| n.share(&key, &quota).unwrap()).sum() };
    let mut once_quiet = 0;
    for r in 1..=3_000 {
        ms += 10;
        admit(&mut nodes[0], at(ms), &key, &quota, 5);
        round(&mut nodes, at(ms));
        if r == quiet + 1 {
            once_quiet = live(&nodes);
        }
        assert!(
            once_quiet == 0 || live(&nodes) == once_quiet,
            "round {r}: shares still flow to the dead member"
        );
    }
}
