//! Allocations on the request path, counted by this binary's own global allocator. Each test
//! binary has one allocator; this one holds a single test, so that nothing else allocates
//! while it counts.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::alloc::System;

use ratewarden_tower::key::{ClientIp, ForwardedHeader, KeyExtractor};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tests::{PROXIED_CLIENT, proxied_request};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Bug: `ClientIp` built a `Vec` of every hop in the header on every request, and parsed
/// the client's own part of it, which it never used.
#[test]
fn client_ip_allocates_nothing_whatever_the_length_of_the_header() {
    let mut allocated = Vec::new();
    for header in [
        ForwardedHeader::XForwardedFor,
        ForwardedHeader::Forwarded,
        ForwardedHeader::XRealIp,
    ] {
        let client_ip = ClientIp::new(header).trust("10.0.0.0/8".parse().unwrap());
        for len in [40, 400 * 1024] {
            let req = proxied_request(header, len);
            let region = Region::new(GLOBAL);
            let client = client_ip.client_addr(&req);
            let key = client_ip.extract(&req);
            let stats = region.change();
            drop(key);
            assert_eq!(client, Some(PROXIED_CLIENT), "{header:?}, {len} bytes");
            if stats.allocations + stats.reallocations > 0 {
                allocated.push(format!(
                    "{header:?}, {len} bytes: {} allocations, {} reallocations, {} bytes",
                    stats.allocations, stats.reallocations, stats.bytes_allocated
                ));
            }
        }
    }
    assert!(allocated.is_empty(), "{allocated:#?}");
}
