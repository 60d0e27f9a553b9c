//! Escrow: a gateway forgets a key at rest and makes it again (a new life of the slot);
//! its peers settle with the life before each as it hears of the new one, on either side of
//! a partition, and the fleet never holds more than the quota meanwhile.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use ratewarden_core::{Key, Quota, Timestamp};
use ratewarden_mesh::{Config, Mode, Node};

const I: u64 = 100_000;
const FIRST: [u64; 3] = [333_334, 333_333, 333_333];

fn at(t: u64) -> Timestamp {
    Timestamp::from_micros(t)
}

/// One round; a datagram from or to a node in `cut` is lost.
fn round(nodes: &mut [Node], now: u64, cut: &[usize]) {
    let mut out = Vec::new();
    for (i, n) in nodes.iter_mut().enumerate() {
        for o in n.tick(at(now)) {
            out.push((i, o));
        }
    }
    for (from, o) in out {
        let to = usize::try_from(o.to - 1).unwrap();
        if cut.contains(&from) || cut.contains(&to) {
            continue;
        }
        nodes[to].receive(at(now), &o.bytes).unwrap();
    }
}

/// The shares held, a forgotten one as its first.
fn sum(nodes: &[Node], k: &Key, q: &Quota) -> u64 {
    nodes
        .iter()
        .zip(FIRST)
        .map(|(n, f)| n.share(k, q).unwrap_or(f))
        .sum()
}

fn ask(n: &mut Node, now: u64, k: &Key, q: &Quota, c: u32) -> u32 {
    (0..c)
        .filter(|_| n.check(at(now), k, q, 1).unwrap().is_allowed())
        .count() as u32
}

/// A draws its peers' shares, then passes some to C; all go quiet, A forgets the key. With
/// C cut off, A uses the key again: B settles with A's life before, C cannot yet. The
/// shares held never sum above the quota, nor does the fleet admit above it.
#[test]
fn a_life_settled_by_one_peer_while_another_is_cut_off_never_lifts_the_quota() {
    let (k, q): (Key, Quota) = (Key::from("k"), "10/s".parse().unwrap());
    let mut nodes: Vec<Node> = (1..=3)
        .map(|id| Node::new(id, &[1, 2, 3], Config::new(Mode::Escrow)))
        .collect();
    let mut now = 0;
    // A (node 1) busy: it draws B's and C's shares.
    for _ in 0..30 {
        ask(&mut nodes[0], now, &k, &q, 5);
        now += I;
        round(&mut nodes, now, &[]);
    }
    // A and C (node 3) busy: A gives C some.
    for _ in 0..20 {
        ask(&mut nodes[0], now, &k, &q, 3);
        ask(&mut nodes[2], now, &k, &q, 5);
        now += I;
        round(&mut nodes, now, &[]);
    }
    // Both go on asking within their shares until no one has refused for a while.
    for r in 0..60 {
        if r % 4 == 0 {
            ask(&mut nodes[0], now, &k, &q, 1);
            ask(&mut nodes[2], now, &k, &q, 1);
        }
        now += I;
        round(&mut nodes, now, &[]);
    }
    // A idle; C asks 1 unit every 10 rounds (never refused), then goes quiet too. A keeps
    // the key while its books with a peer do not balance (C, asking, repays nothing), and
    // forgets it once they do.
    let mut r = 0;
    while nodes[0].share(&k, &q).is_some() && r < 1_000 {
        if r % 10 == 0 && r < 300 {
            assert_eq!(ask(&mut nodes[2], now, &k, &q, 1), 1);
        }
        now += I;
        r += 1;
        round(&mut nodes, now, &[]);
        assert!(sum(&nodes, &k, &q) <= 1_000_000);
    }
    assert!(nodes[0].share(&k, &q).is_none(), "A never forgot the key");
    assert_eq!(sum(&nodes, &k, &q), 1_000_000);
    // C is cut off (a partition); A uses the key again, a new life: B hears it and settles.
    assert_eq!(ask(&mut nodes[0], now, &k, &q, 1), 1);
    for _ in 0..10 {
        now += I;
        round(&mut nodes, now, &[2]);
    }
    let held = sum(&nodes, &k, &q);
    // 20 s of demand everywhere: the fleet may admit B + rate * 20 s = 210 at most.
    let mut total = 0;
    for _ in 0..200 {
        for n in nodes.iter_mut() {
            total += ask(n, now, &k, &q, 5);
        }
        now += I;
        round(&mut nodes, now, &[2]);
    }
    for _ in 0..100 {
        now += I;
        round(&mut nodes, now, &[]);
    }
    assert!(held <= 1_000_000, "shares sum to {held}");
    assert!(total <= 210, "admitted {total} in 20 s");
}

/// A founder uses eight keys, leaves and hands its shares to the two left, and stops: once
/// the keys are at rest the two forget them (what it handed over is given up with them), so
/// a mesh that scales down still takes new keys, and never holds more than the quota.
#[test]
fn keys_a_departed_founder_handed_over_are_forgotten_at_rest() {
    let q: Quota = "10/s".parse().unwrap();
    let mut config = Config::new(Mode::Escrow);
    config.max_slots = 8;
    let mut nodes: Vec<Node> = (1..=3)
        .map(|id| Node::new(id, &[1, 2, 3], config.clone()))
        .collect();
    let mut now = 0;
    for k in 0..8_u64 {
        assert_eq!(ask(&mut nodes[2], now, &Key::from(k), &q, 1), 1);
    }
    now += I;
    round(&mut nodes, now, &[]);
    for o in nodes[2].leave(at(now)) {
        let to = usize::try_from(o.to - 1).unwrap();
        nodes[to].receive(at(now), &o.bytes).unwrap();
    }
    let mut r = 0;
    while !nodes[2].parted() && r < 100 {
        now += I;
        r += 1;
        round(&mut nodes, now, &[]);
    }
    assert!(nodes[2].parted());
    // Ten idle minutes, the founder that left stopped.
    for _ in 0..6_000 {
        now += I;
        round(&mut nodes, now, &[2]);
        for k in 0..8_u64 {
            let held = sum(&nodes[..2], &Key::from(k), &q);
            assert!(held <= 1_000_000, "key {k}: {held} held");
        }
    }
    for k in 0..8_u64 {
        assert_eq!(nodes[0].share(&Key::from(k), &q), None, "key {k} kept");
    }
    assert_eq!(ask(&mut nodes[0], now, &Key::from(99_u64), &q, 1), 1);
}
