//! The names of the Redis keys a key's state lives in: the user key inside a hash tag (one
//! cluster slot for every limit of a key, the slot of the whole key), its limit, and for a
//! part of a split key, its index, steering bytes and epoch.

use std::sync::LazyLock;

use ratewarden_core::{Key, KeyRepr, Quota, Timestamp};
use sha2::{Digest as _, Sha256};

/// The longest key name the store writes, whatever the user key (up to
/// [`ratewarden_core::MAX_KEY_LEN`] bytes) and prefix (up to [`MAX_PREFIX_LEN`]).
pub(crate) const MAX_NAME_LEN: usize = 128;
/// The longest key prefix.
pub(crate) const MAX_PREFIX_LEN: usize = 32;
/// The bytes of a name that are not the prefix or the user key: `:{`, a part (2 digits), the
/// kind, the part's 2 steering bytes, `}:`, the limit (16 hex digits), `:` and an epoch (16
/// hex digits).
const NAME_OVERHEAD: usize = 2 + 2 + 1 + 2 + 2 + 16 + 1 + 16;
/// Redis Cluster's hash slots.
const SLOTS: u32 = 16_384;

/// Which counter of a key a call is for, and how a missing state reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counter {
    /// The key's own counter.
    Whole,
    /// Part `index` of `parts` of a split key. Parts of an adaptive split carry the split's
    /// `epoch` (when Redis made it) in their names and start spent; parts of a static split
    /// are always there and start fresh.
    Part {
        index: u32,
        parts: u32,
        epoch: Option<Timestamp>,
    },
}

/// The name of a key's state under `quota`:
/// `PREFIX:{[PART]KIND KEY[STEER]}:LIMIT[:EPOCH]`, where KIND is `i` (an integer, in decimal),
/// `a` (an address, as text), `s` (a string, as its bytes), `l` (a string too long to fit or
/// holding a `}`, which would end the tag: the first 16 bytes of its SHA-256, in hex) or `h`
/// (a digest: its first 16 bytes, in hex); LIMIT
/// is [`Key::limit_id`] in hex (the scope and the quota; for a part, mixed with the number of
/// parts); PART, STEER and EPOCH only for a part
/// of a split key. The key sits in a hash tag, so each key has one cluster slot, which every
/// limit of the key shares; a part's two STEER bytes place it at an even spacing from the
/// key's own slot (part `i` of `n` at `i/n` of the slots further), so that `n` parts land on
/// `n` evenly spread slots, whatever the key. Never longer than [`MAX_NAME_LEN`] bytes, and
/// different keys, kinds, limits and parts never share a name.
pub(crate) fn state_key(prefix: &str, key: &Key, quota: &Quota, counter: Counter) -> Vec<u8> {
    let mut name = Vec::with_capacity(MAX_NAME_LEN);
    name.extend_from_slice(prefix.as_bytes());
    name.extend_from_slice(b":{");
    let tag_start = name.len();
    if let Counter::Part { index, .. } = counter {
        // Digits, then the kind (a letter): the part never runs into the key.
        decimal(&mut name, index);
    }
    let key_start = name.len();
    match key.repr() {
        KeyRepr::Int(n) => {
            name.push(b'i');
            decimal(&mut name, n);
        }
        KeyRepr::Ip(ip) => {
            name.push(b'a');
            push_ip(&mut name, std::net::Ipv6Addr::from(*ip).to_canonical());
        }
        // A `}` would end the hash tag early (Redis Cluster hashes a name only up to the first
        // `}` after its `{`): a key holding one would choose its own slot. It is digested.
        KeyRepr::Bytes(bytes)
            if bytes.len() <= MAX_NAME_LEN - NAME_OVERHEAD - prefix.len()
                && !bytes.contains(&b'}') =>
        {
            name.push(b's');
            name.extend_from_slice(bytes);
        }
        KeyRepr::Bytes(bytes) => {
            name.push(b'l');
            hex(&mut name, &Sha256::digest(bytes)[..16]);
        }
        KeyRepr::Digest(digest) => {
            name.push(b'h');
            hex(&mut name, &digest[..16]);
        }
    }
    if let Counter::Part { index, parts, .. } = counter {
        let home = crc16::State::<crc16::XMODEM>::calculate(&name[key_start..]);
        let spacing = SLOTS * index / parts.max(1);
        let slot = (u32::from(home) + spacing) % SLOTS;
        let steer = steer(&name[tag_start..], u16::try_from(slot).unwrap_or(0));
        name.extend_from_slice(&steer);
    }
    name.extend_from_slice(b"}:");
    // A part is named by its quota and the number of parts (in the id's top byte: at most
    // 64), so that gateways splitting a key in different numbers of parts (a rolling change)
    // never read one state under two quotas, nor do two quotas whose shares are equal.
    let limit = match counter {
        Counter::Whole => key.limit_id(quota),
        Counter::Part { parts, .. } => key.limit_id(quota) ^ (u64::from(parts) << 56),
    };
    hex(&mut name, &limit.to_be_bytes());
    if let Counter::Part {
        epoch: Some(epoch), ..
    } = counter
    {
        name.push(b':');
        hex(&mut name, &epoch.as_micros().to_be_bytes());
    }
    name
}

