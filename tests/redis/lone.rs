//! A batch decides as its checks would alone: raw calls of the library's batch function (keys
//! named once, checks as one string of u32, as `batch_command` sends them) against the same
//! checks sent one by one to each algorithm's own function, reply for reply and state for
//! state; and batches through the store against `ratewarden-core`, over key names that differ
//! only in a NUL or a brace.

use std::time::Duration;

use ratewarden_core::{Key, Quota, Store};
use tests::redis_server::RedisServer;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
}

/// The library's name (`ratewarden_<hash>`), once a check has loaded it.
pub(crate) async fn library(server: &RedisServer) -> String {
    let store = crate::store(server, "lone-load").await;
    store
        .check(&Key::from("load"), &Quota::per_second(1).unwrap(), 1)
        .await
        .unwrap();
    for _ in 0..100 {
        let list = format!(
            "{:?}",
            server
                .query::<redis::Value>(redis::cmd("FUNCTION").arg("LIST"))
                .unwrap()
        );
        if let Some(start) = list.find("ratewarden_") {
            return list[start..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no library");
}

/// A shape: algorithm letter, number of keys, its arguments (ARGV[2], the cost, left empty).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Shape {
    pub letter: &'static str,
    pub nkeys: usize,
    pub args: Vec<String>,
}

/// One check: its shape (index in the batch's shapes), its cost, its key names.
#[derive(Clone, Debug)]
pub(crate) struct Check {
    pub shape: usize,
    pub cost: u32,
    pub keys: Vec<Vec<u8>>,
}

/// The batch call as `batch_command` makes it.
pub(crate) fn batch_cmd(lib: &str, shapes: &[Shape], checks: &[Check]) -> redis::Cmd {
    let mut names: Vec<Vec<u8>> = Vec::new();
    let mut numbers: Vec<u32> = Vec::new();
    for check in checks {
        numbers.push(u32::try_from(check.shape + 1).unwrap());
        numbers.push(check.cost);
        for key in &check.keys {
            let place = match names.iter().position(|n| n == key) {
                Some(p) => p + 1,
                None => {
                    names.push(key.clone());
                    names.len()
                }
            };
            numbers.push(u32::try_from(place).unwrap());
        }
    }
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(format!("{lib}_batch")).arg(names.len());
    for n in &names {
        cmd.arg(n.as_slice());
    }
    cmd.arg(shapes.len());
    for s in shapes {
        cmd.arg(s.letter).arg(s.nkeys).arg(&encoded(&s.args, 0));
    }
    let bytes: Vec<u8> = numbers.iter().flat_map(|n| n.to_le_bytes()).collect();
    cmd.arg(bytes);
    cmd
}

/// The check alone, by its algorithm's function.
pub(crate) fn lone_cmd(lib: &str, shape: &Shape, cost: u32, keys: &[Vec<u8>]) -> redis::Cmd {
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(format!("{lib}_{}", shape.letter)).arg(keys.len());
    for k in keys {
        cmd.arg(k.as_slice());
    }
    cmd.arg(&encoded(&shape.args, cost));
    cmd
}

/// A check's arguments (`lua/prelude.lua`'s ARGV, with `cost`) as a call sends them
/// (`lua/args.lua`): the mode, the missing-state letter, the numbers as little-endian doubles
/// (an empty time as -1).
pub(crate) fn encoded(args: &[String], cost: u32) -> [Vec<u8>; 3] {
    let numbers = (args.iter().enumerate())
        .filter(|&(i, _)| i != 0 && i != 5)
        .flat_map(|(i, arg)| {
            let number = match (i, arg.as_str()) {
                (1, _) => f64::from(cost),
                (_, "") => -1.0,
                (_, number) => number.parse::<u64>().unwrap() as f64,
            };
            number.to_le_bytes()
        })
        .collect();
    [
        args[0].clone().into_bytes(),
        args[5].clone().into_bytes(),
        numbers,
    ]
}

/// 5 doubles per check.
pub(crate) fn decode(bytes: &[u8]) -> Vec<[f64; 5]> {
    bytes
        .chunks_exact(40)
        .map(|c| {
            let mut r = [0.0; 5];
            for (i, d) in c.chunks_exact(8).enumerate() {
                r[i] = f64::from_le_bytes(d.try_into().unwrap());
            }
            r
        })
        .collect()
}

fn state(con: &mut redis::Connection, key: &[u8]) -> (Option<Vec<u8>>, i64) {
    let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(key).query(con).unwrap();
    let pttl: i64 = redis::cmd("PTTL").arg(key).query(con).unwrap();
    (dump, pttl)
}

fn prefixed(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    let mut v = prefix.to_vec();
    v.extend_from_slice(name);
    v
}

/// A random shape. `now` is the check's test time, or None for the server's clock.
fn random_shape(rng: &mut Rng, now: Option<u64>, marker: bool) -> Shape {
    let letters = ["g", "t", "f", "w", "l"];
    let letter = if rng.chance(3) {
        letters[usize::try_from(rng.below(5)).unwrap()]
    } else {
        "g"
    };
    let mode = match rng.below(12) {
        0 => "p",
        1 => "l",
        2 if marker && now.is_some() => "h",
        3 if letter == "g" || letter == "t" => "i",
        _ => "c",
    };
    let interval = if now.is_none() && letter == "g" {
        [1_000_000u64, 100_000_000, 3_600_000_000][usize::try_from(rng.below(3)).unwrap()]
    } else if now.is_none() {
        [100_000_000u64, 3_600_000_000][usize::try_from(rng.below(2)).unwrap()]
    } else {
        [
            1_000u64,
            100_000,
            1_000_000,
            3_600_000_000,
            1_000_000_000_000_000,
        ][usize::try_from(rng.below(5)).unwrap()]
    };
    let limit = 1 + rng.below(6);
    let missing = if rng.chance(6) { "e" } else { "" };
    let keep = if rng.chance(4) {
        (rng.below(5_000) * 1000).to_string()
    } else {
        "0".into()
    };
    let slack = if marker {
        (rng.below(3) * 1_000_000).to_string()
    } else {
        "0".into()
    };
    let mut args = vec![
        mode.to_string(),
        String::new(),
        now.map_or(String::new(), |n| n.to_string()),
        interval.to_string(),
        limit.to_string(),
        missing.to_string(),
        keep,
        slack,
    ];
    match mode {
        "l" => args.push((1 + rng.below(8)).to_string()),
        "h" => {
            args.push((2 + rng.below(4)).to_string());
            args.push((rng.below(3) * 1_000_000).to_string());
            args.push((rng.below(2) * 500_000).to_string());
        }
        "i" => {
            args.push(rng.below(5).to_string());
            args.push(now.unwrap_or(1_700_000_000_000_000).to_string());
        }
        _ => {}
    }
    Shape {
        letter,
        nkeys: if marker { 2 } else { 1 },
        args,
    }
}

fn corrupt(rng: &mut Rng, con: &mut redis::Connection, key: &[u8], now: u64) {
    let values: [String; 10] = [
        "garbage".into(),
        "nan".into(),
        "-1".into(),
        "9007199254740993".into(),
        "1e300".into(),
        "inf".into(),
        "1.5".into(),
        (now + 1_000_000_000_000).to_string(),
        (now.saturating_sub(5_000_000)).to_string(),
        " 12".into(),
    ];
    match rng.below(12) {
        10 => {
            let _: () = redis::cmd("DEL").arg(key).query(con).unwrap();
            let _: () = redis::cmd("HSET")
                .arg(key)
                .arg("u")
                .arg("x")
                .query(con)
                .unwrap();
        }
        11 => {
            let _: () = redis::cmd("DEL").arg(key).query(con).unwrap();
            let _: () = redis::cmd("RPUSH").arg(key).arg("zz").query(con).unwrap();
        }
        i => {
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg(&values[usize::try_from(i).unwrap()])
                .query(con)
                .unwrap();
        }
    }
}

/// Random raw batches over a few key names (some with NUL, `{`, `}` bytes), with any shape on
/// any key (test time, stepping back now and then), some states corrupted between batches: the
/// replies, and every key's value after each batch, equal those of the same checks sent alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_batches_decide_and_store_as_the_same_checks_alone() {
    raw_differential().await;
}

async fn raw_differential() {
    let server = RedisServer::start();
    let lib = library(&server).await;
    let client = server.client().unwrap();
    let mut con = client.get_connection().unwrap();
    let all: [&[u8]; 4] = [b"k", b"k\0", b"{k}\0x", b"k}{"];
    let names = &all[..];
    let max_size: u64 = 24;
    let rounds: u32 = 300;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut now: u64 = 1_700_000_000_000_000;
    let mut mismatches = Vec::new();
    let (mut ok_batches, mut outcomes) = (0, [0u32; 4]);
    for round in 0..rounds {
        let size = 2 + usize::try_from(rng.below(max_size)).unwrap();
        let mut shapes: Vec<Shape> = Vec::new();
        let mut checks = Vec::new();
        for _ in 0..size {
            now += [0, 0, 1_000, 100_000, 1_000_000][usize::try_from(rng.below(5)).unwrap()];
            if rng.chance(15) {
                now -= rng.below(3_000_000);
            }
            let marker = rng.chance(6);
            // Reuse an earlier shape now and then (several checks of one shape).
            let shape = if !shapes.is_empty() && rng.chance(2) {
                usize::try_from(rng.below(shapes.len() as u64)).unwrap()
            } else {
                let s = random_shape(&mut rng, Some(now), marker);
                match shapes.iter().position(|x| *x == s) {
                    Some(i) => i,
                    None => {
                        shapes.push(s);
                        shapes.len() - 1
                    }
                }
            };
            let name = names[usize::try_from(rng.below(names.len() as u64)).unwrap()].to_vec();
            let mut keys = vec![name.clone()];
            if shapes[shape].nkeys == 2 {
                let mut m = name.clone();
                m.extend_from_slice(b":m");
                keys.push(m);
            }
            let limit: u32 = shapes[shape].args[4].parse().unwrap();
            let cost = match rng.below(12) {
                0 => 0,
                1 => u32::MAX,
                2 => limit + 1,
                3 => limit,
                _ => 1,
            };
            checks.push(Check { shape, cost, keys });
        }
        if rng.chance(4) {
            let name = names[usize::try_from(rng.below(names.len() as u64)).unwrap()];
            let seed = rng.next();
            for prefix in [&b"b:"[..], b"l:"] {
                let mut r = Rng(seed | 1);
                corrupt(&mut r, &mut con, &prefixed(prefix, name), now);
            }
        }
        let batch_checks: Vec<Check> = checks
            .iter()
            .map(|c| Check {
                keys: c.keys.iter().map(|k| prefixed(b"b:", k)).collect(),
                ..c.clone()
            })
            .collect();
        let batch: redis::RedisResult<Vec<u8>> =
            batch_cmd(&lib, &shapes, &batch_checks).query(&mut con);
        let mut lone = Vec::new();
        let mut lone_err = None;
        for c in &checks {
            let keys: Vec<Vec<u8>> = c.keys.iter().map(|k| prefixed(b"l:", k)).collect();
            match lone_cmd(&lib, &shapes[c.shape], c.cost, &keys).query::<Vec<u8>>(&mut con) {
                Ok(r) => lone.extend(decode(&r)),
                Err(e) => {
                    lone_err = Some(e.to_string());
                    break;
                }
            }
        }
        let mut decided_alike = false;
        match batch {
            Ok(bytes) => {
                let got = decode(&bytes);
                ok_batches += 1;
                for r in &got {
                    outcomes[(r[0] as usize).min(3)] += 1;
                }
                let same = got == lone;
                decided_alike = same;
                if lone_err.is_some() || !same {
                    mismatches.push(format!(
                        "round {round}: batch {got:?}\n lone {lone:?} {lone_err:?}\n shapes {shapes:?}\n checks {checks:?}"
                    ));
                }
            }
            Err(e) => {
                if lone_err.is_none() {
                    mismatches.push(format!(
                        "round {round}: batch error {e}, lone fine {shapes:?} {checks:?}"
                    ));
                }
            }
        }
        for &name in names {
            for suffix in [&b""[..], b":m"] {
                let n = prefixed(name, suffix);
                let (b, bt) = state(&mut con, &prefixed(b"b:", &n));
                let (l, lt) = state(&mut con, &prefixed(b"l:", &n));
                // (TTLs read a moment apart.)
                if decided_alike && (b != l || (bt - lt).abs() > 200 || (bt < 0) != (lt < 0)) {
                    mismatches.push(format!(
                        "round {round}: key {:?} state batch {b:?} ttl {bt} lone {l:?} ttl {lt}\n shapes {shapes:?}\n checks {checks:?}",
                        String::from_utf8_lossy(&n)
                    ));
                }
            }
        }
        if mismatches.len() > 3 {
            break;
        }
    }
    // Batches decided, and every outcome seen (admitted, denied, above the burst, split).
    assert!(
        ok_batches > rounds / 2,
        "{ok_batches} of {rounds} batches decided"
    );
    assert!(outcomes.iter().all(|&n| n > 0), "{outcomes:?}");
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n\n"));
}

mod store_level {
    use ratewarden_core::{Algorithm, Key, Quota, Timestamp};
    use tests::redis_server::RedisServer;

    use super::Rng;
    use crate::differential::AnyState;

    /// Batches of up to 128 checks over many keys whose names differ in NUL, `{`, `}` bytes,
    /// and long (digested) ones, 2 quotas each, GCRA mostly: every check as ratewarden-core.
    async fn many_keys(server: &RedisServer) {
        let store = crate::store(server, "lone").await;
        let mut rng = Rng(42);
        let mut names: Vec<Key> = Vec::new();
        for i in 0..40u8 {
            names.push(Key::from_bytes([b'k', i]));
            names.push(Key::from_bytes([b'k', i, 0]));
            names.push(Key::from_bytes([b'{', i, b'}']));
        }
        names.push(Key::from_bytes([0u8; 3]));
        names.push(Key::from_bytes(vec![b'x'; 200]));
        names.push(Key::from_bytes(vec![b'y'; 200]));
        names.push(Key::from(7u64));
        names.push(Key::from("7"));
        let quotas = [
            Quota::per_second(3).unwrap(),
            Quota::per_hour(5).unwrap().with_burst(2).unwrap(),
            Quota::per_second(10)
                .unwrap()
                .with_algorithm(Algorithm::TokenBucket)
                .unwrap(),
            Quota::per_minute(4)
                .unwrap()
                .with_algorithm(Algorithm::FixedWindow)
                .unwrap(),
        ];
        let mut states: std::collections::HashMap<(usize, usize), AnyState> = Default::default();
        let mut now: u64 = 1_700_000_000_000_000;
        for round in 0..60 {
            let size = if round % 3 == 0 {
                128
            } else {
                2 + usize::try_from(rng.below(127)).unwrap()
            };
            let hot = usize::try_from(rng.below(names.len() as u64)).unwrap();
            let mut checks = Vec::new();
            let mut expected = Vec::new();
            for _ in 0..size {
                let k = if rng.chance(2) {
                    hot
                } else {
                    usize::try_from(rng.below(names.len() as u64)).unwrap()
                };
                let span = if rng.chance(4) { 4 } else { 2 };
                let q = usize::try_from(rng.below(span)).unwrap();
                now += [0, 0, 10_000, 300_000, 2_000_000][usize::try_from(rng.below(5)).unwrap()];
                if rng.chance(30) {
                    now -= rng.below(5_000_000);
                }
                let cost = match rng.below(10) {
                    0 => 0,
                    1 => u32::MAX,
                    2 => quotas[q].burst() + 1,
                    3 => quotas[q].burst(),
                    _ => 1,
                };
                let st = states
                    .entry((k, q))
                    .or_insert_with(|| AnyState::new(&quotas[q]));
                expected.push(st.check(now, cost, &quotas[q]));
                checks.push((
                    names[k].clone(),
                    quotas[q],
                    cost,
                    Timestamp::from_micros(now),
                ));
            }
            let actual = store.check_batch_at(&checks).await.unwrap();
            assert_eq!(actual.len(), expected.len());
            for (n, (a, e)) in actual.iter().zip(&expected).enumerate() {
                assert_eq!(a, e, "round {round} check {n}: {:?}", checks[n]);
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batches_over_keys_that_differ_in_a_nul_or_a_brace_decide_as_ratewarden_core_by_functions()
     {
        let server = RedisServer::start();
        many_keys(&server).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batches_over_keys_that_differ_in_a_nul_or_a_brace_decide_as_ratewarden_core_by_scripts()
     {
        let server = RedisServer::start_without_functions();
        many_keys(&server).await;
    }
}

/// A full batch (128 checks of one unit of work each) of 2 keys each (a split marker), over
/// 128 distinct names and over one: replies and states equal the lone calls'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_batch_of_checks_with_split_markers_decides_as_the_same_checks_alone() {
    let server = RedisServer::start();
    let lib = library(&server).await;
    let client = server.client().unwrap();
    let mut con = client.get_connection().unwrap();
    for distinct in [128usize, 1, 7] {
        let shapes = vec![
            Shape {
                letter: "g",
                nkeys: 2,
                args: [
                    "c",
                    "",
                    "1700000000000000",
                    "1000000",
                    "5",
                    "",
                    "0",
                    "1000000",
                ]
                .map(String::from)
                .to_vec(),
            },
            Shape {
                letter: "g",
                nkeys: 1,
                args: ["c", "", "1700000000000000", "1000000", "5", "", "0", "0"]
                    .map(String::from)
                    .to_vec(),
            },
        ];
        let check = |i: usize, prefix: &str| {
            let name = format!("{prefix}{{n{}}}\0", i % distinct).into_bytes();
            let mut m = name.clone();
            m.extend_from_slice(b":m");
            if i % 3 == 2 {
                Check {
                    shape: 1,
                    cost: 1,
                    keys: vec![name],
                }
            } else {
                Check {
                    shape: 0,
                    cost: 1,
                    keys: vec![name, m],
                }
            }
        };
        let prefix_b = format!("b{distinct}:");
        let prefix_l = format!("l{distinct}:");
        let batch: Vec<Check> = (0..128).map(|i| check(i, &prefix_b)).collect();
        let got: Vec<u8> = batch_cmd(&lib, &shapes, &batch).query(&mut con).unwrap();
        let got = decode(&got);
        let mut lone = Vec::new();
        for i in 0..128 {
            let c = check(i, &prefix_l);
            let r: Vec<u8> = lone_cmd(&lib, &shapes[c.shape], c.cost, &c.keys)
                .query(&mut con)
                .unwrap();
            lone.extend(decode(&r));
        }
        assert_eq!(got, lone, "{distinct} distinct");
        for i in 0..distinct {
            let b = state(&mut con, format!("{prefix_b}{{n{i}}}\0").as_bytes());
            let l = state(&mut con, format!("{prefix_l}{{n{i}}}\0").as_bytes());
            assert_eq!(b.0, l.0);
        }
    }
}
