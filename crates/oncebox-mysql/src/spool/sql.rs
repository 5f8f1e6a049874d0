//! The statements of a spool table, built once per table from its [`Layout`].
//!
//! Parameters are `?` in text order; a scoped table (the durable inbox) binds its
//! consumer where a statement's docs say `[scope]`.

use crate::sql::{LIST, NOW_MS};

/// Records, after a `shrink_claim_if` or `drop_claim_if`, whether it changed the claim:
/// the `_if_settled` statements apply only then. A user variable of the connection, set
/// before every use; the optimizer reads it as a constant, so a statement whose claim
/// was not changed touches no row.
pub(crate) const SETTLED: &str = "SET @oncebox_settled = ROW_COUNT()";

/// `settled`: whether the last [`SETTLED`] recorded a changed claim (1) or not (0).
pub(crate) const READ_SETTLED: &str = "SELECT @oncebox_settled AS settled";

/// Where [`SpoolSql::lock_taken`] takes its condition on `seq`, from [`seq_runs`].
pub(crate) const SEQ_RUNS: &str = "{seq_runs}";

/// `recorded`: whether the statement before it, a `record_claim_if_locked`, recorded the
/// claim (1 inserted, 2 added to) or not (0).
pub(crate) const READ_RECORDED: &str = "SELECT ROW_COUNT() AS recorded";

/// The outbox and the durable inbox share their bookkeeping columns; they differ in
/// table, scope and the columns of their items.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    /// The table.
    pub(crate) table: &'static str,
    /// A column scoping the rows (the durable inbox's consumer).
    pub(crate) scope: Option<&'static str>,
    /// The columns the item decoder reads, over alias `t`.
    pub(crate) item: &'static str,
}

/// Row statuses.
pub(crate) const PENDING: i8 = 0;
pub(crate) const DONE: i8 = 1;
pub(crate) const DEAD: i8 = 2;

/// Failure codes in the `fail` statement's JSON.
pub(crate) const OP_RETRY: i8 = 3;
pub(crate) const OP_DEAD: i8 = 4;

/// The statements of one spool table. `{list}` marks a list of row numbers, filled in
/// per call by [`with_list`](crate::sql::with_list). `?` spool is the table's name in
/// `oncebox_claim_locks` and `oncebox_claims`.
#[derive(Debug)]
pub(crate) struct SpoolSql {
    pub(crate) table: &'static str,
    pub(crate) scoped: bool,
    /// `?` spool: locks the table's claim lock to the end of the transaction.
    pub(crate) lock: String,
    /// `?` spool → `token`, `lease_until`, `seqs`, `now_ms`: the table's claims.
    pub(crate) claims: String,
    /// `?` spool, `?` token: deletes the claim if its lease has ended.
    pub(crate) drop_ended: String,
    /// `[scope]`, `?` window → `seq`, `k`, `available_at`, `now_ms`, `attempts` and the
    /// item: the first pending rows in commit order.
    pub(crate) window: String,
    /// As `window`, passing over the rows of a `{list}` of seqs: `[scope]`, `{list}`,
    /// `?` window.
    pub(crate) window_skipping: String,
    /// `{list}` seqs, `[scope]`, `?` now → `seq`, `attempts` and the item of each of those
    /// rows still pending and due, locked `FOR UPDATE SKIP LOCKED`.
    pub(crate) lock_rows: String,
    /// `?` spool, `?` token, `?` lease until, `?` seqs (JSON): records a claim, or adds
    /// rows to it.
    pub(crate) record_claim: String,
    /// [`SEQ_RUNS`] rows: locks those still pending `FOR UPDATE SKIP LOCKED`, and counts
    /// them into `@oncebox_locked`. Step 1's rows, taken as read: a row that a
    /// transaction in flight holds (a cancel that has deleted it) is not counted.
    pub(crate) lock_taken: String,
    /// As `record_claim`, followed by `?` rows: only if `@oncebox_locked` counts them
    /// all. [`READ_RECORDED`] then says whether it did.
    pub(crate) record_claim_if_locked: String,
    /// `[scope]`, `?` key → the first pending row (`seq`, `k`, `available_at`) of the
    /// first key at or after it.
    pub(crate) next_head: String,
    /// `[scope]`, `?` key, `?` from seq, `?` limit → the key's pending rows from `seq`.
    pub(crate) key_rows: String,
    /// `[scope]`, `?` now, `?` limit → due pending rows without a key.
    pub(crate) unkeyed: String,
    /// `?` spool, `?` token → `seqs`, the claim's row locked: what a settlement may touch.
    pub(crate) held: String,
    /// `?` spool, `?` token → `seqs`, the claim's row locked in share mode.
    pub(crate) holds: String,
    /// `?` seqs (JSON), `?` spool, `?` token: what the claim holds after a settlement.
    pub(crate) shrink_claim: String,
    /// `?` spool, `?` token: a claim left with no rows.
    pub(crate) drop_claim: String,
    /// As `shrink_claim`, if the claim holds the rows of `?` seqs (JSON, as written)
    /// and no others; [`SETTLED`] records whether it did.
    pub(crate) shrink_claim_if: String,
    /// As `drop_claim`, if the claim holds the rows of `?` seqs (JSON, as written) and no
    /// others; [`SETTLED`] records whether it did.
    pub(crate) drop_claim_if: String,
    /// `{list}` seqs, `[scope]`: marks rows published.
    pub(crate) done: String,
    /// `{list}` seqs, `[scope]`: deletes rows published.
    pub(crate) delete_done: String,
    /// As `done`, if [`SETTLED`] recorded that the claim was changed.
    pub(crate) done_if_settled: String,
    /// As `delete_done`, if [`SETTLED`] recorded that the claim was changed.
    pub(crate) delete_done_if_settled: String,
    /// `?` failures (`[[seq, op, delay_ms, error], ...]`, ops retry and dead),
    /// `[scope]`.
    pub(crate) fail: String,
    /// `[scope]`, `?` age ms, `?` limit.
    pub(crate) purge: String,
}

