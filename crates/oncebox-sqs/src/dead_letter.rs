//! Dead letters: copies in a queue's dead-letter queue, with the reason, and reading them
//! back.

use std::collections::HashMap;

use aws_sdk_sqs::types::{Message as SqsMessage, MessageSystemAttributeName};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use oncebox_core::{Coordinates, Headers, Received, Result};

use crate::error::sdk;
use crate::names;
use crate::subscriber::Queue;
use crate::transport::SqsTransport;
use crate::wire::{self, BODY_ATTRIBUTE};

/// The attribute of a dead letter holding why it was given up (control characters
/// replaced, at most 4 KiB).
pub const REASON_ATTRIBUTE: &str = "oncebox_dead_letter_reason";
/// The attribute of a dead letter naming the topic it was received on.
pub const TOPIC_ATTRIBUTE: &str = "oncebox_dead_letter_topic";
/// The attribute of a dead letter naming the queue it was received from.
pub const QUEUE_ATTRIBUTE: &str = "oncebox_dead_letter_queue";
/// The attribute of a dead letter holding how many times it had been received.
pub const DELIVERIES_ATTRIBUTE: &str = "oncebox_dead_letter_deliveries";
/// The attribute of a dead letter holding the original's SQS message id.
pub const MESSAGE_ID_ATTRIBUTE: &str = "oncebox_dead_letter_message_id";
/// Set only when the original body did not fit beside the dead letter's attributes: its
/// size in bytes (the copy's body is then `-`).
pub const PAYLOAD_OMITTED_ATTRIBUTE: &str = "oncebox_dead_letter_payload_omitted";

const MAX_REASON: usize = 4096;

/// A message found in a dead-letter queue.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The message as it was received (its dead-letter attributes removed). A copy
    /// that cannot be read has its body as the payload and no other field.
    pub received: Received,
    /// Why it was given up; for a message SQS moved by the queue's redrive policy,
    /// `moved by the queue's redrive policy`.
    pub reason: String,
    /// The original's SQS message id, when the copy says.
    pub original_message_id: Option<String>,
}

/// Sends a copy of `message` with `reason` to `queue`'s dead-letter queue and waits for
/// SQS's confirmation.
pub(crate) async fn send(queue: &Queue, message: &SqsMessage, reason: &str) -> Result<()> {
    let transport = &queue.transport;
    let url = transport.dead_letter_url(&queue.url).await?;
    let mut fields = vec![
        (REASON_ATTRIBUTE.to_owned(), clean_reason(reason)),
        (TOPIC_ATTRIBUTE.to_owned(), queue.topic.clone()),
        (QUEUE_ATTRIBUTE.to_owned(), queue.name.clone()),
    ];
    if let Some(count) = message
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
    {
        fields.push((DELIVERIES_ATTRIBUTE.to_owned(), count.clone()));
    }
    let original_id = message.message_id().unwrap_or_default().to_owned();
    fields.push((MESSAGE_ID_ATTRIBUTE.to_owned(), original_id.clone()));
    let mut body_kind = None;
    for (name, value) in message.message_attributes().into_iter().flatten() {
        let text = match (value.string_value(), value.binary_value()) {
            (Some(text), _) => text.to_owned(),
            (None, Some(blob)) => BASE64.encode(blob.as_ref()),
            (None, None) => String::new(),
        };
        if name == BODY_ATTRIBUTE {
            body_kind = Some(text);
        } else {
            fields.push((name.clone(), text));
        }
    }
    let body = message.body().unwrap_or("-").to_owned();
    let limit = transport.shared.options.max_message_size;
    let mut copy = wire::outgoing(body.clone(), body_kind.as_deref(), fields.clone());
    if copy.size > limit {
        fields.push((PAYLOAD_OMITTED_ATTRIBUTE.to_owned(), body.len().to_string()));
        copy = wire::outgoing("-".to_owned(), Some("empty"), fields);
    }
    let fifo = names::is_fifo(&url);
    let sent = transport
        .shared
        .client
        .send_message()
        .queue_url(&url)
        .message_body(copy.body)
        .set_message_attributes(Some(copy.attributes))
        // A group of its own: dead letters keep no order, and a reader can then see
        // them all (a FIFO group hands out only its head while it is not deleted).
        .set_message_group_id(fifo.then(|| original_id.clone()))
        .set_message_deduplication_id(fifo.then_some(original_id))
        .send()
        .await;
    match sent {
        Ok(_) => Ok(()),
        Err(error) => Err(sdk("sending a dead letter", &url, error)),
    }
}

