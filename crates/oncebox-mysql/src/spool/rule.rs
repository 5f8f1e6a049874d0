//! The claim rule, decided in Rust over rows the claim read: which rows to take, and,
//! after step 2's locking read, which of the locked rows the claim keeps.
//!
//! A row is claimable if it is due, not under a live lease, and every earlier pending row
//! of its key is claimable in the same claim; a key with a live lease on any of its rows
//! is not claimed at all. So each key's claimed rows are a prefix of its pending rows,
//! and a failing row holds back only its own key.

use std::collections::{HashMap, HashSet};

/// A pending row as the claim reads it: where it stands, not what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pending {
    pub(crate) seq: i64,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) available_at: i64,
    /// A live claim holds the row.
    pub(crate) held: bool,
}

impl Pending {
    /// Not claimable on its own at `now`: not due yet, or leased.
    pub(crate) fn blocked(&self, now: i64) -> bool {
        self.available_at > now || self.held
    }
}

/// What the window says about one key.
#[derive(Default)]
struct KeyState {
    /// A row of the key is under a live lease.
    held: bool,
    /// The key's first blocked row.
    first_blocked: Option<i64>,
}

/// Step 1: the rows of `window` (the first pending rows in `seq` order) to claim, at most
/// `limit`, in `seq` order.
///
/// Every earlier pending row of a key in the window is in the window too, so the rule is
/// decided here: a row is picked if it is free, its key has no row under a live lease in
/// the window, and no earlier row of its key is blocked.
pub(crate) fn pick(window: &[Pending], now: i64, limit: usize) -> Vec<&Pending> {
    let mut keys: HashMap<&[u8], KeyState> = HashMap::new();
    for row in window {
        let Some(key) = row.key.as_deref() else {
            continue;
        };
        let state = keys.entry(key).or_default();
        state.held |= row.held;
        if row.blocked(now) && state.first_blocked.is_none() {
            state.first_blocked = Some(row.seq);
        }
    }
    window
        .iter()
        .filter(|row| {
            if row.blocked(now) {
                return false;
            }
            let Some(key) = row.key.as_deref() else {
                return true;
            };
            keys.get(key).is_some_and(|state| {
                !state.held && state.first_blocked.is_none_or(|first| row.seq < first)
            })
        })
        .take(limit)
        .collect()
}

/// Step 2, for one key whose first pending row is free: its rows from that head, in
/// `seq` order, up to (not including) the first blocked one.
pub(crate) fn free_run(rows: &[Pending], now: i64) -> Vec<&Pending> {
    rows.iter().take_while(|row| !row.blocked(now)).collect()
}

/// Of the `picked` rows (each key's picked rows being its first pending rows), those the
/// claim takes once `locked` holds the ones it could lock: a key keeps only its rows
/// before its first picked row that could not be locked (held by a transaction in
/// flight, or changed since it was read), so its claimed rows stay a prefix.
pub(crate) fn leasable(picked: &[&Pending], locked: &HashSet<i64>) -> Vec<i64> {
    let mut cut: HashSet<&[u8]> = HashSet::new();
    let mut keep = Vec::with_capacity(picked.len());
    let mut by_seq: Vec<&&Pending> = picked.iter().collect();
    by_seq.sort_by_key(|row| row.seq);
    for row in by_seq {
        let is_locked = locked.contains(&row.seq);
        match row.key.as_deref() {
            None => {
                if is_locked {
                    keep.push(row.seq);
                }
            }
            Some(key) => {
                if cut.contains(key) {
                    continue;
                }
                if is_locked {
                    keep.push(row.seq);
                } else {
                    cut.insert(key);
                }
            }
        }
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000;

    fn row(seq: i64, key: Option<&str>) -> Pending {
        Pending {
            seq,
            key: key.map(|k| k.as_bytes().to_vec()),
            available_at: 0,
            held: false,
        }
    }

    fn seqs(rows: &[&Pending]) -> Vec<i64> {
        rows.iter().map(|r| r.seq).collect()
    }

    #[test]
    fn a_retrying_row_blocks_only_its_key() {
        let mut retrying = row(1, Some("a"));
        retrying.available_at = NOW + 500;
        let window = [retrying, row(2, Some("b")), row(3, Some("a")), row(4, None)];
        assert_eq!(seqs(&pick(&window, NOW, 10)), [2, 4]);
    }

    #[test]
    fn a_held_key_is_not_claimed_at_all() {
        let mut held = row(2, Some("a"));
        held.held = true;
        let window = [
            row(1, Some("a")),
            held,
            row(3, Some("a")),
            row(4, Some("b")),
        ];
        assert_eq!(seqs(&pick(&window, NOW, 10)), [4]);
    }

    #[test]
    fn the_limit_cuts_in_seq_order() {
        let window = [row(1, Some("a")), row(2, Some("b")), row(3, Some("a"))];
        assert_eq!(seqs(&pick(&window, NOW, 2)), [1, 2]);
    }

    #[test]
    fn runs_stop_at_the_first_blocked_row() {
        let mut later = row(3, Some("a"));
        later.available_at = NOW + 1;
        let rows = [
            row(1, Some("a")),
            row(2, Some("a")),
            later,
            row(4, Some("a")),
        ];
        assert_eq!(seqs(&free_run(&rows, NOW)), [1, 2]);
    }

    #[test]
    fn an_unlocked_row_cuts_its_key_only() {
        let rows = [
            row(1, Some("a")),
            row(2, Some("b")),
            row(3, Some("a")),
            row(4, None),
            row(5, Some("b")),
            row(6, None),
        ];
        let picked: Vec<&Pending> = rows.iter().collect();
        let locked: HashSet<i64> = [1, 3, 5, 6].into();
        // b lost its first row (2) to a transaction in flight, so 5 must wait; 4 has no
        // key and waits for nothing.
        assert_eq!(leasable(&picked, &locked), [1, 3, 6]);
    }
}
