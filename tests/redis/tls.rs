//! TLS: `rediss://` with a CA of the test's own, for a single connection, a pool and a
//! cluster; a wrong CA; mutual TLS.

use std::time::{Duration, Instant};

use ratewarden_core::{Key, Quota, Store, StoreErrorKind};
use ratewarden_redis::{ConfigError, RedisConfig};
use tests::redis_server::{RedisServer, TlsCerts, free_cluster_port, free_port};

/// Three admitted, then denied: the store reached the server and counts in it.
async fn admits_exactly_three(store: &ratewarden_redis::RedisStore, what: &str) {
    let quota = Quota::per_minute(3).unwrap();
    let key = Key::from("tls");
    for i in 0..3 {
        let decision = store.check(&key, &quota, 1).await.unwrap();
        assert!(decision.is_allowed(), "{what}: check {i} denied");
    }
    let decision = store.check(&key, &quota, 1).await.unwrap();
    assert!(!decision.is_allowed(), "{what}: a fourth admitted");
}

fn over_tls(url: String, ca: Vec<u8>, prefix: &str) -> RedisConfig {
    RedisConfig::new(url)
        .prefix(prefix)
        .tls_ca_cert(ca)
        // Generous: debug builds on two busy cores, and a TLS handshake.
        .timeout(Duration::from_secs(5))
}

#[tokio::test]
async fn a_store_trusting_the_servers_ca_decides_exactly_over_one_connection_and_a_pool() {
    let server = RedisServer::start_tls();
    let ca = server.tls().unwrap().pem("ca.crt");
    assert!(server.url().starts_with("rediss://127.0.0.1:"));
    let single = over_tls(server.url(), ca.clone(), "tls-single")
        .connect()
        .await
        .unwrap();
    admits_exactly_three(&single, "single").await;
    let pooled = over_tls(server.url(), ca, "tls-pool")
        .pool(2)
        .connect()
        .await
        .unwrap();
    admits_exactly_three(&pooled, "pool").await;
}

#[tokio::test]
async fn a_store_trusting_another_ca_fails_as_a_connection_error_within_the_connect_timeout() {
    let server = RedisServer::start_tls();
    let unrelated = TlsCerts::generate();
    let connect_timeout = Duration::from_secs(1);
    for (what, pool) in [("single", None), ("pool", Some(2))] {
        let mut config = over_tls(server.url(), unrelated.pem("ca.crt"), "tls-wrong-ca")
            .connect_timeout(connect_timeout);
        if let Some(size) = pool {
            config = config.pool(size);
        }
        let started = Instant::now();
        let err = config.connect().await.unwrap_err();
        let elapsed = started.elapsed();
        assert_eq!(err.kind(), StoreErrorKind::Connection, "{what}: {err}");
        assert!(
            elapsed <= connect_timeout + Duration::from_secs(1),
            "{what}: failed after {elapsed:?}"
        );
    }
}

#[tokio::test]
async fn mutual_tls_admits_a_client_with_a_certificate_and_refuses_one_without() {
    let server = RedisServer::start_tls_with(free_port(), &["--tls-auth-clients", "yes"]);
    let tls = server.tls().unwrap();
    let with_cert = over_tls(server.url(), tls.pem("ca.crt"), "mtls")
        .tls_client_cert(tls.pem("client.crt"), tls.pem("client.key"))
        .connect()
        .await
        .unwrap();
    admits_exactly_three(&with_cert, "client certificate").await;
    let err = over_tls(server.url(), tls.pem("ca.crt"), "mtls-none")
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Connection, "{err}");
}

#[tokio::test]
async fn a_cluster_over_tls_decides_exactly() {
    // One node holding every slot, its cluster bus over TLS too.
    let server = RedisServer::start_tls_with(
        free_cluster_port(),
        &[
            "--tls-auth-clients",
            "no",
            "--cluster-enabled",
            "yes",
            "--tls-cluster",
            "yes",
            "--cluster-announce-ip",
            "127.0.0.1",
        ],
    );
    let _: () = server
        .query(
            redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(0)
                .arg(16_383),
        )
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server
        .query::<String>(redis::cmd("CLUSTER").arg("INFO"))
        .unwrap()
        .contains("cluster_state:ok")
    {
        assert!(Instant::now() < deadline, "the cluster did not become ok");
        std::thread::sleep(Duration::from_millis(50));
    }
    let store = RedisConfig::cluster([server.url()])
        .prefix("tls-cluster")
        .tls_ca_cert(server.tls().unwrap().pem("ca.crt"))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    admits_exactly_three(&store, "cluster").await;
}

/// The configuration error `config` is refused with.
fn refused(config: RedisConfig) -> ConfigError {
    config.build().unwrap_err()
}

#[tokio::test]
async fn certificates_need_a_rediss_url_and_a_pem_with_a_certificate() {
    let certs = TlsCerts::generate();
    let err = refused(RedisConfig::new("redis://127.0.0.1:6379").tls_ca_cert(certs.pem("ca.crt")));
    assert!(
        matches!(&err, ConfigError::InvalidUrl { reason, .. } if reason.contains("rediss://")),
        "{err}"
    );
    for pem in [&b"not a certificate"[..], &certs.pem("ca.key")] {
        let err = refused(RedisConfig::new("rediss://127.0.0.1:6379").tls_ca_cert(pem));
        assert!(
            matches!(err, ConfigError::InvalidCertificate { .. }),
            "{err}"
        );
    }
    let err = refused(
        RedisConfig::cluster(["rediss://127.0.0.1:7000", "redis://127.0.0.1:7001"])
            .tls_ca_cert(certs.pem("ca.crt")),
    );
    assert!(
        matches!(&err, ConfigError::InvalidUrl { url, .. } if url == "redis://127.0.0.1:7001"),
        "{err}"
    );
}

#[tokio::test]
async fn settings_that_could_never_connect_are_refused_when_built() {
    let certs = TlsCerts::generate();
    let other = TlsCerts::generate();
    // A client certificate with another certificate's key.
    let err = refused(
        RedisConfig::new("rediss://127.0.0.1:6379")
            .tls_ca_cert(certs.pem("ca.crt"))
            .tls_client_cert(certs.pem("client.crt"), other.pem("client.key")),
    );
    assert!(
        matches!(err, ConfigError::InvalidCertificate { .. }),
        "{err}"
    );
    // No certificate check at all: never, with or without certificates.
    for config in [
        RedisConfig::new("rediss://127.0.0.1:6379/#insecure"),
        RedisConfig::new("rediss://127.0.0.1:6379/#insecure").tls_ca_cert(certs.pem("ca.crt")),
    ] {
        let err = refused(config);
        assert!(
            matches!(&err, ConfigError::InvalidUrl { reason, .. } if reason.contains("insecure")),
            "{err}"
        );
    }
}
