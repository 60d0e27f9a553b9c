//! The two buckets a gateway keeps per key: one that may owe (eventual), and one that holds
//! only its share (escrow). Both count in micro-units (a unit is [`MICRO`]). For GCRA and
//! the token bucket they refill from the gateway's own clock, so only the rate of a clock
//! matters, never its offset; for the window algorithms they count in windows aligned to
//! the clock's epoch ([`Spent`]), so gateways' windows line up as far as their clocks do.
//!
//! Both also keep the units reservations hold on them: a hold takes room, not tokens (the
//! tokens stay, refilling and capped as before), so a settle charges the actual units and
//! what was held beyond them is free again at once, never more than a charge of the actual
//! units at the time of the hold would have left.

use std::time::Duration;

use ratewarden_core::{Algorithm, Decision, Info, Quota};

use crate::window::Spent;

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
    level: Level,
    /// Micro-units held by reservations.
    held: u64,
}

/// What a whole quota's bucket has left.
#[derive(Clone, Copy, Debug)]
enum Level {
    /// GCRA and the token bucket: micro-units, refilled steadily; below zero while peers'
    /// units are owed.
    Tokens { tokens: i128, refill: Refill },
    /// The window algorithms: what the windows count, out of the quota's count.
    Spent(Spent),
}

/// Whether `quota` counts in windows (fixed window, sliding window counter) rather than
/// refilling steadily.
pub(crate) fn in_windows(quota: &Quota) -> bool {
    matches!(
        quota.algorithm(),
        Algorithm::FixedWindow | Algorithm::SlidingWindow
    )
}

impl OwingBucket {
    pub(crate) fn full(quota: &Quota, now: u64) -> Self {
        let level = if in_windows(quota) {
            Level::Spent(Spent::new(quota, now))
        } else {
            Level::Tokens {
                tokens: i128::from(quota.burst()) * i128::from(MICRO),
                refill: Refill { at: now, rest: 0 },
            }
        };
        Self { level, held: 0 }
    }

    /// Micro-units left at `now`, those held among them (below zero while owed).
    fn left(&mut self, quota: &Quota, now: u64) -> i128 {
        let cap = i128::from(quota.burst()) * i128::from(MICRO);
        match &mut self.level {
            Level::Tokens { tokens, refill } => {
                let per_period = u128::from(quota.count()) * u128::from(MICRO);
                let earned = refill.earned(now, per_period, quota.period_micros());
                let earned = i128::try_from(earned).unwrap_or(i128::MAX);
                *tokens = tokens.saturating_add(earned).min(cap);
                *tokens
            }
            Level::Spent(spent) => {
                spent.roll(quota, now);
                cap - i128::from(spent.counted(quota, now))
            }
        }
    }

    /// Whether the bucket is full at `now` (the windows count nothing), nothing held.
    pub(crate) fn at_rest(&mut self, quota: &Quota, now: u64) -> bool {
        self.held == 0 && self.left(quota, now) == i128::from(quota.burst()) * i128::from(MICRO)
    }

    /// Takes `micros` (a charge, or what peers admitted).
    fn spend(&mut self, micros: u64) {
        match &mut self.level {
            Level::Tokens { tokens, .. } => *tokens -= i128::from(micros),
            Level::Spent(spent) => spent.add(micros),
        }
    }

    /// Charges what peers admitted (heard of now).
    pub(crate) fn owe(&mut self, quota: &Quota, now: u64, units: u64) {
        self.left(quota, now);
        self.spend(units.saturating_mul(MICRO));
    }

    /// Decides `cost` units beside those held, and charges or holds them if admitted.
    pub(crate) fn admit(&mut self, quota: &Quota, now: u64, cost: u32, admit: Admit) -> Decision {
        let free = self.left(quota, now) - i128::from(self.held);
        let need = u64::from(cost) * MICRO;
        let outcome = if cost > quota.burst() {
            Outcome::Never
        } else if free >= i128::from(need) {
            match admit {
                Admit::Charge => self.spend(need),
                Admit::Hold => self.held += need,
            }
            Outcome::Allowed
        } else {
            Outcome::Denied(match &self.level {
                Level::Tokens { .. } => retry(
                    i128::from(need) - free,
                    u128::from(quota.count()) * u128::from(WHOLE),
                    quota,
                ),
                Level::Spent(spent) => {
                    let room = u64::from(quota.burst()) * MICRO;
                    spent
                        .wait(quota, now, room.saturating_sub(self.held), need)
                        .unwrap_or(SHARE_WAIT)
                }
            })
        };
        // What is free now: less what was just charged or held (not reckoned again).
        let free = match outcome {
            Outcome::Allowed => free - i128::from(need),
            _ => free,
        };
        outcome.decision(free, self.reset(quota, now), quota)
    }

