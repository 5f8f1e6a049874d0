//! What every store's statements share: the database's clock, lists passed as JSON,
//! read-committed transactions, and small conversions.

use sqlx::mysql::{MySqlArguments, MySqlPool};
use sqlx::query::Query;
use sqlx::{MySql, Transaction};

use crate::error::store_error;

/// [`NOW_MS`] as a macro, for `concat!` in constant statements.
macro_rules! now_ms {
    () => {
        "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"
    };
}
pub(crate) use now_ms;

/// The database's clock in milliseconds since the Unix epoch, as a SQL expression.
///
/// `UTC_TIMESTAMP` does not depend on the session's `time_zone` (so a zone with daylight
/// saving time cannot make a lease jump by an hour), and like `NOW()` it is fixed for the
/// length of a statement. Every lease, retry time, retention horizon and TTL is measured
/// on it, so relays and workers on hosts with skewed clocks agree.
pub(crate) const NOW_MS: &str = now_ms!();

/// Starts a transaction in `READ COMMITTED` on a pool connection (the next transaction
/// only: the connection's own level is left alone).
///
/// The relay's transactions need it: each statement then reads what committed before it
/// started (a claim sees the leases of the claim before it), and InnoDB takes no gap
/// locks for their reads, so claims and settlements never block producers inserting new
/// rows.
///
/// It starts with a `ROLLBACK`: a task dropped while sqlx was beginning a transaction can
/// leave its connection in an (empty) transaction sqlx does not know about, back in the
/// pool, and `SET TRANSACTION` fails inside a transaction.
pub(crate) async fn begin_read_committed(
    pool: &MySqlPool,
) -> oncebox_core::Result<Transaction<'static, MySql>> {
    pool.begin_with(concat!("ROLLBACK; ", start_read_committed!()))
        .await
        .map_err(store_error)
}

/// Runs `delete`, a bounded retention `DELETE`, in a `READ COMMITTED` transaction of its
/// own (see [`begin_read_committed`]); returns how many rows it deleted.
pub(crate) async fn delete_read_committed(
    pool: &MySqlPool,
    delete: MySqlQuery,
) -> oncebox_core::Result<u64> {
    let mut tx = begin_read_committed(pool).await?;
    let deleted = delete.execute(&mut *tx).await.map_err(store_error)?;
    tx.commit().await.map_err(store_error)?;
    Ok(deleted.rows_affected())
}

/// The statements that start a transaction in `READ COMMITTED`, as a macro for
/// `concat!`.
macro_rules! start_read_committed {
    () => {
        "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION"
    };
}
pub(crate) use start_read_committed;

/// A prepared statement over SQL built once, at first use.
pub(crate) type MySqlQuery = Query<'static, MySql, MySqlArguments>;

/// A query over a statement built once (a `static`).
pub(crate) fn query(sql: &'static str) -> MySqlQuery {
    sqlx::query(sql)
}

/// The most values one `IN ({list})` binds; longer lists run in several statements.
pub(crate) const MAX_LIST: usize = 4096;

/// Where a statement template takes its list of placeholders.
pub(crate) const LIST: &str = "{list}";

/// `template` with its [`LIST`] replaced by placeholders for `len` values, rounded up to
/// a power of two (at least 8): a handful of statement texts then serve every batch
/// size, and each connection's statement cache keeps them prepared.
///
/// Bind the values with [`bind_list`], which fills the extra places with the last value
/// (an `IN` list ignores repeats).
pub(crate) fn with_list(template: &str, len: usize) -> String {
    let places = list_len(len);
    let mut list = String::with_capacity(places * 3);
    for i in 0..places {
        list.push_str(if i == 0 { "?" } else { ", ?" });
    }
    template.replace(LIST, &list)
}

fn list_len(len: usize) -> usize {
    len.max(8).next_power_of_two()
}

/// Binds `values` into the places [`with_list`] made for them.
pub(crate) fn bind_list(mut query: MySqlQuery, values: &[i64]) -> MySqlQuery {
    let Some(last) = values.last() else {
        return query;
    };
    for value in values {
        query = query.bind(*value);
    }
    for _ in values.len()..list_len(values.len()) {
        query = query.bind(*last);
    }
    query
}

/// A query over SQL built for this call (a template with its list filled in).
pub(crate) fn query_owned(sql: String) -> MySqlQuery {
    sqlx::query(sqlx::AssertSqlSafe(sql))
}

pub(crate) use oncebox_core::sql::sql_limit;

pub(crate) use oncebox_core::time::{
    millis_since as ms_since, millis_until as ms_until, offset_millis as duration_ms,
};

/// A UUID as the 16 bytes of a `BINARY(16)` column.
pub(crate) fn uuid_bytes(uuid: &uuid::Uuid) -> Vec<u8> {
    uuid.as_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists() {
        assert_eq!(
            with_list("IN ({list})", 3),
            format!("IN ({})", ["?"; 8].join(", "))
        );
        assert_eq!(list_len(8), 8);
        assert_eq!(list_len(9), 16);
        assert_eq!(list_len(MAX_LIST), MAX_LIST);
    }
}
