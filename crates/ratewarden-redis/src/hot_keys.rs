//! Hot-key splitting: one key's quota spread over `n` sub-counters, each in its own cluster
//! slot, one chosen at random per check. Either for every key ([`HotKeys::split`]) or only
//! for keys a gateway sees above a rate ([`HotKeys::adaptive`]), the split recorded in Redis
//! itself, where every gateway reads it.

use std::num::NonZeroU32;
use std::time::Duration;

use ratewarden_core::{Algorithm, Key, Quota, Timestamp};

use crate::per_key::{Expiring, PerKey};
use crate::rate_tracker::RateTracker;
use crate::script::Counter;
use crate::time::between;

/// The most sub-counters a key is split into.
pub const MAX_PARTS: u32 = 64;

/// The most split keys a gateway keeps track of at once. Past it, a split key is still split
/// (Redis says so on every check of the key itself), at the cost of a second round trip per
/// check.
pub const MAX_SPLIT_KEYS: usize = 4_096;

/// The longest hold of an adaptive split: a split's end (now and its hold, in microseconds)
/// must stay within the integers Redis's scripts count exactly (below 2^53), and a day is far
/// past any split's use.
pub(crate) const MAX_HOLD: Duration = Duration::from_secs(86_400);

/// Whether and how a [`RedisStore`](crate::RedisStore) splits hot keys; see
/// [`RedisConfig::hot_keys`](crate::RedisConfig::hot_keys).
///
/// A key split in `n` parts is counted in `n` sub-counters, each with `1/n` of the quota's rate
/// exactly and `1/n` of its burst (or, for a window, of its count) rounded up, one picked at
/// random per check. Together they admit at most `n - 1` more than the quota at once, and
/// (GCRA, token bucket) never more over time: in any interval of length `t`, at most
/// `burst + ⌈rate × t⌉ + n - 1`. A split can deny a request while other parts still have room
/// (the part picked is spent): BENCHMARKS.md measures that loss. A denial covers the whole key
/// on the gateway that gave it: a client told to retry after `t` is not admitted before `t`.
/// A part admits at most its share of the burst at once: under a static split a heavier
/// check is refused as a cost no retry can meet; under an adaptive split it is denied until
/// the key is whole again (the split's end and a margin), since the whole quota would admit
/// it then.
///
/// Adaptive splits (GCRA and token bucket quotas only) keep the same bound across promotion,
/// renewal and demotion: a key's parts start spent (what was left of the key's burst is not
/// handed out again) and the key itself admits nothing from its promotion until a margin after
/// its split ends, and starts spent then. Both transitions cost under-admission, never over.
///
/// ```
/// use ratewarden_redis::HotKeys;
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
    /// Every key in `parts` sub-counters (at most 64, or
    /// [`RedisConfig::build`](crate::RedisConfig::build) refuses them): for a limit with one key for a whole
    /// fleet (a global or per-tenant limit) that one Redis node cannot carry. Every gateway
    /// sharing the limit must split it alike.
    ///
    /// ```
    /// let split = ratewarden_redis::HotKeys::split(std::num::NonZeroU32::new(4).unwrap());
    /// assert_eq!(split.parts(), 4);
    /// ```
    #[must_use]
    pub fn split(parts: NonZeroU32) -> Self {
        Self {
            mode: Mode::Split { parts: parts.get() },
        }
    }

    /// A key that this gateway checks more than `threshold` times in a second (counted
    /// exactly: an estimate that could be high never promotes) is split into `parts`
    /// sub-counters (at most 64) on every gateway: the split is written next to the key in
    /// Redis, and every gateway's next check of the key learns of it. It stays split while any
    /// gateway still sees it above the threshold (they renew it), and returns to one counter
    /// [`hold`](Self::hold) (default 30 s) after the last renewal: no flapping at the
    /// threshold. The threshold is per gateway: for a fleet-wide rate `R` over `g` gateways,
    /// use about `R / g`. Only keys under GCRA and token-bucket quotas are split (a window's
    /// count cannot be handed from one counter to others mid-window without over-admitting);
    /// rates are tracked in bounded memory (the 256 busiest keys of each second, in 16 shards), and a gateway
    /// tracks at most [`MAX_SPLIT_KEYS`] splits.
    ///
    /// While a key is split its own counter is spent until the split ends (its hold and a
    /// margin, the store's deadline, after the last renewal), so that it hands out nothing
    /// its parts do; the split's marker beside it tells gateways to use the parts. Two things
    /// follow. A state ahead of Redis's clock by no more than hold + margin is kept (it may
    /// be such a key), so a clock that steps back denies a key for at most its horizon plus
    /// hold + margin under adaptive splitting, against the horizon alone without it. And a
    /// marker that cannot be read (garbled, of another type, of 1 or more than 64 parts, or
    /// ending further away than a hold) counts as a corrupt state of its key: the key is spent
    /// for hold + margin and the marker deleted. Every gateway must use the same hold.
    ///
    /// A single check on a split key costs at most a part's share of the burst
    /// (`⌈burst / parts⌉`): a larger cost within the whole burst is denied until the split
    /// ends. From 2 to 64 parts, or [`RedisConfig::build`](crate::RedisConfig::build)
    /// refuses them ([`ConfigError::OutOfRange`](crate::ConfigError::OutOfRange)).
    ///
    /// ```
    /// let hot = ratewarden_redis::HotKeys::adaptive(1_000, std::num::NonZeroU32::new(16).unwrap());
    /// assert_eq!(hot.parts(), 16);
    /// ```
    #[must_use]
    pub fn adaptive(threshold: u32, parts: NonZeroU32) -> Self {
        Self {
            mode: Mode::Adaptive {
                threshold,
                parts: parts.get(),
                hold: Duration::from_secs(30),
            },
        }
    }

    /// How long an adaptive split outlives its last renewal (default 30 s), at most a day:
    /// [`RedisConfig::build`](crate::RedisConfig::build) refuses a longer one
    /// ([`ConfigError::DurationTooLong`](crate::ConfigError::DurationTooLong)). No effect on
    /// other modes.
    ///
    /// ```
    /// use std::time::Duration;
    /// let hot = ratewarden_redis::HotKeys::adaptive(500, std::num::NonZeroU32::new(8).unwrap())
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
    /// assert_eq!(ratewarden_redis::HotKeys::default().parts(), 1);
    /// ```
    #[must_use]
    pub const fn parts(&self) -> u32 {
        match self.mode {
            Mode::Off => 1,
            Mode::Split { parts } | Mode::Adaptive { parts, .. } => parts,
        }
    }

    /// The adaptive threshold (`None` for other modes).
    pub(crate) const fn threshold(&self) -> Option<u32> {
        match self.mode {
            Mode::Adaptive { threshold, .. } => Some(threshold),
            _ => None,
        }
    }

    /// How long an adaptive split outlives its last renewal (`None` for other modes).
    pub(crate) const fn hold_time(&self) -> Option<Duration> {
        match self.mode {
            Mode::Adaptive { hold, .. } => Some(hold),
            _ => None,
        }
    }

    /// Whether keys under `quota` are split adaptively (their checks read the split marker).
    pub(crate) const fn adapts(&self, quota: &Quota) -> bool {
        matches!(self.mode, Mode::Adaptive { .. })
            && matches!(quota.algorithm(), Algorithm::Gcra | Algorithm::TokenBucket)
    }
}

