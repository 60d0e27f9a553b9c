//! How escrow shares follow demand: a gateway given less than its fair part is given more,
//! even beside one that asks for more than the whole quota; a gateway in debt after a peer's
//! restart is repaid; a quota too small to split is held whole where it is asked for, and a
//! part of whole units holds them though the burst does not divide a million parts.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use ratewarden_core::{Key, Quota, Timestamp};
use ratewarden_mesh::{Config, Mode, Node};

const WHOLE: u64 = 1_000_000;

/// A fleet of escrow gateways gossiping every `interval` µs with no loss, each round asked
/// `ask(round, gateway)` requests of cost 1 for one key. Answers each gateway's requests
/// admitted and made, from round `from` on, and the shares held at the end.
fn drive(
    n: u64,
    quota: &Quota,
    interval: u64,
    rounds: u64,
    from: u64,
    mut ask: impl FnMut(u64, usize, &mut Vec<Node>) -> u32,
) -> (Vec<(u64, u64)>, u64) {
    let key = Key::from("k");
    let ids: Vec<u64> = (1..=n).collect();
    let mut nodes: Vec<Node> = ids
        .iter()
        .map(|&id| Node::new(id, &ids, Config::new(Mode::Escrow)))
        .collect();
    let mut counts = vec![(0, 0); ids.len()];
    for round in 0..rounds {
        let now = Timestamp::from_micros(round * interval);
        for i in 0..nodes.len() {
            for _ in 0..ask(round, i, &mut nodes) {
                let admitted = nodes[i]
                    .check(now, &key, quota, 1)
                    .is_ok_and(|d| d.is_allowed());
                if round >= from {
                    counts[i].0 += u64::from(admitted);
                    counts[i].1 += 1;
                }
            }
        }
        let out: Vec<_> = nodes.iter_mut().flat_map(|node| node.tick(now)).collect();
        for datagram in out {
            let to = usize::try_from(datagram.to - 1).unwrap();
            nodes[to].receive(now, &datagram.bytes).unwrap();
        }
    }
    let shares = nodes
        .iter()
        .map(|node| node.share(&key, quota).unwrap_or(0))
        .sum();
    (counts, shares)
}

/// A gateway that gave its share away, and whose peer restarted, owes what it had been
/// given by the run before: it is repaid from the shares it is given next, though it is
/// idle, and the fleet never admits more than the quota.
#[test]
fn a_gateway_in_debt_after_a_restart_is_repaid() {
    let quota: Quota = "100/min".parse().unwrap();
    let (counts, shares) = drive(4, &quota, 100_000, 7_800, 2_400, |round, i, nodes| {
        if round == 1_800 {
            let mut config = Config::new(Mode::Escrow);
            config.incarnation = 1 << 40;
            nodes[1] = Node::new(2, &[1, 2, 3, 4], config);
        }
        let busy: &[usize] = match round {
            0..300 => &[0],
            300..1_800 => &[2],
            _ => &[1, 2],
        };
        u32::from(busy.contains(&i))
    });
    assert!(shares <= WHOLE, "shares held: {shares}");
    let admitted: u64 = counts.iter().map(|c| c.0).sum();
    // 9 minutes of 100 a minute, and the burst.
    assert!(admitted <= 1_000, "{admitted} admitted in 9 minutes");
}

/// A gateway asking a fifth of the rate, beside one asking ten times it, is given its fifth:
/// no one is given more than it asks for while another asks for more.
#[test]
fn a_light_gateway_keeps_its_part_beside_a_saturated_one() {
    let quota: Quota = "100/min".parse().unwrap();
    for interval in [100_000, 500_000] {
        // A request every `every` rounds: a fifth of the rate.
        let every = 60_000_000 * 5 / 100 / interval;
        let (counts, shares) = drive(
            2,
            &quota,
            interval,
            1_200_000_000 / interval,
            600_000_000 / interval,
            |round, i, _| match i {
                0 => 10,
                _ => u32::from(round.is_multiple_of(every)),
            },
        );
        assert!(shares <= WHOLE);
        let (admitted, asked) = counts[1];
        assert!(
            admitted * 10 >= asked * 8,
            "{interval} µs: the light gateway had {admitted} of {asked}"
        );
    }
}