    /// How long until the bucket is full again.
    fn reset(&self, quota: &Quota, now: u64) -> Duration {
        match &self.level {
            Level::Tokens { tokens, .. } => {
                let left = tokens.max(&0) / i128::from(MICRO);
                tokens_reset(u64::try_from(left).unwrap_or(0), quota)
            }
            Level::Spent(spent) => spent.reset(quota, now),
        }
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
        self.left(quota, now);
        let back = u64::from(units) * MICRO;
        match &mut self.level {
            Level::Tokens { tokens, .. } => {
                let cap = i128::from(quota.burst()) * i128::from(MICRO);
                *tokens = tokens
                    .saturating_add(i128::from(back))
                    .min(cap)
                    .max(*tokens);
            }
            Level::Spent(spent) => spent.take_back(back),
        }
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
/// rate as refill (of the count a window, for the window algorithms). It never spends more
/// than it holds; shares and tokens move between gateways only by being given (taken from
/// the giver before they are sent).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShareBucket {
    /// Parts of [`WHOLE`].
    share: u64,
    /// The share's [`cap`] in micro-units, computed when the share changes (not on every
    /// check).
    most: u64,
    /// Whether a share a hair short of whole units holds them (see [`cap`]).
    whole_units: bool,
    /// Micro-units held by reservations: never given away with a share, so that a hold
    /// settled at or below its units finds them (save after a restart's settling takes a
    /// share back).
    held: u64,
    fill: Fill,
}

/// What a share's bucket has spent, and how it comes back.
#[derive(Clone, Copy, Debug)]
enum Fill {
    /// GCRA and the token bucket: tokens refilled steadily at the share of the rate.
    Tokens {
        /// Micro-units, at most `most`.
        tokens: u64,
        refill: Refill,
        /// Micro-units settled that the tokens could not take: repaid first as they
        /// refill.
        owed: u64,
    },
    /// The window algorithms: what the windows count, out of `most`. A share is given
    /// only out of what they do not count, and no tokens go with it: the window's count
    /// stays with the gateway that spent it.
    Spent(Spent),
}

impl ShareBucket {
    /// A full bucket of `share`, for a mesh of `members`.
    pub(crate) fn full(quota: &Quota, share: u64, now: u64, members: usize) -> Self {
        // Shares a hair short of whole units may hold them when the hairs of every member
        // together are less than one unit (see `cap`).
        let whole_units = (members as u128) * u128::from(quota.burst()) < u128::from(WHOLE);
        let most = cap(quota, share, whole_units);
        let fill = if in_windows(quota) {
            Fill::Spent(Spent::new(quota, now))
        } else {
            Fill::Tokens {
                tokens: most,
                refill: Refill { at: now, rest: 0 },
                owed: 0,
            }
        };
        Self {
            share,
            most,
            whole_units,
            held: 0,
            fill,
        }
    }

    /// Sets the share, and the most its bucket holds.
    fn set_share(&mut self, quota: &Quota, share: u64) {
        self.share = share;
        self.most = cap(quota, share, self.whole_units);
        if let Fill::Tokens { tokens, .. } = &mut self.fill {
            *tokens = (*tokens).min(self.most);
        }
    }

    pub(crate) const fn share(&self) -> u64 {
        self.share
    }

    /// Brings the bucket to `now`: tokens refilled (what is owed repaid from those no hold
    /// needs), or windows rolled.
    fn refill(&mut self, quota: &Quota, now: u64) {
        match &mut self.fill {
            Fill::Tokens {
                tokens,
                refill,
                owed,
            } => {
                let per_period = u128::from(quota.count()) * u128::from(self.share);
                let earned = refill.earned(now, per_period, quota.period_micros());
                let earned = u64::try_from(earned).unwrap_or(u64::MAX);
                *tokens = tokens.saturating_add(earned).min(self.most);
                let repaid = (*owed).min(tokens.saturating_sub(self.held));
                *tokens -= repaid;
                *owed -= repaid;
            }
            Fill::Spent(spent) => spent.roll(quota, now),
        }
    }

