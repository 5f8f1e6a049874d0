//! The idempotent receiver's dedup store on SQLite.

use std::time::{Duration, SystemTime};

use oncebox_core::sql::fenced;
use oncebox_core::store::{Begin, DedupRecord, DedupState, DedupStore, FencingToken};
use oncebox_core::time::{duration_millis, from_unix_millis, to_unix_millis};
use oncebox_core::{Bytes, Error, Result};
use sqlx::sqlite::SqlitePool;

use crate::dialect::begin_immediate;
use crate::error::{RowReader, store_error};
use crate::spool::sql_limit;

const TABLE: &str = "oncebox_dedup";

/// Takes `?1` if it is absent or its record expired (`?3` now), with the next token and
/// a lease until `?2`.
const TAKE: &str = "\
INSERT INTO oncebox_dedup (id, state, token, lease_until, result, expires_at)
VALUES (?1, 'in_progress', (SELECT next FROM oncebox_dedup_tokens WHERE id = 0), ?2, NULL, ?2)
ON CONFLICT (id) DO UPDATE
SET state = 'in_progress', token = excluded.token, lease_until = excluded.lease_until,
    result = NULL, expires_at = excluded.expires_at
WHERE oncebox_dedup.expires_at <= ?3
RETURNING token";

const NEXT_TOKEN: &str = "UPDATE oncebox_dedup_tokens SET next = next + 1 WHERE id = 0";

const HELD: &str = "SELECT state, lease_until, result FROM oncebox_dedup WHERE id = ?1";

/// `?1` id, `?2` now: the record unless it expired.
const INSPECT: &str = "\
SELECT state, token, lease_until, result, expires_at FROM oncebox_dedup
WHERE id = ?1 AND expires_at > ?2";

/// `?1` id, `?2` token, `?3` result, `?4` expires at, `?5` now.
const COMPLETE: &str = "\
UPDATE oncebox_dedup
SET state = 'completed', result = ?3, lease_until = NULL, expires_at = ?4
WHERE id = ?1 AND token = ?2 AND state = 'in_progress' AND lease_until > ?5";

/// `?1` id, `?2` token, `?3` lease until, `?4` now.
const EXTEND: &str = "\
UPDATE oncebox_dedup SET lease_until = ?3, expires_at = ?3
WHERE id = ?1 AND token = ?2 AND state = 'in_progress' AND lease_until > ?4";

/// `?1` id, `?2` token, `?3` now.
const ABANDON: &str = "\
DELETE FROM oncebox_dedup
WHERE id = ?1 AND token = ?2 AND state = 'in_progress' AND lease_until > ?3";

const PURGE: &str = "\
DELETE FROM oncebox_dedup WHERE id IN (
  SELECT id FROM oncebox_dedup WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)";

/// The dedup store of the idempotent receiver, in table `oncebox_dedup`:
/// `absent → in progress (token, lease) → completed (result, TTL) → expired`.
///
/// [`begin`](DedupStore::begin) runs in one `BEGIN IMMEDIATE` transaction, so concurrent
/// callers for an id (in this process or others sharing the file) are serialised and one
/// of them starts. Fencing tokens come from one counter for the whole table, so a token
/// is never issued twice, even for an id whose record expired and was purged. Expired
/// records answer as absent; [`purge_expired`](DedupStore::purge_expired) deletes them in
/// bounded batches.
///
/// Times are the wall clocks of the processes sharing the database; keep them in sync.
/// [`inspect`](DedupStore::inspect) reports the stored times as they are.
#[derive(Debug, Clone)]
pub struct SqliteDedupStore {
    pool: SqlitePool,
}

impl SqliteDedupStore {
    pub(crate) fn new(pool: SqlitePool) -> Self {
        Self { pool }
    }
}

fn token_param(token: FencingToken) -> i64 {
    // Tokens come from an i64 column, so a larger one is held by no row.
    i64::try_from(token.0).unwrap_or(-1)
}

