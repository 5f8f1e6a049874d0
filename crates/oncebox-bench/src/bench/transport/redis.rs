//! Redis Streams: a stream per run, under a key prefix of the benchmark's own.
//!
//! The raw client's step is what an application would write with the `redis` crate: one
//! pipeline per batch holding one `XADD` per message, with the same fields as oncebox's
//! publisher (CloudEvents attributes, headers, `data`), sent at once on a multiplexed
//! connection, the batch done when every reply is in. oncebox's publisher gets the same
//! `XADD`s as concurrent single publishes, one per key, and sends those that gather while
//! its last pipeline is out as one pipeline.

use anyhow::Context as _;
use oncebox::MessageId;
use oncebox::redis::{RedisStreamOptions, RedisStreamPublisher, RedisStreams};
use oncebox::wire::WireFormat;

use super::BenchTransport;

/// The Redis server of the benchmark, the oncebox transport and the raw client on it.
pub(crate) struct RedisStreamsBench {
    streams: RedisStreams,
    raw: ::redis::aio::ConnectionManager,
    format: WireFormat,
    /// Every key of the benchmark starts with it, so that closing finds them all.
    prefix: String,
    runs: u64,
    topic: String,
}

impl RedisStreamsBench {
    /// Connects to `url`, else `ONCEBOX_REDIS_URL`, else `redis://127.0.0.1:6379`.
    pub(crate) async fn open(url: Option<&str>) -> anyhow::Result<Self> {
        let url = match url {
            Some(url) => url.to_owned(),
            None => std::env::var(oncebox::redis::streams::URL_ENV)
                .unwrap_or_else(|_| oncebox::redis::streams::DEFAULT_URL.to_owned()),
        };
        let prefix = format!("oncebox-bench:{}:", MessageId::new());
        let options = RedisStreamOptions::new().key_prefix(prefix.clone());
        let streams = RedisStreams::connect(&url, options)
            .await
            .context("connecting oncebox's Redis Streams transport")?;
        // The same kind of connection oncebox's publisher uses: one multiplexed
        // connection that reconnects by itself.
        let client = ::redis::Client::open(url.as_str()).context("the Redis URL")?;
        let raw = ::redis::aio::ConnectionManager::new(client)
            .await
            .context("connecting the raw Redis client")?;
        Ok(Self {
            streams,
            raw,
            format: WireFormat::redis(),
            prefix,
            runs: 0,
            topic: String::new(),
        })
    }
}

impl BenchTransport for RedisStreamsBench {
    type Publisher = RedisStreamPublisher;

    fn topic(&self) -> &str {
        &self.topic
    }

    /// A new stream; the previous run's is deleted.
    async fn reset(&mut self) -> anyhow::Result<()> {
        if !self.topic.is_empty() {
            let mut connection = self.raw.clone();
            let _: i64 = ::redis::cmd("DEL")
                .arg(self.streams.stream_key(&self.topic))
                .query_async(&mut connection)
                .await?;
        }
        self.runs += 1;
        self.topic = format!("relay-{}", self.runs);
        Ok(())
    }

    async fn publisher(&self) -> anyhow::Result<RedisStreamPublisher> {
        Ok(self.streams.publisher())
    }

    /// One pipeline of `XADD`s for the whole batch.
    async fn publish_raw(&self, batch: &[oncebox::Message]) -> anyhow::Result<()> {
        let mut pipeline = ::redis::pipe();
        for message in batch {
            let command = pipeline
                .cmd("XADD")
                .arg(self.streams.stream_key(&message.topic))
                .arg("*");
            for (name, value) in self.format.encode(message) {
                command.arg(name).arg(value);
            }
            command.arg("data").arg(&message.payload[..]);
        }
        let mut connection = self.raw.clone();
        let ids: Vec<::redis::Value> = pipeline.query_async(&mut connection).await?;
        anyhow::ensure!(
            ids.len() == batch.len(),
            "Redis confirmed {} of {} XADDs",
            ids.len(),
            batch.len()
        );
        Ok(())
    }

    async fn published(&self) -> anyhow::Result<u64> {
        let mut connection = self.raw.clone();
        let length: u64 = ::redis::cmd("XLEN")
            .arg(self.streams.stream_key(&self.topic))
            .query_async(&mut connection)
            .await?;
        Ok(length)
    }

    /// Deletes every key under the benchmark's prefix.
    async fn close(self) -> anyhow::Result<()> {
        let mut connection = self.raw.clone();
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = ::redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{}*", self.prefix))
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut connection)
                .await?;
            if !keys.is_empty() {
                let _: i64 = ::redis::cmd("DEL")
                    .arg(&keys)
                    .query_async(&mut connection)
                    .await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}
