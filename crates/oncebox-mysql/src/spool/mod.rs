//! Claim, settle and purge over a spool table; shared by the outbox and the durable
//! inbox, which differ only in their [`Layout`]. The crate docs ("Claiming") describe
//! the algorithm.

mod claims;
pub(crate) mod explain;
mod rule;
mod script;
mod settle;
pub(crate) mod sql;
mod window;

use std::collections::HashSet;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, PoisonError};

use oncebox_core::Result;
use oncebox_core::spool::{ClaimRequest, Claimed, LeaseToken, Settle, Settlement};
use oncebox_core::sql::fenced;
use sqlx::Row;
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlRow};

use crate::error::{RowDecodeError, RowReader, store_error};
use crate::sql::{
    MAX_LIST, MySqlQuery, bind_list, duration_ms, query, query_owned, sql_limit,
    start_read_committed, uuid_bytes, with_list,
};
use claims::{Held, OwnClaims};
use rule::Pending;
use script::{Script, ScriptTx, Value};
pub(crate) use sql::{Layout, SpoolSql};
use window::{Take, Window, step_one, window_bounds};

/// Step 2 probes at most this many keys...
const MIN_KEY_SCAN: usize = 128;
/// ...or this many per row asked for.
const KEYS_PER_ROW: usize = 2;

/// `?` lease ms, `?` spool, `?` token: extends a claim whose lease has not ended.
const EXTEND: &str = concat!(
    "UPDATE oncebox_claims SET lease_until = ",
    crate::sql::now_ms!(),
    " + ? WHERE spool = ? AND token = ? AND lease_until > ",
    crate::sql::now_ms!()
);

/// An item stored in a spool table, read back from a claimed row.
pub(crate) trait SpoolRow: Sized {
    /// Decodes the item from the columns of the table's [`Layout::item`].
    fn decode(row: &RowReader<'_>) -> Result<Self, RowDecodeError>;
}

/// One spool table, optionally scoped to a consumer.
#[derive(Debug, Clone)]
pub(crate) struct SpoolTable {
    pool: MySqlPool,
    sql: &'static SpoolSql,
    scope: Option<Arc<str>>,
    /// The table's name in `oncebox_claim_locks`, whose row serialises its claims, and
    /// in `oncebox_claims`.
    lock_name: Arc<str>,
    /// Where step 2's scan of keys resumes; shared by clones, so that successive claims of
    /// a process move through the whole key space.
    cursor: Arc<Mutex<Vec<u8>>>,
    /// The next default window, from what the last step 1 needed (see
    /// [`next_window`](window::next_window)). Shared by clones, like the cursor.
    window_hint: Arc<AtomicUsize>,
    /// A fixed window, if set.
    window: Option<usize>,
    /// The keys of this process's live claims; shared by clones.
    own: Arc<OwnClaims>,
}

impl SpoolTable {
    pub(crate) fn new(pool: MySqlPool, sql: &'static SpoolSql, scope: Option<Arc<str>>) -> Self {
        let lock_name = match &scope {
            Some(scope) => format!("{}:{scope}", sql.table),
            None => sql.table.to_owned(),
        };
        Self {
            pool,
            sql,
            scope,
            lock_name: Arc::from(lock_name),
            cursor: Arc::default(),
            window_hint: Arc::default(),
            window: None,
            own: Arc::default(),
        }
    }

    pub(crate) fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// Extends the lease of claim `token`, if it has not ended. Only the lease's end
    /// changes: the claim's rows, which settlements check, stay as they were written.
    pub(crate) async fn extend(&self, token: LeaseToken, lease: std::time::Duration) -> Result<()> {
        // Rows matched (sqlx sets CLIENT_FOUND_ROWS): 0 means the claim ended.
        let extended = query(EXTEND)
            .bind(duration_ms(lease).max(1))
            .bind(self.spool())
            .bind(uuid_bytes(token.as_uuid()))
            .execute(&self.pool)
            .await
            .map_err(store_error)?;
        fenced(extended.rows_affected())
    }

    pub(crate) fn table(&self) -> &'static str {
        self.sql.table
    }

    /// The table's name in `oncebox_claim_locks` and `oncebox_claims`.
    pub(crate) fn spool(&self) -> Vec<u8> {
        self.lock_name.as_bytes().to_vec()
    }

