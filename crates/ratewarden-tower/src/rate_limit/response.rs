//! Rejections, and the rate-limit headers every response carries.

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONTENT_TYPE, HeaderName, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use ratewarden_core::{Info, Quota};

use super::HeaderStyle;

const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");
const GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

const QUOTA_EXCEEDED: &[u8] = br#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429}"#;
const COST_EXCEEDS_LIMIT: &[u8] = br#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"The request costs more than the rate limit admits at once; retrying will not help."}"#;

/// Why a request was rejected.
///
/// ```
/// use ratewarden_tower::rate_limit::DenialReason;
/// assert_ne!(DenialReason::RateLimited, DenialReason::InsufficientCapacity);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DenialReason {
    /// The key is over its quota; it may retry after [`Denied::retry_after_secs`].
    RateLimited,
    /// The request costs more than the quota admits at once: retrying never helps.
    InsufficientCapacity,
}

/// A rejected request: what a [`Rejection`] turns into a response.
///
/// ```
/// use ratewarden_tower::rate_limit::{DenialReason, Denied};
/// # fn show(denied: &Denied) {
/// if denied.reason() == DenialReason::RateLimited {
///     println!("retry in {} s", denied.retry_after_secs());
/// }
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Denied {
    pub(crate) info: Info,
    pub(crate) quota: Quota,
    pub(crate) name: Arc<str>,
    pub(crate) reason: DenialReason,
    pub(crate) grpc: bool,
}

impl Denied {
    /// The decision's figures.
    #[must_use]
    pub const fn info(&self) -> &Info {
        &self.info
    }

    /// The quota that denied the request.
    #[must_use]
    pub const fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The limit's policy name (see [`RateLimitLayer::name`](super::RateLimitLayer::name)).
    #[must_use]
    pub fn policy_name(&self) -> &str {
        &self.name
    }

    /// Why the request was denied.
    #[must_use]
    pub const fn reason(&self) -> DenialReason {
        self.reason
    }

    /// Whether the request is a gRPC call (`content-type: application/grpc...`).
    #[must_use]
    pub const fn is_grpc(&self) -> bool {
        self.grpc
    }

    /// The retry time in whole seconds, rounded up and at least 1: the `Retry-After` value.
    #[must_use]
    pub fn retry_after_secs(&self) -> u64 {
        ceil_secs(self.info.retry_after()).max(1)
    }
}

/// Turns a [`Denied`] request into the response sent back. Closures
/// `Fn(&Denied) -> Response<Bytes>` implement it.
///
/// The layer adds `Retry-After` and the rate-limit headers to the response unless it set them
/// itself.
///
/// ```
/// use bytes::Bytes;
/// use http::{Response, StatusCode};
/// use ratewarden_tower::rate_limit::{Denied, Rejection};
///
/// let plain = |denied: &Denied| {
///     let mut response = Response::new(Bytes::from(format!("slow down ({} s)", denied.retry_after_secs())));
///     *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
///     response
/// };
/// # fn is_rejection(_: impl Rejection) {}
/// is_rejection(plain);
/// ```
pub trait Rejection: Clone + Send + Sync + 'static {
    /// The response for `denied`.
    fn response(&self, denied: &Denied) -> Response<Bytes>;
}

impl<F> Rejection for F
where
    F: Fn(&Denied) -> Response<Bytes> + Clone + Send + Sync + 'static,
{
    fn response(&self, denied: &Denied) -> Response<Bytes> {
        self(denied)
    }
}

/// The default rejection: `429` with an `application/problem+json` body (the registered problem
/// type `quota-exceeded`; the wait is in `Retry-After`), or for gRPC a `200` carrying
/// `grpc-status: 8` (`RESOURCE_EXHAUSTED`). Every body is a constant: nothing is formatted or
/// allocated for it.
///
/// ```
/// use ratewarden_tower::rate_limit::DefaultRejection;
/// let rejection = DefaultRejection::default();
/// # drop(rejection);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultRejection;

impl Rejection for DefaultRejection {
    fn response(&self, denied: &Denied) -> Response<Bytes> {
        let capacity = denied.reason == DenialReason::InsufficientCapacity;
        if denied.grpc {
            let message = if capacity {
                "request cost exceeds the rate limit"
            } else {
                "rate limit exceeded"
            };
            return grpc_status(8, message);
        }
        let body = if capacity {
            COST_EXCEEDS_LIMIT
        } else {
            QUOTA_EXCEEDED
        };
        problem(StatusCode::TOO_MANY_REQUESTS, Bytes::from_static(body))
    }
}

/// A gRPC trailers-only response with `code` and `message`.
pub(crate) fn grpc_status(code: u8, message: &'static str) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.reserve(REJECTION_HEADERS);
    headers.insert(CONTENT_TYPE, GRPC);
    headers.insert(GRPC_STATUS, HeaderValue::from(u16::from(code)));
    headers.insert(GRPC_MESSAGE, HeaderValue::from_static(message));
    response
}

/// An `application/problem+json` response.
pub(crate) fn problem(status: StatusCode, body: Bytes) -> Response<Bytes> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    // Room for every header a rejection gets, so the map is allocated once.
    response.headers_mut().reserve(REJECTION_HEADERS);
    response.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    response
}

/// Content type (and gRPC status and message), Retry-After, and the five rate-limit fields.
const REJECTION_HEADERS: usize = 9;

/// The gRPC status code closest to an HTTP status, for rejections of gRPC calls.
pub(crate) const fn grpc_code(status: StatusCode) -> u8 {
    match status.as_u16() {
        400 => 3,        // INVALID_ARGUMENT
        401 => 16,       // UNAUTHENTICATED
        403 => 7,        // PERMISSION_DENIED
        429 => 8,        // RESOURCE_EXHAUSTED
        503 | 504 => 14, // UNAVAILABLE
        _ => 13,         // INTERNAL
    }
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
            headers.insert(X_REMAINING, number(info.remaining()));
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
fn number(n: u64) -> HeaderValue {
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

/// Adds `Retry-After` (for a rate-limited denial) and the rate-limit headers to a rejection.
pub(crate) fn finish_rejection(
    response: Response<Bytes>,
    denied: &Denied,
    policy: &PolicyHeaders,
) -> Response<Bytes> {
    let (mut parts, body) = response.into_parts();
    if denied.reason == DenialReason::RateLimited && !parts.headers.contains_key(RETRY_AFTER) {
        parts
            .headers
            .insert(RETRY_AFTER, number(denied.retry_after_secs()));
    }
    policy.apply(&mut parts.headers, &denied.info);
    Response::from_parts(parts, body)
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}
