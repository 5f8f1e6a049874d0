//! The task that drives a subscriber's consumer: it polls librdkafka all the time (so
//! that rebalances are served even while the application is busy), copies the records
//! into the subscriber's state, pauses fetching while too much is buffered, and closes
//! the consumer when the subscriber is dropped.

use std::sync::Arc;
use std::time::Duration;

use oncebox_core::wire::WireFormat;
use rdkafka::ClientContext;
use rdkafka::TopicPartitionList;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::record::Record;
use super::shared::Shared;
use super::state::{Added, Partition};
use crate::context::LoggingContext;
use crate::error::KafkaTransportError;

/// The consumer type of a subscriber.
pub(super) type Consumer = StreamConsumer<SubscriberContext>;

/// The longest pause between two attempts to dead-letter an undecodable record.
const MAX_DEAD_LETTER_BACKOFF: Duration = Duration::from_secs(30);

/// librdkafka's callbacks for a subscriber's consumer: logs, and the rebalances that
/// change which partitions the subscriber holds.
pub(crate) struct SubscriberContext {
    pub(super) shared: Arc<Shared>,
    pub(super) logging: LoggingContext,
}

impl SubscriberContext {
    fn partitions(&self, list: &TopicPartitionList) -> Vec<Partition> {
        list.elements_for_topic(&self.shared.topic)
            .iter()
            .map(|element| element.partition())
            .collect()
    }
}

impl ClientContext for SubscriberContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        self.logging.log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(target: "librdkafka", %error, reason, group = %self.shared.group, "consumer error");
        self.logging.record(&error, reason);
    }
}

impl ConsumerContext for SubscriberContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(list) => {
                let partitions = self.partitions(list);
                tracing::debug!(topic = %self.shared.topic, group = %self.shared.group, ?partitions, "partitions revoked");
                // Deliveries still out become stale: their settlements change nothing,
                // and the partitions' next owner redelivers from the committed offset
                // (librdkafka commits the stored offsets as it revokes).
                self.shared.lock().state.revoke(partitions);
                self.shared.changed.notify_waiters();
            }
            Rebalance::Error(error) => {
                tracing::warn!(topic = %self.shared.topic, group = %self.shared.group, %error, "rebalance failed");
            }
            Rebalance::Assign(_) => {}
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Assign(list) = rebalance else {
            return;
        };
        let partitions = self.partitions(list);
        tracing::debug!(topic = %self.shared.topic, group = %self.shared.group, ?partitions, "partitions assigned");
        {
            let mut inner = self.shared.lock();
            inner.state.assign(partitions);
            inner.paused = false;
        }
        // A partition paused before a revocation may come back paused.
        if let Err(error) = consumer.resume(list) {
            tracing::debug!(%error, "resuming newly assigned partitions");
        }
        self.shared.assignments.send_modify(|count| *count += 1);
        self.shared.changed.notify_waiters();
    }

    fn commit_callback(&self, result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        match result {
            Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(error) => {
                tracing::warn!(topic = %self.shared.topic, group = %self.shared.group, %error, "offset commit failed; retried with the next one");
            }
        }
    }
}

/// Polls `consumer` until `shutdown` fires (or its sender is dropped).
pub(super) async fn drive(
    shared: Arc<Shared>,
    consumer: Arc<Consumer>,
    wire: WireFormat,
    mut shutdown: oneshot::Receiver<()>,
    closed: watch::Sender<bool>,
) {
    loop {
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            () = shared.wake_driver.notified() => {}
            message = consumer.recv() => match message {
                Ok(message) => take(&shared, Record::copy(&message, &wire)),
                Err(error) => consumer_error(&shared, &consumer, error),
            },
        }
        flow_control(&shared, &consumer);
    }
    shared.lock().state.revoke_all();
    shared.changed.notify_waiters();
    // Closing commits the stored offsets and leaves the group; it blocks on the
    // brokers, so not on a runtime thread.
    if let Err(error) = tokio::task::spawn_blocking(move || drop(consumer)).await {
        tracing::warn!(topic = %shared.topic, %error, "closing the consumer failed");
    }
    closed.send_replace(true);
}

