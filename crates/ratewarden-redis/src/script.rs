//! The Lua scripts, how they are called, what they answer, and the layout of the keys they
//! keep state in.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use ratewarden_core::{
    Algorithm, Decision, Info, Key, KeyRepr, Quota, StoreError, StoreErrorKind, Timestamp,
};
use sha2::{Digest as _, Sha256};

/// The longest key name the store writes, whatever the user key (up to
/// [`ratewarden_core::MAX_KEY_LEN`] bytes) and prefix (up to [`MAX_PREFIX_LEN`]).
pub(crate) const MAX_NAME_LEN: usize = 128;
/// The longest key prefix.
pub(crate) const MAX_PREFIX_LEN: usize = 32;
/// The bytes of a name that are not the prefix or the user key: `:{`, a part (2 digits), the
/// kind, the part's 2 steering bytes, `}:`, the limit (16 hex digits), `:` and an epoch (16
/// hex digits).
const NAME_OVERHEAD: usize = 2 + 2 + 1 + 2 + 2 + 16 + 1 + 16;
/// Redis Cluster's hash slots.
const SLOTS: u32 = 16_384;

/// A script: its source (sent with `EVAL` when Redis lacks it) and its SHA-1 (for `EVALSHA`).
/// Scripts are the path for servers without Redis functions (before 7.0, or a user not allowed
/// them); the library is the usual one.
pub(crate) struct Lua {
    source: &'static str,
    sha: String,
}

impl Lua {
    fn new(source: &'static str) -> Self {
        Self {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }
}

/// What every script and the library begin with: Redis's clock, integer division, the
/// reply's packing and the table of checks by algorithm.
macro_rules! head {
    () => {
        concat!(
            include_str!("lua/clock.lua"),
            include_str!("lua/arith.lua"),
            include_str!("lua/reply.lua"),
            include_str!("lua/args.lua"),
            "local run = {}\n"
        )
    };
}

/// An algorithm's check, `run.<letter>(KEYS, ARGV)`: the prelude and the algorithm's file in a
/// block of their own (see `lua/prelude.lua`).
macro_rules! algorithm {
    ($letter:literal, $file:literal) => {
        concat!(
            "do\nlocal KEYS, ARGV\n",
            include_str!("lua/prelude.lua"),
            include_str!($file),
            "run.",
            $letter,
            " = function(keys, args)\n  KEYS, ARGV = keys, args\n  return main()\nend\nend\n"
        )
    };
}

/// Every algorithm's check and the batch's, `batch(KEYS, ARGV)`.
macro_rules! every_check {
    () => {
        concat!(
            head!(),
            algorithm!("g", "lua/gcra.lua"),
            algorithm!("t", "lua/token_bucket.lua"),
            algorithm!("f", "lua/fixed_window.lua"),
            algorithm!("w", "lua/sliding_window.lua"),
            algorithm!("l", "lua/sliding_log.lua"),
            include_str!("lua/batch.lua"),
        )
    };
}

/// A check alone by `EVAL`: its algorithm's check only.
macro_rules! single {
    ($letter:literal, $file:literal) => {
        LazyLock::new(|| {
            Lua::new(concat!(
                head!(),
                algorithm!($letter, $file),
                "return alone(run.",
                $letter,
                "(KEYS, arguments(ARGV[1], ARGV[2], ARGV[3])))\n"
            ))
        })
    };
}

static GCRA: LazyLock<Lua> = single!("g", "lua/gcra.lua");
static TOKEN_BUCKET: LazyLock<Lua> = single!("t", "lua/token_bucket.lua");
static FIXED_WINDOW: LazyLock<Lua> = single!("f", "lua/fixed_window.lua");
static SLIDING_WINDOW: LazyLock<Lua> = single!("w", "lua/sliding_window.lua");
static SLIDING_LOG: LazyLock<Lua> = single!("l", "lua/sliding_log.lua");

/// The script that decides a batch of checks of any algorithms, in order. A check that goes
/// alone runs its algorithm's own script, which costs Redis less than a batch of one.
static BATCH: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        every_check!(),
        "return packed(batch(KEYS, ARGV))\n"
    ))
});

