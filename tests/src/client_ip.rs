//! The fuzz harness of `ClientIp`'s forwarded-header parsers, shared by `fuzz/` and the tests
//! that replay its corpus, and a request forwarded by our proxies for the benches.

use std::net::{IpAddr, SocketAddr};

use http::Request;
use ratewarden_tower::key::{ClientIp, ForwardedHeader};

/// One fuzz case for the forwarded-header parsers behind `ClientIp`; panics (failing the fuzz
/// target or the replay test) when `ClientIp` resolves an address it must not.
///
/// The first byte picks the header by its low six bits mod 3 (`Forwarded`, `X-Forwarded-For`,
/// `X-Real-IP`), an IPv4 or IPv6 trusted peer by its high bit, and the mode by bit 6:
///
/// - **raw** (bit 6 clear): the rest is the header's raw bytes, one field line per `\n`. The
///   resolved address must be the peer or one written in the header (as is, IPv4-mapped, or
///   escaped in a quoted-string: `for=":\:41"` writes `::41`).
/// - **attack** (bit 6 set): the rest is a `ProxiedCase`: what a client sent, arbitrary bytes,
///   to which the harness, playing our trusted proxies, appends a well-formed record of the
///   client's address and 0 to 3 trusted hops. The resolved address must be exactly the
///   client's address the first proxy wrote, never `None` and never one the client wrote
///   (`X-Real-IP`: `None` when a line of the client's survived beside the proxy's, since that
///   header is one value).
///
/// Returns the client address `ClientIp` resolved.
pub fn client_ip_case(data: &[u8]) -> Option<IpAddr> {
    let (&selector, rest) = data.split_first()?;
    let (kind, name) = match (selector & 0x3f) % 3 {
        0 => (ForwardedHeader::Forwarded, "forwarded"),
        1 => (ForwardedHeader::XForwardedFor, "x-forwarded-for"),
        _ => (ForwardedHeader::XRealIp, "x-real-ip"),
    };
    let peer: SocketAddr = if selector & 0x80 == 0 {
        "10.0.0.1:443".parse().expect("valid address")
    } else {
        "[fd00::1]:443".parse().expect("valid address")
    };
    let client_ip = ClientIp::new(kind)
        .trust("10.0.0.0/8".parse().expect("valid network"))
        .trust("fd00::/8".parse().expect("valid network"));
    if selector & 0x40 != 0 {
        let case = ProxiedCase::new(kind, rest);
        let req = request(name, peer, &case.lines);
        let client = client_ip.client_addr(&req);
        assert_eq!(
            client,
            case.expected,
            "{kind:?} lines {:?}",
            case.lines
                .iter()
                .map(|l| String::from_utf8_lossy(l))
                .collect::<Vec<_>>()
        );
        return client;
    }
    let lines: Vec<&[u8]> = rest.split(|&b| b == b'\n').collect();
    let client = client_ip.client_addr(&request(name, peer, &lines))?;
    let written = String::from_utf8_lossy(rest).to_ascii_lowercase();
    // A `Forwarded` node may be a quoted-string with escapes: `for=":\:41"` is `::41`.
    let mut unescaped = String::with_capacity(written.len());
    let mut chars = written.chars();
    while let Some(c) = chars.next() {
        unescaped.extend(if c == '\\' { chars.next() } else { Some(c) });
    }
    let text = client.to_string();
    assert!(
        client == peer.ip()
            || [&written, &unescaped]
                .iter()
                .any(|w| w.contains(&text) || mapped_written(w, client)),
        "resolved {client} appears neither as the peer nor in the header"
    );
    Some(client)
}

/// A request from `peer` with one `name` field line per item of `lines` that is a valid
/// header value (the others could not have been sent, and are left out).
fn request<L: AsRef<[u8]>>(name: &'static str, peer: SocketAddr, lines: &[L]) -> Request<()> {
    let mut req = Request::new(());
    let name = http::HeaderName::from_static(name);
    for line in lines {
        if let Ok(value) = http::HeaderValue::from_bytes(line.as_ref()) {
            req.headers_mut().append(name.clone(), value);
        }
    }
    req.extensions_mut().insert(peer);
    req
}

/// The attack mode of [`client_ip_case`]: a client's arbitrary field lines, then what our
/// trusted proxies (10.0.0.0/8, fd00::/8) add, written by the harness the way a proxy does.
///
/// Bytes: `shape`, four address bytes, then the client's field lines (split on `\n`; lines
/// that are not valid header values are dropped, as no client could send them). `shape`:
///
/// - bits 0-1: how many trusted hops our proxies record right of the client's address;
/// - bit 2: the first proxy appends `, <client>` to the client's last line (set) or writes a
///   new field line (clear); `X-Real-IP`: the proxy replaces the client's lines (set) or adds
///   its own beside them (clear);
/// - bit 3: each trusted hop is appended to the last line (set) or is a new line (clear);
/// - bits 4-5: how the client's address is spelled (IPv4, IPv4 with a port, IPv6, IPv6 in
///   brackets with a port; `Forwarded` quotes all but the plain IPv4);
/// - bit 6: `Forwarded` elements carry other parameters too, one of them a quoted-string with
///   `,`, `;` and an escaped quote in it;
/// - bit 7: `For=` instead of `for=`, and `,` without a space after it.
#[derive(Debug)]
struct ProxiedCase {
    lines: Vec<Vec<u8>>,
    expected: Option<IpAddr>,
}

