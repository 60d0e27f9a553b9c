//! [`CatchUnwind`]: a future whose panic is its output, so that a resolver's bug is a failed
//! lookup rather than a panic in every call waiting for it.

use std::any::Any;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project_lite::pin_project! {
    /// Polls `inner`, and ends with `Err(payload)` when a poll panics. Not polled again after
    /// it ends.
    pub(super) struct CatchUnwind<F> {
        #[pin]
        inner: F,
    }
}

impl<F> CatchUnwind<F> {
    pub(super) const fn new(inner: F) -> Self {
        Self { inner }
    }
}

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.project().inner;
        // Unwind safe: after a panic the future is never polled again, and the cache keeps
        // none of the resolver's state; the answer stored is the failed lookup's.
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(poll) => poll.map(Ok),
            Err(payload) => Poll::Ready(Err(payload)),
        }
    }
}

/// The message of a panic's payload (`panic!`'s formatted text), when it has one.
#[cfg(feature = "tracing")]
pub(super) fn message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not a string)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_poll_ends_the_future_with_its_payload() {
        let panicking = CatchUnwind::new(async {
            tokio::task::yield_now().await;
            panic!("resolver bug");
        });
        let payload = panicking.await.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"resolver bug"));
        assert_eq!(CatchUnwind::new(async { 7 }).await.unwrap(), 7);
    }
}
