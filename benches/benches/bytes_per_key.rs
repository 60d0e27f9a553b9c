//! Resident memory per key at 1,000,000 keys: `MemoryStore` (GCRA) against `governor`'s keyed
//! limiter, for `u64`, IP and 12-byte string keys. Each case runs in a fresh process, so freed
//! memory of one case never hides the growth of the next.
//!
//! `cargo bench -p benches --bench bytes_per_key`

use std::net::{IpAddr, Ipv4Addr};
use std::num::{NonZeroU32, NonZeroUsize};
use std::process::Command;

use benches::rss_bytes;
use ratewarden_core::{Key, Quota};
use ratewarden_memory::MemoryStore;

const KEYS: u64 = 1_000_000;
const CASES: [&str; 6] = [
    "rl/u64",
    "governor/u64",
    "rl/ip",
    "governor/ip",
    "rl/str12",
    "governor/str12",
];

fn ip(i: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0A00_0000 | (i as u32)))
}

/// Tenths of a byte per key.
fn measure(case: &str) -> u64 {
    let quota = Quota::per_minute(1)
        .and_then(|q| q.with_burst(1_000))
        .expect("valid quota");
    let gov_quota = governor::Quota::per_minute(NonZeroU32::MIN)
        .allow_burst(NonZeroU32::new(1_000).expect("non-zero"));
    // Strings are built before the baseline, so only the limiter's own copies count.
    let names: Vec<String> = if case.ends_with("str12") {
        (0..KEYS).map(|i| format!("user{i:08}")).collect()
    } else {
        Vec::new()
    };
    let before = rss_bytes();
    let after = match case {
        "rl/u64" | "rl/ip" | "rl/str12" => {
            // Room for every key: the bench measures what a key costs, not eviction.
            let store = MemoryStore::builder()
                .max_memory(NonZeroUsize::new(1 << 30).expect("non-zero"))
                .build()
                .expect("a valid bound");
            for i in 0..KEYS {
                let key = match case {
                    "rl/u64" => Key::from(i),
                    "rl/ip" => Key::from(ip(i)),
                    _ => Key::from(names[i as usize].as_str()),
                };
                store.check_sync(&key, &quota, 1);
            }
            assert_eq!(store.len() as u64, KEYS);
            assert_eq!(store.evictions(), 0);
            // What the store counts against its bound, on stderr.
            eprintln!("{}", store.memory() as u64 * 10 / KEYS);
            rss_bytes()
        }
        "governor/u64" => {
            let limiter = governor::RateLimiter::keyed(gov_quota);
            (0..KEYS).for_each(|i| drop(limiter.check_key(&i)));
            rss_bytes()
        }
        "governor/ip" => {
            let limiter = governor::RateLimiter::keyed(gov_quota);
            (0..KEYS).for_each(|i| drop(limiter.check_key(&ip(i))));
            rss_bytes()
        }
        _ => {
            let limiter = governor::RateLimiter::<String, _, _>::keyed(gov_quota);
            names.iter().for_each(|n| drop(limiter.check_key(n)));
            rss_bytes()
        }
    };
    after.saturating_sub(before) * 10 / KEYS
}

fn main() {
    if let Ok(case) = std::env::var("BYTES_PER_KEY_CASE") {
        println!("{}", measure(&case));
        return;
    }
    let exe = std::env::current_exe().expect("own path");
    println!("bytes per key at {KEYS} keys (RSS growth)");
    for case in CASES {
        let out = Command::new(&exe)
            .env("BYTES_PER_KEY_CASE", case)
            .output()
            .expect("run a case");
        let Ok(tenths) = String::from_utf8_lossy(&out.stdout).trim().parse::<u64>() else {
            println!(
                "{case:<16} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            continue;
        };
        let counted = String::from_utf8_lossy(&out.stderr)
            .trim()
            .parse::<u64>()
            .map(|t| format!("   (counted against the bound: {}.{} B)", t / 10, t % 10))
            .unwrap_or_default();
        println!("{case:<16} {:>3}.{} B{counted}", tenths / 10, tenths % 10);
    }
}
