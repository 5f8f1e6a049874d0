//! Relaying an existing table in Debezium's outbox layout.

use oncebox_core::{Error, Result};

use super::sql::created_expression;
use crate::ident::{self, KEY_CLASS, derived, qualified, quote};

/// The type of the `payload` column of a Debezium-style outbox table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DebeziumPayload {
    /// `jsonb` (Debezium's documented layout). The relay publishes the JSON text as
    /// PostgreSQL renders it (`jsonb` does not keep the producer's spacing or key order).
    #[default]
    Jsonb,
    /// `json`: the JSON text as the producer wrote it.
    Json,
    /// `bytea`: the bytes as they are.
    Bytea,
}

/// An existing outbox table in [Debezium's outbox event router] layout, relayed by
/// oncebox so that producers can switch relays without changing what they insert.
///
/// The table has Debezium's columns: `id uuid` (the message id), `aggregatetype` (→ the
/// topic, after [`topic_prefix`](Self::topic_prefix)), `aggregateid` (→ the ordering key;
/// an empty string means no key), `type` (→ the kind), `payload` (`jsonb`, `json` or
/// `bytea`, see [`DebeziumPayload`]) and optionally a timestamp column (→ the creation
/// time). [`PgStore::migrate_debezium`](crate::PgStore::migrate_debezium) adds what the
/// relay needs beside them; [`DebeziumLayout::migration_sql`] is the same SQL for teams
/// that apply it with their own tool:
///
/// - bookkeeping columns, all prefixed `oncebox_` and all with defaults, so producers keep
///   inserting only Debezium's columns: `oncebox_seq` (commit order), `oncebox_status`,
///   `oncebox_attempts`, `oncebox_available_at`, `oncebox_lease_token`,
///   `oncebox_lease_until`, `oncebox_last_error`, `oncebox_done_at`, `oncebox_dead_at`,
///   `oncebox_headers` (`jsonb`, for oncebox producers' trace context) and
///   `oncebox_created_at`;
/// - a `BEFORE INSERT` trigger that takes the per-key advisory lock and then allocates
///   `oncebox_seq`, so that each aggregate's events are published in commit order even
///   when several producers insert them concurrently;
/// - the partial indexes of the claim, retention and dead-letter queries.
///
/// Rows already in the table when the columns are added count as **published** (status
/// `done`): a table that Debezium has been relaying holds rows it already published.
/// Switch over without a gap by running the migration while Debezium still runs, then
/// starting oncebox's relay, then stopping Debezium: rows inserted in between are
/// published by both (consumers deduplicate on the id). To relay old rows as well, set
/// their `oncebox_status` to `'pending'`.
///
/// Adding `oncebox_seq` fills it for existing rows, which rewrites the table under an
/// exclusive lock: outbox tables are small (Debezium setups often delete rows right after
/// inserting them — a producer that does so must stop, or the relay never sees its rows).
/// Retention cleanup deletes published rows, as for oncebox's own outbox.
///
/// ```
/// use oncebox_postgres::{DebeziumLayout, DebeziumPayload};
///
/// let layout = DebeziumLayout::new("public.outbox_events")
///     .payload(DebeziumPayload::Jsonb)
///     .timestamp_column("timestamp")
///     .topic_prefix("outbox.event.");
/// layout.validate().unwrap();
/// assert!(layout.migration_sql().unwrap().contains("oncebox_seq"));
/// ```
///
/// [Debezium's outbox event router]: https://debezium.io/documentation/reference/stable/transformations/outbox-event-router.html
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct DebeziumLayout {
    schema: String,
    name: String,
    payload: DebeziumPayload,
    timestamp: Option<String>,
    prefix: String,
}

impl DebeziumLayout {
    /// The table `table`: `name` (in schema `public`) or `schema.name`. Defaults: `jsonb`
    /// payload, no timestamp column, no topic prefix.
    pub fn new(table: &str) -> Self {
        let (schema, name) = table.split_once('.').unwrap_or(("public", table));
        Self {
            schema: schema.to_owned(),
            name: name.to_owned(),
            payload: DebeziumPayload::Jsonb,
            timestamp: None,
            prefix: String::new(),
        }
    }

    /// The type of the `payload` column. Default: [`DebeziumPayload::Jsonb`].
    pub fn payload(mut self, payload: DebeziumPayload) -> Self {
        self.payload = payload;
        self
    }

    /// A `timestamp`/`timestamptz` column holding the event's time (Debezium's
    /// `table.field.event.timestamp`). Default: none; the time of the insert is used.
    pub fn timestamp_column(mut self, column: &str) -> Self {
        self.timestamp = Some(column.to_owned());
        self
    }

    /// Prepended to `aggregatetype` to make the topic, as Debezium's
    /// `route.topic.replacement` does (`outbox.event.` there by default). Letters, digits,
    /// `.`, `_` and `-` only. Default: none (the topic is the aggregate type).
    pub fn topic_prefix(mut self, prefix: &str) -> Self {
        prefix.clone_into(&mut self.prefix);
        self
    }

    /// The table, schema-qualified and quoted.
    pub fn table(&self) -> String {
        qualified(&self.schema, &self.name)
    }

