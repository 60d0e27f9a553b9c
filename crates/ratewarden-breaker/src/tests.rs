//! The breaker's state machine, driven by a scripted store and a manual clock; loom models.

use std::future::{Future, pending};
use std::pin::pin;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use ratewarden_core::{
    Decision, Info, Key, ManualClock, Quota, Store, StoreError, StoreErrorKind, Timestamp,
};

use crate::{BreakerState, CircuitBreaker, CircuitBreakerBuilder};

const ALLOW: u8 = 0;
const DENY: u8 = 1;
const TIMEOUT: u8 = 2;
const WRONG_TYPE: u8 = 3;
const HANG: u8 = 4;

/// A store that answers as told and counts its calls.
#[derive(Debug, Default)]
struct Scripted {
    mode: AtomicU8,
    calls: AtomicU32,
}

impl Scripted {
    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }
    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Store for Scripted {
    async fn check(&self, _: &Key, _: &Quota, _: u32) -> Result<Decision, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let info = Info::new(1, 0, Duration::ZERO, Duration::ZERO);
        match self.mode.load(Ordering::SeqCst) {
            ALLOW => Ok(Decision::Allowed(info)),
            DENY => Ok(Decision::Denied(info)),
            TIMEOUT => Err(StoreError::new(StoreErrorKind::Timeout)),
            WRONG_TYPE => Err(StoreError::new(StoreErrorKind::CorruptState)),
            _ => pending().await,
        }
    }
    async fn peek(&self, key: &Key, quota: &Quota) -> Result<Decision, StoreError> {
        self.check(key, quota, 0).await
    }
    async fn reset(&self, _: &Key, _: &Quota) -> Result<(), StoreError> {
        Ok(())
    }
}

fn breaker() -> (CircuitBreaker<Scripted, ManualClock>, ManualClock) {
    let (builder, clock) = configured();
    (builder.build().unwrap(), clock)
}

/// The tests' settings, for a test to change before building.
fn configured() -> (CircuitBreakerBuilder<Scripted, ManualClock>, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_nanos(1_000_000_000));
    let builder = CircuitBreaker::builder(Scripted::default())
        .failure_threshold(3)
        .without_failure_rate() // off unless a test turns it on
        .backoff(Duration::from_secs(1), Duration::from_secs(4))
        .clock(clock.clone());
    (builder, clock)
}

