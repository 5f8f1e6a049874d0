//! The idempotent receiver's dedup store on PostgreSQL: its statements, for the store
//! written once in `oncebox-sql`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use oncebox_core::sql::sql_limit;
use oncebox_core::store::FencingToken;
use oncebox_core::{Error, Result};
use oncebox_sql::{DedupDialect, Query, RowReader, SqlDedupStore};
use sqlx::{PgPool, Postgres};

use crate::RowDecodeError;
use crate::dialect::PgDialect;
use crate::ident::qualified;
use crate::spool::query;
use crate::time::{duration_ms, micros_duration, millis_param};

/// The dedup store's statements, built once per schema.
pub(crate) struct DedupSql {
    display: String,
    /// `$1` id, `$2` lease ms → `token` if taken.
    take: Arc<str>,
    /// `$1` id → state, lease left (ms), result.
    held: Arc<str>,
    /// `$1` id → state, token, result, lease left (`lease_until`) and expiry left
    /// (`expires_at`) in µs, if not expired.
    inspect: Arc<str>,
    /// `$1` id, `$2` token, `$3` result, `$4` ttl ms.
    complete: Arc<str>,
    /// `$1` id, `$2` token, `$3` lease ms.
    extend: Arc<str>,
    /// `$1` id, `$2` token.
    abandon: Arc<str>,
    /// `$1` limit.
    purge: Arc<str>,
}

impl DedupSql {
    pub(crate) fn new(schema: &str) -> Self {
        let t = qualified(schema, "dedup");
        let tokens = qualified(schema, "dedup_tokens");
        Self {
            display: format!("{schema}.dedup"),
            take: format!(
                "INSERT INTO {t} AS d (id, state, token, lease_until, result, expires_at)
VALUES ($1, 'in_progress', nextval('{tokens}'),
        statement_timestamp() + {lease}, NULL, statement_timestamp() + {lease})
ON CONFLICT (id) DO UPDATE
SET state = 'in_progress', token = excluded.token, lease_until = excluded.lease_until,
    result = NULL, expires_at = excluded.expires_at
WHERE d.expires_at <= statement_timestamp()
RETURNING token",
                lease = millis_param(2)
            )
            .into(),
            held: format!(
                "SELECT state, result,
       greatest(0, (extract(epoch FROM lease_until - statement_timestamp()) * 1000)::bigint)
         AS lease_left_ms
FROM {t} WHERE id = $1 AND expires_at > statement_timestamp()"
            )
            .into(),
            inspect: format!(
                "SELECT state, token, result,
       (extract(epoch FROM lease_until - statement_timestamp()) * 1000000)::bigint
         AS lease_until,
       (extract(epoch FROM expires_at - statement_timestamp()) * 1000000)::bigint
         AS expires_at
FROM {t} WHERE id = $1 AND expires_at > statement_timestamp()"
            )
            .into(),
            complete: format!(
                "UPDATE {t}
SET state = 'completed', result = $3, lease_until = NULL,
    expires_at = statement_timestamp() + {ttl}
WHERE id = $1 AND token = $2 AND state = 'in_progress'
  AND lease_until > statement_timestamp()",
                ttl = millis_param(4)
            )
            .into(),
            extend: format!(
                "UPDATE {t}
SET lease_until = statement_timestamp() + {lease},
    expires_at = statement_timestamp() + {lease}
WHERE id = $1 AND token = $2 AND state = 'in_progress'
  AND lease_until > statement_timestamp()",
                lease = millis_param(3)
            )
            .into(),
            abandon: format!(
                "DELETE FROM {t}
WHERE id = $1 AND token = $2 AND state = 'in_progress'
  AND lease_until > statement_timestamp()"
            )
            .into(),
            purge: format!(
                "DELETE FROM {t} WHERE id IN (
  SELECT id FROM {t} WHERE expires_at <= statement_timestamp()
  ORDER BY expires_at
  LIMIT $1
  FOR UPDATE SKIP LOCKED)"
            )
            .into(),
        }
    }
}

