//! Shadow mode, preflights, stacked limits, costs, per-route quotas, custom rejections,
//! failure modes, and a real server.

use std::net::SocketAddr;

use axum::body::Body;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use ratewarden_core::{Decision, Key, Quota, Store, StoreError, StoreErrorKind};
use ratewarden_tower::RateLimitLayer;
use ratewarden_tower::key::{Global, PeerIp};
use ratewarden_tower::rate_limit::{Denied, FailureMode, MissingKey};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{app, get_from, header, manual_store, send};

#[tokio::test]
async fn shadow_mode_reports_but_never_rejects() {
    let (store, _clock) = manual_store();
    let layer =
        RateLimitLayer::new(store, Quota::per_minute(1).unwrap(), PeerIp::new()).shadow(true);
    let app = app().layer(layer);
    for remaining in ["0", "0", "0"] {
        let (response, body) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(body, "ok");
        assert_eq!(header(&response, "x-ratelimit-remaining"), remaining);
    }
}

#[tokio::test]
async fn preflights_are_counted_unless_exempted() {
    // Reproduced: exempt by default, an `OPTIONS` request with `Access-Control-Request-Method`
    // reached the inner service uncounted, and a handler that answers any method (tonic's
    // routes, `any()`, a proxy) served it: 50 of 50 under a 1/min limit.
    for exempt in [None, Some(false), Some(true)] {
        let (store, _clock) = manual_store();
        let layer = RateLimitLayer::new(store, Quota::per_minute(1).unwrap(), PeerIp::new());
        let layer = match exempt {
            Some(on) => layer.exempt_preflight(on),
            None => layer,
        };
        let app = app().layer(layer);
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let mut req = get_from(
                "192.0.2.1:1",
                "/",
                &[("access-control-request-method", b"POST")],
            );
            *req.method_mut() = Method::OPTIONS;
            statuses.push(send(&app, req).await.0.status());
        }
        let limited = statuses.contains(&StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(limited, exempt != Some(true), "{exempt:?}: {statuses:?}");
    }
}

