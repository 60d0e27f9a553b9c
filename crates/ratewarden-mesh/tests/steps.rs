//! A round done a few slots at a time ([`Node::advance_round`]): with nothing between its
//! steps it sends what a round done at once sends; with checks, datagrams and a joiner
//! between its steps, escrow admits within the quota and about what whole rounds admit; a
//! restart heard between its steps voids what the round gathered for the run before.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::HashMap;

use ratewarden_core::{Key, Quota, Timestamp};
use ratewarden_mesh::{Config, Mode, Node, NodeId, Outgoing};

const INTERVAL: u64 = 100_000;
const MS: u64 = 1_000;
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

fn deliver(out: &[Outgoing], to: &mut Node, now: u64) {
    let id = to.id();
    for o in out.iter().filter(|o| o.to == id) {
        to.receive(at(now), &o.bytes).unwrap();
    }
}

/// `node`'s round a slot at a time, `heard` delivered to it after its third step
/// (`between`) or once the round is done: the round's datagrams.
fn round_hearing(node: &mut Node, now: u64, heard: &[Outgoing], between: bool) -> Vec<Outgoing> {
    let mut steps = 0;
    let out = loop {
        steps += 1;
        if let Some(out) = node.advance_round(at(now), 1) {
            break out;
        }
        if between && steps == 3 {
            deliver(heard, node, now);
        }
    };
    if !between {
        deliver(heard, node, now);
    }
    out
}

/// A (id 1) restarted with a lower incarnation (5) than its run before (10), which only B
/// heard. A gives C shares of key k (C refusing); C's acknowledgements of the last round are
/// lost, so A resends its transfer. A round of A's is stepped a slot at a time; B's first
/// datagram to A (carrying to_incarnation 10: A moves above and settles with every peer)
/// arrives after A's gossip pass gathered k's transfer and before the round's end
/// (`between`), or after the whole round (control). Then two more whole rounds, all
/// delivered. Answers (units of k admitted across the fleet, bound burst + rate x time,
/// shares summed at the end).
fn move_above_mid_round(between: bool) -> (u64, u64, u64) {
    let ids: [NodeId; 3] = [1, 2, 3];
    let quota: Quota = "100/s".parse().unwrap();
    let k = Key::from("k");
    let other = Key::from("other");
    let config = |inc: u64| {
        let mut c = Config::new(Mode::Escrow);
        c.incarnation = inc;
        c
    };
    let mut admitted = 0;
    let mut spray = |n: &mut Node, now: u64, times: usize| {
        for _ in 0..times {
            admitted += u64::from(n.check(at(now), &k, &quota, 1).unwrap().is_allowed());
        }
    };
    let mut a_old = Node::new(1, &ids, config(10));
    let mut b = Node::new(2, &ids, config(10));
    let mut c = Node::new(3, &ids, config(10));
    // B hears A's run before (incarnation 10).
    let mut now = 0;
    spray(&mut b, now, 200);
    let out = a_old.tick(at(now));
    deliver(&out, &mut b, now);
    drop(a_old);
    // A restarts, with a lower incarnation (its clock behind).
    let mut a = Node::new(1, &ids, config(5));
    // A and C only hear each other for a while; C is refusing on k. C's last round's
    // datagrams to A (its acknowledgements) are lost.
    for round in 0..6 {
        now += 100 * MS;
        spray(&mut c, now, 200);
        spray(&mut b, now, 200);
        let from_c = c.tick(at(now));
        if round < 5 {
            deliver(&from_c, &mut a, now);
        }
        let from_a = a.tick(at(now));
        deliver(&from_a, &mut c, now);
    }
    // A holds a second slot, so its round has a step boundary after k's gossip.
    a.check(at(now), &other, &quota, 1).unwrap();
    now += 100 * MS;
    spray(&mut c, now, 200);
    spray(&mut b, now, 200);
    let from_c = c.tick(at(now));
    let from_b = b.tick(at(now));
    assert!(from_b.iter().any(|o| o.to == 1));
    let out = round_hearing(&mut a, now, &from_b, between);
    deliver(&out, &mut c, now);
    deliver(&from_c, &mut a, now);
    let s = |n: &Node| n.share(&k, &quota).unwrap_or(WHOLE / 3);
    spray(&mut c, now, 200);
    // Two more rounds, everything delivered.
    for _ in 0..2 {
        now += 100 * MS;
        spray(&mut c, now, 200);
        spray(&mut b, now, 200);
        let mut all = Vec::new();
        for n in [&mut a, &mut b, &mut c] {
            all.extend(n.tick(at(now)));
        }
        for n in [&mut a, &mut b, &mut c] {
            deliver(&all, n, now);
        }
    }
    let bound = 100 + 100 * now / 1_000_000;
    (admitted, bound, s(&a) + s(&b) + s(&c))
}

