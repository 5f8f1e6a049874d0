//! The embedded schema and its migrator.

use sqlx::migrate::Migrator;

/// The table in which [`migrator`] records applied migrations, in the connection's
/// database, apart from the application's own `_sqlx_migrations`.
pub const MIGRATIONS_TABLE: &str = "_oncebox_migrations";

/// The schema, version 1: the raw SQL of `migrations/0001_init.sql`, for teams that apply
/// migrations with their own tool:
///
/// ```text
/// mysql --database=app < migrations/0001_init.sql
/// ```
///
/// It creates oncebox's tables (all named `oncebox_*`) in the current database. Every
/// statement is idempotent, which matters on MySQL: each DDL statement commits on its
/// own, so a run that stopped half way is finished by running the file again.
pub const SCHEMA_V1: &str = include_str!("../migrations/0001_init.sql");

/// The schema, version 2: the raw SQL of `migrations/0002_claims.sql`, applied after
/// [`SCHEMA_V1`]. It adds `oncebox_claims`, the table of live claims that holds the
/// relays' leases, and drops the lease columns of the spool tables. Idempotent like
/// version 1. Leases held while it runs are dropped, so their rows are delivered once
/// more: stop the relays first if that matters.
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

/// The tables the migrations create in the current database, every one of which the
/// services' role reads and writes (`oncebox doctor` checks that it may). A test holds
/// this list to the migrations' `CREATE TABLE` statements.
pub const TABLES: &[&str] = &[
    "oncebox_outbox",
    "oncebox_key_locks",
    "oncebox_claim_locks",
    "oncebox_inbox",
    "oncebox_durable_inbox",
    "oncebox_dedup",
    "oncebox_claims",
    "oncebox_inbox_duplicates",
];

/// The migrator of oncebox's tables, recording its work in `_oncebox_migrations`.
///
/// [`MySqlStore::migrate`](crate::MySqlStore::migrate) runs it; call it directly to
/// migrate through a connection or pool of your own:
///
/// ```no_run
/// # async fn demo(pool: &sqlx::MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
/// oncebox_mysql::migrator().run(pool).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_are_those_the_migrations_create() {
        let mut created: Vec<&str> = [SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5]
            .iter()
            .flat_map(|sql| sql.split("CREATE TABLE IF NOT EXISTS ").skip(1))
            .map(|rest| {
                rest.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .next()
                    .unwrap_or("")
            })
            .collect();
        for sql in [SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5] {
            assert!(
                !sql.to_uppercase().contains("DROP TABLE"),
                "a migration drops a table: update TABLES"
            );
        }
        created.sort_unstable();
        let mut tables = TABLES.to_vec();
        tables.sort_unstable();
        assert_eq!(created, tables);
    }
}
