//! The grammar of the forwarding headers, read from the right end of a field line, since that
//! is the end our proxies write: whatever lies left of the client's address is the client's,
//! and is never read.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use crate::key::trim_ows;

/// The longest node worth unescaping: `[` + an IPv6 address with an IPv4 tail (45) + `]:` +
/// a port, with room to spare. Longer nodes are not addresses.
const MAX_NODE: usize = 64;

/// An address as proxies write it: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]`,
/// `[2001:db8::1]:80`. Anything else (`unknown`, `_hidden`, garbage, bytes that are not
/// UTF-8) is `None`.
pub(super) fn node(node: &[u8]) -> Option<IpAddr> {
    let node = std::str::from_utf8(node).ok()?;
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(addr) = node.parse::<SocketAddr>() {
        return Some(addr.ip().to_canonical());
    }
    let inner = node.strip_prefix('[')?.strip_suffix(']')?;
    inner
        .parse::<Ipv6Addr>()
        .ok()
        .map(|v6| IpAddr::V6(v6).to_canonical())
}

/// The entries of one `X-Forwarded-For` field line, from the right: `Some(ip)` for an
/// address, `None` for anything else.
pub(super) fn x_forwarded_for_nodes(line: &[u8]) -> impl Iterator<Item = Option<IpAddr>> + '_ {
    line.rsplit(|&b| b == b',')
        .map(|entry| node(trim_ows(entry)))
}

/// The nodes of one `Forwarded` field line's elements, from the right: `Some(ip)` for a
/// well-formed element with one `for` node that is an address, `None` for anything else.
/// After a quote that closes but never opens, the line yields one `None` and ends.
pub(super) fn forwarded_nodes(line: &[u8]) -> impl Iterator<Item = Option<IpAddr>> + '_ {
    ElementsFromRight { rest: Some(line) }.map(|element| element.and_then(forwarded_for))
}

/// The elements of one `Forwarded` field line, from the right: `Some(element)`, or `None` for
/// a quote that closes but never opens (the line is not read further).
///
/// Reading from the right, the first `"` met outside a quoted-string closes one; it opens at
/// the nearest `"` to its left that is not escaped (preceded by an odd run of `\`). In a
/// well-formed line this finds exactly the quoted-strings a left-to-right reading finds, so the
/// elements our proxies append are split right whatever the client wrote left of them: a
/// quote the client left open is only met, as a quote that never opens, once the walk has gone
/// past every element the proxies wrote.
#[derive(Debug)]
struct ElementsFromRight<'a> {
    rest: Option<&'a [u8]>,
}

impl<'a> Iterator for ElementsFromRight<'a> {
    type Item = Option<&'a [u8]>;

    fn next(&mut self) -> Option<Self::Item> {
        let line = self.rest?;
        let mut end = line.len();
        while let Some(i) = line[..end].iter().rposition(|&b| b == b',' || b == b'"') {
            if line[i] == b',' {
                self.rest = Some(&line[..i]);
                return Some(Some(&line[i + 1..]));
            }
            let Some(open) = opening_quote(&line[..i]) else {
                self.rest = None;
                return Some(None);
            };
            end = open;
        }
        self.rest = None;
        Some(Some(line))
    }
}

/// Where the quoted-string that closes at the end of `s` opens: the last `"` in `s` that is
/// not escaped.
fn opening_quote(s: &[u8]) -> Option<usize> {
    let mut end = s.len();
    loop {
        let quote = s[..end].iter().rposition(|&b| b == b'"')?;
        let backslashes = s[..quote].iter().rev().take_while(|&&b| b == b'\\').count();
        if backslashes % 2 == 0 {
            return Some(quote);
        }
        end = quote - backslashes;
    }
}

