//! Which transactions other sessions can see.
//!
//! Logical decoding hands a commit out as soon as its record is in the WAL, a moment
//! before the transaction becomes visible to other sessions; with synchronous
//! replication, that moment lasts until a standby acknowledged the commit, and if the
//! primary fails first, the standby that takes over never had the transaction. A commit
//! is therefore published only once a snapshot of the server shows it ended: "published
//! iff committed" holds for every commit that anyone could have seen. One snapshot
//! covers every commit that ended before it was taken, so a relay catching up on a
//! backlog takes one per window of commits, not one per commit.

use std::collections::HashSet;

use oncebox_core::{Error, Result};
use sqlx::PgPool;

use crate::error::store_error;

/// `pg_current_snapshot()`: which transactions had ended when it was taken.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// Every transaction id below this one had ended.
    xmax: u64,
    /// The transactions below `xmax` still running.
    running: HashSet<u64>,
}

impl Snapshot {
    /// The server's current snapshot.
    pub(crate) async fn take(pool: &PgPool) -> Result<Self> {
        let text: String = sqlx::query_scalar("SELECT pg_current_snapshot()::text")
            .fetch_one(pool)
            .await
            .map_err(store_error)?;
        Self::parse(&text).ok_or_else(|| {
            Error::store_permanent(format!("pg_current_snapshot() returned {text:?}"))
        })
    }

    /// Reads `xmin:xmax:xip,...` (the snapshot's text form).
    fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split(':');
        let _xmin: u64 = parts.next()?.parse().ok()?;
        let xmax = parts.next()?.parse().ok()?;
        let running = match parts.next()? {
            "" => HashSet::new(),
            list => list
                .split(',')
                .map(|xid| xid.parse().ok())
                .collect::<Option<_>>()?,
        };
        parts.next().is_none().then_some(Self { xmax, running })
    }

    /// Whether the committed top-level transaction `xid` (the 32-bit id pgoutput sends)
    /// had ended, and so was visible, when the snapshot was taken. Its 64-bit id is the one nearest to `xmax`:
    /// PostgreSQL never lets live ids drift 2³¹ apart.
    pub(crate) fn shows(&self, xid: u32) -> bool {
        // The truncation is the point: the 32-bit distance from xmax, read as signed.
        #[allow(clippy::cast_possible_truncation)]
        let distance = xid.wrapping_sub(self.xmax as u32) as i32;
        if distance >= 0 {
            return false;
        }
        let full = self.xmax.checked_sub(u64::from(distance.unsigned_abs()));
        full.is_some_and(|full| !self.running.contains(&full))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_transactions_below_xmax_were_visible() {
        let snapshot = Snapshot::parse("100:105:100,102").expect("a snapshot");
        assert!(snapshot.shows(99));
        assert!(!snapshot.shows(100), "still running");
        assert!(snapshot.shows(101));
        assert!(!snapshot.shows(102), "still running");
        assert!(snapshot.shows(104));
        assert!(!snapshot.shows(105), "began at or after xmax");
        assert!(!snapshot.shows(4_000));
    }

    #[test]
    fn ids_are_compared_across_the_32_bit_wraparound() {
        // xmax just past an epoch boundary: 2^32 + 5.
        let snapshot = Snapshot::parse("4294967290:4294967301:").expect("a snapshot");
        assert!(
            snapshot.shows(u32::MAX - 3),
            "the previous epoch's last ids"
        );
        assert!(snapshot.shows(4));
        assert!(!snapshot.shows(5));
        assert!(!snapshot.shows(6));
    }

    #[test]
    fn a_young_cluster_has_no_ids_below_zero() {
        let snapshot = Snapshot::parse("3:3:").expect("a snapshot");
        assert!(snapshot.shows(2));
        assert!(!snapshot.shows(u32::MAX), "would lie below id 0");
    }

    #[test]
    fn malformed_text_is_refused() {
        for text in ["", "1:2", "1:2:x", "1:2:3:4", "a:2:"] {
            assert_eq!(Snapshot::parse(text), None, "{text:?}");
        }
    }
}
