//! [`ClientIp`]: the client address behind trusted proxies, from forwarding headers read from the right.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use http::header::{FORWARDED, HeaderName};
use http::{HeaderMap, Request};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use ratewarden_core::Key;

use super::peer_ip::{DEFAULT_IPV6_PREFIX, ip_key, ip_key_for};
use super::{KeyExtractor, peer_addr, trim_ows};

mod parse;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// Which header a trusted proxy records the client address in.
///
/// ```
/// use http::Request;
/// use ratewarden_tower::key::{ClientIp, ForwardedHeader};
/// let extractor = ClientIp::new(ForwardedHeader::XForwardedFor).trust("10.0.0.0/8".parse()?);
/// let mut req = Request::builder().header("x-forwarded-for", "192.0.2.7").body(())?;
/// req.extensions_mut().insert("10.0.0.1:443".parse::<std::net::SocketAddr>()?);
/// assert_eq!(extractor.client_addr(&req), Some("192.0.2.7".parse()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// RFC 7239 `Forwarded: for=192.0.2.60;proto=http, for="[2001:db8::1]:4711"`.
    Forwarded,
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    XForwardedFor,
    /// `X-Real-IP: client`, a single address set by the one proxy in front.
    XRealIp,
}

/// Keys a request by the client's IP address behind trusted reverse proxies.
///
/// The header is read **only when the peer is a trusted proxy**; otherwise the peer itself is
/// the client, and whatever it wrote in the header is ignored. Only the one configured header
/// is read, never another one as a fallback.
///
/// A proxy records its peer's address at the right end: it appends `, ADDR` (`Forwarded`:
/// `, for=NODE`) to the last field line, or adds a field line. So the header is read from the
/// right end of its last field line, entry by entry and then line by line, skipping addresses
/// of trusted proxies: the first untrusted address is the client, and the reading stops there.
/// What lies left of it is the client's own writing and is **never read**: garbage, bytes that
/// are not UTF-8, or a quote left open there change nothing. The leftmost entry is never
/// believed just because it is leftmost (any client can write it). If every hop is trusted,
/// the leftmost is the client.
///
/// The entries that are read (the client's and those right of it) were written by our proxies,
/// so they must be well-formed. One that is not makes the request keyless (the layer's
/// [`MissingKey`](crate::rate_limit::MissingKey) rule applies) rather than guessing:
///
/// - `X-Forwarded-For`: each entry between commas is an address (`1.2.3.4`, `1.2.3.4:80`,
///   `2001:db8::1`, `[2001:db8::1]:80`) with optional spaces around it; `unknown`, an
///   obfuscated identifier, an empty entry or bytes that are not UTF-8 are not.
/// - `Forwarded` (RFC 7239): each element is `name=value` pairs separated by `;` (names
///   tokens, values tokens or quoted-strings) with exactly one `for`, whose node is an address,
///   quoted or not. Elements are split at the commas outside quoted-strings, from the right: a
///   `"` closes a quoted-string that opens at the nearest `"` to its left that is not escaped
///   (an odd run of `\` before a `"` escapes it). On what our proxies wrote, this finds the
///   same quoted-strings as reading from the left, so a quote the client left open
///   (`for=6.6.6.1;x="` followed by our `, for=203.0.113.9`) never swallows their elements: it
///   is met only once the reading has passed every one of them, as a quote that never opens,
///   and then means no key.
/// - `X-Real-IP`: one address, in one field line; a second line or a list means no key.
///
/// IPv6 addresses are grouped by prefix (default /64), IPv4-mapped ones count as IPv4.
///
/// ```
/// use http::Request;
/// use ratewarden_tower::key::{ClientIp, ForwardedHeader, KeyExtractor};
/// use std::net::SocketAddr;
///
/// let client_ip = ClientIp::new(ForwardedHeader::XForwardedFor)
///     .trust("10.0.0.0/8".parse().unwrap());
/// let request = |peer: &str, xff: &str| {
///     let mut req = Request::builder().header("x-forwarded-for", xff).body(()).unwrap();
///     req.extensions_mut().insert(peer.parse::<SocketAddr>().unwrap());
///     req
/// };
/// // Through our proxy at 10.0.0.2: the client is the rightmost untrusted entry.
/// let via_proxy = request("10.0.0.2:443", "6.6.6.6, 203.0.113.9, 10.0.0.1");
/// assert_eq!(client_ip.client_addr(&via_proxy), Some("203.0.113.9".parse().unwrap()));
/// // Straight from the internet: the header is the client's own claim, and ignored.
/// let spoofed = request("198.51.100.4:5000", "1.2.3.4");
/// assert_eq!(client_ip.client_addr(&spoofed), Some("198.51.100.4".parse().unwrap()));
///
/// // The client sent `Forwarded: for=6.6.6.6;x="` and our proxy appended its element to
/// // that line: the open quote swallows nothing.
/// let forwarded = ClientIp::new(ForwardedHeader::Forwarded).trust("10.0.0.0/8".parse().unwrap());
/// let mut req = Request::builder()
///     .header("forwarded", r#"for=6.6.6.6;x=", for=203.0.113.9"#)
///     .body(())
///     .unwrap();
/// req.extensions_mut().insert("10.0.0.2:443".parse::<SocketAddr>().unwrap());
/// assert_eq!(forwarded.client_addr(&req), Some("203.0.113.9".parse().unwrap()));
/// ```
#[derive(Clone, Debug)]
pub struct ClientIp {
    trusted: Arc<[IpNet]>,
    header: ForwardedHeader,
    ipv6_prefix: u8,
}

