//! [`CachedResolver`]: a bounded cache with single flight in front of a [`QuotaResolver`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use foldhash::fast::RandomState;
use quick_cache::sync::{Cache, DefaultLifecycle, EntryAction, EntryResult, PlaceholderGuard};
use quick_cache::{OptionsBuilder, UnitWeighter};
use ratewarden_core::Key;
use tokio::time::Instant;

use super::builder::Settings;
use super::unwind::CatchUnwind;
use super::{CachedResolverBuilder, OnFailure, Plan, QuotaResolver, Resolution};

/// Tenants and their answers, each counted as one entry. Tenant ids come from clients: the
/// hasher's seed is random per cache.
type Map = Cache<Key, Entry, UnitWeighter, RandomState, DefaultLifecycle<Key, Entry>>;
type Guard<'a> =
    PlaceholderGuard<'a, Key, Entry, UnitWeighter, RandomState, DefaultLifecycle<Key, Entry>>;

/// A [`QuotaResolver`] behind a bounded cache: what the rate-limit layers ask.
///
/// - **Bounded**: at most [`max_entries`](CachedResolverBuilder::max_entries) tenants.
///   Tenants seen once are pushed out before those asked for again, so a flood of made-up ids
///   does not push out the tenants in use, and an unknown tenant is forgotten after
///   [`unknown_ttl`](CachedResolverBuilder::unknown_ttl), shorter than a plan's
///   [`ttl`](CachedResolverBuilder::ttl).
/// - **Single flight**: calls for a tenant that is not cached wait for one lookup; 100
///   concurrent first calls make one. When the call making the lookup is dropped (its client
///   went away), a waiting call makes it instead, and a tenant whose plan has expired keeps
///   that plan for the next lookup.
/// - **Bounded waits**: no call waits longer than the
///   [`timeout`](CachedResolverBuilder::timeout), for its own lookup or another's. A lookup
///   that fails, times out or panics is answered as
///   [`on_failure`](CachedResolverBuilder::on_failure) says (a tenant whose plan has expired
///   keeps it instead), and that answer is kept for
///   [`failure_ttl`](CachedResolverBuilder::failure_ttl), so a resolver that is down is not
///   asked at every request.
///
/// A cached answer costs a hash, a shared lock of one shard and a clock read
/// ([`resolve_ready`](Self::resolve_ready)). Times are read from tokio's clock, so that paused
/// time moves them in tests; lookups need a tokio runtime with its timer (the default of
/// `#[tokio::main]`).
///
/// Cheap to clone: clones share one cache.
///
/// ```
/// use ratewarden_tower::{Key, Quota};
/// use ratewarden_tower::tenant::{CachedResolver, Plan, ResolveError, Resolution};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pro = Plan::new("pro", [("rps", Quota::per_second(100)?)])?;
/// let plans = move |tenant: &Key| {
///     let found = (tenant == &Key::from("acme")).then(|| pro.clone());
///     async move { Ok::<_, ResolveError>(found) }
/// };
/// let cache = CachedResolver::new(plans);
///
/// let acme = Key::from("acme");
/// assert!(cache.resolve_ready(&acme).is_none()); // not looked up yet
/// let Resolution::Plan(plan) = cache.resolve(&acme).await else { panic!() };
/// assert_eq!(plan.name(), "pro");
/// assert_eq!(cache.resolve_ready(&acme), Some(Resolution::Plan(plan))); // now cached
/// assert_eq!(cache.resolve(&Key::from("nobody")).await, Resolution::Unknown);
/// # Ok(()) }
/// ```
pub struct CachedResolver<R> {
    shared: Arc<Shared<R>>,
}

struct Shared<R> {
    resolver: R,
    map: Map,
    settings: Settings,
}

/// What the cache holds for a tenant, until when.
#[derive(Clone)]
struct Entry {
    answer: Answer,
    /// `None`: a TTL past the clock's range, never expires.
    expires: Option<Instant>,
}

#[derive(Clone)]
enum Answer {
    Plan(Plan),
    Unknown,
    /// The lookup failed or timed out, for a tenant with no earlier plan.
    Failed,
}