/// The `for` node of one `Forwarded` element, if the element is well-formed: pairs
/// `name=value` separated by `;` (empty pairs and whitespace around pairs allowed), names
/// tokens, values tokens or quoted-strings, and `for` given exactly once. An unquoted `for`
/// value may also hold `:`, `[` and `]` (some proxies write `for=[2001:db8::1]:80` unquoted).
fn forwarded_for(element: &[u8]) -> Option<IpAddr> {
    let mut for_value = None;
    let mut rest = element;
    loop {
        rest = trim_ows(rest);
        if let Some(after) = rest.strip_prefix(b";") {
            rest = after;
            continue;
        }
        if rest.is_empty() {
            break;
        }
        let name_len = rest.iter().take_while(|&&b| is_tchar(b)).count();
        let (name, after) = rest.split_at(name_len);
        let after = after.strip_prefix(b"=").filter(|_| !name.is_empty())?;
        let (value, after) = match after.strip_prefix(b"\"") {
            Some(quoted) => {
                let close = closing_quote(quoted)?;
                (Value::Quoted(&quoted[..close]), &quoted[close + 1..])
            }
            None => {
                let len = after.iter().take_while(|&&b| is_node_byte(b)).count();
                (Value::Token(&after[..len]), &after[len..])
            }
        };
        if name.eq_ignore_ascii_case(b"for") && for_value.replace(value).is_some() {
            return None;
        }
        rest = trim_ows(after);
        match rest.split_first() {
            None => break,
            Some((b';', after)) => rest = after,
            Some(_) => return None,
        }
    }
    match for_value? {
        Value::Token(token) => node(token),
        Value::Quoted(quoted) if !quoted.contains(&b'\\') => node(quoted),
        Value::Quoted(quoted) => {
            let mut buf = [0; MAX_NODE];
            let mut len = 0;
            let mut bytes = quoted.iter();
            while let Some(&b) = bytes.next() {
                let b = if b == b'\\' { *bytes.next()? } else { b };
                *buf.get_mut(len)? = b;
                len += 1;
            }
            node(&buf[..len])
        }
    }
}

/// A `Forwarded` pair's value: a token, or the inside of a quoted-string (still escaped).
#[derive(Clone, Copy, Debug)]
enum Value<'a> {
    Token(&'a [u8]),
    Quoted(&'a [u8]),
}

/// Where the quoted-string whose inside starts `s` closes: its first `"` not escaped.
fn closing_quote(s: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(&b) = s.get(i) {
        match b {
            b'"' => return Some(i),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    None
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    // A `match`, not a search of the punctuation list: it runs for every byte of an element.
    matches!(
        b,
        b'0'..=b'9'
            | b'a'..=b'z'
            | b'A'..=b'Z'
            | b'!'
            | b'#'
            | b'$'
            | b'%'
            | b'&'
            | b'\''
            | b'*'
            | b'+'
            | b'-'
            | b'.'
            | b'^'
            | b'_'
            | b'`'
            | b'|'
            | b'~'
    )
}

/// A byte of an unquoted value: a `tchar`, or `:`, `[`, `]` of an unquoted address.
fn is_node_byte(b: u8) -> bool {
    is_tchar(b) || matches!(b, b':' | b'[' | b']')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elements(line: &str) -> Vec<Option<&str>> {
        ElementsFromRight {
            rest: Some(line.as_bytes()),
        }
        .map(|e| e.map(|e| std::str::from_utf8(e).unwrap()))
        .collect()
    }

    #[test]
    fn elements_split_from_the_right_outside_quoted_strings() {
        assert_eq!(
            elements(r#"a,"b,\"c",d"#),
            [Some("d"), Some(r#""b,\"c""#), Some("a")]
        );
        assert_eq!(elements(""), [Some("")]);
        assert_eq!(elements(r#"x="a\\", y"#), [Some(" y"), Some(r#"x="a\\""#)]);
        // A quote left open by the client: the elements right of it are split as written,
        // then the line ends with one element that is not one.
        assert_eq!(
            elements(r#"for=6.6.6.1;x=", for=1.2.3.4, for="[::1]""#),
            [Some(r#" for="[::1]""#), Some(" for=1.2.3.4"), None]
        );
    }

    #[test]
    fn forwarded_for_reads_well_formed_elements_only() {
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        for (element, expected) in [
            ("for=192.0.2.60", ip("192.0.2.60")),
            (" For=192.0.2.60 ; proto=http;;by=x ", ip("192.0.2.60")),
            (r#"for="[2001:db8::1]:4711""#, ip("2001:db8::1")),
            (r#"for="\[2001:db8::1\]""#, ip("2001:db8::1")),
            ("for=[2001:db8::1]:80", ip("2001:db8::1")),
            (r#"host="a;b,c\"";for=192.0.2.60"#, ip("192.0.2.60")),
            ("for=192.0.2.60;for=192.0.2.61", None),
            ("proto=https", None),
            ("for=", None),
            ("for=unknown", None),
            (r#"for="192.0.2.60"x"#, None),
            (r#"for="192.0.2.60"#, None),
            ("for 192.0.2.60", None),
            ("=192.0.2.60", None),
            ("for=192.0.2.60;host=\u{e9}", None),
        ] {
            assert_eq!(forwarded_for(element.as_bytes()), expected, "{element}");
        }
        let long = format!(r#"for="\{}""#, "1".repeat(MAX_NODE + 1));
        assert_eq!(forwarded_for(long.as_bytes()), None);
    }
}
