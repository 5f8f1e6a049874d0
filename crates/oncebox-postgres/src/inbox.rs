//! The transactional inbox on PostgreSQL: its statements, for the inbox written once in
//! `oncebox-sql`.

use std::sync::Arc;
use std::time::SystemTime;

use oncebox_core::sql::sql_limit;
use oncebox_sql::{InboxDialect, Query, SqlInbox};
use sqlx::Postgres;

use crate::dialect::PgDialect;
use crate::ident::qualified;
use crate::spool::query;
use crate::time::{micros_of, millis_param, ms_since};

/// The inbox's statements, built once per schema.
pub(crate) struct InboxSql {
    /// The record's insert up to its values, for [`InboxDialect::begin_recorded`].
    insert_record: Arc<str>,
    /// `$1` consumer, `$2` id.
    record: Arc<str>,
    /// `$1` consumer, `$2` id → `result`.
    stored_result: Arc<str>,
    /// `$1` consumer, `$2` id, `$3` result.
    store_result: Arc<str>,
    /// `$1` age ms, `$2` limit.
    purge: Arc<str>,
    /// `$1` consumer.
    count_duplicate: Arc<str>,
    /// → `consumer`, `handled`, `pending`, `dead`, `duplicates`, `last_handled` (µs) per
    /// consumer, in byte order of the name.
    consumers: Arc<str>,
    /// `SELECT <a durable inbox row> FROM <durable inbox> AS d`, for the listing to add
    /// its conditions to.
    rows: Arc<str>,
    /// The transactional inbox's name in errors.
    display: Arc<str>,
    /// The durable inbox's name in errors.
    durable_display: Arc<str>,
}

impl InboxSql {
    pub(crate) fn new(schema: &str) -> Self {
        let t = qualified(schema, "inbox");
        let durable = qualified(schema, "durable_inbox");
        let duplicates = qualified(schema, "inbox_duplicates");
        let insert_record = format!("INSERT INTO {t} (consumer, message_id, processed_at)");
        Self {
            record: format!(
                "{insert_record}
VALUES ($1, $2, statement_timestamp())
ON CONFLICT (consumer, message_id) DO NOTHING"
            )
            .into(),
            insert_record: insert_record.into(),
            stored_result: format!(
                "SELECT result FROM {t} WHERE consumer = $1 AND message_id = $2"
            )
            .into(),
            store_result: format!(
                "INSERT INTO {t} (consumer, message_id, result, processed_at)
VALUES ($1, $2, $3, statement_timestamp())
ON CONFLICT (consumer, message_id) DO UPDATE SET result = excluded.result"
            )
            .into(),
            purge: format!(
                "DELETE FROM {t} WHERE consumer = $1 AND message_id IN (
  SELECT message_id FROM {t}
  WHERE consumer = $1 AND processed_at < statement_timestamp() - {age}
  ORDER BY processed_at
  LIMIT $3
  FOR UPDATE SKIP LOCKED)",
                age = millis_param(2)
            )
            .into(),
            rows: format!(
                "SELECT d.seq AS seq, d.consumer AS consumer, d.dedup_id AS dedup_id,
  d.status AS status, d.attempts AS attempts, d.last_error AS last_error,
  {available} AS available_at, {lease} AS lease_until, {done} AS done_at, {dead} AS dead_at,
  {received_at} AS received_at, d.result AS result,
  d.message_id::text AS message_id, d.topic AS topic, d.key AS key, d.kind AS kind,
  d.headers::text AS headers, d.payload AS payload, {created} AS created_at,
  d.source AS source, d.partition AS partition, d.position AS position,
  d.delivery_count AS delivery_count
FROM {durable} AS d",
                available = micros_of("d.available_at"),
                lease = micros_of("d.lease_until"),
                done = micros_of("d.done_at"),
                dead = micros_of("d.dead_at"),
                received_at = micros_of("d.received_at"),
                created = micros_of("d.created_at"),
            )
            .into(),
            display: format!("{schema}.inbox").into(),
            durable_display: format!("{schema}.durable_inbox").into(),
            count_duplicate: format!(
                "INSERT INTO {duplicates} AS d (consumer, skipped, last_at)
VALUES ($1, 1, statement_timestamp())
ON CONFLICT (consumer) DO UPDATE SET skipped = d.skipped + 1, last_at = excluded.last_at"
            )
            .into(),
            consumers: format!(
                "SELECT consumer, sum(handled)::bigint AS handled, sum(pending)::bigint AS pending,
  sum(dead)::bigint AS dead, sum(duplicates)::bigint AS duplicates,
  {last} AS last_handled
FROM (
  SELECT consumer, count(*) AS handled, 0 AS pending, 0 AS dead, 0 AS duplicates,
    max(processed_at) AS last_at
  FROM {t} GROUP BY consumer
  UNION ALL
  SELECT consumer,
    count(*) FILTER (WHERE status = 'done'),
    count(*) FILTER (WHERE status = 'pending'),
    count(*) FILTER (WHERE status = 'dead'),
    0,
    max(done_at) FILTER (WHERE status = 'done')
  FROM {durable} GROUP BY consumer
  UNION ALL
  SELECT consumer, 0, 0, 0, skipped, NULL FROM {duplicates}
) AS figures
GROUP BY consumer
ORDER BY consumer COLLATE \"C\"",
                last = micros_of("max(last_at)")
            )
            .into(),
        }
    }
}

