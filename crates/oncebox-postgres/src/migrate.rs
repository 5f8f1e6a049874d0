//! The embedded schema and its migrator.

use oncebox_core::Result;
use sqlx::migrate::Migrator;

use crate::ident::{self, qualified, quote};

/// The schema [`PgStore::connect`](crate::PgStore::connect) uses unless told otherwise.
pub const DEFAULT_SCHEMA: &str = "oncebox";

/// The table, in the store's schema, in which [`migrator`] records applied migrations,
/// apart from the application's own `_sqlx_migrations`.
pub const MIGRATIONS_TABLE: &str = "_oncebox_migrations";

/// The placeholder for the schema in [`SCHEMA_V1`], in psql's variable syntax.
pub const SCHEMA_PLACEHOLDER: &str = ":\"schema\"";

/// The schema, version 1: the raw SQL of `migrations/0001_init.sql`, for teams that apply
/// migrations with their own tool. The schema name is the psql variable `:"schema"`:
///
/// ```text
/// psql -v schema=oncebox -v ON_ERROR_STOP=1 -f migrations/0001_init.sql
/// ```
///
/// or use [`schema_sql`] for the text with a schema filled in. Every statement is
/// idempotent.
pub const SCHEMA_V1: &str = include_str!("../migrations/0001_init.sql");

/// Version 2, applied after [`SCHEMA_V1`]: the inbox's records indexed by consumer and
/// time, for the purge each consumer makes of its own records
/// (`migrations/0002_inbox_by_consumer.sql`, with the same `:"schema"` variable).
/// Idempotent.
pub const SCHEMA_V2: &str = include_str!("../migrations/0002_inbox_by_consumer.sql");

/// `migrations/0003_emit.sql`: the `emit` function of the log-tailing relay's message
/// mode.
pub const SCHEMA_V3: &str = include_str!("../migrations/0003_emit.sql");

/// `migrations/0004_duplicates.sql`: the duplicates each inbox consumer skipped, counted.
pub const SCHEMA_V4: &str = include_str!("../migrations/0004_duplicates.sql");

/// `migrations/0005_outbox_by_creation.sql`: the outbox's rows indexed by creation time,
/// for listings filtered by time. The migrator builds it in its transaction, which holds
/// enqueues back while it runs: on a large outbox, build it first with `CREATE INDEX
/// CONCURRENTLY` (the file says how).
pub const SCHEMA_V5: &str = include_str!("../migrations/0005_outbox_by_creation.sql");

/// `migrations/0006_cdc_dead_letters.sql`: the outbox's `cdc_source` column, which says
/// which source of the log-tailing relay wrote a dead row, so that
/// [`PgOutbox::replay_dead`](crate::PgOutbox::replay_dead) hands it back to that source;
/// the `emit_message` function (a message with a given id and creation time), which
/// `emit` now calls.
pub const SCHEMA_V6: &str = include_str!("../migrations/0006_cdc_dead_letters.sql");

/// `migrations/0007_cdc_slots.sql`: the log-tailing relay's record of the slots it
/// read, by which it tells a slot that vanished from one never created.
pub const SCHEMA_V7: &str = include_str!("../migrations/0007_cdc_slots.sql");

/// Every version of the schema in order ([`SCHEMA_V1`] to [`SCHEMA_V7`]), with `schema`
/// filled in.
///
/// # Errors
///
/// [`Error::InvalidOptions`](oncebox_core::Error::InvalidOptions) if `schema` is not a
/// valid schema name (`[a-z_][a-z0-9_]*`, at most 63 bytes, not starting with `pg_`).
pub fn schema_sql(schema: &str) -> Result<String> {
    ident::validate("schema", schema)?;
    let schema = quote(schema);
    let versions = [
        SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5, SCHEMA_V6, SCHEMA_V7,
    ];
    Ok(versions
        .map(|sql| sql.replace(SCHEMA_PLACEHOLDER, &schema))
        .join("\n"))
}

/// The migrator of oncebox's tables in `schema`: creates the schema if needed and
/// records its work in `<schema>._oncebox_migrations`.
///
/// [`PgStore::migrate`](crate::PgStore::migrate) runs it; call it directly to migrate
/// through a connection or pool of your own:
///
/// ```no_run
/// # async fn demo(pool: &sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// oncebox_postgres::migrator("oncebox")?.run(pool).await?;
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`Error::InvalidOptions`](oncebox_core::Error::InvalidOptions) if `schema` is not a
/// valid schema name.
pub fn migrator(schema: &str) -> Result<Migrator> {
    ident::validate("schema", schema)?;
    let quoted = quote(schema);
    let versions = [
        (1, "oncebox init", SCHEMA_V1),
        (2, "oncebox inbox by consumer", SCHEMA_V2),
        (3, "oncebox emit", SCHEMA_V3),
        (4, "oncebox duplicates", SCHEMA_V4),
        (5, "oncebox outbox by creation", SCHEMA_V5),
        (6, "oncebox cdc dead letters", SCHEMA_V6),
        (7, "oncebox cdc slots", SCHEMA_V7),
    ];
    let mut migrator = oncebox_sql::migrator(
        qualified(schema, MIGRATIONS_TABLE),
        versions
            .map(|(version, name, sql)| (version, name, sql.replace(SCHEMA_PLACEHOLDER, &quoted))),
    );
    migrator.create_schema(quoted);
    Ok(migrator)
}
