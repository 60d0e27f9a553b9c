//! What a call to the scripts sends and what it answers: a check's arguments, a batch's
//! layout (keys named once, shapes, the checks as one packed string; see `lua/batch.lua`),
//! the work a check costs Redis, and the replies (see `lua/reply.lua`).

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use ratewarden_core::{
    Algorithm, Decision, Info, Key, Quota, StoreError, StoreErrorKind, Timestamp,
};

use super::names::{Counter, marker_key, state_key};
use super::{Invoke, LETTERS, algorithm_index};

/// What a script is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Count the cost if it fits.
    Check,
    /// Count nothing.
    Peek,
    /// Decide the cost, count nothing (a probe among several limits: `lua/all.lua`).
    Probe,
    /// Count as much as there is, up to `batch`, and at least the cost.
    Lease { batch: u32 },
    /// Split the key (or renew its split) for `hold`; the key itself admits nothing until
    /// `margin` after the split ends.
    Split {
        parts: u32,
        hold: Duration,
        margin: Duration,
    },
    /// Start a part of a new split, if it has no state yet, with `units` left at `at` (the
    /// split's epoch, on Redis's clock).
    Seed { units: u64, at: Timestamp },
    /// Give back the cost a check counted at `charged_at` (on the clock it was decided by).
    Refund { charged_at: Timestamp },
}

impl Mode {
    /// How the scripts name the mode (`ARGV[1]`, see `lua/prelude.lua`).
    const fn letter(self) -> &'static str {
        match self {
            Self::Check => "c",
            Self::Peek => "p",
            Self::Probe => "q",
            Self::Lease { .. } => "l",
            Self::Split { .. } => "h",
            Self::Seed { .. } => "i",
            Self::Refund { .. } => "r",
        }
    }
}

/// What a missing state means to a script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Missing {
    /// A key never checked, or idle long enough to expire: fresh.
    Fresh,
    /// A part of an adaptive split not started yet: spent (the key's remaining burst is not
    /// handed out again).
    Spent,
}

impl Missing {
    /// How the scripts name it (`ARGV[6]`).
    const fn letter(self) -> &'static str {
        match self {
            Self::Fresh => "",
            Self::Spent => "e",
        }
    }
}

impl Counter {
    /// What a missing state of this counter means.
    const fn missing(self) -> Missing {
        match self {
            Self::Part { epoch: Some(_), .. } => Missing::Spent,
            _ => Missing::Fresh,
        }
    }
}

/// One run of a script.
pub(crate) struct Call<'a> {
    pub(crate) quota: &'a Quota,
    pub(crate) counter: Counter,
    pub(crate) mode: Mode,
    pub(crate) cost: u32,
    /// The time, or `None` for the server's `TIME` (tests pass their own).
    pub(crate) now: Option<Timestamp>,
    /// Whether the key's split marker is read (adaptive hot keys), and if so the longest a
    /// split can still run: its hold and the margin after it. A state ahead of now by no more
    /// than that may be a key spent until its split ends, which is never pulled back.
    pub(crate) marker: Option<Duration>,
    /// The shortest TTL of a written state.
    pub(crate) keep_for: Duration,
}

impl Call<'_> {
    /// This call as one check of a batch, with the names of its keys under `prefix`.
    pub(crate) fn entry(&self, prefix: &str, key: &Key) -> Entry {
        let name = state_key(prefix, key, self.quota, self.counter);
        let marker = self.marker.is_some().then(|| marker_key(&name));
        let (figure, limit) = figures(self.quota, self.counter);
        let mut args = Args::default();
        args.extend([Arg::Text(self.mode.letter()), Arg::Number(self.cost.into())]);
        args.extend([self
            .now
            .map_or(Arg::Text(""), |now| Arg::Number(now.as_micros()))]);
        args.extend([
            Arg::Number(figure),
            Arg::Number(limit),
            Arg::Text(self.counter.missing().letter()),
            Arg::Number(micros(self.keep_for)),
            Arg::Number(self.marker.map_or(0, micros)),
        ]);
        match self.mode {
            Mode::Lease { batch } => args.extend([Arg::Number(batch.into())]),
            Mode::Split {
                parts,
                hold,
                margin,
            } => args.extend([
                Arg::Number(parts.into()),
                Arg::Number(micros(hold)),
                Arg::Number(micros(margin)),
            ]),
            Mode::Seed { units, at } => {
                args.extend([Arg::Number(units), Arg::Number(at.as_micros())]);
            }
            Mode::Refund { charged_at } => args.extend([Arg::Number(charged_at.as_micros())]),
            Mode::Check | Mode::Peek | Mode::Probe => {}
        }
        Entry {
            algorithm: self.quota.algorithm(),
            work: work(self.quota.algorithm(), self.mode, self.cost, limit),
            name,
            marker,
            args,
        }
    }
}

