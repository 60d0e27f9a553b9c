//! The two buckets a gateway keeps per key: one that may owe (eventual), and one that holds
//! only its share (escrow). Both count in micro-units (a unit is [`MICRO`]) and refill from
//! the gateway's own clock, so only the rate of a clock matters, never its offset.

use std::time::Duration;

use ratewarden_core::{Decision, Info, Quota};

/// Micro-units per unit.
pub(crate) const MICRO: u64 = 1_000_000;

/// Shares are counted in parts of [`WHOLE`] (parts per million of the quota).
pub(crate) const WHOLE: u64 = 1_000_000;

/// Refills `rate × dt / period` exactly over many calls: the fraction left over is kept.
#[derive(Clone, Copy, Debug, Default)]
struct Refill {
    at: u64,
    rest: u128,
}

impl Refill {
    /// Micro-units earned since the last call at `per_period` micro-units per period.
    fn earned(&mut self, now: u64, per_period: u128, period: u64) -> u128 {
        let dt = now.saturating_sub(self.at);
        self.at = self.at.max(now);
        let total = per_period * u128::from(dt) + self.rest;
        let period = u128::from(period.max(1));
        self.rest = total % period;
        total / period
    }
}

/// The whole quota's bucket, charged with this gateway's admissions at once and with its
/// peers' as they are heard of, so it may owe (go below zero) but never forgets a unit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OwingBucket {
    /// Micro-units; below zero while peers' units are owed.
    tokens: i128,
    refill: Refill,
}

impl OwingBucket {
    pub(crate) fn full(quota: &Quota, now: u64) -> Self {
        Self {
            tokens: i128::from(quota.burst()) * i128::from(MICRO),
            refill: Refill { at: now, rest: 0 },
        }
    }

    fn refill(&mut self, quota: &Quota, now: u64) {
        let per_period = u128::from(quota.count()) * u128::from(MICRO);
        let earned = self.refill.earned(now, per_period, quota.period_micros());
        let cap = i128::from(quota.burst()) * i128::from(MICRO);
        let earned = i128::try_from(earned).unwrap_or(i128::MAX);
        self.tokens = self.tokens.saturating_add(earned).min(cap);
    }

    /// Charges what peers admitted (heard of now).
    pub(crate) fn owe(&mut self, quota: &Quota, now: u64, units: u64) {
        self.refill(quota, now);
        self.tokens -= i128::from(units) * i128::from(MICRO);
    }

    pub(crate) fn check(&mut self, quota: &Quota, now: u64, cost: u32) -> Decision {
        self.refill(quota, now);
        let need = i128::from(cost) * i128::from(MICRO);
        let outcome = if cost > quota.burst() {
            Outcome::Never
        } else if self.tokens >= need {
            self.tokens -= need;
            Outcome::Allowed
        } else {
            Outcome::Denied(retry(
                need - self.tokens,
                u128::from(quota.count()) * u128::from(WHOLE),
                quota,
            ))
        };
        outcome.decision(self.tokens, quota)
    }
}

/// This gateway's share of the quota: `share / WHOLE` of the burst as capacity and of the
/// rate as refill. It never spends more than it holds; shares and tokens move between
/// gateways only by being given (taken from the giver before they are sent).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShareBucket {
    /// Parts of [`WHOLE`].
    share: u64,
    /// Micro-units, at most `most`.
    tokens: u64,
    /// The share's [`cap`], computed when the share changes (not on every check).
    most: u64,
    refill: Refill,
    /// Whether a share a hair short of whole units holds them (see [`cap`]).
    whole_units: bool,
}

impl ShareBucket {
    /// A full bucket of `share`, for a mesh of `members`.
    pub(crate) fn full(quota: &Quota, share: u64, now: u64, members: usize) -> Self {
        // Shares a hair short of whole units may hold them when the hairs of every member
        // together are less than one unit (see `cap`).
        let whole_units = (members as u128) * u128::from(quota.burst()) < u128::from(WHOLE);
        let most = cap(quota, share, whole_units);
        Self {
            share,
            tokens: most,
            most,
            refill: Refill { at: now, rest: 0 },
            whole_units,
        }
    }

    /// Sets the share, and the most its bucket holds.
    fn set_share(&mut self, quota: &Quota, share: u64) {
        self.share = share;
        self.most = cap(quota, share, self.whole_units);
    }

    pub(crate) const fn share(&self) -> u64 {
        self.share
    }

    fn refill(&mut self, quota: &Quota, now: u64) {
        let per_period = u128::from(quota.count()) * u128::from(self.share);
        let earned = self.refill.earned(now, per_period, quota.period_micros());
        let earned = u64::try_from(earned).unwrap_or(u64::MAX);
        self.tokens = self.tokens.saturating_add(earned).min(self.most);
    }

