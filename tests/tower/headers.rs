//! Exact header values, and an honest Retry-After.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::StatusCode;
use ratewarden_core::Quota;
use ratewarden_tower::RateLimitLayer;
use ratewarden_tower::key::PeerIp;
use ratewarden_tower::rate_limit::HeaderStyle;

use crate::support::{app, get_from, header, manual_store, send};

#[tokio::test]
async fn admitted_and_denied_responses_carry_exact_headers() {
    let (store, _clock) = manual_store();
    let layer =
        RateLimitLayer::new(store, Quota::per_minute(3).unwrap(), PeerIp::new()).name("api");
    let app = app().layer(layer);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();

    let (ok, body) = send(&app, get_from("192.0.2.1:1000", "/", &[])).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(body, "ok");
    assert_eq!(header(&ok, "x-ratelimit-limit"), "3");
    assert_eq!(header(&ok, "x-ratelimit-remaining"), "2");
    assert_eq!(header(&ok, "ratelimit-policy"), r#""api";q=3;w=60"#);
    // One unit used; it refills in 20 s.
    assert_eq!(header(&ok, "ratelimit"), r#""api";r=2;t=20"#);
    let reset: u64 = header(&ok, "x-ratelimit-reset").parse().unwrap();
    assert!((now + 20..=now + 22).contains(&reset), "{reset} vs {now}");
    assert!(ok.headers().get("retry-after").is_none());

    for remaining in ["1", "0"] {
        let (ok, _) = send(&app, get_from("192.0.2.1:1001", "/", &[])).await;
        assert_eq!(header(&ok, "x-ratelimit-remaining"), remaining);
    }
    let (denied, body) = send(&app, get_from("192.0.2.1:1002", "/", &[])).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "retry-after"), "20");
    assert_eq!(header(&denied, "x-ratelimit-limit"), "3");
    assert_eq!(header(&denied, "x-ratelimit-remaining"), "0");
    assert_eq!(header(&denied, "ratelimit"), r#""api";r=0;t=20"#);
    assert_eq!(header(&denied, "ratelimit-policy"), r#""api";q=3;w=60"#);
    assert_eq!(header(&denied, "content-type"), "application/problem+json");
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["title"], "Too Many Requests");
    assert_eq!(
        problem["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );

    // Another client is not affected.
    let (other, _) = send(&app, get_from("192.0.2.2:1000", "/", &[])).await;
    assert_eq!(other.status(), StatusCode::OK);
}

#[tokio::test]
async fn header_styles_select_the_fields() {
    for (style, ietf, x) in [
        (HeaderStyle::Ietf, true, false),
        (HeaderStyle::XRateLimit, false, true),
        (HeaderStyle::Both, true, true),
        (HeaderStyle::None, false, false),
    ] {
        let (store, _clock) = manual_store();
        let layer =
            RateLimitLayer::new(store, Quota::per_second(1).unwrap(), PeerIp::new()).headers(style);
        let app = app().layer(layer);
        for expect_denied in [false, true] {
            let (response, _) = send(&app, get_from("192.0.2.9:1", "/", &[])).await;
            assert_eq!(
                response.headers().contains_key("ratelimit"),
                ietf,
                "{style:?}"
            );
            assert_eq!(response.headers().contains_key("ratelimit-policy"), ietf);
            assert_eq!(response.headers().contains_key("x-ratelimit-limit"), x);
            assert_eq!(
                response.headers().contains_key("retry-after"),
                expect_denied
            );
        }
    }
}

#[tokio::test]
async fn headers_on_allowed_responses_can_be_turned_off() {
    let (store, _clock) = manual_store();
    let layer = RateLimitLayer::new(store, Quota::per_second(1).unwrap(), PeerIp::new())
        .headers_on_allowed(false);
    let app = app().layer(layer);
    let (ok, _) = send(&app, get_from("192.0.2.9:1", "/", &[])).await;
    assert!(ok.headers().get("x-ratelimit-remaining").is_none());
    let (denied, _) = send(&app, get_from("192.0.2.9:1", "/", &[])).await;
    assert_eq!(header(&denied, "x-ratelimit-remaining"), "0");
}

#[tokio::test]
async fn waiting_retry_after_lets_the_next_request_through() {
    let (store, clock) = manual_store();
    // 7 per minute: one every 8.571... s, so Retry-After must round up.
    let layer = RateLimitLayer::new(store, Quota::per_minute(7).unwrap(), PeerIp::new());
    let app = app().layer(layer);
    let peer = "198.51.100.1:4000";
    for _ in 0..7 {
        let (ok, _) = send(&app, get_from(peer, "/", &[])).await;
        assert_eq!(ok.status(), StatusCode::OK);
    }
    for _ in 0..3 {
        let (denied, _) = send(&app, get_from(peer, "/", &[])).await;
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        let retry: u64 = header(&denied, "retry-after").parse().unwrap();
        assert!((8..=9).contains(&retry), "{retry}");
        // Retry-After rounds up: a second less is too early...
        clock.advance(Duration::from_secs(retry - 1));
        let (early, _) = send(&app, get_from(peer, "/", &[])).await;
        assert_eq!(early.status(), StatusCode::TOO_MANY_REQUESTS);
        // ...and a client that waits the whole Retry-After is admitted.
        clock.advance(Duration::from_secs(1));
        let (ok, _) = send(&app, get_from(peer, "/", &[])).await;
        assert_eq!(ok.status(), StatusCode::OK, "after waiting {retry} s");
    }
}

#[tokio::test]
async fn each_layer_names_its_own_policy_even_when_its_headers_are_made_per_request() {
    // Reproduced: the per-thread cache of the last `RateLimit` value was keyed by
    // the address of its policy's prefix. The headers of a quota other than a layer's first
    // are made per request and freed after it, the next layer's landed at the same address,
    // and 200 of 200 of its responses carried the other layer's name.
    use tower::ServiceExt;
    let first = Quota::per_minute(7).unwrap();
    let per_request = Quota::per_minute(100).unwrap();
    let policy = move |req: &http::Request<axum::body::Body>| {
        Some(if req.uri().path() == "/search" {
            first
        } else {
            per_request
        })
    };
    let layer = |name: &str| {
        let (store, _clock) = manual_store();
        app().layer(
            RateLimitLayer::new(store, first, PeerIp::new())
                .quota_by(policy)
                .name(name),
        )
    };
    let (alpha, bravo) = (layer("alpha-policy-a"), layer("bravo-policy-b"));
    let mut seen = Vec::new();
    for peer in 1..=200u32 {
        let peer = std::net::SocketAddr::from((std::net::Ipv4Addr::from(0x0a00_0000 + peer), 1000));
        for app in [&alpha, &bravo] {
            let mut req = http::Request::get("/")
                .body(axum::body::Body::empty())
                .unwrap();
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            let response = app.clone().oneshot(req).await.unwrap();
            let value = response.headers().get("ratelimit").unwrap().clone();
            drop(response);
            seen.push(value);
        }
    }
    for pair in seen.chunks(2) {
        assert_eq!(pair[0], "\"alpha-policy-a\";r=99;t=1");
        assert_eq!(pair[1], "\"bravo-policy-b\";r=99;t=1");
    }
}