impl DedupStore for SqliteDedupStore {
    async fn begin(&self, id: &str, lease: Duration) -> Result<Begin> {
        let mut tx = begin_immediate(&self.pool).await?;
        // After taking the write lock, which may have taken a while.
        let now = to_unix_millis(SystemTime::now());
        let lease_until = now.saturating_add(duration_millis(lease));
        let taken: Option<i64> = sqlx::query_scalar(TAKE)
            .bind(id.to_owned())
            .bind(lease_until)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .map_err(store_error)?;
        if let Some(token) = taken {
            sqlx::query(NEXT_TOKEN)
                .execute(&mut *tx)
                .await
                .map_err(store_error)?;
            tx.commit().await.map_err(store_error)?;
            let token = u64::try_from(token).map_err(|_| {
                Error::from(crate::RowDecodeError::new(
                    TABLE,
                    format_args!("id {id}"),
                    "token",
                    format_args!("{token} is not a valid token"),
                ))
            })?;
            return Ok(Begin::Started(FencingToken(token)));
        }
        let row = sqlx::query(HELD)
            .bind(id.to_owned())
            .fetch_one(&mut *tx)
            .await
            .map_err(store_error)?;
        // Read-only from here: dropping the transaction rolls back nothing.
        drop(tx);
        let reader = RowReader::new(&row, TABLE, format_args!("id {id}"));
        let state: String = reader.get("state")?;
        match state.as_str() {
            "in_progress" => {
                let until: Option<i64> = reader.get("lease_until")?;
                let left = until.unwrap_or(now).saturating_sub(now);
                Ok(Begin::InProgress {
                    retry_after: Duration::from_millis(u64::try_from(left).unwrap_or(0)),
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
        }
    }

    async fn complete(
        &self,
        id: &str,
        token: FencingToken,
        result: &[u8],
        ttl: Duration,
    ) -> Result<()> {
        let now = to_unix_millis(SystemTime::now());
        let updated = sqlx::query(COMPLETE)
            .bind(id.to_owned())
            .bind(token_param(token))
            .bind(result.to_vec())
            .bind(now.saturating_add(duration_millis(ttl)))
            .bind(now)
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        fenced(updated.rows_affected())
    }

    async fn extend(&self, id: &str, token: FencingToken, lease: Duration) -> Result<()> {
        let now = to_unix_millis(SystemTime::now());
        let updated = sqlx::query(EXTEND)
            .bind(id.to_owned())
            .bind(token_param(token))
            .bind(now.saturating_add(duration_millis(lease).max(1)))
            .bind(now)
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        fenced(updated.rows_affected())
    }

    async fn abandon(&self, id: &str, token: FencingToken) -> Result<()> {
        let deleted = sqlx::query(ABANDON)
            .bind(id.to_owned())
            .bind(token_param(token))
            .bind(to_unix_millis(SystemTime::now()))
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        fenced(deleted.rows_affected())
    }

    async fn inspect(&self, id: &str) -> Result<Option<DedupRecord>> {
        let row = sqlx::query(INSPECT)
            .bind(id.to_owned())
            .bind(to_unix_millis(SystemTime::now()))
            .fetch_optional(&self.pool)
            .await
            .map_err(store_error)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let reader = RowReader::new(&row, TABLE, format_args!("id {id}"));
        let token: i64 = reader.get("token")?;
        let token = u64::try_from(token)
            .map_err(|_| reader.error("token", format_args!("{token} is not a valid token")))?;
        let expires_at: i64 = reader.get("expires_at")?;
        let state: String = reader.get("state")?;
        let state = match state.as_str() {
            "in_progress" => {
                let until: Option<i64> = reader.get("lease_until")?;
                DedupState::InProgress {
                    lease_until: from_unix_millis(until.unwrap_or(expires_at)),
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
            Some(from_unix_millis(expires_at)),
        )))
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let deleted = sqlx::query(PURGE)
            .bind(to_unix_millis(SystemTime::now()))
            .bind(sql_limit(limit))
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(deleted.rows_affected())
    }
}
