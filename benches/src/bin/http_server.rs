//! The server `benches/scripts/http_throughput.sh` loads with `wrk`: one axum route on one
//! worker thread, bare or behind a rate limit (rl or tower_governor), with a limit nothing hits
//! or one that rejects everything.
//!
//! `http_server MODE ADDR`; prints `listening on http://ADDR` when ready. MODE is `bare`, or
//! `rl-` / `governor-` followed by `allow` (a limit nothing hits) or `reject` (everything is
//! rejected), with rate-limit headers on admitted responses: rl's default (IETF and
//! X-RateLimit fields) and governor's `use_headers`; `-x` (rl: X-RateLimit fields only, as
//! governor sends), and `-noheaders` (rl: `headers_on_allowed(false)`; governor: its default).

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratewarden_tower::key::PeerIp;
use ratewarden_tower::rate_limit::HeaderStyle;
use ratewarden_tower::{MemoryStore, Quota, RateLimitLayer};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

fn rl(per_second: u32, burst: u32) -> RateLimitLayer<PeerIp, MemoryStore> {
    let quota = Quota::per_second(per_second)
        .and_then(|q| q.with_burst(burst))
        .expect("valid quota");
    RateLimitLayer::new(MemoryStore::new(), quota, PeerIp::new())
}

/// The hand-written middleware rl competes with: an EVALSHA of a fixed-window script per
/// request on a multiplexed connection, 429 when over (no headers, no key hygiene).
async fn naive_redis_limit(
    mut connection: redis::aio::MultiplexedConnection,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    static SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
        redis::Script::new(
            "local n = redis.call('INCR', KEYS[1]) \
             if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end \
             if n > tonumber(ARGV[1]) then return 0 end return 1",
        )
    });
    let ip = req
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_string())
        .unwrap_or_default();
    let allowed: redis::RedisResult<i64> = SCRIPT
        .key(format!("naive:{ip}"))
        .arg(1_000_000_000)
        .arg(1_000)
        .invoke_async(&mut connection)
        .await;
    match allowed {
        Ok(0) => http::StatusCode::TOO_MANY_REQUESTS.into_response(),
        _ => next.run(req).await,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_default();
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:0".to_owned());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let app = Router::new().route("/", get(|| async { "hello" }));
    let period = |per_second: u32| Duration::from_secs(1) / per_second;
    let many = (1_000_000, 1_000_000);
    let app = match mode.as_str() {
        "bare" => app,
        "rl-allow" => app.layer(rl(many.0, many.1)),
        "rl-allow-x" => app.layer(rl(many.0, many.1).headers(HeaderStyle::XRateLimit)),
        "rl-allow-noheaders" => app.layer(rl(many.0, many.1).headers_on_allowed(false)),
        "rl-reject" => app.layer(rl(1, 1)),
        "rl-redis-allow" | "rl-redis-noheaders" | "rl-redis-reject" => {
            let url = std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL")?;
            let (per_second, burst) = if mode == "rl-redis-reject" {
                (1, 1)
            } else {
                many
            };
            let quota = Quota::per_second(per_second)?.with_burst(burst)?;
            // Connect on the runtime that serves: the connection's driver runs there.
            // A deadline no check reaches here: every request is decided by Redis, never by
            // the failure mode's local fallback (which would flatter the figure).
            let store = runtime.block_on(
                ratewarden_tower::RedisConfig::new(url)
                    .prefix("http-bench")
                    .timeout(std::time::Duration::from_secs(5))
                    .connect(),
            )?;
            let layer = RateLimitLayer::new(store, quota, PeerIp::new())
                .headers_on_allowed(mode != "rl-redis-noheaders");
            app.layer(layer)
        }
        "governor-allow" => {
            let config = GovernorConfigBuilder::default()
                .period(period(many.0))
                .burst_size(many.1)
                .use_headers()
                .finish();
            app.layer(GovernorLayer::new(config.ok_or("invalid governor config")?))
        }
        "governor-allow-noheaders" => {
            let config = GovernorConfigBuilder::default()
                .period(period(many.0))
                .burst_size(many.1)
                .finish();
            app.layer(GovernorLayer::new(config.ok_or("invalid governor config")?))
        }
        "governor-reject" => {
            let config = GovernorConfigBuilder::default()
                .period(period(1))
                .burst_size(1)
                .use_headers()
                .finish();
            app.layer(GovernorLayer::new(config.ok_or("invalid governor config")?))
        }
        "naive-redis" => {
            let url = std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL")?;
            let client = redis::Client::open(url)?;
            let connection = runtime.block_on(client.get_multiplexed_async_connection())?;
            app.layer(axum::middleware::from_fn(move |req, next| {
                naive_redis_limit(connection.clone(), req, next)
            }))
        }
        other => return Err(format!("unknown mode {other:?}").into()),
    };
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        println!("listening on http://{}", listener.local_addr()?);
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await?;
        Ok(())
    })
}
