//! The pure core of the `ratewarden` rate limiters: quotas, algorithms, decisions, clocks, keys and the
//! [`Store`] trait. No I/O, no async runtime, no networking.
//!
//! Every algorithm is a function of `(state, now, cost, quota) -> (state, Decision)` over a
//! small fixed-size state in integer microseconds, so the same logic runs in memory
//! (`ratewarden-memory`), in Lua on Redis (`ratewarden-redis`) and in tests driven by a
//! [`ManualClock`].
//!
//! # Quick start
//!
//! ```
//! use ratewarden_core::algorithm::{AlgorithmState, GcraState};
//! use ratewarden_core::{ManualClock, Clock, Quota};
//! use std::time::Duration;
//!
//! let quota: Quota = "2/s".parse()?;
//! let clock = ManualClock::default();
//! let mut state = GcraState::default();
//!
//! assert!(state.check(clock.now(), 1, &quota).is_allowed());
//! assert!(state.check(clock.now(), 1, &quota).is_allowed());
//! let denied = state.check(clock.now(), 1, &quota);
//! assert!(!denied.is_allowed());
//! assert_eq!(denied.info().retry_after(), Duration::from_millis(500));
//! # Ok::<(), ratewarden_core::ParseQuotaError>(())
//! ```
//!
//! # Feature flags
//!
//! | feature | default | what it adds |
//! |---------|---------|--------------|
//! | `monotonic-clock` | yes | [`MonotonicClock`], a monotonic wall clock read from the CPU's time stamp counter (`quanta`) |
//! | `serde` | no | `Serialize` and `Deserialize` for [`Quota`] and [`Algorithm`], in their string forms (`"10/s burst 50"`) |
//!
//! # Time
//!
//! Clocks return a [`Timestamp`] in nanoseconds; algorithms compute in whole microseconds, so
//! every number they store stays below 2^53 (the precision of Lua's numbers on Redis) for the
//! next 285 years. Time that stands still or runs backwards never admits more.
//!
//! MSRV: Rust 1.89.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod algorithm;
mod clock;
mod decision;
mod error;
mod key;
mod limits;
mod quota;
mod reservation;
mod store;

pub use algorithm::Algorithm;
#[cfg(feature = "monotonic-clock")]
pub use clock::MonotonicClock;
pub use clock::{Clock, ManualClock, Timestamp};
pub use decision::{Decision, Info};
pub use error::{StoreError, StoreErrorKind};
pub use key::{Key, KeyRepr, MAX_KEY_LEN};
pub use limits::{Decisions, Limit, MAX_LIMITS, merged};
pub use quota::{ParseQuotaError, Quota, QuotaError};
pub use reservation::Reservation;
pub use store::Store;