/// The entries of a sliding log whose reading is a unit of work: a check reads its log whole
/// (`LRANGE`, each entry a Lua string), 0.08 µs an entry (a check of a 4,096-entry log
/// 0.32 ms alone, a batch of 8 such checks 2.4 ms). Measured by `SLOWLOG` on redis-server 7.0
/// (a release build), as are the units of [`Entry::work`] and the write below.
const LOG_ENTRIES_PER_UNIT: u64 = 64;
/// How many entries' reading the writing of one costs: 0.33 µs an entry a check adds (4,096
/// at once, 1.4 ms).
const LOG_WRITE_WEIGHT: u64 = 4;

/// A check's work in Redis (see [`Entry::work`]): 1 unit for an algorithm of constant work, and
/// for a sliding log 1 more per [`LOG_ENTRIES_PER_UNIT`] entries it may read (its limit, once
/// per decision: a peek or a lease decides twice) or [`LOG_WRITE_WEIGHT`] times fewer it may
/// write (the entries it adds; a split writes a spent log, its limit).
fn work(algorithm: Algorithm, mode: Mode, cost: u32, limit: u64) -> u32 {
    if algorithm != Algorithm::SlidingLog {
        return 1;
    }
    // A cost above the limit is answered without a write.
    let cost = u64::from(cost).min(limit);
    let (decisions, written) = match mode {
        Mode::Check => (1, cost),
        Mode::Peek => (2, 0),
        Mode::Lease { batch } => (2, u64::from(batch).max(cost).min(limit)),
        Mode::Split { .. } | Mode::Seed { .. } => (1, limit),
        Mode::Probe | Mode::Refund { .. } => (1, 0),
    };
    let entries = decisions * limit + LOG_WRITE_WEIGHT * written;
    u32::try_from(1 + entries.div_ceil(LOG_ENTRIES_PER_UNIT)).unwrap_or(u32::MAX)
}

/// One check of a batch: its algorithm, the names of its keys, its arguments.
#[derive(Debug)]
pub(crate) struct Entry {
    algorithm: Algorithm,
    /// Its work in Redis ([`Entry::work`]).
    work: u32,
    name: Vec<u8>,
    marker: Option<Vec<u8>>,
    args: Args,
}

/// The most arguments a check has (`lua/prelude.lua`).
const ARGS: usize = 11;

/// A check's arguments, in place.
#[derive(Clone, Copy, Debug)]
struct Args {
    args: [Arg; ARGS],
    len: usize,
}

impl Default for Args {
    fn default() -> Self {
        Self {
            args: [Arg::Text(""); ARGS],
            len: 0,
        }
    }
}

impl Args {
    fn extend<const N: usize>(&mut self, args: [Arg; N]) {
        self.args[self.len..self.len + N].copy_from_slice(&args);
        self.len += N;
    }
}

impl std::ops::Deref for Args {
    type Target = [Arg];
    fn deref(&self) -> &[Arg] {
        &self.args[..self.len]
    }
}

impl Entry {
    /// The queue of the entry's state on a pool or a cluster: its name, hashed with a seed
    /// of this process's (two names that share a number share a queue, never a batch).
    pub(crate) fn queue(&self) -> u64 {
        use std::hash::BuildHasher as _;
        static SEED: LazyLock<foldhash::fast::RandomState> = LazyLock::new(Default::default);
        SEED.hash_one(&self.name)
    }

