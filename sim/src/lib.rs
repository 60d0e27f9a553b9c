//! The mesh simulator: the real protocol core ([`ratewarden_mesh::Node`]) for N gateways on
//! a virtual clock, over a network with latency (per pair of regions), jitter, loss,
//! duplication, partitions and clock offsets, deterministic from a seed. Each run reports
//! what was admitted against the quota's bound and against one exact limiter fed the same
//! requests.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use ratewarden_core::algorithm::{AlgorithmState, FixedWindowState, SlidingWindowState};
use ratewarden_core::{Algorithm, Key, Quota, Timestamp};
use ratewarden_mesh::{Config, Mode, Node};

/// The network between gateways.
#[derive(Clone, Debug)]
pub struct Network {
    /// Each gateway's region.
    pub regions: Vec<usize>,
    /// One-way delay between regions, µs (`delay[a][b]`).
    pub delay: Vec<Vec<u64>>,
    /// Up to this much more, at random, µs.
    pub jitter: u64,
    /// Probability a datagram is lost.
    pub loss: f64,
    /// Probability a datagram is delivered twice.
    pub duplicate: f64,
    /// Times (µs) between which a region is cut off from the others.
    pub partitions: Vec<Partition>,
}

/// A region cut off from the others for a while.
#[derive(Clone, Copy, Debug)]
pub struct Partition {
    /// The region alone.
    pub region: usize,
    /// From, µs.
    pub from: u64,
    /// Until, µs.
    pub until: u64,
}

impl Network {
    /// `n` gateways in one region, `delay` µs apart, `loss` lost, 1% duplicated.
    #[must_use]
    pub fn flat(n: usize, delay: u64, loss: f64) -> Self {
        Self {
            regions: vec![0; n],
            delay: vec![vec![delay]],
            jitter: delay,
            loss,
            duplicate: 0.01,
            partitions: Vec::new(),
        }
    }

    fn cut(&self, a: usize, b: usize, at: u64) -> bool {
        let (ra, rb) = (self.regions[a], self.regions[b]);
        ra != rb
            && self
                .partitions
                .iter()
                .any(|p| (p.region == ra || p.region == rb) && (p.from..p.until).contains(&at))
    }
}

/// One run.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// How gateways share the quota.
    pub mode: Mode,
    /// The quota.
    pub quota: Quota,
    /// The gossip interval, µs.
    pub interval: u64,
    /// Peers each round goes to.
    pub fanout: usize,
    /// Escrow: rounds between moves of shares across regions ([`Config::region_rounds`]).
    pub region_rounds: Option<u32>,
    /// The network (its `regions` gives the number of gateways).
    pub network: Network,
    /// Requests: (time µs, gateway), sorted by time.
    pub requests: Vec<(u64, usize)>,
    /// How long it runs, µs.
    pub duration: u64,
    /// Each gateway's clock reads the virtual time plus this, µs.
    pub offsets: Vec<u64>,
    /// Seeds the network and the nodes.
    pub seed: u64,
    /// When a partition heals, µs: the run measures how long after it every gateway has
    /// counted what each other admitted before it (eventual).
    pub heal: Option<u64>,
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Requests made.
    pub requested: usize,
    /// Requests admitted.
    pub admitted: usize,
    /// Requests one exact limiter admits given the same requests.
    pub ideal: usize,
    /// The most admitted above `B + rate × t` in any interval, units.
    pub excess: f64,
    /// Eventual: the longest a unit admitted on one gateway took to be counted on every other.
    pub delay: u64,
    /// Eventual: the most admitted in any interval of length `delay`.
    pub admitted_in_delay: usize,
    /// Datagrams sent, and their bytes.
    pub datagrams: u64,
    /// Bytes sent.
    pub bytes: u64,
    /// Rounds ticked (all gateways).
    pub rounds: u64,
    /// Escrow: each gateway's share at the end, parts per million.
    pub shares: Vec<u64>,
    /// Eventual: how long after the last admission every gateway's view of the total was
    /// within 1 unit of the truth, µs (`None`: never, by the end).
    pub converged: Option<u64>,
    /// Eventual: how long after [`Scenario::heal`] every gateway had counted what each
    /// other admitted before it, µs.
    pub heal_lag: u64,
}

enum Event {
    Tick(usize),
    Deliver(usize, Vec<u8>),
    Request(usize),
}

