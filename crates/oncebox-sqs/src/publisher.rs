//! [`SqsPublisher`]: confirmed publishing in `SendMessageBatch` requests of up to ten.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use oncebox_core::{Error, Message, Publisher, Result};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::error::{SqsError, code_is_transient, sdk};
use crate::names;
use crate::transport::SqsTransport;
use crate::wire::{self, Outgoing};

/// The most entries SQS takes in one batch.
const BATCH: usize = 10;

/// Publishes to SQS: a [`Publisher`] whose `publish` returns once SQS confirmed the
/// message in its `SendMessageBatch` answer.
///
/// Concurrent publishes to one queue are gathered into batches of up to ten (and at
/// most [`max_message_size`](crate::SqsOptions::max_message_size) bytes in all), several
/// batches in flight ([`batches_in_flight`](crate::SqsOptions::batches_in_flight)). An
/// entry the answer lists as failed is sent again in a later batch, unless SQS blames
/// the entry itself (invalid contents), and so is one the answer does not mention, or
/// every entry of a batch that got no answer; after
/// [`entry_attempts`](crate::SqsOptions::entry_attempts) sends, `publish` returns a
/// transient error. `publish` returns `Ok` only for an entry listed as successful.
///
/// On a FIFO queue `MessageGroupId` is the message's key and `MessageDeduplicationId`
/// its id, so SQS drops a copy sent again within five minutes (a relay that crashed
/// before marking the row published, an entry whose answer was lost); later copies are
/// the consumer's inbox to deduplicate.
#[derive(Debug, Clone)]
pub struct SqsPublisher {
    transport: SqsTransport,
    queues: Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Pending>>>>,
}

/// One message waiting for its batch.
struct Pending {
    entry: Entry,
    done: oneshot::Sender<Result<()>>,
}

#[derive(Clone)]
struct Entry {
    outgoing: Outgoing,
    group: Option<String>,
    dedup: Option<String>,
}

impl SqsPublisher {
    pub(crate) fn new(transport: SqsTransport) -> Self {
        Self {
            transport,
            queues: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The message as an SQS entry, checked against the size limit.
    fn entry(&self, message: &Message, queue: &str) -> Result<Entry> {
        let shared = &self.transport.shared;
        let outgoing = wire::encode(&shared.format, message);
        let limit = shared.options.max_message_size;
        if outgoing.size > limit {
            return Err(SqsError::TooLarge {
                size: outgoing.size,
                limit,
            }
            .permanent());
        }
        let fifo = names::is_fifo(queue);
        let id = message.id.to_string();
        Ok(Entry {
            outgoing,
            group: fifo.then(|| names::group_id(message.key.as_deref(), &id)),
            dedup: fifo.then_some(id),
        })
    }

    /// The batcher of the queue at `url`, started on first use.
    fn batcher(&self, url: &str) -> mpsc::UnboundedSender<Pending> {
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = queues.get(url)
            && !sender.is_closed()
        {
            return sender.clone();
        }
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run_batches(
            self.transport.clone(),
            url.to_owned(),
            receiver,
        ));
        queues.insert(url.to_owned(), sender.clone());
        sender
    }
}

impl Publisher for SqsPublisher {
    /// Sends `message` to its topic's queue in the next batch and waits for SQS's
    /// answer for it.
    ///
    /// # Errors
    ///
    /// - [`SqsError::TooLarge`] (permanent), before anything is sent;
    /// - [`SqsError::NoQueue`] (transient) when the queue does not exist;
    /// - [`SqsError::EntryRefused`]: permanent when SQS blames the entry (invalid
    ///   contents), transient when it failed on SQS's side every time it was sent;
    /// - an outage when SQS cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// A message handed to its batch is sent even if the future is dropped: the relay
    /// then publishes it again, which a FIFO queue drops and an inbox deduplicates.
    async fn publish(&self, message: &Message) -> Result<()> {
        let queue = self.transport.shared.options.queue_of(&message.topic)?;
        let entry = self.entry(message, &queue)?;
        let url = self.transport.queue_url(&queue).await?;
        let (done, answer) = oneshot::channel();
        self.batcher(&url)
            .send(Pending { entry, done })
            .map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }

    fn messaging_system(&self) -> &'static str {
        "aws_sqs"
    }
}

