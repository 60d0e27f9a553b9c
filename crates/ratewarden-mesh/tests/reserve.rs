//! Reservations on the mesh: held units take room and are charged at settle; escrow gives
//! away no share that backs a hold, so reserved units settled at or below their estimate
//! never take the fleet over the quota, while shares move and datagrams are lost; eventual
//! announces what is settled.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use ratewarden_core::{Key, Limit, Quota, Reservation, Store, StoreErrorKind, Timestamp};
use ratewarden_mesh::{Config, Mode, Node};

const SECOND: u64 = 1_000_000;

fn nodes(n: u64, mode: Mode) -> Vec<Node> {
    let ids: Vec<u64> = (1..=n).collect();
    ids.iter()
        .map(|&id| Node::new(id, &ids, Config::new(mode)))
        .collect()
}

/// One gossip round at `now`: every datagram delivered, but those `lose` picks.
fn round(nodes: &mut [Node], now: Timestamp, mut lose: impl FnMut() -> bool) {
    let out: Vec<_> = nodes.iter_mut().flat_map(|node| node.tick(now)).collect();
    for datagram in out {
        if !lose() {
            let to = usize::try_from(datagram.to - 1).unwrap();
            nodes[to].receive(now, &datagram.bytes).unwrap();
        }
    }
}

/// The largest excess, over every interval, of `charges` (µs, units) above what `quota`
/// admits in it: `burst + rate × length`.
fn worst_excess(charges: &mut [(u64, u64)], quota: &Quota) -> f64 {
    charges.sort_unstable();
    let rate = f64::from(quota.count()) / quota.period().as_secs_f64();
    let mut worst = f64::MIN;
    for i in 0..charges.len() {
        let mut sum = 0;
        for &(at, units) in &charges[i..] {
            sum += units;
            let length = (at - charges[i].0) as f64 / SECOND as f64;
            let excess = sum as f64 - f64::from(quota.burst()) - rate * length;
            worst = worst.max(excess);
        }
    }
    worst
}

/// A gateway holding its whole share, and asking for nothing more, keeps the share while
/// a peer asks for more than the quota: the peer is given no share behind the hold, so the
/// two never admit more than the quota together.
#[test]
fn escrow_gives_away_no_share_that_backs_a_hold() {
    let quota: Quota = "100/h".parse().unwrap();
    let key = Key::from("k");
    let limit = |cost| Limit::new(key.clone(), quota, cost);
    let mut mesh = nodes(2, Mode::Escrow);
    let hold = Duration::from_secs(600);
    let first = mesh[0]
        .reserve(Timestamp::from_micros(0), &[limit(50)], hold)
        .unwrap();
    assert!(first.is_allowed());
    let mut admitted = 50;
    // A minute of quiet, then a minute of the other gateway asking for ten units a round.
    for r in 0..1_200 {
        let now = Timestamp::from_micros(r * SECOND / 10);
        for _ in 0..if r < 600 { 0 } else { 10 } {
            let one = mesh[1].reserve(now, &[limit(1)], hold).unwrap();
            if one.is_allowed() {
                admitted += 1;
                mesh[1].settle(now, one.held(), 1);
            }
        }
        round(&mut mesh, now, || false);
    }
    mesh[0].settle(Timestamp::from_micros(120 * SECOND), first.held(), 50);
    // 100 an hour: the burst, and 3.3 units in two minutes.
    assert!(admitted <= 103, "{admitted} admitted in two minutes");
    // What the hold did not need was there for the peer.
    assert!(
        admitted >= 95,
        "only {admitted} admitted: the rest was left unused"
    );
}

