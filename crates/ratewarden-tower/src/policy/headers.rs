//! The rate-limit header fields of a request decided against several limits: one list item
//! per limit in `RateLimit-Policy` and `RateLimit`, the longest wait in `Retry-After`, and
//! the limit closest to exhaustion in `X-RateLimit-*`.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::BufMut;
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue};
use ratewarden_core::{Decision, Decisions, Info, MAX_LIMITS};

use super::definition::MAX_LIMITS_PER_REQUEST;
use super::rule::Shown;
use crate::rate_limit::HeaderStyle;
pub(crate) use crate::rate_limit::headers::ceil_secs;
use crate::rate_limit::headers::{
    Buffer, RATELIMIT, RATELIMIT_POLICY, X_LIMIT, X_REMAINING, X_RESET, put_number, wait,
};

/// Room for the `RateLimit` value of the most limits one request gets.
const LONGEST: usize = MAX_LIMITS_PER_REQUEST * Buffer::LONGEST;

/// A set of indices among one request's limits (fewer than [`MAX_LIMITS`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Checks(u16);

const _: () = assert!(MAX_LIMITS <= u16::BITS as usize);

impl Checks {
    /// The set of `i` alone.
    pub(crate) fn one(i: usize) -> Self {
        let mut checks = Self::default();
        checks.insert(i);
        checks
    }

    /// Adds `i` (an index past [`MAX_LIMITS`] is no limit's, and is left out).
    pub(crate) fn insert(&mut self, i: usize) {
        self.0 |= bit(i);
    }

    pub(crate) fn contains(self, i: usize) -> bool {
        self.0 & bit(i) != 0
    }

    /// The indices, in order.
    fn iter(self) -> impl Iterator<Item = usize> {
        let mut bits = self.0;
        std::iter::from_fn(move || {
            let i = bits.trailing_zeros();
            bits &= bits.checked_sub(1)?;
            Some(i as usize)
        })
    }
}

fn bit(i: usize) -> u16 {
    u32::try_from(i)
        .ok()
        .and_then(|i| 1u16.checked_shl(i))
        .unwrap_or(0)
}

/// A limit that applied to a request: the indices of its checks among the request's limits
/// (its own first, then those of its previous quotas, see [`PolicyHandle`](super::PolicyHandle)).
#[derive(Debug)]
pub(crate) struct Applied {
    pub(crate) limit: Shown,
    pub(crate) checks: Checks,
}

/// The limits that applied to a request, in the order its headers show them: as many as a
/// policy gives one request are kept without allocating.
#[derive(Debug, Default)]
pub(crate) struct AppliedLimits {
    first: [Option<Applied>; MAX_LIMITS_PER_REQUEST],
    len: usize,
    /// Any past the first [`MAX_LIMITS_PER_REQUEST`].
    rest: Vec<Applied>,
    /// The `RateLimit-Policy` value of these limits, formatted before (a rule's, when all of
    /// its limits applied).
    policy: Option<HeaderValue>,
}