/// A split this gateway knows of, from Redis: until when it stands, and until when each part
/// is known to be spent (this gateway's clock).
#[derive(Clone, Debug)]
struct Known {
    quota: Quota,
    parts: u32,
    /// When Redis made the split (Redis's clock): its parts' names carry it.
    epoch: Timestamp,
    until: Timestamp,
    /// When this gateway first learnt of the split (its clock).
    learnt: Timestamp,
    /// How long a written part lives at least: the hold every gateway renews splits for, so
    /// that a part written by a gateway that knows an older end of the split (one that does
    /// not renew it) outlives that end while others renew.
    hold: Duration,
    spent_until: Box<[Timestamp]>,
}

impl Expiring for Known {
    fn quota(&self) -> &Quota {
        &self.quota
    }

    fn expires(&self) -> Timestamp {
        self.until
    }
}

/// This gateway's view of hot keys: which are split (at most [`MAX_SPLIT_KEYS`]), and
/// (adaptive) how often each is checked.
#[derive(Debug)]
pub(crate) struct HotKeyState {
    config: HotKeys,
    splits: PerKey<Known>,
    tracker: RateTracker,
}

/// Where a check goes: which counter, and for how long at least a written part must live.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Route {
    pub(crate) counter: Counter,
    pub(crate) keep_for: Duration,
}

