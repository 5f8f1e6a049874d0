//! What operators read of an outbox, once for every SQL database: its figures, one
//! row, the dead letters, the listing the dashboard pages through and the messages
//! published per minute.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use oncebox_core::spool::{
    DeadLetter, MinuteCount, OutboxRow, OutboxStats, RowFilter, RowState, RowStatus,
};
use oncebox_core::sql::{Conditions, CountColumn, ListingStart, sql_limit};
use oncebox_core::{Error, Message, MessageId, Result, RowDecodeError};
use sqlx::{
    ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, QueryBuilder, Row,
    Transaction, Type,
};

use crate::dialect::{Dialect, Query, RowReader, row_state};

/// The database of the statements `S`.
type Db<S> = <<S as OutboxStatements>::Dialect as Dialect>::Db;

/// Where an outbox table keeps what its admin statements read, as SQL over alias `t`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OutboxColumns {
    /// `SELECT … FROM <table> AS t`, up to its `WHERE`: the columns
    /// a row's state (`seq`, `status`, `attempts`, `last_error`,
    /// `available_at`, `lease_until`, `done_at`, `dead_at`) and what
    /// [`OutboxStatements::message`] reads.
    pub select: String,
    /// The table, as `FROM` names it.
    pub table: String,
    /// The position in commit order.
    pub seq: String,
    /// The status, compared with [`Dialect::status_sql`].
    pub status: String,
    /// The message id, compared with [`OutboxStatements::push_id`].
    pub id: String,
    /// The topic, compared with [`OutboxStatements::topic`].
    pub topic: String,
    /// The key, compared with [`Dialect::key`] (where [`OutboxStatements::has_key`]).
    pub key: String,
    /// The creation time, compared with [`Dialect::push_time`].
    pub created: String,
    /// The creation time as a time column's value ([`Dialect::time`] reads it).
    pub created_value: String,
}

impl OutboxColumns {
    /// The columns of a table whose names are oncebox's own (`seq`, `status`, `id`,
    /// `topic`, `key`, `created_at`), `key` quoted as `key`; `select` and `created_value`
    /// as given.
    pub fn named(table: &str, select: String, key: &str, created_value: &str) -> Self {
        Self {
            select,
            table: table.to_owned(),
            seq: "t.seq".to_owned(),
            status: "t.status".to_owned(),
            id: "t.id".to_owned(),
            topic: "t.topic".to_owned(),
            key: format!("t.{key}"),
            created: "t.created_at".to_owned(),
            created_value: created_value.to_owned(),
        }
    }
}

/// The statements of the outbox admin on one outbox table.
///
/// Implemented per table, not per database: a database may keep outboxes of several
/// layouts (PostgreSQL's Debezium-style tables). Each method's contract says which
/// columns its statement returns.
pub trait OutboxStatements: Send + Sync {
    /// The database's encodings.
    type Dialect: Dialect;

    /// The table's columns, for the statements built here.
    fn columns(&self) -> &OutboxColumns;

    /// The table's name in errors.
    fn display(&self) -> &str;

    /// The message of a row of [`OutboxColumns::select`].
    ///
    /// # Errors
    ///
    /// A column is missing or holds a value oncebox does not write.
    fn message(row: &RowReader<'_, Self::Dialect>) -> Result<Message, RowDecodeError>;

    /// Pushes `id` as a value comparable with [`OutboxColumns::id`], bound.
    fn push_id(query: &mut QueryBuilder<Db<Self>>, id: MessageId);

    /// One row of figures at `now` (or the database's clock): `waiting` (every pending
    /// row), `scheduled` (pending, never attempted, due later), `dead`, `done` if
    /// `with_done` (64-bit integers), and `oldest_pending`, how long the first pending
    /// row in commit order that is not scheduled ahead has waited (since it became due
    /// if it was scheduled, else since its creation; `NULL` for none), in the unit of
    /// [`Dialect::time`].
    fn counts(&self, with_done: bool, now: SystemTime) -> Query<Db<Self>>;

    /// `minute` (minutes since the Unix epoch) and `published` (64-bit integers): the
    /// rows published in each minute since `since`, oldest minute first, minutes with
    /// none left out.
    fn published_per_minute(&self, since: SystemTime) -> Query<Db<Self>>;

    /// Deletes the row of `id` if it is dead.
    fn purge_dead(&self, id: MessageId) -> Query<Db<Self>>;

    /// What the topic column holds for `topic`, or `None` if no row can have it (a
    /// table that takes topics under a prefix only). The default: `topic` itself.
    fn topic(&self, topic: &str) -> Option<String> {
        Some(topic.to_owned())
    }

    /// Whether a row can have the key `key` (the default: every key can).
    fn has_key(&self, key: &str) -> bool {
        let _ = key;
        true
    }

    /// What follows [`OutboxColumns::select`] in a listing with `filter` (and in the
    /// dead letters' statement, a listing of status dead) before its conditions: an
    /// index hint for a planner that would read the wrong index. The default: none.
    fn index_hint(&self, filter: &RowFilter) -> &'static str {
        let _ = filter;
        ""
    }

