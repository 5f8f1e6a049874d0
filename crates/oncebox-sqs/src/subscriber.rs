//! [`SqsSubscriber`]: long polling, leases, and unreadable messages dead-lettered.

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use aws_sdk_sqs::types::{Message as SqsMessage, MessageSystemAttributeName};
use oncebox_core::{Result, Subscriber};
use tokio::time::Instant;

use crate::dead_letter;
use crate::delivery::SqsDelivery;
use crate::error::sdk;
use crate::lease::Lease;
use crate::names;
use crate::options::seconds;
use crate::transport::SqsTransport;
use crate::wire;

/// What a subscriber and its deliveries share: the queue, and (FIFO) the message groups
/// whose buffered messages must go back to the queue.
pub(crate) struct Queue {
    pub(crate) transport: SqsTransport,
    pub(crate) topic: String,
    pub(crate) name: String,
    pub(crate) url: String,
    pub(crate) fifo: bool,
    /// FIFO groups one of whose deliveries was nacked or dropped unsettled: the buffered
    /// messages of these groups are released rather than handed out ahead of it.
    released: Mutex<HashSet<String>>,
}

impl Queue {
    pub(crate) fn release_group(&self, group: &str) {
        self.released
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(group.to_owned());
    }

    fn is_released(&self, group: &str) -> bool {
        self.released
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(group)
    }
}

/// A received message not yet handed out, its lease running.
struct Held {
    message: SqsMessage,
    lease: Lease,
}

/// Receives from one queue: a [`Subscriber`] whose deliveries are
/// [`SqsDelivery`] values.
///
/// `next` hands out the messages of the last `ReceiveMessage` (up to
/// [`max_messages`](crate::SubscriberOptions::max_messages)), then long-polls for more
/// ([`wait_time`](crate::SubscriberOptions::wait_time)). Each message's lease (its
/// visibility extended while it is held, see [`SubscriberOptions`](crate::SubscriberOptions))
/// starts at its receipt, so a buffered message does not time out while waiting for its
/// turn.
///
/// A message this transport cannot read (a body whose `oncebox_body` encoding does not
/// decode, attributes no [`Headers`](oncebox_core::Headers) can hold) is never handed
/// out, dropped or left to loop: it is copied to the dead-letter queue with the reason
/// and deleted. If that copy fails, it comes back after its visibility timeout and is
/// tried again.
///
/// On a FIFO queue, a nacked (or dropped unsettled) delivery sends the buffered messages
/// of its group back to the queue too, where they wait behind it: per-key order holds
/// through retries.
pub struct SqsSubscriber {
    queue: Arc<Queue>,
    buffer: VecDeque<Held>,
}

impl SqsSubscriber {
    pub(crate) fn new(transport: SqsTransport, topic: &str, name: &str, url: String) -> Self {
        let name = if names::is_url(name) {
            names::name_of_url(name).unwrap_or(name).to_owned()
        } else {
            name.to_owned()
        };
        Self {
            queue: Arc::new(Queue {
                transport,
                topic: topic.to_owned(),
                fifo: names::is_fifo(&name),
                name,
                url,
                released: Mutex::new(HashSet::new()),
            }),
            buffer: VecDeque::new(),
        }
    }

    /// The queue's URL.
    pub fn queue_url(&self) -> &str {
        &self.queue.url
    }

    /// One `ReceiveMessage`, its messages leased and buffered.
    async fn receive(&mut self) -> Result<()> {
        let options = &self.queue.transport.shared.options.subscriber;
        let answer = self
            .queue
            .transport
            .shared
            .client
            .receive_message()
            .queue_url(&self.queue.url)
            .max_number_of_messages(i32::from(options.max_messages))
            .wait_time_seconds(seconds(options.wait_time))
            .visibility_timeout(seconds(options.visibility_timeout))
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| sdk("receiving messages", &self.queue.url, e))?;
        let received_at = Instant::now();
        // Released groups concern what the previous receive buffered.
        self.queue
            .released
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        for message in answer.messages.unwrap_or_default() {
            let Some(receipt) = message.receipt_handle().map(str::to_owned) else {
                continue;
            };
            let lease = Lease::start(Arc::clone(&self.queue), receipt, received_at);
            self.buffer.push_back(Held { message, lease });
        }
        Ok(())
    }

    /// Hands out `held`, or deals with it: released (its group was nacked) or
    /// dead-lettered (unreadable).
    async fn open(&self, held: Held) -> Option<SqsDelivery> {
        let Held { message, lease } = held;
        let group = group_of(&message);
        if self.queue.fifo
            && let Some(group) = &group
            && self.queue.is_released(group)
        {
            lease.stop();
            release(&self.queue, &message).await;
            return None;
        }
        let format = &self.queue.transport.shared.format;
        // The coordinates name the topic, as on every transport; the queue is in the options.
        match wire::decode(format, &self.queue.topic, &self.queue.topic, &message) {
            Ok(received) => Some(SqsDelivery::new(
                received,
                Arc::clone(&self.queue),
                message,
                lease,
                group,
            )),
            Err(invalid) => {
                let reason = format!("unreadable: {invalid}");
                match dead_letter::send(&self.queue, &message, &reason).await {
                    Ok(()) => {
                        lease.stop();
                        if let Err(error) = crate::delivery::delete(&self.queue, &message).await {
                            tracing::warn!(%error, "dead-lettered an unreadable message but could not delete it; it comes back and is dead-lettered again");
                        }
                    }
                    Err(error) => tracing::warn!(
                        %error, %reason,
                        "could not dead-letter an unreadable message; it comes back after its visibility timeout"
                    ),
                }
                None
            }
        }
    }
}

impl Subscriber for SqsSubscriber {
    type Delivery = SqsDelivery;

    /// The next readable message, long-polling as long as it takes.
    ///
    /// # Errors
    ///
    /// A transient error while SQS cannot be reached, or the queue does not exist
    /// ([`SqsError::NoQueue`](crate::SqsError::NoQueue)); calling again retries.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: buffered messages stay buffered; messages of a receive cut short
    /// come back after their visibility timeout.
    async fn next(&mut self) -> Result<SqsDelivery> {
        loop {
            while let Some(held) = self.buffer.pop_front() {
                if let Some(delivery) = self.open(held).await {
                    return Ok(delivery);
                }
            }
            self.receive().await?;
        }
    }
}

/// The FIFO message group of a received message.
fn group_of(message: &SqsMessage) -> Option<String> {
    message
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
        .cloned()
}

/// Makes a message visible again at once.
async fn release(queue: &Queue, message: &SqsMessage) {
    let Some(receipt) = message.receipt_handle() else {
        return;
    };
    let released = queue
        .transport
        .shared
        .client
        .change_message_visibility()
        .queue_url(&queue.url)
        .receipt_handle(receipt)
        .visibility_timeout(0)
        .send()
        .await;
    if let Err(error) = released {
        tracing::debug!(error = %sdk("releasing a message", &queue.url, error), "could not release a buffered message; it comes back after its visibility timeout");
    }
}

impl fmt::Debug for SqsSubscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsSubscriber")
            .field("topic", &self.queue.topic)
            .field("queue", &self.queue.url)
            .field("buffered", &self.buffer.len())
            .finish()
    }
}
