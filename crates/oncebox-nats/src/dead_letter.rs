//! Dead letters: a copy with the reason on the dead-letter subject, then `+TERM`; and
//! reading the copies back.

use std::str::FromStr;
use std::time::Duration;

use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::{self, AckKind};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use futures_util::StreamExt;
use oncebox_core::{Bytes, Coordinates, Received, Result};

use crate::JetStreamTransport;
use crate::delivery::{Position, Route, settle};
use crate::error::{JetStreamError, client};
use crate::publisher::publish_confirmed;
use crate::transport::Shared;

/// Header of a dead-letter copy: why it was dead-lettered.
pub const REASON_HEADER: &str = "oncebox-dead-letter-reason";
/// Header of a dead-letter copy: the topic it was consumed from.
pub const TOPIC_HEADER: &str = "oncebox-dead-letter-topic";
/// Header of a dead-letter copy: the consumer group that gave up on it.
pub const GROUP_HEADER: &str = "oncebox-dead-letter-group";
/// Header of a dead-letter copy: the stream holding the original.
pub const STREAM_HEADER: &str = "oncebox-dead-letter-stream";
/// Header of a dead-letter copy: the original's sequence in that stream.
pub const SEQUENCE_HEADER: &str = "oncebox-dead-letter-sequence";
/// Header of a dead-letter copy: how many times the group had received it.
pub const DELIVERIES_HEADER: &str = "oncebox-dead-letter-deliveries";
/// Header of a dead-letter copy published without the payload, which did not fit
/// beside the dead-letter headers: the payload's size. Read the payload from the
/// original (stream and sequence above) while the stream retains it.
pub const PAYLOAD_OMITTED_HEADER: &str = "oncebox-dead-letter-payload-omitted";

/// The longest reason kept, in bytes.
const MAX_REASON_LEN: usize = 4096;

/// A message a consumer group gave up on, read back from its dead-letter subject.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The message as the group received it: topic, id, key, kind and headers from the
    /// original (headers that could not be decoded left out), coordinates naming the
    /// original's topic and stream sequence.
    pub received: Received,
    /// Why it was dead-lettered.
    pub reason: String,
    /// The consumer group that gave up on it.
    pub group: String,
    /// The stream holding the original.
    pub stream: String,
    /// Whether the copy lacks the payload (it did not fit beside the dead-letter
    /// headers): read it from the original.
    pub payload_omitted: bool,
}

impl JetStreamTransport {
    /// The dead letters of `topic` (of every group), oldest first, at most `limit`.
    ///
    /// Reads the dead-letter subject with a temporary consumer; the copies stay where
    /// they are.
    ///
    /// # Errors
    ///
    /// A transient transport error when no stream captures the dead-letter subject
    /// ([`JetStreamError::NoStream`]) or the server cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; the temporary consumer is removed by the server after a minute.
    pub async fn dead_letters(&self, topic: &str, limit: usize) -> Result<Vec<DeadLetter>> {
        let shared = &self.shared;
        let subject = shared.dead_letter_subject(topic)?;
        let stream_name = shared.stream_for(&subject).await?;
        let operation = || format!("read the dead letters of {topic:?}");
        let stream = shared
            .context
            .get_stream_no_info(&stream_name)
            .await
            .map_err(|error| client(operation(), error))?;
        let config = pull::Config {
            filter_subject: subject.clone(),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::None,
            inactive_threshold: Duration::from_secs(60),
            ..Default::default()
        };
        let consumer = stream
            .create_consumer(config)
            .await
            .map_err(|error| client(operation(), error))?;
        let wanted = usize::try_from(consumer.cached_info().num_pending)
            .unwrap_or(usize::MAX)
            .min(limit);
        let mut letters = Vec::with_capacity(wanted);
        while letters.len() < wanted {
            let mut batch = consumer
                .fetch()
                .max_messages(wanted - letters.len())
                .expires(shared.options.request_timeout)
                .messages()
                .await
                .map_err(|error| client(operation(), error))?;
            let before = letters.len();
            while let Some(message) = batch.next().await {
                let message = message.map_err(|error| client(operation(), error))?;
                letters.push(read_copy(shared, topic, &message));
            }
            if letters.len() == before {
                break;
            }
        }
        // Best effort: the server removes it after its inactive threshold anyway.
        let name = consumer.cached_info().name.clone();
        if let Err(error) = stream.delete_consumer(&name).await {
            tracing::debug!(%error, "could not delete the temporary dead-letter consumer");
        }
        Ok(letters)
    }
}

/// Copies `message` with `reason` to the dead-letter subject of its topic (unless copies
/// are off), then terminates it.
pub(crate) async fn dead_letter_message(
    shared: &Shared,
    route: &Route,
    message: &jetstream::Message,
    position: Position,
    reason: &str,
) -> Result<()> {
    if shared.options.dead_letter_copies {
        let headers = message.headers.as_ref();
        publish_copy(shared, route, headers, &message.payload, position, reason).await?;
    }
    settle(shared, route, message, position, AckKind::Term).await
}