    /// A command that reads nothing but goes where the check went (`EXISTS` of its state,
    /// routed to the state's node on a cluster): answered after the check, on a connection
    /// that answers in order.
    pub(crate) fn probe(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(&self.name);
        cmd
    }

    /// The check's work in Redis, in units of a check of constant work (GCRA, token bucket,
    /// windows: in a batch of 128 on distinct keys, 3.4 µs each for GCRA to 6.6 µs for a
    /// sliding window), at least 1; a sliding log's grows with its limit ([`work`]). What a
    /// batch may hold is counted in these ([`crate::batch`]).
    pub(crate) const fn work(&self) -> u32 {
        self.work
    }

    /// The Redis Cluster slot of the check's state.
    pub(crate) fn slot(&self) -> u16 {
        super::names::slot_of(&self.name)
    }

    /// Whether the two checks are of the same state (the same name: one cluster slot).
    pub(crate) fn same_state(&self, other: &Self) -> bool {
        self.name == other.name
    }

    fn keys(&self) -> usize {
        1 + usize::from(self.marker.is_some())
    }

    /// Pushes the check's arguments with `cost` as `lua/args.lua` reads them: its mode, its
    /// missing-state letter, and its numbers as one string of little-endian doubles (the time
    /// -1 for Redis's clock). Every number is below 2^53 (a `u64` of microseconds saturated at
    /// its largest reads as `tonumber` would read it in decimal).
    fn push_args(&self, cmd: &mut redis::Cmd, cost: u64) {
        let text = |arg: Arg| match arg {
            Arg::Text(text) => text,
            Arg::Number(_) => "",
        };
        let mut numbers = [0; 8 * (ARGS - 2)];
        let mut len = 0;
        for (index, &arg) in self.args.iter().enumerate() {
            // (`as f64` is exact below 2^53, which every number is.)
            let number = match (index, arg) {
                (MODE | MISSING, _) => continue,
                (COST, _) => cost as f64,
                (_, Arg::Number(n)) => n as f64,
                (_, Arg::Text(_)) => -1.0,
            };
            numbers[len..len + 8].copy_from_slice(&number.to_le_bytes());
            len += 8;
        }
        cmd.arg(text(self.args[MODE]))
            .arg(text(self.args[MISSING]))
            .arg(&numbers[..len]);
    }

    /// The check's cost (`Call::cost`, a `u32`).
    fn cost(&self) -> u64 {
        match self.args[COST] {
            Arg::Number(cost) => cost,
            Arg::Text(_) => 0,
        }
    }

    /// Whether the two checks differ in their keys and cost only.
    fn same_shape(&self, other: &Self) -> bool {
        self.algorithm == other.algorithm
            && self.keys() == other.keys()
            && self.args.len() == other.args.len()
            && (self.args.iter().zip(other.args.iter()).enumerate())
                .all(|(i, (a, b))| i == COST || a == b)
    }
}

/// Where a check's arguments hold its mode (`ARGV[1]`), its cost (`ARGV[2]`) and its
/// missing-state letter (`ARGV[6]`); the others are numbers, or (the time) empty.
const MODE: usize = 0;
const COST: usize = 1;
const MISSING: usize = 5;
/// How many numbers a call replies per check (see `lua/reply.lua`).
const REPLY_LEN: usize = 5;

/// A check's reply as a call sends it (see `lua/reply.lua`); [`Reply::parse`] reads it.
pub(crate) type Numbers = [i64; REPLY_LEN];

/// The reply of a call: [`REPLY_LEN`] numbers per check, as 8-byte little-endian doubles.
#[derive(Debug)]
pub(crate) struct Replies(Vec<u8>);

impl Replies {
    /// The reply of a call over `checks` checks, if it holds their numbers. A number that is
    /// no integer below 2^53 (which the scripts never send) reads as -1, which
    /// [`Reply::parse`] refuses.
    pub(crate) fn new(bytes: Vec<u8>, checks: usize) -> Result<Self, StoreError> {
        if bytes.len() == checks * REPLY_LEN * 8 {
            Ok(Self(bytes))
        } else {
            Err(StoreError::with_source(
                StoreErrorKind::Script,
                format!(
                    "a reply of {} bytes to {checks} checks, {} expected",
                    bytes.len(),
                    checks * REPLY_LEN * 8
                ),
            ))
        }
    }

