//! [`Settlement`]: when a request's units are counted. At once (the default), or held when
//! the request is admitted and settled from its response: [`CountIf`], [`SettleWith`],
//! [`SettleByFrames`].

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body::Frame;
use ratewarden_core::{Reservation, Store};

/// When a [`RateLimitLayer`](super::RateLimitLayer) counts a request's units: implemented
/// by [`AtOnce`] (the default: counted when admitted), [`CountIf`], [`SettleWith`] and
/// [`SettleByFrames`] (held when admitted, settled from the response). Sealed: made by the
/// layer's builder methods.
///
/// A held request holds its [cost](super::RateLimitLayer::cost_by) (the estimate) until it
/// is settled: other requests of its key are admitted only beside what it holds. Settled
/// below the estimate, the rest is free at once; above it, the difference is charged all
/// the same and owed, so a key goes over its quota by at most the overdraft of its requests
/// in flight at once ([`Ledger`](ratewarden_core::algorithm::Ledger)). A request whose
/// inner service fails, whose future is dropped or whose handler panics settles 0; a body
/// dropped before its end settles what it counted. A store that cannot settle at once
/// (Redis) settles on a spawned task (on the current tokio runtime). A settle that cannot be
/// made (no runtime, one shutting down, a store that fails: logged with `tracing`) charges
/// nothing, and the hold lapses after [`hold`](super::RateLimitLayer::hold).
///
/// Held requests use the store's [`reserve`](Store::reserve): their key's state is apart
/// from requests counted at once. When the store fails, the
/// [failure mode](super::RateLimitLayer::on_store_error) decides as for any request, and
/// what it admits is counted at once.
pub trait Settlement<B>: sealed::Meter<B> + Clone + Send + Sync + 'static {}

impl<B, M: sealed::Meter<B> + Clone + Send + Sync + 'static> Settlement<B> for M {}

/// Counts each request's cost when it is admitted (the default).
///
/// ```
/// use ratewarden_tower::rate_limit::AtOnce;
/// let _default = AtOnce;
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct AtOnce;

/// Counts a request's cost only when its response says so (`true`): failed logins only,
/// say. Made by [`RateLimitLayer::count_if`](super::RateLimitLayer::count_if).
///
/// ```
/// use http::{Response, StatusCode};
/// use ratewarden_tower::{key::PeerIp, MemoryStore, Quota, RateLimitLayer};
/// let failed_logins = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(3)?, PeerIp::new())
///     .count_if(|response: &Response<axum::body::Body>| response.status() == StatusCode::UNAUTHORIZED);
/// # Ok::<(), ratewarden_tower::QuotaError>(())
/// ```
#[derive(Clone)]
pub struct CountIf<F>(pub(crate) F);

/// Charges the units a response reports (tokens generated, rows exported), read from the
/// response's head. Made by
/// [`RateLimitLayer::settle_with`](super::RateLimitLayer::settle_with).
///
/// ```
/// use http::Response;
/// use ratewarden_tower::{key::Global, MemoryStore, Quota, RateLimitLayer};
/// let rows = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(10_000)?, Global)
///     .cost_by(|_: &http::Request<axum::body::Body>| 500) // the estimate
///     .settle_with(|response: &Response<axum::body::Body>| {
///         response.headers().get("x-rows").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(500)
///     });
/// # Ok::<(), ratewarden_tower::QuotaError>(())
/// ```
#[derive(Clone)]
pub struct SettleWith<F>(pub(crate) F);

/// Charges the units counted over a streaming body, a closure per frame (data or
/// trailers: gRPC reports in trailers), settled when the body ends or is dropped (what was
/// counted so far). Made by
/// [`RateLimitLayer::settle_by_frames`](super::RateLimitLayer::settle_by_frames).
///
/// ```
/// use ratewarden_tower::{key::Global, MemoryStore, Quota, RateLimitLayer};
/// // One unit per kilobyte sent.
/// let bytes = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(10_000)?, Global)
///     .settle_by_frames(|frame: &http_body::Frame<bytes::Bytes>| {
///         frame.data_ref().map_or(0, |data| u32::try_from(data.len().div_ceil(1024)).unwrap_or(u32::MAX))
///     });
/// # Ok::<(), ratewarden_tower::QuotaError>(())
/// ```
pub struct SettleByFrames<F>(pub(crate) Arc<F>);

impl<F> Clone for SettleByFrames<F> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

macro_rules! opaque_debug {
    ($($name:ident),*) => {$(
        impl<F> fmt::Debug for $name<F> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(stringify!($name))
            }
        }
    )*};
}

