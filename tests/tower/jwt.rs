//! Pre-auth limits: forged credentials are charged to the IP bucket, never to a user's.

use http::StatusCode;
use jsonwebtoken::{EncodingKey, Header};
use ratewarden_core::{Key, Quota, Store};
use ratewarden_tower::RateLimitLayer;
use ratewarden_tower::key::{JwtClaim, PeerIp};
use ratewarden_tower::rate_limit::MissingKey;

use crate::support::{app, get_from, manual_store, send};

const SECRET: &[u8] = b"test secret";

fn token(secret: &[u8], sub: &str, exp: u64) -> String {
    let claims = serde_json::json!({ "sub": sub, "exp": exp });
    jsonwebtoken::encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(secret).unwrap(),
    )
    .unwrap()
}

#[tokio::test]
async fn a_forged_jwt_is_charged_to_the_ip_bucket_only() {
    let (ip_store, _) = manual_store();
    let (user_store, _) = manual_store();
    let ip_quota = Quota::per_minute(4).unwrap();
    let user_quota = Quota::per_minute(2).unwrap();
    let per_ip = RateLimitLayer::new(ip_store.clone(), ip_quota, PeerIp::new());
    let per_user = RateLimitLayer::new(
        user_store.clone(),
        user_quota,
        JwtClaim::hs256(SECRET).unwrap(),
    )
    .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED));
    let app = app().layer(per_user).layer(per_ip);

    let far_future = 4_000_000_000;
    let forged = [
        format!("Bearer {}", token(b"wrong secret", "victim", far_future)),
        format!("Bearer {}", token(SECRET, "victim", 1_000)), // expired
        "Bearer not.a.jwt".to_owned(),
    ];
    for auth in &forged {
        let req = get_from("203.0.113.66:1", "/", &[("authorization", auth.as_bytes())]);
        assert_eq!(send(&app, req).await.0.status(), StatusCode::UNAUTHORIZED);
    }
    // The forged requests used 3 of the IP's 4...
    let ip = Key::from("203.0.113.66".parse::<std::net::IpAddr>().unwrap());
    assert_eq!(
        ip_store
            .peek(&ip, &ip_quota)
            .await
            .unwrap()
            .info()
            .remaining(),
        1
    );
    // ...and no user bucket exists, not even the victim's.
    assert!(user_store.is_empty());
    let victim = Key::from("victim");
    assert_eq!(
        user_store
            .peek(&victim, &user_quota)
            .await
            .unwrap()
            .info()
            .remaining(),
        2
    );

    // A valid token from that IP gets the IP's last unit, then the IP limit answers.
    let valid = format!("Bearer {}", token(SECRET, "victim", far_future));
    let req = || {
        get_from(
            "203.0.113.66:2",
            "/",
            &[("authorization", valid.as_bytes())],
        )
    };
    assert_eq!(send(&app, req()).await.0.status(), StatusCode::OK);
    let (limited, _) = send(&app, req()).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(user_store.len(), 1);

    // The same user from another IP still has one unit of its own quota left.
    let req = || {
        get_from(
            "198.51.100.3:2",
            "/",
            &[("authorization", valid.as_bytes())],
        )
    };
    assert_eq!(send(&app, req()).await.0.status(), StatusCode::OK);
    assert_eq!(
        send(&app, req()).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// Test-only keys (made with `openssl genrsa 2048` and `openssl ecparam -name prime256v1`).
const RSA_PRIVATE: &[u8] = include_bytes!("keys/rsa-private.pem");
const RSA_PUBLIC: &[u8] = include_bytes!("keys/rsa-public.pem");
const EC_PRIVATE: &[u8] = include_bytes!("keys/ec-private.pem");
const EC_PUBLIC: &[u8] = include_bytes!("keys/ec-public.pem");

/// A token of `claims` signed with `alg`'s test key.
fn signed(alg: jsonwebtoken::Algorithm, claims: &serde_json::Value) -> String {
    let key = match alg {
        jsonwebtoken::Algorithm::RS256 => EncodingKey::from_rsa_pem(RSA_PRIVATE).unwrap(),
        jsonwebtoken::Algorithm::ES256 => EncodingKey::from_ec_pem(EC_PRIVATE).unwrap(),
        _ => EncodingKey::from_secret(SECRET).unwrap(),
    };
    jsonwebtoken::encode(&Header::new(alg), claims, &key).unwrap()
}

fn bearer(token: &str) -> http::Request<()> {
    http::Request::builder()
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .unwrap()
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[test]
fn a_token_is_no_key_before_its_nbf() {
    // Reproduced: a correctly signed token with `nbf` an hour ahead was a valid key (RFC 7519
    // 4.1.5: it MUST NOT be accepted before then).
    use ratewarden_tower::key::KeyExtractor;
    let now = now_secs();
    for alg in [
        jsonwebtoken::Algorithm::HS256,
        jsonwebtoken::Algorithm::RS256,
        jsonwebtoken::Algorithm::ES256,
    ] {
        let extractor = match alg {
            jsonwebtoken::Algorithm::RS256 => JwtClaim::rs256_pem(RSA_PUBLIC).unwrap(),
            jsonwebtoken::Algorithm::ES256 => JwtClaim::es256_pem(EC_PUBLIC).unwrap(),
            _ => JwtClaim::hs256(SECRET).unwrap(),
        };
        let early = serde_json::json!({ "sub": "u", "exp": now + 7_200, "nbf": now + 3_600 });
        assert_eq!(
            extractor.extract(&bearer(&signed(alg, &early))),
            None,
            "{alg:?}"
        );
        let valid = serde_json::json!({ "sub": "u", "exp": now + 7_200, "nbf": now - 60 });
        assert_eq!(
            extractor.extract(&bearer(&signed(alg, &valid))),
            Some(Key::from("u")),
            "{alg:?}"
        );
    }
}

#[test]
fn tokens_with_an_audience_are_keys_and_audience_and_issuer_are_checked_when_set() {
    // Reproduced: every token carrying `aud` (most identity providers set it) was no key.
    use ratewarden_tower::key::KeyExtractor;
    let exp = now_secs() + 3_600;
    // Shaped like the common providers' tokens: `aud` a string (Auth0 with one API, Okta,
    // Keycloak) or an array (Auth0 with several, Azure AD v1 apps).
    let single = serde_json::json!({
        "sub": "auth0|42", "aud": "https://api.example.com", "iss": "https://idp.example.com/", "exp": exp
    });
    let several = serde_json::json!({
        "sub": "auth0|42",
        "aud": ["https://api.example.com", "https://example.eu.auth0.com/userinfo"],
        "iss": "https://idp.example.com/",
        "exp": exp
    });
    let other = serde_json::json!({
        "sub": "auth0|42", "aud": "https://other.example.com", "iss": "https://evil.example.com/", "exp": exp
    });
    let key = Some(Key::from("auth0|42"));
    // No audience configured: any audience is accepted.
    let any = JwtClaim::hs256(SECRET).unwrap();
    for claims in [&single, &several, &other] {
        let token = signed(jsonwebtoken::Algorithm::HS256, claims);
        assert_eq!(any.extract(&bearer(&token)), key, "{claims}");
    }
    // Configured: only tokens for this API, from this issuer.
    let ours = JwtClaim::hs256(SECRET)
        .unwrap()
        .audience(["https://api.example.com"])
        .issuer(["https://idp.example.com/"]);
    for (claims, expected) in [(&single, &key), (&several, &key), (&other, &None)] {
        let token = signed(jsonwebtoken::Algorithm::HS256, claims);
        assert_eq!(ours.extract(&bearer(&token)), *expected, "{claims}");
    }
    let wrong_issuer = serde_json::json!({
        "sub": "auth0|42", "aud": "https://api.example.com", "iss": "https://evil.example.com/", "exp": exp
    });
    let token = signed(jsonwebtoken::Algorithm::HS256, &wrong_issuer);
    assert_eq!(ours.extract(&bearer(&token)), None);
}

#[tokio::test]
async fn a_request_without_a_valid_bearer_token_is_challenged() {
    let (store, _) = manual_store();
    let per_user = RateLimitLayer::new(
        store.clone(),
        Quota::per_minute(2).unwrap(),
        JwtClaim::hs256(SECRET).unwrap(),
    )
    .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED));
    let app = app().layer(per_user);
    for auth in [None, Some("Bearer not.a.jwt")] {
        let headers: Vec<(&str, &[u8])> = auth
            .map(|a| vec![("authorization", a.as_bytes())])
            .unwrap_or_default();
        let (response, body) = send(&app, get_from("192.0.2.1:1", "/", &headers)).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(problem["title"], "Unauthorized");
    }
    assert!(store.is_empty());
}

