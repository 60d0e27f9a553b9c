//! A rate-limited service on a Redis store behind a circuit breaker, driven by a bounded load
//! while a test breaks Redis, and the checks every fault must pass.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use ratewarden_core::{Decision, Key, Quota, Store, StoreError, StoreErrorKind};
use ratewarden_redis::{RedisConfig, RedisStore};
use ratewarden_tower::RateLimitLayer;
use ratewarden_tower::breaker::{BreakerState, CircuitBreaker};
use ratewarden_tower::rate_limit::{FailureMode, ResponseBody};
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};

/// The deadline of every store call in these tests.
pub(crate) const DEADLINE: Duration = Duration::from_millis(100);
/// What the 99th percentile of requests may take beyond the deadline under any fault.
pub(crate) const P99_MARGIN: Duration = Duration::from_millis(10);
/// What the 99th percentile of requests may take while the breaker is open: it answers
/// without the store, so a tenth of the deadline that a request waiting for the store would
/// take (the margin is for scheduling on a shared two-core machine running a debug build).
pub(crate) const P99_OPEN: Duration = Duration::from_millis(10);
/// What the slowest request may take beyond the deadline: scheduling on a shared two-core
/// machine running a debug build (a stray one, never the 99th percentile).
pub(crate) const MARGIN: Duration = Duration::from_millis(150);
pub(crate) const BASE_BACKOFF: Duration = Duration::from_millis(100);
pub(crate) const MAX_BACKOFF: Duration = Duration::from_millis(800);
pub(crate) const THRESHOLD: u32 = 3;
/// Concurrent clients.
const TASKS: u64 = 16;

/// A store that counts its failed calls and remembers when it decided.
#[derive(Debug)]
pub(crate) struct Observed<S> {
    inner: S,
    failures: AtomicU64,
    decisions: Mutex<Vec<Instant>>,
    errors: Mutex<HashMap<StoreErrorKind, usize>>,
}

impl<S: Store> Store for Observed<S> {
    async fn check(&self, key: &Key, quota: &Quota, cost: u32) -> Result<Decision, StoreError> {
        let result = self.inner.check(key, quota, cost).await;
        match &result {
            Ok(_) => self.decisions.lock().unwrap().push(Instant::now()),
            Err(e) => {
                self.failures.fetch_add(1, Ordering::SeqCst);
                if std::env::var_os("FAULTS_VERBOSE").is_some() {
                    eprintln!("store error: {e}");
                }
                *self.errors.lock().unwrap().entry(e.kind()).or_default() += 1;
            }
        }
        result
    }
    async fn peek(&self, key: &Key, quota: &Quota) -> Result<Decision, StoreError> {
        self.inner.peek(key, quota).await
    }
    async fn reset(&self, key: &Key, quota: &Quota) -> Result<(), StoreError> {
        self.inner.reset(key, quota).await
    }
}

/// What a request got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Outcome {
    /// Admitted by a store's decision (rate-limit headers present).
    Decided,
    /// Admitted without a decision (fail open, or an allowlisted key).
    Passed,
    /// 429.
    Denied,
    /// 503 (fail closed).
    Unavailable,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    pub(crate) start: Instant,
    pub(crate) latency: Duration,
    pub(crate) key: u64,
    pub(crate) outcome: Outcome,
}

type Service = BoxCloneService<Request<()>, Response<ResponseBody<String>>, Infallible>;

/// The store config every fault test uses: the test deadline, a prefix of the test's own.
pub(crate) fn config(url: String) -> RedisConfig {
    RedisConfig::new(url)
        .timeout(DEADLINE)
        .connect_timeout(Duration::from_millis(200))
}

pub(crate) struct Harness {
    pub(crate) breaker: Arc<CircuitBreaker<Observed<RedisStore>>>,
    service: Service,
    keys: Vec<u64>,
    stop: Arc<AtomicBool>,
    load: Vec<tokio::task::JoinHandle<Vec<Sample>>>,
    watcher: Option<tokio::task::JoinHandle<Vec<(Instant, BreakerState)>>>,
    baseline: Resources,
    fault_at: Option<(Instant, u64)>,
    recovered_at: Option<(Instant, u64)>,
}

