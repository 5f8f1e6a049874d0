//! RabbitMQ: an exchange of the benchmark's own, and per run a quorum queue bound to it
//! for the run's topic (what a consumer group's queue is), so that every publish is
//! routed and stored.
//!
//! The raw client's step is what an application would write with lapin: one channel in
//! confirm mode on one connection, the batch's `basic.publish`es (mandatory, persistent,
//! the same properties and CloudEvents headers as oncebox's publisher) all sent at
//! once, then every publisher confirm awaited. oncebox's publisher pipelines the relay's
//! concurrent publishes on one confirm channel the same way, answering each once its
//! confirm is in (and it was not returned unroutable).

use anyhow::Context as _;
use futures_util::future::join_all;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use oncebox::MessageId;
use oncebox::rabbitmq::{RabbitOptions, RabbitPublisher};
use oncebox::wire::WireFormat;

use super::BenchTransport;

/// The RabbitMQ server of the benchmark, the oncebox transport's options and the raw
/// client on it.
pub(crate) struct RabbitMqBench {
    options: RabbitOptions,
    connection: Connection,
    /// The raw client's confirm channel.
    channel: Channel,
    /// A channel for declaring, counting and deleting.
    admin: Channel,
    format: WireFormat,
    exchange: String,
    runs: u64,
    topic: String,
}

impl RabbitMqBench {
    /// Connects to `url`, else `ONCEBOX_AMQP_URL`, else the local server as `guest`.
    pub(crate) async fn open(url: Option<&str>) -> anyhow::Result<Self> {
        let url = match url {
            Some(url) => url.to_owned(),
            None => std::env::var(oncebox::rabbitmq::URL_ENV)
                .unwrap_or_else(|_| oncebox::rabbitmq::DEFAULT_URL.to_owned()),
        };
        let exchange = format!("oncebox-bench.{}", MessageId::new());
        let options = RabbitOptions::new(url.clone())
            .exchange(exchange.clone())
            .connection_name("oncebox-bench");
        // Declares the exchange, as the publisher does on every connection.
        RabbitPublisher::connect(&options)
            .await
            .context("connecting oncebox's RabbitMQ publisher")?;
        let connection = Connection::connect(
            &url,
            ConnectionProperties::default().with_connection_name("oncebox-bench (raw)".into()),
        )
        .await
        .context("connecting the raw lapin client")?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let admin = connection.create_channel().await?;
        Ok(Self {
            options,
            connection,
            channel,
            admin,
            format: WireFormat::amqp(),
            exchange,
            runs: 0,
            topic: String::new(),
        })
    }

    fn queue(&self) -> String {
        format!("{}.{}", self.exchange, self.topic)
    }

    async fn delete_queue(&self) -> anyhow::Result<()> {
        if !self.topic.is_empty() {
            self.admin
                .queue_delete(self.queue().into(), QueueDeleteOptions::default())
                .await?;
        }
        Ok(())
    }

    /// The properties oncebox's publisher gives `message`: id, persistence, time, kind,
    /// the CloudEvents attributes and headers as long strings.
    fn properties(&self, message: &oncebox::Message) -> BasicProperties {
        let mut headers = FieldTable::default();
        for (name, value) in self.format.encode(message) {
            if let Ok(name) = ShortString::try_new(name) {
                headers.insert(name, AMQPValue::LongString(LongString::from(value)));
            }
        }
        let mut properties = BasicProperties::default()
            .with_message_id(message.id.to_string().into())
            .with_delivery_mode(2)
            .with_headers(headers);
        if let Ok(since_epoch) = message.created_at.duration_since(std::time::UNIX_EPOCH) {
            properties = properties.with_timestamp(since_epoch.as_secs());
        }
        if let Ok(kind) = ShortString::try_new(message.kind.as_str())
            && !message.kind.is_empty()
        {
            properties = properties.with_type(kind);
        }
        properties
    }
}

impl BenchTransport for RabbitMqBench {
    type Publisher = RabbitPublisher;

    fn topic(&self) -> &str {
        &self.topic
    }

    /// A new topic with a new quorum queue bound for it; the previous run's queue is
    /// deleted.
    async fn reset(&mut self) -> anyhow::Result<()> {
        self.delete_queue().await?;
        self.runs += 1;
        self.topic = format!("relay-{}", self.runs);
        let channel = &self.admin;
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString(LongString::from("quorum")),
        );
        channel
            .queue_declare(
                self.queue().into(),
                QueueDeclareOptions::durable(),
                arguments,
            )
            .await
            .context("declaring the run's queue")?;
        channel
            .queue_bind(
                self.queue().into(),
                self.exchange.as_str().into(),
                self.topic.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .context("binding the run's queue")?;
        Ok(())
    }

    async fn publisher(&self) -> anyhow::Result<RabbitPublisher> {
        Ok(RabbitPublisher::connect(&self.options).await?)
    }

    /// Every `basic.publish` of the batch sent at once, then every confirm awaited.
    async fn publish_raw(&self, batch: &[oncebox::Message]) -> anyhow::Result<()> {
        let options = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let sends = batch.iter().map(|message| {
            self.channel.basic_publish(
                self.exchange.as_str().into(),
                message.topic.as_str().into(),
                options,
                &message.payload,
                self.properties(message),
            )
        });
        let mut confirms = Vec::with_capacity(batch.len());
        for sent in join_all(sends).await {
            confirms.push(sent?);
        }
        for confirmation in join_all(confirms).await {
            let confirmation = confirmation?;
            anyhow::ensure!(confirmation.is_ack(), "RabbitMQ nacked a publish");
            anyhow::ensure!(
                confirmation.take_message().is_none(),
                "RabbitMQ returned a publish as unroutable"
            );
        }
        Ok(())
    }

    async fn published(&self) -> anyhow::Result<u64> {
        let queue = self
            .admin
            .queue_declare(
                self.queue().into(),
                QueueDeclareOptions::durable().passive(),
                FieldTable::default(),
            )
            .await?;
        Ok(u64::from(queue.message_count()))
    }

    /// Deletes the last run's queue and the exchange.
    async fn close(self) -> anyhow::Result<()> {
        self.delete_queue().await?;
        self.admin
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await?;
        self.channel.close(200, "done".into()).await?;
        self.admin.close(200, "done".into()).await?;
        self.connection.close(200, "done".into()).await?;
        Ok(())
    }
}