impl AppliedLimits {
    pub(crate) fn push(&mut self, applied: Applied) {
        // A value formatted before holds the limits pushed before only.
        self.policy = None;
        match self.first.get_mut(self.len) {
            Some(slot) => {
                *slot = Some(applied);
                self.len += 1;
            }
            None => self.rest.push(applied),
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Applied> {
        self.first.iter().flatten().chain(&self.rest)
    }

    /// The one check of the one limit that applied, when that is all.
    pub(crate) fn only(&self) -> Option<(&Applied, usize)> {
        let [Some(only), ..] = &self.first else {
            return None;
        };
        let mut checks = only.checks.iter();
        match (self.len, checks.next(), checks.next()) {
            (1, Some(i), None) => Some((only, i)),
            _ => None,
        }
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Applied> {
        self.first.iter_mut().flatten().chain(&mut self.rest)
    }

    /// Takes `policy` as the `RateLimit-Policy` value of the limits pushed.
    pub(crate) fn formatted(&mut self, policy: &HeaderValue) {
        self.policy = Some(policy.clone());
    }
}

/// The decision of the shown limits' checks that binds, as [`Decisions::binding`] picks it.
fn binding<'a>(applied: &AppliedLimits, decisions: &'a Decisions) -> Option<&'a Decision> {
    let slice = decisions.as_slice();
    let shown = || {
        (applied.iter())
            .flat_map(|a| a.checks.iter())
            .filter_map(|i| slice.get(i))
    };
    let refused = shown()
        .filter(|d| !d.is_allowed())
        .max_by_key(|d| d.info().retry_after());
    refused.or_else(|| {
        // remaining / limit, compared without division.
        shown().min_by(|a, b| {
            let (a, b) = (a.info(), b.info());
            let left_a = u128::from(a.remaining()) * u128::from(b.limit().max(1));
            let left_b = u128::from(b.remaining()) * u128::from(a.limit().max(1));
            left_a.cmp(&left_b)
        })
    })
}

/// The longest retry among the denials, in whole seconds rounded up, at least 1.
pub(crate) fn retry_after(decisions: &Decisions) -> u64 {
    decisions
        .as_slice()
        .iter()
        .filter(|d| !d.is_allowed())
        .map(|d| d.info().retry_after())
        .max()
        .map_or(1, |longest| ceil_secs(longest).max(1))
}

/// The `RateLimit` parameters of one limit: the fewest remaining and the longest wait over
/// its checks (a previous quota still checked may be the one that binds).
fn merged(applied: &Applied, decisions: &[Decision]) -> Option<(u64, u64)> {
    let mut out: Option<(u64, u64)> = None;
    for decision in applied.checks.iter().filter_map(|i| decisions.get(i)) {
        let info = decision.info();
        let (r, t) = (info.remaining(), ceil_secs(wait(info)));
        out = Some(out.map_or((r, t), |(r0, t0)| (r0.min(r), t0.max(t))));
    }
    out
}

/// Writes the headers of `applied` limits decided by `decisions` into `headers`, and
/// `Retry-After` when the request is refused.
pub(crate) fn apply(
    headers: &mut HeaderMap,
    style: HeaderStyle,
    applied: &AppliedLimits,
    decisions: &Decisions,
    refused: bool,
) {
    let (ietf, x) = match style {
        HeaderStyle::Ietf => (true, false),
        HeaderStyle::XRateLimit => (false, true),
        HeaderStyle::None => (false, false),
        HeaderStyle::Both => (true, true),
    };
    VALUES.with_borrow_mut(|values| {
        if refused {
            headers.insert(
                RETRY_AFTER,
                values.number(Field::Retry, retry_after(decisions)),
            );
        }
        if ietf {
            ratelimit(headers, values, applied, decisions.as_slice());
        }
        // (Of the limits shown: not a ban's probe, which is no limit of the client's.)
        if x && let Some(binding) = binding(applied, decisions) {
            write_x(headers, values, binding.info());
        }
    });
}

/// `RateLimit-Policy` and `RateLimit`: an item per limit the decisions cover.
fn ratelimit(
    headers: &mut HeaderMap,
    values: &mut Values,
    applied: &AppliedLimits,
    decisions: &[Decision],
) {
    let mut all = true;
    let ratelimit = values.buf.cut(LONGEST, |buf| {
        for limit in applied.iter() {
            let Some((r, t)) = merged(limit, decisions) else {
                all = false;
                continue;
            };
            if !buf.is_empty() {
                buf.put_slice(b", ");
            }
            buf.put_u8(b'"');
            buf.put_slice(limit.limit.name().as_bytes());
            buf.put_slice(b"\";r=");
            put_number(buf, r);
            buf.put_slice(b";t=");
            put_number(buf, t);
        }
    });
    if ratelimit.is_empty() {
        return;
    }
    let policy = match &applied.policy {
        Some(policy) if all => policy.clone(),
        _ => values.buf.cut(LONGEST, |buf| {
            for limit in applied.iter().filter(|l| merged(l, decisions).is_some()) {
                if !buf.is_empty() {
                    buf.put_slice(b", ");
                }
                buf.put_slice(limit.limit.policy_item());
            }
        }),
    };
    headers.insert(RATELIMIT_POLICY, policy);
    headers.insert(RATELIMIT, ratelimit);
}

fn write_x(headers: &mut HeaderMap, values: &mut Values, info: &Info) {
    let reset_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_add(info.reset_after());
    headers.insert(X_LIMIT, values.number(Field::Limit, info.limit()));
    headers.insert(
        X_REMAINING,
        values.number(Field::Remaining, info.remaining()),
    );
    headers.insert(X_RESET, values.number(Field::Reset, ceil_secs(reset_at)));
}

thread_local! {
    /// Where this thread formats header values.
    static VALUES: RefCell<Values> = RefCell::new(Values::default());
}

/// The numeric fields, whose last value each thread keeps.
#[derive(Clone, Copy)]
enum Field {
    Retry,
    Limit,
    Remaining,
    Reset,
}

/// The header values that change from response to response, cut from a shared buffer
/// ([`Buffer`]); of each number field the last value is kept (a limit, a busy key's count and
/// the reset's second change far less often than they are sent).
#[derive(Default)]
struct Values {
    buf: Buffer,
    numbers: [Option<(u64, HeaderValue)>; 4],
}

impl Values {
    /// The value of `field` for `n`.
    fn number(&mut self, field: Field, n: u64) -> HeaderValue {
        let last = &mut self.numbers[field as usize];
        if let Some((m, value)) = last
            && *m == n
        {
            return value.clone();
        }
        let value = self.buf.cut(Buffer::LONGEST, |buf| put_number(buf, n));
        *last = Some((n, value.clone()));
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::NamedLimit;
    use crate::policy::rule::policy_value;
    use ratewarden_core::Quota;
    use std::time::Duration;

    fn allowed(limit: u64, remaining: u64, reset: u64) -> Decision {
        Decision::Allowed(Info::new(
            limit,
            remaining,
            Duration::from_secs(reset),
            Duration::ZERO,
        ))
    }

    #[test]
    fn one_item_per_limit_and_the_binding_limit_in_x_headers() {
        let mut applied = AppliedLimits::default();
        applied.push(Applied {
            limit: NamedLimit::new("per-ip", "ip", Quota::per_minute(100).unwrap()).shown(),
            checks: Checks::one(0),
        });
        let mut checks = Checks::one(1);
        checks.insert(2);
        applied.push(Applied {
            limit: NamedLimit::new("per-user", "user", Quota::per_second(10).unwrap()).shown(),
            checks,
        });
        let decisions = Decisions::from(vec![
            allowed(100, 99, 1),
            allowed(10, 3, 1),
            allowed(5, 4, 2),
        ]);
        let mut headers = HeaderMap::new();
        apply(&mut headers, HeaderStyle::Both, &applied, &decisions, false);
        assert_eq!(
            headers["ratelimit-policy"],
            r#""per-ip";q=100;w=60, "per-user";q=10;w=1"#
        );
        assert_eq!(
            headers["ratelimit"],
            r#""per-ip";r=99;t=1, "per-user";r=3;t=2"#
        );
        assert_eq!(headers["x-ratelimit-limit"], "10");
        assert_eq!(headers["x-ratelimit-remaining"], "3");
        assert!(!headers.contains_key("retry-after"));
    }

    #[test]
    fn a_formatted_policy_value_is_shown_only_when_every_limit_was_decided() {
        let limits = [
            NamedLimit::new("a", "ip", Quota::per_second(1).unwrap()),
            NamedLimit::new("b", "ip", Quota::per_second(2).unwrap()),
        ];
        let mut applied = AppliedLimits::default();
        for (i, limit) in limits.iter().enumerate() {
            applied.push(Applied {
                limit: limit.shown(),
                checks: Checks::one(i),
            });
        }
        applied.formatted(&policy_value(&limits));
        let mut headers = HeaderMap::new();
        let both = Decisions::from(vec![allowed(1, 0, 1), allowed(2, 1, 1)]);
        apply(&mut headers, HeaderStyle::Ietf, &applied, &both, false);
        assert_eq!(headers["ratelimit-policy"], r#""a";q=1;w=1, "b";q=2;w=1"#);
        // A store that decided fewer limits than it was given: only those are shown.
        let one = Decisions::from(vec![allowed(1, 0, 1)]);
        apply(&mut headers, HeaderStyle::Ietf, &applied, &one, true);
        assert_eq!(headers["ratelimit-policy"], r#""a";q=1;w=1"#);
        assert_eq!(headers["ratelimit"], r#""a";r=0;t=1"#);
        assert_eq!(headers["retry-after"], "1");
    }

    #[test]
    fn checks_are_a_set_of_indices() {
        let mut checks = Checks::one(3);
        checks.insert(0);
        checks.insert(15);
        checks.insert(16);
        assert_eq!(checks.iter().collect::<Vec<_>>(), [0, 3, 15]);
        assert!(checks.contains(15) && !checks.contains(16) && !checks.contains(1));
        assert_eq!(Checks::default().iter().count(), 0);
    }

    #[test]
    fn retry_after_is_the_longest_wait() {
        let denied = |secs| {
            Decision::Denied(Info::new(
                1,
                0,
                Duration::from_secs(secs),
                Duration::from_millis(secs * 1000 - 500),
            ))
        };
        let decisions = Decisions::from(vec![denied(3), allowed(5, 1, 1), denied(40)]);
        assert_eq!(retry_after(&decisions), 40);
    }
}
