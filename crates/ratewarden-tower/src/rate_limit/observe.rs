//! Tracing events and metrics counters, each behind its feature; no-ops without them.

#[cfg(feature = "tracing")]
use ratewarden_core::Key;

/// What happened to one request, for the counters.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    Allowed,
    Denied,
    ShadowDenied,
    /// No key, and the missing-key rule answered (or would have, in shadow mode).
    MissingKey,
    /// No key, and `MissingKey::Skip` let the request through uncounted.
    MissingKeySkipped,
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
    /// Every event, in the order of their discriminants.
    #[cfg(feature = "metrics")]
    const ALL: [Self; 9] = [
        Self::Allowed,
        Self::Denied,
        Self::ShadowDenied,
        Self::MissingKey,
        Self::MissingKeySkipped,
        Self::FailureOpen,
        Self::FailureClosed,
        Self::FallbackAllowed,
        Self::FallbackDenied,
    ];

    #[cfg(feature = "metrics")]
    const fn label(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::ShadowDenied => "shadow_denied",
            Self::MissingKey => "missing_key",
            Self::MissingKeySkipped => "missing_key_skipped",
            Self::FailureOpen => "failure_open",
            Self::FailureClosed => "failure_closed",
            Self::FallbackAllowed => "fallback_allowed",
            Self::FallbackDenied => "fallback_denied",
        }
    }
}

/// The `ratewarden_requests_total{limit, outcome}` counters of one layer: their keys (name and
/// labels) are built once, when the layer makes its service, so that counting a request
/// allocates nothing. Each count still asks the installed recorder, so a recorder installed
/// after the layer was built counts from then on.
#[derive(Debug)]
pub(crate) struct Counters {
    #[cfg(feature = "metrics")]
    keys: [metrics::Key; Event::ALL.len()],
}

#[cfg(feature = "metrics")]
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

impl Counters {
    /// The counters of the limit named `name`.
    pub(crate) fn new(name: &std::sync::Arc<str>) -> Self {
        #[cfg(feature = "metrics")]
        {
            let keys = Event::ALL.map(|event| {
                let labels = vec![
                    metrics::Label::new(
                        "limit",
                        metrics::SharedString::from_shared(std::sync::Arc::clone(name)),
                    ),
                    metrics::Label::new("outcome", event.label()),
                ];
                metrics::Key::from_parts("ratewarden_requests_total", labels)
            });
            Self { keys }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = name;
            Self {}
        }
    }

    /// Counts `event`.
    #[inline]
    pub(crate) fn count(&self, event: Event) {
        #[cfg(feature = "metrics")]
        metrics::with_recorder(|recorder| {
            recorder
                .register_counter(&self.keys[event as usize], &METADATA)
                .increment(1);
        });
        #[cfg(not(feature = "metrics"))]
        let _ = event;
    }
}

/// A stable, unlinkable-across-restarts fingerprint of a key for logs: never the key itself.
#[cfg(feature = "tracing")]
pub(crate) fn fingerprint(key: &Key) -> u64 {
    use std::hash::BuildHasher;
    static STATE: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    STATE.get_or_init(Default::default).hash_one(key)
}
