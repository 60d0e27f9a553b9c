//! Properties of every algorithm against its definition, and the design document's figures.

use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::Algorithm;

const SECOND: u64 = 1_000_000;

fn at_us(us: u64) -> Timestamp {
    Timestamp::from_micros(us)
}

/// One step of a trace: advance the clock by `dt_ns` (or move it back), then ask for `cost`.
#[derive(Clone, Debug)]
struct Step {
    dt_ns: u64,
    back: bool,
    cost: u32,
}

/// Runs a trace; returns (real time in ns, cost) of every admission. Real time advances with
/// the clock's forward steps and stands still while the clock steps back: the clock is then
/// wrong, and every later reading lags real time.
fn run<S: AlgorithmState>(quota: &Quota, steps: &[Step], start_ns: u64) -> Vec<(u64, u64)> {
    let mut state = S::default();
    let mut now = start_ns;
    let mut real = start_ns;
    let mut admitted = Vec::new();
    for step in steps {
        now = if step.back {
            now.saturating_sub(step.dt_ns)
        } else {
            real += step.dt_ns;
            now + step.dt_ns
        };
        if state
            .check(Timestamp::from_nanos(now), step.cost, quota)
            .is_allowed()
        {
            admitted.push((real, u64::from(step.cost)));
        }
    }
    admitted
}

/// The real times (as [`run`] counts them) at which the clock stepped back.
fn back_steps(steps: &[Step], start_ns: u64) -> Vec<u64> {
    let mut real = start_ns;
    let mut times = Vec::new();
    for step in steps {
        if step.back {
            times.push(real);
        } else {
            real += step.dt_ns;
        }
    }
    times
}

/// The most cost admitted within any closed interval of length < `span_ns`... checked against
/// `bound(length)` for every pair of admissions.
fn assert_window_bound(admitted: &[(u64, u64)], bound: impl Fn(u64) -> Option<u64>) {
    for i in 0..admitted.len() {
        let mut sum = 0;
        for &(t, cost) in &admitted[i..] {
            sum += cost;
            let length = t - admitted[i].0;
            if let Some(max) = bound(length) {
                assert!(
                    sum <= max,
                    "admitted {sum} within {length} ns (from {}), more than {max}",
                    admitted[i].0
                );
            }
        }
    }
}

fn quota_strategy(algorithm: Algorithm) -> impl Strategy<Value = Quota> {
    (1u32..=40, 1u64..=4_000, 1u32..=60).prop_map(move |(count, period_ms, burst)| {
        let period = Duration::from_millis(period_ms);
        let quota = Quota::new(count, period)
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        match algorithm {
            Algorithm::Gcra | Algorithm::TokenBucket => quota.with_burst(burst).unwrap(),
            _ => quota,
        }
    })
}

fn steps_strategy(quota: &Quota, backwards: bool) -> impl Strategy<Value = Vec<Step>> + use<> {
    let max_dt = quota.period_micros() * 1_000 / 4 + 1;
    let step = (
        0..max_dt,
        0u32..=3,
        prop::bool::weighted(if backwards { 0.1 } else { 0.0 }),
    )
        .prop_map(|(dt_ns, cost, back)| Step { dt_ns, back, cost });
    prop::collection::vec(step, 1..160)
}

/// [`quota_and_steps`] of any algorithm, the clock stepping both ways.
fn any_quota_and_steps_both_ways() -> impl Strategy<Value = (Quota, Vec<Step>, u64)> {
    prop_oneof![
        quota_and_steps(Algorithm::Gcra, true),
        quota_and_steps(Algorithm::TokenBucket, true),
        quota_and_steps(Algorithm::FixedWindow, true),
        quota_and_steps(Algorithm::SlidingWindow, true),
        quota_and_steps(Algorithm::SlidingLog, true),
    ]
}

/// [`quota_and_steps`] of any algorithm, the clock moving forward only.
fn any_quota_and_steps_forward() -> impl Strategy<Value = (Quota, Vec<Step>, u64)> {
    prop_oneof![
        quota_and_steps(Algorithm::Gcra, false),
        quota_and_steps(Algorithm::TokenBucket, false),
        quota_and_steps(Algorithm::FixedWindow, false),
        quota_and_steps(Algorithm::SlidingWindow, false),
        quota_and_steps(Algorithm::SlidingLog, false),
    ]
}

