//! Batch enqueue: many messages in one statement, in the caller's transaction.

use std::collections::HashSet;

use oncebox_core::{Error, InvalidMessage, Message, MessageId, Result, trace};
use sqlx::Row as _;
use sqlx::postgres::{PgConnection, PgDatabaseError};

use super::PgOutbox;
use crate::error::{is_unique_violation, store_error};
use crate::ident::{KEY_CLASS, literal};
use crate::spool::query;
use crate::time::to_micros;

/// The parts of the batch statement that differ between oncebox's own table and a
/// Debezium-style one.
pub(crate) struct BatchTarget<'a> {
    /// The table, qualified and quoted.
    pub(crate) table: &'a str,
    /// The table's oid as an `int4` expression, for the key locks.
    pub(crate) oid: &'a str,
    /// `INSERT INTO table (columns) SELECT` values over the batch's rows `b` (columns
    /// `id`, `topic`, `key`, `kind`, `headers`, `payload`, `created`).
    pub(crate) insert: String,
    /// What the insert returns for each row.
    pub(crate) returning: &'a str,
}

/// The batch enqueue statement: `$1` ids, `$2` topics (aggregate types), `$3` keys,
/// `$4` kinds, `$5` headers JSON, `$6` payloads, `$7` creation times (µs), all arrays of
/// one length, in the batch's order → `duplicate` (the first id of the batch already in
/// the table, in batch order, or NULL) and `inserted` (rows written).
///
/// If an id is already in the table, nothing is locked, notified or written. Otherwise
/// the statement takes the advisory locks of the batch's distinct keys in ascending
/// order of their lock keys (`hashtext(key) # table oid`), all before the first row is
/// inserted, then inserts the rows in batch order, so that their `seq`s follow it; with
/// `channel`, it notifies once.
pub(crate) fn statement(target: &BatchTarget<'_>, channel: Option<&str>) -> String {
    let BatchTarget {
        table,
        oid,
        insert,
        returning,
    } = target;
    let (notify, notified) = match channel {
        Some(channel) => (
            format!(
                "notified AS MATERIALIZED (
  SELECT 1 AS one FROM pg_notify({}, '') WHERE NOT EXISTS (SELECT FROM duplicate)
),
",
                literal(channel)
            ),
            ", (SELECT count(*) FROM notified) AS notified",
        ),
        None => (String::new(), ""),
    };
    format!(
        "WITH b AS MATERIALIZED (
  SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[],
                       $6::bytea[], $7::bigint[])
    WITH ORDINALITY AS b (id, topic, key, kind, headers, payload, created_us, ord)
),
duplicate AS MATERIALIZED (
  SELECT b.id FROM b WHERE EXISTS (SELECT FROM {table} AS t WHERE t.id = b.id)
  ORDER BY b.ord LIMIT 1
),
guard AS MATERIALIZED (
  SELECT count(*) AS locked
  FROM (SELECT DISTINCT hashtext(b.key) # {oid} AS lock_key FROM b
        WHERE b.key IS NOT NULL AND NOT EXISTS (SELECT FROM duplicate)
        ORDER BY lock_key) AS k,
       LATERAL pg_advisory_xact_lock({KEY_CLASS}, k.lock_key) AS l
),
{notify}inserted AS (
  {insert}
  FROM (SELECT b.*, (timestamptz 'epoch' + b.created_us * interval '1 microsecond') AS created
        FROM b) AS b, guard
  WHERE NOT EXISTS (SELECT FROM duplicate)
  ORDER BY b.ord
  RETURNING {returning}
)
SELECT (SELECT id::text FROM duplicate) AS duplicate,
       (SELECT count(*) FROM inserted) AS inserted{notified}"
    )
}

/// The columns of a batch, one array per parameter of [`statement`].
#[derive(Default)]
struct Columns {
    ids: Vec<String>,
    topics: Vec<String>,
    keys: Vec<Option<String>>,
    kinds: Vec<String>,
    headers: Vec<String>,
    payloads: Vec<Vec<u8>>,
    created: Vec<i64>,
}

