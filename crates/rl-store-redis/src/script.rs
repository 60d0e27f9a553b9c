//! The Lua scripts, and the layout of the keys they keep state in.

use std::fmt::Write;
use std::sync::LazyLock;

use rl_core::{Algorithm, Key, KeyRepr, Quota};

/// A Lua script: its source (sent with `EVAL` when Redis lacks it) and its SHA-1 (for
/// `EVALSHA`, the usual path).
pub(crate) struct Lua {
    pub(crate) source: &'static str,
    pub(crate) sha: String,
}

/// One run of a script: its key and arguments.
pub(crate) struct Call<'a> {
    pub(crate) key: &'a str,
    /// `c` (check) or `p` (peek).
    pub(crate) mode: &'a str,
    pub(crate) cost: u32,
    /// The time in µs, or `None` for the server's `TIME` (tests pass their own).
    pub(crate) now: Option<u64>,
    pub(crate) figure: u64,
    pub(crate) limit: u64,
}

impl Lua {
    /// `EVALSHA sha` (`by_sha`) or `EVAL source`, for `call`.
    pub(crate) fn command(&self, by_sha: bool, call: &Call<'_>) -> redis::Cmd {
        let mut cmd = redis::cmd(if by_sha { "EVALSHA" } else { "EVAL" });
        if by_sha {
            cmd.arg(&self.sha);
        } else {
            cmd.arg(self.source);
        }
        cmd.arg(1).arg(call.key).arg(call.mode).arg(call.cost);
        match call.now {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        cmd.arg(call.figure).arg(call.limit);
        cmd
    }
}

macro_rules! script {
    ($file:literal) => {
        LazyLock::new(|| {
            let source = concat!(include_str!("lua/prelude.lua"), include_str!($file));
            Lua {
                source,
                sha: redis::Script::new(source).get_hash().to_owned(),
            }
        })
    };
}

static GCRA: LazyLock<Lua> = script!("lua/gcra.lua");
static TOKEN_BUCKET: LazyLock<Lua> = script!("lua/token_bucket.lua");
static FIXED_WINDOW: LazyLock<Lua> = script!("lua/fixed_window.lua");
static SLIDING_WINDOW: LazyLock<Lua> = script!("lua/sliding_window.lua");
static SLIDING_LOG: LazyLock<Lua> = script!("lua/sliding_log.lua");

/// The script of `algorithm`, and the two figures it takes after the cost and the time.
pub(crate) fn script(quota: &Quota) -> (&'static Lua, u64, u64) {
    let limit = u64::from(quota.burst());
    match quota.algorithm() {
        Algorithm::Gcra => (&GCRA, quota.emission_interval_micros(), limit),
        Algorithm::TokenBucket => (&TOKEN_BUCKET, quota.emission_interval_micros(), limit),
        Algorithm::FixedWindow => (&FIXED_WINDOW, quota.period_micros(), limit),
        Algorithm::SlidingWindow => (&SLIDING_WINDOW, quota.period_micros(), limit),
        _ => (&SLIDING_LOG, quota.period_micros(), limit),
    }
}

/// `PREFIX:{KIND HEX}:ALGORITHM`, `PREFIX:{KIND HEX.PART}:ALGORITHM` for sub-counter `PART`
/// of a split hot key (in a slot of its own), and `...:SCOPE:ALGORITHM` for a scoped key (the
/// scope in 16 hex digits). The key sits in a hash tag (one cluster slot per key) and is
/// hex-encoded, so no byte of user input can end the tag early or collide across kinds:
/// `i` integers, `a` addresses, `s` strings, `h` digests.
pub(crate) fn state_key(
    prefix: &str,
    key: &Key,
    part: Option<u32>,
    algorithm: Algorithm,
) -> String {
    let mut out = String::with_capacity(prefix.len() + 24 + 2 * 40);
    out.push_str(prefix);
    out.push_str(":{");
    let hex = |out: &mut String, bytes: &[u8]| {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        for &b in bytes {
            out.push(char::from(DIGITS[usize::from(b >> 4)]));
            out.push(char::from(DIGITS[usize::from(b & 0xf)]));
        }
    };
    match key.repr() {
        KeyRepr::Int(n) => {
            // Writing to a String cannot fail.
            let _ = write!(out, "i{n}");
        }
        KeyRepr::Ip(ip) => {
            out.push('a');
            hex(&mut out, ip);
        }
        KeyRepr::Bytes(b) => {
            out.push('s');
            hex(&mut out, b);
        }
        KeyRepr::Digest(d) => {
            out.push('h');
            hex(&mut out, d);
        }
    }
    if let Some(part) = part {
        // Writing to a String cannot fail.
        let _ = write!(out, ".{part}");
    }
    out.push_str("}:");
    if key.scope() != 0 {
        // Writing to a String cannot fail.
        let _ = write!(out, "{:016x}:", key.scope());
    }
    out.push_str(algorithm.as_str());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_user_bytes_inside_their_hash_tag() {
        let key = Key::from("}{evil}");
        let layout = state_key("rl", &key, None, Algorithm::Gcra);
        assert_eq!(layout, "rl:{s7d7b6576696c7d}:gcra");
        assert_eq!(layout.matches('{').count(), 1);
        assert_eq!(
            state_key("rl", &Key::from(""), None, Algorithm::FixedWindow),
            "rl:{s}:fixed-window"
        );
        assert_eq!(
            state_key("p", &Key::from(7u64), None, Algorithm::Gcra),
            "p:{i7}:gcra"
        );
        assert_ne!(
            state_key("p", &Key::from("7"), None, Algorithm::Gcra),
            state_key("p", &Key::from(7u64), None, Algorithm::Gcra)
        );
        assert_eq!(
            state_key("p", &Key::from(7u64).scoped(0xab), Some(3), Algorithm::Gcra),
            "p:{i7.3}:00000000000000ab:gcra"
        );
    }
}
