//! Applying any datagram twice, or out of order, changes nothing: a gateway that receives a
//! run's datagrams shuffled and duplicated ends where one that received them once, in
//! order, does. (Eventual mode forgives a gateway's history beyond one period's worth when
//! it first hears of it, so the first datagram heard from each gateway about each key comes
//! first in both.)
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use proptest::prelude::*;
use ratewarden_core::{Decision, Key, Quota, Timestamp};
use ratewarden_mesh::wire::Datagram;
use ratewarden_mesh::{Config, Mode, Node};

const MEMBERS: [u64; 3] = [1, 2, 3];

fn node(id: u64, mode: Mode) -> Node {
    let mut config = Config::new(mode);
    config.seed = 9;
    Node::new(id, &MEMBERS, config)
}

/// What can be seen of gateway 3 for `key`: its share, the units it has counted, and its
/// decisions of single units until one is refused (whose retry says how deep it owes).
fn observe(
    node: &mut Node,
    key: &Key,
    quota: &Quota,
    now: Timestamp,
) -> (Option<u64>, u64, Vec<Decision>) {
    let seen = (node.share(key, quota), node.admitted_seen(key, quota));
    let mut decisions = Vec::new();
    while decisions.len() < 500 {
        let decision = node.check(now, key, quota, 1).unwrap();
        decisions.push(decision);
        if !decision.is_allowed() {
            break;
        }
    }
    (seen.0, seen.1, decisions)
}

/// How many of `datagrams` come before every (origin, key) they mention has been mentioned.
fn first_heard(datagrams: &[Vec<u8>]) -> usize {
    let mut all = std::collections::HashSet::new();
    for bytes in datagrams {
        for e in Datagram::decode(bytes).unwrap().entries {
            all.insert((e.origin, e.slot.key));
        }
    }
    let mut heard = std::collections::HashSet::new();
    for (i, bytes) in datagrams.iter().enumerate() {
        if heard.len() == all.len() {
            return i;
        }
        for e in Datagram::decode(bytes).unwrap().entries {
            heard.insert((e.origin, e.slot.key));
        }
    }
    datagrams.len()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_024))]

    #[test]
    fn datagrams_applied_twice_or_out_of_order_change_nothing(
        escrow in any::<bool>(),
        ops in prop::collection::vec((0_usize..3, 0_u32..4, 0_u64..50_000), 1..200),
        order in any::<u64>(),
    ) {
        let mode = if escrow { Mode::Escrow } else { Mode::Eventual };
        let quota: Quota = "20/s".parse().unwrap();
        let keys = [Key::from("a"), Key::from(7_u64)];
        // Gateways 1 and 2, and two copies of gateway 3, check and tick (cost 0: a tick).
        // What 1 and 2 send each other is delivered at once, what they send 3 is kept; what
        // the first copy of 3 sends is delivered, the second's (the same) dropped.
        let mut senders = [node(1, mode), node(2, mode)];
        let (mut once, mut shuffled) = (node(3, mode), node(3, mode));
        let mut to_third = Vec::new();
        let mut now = 0;
        for (i, (who, cost, dt)) in ops.into_iter().enumerate() {
            now += dt;
            let at = Timestamp::from_micros(now);
            let key = &keys[i % 2];
            if who == 2 {
                if cost > 0 {
                    prop_assert_eq!(once.check(at, key, &quota, cost), shuffled.check(at, key, &quota, cost));
                } else {
                    let _ = shuffled.tick(at);
                    for out in once.tick(at) {
                        let to = usize::try_from(out.to - 1).unwrap();
                        senders[to].receive(at, &out.bytes).unwrap();
                    }
                }
                continue;
            }
            if cost > 0 {
                let _ = senders[who].check(at, key, &quota, cost);
                continue;
            }
            for out in senders[who].tick(at) {
                if out.to == 3 {
                    to_third.push(out.bytes);
                } else {
                    senders[1 - who].receive(at, &out.bytes).unwrap();
                }
            }
        }
        let at = Timestamp::from_micros(now);
        for bytes in &to_third {
            once.receive(at, bytes).unwrap();
        }
        let mut rng = fastrand::Rng::with_seed(order);
        let first = if escrow { 0 } else { first_heard(&to_third) };
        let mut replayed: Vec<&Vec<u8>> = to_third[first..].iter().chain(to_third.iter().filter(|_| rng.bool())).collect();
        rng.shuffle(&mut replayed);
        for bytes in to_third[..first].iter().chain(replayed) {
            shuffled.receive(at, bytes).unwrap();
        }
        for key in &keys {
            prop_assert_eq!(observe(&mut once, key, &quota, at), observe(&mut shuffled, key, &quota, at));
        }
    }
}
