//! The embedded schema and its migrator.

use sqlx::migrate::Migrator;

/// The table in which [`migrator`] records applied migrations, apart from the
/// application's own `_sqlx_migrations`.
pub const MIGRATIONS_TABLE: &str = "_oncebox_migrations";

/// The schema, version 1: the raw SQL of `migrations/0001_init.sql`, for teams that apply
/// migrations with their own tool. Every statement is idempotent.
pub const SCHEMA_V1: &str = include_str!("../migrations/0001_init.sql");

/// Version 2, applied after [`SCHEMA_V1`]: leases held by a table of claims instead of
/// columns of the claimed rows (`migrations/0002_claims.sql`). Apply it once, with the
/// relays stopped: it drops the lease columns.
pub const SCHEMA_V2: &str = include_str!("../migrations/0002_claims.sql");

/// Version 3, applied after [`SCHEMA_V2`]: the inbox's records indexed by consumer and
/// time, for the purge each consumer makes of its own records
/// (`migrations/0003_inbox_by_consumer.sql`). Idempotent; safe with relays running.
pub const SCHEMA_V3: &str = include_str!("../migrations/0003_inbox_by_consumer.sql");

/// Version 4, applied after [`SCHEMA_V3`]: the duplicates each inbox consumer skipped,
/// counted (`migrations/0004_duplicates.sql`). Idempotent; safe with relays running.
pub const SCHEMA_V4: &str = include_str!("../migrations/0004_duplicates.sql");

/// Version 5, applied after [`SCHEMA_V4`]: the outbox's rows indexed by creation time, for
/// listings filtered by time (`migrations/0005_outbox_by_creation.sql`). Idempotent.
pub const SCHEMA_V5: &str = include_str!("../migrations/0005_outbox_by_creation.sql");

/// The migrator of oncebox's tables, recording its work in [`MIGRATIONS_TABLE`].
///
/// [`SqliteStore::migrate`](crate::SqliteStore::migrate) runs it; call it directly to
/// migrate through a connection or pool of your own:
///
/// ```
/// # async fn demo(pool: &sqlx::SqlitePool) -> Result<(), sqlx::migrate::MigrateError> {
/// oncebox_sqlite::migrator().run(pool).await?;
/// # Ok(()) }
/// ```
pub fn migrator() -> Migrator {
    let versions = [
        (1, "oncebox init", SCHEMA_V1),
        (2, "oncebox claims", SCHEMA_V2),
        (3, "oncebox inbox by consumer", SCHEMA_V3),
        (4, "oncebox duplicates", SCHEMA_V4),
        (5, "oncebox outbox by creation", SCHEMA_V5),
    ];
    oncebox_sql::migrator(
        MIGRATIONS_TABLE.to_owned(),
        versions.map(|(version, name, sql)| (version, name, sql.to_owned())),
    )
}