impl Entry {
    fn is_fresh(&self, now: Instant) -> bool {
        self.expires.is_none_or(|expires| now < expires)
    }

    fn into_resolution(self, on_failure: &OnFailure) -> Resolution {
        match self.answer {
            Answer::Plan(plan) => Resolution::Plan(plan),
            Answer::Unknown => Resolution::Unknown,
            Answer::Failed => on_failure.resolution(),
        }
    }
}

impl<R: QuotaResolver> CachedResolver<R> {
    /// `resolver` behind a cache with the default settings ([`CachedResolverBuilder`]).
    ///
    /// ```
    /// use ratewarden_tower::Key;
    /// use ratewarden_tower::tenant::{CachedResolver, Plan, ResolveError};
    /// let cache = CachedResolver::new(|_: &Key| async { Ok::<Option<Plan>, ResolveError>(None) });
    /// assert!(cache.is_empty());
    /// ```
    pub fn new(resolver: R) -> Self {
        Self::with_settings(resolver, Settings::default())
    }

    /// `resolver` behind a cache with the settings to come.
    ///
    /// ```
    /// use ratewarden_tower::Key;
    /// use ratewarden_tower::tenant::{CachedResolver, Plan, ResolveError};
    /// use std::time::Duration;
    /// let resolver = |_: &Key| async { Ok::<Option<Plan>, ResolveError>(None) };
    /// let cache = CachedResolver::builder(resolver).ttl(Duration::from_secs(60)).build()?;
    /// # let _ = cache;
    /// # Ok::<(), ratewarden_tower::tenant::CacheConfigError>(())
    /// ```
    pub fn builder(resolver: R) -> CachedResolverBuilder<R> {
        CachedResolverBuilder::new(resolver)
    }

    /// Settings checked by [`CachedResolverBuilder::build`].
    pub(super) fn with_settings(resolver: R, settings: Settings) -> Self {
        Self {
            shared: Arc::new(Shared {
                resolver,
                map: new_map(settings.max_entries),
                settings,
            }),
        }
    }

    /// What to apply to `tenant`: its cached answer, or else the answer of one lookup shared
    /// with every concurrent call for `tenant`. Waits at most the
    /// [`timeout`](CachedResolverBuilder::timeout), and never fails: a failed lookup gets its
    /// configured answer ([`OnFailure`]).
    ///
    /// # Panics
    ///
    /// When a lookup is needed outside a tokio runtime with its timer enabled (as tokio's
    /// own timeouts do).
    ///
    /// ```
    /// use ratewarden_tower::Key;
    /// use ratewarden_tower::tenant::{CachedResolver, OnFailure, Plan, ResolveError, Resolution};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let down = |_: &Key| async { Err::<Option<Plan>, _>(ResolveError::new("database down")) };
    /// let cache = CachedResolver::builder(down).on_failure(OnFailure::Unavailable).build()?;
    /// assert_eq!(cache.resolve(&Key::from("acme")).await, Resolution::Unavailable);
    /// # Ok(()) }
    /// ```
    pub fn resolve<'a>(&'a self, tenant: &'a Key) -> impl Future<Output = Resolution> + Send + 'a {
        // Looked at when called, as a layer calls it: a hit keeps nothing in the future.
        let cached = self.resolve_ready(tenant);
        async move {
            match cached {
                Some(cached) => cached,
                None => self.shared.load(tenant).await,
            }
        }
    }

    /// The cached answer for `tenant`, if there is one and it has not expired: the fast path,
    /// with no future to poll. `None` means [`resolve`](Self::resolve) must look it up.
    ///
    /// ```
    /// use ratewarden_tower::Key;
    /// use ratewarden_tower::tenant::{CachedResolver, Plan, ResolveError, Resolution};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let cache = CachedResolver::new(|_: &Key| async { Ok::<Option<Plan>, ResolveError>(None) });
    /// let tenant = Key::from("acme");
    /// assert_eq!(cache.resolve_ready(&tenant), None);
    /// let answer = match cache.resolve_ready(&tenant) {
    ///     Some(cached) => cached,
    ///     None => cache.resolve(&tenant).await,
    /// };
    /// assert_eq!(answer, Resolution::Unknown);
    /// assert_eq!(cache.resolve_ready(&tenant), Some(Resolution::Unknown));
    /// # }
    /// ```
    #[must_use]
    pub fn resolve_ready(&self, tenant: &Key) -> Option<Resolution> {
        let entry = self.shared.map.get(tenant)?;
        if entry.is_fresh(Instant::now()) {
            Some(entry.into_resolution(&self.shared.settings.on_failure))
        } else {
            None
        }
    }
}