/// Gathers a queue's pending messages into batches until every publisher is gone.
async fn run_batches(
    transport: SqsTransport,
    url: String,
    mut pending: mpsc::UnboundedReceiver<Pending>,
) {
    let options = &transport.shared.options;
    let in_flight = Arc::new(Semaphore::new(options.batches_in_flight));
    let limit = options.max_message_size;
    let mut carried: Option<Pending> = None;
    loop {
        let first = match carried.take() {
            Some(first) => first,
            None => match pending.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            return;
        };
        let mut size = first.entry.outgoing.size;
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match pending.try_recv() {
                Ok(next) if size + next.entry.outgoing.size <= limit => {
                    size += next.entry.outgoing.size;
                    batch.push(next);
                }
                Ok(next) => {
                    carried = Some(next);
                    break;
                }
                Err(_) => break,
            }
        }
        let transport = transport.clone();
        let url = url.clone();
        tokio::spawn(async move {
            send_batch(&transport, &url, batch).await;
            drop(permit);
        });
    }
}

/// Sends one batch, again for the entries SQS did not confirm, and answers each
/// publish.
async fn send_batch(transport: &SqsTransport, url: &str, mut batch: Vec<Pending>) {
    let attempts = transport.shared.options.entry_attempts;
    let mut errors: Vec<Error> = Vec::new();
    for attempt in 1..=attempts {
        if attempt > 1 {
            tokio::time::sleep(Duration::from_millis(50) * 2u32.pow(attempt.min(6) - 2)).await;
        }
        let entries: Vec<_> = batch
            .iter()
            .enumerate()
            .map(|(i, pending)| request_entry(i, &pending.entry))
            .collect();
        let answer = transport
            .shared
            .client
            .send_message_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(error) => {
                let error = sdk("sending a batch", url, error);
                if error.is_transient() && attempt < attempts {
                    tracing::debug!(%error, attempt, "an SQS batch got no answer; sending it again");
                    continue;
                }
                let text = error.to_string();
                let fault = error.fault();
                for pending in batch {
                    let error = SqsError::BatchFailed {
                        details: text.clone(),
                    };
                    let _ = pending.done.send(Err(Error::transport(error, fault)));
                }
                return;
            }
        };
        let mut confirmed = vec![false; batch.len()];
        for success in answer.successful() {
            if let Some(i) = index_of(success.id(), batch.len()) {
                confirmed[i] = true;
            }
        }
        let mut refused = vec![None; batch.len()];
        for failure in answer.failed() {
            if let Some(i) = index_of(failure.id(), batch.len()) {
                refused[i] = Some(failure);
            }
        }
        let mut again = Vec::new();
        errors.clear();
        for (i, pending) in batch.into_iter().enumerate() {
            if confirmed[i] {
                let _ = pending.done.send(Ok(()));
                continue;
            }
            let error = match refused[i] {
                Some(failure) => {
                    let error = SqsError::EntryRefused {
                        operation: "sending a message",
                        code: failure.code().to_owned(),
                        message: failure.message().unwrap_or_default().to_owned(),
                        fault: if failure.sender_fault() {
                            "sender"
                        } else {
                            "server"
                        },
                    };
                    if failure.sender_fault() && !code_is_transient(failure.code()) {
                        let _ = pending.done.send(Err(error.permanent()));
                        continue;
                    }
                    error.transient()
                }
                None => SqsError::Unconfirmed {
                    operation: "sending a message",
                    entry: i.to_string(),
                }
                .transient(),
            };
            errors.push(error);
            again.push(pending);
        }
        if again.is_empty() {
            return;
        }
        tracing::debug!(
            entries = again.len(),
            attempt,
            "SQS did not confirm some entries; sending them again"
        );
        batch = again;
    }
    for (pending, error) in batch.into_iter().zip(errors) {
        let _ = pending.done.send(Err(error));
    }
}

fn index_of(id: &str, len: usize) -> Option<usize> {
    id.parse().ok().filter(|&i| i < len)
}

fn request_entry(index: usize, entry: &Entry) -> SendMessageBatchRequestEntry {
    SendMessageBatchRequestEntry::builder()
        .id(index.to_string())
        .message_body(entry.outgoing.body.clone())
        .set_message_attributes(Some(entry.outgoing.attributes.clone()))
        .set_message_group_id(entry.group.clone())
        .set_message_deduplication_id(entry.dedup.clone())
        .build()
        .unwrap_or_else(|_| unreachable!("id and body are set"))
}