fn quota_and_steps(
    algorithm: Algorithm,
    backwards: bool,
) -> impl Strategy<Value = (Quota, Vec<Step>, u64)> {
    quota_strategy(algorithm).prop_flat_map(move |q| {
        (
            Just(q),
            steps_strategy(&q, backwards),
            0u64..1_000 * SECOND * 1_000,
        )
    })
}

/// GCRA and token bucket: within any interval of length t, at most burst + ceil(rate × t).
fn rate_bound(quota: &Quota) -> impl Fn(u64) -> Option<u64> + use<> {
    let burst = u64::from(quota.burst());
    let count = u128::from(quota.count());
    let period_ns = u128::from(quota.period_micros()) * 1_000;
    move |t| Some(burst + u64::try_from((count * u128::from(t)).div_ceil(period_ns)).unwrap())
}

/// Windows: at most `factor` × count within any interval shorter than the period.
fn window_bound(quota: &Quota, factor: u64) -> impl Fn(u64) -> Option<u64> + use<> {
    let limit = u64::from(quota.count()) * factor;
    let period_ns = quota.period_micros() * 1_000;
    move |t| (t < period_ns).then_some(limit)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn gcra_admits_at_most_burst_plus_rate((q, steps, start) in quota_and_steps(Algorithm::Gcra, true)) {
        assert_window_bound(&run::<GcraState>(&q, &steps, start), rate_bound(&q));
    }

    #[test]
    fn token_bucket_admits_at_most_burst_plus_rate((q, steps, start) in quota_and_steps(Algorithm::TokenBucket, true)) {
        assert_window_bound(&run::<TokenBucketState>(&q, &steps, start), rate_bound(&q));
    }

    #[test]
    fn fixed_window_admits_at_most_limit_per_window_and_twice_per_period(
        (q, steps, start) in quota_and_steps(Algorithm::FixedWindow, true)
    ) {
        // In real time: twice the count per period, and one more count for each step of the
        // clock back during that period or the one before (a window the clock enters again
        // after a step back is counted afresh: the price of never locking a key out for longer
        // than a period).
        let limit = u64::from(q.count());
        let period_ns = q.period_micros() * 1_000;
        let backs = back_steps(&steps, start);
        let admitted = run::<FixedWindowState>(&q, &steps, start);
        for i in 0..admitted.len() {
            let mut sum = 0;
            for &(t, cost) in &admitted[i..] {
                sum += cost;
                if t - admitted[i].0 < period_ns {
                    let from = admitted[i].0.saturating_sub(period_ns);
                    let steps_back = backs.iter().filter(|&&b| b > from && b <= t).count() as u64;
                    prop_assert!(
                        sum <= limit * (2 + steps_back),
                        "admitted {sum} within {} ns with {steps_back} steps back",
                        t - admitted[i].0
                    );
                }
            }
        }
        // Windows are aligned to the clock, so count them on a clock that never steps back.
        let period_ns = q.period_micros() * 1_000;
        let mut per_window = std::collections::HashMap::new();
        for (t, cost) in run::<FixedWindowState>(&q, &forward_only(&steps), start) {
            *per_window.entry(t / period_ns).or_insert(0) += cost;
        }
        prop_assert!(per_window.values().all(|&n| n <= u64::from(q.count())));
    }

    #[test]
    fn sliding_window_admits_at_most_twice_the_limit_per_period(
        (q, steps, start) in quota_and_steps(Algorithm::SlidingWindow, true)
    ) {
        assert_window_bound(&run::<SlidingWindowState>(&q, &steps, start), window_bound(&q, 2));
        // Windows are aligned to the clock, so count them on a clock that never steps back.
        let period_ns = q.period_micros() * 1_000;
        let mut per_window = std::collections::HashMap::new();
        for (t, cost) in run::<SlidingWindowState>(&q, &forward_only(&steps), start) {
            *per_window.entry(t / period_ns).or_insert(0) += cost;
        }
        prop_assert!(per_window.values().all(|&n| n <= u64::from(q.count())));
    }

    #[test]
    fn sliding_log_admits_at_most_limit_per_period(
        (q, steps, start) in quota_and_steps(Algorithm::SlidingLog, true)
    ) {
        assert_window_bound(&run::<SlidingLogState>(&q, &steps, start), window_bound(&q, 1));
    }

    #[test]
    fn an_earlier_reading_never_admits_what_the_latest_would_deny(
        (q, steps, start) in any_quota_and_steps_both_ways(),
        back_ns in 0u64..5_000_000_000,
        cost in 0u32..=4,
    ) {
        let monotone = match q.algorithm() {
            Algorithm::Gcra => earlier_is_stricter::<GcraState>(&q, &steps, start, back_ns, cost),
            Algorithm::TokenBucket => earlier_is_stricter::<TokenBucketState>(&q, &steps, start, back_ns, cost),
            Algorithm::FixedWindow => earlier_is_stricter::<FixedWindowState>(&q, &steps, start, back_ns, cost),
            Algorithm::SlidingWindow => earlier_is_stricter::<SlidingWindowState>(&q, &steps, start, back_ns, cost),
            Algorithm::SlidingLog => earlier_is_stricter::<SlidingLogState>(&q, &steps, start, back_ns, cost),
        };
        prop_assert!(monotone);
    }

    #[test]
    fn retry_after_is_exact_for_gcra((q, steps, start) in quota_and_steps(Algorithm::Gcra, false)) {
        retry_after_is_exact::<GcraState>(&q, &steps, start)?;
    }

    #[test]
    fn retry_after_is_exact_for_token_bucket((q, steps, start) in quota_and_steps(Algorithm::TokenBucket, false)) {
        retry_after_is_exact::<TokenBucketState>(&q, &steps, start)?;
    }

    #[test]
    fn retry_after_is_exact_for_fixed_window((q, steps, start) in quota_and_steps(Algorithm::FixedWindow, false)) {
        retry_after_is_exact::<FixedWindowState>(&q, &steps, start)?;
    }

    #[test]
    fn retry_after_is_exact_for_sliding_window((q, steps, start) in quota_and_steps(Algorithm::SlidingWindow, false)) {
        retry_after_is_exact::<SlidingWindowState>(&q, &steps, start)?;
    }

    #[test]
    fn retry_after_is_exact_for_sliding_log((q, steps, start) in quota_and_steps(Algorithm::SlidingLog, false)) {
        retry_after_is_exact::<SlidingLogState>(&q, &steps, start)?;
    }

    #[test]
    fn frozen_clock_admits_exactly_the_burst(
        q in prop_oneof![
            quota_strategy(Algorithm::Gcra),
            quota_strategy(Algorithm::TokenBucket),
            quota_strategy(Algorithm::FixedWindow),
            quota_strategy(Algorithm::SlidingWindow),
            quota_strategy(Algorithm::SlidingLog),
        ],
        now in any::<u64>(),
    ) {
        let now = Timestamp::from_nanos(now / 2);
        let admitted = match q.algorithm() {
            Algorithm::Gcra => frozen::<GcraState>(&q, now),
            Algorithm::TokenBucket => frozen::<TokenBucketState>(&q, now),
            Algorithm::FixedWindow => frozen::<FixedWindowState>(&q, now),
            Algorithm::SlidingWindow => frozen::<SlidingWindowState>(&q, now),
            Algorithm::SlidingLog => frozen::<SlidingLogState>(&q, now),
        };
        prop_assert_eq!(admitted, u64::from(q.burst()));
    }

    #[test]
    fn extreme_inputs_never_panic(
        now in prop_oneof![Just(u64::MAX), Just(0u64), any::<u64>()],
        cost in prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>()],
        fields in any::<[u64; 3]>(),
        q in prop_oneof![
            Just(Quota::per_second(1_000_000).unwrap()),
            Just(Quota::per_second(1_000_000).unwrap().with_algorithm(Algorithm::TokenBucket).unwrap()),
            Just(Quota::new(999_999_999, Duration::from_secs(1_000)).unwrap()),
            Just(Quota::new(u32::MAX, Duration::from_secs(366 * 86_400)).unwrap()),
            Just(Quota::new(1, Duration::from_micros(1)).unwrap()),
            Just(Quota::new(4_000_000, Duration::from_secs(4)).unwrap()),
        ],
    ) {
        let now = Timestamp::from_nanos(now);
        for algorithm in Algorithm::ALL {
            let Ok(q) = q.with_algorithm(algorithm) else { continue };
            let [a, b, c] = fields;
            exercise(GcraState { tat: a }, now, cost, &q);
            exercise(TokenBucketState { used: a, last: b }, now, cost, &q);
            exercise(FixedWindowState { window: a, count: b }, now, cost, &q);
            exercise(SlidingWindowState { window: a, current: b, previous: c }, now, cost, &q);
            exercise(SlidingLogState { entries: [a, b, c].into() }, now, cost.min(5_000), &q);
        }
    }
}

