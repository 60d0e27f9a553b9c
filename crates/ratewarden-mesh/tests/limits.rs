//! Several limits decided together: every limit admits its cost and all are counted, or none
//! is counted; a probe must admit and is never counted.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::HashMap;

use proptest::prelude::*;
use ratewarden_core::{Key, Limit, Quota, Store, StoreErrorKind, Timestamp};
use ratewarden_mesh::{Config, MeshStore, Mode, Node};

fn quotas() -> [Quota; 3] {
    [
        "5/s".parse().unwrap(),
        "3/min".parse().unwrap(),
        "10/h".parse().unwrap(),
    ]
}

/// One limit: a key of three, a quota of three, a cost of 0 to 3, counted or a probe.
fn limit() -> impl Strategy<Value = Limit> {
    (0_u8..3, 0_usize..3, 0_u32..4, any::<bool>()).prop_map(|(key, quota, cost, counted)| {
        let (key, quota) = (Key::from(u64::from(key)), quotas()[quota]);
        if counted {
            Limit::new(key, quota, cost)
        } else {
            Limit::probe(key, quota, cost)
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// On one gateway with the clock stopped, each state is a burst of units: a request is
    /// admitted exactly when each state has room for what it asks of it (counted costs
    /// summed, a probe's alone), and only then is anything taken.
    #[test]
    fn several_limits_are_counted_all_or_none(
        eventual in any::<bool>(),
        requests in prop::collection::vec(prop::collection::vec(limit(), 1..4), 1..60),
    ) {
        let mode = if eventual { Mode::Eventual } else { Mode::Escrow };
        let mut node = Node::new(1, &[1], Config::new(mode));
        let now = Timestamp::from_micros(1_000_000);
        let mut left: HashMap<(Key, Quota), u32> = HashMap::new();
        for limits in requests {
            let mut asked: HashMap<(Key, Quota), (u32, u32)> = HashMap::new();
            for l in &limits {
                let e = asked.entry((l.key().clone(), *l.quota())).or_default();
                if l.is_counted() {
                    e.0 += l.cost();
                } else {
                    e.1 = e.1.max(l.cost());
                }
            }
            let fits = asked.iter().all(|(state, &(counted, probe))| {
                let room = *left.get(state).unwrap_or(&state.1.burst());
                counted <= room && probe <= room
            });
            let decisions = node.check_all(now, &limits).unwrap();
            prop_assert_eq!(decisions.is_allowed(), fits, "{:?}", limits);
            if fits {
                for (state, (counted, _)) in asked {
                    let room = left.entry(state.clone()).or_insert(state.1.burst());
                    *room -= counted;
                }
            }
        }
    }
}

/// Two escrow gateways, each request limited by its user and by the tenant all users share:
/// the tenant's quota holds across both, and a user's units are never spent by a request
/// its tenant refused.
#[test]
fn several_limits_across_escrow_gateways_stay_within_each_quota() {
    let (user_quota, tenant_quota): (Quota, Quota) =
        ("50/h".parse().unwrap(), "20/h".parse().unwrap());
    let tenant = Key::from("acme");
    let mut nodes = [
        Node::new(1, &[1, 2], Config::new(Mode::Escrow)),
        Node::new(2, &[1, 2], Config::new(Mode::Escrow)),
    ];
    let mut admitted = 0;
    for round in 0..200_u64 {
        let now = Timestamp::from_micros(round * 10_000);
        for (i, node) in nodes.iter_mut().enumerate() {
            let user = Key::from(format!("user-{i}"));
            let limits = [
                Limit::new(user, user_quota, 1),
                Limit::new(tenant.clone(), tenant_quota, 1),
            ];
            admitted += u32::from(node.check_all(now, &limits).unwrap().is_allowed());
        }
        let out: Vec<_> = nodes.iter_mut().flat_map(|n| n.tick(now)).collect();
        for o in out {
            let to = usize::try_from(o.to - 1).unwrap();
            nodes[to].receive(now, &o.bytes).unwrap();
        }
    }
    // 2 s of a 20/h quota: the burst, and less than one unit of refill.
    assert!(admitted <= 20, "{admitted} admitted");
    assert!(
        admitted >= 15,
        "{admitted} admitted: escrow left the tenant's quota unused"
    );
}

#[tokio::test]
async fn the_store_refuses_too_many_limits_and_the_window_algorithms() {
    let store = MeshStore::builder("127.0.0.1:0".parse().unwrap())
        .secret(b"a secret the test's gateways share")
        .unwrap()
        .bind()
        .await
        .unwrap();
    let quota: Quota = "10/s".parse().unwrap();
    let many: Vec<Limit> = (0..17_u64)
        .map(|k| Limit::new(Key::from(k), quota, 1))
        .collect();
    let error = store.check_all(&many).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::InvalidInput);
    let window: Quota = "10/s sliding-log".parse().unwrap();
    let mixed = [
        Limit::new(Key::from("a"), quota, 1),
        Limit::new(Key::from("a"), window, 1),
    ];
    let error = store.check_all(&mixed).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Unsupported);
    // Nothing was counted by the refused call.
    let two = [
        Limit::new(Key::from("a"), quota, 5),
        Limit::new(Key::from("b"), quota, 10),
    ];
    assert!(store.check_all(&two).await.unwrap().is_allowed());
    assert!(!store.check_all(&two).await.unwrap().is_allowed());
    assert!(
        store
            .check(&Key::from("a"), &quota, 5)
            .await
            .unwrap()
            .is_allowed()
    );
}
