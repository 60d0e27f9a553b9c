//! [`ResponseFuture`], the future of [`RateLimit`](super::RateLimit).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{HeaderMap, Response};
use pin_project_lite::pin_project;
use ratewarden_core::Info;

use super::body::ResponseBody;
use super::headers::{HeaderStyle, PolicyHeaders};

type BoxFuture<B, E> = Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

/// The rate-limit headers an admitted request's response gets.
pub(crate) enum Headers {
    None,
    /// One limit's, formatted when the response comes.
    One(Arc<PolicyHeaders>, Info, HeaderStyle),
    /// Fields made already (the policy layer's, an item per limit).
    Fields(HeaderMap),
}

impl Headers {
    /// One limit's headers, if any, in `style`.
    pub(crate) fn one(headers: Option<(Arc<PolicyHeaders>, Info)>, style: HeaderStyle) -> Self {
        headers.map_or(Self::None, |(policy, info)| Self::One(policy, info, style))
    }
}

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit): the inner service's response
    /// with rate-limit headers, or a rejection.
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        state: State<F, B, E>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B, E> {
        Inner { #[pin] future: F, headers: Headers },
        Ready { response: Option<Response<Bytes>> },
        Waiting { future: BoxFuture<B, E> },
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    pub(crate) const fn inner(future: F, headers: Headers) -> Self {
        Self {
            state: State::Inner { future, headers },
        }
    }

    pub(crate) const fn ready(response: Response<Bytes>) -> Self {
        Self {
            state: State::Ready {
                response: Some(response),
            },
        }
    }

    pub(crate) const fn boxed(future: BoxFuture<B, E>) -> Self {
        Self {
            state: State::Waiting { future },
        }
    }
}

/// Wraps the inner response's body and adds the rate-limit headers.
pub(crate) fn finish<B>(response: Response<B>, headers: Headers) -> Response<ResponseBody<B>> {
    let (mut parts, body) = response.into_parts();
    match headers {
        Headers::None => {}
        Headers::One(policy, info, style) => policy.apply(&mut parts.headers, &info, style),
        Headers::Fields(fields) => {
            for (name, value) in fields {
                if let Some(name) = name {
                    parts.headers.insert(name, value);
                }
            }
        }
    }
    Response::from_parts(parts, ResponseBody::inner(body))
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { future, headers } => {
                let response = ready!(future.poll(cx))?;
                let headers = std::mem::replace(headers, Headers::None);
                Poll::Ready(Ok(finish(response, headers)))
            }
            StateProj::Ready { response } => {
                let response = response
                    .take()
                    .map(|r| r.map(ResponseBody::full))
                    .unwrap_or_default();
                Poll::Ready(Ok(response))
            }
            StateProj::Waiting { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
