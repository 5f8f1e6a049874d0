//! The log-tailing relay's dead letters: what it will not publish becomes a dead outbox
//! row with its reason, where `oncebox dead-letters` lists, replays and purges it.
//!
//! A dead letter must always be storable, whatever a producer wrote: its content came
//! from outside (any language may call `pg_logical_emit_message`), and a dead letter
//! that cannot be stored would stop the relay at the same WAL position at every start.
//! So text PostgreSQL refuses (a NUL character) is replaced and the reason says so, and
//! if the row still cannot be written, the raw content is stored alone.

use std::collections::BTreeMap;

use oncebox_core::{Message, MessageId, Result};
use pgwire_replication::Lsn;
use sqlx::PgPool;

use crate::error::store_error;

/// The statements, built once for the outbox table.
pub(crate) struct DeadLetters {
    /// A message that has no row (message mode): inserted dead, marked as the message
    /// source's (a replay emits it again), unless its id is already there (a dead
    /// letter written again after a crash).
    insert: String,
    /// A row of the table (table mode): marked dead, as the table source's (a replay
    /// inserts it again).
    mark: String,
    attempts: i32,
}

/// What does not fit in a text column: PostgreSQL's text (and jsonb) cannot hold NUL.
const REFUSED: char = '\0';

impl DeadLetters {
    pub(crate) fn new(table: &str, max_attempts: u32) -> Self {
        Self {
            insert: format!(
                "INSERT INTO {table} (id, topic, key, kind, headers, payload, created_at, \
                 status, attempts, last_error, dead_at, cdc_source) \
                 VALUES ($1::uuid, $2, $3, $4, $5::jsonb, $6, \
                 to_timestamp($7::float8 / 1e6), 'dead', $8, $9, now(), 'messages') \
                 ON CONFLICT (id) DO NOTHING"
            ),
            mark: format!(
                "UPDATE {table} SET status = 'dead', attempts = $2, last_error = $3, \
                 dead_at = now(), cdc_source = 'table' WHERE seq = $1"
            ),
            attempts: i32::try_from(max_attempts).unwrap_or(i32::MAX),
        }
    }

    /// Marks the outbox row `seq` dead (table mode). A row that is gone (published and
    /// deleted by the reader before this one, or purged) is left gone.
    pub(crate) async fn mark(&self, pool: &PgPool, seq: i64, reason: &str) -> Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(self.mark.as_str()))
            .bind(seq)
            .bind(self.attempts)
            .bind(storable(reason).0)
            .execute(pool)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    /// Inserts `message` as a dead row (message mode). Text the columns refuse is
    /// replaced, and said so in the reason; if the row still cannot be written, the
    /// message's raw `content` is stored under its id instead, with the error.
    pub(crate) async fn insert(
        &self,
        pool: &PgPool,
        message: &Message,
        content: &bytes::Bytes,
        reason: &str,
    ) -> Result<()> {
        let (row, replaced) = Row::of(message);
        let reason = match replaced.is_empty() {
            true => reason.to_owned(),
            false => format!(
                "{reason} (stored with NUL characters replaced by U+FFFD in: {})",
                replaced.join(", ")
            ),
        };
        match self.write(pool, &row, &reason).await {
            Err(error) if !error.is_transient() => {
                let raw = Row::raw(message.id, content);
                let reason = format!(
                    "{reason}; its fields could not be stored ({error}): the payload is the \
                     message's raw content"
                );
                self.write(pool, &raw, &reason).await
            }
            other => other,
        }
    }

    async fn write(&self, pool: &PgPool, row: &Row, reason: &str) -> Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(self.insert.as_str()))
            .bind(row.id.to_string())
            .bind(&row.topic)
            .bind(row.key.as_deref())
            .bind(&row.kind)
            .bind(&row.headers)
            .bind(&row.payload[..])
            .bind(row.created_at_micros as f64)
            .bind(self.attempts)
            .bind(storable(reason).0)
            .execute(pool)
            .await
            .map_err(store_error)?;
        Ok(())
    }
}

/// A dead row's values, in forms the columns take.
struct Row {
    id: MessageId,
    topic: String,
    key: Option<String>,
    kind: String,
    headers: String,
    payload: bytes::Bytes,
    created_at_micros: i64,
}

impl Row {
    /// `message`'s values, and the fields in which refused text was replaced.
    fn of(message: &Message) -> (Self, Vec<&'static str>) {
        let mut replaced = Vec::new();
        let mut text = |field: &'static str, value: &str| {
            let (value, changed) = storable(value);
            if changed && !replaced.contains(&field) {
                replaced.push(field);
            }
            value
        };
        let topic = text("topic", &message.topic);
        let key = message.key.as_deref().map(|key| text("key", key));
        let kind = text("kind", &message.kind);
        let headers: BTreeMap<String, String> = message
            .headers
            .iter()
            .map(|(name, value)| (text("headers", name), text("headers", value)))
            .collect();
        let row = Self {
            id: message.id,
            topic,
            key,
            kind,
            // A map of strings always serializes.
            headers: serde_json::to_string(&headers).unwrap_or_else(|_| "{}".into()),
            payload: message.payload.clone(),
            created_at_micros: crate::time::to_micros(message.created_at),
        };
        (row, replaced)
    }

    /// The raw content alone, under `id`.
    fn raw(id: MessageId, content: &bytes::Bytes) -> Self {
        Self {
            id,
            topic: String::new(),
            key: None,
            kind: String::new(),
            headers: "{}".into(),
            payload: content.clone(),
            created_at_micros: crate::time::to_micros(std::time::SystemTime::now()),
        }
    }
}

/// `text` with what a text column refuses replaced, and whether anything was.
fn storable(text: &str) -> (String, bool) {
    match text.contains(REFUSED) {
        true => (text.replace(REFUSED, "\u{FFFD}"), true),
        false => (text.to_owned(), false),
    }
}

/// The id of a dead letter for content that has none of its own (it cannot be
/// decoded): derived from the content's position in the WAL, so reading the same
/// content again (after a crash, before the position was confirmed) finds the dead
/// letter already there instead of adding a second one.
pub(crate) fn position_id(lsn: Lsn) -> MessageId {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(b"oncebox\0");
    bytes[8..].copy_from_slice(&lsn.as_u64().to_be_bytes());
    MessageId::from_uuid(uuid::Builder::from_custom_bytes(bytes).into_uuid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_characters_are_replaced_and_named() {
        let message = Message::new("or\0ders", "x")
            .with_key("k\0")
            .with_kind("Placed");
        let (row, replaced) = Row::of(&message);
        assert_eq!(row.topic, "or\u{FFFD}ders");
        assert_eq!(row.key.as_deref(), Some("k\u{FFFD}"));
        assert_eq!(replaced, ["topic", "key"]);
        assert_eq!(Row::of(&Message::new("orders", "x")).1, Vec::<&str>::new());
    }

    #[test]
    fn position_ids_are_stable_and_distinct() {
        assert_eq!(position_id(Lsn(42)), position_id(Lsn(42)));
        assert_ne!(position_id(Lsn(42)), position_id(Lsn(43)));
        assert_ne!(position_id(Lsn(1 << 40)), position_id(Lsn(1 << 41)));
    }
}