impl ClientIp {
    /// Reads `header` from trusted proxies; no proxy is trusted until [`trust`](Self::trust).
    ///
    /// ```
    /// use http::Request;
    /// use ratewarden_tower::key::{ClientIp, ForwardedHeader};
    /// let extractor = ClientIp::new(ForwardedHeader::Forwarded);
    /// let mut req = Request::builder().header("forwarded", "for=6.6.6.6").body(())?;
    /// req.extensions_mut().insert("192.0.2.1:5000".parse::<std::net::SocketAddr>()?);
    /// // The peer is no trusted proxy: what it wrote is ignored, it is the client.
    /// assert_eq!(extractor.client_addr(&req), Some("192.0.2.1".parse()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn new(header: ForwardedHeader) -> Self {
        Self {
            trusted: Arc::new([]),
            header,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Trusts the proxies in `network` (e.g. `10.0.0.0/8`, `::1/128`).
    ///
    /// Addresses are compared as IPv4 when they are IPv4-mapped (`::ffff:10.0.0.2`, as a
    /// dual-stack listener reports IPv4 peers), so a network written that way
    /// (`::ffff:10.0.0.0/104`) trusts its IPv4 addresses (`10.0.0.0/8`). Any other IPv6
    /// network trusts no IPv4 address, even one that holds the mapped block (`::/0`): trust
    /// `0.0.0.0/0` for that.
    ///
    /// ```
    /// use http::Request;
    /// use ratewarden_tower::key::{ClientIp, ForwardedHeader};
    /// let extractor = ClientIp::new(ForwardedHeader::XRealIp)
    ///     .trust("127.0.0.1/32".parse()?)
    ///     .trust("::1/128".parse()?);
    /// let mut req = Request::builder().header("x-real-ip", "203.0.113.5").body(())?;
    /// req.extensions_mut().insert("[::1]:8080".parse::<std::net::SocketAddr>()?);
    /// assert_eq!(extractor.client_addr(&req), Some("203.0.113.5".parse()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn trust(mut self, network: IpNet) -> Self {
        let mut trusted = self.trusted.to_vec();
        trusted.push(network);
        if let IpNet::V6(network) = network {
            trusted.extend(mapped_part(network).map(IpNet::V4));
        }
        self.trusted = trusted.into();
        self
    }

    /// Groups IPv6 clients by their first `prefix` bits (default 64).
    ///
    /// # Errors
    ///
    /// [`InvalidIpv6Prefix`](super::InvalidIpv6Prefix) for 0 (every IPv6 client would share
    /// one key) or more than 128.
    ///
    /// ```
    /// use http::Request;
    /// use ratewarden_tower::key::{ClientIp, ForwardedHeader, KeyExtractor};
    /// let extractor = ClientIp::new(ForwardedHeader::XForwardedFor).ipv6_prefix(48)?;
    /// let from = |peer: &str| {
    ///     let mut req = Request::new(());
    ///     req.extensions_mut().insert(peer.parse::<std::net::SocketAddr>().unwrap());
    ///     req
    /// };
    /// // One /48, one key.
    /// assert_eq!(extractor.extract(&from("[2001:db8:1:2::1]:1")), extractor.extract(&from("[2001:db8:1:ff::1]:1")));
    /// # Ok::<(), ratewarden_tower::key::InvalidIpv6Prefix>(())
    /// ```
    pub fn ipv6_prefix(mut self, prefix: u8) -> Result<Self, super::InvalidIpv6Prefix> {
        if prefix == 0 || prefix > 128 {
            return Err(super::InvalidIpv6Prefix(prefix));
        }
        self.ipv6_prefix = prefix;
        Ok(self)
    }

