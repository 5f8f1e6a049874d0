//! Confirmed, pipelined publishing with broker-side deduplication.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use oncebox_core::wire::WireFormat;
use oncebox_core::{Bytes, Error, InvalidMessage, Message, Publisher, Result};

use crate::error::{
    JetStreamError, api_error, client, permanent, publish_refusal_is_permanent, transient,
};
use crate::transport::Shared;

/// Publishes to JetStream and returns once the stream confirmed it stored the message
/// (the PubAck).
///
/// - **Subject**: the topic after the [subject prefix](crate::JetStreamOptions::subject_prefix).
/// - **Headers**: the CloudEvents attributes and the message's own headers (see the
///   crate documentation), plus `Nats-Msg-Id` set to the message id, so that JetStream
///   drops a re-publish of the same id within the stream's duplicate window (a relay
///   that crashed between the PubAck and marking the row) and still confirms it.
/// - **Pipelining**: each call waits only for its own PubAck; concurrent calls (the
///   relay publishes different keys concurrently) share the connection with up to
///   [`max_in_flight`](crate::JetStreamOptions::max_in_flight) PubAcks outstanding, so
///   throughput is not capped at one round trip per message. Calls for one key, which
///   the relay makes one after the other, reach the stream in that order.
///
/// Cheap to clone.
#[derive(Clone)]
pub struct JetStreamPublisher {
    shared: Arc<Shared>,
}

impl JetStreamPublisher {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

impl fmt::Debug for JetStreamPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamPublisher")
            .field("subject_prefix", &self.shared.options.subject_prefix)
            .finish_non_exhaustive()
    }
}

