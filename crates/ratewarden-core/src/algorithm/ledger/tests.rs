//! The ledger's bounds over long random runs: settled units within the algorithm's bound plus
//! the overdraft of the reservations outstanding, refunds credited, lapsed holds gone.

use super::{Hold, Ledger};
use crate::algorithm::{AlgorithmState, GcraState, SlidingLogState, TokenBucketState};
use crate::{Quota, Timestamp};

/// A small deterministic generator (xorshift64*): the runs replay from their seed.
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
}

/// A reservation in flight in a run.
struct Open {
    hold: Hold,
    estimate: u32,
    ends_at: u64,
}

/// What a run settled: (time, units) per settle, and for each admission the overdraft
/// (`actual - estimate`, where positive) of every reservation outstanding then.
struct Run {
    settled: Vec<(u64, u64)>,
    /// (time of an admission, overdraft of the reservations outstanding then and settled
    /// after), in time order.
    exposure: Vec<(u64, u64)>,
}

/// `ops` reservations on one key, up to `concurrent` at once, each running up to
/// `max_run_us`, with `actual` drawn by `actual(estimate, rng)`.
fn run<S: AlgorithmState>(
    quota: &Quota,
    seed: u64,
    ops: usize,
    concurrent: usize,
    max_run_us: u64,
    actual: impl Fn(u32, &mut Rng) -> u32,
) -> Run {
    let mut rng = Rng(seed | 1);
    let mut ledger = Ledger::<S>::default();
    let mut open: Vec<(Open, u32)> = Vec::new();
    let mut now = 1_000_000_u64;
    let hold_us = max_run_us * 2 + 1;
    let mut settled = Vec::new();
    let mut admissions: Vec<(u64, Vec<usize>)> = Vec::new();
    let mut overdraft_of: Vec<u64> = Vec::new();
    let mut ids: Vec<usize> = Vec::new();
    let max_estimate = quota.burst().min(50);
    for _ in 0..ops {
        now += rng.below(quota.emission_interval_micros() * 2 + 1);
        // Settle what has ended.
        let mut i = 0;
        while i < open.len() {
            if open[i].0.ends_at <= now {
                let (done, units) = open.swap_remove(i);
                let id = ids.swap_remove(i);
                ledger.settle(Timestamp::from_micros(now), done.hold, units, quota);
                settled.push((now, u64::from(units)));
                overdraft_of[id] = u64::from(units.saturating_sub(done.estimate));
            } else {
                i += 1;
            }
        }
        if open.len() < concurrent {
            let estimate = 1 + u32::try_from(rng.below(u64::from(max_estimate))).unwrap();
            let at = Timestamp::from_micros(now);
            let lapse = Timestamp::from_micros(now + hold_us);
            if let (decision, Some(hold)) = ledger.reserve(at, estimate, lapse, quota) {
                assert!(decision.is_allowed());
                let units = actual(estimate, &mut rng);
                let ends_at = now + rng.below(max_run_us + 1);
                open.push((
                    Open {
                        hold,
                        estimate,
                        ends_at,
                    },
                    units,
                ));
                ids.push(overdraft_of.len());
                overdraft_of.push(0);
                admissions.push((now, ids.clone()));
            }
        }
    }
    for ((done, units), id) in open.into_iter().zip(ids) {
        now += 1;
        ledger.settle(Timestamp::from_micros(now), done.hold, units, quota);
        settled.push((now, u64::from(units)));
        overdraft_of[id] = u64::from(units.saturating_sub(done.estimate));
    }
    let exposure = admissions
        .into_iter()
        .map(|(at, outstanding)| (at, outstanding.iter().map(|&id| overdraft_of[id]).sum()))
        .collect();
    Run { settled, exposure }
}