/// Units charged (µs when held, units) when `n` escrow gateways reserve and settle for two
/// minutes, with `abandoned` of every 100 reservations never settled (their holds lapse):
/// each round the busy gateway, which changes every 20 s, asks for four requests of 1-3
/// units, the others for one now and then; most settle all they held, some less, 0.1-1.5 s
/// later. 5% of datagrams are lost. One gateway (`n` = 1) is one exact limiter.
fn reserved_trace(n: u64, quota: &Quota, abandoned: u64) -> Vec<(u64, u64)> {
    let key = Key::from("k");
    let mut mesh = nodes(n, Mode::Escrow);
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let interval = SECOND / 10;
    let mut outstanding: Vec<(u64, usize, Reservation, u32)> = Vec::new();
    let mut charges = Vec::new();
    for r in 0..1_200 {
        let now = r * interval;
        let at = Timestamp::from_micros(now);
        let busy = usize::try_from(r / 200 % 3).unwrap();
        for g in 0..3 {
            let asks = if g == busy {
                4
            } else {
                u64::from(next() % 8 == 0)
            };
            for _ in 0..asks {
                let estimate = u32::try_from(next() % 3 + 1).unwrap();
                let limit = Limit::new(key.clone(), *quota, estimate);
                let gateway = g % mesh.len();
                let node = &mut mesh[gateway];
                let reservation = node.reserve(at, &[limit], Duration::from_secs(2)).unwrap();
                if reservation.is_allowed() {
                    let actual = match next() % 4 {
                        0 => u32::try_from(next() % u64::from(estimate)).unwrap(),
                        _ => estimate,
                    };
                    let done = now + (next() % 15 + 1) * interval;
                    let settles = next() % 100 >= abandoned;
                    charges.push((now, if settles { u64::from(actual) } else { 0 }));
                    if settles {
                        outstanding.push((done, gateway, reservation, actual));
                    }
                }
            }
        }
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut outstanding)
            .into_iter()
            .partition(|(done, ..)| *done <= now);
        outstanding = later;
        for (_, g, reservation, actual) in due {
            mesh[g].settle(at, reservation.held(), actual);
        }
        round(&mut mesh, at, || next() % 20 == 0);
    }
    charges
}

/// Three escrow gateways reserve and settle (at or below the estimate, or never, letting
/// holds lapse) while the demand moves between them and datagrams are lost: the units
/// charged, counted when they were held, stay within the quota over every interval, and
/// the fleet charges most of what one exact limiter charges for the same requests.
#[test]
fn escrow_reservations_never_take_the_fleet_over_the_quota() {
    // 10 units of burst a gateway asking (a hold takes room for its request's time: a
    // share of a few units holds few requests at once).
    let quota: Quota = "10/s burst 30".parse().unwrap();
    for abandoned in [0, 2] {
        let exact: u64 = reserved_trace(1, &quota, abandoned)
            .iter()
            .map(|c| c.1)
            .sum();
        let mut charges = reserved_trace(3, &quota, abandoned);
        let used: u64 = charges.iter().map(|c| c.1).sum();
        let excess = worst_excess(&mut charges, &quota);
        assert!(
            excess <= 0.0,
            "over the quota by {excess} units in some interval"
        );
        assert!(
            used * 100 >= exact * 85,
            "{used} units charged, one exact limiter {exact}"
        );
    }
}

