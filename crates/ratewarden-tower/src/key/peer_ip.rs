//! [`PeerIp`]: the connection's peer address as the key.

use std::net::{IpAddr, Ipv6Addr};

use http::Request;
use ratewarden_core::{Key, KeyRepr};

use super::{KeyExtractor, peer_addr};

/// The default IPv6 grouping: one key per /64, the block a single subscriber usually gets.
pub(crate) const DEFAULT_IPV6_PREFIX: u8 = 64;

/// Keys a request by its connection's peer IP address (see [`peer_addr`] for where it is
/// read). IPv4-mapped IPv6 addresses count as their IPv4 address, and IPv6 addresses are grouped
/// by prefix (default /64), since one client controls a whole block.
///
/// A server that puts no peer address in the extensions (axum served without
/// `into_make_service_with_connect_info::<SocketAddr>()`) gives no request a key: each gets
/// the layer's [`MissingKey`](crate::rate_limit::MissingKey) answer, and under
/// `MissingKey::Skip` every request passes uncounted, which
/// [`RateLimitLayer::skipped`](crate::RateLimitLayer::skipped) shows.
///
/// Use [`ClientIp`](super::ClientIp) instead when the service sits behind proxies.
///
/// ```
/// use http::Request;
/// use ratewarden_tower::key::{KeyExtractor, PeerIp};
/// use std::net::SocketAddr;
///
/// let request = |addr: &str| {
///     let mut req = Request::new(());
///     req.extensions_mut().insert(addr.parse::<SocketAddr>().unwrap());
///     req
/// };
/// let peer_ip = PeerIp::new();
/// // Two addresses in one /64 share a key; ports never matter.
/// assert_eq!(
///     peer_ip.extract(&request("[2001:db8::1]:1000")),
///     peer_ip.extract(&request("[2001:db8::ffff]:2000")),
/// );
/// assert_eq!(
///     peer_ip.extract(&request("[::ffff:192.0.2.1]:1")),
///     peer_ip.extract(&request("192.0.2.1:2")),
/// );
/// assert_eq!(peer_ip.extract(&Request::new(())), None); // no peer address: no key
/// ```
#[derive(Clone, Copy, Debug)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

impl PeerIp {
    /// Keys by peer IP, IPv6 grouped by /64.
    ///
    /// ```
    /// use ratewarden_tower::key::{KeyExtractor, PeerIp};
    /// let mut req = http::Request::new(());
    /// req.extensions_mut().insert("192.0.2.1:5000".parse::<std::net::SocketAddr>().unwrap());
    /// assert!(PeerIp::new().extract(&req).is_some());
    /// ```
    #[must_use]
    pub const fn new() -> Self {
        Self {
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Groups IPv6 addresses by their first `prefix` bits (128 keys each address alone).
    ///
    /// # Errors
    ///
    /// [`InvalidIpv6Prefix`] for 0 (every IPv6 client would share one key) or more than 128.
    ///
    /// ```
    /// use ratewarden_tower::key::{KeyExtractor, PeerIp};
    /// let from = |peer: &str| {
    ///     let mut req = http::Request::new(());
    ///     req.extensions_mut().insert(peer.parse::<std::net::SocketAddr>().unwrap());
    ///     req
    /// };
    /// let (a, b) = (from("[2001:db8:0:1::1]:1"), from("[2001:db8:0:2::1]:1"));
    /// assert_ne!(PeerIp::new().extract(&a), PeerIp::new().extract(&b)); // two /64s
    /// let per_56 = PeerIp::new().ipv6_prefix(56)?;
    /// assert_eq!(per_56.extract(&a), per_56.extract(&b)); // one /56
    /// assert!(PeerIp::new().ipv6_prefix(0).is_err());
    /// # Ok::<(), ratewarden_tower::key::InvalidIpv6Prefix>(())
    /// ```
    pub const fn ipv6_prefix(mut self, prefix: u8) -> Result<Self, InvalidIpv6Prefix> {
        if prefix == 0 || prefix > 128 {
            return Err(InvalidIpv6Prefix(prefix));
        }
        self.ipv6_prefix = prefix;
        Ok(self)
    }
}

/// An IPv6 prefix length that cannot group clients: 0 (every IPv6 client one key) or more
/// than 128.
///
/// ```
/// let error = ratewarden_tower::key::PeerIp::new().ipv6_prefix(129).unwrap_err();
/// assert_eq!(error.to_string(), "an IPv6 prefix of 129 bits: use 1 to 128");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidIpv6Prefix(pub(crate) u8);

impl std::fmt::Display for InvalidIpv6Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "an IPv6 prefix of {} bits: use 1 to 128", self.0)
    }
}

impl std::error::Error for InvalidIpv6Prefix {}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl<B> KeyExtractor<B> for PeerIp {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        peer_addr(req).map(|addr| ip_key(addr.ip(), self.ipv6_prefix))
    }

    fn key_for(&self, key: Key) -> Key {
        ip_key_for(key, self.ipv6_prefix)
    }
}

/// The key of the address `key` names (an address, or one written as text such as
/// `"192.0.2.1"`), IPv6 masked to `prefix` bits; any other key as is.
pub(crate) fn ip_key_for(key: Key, prefix: u8) -> Key {
    match key.repr() {
        KeyRepr::Ip(bytes) => ip_key(Ipv6Addr::from(*bytes).into(), prefix),
        KeyRepr::Bytes(text) => match std::str::from_utf8(text).map(str::parse::<IpAddr>) {
            Ok(Ok(ip)) => ip_key(ip, prefix),
            _ => key,
        },
        _ => key,
    }
}

/// The key of an address: IPv4 (mapped or not) as is, IPv6 masked to `prefix` bits.
pub(crate) fn ip_key(ip: IpAddr, prefix: u8) -> Key {
    match ip.to_canonical() {
        IpAddr::V4(v4) => Key::from(IpAddr::V4(v4)),
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            Key::from(IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask)))
        }
    }
}
