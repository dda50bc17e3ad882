//! Concurrent checks of the async limiter, sent to Redis in batches.
//!
//! On one server, a check sent alone costs Redis about half as much again
//! as its decision: reading the request, starting a script, writing the
//! reply (by `INFO commandstats`, 15 µs of script time for a `gcra` check
//! alone under load, 10 µs in a batch). So checks that wait at the same
//! time go out together, as one script call that decides each of them in
//! turn (`scripts/driver.lua`, op `b`). While fewer than [`IN_FLIGHT`]
//! calls are in flight a check goes out at once, alone: batching never
//! waits for a batch to fill, and only checks that arrive while the
//! connection is that busy share a call.
//!
//! # Why the answers are the same
//!
//! Redis runs a script alone, so a batch is its decisions sent one after
//! another with nothing between them, in the order the checks reached the
//! queue. On Redis's clock they are judged at one instant (the call's
//! `TIME`), as checks that arrived together are; with the caller's time,
//! each at its own `now`. A check's own round trip is still one call that
//! reaches Redis, sent at most once.
//!
//! # Faults
//!
//! A batch that fails (no answer in time, a broken connection, an error
//! reply) fails every check in it with that error, and each one's caller
//! answers by the fault rule. A caller that gave up before its check was
//! sent (its timeout, or its future dropped) is left out of the batch, so a
//! check that answered by the fault rule is never counted later; one that
//! gives up after may have been counted, as a single call cut short.
//!
//! A cluster's keys live in different slots, which one script call cannot
//! span: the cluster limiter sends every check alone.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use super::aio::{within, Connection};
use super::script::{self, Reply, MAX_BATCH};
use super::{Core, RedisError};

/// How many batch calls may be in flight on the connection at once: while
/// one batch's reply is on its way, the checks that arrived meanwhile are
/// already out as the next. Measured by hand with 16 checks in flight on a
/// two-worker runtime beside Redis on two cores: 1 gave 40,000 decisions a
/// second, 2 gave 47,000, 4 gave 59,000 and 8 gave 58,000 (against 45,000
/// unbatched); `floodgate bench --backend` gave 0.41–0.47x the empty
/// script with 1 and 0.65–0.74x with 4 or 8.
const IN_FLIGHT: usize = 4;

/// Checks that may wait for a batch before a caller's send waits: a bound
/// on the queue's memory, far above what `IN_FLIGHT` full batches drain.
const QUEUE: usize = 4_096;

/// One check waiting for its batch.
struct Pending {
    /// The client's Redis key.
    key: String,
    /// The encoded `now` (empty: Redis's clock).
    now: String,
    /// The cost, `1 <= cost <= L`.
    cost: u64,
    reply: oneshot::Sender<Result<Reply, RedisError>>,
}

/// The sending side of a limiter's batch queue (cloned with it); the queue
/// is drained by a task spawned on the runtime the limiter was made on,
/// which ends when the last limiter sharing it is dropped.
#[derive(Clone, Debug)]
pub(super) struct Batcher {
    queue: mpsc::Sender<Pending>,
}

impl Batcher {
    /// A batcher for `core`'s checks on `connection`, if the caller runs on
    /// a tokio runtime (none otherwise: every check is then sent alone).
    pub(super) fn spawn(core: Arc<Core>, connection: Connection) -> Option<Self> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (queue, pending) = mpsc::channel(QUEUE);
        runtime.spawn(drain(core, connection, pending));
        Some(Self { queue })
    }

    /// The reply to a check of `cost` of `key` at `now` (encoded), sent in
    /// the next batch. `None` if the queue's task is gone (its runtime shut
    /// down) before the check was queued: it was not sent, and the caller
    /// sends it alone. The caller bounds the wait with its timeout.
    pub(super) async fn check(
        &self,
        key: String,
        now: String,
        cost: u64,
    ) -> Option<Result<Reply, RedisError>> {
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            key,
            now,
            cost,
            reply,
        };
        self.queue.send(pending).await.ok()?;
        // A check dropped unanswered by a runtime shutting down may have
        // been sent: an error, never a second send.
        Some(answer.await.unwrap_or_else(|_| {
            Err(RedisError::Unavailable(::redis::RedisError::from((
                ::redis::ErrorKind::Client,
                "the runtime of the limiter's batches shut down",
            ))))
        }))
    }
}

/// Sends what waits in `pending` as batches, at most [`IN_FLIGHT`] at a
/// time, until every limiter sharing the queue is gone.
async fn drain(core: Arc<Core>, connection: Connection, mut pending: mpsc::Receiver<Pending>) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    // Progress: each pass waits for a permit (given back when a batch's
    // reply arrives or fails, `send`) and a check; it ends when the last
    // limiter sharing the queue is dropped and the channel closes. The
    // inner loop takes at most `MAX_BATCH` checks.
    loop {
        // The permit first: while every batch is in flight, checks gather
        // in the queue and go out together when one returns.
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            return;
        };
        let Some(first) = pending.recv().await else {
            return;
        };
        let mut batch = Vec::with_capacity(MAX_BATCH);
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match pending.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        // Callers that gave up are not sent: they answered already.
        batch.retain(|check| !check.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        tokio::spawn(send(Arc::clone(&core), connection.clone(), batch, permit));
    }
}

/// One batch call, and each check's reply to its caller.
async fn send(
    core: Arc<Core>,
    mut connection: Connection,
    batch: Vec<Pending>,
    permit: OwnedSemaphorePermit,
) {
    let start = std::time::Instant::now();
    let replies = if let [alone] = batch.as_slice() {
        // One check: the plain call, as if there were no batching.
        let call = script::single(&core.script, &alone.key, &alone.now, alone.cost);
        within(core.timeout, call.invoke_async::<Reply>(&mut connection))
            .await
            .map(|reply| vec![reply])
    } else {
        let call = script::batch(
            &core.script,
            batch
                .iter()
                .map(|check| (check.key.as_str(), check.now.as_str(), check.cost)),
        );
        within(
            core.timeout,
            call.invoke_async::<Vec<Reply>>(&mut connection),
        )
        .await
        .and_then(|replies| {
            if replies.len() == batch.len() {
                Ok(replies)
            } else {
                Err(RedisError::Reply(format!(
                    "{} replies to a batch of {} checks",
                    replies.len(),
                    batch.len()
                )))
            }
        })
    };
    drop(permit);
    core.round_trips.done(start, &replies);
    match replies {
        Ok(replies) => {
            for (check, reply) in batch.into_iter().zip(replies) {
                // A caller gone since is no one to tell.
                let _ = check.reply.send(Ok(reply));
            }
        }
        Err(error) => {
            for check in batch {
                let _ = check.reply.send(Err(error.clone()));
            }
        }
    }
}