/// The key every request in a run is for.
#[must_use]
pub fn key() -> Key {
    Key::from("client")
}

/// Runs a scenario.
#[must_use]
pub fn run(s: &Scenario) -> Report {
    let n = s.network.regions.len();
    let ids: Vec<u64> = (1..=n as u64).collect();
    let mut rng = fastrand::Rng::with_seed(s.seed);
    let mut nodes: Vec<Node> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let mut config = Config::new(s.mode);
            config.fanout = s.fanout;
            config.seed = s.seed;
            config.region_rounds = s.region_rounds;
            // Regions number a handful here.
            config.region = u16::try_from(s.network.regions[i]).unwrap_or(u16::MAX);
            Node::new(id, &ids, config)
        })
        .collect();
    let key = key();
    let mut queue = BinaryHeap::new();
    let mut seq = 0_u64;
    let mut push = |queue: &mut BinaryHeap<_>, at: u64, event: Event| {
        seq += 1;
        queue.push(Reverse((at, seq, Slot(event))));
    };
    for i in 0..n {
        push(&mut queue, rng.u64(0..s.interval), Event::Tick(i));
    }
    for &(at, i) in &s.requests {
        push(&mut queue, at, Event::Request(i));
    }
    let mut report = Report {
        requested: s.requests.len(),
        ..Report::default()
    };
    let mut admitted = Vec::new();
    // Eventual: each gateway's running total over time, and how far each other gateway has
    // counted it (index into that history).
    let mut history: Vec<Vec<(u64, u64)>> = vec![Vec::new(); n];
    let mut counted: Vec<Vec<usize>> = vec![vec![0; n]; n];
    let mut last_admission = None;
    while let Some(Reverse((at, _, Slot(event)))) = queue.pop() {
        if at > s.duration {
            break;
        }
        let local = |i: usize| Timestamp::from_micros(at + s.offsets[i]);
        match event {
            Event::Tick(i) => {
                report.rounds += 1;
                for out in nodes[i].tick(local(i)) {
                    report.datagrams += 1;
                    report.bytes += out.bytes.len() as u64;
                    let to = ids.iter().position(|&id| id == out.to).unwrap_or(i);
                    if rng.f64() < s.network.loss || s.network.cut(i, to, at) {
                        continue;
                    }
                    let copies = if rng.f64() < s.network.duplicate {
                        2
                    } else {
                        1
                    };
                    for _ in 0..copies {
                        let (ri, rt) = (s.network.regions[i], s.network.regions[to]);
                        let delay = s.network.delay[ri][rt] + rng.u64(0..=s.network.jitter);
                        push(
                            &mut queue,
                            at + delay,
                            Event::Deliver(to, out.bytes.clone()),
                        );
                    }
                }
                push(&mut queue, at + s.interval, Event::Tick(i));
            }
            Event::Deliver(i, bytes) => {
                let _ = nodes[i].receive(local(i), &bytes);
                if s.mode == Mode::Eventual {
                    for j in (0..n).filter(|&j| j != i) {
                        let seen = nodes[i].admitted_from(&key, &s.quota, ids[j]);
                        let index = &mut counted[i][j];
                        while let Some(&(t, total)) = history[j].get(*index) {
                            if seen < total {
                                break;
                            }
                            report.delay = report.delay.max(at - t);
                            if s.heal.is_some_and(|heal| t < heal) {
                                report.heal_lag =
                                    report.heal_lag.max(at.saturating_sub(s.heal.unwrap_or(0)));
                            }
                            *index += 1;
                        }
                    }
                    if let Some(last) = last_admission
                        && report.converged.is_none()
                    {
                        let truth = admitted.len() as u64;
                        if nodes
                            .iter()
                            .all(|node| node.admitted_seen(&key, &s.quota) + 1 >= truth)
                        {
                            report.converged = Some(at - last);
                        }
                    }
                }
            }
            Event::Request(i) => {
                let decision = nodes[i].check(local(i), &key, &s.quota, 1);
                let allowed = decision.is_ok_and(|d| d.is_allowed());
                if allowed {
                    admitted.push(at);
                }
                if allowed && s.mode == Mode::Eventual {
                    last_admission = Some(at);
                    report.converged = None;
                    let total = history[i].last().map_or(0, |&(_, t)| t) + 1;
                    history[i].push((at, total));
                }
            }
        }
    }
    // Units never counted elsewhere by the end were delayed at least until then.
    for i in (0..n).filter(|_| s.mode == Mode::Eventual) {
        for j in (0..n).filter(|&j| j != i) {
            if let Some(&(t, _)) = history[j].get(counted[i][j]) {
                report.delay = report.delay.max(s.duration - t);
            }
        }
    }
    report.shares = nodes
        .iter()
        .map(|node| node.share(&key, &s.quota).unwrap_or(0))
        .collect();
    report.admitted = admitted.len();
    // The window algorithms count in the gateways' windows: with clocks in step (offsets
    // equal modulo the period), those of the first gateway's clock.
    let phase = match s.quota.algorithm() {
        Algorithm::FixedWindow | Algorithm::SlidingWindow => {
            s.offsets.first().map_or(0, |o| o % s.quota.period_micros())
        }
        _ => 0,
    };
    let shifted: Vec<u64> = admitted.iter().map(|at| at + phase).collect();
    report.excess = excess(&s.quota, &shifted);
    let requests: Vec<(u64, usize)> = s.requests.iter().map(|&(at, i)| (at + phase, i)).collect();
    report.ideal = ideal(&s.quota, &requests);
    report.admitted_in_delay = most_within(&admitted, report.delay);
    report
}

