//! Checks that wait together go to Redis together: while four calls of a queue are in flight,
//! further checks of it queue, and when one returns the queue goes as one call. A check that
//! finds fewer in flight goes at once: no timer, and no added latency when there is nothing to
//! batch. On one connection every check shares a queue; on a pool or a cluster
//! each key's state has a queue of its own, so that calls for different keys still go in
//! parallel over the pool, and a batch never names keys of a slot that is migrating between
//! nodes (which Redis refuses, `TRYAGAIN`, until the migration ends).
//!
//! Order is kept: a queue goes in arrival order, and the script decides a batch in order, so a
//! check is decided after every check of its key that was answered before it came, as if
//! each had gone alone. (Checks in calls in flight together were all waiting at once: no
//! caller can tell their order apart from an order they could have come in.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use ratewarden_core::{StoreError, StoreErrorKind};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::connection::Connection;
use crate::script::{Entry, Numbers};

/// The most checks one call decides: a script runs alone on its node, so a batch's run time
/// is bounded (about a millisecond at most); more wait for the next call.
pub(crate) const MAX_BATCH: usize = 128;

/// The most calls of a queue in flight at once. With one, checks at moderate concurrency
/// waited a whole round trip for the call ahead of them (at 16 concurrent checks of one key,
/// p50 1.8x a bare loop's); with four, 1.1x, and batches are still large under load (about 12
/// checks per call at 64 concurrent checks). See BENCHMARKS.md. Calls in flight together hold
/// checks that were all waiting at once, any order of which is an order they could have come
/// in.
const MAX_IN_FLIGHT: u8 = 4;

/// A check's reply, or why it has none.
type Reply = Result<Numbers, StoreError>;

/// The queues of a connection, by the node or key their checks go to (see
/// [`Connection::eval`]); a queue exists while a call of it is in flight.
#[derive(Debug, Default)]
pub(crate) struct Batches {
    queues: Mutex<HashMap<u64, Queue>>,
}

#[derive(Debug, Default)]
struct Queue {
    /// Calls of the queue in flight (or about to be sent).
    in_flight: u8,
    waiting: Vec<Waiting>,
}

#[derive(Debug)]
struct Waiting {
    entry: Entry,
    reply: oneshot::Sender<Reply>,
    /// When the check came: it is answered within the deadline of a call from then.
    came: Instant,
}

/// Runs `entry` on `connection`: at once when fewer than [`MAX_IN_FLIGHT`] calls of its
/// `queue` are in flight, else with the next batch; answered, either way, within the
/// connection's deadline from now (a [`StoreErrorKind::Timeout`] past it).
///
/// The deadline of a check that queues is its batch's, with no timer of its own: a batch
/// gives up at the deadline of the first check it holds, and goes when a call in flight
/// ends, which each does by its own deadline. While checks wait, no check goes alone, so
/// every call in flight holds checks that came before them: a check is answered by its
/// deadline. (So a check that queued behind slow calls may give up before its own deadline,
/// at its batch's first check's, never after it.)
pub(crate) async fn run(connection: &Connection, queue: u64, entry: Entry) -> Reply {
    let waiting = {
        let mut queues = lock(connection.batches());
        let q = queues.entry(queue).or_default();
        if q.in_flight >= MAX_IN_FLIGHT {
            let (reply, receive) = oneshot::channel();
            q.waiting.push(Waiting {
                entry,
                reply,
                came: Instant::now(),
            });
            Err(receive)
        } else {
            q.in_flight += 1;
            Ok(entry)
        }
    };
    match waiting {
        Ok(entry) => {
            // Whether this call returns or is dropped (its deadline), the checks that queued
            // behind it go next.
            let _next = Next { connection, queue };
            let entries = [&entry];
            let call = connection.eval_batch(&entries);
            let replies = tokio::time::timeout(connection.timeout(), call).await;
            let replies = replies
                .map_err(|elapsed| StoreError::with_source(StoreErrorKind::Timeout, elapsed))??;
            replies.iter().next().ok_or_else(missing_reply)
        }
        Err(receive) => receive.await.unwrap_or_else(|_| Err(missing_reply())),
    }
}

/// On drop (a call ended), sends what waits in the queue (from a task of its own).
struct Next<'a> {
    connection: &'a Connection,
    queue: u64,
}

impl Drop for Next<'_> {
    fn drop(&mut self) {
        next(self.connection, self.queue);
    }
}

/// A call of `queue` ended: takes the queue's next batch and sends it from a task; forgets
/// the queue when nothing waits and nothing else is in flight.
fn next(connection: &Connection, queue: u64) {
    let batch = {
        let mut queues = lock(connection.batches());
        let Some(q) = queues.get_mut(&queue) else {
            return;
        };
        if q.waiting.is_empty() {
            q.in_flight = q.in_flight.saturating_sub(1);
            if q.in_flight == 0 {
                queues.remove(&queue);
            }
            return;
        }
        // The call that ended hands its place to the batch.
        let rest = q.waiting.split_off(q.waiting.len().min(MAX_BATCH));
        std::mem::replace(&mut q.waiting, rest)
    };
    let sending = Sending {
        connection: connection.clone(),
        queue,
        batch,
    };
    match tokio::runtime::Handle::try_current() {
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
    connection: Connection,
    queue: u64,
    batch: Vec<Waiting>,
}

impl Sending {
    async fn send(mut self) {
        let batch = std::mem::take(&mut self.batch);
        let entries: Vec<&Entry> = batch.iter().map(|w| &w.entry).collect();
        let connection = &self.connection;
        // The queue goes in order: its first check came first.
        let deadline =
            batch.first().map_or_else(Instant::now, |first| first.came) + connection.timeout();
        let call = tokio::time::timeout_at(deadline, connection.eval_batch(&entries));
        match call.await {
            Err(elapsed) => {
                let error = StoreError::with_source(StoreErrorKind::Timeout, elapsed);
                fail(batch, &error);
            }
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
        next(&self.connection, self.queue);
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

fn missing_reply() -> StoreError {
    StoreError::with_source(
        StoreErrorKind::Script,
        "the script replied to fewer checks than it was sent",
    )
}

fn lock(batches: &Arc<Batches>) -> std::sync::MutexGuard<'_, HashMap<u64, Queue>> {
    batches
        .queues
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}
