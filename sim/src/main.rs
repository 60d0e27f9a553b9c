//! Runs the mesh's grids and prints their tables (BENCHMARKS.md).
//!
//! `cargo run --release -p ratewarden-sim [TRACES] [TABLE] [MODE]`: 1,000 runs a cell by
//! default, every table unless one of `claims`, `bytes`, `rounds`, `grids`, `windows`,
//! `held`, `convergence` or `regions` is named; the grids and the windows in both modes
//! unless `escrow` or `eventual` is.

use ratewarden_core::{Algorithm, Key, Quota, Timestamp};
use ratewarden_mesh::{Config, Mode, Node};
use ratewarden_sim::{
    Cell, Network, Scenario, cell, convergence, eventual_bound, held, moved, quota, regions, run,
    trickle,
};

fn main() {
    let mut args = std::env::args().skip(1);
    let traces = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000);
    let only = args.next();
    let modes: Vec<Mode> = match args.next().as_deref() {
        Some("escrow") => vec![Mode::Escrow],
        Some("eventual") => vec![Mode::Eventual],
        _ => vec![Mode::Escrow, Mode::Eventual],
    };
    let wanted = |table: &str| only.as_deref().is_none_or(|only| only == table);
    if wanted("claims") {
        claims(traces.min(100));
    }
    if wanted("bytes") {
        bytes_by_keys();
    }
    if wanted("rounds") {
        round_time_by_slots();
    }
    if wanted("grids") {
        grids(traces, &modes);
    }
    if wanted("windows") {
        windows(traces, &modes);
    }
    if wanted("held") {
        held_demand(traces.min(20));
    }
    if wanted("convergence") {
        converging(traces);
    }
    if wanted("regions") {
        partitioned_regions();
    }
}

fn grids(traces: usize, modes: &[Mode]) {
    for &mode in modes {
        println!("\n{mode:?}, quota 100/min (burst 100), 20 s runs, {traces} runs a cell\n");
        println!(
            "| N | interval | loss | worst excess | mean excess | runs over bound | longest delay D | admitted / exact limiter | worst shortfall | bytes a gateway a round |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for n in [3, 10, 32] {
            for interval in [50_000, 100_000, 500_000] {
                for loss in [0.0, 0.05] {
                    let s = cell(Cell {
                        mode,
                        algorithm: Algorithm::Gcra,
                        n,
                        interval,
                        loss,
                        traces,
                        seed: 1,
                    });
                    println!(
                        "| {n} | {} ms | {:.0}% | {:.2} | {:.2} | {} | {} ms | {:.3} | {} | {:.0} |",
                        interval / 1_000,
                        loss * 100.0,
                        s.worst_excess,
                        s.mean_excess,
                        s.over_bound,
                        s.worst_delay / 1_000,
                        s.admitted as f64 / s.ideal.max(1) as f64,
                        s.worst_shortfall,
                        s.bytes_per_round,
                    );
                }
            }
        }
    }
}

fn windows(traces: usize, modes: &[Mode]) {
    println!(
        "\nThe window algorithms, quota 100 per 10 s, 20 s runs, gossip every 100 ms, clocks in step, {traces} runs a cell\n"
    );
    println!(
        "| algorithm | mode | N | loss | worst excess | mean excess | runs over bound | longest delay D | admitted / exact limiter |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        for &mode in modes {
            for n in [3, 10, 32] {
                for loss in [0.0, 0.05] {
                    let s = cell(Cell {
                        mode,
                        algorithm,
                        n,
                        interval: 100_000,
                        loss,
                        traces,
                        seed: 1,
                    });
                    println!(
                        "| {} | {mode:?} | {n} | {:.0}% | {:.2} | {:.2} | {} | {} ms | {:.3} |",
                        algorithm.as_str(),
                        loss * 100.0,
                        s.worst_excess,
                        s.mean_excess,
                        s.over_bound,
                        s.worst_delay / 1_000,
                        s.admitted as f64 / s.ideal.max(1) as f64,
                    );
                }
            }
        }
    }
}

