//! Checks that wait together go to Redis together: while a script call to a node (a cluster
//! slot) is in flight, further checks for it queue, and when it returns the queue goes as one
//! call. A check that finds nothing in flight goes at once: no timer, and no added latency
//! when there is nothing to batch.
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

/// The queues of a connection, by cluster slot (one queue, slot 0, without a cluster).
#[derive(Debug, Default)]
pub(crate) struct Batches {
    queues: Mutex<HashMap<u16, Queue>>,
}

#[derive(Debug, Default)]
struct Queue {
    /// A call to the queue's node is in flight (or about to be sent).
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
pub(crate) async fn run(connection: &Connection, queue: u16, entry: Entry) -> Reply {
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
    queue: u16,
}

impl Drop for Next<'_> {
    fn drop(&mut self) {
        next(self.connection, self.queue);
    }
}

/// Takes the next batch of `queue`, and sends it from a task; marks the queue idle when
/// nothing waits.
fn next(connection: &Connection, queue: u16) {
    let batch = {
        let mut queues = lock(connection.batches());
        let Some(q) = queues.get_mut(&queue) else {
            return;
        };
        if q.waiting.is_empty() {
            q.busy = false;
            return;
        }
        let rest = q.waiting.split_off(q.waiting.len().min(MAX_BATCH));
        std::mem::replace(&mut q.waiting, rest)
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime to send from (one shutting down): the waiting checks fail, and the next
        // check finds the queue idle.
        fail(batch, &StoreError::new(StoreErrorKind::Connection));
        if let Some(q) = lock(connection.batches()).get_mut(&queue) {
            q.busy = false;
        }
        return;
    };
    let connection = connection.clone();
    runtime.spawn(async move {
        let _next = Next {
            connection: &connection,
            queue,
        };
        let entries: Vec<&Entry> = batch.iter().map(|w| &w.entry).collect();
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
    });
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

fn lock(batches: &Arc<Batches>) -> std::sync::MutexGuard<'_, HashMap<u16, Queue>> {
    batches
        .queues
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}
