//! The store's checks: its migrations, the role's rights on oncebox's tables, and its
//! clock against this host's.

use std::time::{Duration, SystemTime};

use oncebox::postgres::PgStore;

use super::Check;
use crate::service::backend::Database;

/// The store's checks after it answered.
pub(super) async fn checks(database: &Database, max_clock_difference: Duration) -> Vec<Check> {
    let mut checks = vec![migrations(database).await];
    if let Some(rights) = rights(database).await {
        checks.push(rights);
    }
    if let Some(clock) = clock(database, max_clock_difference).await {
        checks.push(clock);
    }
    checks
}

/// The versions this build knows and those the store recorded as applied.
async fn migrations(database: &Database) -> Check {
    let applied = |versions: Result<Vec<i64>, sqlx::Error>, known: Vec<i64>| match versions {
        Ok(applied) => {
            let missing: Vec<i64> = known
                .iter()
                .copied()
                .filter(|v| !applied.contains(v))
                .collect();
            if missing.is_empty() {
                Check::pass(
                    "migrations",
                    format!(
                        "current: version {}",
                        known.last().copied().unwrap_or_default()
                    ),
                )
            } else {
                Check::fail(
                    "migrations",
                    format!(
                        "{} of {} applied; missing version{} {}",
                        known.len() - missing.len(),
                        known.len(),
                        if missing.len() == 1 { "" } else { "s" },
                        missing
                            .iter()
                            .map(i64::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    "run `oncebox migrate` (or apply `oncebox migrate --print` with your own tool)",
                )
            }
        }
        Err(error) => Check::fail(
            "migrations",
            format!("oncebox's migrations table cannot be read: {error}"),
            "run `oncebox migrate` with a role that may create the tables",
        ),
    };
    match database {
        Database::Sqlite(store) => {
            let known = oncebox::sqlite::migrator()
                .iter()
                .map(|m| m.version)
                .collect();
            let versions = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT version FROM {} WHERE success ORDER BY version",
                oncebox::sqlite::MIGRATIONS_TABLE
            )))
            .fetch_all(store.pool())
            .await;
            applied(versions, known)
        }
        Database::Postgres(store) => {
            let known = match oncebox::postgres::migrator(store.schema()) {
                Ok(migrator) => migrator.iter().map(|m| m.version).collect(),
                Err(error) => {
                    return Check::fail("migrations", error.to_string(), "fix store.schema");
                }
            };
            let versions = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT version FROM \"{}\".\"{}\" WHERE success ORDER BY version",
                store.schema(),
                oncebox::postgres::MIGRATIONS_TABLE
            )))
            .fetch_all(store.pool())
            .await;
            applied(versions, known)
        }
        #[cfg(feature = "mysql")]
        Database::Mysql(store) => {
            let known = oncebox::mysql::migrator()
                .iter()
                .map(|m| m.version)
                .collect();
            let versions = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT version FROM {} WHERE success ORDER BY version",
                oncebox::mysql::MIGRATIONS_TABLE
            )))
            .fetch_all(store.pool())
            .await;
            applied(versions, known)
        }
    }
}

/// The role may read and write every table of oncebox's (but the migrations' own table,
/// which only `oncebox migrate` writes). SQLite has no roles.
async fn rights(database: &Database) -> Option<Check> {
    match database {
        Database::Sqlite(_) => None,
        Database::Postgres(store) => Some(postgres_rights(store).await),
        #[cfg(feature = "mysql")]
        Database::Mysql(store) => Some(mysql_rights(store).await),
    }
}

/// PostgreSQL: the role may use the schema, read and write every table of it and use its
/// sequences, as the catalog's privilege functions answer.
async fn postgres_rights(store: &PgStore) -> Check {
    let schema = store.schema();
    let missing: Result<Vec<String>, sqlx::Error> = sqlx::query_scalar(
        "SELECT c.relname || ' (' || array_to_string(ARRAY(
             SELECT p FROM unnest(CASE c.relkind WHEN 'S' THEN ARRAY['USAGE']
                                  ELSE ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE'] END) AS p
             WHERE NOT CASE c.relkind WHEN 'S' THEN has_sequence_privilege(c.oid, p)
                                      ELSE has_table_privilege(c.oid, p) END), ', ') || ')'
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relkind IN ('r', 'S', 'p') AND c.relname <> $2
           -- an identity column's sequence needs no right of its own
           AND NOT EXISTS (SELECT 1 FROM pg_depend d
                           WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'i')
           AND NOT CASE c.relkind WHEN 'S' THEN has_sequence_privilege(c.oid, 'USAGE')
               ELSE has_table_privilege(c.oid, 'SELECT') AND has_table_privilege(c.oid, 'INSERT')
                AND has_table_privilege(c.oid, 'UPDATE') AND has_table_privilege(c.oid, 'DELETE') END
         ORDER BY c.relname",
    )
    .bind(schema)
    .bind(oncebox::postgres::MIGRATIONS_TABLE)
    .fetch_all(store.pool())
    .await;
    let usage: Result<Option<bool>, sqlx::Error> =
        sqlx::query_scalar("SELECT has_schema_privilege(current_user, n.oid, 'USAGE') FROM pg_namespace n WHERE n.nspname = $1")
            .bind(schema)
            .fetch_optional(store.pool())
            .await;
    let grant = format!(
        "as the tables' owner: GRANT USAGE ON SCHEMA {schema} TO <role>; GRANT SELECT, INSERT, \
         UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO <role>; GRANT USAGE ON ALL \
         SEQUENCES IN SCHEMA {schema} TO <role>"
    );
    match (usage, missing) {
        (Err(error), _) | (_, Err(error)) => Check::fail(
            "rights",
            format!("cannot read the role's rights: {error}"),
            grant,
        ),
        (Ok(None), _) => Check::fail(
            "rights",
            format!("schema {schema} does not exist"),
            "run `oncebox migrate`",
        ),
        (Ok(Some(false)), _) => Check::fail(
            "rights",
            format!("the role may not use schema {schema}"),
            grant,
        ),
        (Ok(Some(true)), Ok(missing)) if missing.is_empty() => Check::pass(
            "rights",
            format!("the role reads and writes every table of schema {schema}"),
        ),
        (Ok(Some(true)), Ok(missing)) => Check::fail(
            "rights",
            format!("the role lacks {}", missing.join("; ")),
            grant,
        ),
    }
}

