//! Reservations in Redis (`Store::reserve`, `settle`, `refund`): holds in each key's ledger,
//! each lapsing at its own time; concurrent gateways on one key; a gateway killed holding
//! reservations.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratewarden_core::{Algorithm, Key, Limit, Quota, Store};
use tests::redis_server::{RedisCluster, RedisServer};

use super::store;

/// The units held in Redis now, under `prefix`: every live hold of every ledger, read from
/// the server itself.
fn held_in_redis(query: impl Fn(&redis::Cmd) -> redis::Value, prefix: &str) -> u64 {
    let names = match query(redis::cmd("KEYS").arg(format!("{prefix}:*:h"))) {
        redis::Value::Array(names) => names,
        other => panic!("KEYS: {other:?}"),
    };
    let now_us = {
        let redis::Value::Array(time) = query(&redis::cmd("TIME")) else {
            panic!("TIME");
        };
        let part = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => std::str::from_utf8(b).unwrap().parse::<u64>().unwrap(),
            other => panic!("{other:?}"),
        };
        part(&time[0]) * 1_000_000 + part(&time[1])
    };
    let mut held = 0;
    for name in names {
        let redis::Value::BulkString(name) = name else {
            panic!("a key name");
        };
        let fields: Vec<(String, String)> =
            redis::from_redis_value(query(redis::cmd("HGETALL").arg(name))).unwrap();
        for (field, value) in fields {
            if field == "d" {
                continue;
            }
            // units:lapse_at:hold
            let parts: Vec<u64> = value.split(':').map(|n| n.parse().unwrap()).collect();
            if parts[1] > now_us {
                held += parts[0];
            }
        }
    }
    held
}

fn server_query(server: &RedisServer) -> impl Fn(&redis::Cmd) -> redis::Value + '_ {
    |cmd| server.query(cmd).unwrap()
}

#[tokio::test]
async fn every_algorithm_reserves_settles_and_refunds_in_redis() {
    let server = RedisServer::start();
    let store = store(&server, "rv-alg").await;
    for algorithm in Algorithm::ALL {
        let quota: Quota = format!("10/h {algorithm}").parse().unwrap();
        let key = Key::from(format!("k-{algorithm}").as_str());
        let limit = Limit::new(key.clone(), quota, 6);
        let hold = Duration::from_secs(30);
        let reserve = || store.reserve(std::slice::from_ref(&limit), hold);
        let a = reserve().await.unwrap();
        assert!(a.is_allowed(), "{algorithm}");
        assert!(
            !reserve().await.unwrap().is_allowed(),
            "{algorithm}: 6 held"
        );
        store.settle(a, 2).await.unwrap();
        let b = reserve().await.unwrap();
        assert!(b.is_allowed(), "{algorithm}: 2 settled + 6 held");
        store.settle(b, 8).await.unwrap(); // 10 charged in all
        let one = Limit::new(key.clone(), quota, 1);
        let reserve_one = || store.reserve(std::slice::from_ref(&one), hold);
        assert!(!reserve_one().await.unwrap().is_allowed(), "{algorithm}");
        tokio::time::sleep(Duration::from_millis(2)).await;
        store.refund(&key, &quota, 1).await.unwrap();
        let refunded = reserve_one().await.unwrap();
        // The sliding log gives back debt only (it had none), its entries being older.
        assert_eq!(
            refunded.is_allowed(),
            algorithm != Algorithm::SlidingLog,
            "{algorithm}"
        );
        store.release(refunded).await.unwrap();
        // Checks count apart: the key's own state is untouched.
        assert!(
            store.check(&key, &quota, 10).await.unwrap().is_allowed(),
            "{algorithm}"
        );
    }
    assert_eq!(held_in_redis(server_query(&server), "rv-alg"), 0);
}