    /// The client's address, or `None` when the request has no peer address or the trusted
    /// proxies' header cannot be read.
    ///
    /// ```
    /// use http::Request;
    /// use ratewarden_tower::key::{ClientIp, ForwardedHeader};
    /// let req = Request::new(()); // no peer address
    /// assert_eq!(ClientIp::new(ForwardedHeader::Forwarded).client_addr(&req), None);
    /// ```
    #[must_use]
    pub fn client_addr<B>(&self, req: &Request<B>) -> Option<IpAddr> {
        let peer = peer_addr(req)?.ip().to_canonical();
        self.resolve(peer, req.headers())
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> Option<IpAddr> {
        if !self.is_trusted(peer) {
            return Some(peer);
        }
        match self.header {
            ForwardedHeader::XRealIp => {
                let mut values = headers.get_all(X_REAL_IP).iter();
                let Some(value) = values.next() else {
                    return Some(peer);
                };
                if values.next().is_some() {
                    return None;
                }
                parse::node(trim_ows(value.as_bytes()))
            }
            // Field lines from the last, each from its right end: the hops in the order our
            // proxies added them, newest first, read lazily so that the walk stops at the
            // client without touching what lies left of it.
            ForwardedHeader::XForwardedFor => self.walk(
                peer,
                headers
                    .get_all(X_FORWARDED_FOR)
                    .iter()
                    .rev()
                    .flat_map(|line| parse::x_forwarded_for_nodes(line.as_bytes())),
            ),
            ForwardedHeader::Forwarded => self.walk(
                peer,
                headers
                    .get_all(FORWARDED)
                    .iter()
                    .rev()
                    .flat_map(|line| parse::forwarded_nodes(line.as_bytes())),
            ),
        }
    }

    /// Walks `hops` (newest first) past trusted proxies, to the first untrusted one.
    fn walk(&self, peer: IpAddr, hops: impl Iterator<Item = Option<IpAddr>>) -> Option<IpAddr> {
        let mut client = peer;
        for hop in hops {
            client = hop?;
            if !self.is_trusted(client) {
                break;
            }
        }
        Some(client)
    }
}

/// The IPv4 addresses an IPv6 network holds as IPv4-mapped addresses (`::ffff:0:0/96`), as
/// an IPv4 network.
fn mapped_part(network: Ipv6Net) -> Option<Ipv4Net> {
    let mapped = Ipv6Net::new(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96).ok()?;
    // Only a network written inside the block: one that merely holds it (`::/0`, or `::1/64`
    // mistyped for loopback) says nothing of IPv4.
    if mapped.contains(&network) {
        let prefix = network.prefix_len() - 96;
        return Ipv4Net::new(network.network().to_ipv4_mapped()?, prefix).ok();
    }
    None
}

impl<B> KeyExtractor<B> for ClientIp {
    fn extract(&self, req: &Request<B>) -> Option<Key> {
        self.client_addr(req).map(|ip| ip_key(ip, self.ipv6_prefix))
    }

    /// A request from a peer has an address; with none from it, a trusted proxy's header
    /// was unreadable (malformed, or `X-Real-IP` twice).
    fn has_unusable_key(&self, req: &Request<B>) -> bool {
        peer_addr(req).is_some()
    }

    fn key_for(&self, key: Key) -> Key {
        ip_key_for(key, self.ipv6_prefix)
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(name: HeaderName, values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(name.clone(), v.parse().unwrap());
        }
        map
    }

    fn proxies(header: ForwardedHeader) -> ClientIp {
        ClientIp::new(header)
            .trust("10.0.0.0/8".parse().unwrap())
            .trust("2001:db8:ffff::/48".parse().unwrap())
    }

