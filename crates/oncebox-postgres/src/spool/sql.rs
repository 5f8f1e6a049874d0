//! The statements of a spool table, built once per table from its [`Layout`].

use std::sync::Arc;

use crate::ident::{CLAIM_CLASS, HOLD_CLASS};
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

/// How a claim keeps other claims off its rows until they are settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// The claim writes a lease (its token and end) into its rows and commits at once;
    /// settlements are filtered by the token. Works for every table, and with work done
    /// in other transactions (the durable inbox completes rows in the handler's).
    Lease,
    /// The claim locks its rows in a transaction that stays open until their
    /// settlements commit in it: nothing is written at claim time. Unscoped tables only.
    Transaction,
}

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
    /// `$1` token, `$2` the claim's seqs, `$3` lease ms, `[$4 scope]`: a leased claim's
    /// extension.
    pub(crate) extend: Arc<str>,
    /// `$1` age ms, `$2` limit, `[$3 scope]`.
    pub(crate) purge: Arc<str>,
    /// `claim_window` and `claim_keys` under `EXPLAIN (ANALYZE, BUFFERS)`.
    pub(crate) explain_window: Arc<str>,
    pub(crate) explain_keys: Arc<str>,
    /// The statements of held claims ([`Hold::Transaction`]); `None` for a scoped table.
    pub(crate) held: Option<HeldSql>,
}

/// What [`HeldSql::begin`] does first with the transaction open on the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Previous {
    /// Nothing: the connection is fresh from the pool.
    None,
    /// Commits it.
    Commit,
    /// Rolls it back.
    Rollback,
}

/// The statements of held claims: the same claim, without the lease update, locking by
/// `ctid` and returning each row's `ctid`; settlements found by `ctid`, without the token
/// filter (the claim's transaction holds the rows).
pub(crate) struct HeldSql {
    /// The claim lock's key (an expression of the table's OID).
    lock_key: String,
    /// The fast claim with a mark for its limit; see [`HeldSql::claim_first`].
    claim_first: String,
    /// Step 1 with marks for its limit and window; see [`HeldSql::claim_window`].
    claim_window: String,
    /// `$1` limit, `$2` cursor, `$3` keys to scan → claimed (locked) rows, `next_cursor`.
    pub(crate) claim_keys: Arc<str>,
    /// `$1` ctids (text), `$2` seqs, `$3` ops, `$4` retry delays ms, `$5` errors.
    pub(crate) settle: Arc<str>,
    /// As `settle`, deleting done rows instead of marking them.
    pub(crate) settle_delete: Arc<str>,
    /// Every row done, the places written in: marked, and deleted.
    done_inline: (String, String),
    delete_inline: (String, String),
    /// `claim_first`, `claim_window` and `claim_keys` under `EXPLAIN (ANALYZE, BUFFERS)`.
    explain_first: String,
    explain_window: String,
    pub(crate) explain_keys: Arc<str>,
}

impl HeldSql {
    /// The fast claim of `limit` rows: `[]` → claimed (locked) rows and `blocked`. See
    /// [`claim_first`]. The limit is written in, as in
    /// [`claim_window`](Self::claim_window).
    pub(crate) fn claim_first(&self, limit: i64) -> String {
        fill(&self.claim_first, limit, 0)
    }

    /// [`claim_first`](Self::claim_first) under `EXPLAIN (ANALYZE, BUFFERS)`.
    pub(crate) fn explain_first(&self, limit: i64) -> String {
        fill(&self.explain_first, limit, 0)
    }

    /// Step 1 for `limit` rows from a window of `window`: `[]` → claimed (locked) rows,
    /// `window_full`, `window_used`.
    ///
    /// The two numbers are written into the statement instead of bound: a statement
    /// without parameters gets one plan per connection, kept and reused, where the same
    /// statement with parameters was planned again at every claim (PostgreSQL found no
    /// generic plan as cheap as a custom one), which cost about a millisecond of a
    /// claim's three. Each (limit, window) pair is one more prepared statement per
    /// connection, so the caller keeps the pairs few (the window in steps of
    /// [`WINDOW_STEP`](super::WINDOW_STEP) rows).
    pub(crate) fn claim_window(&self, limit: i64, window: i64) -> String {
        fill(&self.claim_window, limit, window)
    }

