//! The stores a benchmark runs on, behind one trait so that each benchmark is written
//! once.
//!
//! A backend owns an isolated place (a new SQLite file, a new PostgreSQL schema) and
//! removes it in [`Backend::close`]. Besides handing out the engine's stores, it does the
//! baseline's work in plain SQL: the claim-and-delete statement of the raw relay loop,
//! and the bulk fill of the outbox.

#[cfg(feature = "mysql")]
pub(crate) mod mysql;
pub(crate) mod postgres;
pub(crate) mod sqlite;

use std::future::Future;

use oncebox::Message;
use oncebox::consumer::TxHandler;
use oncebox::spool::SpoolStore;
use oncebox::store::{InboxStore, Transactional};

/// Transaction type of a backend's inbox.
pub(crate) type InboxTx<B> = <<B as Backend>::Inbox as Transactional>::Tx;

/// A store to benchmark, in a place of its own.
pub(crate) trait Backend: Send + Sync + Sized {
    /// The outbox as the relay sees it.
    type Outbox: SpoolStore<Item = Message> + Clone + Send + Sync + 'static;
    /// The transactional inbox.
    type Inbox: InboxStore + Clone + Send + Sync + 'static;
    /// The consumer benchmark's handler: inserts one effect row in the transaction.
    type Effect: TxHandler<InboxTx<Self>> + Send + Sync + 'static;

    /// The outbox the relay drains. Where the store can, published rows are deleted at
    /// once (as the baseline does); `notify` turns on the store's commit notification.
    fn outbox(&self, notify: bool) -> Self::Outbox;

    /// Empties the outbox table, so that every run starts from the same state.
    fn reset_outbox(&self) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Adds `messages` pending, valid rows on `topic` spread over `keys` keys to the
    /// outbox, as fast as the store allows (not timed), and refreshes the table's
    /// statistics.
    fn prefill(
        &self,
        topic: &str,
        messages: u64,
        keys: u32,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// The baseline relay's whole step: one statement that takes the first `limit`
    /// pending rows off the table and returns them, in `seq` order.
    fn take_batch(&self, limit: u32) -> impl Future<Output = anyhow::Result<Vec<Message>>> + Send;

    /// A producer's transaction: enqueues `message` through `outbox` and commits; with
    /// `notify`, wakes the relay as the store allows.
    fn commit_one(
        &self,
        outbox: &Self::Outbox,
        message: &Message,
        notify: bool,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// A producer's transaction of `oncebox-bench batch`: one business row (an effect row
    /// for `business`), then `messages` through `outbox`, one `enqueue` each or,
    /// `batched`, one `enqueue_batch`; then commits.
    fn commit_many(
        &self,
        outbox: &Self::Outbox,
        business: &Message,
        messages: &[Message],
        batched: bool,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// The transactional inbox.
    fn inbox(&self) -> Self::Inbox;

    /// The consumer benchmark's handler.
    fn effect(&self) -> Self::Effect;

    /// Empties the inbox records and the effect table.
    fn reset_consumer(&self) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Rows in the effect table.
    fn count_effects(&self) -> impl Future<Output = anyhow::Result<u64>> + Send;

    /// The PostgreSQL backend, which alone can run the log-tailing relay.
    fn postgres(&self) -> Option<&postgres::PgBench> {
        None
    }

    /// Removes everything the backend created.
    fn close(self) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// `url` without its password, for error messages of the server backends.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/app"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(
            redact("mysql://app:s3cret@db:3306/app"),
            "mysql://app:***@db:3306/app"
        );
        assert_eq!(
            redact("postgres://postgres@127.0.0.1/postgres"),
            "postgres://postgres@127.0.0.1/postgres"
        );
        assert_eq!(
            redact("mysql://root@127.0.0.1:3306/test"),
            "mysql://root@127.0.0.1:3306/test"
        );
        assert_eq!(redact("not a url"), "not a url");
    }
}
