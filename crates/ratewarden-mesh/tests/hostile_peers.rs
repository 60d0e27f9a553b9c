//! What a faulty or lying member, a careless operator and a dead gateway can do to a node:
//! never a panic, never a share created from a lie, never more shares poured into a member
//! that has gone silent.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use ratewarden_core::{Key, Limit, Quota, Timestamp};
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

/// An escrow gateway's config in its `incarnation`.
fn escrow(incarnation: u64) -> Config {
    let mut config = Config::new(Mode::Escrow);
    config.incarnation = incarnation;
    config
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
                    reserved: false,
                },
                origin,
                version: u64::MAX,
                a: u64::MAX,
                b: u64::MAX,
                c: u64::MAX,
                life: u64::MAX,
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

/// Node 1 gives most of its share to node 2 (busy), then restarts under a new incarnation
/// with its first share again: node 2, on hearing the new incarnation, drops what it had
/// been given by the old one, so the two hold the whole quota between them, not more, and
/// the rate admitted over the following minutes is the quota's.
#[test]
fn a_restarted_gateway_takes_back_nothing_it_gave_away() {
    let (quota, key) = restart_quota();
    let (mut nodes, ms) = one_drew_from_the_other(1, || escrow(1));
    let given = 500_000 - nodes[0].share(&key, &quota).unwrap();
    assert!(given > 300_000, "node 1 gave only {given}");
    nodes[0] = Node::new(1, &[1, 2], escrow(2));
    let (admitted, bound) = ten_minutes_asking(&mut nodes, ms);
    let held = total(&nodes, &key, &quota);
    assert!(held <= 1_000_000, "{held} of 1,000,000 held");
    assert!(
        admitted <= bound,
        "{admitted} admitted in ten minutes, bound {bound}"
    );
}

/// The quota and key the restart tests share: 100 a minute.
fn restart_quota() -> (Quota, Key) {
    ("100/min".parse().unwrap(), Key::from("k"))
}

/// Two gateways made by `config`, the `busy` one (0 or 1) having drawn most of the other's
/// share: 20 requests a round on it for 100 rounds of 100 ms. Returns them and the time, ms.
fn one_drew_from_the_other(busy: usize, config: impl Fn() -> Config) -> (Vec<Node>, u64) {
    let (quota, key) = restart_quota();
    let members = [1, 2];
    let mut nodes = vec![
        Node::new(1, &members, config()),
        Node::new(2, &members, config()),
    ];
    let mut ms = 0;
    admit(&mut nodes[1 - busy], at(ms), &key, &quota, 0);
    for _ in 0..100 {
        ms += 100;
        admit(&mut nodes[busy], at(ms), &key, &quota, 20);
        round(&mut nodes, at(ms));
    }
    (nodes, ms)
}

/// The shares `nodes` hold after `rounds` rounds of 100 ms from `ms`, node 1 (restarted)
/// having made its slot and asking for nothing more.
fn held_after(nodes: &mut [Node], mut ms: u64, rounds: u32, key: &Key, quota: &Quota) -> u64 {
    for _ in 0..rounds {
        ms += 100;
        admit(&mut nodes[0], at(ms), key, quota, 0);
        round(nodes, at(ms));
    }
    total(nodes, key, quota)
}

/// Rounds of 100 ms from `ms` in which each gateway asks once, for ten minutes: what they
/// admitted, and the bound for it (the rate over the ten minutes, a burst, and one
/// restarted gateway's fresh bucket: its first share of the burst).
fn ten_minutes_asking(nodes: &mut [Node], mut ms: u64) -> (u32, u32) {
    let (quota, key) = restart_quota();
    let mut admitted = 0;
    for _ in 0..6_000 {
        ms += 100;
        for node in nodes.iter_mut() {
            admitted += admit(node, at(ms), &key, &quota, 1);
        }
        round(nodes, at(ms));
    }
    (admitted, 100 * 10 + 100 + 50)
}

/// A datagram from a gateway running the other mode is dropped and counted, not read.
#[test]
fn a_gateway_of_the_other_mode_is_not_heard() {
    let quota: Quota = "10/h".parse().unwrap();
    let key = Key::from("k");
    let mut escrow = Node::new(1, &[1, 2], Config::new(Mode::Escrow));
    let mut eventual = Node::new(2, &[1, 2], Config::new(Mode::Eventual));
    assert_eq!(admit(&mut eventual, at(0), &key, &quota, 10), 10);
    for out in eventual.tick(at(0)) {
        escrow.receive(at(0), &out.bytes).unwrap();
    }
    assert!(escrow.dropped().strangers >= 1);
    assert_eq!(escrow.admitted_from(&key, &quota, 2), 0);
}

