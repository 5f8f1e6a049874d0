//! The transactional inbox on PostgreSQL.

use std::sync::Arc;
use std::time::SystemTime;

use oncebox_core::store::{InboxStore, Recorded, Transactional};
use oncebox_core::{Bytes, Error, Result};
use sqlx::postgres::PgPool;
use sqlx::{AssertSqlSafe, Postgres, Transaction};

use crate::error::{has_code, is_unique_violation, store_error};
use crate::ident::{derived, qualified};
use crate::spool::{query, sql_limit};
use crate::time::{millis_param, ms_since};

/// SQLSTATE of an `EXECUTE` of a statement the connection has not prepared.
const UNDEFINED_PREPARED: &str = "26000";
/// SQLSTATE of a `PREPARE` of a name the connection has prepared already.
const DUPLICATE_PREPARED: &str = "42P05";

/// How many times [`PgInbox::begin_recorded`] tries the prepared record before it writes
/// the insert out in full.
const PREPARED_TRIES: usize = 4;

/// How [`InboxSql::begin_recorded`] runs the record's insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Record {
    /// `EXECUTE` of the insert the connection prepared.
    Execute,
    /// `PREPARE`, then `EXECUTE`: for a connection that has not prepared it.
    Prepare,
    /// The insert, written out: parsed and planned again.
    Insert,
}

/// The inbox's statements, built once per schema.
pub(crate) struct InboxSql {
    /// The record's insert without its values, for [`InboxSql::begin_recorded`].
    insert_record: Arc<str>,
    /// The name the record's insert is prepared under on each connection (per schema).
    prepared: Arc<str>,
    /// `PREPARE` of the record's insert, `$1` consumer, `$2` id.
    prepare: Arc<str>,
    /// `$1` consumer, `$2` id → a row if inserted.
    record: Arc<str>,
    /// `$1` consumer, `$2` id → `result`.
    stored_result: Arc<str>,
    /// `$1` consumer, `$2` id, `$3` result.
    store_result: Arc<str>,
    /// `$1` age ms, `$2` limit.
    purge: Arc<str>,
}

impl InboxSql {
    pub(crate) fn new(schema: &str) -> Self {
        let t = qualified(schema, "inbox");
        let insert_record = format!("INSERT INTO {t} (consumer, message_id, processed_at)");
        let prepared = derived(&format!("{schema}_inbox"), "record");
        Self {
            prepare: format!(
                "PREPARE {prepared} (text, text) AS
{insert_record} VALUES ($1, $2, statement_timestamp())"
            )
            .into(),
            prepared: prepared.into(),
            record: format!(
                "{insert_record}
VALUES ($1, $2, statement_timestamp())
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING 1"
            )
            .into(),
            insert_record: insert_record.into(),
            stored_result: format!(
                "SELECT result FROM {t} WHERE consumer = $1 AND message_id = $2"
            )
            .into(),
            store_result: format!(
                "INSERT INTO {t} (consumer, message_id, result, processed_at)
VALUES ($1, $2, $3, statement_timestamp())
ON CONFLICT (consumer, message_id) DO UPDATE SET result = excluded.result"
            )
            .into(),
            purge: format!(
                "DELETE FROM {t} WHERE consumer = $1 AND message_id IN (
  SELECT message_id FROM {t}
  WHERE consumer = $1 AND processed_at < statement_timestamp() - {age}
  ORDER BY processed_at
  LIMIT $3
  FOR UPDATE SKIP LOCKED)",
                age = millis_param(2)
            )
            .into(),
        }
    }
}

/// The transactional inbox: records of the ids each consumer processed, written in the
/// handler's transaction (table `<schema>.inbox`, keyed by consumer and id).
///
/// [`record`](InboxStore::record) inserts with `ON CONFLICT DO NOTHING`: of concurrent
/// transactions recording the same id, one inserts and the others wait on the unique key
/// until it commits (then they see a duplicate and its result) or rolls back (then one of
/// them inserts). Transactions are PostgreSQL's default, read committed; the handler
/// runs its queries on `&mut **tx`.
///
/// The [`TransactionalInbox`](oncebox_core::consumer::TransactionalInbox) engine calls
/// [`begin_recorded`](InboxStore::begin_recorded), which sends the record's insert and
/// `BEGIN` as one message: a new id costs the handler's transaction one round trip, not
/// two. The record's insert then has no `ON CONFLICT`: a duplicate fails it (after
/// waiting, like above, for a transaction in flight), and is read as above. That insert
/// is prepared once on each connection (SQL `PREPARE`, named `<schema>_inbox_record`,
/// or `oncebox_<hash>_record` where that would pass 63 bytes) and run with `EXECUTE`.
#[derive(Debug, Clone)]
pub struct PgInbox {
    pool: PgPool,
    sql: Arc<InboxSql>,
}

impl PgInbox {
    pub(crate) fn new(pool: PgPool, sql: Arc<InboxSql>) -> Self {
        Self { pool, sql }
    }
}

impl Transactional for PgInbox {
    type Tx = Transaction<'static, Postgres>;

    async fn begin(&self) -> Result<Self::Tx> {
        self.pool.begin().await.map_err(store_error)
    }

    async fn commit(&self, tx: Self::Tx) -> Result<()> {
        tx.commit().await.map_err(store_error)
    }
}