impl Harness {
    /// A service limiting `quota` per key under `mode`, over `store`; clients spread over
    /// `keys` (key 0 is the one a closed mode allowlists).
    pub(crate) fn new(store: RedisStore, mode: FailureMode, quota: Quota, keys: Vec<u64>) -> Self {
        let breaker = Arc::new(
            CircuitBreaker::builder(Observed {
                inner: store,
                failures: AtomicU64::new(0),
                decisions: Mutex::new(Vec::new()),
                errors: Mutex::default(),
            })
            .failure_threshold(THRESHOLD)
            .backoff(BASE_BACKOFF, MAX_BACKOFF)
            .build()
            .unwrap(),
        );
        let key = |req: &Request<()>| {
            let n: u64 = req.headers().get("x-key")?.to_str().ok()?.parse().ok()?;
            Some(Key::from(n))
        };
        let layer = RateLimitLayer::new(Arc::clone(&breaker), quota, key).on_store_error(mode);
        let service = ServiceBuilder::new()
            .layer(layer)
            .service_fn(|_: Request<()>| async {
                Ok::<_, Infallible>(Response::new(String::new()))
            });
        Self {
            breaker,
            service: BoxCloneService::new(service),
            keys,
            stop: Arc::new(AtomicBool::new(false)),
            load: Vec::new(),
            watcher: None,
            baseline: Resources::now(),
            fault_at: None,
            recovered_at: None,
        }
    }