impl SpoolSql {
    pub(crate) fn build(layout: &Layout) -> Self {
        let table = layout.table;
        let scope_t = scope(layout, "t.");
        let scope = scope(layout, "");
        let pending = format!("{scope}status = {PENDING}");
        Self {
            table,
            scoped: layout.scope.is_some(),
            lock: "INSERT INTO oncebox_claim_locks (name) VALUES (?) \
                   ON DUPLICATE KEY UPDATE name = name"
                .to_owned(),
            claims: format!(
                "SELECT token, lease_until, seqs, {NOW_MS} AS now_ms
FROM oncebox_claims WHERE spool = ?"
            ),
            drop_ended: format!(
                "DELETE FROM oncebox_claims
WHERE spool = ? AND token = ? AND lease_until <= {NOW_MS}"
            ),
            window: window(layout, ""),
            window_skipping: window(layout, &format!(" AND t.seq NOT IN ({LIST})")),
            lock_rows: format!(
                "SELECT t.seq, t.attempts, {item}
FROM {table} AS t
WHERE t.seq IN ({LIST}) AND {scope_t}t.status = {PENDING} AND t.available_at <= ?
FOR UPDATE SKIP LOCKED",
                item = layout.item,
            ),
            record_claim: "INSERT INTO oncebox_claims (spool, token, lease_until, seqs)
VALUES (?, ?, ?, ?)
ON DUPLICATE KEY UPDATE
  lease_until = VALUES(lease_until), seqs = JSON_MERGE_PRESERVE(seqs, VALUES(seqs))"
                .to_owned(),
            lock_taken: format!(
                "SELECT COUNT(*) INTO @oncebox_locked
FROM {table}
WHERE ({SEQ_RUNS}) AND status = {PENDING}
FOR UPDATE SKIP LOCKED"
            ),
            record_claim_if_locked: "INSERT INTO oncebox_claims (spool, token, lease_until, seqs)
SELECT ?, ?, ?, ? FROM DUAL WHERE @oncebox_locked = ?
ON DUPLICATE KEY UPDATE
  lease_until = VALUES(lease_until), seqs = JSON_MERGE_PRESERVE(seqs, VALUES(seqs))"
                .to_owned(),
            next_head: format!(
                "SELECT t.seq, t.`key` AS k, t.available_at
FROM {table} AS t
WHERE {scope_t}t.status = {PENDING} AND t.`key` >= ?
ORDER BY t.`key`, t.seq
LIMIT 1"
            ),
            key_rows: format!(
                "SELECT t.seq, t.`key` AS k, t.available_at
FROM {table} AS t
WHERE {scope_t}t.status = {PENDING} AND t.`key` = ? AND t.seq >= ?
ORDER BY t.seq
LIMIT ?"
            ),
            unkeyed: format!(
                "SELECT t.seq, t.`key` AS k, t.available_at
FROM {table} AS t
WHERE {scope_t}t.status = {PENDING} AND t.`key` IS NULL AND t.available_at <= ?
ORDER BY t.seq
LIMIT ?"
            ),
            held: "SELECT seqs FROM oncebox_claims WHERE spool = ? AND token = ? FOR UPDATE"
                .to_owned(),
            holds: "SELECT seqs FROM oncebox_claims WHERE spool = ? AND token = ? \
                    LOCK IN SHARE MODE"
                .to_owned(),
            shrink_claim: "UPDATE oncebox_claims SET seqs = ? WHERE spool = ? AND token = ?"
                .to_owned(),
            drop_claim: "DELETE FROM oncebox_claims WHERE spool = ? AND token = ?".to_owned(),
            shrink_claim_if: "UPDATE oncebox_claims SET seqs = ?
WHERE spool = ? AND token = ? AND seqs = ?"
                .to_owned(),
            drop_claim_if: "DELETE FROM oncebox_claims WHERE spool = ? AND token = ? AND seqs = ?"
                .to_owned(),
            done: format!(
                "UPDATE {table} SET status = {DONE}, done_at = {NOW_MS}
WHERE seq IN ({LIST}) AND {pending}"
            ),
            delete_done: format!("DELETE FROM {table} WHERE seq IN ({LIST}) AND {pending}"),
            done_if_settled: format!(
                "UPDATE {table} SET status = {DONE}, done_at = {NOW_MS}
WHERE seq IN ({LIST}) AND {pending} AND @oncebox_settled > 0"
            ),
            delete_done_if_settled: format!(
                "DELETE FROM {table} WHERE seq IN ({LIST}) AND {pending} AND @oncebox_settled > 0"
            ),
            fail: fail(layout),
            purge: format!(
                "DELETE FROM {table}
WHERE {scope}status = {DONE} AND done_at < {NOW_MS} - ?
ORDER BY done_at
LIMIT ?"
            ),
        }
    }

