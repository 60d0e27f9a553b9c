//! `ClientIp` finding the client behind our proxies in a 40-byte and in a 400 KiB forwarding
//! header, the client near the right end of both (`tests::proxied_request`): the rest is the
//! client's own writing, which the walk from the right never reads, so the two must cost the
//! same.
//!
//! `cargo bench -p benches --bench client_ip`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ratewarden_tower::key::{ClientIp, ForwardedHeader};
use tests::{PROXIED_CLIENT, proxied_request};

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("client_ip");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(1));
    for (header, name) in [
        (ForwardedHeader::XForwardedFor, "x_forwarded_for"),
        (ForwardedHeader::Forwarded, "forwarded"),
    ] {
        let client_ip = ClientIp::new(header).trust("10.0.0.0/8".parse().expect("valid network"));
        for (len, size) in [(40, "40B"), (400 * 1024, "400KiB")] {
            let req = proxied_request(header, len);
            assert_eq!(client_ip.client_addr(&req), Some(PROXIED_CLIENT));
            group.bench_with_input(BenchmarkId::new(name, size), &req, |b, req| {
                b.iter(|| client_ip.client_addr(black_box(req)));
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
