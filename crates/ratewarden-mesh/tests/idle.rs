//! Keys at rest are forgotten: a gateway keeps state only for keys whose state differs
//! from a fresh one's, so a mesh that has seen more keys than [`Config::max_slots`] over its
//! life still takes new ones, and forgetting loses nothing: a key counted anew after it was
//! idle is counted on every peer, whether or not the peer forgot it too.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use ratewarden_core::{Key, Quota, Timestamp};
use ratewarden_mesh::{Config, Mode, Node, Outgoing};

const INTERVAL: u64 = 100_000;

fn at(now: u64) -> Timestamp {
    Timestamp::from_micros(now)
}

/// Rounds of `nodes` from `from` (µs) until `until`, every datagram delivered at once;
/// answers the time.
fn rounds(nodes: &mut [Node], from: u64, until: u64) -> u64 {
    Net::default().rounds(nodes, from, until)
}

/// How datagrams go: `loss` percent lost (drawn from `seed`), the rest `flight` µs late.
#[derive(Default)]
struct Net {
    loss: u64,
    flight: u64,
    seed: u64,
}

impl Net {
    fn rounds(&mut self, nodes: &mut [Node], from: u64, until: u64) -> u64 {
        let mut now = from;
        while now < until {
            now += INTERVAL;
            let mut out = Vec::new();
            for node in nodes.iter_mut() {
                out.extend(node.tick(at(now)));
            }
            for o in out {
                self.seed = self
                    .seed
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                if (self.seed >> 33) % 100 < self.loss {
                    continue;
                }
                for node in nodes.iter_mut() {
                    node.receive(at(now + self.flight), &o.bytes).unwrap();
                }
            }
        }
        now
    }
}