    /// The statement on the rows published: marks them done, or deletes them with
    /// `delete_done`; with `if_settled`, only if [`SETTLED`] recorded a changed claim.
    pub(crate) fn published(&self, delete_done: bool, if_settled: bool) -> &str {
        match (delete_done, if_settled) {
            (false, false) => &self.done,
            (true, false) => &self.delete_done,
            (false, true) => &self.done_if_settled,
            (true, true) => &self.delete_done_if_settled,
        }
    }
}

/// Step 1's read of the first pending rows, in full, with `skip` added to its condition.
///
/// The `(status, seq)` index does not hold the key and the due time, so each row read
/// costs a primary-key lookup anyway: reading the item there too is what spares the
/// claim a second read of the rows it picks. A `seq NOT IN` in `skip` is decided on the
/// index entry, before that lookup.
fn window(layout: &Layout, skip: &str) -> String {
    format!(
        "SELECT t.seq, t.`key` AS k, t.available_at, {NOW_MS} AS now_ms,
       t.attempts, {item}
FROM {table} AS t
WHERE {scope_t}t.status = {PENDING}{skip}
ORDER BY t.seq
LIMIT ?",
        item = layout.item,
        table = layout.table,
        scope_t = scope(layout, "t."),
    )
}

/// A condition that holds for exactly the rows `seqs` (distinct), for [`SEQ_RUNS`]:
/// runs of three or more consecutive numbers as `seq BETWEEN first AND last`, the others
/// in one `seq IN (...)`. Integers only, in decimal.
///
/// A claim's rows are mostly runs (a relay alone, or relays taking turns, take the
/// pending rows in order), and a range costs the server less than the same rows listed:
/// locking 256 consecutive rows took about 0.3 ms by range and 0.6 ms by list on
/// MariaDB 10.11 (a loaded 2-core machine).
pub(crate) fn seq_runs(seqs: &[i64]) -> String {
    use std::fmt::Write as _;
    let mut sorted = seqs.to_vec();
    sorted.sort_unstable();
    let mut ranges = String::new();
    let mut singles = Vec::new();
    let mut rest = sorted.as_slice();
    while let Some(&first) = rest.first() {
        let len = 1 + rest
            .windows(2)
            .take_while(|pair| pair[0].checked_add(1) == Some(pair[1]))
            .count();
        if len >= 3 {
            let sep = if ranges.is_empty() { "" } else { " OR " };
            let last = rest[len - 1];
            let _ = write!(ranges, "{sep}seq BETWEEN {first} AND {last}");
        } else {
            singles.extend_from_slice(&rest[..len]);
        }
        rest = &rest[len..];
    }
    if singles.is_empty() {
        return ranges;
    }
    let sep = if ranges.is_empty() { "" } else { " OR " };
    let _ = write!(ranges, "{sep}seq IN (");
    for (n, seq) in singles.iter().enumerate() {
        let _ = write!(ranges, "{}{seq}", if n == 0 { "" } else { "," });
    }
    ranges.push(')');
    ranges
}

