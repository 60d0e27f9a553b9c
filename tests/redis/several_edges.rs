//! Several limits where they meet the rest of the stores (`Store::check_all`): hot-key
//! splits, limits on one state, cancelled requests, probes, and refunds against a world
//! without the charge.

use std::num::NonZeroU32;
use std::time::Duration;

use ratewarden_core::algorithm::{
    AlgorithmState, FixedWindowState, GcraState, SlidingLogState, SlidingWindowState,
    TokenBucketState,
};
use ratewarden_core::{Decision, Key, Limit, Quota, Store, Timestamp};
use ratewarden_memory::MemoryStore;
use ratewarden_redis::{HotKeys, RedisConfig, RedisStore};
use tests::redis_server::{RedisCluster, RedisServer};

fn kind(d: &Decision) -> &'static str {
    match d {
        Decision::Allowed(_) => "allowed",
        Decision::Denied(_) => "denied",
        Decision::InsufficientCapacity(_) => "insufficient",
    }
}

/// The cluster slot of a state's name: its hash tag's.
fn slot(name: &[u8]) -> u16 {
    let open = name.iter().position(|&b| b == b'{').unwrap();
    let close = open + 1 + name[open + 1..].iter().position(|&b| b == b'}').unwrap();
    crc16::State::<crc16::XMODEM>::calculate(&name[open + 1..close]) % 16_384
}

#[tokio::test]
async fn a_statically_split_key_is_counted_on_its_parts_by_check_all() {
    let server = RedisServer::start();
    let store = RedisConfig::new(server.url())
        .prefix("edge-split")
        .timeout(Duration::from_secs(10))
        .hot_keys(HotKeys::split(NonZeroU32::new(4).unwrap()))
        .deny_cache(0)
        .connect()
        .await
        .unwrap();
    let strict: Quota = "8/h".parse().unwrap();
    let loose: Quota = "1000/h".parse().unwrap();
    let k = Key::from("tenant-hot");
    let j = Key::from("user-1");
    let mut via_all = 0;
    for _ in 0..20 {
        let limits = [
            Limit::new(k.clone(), strict, 1),
            Limit::new(j.clone(), loose, 1),
        ];
        if store.check_all(&limits).await.unwrap().is_allowed() {
            via_all += 1;
        }
    }
    let mut via_one = 0;
    for _ in 0..60 {
        // Also what check_all([k]) does (one state: the single-check path).
        if store
            .check_all(&[Limit::new(k.clone(), strict, 1)])
            .await
            .unwrap()
            .is_allowed()
        {
            via_one += 1;
        }
    }
    eprintln!("static split: via check_all(2 states) {via_all}, via check_all(1 state) {via_one}");
    // The split's documented bound: burst + parts - 1 = 11 at once.
    assert!(
        via_all + via_one <= 8 + 3,
        "key {k:?} under 8/h admitted {via_all} + {via_one} = {}",
        via_all + via_one
    );
}

#[tokio::test]
async fn check_all_of_an_adaptively_split_key_goes_to_a_part() {
    let server = RedisServer::start();
    let store = RedisConfig::new(server.url())
        .prefix("edge-adapt")
        .timeout(Duration::from_secs(2))
        .hot_keys(HotKeys::adaptive(5, NonZeroU32::new(4).unwrap()).hold(Duration::from_secs(30)))
        .deny_cache(0)
        .connect()
        .await
        .unwrap();
    let roomy: Quota = "100000/h burst 10000".parse().unwrap();
    let k = Key::from("tenant-hot");
    let j = Key::from("user-1");
    for _ in 0..50 {
        assert!(store.check(&k, &roomy, 1).await.unwrap().is_allowed());
        if !store.split_keys().is_empty() {
            break;
        }
    }
    assert!(!store.split_keys().is_empty(), "the key never split");
    let mut denied = 0;
    for _ in 0..10 {
        let limits = [
            Limit::new(k.clone(), roomy, 1),
            Limit::new(j.clone(), roomy, 1),
        ];
        let d = store.check_all(&limits).await.unwrap();
        if !d.is_allowed() {
            denied += 1;
            eprintln!("denied: {:?}", d.as_slice()[0]);
        }
    }
    // A single check of the same key is admitted meanwhile.
    let single = store.check(&k, &roomy, 1).await.unwrap().is_allowed();
    eprintln!("adaptive split: check_all denied {denied}/10; a single check admitted: {single}");
    assert_eq!(
        denied, 0,
        "check_all denied a split key with ~10000 units of room"
    );
}

