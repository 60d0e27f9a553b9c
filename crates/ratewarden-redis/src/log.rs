//! The events this crate logs, through `tracing` with the `tracing` feature. Without it they
//! compile to nothing, and the crate does not depend on `tracing`.

use ratewarden_core::StoreError;
use redis::RedisError;

/// Redis's clock and this host's disagree by more than the configured threshold (warning).
#[inline]
pub(crate) fn clock_skew(skew_us: i64, threshold_us: i64) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        skew_us,
        threshold_us,
        "the clocks of this host and Redis disagree"
    );
    #[cfg(not(feature = "tracing"))]
    let _ = (skew_us, threshold_us);
}

/// The state in Redis key `name` could not be read: the check counted it as spent, and
/// replaced it (error).
#[inline]
pub(crate) fn corrupt_state(name: &[u8]) {
    #[cfg(feature = "tracing")]
    tracing::error!(
        key = %String::from_utf8_lossy(name),
        "rate-limit state in Redis could not be read: the key counts as spent, and its state was replaced"
    );
    #[cfg(not(feature = "tracing"))]
    let _ = name;
}

/// A refund of limits a request's other limit denied failed: its units stay counted until
/// they refill (warn).
#[inline]
pub(crate) fn refund_failed(error: &StoreError) {
    #[cfg(feature = "tracing")]
    tracing::warn!(%error, "a refund of rate-limit units failed: they stay counted until they refill");
    #[cfg(not(feature = "tracing"))]
    let _ = error;
}

/// A part of a split this gateway just made could not be started: it starts spent when first
/// checked instead (debug).
#[inline]
pub(crate) fn part_not_started(error: &StoreError) {
    #[cfg(feature = "tracing")]
    tracing::debug!(%error, "a part of a new split could not be started");
    #[cfg(not(feature = "tracing"))]
    let _ = error;
}

/// A connection to a server that turned out to be a replica could not be replaced (warning).
#[inline]
pub(crate) fn replica_not_replaced(error: &RedisError) {
    #[cfg(feature = "tracing")]
    tracing::warn!(%error, "could not replace a connection to a replica");
    #[cfg(not(feature = "tracing"))]
    let _ = error;
}

/// The server has no Redis functions for this store (a version before 7.0, or a user not
/// allowed them): checks go by `EVALSHA` from now on (warning, once per store).
#[inline]
pub(crate) fn functions_unavailable(error: &RedisError) {
    #[cfg(feature = "tracing")]
    tracing::warn!(%error, "Redis functions are unavailable: checks go by EVALSHA, which costs Redis more");
    #[cfg(not(feature = "tracing"))]
    let _ = error;
}

/// Redis's `maxmemory-policy` (on `node` of a cluster) may evict rate-limit states: an
/// evicted key starts again with a fresh quota (warning, at every read that finds it).
#[inline]
pub(crate) fn evicting_policy(policy: &str, node: Option<&str>) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        policy,
        node = node.unwrap_or("the server"),
        "Redis's maxmemory-policy evicts rate-limit states: an evicted key starts again with a \
         fresh quota (over-admission); set maxmemory-policy to noeviction"
    );
    #[cfg(not(feature = "tracing"))]
    let _ = (policy, node);
}

/// Redis would not report its `maxmemory-policy` (`CONFIG` not allowed or renamed away): the
/// store cannot warn of an evicting one (info, when first found so).
#[inline]
pub(crate) fn eviction_policy_unknown(reason: &str) {
    #[cfg(feature = "tracing")]
    tracing::info!(
        reason,
        "cannot read Redis's maxmemory-policy: make sure it is noeviction, or rate-limit states may be evicted"
    );
    #[cfg(not(feature = "tracing"))]
    let _ = reason;
}

#[cfg(all(test, feature = "tracing"))]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    /// Counts the events at each level it sees.
    #[derive(Default)]
    struct Counts {
        errors: AtomicUsize,
        warnings: AtomicUsize,
        debug: AtomicUsize,
    }

    struct Counting(Arc<Counts>);

    impl Subscriber for Counting {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let counter = match *event.metadata().level() {
                Level::ERROR => &self.0.errors,
                Level::WARN => &self.0.warnings,
                _ => &self.0.debug,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    #[test]
    fn with_the_feature_every_event_reaches_the_subscriber_at_its_level() {
        let counts = Arc::new(Counts::default());
        tracing::subscriber::with_default(Counting(Arc::clone(&counts)), || {
            super::corrupt_state(b"rl:{i1}:00");
            super::refund_failed(&ratewarden_core::StoreError::new(
                ratewarden_core::StoreErrorKind::Timeout,
            ));
            super::clock_skew(200_000, 100_000);
            super::replica_not_replaced(&redis::RedisError::from(std::io::Error::other("x")));
            super::functions_unavailable(&redis::RedisError::from(std::io::Error::other("x")));
            super::evicting_policy("allkeys-lru", Some("127.0.0.1:7000"));
            super::eviction_policy_unknown("NOPERM");
            super::part_not_started(&super::StoreError::new(
                ratewarden_core::StoreErrorKind::Timeout,
            ));
        });
        assert_eq!(counts.errors.load(Ordering::Relaxed), 1);
        assert_eq!(counts.warnings.load(Ordering::Relaxed), 5);
        assert_eq!(counts.debug.load(Ordering::Relaxed), 2);
    }
}
