//! The memory store's byte bound, measured by the allocator itself: whatever keys a flood
//! brings (integers, long strings, sliding logs of 4,096 entries), the bytes the store holds
//! stay under its configured bound.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::alloc::System;
use std::num::NonZeroUsize;
use std::time::Duration;

use ratewarden_core::{Key, ManualClock, Quota, Timestamp};
use ratewarden_memory::MemoryStore;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

/// The system allocator, counting (`stats_alloc`: a global allocator takes `unsafe` code,
/// which this workspace forbids).
#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Bytes live on the heap now.
fn live() -> isize {
    let stats = ALLOCATOR.stats();
    // Reallocations are counted in both already.
    stats.bytes_allocated as isize - stats.bytes_deallocated as isize
}

/// Floods a store of `max` bytes with `keys` new keys (each checked once) under `quota`,
/// the clock moving 1 ms per 100 keys; returns the most bytes it held, by the allocator.
fn flood(max: usize, quota: Quota, keys: u64, key: impl Fn(u64) -> Key) -> (usize, u64) {
    // The test's own clock is not the store's memory.
    let clock = ManualClock::new(Timestamp::from_micros(1_000_000_000));
    let before = live();
    let store = MemoryStore::builder()
        .max_memory(NonZeroUsize::new(max).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut most = 0;
    for i in 0..keys {
        if i % 100 == 0 {
            clock.advance(Duration::from_millis(1));
        }
        let k = key(i);
        assert!(store.check_sync(&k, &quota, 1).is_allowed());
        drop(k);
        most = most.max(live() - before);
    }
    let held = usize::try_from(most).unwrap();
    let evictions = store.evictions();
    drop(store);
    assert!(
        live() - before < 1_024,
        "the store leaked {} bytes",
        live() - before
    );
    (held, evictions)
}

#[test]
fn a_flood_never_takes_more_memory_than_the_bound() {
    const MAX: usize = 4 << 20;
    let cases: [(&str, Quota, u64, fn(u64) -> Key); 4] = [
        (
            "integers, GCRA",
            Quota::per_hour(10).unwrap(),
            1_000_000,
            |i| Key::from(i),
        ),
        (
            "40-byte strings, token bucket",
            "10/h token-bucket".parse().unwrap(),
            300_000,
            |i| Key::from(format!("{i:040}")),
        ),
        (
            "addresses, sliding window",
            "10/h sliding-window".parse().unwrap(),
            300_000,
            |i| Key::from(std::net::IpAddr::from((i as u128).to_be_bytes())),
        ),
        // 4,096 timestamps a key: 32 KiB each; with a bound on keys instead of bytes, a
        // million of these would take 32 GiB.
        (
            "sliding logs of 4,096",
            "4096/h sliding-log".parse().unwrap(),
            2_000,
            |i| Key::from(i),
        ),
    ];
    for (name, quota, keys, key) in cases {
        let (held, evictions) = flood(MAX, quota, keys, key);
        eprintln!("{name}: at most {held} bytes held (bound {MAX}), {evictions} evictions");
        assert!(held <= MAX, "{name}: {held} bytes held, bound {MAX}");
        assert!(
            held > MAX / 2,
            "{name}: the store never filled ({held} bytes)"
        );
        assert!(evictions > 0, "{name}: the flood never outgrew the store");
    }
}
