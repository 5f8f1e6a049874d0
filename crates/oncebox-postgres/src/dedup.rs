//! The idempotent receiver's dedup store on PostgreSQL.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use oncebox_core::sql::fenced;
use oncebox_core::store::{Begin, DedupRecord, DedupState, DedupStore, FencingToken};
use oncebox_core::{Bytes, Error, Result};
use sqlx::Row;
use sqlx::postgres::PgPool;

use crate::error::{RowDecodeError, RowReader, store_error};
use crate::ident::qualified;
use crate::spool::{query, sql_limit};
use crate::time::{duration_ms, micros_duration, millis_param};

/// Attempts of `begin` when the record it conflicted with disappears before it can be
/// read (abandoned, purged): each attempt is one insert and one read.
const BEGIN_ATTEMPTS: usize = 3;

/// The dedup store's statements, built once per schema.
pub(crate) struct DedupSql {
    display: String,
    /// `$1` id, `$2` lease ms → `token` if taken.
    take: Arc<str>,
    /// `$1` id → state, lease left (ms), result.
    held: Arc<str>,
    /// `$1` id → state, token, result, lease left and expiry left (µs), if not expired.
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
         AS lease_left_us,
       (extract(epoch FROM expires_at - statement_timestamp()) * 1000000)::bigint
         AS expires_left_us
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
/// [`begin`](DedupStore::begin) is one `INSERT ... ON CONFLICT DO UPDATE ... WHERE
/// expired` statement: of concurrent callers for an id, one inserts (or takes over an
/// expired record) and the others wait on the unique key, then find it held. Fencing
/// tokens come from the sequence `<schema>.dedup_tokens`, so a token is never issued
/// twice, even for an id whose record expired and was purged. Leases and TTLs are
/// measured on the database's clock, so workers on hosts with skewed clocks agree.
/// Expired records answer as absent; [`purge_expired`](DedupStore::purge_expired)
/// deletes them in bounded batches. [`inspect`](DedupStore::inspect) reads the time
/// left on the lease and before expiry on the database's clock and adds it to the
/// caller's now.
#[derive(Debug, Clone)]
pub struct PgDedupStore {
    pool: PgPool,
    sql: Arc<DedupSql>,
}

impl PgDedupStore {
    pub(crate) fn new(pool: PgPool, sql: Arc<DedupSql>) -> Self {
        Self { pool, sql }
    }
}

fn token_param(token: FencingToken) -> i64 {
    // Tokens come from a bigint sequence, so a larger one is held by no record.
    i64::try_from(token.0).unwrap_or(-1)
}

impl DedupStore for PgDedupStore {
    async fn begin(&self, id: &str, lease: Duration) -> Result<Begin> {
        let lease = duration_ms(lease).max(1);
        for _ in 0..BEGIN_ATTEMPTS {
            let taken: Option<i64> =
                sqlx::query_scalar(sqlx::AssertSqlSafe(Arc::clone(&self.sql.take)))
                    .bind(id.to_owned())
                    .bind(lease)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(store_error)?;
            if let Some(token) = taken {
                let token = u64::try_from(token).map_err(|_| {
                    Error::from(RowDecodeError::new(
                        &self.sql.display,
                        format_args!("id {id}"),
                        "token",
                        format_args!("{token} is not a valid token"),
                    ))
                })?;
                return Ok(Begin::Started(FencingToken(token)));
            }
            // Held and not expired when the insert looked; a new statement sees it.
            let row = query(&self.sql.held)
                .bind(id.to_owned())
                .fetch_optional(&self.pool)
                .await
                .map_err(store_error)?;
            let Some(row) = row else {
                // It expired or was abandoned in between: try to take it again.
                continue;
            };
            let reader = RowReader::new(&row, &self.sql.display, format_args!("id {id}"));
            let state: String = reader.get("state")?;
            return match state.as_str() {
                "in_progress" => {
                    let left: Option<i64> = row.try_get("lease_left_ms").map_err(store_error)?;
                    Ok(Begin::InProgress {
                        retry_after: Duration::from_millis(
                            u64::try_from(left.unwrap_or(0)).unwrap_or(0),
                        ),
                    })
                }
                "completed" => {
                    let result: Option<Vec<u8>> = reader.get("result")?;
                    Ok(Begin::Completed(
                        result.map(Bytes::from).unwrap_or_default(),
                    ))
                }
                other => Err(reader
                    .error("state", format_args!("unknown state {other:?}"))
                    .into()),
            };
        }
        Err(Error::store_transient(format!(
            "dedup id {id:?} changed hands {BEGIN_ATTEMPTS} times during begin"
        )))
    }

    async fn complete(
        &self,
        id: &str,
        token: FencingToken,
        result: &[u8],
        ttl: Duration,
    ) -> Result<()> {
        let updated = query(&self.sql.complete)
            .bind(id.to_owned())
            .bind(token_param(token))
            .bind(result.to_vec())
            .bind(duration_ms(ttl))
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        fenced(updated.rows_affected())
    }

    async fn extend(&self, id: &str, token: FencingToken, lease: Duration) -> Result<()> {
        let updated = query(&self.sql.extend)
            .bind(id.to_owned())
            .bind(token_param(token))
            .bind(duration_ms(lease).max(1))
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        fenced(updated.rows_affected())
    }

    async fn abandon(&self, id: &str, token: FencingToken) -> Result<()> {
        let deleted = query(&self.sql.abandon)
            .bind(id.to_owned())
            .bind(token_param(token))
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        fenced(deleted.rows_affected())
    }

    async fn inspect(&self, id: &str) -> Result<Option<DedupRecord>> {
        let row = query(&self.sql.inspect)
            .bind(id.to_owned())
            .fetch_optional(&self.pool)
            .await
            .map_err(store_error)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let now = SystemTime::now();
        let reader = RowReader::new(&row, &self.sql.display, format_args!("id {id}"));
        let token: i64 = reader.get("token")?;
        let token = u64::try_from(token)
            .map_err(|_| reader.error("token", format_args!("{token} is not a valid token")))?;
        let expires_left: i64 = reader.get("expires_left_us")?;
        let state: String = reader.get("state")?;
        let state = match state.as_str() {
            "in_progress" => {
                let left: Option<i64> = reader.get("lease_left_us")?;
                DedupState::InProgress {
                    lease_until: now + micros_duration(left.unwrap_or(expires_left)),
                }
            }
            "completed" => {
                let result: Option<Vec<u8>> = reader.get("result")?;
                DedupState::Completed {
                    result: result.map(Bytes::from).unwrap_or_default(),
                }
            }
            other => {
                return Err(reader
                    .error("state", format_args!("unknown state {other:?}"))
                    .into());
            }
        };
        Ok(Some(DedupRecord::new(
            state,
            FencingToken(token),
            Some(now + micros_duration(expires_left)),
        )))
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let deleted = query(&self.sql.purge)
            .bind(sql_limit(limit))
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(deleted.rows_affected())
    }
}

impl std::fmt::Debug for DedupSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DedupSql")
            .field("table", &self.display)
            .finish_non_exhaustive()
    }
}
