//! [`Reservation`]: units held for a request whose cost is known only once it is served.

use crate::{Decisions, Limit};

/// What [`Store::reserve`](crate::Store::reserve) decided: the decision of every limit, and,
/// when all admitted, the hold on each counted limit, to hand back to
/// [`Store::settle`](crate::Store::settle) with the actual cost (or to
/// [`Store::release`](crate::Store::release)).
///
/// A reservation that is never settled holds its units until its hold time lapses; then
/// they are free again and nothing is charged. It cannot be cloned: each is settled once.
///
/// ```
/// use ratewarden_core::{Decision, Decisions, Info, Key, Limit, Quota, Reservation};
/// use std::time::Duration;
///
/// let limit = Limit::new(Key::from("user-7"), Quota::per_minute(100)?, 10);
/// let admitted = Decision::Allowed(Info::new(100, 90, Duration::ZERO, Duration::ZERO));
/// // What a store returns: the decisions, and its ticket for each hold.
/// let reservation = Reservation::new(Decisions::from(admitted), vec![(limit, 7)]);
/// assert!(reservation.is_allowed());
/// assert_eq!(reservation.held()[0].1, 7);
/// # Ok::<(), ratewarden_core::QuotaError>(())
/// ```
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a reservation holds units until it is settled, released or lapses"]
pub struct Reservation {
    decisions: Decisions,
    held: Vec<(Limit, u64)>,
}

impl Reservation {
    /// A store's answer: the decisions, one per limit given, and for each counted limit held
    /// (none when a limit denied), the limit and the store's ticket for its hold.
    ///
    /// See [`Reservation`] for an example.
    pub const fn new(decisions: Decisions, held: Vec<(Limit, u64)>) -> Self {
        Self { decisions, held }
    }

    /// Whether every limit admitted (and the counted ones are held).
    ///
    /// See [`Reservation`] for an example.
    #[must_use]
    pub fn is_allowed(&self) -> bool {
        self.decisions.is_allowed()
    }

    /// The decision of each limit, in the order given.
    ///
    /// ```
    /// use ratewarden_core::{Decisions, Reservation};
    /// let nothing = Reservation::new(Decisions::default(), Vec::new());
    /// assert!(nothing.decisions().as_slice().is_empty());
    /// ```
    #[must_use]
    pub const fn decisions(&self) -> &Decisions {
        &self.decisions
    }

    /// The limits held, with the units of each held ([`Limit::cost`]) and the store's ticket
    /// for its hold.
    ///
    /// See [`Reservation`] for an example.
    #[must_use]
    pub fn held(&self) -> &[(Limit, u64)] {
        &self.held
    }
}
