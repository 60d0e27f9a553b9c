//! Fault tests: a rate-limited service on a `RedisStore` behind a `CircuitBreaker`, under a
//! bounded load, while a real `redis-server` on loopback (or the network to it, through a
//! proxy) fails in each way listed in the resilience issue. Every test checks: no panic, no
//! request past its deadline, exactly the configured failure outcome, the breaker open after
//! the threshold (where the store fails), decisions from Redis again within the maximum
//! backoff + 1 s of recovery, and no growth in tasks or open file descriptors.
//!
//! The tests run one at a time (they measure latency and count descriptors).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod harness;

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use harness::{Harness, Outcome, Report, config};
use ratewarden_core::{Key, KeyRepr, Quota, Store};
use ratewarden_memory::MemoryStore;
use ratewarden_redis::{RedisConfig, RedisStore};
use ratewarden_tower::rate_limit::FailureMode;
use tests::proxy::{Fault, Proxy};
use tests::redis_server::{RedisCluster, RedisServer, free_port};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Plenty: these tests are about failures, not limits.
fn quota() -> Quota {
    Quota::per_second(1_000_000).unwrap()
}

fn keys() -> Vec<u64> {
    (0..8).collect()
}

const HOLD: Duration = Duration::from_millis(1_500);
const SETTLE: Duration = Duration::from_millis(300);

fn closed() -> FailureMode {
    FailureMode::closed_allowing([Key::from(0_u64)])
}

fn fallback() -> FailureMode {
    FailureMode::fallback(MemoryStore::new(), NonZeroU32::new(4).unwrap())
}

/// Closed mode: the allowlisted key passes, every other key gets 503, nothing else.
fn assert_closed(report: &Report) {
    report.assert_outcomes(
        &[Outcome::Decided, Outcome::Passed, Outcome::Unavailable],
        Outcome::Unavailable,
    );
    for sample in &report.samples {
        match sample.outcome {
            Outcome::Passed => assert_eq!(sample.key, 0, "only the allowlisted key passes"),
            Outcome::Unavailable => assert_ne!(sample.key, 0, "the allowlisted key is never 503"),
            _ => {}
        }
    }
}

fn assert_open(report: &Report) {
    report.assert_outcomes(&[Outcome::Decided, Outcome::Passed], Outcome::Passed);
}

/// Fallback: every request is still decided (by the local store while Redis is out).
fn assert_fallback(report: &Report) {
    report.assert_outcomes(&[Outcome::Decided], Outcome::Decided);
}

/// The fault is over: waits for Redis to decide again, then checks what every fault must
/// show, the breaker having opened included.
async fn recovered(mut h: Harness, slack: usize) -> Report {
    h.recovered();
    let report = h.finish(SETTLE).await;
    report.assert_common(slack);
    report.assert_breaker_opened();
    report
}