impl<R> CachedResolver<R> {
    /// Forgets `tenant`, so that its next call looks it up (after a plan change). A lookup
    /// already running for it may still store its answer.
    ///
    /// ```
    /// use ratewarden_tower::Key;
    /// use ratewarden_tower::tenant::{CachedResolver, Plan, ResolveError};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let cache = CachedResolver::new(|_: &Key| async { Ok::<Option<Plan>, ResolveError>(None) });
    /// let tenant = Key::from("acme");
    /// cache.resolve(&tenant).await;
    /// cache.invalidate(&tenant);
    /// assert!(cache.resolve_ready(&tenant).is_none());
    /// # }
    /// ```
    pub fn invalidate(&self, tenant: &Key) {
        self.shared.map.remove(tenant);
    }

    /// How many tenants the cache holds (expired answers included, until pushed out), at most
    /// [`max_entries`](CachedResolverBuilder::max_entries).
    ///
    /// ```
    /// use ratewarden_tower::Key;
    /// use ratewarden_tower::tenant::{CachedResolver, Plan, ResolveError};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let cache = CachedResolver::new(|_: &Key| async { Ok::<Option<Plan>, ResolveError>(None) });
    /// cache.resolve(&Key::from("a")).await;
    /// cache.resolve(&Key::from("b")).await;
    /// assert_eq!(cache.len(), 2);
    /// # }
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        self.shared.map.len()
    }

    /// Whether the cache holds no tenant.
    ///
    /// ```
    /// use ratewarden_tower::Key;
    /// use ratewarden_tower::tenant::{CachedResolver, Plan, ResolveError};
    /// let cache = CachedResolver::new(|_: &Key| async { Ok::<Option<Plan>, ResolveError>(None) });
    /// assert!(cache.is_empty());
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.shared.map.is_empty()
    }
}

impl<R: QuotaResolver> Shared<R> {
    /// The answer for a tenant that was not cached (or had expired): another call's lookup,
    /// or this call's own.
    async fn load(&self, tenant: &Key) -> Resolution {
        let start = Instant::now();
        // Under the shard's lock: a fresh entry (filled since the fast path looked) is the
        // answer; an expired one is swapped for a placeholder, and this call looks it up.
        let entry = self.map.entry_async(tenant, |_, entry: &mut Entry| {
            if entry.is_fresh(start) {
                EntryAction::Retain(entry.clone())
            } else {
                EntryAction::ReplaceWithGuard
            }
        });
        match tokio::time::timeout(self.settings.timeout, entry).await {
            Ok(EntryResult::Retained(entry)) => entry.into_resolution(&self.settings.on_failure),
            Ok(EntryResult::Vacant(guard)) => {
                self.look_up(Lookup::new(guard, None), tenant, start).await
            }
            Ok(EntryResult::Replaced(guard, expired)) => {
                let last = matches!(expired.answer, Answer::Plan(_)).then_some(expired);
                self.look_up(Lookup::new(guard, last), tenant, start).await
            }
            // `Removed` answers `EntryAction::Remove` and `Timeout` a timed `entry`, neither
            // asked for here; `Err`: another call's lookup outlasted this call's timeout.
            Ok(EntryResult::Removed(..) | EntryResult::Timeout) | Err(_) => {
                self.settings.on_failure.resolution()
            }
        }
    }

