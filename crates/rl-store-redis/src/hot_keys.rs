//! Hot-key splitting: one key's quota spread over `n` sub-counters, each in its own cluster
//! slot and each enforcing [`Quota::share`](rl_core::Quota::share)`(n)`, one chosen at random
//! per check. Either for
//! every key ([`HotKeys::split`]) or only for keys this gateway sees above a rate, announced to
//! every gateway through Redis pub/sub ([`HotKeys::adaptive`]).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use dashmap::DashMap;
use foldhash::fast::RandomState;
use rl_core::{Key, KeyRepr};

/// The most sub-counters a key is split into.
pub const MAX_PARTS: u32 = 64;

/// How many keys the rate tracker follows per window (space-saving top-k: any key with more
/// than `1 / TRACKED` of the window's checks is among them).
const TRACKED: usize = 128;

const WINDOW_NANOS: u64 = 1_000_000_000;

/// Whether and how a [`RedisStore`](crate::RedisStore) splits hot keys; see
/// [`RedisConfig::hot_keys`](crate::RedisConfig::hot_keys).
///
/// A split key admits at most `n - 1` more than its quota per period and at once (each of `n`
/// parts rounds its share up), and can deny a request while other parts still have room (the
/// chosen part is exhausted): BENCHMARKS.md measures that loss. Moving a key between one
/// counter and `n` (adaptive) starts the new counters empty: at most one extra burst per move.
///
/// ```
/// use rl_store_redis::HotKeys;
/// use std::num::NonZeroU32;
/// use std::time::Duration;
///
/// let global_limit = HotKeys::split(NonZeroU32::new(8).unwrap());
/// let per_tenant = HotKeys::adaptive(1_000, NonZeroU32::new(16).unwrap()).hold(Duration::from_secs(60));
/// # let _ = (global_limit, per_tenant);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HotKeys {
    mode: Mode,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Mode {
    #[default]
    Off,
    Split {
        parts: u32,
    },
    Adaptive {
        threshold: u32,
        parts: u32,
        hold: Duration,
    },
}

impl HotKeys {
    /// Every key in `parts` sub-counters (at most 64): for a limit with one key for a whole
    /// fleet (a global or per-tenant limit) that one Redis node cannot carry.
    ///
    /// ```
    /// let split = rl_store_redis::HotKeys::split(std::num::NonZeroU32::new(4).unwrap());
    /// assert_eq!(split.parts(), 4);
    /// ```
    #[must_use]
    pub fn split(parts: NonZeroU32) -> Self {
        Self {
            mode: Mode::Split {
                parts: parts.get().min(MAX_PARTS),
            },
        }
    }

    /// A key that this gateway checks more than `threshold` times in a second is split into
    /// `parts` sub-counters (at most 64), on every gateway: the promotion is published on the
    /// Redis channel `PREFIX:hot-keys`. It stays split while any gateway still sees it above
    /// the threshold (they renew it), and returns to one counter [`hold`](Self::hold) (default
    /// 30 s) after the last renewal: no flapping at the threshold. The threshold is per
    /// gateway: for a fleet-wide rate `R` over `g` gateways, use about `R / g`. Rates are
    /// tracked in bounded memory (the 128 busiest keys of each second).
    ///
    /// ```
    /// let hot = rl_store_redis::HotKeys::adaptive(1_000, std::num::NonZeroU32::new(16).unwrap());
    /// assert_eq!(hot.parts(), 16);
    /// ```
    #[must_use]
    pub fn adaptive(threshold: u32, parts: NonZeroU32) -> Self {
        Self {
            mode: Mode::Adaptive {
                threshold,
                parts: parts.get().min(MAX_PARTS),
                hold: Duration::from_secs(30),
            },
        }
    }

    /// How long an adaptive split outlives its last renewal (default 30 s). No effect on
    /// other modes.
    ///
    /// ```
    /// use std::time::Duration;
    /// let hot = rl_store_redis::HotKeys::adaptive(500, std::num::NonZeroU32::new(8).unwrap())
    ///     .hold(Duration::from_secs(5));
    /// # let _ = hot;
    /// ```
    #[must_use]
    pub const fn hold(mut self, hold: Duration) -> Self {
        if let Mode::Adaptive {
            threshold, parts, ..
        } = self.mode
        {
            self.mode = Mode::Adaptive {
                threshold,
                parts,
                hold,
            };
        }
        self
    }

    /// The sub-counters of a split key (1: no splitting).
    ///
    /// ```
    /// assert_eq!(rl_store_redis::HotKeys::default().parts(), 1);
    /// ```
    #[must_use]
    pub const fn parts(&self) -> u32 {
        match self.mode {
            Mode::Off => 1,
            Mode::Split { parts } | Mode::Adaptive { parts, .. } => parts,
        }
    }

    pub(crate) const fn is_adaptive(&self) -> bool {
        matches!(self.mode, Mode::Adaptive { .. })
    }
}

