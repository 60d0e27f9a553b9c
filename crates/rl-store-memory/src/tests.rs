use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rl_core::{Algorithm, Decision, Key, ManualClock, Quota, Store, Timestamp};

use crate::MemoryStore;

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::SlidingLog,
];

fn frozen_store(max_keys: usize) -> (MemoryStore<ManualClock>, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_micros(1_000_000_000));
    let store = MemoryStore::builder()
        .max_keys(NonZeroUsize::new(max_keys).unwrap())
        .clock(clock.clone())
        .build();
    (store, clock)
}

#[test]
fn two_threads_of_32_tasks_on_one_key_admit_exactly_the_burst() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    for algorithm in ALGORITHMS {
        let (store, _clock) = frozen_store(1_000);
        let quota = Quota::per_minute(1_000)
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        let admitted = Arc::new(AtomicU64::new(0));
        runtime.block_on(async {
            let tasks: Vec<_> = (0..64)
                .map(|_| {
                    let (store, admitted) = (store.clone(), Arc::clone(&admitted));
                    tokio::spawn(async move {
                        for _ in 0..100 {
                            let decision = store.check(&Key::from("hot"), &quota, 1).await.unwrap();
                            if decision.is_allowed() {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                            tokio::task::yield_now().await;
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
        });
        assert_eq!(admitted.load(Ordering::Relaxed), 1_000, "{algorithm}");
    }
}

#[test]
fn racing_first_requests_of_a_new_key_leave_one_entry() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let (store, _clock) = frozen_store(10_000);
    let quota = Quota::per_minute(100).unwrap();
    runtime.block_on(async {
        for round in 0..200u64 {
            let barrier = Arc::new(tokio::sync::Barrier::new(32));
            let tasks: Vec<_> = (0..32)
                .map(|_| {
                    let (store, barrier) = (store.clone(), Arc::clone(&barrier));
                    tokio::spawn(async move {
                        barrier.wait().await;
                        store.check(&Key::from(round), &quota, 1).await.unwrap()
                    })
                })
                .collect();
            let mut admitted = 0;
            for task in tasks {
                admitted += u32::from(task.await.unwrap().is_allowed());
            }
            assert_eq!(admitted, 32);
            assert_eq!(store.len(), usize::try_from(round).unwrap() + 1);
        }
    });
}

#[test]
fn a_flood_of_new_keys_is_bounded_and_never_frees_a_throttled_key() {
    // 1,000,000 distinct keys against max_keys = 100,000, while the clock moves 1 ms every 150
    // keys: a flood key is forgettable 1 s (150,000 keys) after its request, so the store fills.
    let (store, clock) = frozen_store(100_000);
    let flood = Quota::per_second(1).unwrap();
    let strict = Quota::per_hour(1).unwrap();
    let victim = Key::from("throttled");
    assert!(store.check_sync(&victim, &strict, 1).is_allowed());
    assert!(!store.check_sync(&victim, &strict, 1).is_allowed());
    let mut max_len = 0;
    let mut flood_admitted = 0u32;
    for i in 0..1_000_000u64 {
        if i % 150 == 0 {
            clock.advance(Duration::from_millis(1));
        }
        flood_admitted += u32::from(store.check_sync(&Key::from(i), &flood, 1).is_allowed());
        max_len = max_len.max(store.len());
        if i % 10_000 == 0 {
            assert!(
                !store.check_sync(&victim, &strict, 1).is_allowed(),
                "at key {i}"
            );
        }
    }
    assert_eq!(max_len, 100_000, "the bound was not reached, or exceeded");
    // New keys were denied while the store was full, and admitted again as keys aged out.
    assert!(
        (600_000..1_000_000).contains(&flood_admitted),
        "{flood_admitted}"
    );
    assert!(!store.check_sync(&victim, &strict, 1).is_allowed());
}

#[test]
fn a_full_store_denies_new_keys_until_one_can_be_forgotten() {
    let (store, clock) = frozen_store(100);
    let quota = Quota::per_second(1).unwrap();
    for i in 0..100u64 {
        assert!(store.check_sync(&Key::from(i), &quota, 1).is_allowed());
    }
    clock.advance(Duration::from_millis(400));
    let Decision::Denied(info) = store.check_sync(&Key::from("newcomer"), &quota, 1) else {
        panic!("a new key was admitted into a full store")
    };
    assert_eq!(info.remaining(), 0);
    assert_eq!(info.retry_after(), Duration::from_millis(600));
    // Known keys are decided as usual.
    assert!(!store.check_sync(&Key::from(5u64), &quota, 1).is_allowed());
    assert_eq!(store.len(), 100);
    clock.advance(info.retry_after());
    assert!(
        store
            .check_sync(&Key::from("newcomer"), &quota, 1)
            .is_allowed()
    );
    assert!(store.len() <= 100);
}

#[tokio::test]
async fn peek_does_not_consume_or_create_and_reset_forgets() {
    let (store, _clock) = frozen_store(10);
    let quota = Quota::per_minute(2).unwrap();
    let key = Key::from("k");
    for algorithm in ALGORITHMS {
        let quota = quota.with_algorithm(algorithm).unwrap();
        let peeked = store.peek(&key, &quota).await.unwrap();
        assert!(peeked.is_allowed());
        assert_eq!(peeked.info().remaining(), 2);
        assert!(store.is_empty(), "{algorithm}");
        assert!(store.check(&key, &quota, 2).await.unwrap().is_allowed());
        let peeked = store.peek(&key, &quota).await.unwrap();
        assert!(!peeked.is_allowed());
        assert!(peeked.info().retry_after() > Duration::ZERO);
        store.reset(&key, &quota).await.unwrap();
        assert!(store.is_empty());
        assert!(store.check(&key, &quota, 2).await.unwrap().is_allowed());
        store.reset(&key, &quota).await.unwrap();
    }
}

#[test]
fn keys_of_different_kinds_and_algorithms_count_apart() {
    let (store, _clock) = frozen_store(100);
    let quota = Quota::per_minute(1).unwrap();
    let keys = [
        Key::from(1u64),
        Key::from("1"),
        Key::from("0.0.0.1".parse::<std::net::IpAddr>().unwrap()),
        Key::hashed("1"),
        Key::from("x".repeat(500)),
    ];
    for algorithm in ALGORITHMS {
        let quota = quota.with_algorithm(algorithm).unwrap();
        for key in &keys {
            assert!(store.check_sync(key, &quota, 1).is_allowed(), "{key:?}");
            assert!(!store.check_sync(key, &quota, 1).is_allowed(), "{key:?}");
        }
    }
    assert_eq!(store.len(), 25);
}

#[test]
fn clones_share_one_store() {
    let (store, _clock) = frozen_store(10);
    let quota = Quota::per_minute(1).unwrap();
    let clone = store.clone();
    assert!(store.check_sync(&Key::from(1u64), &quota, 1).is_allowed());
    assert!(!clone.check_sync(&Key::from(1u64), &quota, 1).is_allowed());
    assert_eq!(clone.len(), 1);
}

#[test]
fn idle_keys_are_swept_as_the_store_grows() {
    let (store, clock) = frozen_store(1_000_000);
    let quota = Quota::per_second(1).unwrap();
    for i in 0..10_000u64 {
        store.check_sync(&Key::from(i), &quota, 1);
    }
    clock.advance(Duration::from_secs(2));
    for i in 10_000..40_000u64 {
        store.check_sync(&Key::from(i), &quota, 1);
    }
    // The first 10,000 keys became fresh and were swept when their shards doubled.
    assert!(store.len() < 40_000, "{}", store.len());
    assert_eq!(store.sweep() + store.len(), 30_000);
}
