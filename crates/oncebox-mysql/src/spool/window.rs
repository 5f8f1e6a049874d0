//! Step 1: the window of the first pending rows, read under the claim lock (ahead, in
//! the request that reads the spool's claims, when it can be), the rule applied to it,
//! and the window's size, which adapts to what the last claims needed.

use std::sync::atomic::Ordering;

use oncebox_core::Result;
use sqlx::Row as _;
use sqlx::mysql::{MySqlConnection, MySqlRow};

use super::claims::Held;
use super::rule::{self, Pending};
use super::script::{Script, Value};
use super::{SpoolTable, pending};
use crate::error::store_error;
use crate::sql::{MAX_LIST, bind_list, query, query_owned, sql_limit, with_list};

/// Step 1 reads the first pending rows, adaptively between at least this many (or a
/// quarter more than the rows asked for)...
const MIN_SMALL_WINDOW: usize = 128;
/// ...and at most this many...
const MIN_WINDOW: usize = 1024;
/// ...or this many per row asked for.
const WINDOW_PER_ROW: usize = 4;

impl SpoolTable {
    /// The window of step 1 for a claim of `limit` rows: the fixed size if set; else a
    /// quarter more than the last step 1 needed (the window's rows up to its last picked
    /// one), between `max(128, 1.25 × limit)` and `max(1024, 4 × limit)`; the upper
    /// bound after a claim that found too few rows in a full window.
    pub(super) fn window(&self, limit: usize) -> usize {
        if let Some(window) = self.window {
            return window;
        }
        let (low, high) = window_bounds(limit);
        self.window_hint.load(Ordering::Relaxed).clamp(low, high)
    }

    pub(super) fn adapt_window(&self, limit: usize, used: usize, short: bool) {
        if self.window.is_none() {
            let next = next_window(limit, used, short);
            self.window_hint.store(next, Ordering::Relaxed);
        }
    }

    /// Appends to `script` the claim lock, the read of the spool's claims and step 1's
    /// first window for a claim of `limit` rows, read ahead (see [`ReadAhead`]).
    pub(super) fn lock_and_read(&self, script: &mut Script, limit: usize) -> ReadAhead {
        self.lock_and_read_claims(script);
        let size = self.window(limit);
        let skip = self.own.skip();
        let mut values = self.scope_values();
        values.push(Value::Int(sql_limit(size)));
        if skip.is_empty() {
            script.push(&self.sql.window, &[], &values);
        } else {
            let list = &skip[..skip.len().min(MAX_LIST)];
            script.push(&self.sql.window_skipping, list, &values);
        }
        ReadAhead { size, skip }
    }

    /// Step 1's window of `size` rows: the first pending rows, passing over those of
    /// this process's live claims.
    ///
    /// The window is one read, under the claim lock, of everything the rule needs and of
    /// the rows themselves: the rows it picks are taken as read. Under the claim lock, a
    /// pending row that no live claim holds changes only by a cancel, which deletes it in
    /// its caller's transaction; the window reads what has committed and cannot see a
    /// cancel in flight. So the rows taken as read are locked with the claim's record,
    /// which is written only if every one of them could be ([`Take`]): a second, full
    /// read of them is not needed.
    pub(super) async fn read_window(
        &self,
        conn: &mut MySqlConnection,
        size: usize,
        held: &Held,
    ) -> Result<Vec<MySqlRow>> {
        // Any part of them will do: rows not passed over are read, and count as held.
        let skip = &held.skip()[..held.skip().len().min(MAX_LIST)];
        let read = if skip.is_empty() {
            self.scoped(query(&self.sql.window))
        } else {
            let statement = with_list(&self.sql.window_skipping, skip.len());
            bind_list(self.scoped(query_owned(statement)), skip)
        };
        read.bind(sql_limit(size))
            .fetch_all(&mut *conn)
            .await
            .map_err(store_error)
    }
}

/// Step 1 over the `rows` of a window of `size` rows, for at most `want` rows;
/// `None` if nothing is pending.
pub(super) fn step_one(
    rows: Vec<MySqlRow>,
    size: usize,
    want: usize,
    held: &Held,
) -> Result<Option<StepOne>> {
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let now: i64 = first.try_get("now_ms").map_err(store_error)?;
    let window = rows
        .iter()
        .map(|row| pending(row, held))
        .collect::<Result<Vec<_>>>()?;
    // In window order, as the window is in `seq` order.
    let picked: Vec<i64> = rule::pick(&window, now, want)
        .into_iter()
        .map(|row| row.seq)
        .collect();
    let full = window.len() >= size;
    let mut used = 0;
    let mut taken = Vec::with_capacity(picked.len());
    let mut picked = picked.into_iter().peekable();
    for (n, (row, read)) in window.into_iter().zip(rows).enumerate() {
        if picked.next_if_eq(&row.seq).is_some() {
            used = n + 1;
            taken.push((row, read));
        }
    }
    Ok(Some(StepOne {
        taken,
        now,
        used,
        full,
    }))
}