/// A hold's units take room until it is settled or lapses; what it held beyond the actual
/// units is free at once, and a settle after the hold lapsed charges all the same.
#[test]
fn holds_take_room_until_settled_or_lapsed_in_both_modes() {
    for mode in [Mode::Escrow, Mode::Eventual] {
        let quota: Quota = "100/h".parse().unwrap();
        let limit = |cost| Limit::new(Key::from("k"), quota, cost);
        let mut node = Node::new(1, &[1], Config::new(mode));
        let at = |s: u64| Timestamp::from_micros(s * SECOND);
        let hold = Duration::from_secs(10);
        let first = node.reserve(at(0), &[limit(60)], hold).unwrap();
        assert!(first.is_allowed(), "{mode:?}");
        assert!(
            !node
                .reserve(at(0), &[limit(50)], hold)
                .unwrap()
                .is_allowed()
        );
        node.settle(at(1), first.held(), 20);
        // 20 charged: 80 left.
        let second = node.reserve(at(1), &[limit(80)], hold).unwrap();
        assert!(second.is_allowed(), "{mode:?}");
        assert!(!node.reserve(at(1), &[limit(1)], hold).unwrap().is_allowed());
        // The hold lapses at 11 s: its 80 are free again.
        let third = node.reserve(at(12), &[limit(80)], hold).unwrap();
        assert!(third.is_allowed(), "{mode:?}");
        // The lapsed reservation's settle charges its 30 all the same: what the state
        // cannot take beside the live hold is owed, so nothing more fits.
        node.settle(at(12), second.held(), 30);
        node.settle(at(12), third.held(), 0);
        assert!(
            !node
                .reserve(at(12), &[limit(51)], hold)
                .unwrap()
                .is_allowed()
        );
        assert!(
            node.reserve(at(12), &[limit(50)], hold)
                .unwrap()
                .is_allowed()
        );
    }
}

/// A request held on a reserved limit counts nothing on the key's checked state, and the
/// other way round.
#[test]
fn reserved_and_checked_requests_of_a_key_have_states_of_their_own() {
    for mode in [Mode::Escrow, Mode::Eventual] {
        let quota: Quota = "10/h".parse().unwrap();
        let key = Key::from("k");
        let mut node = Node::new(1, &[1], Config::new(mode));
        let now = Timestamp::from_micros(0);
        for _ in 0..10 {
            assert!(node.check(now, &key, &quota, 1).unwrap().is_allowed());
        }
        assert!(!node.check(now, &key, &quota, 1).unwrap().is_allowed());
        let limit = Limit::new(key.clone(), quota, 10);
        let held = node.reserve(now, &[limit], Duration::from_secs(9)).unwrap();
        assert!(held.is_allowed(), "{mode:?}");
        // A probe in a reservation is decided on the checked state, which is empty.
        let probe = Limit::probe(key.clone(), quota, 1);
        let other = Limit::new(Key::from("other"), quota, 1);
        let both = node
            .reserve(now, &[other, probe], Duration::from_secs(9))
            .unwrap();
        assert!(!both.is_allowed(), "{mode:?}");
        assert!(both.held().is_empty());
    }
}

/// Eventual: what a gateway settles is gossiped as admitted, so a peer charges it; what was
/// held beyond it is never charged anywhere.
#[test]
fn eventual_settles_reach_the_peers() {
    let quota: Quota = "10/h".parse().unwrap();
    let limit = |cost| Limit::new(Key::from("k"), quota, cost);
    let mut mesh = nodes(2, Mode::Eventual);
    let hold = Duration::from_secs(60);
    let at = |r: u64| Timestamp::from_micros(r * SECOND / 10);
    let reservation = mesh[0].reserve(at(0), &[limit(10)], hold).unwrap();
    assert!(reservation.is_allowed());
    mesh[0].settle(at(0), reservation.held(), 7);
    for r in 1..10 {
        round(&mut mesh, at(r), || false);
    }
    assert!(
        !mesh[1]
            .reserve(at(10), &[limit(4)], hold)
            .unwrap()
            .is_allowed()
    );
    assert!(
        mesh[1]
            .reserve(at(10), &[limit(3)], hold)
            .unwrap()
            .is_allowed()
    );
}

