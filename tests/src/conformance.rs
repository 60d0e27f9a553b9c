//! The suite any [`Store`] runs: the memory store and Redis in its tests today, any store
//! tomorrow (`store_conforms(&store).await`).
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)] // a failed unwrap is a failed test

use std::time::Duration;

use ratewarden_core::{Algorithm, Decision, Key, Limit, Quota, Store, StoreErrorKind};

/// What every store must decide, the same way: quotas on one key apart, costs, a cost of 0,
/// denials with a retry time, a cost no retry can meet, scopes, resets, and several limits
/// decided together or not at all. Quotas refill slowly (per hour), so real time never
/// changes a decision; keys are named `conformance-*`, `two-quotas-*` and `several-*`.
///
/// # Panics
///
/// Where the store decides otherwise, or fails.
pub async fn store_conforms<S: Store>(store: &S) {
    several_limits_conform(store).await;
    // Two quotas on one key never share state (they did, per algorithm): a login limit and a
    // read limit of one user, both fixed windows, and a POST and a GET limit, both GCRA.
    for (strict, loose) in [
        ("5/h fixed-window", "100/min fixed-window"),
        ("2/h", "100/h"),
        ("3/h token-bucket", "50/h token-bucket"),
        ("2/h sliding-log", "20/h sliding-log"),
        ("4/h sliding-window", "40/h sliding-window"),
    ] {
        let (strict, loose): (Quota, Quota) = (strict.parse().unwrap(), loose.parse().unwrap());
        let key = Key::from(format!("two-quotas-{strict}"));
        let (mut a, mut b) = (0, 0);
        for _ in 0..20 {
            a += u32::from(store.check(&key, &strict, 1).await.unwrap().is_allowed());
            b += u32::from(store.check(&key, &loose, 1).await.unwrap().is_allowed());
        }
        assert_eq!(
            (a, b),
            (strict.count(), 20),
            "{strict} and {loose} on one key"
        );
        store.reset(&key, &strict).await.unwrap();
        assert_eq!(
            store.peek(&key, &loose).await.unwrap().info().remaining(),
            u64::from(loose.count()) - 20,
            "resetting {strict} leaves {loose} alone"
        );
        store.reset(&key, &loose).await.unwrap();
    }

    for algorithm in Algorithm::ALL {
        let quota = Quota::per_hour(5)
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        let key = Key::from(format!("conformance-{algorithm}"));
        let other = Key::from(7u64);

        // A fresh key: a peek admits, counts nothing.
        let peek = store.peek(&key, &quota).await.unwrap();
        assert!(peek.is_allowed(), "{algorithm}");
        assert_eq!(peek.info().remaining(), 5, "{algorithm}");
        assert_eq!(peek.info().limit(), 5, "{algorithm}");

        // Costs count; a cost of 0 counts nothing.
        let d = store.check(&key, &quota, 2).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.info().remaining(), 3, "{algorithm}");
        let d = store.check(&key, &quota, 0).await.unwrap();
        assert_eq!(d.info().remaining(), 3, "{algorithm}");
        for remaining in [2, 1, 0] {
            let d = store.check(&key, &quota, 1).await.unwrap();
            assert!(d.is_allowed(), "{algorithm}");
            assert_eq!(d.info().remaining(), remaining, "{algorithm}");
            assert_eq!(d.info().retry_after(), Duration::ZERO);
        }
        // The same key in another scope (another named limit) is another bucket, and exhausting
        // the key leaves it alone.
        let scoped = key.clone().scoped(Key::scope_of("other-limit"));
        assert_eq!(
            store
                .peek(&scoped, &quota)
                .await
                .unwrap()
                .info()
                .remaining(),
            5,
            "{algorithm}"
        );
        // Exhausted: denied with a retry time, and a peek agrees.
        let denied = store.check(&key, &quota, 1).await.unwrap();
        assert!(matches!(denied, Decision::Denied(_)), "{algorithm}");
        assert_eq!(denied.info().remaining(), 0);
        assert!(denied.info().retry_after() > Duration::ZERO, "{algorithm}");
        assert!(
            !store.peek(&key, &quota).await.unwrap().is_allowed(),
            "{algorithm}"
        );
        // More than the quota can ever admit is its own outcome.
        let too_big = store.check(&other, &quota, 6).await.unwrap();
        assert!(
            matches!(too_big, Decision::InsufficientCapacity(_)),
            "{algorithm}"
        );
        assert_eq!(too_big.info().retry_after(), Duration::ZERO);
        // Other keys are untouched; a reset gives the key a fresh quota.
        assert_eq!(
            store.peek(&other, &quota).await.unwrap().info().remaining(),
            5
        );
        store.reset(&key, &quota).await.unwrap();
        assert_eq!(
            store
                .check(&key, &quota, 1)
                .await
                .unwrap()
                .info()
                .remaining(),
            4
        );
        store.reset(&key, &quota).await.unwrap();
        assert!(store.check(&scoped, &quota, 5).await.unwrap().is_allowed());
        assert!(!store.check(&scoped, &quota, 1).await.unwrap().is_allowed());
        assert_eq!(
            store.peek(&key, &quota).await.unwrap().info().remaining(),
            5,
            "{algorithm}: a scoped key's use shows up unscoped"
        );
        store.reset(&scoped, &quota).await.unwrap();
    }
}

