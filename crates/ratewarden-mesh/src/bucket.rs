//! The two buckets a gateway keeps per key: one that may owe (eventual), and one that holds
//! only its share (escrow). Both count in micro-units (a unit is [`MICRO`]) and refill from
//! the gateway's own clock, so only the rate of a clock matters, never its offset.
//!
//! Both also keep the units reservations hold on them: a hold takes room, not tokens (the
//! tokens stay, refilling and capped as before), so a settle charges the actual units and
//! what was held beyond them is free again at once, never more than a charge of the actual
//! units at the time of the hold would have left.

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
    /// Micro-units held by reservations.
    held: u64,
    refill: Refill,
}

impl OwingBucket {
    pub(crate) fn full(quota: &Quota, now: u64) -> Self {
        Self {
            tokens: i128::from(quota.burst()) * i128::from(MICRO),
            held: 0,
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

    /// Decides `cost` units beside those held, and charges or holds them if admitted.
    pub(crate) fn admit(&mut self, quota: &Quota, now: u64, cost: u32, admit: Admit) -> Decision {
        self.refill(quota, now);
        let need = i128::from(cost) * i128::from(MICRO);
        let free = self.tokens - i128::from(self.held);
        let outcome = if cost > quota.burst() {
            Outcome::Never
        } else if free >= need {
            match admit {
                Admit::Charge => self.tokens -= need,
                Admit::Hold => self.held += u64::from(cost) * MICRO,
            }
            Outcome::Allowed
        } else {
            Outcome::Denied(retry(
                need - free,
                u128::from(quota.count()) * u128::from(WHOLE),
                quota,
            ))
        };
        outcome.decision(self.tokens - i128::from(self.held), quota)
    }

    /// Drops `units` held (a hold settled).
    pub(crate) fn release(&mut self, units: u64) {
        self.held = self.held.saturating_sub(units.saturating_mul(MICRO));
    }

    /// Drops every hold (they lapsed).
    pub(crate) const fn release_all(&mut self) {
        self.held = 0;
    }

    /// Gives back `units` charged (a refund), never beyond a full bucket.
    pub(crate) fn refund(&mut self, quota: &Quota, now: u64, units: u32) {
        self.refill(quota, now);
        let cap = i128::from(quota.burst()) * i128::from(MICRO);
        let back = i128::from(units) * i128::from(MICRO);
        self.tokens = self.tokens.saturating_add(back).min(cap).max(self.tokens);
    }
}

/// What a bucket does with the units it admits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Takes them (a check).
    Charge,
    /// Holds them (a reservation): they take room until released.
    Hold,
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
    /// Micro-units held by reservations: never given away with a share, so that a hold
    /// settled at or below its units finds them (at most `tokens`, save after a restart's
    /// settling takes a share back).
    held: u64,
    /// Micro-units settled that the tokens could not take: repaid first as they refill.
    owed: u64,
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
            held: 0,
            owed: 0,
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
        // What is owed is repaid from the tokens no hold needs.
        let repaid = self.owed.min(self.tokens.saturating_sub(self.held));
        self.tokens -= repaid;
        self.owed -= repaid;
    }

    /// Micro-units neither held nor owed.
    const fn free(&self) -> u64 {
        if self.owed > 0 {
            0
        } else {
            self.tokens.saturating_sub(self.held)
        }
    }

    /// Decides `cost` units beside those held and owed, and charges or holds them if
    /// admitted.
    pub(crate) fn admit(&mut self, quota: &Quota, now: u64, cost: u32, admit: Admit) -> Decision {
        self.refill(quota, now);
        let need = u64::from(cost) * MICRO;
        let free = self.free();
        let outcome = if cost > quota.burst() {
            Outcome::Never
        } else if free >= need {
            match admit {
                Admit::Charge => self.tokens -= need,
                Admit::Hold => self.held += need,
            }
            Outcome::Allowed
        } else {
            let per_period = u128::from(quota.count()) * u128::from(self.share);
            let missing = i128::from(need - free) + i128::from(self.owed);
            Outcome::Denied(retry(missing, per_period, quota))
        };
        outcome.decision(i128::from(self.free()), quota)
    }

    /// Drops `units` held (a hold settled).
    pub(crate) fn release(&mut self, units: u64) {
        self.held = self.held.saturating_sub(units.saturating_mul(MICRO));
    }

    /// Drops every hold (they lapsed).
    pub(crate) const fn release_all(&mut self) {
        self.held = 0;
    }

    /// Charges `units` settled: from the tokens, and what they cannot take is owed.
    pub(crate) fn charge(&mut self, quota: &Quota, now: u64, units: u32) {
        self.refill(quota, now);
        let need = u64::from(units) * MICRO;
        let paid = need.min(self.tokens);
        self.tokens -= paid;
        self.owed = self.owed.saturating_add(need - paid);
    }

    /// Gives back `units` charged (a refund): what is owed first, then tokens, never beyond
    /// a full bucket.
    pub(crate) fn refund(&mut self, quota: &Quota, now: u64, units: u32) {
        self.refill(quota, now);
        let back = u64::from(units) * MICRO;
        let forgiven = back.min(self.owed);
        self.owed -= forgiven;
        self.tokens = self.tokens.saturating_add(back - forgiven).min(self.most);
    }

    /// Takes `part` of the share and the same fraction of its free tokens, to give away.
    /// The share that holds what reservations hold stays, with their tokens: a part of the
    /// share `⌈held / burst⌉` is pinned, and only the rest, with the tokens above those held,
    /// is given from.
    pub(crate) fn take(&mut self, quota: &Quota, now: u64, part: u64) -> (u64, u64) {
        self.refill(quota, now);
        let pinned = self.held.div_ceil(u64::from(quota.burst()).max(1));
        let givable = self.share.saturating_sub(pinned);
        let part = part.min(givable);
        if part == 0 {
            return (0, 0);
        }
        let free = self.tokens.saturating_sub(self.held);
        let moved = u128::from(free) * u128::from(part) / u128::from(givable);
        let moved = u64::try_from(moved).unwrap_or(free).min(free);
        self.set_share(quota, self.share - part);
        // What is left holds at least the held tokens: the share kept is at least
        // `pinned`, whose capacity is at least `held`.
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