async fn healthy_harness(url: String, mode: FailureMode) -> Harness {
    let store = config(url).prefix("faults").build().unwrap();
    let mut harness = Harness::new(store, mode, quota(), keys());
    harness.healthy().await;
    harness.start_load();
    tokio::time::sleep(Duration::from_millis(300)).await;
    harness
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_and_restart_on_the_same_port() {
    let _serial = SERIAL.lock().await;
    let mut server = RedisServer::start();
    let mut h = healthy_harness(server.url(), closed()).await;
    h.fault();
    server.kill();
    tokio::time::sleep(HOLD).await;
    server.restart();
    let report = recovered(h, 2).await;
    assert_closed(&report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_then_sigcont() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let mut h = healthy_harness(server.url(), FailureMode::open()).await;
    h.fault();
    server.freeze();
    tokio::time::sleep(HOLD).await;
    server.thaw();
    let report = recovered(h, 2).await;
    assert_open(&report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_sleep() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start_with(free_port(), &["--enable-debug-command", "yes"]);
    let mut h = healthy_harness(server.url(), fallback()).await;
    h.fault();
    let sleeper = server.query_in_background(redis::cmd("DEBUG").arg("SLEEP").arg(1.5).clone());
    sleeper.join().unwrap();
    let report = recovered(h, 2).await;
    assert_fallback(&report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let mut h = healthy_harness(server.url(), closed()).await;
    h.fault();
    let _: () = server
        .query(redis::cmd("CLIENT").arg("PAUSE").arg(1_500).arg("ALL"))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let report = recovered(h, 2).await;
    assert_closed(&report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_script_makes_redis_busy() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start_with(free_port(), &["--busy-reply-threshold", "50"]);
    let mut h = healthy_harness(server.url(), FailureMode::open()).await;
    h.fault();
    let endless = server.query_in_background(
        redis::cmd("EVAL")
            .arg("local n = 0 while true do n = n + 1 end")
            .arg(0)
            .clone(),
    );
    tokio::time::sleep(HOLD).await;
    // Only SCRIPT KILL (and SHUTDOWN NOSAVE) run while a script is busy.
    let _: () = server.query(redis::cmd("SCRIPT").arg("KILL")).unwrap();
    endless.join().unwrap();
    let report = recovered(h, 2).await;
    assert_open(&report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_costs_nothing() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let mut h = healthy_harness(server.url(), closed()).await;
    h.fault();
    for _ in 0..10 {
        let _: () = server.query(redis::cmd("SCRIPT").arg("FLUSH")).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    h.recovered();
    let report = h.finish(SETTLE).await;
    report.assert_common(2);
    report.assert_breaker_stayed_closed();
    // Every request, during the flushes too, was decided by Redis: the scripts reload.
    report.assert_outcomes(&[Outcome::Decided], Outcome::Decided);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maxmemory_oom() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start_with(free_port(), &["--maxmemory-policy", "noeviction"]);
    let mut h = healthy_harness(server.url(), closed()).await;
    h.fault();
    let set_maxmemory = |bytes: u64| {
        let _: () = server
            .query(redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(bytes))
            .unwrap();
    };
    set_maxmemory(1);
    tokio::time::sleep(HOLD).await;
    set_maxmemory(0);
    let report = recovered(h, 2).await;
    assert_closed(&report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_wrong_type_is_denied_and_repaired_never_a_sick_store() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let store = config(server.url()).prefix("faults").build().unwrap();
    let bad_key = store.state_key(&Key::from(5_u64), &quota());
    let mut h = Harness::new(store, closed(), quota(), keys());
    h.healthy().await;
    h.start_load();
    h.fault();
    // The key is made a list, again and again: each time, a check finds it, is denied, and
    // puts a state of the right shape back.
    let started = Instant::now();
    while started.elapsed() < HOLD {
        let _: i64 = server
            .query(
                redis::cmd("EVAL")
                    .arg("redis.call('DEL', KEYS[1]) return redis.call('LPUSH', KEYS[1], ARGV[1])")
                    .arg(1)
                    .arg(&bad_key)
                    .arg("not a rate-limit state"),
            )
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.recovered();
    let report = h.finish(SETTLE).await;
    report.assert_common(2);
    // One bad key is not a sick store: the breaker stays closed, other keys are decided, and
    // the bad key is denied (never let through, never a 503).
    report.assert_breaker_stayed_closed();
    report.assert_outcomes(&[Outcome::Decided, Outcome::Denied], Outcome::Denied);
    for sample in &report.samples {
        if sample.outcome == Outcome::Denied {
            assert_eq!(sample.key, 5, "only the bad key is denied");
        }
    }
    let kind: String = server.query(redis::cmd("TYPE").arg(&bad_key)).unwrap();
    assert_eq!(kind, "string", "repaired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_exhaustion_behind_a_slow_proxy() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let proxy = Proxy::start(addr(&server)).await;
    let store = config(proxy.url())
        .prefix("faults")
        .pool(2)
        .build()
        .unwrap();
    let mut h = Harness::new(store, closed(), quota(), keys());
    h.healthy().await;
    h.start_load();
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.fault();
    // 16 clients, 2 connections, each reply 80 ms late: most calls wait for a connection
    // past the deadline.
    proxy.set(Fault::Delay(Duration::from_millis(80)));
    tokio::time::sleep(HOLD).await;
    proxy.set(Fault::None);
    let report = recovered(h, 2).await;
    assert_closed(&report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_black_hole_refuse_and_cut() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let proxy = Proxy::start(addr(&server)).await;
    let mut h = healthy_harness(proxy.url(), fallback()).await;
    h.fault();
    proxy.set(Fault::BlackHole);
    tokio::time::sleep(Duration::from_millis(700)).await;
    proxy.set(Fault::Refuse);
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(700)).await;
    proxy.set(Fault::None);
    let report = recovered(h, 2).await;
    assert_fallback(&report);
    assert!(
        proxy.connections() >= 2,
        "the store reconnected after the cut"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_absent_at_start_then_started() {
    let _serial = SERIAL.lock().await;
    let port = free_port();
    let store = config(format!("redis://127.0.0.1:{port}"))
        .prefix("faults")
        .build()
        .unwrap();
    let mut h = Harness::new(store, closed(), quota(), keys());
    h.start_load();
    h.fault();
    tokio::time::sleep(HOLD).await;
    let _server = RedisServer::start_with(port, &[]);
    h.recovered();
    let report = h.finish(SETTLE).await;
    // The baseline was taken before any connection existed: allow for the connection the
    // store now holds and attempts still closing (a leak would grow with the 20,000 requests).
    report.assert_common(6);
    report.assert_breaker_opened();
    assert_closed(&report);
}

fn addr(server: &RedisServer) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], server.port()))
}

/// The cluster slot of a store key (CRC16 of its hash tag), asked of the cluster itself.
fn slot(cluster: &RedisCluster, state_key: &[u8]) -> u16 {
    cluster
        .query(0, redis::cmd("CLUSTER").arg("KEYSLOT").arg(state_key))
        .unwrap()
}

/// Keys (numbers) whose state lives on master `node`.
fn keys_on(cluster: &RedisCluster, store: &RedisStore, node: usize) -> Vec<u64> {
    (1..10_000_u64)
        .filter(|&n| {
            let slot = slot(cluster, &store.state_key(&Key::from(n), &quota()));
            cluster.master_of(slot, 0).map(|m| m.0) == Some(node)
        })
        .take(4)
        .collect()
}

fn cluster_store(cluster: &RedisCluster, deadline: Duration) -> RedisStore {
    RedisConfig::cluster(cluster.urls())
        .timeout(deadline)
        .connect_timeout(Duration::from_millis(200))
        .prefix("faults")
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_killed_then_failover() {
    let _serial = SERIAL.lock().await;
    let mut cluster = RedisCluster::start();
    let store = cluster_store(&cluster, harness::DEADLINE);
    let (victim, _) = cluster.master_of(0, 0).unwrap();
    // Every client's key lives on the master about to die (the first is used twice: the
    // harness's key 0 is the allowlisted one).
    let mut keys = keys_on(&cluster, &store, victim);
    keys.insert(0, keys[0]);
    let victim_slot = slot(&cluster, &store.state_key(&Key::from(keys[1]), &quota()));
    // A counted key on the victim too, checked every 5 ms until the kill: what asynchronous
    // replication had not yet carried to the replica is lost with the master.
    // 100/h: one unit refills in 36 s, so the state still holds what it counted after the
    // failover (a faster quota's state would expire, being fresh again).
    let counted = Quota::per_hour(100).unwrap();
    let counted_key = Key::from(keys[1]);
    let h_store = store.clone();
    let mut h = Harness::new(store, FailureMode::open(), quota(), keys);
    h.healthy().await;
    h.start_load();
    let mut admitted = 0_u64;
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        admitted += u64::from(
            h_store
                .check(&counted_key, &counted, 1)
                .await
                .unwrap()
                .is_allowed(),
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    h.fault();
    cluster.kill(victim);
    // A replica takes over once the others agree the master failed (cluster-node-timeout 2 s).
    let survivor = (victim + 1) % 3;
    let started = Instant::now();
    while cluster
        .master_of(victim_slot, survivor)
        .is_none_or(|m| m.0 == victim)
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no failover in 20 s: {}",
            cluster
                .query::<String>(survivor, redis::cmd("CLUSTER").arg("NODES"))
                .unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let failover = started.elapsed();
    h.recovered();
    let report = h.finish(SETTLE).await;
    // The cluster client holds a connection per node, and reconnects to the new master.
    report.assert_common(6);
    report.assert_breaker_opened();
    assert_open(&report);
    let left = h_store
        .peek(&counted_key, &counted)
        .await
        .unwrap()
        .info()
        .remaining();
    // At most one unit refilled since the first check.
    let lost = admitted.saturating_sub(100 - left + 1);
    eprintln!(
        "failover took {failover:?}; the store decided again {:?} after it; {lost} of {admitted} units admitted before the kill were lost with the master",
        report.resumed_after
    );
    // A replica is promoted once the others agree the master failed: the node timeout (2 s),
    // the failure reports' gossip, the replica's election delay (0.5-1 s) and the news of
    // it reaching the node asked (3.7-4.1 s measured here): the node timeout and 3 s.
    assert!(
        failover <= Duration::from_secs(5),
        "failover took {failover:?}"
    );
    // What asynchronous replication loses is what the replica had not received when the
    // master died: nothing bounds it but the replica's lag (0 of 45-47 units in most runs
    // here, 45 of 46 in one, a replica behind by the whole 300 ms under this test's load).
    // It is measured and printed, not bounded: the crate docs say so.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_slot_migration_under_load_keeps_the_count() {
    let _serial = SERIAL.lock().await;
    let cluster = RedisCluster::start();
    // While the slot moves, the cluster client follows MOVED with a slot-map refresh and
    // retries that can take a few hundred milliseconds: this test is about the count, so its
    // deadline is generous (a 50 ms deadline would answer those few by the failure mode).
    let deadline = Duration::from_secs(1);
    let store = cluster_store(&cluster, deadline);
    let limit = Quota::per_minute(100).unwrap();
    let key = 7_u64;
    let state_key = store.state_key(&Key::from(key), &limit);
    let key_slot = slot(&cluster, &state_key);
    let (from, _) = cluster.master_of(key_slot, 0).unwrap();
    // Another master: the one serving slot 0 or, if that is `from`, slot 16383.
    let to = [0, 16_383]
        .into_iter()
        .map(|slot| cluster.master_of(slot, 0).unwrap().0)
        .find(|&n| n != from)
        .unwrap();
    // Neighbours in the same slot, so that the migration takes many batches.
    let state_key = String::from_utf8(state_key).unwrap();
    let tag = &state_key[state_key.find('{').unwrap()..=state_key.find('}').unwrap()];
    for n in 0..300 {
        let _: () = cluster
            .query(
                from,
                redis::cmd("SET").arg(format!("filler:{tag}:{n}")).arg(n),
            )
            .unwrap();
    }
    let mut h = Harness::new(store, FailureMode::closed(), limit, vec![key]);
    h.healthy().await;
    h.start_load();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.fault();
    cluster.migrate_slot(key_slot, from, to, Duration::from_millis(20));
    h.recovered();
    assert_eq!(
        cluster.master_of(key_slot, 0).unwrap().0,
        to,
        "the slot moved"
    );
    let report = h.finish(SETTLE).await;
    let elapsed = started.elapsed();
    report.assert_common_within(6, deadline);
    // Redirections are followed: no request failed, the breaker never opened...
    report.assert_breaker_stayed_closed();
    report.assert_outcomes(&[Outcome::Decided, Outcome::Denied], Outcome::Denied);
    // ...and the key's state moved with its slot: no second quota on the new node.
    let tally = Report::tally(report.samples.iter());
    let admitted = tally.get(&Outcome::Decided).copied().unwrap_or(0) + 1; // + healthy()'s
    let refill = (elapsed.as_secs_f64() * 100.0 / 60.0).ceil() as usize;
    assert!(
        admitted <= 100 + refill,
        "{admitted} admitted in {elapsed:?} under 100/min: {tally:?}"
    );
}

/// Runs `cmd` on a connection to `port` authenticated with `url`'s credentials.
fn query_as<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> T {
    let mut connection = redis::Client::open(url)
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap();
    cmd.query(&mut connection).unwrap()
}

/// A store that cannot authenticate (or has no permission, or no room): the breaker opens
/// (these failures are the store's, not one request's), the failure mode answers, a metric
/// and a log say why; once the server is fixed, Redis decides again without a restart.
async fn refused_until_fixed(
    store_url: String,
    kinds: &[ratewarden_core::StoreErrorKind],
    fix: impl FnOnce(),
) {
    let recorder = harness::metrics();
    let before: u64 = kinds.iter().map(|&kind| recorder.failures(kind)).sum();
    let store = config(store_url).prefix("faults").build().unwrap();
    let mut h = Harness::new(store, closed(), quota(), keys());
    h.start_load();
    h.fault();
    tokio::time::sleep(HOLD).await;
    fix();
    h.recovered();
    let report = h.finish(SETTLE).await;
    report.assert_common(6);
    report.assert_breaker_opened();
    assert_closed(&report);
    assert!(
        kinds.iter().any(|kind| report.errors.contains_key(kind)),
        "{:?}",
        report.errors
    );
    let after: u64 = kinds.iter().map(|&kind| recorder.failures(kind)).sum();
    eprintln!("ratewarden_store_failures_total {kinds:?}: {before} before, {after} after");
    assert!(
        after > before,
        "ratewarden_store_failures_total{{kind={kinds:?}}} did not count"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_the_store_lacks_fails_the_store_until_fixed() {
    // Reproduced: NOAUTH was a script error, which the breaker did not count: it stayed
    // closed, readiness said healthy, and the default failure mode let everything through.
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start_with(free_port(), &["--requirepass", "secret"]);
    let admin = format!("redis://:secret@127.0.0.1:{}", server.port());
    refused_until_fixed(
        server.url(),
        &[ratewarden_core::StoreErrorKind::Unauthorized],
        || {
            let _: () = query_as(
                &admin,
                redis::cmd("CONFIG").arg("SET").arg("requirepass").arg(""),
            );
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_fails_the_store_until_fixed() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start_with(free_port(), &["--requirepass", "secret"]);
    let admin = format!("redis://:secret@127.0.0.1:{}", server.port());
    let wrong = format!("redis://:wrong@127.0.0.1:{}", server.port());
    refused_until_fixed(
        wrong,
        &[ratewarden_core::StoreErrorKind::Unauthorized],
        || {
            // The server now takes the password the store has.
            let _: () = query_as(
                &admin,
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("requirepass")
                    .arg("wrong"),
            );
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_script_permission_fails_the_store_until_granted() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let _: () = server
        .query(
            redis::cmd("ACL")
                .arg("SETUSER")
                .arg("limited")
                .arg("on")
                .arg(">pw")
                .arg("~*")
                .arg("+@all")
                // Scripts and functions alike: a user allowed either is served.
                .arg("-@scripting"),
        )
        .unwrap();
    let limited = format!("redis://limited:pw@127.0.0.1:{}", server.port());
    refused_until_fixed(
        limited,
        &[ratewarden_core::StoreErrorKind::Unauthorized],
        || {
            let _: () = server
                .query(
                    redis::cmd("ACL")
                        .arg("SETUSER")
                        .arg("limited")
                        .arg("+@scripting"),
                )
                .unwrap();
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_no_room_for_a_client_fails_the_store_until_fixed() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start_with(free_port(), &["--maxclients", "1"]);
    // The one client the server takes.
    let mut held = redis::Client::open(server.url())
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap();
    let _: String = redis::cmd("PING").query(&mut held).unwrap();
    // Refused at once, or waited for until the deadline while the client retries: either.
    let kinds = [
        ratewarden_core::StoreErrorKind::Connection,
        ratewarden_core::StoreErrorKind::Timeout,
    ];
    refused_until_fixed(server.url(), &kinds, move || {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxclients")
            .arg(100)
            .query(&mut held)
            .unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_demoted_behind_its_address_is_left_for_the_new_master() {
    // Reproduced: after a failover behind a DNS name or VIP, the store kept talking to the
    // demoted server (READONLY forever): its connection was fine, so it never reconnected.
    let _serial = SERIAL.lock().await;
    let old = RedisServer::start();
    let new = RedisServer::start();
    let proxy = Proxy::start(addr(&old)).await;
    let mut h = healthy_harness(proxy.url(), fallback()).await;
    h.fault();
    // The address moves to the new server, and the old one follows it as a replica.
    proxy.retarget(addr(&new));
    let _: () = old
        .query(redis::cmd("REPLICAOF").arg("127.0.0.1").arg(new.port()))
        .unwrap();
    tokio::time::sleep(HOLD).await;
    h.recovered();
    let report = h.finish(SETTLE).await;
    report.assert_common(4);
    assert_fallback(&report);
    // The store left the demoted server at its first READONLY replies: the breaker opens only
    // when enough checks were in flight to fail at once, and need not.
    let read_only = report
        .errors
        .get(&ratewarden_core::StoreErrorKind::ReadOnly);
    assert!(read_only.is_some(), "{:?}", report.errors);
    // Decided by the new server now.
    assert!(new.script_calls() > 0, "the new master was never asked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_never_cross_between_requests_after_sigstop_and_sigcont() {
    // Every key has spent a different number of units: a reply meant for one key, given to
    // another, shows in its remaining count.
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let store = config(server.url()).prefix("cross").build().unwrap();
    let quota = Quota::per_hour(100).unwrap();
    let keys: Vec<Key> = (0..32_u64).map(Key::from).collect();
    for (spent, key) in keys.iter().enumerate() {
        for _ in 0..spent {
            assert!(store.check(key, &quota, 1).await.unwrap().is_allowed());
        }
    }
    let ask =
        |store: RedisStore, key: Key| async move { (store.check(&key, &quota, 0).await, key) };
    server.freeze();
    // These wait on a frozen server: they time out, and their replies come late.
    let waiting: Vec<_> = keys
        .iter()
        .map(|key| tokio::spawn(ask(store.clone(), key.clone())))
        .collect();
    for task in waiting {
        let (result, _) = task.await.unwrap();
        assert!(result.unwrap_err().is_timeout());
    }
    server.thaw();
    // The late replies arrive now, while these are asked: each gets its own.
    for round in 0..20 {
        let asked: Vec<_> = keys
            .iter()
            .map(|key| tokio::spawn(ask(store.clone(), key.clone())))
            .collect();
        for task in asked {
            let (result, key) = task.await.unwrap();
            let Ok(decision) = result else { continue };
            let KeyRepr::Int(spent) = key.repr() else {
                unreachable!()
            };
            assert_eq!(
                decision.info().remaining(),
                100 - spent,
                "round {round}: the reply for key {spent} was another's"
            );
        }
    }
}

/// A cluster of which two of three masters freeze (a majority: no failover can happen)
/// answers `CLUSTERDOWN` or not at all: the breaker opens, the failure mode answers within the
/// deadline throughout, and Redis decides again once they thaw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_loses_its_majority_then_gets_it_back() {
    let _serial = SERIAL.lock().await;
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster, harness::DEADLINE);
    let masters: Vec<usize> = [0_u16, 8_192, 16_383]
        .iter()
        .filter_map(|&slot| cluster.master_of(slot, 0).map(|m| m.0))
        .collect();
    let mut h = Harness::new(store, fallback(), quota(), keys());
    h.healthy().await;
    h.start_load();
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.fault();
    cluster.freeze(masters[1]);
    cluster.freeze(masters[2]);
    // Past the node timeout (2 s), the survivors declare the cluster down.
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    cluster.thaw(masters[1]);
    cluster.thaw(masters[2]);
    let started = Instant::now();
    while !cluster
        .on_every_node("CLUSTER INFO\r\n")
        .iter()
        .all(|info| info.contains("cluster_state:ok"))
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the cluster stayed down"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    h.recovered();
    let report = h.finish(SETTLE).await;
    report.assert_common(6);
    // Keys on the master still up are decided while the breaker is closed, so the breaker
    // opens and closes: no bound on the failed calls, only that it opened.
    report.assert_breaker_opened_at_least_once();
    assert_fallback(&report);
}

/// A master killed and started again at once (before any failover), under load: the failure
/// mode answers while it is away, Redis decides again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_restarted_under_load() {
    let _serial = SERIAL.lock().await;
    let mut cluster = RedisCluster::start();
    let store = cluster_store(&cluster, harness::DEADLINE);
    let (victim, _) = cluster.master_of(0, 0).unwrap();
    let mut keys = keys_on(&cluster, &store, victim);
    keys.insert(0, keys[0]);
    let mut h = Harness::new(store, FailureMode::open(), quota(), keys);
    h.healthy().await;
    h.start_load();
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.fault();
    cluster.restart(victim);
    tokio::time::sleep(HOLD).await;
    h.recovered();
    let report = h.finish(SETTLE).await;
    report.assert_common(6);
    assert_open(&report);
}

/// What one client, asking every 20 ms for `run`, is admitted through a layer on `store` with
/// the default failure mode (a local fallback enforcing the whole quota), while `flap`
/// switches the proxy between forwarding and a black hole every 500 ms: the times admitted.
async fn admitted_while_flapping<St>(
    store: St,
    proxy: &Proxy,
    quota: Quota,
    run: Duration,
) -> Vec<Instant>
where
    St: Store + Send + Sync + 'static,
{
    use tower::{Service, ServiceExt};
    let layer = ratewarden_tower::RateLimitLayer::new(store, quota, |_: &http::Request<()>| {
        Some(Key::from("flapping"))
    });
    let mut service = tower::Layer::layer(&layer, tower::service_fn(ok));
    let start = Instant::now();
    let mut admitted = Vec::new();
    let mut blackholed = false;
    let mut next_flip = start + Duration::from_millis(500);
    while start.elapsed() < run {
        if Instant::now() >= next_flip {
            blackholed = !blackholed;
            proxy.set(if blackholed {
                Fault::BlackHole
            } else {
                Fault::None
            });
            if !blackholed {
                proxy.cut();
            }
            next_flip += Duration::from_millis(500);
        }
        let asked = Instant::now();
        let response = service
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(()))
            .await
            .unwrap();
        if response.status().is_success() {
            admitted.push(asked);
        }
        tokio::time::sleep_until((asked + Duration::from_millis(20)).into()).await;
    }
    proxy.set(Fault::None);
    admitted
}

/// The most of `times` within any `window`.
fn busiest(times: &[Instant], window: Duration) -> usize {
    (0..times.len())
        .map(|i| {
            times[i..]
                .iter()
                .take_while(|&&t| t - times[i] < window)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_redis_never_lets_a_gateway_spend_the_quota_twice() {
    // Reproduced: the fallback and Redis each kept a count of their own, each refilling while
    // the other decided, so a gateway switching between them spent both: 80 admitted in 10 s
    // of `5/s burst 10` without a breaker, 68-79 with the default one, where the quota allows
    // 61 (71 with the extra burst a first failure may hand out).
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let quota = Quota::per_second(5).unwrap().with_burst(10).unwrap();
    let run = Duration::from_secs(10);
    // The quota over the run, and the one extra burst the first failure may hand out.
    let bound = 10 + 5 * 10 + 1 + 10;
    for breaker in [false, true] {
        let proxy = Proxy::start(addr(&server)).await;
        let prefix = if breaker { "flap-breaker" } else { "flap" };
        let store = config(proxy.url())
            .prefix(prefix)
            .deny_cache(0)
            .build()
            .unwrap();
        let admitted = if breaker {
            let breaker = ratewarden_tower::breaker::CircuitBreaker::new(store);
            admitted_while_flapping(breaker, &proxy, quota, run).await
        } else {
            admitted_while_flapping(store, &proxy, quota, run).await
        };
        let second = busiest(&admitted, Duration::from_secs(1));
        eprintln!(
            "breaker {breaker}: {} admitted in 10 s (bound {bound}), busiest second {second}",
            admitted.len()
        );
        assert!(
            admitted.len() <= bound,
            "breaker {breaker}: {} admitted",
            admitted.len()
        );
        // Any second: the burst, a second's rate, and the extra burst.
        assert!(
            second <= 10 + 5 + 1 + 10,
            "breaker {breaker}: {second} in one second"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_burst_is_held_to_the_fallbacks_limit() {
    use tower::{Service, ServiceExt};
    let _serial = SERIAL.lock().await;
    let mut server = RedisServer::start();
    let store = config(server.url())
        .prefix("outage")
        .deny_cache(0)
        .build()
        .unwrap();
    let breaker = ratewarden_tower::breaker::CircuitBreaker::new(store);
    // 10/s, burst 10; the default failure mode: a local fallback enforcing the whole quota.
    let quota = Quota::per_second(10).unwrap().with_burst(10).unwrap();
    let layer = ratewarden_tower::RateLimitLayer::new(breaker, quota, |_: &http::Request<()>| {
        Some(Key::from("outage"))
    });
    let mut service = tower::Layer::layer(&layer, tower::service_fn(ok));
    // One request every 10 ms: 100/s against 10/s. A second healthy, then 3 s of outage.
    let mut ask = async |for_: Duration| {
        let (mut admitted, mut denied) = (0_u32, 0_u32);
        let start = Instant::now();
        while start.elapsed() < for_ {
            let asked = Instant::now();
            let response = (service.ready().await.unwrap())
                .call(http::Request::new(()))
                .await
                .unwrap();
            if response.status().is_success() {
                admitted += 1;
            } else {
                denied += 1;
            }
            tokio::time::sleep_until((asked + Duration::from_millis(10)).into()).await;
        }
        (admitted, denied)
    };
    let healthy = ask(Duration::from_secs(1)).await;
    server.kill();
    let outage = Duration::from_secs(3);
    let (admitted, denied) = ask(outage).await;
    eprintln!(
        "healthy: {healthy:?} (admitted, denied); Redis killed for 3 s: {admitted} admitted, {denied} denied"
    );
    // The fallback starts empty (the documented extra burst), then holds the quota:
    // burst + rate × 3 s, and one at the edge.
    assert!(
        admitted <= 10 + 10 * 3 + 1,
        "{admitted} admitted in the outage"
    );
    // It decided, and its limit was reached: most requests were denied.
    assert!(
        admitted >= 10 * 3 - 5,
        "{admitted} admitted: the fallback did not decide"
    );
    assert!(
        denied > admitted,
        "the fallback's limit was never reached: {denied} denied"
    );
}

/// The service behind the layer: every request answered `200`.
async fn ok(_: http::Request<()>) -> Result<http::Response<String>, std::convert::Infallible> {
    Ok(http::Response::new(String::new()))
}
