//! A check in progress: its own topic, a publisher, and bounded waits that fail with
//! the check's name.

use std::time::Duration;

use oncebox_core::{Delivery, Message, MessageId, Publisher, Result, Subscriber};
use tokio::time::{Instant, sleep, timeout_at};

use super::TransportHarness;

/// Pause before retrying a call that failed transiently (broker restarting).
pub(super) const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// The delivery type of a harness's subscribers.
pub(super) type DeliveryOf<H> = <<H as TransportHarness>::Subscriber as Subscriber>::Delivery;

pub(super) struct Check<'h, H: TransportHarness> {
    pub(super) name: &'static str,
    pub(super) harness: &'h H,
    pub(super) topic: String,
    publisher: H::Publisher,
}

impl<'h, H: TransportHarness> Check<'h, H> {
    /// Starts check `name` on a fresh topic.
    pub(super) async fn start(harness: &'h H, name: &'static str) -> Result<Self> {
        let topic = harness.fresh_topic(&name.replace('_', "-")).await?;
        let publisher = harness.publisher().await?;
        Ok(Self {
            name,
            harness,
            topic,
            publisher,
        })
    }

    /// How long something that should happen promptly may take.
    pub(super) fn patience(&self) -> Duration {
        self.harness.patience()
    }

    pub(super) fn ack_timeout(&self) -> Duration {
        self.harness.ack_timeout()
    }

    /// Long enough for a redelivery to show up if one were coming.
    pub(super) fn quiet_period(&self) -> Duration {
        self.ack_timeout() * 2
    }

    /// How long a redelivery after the ack timeout may take.
    pub(super) fn redelivery_wait(&self) -> Duration {
        self.ack_timeout() + self.patience()
    }

    /// A group name unique to this check (group names are global on some brokers).
    pub(super) fn group(&self, label: &str) -> String {
        format!("{}-{label}", self.topic)
    }

    pub(super) async fn subscribe(&self, label: &str) -> Result<H::Subscriber> {
        self.harness
            .subscriber(&self.topic, &self.group(label))
            .await
    }

    /// `count` messages to this check's topic, payload `"0"`, `"1"`..., cycling over
    /// `keys` keys (none if `keys` is 0).
    pub(super) fn messages(&self, count: usize, keys: usize) -> Vec<Message> {
        (0..count)
            .map(|i| {
                let message = Message::new(self.topic.clone(), i.to_string());
                if keys == 0 {
                    message
                } else {
                    message.with_key(format!("key-{}", i % keys))
                }
            })
            .collect()
    }

    /// Publishes `messages` one after the other, retrying transient failures for as long
    /// as [`TransportHarness::patience`] allows.
    pub(super) async fn publish(&self, messages: &[Message]) -> Result<Vec<MessageId>> {
        for message in messages {
            let deadline = Instant::now() + self.patience();
            loop {
                match self.publisher.publish(message).await {
                    Ok(()) => break,
                    Err(error) if error.is_transient() && Instant::now() < deadline => {
                        sleep(RETRY_PAUSE).await
                    }
                    Err(error) => return Err(error),
                }
            }
        }
        Ok(messages.iter().map(|m| m.id).collect())
    }

    /// The next delivery, waiting up to `within` and retrying transient failures.
    ///
    /// # Panics
    ///
    /// If nothing arrives in time: "`[check] what`: nothing delivered within ...".
    pub(super) async fn receive(
        &self,
        subscriber: &mut H::Subscriber,
        within: Duration,
        what: &str,
    ) -> Result<DeliveryOf<H>> {
        let deadline = Instant::now() + within;
        loop {
            match timeout_at(deadline, subscriber.next()).await {
                Ok(Ok(delivery)) => return Ok(delivery),
                Ok(Err(error)) if error.is_transient() => sleep(RETRY_PAUSE).await,
                Ok(Err(error)) => return Err(error),
                Err(_) => panic!(
                    "[{}] {what}: nothing delivered within {within:?}",
                    self.name
                ),
            }
        }
    }

    /// Waits `period` and fails if anything is delivered meanwhile.
    ///
    /// # Panics
    ///
    /// On a delivery: "`[check] what`: ..." with the delivery.
    pub(super) async fn expect_nothing(
        &self,
        subscriber: &mut H::Subscriber,
        period: Duration,
        what: &str,
    ) -> Result<()> {
        let deadline = Instant::now() + period;
        loop {
            match timeout_at(deadline, subscriber.next()).await {
                Err(_) => return Ok(()),
                Ok(Ok(delivery)) => panic!("[{}] {what}: {:?}", self.name, delivery.received()),
                Ok(Err(error)) if error.is_transient() => sleep(RETRY_PAUSE).await,
                Ok(Err(error)) => return Err(error),
            }
        }
    }

    /// The id of a delivery, which every transport must carry.
    pub(super) fn id_of(&self, delivery: &DeliveryOf<H>) -> MessageId {
        match delivery.received().id {
            Some(id) => id,
            None => panic!(
                "[{}] a message published with an id arrived without it: {:?}",
                self.name,
                delivery.received()
            ),
        }
    }

    /// Asserts the delivery count of a redelivery, if the transport counts.
    pub(super) fn assert_redelivery_count(&self, delivery: &DeliveryOf<H>) {
        let count = delivery.received().delivery_count;
        if self.harness.capabilities().delivery_count {
            assert!(
                count >= 2,
                "[{}] a redelivery reports delivery_count {count}, expected at least 2",
                self.name
            );
        }
    }
}

/// Prints that `check` was skipped for lack of `capability`.
pub(super) fn skipped(check: &str, capability: &str) -> Result<()> {
    eprintln!(
        "oncebox-testkit: skipped transport check {check}: the harness does not declare `{capability}`"
    );
    Ok(())
}