/// The shares of `key` the three founders hold, a forgotten one as its first.
fn held(nodes: &[Node], key: &Key, quota: &Quota) -> u64 {
    let first = [333_334, 333_333, 333_333];
    nodes
        .iter()
        .zip(first)
        .map(|(node, first)| node.share(key, quota).unwrap_or(first))
        .sum()
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
                // Heard by the other gateway, then idle for 20 s.
                now = rounds(&mut nodes, now, now + 20_000_000);
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

fn founders(max_slots: usize) -> Vec<Node> {
    let mut config = Config::new(Mode::Escrow);
    config.max_slots = max_slots;
    (1..=3)
        .map(|id| Node::new(id, &[1, 2, 3], config.clone()))
        .collect()
}

/// Escrow: keys used and left idle in turn, their demand moving between gateways (so
/// shares move), never admit above the quota in any burst under 5% loss, though gateways
/// forget them in between; once at rest the shares held sum to the whole quota again.
#[test]
fn forgotten_keys_never_admit_above_the_quota() {
    let mut lossy = Net {
        loss: 5,
        seed: 7,
        ..Net::default()
    };
    for quota in QUOTAS {
        let quota: Quota = quota.parse().unwrap();
        let mut nodes = founders(4);
        let mut now = 0;
        for turn in 0..12_u64 {
            let key = Key::from(turn % 3);
            // A burst, most of it on one gateway, some on the others, over a second.
            let mut total = 0;
            for step in 0..10 {
                let heavy = usize::try_from((turn + step / 4) % 3).unwrap();
                for (i, node) in nodes.iter_mut().enumerate() {
                    let asked = if i == heavy { 6 } else { 1 };
                    total += admitted(node, now, &key, &quota, asked);
                }
                now = lossy.rounds(&mut nodes, now, now + INTERVAL);
                let held = held(&nodes, &key, &quota);
                assert!(held <= 1_000_000, "{quota}: turn {turn} holds {held}");
            }
            // In one second the quota admits its burst and a second's refill at most.
            assert!(total <= 20, "{quota}: turn {turn} admitted {total}");
            now = lossy.rounds(&mut nodes, now, now + 30_000_000);
            // Used again, the key's shares sum to the whole quota (a gateway that forgot it
            // holding more than its first share left the rest to its peers).
            for node in &mut nodes {
                admitted(node, now, &key, &quota, 1);
            }
            now = lossy.rounds(&mut nodes, now, now + 2_000_000);
            let held = held(&nodes, &key, &quota);
            assert!(
                (999_000..=1_000_000).contains(&held),
                "{quota}: turn {turn} holds {held} once used again"
            );
        }
    }
}

/// Escrow: keys whose shares moved (demand held on one gateway draws its peers' shares)
/// are forgotten too once at rest: gateways that hold at most 8 keys take new ones after
/// 32 such keys.
#[test]
fn keys_whose_shares_moved_are_forgotten_once_at_rest() {
    for quota in QUOTAS {
        let quota: Quota = quota.parse().unwrap();
        let mut nodes = founders(8);
        let mut now = 0;
        for batch in 0..8_u64 {
            let keys: Vec<Key> = (0..4).map(|k| Key::from(batch * 4 + k)).collect();
            for _ in 0..10 {
                for (k, key) in keys.iter().enumerate() {
                    let got = nodes[k % 3].check(at(now), key, &quota, 1);
                    assert!(got.is_ok(), "{quota}: batch {batch}: {got:?}");
                    for _ in 0..5 {
                        let _ = nodes[k % 3].check(at(now), key, &quota, 1).unwrap();
                    }
                }
                now = rounds(&mut nodes, now, now + INTERVAL);
            }
            let moved = nodes[0].share(&keys[0], &quota).unwrap();
            assert!(
                moved > 400_000,
                "{quota}: batch {batch}: shares did not move"
            );
            now = rounds(&mut nodes, now, now + 30_000_000);
        }
    }
}

fn eventual(ids: &[u64], max_slots: usize) -> Vec<Node> {
    let mut config = Config::new(Mode::Eventual);
    config.max_slots = max_slots;
    ids.iter()
        .map(|&id| Node::new(id, ids, config.clone()))
        .collect()
}

/// Eventual: a gateway that forgot a key it spent is not charged its own units again when
/// a peer, whose copy of them is a datagram's flight younger, tells it of them late.
#[test]
fn a_gateway_is_not_charged_again_its_own_forgotten_units() {
    let (quota, key): (Quota, _) = ("10/s".parse().unwrap(), Key::from("k"));
    let mut nodes = eventual(&[1, 2], 100);
    assert_eq!(admitted(&mut nodes[0], 99_500, &key, &quota, 10), 10);
    let mut late = Net {
        flight: 1_000,
        ..Net::default()
    };
    let now = late.rounds(&mut nodes, 0, 15_000_000);
    assert_eq!(admitted(&mut nodes[0], now + 1_001, &key, &quota, 10), 10);
}

/// Eventual, two gateways made with `config`: A admits `units` of "k" (10/s) and tells B in
/// its first round, then both go on until B has forgotten the key. Answers the gateways,
/// A's first datagrams, and the time (µs).
fn told_then_forgotten(config: &Config, units: u32) -> (Vec<Node>, Vec<Outgoing>, u64) {
    let (quota, key): (Quota, _) = ("10/s".parse().unwrap(), Key::from("k"));
    let mut a = Node::new(1, &[1, 2], config.clone());
    let mut b = Node::new(2, &[1, 2], config.clone());
    assert_eq!(admitted(&mut a, 0, &key, &quota, units), units);
    let first = a.tick(at(INTERVAL));
    for o in &first {
        b.receive(at(INTERVAL), &o.bytes).unwrap();
    }
    let mut nodes = vec![a, b];
    let now = rounds(&mut nodes, INTERVAL, 15_000_000);
    assert_eq!(
        nodes[1].admitted_from(&key, &quota, 1),
        0,
        "B forgot the key"
    );
    (nodes, first, now)
}

/// Eventual: a datagram that comes again after its key was forgotten charges nothing: the
/// seal drops it as replayed (as it would on a gateway that kept the key: a count heard
/// again is not newer).
#[test]
fn a_datagram_again_after_a_key_was_forgotten_charges_nothing() {
    let (quota, key): (Quota, _) = ("10/s".parse().unwrap(), Key::from("k"));
    let sealed = Config::new(Mode::Eventual)
        .secret(b"a secret of sixteen bytes or more")
        .unwrap();
    let (mut nodes, first, now) = told_then_forgotten(&sealed, 10);
    for o in &first {
        nodes[1].receive(at(now), &o.bytes).unwrap();
    }
    assert_eq!(admitted(&mut nodes[1], now, &key, &quota, 10), 10);
}

/// Eventual: keys used once, their datagrams a millisecond in flight, are forgotten by
/// every gateway of eight for good (no gateway makes them again from a peer's late copy),
/// and new keys fit.
#[test]
fn keys_used_once_are_forgotten_by_every_gateway_for_good() {
    let quota: Quota = "10/s".parse().unwrap();
    let ids: Vec<u64> = (1..=8).collect();
    let mut nodes = eventual(&ids, 4);
    for k in 0..4_u64 {
        assert_eq!(admitted(&mut nodes[0], 99_500, &Key::from(k), &quota, 1), 1);
    }
    let mut late = Net {
        flight: 1_000,
        ..Net::default()
    };
    let now = late.rounds(&mut nodes, 0, 120_000_000);
    for node in &mut nodes {
        assert_eq!(admitted(node, now + 2_000, &Key::from("new"), &quota, 1), 1);
    }
}

/// Eventual, unsealed: a datagram that comes again more than 5 s after its key was
/// forgotten is taken as a first hearing (the crate docs): it over-charges once, by what it
/// counts, and again and again after that it charges nothing more.
#[test]
fn unsealed_a_count_heard_again_late_after_its_key_was_forgotten_over_charges_it_once() {
    let (quota, key): (Quota, _) = ("10/s".parse().unwrap(), Key::from("k"));
    let (mut nodes, first, now) = told_then_forgotten(&Config::new(Mode::Eventual), 4);
    for _ in 0..3 {
        for o in &first {
            nodes[1].receive(at(now), &o.bytes).unwrap();
        }
    }
    assert_eq!(nodes[1].admitted_from(&key, &quota, 1), 4);
    assert_eq!(
        admitted(&mut nodes[1], now, &key, &quota, 10),
        6,
        "charged 4 once"
    );
}

/// Escrow: a key's demand decays for a minute or more after it is used; a gateway tells it
/// again only once it moved by more than a quarter (or to zero), so a thousand keys used
/// once are not gossiped every round meanwhile (about 170,000 bytes a round if they were;
/// the repair's 64 entries a round alone are about 11,000).
#[test]
fn keys_used_once_are_not_gossiped_every_round_while_their_demand_decays() {
    let quota: Quota = "100/min burst 100".parse().unwrap();
    let mut nodes = founders(100_000);
    for k in 0..1_000_u64 {
        assert_eq!(
            admitted(&mut nodes[0], INTERVAL, &Key::from(k), &quota, 1),
            1
        );
    }
    let now = rounds(&mut nodes, 0, 50 * INTERVAL);
    let before = nodes[0].sent().bytes;
    rounds(&mut nodes, now, now + 300 * INTERVAL);
    let a_round = (nodes[0].sent().bytes - before) / 300;
    assert!(a_round < 30_000, "{a_round} bytes a round");
}
