//! Dead letters: entries moved to a topic's dead-letter stream, with their reason.

use oncebox_core::wire::WireFormat;
use oncebox_core::{Error, Received, Result};

use super::entry::RawEntry;

/// The fields a dead letter carries before the original entry's fields, in this order.
pub(crate) const REASON: &str = "oncebox_dead_reason";
pub(crate) const GROUP: &str = "oncebox_dead_group";
pub(crate) const ENTRY: &str = "oncebox_dead_entry";
pub(crate) const DELIVERIES: &str = "oncebox_dead_deliveries";

/// One entry of a dead-letter stream: why and where it died, and the original entry's
/// fields, untouched (an entry dead-lettered because it could not be decoded is kept as
/// it was).
#[derive(Clone)]
pub struct RedisDeadLetter {
    id: String,
    topic: String,
    reason: String,
    group: String,
    entry: String,
    deliveries: u32,
    original: RawEntry,
}

impl RedisDeadLetter {
    /// Splits a dead-letter stream entry into its own fields and the original's.
    pub(crate) fn from_entry(topic: &str, dead: RawEntry) -> Self {
        let mut letter = Self {
            id: dead.id,
            topic: topic.to_owned(),
            reason: String::new(),
            group: String::new(),
            entry: String::new(),
            deliveries: 0,
            original: RawEntry {
                id: String::new(),
                fields: Vec::new(),
            },
        };
        // The script writes exactly these four first; an entry without them (written by
        // something else) is all original fields.
        let own = [REASON, GROUP, ENTRY, DELIVERIES];
        let mut fields = dead.fields;
        let ours = fields.len() >= own.len()
            && own
                .iter()
                .zip(&fields)
                .all(|(expected, (name, _))| name == expected.as_bytes());
        if ours {
            for (name, value) in fields.drain(..own.len()) {
                let value = String::from_utf8_lossy(&value).into_owned();
                match std::str::from_utf8(&name) {
                    Ok(REASON) => letter.reason = value,
                    Ok(GROUP) => letter.group = value,
                    Ok(ENTRY) => letter.entry = value,
                    _ => letter.deliveries = value.parse().unwrap_or(0),
                }
            }
        }
        letter.original = RawEntry {
            id: letter.entry.clone(),
            fields,
        };
        letter
    }

    /// The dead letter's own entry id in the dead-letter stream.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Why the message was given up (the consumer's reason, or the subscriber's: not
    /// decodable, over the delivery limit).
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The consumer group that gave it up.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The original entry's id in the topic's stream.
    pub fn entry_id(&self) -> &str {
        &self.entry
    }

    /// How many times the group had delivered it.
    pub fn deliveries(&self) -> u32 {
        self.deliveries
    }

    /// The original entry's fields, as bytes, in order.
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.original
            .fields
            .iter()
            .map(|(name, value)| (name.as_slice(), value.as_slice()))
    }

    /// The original message, decoded as a subscriber would have received it.
    ///
    /// # Errors
    ///
    /// A permanent transport error if the original entry cannot be decoded (which may be
    /// why it was dead-lettered).
    pub fn received(&self) -> Result<Received> {
        self.original
            .decode(&WireFormat::redis(), &self.topic, self.deliveries.max(1))
            .map_err(Error::transport_permanent)
    }
}

impl std::fmt::Debug for RedisDeadLetter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisDeadLetter")
            .field("id", &self.id)
            .field("topic", &self.topic)
            .field("reason", &self.reason)
            .field("group", &self.group)
            .field("entry", &self.entry)
            .field("deliveries", &self.deliveries)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_its_own_fields_from_the_original() {
        let dead = RawEntry {
            id: "9-0".into(),
            fields: vec![
                (REASON.into(), b"refused".to_vec()),
                (GROUP.into(), b"payments".to_vec()),
                (ENTRY.into(), b"3-0".to_vec()),
                (DELIVERIES.into(), b"4".to_vec()),
                (
                    b"oncebox_dead_reason".to_vec(),
                    b"an original field".to_vec(),
                ),
                (b"data".to_vec(), b"{}".to_vec()),
            ],
        };
        let letter = RedisDeadLetter::from_entry("orders", dead);
        assert_eq!(
            (
                letter.reason(),
                letter.group(),
                letter.entry_id(),
                letter.deliveries()
            ),
            ("refused", "payments", "3-0", 4)
        );
        // Only the leading four are the dead letter's own.
        assert_eq!(letter.fields().count(), 2);
        let received = letter.received().expect("decodes");
        assert_eq!(
            received.headers.get("oncebox_dead_reason"),
            Some("an original field")
        );
        assert_eq!(&received.payload[..], b"{}");
        assert_eq!(received.coordinates.to_string(), "orders/3-0");
    }
}
