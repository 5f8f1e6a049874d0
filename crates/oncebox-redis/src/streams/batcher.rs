//! The publisher's batching: the `XADD`s of concurrent publishes leave as one pipeline.
//!
//! A publish hands its command to a task of the publisher's and waits for its own reply.
//! The task sends whatever has gathered as one pipeline and, while that pipeline is out,
//! gathers the next, as a database groups the commits that arrive during a flush. Each
//! command gets its own reply: Redis answers every command of a pipeline, and one that
//! fails (a key of another type) fails alone.
//!
//! Per-key order needs nothing here: the relay never publishes two messages of one key at
//! once, so a key has at most one command in flight, and its next publish starts after
//! the reply to the last.
//!
//! On a cluster a pipeline goes to one node, so what has gathered leaves as one pipeline
//! per hash slot, the pipelines at the same time.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use redis::cluster_routing::Slot;

use crate::connection::RedisConnection;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};
use tokio::sync::{mpsc, oneshot};

/// At most this many commands in one pipeline.
const MAX_PIPELINE: usize = 512;

/// A command waiting to be sent, the slot of its key, and where its reply goes.
struct Request {
    command: Cmd,
    slot: Slot,
    reply: oneshot::Sender<RedisResult<Value>>,
}

/// Sends commands in pipelines of whatever has gathered, on a task started by the first
/// command.
pub(super) struct Batcher {
    connection: RedisConnection,
    /// The task's queue; `None` until the first command.
    queue: Mutex<Option<mpsc::UnboundedSender<Request>>>,
}

impl Batcher {
    pub(super) fn new(connection: RedisConnection) -> Self {
        Self {
            connection,
            queue: Mutex::new(None),
        }
    }

    /// Sends `command`, whose only key is `key`, with the next pipeline and returns its
    /// reply.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops only the reply: the command may still be sent.
    pub(super) async fn send(&self, command: Cmd, key: &str) -> RedisResult<Value> {
        let (reply, replied) = oneshot::channel();
        let slot = Slot::for_key(key);
        self.enqueue(Request {
            command,
            slot,
            reply,
        })?;
        replied.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Queues `request` for the task, starting the task if there is none or if it
    /// stopped (its runtime shut down).
    fn enqueue(&self, request: Request) -> RedisResult<()> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let request = match &*queue {
            Some(running) => match running.send(request) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::SendError(request)) => request,
            },
            None => request,
        };
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            RedisError::from((
                ErrorKind::Client,
                "the Redis Streams publisher needs a Tokio runtime",
            ))
        })?;
        let (sender, requests) = mpsc::unbounded_channel();
        runtime.spawn(run(self.connection.clone(), requests));
        sender.send(request).map_err(|_| stopped())?;
        *queue = Some(sender);
        Ok(())
    }
}

/// The task: one pipeline at a time, of everything queued when the last one returned.
/// Ends when every publisher sharing the queue is dropped.
async fn run(connection: RedisConnection, mut requests: mpsc::UnboundedReceiver<Request>) {
    let mut batch = Vec::new();
    while requests.recv_many(&mut batch, MAX_PIPELINE).await > 0 {
        if connection.is_cluster() {
            let pipelines = by_slot(batch.drain(..))
                .map(|requests| send_pipeline(connection.clone(), requests.into_iter()));
            futures_util::future::join_all(pipelines).await;
        } else {
            send_pipeline(connection.clone(), batch.drain(..)).await;
        }
    }
}

/// `requests` split by slot, each slot's in their order.
fn by_slot(requests: impl Iterator<Item = Request>) -> impl Iterator<Item = Vec<Request>> {
    let mut slots: HashMap<Slot, Vec<Request>> = HashMap::new();
    for request in requests {
        slots.entry(request.slot).or_default().push(request);
    }
    slots.into_values()
}

/// Sends `requests` as one pipeline and hands each its reply: its own result, or the
/// pipeline's error if the pipeline as a whole failed (connection lost, timed out).
async fn send_pipeline(
    mut connection: RedisConnection,
    requests: impl ExactSizeIterator<Item = Request>,
) {
    let mut pipeline = redis::Pipeline::with_capacity(requests.len());
    pipeline.ignore_errors();
    let mut replies = Vec::with_capacity(requests.len());
    for request in requests {
        pipeline.add_command(request.command);
        replies.push(request.reply);
    }
    let results: RedisResult<Vec<RedisResult<Value>>> = pipeline.query_async(&mut connection).await;
    match results {
        Ok(results) => {
            let mut results = results.into_iter();
            for reply in replies {
                let result = results.next().unwrap_or_else(|| Err(missing_reply()));
                // A publish that was dropped no longer waits for its reply.
                let _ = reply.send(result);
            }
        }
        Err(error) => {
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}

/// The task is gone: its runtime shut down.
fn stopped() -> RedisError {
    RedisError::from((ErrorKind::Io, "the Redis Streams publisher's task stopped"))
}

/// Redis answered a pipeline with fewer replies than it had commands.
fn missing_reply() -> RedisError {
    RedisError::from((
        ErrorKind::Client,
        "Redis answered the pipeline with fewer replies than commands",
    ))
}
