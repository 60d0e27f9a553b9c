//! The policy layer's metrics counters (feature `metrics`); no-ops without it.

/// What happened to one request, for `ratewarden_policy_requests_total{outcome}`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Outcome {
    /// Admitted by every limit.
    Allowed,
    /// Refused by a limit (429).
    Denied,
    /// Refused by a limit, let through by a shadow rule.
    ShadowDenied,
    /// Let through uncounted by a rule whose action is `allow`.
    RuleAllowed,
    /// Refused by a rule whose action is `deny`.
    RuleDenied,
    /// On the allow list: let through uncounted.
    AllowListed,
    /// On the deny list: refused.
    DenyListed,
    /// A limit's key was missing, and the missing-key rule answered.
    MissingKey,
    /// The store failed and the request went through uncounted.
    FailureOpen,
    /// The store failed and the request was answered 503.
    FailureClosed,
    /// The store failed and the local fallback decided.
    Fallback,
}

impl Outcome {
    /// Every outcome, in the order of their discriminants.
    #[cfg(feature = "metrics")]
    const ALL: [Self; 11] = [
        Self::Allowed,
        Self::Denied,
        Self::ShadowDenied,
        Self::RuleAllowed,
        Self::RuleDenied,
        Self::AllowListed,
        Self::DenyListed,
        Self::MissingKey,
        Self::FailureOpen,
        Self::FailureClosed,
        Self::Fallback,
    ];

    #[cfg(feature = "metrics")]
    const fn label(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::ShadowDenied => "shadow_denied",
            Self::RuleAllowed => "rule_allowed",
            Self::RuleDenied => "rule_denied",
            Self::AllowListed => "allow_listed",
            Self::DenyListed => "deny_listed",
            Self::MissingKey => "missing_key",
            Self::FailureOpen => "failure_open",
            Self::FailureClosed => "failure_closed",
            Self::Fallback => "fallback",
        }
    }
}

/// The keys of `ratewarden_policy_requests_total{outcome}`, in the order of [`Outcome::ALL`],
/// built at compile time: counting a request allocates nothing (`counter!` builds a key and
/// its list of labels per call when a label is not a literal).
#[cfg(feature = "metrics")]
static KEYS: [metrics::Key; Outcome::ALL.len()] = {
    macro_rules! keys {
        ($($i:literal)*) => {[$({
            static LABEL: [metrics::Label; 1] =
                [metrics::Label::from_static_parts("outcome", Outcome::ALL[$i].label())];
            metrics::Key::from_static_parts("ratewarden_policy_requests_total", &LABEL)
        }),*]};
    }
    keys!(0 1 2 3 4 5 6 7 8 9 10)
};

#[cfg(feature = "metrics")]
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// Counts one request's outcome.
#[inline]
pub(crate) fn count(outcome: Outcome) {
    #[cfg(feature = "metrics")]
    metrics::with_recorder(|recorder| {
        recorder
            .register_counter(&KEYS[outcome as usize], &METADATA)
            .increment(1);
    });
    #[cfg(not(feature = "metrics"))]
    let _ = outcome;
}

/// Counts a policy reload, taken (`ok`) or refused.
pub(crate) fn reload(ok: bool) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "ratewarden_policy_reloads_total",
        "result" => if ok { "ok" } else { "error" }
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = ok;
}
