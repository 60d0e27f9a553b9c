//! Pre-auth limits: forged credentials are charged to the IP bucket, never to a user's.

use http::StatusCode;
use jsonwebtoken::{EncodingKey, Header};
use rl_core::{Key, Quota, Store};
use rl_tower::RateLimitLayer;
use rl_tower::key::{JwtClaim, PeerIp};
use rl_tower::rate_limit::MissingKey;

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