    /// The reply of a call over `limits` limits decided together (`lua/all.lua`): their
    /// numbers, and the time they were decided at.
    pub(crate) fn of_limits(
        mut bytes: Vec<u8>,
        limits: usize,
    ) -> Result<(Self, Timestamp), StoreError> {
        let time = bytes
            .len()
            .checked_sub(8)
            .map(|at| bytes.split_off(at))
            .and_then(|time| Some(f64::from_le_bytes(time.try_into().ok()?)))
            .filter(|&micros| {
                micros.fract() == 0.0 && (0.0..9_007_199_254_740_992.0).contains(&micros)
            });
        let replies = Self::new(bytes, limits)?;
        match time {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            // integral, 0 to 2^53
            Some(micros) => Ok((replies, Timestamp::from_micros(micros as u64))),
            None => Err(StoreError::with_source(
                StoreErrorKind::Script,
                "a reply to several limits without their time",
            )),
        }
    }

    /// Each check's numbers, in order.
    pub(crate) fn iter(&self) -> impl ExactSizeIterator<Item = Numbers> + '_ {
        self.0.chunks_exact(REPLY_LEN * 8).map(|check| {
            let mut numbers = [0; REPLY_LEN];
            for (number, bytes) in numbers.iter_mut().zip(check.chunks_exact(8)) {
                let mut double = [0; 8];
                double.copy_from_slice(bytes);
                let double = f64::from_le_bytes(double);
                // Exact integers only: 2^53 = 9,007,199,254,740,992.
                *number = if double.fract() == 0.0 && double.abs() < 9_007_199_254_740_992.0 {
                    #[allow(clippy::cast_possible_truncation)] // integral and below 2^53
                    {
                        double as i64
                    }
                } else {
                    -1
                };
            }
            numbers
        })
    }
}

/// An argument of a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arg {
    Number(u64),
    Text(&'static str),
}

/// A call over `entries`, decided in their order: one entry by its algorithm's own check,
/// several by the batch.
pub(crate) fn batch_command<'a>(
    entries: impl ExactSizeIterator<Item = &'a Entry> + Clone,
    invoke: Invoke,
) -> redis::Cmd {
    let alone = entries.len() == 1;
    let first = entries.clone().next().map(|entry| entry.algorithm);
    let code = first
        .filter(|_| alone)
        .map_or(super::BATCH_INDEX, algorithm_index);
    let mut cmd = super::invocation(invoke, code);
    if alone {
        for entry in entries {
            cmd.arg(entry.keys()).arg(&entry.name);
            if let Some(marker) = &entry.marker {
                cmd.arg(marker);
            }
            entry.push_args(&mut cmd, entry.cost());
        }
        return cmd;
    }
    // Each key is named once (a hot key's checks share it), what checks share is sent once (a
    // shape), and each check as its shape, cost and keys, in one string (`lua/batch.lua`).
    let mut names: Vec<&[u8]> = Vec::new();
    let mut places: HashMap<&[u8], usize, foldhash::fast::RandomState> = HashMap::default();
    let mut shapes: Vec<&Entry> = Vec::new();
    let mut checks = Vec::with_capacity(entries.len() * 16);
    for entry in entries {
        let shape = match shapes.iter().position(|s| s.same_shape(entry)) {
            Some(index) => index,
            None => {
                shapes.push(entry);
                shapes.len() - 1
            }
        };
        // Lua counts from 1. A cost is a `u32`, and a batch has at most `MAX_BATCH_WORK`
        // checks (each of one unit of work at least) of at most 2 keys each.
        put(&mut checks, shape + 1);
        put(&mut checks, entry.cost());
        for name in std::iter::once(&entry.name).chain(&entry.marker) {
            let place = *places.entry(name).or_insert_with(|| {
                names.push(name);
                names.len()
            });
            put(&mut checks, place);
        }
    }
    cmd.arg(names.len());
    for name in names {
        cmd.arg(name);
    }
    cmd.arg(shapes.len());
    for shape in &shapes {
        cmd.arg(LETTERS[algorithm_index(shape.algorithm)])
            .arg(shape.keys());
        shape.push_args(&mut cmd, 0);
    }
    cmd.arg(checks);
    cmd
}

