//! Checks that wait together go to Redis together: while a script call of a queue is in
//! flight, further checks of it queue, and when it returns the queue goes as one call. A check
//! that finds nothing in flight goes at once: no timer, and no added latency when there is
//! nothing to batch. On one connection every check shares a queue; on a pool or a cluster
//! each key's state has a queue of its own, so that calls for different keys still go in
//! parallel over the pool, and a batch never names keys of a slot that is migrating between
//! nodes (which Redis refuses, `TRYAGAIN`, until the migration ends).
//!
//! Order is kept: a queue goes in arrival order, and the script decides a batch in order, so
//! the checks of one key are decided in the order they came, as if each had gone alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use ratewarden_core::{StoreError, StoreErrorKind};
use tokio::sync::oneshot;

use crate::connection::Connection;
use crate::script::Entry;

/// The most checks one call decides: a script runs alone on its node, so a batch's run time
/// is bounded (about a millisecond at most); more wait for the next call.
pub(crate) const MAX_BATCH: usize = 128;

/// A check's reply, or why it has none.
type Reply = Result<Vec<i64>, StoreError>;

/// The queues of a connection, by the node or key their checks go to (see
/// [`Connection::eval`]); a queue exists while a call of it is in flight.
#[derive(Debug, Default)]
pub(crate) struct Batches {
    queues: Mutex<HashMap<u64, Queue>>,
}

#[derive(Debug, Default)]
struct Queue {
    /// A call of the queue is in flight (or about to be sent).
    busy: bool,
    waiting: Vec<Waiting>,
}

#[derive(Debug)]
struct Waiting {
    entry: Entry,
    reply: oneshot::Sender<Reply>,
}

/// Runs `entry` on `connection`: at once when nothing is in flight to its `queue`, else with
/// the next batch.
pub(crate) async fn run(connection: &Connection, queue: u64, entry: Entry) -> Reply {
    let waiting = {
        let mut queues = lock(connection.batches());
        let q = queues.entry(queue).or_default();
        if q.busy {
            let (reply, receive) = oneshot::channel();
            q.waiting.push(Waiting { entry, reply });
            Err(receive)
        } else {
            q.busy = true;
            Ok(entry)
        }
    };
    match waiting {
        Ok(entry) => {
            // Whether this call returns or is dropped (its deadline), the checks that queued
            // behind it go next.
            let _next = Next { connection, queue };
            let mut replies = connection.eval_batch(&[&entry]).await?;
            replies.pop().ok_or_else(missing_reply)
        }
        Err(receive) => receive.await.unwrap_or_else(|_| Err(missing_reply())),
    }
}

/// On drop, sends what waits in the queue (from a task of its own), or marks the queue idle.
struct Next<'a> {
    connection: &'a Connection,
    queue: u64,
}

impl Drop for Next<'_> {
    fn drop(&mut self) {
        next(self.connection, self.queue);
    }
}

/// Takes the next batch of `queue`, and sends it from a task; forgets the queue when nothing
/// waits.
fn next(connection: &Connection, queue: u64) {
    let batch = {
        let mut queues = lock(connection.batches());
        let Some(q) = queues.get_mut(&queue) else {
            return;
        };
        if q.waiting.is_empty() {
            queues.remove(&queue);
            return;
        }
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
        let call = tokio::time::timeout(connection.timeout(), connection.eval_batch(&entries));
        match call.await {
            Err(elapsed) => {
                let error = StoreError::with_source(StoreErrorKind::Timeout, elapsed);
                fail(batch, &error);
            }
            Ok(Ok(replies)) if replies.len() == batch.len() => {
                for (waiting, reply) in batch.into_iter().zip(replies) {
                    let _ = waiting.reply.send(Ok(reply));
                }
            }
            Ok(Ok(_)) => fail(batch, &missing_reply()),
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
