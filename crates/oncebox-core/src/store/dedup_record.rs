//! What [`DedupStore::inspect`](super::DedupStore::inspect) reports of one id.

use std::fmt;
use std::time::SystemTime;

use bytes::Bytes;

use super::FencingToken;

/// One id's record in a [`DedupStore`](super::DedupStore), as
/// [`inspect`](super::DedupStore::inspect) found it. New fields may be added before 1.0.
///
/// Times are on the caller's clock: a store that measures leases and TTLs on its own
/// clock (a database's, Redis's) reports how long each has left, added to the caller's
/// now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DedupRecord {
    /// In progress or completed.
    pub state: DedupState,
    /// The token of the holder that began the id (and, once completed, completed it).
    pub token: FencingToken,
    /// When the record is dropped and the id is free again: the end of the lease while in
    /// progress, the end of the TTL once completed. `None` for a record that never
    /// expires (a Redis record whose expiry was removed by hand).
    pub expires_at: Option<SystemTime>,
}

impl DedupRecord {
    /// A record in `state`, held by `token`, expiring at `expires_at`.
    pub fn new(state: DedupState, token: FencingToken, expires_at: Option<SystemTime>) -> Self {
        Self {
            state,
            token,
            expires_at,
        }
    }
}

/// The state of a [`DedupRecord`].
///
/// `Debug` prints the length of a result, never its bytes.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DedupState {
    /// A holder runs the handler; `begin` answers `InProgress` until the lease ends.
    InProgress {
        /// When the holder's lease ends unless it extends it.
        lease_until: SystemTime,
    },
    /// The handler finished; `begin` answers `Completed` with this result until the
    /// record expires.
    Completed {
        /// The result stored by `complete` (empty if the handler returned none).
        result: Bytes,
    },
}

impl fmt::Debug for DedupState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InProgress { lease_until } => f
                .debug_struct("InProgress")
                .field("lease_until", lease_until)
                .finish(),
            Self::Completed { result } => f
                .debug_struct("Completed")
                .field("result_len", &result.len())
                .finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_prints_a_result() {
        let state = DedupState::Completed {
            result: Bytes::from_static(b"card 4242"),
        };
        let printed = format!("{:?}", DedupRecord::new(state, FencingToken(3), None));
        assert!(!printed.contains("4242"), "{printed}");
        assert!(printed.contains("result_len: 9"), "{printed}");
    }
}
