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

    /// A Redis Cluster of 3 masters and 3 replicas on loopback, stopped on drop.
    #[derive(Debug)]
    pub struct RedisCluster {
        nodes: Vec<Child>,
        ports: Vec<u16>,
        dir: PathBuf,
    }

    impl RedisCluster {
        /// Starts six nodes (each also needs its port + 10000 free, for the cluster bus, so
        /// ports stay below 55535), joins them with `redis-cli --cluster create`, and waits
        /// until every node reports `cluster_state:ok`.
        ///
        /// # Panics
        ///
        /// When `redis-server` or `redis-cli` is missing, or the cluster does not form in 30 s.
        #[must_use]
        pub fn start() -> Self {
            let ports = cluster_ports(6);
            let dir = std::env::temp_dir().join(format!(
                "rl-redis-cluster-{}-{}",
                std::process::id(),
                ports[0]
            ));
            let mut nodes = Vec::new();
            for &port in &ports {
                let node_dir = dir.join(port.to_string());
                std::fs::create_dir_all(&node_dir).expect("create a node's directory");
                let child = Command::new("redis-server")
                    .args([
                        "--port",
                        &port.to_string(),
                        "--bind",
                        "127.0.0.1",
                        "--save",
                        "",
                    ])
                    .args(["--appendonly", "no", "--cluster-enabled", "yes"])
                    .args(["--cluster-node-timeout", "2000", "--dir"])
                    .arg(&node_dir)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("start redis-server (apt-get install redis-server)");
                nodes.push(child);
            }
            let cluster = Self { nodes, ports, dir };
            let deadline = Instant::now() + Duration::from_secs(30);
            for &port in &cluster.ports {
                while !ping(port) {
                    assert!(
                        Instant::now() < deadline,
                        "cluster node {port} did not start"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            let addresses: Vec<String> = cluster
                .ports
                .iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect();
            let status = Command::new("redis-cli")
                .arg("--cluster")
                .arg("create")
                .args(&addresses)
                .args(["--cluster-replicas", "1", "--cluster-yes"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("run redis-cli --cluster create");
            assert!(status.success(), "redis-cli --cluster create failed");
            for &port in &cluster.ports {
                while !command(port, "CLUSTER INFO\r\n").contains("cluster_state:ok") {
                    assert!(Instant::now() < deadline, "the cluster did not become ok");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            cluster
        }

        /// Sends `line` (an inline command ending in CRLF) to every node; returns the replies.
        #[must_use]
        pub fn on_every_node(&self, line: &str) -> Vec<String> {
            self.ports.iter().map(|&p| command(p, line)).collect()
        }

        /// `redis://127.0.0.1:PORT` of every node.
        #[must_use]
        pub fn urls(&self) -> Vec<String> {
            self.ports
                .iter()
                .map(|p| format!("redis://127.0.0.1:{p}"))
                .collect()
        }
    }

    impl Drop for RedisCluster {
        fn drop(&mut self) {
            for node in &mut self.nodes {
                let _ = node.kill();
                let _ = node.wait();
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn ping(port: u16) -> bool {
        command(port, "PING\r\n").starts_with("+PONG")
    }

    /// Sends one inline command and returns what arrives within 500 ms.
    fn command(port: u16, line: &str) -> String {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
            return String::new();
        };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        if stream.write_all(line.as_bytes()).is_err() {
            return String::new();
        }
        let mut reply = vec![0; 4096];
        let n = stream.read(&mut reply).unwrap_or(0);
        String::from_utf8_lossy(&reply[..n]).into_owned()
    }

    /// `count` consecutive ports below 55535 that are free, each with port + 10000 free too.
    fn cluster_ports(count: u16) -> Vec<u16> {
        let seed = u16::try_from(std::process::id() % 2_000).unwrap_or(0);
        for attempt in 0..500u16 {
            let base = 20_000 + (seed * 7 + attempt * 31) % 25_000;
            let ports: Vec<u16> = (base..base + count).collect();
            let all_free = ports.iter().all(|&p| {
                TcpListener::bind(("127.0.0.1", p)).is_ok()
                    && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok()
            });
            if all_free {
                return ports;
            }
        }
        panic!("no {count} free ports (with their cluster bus ports) below 55535")
    }

    /// A loopback port nothing listens on now (the OS picks it).
    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port")
    }
}