/// The transactional inbox: records of the ids each consumer processed, written in the
/// handler's transaction (table `<schema>.inbox`, keyed by consumer and id); and the
/// inbox admin of the schema.
///
/// [`record`](oncebox_core::store::InboxStore::record) inserts with `ON CONFLICT DO
/// NOTHING`: of concurrent transactions recording the same id, one inserts and the
/// others wait on the unique key until it commits (then they see a duplicate and its
/// result) or rolls back (then one of them inserts). Transactions are PostgreSQL's
/// default, read committed; the handler runs its queries on `&mut **tx`.
///
/// [`begin_recorded`](oncebox_core::store::InboxStore::begin_recorded), the engine's
/// first step, sends the record's insert and `BEGIN` as one message (a simple query): a
/// new id costs the handler's transaction one round trip, not two. The insert runs in
/// the transaction the `BEGIN` opens, and commits or rolls back with the handler's
/// effects. It has no `ON CONFLICT`: a recorded id fails it with a unique violation (after
/// waiting, as above, for a transaction in flight), which ends the message before the
/// `BEGIN`; then the insert above runs in a transaction of its own making and reads the
/// first result. So a duplicate costs three round trips, and the server logs its unique
/// violation as an error, with the statement and, as for any unique violation, the key's
/// values in its detail. The message runs to its end in a task of its own: a caller
/// that stops waiting leaves no transaction open on a pooled connection.
///
/// A simple query carries no parameters: that insert holds the consumer name and the id
/// as hexadecimal digits (`convert_from(decode('…', 'hex'), 'UTF8')`), text that no value
/// can break out of. Every other statement binds them as parameters; sqlx prepares each
/// once per connection and caches it.
///
/// The admin's [`consumers`](oncebox_core::consumer::InboxAdmin::consumers) reads, in
/// one statement, every record of the transactional inbox (from the table or its
/// `(consumer, processed_at)` index, as the planner finds cheaper) and every row of the
/// durable inbox (from the table: no index holds the dead rows): call it at the pace of
/// a dashboard, not per message. Its
/// [`inbox_rows`](oncebox_core::consumer::InboxAdmin::inbox_rows) reads newest first
/// from `before`: on the primary key, or with a consumer and status pending, on the
/// partial index of the consumer's pending rows. The other criteria have no index of
/// their own: the rows read are filtered until `limit` match, which reads every row
/// older than `before` where matches are rare.
pub type PgInbox = SqlInbox<PgDialect>;

impl InboxDialect for PgDialect {
    fn begin_recorded(&self, consumer: &str, id: &str) -> Option<String> {
        Some(format!(
            "{insert} VALUES ({consumer}, {id}, statement_timestamp()); BEGIN",
            insert = self.inbox.insert_record,
            consumer = text_literal(consumer),
            id = text_literal(id),
        ))
    }

    fn record(&self, consumer: &str, id: &str) -> Query<Postgres> {
        query(&self.inbox.record)
            .bind(consumer.to_owned())
            .bind(id.to_owned())
    }

    fn stored_result(&self, consumer: &str, id: &str) -> Query<Postgres> {
        query(&self.inbox.stored_result)
            .bind(consumer.to_owned())
            .bind(id.to_owned())
    }

    fn store_result(&self, consumer: &str, id: &str, result: &[u8]) -> Query<Postgres> {
        query(&self.inbox.store_result)
            .bind(consumer.to_owned())
            .bind(id.to_owned())
            .bind(result.to_vec())
    }

    fn purge(&self, consumer: &str, before: SystemTime, limit: usize) -> Query<Postgres> {
        query(&self.inbox.purge)
            .bind(consumer.to_owned())
            .bind(ms_since(before))
            .bind(sql_limit(limit))
    }

    fn count_duplicate(&self, consumer: &str) -> Query<Postgres> {
        query(&self.inbox.count_duplicate).bind(consumer.to_owned())
    }

    fn consumers(&self) -> Query<Postgres> {
        query(&self.inbox.consumers)
    }

    fn durable_rows(&self) -> &str {
        &self.inbox.rows
    }

    const DURABLE_KEY: &'static str = "d.key";

    fn inbox_table(&self) -> &str {
        &self.inbox.display
    }

    fn durable_table(&self) -> &str {
        &self.inbox.durable_display
    }
}

/// `value` as a text expression whose literal holds hexadecimal digits only: safe in a
/// statement by construction, whatever `value` holds, and decoded by the server into the
/// same text a bound parameter would be (a NUL, which text cannot hold, fails it as it
/// fails a parameter).
fn text_literal(value: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    const OPEN: &str = "pg_catalog.convert_from(pg_catalog.decode('";
    const CLOSE: &str = "', 'hex'), 'UTF8')";
    let mut sql = String::with_capacity(OPEN.len() + 2 * value.len() + CLOSE.len());
    sql.push_str(OPEN);
    for byte in value.bytes() {
        sql.push(char::from(HEX[usize::from(byte >> 4)]));
        sql.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    sql.push_str(CLOSE);
    sql
}

impl std::fmt::Debug for InboxSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxSql").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::text_literal;

    #[test]
    fn text_literals_hold_hex_digits_only() {
        assert_eq!(
            text_literal("a'\\é"),
            "pg_catalog.convert_from(pg_catalog.decode('61275cc3a9', 'hex'), 'UTF8')"
        );
        assert_eq!(
            text_literal(""),
            "pg_catalog.convert_from(pg_catalog.decode('', 'hex'), 'UTF8')"
        );
    }
}
