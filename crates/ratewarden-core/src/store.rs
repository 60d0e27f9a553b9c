//! The [`Store`] trait: where limiter state lives.

use std::future::Future;
use std::sync::Arc;

use crate::{Decision, Key, Quota, StoreError};

/// Where limiter state lives. Implemented by `ratewarden-memory` (in process) and
/// `ratewarden-redis` (shared by a fleet).
///
/// A store keeps one state per key, [scope](Key::scoped) and [`Quota`]
/// ([`Key::limit_id`]): requests decided under different quotas, or under differently named
/// limits, never share state, even on one key.
///
/// The futures are `Send`, so generic callers (a tower service) can spawn or box them, while an
/// implementor may write plain `async fn`s.
///
/// ```
/// use ratewarden_core::{Decision, Info, Key, Quota, Store, StoreError};
/// use std::time::Duration;
///
/// /// A store that admits everything (for illustration).
/// struct AllowAll;
///
/// impl Store for AllowAll {
///     async fn check(&self, _: &Key, quota: &Quota, _: u32) -> Result<Decision, StoreError> {
///         let limit = u64::from(quota.burst());
///         Ok(Decision::Allowed(Info::new(limit, limit, Duration::ZERO, Duration::ZERO)))
///     }
///     async fn peek(&self, key: &Key, quota: &Quota) -> Result<Decision, StoreError> {
///         self.check(key, quota, 0).await
///     }
///     async fn reset(&self, _: &Key, _: &Quota) -> Result<(), StoreError> {
///         Ok(())
///     }
/// }
///
/// async fn is_allowed<S: Store>(store: &S, key: &Key, quota: &Quota) -> bool {
///     matches!(store.check(key, quota, 1).await, Ok(d) if d.is_allowed())
/// }
/// ```
pub trait Store: Send + Sync + 'static {
    /// Counts `cost` units against `key` under `quota` if they fit, and says what happened.
    ///
    /// A cost of 0 consumes nothing and reports the key's state. A cost the quota can never
    /// admit is [`Decision::InsufficientCapacity`].
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot decide (unreachable, timed out, ...). Never for a
    /// denial.
    fn check(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Decides at once, if this store can: a store that needs no I/O (the memory store) returns
    /// `Some`, sparing its caller a future; one that must wait (Redis) returns `None`, the
    /// default, and the caller uses [`check`](Self::check). Never counts twice: when this
    /// returns `Some`, the cost was counted (or not) exactly as `check` would have.
    ///
    /// ```
    /// # use ratewarden_core::{Key, Quota, Store};
    /// # fn demo(store: &impl Store, key: &Key, quota: &Quota) {
    /// match store.check_ready(key, quota, 1) {
    ///     Some(result) => { /* decided without waiting */ }
    ///     None => { /* call `store.check(key, quota, 1).await` */ }
    /// }
    /// # }
    /// ```
    fn check_ready(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
    ) -> Option<Result<Decision, StoreError>> {
        let _ = (key, quota, cost);
        None
    }

    /// Whether a request of cost 1 would be admitted now, without counting it (and without
    /// creating state for an unknown key).
    ///
    /// # Errors
    ///
    /// As for [`check`](Self::check).
    fn peek(
        &self,
        key: &Key,
        quota: &Quota,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Forgets `key`'s state under `quota`'s algorithm: its next request sees a fresh quota.
    ///
    /// # Errors
    ///
    /// As for [`check`](Self::check).
    fn reset(
        &self,
        key: &Key,
        quota: &Quota,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl<S: Store> Store for Arc<S> {
    fn check_ready(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
    ) -> Option<Result<Decision, StoreError>> {
        (**self).check_ready(key, quota, cost)
    }

    fn check(
        &self,
        key: &Key,
        quota: &Quota,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).check(key, quota, cost)
    }

    fn peek(
        &self,
        key: &Key,
        quota: &Quota,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).peek(key, quota)
    }

    fn reset(
        &self,
        key: &Key,
        quota: &Quota,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).reset(key, quota)
    }
}
