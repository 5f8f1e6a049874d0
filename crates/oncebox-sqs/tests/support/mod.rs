//! The SQS harness of the transport conformance suite, shared by the test files.
//!
//! Every topic gets queues of its own (`obt-<label>-<uuid>`, FIFO or standard, and their
//! dead-letter queues) on the machine's SQS-compatible server (`ONCEBOX_SQS_ENDPOINT`,
//! default `http://127.0.0.1:4566`, started by `scripts/services.sh sqs`), so tests run
//! in parallel and again; `cleanup` deletes them.

#![allow(dead_code, unreachable_pub)]

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use oncebox_core::{MessageId, Received, Result};
use oncebox_sqs::{
    ENDPOINT_ENV, QueueSettings, SqsOptions, SqsPublisher, SqsSubscriber, SqsTransport,
    SubscriberOptions,
};
use oncebox_testkit::transport::{Capabilities, TransportHarness};

pub fn endpoint() -> String {
    std::env::var(ENDPOINT_ENV).unwrap_or_else(|_| "http://127.0.0.1:4566".to_owned())
}

/// A name no other test (or earlier run) uses.
pub fn unique() -> String {
    MessageId::new().as_uuid().simple().to_string()
}

/// Options for the local server: its endpoint, any credentials.
pub fn local_options() -> SqsOptions {
    SqsOptions::new()
        .endpoint(endpoint())
        .region("us-east-1")
        .static_credentials("oncebox", "oncebox")
}

/// The visibility timeout the checks run with: extended every third of it while held.
pub const VISIBILITY: Duration = Duration::from_secs(1);
/// The lease (the ack timeout the checks see): 3 s, so that a nack's delay (a third of
/// it) is a whole second, as SQS counts.
pub const MAX_LEASE: Duration = Duration::from_secs(3);

pub struct SqsHarness {
    pub transport: SqsTransport,
    fifo: bool,
    topics: Mutex<Vec<String>>,
}

impl SqsHarness {
    /// A harness whose topics are FIFO queues (`fifo`) or standard ones.
    pub async fn new(fifo: bool) -> Self {
        Self::with_options(fifo, |options| options).await
    }

    pub async fn with_options(fifo: bool, edit: impl FnOnce(SqsOptions) -> SqsOptions) -> Self {
        let options = edit(
            local_options().fifo(fifo).subscriber(
                SubscriberOptions::new()
                    .visibility_timeout(VISIBILITY)
                    .max_lease(MAX_LEASE)
                    .wait_time(Duration::from_secs(1)),
            ),
        );
        Self {
            transport: SqsTransport::connect(options).await.expect("an SQS client"),
            fifo,
            topics: Mutex::new(Vec::new()),
        }
    }

    /// A fresh topic whose queues exist.
    pub async fn topic(&self, label: &str, settings: &QueueSettings) -> Result<String> {
        // Queue names have at most 80 characters, `-dlq.fifo` included.
        let label: String = label.chars().take(24).collect();
        let topic = format!("obt-{label}-{}", unique());
        self.transport.ensure_queue(&topic, settings).await?;
        self.topics
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(topic.clone());
        Ok(topic)
    }

    /// Deletes the queues of every topic made.
    pub async fn cleanup(&self) {
        let topics =
            std::mem::take(&mut *self.topics.lock().unwrap_or_else(PoisonError::into_inner));
        for topic in topics {
            let _ = self.transport.delete_queues(&topic).await;
        }
    }
}

impl TransportHarness for SqsHarness {
    type Publisher = SqsPublisher;
    type Subscriber = SqsSubscriber;

    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .per_key_order(self.fifo)
            .dead_letter_inspection(true)
            .delivery_count(true)
            .nack_delay(true)
    }

    fn ack_timeout(&self) -> Duration {
        MAX_LEASE
    }

    async fn fresh_topic(&self, label: &str) -> Result<String> {
        self.topic(label, &QueueSettings::new()).await
    }

    async fn publisher(&self) -> Result<SqsPublisher> {
        Ok(self.transport.publisher())
    }

    async fn subscriber(&self, topic: &str, _group: &str) -> Result<SqsSubscriber> {
        self.transport.subscriber(topic).await
    }

    async fn dead_letters(&self, topic: &str) -> Result<Vec<(Received, String)>> {
        Ok(self
            .transport
            .dead_letters(topic, 10_000)
            .await?
            .into_iter()
            .map(|letter| (letter.received, letter.reason))
            .collect())
    }
}
