//! [`RateTracker`]: how often each of the busiest keys was checked this second, in fixed
//! memory and with no lock shared by every check, for adaptive hot-key splitting.

use std::hash::BuildHasher as _;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use foldhash::fast::RandomState;
use ratewarden_core::{Key, Timestamp};

use crate::time::between;

/// Shards, each with a lock and a window of its own: checks of different keys rarely wait
/// for each other.
const SHARDS: usize = 16;

/// Keys followed per shard: a key with more than `1 / SLOTS` of its shard's checks (about
/// `1 / (SHARDS × SLOTS)` of all checks, keys spreading evenly over shards) is always among
/// them. Few enough that a shard is scanned as an array, not hashed.
const SLOTS: usize = 16;

/// The window checks are counted in.
const WINDOW: Duration = Duration::from_secs(1);

/// Check counts per key in the current one-second window, for at most 256 keys (16 shards of
/// 16), by Metwally et al.'s space-saving: a newcomer takes the place of its shard's
/// least-counted key and inherits its count as its error. A key's count minus its error is a
/// count it certainly had: only that is compared with a threshold, so that a flood of one-off
/// keys (each inheriting a large count) never promotes any, and a key with more than a
/// sixteenth of its shard's checks (about 1/256 of all) is never displaced by them.
///
/// Public only with the `test-util` feature, for the benchmark of its cost under a flood.
///
#[cfg_attr(feature = "test-util", doc = "```")]
#[cfg_attr(not(feature = "test-util"), doc = "```ignore")]
/// use ratewarden_core::{Key, Timestamp};
/// use ratewarden_redis::RateTracker;
///
/// let tracker = RateTracker::default();
/// let now = Timestamp::from_micros(1);
/// for _ in 0..9 {
///     tracker.record(&Key::from("hot"), now);
/// }
/// assert_eq!(tracker.record(&Key::from("hot"), now), 10);
/// ```
#[derive(Debug)]
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub struct RateTracker {
    hasher: RandomState,
    shards: [Mutex<Shard>; SHARDS],
}

#[derive(Debug, Default)]
struct Shard {
    window_start: Timestamp,
    /// The keys followed, each with its hash (compared first: a scan reads no key that
    /// differs), count and error; at most [`SLOTS`].
    slots: Vec<Slot>,
}

#[derive(Debug)]
struct Slot {
    hash: u64,
    key: Key,
    count: u64,
    error: u64,
}

impl Default for RateTracker {
    fn default() -> Self {
        Self {
            hasher: RandomState::default(),
            shards: std::array::from_fn(|_| Mutex::default()),
        }
    }
}

#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
impl RateTracker {
    /// Counts one check of `key` at `now`; returns how many checks of it this window it
    /// certainly had (this one included).
    ///
    #[cfg_attr(feature = "test-util", doc = "```")]
    #[cfg_attr(not(feature = "test-util"), doc = "```ignore")]
    /// # use ratewarden_core::{Key, Timestamp};
    /// let tracker = ratewarden_redis::RateTracker::default();
    /// assert_eq!(tracker.record(&Key::from(7u64), Timestamp::from_micros(1)), 1);
    /// ```
    pub fn record(&self, key: &Key, now: Timestamp) -> u64 {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shards[(hash >> 60) as usize % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        shard.record(hash, key, now)
    }
}

impl Shard {
    fn record(&mut self, hash: u64, key: &Key, now: Timestamp) -> u64 {
        if between(self.window_start, now) >= WINDOW {
            self.slots.clear();
            self.window_start = now;
        }
        // One pass: the key's slot, or the least-counted one.
        let (mut least, mut least_count) = (0, u64::MAX);
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot.hash == hash && slot.key == *key {
                slot.count += 1;
                return slot.count - slot.error;
            }
            if slot.count < least_count {
                (least, least_count) = (i, slot.count);
            }
        }
        let slot = Slot {
            hash,
            key: key.clone(),
            count: least_count.saturating_add(1),
            error: least_count,
        };
        if self.slots.len() < SLOTS {
            self.slots.push(Slot {
                count: 1,
                error: 0,
                ..slot
            });
        } else {
            self.slots[least] = slot;
        }
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tracker_keeps_its_bound_and_counts_a_heavy_key_among_many() {
        let tracker = RateTracker::default();
        let now = Timestamp::from_micros(5);
        let mut heavy = 0;
        for i in 0..100_000_u64 {
            if i % 10 == 0 {
                heavy = tracker.record(&Key::from(u64::MAX), now);
            } else {
                tracker.record(&Key::from(i), now);
            }
        }
        for shard in &tracker.shards {
            assert!(shard.lock().unwrap().slots.len() <= SLOTS);
        }
        // 10,000 checks of the heavy key; its certain count is at most that, and close.
        assert!((9_000..=10_000).contains(&heavy), "{heavy}");
        // A new window starts afresh.
        let later = now.saturating_add(WINDOW);
        assert_eq!(tracker.record(&Key::from(u64::MAX), later), 1);
    }

    #[test]
    fn a_flood_of_one_off_keys_from_two_threads_never_hides_a_key_at_a_64th_of_the_checks() {
        let tracker = RateTracker::default();
        let now = Timestamp::from_micros(5);
        let hot = Key::from("hot");
        let certain: Vec<u64> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..2_u64)
                .map(|thread| {
                    let (tracker, hot) = (&tracker, &hot);
                    scope.spawn(move || {
                        let mut certain = 0;
                        for i in 0..1_000_000_u64 {
                            if i % 64 == 0 {
                                certain = tracker.record(hot, now);
                            } else {
                                tracker.record(&Key::from(thread << 32 | i), now);
                            }
                        }
                        certain
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        // 2 × 15,625 checks of the hot key: its certain count ends close to that.
        let last = certain.into_iter().max().unwrap();
        assert!(
            last >= 30_000,
            "the hot key was counted {last} times of 31,250"
        );
    }
}
