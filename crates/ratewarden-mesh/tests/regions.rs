//! Regions (escrow): gateways of a region move shares among themselves every round, and
//! across regions only every `Config::region_rounds`, or never (a fixed split: each region
//! keeps its founders' first shares); a region cut off keeps the total within the quota.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use ratewarden_core::{Key, Quota, Timestamp};
use ratewarden_mesh::{Config, Mode, Node};

const INTERVAL: u64 = 100_000;

/// Founders `1..=regions.len()`, gateway `i + 1` in region `regions[i]`, moving shares across
/// regions every `region_rounds`.
fn founded(regions: &[u16], region_rounds: Option<u32>) -> Vec<Node> {
    founded_each(regions, &vec![region_rounds; regions.len()])
}

/// As [`founded`], gateway `i + 1` moving shares across regions every `region_rounds[i]`.
fn founded_each(regions: &[u16], region_rounds: &[Option<u32>]) -> Vec<Node> {
    let ids: Vec<u64> = (1..=regions.len() as u64).collect();
    ids.iter()
        .zip(regions.iter().zip(region_rounds))
        .map(|(&id, (&region, &region_rounds))| {
            let mut config = Config::new(Mode::Escrow);
            config.region = region;
            config.region_rounds = region_rounds;
            Node::new(id, &ids, config)
        })
        .collect()
}

/// Round `round`: gateways (by index) in `asking` are asked 10 units each, then every gateway
/// ticks, and what it sends arrives unless `cut(from, to)`. Answers the units admitted.
fn round(
    nodes: &mut [Node],
    round: u64,
    asking: &[usize],
    demand: (&Key, &Quota),
    cut: impl Fn(usize, usize) -> bool,
) -> u64 {
    let mut asks = vec![0; nodes.len()];
    for &i in asking {
        asks[i] = 10;
    }
    exchange(nodes, round, &asks, demand, cut).iter().sum()
}

/// Round `round`: gateway `i` is asked `asks[i]` units, then every gateway ticks, and what it
/// sends arrives unless `cut(from, to)`. Answers each gateway's units admitted.
fn exchange(
    nodes: &mut [Node],
    round: u64,
    asks: &[usize],
    (key, quota): (&Key, &Quota),
    cut: impl Fn(usize, usize) -> bool,
) -> Vec<u64> {
    let now = Timestamp::from_micros(round * INTERVAL);
    let admitted = asks
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            (0..n)
                .map(|_| u64::from(nodes[i].check(now, key, quota, 1).unwrap().is_allowed()))
                .sum()
        })
        .collect();
    let out: Vec<_> = (0..nodes.len())
        .flat_map(|i| nodes[i].tick(now).into_iter().map(move |o| (i, o)))
        .collect();
    for (from, datagram) in out {
        let to = usize::try_from(datagram.to - 1).unwrap();
        if !cut(from, to) {
            nodes[to].receive(now, &datagram.bytes).unwrap();
        }
    }
    admitted
}

/// The shares gateways `which` hold, a gateway that has not made the key yet holding its
/// first share (of `nodes.len()` equal ones).
fn held(nodes: &[Node], which: &[usize], key: &Key, quota: &Quota) -> u64 {
    let first = 1_000_000 / nodes.len() as u64;
    which
        .iter()
        .map(|&i| nodes[i].share(key, quota).unwrap_or(first))
        .sum()
}

#[test]
fn a_fixed_split_keeps_each_regions_share_in_the_region() {
    let (key, quota): (Key, Quota) = (Key::from("k"), "600/min burst 600".parse().unwrap());
    let mut nodes = founded(&[0, 0, 1, 1], None);
    let mut admitted = 0;
    // Only gateway 0 asks, for more than the whole quota, for two minutes.
    for r in 1..=1_200 {
        admitted += round(&mut nodes, r, &[0], (&key, &quota), |_, _| false);
        assert_eq!(
            held(&nodes, &[2, 3], &key, &quota),
            500_000,
            "round {r}: region 1 gave its share away"
        );
    }
    // Its region's half: half the burst and half of two minutes at 10/s.
    assert!(admitted <= 300 + 600, "{admitted} admitted");
    assert!(admitted >= 800, "{admitted} of 900 admitted");
    assert!(held(&nodes, &[0], &key, &quota) >= 490_000);
}

