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

/// Counts one request's outcome.
#[inline]
pub(crate) fn count(outcome: Outcome) {
    #[cfg(feature = "metrics")]
    metrics::counter!("ratewarden_policy_requests_total", "outcome" => outcome.label())
        .increment(1);
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
