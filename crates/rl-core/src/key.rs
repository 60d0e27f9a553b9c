//! [`Key`]: whose quota a request counts against.

use std::fmt;
use std::net::IpAddr;

use sha2::{Digest, Sha256};
use smol_str::SmolStr;

/// Keys longer than this many bytes are replaced by their SHA-256 digest.
pub const MAX_KEY_LEN: usize = 128;

/// Whose quota a request counts against: an integer, an IP address, or a string.
///
/// Cheap to clone. Integers, IP addresses and strings up to 23 bytes are stored inline (no
/// allocation). Strings longer than [`MAX_KEY_LEN`] are replaced by their SHA-256 digest, so
/// stores never hold an unbounded key; [`Key::hashed`] does the same for any value that must not
/// be stored or logged as is (API keys, tokens).
///
/// Keys of different kinds never collide: `Key::from(1u64)` and `Key::from("1")` are different
/// buckets. IPv4 addresses and their IPv4-mapped IPv6 forms are the same key.
///
/// ```
/// use rl_core::{Key, KeyRepr};
/// use std::net::IpAddr;
///
/// let user = Key::from("user-42");
/// assert_eq!(user.repr(), KeyRepr::Str("user-42"));
///
/// let v4: IpAddr = "203.0.113.7".parse()?;
/// let mapped: IpAddr = "::ffff:203.0.113.7".parse()?;
/// assert_eq!(Key::from(v4), Key::from(mapped));
///
/// let long = "x".repeat(1_000);
/// assert!(matches!(Key::from(long.as_str()).repr(), KeyRepr::Digest(_)));
/// assert_ne!(Key::from(1u64), Key::from("1"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key(Repr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    Int(u64),
    Ip([u8; 16]),
    Str(SmolStr),
    Digest([u8; 32]),
}

/// A borrowed view of a [`Key`], for stores that lay keys out by kind.
///
/// ```
/// use rl_core::{Key, KeyRepr};
/// assert_eq!(Key::from(7u64).repr(), KeyRepr::Int(7));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyRepr<'a> {
    /// An integer key.
    Int(u64),
    /// An IP address (or network prefix) as 16 bytes; IPv4 in its IPv4-mapped IPv6 form.
    Ip(&'a [u8; 16]),
    /// A string of at most [`MAX_KEY_LEN`] bytes.
    Str(&'a str),
    /// The SHA-256 digest of a long or secret value.
    Digest(&'a [u8; 32]),
}

impl Key {
    /// A key for any bytes that must not be stored or logged whole (an API key, a token): only
    /// their SHA-256 digest is kept.
    ///
    /// ```
    /// use rl_core::{Key, KeyRepr};
    /// let key = Key::hashed(b"sk_live_secret");
    /// assert!(matches!(key.repr(), KeyRepr::Digest(_)));
    /// assert!(!format!("{key:?}").contains("secret"));
    /// ```
    #[must_use]
    pub fn hashed(value: impl AsRef<[u8]>) -> Self {
        Self(Repr::Digest(Sha256::digest(value.as_ref()).into()))
    }

    /// The key's parts, for stores.
    ///
    /// ```
    /// use rl_core::{Key, KeyRepr};
    /// assert_eq!(Key::from("a").repr(), KeyRepr::Str("a"));
    /// ```
    #[must_use]
    pub fn repr(&self) -> KeyRepr<'_> {
        match &self.0 {
            Repr::Int(n) => KeyRepr::Int(*n),
            Repr::Ip(ip) => KeyRepr::Ip(ip),
            Repr::Str(s) => KeyRepr::Str(s),
            Repr::Digest(d) => KeyRepr::Digest(d),
        }
    }
}

impl From<u64> for Key {
    fn from(n: u64) -> Self {
        Self(Repr::Int(n))
    }
}

impl From<IpAddr> for Key {
    fn from(ip: IpAddr) -> Self {
        let v6 = match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        Self(Repr::Ip(v6.octets()))
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        if s.len() > MAX_KEY_LEN {
            Self::hashed(s)
        } else {
            Self(Repr::Str(SmolStr::new(s)))
        }
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        if s.len() > MAX_KEY_LEN {
            Self::hashed(s)
        } else {
            Self(Repr::Str(SmolStr::from(s)))
        }
    }
}

impl fmt::Debug for Key {
    /// Prints the key's kind and value; a digest prints only its first 8 bytes in hex.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Int(n) => write!(f, "Key::Int({n})"),
            Repr::Ip(ip) => write!(
                f,
                "Key::Ip({})",
                std::net::Ipv6Addr::from(*ip).to_canonical()
            ),
            Repr::Str(s) => write!(f, "Key::Str({s:?})"),
            Repr::Digest(d) => {
                f.write_str("Key::Digest(")?;
                for b in &d[..8] {
                    write!(f, "{b:02x}")?;
                }
                f.write_str("..)")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_ip_keys_stay_inline() {
        assert_eq!(std::mem::size_of::<Key>(), 40);
        let key = Key::from("abcdefghijklmnopqrstuvw"); // 23 bytes
        let KeyRepr::Str(s) = key.repr() else {
            panic!("not a string")
        };
        assert_eq!(s.len(), 23);
        assert!(!SmolStr::new(s).is_heap_allocated());
    }

    #[test]
    fn max_length_is_enforced() {
        let at_max = "k".repeat(MAX_KEY_LEN);
        assert_eq!(Key::from(at_max.as_str()).repr(), KeyRepr::Str(&at_max));
        let over = "k".repeat(MAX_KEY_LEN + 1);
        let key = Key::from(over.clone());
        assert_eq!(key, Key::hashed(&over));
        assert!(!format!("{key:?}").contains("kkkk"));
    }

    #[test]
    fn kinds_do_not_collide() {
        let ip: IpAddr = "0.0.0.1".parse().unwrap();
        let keys = [
            Key::from(1u64),
            Key::from("1"),
            Key::from(ip),
            Key::hashed("1"),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
