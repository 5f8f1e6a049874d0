//! PostgreSQL's dialect of the stores written once in `oncebox-sql`: times as
//! `timestamptz` read back in microseconds, names and ids as text, statuses as text.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use oncebox_core::spool::RowStatus;
use oncebox_core::{MessageId, Result};
use oncebox_sql::{Dialect, Query, RowReader};
use sqlx::postgres::PgQueryResult;
use sqlx::{PgPool, Postgres, QueryBuilder};

use crate::RowDecodeError;
use crate::dedup::DedupSql;
use crate::inbox::InboxSql;
use crate::time::from_micros;
use crate::time::to_micros;

/// PostgreSQL's statements and encodings for the stores of `oncebox-sql`, built once
/// per schema by [`PgStore`](crate::PgStore). Cheap to clone.
#[derive(Clone)]
pub struct PgDialect {
    pub(crate) inbox: Arc<InboxSql>,
    pub(crate) dedup: Arc<DedupSql>,
}

impl PgDialect {
    pub(crate) fn new(schema: &str) -> Self {
        Self {
            inbox: Arc::new(InboxSql::new(schema)),
            dedup: Arc::new(DedupSql::new(schema)),
        }
    }
}

impl Dialect for PgDialect {
    type Db = Postgres;
    type Key = String;

    fn key(value: &str) -> String {
        value.to_owned()
    }

    fn time(stored: i64) -> SystemTime {
        from_micros(stored)
    }

    /// A `timestamptz` made of a bound count of microseconds (exact).
    fn push_time(query: &mut QueryBuilder<Postgres>, time: SystemTime) {
        query
            .push("(timestamptz 'epoch' + ")
            .push_bind(to_micros(time))
            .push("::bigint * interval '1 microsecond')");
    }

    fn status_sql(status: RowStatus) -> impl fmt::Display {
        oncebox_sql::text_status_sql(status)
    }

    fn text(
        row: &RowReader<'_, Self>,
        column: &'static str,
    ) -> Result<Option<String>, RowDecodeError> {
        row.get(column)
    }

    fn message_id(row: &RowReader<'_, Self>) -> Result<Option<MessageId>, RowDecodeError> {
        let id: Option<String> = row.get("message_id")?;
        id.map(|id| MessageId::parse(&id))
            .transpose()
            .map_err(|e| row.error("message_id", e))
    }

    fn status(row: &RowReader<'_, Self>) -> Result<RowStatus, RowDecodeError> {
        oncebox_sql::text_status::<Self, _>(row)
    }

    fn rows_affected(result: &PgQueryResult) -> u64 {
        result.rows_affected()
    }

    async fn delete(pool: &PgPool, delete: Query<Postgres>) -> Result<u64> {
        Ok(delete.execute(pool).await?.rows_affected())
    }
}

impl fmt::Debug for PgDialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgDialect").finish_non_exhaustive()
    }
}