#[tokio::test]
async fn route_layer_keeps_unknown_paths_404_where_layer_answers_for_them() {
    let per_user = || {
        RateLimitLayer::new(
            manual_store().0,
            Quota::per_minute(2).unwrap(),
            JwtClaim::hs256(SECRET).unwrap(),
        )
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
    };
    let layered = app().layer(per_user());
    let route_layered = app().route_layer(per_user());
    let unknown = || get_from("192.0.2.1:1", "/no-such-path", &[]);
    assert_eq!(
        send(&layered, unknown()).await.0.status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        send(&route_layered, unknown()).await.0.status(),
        StatusCode::NOT_FOUND
    );
    // A matched route without a token is rejected either way.
    let known = || get_from("192.0.2.1:1", "/", &[]);
    assert_eq!(
        send(&route_layered, known()).await.0.status(),
        StatusCode::UNAUTHORIZED
    );
}

#[test]
fn a_token_without_the_configured_issuer_or_audience_is_no_key() {
    // Reproduced: with `issuer` or `audience` set, a correctly signed token that carried no
    // `iss` (or no `aud`) was still a key: jsonwebtoken checks those claims only when present,
    // unless told they are required.
    use ratewarden_tower::key::KeyExtractor;
    let exp = now_secs() + 3_600;
    let bare = signed(
        jsonwebtoken::Algorithm::HS256,
        &serde_json::json!({ "sub": "u1", "exp": exp }),
    );
    let issuer = JwtClaim::hs256(SECRET)
        .unwrap()
        .issuer(["https://idp.example.com/"]);
    let audience = JwtClaim::hs256(SECRET)
        .unwrap()
        .audience(["https://api.example.com"]);
    assert_eq!(issuer.extract(&bearer(&bare)), None);
    assert_eq!(audience.extract(&bearer(&bare)), None);
    let full = signed(
        jsonwebtoken::Algorithm::HS256,
        &serde_json::json!({
            "sub": "u1", "exp": exp, "iss": "https://idp.example.com/", "aud": "https://api.example.com"
        }),
    );
    assert_eq!(issuer.extract(&bearer(&full)), Some(Key::from("u1")));
    assert_eq!(audience.extract(&bearer(&full)), Some(Key::from("u1")));
    // `JwtClaim::new` takes its `Validation` as given, as the application decoding with the
    // same one does (requiring what it sets made the limit
    // refuse, or under `Skip` let through uncounted, tokens the application serves): it
    // requires `aud` and `iss` where the `Validation` says so.
    let key = || jsonwebtoken::DecodingKey::from_secret(SECRET).unwrap();
    let mut lenient = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
    lenient.set_audience(&["https://api.example.com"]);
    lenient.set_issuer(&["https://idp.example.com/"]);
    let mut strict = lenient.clone();
    strict.set_required_spec_claims(&["exp", "aud", "iss"]);
    let as_given = JwtClaim::new(key(), lenient).unwrap();
    assert_eq!(as_given.extract(&bearer(&bare)), Some(Key::from("u1")));
    assert_eq!(as_given.extract(&bearer(&full)), Some(Key::from("u1")));
    let required = JwtClaim::new(key(), strict).unwrap();
    assert_eq!(required.extract(&bearer(&bare)), None);
    assert_eq!(required.extract(&bearer(&full)), Some(Key::from("u1")));
}

