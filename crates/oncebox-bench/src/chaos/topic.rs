//! The run's topic on the broker: made before the first publish, read back by the
//! audit in the broker's order, removed after a run that passed.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::Context as _;
use oncebox::{Delivery as _, Subscriber as _};

use oncebox_cli::Broker;

use super::report::Published;
use super::shop::OrderPlaced;

/// How long the audit's reader waits for its first delivery: a new Kafka consumer group
/// is assigned its partitions only after the group's join (seconds on tansu, more while
/// it is busy).
const FIRST_DELIVERY: Duration = Duration::from_secs(60);

/// How long the audit's reader waits for the next delivery once deliveries flow.
const NEXT_DELIVERY: Duration = Duration::from_secs(5);

/// Reads the topic back in the broker's order with a reader of its own, until every
/// committed order was found or nothing more came (see [`FIRST_DELIVERY`],
/// [`NEXT_DELIVERY`]). An order on the topic that is not among `committed` was
/// published for a transaction the database does not have (after a failover to a
/// standby that never received it).
pub(crate) async fn read_back(
    broker: &Broker,
    topic: &str,
    group: &str,
    committed: &HashSet<String>,
) -> anyhow::Result<Published> {
    let mut reader = broker.subscriber(topic, group).await?;
    let mut first: HashSet<String> = HashSet::new();
    let mut last_seq: HashMap<String, i64> = HashMap::new();
    let mut published = Published::default();
    let mut phantoms: HashSet<String> = HashSet::new();
    while first.len() < committed.len() {
        let wait = if first.is_empty() {
            FIRST_DELIVERY
        } else {
            NEXT_DELIVERY
        };
        let delivery = match tokio::time::timeout(wait, reader.next()).await {
            Ok(delivery) => delivery?,
            Err(_) => break,
        };
        let order: Option<OrderPlaced> = delivery.received().payload_json().ok();
        delivery.ack().await?;
        let Some(order) = order else {
            published.unreadable += 1;
            continue;
        };
        if !committed.contains(&order.order_id) {
            phantoms.insert(order.order_id);
            continue;
        }
        if !first.insert(order.order_id.clone()) {
            published.duplicates += 1;
            continue;
        }
        let last = last_seq.entry(order.customer).or_insert(0);
        if order.seq <= *last {
            published.out_of_order += 1;
        }
        *last = (*last).max(order.seq);
    }
    published.orders = first.len() as u64;
    published.missing = (committed.len() - first.len()) as u64;
    published.not_in_database = phantoms.len() as u64;
    Ok(published)
}

/// How many messages the payment service dead-lettered on SQS, where the audit has no
/// reader of its own: what it could not read as an order (0 elsewhere, where the reader
/// counts them on the topic).
pub(crate) async fn dead_lettered(broker: &Broker, topic: &str) -> anyhow::Result<u64> {
    #[cfg(feature = "sqs")]
    if let Broker::Sqs(transport) = broker {
        let letters = transport
            .dead_letters(topic, 10_000)
            .await
            .with_context(|| format!("reading the dead letters of {topic}"))?;
        return Ok(letters.len() as u64);
    }
    let _ = (broker, topic);
    Ok(0)
}

/// Kafka's topics and SQS's queues are not created by publishing to them: the run's
/// is made here, a Kafka topic with partitions for the customers to spread over.
pub(crate) async fn create_topic(broker: &Broker, topic: &str) -> anyhow::Result<()> {
    #[cfg(feature = "kafka")]
    if let Broker::Kafka(options) = broker {
        oncebox::kafka::KafkaAdmin::new(options.clone())?
            .create_topic(topic, 3, 1)
            .await
            .with_context(|| format!("creating topic {topic}"))?;
    }
    #[cfg(feature = "sqs")]
    if let Broker::Sqs(transport) = broker {
        transport
            .ensure_queue(topic, &oncebox::sqs::QueueSettings::new())
            .await
            .with_context(|| format!("creating the queues of {topic}"))?;
    }
    let _ = (broker, topic);
    Ok(())
}

/// Removes what the run made on the broker at `url`: the NATS stream, the Kafka topic,
/// the Redis streams, SQS's queue and dead-letter queue, or RabbitMQ's exchange and the
/// queues of `groups`.
pub(crate) async fn remove_topic(
    broker: &Broker,
    url: &str,
    schema: &str,
    topic: &str,
    groups: &[&str],
) -> anyhow::Result<()> {
    let _ = (url, schema, topic, groups);
    match broker {
        Broker::RedisStreams(streams) => {
            let keys = [streams.stream_key(topic), streams.dead_letter_key(topic)];
            let mut connection = streams.connection().clone();
            oncebox::redis::redis::cmd("DEL")
                .arg(&keys)
                .query_async::<()>(&mut connection)
                .await
                .with_context(|| format!("deleting stream {}", keys[0]))?;
        }
        #[cfg(feature = "kafka")]
        Broker::Kafka(options) => {
            oncebox::kafka::KafkaAdmin::new(options.clone())?
                .delete_topics(&[topic])
                .await
                .with_context(|| format!("deleting topic {topic}"))?;
        }
        #[cfg(feature = "sqs")]
        Broker::Sqs(transport) => transport
            .delete_queues(topic)
            .await
            .with_context(|| format!("deleting the queues of {topic}"))?,
        #[cfg(feature = "nats")]
        Broker::Nats(transport) => {
            oncebox::nats::async_nats::jetstream::new(transport.client().clone())
                .delete_stream(schema)
                .await
                .with_context(|| format!("deleting stream {schema}"))?;
        }
        #[cfg(feature = "rabbitmq")]
        Broker::RabbitMq(_) => {
            use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
            // A cluster's nodes, separated by commas: the first that answers.
            let mut connection = None;
            for node in url.split(',') {
                match lapin::Connection::connect(node, lapin::ConnectionProperties::default()).await
                {
                    Ok(opened) => {
                        connection = Some(opened);
                        break;
                    }
                    Err(error) => tracing::warn!(%error, "cannot connect to a RabbitMQ node"),
                }
            }
            let connection = connection.context("connecting to RabbitMQ: no node answered")?;
            let channel = connection.create_channel().await?;
            for group in groups {
                for queue in [
                    (*group).to_owned(),
                    oncebox::rabbitmq::dead_queue_name(group),
                ] {
                    channel
                        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                        .await
                        .with_context(|| format!("deleting queue {queue}"))?;
                }
            }
            channel
                .exchange_delete(schema.into(), ExchangeDeleteOptions::default())
                .await
                .with_context(|| format!("deleting exchange {schema}"))?;
            let _ = connection.close(200, "done".into()).await;
        }
        // A broker the oncebox command was built for and this crate was not (the feature
        // turned on for the command alone).
        other => anyhow::bail!(
            "{}: oncebox-bench was built without its feature, and leaves its topic",
            other.kind()
        ),
    }
    Ok(())
}
