//! Batch enqueue: many messages in one insert, in the caller's transaction.

use std::collections::HashSet;

use oncebox_core::{Error, Message, Result, trace};
use sqlx::mysql::MySqlConnection;

use super::{MAX_KEY_BYTES, MAX_NAME_CHARS, MySqlOutbox};
use crate::error::{check_bytes, check_chars, is_duplicate_key, store_error};
use crate::sql::{LIST, MAX_LIST, bind_list, query, query_owned, with_list};

/// Locks the key slots `{list}` to the end of the transaction, in ascending order.
const LOCK_SLOTS: &str =
    "SELECT slot FROM oncebox_key_locks WHERE slot IN ({list}) ORDER BY slot FOR UPDATE";

/// `?` the batch as a JSON array of `[id in hex, topic, key in hex, kind, headers JSON,
/// payload in hex, created at (ms)]`: the rows in the array's order. Binary columns
/// travel in hex so that no character set touches them.
const ENQUEUE_BATCH: &str =
    "INSERT INTO oncebox_outbox (id, topic, `key`, kind, headers, payload, created_at)
SELECT UNHEX(b.id), b.topic, UNHEX(b.k), b.kind, b.headers, UNHEX(b.payload), b.created_at
FROM JSON_TABLE(?, '$[*]' COLUMNS (
    ord FOR ORDINALITY,
    id CHAR(32) PATH '$[0]',
    topic VARCHAR(255) PATH '$[1]',
    k VARCHAR(1024) PATH '$[2]',
    kind VARCHAR(255) PATH '$[3]',
    headers LONGTEXT PATH '$[4]',
    payload LONGTEXT PATH '$[5]',
    created_at BIGINT PATH '$[6]')) AS b
ORDER BY b.ord";

/// `?` as for [`ENQUEUE_BATCH`] → the position (from 1) in the batch of the first
/// message whose id is in the outbox, by a locking read: it sees rows committed after
/// the transaction's snapshot, such as the one a duplicate-key error was about.
const FIRST_PRESENT: &str = "SELECT b.ord FROM JSON_TABLE(?, '$[*]' COLUMNS (
    ord FOR ORDINALITY, id CHAR(32) PATH '$[0]')) AS b
  STRAIGHT_JOIN oncebox_outbox AS t ON t.id = UNHEX(b.id)
ORDER BY b.ord LIMIT 1
LOCK IN SHARE MODE";

/// One message of a batch as [`ENQUEUE_BATCH`] reads it.
type BatchRow<'m> = (
    String,
    &'m str,
    Option<String>,
    &'m str,
    String,
    String,
    i64,
);

impl MySqlOutbox {
    /// Writes `messages` into the outbox on `conn` as if each were
    /// [`enqueue`](Self::enqueue)d in turn on the same transaction: each message is
    /// published if and only if that transaction commits, the ids are the messages'
    /// own, and the rows get their `seq`s in slice order, so relays publish each key's
    /// messages in slice order, after the key's messages of earlier enqueues and before
    /// those of later ones. Never opens a transaction of its own. An empty slice does
    /// nothing.
    ///
    /// The batch is written whole or not at all: a message `enqueue` would refuse
    /// refuses the batch, and nothing of it is written.
    ///
    /// Two statements, whatever the length of the batch: one locks the slots of the
    /// batch's keys in `oncebox_key_locks` (see [`enqueue`](Self::enqueue)), *all* of
    /// them before any row gets its `seq`, in ascending slot order whatever the order of
    /// the slice, so two transactions that each enqueue one batch never deadlock on them
    /// (a batch of more than 4,096 distinct slots takes one such statement per 4,096);
    /// then one `INSERT` writes every row, the batch travelling as one JSON parameter
    /// unpacked by `JSON_TABLE` (binary columns in hex), far from the 65,535
    /// placeholders of a statement. That parameter, twice the size of the payloads and
    /// more, must fit in the server's `max_allowed_packet` (MariaDB's default 16 MiB,
    /// MySQL's 64 MiB): split larger batches. A transaction that also enqueues keys one
    /// by one, or several batches, holds slots taken in more than one order and may
    /// deadlock as the docs of `enqueue` say.
    ///
    /// Each message gets its own `create` span, as with `enqueue`, open while the
    /// statements run.
    ///
    /// ```no_run
    /// # async fn demo(outbox: &oncebox_mysql::MySqlOutbox, pool: &sqlx::MySqlPool)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// use oncebox_core::Message;
    ///
    /// let mut tx = pool.begin().await?;
    /// // ... the business change, on &mut *tx ...
    /// let lines = (1..=100)
    ///     .map(|line| Message::json("orders", &line).map(|m| m.with_key("order-42")))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// outbox.enqueue_batch(&mut tx, &lines).await?;
    /// tx.commit().await?;
    /// outbox.wake();
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The first of these, in this order; nothing of the batch is written:
    ///
    /// - [`Error::InvalidMessage`] for the first message, in slice order, that breaks
    ///   the [limits](Self::with_limits), or a permanent store error whose source is a
    ///   [`ValueTooLong`](crate::ValueTooLong) for the first whose topic, kind or key
    ///   does not fit its column; no statement runs, so the transaction stays usable.
    /// - [`Error::Duplicate`] naming the first id that the slice repeats; no statement
    ///   runs.
    /// - [`Error::Duplicate`] naming the first id of the slice (in slice order) whose
    ///   message is in the outbox (pending, done within retention, or dead), committed,
    ///   enqueued earlier in this transaction or by a concurrent one that committed
    ///   while the insert waited for it. MySQL fails only the statement: the
    ///   transaction stays usable, and keeps the batch's key slots locked.
    /// - A store error otherwise (a deadlock, 1213, has rolled the transaction back).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped the rows may or may not be written in the transaction;
    /// roll it back.
    pub async fn enqueue_batch(
        &self,
        conn: &mut MySqlConnection,
        messages: &[Message],
    ) -> Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        let mut ids = HashSet::with_capacity(messages.len());
        let mut slots = Vec::new();
        for message in messages {
            message.validate(&self.limits)?;
            check_chars("topic", &message.topic, MAX_NAME_CHARS)?;
            check_chars("kind", &message.kind, MAX_NAME_CHARS)?;
            if let Some(key) = &message.key {
                check_bytes("key", key, MAX_KEY_BYTES)?;
                slots.push(i64::from(key_slot(key.as_bytes())));
            }
            if !ids.insert(message.id) {
                return Err(Error::Duplicate { id: message.id });
            }
        }
        slots.sort_unstable();
        slots.dedup();
        let mut spans = Vec::with_capacity(messages.len());
        let mut rows: Vec<BatchRow<'_>> = Vec::with_capacity(messages.len());
        for message in messages {
            let (span, headers) = trace::creation(message);
            spans.push(span);
            rows.push((
                hex(message.id.as_uuid().as_bytes()),
                &message.topic,
                message.key.as_deref().map(|key| hex(key.as_bytes())),
                &message.kind,
                headers.to_json(),
                hex(&message.payload),
                oncebox_core::time::to_unix_millis(message.created_at),
            ));
        }
        let enqueued = match serde_json::to_string(&rows) {
            Ok(batch) => insert_batch(conn, messages, &slots, &batch).await,
            Err(e) => Err(Error::store_permanent(format!("encoding the batch: {e}"))),
        };
        if let Err(error) = &enqueued {
            for span in &spans {
                trace::record_error(span, error);
            }
        }
        enqueued
    }
}

