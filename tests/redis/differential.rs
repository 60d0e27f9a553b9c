//! 100,000 random operations per algorithm through ratewarden-core and through its Lua script on a
//! real server, at the same (explicit) times, the clock stepping back now and then: identical
//! decisions.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRng, TestRunner};
use ratewarden_core::algorithm::{
    AlgorithmState, FixedWindowState, GcraState, SlidingLogState, SlidingWindowState,
    TokenBucketState,
};
use ratewarden_core::{Algorithm, Decision, Key, Quota, Timestamp};
use ratewarden_redis::RedisStore;
use tests::redis_server::RedisServer;

const OPERATIONS: usize = 100_000;
/// Keys checked concurrently (each key's operations stay in order).
const KEYS: usize = 50;

/// A random quota for `algorithm`: counts 1-50, periods from 1 ms to 1 day.
fn quota(rng: &mut TestRng, algorithm: Algorithm) -> Quota {
    let count = rng.random_range(1..=50u32);
    let period_us = match rng.random_range(0..3) {
        0 => rng.random_range(1_000..100_000u64),
        1 => rng.random_range(100_000..10_000_000),
        _ => rng.random_range(10_000_000..86_400_000_000),
    };
    let quota = Quota::new(
        count,
        std::time::Duration::from_micros(period_us.max(u64::from(count))),
    )
    .unwrap()
    .with_algorithm(algorithm)
    .unwrap();
    if matches!(algorithm, Algorithm::Gcra | Algorithm::TokenBucket) && rng.random_bool(0.5) {
        quota.with_burst(rng.random_range(1..=60)).unwrap()
    } else {
        quota
    }
}

async fn run_key<S: AlgorithmState>(
    store: RedisStore,
    seed: u64,
    algorithm: Algorithm,
    ops: usize,
) {
    let mut rng = TestRunner::new(Config {
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        ..Config::default()
    })
    .new_rng();
    let quota = quota(&mut rng, algorithm);
    let key = Key::from(format!("diff-{algorithm}-{seed}"));
    let mut state = S::default();
    // A start between 2020 and 2030, in µs.
    let mut now: u64 = rng.random_range(1_577_836_800_000_000..1_893_456_000_000_000);
    let period = quota.period_micros();
    for op in 0..ops {
        now += match rng.random_range(0..4) {
            0 => 0,
            1 => rng.random_range(0..=quota.emission_interval_micros().max(1)),
            2 => rng.random_range(0..=period / 3 + 1),
            _ => rng.random_range(0..=period * 2),
        };
        // Now and then the clock steps back (a failover to a host whose clock is behind).
        if rng.random_range(0..25) == 0 {
            now -= rng.random_range(0..=period * 2);
        }
        let cost = match rng.random_range(0..10) {
            0 => 0,
            1 => rng.random_range(0..=quota.burst() + 2),
            _ => rng.random_range(1..=3),
        };
        let expected: Decision = state.check(Timestamp::from_micros(now), cost, &quota);
        let actual = store
            .check_at(&key, &quota, cost, Timestamp::from_micros(now))
            .await
            .unwrap();
        assert_eq!(
            actual, expected,
            "{algorithm} {quota} op {op} at {now} cost {cost} (seed {seed})"
        );
    }
}

