//! Instructions per GCRA check, counted by callgrind: a figure the machine's noise cannot move.
//! One case per process (`CASE=rl/u64 N=1000000`); `benches/scripts/instructions.sh` runs each
//! case with N checks and with none, and prints the difference per check.
//!
//! `benches/scripts/instructions.sh` (needs valgrind)

use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;

use benches::scatter;
use ratewarden_core::{Key, Quota};
use ratewarden_memory::MemoryStore;

fn ip(i: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0A00_0000 | (i as u32)))
}

fn main() {
    let case = std::env::var("CASE").unwrap_or_default();
    let n: u64 = std::env::var("N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    let keys: u64 = std::env::var("KEYS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let quota = Quota::per_minute(1)
        .and_then(|q| q.with_burst(1_000))
        .expect("valid quota");
    let gov_quota = governor::Quota::per_minute(NonZeroU32::MIN)
        .allow_burst(NonZeroU32::new(1_000).expect("non-zero"));
    let names: Vec<String> = (0..keys).map(|i| format!("user{i:08}")).collect();
    let rl_names: Vec<Key> = names.iter().map(|n| Key::from(n.as_str())).collect();
    let store = MemoryStore::new();
    let limiter_u64 = governor::RateLimiter::keyed(gov_quota);
    let limiter_ip = governor::RateLimiter::keyed(gov_quota);
    let limiter_str = governor::RateLimiter::<String, _, _>::keyed(gov_quota);
    // Every key exists before counting starts, in both limiters.
    for i in 0..keys {
        store.check_sync(&Key::from(i), &quota, 1);
        store.check_sync(&Key::from(ip(i)), &quota, 1);
        store.check_sync(&rl_names[i as usize], &quota, 1);
        let _ = limiter_u64.check_key(&i);
        let _ = limiter_ip.check_key(&ip(i));
        let _ = limiter_str.check_key(&names[i as usize]);
    }
    // The case is chosen once, outside the loop (the same for both libraries): each loop
    // holds the checks alone.
    match case.as_str() {
        "rl/u64" => each(n, keys, |k| {
            let _ = std::hint::black_box(store.check_sync(&Key::from(k), &quota, 1));
        }),
        "rl/ip" => each(n, keys, |k| {
            let _ = std::hint::black_box(store.check_sync(&Key::from(ip(k)), &quota, 1));
        }),
        "rl/str" => each(n, keys, |k| {
            let _ = std::hint::black_box(store.check_sync(&rl_names[k as usize], &quota, 1));
        }),
        "governor/u64" => each(n, keys, |k| {
            let _ = std::hint::black_box(limiter_u64.check_key(&k));
        }),
        "governor/ip" => each(n, keys, |k| {
            let _ = std::hint::black_box(limiter_ip.check_key(&ip(k)));
        }),
        "governor/str" => each(n, keys, |k| {
            let _ = std::hint::black_box(limiter_str.check_key(&names[k as usize]));
        }),
        _ => {}
    }
}

/// Runs `check` on `n` keys scattered over `keys`.
#[inline(always)]
fn each(n: u64, keys: u64, mut check: impl FnMut(u64)) {
    for i in 0..n {
        check(scatter(i, keys));
    }
}
