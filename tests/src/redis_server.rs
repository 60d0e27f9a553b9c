//! Redis servers and clusters of a test's own, on free loopback ports, stopped on drop; TLS
//! certificates made at run time; a wall clock that can be stepped.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server`, killed (and its directory removed) on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
    /// The certificates of a server that speaks TLS only.
    tls: Option<TlsCerts>,
    /// The file holding how far the server's wall clock is shifted, in seconds (a server
    /// started with [`start_with_shifted_clock`](Self::start_with_shifted_clock)).
    clock: Option<PathBuf>,
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
        Self::start_with(free_port(), &[])
    }

    /// Starts a server on `port` with extra `redis-server` arguments (`--maxmemory 1mb`).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    #[must_use]
    pub fn start_with(port: u16, args: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("rl-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        let args: Vec<String> = args.iter().map(ToString::to_string).collect();
        let child = spawn(port, &dir, &args, None);
        let server = Self {
            child,
            port,
            dir,
            args,
            tls: None,
            clock: None,
        };
        server.wait_until_up();
        server
    }

    /// Starts a server whose wall clock (Redis's `TIME`, which the scripts decide by) can
    /// be stepped with [`shift_clock`](Self::shift_clock): `redis-server` runs with
    /// `tests/src/clock_shift.c` preloaded, compiled with `cc` on first use.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start), and when `cc` is missing or fails.
    #[must_use]
    pub fn start_with_shifted_clock() -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("rl-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        let shift = dir.join("clock-shift");
        let child = spawn(port, &dir, &[], Some(&shift));
        let server = Self {
            child,
            port,
            dir,
            args: Vec::new(),
            tls: None,
            clock: Some(shift),
        };
        server.shift_clock(0);
        server.wait_until_up();
        server
    }

    /// Steps the server's wall clock to `seconds` ahead of the host's (behind, if
    /// negative), at once.
    ///
    /// # Panics
    ///
    /// When the server was not started with
    /// [`start_with_shifted_clock`](Self::start_with_shifted_clock).
    pub fn shift_clock(&self, seconds: i64) {
        use std::io::Write as _;
        let path = self.clock.as_ref().expect("a server with a shifted clock");
        // Rewritten in place, never truncated: the server reads it through a mapping.
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .expect("open the clock's shift file");
        file.write_all(format!("{seconds:<32}").as_bytes())
            .expect("write the clock's shift");
    }

    /// Starts a server without Redis functions, as a Redis before 7.0: `FCALL` and
    /// `FUNCTION` are unknown commands.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    #[must_use]
    pub fn start_without_functions() -> Self {
        Self::start_with(
            free_port(),
            &[
                "--rename-command",
                "FCALL",
                "fcall-renamed-away",
                "--rename-command",
                "FUNCTION",
                "function-renamed-away",
            ],
        )
    }

    /// Starts a server that speaks TLS only (`--port 0 --tls-port PORT`) on a free
    /// loopback port, with a certificate for 127.0.0.1 signed by a CA of its own
    /// ([`tls`](Self::tls)), and waits until it answers `PING` over TLS. Clients need no
    /// certificate of their own.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start), and when `openssl` is missing.
    #[must_use]
    pub fn start_tls() -> Self {
        Self::start_tls_with(free_port(), &["--tls-auth-clients", "no"])
    }

    /// As [`start_tls`](Self::start_tls), on `port` and with extra `redis-server`
    /// arguments (`--tls-auth-clients yes` for mutual TLS: the client certificate of
    /// [`tls`](Self::tls) is then the one the server admits).
    ///
    /// # Panics
    ///
    /// As [`start_tls`](Self::start_tls).
    #[must_use]
    pub fn start_tls_with(port: u16, args: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("rl-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        let tls = TlsCerts::generate();
        let file = |name: &str| tls.path(name).display().to_string();
        // Later arguments win: `--port 0` turns off the plain port `spawn` sets.
        let mut all: Vec<String> = ["--port", "0", "--tls-port", &port.to_string()]
            .iter()
            .map(ToString::to_string)
            .collect();
        for (flag, name) in [
            ("--tls-cert-file", "server.crt"),
            ("--tls-key-file", "server.key"),
            ("--tls-ca-cert-file", "ca.crt"),
        ] {
            all.extend([flag.to_owned(), file(name)]);
        }
        all.extend(args.iter().map(ToString::to_string));
        let child = spawn(port, &dir, &all, None);
        let server = Self {
            child,
            port,
            dir,
            args: all,
            tls: Some(tls),
            clock: None,
        };
        server.wait_until_up();
        server
    }

    /// `redis://127.0.0.1:PORT`, or `rediss://` for a TLS server.
    #[must_use]
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The certificates of a server started with [`start_tls`](Self::start_tls).
    #[must_use]
    pub const fn tls(&self) -> Option<&TlsCerts> {
        self.tls.as_ref()
    }

    /// A client of this server (over TLS for a TLS server, trusting its CA and presenting
    /// its client certificate).
    ///
    /// # Errors
    ///
    /// When the client cannot be built.
    pub fn client(&self) -> redis::RedisResult<redis::Client> {
        match &self.tls {
            None => redis::Client::open(self.url()),
            Some(tls) => redis::Client::build_with_tls(self.url(), tls.certificates(true)),
        }
    }

    /// The server's port.
    #[must_use]
    pub const fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server with SIGKILL: no reply, no goodbye, state gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port (empty: nothing is saved).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn restart(&mut self) {
        self.kill();
        self.child = spawn(self.port, &self.dir, &self.args, self.clock.as_deref());
        self.wait_until_up();
    }

    /// Sends SIGSTOP: the process freezes, its sockets stay open, nothing answers.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Sends SIGCONT after [`freeze`](Self::freeze).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} failed");
    }

    /// Runs `cmd` on a connection of its own and returns the reply.
    ///
    /// # Errors
    ///
    /// The server's error reply, or a connection error.
    pub fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        query_on(|| self.client(), cmd)
    }

    /// How many scripts and functions the server has run (`FCALL`, `EVALSHA` and `EVAL`
    /// calls, from `INFO commandstats`).
    ///
    /// # Panics
    ///
    /// When the server does not answer.
    #[must_use]
    pub fn script_calls(&self) -> u64 {
        script_calls(
            &self
                .query::<String>(redis::cmd("INFO").arg("commandstats"))
                .expect("INFO"),
        )
    }

    /// Runs `cmd` on a connection of its own from a thread, without waiting for it: for
    /// commands that block the server (`DEBUG SLEEP`, an endless script).
    pub fn query_in_background(&self, cmd: redis::Cmd) -> std::thread::JoinHandle<()> {
        let client = self.client();
        std::thread::spawn(move || {
            if let Ok(mut connection) = client.and_then(|c| c.get_connection()) {
                let _: redis::RedisResult<redis::Value> = cmd.query(&mut connection);
            }
        })
    }

    fn wait_until_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.is_up() {
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the server answers `PING` (or with an error, such as `NOAUTH`: it is up).
    fn is_up(&self) -> bool {
        if self.tls.is_none() {
            return ping(self.port);
        }
        match self.query::<String>(&redis::cmd("PING")) {
            Ok(_) => true,
            Err(error) => error.code().is_some(),
        }
    }
}

