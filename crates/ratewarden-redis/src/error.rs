//! Classifying Redis failures into [`StoreErrorKind`]s: the table is in the crate docs.

use ratewarden_core::{StoreError, StoreErrorKind};
use redis::{ErrorKind, ServerErrorKind};

/// The kind of a Redis error: what a circuit breaker needs to know.
pub(crate) fn classify(error: redis::RedisError) -> StoreError {
    StoreError::with_source(kind(&error), error)
}

fn kind(error: &redis::RedisError) -> StoreErrorKind {
    if error.is_timeout() {
        return StoreErrorKind::Timeout;
    }
    if error.is_io_error() || error.is_connection_refusal() || error.is_connection_dropped() {
        return StoreErrorKind::Connection;
    }
    match error.kind() {
        ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm) => {
            return StoreErrorKind::Unauthorized;
        }
        ErrorKind::ClusterConnectionNotFound => return StoreErrorKind::ClusterDown,
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => return StoreErrorKind::Script,
        _ => {}
    }
    let message = error.to_string();
    // An unauthenticated client sending a command of more than a few arguments is cut off by
    // Redis with a protocol error, before any NOAUTH.
    if message.contains("unauthenticated") {
        return StoreErrorKind::Unauthorized;
    }
    match error.code() {
        Some("BUSY" | "LOADING" | "MASTERDOWN") => StoreErrorKind::Busy,
        Some("OOM") => StoreErrorKind::OutOfMemory,
        Some("READONLY") => StoreErrorKind::ReadOnly,
        Some("CLUSTERDOWN" | "TRYAGAIN" | "MOVED" | "ASK") => StoreErrorKind::ClusterDown,
        // The keys of one call span slots: a fault of that call, not of the cluster (a batch
        // holds one state's checks, so none should ever get it).
        Some("CROSSSLOT") => StoreErrorKind::InvalidInput,
        Some("NOAUTH" | "WRONGPASS" | "NOPERM") => StoreErrorKind::Unauthorized,
        Some("WRONGTYPE") => StoreErrorKind::CorruptState,
        _ if message.contains("max number of clients") => StoreErrorKind::Connection,
        _ if message.contains("rl: corrupt state") => StoreErrorKind::CorruptState,
        Some("ERR") if message.contains("user_script") => StoreErrorKind::Script,
        _ => StoreErrorKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str, detail: &str) -> StoreErrorKind {
        kind(&redis::make_extension_error(
            code.into(),
            Some(detail.into()),
        ))
    }

    #[test]
    fn errors_that_fail_everyone_count_against_the_store() {
        for (code, detail, expected) in [
            (
                "NOAUTH",
                "Authentication required.",
                StoreErrorKind::Unauthorized,
            ),
            (
                "WRONGPASS",
                "invalid username-password pair or user is disabled.",
                StoreErrorKind::Unauthorized,
            ),
            (
                "NOPERM",
                "User limited has no permissions to run the 'evalsha' command",
                StoreErrorKind::Unauthorized,
            ),
            (
                "ERR",
                "max number of clients reached",
                StoreErrorKind::Connection,
            ),
            (
                "READONLY",
                "You can't write against a read only replica.",
                StoreErrorKind::ReadOnly,
            ),
            (
                "SOMENEWCODE",
                "something we never saw",
                StoreErrorKind::Other,
            ),
            ("ERR", "unknown command", StoreErrorKind::Other),
            (
                "ERR",
                "Protocol error: unauthenticated multibulk length",
                StoreErrorKind::Unauthorized,
            ),
        ] {
            let kind = server(code, detail);
            assert_eq!(kind, expected, "{code} {detail}");
            assert!(kind.is_backend_failure(), "{code} {detail}");
        }
        let wrong_type = server(
            "WRONGTYPE",
            "Operation against a key holding the wrong kind",
        );
        assert!(!wrong_type.is_backend_failure());
        let cross_slot = server("CROSSSLOT", "Keys in request don't hash to the same slot");
        assert_eq!(cross_slot, StoreErrorKind::InvalidInput);
        assert!(!cross_slot.is_backend_failure());
    }
}
