//! The transactional inbox and the inbox admin, once for every SQL database.

use std::fmt;
use std::time::SystemTime;

use oncebox_core::consumer::{ConsumerStats, InboxAdmin, InboxRow, InboxRowFilter};
use oncebox_core::sql::CountColumn;
use oncebox_core::sql::{Conditions, sql_limit};
use oncebox_core::store::{InboxStore, Recorded, Transactional};
use oncebox_core::{Bytes, Error, Result, RowDecodeError};
use sqlx::{
    ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, QueryBuilder, Row,
    Transaction, Type,
};

use crate::dialect::{
    Dialect, Field, Query, RowReader, inserted, is_unique_violation, required_text, row_state,
};
use crate::durable::decode_received;

/// The statements of the transactional inbox and of the inbox admin on one database.
///
/// Each method returns its statement with the values bound; the contract says what the
/// statement does and which columns it reads. Statements that write take their time from
/// the database's clock or the caller's, as the dialect keeps time.
pub trait InboxDialect: Dialect {
    /// Inserts the record of `consumer` processing `id`, with its processing time. A
    /// record already there is left as it is, and the statement either changes no row or
    /// fails on the unique key (then it must leave the transaction usable).
    fn record(&self, consumer: &str, id: &str) -> Query<Self::Db>;

    /// One message that inserts the record of `consumer` processing `id` and begins a
    /// transaction holding it, so that a new id costs the handler's transaction one
    /// round trip instead of two; `None` (the default) where the database cannot do both
    /// at once: then `BEGIN`, then [`record`](Self::record).
    ///
    /// The statement must fail with a unique violation and leave no transaction open when
    /// the record exists (after waiting, like `record`, for a transaction in flight that
    /// holds it). Its values are written into its text, so it must be safe by
    /// construction whatever they hold: never escaped strings.
    fn begin_recorded(&self, consumer: &str, id: &str) -> Option<String> {
        let _ = (consumer, id);
        None
    }

    /// Reads the `result` column (bytes, `NULL` for none) of the record of `consumer`
    /// and `id`, as last committed: a statement of its own in read-committed
    /// transactions, a locking read otherwise.
    fn stored_result(&self, consumer: &str, id: &str) -> Query<Self::Db>;

    /// Sets the result of the record of `consumer` and `id`: an upsert that inserts the
    /// record when missing, or an update that changes (or matches) no row then.
    fn store_result(&self, consumer: &str, id: &str, result: &[u8]) -> Query<Self::Db>;

    /// Inserts the record of `consumer` and `id` with `result`, run when
    /// [`store_result`](Self::store_result) changed no row; `None` (the default) where
    /// `store_result` is an upsert.
    fn insert_result(&self, consumer: &str, id: &str, result: &[u8]) -> Option<Query<Self::Db>> {
        let _ = (consumer, id, result);
        None
    }

    /// Deletes at most `limit` of `consumer`'s records processed before `before`, oldest
    /// first, on the `(consumer, processed_at)` index; run by [`Dialect::delete`].
    fn purge(&self, consumer: &str, before: SystemTime, limit: usize) -> Query<Self::Db>;

    /// Adds one to `consumer`'s count of skipped duplicates (inserting the count at 1),
    /// with the time.
    fn count_duplicate(&self, consumer: &str) -> Query<Self::Db>;

    /// Reads the figures of every consumer of both inboxes, in byte order of the name:
    /// columns `consumer`, `handled`, `pending`, `dead` and `duplicates` (64-bit
    /// integers) and `last_handled` (a time column's value, `NULL` for none).
    fn consumers(&self) -> Query<Self::Db>;

    /// `SELECT <a durable inbox row> FROM <the durable inbox> AS d`, up to its `WHERE`,
    /// for the listing to add its conditions to: the columns
    /// [`Dialect::status`] and the other state columns and [`decode_received`] read, and `consumer`,
    /// `dedup_id`, `received_at` and `result`.
    fn durable_rows(&self) -> &str;

    /// The `key` column of [`durable_rows`](Self::durable_rows) in a condition, quoted as
    /// the database needs (`key` is a reserved word in some).
    const DURABLE_KEY: &'static str;

    /// The transactional inbox's name in errors.
    fn inbox_table(&self) -> &str;

    /// The durable inbox's name in errors.
    fn durable_table(&self) -> &str;
}

/// The transactional inbox: records of the ids each consumer processed, written in the
/// handler's transaction; and the inbox admin of the database (figures of both inboxes,
/// the durable inbox's rows).
///
/// Each backend crate names it for its dialect (`PgInbox`, `MySqlInbox`,
/// `SqliteInbox`) and documents there how its statements behave.
pub struct SqlInbox<D: Dialect> {
    pool: Pool<D::Db>,
    dialect: D,
}

