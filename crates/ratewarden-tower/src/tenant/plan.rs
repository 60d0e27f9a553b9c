//! [`Plan`]: a tenant's named limits.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use ratewarden_core::{Key, MAX_LIMITS, Quota};

/// A tenant's set of limits: a name (`"free"`, `"pro"`) and up to [`MAX_LIMITS`] named
/// [`Quota`]s, all applied to each of the tenant's requests.
///
/// Cheap to clone (one reference count), so a resolver can hand out clones of a few shared
/// plans. A plan without limits limits nothing.
///
/// ```
/// use ratewarden_tower::Quota;
/// use ratewarden_tower::tenant::Plan;
///
/// let pro = Plan::new("pro", [
///     ("per-second", Quota::per_second(10)?),
///     ("per-hour", Quota::per_hour(1_000)?),
/// ])?;
/// assert_eq!(pro.name(), "pro");
/// let names: Vec<&str> = pro.limits().iter().map(|limit| limit.name()).collect();
/// assert_eq!(names, ["per-second", "per-hour"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Plan {
    inner: Arc<Inner>,
}

#[derive(PartialEq, Eq)]
struct Inner {
    name: Box<str>,
    limits: Box<[PlanLimit]>,
}

/// One limit of a [`Plan`]: its name and its [`Quota`].
///
/// ```
/// use ratewarden_tower::{Key, Quota};
/// use ratewarden_tower::tenant::Plan;
///
/// let plan = Plan::new("free", [("per-minute", Quota::per_minute(60)?)])?;
/// let limit = &plan.limits()[0];
/// assert_eq!(limit.name(), "per-minute");
/// assert_eq!(limit.quota(), &Quota::per_minute(60)?);
/// assert_eq!(limit.scope(), Key::scope_of("plan/per-minute"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanLimit {
    name: Box<str>,
    quota: Quota,
    /// `Key::scope_of("plan/" + name)`, computed once rather than hashed at every request.
    scope: u64,
}

impl PlanLimit {
    /// The limit's name, unique within its plan.
    ///
    /// ```
    /// # use ratewarden_tower::{Quota, tenant::Plan};
    /// let plan = Plan::new("free", [("burst", Quota::per_second(5)?)])?;
    /// assert_eq!(plan.limits()[0].name(), "burst");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The limit's quota.
    ///
    /// ```
    /// # use ratewarden_tower::{Quota, tenant::Plan};
    /// let quota = Quota::per_second(5)?;
    /// let plan = Plan::new("free", [("burst", quota)])?;
    /// assert_eq!(plan.limits()[0].quota(), &quota);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub const fn quota(&self) -> &Quota {
        &self.quota
    }

    /// [`Key::scope_of`] `plan/` and the limit's name, computed when the plan was made: the
    /// scope to count a tenant's key in under this limit ([`Key::scoped`]), apart from every
    /// policy limit's (named without the prefix).
    ///
    /// ```
    /// # use ratewarden_tower::{Key, Quota, tenant::Plan};
    /// let plan = Plan::new("free", [("burst", Quota::per_second(5)?)])?;
    /// assert_eq!(plan.limits()[0].scope(), Key::scope_of("plan/burst"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub const fn scope(&self) -> u64 {
        self.scope
    }
}