fn exercise<S: AlgorithmState>(mut state: S, now: Timestamp, cost: u32, quota: &Quota) {
    let _ = state.peek(now, quota);
    let _ = state.check(now, cost, quota);
    let _ = state.check(now, 1, quota);
    let _ = state.fresh_at(quota);
}

fn frozen<S: AlgorithmState>(quota: &Quota, now: Timestamp) -> u64 {
    let mut state = S::default();
    (0..u64::from(quota.burst()) * 2 + 10)
        .filter(|_| state.check(now, 1, quota).is_allowed())
        .count() as u64
}

/// After any trace, a denial's retry time is exact: admitted at now + retry_after, denied 1 ns
/// before.
fn retry_after_is_exact<S: AlgorithmState>(
    quota: &Quota,
    steps: &[Step],
    start: u64,
) -> Result<(), TestCaseError> {
    let mut state = S::default();
    let mut now = start;
    for step in steps {
        now += step.dt_ns;
        let before = state.clone();
        if let Decision::Denied(info) = state.check(Timestamp::from_nanos(now), step.cost, quota) {
            let retry = u64::try_from(info.retry_after().as_nanos()).unwrap();
            prop_assert!(retry > 0);
            let mut later = before.clone();
            let then = Timestamp::from_nanos(now + retry);
            prop_assert!(
                later.check(then, step.cost, quota).is_allowed(),
                "not admitted at retry_after {retry}"
            );
            let mut earlier = before;
            let just_before = Timestamp::from_nanos(now + retry - 1);
            prop_assert!(
                !earlier.check(just_before, step.cost, quota).is_allowed(),
                "admitted 1 ns before retry_after {retry}"
            );
        }
    }
    Ok(())
}

