//! The claim statements: a batch of due rows, at most a prefix of each key's pending
//! rows, locked and (for a leased claim) leased.

use super::{Hold, LIMIT_MARK, Layout, Locking, Params, free, scope};
use crate::time::millis_param;

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
/// more than the raw loop's `DELETE ... RETURNING` while the index's head is short
/// (where step 1's window with its aggregates costs about half as much again); while a
/// large backlog drains, each of its two scans walks the entries the deleted rows leave
/// at the head until vacuum, the loop's one scan once (about twice the loop's time in
/// docs/benchmarks.md, 2026-11-30, and still less than step 1); with hot keys and
/// several relays, most fast claims are blocked, and the caller stops trying them for a
/// while.
pub(super) fn claim_first(layout: &Layout) -> String {
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
pub(super) fn claim_window(layout: &Layout, hold: Hold) -> String {
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
pub(super) fn claim_keys(layout: &Layout, hold: Hold) -> String {
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
