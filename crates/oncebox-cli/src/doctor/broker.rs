//! The broker's checks: it answers, and the destination the services need exists.

use std::time::Duration;

use super::Check;
use crate::config::Config;
use crate::service::backend::Broker;

/// How long a check waits for the broker once connected.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The broker's checks.
pub(super) async fn checks(config: &Config) -> Vec<Check> {
    // Connecting as the services do, but creating nothing: without `broker.stream`, the
    // NATS connection does not create the stream.
    let mut probe = config.clone();
    probe.broker.stream = None;
    let broker = match Broker::connect(&probe).await {
        Ok(broker) => broker,
        Err(error) => {
            return vec![Check::fail(
                "broker",
                error.to_string(),
                "check broker.url and broker.password, and that the broker runs and accepts \
                 this host (connecting was tried for broker.connect_timeout)",
            )];
        }
    };
    let mut checks = vec![match broker.check(TIMEOUT).await {
        Ok(()) => Check::pass("broker", format!("{} answers", broker.kind())),
        Err(reason) => Check::fail(
            "broker",
            reason,
            "check that the broker runs and accepts this host",
        ),
    }];
    checks.extend(destinations(config, &broker).await);
    checks
}

/// The subjects (before the broker's prefix) the services of this configuration use and
/// know in advance: the receiver's topic and the `[topics]` destinations.
#[cfg_attr(
    not(any(feature = "nats", feature = "kafka", feature = "sqs")),
    allow(dead_code)
)]
fn named_destinations(config: &Config) -> Vec<String> {
    let mut named: Vec<String> = config.receive.topic.iter().cloned().collect();
    named.extend(config.topics.values().cloned());
    named.sort();
    named.dedup();
    named
}

/// NATS: `broker.stream` exists (or the services create it at start), or else a stream
/// captures each subject the configuration names. Kafka: each topic the configuration
/// names exists, and the receiver's dead-letter topic. SQS: each topic's queue exists.
/// Redis Streams need nothing in
/// advance; RabbitMQ's exchange was checked by connecting (a passive declare, unless the
/// configuration declares it).
async fn destinations(config: &Config, broker: &Broker) -> Vec<Check> {
    match broker {
        #[cfg(feature = "nats")]
        Broker::Nats(transport) => {
            use oncebox::nats::async_nats::jetstream::ErrorCode;
            use oncebox::nats::async_nats::jetstream::context::GetStreamErrorKind;
            let jetstream = oncebox::nats::async_nats::jetstream::new(transport.client().clone());
            if let Some(stream) = &config.broker.stream {
                let found = tokio::time::timeout(TIMEOUT, jetstream.get_stream(stream)).await;
                return vec![match found {
                    Ok(Ok(_)) => Check::pass("stream", format!("{stream} exists")),
                    Ok(Err(error))
                        if matches!(
                            error.kind(),
                            GetStreamErrorKind::JetStream(ref cause)
                                if cause.error_code() == ErrorCode::STREAM_NOT_FOUND
                        ) =>
                    {
                        Check::pass(
                            "stream",
                            format!(
                                "{stream} does not exist yet: relay and receive create it at start"
                            ),
                        )
                    }
                    Ok(Err(error)) => Check::fail(
                        "stream",
                        format!("cannot look up stream {stream}: {error}"),
                        "check that JetStream is enabled on the server (nats-server -js)",
                    ),
                    Err(_) => Check::fail(
                        "stream",
                        format!("no answer about stream {stream} within {TIMEOUT:?}"),
                        "check that JetStream is enabled on the server (nats-server -js)",
                    ),
                }];
            }
            let mut checks = Vec::new();
            for destination in named_destinations(config) {
                let subject = format!("{}{destination}", config.broker.subject_prefix);
                let found =
                    tokio::time::timeout(TIMEOUT, jetstream.stream_by_subject(subject.clone()))
                        .await;
                checks.push(match found {
                    Ok(Ok(stream)) => {
                        Check::pass("stream", format!("stream {stream} captures {subject}"))
                    }
                    _ => Check::fail(
                        "stream",
                        format!("no JetStream stream captures subject {subject}"),
                        "name one in broker.stream (relay and receive create it), or create \
                         a stream over the subject",
                    ),
                });
            }
            checks
        }
        #[cfg(feature = "kafka")]
        Broker::Kafka(options) => kafka_topics(config, options).await,
        #[cfg(feature = "sqs")]
        Broker::Sqs(transport) => sqs_queues(config, transport).await,
        _ => {
            let _ = config;
            Vec::new()
        }
    }
}

/// Kafka: the topics the configuration names, and the receiver's dead-letter topic, are
/// on the brokers. The services create no topic; a missing one stops the receiver at
/// start and holds the relay's messages for it in the outbox.
#[cfg(feature = "kafka")]
async fn kafka_topics(config: &Config, options: &oncebox::kafka::KafkaOptions) -> Vec<Check> {
    let listed = async {
        oncebox::kafka::KafkaAdmin::new(options.clone())?
            .topics()
            .await
    };
    let existing = match listed.await {
        Ok(existing) => existing,
        Err(error) => {
            return vec![Check::fail(
                "topics",
                format!("cannot list the brokers' topics: {error}"),
                "check that the brokers answer this host",
            )];
        }
    };
    let mut wanted = named_destinations(config);
    if let Some(topic) = &config.receive.topic {
        wanted.push(options.dead_letter_topic_for(topic));
    }
    wanted
        .into_iter()
        .map(|topic| {
            if existing.binary_search(&topic).is_ok() {
                Check::pass("topic", format!("{topic} exists"))
            } else {
                Check::fail(
                    "topic",
                    format!("topic {topic} does not exist on the brokers"),
                    format!(
                        "create it (kafka-topics.sh --create --topic {topic}, with the \
                         partitions its keys need)"
                    ),
                )
            }
        })
        .collect()
}

/// SQS: the queue of each topic the configuration names exists (looked up by name, or
/// read by URL). The services create no queue.
#[cfg(feature = "sqs")]
async fn sqs_queues(config: &Config, transport: &oncebox::sqs::SqsTransport) -> Vec<Check> {
    let mut checks = Vec::new();
    for topic in named_destinations(config) {
        let queue = match transport.options().queue_of(&topic) {
            Ok(queue) => queue,
            Err(error) => {
                checks.push(Check::fail("queue", error.to_string(), "fix [topics]"));
                continue;
            }
        };
        let found = tokio::time::timeout(TIMEOUT, transport.find_queue(&topic)).await;
        checks.push(match found {
            Ok(Ok(_)) => Check::pass("queue", format!("{queue} exists (topic {topic})")),
            Ok(Err(error)) => Check::fail(
                "queue",
                format!("queue {queue} of topic {topic} cannot be found: {error}"),
                "create it (aws sqs create-queue; a .fifo name with FifoQueue=true), or map \
                 the topic to an existing queue in [topics]",
            ),
            Err(_) => Check::fail(
                "queue",
                format!("no answer about queue {queue} within {TIMEOUT:?}"),
                "check the endpoint and that SQS answers this host",
            ),
        });
    }
    checks
}
