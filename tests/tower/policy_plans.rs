//! The policy layer with tenant plans from the application and temporary bans: plans add
//! their limits to the rules', a failed lookup follows its configured answer, a key denied too
//! often is refused on every gateway that shares the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use ratewarden_core::{Key, Quota, Store};
use ratewarden_tower::key::{Header, PeerIp};
use ratewarden_tower::policy::{Ban, NamedLimit, Policy, PolicyHandle, PolicyLayer, Rule};
use ratewarden_tower::tenant::{CachedResolver, OnFailure, Plan, ResolveError};

use crate::support::{get_from, header, manual_store, send};

fn quota(text: &str) -> Quota {
    text.parse().unwrap()
}

/// Every request limited per IP at `per_ip`.
fn per_ip(per_ip: &str) -> PolicyHandle {
    let policy =
        Policy::new().otherwise(Rule::new().limit(NamedLimit::new("per-ip", "ip", quota(per_ip))));
    PolicyHandle::new(policy).unwrap()
}

fn tenant(name: &str) -> [(&'static str, &[u8]); 1] {
    [("x-tenant", name.as_bytes())]
}

/// A resolver: `gold` has 3 a minute, `free` 1, anyone else is unknown; `broken` fails.
fn plans(
    lookups: &Arc<AtomicUsize>,
) -> CachedResolver<impl ratewarden_tower::tenant::QuotaResolver> {
    let lookups = Arc::clone(lookups);
    let resolver = move |tenant: &Key| {
        lookups.fetch_add(1, Ordering::SeqCst);
        let tenant = tenant.clone();
        async move {
            let per_minute = if tenant == Key::from("gold") {
                3
            } else if tenant == Key::from("free") {
                1
            } else if tenant == Key::from("broken") {
                return Err(ResolveError::new("the plans database is down"));
            } else {
                return Ok(None);
            };
            let quota = Quota::per_minute(per_minute).map_err(ResolveError::new)?;
            Ok(Some(
                Plan::new("plan", [("per-tenant", quota)]).map_err(ResolveError::new)?,
            ))
        }
    };
    CachedResolver::builder(resolver)
        .on_failure(OnFailure::Unavailable)
        .build()
        .unwrap()
}

fn app_with_plans<St: Store>(
    store: St,
    plans: CachedResolver<impl ratewarden_tower::tenant::QuotaResolver>,
) -> Router {
    let layer = PolicyLayer::builder(store, per_ip("100/min"))
        .key("ip", PeerIp::new())
        .key(
            "tenant",
            Header::new(http::HeaderName::from_static("x-tenant")),
        )
        .plans("tenant", plans)
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// A tenant's plan adds its limits to the rules': `gold` gets 3 a minute, `free` 1, each shown
/// as an item of its own; an unknown tenant gets the rules' limits only; a lookup that fails
/// answers as configured (503 here); each tenant is looked up once.
#[tokio::test]
async fn a_tenant_plan_adds_its_limits_and_a_failed_lookup_answers_as_configured() {
    let (store, _clock) = manual_store();
    let lookups = Arc::new(AtomicUsize::new(0));
    let app = app_with_plans(store, plans(&lookups));
    let from = |who: &str| get_from("192.0.2.1:1", "/", &tenant(who));
    for _ in 0..3 {
        let (ok, _) = send(&app, from("gold")).await;
        assert_eq!(ok.status(), StatusCode::OK);
        assert!(
            header(&ok, "ratelimit-policy").contains(r#""per-tenant";q=3;w=60"#),
            "{ok:?}"
        );
    }
    assert_eq!(
        send(&app, from("gold")).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(&app, from("free")).await.0.status(), StatusCode::OK);
    assert_eq!(
        send(&app, from("free")).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    for _ in 0..5 {
        let (unknown, _) = send(&app, from("nobody")).await;
        assert_eq!(unknown.status(), StatusCode::OK);
        assert!(!header(&unknown, "ratelimit-policy").contains("per-tenant"));
    }
    assert_eq!(
        send(&app, from("broken")).await.0.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    // gold, free, nobody and broken: one lookup each (failures are remembered too).
    assert_eq!(lookups.load(Ordering::SeqCst), 4);
}

/// A layer on `store` limiting per IP at 1 a minute, banning an IP denied more than 3 times
/// within a minute for `duration`; and an app under it.
fn app_with_ban<St: Store>(
    store: St,
    duration: Duration,
) -> (Router, PolicyLayer<St, axum::body::Body>) {
    let ban = Ban::new(3, Duration::from_secs(60), duration).unwrap();
    let layer = PolicyLayer::builder(store, per_ip("1/min"))
        .key("ip", PeerIp::new())
        .ban(&["ip"], ban)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone());
    (app, layer)
}

/// What `app_with_ban` answers a client's first request, its next 4 (denied: the ban's 3 and
/// one over) and the one after (banned).
const UNTIL_BANNED: [StatusCode; 6] = [
    StatusCode::OK,
    StatusCode::TOO_MANY_REQUESTS,
    StatusCode::TOO_MANY_REQUESTS,
    StatusCode::TOO_MANY_REQUESTS,
    StatusCode::TOO_MANY_REQUESTS,
    StatusCode::FORBIDDEN,
];

/// The statuses of `n` requests that `status` sends one after another.
async fn statuses<F: std::future::Future<Output = StatusCode>>(
    n: usize,
    mut status: impl FnMut() -> F,
) -> Vec<StatusCode> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(status().await);
    }
    out
}

/// `app_with_ban` on a store of its own on `server`, under `prefix`, with the store's cache of
/// denials or without.
async fn redis_gateway(
    server: &tests::redis_server::RedisServer,
    prefix: &str,
    deny_cache: bool,
) -> (
    Router,
    PolicyLayer<ratewarden_redis::RedisStore, axum::body::Body>,
) {
    let mut config = ratewarden_redis::RedisConfig::new(server.url())
        .prefix(prefix)
        .timeout(Duration::from_secs(10));
    if !deny_cache {
        config = config.deny_cache(0);
    }
    app_with_ban(config.connect().await.unwrap(), Duration::from_secs(600))
}

/// An IP denied more than 3 times in a minute is refused (403) for the ban's duration, with a
/// `Retry-After` of the time left; another IP is not; the ban ends when its time is up, and
/// the IP's limit was not counted while it stood.
#[tokio::test]
async fn a_key_denied_too_often_is_banned_for_the_duration() {
    let (store, clock) = manual_store();
    let (app, _) = app_with_ban(store, Duration::from_secs(600));
    let from = |peer: &str| get_from(peer, "/", &[]);
    let status = || async { send(&app, from("192.0.2.1:1")).await.0.status() };
    assert_eq!(statuses(5, status).await, UNTIL_BANNED[..5]);
    let (banned, _) = send(&app, from("192.0.2.1:1")).await;
    assert_eq!(banned.status(), StatusCode::FORBIDDEN);
    let retry: u64 = header(&banned, "retry-after").parse().unwrap();
    assert!((590..=600).contains(&retry), "retry-after {retry}");
    assert_eq!(
        send(&app, from("192.0.2.2:1")).await.0.status(),
        StatusCode::OK
    );
    // Past the minute the limit would admit again: the ban still stands.
    clock.advance(Duration::from_secs(120));
    assert_eq!(
        send(&app, from("192.0.2.1:1")).await.0.status(),
        StatusCode::FORBIDDEN
    );
    clock.advance(Duration::from_secs(481));
    assert_eq!(
        send(&app, from("192.0.2.1:1")).await.0.status(),
        StatusCode::OK
    );
}

/// With Redis, a ban one gateway writes binds every other gateway from its next request, and
/// a ban one lifts is lifted for every other: two layers on two stores of one server.
#[tokio::test]
async fn a_ban_written_by_one_gateway_binds_another_at_once() {
    let server = tests::redis_server::RedisServer::start();
    let (a, lifts) = redis_gateway(&server, "bans", false).await;
    let (b, _) = redis_gateway(&server, "bans", false).await;
    let from = || get_from("192.0.2.7:1", "/", &[]);
    let status = || async { send(&a, from()).await.0.status() };
    assert_eq!(statuses(5, status).await, UNTIL_BANNED[..5]);
    assert_eq!(send(&b, from()).await.0.status(), StatusCode::FORBIDDEN);
    assert_eq!(send(&a, from()).await.0.status(), StatusCode::FORBIDDEN);
    let client: std::net::IpAddr = "192.0.2.7".parse().unwrap();
    lifts.lift_ban("ip", &Key::from(client)).await.unwrap();
    // Limited again (1 a minute, spent), no longer refused.
    assert_eq!(
        send(&b, from()).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// The `X-RateLimit-*` fields of an admitted request show its limits, never its ban's probe;
/// `global` cannot be banned, nor a key no extractor is registered for.
#[tokio::test]
async fn headers_show_the_limits_and_bans_name_single_clients() {
    let (store, _clock) = manual_store();
    let ban = Ban::new(3, Duration::from_secs(60), Duration::from_secs(600)).unwrap();
    let layer = PolicyLayer::builder(store, per_ip("100/min"))
        .key("ip", PeerIp::new())
        .ban(&["ip"], ban)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let (ok, _) = send(&app, get_from("192.0.2.1:1", "/", &[])).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(header(&ok, "x-ratelimit-limit"), "100");
    assert_eq!(header(&ok, "x-ratelimit-remaining"), "99");
    for keys in [&["global"][..], &["user"][..]] {
        let (store, _clock) = manual_store();
        let built = PolicyLayer::<_, axum::body::Body>::builder(store, per_ip("1/min"))
            .key("ip", PeerIp::new())
            .ban(keys, ban)
            .build();
        assert!(built.is_err(), "bans of {keys:?} were accepted");
    }
}

/// A tenant key sent twice (which the application may read as either) is refused, never a way
/// out of the tenant's plan.
#[tokio::test]
async fn a_tenant_key_sent_twice_is_refused() {
    let (store, _clock) = manual_store();
    let app = app_with_plans(store, plans(&Arc::new(AtomicUsize::new(0))));
    let twice = get_from(
        "192.0.2.1:1",
        "/",
        &[("x-tenant", b"gold"), ("x-tenant", b"free")],
    );
    let (refused, _) = send(&app, twice).await;
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
}

/// A ban on the tenant key counts denials of the tenant's plan limits, though no rule limits
/// by tenant: `free` (1 a minute) denied more than 3 times in a minute is refused (403), on
/// every route its plan applies to; `gold` is not.
#[tokio::test]
async fn a_tenant_its_plan_denies_too_often_is_banned() {
    let (store, _clock) = manual_store();
    let lookups = Arc::new(AtomicUsize::new(0));
    let ban = Ban::new(3, Duration::from_secs(60), Duration::from_secs(600)).unwrap();
    let layer = PolicyLayer::builder(store, per_ip("100/min"))
        .key("ip", PeerIp::new())
        .key(
            "tenant",
            Header::new(http::HeaderName::from_static("x-tenant")),
        )
        .plans("tenant", plans(&lookups))
        .ban(&["tenant"], ban)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let from = |peer: &str, who: &str| get_from(peer, "/", &tenant(who));
    let status = || async { send(&app, from("192.0.2.1:1", "free")).await.0.status() };
    assert_eq!(statuses(5, status).await, UNTIL_BANNED[..5]);
    // From another address too: the tenant is banned, not the address.
    let (banned, _) = send(&app, from("192.0.2.2:1", "free")).await;
    assert_eq!(banned.status(), StatusCode::FORBIDDEN, "{banned:?}");
    assert_eq!(
        send(&app, from("192.0.2.1:1", "gold")).await.0.status(),
        StatusCode::OK
    );
}

/// An operator lifts a ban: the client is limited again (not refused), its denials start
/// from none, and an IPv6 client's ban is lifted by any address of its network. A key name
/// the layer does not ban is an error, never a silent no-op.
#[tokio::test]
async fn a_lifted_ban_lets_the_client_back_under_its_limits() {
    let (store, _clock) = manual_store();
    let (app, layer) = app_with_ban(store, Duration::from_secs(600));
    for (peer, lift) in [
        ("192.0.2.1:1", "192.0.2.1"),
        ("[2001:db8::9]:1", "2001:db8::5"),
    ] {
        let status = || async { send(&app, get_from(peer, "/", &[])).await.0.status() };
        assert_eq!(statuses(6, status).await, UNTIL_BANNED, "{peer}");
        let client: std::net::IpAddr = lift.parse().unwrap();
        layer.lift_ban("ip", &Key::from(client)).await.unwrap();
        // Denied again by its limit, and banned only after 4 more denials.
        let again = statuses(5, status).await;
        assert_eq!(again, UNTIL_BANNED[1..], "{peer} banned again");
    }
    assert!(layer.lift_ban("user", &Key::from("alice")).await.is_err());
}

/// A ban counted and written by gateway `b`, lifted from gateway `a`: `b`'s next denials
/// count from none again, though `b` keeps a cache of Redis's denials (the default), and a
/// client lifted by its address written as text is lifted.
#[tokio::test]
async fn a_ban_lifted_on_one_gateway_stays_lifted_on_another_that_caches_denials() {
    let server = tests::redis_server::RedisServer::start();
    let (_, lifts) = redis_gateway(&server, "lifted", true).await;
    let (b, _) = redis_gateway(&server, "lifted", true).await;
    let status = || async { send(&b, get_from("192.0.2.8:1", "/", &[])).await.0.status() };
    assert_eq!(statuses(6, status).await, UNTIL_BANNED);
    lifts.lift_ban("ip", &Key::from("192.0.2.8")).await.unwrap();
    assert_eq!(statuses(5, status).await, UNTIL_BANNED[1..], "banned again");
}
