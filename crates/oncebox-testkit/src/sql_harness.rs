//! The store harnesses of an sqlx-based backend, written once: [`sql_store_harness!`](crate::sql_store_harness)
//! implements [`OutboxHarness`](crate::outbox::OutboxHarness),
//! [`InboxHarness`](crate::inbox::InboxHarness),
//! [`DurableInboxHarness`](crate::inbox::DurableInboxHarness) and
//! [`DedupHarness`](crate::dedup::DedupHarness) for a backend's harness type, the way
//! every SQL store's stores are driven: a producer's transaction on the store's pool,
//! the outbox's own `enqueue`, `enqueue_scheduled`, `enqueue_batch`, `cancel` and
//! `status` on it, and an effects table next to the inbox tables.
//!
//! It is a macro rather than generic code because the stores have the same methods but
//! no trait in common (each takes its own connection type), and so that the test kit
//! needs no database driver. The expansion names `sqlx` and `oncebox_core`, which the
//! calling crate depends on.
//!
//! The harness type must have these inherent methods:
//!
//! - `fn backend(&self) -> &Store`: the backend's store, with `pool()`, `inbox()`,
//!   `durable_inbox(consumer)` and `dedup()`;
//! - `fn outbox(&self) -> Outbox`: the outbox the suite runs against, configured as the
//!   harness says (with `delete_on_publish(bool)`, `enqueue`, `enqueue_scheduled`,
//!   `enqueue_batch`, `cancel`, `status` and `wake`);
//! - `async fn begin_tx(&self) -> oncebox_core::Result<sqlx::Transaction<'static, Db>>`:
//!   a producer's transaction, begun as the backend's writers should begin one.
//!
//! What the backends do differently is given to the macro: the statements of the effects
//! table (a `key` column, no unique constraint, so that a second effect is counted) and
//! of the dedup table's count, and the rest of the outbox harness (at least
//! `capabilities`, and `set_published_at`, `windowed` where the store has them):
//!
//! ```ignore
//! struct MyHarness { db: TestDb }
//!
//! impl MyHarness {
//!     fn backend(&self) -> &MyStore { &self.db.store }
//!     fn outbox(&self) -> MyOutbox { self.db.store.outbox() }
//!     async fn begin_tx(&self) -> Result<Transaction<'static, MyDb>> { todo!() }
//! }
//!
//! oncebox_testkit::sql_store_harness! {
//!     harness: MyHarness,
//!     producer: MyProducer,
//!     database: MyDb,
//!     stores: MyOutbox, MyInbox, MyDurableInbox, MyDedupStore,
//!     row_status: RowStatus, // the backend's, in scope
//!     insert_effect: "INSERT INTO conformance_effects (key) VALUES ($1)",
//!     count_effects: "SELECT count(*) FROM conformance_effects WHERE key = $1",
//!     count_records: "SELECT count(*) FROM dedup",
//!     outbox: {
//!         fn capabilities(&self) -> Capabilities { Capabilities::new() }
//!     }
//! }
//! ```

