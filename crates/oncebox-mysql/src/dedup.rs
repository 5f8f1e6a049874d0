//! The idempotent receiver's dedup store on MySQL / MariaDB: its statements, for the
//! store written once in `oncebox-sql`.

use std::time::{Duration, SystemTime};

use oncebox_core::Result;
use oncebox_core::store::FencingToken;
use oncebox_sql::{DedupDialect, Query, RowReader, SqlDedupStore};
use sqlx::{MySql, MySqlPool};

use crate::RowDecodeError;
use crate::dialect::MySqlDialect;
use crate::error::is_duplicate_key;
use crate::sql::{duration_ms, now_ms, query, sql_limit};

/// `?` id, `?` lease ms, `?` lease ms; the token is the row's AUTO_INCREMENT value.
const TAKE: &str = concat!(
    "INSERT INTO oncebox_dedup (id, state, lease_until, expires_at)
VALUES (?, 'in_progress', ",
    now_ms!(),
    " + ?, ",
    now_ms!(),
    " + ?)"
);

/// `?` id: deletes the record if it expired, so that it can be taken again.
const DELETE_EXPIRED: &str = concat!(
    "DELETE FROM oncebox_dedup WHERE id = ? AND expires_at <= ",
    now_ms!()
);

/// `?` id → `state`, `result`, `lease_left_ms`.
const HELD: &str = concat!(
    "SELECT state, result, GREATEST(0, lease_until - ",
    now_ms!(),
    ") AS lease_left_ms
FROM oncebox_dedup WHERE id = ? AND expires_at > ",
    now_ms!()
);

/// `?` id → `state`, `token`, `result`, and the ms left on the lease (`lease_until`)
/// and before expiry (`expires_at`), unless expired.
const INSPECT: &str = concat!(
    "SELECT state, token, result, lease_until - ",
    now_ms!(),
    " AS lease_until, expires_at - ",
    now_ms!(),
    " AS expires_at
FROM oncebox_dedup WHERE id = ? AND expires_at > ",
    now_ms!()
);

/// `?` result, `?` ttl ms, `?` id, `?` token.
const COMPLETE: &str = concat!(
    "UPDATE oncebox_dedup
SET state = 'completed', result = ?, lease_until = NULL, expires_at = ",
    now_ms!(),
    " + ?
WHERE id = ? AND token = ? AND state = 'in_progress' AND lease_until > ",
    now_ms!()
);

/// `?` lease ms, `?` lease ms, `?` id, `?` token.
const EXTEND: &str = concat!(
    "UPDATE oncebox_dedup
SET lease_until = ",
    now_ms!(),
    " + ?, expires_at = ",
    now_ms!(),
    " + ?
WHERE id = ? AND token = ? AND state = 'in_progress' AND lease_until > ",
    now_ms!()
);

/// `?` id, `?` token.
const ABANDON: &str = concat!(
    "DELETE FROM oncebox_dedup
WHERE id = ? AND token = ? AND state = 'in_progress' AND lease_until > ",
    now_ms!()
);

/// `?` limit.
const PURGE: &str = concat!(
    "DELETE FROM oncebox_dedup WHERE expires_at <= ",
    now_ms!(),
    " ORDER BY expires_at LIMIT ?"
);

/// The dedup store of the idempotent receiver, in table `oncebox_dedup`:
/// `absent → in progress (token, lease) → completed (result, TTL) → expired`. It is also
/// the Idempotency-Key store of `oncebox-http`'s `IdempotencyLayer`.
///
/// [`begin`](oncebox_core::store::DedupStore::begin) is a plain `INSERT` under the
/// primary key: of concurrent callers for an id, one inserts and the others fail with a
/// duplicate key, then read the record. A record whose expiry passed is deleted (by
/// whichever caller gets there first) and inserted again. Fencing tokens are the table's
/// `AUTO_INCREMENT` values, which are never handed out twice, so a token only grows for
/// an id, even one whose record expired and was purged. Leases and TTLs are measured on
/// the database's clock, so workers on hosts with skewed clocks agree. Expired records
/// answer as absent; [`purge_expired`](oncebox_core::store::DedupStore::purge_expired)
/// deletes them in bounded batches.
///
/// [`inspect`](oncebox_core::store::DedupStore::inspect) reads the time left on the
/// lease and before expiry on the database's clock and adds it to the caller's now.
///
/// Ids are compared byte for byte and hold at most 1024 bytes.
pub type MySqlDedupStore = SqlDedupStore<MySqlDialect>;

impl DedupDialect for MySqlDialect {
    /// Inserts the record; on a duplicate key, deletes it if it expired and inserts
    /// again.
    async fn take(
        &self,
        pool: &MySqlPool,
        id: &str,
        lease: Duration,
    ) -> Result<Option<FencingToken>> {
        let lease = duration_ms(lease).max(1);
        let insert = || {
            query(TAKE)
                .bind(id.as_bytes().to_vec())
                .bind(lease)
                .bind(lease)
        };
        match insert().execute(pool).await {
            Ok(done) => return Ok(Some(FencingToken(done.last_insert_id()))),
            Err(e) if is_duplicate_key(&e) => {}
            Err(e) => return Err(e.into()),
        }
        let expired = query(DELETE_EXPIRED)
            .bind(id.as_bytes().to_vec())
            .execute(pool)
            .await?;
        if expired.rows_affected() == 0 {
            return Ok(None);
        }
        match insert().execute(pool).await {
            Ok(done) => Ok(Some(FencingToken(done.last_insert_id()))),
            Err(e) if is_duplicate_key(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn held(&self, id: &str) -> Query<MySql> {
        query(HELD).bind(id.as_bytes().to_vec())
    }

    fn inspect(&self, id: &str) -> Query<MySql> {
        query(INSPECT).bind(id.as_bytes().to_vec())
    }

    /// `stored` is the ms left before the time, on the database's clock.
    fn instant(now: SystemTime, stored: i64) -> SystemTime {
        now + Duration::from_millis(u64::try_from(stored).unwrap_or(0))
    }

    fn token(row: &RowReader<'_, Self>) -> Result<u64, RowDecodeError> {
        row.get("token")
    }

    /// Rows matched (sqlx sets `CLIENT_FOUND_ROWS`): 0 means the token is stale, never
    /// that the values were already these.
    fn complete(
        &self,
        id: &str,
        token: FencingToken,
        result: &[u8],
        ttl: Duration,
    ) -> Query<MySql> {
        query(COMPLETE)
            .bind(result.to_vec())
            .bind(duration_ms(ttl))
            .bind(id.as_bytes().to_vec())
            .bind(token.0)
    }

    /// Rows matched, as for [`complete`](Self::complete).
    fn extend(&self, id: &str, token: FencingToken, lease: Duration) -> Query<MySql> {
        let lease = duration_ms(lease).max(1);
        query(EXTEND)
            .bind(lease)
            .bind(lease)
            .bind(id.as_bytes().to_vec())
            .bind(token.0)
    }

    fn abandon(&self, id: &str, token: FencingToken) -> Query<MySql> {
        query(ABANDON).bind(id.as_bytes().to_vec()).bind(token.0)
    }

    fn purge(&self, limit: usize) -> Query<MySql> {
        query(PURGE).bind(sql_limit(limit))
    }

    fn dedup_table(&self) -> &str {
        "oncebox_dedup"
    }
}
