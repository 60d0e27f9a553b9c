//! [`PolicyError`]: what is wrong in a policy, which field, and where in its file.

use std::fmt;
use std::sync::Arc;

/// Where a field is in a policy file: the file, its line and, when known, its column (both
/// counted from 1).
///
/// ```
/// use ratewarden_tower::policy::{Policy, Rule};
/// // A policy built in code has no location.
/// let err = Policy::new().rule(Rule::new().route("no-slash")).validate(&[]).unwrap_err();
/// assert!(err.location().is_none());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub(crate) file: Arc<str>,
    pub(crate) line: usize,
    pub(crate) column: Option<usize>,
}

impl Location {
    /// The file, as it was named when loaded.
    ///
    /// See the example on [`Location`].
    #[must_use]
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The line, from 1.
    ///
    /// See the example on [`Location`].
    #[must_use]
    pub const fn line(&self) -> usize {
        self.line
    }

    /// The column, from 1, when the format reports one.
    ///
    /// See the example on [`Location`].
    #[must_use]
    pub const fn column(&self) -> Option<usize> {
        self.column
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)?;
        if let Some(column) = self.column {
            write!(f, ":{column}")?;
        }
        Ok(())
    }
}

/// What is wrong with one field of a policy.
///
/// ```
/// use ratewarden_tower::policy::{Policy, Problem, Rule};
/// let err = Policy::new().rule(Rule::new().route("no-slash")).validate(&[]).unwrap_err();
/// assert!(matches!(err.problem(), Problem::InvalidRoute { .. }));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// A quota string that does not parse, or figures no quota can have.
    InvalidQuota {
        /// The quota as written.
        quota: String,
        /// Why it is refused.
        reason: String,
    },
    /// A limit names a key that no layer registered.
    UnknownKey {
        /// The key name.
        key: String,
        /// The names that are registered.
        known: Vec<String>,
    },
    /// A limit name that is empty, longer than 64 bytes, or has a byte other than an ASCII
    /// letter, digit, `-`, `_`, `.` or `:`.
    InvalidLimitName {
        /// The name.
        name: String,
    },
    /// A limit name used twice with another key or quota: a name is one limit.
    ConflictingLimit {
        /// The name.
        name: String,
        /// The field where it was first defined.
        first: String,
    },
    /// More limits on one request than a policy may put there.
    TooManyLimits {
        /// How many.
        count: usize,
        /// The most allowed.
        max: usize,
    },
    /// A route pattern that is not `/exact/path` or `/prefix/*`.
    InvalidRoute {
        /// The pattern.
        route: String,
    },
    /// A header name or value that HTTP does not allow.
    InvalidHeader {
        /// The name or value.
        header: String,
    },
    /// A method name that HTTP does not allow.
    InvalidMethod {
        /// The method.
        method: String,
    },
    /// A cost of 0, which would make a request free.
    ZeroCost,
    /// The default rule has conditions (route, method, header): it applies to requests no
    /// rule matched, so they would mean nothing.
    ConditionsOnDefault,
    /// An allow or deny list entry that is neither a network nor a value.
    InvalidListEntry {
        /// The entry.
        entry: String,
    },
    /// A field the format reads that has the wrong shape (an unknown field, a number where
    /// a string belongs, a syntax error).
    Syntax {
        /// The parser's message.
        message: String,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidQuota { reason, .. } => f.write_str(reason),
            Self::UnknownKey { key, known } => {
                write!(f, "unknown key {key:?} (registered: {})", known.join(", "))
            }
            Self::InvalidLimitName { name } => write!(
                f,
                "invalid limit name {name:?}: 1 to 64 ASCII letters, digits, '-', '_', '.' or ':'"
            ),
            Self::ConflictingLimit { name, first } => write!(
                f,
                "limit {name:?} has another key or quota than at {first}: a name is one limit"
            ),
            Self::TooManyLimits { count, max } => {
                write!(f, "{count} limits on one request (at most {max})")
            }
            Self::InvalidRoute { route } => write!(
                f,
                "invalid route {route:?}: expected an exact path such as /users/{{id}} or a prefix such as /api/*"
            ),
            Self::InvalidHeader { header } => write!(f, "invalid header {header:?}"),
            Self::InvalidMethod { method } => write!(f, "invalid method {method:?}"),
            Self::ZeroCost => f.write_str("a cost of 0 would make the request free"),
            Self::ConditionsOnDefault => f.write_str(
                "the default applies to requests no rule matched: it takes no route, method or header",
            ),
            Self::InvalidListEntry { entry } => write!(f, "invalid list entry {entry:?}"),
            Self::Syntax { message } => f.write_str(message),
        }
    }
}

/// A policy that cannot be used: the field (such as `rules[2].limits[0].quota`), what is
/// wrong with it and, for a policy read from a file, where it is.
///
/// Displayed as `FILE:LINE[:COLUMN]: FIELD: PROBLEM`, or `FIELD: PROBLEM` for a policy built
/// in code.
///
/// ```
/// use ratewarden_tower::policy::{NamedLimit, Policy, Rule};
/// use ratewarden_tower::Quota;
///
/// let policy = Policy::new()
///     .rule(Rule::new().limit(NamedLimit::new("per-user", "user", Quota::per_second(5)?)));
/// let err = policy.validate(&["ip"]).unwrap_err();
/// assert_eq!(err.field(), "rules[0].limits[0].key");
/// assert_eq!(
///     err.to_string(),
///     r#"rules[0].limits[0].key: unknown key "user" (registered: global, ip)"#
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    pub(crate) field: String,
    pub(crate) problem: Problem,
    pub(crate) location: Option<Location>,
}

impl PolicyError {
    pub(crate) fn new(field: impl Into<String>, problem: Problem) -> Self {
        Self {
            field: field.into(),
            problem,
            location: None,
        }
    }

    /// The field, as a path from the top of the policy (`rules[2].limits[0].quota`).
    ///
    /// See the example on [`PolicyError`].
    #[must_use]
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong with it.
    ///
    /// See the example on [`PolicyError`].
    #[must_use]
    pub const fn problem(&self) -> &Problem {
        &self.problem
    }

    /// Where the field is in its file, for a policy read from one.
    ///
    /// See the example on [`Location`].
    #[must_use]
    pub const fn location(&self) -> Option<&Location> {
        self.location.as_ref()
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(location) = &self.location {
            write!(f, "{location}: ")?;
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        write!(f, "{}", self.problem)
    }
}

impl std::error::Error for PolicyError {}