impl InboxStore for PgInbox {
    async fn record(&self, tx: &mut Self::Tx, consumer: &str, id: &str) -> Result<Recorded> {
        let inserted = query(&self.sql.record)
            .bind(consumer.to_owned())
            .bind(id.to_owned())
            .fetch_optional(&mut **tx)
            .await
            .map_err(store_error)?;
        if inserted.is_some() {
            return Ok(Recorded::New);
        }
        // Read committed: this statement sees the record the conflicting transaction
        // committed while the insert waited for it.
        let result: Option<Option<Vec<u8>>> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(Arc::clone(&self.sql.stored_result)))
                .bind(consumer.to_owned())
                .bind(id.to_owned())
                .fetch_optional(&mut **tx)
                .await
                .map_err(store_error)?;
        Ok(Recorded::Duplicate {
            result: result.flatten().map(Bytes::from).unwrap_or_default(),
        })
    }

    /// One round trip when the id is new: the record's insert and `BEGIN` go as one
    /// message (see [`PgInbox`]). A duplicate takes three more (the failed insert, then
    /// [`begin`](Transactional::begin) and [`record`](InboxStore::record), which reads
    /// the first result).
    ///
    /// The insert is a statement each connection prepares once (SQL `PREPARE`), then
    /// runs with `EXECUTE`: parsing and planning it for every message cost about a
    /// twentieth of a consumer's throughput. Which connections have prepared it is not
    /// known here (the pool may be the application's, a pooler may switch server
    /// connections), so the answer tells: an `EXECUTE` refused for want of the
    /// statement is sent again with its `PREPARE` in the same message, and a `PREPARE`
    /// refused because the statement exists, without it. After a few such turns the
    /// insert is sent written out, as it can always run.
    async fn begin_recorded(&self, consumer: &str, id: &str) -> Result<(Self::Tx, Recorded)> {
        let mut record = Record::Execute;
        let mut turns = 1;
        loop {
            let statement = self.sql.begin_recorded(record, consumer, id)?;
            let error = match self.pool.begin_with(AssertSqlSafe(statement)).await {
                Ok(tx) => return Ok((tx, Recorded::New)),
                Err(error) => error,
            };
            if is_unique_violation(&error) {
                // Recorded by a committed transaction (the insert waited for one in
                // flight); `record` reads its result, or records the id if it was
                // purged since.
                let mut tx = self.begin().await?;
                let recorded = self.record(&mut tx, consumer, id).await?;
                return Ok((tx, recorded));
            }
            let next = match record {
                Record::Execute if has_code(&error, UNDEFINED_PREPARED) => Record::Prepare,
                Record::Prepare if has_code(&error, DUPLICATE_PREPARED) => Record::Execute,
                _ => return Err(store_error(error)),
            };
            record = if turns < PREPARED_TRIES {
                next
            } else {
                Record::Insert
            };
            turns += 1;
        }
    }

    async fn store_result(
        &self,
        tx: &mut Self::Tx,
        consumer: &str,
        id: &str,
        result: &[u8],
    ) -> Result<()> {
        query(&self.sql.store_result)
            .bind(consumer.to_owned())
            .bind(id.to_owned())
            .bind(result.to_vec())
            .execute(&mut **tx)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn purge(&self, consumer: &str, before: SystemTime, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let deleted = query(&self.sql.purge)
            .bind(consumer)
            .bind(ms_since(before))
            .bind(sql_limit(limit))
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        Ok(deleted.rows_affected())
    }
}

impl InboxSql {
    /// Records `id` for `consumer`, then `BEGIN`, as one simple query: one round trip.
    ///
    /// Statements before a `BEGIN` in one message run in the transaction it opens: an
    /// inserted record is part of it, and commits or rolls back with the handler's
    /// effects. An insert that fails (a unique violation: the id is recorded) ends the
    /// message before the `BEGIN`, and leaves the connection outside any transaction;
    /// so does a failed `PREPARE` or `EXECUTE`. A statement prepared in the message
    /// stays prepared whatever becomes of the transaction.
    ///
    /// A simple query has no parameters: the values are written in as escape string
    /// constants (see [`text_constant`]).
    ///
    /// # Errors
    ///
    /// A permanent store error for a NUL character, which PostgreSQL text cannot hold.
    fn begin_recorded(&self, record: Record, consumer: &str, id: &str) -> Result<String> {
        let (consumer, id) = (text_constant(consumer)?, text_constant(id)?);
        let name = &self.prepared;
        Ok(match record {
            Record::Execute => format!("EXECUTE {name}({consumer}, {id}); BEGIN"),
            Record::Prepare => format!(
                "{prepare}; EXECUTE {name}({consumer}, {id}); BEGIN",
                prepare = self.prepare
            ),
            Record::Insert => format!(
                "{insert} VALUES ({consumer}, {id}, statement_timestamp()); BEGIN",
                insert = self.insert_record,
            ),
        })
    }
}

/// `text` as an escape string constant, `E'...'`: quotes and backslashes doubled, every
/// other character as it is. Whatever the server's `standard_conforming_strings`, nothing
/// in it can end the constant: sqlx opens every connection with `client_encoding` UTF8,
/// in which no byte of a multi-byte character is a quote or a backslash. A NUL is
/// refused: PostgreSQL text cannot hold it, and in a query string it would end the query.
fn text_constant(text: &str) -> Result<String> {
    if text.contains('\0') {
        return Err(Error::store_permanent(format!(
            "the inbox cannot record {text:?}: PostgreSQL text cannot hold the character 0x00"
        )));
    }
    let mut sql = String::with_capacity(text.len() + 4);
    sql.push_str("E'");
    for c in text.chars() {
        match c {
            '\\' => sql.push_str("\\\\"),
            '\'' => sql.push_str("''"),
            c => sql.push(c),
        }
    }
    sql.push('\'');
    Ok(sql)
}

impl std::fmt::Debug for InboxSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxSql").finish_non_exhaustive()
    }
}
