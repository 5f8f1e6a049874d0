//! Kafka: a topic per run, named for the benchmark, deleted when the next run starts.
//!
//! The raw client's step is what an application would write with rdkafka: a
//! `FutureProducer` of its own with exactly oncebox's producer settings
//! ([`KafkaOptions::producer_config`]: idempotent, `acks=all`, the same `linger.ms` and
//! requests in flight, the same partitioner), every message of the batch handed to it at
//! once with the same key and headers (the CloudEvents attributes and the message's
//! headers), then every delivery report awaited. oncebox's publisher gets the relay's
//! concurrent publishes, each waiting for its own delivery report; the producer batches
//! them the same way.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::future::try_join_all;
use oncebox::MessageId;
use oncebox::kafka::{KafkaAdmin, KafkaOptions, KafkaPublisher};
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, ClientContext, Message as _, Offset, TopicPartitionList};

use super::BenchTransport;

/// Partitions of each run's topic: enough for the relay's keys to spread.
const PARTITIONS: i32 = 3;

/// The Kafka brokers of the benchmark, oncebox's publisher and the raw producer on them.
pub(crate) struct KafkaBench {
    options: KafkaOptions,
    admin: KafkaAdmin,
    publisher: KafkaPublisher,
    raw: FutureProducer,
    /// Every topic of the benchmark starts with it.
    prefix: String,
    runs: u64,
    topic: String,
}

impl KafkaBench {
    /// Connects to the brokers `url` (a `bootstrap.servers` list), else
    /// `ONCEBOX_KAFKA_BROKERS`, else `127.0.0.1:9092`.
    pub(crate) async fn open(url: Option<&str>) -> anyhow::Result<Self> {
        let options = match url {
            Some(brokers) => KafkaOptions::new(brokers),
            None => KafkaOptions::from_env(),
        }
        .client_id("oncebox-bench");
        let publisher = KafkaPublisher::connect(options.clone())
            .await
            .context("connecting oncebox's Kafka publisher")?;
        let raw = options
            .producer_config()
            .create()
            .context("creating the raw rdkafka producer")?;
        let admin = KafkaAdmin::new(options.clone()).context("creating the Kafka admin client")?;
        Ok(Self {
            options,
            admin,
            publisher,
            raw,
            prefix: format!("oncebox-bench-{}", MessageId::new()),
            runs: 0,
            topic: String::new(),
        })
    }

    /// The headers oncebox's publisher gives `message`.
    fn headers(&self, message: &oncebox::Message) -> OwnedHeaders {
        let fields = self.options.wire_format().encode(message);
        fields.iter().fold(
            OwnedHeaders::new_with_capacity(fields.len()),
            |headers, (name, value)| {
                headers.insert(Header {
                    key: name,
                    value: Some(value.as_bytes()),
                })
            },
        )
    }

    /// Deletes the current run's topic, if there is one.
    async fn delete_topic(&self) -> anyhow::Result<()> {
        if self.topic.is_empty() {
            return Ok(());
        }
        self.admin
            .delete_topics(&[self.topic.as_str()])
            .await
            .with_context(|| format!("deleting the benchmark's topic {}", self.topic))
    }
}

impl BenchTransport for KafkaBench {
    type Publisher = KafkaPublisher;

    fn topic(&self) -> &str {
        &self.topic
    }

    /// A new topic; the previous run's is deleted.
    async fn reset(&mut self) -> anyhow::Result<()> {
        self.delete_topic().await?;
        self.runs += 1;
        self.topic = format!("{}-relay-{}", self.prefix, self.runs);
        self.admin
            .create_topic(&self.topic, PARTITIONS, 1)
            .await
            .with_context(|| format!("creating the benchmark's topic {}", self.topic))
    }

    async fn publisher(&self) -> anyhow::Result<KafkaPublisher> {
        Ok(self.publisher.clone())
    }

    /// Every message of the batch handed to the producer at once, then every delivery
    /// report awaited.
    async fn publish_raw(&self, batch: &[oncebox::Message]) -> anyhow::Result<()> {
        let mut reports = Vec::with_capacity(batch.len());
        for message in batch {
            let mut record = FutureRecord::to(&message.topic)
                .payload(&message.payload[..])
                .headers(self.headers(message));
            if let Some(key) = &message.key {
                record = record.key(key.as_bytes());
            }
            let report = self
                .raw
                .send_result(record)
                .map_err(|(error, _)| error)
                .context("queueing a message (the producer's queue is full?)")?;
            reports.push(report);
        }
        for delivered in try_join_all(reports)
            .await
            .context("the producer was dropped")?
        {
            delivered
                .map_err(|(error, _)| error)
                .context("a message was not delivered")?;
        }
        Ok(())
    }

    /// The records on the current topic: from each partition's low watermark to its
    /// end. The end is found by reading from the high watermark on to end-of-partition,
    /// since tansu 0.6 reports a high watermark short of the last batch's records.
    async fn published(&self) -> anyhow::Result<u64> {
        let mut config = self
            .options
            .consumer_config(&format!("{}-counter", self.prefix));
        config.set("enable.partition.eof", "true");
        let topic = self.topic.clone();
        tokio::task::spawn_blocking(move || count_records(&config, &topic))
            .await
            .context("the record counter panicked")?
    }

    /// Deletes the last run's topic.
    async fn close(self) -> anyhow::Result<()> {
        self.delete_topic().await
    }
}

/// Counts the records of `topic` (blocking): for each partition, from its low watermark
/// to the end-of-partition reached by reading on from its high watermark.
fn count_records(config: &ClientConfig, topic: &str) -> anyhow::Result<u64> {
    let consumer: BaseConsumer<QuietEof> = config
        .create_with_context(QuietEof)
        .context("creating the record counter")?;
    let timeout = Duration::from_secs(10);
    let mut assignment = TopicPartitionList::new();
    let mut starts = HashMap::new();
    let mut ends = HashMap::new();
    for partition in 0..PARTITIONS {
        let (low, high) = consumer
            .fetch_watermarks(topic, partition, timeout)
            .with_context(|| format!("reading the watermarks of {topic}"))?;
        starts.insert(partition, low);
        ends.insert(partition, high);
        assignment.add_partition_offset(topic, partition, Offset::Offset(high))?;
    }
    consumer.assign(&assignment)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut open: HashSet<i32> = (0..PARTITIONS).collect();
    while !open.is_empty() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{topic} not read to its end in 30 s"
        );
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(message)) => {
                let end = ends.entry(message.partition()).or_insert(0);
                *end = (*end).max(message.offset() + 1);
            }
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                open.remove(&partition);
            }
            Some(Err(error)) => return Err(error).context("counting the records"),
        }
    }
    Ok(ends
        .iter()
        .map(|(partition, end)| {
            let start = starts.get(partition).copied().unwrap_or(0);
            u64::try_from(end - start).unwrap_or(0)
        })
        .sum())
}

/// The record counter's client context: end-of-partition is what it waits for, not an
/// error to log (rdkafka's default context logs it as one).
struct QuietEof;

impl ClientContext for QuietEof {
    fn error(&self, error: KafkaError, reason: &str) {
        if !matches!(error, KafkaError::PartitionEOF(_)) {
            tracing::warn!(%error, reason, "Kafka client error while counting records");
        }
    }
}

impl ConsumerContext for QuietEof {}
