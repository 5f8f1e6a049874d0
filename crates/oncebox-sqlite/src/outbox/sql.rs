//! The outbox's statements.

use crate::spool::SpoolSql;

pub(super) const TABLE: &str = "oncebox_outbox";

pub(super) const ENQUEUE: &str = "\
INSERT INTO oncebox_outbox (id, topic, key, kind, headers, payload, created_at, available_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

/// The rows held by live claims, for a statement whose `?1` is now.
macro_rules! live_claimed {
    () => {
        "SELECT j.value FROM oncebox_outbox_claims AS c, json_each(c.seqs) AS j WHERE c.until > ?1"
    };
}

/// The rows the claim `?1` holds.
macro_rules! held_by_token {
    () => {
        "SELECT j.value FROM oncebox_outbox_claims AS c, json_each(c.seqs) AS j WHERE c.token = ?1"
    };
}

/// The columns of a claimed row, as `SqliteOutbox`'s `SpoolRow` decodes them, from
/// `oncebox_outbox AS o`.
macro_rules! claimed_columns {
    () => {
        "o.seq, o.attempts, o.id, o.topic, o.key, o.kind, o.headers,
       CAST(o.payload AS BLOB) AS payload, o.created_at"
    };
}

pub(super) static SPOOL: SpoolSql = SpoolSql {
    table: TABLE,
    claim: concat!(
        "\
SELECT ",
        claimed_columns!(),
        "
FROM oncebox_outbox AS o INDEXED BY oncebox_outbox_pending
WHERE o.status = 'pending'
  AND o.available_at <= ?1
  AND o.seq NOT IN (",
        live_claimed!(),
        ")
  AND (o.key IS NULL OR NOT EXISTS (
      SELECT 1 FROM oncebox_outbox AS p
      WHERE p.status = 'pending' AND p.key = o.key AND p.seq < o.seq
        AND (p.available_at > ?1 OR p.seq IN (",
        live_claimed!(),
        "))))
ORDER BY o.seq
LIMIT ?2"
    ),
    record_claim: "\
INSERT INTO oncebox_outbox_claims (token, claimed_at, until, seqs) VALUES (?3, ?1, ?2, ?4)",
    extend: "UPDATE oncebox_outbox_claims SET until = ?2 WHERE token = ?1 AND until > ?3",
    done: concat!(
        "\
UPDATE oncebox_outbox SET status = 'done', done_at = ?3
WHERE seq IN (SELECT value FROM json_each(?2)) AND status = 'pending'
  AND seq IN (",
        held_by_token!(),
        ")"
    ),
    delete_done: Some(concat!(
        "\
DELETE FROM oncebox_outbox
WHERE seq IN (SELECT value FROM json_each(?2)) AND status = 'pending'
  AND seq IN (",
        held_by_token!(),
        ")"
    )),
    retry: concat!(
        "\
UPDATE oncebox_outbox SET attempts = attempts + 1, available_at = ?3, last_error = ?4
WHERE seq = ?2 AND status = 'pending' AND seq IN (",
        held_by_token!(),
        ")"
    ),
    dead: concat!(
        "\
UPDATE oncebox_outbox
SET attempts = attempts + 1, status = 'dead', dead_at = ?3, last_error = ?4
WHERE seq = ?2 AND status = 'pending' AND seq IN (",
        held_by_token!(),
        ")"
    ),
    unclaim: "\
UPDATE oncebox_outbox_claims
SET seqs = (SELECT json_group_array(j.value) FROM json_each(seqs) AS j
            WHERE j.value NOT IN (SELECT value FROM json_each(?2)))
WHERE token = ?1",
    drop_claim: "DELETE FROM oncebox_outbox_claims WHERE token = ?1 AND seqs = '[]'",
    purge: "\
DELETE FROM oncebox_outbox WHERE seq IN (
  SELECT seq FROM oncebox_outbox
  WHERE status = 'done' AND done_at < ?1
  ORDER BY done_at
  LIMIT ?2)",
};

/// `?1` now (ms) → the figures of
/// [`OutboxStatements::counts`](oncebox_sql::OutboxStatements::counts), `done` included.
/// The oldest pending row is the first in commit order that is not scheduled ahead; it
/// has waited since its delivery time if it was scheduled, else since its creation.
/// Both reads of pending rows name the partial index of pending rows: with statistics
/// taken on a table of mostly done rows, the planner scanned the whole table for the
/// scheduled count.
macro_rules! counts {
    ($done:literal) => {
        concat!(
            "SELECT ",
            $done,
            "(SELECT COUNT(*) FROM oncebox_outbox WHERE status = 'pending') AS waiting,
  (SELECT COUNT(*) FROM oncebox_outbox INDEXED BY oncebox_outbox_pending
   WHERE status = 'pending' AND attempts = 0 AND available_at > ?1) AS scheduled,
  (SELECT COUNT(*) FROM oncebox_outbox WHERE status = 'dead') AS dead,
  (SELECT ?1 - CASE WHEN attempts = 0 THEN max(created_at, available_at) ELSE created_at END
   FROM oncebox_outbox INDEXED BY oncebox_outbox_pending
   WHERE status = 'pending' AND NOT (attempts = 0 AND available_at > ?1)
   ORDER BY seq LIMIT 1) AS oldest_pending"
        )
    };
}

/// The figures with the count of published rows.
pub(super) const STATS: &str =
    counts!("(SELECT COUNT(*) FROM oncebox_outbox WHERE status = 'done') AS done, ");
/// The figures without it, which grows with retention: the backlog.
pub(super) const BACKLOG: &str = counts!("");

pub(super) const PURGE_DEAD: &str = "DELETE FROM oncebox_outbox WHERE id = ?1 AND status = 'dead'";

/// `?1` now (ms), `?2` id: deletes the row if it is pending and no live claim holds it.
pub(super) const CANCEL: &str = concat!(
    "\
DELETE FROM oncebox_outbox
WHERE id = ?2 AND status = 'pending' AND seq NOT IN (",
    live_claimed!(),
    ")"
);

/// `?1` id, `?2` now (ms): the dead row back in line, due once no claim holds a pending
/// row of its key any more (the key's latest lease end), so that the key is never on two
/// relays at once.
pub(super) const REPLAY_DEAD: &str = "\
UPDATE oncebox_outbox SET status = 'pending', attempts = 0, dead_at = NULL,
  available_at = max(?2, coalesce((
    SELECT max(c.until)
    FROM oncebox_outbox_claims AS c, json_each(c.seqs) AS j
      JOIN oncebox_outbox AS k ON k.seq = j.value
    WHERE k.key = oncebox_outbox.key AND k.status = 'pending' AND c.until > ?2), ?2))
WHERE id = ?1 AND status = 'dead'";

/// The listing, up to its `WHERE`: a row's state and its message, from
/// `oncebox_outbox AS t`.
pub(super) const LISTING: &str = "\
SELECT t.seq, t.status, t.attempts, t.available_at, t.last_error, t.done_at, t.dead_at,
       (SELECT max(c.until) FROM oncebox_outbox_claims AS c, json_each(c.seqs) AS j
        WHERE j.value = t.seq) AS lease_until,
       t.id, t.topic, t.key, t.kind, t.headers, CAST(t.payload AS BLOB) AS payload,
       t.created_at
FROM oncebox_outbox AS t";

/// `?1` since (ms) → `minute` (minutes since the Unix epoch) and `published`.
pub(super) const PUBLISHED_PER_MINUTE: &str = "\
SELECT done_at / 60000 AS minute, count(*) AS published
FROM oncebox_outbox INDEXED BY oncebox_outbox_done
WHERE status = 'done' AND done_at >= ?1
GROUP BY done_at / 60000 ORDER BY minute";

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use oncebox_testkit::fixtures::claim;
    use sqlx::Row;

    use super::*;
    use crate::SqliteStore;

    async fn plan(store: &SqliteStore, sql: &str) -> Vec<String> {
        sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
            .fetch_all(store.pool())
            .await
            .unwrap()
            .iter()
            .map(|row| row.get::<String, _>("detail"))
            .collect()
    }

    async fn store() -> (SqliteStore, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::connect(dir.path().join("claim.db"))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        (store, dir)
    }

    async fn insert(store: &SqliteStore, key: Option<&str>, available_at: i64) -> i64 {
        let id = oncebox_core::MessageId::new().to_string();
        sqlx::query(
            "INSERT INTO oncebox_outbox (id, topic, key, payload, created_at, available_at)
             VALUES (?1, 't', ?2, x'', 0, ?3) RETURNING seq",
        )
        .bind(id)
        .bind(key.map(str::to_owned))
        .bind(available_at)
        .fetch_one(store.pool())
        .await
        .unwrap()
        .get("seq")
    }

    /// The claim walks over the rows queued behind a blocked key to the claimable rows
    /// beyond them.
    #[tokio::test]
    async fn a_claim_walks_over_rows_behind_a_blocked_key() {
        let (store, _dir) = store().await;
        insert(&store, Some("k"), i64::MAX / 2).await;
        for _ in 0..40 {
            insert(&store, Some("k"), 0).await;
        }
        let j1 = insert(&store, Some("j"), 0).await;
        let j2 = insert(&store, Some("j"), 0).await;
        let (_, rows) = claim(&store.outbox(), 10, Duration::from_secs(60)).await;
        let seqs: Vec<i64> = rows.iter().map(|row| row.seq).collect();
        assert_eq!(seqs, [j1, j2]);
    }

    /// The claim and the settlements walk indexes, never the table, and never sort: on a
    /// new database, and with statistics taken while a backlog was pending (`ANALYZE`, or
    /// `PRAGMA optimize`), which made the planner read the oldest pending row in the
    /// table's own `seq` order, over every done row kept for retention.
    #[tokio::test]
    async fn spool_statements_are_index_driven() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::connect(dir.path().join("plan.db"))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        assert_index_driven(&store).await;
        for sql in [
            "INSERT INTO oncebox_outbox (id, topic, key, payload, created_at, available_at)
             WITH RECURSIVE n (i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 4999)
             SELECT 'id-' || i, 't', 'k' || (i % 50), x'', 0, 0 FROM n",
            "ANALYZE",
            "UPDATE oncebox_outbox SET status = 'done', done_at = 0 WHERE seq <= 4900",
        ] {
            sqlx::query(sql).execute(store.pool()).await.unwrap();
        }
        // New connections, which all read the statistics.
        store.pool().close().await;
        let store = SqliteStore::connect(dir.path().join("plan.db"))
            .await
            .unwrap();
        assert_index_driven(&store).await;
    }

    async fn assert_index_driven(store: &SqliteStore) {
        for (name, sql) in [
            ("claim", SPOOL.claim),
            ("done", SPOOL.done),
            ("unclaim", SPOOL.unclaim),
            ("retry", SPOOL.retry),
            ("purge", SPOOL.purge),
            ("figures", STATS),
            // As `oncebox_sql::SqlOutboxAdmin::dead_letters` builds it, with the index hint
            // of `OutboxStatements::index_hint`.
            (
                "dead letters",
                format!(
                    "{LISTING} INDEXED BY oncebox_outbox_dead \
                     WHERE t.status = 'dead' AND t.seq > ?1 ORDER BY t.seq LIMIT ?2"
                )
                .as_str(),
            ),
        ] {
            let plan = plan(store, sql).await;
            println!("{name}:\n  {}", plan.join("\n  "));
            for step in &plan {
                assert!(!step.contains("TEMP B-TREE"), "{name} sorts: {plan:?}");
                // A scan of a JSON list, of a subquery's own result, of the claims
                // table (`c`: the live claims, and those ended since the last claim) or
                // of the one row of a statement made of subqueries is fine.
                let scans_table = step.starts_with("SCAN ")
                    && !step.contains("INDEX")
                    && !step.contains("json_each")
                    && !step.starts_with("SCAN (subquery")
                    && step != "SCAN c"
                    && step != "SCAN CONSTANT ROW";
                assert!(!scans_table, "{name} scans the table: {plan:?}");
            }
        }
    }
}
