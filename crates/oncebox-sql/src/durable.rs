//! What the durable inboxes of every SQL database share: how a stored delivery reads
//! back.

use oncebox_core::sql::CountColumn;
use oncebox_core::{Coordinates, Headers, Received, RowDecodeError};
use sqlx::{ColumnIndex, Database, Decode, Type};

use crate::dialect::{Dialect, RowReader};

/// The delivery a durable inbox row holds: its `message_id`, `topic`, `key`, `kind`,
/// `headers` (JSON text), `payload`, `created_at` (a time column's value), `source`,
/// `partition`, `position` and `delivery_count` columns.
///
/// # Errors
///
/// A column is missing or holds a value oncebox does not write.
pub fn decode_received<D, DB>(row: &RowReader<'_, D>) -> Result<Received, RowDecodeError>
where
    D: Dialect<Db = DB>,
    DB: Database + CountColumn,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Vec<u8>: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> i32: Decode<'r, DB> + Type<DB>,
    &'static str: ColumnIndex<DB::Row>,
{
    let headers: String = row.get("headers")?;
    let payload: Vec<u8> = row.get("payload")?;
    let created_at: Option<i64> = row.get("created_at")?;
    Ok(Received {
        id: D::message_id(row)?,
        topic: row.get("topic")?,
        key: D::text(row, "key")?,
        kind: row.get("kind")?,
        headers: Headers::from_json(&headers).map_err(|e| row.error("headers", e))?,
        payload: payload.into(),
        created_at: created_at.map(D::time),
        coordinates: Coordinates {
            source: row.get("source")?,
            partition: row.get("partition")?,
            position: row.get("position")?,
        },
        delivery_count: row.count("delivery_count")?,
    })
}
