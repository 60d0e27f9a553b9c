//! [`ResponseBody`]: the inner service's body, or a rejection's bytes; a held request's body
//! settles its reservation when it ends or is dropped.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::settle::Settling;

pin_project! {
    /// The body of a [`RateLimit`](super::RateLimit) response: the inner service's body when
    /// the request was let through, or the bytes of a rejection. A request held for
    /// [settlement](super::Settlement) by its frames is settled when its body ends, or when
    /// the body is dropped (with the units counted so far).
    ///
    /// ```
    /// use http_body::Body;
    /// use ratewarden_tower::rate_limit::ResponseBody;
    ///
    /// let body = ResponseBody::<String>::full(bytes::Bytes::from_static(b"{}"));
    /// assert_eq!(body.size_hint().exact(), Some(2));
    /// ```
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
        settling: Option<Settling>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// Wraps the inner service's body.
    ///
    /// ```
    /// use http_body::Body;
    /// let body = ratewarden_tower::rate_limit::ResponseBody::inner(String::from("hello"));
    /// assert_eq!(body.size_hint().exact(), Some(5));
    /// ```
    pub const fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
            settling: None,
        }
    }

    /// This body, settling `settling` as its frames go.
    pub(crate) fn settling(mut self, settling: Option<Settling>) -> Self {
        self.settling = settling;
        self
    }

    /// A body of `data` (empty when `data` is).
    ///
    /// ```
    /// use http_body::Body;
    /// let body = ratewarden_tower::rate_limit::ResponseBody::<String>::full(bytes::Bytes::new());
    /// assert!(body.is_end_stream());
    /// ```
    pub fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            settling: None,
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner"),
            Kind::Full { data } => f.debug_tuple("ResponseBody::Full").field(data).finish(),
        }
    }
}

impl<B> Default for ResponseBody<B> {
    fn default() -> Self {
        Self::full(Bytes::new())
    }
}

impl<B: Body<Data = Bytes>> Body for ResponseBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = match this.kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        };
        if let Some(settling) = this.settling {
            match &polled {
                Poll::Ready(Some(Ok(frame))) => settling.frame(frame),
                Poll::Ready(None) => settling.finish(),
                Poll::Pending => settling.waiting(cx),
                Poll::Ready(Some(Err(_))) => {}
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
