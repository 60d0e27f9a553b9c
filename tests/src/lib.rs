//! Support code for the integration tests of the `ratewarden` workspace, and the harnesses that the
//! fuzz targets (`fuzz/`) share with the tests that replay their corpus.

/// The workspace README, whose Rust blocks run (or, marked `no_run`, compile) as doctests: what
/// a new user copies from it works.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// Each crate's README (what crates.io shows), whose Rust blocks run as doctests too.
#[cfg(doctest)]
#[doc = include_str!("../../crates/ratewarden-core/README.md")]
#[doc = include_str!("../../crates/ratewarden-memory/README.md")]
#[doc = include_str!("../../crates/ratewarden-redis/README.md")]
#[doc = include_str!("../../crates/ratewarden-breaker/README.md")]
#[doc = include_str!("../../crates/ratewarden-tower/README.md")]
pub struct CrateReadmeDoctests;

mod client_ip;
pub mod conformance;
mod down;
pub mod proxy;
pub mod redis_server;
pub mod several;

pub use client_ip::{PROXIED_CLIENT, client_ip_case, proxied_request};
pub use down::Down;
