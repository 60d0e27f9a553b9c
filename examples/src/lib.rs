//! Examples of the `rl` workspace, each run with `cargo run --example NAME` from the workspace
//! root. Every example listens on `ADDR` (default `127.0.0.1:3000`) and prints
//! `listening on http://ADDR` once it accepts connections.

/// The address to listen on: `ADDR`, or `127.0.0.1:3000`.
#[must_use]
pub fn addr() -> String {
    std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned())
}
