//! The window algorithms on the mesh: escrow keeps the fleet within the count in every fixed
//! window and under the sliding window counter at every instant, while demand moves and
//! datagrams are lost; eventual stays within its stated bound; reservations hold room in
//! the window.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::HashMap;
use std::time::Duration;

use ratewarden_core::algorithm::{AlgorithmState, FixedWindowState, SlidingWindowState};
use ratewarden_core::{Key, Limit, Quota, Timestamp};
use ratewarden_mesh::{Config, Mode, Node};

const SECOND: u64 = 1_000_000;
const INTERVAL: u64 = SECOND / 10;

fn nodes(n: u64, mode: Mode) -> Vec<Node> {
    let ids: Vec<u64> = (1..=n).collect();
    // Every peer each round: what a gateway admits is heard by all within the round.
    let mut config = Config::new(mode);
    config.fanout = usize::try_from(n).unwrap();
    ids.iter()
        .map(|&id| Node::new(id, &ids, config.clone()))
        .collect()
}

/// A xorshift generator, so that each trace is the same on every run.
fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// One gossip round at `now`: every datagram delivered, but those lost at `loss` percent.
fn round(nodes: &mut [Node], now: Timestamp, loss: u64, next: &mut impl FnMut() -> u64) {
    let out: Vec<_> = nodes.iter_mut().flat_map(|node| node.tick(now)).collect();
    for datagram in out {
        if next() % 100 >= loss {
            let to = usize::try_from(datagram.to - 1).unwrap();
            nodes[to].receive(now, &datagram.bytes).unwrap();
        }
    }
}

/// An admission: when (µs), by which gateway, how many units.
type Admitted = (u64, usize, u64);

/// Five minutes of `n` gateways asking for `quota` every round: a busy gateway, which
/// changes every 40 s, asks for two requests of 1-2 units a round, the others for one now
/// and then. Answers what the mesh admitted, and what one exact limiter, asked the same,
/// admits.
fn trace(n: u64, mode: Mode, quota: &Quota, loss: u64, seed: u64) -> (Vec<Admitted>, u64) {
    let key = Key::from("k");
    let mut mesh = nodes(n, mode);
    let mut next = rng(seed);
    let mut fixed = FixedWindowState::default();
    let mut sliding = SlidingWindowState::default();
    let (mut admitted, mut exact) = (Vec::new(), 0);
    for r in 0..3_000 {
        let now = r * INTERVAL;
        let at = Timestamp::from_micros(now);
        let busy = usize::try_from((r / 400 + seed) % n).unwrap();
        for (g, node) in mesh.iter_mut().enumerate() {
            let asks = if g == busy {
                2
            } else {
                u64::from(next().is_multiple_of(40))
            };
            for _ in 0..asks {
                let cost = u32::try_from(next() % 2 + 1).unwrap();
                if node.check(at, &key, quota, cost).unwrap().is_allowed() {
                    admitted.push((now, g, u64::from(cost)));
                }
                let one = match quota.algorithm() {
                    ratewarden_core::Algorithm::FixedWindow => fixed.check(at, cost, quota),
                    _ => sliding.check(at, cost, quota),
                };
                if one.is_allowed() {
                    exact += u64::from(cost);
                }
            }
        }
        round(&mut mesh, at, loss, &mut next);
    }
    (admitted, exact)
}

/// Units admitted in each fixed window.
fn per_window(admitted: &[Admitted], quota: &Quota) -> HashMap<u64, u64> {
    let mut windows = HashMap::new();
    for &(at, _, units) in admitted {
        *windows.entry(at / quota.period_micros()).or_default() += units;
    }
    windows
}

/// The sliding window counter of the fleet's admissions just after admission `i`, less the
/// count, exactly (in units × period): above zero, it went over.
fn sliding_over(admitted: &[Admitted], i: usize, quota: &Quota) -> i128 {
    let period = u128::from(quota.period_micros());
    let t = admitted[i].0;
    let window = u128::from(t) / period;
    let (mut current, mut previous) = (0_u128, 0_u128);
    for &(at, _, units) in &admitted[..=i] {
        let w = u128::from(at) / period;
        if w == window {
            current += u128::from(units);
        } else if w + 1 == window {
            previous += u128::from(units);
        }
    }
    let left = period - u128::from(t) % period;
    let counted = i128::try_from(current * period + previous * left).unwrap();
    counted - i128::from(quota.count()) * i128::try_from(period).unwrap()
}