#[tokio::test]
async fn limits_on_one_state_above_the_burst_are_insufficient_on_both_stores() {
    let quota: Quota = "10/s".parse().unwrap();
    let a = Key::from("dup");
    let limits = [
        Limit::new(a.clone(), quota, 6),
        Limit::new(a.clone(), quota, 6),
    ];
    let memory = MemoryStore::new();
    let m = memory.check_all_sync(&limits).unwrap();
    let server = RedisServer::start();
    let store = RedisConfig::new(server.url())
        .prefix("edge-dup")
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    let r = store.check_all(&limits).await.unwrap();
    let kinds = |d: &ratewarden_core::Decisions| d.as_slice().iter().map(kind).collect::<Vec<_>>();
    eprintln!(
        "memory {:?} retry {:?}; redis {:?}",
        kinds(&m),
        m.binding().map(|(_, d)| d.info().retry_after()),
        kinds(&r)
    );
    // Retry as told: memory denies again, forever.
    let retry = m.binding().unwrap().1.info().retry_after();
    let mut clock_free = 0;
    for _ in 0..3 {
        std::thread::sleep(retry.max(Duration::from_millis(10)));
        if !memory.check_all_sync(&limits).unwrap().is_allowed() {
            clock_free += 1;
        }
    }
    eprintln!("memory: denied again {clock_free}/3 after waiting its retry_after");
    assert_eq!(kinds(&m), kinds(&r), "the stores disagree on one request");
}

fn refund_never_more_lenient<S: AlgorithmState + std::fmt::Debug>(quota: &str, seed: u64) {
    let quota: Quota = quota.parse().unwrap();
    let mut rng = fastrand::Rng::with_seed(seed);
    let period = quota.period().as_micros() as u64;
    let burst = quota.burst();
    for run in 0..3_000 {
        let mut t: u64 = 1_000_000_000 + rng.u64(0..period * 3);
        let mut with = S::default();
        let mut without = S::default();
        let step = |rng: &mut fastrand::Rng| {
            if rng.bool() {
                rng.u64(0..period / 4 + 1)
            } else {
                rng.u64(0..period * 2)
            }
        };
        // history
        for _ in 0..rng.usize(0..6) {
            t += step(&mut rng);
            let c = rng.u32(0..=burst);
            let now = Timestamp::from_micros(t);
            if with.check(now, c, &quota).is_allowed() {
                without.check(now, c, &quota);
            }
        }
        // X
        t += step(&mut rng);
        let charged_at = Timestamp::from_micros(t);
        let x = rng.u32(1..=burst);
        if !with.check(charged_at, x, &quota).is_allowed() {
            continue;
        }
        let mut log = vec![format!("X {x} at {t}")];
        // others, admitted in the charged world (so they fit without it too)
        for _ in 0..rng.usize(0..4) {
            t += rng.u64(0..period / 2 + 1);
            let c = rng.u32(0..=burst);
            let now = Timestamp::from_micros(t);
            if with.check(now, c, &quota).is_allowed() {
                let d = without.check(now, c, &quota);
                assert!(d.is_allowed(), "run {run}: monotonicity");
                log.push(format!("other {c} at {t}"));
            }
        }
        t += rng.u64(0..period / 2 + 1);
        let refunded_at = Timestamp::from_micros(t);
        with.refund(refunded_at, charged_at, x, &quota);
        log.push(format!("refund at {t}"));
        // after: every probe admitted with the refund must be admitted without the charge
        for _ in 0..6 {
            t += rng.u64(0..period / 3 + 1);
            let now = Timestamp::from_micros(t);
            for c in 1..=burst {
                let a = with.clone().check(now, c, &quota).is_allowed();
                let b = without.clone().check(now, c, &quota).is_allowed();
                assert!(
                    !a || b,
                    "{quota} run {run}: after {log:?}, at {t} cost {c}: refunded admits, \
                     never-charged denies\nwith {with:?}\nwithout {without:?}"
                );
            }
            let c = rng.u32(0..=burst);
            if with.check(now, c, &quota).is_allowed() {
                without.check(now, c, &quota);
            }
        }
    }
}