/// The dedup store of the idempotent receiver, in table `<schema>.dedup`:
/// `absent → in progress (token, lease) → completed (result, TTL) → expired`.
///
/// [`begin`](oncebox_core::store::DedupStore::begin) takes the id with one `INSERT ...
/// ON CONFLICT DO UPDATE ... WHERE expired` statement: of concurrent callers for an id,
/// one inserts (or takes over an expired record) and the others wait on the unique key,
/// then find it held. Fencing tokens come from the sequence `<schema>.dedup_tokens`, so
/// a token is never issued twice, even for an id whose record expired and was purged.
/// Leases and TTLs are measured on the database's clock, so workers on hosts with skewed
/// clocks agree. Expired records answer as absent;
/// [`purge_expired`](oncebox_core::store::DedupStore::purge_expired) deletes them in
/// bounded batches. [`inspect`](oncebox_core::store::DedupStore::inspect) reads the time
/// left on the lease and before expiry on the database's clock and adds it to the
/// caller's now.
pub type PgDedupStore = SqlDedupStore<PgDialect>;

fn token_param(token: FencingToken) -> i64 {
    // Tokens come from a bigint sequence, so a larger one is held by no record.
    i64::try_from(token.0).unwrap_or(-1)
}

impl DedupDialect for PgDialect {
    async fn take(&self, pool: &PgPool, id: &str, lease: Duration) -> Result<Option<FencingToken>> {
        let taken: Option<i64> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(Arc::clone(&self.dedup.take)))
                .bind(id.to_owned())
                .bind(duration_ms(lease).max(1))
                .fetch_optional(pool)
                .await?;
        taken
            .map(|token| {
                u64::try_from(token).map(FencingToken).map_err(|_| {
                    Error::from(RowDecodeError::new(
                        &self.dedup.display,
                        format_args!("id {id}"),
                        "token",
                        format_args!("{token} is not a valid token"),
                    ))
                })
            })
            .transpose()
    }

    fn held(&self, id: &str) -> Query<Postgres> {
        query(&self.dedup.held).bind(id.to_owned())
    }

    fn inspect(&self, id: &str) -> Query<Postgres> {
        query(&self.dedup.inspect).bind(id.to_owned())
    }

    /// `stored` is the µs left before the time, on the database's clock.
    fn instant(now: SystemTime, stored: i64) -> SystemTime {
        now + micros_duration(stored)
    }

    fn token(row: &RowReader<'_, Self>) -> Result<u64, RowDecodeError> {
        let token: i64 = row.get("token")?;
        u64::try_from(token)
            .map_err(|_| row.error("token", format_args!("{token} is not a valid token")))
    }

    fn complete(
        &self,
        id: &str,
        token: FencingToken,
        result: &[u8],
        ttl: Duration,
    ) -> Query<Postgres> {
        query(&self.dedup.complete)
            .bind(id.to_owned())
            .bind(token_param(token))
            .bind(result.to_vec())
            .bind(duration_ms(ttl))
    }

    fn extend(&self, id: &str, token: FencingToken, lease: Duration) -> Query<Postgres> {
        query(&self.dedup.extend)
            .bind(id.to_owned())
            .bind(token_param(token))
            .bind(duration_ms(lease).max(1))
    }

    fn abandon(&self, id: &str, token: FencingToken) -> Query<Postgres> {
        query(&self.dedup.abandon)
            .bind(id.to_owned())
            .bind(token_param(token))
    }

    fn purge(&self, limit: usize) -> Query<Postgres> {
        query(&self.dedup.purge).bind(sql_limit(limit))
    }

    fn dedup_table(&self) -> &str {
        &self.dedup.display
    }
}

impl std::fmt::Debug for DedupSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DedupSql")
            .field("table", &self.display)
            .finish_non_exhaustive()
    }
}