/// The most [`sliding_over`] any admission went.
fn sliding_excess(admitted: &[Admitted], quota: &Quota) -> i128 {
    (0..admitted.len())
        .map(|i| sliding_over(admitted, i, quota))
        .max()
        .unwrap_or(0)
}

fn total(admitted: &[Admitted]) -> u64 {
    admitted.iter().map(|&(_, _, units)| units).sum()
}

/// Escrow never admits more than the count in a fixed window, while the demand moves from
/// gateway to gateway and 5% of datagrams are lost; what it admits is near what one exact
/// limiter admits.
#[test]
fn escrow_keeps_every_fixed_window_within_the_count() {
    let quota: Quota = "100/min fixed-window".parse().unwrap();
    for (n, seed) in [(3, 1), (3, 2), (10, 3)] {
        let (admitted, exact) = trace(n, Mode::Escrow, &quota, 5, seed);
        for (window, units) in per_window(&admitted, &quota) {
            assert!(units <= 100, "{n} gateways: {units} in window {window}");
        }
        let ratio = total(&admitted) as f64 / exact as f64;
        eprintln!("escrow, fixed window, {n} gateways: {ratio:.2} of one exact limiter");
        assert!(
            ratio >= 0.8,
            "{n} gateways: {ratio:.2} of one exact limiter"
        );
    }
}

/// Escrow keeps the fleet's sliding window counter (the whole fleet's admissions, counted
/// as one limiter counts them) within the count at every admission.
#[test]
fn escrow_keeps_the_sliding_window_within_the_count() {
    let quota: Quota = "100/min sliding-window".parse().unwrap();
    for (n, seed) in [(3, 4), (3, 5), (10, 6)] {
        let (admitted, exact) = trace(n, Mode::Escrow, &quota, 5, seed);
        let excess = sliding_excess(&admitted, &quota);
        assert!(excess <= 0, "{n} gateways: over by {excess} unit-µs");
        let ratio = total(&admitted) as f64 / exact as f64;
        eprintln!("escrow, sliding window, {n} gateways: {ratio:.2} of one exact limiter");
        assert!(
            ratio >= 0.8,
            "{n} gateways: {ratio:.2} of one exact limiter"
        );
    }
}

/// Eventual, with every datagram delivered within the round (`D` one round), admits in a
/// window at most the count plus what the other gateways admitted in the round of its last
/// admission: the bound, checked window by window, and counted as a sliding window.
#[test]
fn eventual_windows_go_over_by_at_most_what_peers_admitted_unheard() {
    for text in ["100/min fixed-window", "100/min sliding-window"] {
        let quota: Quota = text.parse().unwrap();
        for (n, seed) in [(3, 7), (10, 8)] {
            let (admitted, exact) = trace(n, Mode::Eventual, &quota, 0, seed);
            let unheard = |t: u64, by: usize| -> u64 {
                admitted
                    .iter()
                    .filter(|&&(at, g, _)| at == t && g != by)
                    .map(|&(_, _, units)| units)
                    .sum()
            };
            let mut worst = 0;
            if text.contains("fixed") {
                for (window, units) in per_window(&admitted, &quota) {
                    let &(t, by, _) = admitted
                        .iter()
                        .rfind(|&&(at, _, _)| at / quota.period_micros() == window)
                        .unwrap();
                    let bound = 100 + unheard(t, by);
                    assert!(units <= bound, "{text}, {n}: {units} > {bound}");
                    worst = worst.max(units.saturating_sub(100));
                }
            } else {
                // Each admission's fleet count, over the count by no more than its round's
                // units admitted elsewhere.
                for (i, &(t, by, _)) in admitted.iter().enumerate() {
                    let over = sliding_over(&admitted, i, &quota);
                    let period = i128::from(quota.period_micros());
                    let allowed = i128::from(unheard(t, by)) * period;
                    assert!(over <= allowed, "{text}, {n}: over by {over} > {allowed}");
                    worst = worst.max(u64::try_from(over.max(0) / period).unwrap());
                }
            }
            let ratio = total(&admitted) as f64 / exact as f64;
            eprintln!("eventual, {text}, {n} gateways: over by {worst} at worst; {ratio:.2}");
            // Nothing is left unused beyond units charged a window late.
            assert!(ratio >= 0.9, "{text}, {n}: {ratio:.2} of one exact limiter");
        }
    }
}