    /// Starts the read-only transaction [`published_per_minute`](Self::published_per_minute)
    /// runs in (the default: a plain `BEGIN`).
    ///
    /// # Errors
    ///
    /// A store error if no connection could be had.
    fn begin_read(
        pool: &Pool<Db<Self>>,
    ) -> impl Future<Output = Result<Transaction<'static, Db<Self>>>> + Send {
        async move { pool.begin().await.map_err(Error::from) }
    }
}

/// The outbox admin of one table: what the backends' `OutboxAdmin` implementations
/// read, written once; replay stays with each backend, whose relays it has to respect.
pub struct SqlOutboxAdmin<'a, S: OutboxStatements> {
    pool: &'a Pool<Db<S>>,
    sql: &'a S,
}

impl<'a, S, DB> SqlOutboxAdmin<'a, S>
where
    S: OutboxStatements<Dialect: Dialect<Db = DB>>,
    DB: Database<Arguments: IntoArguments<DB>> + CountColumn,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    &'static str: ColumnIndex<DB::Row>,
{
    /// The admin of the table `sql` describes, in the database behind `pool`.
    pub fn new(pool: &'a Pool<DB>, sql: &'a S) -> Self {
        Self { pool, sql }
    }

    /// [`OutboxAdmin::stats`](oncebox_core::spool::OutboxAdmin::stats): one statement.
    ///
    /// # Errors
    ///
    /// A store error.
    pub async fn stats(&self) -> Result<OutboxStats> {
        self.counts(true).await
    }

    /// The figures of [`stats`](Self::stats) without the count of published rows, which
    /// grows with retention: what a relay reports as its backlog.
    ///
    /// # Errors
    ///
    /// A store error.
    pub async fn backlog(&self) -> Result<oncebox_core::spool::Backlog> {
        self.counts(false).await.map(Into::into)
    }

    async fn counts(&self, with_done: bool) -> Result<OutboxStats> {
        let row = self
            .sql
            .counts(with_done, SystemTime::now())
            .fetch_one(self.pool)
            .await?;
        let count = |column: &'static str| -> Result<u64> {
            let n: i64 = row.try_get(column)?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        let oldest: Option<i64> = row.try_get("oldest_pending")?;
        let scheduled = count("scheduled")?;
        Ok(OutboxStats {
            pending: count("waiting")?.saturating_sub(scheduled),
            scheduled,
            done: if with_done { count("done")? } else { 0 },
            dead: count("dead")?,
            oldest_pending_age: oldest.map(|age| {
                S::Dialect::time(age)
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or(Duration::ZERO)
            }),
        })
    }

    /// [`OutboxAdmin::row`](oncebox_core::spool::OutboxAdmin::row).
    ///
    /// # Errors
    ///
    /// A store error; a permanent one if the row holds values oncebox did not write.
    pub async fn row(&self, id: MessageId) -> Result<Option<OutboxRow>> {
        let row = self.by_id(id).await?;
        row.map(|row| self.decode(&row)).transpose()
    }

    /// The state of the row of `id`: [`row`](Self::row) without its message, so that
    /// the state of a row whose message cannot be read (the reason it is dead) is shown.
    ///
    /// # Errors
    ///
    /// A store error; a permanent one if the row's state holds values oncebox did not
    /// write.
    pub async fn state(&self, id: MessageId) -> Result<Option<RowState>> {
        let Some(row) = self.by_id(id).await? else {
            return Ok(None);
        };
        let reader =
            RowReader::<S::Dialect>::new(&row, self.sql.display(), format_args!("id {id}"));
        Ok(Some(row_state::<S::Dialect, DB>(&reader)?))
    }

    async fn by_id(&self, id: MessageId) -> Result<Option<DB::Row>> {
        let c = self.sql.columns();
        let mut query = QueryBuilder::new(&c.select);
        query.push(format_args!(" WHERE {} = ", c.id));
        S::push_id(&mut query, id);
        Ok(query.build().fetch_optional(self.pool).await?)
    }

    /// [`OutboxAdmin::dead_letters`](oncebox_core::spool::OutboxAdmin::dead_letters):
    /// the status's rows in commit order, after `after`.
    ///
    /// # Errors
    ///
    /// A store error; a permanent one if a dead row cannot be decoded.
    pub async fn dead_letters(&self, after: Option<i64>, limit: usize) -> Result<Vec<DeadLetter>> {
        let c = self.sql.columns();
        let dead = RowFilter {
            status: Some(RowStatus::Dead),
            ..RowFilter::default()
        };
        let mut query = QueryBuilder::new(&c.select);
        query
            .push(self.sql.index_hint(&dead))
            .push(format_args!(" WHERE {} = ", c.status))
            .push(S::Dialect::status_sql(RowStatus::Dead))
            .push(format_args!(" AND {} > ", c.seq))
            .push_bind(after.unwrap_or(i64::MIN))
            .push(format_args!(" ORDER BY {} LIMIT ", c.seq))
            .push_bind(sql_limit(limit));
        let rows = query.build().fetch_all(self.pool).await?;
        rows.iter()
            .map(|row| {
                let OutboxRow { state, message } = self.decode(row)?;
                Ok(DeadLetter {
                    seq: state.seq,
                    id: message.id,
                    message,
                    attempts: state.attempts,
                    reason: state.last_error.unwrap_or_default(),
                    dead_at: state.settled_at.unwrap_or(UNIX_EPOCH),
                })
            })
            .collect()
    }

    /// [`OutboxAdmin::purge_dead`](oncebox_core::spool::OutboxAdmin::purge_dead).
    ///
    /// # Errors
    ///
    /// A store error.
    pub async fn purge_dead(&self, id: MessageId) -> Result<bool> {
        let done = self.sql.purge_dead(id).execute(self.pool).await?;
        Ok(S::Dialect::rows_affected(&done) > 0)
    }

    /// [`OutboxAdmin::rows`](oncebox_core::spool::OutboxAdmin::rows): one statement,
    /// which reads the table's rows in the listing's order from `before` on, so that a
    /// page costs the same at any depth where an index serves the filter (each
    /// backend's documentation says which does).
    ///
    /// # Errors
    ///
    /// A store error; a permanent one if a row holds values oncebox did not write.
    pub async fn rows(
        &self,
        filter: &RowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<OutboxRow>> {
        let Some(start) = self.start(filter, before).await? else {
            return Ok(Vec::new());
        };
        let rows = self
            .listing("", filter, start, limit)
            .build()
            .fetch_all(self.pool)
            .await?;
        rows.iter().map(|row| self.decode(row)).collect()
    }

    /// The plan of [`rows`](Self::rows) for the same arguments: its statement after
    /// `explain` (the database's `EXPLAIN …`), each row of the result as it comes.
    /// `None` if the row at `before` is gone, so that nothing would be read.
    ///
    /// # Errors
    ///
    /// A store error.
    pub async fn explain_rows(
        &self,
        explain: &str,
        filter: &RowFilter,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Option<Vec<DB::Row>>> {
        let Some(start) = self.start(filter, before).await? else {
            return Ok(None);
        };
        let mut listing = self.listing(explain, filter, start, limit);
        Ok(Some(listing.build().fetch_all(self.pool).await?))
    }

    /// [`OutboxAdmin::published_per_minute`](oncebox_core::spool::OutboxAdmin::published_per_minute).
    ///
    /// # Errors
    ///
    /// A store error.
    pub async fn published_per_minute(&self, since: SystemTime) -> Result<Vec<MinuteCount>> {
        let mut tx = S::begin_read(self.pool).await?;
        let rows = self
            .sql
            .published_per_minute(since)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.iter()
            .map(|row| {
                let minute: i64 = row.try_get("minute")?;
                let published: i64 = row.try_get("published")?;
                Ok(MinuteCount {
                    minute: UNIX_EPOCH
                        + Duration::from_secs(u64::try_from(minute).unwrap_or(0) * 60),
                    published: u64::try_from(published).unwrap_or(0),
                })
            })
            .collect()
    }

    /// Where a page starts: the newest row, or the row before `before` in the listing's
    /// order. In creation order the row at `before` is read for its time: `None` if it
    /// is gone (purged since the page before), which ends the listing.
    async fn start(&self, filter: &RowFilter, before: Option<i64>) -> Result<Option<ListingStart>> {
        let Some(seq) = before else {
            return Ok(Some(ListingStart::Newest));
        };
        if !ListingStart::by_creation(filter) {
            return Ok(Some(ListingStart::Before { seq }));
        }
        let c = self.sql.columns();
        let mut query = QueryBuilder::new(format!(
            "SELECT {} AS created FROM {} AS t WHERE {} = ",
            c.created_value, c.table, c.seq
        ));
        query.push_bind(seq);
        let Some(row) = query.build().fetch_optional(self.pool).await? else {
            return Ok(None);
        };
        let created: i64 = row.try_get("created")?;
        Ok(Some(ListingStart::BeforeCreated { created, seq }))
    }

    /// The listing statement after `prefix` (an `EXPLAIN`, for a test of its plan),
    /// with a condition for each criterion of `filter` that is set: the status as a
    /// literal (the planner then reads the status's partial index, in every plan, cached
    /// or not), every value bound.
    pub fn listing(
        &self,
        prefix: &str,
        filter: &RowFilter,
        start: ListingStart,
        limit: usize,
    ) -> QueryBuilder<DB> {
        let c = self.sql.columns();
        let mut query = QueryBuilder::new(prefix);
        query.push(&c.select).push(self.sql.index_hint(filter));
        let mut conditions = Conditions::new(&mut query);
        if let Some(status) = filter.status {
            conditions
                .and(format_args!("{} = ", c.status))
                .push(S::Dialect::status_sql(status));
        }
        if let Some(topic) = &filter.topic {
            match self.sql.topic(topic) {
                Some(topic) => conditions
                    .and(format_args!("{} = ", c.topic))
                    .push_bind(topic),
                None => conditions.and("1 = 0"),
            };
        }
        if let Some(key) = &filter.key {
            if self.sql.has_key(key) {
                conditions
                    .and(format_args!("{} = ", c.key))
                    .push_bind(S::Dialect::key(key));
            } else {
                conditions.and("1 = 0");
            }
        }
        if let Some(id) = filter.id {
            S::push_id(conditions.and(format_args!("{} = ", c.id)), id);
        }
        if let Some(from) = filter.created_from {
            S::Dialect::push_time(conditions.and(format_args!("{} >= ", c.created)), from);
        }
        if let Some(until) = filter.created_until {
            S::Dialect::push_time(conditions.and(format_args!("{} < ", c.created)), until);
        }
        match start {
            ListingStart::Newest => {}
            ListingStart::Before { seq } => {
                conditions.and(format_args!("{} < ", c.seq)).push_bind(seq);
            }
            ListingStart::BeforeCreated { created, seq } => {
                let created = S::Dialect::time(created);
                if S::Dialect::ROW_VALUE_RANGES {
                    let row = conditions.and(format_args!("({}, {}) < (", c.created, c.seq));
                    S::Dialect::push_time(row, created);
                    row.push(", ").push_bind(seq).push(")");
                } else {
                    let row = conditions.and(format_args!("{} <= ", c.created));
                    S::Dialect::push_time(row, created);
                    row.push(format_args!(" AND ({} < ", c.created));
                    S::Dialect::push_time(row, created);
                    row.push(format_args!(" OR {} < ", c.seq))
                        .push_bind(seq)
                        .push(")");
                }
            }
        }
        query.push(" ORDER BY ");
        if ListingStart::by_creation(filter) {
            query.push(format_args!("{} DESC, ", c.created));
        }
        query
            .push(format_args!("{} DESC LIMIT ", c.seq))
            .push_bind(sql_limit(limit));
        query
    }

    /// Decodes one row of [`OutboxColumns::select`].
    fn decode(&self, row: &DB::Row) -> Result<OutboxRow> {
        let seq: i64 = row.try_get("seq")?;
        let reader =
            RowReader::<S::Dialect>::new(row, self.sql.display(), format_args!("seq {seq}"));
        Ok(OutboxRow {
            state: row_state::<S::Dialect, DB>(&reader)?,
            message: S::message(&reader)?,
        })
    }
}