impl HotKeyState {
    pub(crate) fn new(config: HotKeys) -> Self {
        Self {
            config,
            splits: PerKey::new(MAX_SPLIT_KEYS),
            tracker: RateTracker::default(),
        }
    }

    pub(crate) const fn config(&self) -> HotKeys {
        self.config
    }

    /// The counter a check of `key` under `quota` goes to at `now`: a random part of a static
    /// split, or of an adaptive split this gateway knows of; else the key's own.
    pub(crate) fn route(&self, key: &Key, quota: &Quota, now: Timestamp) -> Route {
        let whole = Route {
            counter: Counter::Whole,
            keep_for: Duration::ZERO,
        };
        match self.config.mode {
            Mode::Off => whole,
            Mode::Split { parts } => Route {
                counter: Counter::Part {
                    index: fastrand::u32(0..parts),
                    parts,
                    epoch: None,
                },
                keep_for: Duration::ZERO,
            },
            // Every part known to be spent: one of them all the same (the denied-key cache
            // answers until the first has room, unless it is off or full).
            Mode::Adaptive { .. } => self
                .with_known(key, quota, now, |known| {
                    known.pick(now, None).unwrap_or_else(|| known.any(now))
                })
                .unwrap_or(whole),
        }
    }

    /// Runs `f` on the split of `key` under `quota` this gateway knows of, if it stands.
    fn with_known<R>(
        &self,
        key: &Key,
        quota: &Quota,
        now: Timestamp,
        f: impl FnOnce(&mut Known) -> R,
    ) -> Option<R> {
        self.splits
            .update(key, quota, |known| (known.until > now).then(|| f(known)))
            .flatten()
    }

    /// Whether this gateway learnt of the split of `key` under `quota` at least `ago` before
    /// `now` (its parts' seeds have had their time), or does not track it.
    pub(crate) fn learnt_before(
        &self,
        key: &Key,
        quota: &Quota,
        now: Timestamp,
        ago: Duration,
    ) -> bool {
        // A split not tracked here (past `MAX_SPLIT_KEYS`) has no record of when: its seed
        // is taken to have had its time.
        self.with_known(key, quota, now, |known| between(known.learnt, now) >= ago)
            .unwrap_or(true)
    }

    /// Until when the split of `key` under `quota` this gateway knows of stands.
    pub(crate) fn known_until(
        &self,
        key: &Key,
        quota: &Quota,
        now: Timestamp,
    ) -> Option<Timestamp> {
        self.with_known(key, quota, now, |known| known.until)
    }

    /// Part `index` of `key`'s split denied at `now`, with room again at `room_at`: another
    /// part not known to be spent, to ask instead (`None`: all are spent, see
    /// [`room_at`](Self::room_at)).
    pub(crate) fn spent(
        &self,
        key: &Key,
        quota: &Quota,
        (index, room_at): (u32, Timestamp),
        now: Timestamp,
    ) -> Option<Route> {
        self.with_known(key, quota, now, |known| {
            if let Some(spent) = known.spent_until.get_mut(index as usize) {
                *spent = (*spent).max(room_at);
            }
            known.pick(now, Some(index))
        })
        .flatten()
    }

    /// When the first part of `key`'s split may have room again (this gateway's clock).
    pub(crate) fn room_at(&self, key: &Key, quota: &Quota, now: Timestamp) -> Option<Timestamp> {
        self.with_known(key, quota, now, |known| {
            known.spent_until.iter().copied().min().unwrap_or(now)
        })
    }