impl ProxiedCase {
    fn new(kind: ForwardedHeader, data: &[u8]) -> Self {
        let byte = |i: usize| data.get(i).copied().unwrap_or(0);
        let shape = byte(0);
        let [a, b, c, d] = [byte(1), byte(2), byte(3), byte(4)];
        let mut lines: Vec<Vec<u8>> = data
            .get(5..)
            .unwrap_or_default()
            .split(|&b| b == b'\n')
            .filter(|line| http::HeaderValue::from_bytes(line).is_ok())
            .map(<[u8]>::to_vec)
            .collect();
        // The client's address, never in a trusted network: 10/8 becomes 11/8, and the IPv6
        // ones are in 2001:db8::/32.
        let v4 = std::net::Ipv4Addr::new(if a == 10 { 11 } else { a }, b, c, d);
        let v6 = std::net::Ipv6Addr::new(
            0x2001,
            0x0db8,
            u16::from_be_bytes([a, b]),
            0,
            0,
            0,
            0,
            u16::from_be_bytes([c, d]),
        );
        let forwarded = kind == ForwardedHeader::Forwarded;
        let (spelled, client) = match ((shape >> 4) & 3, forwarded) {
            (0, _) => (v4.to_string(), IpAddr::V4(v4)),
            (1, false) => (format!("{v4}:4711"), IpAddr::V4(v4)),
            (1, true) => (format!("\"{v4}:4711\""), IpAddr::V4(v4)),
            (2, false) => (v6.to_string(), IpAddr::V6(v6)),
            (2, true) => (format!("\"[{v6}]\""), IpAddr::V6(v6)),
            (_, false) => (format!("[{v6}]:4711"), IpAddr::V6(v6)),
            (_, true) => (format!("\"[{v6}]:4711\""), IpAddr::V6(v6)),
        };
        let separator = if shape & 0x80 == 0 { ", " } else { "," };
        let element = |node: &str| -> String {
            if !forwarded {
                return node.to_owned();
            }
            let name = if shape & 0x80 == 0 { "for" } else { "For" };
            if shape & 0x40 == 0 {
                format!("{name}={node}")
            } else {
                format!(r#"proto=https;{name}={node};host="a,b;c\"d""#)
            }
        };
        let append =
            |lines: &mut Vec<Vec<u8>>, same_line: bool, text: String| match lines.last_mut() {
                Some(last) if same_line => {
                    last.extend_from_slice(separator.as_bytes());
                    last.extend_from_slice(text.as_bytes());
                }
                _ => lines.push(text.into_bytes()),
            };
        if kind == ForwardedHeader::XRealIp {
            if shape & 0x04 != 0 {
                lines.clear();
            }
            let expected = lines.is_empty().then_some(client);
            lines.push(spelled.into_bytes());
            return Self { lines, expected };
        }
        append(&mut lines, shape & 0x04 != 0, element(&spelled));
        for hop in 0..shape & 3 {
            let trusted = if hop % 2 == 0 {
                format!("10.0.{hop}.{d}")
            } else if forwarded {
                format!("\"[fd00::{hop}:{c:x}]\"")
            } else {
                format!("fd00::{hop}:{c:x}")
            };
            append(&mut lines, shape & 0x08 != 0, element(&trusted));
        }
        Self {
            lines,
            expected: Some(client),
        }
    }
}

/// The client address in [`proxied_request`]s.
pub const PROXIED_CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(203, 0, 113, 9));

/// A request from our proxy at 10.0.0.2 (trust 10.0.0.0/8) whose one `header` field line,
/// `len` bytes long, is the client's own writing (`6.6.6.6, ` over and over) followed by
/// what our proxies appended: the client [`PROXIED_CLIENT`] and one trusted hop, 10.0.0.1.
/// The client sits near the right end, however long the line. `X-Real-IP` holds the client
/// alone, whatever `len`.
///
/// ```
/// use ratewarden_tower::key::{ClientIp, ForwardedHeader};
/// let req = tests::proxied_request(ForwardedHeader::Forwarded, 40);
/// assert_eq!(req.headers()["forwarded"].len(), 40);
/// let client_ip = ClientIp::new(ForwardedHeader::Forwarded).trust("10.0.0.0/8".parse().unwrap());
/// assert_eq!(client_ip.client_addr(&req), Some(tests::PROXIED_CLIENT));
/// ```
#[must_use]
pub fn proxied_request(header: ForwardedHeader, len: usize) -> Request<()> {
    let (name, client_part, proxies_part) = match header {
        ForwardedHeader::Forwarded => (
            "forwarded",
            "for=6.6.6.6, ",
            format!(", for={PROXIED_CLIENT}, for=10.0.0.1"),
        ),
        ForwardedHeader::XRealIp => ("x-real-ip", "", PROXIED_CLIENT.to_string()),
        _ => (
            "x-forwarded-for",
            "6.6.6.6, ",
            format!(", {PROXIED_CLIENT}, 10.0.0.1"),
        ),
    };
    let line: Vec<u8> = client_part
        .bytes()
        .cycle()
        .take(len.saturating_sub(proxies_part.len()))
        .chain(proxies_part.bytes())
        .collect();
    let mut req = Request::new(());
    req.headers_mut().insert(
        name,
        http::HeaderValue::from_bytes(&line).expect("a valid field value"),
    );
    let peer: SocketAddr = "10.0.0.2:443".parse().expect("valid address");
    req.extensions_mut().insert(peer);
    req
}

/// Whether an IPv4 client was written in its IPv4-mapped IPv6 form (`::ffff:a.b.c.d`), or an
/// IPv6 one in a non-canonical spelling that parses to it.
fn mapped_written(written: &str, client: IpAddr) -> bool {
    written
        .split(|c: char| !(c.is_ascii_hexdigit() || c == ':' || c == '.'))
        .filter(|token| !token.is_empty())
        .any(|token| {
            token
                .trim_matches(':')
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip.to_canonical() == client)
                || token
                    .parse::<IpAddr>()
                    .is_ok_and(|ip| ip.to_canonical() == client)
        })
}