struct Slot(Event);

impl PartialEq for Slot {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for Slot {}
impl PartialOrd for Slot {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Slot {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

/// The most units admitted above what the quota's algorithm allows, exactly (units ×
/// period µs): for GCRA and the token bucket, above `B + rate × t` in any interval (a bucket
/// of `B` refilled at the quota's rate and charged one unit per admission, allowed below
/// zero, sinks at its lowest this far below zero); for the fixed window, above the count in
/// any window; for the sliding window counter, above the count as the counter reckons the
/// admissions just after any of them (the window before weighed by its overlap).
#[must_use]
pub fn excess(quota: &Quota, admitted: &[u64]) -> f64 {
    match quota.algorithm() {
        Algorithm::FixedWindow | Algorithm::SlidingWindow => window_excess(quota, admitted),
        _ => bucket_excess(quota, admitted),
    }
}

fn window_excess(quota: &Quota, admitted: &[u64]) -> f64 {
    let period = u128::from(quota.period_micros());
    let sliding = quota.algorithm() == Algorithm::SlidingWindow;
    let count = u128::from(quota.count()) * period;
    let mut worst: u128 = 0;
    // Admissions per window, in order.
    let (mut window, mut current, mut previous) = (0_u128, 0_u128, 0_u128);
    for &at in admitted {
        let w = u128::from(at) / period;
        if w != window {
            previous = if w == window + 1 { current } else { 0 };
            current = 0;
            window = w;
        }
        current += 1;
        let left = if sliding {
            period - u128::from(at) % period
        } else {
            0
        };
        let counted = current * period + previous * left;
        worst = worst.max(counted.saturating_sub(count));
    }
    worst as f64 / period as f64
}

fn bucket_excess(quota: &Quota, admitted: &[u64]) -> f64 {
    let period = u128::from(quota.period_micros());
    let cap = i128::try_from(u128::from(quota.burst()) * period).unwrap_or(i128::MAX);
    let mut level = cap;
    let mut lowest = cap;
    let mut last = admitted.first().copied().unwrap_or(0);
    for &at in admitted {
        let earned = i128::from(quota.count()) * i128::from(at - last);
        level = (level + earned).min(cap) - i128::try_from(period).unwrap_or(i128::MAX);
        lowest = lowest.min(level);
        last = at;
    }
    (-lowest).max(0) as f64 / period as f64
}

/// Requests one exact limiter of the quota admits (a token bucket, or the window
/// algorithm's state).
#[must_use]
pub fn ideal(quota: &Quota, requests: &[(u64, usize)]) -> usize {
    match quota.algorithm() {
        Algorithm::FixedWindow => admitted_by::<FixedWindowState>(quota, requests),
        Algorithm::SlidingWindow => admitted_by::<SlidingWindowState>(quota, requests),
        _ => bucket_ideal(quota, requests),
    }
}

fn admitted_by<S: AlgorithmState + Default>(quota: &Quota, requests: &[(u64, usize)]) -> usize {
    let mut state = S::default();
    requests
        .iter()
        .filter(|&&(at, _)| {
            state
                .check(Timestamp::from_micros(at), 1, quota)
                .is_allowed()
        })
        .count()
}

fn bucket_ideal(quota: &Quota, requests: &[(u64, usize)]) -> usize {
    let period = i128::from(quota.period_micros());
    let cap = i128::from(quota.burst()) * period;
    let (mut level, mut last, mut admitted) = (cap, 0_u64, 0);
    for &(at, _) in requests {
        level = (level + i128::from(quota.count()) * i128::from(at - last)).min(cap);
        last = at;
        if level >= period {
            level -= period;
            admitted += 1;
        }
    }
    admitted
}

/// The most of `times` (sorted) within any interval of length `width`.
#[must_use]
pub fn most_within(times: &[u64], width: u64) -> usize {
    let (mut start, mut most) = (0, 0);
    for (end, &t) in times.iter().enumerate() {
        while t - times[start] > width {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

/// Requests at random times, `per_second` on average (a Poisson process), each to one of
/// `n` gateways at random, over `duration` µs.
#[must_use]
pub fn trickle(
    rng: &mut fastrand::Rng,
    n: usize,
    per_second: f64,
    duration: u64,
) -> Vec<(u64, usize)> {
    let mut out = Vec::new();
    let mut t = 0.0;
    loop {
        t += -(1.0 - rng.f64()).ln() / per_second * 1e6;
        if t >= duration as f64 {
            return out;
        }
        out.push((t as u64, rng.usize(0..n)));
    }
}

/// A random trace for `n` gateways over `duration` µs: a steady trickle at a random rate,
/// bursts sprayed over every gateway at once, and a stretch on one gateway alone.
#[must_use]
pub fn requests(
    rng: &mut fastrand::Rng,
    n: usize,
    quota: &Quota,
    duration: u64,
) -> Vec<(u64, usize)> {
    let per_second = f64::from(quota.count()) * 1e6 / quota.period_micros() as f64;
    // Trickle: 0.3 to 3 times the quota's rate, spread over random gateways.
    let rate = per_second * (0.3 + rng.f64() * 2.7);
    let mut out = trickle(rng, n, rate, duration);
    // Sprayed bursts: each of 1 to 3 times one request per gateway, all in the same instant.
    for _ in 0..rng.usize(1..=3) {
        let at = rng.u64(0..duration);
        for _ in 0..rng.usize(1..=3) {
            out.extend((0..n).map(|i| (at, i)));
        }
    }
    // One gateway alone: a burst of up to twice the quota's burst.
    let at = rng.u64(0..duration);
    let lone = rng.usize(0..n);
    let count = rng.u32(1..=quota.burst().saturating_mul(2));
    out.extend((0..count).map(|k| (at + u64::from(k) * 1_000, lone)));
    out.sort_unstable();
    out
}

/// The quota runs use: 100 a minute (the design document's example).
///
/// # Panics
///
/// Never: the quota is a constant.
#[must_use]
#[allow(clippy::unwrap_used)]
pub fn quota() -> Quota {
    Quota::new(100, Duration::from_secs(60)).unwrap()
}

/// The quota window cells use: 100 per 10 s, so that a 20 s run crosses windows.
///
/// # Panics
///
/// Never: the quota is a constant.
#[must_use]
#[allow(clippy::unwrap_used)]
pub fn window_quota(algorithm: Algorithm) -> Quota {
    Quota::new(100, Duration::from_secs(10))
        .and_then(|q| q.with_algorithm(algorithm))
        .unwrap()
}

/// One cell of a grid: `traces` random runs of `mode` for `n` gateways, gossip every
/// `interval` µs, `loss` lost.
#[derive(Clone, Copy, Debug)]
pub struct Cell {
    /// The mode.
    pub mode: Mode,
    /// The algorithm: GCRA's cells use [`quota`], the window algorithms' [`window_quota`].
    pub algorithm: Algorithm,
    /// Gateways.
    pub n: usize,
    /// Gossip interval, µs.
    pub interval: u64,
    /// Datagrams lost.
    pub loss: f64,
    /// Runs.
    pub traces: usize,
    /// The first run's seed (each run's is this plus its index).
    pub seed: u64,
}

/// What a cell's runs measured.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Runs.
    pub traces: usize,
    /// The largest excess over the quota (units), and the mean.
    pub worst_excess: f64,
    /// The mean excess.
    pub mean_excess: f64,
    /// Eventual: runs whose excess broke the stated bound.
    pub over_bound: usize,
    /// Eventual: the stated bound of the worst run (units).
    pub worst_bound: f64,
    /// The longest propagation delay measured (eventual), µs.
    pub worst_delay: u64,
    /// Admitted against what one exact limiter admits, summed over runs.
    pub admitted: usize,
    /// What one exact limiter admits, summed over runs.
    pub ideal: usize,
    /// The largest shortfall against one exact limiter (units).
    pub worst_shortfall: i64,
    /// Escrow: runs whose shares at the end summed to more than the whole quota.
    pub shares_over_whole: usize,
    /// Bytes sent a gateway a round (mean).
    pub bytes_per_round: f64,
}

/// The eventual mode's stated bound for a run: `min((N − 1) × (B + rate × D), admitted
/// within D)`; for the window algorithms `min((N − 1) × count, admitted within D)`.
#[must_use]
pub fn eventual_bound(quota: &Quota, n: usize, report: &Report) -> f64 {
    let rate = f64::from(quota.count()) / quota.period_micros() as f64; // units per µs
    let spread = match quota.algorithm() {
        Algorithm::FixedWindow | Algorithm::SlidingWindow => {
            (n - 1) as f64 * f64::from(quota.count())
        }
        _ => (n - 1) as f64 * (f64::from(quota.burst()) + rate * report.delay as f64),
    };
    spread.min(report.admitted_in_delay as f64)
}

/// Runs a cell.
#[must_use]
pub fn cell(c: Cell) -> Summary {
    let windows = matches!(
        c.algorithm,
        Algorithm::FixedWindow | Algorithm::SlidingWindow
    );
    let quota = match windows {
        true => window_quota(c.algorithm),
        false => quota(),
    };
    let period = quota.period_micros();
    let duration = 20_000_000;
    let mut sum = Summary {
        traces: c.traces,
        ..Summary::default()
    };
    let mut excess_total = 0.0;
    let mut bytes_per_round = 0.0;
    for t in 0..c.traces {
        let seed = c.seed + t as u64;
        let mut rng = fastrand::Rng::with_seed(seed);
        let scenario = Scenario {
            mode: c.mode,
            quota,
            interval: c.interval,
            fanout: 3,
            region_rounds: Some(10),
            network: Network::flat(c.n, 1_000, c.loss),
            requests: requests(&mut rng, c.n, &quota, duration),
            duration,
            // Clocks up to an hour apart; for the window algorithms, by whole periods (the
            // windows line up as far as clocks agree: here, in step).
            offsets: {
                let phase = rng.u64(0..period);
                (0..c.n)
                    .map(|_| match windows {
                        true => phase + rng.u64(0..360) * period,
                        false => rng.u64(0..3_600_000_000),
                    })
                    .collect()
            },
            seed,
            heal: None,
        };
        let report = run(&scenario);
        excess_total += report.excess;
        sum.worst_excess = sum.worst_excess.max(report.excess);
        sum.worst_delay = sum.worst_delay.max(report.delay);
        sum.admitted += report.admitted;
        sum.ideal += report.ideal;
        bytes_per_round += report.bytes as f64 / report.rounds.max(1) as f64;
        match c.mode {
            Mode::Eventual => {
                let bound = eventual_bound(&quota, c.n, &report);
                if report.excess > bound + 1e-9 {
                    sum.over_bound += 1;
                }
                if report.excess >= sum.worst_excess {
                    sum.worst_bound = bound;
                }
            }
            Mode::Escrow => {
                if report.excess > 0.0 {
                    sum.over_bound += 1;
                }
                let short = report.ideal as i64 - report.admitted as i64;
                sum.worst_shortfall = sum.worst_shortfall.max(short);
                if report.shares.iter().sum::<u64>() > 1_000_000 {
                    sum.shares_over_whole += 1;
                }
            }
        }
    }
    sum.mean_excess = excess_total / c.traces.max(1) as f64;
    sum.bytes_per_round = bytes_per_round / c.traces.max(1) as f64;
    sum
}

/// Rounds after a burst on one gateway until every gateway's view of the total is within 1
/// unit of the truth, for each of `traces` runs (eventual; `None` for a run that never got
/// there in 10 s).
#[must_use]
pub fn convergence(
    n: usize,
    interval: u64,
    loss: f64,
    traces: usize,
    seed: u64,
) -> Vec<Option<u64>> {
    let quota = quota();
    (0..traces)
        .map(|t| {
            let seed = seed + t as u64;
            let mut rng = fastrand::Rng::with_seed(seed);
            let at = 1_000_000 + rng.u64(0..interval);
            let gateway = rng.usize(0..n);
            let scenario = Scenario {
                mode: Mode::Eventual,
                quota,
                interval,
                fanout: 3,
                region_rounds: Some(10),
                network: Network::flat(n, 1_000, loss),
                requests: (0..50).map(|_| (at, gateway)).collect(),
                duration: 11_000_000,
                offsets: (0..n).map(|_| rng.u64(0..1_000_000)).collect(),
                seed,
                heal: None,
            };
            run(&scenario)
                .converged
                .map(|after| after.div_ceil(interval))
        })
        .collect()
}

/// Demand held on the first `on` of `n` gateways for two minutes: requests at random times,
/// `load` times the quota's rate, each to one of those gateways at random (the rest idle),
/// gossip every `interval` µs, `loss` lost.
#[must_use]
pub fn held(n: usize, on: usize, load: f64, interval: u64, loss: f64, seed: u64) -> Scenario {
    moved(n, 0..on, 0..on, load, interval, loss, seed)
}

/// Demand that moves: for a minute on gateways `from`, then for a minute on `to`
/// (indices), as [`held`] (the rest idle).
#[must_use]
pub fn moved(
    n: usize,
    from: std::ops::Range<usize>,
    to: std::ops::Range<usize>,
    load: f64,
    interval: u64,
    loss: f64,
    seed: u64,
) -> Scenario {
    let quota = quota();
    let mut rng = fastrand::Rng::with_seed(seed);
    let minute = 60_000_000;
    let per_second = f64::from(quota.count()) * 1e6 / quota.period_micros() as f64 * load;
    let mut requests = Vec::new();
    for (start, gateways) in [(0, from), (minute, to)] {
        let (first, count) = (gateways.start.min(n - 1), gateways.len().clamp(1, n));
        let count = count.min(n - first);
        requests.extend(
            trickle(&mut rng, count, per_second, minute)
                .into_iter()
                .map(|(at, i)| (start + at, first + i)),
        );
    }
    Scenario {
        mode: Mode::Escrow,
        quota,
        interval,
        fanout: 3,
        region_rounds: Some(10),
        network: Network::flat(n, 1_000, loss),
        requests,
        duration: 2 * minute,
        offsets: (0..n).map(|_| rng.u64(0..1_000_000)).collect(),
        seed,
        heal: None,
    }
}

/// 3 regions of 4 gateways, 80 ms apart (1 ms within one), one region cut off from the
/// others from 10 s to 40 s of a 60 s run, requests sprayed over every gateway at `load`
/// times the quota's rate.
#[must_use]
pub fn regions(mode: Mode, interval: u64, load: f64, seed: u64) -> Scenario {
    let quota = quota();
    let mut rng = fastrand::Rng::with_seed(seed);
    let n = 12;
    let duration = 60_000_000;
    let per_second = f64::from(quota.count()) * 1e6 / quota.period_micros() as f64 * load;
    let requests = trickle(&mut rng, n, per_second, duration);
    let mut delay = vec![vec![80_000; 3]; 3];
    for (r, row) in delay.iter_mut().enumerate() {
        row[r] = 1_000;
    }
    Scenario {
        mode,
        quota,
        interval,
        fanout: 3,
        region_rounds: Some(10),
        network: Network {
            regions: (0..n).map(|i| i / 4).collect(),
            delay,
            jitter: 1_000,
            loss: 0.0,
            duplicate: 0.01,
            partitions: vec![Partition {
                region: 2,
                from: 10_000_000,
                until: 40_000_000,
            }],
        },
        requests,
        duration,
        offsets: (0..n).map(|_| rng.u64(0..1_000_000)).collect(),
        seed,
        heal: Some(40_000_000),
    }
}
