//! [`Instances`]: how many gateways share a fallback's quota, a fixed number or a live count.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

/// How many gateways share a [`FailureMode::fallback`](super::FailureMode::fallback)'s
/// quota: each enforces `1 / n` of it while its store fails. A fixed number, or a live count
/// (the gateways a mesh hears from, or any source): then `n` follows the fleet as gateways
/// die or are added, and a gateway left alone enforces the whole quota.
///
/// A live count is read at most once a second, on a request the fallback decides, and a new
/// count is adopted once every reading over [`SETTLE`](Self::SETTLE), none more than 2 s
/// after the one before, has agreed with it, so that a count that flaps moves `n` at most
/// once per `SETTLE`, and the first fallback after a quiet time takes the number adopted
/// before it for `SETTLE` at least. Each move starts every key's local count afresh under its new
/// share: at most `⌈burst / n⌉` more per key per move, beside the fallback's bound (see
/// [`FailureMode`](super::FailureMode)). A count lower than the gateways deciding (a
/// partition, where each side hears only itself) gives each side the share of its own size:
/// about the quota per side.
///
/// ```
/// use ratewarden_tower::rate_limit::Instances;
/// use std::num::NonZeroU32;
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU32, Ordering};
///
/// let fixed = Instances::from(NonZeroU32::new(4).unwrap());
/// assert_eq!(fixed.get().get(), 4);
///
/// // Any live source: here a counter a membership service keeps up to date.
/// let members = Arc::new(AtomicU32::new(3));
/// let source = Arc::clone(&members);
/// let live = Instances::live(NonZeroU32::new(3).unwrap(), move || {
///     NonZeroU32::new(source.load(Ordering::Relaxed)).unwrap_or(NonZeroU32::MIN)
/// });
/// members.store(2, Ordering::Relaxed);
/// assert_eq!(live.get().get(), 3); // 2 is adopted once it has held for 10 s
/// ```
#[derive(Clone)]
pub struct Instances(Source);

#[derive(Clone)]
enum Source {
    Fixed(NonZeroU32),
    Live(Arc<Live>),
}

/// Readings further apart than this start a count's wait again.
const GAP: Duration = Duration::from_secs(2);

/// A live count and the number adopted from it.
struct Live {
    count: Box<dyn Fn() -> NonZeroU32 + Send + Sync>,
    settle: Duration,
    adopted: AtomicU32,
    readings: Mutex<Readings>,
}

/// The last reading, and since when readings have agreed with it.
struct Readings {
    read_at: Option<Instant>,
    last: NonZeroU32,
    since: Instant,
}

impl Instances {
    /// How long a live count must hold before it is adopted: 10 s.
    pub const SETTLE: Duration = Duration::from_secs(10);

    /// A live count: `count` is read at most once a second (on a request the fallback
    /// decides), `assumed` stands until another count has held for [`SETTLE`](Self::SETTLE).
    ///
    /// See [`Instances`] for an example.
    pub fn live(
        assumed: NonZeroU32,
        count: impl Fn() -> NonZeroU32 + Send + Sync + 'static,
    ) -> Self {
        Self::live_settling(assumed, count, Self::SETTLE)
    }

    /// [`live`](Self::live), adopting a count once it has held for `settle`.
    pub(crate) fn live_settling(
        assumed: NonZeroU32,
        count: impl Fn() -> NonZeroU32 + Send + Sync + 'static,
        settle: Duration,
    ) -> Self {
        Self(Source::Live(Arc::new(Live {
            count: Box::new(count),
            settle,
            adopted: AtomicU32::new(assumed.get()),
            readings: Mutex::new(Readings {
                read_at: None,
                last: assumed,
                since: Instant::now(),
            }),
        })))
    }

    /// The members `mesh` hears from ([`MeshStore::live`](crate::MeshStore::live)), all
    /// its members assumed until then: gateways that share a mesh (for this limit or
    /// another) and fall back from a common store share the fallback's quota by the
    /// gateways alive.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use ratewarden_tower::rate_limit::{FailureMode, Instances};
    /// use ratewarden_tower::{MemoryStore, MeshStore};
    /// let mesh = MeshStore::builder("10.0.0.1:7000".parse()?)
    ///     .peers(["10.0.0.2:7000".parse()?, "10.0.0.3:7000".parse()?])
    ///     .secret(b"a secret every gateway shares")?
    ///     .bind()
    ///     .await?;
    /// let mode = FailureMode::fallback(MemoryStore::new(), Instances::mesh(&mesh));
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "mesh")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mesh")))]
    #[must_use]
    pub fn mesh(mesh: &crate::MeshStore) -> Self {
        let count = |n: usize| NonZeroU32::new(u32::try_from(n).unwrap_or(u32::MAX));
        let assumed = count(mesh.members().len()).unwrap_or(NonZeroU32::MIN);
        let mesh = mesh.clone();
        Self::live(assumed, move || {
            count(mesh.live().len()).unwrap_or(NonZeroU32::MIN)
        })
    }

    /// The number of gateways sharing the quota now: the fixed number, or the live count
    /// adopted.
    ///
    /// See [`Instances`] for an example.
    #[must_use]
    pub fn get(&self) -> NonZeroU32 {
        match &self.0 {
            Source::Fixed(n) => *n,
            Source::Live(live) => live.get(),
        }
    }
}