#[test]
fn a_refund_is_never_more_lenient_than_no_charge() {
    refund_never_more_lenient::<GcraState>("5/s burst 4", 1);
    refund_never_more_lenient::<TokenBucketState>("5/s burst 4 token-bucket", 2);
    refund_never_more_lenient::<TokenBucketState>("3/7ms burst 5 token-bucket", 3);
    refund_never_more_lenient::<FixedWindowState>("4/s fixed-window", 4);
    refund_never_more_lenient::<SlidingWindowState>("4/s sliding-window", 5);
    refund_never_more_lenient::<SlidingLogState>("4/s sliding-log", 6);
}

async fn cluster_store(cluster: &RedisCluster, prefix: &str, timeout: Duration) -> RedisStore {
    RedisConfig::cluster(cluster.urls())
        .prefix(prefix)
        .timeout(timeout)
        .deny_cache(0)
        .connect()
        .await
        .unwrap()
}

/// Two keys whose states live on different masters: (a, node of a, b, node of b).
fn two_nodes(
    cluster: &RedisCluster,
    store: &RedisStore,
    qa: &Quota,
    qb: &Quota,
) -> (Key, usize, Key, usize) {
    let a = Key::from("a-key");
    let (na, _) = cluster
        .master_of(slot(&store.state_key(&a, qa)), 0)
        .unwrap();
    for i in 0..1000 {
        let b = Key::from(format!("b-key-{i}"));
        let (nb, _) = cluster
            .master_of(slot(&store.state_key(&b, qb)), 0)
            .unwrap();
        if nb != na {
            return (a, na, b, nb);
        }
    }
    panic!("no key on another node");
}