/// A quota whose burst is smaller than the gateways asking (1 a second, burst 1): a share
/// too small to hold one unit serves no one, so the whole is held where it is asked for.
#[test]
fn a_quota_too_small_to_split_is_held_where_it_is_asked_for() {
    let quota: Quota = "1/s".parse().unwrap();
    // Twice the rate on gateway 0 for five minutes at 100 ms.
    let (counts, shares) = drive(3, &quota, 100_000, 3_000, 600, |round, i, _| {
        u32::from(i == 0 && round.is_multiple_of(5))
    });
    assert!(shares <= WHOLE);
    let (admitted, asked) = counts[0];
    // An exact limiter admits half.
    assert!(admitted * 10 >= asked * 4, "{admitted} of {asked}");
}

/// Demand that was a storm on one gateway and moved to another: the idle gateway's demand
/// (refused requests included) counts at most the quota's rate, so its share follows within
/// the averaging horizon.
#[test]
fn a_storm_that_moved_leaves_no_share_behind() {
    let quota: Quota = "100/min".parse().unwrap();
    let interval = 100_000;
    let phase = 300; // 30 s of a storm at 20x the rate on gateway 0.
    let (counts, _) = drive(
        3,
        &quota,
        interval,
        phase + 600,
        phase,
        |round, i, _| match (round < phase, i) {
            (true, 0) => u32::from(round % 3 != 0) * 2 + 1,
            (false, 1) => u32::from(round.is_multiple_of(5)) + u32::from(round.is_multiple_of(25)),
            _ => 0,
        },
    );
    // The minute after the move: 144 requests on gateway 1, of which one exact limiter,
    // emptied by the storm, admits the rate's 100. Escrow: at least 0.8 of that.
    let (admitted, asked) = counts[1];
    assert_eq!(asked, 144);
    assert!(admitted >= 80, "{admitted} of {asked}");
}

/// A burst that does not divide a million parts (12): a gateway whose part is one unit holds
/// one unit, though its share is a part short of a twelfth.
#[test]
fn a_part_of_one_unit_admits_one_unit() {
    let quota: Quota = "12/s".parse().unwrap();
    // 12 gateways, each asked a request every third round (3.3 a second: 40 against 12).
    let (counts, shares) = drive(12, &quota, 100_000, 3_000, 600, |round, i, _| {
        u32::from((round + i as u64).is_multiple_of(3))
    });
    assert!(shares <= WHOLE);
    for (i, (admitted, asked)) in counts.iter().enumerate() {
        assert!(
            *admitted * 10 >= *asked,
            "gateway {i}: {admitted} of {asked}"
        );
    }
    let admitted: u64 = counts.iter().map(|c| c.0).sum();
    // 4 minutes at 12 a second: an exact limiter admits 2,880 and the burst.
    assert!(admitted >= 2_880 * 8 / 10, "{admitted} admitted");
}

/// `per_10` units over ten rounds, spread evenly (round `round`'s part).
fn spread(per_10: u64, round: u64) -> u32 {
    u32::try_from(per_10 * (round % 10 + 1) / 10 - per_10 * (round % 10) / 10).unwrap()
}

/// Two gateways asking 30/s each slow to 23/s (less than a quarter lower) while a third asks
/// for more than the whole rate: their demand is told as it is while a peer refuses, so their
/// shares follow it down and the third is given what they no longer use.
#[test]
fn demand_lowered_by_less_than_a_quarter_is_told_while_a_peer_refuses() {
    let quota: Quota = "100/s burst 100".parse().unwrap();
    let (counts, _) = drive(3, &quota, 100_000, 1_800, 600, |round, i, _| {
        match (i, round) {
            (2, _) => 10,
            (_, ..600) => 3,
            (_, _) => spread(23, round),
        }
    });
    let admitted: u64 = counts.iter().map(|c| c.0).sum();
    // One exact limiter admits 100/s over the last 120 s.
    assert!(admitted >= 11_640, "{admitted} of 12,000 admitted");
    assert!(admitted <= 12_000 + 100, "{admitted} admitted");
}
