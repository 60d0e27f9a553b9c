//! Runtime store failures: [`StoreError`] and [`StoreErrorKind`].

use std::error::Error;
use std::fmt;

/// What kind of failure a [`StoreError`] is, so that a circuit breaker can tell a store that
/// cannot decide for anyone from a problem with one request or one key.
///
/// Every kind is a backend failure ([`is_backend_failure`](Self::is_backend_failure)) except
/// [`CorruptState`](Self::CorruptState) and [`InvalidInput`](Self::InvalidInput): an error
/// nobody has classified (a new server error code, a script that fails for everyone) counts
/// against the store, so that a failure mode engages rather than every request failing one by
/// one.
///
/// ```
/// use ratewarden_core::StoreErrorKind;
/// assert!(StoreErrorKind::Timeout.is_backend_failure());
/// assert!(StoreErrorKind::Unauthorized.is_backend_failure());
/// assert!(!StoreErrorKind::InvalidInput.is_backend_failure());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store could not be reached, or the connection broke.
    Connection,
    /// The store did not answer within its deadline.
    Timeout,
    /// No connection could be had from the pool in time.
    PoolExhausted,
    /// The store is busy (a long-running script, `BUSY`, or `LOADING`).
    Busy,
    /// The store is out of memory (`OOM`).
    OutOfMemory,
    /// The store accepts only reads (`READONLY`, a replica after failover).
    ReadOnly,
    /// The cluster cannot serve the key (`CLUSTERDOWN`, `TRYAGAIN`, too many redirects).
    ClusterDown,
    /// The store refused the credentials or the permissions it was given (`NOAUTH`,
    /// `WRONGPASS`, `NOPERM`).
    Unauthorized,
    /// A script failed to run or returned something the store did not expect.
    Script,
    /// The store holds data of the wrong shape under the key (`WRONGTYPE`, a garbled field).
    CorruptState,
    /// The request itself was invalid for this store (a quota it cannot express, say).
    InvalidInput,
    /// A circuit breaker in front of the store is open: the store was not asked.
    CircuitOpen,
    /// The store cannot do what was asked (several limits decided together, by a store that
    /// decides one at a time): nothing was counted.
    Unsupported,
    /// Anything else.
    Other,
}

impl StoreErrorKind {
    /// Whether this failure says the backend is unhealthy (and should count against a circuit
    /// breaker), as opposed to a problem with one request or one key.
    ///
    /// ```
    /// use ratewarden_core::StoreErrorKind;
    /// assert!(StoreErrorKind::ReadOnly.is_backend_failure());
    /// assert!(!StoreErrorKind::CorruptState.is_backend_failure());
    /// ```
    #[must_use]
    pub const fn is_backend_failure(self) -> bool {
        !matches!(
            self,
            Self::CorruptState | Self::InvalidInput | Self::Unsupported
        )
    }

    /// A short name for logs and metric labels: `connection`, `timeout`, `pool_exhausted`,
    /// `busy`, `out_of_memory`, `read_only`, `cluster_down`, `unauthorized`, `script`,
    /// `corrupt_state`, `invalid_input`, `circuit_open`, `unsupported` or `other`.
    ///
    /// ```
    /// assert_eq!(ratewarden_core::StoreErrorKind::OutOfMemory.as_str(), "out_of_memory");
    /// ```
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Connection => "connection",
            Self::Timeout => "timeout",
            Self::PoolExhausted => "pool_exhausted",
            Self::Busy => "busy",
            Self::OutOfMemory => "out_of_memory",
            Self::ReadOnly => "read_only",
            Self::ClusterDown => "cluster_down",
            Self::Unauthorized => "unauthorized",
            Self::Script => "script",
            Self::CorruptState => "corrupt_state",
            Self::InvalidInput => "invalid_input",
            Self::CircuitOpen => "circuit_open",
            Self::Unsupported => "unsupported",
            Self::Other => "other",
        }
    }

    const fn describe(self) -> &'static str {
        match self {
            Self::Connection => "store connection failed",
            Self::Timeout => "store timed out",
            Self::PoolExhausted => "no store connection available",
            Self::Busy => "store busy",
            Self::OutOfMemory => "store out of memory",
            Self::ReadOnly => "store is read-only",
            Self::ClusterDown => "store cluster cannot serve the key",
            Self::Unauthorized => "store refused the credentials or permissions",
            Self::Script => "store script failed",
            Self::CorruptState => "store holds unexpected data for the key",
            Self::InvalidInput => "invalid request to the store",
            Self::CircuitOpen => "store circuit breaker is open",
            Self::Unsupported => "the store cannot do this",
            Self::Other => "store error",
        }
    }
}

