//! The statements of a spool table, built once per table from its [`Layout`].

use std::sync::Arc;

use crate::ident::{CLAIM_CLASS, HOLD_CLASS};

mod claim;
mod settle;

use claim::{claim_first, claim_keys, claim_window};
use settle::{extend, purge, settle, settle_done_inline};

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

impl std::fmt::Debug for SpoolSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpoolSql")
            .field("table", &self.display)
            .finish_non_exhaustive()
    }
}
