//! Four gateway processes on loopback, one key sprayed uniformly over them for a minute, in
//! each mode at once: admitted within the mode's bound, and the bytes a gateway sends a round
//! within the formula [`Sent`] states.
//!
//! The test starts copies of its own binary, each running the ignored test `gateway` with
//! its part in the environment, and stops them whatever happens.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ratewarden_core::{Key, Quota, Store};
use ratewarden_mesh::{MeshStore, Mode};

const SECRET: &str = "a secret the test's gateways share";
const GATEWAYS: usize = 4;
/// How long each gateway sprays (the `MESH_SOAK_SECS` environment variable, 60 by default).
fn seconds() -> u64 {
    std::env::var("MESH_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60)
}
const QUOTA: &str = "120/min";
/// Requests a second each gateway makes: 20 a second across the four, ten times the rate.
const PER_GATEWAY: u64 = 5;
const INTERVAL: Duration = Duration::from_millis(100);

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .try_into()
        .unwrap()
}

/// Kills the children it holds when dropped.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One gateway's report: `admitted requested start_ms end_ms rounds bytes`.
#[derive(Debug)]
struct Report {
    admitted: u64,
    requested: u64,
    start: u64,
    end: u64,
    rounds: u64,
    bytes: u64,
}

fn start(mode: &str) -> Children {
    let sockets: Vec<UdpSocket> = (0..GATEWAYS)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs: Vec<SocketAddr> = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
    drop(sockets);
    let seeds = addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    // Every gateway starts spraying at the same moment, once all have had time to bind.
    let at = unix_ms() + 2_000;
    let mut children = Children(Vec::new());
    for addr in &addrs {
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "gateway",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("GATEWAY_MODE", mode)
            .env("GATEWAY_ADDR", addr.to_string())
            .env("GATEWAY_SEEDS", &seeds)
            .env("GATEWAY_AT", at.to_string())
            .env("GATEWAY_SECS", seconds().to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        children.0.push(child);
    }
    children
}

fn reports(children: &mut Children) -> Vec<Report> {
    let mut out = Vec::new();
    for child in &mut children.0 {
        let stdout = child.stdout.take().unwrap();
        // The harness prints the test's name on the same line, before the report.
        let line = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
            .into_iter()
            .find_map(|l| Some(l.split_once("gateway report ")?.1.to_owned()))
            .unwrap_or_else(|| panic!("a gateway ended without its report"));
        let n: Vec<u64> = line
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect();
        out.push(Report {
            admitted: n[0],
            requested: n[1],
            start: n[2],
            end: n[3],
            rounds: n[4],
            bytes: n[5],
        });
        assert!(child.wait().unwrap().success());
    }
    out
}

/// The bytes [`ratewarden_mesh::Sent`] says a gateway sends a round at most, one key changing
/// on every gateway: `min(fanout, n − 1) × (93 + 2n × entry) + (n − 1) × (93 + transfer +
/// acknowledgement)`.
fn bytes_bound(key: &str) -> u64 {
    let n = GATEWAYS as u64;
    let slot = 25 + 2 + key.len() as u64;
    let (entry, transfer, ack) = (slot + 48, slot + 32, slot + 24);
    3.min(n - 1) * (93 + 2 * n * entry) + (n - 1) * (93 + transfer + ack)
}

#[test]
fn four_gateway_processes_share_one_key_within_each_modes_bound() {
    let mut escrow = start("escrow");
    let mut eventual = start("eventual");
    let quota: Quota = QUOTA.parse().unwrap();
    let rate = f64::from(quota.count()) / (quota.period_micros() as f64 / 1e6);
    for (mode, children) in [("escrow", &mut escrow), ("eventual", &mut eventual)] {
        let reports = reports(children);
        let admitted: u64 = reports.iter().map(|r| r.admitted).sum();
        let requested: u64 = reports.iter().map(|r| r.requested).sum();
        let span = reports.iter().map(|r| r.end).max().unwrap()
            - reports.iter().map(|r| r.start).min().unwrap();
        // Burst plus the rate over the span: what one exact limiter admits at most.
        let exact = f64::from(quota.burst()) + rate * span as f64 / 1e3;
        // Eventual: plus the requests of `D`, taken as ten rounds (generous on loopback).
        let over = match mode {
            "escrow" => 0.0,
            _ => (GATEWAYS as u64 * PER_GATEWAY) as f64 * 10.0 * INTERVAL.as_secs_f64(),
        };
        let per_round = reports
            .iter()
            .map(|r| r.bytes / r.rounds.max(1))
            .max()
            .unwrap();
        println!(
            "{mode}: {admitted} of {requested} admitted in {span} ms, exact limiter {exact:.0}, bound {:.0}; up to {per_round} bytes a gateway a round (stated bound {})",
            exact + over,
            bytes_bound("sprayed")
        );
        assert!(
            admitted as f64 <= exact.floor() + over,
            "{mode}: {admitted} admitted, bound {}",
            exact + over
        );
        assert!(
            admitted as f64 >= 0.9 * exact.min(requested as f64),
            "{mode}: {admitted} admitted of an exact limiter's {exact:.0}"
        );
        assert!(
            per_round <= bytes_bound("sprayed"),
            "{mode}: {per_round} bytes a round"
        );
    }
}

/// One gateway: its part comes from the environment; without it, nothing to do.
#[tokio::test]
#[ignore = "a gateway process the test above starts"]
async fn gateway() {
    let Ok(mode) = std::env::var("GATEWAY_MODE") else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap();
    let addr: SocketAddr = var("GATEWAY_ADDR").parse().unwrap();
    let peers: Vec<SocketAddr> = var("GATEWAY_SEEDS")
        .split(',')
        .map(|s| s.parse().unwrap())
        .filter(|&a| a != addr)
        .collect();
    let at: u64 = var("GATEWAY_AT").parse().unwrap();
    let secs: u64 = var("GATEWAY_SECS").parse().unwrap();
    let store = MeshStore::builder(addr)
        .peers(peers)
        .mode(if mode == "escrow" {
            Mode::Escrow
        } else {
            Mode::Eventual
        })
        .interval(INTERVAL)
        .secret(SECRET.as_bytes())
        .unwrap()
        .bind()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(at.saturating_sub(unix_ms()))).await;
    let quota: Quota = QUOTA.parse().unwrap();
    let key = Key::from("sprayed");
    let (mut admitted, mut requested) = (0, 0);
    let start_ms = unix_ms();
    let start = Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_millis(1_000 / PER_GATEWAY));
    while start.elapsed() < Duration::from_secs(secs) {
        ticks.tick().await;
        requested += 1;
        admitted += u64::from(store.check(&key, &quota, 1).await.unwrap().is_allowed());
    }
    let end_ms = unix_ms();
    let sent = store.sent();
    println!(
        "gateway report {admitted} {requested} {start_ms} {end_ms} {} {}",
        sent.rounds, sent.bytes
    );
}
