use std::future::{Future, pending};
use std::pin::pin;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use rl_core::{
    Decision, Info, Key, ManualClock, Quota, Store, StoreError, StoreErrorKind, Timestamp,
};

use super::{BreakerState, CircuitBreaker};

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
    let clock = ManualClock::new(Timestamp::from_nanos(1_000_000_000));
    let breaker = CircuitBreaker::new(Scripted::default())
        .failure_threshold(3)
        .failure_rate(2.0, Duration::from_secs(10), 20) // off unless a test turns it on
        .backoff(Duration::from_secs(1), Duration::from_secs(4))
        .clock(clock.clone());
    (breaker, clock)
}

/// Polls once: every scripted answer but HANG is ready at once.
fn now<F: Future>(future: F) -> Poll<F::Output> {
    pin!(future)
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

fn check<C: rl_core::Clock>(breaker: &CircuitBreaker<Scripted, C>) -> Result<Decision, StoreError> {
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
    let (breaker, _) = breaker();
    let breaker = breaker.failure_rate(0.5, Duration::from_secs(10), 20);
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
    let (breaker, clock) = breaker();
    let breaker = breaker.failure_rate(0.5, Duration::from_secs(10), 20);
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
