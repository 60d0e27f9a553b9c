//! Classifying Redis failures into [`StoreErrorKind`]s.

use rl_core::{StoreError, StoreErrorKind};

/// The kind of a Redis error: what a circuit breaker needs to know.
pub(crate) fn classify(error: redis::RedisError) -> StoreError {
    let kind = if error.is_timeout() {
        StoreErrorKind::Timeout
    } else if error.is_io_error() || error.is_connection_refusal() || error.is_connection_dropped()
    {
        StoreErrorKind::Connection
    } else {
        match error.code() {
            Some("BUSY" | "LOADING" | "MASTERDOWN") => StoreErrorKind::Busy,
            Some("OOM") => StoreErrorKind::OutOfMemory,
            Some("READONLY") => StoreErrorKind::ReadOnly,
            Some("CLUSTERDOWN" | "TRYAGAIN" | "MOVED" | "ASK") => StoreErrorKind::ClusterDown,
            Some("WRONGTYPE") => StoreErrorKind::CorruptState,
            _ if error.to_string().contains("rl: corrupt state") => StoreErrorKind::CorruptState,
            _ => StoreErrorKind::Script,
        }
    };
    StoreError::with_source(kind, error)
}
