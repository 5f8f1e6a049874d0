//! The statements of a spool table, built once per table from its [`Layout`].

use std::sync::Arc;

use crate::ident::CLAIM_CLASS;
use crate::time::millis_param;

/// Where a spool table's columns are, so that the same statements serve the outbox, the
/// durable inbox and a Debezium-style outbox.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// The table, schema-qualified and quoted.
    pub(crate) table: String,
    /// The table for error messages and logs.
    pub(crate) display: String,
    /// An `int4` expression naming the table in advisory locks (its OID).
    pub(crate) oid: String,
    /// Column names, quoted where needed.
    pub(crate) col: Columns,
    /// The columns the item decoder reads, as `expr AS name` over alias `t`.
    pub(crate) item: String,
    /// A column scoping the rows (the durable inbox's consumer), bound as the last
    /// parameter of every statement.
    pub(crate) scope: Option<&'static str>,
}

/// Column names of the spool bookkeeping.
#[derive(Debug, Clone)]
pub(crate) struct Columns {
    pub(crate) seq: String,
    pub(crate) key: String,
    pub(crate) status: String,
    pub(crate) attempts: String,
    pub(crate) available_at: String,
    pub(crate) lease_token: String,
    pub(crate) lease_until: String,
    pub(crate) last_error: String,
    pub(crate) done_at: String,
    pub(crate) dead_at: String,
}

impl Columns {
    /// The names oncebox's own tables use.
    pub(crate) fn plain() -> Self {
        Self::prefixed("")
    }

    /// The names with a prefix (`oncebox_` in tables of another layout).
    pub(crate) fn prefixed(prefix: &str) -> Self {
        let name = |n: &str| format!("{prefix}{n}");
        Self {
            seq: name("seq"),
            key: "key".to_owned(),
            status: name("status"),
            attempts: name("attempts"),
            available_at: name("available_at"),
            lease_token: name("lease_token"),
            lease_until: name("lease_until"),
            last_error: name("last_error"),
            done_at: name("done_at"),
            dead_at: name("dead_at"),
        }
    }
}

/// Settlement codes in the settle statement's `op` array.
pub(crate) const OP_DONE: i32 = 1;
pub(crate) const OP_RELEASE: i32 = 2;
pub(crate) const OP_RETRY: i32 = 3;
pub(crate) const OP_DEAD: i32 = 4;

/// The statements of one spool table. Shared (`Arc`) by every handle on the table.
pub(crate) struct SpoolSql {
    pub(crate) display: String,
    pub(crate) scoped: bool,
    /// `$1` timeout (ms, as text), `[$2 scope]`: takes the claim lock, sets the
    /// transaction's timeouts, turns JIT off.
    pub(crate) lock: Arc<str>,
    /// `$1` token, `$2` limit, `$3` lease ms, `$4` window, `[$5 scope]` → claimed rows,
    /// `window_full` and `window_used` (window rows up to the last picked one).
    pub(crate) claim_window: Arc<str>,
    /// `$1` token, `$2` limit, `$3` lease ms, `$4` cursor, `$5` keys to scan, `[$6 scope]`
    /// → claimed rows, and `next_cursor`.
    pub(crate) claim_keys: Arc<str>,
    /// `$1` token, `$2` seqs, `$3` ops, `$4` retry delays ms, `$5` errors, `[$6 scope]`.
    pub(crate) settle: Arc<str>,
    /// As `settle`, deleting done rows instead of marking them.
    pub(crate) settle_delete: Arc<str>,
    /// `$1` age ms, `$2` limit, `[$3 scope]`.
    pub(crate) purge: Arc<str>,
    /// `claim_window` and `claim_keys` under `EXPLAIN (ANALYZE, BUFFERS)`.
    pub(crate) explain_window: Arc<str>,
    pub(crate) explain_keys: Arc<str>,
}

impl SpoolSql {
    pub(crate) fn build(layout: &Layout) -> Self {
        let explain = |sql: &str| format!("EXPLAIN (ANALYZE, BUFFERS) {sql}").into();
        Self {
            display: layout.display.clone(),
            scoped: layout.scope.is_some(),
            lock: lock(layout).into(),
            explain_window: explain(&claim_window(layout)),
            explain_keys: explain(&claim_keys(layout)),
            claim_window: claim_window(layout).into(),
            claim_keys: claim_keys(layout).into(),
            settle: settle(layout, false).into(),
            settle_delete: settle(layout, true).into(),
            purge: purge(layout).into(),
        }
    }
}

