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

pub(super) static SPOOL: SpoolSql = SpoolSql {
    table: TABLE,
    candidates: concat!(
        "\
SELECT json_group_array(seq), count(*) FROM (
SELECT o.seq FROM oncebox_outbox AS o
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
LIMIT ?2)"
    ),
    claim: concat!(
        "\
INSERT INTO oncebox_outbox_claims (token, claimed_at, until, seqs)
SELECT ?3, ?1, ?2, json_group_array(seq) FROM (
  SELECT o.seq FROM oncebox_outbox AS o
  WHERE o.seq IN (SELECT value FROM json_each(?4))
    AND o.status = 'pending'
    AND o.available_at <= ?1
    AND o.seq NOT IN (",
        live_claimed!(),
        ")
    AND (o.key IS NULL OR NOT EXISTS (
        SELECT 1 FROM oncebox_outbox AS p
        WHERE p.status = 'pending' AND p.key = o.key AND p.seq < o.seq
          AND (p.available_at > ?1 OR p.seq IN (",
        live_claimed!(),
        ")
               OR p.seq NOT IN (SELECT value FROM json_each(?4)))))
  ORDER BY o.seq)
",
        claim_returning_seqs!()
    ),
    rows: "\
SELECT seq, attempts, id, topic, key, kind, headers, CAST(payload AS BLOB) AS payload, created_at
FROM oncebox_outbox WHERE seq IN (SELECT value FROM json_each(?1))",
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

pub(super) const COUNT_PENDING: &str =
    "SELECT COUNT(*) FROM oncebox_outbox WHERE status = 'pending'";
pub(super) const COUNT_DONE: &str = "SELECT COUNT(*) FROM oncebox_outbox WHERE status = 'done'";
pub(super) const COUNT_DEAD: &str = "SELECT COUNT(*) FROM oncebox_outbox WHERE status = 'dead'";
pub(super) const OLDEST_PENDING: &str = "\
SELECT created_at FROM oncebox_outbox INDEXED BY oncebox_outbox_pending
WHERE status = 'pending' ORDER BY seq LIMIT 1";

pub(super) const DEAD_LETTERS: &str = "\
SELECT seq, attempts, id, topic, key, kind, headers, CAST(payload AS BLOB) AS payload, created_at,
       last_error, dead_at
FROM oncebox_outbox WHERE status = 'dead' ORDER BY seq LIMIT ?1";

pub(super) const REPLAY_DEAD: &str = "\
UPDATE oncebox_outbox SET status = 'pending', attempts = 0, available_at = ?2, dead_at = NULL
WHERE id = ?1 AND status = 'dead'";

pub(super) const STATUS: &str = "\
SELECT seq, status, attempts, available_at, last_error, done_at, dead_at,
       (SELECT max(c.until) FROM oncebox_outbox_claims AS c, json_each(c.seqs) AS j
        WHERE j.value = o.seq) AS lease_until
FROM oncebox_outbox AS o WHERE id = ?1";

#[cfg(test)]
mod tests {
    use sqlx::Row;

    use super::*;
    use crate::SqliteStore;

    async fn plan(store: &SqliteStore, sql: &'static str) -> Vec<String> {
        let explain: &'static str = format!("EXPLAIN QUERY PLAN {sql}").leak();
        sqlx::query(explain)
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

    /// Runs the claim step alone with `candidates`, as if they had been read earlier;
    /// returns the rows the claim holds.
    async fn claim_step(store: &SqliteStore, candidates: &str) -> Vec<i64> {
        let now = oncebox_core::time::to_unix_millis(std::time::SystemTime::now());
        let held: Option<String> = sqlx::query_scalar(SPOOL.claim)
            .bind(now)
            .bind(now + 60_000)
            .bind(oncebox_core::spool::LeaseToken::new().to_string())
            .bind(candidates)
            .fetch_optional(store.pool())
            .await
            .unwrap();
        let Some(held) = held else {
            return Vec::new();
        };
        let mut seqs: Vec<i64> = sqlx::query_scalar("SELECT value FROM json_each(?1)")
            .bind(held)
            .fetch_all(store.pool())
            .await
            .unwrap();
        seqs.sort_unstable();
        seqs
    }

    async fn insert(store: &SqliteStore, key: &str, status: &str) -> i64 {
        let id = oncebox_core::MessageId::new().to_string();
        sqlx::query(
            "INSERT INTO oncebox_outbox (id, topic, key, payload, created_at, available_at, status)
             VALUES (?1, 't', ?2, x'', 0, 0, ?3) RETURNING seq",
        )
        .bind(id)
        .bind(key.to_owned())
        .bind(status.to_owned())
        .fetch_one(store.pool())
        .await
        .unwrap()
        .get("seq")
    }

    /// Candidates read before another claim took an earlier row of their key are not
    /// claimed: the key would be held by two claims.
    #[tokio::test]
    async fn claim_step_skips_keys_claimed_since_the_candidates_were_read() {
        let (store, _dir) = store().await;
        let k1 = insert(&store, "k", "pending").await;
        let k2 = insert(&store, "k", "pending").await;
        let other = insert(&store, "j", "pending").await;
        let stale = format!("[{k1},{k2},{other}]");
        assert_eq!(
            claim_step(&store, &format!("[{k1}]")).await,
            [k1],
            "another claim takes k1"
        );
        assert_eq!(
            claim_step(&store, &stale).await,
            [other],
            "k2 waits for k1; j goes"
        );
    }

    /// A row that became pending again (a replayed dead letter) after the candidates
    /// were read blocks the later candidates of its key.
    #[tokio::test]
    async fn claim_step_keeps_keys_a_prefix_when_an_earlier_row_reappears() {
        let (store, _dir) = store().await;
        let k1 = insert(&store, "k", "dead").await;
        let k2 = insert(&store, "k", "pending").await;
        sqlx::query("UPDATE oncebox_outbox SET status = 'pending' WHERE seq = ?1")
            .bind(k1)
            .execute(store.pool())
            .await
            .unwrap();
        assert!(claim_step(&store, &format!("[{k2}]")).await.is_empty());
        assert_eq!(claim_step(&store, &format!("[{k1},{k2}]")).await, [k1, k2]);
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
            ("candidates", SPOOL.candidates),
            ("claim", SPOOL.claim),
            ("rows", SPOOL.rows),
            ("done", SPOOL.done),
            ("unclaim", SPOOL.unclaim),
            ("retry", SPOOL.retry),
            ("purge", SPOOL.purge),
            ("oldest pending", OLDEST_PENDING),
            ("dead letters", DEAD_LETTERS),
        ] {
            let plan = plan(store, sql).await;
            println!("{name}:\n  {}", plan.join("\n  "));
            for step in &plan {
                assert!(!step.contains("TEMP B-TREE"), "{name} sorts: {plan:?}");
                // A scan of a JSON list, of a subquery's own result, or of the claims
                // table (`c`: the live claims, and those ended since the last claim) is
                // fine.
                let scans_table = step.starts_with("SCAN ")
                    && !step.contains("INDEX")
                    && !step.contains("json_each")
                    && !step.starts_with("SCAN (subquery")
                    && step != "SCAN c";
                assert!(!scans_table, "{name} scans the table: {plan:?}");
            }
        }
    }
}