    /// Micro-units neither held nor owed (nor counted), at `now` (refilled to it).
    fn free(&self, quota: &Quota, now: u64) -> u64 {
        match &self.fill {
            Fill::Tokens { owed, .. } if *owed > 0 => 0,
            Fill::Tokens { tokens, .. } => tokens.saturating_sub(self.held),
            Fill::Spent(spent) => self
                .most
                .saturating_sub(self.held)
                .saturating_sub(spent.counted(quota, now)),
        }
    }

    /// Takes `micros` admitted or settled: from the tokens no hold needs, and what they
    /// cannot take is owed (so an overdraft never takes the tokens behind another hold).
    fn spend(&mut self, micros: u64) {
        match &mut self.fill {
            Fill::Tokens { tokens, owed, .. } => {
                let paid = micros.min(tokens.saturating_sub(self.held));
                *tokens -= paid;
                *owed = owed.saturating_add(micros - paid);
            }
            Fill::Spent(spent) => spent.add(micros),
        }
    }

    /// Decides `cost` units beside those held and owed, and charges or holds them if
    /// admitted.
    pub(crate) fn admit(&mut self, quota: &Quota, now: u64, cost: u32, admit: Admit) -> Decision {
        self.refill(quota, now);
        let need = u64::from(cost) * MICRO;
        let free = self.free(quota, now);
        let outcome = if cost > quota.burst() {
            Outcome::Never
        } else if free >= need {
            match admit {
                Admit::Charge => self.spend(need),
                Admit::Hold => self.held += need,
            }
            Outcome::Allowed
        } else {
            Outcome::Denied(match &self.fill {
                Fill::Tokens { owed, .. } => {
                    let per_period = u128::from(quota.count()) * u128::from(self.share);
                    let missing = i128::from(need - free) + i128::from(*owed);
                    retry(missing, per_period, quota)
                }
                Fill::Spent(spent) => spent
                    .wait(quota, now, self.most.saturating_sub(self.held), need)
                    .unwrap_or(SHARE_WAIT),
            })
        };
        // What is free now: less what was just charged or held (not reckoned again).
        let free = i128::from(match outcome {
            Outcome::Allowed => free - need,
            _ => free,
        });
        let reset = match &self.fill {
            Fill::Tokens { tokens, .. } => tokens_reset(tokens / MICRO, quota),
            Fill::Spent(spent) => spent.reset(quota, now),
        };
        outcome.decision(free, reset, quota)
    }

    /// Drops `units` held (a hold settled).
    pub(crate) fn release(&mut self, units: u64) {
        self.held = self.held.saturating_sub(units.saturating_mul(MICRO));
    }

    /// Drops every hold (they lapsed).
    pub(crate) const fn release_all(&mut self) {
        self.held = 0;
    }

    /// Whether the bucket is full at `now` (the windows count nothing), nothing held or
    /// owed.
    pub(crate) fn at_rest(&mut self, quota: &Quota, now: u64) -> bool {
        self.refill(quota, now);
        self.held == 0
            && match &self.fill {
                Fill::Tokens { tokens, owed, .. } => *owed == 0 && *tokens == self.most,
                Fill::Spent(spent) => spent.reset(quota, now).is_zero(),
            }
    }

    /// Charges `units` settled: from the tokens, and what they cannot take is owed (or
    /// counted in the window, beyond the share if it must be).
    pub(crate) fn charge(&mut self, quota: &Quota, now: u64, units: u32) {
        self.refill(quota, now);
        self.spend(u64::from(units) * MICRO);
    }

    /// Gives back `units` charged (a refund): what is owed first, then tokens, never beyond
    /// a full bucket.
    pub(crate) fn refund(&mut self, quota: &Quota, now: u64, units: u32) {
        self.refill(quota, now);
        let back = u64::from(units) * MICRO;
        match &mut self.fill {
            Fill::Tokens { tokens, owed, .. } => {
                let forgiven = back.min(*owed);
                *owed -= forgiven;
                *tokens = tokens.saturating_add(back - forgiven).min(self.most);
            }
            Fill::Spent(spent) => spent.take_back(back),
        }
    }

