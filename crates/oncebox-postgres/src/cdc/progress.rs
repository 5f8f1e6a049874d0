//! Which position of the slot may be confirmed: the end of the last commit every message
//! of which, and of every commit before it, the broker confirmed.

use std::collections::VecDeque;

use pgwire_replication::Lsn;

/// A commit still in the stream's window.
#[derive(Debug)]
struct Pending {
    /// Where the commit ends; `None` until its Commit arrived.
    end: Option<Lsn>,
    /// Its messages not yet confirmed by the broker (or dead-lettered).
    outstanding: usize,
}

/// The commits read and not yet confirmed, in stream (commit) order.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    commits: VecDeque<Pending>,
    /// The number of the first commit in `commits`.
    first: u64,
    confirmed: Lsn,
}

/// A commit's number in the stream, handed out by [`Progress::begin`].
pub(crate) type CommitNo = u64;

impl Progress {
    /// A commit begins.
    pub(crate) fn begin(&mut self) -> CommitNo {
        self.commits.push_back(Pending {
            end: None,
            outstanding: 0,
        });
        self.first + self.commits.len() as u64 - 1
    }

    /// The commit has one more message to publish.
    pub(crate) fn add(&mut self, commit: CommitNo) {
        if let Some(pending) = self.get(commit) {
            pending.outstanding += 1;
        }
    }

    /// The commit ended at `end`.
    pub(crate) fn commit(&mut self, commit: CommitNo, end: Lsn) {
        if let Some(pending) = self.get(commit) {
            pending.end = Some(end);
        }
    }

    /// One message of the commit was confirmed (or dead-lettered).
    pub(crate) fn done(&mut self, commit: CommitNo) {
        if let Some(pending) = self.get(commit) {
            pending.outstanding = pending.outstanding.saturating_sub(1);
        }
    }

    /// Moves past the finished commits at the front; the new confirmable position, if it
    /// moved.
    pub(crate) fn advance(&mut self) -> Option<Lsn> {
        let before = self.confirmed;
        while let Some(Pending {
            end: Some(end),
            outstanding: 0,
        }) = self.commits.front()
        {
            self.confirmed = self.confirmed.max(*end);
            self.commits.pop_front();
            self.first += 1;
        }
        (self.confirmed > before).then_some(self.confirmed)
    }

    fn get(&mut self, commit: CommitNo) -> Option<&mut Pending> {
        let index = usize::try_from(commit.checked_sub(self.first)?).ok()?;
        self.commits.get_mut(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_is_confirmed_only_behind_every_earlier_one() {
        let mut progress = Progress::default();
        let first = progress.begin();
        progress.add(first);
        progress.add(first);
        progress.commit(first, Lsn(100));
        let second = progress.begin();
        progress.add(second);
        progress.commit(second, Lsn(200));

        // The later commit is done first: nothing may be confirmed.
        progress.done(second);
        assert_eq!(progress.advance(), None);
        progress.done(first);
        assert_eq!(
            progress.advance(),
            None,
            "one message of the first is still out"
        );
        progress.done(first);
        assert_eq!(progress.advance(), Some(Lsn(200)));
        assert!(progress.commits.is_empty());
    }

    #[test]
    fn an_open_commit_holds_back_even_when_empty() {
        let mut progress = Progress::default();
        let heartbeat = progress.begin();
        assert_eq!(progress.advance(), None, "its end is not known yet");
        progress.commit(heartbeat, Lsn(7));
        assert_eq!(progress.advance(), Some(Lsn(7)));
        assert_eq!(progress.advance(), None, "nothing new");
    }
}