/// ` AND alias.scope = $n`, or nothing for an unscoped table.
fn scope(layout: &Layout, alias: &str, param: usize) -> String {
    match layout.scope {
        Some(column) => format!(" AND {alias}.{column} = ${param}"),
        None => String::new(),
    }
}

/// The claim lock: one per table (and scope), held to the end of the claim transaction.
pub(crate) fn lock_key(layout: &Layout, scope_param: usize) -> String {
    match layout.scope {
        Some(_) => format!("hashtext(${scope_param}) # {}", layout.oid),
        None => layout.oid.clone(),
    }
}

/// The claim lock, and settings local to the claim transaction: no JIT (its compile time
/// dwarfs these statements), no wait for the WAL flush at commit (see
/// [`NO_SYNC_COMMIT`]), and statement and idle-in-transaction timeouts of the lease, so
/// that a claim that cannot finish within its lease (a lost client, a runaway plan) fails
/// instead of holding the lock that every relay of the table waits for.
fn lock(layout: &Layout) -> String {
    format!(
        "SELECT pg_advisory_xact_lock({CLAIM_CLASS}, {key}),
       set_config('jit', 'off', true),
       {NO_SYNC_COMMIT},
       set_config('statement_timeout', $1, true),
       set_config('idle_in_transaction_session_timeout', $1, true)",
        key = lock_key(layout, 2)
    )
}

/// Turns `synchronous_commit` off for the rest of the transaction: its commit returns
/// without waiting for the WAL flush. Used by the relay's bookkeeping (claims and
/// settlements), never by enqueue. A crash can lose the last such commits (at most
/// `wal_writer_delay` × 3 of them), never corrupt anything; and losing them is harmless:
/// a lost lease makes rows claimable again at once, a lost settlement leaves rows pending
/// under a lease that expires, and they are claimed and published again. That is at least
/// once, which holds anyway (consumers deduplicate); fencing and per-key order are
/// decided inside the transaction and do not depend on its durability. A settlement is
/// only made after the broker confirmed, so no message is lost. The producer's enqueue,
/// the one write whose loss would lose a message, keeps the server's setting.
pub(crate) const NO_SYNC_COMMIT: &str = "set_config('synchronous_commit', 'off', true)";

/// `alias` is due and not leased: claimable on its own.
fn free(layout: &Layout, alias: &str) -> String {
    let c = &layout.col;
    format!(
        "{alias}.{available_at} <= statement_timestamp() \
         AND ({alias}.{lease_until} IS NULL OR {alias}.{lease_until} <= statement_timestamp())",
        available_at = c.available_at,
        lease_until = c.lease_until,
    )
}

/// Marks the locked rows that keep every key a prefix, leases them and returns them.
///
/// `locked` holds the rows this statement locked (`seq`, `k`, `tid`), `scope_rows` the
/// rows whose keys must stay prefixes (`seq`, `k`): a locked row is leased only if no row
/// of its key in `scope_rows` that comes before it went unlocked (skipped because another
/// transaction holds it, or dropped on recheck). `scope_rows` must hold, for each key,
/// every row that comes before a row the statement tried to lock; rows after them do not
/// change the outcome. The update finds each locked row by the `ctid` the lock returned
/// (a TID scan, no index descent), checked against its `seq`.
fn lease_and_return(layout: &Layout, scope_rows: &str) -> String {
    let c = &layout.col;
    format!(
        "gaps AS (
  SELECT r.k, min(r.seq) AS first_gap FROM {scope_rows} AS r
  WHERE r.k IS NOT NULL AND r.seq NOT IN (SELECT l.seq FROM locked AS l)
  GROUP BY r.k
),
claimed AS (
  UPDATE {table} AS t
  SET {lease_token} = $1::uuid, {lease_until} = statement_timestamp() + {lease}
  FROM locked AS l LEFT JOIN gaps AS g ON g.k = l.k
  WHERE t.ctid = l.tid AND t.{seq} = l.seq AND (l.k IS NULL OR g.first_gap IS NULL OR l.seq < g.first_gap)
  RETURNING t.{seq} AS seq, t.{attempts} AS attempts, {item}
)",
        table = layout.table,
        seq = c.seq,
        attempts = c.attempts,
        lease_token = c.lease_token,
        lease_until = c.lease_until,
        lease = millis_param(3),
        item = layout.item,
    )
}