/// The Redis Cluster slot of the key named `name`: the CRC16 of its hash tag (what lies
/// between its first `{` and the next `}`, when not empty), else of the whole name.
pub(crate) fn slot_of(name: &[u8]) -> u16 {
    let tag = name.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &name[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        Some(&rest[..close]).filter(|tag| !tag.is_empty())
    });
    let crc = crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(name));
    // (`SLOTS` is 2^14: the slot is the CRC's low 14 bits.)
    crc % 16_384
}

/// The name of the split marker of the key named `name` (in the same slot).
pub(crate) fn marker_key(name: &[u8]) -> Vec<u8> {
    let mut marker = Vec::with_capacity(name.len() + 2);
    marker.extend_from_slice(name);
    marker.extend_from_slice(b":m");
    marker
}

/// Every pair of bytes by the CRC16 (XMODEM) it has: the inverse of a bijection.
static BY_CRC: LazyLock<Vec<[u8; 2]>> = LazyLock::new(|| {
    let mut table = vec![[0; 2]; 1 << 16];
    for pair in (0..=u16::MAX).map(u16::to_be_bytes) {
        table[usize::from(crc16::State::<crc16::XMODEM>::calculate(&pair))] = pair;
    }
    table
});

/// The two bytes to append to `tag` so that it hashes to cluster slot `slot` (or the first
/// slot after it whose bytes hold no `}`, which would end the tag). XMODEM's CRC is linear
/// with a zero start: `crc(tag ++ pair) = crc(tag ++ [0, 0]) ^ crc(pair)`, so the pair is the
/// one whose CRC makes up the difference.
fn steer(tag: &[u8], slot: u16) -> [u8; 2] {
    let mut state = crc16::State::<crc16::XMODEM>::new();
    state.update(tag);
    state.update(&[0, 0]);
    let base = state.get();
    for offset in 0..SLOTS {
        let slot = (u32::from(slot) + offset) % SLOTS;
        // A slot is the CRC's low 14 bits: any of 4 CRCs will do.
        for high in 0..4_u32 {
            let crc = u16::try_from(high << 14 | slot).unwrap_or(0);
            let pair = BY_CRC[usize::from(crc ^ base)];
            if !pair.contains(&b'}') {
                return pair;
            }
        }
    }
    [0, 0]
}

fn decimal(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `ip` as its `Display` writes it (RFC 5952 for IPv6: lower-case hex groups without leading
/// zeros, the longest run of two or more zero groups, the first of equals, as `::`; an
/// IPv4-mapped address as `::ffff:` and its IPv4 address), without
/// `fmt`'s machinery: a check makes its key's name each time.
fn push_ip(out: &mut Vec<u8>, ip: std::net::IpAddr) {
    let v6 = match ip {
        std::net::IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                decimal(out, octet);
            }
            return;
        }
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => {
                out.extend_from_slice(b"::ffff:");
                return push_ip(out, v4.into());
            }
            None => v6.segments(),
        },
    };
    // The longest run of zero groups: (start, len).
    let (mut longest, mut current) = ((0, 0), (0, 0));
    for (i, &group) in v6.iter().enumerate() {
        if group == 0 {
            if current.1 == 0 {
                current.0 = i;
            }
            current.1 += 1;
            if current.1 > longest.1 {
                longest = current;
            }
        } else {
            current = (0, 0);
        }
    }
    let groups = |out: &mut Vec<u8>, groups: &[u16]| {
        for (i, &group) in groups.iter().enumerate() {
            if i > 0 {
                out.push(b':');
            }
            let digits = group.to_be_bytes();
            let hex_digits = [
                digits[0] >> 4,
                digits[0] & 0xf,
                digits[1] >> 4,
                digits[1] & 0xf,
            ];
            let first = hex_digits.iter().position(|&d| d != 0).unwrap_or(3);
            out.extend(
                hex_digits[first..]
                    .iter()
                    .map(|&d| HEX_DIGITS[usize::from(d)]),
            );
        }
    };
    if longest.1 > 1 {
        groups(out, &v6[..longest.0]);
        out.extend_from_slice(b"::");
        groups(out, &v6[longest.0 + longest.1..]);
    } else {
        groups(out, &v6);
    }
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