/// Three escrow gateways under random load, over a network that loses a fifth of the
/// datagrams and delays others by a round, each restarting now and then (unsealed, with a
/// higher incarnation; sealed, with its clock ahead, behind or the same): after the load
/// stops and the shares settle, they hold at most the whole quota between them, and the
/// units admitted stay within the burst, the rate, and a restarted gateway's fresh bucket
/// (its first share of the burst) for each restart.
#[test]
fn restarts_under_loss_never_make_shares_out_of_nothing() {
    let quota: Quota = "60/min".parse().unwrap();
    let key = Key::from("k");
    let members = [1, 2, 3];
    for seed in 0..40_u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let with_seal = seed % 2 == 1;
        let config = |round: u64, rng: &mut fastrand::Rng| {
            let mut config = if with_seal {
                // A clock in microseconds, a restart's an hour ahead or behind, or the same.
                let clock = 1_000_000_000_000 + round * 100_000;
                sealed(match rng.u32(0..3) {
                    0 => clock + 3_600_000_000,
                    1 => clock - 3_600_000_000,
                    _ => 1_000_000_000_000,
                })
            } else {
                escrow(round + 1)
            };
            config.seed = seed;
            config
        };
        let mut nodes: Vec<Node> = members
            .iter()
            .map(|&id| Node::new(id, &members, config(0, &mut rng)))
            .collect();
        let (mut admitted, mut restarts, mut late) = (0_u32, 0_u32, Vec::new());
        let rounds = 3_000_u64;
        for round in 1..=rounds + 300 {
            let now = at(round * 100);
            if round <= rounds {
                for node in &mut nodes {
                    let tries = rng.u32(0..3);
                    admitted += admit(node, now, &key, &quota, tries);
                }
                if rng.u32(0..200) == 0 {
                    let i = rng.usize(0..3);
                    nodes[i] = Node::new(members[i], &members, config(round, &mut rng));
                    restarts += 1;
                }
            }
            let mut out: Vec<_> = nodes.iter_mut().flat_map(|n| n.tick(now)).collect();
            out.append(&mut late);
            for o in out {
                match rng.u32(0..10) {
                    0 | 1 => {}        // lost
                    2 => late.push(o), // a round late
                    _ => {
                        let to = usize::try_from(o.to - 1).unwrap();
                        nodes[to].receive(now, &o.bytes).unwrap();
                    }
                }
            }
        }
        let shares: u64 = nodes
            .iter()
            .map(|n| n.share(&key, &quota).unwrap_or(0))
            .sum();
        assert!(shares <= 1_000_000, "seed {seed}: shares {shares}");
        let minutes = (rounds * 100) as f64 / 60_000.0;
        let bound = 60.0 + 60.0 * minutes + f64::from(restarts) * 20.0;
        assert!(
            f64::from(admitted) <= bound,
            "seed {seed}: {admitted} admitted, {restarts} restarts, bound {bound}"
        );
    }
}

/// Node 2 gives node 1 part of its share, the transfer is lost, node 1 restarts, and node 2
/// resends before it has heard the new incarnation: the restarted node takes none of it
/// (the share went to the incarnation before, and is lost with it, never made twice).
#[test]
fn a_transfer_meant_for_the_incarnation_before_a_restart_is_void() {
    let quota: Quota = "100/h".parse().unwrap();
    let key = Key::from("k");
    let members = [1, 2];
    let mut nodes = vec![
        Node::new(1, &members, escrow(1)),
        Node::new(2, &members, escrow(1)),
    ];
    admit(&mut nodes[1], at(0), &key, &quota, 0);
    admit(&mut nodes[0], at(0), &key, &quota, 80);
    round(&mut nodes, at(100));
    // Node 2 gives; the round is lost.
    let lost: Vec<_> = nodes[1].tick(at(200));
    assert!(
        nodes[1].share(&key, &quota).unwrap() < 500_000,
        "node 2 gave nothing"
    );
    drop(lost);
    nodes[0] = Node::new(1, &members, escrow(2));
    admit(&mut nodes[0], at(300), &key, &quota, 0);
    for out in nodes[1].tick(at(300)) {
        nodes[0].receive(at(300), &out.bytes).unwrap();
    }
    // (No state: the transfer made none, and the share is the first.)
    assert_eq!(nodes[0].share(&key, &quota).unwrap_or(500_000), 500_000);
    assert!(nodes[0].dropped().stale >= 1);
}

