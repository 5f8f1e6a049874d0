//! The outbox's statements, for oncebox's own table and for Debezium-style tables.

use std::sync::Arc;

use oncebox_core::{Error, Result};
use oncebox_sql::OutboxColumns;

use crate::ident::{
    CLAIM_CLASS, HOLD_CLASS, KEY_CLASS, derived, literal, qualified, quote, table_oid,
};
use crate::spool::sql::{Columns, lock_key};
use crate::spool::{Layout, SpoolSql};
use crate::time::{micros_of, micros_param, millis_param};

use super::batch::{self, BatchTarget};
use super::debezium::{DebeziumLayout, DebeziumPayload};

/// Every statement of one outbox table, built once.
pub(crate) struct OutboxSql {
    pub(crate) spool: Arc<SpoolSql>,
    /// `$1` id, `$2` topic (aggregate type), `$3` key, `$4` kind, `$5` headers JSON,
    /// `$6` payload, `$7` created at (µs) → `seq`, or no row for a duplicate id.
    pub(crate) enqueue: Arc<str>,
    /// As `enqueue`, plus `pg_notify` in the same statement.
    pub(crate) enqueue_notify: Arc<str>,
    /// Many messages in one statement; see [`batch::statement`].
    pub(crate) enqueue_batch: Arc<str>,
    /// As `enqueue_batch`, plus one `pg_notify` in the same statement.
    pub(crate) enqueue_batch_notify: Arc<str>,
    /// Takes the claim lock and the hold lock, exclusively: replay is serialised with
    /// leased claims, and waits for held claims in flight.
    pub(crate) lock: Arc<str>,
    /// `$1` id: puts a dead row back to pending in its place (for oncebox's own table,
    /// only a row of the polling relay: `cdc_source` NULL).
    pub(crate) replay: Arc<str>,
    /// The replays of the log-tailing relay's dead rows (oncebox's own table only).
    pub(crate) replay_cdc: Option<CdcReplaySql>,
    pub(crate) stats: Arc<str>,
    /// `stats` without the count of done rows.
    pub(crate) backlog: Arc<str>,
    /// `$1` id.
    pub(crate) purge_dead: Arc<str>,
    /// `$1` id, `$2` due at (µs) or NULL, `$3` delay (µs) from now: sets a pending row's
    /// delivery time.
    pub(crate) schedule: Arc<str>,
    /// `$1` id: deletes the row if it is pending and no live lease holds it.
    pub(crate) cancel: Arc<str>,
    /// The listing's `SELECT` (a row's state and its message) and the expressions its
    /// filters compare, over alias `t`.
    pub(crate) listing: OutboxColumns,
    /// `$1` age ms → `minute` (minutes since the Unix epoch) and `published`, per minute
    /// of `done_at` since the database's now less the age, oldest first, from the minute
    /// of the first row published since then (none if there is none).
    pub(crate) published_per_minute: Arc<str>,
    /// The table, for [`PgOutbox::table`](crate::PgOutbox::table).
    pub(crate) table: String,
    /// The notification channel.
    pub(crate) channel: String,
    /// A Debezium-style table takes topics under this prefix only.
    pub(crate) topic_prefix: Option<String>,
    /// The payload must be JSON.
    pub(crate) json_payload: bool,
}

/// The replays of the log-tailing relay's dead rows, whose sources read no update: `$1`
/// the id. Each touches only a dead row of its source (`cdc_source`).
pub(crate) struct CdcReplaySql {
    /// Deletes the dead row of the table source and inserts it again as a new pending
    /// row (a fresh `seq`, attempts 0, its last error kept), whose insert the relay
    /// reads.
    pub(crate) table: Arc<str>,
    /// Deletes the dead row of the message source and emits its message again
    /// (`emit_message`: its id, its creation time), or, for content the relay could not
    /// read (kept under an empty topic), that content as it is: a row per emission.
    pub(crate) messages: Arc<str>,
}

