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
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
fn named_destinations(config: &Config) -> Vec<String> {
    let mut named: Vec<String> = config.receive.topic.iter().cloned().collect();
    named.extend(config.topics.values().cloned());
    named.sort();
    named.dedup();
    named
}

/// NATS: `broker.stream` exists (or the services create it at start), or else a stream
/// captures each subject the configuration names. Redis Streams need nothing in
/// advance; RabbitMQ's exchange was checked by connecting (a passive declare, unless the
/// configuration declares it); Kafka's topics are not checked yet.
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
        _ => {
            let _ = config;
            Vec::new()
        }
    }
}