/// A probe must admit its cost and never counts: a request with a probe of a spent state
/// (a ban) is denied and charges nothing; with a probe of a fresh one, it is admitted and the
/// probe's state stays fresh. `a` has 97 left under `loose`.
async fn probes_conform<S: Store>(store: &S, a: &Key, loose: &Quota) {
    let ban = Key::from("several-ban");
    let one: Quota = "1/h sliding-log".parse().unwrap();
    let left =
        async |key: &Key, quota: &Quota| store.peek(key, quota).await.unwrap().info().remaining();
    let request = [
        Limit::new(a.clone(), *loose, 1),
        Limit::probe(ban.clone(), one, 1),
    ];
    assert!(store.check_all(&request).await.unwrap().is_allowed());
    assert_eq!((left(a, loose).await, left(&ban, &one).await), (96, 1));
    store.check(&ban, &one, 1).await.unwrap();
    let banned = store.check_all(&request).await.unwrap();
    assert_eq!(banned.binding().map(|(i, _)| i), Some(1));
    assert_eq!(
        left(a, loose).await,
        96,
        "a request its probe denied was counted"
    );
    store.reset(&ban, &one).await.unwrap();
}

/// Several limits on one request: all admit and all count, or none counts (a store that
/// decides one limit at a time answers `Unsupported`, counting nothing); no limits admit; one
/// limit is a check; more than 16 are refused, counting nothing.
async fn several_limits_conform<S: Store>(store: &S) {
    let (a, b) = (Key::from("several-a"), Key::from("several-b"));
    let (loose, strict): (Quota, Quota) = ("100/h".parse().unwrap(), "1/h".parse().unwrap());
    let left =
        async |key: &Key, quota: &Quota| store.peek(key, quota).await.unwrap().info().remaining();
    assert!(store.check_all(&[]).await.unwrap().is_allowed());
    let one = store
        .check_all(&[Limit::new(a.clone(), loose, 2)])
        .await
        .unwrap();
    assert_eq!(one.as_slice().len(), 1);
    assert_eq!(left(&a, &loose).await, 98);
    let too_many: Vec<Limit> = (0..17)
        .map(|i| Limit::new(Key::from(format!("several-{i}")), loose, 1))
        .collect();
    let refused = store.check_all(&too_many).await.unwrap_err();
    assert_eq!(refused.kind(), StoreErrorKind::InvalidInput);
    assert!(!refused.kind().is_backend_failure());
    assert_eq!(left(&Key::from("several-0"), &loose).await, 100);
    // b is spent under the strict quota: the pair is denied, and a is not charged.
    store.check(&b, &strict, 1).await.unwrap();
    let pair = [
        Limit::new(a.clone(), loose, 1),
        Limit::new(b.clone(), strict, 1),
    ];
    match store.check_all(&pair).await {
        Ok(decisions) => {
            assert!(!decisions.is_allowed());
            assert_eq!(decisions.binding().map(|(i, _)| i), Some(1));
            assert_eq!(
                left(&a, &loose).await,
                98,
                "a denied pair charged its other limit"
            );
            store.reset(&b, &strict).await.unwrap();
            let decisions = store.check_all(&pair).await.unwrap();
            assert!(decisions.is_allowed());
            assert_eq!((left(&a, &loose).await, left(&b, &strict).await), (97, 0));
            probes_conform(store, &a, &loose).await;
        }
        Err(error) => {
            assert_eq!(error.kind(), StoreErrorKind::Unsupported, "{error}");
            assert!(!error.kind().is_backend_failure());
            assert_eq!(left(&a, &loose).await, 98, "an unsupported check charged");
        }
    }
    store.reset(&a, &loose).await.unwrap();
    store.reset(&b, &strict).await.unwrap();
}