impl Live {
    fn get(&self) -> NonZeroU32 {
        // One request reads the count; the others take the number adopted. A count that
        // panicked while read leaves the readings as they were, read again next time.
        let readings = match self.readings.try_lock() {
            Ok(readings) => Some(readings),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        if let Some(mut readings) = readings {
            let now = Instant::now();
            let since_last = readings.read_at.map(|at| now.duration_since(at));
            if since_last.is_none_or(|gap| gap >= Duration::from_secs(1)) {
                readings.read_at = Some(now);
                let reading = (self.count)();
                // Readings far apart say nothing of the time between them.
                let continuous = since_last.is_some_and(|gap| gap <= GAP);
                if reading != readings.last || !continuous {
                    readings.last = reading;
                    readings.since = now;
                } else if now.duration_since(readings.since) >= self.settle {
                    self.adopted.store(reading.get(), Ordering::Relaxed);
                }
            }
        }
        NonZeroU32::new(self.adopted.load(Ordering::Relaxed)).unwrap_or(NonZeroU32::MIN)
    }
}

impl From<NonZeroU32> for Instances {
    fn from(n: NonZeroU32) -> Self {
        Self(Source::Fixed(n))
    }
}

impl fmt::Debug for Instances {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Source::Fixed(n) => write!(f, "{n}"),
            Source::Live(live) => write!(f, "live ({})", live.adopted.load(Ordering::Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A live count of 4, read from the counter it returns, adopted after 1.5 s.
    fn four_settling_in_1_5_s() -> (Arc<AtomicU32>, Instances) {
        let members = Arc::new(AtomicU32::new(4));
        let source = Arc::clone(&members);
        let instances = Instances::live_settling(
            NonZeroU32::new(4).unwrap_or(NonZeroU32::MIN),
            move || NonZeroU32::new(source.load(Ordering::Relaxed)).unwrap_or(NonZeroU32::MIN),
            Duration::from_millis(1_500),
        );
        (members, instances)
    }

    #[test]
    fn a_live_count_is_adopted_once_it_has_held() {
        let (members, instances) = four_settling_in_1_5_s();
        assert_eq!(instances.get().get(), 4);
        members.store(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(1_000));
        assert_eq!(instances.get().get(), 4, "a count just read is not adopted");
        // A flap back and forth starts the wait again.
        members.store(4, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(1_000));
        assert_eq!(instances.get().get(), 4);
        members.store(1, Ordering::Relaxed);
        for _ in 0..2 {
            std::thread::sleep(Duration::from_millis(1_000));
            assert_eq!(instances.get().get(), 4);
        }
        std::thread::sleep(Duration::from_millis(1_000));
        assert_eq!(instances.get().get(), 1, "held for 1.5 s and more");
        assert_eq!(format!("{instances:?}"), "live (1)");
    }

    /// Readings far apart say nothing of the time between them: a count is adopted only
    /// once readings a second or two apart have agreed for the whole wait.
    #[test]
    fn readings_far_apart_restart_the_wait() {
        let (members, instances) = four_settling_in_1_5_s();
        members.store(2, Ordering::Relaxed);
        assert_eq!(instances.get().get(), 4);
        // No reading for 2.5 s (no request fell back), then one that agrees.
        std::thread::sleep(Duration::from_millis(2_500));
        assert_eq!(instances.get().get(), 4, "two readings 2.5 s apart adopted");
    }

    /// A count that panics while it is read is read again by the next request: the panic
    /// never freezes the number.
    #[test]
    fn a_count_that_panicked_is_read_again() {
        let calls = Arc::new(AtomicU32::new(0));
        let seen = Arc::clone(&calls);
        let instances = Instances::live_settling(
            NonZeroU32::new(4).unwrap_or(NonZeroU32::MIN),
            move || {
                assert!(
                    seen.fetch_add(1, Ordering::Relaxed) > 0,
                    "the first reading fails"
                );
                NonZeroU32::MIN
            },
            Duration::ZERO,
        );
        let first = instances.clone();
        assert!(std::thread::spawn(move || first.get()).join().is_err());
        std::thread::sleep(Duration::from_millis(1_100));
        let _ = instances.get();
        std::thread::sleep(Duration::from_millis(1_100));
        assert_eq!(instances.get().get(), 1);
    }
}
