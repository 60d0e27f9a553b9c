//! The policy layer: rules, lists, several limits decided together, multi-item headers,
//! reloads from files (three ways of replacing one), and quota changes across reloads.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use http::{Response, StatusCode};
use proptest::prelude::*;
use ratewarden_core::{Decision, Decisions, Key, Limit, Quota, Store, StoreError, StoreErrorKind};
use ratewarden_tower::key::{Header, PeerIp};
use ratewarden_tower::policy::{
    AccessList, Action, MatchMode, NamedLimit, OnStoreError, Policy, PolicyHandle, PolicyLayer,
    Rule, load_file, watch,
};
use ratewarden_tower::rate_limit::MissingKey;
use tower::ServiceExt;

use crate::support::{TempDir, get_from, header, manual_store, policy_file, send};

fn quota(text: &str) -> Quota {
    text.parse().unwrap()
}

fn limit(name: &str, key: &str, q: &str) -> NamedLimit {
    NamedLimit::new(name, key, quota(q))
}

fn routes() -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/api/{id}", get(|| async { "item" }))
        .route("/upload", post(|| async { "stored" }))
}

/// An app whose policy layer keys `ip` by peer address and `user` by `x-user`.
fn app_with<St: Store>(store: St, handle: &PolicyHandle) -> Router {
    let layer = PolicyLayer::builder(store, handle.clone())
        .key("ip", PeerIp::new())
        .key("user", Header::new(http::HeaderName::from_static("x-user")))
        .build()
        .unwrap();
    routes().layer(layer)
}

fn user(name: &str) -> [(&'static str, &[u8]); 1] {
    [("x-user", name.as_bytes())]
}

/// The items of a Structured Field list, by an independent parser: (name, parameters).
fn items(field: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let list: sfv::List = sfv::Parser::new(field).parse().unwrap();
    list.into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("an inner list in {field:?}");
            };
            let name = item.bare_item.as_string().unwrap().as_str().to_owned();
            let params = item
                .params
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), v.as_integer().unwrap().into()))
                .collect();
            (name, params)
        })
        .collect()
}

