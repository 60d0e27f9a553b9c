//! A queue's places (crates/ratewarden-redis/src/batch.rs): calls whose callers stop polling
//! them, deadlines, and stores shared by several runtimes. Each test reproduces a defect: it
//! failed before its fix.

use std::time::{Duration, Instant};

use ratewarden_core::{Key, Quota, Store};
use ratewarden_redis::{RedisConfig, RedisStore};
use tests::redis_server::RedisServer;

use crate::{held_in_flight, one_in_flight, pending_after_one_poll, timed_checks};

/// A one-worker runtime, and a store on `server` made on it (its connection's driver runs
/// there), with one check done.
fn main_runtime_and_store(
    server: &RedisServer,
    prefix: &str,
    timeout: Duration,
) -> (tokio::runtime::Runtime, RedisStore) {
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let store = main.block_on(async {
        let store = crate::store_with_timeout(server, prefix, timeout).await;
        let quota = Quota::per_hour(1_000).unwrap();
        store.check(&Key::from("warm"), &quota, 1).await.unwrap();
        store
    });
    (main, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_too_far_to_name_is_no_deadline_not_a_panic() {
    // Reproduced: `Duration::MAX` panicked every check (an `Instant` overflow).
    let server = RedisServer::start();
    let store = crate::store_with_timeout(&server, "huge", Duration::MAX).await;
    let quota = Quota::per_hour(10).unwrap();
    let s = store.clone();
    let r = tokio::spawn(async move { s.check(&Key::from("a"), &quota, 1).await }).await;
    assert!(r.is_ok(), "the check panicked");
    // And it is decided, as with any deadline.
    assert!(r.unwrap().unwrap().is_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_that_queue_behind_held_calls_take_their_places_at_their_deadline() {
    // Reproduced: an expired place was taken back only by a check that came after its
    // deadline; 20 checks that queued at 150 ms of a 200 ms deadline all timed out on a
    // healthy server.
    let server = RedisServer::start();
    let timeout = Duration::from_millis(200);
    let store = RedisConfig::new(server.url())
        .prefix("heldburst")
        .deny_cache(0)
        .timeout(timeout)
        .connect()
        .await
        .unwrap();
    let quota = Quota::per_hour(1_000).unwrap();
    store.check(&Key::from("warm"), &quota, 1).await.unwrap();
    let held = held_in_flight(&store, quota, "held", 4).await;
    let held_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let burst = timed_checks(&store, quota, "burst", 20);
    let mut ok = 0;
    let mut slowest = Duration::ZERO;
    for t in burst {
        let (r, took) = t.await.unwrap();
        ok += u32::from(r.is_ok());
        slowest = slowest.max(took);
    }
    println!(
        "held calls' places free at {:?}; burst came at 150ms; {ok}/20 decided, slowest {slowest:?}, all done at {:?}",
        timeout,
        held_at.elapsed()
    );
    drop(held);
    assert_eq!(
        ok, 20,
        "checks on a healthy server timed out behind places already free"
    );
}

/// A store shared by two runtimes (one per worker thread, as actix runs): one shuts down
/// while its calls hold the places. Reproduced: the other runtime's 10 queued checks were
/// handed to a batch spawned on the runtime shutting down, and all failed.
#[test]
fn a_runtime_that_shuts_down_holding_the_places_never_fails_another_runtimes_checks() {
    other_runtime_shuts_down(false);
    other_runtime_shuts_down(true);
}

fn other_runtime_shuts_down(current_thread: bool) {
    let server = RedisServer::start();
    let quota = Quota::per_hour(1_000).unwrap();
    let (main, store) = main_runtime_and_store(&server, "tworuntimes", Duration::from_secs(2));
    // The other runtime, on a thread of its own: four checks polled once, then held by tasks
    // that wait for ever.
    let (go, ready) = std::sync::mpsc::channel::<()>();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let other_store = store.clone();
    let other = std::thread::spawn(move || {
        let rt = if current_thread {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap()
        };
        rt.block_on(async {
            for i in 0..4 {
                let store = other_store.clone();
                let (tx, rx) = tokio::sync::oneshot::channel();
                tokio::spawn(async move {
                    let check = one_in_flight(&store, quota, &format!("other-{i}")).await;
                    let _ = tx.send(());
                    std::future::pending::<()>().await;
                    drop(check);
                });
                rx.await.unwrap();
            }
        });
        go.send(()).unwrap();
        // Wait until told, then shut down with the four held.
        stop_rx.recv().unwrap();
        drop(rt);
    });
    ready.recv().unwrap();
    let results = main.block_on(async {
        let checks = timed_checks(&store, quota, "main", 10);
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop_tx.send(()).unwrap();
        let mut out = Vec::new();
        for c in checks {
            out.push(c.await.unwrap());
        }
        out
    });
    other.join().unwrap();
    let failed: Vec<_> = results
        .iter()
        .filter_map(|(r, took)| r.as_ref().err().map(|e| format!("{e} after {took:?}")))
        .collect();
    println!(
        "other runtime (current_thread: {current_thread}): {} of 10 failed: {:?}",
        failed.len(),
        failed.first()
    );
    assert!(failed.is_empty());
    // And the store still works afterwards.
    let after = main.block_on(async { store.check(&Key::from("after"), &quota, 1).await });
    assert!(after.unwrap().is_allowed());
}

#[test]
fn a_batch_runs_on_its_first_checks_runtime_not_on_an_idle_one_that_handed_it_on() {
    // Reproduced: the batch of the main runtime's checks was spawned on a current-thread
    // runtime that had handed the place on and then sat idle: 10 of 10 timed out.
    let server = RedisServer::start();
    let quota = Quota::per_hour(1_000).unwrap();
    let timeout = Duration::from_millis(500);
    let (main, store) = main_runtime_and_store(&server, "idle", timeout);
    let facade = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    server.freeze();
    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    let (queued_tx, queued_rx) = std::sync::mpsc::channel::<()>();
    let facade_store = store.clone();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<Vec<bool>>();
    let facade_thread = std::thread::spawn(move || {
        let results = facade.block_on(async {
            let mut checks: Vec<_> = (0..4)
                .map(|i| {
                    let store = facade_store.clone();
                    Box::pin(
                        async move { store.check(&Key::from(format!("f-{i}")), &quota, 1).await },
                    )
                })
                .collect();
            for c in &mut checks {
                assert!(pending_after_one_poll(c).await);
            }
            started_tx.send(()).unwrap();
            let mut out = Vec::new();
            for c in checks {
                out.push(c.await.is_ok());
            }
            out
        });
        done_tx.send(results).unwrap();
        // The facade stays idle for a second, then is driven again.
        std::thread::sleep(Duration::from_secs(1));
        facade.block_on(async { tokio::time::sleep(Duration::from_millis(200)).await });
        let _ = queued_rx;
    });
    started_rx.recv().unwrap();
    let results = main.block_on(async {
        let checks = timed_checks(&store, quota, "main", 10);
        tokio::time::sleep(Duration::from_millis(50)).await;
        server.thaw();
        let _ = queued_tx.send(());
        let mut out = Vec::new();
        for c in checks {
            out.push(c.await.unwrap());
        }
        out
    });
    println!("the facade's own checks ok: {:?}", done_rx.recv().unwrap());
    let failed = results.iter().filter(|(r, _)| r.is_err()).count();
    println!(
        "{failed} of 10 main-runtime checks failed; e.g. {:?}",
        results.first()
    );
    facade_thread.join().unwrap();
    assert_eq!(failed, 0);
    // main-0 was decided once, and counted once.
    let again =
        main.block_on(async { store.check(&Key::from("main-0"), &quota, 1).await.unwrap() });
    assert_eq!(again.info().remaining(), 998);
}

#[test]
fn checks_whose_batch_is_dropped_with_its_runtime_fail_as_timeouts_not_script_errors() {
    // Reproduced: they failed as Script errors (\"the script replied to fewer checks than it
    // was sent\").
    let server = RedisServer::start();
    let quota = Quota::per_hour(1_000).unwrap();
    let timeout = Duration::from_millis(300);
    let (main, store) = main_runtime_and_store(&server, "midflight", timeout);
    let other_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    server.freeze();
    let t0 = Instant::now();
    for i in 0..4 {
        let store = store.clone();
        other_rt.spawn(async move { store.check(&Key::from(format!("o-{i}")), &quota, 1).await });
    }
    std::thread::sleep(Duration::from_millis(100));
    let dropper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(340).saturating_sub(t0.elapsed()));
        drop(other_rt);
    });
    let results = main.block_on(async {
        let checks: Vec<_> = (0..10)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(
                    async move { store.check(&Key::from(format!("m-{i}")), &quota, 1).await },
                )
            })
            .collect();
        // The other runtime's calls time out at 300 ms and hand the queue (these checks) to a
        // batch spawned there, in flight on the frozen server; it shuts down at 340 ms.
        let mut out = Vec::new();
        for c in checks {
            out.push(c.await.unwrap());
        }
        out
    });
    dropper.join().unwrap();
    server.thaw();
    let kinds: Vec<String> = results
        .iter()
        .map(|r| match r {
            Ok(_) => "ok".into(),
            Err(e) => e.to_string(),
        })
        .collect();
    assert!(
        (results.iter()).all(|r| r.as_ref().map_or_else(|e| e.is_timeout(), |_| true)),
        "{kinds:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_whose_callers_gave_up_before_they_were_sent_are_never_charged() {
    let server = RedisServer::start();
    let store = crate::store_with_timeout(&server, "ghosts", Duration::from_secs(10)).await;
    let (key, quota) = (Key::from("ghost"), Quota::per_hour(1_000).unwrap());
    store.check(&key, &quota, 1).await.unwrap();
    server.freeze();
    let (s, k) = (store.clone(), key.clone());
    let on_the_wire = tokio::spawn(async move { s.check(&k, &quota, 1).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // 99 more, whose callers give up after 10 ms: those that found a free place were sent
    // (at most the queue's places, 4), the others never were.
    let abandoned: Vec<_> = (0..99)
        .map(|_| {
            let (s, k) = (store.clone(), key.clone());
            tokio::spawn(async move {
                tokio::time::timeout(Duration::from_millis(10), s.check(&k, &quota, 1)).await
            })
        })
        .collect();
    for task in abandoned {
        assert!(
            task.await.unwrap().is_err(),
            "Redis is frozen: nothing is decided"
        );
    }
    server.thaw();
    assert!(on_the_wire.await.unwrap().unwrap().is_allowed());
    // Whatever else the store still sends goes now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let left = store.peek(&key, &quota).await.unwrap().info().remaining();
    assert!(
        left >= 1_000 - 2 - 4,
        "{} units gone for 2 checks decided and at most 4 sent unanswered",
        1_000 - left
    );
}
