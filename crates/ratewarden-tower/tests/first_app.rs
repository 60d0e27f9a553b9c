//! The README's first app, with this crate's default features only (`.ci/run` runs this test
//! alone, without the workspace's other features): it limits by peer IP on the first try.

use std::net::SocketAddr;

use axum::{Router, routing::get};
use ratewarden_tower::{Quota, RateLimitLayer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The router exactly as the README writes it.
fn readme_app() -> Result<Router, Box<dyn std::error::Error>> {
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::per_ip(
            Quota::per_second(5)?.with_burst(10)?,
        ));
    Ok(app)
}

#[test]
fn the_readme_shows_this_app() {
    let readme = include_str!("../../../README.md");
    for line in [
        ".layer(RateLimitLayer::per_ip(Quota::per_second(5)?.with_burst(10)?));",
        "axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;",
        "ratewarden-tower = \"0.1\"",
    ] {
        assert!(readme.contains(line), "the README no longer has {line:?}");
    }
    // Its Rust blocks name only what its `[dependencies]` lines give a new user.
    for block in readme.split("```rust").skip(1) {
        let code = block.split("```").next().unwrap_or_default();
        for other in [
            "ratewarden_core",
            "ratewarden_memory",
            "ratewarden_redis",
            "ratewarden_breaker",
        ] {
            assert!(
                !code.contains(other),
                "a README block uses {other}, not a dependency it lists:\n{code}"
            );
        }
    }
}

#[tokio::test]
async fn the_readme_app_limits_each_client_ip_on_the_first_try() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = readme_app().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    let mut statuses = Vec::new();
    for _ in 0..12 {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        statuses.push(response.split(' ').nth(1).unwrap_or("none").to_owned());
    }
    server.abort();
    let mut expected = vec!["200"; 10];
    expected.extend(["429", "429"]);
    assert_eq!(statuses, expected, "a burst of 10, then 429s");
}