/// The reason as a dead letter carries it: characters SQS refuses replaced, at most
/// 4 KiB.
fn clean_reason(reason: &str) -> String {
    let mut clean: String = reason
        .chars()
        .map(|c| if wire::text_char_allowed(c) { c } else { '?' })
        .collect();
    if clean.len() > MAX_REASON {
        let mut end = MAX_REASON;
        while !clean.is_char_boundary(end) {
            end -= 1;
        }
        clean.truncate(end);
    }
    if clean.is_empty() {
        clean.push('-');
    }
    clean
}

impl SqsTransport {
    /// Reads up to `max` dead letters of `topic` without taking them: they stay in the
    /// dead-letter queue (received with a visibility timeout of zero, so a few receives
    /// are made until no new one shows).
    ///
    /// # Errors
    ///
    /// Transport errors; [`SqsError::NoQueue`](crate::SqsError::NoQueue) when there is no dead-letter queue.
    pub async fn dead_letters(&self, topic: &str, max: usize) -> Result<Vec<DeadLetter>> {
        let queue = self.shared.options.queue_of(topic)?;
        let dead = names::dead_letter_queue(&queue, &self.shared.options.dead_letter_suffix);
        let url = self.queue_url(&dead).await?;
        let mut found: HashMap<String, DeadLetter> = HashMap::new();
        let mut quiet = 0;
        while found.len() < max && quiet < 3 {
            let answer = self
                .shared
                .client
                .receive_message()
                .queue_url(&url)
                .max_number_of_messages(10)
                .visibility_timeout(0)
                .wait_time_seconds(0)
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send()
                .await
                .map_err(|e| sdk("reading dead letters", &url, e))?;
            let before = found.len();
            for message in answer.messages.unwrap_or_default() {
                let id = message.message_id().unwrap_or_default().to_owned();
                found
                    .entry(id)
                    .or_insert_with(|| self.read_dead_letter(topic, &dead, &message));
            }
            quiet = if found.len() == before { quiet + 1 } else { 0 };
        }
        let mut letters: Vec<_> = found.into_values().take(max).collect();
        letters.sort_by_key(|letter| letter.received.created_at);
        Ok(letters)
    }

    fn read_dead_letter(&self, topic: &str, queue: &str, message: &SqsMessage) -> DeadLetter {
        // The dead letter's own attributes, read apart: the copy of an unreadable
        // message does not decode either.
        let fields = wire::fields_of(message)
            .map(|f| f.fields)
            .unwrap_or_default();
        let field = |name: &str| {
            fields
                .iter()
                .find(|(field, _)| field == name)
                .map(|(_, value)| String::from_utf8_lossy(value).into_owned())
        };
        let reason = field(REASON_ATTRIBUTE);
        let original_message_id = field(MESSAGE_ID_ATTRIBUTE);
        let mut received =
            wire::decode(&self.shared.format, topic, queue, message).unwrap_or_else(|_| Received {
                id: None,
                topic: topic.to_owned(),
                key: None,
                kind: String::new(),
                headers: Headers::new(),
                payload: Bytes::copy_from_slice(message.body().unwrap_or_default().as_bytes()),
                created_at: None,
                coordinates: Coordinates {
                    source: queue.to_owned(),
                    partition: None,
                    position: message.message_id().unwrap_or_default().to_owned(),
                },
                delivery_count: 1,
            });
        for name in [
            REASON_ATTRIBUTE,
            MESSAGE_ID_ATTRIBUTE,
            TOPIC_ATTRIBUTE,
            QUEUE_ATTRIBUTE,
            DELIVERIES_ATTRIBUTE,
        ] {
            received.headers.remove(name);
        }
        DeadLetter {
            received,
            reason: reason.unwrap_or_else(|| "moved by the queue's redrive policy".to_owned()),
            original_message_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_cleaned_and_bounded() {
        assert_eq!(clean_reason("bad\u{1}id"), "bad?id");
        assert_eq!(clean_reason(""), "-");
        assert!(clean_reason(&"é".repeat(5000)).len() <= MAX_REASON);
    }
}