/// Claim, step 1: the window of the first pending rows in `seq` order.
///
/// Within the window every earlier row of a key is in the window too, so the per-key
/// rule is decided there with one aggregate: a row is picked if it is free, no row of
/// its key in the window is under a live lease, and no earlier row of its key is blocked
/// (not due, or leased). The picked rows are locked `FOR UPDATE SKIP LOCKED`; a key whose
/// earlier row could not be locked keeps only the rows before it.
fn claim_window(layout: &Layout) -> String {
    let c = &layout.col;
    let scope_o = scope(layout, "o", 5);
    format!(
        "WITH win AS MATERIALIZED (
  SELECT o.{seq} AS seq, o.{key} AS k,
         (o.{available_at} > statement_timestamp()
          OR o.{lease_until} > statement_timestamp()) IS TRUE AS blocked,
         (o.{lease_until} > statement_timestamp()) IS TRUE AS held
  FROM {table} AS o
  WHERE o.{status} = 'pending'{scope_o}
  ORDER BY o.{seq}
  LIMIT $4
),
keys AS (
  SELECT w.k, min(w.seq) FILTER (WHERE w.blocked) AS first_blocked, bool_or(w.held) AS held
  FROM win AS w WHERE w.k IS NOT NULL GROUP BY w.k
),
picked AS (
  SELECT w.seq, w.k FROM win AS w LEFT JOIN keys AS ks ON ks.k = w.k
  WHERE NOT w.blocked
    AND (w.k IS NULL
         OR (NOT ks.held AND (ks.first_blocked IS NULL OR w.seq < ks.first_blocked)))
  ORDER BY w.seq
  LIMIT $2
),
locked AS (
  SELECT o.{seq} AS seq, o.{key} AS k, o.ctid AS tid FROM {table} AS o
  WHERE o.{seq} IN (SELECT p.seq FROM picked AS p)
    AND o.{status} = 'pending'{scope_o} AND {free_o}
  FOR UPDATE OF o SKIP LOCKED
),
{lease}
SELECT c.*, f.window_full, f.window_used
FROM (SELECT count(*) >= $4 AS window_full,
             count(*) FILTER (WHERE w.seq <= (SELECT max(p.seq) FROM picked AS p)) AS window_used
      FROM win AS w) AS f
LEFT JOIN claimed AS c ON true",
        table = layout.table,
        seq = c.seq,
        key = c.key,
        status = c.status,
        available_at = c.available_at,
        lease_until = c.lease_until,
        free_o = free(layout, "o"),
        // A key's picked rows are its first rows in the window (all of them before its
        // first blocked row, cut by the limit), and its rows before the window's first
        // are not pending: so the picked rows hold every row before a picked one.
        lease = lease_and_return(layout, "picked"),
    )
}

/// The pending key index's columns over `alias`: `[scope, ]key, seq`.
///
/// Step 2 reads a key's rows as "the next rows of the key index from the key's first
/// row" (a row comparison on these columns, ordered by them, limited), and drops rows of
/// the following keys afterwards. Written as `key = f.k ORDER BY seq` instead, the
/// planner may walk the pending index in `seq` order filtering on the key whenever it
/// believes keys are few and long: fast for the long keys, ruinous (a walk of the whole
/// backlog per key) for the short keys behind them. Only the key index can serve the
/// row comparison in order.
fn key_order(layout: &Layout, alias: &str) -> String {
    let c = &layout.col;
    match layout.scope {
        Some(scope) => format!("{alias}.{scope}, {alias}.{}, {alias}.{}", c.key, c.seq),
        None => format!("{alias}.{}, {alias}.{}", c.key, c.seq),
    }
}