/// A CA, a certificate for 127.0.0.1 that it signed for a server, and one for a client,
/// made with the `openssl` command line in a directory of their own (removed on drop).
#[derive(Debug)]
pub struct TlsCerts {
    dir: PathBuf,
}

impl TlsCerts {
    /// A new CA (EC P-256, valid for a day) and the certificates it signed.
    ///
    /// # Panics
    ///
    /// When `openssl` is missing (`scripts/test` installs it) or fails.
    #[must_use]
    pub fn generate() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("rl-tls-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the certificates' directory");
        let certs = Self { dir };
        let key = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        certs.openssl(
            &[
                &["req", "-x509"],
                &key[..],
                &["-keyout", "ca.key", "-out", "ca.crt"],
            ]
            .concat(),
            &["-days", "1", "-subj", "/CN=ratewarden test CA"],
        );
        for (name, usage) in [("server", "serverAuth"), ("client", "clientAuth")] {
            let (csr, crt, key_file, ext) = (
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.key"),
                format!("{name}.ext"),
            );
            std::fs::write(
                certs.path(&ext),
                format!(
                    "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
                     keyUsage=digitalSignature\nextendedKeyUsage={usage}\n"
                ),
            )
            .expect("write an extensions file");
            certs.openssl(
                &[&["req"], &key[..], &["-keyout", &key_file, "-out", &csr]].concat(),
                &["-subj", &format!("/CN=ratewarden test {name}")],
            );
            certs.openssl(
                &[
                    "x509", "-req", "-in", &csr, "-CA", "ca.crt", "-CAkey", "ca.key",
                ],
                &[
                    "-CAcreateserial",
                    "-out",
                    &crt,
                    "-days",
                    "1",
                    "-extfile",
                    &ext,
                ],
            );
        }
        certs
    }

    fn openssl(&self, args: &[&str], more: &[&str]) {
        let output = Command::new("openssl")
            .args(args)
            .args(more)
            .current_dir(&self.dir)
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run openssl ({e}): install it (apt-get install openssl) or run scripts/test, which does")
            });
        assert!(
            output.status.success(),
            "openssl {args:?} {more:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The path of one of the files: `ca.crt`, `server.crt`, `server.key`, `client.crt`,
    /// `client.key`.
    #[must_use]
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The contents of one of the files (see [`path`](Self::path)).
    ///
    /// # Panics
    ///
    /// When the file cannot be read.
    #[must_use]
    pub fn pem(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).expect("read a certificate")
    }

    /// The CA, and (`client`) the client certificate and key, as the `redis` crate takes
    /// them.
    #[must_use]
    pub fn certificates(&self, client: bool) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: client.then(|| redis::ClientTlsConfig {
                client_cert: self.pem("client.crt"),
                client_key: self.pem("client.key"),
            }),
            root_cert: Some(self.pem("ca.crt")),
        }
    }
}