impl<D: Dialect> SqlInbox<D> {
    /// The inbox of the database behind `pool`, with the statements of `dialect`.
    pub fn new(pool: Pool<D::Db>, dialect: D) -> Self {
        Self { pool, dialect }
    }
}

// Not derived: a derive would ask for `D::Db: Clone`, which no sqlx database is.
impl<D: Dialect> Clone for SqlInbox<D> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            dialect: self.dialect.clone(),
        }
    }
}

impl<D: Dialect> fmt::Debug for SqlInbox<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlInbox")
            .field("pool", &self.pool)
            .field("dialect", &self.dialect)
            .finish()
    }
}

impl<D: Dialect> Transactional for SqlInbox<D> {
    type Tx = Transaction<'static, D::Db>;

    async fn begin(&self) -> Result<Self::Tx> {
        D::begin(&self.pool).await
    }

    async fn commit(&self, tx: Self::Tx) -> Result<()> {
        tx.commit().await.map_err(Error::from)
    }
}

/// Adds one to `consumer`'s count of skipped duplicates, in a statement of its own: for
/// the transactional inbox and the durable inbox alike.
///
/// # Errors
///
/// A store error.
pub async fn count_duplicate<D, DB>(pool: &Pool<DB>, dialect: &D, consumer: &str) -> Result<()>
where
    D: InboxDialect<Db = DB>,
    DB: Database<Arguments: IntoArguments<DB>>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    D::check(Field::Consumer, consumer)?;
    dialect.count_duplicate(consumer).execute(pool).await?;
    Ok(())
}

impl<D, DB> InboxStore for SqlInbox<D>
where
    D: InboxDialect<Db = DB>,
    DB: Database<Arguments: IntoArguments<DB>>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'r> Option<Vec<u8>>: Decode<'r, DB> + Type<DB>,
    &'static str: ColumnIndex<DB::Row>,
{
    async fn begin_recorded(&self, consumer: &str, id: &str) -> Result<(Self::Tx, Recorded)> {
        D::check(Field::Consumer, consumer)?;
        D::check(Field::MessageId, id)?;
        if let Some(statement) = self.dialect.begin_recorded(consumer, id) {
            // In a task of its own: a caller that stops waiting (a consumer stopped, a
            // timeout) would otherwise put the connection back in the pool inside the
            // transaction the statement began, holding the record, for the pool's next
            // user to commit. The task runs the statement to its end, and a transaction
            // nobody takes is rolled back as it is dropped.
            let pool = self.pool.clone();
            let begin =
                tokio::spawn(async move { pool.begin_with(sqlx::AssertSqlSafe(statement)).await });
            let begun = match begin.await {
                Ok(begun) => begun,
                Err(stopped) if stopped.is_panic() => {
                    std::panic::resume_unwind(stopped.into_panic())
                }
                Err(_) => {
                    return Err(Error::store_outage(
                        "the runtime stopped while the inbox record was written",
                    ));
                }
            };
            match begun {
                Ok(tx) => return Ok((tx, Recorded::New)),
                // Recorded by a committed transaction: `record` below reads its result
                // (or records the id, if it was purged since).
                Err(error) if is_unique_violation(&error) => {}
                Err(error) => return Err(error.into()),
            }
        }
        let mut tx = self.begin().await?;
        let recorded = self.record(&mut tx, consumer, id).await?;
        Ok((tx, recorded))
    }

    async fn record(&self, tx: &mut Self::Tx, consumer: &str, id: &str) -> Result<Recorded> {
        D::check(Field::Consumer, consumer)?;
        D::check(Field::MessageId, id)?;
        let insert = self.dialect.record(consumer, id).execute(&mut **tx).await;
        if inserted::<D>(insert)? {
            return Ok(Recorded::New);
        }
        // The insert waited for the transaction holding the key; this statement reads
        // the record it committed.
        let row = self
            .dialect
            .stored_result(consumer, id)
            .fetch_optional(&mut **tx)
            .await?;
        let result = match row {
            Some(row) => row.try_get::<Option<Vec<u8>>, _>("result")?,
            None => None,
        };
        Ok(Recorded::Duplicate {
            result: result.map(Bytes::from).unwrap_or_default(),
        })
    }

    async fn store_result(
        &self,
        tx: &mut Self::Tx,
        consumer: &str,
        id: &str,
        result: &[u8],
    ) -> Result<()> {
        D::check(Field::Consumer, consumer)?;
        D::check(Field::MessageId, id)?;
        let stored = self
            .dialect
            .store_result(consumer, id, result)
            .execute(&mut **tx)
            .await?;
        if D::rows_affected(&stored) == 0
            && let Some(insert) = self.dialect.insert_result(consumer, id, result)
        {
            insert.execute(&mut **tx).await?;
        }
        Ok(())
    }

    async fn purge(&self, consumer: &str, before: SystemTime, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        D::delete(&self.pool, self.dialect.purge(consumer, before, limit)).await
    }

    async fn count_duplicate(&self, consumer: &str) -> Result<()> {
        count_duplicate(&self.pool, &self.dialect, consumer).await
    }
}

