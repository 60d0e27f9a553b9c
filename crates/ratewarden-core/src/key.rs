//! [`Key`]: whose quota a request counts against.

use std::fmt;
use std::net::IpAddr;

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::Quota;

/// Keys longer than this many bytes are replaced by their SHA-256 digest.
pub const MAX_KEY_LEN: usize = 128;

/// Whose quota a request counts against: an integer, an IP address, or a string.
///
/// Cheap to clone. Integers, IP addresses and strings up to 38 bytes are stored inline (no
/// allocation); longer strings share one reference-counted copy. Strings longer than [`MAX_KEY_LEN`] are replaced by their SHA-256 digest, so
/// stores never hold an unbounded key; [`Key::hashed`] does the same for any value that must not
/// be stored or logged as is (API keys, tokens).
///
/// Keys of different kinds never collide: `Key::from(1u64)` and `Key::from("1")` are different
/// buckets. IPv4 addresses and their IPv4-mapped IPv6 forms are the same key.
///
/// ```
/// use ratewarden_core::{Key, KeyRepr};
/// use std::net::IpAddr;
///
/// let user = Key::from("user-42");
/// assert_eq!(user.repr(), KeyRepr::Bytes(b"user-42"));
/// assert_eq!(format!("{user:?}"), r#"Key::Bytes("user-42")"#);
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
#[derive(Clone)]
pub struct Key {
    repr: Repr,
    /// Which limit the key counts in: 0 for none, or a [`Key::scoped`] id.
    scope: u64,
}

/// Strings up to this many bytes are stored inline (a `Key` is 48 bytes either way).
const INLINE: usize = 38;

#[derive(Clone)]
enum Repr {
    Int(u64),
    Ip([u8; 16]),
    Inline { len: u8, buf: [u8; INLINE] },
    Shared(Arc<[u8]>),
    Digest([u8; 32]),
}

