//! A shared rate limit without a central store: each gateway decides in its own memory, and
//! gateways exchange what they counted by gossip. The protocol core, [`Node`], is sans-IO: it
//! is fed checks, datagrams and ticks, and returns decisions and datagrams, so the same code
//! runs over UDP and in the simulator (`sim/` in the workspace).
//!
//! # Modes and their bounds
//!
//! A quota of `rate` units a second with a burst `B` admits at most `B + rate × t` units in
//! any interval of length `t` on one gateway. Across `N` gateways:
//!
//! - [`Mode::Escrow`] (the default): each gateway holds a share `s_i` of the quota (`Σ s_i ≤
//!   1`), a bucket of capacity `s_i × B` refilled at `s_i × rate`. Shares move between
//!   gateways only by being given: the giver takes the share and the same fraction of its
//!   tokens before it sends them, the receiver adds what a running total adds to the last one
//!   it applied. A share in flight (or lost, or behind a partition) is spent by no one.
//!   **Over the quota: never**, in any interval, under loss, delay, duplication, reordering or
//!   partition (a restart: see below). **Unused**: shares move only while some gateway refuses; then each gateway
//!   that has not refused lately gives half of what it holds above its part of the fleet's
//!   weight (long-run demand, units refused lately, and an even prior) to those below
//!   theirs. Load spread evenly below the quota moves nothing and loses nothing to the mesh;
//!   a burst on one gateway has that gateway's share at once and about half of each other's
//!   spare share a round from its first refusal on, so a burst shorter than a few rounds may
//!   be refused up to `B × (1 − s_i)` that one exact limiter would admit. The simulator
//!   measures what is left unused against one exact limiter fed the same requests.
//! - [`Mode::Eventual`]: each gateway decides on the whole quota, charged with its own
//!   admissions at once and with its peers' when it hears of them (per-gateway running totals,
//!   merged by maximum). If every unit admitted elsewhere reaches every gateway within `D`,
//!   then in any interval the fleet admits at most `B + rate × t` plus what the other
//!   gateways admitted in the last `D` of it: **over the quota by at most `(N − 1) × (B +
//!   rate × D)`**, and at most the units requested across the fleet in any `D`, whichever is
//!   less (a steady trickle of `λ` requests a second: `λ × D`). `D` is about one gossip
//!   interval plus the network's delay, a round more per datagram lost. **Unused: nothing**
//!   beyond what an exact limiter leaves (peers' units are charged late, which delays the
//!   refill by at most `D`).
//!
//! GCRA and the token bucket map onto these buckets directly; the window algorithms do not yet.
//!
//! # What the bounds assume
//!
//! - **Members are trusted.** The seal keeps out whoever lacks the secret (their datagrams
//!   are dropped and counted); a gateway holding it is believed. What it says is clamped so
//!   that it cannot crash a peer or lift a share above the whole quota, but a faulty member
//!   can still claim units it was never given.
//! - **One mode a mesh.** A datagram from a gateway of the other mode is dropped and
//!   counted ([`Dropped::strangers`]).
//! - **A restart forgets what the gateway held; its peers settle with the run it ends.**
//!   Shares live in memory. A restarted gateway comes back under a higher incarnation
//!   ([`Config::incarnation`]; `MeshStore` takes its start time) holding its first share
//!   (`1 / N`) of each quota, in a full bucket. Each escrow peer, once it hears the new
//!   incarnation, settles with the one before: it gives up what it had been given beyond
//!   what it gave (what it passed on is owed, repaid from the next shares it is given) and
//!   takes back, as share without tokens, what it had given beyond what it was given.
//!   Transfers to or from the incarnation before are void. So the shares again sum to the
//!   whole quota, less what the incarnation before held above its first share (lost with
//!   it) and what was in flight. Over the quota: the restarted gateway's fresh bucket (its
//!   first share of the burst) once per restart, plus, until every peer has heard it, what
//!   those that have not had been given by it, plus any debt not yet repaid.
//!
//!   A gateway whose wall clock is behind its run before, or that came back with the same
//!   incarnation, is dropped by its peers at first ([`Dropped::stale`] or
//!   [`Dropped::replayed`]); each tells it, in its own datagrams, the incarnation and the
//!   sequence numbers it last took from it, and it moves above them (settling with every
//!   peer, as they then settle with it), so it is heard a round after it hears any peer.
//!   This needs the seal (its sequence numbers); without one a restart needs a higher
//!   incarnation.
//!
//!   In eventual mode a restarted gateway's peers take its new admissions for ones they
//!   have heard of until it has heard its old running total back (relayed or repaired) and
//!   counts on from there: for its keys `D` grows by up to one repair cycle (slots ÷
//!   [`Config::repair_per_round`] rounds).
//! - **A gateway that dies keeps its share.** Escrow takes a member not heard from for
//!   [`Node::quiet_rounds`] as gone and gives it nothing more, but what it held when it died
//!   is unused until it comes back: at most its share of the quota, which is `1 / N` unless
//!   it was drawing more to serve a burst.
//! - **Slots are not evicted.** Each gateway holds every key the fleet has seen, up to
//!   [`Config::max_slots`]; past it a new key is refused with [`Full`] (the store answers
//!   `OutOfMemory`, handled by the layer's failure mode).
#![cfg_attr(docsrs, feature(doc_cfg))]

mod bucket;
mod node;
mod seal;
#[cfg(feature = "udp")]
mod store;
pub mod wire;

pub use node::{Config, Dropped, Full, Mode, Node, Outgoing, Sent, ShortSecret, supports};
#[cfg(feature = "udp")]
pub use store::{MeshBuilder, MeshStore, node_id};
pub use wire::NodeId;