#[tokio::test]
async fn a_token_sent_twice_is_refused_even_when_keyless_requests_are_skipped() {
    // Reproduced: with `MissingKey::Skip` (anonymous requests left to another limit), a
    // client past its quota sent its valid token twice: the limit saw no key and let the
    // request through uncounted, while the application's authentication (reading the first
    // value, as `HeaderMap::get` does) served it as the client's.
    let (store, _) = manual_store();
    let per_user = RateLimitLayer::new(
        store.clone(),
        Quota::per_minute(2).unwrap(),
        JwtClaim::hs256(SECRET).unwrap(),
    )
    .on_missing_key(MissingKey::Skip);
    let app = app().layer(per_user);
    let valid = format!("Bearer {}", token(SECRET, "alice", now_secs() + 3_600));
    let status = |values: Vec<String>| {
        let app = app.clone();
        async move {
            let headers: Vec<(&str, &[u8])> = values
                .iter()
                .map(|v| ("authorization", v.as_bytes()))
                .collect();
            send(&app, get_from("192.0.2.1:1", "/", &headers)).await.0
        }
    };
    for expected in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        assert_eq!(status(vec![valid.clone()]).await.status(), expected);
    }
    let basic = "Basic dTpw".to_owned();
    for twice in [
        vec![valid.clone(), valid.clone()],
        vec![basic.clone(), valid],
    ] {
        let response = status(twice).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
    }
    // No credential, another scheme's, or a bearer token that is not this limit's (a
    // forged one, which the application refuses itself; another issuer's; an opaque API
    // key): skipped, as configured. Refusing them broke two bearer
    // limits side by side, each skipping the other's tokens.
    let forged = format!(
        "Bearer {}",
        token(b"wrong secret", "alice", now_secs() + 3_600)
    );
    for values in [
        vec![],
        vec![basic],
        vec![forged],
        vec!["Bearer sk_live_opaque".to_owned()],
        vec!["Bearer null".to_owned()],
    ] {
        assert_eq!(
            status(values.clone()).await.status(),
            StatusCode::OK,
            "{values:?}"
        );
    }
}

#[test]
fn a_bearer_token_is_read_without_surrounding_whitespace() {
    use ratewarden_tower::key::KeyExtractor;

    // RFC 9110 5.5 (optional whitespace around a field value) and 11.4 (`1*SP` between the
    // scheme and the token): padding never changes the key.
    let extractor = JwtClaim::hs256(b"secret").unwrap();
    let token = token(b"secret", "user-1", 4_000_000_000);
    for value in [
        format!("Bearer {token}"),
        format!(" \tBearer {token}\t "),
        format!("Bearer   {token}"),
        format!("bearer {token} "),
    ] {
        let req = http::Request::builder()
            .header("authorization", &value)
            .body(())
            .unwrap();
        assert_eq!(
            extractor.extract(&req),
            Some(Key::from("user-1")),
            "{value:?}"
        );
    }
}
