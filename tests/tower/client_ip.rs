//! Client IPs behind proxies, and header values that must never panic.

use http::StatusCode;
use ratewarden_core::Quota;
use ratewarden_tower::RateLimitLayer;
use ratewarden_tower::key::{ClientIp, ForwardedHeader, Header, PeerIp};
use ratewarden_tower::rate_limit::MissingKey;

use crate::support::{app, get_from, manual_store, send};

fn behind_proxies(header: ForwardedHeader) -> axum::Router {
    let (store, _clock) = manual_store();
    let client_ip = ClientIp::new(header).trust("10.0.0.0/8".parse().unwrap());
    app().layer(RateLimitLayer::new(
        store,
        Quota::per_minute(2).unwrap(),
        client_ip,
    ))
}

#[tokio::test]
async fn spoofed_x_forwarded_for_from_an_untrusted_peer_is_ignored() {
    let app = behind_proxies(ForwardedHeader::XForwardedFor);
    let mut statuses = Vec::new();
    for i in 0..4 {
        // A fresh forged client address on every request, straight from the internet.
        let spoof = format!("1.2.3.{i}");
        let req = get_from(
            "203.0.113.5:5000",
            "/",
            &[("x-forwarded-for", spoof.as_bytes())],
        );
        statuses.push(send(&app, req).await.0.status());
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
}

#[tokio::test]
async fn a_trusted_chain_resolves_to_the_rightmost_untrusted_address() {
    for (header, value) in [
        (ForwardedHeader::XForwardedFor, "x-forwarded-for"),
        (ForwardedHeader::Forwarded, "forwarded"),
    ] {
        let app = behind_proxies(header);
        let chain = |leftmost: &str, client: &str| match header {
            ForwardedHeader::Forwarded => {
                format!("for={leftmost}, for=\"{client}:1234\";proto=https, for=10.0.0.2")
            }
            _ => format!("{leftmost}, {client}, 10.0.0.2"),
        };
        let mut statuses = Vec::new();
        for i in 0..3 {
            // The client forges the leftmost entry each time; our proxies append the truth.
            let forged = format!("6.6.6.{i}");
            let xff = chain(&forged, "198.51.100.7");
            let req = get_from("10.0.0.1:443", "/", &[(value, xff.as_bytes())]);
            statuses.push(send(&app, req).await.0.status());
        }
        assert_eq!(
            statuses,
            [
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS
            ],
            "{header:?}"
        );
        // Another client behind the same proxies has its own bucket.
        let xff = chain("6.6.6.6", "198.51.100.8");
        let req = get_from("10.0.0.1:443", "/", &[(value, xff.as_bytes())]);
        assert_eq!(send(&app, req).await.0.status(), StatusCode::OK);
    }
}

#[tokio::test]
async fn hostile_header_values_never_panic() {
    let big = vec![b'1'; 64 * 1024];
    let big_list = "9.9.9.9, ".repeat(7_000);
    let values: Vec<&[u8]> = vec![
        b"",
        b" ",
        b",,,,",
        b"\xff\xfe\xfd",
        b"for=\"[::1",
        b"for=\"\\\"",
        &big,
        big_list.as_bytes(),
        b"unknown",
        b"999.999.999.999",
        b"[::ffff:10.0.0.1]:99999",
    ];
    let (store, _clock) = manual_store();
    let layers = [
        ForwardedHeader::Forwarded,
        ForwardedHeader::XForwardedFor,
        ForwardedHeader::XRealIp,
    ];
    for kind in layers {
        let client_ip = ClientIp::new(kind).trust("0.0.0.0/0".parse().unwrap());
        let app = app().layer(
            RateLimitLayer::new(store.clone(), Quota::per_second(1_000).unwrap(), client_ip)
                .on_missing_key(MissingKey::Reject(StatusCode::BAD_REQUEST)),
        );
        for name in ["forwarded", "x-forwarded-for", "x-real-ip", "x-api-key"] {
            for value in &values {
                for copies in [1, 2] {
                    let headers: Vec<(&str, &[u8])> = vec![(name, *value); copies];
                    let (response, _) = send(&app, get_from("10.1.2.3:1", "/", &headers)).await;
                    assert!(
                        matches!(response.status(), StatusCode::OK | StatusCode::BAD_REQUEST),
                        "{kind:?} {name} {:?}: {}",
                        String::from_utf8_lossy(&value[..value.len().min(20)]),
                        response.status()
                    );
                }
            }
        }
    }
    // The header extractor too.
    let app = app().layer(RateLimitLayer::new(
        store,
        Quota::per_second(1_000).unwrap(),
        Header::secret(http::HeaderName::from_static("x-api-key")),
    ));
    for value in &values {
        let (response, _) = send(&app, get_from("10.1.2.3:1", "/", &[("x-api-key", value)])).await;
        // Empty or only optional whitespace (RFC 9110 5.5): no key.
        let expected = if value.iter().all(|b| matches!(b, b' ' | b'\t')) {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::OK
        };
        assert_eq!(response.status(), expected);
    }
}

#[tokio::test]
async fn a_request_without_connect_info_gets_the_configured_outcome() {
    let request = || {
        http::Request::get("/")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    for (missing, expected) in [
        (None, StatusCode::BAD_REQUEST),
        (
            Some(MissingKey::Reject(StatusCode::INTERNAL_SERVER_ERROR)),
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
        (Some(MissingKey::Skip), StatusCode::OK),
    ] {
        let (store, _clock) = manual_store();
        let mut layer =
            RateLimitLayer::new(store.clone(), Quota::per_second(1).unwrap(), PeerIp::new());
        if let Some(missing) = missing {
            layer = layer.on_missing_key(missing);
        }
        let app = app().layer(layer);
        for _ in 0..3 {
            let (response, body) = send(&app, request()).await;
            assert_eq!(response.status(), expected);
            if expected != StatusCode::OK {
                // A problem+json body naming the status, and nothing of how the limit works.
                let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(problem["status"], expected.as_u16());
                assert_eq!(problem["title"], expected.canonical_reason().unwrap());
                assert_eq!(problem.as_object().unwrap().len(), 3, "{problem}");
                assert!(!response.headers().contains_key("www-authenticate"));
            }
        }
        // Never a shared bucket: nothing was counted.
        assert!(store.is_empty());
    }
}

#[test]
fn a_proxy_network_written_ipv4_mapped_is_trusted_for_its_ipv4_addresses() {
    // Reproduced: `::ffff:10.0.0.0/104` (as a dual-stack listener prints its peers) was
    // accepted but never matched, since peers are compared as IPv4: the header was ignored,
    // and every client behind the proxy shared the proxy's bucket.
    use ratewarden_tower::key::KeyExtractor;
    for (network, peer) in [
        ("::ffff:10.0.0.0/104", "[::ffff:10.0.0.2]:443"),
        ("::ffff:10.0.0.0/104", "10.0.0.2:443"),
    ] {
        let extractor =
            ClientIp::new(ForwardedHeader::XForwardedFor).trust(network.parse().unwrap());
        let key = |client: &str| {
            extractor.extract(&get_from(
                peer,
                "/",
                &[("x-forwarded-for", client.as_bytes())],
            ))
        };
        assert_eq!(
            key("203.0.113.1"),
            Some(ratewarden_core::Key::from(
                "203.0.113.1".parse::<std::net::IpAddr>().unwrap()
            )),
            "{network} from {peer}"
        );
    }
    // An IPv6 network that merely holds the mapped block (`::1/64`, a typo for loopback, or
    // `::/0`) trusts no IPv4 address: only a network written inside the block does.
    for network in ["::1/64", "::/80", "::/0"] {
        let extractor =
            ClientIp::new(ForwardedHeader::XForwardedFor).trust(network.parse().unwrap());
        let req = get_from("198.51.100.4:5000", "/", &[("x-forwarded-for", b"1.2.3.4")]);
        assert_eq!(
            extractor.extract(&req),
            Some(ratewarden_core::Key::from(
                "198.51.100.4".parse::<std::net::IpAddr>().unwrap()
            )),
            "{network}"
        );
    }
    // A mapped network trusts nothing else.
    let extractor =
        ClientIp::new(ForwardedHeader::XForwardedFor).trust("::ffff:10.0.0.0/104".parse().unwrap());
    let req = get_from("11.0.0.2:443", "/", &[("x-forwarded-for", b"203.0.113.1")]);
    assert_eq!(
        extractor.extract(&req),
        Some(ratewarden_core::Key::from(
            "11.0.0.2".parse::<std::net::IpAddr>().unwrap()
        ))
    );
}

#[tokio::test]
async fn a_request_without_a_key_gets_the_response_the_user_chose() {
    let (store, _clock) = manual_store();
    let layer = RateLimitLayer::new(store.clone(), Quota::per_second(1).unwrap(), PeerIp::new())
        .on_missing_key(MissingKey::respond(|| {
            let mut response = http::Response::new(bytes::Bytes::from_static(b"who are you?"));
            *response.status_mut() = StatusCode::FORBIDDEN;
            response
                .headers_mut()
                .insert("x-why", http::HeaderValue::from_static("no-address"));
            response
        }));
    let app = app().layer(layer);
    for _ in 0..2 {
        let request = http::Request::get("/")
            .body(axum::body::Body::empty())
            .unwrap();
        let (response, body) = send(&app, request).await;
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        assert_eq!(response.headers()["x-why"], "no-address");
        assert_eq!(&body[..], b"who are you?");
    }
    assert!(store.is_empty());
}

#[tokio::test]
async fn a_responder_for_requests_without_a_key_runs_for_each_of_them() {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = std::sync::Arc::clone(&calls);
    let layer = RateLimitLayer::new(
        manual_store().0,
        Quota::per_second(1).unwrap(),
        PeerIp::new(),
    )
    .on_missing_key(MissingKey::respond(move || {
        let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let mut response = http::Response::new(bytes::Bytes::new());
        *response.status_mut() = StatusCode::UNAUTHORIZED;
        response.headers_mut().insert("x-call", n.into());
        response
    }));
    // One service made by the layer, as hyper or tonic serve it.
    let service = tower::Layer::layer(
        &layer,
        tower::service_fn(|_: http::Request<axum::body::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
        }),
    );
    for n in 1..=3u32 {
        let request = http::Request::get("/")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = tower::ServiceExt::oneshot(service.clone(), request)
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()["x-call"], n.to_string().as_str());
    }
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
}
