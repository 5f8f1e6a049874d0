//! [`SqsDelivery`]: settling one delivery.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::types::Message as SqsMessage;
use oncebox_core::{Delivery, Received, Result};

use crate::dead_letter;
use crate::error::{SqsError, sdk};
use crate::lease::Lease;
use crate::options::seconds;
use crate::subscriber::Queue;

/// Error codes of a receipt handle that no longer holds the message.
const EXPIRED_RECEIPT: [&str; 4] = [
    "ReceiptHandleIsInvalid",
    "AWS.SimpleQueueService.ReceiptHandleIsInvalid",
    "MessageNotInflight",
    "AWS.SimpleQueueService.MessageNotInflight",
];

/// One delivery from an [`SqsSubscriber`](crate::SqsSubscriber).
///
/// | settlement | what SQS sees |
/// |---|---|
/// | [`ack`](Delivery::ack) | `DeleteMessage` |
/// | [`nack(delay)`](Delivery::nack) | `ChangeMessageVisibility` to the delay (whole seconds, rounded up; at most 12 h): the message comes back then |
/// | [`dead_letter(reason)`](Delivery::dead_letter) | a copy with the reason is sent to the queue's dead-letter queue and confirmed, then `DeleteMessage` |
/// | held | `ChangeMessageVisibility` every third of the visibility timeout, up to `max_lease` after the receipt |
/// | dropped unsettled | nothing more: the message comes back within one visibility timeout |
///
/// Dead letters are at least once: if the delete after the confirmed copy fails, the
/// message comes back and may be dead-lettered twice (a FIFO dead-letter queue drops the
/// second copy within five minutes: its deduplication id is the original's SQS message
/// id).
pub struct SqsDelivery {
    received: Received,
    queue: Arc<Queue>,
    message: SqsMessage,
    lease: Lease,
    group: Option<String>,
    settled: bool,
}

impl SqsDelivery {
    pub(crate) fn new(
        received: Received,
        queue: Arc<Queue>,
        message: SqsMessage,
        lease: Lease,
        group: Option<String>,
    ) -> Self {
        Self {
            received,
            queue,
            message,
            lease,
            group,
            settled: false,
        }
    }

    /// The SQS message id.
    pub fn message_id(&self) -> Option<&str> {
        self.message.message_id()
    }

    /// Lets the other buffered messages of this delivery's FIFO group wait behind it.
    fn release_group(&self) {
        if self.queue.fifo
            && let Some(group) = &self.group
        {
            self.queue.release_group(group);
        }
    }
}

impl Delivery for SqsDelivery {
    fn received(&self) -> &Received {
        &self.received
    }

    /// Deletes the message.
    ///
    /// # Errors
    ///
    /// Transient: [`SqsError::ReceiptExpired`] when the message was delivered again
    /// meanwhile (its lease ran out), or SQS could not be reached. The message is then
    /// delivered again.
    async fn ack(mut self) -> Result<()> {
        self.settled = true;
        self.lease.stop();
        delete(&self.queue, &self.message).await
    }

    /// Makes the message visible again after `delay`, rounded up to whole seconds.
    ///
    /// # Errors
    ///
    /// Transient, as [`ack`](Delivery::ack); the message then comes back after its
    /// visibility timeout instead.
    async fn nack(mut self, delay: Duration) -> Result<()> {
        self.settled = true;
        self.release_group();
        self.lease.stop();
        let Some(receipt) = self.message.receipt_handle() else {
            return Ok(());
        };
        self.queue
            .transport
            .shared
            .client
            .change_message_visibility()
            .queue_url(&self.queue.url)
            .receipt_handle(receipt)
            .visibility_timeout(seconds(delay))
            .send()
            .await
            .map(|_| ())
            .map_err(|error| settle_error("nacking a delivery", &self.queue.url, error))
    }

    /// Sends a copy with `reason` to the queue's dead-letter queue (see the crate docs
    /// for its attributes), waits for SQS's confirmation, then deletes the message.
    ///
    /// # Errors
    ///
    /// Transient when the copy is not confirmed (the delivery is then released and
    /// comes back), or when the delete fails (it comes back and may be dead-lettered
    /// twice).
    async fn dead_letter(mut self, reason: &str) -> Result<()> {
        // Not confirmed: the error, and the delivery released when dropped (unsettled).
        dead_letter::send(&self.queue, &self.message, reason).await?;
        self.settled = true;
        self.lease.stop();
        delete(&self.queue, &self.message).await
    }

    fn messaging_system(&self) -> &'static str {
        "aws_sqs"
    }
}

impl Drop for SqsDelivery {
    fn drop(&mut self) {
        if !self.settled {
            self.release_group();
        }
    }
}

/// Deletes a received message.
pub(crate) async fn delete(queue: &Queue, message: &SqsMessage) -> Result<()> {
    let Some(receipt) = message.receipt_handle() else {
        return Ok(());
    };
    queue
        .transport
        .shared
        .client
        .delete_message()
        .queue_url(&queue.url)
        .receipt_handle(receipt)
        .send()
        .await
        .map(|_| ())
        .map_err(|error| settle_error("deleting a message", &queue.url, error))
}

fn settle_error<E>(
    operation: &'static str,
    url: &str,
    error: aws_sdk_sqs::error::SdkError<E, aws_sdk_sqs::config::http::HttpResponse>,
) -> oncebox_core::Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    if error
        .as_service_error()
        .and_then(ProvideErrorMetadata::code)
        .is_some_and(|code| EXPIRED_RECEIPT.contains(&code))
    {
        return SqsError::ReceiptExpired.transient();
    }
    sdk(operation, url, error)
}

impl fmt::Debug for SqsDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsDelivery")
            .field("received", &self.received)
            .field("message_id", &self.message.message_id())
            .finish_non_exhaustive()
    }
}
