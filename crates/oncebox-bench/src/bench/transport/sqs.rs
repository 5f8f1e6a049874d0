//! Amazon SQS: a FIFO queue (and its dead-letter queue) per run, under a name prefix of
//! the benchmark's own, on the local SQS-compatible server unless `--broker-url` names
//! another endpoint.
//!
//! The raw client's step is what an application would write with `aws-sdk-sqs`: the
//! claimed batch cut into `SendMessageBatch` requests of ten entries (SQS's most), all
//! sent at once on the same client, each entry with the attributes oncebox's publisher
//! gives it (the CloudEvents `ce_` attributes and the message's headers), the key as
//! `MessageGroupId` and the id as `MessageDeduplicationId`; the batch is done when every
//! response lists each of its entries as successful. oncebox's publisher gets the relay's
//! concurrent publishes, gathers them into batches of ten itself and answers each from
//! the response.

use std::collections::HashMap;

use anyhow::Context as _;
use futures_util::future::try_join_all;
use oncebox::MessageId;
use oncebox::sqs::aws_sdk_sqs::types::{
    MessageAttributeValue, QueueAttributeName, SendMessageBatchRequestEntry,
};
use oncebox::sqs::{QueueSettings, SqsOptions, SqsPublisher, SqsTransport};
use oncebox::wire::WireFormat;

use super::BenchTransport;

/// The most entries SQS takes in one `SendMessageBatch`.
const BATCH: usize = 10;

/// The SQS endpoint of the benchmark, the oncebox transport and the raw client on it.
pub(crate) struct SqsBench {
    transport: SqsTransport,
    format: WireFormat,
    /// Every queue of the benchmark starts with it.
    prefix: String,
    runs: u64,
    topic: String,
    /// The URL of the current run's queue.
    queue: Option<String>,
}

impl SqsBench {
    /// Connects to the endpoint `url`, else `ONCEBOX_SQS_ENDPOINT`, else the local server
    /// (`http://127.0.0.1:4566`), with the AWS chain's credentials where it has them and
    /// the local server's placeholder ones otherwise.
    pub(crate) async fn open(url: Option<&str>) -> anyhow::Result<Self> {
        let endpoint = match url {
            Some(url) => url.to_owned(),
            None => std::env::var(oncebox::sqs::ENDPOINT_ENV)
                .unwrap_or_else(|_| "http://127.0.0.1:4566".to_owned()),
        };
        let prefix = format!(
            "obench-{}-",
            &MessageId::new().as_uuid().simple().to_string()[..12]
        );
        let mut options = SqsOptions::new()
            .endpoint(endpoint)
            .queue_prefix(prefix.clone())
            .fifo(true);
        if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
            options = options
                .region("us-east-1")
                .static_credentials("oncebox-bench", "oncebox-bench");
        }
        let transport = SqsTransport::connect(options)
            .await
            .context("connecting oncebox's SQS transport")?;
        Ok(Self {
            transport,
            format: WireFormat::sqs(),
            prefix,
            runs: 0,
            topic: String::new(),
            queue: None,
        })
    }

    /// The URL of the current run's queue.
    fn queue_url(&self) -> anyhow::Result<&str> {
        self.queue
            .as_deref()
            .context("no run started (reset first)")
    }

    /// Entry `index` of a batch: `message` as oncebox's publisher sends it.
    fn entry(
        &self,
        index: usize,
        message: &oncebox::Message,
    ) -> anyhow::Result<SendMessageBatchRequestEntry> {
        let mut attributes = HashMap::new();
        for (name, value) in self.format.encode(message) {
            let value = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()?;
            attributes.insert(name, value);
        }
        Ok(SendMessageBatchRequestEntry::builder()
            .id(index.to_string())
            .message_body(String::from_utf8_lossy(&message.payload))
            .set_message_attributes(Some(attributes))
            .message_group_id(
                message
                    .key
                    .clone()
                    .unwrap_or_else(|| message.id.to_string()),
            )
            .message_deduplication_id(message.id.to_string())
            .build()?)
    }

    /// Deletes every queue under the benchmark's prefix: the run's queue and the
    /// dead-letter queue made beside it.
    async fn delete_queues(&mut self) -> anyhow::Result<()> {
        self.queue = None;
        let client = self.transport.client();
        let listed = client
            .list_queues()
            .queue_name_prefix(&self.prefix)
            .send()
            .await
            .context("listing the benchmark's queues")?;
        for url in listed.queue_urls() {
            client
                .delete_queue()
                .queue_url(url)
                .send()
                .await
                .with_context(|| format!("deleting queue {url}"))?;
        }
        Ok(())
    }
}

impl BenchTransport for SqsBench {
    type Publisher = SqsPublisher;

    fn topic(&self) -> &str {
        &self.topic
    }

    /// A new queue and its dead-letter queue; the previous run's are deleted.
    async fn reset(&mut self) -> anyhow::Result<()> {
        self.delete_queues().await?;
        self.runs += 1;
        self.topic = format!("relay-{}", self.runs);
        let url = self
            .transport
            .ensure_queue(&self.topic, &QueueSettings::new())
            .await
            .with_context(|| format!("creating the queue of {}", self.topic))?;
        self.queue = Some(url);
        Ok(())
    }

    async fn publisher(&self) -> anyhow::Result<SqsPublisher> {
        Ok(self.transport.publisher())
    }

    /// `SendMessageBatch` requests of ten, all in flight at once.
    async fn publish_raw(&self, batch: &[oncebox::Message]) -> anyhow::Result<()> {
        let url = self.queue_url()?;
        let client = self.transport.client();
        let mut requests = Vec::new();
        for chunk in batch.chunks(BATCH) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, message)| self.entry(i, message))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let sent = entries.len();
            requests.push(async move {
                let answer = client
                    .send_message_batch()
                    .queue_url(url)
                    .set_entries(Some(entries))
                    .send()
                    .await
                    .context("SendMessageBatch")?;
                anyhow::ensure!(
                    answer.failed().is_empty() && answer.successful().len() == sent,
                    "SQS confirmed {} of {sent} entries ({:?})",
                    answer.successful().len(),
                    answer.failed().first().map(|failure| failure.code())
                );
                Ok(())
            });
        }
        try_join_all(requests).await?;
        Ok(())
    }

    /// The queue's visible messages, as SQS counts them (exact on the local server; an
    /// approximation on AWS).
    async fn published(&self) -> anyhow::Result<u64> {
        let attributes = self
            .transport
            .client()
            .get_queue_attributes()
            .queue_url(self.queue_url()?)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .context("reading the queue's attributes")?;
        let count = attributes
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::ApproximateNumberOfMessages))
            .context("SQS did not return the message count")?;
        Ok(count.parse()?)
    }

    /// Deletes the last run's queues (the earlier runs' went at each reset).
    async fn close(mut self) -> anyhow::Result<()> {
        self.delete_queues().await
    }
}
