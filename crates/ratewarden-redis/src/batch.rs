//! Checks that wait together go to Redis together: while four calls of a queue are in flight,
//! further checks of it queue, and when one returns the queue goes as one call, as much of it
//! as fits in a budget of Redis work ([`MAX_BATCH_WORK`]; the rest goes next): a batch is
//! bounded by the work of its checks, not by their count. A check that finds fewer in flight
//! goes at once: no batching delay, and no added latency when there is nothing to batch. On
//! one connection every check shares a queue; on a pool or a cluster each key's state has a
//! queue of its own (by a hash of its name, seeded per process), so that calls for different
//! keys still go in parallel over the pool, and a batch holds the checks of one state only:
//! never two slots (`CROSSSLOT`), nor keys of a slot that is migrating between nodes (which
//! Redis refuses, `TRYAGAIN`, until the migration ends), even where two names' hashes are
//! equal.
//!
//! Order is kept: a queue goes in arrival order, and the script decides a batch in order, so a
//! check is decided after every check of its key that was answered before it came, as if
//! each had gone alone. (Checks in calls in flight together were all waiting at once: no
//! caller can tell their order apart from an order they could have come in.)
//!
//! Every check is answered within the connection's deadline from when it came: a check that
//! goes at once carries its call's deadline, a check that queues has a timer of its own. A
//! call whose caller stops polling it (its future held, not dropped) keeps its place only
//! until its deadline: then the checks waiting (woken at that deadline) or the next to come
//! take the place, so one caller's held futures never stall the other checks of the
//! connection for longer than a deadline. A batch runs on the runtime of its first check,
//! never on one that only handed the place on (another runtime, maybe idle or shutting down).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ratewarden_core::{StoreError, StoreErrorKind};
use tokio::sync::oneshot;
use tokio::time::Instant;

use ratewarden_core::Key;

use crate::connection::Connection;
use crate::script::{Call, Entry, Numbers};

/// The most work one call does, in units of [`Entry::work`]: a script runs alone on its node,
/// so a batch's run time is bounded, whatever its checks; more wait for the next call, and a
/// check of more work than this goes alone. 128 units are 128 checks of constant work (0.44 ms
/// of redis-server 7.0 for GCRA on distinct keys, 0.84 ms for sliding windows, by `SLOWLOG`),
/// 7 checks of 1,024-entry sliding logs (0.51 ms), or one of a 4,096-entry log (0.32 ms; two
/// would pass it): under a millisecond, with room to spare for a loaded host within 2 ms.
pub(crate) const MAX_BATCH_WORK: u32 = 128;

/// The most calls of a queue in flight at once. With one, checks at moderate concurrency
/// waited a whole round trip for the call ahead of them (at 16 concurrent checks of one key,
/// p50 1.8x a bare loop's); with four, 1.1x, and batches are still large under load (about 12
/// checks per call at 64 concurrent checks). See BENCHMARKS.md. Calls in flight together hold
/// checks that were all waiting at once, any order of which is an order they could have come
/// in.
const MAX_IN_FLIGHT: usize = 4;

/// A check's reply, or why it has none.
type Reply = Result<Numbers, StoreError>;

/// Queues by their number, itself a hash (of a key's name) or a constant: hashed again by
/// foldhash (seeded per process, as the default SipHash is), which costs a check less.
type Queues = HashMap<u64, Queue, foldhash::fast::RandomState>;

/// The queues of a connection, by the node or key their checks go to (see
/// [`Connection::eval`]); a queue exists while a call of it is in flight.
#[derive(Debug, Default)]
pub(crate) struct Batches {
    queues: Mutex<Queues>,
}

/// A connection and the queues of checks waiting for it: clones share both.
#[derive(Clone)]
pub(crate) struct Batcher {
    connection: Connection,
    batches: Arc<Batches>,
    /// Every check shares one queue, whatever its key (tests only: as if every key's queue
    /// number were the same).
    one_queue: bool,
}

impl Batcher {
    pub(crate) fn new(connection: Connection) -> Self {
        Self {
            connection,
            batches: Arc::default(),
            one_queue: false,
        }
    }

    /// The connection the batches go over.
    pub(crate) const fn connection(&self) -> &Connection {
        &self.connection
    }

    /// This batcher, with one queue for every check.
    #[cfg(feature = "test-util")]
    pub(crate) fn with_one_queue(mut self) -> Self {
        self.one_queue = true;
        self
    }