/// A hold takes room in the window and pins the share behind it; a settle counts the
/// actual units in the window, and what was held beyond them is free again.
#[test]
fn a_window_quota_holds_and_settles() {
    let quota: Quota = "10/min fixed-window".parse().unwrap();
    let key = Key::from("k");
    let limit = |cost| Limit::new(key.clone(), quota, cost);
    let mut mesh = nodes(2, Mode::Escrow);
    let hold = Duration::from_secs(30);
    let at = |s: u64| Timestamp::from_micros(s * SECOND);
    // Gateway 0 holds 5 (its whole share); gateway 1 asks for more than its share.
    let first = mesh[0].reserve(at(0), &[limit(5)], hold).unwrap();
    assert!(first.is_allowed());
    let mut next = rng(9);
    let mut admitted = 0;
    for r in 0..100 {
        let now = Timestamp::from_micros(r * INTERVAL);
        let one = mesh[1].reserve(now, &[limit(1)], hold).unwrap();
        if one.is_allowed() {
            admitted += 1;
            mesh[1].settle(now, one.held(), 1);
        }
        round(&mut mesh, now, 0, &mut next);
    }
    // The peer had its own five and none of the share behind the hold.
    assert_eq!(admitted, 5);
    // Settled at 2: three units of room free again, in this window.
    mesh[0].settle(at(10), first.held(), 2);
    let third = mesh[0].reserve(at(10), &[limit(3)], hold).unwrap();
    assert!(third.is_allowed());
    assert!(
        !mesh[0]
            .reserve(at(10), &[limit(1)], hold)
            .unwrap()
            .is_allowed()
    );
    // The next window starts afresh, the hold still taking its room.
    let later = mesh[0].reserve(at(61), &[limit(2)], hold).unwrap();
    assert!(later.is_allowed());
}

/// A gateway that restarts within a window its run before spent: the share its peer takes
/// back comes spent for that window, so the window admits at most the count and the
/// restarted gateway's fresh first share.
#[test]
fn a_restart_within_a_window_adds_no_more_than_the_first_share() {
    for text in ["10/min fixed-window", "10/min sliding-window"] {
        let quota: Quota = text.parse().unwrap();
        let key = Key::from("k");
        let mut mesh = nodes(2, Mode::Escrow);
        let mut next = rng(11);
        let mut admitted = 0;
        let mut t = 0;
        // Only gateway 2 asks: gateway 1 gives it its share, and it spends the count.
        while t < 5 * SECOND {
            admitted += u64::from(
                mesh[1]
                    .check(Timestamp::from_micros(t), &key, &quota, 1)
                    .unwrap()
                    .is_allowed(),
            );
            round(&mut mesh, Timestamp::from_micros(t), 0, &mut next);
            t += INTERVAL;
        }
        let mut config = Config::new(Mode::Escrow);
        config.fanout = 2;
        config.incarnation = 1_000_000;
        mesh[1] = Node::new(2, &[1, 2], config);
        while t < 50 * SECOND {
            for node in &mut mesh {
                admitted += u64::from(
                    node.check(Timestamp::from_micros(t), &key, &quota, 1)
                        .unwrap()
                        .is_allowed(),
                );
            }
            round(&mut mesh, Timestamp::from_micros(t), 0, &mut next);
            t += INTERVAL;
        }
        assert!(admitted <= 15, "{text}: {admitted} in one window of 10");
    }
}
