//! Instructions per admitted request through the layer, counted by callgrind (one case per
//! process: `CASE=rl|tower_governor|bare N=100000`): the allowed path of `benches/benches/tower_layer.rs`
//! without the machine's noise.
//!
//! `benches/scripts/layer_instructions.sh` (needs valgrind)

use std::time::Duration;

use benches::{call_now, handler};
use ratewarden_tower::key::PeerIp;
use ratewarden_tower::{MemoryStore, Quota, RateLimitLayer};
use tower::Layer;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

fn main() {
    let case = std::env::var("CASE").unwrap_or_default();
    let n: u64 = std::env::var("N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let quota = Quota::per_second(1_000_000)
        .and_then(|q| q.with_burst(1_000_000))
        .expect("quota");
    let mut ours = RateLimitLayer::new(MemoryStore::new(), quota, PeerIp::new()).layer(handler());
    let config = GovernorConfigBuilder::default()
        .period(Duration::from_micros(1))
        .burst_size(1_000_000)
        .use_headers()
        .finish()
        .expect("valid governor config");
    let mut theirs = GovernorLayer::new(config).layer(handler());
    let mut bare = handler();
    for _ in 0..3 {
        assert!(call_now(&mut ours) && call_now(&mut theirs) && call_now(&mut bare));
    }
    for _ in 0..n {
        match case.as_str() {
            "rl" => assert!(call_now(&mut ours)),
            "tower_governor" => assert!(call_now(&mut theirs)),
            "bare" => assert!(call_now(&mut bare)),
            _ => {}
        }
    }
}
