//! Eventual mode, a gateway hearing of a peer's running total for the first time (it is new
//! to the key, or restarted): it charges what those units still weigh in the quota, not
//! what the peer admitted over its whole run, so a key idle for long is not refused. Clocks
//! need not agree: a gateway is told how long ago its peer last admitted.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use ratewarden_core::{Key, Quota, Timestamp};
use ratewarden_mesh::{Config, Mode, Node};

const INTERVAL: u64 = 100_000;

fn node(id: u64) -> Node {
    Node::new(id, &[1, 2], Config::new(Mode::Eventual))
}

/// B's clock reads an hour ahead of a's (whole windows: they line up).
const AHEAD: u64 = 3_600_000_000;

/// Rounds from `from` (µs, a's clock) until `until`, every datagram delivered; answers the
/// time.
fn rounds(a: &mut Node, b: &mut Node, from: u64, until: u64) -> u64 {
    let mut now = from;
    while now < until {
        now += INTERVAL;
        let (at, b_at) = (
            Timestamp::from_micros(now),
            Timestamp::from_micros(now + AHEAD),
        );
        for out in a.tick(at) {
            b.receive(b_at, &out.bytes).unwrap();
        }
        for out in b.tick(b_at) {
            a.receive(at, &out.bytes).unwrap();
        }
    }
    now
}

fn admitted(node: &mut Node, now: u64, key: &Key, quota: &Quota, asked: u32) -> u32 {
    (0..asked)
        .filter(|_| {
            node.check(Timestamp::from_micros(now), key, quota, 1)
                .unwrap()
                .is_allowed()
        })
        .count() as u32
}

#[test]
fn a_restarted_gateway_does_not_charge_what_a_peer_admitted_long_ago() {
    let key = Key::from("k");
    for quota in ["100/min", "100/min fixed-window", "100/min sliding-window"] {
        let quota: Quota = quota.parse().unwrap();
        let (mut a, mut b) = (node(1), node(2));
        // 1 spends the whole burst, 2 hears of it.
        assert_eq!(admitted(&mut a, 0, &key, &quota, 100), 100);
        let now = rounds(&mut a, &mut b, 0, 300_000);
        assert_eq!(admitted(&mut b, now + AHEAD, &key, &quota, 1), 0, "{quota}");
        // Ten idle minutes later 2 restarts and hears what 1 still holds of the key (1
        // forgets it once its units weigh nothing, or its running total, which weighs
        // nothing): the whole burst is there.
        let now = rounds(&mut a, &mut b, now, 600_000_000);
        let mut b = node(2);
        let now = rounds(&mut a, &mut b, now, now + 30 * INTERVAL);
        assert_eq!(
            admitted(&mut b, now + AHEAD, &key, &quota, 100),
            100,
            "{quota}"
        );
    }
}

#[test]
fn a_gateway_new_to_a_key_still_charges_what_a_peer_admitted_lately() {
    let key = Key::from("k");
    for quota in ["100/min", "100/min fixed-window", "100/min sliding-window"] {
        let quota: Quota = quota.parse().unwrap();
        let (mut a, mut b) = (node(1), node(2));
        // 1 spends 80 units two seconds in; 2 first hears of the key through it.
        let now = rounds(&mut a, &mut b, 0, 2_000_000);
        assert_eq!(admitted(&mut a, now, &key, &quota, 80), 80);
        let now = rounds(&mut a, &mut b, now, now + 3 * INTERVAL);
        // At most the 20 left and what refilled in the rounds since (GCRA: 100/min is one
        // unit each 0.6 s).
        let left = admitted(&mut b, now + AHEAD, &key, &quota, 100);
        assert!(left <= 21, "{quota}: {left} admitted after 80 of 100");
    }
}

#[test]
fn units_of_several_peers_heard_late_weigh_no_less_than_in_one_bucket() {
    // 1 and 2 each spend half the burst; 30 s later a third gateway restarts and hears of
    // both. One limiter would have 50 units left to give by then (the burst less 100,
    // plus 30 s of refill at 100 a minute): the third may admit no more.
    let key = Key::from("k");
    let quota: Quota = "100/min".parse().unwrap();
    let ids = [1, 2, 3];
    let mut mesh: Vec<Node> = ids
        .iter()
        .map(|&id| Node::new(id, &ids, Config::new(Mode::Eventual)))
        .collect();
    assert_eq!(admitted(&mut mesh[0], 0, &key, &quota, 50), 50);
    assert_eq!(admitted(&mut mesh[1], 0, &key, &quota, 50), 50);
    let mut now = 0;
    let round = |mesh: &mut [Node], now: u64| {
        let at = Timestamp::from_micros(now);
        let out: Vec<_> = mesh.iter_mut().flat_map(|node| node.tick(at)).collect();
        for datagram in out {
            let to = usize::try_from(datagram.to - 1).unwrap();
            mesh[to].receive(at, &datagram.bytes).unwrap();
        }
    };
    while now < 30_000_000 {
        now += INTERVAL;
        round(&mut mesh, now);
    }
    mesh[2] = Node::new(3, &ids, Config::new(Mode::Eventual));
    for _ in 0..20 {
        now += INTERVAL;
        round(&mut mesh, now);
    }
    assert!(mesh[2].admitted_seen(&key, &quota) >= 100);
    let third = admitted(&mut mesh[2], now, &key, &quota, 100);
    assert!(
        third <= 52,
        "{third} admitted where one limiter has 52 left"
    );
    assert!(
        third > 0,
        "nothing admitted: the peers' units were charged whole"
    );
}