#[test]
fn fixed_window_admits_200_within_one_second_across_a_boundary() {
    // The design document: 100/min, 100 requests at 59 s and 100 at 60 s.
    let quota: Quota = "100/min fixed-window".parse().unwrap();
    let mut state = FixedWindowState::default();
    let mut admitted = 0;
    for t in [59 * SECOND + 500_000, 60 * SECOND] {
        for _ in 0..150 {
            admitted += u32::from(state.check(at_us(t), 1, &quota).is_allowed());
        }
    }
    assert_eq!(admitted, 200);
}

#[test]
fn sliding_window_estimate_one_second_into_a_minute() {
    // The design document: count ≈ current + previous × (60 − 1) / 60 at T = 61 s.
    let quota: Quota = "1000/min sliding-window".parse().unwrap();
    let mut state = SlidingWindowState::default();
    for _ in 0..600 {
        assert!(state.check(at_us(30 * SECOND), 1, &quota).is_allowed());
    }
    for _ in 0..50 {
        assert!(
            state
                .check(at_us(60 * SECOND + 500_000), 1, &quota)
                .is_allowed()
        );
    }
    // 50 + 600 × 59/60 = 50 + 590 = 640
    let info = *state.peek(at_us(61 * SECOND), &quota).info();
    assert_eq!(info.remaining(), 1000 - 640);
    // The boundary case from the document: 100 at 59 s and 100 at 60 s under 100/min.
    let quota: Quota = "100/min sliding-window".parse().unwrap();
    let mut state = SlidingWindowState::default();
    assert!(state.check(at_us(59 * SECOND), 100, &quota).is_allowed());
    // At exactly 60 s the previous window still weighs fully: nothing more is admitted...
    assert!(!state.check(at_us(60 * SECOND), 1, &quota).is_allowed());
    // ...and 30 s in, half of it has decayed.
    assert_eq!(
        state.peek(at_us(90 * SECOND), &quota).info().remaining(),
        50
    );
}