#[tokio::test]
async fn first_match_takes_the_first_rule_by_matched_route() {
    let (store, _clock) = manual_store();
    let policy = Policy::new()
        .rule(
            Rule::new()
                .route("/api/{id}")
                .limit(limit("items", "ip", "1/min")),
        )
        .rule(
            Rule::new()
                .route("/api/*")
                .limit(limit("api", "ip", "100/min")),
        )
        .otherwise(Rule::new().limit(limit("rest", "ip", "2/min")));
    let handle = PolicyHandle::new(policy).unwrap();
    let app = app_with(store, &handle);
    let (ok, _) = send(&app, get_from("192.0.2.1:1", "/api/7", &[])).await;
    assert_eq!(header(&ok, "ratelimit-policy"), r#""items";q=1;w=60"#);
    // Another id is the same route: the same limit, spent.
    let (limited, _) = send(&app, get_from("192.0.2.1:1", "/api/8", &[])).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    let (rest, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
    assert_eq!(header(&rest, "ratelimit-policy"), r#""rest";q=2;w=60"#);
}

#[tokio::test]
async fn all_matches_decide_every_limit_together_and_deny_wins() {
    let (store, _clock) = manual_store();
    let policy = Policy::new()
        .match_mode(MatchMode::All)
        .rule(
            Rule::new()
                .route("/*")
                .limit(limit("per-ip", "ip", "100/min")),
        )
        .rule(
            Rule::new()
                .route("/upload")
                .limit(limit("uploads", "user", "1/min"))
                .cost(1),
        )
        .rule(Rule::new().route("/").action(Action::Allow))
        .rule(Rule::new().header("x-blocked", None).action(Action::Deny));
    let handle = PolicyHandle::new(policy).unwrap();
    let app = app_with(store, &handle);
    let upload = |who: &str| {
        let mut req = get_from("192.0.2.1:1", "/upload", &user(who));
        *req.method_mut() = http::Method::POST;
        req
    };
    let (first, _) = send(&app, upload("ann")).await;
    assert_eq!(first.status(), StatusCode::OK);
    let parsed = items(header(&first, "ratelimit"));
    assert_eq!(
        parsed.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["per-ip", "uploads"]
    );
    // The upload limit denies: nothing is counted, so the IP limit keeps its 99.
    let (second, _) = send(&app, upload("ann")).await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    let (other, _) = send(&app, upload("bob")).await;
    let parsed = items(header(&other, "ratelimit"));
    assert_eq!(parsed[0].1[0], ("r".to_owned(), 98), "{parsed:?}");
    // `/` matches `/*` (limit) and `/` (allow): limit wins over allow.
    let (root, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
    assert!(header(&root, "ratelimit-policy").contains("per-ip"));
    // Deny wins over everything.
    let (blocked, _) = send(&app, get_from("192.0.2.1:1", "/", &[("x-blocked", b"1")])).await;
    assert_eq!(blocked.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn headers_carry_one_item_per_limit_and_retry_after_the_longest_wait() {
    let (store, _clock) = manual_store();
    let policy = Policy::new().otherwise(
        Rule::new()
            .limit(limit("per-ip", "ip", "100/min"))
            .limit(limit("per-user", "user", "1/s"))
            .limit(limit("per-user-hour", "user", "2/h")),
    );
    let handle = PolicyHandle::new(policy).unwrap();
    let app = app_with(store, &handle);
    let req = || get_from("192.0.2.1:1", "/", &user("ann"));
    let (ok, _) = send(&app, req()).await;
    let policy_items = items(header(&ok, "ratelimit-policy"));
    let expected = [
        ("per-ip", 100, 60),
        ("per-user", 1, 1),
        ("per-user-hour", 2, 3600),
    ];
    assert_eq!(policy_items.len(), 3);
    for ((name, params), (want, q, w)) in policy_items.iter().zip(expected) {
        assert_eq!(name, want);
        assert_eq!(params, &[("q".to_owned(), q), ("w".to_owned(), w)]);
    }
    let ratelimit = items(header(&ok, "ratelimit"));
    let remaining: Vec<i64> = ratelimit.iter().map(|(_, p)| p[0].1).collect();
    assert_eq!(remaining, [99, 0, 1]);
    // X-RateLimit-* show the limit closest to exhaustion.
    assert_eq!(header(&ok, "x-ratelimit-limit"), "1");
    assert_eq!(header(&ok, "x-ratelimit-remaining"), "0");

    // Denied by the per-second limit (1 s) and not the hourly one: Retry-After is 1.
    let (denied, _) = send(&app, req()).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "retry-after"), "1");
    let ratelimit = items(header(&denied, "ratelimit"));
    assert_eq!(ratelimit.len(), 3);
}

#[tokio::test]
async fn retry_after_is_the_longest_wait_of_the_denying_limits() {
    let (store, clock) = manual_store();
    let policy = Policy::new().otherwise(
        Rule::new()
            .limit(limit("per-second", "user", "1/s"))
            .limit(limit("per-hour", "user", "2/h")),
    );
    let handle = PolicyHandle::new(policy).unwrap();
    let app = app_with(store, &handle);
    let req = || get_from("192.0.2.1:1", "/", &user("ann"));
    assert_eq!(send(&app, req()).await.0.status(), StatusCode::OK);
    clock.advance(Duration::from_secs(1));
    assert_eq!(send(&app, req()).await.0.status(), StatusCode::OK);
    // Both deny now: the hourly one waits longest (1,800 s for its next unit, less the 1 s).
    let (denied, _) = send(&app, req()).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "retry-after"), "1799");
}

#[tokio::test]
async fn lists_allow_uncounted_and_deny_by_key_and_network() {
    let (store, _clock) = manual_store();
    let policy = Policy::new()
        .otherwise(Rule::new().limit(limit("per-ip", "ip", "1/min")))
        .allow_list(
            AccessList::new()
                .network("ip", "10.0.0.0/8".parse().unwrap())
                .network("ip", "2001:db8:1::/48".parse().unwrap())
                .value("user", "health-checker"),
        )
        .deny_list(
            AccessList::new()
                .entry("ip", "192.0.2.66")
                .network("ip", "2001:db8:bad::/48".parse().unwrap())
                .value("user", "mallory"),
        );
    let handle = PolicyHandle::new(policy).unwrap();
    let app = app_with(store, &handle);
    for peer in ["10.1.2.3:1", "[2001:db8:1::7]:1"] {
        for _ in 0..3 {
            let (ok, _) = send(&app, get_from(peer, "/", &[])).await;
            assert_eq!(ok.status(), StatusCode::OK, "{peer}");
            assert_eq!(header(&ok, "ratelimit"), "", "allowed: not counted");
        }
    }
    for _ in 0..3 {
        let (ok, _) = send(&app, get_from("192.0.2.1:1", "/", &user("health-checker"))).await;
        assert_eq!(ok.status(), StatusCode::OK);
    }
    for (peer, who) in [
        ("192.0.2.66:1", "ann"),
        ("[2001:db8:bad::1]:1", "ann"),
        ("192.0.2.2:1", "mallory"),
    ] {
        let (refused, body) = send(&app, get_from(peer, "/", &user(who))).await;
        assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{peer} {who}");
        assert!(String::from_utf8_lossy(&body).contains("403"));
    }
    // Deny wins over allow: a listed network member named on the deny list is refused.
    let (refused, _) = send(&app, get_from("10.0.0.1:1", "/", &user("mallory"))).await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_missing_key_gets_the_missing_key_answer_or_is_left_out() {
    let (store, _clock) = manual_store();
    let policy = Policy::new().otherwise(
        Rule::new()
            .limit(limit("per-ip", "ip", "10/min"))
            .limit(limit("per-user", "user", "1/min")),
    );
    let handle = PolicyHandle::new(policy).unwrap();
    let app = app_with(store, &handle);
    let (refused, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);

    let (store, _clock) = manual_store();
    let skipping = PolicyLayer::builder(store, handle.clone())
        .key("ip", PeerIp::new())
        .key("user", Header::new(http::HeaderName::from_static("x-user")))
        .on_missing_key(MissingKey::Skip)
        .build()
        .unwrap();
    let app = routes().layer(skipping);
    let (ok, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(header(&ok, "ratelimit-policy"), r#""per-ip";q=10;w=60"#);
}

#[test]
fn a_policy_naming_an_unregistered_key_is_refused_when_loaded() {
    let (store, _clock) = manual_store();
    let handle =
        PolicyHandle::new(Policy::new().otherwise(Rule::new().limit(limit("t", "tenant", "1/s"))))
            .unwrap();
    let err = PolicyLayer::<_, Body>::builder(store, handle)
        .key("ip", PeerIp::new())
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "default.limits[0].key");
    // Once a layer is built on the handle, a policy it cannot serve is refused.
    let (store, _clock) = manual_store();
    let handle = PolicyHandle::new(Policy::new()).unwrap();
    let _layer = PolicyLayer::<_, Body>::builder(store, handle.clone())
        .key("ip", PeerIp::new())
        .build()
        .unwrap();
    let err = handle
        .store(Policy::new().otherwise(Rule::new().limit(limit("t", "tenant", "1/s"))))
        .unwrap_err();
    assert_eq!(err.field(), "default.limits[0].key");
    assert_eq!(handle.reloads().error(), 1);
}

/// A store that always fails.
#[derive(Clone, Debug)]
struct Down;

impl Store for Down {
    async fn check(&self, _: &Key, _: &Quota, _: u32) -> Result<Decision, StoreError> {
        Err(StoreError::new(StoreErrorKind::Connection))
    }

    async fn check_all(&self, _: &[Limit]) -> Result<Decisions, StoreError> {
        Err(StoreError::new(StoreErrorKind::Connection))
    }

    async fn peek(&self, _: &Key, _: &Quota) -> Result<Decision, StoreError> {
        Err(StoreError::new(StoreErrorKind::Connection))
    }

    async fn reset(&self, _: &Key, _: &Quota) -> Result<(), StoreError> {
        Err(StoreError::new(StoreErrorKind::Connection))
    }
}

#[tokio::test]
async fn a_failing_store_lets_through_answers_503_or_decides_locally() {
    let policy = Policy::new().otherwise(Rule::new().limit(limit("per-ip", "ip", "1/min")));
    let handle = PolicyHandle::new(policy).unwrap();
    let with = |mode| {
        let layer = PolicyLayer::builder(Down, handle.clone())
            .key("ip", PeerIp::new())
            .on_store_error(mode)
            .build()
            .unwrap();
        routes().layer(layer)
    };
    let req = || get_from("192.0.2.1:1", "/", &[]);
    let open = with(OnStoreError::Open);
    for _ in 0..3 {
        assert_eq!(send(&open, req()).await.0.status(), StatusCode::OK);
    }
    let (closed, _) = send(&with(OnStoreError::Closed), req()).await;
    assert_eq!(closed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&closed, "retry-after"), "1");
    let fallback = with(OnStoreError::Fallback);
    assert_eq!(send(&fallback, req()).await.0.status(), StatusCode::OK);
    assert_eq!(
        send(&fallback, req()).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

// ---------------------------------------------------------------------------------------
// Reloads from files.

/// Sends requests (a fresh client address each) until the response's policy shows
/// `quota_items`, for at most `within`; returns how long it took.
async fn decided_by(app: &Router, expected: &str, within: Duration) -> Duration {
    let started = Instant::now();
    let mut n = 0_u32;
    loop {
        n += 1;
        let peer = format!("198.51.100.{}:1", n % 250 + 1);
        let (response, _) = send(app, get_from(&peer, "/", &[])).await;
        if header(&response, "ratelimit-policy") == expected {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "the new policy did not decide within {within:?}: still {:?}",
            header(&response, "ratelimit-policy")
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Loads `file`, watches it, and returns the app, the handle and the guard.
fn watched(file: &Path) -> (Router, PolicyHandle, ratewarden_tower::policy::WatchGuard) {
    let handle = PolicyHandle::new(load_file(file).unwrap()).unwrap();
    let (store, _clock) = manual_store();
    let app = app_with(store, &handle);
    let guard = watch(file, handle.clone()).unwrap();
    (app, handle, guard)
}

const FIVE: &str = r#""per-ip";q=5;w=60"#;
const FIFTY: &str = r#""per-ip";q=50;w=60"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_written_in_place_is_reloaded_within_a_second() {
    let dir = TempDir::new("in-place");
    let file = dir.0.join("policy.toml");
    std::fs::write(&file, policy_file("5/min")).unwrap();
    let (app, handle, _guard) = watched(&file);
    decided_by(&app, FIVE, Duration::from_secs(1)).await;
    std::fs::write(&file, policy_file("50/min")).unwrap();
    decided_by(&app, FIFTY, Duration::from_secs(1)).await;
    assert_eq!(handle.reloads().ok(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_renamed_over_is_reloaded_within_a_second() {
    let dir = TempDir::new("rename");
    let file = dir.0.join("policy.toml");
    std::fs::write(&file, policy_file("5/min")).unwrap();
    let (app, handle, _guard) = watched(&file);
    let temporary = dir.0.join(".policy.toml.tmp");
    std::fs::write(&temporary, policy_file("50/min")).unwrap();
    std::fs::rename(&temporary, &file).unwrap();
    decided_by(&app, FIFTY, Duration::from_secs(1)).await;
    assert_eq!(handle.reloads().ok(), 1);
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_symlink_swap_is_reloaded_within_a_second() {
    use std::os::unix::fs::symlink;
    // The layout the kubelet writes: policy.toml -> ..data/policy.toml, ..data -> ..<stamp>.
    let dir = TempDir::new("configmap");
    let first = dir.0.join("..2026_01_01_00_00_00.000000001");
    std::fs::create_dir(&first).unwrap();
    std::fs::write(first.join("policy.toml"), policy_file("5/min")).unwrap();
    symlink("..2026_01_01_00_00_00.000000001", dir.0.join("..data")).unwrap();
    symlink("..data/policy.toml", dir.0.join("policy.toml")).unwrap();
    let file = dir.0.join("policy.toml");
    let (app, handle, _guard) = watched(&file);
    decided_by(&app, FIVE, Duration::from_secs(1)).await;
    // The update: a new directory, a new symlink renamed over `..data`, the old one removed.
    let second = dir.0.join("..2026_01_01_00_01_00.000000002");
    std::fs::create_dir(&second).unwrap();
    std::fs::write(second.join("policy.toml"), policy_file("50/min")).unwrap();
    symlink("..2026_01_01_00_01_00.000000002", dir.0.join("..data_tmp")).unwrap();
    std::fs::rename(dir.0.join("..data_tmp"), dir.0.join("..data")).unwrap();
    std::fs::remove_dir_all(&first).unwrap();
    decided_by(&app, FIFTY, Duration::from_secs(1)).await;
    assert_eq!(handle.reloads().ok(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_file_keeps_the_running_policy_and_counts_an_error() {
    let dir = TempDir::new("invalid");
    let file = dir.0.join("policy.toml");
    std::fs::write(&file, policy_file("5/min")).unwrap();
    let (app, handle, guard) = watched(&file);
    std::fs::write(&file, policy_file("5/fortnight")).unwrap();
    let started = Instant::now();
    while handle.reloads().error() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "no error counted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(handle.reloads().ok(), 0);
    decided_by(&app, FIVE, Duration::from_millis(1)).await;
    // A valid file after it is taken again; and once the guard is gone, nothing is.
    std::fs::write(&file, policy_file("50/min")).unwrap();
    decided_by(&app, FIFTY, Duration::from_secs(1)).await;
    drop(guard);
    std::fs::write(&file, policy_file("5/min")).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    decided_by(&app, FIFTY, Duration::from_millis(1)).await;
}

/// Version `n`'s policy: one limit named after it, with a quota that says which it is.
fn version(n: u32) -> Policy {
    Policy::new().otherwise(
        Rule::new().limit(NamedLimit::new(
            &format!("v{n}"),
            "global",
            Quota::per_second(1_000)
                .unwrap()
                .with_burst(1_000_000 + n)
                .unwrap(),
        )),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_reloads_under_load_drop_no_request_and_never_mix_policies() {
    let (store, _clock) = manual_store();
    let handle = PolicyHandle::new(version(0)).unwrap();
    let app = app_with(store, &handle);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for task in 0..2 {
        let (app, done) = (app.clone(), Arc::clone(&done));
        clients.push(tokio::spawn(async move {
            let mut answered = 0_u32;
            // Bounded: at most 200,000 requests each, ending when the reloads do.
            for i in 0..200_000_u32 {
                if done.load(Ordering::Relaxed) && i > 0 {
                    break;
                }
                let peer = format!("192.0.2.{}:1", task + 1);
                let response: Response<Body> = app
                    .clone()
                    .oneshot(get_from(&peer, "/", &[]))
                    .await
                    .unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                let policy = response.headers()["ratelimit-policy"].to_str().unwrap();
                let parsed = items(policy);
                assert_eq!(parsed.len(), 1, "one version's limit: {policy}");
                let n: u32 = parsed[0].0.strip_prefix('v').unwrap().parse().unwrap();
                assert_eq!(parsed[0].1[0].1, i64::from(1_000_000 + n), "{policy}");
                let ratelimit = items(response.headers()["ratelimit"].to_str().unwrap());
                assert_eq!(ratelimit.len(), 1);
                assert_eq!(ratelimit[0].0, parsed[0].0, "both fields from one version");
                answered += 1;
            }
            answered
        }));
    }
    // Reloads on a thread of their own, while the clients' requests run on the runtime.
    let reloader = {
        let handle = handle.clone();
        std::thread::spawn(move || {
            for n in 1..=1_000 {
                handle.store(version(n)).unwrap();
                std::thread::sleep(Duration::from_micros(100));
            }
        })
    };
    tokio::task::spawn_blocking(move || reloader.join().unwrap())
        .await
        .unwrap();
    done.store(true, Ordering::Relaxed);
    for client in clients {
        assert!(client.await.unwrap() > 0);
    }
    assert_eq!(handle.reloads().ok(), 1_000);
    assert_eq!(handle.version(), 1_000);
}

// ---------------------------------------------------------------------------------------
// Quota changes across reloads.

/// GCRA quotas with small figures, so that bounds are exact: `burst + ⌊L / T⌋` in any
/// closed interval of length `L`, `T` the emission interval.
const QUOTAS: [&str; 6] = [
    "2/s",
    "4/s",
    "1/s burst 3",
    "3/2s",
    "5/s burst 2",
    "2/s burst 5",
];

fn bound(q: &Quota, micros: u64) -> u64 {
    u64::from(q.burst()) + micros / q.emission_interval_micros()
}

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Check(u8),
    Reload(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1_u64..800).prop_map(|ms| Op::Advance(ms * 1_000 + 7)),
        5 => (1_u8..5).prop_map(Op::Check),
        1 => (0..QUOTAS.len()).prop_map(Op::Reload),
    ]
}

/// Runs `ops` through a policy layer on a manual clock; returns each admission's time and
/// the index of the policy that decided it, and the reloads (time, quota), the first at the
/// start.
fn simulate(start: usize, ops: &[Op]) -> (Vec<(u64, usize)>, Vec<(u64, Quota)>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (store, clock) = manual_store();
    let one =
        |i: usize| Policy::new().otherwise(Rule::new().limit(limit("per-ip", "ip", QUOTAS[i])));
    let handle = PolicyHandle::with_clock(one(start), clock.clone()).unwrap();
    let layer = PolicyLayer::builder(store, handle.clone())
        .key("ip", PeerIp::new())
        .on_store_error(OnStoreError::Closed)
        .build()
        .unwrap();
    let app = routes().layer(layer);
    let now = || ratewarden_core::Clock::now(&clock).as_micros();
    let mut admitted = Vec::new();
    let mut reloads = vec![(now(), quota(QUOTAS[start]))];
    runtime.block_on(async {
        for op in ops {
            match *op {
                Op::Advance(micros) => clock.advance(Duration::from_micros(micros)),
                Op::Check(n) => {
                    for _ in 0..n {
                        let response = app
                            .clone()
                            .oneshot(get_from("192.0.2.1:1", "/", &[]))
                            .await
                            .unwrap();
                        match response.status() {
                            StatusCode::OK => admitted.push((now(), reloads.len() - 1)),
                            StatusCode::TOO_MANY_REQUESTS => {}
                            other => panic!("unexpected {other}"),
                        }
                    }
                }
                Op::Reload(i) => {
                    handle.store(one(i)).unwrap();
                    reloads.push((now(), quota(QUOTAS[i])));
                }
            }
        }
    });
    (admitted, reloads)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// For admissions at `u ≤ v`, with `q` the quota in force at `u` and `t` the next
    /// reload: if `v` is before `t + horizon(q)` (or no reload follows), `q`'s state saw
    /// every admission of `[u, v]`, so they are at most `q`'s bound for `v - u`. So no
    /// reload hands out a fresh quota within the previous one's horizon.
    #[test]
    fn a_reload_never_admits_more_than_the_previous_quota_within_its_horizon(
        start in 0..QUOTAS.len(),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let (admitted, reloads) = simulate(start, &ops);
        for (i, &(u, k)) in admitted.iter().enumerate() {
            // The policy that decided u, and the reload that replaced it.
            let q = reloads[k].1;
            let covered_until = reloads.get(k + 1).map_or(u64::MAX, |(t, _)| {
                let horizon = ratewarden_core::Quota::period_micros(&q)
                    .max(q.tolerance_micros());
                t + horizon
            });
            for (j, &(v, _)) in admitted.iter().enumerate().skip(i) {
                if v >= covered_until {
                    break;
                }
                let count = (j - i + 1) as u64;
                prop_assert!(
                    count <= bound(&q, v - u),
                    "{count} admitted in [{u}, {v}] under {q} (bound {}); reloads {reloads:?}",
                    bound(&q, v - u)
                );
            }
        }
    }

    /// Any interval, however long and however many reloads it spans, admits at most the sum
    /// of each quota's bound over the part of it that quota was in force: the bound
    /// `PolicyHandle` states for an interval longer than a transition.
    #[test]
    fn a_reload_never_admits_more_than_each_quota_over_its_part(
        start in 0..QUOTAS.len(),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let (admitted, reloads) = simulate(start, &ops);
        // The bound of [u, v]: cut at each reload, each part under the quota then in force
        // (a part ends at the next reload, which may come at the same microsecond as an
        // admission still under it).
        let parts_bound = |u: u64, v: u64| -> u64 {
            let mut total = 0;
            for (k, &(t, q)) in reloads.iter().enumerate() {
                let end = reloads.get(k + 1).map_or(u64::MAX, |&(next, _)| next);
                let (from, to) = (u.max(t), v.min(end));
                if from <= to {
                    total += bound(&q, to - from);
                }
            }
            total
        };
        for (i, &(u, _)) in admitted.iter().enumerate() {
            for (j, &(v, _)) in admitted.iter().enumerate().skip(i) {
                let count = (j - i + 1) as u64;
                prop_assert!(
                    count <= parts_bound(u, v),
                    "{count} admitted in [{u}, {v}] (bound {}); reloads {reloads:?}",
                    parts_bound(u, v)
                );
            }
        }
    }
}