impl Plan {
    /// A plan named `name` with the limits given, in that order.
    ///
    /// # Errors
    ///
    /// [`PlanError`] for more than [`MAX_LIMITS`] limits, a limit without a name, or two
    /// limits with the same name.
    ///
    /// ```
    /// use ratewarden_tower::Quota;
    /// use ratewarden_tower::tenant::{Plan, PlanError};
    ///
    /// let second = Quota::per_second(1)?;
    /// let twice = Plan::new("bad", [("a", second), ("a", second)]);
    /// assert!(matches!(twice, Err(PlanError::DuplicateLimit { .. })));
    /// assert_eq!(Plan::new("unlimited", Vec::<(&str, _)>::new())?.limits().len(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new<N: AsRef<str>>(
        name: impl AsRef<str>,
        limits: impl IntoIterator<Item = (N, Quota)>,
    ) -> Result<Self, PlanError> {
        let plan = name.as_ref();
        let mut kept: Vec<PlanLimit> = Vec::new();
        for (limit, quota) in limits {
            let limit = limit.as_ref();
            if kept.len() == MAX_LIMITS {
                return Err(PlanError::TooManyLimits {
                    plan: plan.to_owned(),
                    max: MAX_LIMITS,
                });
            }
            // A name shown in a header field: a token (RFC 9110), as a policy limit's.
            let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
            if limit.is_empty() || !limit.bytes().all(token) {
                return Err(PlanError::EmptyLimitName {
                    plan: plan.to_owned(),
                });
            }
            if kept.iter().any(|k| &*k.name == limit) {
                return Err(PlanError::DuplicateLimit {
                    plan: plan.to_owned(),
                    limit: limit.to_owned(),
                });
            }
            kept.push(PlanLimit {
                name: limit.into(),
                quota,
                scope: Key::scope_of(&format!("plan/{limit}")),
            });
        }
        Ok(Self {
            inner: Arc::new(Inner {
                name: plan.into(),
                limits: kept.into_boxed_slice(),
            }),
        })
    }

    /// The plan's name.
    ///
    /// ```
    /// # use ratewarden_tower::{Quota, tenant::Plan};
    /// let plan = Plan::new("pro", [("rps", Quota::per_second(10)?)])?;
    /// assert_eq!(plan.name(), "pro");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The plan's limits, in the order given (at most [`MAX_LIMITS`]).
    ///
    /// ```
    /// # use ratewarden_tower::{Quota, tenant::Plan};
    /// let plan = Plan::new("pro", [("rps", Quota::per_second(10)?), ("rph", Quota::per_hour(500)?)])?;
    /// assert_eq!(plan.limits().len(), 2);
    /// assert_eq!(plan.limits()[1].quota(), &Quota::per_hour(500)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn limits(&self) -> &[PlanLimit] {
        &self.inner.limits
    }
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plan")
            .field("name", &self.inner.name)
            .field("limits", &self.inner.limits)
            .finish()
    }
}

/// Why a [`Plan`] could not be made.
///
/// ```
/// use ratewarden_tower::Quota;
/// use ratewarden_tower::tenant::{Plan, PlanError};
///
/// let err = Plan::new("free", [("", Quota::per_second(1)?)]).unwrap_err();
/// assert_eq!(err, PlanError::EmptyLimitName { plan: "free".into() });
/// assert_eq!(
///     err.to_string(),
///     r#"plan "free": a limit's name is empty or not a token (letters, digits, -._~ ...)"#
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlanError {
    /// More limits than one check decides together.
    TooManyLimits {
        /// The plan's name.
        plan: String,
        /// The most a plan may hold ([`MAX_LIMITS`]).
        max: usize,
    },
    /// A limit whose name is empty or not a token (it is shown in `RateLimit-Policy`).
    EmptyLimitName {
        /// The plan's name.
        plan: String,
    },
    /// Two limits with one name.
    DuplicateLimit {
        /// The plan's name.
        plan: String,
        /// The name given twice.
        limit: String,
    },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooManyLimits { plan, max } => {
                write!(f, "plan {plan:?}: more than {max} limits")
            }
            Self::EmptyLimitName { plan } => write!(
                f,
                "plan {plan:?}: a limit's name is empty or not a token (letters, digits, -._~ ...)"
            ),
            Self::DuplicateLimit { plan, limit } => {
                write!(f, "plan {plan:?}: two limits are named {limit:?}")
            }
        }
    }
}

impl Error for PlanError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_more_than_max_limits() {
        let quota = Quota::per_second(1).unwrap();
        let names: Vec<String> = (0..=MAX_LIMITS).map(|i| format!("l{i}")).collect();
        let full = Plan::new("full", names[..MAX_LIMITS].iter().map(|n| (n, quota))).unwrap();
        assert_eq!(full.limits().len(), MAX_LIMITS);
        let over = Plan::new("over", names.iter().map(|n| (n, quota)));
        assert_eq!(
            over,
            Err(PlanError::TooManyLimits {
                plan: "over".into(),
                max: MAX_LIMITS
            })
        );
    }

    #[test]
    fn clones_share_one_plan() {
        let plan = Plan::new("p", [("a", Quota::per_second(1).unwrap())]).unwrap();
        let clone = plan.clone();
        assert!(Arc::ptr_eq(&plan.inner, &clone.inner));
        assert_eq!(plan, clone);
    }
}
