//! A seeded subset of the simulator's grids (`cargo run --release -p ratewarden-sim` runs
//! them whole): every stated bound of the mesh's modes, checked on the real protocol core.

use ratewarden_core::Algorithm;
use ratewarden_mesh::Mode;
use ratewarden_sim::{
    Cell, Scenario, cell, convergence, eventual_bound, held, moved, quota, regions, run,
};

const TRACES: usize = 20;

fn cells(mode: Mode) -> impl Iterator<Item = Cell> {
    [3, 10, 32].into_iter().flat_map(move |n| {
        [50_000, 100_000, 500_000]
            .into_iter()
            .flat_map(move |interval| {
                [0.0, 0.05].into_iter().map(move |loss| Cell {
                    mode,
                    algorithm: Algorithm::Gcra,
                    n,
                    interval,
                    loss,
                    traces: TRACES,
                    seed: 7_000,
                })
            })
    })
}

/// Escrow never admits above the quota, in any interval of any run, and never holds more
/// than the whole quota in shares; it admits at least 0.65 of what one exact limiter would
/// (0.73-0.81 over 1,000 runs a cell).
#[test]
fn escrow_never_admits_above_the_quota() {
    for c in cells(Mode::Escrow) {
        let s = cell(c);
        assert_eq!(s.worst_excess, 0.0, "{c:?}: {s:?}");
        assert_eq!(s.over_bound, 0, "{c:?}: {s:?}");
        assert_eq!(s.shares_over_whole, 0, "{c:?}: {s:?}");
        let used = s.admitted as f64 / s.ideal as f64;
        assert!(
            used >= 0.65,
            "{c:?}: admitted {used:.3} of the exact limiter's"
        );
    }
}

/// Escrow admits at least 0.8 of what one exact limiter admits from demand held on one
/// gateway, a few or half of them, or moving from some to others: shares follow demand.
#[test]
fn escrow_serves_demand_held_on_some_gateways_or_moving() {
    for n in [3_usize, 10, 32] {
        let half = n / 2;
        for interval in [50_000, 500_000] {
            let mut runs = Vec::new();
            for on in [1, 3.min(n), half] {
                for load in [1.2, 5.0] {
                    let seed = n as u64 + on as u64;
                    runs.push((
                        format!("held on {on} at {load}x"),
                        held(n, on, load, interval, 0.05, seed),
                    ));
                }
            }
            for (from, to) in [(0..1, 1..2), (0..1, 1..half + 1), (0..half, n - 1..n)] {
                let name = format!("moved from {from:?} to {to:?}");
                runs.push((name, moved(n, from, to, 2.0, interval, 0.05, n as u64)));
            }
            for (name, scenario) in runs {
                let report = run(&scenario);
                assert_eq!(report.excess, 0.0, "{report:?}");
                let used = report.admitted as f64 / report.ideal as f64;
                assert!(
                    used >= 0.8,
                    "{n} gateways, {interval} µs, {name}: admitted {used:.3} of the exact limiter's"
                );
            }
        }
    }
}

/// Eventual admits above the quota by no more than its stated bound in any run, and leaves
/// nothing unused that one exact limiter would admit.
#[test]
fn eventual_stays_within_its_stated_bound() {
    for c in cells(Mode::Eventual) {
        let s = cell(c);
        assert_eq!(s.over_bound, 0, "{c:?}: {s:?}");
        assert!(s.admitted >= s.ideal, "{c:?}: {s:?}");
    }
}

/// After a burst on one gateway, every view is within 1 unit of the truth after at most
/// `ceil(log2 N) + 2` rounds at fanout 3 (99th percentile).
#[test]
fn a_burst_on_one_gateway_converges_within_log2_n_plus_2_rounds() {
    for n in [3_usize, 10, 32] {
        for interval in [50_000, 100_000, 500_000] {
            let mut rounds: Vec<u64> = convergence(n, interval, 0.0, 100, 1)
                .into_iter()
                .map(|r| r.unwrap_or(u64::MAX))
                .collect();
            rounds.sort_unstable();
            let p99 = rounds[98];
            let bound = u64::from(usize::BITS - (n - 1).leading_zeros()) + 2;
            assert!(
                p99 <= bound,
                "{n} gateways, {interval} µs: p99 {p99} rounds > {bound}"
            );
        }
    }
}

/// A region cut off for 30 s: escrow stays within the quota throughout (shares following
/// demand across regions or split for good); eventual admits at
/// most the quota on each side (plus each side's own bound), and every gateway has counted
/// what the others admitted before the heal within 3 rounds of it.
#[test]
fn a_partitioned_region_stays_within_each_modes_bound() {
    let quota = quota();
    let rate = f64::from(quota.count()) / quota.period_micros() as f64;
    for seed in 0..3 {
        let escrow = run(&regions(Mode::Escrow, 100_000, 2.0, seed));
        assert_eq!(escrow.excess, 0.0, "escrow {escrow:?}");
        let fixed = run(&Scenario {
            region_rounds: None,
            ..regions(Mode::Escrow, 100_000, 2.0, seed)
        });
        assert_eq!(fixed.excess, 0.0, "escrow, a fixed split {fixed:?}");
        let scenario = regions(Mode::Eventual, 100_000, 2.0, seed);
        let eventual = run(&scenario);
        let partition = 30_000_000.0;
        // One side more than the quota admits, at most: its burst and its rate over the
        // partition, beside each side's own spread.
        let per_side = f64::from(quota.burst()) + rate * partition;
        let sides = eventual_bound(&quota, 8, &eventual) + eventual_bound(&quota, 4, &eventual);
        assert!(eventual.excess <= per_side + sides, "eventual {eventual:?}");
        assert!(
            eventual.heal_lag <= 3 * 100_000 + 80_000 + 1_000,
            "eventual heal lag {}",
            eventual.heal_lag
        );
    }
}

/// The window algorithms keep their bounds on random traces: escrow never goes over the
/// count in a fixed window, nor under the sliding window counter at any admission, and
/// admits at least 0.75 of what one exact limiter admits; eventual stays within `min((N −
/// 1) × count, admitted within D)` and leaves nothing unused.
#[test]
fn the_window_algorithms_keep_their_bounds() {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        for mode in [Mode::Escrow, Mode::Eventual] {
            for n in [3, 10, 32] {
                for loss in [0.0, 0.05] {
                    let c = Cell {
                        mode,
                        algorithm,
                        n,
                        interval: 100_000,
                        loss,
                        traces: TRACES,
                        seed: 9_000,
                    };
                    let s = cell(c);
                    assert_eq!(s.over_bound, 0, "{c:?}: {s:?}");
                    if mode == Mode::Escrow {
                        assert_eq!(s.worst_excess, 0.0, "{c:?}: {s:?}");
                        assert_eq!(s.shares_over_whole, 0, "{c:?}: {s:?}");
                    }
                    // Escrow: 0.81-0.99 of one exact limiter; eventual leaves nothing unused.
                    let used = s.admitted as f64 / s.ideal as f64;
                    let least = if mode == Mode::Escrow { 0.75 } else { 0.98 };
                    assert!(
                        used >= least,
                        "{c:?}: admitted {used:.3} of the exact limiter's"
                    );
                }
            }
        }
    }
}