/// Implements the outbox, inbox, durable inbox and dedup harnesses for an sqlx-based
/// backend's harness type, and defines its producer type; see the
/// [module docs](crate::sql_harness) for what the harness type must have.
#[macro_export]
macro_rules! sql_store_harness {
    (
        harness: $harness:ty,
        producer: $producer:ident,
        database: $db:ty,
        stores: $outbox:ty, $inbox:ty, $durable:ty, $dedup:ty,
        row_status: $row_status:ident,
        insert_effect: $insert_effect:literal,
        count_effects: $count_effects:literal,
        count_records: $count_records:literal,
        outbox: { $($outbox_items:tt)* } $(,)?
    ) => {
        /// A producer's transaction with the outbox it enqueues into.
        pub struct $producer {
            tx: sqlx::Transaction<'static, $db>,
            outbox: $outbox,
        }

        impl $crate::outbox::ProducerTx for $producer {
            async fn enqueue(&mut self, message: &oncebox_core::Message) -> oncebox_core::Result<()> {
                self.outbox.enqueue(&mut self.tx, message).await
            }

            async fn commit(self) -> oncebox_core::Result<()> {
                self.tx.commit().await.map_err(oncebox_core::Error::store_transient)?;
                self.outbox.wake();
                Ok(())
            }

            async fn rollback(self) -> oncebox_core::Result<()> {
                self.tx.rollback().await.map_err(oncebox_core::Error::store_transient)
            }
        }

        impl $crate::outbox::OutboxHarness for $harness {
            type Store = $outbox;
            type Producer = $producer;

            fn store(&self) -> $outbox {
                self.outbox()
            }

            async fn begin(&self) -> oncebox_core::Result<$producer> {
                Ok($producer {
                    tx: self.begin_tx().await?,
                    outbox: self.outbox(),
                })
            }

            fn deleting_on_publish(&self) -> Option<$outbox> {
                Some(self.outbox().delete_on_publish(true))
            }

            async fn enqueue_scheduled(
                &self,
                message: &oncebox_core::Message,
                when: oncebox_core::Schedule,
            ) -> oncebox_core::Result<()> {
                let outbox = self.outbox();
                let mut tx = self.begin_tx().await?;
                outbox.enqueue_scheduled(&mut tx, message, when).await?;
                tx.commit().await.map_err(oncebox_core::Error::store_transient)?;
                outbox.wake();
                Ok(())
            }

            async fn cancel(&self, id: oncebox_core::MessageId) -> oncebox_core::Result<bool> {
                self.cancel_kept_open(id, ::std::time::Duration::ZERO, true).await
            }

            async fn cancel_kept_open(
                &self,
                id: oncebox_core::MessageId,
                open_for: ::std::time::Duration,
                commit: bool,
            ) -> oncebox_core::Result<bool> {
                let mut tx = self.begin_tx().await?;
                let cancelled = self.outbox().cancel(&mut tx, id).await?;
                tokio::time::sleep(open_for).await;
                if commit {
                    tx.commit().await.map_err(oncebox_core::Error::store_transient)?;
                } else {
                    tx.rollback().await.map_err(oncebox_core::Error::store_transient)?;
                }
                Ok(cancelled)
            }

            async fn row_state(
                &self,
                id: oncebox_core::MessageId,
            ) -> oncebox_core::Result<Option<$crate::outbox::RowState>> {
                use $crate::outbox::RowStatus as Kit;
                let Some(state) = self.outbox().status(id).await? else {
                    return Ok(None);
                };
                let status = match state.status {
                    $row_status::Pending => Kit::Pending,
                    $row_status::Done => Kit::Done,
                    $row_status::Dead => Kit::Dead,
                    #[allow(unreachable_patterns)]
                    other => {
                        return Err(oncebox_core::Error::store_permanent(format!(
                            "unknown row status {other:?}"
                        )));
                    }
                };
                Ok(Some($crate::outbox::RowState {
                    status,
                    attempts: state.attempts,
                    last_error: state.last_error,
                }))
            }

            async fn enqueue_batch(
                &self,
                business: &str,
                messages: &[oncebox_core::Message],
                commit: bool,
            ) -> oncebox_core::Result<()> {
                let outbox = self.outbox();
                let mut tx = self.begin_tx().await?;
                <Self as $crate::inbox::InboxHarness>::insert_effect(&mut tx, business).await?;
                let batch = outbox.enqueue_batch(&mut tx, messages).await;
                if commit {
                    tx.commit().await.map_err(oncebox_core::Error::store_transient)?;
                    outbox.wake();
                } else {
                    tx.rollback().await.map_err(oncebox_core::Error::store_transient)?;
                }
                batch
            }

            async fn business_rows(&self, business: &str) -> oncebox_core::Result<u64> {
                $crate::inbox::InboxHarness::count_effects(self, business).await
            }

            $($outbox_items)*
        }

        impl $crate::inbox::InboxHarness for $harness {
            type Store = $inbox;

            fn store(&self) -> $inbox {
                self.backend().inbox()
            }

            async fn insert_effect(
                tx: &mut $crate::inbox::TxOf<Self>,
                key: &str,
            ) -> oncebox_core::Result<()> {
                sqlx::query($insert_effect)
                    .bind(key.to_owned())
                    .execute(&mut **tx)
                    .await
                    .map_err(oncebox_core::Error::store_transient)?;
                Ok(())
            }

            async fn count_effects(&self, key: &str) -> oncebox_core::Result<u64> {
                let count: i64 = sqlx::query_scalar($count_effects)
                    .bind(key.to_owned())
                    .fetch_one(self.backend().pool())
                    .await
                    .map_err(oncebox_core::Error::store_transient)?;
                Ok(u64::try_from(count).unwrap_or_default())
            }

            fn connections(&self) -> Option<$crate::inbox::Connections> {
                let pool = self.backend().pool();
                Some($crate::inbox::Connections {
                    open: pool.size(),
                    idle: pool.num_idle(),
                })
            }
        }

        impl $crate::inbox::DurableInboxHarness for $harness {
            type Durable = $durable;

            fn durable(&self, consumer: &str) -> $durable {
                self.backend().durable_inbox(consumer)
            }
        }

        impl $crate::dedup::DedupHarness for $harness {
            type Store = $dedup;

            fn store(&self) -> $dedup {
                self.backend().dedup()
            }

            async fn count_records(&self) -> oncebox_core::Result<Option<u64>> {
                let count: i64 = sqlx::query_scalar($count_records)
                    .fetch_one(self.backend().pool())
                    .await
                    .map_err(oncebox_core::Error::store_transient)?;
                Ok(Some(u64::try_from(count).unwrap_or_default()))
            }
        }
    };
}