/// Node 1, busy, draws most of the quota from node 2, then restarts: node 2 takes back what
/// it had given the incarnation before (as share, without tokens), so after the restart the
/// two hold the whole quota again, not the 1/N the restarted one comes back with plus what
/// node 2 kept.
#[test]
fn a_hot_gateways_restart_gives_its_peers_back_what_they_gave_it() {
    let (quota, key) = restart_quota();
    let (mut nodes, ms) = one_drew_from_the_other(0, || escrow(1));
    assert!(nodes[0].share(&key, &quota).unwrap() > 800_000);
    nodes[0] = Node::new(1, &[1, 2], escrow(2));
    let held = held_after(&mut nodes, ms, 10, &key, &quota);
    assert!(
        (999_000..=1_000_000).contains(&held),
        "the fleet holds {held} of 1,000,000 after a restart"
    );
}

/// Probes read state and never write it: probing keys a gateway has never seen makes no
/// slot there, nor on its peers, and never fills the node.
#[test]
fn probes_of_unseen_keys_make_no_state() {
    let quota: Quota = "10/s".parse().unwrap();
    let mut config = escrow(1);
    config.max_slots = 3;
    let mut nodes = vec![
        Node::new(1, &[1, 2], config.clone()),
        Node::new(2, &[1, 2], config),
    ];
    for k in 0..10_u64 {
        let probe = [Limit::probe(Key::from(k), quota, 1)];
        assert!(nodes[0].check_all(at(0), &probe).unwrap().is_allowed());
    }
    round(&mut nodes, at(100));
    round(&mut nodes, at(200));
    for node in &mut nodes {
        assert!(
            node.check(at(300), &Key::from("real"), &quota, 1)
                .unwrap()
                .is_allowed()
        );
        assert_eq!(node.share(&Key::from(0_u64), &quota), None);
    }
    // A request refused as full counts nothing and makes no slot either.
    let mut config = escrow(1);
    config.max_slots = 1;
    let mut node = Node::new(1, &[1], config);
    let both = [
        Limit::new(Key::from("a"), quota, 1),
        Limit::new(Key::from("b"), quota, 1),
    ];
    assert!(node.check_all(at(0), &both).is_err());
    assert!(
        node.check(at(0), &Key::from("c"), &quota, 1)
            .unwrap()
            .is_allowed()
    );
}

/// A request no retry can meet (a cost above the burst) is no demand: a client sending
/// them to one gateway draws no shares to it.
#[test]
fn impossible_requests_draw_no_shares() {
    let quota: Quota = "10/s".parse().unwrap();
    let key = Key::from("k");
    let mut nodes = vec![
        Node::new(1, &[1, 2], escrow(1)),
        Node::new(2, &[1, 2], escrow(1)),
    ];
    admit(&mut nodes[1], at(0), &key, &quota, 0);
    for r in 1..50 {
        let decision = nodes[0].check(at(r * 100), &key, &quota, 11).unwrap();
        assert!(!decision.is_allowed());
        round(&mut nodes, at(r * 100));
    }
    // (No state: the key is at rest, and its share the first.)
    assert_eq!(nodes[1].share(&key, &quota).unwrap_or(500_000), 500_000);
}

/// A gateway restarts with its clock behind its run before (a VM restored from a snapshot,
/// a clock not yet set): its incarnation and sequence numbers are below what its peers saw.
/// Its peers tell it what they know, it takes numbers above them, and is heard again: the
/// two hold the whole quota between them and admit at its rate.
#[test]
fn a_gateway_restarted_with_its_clock_behind_is_heard_again() {
    let (quota, key) = restart_quota();
    let (mut nodes, ms) = one_drew_from_the_other(1, || sealed(1_000_000));
    nodes[0] = Node::new(1, &[1, 2], sealed(500_000));
    let (admitted, bound) = ten_minutes_asking(&mut nodes, ms);
    let held = total(&nodes, &key, &quota);
    assert!(held <= 1_000_000, "{held} of 1,000,000 held");
    assert!(nodes[1].dropped().replayed < 10, "{:?}", nodes[1].dropped());
    assert!(
        admitted <= bound,
        "{admitted} admitted in ten minutes, bound {bound}"
    );
}

/// Ticks every node and delivers only what `ok(from, to)` lets through.
fn round_if(nodes: &mut [Node], now: Timestamp, ok: impl Fn(u64, u64) -> bool) {
    let mut out = Vec::new();
    for node in nodes.iter_mut() {
        let from = node.id();
        out.extend(node.tick(now).into_iter().map(|o| (from, o)));
    }
    for (from, o) in out {
        if ok(from, o.to)
            && let Some(node) = nodes.iter_mut().find(|n| n.id() == o.to)
        {
            node.receive(now, &o.bytes).unwrap();
        }
    }
}

