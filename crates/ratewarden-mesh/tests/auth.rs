//! Every datagram is sealed under the mesh's secret: a stranger can neither inject
//! consumption nor join, and a datagram replayed is dropped and counted.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use ratewarden_core::{Key, Quota, Timestamp};
use ratewarden_mesh::{Config, Mode, Node};

const SECRET: &[u8] = b"the mesh's shared secret";

fn node(id: u64, secret: &[u8]) -> Node {
    Node::new(
        id,
        &[1, 2],
        Config::new(Mode::Eventual).secret(secret).unwrap(),
    )
}

fn spend(node: &mut Node, units: u32) {
    let quota: Quota = "10/s".parse().unwrap();
    for _ in 0..units {
        assert!(
            node.check(Timestamp::from_micros(0), &Key::from("k"), &quota, 1)
                .unwrap()
                .is_allowed()
        );
    }
}

#[test]
fn a_stranger_without_the_secret_can_neither_inject_consumption_nor_join() {
    let quota: Quota = "10/s".parse().unwrap();
    let now = Timestamp::from_micros(0);
    let mut gateway = node(1, SECRET);
    // A stranger posing as member 2, with another secret, claims the whole quota spent.
    let mut stranger = node(2, b"not the mesh's secret at all");
    spend(&mut stranger, 10);
    for out in stranger.tick(now) {
        gateway.receive(now, &out.bytes).unwrap();
    }
    assert_eq!(gateway.dropped().forged, 1);
    assert_eq!(gateway.admitted_seen(&Key::from("k"), &quota), 0);
    // Unsealed bytes are no better.
    let mut plain = Node::new(2, &[1, 2], Config::new(Mode::Eventual));
    spend(&mut plain, 10);
    for out in plain.tick(now) {
        gateway.receive(now, &out.bytes).unwrap();
    }
    assert_eq!(gateway.dropped().forged, 2);
    assert!(
        gateway
            .check(now, &Key::from("k"), &quota, 10)
            .unwrap()
            .is_allowed()
    );
    // The real member 2 is heard.
    let mut member = node(2, SECRET);
    spend(&mut member, 3);
    for out in member.tick(now) {
        gateway.receive(now, &out.bytes).unwrap();
    }
    assert_eq!(gateway.admitted_seen(&Key::from("k"), &quota), 13);
}

#[test]
fn a_datagram_replayed_is_dropped_and_counted() {
    let now = Timestamp::from_micros(0);
    let mut gateway = node(1, SECRET);
    let mut member = node(2, SECRET);
    spend(&mut member, 1);
    let first = member.tick(now).remove(0).bytes;
    gateway.receive(now, &first).unwrap();
    gateway.receive(now, &first).unwrap(); // seen: dropped
    assert_eq!(gateway.dropped().replayed, 1);
    // 64 datagrams later, the first is older than the window.
    for _ in 0..64 {
        spend(&mut member, 0);
        let quota: Quota = "10/s".parse().unwrap();
        let _ = member.check(
            now,
            &Key::from(format!("other-{}", fastrand::u32(..)).as_str()),
            &quota,
            1,
        );
        for out in member.tick(now) {
            gateway.receive(now, &out.bytes).unwrap();
        }
    }
    gateway.receive(now, &first).unwrap();
    assert_eq!(gateway.dropped().replayed, 2);
    assert_eq!(gateway.dropped().forged, 0);
}

/// A round of many datagrams to one peer, delivered last first: none is taken for a replay.
#[test]
fn a_round_delivered_out_of_order_is_not_a_replay() {
    let quota: Quota = "10/s".parse().unwrap();
    let small = |id| {
        let mut config = Config::new(Mode::Eventual).secret(SECRET).unwrap();
        config.max_datagram = 100; // one entry a datagram
        Node::new(id, &[1, 2, 3], config)
    };
    let (mut a, mut b) = (small(1), small(2));
    let now = Timestamp::from_micros(0);
    for i in 0..300_u64 {
        a.check(now, &Key::from(i), &quota, 1).unwrap();
    }
    let mut to_b: Vec<_> = a.tick(now).into_iter().filter(|o| o.to == 2).collect();
    assert!(to_b.len() >= 300, "{} datagrams", to_b.len());
    to_b.reverse();
    for out in &to_b {
        b.receive(now, &out.bytes).unwrap();
    }
    assert_eq!(b.dropped().replayed, 0);
    let heard = (0..300_u64)
        .filter(|&i| b.admitted_from(&Key::from(i), &quota, 1) == 1)
        .count();
    assert_eq!(heard, 300);
}