/// Takes a fetched record into the state.
fn take(shared: &Arc<Shared>, record: Record) {
    let (added, record) = shared.lock().state.add(record, Instant::now());
    match added {
        Added::Queued => shared.changed.notify_waiters(),
        Added::DeadLetter(generation) => {
            tokio::spawn(dead_letter_undecodable(
                Arc::clone(shared),
                record,
                generation,
            ));
        }
        Added::Ignored => {}
    }
}

/// Dead-letters a record that cannot be decoded, retrying until the dead-letter topic
/// takes it or the partition is no longer this subscriber's (its next owner then
/// does it). It is never handed to the application, and its offset is not committed
/// before the dead letter is confirmed.
async fn dead_letter_undecodable(shared: Arc<Shared>, record: Arc<Record>, generation: u64) {
    let reason = match &record.received {
        Err(reason) => reason.clone(),
        Ok(_) => return,
    };
    let (partition, offset) = (record.partition, record.offset);
    tracing::warn!(topic = %shared.topic, partition, offset, %reason, dead_letter_topic = shared.dead_letters.dead_letter_topic(), "dead-lettering a record that cannot be decoded");
    let mut backoff = Duration::from_millis(100);
    loop {
        match shared.dead_letters.write(&record, &reason).await {
            Ok(()) => {
                shared.settle(partition, offset, generation);
                return;
            }
            Err(error) => {
                tracing::warn!(topic = %shared.topic, partition, offset, %error, ?backoff, "dead-lettering an undecodable record failed; retrying");
            }
        }
        if !shared.holds(partition, generation) {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_DEAD_LETTER_BACKOFF);
    }
}

/// An error the consumer reported while polling.
fn consumer_error(shared: &Shared, consumer: &Consumer, error: KafkaError) {
    let fatal = match &error {
        KafkaError::MessageConsumptionFatal(code) => Some(code.to_string()),
        _ => consumer
            .client()
            .fatal_error()
            .map(|(code, reason)| format!("{code}: {reason}")),
    };
    let mut inner = shared.lock();
    if let Some(reason) = fatal {
        tracing::error!(topic = %shared.topic, group = %shared.group, %reason, "the Kafka consumer failed fatally");
        inner.stopped = Some(reason);
    } else {
        match error.rdkafka_error_code() {
            Some(
                code @ (RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic),
            ) => {
                inner.pending_error = Some(KafkaTransportError::UnknownTopic {
                    topic: shared.topic.clone(),
                    brokers: shared.brokers.clone(),
                    code,
                });
            }
            Some(RDKafkaErrorCode::AllBrokersDown) => {
                inner.pending_error = Some(KafkaTransportError::client(
                    format!("consume from {:?}", shared.topic),
                    error,
                ));
            }
            _ => {
                tracing::warn!(topic = %shared.topic, group = %shared.group, %error, "consumer error");
                return;
            }
        }
    }
    drop(inner);
    shared.changed.notify_waiters();
}

/// Pauses fetching while the subscriber holds `max_buffered` records or more, and
/// resumes once half of them are settled.
fn flow_control(shared: &Shared, consumer: &Consumer) {
    let pause = {
        let mut inner = shared.lock();
        let buffered = inner.state.buffered();
        if !inner.paused && buffered >= shared.max_buffered {
            inner.paused = true;
            true
        } else if inner.paused && buffered <= shared.max_buffered / 2 {
            inner.paused = false;
            false
        } else {
            return;
        }
    };
    let applied = consumer.assignment().and_then(|assignment| {
        if pause {
            consumer.pause(&assignment)
        } else {
            consumer.resume(&assignment)
        }
    });
    match applied {
        Ok(()) => tracing::debug!(topic = %shared.topic, pause, "flow control"),
        Err(error) => {
            tracing::warn!(topic = %shared.topic, pause, %error, "pausing or resuming failed")
        }
    }
}
