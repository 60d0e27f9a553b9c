//! The memory store against `ratewarden-core`, under concurrency, eviction and clock steps.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratewarden_core::{Algorithm, Clock, Key, ManualClock, Quota, Store, Timestamp};

use crate::MemoryStore;

/// A store of at most `max_memory` bytes on a manual clock.
fn frozen_store(max_memory: usize) -> (MemoryStore<ManualClock>, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_micros(1_000_000_000));
    let store = MemoryStore::builder()
        .max_memory(NonZeroUsize::new(max_memory).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    (store, clock)
}

const MIB: usize = 1 << 20;

#[test]
fn two_threads_of_32_tasks_on_one_key_admit_exactly_the_burst() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    for algorithm in Algorithm::ALL {
        let (store, _clock) = frozen_store(16 * MIB);
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
fn racing_first_requests_of_a_new_key_admit_exactly_the_burst_and_leave_one_entry() {
    // More requests race than the burst admits (it used to race 32 against 100, which a
    // broken count would pass): 8 threads released at once, 4 checks each, against 10.
    let (store, _clock) = frozen_store(16 * MIB);
    for algorithm in Algorithm::ALL {
        let quota = Quota::per_minute(10)
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        for round in 0..50u64 {
            let key = Key::from(format!("{algorithm}-{round}"));
            let barrier = std::sync::Barrier::new(8);
            let admitted = AtomicU64::new(0);
            std::thread::scope(|scope| {
                for _ in 0..8 {
                    scope.spawn(|| {
                        barrier.wait();
                        for _ in 0..4 {
                            if store.check_sync(&key, &quota, 1).is_allowed() {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                }
            });
            assert_eq!(
                admitted.load(Ordering::Relaxed),
                10,
                "{algorithm} round {round}"
            );
        }
    }
    assert_eq!(store.len(), 5 * 50, "one entry per key");
}

#[test]
fn a_flood_of_new_keys_is_bounded_and_never_frees_a_throttled_key() {
    // 1,000,000 distinct keys against 2 MiB, while the clock moves 1 ms every 150 keys: a
    // flood key is forgettable 1 s (150,000 keys) after its request, so the store fills and
    // must evict.
    let (store, clock) = frozen_store(2 * MIB);
    let flood = Quota::per_second(1).unwrap();
    let strict = Quota::per_hour(1).unwrap();
    let victim = Key::from("throttled");
    assert!(store.check_sync(&victim, &strict, 1).is_allowed());
    assert!(!store.check_sync(&victim, &strict, 1).is_allowed());
    let mut max_memory = 0;
    let mut flood_admitted = 0u32;
    for i in 0..1_000_000u64 {
        if i % 150 == 0 {
            clock.advance(Duration::from_millis(1));
        }
        flood_admitted += u32::from(store.check_sync(&Key::from(i), &flood, 1).is_allowed());
        max_memory = max_memory.max(store.memory());
        if i % 10_000 == 0 {
            assert!(
                !store.check_sync(&victim, &strict, 1).is_allowed(),
                "at key {i}"
            );
        }
    }
    assert!(max_memory <= 2 * MIB, "{max_memory} bytes");
    assert!(max_memory > MIB, "the store filled: {max_memory} bytes");
    // Every new key was decided on its own state: a full store makes room, it never refuses.
    assert_eq!(flood_admitted, 1_000_000);
    assert!(store.evictions() > 0, "the flood outgrew the store");
    assert!(!store.check_sync(&victim, &strict, 1).is_allowed());
}

#[tokio::test]
async fn peek_does_not_consume_or_create_and_reset_forgets() {
    let (store, _clock) = frozen_store(MIB);
    let quota = Quota::per_minute(2).unwrap();
    let key = Key::from("k");
    for algorithm in Algorithm::ALL {
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
    let (store, _clock) = frozen_store(MIB);
    let quota = Quota::per_minute(1).unwrap();
    let keys = [
        Key::from(1u64),
        Key::from("1"),
        Key::from("0.0.0.1".parse::<std::net::IpAddr>().unwrap()),
        Key::hashed("1"),
        Key::from("x".repeat(500)),
    ];
    for algorithm in Algorithm::ALL {
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
    let (store, _clock) = frozen_store(MIB);
    let quota = Quota::per_minute(1).unwrap();
    let clone = store.clone();
    assert!(store.check_sync(&Key::from(1u64), &quota, 1).is_allowed());
    assert!(!clone.check_sync(&Key::from(1u64), &quota, 1).is_allowed());
    assert_eq!(clone.len(), 1);
}

#[test]
fn idle_keys_are_swept_a_few_at_a_time_as_new_keys_come() {
    let (store, clock) = frozen_store(64 * MIB);
    let quota = Quota::per_second(1).unwrap();
    for i in 0..10_000u64 {
        store.check_sync(&Key::from(i), &quota, 1);
    }
    clock.advance(Duration::from_secs(2));
    for i in 10_000..40_000u64 {
        store.check_sync(&Key::from(i), &quota, 1);
    }
    // The first 10,000 keys became fresh, and new keys' insertions swept them.
    assert!(store.len() < 35_000, "{}", store.len());
    assert_eq!(store.sweep() + store.len(), 30_000);
    assert_eq!(store.evictions(), 0, "nothing had to be evicted");
}

#[test]
fn two_quotas_on_one_key_never_share_state() {
    // Reproduced: one key under `5/h fixed-window` interleaved with `100/min fixed-window`
    // admitted 123 logins in an hour (5 alone): both quotas counted in one window state.
    let (store, clock) = frozen_store(16 * MIB);
    clock.set(Timestamp::from_micros(3_600_000_000 * 500_000)); // on the hour
    let login: Quota = "5/h fixed-window".parse().unwrap();
    let reads: Quota = "100/min fixed-window".parse().unwrap();
    let key = Key::from("user-1");
    let (mut logins, mut read) = (0, 0);
    for _ in 0..3_600 {
        logins += u32::from(store.check_sync(&key, &login, 1).is_allowed());
        read += u32::from(store.check_sync(&key, &reads, 1).is_allowed());
        clock.advance(Duration::from_secs(1));
    }
    assert_eq!(logins, 5, "login attempts in an hour");
    assert_eq!(
        read,
        60 * 60,
        "reads: one a second, never blocked by the logins"
    );

    // GCRA: POST at 2/min and GET at 100/min on one key.
    let post = Quota::per_minute(2).unwrap();
    let get = Quota::per_minute(100).unwrap();
    let key = Key::from("user-2");
    let (mut posts, mut gets) = (0, 0);
    for _ in 0..100 {
        posts += u32::from(store.check_sync(&key, &post, 1).is_allowed());
        gets += u32::from(store.check_sync(&key, &get, 1).is_allowed());
    }
    assert_eq!((posts, gets), (2, 100));
}

/// A random quota of any algorithm, with a small count so that bounds are reached.
fn any_quota() -> impl proptest::strategy::Strategy<Value = Quota> {
    use proptest::prelude::*;
    (1u32..=20, 10u64..=2_000, 1u32..=30, 0usize..5).prop_map(|(count, period_ms, burst, a)| {
        let quota = Quota::new(count, Duration::from_millis(period_ms))
            .unwrap()
            .with_algorithm(Algorithm::ALL[a])
            .unwrap();
        quota.with_burst(burst).unwrap_or(quota)
    })
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 10, ..Default::default() })]

    /// 100,000 random operations over 2 to 4 quotas on one key: each quota admits within its
    /// own bound, as if it were alone.
    #[test]
    fn interleaved_quotas_on_one_key_each_stay_within_their_bound(
        quotas in proptest::collection::vec(any_quota(), 2..=4),
        seed in proptest::prelude::any::<u64>(),
    ) {
        let (store, clock) = frozen_store(16 * MIB);
        let mut rng = fastrand::Rng::with_seed(seed);
        let key = Key::from("shared");
        // Per quota: the times (µs) of its admissions.
        let mut admitted: Vec<Vec<u64>> = vec![Vec::new(); quotas.len()];
        for _ in 0..100_000 {
            clock.advance(Duration::from_micros(rng.u64(0..2_000)));
            let i = rng.usize(..quotas.len());
            if store.check_sync(&key, &quotas[i], 1).is_allowed() {
                admitted[i].push(clock.now().as_micros());
            }
        }
        for (quota, times) in quotas.iter().zip(&admitted) {
            let period = quota.period_micros();
            for (i, &from) in times.iter().enumerate() {
                for (j, &to) in times[i..].iter().enumerate() {
                    let length = to - from;
                    let bound = match quota.algorithm() {
                        Algorithm::Gcra | Algorithm::TokenBucket => u64::from(quota.burst())
                            + (u64::from(quota.count()) * length).div_ceil(period),
                        // Any interval shorter than the period spans at most two windows.
                        Algorithm::FixedWindow | Algorithm::SlidingWindow if length < period => {
                            2 * u64::from(quota.count())
                        }
                        Algorithm::SlidingLog if length < period => u64::from(quota.count()),
                        _ => break,
                    };
                    proptest::prop_assert!(
                        (j as u64) < bound,
                        "{quota}: {} admitted within {length} µs, bound {bound}", j + 1
                    );
                }
            }
        }
    }
}

#[test]
fn an_eviction_gives_back_at_most_what_its_key_had_spent() {
    // The statement in the crate docs: a full store evicts, and each eviction gives its key
    // back at most what it had spent and not yet regained (at most one burst). On a clock
    // that never moves no key regains anything, so whatever a key is admitted beyond its
    // burst came from its evictions.
    let (store, _clock) = frozen_store(256 << 10);
    let quota = Quota::per_hour(10).unwrap();
    let mut admitted = 0u64;
    let keys = 60_000u64;
    for round in 0..12 {
        for k in 0..keys {
            admitted += u64::from(store.check_sync(&Key::from(k), &quota, 1).is_allowed());
        }
        assert!(
            store.memory() <= 256 << 10,
            "round {round}: {}",
            store.memory()
        );
    }
    let evictions = store.evictions();
    assert!(evictions > 0, "the store was large enough: nothing shown");
    assert!(
        admitted <= keys * 10 + evictions * 10,
        "{admitted} admitted with {evictions} evictions"
    );
}

#[test]
fn evictions_take_the_keys_closest_to_fresh_not_the_throttled_ones() {
    // One table (one quota): 100 keys that spent their whole burst, then a flood of keys that
    // spent one unit each. Each eviction takes the sampled entry closest to fresh: a flood
    // key, practically never a throttled one.
    let (store, _clock) = frozen_store(256 << 10);
    let quota = Quota::per_hour(10).unwrap();
    // Integers, like the flood's: one table.
    let throttled: Vec<Key> = (0..100).map(|i| Key::from(u64::MAX - i)).collect();
    for key in &throttled {
        assert!(store.check_sync(key, &quota, 10).is_allowed());
    }
    for k in 0..200_000u64 {
        assert!(store.check_sync(&Key::from(k), &quota, 1).is_allowed());
    }
    assert!(store.evictions() > 100_000, "{}", store.evictions());
    let readmitted = throttled
        .iter()
        .filter(|key| store.check_sync(key, &quota, 1).is_allowed())
        .count();
    assert_eq!(readmitted, 0, "throttled keys evicted by a flood");
}

#[test]
fn a_clock_stepped_back_an_hour_denies_a_key_for_at_most_its_horizon_and_a_second() {
    // Reproduced: after a step back, a spent GCRA key stayed denied for the whole step (an
    // hour), each denial saying "retry in 100 ms".
    for algorithm in Algorithm::ALL {
        let (store, clock) = frozen_store(MIB);
        let quota = Quota::per_second(10)
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        let key = Key::from("stepped");
        clock.advance(Duration::from_secs(7_200));
        while store.check_sync(&key, &quota, 1).is_allowed() {}
        clock.set(Timestamp::from_micros(
            clock.now().as_micros() - 3_600_000_000,
        ));
        let start = clock.now();
        // The horizon (two periods for the sliding window), and the memory store's second.
        let most = Duration::from_secs(3);
        loop {
            let waited = Duration::from_nanos(clock.now().as_nanos() - start.as_nanos());
            assert!(waited <= most, "{algorithm}: still denied after {waited:?}");
            match store.check_sync(&key, &quota, 1) {
                ratewarden_core::Decision::Denied(info) => {
                    clock.advance(info.retry_after().max(Duration::from_millis(10)));
                }
                _ => break,
            }
        }
    }
}

/// A monotonic clock whose next reading can be made stale: the reading a thread took before
/// it was descheduled for a while.
#[derive(Clone)]
struct StaleOnce {
    clock: ManualClock,
    stale: Arc<AtomicU64>,
}

impl Clock for StaleOnce {
    fn now(&self) -> Timestamp {
        match self.stale.swap(0, Ordering::AcqRel) {
            0 => self.clock.now(),
            stale => Timestamp::from_nanos(stale),
        }
    }

    fn is_monotonic(&self) -> bool {
        true
    }
}

#[test]
fn a_stale_reading_of_a_monotonic_clock_never_gives_quota_back() {
    // Reproduced: a check whose reading was 3 s stale (its thread read the clock, then was
    // descheduled) pulled a spent key's state back to that reading, as if the clock had
    // stepped back: the key was fresh again at once, 20 admitted within a second of a 10/s
    // quota.
    for algorithm in Algorithm::ALL {
        let clock = ManualClock::new(Timestamp::from_micros(1_000_000_000));
        let stale = Arc::new(AtomicU64::new(0));
        let store = MemoryStore::builder()
            .max_memory(NonZeroUsize::new(MIB).unwrap())
            .clock(StaleOnce {
                clock: clock.clone(),
                stale: Arc::clone(&stale),
            })
            .build()
            .unwrap();
        let quota = Quota::per_second(10)
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        let key = Key::from("spent");
        let before = clock.now();
        clock.advance(Duration::from_secs(3));
        let mut admitted = 0;
        while store.check_sync(&key, &quota, 1).is_allowed() {
            admitted += 1;
        }
        // A check that read the clock 3 s ago arrives now.
        stale.store(before.as_nanos(), Ordering::Release);
        admitted += u32::from(store.check_sync(&key, &quota, 1).is_allowed());
        for _ in 0..20 {
            admitted += u32::from(store.check_sync(&key, &quota, 1).is_allowed());
        }
        assert_eq!(admitted, 10, "{algorithm}");
    }
}

#[test]
fn a_full_store_of_large_states_makes_room_for_a_new_key_in_any_shard() {
    // Reproduced: sliding logs of 4,096 entries (32 KiB each) fill a small store a few keys
    // per shard; a new key whose shard held nothing to evict was refused, though other
    // shards held the whole bound.
    let (store, clock) = frozen_store(4 << 20);
    let quota: Quota = "4096/h sliding-log".parse().unwrap();
    for i in 0..3_000_u64 {
        clock.advance(Duration::from_millis(1));
        assert!(
            store.check_sync(&Key::from(i), &quota, 1).is_allowed(),
            "key {i} refused, {} evictions so far",
            store.evictions()
        );
    }
    assert!(store.memory() <= 4 << 20);
}

#[test]
fn two_stores_place_one_key_by_seeds_of_their_own() {
    // Hash flooding: keys a client finds colliding in one store (or computes offline against
    // a fixed seed) collide in no other. `clippy.toml` keeps fixed-seed hashers out.
    let ((a, _), (b, _)) = (frozen_store(1 << 20), frozen_store(1 << 20));
    let differ = (0..8_u64)
        .map(Key::from)
        .filter(|key| a.hash_of(key) != b.hash_of(key))
        .count();
    assert_eq!(differ, 8);
}

#[test]
fn a_bound_below_the_least_a_store_can_hold_is_refused_not_raised() {
    let built = |bytes: usize| {
        MemoryStore::builder()
            .max_memory(NonZeroUsize::new(bytes).unwrap())
            .build()
    };
    assert_eq!(
        built(crate::MIN_MEMORY - 1).unwrap_err(),
        crate::ConfigError::MaxMemoryTooSmall {
            bytes: crate::MIN_MEMORY - 1,
            min: crate::MIN_MEMORY,
        }
    );
    assert!(built(crate::MIN_MEMORY).unwrap().memory() <= crate::MIN_MEMORY);
}

mod reservations {
    use super::*;
    use ratewarden_core::Limit;

    #[test]
    fn racing_reservations_never_hold_more_than_the_burst() {
        // Frozen clock: nothing refills, so units settled plus units held never pass the
        // burst, whatever the interleaving.
        let (store, _clock) = frozen_store(8 << 20);
        let quota = Quota::per_hour(1_000).unwrap();
        let key = Key::from("tenant");
        let settled = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (store, key, settled) = (store.clone(), key.clone(), Arc::clone(&settled));
                std::thread::spawn(move || {
                    for i in 0..5_000_u32 {
                        let estimate = 1 + (i * 7 + t) % 5;
                        let limit = Limit::new(key.clone(), quota, estimate);
                        let r = store
                            .reserve_sync(&[limit], Duration::from_secs(60))
                            .unwrap();
                        if r.is_allowed() {
                            let actual = (i + t) % (estimate + 1);
                            settled.fetch_add(u64::from(actual), Ordering::Relaxed);
                            store.settle_sync(r, actual);
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let settled = settled.load(Ordering::Relaxed);
        assert_eq!(store.held(&key, &quota), 0);
        // Settles below the estimate gave back the rest: the quota was used to the unit.
        assert_eq!(settled, 1_000, "settled {settled} of a burst of 1,000");
    }

    #[test]
    fn a_denied_reservation_holds_nothing_on_any_limit() {
        let (store, _clock) = frozen_store(8 << 20);
        let (big, small) = (Quota::per_hour(100).unwrap(), Quota::per_hour(3).unwrap());
        let key = Key::from("u");
        let limits = [
            Limit::new(key.clone(), big, 2),
            Limit::new(key.clone(), small, 2),
        ];
        let first = store
            .reserve_sync(&limits, Duration::from_secs(60))
            .unwrap();
        assert!(first.is_allowed());
        let second = store
            .reserve_sync(&limits, Duration::from_secs(60))
            .unwrap();
        assert!(!second.is_allowed());
        assert_eq!(second.decisions().binding().map(|(i, _)| i), Some(1));
        assert!(second.held().is_empty());
        assert_eq!(
            store.held(&key, &big),
            2,
            "the admitting limit's hold was released"
        );
        store.settle_sync(first, 1);
        assert_eq!((store.held(&key, &big), store.held(&key, &small)), (0, 0));
    }

    #[test]
    fn holds_never_settled_lapse_after_the_hold_time() {
        let (store, clock) = frozen_store(8 << 20);
        let quota = Quota::per_hour(10).unwrap();
        let key = Key::from("crashed");
        for _ in 0..10 {
            let limit = Limit::new(key.clone(), quota, 1);
            let r = store
                .reserve_sync(&[limit], Duration::from_secs(5))
                .unwrap();
            assert!(r.is_allowed());
            std::mem::forget(r); // never settled, never released
        }
        assert_eq!(store.held(&key, &quota), 10);
        clock.advance(Duration::from_millis(4_999));
        assert_eq!(store.held(&key, &quota), 10);
        clock.advance(Duration::from_millis(1));
        assert_eq!(store.held(&key, &quota), 0);
        let all = Limit::new(key, quota, 10);
        assert!(
            store
                .reserve_sync(&[all], Duration::from_secs(5))
                .unwrap()
                .is_allowed()
        );
    }

    #[test]
    fn reserved_and_checked_requests_of_a_key_have_states_of_their_own() {
        let (store, _clock) = frozen_store(8 << 20);
        let quota = Quota::per_hour(2).unwrap();
        let key = Key::from("k");
        assert!(store.check_sync(&key, &quota, 2).is_allowed());
        let limit = Limit::new(key.clone(), quota, 2);
        let r = store
            .reserve_sync(&[limit], Duration::from_secs(1))
            .unwrap();
        assert!(r.is_allowed());
        store.settle_sync(r, 2);
        assert!(!store.check_sync(&key, &quota, 1).is_allowed());
    }

    #[test]
    fn a_flood_of_reserved_keys_stays_within_the_bound() {
        let (store, _clock) = frozen_store(1 << 20);
        let quota = Quota::per_minute(10).unwrap();
        for i in 0..100_000_u64 {
            let limit = Limit::new(Key::from(i), quota, 1);
            let r = store
                .reserve_sync(&[limit], Duration::from_secs(60))
                .unwrap();
            store.settle_sync(r, 1);
            assert!(store.memory() <= 1 << 20, "{} bytes", store.memory());
        }
        assert!(store.evictions() > 0);
    }

    #[test]
    fn every_algorithm_reserves_settles_and_refunds() {
        for algorithm in Algorithm::ALL {
            let (store, clock) = frozen_store(8 << 20);
            let quota: Quota = format!("10/h {algorithm}").parse().unwrap();
            let key = Key::from("k");
            let limit = Limit::new(key.clone(), quota, 6);
            let a = store
                .reserve_sync(std::slice::from_ref(&limit), Duration::from_secs(9))
                .unwrap();
            assert!(a.is_allowed(), "{algorithm}");
            assert!(
                !store
                    .reserve_sync(std::slice::from_ref(&limit), Duration::from_secs(9))
                    .unwrap()
                    .is_allowed()
            );
            store.settle_sync(a, 2);
            let b = store
                .reserve_sync(std::slice::from_ref(&limit), Duration::from_secs(9))
                .unwrap();
            assert!(b.is_allowed(), "{algorithm}: 2 settled + 6 held");
            store.settle_sync(b, 8); // 10 charged in all
            assert!(
                !store
                    .reserve_sync(&[Limit::new(key.clone(), quota, 1)], Duration::from_secs(9))
                    .unwrap()
                    .is_allowed()
            );
            clock.advance(Duration::from_millis(1));
            store.refund_sync(&key, &quota, 1);
            let refunded = store
                .reserve_sync(&[Limit::new(key.clone(), quota, 1)], Duration::from_secs(9))
                .unwrap();
            // The sliding log gives back debt only (it had none), its entries being older.
            assert_eq!(
                refunded.is_allowed(),
                algorithm != Algorithm::SlidingLog,
                "{algorithm}"
            );
        }
    }
}

mod reservation_edges {
    use super::*;
    use ratewarden_core::Limit;

    #[test]
    fn a_late_settle_of_a_swept_ledgers_hold_never_ends_a_new_hold() {
        let (store, clock) = frozen_store(8 << 20);
        let quota = Quota::per_hour(1).unwrap();
        let key = Key::from("k");
        let one = || [Limit::new(key.clone(), quota, 1)];
        let a = store.reserve_sync(&one(), Duration::from_secs(60)).unwrap();
        clock.advance(Duration::from_secs(61)); // A's hold lapsed: its ledger is swept
        assert_eq!(store.sweep(), 1);
        let b = store.reserve_sync(&one(), Duration::from_secs(60)).unwrap();
        assert!(b.is_allowed());
        store.settle_sync(a, 0); // A ends late: B's hold stands
        assert_eq!(store.held(&key, &quota), 1);
        assert!(
            !store
                .reserve_sync(&one(), Duration::from_secs(60))
                .unwrap()
                .is_allowed()
        );
        store.settle_sync(b, 0);
    }

    #[test]
    fn live_holds_are_never_evicted_to_make_room() {
        let (store, _clock) = frozen_store(256 << 10);
        let quota = Quota::per_second(1).unwrap();
        let victim = Key::from("victim");
        let place = || [Limit::new(victim.clone(), quota, 1)];
        // The victim's ledger is the closest to fresh of all (its hold lapses in 2 s, the
        // others' states in an hour): the first an eviction would pick.
        let held = store
            .reserve_sync(&place(), Duration::from_secs(2))
            .unwrap();
        assert!(held.is_allowed());
        let hourly = Quota::per_hour(1).unwrap();
        for i in 0..5_000_u64 {
            let r = store
                .reserve_sync(
                    &[Limit::new(Key::from(i), hourly, 1)],
                    Duration::from_secs(60),
                )
                .unwrap();
            store.settle_sync(r, 1);
        }
        assert!(store.evictions() > 0, "the flood made the store evict");
        assert_eq!(
            store.held(&victim, &quota),
            1,
            "the victim's place was kept"
        );
        assert!(
            !store
                .reserve_sync(&place(), Duration::from_secs(2))
                .unwrap()
                .is_allowed()
        );
        store.settle_sync(held, 0);
    }

    #[test]
    fn a_denied_reservation_never_extends_the_lapse_of_other_holds() {
        let (store, clock) = frozen_store(8 << 20);
        let (loose, strict) = (Quota::per_hour(10).unwrap(), Quota::per_hour(1).unwrap());
        let (a, b) = (Key::from("a"), Key::from("b"));
        let leaked = store
            .reserve_sync(&[Limit::new(a.clone(), loose, 1)], Duration::from_secs(10))
            .unwrap();
        std::mem::forget(leaked);
        let full = store
            .reserve_sync(
                &[Limit::new(b.clone(), strict, 1)],
                Duration::from_secs(3600),
            )
            .unwrap();
        let both = [Limit::new(a.clone(), loose, 1), Limit::new(b, strict, 1)];
        let denied = store
            .reserve_sync(&both, Duration::from_secs(3600))
            .unwrap();
        assert!(!denied.is_allowed());
        clock.advance(Duration::from_secs(11));
        assert_eq!(
            store.held(&a, &loose),
            0,
            "the leaked hold lapsed at its own time"
        );
        store.settle_sync(full, 0);
    }
}