    /// [`claim_window`](Self::claim_window) under `EXPLAIN (ANALYZE, BUFFERS)`.
    pub(crate) fn explain_window(&self, limit: i64, window: i64) -> String {
        fill(&self.explain_window, limit, window)
    }

    /// The statement settling a held claim's rows, all delivered, found at `places`
    /// (`ctid`s): deleted with `delete_done`, else marked done. `None` without rows.
    pub(crate) fn settle_done(
        &self,
        delete_done: bool,
        places: impl IntoIterator<Item = impl std::fmt::Display>,
    ) -> Option<String> {
        let (prefix, suffix) = if delete_done {
            &self.delete_inline
        } else {
            &self.done_inline
        };
        let mut sql = prefix.clone();
        let mut any = false;
        for place in places {
            if any {
                sql.push(',');
            }
            any = true;
            sql.push_str(&format!("\"{place}\""));
        }
        sql.push_str(suffix);
        any.then_some(sql)
    }

    /// The statements that open a held claim's transaction, as one simple query (one
    /// round trip), after ending the previous transaction on the same connection as
    /// `previous` says (a claim's settlements commit; a fast claim that was blocked
    /// rolls back).
    ///
    /// Besides `BEGIN`, they set what [`lock`] sets for a leased claim (no JIT, no wait
    /// for the WAL flush at commit, a statement timeout of `statement_ms`), an
    /// idle-in-transaction timeout of `idle_ms` (the lease: a relay that stops talking
    /// loses its claim and the server frees its rows), and take the hold lock
    /// ([`HOLD_CLASS`]) *shared*: held claims wait neither for each other nor for leased
    /// claims (which take the claim lock, [`CLAIM_CLASS`]), but
    /// [`PgOutbox::replay_dead`], which takes both exclusively, waits for every claim in
    /// flight (see there why).
    ///
    /// Built per call from two integers and names fixed at construction: nothing from
    /// the caller's data.
    ///
    /// [`PgOutbox::replay_dead`]: crate::PgOutbox::replay_dead
    pub(crate) fn begin(&self, previous: Previous, statement_ms: i64, idle_ms: i64) -> String {
        let end = match previous {
            Previous::None => "",
            Previous::Commit => "COMMIT; ",
            Previous::Rollback => "ROLLBACK; ",
        };
        format!(
            "{end}BEGIN; SELECT set_config('jit', 'off', true), {NO_SYNC_COMMIT},
       set_config('statement_timeout', '{statement_ms}', true),
       set_config('idle_in_transaction_session_timeout', '{idle_ms}', true),
       pg_advisory_xact_lock_shared({HOLD_CLASS}, {key})",
            key = self.lock_key,
        )
    }
}

/// `template` with its marks replaced by `limit` and `window`.
fn fill(template: &str, limit: i64, window: i64) -> String {
    template
        .replace(LIMIT_MARK, &limit.to_string())
        .replace(WINDOW_MARK, &window.to_string())
}