#[test]
fn token_bucket_admits_capacity_at_once_then_the_rate() {
    // The design document: capacity 100, refilling 10/s.
    let quota: Quota = "10/s burst 100 token-bucket".parse().unwrap();
    let mut state = TokenBucketState::default();
    let mut per_second = [0u32; 6];
    for ms in 0..6_000u64 {
        // one request per millisecond for six seconds
        if state.check(at_us(ms * 1_000), 1, &quota).is_allowed() {
            per_second[(ms / 1_000) as usize] += 1;
        }
    }
    assert_eq!(per_second, [100 + 9, 10, 10, 10, 10, 10]);
}

#[test]
fn a_cost_above_the_burst_is_insufficient_capacity_not_a_retry() {
    let quota = Quota::per_second(10).unwrap();
    let mut state = GcraState::default();
    let decision = state.check(at_us(0), 11, &quota);
    assert!(matches!(decision, Decision::InsufficientCapacity(_)));
    assert_eq!(decision.info().retry_after(), Duration::ZERO);
    assert_eq!(state, GcraState::default());
}

#[test]
fn headers_figures_for_gcra() {
    let quota = Quota::per_minute(60).unwrap();
    let mut state = GcraState::default();
    let now = at_us(1_000 * SECOND);
    let allowed = state.check(now, 1, &quota);
    assert_eq!(allowed.info().limit(), 60);
    assert_eq!(allowed.info().remaining(), 59);
    assert_eq!(allowed.info().reset_after(), Duration::from_secs(1));
    for _ in 0..59 {
        assert!(state.check(now, 1, &quota).is_allowed());
    }
    let denied = state.check(now, 1, &quota);
    assert_eq!(denied.info().remaining(), 0);
    assert_eq!(denied.info().retry_after(), Duration::from_secs(1));
    assert_eq!(denied.info().reset_after(), Duration::from_secs(60));
    assert_eq!(state.fresh_at(&quota), 1_060 * SECOND);
}

#[test]
fn fresh_at_means_fresh() {
    // Past fresh_at, every algorithm's state decides exactly like a default one.
    fn check<S: AlgorithmState + std::fmt::Debug>(quota: &Quota) {
        let mut state = S::default();
        let mut t = 5 * SECOND + 123;
        for i in 0..50u64 {
            let _ = state.check(at_us(t), 1 + (i % 3) as u32, quota);
            t += 37_000 * (i % 4);
        }
        let fresh_at = state.fresh_at(quota).max(t);
        for dt in [0, 1, 999_999] {
            let now = at_us(fresh_at + dt);
            for cost in [1, 2, 5] {
                let mut a = state.clone();
                let mut b = S::default();
                assert_eq!(
                    a.check(now, cost, quota),
                    b.check(now, cost, quota),
                    "{a:?}"
                );
            }
        }
    }
    let base = Quota::per_second(5).unwrap();
    check::<GcraState>(&base.with_burst(7).unwrap());
    check::<TokenBucketState>(&base.with_algorithm(Algorithm::TokenBucket).unwrap());
    check::<FixedWindowState>(&base.with_algorithm(Algorithm::FixedWindow).unwrap());
    check::<SlidingWindowState>(&base.with_algorithm(Algorithm::SlidingWindow).unwrap());
    check::<SlidingLogState>(&base.with_algorithm(Algorithm::SlidingLog).unwrap());
}

/// After a trace whose latest reading is `max`, a check at `max - back` is admitted only if the
/// same check at `max` would be.
/// Runs a trace with clock steps both ways from `start`: the state after it and the latest
/// reading.
fn replay<S: AlgorithmState>(quota: &Quota, steps: &[Step], start: u64) -> (S, u64) {
    let mut state = S::default();
    let (mut now, mut max) = (start, start);
    for step in steps {
        now = if step.back {
            now.saturating_sub(step.dt_ns)
        } else {
            now + step.dt_ns
        };
        max = max.max(now);
        let _ = state.check(Timestamp::from_nanos(now), step.cost, quota);
    }
    (state, max)
}

