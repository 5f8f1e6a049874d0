//! The idempotent receiver's dedup store on SQLite: its statements, for the store
//! written once in `oncebox-sql`.

use std::time::{Duration, SystemTime};

use oncebox_core::store::FencingToken;
use oncebox_core::time::{duration_millis, from_unix_millis, to_unix_millis};
use oncebox_core::{Error, Result};
use oncebox_sql::{DedupDialect, Query, RowReader, SqlDedupStore};
use sqlx::{Sqlite, SqlitePool};

use crate::RowDecodeError;
use crate::dialect::{SqliteDialect, begin_immediate};
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

/// Moves the counter past the token `TAKE` handed out.
const NEXT_TOKEN: &str = "UPDATE oncebox_dedup_tokens SET next = next + 1 WHERE id = 0";

/// `?1` id, `?2` now: the record unless it expired, with the ms left on its lease.
const HELD: &str = "\
SELECT state, result, max(0, lease_until - ?2) AS lease_left_ms FROM oncebox_dedup
WHERE id = ?1 AND expires_at > ?2";

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

/// `?1` now, `?2` limit.
const PURGE: &str = "\
DELETE FROM oncebox_dedup WHERE id IN (
  SELECT id FROM oncebox_dedup WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)";

/// The dedup store of the idempotent receiver, in table `oncebox_dedup`:
/// `absent → in progress (token, lease) → completed (result, TTL) → expired`.
///
/// [`begin`](oncebox_core::store::DedupStore::begin) takes the id in one `BEGIN
/// IMMEDIATE` transaction, so concurrent callers for an id (in this process or others
/// sharing the file) are serialised and one of them starts. Fencing tokens come from one
/// counter for the whole table, so a token is never issued twice, even for an id whose
/// record expired and was purged. Expired records answer as absent;
/// [`purge_expired`](oncebox_core::store::DedupStore::purge_expired) deletes them in
/// bounded batches.
///
/// Times are the wall clocks of the processes sharing the database; keep them in sync.
/// [`inspect`](oncebox_core::store::DedupStore::inspect) reports the stored times as
/// they are.
pub type SqliteDedupStore = SqlDedupStore<SqliteDialect>;

fn token_param(token: FencingToken) -> i64 {
    // Tokens come from an i64 column, so a larger one is held by no row.
    i64::try_from(token.0).unwrap_or(-1)
}

/// Now, in the milliseconds the time columns hold.
fn now() -> i64 {
    to_unix_millis(SystemTime::now())
}

impl DedupDialect for SqliteDialect {
    /// Takes the id and moves the token counter on in one `BEGIN IMMEDIATE` transaction.
    async fn take(
        &self,
        pool: &SqlitePool,
        id: &str,
        lease: Duration,
    ) -> Result<Option<FencingToken>> {
        let mut tx = begin_immediate(pool).await?;
        // After taking the write lock, which may have taken a while.
        let now = now();
        let taken: Option<i64> = sqlx::query_scalar(TAKE)
            .bind(id.to_owned())
            .bind(now.saturating_add(duration_millis(lease)))
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
        // Held: dropping the transaction rolls back nothing.
        let Some(token) = taken else {
            return Ok(None);
        };
        sqlx::query(NEXT_TOKEN).execute(&mut *tx).await?;
        tx.commit().await?;
        let token = u64::try_from(token).map_err(|_| {
            Error::from(RowDecodeError::new(
                TABLE,
                format_args!("id {id}"),
                "token",
                format_args!("{token} is not a valid token"),
            ))
        })?;
        Ok(Some(FencingToken(token)))
    }

    fn held(&self, id: &str) -> Query<Sqlite> {
        sqlx::query(HELD).bind(id.to_owned()).bind(now())
    }

    fn inspect(&self, id: &str) -> Query<Sqlite> {
        sqlx::query(INSPECT).bind(id.to_owned()).bind(now())
    }

    /// `stored` is the time itself, in ms since the Unix epoch.
    fn instant(_now: SystemTime, stored: i64) -> SystemTime {
        from_unix_millis(stored)
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
    ) -> Query<Sqlite> {
        let now = now();
        sqlx::query(COMPLETE)
            .bind(id.to_owned())
            .bind(token_param(token))
            .bind(result.to_vec())
            .bind(now.saturating_add(duration_millis(ttl)))
            .bind(now)
    }

    fn extend(&self, id: &str, token: FencingToken, lease: Duration) -> Query<Sqlite> {
        let now = now();
        sqlx::query(EXTEND)
            .bind(id.to_owned())
            .bind(token_param(token))
            .bind(now.saturating_add(duration_millis(lease).max(1)))
            .bind(now)
    }

    fn abandon(&self, id: &str, token: FencingToken) -> Query<Sqlite> {
        sqlx::query(ABANDON)
            .bind(id.to_owned())
            .bind(token_param(token))
            .bind(now())
    }

    fn purge(&self, limit: usize) -> Query<Sqlite> {
        sqlx::query(PURGE).bind(now()).bind(sql_limit(limit))
    }

    fn dedup_table(&self) -> &str {
        TABLE
    }
}