    /// Runs `call` for `key`, with the other checks waiting in its queue: on one connection
    /// every check shares a queue, on a pool or a cluster each state has its own.
    pub(crate) async fn eval(
        &self,
        prefix: &str,
        key: &Key,
        call: &Call<'_>,
    ) -> Result<Numbers, StoreError> {
        let entry = call.entry(prefix, key);
        let queue = if self.one_queue || !self.connection.one_state_per_batch() {
            0
        } else {
            entry.queue()
        };
        run(self, queue, entry).await
    }
}

#[derive(Debug, Default)]
struct Queue {
    /// The places of calls in flight: the deadline of the call in each, or `None`.
    places: [Option<Instant>; MAX_IN_FLIGHT],
    waiting: Vec<Waiting>,
}

impl Queue {
    /// A place for a call at `now`: a free one, or one whose call is past its deadline (its
    /// caller has stopped polling it: its answer, if it ever comes, is too late to wait for).
    fn free_place(&self, now: Instant) -> Option<usize> {
        self.places
            .iter()
            .position(|place| place.is_none_or(|deadline| deadline <= now))
    }

    /// When a check waiting here should look again for a place to take, if before `until`:
    /// the first deadline, after `now`, of a call in flight.
    fn next_look(&self, now: Instant, until: Instant) -> Instant {
        (self.places.iter().flatten())
            .filter(|&&deadline| deadline > now)
            .fold(until, |first, &deadline| first.min(deadline))
    }

    /// The next batch, in `place` until `deadline`: the first checks waiting (with
    /// `one_state`, the first and those of its state only, in order) while their work fits in
    /// [`MAX_BATCH_WORK`], but those whose callers gave up (their deadline passed, or their
    /// future was dropped), which are never sent. `None`, and the place freed, when none is
    /// left.
    fn take_batch(
        &mut self,
        place: usize,
        deadline: Instant,
        one_state: bool,
    ) -> Option<Vec<Waiting>> {
        self.waiting.retain(|waiting| !waiting.reply.is_closed());
        if self.waiting.is_empty() {
            self.places[place] = None;
            return None;
        }
        self.places[place] = Some(deadline);
        let mut budget = Budget::new();
        if !one_state {
            let len = (self.waiting.iter().enumerate())
                .position(|(held, waiting)| !budget.admits(held, &waiting.entry))
                .unwrap_or(self.waiting.len());
            let rest = self.waiting.split_off(len);
            return Some(std::mem::replace(&mut self.waiting, rest));
        }
        // Queues are by a hash of the state's name: a batch naming two states could span two
        // cluster slots (`CROSSSLOT`, failing every check in it).
        let (mut batch, mut rest) = (Vec::new(), Vec::new());
        for waiting in self.waiting.drain(..) {
            let joins = batch
                .first()
                .is_none_or(|first: &Waiting| first.entry.same_state(&waiting.entry))
                && budget.admits(batch.len(), &waiting.entry);
            if joins {
                batch.push(waiting);
            } else {
                rest.push(waiting);
            }
        }
        self.waiting = rest;
        Some(batch)
    }
}

/// What a batch's work may still grow by, in units of [`Entry::work`].
struct Budget {
    /// `None` once a check did not fit: no later check joins (a batch stays a prefix of the
    /// checks it could hold, in order).
    left: Option<u32>,
}

impl Budget {
    const fn new() -> Self {
        Self {
            left: Some(MAX_BATCH_WORK),
        }
    }

    /// Whether `entry` joins a batch of `held` checks: the first always does (alone if its work
    /// passes the budget), the others while the budget lasts.
    fn admits(&mut self, held: usize, entry: &Entry) -> bool {
        let Some(left) = self.left else {
            return false;
        };
        let work = entry.work();
        self.left = (held == 0 || work <= left).then(|| left.saturating_sub(work));
        self.left.is_some()
    }
}

#[derive(Debug)]
struct Waiting {
    entry: Entry,
    reply: oneshot::Sender<Reply>,
    /// The runtime the check waits on, where its batch is sent from if it is the first.
    runtime: Option<tokio::runtime::Handle>,
}