impl SpoolSql {
    pub(crate) fn build(layout: &Layout) -> Self {
        let explain = |sql: &str| format!("EXPLAIN (ANALYZE, BUFFERS) {sql}").into();
        let held = layout.scope.is_none().then(|| HeldSql {
            lock_key: lock_key(layout, 0),
            explain_first: format!("EXPLAIN (ANALYZE, BUFFERS) {}", claim_first(layout)),
            claim_first: claim_first(layout),
            explain_window: format!(
                "EXPLAIN (ANALYZE, BUFFERS) {}",
                claim_window(layout, Hold::Transaction)
            ),
            explain_keys: explain(&claim_keys(layout, Hold::Transaction)),
            claim_window: claim_window(layout, Hold::Transaction),
            claim_keys: claim_keys(layout, Hold::Transaction).into(),
            settle: settle(layout, false, Hold::Transaction).into(),
            settle_delete: settle(layout, true, Hold::Transaction).into(),
            done_inline: settle_done_inline(layout, false),
            delete_inline: settle_done_inline(layout, true),
        });
        Self {
            display: layout.display.clone(),
            scoped: layout.scope.is_some(),
            lock: lock(layout).into(),
            explain_window: explain(&claim_window(layout, Hold::Lease)),
            explain_keys: explain(&claim_keys(layout, Hold::Lease)),
            claim_window: claim_window(layout, Hold::Lease).into(),
            claim_keys: claim_keys(layout, Hold::Lease).into(),
            settle: settle(layout, false, Hold::Lease).into(),
            settle_delete: settle(layout, true, Hold::Lease).into(),
            extend: extend(layout).into(),
            purge: purge(layout).into(),
            held,
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

/// Where a claim statement takes a value from: a parameter, or a literal filled in per
/// call (see [`HeldSql::claim_window`]).
#[derive(Clone, Copy, Default)]
enum Arg {
    #[default]
    None,
    Param(usize),
    Literal(&'static str),
}

impl std::fmt::Display for Arg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => Ok(()),
            Self::Param(n) => write!(f, "${n}"),
            Self::Literal(mark) => f.write_str(mark),
        }
    }
}

/// Marks in the held step 1's statement, replaced by numbers per call.
const LIMIT_MARK: &str = "@limit@";
const WINDOW_MARK: &str = "@window@";

/// Where the values of a claim statement come from. They differ between the hold modes,
/// as held claims bind no token, lease or scope, and fill step 1's limits in as literals.
#[derive(Default)]
struct Params {
    token: usize,
    limit: Arg,
    lease: usize,
    /// Step 1: rows in the window.
    window: Arg,
    /// Step 2: the key the scan starts from, and how many keys it probes.
    cursor: Arg,
    scan: Arg,
    scope: usize,
}

impl Params {
    /// Step 1: lease `$1` token, `$2` limit, `$3` lease ms, `$4` window, `[$5 scope]`;
    /// held: no parameters (the limit and the window are literals).
    fn window(hold: Hold) -> Self {
        match hold {
            Hold::Lease => Self {
                token: 1,
                limit: Arg::Param(2),
                lease: 3,
                window: Arg::Param(4),
                scope: 5,
                ..Self::default()
            },
            Hold::Transaction => Self {
                limit: Arg::Literal(LIMIT_MARK),
                window: Arg::Literal(WINDOW_MARK),
                ..Self::default()
            },
        }
    }

    /// Step 2: lease `$1` token, `$2` limit, `$3` lease ms, `$4` cursor, `$5` keys to
    /// scan, `[$6 scope]`; held `$1` limit, `$2` cursor, `$3` keys to scan.
    fn keys(hold: Hold) -> Self {
        match hold {
            Hold::Lease => Self {
                token: 1,
                limit: Arg::Param(2),
                lease: 3,
                cursor: Arg::Param(4),
                scan: Arg::Param(5),
                scope: 6,
                ..Self::default()
            },
            Hold::Transaction => Self {
                limit: Arg::Param(1),
                cursor: Arg::Param(2),
                scan: Arg::Param(3),
                ..Self::default()
            },
        }
    }
}

/// How a claim statement locks its picked rows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Locking {
    /// All picked rows in one pass.
    Picked,
    /// A held claim's step 1: first the first picked row of each key (and the rows
    /// without a key), then the other picked rows of the keys whose first row it locked.
    HeadsFirst,
}