opaque_debug!(CountIf, SettleWith, SettleByFrames);

/// Limits the requests of a key in progress at once: each holds its cost (a place) from
/// when it is admitted until its response body ends or is dropped, and settles nothing.
/// Made by [`RateLimitLayer::in_flight`](super::RateLimitLayer::in_flight).
///
/// ```
/// use ratewarden_tower::{key::PeerIp, MemoryStore, RateLimitLayer};
/// let two_at_once = RateLimitLayer::in_flight(MemoryStore::new(), 2, PeerIp::new())?;
/// # Ok::<(), ratewarden_tower::QuotaError>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct InFlight;

/// A closure counting the units of one frame.
pub(crate) type PerFrame = Arc<dyn Fn(&Frame<Bytes>) -> u32 + Send + Sync>;

pub(crate) mod sealed {
    use super::{AtOnce, CountIf, InFlight, PerFrame, Response, SettleByFrames, SettleWith};
    use bytes::Bytes;
    use http_body::Frame;
    use std::sync::Arc;

    /// How one response's units are known.
    pub enum Metered {
        /// Now, from the response's head.
        Units(u32),
        /// Over its body, frame by frame.
        Frames(PerFrame),
    }

    impl std::fmt::Debug for Metered {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                Self::Units(units) => f.debug_tuple("Units").field(units).finish(),
                Self::Frames(_) => f.write_str("Frames"),
            }
        }
    }

    pub trait Meter<B> {
        /// Whether requests are held and settled (else counted at once).
        const RESERVES: bool;

        /// Mixed into the layer's scope: a layer whose states mean something else (places
        /// in flight, not units) never shares a state with a rate limit of its name.
        const SCOPE: u64 = 0;

        /// The units of `response`, whose request held `estimate`.
        fn meter(&self, response: &Response<B>, estimate: u32) -> Metered;
    }

    impl<B> Meter<B> for InFlight {
        const RESERVES: bool = true;
        const SCOPE: u64 = 0x1f1f_9a7e_c0c0_2b5d;

        /// Nothing to charge: the place is held until the body ends or is dropped.
        fn meter(&self, _: &Response<B>, _: u32) -> Metered {
            static NOTHING: std::sync::OnceLock<PerFrame> = std::sync::OnceLock::new();
            Metered::Frames(Arc::clone(
                NOTHING.get_or_init(|| Arc::new(|_: &Frame<Bytes>| 0)),
            ))
        }
    }

    impl<B> Meter<B> for AtOnce {
        const RESERVES: bool = false;

        fn meter(&self, _: &Response<B>, estimate: u32) -> Metered {
            Metered::Units(estimate)
        }
    }

    impl<B, F: Fn(&Response<B>) -> bool> Meter<B> for CountIf<F> {
        const RESERVES: bool = true;

        fn meter(&self, response: &Response<B>, estimate: u32) -> Metered {
            Metered::Units(if (self.0)(response) { estimate } else { 0 })
        }
    }

    impl<B, F: Fn(&Response<B>) -> u32> Meter<B> for SettleWith<F> {
        const RESERVES: bool = true;

        fn meter(&self, response: &Response<B>, _: u32) -> Metered {
            Metered::Units((self.0)(response))
        }
    }

    impl<B, F> Meter<B> for SettleByFrames<F>
    where
        F: Fn(&Frame<Bytes>) -> u32 + Send + Sync + 'static,
    {
        const RESERVES: bool = true;

        fn meter(&self, _: &Response<B>, _: u32) -> Metered {
            Metered::Frames(Arc::clone(&self.0) as PerFrame)
        }
    }
}

/// The shortest hold [`hold`](super::RateLimitLayer::hold) keeps.
pub(crate) const MIN_HOLD: Duration = Duration::from_millis(10);

/// The longest hold [`hold`](super::RateLimitLayer::hold) keeps.
pub(crate) const MAX_HOLD: Duration = Duration::from_secs(24 * 3_600);

/// A held request's reservation, settled once: with the units counted, when told to
/// ([`finish`](Self::finish)) or when dropped. A request still running at half its hold
/// time renews its holds on a task of its own (a heartbeat: at once, then every quarter of
/// the hold) until it is settled: its units stay held while it runs, and come back a hold
/// time after a gateway that crashed stopped renewing them.
pub(crate) struct Settling {
    /// The reservation and its store, taken when settled.
    held: Option<Box<dyn Held>>,
    /// The renewing task, once started.
    beating: Option<tokio::task::AbortHandle>,
    renew_after: tokio::time::Instant,
    /// Wakes a body waiting for its next frame at `renew_after` (made when it first waits).
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    per_frame: Option<PerFrame>,
    counted: u32,
}