/// Runs `entry` on `connection`: at once when fewer than [`MAX_IN_FLIGHT`] calls of its
/// `queue` are in flight, else with the next batch; answered within the connection's deadline
/// from now, with a [`StoreErrorKind::Timeout`] past it.
async fn run(batcher: &Batcher, queue: u64, entry: Entry) -> Reply {
    let now = Instant::now();
    let deadline = deadline_after(now, batcher.connection.timeout());
    let go = {
        let mut queues = lock(&batcher.batches);
        let q = queues.entry(queue).or_default();
        match q.free_place(now) {
            Some(place) if q.waiting.is_empty() => {
                q.places[place] = Some(deadline);
                Ok((place, entry))
            }
            place => {
                let (reply, receive) = oneshot::channel();
                q.waiting.push(Waiting {
                    entry,
                    reply,
                    runtime: tokio::runtime::Handle::try_current().ok(),
                });
                // A place held past its deadline: the queue goes in it now.
                let batch = place.and_then(|place| {
                    Some((
                        place,
                        q.take_batch(place, deadline, batcher.connection.one_state_per_batch())?,
                    ))
                });
                Err((receive, batch, q.next_look(now, deadline)))
            }
        }
    };
    match go {
        Ok((place, entry)) => {
            // Whether this call returns or is dropped, the checks that queued behind it go
            // next (if its place is still its own).
            let mut next = Next {
                batcher,
                queue,
                place,
                deadline,
                unanswered: Some(&entry),
            };
            let entries = [&entry];
            let replies =
                tokio::time::timeout_at(deadline, batcher.connection.eval_batch(&entries)).await;
            next.unanswered = None;
            drop(next);
            replies
                .map_err(timed_out)??
                .iter()
                .next()
                .ok_or_else(missing_reply)
        }
        Err((mut receive, batch, mut look)) => {
            if let Some((place, batch)) = batch {
                send(batcher, queue, place, deadline, batch);
            }
            loop {
                match tokio::time::timeout_at(look, &mut receive).await {
                    Ok(reply) => return reply.unwrap_or_else(|_| Err(dropped())),
                    Err(elapsed) if look >= deadline => return Err(timed_out(elapsed)),
                    // A call in flight is past its deadline: if checks still wait for its
                    // place, they go in it now.
                    Err(_) => look = take_expired_place(batcher, queue, deadline),
                }
            }
        }
    }
}

/// Sends the checks waiting in `queue` in a place whose call is past its deadline, if there
/// is one; when to look again, before `until`.
fn take_expired_place(batcher: &Batcher, queue: u64, until: Instant) -> Instant {
    let now = Instant::now();
    let batch_deadline = deadline_after(now, batcher.connection.timeout());
    let (batch, look) = {
        let mut queues = lock(&batcher.batches);
        let Some(q) = queues.get_mut(&queue) else {
            return until;
        };
        let batch = q
            .free_place(now)
            .filter(|_| !q.waiting.is_empty())
            .and_then(|place| {
                Some((
                    place,
                    q.take_batch(
                        place,
                        batch_deadline,
                        batcher.connection.one_state_per_batch(),
                    )?,
                ))
            });
        (batch, q.next_look(now, until))
    };
    if let Some((place, batch)) = batch {
        send(batcher, queue, place, batch_deadline, batch);
    }
    look
}

/// `timeout` after `now`, or (a deadline too far to name) thirty years after, as tokio's
/// timeouts do.
fn deadline_after(now: Instant, timeout: Duration) -> Instant {
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 86_400))
}

fn timed_out(elapsed: tokio::time::error::Elapsed) -> StoreError {
    StoreError::with_source(StoreErrorKind::Timeout, elapsed)
}

/// On drop (a call ended), sends what waits in the queue (from a task of its own).
struct Next<'a> {
    batcher: &'a Batcher,
    queue: u64,
    place: usize,
    /// The call's deadline: the place is still the call's while it holds it.
    deadline: Instant,
    /// The call's check, while Redis has not answered it.
    unanswered: Option<&'a Entry>,
}

impl Drop for Next<'_> {
    /// A call dropped before its answer (its caller gave up) may still be on its way, or
    /// waiting in a stalled server's socket: the place is handed on once Redis answers a
    /// probe of the same key sent after it (on the key's node), or at the call's deadline.
    /// Handing it on at once would send the checks queued behind it into the same stall,
    /// where each one whose caller then gave up would still be charged.
    fn drop(&mut self) {
        let hand_on = HandOn {
            batcher: self.batcher.clone(),
            queue: self.queue,
            place: self.place,
            deadline: self.deadline,
        };
        let (Some(entry), Ok(runtime)) = (self.unanswered, tokio::runtime::Handle::try_current())
        else {
            return drop(hand_on);
        };
        let probe = entry.probe();
        // Dropped unrun (its runtime shutting down), the probe hands the place on at once.
        drop(runtime.spawn(async move {
            let answered = hand_on.batcher.connection.query::<u8>(&probe);
            let _ = tokio::time::timeout_at(hand_on.deadline, answered).await;
            drop(hand_on);
        }));
    }
}

