//! [`MissingKey`]: the answer to a request from which no key can be extracted.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use super::problem;

/// What to do with a request from which no key can be extracted (no peer address, no valid
/// token, ...). Never a shared bucket.
///
/// The default answers `400` with a `problem+json` body that names the status and nothing
/// else: the reason (a missing header, a forged token) stays in your logs (`tracing`), not in
/// the answer. When the key is a bearer token ([`JwtClaim`](crate::key::JwtClaim)), the answer
/// also carries `WWW-Authenticate: Bearer` (RFC 6750); `Reject(StatusCode::UNAUTHORIZED)`
/// is then the usual choice.
///
/// ```
/// use bytes::Bytes;
/// use http::{Response, StatusCode};
/// use ratewarden_tower::rate_limit::MissingKey;
///
/// assert!(matches!(MissingKey::default(), MissingKey::Reject(StatusCode::BAD_REQUEST)));
/// // Any response of your own, as is: status, headers and body.
/// let custom = MissingKey::respond(|| {
///     let mut response = Response::new(Bytes::from_static(b"sign in first"));
///     *response.status_mut() = StatusCode::UNAUTHORIZED;
///     response
/// });
/// # let _ = custom;
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer with this status and a `problem+json` body (the default is 400). A gRPC call
    /// gets the closest gRPC status instead.
    Reject(StatusCode),
    /// Answer with the response this function makes for each such request, as it makes it
    /// (see [`respond`](Self::respond)).
    Respond(Arc<dyn Fn() -> Response<Bytes> + Send + Sync>),
    /// Let the request through without counting it against this limit. One whose key is
    /// [unusable](crate::key::KeyExtractor::has_unusable_key) (the key's header, or
    /// `Authorization`, more than once) is refused: `401` with the extractor's challenge for
    /// a credential, else `400`, so that a client cannot leave its limit by sending its key
    /// twice. A bearer token that is no key of this limit's (another issuer's, an opaque API
    /// key, a forged one) is skipped like no token: the application refuses or serves it. So
    /// verify tokens in the limit as the application does (the same key and `Validation`):
    /// one the application serves but the limit refuses would pass uncounted.
    ///
    /// Skipped requests are counted on every build by
    /// [`RateLimitLayer::skipped`](super::RateLimitLayer::skipped) (and, with the `metrics`
    /// feature, under the outcome `missing_key_skipped`). Watch it: a server that never gives
    /// the key makes every request keyless, so that nothing is limited. For
    /// [`PeerIp`](crate::key::PeerIp), that is axum served without
    /// `into_make_service_with_connect_info::<SocketAddr>()`, or tonic without the `tonic`
    /// feature.
    Skip,
}

impl MissingKey {
    /// Answers with `response()`: your status, headers and body, for HTTP and gRPC alike.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::Response;
    /// use ratewarden_tower::rate_limit::MissingKey;
    /// let missing = MissingKey::respond(|| Response::new(Bytes::from_static(b"no key")));
    /// # let _ = missing;
    /// ```
    pub fn respond<F>(response: F) -> Self
    where
        F: Fn() -> Response<Bytes> + Send + Sync + 'static,
    {
        Self::Respond(Arc::new(response))
    }

    /// The answer for a request without a key, `None` to let it through. `challenge` is the
    /// extractor's `WWW-Authenticate` value, if its key is a credential.
    pub(crate) fn answer(
        &self,
        grpc: bool,
        challenge: Option<HeaderValue>,
    ) -> Option<Response<Bytes>> {
        let status = match self {
            Self::Skip => return None,
            Self::Respond(respond) => return Some(respond()),
            Self::Reject(status) => *status,
        };
        let title = status.canonical_reason().unwrap_or("Error");
        let mut answer = if grpc {
            problem::grpc_status(problem::grpc_code(status), title)
        } else {
            problem::problem(status, problem::body("about:blank", status, None))
        };
        if let Some(challenge) = challenge {
            answer
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, challenge);
        }
        Some(answer)
    }
}

impl Default for MissingKey {
    fn default() -> Self {
        Self::Reject(StatusCode::BAD_REQUEST)
    }
}

impl fmt::Debug for MissingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Reject(status) => f.debug_tuple("Reject").field(status).finish(),
            Self::Respond(_) => f.write_str("Respond(..)"),
            Self::Skip => f.write_str("Skip"),
        }
    }
}