    #[test]
    fn x_forwarded_for_walks_right_to_left_across_lines() {
        let c = proxies(ForwardedHeader::XForwardedFor);
        let h = headers(
            X_FORWARDED_FOR,
            &["1.1.1.1, 2.2.2.2", "10.0.0.5", "10.1.1.1"],
        );
        assert_eq!(c.resolve(ip("10.0.0.1"), &h), Some(ip("2.2.2.2")));
        // all trusted: the leftmost
        let h = headers(X_FORWARDED_FOR, &["10.9.9.9, 10.0.0.5"]);
        assert_eq!(c.resolve(ip("10.0.0.1"), &h), Some(ip("10.9.9.9")));
        // absent: the proxy itself
        assert_eq!(
            c.resolve(ip("10.0.0.1"), &HeaderMap::new()),
            Some(ip("10.0.0.1"))
        );
        // garbage in the trusted part of the chain: no key
        let h = headers(X_FORWARDED_FOR, &["1.1.1.1, unknown, 10.0.0.5"]);
        assert_eq!(c.resolve(ip("10.0.0.1"), &h), None);
        // garbage left of the client does not matter
        let h = headers(X_FORWARDED_FOR, &["garbage, 1.1.1.1, 10.0.0.5"]);
        assert_eq!(c.resolve(ip("10.0.0.1"), &h), Some(ip("1.1.1.1")));
        // ports, brackets and mapped addresses
        let h = headers(X_FORWARDED_FOR, &["[2001:db8::7]:443, ::ffff:10.0.0.3"]);
        assert_eq!(c.resolve(ip("10.0.0.1"), &h), Some(ip("2001:db8::7")));
        let h = headers(X_FORWARDED_FOR, &["203.0.113.1:8080"]);
        assert_eq!(c.resolve(ip("10.0.0.1"), &h), Some(ip("203.0.113.1")));
        // empty entries are not addresses
        let h = headers(X_FORWARDED_FOR, &["1.1.1.1,,"]);
        assert_eq!(c.resolve(ip("10.0.0.1"), &h), None);
    }

    #[test]
    fn untrusted_peers_are_the_client() {
        let c = proxies(ForwardedHeader::XForwardedFor);
        let h = headers(X_FORWARDED_FOR, &["1.2.3.4"]);
        assert_eq!(c.resolve(ip("203.0.113.50"), &h), Some(ip("203.0.113.50")));
    }

    #[test]
    fn only_the_configured_header_is_read() {
        let c = proxies(ForwardedHeader::Forwarded);
        let h = headers(X_FORWARDED_FOR, &["1.2.3.4"]);
        assert_eq!(c.resolve(ip("10.0.0.1"), &h), Some(ip("10.0.0.1")));
    }

