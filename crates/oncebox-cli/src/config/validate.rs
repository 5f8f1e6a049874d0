//! The checks the types alone do not make: limits, URLs, the layout, and what the
//! keys require of one another.

use super::broker::{MAX_STREAM_REPLICAS, nats_user};
use super::{BrokerKind, Config, ConfigError, Layout, RelayMode, StoreKind};

impl Config {
    /// Checks what the types alone do not: limits, URLs, the layout.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let positive = |key: &str, value: i64| {
            if value < 1 {
                Err(ConfigError::key(
                    key,
                    format!("must be at least 1, not {value}"),
                ))
            } else {
                Ok(())
            }
        };
        positive("relay.batch_size", self.relay.batch_size)?;
        positive("relay.concurrency", self.relay.concurrency)?;
        positive("relay.max_attempts", self.relay.max_attempts)?;
        positive("relay.workers", self.relay.workers)?;
        positive("receive.lanes", self.receive.lanes)?;
        positive("receive.max_attempts", self.receive.max_attempts)?;
        positive("store.pool_size", i64::from(self.store.pool_size))?;
        for (key, span) in [
            ("relay.lease", self.relay.lease),
            ("relay.publish_timeout", self.relay.publish_timeout),
            ("relay.poll_max", self.relay.poll_max),
            ("relay.retry_initial", self.relay.retry_initial),
            ("relay.retry_max", self.relay.retry_max),
            ("relay.retention", self.relay.retention),
            ("relay.cleanup_interval", self.relay.cleanup_interval),
            ("relay.stats_interval", self.relay.stats_interval),
            ("relay.stop_timeout", self.relay.stop_timeout),
            ("receive.cleanup_interval", self.receive.cleanup_interval),
            ("receive.stop_timeout", self.receive.stop_timeout),
            ("receive.dedup_window", self.receive.dedup_window),
            ("store.connect_timeout", self.store.connect_timeout),
            ("broker.connect_timeout", self.broker.connect_timeout),
        ] {
            if span.get().is_zero() {
                return Err(ConfigError::key(key, "must be above zero"));
            }
        }
        if self.relay.retry_max < self.relay.retry_initial {
            return Err(ConfigError::key(
                "relay.retry_max",
                format!(
                    "must not be shorter than relay.retry_initial ({})",
                    self.relay.retry_initial
                ),
            ));
        }
        if let Some(url) = &self.store.url {
            // A relay loop with held claims (PostgreSQL's default) holds a connection for
            // the batch in flight and one for the claim ahead; the pool also serves the
            // readiness checks, the backlog readings and the cleanup.
            let per_loop = if url.kind() == StoreKind::Postgres && self.outbox.held_claims {
                2
            } else {
                1
            };
            // Saturating: a huge relay.workers must fail this check, not wrap past it.
            let needed = self
                .relay
                .workers
                .max(0)
                .saturating_mul(per_loop)
                .saturating_add(2);
            if i64::from(self.store.pool_size) < needed {
                return Err(ConfigError::key(
                    "store.pool_size",
                    format!(
                        "{} connections cannot serve {} relay loop(s) (relay.workers); set at least {needed}",
                        self.store.pool_size, self.relay.workers
                    ),
                ));
            }
        }
        if self.relay.publish_timeout.get() >= self.relay.lease.get() {
            return Err(ConfigError::key(
                "relay.publish_timeout",
                "must be shorter than relay.lease",
            ));
        }
        if let Some(url) = &self.broker.url {
            let kind = BrokerKind::of(url)?;
            if kind == BrokerKind::Nats {
                nats_user(url)?;
            }
            if kind == BrokerKind::RabbitMq {
                super::rabbitmq_nodes(url)?;
            }
            if kind == BrokerKind::Sqs {
                super::sqs_url(url)?;
                for (topic, queue) in &self.topics {
                    super::sqs::check_queue(queue)
                        .map_err(|problem| ConfigError::key(&format!("topics.{topic}"), problem))?;
                }
                if self.broker.password.is_some() {
                    return Err(ConfigError::key(
                        "broker.password",
                        "not used by SQS: credentials come from the AWS chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, an instance role)",
                    ));
                }
            }
            if self.broker.cluster && kind != BrokerKind::RedisStreams {
                return Err(ConfigError::key(
                    "broker.cluster",
                    "only for Redis (a redis:// URL naming the cluster's nodes)",
                ));
            }
        }
        if !(1..=MAX_STREAM_REPLICAS).contains(&self.broker.stream_replicas) {
            return Err(ConfigError::key(
                "broker.stream_replicas",
                format!(
                    "must be 1 to {MAX_STREAM_REPLICAS} (the servers of a NATS cluster that keep the stream), not {}",
                    self.broker.stream_replicas
                ),
            ));
        }
        if self.broker.stream_replicas > 1 && self.broker.stream.is_none() {
            return Err(ConfigError::key(
                "broker.stream_replicas",
                "applies to the stream named by broker.stream, which is not set",
            ));
        }
        if self.broker.stream.is_some() && self.broker.subject_prefix.is_empty() {
            return Err(ConfigError::key(
                "broker.stream",
                "needs broker.subject_prefix (such as \"shop.\"): the stream captures the subjects under it, and one over every subject would capture JetStream's own",
            ));
        }
        if self.outbox.layout == Layout::Debezium
            && let Some(url) = &self.store.url
            && url.kind() != StoreKind::Postgres
        {
            return Err(ConfigError::key(
                "outbox.layout",
                "the Debezium layout needs PostgreSQL (store.url postgres://…)",
            ));
        }
        if self.relay.mode == RelayMode::Cdc {
            if let Some(url) = &self.store.url
                && url.kind() != StoreKind::Postgres
            {
                return Err(ConfigError::key(
                    "relay.mode",
                    "cdc tails PostgreSQL's log: it needs store.url postgres://…",
                ));
            }
            if self.outbox.layout == Layout::Debezium {
                return Err(ConfigError::key(
                    "relay.mode",
                    "cdc reads oncebox's outbox table or its messages, not the Debezium layout",
                ));
            }
            if self.cdc.max_in_flight <= 0 {
                return Err(ConfigError::key("cdc.max_in_flight", "must be positive"));
            }
            self.cdc_options()
                .map_err(|error| ConfigError::key("cdc", error))?;
        }
        self.http.address()?;
        self.otel.validate()?;
        self.dashboard.validate()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    /// Found with the fuzz target `config`: `relay.workers` near `i64::MAX` overflowed the
    /// pool-size check (a panic in debug builds; in release builds it wrapped, passed, and
    /// the relay would have started that many loops).
    #[test]
    fn a_huge_worker_count_fails_the_pool_check() {
        let text = "[store]\nurl = \"sqlite://x.db\"\n[relay]\nworkers = 9223372036854775807\n";
        let error = Config::load_from_text(text, &[]).expect_err("too many workers");
        assert!(error.0.starts_with("store.pool_size:"), "{error}");
    }

    /// A NATS cluster: several seeds in `broker.url`, and the stream kept on 1 to 5 of
    /// its servers, which needs a stream to keep.
    #[test]
    fn a_cluster_takes_seeds_and_a_replicated_stream() {
        let cluster = "[broker]\nurl = \"nats://n1:4222,nats://n2:4222,nats://n3:4222\"\nsubject_prefix = \"shop.\"\n";
        let replicated = format!("{cluster}stream = \"SHOP\"\nstream_replicas = 3\n");
        let config = Config::load_from_text(&replicated, &[]).expect("a valid cluster");
        assert_eq!(config.broker.stream_replicas, 3);
        let from_env = [("ONCEBOX_BROKER__STREAM_REPLICAS".to_owned(), "5".to_owned())];
        let config = Config::load_from_text(&replicated, &from_env).expect("five replicas");
        assert_eq!(config.broker.stream_replicas, 5);
        for (text, needle) in [
            (
                format!("{cluster}stream = \"SHOP\"\nstream_replicas = 0\n"),
                "broker.stream_replicas: must be 1 to 5",
            ),
            (
                format!("{cluster}stream = \"SHOP\"\nstream_replicas = 6\n"),
                "broker.stream_replicas: must be 1 to 5",
            ),
            (
                format!("{cluster}stream = \"SHOP\"\nstream_replicas = -1\n"),
                "broker.stream_replicas",
            ),
            (
                format!("{cluster}stream_replicas = 3\n"),
                "broker.stream_replicas: applies to the stream named by broker.stream",
            ),
            (
                "[broker]\nurl = \"nats://n1:4222,n2:4222\"\n".to_owned(),
                "broker.url: server 2 of 2",
            ),
        ] {
            let error = Config::load_from_text(&text, &[]).expect_err(needle);
            assert!(error.0.starts_with(needle), "{text}: {error}");
        }
    }
}