/// Locks the picked rows (`picked`: `seq`, `k`), keeps those that keep every key a
/// prefix, and returns them: the CTEs up to `claimed`.
///
/// `scope_rows` holds the rows whose keys must stay prefixes (`seq`, `k`): a locked row
/// is kept only if no row of its key in `scope_rows` that comes before it went unlocked
/// (skipped because another transaction holds it, dropped on recheck, or locked in a
/// version the statement cannot see: see [`seen`]). `scope_rows` must hold, for each
/// key, every row that comes before a row the statement tried to lock; rows after them
/// do not change the outcome.
///
/// A leased claim then writes its token and lease end into the kept rows, finding each
/// by the `ctid` the lock returned (a TID scan, no index descent), checked against its
/// `seq`, and returns them as updated; the lease frees the rows it locked and did not
/// keep when it commits, at once. A held claim returns the kept rows as locked and
/// writes nothing: the lock, held to the end of its transaction, is the claim. So it
/// must lock little it does not keep, or other claims would find those rows held for as
/// long as it delivers: it locks each key's first row before the key's other rows
/// ([`Locking::HeadsFirst`], or heads locked by the statement before), so that a key
/// held by another claim costs one skipped row, not a locked run behind a gap.
fn lock_and_return(
    layout: &Layout,
    hold: Hold,
    locking: Locking,
    scope_rows: &str,
    p: &Params,
) -> String {
    let c = &layout.col;
    let locked = match hold {
        Hold::Lease => format!(
            "locked AS (
  SELECT o.{seq} AS seq, o.{key} AS k, o.ctid AS tid FROM {table} AS o
  WHERE o.{seq} IN (SELECT p.seq FROM picked AS p)
    AND o.{status} = 'pending'{scope_o} AND {free_o}
  FOR UPDATE OF o SKIP LOCKED
)",
            free_o = free(layout, "o"),
            scope_o = scope(layout, "o", p.scope),
            table = layout.table,
            seq = c.seq,
            key = c.key,
            status = c.status,
        ),
        Hold::Transaction => {
            // `tid` is where the locked row (its newest version) is.
            let lock = |name: &str, rows: &str, limit: &str| {
                format!(
                    "{name} AS (
  SELECT t.{seq} AS seq, t.{key} AS k, t.ctid AS tid
  FROM {table} AS t
  WHERE {rows}
    AND t.{status} = 'pending' AND {free_t}{limit}
  FOR UPDATE OF t SKIP LOCKED
)",
                    free_t = free(layout, "t"),
                    table = layout.table,
                    seq = c.seq,
                    key = c.key,
                    status = c.status,
                )
            };
            match locking {
                Locking::Picked => lock(
                    "locked",
                    &format!("t.{} IN (SELECT p.seq FROM picked AS p)", c.seq),
                    "",
                ),
                // By `ctid` (TID scans, no index descent): `picked` carries where each
                // row was in the window's snapshot. A row changed since cannot be
                // locked there (the newest version is elsewhere), and drops out, as on
                // recheck. `rest_locked` joins `first_locked`, so a key's other rows
                // are locked only after its first row was. Each lock takes the first
                // rows in `seq` order up to the limit, skipping locked ones: the limit
                // counts rows locked (`LockRows` runs below `Limit`), so rows other
                // claims hold do not take the places of free ones.
                Locking::HeadsFirst => format!(
                    "head_rows AS (
  SELECT p.tid FROM picked AS p
  WHERE p.k IS NULL
     OR p.seq IN (SELECT min(q.seq) FROM picked AS q WHERE q.k IS NOT NULL GROUP BY q.k)
),
{first},
{rest},
locked AS (SELECT * FROM first_locked UNION ALL SELECT * FROM rest_locked)",
                    first = lock(
                        "first_locked",
                        "t.ctid = ANY(ARRAY(SELECT h.tid FROM head_rows AS h))",
                        &format!("\n  ORDER BY t.{} LIMIT {}", c.seq, p.limit),
                    ),
                    rest = lock(
                        "rest_locked",
                        "t.ctid = ANY(ARRAY(SELECT p.tid FROM picked AS p \
                         JOIN first_locked AS f ON f.k = p.k WHERE p.seq > f.seq))",
                        &format!(
                            "\n  ORDER BY t.{} LIMIT {} - (SELECT count(*) FROM first_locked)",
                            c.seq, p.limit
                        ),
                    ),
                ),
            }
        }
    };
    let claimed = match hold {
        Hold::Lease => format!(
            "UPDATE {table} AS t
  SET {lease_token} = ${token}::uuid, {lease_until} = statement_timestamp() + {lease}
  FROM seen AS l LEFT JOIN gaps AS g ON g.k = l.k
  WHERE t.ctid = l.tid AND t.{seq} = l.seq AND {KEEPS}
  RETURNING t.{seq} AS seq, t.{attempts} AS attempts, {item}",
            table = layout.table,
            seq = c.seq,
            attempts = c.attempts,
            lease_token = c.lease_token,
            lease_until = c.lease_until,
            token = p.token,
            lease = millis_param(p.lease),
            item = layout.item,
        ),
        // The item is read here, for the kept rows only, at the places locked (a TID
        // scan each): read in the locks, it would be read for every row the locks look
        // at, which is twice as many in step 1 (a row's text conversions cost more than
        // finding it again).
        Hold::Transaction => format!(
            "SELECT l.seq AS seq, l.tid::text AS tid, t.{attempts} AS attempts, {item}
  FROM seen AS l
  JOIN {table} AS t ON t.ctid = l.tid
  LEFT JOIN gaps AS g ON g.k = l.k
  WHERE {KEEPS}",
            table = layout.table,
            attempts = c.attempts,
            item = layout.item,
        ),
    };
    format!(
        "{locked},
{seen},
gaps AS (
  SELECT r.k, min(r.seq) AS first_gap FROM {scope_rows} AS r
  WHERE r.k IS NOT NULL AND r.seq NOT IN (SELECT l.seq FROM seen AS l)
  GROUP BY r.k
),
claimed AS (
  {claimed}
)",
        seen = seen(layout),
    )
}

