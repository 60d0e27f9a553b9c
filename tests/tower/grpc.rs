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
