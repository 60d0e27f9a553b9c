//! Authenticating datagrams: each is sealed with HMAC-SHA256 under the mesh's shared secret,
//! over a sequence number and the datagram; [`Window`] drops one seen before or older than
//! the last 1,024 a peer sent it.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Bytes of the tag.
const TAG: usize = 32;

/// Bytes a seal adds: the sequence number and the tag.
pub(crate) const OVERHEAD: usize = 8 + TAG;

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

/// How far behind the highest sequence number seen a datagram may arrive and still be taken.
pub(crate) const WINDOW: u64 = 1_024;

/// The sequence numbers seen from one peer: the highest, and which of the [`WINDOW`] up to
/// it (bit `seq % WINDOW`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Window {
    highest: u64,
    seen: [u64; (WINDOW / 64) as usize],
}

impl Window {
    /// Whether `seq` is new (and records it): higher than any seen, or among the last
    /// [`WINDOW`] and not seen yet.
    pub(crate) fn accept(&mut self, seq: u64) -> bool {
        if seq > self.highest {
            if seq - self.highest >= WINDOW {
                self.seen = Default::default();
            } else {
                for skipped in self.highest + 1..seq {
                    self.set(skipped, false);
                }
            }
            self.highest = seq;
            self.set(seq, true);
            return true;
        }
        if self.highest - seq >= WINDOW || self.get(seq) {
            return false;
        }
        self.set(seq, true);
        true
    }

    /// The highest sequence number taken (0: none).
    pub(crate) const fn highest(&self) -> u64 {
        self.highest
    }

    fn get(&self, seq: u64) -> bool {
        let bit = seq % WINDOW;
        self.seen[(bit / 64) as usize] & (1 << (bit % 64)) != 0
    }

    fn set(&mut self, seq: u64, seen: bool) {
        let bit = seq % WINDOW;
        let word = &mut self.seen[(bit / 64) as usize];
        if seen {
            *word |= 1 << (bit % 64);
        } else {
            *word &= !(1 << (bit % 64));
        }
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
    fn a_window_takes_each_number_once_and_none_older_than_its_width() {
        let mut w = Window::default();
        assert!(w.accept(100));
        assert!(!w.accept(100));
        assert!(w.accept(99));
        assert!(w.accept(1_100));
        assert!(!w.accept(99)); // 1,001 back, seen
        assert!(w.accept(98)); // 1,002 back, not seen
        assert!(w.accept(1_099)); // skipped, now seen
        assert!(!w.accept(1_099));
        assert!(!w.accept(76)); // 1,024 back: too old
        assert!(w.accept(1_100 + 1_024 + 5)); // a jump past the window forgets it all
        assert!(!w.accept(1_100));
        assert!(w.accept(1_100 + 1_024));
    }

    #[test]
    fn any_order_within_the_window_takes_every_number_once() {
        let mut w = Window::default();
        let mut order: Vec<u64> = (1..=WINDOW).collect();
        fastrand::Rng::with_seed(7).shuffle(&mut order);
        assert!(order.iter().all(|&seq| w.accept(seq)));
        assert!(order.iter().all(|&seq| !w.accept(seq)));
    }
}