/// `seen`: the rows of `locked` whose locked version the statement's snapshot sees.
///
/// A row that another transaction updated and committed after the snapshot was taken
/// (a settlement: a retry already due, say) is locked in its newest version, rechecked
/// against the conditions and kept by the lock, but the statement cannot read that
/// version: the claim could not return (or lease) it. Such a row counts as not locked,
/// so the later rows of its key are left out with it (the per-key prefix rule); it
/// stays locked, unclaimed, until the claim's transaction ends.
fn seen(layout: &Layout) -> String {
    format!(
        "seen AS MATERIALIZED (
  SELECT l.seq, l.k, l.tid FROM locked AS l
  JOIN {table} AS v ON v.ctid = l.tid AND v.{seq} = l.seq
)",
        table = layout.table,
        seq = layout.col.seq,
    )
}

/// A locked row `l` is kept: it has no key, or no row of its key went unlocked before it.
const KEEPS: &str = "(l.k IS NULL OR g.first_gap IS NULL OR l.seq < g.first_gap)";

/// A held claim's fast claim: the first free rows in `seq` order, locked
/// `FOR UPDATE SKIP LOCKED` up to the limit (the raw relay loop's claim), and whether any
/// of them is *blocked*: has an earlier pending row of its key that this statement did
/// not lock (held by another claim, not due, leased, or changed since the statement's
/// snapshot). Every such row lies before the last row locked, so one range scan of the
/// pending rows up to it finds them all (`skipped`), and a hash join with the locked
/// rows' keys decides it: cheaper than a probe of the key index per locked row, which
/// also walks the entries the key's deleted rows leave until vacuum. If none is blocked,
/// the locked rows are every key's prefix and the claim is complete: the rows are
/// returned (read at the places locked, as in [`lock_and_return`]). If one is, no row is
/// returned, and the caller rolls the transaction back (it locked rows it must not hold)
/// and claims with step 1 instead.
///
/// With many keys and one relay (or a few) nothing is blocked, and this costs little
/// more than the raw loop's `DELETE ... RETURNING`, where step 1's window with its
/// aggregates costs about half as much again; with hot keys and several relays, most
/// fast claims are blocked, and the caller stops trying them for a while.
fn claim_first(layout: &Layout) -> String {
    let c = &layout.col;
    format!(
        "WITH locked AS (
  SELECT o.{seq} AS seq, o.{key} AS k, o.ctid AS tid FROM {table} AS o
  WHERE o.{status} = 'pending' AND {free_o}
  ORDER BY o.{seq}
  LIMIT {LIMIT_MARK}
  FOR UPDATE OF o SKIP LOCKED
),
{seen},
skipped AS MATERIALIZED (
  SELECT s.{seq} AS seq, s.{key} AS k FROM {table} AS s
  WHERE s.{status} = 'pending' AND s.{seq} < (SELECT max(l.seq) FROM seen AS l)
    AND s.{seq} NOT IN (SELECT l.seq FROM seen AS l)
),
blocked AS MATERIALIZED (
  SELECT EXISTS (
    SELECT FROM skipped AS x JOIN seen AS l ON l.k = x.k AND x.seq < l.seq
  ) AS blocked
)
SELECT l.seq AS seq, l.tid::text AS tid, t.{attempts} AS attempts, {item}, b.blocked
FROM blocked AS b
LEFT JOIN (seen AS l JOIN {table} AS t ON t.ctid = l.tid) ON NOT b.blocked",
        table = layout.table,
        seq = c.seq,
        key = c.key,
        status = c.status,
        attempts = c.attempts,
        free_o = free(layout, "o"),
        item = layout.item,
        seen = seen(layout),
    )
}

