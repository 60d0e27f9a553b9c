//! [`Resolution`], what a [`CachedResolver`](super::CachedResolver) answers, and
//! [`OnFailure`], its answer while the resolver fails.

use super::Plan;

/// What a [`CachedResolver`](super::CachedResolver) answers when its resolver fails or does not
/// answer within the lookup timeout (and no earlier plan of the tenant is at hand).
///
/// | variant | the caller |
/// |---------|------------|
/// | [`FailureMode`](Self::FailureMode) (the default) | applies its own failure mode, as when its store fails ([`FailureMode`](crate::rate_limit::FailureMode)) |
/// | [`Plan`](Self::Plan) | limits the tenant by this plan |
/// | [`Unavailable`](Self::Unavailable) | answers `503 Service Unavailable` |
///
/// ```
/// use ratewarden_tower::Quota;
/// use ratewarden_tower::tenant::{OnFailure, Plan};
///
/// let strict = OnFailure::Plan(Plan::new("fallback", [("rps", Quota::per_second(1)?)])?);
/// assert_eq!(OnFailure::default(), OnFailure::FailureMode);
/// # let _ = (strict, OnFailure::Unavailable);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnFailure {
    /// Answer [`Resolution::FailureMode`]: the caller applies its failure mode.
    #[default]
    FailureMode,
    /// Answer [`Resolution::Plan`] with this plan.
    Plan(Plan),
    /// Answer [`Resolution::Unavailable`]: the caller answers 503.
    Unavailable,
}

/// What a [`CachedResolver`](super::CachedResolver) says of a tenant; never an error, as a
/// failed lookup is already turned into its configured answer ([`OnFailure`]).
///
/// ```
/// use ratewarden_tower::Quota;
/// use ratewarden_tower::tenant::{Plan, Resolution};
///
/// let plan = Plan::new("pro", [("rps", Quota::per_second(10)?)])?;
/// assert_eq!(Resolution::Plan(plan.clone()).plan(), Some(&plan));
/// assert_eq!(Resolution::Unknown.plan(), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolution {
    /// The tenant's plan; or, while the resolver fails, the tenant's last plan, or the
    /// [`OnFailure::Plan`].
    Plan(Plan),
    /// The resolver knows no such tenant: the caller decides (a default plan, a rejection).
    Unknown,
    /// The resolver failed, and [`OnFailure::FailureMode`] says: apply the caller's failure
    /// mode.
    FailureMode,
    /// The resolver failed, and [`OnFailure::Unavailable`] says: answer 503.
    Unavailable,
}

impl Resolution {
    /// The plan to apply, if this is [`Resolution::Plan`].
    ///
    /// ```
    /// use ratewarden_tower::tenant::Resolution;
    /// assert!(Resolution::Unavailable.plan().is_none());
    /// ```
    #[must_use]
    pub const fn plan(&self) -> Option<&Plan> {
        match self {
            Self::Plan(plan) => Some(plan),
            Self::Unknown | Self::FailureMode | Self::Unavailable => None,
        }
    }
}

impl OnFailure {
    /// The answer this stands for.
    pub(super) fn resolution(&self) -> Resolution {
        match self {
            Self::FailureMode => Resolution::FailureMode,
            Self::Plan(plan) => Resolution::Plan(plan.clone()),
            Self::Unavailable => Resolution::Unavailable,
        }
    }
}