/// An escrow config sealed under the tests' secret, its incarnation and first sequence
/// number the same (as `MeshStore` sets them).
fn sealed(incarnation: u64) -> Config {
    let mut config = escrow(incarnation)
        .secret(b"a secret the test's gateways share")
        .unwrap();
    config.first_sequence = incarnation;
    config
}

/// The shares of `key` the founders `nodes` hold, a forgotten one (or one never made) as
/// its first.
fn total(nodes: &[Node], key: &Key, quota: &Quota) -> u64 {
    let n = nodes.len() as u64;
    (0..n)
        .map(|i| {
            let first = 1_000_000 / n + u64::from(i < 1_000_000 % n);
            nodes[usize::try_from(i).unwrap()]
                .share(key, quota)
                .unwrap_or(first)
        })
        .sum()
}

/// Node 1's run X talks to node 2 only; it restarts with its clock behind (run L) and draws
/// shares from node 3, which never heard X; then all talk, node 2 tells node 1 of X and node
/// 1 moves above it. Node 3 settles with L, and node 1 with node 3 alike: nothing is held
/// twice.
#[test]
fn a_gateway_moving_above_a_run_it_forgot_settles_with_every_peer() {
    let quota: Quota = "100/min".parse().unwrap();
    let key = Key::from("k");
    let members = [1, 2, 3];
    let mut nodes: Vec<Node> = members
        .iter()
        .map(|&id| Node::new(id, &members, sealed(1_000_000)))
        .collect();
    let mut ms = 0;
    for node in &mut nodes {
        admit(node, at(ms), &key, &quota, 0);
    }
    for _ in 0..50 {
        ms += 100;
        round_if(&mut nodes, at(ms), |f, t| f != 3 && t != 3);
    }
    nodes[0] = Node::new(1, &members, sealed(500_000));
    admit(&mut nodes[0], at(ms), &key, &quota, 0);
    for _ in 0..50 {
        ms += 100;
        admit(&mut nodes[0], at(ms), &key, &quota, 20);
        round_if(&mut nodes, at(ms), |f, t| f != 2 && t != 2);
    }
    for r in 0..200 {
        ms += 100;
        round(&mut nodes, at(ms));
        let held = total(&nodes, &key, &quota);
        assert!(held <= 1_000_000, "round {r}: {held} of 1,000,000 held");
    }
}

/// A gateway restarted with the same incarnation (sealed, so its peers took sequence numbers
/// from its run before): they tell it, it moves above, and both settle.
#[test]
fn a_restart_at_the_same_incarnation_is_settled() {
    for incarnation in [0, 1_000_000] {
        let (quota, key) = restart_quota();
        let (mut nodes, ms) = one_drew_from_the_other(0, || sealed(incarnation));
        nodes[0] = Node::new(1, &[1, 2], sealed(incarnation));
        let held = held_after(&mut nodes, ms, 100, &key, &quota);
        assert!(
            (999_000..=1_000_000).contains(&held),
            "incarnation {incarnation}: {held} of 1,000,000 held"
        );
    }
}

/// After moving above a long run it forgot, a gateway's demand is heard: its entries are
/// not outranked by the old run's, still relayed, and a burst on it draws shares.
#[test]
fn a_gateway_moved_above_its_run_before_draws_shares() {
    let quota: Quota = "100/min".parse().unwrap();
    let key = Key::from("k");
    let members = [1, 2, 3];
    let mut nodes: Vec<Node> = members
        .iter()
        .map(|&id| Node::new(id, &members, sealed(1_000_000)))
        .collect();
    let mut ms = 0;
    for node in &mut nodes {
        admit(node, at(ms), &key, &quota, 0);
    }
    for r in 0..3_000 {
        ms += 100;
        if r < 100 {
            admit(&mut nodes[0], at(ms), &key, &quota, 20);
        }
        round(&mut nodes, at(ms));
    }
    nodes[0] = Node::new(1, &members, sealed(500_000));
    admit(&mut nodes[0], at(ms), &key, &quota, 0);
    for _ in 0..5 {
        ms += 100;
        round(&mut nodes, at(ms));
    }
    for _ in 0..300 {
        ms += 100;
        admit(&mut nodes[0], at(ms), &key, &quota, 20);
        round(&mut nodes, at(ms));
    }
    let share = nodes[0].share(&key, &quota).unwrap();
    assert!(share > 600_000, "the busy gateway holds {share}");
}
