//! The idempotent receiver's dedup store on MySQL / MariaDB.

use std::time::{Duration, SystemTime};

use oncebox_core::sql::fenced;
use oncebox_core::store::{Begin, DedupRecord, DedupState, DedupStore, FencingToken};
use oncebox_core::{Bytes, Error, Result};
use sqlx::Row;
use sqlx::mysql::MySqlPool;

use crate::error::{RowReader, check_bytes, is_duplicate_key, store_error};
use crate::inbox::MAX_ID_BYTES;
use crate::sql::{delete_read_committed, duration_ms, now_ms, query, sql_limit};

const TABLE: &str = "oncebox_dedup";

/// Attempts of `begin` when the record it conflicted with changes hands before it can be
/// read (taken over, abandoned, purged).
const BEGIN_ATTEMPTS: usize = 3;

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

/// `?` id → `state`, `token`, `result`, `lease_left_ms`, `expires_left_ms`, unless
/// expired.
const INSPECT: &str = concat!(
    "SELECT state, token, result, lease_until - ",
    now_ms!(),
    " AS lease_left_ms, expires_at - ",
    now_ms!(),
    " AS expires_left_ms
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
/// [`begin`](DedupStore::begin) is a plain `INSERT` under the primary key: of concurrent
/// callers for an id, one inserts and the others fail with a duplicate key, then read the
/// record. A record whose expiry passed is deleted (by whichever caller gets there
/// first) and inserted again. Fencing tokens are the table's `AUTO_INCREMENT` values,
/// which are never handed out twice, so a token only grows for an id, even one whose
/// record expired and was purged. Leases and TTLs are measured on the database's clock,
/// so workers on hosts with skewed clocks agree. Expired records answer as absent;
/// [`purge_expired`](DedupStore::purge_expired) deletes them in bounded batches.
///
/// [`inspect`](DedupStore::inspect) reads the time left on the lease and before expiry
/// on the database's clock and adds it to the caller's now.
///
/// Ids are compared byte for byte and hold at most 1024 bytes.
#[derive(Debug, Clone)]
pub struct MySqlDedupStore {
    pool: MySqlPool,
}

impl MySqlDedupStore {
    pub(crate) fn new(pool: MySqlPool) -> Self {
        Self { pool }
    }
}

impl DedupStore for MySqlDedupStore {
    async fn begin(&self, id: &str, lease: Duration) -> Result<Begin> {
        check_bytes("dedup id", id, MAX_ID_BYTES)?;
        let lease = duration_ms(lease).max(1);
        let id_bytes = id.as_bytes().to_vec();
        for _ in 0..BEGIN_ATTEMPTS {
            let inserted = query(TAKE)
                .bind(id_bytes.clone())
                .bind(lease)
                .bind(lease)
                .execute(&self.pool)
                .await;
            match inserted {
                Ok(done) => return Ok(Begin::Started(FencingToken(done.last_insert_id()))),
                Err(e) if is_duplicate_key(&e) => {}
                Err(e) => return Err(store_error(e)),
            }
            let expired = query(DELETE_EXPIRED)
                .bind(id_bytes.clone())
                .execute(&self.pool)
                .await
                .map_err(store_error)?;
            if expired.rows_affected() > 0 {
                continue;
            }
            let row = query(HELD)
                .bind(id_bytes.clone())
                .fetch_optional(&self.pool)
                .await
                .map_err(store_error)?;
            let Some(row) = row else {
                // Abandoned or expired in between: try to take it again.
                continue;
            };
            let reader = RowReader::new(&row, TABLE, format_args!("id {id}"));
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
        // Rows matched (sqlx sets CLIENT_FOUND_ROWS): 0 means the token is stale.
        let updated = query(COMPLETE)
            .bind(result.to_vec())
            .bind(duration_ms(ttl))
            .bind(id.as_bytes().to_vec())
            .bind(token.0)
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        fenced(updated.rows_affected())
    }

    async fn extend(&self, id: &str, token: FencingToken, lease: Duration) -> Result<()> {
        let lease = duration_ms(lease).max(1);
        // Rows matched, as for `complete`: 0 means the token is stale.
        let updated = query(EXTEND)
            .bind(lease)
            .bind(lease)
            .bind(id.as_bytes().to_vec())
            .bind(token.0)
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        fenced(updated.rows_affected())
    }

    async fn abandon(&self, id: &str, token: FencingToken) -> Result<()> {
        let deleted = query(ABANDON)
            .bind(id.as_bytes().to_vec())
            .bind(token.0)
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        fenced(deleted.rows_affected())
    }

    async fn inspect(&self, id: &str) -> Result<Option<DedupRecord>> {
        let row = query(INSPECT)
            .bind(id.as_bytes().to_vec())
            .fetch_optional(&self.pool)
            .await
            .map_err(store_error)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let now = SystemTime::now();
        let after = |ms: i64| now + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        let reader = RowReader::new(&row, TABLE, format_args!("id {id}"));
        let token: u64 = reader.get("token")?;
        let expires_left: i64 = reader.get("expires_left_ms")?;
        let state: String = reader.get("state")?;
        let state = match state.as_str() {
            "in_progress" => {
                let left: Option<i64> = reader.get("lease_left_ms")?;
                DedupState::InProgress {
                    lease_until: after(left.unwrap_or(expires_left)),
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
            Some(after(expires_left)),
        )))
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        delete_read_committed(&self.pool, query(PURGE).bind(sql_limit(limit))).await
    }
}
