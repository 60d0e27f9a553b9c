//! Tracing events and metrics counters, each behind its feature; no-ops without them.

#[cfg(feature = "tracing")]
use ratewarden_core::Key;

/// What happened to one request, for the counters.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    Allowed,
    Denied,
    ShadowDenied,
    MissingKey,
    /// The store failed and the failure mode let the request through uncounted.
    FailureOpen,
    /// The store failed and the failure mode answered 503.
    FailureClosed,
    /// The store failed and the fallback store admitted the request.
    FallbackAllowed,
    /// The store failed and the fallback store denied the request.
    FallbackDenied,
}

impl Event {
    #[cfg(feature = "metrics")]
    const fn label(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::ShadowDenied => "shadow_denied",
            Self::MissingKey => "missing_key",
            Self::FailureOpen => "failure_open",
            Self::FailureClosed => "failure_closed",
            Self::FallbackAllowed => "fallback_allowed",
            Self::FallbackDenied => "fallback_denied",
        }
    }
}

/// Counts `event` under `ratewarden_requests_total{limit, outcome}` (the name label shares the layer's
/// string: no allocation per request).
#[inline]
pub(crate) fn count(name: &std::sync::Arc<str>, event: Event) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "ratewarden_requests_total",
        "limit" => metrics::SharedString::from_shared(std::sync::Arc::clone(name)),
        "outcome" => event.label()
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, event);
}

/// A stable, unlinkable-across-restarts fingerprint of a key for logs: never the key itself.
#[cfg(feature = "tracing")]
pub(crate) fn fingerprint(key: &Key) -> u64 {
    use std::hash::BuildHasher;
    static STATE: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    STATE.get_or_init(Default::default).hash_one(key)
}