    /// Counts a check of `key` (adaptive mode); whether this gateway should split the key (or
    /// renew its split) now: its exact count this second is over the threshold, and no split
    /// it knows of lasts more than half the hold.
    pub(crate) fn wants_split(&self, key: &Key, quota: &Quota, now: Timestamp) -> Option<SplitAsk> {
        let Mode::Adaptive {
            threshold,
            parts,
            hold,
        } = self.config.mode
        else {
            return None;
        };
        if !self.config.adapts(quota) {
            return None;
        }
        let guaranteed = self.tracker.record(key, now);
        if guaranteed <= u64::from(threshold) {
            return None;
        }
        let lasting = self
            .known_until(key, quota, now)
            .is_some_and(|until| between(now, until) >= hold / 2);
        (!lasting).then_some(SplitAsk { parts, hold })
    }

    /// Records a split Redis reported in answer to a call sent at `sent` (this gateway's clock):
    /// it stands for `remaining` from when Redis answered, so certainly until `sent +
    /// remaining` here. Past [`MAX_SPLIT_KEYS`], not recorded (the key is then split all the
    /// same, learnt anew on each check). Returns whether the split (its epoch) is new here and
    /// recorded: its parts are then seeded, once.
    pub(crate) fn learn(
        &self,
        key: &Key,
        quota: Quota,
        split: (u32, Timestamp),
        remaining: Duration,
        sent: Timestamp,
    ) -> bool {
        let (parts, epoch) = split;
        let until = sent.saturating_add(remaining);
        let renewed = self.splits.update(key, &quota, |known| {
            // The same split, renewed: the parts known to be spent stay so.
            let same = known.epoch == epoch;
            if same {
                known.until = known.until.max(until);
            }
            same
        });
        if renewed == Some(true) {
            return false;
        }
        let parts = parts.clamp(2, MAX_PARTS);
        let known = Known {
            quota,
            parts,
            epoch,
            until,
            learnt: sent,
            hold: self.config.hold_time().unwrap_or_default(),
            spent_until: vec![Timestamp::default(); parts as usize].into_boxed_slice(),
        };
        // New only if remembered: a full map (MAX_SPLIT_KEYS live splits) declines it, and
        // saying "new" then would seed every part again at each check of the hottest keys.
        self.splits.insert(key, known, sent)
    }

    /// Forgets `key`'s splits (after a reset).
    pub(crate) fn forget(&self, key: &Key) -> Vec<(Quota, u32, Timestamp)> {
        self.splits
            .remove(key)
            .iter()
            .map(|k| (k.quota, k.parts, k.epoch))
            .collect()
    }

    /// The keys split now, and into how many parts.
    pub(crate) fn split_keys(&self, now: Timestamp) -> Vec<(Key, u32)> {
        self.splits.collect(|key, known| {
            let parts = known
                .iter()
                .filter(|k| k.until > now)
                .map(|k| k.parts)
                .max()?;
            Some((key.clone(), parts))
        })
    }

    /// How many keys this gateway tracks as split (expired ones included until swept).
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.splits.len()
    }
}

impl Known {
    /// A random part.
    fn any(&self, now: Timestamp) -> Route {
        self.route(fastrand::u32(0..self.parts), now)
    }

    fn route(&self, index: u32, now: Timestamp) -> Route {
        Route {
            counter: Counter::Part {
                index,
                parts: self.parts,
                epoch: Some(self.epoch),
            },
            keep_for: between(now, self.until).max(self.hold),
        }
    }

    /// A random part not known to be spent at `now` (other than `not`), if any.
    fn pick(&self, now: Timestamp, not: Option<u32>) -> Option<Route> {
        let open = |index: &u32| {
            Some(*index) != not
                && self
                    .spent_until
                    .get(*index as usize)
                    .is_some_and(|&t| t <= now)
        };
        let count = (0..self.parts).filter(open).count();
        let nth = fastrand::usize(..count.max(1));
        let index = (0..self.parts).filter(open).nth(nth)?;
        Some(self.route(index, now))
    }
}

