//! Keys at rest are forgotten: a gateway keeps state only for keys whose state differs
//! from a fresh one's, so a mesh that has seen more keys than [`Config::max_slots`] over its
//! life still takes new ones, and forgetting loses nothing: a key counted anew after it was
//! idle is counted on every peer, whether or not the peer forgot it too.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use ratewarden_core::{Key, Quota, Timestamp};
use ratewarden_mesh::{Config, Mode, Node};

const INTERVAL: u64 = 100_000;

fn at(now: u64) -> Timestamp {
    Timestamp::from_micros(now)
}

/// Rounds of `nodes` from `from` (µs) until `until`, every datagram delivered; answers the
/// time.
fn rounds(nodes: &mut [Node], from: u64, until: u64) -> u64 {
    let mut now = from;
    while now < until {
        now += INTERVAL;
        let mut out = Vec::new();
        for node in nodes.iter_mut() {
            out.extend(node.tick(at(now)));
        }
        for o in out {
            for node in nodes.iter_mut() {
                node.receive(at(now), &o.bytes).unwrap();
            }
        }
    }
    now
}

fn admitted(node: &mut Node, now: u64, key: &Key, quota: &Quota, asked: u32) -> u32 {
    (0..asked)
        .filter(|_| node.check(at(now), key, quota, 1).unwrap().is_allowed())
        .count() as u32
}

const QUOTAS: [&str; 3] = ["10/s", "10/s fixed-window", "10/s sliding-window"];

/// Two gateways that hold at most 8 keys see 8 keys used and left idle: a ninth, and
/// more after it, are taken (not refused as full) on both, and each decides its quota.
#[test]
fn idle_keys_leave_room_for_new_ones() {
    for mode in [Mode::Escrow, Mode::Eventual] {
        for quota in QUOTAS {
            let quota: Quota = quota.parse().unwrap();
            let mut config = Config::new(mode);
            config.max_slots = 8;
            let mut nodes = vec![
                Node::new(1, &[1, 2], config.clone()),
                Node::new(2, &[1, 2], config),
            ];
            let mut now = 0;
            for batch in 0..4_u64 {
                for k in 0..8 {
                    let key = Key::from(batch * 8 + k);
                    let node = &mut nodes[usize::from(k % 2 == 1)];
                    let got = node.check(at(now), &key, &quota, 1);
                    assert!(
                        got.is_ok_and(|d| d.is_allowed()),
                        "{mode:?} {quota}: key {} of batch {batch} refused: {got:?}",
                        batch * 8 + k
                    );
                }
                // Heard by the other gateway, then idle for 10 s.
                now = rounds(&mut nodes, now, now + 10_000_000);
            }
            // A key still decides its quota after all that forgetting.
            let key = Key::from("last");
            let mut both = admitted(&mut nodes[0], now, &key, &quota, 20);
            both += admitted(&mut nodes[1], now, &key, &quota, 20);
            let bound = if mode == Mode::Escrow { 10 } else { 20 };
            assert!(
                (5..=bound).contains(&both),
                "{mode:?} {quota}: {both} admitted"
            );
        }
    }
}

/// Eventual: a gateway forgets a key once its last admission weighs no more, while a peer
/// that has not yet forgotten it still holds its running total. What the gateway admits on
/// the key next is charged on that peer all the same (a new count: the peer does not take
/// it for units it heard of before).
#[test]
fn a_key_counted_anew_after_idle_is_charged_on_a_peer_that_kept_it() {
    let key = Key::from("k");
    // Slow enough that nothing refills while B hears of A's units.
    for quota in ["10/min", "10/min fixed-window", "10/min sliding-window"] {
        let quota: Quota = quota.parse().unwrap();
        let mut a = Node::new(1, &[1, 2], Config::new(Mode::Eventual));
        let mut b = Node::new(2, &[1, 2], Config::new(Mode::Eventual));
        assert_eq!(admitted(&mut a, 0, &key, &quota, 10), 10, "{quota}");
        let mut now = 0;
        while now < 1_000_000 {
            now += INTERVAL;
            for o in a.tick(at(now)) {
                b.receive(at(now), &o.bytes).unwrap();
            }
        }
        assert_eq!(b.admitted_from(&key, &quota, 1), 10, "{quota}");
        // A alone goes on for 10 minutes (B neither ticks nor hears it): A forgets the key.
        while now < 601_000_000 {
            now += INTERVAL;
            drop(a.tick(at(now)));
        }
        // A counts 3 units anew; B hears of them.
        assert_eq!(admitted(&mut a, now, &key, &quota, 3), 3, "{quota}");
        for _ in 0..5 {
            now += INTERVAL;
            for o in a.tick(at(now)) {
                b.receive(at(now), &o.bytes).unwrap();
            }
        }
        assert_eq!(
            admitted(&mut b, now, &key, &quota, 10),
            7,
            "{quota}: B admits the burst less what A admitted anew"
        );
    }
}

/// Escrow: keys used and left idle across the mesh in turn, most of them on one gateway
/// then on the other, never admit above the quota in any burst, though gateways forget
/// them in between.
#[test]
fn forgotten_keys_never_admit_above_the_quota() {
    for quota in QUOTAS {
        let quota: Quota = quota.parse().unwrap();
        let mut config = Config::new(Mode::Escrow);
        config.max_slots = 4;
        let mut nodes = vec![
            Node::new(1, &[1, 2, 3], config.clone()),
            Node::new(2, &[1, 2, 3], config.clone()),
            Node::new(3, &[1, 2, 3], config),
        ];
        let mut now = 0;
        for turn in 0..12_u64 {
            let key = Key::from(turn % 3);
            // A burst, most of it on one gateway, some on the others, over a second.
            let mut total = 0;
            for step in 0..10 {
                let heavy = usize::try_from((turn + step) % 3).unwrap();
                for (i, node) in nodes.iter_mut().enumerate() {
                    let asked = if i == heavy { 6 } else { 1 };
                    total += admitted(node, now, &key, &quota, asked);
                }
                now = rounds(&mut nodes, now, now + INTERVAL);
            }
            // In one second the quota admits its burst and a second's refill at most.
            assert!(total <= 20, "{quota}: turn {turn} admitted {total}");
            now = rounds(&mut nodes, now, now + 30_000_000);
        }
    }
}