/// Step 1's first window, read ahead: in the request that reads the spool's claims,
/// after the claim lock.
///
/// The window passes over the rows of this process's live claims, which a claim
/// otherwise learns only from the claims it reads. The process remembers its claims
/// ([`OwnClaims`](super::claims::OwnClaims)): the window read ahead passes over the rows
/// of those it believes live, and is used if the claims read with it agree, which spares
/// the claim a round trip. If they do not (a claim of this process ended, or failed to commit), the
/// window is read again. Either way it is read under the claim lock.
pub(super) struct ReadAhead {
    /// The rows asked for.
    size: usize,
    /// The rows passed over, in `seq` order.
    skip: Vec<i64>,
}

impl ReadAhead {
    /// The rows of the claims, and the window read ahead, from the `results` of the
    /// request that [`SpoolTable::lock_and_read`] ended.
    pub(super) fn split(self, mut results: Vec<Vec<MySqlRow>>) -> (Vec<MySqlRow>, Window) {
        let rows = results.pop().unwrap_or_default();
        let window = Window {
            size: self.size,
            skip: self.skip,
            rows,
        };
        (results.pop().unwrap_or_default(), window)
    }
}

/// A window of step 1 read ahead, as [`ReadAhead`] asked for it.
pub(super) struct Window {
    pub(super) size: usize,
    pub(super) skip: Vec<i64>,
    pub(super) rows: Vec<MySqlRow>,
}

/// How a claim takes the rows step 1 picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Take {
    /// As the window read them, unlocked; they are locked with the claim's record,
    /// which is written only if every one of them could be (no round trip more). A row
    /// that could not (a cancel in flight holds it, or deleted it since) leaves the
    /// claim unrecorded, to be made again with [`Take::Locked`].
    AsRead,
    /// Locked first, `FOR UPDATE SKIP LOCKED`, and cut to per-key prefixes, as step 2
    /// does (a round trip more): the rows a transaction in flight holds are passed over,
    /// and so is the rest of their keys.
    Locked,
}

/// What one pass of step 1 did.
pub(super) struct StepOne {
    /// The rows it took, as the rule saw them and as read, not yet decoded.
    pub(super) taken: Vec<(Pending, MySqlRow)>,
    /// The database's clock when it read the window.
    pub(super) now: i64,
    /// The window's rows up to its last picked one.
    pub(super) used: usize,
    /// The window was full: more rows may be pending behind it.
    pub(super) full: bool,
}

/// The bounds of the default window for a claim of `limit` rows.
pub(super) fn window_bounds(limit: usize) -> (usize, usize) {
    let high = MIN_WINDOW.max(limit.saturating_mul(WINDOW_PER_ROW));
    let low = MIN_SMALL_WINDOW
        .max(limit.saturating_add(limit / 4))
        .min(high);
    (low, high)
}

/// The window after a step 1 of `limit` rows that needed `used` rows of its window.
///
/// A relay alone needs `limit` rows, and every row read costs a primary-key lookup (the
/// window reads `key` and `available_at`, which the `(status, seq)` index does not
/// hold): it reads a quarter more. With other
/// relays holding rows at the head, `used` counts their rows too, and the window grows
/// with them. A window that comes back short is read again at the upper bound, in the
/// same claim, before step 2 (a probe per key, each a round trip, under the claim lock):
/// going straight to step 2 made four relays on 500 keys, killed at random, take twice
/// as long to drain.
pub(super) fn next_window(limit: usize, used: usize, short: bool) -> usize {
    let (low, high) = window_bounds(limit);
    if short {
        high
    } else {
        used.saturating_add(used / 4).clamp(low, high)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_bounds_grow_with_the_limit() {
        assert_eq!(window_bounds(8), (128, 1024));
        assert_eq!(window_bounds(256), (320, 1024));
        assert_eq!(window_bounds(1000), (1250, 4000));
    }

    #[test]
    fn windows_follow_what_step_one_needed() {
        assert_eq!(next_window(256, 256, false), 320, "alone: a quarter more");
        assert_eq!(
            next_window(256, 600, false),
            750,
            "a quarter more than needed"
        );
        assert_eq!(next_window(256, 900, false), 1024, "capped");
        assert_eq!(next_window(256, 0, true), 1024, "short: the upper bound");
    }
}
