//! The layer on a plain hyper 1 service, without axum.
//!
//! ```sh
//! cargo run --example hyper
//! for i in $(seq 5); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use ratewarden_tower::{Quota, RateLimitLayer};
use tower::ServiceBuilder;

async fn hello(_: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hello\n"))))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limit = RateLimitLayer::per_ip(Quota::per_second(1)?.with_burst(3)?);
    let listener = tokio::net::TcpListener::bind(examples::addr()).await?;
    println!("listening on http://{}", listener.local_addr()?);
    loop {
        let (stream, peer) = listener.accept().await?;
        let service = ServiceBuilder::new()
            // hyper knows the peer; the layer reads it from the request extensions.
            .map_request(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert::<SocketAddr>(peer);
                req
            })
            .layer(limit.clone())
            .service_fn(hello);
        tokio::spawn(async move {
            let builder = Builder::new(TokioExecutor::new());
            let connection =
                builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
            if let Err(err) = connection.await {
                eprintln!("connection error: {err}");
            }
        });
    }
}