/// Polls once: every scripted answer but HANG is ready at once.
fn now<F: Future>(future: F) -> Poll<F::Output> {
    pin!(future)
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

fn check<C: ratewarden_core::Clock>(
    breaker: &CircuitBreaker<Scripted, C>,
) -> Result<Decision, StoreError> {
    let (key, quota) = (Key::from(1_u64), Quota::per_second(1).expect("quota"));
    if let Some(result) = breaker.check_ready(&key, &quota, 1) {
        return result;
    }
    match now(breaker.check(&key, &quota, 1)) {
        Poll::Ready(result) => result,
        Poll::Pending => panic!("the scripted store hung"),
    }
}

fn kind(result: Result<Decision, StoreError>) -> Option<StoreErrorKind> {
    result.err().map(|e| e.kind())
}

#[test]
fn opens_after_the_threshold_and_stops_calling_the_store() {
    let (breaker, _) = breaker();
    breaker.get_ref().set(TIMEOUT);
    for _ in 0..3 {
        assert_eq!(kind(check(&breaker)), Some(StoreErrorKind::Timeout));
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    for _ in 0..100 {
        assert_eq!(kind(check(&breaker)), Some(StoreErrorKind::CircuitOpen));
    }
    assert_eq!(
        breaker.get_ref().calls(),
        3,
        "an open breaker never asks the store"
    );
}

#[test]
fn a_success_resets_the_consecutive_count() {
    let (breaker, _) = breaker();
    for _ in 0..10 {
        breaker.get_ref().set(TIMEOUT);
        check(&breaker).unwrap_err();
        check(&breaker).unwrap_err();
        breaker.get_ref().set(ALLOW);
        check(&breaker).expect("allowed");
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[test]
fn denials_and_errors_about_one_key_are_not_failures() {
    let (breaker, _) = breaker();
    for mode in [DENY, WRONG_TYPE] {
        breaker.get_ref().set(mode);
        for _ in 0..50 {
            let _ = check(&breaker);
        }
        assert_eq!(breaker.state(), BreakerState::Closed);
    }
    assert_eq!(breaker.get_ref().calls(), 100);
}

#[test]
fn backoff_doubles_up_to_the_cap_with_at_most_a_quarter_of_jitter() {
    let (breaker, clock) = breaker();
    breaker.get_ref().set(TIMEOUT);
    for _ in 0..3 {
        check(&breaker).unwrap_err();
    }
    // Open for (0.75..=1) × backoff: 1 s, then 2 s, then 4 s, then 4 s (the cap).
    for backoff_ms in [1_000, 2_000, 4_000, 4_000] {
        clock.advance(Duration::from_millis(backoff_ms * 3 / 4 - 1));
        assert_eq!(
            breaker.state(),
            BreakerState::Open,
            "backoff {backoff_ms} ms"
        );
        let calls = breaker.get_ref().calls();
        assert_eq!(kind(check(&breaker)), Some(StoreErrorKind::CircuitOpen));
        clock.advance(Duration::from_millis(backoff_ms / 4 + 1));
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        // The probe fails: open again, for twice as long.
        assert_eq!(kind(check(&breaker)), Some(StoreErrorKind::Timeout));
        assert_eq!(breaker.get_ref().calls(), calls + 1, "exactly one probe");
        assert_eq!(breaker.state(), BreakerState::Open);
    }
}

#[test]
fn a_successful_probe_closes_and_resets_the_backoff() {
    let (breaker, clock) = breaker();
    breaker.get_ref().set(TIMEOUT);
    for _ in 0..3 {
        check(&breaker).unwrap_err();
    }
    clock.advance(Duration::from_secs(1));
    check(&breaker).unwrap_err(); // probe fails: 2 s
    clock.advance(Duration::from_secs(2));
    breaker.get_ref().set(DENY); // a denial is a healthy answer
    assert!(!check(&breaker).expect("decided").is_allowed());
    assert_eq!(breaker.state(), BreakerState::Closed);
    // Failing again starts from the base backoff, not 4 s.
    breaker.get_ref().set(TIMEOUT);
    for _ in 0..3 {
        check(&breaker).unwrap_err();
    }
    clock.advance(Duration::from_secs(1));
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
}

#[test]
fn half_open_admits_one_probe_and_a_cancelled_probe_gives_its_place_back() {
    let (breaker, clock) = breaker();
    breaker.get_ref().set(TIMEOUT);
    for _ in 0..3 {
        check(&breaker).unwrap_err();
    }
    clock.advance(Duration::from_secs(1));
    breaker.get_ref().set(HANG);
    let (key, quota) = (Key::from(1_u64), Quota::per_second(1).expect("quota"));
    {
        let mut probe = Box::pin(breaker.check(&key, &quota, 1));
        assert!(
            now(probe.as_mut()).is_pending(),
            "the probe waits on the store"
        );
        // While it is out, everyone else fails fast.
        assert_eq!(kind(check(&breaker)), Some(StoreErrorKind::CircuitOpen));
        // The request is cancelled: the probe is dropped.
    }
    breaker.get_ref().set(ALLOW);
    assert!(check(&breaker).expect("a new probe").is_allowed());
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[test]
fn opens_on_a_failure_rate_without_consecutive_failures() {
    let (builder, _) = configured();
    let breaker = builder
        .failure_rate(0.5, Duration::from_secs(10), 20)
        .build()
        .unwrap();
    for i in 0..20 {
        assert_eq!(breaker.state(), BreakerState::Closed, "call {i}");
        // Every other call fails, the 20th among them: 10 of 20.
        breaker
            .get_ref()
            .set(if i % 2 == 1 { TIMEOUT } else { ALLOW });
        let _ = check(&breaker);
    }
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[test]
fn the_failure_rate_window_forgets_old_calls() {
    let (builder, clock) = configured();
    let breaker = builder
        .failure_rate(0.5, Duration::from_secs(10), 20)
        .build()
        .unwrap();
    for i in 0..100 {
        breaker
            .get_ref()
            .set(if i % 2 == 0 { TIMEOUT } else { ALLOW });
        let _ = check(&breaker);
        if i % 10 == 9 {
            // 10 calls per window: never the 20 the rule needs.
            clock.advance(Duration::from_secs(10));
        }
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
}

/// Sets the scripted store to `mode` and starts a check, polled once (a probe that hangs stays
/// pending): the future, to drop (cancel) or keep.
fn start<'a, C: ratewarden_core::Clock>(
    breaker: &'a CircuitBreaker<Scripted, C>,
    mode: u8,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + 'a>> {
    static KEY: std::sync::LazyLock<Key> = std::sync::LazyLock::new(|| Key::from(1_u64));
    static QUOTA: std::sync::LazyLock<Quota> =
        std::sync::LazyLock::new(|| Quota::per_second(1).expect("quota"));
    breaker.get_ref().set(mode);
    let mut future = Box::pin(breaker.check(&KEY, &QUOTA, 1));
    let _ = now(future.as_mut());
    future
}

#[test]
fn a_probe_cancelled_late_never_lets_more_probes_through_than_configured() {
    // Reproduced: a probe of an earlier half-open period, cancelled during a later one, gave
    // that later period's place back: more probes at once than configured.
    let (builder, clock) = configured();
    let breaker = builder.probes(2).build().unwrap();
    breaker.get_ref().set(TIMEOUT);
    for _ in 0..3 {
        check(&breaker).unwrap_err();
    }
    clock.advance(Duration::from_secs(1));
    // Half-open: one probe hangs, the other fails and opens the breaker again (2 s).
    let hanging = start(&breaker, HANG);
    let calls = breaker.get_ref().calls();
    breaker.get_ref().set(TIMEOUT);
    assert_eq!(kind(check(&breaker)), Some(StoreErrorKind::Timeout));
    assert_eq!(breaker.state(), BreakerState::Open);
    clock.advance(Duration::from_secs(2));
    // Half-open again: two probes hang.
    let second = start(&breaker, HANG);
    let third = start(&breaker, HANG);
    assert_eq!(breaker.get_ref().calls(), calls + 3);
    breaker.get_ref().set(TIMEOUT);
    assert_eq!(kind(check(&breaker)), Some(StoreErrorKind::CircuitOpen));
    // The first period's probe is cancelled: no place of this period is given back.
    drop(hanging);
    assert_eq!(
        kind(check(&breaker)),
        Some(StoreErrorKind::CircuitOpen),
        "a third probe at once, with two configured"
    );
    assert_eq!(breaker.get_ref().calls(), calls + 3);
    drop((second, third));
}

#[test]
fn a_probe_that_never_answers_does_not_hold_the_breaker_half_open() {
    // Reproduced: a probe to a store without a deadline of its own could hang forever, and
    // the breaker stayed half-open (refusing everyone) as long.
    let (breaker, clock) = breaker();
    breaker.get_ref().set(TIMEOUT);
    for _ in 0..3 {
        check(&breaker).unwrap_err();
    }
    clock.advance(Duration::from_secs(1));
    let _hanging = start(&breaker, HANG);
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    // Past the probe's time, it counts as failed: open again, then probe again.
    clock.advance(Duration::from_secs(10));
    let _ = check(&breaker);
    clock.advance(Duration::from_secs(5));
    breaker.get_ref().set(ALLOW);
    assert!(check(&breaker).expect("a new probe").is_allowed());
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[test]
fn settings_that_cannot_work_are_refused_when_built_never_clamped() {
    // Reproduced: `probe_timeout(Duration::ZERO)` was accepted (then raised to 1 ms), and a
    // zero one had made every call that came while a probe ran open the breaker again.
    let refused = |setting: &str, builder: CircuitBreakerBuilder<Scripted, ManualClock>| {
        match builder.build() {
            Err(crate::ConfigError::Invalid { setting: named, .. }) => assert_eq!(named, setting),
            Ok(_) => panic!("{setting} accepted"),
        }
    };
    refused(
        "probe_timeout",
        configured().0.probe_timeout(Duration::ZERO),
    );
    refused("failure_threshold", configured().0.failure_threshold(0));
    refused("probes", configured().0.probes(0));
    refused(
        "backoff",
        configured()
            .0
            .backoff(Duration::ZERO, Duration::from_secs(1)),
    );
    refused(
        "backoff",
        configured()
            .0
            .backoff(Duration::from_secs(2), Duration::from_secs(1)),
    );
    for (ratio, window, calls) in [
        (f64::NAN, Duration::from_secs(1), 1),
        (1.5, Duration::from_secs(1), 1),
        (-0.1, Duration::from_secs(1), 1),
        (0.5, Duration::ZERO, 1),
        (0.5, Duration::from_secs(1), 0),
    ] {
        refused(
            "failure_rate",
            configured().0.failure_rate(ratio, window, calls),
        );
    }
    assert!(
        configured()
            .0
            .probe_timeout(Duration::from_millis(1))
            .build()
            .is_ok()
    );
}

/// Fails every call with a timeout, once `in_flight` calls are in it at once: all of them are
/// admitted while the breaker is closed, and all report their failures together.
#[derive(Debug)]
struct FailingTogether {
    in_flight: std::sync::Barrier,
    calls: AtomicU32,
}

impl Store for FailingTogether {
    async fn check(&self, _: &Key, _: &Quota, _: u32) -> Result<Decision, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        // Blocks this thread (the test polls on threads of its own) until every call is here.
        self.in_flight.wait();
        Err(StoreError::new(StoreErrorKind::Timeout))
    }
    async fn peek(&self, key: &Key, quota: &Quota) -> Result<Decision, StoreError> {
        self.check(key, quota, 0).await
    }
    async fn reset(&self, _: &Key, _: &Quota) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The transitions `breaker` reported, in order.
fn transitions<S, C>(breaker: &CircuitBreaker<S, C>) -> Vec<BreakerState> {
    breaker
        .inner
        .transitions
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

const TASKS: usize = 64;

#[test]
fn sixty_four_failures_reported_at_once_open_the_breaker_exactly_once() {
    for round in 0..20 {
        let breaker = CircuitBreaker::builder(FailingTogether {
            in_flight: std::sync::Barrier::new(TASKS),
            calls: AtomicU32::new(0),
        })
        .failure_threshold(3)
        .without_failure_rate()
        .clock(ManualClock::new(Timestamp::from_nanos(1_000_000_000)))
        .build()
        .unwrap();
        let (key, quota) = (Key::from(1_u64), Quota::per_second(1).expect("quota"));
        let kinds: Vec<_> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..TASKS)
                .map(|_| {
                    scope.spawn(|| match now(breaker.check(&key, &quota, 1)) {
                        Poll::Ready(result) => kind(result),
                        Poll::Pending => panic!("the store answers at once"),
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert!(
            kinds.iter().all(|k| *k == Some(StoreErrorKind::Timeout)),
            "round {round}: every call was admitted and failed: {kinds:?}"
        );
        assert_eq!(breaker.get_ref().calls.load(Ordering::SeqCst), 64);
        assert_eq!(
            transitions(&breaker),
            [BreakerState::Open],
            "round {round}: 64 failures at once, one closed -> open"
        );
        assert_eq!(breaker.state(), BreakerState::Open);
    }
}

#[test]
fn sixty_four_threads_failing_at_once_open_the_breaker_exactly_once() {
    // Released together, each call is admitted, fails and reports while others do: some are
    // admitted after the breaker opened (and fail fast), some report after it opened.
    for round in 0..20 {
        let (breaker, _clock) = breaker();
        breaker.get_ref().set(TIMEOUT);
        let start = std::sync::Barrier::new(TASKS);
        let kinds: Vec<_> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..TASKS)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        kind(check(&breaker))
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let failed = kinds
            .iter()
            .filter(|k| **k == Some(StoreErrorKind::Timeout))
            .count();
        assert_eq!(failed, breaker.get_ref().calls() as usize, "round {round}");
        assert!(failed >= 3, "round {round}: {kinds:?}");
        assert!(
            kinds.iter().all(|k| matches!(
                k,
                Some(StoreErrorKind::Timeout | StoreErrorKind::CircuitOpen)
            )),
            "round {round}: {kinds:?}"
        );
        assert_eq!(
            transitions(&breaker),
            [BreakerState::Open],
            "round {round}: {failed} failures, one closed -> open"
        );
    }
}

#[cfg(rl_loom)]
mod loom_tests {
    //! The breaker's state machine under every interleaving loom finds:
    //! `RUSTFLAGS="--cfg rl_loom" cargo test -p ratewarden-breaker --release --lib loom`.

    use std::future::pending;
    use std::time::Duration;

    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use ratewarden_core::{
        Decision, Key, ManualClock, Quota, Store, StoreError, StoreErrorKind, Timestamp,
    };

    use super::now;
    use crate::CircuitBreaker;

    /// Fails while `failing`; else hangs, counting the calls in flight.
    #[derive(Debug, Default)]
    struct Probed {
        failing: AtomicBool,
        inflight: AtomicUsize,
        most: AtomicUsize,
    }

    struct InFlight<'a>(&'a Probed);

    impl Drop for InFlight<'_> {
        fn drop(&mut self) {
            self.0.inflight.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl Store for Probed {
        async fn check(&self, _: &Key, _: &Quota, _: u32) -> Result<Decision, StoreError> {
            if self.failing.load(Ordering::SeqCst) {
                return Err(StoreError::new(StoreErrorKind::Timeout));
            }
            let now = self.inflight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            let _in_flight = InFlight(self);
            pending().await
        }
        async fn peek(&self, key: &Key, quota: &Quota) -> Result<Decision, StoreError> {
            self.check(key, quota, 0).await
        }
        async fn reset(&self, _: &Key, _: &Quota) -> Result<(), StoreError> {
            Ok(())
        }
    }

    /// Three threads probe a half-open breaker that allows two probes at once, one of them
    /// cancelling its probe: never more than two are out.
    #[test]
    fn loom_probes_at_once_never_exceed_the_limit() {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(|| {
            let clock = ManualClock::new(Timestamp::from_nanos(1_000_000_000));
            let breaker = Arc::new(
                CircuitBreaker::builder(Probed::default())
                    .failure_threshold(1)
                    .probes(2)
                    .backoff(Duration::from_secs(1), Duration::from_secs(4))
                    .clock(clock.clone())
                    .build()
                    .unwrap(),
            );
            let (key, quota) = (Key::from(1_u64), Quota::per_second(1).expect("quota"));
            breaker.get_ref().failing.store(true, Ordering::SeqCst);
            let _ = now(breaker.check(&key, &quota, 1));
            breaker.get_ref().failing.store(false, Ordering::SeqCst);
            clock.advance(Duration::from_secs(1));
            let threads: Vec<_> = (0..3)
                .map(|i| {
                    let (breaker, key) = (Arc::clone(&breaker), key.clone());
                    loom::thread::spawn(move || {
                        let mut probe = Box::pin(breaker.check(&key, &quota, 1));
                        let _ = now(probe.as_mut());
                        if i == 0 {
                            drop(probe);
                            let mut again = Box::pin(breaker.check(&key, &quota, 1));
                            let _ = now(again.as_mut());
                        }
                    })
                })
                .collect();
            for thread in threads {
                let _ = thread.join();
            }
            assert!(breaker.get_ref().most.load(Ordering::SeqCst) <= 2);
        });
    }
}

#[test]
fn several_limits_go_to_the_store_as_one_call_and_unsupported_is_no_failure() {
    // A store that decides one limit at a time answers several as Unsupported: no failure.
    let scripted = CircuitBreaker::builder(Scripted::default())
        .failure_threshold(1)
        .build()
        .unwrap();
    let quota = Quota::per_hour(10).unwrap();
    let limits = [
        ratewarden_core::Limit::new(Key::from(1_u64), quota, 1),
        ratewarden_core::Limit::new(Key::from(2_u64), quota, 1),
    ];
    for _ in 0..3 {
        let Poll::Ready(result) = now(scripted.check_all(&limits)) else {
            panic!("the default check_all answers at once");
        };
        assert_eq!(result.unwrap_err().kind(), StoreErrorKind::Unsupported);
    }
    assert_eq!(scripted.state(), BreakerState::Closed);
    // A store that decides them together does, through the breaker, at once.
    let memory = CircuitBreaker::builder(ratewarden_memory::MemoryStore::new())
        .build()
        .unwrap();
    let Some(Ok(both)) = memory.check_all_ready(&limits) else {
        panic!("the memory store answers at once");
    };
    assert!(both.is_allowed());
    let Poll::Ready(one) = now(memory.check_all(&limits[..1])) else {
        panic!("the memory store answers at once");
    };
    assert_eq!(one.unwrap().as_slice()[0].info().remaining(), 8);
}

#[test]
fn a_probe_answered_with_an_error_about_its_own_request_neither_closes_nor_opens() {
    // Reproduced: several limits (Unsupported, answered without I/O) as the half-open probe
    // closed the breaker over a dead store.
    let (breaker, clock) = breaker();
    breaker.get_ref().set(TIMEOUT);
    for _ in 0..3 {
        assert_eq!(kind(check(&breaker)), Some(StoreErrorKind::Timeout));
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    clock.advance(Duration::from_secs(2));
    let quota = Quota::per_hour(10).unwrap();
    let limits = [
        ratewarden_core::Limit::new(Key::from(1_u64), quota, 1),
        ratewarden_core::Limit::new(Key::from(2_u64), quota, 1),
    ];
    let Poll::Ready(answer) = now(breaker.check_all(&limits)) else {
        panic!("the default check_all answers at once");
    };
    assert_eq!(answer.unwrap_err().kind(), StoreErrorKind::Unsupported);
    assert_eq!(
        breaker.state(),
        BreakerState::HalfOpen,
        "the probe's place is back"
    );
    // The next call probes the store, which is still down: open again.
    assert_eq!(kind(check(&breaker)), Some(StoreErrorKind::Timeout));
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[test]
fn a_probe_is_timed_from_when_it_went_not_from_probes_that_gave_their_place_back() {
    // Reproduced: the half-open period's clock started at its first probe; probes answered
    // with errors about their own request (a corrupt key) gave their places back, and once
    // the probe timeout had passed since the first, a call arriving beside a fresh, healthy
    // probe reopened the breaker.
    let (breaker, clock) = breaker();
    breaker.get_ref().set(TIMEOUT);
    for _ in 0..3 {
        check(&breaker).unwrap_err();
    }
    clock.advance(Duration::from_secs(5));
    breaker.get_ref().set(WRONG_TYPE);
    assert_eq!(kind(check(&breaker)), Some(StoreErrorKind::CorruptState));
    clock.advance(Duration::from_millis(1_500));
    assert_eq!(kind(check(&breaker)), Some(StoreErrorKind::CorruptState));
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    let probe = start(&breaker, HANG);
    breaker.get_ref().set(ALLOW);
    // Beside the probe, at the same instant: refused, the breaker still half-open.
    assert_eq!(kind(check(&breaker)), Some(StoreErrorKind::CircuitOpen));
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    drop(probe);
}
