//! A round done a few slots at a time ([`Node::advance_round`]): with nothing between its
//! steps it sends what a round done at once sends; with checks, datagrams and a joiner
//! between its steps, escrow admits within the quota and about what whole rounds admit.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::HashMap;

use ratewarden_core::{Key, Quota, Timestamp};
use ratewarden_mesh::{Config, Mode, Node, NodeId, Outgoing};

const INTERVAL: u64 = 100_000;
const WHOLE: u64 = 1_000_000;
/// Turns of checks and datagrams a round, at each gateway ([`sprayed`]).
const TURNS: u32 = 30;

fn at(micros: u64) -> Timestamp {
    Timestamp::from_micros(micros)
}

fn keys(n: usize) -> Vec<Key> {
    (0..n).map(|i| Key::from(format!("key-{i}"))).collect()
}

/// Two copies of a fleet given the same checks, one ticking its rounds at once and one
/// stepping them `slots` at a time with nothing between the steps, send the same bytes
/// each round.
fn same_as_at_once(mode: Mode, slots: usize) {
    let quota: Quota = "10/s".parse().unwrap();
    let keys = keys(300);
    let ids = [1, 2, 3];
    let fleet = || -> Vec<Node> {
        ids.iter()
            .map(|&id| Node::new(id, &ids, Config::new(mode)))
            .collect()
    };
    let (mut whole, mut stepped) = (fleet(), fleet());
    let mut rng = fastrand::Rng::with_seed(7);
    let mut steps = 0;
    for round in 1..=60 {
        let now = round * INTERVAL;
        for i in 0..ids.len() {
            for _ in 0..rng.usize(0..400) {
                let key = &keys[rng.usize(0..keys.len())];
                let a = whole[i].check(at(now), key, &quota, 1).unwrap();
                let b = stepped[i].check(at(now), key, &quota, 1).unwrap();
                assert_eq!(a, b);
            }
        }
        let mut sent = (Vec::new(), Vec::new());
        for i in 0..ids.len() {
            sent.0.extend(whole[i].tick(at(now)));
            sent.1.extend(loop {
                steps += 1;
                if let Some(out) = stepped[i].advance_round(at(now), slots) {
                    break out;
                }
            });
        }
        let bytes = |out: &[Outgoing]| -> Vec<(NodeId, Vec<u8>)> {
            out.iter().map(|o| (o.to, o.bytes.clone())).collect()
        };
        assert_eq!(bytes(&sent.0), bytes(&sent.1), "round {round}");
        for (fleet, out) in [(&mut whole, sent.0), (&mut stepped, sent.1)] {
            for o in out {
                let to = usize::try_from(o.to - 1).unwrap();
                fleet[to].receive(at(now), &o.bytes).unwrap();
            }
        }
    }
    // Up to 300 keys held, visited twice a round, in steps of `slots`.
    assert!(steps > 60 * 3 * 10, "{steps} steps");
}

#[test]
fn an_escrow_round_in_steps_sends_what_a_round_at_once_does() {
    same_as_at_once(Mode::Escrow, 7);
}

#[test]
fn an_eventual_round_in_steps_sends_what_a_round_at_once_does() {
    same_as_at_once(Mode::Eventual, 7);
}

/// A fleet of escrow gateways (SWIM on, sealed) sprayed over `keys` keys, 10% of datagrams
/// lost, each gateway stepping its rounds `slots` at a time (`None`: at once) with checks and
/// datagrams between the steps, and a gateway joining through the first at round 50. Answers
/// what each key admitted, and the shares each key's holders hold at the end.
fn sprayed(slots: Option<usize>, keys: &[Key], quota: &Quota, rounds: u64) -> (Vec<u64>, Vec<u64>) {
    let mut config = Config::new(Mode::Escrow)
        .secret(b"the steps test's shared secret")
        .unwrap();
    config.discover = true;
    let founders = [1, 2, 3, 4];
    let mut nodes: HashMap<NodeId, Node> = founders
        .iter()
        .map(|&id| (id, Node::new(id, &founders, config.clone())))
        .collect();
    let mut rng = fastrand::Rng::with_seed(11);
    let mut admitted = vec![0; keys.len()];
    let mut queue: Vec<Outgoing> = Vec::new();
    for round in 1..=rounds {
        if round == 50 {
            nodes.insert(5, Node::join(5, &[1], config.clone()));
        }
        let mut ids: Vec<NodeId> = nodes.keys().copied().collect();
        ids.sort_unstable();
        // Turns of a few checks and a few datagrams delivered at each gateway, and a step
        // of its round (a round done at once is done on the first turn).
        let mut done: Vec<bool> = vec![false; ids.len()];
        for turn in 0.. {
            if turn >= TURNS && done.iter().all(|&d| d) {
                break;
            }
            for (i, id) in ids.iter().enumerate() {
                let now = round * INTERVAL + rng.u64(0..1_000);
                let node = nodes.get_mut(id).unwrap();
                for _ in 0..rng.usize(0..6) {
                    let k = rng.usize(0..keys.len());
                    let decision = node.check(at(now), &keys[k], quota, 1).unwrap();
                    admitted[k] += u64::from(decision.is_allowed());
                }
                if !done[i]
                    && let Some(out) = node.advance_round(at(now), slots.unwrap_or(usize::MAX))
                {
                    done[i] = true;
                    queue.extend(out);
                }
                for _ in 0..rng.usize(0..4).min(queue.len()) {
                    let o = queue.swap_remove(rng.usize(0..queue.len()));
                    if rng.f64() < 0.1 {
                        continue;
                    }
                    if let Some(to) = nodes.get_mut(&o.to) {
                        to.receive(at(now), &o.bytes).unwrap();
                    }
                }
            }
        }
    }
    // The joiner was let in while rounds were under way.
    assert!(nodes.values().all(|node| node.members().len() == 5));
    let shares = keys
        .iter()
        .map(|key| {
            nodes
                .values()
                .map(|n| n.share(key, quota).unwrap_or(0))
                .sum()
        })
        .collect();
    (admitted, shares)
}

#[test]
fn checks_datagrams_and_a_joiner_between_steps_never_admit_above_the_quota() {
    let quota: Quota = "20/s".parse().unwrap();
    let keys = keys(40);
    let rounds = 300;
    // One exact limiter admits at most the burst and 30 s of the rate a key.
    let exact = 20 + 20 * rounds * INTERVAL / 1_000_000;
    let (stepped, shares) = sprayed(Some(3), &keys, &quota, rounds);
    for (k, (&admitted, &held)) in stepped.iter().zip(&shares).enumerate() {
        assert!(
            admitted <= exact,
            "key {k}: {admitted} admitted, exact {exact}"
        );
        // A key forgotten everywhere is held as at first (its shares then sum to WHOLE).
        assert!(held <= WHOLE, "key {k}: shares sum to {held}");
    }
    // What rounds done at once admit, on the same spray: steps throw no quota away.
    let (whole, _) = sprayed(None, &keys, &quota, rounds);
    let (stepped, whole): (u64, u64) = (stepped.iter().sum(), whole.iter().sum());
    assert!(
        stepped * 10 >= whole * 9,
        "{stepped} admitted in steps, {whole} in whole rounds"
    );
}