/// Every interval ending at a settle: units settled within `burst + 1 + t / interval` plus
/// the overdraft outstanding at the last admission before its end. Returns the largest
/// excess over the algorithm's bound alone (in units), to show the overdraft is what it is.
fn assert_within(quota: &Quota, run: &Run) -> u64 {
    let interval = u128::from(quota.emission_interval_micros());
    let burst = u128::from(quota.burst());
    // g(t) = units settled before t, times the interval, less t: the smallest g at a
    // window's start gives the fullest window ending here.
    let mut total: u128 = 0;
    let mut min_start: Option<i128> = None;
    let mut last_admission = 0;
    let mut worst_excess = 0_u64;
    for &(at, units) in &run.settled {
        let start = (total * interval) as i128 - i128::from(at);
        min_start = Some(min_start.map_or(start, |m| m.min(start)));
        total += u128::from(units);
        while last_admission + 1 < run.exposure.len() && run.exposure[last_admission + 1].0 <= at {
            last_admission += 1;
        }
        let overdraft = run.exposure.get(last_admission).map_or(0, |e| e.1);
        let end = (total * interval) as i128 - i128::from(at);
        let over_rate = end - min_start.unwrap(); // (units·T − t) over the best window
        let allowed = ((burst + 1) * interval) as i128;
        let excess = (over_rate - allowed).max(0) as u128 / interval;
        worst_excess = worst_excess.max(excess as u64);
        assert!(
            over_rate <= allowed + (u128::from(overdraft) * interval) as i128,
            "at {at}: {over_rate} > {allowed} + overdraft {overdraft}"
        );
    }
    worst_excess
}

#[test]
fn settled_units_stay_within_the_bound_plus_the_outstanding_overdraft() {
    // 10^5 operations per run, `actual` anywhere in [0, 3 × estimate].
    let quotas = ["100/min", "10/s burst 30", "1000/h burst 50"];
    for (i, text) in quotas.iter().enumerate() {
        let gcra: Quota = text.parse().unwrap();
        let bucket: Quota = format!("{text} token-bucket").parse().unwrap();
        for concurrent in [1, 4] {
            let seed = 0x5eed + i as u64 * 7 + concurrent as u64;
            let upto_three_times =
                |e: u32, rng: &mut Rng| u32::try_from(rng.below(u64::from(e) * 3 + 1)).unwrap();
            let max_run = gcra.emission_interval_micros() * 3;
            let r = run::<GcraState>(&gcra, seed, 100_000, concurrent, max_run, upto_three_times);
            let excess = assert_within(&gcra, &r);
            assert!(
                excess > 0,
                "{text}: overdrafts never showed: the run tests nothing"
            );
            let r = run::<TokenBucketState>(
                &bucket,
                seed,
                100_000,
                concurrent,
                max_run,
                upto_three_times,
            );
            assert_within(&bucket, &r);
        }
    }
}

#[test]
fn without_overdraft_settled_units_stay_within_the_algorithms_bound() {
    let quota: Quota = "10/s burst 20".parse().unwrap();
    let at_most = |e: u32, rng: &mut Rng| u32::try_from(rng.below(u64::from(e) + 1)).unwrap();
    let r = run::<GcraState>(&quota, 99, 100_000, 8, 500_000, at_most);
    assert_eq!(assert_within(&quota, &r), 0);
}

#[test]
fn estimates_twice_the_actual_cost_still_reach_the_quota() {
    // Refunds are credited: what a reservation held and did not use is free at once.
    for text in ["100/min", "10/s burst 30", "1000/s burst 100"] {
        let quota: Quota = text.parse().unwrap();
        let interval = quota.emission_interval_micros();
        let mut ledger = Ledger::<GcraState>::default();
        let (actual, estimate) = (4_u32, 8_u32);
        let mut open: Vec<(Hold, u64)> = Vec::new();
        let start = 1_000_000_u64;
        let mut now = start;
        let mut settled = 0_u64;
        let run_us = interval * 3; // each request runs three intervals
        let end = start + interval * 200_000;
        while now < end {
            let at = Timestamp::from_micros(now);
            open.retain(|&(hold, ends)| {
                if ends <= now {
                    ledger.settle(at, hold, actual, &quota);
                    settled += u64::from(actual);
                    false
                } else {
                    true
                }
            });
            // A saturating client: reserves whenever admitted.
            while let (_, Some(hold)) = ledger.reserve(
                at,
                estimate,
                Timestamp::from_micros(now + run_us * 10),
                &quota,
            ) {
                open.push((hold, now + run_us));
            }
            now += interval / 4 + 1;
        }
        let quota_units = (end - start) / interval + u64::from(quota.burst());
        let share = settled as f64 / quota_units as f64;
        assert!(
            share >= 0.95,
            "{text}: settled {settled} of {quota_units} ({share:.3})"
        );
        assert!(settled <= quota_units, "{text}: {settled} > {quota_units}");
    }
}

