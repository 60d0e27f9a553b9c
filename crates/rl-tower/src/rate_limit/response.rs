//! Rejections, and the rate-limit headers every response carries.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONTENT_TYPE, HeaderName, RETRY_AFTER};
use http::{Extensions, HeaderMap, HeaderValue, Response, StatusCode};
use rl_core::{Info, Quota};

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

const QUOTA_EXCEEDED: &[u8] = br#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"The request exceeds the rate limit; retry after the number of seconds in Retry-After."}"#;
const COST_EXCEEDS_LIMIT: &[u8] = br#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"The request costs more than the rate limit admits at once; retrying will not help."}"#;

/// Why a request was rejected.
///
/// ```
/// use rl_tower::rate_limit::DenialReason;
/// assert_ne!(DenialReason::RateLimited, DenialReason::InsufficientCapacity);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DenialReason {
    /// The key is over its quota; it may retry after [`Denied::retry_after`].
    RateLimited,
    /// The request costs more than the quota admits at once: retrying never helps.
    InsufficientCapacity,
}

/// A rejected request: what a [`Rejection`] turns into a response. Also put in the rejection
/// response's extensions.
///
/// ```
/// use rl_tower::rate_limit::{DenialReason, Denied};
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
/// itself, and puts the [`Denied`] in its extensions.
///
/// ```
/// use bytes::Bytes;
/// use http::{Response, StatusCode};
/// use rl_tower::rate_limit::{Denied, Rejection};
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

/// The default rejection: `429` with an `application/problem+json` body (type
/// `quota-exceeded`), or for gRPC a `200` carrying `grpc-status: 8` (`RESOURCE_EXHAUSTED`).
/// Every body is a constant: nothing is formatted or allocated for it.
///
/// ```
/// use rl_tower::rate_limit::DefaultRejection;
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
    headers.insert(CONTENT_TYPE, GRPC);
    headers.insert(GRPC_STATUS, HeaderValue::from(u16::from(code)));
    headers.insert(GRPC_MESSAGE, HeaderValue::from_static(message));
    response
}

/// An `application/problem+json` response.
pub(crate) fn problem(status: StatusCode, body: Bytes) -> Response<Bytes> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    response
}

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

/// The decision figures of the strictest rate limit applied to a response, in its extensions.
///
/// ```
/// use rl_tower::rate_limit::RateLimitInfo;
/// # fn show(response: &http::Response<()>) {
/// if let Some(limit) = response.extensions().get::<RateLimitInfo>() {
///     println!("{}: {} left", limit.policy_name(), limit.info().remaining());
/// }
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct RateLimitInfo {
    name: Arc<str>,
    quota: Quota,
    info: Info,
}

impl RateLimitInfo {
    /// The limit's policy name.
    #[must_use]
    pub fn policy_name(&self) -> &str {
        &self.name
    }

    /// The quota applied.
    #[must_use]
    pub const fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The decision's figures.
    #[must_use]
    pub const fn info(&self) -> &Info {
        &self.info
    }
}

/// The header values of one (policy name, quota), formatted once.
#[derive(Debug)]
pub(crate) struct PolicyHeaders {
    pub(crate) name: Arc<str>,
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
            limit: HeaderValue::from(limit),
            ratelimit_prefix,
            name,
            quota,
            style,
        }
    }

    /// Writes the headers for `info` unless a stricter limit already wrote them, and records
    /// the decision in the extensions.
    pub(crate) fn apply(&self, headers: &mut HeaderMap, extensions: &mut Extensions, info: &Info) {
        if let Some(previous) = extensions.get::<RateLimitInfo>()
            && previous.info.remaining() <= info.remaining()
        {
            return;
        }
        extensions.insert(RateLimitInfo {
            name: Arc::clone(&self.name),
            quota: self.quota,
            info: *info,
        });
        let denied = !info.retry_after().is_zero();
        if matches!(self.style, HeaderStyle::Ietf | HeaderStyle::Both) {
            let until = if denied {
                info.retry_after()
            } else {
                info.reset_after()
            };
            let mut value = BytesMut::with_capacity(self.ratelimit_prefix.len() + 24);
            value.put_slice(&self.ratelimit_prefix);
            value.put_slice(itoa::Buffer::new().format(info.remaining()).as_bytes());
            value.put_slice(b";t=");
            value.put_slice(itoa::Buffer::new().format(ceil_secs(until)).as_bytes());
            if let Ok(value) = HeaderValue::from_maybe_shared(value.freeze()) {
                headers.insert(RATELIMIT, value);
            }
            headers.insert(RATELIMIT_POLICY, self.policy.clone());
        }
        if matches!(self.style, HeaderStyle::XRateLimit | HeaderStyle::Both) {
            let reset_at = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .saturating_add(info.reset_after());
            headers.insert(X_LIMIT, self.limit.clone());
            headers.insert(X_REMAINING, HeaderValue::from(info.remaining()));
            headers.insert(X_RESET, HeaderValue::from(ceil_secs(reset_at)));
        }
    }
}

/// Adds `Retry-After` (for a rate-limited denial) and the rate-limit headers to a rejection.
pub(crate) fn finish_rejection(
    response: Response<Bytes>,
    denied: Denied,
    policy: &PolicyHeaders,
) -> Response<Bytes> {
    let (mut parts, body) = response.into_parts();
    if denied.reason == DenialReason::RateLimited && !parts.headers.contains_key(RETRY_AFTER) {
        parts
            .headers
            .insert(RETRY_AFTER, HeaderValue::from(denied.retry_after_secs()));
    }
    policy.apply(&mut parts.headers, &mut parts.extensions, &denied.info);
    parts.extensions.insert(denied);
    Response::from_parts(parts, body)
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}
