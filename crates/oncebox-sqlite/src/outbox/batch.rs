//! Batch enqueue: many messages in one statement, in the caller's transaction.

use std::collections::HashSet;
use std::time::SystemTime;

use oncebox_core::time::to_unix_millis;
use oncebox_core::{Error, Message, Result, trace};
use sqlx::sqlite::SqliteConnection;

use super::SqliteOutbox;
use crate::error::{is_unique_violation, store_error};

/// `?1` the batch as a JSON array of `[id, topic, key, kind, headers JSON, payload in
/// hex, created at (ms)]`, `?2` now (ms): the rows in the array's order.
const ENQUEUE_BATCH: &str = "\
INSERT INTO oncebox_outbox (id, topic, key, kind, headers, payload, created_at, available_at)
SELECT m.value ->> 0, m.value ->> 1, m.value ->> 2, m.value ->> 3, m.value ->> 4,
       unhex(m.value ->> 5), m.value ->> 6, ?2
FROM json_each(?1) AS m
ORDER BY m.key";

/// `?1` as for [`ENQUEUE_BATCH`] → the position in the batch of the first message
/// whose id is in the outbox.
const FIRST_PRESENT: &str = "\
SELECT m.key FROM json_each(?1) AS m
WHERE EXISTS (SELECT 1 FROM oncebox_outbox AS o WHERE o.id = m.value ->> 0)
ORDER BY m.key
LIMIT 1";

/// One message of a batch as [`ENQUEUE_BATCH`] reads it.
type BatchRow<'m> = (
    String,
    &'m str,
    Option<&'m str>,
    &'m str,
    String,
    String,
    i64,
);

impl SqliteOutbox {
    /// Writes `messages` into the outbox on `conn`, in one statement, as if each were
    /// [`enqueue`](Self::enqueue)d in turn on the same transaction: each message is
    /// published if and only if that transaction commits, the ids are the messages'
    /// own, and the rows are in slice order, so relays publish each key's messages in
    /// slice order, after the key's messages of earlier enqueues and before those of
    /// later ones. Never opens a transaction of its own. An empty slice does nothing.
    ///
    /// The batch is written whole or not at all: a message `enqueue` would refuse
    /// refuses the batch, and nothing of it is written.
    ///
    /// The batch travels as one JSON parameter (payloads in hex), unpacked by
    /// `json_each`, so any number of messages takes one statement and one parameter,
    /// far from SQLite's limit on bound variables; the JSON text, twice the size of the
    /// payloads and more, must stay under SQLite's limit on a string or blob
    /// (`SQLITE_MAX_LENGTH`, a billion bytes by default). It needs SQLite 3.41 or later
    /// (`unhex`), as the SQLite this crate builds by default is.
    ///
    /// Each message gets its own `create` span, as with `enqueue`, open while the
    /// statement runs.
    ///
    /// ```
    /// # async fn demo(outbox: &oncebox_sqlite::SqliteOutbox, pool: &sqlx::SqlitePool)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// use oncebox_core::Message;
    ///
    /// let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    /// // ... the business change, on &mut *tx ...
    /// let lines = (1..=100)
    ///     .map(|line| Message::json("orders", &line).map(|m| m.with_key("order-42")))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// outbox.enqueue_batch(&mut *tx, &lines).await?;
    /// tx.commit().await?;
    /// outbox.wake();
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The first of these, in this order; nothing of the batch is written, and the
    /// transaction stays usable (only the statement, if any ran, failed):
    ///
    /// - [`Error::InvalidMessage`] for the first message, in slice order, that breaks
    ///   the [limits](Self::with_limits); no statement runs.
    /// - [`Error::Duplicate`] naming the first id that the slice repeats; no statement
    ///   runs.
    /// - [`Error::Duplicate`] naming the first id of the slice (in slice order) whose
    ///   message is in the outbox, committed or enqueued earlier in this transaction
    ///   (pending, done within retention, or dead).
    ///
    /// A store error otherwise; roll the transaction back.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped the rows may or may not be written in the transaction;
    /// roll it back.
    pub async fn enqueue_batch(
        &self,
        conn: &mut SqliteConnection,
        messages: &[Message],
    ) -> Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        let mut ids = HashSet::with_capacity(messages.len());
        for message in messages {
            message.validate(&self.limits)?;
            if !ids.insert(message.id) {
                return Err(Error::Duplicate { id: message.id });
            }
        }
        let mut spans = Vec::with_capacity(messages.len());
        let mut rows: Vec<BatchRow<'_>> = Vec::with_capacity(messages.len());
        for message in messages {
            let (span, headers) = trace::creation(message);
            spans.push(span);
            rows.push((
                message.id.to_string(),
                &message.topic,
                message.key.as_deref(),
                &message.kind,
                headers.to_json(),
                hex(&message.payload),
                to_unix_millis(message.created_at),
            ));
        }
        let batch = serde_json::to_string(&rows)
            .map_err(|e| Error::store_permanent(format!("encoding the batch: {e}")))?;
        let now = to_unix_millis(SystemTime::now());
        let result = sqlx::query(ENQUEUE_BATCH)
            .bind(&batch)
            .bind(now)
            .execute(&mut *conn)
            .await;
        let enqueued = match result {
            Ok(done) if done.rows_affected() == messages.len() as u64 => Ok(()),
            Ok(done) => Err(Error::store_permanent(format!(
                "the batch enqueue wrote {} rows of {}",
                done.rows_affected(),
                messages.len()
            ))),
            Err(e) if is_unique_violation(&e) => {
                let present: Option<i64> = sqlx::query_scalar(FIRST_PRESENT)
                    .bind(&batch)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(store_error)?;
                match present.and_then(|i| messages.get(usize::try_from(i).ok()?)) {
                    Some(message) => Err(Error::Duplicate { id: message.id }),
                    None => Err(store_error(e)),
                }
            }
            Err(e) => Err(store_error(e)),
        };
        if let Err(error) = &enqueued {
            for span in &spans {
                trace::record_error(span, error);
            }
        }
        enqueued
    }
}

/// `bytes` in lower-case hexadecimal, as `unhex` reads it.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::hex;

    #[test]
    fn hex_is_lower_case_two_digits_a_byte() {
        assert_eq!(hex(&[0, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex(&[]), "");
    }
}