/// A split in force: its parts, until when (local nanoseconds).
#[derive(Clone, Copy, Debug)]
struct Promotion {
    parts: u32,
    until: u64,
}

/// This gateway's view of hot keys: which are split, and (adaptive) how often each is checked.
#[derive(Debug)]
pub(crate) struct HotKeyState {
    config: HotKeys,
    promoted: DashMap<Key, Promotion, RandomState>,
    tracker: Mutex<Tracker>,
}

impl HotKeyState {
    /// The parts a split key has under this configuration (1 when never split).
    pub(crate) const fn config_parts(&self) -> u32 {
        self.config.parts()
    }

    pub(crate) fn new(config: HotKeys) -> Self {
        Self {
            config,
            promoted: DashMap::with_hasher(RandomState::default()),
            tracker: Mutex::new(Tracker::default()),
        }
    }

    /// How many sub-counters `key` has at `now` (1: not split).
    pub(crate) fn parts(&self, key: &Key, now: u64) -> u32 {
        match self.config.mode {
            Mode::Off => 1,
            Mode::Split { parts } => parts,
            Mode::Adaptive { .. } => self
                .promoted
                .get(key)
                .filter(|p| p.until > now)
                .map_or(1, |p| p.parts),
        }
    }

    /// Counts a check of `key` that goes to Redis (adaptive mode); returns the announcement
    /// to publish when the key just crossed the threshold here, or its split needs renewing.
    pub(crate) fn record(&self, key: &Key, now: u64) -> Option<Vec<u8>> {
        let Mode::Adaptive {
            threshold,
            parts,
            hold,
        } = self.config.mode
        else {
            return None;
        };
        let count = self
            .tracker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(key, now);
        let hold_nanos = u64::try_from(hold.as_nanos()).unwrap_or(u64::MAX);
        let current = self.promoted.get(key).map(|p| *p);
        if current.is_some_and(|p| p.until <= now) {
            self.promoted.remove_if(key, |_, p| p.until <= now);
        }
        // Over the threshold: promote, or renew once half the hold has passed.
        let renew = count > threshold
            && current.is_none_or(|p| p.until.saturating_sub(now) < hold_nanos / 2);
        renew.then(|| {
            self.promote(key.clone(), parts, now.saturating_add(hold_nanos));
            announcement(key, parts, hold)
        })
    }

    fn promote(&self, key: Key, parts: u32, until: u64) {
        let parts = parts.clamp(1, MAX_PARTS);
        self.promoted
            .entry(key)
            .and_modify(|p| {
                p.parts = parts;
                p.until = p.until.max(until);
            })
            .or_insert(Promotion { parts, until });
    }

    /// Applies an announcement from the channel (from any gateway, this one included).
    pub(crate) fn receive(&self, payload: &[u8], now: u64) {
        if let Some((key, parts, hold)) = parse(payload) {
            let hold = u64::try_from(hold.as_nanos()).unwrap_or(u64::MAX);
            self.promote(key, parts, now.saturating_add(hold));
        }
    }

    /// The keys split now, and into how many parts.
    pub(crate) fn promoted(&self, now: u64) -> Vec<(Key, u32)> {
        self.promoted
            .iter()
            .filter(|p| p.until > now)
            .map(|p| (p.key().clone(), p.parts))
            .collect()
    }
}

/// Check counts per key in the current one-second window, for at most [`TRACKED`] keys
/// (Metwally et al.'s space-saving: a newcomer takes the place of the least-counted key and
/// inherits its count, so a count can be high by at most the window's checks / `TRACKED`).
#[derive(Debug, Default)]
struct Tracker {
    window_start: u64,
    counts: HashMap<Key, u32, RandomState>,
}

impl Tracker {
    fn record(&mut self, key: &Key, now: u64) -> u32 {
        if now.saturating_sub(self.window_start) >= WINDOW_NANOS {
            self.counts.clear();
            self.window_start = now;
        }
        if let Some(count) = self.counts.get_mut(key) {
            *count = count.saturating_add(1);
            return *count;
        }
        let mut inherited = 0;
        if self.counts.len() >= TRACKED
            && let Some((least, count)) = self
                .counts
                .iter()
                .min_by_key(|(_, count)| **count)
                .map(|(k, c)| (k.clone(), *c))
        {
            self.counts.remove(&least);
            inherited = count;
        }
        self.counts.insert(key.clone(), inherited + 1);
        inherited + 1
    }
}