impl Drop for TlsCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn spawn(port: u16, dir: &Path, args: &[String], clock: Option<&Path>) -> Child {
    let mut command = Command::new("redis-server");
    if let Some(shift) = clock {
        command
            .env("LD_PRELOAD", clock_shift_library())
            .env("RL_CLOCK_SHIFT_FILE", shift);
    }
    command
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
        .args(["--appendonly", "no", "--dir"])
        .arg(dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start redis-server ({e}): install it (apt-get install redis-server) or run scripts/test, which does")
        })
}

/// `tests/src/clock_shift.c` compiled, in a directory named by its source's hash.
fn clock_shift_library() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let source = include_str!("clock_shift.c");
            // Named by the source: a changed shim is built anew.
            let crc = crc16::State::<crc16::XMODEM>::calculate(source.as_bytes());
            let dir =
                std::env::temp_dir().join(format!("rl-clock-shift-{crc:04x}-{}", source.len()));
            let library = dir.join("clock_shift.so");
            if !library.exists() {
                std::fs::create_dir_all(&dir).expect("create the shim's directory");
                let c = dir.join(format!("clock_shift-{}.c", std::process::id()));
                std::fs::write(&c, source).expect("write the shim's source");
                let built = dir.join(format!("clock_shift-{}.so", std::process::id()));
                let status = Command::new("cc")
                    .args(["-shared", "-fPIC", "-O2", "-o"])
                    .arg(&built)
                    .arg(&c)
                    .arg("-ldl")
                    .status()
                    .expect("run cc (apt-get install gcc) to build the clock shim");
                assert!(status.success(), "cc failed to build the clock shim");
                std::fs::rename(&built, &library).expect("move the clock shim in place");
            }
            library
        })
        .clone()
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.thaw_quietly();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl RedisServer {
    /// A frozen process dies of SIGKILL too, but say SIGCONT first so that nothing lingers.
    fn thaw_quietly(&self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
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
    /// ports stay below 22768, bus ports below 32768: out of the range Linux hands to outgoing connections), joins them with `redis-cli --cluster create`, and waits
    /// until every node reports `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// When `redis-server` or `redis-cli` is missing, or the cluster does not form in 30 s.
    #[must_use]
    pub fn start() -> Self {
        // One cluster starts at a time in a process: two picking their ports at once
        // could pick the same.
        static STARTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one_at_a_time = STARTING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let ports = cluster_ports(6);
        let dir = std::env::temp_dir().join(format!(
            "rl-redis-cluster-{}-{}",
            std::process::id(),
            ports[0]
        ));
        let mut nodes = Vec::new();
        for &port in &ports {
            nodes.push(spawn_node(port, &dir));
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
        // A replica can take over only once it has synced with its master.
        for &port in &cluster.ports {
            loop {
                let info = command(port, "INFO replication\r\n");
                if info.contains("role:master") || info.contains("master_link_status:up") {
                    break;
                }
                assert!(Instant::now() < deadline, "a replica did not sync");
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

impl RedisCluster {
    /// Runs `cmd` on node `node` (0 to 5).
    ///
    /// # Errors
    ///
    /// The node's error reply, or a connection error.
    pub fn query<T: redis::FromRedisValue>(
        &self,
        node: usize,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        let url = format!("redis://127.0.0.1:{}", self.ports[node]);
        query_on(|| redis::Client::open(url.as_str()), cmd)
    }

    /// The node (index) and node ID of the master serving `slot`, as node `asking` sees
    /// it; `None` while no master that is not failing serves it.
    ///
    /// # Panics
    ///
    /// When `asking` does not answer.
    #[must_use]
    pub fn master_of(&self, slot: u16, asking: usize) -> Option<(usize, String)> {
        let nodes: String = self
            .query(asking, redis::cmd("CLUSTER").arg("NODES"))
            .expect("CLUSTER NODES");
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let serves = fields[8..].iter().any(|range| {
                let mut ends = range.split('-').map(|n| n.parse::<u16>().ok());
                match (ends.next().flatten(), ends.next()) {
                    (Some(start), None) => start == slot,
                    (Some(start), Some(Some(end))) => (start..=end).contains(&slot),
                    _ => false,
                }
            });
            if serves {
                let port: u16 = fields[1]
                    .split(['@', ':'])
                    .nth(1)
                    .and_then(|p| p.parse().ok())
                    .expect("a node's port");
                let index = self
                    .ports
                    .iter()
                    .position(|&p| p == port)
                    .expect("our node");
                return Some((index, fields[0].to_owned()));
            }
        }
        None
    }

    /// The node ID of node `node`.
    ///
    /// # Panics
    ///
    /// When the node does not answer.
    #[must_use]
    pub fn node_id(&self, node: usize) -> String {
        self.query(node, redis::cmd("CLUSTER").arg("MYID"))
            .expect("CLUSTER MYID")
    }

    /// Kills node `node` with SIGKILL.
    pub fn kill(&mut self, node: usize) {
        let _ = self.nodes[node].kill();
        let _ = self.nodes[node].wait();
    }

    /// Kills node `node` and starts it again on its port, with its cluster configuration
    /// (and no data); waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// When it does not answer within 10 s.
    pub fn restart(&mut self, node: usize) {
        self.kill(node);
        self.nodes[node] = spawn_node(self.ports[node], &self.dir);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ping(self.ports[node]) {
            assert!(Instant::now() < deadline, "node {node} did not come back");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Freezes node `node` (SIGSTOP): it holds its sockets and answers nothing.
    ///
    /// # Panics
    ///
    /// When `kill` cannot be run.
    pub fn freeze(&self, node: usize) {
        signal(&self.nodes[node], "-STOP");
    }

    /// Thaws node `node` after [`freeze`](Self::freeze) (SIGCONT).
    ///
    /// # Panics
    ///
    /// When `kill` cannot be run.
    pub fn thaw(&self, node: usize) {
        signal(&self.nodes[node], "-CONT");
    }

    /// Moves `slot`, with its keys, from master `from` to master `to`, the way
    /// `redis-cli --cluster reshard` does: IMPORTING / MIGRATING, `MIGRATE` in batches,
    /// then `SETSLOT NODE` on every master. Clients meanwhile get `ASK` and `MOVED`.
    ///
    /// # Panics
    ///
    /// When a step fails.
    pub fn migrate_slot(&self, slot: u16, from: usize, to: usize, pause_between: Duration) {
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        let setslot = |node: usize, how: &str, id: &str| {
            let _: () = self
                .query(
                    node,
                    redis::cmd("CLUSTER")
                        .arg("SETSLOT")
                        .arg(slot)
                        .arg(how)
                        .arg(id),
                )
                .unwrap_or_else(|e| panic!("SETSLOT {how} on node {node}: {e}"));
        };
        setslot(to, "IMPORTING", &from_id);
        setslot(from, "MIGRATING", &to_id);
        loop {
            let keys: Vec<String> = self
                .query(
                    from,
                    redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(10),
                )
                .expect("GETKEYSINSLOT");
            if keys.is_empty() {
                break;
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate
                .arg("127.0.0.1")
                .arg(self.ports[to])
                .arg("")
                .arg(0)
                .arg(5_000)
                .arg("KEYS")
                .arg(&keys);
            let _: redis::Value = self.query(from, &migrate).expect("MIGRATE");
            std::thread::sleep(pause_between);
        }
        // The new owner first, then the old, then everyone (as redis-cli does).
        setslot(to, "NODE", &to_id);
        setslot(from, "NODE", &to_id);
        for node in 0..self.ports.len() {
            if node != from && node != to {
                let _: redis::RedisResult<()> = self.query(
                    node,
                    redis::cmd("CLUSTER")
                        .arg("SETSLOT")
                        .arg(slot)
                        .arg("NODE")
                        .arg(&to_id),
                );
            }
        }
    }
}

fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} failed");
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            let _ = Command::new("kill")
                .args(["-CONT", &node.id().to_string()])
                .stderr(Stdio::null())
                .status();
        }
        for node in &mut self.nodes {
            let _ = node.kill();
            let _ = node.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts cluster node `port`, in a directory of its own under `dir` (where its
/// `nodes.conf` stays, so that a restarted node rejoins as itself).
fn spawn_node(port: u16, dir: &std::path::Path) -> Child {
    let node_dir = dir.join(port.to_string());
    std::fs::create_dir_all(&node_dir).expect("create a node's directory");
    Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "no", "--cluster-enabled", "yes"])
        .args(["--cluster-node-timeout", "2000"])
        // Replicas sync at once, and may take over whatever their data's age.
        .args(["--repl-diskless-sync-delay", "0"])
        .args(["--cluster-replica-validity-factor", "0", "--dir"])
        .arg(&node_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server (apt-get install redis-server)")
}

/// The calls of scripts and functions (`FCALL` + `EVALSHA` + `EVAL`) in an
/// `INFO commandstats` reply.
#[must_use]
pub fn script_calls(info: &str) -> u64 {
    ["fcall", "evalsha", "eval"]
        .iter()
        .map(|command| command_calls(info, command))
        .sum()
}

/// The calls of `command` (lower case: `fcall`) in an `INFO commandstats` reply.
#[must_use]
pub fn command_calls(info: &str, command: &str) -> u64 {
    let stat = format!("cmdstat_{command}:calls=");
    info.lines()
        .filter_map(|l| {
            l.strip_prefix(&stat)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Whether a server answers on `port` (`PONG`, or an error such as `NOAUTH`: it is up).
fn ping(port: u16) -> bool {
    let reply = command(port, "PING\r\n");
    reply.starts_with("+PONG") || reply.starts_with('-')
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

/// `count` consecutive ports below 22768 that are free, each with port + 10000 free too.
fn cluster_ports(count: u16) -> Vec<u16> {
    let seed = u16::try_from(std::process::id() % 2_000).unwrap_or(0);
    for attempt in 0..500u16 {
        // Ports and bus ports both below 32768, where Linux starts handing out ports to
        // outgoing connections: one of those took a node's port between this check and
        // the node's start ("cluster node 33368 did not start").
        let base = 10_000 + (seed * 7 + attempt * 31) % 12_700;
        let ports: Vec<u16> = (base..base + count).collect();
        let all_free = ports.iter().all(|&p| {
            TcpListener::bind(("127.0.0.1", p)).is_ok()
                && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok()
        });
        if all_free {
            return ports;
        }
    }
    panic!("no {count} free ports (with their cluster bus ports) below 32768")
}

/// A loopback port below 22768 that is free, and its cluster bus port (port + 10000) too:
/// for a one-node cluster.
///
/// # Panics
///
/// When there is none.
#[must_use]
pub fn free_cluster_port() -> u16 {
    cluster_ports(1)[0]
}

/// A loopback port nothing listens on now (the OS picks it).
///
/// # Panics
///
/// When the OS has none to give.
#[must_use]
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Runs `cmd` on a connection of its own from `client`. A signal meant for another test's
/// child (a server stopped or continued) interrupts the connect's `poll` or a read with a
/// timeout, which the kernel never restarts (`EINTR`): the command is sent again, a few times
/// (the tests' commands may be sent twice).
fn query_on<T: redis::FromRedisValue>(
    client: impl Fn() -> redis::RedisResult<redis::Client>,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    let mut tries = 0;
    loop {
        let result = client().and_then(|client| {
            let mut connection = client.get_connection_with_timeout(Duration::from_secs(2))?;
            cmd.query(&mut connection)
        });
        match result {
            Err(error)
                if tries < 5
                    && error.is_io_error()
                    && error.to_string().contains("(os error 4)") =>
            {
                tries += 1;
            }
            result => return result,
        }
    }
}
