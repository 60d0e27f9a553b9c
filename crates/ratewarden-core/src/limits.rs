//! [`Limit`] and [`Decisions`]: several limits on one request (10/s and 1,000/h on a key; per
//! IP, per user and per tenant), decided together by [`Store::check_all`](crate::Store::check_all).

use crate::{Decision, Key, Quota};

/// The most limits one [`check_all`](crate::Store::check_all) decides together.
pub const MAX_LIMITS: usize = 16;

/// One limit of a request: `cost` units of `key` under `quota`, counted when every limit of
/// the request admits; or, made by [`Limit::probe`], a limit that must admit the cost but
/// counts nothing (a ban, say: a state spent while the ban stands).
///
/// ```
/// use ratewarden_core::{Key, Limit, Quota};
/// let per_second = Limit::new(Key::from("user-7"), Quota::per_second(10)?, 1);
/// assert_eq!(per_second.cost(), 1);
/// # Ok::<(), ratewarden_core::QuotaError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    key: Key,
    quota: Quota,
    cost: u32,
    counted: bool,
}

impl Limit {
    /// `cost` units of `key` under `quota`.
    ///
    /// ```
    /// # use ratewarden_core::{Key, Limit, Quota};
    /// let limit = Limit::new(Key::from(7u64), Quota::per_hour(1_000)?, 2);
    /// assert_eq!(limit.key(), &Key::from(7u64));
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub const fn new(key: Key, quota: Quota, cost: u32) -> Self {
        Self {
            key,
            quota,
            cost,
            counted: true,
        }
    }

    /// A limit that must admit `cost` units of `key` under `quota` for the request to be
    /// admitted, and counts nothing whatever the outcome: its state is read, never written
    /// (but a state a store cannot read, which it replaces by a spent one as for any limit:
    /// such a probe denies).
    ///
    /// ```
    /// use ratewarden_core::{Key, Limit, Quota};
    /// let banned = Limit::probe(Key::from("ip:203.0.113.9"), Quota::per_hour(1)?, 1);
    /// assert!(!banned.is_counted());
    /// assert!(Limit::new(Key::from("ip"), Quota::per_hour(1)?, 1).is_counted());
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub const fn probe(key: Key, quota: Quota, cost: u32) -> Self {
        Self {
            key,
            quota,
            cost,
            counted: false,
        }
    }

    /// Whether an admitted request counts this limit's cost (see [`Limit::probe`]).
    ///
    /// See [`Limit::probe`] for an example.
    #[must_use]
    pub const fn is_counted(&self) -> bool {
        self.counted
    }

    /// The key counted.
    ///
    /// ```
    /// # use ratewarden_core::{Key, Limit, Quota};
    /// let limit = Limit::new(Key::from("ip"), Quota::per_second(5)?, 1);
    /// assert_eq!(limit.key(), &Key::from("ip"));
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub const fn key(&self) -> &Key {
        &self.key
    }

    /// The quota it is counted under.
    ///
    /// ```
    /// # use ratewarden_core::{Key, Limit, Quota};
    /// let quota = Quota::per_second(5)?;
    /// assert_eq!(Limit::new(Key::from("ip"), quota, 1).quota(), &quota);
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub const fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The units counted.
    ///
    /// ```
    /// # use ratewarden_core::{Key, Limit, Quota};
    /// assert_eq!(Limit::new(Key::from("ip"), Quota::per_second(5)?, 3).cost(), 3);
    /// # Ok::<(), ratewarden_core::QuotaError>(())
    /// ```
    #[must_use]
    pub const fn cost(&self) -> u32 {
        self.cost
    }
}

/// The limits of a request with those on one state merged, for a store to decide each state
/// once: counted limits on one key and quota become one, their costs summed (a request of
/// two is admitted when both fit together); [probes](Limit::probe) of one key and quota
/// become one, the largest cost deciding. Also, for each limit given, the index of its
/// merged limit, so that each gets its state's decision.
///
/// ```
/// use ratewarden_core::{Key, Limit, Quota, merged};
/// let quota = Quota::per_second(10)?;
/// let a = Limit::new(Key::from("a"), quota, 6);
/// let b = Limit::new(Key::from("b"), quota, 1);
/// let (states, of) = merged(&[a.clone(), b, a]);
/// assert_eq!(states.len(), 2);
/// assert_eq!(states[0].cost(), 12); // more than the burst: never admitted
/// assert_eq!(of, [0, 1, 0]);
/// # Ok::<(), ratewarden_core::QuotaError>(())
/// ```
#[must_use]
pub fn merged(limits: &[Limit]) -> (Vec<Limit>, Vec<usize>) {
    let mut states: Vec<Limit> = Vec::with_capacity(limits.len());
    let mut of = Vec::with_capacity(limits.len());
    for limit in limits {
        let same = |state: &Limit| {
            state.key == limit.key && state.quota == limit.quota && state.counted == limit.counted
        };
        match states.iter().position(same) {
            Some(s) => {
                let state = &mut states[s];
                state.cost = if limit.counted {
                    state.cost.saturating_add(limit.cost)
                } else {
                    state.cost.max(limit.cost)
                };
                of.push(s);
            }
            None => {
                states.push(limit.clone());
                of.push(states.len() - 1);
            }
        }
    }
    (states, of)
}