#[test]
fn a_restart_below_its_run_before_heard_between_steps_admits_within_the_quota() {
    for between in [false, true] {
        let (admitted, bound, _) = move_above_mid_round(between);
        assert!(
            admitted <= bound,
            "between {between}: {admitted} admitted, bound {bound}"
        );
    }
}

/// B (id 2) restarts (incarnation 1 -> 2) while A (id 1) has a transfer of key k to B's run
/// before unacknowledged. B's run before made "x" then k (k's life 1 + 1 + 1 = 3); the new
/// run makes k first (life 2 + 0 + 1 = 3). A's round is stepped a slot at a time and B's new
/// run's first datagram reaches A after A's gossip pass gathered k's transfer (`between`),
/// or after the whole round (control). Answers the shares of k summed over A and B, for
/// the five whole rounds after, all delivered.
fn restart_mid_round(between: bool) -> Vec<u64> {
    let ids: [NodeId; 2] = [1, 2];
    let quota: Quota = "100/s".parse().unwrap();
    let (k, x, other) = (Key::from("k"), Key::from("x"), Key::from("other"));
    let config = |inc: u64| {
        let mut c = Config::new(Mode::Escrow);
        c.incarnation = inc;
        c
    };
    let mut a = Node::new(1, &ids, config(1));
    let mut b_old = Node::new(2, &ids, config(1));
    let mut now = 0;
    b_old.check(at(now), &x, &quota, 1).unwrap();
    for round in 0..6 {
        now += 100 * MS;
        for _ in 0..200 {
            b_old.check(at(now), &k, &quota, 1).unwrap();
        }
        let from_b = b_old.tick(at(now));
        if round < 5 {
            deliver(&from_b, &mut a, now); // the last round's acknowledgements are lost
        }
        if round == 0 {
            a.check(at(now), &other, &quota, 1).unwrap(); // k is A's slot 0, "other" 1
        }
        let from_a = a.tick(at(now));
        deliver(&from_a, &mut b_old, now);
    }
    drop(b_old);
    let mut b = Node::new(2, &ids, config(2));
    now += 100 * MS;
    for _ in 0..200 {
        b.check(at(now), &k, &quota, 1).unwrap();
    }
    let from_b = b.tick(at(now));
    let out = round_hearing(&mut a, now, &from_b, between);
    deliver(&out, &mut b, now);
    let mut sums = Vec::new();
    for _ in 0..5 {
        now += 100 * MS;
        for _ in 0..200 {
            b.check(at(now), &k, &quota, 1).unwrap();
        }
        let mut all = a.tick(at(now));
        all.extend(b.tick(at(now)));
        deliver(&all, &mut a, now);
        deliver(&all, &mut b, now);
        let s = |n: &Node| n.share(&k, &quota).unwrap_or(WHOLE / 2);
        sums.push(s(&a) + s(&b));
    }
    sums
}

#[test]
fn a_peer_s_restart_heard_between_steps_makes_no_share_out_of_nothing() {
    for between in [false, true] {
        let sums = restart_mid_round(between);
        assert!(
            sums.iter().all(|&s| s <= WHOLE),
            "between {between}: {sums:?}"
        );
    }
}