/// On drop, hands the place of a call that ended on to the checks queued behind it.
struct HandOn {
    batcher: Batcher,
    queue: u64,
    place: usize,
    deadline: Instant,
}

impl Drop for HandOn {
    fn drop(&mut self) {
        next(&self.batcher, self.queue, self.place, self.deadline);
    }
}

/// The call in `place` of `queue`, due by `deadline`, ended: unless the place was taken from
/// it (past its deadline), the queue's next batch goes in it, from a task; the queue is
/// forgotten when nothing waits and nothing is in flight.
fn next(batcher: &Batcher, queue: u64, place: usize, deadline: Instant) {
    let batch = {
        let mut queues = lock(&batcher.batches);
        let Some(q) = queues.get_mut(&queue) else {
            return;
        };
        if q.places[place] != Some(deadline) {
            return;
        }
        let next_deadline = deadline_after(Instant::now(), batcher.connection.timeout());
        let batch = q.take_batch(
            place,
            next_deadline,
            batcher.connection.one_state_per_batch(),
        );
        if batch.is_none() && q.places.iter().all(Option::is_none) {
            queues.remove(&queue);
        }
        batch.map(|batch| (batch, next_deadline))
    };
    if let Some((batch, next_deadline)) = batch {
        send(batcher, queue, place, next_deadline, batch);
    }
}

/// Sends `batch`, in `place` of `queue` until `deadline`, from a task of its own on the
/// runtime of its first check.
fn send(batcher: &Batcher, queue: u64, place: usize, deadline: Instant, batch: Vec<Waiting>) {
    let runtime = match batch.first().and_then(|first| first.runtime.clone()) {
        Some(runtime) => Ok(runtime),
        None => tokio::runtime::Handle::try_current(),
    };
    let sending = Sending {
        batcher: batcher.clone(),
        queue,
        place,
        deadline,
        batch,
    };
    match runtime {
        // Dropped unsent (a runtime shutting down drops the tasks it never ran), it still
        // answers its checks and hands the queue on.
        Ok(runtime) => drop(runtime.spawn(sending.send())),
        // No runtime to send from: the checks fail, and the queue goes on.
        Err(_) => drop(sending),
    }
}

/// A batch on its way: whatever becomes of it, its checks are answered (a check whose batch
/// was never sent gets an error) and the queue goes on.
struct Sending {
    batcher: Batcher,
    queue: u64,
    place: usize,
    deadline: Instant,
    batch: Vec<Waiting>,
}

impl Sending {
    async fn send(mut self) {
        let entries: Vec<&Entry> = self.batch.iter().map(|w| &w.entry).collect();
        let call =
            tokio::time::timeout_at(self.deadline, self.batcher.connection.eval_batch(&entries));
        let result = call.await;
        drop(entries);
        // Dropped before here (its runtime shutting down), the batch is answered on drop.
        let batch = std::mem::take(&mut self.batch);
        match result {
            Err(elapsed) => fail(batch, &timed_out(elapsed)),
            Ok(Ok(replies)) => {
                // As many as the checks (`Replies::new`).
                for (waiting, reply) in batch.into_iter().zip(replies.iter()) {
                    let _ = waiting.reply.send(Ok(reply));
                }
            }
            Ok(Err(error)) => fail(batch, &error),
        }
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        fail(
            std::mem::take(&mut self.batch),
            &StoreError::with_source(StoreErrorKind::Connection, "the batch was never sent"),
        );
        next(&self.batcher, self.queue, self.place, self.deadline);
    }
}

/// Answers every check of `batch` with (a copy of) `error`.
fn fail(batch: Vec<Waiting>, error: &StoreError) {
    for waiting in batch {
        let copy = match std::error::Error::source(error) {
            Some(source) => StoreError::with_source(error.kind(), source.to_string()),
            None => StoreError::new(error.kind()),
        };
        let _ = waiting.reply.send(Err(copy));
    }
}

