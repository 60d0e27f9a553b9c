//! The Lua scripts and the library of Redis functions, assembled from `lua/`: what a call
//! runs. What a call sends and what it answers is [`wire`]; the names of the keys the scripts
//! keep state in, [`names`].

mod names;
mod wire;

pub(crate) use names::{Counter, MAX_PREFIX_LEN, marker_key, state_key};
pub(crate) use wire::{
    Call, Entry, Ledger, Mode, Numbers, Replies, Reply, batch_command, figures, ledger_command,
    limits_command,
};

use std::sync::LazyLock;

use ratewarden_core::Algorithm;

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

/// What every script and the library begin with: Redis's clock, writes that can be held,
/// integer division, the reply's packing and the table of checks by algorithm.
macro_rules! head {
    () => {
        concat!(
            include_str!("../lua/clock.lua"),
            include_str!("../lua/put.lua"),
            include_str!("../lua/arith.lua"),
            include_str!("../lua/reply.lua"),
            include_str!("../lua/args.lua"),
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
            include_str!("../lua/prelude.lua"),
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
            algorithm!("g", "../lua/gcra.lua"),
            algorithm!("t", "../lua/token_bucket.lua"),
            algorithm!("f", "../lua/fixed_window.lua"),
            algorithm!("w", "../lua/sliding_window.lua"),
            algorithm!("l", "../lua/sliding_log.lua"),
            include_str!("../lua/batch.lua"),
            include_str!("../lua/all.lua"),
            include_str!("../lua/reserve.lua"),
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

static GCRA: LazyLock<Lua> = single!("g", "../lua/gcra.lua");
static TOKEN_BUCKET: LazyLock<Lua> = single!("t", "../lua/token_bucket.lua");
static FIXED_WINDOW: LazyLock<Lua> = single!("f", "../lua/fixed_window.lua");
static SLIDING_WINDOW: LazyLock<Lua> = single!("w", "../lua/sliding_window.lua");
static SLIDING_LOG: LazyLock<Lua> = single!("l", "../lua/sliding_log.lua");

/// The script that decides a batch of checks of any algorithms, in order. A check that goes
/// alone runs its algorithm's own script, which costs Redis less than a batch of one.
static BATCH: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        every_check!(),
        "return packed(batch(KEYS, ARGV))\n"
    ))
});

/// The script that decides several limits of a request together (`lua/all.lua`).
static ALL: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(concat!(every_check!(), "return packed(all(KEYS, ARGV))\n")));

/// The script that gives back what [`ALL`] counted (`lua/all.lua`).
static REFUND: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(concat!(every_check!(), "return refund_all(KEYS, ARGV)\n")));

/// The scripts of reservations (`lua/reserve.lua`): reserve, settle, give back.
static RESERVE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        every_check!(),
        "return packed(reserve(KEYS, ARGV))\n"
    ))
});
static SETTLE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(concat!(every_check!(), "return settle(KEYS, ARGV)\n")));
static GIVE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(concat!(every_check!(), "return give_back(KEYS, ARGV)\n")));
static RENEW: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(concat!(every_check!(), "return renew(KEYS, ARGV)\n")));

/// The library of Redis functions (7.0 and later): every check and the batch, made once when
/// the server loads it rather than at every call as a script's are: Redis spends a quarter
/// less on a check alone and a third less per check in a batch of 8 (BENCHMARKS.md). Named by a hash of its code, so that
/// versions of this crate that share a server each load and call their own.
pub(crate) struct Library {
    /// `#!lua name=...` and the code, for `FUNCTION LOAD`.
    source: String,
    /// The functions for a check alone, by algorithm, then the batch's, then those of
    /// several limits, then those of reservations.
    functions: [String; 12],
}

pub(crate) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let code = concat!(every_check!(), include_str!("../lua/library.lua"));
    let name = format!("ratewarden_{}", &redis::Script::new(code).get_hash()[..16]);
    Library {
        source: format!("#!lua name={name}\nlocal prefix = '{name}_'\n{code}"),
        functions: [
            LETTERS[0], LETTERS[1], LETTERS[2], LETTERS[3], LETTERS[4], "batch", "all", "refund",
            "reserve", "settle", "give", "renew",
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
/// [`algorithm_index`]; the batch and the code of several limits come after them.
const LETTERS: [&str; 5] = ["g", "t", "f", "w", "l"];
const BATCH_INDEX: usize = LETTERS.len();
const ALL_INDEX: usize = BATCH_INDEX + 1;
const REFUND_INDEX: usize = BATCH_INDEX + 2;
const RESERVE_INDEX: usize = BATCH_INDEX + 3;
const SETTLE_INDEX: usize = BATCH_INDEX + 4;
const GIVE_INDEX: usize = BATCH_INDEX + 5;
const RENEW_INDEX: usize = BATCH_INDEX + 6;

const fn algorithm_index(algorithm: Algorithm) -> usize {
    match algorithm {
        Algorithm::Gcra => 0,
        Algorithm::TokenBucket => 1,
        Algorithm::FixedWindow => 2,
        Algorithm::SlidingWindow => 3,
        Algorithm::SlidingLog => 4,
    }
}

/// The command that runs the code numbered `code` (an algorithm's check alone, by
/// [`algorithm_index`], or one of the `*_INDEX`), named as `invoke` says; the caller adds its
/// keys and arguments.
fn invocation(invoke: Invoke, code: usize) -> redis::Cmd {
    match invoke {
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
                &ALL,
                &REFUND,
                &RESERVE,
                &SETTLE,
                &GIVE,
                &RENEW,
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