    /// Checks the names.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a schema, table or column name outside
    /// `[a-z_][a-z0-9_]*` (at most 63 bytes), or a topic prefix with other characters than
    /// letters, digits, `.`, `_` and `-`.
    pub fn validate(&self) -> Result<()> {
        ident::validate("schema", &self.schema)?;
        ident::validate("table", &self.name)?;
        if let Some(column) = &self.timestamp {
            ident::validate("timestamp column", column)?;
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if !self.prefix.chars().all(allowed) {
            return Err(Error::InvalidOptions(format!(
                "invalid topic prefix {:?}: letters, digits, '.', '_' and '-' only",
                self.prefix
            )));
        }
        Ok(())
    }

    pub(crate) fn schema(&self) -> &str {
        &self.schema
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn payload_type(&self) -> DebeziumPayload {
        self.payload
    }

    pub(crate) fn timestamp(&self) -> Option<&str> {
        self.timestamp.as_deref()
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The SQL that prepares the table for oncebox's relay (see the type docs). Every
    /// statement is idempotent.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] if the layout fails [`DebeziumLayout::validate`].
    pub fn migration_sql(&self) -> Result<String> {
        self.validate()?;
        let schema = &self.schema;
        let table = self.table();
        let object = |suffix: &str| qualified(schema, &derived(&self.name, suffix));
        let index = |suffix: &str| quote(&derived(&self.name, suffix));
        let sequence = object("oncebox_seq");
        let function = object("oncebox_order");
        let trigger = index("oncebox_order");
        Ok(format!(
            "-- oncebox bookkeeping for the Debezium-style outbox table {table}.
CREATE SEQUENCE IF NOT EXISTS {sequence};

-- Existing rows get a seq in their physical order, and count as published.
ALTER TABLE {table}
    ADD COLUMN IF NOT EXISTS oncebox_seq bigint NOT NULL DEFAULT nextval('{sequence}');
ALTER TABLE {table}
    ADD COLUMN IF NOT EXISTS oncebox_status text NOT NULL DEFAULT 'done'
        CHECK (oncebox_status IN ('pending', 'done', 'dead')),
    ADD COLUMN IF NOT EXISTS oncebox_done_at timestamptz DEFAULT now();
-- New rows: the trigger allocates the seq; they are pending until published.
ALTER TABLE {table}
    ALTER COLUMN oncebox_seq DROP DEFAULT,
    ALTER COLUMN oncebox_status SET DEFAULT 'pending',
    ALTER COLUMN oncebox_done_at DROP DEFAULT;
ALTER TABLE {table}
    ADD COLUMN IF NOT EXISTS oncebox_attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS oncebox_available_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN IF NOT EXISTS oncebox_lease_token uuid,
    ADD COLUMN IF NOT EXISTS oncebox_lease_until timestamptz,
    ADD COLUMN IF NOT EXISTS oncebox_last_error text,
    ADD COLUMN IF NOT EXISTS oncebox_dead_at timestamptz,
    ADD COLUMN IF NOT EXISTS oncebox_headers jsonb,
    ADD COLUMN IF NOT EXISTS oncebox_created_at timestamptz NOT NULL DEFAULT now();

CREATE UNIQUE INDEX IF NOT EXISTS {seq_index} ON {table} (oncebox_seq);
CREATE INDEX IF NOT EXISTS {pending} ON {table} (oncebox_seq)
    WHERE oncebox_status = 'pending';
CREATE INDEX IF NOT EXISTS {pending_key} ON {table} (aggregateid, oncebox_seq)
    WHERE oncebox_status = 'pending' AND aggregateid IS NOT NULL;
CREATE INDEX IF NOT EXISTS {pending_unkeyed} ON {table} (oncebox_seq)
    WHERE oncebox_status = 'pending' AND aggregateid IS NULL;
CREATE INDEX IF NOT EXISTS {done} ON {table} (oncebox_done_at)
    WHERE oncebox_status = 'done';
CREATE INDEX IF NOT EXISTS {dead} ON {table} (oncebox_seq)
    WHERE oncebox_status = 'dead';
-- Listings filtered by creation time read rows newest first from this index.
CREATE INDEX IF NOT EXISTS {created_index} ON {table} (({created}), oncebox_seq);

-- Per-aggregate commit order for every producer: lock the aggregate, then take the seq.
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $oncebox$
BEGIN
    IF NEW.aggregateid IS NOT NULL AND NEW.aggregateid::text <> '' THEN
        PERFORM pg_advisory_xact_lock({KEY_CLASS}, hashtext(NEW.aggregateid::text) # TG_RELID::int4);
    END IF;
    NEW.oncebox_seq := nextval('{sequence}');
    RETURN NEW;
END
$oncebox$;
DROP TRIGGER IF EXISTS {trigger} ON {table};
CREATE TRIGGER {trigger} BEFORE INSERT ON {table}
    FOR EACH ROW EXECUTE FUNCTION {function}();
",
            seq_index = index("oncebox_seq_key"),
            pending = index("oncebox_pending"),
            pending_key = index("oncebox_pending_key"),
            pending_unkeyed = index("oncebox_pending_unkeyed"),
            done = index("oncebox_done"),
            dead = index("oncebox_dead"),
            created_index = index("oncebox_created"),
            created = created_expression(self.timestamp(), ""),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(DebeziumLayout::new("outbox").validate().is_ok());
        assert_eq!(
            DebeziumLayout::new("outbox").table(),
            "\"public\".\"outbox\""
        );
        assert!(DebeziumLayout::new("app.outbox").validate().is_ok());
        for bad in ["", "a.b.c", "Outbox", "out;box", "x.\"y\""] {
            assert!(DebeziumLayout::new(bad).validate().is_err(), "{bad}");
        }
        let bad_prefix = DebeziumLayout::new("outbox").topic_prefix("it's");
        assert!(bad_prefix.validate().is_err());
        let bad_column = DebeziumLayout::new("outbox").timestamp_column("ts\"");
        assert!(bad_column.migration_sql().is_err());
    }
}
