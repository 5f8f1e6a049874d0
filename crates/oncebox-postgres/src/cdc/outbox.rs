//! The producer's side of the message mode.

use std::sync::Arc;

use oncebox_core::{Error, Limits, Message, Result, trace};
use sqlx::PgConnection;
use tracing::Instrument;

use super::encoding;
use crate::error::store_error;

/// Enqueues messages as logical decoding messages of the producer's transaction, for a
/// [`CdcRelay`](super::CdcRelay) in [`CdcMode::Messages`](super::CdcMode::Messages):
/// no outbox row is written. Made by [`PgStore::message_outbox`](crate::PgStore::message_outbox).
#[derive(Debug, Clone)]
pub struct PgMessageOutbox {
    prefix: Arc<str>,
    limits: Limits,
}

impl PgMessageOutbox {
    pub(crate) fn new(prefix: String) -> Self {
        Self {
            prefix: prefix.into(),
            limits: Limits::new(),
        }
    }

    /// Sets the limits messages are checked against at enqueue. Default:
    /// [`Limits::new`].
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The prefix of the messages written (`<schema>.outbox`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Writes `message` into the WAL of the transaction on `conn` (a transactional
    /// `pg_logical_emit_message`): the relay publishes it once the transaction commits,
    /// and never if it rolls back. Called outside a transaction, the message is its own
    /// transaction.
    ///
    /// Unlike the table's `enqueue`, nothing checks that the id is unique: keep
    /// [`MessageId::new`](oncebox_core::MessageId::new)'s fresh ids, or ids derived from
    /// data that is itself unique.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidMessage`] if the message breaks the limits or its topic is empty;
    /// a store error if the statement fails (the transaction is then aborted: roll it
    /// back).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped the message may or may not be written in the
    /// transaction; roll it back.
    pub async fn enqueue(&self, conn: &mut PgConnection, message: &Message) -> Result<()> {
        message.validate(&self.limits)?;
        if message.topic.is_empty() {
            return Err(Error::store_permanent(format!(
                "message {}: the topic is empty",
                message.id
            )));
        }
        let (span, headers) = trace::creation(message);
        let result = sqlx::query("SELECT pg_logical_emit_message(true, $1, $2)")
            .bind(&*self.prefix)
            .bind(encoding::encode(message, &headers))
            .execute(&mut *conn)
            .instrument(span.clone())
            .await
            .map(drop)
            .map_err(store_error);
        if let Err(error) = &result {
            trace::record_error(&span, error);
        }
        result
    }
}