    /// Waits (up to 10 s) until the store decides, then takes the resource baseline.
    pub(crate) async fn healthy(&mut self) {
        let started = Instant::now();
        loop {
            let response = send(self.service.clone(), self.keys[0]).await;
            if outcome(&response) == Outcome::Decided
                && self.breaker.state() == BreakerState::Closed
            {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the store never decided"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.baseline = Resources::now();
    }

    /// Starts the clients: each sends a request, then sleeps 2 ms, until [`finish`].
    pub(crate) fn start_load(&mut self) {
        for task in 0..TASKS {
            let service = self.service.clone();
            let stop = Arc::clone(&self.stop);
            let keys = self.keys.clone();
            self.load.push(tokio::spawn(async move {
                let mut samples = Vec::new();
                let mut n = task;
                while !stop.load(Ordering::SeqCst) {
                    let key = keys[usize::try_from(n).unwrap() % keys.len()];
                    n += TASKS + 1;
                    let start = Instant::now();
                    let response = send(service.clone(), key).await;
                    samples.push(Sample {
                        start,
                        latency: start.elapsed(),
                        key,
                        outcome: outcome(&response),
                    });
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                samples
            }));
        }
        let breaker = Arc::clone(&self.breaker);
        let stop = Arc::clone(&self.stop);
        self.watcher = Some(tokio::spawn(async move {
            let mut seen = vec![(Instant::now(), breaker.state())];
            while !stop.load(Ordering::SeqCst) {
                let state = breaker.state();
                if seen.last().is_some_and(|&(_, last)| last != state) {
                    seen.push((Instant::now(), state));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            seen
        }));
    }

    fn failures(&self) -> u64 {
        self.breaker.get_ref().failures.load(Ordering::SeqCst)
    }

    /// Notes that the fault begins now, and takes the resource baseline (the load has warmed
    /// the connections up; its own tasks are not counted).
    pub(crate) fn fault(&mut self) {
        self.fault_at = Some((Instant::now(), self.failures()));
        let mut baseline = Resources::now();
        let load_tasks = self.load.len() + usize::from(self.watcher.is_some());
        baseline.tasks = baseline.tasks.saturating_sub(load_tasks);
        self.baseline = baseline;
    }

    /// Notes that the fault ended now.
    pub(crate) fn recovered(&mut self) {
        self.recovered_at = Some((Instant::now(), self.failures()));
    }

    /// Waits until the store decides again (failing past the maximum backoff + 1 s), lets the
    /// load run `settle` more, stops it, and checks resources against the baseline.
    pub(crate) async fn finish(mut self, settle: Duration) -> Report {
        let (recovered, _) = self.recovered_at.expect("call recovered() first");
        let limit = MAX_BACKOFF + Duration::from_secs(1);
        let resumed = loop {
            let first = self
                .breaker
                .get_ref()
                .decisions
                .lock()
                .unwrap()
                .iter()
                .find(|&&t| t >= recovered)
                .copied();
            if let Some(first) = first {
                break first;
            }
            assert!(
                recovered.elapsed() < limit + Duration::from_secs(5),
                "no decision from the store {:?} after recovery",
                recovered.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        tokio::time::sleep(settle).await;
        self.stop.store(true, Ordering::SeqCst);
        let mut samples = Vec::new();
        for task in self.load.drain(..) {
            samples.extend(task.await.expect("a client task panicked"));
        }
        let transitions = match self.watcher.take() {
            Some(watcher) => watcher.await.expect("the watcher panicked"),
            None => Vec::new(),
        };
        // Connections replaced during the fault close as their tasks notice.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after = Resources::now();
        Report {
            samples,
            transitions,
            fault: self.fault_at,
            recovered: self.recovered_at.expect("recovered"),
            resumed_after: resumed.saturating_duration_since(recovered),
            resume_limit: limit,
            before: self.baseline,
            after,
            breaker_state: self.breaker.state(),
            errors: self.breaker.get_ref().errors.lock().unwrap().clone(),
        }
    }
}

async fn send(service: Service, key: u64) -> Response<ResponseBody<String>> {
    let req = Request::get("/").header("x-key", key).body(()).unwrap();
    service.oneshot(req).await.unwrap()
}

fn outcome(response: &Response<ResponseBody<String>>) -> Outcome {
    match response.status() {
        StatusCode::OK if response.headers().contains_key("ratelimit") => Outcome::Decided,
        StatusCode::OK => Outcome::Passed,
        StatusCode::TOO_MANY_REQUESTS => Outcome::Denied,
        StatusCode::SERVICE_UNAVAILABLE => Outcome::Unavailable,
        other => panic!("unexpected status {other}"),
    }
}

/// Open file descriptors and live tasks of this process.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Resources {
    fds: usize,
    tasks: usize,
}

impl Resources {
    fn now() -> Self {
        Self {
            fds: std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count),
            tasks: tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks(),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) samples: Vec<Sample>,
    transitions: Vec<(Instant, BreakerState)>,
    fault: Option<(Instant, u64)>,
    recovered: (Instant, u64),
    pub(crate) resumed_after: Duration,
    resume_limit: Duration,
    before: Resources,
    after: Resources,
    breaker_state: BreakerState,
    /// The store's errors, by kind.
    pub(crate) errors: HashMap<StoreErrorKind, usize>,
}

impl Report {
    /// The checks every fault must pass: no request past its deadline (plus margin), the store
    /// deciding again within the maximum backoff + 1 s of recovery, the breaker closed at the
    /// end, and no more descriptors or tasks than before (beyond `slack`, for connections the
    /// client legitimately holds on to).
    pub(crate) fn assert_common(&self, slack: usize) {
        self.assert_common_within(slack, DEADLINE);
    }

    /// As [`assert_common`](Self::assert_common), for a store whose deadline is `deadline`.
    pub(crate) fn assert_common_within(&self, slack: usize, deadline: Duration) {
        let slowest = self
            .samples
            .iter()
            .map(|s| s.latency)
            .max()
            .unwrap_or_default();
        let all_p99 = p99(self.samples.iter().map(|s| s.latency));
        let open: Vec<Duration> = self
            .samples
            .iter()
            .filter(|s| self.open_at(s.start))
            .map(|s| s.latency)
            .collect();
        let open_p99 = p99(open.iter().copied());
        eprintln!(
            "{} requests: p99 {all_p99:?}, slowest {slowest:?}; while the breaker was open ({} requests): p99 {open_p99:?}; the store decided again {:?} after recovery; store errors {:?}",
            self.samples.len(),
            open.len(),
            self.resumed_after,
            self.errors
        );
        assert!(
            all_p99 <= deadline + P99_MARGIN,
            "p99 {all_p99:?}, past the {deadline:?} deadline + {P99_MARGIN:?}"
        );
        assert!(
            open_p99 <= P99_OPEN,
            "p99 {open_p99:?} while the breaker was open, past {P99_OPEN:?}"
        );
        assert!(
            slowest <= deadline + MARGIN,
            "a request took {slowest:?}, past the {deadline:?} deadline + {MARGIN:?}"
        );
        assert!(
            self.resumed_after <= self.resume_limit,
            "the store decided again only {:?} after recovery (limit {:?})",
            self.resumed_after,
            self.resume_limit
        );
        assert_eq!(
            self.breaker_state,
            BreakerState::Closed,
            "{:?}",
            self.transitions
        );
        assert!(
            self.after.fds <= self.before.fds + slack,
            "open descriptors grew from {} to {}",
            self.before.fds,
            self.after.fds
        );
        assert!(
            self.after.tasks <= self.before.tasks + slack,
            "live tasks grew from {} to {}",
            self.before.tasks,
            self.after.tasks
        );
        assert!(
            self.samples.len() > 100,
            "the load ran: {} requests",
            self.samples.len()
        );
    }

    /// The breaker opened during the fault.
    pub(crate) fn assert_breaker_opened_at_least_once(&self) {
        let (fault, _) = self.fault.expect("fault() was called");
        assert!(
            self.transitions
                .iter()
                .any(|&(at, state)| at >= fault && state == BreakerState::Open),
            "the breaker never opened (store errors {:?}): {:?}",
            self.errors,
            self.transitions
        );
    }

    /// The breaker opened during the fault, and spared the failing store: no more failed calls
    /// than the threshold, the calls already in flight, and one probe per backoff. (Calls that
    /// succeed, once a failover has happened but before the test sees it, do not count.)
    pub(crate) fn assert_breaker_opened(&self) {
        let (fault, failures_at_fault) = self.fault.expect("fault() was called");
        let opened = self
            .transitions
            .iter()
            .any(|&(at, state)| at >= fault && state == BreakerState::Open);
        assert!(
            opened,
            "the breaker never opened (store errors {:?}): {:?}",
            self.errors, self.transitions
        );
        let (recovered, failures_at_recovery) = self.recovered;
        let during = failures_at_recovery - failures_at_fault;
        let fault_ms = u64::try_from(recovered.duration_since(fault).as_millis()).unwrap();
        let most = u64::from(THRESHOLD) + TASKS + fault_ms / 75 + 2;
        let requests = self.during_fault().count();
        assert!(
            during <= most,
            "the store failed {during} calls during the fault ({requests} requests); at most {most} expected"
        );
    }

    /// Whether the breaker was open (and stayed so for a while) when a request started at
    /// `at`: the requests that must be answered without the store.
    fn open_at(&self, at: Instant) -> bool {
        let mut state = BreakerState::Closed;
        for &(since, to) in &self.transitions {
            if since > at {
                break;
            }
            state = to;
        }
        // The watcher polls every millisecond: a request just after a transition may have
        // met the state before it.
        state == BreakerState::Open
            && self.transitions.iter().any(|&(since, to)| {
                to == BreakerState::Open && since + Duration::from_millis(2) <= at
            })
    }

    /// The breaker never left `Closed`.
    pub(crate) fn assert_breaker_stayed_closed(&self) {
        assert_eq!(
            self.transitions.len(),
            1,
            "store errors {:?}; transitions {:?}",
            self.errors,
            self.transitions
        );
    }

    /// Requests that started between the fault and the recovery.
    pub(crate) fn during_fault(&self) -> impl Iterator<Item = &Sample> {
        let fault = self.fault.map_or(self.recovered.0, |(at, _)| at);
        let recovered = self.recovered.0;
        self.samples
            .iter()
            .filter(move |s| s.start >= fault && s.start < recovered)
    }

    /// How many requests had each outcome, over `samples`.
    pub(crate) fn tally<'a>(samples: impl Iterator<Item = &'a Sample>) -> HashMap<Outcome, usize> {
        let mut tally = HashMap::new();
        for sample in samples {
            *tally.entry(sample.outcome).or_default() += 1;
        }
        tally
    }

    /// Every request had one of `allowed` outcomes, and during the fault `expected` occurred.
    pub(crate) fn assert_outcomes(&self, allowed: &[Outcome], expected: Outcome) {
        let all = Self::tally(self.samples.iter());
        for outcome in all.keys() {
            assert!(allowed.contains(outcome), "unexpected {outcome:?}: {all:?}");
        }
        let during = Self::tally(self.during_fault());
        assert!(
            during.get(&expected).copied().unwrap_or(0) > 0,
            "no {expected:?} during the fault: {during:?}"
        );
    }
}

/// The 99th percentile of `latencies` (zero when there are none).
fn p99(latencies: impl Iterator<Item = Duration>) -> Duration {
    let mut all: Vec<Duration> = latencies.collect();
    all.sort_unstable();
    all.get((all.len() * 99 / 100).min(all.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

/// The process's metrics recorder (installed on first use), and the counters it has seen: a
/// snapshot takes what was counted since the last one.
pub(crate) struct Metrics {
    snapshotter: metrics_util::debugging::Snapshotter,
    failures: Mutex<HashMap<String, u64>>,
}

impl Metrics {
    /// `ratewarden_store_failures_total` of `kind` so far, over every breaker.
    pub(crate) fn failures(&self, kind: StoreErrorKind) -> u64 {
        let mut failures = self.failures.lock().unwrap();
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let kind = key.key().labels().find(|l| l.key() == "kind");
            if let (true, Some(kind), metrics_util::debugging::DebugValue::Counter(n)) = (
                key.key().name() == "ratewarden_store_failures_total",
                kind,
                value,
            ) {
                *failures.entry(kind.value().to_owned()).or_default() += n;
            }
        }
        failures.get(kind.as_str()).copied().unwrap_or(0)
    }
}

/// The metrics recorder every fault test reports to.
pub(crate) fn metrics() -> &'static Metrics {
    static METRICS: std::sync::OnceLock<Metrics> = std::sync::OnceLock::new();
    METRICS.get_or_init(|| {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this process");
        Metrics {
            snapshotter,
            failures: Mutex::default(),
        }
    })
}