/// Publishes the dead-letter copy of a message with `original` headers and `payload`.
pub(crate) async fn publish_copy(
    shared: &Shared,
    route: &Route,
    original: Option<&HeaderMap>,
    payload: &Bytes,
    position: Position,
    reason: &str,
) -> Result<()> {
    let subject = shared.dead_letter_subject(&route.topic)?;
    let mut headers = HeaderMap::new();
    if let Some(original) = original {
        for (name, values) in original.iter() {
            // `Nats-*` headers direct the server (expected stream, TTL, rollup): they
            // must not act on the copy. The id below replaces `Nats-Msg-Id`.
            let name_text: &str = name.as_ref();
            if name_text
                .get(..5)
                .is_some_and(|start| start.eq_ignore_ascii_case("nats-"))
            {
                continue;
            }
            for value in values {
                headers.append(name.clone(), value.clone());
            }
        }
    }
    // One copy per original and group, however often dead-lettering is retried.
    let copy_id = format!("{}.{}.{}", route.stream, route.consumer, position.sequence);
    let fields = [
        (NATS_MESSAGE_ID.as_ref(), copy_id.as_str()),
        (REASON_HEADER, &clean_reason(reason)),
        (TOPIC_HEADER, &route.topic),
        (GROUP_HEADER, &route.group),
        (STREAM_HEADER, &route.stream),
        (SEQUENCE_HEADER, &position.sequence.to_string()),
        (DELIVERIES_HEADER, &position.deliveries.to_string()),
    ];
    for (name, value) in fields {
        insert(&mut headers, name, value)?;
    }
    let result = publish_confirmed(shared, subject.clone(), headers.clone(), payload.clone()).await;
    match result {
        Ok(_) => Ok(()),
        Err(error) if is_too_large(&error) => {
            // The original fit; with the dead-letter headers it does not. Keep the
            // reason and a pointer to the original rather than nothing.
            insert(
                &mut headers,
                PAYLOAD_OMITTED_HEADER,
                &payload.len().to_string(),
            )?;
            publish_confirmed(shared, subject, headers, Bytes::new()).await?;
            Ok(())
        }
        Err(error) => Err(error),
    }
}

fn is_too_large(error: &oncebox_core::Error) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<JetStreamError>())
        .is_some_and(|source| matches!(source, JetStreamError::TooLarge { .. }))
}

fn insert(headers: &mut HeaderMap, name: &str, value: &str) -> Result<()> {
    // Every name here is a constant and every value free of line breaks (cleaned
    // reason, subjects, names, numbers); an error is still an error, not a panic.
    let invalid = || {
        oncebox_core::Error::transport_permanent(format!("dead-letter header {name} is invalid"))
    };
    let header_name = HeaderName::from_str(name).map_err(|_| invalid())?;
    let header_value = HeaderValue::from_str(value).map_err(|_| invalid())?;
    headers.insert(header_name, header_value);
    Ok(())
}

/// `reason` fit for a header: control characters become spaces, at most 4 KiB.
fn clean_reason(reason: &str) -> String {
    let mut cleaned = String::with_capacity(reason.len().min(MAX_REASON_LEN));
    for c in reason.chars() {
        if cleaned.len() + c.len_utf8() > MAX_REASON_LEN {
            break;
        }
        cleaned.push(if c.is_control() { ' ' } else { c });
    }
    cleaned
}

/// A dead-letter copy read back into a [`DeadLetter`].
fn read_copy(shared: &Shared, topic: &str, message: &jetstream::Message) -> DeadLetter {
    let header = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(name))
            .map(|value| value.as_str().to_owned())
    };
    let sequence = header(SEQUENCE_HEADER).unwrap_or_default();
    let coordinates = Coordinates {
        source: header(TOPIC_HEADER).unwrap_or_else(|| topic.to_owned()),
        partition: None,
        position: sequence,
    };
    let deliveries = header(DELIVERIES_HEADER)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let received = decode_lenient(shared, topic, message, coordinates, deliveries);
    DeadLetter {
        received,
        reason: header(REASON_HEADER).unwrap_or_default(),
        group: header(GROUP_HEADER).unwrap_or_default(),
        stream: header(STREAM_HEADER).unwrap_or_default(),
        payload_omitted: header(PAYLOAD_OMITTED_HEADER).is_some(),
    }
}

/// Decodes a copy's headers, leaving out the dead-letter headers, `Nats-*` headers, and
/// any header that does not decode (the reason a message was dead-lettered may be just
/// such a header).
fn decode_lenient(
    shared: &Shared,
    topic: &str,
    message: &jetstream::Message,
    coordinates: Coordinates,
    deliveries: u32,
) -> Received {
    let mut fields: Vec<(&[u8], &[u8])> = Vec::new();
    if let Some(headers) = &message.headers {
        for (name, values) in headers.iter() {
            let name: &str = name.as_ref();
            if name.starts_with("oncebox-dead-letter-")
                || name
                    .get(..5)
                    .is_some_and(|s| s.eq_ignore_ascii_case("nats-"))
            {
                continue;
            }
            fields.extend(
                values
                    .iter()
                    .map(|v| (name.as_bytes(), v.as_str().as_bytes())),
            );
        }
    }
    let decode = |fields: &[(&[u8], &[u8])]| {
        shared.wire.decode(
            topic,
            fields.iter().copied(),
            message.payload.clone(),
            coordinates.clone(),
            deliveries,
        )
    };
    if let Ok(received) = decode(&fields) {
        return received;
    }
    let decodable: Vec<(&[u8], &[u8])> = fields
        .iter()
        .copied()
        .filter(|field| decode(std::slice::from_ref(field)).is_ok())
        .collect();
    decode(&decodable).unwrap_or_else(|_| Received {
        id: None,
        topic: topic.to_owned(),
        key: None,
        kind: String::new(),
        headers: oncebox_core::Headers::new(),
        payload: message.payload.clone(),
        created_at: None,
        coordinates,
        delivery_count: deliveries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_made_fit_for_a_header() {
        assert_eq!(clean_reason("a\r\nb\tc"), "a  b c");
        let long = "é".repeat(5000);
        let cleaned = clean_reason(&long);
        assert!(cleaned.len() <= MAX_REASON_LEN);
        assert!(HeaderValue::from_str(&clean_reason("x\ny")).is_ok());
    }
}