    pub(crate) fn check(&mut self, quota: &Quota, now: u64, cost: u32) -> Decision {
        self.refill(quota, now);
        let need = u64::from(cost) * MICRO;
        let outcome = if cost > quota.burst() {
            Outcome::Never
        } else if self.tokens >= need {
            self.tokens -= need;
            Outcome::Allowed
        } else {
            let per_period = u128::from(quota.count()) * u128::from(self.share);
            Outcome::Denied(retry(i128::from(need - self.tokens), per_period, quota))
        };
        outcome.decision(i128::from(self.tokens), quota)
    }

    /// Takes `part` of the share and the same fraction of the tokens, to give away.
    pub(crate) fn take(&mut self, quota: &Quota, now: u64, part: u64) -> (u64, u64) {
        self.refill(quota, now);
        let part = part.min(self.share);
        if part == 0 {
            return (0, 0);
        }
        let moved = u128::from(self.tokens) * u128::from(part) / u128::from(self.share);
        let moved = u64::try_from(moved).unwrap_or(self.tokens).min(self.tokens);
        self.set_share(quota, self.share - part);
        self.tokens = (self.tokens - moved).min(self.most);
        (part, moved)
    }

    /// Gives up `part` of the share, and the tokens above what the rest holds at most;
    /// returns what it could not give up (more than it holds).
    pub(crate) fn give_up(&mut self, quota: &Quota, now: u64, part: u64) -> u64 {
        self.refill(quota, now);
        let dropped = part.min(self.share);
        self.set_share(quota, self.share - dropped);
        self.tokens = self.tokens.min(self.most);
        part - dropped
    }

    /// Adds a share and its tokens given by a peer.
    pub(crate) fn add(&mut self, quota: &Quota, now: u64, part: u64, tokens: u64) {
        self.refill(quota, now);
        self.set_share(quota, self.share.saturating_add(part).min(WHOLE));
        self.tokens = self.tokens.saturating_add(tokens).min(self.most);
    }
}

/// The micro-units a share of `burst` holds at most: `burst × share`; with `whole_units`,
/// the most whole units `u` whose parts, `⌊u × WHOLE / burst⌋`, the share reaches, when that
/// is more. A part of `u` units rounded down to parts of a million (a twelfth of a burst of
/// 12: 83,333) then holds `u` units. Each share holds less than `burst` micro-units (one
/// part's worth) more than `burst × share`, so members whose number times the burst is below
/// a million hold no whole unit more, together, than the burst.
fn cap(quota: &Quota, share: u64, whole_units: bool) -> u64 {
    let exact = u64::from(quota.burst()).saturating_mul(share);
    if !whole_units {
        return exact;
    }
    // u ≤ (share + 1) × burst / WHOLE, strictly below: ⌈(share + 1) × burst / WHOLE⌉ − 1.
    let burst = u128::from(quota.burst());
    let units = ((u128::from(share) + 1) * burst).div_ceil(u128::from(WHOLE)) - 1;
    let whole = u64::try_from(units.min(burst) * u128::from(MICRO)).unwrap_or(u64::MAX);
    exact.max(whole)
}

/// How long `missing` micro-units take to refill at `per_period` parts of [`WHOLE`] of the
/// quota's count a period. A gateway without a share waits for one (about a gossip round):
/// a second stands for it.
fn retry(missing: i128, per_period: u128, quota: &Quota) -> Duration {
    let missing = u128::try_from(missing).unwrap_or(0);
    if per_period == 0 {
        return Duration::from_secs(1);
    }
    // per_period parts of WHOLE units = per_period micro-units (WHOLE == MICRO).
    let micros = (missing * u128::from(quota.period_micros())).div_ceil(per_period);
    Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX))
}

enum Outcome {
    Allowed,
    Denied(Duration),
    Never,
}

impl Outcome {
    fn decision(self, tokens: i128, quota: &Quota) -> Decision {
        let limit = u64::from(quota.burst());
        let left = u64::try_from(tokens.max(0) / i128::from(MICRO)).unwrap_or(0);
        let empty = limit.saturating_sub(left);
        let reset = Duration::from_micros(empty.saturating_mul(quota.emission_interval_micros()));
        let info = |wait| Info::new(limit, left, reset, wait);
        match self {
            Self::Allowed => Decision::Allowed(info(Duration::ZERO)),
            Self::Denied(wait) => Decision::Denied(info(wait)),
            Self::Never => Decision::InsufficientCapacity(info(Duration::ZERO)),
        }
    }
}