fn held_demand(traces: usize) {
    println!(
        "\nEscrow: demand held on some gateways for 2 min (at 1.2, 2 and 5x the rate), or moving after 1 min (2x), admitted / exact limiter, 5% loss, {traces} runs a cell (worst, mean)\n"
    );
    println!(
        "| N | interval | held on 1 | held on 3 | held on N/2 | 1 to another | 1 to N/2 others | N/2 to 1 other |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in [3_usize, 10, 32] {
        let half = n / 2;
        for interval in [50_000, 100_000, 500_000] {
            let measure = |scenario: &dyn Fn(u64, f64) -> Scenario, loads: &[f64]| {
                let mut used = Vec::new();
                for &load in loads {
                    for seed in 0..traces as u64 {
                        let r = run(&scenario(seed, load));
                        assert!(r.excess == 0.0, "escrow over the quota: {r:?}");
                        used.push(r.admitted as f64 / r.ideal.max(1) as f64);
                    }
                }
                let worst = used.iter().copied().fold(f64::INFINITY, f64::min);
                let mean = used.iter().sum::<f64>() / used.len().max(1) as f64;
                format!("{worst:.3}, {mean:.3}")
            };
            let loads = [1.2, 2.0, 5.0];
            let cells = [
                measure(&|seed, load| held(n, 1, load, interval, 0.05, seed), &loads),
                measure(
                    &|seed, load| held(n, 3.min(n), load, interval, 0.05, seed),
                    &loads,
                ),
                measure(
                    &|seed, load| held(n, half, load, interval, 0.05, seed),
                    &loads,
                ),
                measure(
                    &|seed, load| moved(n, 0..1, 1..2, load, interval, 0.05, seed),
                    &[2.0],
                ),
                measure(
                    &|seed, load| moved(n, 0..1, 1..half + 1, load, interval, 0.05, seed),
                    &[2.0],
                ),
                measure(
                    &|seed, load| moved(n, 0..half, n - 1..n, load, interval, 0.05, seed),
                    &[2.0],
                ),
            ];
            println!("| {n} | {} ms | {} |", interval / 1_000, cells.join(" | "));
        }
    }
}

fn converging(traces: usize) {
    println!(
        "\nEventual: rounds after a burst of 50 on one gateway until every view is within 1 unit ({traces} runs)\n"
    );
    println!("| N | interval | loss | p50 | p99 | max | ceil(log2 N) + 2 |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for n in [3_usize, 10, 32] {
        for interval in [50_000, 100_000, 500_000] {
            for loss in [0.0, 0.05] {
                let mut rounds: Vec<u64> = convergence(n, interval, loss, traces, 1)
                    .into_iter()
                    .map(|r| r.unwrap_or(u64::MAX))
                    .collect();
                rounds.sort_unstable();
                let at = |q: f64| rounds[((rounds.len() as f64 - 1.0) * q) as usize];
                println!(
                    "| {n} | {} ms | {:.0}% | {} | {} | {} | {} |",
                    interval / 1_000,
                    loss * 100.0,
                    at(0.5),
                    at(0.99),
                    at(1.0),
                    u64::from(usize::BITS - (n - 1).leading_zeros()) + 2
                );
            }
        }
    }
}

fn partitioned_regions() {
    let quota: Quota = quota();
    let rate = f64::from(quota.count()) / quota.period_micros() as f64;
    println!(
        "\nRegions: 3 x 4 gateways, 80 ms apart, region 3 cut off from 10 s to 40 s of 60 s, load 2x the rate, gossip 100 ms\n"
    );
    println!(
        "| mode | seed | admitted | exact limiter | excess | stated bound | counted everywhere after the heal |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (mode, region_rounds, name) in [
        (Mode::Escrow, Some(10), "Escrow"),
        (Mode::Escrow, None, "Escrow, fixed split"),
        (Mode::Eventual, Some(10), "Eventual"),
    ] {
        for seed in 0..5 {
            let r = run(&Scenario {
                region_rounds,
                ..regions(mode, 100_000, 2.0, seed)
            });
            let bound = match mode {
                Mode::Escrow => 0.0,
                Mode::Eventual => {
                    f64::from(quota.burst())
                        + rate * 30_000_000.0
                        + eventual_bound(&quota, 8, &r)
                        + eventual_bound(&quota, 4, &r)
                }
            };
            let lag = if mode == Mode::Eventual {
                format!("{} ms", r.heal_lag / 1_000)
            } else {
                "-".into()
            };
            println!(
                "| {name} | {seed} | {} | {} | {:.2} | {:.2} | {lag} |",
                r.admitted, r.ideal, r.excess, bound
            );
        }
    }
    println!(
        "\nThe same regions, no partition, demand at twice the rate on region 1's gateways only\n"
    );
    println!("| mode | seed | admitted | exact limiter | admitted / exact limiter |");
    println!("|---|---:|---:|---:|---:|");
    for (region_rounds, name) in [
        (Some(10), "Escrow, shares across regions every 10 rounds"),
        (None, "Escrow, fixed split"),
    ] {
        for seed in 0..5 {
            let mut s = Scenario {
                region_rounds,
                ..regions(Mode::Escrow, 100_000, 6.0, seed)
            };
            s.requests.retain(|&(_, gateway)| gateway < 4);
            s.network.partitions.clear();
            s.heal = None;
            let r = run(&s);
            println!(
                "| {name} | {seed} | {} | {} | {:.2} |",
                r.admitted,
                r.ideal,
                r.admitted as f64 / r.ideal as f64
            );
        }
    }
}