/// What a store decided for each limit of a [`check_all`](crate::Store::check_all), in the
/// order the limits were given: every limit admitted and all were counted, or none was
/// counted.
///
/// ```
/// use ratewarden_core::{Decision, Decisions, Info};
/// use std::time::Duration;
///
/// let room = |remaining| Decision::Allowed(Info::new(10, remaining, Duration::ZERO, Duration::ZERO));
/// let decisions = Decisions::from(vec![room(9), room(2)]);
/// assert!(decisions.is_allowed());
/// // The limit closest to exhaustion binds.
/// assert_eq!(decisions.binding().map(|(i, _)| i), Some(1));
/// ```
#[derive(Clone)]
pub struct Decisions {
    decisions: Several,
}

/// One decision, the common case, kept without allocating; or several.
#[derive(Clone)]
enum Several {
    One(Decision),
    Many(Vec<Decision>),
}

impl From<Vec<Decision>> for Decisions {
    fn from(decisions: Vec<Decision>) -> Self {
        Self {
            decisions: Several::Many(decisions),
        }
    }
}

/// The decisions of one limit.
///
/// ```
/// use ratewarden_core::{Decision, Decisions, Info};
/// use std::time::Duration;
///
/// let room = Decision::Allowed(Info::new(10, 9, Duration::ZERO, Duration::ZERO));
/// assert_eq!(Decisions::from(room), Decisions::from(vec![room]));
/// ```
impl From<Decision> for Decisions {
    fn from(decision: Decision) -> Self {
        Self {
            decisions: Several::One(decision),
        }
    }
}

impl Default for Decisions {
    fn default() -> Self {
        Self::from(Vec::new())
    }
}

impl PartialEq for Decisions {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Decisions {}

impl std::fmt::Debug for Decisions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl Decisions {
    /// Whether every limit admitted (no limits: admitted).
    ///
    /// ```
    /// assert!(ratewarden_core::Decisions::default().is_allowed());
    /// ```
    #[must_use]
    pub fn is_allowed(&self) -> bool {
        self.as_slice().iter().all(Decision::is_allowed)
    }

    /// The decisions, one per limit, in the order given.
    ///
    /// ```
    /// assert!(ratewarden_core::Decisions::default().as_slice().is_empty());
    /// ```
    #[must_use]
    pub fn as_slice(&self) -> &[Decision] {
        match &self.decisions {
            Several::One(decision) => std::slice::from_ref(decision),
            Several::Many(decisions) => decisions,
        }
    }

    /// The limit that decided (its index, and its decision): of those that denied, the one
    /// whose retry is longest (a client retrying sooner is denied again); when all admitted,
    /// the one with the least left relative to its limit (what `X-RateLimit-*` shows).
    /// `None` for no limits.
    ///
    /// ```
    /// use ratewarden_core::{Decision, Decisions, Info};
    /// use std::time::Duration;
    ///
    /// let denied = |retry| Decision::Denied(Info::new(10, 0, retry, retry));
    /// let ok = Decision::Allowed(Info::new(10, 5, Duration::ZERO, Duration::ZERO));
    /// let decisions = Decisions::from(vec![denied(Duration::from_secs(1)), ok, denied(Duration::from_secs(60))]);
    /// assert!(!decisions.is_allowed());
    /// assert_eq!(decisions.binding().map(|(i, _)| i), Some(2));
    /// ```
    #[must_use]
    pub fn binding(&self) -> Option<(usize, &Decision)> {
        let refused = self
            .as_slice()
            .iter()
            .enumerate()
            .filter(|(_, d)| !d.is_allowed())
            .max_by_key(|(_, d)| d.info().retry_after());
        refused.or_else(|| {
            // remaining / limit, compared without division: a / b < c / d as a·d < c·b.
            self.as_slice().iter().enumerate().min_by(|(_, a), (_, b)| {
                let (a, b) = (a.info(), b.info());
                let left_a = u128::from(a.remaining()) * u128::from(b.limit().max(1));
                let left_b = u128::from(b.remaining()) * u128::from(a.limit().max(1));
                left_a.cmp(&left_b)
            })
        })
    }
}