#[tokio::test]
async fn a_denied_reservation_holds_nothing_and_debt_is_repaid_first() {
    let server = RedisServer::start();
    let store = store(&server, "rv-deny").await;
    let key = Key::from("u");
    let (big, small) = (Quota::per_hour(100).unwrap(), Quota::per_hour(3).unwrap());
    let limits = [
        Limit::new(key.clone(), big, 2),
        Limit::new(key.clone(), small, 2),
    ];
    let hold = Duration::from_secs(30);
    let first = store.reserve(&limits, hold).await.unwrap();
    assert!(first.is_allowed());
    let second = store.reserve(&limits, hold).await.unwrap();
    assert!(!second.is_allowed());
    assert_eq!(second.decisions().binding().map(|(i, _)| i), Some(1));
    assert_eq!(
        held_in_redis(server_query(&server), "rv-deny"),
        4,
        "only the first's holds"
    );
    // 2 estimated, 5 used on the small limit of 3: 2 owed; nothing is admitted after.
    store.settle(first, 5).await.unwrap();
    let one = Limit::new(key.clone(), small, 1);
    assert!(
        !store
            .reserve(std::slice::from_ref(&one), hold)
            .await
            .unwrap()
            .is_allowed()
    );
    // Giving back the 2 owed and 1 more makes room for one.
    store.refund(&key, &small, 3).await.unwrap();
    let again = store
        .reserve(std::slice::from_ref(&one), hold)
        .await
        .unwrap();
    assert!(again.is_allowed());
    store.release(again).await.unwrap();
}