/// The statements of [`MySqlOutbox::enqueue_batch`]: the key slots (`slots`, sorted),
/// then the rows (`batch`, the JSON of `messages`).
async fn insert_batch(
    conn: &mut MySqlConnection,
    messages: &[Message],
    slots: &[i64],
    batch: &str,
) -> Result<()> {
    for chunk in slots.chunks(MAX_LIST) {
        debug_assert!(LOCK_SLOTS.contains(LIST));
        bind_list(query_owned(with_list(LOCK_SLOTS, chunk.len())), chunk)
            .execute(&mut *conn)
            .await
            .map_err(store_error)?;
    }
    let inserted = query(ENQUEUE_BATCH).bind(batch).execute(&mut *conn).await;
    match inserted {
        Ok(done) if done.rows_affected() == messages.len() as u64 => Ok(()),
        Ok(done) => Err(Error::store_permanent(format!(
            "the batch enqueue wrote {} rows of {}",
            done.rows_affected(),
            messages.len()
        ))),
        Err(e) if is_duplicate_key(&e) => {
            let present: Option<i64> = sqlx::query_scalar(FIRST_PRESENT)
                .bind(batch)
                .fetch_optional(&mut *conn)
                .await
                .map_err(store_error)?;
            let position = present.and_then(|ord| usize::try_from(ord).ok()?.checked_sub(1));
            match position.and_then(|i| messages.get(i)) {
                Some(message) => Err(Error::Duplicate { id: message.id }),
                None => Err(store_error(e)),
            }
        }
        Err(e) => Err(store_error(e)),
    }
}

/// The slot of `key` in `oncebox_key_locks`: `CRC32(key) & 65535`, as
/// [`LOCK_KEY`](super::LOCK_KEY) computes it in SQL.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    // CRC-32 (IEEE 802.3, reflected), MySQL's `CRC32()`.
    let mut crc = !0u32;
    for &byte in key {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    // The low 16 bits, as `& 65535` takes them.
    let [low, high, ..] = (!crc).to_le_bytes();
    u16::from_le_bytes([low, high])
}

/// `bytes` in lower-case hexadecimal, as `UNHEX` reads it.
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
    use super::{hex, key_slot};

    #[test]
    fn key_slots_are_mysql_crc32_low_bits() {
        // CRC32('123456789') = 0xCBF43926, the check value of CRC-32/ISO-HDLC.
        assert_eq!(key_slot(b"123456789"), 0x3926);
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn hex_is_lower_case_two_digits_a_byte() {
        assert_eq!(hex(&[0, 0x0f, 0xa5, 0xff]), "000fa5ff");
    }
}
