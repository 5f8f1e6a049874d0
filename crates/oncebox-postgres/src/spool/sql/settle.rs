//! The statements after a claim: its settlements in one statement, a lease's extension,
//! and retention's purge.

use super::{Hold, Layout, NO_SYNC_COMMIT, OP_DEAD, OP_DONE, OP_RELEASE, OP_RETRY, scope};
use crate::time::millis_param;

/// All settlements of a claim in one statement. A leased claim's are each filtered by
/// its token; a held claim's need no filter (its transaction holds the rows, and the
/// caller passes only rows it claimed), and a release is nothing to write for it (the
/// commit ends the hold).
pub(super) fn settle(layout: &Layout, delete_done: bool, hold: Hold) -> String {
    let c = &layout.col;
    // Lease: `$1` token, `$2`..`$5` the arrays, `[$6 scope]`; held: `$1`..`$5` the
    // arrays, with the rows' places (`ctid`s) first.
    let (arrays, scope_param) = match hold {
        Hold::Lease => (
            "unnest($2::bigint[], $3::int4[], $4::int8[], $5::text[])
    AS u(seq, op, delay_ms, error)",
            6,
        ),
        Hold::Transaction => (
            "unnest($1::text[]::tid[], $2::bigint[], $3::int4[], $4::int8[], $5::text[])
    AS u(tid, seq, op, delay_ms, error)",
            0,
        ),
    };
    // A held claim's rows are found where they are (TID scans): its transaction holds
    // them, so they cannot have moved.
    let row = |alias: &str| match hold {
        Hold::Lease => format!("{alias}.{} = s.seq", c.seq),
        Hold::Transaction => format!("{alias}.ctid = s.tid AND {alias}.{} = s.seq", c.seq),
    };
    let owned = |alias: &str| {
        let token = match hold {
            Hold::Lease => format!("{alias}.{} = $1::uuid AND ", c.lease_token),
            Hold::Transaction => String::new(),
        };
        format!(
            "{token}{alias}.{status} = 'pending'{scope}",
            status = c.status,
            scope = scope(layout, alias, scope_param),
        )
    };
    let (with_delete, skip_done) = if delete_done {
        (
            format!(
                "gone AS (
  DELETE FROM {table} AS d USING s
  WHERE {row_d} AND s.op = {OP_DONE} AND {owned_d}
),
",
                table = layout.table,
                row_d = row("d"),
                owned_d = owned("d"),
            ),
            format!(" AND s.op <> {OP_DONE}"),
        )
    } else {
        (String::new(), String::new())
    };
    let (skip_release, sync) = match hold {
        Hold::Lease => (String::new(), format!(", {NO_SYNC_COMMIT}")),
        // `synchronous_commit` was set when the claim's transaction began.
        Hold::Transaction => (format!(" WHERE u.op <> {OP_RELEASE}"), String::new()),
    };
    format!(
        "WITH s AS (
  SELECT * FROM {arrays}{skip_release}
),
{with_delete}upd AS (
  UPDATE {table} AS t SET
    {status} = CASE s.op WHEN {OP_DONE} THEN 'done' WHEN {OP_DEAD} THEN 'dead' ELSE 'pending' END,
    {attempts} = t.{attempts} + CASE WHEN s.op IN ({OP_RETRY}, {OP_DEAD}) THEN 1 ELSE 0 END,
    {available_at} = CASE WHEN s.op = {OP_RETRY}
        THEN statement_timestamp() + s.delay_ms * interval '1 millisecond'
        ELSE t.{available_at} END,
    {last_error} = CASE WHEN s.op IN ({OP_RETRY}, {OP_DEAD}) THEN s.error ELSE t.{last_error} END,
    {done_at} = CASE WHEN s.op = {OP_DONE} THEN statement_timestamp() ELSE t.{done_at} END,
    {dead_at} = CASE WHEN s.op = {OP_DEAD} THEN statement_timestamp() ELSE t.{dead_at} END,
    {lease_token} = NULL,
    {lease_until} = NULL
  FROM s
  WHERE {row_t}{skip_done} AND {owned_t}
  RETURNING 1
)
SELECT count(*){sync} FROM upd",
        table = layout.table,
        status = c.status,
        attempts = c.attempts,
        available_at = c.available_at,
        last_error = c.last_error,
        done_at = c.done_at,
        dead_at = c.dead_at,
        lease_token = c.lease_token,
        lease_until = c.lease_until,
        row_t = row("t"),
        owned_t = owned("t"),
    )
}

/// A held claim's settlement when every row was delivered, as a statement with the rows'
/// places written in: `{prefix}"(0,1)","(0,2)"{suffix}`. It carries no parameters, so it
/// rides in one message with the `COMMIT` that follows it (see [`HeldSql::begin`]); with
/// `delete_done` it deletes the rows, else it marks them done.
pub(super) fn settle_done_inline(layout: &Layout, delete_done: bool) -> (String, String) {
    let c = &layout.col;
    let prefix = if delete_done {
        format!("DELETE FROM {table} AS t", table = layout.table)
    } else {
        format!(
            "UPDATE {table} AS t SET {status} = 'done', {done_at} = statement_timestamp(), \
             {lease_token} = NULL, {lease_until} = NULL",
            table = layout.table,
            status = c.status,
            done_at = c.done_at,
            lease_token = c.lease_token,
            lease_until = c.lease_until,
        )
    };
    (
        format!("{prefix} WHERE t.ctid = ANY('{{"),
        format!("}}'::tid[]) AND t.{} = 'pending'", c.status),
    )
}

/// Extends a leased claim: the lease of its rows (`$2`, found by `seq`) that `$1` still
/// holds moves to `$3` ms from now; rows whose lease ended are left alone.
pub(super) fn extend(layout: &Layout) -> String {
    let c = &layout.col;
    format!(
        "UPDATE {table} AS t SET {lease_until} = statement_timestamp() + $3 * interval '1 millisecond'
WHERE t.{seq} = ANY($2::bigint[]) AND t.{lease_token} = $1::uuid AND t.{status} = 'pending'
  AND t.{lease_until} > statement_timestamp(){scope}",
        table = layout.table,
        lease_until = c.lease_until,
        seq = c.seq,
        lease_token = c.lease_token,
        status = c.status,
        scope = scope(layout, "t", 4),
    )
}

/// Deletes at most `$2` done rows settled more than `$1` ms ago, oldest first, on the
/// partial index of done rows.
pub(super) fn purge(layout: &Layout) -> String {
    let c = &layout.col;
    format!(
        "DELETE FROM {table} WHERE {seq} IN (
  SELECT o.{seq} FROM {table} AS o
  WHERE o.{status} = 'done'{scope_o} AND o.{done_at} < statement_timestamp() - {age}
  ORDER BY o.{done_at}
  LIMIT $2
  FOR UPDATE SKIP LOCKED)",
        table = layout.table,
        seq = c.seq,
        status = c.status,
        done_at = c.done_at,
        scope_o = scope(layout, "o", 3),
        age = millis_param(1),
    )
}