/// The names of oncebox's own outbox table in `schema`.
pub(crate) fn native(schema: &str) -> OutboxSql {
    let table = qualified(schema, "outbox");
    let oid = table_oid(schema, "outbox");
    let layout = Layout {
        table: table.clone(),
        display: format!("{schema}.outbox"),
        oid: oid.clone(),
        col: Columns::plain(),
        item: format!(
            "t.id::text AS id, t.topic AS topic, t.key AS key, t.kind AS kind, \
             t.headers::text AS headers, t.payload AS payload, {} AS created_at",
            micros_of("t.created_at")
        ),
        scope: None,
    };
    let enqueue = |notify: Option<&str>| {
        format!(
            "WITH guard AS MATERIALIZED (
  SELECT CASE WHEN $3::text IS NULL THEN false
         ELSE (SELECT true FROM pg_advisory_xact_lock({KEY_CLASS}, hashtext($3::text) # {oid}))
         END AS keyed{notify}
)
INSERT INTO {table} (id, topic, key, kind, headers, payload, created_at)
SELECT $1::uuid, $2, $3, $4, $5::jsonb, $6, {created} FROM guard
ON CONFLICT DO NOTHING
RETURNING seq",
            notify = notify_from(notify),
            created = micros_param(7),
        )
    };
    let channel = derived(schema, "outbox");
    let batch = BatchTarget {
        table: &table,
        oid: &oid,
        insert: format!(
            "INSERT INTO {table} (id, topic, key, kind, headers, payload, created_at)
  SELECT b.id, b.topic, b.key, b.kind, b.headers, b.payload, b.created"
        ),
        returning: "seq",
    };
    OutboxSql {
        enqueue: enqueue(None).into(),
        enqueue_notify: enqueue(Some(&channel)).into(),
        enqueue_batch: batch::statement(&batch, None).into(),
        enqueue_batch_notify: batch::statement(&batch, Some(&channel)).into(),
        replay: replay(&layout, " AND t.cdc_source IS NULL").into(),
        replay_cdc: Some(cdc_replay(schema, &table)),
        channel,
        topic_prefix: None,
        json_payload: false,
        ..admin(&layout, "t.topic", "t.created_at")
    }
}

/// The replays of the log-tailing relay's dead rows in oncebox's own table `table` of
/// `schema`.
fn cdc_replay(schema: &str, table: &str) -> CdcReplaySql {
    let message = "id, topic, key, kind, headers, payload, created_at";
    let dead = |source: &str, returning: &str| {
        format!(
            "DELETE FROM {table}
  WHERE id = $1::uuid AND status = 'dead' AND cdc_source = '{source}'
  RETURNING {returning}"
        )
    };
    CdcReplaySql {
        table: format!(
            "WITH dead AS ({delete})
INSERT INTO {table} ({message}, last_error)
SELECT {message}, last_error FROM dead",
            delete = dead("table", &format!("{message}, last_error")),
        )
        .into(),
        // The prefix is `cdc::message_prefix`'s, which the relay reads.
        messages: format!(
            "WITH dead AS ({delete})
SELECT CASE WHEN d.topic = ''
  THEN pg_logical_emit_message(true, {prefix}, d.payload)::text
  ELSE {emit}(d.id, d.topic, d.key, d.kind, d.headers, d.payload, d.created_at)::text
  END AS emitted
FROM dead AS d",
            delete = dead("messages", message),
            prefix = literal(&format!("{schema}.outbox")),
            emit = qualified(schema, "emit_message"),
        )
        .into(),
    }
}

/// Puts the dead row `$1` of `layout`'s table back to pending, due now, attempts 0, in
/// its place; `only` narrows the rows it may touch (` AND …` over alias `t`). A row
/// whose key has later rows under a live lease gets a lease without a holder until the
/// last of them ends, so no second relay takes the key meanwhile.
fn replay(layout: &Layout, only: &str) -> String {
    let c = &layout.col;
    format!(
        "UPDATE {t} AS t
SET {status} = 'pending', {attempts} = 0, {available_at} = statement_timestamp(),
    {dead_at} = NULL, {lease_token} = NULL,
    {lease_until} = (
      SELECT max(p.{lease_until}) FROM {t} AS p
      WHERE p.{key} = t.{key} AND p.{status} = 'pending'
        AND p.{lease_until} > statement_timestamp())
WHERE t.id = $1::uuid AND t.{status} = 'dead'{only}",
        t = layout.table,
        status = c.status,
        attempts = c.attempts,
        available_at = c.available_at,
        dead_at = c.dead_at,
        lease_token = c.lease_token,
        lease_until = c.lease_until,
        key = c.key,
    )
}

/// The names of a Debezium-style table.
/// A Debezium-style table's creation time, its columns prefixed with `alias`: the
/// timestamp column if the layout names one (oncebox's own when that is NULL), else
/// oncebox's. The listing's order and the index of the table's migration are this
/// expression, so that the index serves the order.
pub(crate) fn created_expression(timestamp: Option<&str>, alias: &str) -> String {
    match timestamp {
        Some(column) => format!(
            "coalesce({alias}{}, {alias}oncebox_created_at)",
            quote(column)
        ),
        None => format!("{alias}oncebox_created_at"),
    }
}

pub(crate) fn debezium(layout_options: &DebeziumLayout) -> OutboxSql {
    let (schema, name) = (layout_options.schema(), layout_options.name());
    let table = qualified(schema, name);
    let oid = table_oid(schema, name);
    let prefix = layout_options.prefix();
    let created = created_expression(layout_options.timestamp(), "t.");
    let payload_read = match layout_options.payload_type() {
        DebeziumPayload::Bytea => "coalesce(t.payload, ''::bytea)".to_owned(),
        _ => "coalesce(convert_to(t.payload::text, 'UTF8'), ''::bytea)".to_owned(),
    };
    let payload_write = match layout_options.payload_type() {
        DebeziumPayload::Bytea => "$6".to_owned(),
        DebeziumPayload::Json => "convert_from($6, 'UTF8')::json".to_owned(),
        _ => "convert_from($6, 'UTF8')::jsonb".to_owned(),
    };
    let mut col = Columns::prefixed("oncebox_");
    col.key = "aggregateid".to_owned();
    let layout = Layout {
        table: table.clone(),
        display: format!("{schema}.{name}"),
        oid,
        col,
        item: format!(
            "t.id::text AS id, {prefix} || t.aggregatetype::text AS topic, \
             NULLIF(t.aggregateid::text, '') AS key, coalesce(t.\"type\"::text, '') AS kind, \
             coalesce(t.oncebox_headers::text, '{{}}') AS headers, {payload_read} AS payload, \
             {created_us} AS created_at",
            prefix = literal(prefix),
            created_us = micros_of(&created),
        ),
        scope: None,
    };
    let created_column = match layout_options.timestamp() {
        Some(column) => quote(column),
        None => "oncebox_created_at".to_owned(),
    };
    // The table's trigger takes the key lock and allocates `oncebox_seq`, for every
    // producer; oncebox's own enqueue only inserts.
    let enqueue = |notify: Option<&str>| {
        format!(
            "WITH guard AS MATERIALIZED (SELECT 1 AS one{notify})
INSERT INTO {table} (id, aggregatetype, aggregateid, \"type\", payload, oncebox_headers, {created_column})
SELECT $1::uuid, $2, coalesce($3, ''), $4, {payload_write}, $5::jsonb, {created} FROM guard
ON CONFLICT DO NOTHING
RETURNING oncebox_seq",
            notify = notify_from(notify),
            created = micros_param(7),
        )
    };
    let channel = derived(&format!("{schema}_{name}"), "outbox");
    // The batch takes the keys' locks in a fixed order before the trigger takes them
    // again (advisory locks are reentrant), row by row.
    let oid = table_oid(schema, name);
    let batch = BatchTarget {
        table: &table,
        oid: &oid,
        insert: format!(
            "INSERT INTO {table} (id, aggregatetype, aggregateid, \"type\", payload, oncebox_headers, {created_column})
  SELECT b.id, b.topic, coalesce(b.key, ''), b.kind, {payload}, b.headers, b.created",
            payload = payload_write.replace("$6", "b.payload"),
        ),
        returning: "oncebox_seq",
    };
    OutboxSql {
        enqueue: enqueue(None).into(),
        enqueue_notify: enqueue(Some(&channel)).into(),
        enqueue_batch: batch::statement(&batch, None).into(),
        enqueue_batch_notify: batch::statement(&batch, Some(&channel)).into(),
        channel,
        topic_prefix: Some(prefix.to_owned()),
        json_payload: !matches!(layout_options.payload_type(), DebeziumPayload::Bytea),
        ..admin(&layout, "t.aggregatetype", &created)
    }
}

/// ` FROM pg_notify('channel', '')`: evaluated once per enqueue, in its transaction.
fn notify_from(channel: Option<&str>) -> String {
    match channel {
        Some(channel) => format!(" FROM pg_notify({}, '') AS notified", literal(channel)),
        None => String::new(),
    }
}

/// The columns of the figures of rows waiting, over `layout`'s table: `waiting` (every
/// pending row), `scheduled` (pending, never attempted, due later: a scheduled message),
/// `dead`, and `oldest_pending`, how long the first pending row in commit order that
/// is not scheduled ahead has waited: for a row never attempted, since the later of
/// `created` (over alias `t`) and the time it became due, else since `created`. Counting
/// the scheduled rows reads each pending row.
fn waiting(layout: &Layout, created: &str) -> String {
    let c = &layout.col;
    let scheduled = format!(
        "t.{attempts} = 0 AND t.{available_at} > statement_timestamp()",
        attempts = c.attempts,
        available_at = c.available_at,
    );
    format!(
        "(SELECT count(*) FROM {t} WHERE {status} = 'pending') AS waiting,
  (SELECT count(*) FROM {t} AS t WHERE t.{status} = 'pending' AND {scheduled}) AS scheduled,
  (SELECT count(*) FROM {t} WHERE {status} = 'dead') AS dead,
  (SELECT (extract(epoch FROM statement_timestamp()
             - CASE WHEN t.{attempts} = 0 THEN greatest({created}, t.{available_at})
                    ELSE {created} END) * 1000000)::bigint
   FROM {t} AS t WHERE t.{status} = 'pending' AND NOT ({scheduled})
   ORDER BY t.{seq} LIMIT 1) AS oldest_pending",
        t = layout.table,
        status = c.status,
        attempts = c.attempts,
        available_at = c.available_at,
        seq = c.seq,
    )
}

/// The statements every layout shares; `topic` is the column holding the topic and
/// `created` the creation time, over alias `t`.
fn admin(layout: &Layout, topic: &str, created: &str) -> OutboxSql {
    let c = &layout.col;
    let t = &layout.table;
    let select = format!(
        "SELECT t.{seq} AS seq, t.{status} AS status, t.{attempts} AS attempts,
       t.{last_error} AS last_error, {available_at} AS available_at,
       {lease_until} AS lease_until, {done_at} AS done_at, {dead_at} AS dead_at, {item}
FROM {t} AS t",
        seq = c.seq,
        status = c.status,
        attempts = c.attempts,
        last_error = c.last_error,
        available_at = micros_of(&format!("t.{}", c.available_at)),
        lease_until = micros_of(&format!("t.{}", c.lease_until)),
        done_at = micros_of(&format!("t.{}", c.done_at)),
        dead_at = micros_of(&format!("t.{}", c.dead_at)),
        item = layout.item,
    );
    OutboxSql {
        spool: Arc::new(SpoolSql::build(layout)),
        enqueue: Arc::from(""),
        enqueue_notify: Arc::from(""),
        enqueue_batch: Arc::from(""),
        enqueue_batch_notify: Arc::from(""),
        lock: format!(
            "SELECT pg_advisory_xact_lock({CLAIM_CLASS}, {key}),
       pg_advisory_xact_lock({HOLD_CLASS}, {key})",
            key = lock_key(layout, 1)
        )
        .into(),
        replay: replay(layout, "").into(),
        replay_cdc: None,
        stats: format!(
            "SELECT
  (SELECT count(*) FROM {t} WHERE {status} = 'done') AS done,
  {waiting}",
            status = c.status,
            waiting = waiting(layout, created),
        )
        .into(),
        backlog: format!("SELECT {}", waiting(layout, created)).into(),
        purge_dead: format!(
            "DELETE FROM {t} WHERE id = $1::uuid AND {status} = 'dead'",
            status = c.status,
        )
        .into(),
        schedule: format!(
            "UPDATE {t}
SET {available_at} = CASE WHEN $2::bigint IS NULL
    THEN statement_timestamp() + $3::bigint * interval '1 microsecond'
    ELSE {at} END
WHERE id = $1::uuid AND {status} = 'pending'",
            available_at = c.available_at,
            at = micros_param(2),
            status = c.status,
        )
        .into(),
        cancel: format!(
            "DELETE FROM {t}
WHERE id = $1::uuid AND {status} = 'pending'
  AND ({lease_until} IS NULL OR {lease_until} <= statement_timestamp())",
            status = c.status,
            lease_until = c.lease_until,
        )
        .into(),
        // One count per minute, each over its range of the index of done rows by time,
        // from the first row (one index probe: `min` over one table, not a join):
        // grouping by an expression of `done_at` instead sorts every row of the range
        // (the planner takes each time for a group of its own), on disk past
        // `work_mem`, which doubled the time of an hour of 3.5 million rows.
        published_per_minute: format!(
            "WITH since AS MATERIALIZED (SELECT statement_timestamp() - {age} AS at),
first AS MATERIALIZED (
  SELECT min(t.{done_at}) AS at FROM {t} AS t
  WHERE t.{status} = 'done' AND t.{done_at} >= (SELECT at FROM since))
SELECT floor(extract(epoch FROM m.start) / 60)::bigint AS minute, c.published
FROM since, first,
  generate_series(to_timestamp(floor(extract(epoch FROM first.at) / 60) * 60),
                  statement_timestamp(), interval '1 minute') AS m (start),
  LATERAL (
    SELECT count(*) AS published FROM {t} AS t
    WHERE t.{status} = 'done' AND t.{done_at} >= greatest(m.start, since.at)
      AND t.{done_at} < m.start + interval '1 minute') AS c
WHERE c.published > 0
ORDER BY m.start",
            done_at = c.done_at,
            status = c.status,
            age = millis_param(1),
        )
        .into(),
        listing: {
            let mut listing = OutboxColumns::named(t, select, &c.key, &micros_of(created));
            listing.seq = format!("t.{}", c.seq);
            listing.status = format!("t.{}", c.status);
            listing.topic = topic.to_owned();
            listing.created = created.to_owned();
            listing
        },
        table: t.clone(),
        channel: String::new(),
        topic_prefix: None,
        json_payload: false,
    }
}

impl OutboxSql {
    /// The value of the topic column: the topic, or for a Debezium-style table the
    /// aggregate type (the topic without the configured prefix).
    pub(crate) fn aggregate_type(&self, topic: &str) -> Result<String> {
        match &self.topic_prefix {
            None => Ok(topic.to_owned()),
            Some(prefix) => match topic.strip_prefix(prefix.as_str()) {
                Some(aggregate) if !aggregate.is_empty() => Ok(aggregate.to_owned()),
                _ => Err(Error::InvalidOptions(format!(
                    "topic {topic:?} does not start with this outbox's topic prefix {prefix:?} \
                     followed by an aggregate type"
                ))),
            },
        }
    }
}

impl std::fmt::Debug for OutboxSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxSql")
            .field("table", &self.table)
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}