fn earlier_is_stricter<S: AlgorithmState>(
    quota: &Quota,
    steps: &[Step],
    start: u64,
    back: u64,
    cost: u32,
) -> bool {
    let (mut state, max) = replay::<S>(quota, steps, start);
    let earlier = state
        .clone()
        .check(Timestamp::from_nanos(max.saturating_sub(back)), cost, quota);
    let latest = state.check(Timestamp::from_nanos(max), cost, quota);
    !earlier.is_allowed() || latest.is_allowed()
}

fn forward_only(steps: &[Step]) -> Vec<Step> {
    steps.iter().filter(|s| !s.back).cloned().collect()
}

#[test]
fn state_sizes() {
    // The per-key state each algorithm stores (BENCHMARKS.md lists these).
    assert_eq!(std::mem::size_of::<GcraState>(), 8);
    assert_eq!(std::mem::size_of::<TokenBucketState>(), 16);
    assert_eq!(std::mem::size_of::<FixedWindowState>(), 16);
    assert_eq!(std::mem::size_of::<SlidingWindowState>(), 24);
    // plus 8 bytes per logged unit, at most `count` of them
    assert_eq!(std::mem::size_of::<SlidingLogState>(), 32);
}

/// The longest a state of `quota` takes to equal a fresh one, in µs (its horizon): GCRA and the
/// token bucket refill a whole burst, a fixed window and a log forget after one period, a
/// sliding window after two.
fn horizon_us(quota: &Quota) -> u64 {
    match quota.algorithm() {
        Algorithm::Gcra | Algorithm::TokenBucket => quota.tolerance_micros(),
        Algorithm::SlidingWindow => 2 * quota.period_micros(),
        _ => quota.period_micros(),
    }
}