/// The design document's claims, on the same traces: 10 gateways, gossip every 100 ms, 100 a
/// minute; a steady trickle at twice the rate for three minutes, and a burst of three times the quota's burst
/// sprayed over every gateway at one instant. Beside the mesh: limits kept by each gateway
/// alone, and two regional Redis servers replicating each other's counts asynchronously
/// (modelled as two eventual stores whose replication takes 1 s), joined and partitioned.
fn claims(traces: usize) {
    let quota = quota();
    let rate = f64::from(quota.count()) * 1e6 / quota.period_micros() as f64;
    let duration = 180_000_000;
    let trickle =
        |n: usize, seed: u64| trickle(&mut fastrand::Rng::with_seed(seed), n, 2.0 * rate, duration);
    let burst = |n: usize, _: u64| {
        (0..3 * quota.burst() as usize)
            .map(|i| (1_000_000, i % n))
            .collect::<Vec<_>>()
    };
    let lagging = |n: usize, lag: u64, loss: f64| Network {
        jitter: lag / 10,
        ..Network::flat(n, lag, loss)
    };
    type Trace<'a> = &'a dyn Fn(usize, u64) -> Vec<(u64, usize)>;
    let designs: [(&str, Mode, usize, u64, Network); 5] = [
        (
            "each gateway alone",
            Mode::Eventual,
            10,
            100_000,
            Network::flat(10, 1_000, 1.0),
        ),
        (
            "mesh, eventual",
            Mode::Eventual,
            10,
            100_000,
            Network::flat(10, 1_000, 0.0),
        ),
        (
            "mesh, escrow",
            Mode::Escrow,
            10,
            100_000,
            Network::flat(10, 1_000, 0.0),
        ),
        (
            "2 regional Redis, replication 1 s",
            Mode::Eventual,
            2,
            10_000,
            lagging(2, 1_000_000, 0.0),
        ),
        (
            "2 regional Redis, partitioned",
            Mode::Eventual,
            2,
            10_000,
            lagging(2, 1_000_000, 1.0),
        ),
    ];
    println!(
        "\nThe design document's claims: 100/min (burst 100), 180 s runs, {traces} runs a row\n"
    );
    println!(
        "| design | requests | admitted (mean) | exact limiter (mean) | admitted / exact | worst over the quota |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for (name, trace) in [
        ("trickle at 2x the rate", &trickle as Trace<'_>),
        ("burst of 300 sprayed at once", &burst),
    ] {
        for (design, mode, n, interval, network) in &designs {
            let (mut admitted, mut ideal, mut worst) = (0, 0, 0.0_f64);
            for seed in 0..traces as u64 {
                let report = run(&Scenario {
                    mode: *mode,
                    quota,
                    interval: *interval,
                    fanout: 3,
                    region_rounds: Some(10),
                    network: network.clone(),
                    requests: trace(*n, seed),
                    duration,
                    offsets: vec![0; *n],
                    seed,
                    heal: None,
                });
                admitted += report.admitted;
                ideal += report.ideal;
                worst = worst.max(report.excess);
            }
            println!(
                "| {design} | {name} | {:.1} | {:.1} | {:.2} | {worst:.1} |",
                admitted as f64 / traces as f64,
                ideal as f64 / traces as f64,
                admitted as f64 / ideal.max(1) as f64
            );
        }
    }
}

/// Bytes a gateway sends a round when `k` keys change a round, each on one gateway at random
/// (10 gateways, fanout 3, no loss), measured after the relays have filled.
fn bytes_by_keys() {
    println!("\nBytes a gateway sends a round, 10 gateways, fanout 3, k keys changed a round\n");
    println!(
        "| mode | k | bytes a gateway a round | datagrams a gateway a round | bytes a key changed |"
    );
    println!("|---|---:|---:|---:|---:|");
    let quota = quota();
    let n = 10_usize;
    for mode in [Mode::Eventual, Mode::Escrow] {
        for k in [1_u64, 1_000, 100_000] {
            let ids: Vec<u64> = (1..=n as u64).collect();
            let mut nodes: Vec<Node> = ids
                .iter()
                .map(|&id| Node::new(id, &ids, Config::new(mode)))
                .collect();
            let mut rng = fastrand::Rng::with_seed(k);
            let (warm, measured) = (8_u64, 4_u64);
            let mut before = (0, 0);
            for round in 0..warm + measured {
                let now = Timestamp::from_micros(round * 100_000);
                for key in 0..k {
                    let at = rng.usize(0..n);
                    let _ = nodes[at].check(now, &Key::from(key), &quota, 1);
                }
                let out: Vec<_> = nodes.iter_mut().flat_map(|node| node.tick(now)).collect();
                for o in out {
                    let to = usize::try_from(o.to - 1).unwrap_or(0);
                    let _ = nodes[to].receive(now, &o.bytes);
                }
                if round + 1 == warm {
                    before = totals(&nodes);
                }
            }
            let after = totals(&nodes);
            let per = (n as u64 * measured) as f64;
            let bytes = (after.0 - before.0) as f64 / per;
            println!(
                "| {mode:?} | {k} | {bytes:.0} | {:.1} | {:.0} |",
                (after.1 - before.1) as f64 / per,
                bytes / k as f64
            );
        }
    }
}

/// How long a round (`Node::tick`) takes on one gateway by slots it holds: in `MeshStore`
/// the node's lock is held meanwhile, so a check waits as long. 4 gateways; each of
/// `slots` keys is admitted once under a quota that keeps it from resting (8 an hour), then
/// `changed` keys are checked a round (wall-clock time of this machine, 20 rounds after 30).
fn round_time_by_slots() {
    println!(
        "\nTime a round takes on one gateway, 4 gateways, by slots held and keys changed a round\n"
    );
    println!(
        "| mode | slots held | keys changed a round | mean | worst | per slot held | longest step | bytes it sends a round |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let held: Quota = "8/hour burst 8".parse().expect("a quota");
    let busy = quota();
    let n = 4_usize;
    for mode in [Mode::Eventual, Mode::Escrow] {
        for (slots, changed) in [
            (1_000_u64, 100_u64),
            (10_000, 100),
            (100_000, 100),
            (10_000, 10_000),
        ] {
            let ids: Vec<u64> = (1..=n as u64).collect();
            let mut nodes: Vec<Node> = ids
                .iter()
                .map(|&id| {
                    let mut config = Config::new(mode);
                    config.max_slots = 200_000;
                    Node::new(id, &ids, config)
                })
                .collect();
            let (warm, measured) = (30_u64, 20_u64);
            let (mut times, mut longest_step) = (Vec::new(), 0.0_f64);
            let mut sent_before = 0;
            for round in 0..warm + measured {
                let now = Timestamp::from_micros(round * 100_000);
                if round == warm {
                    sent_before = nodes[0].sent().bytes;
                }
                if round == 0 {
                    for key in 0..slots {
                        let _ = nodes[0].check(now, &Key::from(key), &held, 1);
                    }
                }
                for key in 0..changed {
                    let _ = nodes[0].check(now, &Key::from(u64::MAX - key), &busy, 1);
                }
                let mut out = Vec::new();
                // The first gateway's round in steps of 256 slots, as `MeshStore` does it.
                let mut round_time = 0.0;
                let first = loop {
                    let started = std::time::Instant::now();
                    let step = nodes[0].advance_round(now, 256);
                    let took = started.elapsed().as_secs_f64() * 1e6;
                    round_time += took;
                    if round >= warm {
                        longest_step = longest_step.max(took);
                    }
                    if let Some(first) = step {
                        break first;
                    }
                };
                if round >= warm {
                    times.push(round_time);
                }
                out.extend(first);
                for node in &mut nodes[1..] {
                    out.extend(node.tick(now));
                }
                for o in out {
                    let to = usize::try_from(o.to - 1).unwrap_or(0);
                    let _ = nodes[to].receive(now, &o.bytes);
                }
            }
            let mean = times.iter().sum::<f64>() / times.len() as f64;
            let worst = times.iter().copied().fold(0.0, f64::max);
            println!(
                "| {mode:?} | {slots} | {changed} | {mean:.0} µs | {worst:.0} µs | {:.0} ns | {longest_step:.0} µs | {} |",
                mean * 1e3 / slots as f64,
                (nodes[0].sent().bytes - sent_before) / measured
            );
        }
    }
}

fn totals(nodes: &[Node]) -> (u64, u64) {
    nodes.iter().fold((0, 0), |(b, d), node| {
        (b + node.sent().bytes, d + node.sent().datagrams)
    })
}
