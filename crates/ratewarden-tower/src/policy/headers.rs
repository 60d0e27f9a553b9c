//! The rate-limit header fields of a request decided against several limits: one list item
//! per limit in `RateLimit-Policy` and `RateLimit`, the longest wait in `Retry-After`, and
//! the limit closest to exhaustion in `X-RateLimit-*`.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderName, RETRY_AFTER};
use http::{HeaderMap, HeaderValue};
use ratewarden_core::{Decision, Decisions, Info};

use super::rule::NamedLimit;
use crate::rate_limit::HeaderStyle;

const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// A limit that applied to a request: the indices of its checks among the request's limits
/// (its own first, then those of its previous quotas, see [`PolicyHandle`](super::PolicyHandle)).
#[derive(Debug)]
pub(crate) struct Applied {
    pub(crate) limit: NamedLimit,
    pub(crate) checks: Vec<usize>,
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
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
    for decision in applied.checks.iter().filter_map(|&i| decisions.get(i)) {
        let info = decision.info();
        let until = if decision.is_allowed() {
            info.reset_after()
        } else {
            info.retry_after()
        };
        let (r, t) = (info.remaining(), ceil_secs(until));
        out = Some(out.map_or((r, t), |(r0, t0)| (r0.min(r), t0.max(t))));
    }
    out
}

/// Writes the headers of `applied` limits decided by `decisions` into `headers`, and
/// `Retry-After` when the request is refused.
pub(crate) fn apply(
    headers: &mut HeaderMap,
    style: HeaderStyle,
    applied: &[Applied],
    decisions: &Decisions,
    refused: bool,
) {
    if refused {
        headers.insert(RETRY_AFTER, HeaderValue::from(retry_after(decisions)));
    }
    let (ietf, x) = match style {
        HeaderStyle::Ietf => (true, false),
        HeaderStyle::XRateLimit => (false, true),
        HeaderStyle::None => return,
        HeaderStyle::Both => (true, true),
    };
    let slice = decisions.as_slice();
    if ietf {
        let mut policy = String::new();
        let mut ratelimit = String::new();
        for limit in applied {
            let Some((r, t)) = merged(limit, slice) else {
                continue;
            };
            if !policy.is_empty() {
                policy.push_str(", ");
                ratelimit.push_str(", ");
            }
            policy.push_str(limit.limit.policy_item());
            let _ = write!(ratelimit, "\"{}\";r={r};t={t}", limit.limit.name());
        }
        if let (Ok(policy), Ok(ratelimit)) = (
            HeaderValue::try_from(policy),
            HeaderValue::try_from(ratelimit),
        ) && !policy.is_empty()
        {
            headers.insert(RATELIMIT_POLICY, policy);
            headers.insert(RATELIMIT, ratelimit);
        }
    }
    if x && let Some((_, binding)) = decisions.binding() {
        write_x(headers, binding.info());
    }
}

fn write_x(headers: &mut HeaderMap, info: &Info) {
    let reset_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_add(info.reset_after());
    headers.insert(X_LIMIT, HeaderValue::from(info.limit()));
    headers.insert(X_REMAINING, HeaderValue::from(info.remaining()));
    headers.insert(X_RESET, HeaderValue::from(ceil_secs(reset_at)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratewarden_core::Quota;

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
        let applied = [
            Applied {
                limit: NamedLimit::new("per-ip", "ip", Quota::per_minute(100).unwrap()),
                checks: vec![0],
            },
            Applied {
                limit: NamedLimit::new("per-user", "user", Quota::per_second(10).unwrap()),
                checks: vec![1, 2],
            },
        ];
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
