//! Dead letters: copies published to a group's dead queue with the reason, and reading
//! them back.

use std::fmt;
use std::sync::Arc;

use lapin::BasicProperties;
use lapin::options::BasicGetOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use oncebox_core::{Bytes, Received, Result};
use tokio::sync::OnceCell;

use crate::codec::{self, DELIVERY_COUNT_HEADER, Incoming, Strictness};
use crate::confirm::{ConfirmLink, Outgoing, PUBLISH_ID_HEADER, Role};
use crate::connection::{GroupNames, Link};
use crate::error::{RabbitError, setup_error};
use crate::options::{RabbitOptions, Settings};

/// The header of a dead letter that holds why it was dead-lettered.
pub const REASON_HEADER: &str = "x-oncebox-reason";
/// The header of a dead letter that holds the routing key (topic) it was delivered with.
pub const TOPIC_HEADER: &str = "x-oncebox-topic";
/// The header of a dead letter that holds the exchange it was delivered from.
pub const EXCHANGE_HEADER: &str = "x-oncebox-exchange";
/// The header of a dead letter that holds how many times it had been delivered.
pub const DELIVERY_COUNT_AT_DEATH_HEADER: &str = "x-oncebox-delivery-count";

/// Reasons longer than this many bytes are cut (an [`oncebox_core::Headers`] value holds
/// at most 8 KiB).
const MAX_REASON: usize = 4096;

/// A message in a group's dead queue.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The message as it was received, its topic restored.
    pub received: Received,
    /// Why it was dead-lettered: the consumer's reason, or the broker's (such as
    /// `delivery_limit` when a quorum queue's delivery limit was reached).
    pub reason: String,
}

/// Publishes dead-letter copies to one group's dead queue over a confirm channel opened
/// on first use.
pub(crate) struct DeadLetterSink {
    settings: Arc<Settings>,
    queue: ShortString,
    link: OnceCell<ConfirmLink>,
}

impl DeadLetterSink {
    pub(crate) fn new(settings: Arc<Settings>, queue: ShortString) -> Self {
        Self {
            settings,
            queue,
            link: OnceCell::new(),
        }
    }

    /// Publishes a copy of a delivery to the dead queue, with `reason`, and waits for
    /// the broker's confirm.
    pub(crate) async fn publish(
        &self,
        original: &Original,
        body: Bytes,
        reason: &str,
    ) -> Result<()> {
        let link = self
            .link
            .get_or_try_init(|| ConfirmLink::start(Arc::clone(&self.settings), Role::DeadLetters))
            .await?;
        link.publish(Outgoing {
            exchange: ShortString::from(""),
            routing_key: self.queue.clone(),
            properties: original.dead_letter_properties(reason),
            body,
        })
        .await
    }
}

impl fmt::Debug for DeadLetterSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetterSink")
            .field("queue", &self.queue.as_str())
            .finish_non_exhaustive()
    }
}

/// What a dead-letter copy keeps of a delivery besides its body.
pub(crate) struct Original {
    pub(crate) exchange: ShortString,
    pub(crate) routing_key: ShortString,
    pub(crate) properties: BasicProperties,
    pub(crate) delivery_count: u32,
}

impl Original {
    /// The delivery's properties with the dead-letter headers added, persistent.
    fn dead_letter_properties(&self, reason: &str) -> BasicProperties {
        let mut headers = self.properties.headers().clone().unwrap_or_default();
        let mut kept = FieldTable::default();
        for (name, value) in &headers {
            if name.as_str() != DELIVERY_COUNT_HEADER {
                kept.insert(name.clone(), value.clone());
            }
        }
        headers = kept;
        let text = |value: &str| AMQPValue::LongString(LongString::from(value));
        headers.insert(REASON_HEADER.into(), text(&clean(reason, MAX_REASON)));
        headers.insert(TOPIC_HEADER.into(), text(self.routing_key.as_str()));
        headers.insert(EXCHANGE_HEADER.into(), text(self.exchange.as_str()));
        headers.insert(
            DELIVERY_COUNT_AT_DEATH_HEADER.into(),
            AMQPValue::LongLongInt(i64::from(self.delivery_count)),
        );
        self.properties
            .clone()
            .with_headers(headers)
            .with_delivery_mode(2)
    }
}