async fn remaining(store: &RedisStore, key: &Key, quota: &Quota) -> u64 {
    store.peek(key, quota).await.unwrap().info().remaining()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_check_all_never_leaves_one_slot_counted() {
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster, "edge-drop", Duration::from_secs(10)).await;
    let qa: Quota = "5/h fixed-window".parse().unwrap();
    let qb: Quota = "1/h".parse().unwrap();
    let (a, _na, b, nb) = two_nodes(&cluster, &store, &qa, &qb);
    assert!(store.check(&b, &qb, 1).await.unwrap().is_allowed()); // b spent: X will be denied
    cluster.freeze(nb);
    let x = {
        let (store, a, b) = (store.clone(), a.clone(), b.clone());
        tokio::spawn(async move {
            store
                .check_all(&[Limit::new(a, qa, 1), Limit::new(b, qb, 1)])
                .await
        })
    };
    let mut seen = false;
    for _ in 0..300 {
        if remaining(&store, &a, &qa).await == 4 {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(seen, "a was never charged");
    x.abort(); // the caller gives up (a tower timeout, a client gone)
    let _ = x.await;
    cluster.thaw(nb);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let left = remaining(&store, &a, &qa).await;
    eprintln!("after a dropped, denied-by-b request: a has {left} of 5 left (fixed window, 1 h)");
    assert_eq!(
        left, 5,
        "a unit of a request b denied stays counted until the window ends"
    );
}

#[tokio::test]
async fn a_probe_reads_its_state_as_it_was_before_the_request() {
    let quota: Quota = "2/h".parse().unwrap();
    let a = Key::from("probe-a");
    let limits = [
        Limit::new(a.clone(), quota, 1),
        Limit::probe(a.clone(), quota, 1),
    ];
    let clock = ratewarden_core::ManualClock::new(Timestamp::from_micros(1_000_000_000));
    let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let mut model = tests::several::Model::default();
    let server = RedisServer::start();
    let store = RedisConfig::new(server.url())
        .prefix("edge-probe")
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let m = memory.check_all_sync(&limits).unwrap().is_allowed();
        let r = store.check_all(&limits).await.unwrap().is_allowed();
        let e = model
            .check_all(&limits, ratewarden_core::Clock::now(&clock))
            .iter()
            .all(Decision::is_allowed);
        seen.push((m, r, e));
    }
    eprintln!("(memory, redis, model) admitted: {seen:?}");
    assert!(seen.iter().all(|(m, r, e)| m == r && r == e));
}

#[tokio::test]
async fn a_cost_zero_limit_never_unlocks_a_split_keys_own_counter() {
    let n = adaptive_split_one_second(true).await;
    assert!(n <= 23, "{n} admitted in 1 s");
}

/// Control: the same without the cost-0 request.
#[tokio::test]
async fn an_adaptively_split_key_stays_within_its_bound_under_check_all() {
    let n = adaptive_split_one_second(false).await;
    assert!(n <= 23, "{n} admitted in 1 s");
}

async fn adaptive_split_one_second(zero_first: bool) -> u32 {
    let server = RedisServer::start();
    let store = RedisConfig::new(server.url())
        .prefix("edge-zero")
        .timeout(Duration::from_secs(2))
        .hot_keys(HotKeys::adaptive(5, NonZeroU32::new(4).unwrap()).hold(Duration::from_secs(30)))
        .deny_cache(0)
        .connect()
        .await
        .unwrap();
    let quota: Quota = "10/s".parse().unwrap();
    let loose: Quota = "100000/h burst 10000".parse().unwrap();
    let k = Key::from("tenant-hot");
    let j = Key::from("user-1");
    for _ in 0..50 {
        let _ = store.check(&k, &quota, 1).await.unwrap();
        if !store.split_keys().is_empty() {
            break;
        }
    }
    assert!(!store.split_keys().is_empty(), "the key never split");
    if zero_first {
        let zero = [
            Limit::new(k.clone(), quota, 0),
            Limit::new(j.clone(), loose, 1),
        ];
        let z = store.check_all(&zero).await.unwrap();
        eprintln!("cost-0 check_all on the split key: {:?}", z.as_slice()[0]);
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // One second of traffic, half single checks (parts), half check_all (whole counter).
    let start = std::time::Instant::now();
    let (mut singles, mut alls) = (0, 0);
    while start.elapsed() < Duration::from_secs(1) {
        if store.check(&k, &quota, 1).await.unwrap().is_allowed() {
            singles += 1;
        }
        let both = [
            Limit::new(k.clone(), quota, 1),
            Limit::new(j.clone(), loose, 1),
        ];
        if store.check_all(&both).await.unwrap().is_allowed() {
            alls += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!("in 1 s under 10/s: {singles} single checks + {alls} check_all admitted");
    // Documented split bound over t = 1 s: burst + rate*t + parts - 1 = 10 + 10 + 3.
    singles + alls
}

/// A cost-0 limit whose state (or split marker) cannot be read is denied, its state
/// replaced by a spent one; the request is then decided again on what is there, so that
/// it is admitted only with every other limit counted: `b`, under `1/h`, admits once.
#[tokio::test]
async fn a_cost_zero_limit_on_an_unreadable_state_never_lets_the_others_through_uncounted() {
    let server = RedisServer::start();
    let mut conn = server
        .client()
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let gcra: Quota = "1/h".parse().unwrap();
    let bucket: Quota = "1/h token-bucket".parse().unwrap();
    for (prefix, marker) in [("edge-zero-state", false), ("edge-zero-marker", true)] {
        let mut config = RedisConfig::new(server.url())
            .prefix(prefix)
            .timeout(Duration::from_secs(10))
            .deny_cache(0);
        if marker {
            config = config.hot_keys(HotKeys::adaptive(1_000, NonZeroU32::new(4).unwrap()));
        }
        let store = config.connect().await.unwrap();
        let (a, b) = (Key::from("a"), Key::from("b"));
        let mut admitted = 0;
        for _ in 0..3 {
            let mut garbage = store.state_key(&a, &bucket);
            if marker {
                garbage.extend_from_slice(b":m");
            }
            let _: () = redis::cmd("SET")
                .arg(garbage)
                .arg("junk")
                .query_async(&mut conn)
                .await
                .unwrap();
            let limits = [
                Limit::new(a.clone(), bucket, 0),
                Limit::new(b.clone(), gcra, 1),
            ];
            let decisions = store.check_all(&limits).await.unwrap();
            let counted: Option<String> = redis::cmd("GET")
                .arg(store.state_key(&b, &gcra))
                .query_async(&mut conn)
                .await
                .unwrap();
            if decisions.is_allowed() {
                admitted += 1;
                assert!(counted.is_some(), "{prefix}: admitted with b uncounted");
            }
        }
        assert_eq!(
            admitted, 1,
            "{prefix}: b under 1/h admitted {admitted} times"
        );
    }
}