/// The call of a queued check was dropped before Redis answered (its runtime shut down).
fn dropped() -> StoreError {
    StoreError::with_source(
        StoreErrorKind::Connection,
        "the call was dropped before Redis answered",
    )
}

fn missing_reply() -> StoreError {
    StoreError::with_source(
        StoreErrorKind::Script,
        "the script replied to fewer checks than it was sent",
    )
}

fn lock(batches: &Batches) -> std::sync::MutexGuard<'_, Queues> {
    batches
        .queues
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use ratewarden_core::{Algorithm, Key, Quota};

    use super::*;
    use crate::script::{Call, Counter, Mode};

    /// A check of `key` under `quota`, counting `cost`.
    fn entry(quota: &Quota, key: &str, cost: u32) -> Entry {
        let call = Call {
            quota,
            counter: Counter::Whole,
            mode: Mode::Check,
            cost,
            now: None,
            marker: None,
            keep_for: Duration::ZERO,
        };
        call.entry("p", &Key::from(key))
    }

    fn log(limit: u32) -> Quota {
        (Quota::per_hour(limit).unwrap())
            .with_algorithm(Algorithm::SlidingLog)
            .unwrap()
    }

    /// The sizes of the batches a queue of `entries` goes in, their callers waiting.
    fn batches(entries: Vec<Entry>, one_state: bool) -> Vec<usize> {
        let mut queue = Queue::default();
        let mut callers = Vec::new();
        for entry in entries {
            let (reply, receive) = oneshot::channel();
            callers.push(receive);
            queue.waiting.push(Waiting {
                entry,
                reply,
                runtime: None,
            });
        }
        let mut sizes = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Some(batch) = queue.take_batch(0, deadline, one_state) {
            let work: u32 = batch.iter().map(|waiting| waiting.entry.work()).sum();
            assert!(work <= MAX_BATCH_WORK || batch.len() == 1, "{work} units");
            sizes.push(batch.len());
        }
        sizes
    }

    #[test]
    fn a_batch_holds_its_budget_of_work_not_a_count_of_checks() {
        let gcra = Quota::per_second(10).unwrap();
        let gcras = |n: usize| (0..n).map(|i| entry(&gcra, &format!("g{i}"), 1));
        // 128 checks of constant work go in one call, as before.
        assert_eq!(batches(gcras(200).collect(), false), [128, 72]);
        // A check of a 4,096-entry log goes alone; of 1,024-entry logs, 7 go together.
        let logs = |limit, n: usize| (0..n).map(move |i| entry(&log(limit), &format!("l{i}"), 1));
        assert_eq!(batches(logs(4_096, 3).collect(), false), [1, 1, 1]);
        assert_eq!(batches(logs(1_024, 16).collect(), false), [7, 7, 2]);
        // A batch is a prefix of the queue: a large log waits behind the checks before it, and
        // the checks after it wait behind it.
        let mixed = gcras(100).chain(logs(4_096, 1)).chain(gcras(100)).collect();
        assert_eq!(batches(mixed, false), [100, 63, 38]);
        // A check of more work than the budget (writing 4,096 entries) still goes, alone.
        let big = entry(&log(4_096), "big", 4_096);
        assert!(big.work() > MAX_BATCH_WORK);
        assert_eq!(batches(vec![big, entry(&gcra, "g", 1)], false), [1, 1]);
    }

    #[test]
    fn a_batch_of_one_state_stops_at_its_first_check_that_does_not_fit() {
        let quota = log(1_024);
        let (a, b) = (|cost| entry(&quota, "a", cost), entry(&quota, "b", 1));
        // `a`'s 81 units, `b` (another state: a batch of its own), 81 more units of `a` (past the
        // budget), then 18 (which would fit): the last waits behind the check before it.
        let entries = vec![a(1_024), b, a(1_024), a(1)];
        let works: Vec<u32> = entries.iter().map(Entry::work).collect();
        assert_eq!(works, [81, 18, 81, 18]);
        assert_eq!(batches(entries, true), [1, 1, 2]);
        // Checks of one state of constant work: 128 in a call.
        let gcra = Quota::per_second(10).unwrap();
        let one_key = (0..300).map(|_| entry(&gcra, "k", 1)).collect();
        assert_eq!(batches(one_key, true), [128, 128, 44]);
    }
}