/// `text` cut to at most `max` bytes on a character boundary, its control characters
/// (which a header value may not hold) replaced by spaces.
fn clean(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end]
        .chars()
        .map(|c| if c.is_control() && c != '\t' { ' ' } else { c })
        .collect()
}

/// Reads up to `limit` dead letters of consumer group `group` without removing them,
/// oldest first.
///
/// The messages are fetched unacknowledged and returned to the dead queue when the
/// reading channel closes, so they stay there (a quorum queue counts the read as a
/// delivery). Headers a [`Received`] cannot hold are left out rather than failing the
/// read: a message may be dead for that very reason.
///
/// # Errors
///
/// A transport error when the broker cannot be reached or the dead queue does not
/// exist.
///
/// # Cancel safety
///
/// Cancel safe: the reading connection closes, which returns the messages.
pub async fn peek_dead_letters(
    options: &RabbitOptions,
    group: &str,
    limit: usize,
) -> Result<Vec<DeadLetter>> {
    let settings = options.settings()?;
    let names = GroupNames::new("", group)?;
    let link = crate::connection::setting_up(&settings, |settings, node| async move {
        Link::open(&settings, node, "dead letter reader").await
    })
    .await?;
    let mut letters = Vec::new();
    while letters.len() < limit {
        let got = link
            .channel
            .basic_get(names.dead.clone(), BasicGetOptions { no_ack: false })
            .await
            .map_err(|source| {
                setup_error(RabbitError::Topology {
                    action: format!("read dead queue {:?}", names.dead.as_str()),
                    source,
                })
            })?;
        let Some(message) = got else { break };
        letters.push(read(&settings.format, &message.delivery)?);
    }
    link.close().await;
    Ok(letters)
}

/// A message of a dead queue as a [`DeadLetter`].
fn read(
    format: &oncebox_core::wire::WireFormat,
    delivery: &lapin::message::Delivery,
) -> Result<DeadLetter> {
    let headers = delivery.properties.headers().as_ref();
    let header = |name: &str| {
        headers
            .and_then(|h| h.inner().get(name))
            .and_then(codec::string)
    };
    let topic = header(TOPIC_HEADER)
        .or_else(|| first_death_routing_key(headers))
        .unwrap_or_else(|| delivery.routing_key.to_string());
    let reason = header(REASON_HEADER)
        .or_else(|| {
            header("x-first-death-reason")
                .map(|reason| format!("RabbitMQ dead-lettered it: {reason}"))
        })
        .unwrap_or_default();
    let incoming = Incoming {
        routing_key: &topic,
        redelivered: false,
        properties: &delivery.properties,
        body: Bytes::from(delivery.data.clone()),
    };
    let skip = |name: &str| {
        name.starts_with("x-oncebox-")
            || name == "x-death"
            || name.starts_with("x-first-death-")
            || name.starts_with("x-last-death-")
            || name == PUBLISH_ID_HEADER
    };
    let mut received = codec::decode(format, incoming, skip, Strictness::Lenient)
        .map_err(oncebox_core::Error::transport_permanent)?;
    received.delivery_count = headers
        .and_then(|h| h.inner().get(DELIVERY_COUNT_AT_DEATH_HEADER))
        .and_then(codec::integer)
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(received.delivery_count);
    Ok(DeadLetter { received, reason })
}

/// The routing key of the first `x-death` entry (set by the broker when it
/// dead-letters).
fn first_death_routing_key(headers: Option<&FieldTable>) -> Option<String> {
    let Some(AMQPValue::FieldArray(deaths)) = headers?.inner().get("x-death") else {
        return None;
    };
    let Some(AMQPValue::FieldTable(death)) = deaths.as_slice().first() else {
        return None;
    };
    let Some(AMQPValue::FieldArray(keys)) = death.inner().get("routing-keys") else {
        return None;
    };
    keys.as_slice().first().and_then(codec::string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_cut_safely() {
        assert_eq!(clean("short", 100), "short");
        assert_eq!(clean("ééé", 3), "é");
        assert_eq!(clean("line one\nline two", 100), "line one line two");
        assert_eq!(clean("tab\tok", 100), "tab\tok");
    }
}
