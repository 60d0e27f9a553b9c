//! Authenticating datagrams: each is sealed with HMAC-SHA256 under the mesh's shared secret,
//! over a sequence number and the datagram; [`Window`] drops one seen before or older than
//! the last 64 a peer sent.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Bytes of the tag.
const TAG: usize = 32;

/// The shortest secret accepted, in bytes.
pub(crate) const MIN_SECRET: usize = 16;

/// Seals and opens datagrams under one secret.
#[derive(Clone)]
pub(crate) struct Sealer(Hmac<Sha256>);

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

impl Sealer {
    /// `None` for a secret shorter than [`MIN_SECRET`].
    pub(crate) fn new(secret: &[u8]) -> Option<Self> {
        if secret.len() < MIN_SECRET {
            return None;
        }
        Hmac::<Sha256>::new_from_slice(secret).ok().map(Self)
    }

    /// `seq ‖ datagram ‖ tag`.
    pub(crate) fn seal(&self, seq: u64, datagram: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + datagram.len() + TAG);
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(datagram);
        let mut mac = self.0.clone();
        mac.update(&out);
        out.extend_from_slice(&mac.finalize().into_bytes());
        out
    }

    /// The sequence number and the datagram, if the tag is right (compared in constant time).
    pub(crate) fn open<'a>(&self, sealed: &'a [u8]) -> Option<(u64, &'a [u8])> {
        let body_len = sealed.len().checked_sub(TAG)?;
        if body_len < 8 {
            return None;
        }
        let (body, tag) = sealed.split_at(body_len);
        let mut mac = self.0.clone();
        mac.update(body);
        mac.verify_slice(tag).ok()?;
        let (seq, datagram) = body.split_at(8);
        Some((u64::from_le_bytes(seq.try_into().ok()?), datagram))
    }
}

/// The sequence numbers seen from one peer: the highest, and which of the 64 below it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Window {
    highest: u64,
    seen: u64,
}

impl Window {
    /// Whether `seq` is new (and records it): higher than any seen, or among the last 64
    /// and not seen yet.
    pub(crate) fn accept(&mut self, seq: u64) -> bool {
        if seq > self.highest {
            let shift = seq - self.highest;
            self.seen = if shift >= 64 { 0 } else { self.seen << shift };
            self.seen |= 1;
            self.highest = seq;
            return true;
        }
        let back = self.highest - seq;
        if back >= 64 || self.seen & (1 << back) != 0 {
            return false;
        }
        self.seen |= 1 << back;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_made_with_another_secret_or_over_other_bytes_is_refused() {
        let sealer = Sealer::new(b"0123456789abcdef").unwrap();
        let sealed = sealer.seal(7, b"hello");
        assert_eq!(sealer.open(&sealed), Some((7, &b"hello"[..])));
        let stranger = Sealer::new(b"fedcba9876543210").unwrap();
        assert_eq!(stranger.open(&sealed), None);
        for i in 0..sealed.len() {
            let mut bent = sealed.clone();
            bent[i] ^= 1;
            assert_eq!(sealer.open(&bent), None, "byte {i}");
        }
        for cut in 0..sealed.len() {
            assert_eq!(sealer.open(&sealed[..cut]), None);
        }
        assert!(Sealer::new(b"short").is_none());
    }

    #[test]
    fn a_window_takes_each_number_once_and_none_older_than_64() {
        let mut w = Window::default();
        assert!(w.accept(100));
        assert!(!w.accept(100));
        assert!(w.accept(99));
        assert!(w.accept(160));
        assert!(!w.accept(99)); // 61 back, seen
        assert!(w.accept(98)); // 62 back, not seen
        assert!(!w.accept(96)); // 64 back: too old
        assert!(w.accept(1_000));
        assert!(!w.accept(160));
    }
}