#[test]
fn shares_follow_demand_across_regions_only_every_few_rounds() {
    let (key, quota): (Key, Quota) = (Key::from("k"), "600/min burst 600".parse().unwrap());
    let mut nodes = founded(&[0, 0, 1, 1], Some(10));
    let mut admitted = 0;
    let mut moved_across = 0;
    let mut before = held(&nodes, &[2, 3], &key, &quota);
    for r in 1..=1_200 {
        admitted += round(&mut nodes, r, &[0], (&key, &quota), |_, _| false);
        let after = held(&nodes, &[2, 3], &key, &quota);
        if after < before {
            assert_eq!(r % 10, 0, "round {r}: region 1 gave across regions");
            moved_across += 1;
        }
        before = after;
    }
    assert!(moved_across > 0);
    // One exact limiter admits the burst and two minutes at 10/s: 1,800.
    assert!(admitted <= 1_800, "{admitted} admitted");
    assert!(admitted >= 1_500, "{admitted} of 1,800 admitted");
    assert!(held(&nodes, &[0], &key, &quota) >= 900_000);
}

#[test]
fn a_region_cut_off_keeps_the_mesh_within_the_quota() {
    for region_rounds in [None, Some(10)] {
        let (key, quota): (Key, Quota) = (Key::from("k"), "600/min burst 600".parse().unwrap());
        let mut nodes = founded(&[0, 0, 1, 1, 2, 2], region_rounds);
        let all = [0, 1, 2, 3, 4, 5];
        let mut log: Vec<(u64, u64)> = Vec::new();
        // Region 2 is cut off from the others for a minute of three, everyone asking.
        for r in 1..=1_800 {
            let cut = |a: usize, b: usize| (600..1_200).contains(&r) && ((a >= 4) != (b >= 4));
            let units = round(&mut nodes, r, &all, (&key, &quota), cut);
            log.push((r * INTERVAL, units));
        }
        // Never over: the burst and 10/s in every interval.
        for (i, &(start, _)) in log.iter().enumerate() {
            let mut units = 0;
            for &(at, u) in &log[i..] {
                units += u;
                let bound = 600 + (at - start) / INTERVAL;
                assert!(
                    units <= bound,
                    "{units} from {start} to {at} µs, over {bound}"
                );
            }
        }
        let total: u64 = log.iter().map(|&(_, u)| u).sum();
        assert!(
            total >= 2_000,
            "{region_rounds:?}: {total} of 2,400 admitted"
        );
        let shares = held(&nodes, &all, &key, &quota);
        assert!(shares <= 1_000_000, "shares sum to {shares}");
    }
}

#[test]
fn a_leaver_hands_its_share_to_its_own_region() {
    let (key, quota): (Key, Quota) = (Key::from("k"), "600/min burst 600".parse().unwrap());
    let mut nodes = founded(&[0, 0, 1, 1], None);
    for r in 1..=100 {
        round(&mut nodes, r, &[0, 1, 2, 3], (&key, &quota), |_, _| false);
    }
    let region_1 = held(&nodes, &[2, 3], &key, &quota);
    nodes[0].leave(Timestamp::from_micros(101 * INTERVAL));
    for r in 101..=200 {
        round(&mut nodes, r, &[1, 2, 3], (&key, &quota), |_, _| false);
    }
    assert!(nodes[0].parted());
    assert_eq!(held(&nodes, &[0], &key, &quota), 0);
    assert_eq!(held(&nodes, &[2, 3], &key, &quota), region_1);
    assert_eq!(held(&nodes, &[1], &key, &quota), 1_000_000 - region_1);
}

#[test]
fn a_leaver_under_a_fixed_split_waits_for_its_region_rather_than_hand_across() {
    let (key, quota): (Key, Quota) = (Key::from("k"), "600/min burst 600".parse().unwrap());
    // Gateway 1 (region 0) never makes the key before gateway 0 leaves.
    let mut nodes = founded(&[0, 0, 1], None);
    for r in 1..=50 {
        let asks: &[usize] = if r % 10 == 0 { &[0, 2] } else { &[] };
        round(&mut nodes, r, asks, (&key, &quota), |_, _| false);
    }
    nodes[0].leave(Timestamp::from_micros(51 * INTERVAL));
    for r in 51..=150 {
        round(&mut nodes, r, &[], (&key, &quota), |_, _| false);
    }
    assert!(nodes[0].parted());
    assert!(
        held(&nodes, &[2], &key, &quota) <= 333_334,
        "region 1 took more"
    );
    assert!(held(&nodes, &[1], &key, &quota) >= 666_666);
}

#[test]
fn under_a_fixed_split_an_idle_gateway_gives_its_share_to_its_region() {
    let (key, quota): (Key, Quota) = (Key::from("k"), "600/min burst 600".parse().unwrap());
    let mut nodes = founded(&[0, 0, 1], None);
    for r in 1..=1_200 {
        round(&mut nodes, r, &[0, 2], (&key, &quota), |_, _| false);
    }
    assert!(
        held(&nodes, &[1], &key, &quota) < 10_000,
        "the idle gateway keeps {}",
        held(&nodes, &[1], &key, &quota)
    );
    assert!(held(&nodes, &[2], &key, &quota) <= 333_334);
}

