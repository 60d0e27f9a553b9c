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
//!   1`), a bucket of capacity `s_i × B` refilled at `s_i × rate`. Shares move between gateways
//!   only by being given: the giver takes the share and the same fraction of its tokens before
//!   it sends them, the receiver adds what a running total adds to the last one it applied. A
//!   share in flight (or lost, or behind a partition) is spent by no one.
//!
//!   **Over the quota: never**, in any interval, under loss, delay, duplication, reordering or
//!   partition (a restart: see below), save rounding: where `B` does not divide a million and
//!   `N × B` is below it, a share a part short of whole units holds them, which adds less than
//!   `N × B` millionths of a unit to the fleet's burst in all.
//!
//!   **Unused**: shares move while some gateway refuses; then each gateway gives half of
//!   what it holds above its max-min fair part of the quota's rate (at least a unit's worth)
//!   to those below theirs (with no one refusing, a gateway asking for nothing gives what it
//!   holds above its first share back: see "Keys at rest are forgotten"). Parts are reckoned on each gateway's demand, units asked for a second
//!   averaged over the time its bucket takes to fill (`B / rate`, within 1 s and 20 s) and
//!   counted up to the quota's rate: no one is given more than it asks for while another asks
//!   for more, what no one asks for is split evenly, and parts are whole units of the burst (a
//!   share below one unit admits nothing, so a burst smaller than the gateways asking goes
//!   where it is asked for most).
//!
//!   Load spread evenly below the quota moves nothing; it loses only what a burst split `N`
//!   ways loses to chance (little where each gateway's part holds several requests). Demand
//!   held on some gateways (one, a few, half of them), or moving from some to others, is
//!   admitted at **0.8 or more** of what one exact limiter admits over two minutes, where the
//!   burst gives each gateway asking 5 units or more (the simulator checks it at 100 a minute,
//!   up to 16 gateways asking, under 5% loss: 0.846 at worst). With fewer units a gateway, a
//!   fixed split of the burst is itself short (10 a second over 5 of 10 gateways: 0.70-0.80),
//!   and a request costing more than a gateway's part of the burst waits for shares (weighted
//!   requests want bursts of several costs a gateway).
//!
//!   A burst on one gateway finds that gateway's tokens at once and the others' spare a few
//!   rounds from its first refusal on: a burst shorter than that may be refused up to `B × (1 −
//!   s_i)` that one exact limiter would admit (the tokens stay for later requests), so over
//!   random traces of 20 s, mostly bursts, escrow admits 0.73-0.81 of what one exact limiter
//!   does (the simulator's grids).
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
//! GCRA and the token bucket map onto these buckets directly.
//!
//! # The window algorithms
//!
//! The fixed window and the sliding window counter count units spent in windows of the
//! quota's period aligned to the clock's epoch (window `now / period`; `MeshStore`'s clock is
//! the wall clock read once at start), so gateways' windows line up as far as their clocks
//! do. The sliding log is not decided ([`supports`]): no count stands for its timestamps.
//!
//! - **Escrow**: a gateway with share `s_i` counts its own units in its windows and admits
//!   while they count at most `s_i × count`. A share is given only out of what its windows
//!   do not count (a part `⌈(counted + held) / count⌉` stays), and no count moves with it,
//!   so each gateway's count stays within its share and the fleet's, the sum, within the
//!   count: **over the quota: never**, in any fixed window, and at any instant for the
//!   sliding window counter (the fleet's admissions counted as one limiter counts them, the
//!   window before weighed by its overlap, exactly; save the rounding stated above, a few
//!   millionths of a unit, where shares hold whole units), with clocks in step; with
//!   clocks `δ` apart, a fleet window is one gateway's give or take `δ` at each end.
//!   **Unused**: as for GCRA, shares follow demand; a share spent in a window is given only
//!   once the windows stop counting it. Over five minutes of demand moving between
//!   gateways under 5% loss, the fleet admits 0.99-1.00 (fixed window) and 0.88-0.92
//!   (sliding window) of what one exact limiter admits (a test checks at least 0.8); over
//!   the simulator's random traces of bursts, 0.78-0.97 (at least 0.75 checked). After a
//!   peer's restart, a share taken back counts as spent in the current window (its run
//!   before may have spent it there): the window admits at most the restarted gateway's
//!   first share more, as above.
//! - **Eventual**: each gateway counts its own units and its peers' as it hears of them,
//!   in the window it hears of them, against the whole count. A unit admitted elsewhere is
//!   counted everywhere within `D`, in a window no earlier than its own, so **over the
//!   quota by at most what the other gateways admitted in the last `D`**: `(N − 1) ×
//!   count` at most, and at most the units requested across the fleet in any `D`.
//!   **Unused**: units heard of in the window after their own count in it too (at most
//!   what the fleet admits in the last `D` of a window).
//!
//! A reservation's overdraft on a window quota counts in the window it is settled in (and,
//! for the sliding window counter, weighs on the next), as the windows count everything:
//! unlike one exact limiter's [`Ledger`](ratewarden_core::algorithm::Ledger), no debt
//! outlives them. A refund comes off the current window only.
//!
//! # Reservations
//!
//! [`Node::reserve`] (and `MeshStore`'s `Store::reserve`) holds each counted limit's
//! estimate on the key's reserved state, apart from its checked state, as one exact limiter
//! does ([`Ledger`](ratewarden_core::algorithm::Ledger)): a hold takes room in the bucket
//! (the tokens stay, refilling up to its capacity) until its request settles, charging the
//! actual units, or its time lapses, charging nothing. Count a reservation's settled units
//! as admitted when they were held:
//!
//! - **Escrow** gives away no share that backs a hold: a part `⌈held / B⌉` of a gateway's
//!   share stays with it, with the tokens held, while the rest is given from as for checks.
//!   So a settle at or below the units held always finds them, and **over the quota: never**,
//!   as for checks, but for what a settle above its estimate (the overdraft) or after its
//!   hold lapsed charges: owed, repaid before anything new is admitted, as on one exact
//!   limiter (the window algorithms: see above); after a peer's restart, a share taken back may leave a hold short, and its
//!   settle owes the rest. **Unused**: a hold takes room in its gateway's share for its
//!   request's time, so a share of few units holds few requests at once: where the burst
//!   gives each gateway asking 10 units, three gateways with the demand moving between them
//!   charge 0.94-1.01 of what one exact limiter charges for the same reservations (a test
//!   checks at least 0.85).
//! - **Eventual** keeps holds to the gateway that made them; its peers hear of a settle's
//!   units as of admissions. A gateway's units held (at most `B`, as a hold must fit) and
//!   those it admitted in the last `D` are together at most `B + rate × D`, so **the bound
//!   above stands**, plus overdrafts. A refund comes back to the gateway that takes it
//!   only: its peers keep the units charged.
//!
//! # Regions
//!
//! Each gateway carries a region ([`Config::region`], sent in every datagram's head). In
//! escrow mode a gateway moves shares to gateways of its own region every round, and to
//! gateways of another region only every [`Config::region_rounds`] (10 by default), so a
//! quota split between regions follows demand more slowly across them than within one;
//! with `None`, never: each region keeps its founders' first shares of every quota (a fixed
//! split, in proportion to its founders), a joiner is given shares only by its own region
//! (in a region with no founder, none), and a gateway that leaves hands its shares to its own region (to another only when none
//! of its own is live). What comes back along the books (a gift returned, a restart
//! settled) goes back to the region it came from. Under a fixed split a region's fair parts
//! are reckoned on what it holds. Every gateway should be given the same `region_rounds`; a
//! gateway that keeps a fixed split says so in each datagram's head and gateways of other
//! regions give it nothing, so it is not drained of what they gave it (what it gives a
//! region-mate that does not keep one may still go across).
//!
//! - **Escrow**, with a region cut off: each side spends only the shares it holds, so
//!   **over the quota: never**, in any interval, throughout the partition and after it.
//!   **Unused**: what the side cut off holds beyond its demand, until the heal (the
//!   simulator: 3 regions of 4 gateways, one cut off for 30 s of 60, 0.87-0.95 of one
//!   exact limiter). A fixed split leaves a region's share unused where its demand is
//!   below it (demand on one region of three: 0.31-0.36 of one exact limiter, against
//!   0.87-0.95 with shares moved every 10 rounds).
//! - **Eventual** does not use regions: each side of a partition counts only its own
//!   admissions and what it heard before, so **each side admits at most the whole quota**
//!   (plus its own bound, for its own `N` and `D`) while cut off, and every gateway has
//!   counted what each other admitted within a few rounds of the heal.
//!
//! # Members
//!
//! The gateways a [`Node`] is made with ([`Node::new`]) found the mesh: each holds an equal
//! share of every quota at first, so each founder is made with the same list. A gateway
//! added later joins through a few members ([`Node::join`], [`MeshBuilder::join`]) and
//! holds **no share** of any quota until its peers give it one as it asks (as they give
//! one another), so a join never lifts what the mesh admits, and escrow's bound holds as
//! members come and go. With [`Config::discover`] (on in [`MeshStore`], and for every
//! joiner) members learn who is in the mesh by SWIM, the `foca` crate, over the mesh's own
//! sealed datagrams: a joiner's arrival, a departure ([`Node::leave`]), a death (probes
//! unanswered, then suspicion for some seconds). A member that left or died, or that this
//! run of the gateway never heard from, is given no more shares and is not
//! [live](Node::live); it stays listed until it is forgotten (see "Gone joiners are
//! forgotten"). A gateway without the secret, or of the other mode, is never let in, and
//! at most [`Config::max_members`] are.
//!
//! - A gateway that leaves ([`Node::leave`], [`MeshStore::leave`]) admits nothing more and
//!   hands its escrow shares to the live members, until they acknowledge them
//!   ([`Node::parted`]); what a reservation or a window's count pins goes once they no
//!   longer do. Every datagram it sends says it left, so peers that missed SWIM's word
//!   give it nothing more. One that dies keeps what it held until it comes back.
//! - A gateway SWIM took for dead that comes back (a partition healed, datagrams lost) is
//!   the same gateway: it keeps its shares and what it exchanged. A restarted one is a
//!   later run ([`Config::incarnation`]), and its peers settle with the run before as soon
//!   as any of them hears of the later one, by its datagrams or by SWIM's (a peer that
//!   hears it by gossip tells SWIM, which passes it on): shares held sum to the whole quota
//!   even when only one peer ever heard the later run.
//! - A gateway that knows no live member (every peer it knew taken for dead) asks every
//!   gateway it ever knew, every ten probes, to let it in, so the sides of a healed
//!   partition find each other again though the seeds are gone.
//! - In eventual mode a joiner admits **nothing** until a founder counts it (it hears
//!   one by SWIM: a gateway sends to its members only), so one turned away (by the bound
//!   on members, or a mesh that never answers), or counted by other joiners only, never
//!   decides unseen (a member holding the secret that calls itself a founder is believed,
//!   as members are). Once let in it counts as one of the `N` of eventual's bound. At the
//!   bound on members, two joiners arriving at once may each be let in by some founders
//!   and not others: those others do not count its units.
//!
//! SWIM's traffic is counted apart from the gossip's ([`Sent::membership_bytes`]): a probe
//! and its answer each second or so, and a few datagrams on each change of membership.
//!
//! # What a round costs
//!
//! A check never waits on the network, but it waits for the node: [`MeshStore`] holds one
//! lock over it. A round ([`Node::tick`], every [`Config::interval`]) visits every slot
//! held, twice, at 30-105 ns a slot on a 2-core machine: 6-10 ms a round at the default
//! [`Config::max_slots`] (100,000). So `MeshStore` does each round in steps of 256 slots
//! ([`Node::advance_round`]), lets go of the lock between them, and seals the round's
//! datagrams after: a check waits for one step at most. The last step encodes what changed
//! and grows with it: 25-165 µs with 100 keys changed a round, 2-10 ms with 10,000
//! (BENCHMARKS.md, "A round's time"). A few rare events visit every slot in one call: a
//! member added or forgotten, a peer's restart heard, this gateway leaving.
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
//!   This needs the seal (its sequence numbers), and a run that hears a peer before its
//!   sequence numbers pass those its run before sent (`MeshStore` takes both from its start
//!   time, so it never comes back with the same ones); without it a restart needs a higher
//!   incarnation.
//!
//!   In eventual mode a gateway starts a key's running total over, marked with its
//!   clock's time, whenever it has none that still weighs (a restart, a key idle for
//!   long), and peers take a count that starts later than the one they hold as new: a
//!   restarted gateway whose clock is ahead of its run before is counted at once. One whose
//!   clock is behind is taken for its run before until it has heard its old running total
//!   back (relayed or repaired) and counts on from there: for its keys `D` grows by up to
//!   one repair cycle (slots ÷ [`Config::repair_per_round`] rounds).
//!
//!   A gateway that hears of a peer's running total for the first time (it is new to the
//!   key, restarted, or the count started over) charges at most the burst and a period's count of it, and nothing
//!   once the peer's last admission weighs no more: each entry tells how long ago its origin
//!   last admitted (a duration, so clocks need not agree), and for the windows that is once
//!   its window no longer counts (the sliding counter's window before still does), for GCRA
//!   and the token bucket once `N` times the time the quota takes to drain a burst and a
//!   period's count has passed. So a key idle that long costs a restarted gateway nothing,
//!   and one spent lately is charged as before.
//! - **A gateway that dies keeps its share.** Escrow takes a member not heard from for
//!   [`Node::quiet_rounds`], or that SWIM found dead or that left, as gone and gives it
//!   nothing more, but what it held when it died
//!   is unused until it comes back: at most its share of the quota, which is `1 / N` unless
//!   it was drawing more to serve a burst.
//! - **Founders agree, and a joiner comes back by joining.** Each founder is made with the
//!   same list. With [`Config::discover`] a founder that hears a founder made with
//!   another list gives up its first share of every quota for the rest of its run
//!   ([`Node::founders_disagree`]), so every founder that hears a misconfigured one
//!   admits only what is given it; until it hears one (a probe, about a second), it may
//!   admit up to its first share over the quota. Without discovery nothing checks the
//!   lists.
//! - **A founder that leaves for good hands over the keys it holds, until they rest.** Its
//!   first share of a key it never saw, or forgot at rest, is nowhere to hand over, and
//!   what it handed over is given up with a key that comes to rest (see "Keys at rest are
//!   forgotten"): the founders left hold `(N − 1) / N` of such keys. Found a mesh with gateways that stay, and let those
//!   that come and go join (a joiner holds no first share).
//! - **Gone joiners are forgotten; founders are kept for good.** Each member listed counts
//!   against [`Config::max_members`]: a gateway beyond is not let in (its datagrams are
//!   dropped as [`Dropped::strangers`]). A gateway forgets a joiner (not a founder: founders
//!   hold first shares; nor, on a joiner, its seeds, whom it asks to let it in) once it has
//!   not heard from it for a minute (or [`Node::quiet_rounds`], if longer), SWIM does not
//!   take it as live, and nothing is outstanding with it on any key: in eventual mode no
//!   count of its that may still weigh (a joiner's last admissions weigh for `N` times the
//!   time the quota drains a burst and a period's count, so it may be kept that long); in
//!   escrow mode as much given it as taken from it, every gift acknowledged. So forgetting
//!   it moves nothing: **over the quota: never; unused: nothing**. A joiner that leaves
//!   gives back what it took along the books first, and a gateway that asks for nothing,
//!   while none refuses, gives back what it took, so joiners that come and go make room for
//!   others a minute after they stop. A joiner gone while holding shares it was given is
//!   kept (what it holds is its peers' to take back should it come back), as a dead
//!   founder's share is, so a mesh that loses `max_members` such joiners lets no more join.
//!
//!   A member added after one was forgotten is held above the highest run forgotten, and
//!   sent sequence numbers above the highest sent a forgotten member: one forgotten that
//!   comes back in the same run (it was cut off) is dropped at first and told to move above
//!   ([`Dropped::stale`], as a gateway restarted with its clock behind), settling with
//!   every peer as they settle with it, so nothing its run sent before is taken again; it is
//!   heard a round later. SWIM still asks a forgotten gateway it took for dead, now and
//!   then, to let this one in, so the sides of a partition long enough for each to forget
//!   the other's joiners meet again (each gateway forgotten then moves above once). SWIM
//!   holds a forgotten gateway as dead for a day, so its datagrams heard again (a replay)
//!   do not let it in. One this gateway never took (withheld on the way and sent later), or
//!   one sent to a gateway restarted since, may let it in until SWIM finds it dead and it is
//!   forgotten again, about a minute: it carries no counts, but takes a place under
//!   [`Config::max_members`] meanwhile.
//! - **Keys at rest are forgotten.** Each gateway holds the keys the fleet uses, up to
//!   [`Config::max_slots`]; past it a new key is refused with [`Full`] (the store answers
//!   `OutOfMemory`, handled by the layer's failure mode). Each round visits 256 slots and
//!   forgets those at rest, nothing held: in eventual mode a full bucket (windows counting
//!   nothing) and no count, any origin's, that would weigh even heard 5 s later than this
//!   gateway heard it; in escrow mode its first share in a full bucket, as much given each
//!   peer as taken from it (no more, to a member that left or died), every share it gave acknowledged, nothing owed, refused or
//!   asked for of late (a thousandth of the
//!   rate counts as none), and its own entry relayed. An entry that weighs nothing (an
//!   eventual count whose last admission no longer weighs; an escrow entry of a gateway
//!   not refusing) makes no state where the key was forgotten, so a key at rest stays
//!   forgotten. Eventual: a count heard more than 5 s late after its key was forgotten is
//!   charged again as a first hearing (over-charging only; a sealed mesh drops a datagram
//!   heard twice).
//!
//!   Escrow: while no gateway refuses, one that asks for nothing gives each live peer back
//!   what it took from it beyond what it gave it, so the books between gateways balance, a
//!   key at rest comes to be held as at first everywhere, and is forgotten. From a member
//!   that left or died, a gateway may have taken more than it gave (a leaver hands its
//!   shares over): that is given up with the key, which is made again at the first share,
//!   so after a founder leaves for good the founders left hold `(N − 1) / N` of each key
//!   that came to rest, as of keys it never saw (should it come back, it takes back what it
//!   gave as it hears of the key's new life). A key on which a gone member took more from
//!   a gateway than it gave is kept by that gateway until the member is back. Shares are exchanged
//!   between lives of a slot: a slot made again is a new life, named in its entries,
//!   transfers and acknowledgements. A peer that hears of a later life settles with the
//!   one before as with a restarted member (what it gave that life beyond what it took
//!   comes back, as share without tokens; what it took beyond what it gave, it gives up),
//!   and a transfer between other lives is dropped (one for a life that ended is
//!   answered, so that its sender settles). **Over the quota: never**: the gateway that
//!   forgets held its first share in a full bucket, as it holds once made again, and had
//!   given each peer what it took from it, so a peer's settling moves nothing but its own
//!   gifts that life never took (back to it, without tokens), in whatever order peers hear
//!   of the new life. **Unused**: nothing beyond those gifts' tokens; but a founder that
//!   leaves for good hands over only the keys it holds: its first share of a key it forgot
//!   stays unused, as for a key it never saw (below). Lives are ordered by the incarnation plus the slots made, so
//!   incarnations must grow faster than slots are made (the time in µs does), as for
//!   escrow's versions.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod bucket;
mod membership;
mod node;
mod seal;
#[cfg(feature = "udp")]
mod store;
mod window;
pub mod wire;

pub use node::{Config, Dropped, Full, Mode, Node, Outgoing, Sent, ShortSecret, supports};
#[cfg(feature = "udp")]
pub use store::{MeshBuilder, MeshStore, node_id};
pub use wire::NodeId;
