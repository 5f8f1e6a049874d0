//! The migrator of oncebox's tables, whatever the database: its versions, and the table
//! it records them in.

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{AssertSqlSafe, SqlSafeStr};

/// A migrator of `versions` (each its number, its description and its SQL, in order,
/// every statement idempotent), recording what it applied in `table`, apart from the
/// application's own `_sqlx_migrations`.
pub fn migrator(
    table: String,
    versions: impl IntoIterator<Item = (i64, &'static str, String)>,
) -> Migrator {
    let migrations = versions
        .into_iter()
        .map(|(version, description, sql)| {
            Migration::new(
                version,
                description.into(),
                MigrationType::Simple,
                AssertSqlSafe(sql).into_sql_str(),
                false,
            )
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(table);
    migrator
}
