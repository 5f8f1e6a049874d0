//! NATS JetStream: a stream of the benchmark's own capturing its subjects, emptied
//! before every run.
//!
//! The raw client's step is what an application would write with async-nats: a
//! JetStream context on a connection of its own, with the same settings as oncebox's
//! publisher (request timeout, PubAcks in flight), every message of the batch published
//! at once with the same headers (the CloudEvents attributes, the message's headers and
//! `Nats-Msg-Id`), then every PubAck awaited. oncebox's publisher gets the relay's
//! concurrent publishes, each waiting for its own PubAck on one connection.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, ContextBuilder};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use futures_util::future::try_join_all;
use oncebox::MessageId;
use oncebox::nats::{
    JetStreamOptions, JetStreamPublisher, JetStreamTransport, StreamSettings, StreamStorage,
};
use oncebox::wire::WireFormat;

use super::BenchTransport;

/// The request timeout (PubAck wait) of both clients: oncebox's default.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The PubAcks both clients may have in flight: oncebox's default.
const MAX_IN_FLIGHT: usize = 4096;

/// The NATS server of the benchmark, the oncebox transport and the raw client on it.
pub(crate) struct NatsBench {
    transport: JetStreamTransport,
    /// The raw client's JetStream context, on a connection of its own.
    raw: jetstream::Context,
    format: WireFormat,
    stream: String,
    /// The servers that keep the stream.
    replicas: u8,
    /// The server or the cluster's seeds, and the subjects' prefix, for the relay
    /// processes' configuration.
    url: String,
    prefix: String,
    runs: u64,
    topic: String,
}

impl NatsBench {
    /// Connects to `url` (a server, or a cluster's seeds separated by commas), else
    /// `ONCEBOX_NATS_URL`, else `nats://127.0.0.1:4222`, and creates the benchmark's
    /// stream on `replicas` servers.
    pub(crate) async fn open(url: Option<&str>, replicas: u8) -> anyhow::Result<Self> {
        let url = match url {
            Some(url) => url.to_owned(),
            None => std::env::var(oncebox::nats::URL_ENV)
                .unwrap_or_else(|_| oncebox::nats::DEFAULT_URL.to_owned()),
        };
        let id = MessageId::new().to_string().replace('-', "");
        let servers: Vec<&str> = url.split(',').map(str::trim).collect();
        let prefix = format!("oncebox-bench.{id}.");
        let options = servers[1..]
            .iter()
            .fold(JetStreamOptions::new(servers[0]), |options, server| {
                options.server(*server)
            })
            .name("oncebox-bench")
            .subject_prefix(prefix.clone())
            .request_timeout(REQUEST_TIMEOUT)
            .max_in_flight(MAX_IN_FLIGHT);
        let transport = JetStreamTransport::connect(options)
            .await
            .context("connecting oncebox's NATS JetStream transport")?;
        let stream = format!("ONCEBOX_BENCH_{id}");
        // File storage and the default two-minute duplicate window: what a relay's
        // stream would have.
        transport
            .ensure_stream(
                &StreamSettings::new(stream.as_str())
                    .topic(">")
                    .storage(StreamStorage::File)
                    .replicas(usize::from(replicas)),
            )
            .await
            .context("creating the benchmark's stream")?;
        let client = async_nats::ConnectOptions::new()
            .name("oncebox-bench (raw)")
            .request_timeout(Some(REQUEST_TIMEOUT))
            .connect(servers.as_slice())
            .await
            .context("connecting the raw async-nats client")?;
        let raw = ContextBuilder::new()
            .timeout(REQUEST_TIMEOUT)
            .max_ack_inflight(MAX_IN_FLIGHT)
            .backpressure_on_inflight(true)
            .build(client);
        Ok(Self {
            transport,
            raw,
            format: WireFormat::nats(),
            stream,
            replicas,
            url: url.clone(),
            prefix,
            runs: 0,
            topic: String::new(),
        })
    }

    /// The headers oncebox's publisher gives `message`.
    fn headers(&self, message: &oncebox::Message) -> anyhow::Result<HeaderMap> {
        let mut headers = HeaderMap::new();
        for (name, value) in self.format.encode(message) {
            headers.insert(
                HeaderName::from_str(&name).context("a header name")?,
                HeaderValue::from_str(&value).context("a header value")?,
            );
        }
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            HeaderValue::from_str(&message.id.to_string()).context("the message id")?,
        );
        Ok(headers)
    }

    async fn stream_info(&self) -> anyhow::Result<jetstream::stream::Info> {
        let mut stream = self.raw.get_stream(self.stream.as_str()).await?;
        Ok(stream.info().await?.clone())
    }
}

impl BenchTransport for NatsBench {
    type Publisher = JetStreamPublisher;

    fn topic(&self) -> &str {
        &self.topic
    }

    /// A new topic; the stream is emptied of the previous run's messages.
    async fn reset(&mut self) -> anyhow::Result<()> {
        self.raw
            .get_stream(self.stream.as_str())
            .await?
            .purge()
            .await
            .context("emptying the benchmark's stream")?;
        self.runs += 1;
        self.topic = format!("relay-{}", self.runs);
        Ok(())
    }

    async fn publisher(&self) -> anyhow::Result<JetStreamPublisher> {
        Ok(self.transport.publisher())
    }

    /// Every message of the batch published at once, then every PubAck awaited.
    async fn publish_raw(&self, batch: &[oncebox::Message]) -> anyhow::Result<()> {
        let mut acks: Vec<PublishAckFuture> = Vec::with_capacity(batch.len());
        for message in batch {
            let publish = PublishMessage::build()
                .payload(message.payload.clone())
                .headers(self.headers(message)?);
            let subject = self.transport.options().subject(&message.topic);
            acks.push(self.raw.send_publish(subject, publish).await?);
        }
        try_join_all(acks.into_iter().map(std::future::IntoFuture::into_future)).await?;
        Ok(())
    }

    async fn published(&self) -> anyhow::Result<u64> {
        Ok(self.stream_info().await?.state.messages)
    }

    fn relay_config(&self) -> anyhow::Result<String> {
        Ok(format!(
            "url = {:?}\nsubject_prefix = {:?}\nstream = {:?}\nstream_replicas = {}\n",
            self.url, self.prefix, self.stream, self.replicas
        ))
    }

    /// Deletes the benchmark's stream.
    async fn close(self) -> anyhow::Result<()> {
        self.raw
            .delete_stream(self.stream.as_str())
            .await
            .context("deleting the benchmark's stream")?;
        Ok(())
    }
}