impl Publisher for JetStreamPublisher {
    /// Publishes `message` on its topic's subject and waits for the PubAck (a duplicate
    /// the stream dropped is confirmed too).
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidMessage`] for a header that a NATS header cannot carry (a line
    ///   break; the key and kind are percent-encoded, so they can hold one).
    /// - A permanent transport error ([`JetStreamError`] as its source) for a topic that
    ///   is no valid subject and for a message larger than the server's `max_payload`
    ///   or the stream's `max_msg_size` (the message names the limit).
    /// - A transient one when no PubAck came within the
    ///   [request timeout](crate::JetStreamOptions::request_timeout) (server down or
    ///   restarting: the client reconnects meanwhile), when no stream captures the
    ///   subject ([`JetStreamError::NoStream`], transient so that a missing stream is
    ///   retried with backoff rather than dead-lettering the outbox), and for other
    ///   refusals the stream may lift (storage full).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the message published or not; publishing it again
    /// is deduplicated by `Nats-Msg-Id` within the duplicate window.
    async fn publish(&self, message: &Message) -> Result<()> {
        let subject = self.shared.subject(&message.topic)?;
        let headers = message_headers(&self.shared.wire, message)?;
        publish_confirmed(&self.shared, subject, headers, message.payload.clone()).await?;
        Ok(())
    }

    fn messaging_system(&self) -> &'static str {
        "nats"
    }
}

/// The NATS headers carrying `message` in `wire` format, then `Nats-Msg-Id`.
pub(crate) fn message_headers(wire: &WireFormat, message: &Message) -> Result<HeaderMap> {
    let mut headers = HeaderMap::new();
    for (name, value) in wire.encode(message) {
        let header_name = HeaderName::from_str(&name)
            .map_err(|_| invalid_header(&name, "not a valid NATS header name"))?;
        let header_value = HeaderValue::from_str(&value)
            .map_err(|_| invalid_header(&name, "a NATS header value cannot hold a line break"))?;
        headers.insert(header_name, header_value);
    }
    let id = HeaderValue::from_str(&message.id.to_string())
        .map_err(|_| invalid_header("Nats-Msg-Id", "not a header value"))?;
    headers.insert(NATS_MESSAGE_ID, id);
    Ok(headers)
}

fn invalid_header(name: &str, reason: &'static str) -> Error {
    let name: String = name.chars().take(64).collect();
    Error::InvalidMessage(InvalidMessage::InvalidHeader { name, reason })
}

/// Publishes and waits for the PubAck, mapping every failure.
pub(crate) async fn publish_confirmed(
    shared: &Shared,
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
) -> Result<PublishAck> {
    let size = wire_len(&headers) + payload.len();
    let max_payload = shared.client.max_payload();
    if size > max_payload {
        return Err(too_large(
            size,
            format!("server's max_payload of {max_payload} bytes"),
        ));
    }
    let publish = PublishMessage::build().payload(payload).headers(headers);
    let pending = shared.context.send_publish(subject.clone(), publish).await;
    let confirmed = match pending {
        Ok(ack) => ack.await,
        Err(error) => Err(error),
    };
    match confirmed {
        Ok(ack) => Ok(ack),
        Err(error) => Err(publish_error(shared, &subject, size, error).await),
    }
}

async fn publish_error(shared: &Shared, subject: &str, size: usize, error: PublishError) -> Error {
    let operation = || format!("publish to {subject:?}");
    match error.kind() {
        PublishErrorKind::StreamNotFound => transient(JetStreamError::NoStream {
            subject: subject.to_owned(),
        }),
        PublishErrorKind::MaxPayloadExceeded => too_large(
            size,
            format!(
                "server's max_payload of {} bytes",
                shared.client.max_payload()
            ),
        ),
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::MaxAckPending => client(operation(), error),
        PublishErrorKind::WrongLastMessageId
        | PublishErrorKind::WrongLastSequence
        | PublishErrorKind::Other => {
            let Some(api) = api_error(&error).cloned() else {
                return client(operation(), error);
            };
            if api.error_code() == async_nats::jetstream::ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM
            {
                let limit = match stream_max_message_size(shared, subject).await {
                    Some(limit) => format!("stream's max_msg_size of {limit} bytes"),
                    None => "stream's max_msg_size".to_owned(),
                };
                return too_large(size, limit);
            }
            let error = JetStreamError::Refused {
                operation: operation(),
                source: api.clone(),
            };
            if publish_refusal_is_permanent(&api) {
                permanent(error)
            } else {
                transient(error)
            }
        }
    }
}

fn too_large(size: usize, limit: String) -> Error {
    permanent(JetStreamError::TooLarge { size, limit })
}

/// The `max_msg_size` of the stream that captures `subject`, for the error message; `None`
/// if it cannot be read now.
async fn stream_max_message_size(shared: &Shared, subject: &str) -> Option<i32> {
    let name = shared.stream_for(subject).await.ok()?;
    let stream = shared.context.get_stream(name).await.ok()?;
    Some(stream.cached_info().config.max_message_size)
}

/// The size of `headers` on the wire, as the server counts it against `max_payload`:
/// `NATS/1.0\r\n`, each `name: value\r\n`, and a final `\r\n`.
fn wire_len(headers: &HeaderMap) -> usize {
    let fixed = "NATS/1.0\r\n".len() + "\r\n".len();
    headers.iter().fold(fixed, |len, (name, values)| {
        let name: &str = name.as_ref();
        len + values
            .iter()
            .map(|value| name.len() + ": ".len() + value.as_str().len() + "\r\n".len())
            .sum::<usize>()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_len_counts_every_header_line() {
        let mut headers = HeaderMap::new();
        headers.insert("a", "bc");
        headers.append("a", "d");
        // "NATS/1.0\r\n" + "a: bc\r\n" + "a: d\r\n" + "\r\n"
        assert_eq!(wire_len(&headers), 10 + 7 + 6 + 2);
    }

    #[test]
    fn headers_carry_the_attributes_and_the_id() {
        let message = Message::new("orders", "x")
            .with_key("k-1")
            .with_header("traceparent", "00-abc-01")
            .unwrap();
        let headers = message_headers(&WireFormat::nats(), &message).unwrap();
        let get = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
        assert_eq!(get("Nats-Msg-Id"), Some(message.id.to_string()));
        assert_eq!(get("ce-id"), Some(message.id.to_string()));
        assert_eq!(get("ce-subject").as_deref(), Some("k-1"));
        assert_eq!(get("traceparent").as_deref(), Some("00-abc-01"));
    }

    /// Attribute values are percent-encoded, so a key with a line break travels.
    #[test]
    fn a_line_break_in_the_key_travels_percent_encoded() {
        let message = Message::new("orders", "x").with_key("line\nbreak");
        let headers = message_headers(&WireFormat::nats(), &message).unwrap();
        assert_eq!(
            headers.get("ce-subject").map(|v| v.as_str()),
            Some("line%0Abreak")
        );
    }
}