/// What a split call asks of Redis.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SplitAsk {
    pub(crate) parts: u32,
    pub(crate) hold: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` nanoseconds after the epoch.
    const fn at(n: u64) -> Timestamp {
        Timestamp::from_nanos(n)
    }

    /// The tracker's window (a second) in nanoseconds.
    const WINDOW_NANOS: u64 = 1_000_000_000;

    fn adaptive(threshold: u32) -> HotKeyState {
        HotKeyState::new(
            HotKeys::adaptive(threshold, NonZeroU32::new(8).unwrap()).hold(Duration::from_secs(10)),
        )
    }

    #[test]
    fn a_key_over_the_threshold_asks_for_a_split_once_then_renews_at_half_the_hold() {
        let state = adaptive(100);
        let quota = Quota::per_second(1_000).unwrap();
        let (hot, cold) = (Key::from(1_u64), Key::from(2_u64));
        let asks = (0..150_u64)
            .filter(|&i| state.wants_split(&hot, &quota, at(i)).is_some())
            .count();
        // From the 101st check on; the gateway learns of the split from Redis's answer.
        assert_eq!(asks, 50);
        state.learn(&hot, quota, (8, at(42)), Duration::from_secs(10), at(150));
        assert!(
            state.wants_split(&hot, &quota, at(151)).is_none(),
            "it lasts"
        );
        assert!(matches!(
            state.route(&hot, &quota, at(152)).counter,
            Counter::Part {
                parts: 8,
                epoch: Some(epoch),
                ..
            } if epoch == at(42)
        ));
        for i in 0..15 {
            assert!(state.wants_split(&cold, &quota, at(200 + i)).is_none());
        }
        assert!(matches!(
            state.route(&cold, &quota, at(300)).counter,
            Counter::Whole
        ));
        // Past half the hold, still hot: renew.
        let later = 150 + 6 * WINDOW_NANOS;
        let renewals = (0..101)
            .filter(|i| state.wants_split(&hot, &quota, at(later + i)).is_some())
            .count();
        assert_eq!(renewals, 1);
        // Past the hold, the split is over here.
        let after = 150 + 10 * WINDOW_NANOS;
        assert!(matches!(
            state.route(&hot, &quota, at(after)).counter,
            Counter::Whole
        ));
        assert!(state.split_keys(at(after)).is_empty());
        // Windows are never split adaptively.
        let window = Quota::per_second(1_000)
            .unwrap()
            .with_algorithm(Algorithm::FixedWindow)
            .unwrap();
        assert!((0..500).all(|i| state.wants_split(&hot, &window, at(after + i)).is_none()));
    }

    #[test]
    fn a_flood_of_one_off_keys_promotes_none() {
        // Reproduced: the tracker compared counts that included their inherited error, so at
        // 200× the threshold 14,400 of 40,000 one-off keys were promoted.
        let state = adaptive(200);
        let quota = Quota::per_second(1_000).unwrap();
        let mut asks = 0;
        // 200,000 one-off keys within a second: 200 times the threshold, and more.
        for i in 0..200_000_u64 {
            asks += usize::from(
                state
                    .wants_split(&Key::from(i), &quota, at(i * 4_000))
                    .is_some(),
            );
        }
        assert_eq!(asks, 0);
        assert_eq!(state.tracked(), 0);
    }

    #[test]
    fn splits_tracked_are_bounded_and_expire() {
        let state = adaptive(1);
        let quota = Quota::per_second(1_000).unwrap();
        for i in 0..(MAX_SPLIT_KEYS as u64 + 100) {
            let new = state.learn(
                &Key::from(i),
                quota,
                (8, at(1)),
                Duration::from_secs(1),
                at(1_000),
            );
            // Past the bound a split is not remembered, so never "new": its parts are not
            // seeded again at each check.
            assert_eq!(new, i < MAX_SPLIT_KEYS as u64, "split {i}");
        }
        assert_eq!(state.tracked(), MAX_SPLIT_KEYS);
        // Once they have expired, new ones take their place.
        let later = 1_000 + 2 * WINDOW_NANOS;
        state.learn(
            &Key::from(u64::MAX),
            quota,
            (8, at(1)),
            Duration::from_secs(1),
            at(later),
        );
        assert_eq!(state.tracked(), 1);
        assert_eq!(
            state.split_keys(at(later + 1)),
            vec![(Key::from(u64::MAX), 8)]
        );
    }
}