impl PgOutbox {
    /// Writes `messages` into the outbox on `conn`, in one statement, as if each were
    /// [`enqueue`](Self::enqueue)d in turn on the same transaction: each message is
    /// published if and only if that transaction commits, the ids are the messages' own,
    /// and relays publish each key's messages in slice order, after the key's messages
    /// of earlier enqueues of the transaction and before those of later ones. Never
    /// opens a transaction of its own. An empty slice does nothing.
    ///
    /// The batch is written whole or not at all: a message `enqueue` would refuse
    /// refuses the batch, and nothing of it is written.
    ///
    /// The messages are bound as arrays, so a batch takes 7 parameters whatever its
    /// length; its size is bounded by memory and by PostgreSQL's 1 GB limit on one
    /// parameter (the sum of a batch's payloads, say). The statement first takes the
    /// advisory locks of the batch's distinct keys (see [`enqueue`](Self::enqueue)),
    /// *all* of them before any row gets its `seq`, in ascending order of their lock
    /// keys (the keys' hashes), whatever the order of the slice: two transactions that
    /// each enqueue one batch never deadlock on these locks. A transaction that also
    /// enqueues other keys one by one, or several batches, holds locks taken in more
    /// than one order, and may deadlock as the docs of `enqueue` say (PostgreSQL then
    /// aborts one of them with a transient error, 40P01, to retry). With
    /// [`with_notify`](Self::with_notify) on, the statement notifies once for the
    /// batch.
    ///
    /// Each message gets its own `create` span, as with `enqueue`, open while the
    /// statement runs.
    ///
    /// ```no_run
    /// # async fn demo(outbox: &oncebox_postgres::PgOutbox, pool: &sqlx::PgPool)
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
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The first of these, in this order; nothing of the batch is written:
    ///
    /// - [`Error::InvalidMessage`] for the first message, in slice order, that fails the
    ///   checks of [`enqueue`](Self::enqueue) ([`Error::InvalidOptions`] for a topic
    ///   without a Debezium-style table's prefix, as there); no statement runs, so the
    ///   transaction stays usable.
    /// - [`Error::Duplicate`] naming the first id that the slice repeats; no statement
    ///   runs.
    /// - [`Error::Duplicate`] naming the first id of the slice (in slice order) whose
    ///   message is in the outbox, committed or enqueued earlier in this transaction
    ///   (pending, done within retention, or dead). The statement writes nothing and
    ///   locks nothing then, so the transaction stays usable.
    /// - [`Error::Duplicate`] if a concurrent transaction enqueued one of the ids and had
    ///   not committed when the statement read the table: the statement waits for it
    ///   and, if it commits, fails with a unique violation, which **aborts the
    ///   transaction**: roll it back. (One-by-one `enqueue` waits the same way but
    ///   leaves the transaction usable.) If PostgreSQL's report does not name an id of
    ///   the batch, a store error instead.
    /// - A store error otherwise; the transaction is then aborted: roll it back.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped the rows may or may not be written in the transaction;
    /// roll it back.
    pub async fn enqueue_batch(&self, conn: &mut PgConnection, messages: &[Message]) -> Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        let mut ids = HashSet::with_capacity(messages.len());
        let mut columns = Columns::default();
        for message in messages {
            let topic = self.batch_topic(message)?;
            if !ids.insert(message.id) {
                return Err(Error::Duplicate { id: message.id });
            }
            columns.ids.push(message.id.to_string());
            columns.topics.push(topic);
            columns.keys.push(message.key.clone());
            columns.kinds.push(message.kind.clone());
            columns.payloads.push(message.payload.to_vec());
            columns.created.push(to_micros(message.created_at));
        }
        // One `create` span per message, as `enqueue` opens, each open for the statement.
        let spans: Vec<_> = messages
            .iter()
            .map(|message| {
                let (span, headers) = trace::creation(message);
                columns.headers.push(headers.to_json());
                span
            })
            .collect();
        let statement = if self.notify {
            &self.sql.enqueue_batch_notify
        } else {
            &self.sql.enqueue_batch
        };
        let result = query(statement)
            .bind(columns.ids)
            .bind(columns.topics)
            .bind(columns.keys)
            .bind(columns.kinds)
            .bind(columns.headers)
            .bind(columns.payloads)
            .bind(columns.created)
            .fetch_one(&mut *conn)
            .await;
        let enqueued = match result {
            Ok(row) => written(&row, messages.len()),
            Err(e) if is_unique_violation(&e) => match conflicting_id(&e, &ids) {
                Some(id) => Err(Error::Duplicate { id }),
                None => Err(store_error(e)),
            },
            Err(e) => Err(store_error(e)),
        };
        if let Err(error) = &enqueued {
            for span in &spans {
                trace::record_error(span, error);
            }
        }
        enqueued
    }

    /// The checks of [`enqueue`](Self::enqueue) on one message of a batch; the value of
    /// its topic column.
    fn batch_topic(&self, message: &Message) -> Result<String> {
        message.validate(&self.limits)?;
        let topic = self.sql().aggregate_type(&message.topic)?;
        if self.sql.json_payload {
            serde_json::from_slice::<serde::de::IgnoredAny>(&message.payload)
                .map_err(InvalidMessage::Json)?;
        }
        Ok(topic)
    }
}

/// What the batch statement's row says: `Ok` if it wrote all `len` rows.
fn written(row: &sqlx::postgres::PgRow, len: usize) -> Result<()> {
    let duplicate: Option<String> = row.try_get("duplicate").map_err(store_error)?;
    if let Some(id) = duplicate {
        let id = MessageId::parse(&id)
            .map_err(|e| Error::store_permanent(format!("duplicate id {id:?}: {e}")))?;
        return Err(Error::Duplicate { id });
    }
    let inserted: i64 = row.try_get("inserted").map_err(store_error)?;
    if usize::try_from(inserted).ok() == Some(len) {
        Ok(())
    } else {
        Err(Error::store_permanent(format!(
            "the batch enqueue wrote {inserted} rows of {len}"
        )))
    }
}

/// The id of the batch (`ids`) that a unique violation names in its detail
/// (`Key (id)=(…) already exists.`), if any.
fn conflicting_id(error: &sqlx::Error, ids: &HashSet<MessageId>) -> Option<MessageId> {
    let detail = error
        .as_database_error()?
        .try_downcast_ref::<PgDatabaseError>()?
        .detail()?;
    detail
        .split("=(")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .filter_map(|value| MessageId::parse(value).ok())
        .find(|id| ids.contains(id))
}
