//! `MeshStore` over real UDP sockets on loopback: gateways find each other, share one quota
//! within their mode's bound, and drop what a stranger sends.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use ratewarden_core::{Key, Quota, Store};
use ratewarden_mesh::{MeshBuilder, MeshStore, Mode};

const SECRET: &[u8] = b"a secret the test's gateways share";

/// `n` free loopback addresses.
fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let sockets: Vec<UdpSocket> = (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    sockets.iter().map(|s| s.local_addr().unwrap()).collect()
}

async fn mesh(n: usize, mode: Mode) -> Vec<MeshStore> {
    let addrs = free_addrs(n);
    let mut stores = Vec::new();
    for (i, &addr) in addrs.iter().enumerate() {
        let peers = addrs
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, &a)| a);
        stores.push(bind(MeshStore::builder(addr).peers(peers).mode(mode)).await);
    }
    stores
}

/// A gateway of the tests' meshes: gossip every 20 ms, sealed under the tests' secret.
async fn bind(builder: MeshBuilder) -> MeshStore {
    builder
        .interval(Duration::from_millis(20))
        .secret(SECRET)
        .unwrap()
        .bind()
        .await
        .unwrap()
}

async fn until_all_live(stores: &[MeshStore]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while stores.iter().any(|s| s.live().len() < stores.len()) {
        assert!(
            Instant::now() < deadline,
            "members never all heard from each other"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Requests sprayed over every gateway for `run`; returns the units admitted.
async fn spray(stores: &[MeshStore], quota: &Quota, run: Duration) -> u64 {
    let key = Key::from("client");
    let start = Instant::now();
    let mut admitted = 0;
    let mut i = 0;
    while start.elapsed() < run {
        if stores[i % stores.len()]
            .check(&key, quota, 1)
            .await
            .unwrap()
            .is_allowed()
        {
            admitted += 1;
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escrow_over_udp_admits_within_the_quota_and_uses_most_of_it() {
    let stores = mesh(4, Mode::Escrow).await;
    until_all_live(&stores).await;
    let quota: Quota = "40/s".parse().unwrap();
    let run = Duration::from_secs(2);
    let admitted = spray(&stores, &quota, run).await;
    println!("escrow over udp: {admitted} admitted");
    // At most the burst and the rate over the run (and the time it took to start).
    let bound = 40 + 40 * 2 + 4;
    assert!(admitted <= bound, "{admitted} admitted, bound {bound}");
    assert!(
        admitted >= 80,
        "{admitted} admitted: escrow left most of the quota unused"
    );
}

/// Gateways holding thousands of keys do each round in steps (`Node::advance_round`), the
/// lock let go between them: checks sprayed from four tasks at once meanwhile stay within
/// the quota and use most of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escrow_over_udp_holding_thousands_of_keys_admits_within_the_quota() {
    let stores = mesh(4, Mode::Escrow).await;
    until_all_live(&stores).await;
    // 2,000 keys on each gateway, that come to rest only after hours.
    let held: Quota = "8/hour burst 8".parse().unwrap();
    for (i, store) in stores.iter().enumerate() {
        for k in 0..2_000 {
            let key = Key::from(format!("held-{i}-{k}"));
            assert!(store.check(&key, &held, 1).await.unwrap().is_allowed());
        }
    }
    let quota: Quota = "40/s".parse().unwrap();
    let run = Duration::from_secs(2);
    let sprays: Vec<_> = stores
        .iter()
        .map(|store| {
            let (store, quota) = (store.clone(), quota);
            tokio::spawn(async move { spray(&[store], &quota, run).await })
        })
        .collect();
    let mut admitted = 0;
    for spray in sprays {
        admitted += spray.await.unwrap();
    }
    println!("escrow over udp, 2,000 keys held a gateway: {admitted} admitted");
    let bound = 40 + 40 * 2 + 4;
    assert!(admitted <= bound, "{admitted} admitted, bound {bound}");
    assert!(
        admitted >= 80,
        "{admitted} admitted: escrow left most of the quota unused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventual_over_udp_stays_within_its_bound() {
    let stores = mesh(4, Mode::Eventual).await;
    until_all_live(&stores).await;
    let quota: Quota = "40/s".parse().unwrap();
    let admitted = spray(&stores, &quota, Duration::from_secs(2)).await;
    println!("eventual over udp: {admitted} admitted");
    // One request every 2 ms; a unit is heard everywhere within a few 20 ms rounds: the
    // requests of 100 ms at most come on top of burst + rate × t.
    let bound = 40 + 40 * 2 + 4 + 50;
    assert!(admitted <= bound, "{admitted} admitted, bound {bound}");
    assert!(admitted >= 100, "{admitted} admitted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_on_the_network_is_dropped_and_counted() {
    let stores = mesh(2, Mode::Eventual).await;
    let target = stores[0].local_addr();
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    for _ in 0..10 {
        stranger
            .send_to(
                b"RWM1 not sealed, not a datagram at all....................",
                target,
            )
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while stores[0].dropped().forged < 10 {
        assert!(Instant::now() < deadline, "{:?}", stores[0].dropped());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let quota: Quota = "10/s".parse().unwrap();
    assert!(
        stores[0]
            .check(&Key::from("k"), &quota, 10)
            .await
            .unwrap()
            .is_allowed()
    );
}

#[tokio::test]
async fn a_mesh_without_a_secret_is_refused() {
    let error = MeshStore::builder("127.0.0.1:0".parse().unwrap())
        .bind()
        .await
        .unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
}

#[tokio::test]
async fn an_unspecified_address_is_refused() {
    let refused = MeshStore::builder("0.0.0.0:0".parse().unwrap())
        .peers(free_addrs(1))
        .secret(SECRET)
        .unwrap()
        .bind()
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::InvalidInput);
    assert!(refused.to_string().contains("unspecified"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_joins_a_running_mesh_and_shares_its_quota() {
    let mut stores = mesh(2, Mode::Escrow).await;
    until_all_live(&stores).await;
    let seed = stores[0].local_addr();
    stores.push(bind(MeshStore::builder(free_addrs(1)[0]).join([seed])).await);
    // Every member learns of it (the founder it did not name by SWIM), and it of them.
    until_all_live(&stores).await;
    for store in &stores {
        assert_eq!(store.members().len(), 3);
    }
    // The three share the quota: never over it, and the joiner, holding nothing at first,
    // is given its part.
    let quota: Quota = "40/s".parse().unwrap();
    let key = Key::from("client");
    let start = Instant::now();
    let (mut admitted, mut by_joiner) = (0_u64, 0_u64);
    let mut i = 0;
    while start.elapsed() < Duration::from_secs(2) {
        if stores[i % 3]
            .check(&key, &quota, 1)
            .await
            .unwrap()
            .is_allowed()
        {
            admitted += 1;
            by_joiner += u64::from(i % 3 == 2);
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let bound = 40 + 40 * 2 + 4;
    assert!(admitted <= bound, "{admitted} admitted, bound {bound}");
    assert!(admitted >= 80, "{admitted} admitted");
    assert!(by_joiner >= 10, "the joiner admitted {by_joiner}");
    // It leaves: it admits nothing more, and the founders take it as gone at once, before
    // their silence window.
    stores[2].leave().await;
    assert!(
        !stores[2].check(&key, &quota, 1).await.unwrap().is_allowed(),
        "a gateway admitted after it left"
    );
    let deadline = Instant::now() + Duration::from_secs(2);
    while stores[..2].iter().any(|s| s.live().len() != 2) {
        assert!(
            Instant::now() < deadline,
            "a gateway that left is still live"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_over_ipv6_is_refused_with_a_reason() {
    let error = MeshStore::builder("[::1]:0".parse().unwrap())
        .join(["[::1]:7946".parse().unwrap()])
        .secret(SECRET)
        .unwrap()
        .bind()
        .await
        .unwrap_err();
    assert!(error.to_string().contains("IPv4"), "{error}");
}
