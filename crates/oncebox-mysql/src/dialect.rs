//! MySQL's and MariaDB's dialect of the stores written once in `oncebox-sql`: times as
//! milliseconds on the database's clock, names and ids as bytes, statuses as numbers.

use std::fmt;
use std::time::SystemTime;

use oncebox_core::spool::RowStatus;
use oncebox_core::time::{from_unix_millis, to_unix_millis};
use oncebox_core::{MessageId, Result};
use oncebox_sql::{Dialect, Field, Query, RowReader};
use sqlx::mysql::MySqlQueryResult;
use sqlx::{MySql, MySqlPool, QueryBuilder};

use crate::RowDecodeError;
use crate::error::check_bytes;
use crate::inbox::{MAX_CONSUMER_BYTES, MAX_ID_BYTES};
use crate::spool::sql::{DEAD, DONE, PENDING};
use crate::sql::delete_read_committed;

/// MySQL's statements and encodings for the stores of `oncebox-sql`.
/// Made by the crate only.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct MySqlDialect;

impl Dialect for MySqlDialect {
    type Db = MySql;
    type Key = Vec<u8>;

    const ROW_VALUE_RANGES: bool = false;

    fn key(value: &str) -> Vec<u8> {
        value.as_bytes().to_vec()
    }

    fn check(field: Field, value: &str) -> Result<()> {
        let limit = match field {
            Field::Consumer => MAX_CONSUMER_BYTES,
            _ => MAX_ID_BYTES,
        };
        check_bytes(field.name(), value, limit)
    }

    fn time(stored: i64) -> SystemTime {
        from_unix_millis(stored)
    }

    fn push_time(query: &mut QueryBuilder<MySql>, time: SystemTime) {
        query.push_bind(to_unix_millis(time));
    }

    fn status_sql(status: RowStatus) -> impl fmt::Display {
        match status {
            RowStatus::Pending => PENDING.to_string(),
            RowStatus::Done => DONE.to_string(),
            RowStatus::Dead => DEAD.to_string(),
            // A status this version does not store: no row has it.
            _ => "NULL".to_owned(),
        }
    }

    fn text(
        row: &RowReader<'_, Self>,
        column: &'static str,
    ) -> Result<Option<String>, RowDecodeError> {
        row.text(column)
    }

    fn message_id(row: &RowReader<'_, Self>) -> Result<Option<MessageId>, RowDecodeError> {
        Ok(row.uuid("message_id")?.map(MessageId::from_uuid))
    }

    fn status(row: &RowReader<'_, Self>) -> Result<RowStatus, RowDecodeError> {
        match row.get::<i8>("status")? {
            PENDING => Ok(RowStatus::Pending),
            DONE => Ok(RowStatus::Done),
            DEAD => Ok(RowStatus::Dead),
            other => Err(row.error("status", format!("unknown status {other}"))),
        }
    }

    /// 0 is "never" in the settlement and lease columns, which hold no `NULL`.
    fn optional_time(stored: Option<i64>) -> Option<SystemTime> {
        stored.filter(|&ms| ms != 0).map(from_unix_millis)
    }

    fn rows_affected(result: &MySqlQueryResult) -> u64 {
        result.rows_affected()
    }

    /// Deletes in a `READ COMMITTED` transaction of its own: InnoDB then takes no gap
    /// locks, so the delete never blocks writers inserting new rows.
    async fn delete(pool: &MySqlPool, delete: Query<MySql>) -> Result<u64> {
        delete_read_committed(pool, delete).await
    }
}