/// After a trace with clock steps both ways, a check at any reading (earlier than the latest,
/// say after a failover to a host whose clock is behind) is never denied for longer than the
/// quota's horizon, and never reports a reset further away.
fn never_locked_out_past_the_horizon<S: AlgorithmState>(
    quota: &Quota,
    steps: &[Step],
    start: u64,
    back: u64,
    cost: u32,
) -> Result<(), TestCaseError> {
    let (mut state, max) = replay::<S>(quota, steps, start);
    // A stamp is rounded up to the microsecond: allow that one.
    let horizon = Duration::from_micros(horizon_us(quota) + 1);
    let at = Timestamp::from_nanos(max.saturating_sub(back));
    let decision = state.check(at, cost, quota);
    prop_assert!(
        decision.info().reset_after() <= horizon,
        "reset after {:?}, horizon {horizon:?}",
        decision.info().reset_after()
    );
    // A client that retries when told is admitted within the horizon: every denial on the way
    // says so, and none moves the end (reproduced: GCRA said "retry in 100 ms" for an hour,
    // the step's length, because a denial never wrote the pulled-back state).
    let mut decision = decision;
    let mut now = at;
    while let Decision::Denied(info) = decision {
        now = now.saturating_add(info.retry_after().max(Duration::from_nanos(1)));
        let waited = Duration::from_nanos(now.as_nanos() - at.as_nanos());
        prop_assert!(
            waited <= horizon,
            "still denied after {waited:?} (told {:?}), horizon {horizon:?}",
            info.retry_after()
        );
        decision = state.check(now, cost, quota);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn a_clock_stepping_back_never_denies_longer_than_the_horizon(
        (q, steps, start) in any_quota_and_steps_both_ways(),
        back_ns in prop_oneof![0u64..5_000_000_000, 0u64..3_600_000_000_000],
        cost in 1u32..=3,
    ) {
        match q.algorithm() {
            Algorithm::Gcra => never_locked_out_past_the_horizon::<GcraState>(&q, &steps, start, back_ns, cost)?,
            Algorithm::TokenBucket => never_locked_out_past_the_horizon::<TokenBucketState>(&q, &steps, start, back_ns, cost)?,
            Algorithm::FixedWindow => never_locked_out_past_the_horizon::<FixedWindowState>(&q, &steps, start, back_ns, cost)?,
            Algorithm::SlidingWindow => never_locked_out_past_the_horizon::<SlidingWindowState>(&q, &steps, start, back_ns, cost)?,
            Algorithm::SlidingLog => never_locked_out_past_the_horizon::<SlidingLogState>(&q, &steps, start, back_ns, cost)?,
        }
    }
}

#[test]
fn a_failover_to_a_clock_an_hour_behind_never_locks_a_key_out() {
    // A key spends its quota on a node, then the store fails over to one whose clock is an
    // hour behind: it waits at most the quota's own horizon, not an hour more.
    for algorithm in Algorithm::ALL {
        let quota = Quota::per_second(10)
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap();
        let before = at_us(10_000 * SECOND);
        let after = at_us(10_000 * SECOND - 3_600 * SECOND);
        let horizon = Duration::from_micros(horizon_us(&quota) + 1);
        let check = |state: &mut dyn FnMut(Timestamp, u32) -> Decision| {
            for _ in 0..10 {
                assert!(state(before, 1).is_allowed(), "{algorithm}");
            }
            let denied = state(after, 1);
            assert!(
                denied.info().retry_after() <= horizon,
                "{algorithm}: locked out for {:?}",
                denied.info().retry_after()
            );
        };
        match algorithm {
            Algorithm::Gcra => {
                let mut s = GcraState::default();
                check(&mut |t, c| s.check(t, c, &quota));
            }
            Algorithm::TokenBucket => {
                let mut s = TokenBucketState::default();
                check(&mut |t, c| s.check(t, c, &quota));
            }
            Algorithm::FixedWindow => {
                let mut s = FixedWindowState::default();
                check(&mut |t, c| s.check(t, c, &quota));
            }
            Algorithm::SlidingWindow => {
                let mut s = SlidingWindowState::default();
                check(&mut |t, c| s.check(t, c, &quota));
            }
            _ => {
                let mut s = SlidingLogState::default();
                check(&mut |t, c| s.check(t, c, &quota));
            }
        }
    }
}

/// Follows a client that retries when told, from `at`: how long until it is admitted.
fn admitted_after<S: AlgorithmState>(mut state: S, quota: &Quota, at: Timestamp) -> Duration {
    let mut now = at;
    for _ in 0..1_000 {
        match state.check(now, 1, quota) {
            Decision::Denied(info) => {
                now = now.saturating_add(info.retry_after().max(Duration::from_nanos(1)));
            }
            _ => return Duration::from_nanos(now.as_nanos() - at.as_nanos()),
        }
    }
    Duration::MAX
}

#[test]
fn a_state_a_store_could_not_have_written_is_spent_now_never_longer() {
    // What a lying or hand-edited store can hold: stamps far in the future, counts past the
    // quota's. Each reads as a key spent now, refilled within the quota's horizon.
    let now = Timestamp::from_micros(1_700_000_000_000_000);
    let n = now.as_micros();
    let far = 9_000_000_000_000_000; // year 2255, below 2^53
    let quota = |algorithm| {
        Quota::per_second(10)
            .unwrap()
            .with_algorithm(algorithm)
            .unwrap()
    };
    let second = Duration::from_secs(1);
    let gcra = quota(Algorithm::Gcra);
    assert!(admitted_after(GcraState { tat: far }, &gcra, now) <= second);
    let bucket = quota(Algorithm::TokenBucket);
    for last in [n, far] {
        let state = TokenBucketState {
            used: 4_000_000_000_000,
            last,
        };
        let waited = admitted_after(state, &bucket, now);
        assert!(
            waited <= second,
            "used past capacity, last {last}: {waited:?}"
        );
    }
    let fixed = quota(Algorithm::FixedWindow);
    let state = FixedWindowState {
        window: far / 1_000_000,
        count: far,
    };
    assert!(admitted_after(state, &fixed, now) <= second);
    let sliding = quota(Algorithm::SlidingWindow);
    let state = SlidingWindowState {
        window: far / 1_000_000,
        current: far,
        previous: far,
    };
    assert!(admitted_after(state, &sliding, now) <= 2 * second);
    let log = quota(Algorithm::SlidingLog);
    let state = SlidingLogState {
        entries: std::iter::repeat_n(far, 10).collect(),
    };
    assert!(admitted_after(state, &log, now) <= second);
}

/// Runs `steps` on `state` from `start_ns`, returning every decision.
fn decisions<S: AlgorithmState>(
    mut state: S,
    quota: &Quota,
    steps: &[Step],
    start_ns: u64,
) -> Vec<Decision> {
    let mut now = start_ns;
    steps
        .iter()
        .map(|step| {
            now += step.dt_ns;
            state.check(Timestamp::from_nanos(now), step.cost, quota)
        })
        .collect()
}

/// A check refunded at once leaves a state that decides every later check as the state that
/// never saw it.
fn an_immediate_refund_is_exact<S: AlgorithmState>(
    quota: &Quota,
    steps: &[Step],
    charge: u32,
    start: u64,
) -> Result<(), TestCaseError> {
    let (before, after) = steps.split_at(steps.len() / 2);
    let (mut state, now) = replay::<S>(quota, before, start);
    let without = state.clone();
    let at = Timestamp::from_nanos(now);
    if state.check(at, charge, quota).is_allowed() {
        state.refund(at, at, charge, quota);
    }
    prop_assert_eq!(
        decisions(state, quota, after, now),
        decisions(without, quota, after, now)
    );
    Ok(())
}

/// A check refunded after others were decided and time passed: at the refund, the state
/// admits no more than the state that never saw the charge (checks in between that the two
/// would decide differently end the comparison there).
fn a_late_refund_is_never_more_lenient<S: AlgorithmState>(
    quota: &Quota,
    steps: &[Step],
    charge: u32,
    start: u64,
) -> Result<(), TestCaseError> {
    let (before, between) = steps.split_at(steps.len() / 2);
    let (mut with, mut now) = replay::<S>(quota, before, start);
    let mut without = with.clone();
    let charged_at = Timestamp::from_nanos(now);
    if !with.check(charged_at, charge, quota).is_allowed() {
        return Ok(());
    }
    for step in between {
        let at = Timestamp::from_nanos(now + step.dt_ns);
        let (mut a, mut b) = (with.clone(), without.clone());
        if a.check(at, step.cost, quota).is_allowed() != b.check(at, step.cost, quota).is_allowed()
        {
            break;
        }
        (with, without, now) = (a, b, now + step.dt_ns);
    }
    let at = Timestamp::from_nanos(now);
    with.refund(at, charged_at, charge, quota);
    let room = |mut state: S| {
        (0..=quota.burst().max(quota.count()))
            .take_while(|_| state.check(at, 1, quota).is_allowed())
            .count()
    };
    prop_assert!(
        room(with) <= room(without),
        "more room after the refund than without the charge"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn an_immediate_refund_undoes_its_charge(
        (q, steps, start) in any_quota_and_steps_forward(),
        charge in 0u32..6,
    ) {
        match q.algorithm() {
            Algorithm::Gcra => an_immediate_refund_is_exact::<GcraState>(&q, &steps, charge, start)?,
            Algorithm::TokenBucket => an_immediate_refund_is_exact::<TokenBucketState>(&q, &steps, charge, start)?,
            Algorithm::FixedWindow => an_immediate_refund_is_exact::<FixedWindowState>(&q, &steps, charge, start)?,
            Algorithm::SlidingWindow => an_immediate_refund_is_exact::<SlidingWindowState>(&q, &steps, charge, start)?,
            Algorithm::SlidingLog => an_immediate_refund_is_exact::<SlidingLogState>(&q, &steps, charge, start)?,
        }
    }

    #[test]
    fn a_late_refund_never_gives_more_room_than_no_charge(
        (q, steps, start) in any_quota_and_steps_forward(),
        charge in 0u32..6,
    ) {
        match q.algorithm() {
            Algorithm::Gcra => a_late_refund_is_never_more_lenient::<GcraState>(&q, &steps, charge, start)?,
            Algorithm::TokenBucket => a_late_refund_is_never_more_lenient::<TokenBucketState>(&q, &steps, charge, start)?,
            Algorithm::FixedWindow => a_late_refund_is_never_more_lenient::<FixedWindowState>(&q, &steps, charge, start)?,
            Algorithm::SlidingWindow => a_late_refund_is_never_more_lenient::<SlidingWindowState>(&q, &steps, charge, start)?,
            Algorithm::SlidingLog => a_late_refund_is_never_more_lenient::<SlidingLogState>(&q, &steps, charge, start)?,
        }
    }
}