#[test]
fn a_region_that_keeps_a_fixed_split_is_given_nothing_across_by_one_that_does_not() {
    let (key, quota): (Key, Quota) = (Key::from("k"), "600/min burst 600".parse().unwrap());
    // Region 0 was given `None`, region 1 `Some(10)`: region 0 never gives across, so
    // region 1 gives it nothing either, or what it gave would never come back.
    let mut nodes = founded_each(&[0, 0, 1, 1], &[None, None, Some(10), Some(10)]);
    let mut admitted = 0;
    for r in 1..=600 {
        admitted += round(&mut nodes, r, &[0], (&key, &quota), |_, _| false);
        assert_eq!(
            held(&nodes, &[2, 3], &key, &quota),
            500_000,
            "round {r}: region 1 gave its share to a region that gives nothing back"
        );
    }
    assert!(admitted >= 300 + 250, "{admitted} admitted");
    // Demand moves to region 1, which still holds its half.
    let mut by_region_1 = 0;
    for r in 601..=1_200 {
        by_region_1 += round(&mut nodes, r, &[2], (&key, &quota), |_, _| false);
    }
    assert!(by_region_1 >= 300 + 250, "region 1 admitted {by_region_1}");
}

/// `per_10` units over ten rounds, spread evenly (round `round`'s part).
fn spread(per_10: u32, round: u64) -> usize {
    let r = u32::try_from(round % 10).unwrap();
    ((per_10 * (r + 1)) / 10 - (per_10 * r) / 10) as usize
}

/// [`exchange`] with every datagram arriving.
fn round_asking(
    nodes: &mut [Node],
    round: u64,
    asks: &[usize],
    demand: (&Key, &Quota),
) -> Vec<u64> {
    exchange(nodes, round, asks, demand, |_, _| false)
}

#[test]
fn a_gateway_restarted_with_a_fixed_split_leaves_the_others_moving_shares_across() {
    let (key, quota): (Key, Quota) = (Key::from("k"), "100/s burst 100".parse().unwrap());
    let mut nodes = founded(&[0, 0, 1, 1], Some(10));
    let mut r = 0;
    // Demand on region 0 draws region 1's shares across.
    for _ in 0..600 {
        r += 1;
        round_asking(&mut nodes, r, &[20, 0, 0, 0], (&key, &quota));
    }
    // Gateway 3 comes back keeping a fixed split: demand moves to region 1, and region 0,
    // idle, still gives back across to gateway 2.
    let mut config = Config::new(Mode::Escrow);
    config.region = 1;
    config.region_rounds = None;
    config.incarnation = 1 << 40;
    nodes[3] = Node::new(4, &[1, 2, 3, 4], config);
    let mut by_region_1 = 0;
    for _ in 0..1_200 {
        r += 1;
        by_region_1 += round_asking(&mut nodes, r, &[0, 0, 20, 20], (&key, &quota))[2..]
            .iter()
            .sum::<u64>();
    }
    // One exact limiter admits about 12,000 in the two minutes.
    assert!(by_region_1 >= 10_000, "region 1 admitted {by_region_1}");
}

#[test]
fn under_a_fixed_split_a_part_of_a_unit_left_over_is_handed_on() {
    // A burst of 3 over two regions: region 0 holds a unit and a half.
    let (key, quota): (Key, Quota) = (Key::from("k"), "300/min burst 3".parse().unwrap());
    let mut nodes = founded(&[0, 0, 1, 1], None);
    let mut by_0 = 0;
    for r in 1..=1_200 {
        let got = round_asking(&mut nodes, r, &[2, 0, 0, 0], (&key, &quota));
        if r > 600 {
            by_0 += got[0];
        }
    }
    // Region 0's half of 5/s over the last minute.
    assert!(by_0 >= 140, "gateway 0 admitted {by_0} of its region's 150");
}

#[test]
fn under_a_fixed_split_a_region_s_parts_are_reckoned_on_what_it_holds() {
    let (key, quota): (Key, Quota) = (Key::from("k"), "100/s burst 100".parse().unwrap());
    let mut nodes = founded(&[0, 0, 1, 1], None);
    let (mut admitted, mut r) = (0, 0);
    // Region 0 holds half the quota (50/s); gateway 0 asks 45/s and 1 asks 10/s: 1 gives 0
    // what it does not use.
    for _ in 0..1_200 {
        r += 1;
        let got = round_asking(
            &mut nodes,
            r,
            &[spread(45, r), spread(10, r), 0, 0],
            (&key, &quota),
        );
        if r > 600 {
            admitted += got[0] + got[1];
        }
    }
    assert!(
        admitted >= 2_850,
        "region 0 admitted {admitted} of its 3,000"
    );
}
