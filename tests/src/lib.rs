//! Support code for the integration tests of the `rl` workspace, and the harnesses that the
//! fuzz targets (`fuzz/`) share with the tests that replay their corpus.

use std::net::{IpAddr, SocketAddr};

use http::Request;
use rl_tower::key::{ClientIp, ForwardedHeader};

/// One fuzz case for the forwarded-header parsers: the first byte picks the header
/// (`Forwarded`, `X-Forwarded-For`, `X-Real-IP`) and, by its high bit, an IPv4 or IPv6
/// trusted peer; the rest is the header's raw bytes, one field line per `\n`.
///
/// Returns the client address `ClientIp` resolved. Panics (failing the fuzz target or the
/// replay test) if that address is neither the peer nor one written in the header.
pub fn client_ip_case(data: &[u8]) -> Option<IpAddr> {
    let (&selector, rest) = data.split_first()?;
    let (kind, name) = match selector % 3 {
        0 => (ForwardedHeader::Forwarded, "forwarded"),
        1 => (ForwardedHeader::XForwardedFor, "x-forwarded-for"),
        _ => (ForwardedHeader::XRealIp, "x-real-ip"),
    };
    let peer: SocketAddr = if selector & 0x80 == 0 {
        "10.0.0.1:443".parse().expect("valid address")
    } else {
        "[fd00::1]:443".parse().expect("valid address")
    };
    let mut builder = Request::builder();
    for line in rest.split(|&b| b == b'\n') {
        if let Ok(value) = http::HeaderValue::from_bytes(line) {
            builder = builder.header(name, value);
        }
    }
    let Ok(mut req) = builder.body(()) else {
        return None;
    };
    req.extensions_mut().insert(peer);
    let client_ip = ClientIp::new(kind)
        .trust("10.0.0.0/8".parse().expect("valid network"))
        .trust("fd00::/8".parse().expect("valid network"));
    let client = client_ip.client_addr(&req)?;
    let written = String::from_utf8_lossy(rest).to_ascii_lowercase();
    let text = client.to_string();
    assert!(
        client == peer.ip() || written.contains(&text) || mapped_written(&written, client),
        "resolved {client} appears neither as the peer nor in the header"
    );
    Some(client)
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
