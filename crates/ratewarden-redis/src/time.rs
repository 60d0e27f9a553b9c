//! Time between two [`Timestamp`]s, which `ratewarden-core` leaves to its users.

use std::time::Duration;

use ratewarden_core::Timestamp;

/// How long from `from` until `to`: zero when `to` is not after `from`.
pub(crate) const fn between(from: Timestamp, to: Timestamp) -> Duration {
    Duration::from_nanos(to.as_nanos().saturating_sub(from.as_nanos()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_between_is_never_negative() {
        let (a, b) = (Timestamp::from_nanos(5), Timestamp::from_nanos(7));
        assert_eq!(between(a, b), Duration::from_nanos(2));
        assert_eq!(between(b, a), Duration::ZERO);
    }
}