    pub(crate) fn set_window(&mut self, rows: usize) {
        self.window = Some(rows.max(1));
    }

    /// Binds the scope (the consumer), if the table has one.
    pub(crate) fn scoped(&self, query: MySqlQuery) -> MySqlQuery {
        match (&self.scope, self.sql.scoped) {
            (Some(scope), true) => query.bind(scope.as_bytes().to_vec()),
            _ => query,
        }
    }

    /// The scope (the consumer) as a [`Script`]'s values, if the table has one.
    fn scope_values(&self) -> Vec<Value<'_>> {
        match (&self.scope, self.sql.scoped) {
            (Some(scope), true) => vec![Value::Bytes(scope.as_bytes())],
            _ => Vec::new(),
        }
    }

    /// Claims rows in a transaction of its own.
    pub(crate) async fn claim<T: SpoolRow>(
        &self,
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<T>>> {
        if request.limit == 0 {
            return Ok(Vec::new());
        }
        let claimed = self.claim_once(request, Take::AsRead).await?;
        self.or_claim_locking(claimed, request).await
    }

    /// One claim, in a transaction of its own, step 1's rows taken as `take` says;
    /// `None` if it recorded nothing because a row it took was held (see
    /// [`finish_claim`](Self::finish_claim)).
    async fn claim_once<T: SpoolRow>(
        &self,
        request: &ClaimRequest,
        take: Take,
    ) -> Result<Option<Vec<Claimed<T>>>> {
        let mut script = Script::default();
        let ahead = self.lock_and_read(&mut script, request.limit);
        let (tx, results) = ScriptTx::begin(&self.pool, script).await?;
        let (claims, window) = ahead.split(results);
        self.finish_claim(tx, &claims, window, request, take).await
    }

    /// The rows of a claim that recorded them; after one that recorded nothing because
    /// a row step 1 took was held by a transaction in flight, claims again, step 1's
    /// rows locked before they are taken ([`Take::Locked`]): that claim passes over the
    /// held rows, where the first would pick them again.
    async fn or_claim_locking<T: SpoolRow>(
        &self,
        claimed: Option<Vec<Claimed<T>>>,
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<T>>> {
        if let Some(claimed) = claimed {
            return Ok(claimed);
        }
        tracing::debug!(
            table = self.sql.table,
            "a row the claim took was held by a transaction in flight: claim again, \
             locking the rows first"
        );
        // A claim of `Take::Locked` records whatever it takes: always `Some`.
        Ok(self
            .claim_once(request, Take::Locked)
            .await?
            .unwrap_or_default())
    }

    /// Settles the rows of claim `token`, then claims, in two transactions whose
    /// statements between the settle's lock of its claim and the claim's record travel
    /// in one request: the settle's updates, its commit, the next transaction's start,
    /// the claim lock, the read of the live claims and the claim's window.
    ///
    /// If this process remembers claim `token`, the settle's lock of it travels in that
    /// request too ([`settle_remembered`](Self::settle_remembered)): three requests in
    /// all. Else the settle locks and reads the claim first: four.
    ///
    /// Two transactions, not one: the window then reads index pages whose last change
    /// has committed. Read in the transaction that just deleted or updated the last
    /// batch's rows, the same window took about 1.1 ms more per 320 rows on MariaDB
    /// 10.11, more than the second commit costs (about 0.5 ms, one log flush). A
    /// failure of the claim leaves the settlement applied, as the [`SpoolStore`]
    /// contract allows.
    ///
    /// [`SpoolStore`]: oncebox_core::spool::SpoolStore
    pub(crate) async fn settle_and_claim<T: SpoolRow>(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        delete_done: bool,
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<T>>> {
        if request.limit == 0 {
            self.settle(token, settlements, delete_done).await?;
            return Ok(Vec::new());
        }
        let token = uuid_bytes(token.as_uuid());
        let mut script = Script::default();
        if let Some(flag) = self.settle_remembered(&mut script, &token, settlements, delete_done) {
            script.push(concat!("COMMIT; ", start_read_committed!()), &[], &[]);
            let ahead = self.lock_and_read(&mut script, request.limit);
            let (tx, results) = ScriptTx::begin(&self.pool, script).await?;
            if settle::settled(&results, flag)? {
                let (claims, window) = ahead.split(results);
                let claimed = self
                    .finish_claim(tx, &claims, window, request, Take::AsRead)
                    .await?;
                return self.or_claim_locking(claimed, request).await;
            }
            // Nothing was settled: start again, the settle reading the claim first.
            tx.rollback().await?;
            script = Script::default();
        }
        // Before the claim lock, which other relays wait for: settling locks only the
        // row of claim `token`, and touches only the rows that claim holds.
        let (mut tx, held) = self.begin_settle(&token).await?;
        self.settle_in(&mut tx, &token, held, settlements, delete_done, &mut script)
            .await?;
        script.push(concat!("COMMIT; ", start_read_committed!()), &[], &[]);
        let ahead = self.lock_and_read(&mut script, request.limit);
        let (claims, window) = ahead.split(script.run(&mut tx).await?);
        let claimed = self
            .finish_claim(tx, &claims, window, request, Take::AsRead)
            .await?;
        self.or_claim_locking(claimed, request).await
    }

    /// Ends a claim whose transaction `tx` holds the claim lock and has read the spool's
    /// `claims` and the first `window`: its other statements, its record and commit,
    /// and the rows decoded.
    ///
    /// The rows decode while the record and the commit travel (about 0.2 ms of a
    /// relay's batch of 256 rows, which would otherwise follow the commit's round trip):
    /// decoding waits for nothing. Rows that do not decode are dead-lettered once the
    /// claim that holds them has committed.
    ///
    /// `None` if the claim recorded nothing: step 1 took its rows as read
    /// ([`Take::AsRead`]) and one of them, locked with the record, was held by a
    /// transaction in flight or is no longer pending.
    async fn finish_claim<T: SpoolRow>(
        &self,
        mut tx: ScriptTx,
        claims: &[MySqlRow],
        window: Window,
        request: &ClaimRequest,
        take: Take,
    ) -> Result<Option<Vec<Claimed<T>>>> {
        let (rows, record, check) = self
            .claim_in(&mut tx, claims, window, request, take)
            .await?;
        // `join` polls the commit first, which sends it before the rows decode.
        let (committed, (claimed, undecodable)) =
            futures_util::future::join(tx.commit(record), async {
                self.decode_all(request.token, &rows)
            })
            .await;
        let results = committed?;
        if let Some(flag) = check
            && !claims::recorded(&results, flag)?
        {
            self.own.forget(&uuid_bytes(request.token.as_uuid()));
            return Ok(None);
        }
        for (seq, error) in undecodable {
            self.dead_letter_undecodable(request.token, seq, &error)
                .await;
        }
        Ok(Some(claimed))
    }

    /// The claim's statements in `conn`'s transaction, under the claim lock, from the
    /// spool's `claims` and step 1's first `window`, read under it: step 1, its rows
    /// taken as `take` says, and, if needed, step 2. Returns the claimed rows, not yet
    /// decoded, and the claim's record, for the caller to run with its commit, with the
    /// index of the result that says whether it was recorded, if it may not be
    /// ([`SpoolTable::record_claim_if_locked`]).
    async fn claim_in(
        &self,
        conn: &mut MySqlConnection,
        claims: &[MySqlRow],
        window: Window,
        request: &ClaimRequest,
        take: Take,
    ) -> Result<(Vec<(i64, MySqlRow)>, Script, Option<usize>)> {
        let mut held = self.live_claims(conn, claims).await?;
        let (_, high) = window_bounds(request.limit);
        let mut size = window.size;
        let mut window = if window.skip == held.skip() {
            Some(window)
        } else {
            tracing::debug!(
                table = self.sql.table,
                "the window read ahead passed over other rows than this process's live \
                 claims hold: read again"
            );
            None
        };
        let mut claimed = Vec::new();
        // Step 1's rows taken as read, to lock with the record.
        let mut as_read = Vec::new();
        let mut keys = HashSet::new();
        let mut now = None;
        loop {
            let want = request.limit.saturating_sub(claimed.len());
            let rows = match window.take() {
                Some(window) => window.rows,
                None => self.read_window(conn, size, &held).await?,
            };
            let Some(step) = step_one(rows, size, want, &held)? else {
                break;
            };
            now = Some(step.now);
            // Taken (or, locked first, passed over): a second window or step 2 must pass
            // over them like other claims' rows.
            held.add(step.taken.iter().map(|(row, _)| row.seq));
            match take {
                Take::AsRead => {
                    for (row, read) in step.taken {
                        as_read.push(row.seq);
                        keys.extend(row.key);
                        claimed.push((row.seq, read));
                    }
                }
                Take::Locked => {
                    let picked: Vec<&Pending> = step.taken.iter().map(|(row, _)| row).collect();
                    claimed.extend(self.lock_picked(conn, &picked, step.now, &mut keys).await?);
                }
            }
            let want = request.limit.saturating_sub(claimed.len());
            let short = want > 0 && step.full;
            if short && self.window.is_none() && size < high {
                // Other relays hold more of the head than the window held: read the
                // largest window once before probing keys one by one.
                size = high;
                continue;
            }
            self.adapt_window(request.limit, step.used, short);
            if short {
                claimed.extend(
                    self.claim_keys(conn, want, step.now, &held, &mut keys)
                        .await?,
                );
            }
            break;
        }
        let mut record = Script::default();
        let mut check = None;
        if let (Some(now), false) = (now, claimed.is_empty()) {
            let seqs: Vec<i64> = claimed.iter().map(|(seq, _)| *seq).collect();
            let until = now.saturating_add(duration_ms(request.lease).max(1));
            let token = uuid_bytes(request.token.as_uuid());
            check = self.record_claim_if_locked(&mut record, &token, until, &seqs, &as_read);
            self.own.remember(token, seqs, keys);
        }
        Ok((claimed, record, check))
    }

    /// Locks the `picked` rows that are still pending and due (skipping rows other
    /// transactions hold), and returns those that keep their keys' prefixes: the rows
    /// the claim takes. Adds their keys to `keys`.
    async fn lock_picked(
        &self,
        conn: &mut MySqlConnection,
        picked: &[&Pending],
        now: i64,
        keys: &mut HashSet<Vec<u8>>,
    ) -> Result<Vec<(i64, MySqlRow)>> {
        if picked.is_empty() {
            return Ok(Vec::new());
        }
        let seqs: Vec<i64> = picked.iter().map(|p| p.seq).collect();
        let mut locked = Vec::with_capacity(seqs.len());
        for chunk in seqs.chunks(MAX_LIST) {
            let statement = with_list(&self.sql.lock_rows, chunk.len());
            let rows = self
                .scoped(bind_list(query_owned(statement), chunk))
                .bind(now)
                .fetch_all(&mut *conn)
                .await
                .map_err(store_error)?;
            for row in rows {
                let seq: i64 = row.try_get("seq").map_err(store_error)?;
                locked.push((seq, row));
            }
        }
        let seqs: HashSet<i64> = locked.iter().map(|(seq, _)| *seq).collect();
        let keep: HashSet<i64> = rule::leasable(picked, &seqs).into_iter().collect();
        locked.retain(|(seq, _)| keep.contains(seq));
        keys.extend(
            picked
                .iter()
                .filter(|row| keep.contains(&row.seq))
                .filter_map(|row| row.key.clone()),
        );
        Ok(locked)
    }

    /// Step 2, when step 1's window was full and yielded too few rows: finds keys whose
    /// first pending row is free, one index probe per key from a cursor that moves on
    /// with every claim, and takes a fair share of each one's free rows, plus free rows
    /// without a key.
    async fn claim_keys(
        &self,
        conn: &mut MySqlConnection,
        want: usize,
        now: i64,
        held: &Held,
        keys: &mut HashSet<Vec<u8>>,
    ) -> Result<Vec<(i64, MySqlRow)>> {
        let scan = MIN_KEY_SCAN.max(want.saturating_mul(KEYS_PER_ROW));
        let mut cursor = self.lock_cursor().clone();
        let mut heads = Vec::new();
        for _ in 0..scan {
            let row = self
                .scoped(query(&self.sql.next_head))
                .bind(cursor.clone())
                .fetch_optional(&mut *conn)
                .await
                .map_err(store_error)?;
            let Some(row) = row else {
                cursor.clear();
                break;
            };
            let head = pending(&row, held)?;
            // The smallest key after this one: the key with a zero byte appended.
            cursor = head.key.clone().unwrap_or_default();
            cursor.push(0);
            if !head.blocked(now) {
                heads.push(head);
                if heads.len() >= want {
                    break;
                }
            }
        }
        self.lock_cursor().clone_from(&cursor);
        heads.sort_by_key(|head| head.seq);
        let mut candidates = Vec::new();
        if !heads.is_empty() {
            let share = want.div_ceil(heads.len());
            for head in &heads {
                let rows = self
                    .scoped(query(&self.sql.key_rows))
                    .bind(head.key.clone())
                    .bind(head.seq)
                    .bind(sql_limit(share))
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(store_error)?
                    .iter()
                    .map(|row| pending(row, held))
                    .collect::<Result<Vec<_>>>()?;
                candidates.extend(rule::free_run(&rows, now).into_iter().cloned());
            }
        }
        // Held rows are filtered here, not in SQL: read enough that `want` free ones
        // remain even if every held row is among them.
        let unkeyed = self
            .scoped(query(&self.sql.unkeyed))
            .bind(now)
            .bind(sql_limit(want.saturating_add(held.len())))
            .fetch_all(&mut *conn)
            .await
            .map_err(store_error)?;
        for row in &unkeyed {
            let row = pending(row, held)?;
            if !row.held {
                candidates.push(row);
            }
        }
        candidates.sort_by_key(|c| c.seq);
        candidates.truncate(want);
        let picked: Vec<&Pending> = candidates.iter().collect();
        self.lock_picked(conn, &picked, now, keys).await
    }

    fn lock_cursor(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.cursor.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Decodes claimed rows, in `seq` order. A row that does not decode is returned
    /// apart, with the reason: it can never be delivered, and must not stall the spool,
    /// so the caller marks it dead.
    fn decode_all<T: SpoolRow>(
        &self,
        token: LeaseToken,
        rows: &[(i64, MySqlRow)],
    ) -> (Vec<Claimed<T>>, Vec<(i64, RowDecodeError)>) {
        let mut claimed = Vec::with_capacity(rows.len());
        let mut undecodable = Vec::new();
        for (seq, row) in rows {
            let reader = RowReader::new(row, self.sql.table, format_args!("seq {seq}"));
            let decoded = reader
                .count("attempts")
                .and_then(|attempts| Ok((attempts, T::decode(&reader)?)));
            match decoded {
                Ok((attempts, item)) => claimed.push(Claimed {
                    seq: *seq,
                    token,
                    attempts,
                    item,
                }),
                Err(error) => undecodable.push((*seq, error)),
            }
        }
        claimed.sort_by_key(|c| c.seq);
        (claimed, undecodable)
    }

    async fn dead_letter_undecodable(&self, token: LeaseToken, seq: i64, error: &RowDecodeError) {
        tracing::warn!(table = self.sql.table, seq, %error, "undecodable row: dead-lettered");
        let dead = [Settlement {
            seq,
            outcome: Settle::Dead {
                reason: format!("undecodable row: {error}"),
            },
        }];
        if let Err(error) = self.settle(token, &dead, false).await {
            tracing::warn!(
                table = self.sql.table, seq, %error,
                "could not dead-letter an undecodable row; it stays leased until its lease ends"
            );
        }
    }
}

/// A pending row's bookkeeping, from a statement whose first columns are `seq`, `k`
/// and `available_at` (read by position: this runs for every row of every window), and
/// whether a live claim holds it. A row of a key that one of this process's claims
/// holds counts as held too: the window may have passed over that claim's rows, which
/// would have told the rule so.
fn pending(row: &MySqlRow, held: &Held) -> Result<Pending> {
    let seq = row.try_get(0).map_err(store_error)?;
    let key: Option<Vec<u8>> = row.try_get(1).map_err(store_error)?;
    Ok(Pending {
        seq,
        held: held.contains(seq) || key.as_deref().is_some_and(|key| held.holds_key(key)),
        key,
        available_at: row.try_get(2).map_err(store_error)?,
    })
}