#[test]
fn a_hold_never_settled_lapses_and_charges_nothing() {
    let quota = Quota::per_minute(10).unwrap();
    let mut ledger = Ledger::<GcraState>::default();
    let t = Timestamp::from_micros;
    let (_, hold) = ledger.reserve(t(0), 10, t(5_000_000), &quota);
    assert!(hold.is_some());
    assert!(
        !ledger
            .reserve(t(4_999_999), 1, t(9_000_000), &quota)
            .0
            .is_allowed()
    );
    // Lapsed: the whole quota is back, and nothing was charged.
    let (decision, _) = ledger.reserve(t(5_000_000), 10, t(9_000_000), &quota);
    assert!(decision.is_allowed());
    assert_eq!(ledger.state, GcraState::default());
    // The lapsed hold, settled late, finds itself gone: its units are charged, not its hold
    // released again (which would free the live hold's room).
    ledger.settle(t(5_000_001), hold.unwrap(), 0, &quota);
    assert_eq!(ledger.held_at(t(5_000_001)), 10);
}

#[test]
fn debt_is_repaid_before_anything_new_is_admitted() {
    let quota = Quota::per_second(10).unwrap(); // burst 10, one per 100 ms
    let mut ledger = Ledger::<GcraState>::default();
    let t = Timestamp::from_micros;
    let (_, hold) = ledger.reserve(t(0), 1, t(10_000_000), &quota);
    ledger.settle(t(0), hold.unwrap(), 25, &quota); // 15 over the burst
    assert_eq!(ledger.debt, 15);
    // 25 units, then one more: GCRA admits at most 10 + t / 100 ms by t, so not before
    // 1.6 s; the debt is charged as the state makes room, and nothing is admitted before.
    assert!(
        !ledger
            .reserve(t(1_000_000), 1, t(10_000_000), &quota)
            .0
            .is_allowed()
    );
    assert_eq!(ledger.debt, 5);
    assert!(
        !ledger
            .reserve(t(1_599_999), 1, t(10_000_000), &quota)
            .0
            .is_allowed()
    );
    let (decision, _) = ledger.reserve(t(1_600_000), 1, t(10_000_000), &quota);
    assert!(decision.is_allowed(), "{decision:?}");
    assert_eq!(ledger.debt, 0);
}

#[test]
fn a_sliding_log_ledger_holds_and_settles_like_the_others() {
    let quota: Quota = "5/min sliding-log".parse().unwrap();
    let mut ledger = Ledger::<SlidingLogState>::default();
    let t = Timestamp::from_micros;
    let (_, a) = ledger.reserve(t(0), 3, t(60_000_000), &quota);
    let (_, b) = ledger.reserve(t(0), 2, t(60_000_000), &quota);
    assert!(
        !ledger
            .reserve(t(0), 1, t(60_000_000), &quota)
            .0
            .is_allowed()
    );
    ledger.settle(t(1), a.unwrap(), 1, &quota);
    ledger.release(t(1), b.unwrap(), &quota);
    assert_eq!(ledger.state.entries.len(), 1);
    assert!(
        ledger
            .reserve(t(2), 4, t(60_000_000), &quota)
            .0
            .is_allowed()
    );
}

#[test]
fn a_key_in_debt_is_told_when_its_debt_is_repaid_and_admitted_then() {
    // One settle far over the estimate: 1,000 units on 10 a minute. A client that waits the
    // retry it is told is admitted at its first try, however few times it asked meanwhile.
    let quota = Quota::per_minute(10).unwrap(); // one unit per 6 s
    let mut ledger = Ledger::<GcraState>::default();
    let t = |s: u64| Timestamp::from_micros(1_000_000 + s * 1_000_000);
    let lapse = t(100_000);
    let (_, hold) = ledger.reserve(t(0), 1, lapse, &quota);
    ledger.settle(t(0), hold.unwrap(), 1_000, &quota);
    let (denied, _) = ledger.reserve(t(0), 1, lapse, &quota);
    let retry = denied.info().retry_after().as_secs();
    // 990 owed beyond the burst, and the unit asked for: 991 × 6 s.
    assert!((5_940..=5_950).contains(&retry), "retry after {retry} s");
    assert!(
        !ledger
            .reserve(t(retry - 60), 1, lapse, &quota)
            .0
            .is_allowed()
    );
    let (admitted, _) = ledger.reserve(t(retry), 1, lapse, &quota);
    assert!(admitted.is_allowed(), "{admitted:?}");
    // Over the whole time: 1,001 units in 5,946 s, at most 10 + 5,946 / 6 = 1,001.
}