/// `scope (8, LE) | parts (4, LE) | hold ms (4, LE) | kind (1) | key bytes`.
fn announcement(key: &Key, parts: u32, hold: Duration) -> Vec<u8> {
    let mut out = Vec::with_capacity(17 + 32);
    out.extend_from_slice(&key.scope().to_le_bytes());
    out.extend_from_slice(&parts.to_le_bytes());
    out.extend_from_slice(
        &u32::try_from(hold.as_millis())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    match key.repr() {
        KeyRepr::Int(n) => {
            out.push(b'i');
            out.extend_from_slice(&n.to_le_bytes());
        }
        KeyRepr::Ip(ip) => {
            out.push(b'a');
            out.extend_from_slice(ip);
        }
        KeyRepr::Bytes(b) => {
            out.push(b's');
            out.extend_from_slice(b);
        }
        KeyRepr::Digest(d) => {
            out.push(b'h');
            out.extend_from_slice(d);
        }
    }
    out
}

/// The inverse of [`announcement`]; `None` for anything malformed (the channel is shared
/// with whoever can publish on it: never trust it further than a split).
fn parse(payload: &[u8]) -> Option<(Key, u32, Duration)> {
    let scope = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
    let parts = u32::from_le_bytes(payload.get(8..12)?.try_into().ok()?);
    let hold_ms = u32::from_le_bytes(payload.get(12..16)?.try_into().ok()?);
    let (&kind, value) = payload.get(16..)?.split_first()?;
    let repr = match kind {
        b'i' => KeyRepr::Int(u64::from_le_bytes(value.try_into().ok()?)),
        b'a' => KeyRepr::Ip(value.try_into().ok()?),
        b's' if value.len() <= rl_core::MAX_KEY_LEN => KeyRepr::Bytes(value),
        b'h' => KeyRepr::Digest(value.try_into().ok()?),
        _ => return None,
    };
    if !(2..=MAX_PARTS).contains(&parts) {
        return None;
    }
    Some((
        Key::from_repr(repr).scoped(scope),
        parts,
        Duration::from_millis(u64::from(hold_ms)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_round_trip_and_garbage_is_ignored() {
        let hold = Duration::from_secs(5);
        for key in [
            Key::from(7_u64),
            Key::from(std::net::IpAddr::from([10, 0, 0, 1])).scoped(9),
            Key::from("tenant-1"),
            Key::hashed("secret"),
        ] {
            let parsed = parse(&announcement(&key, 16, hold)).expect("parsed");
            assert_eq!(parsed, (key, 16, hold));
        }
        let good = announcement(&Key::from(1_u64), 16, hold);
        for bad in [&good[..10], &good[..17], b"nonsense".as_slice()] {
            assert!(parse(bad).is_none());
        }
        assert!(parse(&announcement(&Key::from(1_u64), 65, hold)).is_none());
        assert!(parse(&announcement(&Key::from(1_u64), 1, hold)).is_none());
    }

    #[test]
    fn a_key_over_the_threshold_is_promoted_renewed_and_then_demoted() {
        let hold = Duration::from_secs(10);
        let state =
            HotKeyState::new(HotKeys::adaptive(100, NonZeroU32::new(16).unwrap()).hold(hold));
        let (hot, cold) = (Key::from(1_u64), Key::from(2_u64));
        let mut announced = 0;
        for i in 0..150_u64 {
            announced += usize::from(state.record(&hot, i).is_some());
            let expected = if i < 100 { 1 } else { 16 };
            assert_eq!(state.parts(&hot, i), expected, "check {i}");
            if i % 10 == 0 {
                assert!(state.record(&cold, i).is_none(), "15 checks: not hot");
            }
            assert_eq!(state.parts(&cold, i), 1);
        }
        assert_eq!(announced, 1, "one announcement, not one per check");
        // Busy again after half the hold: renewed, announced again.
        let later = 6 * WINDOW_NANOS;
        let renewals = (0..101)
            .filter(|i| state.record(&hot, later + i).is_some())
            .count();
        assert_eq!(renewals, 1);
        // Quiet afterwards: the split holds for `hold`, then the key has one counter again.
        assert_eq!(state.parts(&hot, later + 9 * WINDOW_NANOS), 16);
        let after_hold = later + 101 + 10 * WINDOW_NANOS;
        assert_eq!(state.parts(&hot, after_hold), 1);
        assert!(state.record(&hot, after_hold).is_none());
        assert!(state.promoted(after_hold).is_empty());
    }

    #[test]
    fn the_tracker_keeps_its_bound_and_finds_a_heavy_key_among_many() {
        let mut tracker = Tracker::default();
        let mut heavy = 0;
        for i in 0..100_000_u64 {
            if i % 10 == 0 {
                heavy = tracker.record(&Key::from(u64::MAX), 5);
            } else {
                tracker.record(&Key::from(i), 5);
            }
            assert!(tracker.counts.len() <= TRACKED);
        }
        // 10,000 checks of the heavy key, overestimated by at most 100,000 / 128.
        assert!(
            (10_000..=10_000 + 100_000 / 128 + 1).contains(&heavy),
            "{heavy}"
        );
    }

    #[test]
    fn received_announcements_split_the_key_here_too() {
        let state = HotKeyState::new(HotKeys::adaptive(1_000_000, NonZeroU32::new(4).unwrap()));
        let key = Key::from("tenant");
        state.receive(&announcement(&key, 8, Duration::from_secs(1)), 0);
        assert_eq!(state.parts(&key, 1), 8);
        assert_eq!(state.parts(&key, 1_000_000_001), 1);
    }
}