impl<D, DB> InboxAdmin for SqlInbox<D>
where
    D: InboxDialect<Db = DB>,
    DB: Database<Arguments: IntoArguments<DB>> + CountColumn,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'r> Vec<u8>: Decode<'r, DB> + Type<DB>,
    for<'r> i32: Decode<'r, DB> + Type<DB>,
    &'static str: ColumnIndex<DB::Row>,
{
    async fn consumers(&self) -> Result<Vec<ConsumerStats>> {
        let rows = self.dialect.consumers().fetch_all(&self.pool).await?;
        rows.iter().map(|row| self.consumer_stats(row)).collect()
    }

    async fn inbox_rows(
        &self,
        filter: &InboxRowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<InboxRow>> {
        let rows = self
            .listing(filter, before, limit)
            .build()
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|row| self.inbox_row_of(row)).collect()
    }

    async fn inbox_row(&self, seq: i64) -> Result<Option<InboxRow>> {
        let mut query = QueryBuilder::new(self.dialect.durable_rows());
        query.push(" WHERE d.seq = ").push_bind(seq);
        let row = query.build().fetch_optional(&self.pool).await?;
        row.map(|row| self.inbox_row_of(&row)).transpose()
    }
}

impl<D, DB> SqlInbox<D>
where
    D: InboxDialect<Db = DB>,
    DB: Database + CountColumn,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'r> Vec<u8>: Decode<'r, DB> + Type<DB>,
    for<'r> i32: Decode<'r, DB> + Type<DB>,
    &'static str: ColumnIndex<DB::Row>,
{
    /// The listing statement: [`InboxDialect::durable_rows`] with a condition for each
    /// criterion of `filter` that is set, every value bound, newest first from `before`.
    fn listing(
        &self,
        filter: &InboxRowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> QueryBuilder<DB> {
        let mut query = QueryBuilder::new(self.dialect.durable_rows());
        let mut conditions = Conditions::new(&mut query);
        if let Some(consumer) = &filter.consumer {
            conditions.and("d.consumer = ").push_bind(D::key(consumer));
        }
        if let Some(status) = filter.status {
            conditions.and("d.status = ").push(D::status_sql(status));
        }
        if let Some(topic) = &filter.topic {
            conditions.and("d.topic = ").push_bind(topic.clone());
        }
        if let Some(key) = &filter.key {
            conditions
                .and(format_args!("{} = ", D::DURABLE_KEY))
                .push_bind(D::key(key));
        }
        if let Some(id) = &filter.dedup_id {
            conditions.and("d.dedup_id = ").push_bind(D::key(id));
        }
        if let Some(from) = filter.received_from {
            D::push_time(conditions.and("d.received_at >= "), from);
        }
        if let Some(until) = filter.received_until {
            D::push_time(conditions.and("d.received_at < "), until);
        }
        if let Some(before) = before {
            conditions.and("d.seq < ").push_bind(before);
        }
        query
            .push(" ORDER BY d.seq DESC LIMIT ")
            .push_bind(sql_limit(limit));
        query
    }

    /// Decodes one row of [`InboxDialect::durable_rows`].
    fn inbox_row_of(&self, row: &DB::Row) -> Result<InboxRow> {
        let seq: i64 = row.try_get("seq")?;
        let reader =
            RowReader::<D>::new(row, self.dialect.durable_table(), format_args!("seq {seq}"));
        let decode = || -> std::result::Result<InboxRow, RowDecodeError> {
            Ok(InboxRow {
                consumer: required_text::<D>(&reader, "consumer")?,
                dedup_id: required_text::<D>(&reader, "dedup_id")?,
                state: row_state::<D, DB>(&reader)?,
                received_at: D::time(reader.get("received_at")?),
                result: reader.get::<Option<Vec<u8>>>("result")?.map(Bytes::from),
                received: decode_received::<D, DB>(&reader)?,
            })
        };
        Ok(decode()?)
    }

    /// Decodes one row of [`InboxDialect::consumers`].
    fn consumer_stats(&self, row: &DB::Row) -> Result<ConsumerStats> {
        let count = |column: &'static str| -> Result<u64> {
            let n: i64 = row.try_get(column)?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        let reader = RowReader::<D>::new(row, self.dialect.inbox_table(), "consumer figures");
        let last: Option<i64> = row.try_get("last_handled")?;
        Ok(ConsumerStats {
            consumer: required_text::<D>(&reader, "consumer")?,
            handled: count("handled")?,
            pending: count("pending")?,
            dead: count("dead")?,
            duplicates: count("duplicates")?,
            last_handled_at: last.map(D::time),
        })
    }
}