    #[test]
    fn forwarded_elements_and_quoting() {
        let c = proxies(ForwardedHeader::Forwarded);
        let h = headers(
            FORWARDED,
            &[r#"for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:cafe::17]:4711""#],
        );
        assert_eq!(c.resolve(ip("10.0.0.1"), &h), Some(ip("2001:db8:cafe::17")));
        let h = headers(
            FORWARDED,
            &[
                r#"for=192.0.2.60, for="[2001:db8:ffff::1]";host="a,b;c""#,
                "for=10.0.0.9",
            ],
        );
        assert_eq!(c.resolve(ip("10.0.0.1"), &h), Some(ip("192.0.2.60")));
        for bad in [
            "for=unknown",
            "for=_hidden",
            "proto=https",
            r#"for="[::1"#,
            "for=",
        ] {
            let h = headers(FORWARDED, &[bad]);
            assert_eq!(c.resolve(ip("10.0.0.1"), &h), None, "{bad}");
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_left_of_the_client_do_not_matter() {
        // Bug: one byte of the client's that is not UTF-8 made the whole header unreadable.
        let raw = |name: HeaderName, lines: &[&[u8]]| {
            let mut map = HeaderMap::new();
            for line in lines {
                map.append(name.clone(), HeaderValue::from_bytes(line).unwrap());
            }
            map
        };
        let c = proxies(ForwardedHeader::XForwardedFor);
        for lines in [
            &[&b"\xff\xfe, 203.0.113.9, 10.0.0.5"[..]][..],
            &[b"caf\xc3", b"203.0.113.9"],
            &[b"1.1.1.1, caf\xc3\xa9, 203.0.113.9"],
        ] {
            let h = raw(X_FORWARDED_FOR, lines);
            assert_eq!(
                c.resolve(ip("10.0.0.1"), &h),
                Some(ip("203.0.113.9")),
                "{lines:?}"
            );
        }
        let c = proxies(ForwardedHeader::Forwarded);
        for lines in [
            &[&b"for=\"\xff\", for=203.0.113.9"[..]][..],
            &[
                b"for=1.2.3.4;host=\xe9t\xe9",
                b"for=203.0.113.9;host=\"\xe9t\xe9\"",
            ],
        ] {
            let h = raw(FORWARDED, lines);
            assert_eq!(
                c.resolve(ip("10.0.0.1"), &h),
                Some(ip("203.0.113.9")),
                "{lines:?}"
            );
        }
        // Where the walk needs them (the client's entry and right of it), they mean no key.
        let c = proxies(ForwardedHeader::XForwardedFor);
        for lines in [
            &[&b"203.0.113.9\xff"[..]][..],
            &[b"203.0.113.9, 10.0.0.\xff5"],
            &[b"203.0.113.9", b"\xff"],
        ] {
            let h = raw(X_FORWARDED_FOR, lines);
            assert_eq!(c.resolve(ip("10.0.0.1"), &h), None, "{lines:?}");
        }
        let c = proxies(ForwardedHeader::XRealIp);
        let h = raw(X_REAL_IP, &[b"203.0.113.9\xff"]);
        assert_eq!(c.resolve(ip("10.0.0.1"), &h), None);
    }

    #[test]
    fn a_quote_the_client_leaves_open_never_swallows_what_the_proxies_appended() {
        // The client sends `Forwarded: for=6.6.6.1;x="`; our proxies append to that field line.
        // Bug: the open quote swallowed their elements and the key was the client's `6.6.6.1`.
        let c = proxies(ForwardedHeader::Forwarded);
        for line in [
            r#"for=6.6.6.1;x=", for=203.0.113.9"#,
            r#"for=6.6.6.1;x=", for=203.0.113.9, for=10.0.0.5"#,
            r#"for=6.6.6.1;x=",for="203.0.113.9:80";proto=https, for="[2001:db8:ffff::2]""#,
            r#"for="6.6.6.1, for=203.0.113.9"#,
            r#"for=6.6.6.1;x="\, for=203.0.113.9"#,
            r#"for=6.6.6.1, x=", for="203.0.113.9";host="a,b;c\"d", for=10.0.0.5"#,
        ] {
            let h = headers(FORWARDED, &[line]);
            assert_eq!(
                c.resolve(ip("10.0.0.1"), &h),
                Some(ip("203.0.113.9")),
                "{line}"
            );
        }
        // Our proxy wrote a new field line instead.
        let h = headers(FORWARDED, &[r#"for=6.6.6.1;x=""#, "for=203.0.113.9"]);
        assert_eq!(c.resolve(ip("10.0.0.1"), &h), Some(ip("203.0.113.9")));
        // Every element our proxies wrote is trusted: left of them is the client's garbage, and
        // an open quote there never joins them. No key, rather than an address the client chose.
        for lines in [
            &[r#"for=6.6.6.1;x=", for=10.0.0.5"#][..],
            &[r#"for=6.6.6.1;x=""#, "for=10.0.0.5"],
            &[r#"for=6.6.6.1, x=", for=10.0.0.5"#],
        ] {
            let h = headers(FORWARDED, lines);
            assert_eq!(c.resolve(ip("10.0.0.1"), &h), None, "{lines:?}");
        }
    }

    #[test]
    fn x_real_ip_is_one_value() {
        let c = proxies(ForwardedHeader::XRealIp);
        let h = headers(X_REAL_IP, &["203.0.113.7"]);
        assert_eq!(c.resolve(ip("10.0.0.1"), &h), Some(ip("203.0.113.7")));
        let h = headers(X_REAL_IP, &["203.0.113.7", "1.1.1.1"]);
        assert_eq!(c.resolve(ip("10.0.0.1"), &h), None);
        let h = headers(X_REAL_IP, &["1.1.1.1, 2.2.2.2"]);
        assert_eq!(c.resolve(ip("10.0.0.1"), &h), None);
    }
}