/// A call over the limits of one request (each its own state, all in one slot), decided
/// together by `lua/all.lua`; or, for entries in [`Mode::Refund`], giving back what such a
/// call counted.
pub(crate) fn limits_command(entries: &[&Entry], invoke: Invoke, refund: bool) -> redis::Cmd {
    let code = if refund {
        super::REFUND_INDEX
    } else {
        super::ALL_INDEX
    };
    let mut cmd = super::invocation(invoke, code);
    cmd.arg(entries.iter().map(|entry| entry.keys()).sum::<usize>());
    for entry in entries {
        cmd.arg(&entry.name);
        if let Some(marker) = &entry.marker {
            cmd.arg(marker);
        }
    }
    for entry in entries {
        cmd.arg(LETTERS[algorithm_index(entry.algorithm)])
            .arg(entry.keys());
        entry.push_args(&mut cmd, entry.cost());
    }
    cmd
}

/// What a call on reserved limits does (`lua/reserve.lua`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ledger {
    /// Hold each held limit's cost for `hold`.
    Reserve { hold: Duration },
    /// End the holds, charging `actual` units to each.
    Settle { actual: u32 },
    /// Give back `units`.
    GiveBack { units: u32 },
    /// Keep each hold for `hold` more.
    Renew { hold: Duration },
}

/// A call on the reserved limits of a request, all in one slot (`lua/reserve.lua`): each
/// entry with its emission interval (µs) and, for a held limit, its hold's id (`None`: a
/// probe, of the key's own state).
pub(crate) fn ledger_command(
    entries: &[(&Entry, u64, Option<u64>)],
    op: Ledger,
    invoke: Invoke,
) -> redis::Cmd {
    let (code, first) = match op {
        Ledger::Reserve { hold } => (super::RESERVE_INDEX, micros(hold)),
        Ledger::Settle { actual } => (super::SETTLE_INDEX, u64::from(actual)),
        Ledger::GiveBack { units } => (super::GIVE_INDEX, u64::from(units)),
        Ledger::Renew { hold } => (super::RENEW_INDEX, micros(hold)),
    };
    let mut cmd = super::invocation(invoke, code);
    let keys: usize = entries
        .iter()
        .map(|(_, _, id)| 1 + usize::from(id.is_some()))
        .sum();
    cmd.arg(keys);
    for (entry, _, id) in entries {
        if id.is_some() {
            cmd.arg(reserved_name(&entry.name, b":r"));
            cmd.arg(reserved_name(&entry.name, b":h"));
        } else {
            cmd.arg(&entry.name);
        }
    }
    cmd.arg(first);
    for &(entry, interval, id) in entries {
        cmd.arg(LETTERS[algorithm_index(entry.algorithm)])
            .arg(1 + usize::from(id.is_some()));
        entry.push_args(&mut cmd, entry.cost());
        cmd.arg(interval).arg(id.unwrap_or(0));
    }
    cmd
}

/// The name of a reserved limit's state (`:r`) or holds (`:h`): its checked state's name
/// with a suffix no other name ends with, in the same slot.
fn reserved_name(name: &[u8], suffix: &[u8]) -> Vec<u8> {
    let mut reserved = Vec::with_capacity(name.len() + suffix.len());
    reserved.extend_from_slice(name);
    reserved.extend_from_slice(suffix);
    reserved
}