/// Claim, step 2, when step 1's window held only blocked rows: keys found one index probe
/// each (a loose scan of the pending key index, from a cursor that moves on every call),
/// whose head row is free, oldest head first; each contributes its free prefix (a fair
/// share of the limit); unordered rows come from their own index.
fn claim_keys(layout: &Layout) -> String {
    let c = &layout.col;
    let scope_o = scope(layout, "o", 6);
    let scope_x = scope(layout, "x", 6);
    format!(
        "WITH RECURSIVE heads(k, seq, n) AS (
  (SELECT o.{key}, o.{seq}, 1 FROM {table} AS o
   WHERE o.{status} = 'pending' AND o.{key} IS NOT NULL AND o.{key} >= $4{scope_o}
   ORDER BY o.{key}, o.{seq} LIMIT 1)
  UNION ALL
  SELECT nx.k, nx.seq, h.n + 1 FROM heads AS h
  CROSS JOIN LATERAL (
    SELECT o.{key} AS k, o.{seq} AS seq FROM {table} AS o
    WHERE o.{status} = 'pending' AND o.{key} IS NOT NULL AND o.{key} > h.k{scope_o}
    ORDER BY o.{key}, o.{seq} LIMIT 1) AS nx
  WHERE h.n <= $5
),
free_heads AS (
  SELECT h.k, h.seq FROM heads AS h JOIN {table} AS o ON o.{seq} = h.seq
  WHERE h.n <= $5 AND o.{status} = 'pending' AND {free_o}
  ORDER BY h.seq
  LIMIT $2
),
runs AS (
  SELECT r.seq, r.k, r.ok FROM free_heads AS f
  CROSS JOIN LATERAL (
    SELECT s.seq, s.k, bool_and(s.free) OVER (ORDER BY s.seq) AS ok
    FROM (
      SELECT x.{seq} AS seq, x.{key} AS k, {free_x} AS free
      FROM {table} AS x
      WHERE x.{status} = 'pending'{scope_x} AND x.{key} IS NOT NULL
        AND ({key_order_x}) >= ({key_from_f})
      ORDER BY {key_order_x}
      LIMIT (SELECT ($2 + count(*) - 1) / greatest(count(*), 1) FROM free_heads)) AS s
    WHERE s.k = f.k) AS r
),
unkeyed AS (
  SELECT o.{seq} AS seq, NULL::text AS k, true AS ok FROM {table} AS o
  WHERE o.{status} = 'pending' AND o.{key} IS NULL{scope_o} AND {free_o}
  ORDER BY o.{seq}
  LIMIT $2
),
picked AS (
  SELECT u.seq FROM (SELECT * FROM runs UNION ALL SELECT * FROM unkeyed) AS u
  WHERE u.ok
  ORDER BY u.seq
  LIMIT $2
),
locked AS (
  SELECT o.{seq} AS seq, o.{key} AS k, o.ctid AS tid FROM {table} AS o
  WHERE o.{seq} IN (SELECT p.seq FROM picked AS p)
    AND o.{status} = 'pending'{scope_o} AND {free_o}
  FOR UPDATE OF o SKIP LOCKED
),
{lease}
SELECT c.*, nc.next_cursor
FROM (SELECT (SELECT h.k FROM heads AS h WHERE h.n = $5 + 1) AS next_cursor) AS nc
LEFT JOIN claimed AS c ON true",
        table = layout.table,
        seq = c.seq,
        key = c.key,
        status = c.status,
        free_o = free(layout, "o"),
        free_x = free(layout, "x"),
        key_order_x = key_order(layout, "x"),
        key_from_f = match layout.scope {
            Some(_) => "$6, f.k, f.seq",
            None => "f.k, f.seq",
        },
        lease = lease_and_return(layout, "runs"),
    )
}

/// All settlements of a claim in one statement, each row filtered by the claim's token.
fn settle(layout: &Layout, delete_done: bool) -> String {
    let c = &layout.col;
    let scope_t = scope(layout, "t", 6);
    let owned = |alias: &str| {
        format!(
            "{alias}.{lease_token} = $1::uuid AND {alias}.{status} = 'pending'{scope}",
            lease_token = c.lease_token,
            status = c.status,
            scope = scope(layout, alias, 6),
        )
    };
    let (with_delete, skip_done) = if delete_done {
        (
            format!(
                "gone AS (
  DELETE FROM {table} AS d USING s
  WHERE d.{seq} = s.seq AND s.op = {OP_DONE} AND {owned_d}
),
",
                table = layout.table,
                seq = c.seq,
                owned_d = owned("d"),
            ),
            format!(" AND s.op <> {OP_DONE}"),
        )
    } else {
        (String::new(), String::new())
    };
    format!(
        "WITH s AS (
  SELECT * FROM unnest($2::bigint[], $3::int4[], $4::int8[], $5::text[])
    AS u(seq, op, delay_ms, error)
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
  WHERE t.{seq} = s.seq{skip_done} AND t.{lease_token} = $1::uuid AND t.{status} = 'pending'{scope_t}
  RETURNING 1
)
SELECT count(*), {NO_SYNC_COMMIT} FROM upd",
        table = layout.table,
        seq = c.seq,
        status = c.status,
        attempts = c.attempts,
        available_at = c.available_at,
        last_error = c.last_error,
        done_at = c.done_at,
        dead_at = c.dead_at,
        lease_token = c.lease_token,
        lease_until = c.lease_until,
    )
}

/// Deletes at most `$2` done rows settled more than `$1` ms ago, oldest first, on the
/// partial index of done rows.
fn purge(layout: &Layout) -> String {
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

impl std::fmt::Debug for SpoolSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpoolSql")
            .field("table", &self.display)
            .finish_non_exhaustive()
    }
}
