//! Costs known after the response, places in flight, and failed logins only, on an axum app.
//!
//! ```sh
//! cargo run --example token_costs
//! # 40 units each, settled when the stream ends: the fourth is refused (100/min per user).
//! for i in 1 2 3 4; do curl -s -o /dev/null -w '%{http_code}\n' -H 'x-user: alice' 'http://127.0.0.1:3000/stream?units=40'; done
//! # Two slow requests per user at once; a third is refused while they run.
//! for i in 1 2 3; do curl -s -o /dev/null -w '%{http_code}\n' -H 'x-user: alice' http://127.0.0.1:3000/slow & done; wait
//! # Only failed logins count: 3 a minute per client IP.
//! curl -s -o /dev/null -w '%{http_code}\n' -X POST 'http://127.0.0.1:3000/login?ok=0'
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderName, Request, Response, StatusCode, Uri};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body::Frame;
use ratewarden_tower::key::{Header, PeerIp};
use ratewarden_tower::{MemoryStore, Quota, RateLimitLayer};

/// A body of `left` chunks, one line each, as a model would stream tokens.
struct Chunks {
    left: u32,
}

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"token\n")))))
    }
}

/// `name=N` of the query (`None` when absent or not a number).
fn query(uri: &Uri, name: &str) -> Option<u32> {
    uri.query()?
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))?
        .parse()
        .ok()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = MemoryStore::new();
    let user = || Header::new(HeaderName::from_static("x-user"));

    // 100 units a minute per user; a request is estimated at 10 and charged one unit per
    // chunk streamed, settled when its body ends (or is dropped: what it sent).
    let tokens = RateLimitLayer::new(store.clone(), Quota::per_minute(100)?, user())
        .name("tokens")
        .cost_by(|_: &Request<Body>| 10)
        .settle_by_frames(|frame: &Frame<Bytes>| u32::from(frame.is_data()));
    // At most 2 requests in flight per user.
    let two_at_once = RateLimitLayer::in_flight(store.clone(), 2, user())?.name("slow");
    // 3 failed logins a minute per client IP; successful ones never count.
    let failed_logins = RateLimitLayer::new(store, Quota::per_minute(3)?, PeerIp::new())
        .name("login-failures")
        .count_if(|response: &Response<Body>| response.status() == StatusCode::UNAUTHORIZED);

    let app = Router::new()
        .route(
            "/stream",
            get(|uri: Uri| async move {
                Body::new(Chunks {
                    left: query(&uri, "units").unwrap_or(1),
                })
            })
            .layer(tokens),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(2)).await;
                "slow\n"
            })
            .layer(two_at_once),
        )
        .route(
            "/login",
            post(|uri: Uri| async move {
                if query(&uri, "ok") == Some(1) {
                    (StatusCode::OK, "welcome\n")
                } else {
                    (StatusCode::UNAUTHORIZED, "wrong password\n")
                }
            })
            .layer(failed_logins),
        );

    let listener = tokio::net::TcpListener::bind(examples::addr()).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