/// Appends `n` to a batch's checks as a little-endian 32-bit number (`lua/batch.lua`).
fn put(checks: &mut Vec<u8>, n: impl TryInto<u32>) {
    checks.extend_from_slice(&n.try_into().unwrap_or(u32::MAX).to_le_bytes());
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The two figures a script takes after the time: the interval (GCRA, token bucket) or the
/// period (windows), and the limit. A part of `n` gets `1/n` of the rate exactly (`n` times the
/// interval) and of the burst rounded up, or of a window's count rounded up: `n` parts admit at
/// most `n - 1` more than the whole at once, and (rate algorithms) never more over time.
pub(crate) fn figures(quota: &Quota, counter: Counter) -> (u64, u64) {
    let parts = match counter {
        Counter::Whole => 1,
        Counter::Part { parts, .. } => parts.max(1),
    };
    let limit = u64::from(quota.burst().div_ceil(parts));
    match quota.algorithm() {
        Algorithm::Gcra | Algorithm::TokenBucket => (
            quota
                .emission_interval_micros()
                .saturating_mul(u64::from(parts)),
            limit,
        ),
        _ => (quota.period_micros(), limit),
    }
}

/// What a script answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    Decided {
        decision: Decision,
        /// The key's state could not be read and was replaced by a spent one (or, for a
        /// peek, was left as it is).
        corrupt: bool,
        /// A part of an adaptive split that its seed has not reached yet: denied, nothing
        /// written.
        unseeded: bool,
        /// The units counted (a lease's batch, or the cost).
        granted: u32,
    },
    /// The key is split in `parts` for `remaining` more (adaptive hot keys), since `epoch`;
    /// `made` with the units left to its parts when this call made the split (its caller,
    /// and no other, seeds them).
    Split {
        parts: u32,
        remaining: Duration,
        epoch: Timestamp,
        made: Option<u64>,
    },
}

