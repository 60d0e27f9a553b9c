//! Rejections: [`Denied`], the [`Rejection`] that answers it and the [`DefaultRejection`].

use std::sync::Arc;

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{Response, StatusCode};
use ratewarden_core::{Info, Quota};

use super::headers::{HeaderStyle, PolicyHeaders, ceil_secs, number};
use super::problem::{self, COST_EXCEEDS_LIMIT, QUOTA_EXCEEDED, grpc_status};

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

    /// Whether the request is a gRPC call (a `POST` with `content-type: application/grpc...`).
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
/// `grpc-status: 8` (`RESOURCE_EXHAUSTED`). Every body is built once per process: a rejection
/// formats nothing. The [module example](super) shows one.
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
        let body: &Bytes = if capacity {
            &COST_EXCEEDS_LIMIT
        } else {
            &QUOTA_EXCEEDED
        };
        problem::problem(StatusCode::TOO_MANY_REQUESTS, body.clone())
    }
}

/// Adds `Retry-After` (for a rate-limited denial) and the rate-limit headers to a rejection.
pub(crate) fn finish_rejection(
    response: Response<Bytes>,
    denied: &Denied,
    policy: &PolicyHeaders,
    style: HeaderStyle,
) -> Response<Bytes> {
    let (mut parts, body) = response.into_parts();
    if denied.reason == DenialReason::RateLimited && !parts.headers.contains_key(RETRY_AFTER) {
        parts
            .headers
            .insert(RETRY_AFTER, number(denied.retry_after_secs()));
    }
    policy.apply(&mut parts.headers, &denied.info, style);
    Response::from_parts(parts, body)
}