/// Claim, step 1: the window of the first pending rows in `seq` order.
///
/// Within the window every earlier row of a key is in the window too, so the per-key
/// rule is decided there with one aggregate: a row is picked if it is free, no row of
/// its key in the window is under a live lease, and no earlier row of its key is blocked
/// (not due, or leased). The picked rows are locked `FOR UPDATE SKIP LOCKED`; a key whose
/// earlier row could not be locked keeps only the rows before it.
///
/// A leased claim picks the first rows by the rule up to its limit and locks them. Rows
/// held by held claims look free in the window (nothing is written into them), so a held
/// claim picks every row the rule allows and locks within its limit instead: first the
/// first picked row of each key (and the rows without a key), in `seq` order, skipping
/// the locked ones, then the keys' later rows; see [`lock_and_return`].
fn claim_window(layout: &Layout, hold: Hold) -> String {
    let c = &layout.col;
    let p = Params::window(hold);
    let scope_o = scope(layout, "o", p.scope);
    let (tid, w_tid, pick_limit, last) = match hold {
        Hold::Lease => (
            "",
            "",
            format!("\n  ORDER BY w.seq\n  LIMIT {}", p.limit),
            "SELECT max(p.seq) FROM picked AS p",
        ),
        // Locked by where the window found them.
        Hold::Transaction => (
            " o.ctid AS tid,",
            ", w.tid",
            String::new(),
            "SELECT max(l.seq) FROM locked AS l",
        ),
    };
    let locking = match hold {
        Hold::Lease => Locking::Picked,
        Hold::Transaction => Locking::HeadsFirst,
    };
    format!(
        "WITH win AS MATERIALIZED (
  SELECT o.{seq} AS seq, o.{key} AS k,{tid}
         (o.{available_at} > statement_timestamp()
          OR o.{lease_until} > statement_timestamp()) IS TRUE AS blocked,
         (o.{lease_until} > statement_timestamp()) IS TRUE AS held
  FROM {table} AS o
  WHERE o.{status} = 'pending'{scope_o}
  ORDER BY o.{seq}
  LIMIT {window}
),
keys AS (
  SELECT w.k, min(w.seq) FILTER (WHERE w.blocked) AS first_blocked, bool_or(w.held) AS held
  FROM win AS w WHERE w.k IS NOT NULL GROUP BY w.k
),
picked AS (
  SELECT w.seq, w.k{w_tid} FROM win AS w LEFT JOIN keys AS ks ON ks.k = w.k
  WHERE NOT w.blocked
    AND (w.k IS NULL
         OR (NOT ks.held AND (ks.first_blocked IS NULL OR w.seq < ks.first_blocked))){pick_limit}
),
{lock}
SELECT c.*, f.window_full, f.window_used
FROM (SELECT count(*) >= {window} AS window_full,
             count(*) FILTER (WHERE w.seq <= ({last})) AS window_used
      FROM win AS w) AS f
LEFT JOIN claimed AS c ON true",
        table = layout.table,
        seq = c.seq,
        key = c.key,
        status = c.status,
        available_at = c.available_at,
        lease_until = c.lease_until,
        window = p.window,
        // A key's picked rows are its first rows in the window (all of them before its
        // first blocked row, cut by the limit), and its rows before the window's first
        // are not pending: so the picked rows hold every row before a picked one.
        lock = lock_and_return(layout, hold, locking, "picked", &p),
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
///
/// A held claim locks the free heads as it picks them (`SKIP LOCKED`, below the
/// limit), so that keys whose heads other held claims lock (which look free: nothing
/// is written into them) neither take the places of free keys nor get their later rows
/// locked; and it picks every head it locked before any other row, so that it claims
/// them all. It may find rows its own step 1 claimed (its own locks do not stop it);
/// the caller drops those.
fn claim_keys(layout: &Layout, hold: Hold) -> String {
    let c = &layout.col;
    let p = Params::keys(hold);
    let scope_o = scope(layout, "o", p.scope);
    let scope_x = scope(layout, "x", p.scope);
    // A held claim locks the heads it picks, and then picks all of them first.
    let (lock_heads, heads_first) = match hold {
        Hold::Lease => ("", ""),
        Hold::Transaction => (
            "\n  FOR UPDATE OF o SKIP LOCKED",
            "u.seq IN (SELECT f.seq FROM free_heads AS f) DESC, ",
        ),
    };
    format!(
        "WITH RECURSIVE heads(k, seq, n) AS (
  (SELECT o.{key}, o.{seq}, 1 FROM {table} AS o
   WHERE o.{status} = 'pending' AND o.{key} IS NOT NULL AND o.{key} >= {cursor}{scope_o}
   ORDER BY o.{key}, o.{seq} LIMIT 1)
  UNION ALL
  SELECT nx.k, nx.seq, h.n + 1 FROM heads AS h
  CROSS JOIN LATERAL (
    SELECT o.{key} AS k, o.{seq} AS seq FROM {table} AS o
    WHERE o.{status} = 'pending' AND o.{key} IS NOT NULL AND o.{key} > h.k{scope_o}
    ORDER BY o.{key}, o.{seq} LIMIT 1) AS nx
  WHERE h.n <= {scan}
),
free_heads AS (
  SELECT h.k, h.seq FROM heads AS h JOIN {table} AS o ON o.{seq} = h.seq
  WHERE h.n <= {scan} AND o.{status} = 'pending' AND {free_o}
  ORDER BY h.seq
  LIMIT {limit}{lock_heads}
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
      LIMIT (SELECT ({limit} + count(*) - 1) / greatest(count(*), 1) FROM free_heads)) AS s
    WHERE s.k = f.k) AS r
),
unkeyed AS (
  SELECT o.{seq} AS seq, NULL::text AS k, true AS ok FROM {table} AS o
  WHERE o.{status} = 'pending' AND o.{key} IS NULL{scope_o} AND {free_o}
  ORDER BY o.{seq}
  LIMIT {limit}
),
picked AS (
  SELECT u.seq, u.k FROM (SELECT * FROM runs UNION ALL SELECT * FROM unkeyed) AS u
  WHERE u.ok
  ORDER BY {heads_first}u.seq
  LIMIT {limit}
),
{lock}
SELECT c.*, nc.next_cursor
FROM (SELECT (SELECT h.k FROM heads AS h WHERE h.n = {scan} + 1) AS next_cursor) AS nc
LEFT JOIN claimed AS c ON true",
        table = layout.table,
        seq = c.seq,
        key = c.key,
        status = c.status,
        cursor = p.cursor,
        scan = p.scan,
        limit = p.limit,
        free_o = free(layout, "o"),
        free_x = free(layout, "x"),
        key_order_x = key_order(layout, "x"),
        key_from_f = match layout.scope {
            Some(_) => format!("${}, f.k, f.seq", p.scope),
            None => "f.k, f.seq".to_owned(),
        },
        lock = lock_and_return(layout, hold, Locking::Picked, "runs", &p),
    )
}

/// All settlements of a claim in one statement. A leased claim's are each filtered by
/// its token; a held claim's need no filter (its transaction holds the rows, and the
/// caller passes only rows it claimed), and a release is nothing to write for it (the
/// commit ends the hold).
fn settle(layout: &Layout, delete_done: bool, hold: Hold) -> String {
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
fn settle_done_inline(layout: &Layout, delete_done: bool) -> (String, String) {
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
fn extend(layout: &Layout) -> String {
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