impl Reply {
    /// Reads a check's reply, for a check whose limit is `limit` (which the reply leaves
    /// out); anything else than what the scripts send is an error.
    pub(crate) fn parse(reply: &Numbers, limit: u64) -> Result<Self, StoreError> {
        let bad = || {
            StoreError::with_source(
                StoreErrorKind::Script,
                format!("unexpected script reply {reply:?}"),
            )
        };
        let [outcome, a, b, c, d] = *reply;
        let unsigned = |n: i64| u64::try_from(n).map_err(|_| bad());
        if outcome == 3 || outcome == 4 {
            let parts = u32::try_from(a).map_err(|_| bad())?;
            if !(2..=crate::MAX_PARTS).contains(&parts) {
                return Err(bad());
            }
            return Ok(Self::Split {
                parts,
                remaining: Duration::from_micros(unsigned(b)?),
                // Beyond what a Timestamp holds, the epoch could not name its parts.
                epoch: Timestamp::from_micros(
                    Some(unsigned(c)?)
                        .filter(|&micros| micros <= u64::MAX / 1_000)
                        .ok_or_else(bad)?,
                ),
                made: Some(unsigned(d)?).filter(|_| outcome == 4),
            });
        }
        let info = Info::new(
            limit,
            unsigned(a)?,
            Duration::from_micros(unsigned(b)?),
            Duration::from_micros(unsigned(c)?),
        );
        // The units granted, and the flag (0 to 3: see `lua/prelude.lua`).
        let (granted, flag) = (unsigned(d)? / 4, d % 4);
        let decision = match outcome {
            1 => Decision::Allowed(info),
            0 => Decision::Denied(info),
            2 => Decision::InsufficientCapacity(info),
            _ => return Err(bad()),
        };
        Ok(Self::Decided {
            decision,
            corrupt: flag == 1 || flag == 2,
            unseeded: flag == 3,
            granted: u32::try_from(granted).map_err(|_| bad())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(prefix: &str, key: &Key, counter: Counter) -> Vec<u8> {
        state_key(prefix, key, &Quota::per_second(1).unwrap(), counter)
    }

    /// The arguments of `cmd`, as bytes.
    fn arguments(cmd: &redis::Cmd) -> Vec<Vec<u8>> {
        (cmd.args_iter())
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => panic!("a batch has no cursor"),
            })
            .collect()
    }

    #[test]
    fn a_batch_names_each_key_once_and_sends_its_checks_as_shape_cost_and_key_places() {
        let quota = Quota::per_second(10).unwrap();
        let call = |cost, marker| Call {
            quota: &quota,
            counter: Counter::Whole,
            mode: Mode::Check,
            cost,
            now: None,
            marker,
            keep_for: Duration::ZERO,
        };
        let (a, b) = (Key::from("a"), Key::from("b"));
        let split = Some(Duration::from_secs(1));
        let entries = [
            call(1, None).entry("p", &a),
            call(2, None).entry("p", &b),
            call(3, None).entry("p", &a),
            // Another shape (with a split marker), on a key named before.
            call(4, split).entry("p", &a),
        ];
        let args = arguments(&batch_command(entries.iter(), Invoke::Function));
        let name_a = state_key("p", &a, &quota, Counter::Whole);
        let name_b = state_key("p", &b, &quota, Counter::Whole);
        // FCALL and its function, then 3 keys: a, b and a's marker.
        assert_eq!(args[2], b"3");
        assert_eq!(args[3..6], [name_a.clone(), name_b, marker_key(&name_a)]);
        // Two shapes.
        assert_eq!(args[6], b"2");
        let checks = args.last().unwrap();
        let numbers: Vec<u32> = (checks.chunks_exact(4))
            .map(|n| u32::from_le_bytes(n.try_into().unwrap()))
            .collect();
        assert_eq!(numbers, [1, 1, 1, 1, 2, 2, 1, 3, 1, 2, 4, 1, 3]);
    }

    #[test]
    fn a_checks_work_is_one_unit_but_a_sliding_logs_grows_with_its_entries() {
        let work = |quota: &Quota, mode, cost| {
            let call = Call {
                quota,
                counter: Counter::Whole,
                mode,
                cost,
                now: None,
                marker: None,
                keep_for: Duration::ZERO,
            };
            call.entry("p", &Key::from("k")).work()
        };
        let lease = Mode::Lease { batch: 64 };
        let split = Mode::Split {
            parts: 4,
            hold: Duration::from_secs(1),
            margin: Duration::from_secs(1),
        };
        for algorithm in Algorithm::ALL {
            if algorithm == Algorithm::SlidingLog {
                continue;
            }
            let quota = (Quota::per_hour(4_096).unwrap())
                .with_algorithm(algorithm)
                .unwrap();
            for mode in [Mode::Check, Mode::Peek, lease, split] {
                assert_eq!(work(&quota, mode, 4_096), 1, "{quota} {mode:?}");
            }
        }
        let log = |limit| {
            (Quota::per_hour(limit).unwrap())
                .with_algorithm(Algorithm::SlidingLog)
                .unwrap()
        };
        // Reads its limit per decision (64 entries a unit), writes what it adds (16 a unit).
        assert_eq!(work(&log(1), Mode::Check, 1), 2);
        assert_eq!(work(&log(4_096), Mode::Check, 1), 66);
        assert_eq!(work(&log(4_096), Mode::Check, 4_096), 321);
        // A cost above the limit writes nothing.
        assert_eq!(
            work(&log(64), Mode::Check, 65),
            work(&log(64), Mode::Check, 64)
        );
        assert_eq!(work(&log(4_096), Mode::Peek, 1), 129);
        assert_eq!(work(&log(4_096), lease, 1), 133);
        assert_eq!(work(&log(4_096), split, 0), 321);
        // A part's log is the part's share of the limit.
        let part = Call {
            quota: &log(4_096),
            counter: Counter::Part {
                index: 0,
                parts: 4,
                epoch: None,
            },
            mode: Mode::Check,
            cost: 1,
            now: None,
            marker: None,
            keep_for: Duration::ZERO,
        };
        assert_eq!(part.entry("p", &Key::from("k")).work(), 18);
    }

    #[test]
    fn a_split_epoch_no_timestamp_can_hold_is_a_bad_reply() {
        let split = |epoch: i64| Reply::parse(&[3, 8, 1_000_000, epoch, 0], 10);
        assert!(split(1_700_000_000_000_000).is_ok());
        assert!(split(i64::MAX).is_err());
        // Outcome 4: this call made the split, and its caller seeds the parts.
        let made = |outcome| match Reply::parse(&[outcome, 8, 1_000_000, 9, 5], 10) {
            Ok(Reply::Split { made, .. }) => made,
            other => panic!("{other:?}"),
        };
        assert_eq!((made(3), made(4)), (None, Some(5)));
    }

    #[test]
    fn a_part_is_named_by_its_epoch_in_microseconds_and_the_mode_and_missing_state_by_letters() {
        // The names and letters the scripts and other gateways already know.
        let part = Counter::Part {
            index: 0,
            parts: 2,
            epoch: Some(Timestamp::from_micros(0x1234)),
        };
        assert!(name("rl", &Key::from(1u64), part).ends_with(b":0000000000001234"));
        assert_eq!(part.missing().letter(), "e");
        assert_eq!(Counter::Whole.missing().letter(), "");
        let letters = [
            Mode::Check,
            Mode::Peek,
            Mode::Lease { batch: 2 },
            Mode::Split {
                parts: 2,
                hold: Duration::ZERO,
                margin: Duration::ZERO,
            },
            Mode::Seed {
                units: 1,
                at: Timestamp::from_micros(1),
            },
        ]
        .map(Mode::letter);
        assert_eq!(letters, ["c", "p", "l", "h", "i"]);
    }

    fn packed(numbers: &[f64]) -> Vec<u8> {
        numbers.iter().flat_map(|n| n.to_le_bytes()).collect()
    }

    #[test]
    fn a_reply_reads_with_the_callers_limit_and_holds_only_exact_integers() {
        // Granted 3 (a lease), flag 1 (a corrupt state replaced).
        let replies = Replies::new(packed(&[1.0, 9.0, 100.0, 0.0, 13.0]), 1).unwrap();
        let [numbers] = replies.iter().collect::<Vec<_>>()[..] else {
            panic!("one check's numbers");
        };
        assert_eq!(numbers, [1, 9, 100, 0, 13]);
        assert_eq!(
            Reply::parse(&numbers, 10).unwrap(),
            Reply::Decided {
                decision: Decision::Allowed(Info::new(
                    10,
                    9,
                    Duration::from_micros(100),
                    Duration::ZERO
                )),
                corrupt: true,
                unseeded: false,
                granted: 3,
            }
        );
        // Flag 3: a part its seed has not reached, denied.
        let unseeded = Reply::parse(&[0, 0, 0, 0, 3], 10).unwrap();
        assert!(matches!(
            unseeded,
            Reply::Decided { unseeded: true, corrupt: false, decision, .. } if !decision.is_allowed()
        ));
        // Two checks: a denial, then a split.
        let two = Replies::new(
            packed(&[0.0, 0.0, 5.0, 7.0, 0.0, 3.0, 8.0, 1e3, 42.0, 5.0]),
            2,
        );
        let two: Vec<_> = two.unwrap().iter().collect();
        assert_eq!(two, [[0, 0, 5, 7, 0], [3, 8, 1_000, 42, 5]]);
        // Lengths that are not the checks' are refused.
        for (bytes, checks) in [(39, 1), (40, 2), (0, 1), (80, 1)] {
            let err = Replies::new(vec![0; bytes], checks).unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Script);
        }
        // What the scripts never send reads as -1, a bad reply.
        for odd in [
            f64::NAN,
            f64::INFINITY,
            -f64::INFINITY,
            1.5,
            2f64.powi(53),
            -2f64.powi(60),
        ] {
            let replies = Replies::new(packed(&[1.0, odd, 0.0, 0.0, 0.0]), 1).unwrap();
            let numbers = replies.iter().next().unwrap();
            assert_eq!(numbers[1], -1, "{odd}");
            assert!(Reply::parse(&numbers, 10).is_err(), "{odd}");
        }
    }

    #[test]
    fn replies_are_checked() {
        let decided = Reply::parse(&[1, 9, 100, 0, 4], 10).unwrap();
        assert!(
            matches!(decided, Reply::Decided { decision, granted: 1, corrupt: false, unseeded: false } if decision.is_allowed())
        );
        assert!(matches!(
            Reply::parse(&[3, 8, 1_000, 42, 0], 10).unwrap(),
            Reply::Split {
                parts: 8,
                epoch,
                ..
            } if epoch == Timestamp::from_micros(42)
        ));
        for bad in [
            [5, 9, 100, 0, 0],
            [1, -1, 100, 0, 0],
            [1, 9, -1, 0, 0],
            [1, 9, 100, 0, -4],
            [1, 9, 100, 0, 4 * (i64::from(u32::MAX) + 1)],
            [3, 1, 9, 100, 0],
            [3, 65, 9, 100, 0],
            [3, 8, 9, -1, 0],
        ] {
            let err = Reply::parse(&bad, 10).unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Script);
        }
    }
}