/// A reservation with its store, behind one allocation whatever the store.
trait Held: Send + Sync {
    /// Spawns a task renewing the holds at once, then every quarter of the hold time, on the
    /// current runtime.
    fn keep_alive(&self) -> Option<tokio::task::AbortHandle>;
    /// Settles at `actual` units, now or on a spawned task.
    fn settle(self: Box<Self>, actual: u32);
}

struct Reserved<St> {
    store: Arc<St>,
    reservation: Reservation,
    hold: Duration,
}

impl<St: Store> Held for Reserved<St> {
    fn keep_alive(&self) -> Option<tokio::task::AbortHandle> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (store, hold) = (Arc::clone(&self.store), self.hold);
        let held = self.reservation.held().to_vec();
        let task = runtime.spawn(async move {
            loop {
                let renewed = store.renew(&held, hold).await;
                #[cfg(feature = "tracing")]
                if let Err(error) = renewed {
                    tracing::warn!(%error, "a held request's holds could not be renewed");
                }
                #[cfg(not(feature = "tracing"))]
                let _ = renewed;
                tokio::time::sleep(hold / 4).await;
            }
        });
        Some(task.abort_handle())
    }

    fn settle(self: Box<Self>, actual: u32) {
        let Self {
            store, reservation, ..
        } = *self;
        if let Err(reservation) = store.settle_ready(reservation, actual)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                // Not settled, the holds lapse after their hold time, the actual units
                // uncharged.
                let settled = store.settle(reservation, actual).await;
                #[cfg(feature = "tracing")]
                if let Err(error) = settled {
                    tracing::warn!(%error, actual, "a held request could not be settled");
                }
                #[cfg(not(feature = "tracing"))]
                let _ = settled;
            });
        }
    }
}

impl Settling {
    pub(crate) fn new<St: Store>(store: Arc<St>, reservation: Reservation, hold: Duration) -> Self {
        Self {
            held: Some(Box::new(Reserved {
                store,
                reservation,
                hold,
            })),
            beating: None,
            renew_after: renew_after(hold),
            timer: None,
            per_frame: None,
            counted: 0,
        }
    }

    /// When the request, still running, should start renewing its holds.
    pub(crate) const fn renew_after(&self) -> tokio::time::Instant {
        self.renew_after
    }

    /// Starts the heartbeat, if it has not started and the request is not settled.
    pub(crate) fn keep_alive(&mut self) {
        if self.beating.is_none()
            && let Some(held) = &self.held
        {
            self.beating = held.keep_alive();
        }
    }

    /// Settles now at what the response reports, or counts its body's frames.
    pub(crate) fn metered(mut self, metered: sealed::Metered) -> Option<Self> {
        match metered {
            sealed::Metered::Units(units) => {
                self.counted = units;
                None // dropped: settled now
            }
            sealed::Metered::Frames(per_frame) => {
                self.per_frame = Some(per_frame);
                Some(self)
            }
        }
    }

    pub(crate) fn frame(&mut self, frame: &Frame<Bytes>) {
        if let Some(per_frame) = &self.per_frame {
            self.counted = self.counted.saturating_add(per_frame(frame));
        }
        if self.beating.is_none() && tokio::time::Instant::now() >= self.renew_after {
            self.keep_alive();
        }
    }

    /// The body waits for its next frame: starts renewing at `renew_after` even if no frame
    /// comes by then.
    pub(crate) fn waiting(&mut self, cx: &mut Context<'_>) {
        if self.beating.is_some() || self.held.is_none() {
            return;
        }
        if self.timer.is_none() {
            if tokio::runtime::Handle::try_current().is_err() {
                return;
            }
            self.timer = Some(Box::pin(tokio::time::sleep_until(self.renew_after)));
        }
        if let Some(timer) = &mut self.timer
            && timer.as_mut().poll(cx).is_ready()
        {
            self.timer = None;
            self.keep_alive();
        }
    }

    pub(crate) fn finish(&mut self) {
        if let Some(beating) = self.beating.take() {
            beating.abort();
        }
        if let Some(held) = self.held.take() {
            held.settle(self.counted);
        }
    }
}

/// Half the hold from now (a day from now for a hold the clock cannot add).
fn renew_after(hold: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(hold / 2)
        .unwrap_or_else(|| now + MAX_HOLD / 2)
}

impl Drop for Settling {
    fn drop(&mut self) {
        self.finish();
    }
}