fn hex(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        out.push(HEX_DIGITS[usize::from(b >> 4)]);
        out.push(HEX_DIGITS[usize::from(b & 0xf)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(prefix: &str, key: &Key, counter: Counter) -> Vec<u8> {
        state_key(prefix, key, &Quota::per_second(1).unwrap(), counter)
    }

    /// The span of `name`'s hash tag as Redis Cluster reads it: from the first `{` to the first
    /// `}` after it, if there is anything between.
    fn redis_tag(name: &[u8]) -> Option<std::ops::Range<usize>> {
        let open = name.iter().position(|&b| b == b'{')?;
        let close = open + 1 + name[open + 1..].iter().position(|&b| b == b'}')?;
        (close > open + 1).then_some(open + 1..close)
    }

    #[test]
    fn no_byte_of_a_key_ends_or_moves_its_hash_tag() {
        let mut rng = fastrand::Rng::with_seed(20);
        let alphabet = b"{}:%7Dd5\0\x7f\x80\xff a";
        let quota = Quota::per_second(1).unwrap();
        let mut names = std::collections::HashMap::new();
        for round in 0..5_000 {
            let len = rng.usize(0..=300);
            let bytes: Vec<u8> = if round % 2 == 0 {
                (0..len)
                    .map(|_| alphabet[rng.usize(..alphabet.len())])
                    .collect()
            } else {
                (0..len).map(|_| rng.u8(..)).collect()
            };
            let key = Key::from_bytes(&bytes);
            let whole = state_key("rl", &key, &quota, Counter::Whole);
            // The tag runs from the prefix's `:{` to the `}:` before the limit's 16 hex digits.
            let tag = redis_tag(&whole).unwrap();
            assert_eq!(tag.start, 4, "{bytes:?}: {whole:?}");
            assert_eq!(tag.end, whole.len() - 18, "{bytes:?}: {whole:?}");
            let marker = marker_key(&whole);
            assert_eq!(redis_tag(&marker), Some(tag.clone()));
            let part = Counter::Part {
                index: 3,
                parts: 8,
                epoch: Some(Timestamp::from_micros(9)),
            };
            let part = state_key("rl", &key, &quota, part);
            assert_eq!(redis_tag(&part).unwrap().end, part.len() - 35, "{part:?}");
            // Different keys, different names.
            if let Some(other) = names.insert(whole.clone(), bytes.clone()) {
                assert_eq!(other, bytes, "two keys share the name {whole:?}");
            }
        }
    }

    #[test]
    fn names_keep_user_bytes_inside_their_hash_tag_and_never_collide() {
        let key = Key::from("}{evil}");
        let layout = name("rl", &key, Counter::Whole);
        let digest = Sha256::digest(b"}{evil}");
        let mut tag = b"rl:{l".to_vec();
        hex(&mut tag, &digest[..16]);
        tag.extend_from_slice(b"}:");
        assert!(layout.starts_with(&tag), "{layout:?}");
        let (q1, q2) = (Quota::per_second(1).unwrap(), Quota::per_second(2).unwrap());
        let whole = |key: &Key, q: &Quota| state_key("p", key, q, Counter::Whole);
        assert_ne!(whole(&Key::from("7"), &q1), whole(&Key::from(7u64), &q1));
        assert_ne!(whole(&Key::from(7u64), &q1), whole(&Key::from(7u64), &q2));
        assert_ne!(
            whole(&Key::from(7u64), &q1),
            whole(&Key::from(7u64).scoped(3), &q1)
        );
        let part = |index, key: &Key| {
            state_key(
                "p",
                key,
                &q1,
                Counter::Part {
                    index,
                    parts: 16,
                    epoch: None,
                },
            )
        };
        assert_ne!(part(1, &Key::from(7u64)), part(11, &Key::from(7u64)));
        assert_ne!(part(1, &Key::from("1s7")), whole(&Key::from("1s7"), &q1));
        let ip = Key::from("203.0.113.9".parse::<std::net::IpAddr>().unwrap());
        assert!(whole(&ip, &q1).starts_with(b"p:{a203.0.113.9}:"));
    }

    #[test]
    fn every_name_fits_in_128_bytes() {
        let prefix = "p".repeat(MAX_PREFIX_LEN);
        let longest_string = Key::from("s".repeat(ratewarden_core::MAX_KEY_LEN));
        let just_fitting = Key::from("s".repeat(MAX_NAME_LEN - NAME_OVERHEAD - MAX_PREFIX_LEN));
        let ipv6: std::net::IpAddr = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe".parse().unwrap();
        let keys = [
            Key::from(u64::MAX),
            Key::from(ipv6),
            Key::hashed("secret"),
            longest_string,
            just_fitting,
        ];
        let counters = [
            Counter::Whole,
            Counter::Part {
                index: crate::MAX_PARTS - 1,
                parts: crate::MAX_PARTS,
                epoch: Some(Timestamp::from_nanos(u64::MAX)),
            },
        ];
        for key in &keys {
            for counter in counters {
                let name = name(&prefix, key, counter);
                assert!(name.len() <= MAX_NAME_LEN, "{} bytes: {key:?}", name.len());
                // Only a key's own counter has a split marker.
                if counter == Counter::Whole {
                    let marker = marker_key(&name);
                    assert!(marker.len() <= MAX_NAME_LEN, "{} bytes", marker.len());
                }
            }
        }
        // Long strings are digested: still one name per string.
        let a = name(&prefix, &Key::from("x".repeat(100)), Counter::Whole);
        let b = name(&prefix, &Key::from("y".repeat(100)), Counter::Whole);
        assert_ne!(a, b);
    }

    #[test]
    fn parts_are_steered_to_evenly_spread_slots() {
        let slot = |name: &[u8]| {
            let open = name.iter().position(|&b| b == b'{').unwrap();
            let close = open + name[open..].iter().position(|&b| b == b'}').unwrap();
            crc16::State::<crc16::XMODEM>::calculate(&name[open + 1..close]) % 16_384
        };
        let quota = Quota::per_second(1).unwrap();
        for key in [Key::from("hot-tenant"), Key::from(7u64), Key::hashed("x")] {
            let home = slot(&state_key("rl", &key, &quota, Counter::Whole));
            for parts in [2_u32, 3, 8, 16, 64] {
                let mut slots: Vec<u16> = (0..parts)
                    .map(|index| {
                        let counter = Counter::Part {
                            index,
                            parts,
                            epoch: Some(Timestamp::from_micros(9)),
                        };
                        slot(&state_key("rl", &key, &quota, counter))
                    })
                    .collect();
                for (index, &s) in slots.iter().enumerate() {
                    let wanted = (u32::from(home) + 16_384 * index as u32 / parts) % 16_384;
                    let off = (u32::from(s) + 16_384 - wanted) % 16_384;
                    assert!(
                        off < 8,
                        "{key:?} part {index}/{parts}: slot {s}, wanted {wanted}"
                    );
                }
                slots.sort_unstable();
                slots.dedup();
                assert_eq!(slots.len(), parts as usize);
            }
        }
    }

    #[test]
    fn an_address_is_named_as_its_display_writes_it() {
        use std::net::{IpAddr, Ipv6Addr};
        let mut rng = fastrand::Rng::with_seed(12);
        let named = |ip: IpAddr| {
            let mut out = Vec::new();
            push_ip(&mut out, ip);
            String::from_utf8(out).unwrap()
        };
        let fixed = [
            "::",
            "::1",
            "1::",
            "0.0.0.0",
            "255.255.255.255",
            "1:0:0:2::3",
            "::ffff:0:1",
        ];
        for text in fixed {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(named(ip), ip.to_string());
        }
        for _ in 0..100_000 {
            // Groups that are often zero, so that runs of every length and place occur.
            let groups: [u16; 8] = std::array::from_fn(|_| match rng.u8(0..4) {
                0 | 1 => 0,
                2 => rng.u16(0..16),
                _ => rng.u16(..),
            });
            let v6 = Ipv6Addr::from(groups);
            assert_eq!(named(IpAddr::V6(v6)), v6.to_string());
            let v4 = std::net::Ipv4Addr::from(rng.u32(..));
            assert_eq!(named(IpAddr::V4(v4)), v4.to_string());
        }
    }
}
