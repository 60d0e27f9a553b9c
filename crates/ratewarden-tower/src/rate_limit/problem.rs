//! Every body this crate answers with: `application/problem+json` (RFC 9457) for HTTP, a
//! trailers-only status for gRPC. One function builds every problem body.

use std::sync::LazyLock;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName};
use http::{HeaderValue, Response, StatusCode};

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");
const GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

/// The registered problem type of a rate-limited request (RFC 9457's registry).
const QUOTA_EXCEEDED_TYPE: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// A `problem+json` body: `type`, the status's reason as `title`, `status`, and `detail` when
/// there is one. The only place a body is written.
pub(crate) fn body(kind: &str, status: StatusCode, detail: Option<&str>) -> Bytes {
    let title = status.canonical_reason().unwrap_or("Error");
    let status = status.as_u16();
    Bytes::from(match detail {
        None => format!(r#"{{"type":"{kind}","title":"{title}","status":{status}}}"#),
        Some(detail) => format!(
            r#"{{"type":"{kind}","title":"{title}","status":{status},"detail":"{detail}"}}"#
        ),
    })
}

/// A body built once per process, kept for its life: cloning it touches no reference count,
/// so a flood of rejections shares no cache line.
fn forever(body: Bytes) -> Bytes {
    Bytes::from_static(Box::leak(body.to_vec().into_boxed_slice()))
}

/// The bodies of the constant answers, built once.
pub(crate) static QUOTA_EXCEEDED: LazyLock<Bytes> = LazyLock::new(|| {
    forever(body(
        QUOTA_EXCEEDED_TYPE,
        StatusCode::TOO_MANY_REQUESTS,
        None,
    ))
});
pub(crate) static COST_EXCEEDS_LIMIT: LazyLock<Bytes> = LazyLock::new(|| {
    forever(body(
        QUOTA_EXCEEDED_TYPE,
        StatusCode::TOO_MANY_REQUESTS,
        Some("The request costs more than the rate limit admits at once; retrying will not help."),
    ))
});
const UNAVAILABLE_DETAIL: &str = "The rate limiter is unavailable; retry shortly.";
static UNAVAILABLE: LazyLock<Bytes> = LazyLock::new(|| {
    forever(body(
        "about:blank",
        StatusCode::SERVICE_UNAVAILABLE,
        Some(UNAVAILABLE_DETAIL),
    ))
});

/// `503` with `Retry-After: 1`: the answer of a layer that fails closed while its store is out.
pub(crate) fn unavailable(grpc: bool) -> Response<Bytes> {
    let mut response = if grpc {
        grpc_status(
            grpc_code(StatusCode::SERVICE_UNAVAILABLE),
            UNAVAILABLE_DETAIL,
        )
    } else {
        problem(StatusCode::SERVICE_UNAVAILABLE, UNAVAILABLE.clone())
    };
    response
        .headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
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