async fn differential(algorithm: Algorithm) {
    let server = RedisServer::start();
    let store = crate::store(&server, "differential").await;
    let tasks: Vec<_> = (0..KEYS)
        .map(|i| {
            let store = store.clone();
            let seed = 1_000 + i as u64;
            let ops = OPERATIONS / KEYS;
            tokio::spawn(async move {
                match algorithm {
                    Algorithm::Gcra => run_key::<GcraState>(store, seed, algorithm, ops).await,
                    Algorithm::TokenBucket => {
                        run_key::<TokenBucketState>(store, seed, algorithm, ops).await
                    }
                    Algorithm::FixedWindow => {
                        run_key::<FixedWindowState>(store, seed, algorithm, ops).await
                    }
                    Algorithm::SlidingWindow => {
                        run_key::<SlidingWindowState>(store, seed, algorithm, ops).await
                    }
                    _ => run_key::<SlidingLogState>(store, seed, algorithm, ops).await,
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_script_matches_ratewarden_core() {
    differential(Algorithm::Gcra).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_script_matches_ratewarden_core() {
    differential(Algorithm::TokenBucket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_script_matches_ratewarden_core() {
    differential(Algorithm::FixedWindow).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_script_matches_ratewarden_core() {
    differential(Algorithm::SlidingWindow).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_script_matches_ratewarden_core() {
    differential(Algorithm::SlidingLog).await;
}

/// 100,000 random operations over 2 to 4 random quotas (of any algorithms) on one key, at
/// explicit times: Redis decides each quota exactly as `ratewarden-core` does with a state of its own
/// per quota, as if the others did not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_quotas_on_one_key_each_match_ratewarden_core_alone() {
    let server = RedisServer::start();
    let store = crate::store(&server, "interleaved").await;
    let tasks: Vec<_> = (0..KEYS as u64)
        .map(|seed| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut rng = TestRunner::new(Config {
                    rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
                    ..Config::default()
                })
                .new_rng();
                let algorithms = Algorithm::ALL;
                let quotas: Vec<Quota> = (0..rng.random_range(2..=4usize))
                    .map(|_| {
                        let algorithm = algorithms[rng.random_range(0..5usize)];
                        quota(&mut rng, algorithm)
                    })
                    .collect();
                let mut states: Vec<AnyState> = quotas.iter().map(AnyState::new).collect();
                let key = Key::from(format!("interleaved-{seed}"));
                let mut now: u64 = 1_700_000_000_000_000;
                for op in 0..OPERATIONS / KEYS {
                    now += rng.random_range(0..=50_000u64);
                    let i = rng.random_range(0..quotas.len());
                    let cost = rng.random_range(0..=3);
                    let expected = states[i].check(now, cost, &quotas[i]);
                    let actual = store
                        .check_at(&key, &quotas[i], cost, Timestamp::from_micros(now))
                        .await
                        .unwrap();
                    assert_eq!(actual, expected, "{} op {op} (seed {seed})", quotas[i]);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// Random batches (2 to 64 checks over 3 keys with 2 quotas each, any algorithms, costs up to
/// past the burst, the clock now and then stepping back), each sent as one script call: every
/// check decided as `ratewarden-core` decides it, in the batch's order, as if it went alone.
#[tokio::test]
async fn batches_decide_each_check_as_ratewarden_core_in_order() {
    let server = RedisServer::start();
    let store = crate::store(&server, "batches").await;
    let mut rng = TestRunner::new(Config {
        rng_seed: proptest::test_runner::RngSeed::Fixed(7),
        ..Config::default()
    })
    .new_rng();
    for round in 0..40 {
        // GCRA most often: its checks are decided by the batch's own code.
        let algorithm = |rng: &mut TestRng| {
            if rng.random_bool(0.6) {
                Algorithm::Gcra
            } else {
                Algorithm::ALL[rng.random_range(0..5usize)]
            }
        };
        let limits: Vec<(Key, Quota)> = (0..3)
            .flat_map(|k| (0..2).map(move |q| (k, q)))
            .map(|(k, _)| {
                let algorithm = algorithm(&mut rng);
                (
                    Key::from(format!("batch-{round}-{k}")),
                    quota(&mut rng, algorithm),
                )
            })
            .collect();
        let mut states: Vec<AnyState> = limits.iter().map(|(_, q)| AnyState::new(q)).collect();
        let mut now: u64 = 1_700_000_000_000_000;
        for _ in 0..20 {
            let size = rng.random_range(2..=64usize);
            let mut checks = Vec::with_capacity(size);
            let mut expected = Vec::with_capacity(size);
            for _ in 0..size {
                let i = rng.random_range(0..limits.len());
                let (key, quota) = &limits[i];
                now += match rng.random_range(0..4) {
                    0 | 1 => 0,
                    2 => rng.random_range(0..=quota.emission_interval_micros().max(1)),
                    _ => rng.random_range(0..=quota.period_micros()),
                };
                if rng.random_range(0..40) == 0 {
                    now -= rng.random_range(0..=quota.period_micros());
                }
                let cost = match rng.random_range(0..10) {
                    0 => 0,
                    1 => rng.random_range(0..=quota.burst() + 2),
                    _ => 1,
                };
                expected.push(states[i].check(now, cost, quota));
                checks.push((key.clone(), *quota, cost, Timestamp::from_micros(now)));
            }
            let actual = store.check_batch_at(&checks).await.unwrap();
            for (n, ((check, actual), expected)) in
                checks.iter().zip(actual).zip(expected).enumerate()
            {
                assert_eq!(
                    actual, expected,
                    "round {round}, check {n} of {size}: {check:?}"
                );
            }
        }
    }
}

/// One `ratewarden-core` state of any algorithm.
pub(crate) enum AnyState {
    Gcra(GcraState),
    TokenBucket(TokenBucketState),
    FixedWindow(FixedWindowState),
    SlidingWindow(SlidingWindowState),
    SlidingLog(SlidingLogState),
}

impl AnyState {
    pub(crate) fn new(quota: &Quota) -> Self {
        match quota.algorithm() {
            Algorithm::Gcra => Self::Gcra(GcraState::default()),
            Algorithm::TokenBucket => Self::TokenBucket(TokenBucketState::default()),
            Algorithm::FixedWindow => Self::FixedWindow(FixedWindowState::default()),
            Algorithm::SlidingWindow => Self::SlidingWindow(SlidingWindowState::default()),
            _ => Self::SlidingLog(SlidingLogState::default()),
        }
    }

    pub(crate) fn check(&mut self, now: u64, cost: u32, quota: &Quota) -> Decision {
        let now = Timestamp::from_micros(now);
        match self {
            Self::Gcra(s) => s.check(now, cost, quota),
            Self::TokenBucket(s) => s.check(now, cost, quota),
            Self::FixedWindow(s) => s.check(now, cost, quota),
            Self::SlidingWindow(s) => s.check(now, cost, quota),
            Self::SlidingLog(s) => s.check(now, cost, quota),
        }
    }
}