/// MySQL / MariaDB: each right tried on each of oncebox's tables with a statement that
/// touches no row, in a transaction rolled back. Trying asks the server itself, so
/// global, database, table and role grants, and the host a grant names, all count as
/// the server counts them; reading its grant tables would have to repeat those rules.
#[cfg(feature = "mysql")]
async fn mysql_rights(store: &oncebox::mysql::MySqlStore) -> Check {
    use sqlx::mysql::MySqlDatabaseError;
    /// ER_TABLEACCESS_DENIED_ERROR and ER_COLUMNACCESS_DENIED_ERROR.
    const DENIED: [u16; 2] = [1142, 1143];

    let grant = "as an administrator: GRANT SELECT, INSERT, UPDATE, DELETE ON <database>.* \
                 TO <user> (or on each oncebox_* table)";
    let tried: Result<Vec<String>, sqlx::Error> = async {
        let mut lacking = Vec::new();
        let mut transaction = store.pool().begin().await?;
        for table in oncebox::mysql::TABLES {
            // The columns the role can see: none when it has no right on the table. An
            // insert names them all, or the server refuses one without a default before
            // it would insert a row.
            let columns: Vec<String> = sqlx::query_scalar(
                "SELECT COLUMN_NAME FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
            )
            .bind(table)
            .fetch_all(&mut *transaction)
            .await?;
            let columns: Vec<String> = columns
                .iter()
                .map(|column| format!("`{}`", column.replace('`', "``")))
                .collect();
            let Some(first) = columns.first() else {
                lacking.push(format!("every right on {table} (or it does not exist)"));
                continue;
            };
            let nulls = vec!["NULL"; columns.len()].join(", ");
            let mut missing = Vec::new();
            for (right, statement) in [
                ("SELECT", format!("SELECT 1 FROM {table} WHERE FALSE")),
                (
                    "INSERT",
                    format!(
                        "INSERT INTO {table} ({}) SELECT {nulls} FROM DUAL WHERE FALSE",
                        columns.join(", ")
                    ),
                ),
                (
                    "UPDATE",
                    format!("UPDATE {table} SET {first} = NULL WHERE FALSE"),
                ),
                ("DELETE", format!("DELETE FROM {table} WHERE FALSE")),
            ] {
                match sqlx::query(sqlx::AssertSqlSafe(statement))
                    .execute(&mut *transaction)
                    .await
                {
                    Ok(_) => {}
                    Err(sqlx::Error::Database(error))
                        if error
                            .try_downcast_ref::<MySqlDatabaseError>()
                            .is_some_and(|error| DENIED.contains(&error.number())) =>
                    {
                        missing.push(right);
                    }
                    Err(error) => return Err(error),
                }
            }
            if !missing.is_empty() {
                lacking.push(format!("{table} ({})", missing.join(", ")));
            }
        }
        transaction.rollback().await?;
        Ok(lacking)
    }
    .await;
    match tried {
        Err(error) => Check::fail(
            "rights",
            format!("cannot try the role's rights: {error}"),
            grant,
        ),
        Ok(lacking) if lacking.is_empty() => Check::pass(
            "rights",
            "the role reads and writes every oncebox_* table of the database",
        ),
        Ok(lacking) => Check::fail(
            "rights",
            format!("the role lacks {}", lacking.join("; ")),
            grant,
        ),
    }
}

/// The database's clock against this host's: the difference, give or take half the
/// query's round trip. Fails unless the difference, widened by that uncertainty, is
/// within `max`. (SQLite runs on this host: no check.)
async fn clock(database: &Database, max: Duration) -> Option<Check> {
    let before = SystemTime::now();
    let read: Result<f64, sqlx::Error> = match database {
        Database::Sqlite(_) => return None,
        Database::Postgres(store) => {
            sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
                .fetch_one(store.pool())
                .await
        }
        #[cfg(feature = "mysql")]
        Database::Mysql(store) => {
            sqlx::query_scalar("SELECT CAST(UNIX_TIMESTAMP(NOW(6)) AS DOUBLE)")
                .fetch_one(store.pool())
                .await
        }
    };
    let after = SystemTime::now();
    let epoch = |at: SystemTime| {
        at.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |since| since.as_secs_f64())
    };
    Some(match read {
        Err(error) => Check::fail(
            "clock",
            format!("cannot read the database's clock: {error}"),
            "check that the store answers queries",
        ),
        Ok(database_time) => {
            let (sent, received) = (epoch(before), epoch(after));
            let difference = database_time - (sent + received) / 2.0;
            let uncertainty = (received - sent) / 2.0;
            let detail = format!(
                "the database's clock is {difference:+.3} s from this host's (± {uncertainty:.3} s)"
            );
            if difference.abs() + uncertainty <= max.as_secs_f64() {
                Check::pass("clock", detail)
            } else {
                Check::fail(
                    "clock",
                    format!("{detail}: more than {max:?} apart"),
                    "synchronise both machines' clocks (NTP: chrony or systemd-timesyncd)",
                )
            }
        }
    })
}