/// A settle above the estimate is owed, and repaid before anything new is admitted; a
/// refund forgives what is owed first.
#[test]
fn an_overdraft_is_owed_and_a_refund_forgives_it() {
    let quota: Quota = "10/s".parse().unwrap();
    let limit = |cost| Limit::new(Key::from("k"), quota, cost);
    let mut node = Node::new(1, &[1], Config::new(Mode::Escrow));
    let at = |ms: u64| Timestamp::from_micros(ms * 1_000);
    let hold = Duration::from_secs(9);
    let first = node.reserve(at(0), &[limit(5)], hold).unwrap();
    node.settle(at(0), first.held(), 15); // 5 over the burst of 10
    assert!(!node.reserve(at(0), &[limit(1)], hold).unwrap().is_allowed());
    // 500 ms refill 5 units, all owed.
    assert!(
        !node
            .reserve(at(500), &[limit(1)], hold)
            .unwrap()
            .is_allowed()
    );
    assert!(
        node.reserve(at(600), &[limit(1)], hold)
            .unwrap()
            .is_allowed()
    );
    node.refund(at(600), &Key::from("k"), &quota, 9);
    assert!(
        node.reserve(at(600), &[limit(9)], hold)
            .unwrap()
            .is_allowed()
    );
}

/// `MeshStore` reserves, settles and refunds through the `Store` trait, and answers
/// the window algorithms' reservations as unsupported.
#[tokio::test]
async fn the_store_reserves_settles_and_refunds() {
    let store = ratewarden_mesh::MeshStore::builder("127.0.0.1:0".parse().unwrap())
        .secret(b"a secret the test's gateways share")
        .unwrap()
        .bind()
        .await
        .unwrap();
    let quota: Quota = "100/h".parse().unwrap();
    let key = Key::from("k");
    let limit = |cost| Limit::new(key.clone(), quota, cost);
    let hold = Duration::from_secs(30);
    let first = store.reserve(&[limit(60)], hold).await.unwrap();
    assert!(first.is_allowed());
    store.renew(first.held(), hold).await.unwrap();
    assert!(
        !store
            .reserve(&[limit(50)], hold)
            .await
            .unwrap()
            .is_allowed()
    );
    assert!(store.settle_ready(first, 40).is_ok());
    assert!(
        !store
            .reserve(&[limit(61)], hold)
            .await
            .unwrap()
            .is_allowed()
    );
    store.refund(&key, &quota, 10).await.unwrap();
    let second = store.reserve(&[limit(70)], hold).await.unwrap();
    assert!(second.is_allowed());
    store.release(second).await.unwrap();
    let window = "100/h sliding-log".parse::<Quota>().unwrap();
    let error = store
        .reserve(&[Limit::new(key.clone(), window, 1)], hold)
        .await
        .unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Unsupported);
}

/// A settle that ends a key's last hold ends its round, as on one exact limiter: a ticket
/// settled again, or renewed late, finds the holds made since apart from it, and neither
/// frees nor keeps them.
#[test]
fn a_settle_that_ends_the_last_hold_ends_its_round() {
    let quota: Quota = "100/h".parse().unwrap();
    let key = Key::from("k");
    let limit = |cost| Limit::new(key.clone(), quota, cost);
    let hold = Duration::from_secs(600);
    let at = |s: u64| Timestamp::from_micros(s * SECOND);
    for mode in [Mode::Escrow, Mode::Eventual] {
        let mut node = Node::new(1, &[1], Config::new(mode));
        let a = node.reserve(at(0), &[limit(60)], hold).unwrap();
        node.settle(at(0), a.held(), 60);
        let b = node.reserve(at(0), &[limit(40)], hold).unwrap();
        assert!(b.is_allowed());
        // A's ticket again: B's hold stays, so another 40 does not fit.
        node.settle(at(0), a.held(), 0);
        let c = node.reserve(at(0), &[limit(40)], hold).unwrap();
        assert!(
            !c.is_allowed(),
            "{mode:?}: a stale settle freed a live hold"
        );
        node.settle(at(0), b.held(), 0);
        // A late renewal of a settled hold keeps no hold made since.
        let d = node
            .reserve(at(1), &[limit(30)], Duration::from_secs(10))
            .unwrap();
        assert!(d.is_allowed());
        node.renew(at(1), a.held(), Duration::from_secs(3_600));
        let e = node.reserve(at(12), &[limit(40)], hold).unwrap();
        assert!(
            e.is_allowed(),
            "{mode:?}: a stale renewal kept a lapsed hold"
        );
    }
}