/// Four gateways (stores) of 8 tasks each reserve and settle on one key, settling at most
/// their estimate: the units settled are exactly the quota (refunds credited, never over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_gateways_settle_exactly_the_quota() {
    let server = RedisServer::start();
    let quota = Quota::per_hour(500).unwrap();
    let key = Key::from("tenant");
    let settled = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for gateway in 0..4_u32 {
        let store = store(&server, "rv-race").await;
        for task in 0..8_u32 {
            let (store, key, settled) = (store.clone(), key.clone(), Arc::clone(&settled));
            tasks.push(tokio::spawn(async move {
                let mut denied_idle = 0;
                for i in 0..200_u32 {
                    let estimate = 1 + (i + task + gateway) % 5;
                    let limit = Limit::new(key.clone(), quota, estimate);
                    let r = store
                        .reserve(&[limit], Duration::from_secs(60))
                        .await
                        .unwrap();
                    if r.is_allowed() {
                        denied_idle = 0;
                        let actual = (i * 3 + task) % (estimate + 1);
                        settled.fetch_add(u64::from(actual), Ordering::SeqCst);
                        store.settle(r, actual).await.unwrap();
                    } else {
                        denied_idle += 1;
                        if denied_idle > 20 {
                            break;
                        }
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let settled = settled.load(Ordering::SeqCst);
    assert!(
        settled <= 501,
        "{settled} settled of 500 (one unit may refill in a run)"
    );
    assert!(
        settled >= 490,
        "only {settled} of 500 settled: quota thrown away"
    );
    assert_eq!(held_in_redis(server_query(&server), "rv-race"), 0);
}

#[tokio::test]
async fn holds_never_settled_lapse_each_at_its_time_while_others_come_and_go() {
    let server = RedisServer::start();
    let store = store(&server, "rv-lapse").await;
    let quota = Quota::per_hour(100).unwrap();
    let key = Key::from("crashed");
    let one = Limit::new(key.clone(), quota, 1);
    // 90 holds never settled (a future dropped, a gateway gone), for a second.
    for _ in 0..90 {
        let r = store
            .reserve(std::slice::from_ref(&one), Duration::from_secs(1))
            .await
            .unwrap();
        assert!(r.is_allowed());
        std::mem::forget(r);
    }
    assert_eq!(held_in_redis(server_query(&server), "rv-lapse"), 90);
    // Meanwhile others keep reserving and settling nothing, with longer holds: the 90 lapse
    // at their own time all the same.
    let start = Instant::now();
    let mut live = Vec::new();
    while start.elapsed() < Duration::from_millis(1_300) {
        let r = store
            .reserve(std::slice::from_ref(&one), Duration::from_secs(60))
            .await
            .unwrap();
        if r.is_allowed() {
            live.push(r);
        }
        if live.len() > 5 {
            store.release(live.remove(0)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for r in live {
        store.release(r).await.unwrap();
    }
    assert_eq!(
        held_in_redis(server_query(&server), "rv-lapse"),
        0,
        "0 units held after the hold time"
    );
    let all = Limit::new(key, quota, 100);
    let r = store.reserve(&[all], Duration::from_secs(1)).await.unwrap();
    assert!(r.is_allowed(), "the whole quota is back");
    store.release(r).await.unwrap();
}

#[tokio::test]
async fn dropped_reservation_futures_hold_nothing_after_the_hold_time() {
    let server = RedisServer::start();
    let store = store(&server, "rv-drop").await;
    let quota = Quota::per_hour(50).unwrap();
    let limit = Limit::new(Key::from("k"), quota, 1);
    // Futures dropped at every point of their call: some reach Redis, some do not.
    for i in 0..100_u64 {
        let reserve = store.reserve(std::slice::from_ref(&limit), Duration::from_millis(800));
        let _ = tokio::time::timeout(Duration::from_micros(i * 20), reserve).await;
    }
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(held_in_redis(server_query(&server), "rv-drop"), 0);
    let all = Limit::new(Key::from("k"), quota, 50);
    let r = store.reserve(&[all], Duration::from_secs(1)).await.unwrap();
    assert!(
        r.is_allowed(),
        "nothing was charged by the dropped reservations"
    );
    store.release(r).await.unwrap();
}

/// A gateway process killed with 100 reservations outstanding: every one is free again
/// within its hold time, checked in Redis.
#[tokio::test]
async fn a_gateway_killed_holding_100_reservations_gives_them_back_within_the_hold() {
    let server = RedisServer::start();
    let hold = Duration::from_secs(2);
    let mut child = Command::new(env!("CARGO_BIN_EXE_reserving_gateway"))
        .env("REDIS_URL", server.url())
        .env("PREFIX", "rv-kill")
        .env("QUOTA", "100/h")
        .env("KEY", "tenant")
        .env("HOLD_MS", hold.as_millis().to_string())
        .env("COUNT", "100")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held 100");
    let held_at = Instant::now();
    child.kill().unwrap();
    child.wait().unwrap();
    let store = store(&server, "rv-kill").await;
    let quota: Quota = "100/h".parse().unwrap();
    let one = Limit::new(Key::from("tenant"), quota, 1);
    assert!(
        !store
            .reserve(std::slice::from_ref(&one), hold)
            .await
            .unwrap()
            .is_allowed()
    );
    assert_eq!(held_in_redis(server_query(&server), "rv-kill"), 100);
    tokio::time::sleep(hold.saturating_sub(held_at.elapsed())).await;
    assert_eq!(held_in_redis(server_query(&server), "rv-kill"), 0);
    let all = Limit::new(Key::from("tenant"), quota, 100);
    let r = store.reserve(&[all], hold).await.unwrap();
    assert!(r.is_allowed(), "all 100 came back");
    store.release(r).await.unwrap();
}

/// On a 3+3 cluster, limits of keys in different slots are held together or not at all.
#[tokio::test]
async fn a_reservation_across_cluster_slots_holds_all_or_nothing() {
    let cluster = RedisCluster::start();
    let store = ratewarden_redis::RedisConfig::cluster(cluster.urls())
        .prefix("rv-cl")
        .connect()
        .await
        .unwrap();
    let hold = Duration::from_secs(30);
    let quota = Quota::per_hour(5).unwrap();
    // Keys spread over the slots: one of them fills up first.
    let limits: Vec<Limit> = (0..6_u64)
        .map(|i| Limit::new(Key::from(i), quota, 1 + u32::from(i == 3)))
        .collect();
    let mut admitted = 0;
    for _ in 0..5 {
        if store.reserve(&limits, hold).await.unwrap().is_allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 2, "key 3 holds 2 a request: 2 requests fit its 5");
    // The denied ones released every slot: each other key holds exactly 2.
    for i in [0_u64, 1, 2, 4, 5] {
        let three = Limit::new(Key::from(i), quota, 3);
        let r = store
            .reserve(std::slice::from_ref(&three), hold)
            .await
            .unwrap();
        assert!(r.is_allowed(), "key {i} has 3 left");
        store.release(r).await.unwrap();
        let four = Limit::new(Key::from(i), quota, 4);
        assert!(
            !store.reserve(&[four], hold).await.unwrap().is_allowed(),
            "key {i}"
        );
    }
}

#[tokio::test]
async fn reservations_run_on_a_server_without_functions() {
    let server = RedisServer::start_without_functions();
    let store = store(&server, "rv-nofn").await;
    let limit = Limit::new(Key::from("k"), Quota::per_hour(3).unwrap(), 2);
    let r = store
        .reserve(std::slice::from_ref(&limit), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(r.is_allowed());
    assert!(
        !store
            .reserve(std::slice::from_ref(&limit), Duration::from_secs(5))
            .await
            .unwrap()
            .is_allowed()
    );
    store.settle(r, 1).await.unwrap();
    assert!(
        store
            .reserve(&[limit], Duration::from_secs(5))
            .await
            .unwrap()
            .is_allowed()
    );
}

/// The tower layer's `count_if` on Redis: only failed logins count, settled on a task.
#[tokio::test]
async fn failed_logins_count_through_redis() {
    use axum::Router;
    use axum::routing::post;
    use http::{Request, Response, StatusCode};
    use tower::ServiceExt;

    let server = RedisServer::start();
    let store = store(&server, "rv-login").await;
    let layer = ratewarden_tower::RateLimitLayer::new(
        store,
        Quota::per_minute(3).unwrap(),
        ratewarden_tower::key::Global,
    )
    .count_if(|r: &Response<axum::body::Body>| r.status() == StatusCode::UNAUTHORIZED);
    let app = Router::new()
        .route(
            "/login",
            post(|uri: http::Uri| async move {
                if uri.query() == Some("ok=1") {
                    StatusCode::OK
                } else {
                    StatusCode::UNAUTHORIZED
                }
            }),
        )
        .layer(layer);
    let login = |ok: bool| {
        Request::post(format!("/login?ok={}", u8::from(ok)))
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let status = |ok| {
        let app = app.clone();
        async move { app.oneshot(login(ok)).await.unwrap().status() }
    };
    for i in 0..20 {
        assert_eq!(status(true).await, StatusCode::OK, "success {i}");
    }
    for _ in 0..3 {
        assert_eq!(status(false).await, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(status(true).await, StatusCode::TOO_MANY_REQUESTS);
    // The last settle runs on a task of its own.
    for _ in 0..100 {
        if held_in_redis(server_query(&server), "rv-login") == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("a hold was never settled");
}

/// `lua/reserve.lua` against ratewarden-core's `Ledger`, step by step on test time: 3,000
/// random reservations and settles (`actual` up to 3 × the estimate, debt included) per
/// algorithm decide alike, with the same remaining count.
#[tokio::test]
async fn reservations_in_redis_decide_as_the_core_ledger_does() {
    use ratewarden_core::Timestamp;
    use ratewarden_core::algorithm::{
        AlgorithmState, FixedWindowState, GcraState, Hold, Ledger, SlidingLogState,
        SlidingWindowState, TokenBucketState,
    };

    async fn run<S: AlgorithmState>(store: &ratewarden_redis::RedisStore, text: &str, seed: u64) {
        let quota: Quota = text.parse().unwrap();
        let key = Key::from(text);
        let mut ledger = Ledger::<S>::default();
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut now = 1_700_000_000_000_000_u64;
        let hold = Duration::from_secs(86_400);
        let mut open: Vec<(ratewarden_core::Reservation, Hold, u32)> = Vec::new();
        let (mut admitted, mut denied) = (0, 0);
        for step in 0..3_000 {
            now += rng.u64(0..=quota.emission_interval_micros() * 2);
            let at = Timestamp::from_micros(now);
            if open.len() < 4 && rng.bool() {
                let estimate = rng.u32(1..=5);
                let limit = Limit::new(key.clone(), quota, estimate);
                let theirs = store.reserve_at(&[limit], hold, at).await.unwrap();
                let (ours, hold) = ledger.reserve(at, estimate, at.saturating_add(hold), &quota);
                let got = theirs.decisions().as_slice()[0];
                assert_eq!(
                    got.is_allowed(),
                    ours.is_allowed(),
                    "{text} step {step}: {got:?} vs {ours:?}"
                );
                if ours.is_allowed() {
                    assert_eq!(
                        got.info().remaining(),
                        ours.info().remaining(),
                        "{text} step {step}"
                    );
                    admitted += 1;
                    open.push((theirs, hold.unwrap(), estimate));
                } else {
                    denied += 1;
                }
            } else if !open.is_empty() {
                let (theirs, hold, estimate) = open.swap_remove(rng.usize(..open.len()));
                let actual = rng.u32(0..=estimate * 3);
                store.settle_at(theirs, actual, at).await.unwrap();
                ledger.settle(at, hold, actual, &quota);
            }
        }
        assert!(
            admitted > 300 && denied > 100,
            "{text}: {admitted} admitted, {denied} denied"
        );
    }

    let server = RedisServer::start();
    let store = store(&server, "rv-diff").await;
    run::<GcraState>(&store, "20/min", 1).await;
    run::<TokenBucketState>(&store, "20/min token-bucket", 2).await;
    run::<FixedWindowState>(&store, "20/min fixed-window", 3).await;
    run::<SlidingWindowState>(&store, "20/min sliding-window", 4).await;
    run::<SlidingLogState>(&store, "20/min sliding-log", 5).await;
}

/// A settle of centuries of debt (`u32::MAX` units on `1/day`) leaves the key denied, with
/// its retry, never failing: Redis keeps the hash for as long as an expiry can say, and the
/// retry stays a number a reply holds.
#[tokio::test]
async fn a_debt_of_centuries_denies_and_never_fails() {
    let server = RedisServer::start();
    let store = store(&server, "rv-huge").await;
    let quota = Quota::per_day(1).unwrap();
    let key = Key::from("k");
    let one = Limit::new(key.clone(), quota, 1);
    for actual in [200_000, u32::MAX] {
        let r = store
            .reserve(std::slice::from_ref(&one), Duration::from_secs(5))
            .await
            .unwrap();
        assert!(r.is_allowed() || actual == u32::MAX);
        store.settle(r, actual).await.unwrap();
        let denied = store
            .reserve(std::slice::from_ref(&one), Duration::from_secs(5))
            .await
            .unwrap();
        assert!(!denied.is_allowed());
        let retry = denied.decisions().as_slice()[0].info().retry_after();
        assert!(retry > Duration::from_secs(86_400 * 365), "retry {retry:?}");
        store.refund(&key, &quota, 1).await.unwrap();
    }
}

/// A holds hash a client overwrote (a key of another type, a debt that is no number) denies
/// the key, never fails it or lets it through.
#[tokio::test]
async fn a_garbled_holds_hash_denies_and_never_fails() {
    let server = RedisServer::start();
    let store = store(&server, "rv-garble").await;
    let quota = Quota::per_hour(10).unwrap();
    let one = |k: &str| Limit::new(Key::from(k), quota, 1);
    for (k, garble) in [("wrong-type", ["SET", "x"]), ("inf-debt", ["HSET", "d"])] {
        let r = store
            .reserve(&[one(k)], Duration::from_secs(5))
            .await
            .unwrap();
        let names: Vec<String> = server
            .query(redis::cmd("KEYS").arg(format!("rv-garble:*{k}*:h")))
            .unwrap();
        let name = &names[0];
        store.release(r).await.unwrap();
        let mut cmd = redis::cmd(garble[0]);
        cmd.arg(name).arg(garble[1]);
        if garble[0] == "HSET" {
            cmd.arg("inf");
        } else {
            let _: () = server.query(redis::cmd("DEL").arg(name)).unwrap();
        }
        let _: () = server.query(&cmd).unwrap();
        let decided = store
            .reserve(&[one(k)], Duration::from_secs(5))
            .await
            .unwrap();
        assert!(
            !decided.is_allowed(),
            "{k}: a garbled hash let the key through"
        );
    }
}

/// Redis's clock stepped back an hour: holds never settled still lapse a hold time after,
/// not an hour and a hold time.
#[tokio::test]
async fn holds_lapse_after_their_hold_time_when_the_servers_clock_steps_back() {
    let server = RedisServer::start_with_shifted_clock();
    let store = store(&server, "rv-step").await;
    let quota = Quota::per_hour(10).unwrap();
    let all = Limit::new(Key::from("k"), quota, 10);
    let r = store
        .reserve(std::slice::from_ref(&all), Duration::from_secs(1))
        .await
        .unwrap();
    assert!(r.is_allowed());
    std::mem::forget(r);
    server.shift_clock(-3_600);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The next reservation sees the step: the hold lapses a hold time from then.
    assert!(
        !store
            .reserve(std::slice::from_ref(&all), Duration::from_secs(1))
            .await
            .unwrap()
            .is_allowed()
    );
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let again = store.reserve(&[all], Duration::from_secs(1)).await.unwrap();
    assert!(
        again.is_allowed(),
        "the hold lapsed a hold time after the step"
    );
}

/// On Redis too, a request that runs longer than its hold keeps its place by renewing it.
#[tokio::test]
async fn a_long_request_renews_its_hold_in_redis() {
    use axum::Router;
    use axum::routing::get;
    use http::{Request, StatusCode};
    use tower::ServiceExt;

    let server = RedisServer::start();
    let store = store(&server, "rv-renew").await;
    let layer =
        ratewarden_tower::RateLimitLayer::in_flight(store, 1, ratewarden_tower::key::Global)
            .unwrap()
            .hold(Duration::from_millis(600));
    let app = Router::new()
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(2_000)).await;
                "done"
            }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let status = |uri: &'static str| {
        let app = app.clone();
        async move {
            let request = Request::get(uri).body(axum::body::Body::empty()).unwrap();
            app.oneshot(request).await.unwrap().status()
        }
    };
    let slow = tokio::spawn(status("/slow"));
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(status("/").await, StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(slow.await.unwrap(), StatusCode::OK);
    for _ in 0..100 {
        if status("/").await == StatusCode::OK {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the place never came back");
}