/// A borrowed view of a [`Key`], for stores that lay keys out by kind.
///
/// ```
/// use ratewarden_core::{Key, KeyRepr};
/// assert_eq!(Key::from(7u64).repr(), KeyRepr::Int(7));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyRepr<'a> {
    /// An integer key.
    Int(u64),
    /// An IP address (or network prefix) as 16 bytes; IPv4 in its IPv4-mapped IPv6 form.
    Ip(&'a [u8; 16]),
    /// A string (or byte string) of at most [`MAX_KEY_LEN`] bytes.
    Bytes(&'a [u8]),
    /// The SHA-256 digest of a long or secret value.
    Digest(&'a [u8; 32]),
}

impl Key {
    const fn new(repr: Repr) -> Self {
        Self { repr, scope: 0 }
    }

    /// The same key, counted in the limit `scope` (a non-zero id; 0 means none): keys in
    /// different scopes are different buckets in every store, even when their values are
    /// equal. `ratewarden-tower` scopes every key by the name of its layer ([`scope_of`](Self::scope_of)),
    /// so two limits sharing one store never share a bucket.
    ///
    /// ```
    /// use ratewarden_core::Key;
    /// let login = Key::scope_of("login");
    /// let search = Key::scope_of("search");
    /// assert_ne!(Key::from(7u64).scoped(login), Key::from(7u64).scoped(search));
    /// assert_eq!(Key::from(7u64).scoped(login), Key::from(7u64).scoped(login));
    /// assert_eq!(Key::from(7u64).scoped(login).scope(), login);
    /// ```
    #[must_use]
    #[inline]
    pub const fn scoped(mut self, scope: u64) -> Self {
        self.scope = scope;
        self
    }

    /// The key a [`KeyRepr`] shows: `Key::from_repr(key.repr())` equals `key` (scope aside).
    /// For stores that carry keys over the wire.
    ///
    /// ```
    /// use ratewarden_core::Key;
    /// for key in [Key::from(7u64), Key::from("user"), Key::hashed("secret")] {
    ///     assert_eq!(Key::from_repr(key.repr()), key);
    /// }
    /// ```
    #[must_use]
    pub fn from_repr(repr: KeyRepr<'_>) -> Self {
        match repr {
            KeyRepr::Int(n) => Self::new(Repr::Int(n)),
            KeyRepr::Ip(ip) => Self::new(Repr::Ip(*ip)),
            KeyRepr::Bytes(b) => Self::from_bytes(b),
            KeyRepr::Digest(d) => Self::new(Repr::Digest(*d)),
        }
    }

    /// The key's scope: 0 unless set with [`scoped`](Self::scoped).
    ///
    /// ```
    /// assert_eq!(ratewarden_core::Key::from(1u64).scope(), 0);
    /// ```
    #[must_use]
    #[inline]
    pub const fn scope(&self) -> u64 {
        self.scope
    }

    /// The id under which a store keeps this key's state for `quota`: the key's
    /// [scope](Self::scope) and the quota's [fingerprint](Quota::fingerprint), mixed. A key
    /// has one state per limit id, so that it counts apart under each named limit and under
    /// each quota: a per-route quota chosen by [`Quota`] never shares a bucket with another.
    /// The same on every host.
    ///
    /// ```
    /// use ratewarden_core::{Key, Quota};
    /// let (login, reads) = (Quota::per_hour(5)?, Quota::per_minute(100)?);
    /// let key = Key::from("user-1");
    /// assert_ne!(key.limit_id(&login), key.limit_id(&reads));
    /// assert_ne!(key.limit_id(&login), key.clone().scoped(7).limit_id(&login));
    /// assert_eq!(key.limit_id(&login), Key::from(42u64).limit_id(&login));
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    #[inline]
    pub const fn limit_id(&self, quota: &Quota) -> u64 {
        crate::quota::mix(self.scope ^ crate::quota::mix(quota.fingerprint()))
    }

    /// A scope id for the limit named `name`: the first 8 bytes of its SHA-256, never 0. The
    /// same on every host, so that a fleet's gateways agree on it.
    ///
    /// ```
    /// use ratewarden_core::Key;
    /// assert_eq!(Key::scope_of("login"), Key::scope_of("login"));
    /// assert_ne!(Key::scope_of("login"), Key::scope_of("search"));
    /// assert_ne!(Key::scope_of(""), 0);
    /// ```
    #[must_use]
    pub fn scope_of(name: &str) -> u64 {
        let digest = Sha256::digest(name.as_bytes());
        let mut first = [0; 8];
        first.copy_from_slice(&digest[..8]);
        u64::from_le_bytes(first).max(1)
    }

    /// A key for any bytes that must not be stored or logged whole (an API key, a token): only
    /// their SHA-256 digest is kept.
    ///
    /// ```
    /// use ratewarden_core::{Key, KeyRepr};
    /// let key = Key::hashed(b"sk_live_secret");
    /// assert!(matches!(key.repr(), KeyRepr::Digest(_)));
    /// assert!(!format!("{key:?}").contains("secret"));
    /// ```
    #[must_use]
    pub fn hashed(value: impl AsRef<[u8]>) -> Self {
        Self::new(Repr::Digest(Sha256::digest(value.as_ref()).into()))
    }

    /// The key's parts, for stores.
    ///
    /// ```
    /// use ratewarden_core::{Key, KeyRepr};
    /// assert_eq!(Key::from("a").repr(), KeyRepr::Bytes(b"a"));
    /// ```
    #[must_use]
    #[inline]
    pub fn repr(&self) -> KeyRepr<'_> {
        match &self.repr {
            Repr::Int(n) => KeyRepr::Int(*n),
            Repr::Ip(ip) => KeyRepr::Ip(ip),
            Repr::Inline { len, buf } => KeyRepr::Bytes(&buf[..usize::from(*len)]),
            Repr::Shared(s) => KeyRepr::Bytes(s),
            Repr::Digest(d) => KeyRepr::Digest(d),
        }
    }

    /// A key for a byte string, such as a header value that need not be UTF-8. The same bytes
    /// make the same key as the string they spell; over [`MAX_KEY_LEN`] bytes, only their
    /// SHA-256 digest is kept.
    ///
    /// ```
    /// use ratewarden_core::Key;
    /// assert_eq!(Key::from_bytes(b"user-42"), Key::from("user-42"));
    /// assert_eq!(Key::from_bytes(vec![b'x'; 500]), Key::hashed(vec![b'x'; 500]));
    /// ```
    #[inline]
    pub fn from_bytes(bytes: impl AsRef<[u8]>) -> Self {
        let bytes = bytes.as_ref();
        if bytes.len() <= INLINE {
            let mut buf = [0; INLINE];
            buf[..bytes.len()].copy_from_slice(bytes);
            // bytes.len() <= 38 fits a u8.
            Self::new(Repr::Inline {
                len: bytes.len() as u8,
                buf,
            })
        } else if bytes.len() <= MAX_KEY_LEN {
            Self::new(Repr::Shared(Arc::from(bytes)))
        } else {
            Self::hashed(bytes)
        }
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.scope == other.scope && self.repr() == other.repr()
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.scope.hash(state);
        self.repr().hash(state);
    }
}

impl From<u64> for Key {
    fn from(n: u64) -> Self {
        Self::new(Repr::Int(n))
    }
}

impl From<IpAddr> for Key {
    fn from(ip: IpAddr) -> Self {
        let v6 = match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        Self::new(Repr::Ip(v6.octets()))
    }
}

impl From<&str> for Key {
    #[inline]
    fn from(s: &str) -> Self {
        Self::from_bytes(s)
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Self::from_bytes(s)
    }
}

impl fmt::Debug for Key {
    /// Prints the key's kind and value; a digest prints only its first 8 bytes in hex.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.scope != 0 {
            write!(f, "[scope {:016x}] ", self.scope)?;
        }
        match &self.repr {
            Repr::Int(n) => write!(f, "Key::Int({n})"),
            Repr::Ip(ip) => write!(
                f,
                "Key::Ip({})",
                std::net::Ipv6Addr::from(*ip).to_canonical()
            ),
            Repr::Inline { .. } | Repr::Shared(_) => match self.repr() {
                KeyRepr::Bytes(b) => write!(f, "Key::Bytes({:?})", String::from_utf8_lossy(b)),
                other => write!(f, "{other:?}"),
            },
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
        assert_eq!(std::mem::size_of::<Key>(), 48);
        let short = "abcdefghijklmnopqrstuvwxyz0123456789AB"; // 38 bytes
        assert!(matches!(
            Key::from(short).repr,
            Repr::Inline { len: 38, .. }
        ));
        assert_eq!(Key::from(short).repr(), KeyRepr::Bytes(short.as_bytes()));
        let longer = format!("{short}C");
        assert!(matches!(Key::from(longer.as_str()).repr, Repr::Shared(_)));
        assert_eq!(Key::from(longer.as_str()), Key::from(longer));
        let ip: IpAddr = "2001:db8::1".parse().unwrap();
        assert!(matches!(Key::from(ip).repr, Repr::Ip(_)));
    }

    #[test]
    fn max_length_is_enforced() {
        let at_max = "k".repeat(MAX_KEY_LEN);
        assert_eq!(
            Key::from(at_max.as_str()).repr(),
            KeyRepr::Bytes(at_max.as_bytes())
        );
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