/// The library of Redis functions (7.0 and later): every check and the batch, made once when
/// the server loads it rather than at every call as a script's are: Redis spends a quarter
/// less on a check alone and a third less per check in a batch of 8 (BENCHMARKS.md). Named by a hash of its code, so that
/// versions of this crate that share a server each load and call their own.
pub(crate) struct Library {
    /// `#!lua name=...` and the code, for `FUNCTION LOAD`.
    source: String,
    /// The functions for a check alone, by algorithm, then the batch's.
    functions: [String; 6],
}

pub(crate) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let code = concat!(every_check!(), include_str!("lua/library.lua"));
    let name = format!("ratewarden_{}", &redis::Script::new(code).get_hash()[..16]);
    Library {
        source: format!("#!lua name={name}\nlocal prefix = '{name}_'\n{code}"),
        functions: [
            LETTERS[0], LETTERS[1], LETTERS[2], LETTERS[3], LETTERS[4], "batch",
        ]
        .map(|suffix| format!("{name}_{suffix}")),
    }
});

impl Library {
    /// `FUNCTION LOAD` of the library (on a cluster, redis-rs sends it to every master).
    pub(crate) fn load(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg(&self.source);
        cmd
    }
}

/// How the code names the algorithms (`run[letter]`), in the order of
/// [`algorithm_index`]; the batch comes after them.
const LETTERS: [&str; 5] = ["g", "t", "f", "w", "l"];
const BATCH_INDEX: usize = LETTERS.len();

const fn algorithm_index(algorithm: Algorithm) -> usize {
    match algorithm {
        Algorithm::Gcra => 0,
        Algorithm::TokenBucket => 1,
        Algorithm::FixedWindow => 2,
        Algorithm::SlidingWindow => 3,
        Algorithm::SlidingLog => 4,
    }
}

/// How a call names its code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Invoke {
    /// `FCALL` of the library's function.
    Function,
    /// `EVALSHA` of the script.
    Sha,
    /// `EVAL` of the script's source.
    Source,
}

/// What a script is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Count the cost if it fits.
    Check,
    /// Count nothing.
    Peek,
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
}