#[tokio::test]
async fn the_strictest_of_stacked_limits_sets_the_headers() {
    let layers = || {
        let (wide_store, _) = manual_store();
        let (narrow_store, _) = manual_store();
        let wide =
            RateLimitLayer::new(wide_store, Quota::per_minute(100).unwrap(), Global).name("global");
        let narrow =
            RateLimitLayer::new(narrow_store, Quota::per_minute(3).unwrap(), PeerIp::new())
                .name("ip");
        (wide, narrow)
    };
    let (wide, narrow) = layers();
    let narrow_inside = app().layer(narrow).layer(wide);
    let (wide, narrow) = layers();
    let narrow_outside = app().layer(wide).layer(narrow);
    for app in [narrow_inside, narrow_outside] {
        for remaining in ["2", "1", "0"] {
            let (response, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(header(&response, "x-ratelimit-limit"), "3");
            assert_eq!(header(&response, "x-ratelimit-remaining"), remaining);
            assert_eq!(header(&response, "ratelimit-policy"), r#""ip";q=3;w=60"#);
        }
        let (response, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&response, "ratelimit"), r#""ip";r=0;t=20"#);
    }
}

#[tokio::test]
async fn costs_and_per_route_quotas() {
    let (store, _clock) = manual_store();
    let search = Quota::per_minute(2).unwrap();
    let layer = RateLimitLayer::new(
        store,
        Quota::per_minute(10).unwrap(),
        |req: &Request<Body>| {
            Some(Key::from(format!(
                "{}:{}",
                req.uri().path(),
                ratewarden_tower::key::peer_addr(req)?.ip()
            )))
        },
    )
    .quota_by(move |req: &Request<Body>| match req.uri().path() {
        "/search" => Some(search),
        _ => Some(Quota::per_minute(10).unwrap()),
    })
    .cost_by(|req: &Request<Body>| {
        if req.headers().contains_key("x-heavy") {
            4
        } else {
            1
        }
    });
    let app = app().layer(layer);
    let peer = "192.0.2.1:1";
    // /search: 2 per minute.
    assert_eq!(
        send(&app, get_from(peer, "/search", &[])).await.0.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&app, get_from(peer, "/search", &[])).await.0.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&app, get_from(peer, "/search", &[])).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // /: 10 per minute, heavy requests cost 4.
    let heavy = [("x-heavy", b"1".as_slice())];
    let (first, _) = send(&app, get_from(peer, "/", &heavy)).await;
    assert_eq!(header(&first, "x-ratelimit-remaining"), "6");
    let (second, _) = send(&app, get_from(peer, "/", &heavy)).await;
    assert_eq!(header(&second, "x-ratelimit-remaining"), "2");
    assert_eq!(
        send(&app, get_from(peer, "/", &heavy)).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, get_from(peer, "/", &[])).await.0.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_cost_above_the_quota_is_rejected_without_retry_after() {
    let (store, _clock) = manual_store();
    let layer = RateLimitLayer::new(store, Quota::per_minute(5).unwrap(), PeerIp::new())
        .cost_by(|_: &Request<Body>| 6);
    let app = app().layer(layer);
    let (response, body) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(response.headers().get("retry-after").is_none());
    assert!(String::from_utf8_lossy(&body).contains("retrying will not help"));
}

#[tokio::test]
async fn a_custom_rejection_gets_the_standard_headers() {
    let (store, _clock) = manual_store();
    let layer = RateLimitLayer::new(store, Quota::per_minute(1).unwrap(), PeerIp::new())
        .reject_with(|denied: &Denied| {
            let body = format!("slow down, {} s", denied.retry_after_secs());
            let mut response = Response::new(Bytes::from(body));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response
        });
    let app = app().layer(layer);
    send(&app, get_from("192.0.2.1:1", "/", &[])).await;
    let (response, body) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, "slow down, 60 s");
    assert_eq!(header(&response, "retry-after"), "60");
}

use tests::Down as Broken;

#[tokio::test]
async fn store_failures_follow_the_failure_mode() {
    for (mode, expected) in [
        (FailureMode::open(), StatusCode::OK),
        (FailureMode::closed(), StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let layer = RateLimitLayer::new(Broken, Quota::per_minute(1).unwrap(), PeerIp::new())
            .on_store_error(mode);
        let app = app().layer(layer);
        for _ in 0..3 {
            let (response, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
            assert_eq!(response.status(), expected);
            if expected == StatusCode::SERVICE_UNAVAILABLE {
                assert_eq!(header(&response, "retry-after"), "1");
            }
        }
    }
}

#[tokio::test]
async fn by_default_a_failing_store_is_replaced_by_a_local_limit_not_by_no_limit() {
    // Reproduced: the default failure mode let every request through, uncounted, for as long
    // as the store failed, login and pre-auth layers included.
    let layer = RateLimitLayer::new(Broken, Quota::per_minute(2).unwrap(), PeerIp::new());
    let app = app().layer(layer);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let (response, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
        statuses.push(response.status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // The whole quota, on this instance alone.
    let (other, _) = send(&app, get_from("192.0.2.2:1", "/", &[])).await;
    assert_eq!(header(&other, "x-ratelimit-limit"), "2");
}

#[tokio::test]
async fn named_layers_sharing_a_store_never_share_a_bucket() {
    let (store, _clock) = manual_store();
    let store = std::sync::Arc::new(store);
    let quota = Quota::per_minute(1).unwrap();
    let login =
        RateLimitLayer::new(std::sync::Arc::clone(&store), quota, PeerIp::new()).name("login");
    let search =
        RateLimitLayer::new(std::sync::Arc::clone(&store), quota, PeerIp::new()).name("search");
    let app = app().layer(login).layer(search);
    // Each request passes both limits: each limit's single request is its own.
    let (first, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
    assert_eq!(first.status(), StatusCode::OK);
    let (second, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(store.len(), 2, "one bucket per limit");
}

#[tokio::test]
async fn names_shown_alike_keep_their_own_buckets() {
    let (store, _clock) = manual_store();
    let store = std::sync::Arc::new(store);
    let quota = Quota::per_minute(1).unwrap();
    let spaced =
        RateLimitLayer::new(std::sync::Arc::clone(&store), quota, PeerIp::new()).name("my search");
    let underscored =
        RateLimitLayer::new(std::sync::Arc::clone(&store), quota, PeerIp::new()).name("my_search");
    assert_eq!(spaced.policy_name(), underscored.policy_name());
    let app = app().layer(spaced).layer(underscored);
    let (first, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        first.headers()["ratelimit-policy"],
        r#""my_search";q=1;w=60"#
    );
    assert_eq!(
        store.len(),
        2,
        "one bucket per name as given, however it is shown"
    );
}

#[tokio::test]
async fn shadow_mode_never_rejects_not_even_without_a_key_or_a_store() {
    let keyless = RateLimitLayer::new(
        manual_store().0,
        Quota::per_minute(1).unwrap(),
        PeerIp::new(),
    )
    .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
    .shadow(true);
    let keyless = app().layer(keyless);
    let request = Request::get("/").body(Body::empty()).unwrap();
    assert_eq!(send(&keyless, request).await.0.status(), StatusCode::OK);

    let closed = RateLimitLayer::new(Broken, Quota::per_minute(1).unwrap(), PeerIp::new())
        .on_store_error(FailureMode::closed())
        .shadow(true);
    let closed = app().layer(closed);
    for _ in 0..3 {
        let (response, _) = send(&closed, get_from("192.0.2.1:1", "/", &[])).await;
        assert_eq!(response.status(), StatusCode::OK);
    }
}

#[tokio::test]
async fn fail_closed_lets_allowlisted_keys_through() {
    let health_checker = Key::from("192.0.2.9".parse::<std::net::IpAddr>().unwrap());
    let layer = RateLimitLayer::new(Broken, Quota::per_minute(1).unwrap(), PeerIp::new())
        .on_store_error(FailureMode::closed_allowing([health_checker]));
    let app = app().layer(layer);
    for _ in 0..3 {
        let (allowed, _) = send(&app, get_from("192.0.2.9:1", "/", &[])).await;
        assert_eq!(allowed.status(), StatusCode::OK);
        let (other, _) = send(&app, get_from("192.0.2.10:1", "/", &[])).await;
        assert_eq!(other.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}

#[tokio::test]
async fn the_fallback_enforces_a_share_of_the_quota_while_the_store_fails() {
    // 8 per minute over 4 instances: each falls back to 2.
    let fallback = FailureMode::fallback(
        ratewarden_memory::MemoryStore::new(),
        std::num::NonZeroU32::new(4).unwrap(),
    );
    let layer = RateLimitLayer::new(Broken, Quota::per_minute(8).unwrap(), PeerIp::new())
        .on_store_error(fallback);
    let app = app().layer(layer);
    for expected in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        let (response, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
        assert_eq!(response.status(), expected);
        assert_eq!(header(&response, "x-ratelimit-limit"), "2");
    }
    // Other keys have their own share.
    let (response, _) = send(&app, get_from("192.0.2.2:1", "/", &[])).await;
    assert_eq!(response.status(), StatusCode::OK);
}

/// Three gateways share a mesh; one falls back from a failed store with the mesh's live
/// count: a third of the quota while all three are heard, the whole once the other two
/// are gone and the count of one has held for `Instances::SETTLE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_shares_the_quota_by_the_gateways_a_mesh_hears() {
    use ratewarden_tower::MeshStore;
    use ratewarden_tower::rate_limit::Instances;
    let addrs: Vec<SocketAddr> = {
        let sockets: Vec<std::net::UdpSocket> = (0..3)
            .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        sockets.iter().map(|s| s.local_addr().unwrap()).collect()
    };
    let mut meshes = Vec::new();
    for &addr in &addrs {
        let peers = addrs.iter().copied().filter(|&a| a != addr);
        let mesh = MeshStore::builder(addr)
            .peers(peers)
            .interval(std::time::Duration::from_millis(20))
            .secret(b"a secret the test's gateways share")
            .unwrap()
            .bind()
            .await
            .unwrap();
        meshes.push(mesh);
    }
    let fallback = FailureMode::fallback(
        ratewarden_memory::MemoryStore::new(),
        Instances::mesh(&meshes[0]),
    );
    let layer = RateLimitLayer::new(Broken, Quota::per_minute(12).unwrap(), PeerIp::new())
        .on_store_error(fallback);
    let app = app().layer(layer);
    for expected in [StatusCode::OK; 4]
        .into_iter()
        .chain([StatusCode::TOO_MANY_REQUESTS])
    {
        let (response, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
        assert_eq!(response.status(), expected);
        assert_eq!(header(&response, "x-ratelimit-limit"), "4");
    }
    meshes.truncate(1);
    // Heard from no one for a moment, then the count of one holds for 10 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (response, _) = send(&app, get_from("192.0.2.2:1", "/", &[])).await;
        if header(&response, "x-ratelimit-limit") == "12" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the gateway alone still enforces a third of the quota"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn the_fallback_never_engages_on_a_healthy_denial() {
    let (store, _clock) = manual_store();
    let fallback = FailureMode::fallback(
        ratewarden_memory::MemoryStore::new(),
        std::num::NonZeroU32::new(1).unwrap(),
    );
    let layer = RateLimitLayer::new(store, Quota::per_minute(1).unwrap(), PeerIp::new())
        .on_store_error(fallback);
    let app = app().layer(layer);
    let (first, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
    assert_eq!(first.status(), StatusCode::OK);
    // A fresh fallback store would admit this one: the store's denial stands.
    for _ in 0..3 {
        let (denied, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    }
}

#[tokio::test]
async fn an_open_breaker_answers_with_the_failure_mode_without_asking_the_store() {
    use ratewarden_tower::breaker::{BreakerState, CircuitBreaker};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[derive(Debug, Default)]
    struct Counting(AtomicU32);
    impl Store for Counting {
        async fn check(&self, _: &Key, _: &Quota, _: u32) -> Result<Decision, StoreError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::new(StoreErrorKind::Timeout))
        }
        async fn peek(&self, _: &Key, _: &Quota) -> Result<Decision, StoreError> {
            Err(StoreError::new(StoreErrorKind::Timeout))
        }
        async fn reset(&self, _: &Key, _: &Quota) -> Result<(), StoreError> {
            Err(StoreError::new(StoreErrorKind::Timeout))
        }
    }

    let breaker = Arc::new(
        CircuitBreaker::builder(Counting::default())
            .failure_threshold(3)
            .build()
            .unwrap(),
    );
    let layer = RateLimitLayer::new(Arc::clone(&breaker), Quota::per_minute(1).unwrap(), Global)
        .on_store_error(FailureMode::closed());
    let app = app().layer(layer);
    for _ in 0..50 {
        let (response, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    assert_eq!(breaker.get_ref().0.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn every_connection_of_a_real_server_shares_one_store() {
    let (store, _clock) = manual_store();
    let layer = RateLimitLayer::new(store, Quota::per_minute(3).unwrap(), PeerIp::new());
    let app = app().layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(status_on_a_new_connection(addr).await);
    }
    assert_eq!(statuses, ["200", "200", "200", "429", "429"]);
    server.abort();
}

#[test]
fn outcomes_are_counted_through_the_metrics_facade() {
    use std::task::{Context, Waker};
    use tower::{Layer, Service};

    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (store, _clock) = manual_store();
    let layer =
        RateLimitLayer::new(store, Quota::per_minute(1).unwrap(), PeerIp::new()).name("api");
    let mut service = layer.layer(tower::service_fn(|_: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
    }));
    metrics::with_local_recorder(&recorder, || {
        // The memory store decides inside `call`, where the local recorder is installed.
        for request in [
            get_from("192.0.2.1:1", "/", &[]),
            get_from("192.0.2.1:1", "/", &[]),
            Request::new(Body::empty()), // no peer address
        ] {
            let ready = service.poll_ready(&mut Context::from_waker(Waker::noop()));
            assert!(ready.is_ready());
            let _future = service.call(request);
        }
    });
    let mut counts = counters(&snapshotter);
    counts.sort();
    assert_eq!(
        counts,
        [
            (
                "ratewarden_requests_total limit=api,outcome=allowed".to_owned(),
                1
            ),
            (
                "ratewarden_requests_total limit=api,outcome=denied".to_owned(),
                1
            ),
            (
                "ratewarden_requests_total limit=api,outcome=missing_key".to_owned(),
                1
            ),
        ]
    );
}

#[test]
fn a_request_the_failure_mode_decides_is_counted_once_under_its_own_outcome() {
    use tower::{Layer, ServiceExt};

    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let quota = Quota::per_minute(1).unwrap();
    let modes = [
        ("open", FailureMode::open()),
        ("closed", FailureMode::closed()),
        (
            "fallback",
            FailureMode::fallback(
                ratewarden_memory::MemoryStore::new(),
                std::num::NonZeroU32::new(1).unwrap(),
            ),
        ),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            for (name, mode) in modes {
                let layer = RateLimitLayer::new(Broken, quota, PeerIp::new())
                    .name(name)
                    .on_store_error(mode);
                let service = layer.layer(tower::service_fn(|_: Request<Body>| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
                }));
                for _ in 0..2 {
                    let request = get_from("192.0.2.1:1", "/", &[]);
                    service.clone().oneshot(request).await.unwrap();
                }
            }
        });
    });
    let mut counts = counters(&snapshotter);
    counts.retain(|(name, _)| name.starts_with("ratewarden_requests_total"));
    counts.sort();
    let expected: Vec<(String, u64)> = [
        ("closed", "failure_closed", 2),
        ("fallback", "fallback_allowed", 1),
        ("fallback", "fallback_denied", 1),
        ("open", "failure_open", 2),
    ]
    .into_iter()
    .map(|(limit, outcome, n)| {
        (
            format!("ratewarden_requests_total limit={limit},outcome={outcome}"),
            n,
        )
    })
    .collect();
    assert_eq!(counts, expected);
}

#[tokio::test]
async fn the_breaker_reports_each_transition_once_not_each_request() {
    use ratewarden_tower::breaker::CircuitBreaker;
    use std::sync::Arc;

    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let breaker = Arc::new(
        CircuitBreaker::builder(Broken)
            .name("redis")
            .backoff(
                std::time::Duration::from_secs(3_600),
                std::time::Duration::from_secs(3_600),
            )
            .build()
            .unwrap(),
    );
    let layer = RateLimitLayer::new(Arc::clone(&breaker), Quota::per_minute(1).unwrap(), Global)
        .on_store_error(FailureMode::open());
    let app = app().layer(layer);
    // The store fails inside the boxed future: keep the recorder installed while it runs.
    let _guard = metrics::set_default_local_recorder(&recorder);
    for _ in 0..100 {
        let (response, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
        assert_eq!(response.status(), StatusCode::OK, "fail open");
    }
    let transitions: Vec<(String, u64)> = counters(&snapshotter)
        .into_iter()
        .filter(|(name, _)| name.starts_with("ratewarden_breaker_transitions_total "))
        .collect();
    assert_eq!(
        transitions,
        [(
            "ratewarden_breaker_transitions_total breaker=redis,to=open".to_owned(),
            1
        )]
    );
}

/// Every counter recorded, as `("NAME label=value,...", count)`.
fn counters(snapshotter: &metrics_util::debugging::Snapshotter) -> Vec<(String, u64)> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let metrics_util::debugging::DebugValue::Counter(n) = value else {
                return None;
            };
            Some((format!("{} {}", key.key().name(), labels.join(",")), n))
        })
        .collect()
}

#[tokio::test]
async fn fail_closed_lets_an_allowlisted_ipv6_address_through_by_its_extractors_prefix() {
    // Reproduced: `allow([Key::from(ipv6)])` never matched, since `PeerIp` and `ClientIp` key
    // an IPv6 client by its /64: the allow-listed health checker got 503s while the store
    // failed.
    let checker = Key::from("2001:db8::9".parse::<std::net::IpAddr>().unwrap());
    for (extractor, neighbour) in [
        // The /64 is one client to the layer: a neighbour in it shares the checker's key.
        (PeerIp::new(), StatusCode::OK),
        (
            PeerIp::new().ipv6_prefix(128).unwrap(),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
    ] {
        let layer = RateLimitLayer::new(Broken, Quota::per_minute(1).unwrap(), extractor)
            .on_store_error(FailureMode::closed_allowing([checker.clone()]));
        let app = app().layer(layer);
        for _ in 0..2 {
            let (allowed, _) = send(&app, get_from("[2001:db8::9]:1", "/", &[])).await;
            assert_eq!(allowed.status(), StatusCode::OK);
            let (same_64, _) = send(&app, get_from("[2001:db8::7]:1", "/", &[])).await;
            assert_eq!(same_64.status(), neighbour);
            let (other, _) = send(&app, get_from("[2001:db8:0:1::9]:1", "/", &[])).await;
            assert_eq!(other.status(), StatusCode::SERVICE_UNAVAILABLE);
        }
    }
}

#[tokio::test]
async fn a_header_key_sent_twice_is_refused_even_when_keyless_requests_are_skipped() {
    // Reproduced: with `MissingKey::Skip`, a request whose key header came twice counted as
    // having no key and went through uncounted, while the application, reading
    // the first value, served it as that key's: the client left its own limit at will.
    let (store, _) = manual_store();
    let layer = RateLimitLayer::new(
        store.clone(),
        Quota::per_minute(1).unwrap(),
        ratewarden_tower::key::Header::new(http::HeaderName::from_static("x-api-key")),
    )
    .on_missing_key(MissingKey::Skip);
    let app = app().layer(layer);
    let statuses = |headers: &'static [(&'static str, &'static [u8])]| {
        let app = app.clone();
        async move {
            let mut statuses = Vec::new();
            for _ in 0..3 {
                statuses.push(
                    send(&app, get_from("192.0.2.1:1", "/", headers))
                        .await
                        .0
                        .status(),
                );
            }
            statuses
        }
    };
    // No key at all: skipped, as configured.
    assert_eq!(statuses(&[]).await, [StatusCode::OK; 3]);
    let twice: &[(&str, &[u8])] = &[("x-api-key", b"k1"), ("x-api-key", b"k1")];
    assert_eq!(statuses(twice).await, [StatusCode::BAD_REQUEST; 3]);
    let other: &[(&str, &[u8])] = &[("x-api-key", b""), ("x-api-key", b"k1")];
    assert_eq!(statuses(other).await, [StatusCode::BAD_REQUEST; 3]);
    // Empty, as clients without a key configured send it: no key, skipped.
    assert_eq!(statuses(&[("x-api-key", b"")]).await, [StatusCode::OK; 3]);
    // The key itself is limited.
    assert_eq!(
        statuses(&[("x-api-key", b"k1")]).await,
        [
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

#[tokio::test]
async fn a_server_without_connect_info_skips_every_request_and_the_layer_counts_them() {
    // Reproduced: served without `into_make_service_with_connect_info`, every request had no
    // peer address, so no key: under `MissingKey::Skip` 100 of 100 requests on a 1/s limit
    // went through uncounted, with no metric and, without `tracing`, no log.
    let (store, _clock) = manual_store();
    let layer = RateLimitLayer::new(store, Quota::per_second(1).unwrap(), PeerIp::new())
        .on_missing_key(MissingKey::Skip);
    let app = app().layer(layer.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap(); // no connect info
    });
    let mut statuses = Vec::new();
    for _ in 0..100 {
        statuses.push(status_on_a_new_connection(addr).await);
    }
    server.abort();
    assert_eq!(statuses, ["200"; 100], "skipped, as configured");
    assert_eq!(
        layer.skipped(),
        100,
        "but counted where the application can see it"
    );
}

#[tokio::test]
async fn requests_with_a_key_or_refused_without_one_are_never_counted_as_skipped() {
    let (store, _clock) = manual_store();
    let skip = RateLimitLayer::new(store, Quota::per_second(1).unwrap(), PeerIp::new())
        .on_missing_key(MissingKey::Skip);
    let skipping = app().layer(skip.clone());
    for status in [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS] {
        let (response, _) = send(&skipping, get_from("192.0.2.1:1", "/", &[])).await;
        assert_eq!(response.status(), status);
    }
    assert_eq!(skip.skipped(), 0, "both requests had a key");

    let reject = RateLimitLayer::new(
        manual_store().0,
        Quota::per_second(1).unwrap(),
        PeerIp::new(),
    );
    let rejecting = app().layer(reject.clone());
    let keyless = Request::get("/").body(Body::empty()).unwrap();
    assert_eq!(
        send(&rejecting, keyless).await.0.status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(reject.skipped(), 0, "refused, not let through");
}

#[test]
fn skipped_requests_are_counted_under_their_own_metrics_outcome() {
    use std::task::{Context, Waker};
    use tower::{Layer, Service};

    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let quota = Quota::per_minute(1).unwrap();
    let skip = RateLimitLayer::new(manual_store().0, quota, PeerIp::new())
        .name("skip")
        .on_missing_key(MissingKey::Skip);
    let reject = RateLimitLayer::new(manual_store().0, quota, PeerIp::new()).name("reject");
    let ok = || {
        tower::service_fn(|_: Request<Body>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
        })
    };
    let mut services = [skip.layer(ok()), reject.layer(ok())];
    metrics::with_local_recorder(&recorder, || {
        for service in &mut services {
            for _ in 0..2 {
                let ready = service.poll_ready(&mut Context::from_waker(Waker::noop()));
                assert!(ready.is_ready());
                let _future = service.call(Request::new(Body::empty())); // no peer address
            }
        }
    });
    let mut counts = counters(&snapshotter);
    counts.sort();
    assert_eq!(
        counts,
        [
            (
                "ratewarden_requests_total limit=reject,outcome=missing_key".to_owned(),
                2
            ),
            (
                "ratewarden_requests_total limit=skip,outcome=missing_key_skipped".to_owned(),
                2
            ),
        ]
    );
    assert_eq!((skip.skipped(), reject.skipped()), (2, 0));
}

#[tokio::test]
async fn a_header_key_is_its_value_without_surrounding_whitespace() {
    // RFC 9110 5.5: a field value excludes leading and trailing optional whitespace (SP and
    // HTAB). Reproduced: ` abc\t` was another key than `abc`, a new bucket per padding.
    let (store, _clock) = manual_store();
    let layer = RateLimitLayer::new(
        store,
        Quota::per_minute(1).unwrap(),
        ratewarden_tower::key::Header::new(http::HeaderName::from_static("x-api-key")),
    );
    let app = app().layer(layer);
    let with_key = |value: &'static [u8]| get_from("192.0.2.1:1", "/", &[("x-api-key", value)]);
    assert_eq!(
        send(&app, with_key(b"abc")).await.0.status(),
        StatusCode::OK
    );
    for padded in [&b" abc\t"[..], b"\t abc", b"abc  \t "] {
        assert_eq!(
            send(&app, with_key(padded)).await.0.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{padded:?} is the key abc"
        );
    }
    // Inner whitespace is part of the value.
    assert_eq!(
        send(&app, with_key(b"a bc")).await.0.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_header_of_whitespace_only_is_no_key() {
    for secret in [false, true] {
        let name = http::HeaderName::from_static("x-api-key");
        let extractor = if secret {
            ratewarden_tower::key::Header::secret(name)
        } else {
            ratewarden_tower::key::Header::new(name)
        };
        let quota = Quota::per_minute(1).unwrap();
        let reject = app().layer(RateLimitLayer::new(
            manual_store().0,
            quota,
            extractor.clone(),
        ));
        let skip = RateLimitLayer::new(manual_store().0, quota, extractor)
            .on_missing_key(MissingKey::Skip);
        let skipping = app().layer(skip.clone());
        for blank in [&b" "[..], b"\t", b" \t  "] {
            let req = || get_from("192.0.2.1:1", "/", &[("x-api-key", blank)]);
            assert_eq!(
                send(&reject, req()).await.0.status(),
                StatusCode::BAD_REQUEST,
                "{blank:?}: no key, the missing-key answer"
            );
            assert_eq!(send(&skipping, req()).await.0.status(), StatusCode::OK);
        }
        assert_eq!(skip.skipped(), 3);
    }
}

/// The status code of `GET /` sent to `addr` on a connection of its own (a new peer port).
async fn status_on_a_new_connection(addr: SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response.split(' ').nth(1).unwrap().to_owned()
}