/// A failure of a [`Store`](crate::Store) to decide. Never a denial: denials are
/// [`Decision`](crate::Decision)s.
///
/// Opaque: read it with [`kind`](Self::kind), the `is_*` predicates and
/// [`source`](Error::source).
///
/// ```
/// use ratewarden_core::{StoreError, StoreErrorKind};
/// use std::io;
///
/// let err = StoreError::with_source(
///     StoreErrorKind::Connection,
///     io::Error::new(io::ErrorKind::ConnectionRefused, "refused"),
/// );
/// assert!(err.is_connection());
/// assert_eq!(err.to_string(), "store connection failed: refused");
/// assert!(std::error::Error::source(&err).is_some());
/// ```
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Option<Box<dyn Error + Send + Sync>>,
}

impl StoreError {
    /// An error of `kind` with no underlying cause.
    ///
    /// ```
    /// use ratewarden_core::{StoreError, StoreErrorKind};
    /// assert!(StoreError::new(StoreErrorKind::Timeout).is_timeout());
    /// ```
    #[must_use]
    pub const fn new(kind: StoreErrorKind) -> Self {
        Self { kind, source: None }
    }

    /// An error of `kind` caused by `source`.
    ///
    /// ```
    /// use ratewarden_core::{StoreError, StoreErrorKind};
    /// let err = StoreError::with_source(StoreErrorKind::Script, "bad reply");
    /// assert_eq!(err.to_string(), "store script failed: bad reply");
    /// ```
    #[must_use]
    pub fn with_source(
        kind: StoreErrorKind,
        source: impl Into<Box<dyn Error + Send + Sync>>,
    ) -> Self {
        Self {
            kind,
            source: Some(source.into()),
        }
    }

    /// What kind of failure this is.
    ///
    /// ```
    /// use ratewarden_core::{StoreError, StoreErrorKind};
    /// assert_eq!(StoreError::new(StoreErrorKind::Busy).kind(), StoreErrorKind::Busy);
    /// ```
    #[must_use]
    pub const fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// Whether the store missed its deadline.
    ///
    /// ```
    /// use ratewarden_core::{StoreError, StoreErrorKind};
    /// assert!(StoreError::new(StoreErrorKind::Timeout).is_timeout());
    /// ```
    #[must_use]
    pub const fn is_timeout(&self) -> bool {
        matches!(self.kind, StoreErrorKind::Timeout)
    }

    /// Whether the store could not be reached.
    ///
    /// ```
    /// use ratewarden_core::{StoreError, StoreErrorKind};
    /// assert!(StoreError::new(StoreErrorKind::Connection).is_connection());
    /// ```
    #[must_use]
    pub const fn is_connection(&self) -> bool {
        matches!(self.kind, StoreErrorKind::Connection)
    }

    /// Whether this failure says the backend is unhealthy; see
    /// [`StoreErrorKind::is_backend_failure`].
    ///
    /// ```
    /// use ratewarden_core::{StoreError, StoreErrorKind};
    /// assert!(StoreError::new(StoreErrorKind::OutOfMemory).is_backend_failure());
    /// ```
    #[must_use]
    pub const fn is_backend_failure(&self) -> bool {
        self.kind.is_backend_failure()
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.describe())?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}