impl Mode {
    /// How the scripts name the mode (`ARGV[1]`, see `lua/prelude.lua`).
    const fn letter(self) -> &'static str {
        match self {
            Self::Check => "c",
            Self::Peek => "p",
            Self::Lease { .. } => "l",
            Self::Split { .. } => "h",
            Self::Seed { .. } => "i",
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

/// Which counter of a key a call is for, and how a missing state reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counter {
    /// The key's own counter.
    Whole,
    /// Part `index` of `parts` of a split key. Parts of an adaptive split carry the split's
    /// `epoch` (when Redis made it) in their names and start spent; parts of a static split
    /// are always there and start fresh.
    Part {
        index: u32,
        parts: u32,
        epoch: Option<Timestamp>,
    },
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
            Mode::Check | Mode::Peek => {}
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
    let code = match entries.clone().next() {
        Some(entry) if alone => algorithm_index(entry.algorithm),
        _ => BATCH_INDEX,
    };
    let mut cmd = match invoke {
        Invoke::Function => {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(&LIBRARY.functions[code]);
            cmd
        }
        Invoke::Sha | Invoke::Source => {
            let lua = [
                &GCRA,
                &TOKEN_BUCKET,
                &FIXED_WINDOW,
                &SLIDING_WINDOW,
                &SLIDING_LOG,
                &BATCH,
            ][code];
            if invoke == Invoke::Sha {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(&lua.sha);
                cmd
            } else {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(lua.source);
                cmd
            }
        }
    };
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

/// The name of a key's state under `quota`:
/// `PREFIX:{[PART]KIND KEY[STEER]}:LIMIT[:EPOCH]`, where KIND is `i` (an integer, in decimal),
/// `a` (an address, as text), `s` (a string, as its bytes), `l` (a string too long to fit or
/// holding a `}`, which would end the tag: the first 16 bytes of its SHA-256, in hex) or `h`
/// (a digest: its first 16 bytes, in hex); LIMIT
/// is [`Key::limit_id`] in hex (the scope and the quota; for a part, mixed with the number of
/// parts); PART, STEER and EPOCH only for a part
/// of a split key. The key sits in a hash tag, so each key has one cluster slot, which every
/// limit of the key shares; a part's two STEER bytes place it at an even spacing from the
/// key's own slot (part `i` of `n` at `i/n` of the slots further), so that `n` parts land on
/// `n` evenly spread slots, whatever the key. Never longer than [`MAX_NAME_LEN`] bytes, and
/// different keys, kinds, limits and parts never share a name.
pub(crate) fn state_key(prefix: &str, key: &Key, quota: &Quota, counter: Counter) -> Vec<u8> {
    let mut name = Vec::with_capacity(MAX_NAME_LEN);
    name.extend_from_slice(prefix.as_bytes());
    name.extend_from_slice(b":{");
    let tag_start = name.len();
    if let Counter::Part { index, .. } = counter {
        // Digits, then the kind (a letter): the part never runs into the key.
        decimal(&mut name, index);
    }
    let key_start = name.len();
    match key.repr() {
        KeyRepr::Int(n) => {
            name.push(b'i');
            decimal(&mut name, n);
        }
        KeyRepr::Ip(ip) => {
            name.push(b'a');
            push_ip(&mut name, std::net::Ipv6Addr::from(*ip).to_canonical());
        }
        // A `}` would end the hash tag early (Redis Cluster hashes a name only up to the first
        // `}` after its `{`): a key holding one would choose its own slot. It is digested.
        KeyRepr::Bytes(bytes)
            if bytes.len() <= MAX_NAME_LEN - NAME_OVERHEAD - prefix.len()
                && !bytes.contains(&b'}') =>
        {
            name.push(b's');
            name.extend_from_slice(bytes);
        }
        KeyRepr::Bytes(bytes) => {
            name.push(b'l');
            hex(&mut name, &Sha256::digest(bytes)[..16]);
        }
        KeyRepr::Digest(digest) => {
            name.push(b'h');
            hex(&mut name, &digest[..16]);
        }
    }
    if let Counter::Part { index, parts, .. } = counter {
        let home = crc16::State::<crc16::XMODEM>::calculate(&name[key_start..]);
        let spacing = SLOTS * index / parts.max(1);
        let slot = (u32::from(home) + spacing) % SLOTS;
        let steer = steer(&name[tag_start..], u16::try_from(slot).unwrap_or(0));
        name.extend_from_slice(&steer);
    }
    name.extend_from_slice(b"}:");
    // A part is named by its quota and the number of parts (in the id's top byte: at most
    // 64), so that gateways splitting a key in different numbers of parts (a rolling change)
    // never read one state under two quotas, nor do two quotas whose shares are equal.
    let limit = match counter {
        Counter::Whole => key.limit_id(quota),
        Counter::Part { parts, .. } => key.limit_id(quota) ^ (u64::from(parts) << 56),
    };
    hex(&mut name, &limit.to_be_bytes());
    if let Counter::Part {
        epoch: Some(epoch), ..
    } = counter
    {
        name.push(b':');
        hex(&mut name, &epoch.as_micros().to_be_bytes());
    }
    name
}

/// The name of the split marker of the key named `name` (in the same slot).
pub(crate) fn marker_key(name: &[u8]) -> Vec<u8> {
    let mut marker = Vec::with_capacity(name.len() + 2);
    marker.extend_from_slice(name);
    marker.extend_from_slice(b":m");
    marker
}

/// Every pair of bytes by the CRC16 (XMODEM) it has: the inverse of a bijection.
static BY_CRC: LazyLock<Vec<[u8; 2]>> = LazyLock::new(|| {
    let mut table = vec![[0; 2]; 1 << 16];
    for pair in (0..=u16::MAX).map(u16::to_be_bytes) {
        table[usize::from(crc16::State::<crc16::XMODEM>::calculate(&pair))] = pair;
    }
    table
});

/// The two bytes to append to `tag` so that it hashes to cluster slot `slot` (or the first
/// slot after it whose bytes hold no `}`, which would end the tag). XMODEM's CRC is linear
/// with a zero start: `crc(tag ++ pair) = crc(tag ++ [0, 0]) ^ crc(pair)`, so the pair is the
/// one whose CRC makes up the difference.
fn steer(tag: &[u8], slot: u16) -> [u8; 2] {
    let mut state = crc16::State::<crc16::XMODEM>::new();
    state.update(tag);
    state.update(&[0, 0]);
    let base = state.get();
    for offset in 0..SLOTS {
        let slot = (u32::from(slot) + offset) % SLOTS;
        // A slot is the CRC's low 14 bits: any of 4 CRCs will do.
        for high in 0..4_u32 {
            let crc = u16::try_from(high << 14 | slot).unwrap_or(0);
            let pair = BY_CRC[usize::from(crc ^ base)];
            if !pair.contains(&b'}') {
                return pair;
            }
        }
    }
    [0, 0]
}

fn decimal(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `ip` as its `Display` writes it (RFC 5952 for IPv6: lower-case hex groups without leading
/// zeros, the longest run of two or more zero groups, the first of equals, as `::`; an
/// IPv4-mapped address as `::ffff:` and its IPv4 address), without
/// `fmt`'s machinery: a check makes its key's name each time.
fn push_ip(out: &mut Vec<u8>, ip: std::net::IpAddr) {
    let v6 = match ip {
        std::net::IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                decimal(out, octet);
            }
            return;
        }
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => {
                out.extend_from_slice(b"::ffff:");
                return push_ip(out, v4.into());
            }
            None => v6.segments(),
        },
    };
    // The longest run of zero groups: (start, len).
    let (mut longest, mut current) = ((0, 0), (0, 0));
    for (i, &group) in v6.iter().enumerate() {
        if group == 0 {
            if current.1 == 0 {
                current.0 = i;
            }
            current.1 += 1;
            if current.1 > longest.1 {
                longest = current;
            }
        } else {
            current = (0, 0);
        }
    }
    let groups = |out: &mut Vec<u8>, groups: &[u16]| {
        for (i, &group) in groups.iter().enumerate() {
            if i > 0 {
                out.push(b':');
            }
            let digits = group.to_be_bytes();
            let hex_digits = [
                digits[0] >> 4,
                digits[0] & 0xf,
                digits[1] >> 4,
                digits[1] & 0xf,
            ];
            let first = hex_digits.iter().position(|&d| d != 0).unwrap_or(3);
            out.extend(
                hex_digits[first..]
                    .iter()
                    .map(|&d| HEX_DIGITS[usize::from(d)]),
            );
        }
    };
    if longest.1 > 1 {
        groups(out, &v6[..longest.0]);
        out.extend_from_slice(b"::");
        groups(out, &v6[longest.0 + longest.1..]);
    } else {
        groups(out, &v6);
    }
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

fn hex(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        out.push(HEX_DIGITS[usize::from(b >> 4)]);
        out.push(HEX_DIGITS[usize::from(b & 0xf)]);
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
        // The units granted, and the flag (0 to 2).
        let (granted, flag) = (unsigned(d)? / 4, d % 4);
        let decision = match outcome {
            1 => Decision::Allowed(info),
            0 => Decision::Denied(info),
            2 => Decision::InsufficientCapacity(info),
            _ => return Err(bad()),
        };
        Ok(Self::Decided {
            decision,
            corrupt: flag != 0,
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

    /// The span of `name`'s hash tag as Redis Cluster reads it: from the first `{` to the first
    /// `}` after it, if there is anything between.
    fn redis_tag(name: &[u8]) -> Option<std::ops::Range<usize>> {
        let open = name.iter().position(|&b| b == b'{')?;
        let close = open + 1 + name[open + 1..].iter().position(|&b| b == b'}')?;
        (close > open + 1).then_some(open + 1..close)
    }

    #[test]
    fn no_byte_of_a_key_ends_or_moves_its_hash_tag() {
        let mut rng = fastrand::Rng::with_seed(20);
        let alphabet = b"{}:%7Dd5\0\x7f\x80\xff a";
        let quota = Quota::per_second(1).unwrap();
        let mut names = std::collections::HashMap::new();
        for round in 0..5_000 {
            let len = rng.usize(0..=300);
            let bytes: Vec<u8> = if round % 2 == 0 {
                (0..len)
                    .map(|_| alphabet[rng.usize(..alphabet.len())])
                    .collect()
            } else {
                (0..len).map(|_| rng.u8(..)).collect()
            };
            let key = Key::from_bytes(&bytes);
            let whole = state_key("rl", &key, &quota, Counter::Whole);
            // The tag runs from the prefix's `:{` to the `}:` before the limit's 16 hex digits.
            let tag = redis_tag(&whole).unwrap();
            assert_eq!(tag.start, 4, "{bytes:?}: {whole:?}");
            assert_eq!(tag.end, whole.len() - 18, "{bytes:?}: {whole:?}");
            let marker = marker_key(&whole);
            assert_eq!(redis_tag(&marker), Some(tag.clone()));
            let part = Counter::Part {
                index: 3,
                parts: 8,
                epoch: Some(Timestamp::from_micros(9)),
            };
            let part = state_key("rl", &key, &quota, part);
            assert_eq!(redis_tag(&part).unwrap().end, part.len() - 35, "{part:?}");
            // Different keys, different names.
            if let Some(other) = names.insert(whole.clone(), bytes.clone()) {
                assert_eq!(other, bytes, "two keys share the name {whole:?}");
            }
        }
    }

    #[test]
    fn names_keep_user_bytes_inside_their_hash_tag_and_never_collide() {
        let key = Key::from("}{evil}");
        let layout = name("rl", &key, Counter::Whole);
        let digest = Sha256::digest(b"}{evil}");
        let mut tag = b"rl:{l".to_vec();
        hex(&mut tag, &digest[..16]);
        tag.extend_from_slice(b"}:");
        assert!(layout.starts_with(&tag), "{layout:?}");
        let (q1, q2) = (Quota::per_second(1).unwrap(), Quota::per_second(2).unwrap());
        let whole = |key: &Key, q: &Quota| state_key("p", key, q, Counter::Whole);
        assert_ne!(whole(&Key::from("7"), &q1), whole(&Key::from(7u64), &q1));
        assert_ne!(whole(&Key::from(7u64), &q1), whole(&Key::from(7u64), &q2));
        assert_ne!(
            whole(&Key::from(7u64), &q1),
            whole(&Key::from(7u64).scoped(3), &q1)
        );
        let part = |index, key: &Key| {
            state_key(
                "p",
                key,
                &q1,
                Counter::Part {
                    index,
                    parts: 16,
                    epoch: None,
                },
            )
        };
        assert_ne!(part(1, &Key::from(7u64)), part(11, &Key::from(7u64)));
        assert_ne!(part(1, &Key::from("1s7")), whole(&Key::from("1s7"), &q1));
        let ip = Key::from("203.0.113.9".parse::<std::net::IpAddr>().unwrap());
        assert!(whole(&ip, &q1).starts_with(b"p:{a203.0.113.9}:"));
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

    #[test]
    fn every_name_fits_in_128_bytes() {
        let prefix = "p".repeat(MAX_PREFIX_LEN);
        let longest_string = Key::from("s".repeat(ratewarden_core::MAX_KEY_LEN));
        let just_fitting = Key::from("s".repeat(MAX_NAME_LEN - NAME_OVERHEAD - MAX_PREFIX_LEN));
        let ipv6: std::net::IpAddr = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe".parse().unwrap();
        let keys = [
            Key::from(u64::MAX),
            Key::from(ipv6),
            Key::hashed("secret"),
            longest_string,
            just_fitting,
        ];
        let counters = [
            Counter::Whole,
            Counter::Part {
                index: crate::MAX_PARTS - 1,
                parts: crate::MAX_PARTS,
                epoch: Some(Timestamp::from_nanos(u64::MAX)),
            },
        ];
        for key in &keys {
            for counter in counters {
                let name = name(&prefix, key, counter);
                assert!(name.len() <= MAX_NAME_LEN, "{} bytes: {key:?}", name.len());
                // Only a key's own counter has a split marker.
                if counter == Counter::Whole {
                    let marker = marker_key(&name);
                    assert!(marker.len() <= MAX_NAME_LEN, "{} bytes", marker.len());
                }
            }
        }
        // Long strings are digested: still one name per string.
        let a = name(&prefix, &Key::from("x".repeat(100)), Counter::Whole);
        let b = name(&prefix, &Key::from("y".repeat(100)), Counter::Whole);
        assert_ne!(a, b);
    }

    #[test]
    fn parts_are_steered_to_evenly_spread_slots() {
        let slot = |name: &[u8]| {
            let open = name.iter().position(|&b| b == b'{').unwrap();
            let close = open + name[open..].iter().position(|&b| b == b'}').unwrap();
            crc16::State::<crc16::XMODEM>::calculate(&name[open + 1..close]) % 16_384
        };
        let quota = Quota::per_second(1).unwrap();
        for key in [Key::from("hot-tenant"), Key::from(7u64), Key::hashed("x")] {
            let home = slot(&state_key("rl", &key, &quota, Counter::Whole));
            for parts in [2_u32, 3, 8, 16, 64] {
                let mut slots: Vec<u16> = (0..parts)
                    .map(|index| {
                        let counter = Counter::Part {
                            index,
                            parts,
                            epoch: Some(Timestamp::from_micros(9)),
                        };
                        slot(&state_key("rl", &key, &quota, counter))
                    })
                    .collect();
                for (index, &s) in slots.iter().enumerate() {
                    let wanted = (u32::from(home) + 16_384 * index as u32 / parts) % 16_384;
                    let off = (u32::from(s) + 16_384 - wanted) % 16_384;
                    assert!(
                        off < 8,
                        "{key:?} part {index}/{parts}: slot {s}, wanted {wanted}"
                    );
                }
                slots.sort_unstable();
                slots.dedup();
                assert_eq!(slots.len(), parts as usize);
            }
        }
    }

    #[test]
    fn an_address_is_named_as_its_display_writes_it() {
        use std::net::{IpAddr, Ipv6Addr};
        let mut rng = fastrand::Rng::with_seed(12);
        let named = |ip: IpAddr| {
            let mut out = Vec::new();
            push_ip(&mut out, ip);
            String::from_utf8(out).unwrap()
        };
        let fixed = [
            "::",
            "::1",
            "1::",
            "0.0.0.0",
            "255.255.255.255",
            "1:0:0:2::3",
            "::ffff:0:1",
        ];
        for text in fixed {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(named(ip), ip.to_string());
        }
        for _ in 0..100_000 {
            // Groups that are often zero, so that runs of every length and place occur.
            let groups: [u16; 8] = std::array::from_fn(|_| match rng.u8(0..4) {
                0 | 1 => 0,
                2 => rng.u16(0..16),
                _ => rng.u16(..),
            });
            let v6 = Ipv6Addr::from(groups);
            assert_eq!(named(IpAddr::V6(v6)), v6.to_string());
            let v4 = std::net::Ipv4Addr::from(rng.u32(..));
            assert_eq!(named(IpAddr::V4(v4)), v4.to_string());
        }
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
                granted: 3,
            }
        );
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
            matches!(decided, Reply::Decided { decision, granted: 1, corrupt: false } if decision.is_allowed())
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