/// `alias.scope = ? AND `, or nothing for an unscoped table.
fn scope(layout: &Layout, alias: &str) -> String {
    match layout.scope {
        Some(column) => format!("{alias}{column} = ? AND "),
        None => String::new(),
    }
}

/// The failed rows of a claim (retried or dead) in one statement, each with its own
/// delay and error: a `JSON_TABLE` of the
/// failures joined to the table.
///
/// The join order and the index are forced: on a small table the optimizer would rather
/// read the whole table for each failure, and an `UPDATE` that reads a row waits for its
/// lock, even a row it does not change (one another relay is settling, say). Each
/// assignment reads only its own column's old value and the failure's: the order in
/// which MySQL applies the assignments of a multiple-table `UPDATE` is not defined.
fn fail(layout: &Layout) -> String {
    format!(
        "UPDATE JSON_TABLE(?, '$[*]' COLUMNS (
    seq BIGINT PATH '$[0]', op TINYINT PATH '$[1]',
    delay_ms BIGINT PATH '$[2]', error TEXT PATH '$[3]')) AS s
  STRAIGHT_JOIN {table} AS t FORCE INDEX (PRIMARY) ON t.seq = s.seq
SET t.status = IF(s.op = {OP_DEAD}, {DEAD}, {PENDING}),
    t.attempts = t.attempts + 1,
    t.available_at = IF(s.op = {OP_RETRY}, {NOW_MS} + s.delay_ms, t.available_at),
    t.last_error = s.error,
    t.dead_at = IF(s.op = {OP_DEAD}, {NOW_MS}, t.dead_at)
WHERE {scope_t}t.status = {PENDING}",
        table = layout.table,
        scope_t = scope(layout, "t."),
    )
}

#[cfg(test)]
mod tests {
    use super::seq_runs;

    #[test]
    fn runs_of_three_or_more_become_ranges() {
        assert_eq!(seq_runs(&[1, 2, 3, 4]), "seq BETWEEN 1 AND 4");
        assert_eq!(
            seq_runs(&[8, 1, 2, 3, 5, 6, 10, 11, 12, 20]),
            "seq BETWEEN 1 AND 3 OR seq BETWEEN 10 AND 12 OR seq IN (5,6,8,20)"
        );
        assert_eq!(seq_runs(&[7]), "seq IN (7)");
        assert_eq!(seq_runs(&[-2, 4]), "seq IN (-2,4)");
        assert_eq!(
            seq_runs(&[i64::MAX - 2, i64::MAX - 1, i64::MAX]),
            format!("seq BETWEEN {} AND {}", i64::MAX - 2, i64::MAX)
        );
    }
}