    /// Asks the resolver, within what is left of the timeout since `start`, and stores the
    /// answer for the calls waiting on `lookup`. When this future is dropped, `lookup` puts
    /// the tenant's expired plan back, or passes the lookup to a waiting call.
    async fn look_up(&self, lookup: Lookup<'_>, tenant: &Key, start: Instant) -> Resolution {
        let settings = &self.settings;
        let left = settings.timeout.saturating_sub(start.elapsed());
        // The call is made inside the wrapper too, so that a resolver panicking before it
        // returns its future is caught as well.
        let asked = CatchUnwind::new(async { self.resolver.resolve(tenant).await });
        let failed = || {
            let answer = match lookup.last_plan() {
                Some(plan) => Answer::Plan(plan.clone()),
                None => Answer::Failed,
            };
            (answer, settings.failure_ttl)
        };
        let (answer, ttl) = match tokio::time::timeout(left, asked).await {
            Ok(Ok(Ok(Some(plan)))) => (Answer::Plan(plan), settings.ttl),
            Ok(Ok(Ok(None))) => (Answer::Unknown, settings.unknown_ttl),
            Ok(Ok(Err(_error))) => {
                #[cfg(feature = "tracing")]
                tracing::warn!(error = %_error, "quota resolver failed");
                failed()
            }
            Ok(Err(_panic)) => {
                #[cfg(feature = "tracing")]
                tracing::error!(
                    panic = super::unwind::message(&*_panic),
                    "quota resolver panicked"
                );
                failed()
            }
            Err(_elapsed) => {
                #[cfg(feature = "tracing")]
                tracing::warn!(timeout = ?settings.timeout, "quota resolver timed out");
                failed()
            }
        };
        let entry = Entry {
            answer,
            expires: Instant::now().checked_add(ttl),
        };
        let resolution = entry.clone().into_resolution(&settings.on_failure);
        lookup.finish(entry);
        resolution
    }
}

/// The lookup of one tenant: its placeholder in the map, and its expired entry when that
/// held a plan. Dropped unfinished (the call went away), it puts the expired entry back, so
/// that the next lookup (a waiting call's, or a later call's) still has the plan to fall back
/// on; without one, its placeholder passes to a waiting call.
struct Lookup<'a> {
    guard: Option<Guard<'a>>,
    last: Option<Entry>,
}

impl<'a> Lookup<'a> {
    fn new(guard: Guard<'a>, last: Option<Entry>) -> Self {
        Self {
            guard: Some(guard),
            last,
        }
    }

    /// The plan of the expired entry.
    fn last_plan(&self) -> Option<&Plan> {
        match &self.last {
            Some(Entry {
                answer: Answer::Plan(plan),
                ..
            }) => Some(plan),
            _ => None,
        }
    }

    /// Stores `entry` for the calls waiting on this lookup.
    fn finish(mut self, entry: Entry) {
        if let Some(guard) = self.guard.take() {
            // Err: the tenant was invalidated meanwhile; the answer stands for the calls
            // that waited for it, but is not kept.
            let _ = guard.insert(entry);
        }
    }
}

impl Drop for Lookup<'_> {
    fn drop(&mut self) {
        if let (Some(guard), Some(last)) = (self.guard.take(), self.last.take()) {
            // Waiting calls wake to an expired entry, and one of them looks it up again.
            let _ = guard.insert(last);
        }
    }
}

/// A map holding at most `max_entries`: shards of at least 32 entries (one for fewer), and a
/// capacity that is a multiple of their count, so that no shard's rounding adds entries.
fn new_map(max_entries: usize) -> Map {
    let per_32 = max_entries / 32;
    let shards = if per_32 == 0 {
        1
    } else {
        (1usize << per_32.ilog2()).min(64)
    };
    let capacity = max_entries / shards * shards;
    let options = OptionsBuilder::new()
        .shards(shards)
        .estimated_items_capacity(capacity.min(4_096))
        .weight_capacity(u64::try_from(capacity).unwrap_or(u64::MAX))
        .build()
        .expect("both capacities are set, the only options quick_cache requires");
    Map::with_options(
        options,
        UnitWeighter,
        RandomState::default(),
        DefaultLifecycle::default(),
    )
}

impl<R> Clone for CachedResolver<R> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<R> fmt::Debug for CachedResolver<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedResolver")
            .field("settings", &self.shared.settings)
            .field("len", &self.shared.map.len())
            .finish_non_exhaustive()
    }
}
