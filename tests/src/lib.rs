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

pub mod redis_server {
    //! A `redis-server` of the test's own, on a free loopback port, stopped on drop.

    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::path::PathBuf;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    /// A running `redis-server`, killed (and its directory removed) on drop.
    #[derive(Debug)]
    pub struct RedisServer {
        child: Child,
        port: u16,
        dir: PathBuf,
    }

    impl RedisServer {
        /// Starts a server on a free loopback port and waits until it answers `PING`.
        ///
        /// # Panics
        ///
        /// When `redis-server` is not installed (`scripts/test` installs it) or does not start
        /// within 10 s.
        #[must_use]
        pub fn start() -> Self {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!("rl-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create the server's directory");
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
                .args(["--appendonly", "no", "--dir"])
                .arg(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot start redis-server ({e}): install it (apt-get install redis-server) or run scripts/test, which does")
                });
            let server = Self { child, port, dir };
            let deadline = Instant::now() + Duration::from_secs(10);
            while !server.answers_ping() {
                assert!(
                    Instant::now() < deadline,
                    "redis-server on port {port} did not start"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            server
        }

        /// `redis://127.0.0.1:PORT`.
        #[must_use]
        pub fn url(&self) -> String {
            format!("redis://127.0.0.1:{}", self.port)
        }

        fn answers_ping(&self) -> bool {
            let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
                return false;
            };
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            let mut reply = [0; 7];
            stream.write_all(b"PING\r\n").is_ok()
                && stream.read_exact(&mut reply).is_ok()
                && &reply == b"+PONG\r\n"
        }
    }

    impl Drop for RedisServer {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// A loopback port nothing listens on now (the OS picks it).
    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port")
    }
}
