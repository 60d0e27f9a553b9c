//! The rate-limit header fields: [`HeaderStyle`], and their values formatted once per quota.

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use http::header::HeaderName;
use http::{HeaderMap, HeaderValue};
use ratewarden_core::{Info, Quota};

const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Which rate-limit header fields responses carry.
///
/// ```
/// use ratewarden_tower::rate_limit::HeaderStyle;
/// assert_eq!(HeaderStyle::default(), HeaderStyle::Both);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
    Ietf,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    XRateLimit,
    /// Both of the above.
    #[default]
    Both,
    /// None (a rejection still carries `Retry-After`).
    None,
}

/// The header values of one (policy name, quota), formatted once.
#[derive(Debug)]
pub(crate) struct PolicyHeaders {
    pub(crate) quota: Quota,
    style: HeaderStyle,
    /// `"name";q=100;w=60`
    policy: HeaderValue,
    /// `100`
    limit: HeaderValue,
    /// `"name";r=`
    ratelimit_prefix: Bytes,
}

impl PolicyHeaders {
    pub(crate) fn new(name: Arc<str>, quota: Quota, style: HeaderStyle) -> Self {
        let limit = u64::from(quota.burst());
        // w: the time one full burst takes to refill, in seconds.
        let window = quota
            .period()
            .saturating_mul(quota.burst())
            .checked_div(quota.count())
            .unwrap_or(Duration::MAX);
        let policy = format!("\"{name}\";q={limit};w={}", ceil_secs(window).max(1));
        let ratelimit_prefix = Bytes::from(format!("\"{name}\";r="));
        Self {
            policy: HeaderValue::try_from(policy).unwrap_or(HeaderValue::from_static("")),
            limit: number(limit),
            ratelimit_prefix,
            quota,
            style,
        }
    }

    /// Writes the headers for `info`, unless a stricter limit (an inner layer's, with fewer
    /// remaining) already wrote them.
    pub(crate) fn apply(&self, headers: &mut HeaderMap, info: &Info) {
        if written_remaining(headers).is_some_and(|previous| previous <= info.remaining()) {
            return;
        }
        let denied = !info.retry_after().is_zero();
        if matches!(self.style, HeaderStyle::Ietf | HeaderStyle::Both) {
            let until = if denied {
                info.retry_after()
            } else {
                info.reset_after()
            };
            headers.insert(
                RATELIMIT,
                self.ratelimit(info.remaining(), ceil_secs(until)),
            );
            headers.insert(RATELIMIT_POLICY, self.policy.clone());
        }
        if matches!(self.style, HeaderStyle::XRateLimit | HeaderStyle::Both) {
            headers.insert(X_LIMIT, self.limit.clone());
            headers.insert(X_REMAINING, remaining(info.remaining()));
            headers.insert(X_RESET, reset_at(info.reset_after()));
        }
    }

    /// `"name";r=REMAINING;t=SECONDS`, from a per-thread cache of the last value: under a
    /// flood of denials every response carries the same one.
    fn ratelimit(&self, remaining: u64, secs: u64) -> HeaderValue {
        thread_local! {
            static LAST: RefCell<Option<(usize, u64, u64, HeaderValue)>> = const { RefCell::new(None) };
        }
        let id = self.ratelimit_prefix.as_ptr() as usize;
        LAST.with_borrow_mut(|last| {
            if let Some((i, r, t, value)) = last.as_ref()
                && (*i, *r, *t) == (id, remaining, secs)
            {
                return value.clone();
            }
            let mut value = BytesMut::with_capacity(self.ratelimit_prefix.len() + 24);
            value.put_slice(&self.ratelimit_prefix);
            value.put_slice(itoa::Buffer::new().format(remaining).as_bytes());
            value.put_slice(b";t=");
            value.put_slice(itoa::Buffer::new().format(secs).as_bytes());
            let value = HeaderValue::from_maybe_shared(value.freeze())
                .unwrap_or(HeaderValue::from_static(""));
            *last = Some((id, remaining, secs, value.clone()));
            value
        })
    }
}

/// The remaining count an inner rate-limit layer already wrote, if any.
fn written_remaining(headers: &HeaderMap) -> Option<u64> {
    if let Some(value) = headers.get(X_REMAINING) {
        return value.to_str().ok()?.parse().ok();
    }
    let field = headers.get(RATELIMIT)?.to_str().ok()?;
    let r = field
        .split(';')
        .find_map(|param| param.trim().strip_prefix("r="))?;
    r.parse().ok()
}

/// Numbers below this are formatted once per process and never allocate again.
const SMALL_NUMBERS: u64 = 1_024;

/// A header value for `n`; small ones come from a table built once.
pub(crate) fn number(n: u64) -> HeaderValue {
    static TABLE: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        // One string holding "0", "1", ..., "1023", leaked once: static header values clone
        // without touching a reference count.
        let mut all = String::new();
        let mut ends = Vec::new();
        for i in 0..SMALL_NUMBERS {
            all.push_str(itoa::Buffer::new().format(i));
            ends.push(all.len());
        }
        let all: &'static str = Box::leak(all.into_boxed_str());
        let mut start = 0;
        ends.into_iter()
            .map(|end| {
                let value = HeaderValue::from_static(&all[start..end]);
                start = end;
                value
            })
            .collect()
    });
    usize::try_from(n)
        .ok()
        .and_then(|i| table.get(i))
        .cloned()
        .unwrap_or_else(|| HeaderValue::from(n))
}

/// `X-RateLimit-Remaining`: small counts from the table, larger ones from a per-thread cache of
/// the last value (a busy key's count changes far less often than it is sent).
fn remaining(n: u64) -> HeaderValue {
    if n < SMALL_NUMBERS {
        return number(n);
    }
    thread_local! {
        static LAST: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| match last {
        Some((cached, value)) if *cached == n => value.clone(),
        _ => {
            let fresh = HeaderValue::from(n);
            *last = Some((n, fresh.clone()));
            fresh
        }
    })
}

/// `X-RateLimit-Reset`: the UNIX time, in seconds rounded up, `after` from now; formatted at
/// most once per second per thread.
fn reset_at(after: Duration) -> HeaderValue {
    thread_local! {
        static LAST: RefCell<(u64, Option<HeaderValue>)> = const { RefCell::new((0, None)) };
    }
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_add(after);
    let secs = ceil_secs(at);
    LAST.with_borrow_mut(|(last, value)| match value {
        Some(value) if *last == secs => value.clone(),
        _ => {
            let fresh = HeaderValue::from(secs);
            *last = secs;
            *value = Some(fresh.clone());
            fresh
        }
    })
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}
