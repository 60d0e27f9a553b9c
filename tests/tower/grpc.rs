//! gRPC through a real tonic server on loopback: denials are RESOURCE_EXHAUSTED.

use ratewarden_core::Quota;
use ratewarden_tower::RateLimitLayer;
use ratewarden_tower::key::PeerIp;
use tonic::Code;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::support::manual_store;

#[tokio::test]
async fn a_tonic_client_gets_resource_exhausted_with_retry_metadata() {
    let (store, _clock) = manual_store();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        Server::builder()
            .layer(RateLimitLayer::new(
                store,
                Quota::per_minute(2).unwrap(),
                PeerIp::new(),
            ))
            .add_service(health)
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stopped.await;
            }),
    );

    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    for _ in 0..2 {
        let response = client.check(HealthCheckRequest::default()).await.unwrap();
        assert_eq!(response.metadata().get("x-ratelimit-limit").unwrap(), "2");
    }
    let status = client
        .check(HealthCheckRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "rate limit exceeded");
    assert_eq!(status.metadata().get("retry-after").unwrap(), "30");
    assert_eq!(status.metadata().get("x-ratelimit-remaining").unwrap(), "0");

    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_get_claiming_grpc_is_denied_as_http() {
    // Reproduced: gRPC was told by the request's content type alone, so a plain GET sent with
    // `content-type: application/grpc` was denied with a gRPC answer: `200 OK`, an empty body
    // and no caching rule, which a shared cache could store and serve to everyone.
    use crate::support::{app, get_from, send};
    use http::StatusCode;
    let (store, _clock) = manual_store();
    let app = app().layer(RateLimitLayer::new(
        store,
        Quota::per_minute(1).unwrap(),
        PeerIp::new(),
    ));
    let req = || get_from("192.0.2.1:1", "/", &[("content-type", b"application/grpc")]);
    assert_eq!(send(&app, req()).await.0.status(), StatusCode::OK);
    let (denied, _) = send(&app, req()).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(!denied.headers().contains_key("grpc-status"));
}
