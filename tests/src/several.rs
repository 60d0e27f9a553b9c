//! Several limits decided together, against a model: every limit's own algorithm state, charged
//! only when every limit of the request admits. A store that leaks (charges a limit of a denied
//! request), over-admits or under-admits disagrees with the model on some request of a long
//! random run, and the test names it.

use std::collections::HashMap;

use ratewarden_core::algorithm::{
    AlgorithmState, FixedWindowState, GcraState, SlidingLogState, SlidingWindowState,
    TokenBucketState,
};
use ratewarden_core::{Algorithm, Decision, Decisions, Key, Limit, Quota, Timestamp};

/// The time to the next request of a random run, in microseconds: mostly bursts (0-5 ms
/// apart), sometimes pauses (up to 4 s), so that every limit of [`request`] is spent.
pub fn gap(rng: &mut fastrand::Rng) -> u64 {
    if rng.u8(0..10) < 8 {
        rng.u64(0..5_000)
    } else {
        rng.u64(0..4_000_000)
    }
}

/// One limit's state in the model, whatever its algorithm.
#[derive(Clone, Debug)]
enum State {
    Gcra(GcraState),
    TokenBucket(TokenBucketState),
    FixedWindow(FixedWindowState),
    SlidingWindow(SlidingWindowState),
    SlidingLog(SlidingLogState),
}

impl State {
    fn new(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::Gcra => Self::Gcra(GcraState::default()),
            Algorithm::TokenBucket => Self::TokenBucket(TokenBucketState::default()),
            Algorithm::FixedWindow => Self::FixedWindow(FixedWindowState::default()),
            Algorithm::SlidingWindow => Self::SlidingWindow(SlidingWindowState::default()),
            Algorithm::SlidingLog => Self::SlidingLog(SlidingLogState::default()),
        }
    }

    fn check(&mut self, now: Timestamp, cost: u32, quota: &Quota) -> Decision {
        match self {
            Self::Gcra(s) => s.check(now, cost, quota),
            Self::TokenBucket(s) => s.check(now, cost, quota),
            Self::FixedWindow(s) => s.check(now, cost, quota),
            Self::SlidingWindow(s) => s.check(now, cost, quota),
            Self::SlidingLog(s) => s.check(now, cost, quota),
        }
    }
}

/// The model: one state per (key, quota), charged all-or-nothing.
#[derive(Debug, Default)]
pub struct Model {
    states: HashMap<(Key, Quota), State>,
}

impl Model {
    /// Decides `limits` at `now` as a store must: limits on one state merged
    /// ([`ratewarden_core::merged`]), every state's decision on its state as it is, every
    /// counted state charged when all admit, none otherwise.
    pub fn check_all(&mut self, limits: &[Limit], now: Timestamp) -> Vec<Decision> {
        let (states, of) = ratewarden_core::merged(limits);
        let mut charged = Vec::with_capacity(states.len());
        let decisions: Vec<Decision> = states
            .iter()
            .map(|limit| {
                let id = (limit.key().clone(), *limit.quota());
                let mut state = (self.states.get(&id).cloned())
                    .unwrap_or_else(|| State::new(limit.quota().algorithm()));
                let decision = state.check(now, limit.cost(), limit.quota());
                if limit.is_counted() {
                    charged.push((id, state));
                }
                decision
            })
            .collect();
        if decisions.iter().all(Decision::is_allowed) {
            self.states.extend(charged);
        }
        of.iter().map(|&s| decisions[s]).collect()
    }
}

/// The request of a random run: per user `10/s` (GCRA) and `3000/h` (sliding window), and the
/// tenant's `100/min` (token bucket, burst 20); users and tenants drawn from small sets so that
/// every limit is spent often.
pub fn request(rng: &mut fastrand::Rng, cost: u32) -> Vec<Limit> {
    let per_second: Quota = "10/s".parse().expect("a quota");
    let per_hour: Quota = "3000/h sliding-window".parse().expect("a quota");
    let tenant_quota: Quota = "100/min burst 20 token-bucket".parse().expect("a quota");
    let user = Key::from(format!("user-{}", rng.u8(0..3)));
    let tenant = Key::from(format!("tenant-{}", rng.u8(0..2)));
    vec![
        Limit::new(user.clone(), per_second, cost),
        Limit::new(user, per_hour, cost),
        Limit::new(tenant, tenant_quota, cost),
    ]
}

/// What a run saw: requests, admitted, denied by each limit.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Requests decided.
    pub requests: u64,
    /// Requests every limit admitted.
    pub admitted: u64,
    /// Requests each limit denied (by its index; a request several denied counts for each).
    pub denied_by: [u64; 3],
}

impl Tally {
    /// Counts one request the store decided as `decisions`.
    pub fn count(&mut self, decisions: &Decisions) {
        self.requests += 1;
        if decisions.is_allowed() {
            self.admitted += 1;
        } else {
            for (i, decision) in decisions.as_slice().iter().enumerate().take(3) {
                self.denied_by[i] += u64::from(!decision.is_allowed());
            }
        }
    }
}

/// Asserts that the store decided request `n` (`limits` at `now`) as the model did: the same
/// admission, and on a denial the same limits denying.
pub fn assert_agrees(n: u64, limits: &[Limit], store: &Decisions, model: &[Decision]) {
    let denying = |d: &[Decision]| -> Vec<bool> { d.iter().map(|d| !d.is_allowed()).collect() };
    assert_eq!(
        store.is_allowed(),
        model.iter().all(Decision::is_allowed),
        "request {n} ({limits:?}): the store decided {:?}, the model {model:?}",
        store.as_slice()
    );
    assert_eq!(
        denying(store.as_slice()),
        denying(model),
        "request {n}: another limit denied"
    );
}