    /// Takes `part` of the share, to give away, and the same fraction of its free tokens.
    /// The share that holds what reservations hold stays, with their tokens: a part of the
    /// share `⌈held / burst⌉` is pinned (for the window algorithms, `⌈(held + counted) /
    /// count⌉`: a share is given only out of what the windows do not count, and no tokens
    /// go with it), and only the rest is given from.
    pub(crate) fn take(&mut self, quota: &Quota, now: u64, part: u64) -> (u64, u64) {
        self.refill(quota, now);
        let kept = match &self.fill {
            Fill::Tokens { .. } => self.held,
            Fill::Spent(spent) => self.held.saturating_add(spent.counted(quota, now)),
        };
        let pinned = kept.div_ceil(u64::from(quota.burst()).max(1));
        let givable = self.share.saturating_sub(pinned);
        let part = part.min(givable);
        if part == 0 {
            return (0, 0);
        }
        let moved = match &self.fill {
            Fill::Tokens { tokens, .. } => {
                let free = tokens.saturating_sub(self.held);
                let moved = u128::from(free) * u128::from(part) / u128::from(givable);
                u64::try_from(moved).unwrap_or(free).min(free)
            }
            Fill::Spent(_) => 0,
        };
        if let Fill::Tokens { tokens, .. } = &mut self.fill {
            *tokens -= moved;
        }
        // What is left holds at least what is kept: the share kept is at least `pinned`,
        // whose capacity is at least `kept`.
        self.set_share(quota, self.share - part);
        (part, moved)
    }

    /// Gives up `part` of the share, and the tokens above what the rest holds at most (the
    /// windows go on counting what was spent, beyond the share if they must); returns what
    /// it could not give up (more than it holds).
    pub(crate) fn give_up(&mut self, quota: &Quota, now: u64, part: u64) -> u64 {
        self.refill(quota, now);
        let dropped = part.min(self.share);
        self.set_share(quota, self.share - dropped);
        part - dropped
    }

    /// Takes back `part` of the share given to a peer's run before its restart, with nothing
    /// to spend: no tokens, and for the window algorithms counted as spent in the current
    /// window (that run may have spent it there).
    pub(crate) fn take_back(&mut self, quota: &Quota, now: u64, part: u64) {
        self.add(quota, now, part, 0);
        if let Fill::Spent(spent) = &mut self.fill {
            spent.add(u64::from(quota.burst()).saturating_mul(part));
        }
    }

    /// Adds a share and its tokens given by a peer.
    pub(crate) fn add(&mut self, quota: &Quota, now: u64, part: u64, more: u64) {
        self.refill(quota, now);
        self.set_share(quota, self.share.saturating_add(part).min(WHOLE));
        if let Fill::Tokens { tokens, .. } = &mut self.fill {
            *tokens = tokens.saturating_add(more).min(self.most);
        }
    }
}

/// How long a gateway waits for a share (about a gossip round): a second stands for it.
const SHARE_WAIT: Duration = Duration::from_secs(1);

/// How long a bucket with `left` whole units takes to fill.
fn tokens_reset(left: u64, quota: &Quota) -> Duration {
    let empty = u64::from(quota.burst()).saturating_sub(left);
    Duration::from_micros(empty.saturating_mul(quota.emission_interval_micros()))
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
/// quota's count a period. A gateway without a share waits for one ([`SHARE_WAIT`]).
fn retry(missing: i128, per_period: u128, quota: &Quota) -> Duration {
    let missing = u128::try_from(missing).unwrap_or(0);
    if per_period == 0 {
        return SHARE_WAIT;
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
    /// The decision, with `free` micro-units left and the bucket full again in `reset`.
    fn decision(self, free: i128, reset: Duration, quota: &Quota) -> Decision {
        let limit = u64::from(quota.burst());
        let left = u64::try_from(free.max(0) / i128::from(MICRO)).unwrap_or(0);
        let info = |wait| Info::new(limit, left, reset, wait);
        match self {
            Self::Allowed => Decision::Allowed(info(Duration::ZERO)),
            Self::Denied(wait) => Decision::Denied(info(wait)),
            Self::Never => Decision::InsufficientCapacity(info(Duration::ZERO)),
        }
    }
}
