//! A check on the mesh store against a check on the memory store (same quota, same keys), in
//! one run, on one thread and on two. The mesh store gossips in the background (two members,
//! 100 ms rounds) while the checks run.
//!
//! `cargo bench -p benches --bench mesh`

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use benches::{on_threads, scatter};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ratewarden_core::{Key, Quota, Store};
use ratewarden_memory::MemoryStore;
use ratewarden_mesh::{MeshStore, Mode};

const KEYS: u64 = 10_000;

fn bench(c: &mut Criterion) {
    // A quota no run can spend, even with half of it: every call admits.
    let quota = Quota::per_second(1_000_000)
        .and_then(|q| q.with_burst(1_000_000))
        .expect("valid quota");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let secret = b"a secret both gateways of the bench share";
    let (mesh, peer) = runtime.block_on(async {
        let peer = MeshStore::builder(loopback)
            .mode(Mode::Escrow)
            .secret(secret)
            .expect("long enough")
            .bind()
            .await
            .expect("bound");
        let mesh = MeshStore::builder(loopback)
            .peers([peer.local_addr()])
            .mode(Mode::Escrow)
            .secret(secret)
            .expect("long enough")
            .bind()
            .await
            .expect("bound");
        (mesh, peer)
    });
    let memory = MemoryStore::new();
    for i in 0..KEYS {
        let key = Key::from(i);
        assert!(memory.check_sync(&key, &quota, 1).is_allowed());
        let first = mesh.check_ready(&key, &quota, 1).expect("ready");
        assert!(first.expect("decided").is_allowed());
    }

    let mut group = c.benchmark_group("mesh_check");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    group.sample_size(20);
    for threads in [1_usize, 2] {
        let row = format!("{threads}t");
        group.bench_function(BenchmarkId::new("memory", &row), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, |t, i| {
                    let key = Key::from(scatter(i + t as u64 * 7, KEYS));
                    let decision = memory.check_ready(&key, &quota, 1);
                    std::hint::black_box(decision);
                })
            });
        });
        group.bench_function(BenchmarkId::new("mesh", &row), |b| {
            b.iter_custom(|iters| {
                on_threads(threads, iters, |t, i| {
                    let key = Key::from(scatter(i + t as u64 * 7, KEYS));
                    let decision = mesh.check_ready(&key, &quota, 1);
                    std::hint::black_box(decision);
                })
            });
        });
    }
    group.finish();
    drop((mesh, peer));
}

criterion_group!(benches, bench);
criterion_main!(benches);
