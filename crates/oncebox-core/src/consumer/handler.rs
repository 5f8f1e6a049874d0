//! What users implement to process messages.

use std::future::Future;

use bytes::Bytes;

use crate::{Received, Result};

/// Processes a message whose effect lives outside the dedup record (an HTTP call, an
/// email, a Redis write): used by the [`IdempotentReceiver`](super::IdempotentReceiver).
///
/// The returned bytes are the result kept for duplicates (empty if there is none to
/// keep). Return [`Error::handler_permanent`](crate::Error::handler_permanent) for a
/// message that can never succeed, so that it is dead-lettered at once.
pub trait Handler: Send + Sync {
    /// Handles one message.
    ///
    /// # Errors
    ///
    /// Any error; transient ones are retried with backoff.
    fn handle(&self, message: &Received) -> impl Future<Output = Result<Bytes>> + Send;
}

/// Processes a message inside the store's transaction `Tx`: the handler's writes, the
/// dedup record and the result commit together, so the effect happens exactly once.
/// Used by the [`TransactionalInbox`](super::TransactionalInbox) and the
/// [`DurableInbox`](super::DurableInbox).
///
/// With the SQLite store, `Tx` is `sqlx::Transaction<'static, Sqlite>`: run queries on
/// `&mut **tx`.
pub trait TxHandler<Tx>: Send + Sync {
    /// Handles one message inside `tx`. Do not commit or roll back `tx`.
    ///
    /// # Errors
    ///
    /// Any error rolls the transaction back; transient ones are retried with backoff.
    fn handle(&self, message: &Received, tx: &mut Tx)
    -> impl Future<Output = Result<Bytes>> + Send;
}
